"""Tandem from Python: the world communicator and collectives on NumPy arrays.

A thin layer over the C extension tandem._tandem (DESIGN.md §9): arrays are
passed to C by pointer, never copied; non-blocking calls return a Request
that keeps the arrays alive until it completes; waits release the GIL.

    import numpy as np, tandem
    tandem.init()                      # from tandemrun's environment, or a world of one
    x = np.ones(1024, np.float32)
    tandem.allreduce(x, op=tandem.Sum, inplace=True)

Failures of the C library raise TandemError (subclasses RemoteError,
MismatchError, TandemTimeoutError, InvalidArgumentError, InvalidUsageError),
whose message names the ranks involved and whose .status is the td_status.
"""
from . import _tandem
from ._tandem import (TandemError, RemoteError, MismatchError, TandemTimeoutError,
                      InvalidArgumentError, InvalidUsageError, Request, Comm)
from ._tandem import F32, F64, F16, BF16, I32, I64, U8, SUM, AVG, MIN, MAX, PROD

__all__ = ["init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
           "world", "allreduce", "allreduce_async", "broadcast", "broadcast_async", "allgather",
           "barrier", "TandemError", "RemoteError", "MismatchError", "TandemTimeoutError",
           "InvalidArgumentError", "InvalidUsageError", "Sum", "Average", "Min", "Max", "Product"]

# Horovod's names for the reduction operators; the values are td_op codes.
Sum, Average, Min, Max, Product = SUM, AVG, MIN, MAX, PROD
_OP_NAMES = {"sum": SUM, "avg": AVG, "average": AVG, "mean": AVG, "min": MIN, "max": MAX,
             "prod": PROD, "product": PROD}

_world = None
_store_server = None  # the store this process hosts under torchrun (rank 0), kept until exit


def _torchrun_store(timeout_s=None):
    """Under a torchrun agent, point TANDEM_STORE at a Tandem store agreed
    through the agent's own.

    torchrun's agent serves torch's TCPStore on MASTER_PORT, so the C
    library's rule for torchrun's variables (rank 0 hosts Tandem's store on
    MASTER_PORT) would collide with it ("Address already in use"). Instead
    rank 0 hosts a Tandem store on a port the kernel picks, on the
    interface that routes to MASTER_ADDR, and publishes host:port in the
    agent's store; every rank reads it from there and sets TANDEM_STORE, so
    every later communicator of the job (tandem.init, each c10d group)
    finds it. Only the address travels through torch's store, which has no
    authentication: the job's secret stays where Tandem's handshake reads
    it (TANDEM_SECRET, TANDEM_SECRET_FILE, or the per-user secret file).
    Does nothing outside torchrun, with TANDEM_STORE set, or for one rank."""
    global _store_server
    import os
    env = os.environ
    if env.get("TANDEM_STORE") or "TORCHELASTIC_RUN_ID" not in env or "TANDEM_RANK" in env:
        return
    if not env.get("MASTER_ADDR") or not env.get("MASTER_PORT") or int(env.get("WORLD_SIZE", "1")) <= 1:
        return
    import datetime
    import socket
    from torch.distributed import TCPStore
    rank = int(env["RANK"])
    wait = datetime.timedelta(seconds=timeout_s or float(env.get("TANDEM_CONNECT_TIMEOUT") or 60))
    agent = TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False, timeout=wait)
    key = f"tandem/store/{env['TORCHELASTIC_RUN_ID']}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    if rank == 0:
        # the local address of the route to MASTER_ADDR (no packet is sent):
        # reachable by the others as torch's own store is, and no wider
        family, _, _, _, addr = socket.getaddrinfo(env["MASTER_ADDR"], int(env["MASTER_PORT"]),
                                                   proto=socket.IPPROTO_UDP)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(addr)
            host = s.getsockname()[0]
        _store_server, port = _tandem.host_store(host)
        agent.set(key, f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    try:
        address = agent.get(key).decode()  # waits for rank 0, up to `wait`
    except RuntimeError as e:
        raise _tandem.TandemTimeoutError(
            f"tandem: rank {rank} under torchrun: rank 0 did not publish Tandem's store address in the agent's "
            f"store ({env['MASTER_ADDR']}:{env['MASTER_PORT']}, key {key}) within {wait.total_seconds():g} s: "
            f"{e}") from None
    env["TANDEM_STORE"] = address


def init(**config):
    """Join the job (idempotent). Keyword arguments (rank, world_size, store,
    job_id, transport, timeout) override the environment."""
    global _world
    if _world is None:
        if not config.get("store"):
            _torchrun_store(config.get("timeout"))
        _world = _tandem.init(**config)
    return _world


def shutdown():
    """Wait for pending operations, leave together with the other ranks."""
    global _world
    w, _world = _world, None
    if w is not None:
        w.finalize()


def is_initialized():
    return _world is not None


def world():
    """The world communicator; raises ValueError before init()."""
    if _world is None:
        raise ValueError("tandem has not been initialized: call tandem.init() first")
    return _world


def rank():
    return world().rank()


def size():
    return world().size()


def local_rank():
    return world().local_rank()


def local_size():
    return world().local_size()


def barrier():
    world().barrier()


def op_code(op):
    """A td_op code from a code or a name ('sum', 'average', ...)."""
    if isinstance(op, str):
        try:
            return _OP_NAMES[op.lower()]
        except KeyError:
            raise ValueError(f"tandem: unknown reduction op {op!r}; use one of {sorted(_OP_NAMES)}") from None
    if isinstance(op, bool) or not isinstance(op, int):
        raise TypeError(f"tandem: op must be tandem.Sum/Average/Min/Max/Product or a name, not {type(op).__name__}")
    if not 0 <= op <= PROD:
        raise ValueError(f"tandem: unknown reduction op code {op}")
    return op


# ---- NumPy ----

def _np_dtype_code(a):
    import numpy as np
    codes = {np.dtype(np.float32): F32, np.dtype(np.float64): F64, np.dtype(np.float16): F16,
             np.dtype(np.int32): I32, np.dtype(np.int64): I64, np.dtype(np.uint8): U8}
    try:
        return codes[a.dtype.newbyteorder("=")] if a.dtype.isnative else None
    except KeyError:
        return None


def _np_check(a, what="array"):
    import numpy as np
    if not isinstance(a, np.ndarray):
        raise TypeError(f"tandem: {what} must be a numpy.ndarray, not {type(a).__name__}")
    code = _np_dtype_code(a)
    if code is None:
        raise TypeError(f"tandem: {what} has dtype {a.dtype}; supported: float32, float64, float16, "
                        "int32, int64, uint8 (bfloat16 through tandem.torch)")
    if not a.flags.c_contiguous:
        raise ValueError(f"tandem: {what} is not C-contiguous; pass numpy.ascontiguousarray({what})")
    return code


def allreduce_async(array, op=SUM, out=None, inplace=False):
    """Start an allreduce of `array`; returns a Request whose wait() returns
    the result (`array` itself when inplace, else `out` or a new array)."""
    import numpy as np
    code = _np_check(array)
    opc = op_code(op)
    if inplace:
        out = array
    elif out is None:
        out = np.empty_like(array)
    else:
        if _np_check(out, "out") != code or out.size != array.size:
            raise ValueError(f"tandem: out must have the dtype and size of array ({array.dtype}, {array.size})")
    return world().iallreduce(array, out, array.size, code, opc, result=out)


def allreduce(array, op=SUM, out=None, inplace=False):
    """Elementwise reduction over ranks; returns the result array."""
    import numpy as np
    code = _np_check(array)
    opc = op_code(op)
    if inplace:
        out = array
    elif out is None:
        out = np.empty_like(array)
    elif _np_check(out, "out") != code or out.size != array.size:
        raise ValueError(f"tandem: out must have the dtype and size of array ({array.dtype}, {array.size})")
    world().allreduce(array, out, array.size, code, opc)
    return out


def broadcast_async(array, root_rank=0):
    code = _np_check(array)
    return world().ibroadcast(array, array.size, code, root_rank, result=array)


def broadcast(array, root_rank=0):
    """Overwrite `array` with root_rank's, in place; returns it."""
    code = _np_check(array)
    world().broadcast(array, array.size, code, root_rank)
    return array


def allgather(array):
    """Concatenate every rank's array along the first dimension (the first
    dimension may differ between ranks, the others must agree)."""
    import numpy as np
    code = _np_check(array)
    w = world()
    n = w.size()
    if array.ndim == 0:
        raise ValueError("tandem: allgather needs an array with at least one dimension")
    rows = np.zeros(n, np.int64)
    rows[w.rank()] = array.shape[0]
    w.allreduce(rows, rows, n, I64, SUM)
    row_elems = int(np.prod(array.shape[1:], dtype=np.int64))
    shape_check = np.array(array.shape[1:], np.int64)
    if shape_check.size:
        lo, hi = shape_check.copy(), shape_check.copy()
        w.allreduce(lo, lo, lo.size, I64, MIN)
        w.allreduce(hi, hi, hi.size, I64, MAX)
        if (lo != hi).any():
            raise ValueError(f"tandem: allgather: ranks disagree on the trailing dimensions "
                             f"(this rank {tuple(array.shape[1:])}, min {tuple(lo)}, max {tuple(hi)})")
    big = int(rows.max())
    # Equal blocks of the largest share, then the valid rows of each kept.
    padded = np.zeros((n * big * row_elems,), array.dtype)
    mine = padded[w.rank() * big * row_elems:(w.rank() * big + array.shape[0]) * row_elems]
    mine[...] = array.reshape(-1)
    w.allgather(padded, padded, padded.size, code)
    parts = [padded[r * big * row_elems:(r * big + int(rows[r])) * row_elems] for r in range(n)]
    return np.concatenate(parts).reshape((int(rows.sum()),) + array.shape[1:])
