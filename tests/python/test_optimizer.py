"""DistributedOptimizer: a Horovod-style training loop on N ranks computes
what one process computes on the whole batch (losses and parameters within
1e-5 relative), across fusion thresholds, accumulation, predivision,
unused parameters and skip_synchronize."""
import os

import pytest
import torch
import torch.nn.functional as F

import tandem.torch as hvd

MICRO = 4  # samples per rank per step


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)
        self.fc1 = torch.nn.Linear(16, 32)
        self.ln = torch.nn.LayerNorm(32)
        self.fc2 = torch.nn.Linear(32, 10)
        self.unused = torch.nn.Linear(3, 3)  # gets no gradient: Horovod reduces zeros for it

    def forward(self, idx):
        return self.fc2(self.ln(F.gelu(self.fc1(self.emb(idx).mean(1)))))


def batch(step, n):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randint(0, 50, (n * MICRO, 5), generator=g)
    y = torch.randint(0, 10, (n * MICRO,), generator=g)
    return x, y


def make(opt_name):
    torch.manual_seed(0)
    m = Net()
    if opt_name == "adam":
        opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    else:
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    return m, opt


def reference(opt_name, steps, clip=None):
    """One process on the whole batch of every step."""
    n = hvd.size()
    m, opt = make(opt_name)
    losses = []
    for s in range(steps):
        x, y = batch(s, n)
        opt.zero_grad()
        loss = F.cross_entropy(m(x), y)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(m.parameters(), clip)
        opt.step()
        losses.append(loss.item())
    return m, losses


def assert_rel_close(a, b, what, rtol=1e-5):
    """max |a - b| relative to max |b| (elementwise ratios of float32 rounding
    noise on near-zero entries would say nothing)."""
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    err = ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item() if a.numel() else 0.0
    assert err <= rtol, f"{what}: relative error {err:.3g} > {rtol}"


@pytest.mark.parametrize("opt_name,fusion,variant", [
    ("sgd", "4096", "plain"), ("adam", "67108864", "plain"), ("adam", "4096", "accumulate2"),
    ("sgd", "67108864", "accumulate2"), ("sgd", "4096", "predivide"), ("adam", "4096", "clip"),
    ("adam", "4096", "set_to_none")])
def test_matches_single_process(opt_name, fusion, variant, monkeypatch):
    monkeypatch.setenv("TANDEM_FUSION_THRESHOLD", fusion)
    n, r = hvd.size(), hvd.rank()
    steps = 4
    ref_model, ref_losses = reference(opt_name, steps, clip=0.5 if variant == "clip" else None)
    m, base = make(opt_name)
    hvd.broadcast_parameters(m.state_dict(), root_rank=0)
    passes = 2 if variant == "accumulate2" else 1
    opt = hvd.DistributedOptimizer(base, named_parameters=m.named_parameters(), backward_passes_per_step=passes,
                                   gradient_predivide_factor=2.0 if variant == "predivide" else 1.0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    losses = []
    for s in range(steps):
        x, y = batch(s, n)
        x, y = x[r * MICRO:(r + 1) * MICRO], y[r * MICRO:(r + 1) * MICRO]
        # set_to_none drops the .grad views into the flat buckets: they are re-made
        opt.zero_grad(set_to_none=(variant == "set_to_none"))
        step_loss = 0.0
        for k in range(passes):  # micro-steps: each half of the shard, loss scaled by 1/passes
            part = slice(k * MICRO // passes, (k + 1) * MICRO // passes)
            loss = F.cross_entropy(m(x[part]), y[part]) / passes
            loss.backward()
            step_loss += loss.item()
        if variant == "clip":
            opt.synchronize()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()
        losses.append(hvd.allreduce(torch.tensor([step_loss], dtype=torch.float64)).item())
    assert_rel_close(losses, ref_losses, "losses")
    for (name, p), q in zip(m.named_parameters(), ref_model.parameters()):
        assert_rel_close(p.detach(), q.detach(), f"parameter {name}")


def test_zero_grad_between_backward_and_step():
    if hvd.size() == 1:
        pytest.skip("a world of one reduces nothing")
    m, base = make("sgd")
    opt = hvd.DistributedOptimizer(base, named_parameters=m.named_parameters())
    x, y = batch(0, hvd.size())
    F.cross_entropy(m(x[:MICRO]), y[:MICRO]).backward()
    with pytest.raises(AssertionError, match="zero_grad.*before optimizer.step"):
        opt.zero_grad()
    opt.step()
    opt.zero_grad()


def test_too_many_backward_passes():
    if hvd.size() == 1:
        pytest.skip("a world of one registers no hooks")
    m, base = make("sgd")
    opt = hvd.DistributedOptimizer(base, named_parameters=m.named_parameters())
    x, y = batch(0, hvd.size())
    F.cross_entropy(m(x[:MICRO]), y[:MICRO]).backward()
    with pytest.raises((AssertionError, RuntimeError), match="backward_passes_per_step"):
        F.cross_entropy(m(x[:MICRO]), y[:MICRO]).backward()
    opt.synchronize()  # the buckets of the first pass complete on every rank


def test_arguments():
    m, base = make("sgd")
    with pytest.raises(ValueError, match="backward_passes_per_step must be an int >= 1"):
        hvd.DistributedOptimizer(base, backward_passes_per_step=0)
    with pytest.raises(ValueError, match="duplicate names"):
        p = list(m.named_parameters())
        hvd.DistributedOptimizer(base, named_parameters=[("a", p[0][1]), ("a", p[1][1])])
    with pytest.raises(ValueError, match="gradient_predivide_factor needs op=Average"):
        hvd.DistributedOptimizer(base, op=hvd.Sum, gradient_predivide_factor=2.0)
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.DistributedOptimizer(base, op=hvd.Adasum)
    os.environ["TANDEM_FUSION_THRESHOLD"] = "lots"
    try:
        with pytest.raises(ValueError, match="TANDEM_FUSION_THRESHOLD='lots' is not a byte count"):
            hvd.DistributedOptimizer(base)
    finally:
        del os.environ["TANDEM_FUSION_THRESHOLD"]


def test_buckets_start_during_backward(monkeypatch):
    """With small buckets, the first ones are handed to Tandem before backward ends."""
    if hvd.size() == 1:
        pytest.skip("a world of one registers no hooks")
    monkeypatch.setenv("TANDEM_FUSION_THRESHOLD", "4096")
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                            torch.nn.Linear(64, 4))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), named_parameters=m.named_parameters())
    assert len(opt._buckets) >= 3
    seen = []
    # the first layer's weight gradient is the last one backward produces:
    # when it is ready, the buckets of later layers must already be in flight
    m[0].weight.register_hook(lambda g: seen.append(sum(b.request is not None for b in opt._buckets)))
    m(torch.ones(2, 16)).sum().backward()
    assert seen and seen[0] >= 1, f"no bucket was issued before backward reached the first layer ({seen})"
    opt.step()
