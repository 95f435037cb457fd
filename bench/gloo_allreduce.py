# gloo's allreduce for one rank of a job started by someone else (torchrun's
# variables: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; GLOO_SOCKET_IFNAME
# picks the interface), so that its ranks can sit on different (namespace)
# hosts. Same sizes, iteration counts and output as
# /work/shared/peers/torch_allreduce.py (which spawns every rank on
# 127.0.0.1): size_bytes time_us algbw_GBs busbw_GBs, one row per size, the
# time the slowest rank's mean.
#   RANK=0 WORLD_SIZE=2 MASTER_ADDR=... MASTER_PORT=... python3 gloo_allreduce.py [BYTES...]
import os
import sys
import time

import torch
import torch.distributed as dist

torch.set_num_threads(1)
rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                        rank=rank, world_size=n)
sizes = [int(s) for s in sys.argv[1:]] or [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20]
if rank == 0:
    print(f"# gloo n={n}\n# size_bytes time_us algbw_GBs busbw_GBs", flush=True)
for size in sizes:
    t = torch.ones(max(1, size // 4), dtype=torch.float32)
    iters = max(5, min(1000, (256 << 20) // (size + 1) // 4))
    for _ in range(3):
        dist.all_reduce(t)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t)
    dt = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
    dist.all_reduce(dt, op=dist.ReduceOp.MAX)
    dt = dt.item()
    if rank == 0:
        print(f"{size} {dt*1e6:.2f} {size/dt/1e9:.3f} {size*2*(n-1)/n/dt/1e9:.3f}", flush=True)
dist.destroy_process_group()
