"""Allreduce latency/bandwidth from Python through tandem.torch (in place,
float32 CPU tensors, blocking allreduce_ as a Horovod script calls it).
Prints lines in tandem-bench's layout: size_bytes time_us algbw busbw, then
rank 0's user+sys CPU time per call (steadier than wall time on a loaded
machine)."""
import resource
import sys
import time

import torch

import tandem.torch as hvd

hvd.init()
n = hvd.size()
for size in [int(s) for s in sys.argv[1:]] or [4096, 64 << 20]:
    t = torch.ones(size // 4)
    iters = max(20, min(20000, (1 << 30) // max(size, 1) // 8))  # 20 at 64 MiB, as tandem-bench -n 20
    for _ in range(max(2, iters // 10)):
        hvd.allreduce_(t, op=hvd.Sum)
    hvd.barrier()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    for _ in range(iters):
        hvd.allreduce_(t, op=hvd.Sum)
    dt = (time.perf_counter() - t0) / iters
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime) / iters
    if hvd.rank() == 0:
        algbw = size / dt / 1e9
        print(f"py {size:12d} {dt * 1e6:10.2f} us algbw {algbw:8.3f} busbw {algbw * 2 * (n - 1) / n:8.3f} "
              f"iters {iters} cpu_us {cpu * 1e6:.2f}", flush=True)
hvd.shutdown()
