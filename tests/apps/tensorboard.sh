#!/usr/bin/env bash
# --tensorboard against an independent decoder. Usage:
#   tests/apps/tensorboard.sh CASE BUILD_TREE
# gpt:    2 ranks under tandemrun; the event file decoded by Debian's
#         python3-protobuf with code protoc generates from
#         tensorboard/event_subset.proto (TensorFlow's field numbers), its
#         CRCs checked by a bitwise CRC-32C (tensorboard/decode.py); every
#         scalar equal to the JSONL metrics line of its step, the per-layer
#         norm histograms consistent with the per-layer scalars and the
#         gradient norms adding up to the engine's global norm.
# zero2:  at ZeRO stage 2 the gradient is sharded: parameter norms only.
# elastic: an elastic job (3 processes, --save-every 10) loses rank 0's
#         process (kill -9) after step 15, goes on at world 2 with a new
#         rank 0, is killed whole after step 34 (checkpoint at 30) and
#         resumed (--resume) at world 2:
#         three event files; each later rank 0 starts with a SessionLog
#         START at the step it trains first, so that TensorBoard's purge of
#         orphaned steps leaves every step once, with the metrics file's
#         loss (tensorboard/elastic.py replays the files as TensorBoard does).
# errors: a directory that cannot be created fails with a message naming it.
set -u
case_name=$1
B=$2
RUN="$B/bin/tandemrun"
GPT="$B/bin/train-gpt"
TINY="--layers 2 --channels 32 --heads 2 --seq 32 --threads 1"
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/tandem-tb-XXXXXX)
trap 'rm -rf "$work"' EXIT
export TANDEM_PROGRESS=plain
fail() { echo "FAIL($case_name): $*"; exit 1; }

# Debian's interpreter: python3-protobuf is installed for it (a pyenv python
# on PATH may lack it).
PY=/usr/bin/python3
need_decoder() {
  command -v protoc >/dev/null && $PY -c 'import google.protobuf' 2>/dev/null ||
    { echo "SKIP: protoc or python3-protobuf missing (scripts/install-deps)"; exit 0; }
  protoc --proto_path="$here/tensorboard" --python_out="$work" event_subset.proto || fail "protoc failed"
}

check_run() { # EXPECT_GRADS ARGS...
  local grads=$1
  shift
  "$RUN" -np 2 "$GPT" $TINY --micro-batch 2 --sample 0 --metrics "$work/m.jsonl" --tensorboard "$work/tb" "$@" \
    >"$work/out" 2>&1 || { cat "$work/out"; fail "training failed"; }
  local files=("$work"/tb/events.out.tfevents.*)
  [ ${#files[@]} = 1 ] && [ -s "${files[0]}" ] || fail "expected one event file in $work/tb"
  grep -q "TensorBoard events in ${files[0]}" "$work/out" || fail "the event file is not named on stderr"
  $PY "$here/tensorboard/decode.py" "${files[0]}" "$work" "$work/m.jsonl" "$grads" || fail "decoding failed"
}

case "$case_name" in
gpt)
  need_decoder
  check_run 1 --steps 5 --grad-accum 2
  ;;
zero2)
  need_decoder
  check_run 0 --steps 3 --zero-stage 2
  ;;
elastic)
  need_decoder
  model="--layers 2 --channels 64 --heads 2 --seq 64 --threads 1 --sample 0 --micro-batch 2 --steps 200"
  el="--min-np 2 --max-np 3 --max-restarts 0"
  files="--metrics $work/m.jsonl --tensorboard $work/tb --save $work/ck --save-every 10"
  wait_line() { # FILE PATTERN: up to 60 s
    for _ in $(seq 1200); do grep -q -- "$2" "$1" && return 0; sleep 0.05; done
    cat "$1"; fail "'$2' did not appear"
  }
  # Every process stops itself (SIGSTOP) after committing step 15 of epoch
  # 1 and step 34 of epoch 2 (TANDEM_TEST_STOP_AT), so that the faults land
  # at known steps however slowly this script runs on a loaded machine.
  TANDEM_TEST_STOP_AT=1:15,2:34 setsid "$RUN" $el -np 3 "$GPT" $model $files >"$work/out1" 2>&1 &
  tr=$!
  all_stopped() { # N: block until N children of tandemrun are stopped (state T), 120 s at most
    for _ in $(seq 1200); do
      n=0
      for k in $(pgrep -P $tr); do [ "$(awk '{print $3}' /proc/$k/stat 2>/dev/null)" = T ] && n=$((n + 1)); done
      [ "$n" = "$1" ] && return 0
      sleep 0.1
    done
    kill -9 $tr $(pgrep -P $tr) 2>/dev/null
    cat "$work/out1"; fail "not $1 processes stopped"
  }
  all_stopped 3
  wait_line "$work/out1" "elastic process 0 (pid"
  victim=$(sed -n 's/.*elastic process 0 (pid \([0-9]*\)).*/\1/p' "$work/out1")
  # rank 0's process killed; the others go on without it (no restarts) at world 2
  kill -9 "$victim"
  kill -CONT $(pgrep -P $tr | grep -vx "$victim")
  wait_line "$work/out1" "elastic epoch 2:"
  from=$(sed -n 's/.*elastic epoch 2: .* from step \([0-9]*\).*/\1/p' "$work/out1")
  [ "$from" = 15 ] || fail "epoch 2 starts from step $from, not 15"
  all_stopped 2
  # the whole job (tandemrun first, so that it starts nothing) killed after step 34: 4 steps past the checkpoint at 30
  kill -STOP $tr; kids=$(pgrep -P $tr); kill -9 $tr $kids; wait $tr 2>/dev/null
  "$RUN" $el -np 2 "$GPT" $model $files --resume "$work/ck" >"$work/out2" 2>&1 || { cat "$work/out2"; fail "the resumed job failed"; }
  resumed=$(sed -n 's/.*resumed from the disk checkpoint in .* at step \([0-9]*\) .*/\1/p' "$work/out2" | head -1)
  [ -n "$resumed" ] || { cat "$work/out2"; fail "no resume line"; }
  grep -q "final_loss=" "$work/out2" || fail "no summary line"
  $PY "$here/tensorboard/elastic.py" "$work/tb" "$work" "$work/m.jsonl" "$((from + 1)),$((resumed + 1))" ||
    { ls -l "$work/tb"; fail "the event files do not replay to one loss per step"; }
  ;;
errors)
  "$GPT" $TINY --steps 1 --sample 0 --tensorboard /nonexistent-dir/tb >"$work/out" 2>&1
  rc=$?
  [ $rc = 1 ] || { cat "$work/out"; fail "expected exit 1, got $rc"; }
  grep -q "cannot create the directory /nonexistent-dir/tb" "$work/out" || { cat "$work/out"; fail "no clear message"; }
  echo "unwritable directory reported"
  ;;
*)
  echo "unknown case $case_name"
  exit 2
  ;;
esac
