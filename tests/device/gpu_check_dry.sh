#!/usr/bin/env bash
# scripts/gpu-check on a CPU machine (issue 18): the one GPU session runs it
# once, so its budget, cuts and cleanup are checked here, where they can fail
# cheaply.
#   1. tests/gpu.suite by reading it: every line is named gpu_* or gpupy_*
#      (gpu-check runs only those prefixes), names are unique, no timeout is
#      over 120 s, the scripts it runs exist, every test program that reads
#      TD_TEST_EXPECT_CUDA (the device tests' convention) has a line, and
#      gpu-check runs both GPU benchmarks.
#   2. the tests step against a made-up suite (GPU_CHECK_SUITE) with a 12 s
#      budget: a passing line is a PASS row, a line that hangs (with a child
#      in a process group of its own, which a group kill misses) a FAIL row
#      "timed out", the line after it a CUT row, the run exits 1 within the
#      budget, and the hung line's child is ended.
#   3. gpu-check sent SIGTERM mid-step (as the device tool does at its
#      timeout): it ends the step's processes and writes the table so far,
#      saying so.
# usage: gpu_check_dry.sh
set -u
cd "$(dirname "$0")/../.."
dir=$(mktemp -d /tmp/td-gpucheck-XXXXXX) || exit 1
pids_to_check=()
cleanup() {
  for p in "${pids_to_check[@]}"; do kill -9 "$p" 2>/dev/null; done
  rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "FAILED: $*"; exit 1; }

# ---- 1. tests/gpu.suite, read
names=()
while read -r tmo name cmd; do
  case $name in gpu_* | gpupy_*) ;; *) fail "tests/gpu.suite line '$name': not named gpu_* or gpupy_*, so gpu-check never runs it" ;; esac
  [ "$tmo" -ge 10 ] && [ "$tmo" -le 120 ] || fail "tests/gpu.suite line $name: timeout $tmo s (10-120: one hang must not take the budget)"
  for n in "${names[@]}"; do [ "$n" = "$name" ] && fail "tests/gpu.suite: $name twice"; done
  names+=("$name")
  for word in $cmd; do
    case $word in tests/*.sh | tests/*.py) [ -f "$word" ] || fail "tests/gpu.suite line $name runs $word, which is missing" ;; esac
  done
done < <(sed 's/#.*//' tests/gpu.suite | grep -v '^[[:space:]]*$')
[ ${#names[@]} -ge 10 ] || fail "tests/gpu.suite has ${#names[@]} lines"
for src in $(grep -rl --include='*.c' --include='*.py' --include='*.sh' TD_TEST_EXPECT_CUDA tests | grep -v '^tests/device/gpu_check_dry.sh$'); do
  prog=$(basename "$src")
  prog=${prog%.c}
  grep -v '^[[:space:]]*#' tests/gpu.suite | grep -q "$prog" || fail "$src reads TD_TEST_EXPECT_CUDA, but tests/gpu.suite never runs $prog"
done
for b in bench/gpu.sh bench/cuda_kernels.sh bench/gpu_profile.sh; do
  grep -v '^[[:space:]]*#' scripts/gpu-check | grep -q "$b" || fail "scripts/gpu-check does not run $b"
done
echo "tests/gpu.suite: ${#names[@]} lines, all gpu_*/gpupy_*, timeouts 10-120 s, every device test program in it"

# ---- 2. budget, cut and cleanup
cat >"$dir/fake.suite" <<EOF
5 gpu_dry_pass true
60 gpu_dry_hang bash -c 'set -m; sleep 300 & echo \$! >$dir/orphan; sleep 300'
5 gpu_dry_after true
5 gpupy_dry_never true
EOF
t0=$(date +%s)
GPU_CHECK_STEPS=tests GPU_CHECK_SUITE=$dir/fake.suite GPU_CHECK_TESTS_S=12 GPU_CHECK_LOGDIR=$dir/log OUT=$dir/out \
  scripts/gpu-check >"$dir/run.out" 2>&1
rc=$?
took=$(( $(date +%s) - t0 ))
cat "$dir/run.out"
[ -f "$dir/orphan" ] && pids_to_check+=("$(cat "$dir/orphan")")
[ "$rc" = 1 ] || fail "gpu-check exited $rc with a hung and a cut line (expected 1)"
[ "$took" -le 40 ] || fail "gpu-check took $took s on a 12 s test budget"
grep -Eq '^test gpu_dry_pass +PASS' "$dir/run.out" || fail "no PASS row for gpu_dry_pass"
grep -Eq '^test gpu_dry_hang +FAIL .*timed out' "$dir/run.out" || fail "no FAIL row saying gpu_dry_hang timed out"
grep -Eq '^test gpu_dry_after +CUT' "$dir/run.out" || fail "no CUT row for gpu_dry_after"
grep -q 'gpupy_dry_never' "$dir/run.out" && fail "a gpupy_ line ran although the python step was not asked for"
grep -q '^overall: FAIL' "$dir/run.out" || fail "the table does not end in overall: FAIL"
[ -f "$dir/out/summary.txt" ] && [ -f "$dir/out/logs.tar.gz" ] || fail "summary.txt or logs.tar.gz missing from OUT"
[ -f "$dir/orphan" ] || fail "the hanging line did not start its child"
orphan=$(cat "$dir/orphan")
kill -0 "$orphan" 2>/dev/null && fail "the hung line's child (pid $orphan, its own process group) is still running"
echo "cut and cleanup: ok ($took s)"

# ---- 3. SIGTERM mid-step
rm -f "$dir/orphan"
cat >"$dir/hang.suite" <<EOF
60 gpu_dry_hang bash -c 'set -m; sleep 300 & echo \$! >$dir/orphan; sleep 300'
EOF
GPU_CHECK_STEPS=tests GPU_CHECK_SUITE=$dir/hang.suite GPU_CHECK_LOGDIR=$dir/log2 OUT=$dir/out2 \
  scripts/gpu-check >"$dir/run2.out" 2>&1 &
gc=$!
for _ in $(seq 100); do [ -f "$dir/orphan" ] && break; sleep 0.1; done
[ -f "$dir/orphan" ] || { kill -9 $gc; fail "the hanging line did not start within 10 s"; }
orphan=$(cat "$dir/orphan")
pids_to_check+=("$orphan")
kill -TERM $gc
for _ in $(seq 200); do kill -0 $gc 2>/dev/null || break; sleep 0.1; done
kill -0 $gc 2>/dev/null && { kill -9 $gc; fail "gpu-check still running 20 s after SIGTERM"; }
wait $gc
rc=$?
cat "$dir/run2.out"
[ "$rc" = 1 ] || fail "gpu-check exited $rc after SIGTERM (expected 1)"
grep -q 'ended by a signal' "$dir/out2/summary.txt" || fail "summary.txt does not say the run was ended by a signal"
kill -0 "$orphan" 2>/dev/null && fail "after SIGTERM the running line's child (pid $orphan) is still running"
echo "SIGTERM: ok"
echo ok
