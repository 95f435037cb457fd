"""The PyTorch doors where communication decides the speed (bench/py_doors.sh).

A 100.7M-parameter MLP (24 Linear(2048, 2048) layers with ReLU) trained with
SGD on 4 samples per rank: a step computes little (about 2.4 GFLOP per rank)
and allreduces 403 MB of gradients, so the gradient allreduce is most of a
gloo step. One run is one contender, started by tandemrun (each rank one
process, one thread):

  --door ddp --backend tandem|gloo   torch's DistributedDataParallel over
                                     init_process_group(backend), the same
                                     bucketing (25 MB, gradients as bucket views)
  --door ddpavg --backend tandem     the same DDP with tandem.torch.ddp_avg_hook
                                     registered: buckets allreduced with AVG
                                     (divided inside the ring) instead of
                                     DDP's division of every gradient first
  --door hvd --backend tandem        tandem.torch.DistributedOptimizer
                                     (Horovod's API: allreduce per gradient
                                     as backward produces it, averaged)
  --door hvd --backend gloo          the same Horovod-style pattern on
                                     torch.distributed gloo: an async
                                     all_reduce per gradient from a hook,
                                     waited for before the optimizer step
  --door compute                     no communication: each rank trains its
                                     own replica (the floor of a step)
  --door allreduce --backend B       the communication alone: the whole
                                     gradient (one tensor) through
                                     dist.all_reduce, timed
  --door buckets --backend B         the communication alone as DDP cuts it:
                                     the model's DDP buckets (their sizes from
                                     torch's own bucket assignment, 1 MB first
                                     then 25 MB), allreduced one after the
                                     other (each waited for) and all issued
                                     at once then waited for (as DDP issues
                                     them when backward outruns the wire),
                                     beside the whole gradient as one tensor;
                                     per way the best and median ms and the
                                     process's CPU seconds per pass

Prints one line on rank 0: door, backend, steps/s, ms per step (after 2
warm-up steps), the shortest step, and the rank-averaged loss of every step, which every
contender must reproduce (the same seed, data and averaging).

--timeline: one more step after the timed ones (not in the figures), run
under torch.profiler; rank 0 prints its backward's wall time and, in start
order, every pass of aten::fill_, add_, div_ or mul_ that took 1 ms or more
and every c10d::allreduce_ issue, as name@start+duration (ms from the
backward's start), and the wait: the backward's end minus the end of the
last of them. This is how plain DDP and DDP with ddp_avg_hook were told
apart: the only pass one has and the other lacks is the reducer's div_.
With --door allreduce, --timeline instead makes every rank print, per timed
call, wall ms / its process's CPU ms (all threads) / the whole machine's
busy and total clock ticks (/proc/stat, 100 a second per core) / its
involuntary context switches: where a slow call's time went (this rank
computing, waiting for CPU behind other work, or the machine idle while
both ranks wait on the wire)."""
import argparse
import os
import resource
import time

import torch
import torch.distributed as dist

import tandem.torch as hvd

p = argparse.ArgumentParser()
p.add_argument("--door", choices=["ddp", "ddpavg", "hvd", "compute", "allreduce", "buckets"], required=True)
p.add_argument("--backend", choices=["tandem", "gloo"], default="tandem")
p.add_argument("--steps", type=int, default=8)
p.add_argument("--layers", type=int, default=24)
p.add_argument("--width", type=int, default=2048)
p.add_argument("--batch", type=int, default=4)
p.add_argument("--model", choices=["mlp", "embed"], default="mlp")
p.add_argument("--rows", type=int, default=786432)  # embed: 786432 x 128 = 100.7M parameters
p.add_argument("--timeline", action="store_true",
               help="after the timed steps, one more step under torch.profiler: rank 0 prints when its "
                    "gradient passes (fill_, add_, div_) and the allreduce issues ran inside backward")
a = p.parse_args()
torch.set_num_threads(1)


def machine_jiffies():
    """The whole machine's busy and total CPU time so far, in clock ticks
    (/proc/stat's first line: idle and iowait are not busy)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v) - v[3] - v[4], sum(v)


if a.door == "compute":
    r, n = int(os.environ.get("TANDEM_RANK", "0")), int(os.environ.get("TANDEM_WORLD_SIZE", "1"))
elif a.door == "hvd" and a.backend == "tandem":
    hvd.init()
    r, n = hvd.rank(), hvd.size()
else:
    dist.init_process_group(a.backend)
    r, n = dist.get_rank(), dist.get_world_size()

if a.door == "allreduce":
    # The communication alone: the model's gradient (as one 403 MB float32
    # tensor) averaged over the ranks, a.steps times after 2 warm-ups, through
    # torch.distributed (tandem or gloo). The seconds per allreduce, best and
    # median, and the bus bandwidth of the best (2 (n-1)/n bytes per rank).
    numel = a.layers * (a.width * a.width + a.width) if a.model == "mlp" else a.rows * 128 + 128 * a.width + a.width
    t = torch.full((numel,), float(r + 1))
    times, calls = [], []
    for i in range(a.steps + 2):
        if a.timeline:
            u0, m0 = resource.getrusage(resource.RUSAGE_SELF), machine_jiffies()
        t0 = time.perf_counter()
        dist.all_reduce(t)
        times.append(time.perf_counter() - t0)
        if a.timeline:
            u1, m1 = resource.getrusage(resource.RUSAGE_SELF), machine_jiffies()
            calls.append(f"{times[-1] * 1e3:.0f}/{(u1.ru_utime + u1.ru_stime - u0.ru_utime - u0.ru_stime) * 1e3:.0f}"
                         f"/{m1[0] - m0[0]}/{m1[1] - m0[1]}/{u1.ru_nivcsw - u0.ru_nivcsw}")
        t.div_(n)
    if a.timeline:  # every rank: its own process's figures (see the module's docstring)
        print(f"calls rank={r} backend={a.backend} wall/cpu/machine_busy/machine_total/nivcsw_per_call="
              f"{','.join(calls[2:])}", flush=True)
    assert abs(t[0].item() - (n + 1) / 2) < 1e-3 and abs(t[-1].item() - (n + 1) / 2) < 1e-3, t[0].item()
    times = sorted(times[2:])
    if r == 0:
        print(f"model={a.model} door=allreduce backend={a.backend} nproc={n} params={numel} "
              f"best_ms={times[0] * 1e3:.1f} median_ms={times[len(times) // 2] * 1e3:.1f} "
              f"busbw_GBps={2 * (n - 1) / n * numel * 4 / times[0] / 1e9:.2f}", flush=True)
    dist.destroy_process_group()
    raise SystemExit(0)

torch.manual_seed(0)


def buckets_alone(params):
    """--door buckets: DDP's buckets of `params`, allreduced three ways."""
    import resource
    idx, _ = dist._compute_bucket_assignment_by_size(params, [dist._DEFAULT_FIRST_BUCKET_BYTES, 25 << 20], [False] * len(params))
    sizes = [sum(params[i].numel() for i in b) for b in reversed(idx)]  # DDP's order: the last layers' first
    bufs = [torch.full((k,), float(r + 1)) for k in sizes]
    whole = torch.full((sum(sizes),), float(r + 1))

    def seq():
        for b in bufs:
            dist.all_reduce(b)

    def concurrent():
        for w in [dist.all_reduce(b, async_op=True) for b in bufs]:
            w.wait()

    out = {}
    for name, fn in (("seq", seq), ("async", concurrent), ("one", lambda: dist.all_reduce(whole))):
        times, cpu = [], []
        for i in range(a.steps + 2):
            dist.barrier()
            u0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            fn()
            t1, u1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
            times.append(t1 - t0)
            cpu.append(u1.ru_utime - u0.ru_utime + u1.ru_stime - u0.ru_stime)
        times, cpu = sorted(times[2:]), sorted(cpu[2:])
        out[name] = (times[0] * 1e3, times[len(times) // 2] * 1e3, cpu[len(cpu) // 2])
    # Sums of sums: the first pass gives n (n + 1) / 2, each later one multiplies by n (exact in float32 here).
    passes = a.steps + 2
    for b, k in [(b, 2 * passes) for b in bufs] + [(whole, passes)]:
        want = n * (n + 1) / 2 * n ** (k - 1)
        assert b[0].item() == want and b[-1].item() == want, (b[0].item(), b[-1].item(), want)
    if r == 0:
        print(f"model={a.model} door=buckets backend={a.backend} nproc={n} params={sum(sizes)} buckets={len(sizes)} "
              f"largest_bucket={max(sizes)} "
              + " ".join(f"{k}_best_ms={v[0]:.1f} {k}_median_ms={v[1]:.1f} {k}_cpu_s={v[2]:.3f}" for k, v in out.items()),
              flush=True)
    dist.barrier()
    dist.destroy_process_group()
    raise SystemExit(0)


class Embed(torch.nn.Module):
    """A dense embedding table (its gradient is a dense tensor of the whole
    table, as torch's default sparse=False gives) pooled into a small head:
    the parameters and their allreduce are large, the arithmetic tiny."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(a.rows, 128)
        self.head = torch.nn.Linear(128, a.width)

    def forward(self, ids):
        return self.head(self.table(ids).mean(1))


if a.model == "mlp":
    layers = []
    for _ in range(a.layers):
        layers += [torch.nn.Linear(a.width, a.width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1])
else:
    model = Embed()
nparam = sum(q.numel() for q in model.parameters())
if a.door == "buckets":
    buckets_alone(list(model.parameters()))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
pending = []
if a.door in ("ddp", "ddpavg"):
    model = torch.nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True)
    if a.door == "ddpavg":
        model.register_comm_hook(None, hvd.ddp_avg_hook)
elif a.door == "hvd" and a.backend == "tandem":
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
elif a.door == "hvd":  # Horovod's pattern on gloo: one async allreduce per gradient once accumulated
    accumulators = []  # Horovod's own hook point: the gradient accumulator of each parameter

    def hook_for(q):
        def hook(*_):
            pending.append((dist.all_reduce(q.grad, async_op=True), q.grad))
        return hook
    for q in model.parameters():
        acc = q.expand_as(q).grad_fn.next_functions[0][0]
        acc.register_hook(hook_for(q))
        accumulators.append(acc)


def batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    if a.model == "mlp":
        x = torch.randn(n * a.batch, a.width, generator=g)
    else:
        x = torch.randint(0, a.rows, (n * a.batch, 16), generator=g)
    y = torch.randn(n * a.batch, a.width, generator=g)
    return x[r * a.batch:(r + 1) * a.batch], y[r * a.batch:(r + 1) * a.batch]


def backward_timeline(loss):
    """loss.backward() under torch.profiler; the timeline line of --timeline on rank 0."""
    with torch.profiler.profile() as prof:
        tb = time.perf_counter()
        loss.backward()
        wall = time.perf_counter() - tb
    names = ("aten::fill_", "aten::add_", "aten::div_", "aten::mul_", "c10d::allreduce_")
    events = sorted((e for e in prof.events() if e.name in names), key=lambda e: e.time_range.start)
    if r != 0 or not events:
        return
    start = min(e.time_range.start for e in prof.events())  # the profiler's first event: backward's start
    shown = [e for e in events if e.name == "c10d::allreduce_" or e.time_range.elapsed_us() >= 1000]
    last_end = max(e.time_range.end for e in shown) if shown else start
    print(f"model={a.model} door={a.door} backend={a.backend if a.door != 'compute' else '-'} timeline: backward_ms={wall * 1e3:.1f} "
          + " ".join(f"{e.name.split('::')[1]}@{(e.time_range.start - start) / 1e3:.0f}"
                     f"+{e.time_range.elapsed_us() / 1e3:.0f}" for e in shown)
          + f" wait_ms={max(0.0, wall * 1e3 - (last_end - start) / 1e3):.0f}", flush=True)


losses, step_s = [], []
for i in range(a.steps + 2 + a.timeline):
    if i == 2:
        t0 = time.perf_counter()
    if i == a.steps + 2:  # --timeline's extra step, after the timed ones
        dt = time.perf_counter() - t0
    ts = time.perf_counter()
    x, y = batch(i)
    opt.zero_grad(set_to_none=False)  # gradients stay (bucket views for DDP and tandem.torch), zeroed in place
    loss = torch.nn.functional.mse_loss(model(x), y)
    if i == a.steps + 2:
        backward_timeline(loss)
    else:
        loss.backward()
    for work, grad in pending:
        work.wait()
        grad.div_(n)
    pending.clear()
    opt.step()
    losses.append(loss.detach())
    step_s.append(time.perf_counter() - ts)
if not a.timeline:
    dt = time.perf_counter() - t0
losses, step_s = losses[:a.steps + 2], step_s[:a.steps + 2]
# The shortest step after warm-up: on a shared machine the steps that other
# processes' load did not stretch (a step ends together on both ranks: its
# time includes waiting for the slower one).
best = min(step_s[2:])
mean = torch.stack(losses)
if a.door == "compute":
    pass  # each rank's own replica: its own loss
elif a.door == "hvd" and a.backend == "tandem":
    mean = hvd.allreduce(mean, op=hvd.Average)
else:
    dist.all_reduce(mean)
    mean /= n
if r == 0:
    print(f"model={a.model} door={a.door} backend={a.backend if a.door != 'compute' else '-'} nproc={n} params={nparam} "
          f"steps_per_s={a.steps / dt:.4f} step_ms={dt / a.steps * 1e3:.1f} best_step_ms={best * 1e3:.1f} "
          f"losses={','.join(f'{v:.9g}' for v in mean.tolist())}", flush=True)
if a.door == "hvd" and a.backend == "tandem":
    hvd.shutdown()
elif a.door != "compute":
    dist.destroy_process_group()
