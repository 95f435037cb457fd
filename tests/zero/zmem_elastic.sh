#!/usr/bin/env bash
# ZeRO under elastic training on real processes (issue 19), at STAGE (default 3): the
# trainer's model_state_bytes_per_rank counts the elastic copies (buddy
# replicas) and deterministic reduction's buffers, so it must reach the
# estimate's model states (--estimate-memory --elastic, which counts them)
# within 10% and stay below the process's peak RSS (/usr/bin/time). Every
# rank's peak RSS (VmHWM, its memory line: the shm pages it maps counted
# once, as the kernel counts them) must lie within 10% of what
# --estimate-memory says for that rank (its `estimate rank=R` line: the
# model states, activations and compute scratch, this process before the
# arenas, and the peers' pages it maps), with --elastic and without it
# (issue 19's target: the estimate within 10% of the measured peak at
# every stage, with and without elastic). At every stage
# the copies are files (replica_disk_bytes= of the summary, the estimate's
# replica_disk=, within 1%: at stage 0 the whole state's two commits, at
# stages 1-3 the buddy replicas), and the peak RSS must stay within 1.3x
# that of the same run without --elastic (issue 19's target; it was 2.4x
# at stage 3 with the copies in memory, 2.1x at stage 0). What the
# estimate counts resident of them (replicas=) is the staging chunk at
# stages 1-3, nothing at stage 0 (its files are written in place).
#   tests/zero/zmem_elastic.sh BUILD [STAGE]
set -u
B=${1:?usage: zmem_elastic.sh BUILD [STAGE]}
S=${2:-3}
tmp=$(mktemp -d /tmp/tandem-zmem-elastic-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export TANDEM_PROGRESS=off
model=(--layers 2 --channels 384 --heads 6 --seq 64 --micro-batch 1 --steps 3 --sample 0 --threads 1 --zero-stage $S)
value() { grep -o "$1=[^ ]*" | head -1 | cut -d= -f2; }
cli=$(timeout 60 "$B/bin/tandemrun" -np 2 "$B/bin/train-gpt" "${model[@]}" --elastic --estimate-memory 2>&1)
cli0=$(timeout 60 "$B/bin/tandemrun" -np 2 "$B/bin/train-gpt" "${model[@]}" --estimate-memory 2>&1)
est=$(echo "$cli" | grep "stage=$S ")
out=$(timeout 120 "$B/bin/tandemrun" -np 2 sh -c '/usr/bin/time -o '"$tmp"'/rss.$$ -f %M "$@"' sh "$B/bin/train-gpt" \
  "${model[@]}" --elastic 2>&1)
line=$(echo "$out" | grep "final_loss=")
disk=$(echo "$out" | value replica_disk_bytes)
kb=$(cat "$tmp"/rss.* | sort -g | tail -1)
rm -f "$tmp"/rss.*
plain=$(timeout 120 "$B/bin/tandemrun" -np 2 sh -c '/usr/bin/time -o '"$tmp"'/rss.$$ -f %M "$@"' sh "$B/bin/train-gpt" \
  "${model[@]}" 2>&1)
kb0=$(cat "$tmp"/rss.* 2>/dev/null | sort -g | tail -1)
echo "$plain" | grep -q "final_loss=" || { echo "FAILED: the run without --elastic did not finish"; echo "$plain" | tail -20; exit 1; }
[ -n "$line" ] && [ -n "$est" ] || { echo "FAILED: no summary or estimate line"; echo "$out" | tail -20; exit 1; }
measured=$(echo "$line" | value model_state_bytes_per_rank)
states=$(echo "$est" | value model_state_bytes)
replicas=$(echo "$est" | value replicas)
rdisk=$(echo "$est" | value replica_disk)
act=$(echo "$est" | value activations)
echo "measured model states $measured bytes, estimate $states (replicas $replicas MiB, activations $act MiB), peak RSS $kb KiB;" \
  "replica files $disk bytes (estimate $rdisk MiB); without --elastic peak RSS $kb0 KiB"
# each rank's peak (its memory line) against --estimate-memory's figure for that rank, with and without --elastic
per_rank() { # LABEL CLI-OUTPUT RUN-OUTPUT
  local e p r bad=0
  for r in 0 1; do
    e=$(echo "$2" | grep "estimate rank=$r " | value estimate_mib)
    p=$(echo "$3" | grep "memory rank=$r " | value peak_rss_mib)
    [ -n "$e" ] && [ -n "$p" ] || { echo "FAILED: $1: no --estimate-memory line (estimate rank=$r) or no memory line for rank $r"; bad=1; continue; }
    awk -v l="$1" -v r="$r" -v e="$e" -v p="$p" 'BEGIN {
      printf "%s rank %d: peak RSS %.1f MiB / --estimate-memory %.1f MiB = %.3f\n", l, r, p, e, p / e
      if (p < 0.9 * e || p > 1.1 * e) { printf "FAILED: %s rank %d: the peak is not within 10%% of the estimate\n", l, r; exit 1 } }' || bad=1
  done
  return $bad
}
bad=0
per_rank "--elastic" "$cli" "$out" || bad=1
per_rank "without --elastic" "$cli0" "$plain" || bad=1
awk -v s_="$S" -v m="$measured" -v s="$states" -v r="$replicas" -v kb="$kb" -v d="${disk:-0}" -v rd="$rdisk" \
  -v kb0="${kb0:-0}" -v bad0="$bad" 'BEGIN {
  bad = bad0
  if (s_ > 0 && r <= 0) { print "FAILED: the estimate counts no staging chunk for the buddy replicas under --elastic"; bad = 1 }
  if (s_ == 0 && r != 0) { printf "FAILED: the estimate counts %.1f MiB of copies resident at stage 0, whose copies are files\n", r; bad = 1 }
  if (m < 0.9 * s || m > 1.1 * s) { printf "FAILED: measured %d not within 10%% of the estimate %d\n", m, s; bad = 1 }
  if (m > kb * 1024) { printf "FAILED: measured %d above the peak RSS %d\n", m, kb * 1024; bad = 1 }
  if (d < 0.99 * rd * 1048576 || d > 1.01 * rd * 1048576 || d == 0) {
    printf "FAILED: replica files of %d bytes, estimated %.1f MiB\n", d, rd; bad = 1 }
  if (kb > 1.3 * kb0) { printf "FAILED: peak RSS %d KiB is %.2fx that without --elastic (%d KiB; target <= 1.3x)\n", kb, kb / kb0, kb0; bad = 1 }
  if (!bad) print "OK: stage " s_ ": the copies counted, measured and estimated; every rank within 10% of --estimate-memory with and without --elastic; copies on disk; RSS " sprintf("%.2f", kb / kb0) "x that without --elastic"
  exit bad }'
