#!/usr/bin/env bash
# The largest GPT that trains on 2 ranks of this machine with NVMe offload
# and defaults only (issue 23): ZeRO stage 3, offload_optimizer and
# offload_param "nvme", bf16, activation checkpointing, no other knob (the
# unset ones sized from the memory: docs/zero.md, "Defaults that fit").
#
#   bench/offload-search.sh [LIMIT] [SEQS] [--run]
#
# For each sequence length in SEQS (default "128 512") the number of layers
# of a 2560-channel, 20-head GPT is bisected on the trainer's own decision:
# train-gpt --estimate-memory's fit= line (td_trainer_fit_memory: the knobs
# it would choose and whether it would refuse at start), under
# TANDEM_MEMORY_LIMIT=LIMIT (default 18G: what the real run's memory cgroup
# gives; the probes allocate nothing, but MemAvailable below LIMIT bounds
# them too, so run this on a quiet machine: the script says when it did).
# --run then trains the largest of each length for 3 steps inside a memory
# cgroup of LIMIT (bench/offload-edge.sh), which records the estimate
# against each rank's measured peak. Appends to
# bench/results/offload-search-DATE.md.
set -u
cd "$(dirname "$0")/.."
limit=${1:-18G}
seqs=${2:-"128 512"}
run=0
[ "${3:-}" = --run ] && run=1
B=${BUILD:-build}
C=2560 H=20
out=bench/results/offload-search-$(date -u +%Y-%m-%d).md
tmp=$(mktemp -d /tmp/tandem-offload-search-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
limit_b=$(numfmt --from=iec "$limit")
cat >"$tmp/ds.json" <<JSON
{"zero_optimization": {"stage": 3,
   "offload_optimizer": {"device": "nvme", "nvme_path": "$tmp"},
   "offload_param": {"device": "nvme", "nvme_path": "$tmp"}},
 "bf16": {"enabled": true}, "activation_checkpointing": {"enabled": true}}
JSON
probe() { # SEQ L -> the fit line
  TANDEM_MEMORY_LIMIT=$limit_b timeout 120 "$B/bin/tandemrun" -np 2 "$B/bin/train-gpt" --config "$tmp/ds.json" \
    --layers "$2" --channels $C --heads $H --seq "$1" --micro-batch 1 --estimate-memory 2>/dev/null | grep -E "fit: |memory per rank at" | tr '\n' ' '
}
fits() { probe "$1" "$2" | grep -q "fits=1"; }
{
  echo
  echo "## Largest GPT with offload and defaults only, 2 ranks, limit $limit ($(date -u +%H:%MZ), commit $(git rev-parse --short HEAD))"
  echo
  echo "Command: \`bench/offload-search.sh $*\`; $C channels, $H heads, micro-batch 1; MemAvailable at start $(awk '/^MemAvailable/ { printf "%d", $2 / 1024 }' /proc/meminfo) MiB; load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo
  echo "| seq | layers | parameters | estimate per rank (MiB) | limit per rank (MiB) | knobs chosen |"
  echo "|---|---|---|---|---|---|"
} | tee -a "$out"
for seq in $seqs; do
  lo=1 hi=64
  fits "$seq" $lo || { echo "| $seq | none fits | | | | |" | tee -a "$out"; continue; }
  while fits "$seq" $hi; do lo=$hi; hi=$((hi * 2)); done
  while [ $((hi - lo)) -gt 1 ]; do
    mid=$(((lo + hi) / 2))
    if fits "$seq" $mid; then lo=$mid; else hi=$mid; fi
  done
  line=$(probe "$seq" $lo)
  v() { echo "$line" | grep -o " $1=[^ ,]*" | head -1 | cut -d= -f2; }
  knobs=$(echo "$line" | grep -o "stage3_max_live_parameters=.*")
  echo "$line" | grep -q 'limit="TANDEM_MEMORY_LIMIT' ||
    echo "offload-search.sh: the probes were bound by $(echo "$line" | grep -o 'limit="[^"]*"'), not by $limit: the machine is busy" >&2
  echo "| $seq | $lo ($((lo + 1)) is refused at start) | $(v params) | $(v estimate_mib) | $(v limit_mib) | $knobs |" | tee -a "$out"
  eval "best_$seq=$lo"
done
if [ $run = 1 ]; then
  for seq in $seqs; do
    L=$(eval echo "\${best_$seq:-0}")
    [ "$L" -gt 0 ] && OUT="$out" bench/offload-edge.sh "$L" $C $H "$seq" "$limit"
  done
fi
