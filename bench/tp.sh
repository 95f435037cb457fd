#!/usr/bin/env bash
# Tensor parallelism against data parallelism (issue 21): tokens/s, CPU time
# per step, peak RSS per rank and model-state bytes per rank of train-gpt on
# the reference GPT (peers/README: 4 layers, 256 channels, 4 heads, sequence
# 128, AdamW) at the same global batch of 16 sequences, for DP=2, TP=2,
# DP=4, TP=2 x DP=2 and TP=4 (4 ranks share the machine's cores), TP with
# sequence parallelism (SP), and one rank for the unsplit model-state bytes.
# Then ROUNDS interleaved rounds of DP=2, TP=2 and TP=2 + SP, whose per-round
# ratios to DP=2 mean something on a loaded machine where one-shot figures
# do not.
#
# The 3D table: every layout of 4 ranks at the same global batch of 16
# (DP=4, TP=2 x DP=2, PP=2 x DP=2, TP=2 x PP=2, TP=4, PP=4; the pipelines
# with 4 or 8 micro-batches, 1F1B).
#
# The ZeRO-3 table: TP=2 x DP=2 and PP=2 x DP=2 (m=4) at ZeRO-0 and at
# ZeRO-3 (the tensor-parallel model and the stage models fetching each group
# from the data-parallel owners), in ROUNDS rounds that alternate which
# stage runs first (A B, then B A: on a loaded machine the order matters).
#
#   bench/tp.sh [BUILD] [STEPS] [ROUNDS] [TABLES]   (default build, 20 steps, 3 rounds,
#                                           TABLES "all"; "3d": the 3D table only;
#                                           "zero3": the ZeRO-3 table only;
#                                           tokens/s leaves out the first 2 steps)
#
# Peak RSS: each rank's /usr/bin/time maximum resident set (shm transport: the
# host-shared pages a rank touched count too). model_state_bytes_per_rank and
# cpu_ms_per_step (process CPU time per step, all its threads) are rank 0's.
set -u
cd "$(dirname "$0")/.."
B=${1:-build}
STEPS=${2:-20}
ROUNDS=${3:-3}
TABLES=${4:-all}
RUN="$B/bin/tandemrun"
GPT="$B/bin/train-gpt"
export TANDEM_PROGRESS=off
tmp=$(mktemp -d /tmp/tandem-bench-tp-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
model=(--layers 4 --channels 256 --heads 4 --seq 128 --steps "$STEPS" --sample 0 --seed 1)
value() { grep -o "$1=[^ ]*" | head -1 | cut -d= -f2; }
train() { # NP ARGS...: the run's output in $tmp/out, per-rank RSS in $tmp/rss.*
  local np=$1; shift
  rm -f "$tmp"/rss.*
  timeout 900 "$RUN" -np "$np" sh -c '/usr/bin/time -o '"$tmp"'/rss.$$ -f %M "$@"' sh "$GPT" "${model[@]}" "$@" \
    >"$tmp/out" 2>&1
}
row() { # NAME NP ARGS...
  local name=$1 np=$2; shift 2
  train "$np" "$@"
  local rss ms
  rss=$(cat "$tmp"/rss.* 2>/dev/null | sort -g | awk '{ printf "%s%.0f", (NR > 1 ? " / " : ""), $1 / 1024 }')
  ms=$(value model_state_bytes_per_rank <"$tmp/out")
  # the trainer's memory estimate per rank (memory_fit.c) against its measured peak RSS, in rank order
  est=$(sed -n 's/.*memory rank=\([0-9]*\) estimate_mib=\([^ ]*\) .*peak_rss_mib=\([^ ]*\).*/\1 \2 \3/p' "$tmp/out" |
    sort -n | awk '{ printf "%s%.0f/%.0f", (NR > 1 ? " " : ""), $2, $3 }')
  printf "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s |\n" "$name" "$np" "$(value global_batch <"$tmp/out")" \
    "$(value tokens_per_s <"$tmp/out")" "$(value cpu_ms_per_step <"$tmp/out")" "$(value final_loss <"$tmp/out")" "$rss" \
    "$est" "$(awk -v b="${ms:-0}" 'BEGIN { printf "%.2f", b / 1048576 }')" "$(value params <"$tmp/out")"
}
echo "tree $B, git $(git rev-parse --short HEAD 2>/dev/null), $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $STEPS steps"
header() {
  echo
  echo "| layout | ranks | global batch | tokens/s | CPU ms per step (rank 0) | final loss | peak RSS MiB per rank (sorted) | estimate/peak MiB per rank (rank order) | model state MiB per rank | parameters per rank |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
}
if [ "$TABLES" = 3d ]; then
  echo
  echo "3D layouts, 4 ranks, global batch 16 (model state and parameters: rank 0's)"
  header
  row "DP=4" 4 --micro-batch 4
  row "TP=2 x DP=2" 4 --micro-batch 8 --tensor-parallel 2
  row "PP=2 x DP=2 (m=4)" 4 --micro-batch 2 --grad-accum 4 --pipeline-parallel 2
  row "TP=2 x PP=2 (m=4)" 4 --micro-batch 4 --grad-accum 4 --tensor-parallel 2 --pipeline-parallel 2
  row "TP=2 x PP=2 + SP (m=4)" 4 --micro-batch 4 --grad-accum 4 --tensor-parallel 2 --pipeline-parallel 2 --sequence-parallel
  row "TP=4" 4 --micro-batch 16 --tensor-parallel 4
  row "PP=4 (m=8)" 4 --micro-batch 2 --grad-accum 8 --pipeline-parallel 4
  exit 0
fi
if [ "$TABLES" = zero3 ]; then
  echo
  echo "ZeRO-3 with TP and PP, 4 ranks, global batch 16, $ROUNDS rounds alternating the order (model state and parameters: rank 0's)"
  header
  for r in $(seq 1 "$ROUNDS"); do
    for layout in tp pp; do
      if [ "$layout" = tp ]; then args=(--micro-batch 8 --tensor-parallel 2); name="TP=2 x DP=2"
      else args=(--micro-batch 2 --grad-accum 4 --pipeline-parallel 2); name="PP=2 x DP=2 (m=4)"; fi
      order="0 3"; [ $((r % 2)) -eq 0 ] && order="3 0"
      for z in $order; do
        row "$name ZeRO-$z (round $r, load $(cut -d' ' -f1 /proc/loadavg))" 4 "${args[@]}" --zero-stage "$z"
      done
    done
  done
  exit 0
fi
header
row "1 rank" 1 --micro-batch 16
row "DP=2" 2 --micro-batch 8
row "TP=2" 2 --micro-batch 16 --tensor-parallel 2
row "TP=2 + SP" 2 --micro-batch 16 --tensor-parallel 2 --sequence-parallel
row "DP=4" 4 --micro-batch 4
row "TP=2 x DP=2" 4 --micro-batch 8 --tensor-parallel 2
row "TP=4" 4 --micro-batch 16 --tensor-parallel 4
row "TP=4 + SP" 4 --micro-batch 16 --tensor-parallel 4 --sequence-parallel
[ "$ROUNDS" -gt 0 ] || exit 0
echo
echo "interleaved rounds, 2 ranks, global batch 16 (tokens/s; ratio to the same round's DP=2):"
echo
echo "| round | load | DP=2 | TP=2 | TP=2 + SP | TP=2 / DP=2 | TP=2 + SP / DP=2 |"
echo "|---|---|---|---|---|---|---|"
for r in $(seq 1 "$ROUNDS"); do
  load=$(cut -d' ' -f1 /proc/loadavg)
  train 2 --micro-batch 8; dp=$(value tokens_per_s <"$tmp/out")
  train 2 --micro-batch 16 --tensor-parallel 2; tp=$(value tokens_per_s <"$tmp/out")
  train 2 --micro-batch 16 --tensor-parallel 2 --sequence-parallel; sp=$(value tokens_per_s <"$tmp/out")
  awk -v r="$r" -v l="$load" -v d="${dp:-0}" -v t="${tp:-0}" -v s="${sp:-0}" \
    'BEGIN { printf "| %d | %s | %s | %s | %s | %.3f | %.3f |\n", r, l, d, t, s, (d > 0 ? t / d : 0), (d > 0 ? s / d : 0) }'
done
