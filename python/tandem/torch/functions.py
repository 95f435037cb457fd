"""horovod.torch's helpers: broadcast of parameters, optimizer state and
picklable objects, and allgather of objects."""
import io
import pickle

import torch

import tandem
from . import ops


def broadcast_parameters(params, root_rank):
    """Overwrite every tensor of `params` (a state_dict, or (name, tensor)
    pairs such as model.named_parameters()) with root_rank's, in place."""
    if isinstance(params, dict):
        items = sorted(params.items(), key=lambda kv: str(kv[0]))
    elif isinstance(params, (list, tuple)) or hasattr(params, "__iter__"):
        items = list(params)
        if any(not isinstance(x, tuple) or len(x) != 2 for x in items):
            raise ValueError("tandem.torch: broadcast_parameters takes a state_dict or (name, tensor) pairs")
    else:
        raise TypeError(f"tandem.torch: broadcast_parameters takes a dict or a list, not {type(params).__name__}")
    ops._check_root(root_rank)
    handles = []
    for name, t in items:
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"tandem.torch: broadcast_parameters: {name!r} is a {type(t).__name__}, not a tensor")
        handles.append(ops.broadcast_async_(t.data if t.requires_grad else t, root_rank, name=str(name)))
    for h in handles:
        ops.synchronize(h)


def broadcast_object(obj, root_rank=0, name=None, process_set=None):
    """root_rank's `obj` (pickled) on every rank."""
    ops._no_process_set(process_set)
    ops._check_root(root_rank)
    w = tandem.world()
    if w.rank() == root_rank:
        buf = io.BytesIO()
        torch.save(obj, buf)
        payload = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
        length = torch.tensor([payload.numel()], dtype=torch.int64)
    else:
        length = torch.zeros(1, dtype=torch.int64)
    # through ops (not the bare communicator) so that ranks in hvd.join() serve it
    ops.broadcast_(length, root_rank)
    if w.rank() != root_rank:
        payload = torch.empty(int(length), dtype=torch.uint8)
    ops.broadcast_(payload, root_rank)
    if w.rank() == root_rank:
        return obj
    return torch.load(io.BytesIO(payload.numpy().tobytes()))


def allgather_object(obj, name=None, process_set=None):
    """The list of every rank's `obj` (pickled), in rank order; None for
    the ranks in hvd.join() (they have no object)."""
    ops._no_process_set(process_set)
    data = pickle.dumps(obj)
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    w = tandem.world()
    n = w.size()
    sizes = torch.zeros(n, dtype=torch.int64)
    sizes[w.rank()] = t.numel()
    ops.allreduce_(sizes, op=ops.Sum)  # through ops: ranks in hvd.join() serve it
    gathered = ops.allgather(t)
    out, off = [], 0
    for r in range(n):
        k = int(sizes[r])
        # a pickle is never empty: 0 bytes is a joined rank's
        out.append(pickle.loads(gathered[off:off + k].numpy().tobytes()) if k else None)
        off += k
    return out


def broadcast_optimizer_state(optimizer, root_rank):
    """Give every rank root_rank's optimizer state and hyper-parameters
    (a pickled state_dict broadcast, loaded everywhere else)."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"tandem.torch: broadcast_optimizer_state takes an optimizer, "
                        f"not {type(optimizer).__name__}")
    state = broadcast_object(optimizer.state_dict(), root_rank)
    if tandem.rank() != root_rank:
        optimizer.load_state_dict(state)
