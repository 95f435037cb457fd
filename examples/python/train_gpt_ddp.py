"""DDP-style training of the benchmark GPT on Tandem's torch.distributed backend.

    PYTHONPATH=build/python OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
        build/bin/tandemrun -np 2 /usr/bin/python3 examples/python/train_gpt_ddp.py

The plain DDP script says dist.init_process_group("gloo"); here the backend is
"tandem", which `import tandem.torch` registers (the one added line; under
tandemrun the env:// rendezvous variables are filled in). --backend gloo runs
the very same script on gloo (under tandemrun or torchrun).
"""
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import tandem.torch  # noqa: F401  registers the "tandem" backend
from gpt_model import GPT, global_batch, parse

a = parse(sys.argv[1:])
dist.init_process_group(a.backend)
torch.set_num_threads(a.threads)
torch.manual_seed(0)
r, n = dist.get_rank(), dist.get_world_size()
model = GPT(256, a.layers, a.embd, a.heads, a.seq)
nparam = sum(p.numel() for p in model.parameters())
model = DDP(model)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
losses = []
for i in range(a.steps + 2):
    if i == 2:
        t0 = time.perf_counter()
    x, y = global_batch(i, n * a.batch, a.seq)
    x, y = x[r * a.batch:(r + 1) * a.batch], y[r * a.batch:(r + 1) * a.batch]
    loss = F.cross_entropy(model(x).view(-1, 256), y.view(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.detach())
dt = time.perf_counter() - t0
mean = torch.stack(losses)
dist.all_reduce(mean)
mean /= n
if r == 0:
    print(f"ddp-{a.backend} nproc={n} threads={a.threads} params={nparam} "
          f"tokens_per_s={n * a.batch * a.seq * a.steps / dt:.0f} step_ms={dt / a.steps * 1e3:.1f}", flush=True)
    print("losses " + " ".join(f"{v:.9g}" for v in mean.tolist()), flush=True)
dist.destroy_process_group()
