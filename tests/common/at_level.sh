#!/usr/bin/env bash
# at_level.sh BUILD LEVEL COMMAND...: runs COMMAND with TANDEM_CPU=LEVEL if
# this CPU supports LEVEL (asked of the library: test_nn_levels --supports),
# so that `make test` runs the kernel tests at every level the machine has.
# On a CPU without LEVEL it prints SKIP and succeeds: that level cannot run
# here (the cross-level test, test_nn_levels, still covers the others).
set -u
B=$1 level=$2
shift 2
"$B/tests/test_nn_levels" --supports "$level"
rc=$?
if [ $rc -eq 3 ]; then
  echo "SKIP: this CPU does not support the $level level"
  exit 0
fi
[ $rc -eq 0 ] || { echo "test_nn_levels --supports $level failed (exit $rc)"; exit 1; }
echo "running at TANDEM_CPU=$level: $*"
TANDEM_CPU=$level exec "$@"
