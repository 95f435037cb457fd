"""Horovod-style training of the benchmark GPT on Tandem.

    PYTHONPATH=build/python OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
        build/bin/tandemrun -np 2 /usr/bin/python3 examples/python/train_gpt_hvd.py

The one line that differs from the plain Horovod script is the import:
    import horovod.torch as hvd   ->   import tandem.torch as hvd
"""
import sys
import time

import torch
import torch.nn.functional as F

import tandem.torch as hvd
from gpt_model import GPT, global_batch, parse

a = parse(sys.argv[1:])
hvd.init()
torch.set_num_threads(a.threads)
torch.manual_seed(0)
model = GPT(256, a.layers, a.embd, a.heads, a.seq)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(opt, root_rank=0)
r, n = hvd.rank(), hvd.size()
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
mean = hvd.allreduce(torch.stack(losses), op=hvd.Average)  # the whole batch's loss per step
if r == 0:
    print(f"tandem-hvd nproc={n} threads={a.threads} params={sum(p.numel() for p in model.parameters())} "
          f"tokens_per_s={n * a.batch * a.seq * a.steps / dt:.0f} step_ms={dt / a.steps * 1e3:.1f}", flush=True)
    print("losses " + " ".join(f"{v:.9g}" for v in mean.tolist()), flush=True)
hvd.shutdown()
