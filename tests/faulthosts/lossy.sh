#!/usr/bin/env bash
# Eviction of a host whose link is lossy (issue 22; docs/elastic.md "Lossy
# links"): an elastic 4-rank train-gpt job on 2 namespace hosts (2 ranks
# each, own sshd), tandemrun on a third host that holds the store. Root;
# everything is removed on exit, also after a failure.
#
#   lossy.sh B
#
# 1. Half of host b's packets dropped both ways (iptables) for LOSS_S s:
#    each side of the bad link sees the other stall, but from tandemrun's
#    host only b's connections retransmit: b is evicted within EVICT_BY s
#    of the loss's start (the job goes on at 2 ranks on a), host a never
#    is; once b's link has been clean for TANDEM_EVICT_CLEAN, the job
#    grows back to 4 ranks.
# 2. Half of the packets between a and b dropped (on a, only to and from
#    b's address): both hosts see their peers stall, i.e. the loss is in
#    the healthy side's view too, but tandemrun's links to both are clean:
#    nobody is evicted (the ranks' own heartbeats may still end an epoch).
# 3. Every step's loss equals the fault-free run's, bit for bit: the job is
#    stopped after 2. at its last step S, and a fault-free run of the same
#    job (same --steps, so the same schedule) is stopped once it printed
#    step S. The job's length follows the phases, not a step count that a
#    fast machine finishes before b is let back (ci38: 1500 steps ended 7 s
#    after the eviction, before b's link had been clean for 3 s).
set -u
B=$1
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
. "$here/../lib/sshhosts.sh"
RUN=$(cd "$repo/$B/bin" 2>/dev/null && pwd)/tandemrun
GPT=$(dirname "$RUN")/train-gpt
LOSS_S=${LOSS_S:-5}
EVICT_BY=${EVICT_BY:-4}
STEPS=1000000 # never reached: both runs are stopped (3.)
work=$(mktemp -d /tmp/td-faulthosts-lossy-XXXXXX)
job=
NETNS_TAG_PREFIX=fl
NETNS_ON_EXIT='[ -n "$job" ] && kill -9 -- "-$job" 2>/dev/null; rm -rf "$work"'
fail() {
  echo "FAIL(faulthosts lossy): $*"
  [ -f "$work/out" ] && grep -v " step [0-9]* loss" "$work/out" | tail -25
  exit 1
}
sshhosts_init "$work/ssh"
A=10.77.17.1
Bh=10.77.17.2
sshhosts_add a $A
sshhosts_add b $Bh
netns_add_host l 10.77.17.9
export TANDEM_PROGRESS=plain TANDEM_HEARTBEAT_TIMEOUT=2 TANDEM_HEARTBEAT_INTERVAL=0.25 TANDEM_HEARTBEAT_MIN_TIMEOUT=0.5
export TANDEM_ELASTIC_SETTLE=3 TANDEM_DISCOVERY_INTERVAL=0.1
unset TANDEM_EVICT_WINDOW TANDEM_EVICT_RETRANS TANDEM_EVICT_STALL TANDEM_EVICT_CLEAN
export TANDEM_EVICT=1 # opt-in (docs/elastic.md)
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
wait_line() { # PATTERN SECONDS: 0 found
  local _
  for _ in $(seq 1 $(($2 * 20))); do
    grep -q -- "$1" "$work/out" && return 0
    kill -0 "$job" 2>/dev/null || { grep -q -- "$1" "$work/out"; return; }
    sleep 0.05
  done
  return 1
}
last_step() { tail -n 200 "$work/out" | sed -n 's/.*train-gpt: step \([0-9]*\) loss.*/\1/p' | tail -1; }
# Grown back: a step at 4 ranks computed after the 4-rank epoch formed.
# Rank 0 prints the step an epoch starts from again as the epoch forms
# ("step X loss ... world 4"), before any rank of it has stepped: that
# line alone is no proof (a-b loss applied then hit the joiners' connection
# set-up, and the job, rightly, made no step until after it).
# Only epochs formed after b was let back count (the first epoch had 4 ranks).
at_four() {
  local from
  from=$(sed -n "/tandemrun: host $Bh's link has been clean for/,\$ s/.*train-gpt: elastic epoch [0-9]*: world=4 .* from step \\([0-9]*\\).*/\\1/p" "$work/out" | tail -1)
  [ -n "$from" ] && [ "$(last_step)" -gt "$from" ] &&
    [ "$(tail -n 200 "$work/out" | grep "train-gpt: step " | tail -1 | grep -c "world 4 epoch")" = 1 ]
}

start_job "$work/out" "$RUN" --min-np 2 --max-np 4 -np 4 --max-restarts 8 --host-discovery-script "$work/discover" \
  "$GPT" $ARGS
wait_line "train-gpt: step 40 loss" 120 || fail "the job did not reach step 40 within 120 s"

# 1. b lossy.
t0=$(date +%s.%N)
sshhosts_loss b 0.5
wait_line "tandemrun: evicting host $Bh: its link is lossy" "$EVICT_BY"
found=$?
sleep "$(awk -v t="$t0" -v l="$LOSS_S" -v n="$(date +%s.%N)" 'BEGIN { s = l - (n - t); if (s < 0) s = 0; print s }')"
sshhosts_loss b 0
[ $found = 0 ] || fail "host b (50% loss) was not evicted within $EVICT_BY s of the loss's start"
t_ev=$(awk '/tandemrun: evicting host '"$Bh"'/ { print $1; exit }' "$work/out")
evict_s=$(awk -v a="$t0" -v b="$t_ev" 'BEGIN { printf "%.2f", b - a }')
grep -q "tandemrun: evicting host $A" "$work/out" && fail "the healthy host a was evicted"
grep -Eq "elastic epoch [0-9]+: world=2 " "$work/out" || fail "no epoch at 2 ranks after b's eviction"
wait_line "tandemrun: host $Bh's link has been clean for" 30 || fail "b was not let back within 30 s of its link being clean"
grown=0
for _ in $(seq 1 600); do at_four && grown=1 && break; sleep 0.05; done
[ $grown = 1 ] || fail "the job did not grow back to 4 ranks within 30 s of b being let back"
n_before=$(grep -c "tandemrun: evicting host" "$work/out")

# 2. The link between a and b lossy (on a, to and from b only): both
# hosts see the loss, tandemrun's links to both are clean.
s2=$(last_step)
ns=$(netns_name a)
ip netns exec "$ns" iptables -A INPUT -s $Bh -m statistic --mode random --probability 0.5 -j DROP || fail "iptables on a"
ip netns exec "$ns" iptables -A OUTPUT -d $Bh -m statistic --mode random --probability 0.5 -j DROP || fail "iptables on a"
sleep "$LOSS_S"
sshhosts_loss a 0
# The job steps again once TCP's backed-off retransmits get through and, if
# the ranks' heartbeats ended the epoch during the loss (likely with the
# adaptive timeouts at 50% loss), once a new epoch has formed: wait for a
# step after s2, for up to 30 s, not a fixed 2 s (the official CI failed
# here after 2 s), then 2 s more in which nobody may be evicted.
for _ in $(seq 1 600); do
  S=$(last_step)
  [ -n "$S" ] && [ "$S" -gt "$s2" ] && break
  sleep 0.05
done
S=$(last_step)
[ -n "$S" ] && [ "$S" -gt "$s2" ] ||
  fail "no step within 30 s after the a-b loss ended (last step ${S:-none}, before the loss $s2)"
sleep 2
[ "$(grep -c "tandemrun: evicting host" "$work/out")" = "$n_before" ] ||
  fail "a host was evicted for a loss between a and b, which tandemrun's links do not show: $(grep "tandemrun: evicting host" "$work/out" | tail -1)"

# 3. Stop the job at its last step S; the fault-free run up to step S.
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
# every step 1..S of the fault-free run, and every time the job printed that
# step (a step computed again after a fault is printed again), the same loss
awk -v S="$S" 'NR == FNR { if ($1 <= S) ref[$1] = $2; next }
  $1 <= S { seen[$1] = 1; if (!($1 in ref) || ref[$1] != $2) { print "step " $1 ": " $2 " vs fault-free " ref[$1]; bad++ } }
  END { for (i = 1; i <= S; i++) if (!(i in ref) || !(i in seen)) { print "step " i " missing"; bad++; break }
        exit bad > 0 }' "$work/ref.losses" "$work/faulty.losses" >"$work/diff" ||
  fail "losses differ from the fault-free run's: $(head -3 "$work/diff")"
grep -q "tandemrun: evicting host" "$work/out" && fail "the fault-free run evicted a host"
echo "PASS(faulthosts lossy): host b at 50% loss evicted $evict_s s after the loss began (a never), let back and grown to 4 ranks; loss between a and b from step $s2: nobody evicted; the losses of steps 1-$S bit for bit the fault-free run's"
