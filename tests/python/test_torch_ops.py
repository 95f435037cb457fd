"""tandem.torch's collectives against closed-form results, every dtype."""
import random

import pytest
import torch

import tandem.torch as hvd

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.uint8]
OPS = [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product]


@pytest.fixture(scope="module", autouse=True)
def hvd_init():
    hvd.init()  # idempotent: the session fixture already joined


def contribution(rank, shape, dtype):
    """Rank r's values: r + 1 + (i % 5), exact in every dtype (bf16 too)."""
    count = 1
    for d in shape:
        count *= d
    return (rank + 1 + torch.arange(count) % 5).reshape(shape).to(dtype)


def expected(op, n, shape, dtype):
    vals = [contribution(r, shape, torch.float64) for r in range(n)]
    if op == hvd.Sum:
        e = sum(vals)
    elif op == hvd.Average:
        s = sum(vals)
        e = torch.div(s, n, rounding_mode="floor") if not dtype.is_floating_point else s / n
    elif op == hvd.Min:
        e = vals[0]
    elif op == hvd.Max:
        e = vals[-1]
    else:
        e = vals[0].clone()
        for v in vals[1:]:
            e *= v
    return e


def test_basics():
    n = hvd.size()
    assert hvd.is_initialized()
    assert 0 <= hvd.rank() < n and 0 <= hvd.local_rank() < hvd.local_size() <= n
    assert hvd.cross_size() == 1 and hvd.cross_rank() == 0  # tandemrun puts every rank on this host
    assert not hvd.nccl_built() and not hvd.mpi_built() and not hvd.gloo_built()
    assert not hvd.mpi_threads_supported()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_allreduce_forms(dtype, op):
    n, r = hvd.size(), hvd.rank()
    for shape in [(0,), (1,), (7,), (3, 5, 2)]:
        want = expected(op, n, shape, dtype)
        x = contribution(r, shape, dtype)
        y = hvd.allreduce(x, op=op, name="ar")
        assert y.dtype == dtype and y.shape == x.shape
        torch.testing.assert_close(y.double(), want, rtol=0, atol=0)
        torch.testing.assert_close(x, contribution(r, shape, dtype))  # input untouched
        h = hvd.allreduce_async(x, op=op)
        torch.testing.assert_close(hvd.synchronize(h).double(), want, rtol=0, atol=0)
        z = x.clone()
        assert hvd.allreduce_(z, op=op) is z
        torch.testing.assert_close(z.double(), want, rtol=0, atol=0)
        z = x.clone()
        h = hvd.allreduce_async_(z, op=op)
        assert hvd.synchronize(h) is z
        torch.testing.assert_close(z.double(), want, rtol=0, atol=0)


def test_allreduce_non_contiguous_in_place():
    n, r = hvd.size(), hvd.rank()
    base = contribution(r, (6, 8), torch.float32)
    view = base[:, ::2]
    assert not view.is_contiguous()
    hvd.allreduce_(view, op=hvd.Sum)
    want = expected(hvd.Sum, n, (6, 8), torch.float32)
    torch.testing.assert_close(base[:, ::2].double(), want[:, ::2])
    torch.testing.assert_close(base[:, 1::2], contribution(r, (6, 8), torch.float32)[:, 1::2])  # untouched
    t = contribution(r, (6, 8), torch.float64).t()
    torch.testing.assert_close(hvd.allreduce(t, op=hvd.Sum), want.t())


def test_scale_factors_and_average_flag():
    n, r = hvd.size(), hvd.rank()
    x = contribution(r, (100,), torch.float64)
    s = expected(hvd.Sum, n, (100,), torch.float64)
    torch.testing.assert_close(hvd.allreduce(x, op=hvd.Sum, prescale_factor=3.0, postscale_factor=0.25), s * 0.75)
    torch.testing.assert_close(hvd.allreduce(x, average=False), s)
    torch.testing.assert_close(hvd.allreduce(x, average=True), s / n)
    torch.testing.assert_close(hvd.allreduce(x.int(), op=hvd.Sum, postscale_factor=2), (s * 2).int())


@pytest.mark.parametrize("compression", [hvd.Compression.none, hvd.Compression.fp16, hvd.Compression.bf16])
def test_compression(compression):
    n, r = hvd.size(), hvd.rank()
    x = contribution(r, (1000,), torch.float32) / 8  # exact in f16 and bf16
    y = hvd.allreduce(x, op=hvd.Sum, compression=compression)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y.double(), expected(hvd.Sum, n, (1000,), torch.float64) / 8, rtol=0, atol=0)
    wire, ctx = compression.compress(x)
    assert wire.dtype == {hvd.Compression.none: torch.float32, hvd.Compression.fp16: torch.float16,
                          hvd.Compression.bf16: torch.bfloat16}[compression]
    assert compression.decompress(wire, ctx).dtype == torch.float32


def test_async_handles_in_any_order():
    n, r = hvd.size(), hvd.rank()
    tensors = [contribution(r, (k * 37 + 1,), torch.float32) for k in range(12)]
    handles = [hvd.allreduce_async(t, op=hvd.Sum, name=f"t{k}") for k, t in enumerate(tensors)]
    handles += [hvd.broadcast_async(contribution(r, (5,), torch.int64), 0)]
    del tensors  # the handles keep what they need alive
    order = list(range(len(handles)))
    random.Random(1234 + r).shuffle(order)  # a different order on every rank
    for k in order:
        res = hvd.synchronize(handles[k])
        if k < 12:
            torch.testing.assert_close(res.double(), expected(hvd.Sum, n, (k * 37 + 1,), torch.float32))
        else:
            torch.testing.assert_close(res, contribution(0, (5,), torch.int64))
    with pytest.raises(ValueError, match="unknown or already synchronized handle"):
        hvd.synchronize(handles[0])
    # every kind of handle at once, waited in reverse order
    hs = [hvd.allgather_async(torch.full((r + 1, 2), r, dtype=torch.int32)),
          hvd.alltoall_async(torch.arange(n, dtype=torch.int64) + 10 * r),
          hvd.reducescatter_async(torch.ones(n, 3), op=hvd.Sum),
          hvd.grouped_allreduce_async([torch.ones(2), torch.full((3,), 2.0)], op=hvd.Sum),
          hvd.broadcast_async_(torch.full((2,), float(r)), n - 1)]
    assert torch.equal(hvd.synchronize(hs[4]), torch.full((2,), float(n - 1)))
    g = hvd.synchronize(hs[3])
    assert torch.equal(g[0], torch.full((2,), float(n))) and torch.equal(g[1], torch.full((3,), 2.0 * n))
    assert torch.equal(hvd.synchronize(hs[2]), torch.full((1, 3), float(n)))
    assert hvd.synchronize(hs[1]).tolist() == [10 * q + r for q in range(n)]
    assert torch.equal(hvd.synchronize(hs[0]),
                       torch.cat([torch.full((q + 1, 2), q, dtype=torch.int32) for q in range(n)]))


def test_poll():
    h = hvd.allreduce_async(torch.ones(1 << 16), op=hvd.Sum)
    import time
    deadline = time.monotonic() + 30
    while not hvd.poll(h):
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert (hvd.synchronize(h) == hvd.size()).all()


def test_grouped_allreduce():
    n, r = hvd.size(), hvd.rank()
    ts = [contribution(r, (k + 1, 3), torch.float32) for k in range(5)]
    outs = hvd.grouped_allreduce(ts, op=hvd.Sum)
    for k, o in enumerate(outs):
        torch.testing.assert_close(o.double(), expected(hvd.Sum, n, (k + 1, 3), torch.float32))
    hvd.grouped_allreduce_(ts, op=hvd.Max)
    for k, t in enumerate(ts):
        torch.testing.assert_close(t.double(), expected(hvd.Max, n, (k + 1, 3), torch.float32))


@pytest.mark.parametrize("dtype", DTYPES)
def test_allgather_variable_first_dim(dtype):
    n, r = hvd.size(), hvd.rank()
    for rows_of in (lambda q: q + 1, lambda q: 2, lambda q: 0 if q == 0 else q):
        x = torch.full((rows_of(r), 2, 3), r + 1).to(dtype)
        want = torch.cat([torch.full((rows_of(q), 2, 3), q + 1) for q in range(n)]).to(dtype)
        torch.testing.assert_close(hvd.allgather(x), want, rtol=0, atol=0)
        torch.testing.assert_close(hvd.synchronize(hvd.allgather_async(x)), want, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_broadcast_every_root(dtype):
    n, r = hvd.size(), hvd.rank()
    for root in range(n):
        x = contribution(r, (4, 9), dtype)
        y = hvd.broadcast(x, root)
        torch.testing.assert_close(y, contribution(root, (4, 9), dtype))
        torch.testing.assert_close(x, contribution(r, (4, 9), dtype))  # out of place
        assert hvd.broadcast_(x, root) is x
        torch.testing.assert_close(x, contribution(root, (4, 9), dtype))
        z = contribution(r, (3,), dtype)
        hvd.synchronize(hvd.broadcast_async_(z, root))
        torch.testing.assert_close(z, contribution(root, (3,), dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_alltoall(dtype):
    n, r = hvd.size(), hvd.rank()
    # rank r sends j + 1 rows of value 10 r + j to rank j
    splits = [j + 1 for j in range(n)]
    x = torch.cat([torch.full((j + 1, 2), 10 * r + j) for j in range(n)]).to(dtype)
    out, recv_splits = hvd.alltoall(x, splits=splits)
    assert recv_splits.tolist() == [r + 1] * n
    want = torch.cat([torch.full((r + 1, 2), 10 * q + r) for q in range(n)]).to(dtype)
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    even = torch.arange(2 * n).to(dtype) + 100 * r  # no splits: equal shares
    got = hvd.alltoall(even)
    want = torch.cat([torch.arange(2 * r, 2 * r + 2) + 100 * q for q in range(n)]).to(dtype)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_reducescatter(dtype):
    n, r = hvd.size(), hvd.rank()
    rows = 2 * n + 1  # not divisible: the first ranks get one extra row
    x = contribution(r, (rows, 3), dtype)
    total = expected(hvd.Sum, n, (rows, 3), dtype)
    q, rem = divmod(rows, n)
    start = r * q + min(r, rem)
    mine = q + (1 if r < rem else 0)
    torch.testing.assert_close(hvd.reducescatter(x, op=hvd.Sum).double(), total[start:start + mine],
                               rtol=0, atol=0)
    if dtype.is_floating_point:
        torch.testing.assert_close(hvd.reducescatter(x).double(), total[start:start + mine] / n)
    if dtype == torch.float32:  # Horovod's positional order: (tensor, name, compression, op)
        for c in (hvd.Compression.fp16, hvd.Compression.bf16):
            got = hvd.reducescatter(x, "rs", c, hvd.Sum)
            assert got.dtype == torch.float32  # values <= 7 n: exact in both wire types
            torch.testing.assert_close(got.double(), total[start:start + mine], rtol=0, atol=0)


def test_barrier_join():
    hvd.barrier()
    last = hvd.join()
    assert 0 <= last < hvd.size()
    assert hvd.allgather_object(last) == [last] * hvd.size()  # every rank names the same one


def test_objects_and_optimizer_state():
    """broadcast_parameters and broadcast_optimizer_state against the root's
    model and optimizer rebuilt here from the root's seed (every rank can
    compute what the root holds without communicating): parameters, float
    and integer buffers, Adam's moments and step, and the hyper-parameters."""
    n, r = hvd.size(), hvd.rank()
    root = n - 1
    assert hvd.broadcast_object({"rank": r, "t": torch.arange(3) * r}, root_rank=n - 1)["rank"] == n - 1
    assert hvd.allgather_object(("x" * r, r)) == [("x" * q, q) for q in range(n)]

    def build(seed):
        torch.manual_seed(seed)
        m = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.BatchNorm1d(5), torch.nn.Linear(5, 2))
        m(torch.randn(4, 3) + seed)  # BatchNorm's running statistics and its int64 batch count differ by seed
        opt = torch.optim.Adam(m.parameters(), lr=0.01 * (seed + 1), betas=(0.8 + 0.01 * seed, 0.99))
        for step in range(seed + 1):  # and so does Adam's step count
            opt.zero_grad()
            m(torch.ones(2, 3) * (step + 1)).pow(2).sum().backward()
            opt.step()
        return m, opt

    m, opt = build(r)
    ref, ref_opt = build(root)  # what the root holds, computed here
    if r != root:
        assert not torch.equal(m[0].weight, ref[0].weight)  # the test is not vacuous
    hvd.broadcast_parameters(m.state_dict(), root_rank=root)
    for (k, v), (rk, rv) in zip(sorted(m.state_dict().items()), sorted(ref.state_dict().items())):
        assert k == rk and v.dtype == rv.dtype and torch.equal(v, rv), k
    hvd.broadcast_optimizer_state(opt, root_rank=root)
    got, want = opt.state_dict(), ref_opt.state_dict()
    assert got["param_groups"] == want["param_groups"]  # lr, betas, ...: the root's
    assert sorted(got["state"]) == sorted(want["state"])
    for i, st in want["state"].items():
        for key, v in st.items():
            g = got["state"][i][key]
            assert torch.equal(torch.as_tensor(g), torch.as_tensor(v)), (i, key)


def test_allreduce_autograd():
    n, r = hvd.size(), hvd.rank()
    x = torch.full((4,), float(r + 1), requires_grad=True)
    y = hvd.allreduce(x, op=hvd.Sum)
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.full((4,), float(n)))  # d(sum over ranks)/dx, summed


def test_broadcast_and_allgather_autograd():
    """Horovod's gradients: broadcast's root gets the sum over ranks of the
    output gradients, the others zero; allgather's rows get the sum over
    ranks of the output gradient at their place. Closed forms."""
    n, r = hvd.size(), hvd.rank()
    root = n - 1
    x = torch.full((2, 3), float(r + 1), requires_grad=True)
    y = hvd.broadcast(x, root)
    assert torch.equal(y.detach(), torch.full((2, 3), float(root + 1)))
    (y * (r + 1)).sum().backward()  # d/dy on rank q: q + 1
    want = float(n * (n + 1) // 2) if r == root else 0.0
    assert torch.equal(x.grad, torch.full((2, 3), want))
    a = torch.full((r + 1, 2), float(r), requires_grad=True)  # rank q: q + 1 rows
    g = hvd.allgather(a)
    total = n * (n + 1) // 2
    assert g.shape == (total, 2)
    weights = torch.arange(total * 2, dtype=torch.float32).reshape(total, 2)
    (g * weights * (r + 1)).sum().backward()  # d/dg on rank q: (q + 1) * weights
    off = r * (r + 1) // 2
    assert torch.equal(a.grad, weights[off:off + r + 1] * float(n * (n + 1) // 2))


def test_alltoall_and_reducescatter_autograd():
    """alltoall: rank r sends j + 1 rows to rank j and rank j's loss weighs
    every received row by j + 1, so r's rows for j get gradient j + 1.
    reducescatter over 2n + 1 rows: rank p's share is weighted by p + 1, so
    each input row gets its owner's p + 1 (Sum), over n (Average), times
    the scale factors."""
    n, r = hvd.size(), hvd.rank()
    x = torch.ones(sum(j + 1 for j in range(n)), 2, requires_grad=True)
    out, recv = hvd.alltoall(x, splits=[j + 1 for j in range(n)])
    assert recv.tolist() == [r + 1] * n and not recv.requires_grad
    (out * (r + 1)).sum().backward()
    want = torch.cat([torch.full((j + 1, 2), float(j + 1)) for j in range(n)])
    assert torch.equal(x.grad, want)
    e = torch.ones(2 * n, 3, requires_grad=True)  # no splits: equal shares
    (hvd.alltoall(e) * (r + 1)).sum().backward()
    assert torch.equal(e.grad, torch.cat([torch.full((2, 3), float(j + 1)) for j in range(n)]))
    rows = 2 * n + 1
    q, rem = divmod(rows, n)
    owner = torch.tensor([p for p in range(n) for _ in range(q + (1 if p < rem else 0))], dtype=torch.float32)
    for op, pre, post, scale in ((hvd.Sum, 1.0, 1.0, 1.0), (hvd.Average, 1.0, 1.0, 1.0 / n),
                                 (hvd.Sum, 0.5, 3.0, 1.5)):
        y = torch.ones(rows, 3, requires_grad=True)
        got = hvd.reducescatter(y, op=op, prescale_factor=pre, postscale_factor=post)
        (got * (r + 1)).sum().backward()
        assert torch.allclose(y.grad, ((owner + 1) * scale).unsqueeze(1).expand(rows, 3)), (op, pre, post)


def test_wrong_arguments():
    x = torch.ones(4)
    with pytest.raises(TypeError, match="torch.Tensor"):
        hvd.allreduce([1.0, 2.0])
    with pytest.raises(TypeError, match="torch.int16"):
        hvd.allreduce(torch.ones(3, dtype=torch.int16))
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.allreduce(x, op=hvd.Adasum)
    with pytest.raises(ValueError, match="either op= or the deprecated average="):
        hvd.allreduce(x, op=hvd.Sum, average=True)
    with pytest.raises(ValueError, match="unknown reduction op code"):
        hvd.allreduce(x, op=42)
    with pytest.raises(TypeError, match="prescale_factor must be a number"):
        hvd.allreduce(x, prescale_factor="2")
    with pytest.raises(ValueError, match=f"root_rank {hvd.size()} is out of range"):
        hvd.broadcast(x, hvd.size())
    with pytest.raises(TypeError, match="root_rank must be an int"):
        hvd.broadcast(x, "0")
    with pytest.raises(ValueError, match=r"splits has \d+ entries for \d+ ranks"):
        hvd.alltoall(torch.ones(2 * hvd.size() + 1), splits=[1] if hvd.size() != 1 else [1, 1])
    with pytest.raises(ValueError, match="sum to the first dimension"):
        hvd.alltoall(torch.ones(5), splits=[6] + [0] * (hvd.size() - 1))
    with pytest.raises(ValueError, match="at least one dimension"):
        hvd.allgather(torch.tensor(1.0))
    with pytest.raises(ValueError, match="unknown or already synchronized handle"):
        hvd.synchronize(10 ** 9)
    if hvd.size() > 1:
        with pytest.raises(ValueError, match="ranks disagree on the shape"):
            hvd.allgather(torch.ones(2, 3 + hvd.rank()))
    with pytest.raises(TypeError, match="process_set must be a tandem.torch.ProcessSet"):
        hvd.allreduce(x, process_set=object())
    with pytest.raises(NotImplementedError, match="only the global process set"):
        hvd.DistributedOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1),
                                 process_set=hvd.ProcessSet([0]))
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        hvd.DistributedOptimizer(object())
    with pytest.raises(TypeError, match="compression= must be hvd.Compression"):
        hvd.allreduce(x, compression="fp16")
    with pytest.raises(TypeError, match="compression= must be hvd.Compression"):
        hvd.reducescatter(x, compression=5)
    with pytest.raises(TypeError, match="name= must be a str"):
        hvd.allreduce_async(x, name=5)
    with pytest.raises(TypeError, match="name= must be a str"):
        hvd.broadcast(x, 0, name=("a",))
    with pytest.raises(TypeError, match="splits must be a list or tensor of row counts"):
        hvd.alltoall(torch.ones(2), splits="ab")
    with pytest.raises(TypeError, match="splits must hold integers"):
        hvd.alltoall(torch.ones(2), splits=torch.tensor([2.0]))
    one = [torch.nn.Parameter(torch.ones(1))]
    with pytest.raises(TypeError, match="compression= must be hvd.Compression"):
        hvd.DistributedOptimizer(torch.optim.SGD(one, lr=0.1), compression="fp16")
    with pytest.raises(TypeError, match="gradient_predivide_factor must be a number"):
        hvd.DistributedOptimizer(torch.optim.SGD(one, lr=0.1), gradient_predivide_factor="2")
    with pytest.raises(ValueError, match="on meta; Tandem reduces CPU and CUDA tensors"):
        hvd.allreduce(torch.ones(2, device="meta"))
    g = torch.ones(hvd.size(), 2, requires_grad=True)
    with pytest.raises(NotImplementedError, match="gradient for op Sum and Average only"):
        hvd.reducescatter(g, op=hvd.Max)
    with torch.no_grad():  # no graph: Max is fine
        assert hvd.reducescatter(g, op=hvd.Max).shape[0] == 1
    torch.testing.assert_close(hvd.allreduce(x, op=hvd.Sum), x * hvd.size())  # still usable


def test_process_sets():
    """A set of the even ranks and one of rank 0 alone: collectives among
    their members against closed forms; a rank outside a set that uses it
    gets ValueError; the world is unaffected."""
    n, r = hvd.size(), hvd.rank()
    evens = hvd.add_process_set([q for q in range(0, n, 2)])
    solo = hvd.add_process_set(hvd.ProcessSet([0]))
    members = list(range(0, n, 2))
    assert evens.size() == len(members) and evens.included() == (r in members)
    if r in members:
        assert evens.rank() == members.index(r)
        t = torch.full((5,), float(r + 1))
        assert torch.equal(hvd.allreduce(t, op=hvd.Sum, process_set=evens),
                           torch.full((5,), float(sum(q + 1 for q in members))))
        b = torch.full((3,), float(r))
        hvd.broadcast_(b, root_rank=members[-1], process_set=evens)  # root_rank is a world rank
        assert torch.equal(b, torch.full((3,), float(members[-1])))
        g = hvd.allgather(torch.full((1 + r, 2), float(r)), process_set=evens)
        assert g.tolist() == [[float(q)] * 2 for q in members for _ in range(1 + q)]
        hvd.barrier(process_set=evens)
    else:
        assert evens.rank() is None
        with pytest.raises(ValueError, match="not in process set"):
            hvd.allreduce(torch.ones(2), process_set=evens)
    if r == 0:
        assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum, process_set=solo), torch.ones(2))
    if r in members and n > 1:  # rank 1 is odd: not a root of the even set
        with pytest.raises(ValueError, match="not in the process set"):
            hvd.broadcast_(torch.ones(1), root_rank=1, process_set=evens)
    assert hvd.remove_process_set(solo) and hvd.remove_process_set(evens)
    with pytest.raises(ValueError, match="was not added"):
        hvd.allreduce(torch.ones(1), process_set=evens)
    assert torch.equal(hvd.allreduce(torch.ones(1), op=hvd.Sum), torch.full((1,), float(n)))
