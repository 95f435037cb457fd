"""A DDP communication hook that averages inside Tandem's allreduce.

Without a hook, DistributedDataParallel's reducer divides every gradient by
the world size as backward produces it (one pass over all gradients on every
rank, on the autograd thread) and then allreduces the sum. With

    model.register_comm_hook(None, tandem.torch.ddp_avg_hook)

it hands each bucket to this hook undivided, and the bucket is allreduced
with ReduceOp.AVG: Tandem's ring divides each segment once, at the rank that
owns it, while it is in cache (src/comm/algorithms/allreduce_ring.c), and on
shared memory each slice's owner divides it the same way
(src/comm/algorithms/allreduce_shm.c). The result is the average
DDP computes, to one rounding (a power-of-two world size: the same bits).
Needs a process group of the "tandem" backend (gloo has no AVG)."""
import torch.distributed as dist


def ddp_avg_hook(process_group, bucket):
    """DDP comm hook: allreduce the bucket with AVG; state is the process group (None: the default one)."""
    group = process_group if process_group is not None else dist.group.WORLD
    if dist.get_backend(group) != "tandem":
        raise RuntimeError(f"tandem.torch.ddp_avg_hook needs a process group of the 'tandem' backend, not "
                           f"'{dist.get_backend(group)}': register it only with init_process_group(\"tandem\")")
    work = dist.all_reduce(bucket.buffer(), op=dist.ReduceOp.AVG, group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])
