#!/usr/bin/env bash
# Elastic training at ZeRO stages 1-3 (buddy replicas of the shards), all
# ranks on this host (one host: each rank's buddy is the next rank).
#
#   zero.sh B kill STAGE   4 ranks at ZeRO stage STAGE; kill -9 of rank 0's
#                          process at step 20 and of rank 2's 10 steps into
#                          the next epoch, each replaced: the lost shards
#                          come from the buddies' replica files ("rebuilt from
#                          the replica files" in the log, no disk fallback) and every
#                          step's loss and the final parameters equal a
#                          fault-free run's, bit for bit
#   zero.sh B shrink STAGE 4 -> 3 -> 2 ranks by kill -9 without replacement:
#                          the shards are cut anew for each world size
#                          from the survivors' shards and the buddies'
#                          copies; the global batch is kept and every
#                          step's loss and the final parameters equal the
#                          fault-free run's, bit for bit (deterministic
#                          reduction)
#   zero.sh B config       train-gpt under plain tandemrun -np 4 with a config
#                          whose "elasticity" block is enabled: it trains
#                          elastically with DeepSpeed's batch (max 30, micro
#                          sizes 3 and 6, 2..4 ranks: 24 = 6 x 1 x 4); a
#                          batch key beside the block is refused
#   zero.sh B fence STAGE  4 ranks at ZeRO stage STAGE; the copies of
#                          commits 20 and 21 (after steps 19 and 20) held
#                          back 2 s each (TANDEM_TEST_ELASTIC_SLOW_COMMITS),
#                          every process stopped right after commit 21 and
#                          rank 0's killed: its copy of 21 was never sent,
#                          so the survivors rebuild commit 20, whose copies
#                          were taken while step 20 ran; they must hold
#                          step 19's values although step 20's optimizer
#                          wrote the shards (the fence before it waited):
#                          every loss and the final parameters equal the
#                          fault-free run's, bit for bit
#   zero.sh B buddy        stage 1, checkpoints every 10 steps (--save):
#                          ranks 1 and 2 (rank 1's buddy) killed together,
#                          both replaced: rank 1's shard is in no memory,
#                          the job falls back to the disk checkpoint and
#                          says so, redoes the steps since it, and its
#                          losses and final parameters still equal the
#                          fault-free run's
set -u
B=$2
case_name=$1
RUN="$B/bin/tandemrun"
GPT="$B/bin/train-gpt"
work=$(mktemp -d /tmp/tandem-el2-XXXXXX)
bg=
cleanup() {
  [ -n "$bg" ] && kill -9 -- "-$bg" 2>/dev/null
  [ -n "${EL2_KEEP:-}" ] && cp "$work/out" "$EL2_KEEP" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
export TANDEM_PROGRESS=plain

fail() {
  echo "FAIL($case_name): $*"
  [ -f "$work/out" ] && { echo "---- tandemrun output (without step lines):"; grep -v "step [0-9]* loss" "$work/out" | tail -40; }
  exit 1
}
wait_for() { # FILE PATTERN [SECONDS]: block until PATTERN appears in FILE
  local n=$(( ${3:-90} * 20 ))
  for _ in $(seq 1 "$n"); do
    grep -q -- "$2" "$1" && return 0
    sleep 0.05
  done
  fail "'$2' did not appear in $1"
}
pid_of() { sed -n "s/.*elastic process $2 (pid \([0-9]*\)).*/\1/p" "$1" | head -1; }
live_pids() { # the job's processes still alive
  local p
  for p in $(sed -n 's/.*elastic process [0-9]* (pid \([0-9]*\)).*/\1/p' "$1"); do
    kill -0 "$p" 2>/dev/null && echo "$p"
  done
}
# stopped_at OUT STEP: every process stopped itself after step STEP
# (TANDEM_TEST_STOP_AT): block until all of them are stopped.
stopped_at() {
  local p n
  wait_for "$1" "step $2 loss"
  for _ in $(seq 1 1800); do
    n=0
    for p in $(live_pids "$1"); do
      [ "$(awk '{print $3}' /proc/$p/stat 2>/dev/null)" = T ] || n=$((n + 1))
    done
    [ "$n" = 0 ] && return 0
    sleep 0.05
  done
  fail "the processes did not all stop after step $2"
}
# kill_stopped OUT ID...: kill -9 the processes with these launch numbers
# (all stopped at a known step), continue the others.
kill_stopped() {
  local out=$1 victims=""
  shift
  for id in "$@"; do victims="$victims $(pid_of "$out" "$id")"; done
  kill -9 $victims
  kill -CONT $(live_pids "$out") 2>/dev/null
}
losses() { sed -n 's/.*train-gpt: step \([0-9]*\) loss \([^ ]*\) .*/\1 \2/p' "$1" | sort -n -k1,1 -s | awk '{l[$1]=$2} END {for (s in l) print s, l[s]}' | sort -n; }
exact() { sed -n 's/.*elastic final_loss_exact=\([^ ]*\) params_hash=\([^ ]*\).*/\1 \2/p' "$1"; }
start() { local out=$1; shift; setsid "$RUN" "$@" >"$out" 2>&1 & bg=$!; }
finish() {
  wait "$bg"
  local rc=$?
  bg=
  [ "$rc" = "$1" ] || { cat "$2" | grep -v "step [0-9]* loss" | tail -60; fail "tandemrun exited $rc, expected $1"; }
}
compare() { # the faulted run against the fault-free one, N steps
  [ "$(losses "$work/ref" | wc -l)" = "$1" ] || fail "the fault-free run did not report $1 steps"
  diff <(losses "$work/ref") <(losses "$work/out") >"$work/diff" || { head "$work/diff"; fail "step losses differ"; }
  [ "$(exact "$work/ref")" = "$(exact "$work/out")" ] || fail "final loss or parameters differ: $(exact "$work/ref") vs $(exact "$work/out")"
  echo "$1 step losses and the final parameters equal the fault-free run's: $(exact "$work/out")"
}
model="--layers 2 --channels 64 --heads 2 --seq 64 --threads 1 --sample 0 --micro-batch 3"

case "$case_name" in
kill)
  stage=$3
  args="$model --steps 120 --zero-stage $stage"
  "$RUN" --min-np 2 --max-np 4 -np 4 "$GPT" $args >"$work/ref" 2>&1 || { cat "$work/ref"; fail "fault-free run"; }
  # (the survivors wait for each replacement: two epochs, both at world 4)
  TANDEM_ELASTIC_REPLACE_WAIT=60 TANDEM_TEST_STOP_AT=1:20,2:50 TANDEM_LOG=info start "$work/out" --min-np 2 --max-np 4 -np 4 --max-restarts 2 "$GPT" $args
  stopped_at "$work/out" 20
  kill_stopped "$work/out" 0
  wait_for "$work/out" "elastic epoch 2:"
  stopped_at "$work/out" 50
  kill_stopped "$work/out" 2
  finish 0 "$work/out"
  grep -v "step [0-9]* loss" "$work/out" | grep -E "elastic|killed" | grep -E "rebuilt|disk|killed|epoch [0-9]:" | head -30
  grep -q "elastic epoch 3: world=4" "$work/out" || fail "no third epoch at world 4 (two faults, two replacements)"
  grep -q "rebuilt from the replica files" "$work/out" || fail "the log does not say the shards were rebuilt from the buddies' replica files"
  grep -q "falling back to the disk" "$work/out" && fail "fell back to the disk with every shard in some memory"
  compare 120
  ;;
shrink)
  args="$model --steps 150 --zero-stage $3"
  "$RUN" --min-np 2 --max-np 4 -np 4 "$GPT" $args >"$work/ref" 2>&1 || { cat "$work/ref"; fail "fault-free run"; }
  TANDEM_TEST_STOP_AT=1:20,2:50 TANDEM_LOG=info start "$work/out" --min-np 2 --max-np 4 -np 4 --max-restarts 0 "$GPT" $args
  stopped_at "$work/out" 20
  kill_stopped "$work/out" 2
  wait_for "$work/out" "world=3 global_batch=12 (micro 2 x accum 2"
  stopped_at "$work/out" 50
  kill_stopped "$work/out" 1
  wait_for "$work/out" "world=2 global_batch=12 (micro 3 x accum 2"
  finish 0 "$work/out"
  grep -v "step [0-9]* loss" "$work/out" | grep -E "rebuilt|disk|killed|epoch [0-9]:"
  grep -q "epoch 3: rank 0: sharded state of commit [0-9]* rebuilt from the replica files" "$work/out" || fail "no rebuild at world 2"
  compare 150 # deterministic reduction: bit for bit at every world size
  echo "4 -> 3 -> 2 ranks at stage $3"
  ;;
config)
  printf '{"elasticity": {"enabled": true, "max_train_batch_size": 30, "micro_batch_sizes": [3, 6], "min_gpus": 2, "max_gpus": 4}}' >"$work/cfg.json"
  "$RUN" -np 4 "$GPT" ${model/--micro-batch 3/} --steps 5 --config "$work/cfg.json" >"$work/out" 2>&1 || fail "the elastic run from the config failed"
  grep -q "elastic epoch 1: world=4 global_batch=24 (micro 6 x accum 1 x 4 ranks)" "$work/out" || fail "not elastic with the batch 24"
  grep -q "elastic final_loss_exact=" "$work/out" || fail "no elastic summary"
  printf '{"train_batch_size": 16, "elasticity": {"enabled": true, "max_train_batch_size": 30, "micro_batch_sizes": [3]}}' >"$work/bad.json"
  "$RUN" -np 2 "$GPT" $model --steps 5 --config "$work/bad.json" >"$work/out" 2>&1 && fail "a batch key beside the block was accepted"
  grep -q "ignore_non_elastic_batch_info" "$work/out" || fail "no message naming ignore_non_elastic_batch_info"
  echo "train-gpt trained elastically from the config's elasticity block (batch 24)"
  ;;
fence)
  args="$model --steps 30 --zero-stage $3"
  "$RUN" --min-np 2 --max-np 4 -np 4 "$GPT" $args >"$work/ref" 2>&1 || { cat "$work/ref"; fail "fault-free run"; }
  TANDEM_TEST_ELASTIC_SLOW_COMMITS=20:21 TANDEM_TEST_STOP_AT=1:20 TANDEM_LOG=info start "$work/out" --min-np 2 --max-np 4 -np 4 --max-restarts 0 "$GPT" $args
  stopped_at "$work/out" 20
  kill_stopped "$work/out" 0
  finish 0 "$work/out"
  grep -v "step [0-9]* loss" "$work/out" | grep -E "rebuilt|disk|killed|epoch [0-9]:"
  grep -q "epoch 2: rank 0: sharded state of commit 20 rebuilt from the replica files" "$work/out" ||
    fail "the survivors did not rebuild commit 20 (step 19's state) from the replica files"
  compare 30
  ;;
buddy)
  args="$model --steps 80 --zero-stage 1"
  "$RUN" --min-np 2 --max-np 4 -np 4 "$GPT" $args >"$work/ref" 2>&1 || { cat "$work/ref"; fail "fault-free run"; }
  TANDEM_TEST_STOP_AT=1:25 TANDEM_LOG=info start "$work/out" --min-np 2 --max-np 4 -np 4 --max-restarts 2 "$GPT" $args --save "$work/ckpt" --save-every 10
  stopped_at "$work/out" 25
  kill_stopped "$work/out" 1 2
  finish 0 "$work/out"
  grep -v "step [0-9]* loss" "$work/out" | grep -E "elastic|killed" | grep -E "rebuilt|disk|killed|epoch [0-9]:" | head -30
  grep -q "held by no survivor (a rank and its buddy were both lost): falling back to the disk checkpoint" "$work/out" ||
    fail "the log does not say that the job fell back to the disk checkpoint"
  grep -q "resumed from the disk checkpoint in $work/ckpt at step 20 " "$work/out" || fail "no resume from the step-20 checkpoint"
  compare 80
  ;;
*) fail "unknown case" ;;
esac
echo "PASS($case_name)"
