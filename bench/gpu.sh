#!/usr/bin/env bash
# GPU benchmark (issue 18), run on a machine with a GPU (scripts/gpu-check
# calls it after building): one run, one GPU, side by side,
#
#   1. GPT-2 124M training (vocabulary 50,304, 12 layers, 768 channels, 12
#      heads, sequence 1,024, batch 16, bf16): Tandem's train-gpt --device
#      cuda against the PyTorch peer bench/torch_gpt2_gpu.py, eager and
#      torch.compile: tokens/s, ms/step, MFU, peak device memory.
#   2. Collectives on device buffers: a 64 MiB allreduce on 2 ranks sharing
#      the GPU (the staged path) against the same allreduce on host buffers
#      (td_mem_alloc and malloc): busbw and the ratio (target >= 0.8).
#
# Writes bench/results/gpu-DATE.md (DATE: UTC day) and prints it, then one
# "bench: ..." line per figure (scripts/gpu-check puts those in its table). A part
# that cannot run says why in its row instead of a number; the script exits
# non-zero only when nothing could be measured.
#
#   bench/gpu.sh [--quick] [--build DIR] [--python PY]
#     --quick   fewer steps (a smoke run of the script itself, not figures)
#     BUILD     build tree with bin/train-gpt, bin/tandem-bench (default build)
#     PYTHON    the interpreter with torch (default python3)
# Settings: GPU_BENCH_STEPS (timed steps, default 30), GPU_PEAK_TFLOPS
# (dense bf16 peak for MFU, default 989.4: H100/H200 SXM), GPU_BENCH_DEADLINE
# (a time, date +%s, no part may run past: scripts/gpu-check's budget; each
# part's timeout is cut to what is left, and a part with none left says so).
# Each figure's "bench: " line is printed as soon as it is measured, and the
# parts run in order of what they cost to lose: Tandem, PyTorch eager, the
# allreduce, then torch.compile (whose compile is most of the script's time),
# so that a run cut by its deadline keeps the figures it got.
set -u
cd "$(dirname "$0")/.."
B=build PY=python3 quick=0
while [ $# -gt 0 ]; do
  case $1 in
    --quick) quick=1 ;;
    --build) B=$2; shift ;;
    --python) PY=$2; shift ;;
    *) echo "usage: bench/gpu.sh [--quick] [--build DIR] [--python PY]" >&2; exit 2 ;;
  esac
  shift
done
steps=${GPU_BENCH_STEPS:-30} warmup=5
[ "$quick" = 1 ] && steps=3 warmup=1
peak=${GPU_PEAK_TFLOPS:-989.4}
day=$(date -u +%Y-%m-%d)
out=bench/results/gpu-$day.md
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
measured=0

# a part's timeout: its own, or what is left before GPU_BENCH_DEADLINE (0: none)
part_limit() {
  local left
  [ -z "${GPU_BENCH_DEADLINE:-}" ] && { echo "$1"; return; }
  left=$((GPU_BENCH_DEADLINE - $(date +%s)))
  [ "$left" -lt "$1" ] && echo $((left > 0 ? left : 0)) || echo "$1"
}
# the "bench: " line of a table row, printed when the row is made
emit() {
  local _ impl tps ms mfu mem loss
  IFS='|' read -r _ impl tps ms mfu mem loss _ <<<"$1"
  case $tps in
    *"did not run"*) echo "bench: $(echo $impl): $(echo $tps)" | cut -c1-150 ;;
    *) echo "bench: $(echo $impl) tokens/s $(echo $tps) ms/step $(echo $ms) mfu $(echo $mfu) peak MiB $(echo $mem)" ;;
  esac
}
add_row() { rows+=("$1"); emit "$1"; }

gpu=$(timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
[ -n "$gpu" ] || gpu="no GPU visible to nvidia-smi"
shape=(--layers 12 --channels 768 --heads 12 --seq 1024)

# ---- 1. GPT-2 124M ----
rows=()
peer() { # impl extra-args...
  local impl=$1 lim
  shift
  lim=$(part_limit 300)
  if [ "$lim" -le 0 ]; then
    add_row "| $impl | did not run: no time left before GPU_BENCH_DEADLINE | | | | |"
    return
  fi
  if timeout -k 5 "$lim" "$PY" bench/torch_gpt2_gpu.py --device cuda "${shape[@]}" --vocab 50304 --batch 16 --steps "$steps" \
      --warmup "$warmup" --dtype bf16 --peak-tflops "$peak" "$@" >"$tmp/$impl.json" 2>"$tmp/$impl.err"; then
    add_row "$("$PY" - "$tmp/$impl.json" <<'EOF'
import json, sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(f"| {d['impl']} (torch {d['torch']}) | {d['tokens_per_s']:,.0f} | {d['ms_per_step']} | {100 * d['mfu']:.1f}% "
      f"| {d['peak_mem_mib']:,.0f} | {d['loss_first']} -> {d['loss_last']} |")
EOF
)"
    measured=1
  else
    local w
    w=$(tail -1 "$tmp/$impl.err" | cut -c1-160)
    [ -s "$tmp/$impl.err" ] || w="no output (timed out after ${lim}s?)"
    add_row "| $impl | did not run: $w | | | | |"
  fi
}

tandem_gpt() {
  local log=$tmp/tandem.log lim
  lim=$(part_limit 300)
  if [ "$lim" -le 0 ]; then
    add_row "| tandem train-gpt --device cuda | did not run: no time left before GPU_BENCH_DEADLINE | | | | |"
    return
  fi
  # TD_TEXT: the corpus where the default one is absent (scripts/gpu-check sets it)
  if timeout -k 5 "$lim" "$B/bin/train-gpt" ${TD_TEXT:+--data "$TD_TEXT"} --device cuda --bf16 "${shape[@]}" --vocab 50304 --tied --micro-batch 16 \
      --steps $((steps + 2)) --sample 0 >"$log" 2>"$tmp/tandem.err"; then
    # train-gpt's summary line: key=value pairs (tokens_per_s leaves out the first 2 steps)
    local line tps ms mem loss
    line=$(grep -m1 'tokens_per_s=' "$log")
    tps=$(sed -n 's/.*tokens_per_s=\([0-9.]*\).*/\1/p' <<<"$line")
    ms=$(awk -v t="$tps" 'BEGIN { if (t == "" || t == 0) print "?"; else printf "%.2f", 16 * 1024 * 1000 / t }')
    # device memory in use after training (total - free: the CUDA context included, ~0.5 GiB more than
    # torch's max_memory_allocated counts)
    mem=$(sed -n 's/.*device_used_mib=\([0-9.]*\).*/\1/p' "$log" | head -1)
    loss=$(sed -n 's/.*final_loss=\([0-9.]*\).*/\1/p' <<<"$line")
    local n_params=124475904 # GPT-2 124M with vocabulary 50,304 (tied head)
    local mfu
    mfu=$(awk -v t="$tps" -v n=$n_params -v p="$peak" 'BEGIN { if (t == "") print "?"; else printf "%.1f%%", 100 * t * (6 * n + 12 * 12 * 1024 * 768) / (p * 1e12) }')
    add_row "| tandem train-gpt --device cuda | ${tps:-?} | ${ms:-?} | $mfu | ${mem:-?} | final ${loss:-?} |"
    measured=1
  else
    add_row "| tandem train-gpt --device cuda | did not run: $(grep -v '^$' "$tmp/tandem.err" | head -1 | cut -c1-160) | | | | |"
  fi
}

tandem_gpt
peer torch-eager

# ---- 2. allreduce on device vs host buffers (2 ranks, one GPU: staged) ----
busbw() { # tandem-bench's buffer arguments
  local res lim
  lim=$(part_limit 60)
  [ "$lim" -le 0 ] && { echo "?"; return; }
  res=$(timeout -k 5 "$lim" "$B/bin/tandemrun" -np 2 "$B/bin/tandem-bench" allreduce -b 64M -e 64M -n 20 -w 5 "$@" \
    2>"$tmp/bench.err" | awk '$1 ~ /^[0-9]+$/ || $2 ~ /^[0-9]+$/ { for (i = 1; i <= NF; i++) if ($i ~ /^[0-9]+\.[0-9]+$/) v[++k] = $i } END { if (k >= 3) print v[k] }')
  echo "${res:-?}"
}
bw_dev=$(busbw -D cuda)
bw_shared=$(busbw -R 1)
bw_malloc=$(busbw -R 0)
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "?" || b == "?" || b == 0) print "?"; else printf "%.2f", a / b }'; }
[ "$bw_dev" != "?" ] && measured=1
echo "bench: allreduce 64MiB 2 ranks/GPU busbw GB/s: device $bw_dev, host td_mem_alloc $bw_shared ($(ratio "$bw_dev" "$bw_shared")x), malloc $bw_malloc"

peer torch-compile --compile

{
  echo "# GPU benchmark, $day"
  echo
  echo "Machine: $gpu; $(nproc) cores; $(uname -r). Commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')."
  echo "Command: bench/gpu.sh$([ "$quick" = 1 ] && echo ' --quick') ($steps timed steps after $warmup warm-up steps;"
  echo "MFU = tokens/s x (6N + 12 L T C) / $peak TFLOPS)."
  echo
  echo "## GPT-2 124M, bf16, batch 16 x 1024, one GPU"
  echo
  echo "| implementation | tokens/s | ms/step | MFU | peak device MiB (Tandem: in use after training, context included) | loss |"
  echo "|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
  echo
  echo "## 64 MiB f32 allreduce, 2 ranks sharing the GPU (busbw GB/s)"
  echo
  echo "| buffers | busbw | device / host |"
  echo "|---|---|---|"
  echo "| device (cuda, staged path) | $bw_dev | |"
  echo "| host, td_mem_alloc (-R 1) | $bw_shared | $(ratio "$bw_dev" "$bw_shared") |"
  echo "| host, malloc (-R 0) | $bw_malloc | $(ratio "$bw_dev" "$bw_malloc") |"
} >"$out"
cat "$out"
[ "$measured" = 1 ]
