"""tandem.torch: horovod.torch's public API on Tandem.

A Horovod PyTorch script runs after changing its import:
    import tandem.torch as hvd
Tensors are CPU or CUDA tensors: CUDA tensors are reduced on the device, by
NCCL when every rank has its own GPU and libnccl.so.2 loads, otherwise staged
through pinned host memory (ops.py says how streams are waited for).
Importing this module also registers the "tandem" torch.distributed backend
when the c10d extension was built (docs/python.md)."""
import os as _os

import tandem as _tandem_core
from tandem import (TandemError, RemoteError, MismatchError, TandemTimeoutError, InvalidArgumentError,
                    InvalidUsageError)
from .compression import Compression
from .ops import (Sum, Average, Min, Max, Product, Adasum, allreduce, allreduce_, allreduce_async,
                  allreduce_async_, grouped_allreduce, grouped_allreduce_, grouped_allreduce_async,
                  grouped_allreduce_async_, allgather, allgather_async, broadcast, broadcast_, broadcast_async,
                  broadcast_async_, alltoall, alltoall_async, reducescatter, reducescatter_async, poll,
                  synchronize, join, barrier, global_process_set, ProcessSet, add_process_set,
                  remove_process_set)
from .optimizer import DistributedOptimizer
from .functions import broadcast_parameters, broadcast_optimizer_state, broadcast_object, allgather_object
from .sync_batch_norm import SyncBatchNorm
from .ddp_hook import ddp_avg_hook

HorovodInternalError = TandemError  # what Horovod scripts catch


def init(comm=None, process_sets=None):
    """Join the job (tandemrun's environment, MPI/Slurm/torchrun variables, or a world of one)."""
    if comm is not None:
        raise ValueError("tandem.torch.init: comm= (an MPI communicator) is not supported; "
                         "Tandem builds its world from the environment")
    global _cross
    _tandem_core.init()
    if _cross is None:  # once per world (a collective), so init() stays idempotent
        _cross = _hosts()
        for ps in process_sets or []:  # Horovod's init(process_sets=[...]): added in order, on every rank
            add_process_set(ps)


_cross = None


def shutdown():
    global _cross
    _cross = None
    _tandem_core.shutdown()


def is_initialized():
    return _tandem_core.is_initialized()


def rank():
    return _tandem_core.rank()


def size():
    return _tandem_core.size()


def local_rank():
    return _tandem_core.local_rank()


def local_size():
    return _tandem_core.local_size()


def _hosts():
    """(cross_rank, cross_size): this host's index among the hosts and the host count,
    with hosts ordered by their lowest rank (Horovod's cross communicator)."""
    import torch
    w = _tandem_core.world()
    n = w.size()
    first = torch.zeros(n, dtype=torch.int64)
    # the lowest rank on this host is rank - local_rank when ranks fill hosts in blocks;
    # compute it exactly: every rank reports whether it is its host's local rank 0
    first[w.rank()] = 1 if w.local_rank() == 0 else 0
    w.allreduce(first.data_ptr(), first.data_ptr(), n, _tandem_core.I64, _tandem_core.SUM)
    leaders = [r for r in range(n) if first[r]]
    me = sum(1 for r in leaders if r <= w.rank()) - 1
    return me, len(leaders)


def cross_rank():
    """Index of this host among the job's hosts."""
    _tandem_core.world()
    return _cross[0]


def cross_size():
    """Number of hosts in the job."""
    _tandem_core.world()
    return _cross[1]


def mpi_threads_supported():
    return False


def mpi_enabled():
    return False


def mpi_built():
    return False


def gloo_enabled():
    return False


def gloo_built():
    return False


def nccl_built():
    return False


def ddl_built():
    return False


def ccl_built():
    return False


def cuda_built():
    return False


def rocm_built():
    return False


def start_timeline(file_path, mark_cycles=False):
    raise NotImplementedError("tandem.torch: Horovod's timeline is not available from Python")


def stop_timeline():
    raise NotImplementedError("tandem.torch: Horovod's timeline is not available from Python")


# ---- the torch.distributed backend "tandem" ----

_c10d_error = None
# membership (global ranks, in group-rank order) -> groups created with it so
# far in this process: the sequence number in a group's communicator name
_c10d_seq = {}


def _c10d_env_defaults():
    """Under tandemrun, give torch.distributed's default env:// rendezvous
    what it needs (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)
    unless the launcher set them: an unmodified DDP script then runs with
    init_process_group("tandem"). torch's store (which the tandem backend
    uses only to learn each group's members) listens on a port derived from
    the job id; set MASTER_PORT to choose another."""
    env = _os.environ
    if "TANDEM_RANK" not in env or "TANDEM_WORLD_SIZE" not in env:
        return
    env.setdefault("RANK", env["TANDEM_RANK"])
    env.setdefault("WORLD_SIZE", env["TANDEM_WORLD_SIZE"])
    env.setdefault("LOCAL_RANK", env.get("TANDEM_LOCAL_RANK", "0"))
    env.setdefault("LOCAL_WORLD_SIZE", env.get("TANDEM_LOCAL_SIZE", "1"))
    store = env.get("TANDEM_STORE", "")
    host = store.rpartition(":")[0].strip("[]")
    if "MASTER_ADDR" not in env:
        env["MASTER_ADDR"] = host or "127.0.0.1"
    if "MASTER_PORT" not in env:
        # Every rank must name the same port without talking first: derive it
        # from the job id, below Linux's ephemeral range (32768-60999) so
        # that it never collides with the ports the kernel hands out.
        import zlib
        job = env.get("TANDEM_JOB_ID", "") + store
        env["MASTER_PORT"] = str(20000 + zlib.crc32(job.encode()) % 12000)


def _group_members(store, rank, size, wait_s):
    """The global ranks of this group's members, in group-rank order.

    torch calls the backend only on a group's members, so nothing counted per
    process (how many groups this rank has joined) agrees between members:
    after new_group([1]), new_group([0, 1]) is rank 0's first group and rank
    1's second. The members learn each other through the group's own prefix
    of torch's store, which torch names identically on every rank."""
    import datetime
    import torch.distributed as dist
    if not dist.is_initialized():  # the default group, being created: every rank, in order
        return tuple(range(size))
    keys = [f"tandem/member{r}" for r in range(size)]
    store.set(keys[rank], str(dist.get_rank()))
    try:
        store.wait(keys, datetime.timedelta(seconds=wait_s))
    except RuntimeError as e:  # torch's store timeout: name who never came
        # this rank's own key is set (above); a probe of it could only be
        # wrong (a loaded store answering late would name this rank)
        missing = [r for r, k in enumerate(keys) if r != rank and not _store_has(store, k)]
        raise TandemTimeoutError(
            f"tandem: creating a process group of {size} ranks: group rank(s) {missing} did not join within "
            f"{wait_s:g} s (this is group rank {rank}, global rank {dist.get_rank()}); every member must call "
            f"new_group with the same ranks, in the same order as the others ({e})") from None
    return tuple(int(store.get(k)) for k in keys)


def _store_has(store, key):
    """Whether torch's store holds `key` (torch 1.13's Python Store has no check()).

    A wait with a short timeout: 250 ms, not less, because under load the
    store's answer for a key that is there can take tens of milliseconds,
    and a late answer would name a member who did join."""
    import datetime
    try:
        store.wait([key], datetime.timedelta(milliseconds=250))
        return True
    except RuntimeError:
        return False


def _create_process_group(store, rank, size, timeout):
    """c10d's creator: a Tandem communicator of its own per process group
    (rendezvous through Tandem's store, from the environment), named by what
    every member agrees on: the members' global ranks and how many groups
    with exactly these members this process created before."""
    import hashlib
    from tandem import _c10d
    from torch.distributed.constants import default_pg_timeout
    job = _os.environ.get("TANDEM_JOB_ID", "default")
    # torch's default (30 minutes) is not a choice the script made: Tandem's
    # own deadline (TANDEM_TIMEOUT, else 300 s) applies then, so that a stuck
    # peer turns into an error as soon as in the rest of Tandem. A timeout=
    # given to init_process_group/new_group is honoured, for the group's
    # creation (members meeting, then the communicator's start-up, which
    # Tandem caps at an explicit timeout) and for each of its collectives.
    secs = 0.0 if timeout == default_pg_timeout else timeout.total_seconds()
    _tandem_core._torchrun_store(secs)  # under torchrun: Tandem's store, found through the agent's
    members = _group_members(store, rank, size, secs or float(_os.environ.get("TANDEM_TIMEOUT") or 300))
    seq = _c10d_seq.get(members, 0)
    _c10d_seq[members] = seq + 1
    # A job id holds < 128 characters: a digest stands for long member lists.
    digest = hashlib.sha1(",".join(map(str, members)).encode()).hexdigest()[:16]
    name = f"{job}.c10d.n{size}.{digest}.{seq}"
    comm = _tandem_core._tandem.init(rank=rank, world_size=size, job_id=name, timeout=secs)
    return _c10d.ProcessGroupTandem(comm, rank, size)


def c10d_available():
    """True when init_process_group("tandem") works in this process."""
    return _c10d_error is None


def _register_c10d():
    global _c10d_error
    try:
        import torch.distributed as dist
        if not dist.is_available():
            _c10d_error = "torch.distributed is not available in this torch build"
            return
        from tandem import _c10d  # noqa: F401  (built when libtorch-dev and pybind11-dev are present)
    except ImportError as e:
        _c10d_error = f"the tandem c10d extension is not available: {e}"
        return
    if "TANDEM" not in dist.Backend._plugins:
        dist.Backend.register_backend("tandem", _create_process_group)
    _c10d_env_defaults()


_register_c10d()
