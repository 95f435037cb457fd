#!/usr/bin/env bash
# Elastic jobs on disk (issue 22 item 5): the whole job (every rank and
# tandemrun, SIGKILL) killed at random steps KILLS times (kill 2 inside a
# save) and restarted from its last checkpoint at world sizes 4 3 2 1 4 2 3
# in turn; after every kill a completion from a copy of the checkpoint at
# the next world size must end with the uninterrupted run's final loss and
# parameter hash, and so must the chain's last run (tests/elastic/disk.sh
# does the work and the checks; the suite's elastic_disk runs 3 kills).
#
#   bench/elastic_disk.sh [KILLS] [BUILD] [SEED]   (default 20 kills, build/, seed 2211)
#
# Writes bench/results/elastic-disk-DATE.md (RESULTS=DIR to change).
set -u
KILLS=${1:-20}
B=${2:-build}
SEED=${3:-2211}
cd "$(dirname "$0")/.."
results=${RESULTS:-bench/results}
out="$results/elastic-disk-$(date -u +%Y-%m-%d).md"
lines=$(mktemp)
log=$(mktemp)
trap 'rm -f "$lines" "$log"' EXIT
t0=$(date +%s)
tests/elastic/disk.sh "$B" "$KILLS" "$SEED" "$lines" >"$log" 2>&1
rc=$?
t1=$(date +%s)
{
  echo "# Elastic jobs on disk: $KILLS whole-job kills and restarts ($(date -u +%Y-%m-%d))"
  echo
  echo "Command: \`bench/elastic_disk.sh $KILLS $B $SEED\` on $(nproc) cores ($(uname -m)), $((t1 - t0)) s in all;"
  echo "train-gpt --layers 1 --channels 32 --heads 2 --seq 32 --micro-batch 3 --steps max(150, 30 x (kills + 2)), global batch 12,"
  echo "--save-every 7 --keep-last 2 --metrics, tandemrun --min-np 1 --max-np 4."
  echo
  echo "Result: $(tail -1 "$log") (exit $rc)"
  echo
  echo "Each kill: the step (or the save) it hit, the checkpoint \`latest\` named after it (and before the run),"
  echo "and the completion from a copy of it at the next world size against the uninterrupted run:"
  echo
  echo '```'
  grep -E "^(uninterrupted|final run|metrics)" "$log" | head -1
  cat "$lines"
  grep -E "^(final run|metrics)" "$log"
  echo '```'
} >"$out"
cat "$out"
[ $rc = 0 ] || { echo "---- log:"; tail -30 "$log"; }
exit $rc
