#!/usr/bin/env bash
# TANDEM_DEVICE_COLL=nccl on 2 ranks sharing one GPU (tests/gpu.suite): the
# first device collective must fail on every rank saying why NCCL cannot
# run (the ranks share the GPU, or NCCL is missing) and how to get the
# staged path, instead of hanging in NCCL or falling back silently.
#   devcoll_nccl_refused.sh BUILD_TREE
set -u
. "$(dirname "$0")/lib.sh"
B=$1
out=$(TANDEM_DEVICE_COLL=nccl "$B/bin/tandemrun" -np 2 "$B/tests/test_device_coll" --device cuda:0 2>&1)
rc=$?
echo "$out"
grep -q "^\[[01]\] skipped: no GPU" <<<"$out" && exit 0 # no GPU, and TD_TEST_EXPECT_CUDA unset
[ "$rc" -ne 0 ] || fail "TANDEM_DEVICE_COLL=nccl ran although both ranks share cuda:0"
grep -Eq "TANDEM_DEVICE_COLL=nccl, but NCCL cannot run here: (ranks 0 and 1 share cuda:0|libnccl)" <<<"$out" ||
  fail "no message naming why NCCL cannot run"
echo "devcoll_nccl_refused: ok"
