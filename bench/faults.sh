#!/usr/bin/env bash
# Fault injection against an elastic train-gpt job (issue 10), on this host.
#
#   bench/faults.sh [FAULTS] [BUILD]      (default 12 faults, build/)
#   TAG=NAME bench/faults.sh ...          results file faults-DATE-NAME.md
#   ZERO=S bench/faults.sh ...            the job at ZeRO stage S (1-3: lost
#                                         shards come from buddy replicas)
#
# One 4-rank elastic job (tandemrun --min-np 2 --max-np 4, a replacement
# for every loss) takes FAULTS faults, round robin over these kinds:
#   kill     kill -9 of a process that is not rank 0
#   kill0    kill -9 of rank 0's process (the oldest live one)
#   stop     SIGSTOP of a process (found by TCP heartbeats; the others go on
#            without it after TANDEM_ELASTIC_SETTLE; it is killed afterwards)
#   grow     the discovery script offers one slot fewer, a process is
#            killed (the job shrinks to 3), then 4 slots again (scale-up)
# After each fault the script waits until the job is back at 4 ranks and a
# few steps on. For each fault it records the time from the fault to the
# next completed step (the first step line of the new epoch) and the steps
# lost (steps completed before the fault that had to be computed again:
# last step reported before the fault - first step of the new epoch). A
# fault-free run of the same job gives the reference final loss and
# parameter hash: the faulty run must match it bit for bit (the world size
# is 4 again whenever it ends). Results: bench/results/faults-DATE.md.
#
# Not covered yet (issue 10): faults across namespace hosts (link cut, tc
# netem loss, a whole host lost), the non-elastic comparison, 200 faults.
set -u
cd "$(dirname "$0")/.."
FAULTS=${1:-12}
B=${2:-build}
RUN="$B/bin/tandemrun"
GPT="$B/bin/train-gpt"
work=$(mktemp -d /tmp/tandem-faults-XXXXXX)
bg=
cleanup() {
  [ -n "$bg" ] && kill -9 -- "-$bg" 2>/dev/null
  [ -n "${KEEP:-}" ] && echo "kept $work" || rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
export TANDEM_PROGRESS=plain TANDEM_TRANSPORT=tcp TANDEM_HEARTBEAT_TIMEOUT=2 TANDEM_HEARTBEAT_INTERVAL=0.25
export TANDEM_ELASTIC_SETTLE=3 TANDEM_DISCOVERY_INTERVAL=0.1
STEPS=$(( 300 + FAULTS * 300 ))
ZERO=${ZERO:-0}
ARGS="--layers 2 --channels 64 --heads 2 --seq 64 --threads 1 --sample 0 --micro-batch 3 --steps $STEPS --zero-stage $ZERO"
out="$work/out"
echo localhost:4 >"$work/hosts"
printf '#!/bin/sh\ncat %s\n' "$work/hosts" >"$work/discover"
chmod +x "$work/discover"
# Timestamp every output line (seconds since the epoch), so that faults and
# steps can be put on one clock.
cat >"$work/stamp.py" <<'PY'
import sys, time
for line in sys.stdin:
    sys.stdout.write("%.3f %s" % (time.time(), line))
    sys.stdout.flush()
PY

now() { date +%s.%N; }
wait_for() { # wait_for PATTERN SECONDS: 0 found, 1 not in time (a hang), 2 the job ended
  local n=$(( $2 * 20 ))
  for _ in $(seq 1 "$n"); do
    grep -q -- "$1" "$out" && return 0
    kill -0 "$bg" 2>/dev/null || { grep -q -- "$1" "$out" && return 0; ended=1; return 2; }
    sleep 0.05
  done
  echo "faults.sh: '$1' did not appear within $2 s (a hang?)" >&2
  return 1
}
ended=0
last_step() { sed -n 's/.*train-gpt: step \([0-9]*\) loss.*/\1/p' "$out" | tail -1; }
pid_of() { sed -n "s/.*elastic process $1 (pid \([0-9]*\)).*/\1/p" "$out" | head -1; }
epochs() { grep -c "elastic epoch [0-9]*:" "$out"; }

echo "fault-free reference run ($STEPS steps)..."
"$RUN" --min-np 2 --max-np 4 -np 4 "$GPT" $ARGS 2>&1 | grep "final_loss_exact" >"$work/ref"
ref=$(sed -n 's/.*final_loss_exact=\([^ ]*\) params_hash=\([^ ]*\).*/\1 \2/p' "$work/ref")

setsid bash -c "'$RUN' --min-np 2 --max-np 4 -np 4 --max-restarts $(( FAULTS * 2 )) --host-discovery-script '$work/discover' '$GPT' $ARGS 2>&1 | /usr/bin/python3 -u '$work/stamp.py' >'$out'" &
bg=$!
alive=(0 1 2 3)
kinds=(kill kill0 stop grow)
hangs=0
: >"$work/records"
wait_for "train-gpt: step 20 loss" 120 || hangs=$((hangs + 1))
for ((f = 0; f < FAULTS && hangs == 0 && ended == 0; f++)); do
  kind=${kinds[$((f % ${#kinds[@]}))]}
  # Which processes are alive: the launch numbers printed, minus the lost.
  mapfile -t ids < <(sed -n 's/.*elastic process \([0-9]*\) (pid.*/\1/p' "$out" | sort -n -u)
  live=()
  for id in "${ids[@]}"; do
    [ -e "$work/lost.$id" ] || live+=("$id")
  done
  case $kind in
  kill0) victim=${live[0]} ;;
  *) victim=${live[$(( 1 + RANDOM % (${#live[@]} - 1) ))]} ;;
  esac
  e0=$(epochs)
  before=$(last_step)
  if [ "$kind" = grow ]; then
    echo localhost:3 >"$work/hosts"
    wait_for "discovered hosts now: localhost:3" 30 || { [ $? = 1 ] && hangs=$((hangs + 1)); break; }
  fi
  t_fault=$(now)
  pid=$(pid_of "$victim")
  if [ "$kind" = stop ]; then kill -STOP "$pid"; else kill -9 "$pid"; fi
  touch "$work/lost.$victim"
  wait_for "elastic epoch $((e0 + 1)):" 60 || { [ $? = 1 ] && hangs=$((hangs + 1)); break; }
  [ "$kind" = stop ] && kill -9 "$pid"
  [ "$kind" = grow ] && echo localhost:4 >"$work/hosts"
  # Back at 4 ranks and a few steps later.
  for _ in $(seq 1 1200); do
    tail -1 "$out" | grep -q "world 4 epoch" && break
    sleep 0.05
  done
  sleep 0.3
  # The first step of the new epoch: its number and time.
  line=$(grep "elastic epoch $((e0 + 1)):" "$out" | head -1)
  from=$(echo "$line" | sed -n 's/.* from step \([0-9]*\).*/\1/p')
  t_next=$(awk -v s=$((from + 1)) -v t="$t_fault" '$0 ~ "train-gpt: step " s " loss" && $1 >= t { print $1; exit }' "$out")
  lost=$(( before > from ? before - from : 0 ))
  echo "$kind $victim $t_fault $t_next $lost" >>"$work/records"
  echo "fault $((f + 1))/$FAULTS: $kind of process $victim at step $before: next step after $(awk -v a="$t_fault" -v b="$t_next" 'BEGIN { printf "%.2f", b - a }') s, steps lost $lost"
done
wait "$bg"
rc=$?
bg=
got=$(sed -n 's/.*final_loss_exact=\([^ ]*\) params_hash=\([^ ]*\).*/\1 \2/p' "$out")
same=no
[ -n "$ref" ] && [ "$ref" = "$got" ] && same=yes

mkdir -p bench/results
res="bench/results/faults-$(date -u +%Y-%m-%d)${TAG:+-$TAG}$([ "$ZERO" != 0 ] && echo "-zero$ZERO").md"
{
  echo "# Elastic fault injection, $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  echo "Command: \`ZERO=$ZERO bench/faults.sh $FAULTS $B\`; machine: $(nproc) cores, load before: $(cut -d' ' -f1-3 /proc/loadavg)."
  echo "Job: train-gpt $ARGS, 4 ranks on this host over TCP (heartbeat timeout 2 s, settle 3 s), tandemrun --min-np 2 --max-np 4."
  echo
  echo "| kind | faults | fault -> next step median (s) | p95 (s) | max (s) | steps lost (total) |"
  echo "|---|---|---|---|---|---|"
  for k in "${kinds[@]}" all; do
    awk -v k="$k" '($1 == k || k == "all") && $4 != "" { n++; d[n] = $4 - $3; lost += $5 }
      END {
        if (!n) { printf "| %s | 0 | | | | |\n", k; exit }
        for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (d[j] < d[i]) { t = d[i]; d[i] = d[j]; d[j] = t }
        p95 = d[int(0.95 * (n - 1)) + 1 + ((0.95 * (n - 1)) > int(0.95 * (n - 1)))]
        med = n % 2 ? d[(n + 1) / 2] : (d[n / 2] + d[n / 2 + 1]) / 2
        printf "| %s | %d | %.2f | %.2f | %.2f | %d |\n", k, n, med, p95, d[n], lost }' "$work/records"
  done
  echo
  echo "Faults injected: $f of $FAULTS$([ $ended = 1 ] && echo " (the job finished first: the machine was slower than the script)")."
  echo "Hangs (a fault after which no new epoch formed within 60 s): $hangs. tandemrun exit code: $rc."
  echo "Bit-identical is expected for every kind, also 'stop' and 'grow', which run some steps at 3 ranks: elastic"
  echo "training sums every step in one order whatever the world size (deterministic reduction, src/train/deterministic/)."
  echo "Final loss and parameter hash, fault-free: \`$ref\`; with faults: \`$got\`; bit-identical: $same."
} >"$res"
cat "$res"
