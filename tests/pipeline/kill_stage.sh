#!/usr/bin/env bash
# A pipeline stage SIGKILLs itself in its second step while its neighbours
# have activations or gradients in flight to it. Every survivor's step must
# fail within seconds with a remote error naming the dead rank
# (test_pipeline_train prints "kill ok rank R"), never hang, and tandemrun
# must exit non-zero naming the rank and the signal.
#   kill_stage.sh BUILD_TREE NP VICTIM
set -u
B=$1 np=$2 victim=$3
fail() { echo "kill_stage: FAIL: $*"; exit 1; }
out=$("$B/bin/tandemrun" --grace 20 -np "$np" "$B/tests/test_pipeline_train" kill "$victim" 2>&1)
rc=$?
echo "$out"
[ "$rc" -ne 0 ] || fail "tandemrun exited 0 although rank $victim was killed"
survivors=$(grep -c "kill ok rank" <<<"$out")
[ "$survivors" -eq $((np - 1)) ] || fail "$survivors of $((np - 1)) survivors reported the failure naming rank $victim"
grep -Eq "rank $victim\b.*(signal|SIGKILL)" <<<"$out" || fail "tandemrun does not say that rank $victim was killed"
echo "kill_stage: ok ($np stages, rank $victim killed)"
