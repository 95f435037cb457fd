#!/usr/bin/env python3
"""Medians and ratios of bench/python.sh's raw output (stdin or a file)."""
import re
import statistics
import sys

rows = {}
loads = []
for line in (open(sys.argv[1]) if len(sys.argv) > 1 else sys.stdin):
    m = re.match(r"# round \d+, load ([\d.]+)", line)
    if m:
        loads.append(float(m.group(1)))
    for key, pat in (("hvd", r"^hvd tandem-hvd .*step_ms=([\d.]+)"), ("ddp-tandem", r"^ddp-tandem ddp-tandem .*step_ms=([\d.]+)"),
                     ("ddp-gloo", r"^ddp-gloo ddp-gloo .*step_ms=([\d.]+)"), ("compute", r"^compute-only .*step_ms=([\d.]+)")):
        m = re.match(pat, line)
        if m:
            rows.setdefault(key, []).append(float(m.group(1)))
    parts = line.split()
    if line.startswith("py-4K-nojoin"):  # TANDEM_JOIN=0: no join descriptor per call
        rows.setdefault("py4k-nojoin", []).append(float(parts[3]))
    elif line.startswith("py-4K"):
        rows.setdefault("py4k", []).append(float(parts[3]))
    if line.startswith("py-64M"):
        rows.setdefault("py64m", []).append(float(parts[8]))
    if line.startswith("c-4K") or line.startswith("c-64M"):
        nums = [float(x) for x in parts[1:] if re.fullmatch(r"[\d.]+", x)]
        # tandem-bench columns: size count dtype redop time_us algbw busbw wrong
        rows.setdefault(parts[0], []).append(nums[2] if parts[0] == "c-4K" else nums[4])
med = {k: statistics.median(v) for k, v in rows.items()}
print(f"rounds: {len(loads)}, load average at each round's start: {loads}")
for k in ("hvd", "ddp-tandem", "ddp-gloo", "compute"):
    if k in rows:
        print(f"{k:11s} step_ms per round {rows[k]} median {med[k]:.1f}")
if "ddp-gloo" in med:
    g = med["ddp-gloo"]
    for k in ("hvd", "ddp-tandem", "compute"):
        if k in med:
            print(f"speed-up over DDP-gloo, {k}: {g / med[k]:.3f}x")
    if "compute" in med:
        print(f"communication + overhead per step: gloo {g - med['compute']:.1f} ms; "
              + ", ".join(f"{k} {med[k] - med['compute']:.1f} ms" for k in ("hvd", "ddp-tandem") if k in med))
for k, what in (("c-4K", "C 4 KiB us"), ("py4k", "Python 4 KiB us"),
                ("py4k-nojoin", "Python 4 KiB us, TANDEM_JOIN=0"), ("c-64M", "C 64 MiB busbw GB/s"),
                ("py64m", "Python 64 MiB busbw GB/s")):
    if k in rows:
        print(f"{what}: per round {rows[k]} median {med[k]}")
if "c-4K" in rows and "py4k" in rows:
    d = [p - c for p, c in zip(rows["py4k"], rows["c-4K"])]
    print(f"Python - C at 4 KiB, per round (same round): {[round(x, 2) for x in d]} median {statistics.median(d):.2f} us")
if "py4k-nojoin" in rows and "py4k" in rows:
    d = [p - q for p, q in zip(rows["py4k"], rows["py4k-nojoin"])]
    print(f"join descriptor at 4 KiB (Python - Python TANDEM_JOIN=0, same round): {[round(x, 2) for x in d]} "
          f"median {statistics.median(d):.2f} us")
if "c-64M" in rows and "py64m" in rows:
    q = [p / c for p, c in zip(rows["py64m"], rows["c-64M"])]
    print(f"Python / C busbw at 64 MiB, per round: {[round(x, 3) for x in q]} median {statistics.median(q):.3f}")
