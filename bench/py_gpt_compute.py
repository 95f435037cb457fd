"""The benchmark GPT's training step with no communication at all: each
process trains its own replica on its per-rank batch. Run under
`tandemrun -np 2` beside the distributed contenders, it is the compute-only
floor of a 2-rank step on the same cores (same CPU and memory contention):
no backend can make a step shorter than this, so
    gloo_step_ms / compute_step_ms
bounds any backend's speed-up over DDP-gloo. Prints rank 0's time per step,
split into forward, backward and optimizer."""
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples", "python"))
from gpt_model import GPT, global_batch, parse  # noqa: E402

a = parse(sys.argv[1:])
torch.set_num_threads(a.threads)
torch.manual_seed(0)
r = int(os.environ.get("TANDEM_RANK", "0"))
n = int(os.environ.get("TANDEM_WORLD_SIZE", "1"))
model = GPT(256, a.layers, a.embd, a.heads, a.seq)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
fwd = bwd = stp = 0.0
for i in range(a.steps + 2):
    x, y = global_batch(i, n * a.batch, a.seq)
    x, y = x[r * a.batch:(r + 1) * a.batch], y[r * a.batch:(r + 1) * a.batch]
    t0 = time.perf_counter()
    loss = F.cross_entropy(model(x).view(-1, 256), y.view(-1))
    t1 = time.perf_counter()
    opt.zero_grad()
    loss.backward()
    t2 = time.perf_counter()
    opt.step()
    t3 = time.perf_counter()
    if i >= 2:
        fwd, bwd, stp = fwd + t1 - t0, bwd + t2 - t1, stp + t3 - t2
tot = fwd + bwd + stp
if r == 0:
    k = a.steps / 1e3
    print(f"compute-only nproc={n} tokens_per_s={n * a.batch * a.seq * a.steps / tot:.0f} step_ms={tot / k:.1f} "
          f"fwd_ms={fwd / k:.1f} bwd_ms={bwd / k:.1f} opt_ms={stp / k:.1f}", flush=True)
