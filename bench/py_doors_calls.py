#!/usr/bin/env python3
"""Summarize bench/py_doors_ab.sh output: per run (label and pair) and
backend, the allreduce-alone door's best and median ms, gloo / Tandem of the
median ms where both ran, and from --timeline's per-call figures (every
rank): wall ms (median and range), each rank's process CPU ms per call, the
CPU the job got (both ranks' CPU / wall, in cores), the machine's busy cores
(/proc/stat over the call) and so the cores others took, and involuntary
context switches per call. Then per label the median of the runs.
    bench/py_doors_calls.py RAW"""
import re
import statistics as st
import sys

door, calls, order = {}, {}, []
label, cores = None, 2
for line in open(sys.argv[1]):
    m = re.match(r"# machine: (\d+) cores", line)
    if m:
        cores = int(m.group(1))  # /proc/stat's ticks are those of every core
    m = re.match(r"# (.+) pair (\d+)$", line.strip())
    if m:
        label = (m.group(1), int(m.group(2)))
        continue
    kv = dict(re.findall(r"(\w+)=(\S+)", line))
    if kv.get("door") == "allreduce" and "median_ms" in kv:
        door[(label, kv["backend"])] = (float(kv["best_ms"]), float(kv["median_ms"]), float(kv["load"]))
        if (label, kv["backend"]) not in order:
            order.append((label, kv["backend"]))
    elif " calls rank=" in line:
        per = [tuple(float(x) for x in c.split("/")) for c in kv["nivcsw_per_call"].split(",")]
        calls.setdefault((label, kv["backend"]), {})[int(kv["rank"])] = per

print("| run | backend | load | best / median ms | gloo / tandem (median ms) | wall ms median [min-max] | "
      "CPU ms per call r0 / r1 | job's cores | machine busy cores | others' cores | invol. switches r0 / r1 |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
per_label = {}
for key in order:
    (lab, pair), be = key
    best, med, load = door[key]
    g = door.get(((lab, pair), "gloo"))
    ratio = f"{g[1] / med:.2f}x" if g and be == "tandem" else ""
    if be == "tandem":
        per_label.setdefault(lab, []).append((med, g[1] / med if g else None))
    c = calls.get(key, {})
    extra = "| | | | | |"
    if 0 in c and 1 in c:
        n = min(len(c[0]), len(c[1]))
        wall = [c[0][i][0] for i in range(n)]
        job = [(c[0][i][1] + c[1][i][1]) / c[0][i][0] for i in range(n)]
        busy = [cores * c[0][i][2] / c[0][i][3] for i in range(n) if c[0][i][3]]
        extra = (f"| {st.median(wall):.0f} [{min(wall):.0f}-{max(wall):.0f}] | "
                 f"{st.median(x[1] for x in c[0][:n]):.0f} / {st.median(x[1] for x in c[1][:n]):.0f} | "
                 f"{st.median(job):.2f} | {st.median(busy):.2f} | {st.median(busy) - st.median(job):.2f} | "
                 f"{st.median(x[4] for x in c[0][:n]):.0f} / {st.median(x[4] for x in c[1][:n]):.0f} |")
    print(f"| {lab} #{pair} | {be} | {load:.0f} | {best:.0f} / {med:.0f} | {ratio} {extra}")
print()
for lab, v in per_label.items():
    meds = [x[0] for x in v]
    rs = [x[1] for x in v if x[1]]
    print(f"- {lab}: {len(v)} runs, Tandem's median ms {st.median(meds):.0f} [{min(meds):.0f}-{max(meds):.0f}]"
          + (f", gloo / Tandem {st.median(rs):.2f}x [{min(rs):.2f}-{max(rs):.2f}]" if rs else ""))
