#!/bin/bash
# The RSS watch's cost (issue 23): the share of a training run's CPU that the
# kernel spends walking page tables for the Pss the watch reads
# (/proc/self/smaps_rollup: show_smaps_rollup and what it calls, smaps_account
# among them), from perf's samples of one train-gpt process, for each binary
# given (e.g. before and after a change), side by side on the same model.
#   bench/pss_watch.sh TRAIN_GPT... [-- TRAIN_GPT_ARGS...]
# Default model: 8 x 1024 (101M parameters, ~1.7 GB RSS at stage 0), 12 steps,
# seq 128, micro-batch 4, one rank. Needs perf and kernel symbols (root, or
# kernel.perf_event_paranoid <= 1). Quote figures only from a bench-lane run.
set -u
bins=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do bins+=("$1"); shift; done
[ "${1:-}" = -- ] && shift
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--layers 8 --channels 1024 --heads 16 --seq 128 --micro-batch 4 --steps 12 --sample 0)
[ ${#bins[@]} -gt 0 ] || { echo "usage: bench/pss_watch.sh TRAIN_GPT... [-- ARGS...]"; exit 2; }
command -v perf >/dev/null || { echo "SKIPPED: no perf"; exit 0; }
tmp=$(mktemp -d /tmp/td-pss-watch-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
echo "model: ${args[*]}; $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for b in "${bins[@]}"; do
  perf record -q -g -o "$tmp/perf.data" -- "$b" "${args[@]}" >"$tmp/out" 2>&1 || { tail "$tmp/out"; exit 1; }
  rep=$(perf report -i "$tmp/perf.data" --children --sort sym --stdio -g none 2>/dev/null)
  samples=$(echo "$rep" | sed -n 's/^# Samples: \([0-9]*\).*/\1/p' | head -1)
  walk=$(echo "$rep" | grep -m1 "show_smaps_rollup" | awk '{ print $1 }')
  acct=$(echo "$rep" | grep -m1 "smaps_account" | awk '{ print $1 }')
  echo "$b: samples $samples, show_smaps_rollup (children) ${walk:-0%}, smaps_account ${acct:-0%}," \
    "$(grep -o 'max_rss_mib=[0-9.]*' "$tmp/out" | head -1), $(grep -o 'train_s=[0-9.]*' "$tmp/out" | head -1)"
done
