#!/usr/bin/env bash
# Page faults per rank per step of a PP=2 pipeline whose activation messages
# (512 KiB) are larger than the shm FIFO (256 KiB), so that they go through
# the receiver's unexpected frames (docs/collectives.md): the minor faults of
# a run of S2 steps less those of a run of S1 steps, over (S2 - S1) steps and
# the 2 ranks (what start-up and the first steps fault in cancels out).
#
#   bench/pipeline_faults.sh [--steps1 N] [--steps2 N] [--build DIR] [VAR=VALUE ...]
#
# Each VAR=VALUE argument is one variant run with that environment (e.g.
# TANDEM_P2P_UNEXPECTED_BYTES=0 for none held, =64M for a 64 MiB cap on every
# communicator); "default" runs the environment as it is. Counts page faults,
# not time: it need not go through the benchmark lane.
set -u
cd "$(dirname "$0")/.."
s1=3; s2=9; B=${BUILD:-build}
variants=()
while [ $# -gt 0 ]; do
  case "$1" in
  --steps1) s1=$2; shift 2 ;;
  --steps2) s2=$2; shift 2 ;;
  --build) B=$2; shift 2 ;;
  *=* | default) variants+=("$1"); shift ;;
  *) echo "usage: bench/pipeline_faults.sh [--steps1 N] [--steps2 N] [--build DIR] [VAR=VALUE|default ...]" >&2; exit 2 ;;
  esac
done
[ "$s2" -gt "$s1" ] || { echo "bench/pipeline_faults.sh: --steps2 must be above --steps1" >&2; exit 2; }
[ ${#variants[@]} -gt 0 ] || variants=(default)
[ -x /usr/bin/time ] || { echo "bench/pipeline_faults.sh: needs GNU time (/usr/bin/time)" >&2; exit 1; }
ref="--layers 4 --channels 256 --heads 4 --seq 128 --threads 1 --sample 0 --micro-batch 4 --pipeline-parallel 2"
faults() { # VARIANT STEPS SCHEDULE_FLAGS...: minor faults of the whole run (tandemrun and its ranks)
  local v=$1 n=$2 f
  shift 2
  f=$(mktemp /tmp/tandem-faults-XXXXXX)
  # shellcheck disable=SC2086
  env ${v/#default/} /usr/bin/time -f "%R" -o "$f" "$B/bin/tandemrun" -np 2 "$B/bin/train-gpt" $ref --steps "$n" "$@" \
    >/dev/null 2>&1 || { echo "bench/pipeline_faults.sh: $v $* failed" >&2; rm -f "$f"; exit 1; }
  tail -1 "$f"
  rm -f "$f"
}
echo "| schedule | variant | faults at $s1 steps | at $s2 steps | per rank per step |"
echo "|---|---|---|---|---|"
for sched in "1f1b|--grad-accum 8" "interleaved x2|--grad-accum 8 --pipeline-schedule interleaved --pipeline-chunks 2"; do
  IFS='|' read -r name flags <<<"$sched"
  for v in "${variants[@]}"; do
    # shellcheck disable=SC2086
    a=$(faults "$v" "$s1" $flags) && b=$(faults "$v" "$s2" $flags) || exit 1
    echo "| $name m=8 | $v | $a | $b | $(awk -v a="$a" -v b="$b" -v n=$((s2 - s1)) 'BEGIN { printf "%.0f", (b - a) / n / 2 }') |"
  done
done
