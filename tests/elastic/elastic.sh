#!/usr/bin/env bash
# Elastic training end to end: tandemrun --min-np/--max-np with train-gpt
# (elastic mode), real faults (kill -9, SIGSTOP), all ranks on this host.
#
#   elastic.sh B kill     kill -9 of rank 0's process at step 20 and of
#                         another 10 steps into the next epoch, each
#                         replaced (the survivors wait for the replacement,
#                         TANDEM_ELASTIC_REPLACE_WAIT=60, so the world stays
#                         4): every step's loss and the final parameters
#                         equal a fault-free run's, bit for bit
#   elastic.sh B kill-nowait  the same with TANDEM_ELASTIC_REPLACE_WAIT=0:
#                         the survivors go on without a replacement that
#                         has not joined when they look, which then joins
#                         at a later commit; the job ends at 4 ranks, bit
#                         for bit as well
#   elastic.sh B resize   4 -> 3 -> 2 by kill -9 without replacement, then
#                         back to 4 through the discovery script: every
#                         world size seen, the global batch kept, every
#                         step's loss and the final parameters equal the
#                         fault-free run's, bit for bit (deterministic
#                         reduction: every world size sums in one order)
#   elastic.sh B stale    SIGSTOP a process until the others formed epoch
#                         2 without it, then SIGCONT: it is refused (stale
#                         epoch), exits, and the job finishes
#   elastic.sh B stop-parent  --end-stopped: a SIGSTOPped process is seen
#                         by tandemrun (waitpid WUNTRACED), ended, reported
#                         and replaced at once (heartbeats 60 s): bit for bit
#   elastic.sh B grow-together  two processes started together (one a
#                         second slower) join in one membership change
#                         (TANDEM_ELASTIC_JOIN_WAIT), two without the wait
#   elastic.sh B abandon  a member killed between the close of its round and
#                         the epoch's rendezvous: the others abandon that
#                         rendezvous at once and form the next epoch
#   elastic.sh B abandon-connect  the same, killed after the epoch's
#                         rendezvous exchanged addresses, before it connected
#                         (TCP): the others stop waiting for its connection
#                         at once (on the code before, TANDEM_CONNECT_TIMEOUT)
#   elastic.sh B below    2 ranks, --min-np 2, one killed, no restarts:
#                         tandemrun stops the job after --elastic-timeout
#                         with a message naming --min-np, exit 1; again
#                         with the survivor's own timeout (2 s) shorter
#                         than tandemrun's (6 s): the same kind of line
#   elastic.sh B backoff  processes that fail at once on two hosts
#                         (localhost and 127.0.0.1, both local): each
#                         replacement goes to the host that failed longest
#                         ago, and a host whose processes keep failing young
#                         is backed off 1, 2, ... s, so --max-restarts 8 is
#                         not used up in a burst (tandemrun's back-off)
#   elastic.sh B batch    global batch 8 on 4 ranks loses one: 3 cannot
#                         keep it; every survivor stops with a message
#                         listing the world sizes that would work
set -u
B=$2
case_name=$1
RUN="$B/bin/tandemrun"
GPT="$B/bin/train-gpt"
work=$(mktemp -d /tmp/tandem-elastic-XXXXXX)
bg=
cleanup() {
  [ -n "$bg" ] && kill -9 -- "$bg" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM # the runner's timeout: clean up too
export TANDEM_PROGRESS=plain
TINY="--layers 1 --channels 32 --heads 2 --seq 32 --threads 1 --sample 0"

fail() {
  echo "FAIL($case_name): $*"
  [ -f "$work/out" ] && { echo "---- tandemrun output (without step lines):"; grep -v "step [0-9]* loss" "$work/out" | tail -40; }
  exit 1
}

# wait_for FILE PATTERN [SECONDS]: block (polling the output file) until
# PATTERN appears; fail if it does not within SECONDS.
wait_for() {
  local n=$(( ${3:-60} * 20 ))
  for _ in $(seq 1 "$n"); do
    grep -q -- "$2" "$1" && return 0
    sleep 0.05
  done
  cat "$1"
  fail "'$2' did not appear in $1"
}
# (waits for the line: tandemrun relays each rank's output on its own, so
# rank 0's step lines can come before rank 1's first line on a loaded machine)
pid_of() {
  wait_for "$1" "elastic process $2 (pid" >&2
  sed -n "s/.*elastic process $2 (pid \([0-9]*\)).*/\1/p" "$1" | head -1
}
# kill_frozen OUT ID: stop every process of the job at once, kill -9 process
# ID, let the others go on. A loaded machine may run this script slowly
# next to fast steps: freezing the job makes the fault land where the
# script saw it (a SIGSTOP is invisible to shared-memory peers).
kill_frozen() { # kill_frozen OUT ID [SIGNAL]
  local pids victim keep
  pids=$(sed -n 's/.*elastic process [0-9]* (pid \([0-9]*\)).*/\1/p' "$1")
  victim=$(pid_of "$1" "$2")
  kill -STOP $pids 2>/dev/null
  kill "-${3:-9}" "$victim"
  keep=$(echo "$pids" | grep -vx "$victim")
  kill -CONT $keep 2>/dev/null
}
# "step loss" pairs, the last report of each step (a redone step reports twice, equally).
losses() { sed -n 's/.*train-gpt: step \([0-9]*\) loss \([^ ]*\) .*/\1 \2/p' "$1" | sort -n -k1,1 -s | awk '{l[$1]=$2} END {for (s in l) print s, l[s]}' | sort -n; }
exact() { sed -n 's/.*elastic final_loss_exact=\([^ ]*\) params_hash=\([^ ]*\).*/\1 \2/p' "$1"; }

# start OUT ARGS...: tandemrun in the background, its process group in $bg.
start() {
  local out=$1
  shift
  setsid "$RUN" "$@" >"$out" 2>&1 &
  bg=$!
}
finish() { # finish EXPECTED_RC OUT
  wait "$bg"
  local rc=$?
  bg=
  [ "$rc" = "$1" ] || { cat "$2"; fail "tandemrun exited $rc, expected $1"; }
}

case "$case_name" in
kill | kill-nowait)
  # Steps slow enough (a larger model than TINY) for the script to act
  # between them on a loaded machine.
  if [ "$case_name" = kill ]; then export TANDEM_ELASTIC_REPLACE_WAIT=60; else export TANDEM_ELASTIC_REPLACE_WAIT=0; fi
  model="--layers 2 --channels 64 --heads 2 --seq 64 --threads 1 --sample 0"
  args="$model --steps 300 --micro-batch 3"
  "$RUN" --min-np 2 --max-np 4 -np 4 "$GPT" $args >"$work/ref" 2>&1 || { cat "$work/ref"; fail "fault-free run"; }
  start "$work/out" --min-np 2 --max-np 4 -np 4 --max-restarts 2 "$GPT" $args
  wait_for "$work/out" "step 20 loss"
  kill_frozen "$work/out" 0
  wait_for "$work/out" "elastic epoch 2:"
  from=$(sed -n 's/.*elastic epoch 2: .* from step \([0-9]*\).*/\1/p' "$work/out")
  wait_for "$work/out" "step $((from + 10)) loss"
  kill_frozen "$work/out" 2
  finish 0 "$work/out"
  grep -v "step [0-9]* loss" "$work/out"
  if [ "$case_name" = kill ]; then
    grep -q "elastic epoch 2: world=4" "$work/out" || fail "epoch 2 is not at world 4 (the survivors did not wait for the replacement)"
    grep -q "elastic epoch 3: world=4" "$work/out" || fail "no third epoch at world 4 (two faults, two replacements)"
  else
    # Whether a replacement makes its round (a local start can take under a
    # millisecond of the survivors' time) depends on the machine; the rule
    # itself is checked by test_elastic_units (epoch 5 there).
    grep "elastic epoch [0-9]*: world=" "$work/out"
    grep "elastic epoch [0-9]*: world=" "$work/out" | tail -1 | grep -q "world=4" ||
      fail "the job did not end at 4 ranks (the replacements did not join at a later commit)"
  fi
  grep -q "process 0 .*was killed by signal 9" "$work/out" || fail "rank 0's process was not the one lost first"
  [ "$(losses "$work/ref" | wc -l)" = 300 ] || fail "the fault-free run did not report 300 steps"
  diff <(losses "$work/ref") <(losses "$work/out") >"$work/diff" || { head "$work/diff"; fail "step losses differ"; }
  [ "$(exact "$work/ref")" = "$(exact "$work/out")" ] || fail "final loss or parameters differ: $(exact "$work/ref") vs $(exact "$work/out")"
  echo "300 step losses and the final parameters equal the fault-free run's: $(exact "$work/out")"
  ;;
resize)
  # A larger model than TINY: its steps are slow enough (about 10 ms) for
  # the script to act between them.
  args="--layers 2 --channels 64 --heads 2 --seq 64 --threads 1 --sample 0 --steps 300 --micro-batch 3"
  echo localhost:4 >"$work/hosts"
  printf '#!/bin/sh\ncat %s\n' "$work/hosts" >"$work/discover"
  chmod +x "$work/discover"
  export TANDEM_DISCOVERY_INTERVAL=0.05
  "$RUN" --min-np 2 --max-np 4 -np 4 "$GPT" $args >"$work/ref" 2>&1 || { cat "$work/ref"; fail "fault-free run"; }
  TANDEM_LOG=info start "$work/out" --min-np 2 --max-np 4 -np 4 --host-discovery-script "$work/discover" "$GPT" $args
  wait_for "$work/out" "step 20 loss"
  echo localhost:3 >"$work/hosts" # no replacement for the next loss
  wait_for "$work/out" "discovered hosts now: localhost:3"
  kill_frozen "$work/out" 1
  wait_for "$work/out" "world=3 global_batch=12 (micro 2 x accum 2"
  echo localhost:2 >"$work/hosts"
  wait_for "$work/out" "discovered hosts now: localhost:2"
  kill_frozen "$work/out" 3
  wait_for "$work/out" "world=2 global_batch=12 (micro 3 x accum 2"
  # Two new processes join. The members stay frozen until both are in
  # line: on a loaded machine the remaining steps could otherwise end the
  # job before the newcomers have started.
  members=$(sed -n 's/.*elastic process [0-9]* (pid \([0-9]*\)).*/\1/p' "$work/out")
  kill -STOP $members 2>/dev/null
  echo localhost:4 >"$work/hosts"
  wait_for "$work/out" "process 4 waits to join" 120
  wait_for "$work/out" "process 5 waits to join" 120
  kill -CONT $members 2>/dev/null
  wait_for "$work/out" "elastic epoch 4: world=4"
  finish 0 "$work/out"
  grep -v "step [0-9]* loss" "$work/out"
  read -r lref _ <<<"$(exact "$work/ref")"
  read -r lout _ <<<"$(exact "$work/out")"
  [ -n "$lref" ] && [ -n "$lout" ] || fail "missing final loss"
  [ "$(losses "$work/out" | wc -l)" = 300 ] || fail "not every step was reported once the job resized"
  # deterministic reduction (src/train/deterministic/): every world size sums in one order
  diff <(losses "$work/ref") <(losses "$work/out") >"$work/diff" || { head "$work/diff"; fail "step losses differ"; }
  [ "$(exact "$work/ref")" = "$(exact "$work/out")" ] || fail "final loss or parameters differ: $(exact "$work/ref") vs $(exact "$work/out")"
  echo "resized 4 -> 3 -> 2 -> 4; 300 step losses and the parameters equal the fault-free run's: $(exact "$work/out")"
  ;;
grow-together)
  # Two processes started together to grow the job 2 -> 4, the second one
  # a second slower (a wrapper sleeps 1 s first, as an ssh start on a loaded
  # host may): the members let the first wait for it (tandemrun counts the
  # joiners on their way, TANDEM_ELASTIC_JOIN_WAIT 2 s by default), so the
  # job goes 2 -> 4 in one membership change, losses bit-identical to a
  # fault-free 4-rank run. With TANDEM_ELASTIC_JOIN_WAIT=0 the same start
  # takes two changes (2 -> 3 -> 4): the wait is what joins them.
  args="--layers 2 --channels 64 --heads 2 --seq 64 --threads 1 --sample 0 --steps 400 --micro-batch 3"
  printf '#!/bin/sh\n[ "$TANDEM_ELASTIC_ID" = 3 ] && sleep 1\nexec %s "$@"\n' "$GPT" >"$work/slow3"
  chmod +x "$work/slow3"
  printf '#!/bin/sh\ncat %s\n' "$work/hosts" >"$work/discover"
  chmod +x "$work/discover"
  export TANDEM_DISCOVERY_INTERVAL=0.05
  "$RUN" --min-np 2 --max-np 4 -np 4 "$GPT" $args >"$work/ref" 2>&1 || { cat "$work/ref"; fail "fault-free run"; }
  for wait in default 0; do
    echo localhost:2 >"$work/hosts"
    if [ $wait = default ]; then unset TANDEM_ELASTIC_JOIN_WAIT; else export TANDEM_ELASTIC_JOIN_WAIT=$wait; fi
    start "$work/out" --min-np 2 --max-np 4 -np 2 --host-discovery-script "$work/discover" "$work/slow3" $args \
      --grad-accum 2
    wait_for "$work/out" "step 20 loss"
    echo localhost:4 >"$work/hosts"
    finish 0 "$work/out"
    grep "elastic epoch [0-9]*: world=\|starting process" "$work/out"
    worlds=$(sed -n 's/.*elastic epoch [0-9]*: world=\([0-9]*\) .*/\1/p' "$work/out" | tr '\n' ' ')
    if [ $wait = default ]; then
      [ "$worlds" = "2 4 " ] || fail "with the join wait the worlds were '$worlds', expected '2 4 ' (one change)"
      diff <(losses "$work/ref") <(losses "$work/out") >"$work/diff" || { head "$work/diff"; fail "step losses differ"; }
      [ "$(exact "$work/ref")" = "$(exact "$work/out")" ] ||
        fail "final loss or parameters differ: $(exact "$work/ref") vs $(exact "$work/out")"
    else
      [ "$worlds" = "2 3 4 " ] || fail "without the join wait the worlds were '$worlds', expected '2 3 4 '"
    fi
  done
  echo "grown 2 -> 4 in one change with the join wait (2 -> 3 -> 4 without); losses equal the fault-free run's"
  ;;
abandon | abandon-connect)
  # Process 1 killed; its replacement (process 3) joins the round of epoch
  # 2 and stops itself before it is in the epoch, then is killed:
  #   abandon: right after the round closed, before the epoch's rendezvous
  #     (TANDEM_TEST_ELASTIC_STOP_AFTER_ROUND): the others wait for its
  #     store keys;
  #   abandon-connect: once epoch 2's addresses are exchanged
  #     (TANDEM_TEST_ELASTIC_STOP_BEFORE_CONNECT, TCP): the others wait for
  #     its connection (the s26 200-fault run waited TANDEM_CONNECT_TIMEOUT
  #     there for an evicted process).
  # The others must give up as soon as tandemrun reports process 3 lost, not
  # after TANDEM_CONNECT_TIMEOUT (40 s here), and go on in epoch 3 with
  # process 4. (The survivors wait for the replacement, so that it is in
  # epoch 2's round.)
  if [ "$case_name" = abandon ]; then
    export TANDEM_TEST_ELASTIC_STOP_AFTER_ROUND=3
    where="after its round closed"
    gave_up="rendezvous of communicator .* was abandoned: process 3, rank [0-9] of epoch 2, was reported lost"
  else
    export TANDEM_TRANSPORT=tcp TANDEM_TEST_ELASTIC_STOP_BEFORE_CONNECT=3
    where="before connecting"
    gave_up="tcp: rank [0-9] gave up .*: process 3, rank [0-9] of epoch 2, was reported lost"
  fi
  export TANDEM_CONNECT_TIMEOUT=40 TANDEM_ELASTIC_REPLACE_WAIT=60
  start "$work/out" --min-np 2 --max-np 3 -np 3 --max-restarts 2 "$GPT" \
    --layers 2 --channels 64 --heads 2 --seq 64 --threads 1 --sample 0 --steps 80 --micro-batch 4
  wait_for "$work/out" "step 20 loss"
  kill_frozen "$work/out" 1
  wait_for "$work/out" "starting process 3 on host"
  p3=
  for _ in $(seq 1 1200); do
    for pid in $(pgrep -P "$bg"); do
      tr '\0' '\n' 2>/dev/null <"/proc/$pid/environ" | grep -qx "TANDEM_ELASTIC_ID=3" && p3=$pid
    done
    [ -n "$p3" ] && [ "$(awk '{ print $3 }' "/proc/$p3/stat" 2>/dev/null)" = T ] && break
    sleep 0.05
  done
  [ "$(awk '{ print $3 }' "/proc/$p3/stat" 2>/dev/null)" = T ] || fail "process 3 did not stop $where"
  t0=$(date +%s.%N)
  kill -9 "$p3"
  wait_for "$work/out" "elastic epoch 3:" 60
  t1=$(date +%s.%N)
  finish 0 "$work/out"
  grep -v "step [0-9]* loss" "$work/out"
  grep -q "$gave_up" "$work/out" || fail "the survivors did not give up waiting for process 3 ($where)"
  took=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  awk -v t="$took" 'BEGIN { exit !(t < 20) }' || fail "epoch 3 formed $took s after process 3 was lost (TANDEM_CONNECT_TIMEOUT is 40 s)"
  echo "process 3 stopped $where: given up; epoch 3 formed $took s after its member was lost"
  ;;
stale)
  export TANDEM_TRANSPORT=tcp TANDEM_HEARTBEAT_TIMEOUT=2 TANDEM_HEARTBEAT_INTERVAL=0.25 TANDEM_ELASTIC_SETTLE=3
  start "$work/out" --min-np 2 --max-np 4 -np 4 --max-restarts 0 "$GPT" \
    --layers 2 --channels 64 --heads 2 --seq 64 --threads 1 --sample 0 --steps 300 --micro-batch 3
  wait_for "$work/out" "step 20 loss"
  pid=$(pid_of "$work/out" 2)
  kill_frozen "$work/out" 2 STOP
  wait_for "$work/out" "elastic epoch 2: world=3"
  kill -CONT "$pid"
  finish 0 "$work/out"
  grep -v "step [0-9]* loss" "$work/out"
  grep -q "process 2 of epoch 1 is stale: the job already formed epoch 2 without it" "$work/out" ||
    fail "the stopped process was not refused as stale"
  grep -q "process 2 (pid $pid, host localhost) exited with code 1" "$work/out" || fail "the stale process did not exit 1"
  # Without --end-stopped the stop is said (waitpid WUNTRACED) and left to the heartbeats.
  grep -q "tandemrun: process 2 (pid $pid, host localhost) was stopped by signal 19 (SIGSTOP); its peers fail when its heartbeats are missed" "$work/out" ||
    fail "tandemrun did not say that process 2 stopped"
  ;;
stop-parent)
  # --end-stopped: tandemrun sees a SIGSTOP of a local process through
  # waitpid(WUNTRACED), ends it and reports it lost, so the survivors go on
  # at once. Heartbeats and the settle time are 60 s here: only the parent's
  # notice can make epoch 2 within 20 s. The replacement joins; losses and
  # parameters equal a fault-free run's, bit for bit. Without the flag a
  # stop is only said (the stale case above), and --end-stopped needs
  # elastic mode.
  export TANDEM_TRANSPORT=tcp TANDEM_HEARTBEAT_TIMEOUT=60 TANDEM_HEARTBEAT_INTERVAL=1 TANDEM_ELASTIC_SETTLE=60
  out=$("$RUN" -np 2 --end-stopped "$GPT" $TINY --steps 1 2>&1) && fail "--end-stopped without elastic mode accepted"
  echo "$out" | grep -q "end-stopped need elastic mode: add --min-np A --max-np B" || fail "no clear refusal: $out"
  args="--layers 2 --channels 64 --heads 2 --seq 64 --threads 1 --sample 0 --steps 200 --micro-batch 3"
  "$RUN" --min-np 2 --max-np 4 -np 4 "$GPT" $args >"$work/ref" 2>&1 || { cat "$work/ref"; fail "fault-free run"; }
  start "$work/out" --min-np 2 --max-np 4 -np 4 --max-restarts 1 --end-stopped "$GPT" $args
  wait_for "$work/out" "step 20 loss"
  pid=$(pid_of "$work/out" 2)
  t0=$(date +%s.%N)
  kill -STOP "$pid"
  wait_for "$work/out" "elastic epoch 2:" 20
  t1=$(date +%s.%N)
  finish 0 "$work/out"
  grep -v "step [0-9]* loss" "$work/out"
  echo "stop -> epoch 2: $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }') s"
  grep -q "tandemrun: process 2 (pid $pid, host localhost) was stopped by signal 19 (SIGSTOP), so tandemrun ended it; the job goes on with 3 processes" "$work/out" ||
    fail "tandemrun did not report the stopped process as ended"
  grep -q "tandemrun: starting process 4 on host localhost" "$work/out" || fail "no replacement was started"
  [ -z "$(exact "$work/ref")" ] && fail "the fault-free run printed no final hash"
  [ "$(exact "$work/out")" = "$(exact "$work/ref")" ] ||
    fail "final loss/parameters differ: $(exact "$work/out") vs fault-free $(exact "$work/ref")"
  [ "$(losses "$work/out")" = "$(losses "$work/ref")" ] || fail "the per-step losses differ from the fault-free run's"
  ;;
below)
  # The survivor's own round gives up after the same --elastic-timeout
  # (TANDEM_ELASTIC_TIMEOUT), by its own clock, which may start before
  # tandemrun reaps the dead process. Whichever clock runs out first,
  # tandemrun ends the job with a below --min-np line and exit 1.
  below_line="tandemrun: only [01] process(es)? left, below --min-np 2"
  ours="$below_line, for 2 s \(--elastic-timeout\): stopping the job"
  theirs="$below_line: the last one exited \(a survivor gives up after --elastic-timeout 2 s below --min-np, by its own clock\): stopping the job"
  # A 2-process job at --min-np 2 (tandemrun's --elastic-timeout $1, program
  # $2) loses process 1; the job must end with exit 1. t0: the kill.
  kill_below() {
    start "$work/out" --min-np 2 --max-np 2 -np 2 --max-restarts 0 --elastic-timeout "$1" "$2" $TINY --steps 100000 \
      --micro-batch 3
    wait_for "$work/out" "step 20 loss"
    t0=$(date +%s)
    kill -9 "$(pid_of "$work/out" 1)"
    finish 1 "$work/out"
    grep -v "step [0-9]* loss" "$work/out"
  }
  kill_below 2 "$GPT"
  grep -Eq "$ours|$theirs" "$work/out" || fail "no clear below --min-np message"
  [ $(( $(date +%s) - t0 )) -lt 20 ] || fail "took more than 20 s to stop"
  # The survivor's clock first, for certain: its timeout is 2 s (the
  # workers' environment wins over tandemrun's), tandemrun's 6 s.
  printf '#!/bin/sh\nTANDEM_ELASTIC_TIMEOUT=2 exec %s "$@"\n' "$GPT" >"$work/gpt2"
  chmod +x "$work/gpt2"
  kill_below 6 "$work/gpt2"
  grep -q "elastic: only 1 process joined epoch 2 within 2 s (TANDEM_ELASTIC_TIMEOUT)" "$work/out" || fail "the survivor did not give up by its own clock"
  grep -Eq "${theirs/--elastic-timeout 2 s/--elastic-timeout 6 s}" "$work/out" || fail "no below --min-np line after the survivor gave up first"
  grep -q "every process of the elastic job failed" "$work/out" && fail "reported as every process failed"
  [ $(( $(date +%s) - t0 )) -lt 6 ] || fail "tandemrun waited for its own --elastic-timeout after the last process gave up"
  ;;
backoff)
  # Process 0 lives 8 s and finishes the job; every other one fails at once.
  printf '#!/bin/sh\n[ "$TANDEM_ELASTIC_ID" = 0 ] && { sleep 8; exit 0; }\nexit 1\n' >"$work/flaky"
  chmod +x "$work/flaky"
  start "$work/out" --min-np 1 --max-np 2 -np 2 --max-restarts 8 -H localhost:2,127.0.0.1:2 "$work/flaky"
  wait_for "$work/out" "process 1 (pid [0-9]*, host localhost) exited with code 1" 30
  t0=$(date +%s.%N)
  wait_for "$work/out" "starting process 9 on host" 30
  t9=$(date +%s.%N)
  finish 0 "$work/out"
  cat "$work/out"
  grep -q "starting process 2 on host 127.0.0.1" "$work/out" ||
    fail "the replacement of process 1 (failed on localhost) did not go to the other host"
  grep -q "starting process 9 on host" "$work/out" || fail "not all 8 restarts were used"
  grep -q "no new process there for 1 s" "$work/out" || fail "no 1 s back-off"
  grep -q "no new process there for 2 s" "$work/out" || fail "no 2 s back-off after more failures in a row"
  # replacements 2-5 fail once and twice on each host (the initial process 1 does not count), then each host
  # is backed off 1 s, then 2 s: process 9 starts about 3 s after the first failure; in a burst all 8 would
  # start within a fraction of a second
  took=$(awk -v a="$t0" -v b="$t9" 'BEGIN { printf "%.1f", b - a }')
  awk -v t="$took" 'BEGIN { exit !(t >= 2.5) }' || fail "process 9 started $took s after the first failure: no back-off"
  echo "8 restarts spread over $took s by the back-off"
  ;;
batch)
  start "$work/out" --min-np 2 --max-np 4 -np 4 --max-restarts 0 "$GPT" $TINY --steps 100000 --micro-batch 2
  wait_for "$work/out" "step 20 loss"
  kill -9 "$(pid_of "$work/out" 3)"
  finish 1 "$work/out"
  grep -v "step [0-9]* loss" "$work/out"
  grep -q "the global batch 8 cannot be split over 3 ranks; world sizes that keep it: 1, 2, 4" "$work/out" ||
    fail "no message listing the world sizes that keep the global batch"
  ;;
*)
  fail "unknown case"
  ;;
esac
echo "PASS($case_name)"
