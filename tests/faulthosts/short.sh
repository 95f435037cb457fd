#!/usr/bin/env bash
# The short version of bench/faults_hosts.sh: one fault of each of KINDS
# across 2 namespace hosts with their own sshd (root; every namespace, sshd,
# iptables rule and process is removed on exit, also after a failure). The
# job must recover from each (no hang: a new epoch and a step within the
# bound), finish, and end with the fault-free run's final loss and
# parameters bit for bit (elastic training sums each step in one order
# whatever the world size).
#
#   short.sh B [ZERO]
set -u
B=$1
zero=${2:-0}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d "/tmp/td-faulthosts-short-$$.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL(faulthosts short): $*"; [ -f "$tmp/log" ] && tail -30 "$tmp/log"; exit 1; }
kinds="hostkill grow kill0 stop cut loss50"
n=$(echo $kinds | wc -w)
ZERO=$zero KINDS="$kinds" EVERY=80 STEPS=1600 LOSS_S=1.5 HB=1.5 SETTLE=1.5 RESULTS="$tmp" "$here/../../bench/faults_hosts.sh" "$n" "$B" >"$tmp/log" 2>&1
rc=$?
res=$(ls "$tmp"/faults-hosts-*.md 2>/dev/null | head -1)
[ -n "$res" ] || fail "no result file (exit $rc)"
grep -q "^Faults injected: $n of $n\.$" "$res" || fail "not every fault was injected: $(grep '^Faults injected' "$res")"
grep -q "^Hangs (.*): 0\. The job: finished, tandemrun exit code 0 " "$res" || fail "a hang, or the job did not finish: $(grep '^Hangs' "$res")"
[ $rc = 0 ] || fail "faults_hosts.sh exited $rc"
for k in $kinds; do
  grep -q "^| $k | 1 | [0-9.]* |" "$res" || fail "no recovery time recorded for $k"
done
read -r lref href lgot hgot <<<"$(sed -n 's/^Final loss and parameter hash, fault-free: `\([^ ]*\) \([^`]*\)`; with faults: `\([^ ]*\) \([^`]*\)`.*/\1 \2 \3 \4/p' "$res")"
[ -n "$lref" ] && [ -n "$lgot" ] || fail "missing final losses"
# Elastic training always sums in one order whatever the world size
# (deterministic reduction): every resize keeps the fault-free bits.
[ "$lgot $hgot" = "$lref $href" ] ||
  fail "final loss and parameter hash $lgot $hgot differ from the fault-free $lref $href"
grep '^| all ' "$res"
echo "PASS(faulthosts short): $n faults ($kinds) across 2 hosts, no hang; final loss and parameters bit for bit the fault-free run's ($lgot $hgot)"
