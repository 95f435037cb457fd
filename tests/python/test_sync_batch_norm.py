"""hvd.SyncBatchNorm against torch's BatchNorm on the concatenated batch:
every rank builds the whole job's batch (rank r's slice has r + 2 rows, so
the slices differ), runs torch.nn.BatchNorm1d/2d on all of it, and compares
its own slice of the output and of the input gradient, the weight and bias
gradients summed over ranks, and the running statistics over several steps,
then eval mode."""
import pytest
import torch

import tandem.torch as hvd


def rows(q):
    return q + 2


def batch(step, shape_tail, n):
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(sum(rows(q) for q in range(n)), *shape_tail, generator=g, dtype=torch.float64) * 3 + 1.5
    dy = torch.randn(x.shape, generator=g, dtype=torch.float64)
    return x, dy


@pytest.mark.parametrize("kind,tail,affine,momentum", [
    ("1d", (5,), True, 0.1), ("2d", (3, 4, 5), True, 0.3), ("1d3", (4, 7), False, None), ("2d", (1, 2, 3), True, None)])
def test_sync_batch_norm_matches_batch_norm_on_the_whole_batch(kind, tail, affine, momentum):
    n, r = hvd.size(), hvd.rank()
    c = tail[0]
    ref_cls = torch.nn.BatchNorm2d if len(tail) == 3 else torch.nn.BatchNorm1d
    ref = ref_cls(c, affine=affine, momentum=momentum).double()
    sbn = hvd.SyncBatchNorm(c, affine=affine, momentum=momentum).double()
    if affine:
        with torch.no_grad():
            for m in (ref, sbn):
                m.weight.copy_(torch.linspace(0.5, 2.0, c, dtype=torch.float64))
                m.bias.copy_(torch.linspace(-1.0, 1.0, c, dtype=torch.float64))
    lo = sum(rows(q) for q in range(r))
    for step in range(3):
        x, dy = batch(step, tail, n)
        xr = x.clone().requires_grad_()
        yr = ref(xr)
        yr.backward(dy)
        mine = x[lo:lo + rows(r)].clone().requires_grad_()
        y = sbn(mine)
        y.backward(dy[lo:lo + rows(r)])
        torch.testing.assert_close(y, yr[lo:lo + rows(r)], rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(mine.grad, xr.grad[lo:lo + rows(r)], rtol=1e-9, atol=1e-10)
        if affine:  # each rank's weight/bias gradient is its slice's share: their sum is the whole batch's
            for p, q in ((sbn.weight, ref.weight), (sbn.bias, ref.bias)):
                total = hvd.allreduce(p.grad.clone(), op=hvd.Sum)
                torch.testing.assert_close(total, q.grad, rtol=1e-9, atol=1e-10)
                p.grad = None
                q.grad = None
        torch.testing.assert_close(sbn.running_mean, ref.running_mean, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(sbn.running_var, ref.running_var, rtol=1e-10, atol=1e-12)
        assert int(sbn.num_batches_tracked) == int(ref.num_batches_tracked) == step + 1
    sbn.eval()
    ref.eval()
    x, _ = batch(9, tail, n)
    torch.testing.assert_close(sbn(x[lo:lo + rows(r)]), ref(x)[lo:lo + rows(r)], rtol=1e-10, atol=1e-10)


def test_sync_batch_norm_float32_in_a_model_with_distributed_optimizer():
    """A float32 conv net with SyncBatchNorm2d under DistributedOptimizer:
    parameters after 3 SGD steps equal one process's BatchNorm2d net trained
    on the whole batch (the gradient average / sum relation included)."""
    n, r = hvd.size(), hvd.rank()

    def net(bn):
        torch.manual_seed(4)
        return torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3), bn(4), torch.nn.ReLU(), torch.nn.Flatten(),
                                   torch.nn.Linear(4 * 4 * 4, 3))

    ref, model = net(torch.nn.BatchNorm2d), net(hvd.SyncBatchNorm)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), op=hvd.Sum)
    lo = sum(rows(q) for q in range(r))
    total = sum(rows(q) for q in range(n))
    for step in range(3):
        g = torch.Generator().manual_seed(7 + step)
        x = torch.randn(total, 2, 6, 6, generator=g)
        y = torch.randint(0, 3, (total,), generator=g)
        ref_opt.zero_grad()
        torch.nn.functional.cross_entropy(ref(x), y, reduction="sum").backward()
        ref_opt.step()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[lo:lo + rows(r)]), y[lo:lo + rows(r)], reduction="sum").backward()
        opt.step()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=2e-4, atol=2e-5, msg=name)
    torch.testing.assert_close(model[1].running_var, ref[1].running_var, rtol=1e-5, atol=1e-6)


def test_sync_batch_norm_refuses_bad_input():
    with pytest.raises(ValueError, match="channels"):
        hvd.SyncBatchNorm(3)(torch.ones(2, 4))
    with pytest.raises(ValueError, match="expected an input of shape"):
        hvd.SyncBatchNorm(3)(torch.ones(3))
