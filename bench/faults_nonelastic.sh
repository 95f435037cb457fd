#!/usr/bin/env bash
# The faults of bench/faults.sh against the NON-elastic job (tandemrun -np 4,
# the same train-gpt, TCP with the same heartbeat settings), for comparison:
# how each fault ends the job (exit code, seconds from the fault to the
# job's end, tandemrun's last line). Writes bench/results/faults-nonelastic-DATE.md.
#
#   bench/faults_nonelastic.sh [BUILD]
#
# Ranks are tandemrun's children in start order (rank 0 is the first).
# "grow" (new slots) does not apply: a non-elastic job has a fixed size.
set -u
cd "$(dirname "$0")/.."
B=${1:-build}
RUN="$B/bin/tandemrun"
GPT="$B/bin/train-gpt"
work=$(mktemp -d /tmp/tandem-el2-nonel-XXXXXX)
bg=
cleanup() {
  [ -n "$bg" ] && kill -9 -- "-$bg" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 143' TERM INT
export TANDEM_PROGRESS=plain TANDEM_TRANSPORT=tcp TANDEM_HEARTBEAT_TIMEOUT=2 TANDEM_HEARTBEAT_INTERVAL=0.25
ARGS="--layers 2 --channels 64 --heads 2 --seq 64 --threads 1 --sample 0 --micro-batch 3 --steps 1000000"
: >"$work/rows"
for kind in kill kill0 stop; do
  setsid "$RUN" -np 4 "$GPT" $ARGS >"$work/out" 2>&1 &
  bg=$!
  for _ in $(seq 1 1200); do grep -q "step 25/" "$work/out" && break; sleep 0.05; done
  launcher=$(pgrep -P "$bg" -x tandemrun || echo "$bg")
  mapfile -t ranks < <(pgrep -P "$launcher" | sort -n)
  victim=${ranks[1]}
  [ "$kind" = kill0 ] && victim=${ranks[0]}
  t0=$(date +%s.%N)
  if [ "$kind" = stop ]; then kill -STOP "$victim"; else kill -9 "$victim"; fi
  ended=no
  for _ in $(seq 1 1200); do kill -0 "$bg" 2>/dev/null || { ended=yes; break; }; sleep 0.05; done
  t1=$(date +%s.%N)
  rc=-
  if [ $ended = yes ]; then wait "$bg"; rc=$?; else kill -9 -- "-$bg"; wait "$bg" 2>/dev/null; fi
  [ "$kind" = stop ] && kill -9 "$victim" 2>/dev/null
  bg=
  why=$(grep -E "tandemrun:|error" "$work/out" | grep -v "step " | head -1 | cut -c1-220 | tr '|' '/')
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
  echo "| $kind | $([ $ended = yes ] && echo "ends, exit $rc" || echo "still running after 60 s") | $secs | \`$why\` |" | tee -a "$work/rows"
done
mkdir -p bench/results
res="bench/results/faults-nonelastic-$(date -u +%Y-%m-%d).md"
{
  echo "# Faults against the non-elastic job, $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  echo "Command: \`bench/faults_nonelastic.sh $B\`; load before the last run: $(cut -d' ' -f1-3 /proc/loadavg)."
  echo "Job: tandemrun -np 4 train-gpt $ARGS over TCP (heartbeat timeout 2 s); the fault after step 25."
  echo
  echo "| fault | how the job ends | seconds from fault to the end | first error line |"
  echo "|---|---|---|---|"
  cat "$work/rows"
  echo "| grow | does not apply (fixed size) | | |"
} >"$res"
cat "$res"
