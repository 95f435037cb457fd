"""tandem.torch on CUDA tensors (tests/gpu.suite; run by scripts/gpu-check on
a GPU machine, every rank on cuda:(local_rank % GPUs), so 2 ranks on one
GPU take the staged path):

    tandemrun -np 2 python3 tests/python/gpu_torch_cuda.py

1. Collectives on CUDA tensors against closed-form values computed here:
   allreduce (Sum, Average, Max; in place and not; float32, bfloat16,
   int64; sizes 1, 7, 1000003), broadcast from the last rank, allgather with
   a different row count per rank, alltoall with splits, reducescatter; the
   results stay on the GPU. The inputs are written by CUDA kernels queued
   just before the call, so a missing stream synchronization shows as stale
   values.
2. A Horovod-style script, unmodified but for its import: a small MLP on
   cuda, DistributedOptimizer + broadcast_parameters, each rank a disjoint
   shard of a fixed synthetic classification set; its parameters must equal
   (within 1e-5) those of the same model trained in this process on the
   whole global batch with plain torch, and every rank must hold the same
   parameters; its accuracy must be within 1 point of the same script's on
   the CPU (one process). Accuracy and the step time, beside one process's
   on the whole global batch, are printed.
3. The torch.distributed "tandem" backend (when tandem._c10d is built):
   all_reduce on a CUDA tensor, and unmodified DistributedDataParallel of a
   model on cuda against the same model on the whole batch in one process.

Without a GPU: prints "skipped: no GPU" and exits 0, or fails with
TD_TEST_EXPECT_CUDA=N >= 1 (tests/gpu.suite), as every device test does. --device cpu runs the same checks on CPU
tensors (tests/python.suite: the CPU behaviour of the same script)."""
import os
import sys
import time

import torch

import tandem.torch as hvd

on_cpu = sys.argv[1:] == ["--device", "cpu"]
if not on_cpu and sys.argv[1:]:
    sys.exit("usage: gpu_torch_cuda.py [--device cpu]")
if not on_cpu and not torch.cuda.is_available():
    try:
        expect = int(os.environ.get("TD_TEST_EXPECT_CUDA", "0"))
    except ValueError:
        expect = 1
    if expect < 1:
        print("skipped: no GPU (torch.cuda.is_available() is False)")
        sys.exit(0)
    sys.exit("gpu_torch_cuda.py: no GPU (torch.cuda.is_available() is False) but TD_TEST_EXPECT_CUDA=%d" % expect)

hvd.init()
rank, n = hvd.rank(), hvd.size()
if on_cpu:
    dev = torch.device("cpu")
else:
    dev = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
    torch.cuda.set_device(dev)


def sync():
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)

checks = 0


def check(cond, what):
    global checks
    if not cond:
        sys.exit(f"rank {rank}: FAILED: {what}")
    checks += 1


def slow_fill(shape, dtype, value_of_index):
    """A tensor whose values a chain of kernels writes on torch's stream
    (so a collective that did not wait for the stream would read garbage)."""
    idx = torch.arange(int(torch.tensor(shape).prod()), device=dev, dtype=torch.int64)
    t = value_of_index(idx).to(dtype)
    for _ in range(20):  # more queued work before the values are final
        t = (t * 3 - t * 2).to(dtype)
    return t.reshape(shape)


def inp(r, idx):
    return ((7 * idx + 3 * r) % 11 - 5).double()


# ---- 1. collectives ----
for dtype in (torch.float32, torch.bfloat16, torch.int64):
    for count in (1, 7, 1000003):
        idx = torch.arange(count, device=dev)
        want_sum = sum(inp(r, idx) for r in range(n))
        want_max = torch.stack([inp(r, idx) for r in range(n)]).max(0).values
        x = slow_fill((count,), dtype, lambda i: inp(rank, i))
        y = hvd.allreduce(x, op=hvd.Sum)
        check(y.device == dev and y.dtype == dtype, f"allreduce result on {y.device} {y.dtype}")
        check(torch.equal(y.double(), want_sum.to(dtype).double()), f"allreduce Sum {dtype} {count}")
        x = slow_fill((count,), dtype, lambda i: inp(rank, i))
        hvd.allreduce_(x, op=hvd.Max)
        check(torch.equal(x.double(), want_max.to(dtype).double()), f"allreduce_ Max {dtype} {count}")
        if dtype.is_floating_point:
            x = slow_fill((count,), dtype, lambda i: inp(rank, i))
            y = hvd.allreduce(x, op=hvd.Average)
            tol = 1e-2 if dtype == torch.bfloat16 else 1e-6
            check(torch.allclose(y.double(), (want_sum / n).to(dtype).double(), rtol=tol, atol=tol),
                  f"allreduce Average {dtype} {count}")

root = n - 1
b = slow_fill((1001,), torch.float32, lambda i: inp(rank, i))
hvd.broadcast_(b, root_rank=root)
check(torch.equal(b, inp(root, torch.arange(1001, device=dev)).float()), "broadcast_ from the last rank")

rows = rank + 1  # a different row count per rank
g = hvd.allgather(torch.full((rows, 3), float(rank), device=dev))
want = torch.cat([torch.full((r + 1, 3), float(r), device=dev) for r in range(n)])
check(g.device == dev and torch.equal(g, want), "allgather of uneven rows")

splits = [j + 1 for j in range(n)]  # j + 1 rows to rank j
send = torch.cat([torch.full((j + 1, 2), float(100 * rank + j), device=dev) for j in range(n)])
out, recv_splits = hvd.alltoall(send, splits=splits)
want = torch.cat([torch.full((rank + 1, 2), float(100 * q + rank), device=dev) for q in range(n)])
check(out.device == dev and torch.equal(out, want), "alltoall with splits")
check(recv_splits.tolist() == [rank + 1] * n, "alltoall received splits")

rs_rows = 2 * n + 1
x = slow_fill((rs_rows, 4), torch.float32, lambda i: inp(rank, i))
y = hvd.reducescatter(x, op=hvd.Sum)
full = sum(inp(r, torch.arange(rs_rows * 4, device=dev)) for r in range(n)).float().reshape(rs_rows, 4)
q, rem = divmod(rs_rows, n)
lo = rank * q + min(rank, rem)
check(y.device == dev and torch.equal(y, full[lo:lo + q + (rank < rem)]), "reducescatter Sum")

# ---- 2. a Horovod-style training script on cuda ----
torch.manual_seed(0)
n_samples, feats, classes, per_rank = 512, 16, 4, 16
gen = torch.Generator().manual_seed(1)
data = torch.randn(n_samples, feats, generator=gen)
labels = (data[:, :classes].argmax(1) + (data[:, -1] > 1).long()) % classes


def make_model():
    torch.manual_seed(1234)
    return torch.nn.Sequential(torch.nn.Linear(feats, 32), torch.nn.Tanh(), torch.nn.Linear(32, classes))


model = make_model().to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.1 * n)  # Horovod's habit: lr scaled by size
opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
ref = make_model().to(dev)
ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1 * n)
# the same script's model on the CPU (one process, the whole global batch):
# the accuracy a user would get without a GPU
cpu_ref = make_model()
cpu_opt = torch.optim.SGD(cpu_ref.parameters(), lr=0.1 * n)
steps = n_samples // (per_rank * n)
dist_s = ref_s = 0.0
for s in range(steps):
    lo = s * per_rank * n
    t0 = time.perf_counter()
    xb, yb = data[lo + rank * per_rank: lo + (rank + 1) * per_rank].to(dev), labels[lo + rank * per_rank:
                                                                                    lo + (rank + 1) * per_rank].to(dev)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(xb), yb).backward()
    opt.step()  # gradients averaged over ranks
    sync()
    t1 = time.perf_counter()
    # the reference: one process, the whole global batch (mean loss = average of the ranks' means)
    ref_opt.zero_grad()
    xg, yg = data[lo:lo + per_rank * n].to(dev), labels[lo:lo + per_rank * n].to(dev)
    torch.nn.functional.cross_entropy(ref(xg), yg).backward()
    ref_opt.step()
    sync()
    dist_s, ref_s = dist_s + t1 - t0, ref_s + time.perf_counter() - t1
    cpu_opt.zero_grad()
    torch.nn.functional.cross_entropy(cpu_ref(data[lo:lo + per_rank * n]), labels[lo:lo + per_rank * n]).backward()
    cpu_opt.step()
step_ms, ref_step_ms = 1000 * dist_s / steps, 1000 * ref_s / steps
for (name, p), q in zip(model.named_parameters(), ref.parameters()):
    check(torch.allclose(p, q, rtol=1e-5, atol=1e-5), f"parameter {name} differs from the single-process run "
          f"by {(p - q).abs().max().item():.3g}")
    mine = p.detach().clone()
    hvd.broadcast_(mine, root_rank=0)
    check(torch.equal(mine, p.detach()), f"parameter {name} differs between ranks")
with torch.no_grad():
    acc = (model(data.to(dev)).argmax(1).cpu() == labels).float().mean().item()
    ref_acc = (ref(data.to(dev)).argmax(1).cpu() == labels).float().mean().item()
check(abs(acc - ref_acc) <= 0.01, f"accuracy {acc:.3f} vs {ref_acc:.3f} on one process")
with torch.no_grad():
    cpu_acc = (cpu_ref(data).argmax(1) == labels).float().mean().item()
check(abs(acc - cpu_acc) <= 0.01, f"accuracy {acc:.3f} on {dev} vs {cpu_acc:.3f} for the same script on the CPU")

# ---- 3. DDP through the c10d backend ----
ddp = "not built"
if hvd._c10d_error is None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("tandem")
    t = slow_fill((5,), torch.float32, lambda i: inp(rank, i))
    dist.all_reduce(t)
    check(torch.equal(t, sum(inp(r, torch.arange(5, device=dev)) for r in range(n)).float()), "c10d all_reduce")
    model = DDP(make_model().to(dev), bucket_cap_mb=0.001)  # several buckets, reduced during backward
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref = make_model().to(dev)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for s in range(steps):
        lo = s * per_rank * n
        opt.zero_grad()
        xb = data[lo + rank * per_rank: lo + (rank + 1) * per_rank].to(dev)
        yb = labels[lo + rank * per_rank: lo + (rank + 1) * per_rank].to(dev)
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
        ref_opt.zero_grad()
        xg, yg = data[lo:lo + per_rank * n].to(dev), labels[lo:lo + per_rank * n].to(dev)
        torch.nn.functional.cross_entropy(ref(xg), yg).backward()
        ref_opt.step()
    for p, q in zip(model.module.parameters(), ref.parameters()):
        check(torch.allclose(p, q, rtol=1e-5, atol=1e-5), "DDP on the tandem backend differs from one process")
    dist.destroy_process_group()
    ddp = "DDP matches one process"
print(f"gpu_torch_cuda: rank {rank} of {n} on {dev}: {checks} checks passed; Horovod-style MLP accuracy "
      f"{acc:.3f} (one process on {dev}: {ref_acc:.3f}, on the CPU: {cpu_acc:.3f}), {step_ms:.2f} ms/step on {n} "
      f"ranks against {ref_step_ms:.2f} ms/step for one process on the global batch; c10d: {ddp}", flush=True)
hvd.shutdown()
