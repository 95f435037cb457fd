#!/usr/bin/env bash
# ZeRO's memory per rank (issue 19): peak RSS of the issue's configuration,
# 2 ranks, GPT of 7.3M parameters (4 layers, 384 channels, 6 heads, sequence
# 128, micro-batch 1, AdamW), 3 steps, at stage 0, stage 3, stage 3 with
# deterministic reduction and stage 3 under elastic training (--elastic),
# with the trainer's measured model-state bytes and the estimate.
#
#   bench/zmem.sh [BUILD]     (default build; BUILD=another tree compares code)
#
# Peak RSS: the largest of the ranks' /usr/bin/time maximum resident sets
# (shm transport: a peer's host-shared pages this process touched count too).
set -u
cd "$(dirname "$0")/.."
B=${1:-build}
RUN="$B/bin/tandemrun"
GPT="$B/bin/train-gpt"
export TANDEM_PROGRESS=off
tmp=$(mktemp -d /tmp/tandem-bench-zmem-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
echo '{"deterministic_reduction": true}' >"$tmp/det.json"
model=(--layers 4 --channels 384 --heads 6 --seq 128 --micro-batch 1 --steps 3 --sample 0 --threads 1)
value() { grep -o "$1=[^ ]*" | head -1 | cut -d= -f2; }
run() { # NAME ARGS...
  local name=$1; shift
  rm -f "$tmp"/rss.*
  local out
  out=$(timeout 300 "$RUN" -np 2 sh -c '/usr/bin/time -o '"$tmp"'/rss.$$ -f %M "$@"' sh "$GPT" "${model[@]}" "$@" 2>&1)
  local kb ms
  kb=$(cat "$tmp"/rss.* 2>/dev/null | sort -g | tail -1)
  ms=$(echo "$out" | value model_state_bytes_per_rank)
  printf "| %s | %s | %.1f | %s |\n" "$name" "$(echo "$out" | value final_loss)" "$(awk -v k="${kb:-0}" 'BEGIN { print k / 1024 }')" \
    "$(awk -v b="${ms:-0}" 'BEGIN { if (b > 0) printf "%.1f", b / 1048576; else print "-" }')"
}
est=$(timeout 60 "$RUN" -np 2 "$GPT" "${model[@]}" --estimate-memory 2>&1)
estd=$(timeout 60 "$RUN" -np 2 "$GPT" "${model[@]}" --config "$tmp/det.json" --estimate-memory 2>&1)
este=$(timeout 60 "$RUN" -np 2 "$GPT" "${model[@]}" --elastic --estimate-memory 2>&1)
echo "tree $B, $(date -u +%Y-%m-%dT%H:%MZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| run | final loss | peak RSS MiB (max of 2 ranks) | model_state_bytes_per_rank MiB |"
echo "|---|---|---|---|"
run "stage 0" --zero-stage 0
run "stage 3" --zero-stage 3
run "stage 3 + deterministic" --zero-stage 3 --config "$tmp/det.json"
run "stage 3 + elastic" --zero-stage 3 --elastic
echo
echo "estimate (total = model states + activations, MiB):"
echo "$est" | grep -E "stage=(0|3) " | sed 's/^\[0\] /  /'
echo "$estd" | grep -E "stage=3 " | sed 's/^\[0\] /  deterministic: /'
echo "$este" | grep -E "stage=3 " | sed 's/^\[0\] /  elastic: /'
