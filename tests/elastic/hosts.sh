#!/usr/bin/env bash
# Elastic training across "hosts" for real: namespace hosts joined by a
# bridge, each worker host with its own sshd (tests/lib/sshhosts.sh), tandemrun on a third namespace host starting the ranks over
# ssh exactly as on a cluster (-H), then a fault:
#
#   hosts.sh B cut    host b's cable is pulled (link down): its 2 ranks stop
#                     answering heartbeats; the 2 ranks on host a go on alone
#                     (--min-np 2) once TANDEM_ELASTIC_SETTLE passed, and
#                     the job finishes with a final loss within summation
#                     noise of a fault-free run
#   hosts.sh B kill   every process of host b's ranks killed at once
#                     (kill -9): the launcher's ssh sessions end, the loss
#                     is reported at once, and the job goes on at 2 ranks
#   hosts.sh B CASE S the job at ZeRO stage S: host b's shards must come
#                     from their buddies on host a (the log says "rebuilt
#                     from memory", never the disk fallback)
#   hosts.sh B kill-a S 2+1
#                     uneven hosts (2 ranks on a, 1 on b: a 2x2 job after
#                     its first loss), every process of host a killed: the
#                     rank on b alone rebuilds both of a's shards from the
#                     copies it kept as their buddy (a buddy on the same
#                     host would have lost one with a)
#
# Needs root (namespaces, sshd); every namespace and sshd is removed on
# exit, also after a failure.
set -u
B=$1
case_name=$2
zero=${3:-0}
layout=${4:-2+2} # ranks on host a + ranks on host b
n_a=${layout%+*}
n_b=${layout#*+}
np=$((n_a + n_b))
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib/sshhosts.sh"
RUN=$(cd "$B/bin" && pwd)/tandemrun
GPT=$(cd "$B/bin" && pwd)/train-gpt
fail() {
  echo "FAIL(hosts $case_name): $*"
  [ -f "${out:-}" ] && { echo "---- output (without step lines):"; grep -v "step [0-9]* loss" "$out" | tail -40; }
  exit 1
}
tmp=$(mktemp -d "/tmp/td-elastic-hosts-$$.XXXXXX")
NETNS_ON_EXIT='rm -rf "$tmp"'
sshhosts_init "$tmp/ssh"
sshhosts_add a 10.77.7.1
sshhosts_add b 10.77.7.2
netns_add_host l 10.77.7.3 # the launcher's host: it holds the store, so losing a or b loses no store

export TANDEM_PROGRESS=plain TANDEM_HEARTBEAT_TIMEOUT=2 TANDEM_HEARTBEAT_INTERVAL=0.25
export TANDEM_ELASTIC_SETTLE=4
[ "$zero" != 0 ] && export TANDEM_LOG=info # the rebuild's log lines
args="--layers 2 --channels 64 --heads 2 --seq 64 --threads 1 --sample 0 --steps 150 --micro-batch 3 --zero-stage $zero"
hosts="-H 10.77.7.1:$n_a,10.77.7.2:$n_b"
case $case_name in kill-a) left=$n_b ;; *) left=$n_a ;; esac
exact() { sed -n 's/.*elastic final_loss_exact=\([^ ]*\) params_hash=.*/\1/p' "$1"; }

# The fault-free reference runs on this host (shared memory): the same
# steps, summed in another order, so equal to summation noise.
"$RUN" --min-np $left --max-np $np -np $np "$GPT" $args >"$tmp/ref" 2>&1 || { out="$tmp/ref"; fail "fault-free run"; }

out="$tmp/out"
netns_spawn l "$RUN" --min-np $left --max-np $np -np $np --max-restarts 0 $hosts "$GPT" $args >"$out" 2>&1
job=$NETNS_PID
wait_for() {
  for _ in $(seq 1 $(( ${2:-60} * 20 ))); do
    grep -q -- "$1" "$out" && return 0
    sleep 0.05
  done
  fail "'$1' did not appear"
}
wait_for "step 20 loss"
case $case_name in
cut) netns_cut b down ;;
kill | kill-a)
  # Every process of the host's ranks at once (not its sshd).
  victim=b
  [ "$case_name" = kill-a ] && victim=a
  for pid in $(sshhosts_pids $victim); do
    grep -q "train-gpt" "/proc/$pid/cmdline" 2>/dev/null && kill -9 "$pid"
  done ;;
*) fail "unknown case" ;;
esac
wait_for "elastic epoch 2: world=$left" 60
wait "$job"
rc=$?
grep -q "elastic process $((np - 1)) (pid .*) is rank $((np - 1)) of $np" "$out" || fail "not $np ranks over ssh"
[ $rc = 0 ] || fail "tandemrun exited $rc"
grep -v "step [0-9]* loss" "$out" | tail -12
if [ "$zero" != 0 ]; then
  grep -q "epoch 2: rank 0: sharded state of commit [0-9]* rebuilt from the replica files" "$out" ||
    fail "the lost host's shards were not rebuilt from their buddies' replica files on the other host"
  grep -q "falling back to the disk" "$out" && fail "a shard was lost with its host: its buddy was on the same host"
fi
lref=$(exact "$tmp/ref")
lout=$(exact "$out")
[ -n "$lref" ] && [ -n "$lout" ] || fail "missing final loss"
awk -v a="$lout" -v b="$lref" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-5 * (b < 0 ? -b : b)) }' ||
  fail "final loss $lout differs from the fault-free $lref beyond summation noise"
echo "PASS(hosts $case_name, $layout): a host lost, the job went on at $left ranks; final loss $lout vs fault-free $lref"
