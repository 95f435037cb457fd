#!/usr/bin/env bash
# A rank of a tensor-parallel training job SIGKILLs itself in the middle of
# a step (test_tp kill). Every survivor's step must fail (no hang; those of
# the victim's tensor group naming it), each printing "kill ok rank R", and
# tandemrun must exit non-zero.
#   tp_kill.sh BUILD_TREE NP TP VICTIM [pp=PP]   (pp=PP: 3D, pipeline stages of tensor-parallel layers)
set -u
B=$1 np=$2 tp=$3 victim=$4 pp=${5:-pp=1}
out=$("$B/bin/tandemrun" --grace 20 -np "$np" "$B/tests/test_tp" kill "$tp" "$victim" "$pp" 2>&1)
rc=$?
echo "$out"
[ "$rc" -ne 0 ] || { echo "FAIL: tandemrun exited 0 although rank $victim was killed"; exit 1; }
survivors=$(grep -c "kill ok rank" <<<"$out")
[ "$survivors" -eq $((np - 1)) ] || { echo "FAIL: $survivors of $((np - 1)) survivors failed their step as expected"; exit 1; }
echo "tp_kill: ok ($np ranks, tensor-parallel $tp, $pp, rank $victim killed)"
