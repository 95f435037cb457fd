#!/usr/bin/env bash
# A rank SIGKILLs itself in the middle of allreduces. Checks that every
# survivor's pending and later operations fail with TD_ERR_REMOTE naming the
# dead rank within seconds (test_failures asserts that and prints "kill ok"),
# that tandemrun exits non-zero naming the rank and the signal, and that the
# job leaves no /dev/shm/tandem-* segment behind.
#   kill_rank.sh BUILD_TREE TRANSPORT NP VICTIM
set -u
. "$(dirname "$0")/lib.sh"
B=$1 transport=$2 np=$3 victim=$4
before=$(shm_segments)
t0=$(date +%s.%N)
out=$(TANDEM_TRANSPORT=$transport "$B/bin/tandemrun" --grace 20 -np "$np" "$B/tests/test_failures" kill "$victim" 2>&1)
rc=$?
t1=$(date +%s.%N)
echo "$out"
echo "tandemrun exit $rc after $(echo "$t1 - $t0" | bc) s"
[ "$rc" -ne 0 ] || fail "tandemrun exited 0 although rank $victim was killed"
survivors=$(grep -c "kill ok rank" <<<"$out")
[ "$survivors" -eq $((np - 1)) ] || fail "$survivors of $((np - 1)) survivors reported the failure correctly"
grep -Eiq "rank $victim\b.*(signal|sigkill|killed)|(signal|sigkill|killed).*rank $victim\b" <<<"$out" ||
  fail "tandemrun's output does not say that rank $victim was killed by a signal"
# Segments of this job must be gone. Other jobs may create (and soon unlink)
# their own meanwhile, so only segments that are new and still there a
# second later count.
sleep 1
after=$(comm -13 <(echo "$before") <(shm_segments))
if [ -n "$after" ]; then
  sleep 2
  left=$(comm -12 <(echo "$after") <(shm_segments))
  [ -z "$left" ] || fail "shared-memory segments left behind: $left"
fi
echo "kill_rank: ok ($transport, $np ranks, rank $victim killed)"
