"""hvd.join(): ranks that ran out of data keep serving the others.

Horovod's join rests on its coordinator: every tensor is negotiated, so a
joined rank learns what the others reduce and contributes zeros. Tandem has
no coordinator; collectives match by issue order. So each tandem.torch
collective on the global process set is preceded by a descriptor: a
MAX-allreduce of DESC int64 (below). Active ranks put what they are about to
do in it; a joined rank contributes zeros, reads the result, and issues the
matching collective itself (zeros for an allreduce, a scratch buffer for a
broadcast, no rows for an allgather). When the descriptor comes back with
no active rank, every rank has joined and join() returns.

The descriptor costs one small collective per operation. Allreduces (what a
training loop does) issue it non-blocking right before the data, so
backward still overlaps communication; the other operations wait for it
first, because with a joined rank they may have to be refused (alltoall,
reducescatter, as Horovod) or a joined root may have no data to send.

Semantics chosen (Horovod's, from its controller and collective ops):
Average divides by size(), joined ranks counted (they contribute zeros),
as Horovod's postscale /= process_set.controller->GetSize(). Min, Max and
Product also see the joined ranks' zeros, as in Horovod. Beyond Horovod,
which refuses broadcast and allgather while a rank has joined, Tandem
serves a broadcast whose root is active and an allgather (a joined rank
adds no rows) and a barrier; a broadcast whose root has joined, alltoall,
reducescatter and add_process_set raise InvalidUsageError on the active
ranks, naming the joined ranks (they take part in one more small allreduce
that lists them). Collectives of other process sets and of the NumPy module
are not served: they involve no descriptor.

TANDEM_JOIN=0 (the same on every rank) leaves the descriptors out, for a
script that never calls join() and wants the lowest latency per call (one
small collective less per operation); join() then raises."""
import array
import os

import tandem

DESC = 8
# descriptor fields (MAX over ranks: joined ranks contribute 0)
ACTIVE, JOINER, KIND, NUMEL, DTYPE, OP, ROOT_ACTIVE, ANY_JOINED = range(DESC)
# what an active rank is about to do
K_ALLREDUCE, K_BROADCAST, K_ALLGATHER, K_BARRIER, K_REFUSED = 1, 2, 3, 4, 5
_KIND_NAMES = {K_ALLREDUCE: "allreduce", K_BROADCAST: "broadcast", K_ALLGATHER: "allgather",
               K_BARRIER: "barrier", K_REFUSED: "this operation"}


def _enabled():
    v = os.environ.get("TANDEM_JOIN", "1")
    if v not in ("0", "1"):
        raise ValueError(f"tandem.torch: TANDEM_JOIN={v!r}: use 1 (hvd.join() works, the default) or 0 (no "
                         "join descriptors), the same on every rank")
    return v == "1"


def _active_desc(w, kind, numel, dtype, op, root):
    me = w.rank()
    return array.array("q", (me + 1, 0, kind, numel, dtype, op, 1 if root == me else 0, 0))


def announce_async(w, kind, numel=0, dtype=0, op=0, root=-1):
    """Issue the descriptor of the operation that follows (non-blocking);
    returns its Request, or None in a world of one or with TANDEM_JOIN=0."""
    if w.size() == 1 or not _enabled():
        return None
    d = _active_desc(w, kind, numel, dtype, op, root)
    return w.iallreduce(d, d, DESC, tandem.I64, tandem.MAX, keep=d, result=d)


def announce(w, kind, numel=0, dtype=0, op=0, root=-1):
    """Blocking descriptor: returns it (None in a world of one or with TANDEM_JOIN=0)."""
    if w.size() == 1 or not _enabled():
        return None
    d = _active_desc(w, kind, numel, dtype, op, root)
    w.allreduce(d, d, DESC, tandem.I64, tandem.MAX)
    return d


def joined_ranks(w):
    """Collective step after a descriptor that says a rank has joined: the
    list of joined ranks (each joined rank answers in serve())."""
    flags = array.array("q", [0]) * w.size()
    w.allreduce(flags, flags, w.size(), tandem.I64, tandem.SUM)
    return [r for r, f in enumerate(flags) if f]


def refuse_if_joined(w, d, what):
    """Raise on every active rank when the descriptor `d` says some rank has
    joined (the joined ranks take part in joined_ranks() for the message)."""
    if d is not None and d[ANY_JOINED]:
        ranks = joined_ranks(w)
        raise tandem.InvalidUsageError(
            f"tandem.torch: {what} cannot run while rank(s) {ranks} have called hvd.join() "
            f"(rank {w.rank()}); as in Horovod, only allreduce, broadcast from an active root, allgather and "
            "barrier are served by joined ranks: issue it before join() or after every rank has joined")


def _zeros(numel, dtype):
    import torch
    from .dtypes import TORCH_OF_CODE
    return torch.zeros(int(numel), dtype=TORCH_OF_CODE[int(dtype)])


def _serve(w, d):
    """The joined rank's side of one active operation described by `d`."""
    kind = d[KIND]
    if kind == K_ALLREDUCE:
        buf = _zeros(d[NUMEL], d[DTYPE])
        w.allreduce(buf.data_ptr(), buf.data_ptr(), buf.numel(), int(d[DTYPE]), int(d[OP]))
    elif kind == K_BROADCAST:
        if d[ROOT_ACTIVE]:  # otherwise the active ranks refuse it (the root has joined)
            buf = _zeros(d[NUMEL], d[DTYPE])
            w.broadcast(buf.data_ptr(), buf.numel(), int(d[DTYPE]), int(d[OP]))
        else:
            joined_ranks_answer(w)
    elif kind == K_ALLGATHER:
        # ops._rows_of_all: no rows, and -1 where the shape digest goes (skipped by the check)
        import torch
        n, me = w.size(), w.rank()
        info = torch.zeros(n, 2, dtype=torch.int64)
        info[me, 1] = -1
        w.allreduce(info.data_ptr(), info.data_ptr(), info.numel(), tandem.I64, tandem.SUM)
        big = int(info[:, 0].max())
        padded = _zeros(n * big * int(d[NUMEL]), d[DTYPE])
        mine = padded[me * big * int(d[NUMEL]):]
        w.allgather(mine.data_ptr(), padded.data_ptr(), padded.numel(), int(d[DTYPE]))
    elif kind == K_BARRIER:
        w.barrier()
    elif kind == K_REFUSED:
        joined_ranks_answer(w)
    else:
        raise tandem.InvalidUsageError(f"tandem.torch: join() on rank {w.rank()} got an unknown operation "
                                       f"descriptor {list(d)}: do all ranks run the same tandem version?")


def joined_ranks_answer(w):
    """A joined rank's part in joined_ranks()."""
    flags = array.array("q", [0]) * w.size()
    flags[w.rank()] = 1
    w.allreduce(flags, flags, w.size(), tandem.I64, tandem.SUM)


def join(device=-1):
    """This rank has run out of data: until every rank has called join(), it
    takes part in the other ranks' collectives (zeros to allreduces; see the
    module's docstring). Returns the rank that joined last (of several that
    joined in the same round, the highest)."""
    if isinstance(device, bool) or not isinstance(device, int):
        raise TypeError(f"tandem.torch: join(device=) takes an int, not {type(device).__name__}")
    if device != -1:
        raise ValueError(f"tandem.torch: join(device={device}): Tandem reduces CPU tensors; use device=-1")
    w = tandem.world()
    me = w.rank()
    if w.size() == 1:
        return me
    if not _enabled():
        raise tandem.InvalidUsageError(
            f"tandem.torch: hvd.join() on rank {me}: TANDEM_JOIN=0 turned off the descriptors the joined ranks "
            "need to serve the others; unset it (or set TANDEM_JOIN=1 on every rank) to use join()")
    first = True
    while True:
        d = array.array("q", [0]) * DESC
        d[ANY_JOINED] = 1
        if first:
            d[JOINER] = me + 1
            first = False
        w.allreduce(d, d, DESC, tandem.I64, tandem.MAX)
        if d[ACTIVE] == 0:
            # Nobody active: this round is the first in join() for every rank
            # that was active in the round before, the last to join.
            return int(d[JOINER]) - 1
        _serve(w, d)
