#!/bin/sh
# Multi-rank checkpoint crash sweep: a 2-rank job saves step 5 over a
# directory holding step 3 and is killed (TANDEM_CKPT_FAULT_AT, a test hook)
# just before the Nth file operation of the save on rank R: rank 1 (its
# token check and shard) and rank 0 (everything, including the manifest,
# the rename and `latest`). After each death a fresh job must resume the
# old or the new checkpoint and continue exactly (ckpt-check).
# usage: ckpt_crash_ranks.sh BUILD_TREE
set -u
B=$1
RUN="$B/bin/tandemrun"
T="$B/tests/test_train_dp"
dir=$(mktemp -d /tmp/td-h7train-ranks-XXXXXX) || exit 1
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAILED: $*"; exit 1; }
"$RUN" -np 2 "$T" ckpt-step tiny "$dir/base" >/dev/null 2>&1 || fail "baseline save"
for rank in 1 0; do
  n=1
  while :; do
    rm -rf "$dir/ckpt"
    cp -a "$dir/base" "$dir/ckpt" || fail "copying the baseline"
    if TANDEM_CKPT_FAULT_AT=$n TANDEM_CKPT_FAULT_RANK=$rank "$RUN" -np 2 "$T" ckpt-step tiny "$dir/ckpt" \
        >/dev/null 2>&1; then
      completed=1
    else
      completed=0
    fi
    out=$("$RUN" -np 2 "$T" ckpt-check tiny "$dir/ckpt" 2>&1) || fail "rank $rank killed at file op $n: $out"
    case $out in *"step 3 exactly"*) old=1 ;; *) old=0 ;; esac
    [ $completed = 1 ] && [ $old = 1 ] && fail "a completed save left the old checkpoint"
    [ $completed = 1 ] && break
    [ $n -gt 60 ] && fail "the save never completed"
    n=$((n + 1))
  done
  echo "rank $rank killed before each of its $((n - 1)) file operations: every resume exact"
  [ $n -gt 2 ] || fail "rank $rank: too few file operations ($((n - 1)))"
done
echo ok
