#!/usr/bin/env bash
# Where a GPU training step's time goes (issue 18): Nsight Compute (ncu)
# times every kernel of a few train-gpt --device cuda steps at GPT-2 124M's
# shape (bench/gpu.sh's: 12 layers, 768 channels, 12 heads, sequence 1,024,
# batch 16, bf16, vocabulary 50,304), and the kernels are summed by name per
# step. ncu runs the kernels one at a time, so the sum is the step's kernel
# time without launch gaps, memsets or host waits: the step's measured time
# (bench/gpu.sh) minus this sum is what those cost. Only the kernel duration
# is read (gpu__time_duration.sum: no replay), with --clock-control none
# (the device tool's METHOD.md: leave the clocks as they are).
#
#   bench/gpu_profile.sh [BUILD]     (default build; needs ncu on PATH or
#                                     under /opt/nvidia or /usr/local/cuda)
# Settings: GPU_PROFILE_STEPS (steps profiled after the first, default 2),
# TD_TEXT (the corpus, as bench/gpu.sh). Writes $OUT/gpu-profile.md (or
# bench/results/gpu-profile-DATE.md) and prints `bench: profile ...` lines,
# the largest first, for scripts/gpu-check's table. Exits non-zero when
# nothing could be measured.
set -u
cd "$(dirname "$0")/.."
B=${1:-build}
steps=${GPU_PROFILE_STEPS:-2}
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -z "$ncu" ]; then
  echo "bench: profile: did not run: no ncu (Nsight Compute) on this machine"
  exit 1
fi
if [ ! -x "$B/bin/train-gpt" ]; then
  echo "bench: profile: did not run: $B/bin/train-gpt missing (the build failed?)"
  exit 1
fi
if [ -n "${OUT:-}" ]; then out=$OUT/gpu-profile.md; else out=bench/results/gpu-profile-$(date -u +%F).md; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# one more step than profiled: the first (allocations, cuBLASLt's heuristics)
# is in the capture too, and left out below: steps end at the optimizer's
# launches
if ! "$ncu" --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    "$B/bin/train-gpt" ${TD_TEXT:+--data "$TD_TEXT"} --device cuda --bf16 --layers 12 --channels 768 --heads 12 \
    --seq 1024 --vocab 50304 --tied --micro-batch 16 --steps $((steps + 1)) --sample 0 \
    >"$tmp/ncu.csv" 2>"$tmp/ncu.err"; then
  echo "bench: profile: did not run: ncu or train-gpt failed: $(grep -v '^$' "$tmp/ncu.err" | tail -1 | cut -c1-160)"
  exit 1
fi
python3 - "$tmp/ncu.csv" "$out" "$steps" "$(git rev-parse --short HEAD 2>/dev/null || echo '?')" <<'EOF'
import csv, sys, re, time
path, out, steps, commit = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
def short_name(name):
    """the kernel's name with its template arguments, without "void " and the parameter list"""
    if name.startswith('void '):
        name = name[5:]
    depth = 0
    for i, ch in enumerate(name):
        if ch == '<':
            depth += 1
        elif ch == '>':
            depth -= 1
        elif ch == '(' and depth == 0:
            name = name[:i]
            break
    return name[:70]

rows = []
with open(path, newline='') as f:
    lines = [l for l in f if l.startswith('"')]  # ncu's own log lines ("==PROF==") are not CSV
for r in csv.DictReader(lines):
    if r.get('Metric Name') != 'gpu__time_duration.sum':
        continue
    name = r.get('Kernel Name', '?')
    rows.append((short_name(name), float(r['Metric Value'].replace(',', ''))))
if not rows:
    print("bench: profile: did not run: ncu listed no kernel durations")
    sys.exit(1)
# steps end with the optimizer's launches: keep the last `steps` of them
ends = [i for i, (n, _) in enumerate(rows) if 'adamw' in n.lower() and
        (i + 1 == len(rows) or 'adamw' not in rows[i + 1][0].lower())]
if len(ends) > steps:
    first, n = ends[-steps - 1] + 1, steps
else:
    first, n = 0, max(len(ends), 1)
sel = rows[first:]
agg = {}
for name, ns in sel:
    c, t = agg.get(name, (0, 0.0))
    agg[name] = (c + 1, t + ns)
total = sum(t for _, t in agg.values())
order = sorted(agg.items(), key=lambda kv: -kv[1][1])
with open(out, 'w') as f:
    f.write(f"# Kernel time per step, GPT-2 124M bf16 on one GPU ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n\n")
    f.write(f"Command: `bench/gpu_profile.sh` (ncu, gpu__time_duration.sum, {n} step(s) after the first), commit {commit}.\n")
    f.write(f"Sum of kernel time per step: {total / n / 1e6:.2f} ms over {len(sel) / n:.0f} launches "
            "(kernels one at a time: no launch gaps, memsets or host waits).\n\n")
    f.write("| kernel | launches / step | ms / step | share |\n|---|---|---|---|\n")
    for name, (c, t) in order:
        f.write(f"| `{name}` | {c / n:.0f} | {t / n / 1e6:.3f} | {100 * t / total:.1f}% |\n")
print(f"bench: profile kernel sum {total / n / 1e6:.2f} ms/step over {len(sel) / n:.0f} launches")
for name, (c, t) in order[:14]:
    print(f"bench: profile {name} x{c / n:.0f}: {t / n / 1e6:.3f} ms/step ({100 * t / total:.1f}%)")
EOF
