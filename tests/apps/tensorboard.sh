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
