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
LOSS_S=${LOSS_S:-5}
EVICT_BY=${EVICT_BY:-4}
NAME=lossy NET=10.77.17 TAG=fl
. "$(dirname "$0")/elastic_job.sh"
unset TANDEM_EVICT_WINDOW TANDEM_EVICT_RETRANS TANDEM_EVICT_STALL TANDEM_EVICT_CLEAN
export TANDEM_EVICT=1 # opt-in (docs/elastic.md)

start_elastic_job
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
wait_grown 30 || fail "the job did not grow back to 4 ranks within 30 s of b being let back"
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
fault_free_compare
echo "PASS(faulthosts lossy): host b at 50% loss evicted $evict_s s after the loss began (a never), let back and grown to 4 ranks; loss between a and b from step $s2: nobody evicted; the losses of steps 1-$S bit for bit the fault-free run's"
