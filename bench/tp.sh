#!/usr/bin/env bash
# Tensor parallelism against data parallelism (issue 21): tokens/s, peak RSS
# per rank and model-state bytes per rank of train-gpt on the reference GPT
# (peers/README: 4 layers, 256 channels, 4 heads, sequence 128, AdamW) at
# the same global batch of 16 sequences, for DP=2, TP=2, DP=4, TP=2 x DP=2 and
# TP=4 (4 ranks share the machine's cores), TP with sequence parallelism (SP),
# and one rank for the unsplit model-state bytes.
#
#   bench/tp.sh [BUILD] [STEPS]    (default build, 40 steps; tokens/s leaves out the first 2)
#
# Peak RSS: each rank's /usr/bin/time maximum resident set (shm transport: the
# host-shared pages a rank touched count too). model_state_bytes_per_rank is
# rank 0's (params + grads + AdamW's two moments of its arena).
set -u
cd "$(dirname "$0")/.."
B=${1:-build}
STEPS=${2:-40}
RUN="$B/bin/tandemrun"
GPT="$B/bin/train-gpt"
export TANDEM_PROGRESS=off
tmp=$(mktemp -d /tmp/tandem-bench-tp-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
model=(--layers 4 --channels 256 --heads 4 --seq 128 --steps "$STEPS" --sample 0 --seed 1)
value() { grep -o "$1=[^ ]*" | head -1 | cut -d= -f2; }
row() { # NAME NP ARGS...
  local name=$1 np=$2; shift 2
  rm -f "$tmp"/rss.*
  local out
  out=$(timeout 600 "$RUN" -np "$np" sh -c '/usr/bin/time -o '"$tmp"'/rss.$$ -f %M "$@"' sh "$GPT" "${model[@]}" "$@" 2>&1)
  local rss ms
  rss=$(cat "$tmp"/rss.* 2>/dev/null | sort -g | awk '{ printf "%s%.0f", (NR > 1 ? " / " : ""), $1 / 1024 }')
  ms=$(echo "$out" | value model_state_bytes_per_rank)
  printf "| %s | %d | %s | %s | %s | %s | %s | %s |\n" "$name" "$np" "$(echo "$out" | value global_batch)" \
    "$(echo "$out" | value tokens_per_s)" "$(echo "$out" | value final_loss)" "$rss" \
    "$(awk -v b="${ms:-0}" 'BEGIN { printf "%.2f", b / 1048576 }')" "$(echo "$out" | value params)"
}
echo "tree $B, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $STEPS steps"
echo
echo "| layout | ranks | global batch | tokens/s | final loss | peak RSS MiB per rank | model state MiB per rank | parameters per rank |"
echo "|---|---|---|---|---|---|---|---|"
row "1 rank" 1 --micro-batch 16
row "DP=2" 2 --micro-batch 8
row "TP=2" 2 --micro-batch 16 --tensor-parallel 2
row "TP=2 + SP" 2 --micro-batch 16 --tensor-parallel 2 --sequence-parallel
row "DP=4" 4 --micro-batch 4
row "TP=2 x DP=2" 4 --micro-batch 8 --tensor-parallel 2
row "TP=4" 4 --micro-batch 16 --tensor-parallel 4
row "TP=4 + SP" 4 --micro-batch 16 --tensor-parallel 4 --sequence-parallel
