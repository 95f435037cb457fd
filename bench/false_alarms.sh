#!/usr/bin/env bash
# False alarms of the elastic failure detection under load (issue 22 item
# 6): an elastic 4-rank train-gpt job over TCP with the fast detection
# settings (TANDEM_HEARTBEAT_TIMEOUT=2, TANDEM_HEARTBEAT_INTERVAL=0.25,
# TANDEM_ELASTIC_SETTLE=3) trains for SECONDS while HOGS busy loops
# (plain shell loops, normal priority) compete with it for the CPUs,
# beside whatever else the machine runs. No fault is injected, so every
# membership change is a false alarm: counted from the job's epochs,
# heartbeat-loss lines and "fell silent" reports.
#
#   bench/false_alarms.sh [SECONDS] [HOGS] [BUILD]   (default 600 s, 2 hogs, build/)
#   MINHB=S ...     TANDEM_HEARTBEAT_MIN_TIMEOUT (0.5: adaptive timeouts
#                   between 0.5 s and HB, as bench/faults_hosts.sh; "": fixed)
#   HB=S ...        TANDEM_HEARTBEAT_TIMEOUT (2), the adaptive timeouts' cap
#   SUFFIX=TEXT ... appended to the result's file name
#
# Writes bench/results/false-alarms-DATE.md (RESULTS=DIR to change).
set -u
SECS=${1:-600}
HOGS=${2:-2}
B=${3:-build}
cd "$(dirname "$0")/.."
results=${RESULTS:-bench/results}
MINHB=${MINHB-0.5}
HB=${HB:-2}
commit=$(git rev-parse --short HEAD 2>/dev/null) # now: the tree may move on during the run
work=$(mktemp -d /tmp/tandem-falsealarm-XXXXXX)
hogs=
job=
cleanup() {
  [ -n "$hogs" ] && kill $hogs 2>/dev/null
  [ -n "$job" ] && kill -9 "$job" $(pgrep -P "$job") 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
export TANDEM_PROGRESS=plain TANDEM_TRANSPORT=tcp TANDEM_HEARTBEAT_TIMEOUT=$HB TANDEM_HEARTBEAT_INTERVAL=0.25
export TANDEM_ELASTIC_SETTLE=3 TANDEM_LOG=info
[ -n "$MINHB" ] && export TANDEM_HEARTBEAT_MIN_TIMEOUT=$MINHB
for _ in $(seq 1 "$HOGS"); do
  (while :; do :; done) &
  hogs="$hogs $!"
done
load0=$(cut -d' ' -f1-3 /proc/loadavg)
t0=$(date +%s)
# More steps than can finish: the job is stopped (SIGTERM) after SECS.
"$B/bin/tandemrun" --min-np 1 --max-np 4 -np 4 --max-restarts 0 --timeout "$SECS" "$B/bin/train-gpt" \
  --layers 2 --channels 64 --heads 2 --seq 64 --threads 1 --sample 0 --micro-batch 3 --steps 100000000 \
  >"$work/out" 2>&1 &
job=$!
wait "$job"
rc=$?
job=
t1=$(date +%s)
load1=$(cut -d' ' -f1-3 /proc/loadavg)
kill $hogs 2>/dev/null
hogs=
steps=$(sed -n 's/.*train-gpt: step \([0-9]*\) loss.*/\1/p' "$work/out" | tail -1)
epochs=$(grep -c "elastic epoch [0-9]*:" "$work/out")
silent=$(grep -c "sent no heartbeat" "$work/out")
fell=$(grep -c "fell silent" "$work/out")
lost=$(grep -c "the job goes on with" "$work/out")
alarms=$((epochs - 1))
mkdir -p "$results"
res="$results/false-alarms-$(date -u +%Y-%m-%d)${SUFFIX:-}.md"
{
  echo "# False alarms under load: $((t1 - t0)) s of elastic training beside $HOGS CPU hogs ($(date -u +%Y-%m-%d))"
  echo
  echo "Command: \`HB=$HB MINHB=$MINHB bench/false_alarms.sh $SECS $HOGS $B\` on $(nproc) cores (commit $commit), shared with other users' builds and"
  echo "tests; load average before $load0, after $load1. Job: tandemrun --min-np 1 --max-np 4 -np 4, train-gpt"
  echo "--layers 2 --channels 64 --seq 64 --micro-batch 3 over TCP, TANDEM_HEARTBEAT_TIMEOUT=$HB,"
  echo "TANDEM_HEARTBEAT_INTERVAL=0.25, TANDEM_ELASTIC_SETTLE=3$([ -n "$MINHB" ] && echo ", TANDEM_HEARTBEAT_MIN_TIMEOUT=$MINHB (adaptive)"); stopped by --timeout (exit $rc: 124 expected)."
  echo
  echo "| seconds | steps | membership changes (false alarms) | heartbeat-loss lines | silent reports | processes lost |"
  echo "|---|---|---|---|---|---|"
  echo "| $((t1 - t0)) | ${steps:-0} | $alarms | $silent | $fell | $lost |"
  if [ "$alarms" != 0 ] || [ "$silent" != 0 ]; then
    echo
    echo '```'
    grep -E "sent no heartbeat|elastic epoch|fell silent|goes on with" "$work/out" | head -20
    echo '```'
  fi
} >"$res"
cat "$res"
[ "$alarms" = 0 ] && [ "$silent" = 0 ]
