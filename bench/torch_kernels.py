#!/usr/bin/env python3
"""PyTorch's own kernels at the shape of bench/cuda_kernels.sh (GPT-2 124M:
B=16, T=1024, C=768, 12 heads, V=50304), timed the same way and printed as
the same table, so one GPU run shows each Tandem kernel beside the library
kernel a PyTorch user gets for the same work.

The rows that have a Tandem twin use its byte and FLOP counts (each operand
read once, each output written once; causal attention counts half of QK^T
and PV; backward 2.5x forward), so GB/s and TFLOP/s compare directly:
  - scaled_dot_product_attention forward and forward+backward minus forward
    ("backward"), once per backend torch offers here (flash, cuDNN,
    memory-efficient; a backend that refuses the shape prints why);
  - layer_norm forward, backward; cross_entropy forward+backward over the
    (N, V) logits (PyTorch does not write its gradient in place: its row
    moves the logits, the gradient and the saved softmax);
  - embedding backward (the token table's gradient); fused AdamW over the
    124M parameters; the lm head's product.
Meant for scripts/gpu-check through bench/cuda_kernels.sh, after Tandem's
table. Needs torch with CUDA; `--device cpu --small` runs a tiny shape on
the CPU to check the script itself (no figures from it).
"""
import argparse
import sys

import torch
import torch.nn.functional as F


# The memory bandwidth bound (GB/s) of the "of BW" column, from the GPU's name
# (NVIDIA's datasheets); the same table as tests/cuda/test_cuda_layers.c's
# bench_hbm_gbs, so both tables of a run divide by the same bound.
HBM_GBS = [("H200", None, 4800.0, "H200: 4.8 TB/s"), ("H100", "PCIe", 2000.0, "H100 PCIe: 2.0 TB/s"),
           ("H100", "NVL", 3900.0, "H100 NVL: 3.9 TB/s"), ("H100", None, 3350.0, "H100 SXM: 3.35 TB/s"),
           ("A100", "80GB", 2039.0, "A100 80GB: 2.039 TB/s"), ("A100", None, 1555.0, "A100 40GB: 1.555 TB/s")]


def hbm_gbs(name):
    for part, also, gbs, label in HBM_GBS:
        if part in name and (also is None or also in name):
            return gbs, label
    return 3350.0, "not a GPU this table knows: the H100 SXM's 3.35 TB/s"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="a tiny shape (checks the script)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        print("bench: torch kernels: did not run: torch has no CUDA device here")
        return 1
    B, T, C, NH, V, L = (1, 33, 48, 2, 97, 1) if a.small else (16, 1024, 768, 12, 50304, 12)
    dev, dt = torch.device(a.device), (torch.bfloat16 if a.dtype == "bf16" else torch.float32)
    es, N, HS = (2 if dt == torch.bfloat16 else 4), B * T, C // NH
    peak_tf = 989.0 if dt == torch.bfloat16 else 67.0
    cuda = dev.type == "cuda"
    gpu_name = torch.cuda.get_device_name(dev) if cuda else "CPU (" + dev.type + ")"
    bw_gbs, bw_label = hbm_gbs(gpu_name)

    def timed(fn):
        for _ in range(2):
            fn()
        if cuda:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            e0.record()
            for _ in range(a.iters):
                fn()
            e1.record()
            e1.synchronize()
            return e0.elapsed_time(e1) * 1000.0 / a.iters
        import time
        t0 = time.perf_counter()
        for _ in range(a.iters):
            fn()
        return (time.perf_counter() - t0) * 1e6 / a.iters

    def row(label, us, nbytes, flops):
        gbs, tf = nbytes / us / 1e3, flops / us / 1e6
        print("| %-30s | %-4s | %10.1f | %8.1f | %5.1f%% | %8.2f | %5.1f%% |"
              % (label, a.dtype, us, gbs, 100 * gbs / bw_gbs, tf, 100 * tf / peak_tf))

    print("\nPyTorch %s kernels, %s shape: B=%d T=%d C=%d NH=%d V=%d, %s, mean of %d runs after 2 warm-up runs"
          % (torch.__version__, "small" if a.small else "GPT-2 124M", B, T, C, NH, V, a.dtype, a.iters))
    print("GPU %s; \"of BW\" against %s" % (gpu_name, bw_label))
    print("| %-30s | %-4s | %10s | %8s | %6s | %8s | %6s |" % ("kernel", "type", "time (us)", "GB/s", "of BW",
                                                               "TFLOP/s", "of peak"))
    print("|---|---|---|---|---|---|---|")
    nc = N * C
    g = torch.Generator(device=dev).manual_seed(1)

    def randn(*shape, grad=False):
        return torch.randn(*shape, device=dev, dtype=dt, generator=g).requires_grad_(grad)

    # attention: q, k, v as (B, NH, T, HS) views of one (B, T, 3C) tensor, as a GPT makes them
    qkv = randn(B, T, 3 * C, grad=True)
    att_flops = 4.0 * B * NH * T * T * HS / 2
    att_fwd_bytes, att_bwd_bytes = (N * 3 * C + nc) * es, (N * 3 * C * 3 + nc * 2) * es
    dy = randn(B, NH, T, HS)

    def heads():
        q, k, v = qkv.split(C, dim=2)
        return [z.view(B, T, NH, HS).transpose(1, 2) for z in (q, k, v)]

    def sdpa(q, k, v):
        if hasattr(F, "scaled_dot_product_attention"):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        # torch < 2.0 (Debian's 1.13, the script check): the explicit causal softmax
        s = (q @ k.transpose(-1, -2)) / HS ** 0.5
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=dev).triu(1), float("-inf"))
        return torch.softmax(s, dim=-1) @ v

    backends = []
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        for name in ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION"):
            if hasattr(SDPBackend, name):
                backends.append((name.split("_")[0].lower(), lambda n=name: sdpa_kernel(getattr(SDPBackend, n))))
    except ImportError:
        import contextlib
        backends.append(("default", contextlib.nullcontext))
    for name, ctx in backends:
        try:
            with ctx():
                fwd = timed(lambda: sdpa(*heads()))

                def fwd_bwd():
                    y = sdpa(*heads())
                    y.backward(dy)
                both = timed(fwd_bwd)
            row("sdpa %s forward" % name, fwd, att_fwd_bytes, att_flops)
            row("sdpa %s backward" % name, max(both - fwd, 1e-3), att_bwd_bytes, 2.5 * att_flops)
        except RuntimeError as e:
            print("| sdpa %-25s | %-4s | refused: %s |" % (name, a.dtype, str(e).splitlines()[0][:80]))
    qkv.grad = None

    x = randn(N, C, grad=True)
    w, b = randn(C, grad=True), randn(C, grad=True)
    gy = randn(N, C)
    row("layernorm forward", timed(lambda: F.layer_norm(x, (C,), w, b)), nc * es * 2, 0)
    ln_fwd = timed(lambda: F.layer_norm(x, (C,), w, b))
    ln_both = timed(lambda: F.layer_norm(x, (C,), w, b).backward(gy))
    row("layernorm backward", max(ln_both - ln_fwd, 1e-3), nc * es * 4, 0)

    logits = randn(N, V, grad=True)
    tgt = torch.randint(0, V, (N,), device=dev, generator=g)
    xent = timed(lambda: F.cross_entropy(logits, tgt).backward())
    row("cross entropy fwd+bwd", xent, N * V * es * 3.0, 0)
    logits.grad = None
    del logits

    wte = torch.randn(V, C, device=dev, dtype=dt, generator=g)
    wte_g = wte.clone().requires_grad_(True)
    tok = torch.randint(0, V, (B, T), device=dev, generator=g)
    gemb = randn(B, T, C)
    emb_fwd = timed(lambda: F.embedding(tok, wte_g))
    emb_both = timed(lambda: F.embedding(tok, wte_g).backward(gemb))
    row("embedding backward", max(emb_both - emb_fwd, 1e-3), nc * es * 2, 0)
    wte_g.grad = None

    xh = randn(N, C)
    row("matmul fwd lm head (C->V)", timed(lambda: xh @ wte.t()), (nc + N * V + V * C) * es, 2.0 * nc * V)

    np_ = V * C + T * C + L * 12 * C * C
    params = [torch.zeros(np_, device=dev, dtype=torch.float32, requires_grad=True)]
    params[0].grad = torch.zeros(np_, device=dev, dtype=torch.float32)
    try:
        opt = torch.optim.AdamW(params, lr=1e-4, fused=cuda)
        row("adamw (fused, f32 params)", timed(opt.step), np_ * 28.0, np_ * 12.0)
    except (TypeError, RuntimeError) as e:
        print("| adamw (fused)                  | f32  | refused: %s |" % str(e).splitlines()[0][:80])
    print("(%d parameters in the optimizer row)" % np_)
    return 0


if __name__ == "__main__":
    sys.exit(main())
