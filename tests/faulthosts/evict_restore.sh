#!/usr/bin/env bash
# An evicted host whose processes still run, restored with leftover
# retransmissions on its link (issue 22; the hang of the s25 200-fault run,
# bench/results/faults-hosts-2026-11-28-200-evict-hang.md). An elastic
# 4-rank train-gpt job on 2 namespace hosts (2 ranks each, own sshd),
# tandemrun on a third host that holds the store. Root; everything is
# removed on exit, also after a failure.
#
#   evict_restore.sh B
#
# 1. Only host b's ssh traffic (port 22) is dropped, for BLOCK_S s: the
#    agent's connection retransmits, so tandemrun evicts b (TANDEM_EVICT_STALL
#    =0: the ranks' own traffic still flows, the job does not stall), but its
#    SIGKILL for b's processes goes through that agent and cannot arrive: b's
#    processes still run, see the eviction and would join the next round.
#    The job must go on at 2 ranks without them at once (the round must not
#    count, wait for or admit them), and they must really still run then.
# 2. While the ssh link is blocked its connection's retransmission timer
#    backs off (seconds without a retransmission): b must not be let back
#    then. After the block, the connection sends what the block left
#    unacknowledged again (leftover retransmissions): b is let back only once
#    its agent answers pings again and the link stayed clean, and it is not
#    evicted a second time for those leftovers; the job grows back to 4.
# 3. Every step's loss equals the fault-free run's, bit for bit (as lossy.sh).
set -u
B=$1
BLOCK_S=${BLOCK_S:-12}
EVICT_BY=${EVICT_BY:-5}
NAME=evict_restore NET=10.77.23 TAG=fe
. "$(dirname "$0")/elastic_job.sh"
unset TANDEM_EVICT_RETRANS TANDEM_EVICT_CLEAN
# Retransmissions alone decide (the blocked ssh link does not stall the
# job); a 2 s window holds the first 3 retransmissions of one timed-out
# connection (after 0.2, 0.6 and 1.4 s).
export TANDEM_EVICT=1 TANDEM_EVICT_STALL=0 TANDEM_EVICT_WINDOW=2
ssh_block() { # on|off: host b's ssh traffic (port 22) dropped both ways
  local ns op
  ns=$(netns_name b)
  op=$([ "$1" = on ] && echo -A || echo -D)
  ip netns exec "$ns" iptables $op INPUT -p tcp --dport 22 -j DROP || fail "iptables on b"
  ip netns exec "$ns" iptables $op OUTPUT -p tcp --sport 22 -j DROP || fail "iptables on b"
}
b_train_pids() { sshhosts_pids b | while read -r p; do grep -qa train-gpt "/proc/$p/cmdline" 2>/dev/null && echo "$p"; done; }

start_elastic_job
wait_line "train-gpt: step 40 loss" 120 || fail "the job did not reach step 40 within 120 s"
last_at_four || fail "the job is not at 4 ranks at step 40"

# 1. b's ssh link blocked: evicted, its processes cannot be killed.
b_pids=$(b_train_pids | tr '\n' ' ')
[ "$(echo $b_pids | wc -w)" = 2 ] || fail "not 2 train-gpt processes on b before the block: $b_pids"
t0=$(date +%s.%N)
ssh_block on
wait_line "tandemrun: evicting host $Bh: its link is lossy" "$EVICT_BY" ||
  fail "host b (ssh link blocked) was not evicted within $EVICT_BY s"
t_ev=$(awk '/tandemrun: evicting host '"$Bh"'/ { print $1; exit }' "$work/out")
grep -q "tandemrun: evicting host $A" "$work/out" && fail "the healthy host a was evicted"
# The job goes on at 2 ranks at once, while b's evicted processes still run.
ok=0
for _ in $(seq 1 160); do
  n2=$(awk -v t="$t_ev" '$1 > t && /train-gpt: step [0-9]+ loss .*world 2 epoch/' "$work/out" | wc -l)
  [ "$n2" -ge 10 ] && { ok=1; break; }
  sleep 0.05
done
t_two=$(date +%s.%N)
[ $ok = 1 ] || fail "no 10 steps at 2 ranks within 8 s of b's eviction (its processes, still running: $(b_train_pids | wc -l))"
go_s=$(awk -v a="$t_ev" -v b="$t_two" 'BEGIN { printf "%.2f", b - a }')
# b's evicted processes, which no kill can reach, leave by themselves: the
# membership refuses them (on the code before the fix they were let into
# the next epoch and stayed).
for _ in $(seq 1 100); do
  left=0
  for p in $b_pids; do [ -d "/proc/$p" ] && left=$((left + 1)); done
  [ $left = 0 ] && break
  sleep 0.05
done
[ $left = 0 ] || fail "$left of b's evicted processes ($b_pids) still run 5 s after the job went on without them"
t_gone=$(date +%s.%N)
gone_s=$(awk -v a="$t_ev" -v b="$t_gone" 'BEGIN { printf "%.2f", b - a }')

# 2. Still blocked: b must not be let back. Then the block ends.
sleep "$(awk -v t="$t0" -v l="$BLOCK_S" -v n="$(date +%s.%N)" 'BEGIN { s = l - (n - t); if (s < 0) s = 0; print s }')"
grep -q "tandemrun: host $Bh's link has been clean" "$work/out" &&
  fail "b was let back while its ssh link was still blocked: $(grep "tandemrun: host $Bh's link has been clean" "$work/out" | head -1)"
t_open=$(date +%s.%N)
ssh_block off
wait_line "tandemrun: host $Bh's link has been clean for" 40 || fail "b was not let back within 40 s of the block's end"
wait_grown 30 || fail "the job did not grow back to 4 ranks within 30 s of b being let back"
t_back=$(awk '/tandemrun: host '"$Bh"'.s link has been clean/ { print $1; exit }' "$work/out")
back_s=$(awk -v a="$t_open" -v b="$t_back" 'BEGIN { printf "%.2f", b - a }')
s2=$(last_step)
sleep 6
[ "$(grep -c "tandemrun: evicting host" "$work/out")" = 1 ] ||
  fail "a second eviction: $(grep "tandemrun: evicting host" "$work/out" | tail -1)"
[ -z "$(b_train_pids | head -1)" ] || [ "$(b_train_pids | wc -l)" -le 2 ] ||
  fail "more than 2 train-gpt processes on b: the evicted ones outlived their kill"

# 3. Stop the job at its last step S; the fault-free run up to step S.
S=$(last_step)
[ -n "$S" ] && [ "$S" -gt "$s2" ] || fail "no step after b came back (last step ${S:-none}, before it $s2)"
fault_free_compare
echo "PASS(faulthosts evict_restore): b evicted $(awk -v a="$t0" -v b="$t_ev" 'BEGIN { printf "%.2f", b - a }') s after its ssh link was blocked, 10 steps at 2 ranks $go_s s later, its evicted processes (no kill could reach them) gone by themselves within $gone_s s; not let back while blocked, let back $back_s s after the block ended, no second eviction, grown to 4; the losses of steps 1-$S bit for bit the fault-free run's"
