#!/usr/bin/env bash
# Runs one libFuzzer harness (build/fuzz/fuzz_TARGET, built by `make
# fuzz-build`) for a bounded time:
#   1. replays every input saved in tests/fuzz/regress/TARGET/ (inputs that
#      once crashed the parser; each must now pass);
#   2. fuzzes for SECONDS, starting from the seed corpus tests/fuzz/corpus/TARGET/
#      plus what earlier runs found (build/fuzz/corpus/TARGET/, where new
#      inputs go, so that the checked-in seeds never change), with the
#      dictionary tests/fuzz/TARGET.dict if there is one.
# A crash, a sanitizer report, a leak, a timeout or a broken contract fails
# the run; the input is kept under build/fuzz/artifacts/TARGET/ and the
# message says how to turn it into a regression test. The last line gives
# the executions, executions per second and coverage.
#
# Usage: tests/fuzz/run.sh TARGET [SECONDS]    (SECONDS default 60)
set -u
cd "$(dirname "$0")/../.."
target=${1:?usage: tests/fuzz/run.sh TARGET [SECONDS]}
seconds=${2:-60}
bin=build/fuzz/fuzz_$target
seeds=tests/fuzz/corpus/$target
regress=tests/fuzz/regress/$target
work=build/fuzz/corpus/$target
artifacts=build/fuzz/artifacts/$target
dict=tests/fuzz/$target.dict

[ -f "tests/fuzz/fuzz_$target.c" ] || { echo "fuzz: no harness tests/fuzz/fuzz_$target.c"; exit 2; }
[ -d "$seeds" ] || { echo "fuzz: no seed corpus $seeds"; exit 2; }
# Up to date after `make test` / `make fuzz`; rebuilds after an edit.
make --no-print-directory -s "$bin" || { echo "fuzz: building $bin failed"; exit 1; }
mkdir -p "$work" "$artifacts"

# Sanitizer reports must end the run; leaks count (libFuzzer checks them
# per input when ASan is linked in).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}:abort_on_error=0:halt_on_error=1
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}:halt_on_error=1
# Library error logs (a rejected frame is logged like any failure) would
# flood stderr at thousands of inputs a second.
export TANDEM_LOG=${TANDEM_LOG:-error}

common=(-timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024)

shopt -s nullglob
saved=("$regress"/*)
if [ ${#saved[@]} -gt 0 ]; then
  echo "fuzz $target: replaying ${#saved[@]} saved crash input(s) from $regress/"
  if ! "$bin" "${common[@]}" "${saved[@]}"; then
    echo "fuzz $target: FAILED: a saved crash input crashes again (see above)"
    exit 1
  fi
fi

flags=("${common[@]}" -max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="$artifacts/"
       -close_fd_mask=1)
[ -f "$dict" ] && flags+=(-dict="$dict")
log=$(mktemp "/tmp/tandem-fuzz-$target-$$.XXXXXX")
trap 'rm -f "$log"' EXIT
echo "fuzz $target: ${seconds}s from $seeds/ (+ $work/)"
"$bin" "${flags[@]}" "$work" "$seeds" 2>&1 | tee "$log" | grep -v -E '^#[0-9]+.*(NEW|REDUCE|pulse)'
rc=${PIPESTATUS[0]}

execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+' "$log" | tail -1)
if [ "$rc" -ne 0 ]; then
  crash=$(grep -oE "$artifacts/[a-z-]+[0-9a-f]+" "$log" | tail -1)
  echo "fuzz $target: FAILED (exit $rc) after ${execs:-?} executions"
  if [ -n "$crash" ]; then
    echo "fuzz $target: the input is $crash; reproduce with: $bin $crash"
    echo "fuzz $target: after fixing the parser, keep it as a regression test: cp $crash $regress/"
  fi
  exit 1
fi
echo "fuzz $target: ok: ${execs:-?} executions in ${seconds}s (${rate:-?}/s), $cov"
