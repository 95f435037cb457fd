# PyTorch peers of Tandem's ZeRO stages, with the GPT of
# ../shared/peers/torch_gpt_ddp.py (imported from there, not copied):
#   ddp   DistributedDataParallel + AdamW                      (stage 0)
#   zero  DDP + torch.distributed.optim.ZeroRedundancyOptimizer (stage 1)
#   fsdp  FullyShardedDataParallel FULL_SHARD                   (stage 3)
# Usage: python3 zero_peer.py MODE NPROC THREADS [layers embd heads seq batch steps]
# Prints one line per rank 0: mode, params, tokens_per_s, and peak RSS per
# rank (ru_maxrss, max over ranks) in MiB. Gloo over loopback, port 29731.
import importlib.util, os, resource, sys, time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("peer", os.path.join(here, "..", "..", "..", "shared", "peers", "torch_gpt_ddp.py"))
if not os.path.exists(spec.origin):
    spec = importlib.util.spec_from_file_location("peer", "/work/shared/peers/torch_gpt_ddp.py")
peer = importlib.util.module_from_spec(spec)
spec.loader.exec_module(peer)


def run(rank, mode, n, thr, L, d, h, T, B, steps):
    torch.set_num_threads(thr)
    torch.manual_seed(0)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29731", rank=rank, world_size=n)
    m = peer.GPT(256, L, d, h, T)
    nparam = sum(p.numel() for p in m.parameters())
    if mode == "fsdp":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
        m = FSDP(m, sharding_strategy=ShardingStrategy.FULL_SHARD)
        opt = torch.optim.AdamW(m.parameters(), lr=3e-4)
    elif mode == "zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        from torch.nn.parallel import DistributedDataParallel as DDP
        m = DDP(m)
        opt = ZeroRedundancyOptimizer(m.parameters(), optimizer_class=torch.optim.AdamW, lr=3e-4)
    else:
        from torch.nn.parallel import DistributedDataParallel as DDP
        m = DDP(m)
        opt = torch.optim.AdamW(m.parameters(), lr=3e-4)
    x = torch.randint(0, 256, (B, T))
    y = torch.randint(0, 256, (B, T))
    for i in range(steps + 2):
        if i == 2:
            t0 = time.perf_counter()
        loss = F.cross_entropy(m(x).view(-1, 256), y.view(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    dt = time.perf_counter() - t0
    rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0])
    dist.all_reduce(rss, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(f"torch-{mode} nproc={n} threads={thr} params={nparam} tokens_per_s={n*B*T*steps/dt:.0f} "
              f"step_ms={dt/steps*1e3:.1f} peak_rss_mib={rss.item():.0f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mode = sys.argv[1]
    a = [int(x) for x in sys.argv[2:]]
    n, thr = a[0], a[1]
    rest = a[2:] or [4, 256, 4, 128, 8, 10]
    mp.spawn(run, args=(mode, n, thr, *rest), nprocs=n)
