#!/usr/bin/env bash
# Launcher tests: tandemrun run with tests/net/test_launch_child as the worker.
# Usage: tests/net/launcher.sh BUILD_TREE CASE   (cases: see the bottom).
# Each case prints what it checks and exits non-zero on the first failure.
set -u
B=${1:?build tree}
CASE=${2:?case}
RUN="$(cd "$B" && pwd)/bin/tandemrun"
CHILD="$(cd "$B" && pwd)/tests/test_launch_child"
HERE=$(cd "$(dirname "$0")" && pwd)
TMP=$(mktemp -d /tmp/tandem-launcher-XXXXXX)
trap 'rm -rf "$TMP"' EXIT

fail() { echo "FAILED ($CASE): $*" >&2; exit 1; }
expect_eq() { [ "$1" = "$2" ] || fail "$3: got '$1', expected '$2'"; }
expect_grep() { grep -Eq -- "$1" "$2" || { echo "--- $2:"; cat "$2"; fail "no line matching /$1/ in $2"; }; }
# Seconds (with decimals) since the epoch.
now() { date +%s.%N; }
elapsed_lt() { awk -v a="$1" -v b="$(now)" -v lim="$2" 'BEGIN { exit !((b - a) < lim) }' || fail "took longer than $2 s"; }
# Is a pid gone (no process, or a zombie nobody reaped)?
pid_gone() {
  [ -r "/proc/$1/stat" ] || return 0
  local state
  state=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)
  [ -z "$state" ] || [ "$state" = Z ] || [ "$state" = X ]
}
expect_pids_gone() {
  local dir=$1 f pid
  for f in "$dir"/pid.* "$dir"/gpid.*; do
    [ -e "$f" ] || continue
    pid=$(cat "$f")
    local t=0
    while ! pid_gone "$pid" && [ $t -lt 50 ]; do sleep 0.1; t=$((t+1)); done
    pid_gone "$pid" || fail "process $pid ($(basename "$f")) still running after the job ended"
  done
}
# One tandemrun line on stderr and nothing else from tandemrun.
expect_one_root_line() {
  local n
  n=$(grep -c '^tandemrun:' "$1")
  expect_eq "$n" 1 "number of tandemrun lines in stderr"
  expect_grep "$2" "$1"
}

case_env() {
  # Every world size 1..8: each rank once, with consistent variables.
  for np in 1 2 3 4 5 6 7 8; do
    "$RUN" -np $np "$CHILD" --print-env >"$TMP/out" 2>"$TMP/err" || { cat "$TMP/err"; fail "-np $np exited $?"; }
    expect_eq "$(wc -l <"$TMP/out")" "$np" "lines for -np $np"
    for ((r = 0; r < np; r++)); do
      expect_grep "^\[$r\] rank=$r world=$np local_rank=$r local_size=$np store=127\.0\.0\.1:[0-9]+ job=[0-9a-f-]+ cwd=$PWD\$" "$TMP/out"
    done
    expect_eq "$(sed 's/.*store=\([^ ]*\) job=\([^ ]*\).*/\1 \2/' "$TMP/out" | sort -u | wc -l)" 1 "distinct store/job per job"
    [ -s "$TMP/err" ] && { cat "$TMP/err"; fail "unexpected stderr for -np $np"; }
  done
  # Variables already set in tandemrun's environment are replaced, not duplicated.
  TANDEM_RANK=77 TANDEM_STORE=bogus:1 "$RUN" -np 2 "$CHILD" --print-env >"$TMP/out" 2>&1 || fail "rerun failed"
  expect_grep '^\[1\] rank=1 world=2 .*store=127\.0\.0\.1:' "$TMP/out"
  echo "env ok"
}

case_output() {
  "$RUN" -np 3 "$CHILD" --lines 200 --partial "no newline at the end" >"$TMP/out" 2>"$TMP/err" || fail "exit $?"
  for r in 0 1 2; do
    expect_eq "$(grep -c "^\[$r\] out $r [0-9]*\$" "$TMP/out")" 200 "stdout lines of rank $r"
    expect_eq "$(grep -c "^\[$r\] err $r [0-9]*\$" "$TMP/err")" 200 "stderr lines of rank $r"
    expect_eq "$(grep -c "^\[$r\] no newline at the end\$" "$TMP/out")" 1 "partial line of rank $r"
    # Order within a rank is kept.
    expect_eq "$(grep "^\[$r\] out" "$TMP/out" | awk '{print $4}' | tr '\n' ' ')" "$(seq 0 199 | tr '\n' ' ')" "order of rank $r"
  done
  # Nothing but whole prefixed lines.
  if grep -Ev '^\[[0-2]\] (out [0-2] [0-9]+|no newline at the end)$' "$TMP/out"; then fail "malformed stdout lines"; fi
  if grep -Ev '^\[[0-2]\] err [0-2] [0-9]+$' "$TMP/err"; then fail "malformed stderr lines"; fi
  echo "output ok"
}

case_exit_codes() {
  "$RUN" -np 4 "$CHILD" --exit 0 >"$TMP/out" 2>"$TMP/err"
  expect_eq $? 0 "all ranks exit 0"
  [ -s "$TMP/err" ] && fail "stderr not empty on success"

  # A grandchild that outlives its worker holds the output pipe: tandemrun
  # still finishes (about 1 s later) and stops it.
  mkdir -p "$TMP/pids"
  t0=$(now)
  "$RUN" -np 2 "$CHILD" --pidfile "$TMP/pids" --exit 0 >"$TMP/out" 2>"$TMP/err"
  expect_eq $? 0 "success with lingering grandchildren"
  elapsed_lt "$t0" 4
  expect_pids_gone "$TMP/pids"

  t0=$(now)
  "$RUN" -np 4 "$CHILD" --fail 2:exit:3:0.1 --sleep 30 >"$TMP/out" 2>"$TMP/err"
  expect_eq $? 3 "exit code of rank 2"
  elapsed_lt "$t0" 8
  expect_one_root_line "$TMP/err" '^tandemrun: rank 2 \(pid [0-9]+, host localhost\) exited with code 3; stopped the other 3 ranks$'
  expect_grep '^\[2\] rank 2 failing on purpose' "$TMP/err"

  "$RUN" -np 3 --grace 0.5 "$CHILD" --fail 0:signal:6:0.1 --sleep 30 >"$TMP/out" 2>"$TMP/err"
  expect_eq $? 134 "exit code for SIGABRT"
  expect_one_root_line "$TMP/err" '^tandemrun: rank 0 \(pid [0-9]+, host localhost\) was killed by signal 6 \(SIGABRT\); stopped the other 2 ranks$'

  # The first failure is the root cause, not the ranks that fail after it
  # (here within the grace period, as survivors that notice would).
  "$RUN" -np 4 --grace 2 "$CHILD" --fail 1:exit:5:0.1 --fail 0:exit:7:1.0 --fail 3:signal:15:1.1 --sleep 30 \
    >"$TMP/out" 2>"$TMP/err"
  expect_eq $? 5 "exit code of the root cause"
  expect_one_root_line "$TMP/err" '^tandemrun: rank 1 \(pid [0-9]+, host localhost\) exited with code 5; stopped the other 3 ranks$'
  expect_grep '^\[0\] rank 0 failing on purpose' "$TMP/err"

  # One rank of one.
  "$RUN" -np 1 "$CHILD" --exit 9 >"$TMP/out" 2>"$TMP/err"
  expect_eq $? 9 "exit code of a single rank"
  expect_one_root_line "$TMP/err" '^tandemrun: rank 0 \(pid [0-9]+, host localhost\) exited with code 9$'
  echo "exit codes ok"
}

case_killed_rank() {
  # Rank 1 is SIGKILLed; the others (and their children) are gone within seconds.
  mkdir -p "$TMP/pids"
  t0=$(now)
  "$RUN" -np 4 --grace 1 "$CHILD" --pidfile "$TMP/pids" --fail 1:signal:9:0.3 --sleep 60 >"$TMP/out" 2>"$TMP/err"
  expect_eq $? 137 "exit code for SIGKILL"
  elapsed_lt "$t0" 8
  expect_one_root_line "$TMP/err" '^tandemrun: rank 1 \(pid [0-9]+, host localhost\) was killed by signal 9 \(SIGKILL\); stopped the other 3 ranks$'
  expect_eq "$(ls "$TMP/pids" | wc -l)" 8 "pid files"
  expect_pids_gone "$TMP/pids"

  # Workers that ignore SIGTERM get SIGKILL 3 s later.
  rm -f "$TMP"/pids/*
  t0=$(now)
  "$RUN" -np 3 --grace 0 "$CHILD" --ignore-term --pidfile "$TMP/pids" --fail 0:exit:4:0.2 --sleep 60 >"$TMP/out" 2>"$TMP/err"
  expect_eq $? 4 "exit code with stubborn workers"
  elapsed_lt "$t0" 9
  expect_pids_gone "$TMP/pids"
  echo "killed rank ok"
}

case_timeout() {
  t0=$(now)
  "$RUN" -np 3 --timeout 1 "$CHILD" --sleep 30 >"$TMP/out" 2>"$TMP/err"
  expect_eq $? 124 "exit code after --timeout"
  elapsed_lt "$t0" 5
  expect_one_root_line "$TMP/err" '^tandemrun: the job ran past --timeout 1 s; stopped the 3 ranks still running$'
  # A job that finishes in time is not affected.
  "$RUN" -np 2 --timeout 20 "$CHILD" --sleep 0.2 >"$TMP/out" 2>"$TMP/err"
  expect_eq $? 0 "job within --timeout"
  echo "timeout ok"
}

case_signals() {
  for sig in TERM INT; do
    mkdir -p "$TMP/pids-$sig"
    "$RUN" -np 3 "$CHILD" --pidfile "$TMP/pids-$sig" --sleep 60 >"$TMP/out" 2>"$TMP/err" &
    tr=$!
    t=0
    while [ "$(ls "$TMP/pids-$sig" | wc -l)" -lt 6 ] && [ $t -lt 200 ]; do sleep 0.05; t=$((t+1)); done
    expect_eq "$(ls "$TMP/pids-$sig" | wc -l)" 6 "pid files before SIG$sig"
    t0=$(now)
    kill -$sig $tr
    wait $tr
    rc=$?
    [ $sig = TERM ] && expect_eq $rc 143 "exit code after SIGTERM"
    [ $sig = INT ] && expect_eq $rc 130 "exit code after SIGINT"
    elapsed_lt "$t0" 5
    expect_one_root_line "$TMP/err" "^tandemrun: received SIG$sig; forwarded it to the 3 running ranks"
    expect_pids_gone "$TMP/pids-$sig"
  done
  echo "signals ok"
}

expect_usage_error() {
  local want=$1
  shift
  "$RUN" "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  expect_eq $rc 2 "exit code for: tandemrun $*"
  expect_eq "$(wc -l <"$TMP/err")" 1 "stderr lines for: tandemrun $*"
  expect_grep "^tandemrun: .*$want" "$TMP/err"
  [ -s "$TMP/out" ] && fail "stdout not empty for: tandemrun $*"
  return 0
}

case_usage() {
  expect_usage_error '-np is missing: write tandemrun -np N PROGRAM' "$CHILD"
  expect_usage_error "-np '0' is not a positive number of ranks; write e.g. -np 4" -np 0 "$CHILD"
  expect_usage_error "-np 'x' is not" -np x "$CHILD"
  expect_usage_error "-np needs a value" -np
  expect_usage_error "unknown option '--bogus'; the options are" -np 2 --bogus "$CHILD"
  expect_usage_error "no program given: write tandemrun -np 2 PROGRAM" -np 2
  expect_usage_error "cannot run 'no-such-program-xyz': not found in PATH" -np 2 no-such-program-xyz
  expect_usage_error "cannot run './no/such/file': No such file or directory" -np 2 ./no/such/file
  printf 'echo hi\n' >"$TMP/not-exec"
  expect_usage_error "cannot run '$TMP/not-exec': it is not executable" -np 1 "$TMP/not-exec"
  expect_usage_error "--timeout 'soon' is not a number of seconds" -np 1 --timeout soon "$CHILD"
  expect_usage_error "-np 5 needs 5 slots but the hosts give 3" -np 5 -H localhost:2,localhost "$CHILD"
  expect_usage_error "-H: 'a:b' is not HOST or HOST:SLOTS" -np 1 -H a:b "$CHILD"
  printf 'localhost slots=2\n# comment\n\nnode2 slots=two\n' >"$TMP/hosts"
  expect_usage_error "hostfile $TMP/hosts line 4 is not 'HOST', 'HOST:SLOTS' or 'HOST slots=SLOTS'" \
    -np 2 --hostfile "$TMP/hosts" "$CHILD"
  expect_usage_error "cannot read hostfile" -np 2 --hostfile "$TMP/missing" "$CHILD"
  "$RUN" --help >"$TMP/out" 2>&1 || fail "--help exit $?"
  expect_grep '^usage: tandemrun -np N' "$TMP/out"
  "$RUN" --version >"$TMP/out" 2>&1 || fail "--version exit $?"
  expect_grep '^tandemrun \(Tandem\) [0-9]' "$TMP/out"
  # A file that is executable but cannot be executed: the worker reports it.
  printf '\x7fELF garbage' >"$TMP/bad-exec"
  chmod +x "$TMP/bad-exec"
  "$RUN" -np 2 "$TMP/bad-exec" >"$TMP/out" 2>"$TMP/err"
  expect_eq $? 127 "exit code when exec fails"
  expect_grep "^tandemrun: rank [01] \(host localhost\) could not execute '$TMP/bad-exec': Exec format error" "$TMP/err"
  expect_grep "^tandemrun: rank [01] \(pid [0-9]+, host localhost\) exited with code 127 \(the program could not be started\)" "$TMP/err"
  echo "usage ok"
}

case_remote() {
  # Remote hosts through a fake ssh that runs the command here.
  export FAKE_SSH_LOG="$TMP/ssh.log"
  export TANDEM_SSH="$HERE/fake_ssh.sh"
  export TANDEM_EXTRA_MARK=carried
  mkdir -p "$TMP/wd"
  cp "$CHILD" "$TMP/wd/child"
  # Each rank over ssh of its own (TANDEM_AGENT=0), then through one
  # tandem-agent per host (the default): the same ranks, variables and
  # working directory either way; ssh once per rank, or once per host.
  for agent in 0 default; do
    : >"$FAKE_SSH_LOG"
    if [ $agent = 0 ]; then export TANDEM_AGENT=0; else unset TANDEM_AGENT; fi
    (cd "$TMP/wd" && "$RUN" -np 5 -H fake-a:2,fake-b:3 ./child --print-env --store-barrier) >"$TMP/out" 2>"$TMP/err" ||
      { cat "$TMP/err"; fail "remote job (TANDEM_AGENT=$agent) exit $?"; }
    expect_eq "$(grep -c 'barrier passed' "$TMP/out")" 5 "ranks through the store"
    expect_grep "^\[0\] rank=0 world=5 local_rank=0 local_size=2 store=[0-9.]+:[0-9]+ job=[0-9a-f-]+ cwd=$TMP/wd\$" "$TMP/out"
    expect_grep "^\[1\] rank=1 world=5 local_rank=1 local_size=2 " "$TMP/out"
    expect_grep "^\[2\] rank=2 world=5 local_rank=0 local_size=3 " "$TMP/out"
    expect_grep "^\[4\] rank=4 world=5 local_rank=2 local_size=3 " "$TMP/out"
    if [ $agent = 0 ]; then
      expect_eq "$(grep -c '^fake-a ' "$FAKE_SSH_LOG")" 2 "ssh calls to fake-a"
      expect_eq "$(grep -c '^fake-b ' "$FAKE_SSH_LOG")" 3 "ssh calls to fake-b"
      expect_grep "TANDEM_EXTRA_MARK=carried" "$FAKE_SSH_LOG"
    else
      expect_eq "$(grep -c '^fake-a exec .*/tandem-agent' "$FAKE_SSH_LOG")" 1 "agent ssh calls to fake-a"
      expect_eq "$(grep -c '^fake-b exec .*/tandem-agent' "$FAKE_SSH_LOG")" 1 "agent ssh calls to fake-b"
      expect_eq "$(wc -l <"$FAKE_SSH_LOG")" 2 "ssh calls with agents"
      "$RUN" -np 1 -H fake-a:1 sh -c 'echo "mark=$TANDEM_EXTRA_MARK"' >"$TMP/out" 2>"$TMP/err" ||
        { cat "$TMP/err"; fail "sh through an agent exit $?"; }
      expect_grep "^\[0\] mark=carried\$" "$TMP/out"
    fi
  done
  # An agent that is not there (the remote shell exits 127): said once,
  # and the ranks start over ssh each.
  : >"$FAKE_SSH_LOG"
  TANDEM_AGENT=/nonexistent/tandem-agent "$RUN" -np 2 -H fake-a:2 "$CHILD" --store-barrier >"$TMP/out" 2>"$TMP/err" ||
    { cat "$TMP/err"; fail "job with a missing agent exit $?"; }
  expect_eq "$(grep -c 'barrier passed' "$TMP/out")" 2 "ranks without their agent"
  expect_grep "^tandemrun: host fake-a has no /nonexistent/tandem-agent \(the remote shell exited 127\)" "$TMP/err"
  expect_eq "$(grep -c '^fake-a ' "$FAKE_SSH_LOG")" 3 "ssh calls: the agent's, then one per rank"
  export TANDEM_AGENT=0 # the per-rank ssh path's own checks below

  # A mix of this host (fork/exec) and a remote one, from a hostfile; more
  # slots than ranks; the remote rank fails and is named with its host.
  printf 'localhost slots=1\nfake-c:4   # remote\n' >"$TMP/hosts"
  : >"$FAKE_SSH_LOG"
  "$RUN" -np 3 --hostfile "$TMP/hosts" "$CHILD" --print-env --store-barrier --fail 2:exit:6:0 >"$TMP/out" 2>"$TMP/err"
  expect_eq $? 6 "exit code of the remote rank"
  expect_one_root_line "$TMP/err" '^tandemrun: rank 2 \(pid [0-9]+, host fake-c\) exited with code 6'
  expect_grep '^\[0\] rank=0 world=3 local_rank=0 local_size=1 ' "$TMP/out"
  expect_grep '^\[2\] rank=2 world=3 local_rank=1 local_size=2 ' "$TMP/out"
  expect_eq "$(grep -c '^fake-c ' "$FAKE_SSH_LOG")" 2 "ssh calls to fake-c"

  # A machine listed twice (and this host under two names) is one group:
  # local ranks count across the entries.
  : >"$FAKE_SSH_LOG"
  "$RUN" -np 6 -H fake-e:1,localhost:1,fake-e:2,127.0.0.1:2 "$CHILD" --print-env --store-barrier >"$TMP/out" 2>"$TMP/err" ||
    { cat "$TMP/err"; fail "grouped hosts exit $?"; }
  expect_grep '^\[0\] rank=0 world=6 local_rank=0 local_size=3 ' "$TMP/out"
  expect_grep '^\[1\] rank=1 world=6 local_rank=0 local_size=3 ' "$TMP/out"
  expect_grep '^\[2\] rank=2 world=6 local_rank=1 local_size=3 ' "$TMP/out"
  expect_grep '^\[3\] rank=3 world=6 local_rank=2 local_size=3 ' "$TMP/out"
  expect_grep '^\[4\] rank=4 world=6 local_rank=1 local_size=3 ' "$TMP/out"
  expect_grep '^\[5\] rank=5 world=6 local_rank=2 local_size=3 ' "$TMP/out"
  expect_eq "$(grep -c '^fake-e ' "$FAKE_SSH_LOG")" 3 "ssh calls to fake-e"

  # ssh that cannot reach its host (exit 255) is named as such.
  TANDEM_SSH="$HERE/fake_ssh.sh --unreachable" "$RUN" -np 1 -H fake-d "$CHILD" >"$TMP/out" 2>"$TMP/err"
  expect_eq $? 255 "exit code when ssh fails"
  expect_grep 'host fake-d\) exited with code 255 \(ssh could not reach the host or lost the connection to it\? check TANDEM_SSH\)' "$TMP/err"
  echo "remote ok"
}

case_concurrent() {
  # Two jobs at once on this machine: separate stores and job ids, both pass.
  "$RUN" -np 4 "$CHILD" --print-env --store-barrier --sleep 0.3 >"$TMP/out1" 2>"$TMP/err1" &
  a=$!
  "$RUN" -np 4 "$CHILD" --print-env --store-barrier --sleep 0.3 >"$TMP/out2" 2>"$TMP/err2" &
  b=$!
  wait $a || { cat "$TMP/err1"; fail "job 1 exit"; }
  wait $b || { cat "$TMP/err2"; fail "job 2 exit"; }
  expect_eq "$(grep -c 'barrier passed' "$TMP/out1")" 4 "job 1 barrier"
  expect_eq "$(grep -c 'barrier passed' "$TMP/out2")" 4 "job 2 barrier"
  s1=$(grep -o 'store=[^ ]* job=[^ ]*' "$TMP/out1" | sort -u)
  s2=$(grep -o 'store=[^ ]* job=[^ ]*' "$TMP/out2" | sort -u)
  expect_eq "$(echo "$s1" | wc -l)" 1 "job 1 store/id"
  [ "${s1%% *}" != "${s2%% *}" ] || fail "both jobs got store ${s1%% *}"
  [ "${s1##* }" != "${s2##* }" ] || fail "both jobs got ${s1##* }"
  echo "concurrent ok"
}

case_secret() {
  # A given secret reaches ssh ranks on stdin, never in the remote command;
  # the job only passes if every rank holds the same one (the store checks).
  export FAKE_SSH_LOG="$TMP/ssh.log"
  export TANDEM_SSH="$HERE/fake_ssh.sh"
  export TANDEM_AGENT=0 # each rank over ssh first; through an agent below
  known="launcher-secret-$$-0123456789abcdef0123456789"
  TANDEM_SECRET="$known" "$RUN" -np 3 -H fake-s:2,localhost:1 "$CHILD" --store-barrier >"$TMP/out" 2>"$TMP/err" ||
    { cat "$TMP/err"; fail "job with TANDEM_SECRET exit $?"; }
  expect_eq "$(grep -c 'barrier passed' "$TMP/out")" 3 "ranks through the store"
  if grep -q "$known" "$FAKE_SSH_LOG"; then fail "the secret is in the ssh command line"; fi
  expect_grep 'read -r TANDEM_SECRET' "$FAKE_SSH_LOG"
  # Through an agent: not on its command line, not in its environment (nor
  # its ssh's); every rank has it (the barrier passes).
  : >"$FAKE_SSH_LOG"
  TANDEM_AGENT= TANDEM_SECRET="$known" "$RUN" -np 2 -H fake-s:2 "$CHILD" --store-barrier --sleep 3 >"$TMP/out" 2>"$TMP/err" &
  job=$!
  agent=
  for _ in $(seq 1 100); do agent=$(pgrep -f "^$(cd "$(dirname "$RUN")" && pwd)/tandem-agent\$" | head -1); [ -n "$agent" ] && break; sleep 0.05; done
  [ -n "$agent" ] || fail "no tandem-agent runs while the job does"
  if tr '\0' '\n' <"/proc/$agent/environ" | grep -q "$known"; then fail "the secret is in the agent's environment"; fi
  wait $job || { cat "$TMP/err"; fail "job through an agent with TANDEM_SECRET exit $?"; }
  expect_eq "$(grep -c 'barrier passed' "$TMP/out")" 2 "ranks through the store, agent"
  expect_grep 'tandem-agent' "$FAKE_SSH_LOG"
  if grep -q "$known" "$FAKE_SSH_LOG"; then fail "the secret is in the agent's ssh command line"; fi
  # Programs that log their settings (tandem-bench's "# env:") leave the secret out.
  TANDEM_SECRET="$known" "$RUN" -np 2 "$(dirname "$RUN")/tandem-bench" allreduce -b 4K -e 4K -n 1 -w 0 >"$TMP/out" 2>&1 ||
    { cat "$TMP/out"; fail "tandem-bench exit $?"; }
  expect_grep '# env:' "$TMP/out"
  if grep -q "$known" "$TMP/out"; then fail "tandem-bench printed the secret"; fi
  # tandemrun's own secret (none given) reaches them the same way.
  : >"$FAKE_SSH_LOG"
  env -u TANDEM_SECRET -u TANDEM_SECRET_FILE "$RUN" -np 2 -H fake-s:2 "$CHILD" --store-barrier >"$TMP/out" 2>"$TMP/err" ||
    { cat "$TMP/err"; fail "job with a generated secret exit $?"; }
  if grep -Eq 'TANDEM_SECRET=' "$FAKE_SSH_LOG"; then fail "a secret is in the ssh command line"; fi
  # A secret file others can read is refused, naming the fix, before any rank starts.
  printf '%s\n' "$known" >"$TMP/secret"
  chmod 644 "$TMP/secret"
  env -u TANDEM_SECRET TANDEM_SECRET_FILE="$TMP/secret" "$RUN" -np 2 "$CHILD" --store-barrier >"$TMP/out" 2>"$TMP/err"
  expect_eq $? 1 "exit code with a loose secret file"
  expect_grep "refusing TANDEM_SECRET_FILE .*chmod 600" "$TMP/err"
  if grep -q "$known" "$TMP/err"; then fail "the error shows the secret"; fi
  chmod 600 "$TMP/secret"
  env -u TANDEM_SECRET TANDEM_SECRET_FILE="$TMP/secret" "$RUN" -np 2 "$CHILD" --store-barrier >"$TMP/out" 2>"$TMP/err" ||
    { cat "$TMP/err"; fail "job with a 0600 secret file exit $?"; }
  # Too short a secret is refused.
  TANDEM_SECRET=short "$RUN" -np 2 "$CHILD" >"$TMP/out" 2>"$TMP/err"
  expect_eq $? 1 "exit code with a short secret"
  expect_grep "at least 32" "$TMP/err"
  echo "secret ok"
}

"case_$CASE"
