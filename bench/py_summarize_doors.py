#!/usr/bin/env python3
"""Summarize bench/py_doors.sh output: per part (shm, tcp) and model, the
median steps/s and shortest step of each contender over the rounds, Tandem
against gloo for each door, the share of gloo's shortest step that is not
compute (1 - compute-only step / gloo's step: the gradient allreduce and what
waits on it), and
whether every contender's losses equal gloo DDP's.
    bench/py_summarize_doors.py raw.txt"""
import re
import statistics
import sys
from collections import defaultdict

runs = defaultdict(list)  # (part, model, door, backend) -> [(steps_per_s, step_ms, load)]
losses = {}
comm = defaultdict(list)  # (part, model, backend) -> [(best_ms, median_ms, load)]
buckets = defaultdict(list)  # (part, model, backend) -> [key=value dicts of door=buckets lines]
headers = []
for line in open(sys.argv[1]):
    if line.startswith("# machine"):
        headers.append(line[len("# machine:"):].strip())
    kv = dict(re.findall(r"(\w+)=(\S+)", line))
    if kv.get("door") == "buckets" and "seq_best_ms" in kv:
        buckets[(kv["part"], kv["model"], kv["backend"])].append(kv)
        continue
    if kv.get("door") == "allreduce" and "best_ms" in kv:
        comm[(kv["part"], kv["model"], kv["backend"])].append((float(kv["best_ms"]), float(kv["median_ms"]),
                                                               float(kv["load"])))
        continue
    if "steps_per_s" not in kv:
        continue
    key = (kv["part"], kv["model"], kv["door"], kv["backend"])
    runs[key].append((float(kv["steps_per_s"]), float(kv["best_step_ms"]), float(kv["load"])))
    losses.setdefault(key, [float(v) for v in kv["losses"].split(",")])

for h in headers:
    print(f"Run: {h}  ")
print()
print("| part | model | contender | runs | steps/s (median of runs) | shortest step ms (median of runs) | load | "
      "steps/s vs gloo, same door | shortest step vs gloo | losses vs DDP-gloo |")
print("|---|---|---|---|---|---|---|---|---|---|")
for part, model in sorted({(k[0], k[1]) for k in runs}):
    med, bests = {}, {}
    for door, be in (("compute", "-"), ("ddp", "gloo"), ("ddp", "tandem"), ("ddpavg", "tandem"), ("hvd", "gloo"),
                     ("hvd", "tandem")):
        rs = runs.get((part, model, door, be))
        if not rs:
            continue
        sps = statistics.median(r[0] for r in rs)
        best = statistics.median(r[1] for r in rs)
        med[(door, be)] = sps
        bests[(door, be)] = best
        ref = losses.get((part, model, "ddp", "gloo"))
        mine = losses[(part, model, door, be)]
        if door == "compute":
            eq = "(own replicas)"
        elif ref:
            d = max(abs(x - y) / abs(y) for x, y in zip(mine, ref))
            eq = "equal (9 digits)" if d == 0 else f"max rel diff {d:.1e}"
        else:
            eq = "?"
        vs = vb = ""
        gloo_door = "ddp" if door == "ddpavg" else door  # DDP with Tandem's AVG hook against plain DDP on gloo
        if be == "tandem" and (gloo_door, "gloo") in med:
            vs = f"**{sps / med[(gloo_door, 'gloo')]:.2f}x**"
            vb = f"**{bests[(gloo_door, 'gloo')] / best:.2f}x**"
        print(f"| {part} | {model} | {door}-{be} | {len(rs)} | {sps:.3f} | {best:.0f} | "
              f"{statistics.median(r[2] for r in rs):.1f} | {vs} | {vb} | {eq} |")
    if ("compute", "-") in bests and ("ddp", "gloo") in bests:
        share = 1 - bests[("compute", "-")] / bests[("ddp", "gloo")]
        print(f"| {part} | {model} | gloo DDP's shortest step not compute | | | | | | {share:.0%} | |")

if comm:
    print("\nThe gradient's allreduce alone (one tensor of the model's size, dist.all_reduce, 2 ranks):\n")
    print("| part | model | backend | runs | best ms (median of runs) | median ms (median of runs) | load | "
          "gloo / tandem (best) |")
    print("|---|---|---|---|---|---|---|---|")
    for part, model, be in sorted(comm):
        rs = comm[(part, model, be)]
        best = statistics.median(r[0] for r in rs)
        ratio = ""
        if be == "tandem" and (part, model, "gloo") in comm:
            ratio = f"**{statistics.median(r[0] for r in comm[(part, model, 'gloo')]) / best:.2f}x**"
        print(f"| {part} | {model} | {be} | {len(rs)} | {best:.0f} | {statistics.median(r[1] for r in rs):.0f} | "
              f"{statistics.median(r[2] for r in rs):.1f} | {ratio} |")

if buckets:
    print("\nThe gradient's allreduce as DDP's buckets (door buckets: one after the other, all issued at once, "
          "and the whole gradient as one tensor; medians of runs):\n")
    print("| part | model | backend | runs | buckets | way | best ms | median ms | CPU-s per pass (rank 0) | "
          "gloo / tandem (best) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for part, model, be in sorted(buckets):
        rs = buckets[(part, model, be)]
        for way in ("seq", "async", "one"):
            def med(k, rs=rs):
                return statistics.median(float(r[k]) for r in rs)
            ratio = ""
            glo = buckets.get((part, model, "gloo"))
            if be == "tandem" and glo:
                ratio = f"**{statistics.median(float(r[way + '_best_ms']) for r in glo) / med(way + '_best_ms'):.2f}x**"
            print(f"| {part} | {model} | {be} | {len(rs)} | {rs[0]['buckets']} | {way} | {med(way + '_best_ms'):.0f} | "
                  f"{med(way + '_median_ms'):.0f} | {med(way + '_cpu_s'):.3f} | {ratio} |")
