# Sourced by the eviction tests (lossy.sh, evict_restore.sh): an elastic
# 4-rank train-gpt job on 2 namespace hosts a and b (2 ranks each, own
# sshd), tandemrun on a third host l that holds the store, its output
# stamped with each line's arrival time in $work/out; and the bit-for-bit
# comparison with a fault-free run of the same job. Root; everything is
# removed on exit, also after a failure.
#
#   NAME=lossy NET=10.77.17 TAG=fl . elastic_job.sh   (with B = the build tree)
#
# NET is the hosts' /24 (a .1, b .2, l .9), TAG the namespaces' prefix: each
# test its own, so that two can run side by side. Gives A, Bh, RUN, GPT,
# ARGS, work, job and the functions below.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
. "$here/../lib/sshhosts.sh"
RUN=$(cd "$repo/$B/bin" 2>/dev/null && pwd)/tandemrun
GPT=$(dirname "$RUN")/train-gpt
STEPS=1000000 # never reached: both runs are stopped (fault_free_compare)
work=$(mktemp -d "/tmp/td-faulthosts-$NAME-XXXXXX")
job=
NETNS_TAG_PREFIX=$TAG
NETNS_ON_EXIT='[ -n "$job" ] && kill -9 -- "-$job" 2>/dev/null; rm -rf "$work"'
fail() {
  echo "FAIL(faulthosts $NAME): $*"
  [ -f "$work/out" ] && grep -v " step [0-9]* loss" "$work/out" | tail -30
  exit 1
}
sshhosts_init "$work/ssh"
A=$NET.1
Bh=$NET.2
sshhosts_add a $A
sshhosts_add b $Bh
netns_add_host l $NET.9
export TANDEM_PROGRESS=plain TANDEM_HEARTBEAT_TIMEOUT=2 TANDEM_HEARTBEAT_INTERVAL=0.25 TANDEM_HEARTBEAT_MIN_TIMEOUT=0.5
export TANDEM_ELASTIC_SETTLE=3 TANDEM_DISCOVERY_INTERVAL=0.1
ARGS="--layers 2 --channels 64 --heads 2 --seq 64 --threads 1 --sample 0 --micro-batch 3 --steps $STEPS"
printf '%s:2\n%s:2\n' $A $Bh >"$work/hosts"
printf '#!/bin/sh\ncat %s\n' "$work/hosts" >"$work/discover"
chmod +x "$work/discover"
cat >"$work/stamp.py" <<'PY'
import sys, time
for line in sys.stdin:
    sys.stdout.write("%.3f %s" % (time.time(), line))
    sys.stdout.flush()
PY
start_job() { # OUTFILE TANDEMRUN-ARGS...
  local file=$1
  shift
  : >"$file"
  netns_spawn l setsid bash -c '"$@" 2>&1 | /usr/bin/python3 -u "'"$work/stamp.py"'" >"'"$file"'"; echo "${PIPESTATUS[0]}" >"'"$file.rc"'"' _ "$@"
  job=$NETNS_PID
}
start_elastic_job() { # the job under test
  start_job "$work/out" "$RUN" --min-np 2 --max-np 4 -np 4 --max-restarts 8 --host-discovery-script "$work/discover" \
    "$GPT" $ARGS
}
wait_line() { # PATTERN SECONDS: 0 found
  local _
  for _ in $(seq 1 $(($2 * 20))); do
    grep -q -- "$1" "$work/out" && return 0
    kill -0 "$job" 2>/dev/null || { grep -q -- "$1" "$work/out"; return; }
    sleep 0.05
  done
  return 1
}
last_step() { tail -n 300 "$work/out" | sed -n 's/.*train-gpt: step \([0-9]*\) loss.*/\1/p' | tail -1; }
last_at_four() { [ "$(tail -n 200 "$work/out" | grep "train-gpt: step " | tail -1 | grep -c "world 4 epoch")" = 1 ]; }
# Grown back: a step at 4 ranks computed after a 4-rank epoch formed after b
# was let back. Rank 0 prints the step an epoch starts from again as the
# epoch forms ("step X loss ... world 4"), before any rank of it has
# stepped: that line alone is no proof (the official CI of stop 31 took it
# for one; a fault applied then hit the joiners' connection set-up).
at_four() {
  local from
  from=$(sed -n "/tandemrun: host $Bh's link has been clean for/,\$ s/.*train-gpt: elastic epoch [0-9]*: world=4 .* from step \\([0-9]*\\).*/\\1/p" "$work/out" | tail -1)
  [ -n "$from" ] && [ "$(last_step)" -gt "$from" ] && last_at_four
}
wait_grown() { # SECONDS
  local _
  for _ in $(seq 1 $(($1 * 20))); do
    at_four && return 0
    sleep 0.05
  done
  return 1
}
# Stops the job at its last step S, then runs the same job without faults
# (same --steps, so the same schedule) until it printed step S: every step
# 1..S, each time the job printed it (a step computed again after a fault is
# printed again), must have the fault-free run's loss, bit for bit. The
# job's length follows the test's phases, not a step count a fast machine
# finishes early (ci38). Sets S.
fault_free_compare() {
  S=$(last_step)
  kill -TERM -- "-$job" 2>/dev/null
  wait "$job"
  job=
  losses() { sed -n 's/.*\] train-gpt: step \([0-9]*\) loss \([^ ]*\) .*/\1 \2/p' "$1"; }
  losses "$work/out" >"$work/faulty.losses"
  cp "$work/out" "$work/faulty.out"
  start_job "$work/out" "$RUN" --min-np 2 --max-np 4 -np 4 -H $A:2,$Bh:2 "$GPT" $ARGS
  wait_line "train-gpt: step $S loss" 300 || fail "the fault-free run did not reach step $S"
  kill -TERM -- "-$job" 2>/dev/null
  wait "$job"
  job=
  losses "$work/out" >"$work/ref.losses"
  awk -v S="$S" 'NR == FNR { if ($1 <= S) ref[$1] = $2; next }
    $1 <= S { seen[$1] = 1; if (!($1 in ref) || ref[$1] != $2) { print "step " $1 ": " $2 " vs fault-free " ref[$1]; bad++ } }
    END { for (i = 1; i <= S; i++) if (!(i in ref) || !(i in seen)) { print "step " i " missing"; bad++; break }
          exit bad > 0 }' "$work/ref.losses" "$work/faulty.losses" >"$work/diff" ||
    fail "losses differ from the fault-free run's: $(head -3 "$work/diff")"
  grep -q "tandemrun: evicting host" "$work/out" && fail "the fault-free run evicted a host"
}
