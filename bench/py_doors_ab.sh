#!/usr/bin/env bash
# A/B of py_doors' allreduce-alone door over TCP (two namespace hosts,
# bench/py_doors.sh's tcp part) between two source trees, each with its own
# build/ (build/bin/tandemrun and build/python), runs alternating A B, B A,
# ... with --timeline's per-call figures; or, with only one tree and
# ENV_B="VAR=value", that tree with and without ENV_B (only Tandem's door).
# The same bench/py_doors.{sh,py} must be in both trees (copy them over an
# older checkout). Summary: bench/py_doors_calls.py RAW.
#   bench/py_doors_ab.sh PAIRS STEPS RAW TREE_A [TREE_B]
set -u
pairs=$1 steps=$2 out=$3 a=$4 b=${5:-}
label() { if [ -n "$b" ]; then echo "tree $(git -C "$1" rev-parse --short HEAD)"; else echo "env $2"; fi; }
for i in $(seq "$pairs"); do
  if [ -n "$b" ]; then set -- "$a" "$b"; else set -- "$a" "$a"; fi
  first=1 second=2
  [ $((i % 2)) = 0 ] && first=2 second=1
  for k in $first $second; do
    eval "t=\$$k"
    envs=() contenders="allreduce,gloo allreduce,tandem" lab=$(label "$t" default)
    if [ -z "$b" ]; then
      contenders="allreduce,tandem"
      [ "$k" = 2 ] && envs=("${ENV_B:?ENV_B=VAR=value with one tree}") && lab=$(label "$t" "$ENV_B")
    fi
    echo "# $lab pair $i" >>"$out"
    (cd "$t" && env "${envs[@]}" PARTS=tcp CONTENDERS="$contenders" DOOR_ARGS=--timeline timeout 300 \
      bench/py_doors.sh 1 "$steps" embed) >>"$out" 2>&1
  done
done
