#!/usr/bin/env python3
"""The PyTorch peer of bench/gpu.sh: GPT-2 training throughput on one GPU.

GPT-2 124M as llm.c and nanoGPT train it (vocabulary 50,304, 12 layers, 768
channels, 12 heads, sequence 1,024, batch 16): bf16 autocast with f32
master weights, F.scaled_dot_product_attention (causal), AdamW (fused=True
on CUDA), tied token embedding and output head. --compile runs the step
through torch.compile. Tokens are a fixed random batch (throughput does not
depend on the text; the loss must still fall, which the output shows).

Output: one JSON line on stdout: impl, device, torch version, shape,
tokens_per_s (timed steps only, after --warmup steps), ms_per_step, mfu
(6N + 12 L T C flops per token, as llm.c and PaLM count them, over
--peak-tflops), peak device memory (torch.cuda.max_memory_allocated),
first and last loss.

Runs on CPU with a tiny shape for a smoke check (make no claims from it):
    python3 bench/torch_gpt2_gpu.py --device cpu --layers 2 --channels 64 --heads 4 --seq 32 \
        --batch 2 --vocab 512 --steps 3 --warmup 1 --dtype fp32
torch < 2.0 (Debian's 1.13) lacks scaled_dot_product_attention, fused AdamW
and torch.compile: the script then uses an explicit causal softmax and the
plain AdamW, and refuses --compile."""
import argparse
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(c)
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)
        self.ln2 = nn.LayerNorm(c)
        self.fc = nn.Linear(c, 4 * c)
        self.fc_proj = nn.Linear(4 * c, c)

    def attend(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch < 2.0
            att = (q @ k.transpose(-2, -1)) / math.sqrt(k.shape[-1])
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            y = att.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))

    def forward(self, x):
        x = x + self.attend(self.ln1(x))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, seq, layers, c, heads):
        super().__init__()
        self.wte = nn.Embedding(vocab, c)
        self.wpe = nn.Embedding(seq, c)
        self.blocks = nn.ModuleList(Block(c, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(c)
        self.head = nn.Linear(c, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied, as GPT-2
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--channels", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=30, help="timed steps")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first (compilation, autotuning)")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--peak-tflops", type=float, default=989.4,
                    help="dense bf16 peak of the GPU for MFU (H100/H200 SXM: 989.4)")
    ap.add_argument("--seed", type=int, default=1337)
    a = ap.parse_args()
    if a.channels % a.heads:
        sys.exit(f"--channels {a.channels} must be divisible by --heads {a.heads}")

    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        sys.exit("torch_gpt2_gpu.py: --device cuda but torch sees no GPU (torch.cuda.is_available() is False)")
    torch.manual_seed(a.seed)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    model = GPT(a.vocab, a.seq, a.layers, a.channels, a.heads).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    fused = dev.type == "cuda" and "fused" in torch.optim.AdamW.__init__.__code__.co_varnames
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1,
                            **({"fused": True} if fused else {}))
    step_model = model
    if a.compile:
        if not hasattr(torch, "compile"):
            sys.exit(f"torch_gpt2_gpu.py: --compile needs torch >= 2.0 (this is {torch.__version__})")
        step_model = torch.compile(model)

    g = torch.Generator().manual_seed(a.seed)
    data = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g).to(dev)
    x, y = data[:, :-1].contiguous(), data[:, 1:].contiguous()
    use_bf16 = a.dtype == "bf16"

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=use_bf16):
            loss = step_model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    losses = []
    for _ in range(a.warmup):
        losses.append(float(step()))
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    sync()
    t0 = time.perf_counter()
    last = None
    for _ in range(a.steps):
        last = step()
    sync()
    dt = time.perf_counter() - t0
    losses.append(float(last))
    tokens = a.batch * a.seq * a.steps
    flops_per_token = 6 * n_params + 12 * a.layers * a.seq * a.channels
    tps = tokens / dt
    out = {
        "impl": "torch-compile" if a.compile else "torch-eager",
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "dtype": a.dtype,
        "shape": {"vocab": a.vocab, "layers": a.layers, "channels": a.channels, "heads": a.heads, "seq": a.seq,
                  "batch": a.batch},
        "params": n_params,
        "steps": a.steps,
        "tokens_per_s": round(tps, 1),
        "ms_per_step": round(1000 * dt / a.steps, 2),
        "mfu": round(tps * flops_per_token / (a.peak_tflops * 1e12), 4),
        "peak_mem_mib": round(torch.cuda.max_memory_allocated(dev) / 2**20, 1) if dev.type == "cuda" else None,
        "loss_first": round(losses[0], 4),
        "loss_last": round(losses[-1], 4),
        "fused_adamw": fused,
    }
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
