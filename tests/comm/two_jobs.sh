#!/usr/bin/env bash
# Two jobs on one machine at the same time must not collide (store ports,
# shared-memory names): both run the quick collective sweep concurrently,
# one over shared memory and one over TCP, then a third pair both on shm.
#   two_jobs.sh BUILD_TREE
set -u
. "$(dirname "$0")/lib.sh"
B=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
run_pair() {
  local t1=$1 t2=$2
  TANDEM_TRANSPORT=$t1 "$B/bin/tandemrun" -np 3 "$B/tests/test_collectives" --quick >"$tmp/a" 2>&1 &
  local a=$!
  TANDEM_TRANSPORT=$t2 "$B/bin/tandemrun" -np 2 "$B/tests/test_collectives" --quick >"$tmp/b" 2>&1 &
  local b=$!
  wait $a; local ra=$?
  wait $b; local rb=$?
  sed 's/^/[job A] /' "$tmp/a"
  sed 's/^/[job B] /' "$tmp/b"
  [ $ra -eq 0 ] || fail "job A ($t1, 3 ranks) exited $ra while job B ran"
  [ $rb -eq 0 ] || fail "job B ($t2, 2 ranks) exited $rb while job A ran"
}
run_pair shm tcp
run_pair shm shm
echo "two_jobs: ok"
