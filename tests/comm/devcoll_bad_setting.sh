#!/usr/bin/env bash
# TANDEM_DEVICE_COLL and TANDEM_DEVICE_CHUNK_BYTES with bad values: the
# communicator is refused with a message naming the variable and what to
# write, and TANDEM_DEVICE_COLL=nccl on buffers NCCL cannot serve (host
# buffers here) says why instead of falling back silently.
#   devcoll_bad_setting.sh BUILD_TREE
set -u
. "$(dirname "$0")/lib.sh"
B=$1
out=$(TANDEM_DEVICE_COLL=fast "$B/bin/tandemrun" -np 2 "$B/tests/test_device_coll" 2>&1)
[ $? -ne 0 ] || fail "TANDEM_DEVICE_COLL=fast was accepted"
grep -q "TANDEM_DEVICE_COLL=fast is not a path: use auto, nccl or staged" <<<"$out" || fail "no clear message: $out"
out=$(TANDEM_DEVICE_CHUNK_BYTES=lots "$B/bin/tandemrun" -np 2 "$B/tests/test_device_coll" 2>&1)
[ $? -ne 0 ] || fail "TANDEM_DEVICE_CHUNK_BYTES=lots was accepted"
grep -q "TANDEM_DEVICE_CHUNK_BYTES=lots is not a byte size" <<<"$out" || fail "no clear message: $out"
out=$(TANDEM_DEVICE_COLL=nccl TANDEM_STAGE_HOST_BUFFERS=1 "$B/bin/tandemrun" -np 2 "$B/tests/test_device_coll" 2>&1)
[ $? -ne 0 ] || fail "TANDEM_DEVICE_COLL=nccl ran on host buffers"
grep -q "TANDEM_DEVICE_COLL=nccl, but NCCL cannot run here" <<<"$out" || fail "no clear message: $out"
echo "devcoll_bad_setting: ok"
