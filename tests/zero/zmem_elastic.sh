#!/usr/bin/env bash
# ZeRO under elastic training on real processes (issue 19), at STAGE (default 3): the
# trainer's model_state_bytes_per_rank counts the elastic copies (buddy
# replicas) and deterministic reduction's buffers, so it must reach the
# estimate's model states (--estimate-memory --elastic, which counts them)
# within 10% and stay below the process's peak RSS (/usr/bin/time); the
# estimate plus activations must lie within 10% of the peak RSS.
#   tests/zero/zmem_elastic.sh BUILD [STAGE]
set -u
B=${1:?usage: zmem_elastic.sh BUILD [STAGE]}
S=${2:-3}
tmp=$(mktemp -d /tmp/tandem-zmem-elastic-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export TANDEM_PROGRESS=off
model=(--layers 2 --channels 384 --heads 6 --seq 64 --micro-batch 1 --steps 3 --sample 0 --threads 1 --zero-stage $S)
value() { grep -o "$1=[^ ]*" | head -1 | cut -d= -f2; }
est=$(timeout 60 "$B/bin/tandemrun" -np 2 "$B/bin/train-gpt" "${model[@]}" --elastic --estimate-memory 2>&1 | grep "stage=$S ")
out=$(timeout 120 "$B/bin/tandemrun" -np 2 sh -c '/usr/bin/time -o '"$tmp"'/rss.$$ -f %M "$@"' sh "$B/bin/train-gpt" \
  "${model[@]}" --elastic 2>&1)
line=$(echo "$out" | grep "final_loss=")
[ -n "$line" ] && [ -n "$est" ] || { echo "FAILED: no summary or estimate line"; echo "$out" | tail -20; exit 1; }
measured=$(echo "$line" | value model_state_bytes_per_rank)
states=$(echo "$est" | value model_state_bytes)
replicas=$(echo "$est" | value replicas)
act=$(echo "$est" | value activations)
kb=$(cat "$tmp"/rss.* | sort -g | tail -1)
echo "measured model states $measured bytes, estimate $states (replicas $replicas MiB, activations $act MiB), peak RSS $kb KiB"
awk -v s_="$S" -v m="$measured" -v s="$states" -v r="$replicas" -v a="$act" -v kb="$kb" 'BEGIN {
  rss = kb * 1024; total = s + a * 1048576; bad = 0
  if (r <= 0) { print "FAILED: the estimate counts no replicas under --elastic"; bad = 1 }
  if (m < 0.9 * s || m > 1.1 * s) { printf "FAILED: measured %d not within 10%% of the estimate %d\n", m, s; bad = 1 }
  if (m > rss) { printf "FAILED: measured %d above the peak RSS %d\n", m, rss; bad = 1 }
  if (total < 0.9 * rss || total > 1.1 * rss) { printf "FAILED: estimate %.0f not within 10%% of the peak RSS %d\n", total, rss; bad = 1 }
  if (!bad) print "OK: stage " s_ " under elastic training: the copies counted, measured and estimated within 10% of RSS"
  exit bad }'
