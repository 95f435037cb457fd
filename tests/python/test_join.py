"""hvd.join() with Horovod's semantics: a rank out of data keeps serving the
others' collectives (zeros to allreduce; Average still divides by size()),
join() returns the rank that joined last, and a DistributedOptimizer loop
with a different number of batches per rank trains as an independent
single-process computation of the same rule says. Closed-form expectations
only; every rank runs these tests in the same order."""
import pytest
import torch
import torch.nn.functional as F

import tandem
import tandem.torch as hvd


def test_join_serves_allreduce_with_zeros():
    """Rank r runs r+1 rounds, then joins: in round i the active ranks are
    r >= i, so Sum = sum_{r>=i} (r+1)(i+1) and Average = Sum / size."""
    n, me = hvd.size(), hvd.rank()
    for i in range(me + 1):
        active = range(i, n)
        total = sum((r + 1) * (i + 1) for r in active)
        for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64,
                      torch.uint8):
            x = torch.full((7,), (me + 1) * (i + 1), dtype=dtype)
            got = hvd.allreduce(x, op=hvd.Sum)
            assert got.dtype == dtype and (got == torch.full((7,), total, dtype=dtype)).all(), (i, dtype, got)
        x = torch.full((1000,), float((me + 1) * (i + 1)))
        # Average over size(), joined ranks counted, as Horovod (within rounding: sum * (1/n) or sum / n)
        assert torch.allclose(hvd.allreduce(x), torch.full((1000,), total / n), rtol=1e-6, atol=0)
        y = torch.full((3, 5), float(me + 1))
        hvd.allreduce_(y, op=hvd.Sum)  # the blocking in-place fast path
        assert torch.equal(y, torch.full((3, 5), float(sum(r + 1 for r in active))))
        a = torch.ones(33, dtype=torch.float64)
        b = torch.full((4,), me + 1, dtype=torch.int64)
        ha = hvd.allreduce_async_(a, op=hvd.Sum)
        hb = hvd.allreduce_async(b, op=hvd.Max)
        g = hvd.grouped_allreduce([torch.ones(2), torch.ones(9)], op=hvd.Sum)
        assert torch.equal(hvd.synchronize(hb), torch.full((4,), n, dtype=torch.int64))  # max: rank n-1 is active
        assert torch.equal(hvd.synchronize(ha), torch.full((33,), float(len(active)), dtype=torch.float64))
        assert [t.tolist() for t in g] == [[len(active)] * 2, [len(active)] * 9]
        h = hvd.allreduce(torch.ones(6), op=hvd.Sum, compression=hvd.Compression.fp16)
        assert torch.equal(h, torch.full((6,), float(len(active))))
    assert hvd.join() == n - 1  # rank n-1 joined last, alone


def test_join_serves_broadcast_allgather_barrier_and_refuses_the_rest():
    """Rank 0 joins at once; the others broadcast from an active root,
    allgather (rank 0 adds no rows), run a barrier, and get
    InvalidUsageError naming rank 0 for a broadcast from rank 0, alltoall
    and reducescatter. They then join together: the highest joins last."""
    n, me = hvd.size(), hvd.rank()
    if n == 1:
        assert hvd.join() == 0
        return
    if me == 0:
        assert hvd.join() == n - 1
        return
    root = n - 1
    t = torch.arange(10, dtype=torch.float32) * me
    assert torch.equal(hvd.broadcast(t, root), torch.arange(10, dtype=torch.float32) * root)
    rows = torch.full((me, 3), me, dtype=torch.int32)  # rank r adds r rows of r
    got = hvd.allgather(rows)
    expect = torch.cat([torch.full((r, 3), r, dtype=torch.int32) for r in range(1, n)])
    assert torch.equal(got, expect)
    objs = hvd.allgather_object({"rank": me})
    assert objs == [None] + [{"rank": r} for r in range(1, n)]
    assert hvd.broadcast_object(("hello", me), root_rank=root) == ("hello", root)
    hvd.barrier()
    keep = torch.full((4,), 7.0)
    with pytest.raises(tandem.InvalidUsageError, match=r"rank\(s\) \[0\]"):
        hvd.broadcast_(keep, 0)
    assert torch.equal(keep, torch.full((4,), 7.0))  # refused before any data moved
    with pytest.raises(tandem.InvalidUsageError, match=r"alltoall.*\[0\]"):
        hvd.alltoall(torch.zeros(n, 2))
    with pytest.raises(tandem.InvalidUsageError, match=r"reducescatter.*\[0\]"):
        hvd.reducescatter(torch.zeros(4, 2))
    assert hvd.join() == n - 1


def test_join_after_join_world_is_usable_again():
    """After every rank returned from join(), collectives run as before."""
    n = hvd.size()
    assert hvd.join() == n - 1  # all join in the same round: the highest rank
    assert torch.equal(hvd.allreduce(torch.ones(5), op=hvd.Sum), torch.full((5,), float(n)))


def test_join_argument_errors():
    with pytest.raises(TypeError, match="device"):
        hvd.join(device="cpu")
    with pytest.raises(ValueError, match="CPU"):
        hvd.join(device=0)


BATCHES = (3, 5, 4)  # batches of rank r: BATCHES[r % 3]
B, D_IN, D_OUT = 6, 5, 3


def _model():
    torch.manual_seed(11)
    return torch.nn.Sequential(torch.nn.Linear(D_IN, 8), torch.nn.Tanh(), torch.nn.Linear(8, D_OUT))


def _data(r, s):
    g = torch.Generator().manual_seed(100 * r + s)
    return torch.randn(B, D_IN, generator=g), torch.randint(0, D_OUT, (B,), generator=g)


@pytest.mark.parametrize("compression", ["none", "fp16"])
def test_distributed_optimizer_uneven_batches_with_join(compression):
    """Ranks with 3, 5 and 4 batches: each rank trains on its own, joins when
    out of data, and the result equals one process applying Horovod's rule
    (step s: the gradient is the sum over the ranks still active of their
    mean-loss gradient, divided by size()) with the same SGD+momentum: to
    1e-5 with zero-copy buckets; with fp16 on the wire (packed buckets, the
    other code path) to fp16's rounding of the gradients."""
    n, me = hvd.size(), hvd.rank()
    mine = BATCHES[me % 3]
    tol = dict(rtol=1e-5, atol=1e-6) if compression == "none" else dict(rtol=2e-3, atol=2e-3)

    m = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.2, momentum=0.9),
                                   named_parameters=m.named_parameters(),
                                   compression=getattr(hvd.Compression, compression))
    losses = []
    for s in range(mine):
        x, y = _data(me, s)
        opt.zero_grad()
        loss = F.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    last = hvd.join()
    longest = max(BATCHES[r % 3] for r in range(n))
    assert last == max(r for r in range(n) if BATCHES[r % 3] == longest)
    hvd.broadcast_parameters(m.state_dict(), root_rank=last)

    # the independent computation: one process, plain torch, no tandem
    ref = _model()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.2, momentum=0.9)
    ref_losses = {}
    for s in range(longest):
        ref_opt.zero_grad()
        grads = [torch.zeros_like(p) for p in ref.parameters()]
        for r in range(n):
            if s >= BATCHES[r % 3]:
                continue
            x, y = _data(r, s)
            loss = F.cross_entropy(ref(x), y)
            ref_losses[(r, s)] = loss.item()
            for g, gp in zip(grads, torch.autograd.grad(loss, list(ref.parameters()))):
                g += gp
        for p, g in zip(ref.parameters(), grads):
            p.grad = g / n
        ref_opt.step()
    for s, l in enumerate(losses):
        assert l == pytest.approx(ref_losses[(me, s)], rel=tol["rtol"], abs=tol["atol"] / 10), (s, l)
    for (name, p), q in zip(m.named_parameters(), ref.parameters()):
        assert torch.allclose(p.detach(), q.detach(), **tol), (name, (p - q).abs().max())


def test_wrong_arguments_issue_nothing():
    """Only rank 0 makes the wrong calls; had any of them issued its join
    descriptor (or anything else), the allreduce after would mismatch."""
    n = hvd.size()
    if hvd.rank() == 0:
        x = torch.ones(2 * n + 1)
        with pytest.raises(ValueError, match="entries for"):
            hvd.alltoall(x, splits=[1] * (n + 1))
        with pytest.raises(ValueError, match="sum to"):
            hvd.alltoall(x, splits=[0] * n)
        with pytest.raises(TypeError, match="prescale_factor"):
            hvd.reducescatter(x, prescale_factor="2")
        with pytest.raises(ValueError, match="at least one dimension"):
            hvd.allgather(torch.tensor(1.0))
        with pytest.raises(ValueError, match="out of range"):
            hvd.broadcast_(x, n)
        with pytest.raises(TypeError, match="compression="):
            hvd.allreduce(x, compression="none")
        with pytest.raises(TypeError, match="name="):
            hvd.allreduce_async(x, name=3)
        with pytest.raises(TypeError, match="device"):
            hvd.join(device="cpu")
    got = hvd.allreduce(torch.full((3,), 2.0), op=hvd.Sum)
    assert torch.equal(got, torch.full((3,), 2.0 * n))
