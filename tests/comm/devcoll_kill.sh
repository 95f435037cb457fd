#!/usr/bin/env bash
# A rank SIGKILLs itself during a staged device allreduce (test_device_coll
# --kill): every survivor must fail with TD_ERR_REMOTE naming the dead rank
# (the test prints "kill ok rank <r>" after asserting it), and tandemrun must
# exit non-zero naming it.
#   devcoll_kill.sh BUILD_TREE NP VICTIM [test_device_coll options...]
set -u
. "$(dirname "$0")/lib.sh"
B=$1 np=$2 victim=$3
shift 3
out=$("$B/bin/tandemrun" --grace 20 -np "$np" "$B/tests/test_device_coll" --kill "$victim" "$@" 2>&1)
rc=$?
echo "$out"
[ "$rc" -ne 0 ] || fail "tandemrun exited 0 although rank $victim was killed"
survivors=$(grep -c "kill ok rank" <<<"$out")
[ "$survivors" -eq $((np - 1)) ] || fail "$survivors of $((np - 1)) survivors reported the failure naming rank $victim"
grep -q "rank $victim (pid [0-9]*, host [^)]*) was killed by signal 9" <<<"$out" || fail "tandemrun did not name rank $victim"
echo "devcoll_kill: ok ($np ranks, rank $victim killed)"
