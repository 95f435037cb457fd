"""horovod.torch's collectives on CPU and CUDA tensors, over tandem._tandem.

Tensors go to C by data_ptr(), without copies when they are contiguous (a
non-contiguous input is reduced through a contiguous copy, and an in-place
call on one copies the result back). A handle is an int, as in Horovod;
the table below keeps each operation's tensors alive until synchronize().

CUDA tensors: the C library sees device pointers and runs the collective on
the device (NCCL when every rank has its own GPU, else staged through pinned
host memory: src/comm/device). Before C reads a CUDA tensor, _ready()
synchronizes torch's current stream of its device (whatever torch queued
there, e.g. the backward that wrote a gradient or the prescale multiply, has
finished); when a request completes, the results are in device memory, so
torch work issued after synchronize() sees them. Temporaries are made on
the input's device."""
import itertools
import threading

import torch

import tandem
from tandem import _tandem
from .compression import Compression
from .dtypes import CODES as _CODES
from . import join_protocol as _join

# Horovod's operator names; the values are td_op codes.
Sum, Average, Min, Max, Product = tandem.SUM, tandem.AVG, tandem.MIN, tandem.MAX, tandem.PROD
Adasum = "Adasum"  # accepted as a name so that scripts import; refused when used


def _world():
    return tandem.world()


def _code(tensor, what="tensor"):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tandem.torch: {what} must be a torch.Tensor, not {type(tensor).__name__}")
    if tensor.device.type not in ("cpu", "cuda"):
        raise ValueError(f"tandem.torch: {what} is on {tensor.device}; Tandem reduces CPU and CUDA tensors "
                         "(move it with .cpu() or .cuda())")
    if tensor.is_sparse:
        raise ValueError(f"tandem.torch: {what} is sparse; pass tensor.to_dense()")
    try:
        return _CODES[tensor.dtype]
    except KeyError:
        raise TypeError(f"tandem.torch: {what} has dtype {tensor.dtype}; supported: float32, float64, "
                        "float16, bfloat16, int32, int64, uint8") from None


def _ready(*tensors):
    """Wait until torch's queued work on these tensors' CUDA devices is done
    (stream synchronize: the C collective reads device memory from its own
    streams, which know nothing of torch's). CPU tensors: nothing."""
    seen = set()
    for t in tensors:
        if t.is_cuda and t.device not in seen:
            seen.add(t.device)
            torch.cuda.current_stream(t.device).synchronize()


def _op(op, average=None):
    if average is not None:
        if op is not None:
            raise ValueError("tandem.torch: pass either op= or the deprecated average=, not both")
        return Average if average else Sum
    if op is None:
        return Average
    if op is Adasum or op == "Adasum":
        raise NotImplementedError("tandem.torch: op=Adasum is not implemented by Tandem; "
                                  "use Average or Sum")
    return tandem.op_code(op)


def _check_name(name):
    if name is not None and not isinstance(name, str):
        raise TypeError(f"tandem.torch: name= must be a str (or None), not {type(name).__name__}")


def check_compression(compression):
    """compression= must be Compression.none/fp16/bf16 or an object with
    their compress()/decompress() (Horovod's Compressor interface)."""
    if compression is None:
        return Compression.none
    if not (callable(getattr(compression, "compress", None)) and callable(getattr(compression, "decompress", None))):
        raise TypeError(f"tandem.torch: compression= must be hvd.Compression.none, .fp16 or .bf16 (a compressor "
                        f"with compress() and decompress()), not {compression!r}")
    return compression


def _in_graph(tensor):
    return isinstance(tensor, torch.Tensor) and tensor.requires_grad and torch.is_grad_enabled()


def _check_scale(name, v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"tandem.torch: {name} must be a number, not {type(v).__name__}")
    return float(v)


# ---- handles ----

_handles = {}
_next_handle = itertools.count(1)
_handles_lock = threading.Lock()


class _Pending:
    """Requests of one user-visible operation and what finishes it."""
    __slots__ = ("requests", "finish", "name")

    def __init__(self, requests, finish, name):
        self.requests = requests
        self.finish = finish
        self.name = name


def _new_handle(requests, finish, name=None):
    h = next(_next_handle)
    with _handles_lock:
        _handles[h] = _Pending(requests, finish, name)
    return h


def _lookup(handle):
    with _handles_lock:
        p = _handles.get(handle)
    if p is None:
        raise ValueError(f"tandem.torch: unknown or already synchronized handle {handle!r}")
    return p


def poll(handle):
    """True if the operation of `handle` has completed (synchronize returns at once)."""
    p = _lookup(handle)
    return all(r.test() for r in p.requests)


def synchronize(handle):
    """Wait for `handle` (the GIL is released while waiting) and return its result."""
    p = _lookup(handle)
    with _handles_lock:
        _handles.pop(handle, None)
    try:
        for r in p.requests:
            r.wait()
    except tandem.TandemError as e:
        if p.name:
            e.args = (f"{e.args[0]} (operation {p.name!r})",) + e.args[1:]
        raise
    return p.finish()


# ---- allreduce ----

def _scale(t, factor):
    """t *= factor in place (integers through a rounding-free cast, as a store does)."""
    if t.is_floating_point():
        return t.mul_(factor)
    return t.copy_((t.double() * factor).to(t.dtype))


def _allreduce_start(tensor, output, op, prescale, postscale, compression, name, w=None):
    """Reduce `tensor` into `output` (same shape and dtype; may be `tensor`
    itself); returns a handle."""
    _code(tensor)
    _check_name(name)
    prescale = _check_scale("prescale_factor", prescale)
    postscale = _check_scale("postscale_factor", postscale)
    compression = check_compression(compression)
    wire, ctx = compression.compress(tensor)
    code = _code(wire)
    if prescale != 1.0:
        src = _scale(wire.clone(memory_format=torch.contiguous_format), prescale)
    else:
        src = wire if wire.is_contiguous() else wire.contiguous()
    if src is tensor and output.is_contiguous():
        dst = output  # in place when output is tensor: the same address
    else:
        dst = src if src is not tensor else torch.empty_like(src)  # reduce a temporary in place
    world = _world()
    w = w or world
    # a joined rank (hvd.join) learns from this descriptor what to contribute
    desc = _join.announce_async(w, _join.K_ALLREDUCE, src.numel(), code, op) if w is world else None
    _ready(src, dst)
    req = w.iallreduce(src.data_ptr(), dst.data_ptr(), src.numel(), code, op, keep=(src, dst))

    def finish():
        res = compression.decompress(dst, ctx) if dst.dtype != output.dtype else dst
        if postscale != 1.0:
            _scale(res, postscale)
        if res is not output:
            output.copy_(res.view(output.shape))
        return output

    return _new_handle([req] if desc is None else [desc, req], finish, name)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=None, compression=None):
    """Start an out-of-place allreduce; synchronize(handle) returns the result."""
    w = _comm(process_set)
    output = torch.empty_like(tensor, memory_format=torch.contiguous_format) if isinstance(tensor, torch.Tensor) \
        else tensor
    return _allreduce_start(tensor, output, _op(op, average), prescale_factor, postscale_factor, compression, name, w)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=None):
    """Reduce `tensor` over all ranks (op Average by default); returns a new tensor."""
    w = _comm(process_set)
    if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
        if process_set is not None and process_set is not global_process_set:
            raise NotImplementedError("tandem.torch: allreduce with a gradient over a process set is not supported")
        return _AllreduceFn.apply(tensor, _op(op, average), prescale_factor, postscale_factor, compression, name)
    output = torch.empty_like(tensor, memory_format=torch.contiguous_format) if isinstance(tensor, torch.Tensor) \
        else tensor
    return synchronize(_allreduce_start(tensor, output, _op(op, average), prescale_factor, postscale_factor,
                                        compression, name, w))


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=None):
    """Start an in-place allreduce of `tensor`; synchronize(handle) returns it."""
    w = _comm(process_set)
    return _allreduce_start(tensor, tensor, _op(op, average), prescale_factor, postscale_factor, None, name, w)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=None):
    """In-place allreduce; returns `tensor`."""
    if (prescale_factor == 1.0 and postscale_factor == 1.0 and process_set is None
            and type(tensor) is torch.Tensor and tensor.is_contiguous() and tensor.device.type == "cpu"
            and tensor.dtype in _CODES and not tensor.is_sparse):
        # The common case in one blocking C call (latency: no handle, no thread hand-off).
        p = tensor.data_ptr()
        w, code, opc = _world(), _CODES[tensor.dtype], _op(op, average)
        _join.announce(w, _join.K_ALLREDUCE, tensor.numel(), code, opc)
        w.allreduce(p, p, tensor.numel(), code, opc)
        return tensor
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set))


class _AllreduceFn(torch.autograd.Function):
    """Allreduce with a gradient: the gradient of a sum over ranks is the
    allreduce of the output gradients (Horovod's HorovodAllreduce)."""

    @staticmethod
    def forward(ctx, tensor, op, prescale, postscale, compression, name):
        ctx.op, ctx.prescale, ctx.postscale = op, prescale, postscale
        out = torch.empty_like(tensor, memory_format=torch.contiguous_format)
        return synchronize(_allreduce_start(tensor.detach(), out, op, prescale, postscale, compression, name))

    @staticmethod
    def backward(ctx, grad):
        out = torch.empty_like(grad, memory_format=torch.contiguous_format)
        g = synchronize(_allreduce_start(grad, out, ctx.op, ctx.prescale, ctx.postscale, None, None))
        return g, None, None, None, None, None


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=None, compression=None):
    """One handle for a list of tensors, reduced together; synchronize returns the list."""
    if not isinstance(tensors, (list, tuple)):
        raise TypeError("tandem.torch: grouped_allreduce takes a list of tensors")
    opc = _op(op, average)
    hs = [allreduce_async(t, None, None, opc, prescale_factor, postscale_factor, process_set, compression)
          for t in tensors]
    pend = [_lookup(h) for h in hs]
    with _handles_lock:
        for h in hs:
            _handles.pop(h, None)
    return _new_handle([r for p in pend for r in p.requests], lambda: [p.finish() for p in pend], name)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    return synchronize(grouped_allreduce_async(tensors, average, name, op, prescale_factor, postscale_factor,
                                               process_set, compression))


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=None):
    if not isinstance(tensors, (list, tuple)):
        raise TypeError("tandem.torch: grouped_allreduce_ takes a list of tensors")
    opc = _op(op, average)
    hs = [allreduce_async_(t, None, None, opc, prescale_factor, postscale_factor, process_set) for t in tensors]
    pend = [_lookup(h) for h in hs]
    with _handles_lock:
        for h in hs:
            _handles.pop(h, None)
    return _new_handle([r for p in pend for r in p.requests], lambda: [p.finish() for p in pend], name)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                       process_set=None):
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor,
                                                process_set))


# ---- broadcast ----

def _check_root(root_rank, process_set=None):
    """root_rank's index in the communicator of process_set (root_rank is a
    rank of the world and must belong to the set)."""
    if isinstance(root_rank, bool) or not isinstance(root_rank, int):
        raise TypeError(f"tandem.torch: root_rank must be an int, not {type(root_rank).__name__}")
    n = _world().size()
    if not 0 <= root_rank < n:
        raise ValueError(f"tandem.torch: root_rank {root_rank} is out of range for {n} ranks")
    if process_set is None or process_set is global_process_set:
        return root_rank
    if root_rank not in process_set.ranks:
        raise ValueError(f"tandem.torch: root_rank {root_rank} is not in the process set {process_set.ranks}")
    return process_set.ranks.index(root_rank)


def broadcast_async_(tensor, root_rank, name=None, process_set=None):
    """Start overwriting `tensor` with root_rank's, in place."""
    w = _comm(process_set)
    code = _code(tensor)
    _check_name(name)
    root = _check_root(root_rank, process_set)
    if w is _world():
        d = _join.announce(w, _join.K_BROADCAST, tensor.numel(), code, op=root, root=root)
        if d is not None and not d[_join.ROOT_ACTIVE]:
            _join.refuse_if_joined(w, d, f"broadcast from root rank {root} (it has joined)")
    buf = tensor if tensor.is_contiguous() else tensor.contiguous()
    _ready(buf)
    req = w.ibroadcast(buf.data_ptr(), buf.numel(), code, root, keep=buf)

    def finish():
        if buf is not tensor:
            tensor.copy_(buf)
        return tensor

    return _new_handle([req], finish, name)


def broadcast_(tensor, root_rank, name=None, process_set=None):
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


def broadcast_async(tensor, root_rank, name=None, process_set=None):
    _code(tensor)
    return broadcast_async_(tensor.detach().clone(memory_format=torch.contiguous_format), root_rank, name,
                            process_set)


class _BroadcastFn(torch.autograd.Function):
    """Broadcast with a gradient (Horovod's HorovodBroadcast): every rank's
    output is the root's input, so the root's gradient is the sum of the
    output gradients over ranks, and the other ranks' inputs get zero."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name):
        ctx.root_rank = root_rank
        return synchronize(broadcast_async(tensor.detach(), root_rank, name))

    @staticmethod
    def backward(ctx, grad):
        g = allreduce(grad.contiguous(), op=Sum)
        if _world().rank() != ctx.root_rank:
            g.zero_()
        return g, None, None


def broadcast(tensor, root_rank, name=None, process_set=None):
    """root_rank's `tensor` on every rank, as a new tensor (differentiable,
    as Horovod's, on the global process set)."""
    if isinstance(tensor, torch.Tensor) and tensor.requires_grad and torch.is_grad_enabled():
        _no_process_set(process_set)
        _code(tensor)
        _check_root(root_rank)
        return _BroadcastFn.apply(tensor, root_rank, name)
    return synchronize(broadcast_async(tensor, root_rank, name, process_set))


# ---- allgather (first dimension may differ per rank) ----

def _rows_of_all(w, rows, trailing, what):
    """Every rank's first-dimension size; checks the trailing shape agrees."""
    n = w.size()
    info = torch.zeros(n, 2, dtype=torch.int64)
    info[w.rank(), 0] = rows
    info[w.rank(), 1] = hash(tuple(trailing)) & ((1 << 62) - 1)
    w.allreduce(info.data_ptr(), info.data_ptr(), info.numel(), tandem.I64, tandem.SUM)
    # -1: a rank in hvd.join() (no rows, no shape)
    if ((info[:, 1] != info[w.rank(), 1]) & (info[:, 1] != -1)).any():
        bad = [r for r in range(n) if info[r, 1] != info[w.rank(), 1] and info[r, 1] != -1]
        raise ValueError(f"tandem.torch: {what}: ranks disagree on the shape after the first dimension "
                         f"(rank {w.rank()} has {tuple(trailing)}; ranks {bad} differ)")
    return [int(v) for v in info[:, 0]]


def allgather_async(tensor, name=None, process_set=None):
    """Start gathering every rank's tensor, concatenated along dimension 0.
    The row counts are exchanged first (a short blocking step); the data
    then moves in the background."""
    w = _comm(process_set)
    code = _code(tensor)
    _check_name(name)
    if tensor.dim() == 0:
        raise ValueError("tandem.torch: allgather needs a tensor with at least one dimension")
    n, me = w.size(), w.rank()
    row_elems = 1
    for d in tensor.shape[1:]:
        row_elems *= d
    if w is _world():
        _join.announce(w, _join.K_ALLGATHER, row_elems, code)
    rows = _rows_of_all(w, tensor.shape[0], tensor.shape[1:], "allgather")
    big = max(rows)
    total = sum(rows)
    if all(r == big for r in rows):
        out = torch.empty((total,) + tuple(tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
        src = tensor if tensor.is_contiguous() else tensor.contiguous()
        _ready(src)
        req = w.iallgather(src.data_ptr(), out.data_ptr(), out.numel(), code, keep=(src, out))
        return _new_handle([req], lambda: out, name)
    padded = torch.zeros((n * big,) + tuple(tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    padded[me * big:me * big + rows[me]] = tensor
    mine = padded[me * big:]
    _ready(padded)
    req = w.iallgather(mine.data_ptr(), padded.data_ptr(), padded.numel(), code, keep=padded)

    def finish():
        return torch.cat([padded[r * big:r * big + rows[r]] for r in range(n)])

    return _new_handle([req], finish, name)


class _AllgatherFn(torch.autograd.Function):
    """Allgather with a gradient (Horovod's HorovodAllgather): this rank's
    rows appear in every rank's output, so their gradient is the sum over
    ranks of the output gradient at those rows."""

    @staticmethod
    def forward(ctx, tensor, name):
        out = synchronize(allgather_async(tensor.detach(), name))
        w = _world()
        rows = torch.zeros(w.size(), dtype=torch.int64)
        rows[w.rank()] = tensor.shape[0]
        allreduce_(rows, op=Sum)
        ctx.offset, ctx.rows = int(rows[:w.rank()].sum()), tensor.shape[0]
        return out

    @staticmethod
    def backward(ctx, grad):
        g = allreduce(grad.contiguous(), op=Sum)
        return g.narrow(0, ctx.offset, ctx.rows), None


def allgather(tensor, name=None, process_set=None):
    """Every rank's `tensor` concatenated along dimension 0 (differentiable,
    as Horovod's, on the global process set)."""
    if isinstance(tensor, torch.Tensor) and tensor.requires_grad and torch.is_grad_enabled():
        _no_process_set(process_set)
        return _AllgatherFn.apply(tensor, name)
    return synchronize(allgather_async(tensor, name, process_set))


# ---- alltoall ----

def alltoall_async(tensor, splits=None, name=None, process_set=None):
    """Rows splits[j] of `tensor` (consecutive, in rank order) go to rank j;
    the result concatenates what each rank sent here. synchronize returns
    (output, received_splits) when splits were given, else output."""
    w = _comm(process_set)
    code = _code(tensor)
    _check_name(name)
    if tensor.dim() == 0:
        raise ValueError("tandem.torch: alltoall needs a tensor with at least one dimension")
    n = w.size()
    given = splits is not None
    if splits is None:
        if tensor.shape[0] % n:
            raise ValueError(f"tandem.torch: alltoall without splits needs the first dimension "
                             f"({tensor.shape[0]}) divisible by the number of ranks ({n})")
        send_splits = torch.full((n,), tensor.shape[0] // n, dtype=torch.int64)
    else:
        if isinstance(splits, torch.Tensor) and (splits.is_floating_point() or splits.is_complex()):
            raise TypeError(f"tandem.torch: alltoall splits must hold integers, not {splits.dtype}")
        try:
            send_splits = torch.as_tensor(splits, dtype=torch.int64).reshape(-1).clone()
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"tandem.torch: alltoall splits must be a list or tensor of row counts, one per rank, "
                            f"not {splits!r}") from None
        if send_splits.numel() != n:
            raise ValueError(f"tandem.torch: alltoall splits has {send_splits.numel()} entries for {n} ranks")
        if (send_splits < 0).any() or int(send_splits.sum()) != tensor.shape[0]:
            raise ValueError(f"tandem.torch: alltoall splits {send_splits.tolist()} must be >= 0 and sum to "
                             f"the first dimension {tensor.shape[0]}")
    if w is _world():  # after the argument checks: nothing is issued for wrong arguments
        _join.refuse_if_joined(w, _join.announce(w, _join.K_REFUSED), "alltoall")
    _rows_of_all(w, 0, tensor.shape[1:], "alltoall")
    recv_splits = torch.empty(n, dtype=torch.int64)
    w.alltoall(send_splits.data_ptr(), recv_splits.data_ptr(), 1, tandem.I64)
    big = torch.tensor([int(send_splits.max()) if n else 0], dtype=torch.int64)
    w.allreduce(big.data_ptr(), big.data_ptr(), 1, tandem.I64, tandem.MAX)
    big = int(big)
    trailing = tuple(tensor.shape[1:])
    row_elems = 1
    for d in trailing:
        row_elems *= d
    send = torch.zeros((n * big,) + trailing, dtype=tensor.dtype, device=tensor.device)
    off = 0
    for j in range(n):
        k = int(send_splits[j])
        send[j * big:j * big + k] = tensor[off:off + k]
        off += k
    recv = torch.empty_like(send)
    _ready(send)
    req = w.ialltoall(send.data_ptr(), recv.data_ptr(), big * row_elems, code, keep=(send, recv))

    def finish():
        out = torch.cat([recv[j * big:j * big + int(recv_splits[j])] for j in range(n)])
        return (out, recv_splits) if given else out

    return _new_handle([req], finish, name)


class _AlltoallFn(torch.autograd.Function):
    """Alltoall with a gradient: the rows this rank received from rank q go
    back to q (an alltoall with the received splits), landing where q's
    input rows were."""

    @staticmethod
    def forward(ctx, tensor, splits, name):
        res = synchronize(alltoall_async(tensor.detach(), splits, name))
        if splits is None:
            ctx.recv = None
            return res
        out, recv = res
        ctx.recv = recv
        ctx.mark_non_differentiable(recv)
        return out, recv

    @staticmethod
    def backward(ctx, grad, *_):
        g = alltoall(grad.contiguous(), splits=ctx.recv)
        return (g if ctx.recv is None else g[0]), None, None


def alltoall(tensor, splits=None, name=None, process_set=None):
    """(differentiable, as Horovod's, on the global process set)"""
    if _in_graph(tensor):
        _no_process_set(process_set)
        return _AlltoallFn.apply(tensor, splits, name)
    return synchronize(alltoall_async(tensor, splits, name, process_set))


# ---- reducescatter ----

def reducescatter_async(tensor, name=None, op=Average, process_set=None, prescale_factor=1.0,
                        postscale_factor=1.0):
    """Reduce over ranks, rank r keeps its share of the first dimension (the
    first dim % size ranks get one extra row)."""
    w = _comm(process_set)
    code = _code(tensor)
    _check_name(name)
    opc = _op(op)
    prescale = _check_scale("prescale_factor", prescale_factor)
    postscale = _check_scale("postscale_factor", postscale_factor)
    if tensor.dim() == 0:
        raise ValueError("tandem.torch: reducescatter needs a tensor with at least one dimension")
    n, me = w.size(), w.rank()
    if w is _world():
        _join.refuse_if_joined(w, _join.announce(w, _join.K_REFUSED), "reducescatter")
    _rows_of_all(w, 0, tensor.shape[1:], "reducescatter")
    rows = tensor.shape[0]
    q, rem = divmod(rows, n)
    share = [q + (1 if r < rem else 0) for r in range(n)]
    big = q + (1 if rem else 0)
    trailing = tuple(tensor.shape[1:])
    row_elems = 1
    for d in trailing:
        row_elems *= d
    # Every rank's share padded to `big` rows, so that the element shards of
    # the C reduce-scatter fall on row boundaries.
    src = torch.zeros((n * big,) + trailing, dtype=tensor.dtype, device=tensor.device)
    off = 0
    for r in range(n):
        src[r * big:r * big + share[r]] = tensor[off:off + share[r]]
        off += share[r]
    if prescale != 1.0:
        src.mul_(prescale)
    out = torch.empty((big,) + trailing, dtype=tensor.dtype, device=tensor.device)
    _ready(src)
    req = w.ireduce_scatter(src.data_ptr(), out.data_ptr(), src.numel(), code, opc, keep=(src, out))

    def finish():
        res = out[:share[me]]
        if postscale != 1.0:
            res.mul_(postscale)
        return res

    return _new_handle([req], finish, name)


class _ReducescatterFn(torch.autograd.Function):
    """Reducescatter (Sum or Average) with a gradient: every input row
    contributes to the one output row of its owner, so the input gradient is
    the allgather of the output gradients, times the op's and the scale
    factors' constant."""

    @staticmethod
    def forward(ctx, tensor, name, compression, op, prescale, postscale):
        ctx.factor = prescale * postscale / (_world().size() if op == Average else 1)
        return reducescatter(tensor.detach(), name, compression, op, None, prescale, postscale)

    @staticmethod
    def backward(ctx, grad):
        g = allgather(grad.contiguous())
        return g * ctx.factor if ctx.factor != 1.0 else g, None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average, process_set=None,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Horovod's argument order (compression= third, as in horovod.torch);
    differentiable for Sum and Average on the global process set."""
    compression = check_compression(compression)
    _code(tensor)
    if _in_graph(tensor):
        opc = _op(op)
        if opc not in (Sum, Average):
            raise NotImplementedError("tandem.torch: reducescatter has a gradient for op Sum and Average only; "
                                      "pass tensor.detach() for Min/Max/Product")
        _no_process_set(process_set)
        return _ReducescatterFn.apply(tensor, name, compression, opc, _check_scale("prescale_factor", prescale_factor),
                                      _check_scale("postscale_factor", postscale_factor))
    wire, ctx = compression.compress(tensor)
    out = synchronize(reducescatter_async(wire, name, op, process_set, prescale_factor, postscale_factor))
    return compression.decompress(out, ctx) if wire is not tensor else out


# ---- the rest ----

def barrier(process_set=None):
    w = _comm(process_set)
    if w is _world():
        _join.announce(w, _join.K_BARRIER)
    w.barrier()


join = _join.join


def _no_process_set(ps):
    """For the calls that serve only the global set (DistributedOptimizer,
    broadcast_parameters, ...)."""
    if ps is not None and ps is not global_process_set:
        raise NotImplementedError("tandem.torch: this call serves only the global process set")


def _comm(ps):
    """The communicator of process set `ps` (None: the global one)."""
    if ps is None or ps is global_process_set:
        return _world()
    if not isinstance(ps, ProcessSet):
        raise TypeError(f"tandem.torch: process_set must be a tandem.torch.ProcessSet, not {type(ps).__name__}")
    if ps.process_set_id is None:
        raise ValueError(f"tandem.torch: process set {ps.ranks} was not added: call add_process_set() on every "
                         "rank first")
    if ps._comm is None:
        raise ValueError(f"tandem.torch: rank {_world().rank()} is not in process set {ps.ranks}")
    return ps._comm


class _GlobalProcessSet:
    process_set_id = 0

    @property
    def ranks(self):
        return list(range(_world().size()))

    def size(self):
        return _world().size()

    def rank(self):
        return _world().rank()

    def included(self):
        return True


global_process_set = _GlobalProcessSet()


class ProcessSet:
    """A subset of the world's ranks (Horovod's hvd.ProcessSet). Usable
    after add_process_set(); collectives given process_set= run among its
    ranks only (Tandem's td_comm_split), and a rank outside it that calls one
    gets ValueError. root_rank arguments stay ranks of the world."""

    def __init__(self, ranks):
        try:
            rs = sorted({int(r) for r in ranks})
        except (TypeError, ValueError):
            raise TypeError("tandem.torch: ProcessSet takes a list of ranks") from None
        if not rs:
            raise ValueError("tandem.torch: a ProcessSet needs at least one rank")
        self.ranks = rs
        self.process_set_id = None
        self._comm = None

    def size(self):
        return len(self.ranks)

    def rank(self):
        """This process's rank within the set, or None when not included."""
        me = _world().rank()
        return self.ranks.index(me) if me in self.ranks else None

    def included(self):
        return _world().rank() in self.ranks

    def __repr__(self):
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


_process_sets = {}
_next_set_id = itertools.count(1)


def add_process_set(process_set):
    """Collective over the world: every rank adds the same sets in the same
    order. Takes a ProcessSet or a list of ranks; returns the ProcessSet."""
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.process_set_id is not None:
        raise ValueError(f"tandem.torch: {ps!r} was added already")
    w = _world()
    n = w.size()
    _join.refuse_if_joined(w, _join.announce(w, _join.K_REFUSED), "add_process_set")
    if ps.ranks[0] < 0 or ps.ranks[-1] >= n:
        raise ValueError(f"tandem.torch: process set {ps.ranks} names ranks outside the world of {n}")
    # Every rank must name the same set: compare a digest of the rank list.
    digest = hash(tuple(ps.ranks)) & ((1 << 62) - 1)
    lo = torch.tensor([digest], dtype=torch.int64)
    hi = lo.clone()
    w.allreduce(lo.data_ptr(), lo.data_ptr(), 1, tandem.I64, tandem.MIN)
    w.allreduce(hi.data_ptr(), hi.data_ptr(), 1, tandem.I64, tandem.MAX)
    if int(lo) != int(hi):
        raise ValueError(f"tandem.torch: add_process_set: ranks disagree on the set (rank {w.rank()} added "
                         f"{ps.ranks}); every rank must add the same sets in the same order")
    me = w.rank()
    ps._comm = w.split(0 if me in ps.ranks else -1, me)
    ps.process_set_id = next(_next_set_id)
    _process_sets[ps.process_set_id] = ps
    return ps


def remove_process_set(process_set):
    """Collective over the set's ranks: leave and release its communicator."""
    ps = process_set
    if not isinstance(ps, ProcessSet) or _process_sets.get(ps.process_set_id) is not ps:
        raise ValueError(f"tandem.torch: {ps!r} is not an added process set")
    del _process_sets[ps.process_set_id]
    comm, ps._comm, ps.process_set_id = ps._comm, None, None
    if comm is not None:
        comm.finalize()
    return True
