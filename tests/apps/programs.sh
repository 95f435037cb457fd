#!/usr/bin/env bash
# Program-level tests of train-gpt and train-fmnist, with tiny models so that
# each finishes in seconds (also under ASan). Usage:
#   tests/apps/programs.sh CASE BUILD_TREE
# CASE: gpt-summary | gpt-resume | gpt-config-errors | gpt-corrupt-checkpoint |
#       gpt-keep-last | gpt-world-sizes | fmnist-summary | fmnist-elastic-save
# Each case checks closed outcomes: exit codes, the summary line's keys,
# losses equal step by step, error messages that name the problem.
set -u
case_name=$1
B=$2
RUN="$B/bin/tandemrun"
GPT="$B/bin/train-gpt"
FMNIST="$B/bin/train-fmnist"
TINY="--layers 1 --channels 32 --heads 2 --seq 32 --threads 1"
work=$(mktemp -d /tmp/tandem-apps-XXXXXX)
trap 'rm -rf "$work"' EXIT
export TANDEM_PROGRESS=plain

fail() { echo "FAIL($case_name): $*"; exit 1; }

# The value of KEY= in the summary line of a program's stdout file.
summary_value() { grep -o "$2=[^ ]*" "$1" | head -1 | cut -d= -f2; }

# Losses of the step lines of a metrics file, one per line as "step loss".
metrics_losses() { sed -n 's/^{"step":\([0-9]*\),"loss":\([^,]*\),.*/\1 \2/p' "$1"; }

# |a-b| <= rtol*|b|
close_rel() { awk -v a="$1" -v b="$2" -v r="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b; exit !(d <= r * m) }'; }

expect_exit() { # expect_exit CODE OUTFILE CMD...
  local want=$1 out=$2
  shift 2
  "$@" >"$out" 2>&1
  local rc=$?
  [ "$rc" = "$want" ] || { cat "$out"; fail "expected exit $want, got $rc from: $*"; }
}

# A small IDX copy of Fashion-MNIST (512 train, 256 test images) in
# $work/fm, so that one epoch takes seconds.
small_fmnist() {
  src=/usr/share/datasets/fashion-mnist
  [ -e "$src/train-images-idx3-ubyte.gz" ] || fail "Fashion-MNIST missing: make deps"
  mkdir -p "$work/fm"
  idx_images() { # N SRC DST
    printf '\x00\x00\x08\x03' >"$3"
    printf "$(printf '\\%03o\\%03o\\%03o\\%03o' 0 0 $(($1 / 256)) $(($1 % 256)))" >>"$3"
    printf '\x00\x00\x00\x1c\x00\x00\x00\x1c' >>"$3"
    zcat "$2" | tail -c +17 | head -c $(($1 * 784)) >>"$3"
  }
  idx_labels() {
    printf '\x00\x00\x08\x01' >"$3"
    printf "$(printf '\\%03o\\%03o\\%03o\\%03o' 0 0 $(($1 / 256)) $(($1 % 256)))" >>"$3"
    zcat "$2" | tail -c +9 | head -c "$1" >>"$3"
  }
  idx_images 512 "$src/train-images-idx3-ubyte.gz" "$work/fm/train-images-idx3-ubyte"
  idx_labels 512 "$src/train-labels-idx1-ubyte.gz" "$work/fm/train-labels-idx1-ubyte"
  idx_images 256 "$src/t10k-images-idx3-ubyte.gz" "$work/fm/t10k-images-idx3-ubyte"
  idx_labels 256 "$src/t10k-labels-idx1-ubyte.gz" "$work/fm/t10k-labels-idx1-ubyte"
}

case "$case_name" in
gpt-summary)
  # Two ranks under tandemrun (with a timeline), then a world of one without a launcher.
  TANDEM_TIMELINE="$work/tl.json" "$RUN" -np 2 "$GPT" $TINY --steps 6 --micro-batch 4 --sample 40 \
    --metrics "$work/m.jsonl" >"$work/out" 2>"$work/err" || { cat "$work/out" "$work/err"; fail "2-rank run failed"; }
  cat "$work/out"
  grep -q 'final_loss=[0-9.]* tokens_per_s=[0-9]* steps=6 world=2 params=[0-9]*' "$work/out" || fail "no summary line"
  grep -q '^\(\[0\] \)\?sample' "$work/out" || fail "no text sample after the summary"
  [ "$(metrics_losses "$work/m.jsonl" | wc -l)" = 6 ] || fail "metrics file should have 6 step lines"
  loss=$(summary_value "$work/out" final_loss)
  last=$(metrics_losses "$work/m.jsonl" | tail -1 | cut -d' ' -f2)
  close_rel "$loss" "$last" 1e-5 || fail "final_loss $loss is not the last step's loss $last"
  # A loss near ln(256) = 5.545 at the start: the model starts near uniform.
  first=$(metrics_losses "$work/m.jsonl" | head -1 | cut -d' ' -f2)
  close_rel "$first" 5.545 0.1 || fail "first loss $first is far from ln(256)"
  grep -q 'step 6/6' "$work/err" || fail "no progress line for the last step"
  # The merged timeline holds both ranks' compute and communication spans
  # (its JSON structure is checked by test_obs).
  for want in '"name":"rank 0"' '"name":"rank 1"' '"name":"forward"' '"name":"backward"' '"cat":"comm"'; do
    grep -q "$want" "$work/tl.json" || fail "timeline lacks $want"
  done
  [ "$(grep -c '"name":"backward"' "$work/tl.json")" = 12 ] || fail "expected 6 backward spans per rank"
  [ "$(tail -c 2 "$work/tl.json")" = "]" ] || fail "timeline not closed"
  "$GPT" $TINY --steps 3 --micro-batch 2 --sample 0 >"$work/out1" 2>&1 || { cat "$work/out1"; fail "world of one failed"; }
  grep -q 'world=1' "$work/out1" || fail "world of one: no summary"
  expect_exit 0 "$work/help" "$GPT" --help
  grep -q -- '--micro-batch' "$work/help" || fail "--help lists no options"
  ;;

gpt-resume)
  # 8 steps straight vs 4 steps + save + resume for 4: identical losses.
  args="$TINY --micro-batch 2 --grad-accum 2 --sample 0"
  "$RUN" -np 2 "$GPT" $args --steps 8 --metrics "$work/a.jsonl" >"$work/a.out" 2>&1 || { cat "$work/a.out"; fail "straight run"; }
  "$RUN" -np 2 "$GPT" $args --steps 4 --save "$work/ckpt" --metrics "$work/b1.jsonl" >"$work/b1.out" 2>&1 ||
    { cat "$work/b1.out"; fail "first half"; }
  "$RUN" -np 2 "$GPT" $args --steps 8 --resume "$work/ckpt" --metrics "$work/b2.jsonl" >"$work/b2.out" 2>&1 ||
    { cat "$work/b2.out"; fail "resumed half"; }
  metrics_losses "$work/a.jsonl" >"$work/a.losses"
  cat <(metrics_losses "$work/b1.jsonl") <(metrics_losses "$work/b2.jsonl") >"$work/b.losses"
  cat "$work/a.losses"
  [ "$(wc -l <"$work/a.losses")" = 8 ] || fail "straight run: expected 8 steps"
  diff "$work/a.losses" "$work/b.losses" || fail "losses after resume differ from the uninterrupted run"
  ;;

gpt-config-errors)
  printf '{ "train_micro_batch_size_per_gpu": 2, "optimiser": {"type": "AdamW"} }\n' >"$work/unknown.json"
  "$GPT" $TINY --steps 2 --config "$work/unknown.json" >"$work/o1" 2>&1
  rc=$?
  cat "$work/o1"
  [ $rc -ne 0 ] || fail "unknown key accepted"
  grep -q 'optimiser' "$work/o1" || fail "message does not name the unknown key"
  printf '{ "train_batch_size": 64, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2 }\n' >"$work/batch.json"
  "$RUN" -np 2 "$GPT" $TINY --steps 2 --config "$work/batch.json" >"$work/o2" 2>&1
  rc=$?
  cat "$work/o2"
  [ $rc -ne 0 ] || fail "inconsistent batch accepted"
  grep -q '64' "$work/o2" && grep -q '32' "$work/o2" || fail "message does not give the sizes (64 vs 8x2x2=32)"
  expect_exit 2 "$work/o3" "$GPT" --stepz 3
  grep -q "unknown option '--stepz'" "$work/o3" || fail "bad flag message"
  expect_exit 2 "$work/o4" "$GPT" --steps many
  grep -q -- "--steps expects an integer" "$work/o4" || fail "bad value message"
  expect_exit 2 "$work/o5" "$GPT" --channels 30 --heads 4
  expect_exit 2 "$work/o6" "$FMNIST" --epochs 0
  ;;

gpt-corrupt-checkpoint)
  args="$TINY --micro-batch 2 --sample 0"
  "$RUN" -np 2 "$GPT" $args --steps 2 --save "$work/ckpt" >"$work/s.out" 2>&1 || { cat "$work/s.out"; fail "save run"; }
  # Flip one byte in the middle of every shard-sized file of the checkpoint.
  dir=$(find "$work/ckpt" -mindepth 1 -maxdepth 1 -type d -name 'step-*' | head -1)
  [ -n "$dir" ] || fail "no step-N directory in the checkpoint"
  victim=$(find "$dir" -type f -size +1k | head -1)
  [ -n "$victim" ] || fail "no shard file in $dir"
  size=$(stat -c %s "$victim")
  byte=$(od -An -tu1 -j $((size / 2)) -N1 "$victim" | tr -d ' ')
  printf "$(printf '\\%03o' $(((byte + 1) % 256)))" | dd of="$victim" bs=1 seek=$((size / 2)) conv=notrunc status=none
  "$RUN" -np 2 "$GPT" $args --steps 4 --resume "$work/ckpt" >"$work/r.out" 2>&1
  rc=$?
  cat "$work/r.out"
  [ $rc -ne 0 ] || fail "corrupt checkpoint accepted"
  grep -qi 'crc\|corrupt' "$work/r.out" || fail "message does not say the checkpoint is corrupt"
  # A truncated shard is refused too.
  "$RUN" -np 2 "$GPT" $args --steps 2 --save "$work/ckpt2" >"$work/s2.out" 2>&1 || fail "second save run"
  dir=$(find "$work/ckpt2" -mindepth 1 -maxdepth 1 -type d -name 'step-*' | head -1)
  victim=$(find "$dir" -type f -size +1k | head -1)
  truncate -s $(($(stat -c %s "$victim") - 100)) "$victim"
  "$RUN" -np 2 "$GPT" $args --steps 4 --resume "$work/ckpt2" >"$work/r2.out" 2>&1 && { cat "$work/r2.out"; fail "truncated checkpoint accepted"; }
  cat "$work/r2.out"
  ;;

gpt-keep-last)
  # --save-every 1 --keep-last 2: after 4 steps only step-3 and step-4 remain.
  args="$TINY --micro-batch 2 --sample 0"
  "$RUN" -np 2 "$GPT" $args --steps 4 --save "$work/ckpt" --save-every 1 --keep-last 2 >"$work/k.out" 2>&1 ||
    { cat "$work/k.out"; fail "save run"; }
  left=$(cd "$work/ckpt" && ls -d step-* | sort | tr '\n' ' ')
  echo "left: $left"
  [ "$left" = "step-3 step-4 " ] || fail "expected step-3 and step-4 to remain, found: $left"
  [ "$(cat "$work/ckpt/latest")" = "step-4" ] || fail "latest does not name step-4"
  # Resuming with other --heads (same tensor shapes) is refused, naming the difference.
  "$RUN" -np 2 "$GPT" --layers 1 --channels 32 --heads 4 --seq 32 --threads 1 --micro-batch 2 --sample 0 --steps 6 \
    --resume "$work/ckpt" >"$work/h.out" 2>&1 && { cat "$work/h.out"; fail "another model shape accepted"; }
  cat "$work/h.out"
  grep -q 'heads: 2 in the checkpoint, 4 in this run' "$work/h.out" || fail "message does not name the heads"
  expect_exit 2 "$work/o1" "$GPT" --keep-last -1
  ;;

gpt-world-sizes)
  # Global batch 8 on 1, 2 and 4 ranks: the same 20 steps, the same final loss.
  args="$TINY --steps 20 --sample 0"
  "$GPT" $args --micro-batch 8 >"$work/w1" 2>&1 || { cat "$work/w1"; fail "world 1"; }
  "$RUN" -np 2 "$GPT" $args --micro-batch 4 >"$work/w2" 2>&1 || { cat "$work/w2"; fail "world 2"; }
  "$RUN" -np 4 "$GPT" $args --micro-batch 2 >"$work/w4" 2>&1 || { cat "$work/w4"; fail "world 4"; }
  l1=$(summary_value "$work/w1" final_loss)
  l2=$(summary_value "$work/w2" final_loss)
  l4=$(summary_value "$work/w4" final_loss)
  echo "final loss: world 1 $l1, world 2 $l2, world 4 $l4"
  [ -n "$l1" ] && [ -n "$l2" ] && [ -n "$l4" ] || fail "missing summary"
  close_rel "$l2" "$l1" 1e-4 || fail "world 2 differs from world 1"
  close_rel "$l4" "$l1" 1e-4 || fail "world 4 differs from world 1"
  # The loss went down: the runs trained, not just agreed.
  awk -v l="$l1" 'BEGIN { exit !(l < 5.3) }' || fail "loss $l1 did not fall below 5.3 in 20 steps"
  ;;

fmnist-summary)
  small_fmnist
  "$RUN" -np 2 "$FMNIST" --data "$work/fm" --epochs 2 --micro-batch 16 --threads 1 --metrics "$work/m.jsonl" \
    >"$work/out" 2>"$work/err" || { cat "$work/out" "$work/err"; fail "2-rank run failed"; }
  cat "$work/out"
  grep -q 'test_accuracy=0\.[0-9]* final_loss=[0-9.]* samples_per_s=[0-9]* epochs=2.00 steps=32 world=2' "$work/out" ||
    fail "no summary line"
  acc=$(summary_value "$work/out" test_accuracy)
  # 10 classes: chance is 0.10; two epochs on 512 images already do far better.
  awk -v a="$acc" 'BEGIN { exit !(a > 0.4) }' || fail "test accuracy $acc: the CNN did not learn"
  [ "$(grep -c '"event":"eval"' "$work/m.jsonl")" = 2 ] || fail "expected one eval record per epoch"
  ;;

fmnist-elastic-save)
  # train-fmnist --elastic with --save/--resume/--metrics (app_elastic.h, as
  # train-gpt): 2 epochs of 16 steps at world 2, checkpointed after each
  # epoch; the whole job stopped after step 20 (every process stops itself
  # there, TANDEM_TEST_STOP_AT, then all are killed) and resumed from step
  # 16 at world 1. Its final loss and parameters equal an uninterrupted
  # run's bit for bit (deterministic reduction); the metrics file holds
  # every step, the last record of each with the uninterrupted run's loss.
  small_fmnist
  args="--data $work/fm --epochs 2 --micro-batch 16 --threads 1"
  exact() { sed -n 's/.*elastic final_loss_exact=\([^ ]*\) params_hash=\([^ ]*\).*/\1 \2/p' "$1"; }
  "$RUN" --min-np 1 --max-np 2 -np 2 "$FMNIST" $args --metrics "$work/ref.jsonl" >"$work/ref" 2>&1 ||
    { cat "$work/ref"; fail "uninterrupted run failed"; }
  [ -n "$(exact "$work/ref")" ] || { cat "$work/ref"; fail "no exact line"; }
  TANDEM_TEST_STOP_AT=1:20 setsid "$RUN" --min-np 1 --max-np 2 -np 2 "$FMNIST" $args --save "$work/ck" \
    --metrics "$work/m.jsonl" >"$work/a" 2>&1 &
  tr=$!
  stopped=0
  for _ in $(seq 600); do # every process stopped itself after step 20 (state T)
    kids=$(pgrep -P $tr)
    n=0
    for k in $kids; do [ "$(awk '{print $3}' /proc/$k/stat 2>/dev/null)" = T ] && n=$((n + 1)); done
    [ "$n" = 2 ] && { stopped=1; break; }
    sleep 0.1
  done
  [ $stopped = 1 ] || { kill -9 $tr $(pgrep -P $tr); cat "$work/a"; fail "the processes did not stop at step 20"; }
  kill -STOP $tr; kill -9 $tr $kids; wait $tr 2>/dev/null
  grep -q "step 20 loss" "$work/a" || fail "no step 20 before the kill"
  "$RUN" --min-np 1 --max-np 2 -np 1 "$FMNIST" $args --save "$work/ck" --metrics "$work/m.jsonl" --resume "$work/ck" \
    >"$work/b" 2>&1 || { cat "$work/b"; fail "the resumed run failed"; }
  grep -q "resumed from the disk checkpoint in $work/ck at step 16 (world 1)" "$work/b" || { cat "$work/b"; fail "not resumed at step 16"; }
  [ "$(exact "$work/b")" = "$(exact "$work/ref")" ] || fail "resumed $(exact "$work/b") != uninterrupted $(exact "$work/ref")"
  grep -q '"samples_per_s"' "$work/m.jsonl" || fail "the metrics file's throughput is not in samples"
  python3 - "$work/ref.jsonl" "$work/m.jsonl" <<'EOP' || fail "metrics file differs"
import json, sys
def last(path):
    out = {}
    for line in open(path):
        r = json.loads(line)
        if "event" not in r: out[r["step"]] = r["loss"]
    return out
ref, got = last(sys.argv[1]), last(sys.argv[2])
assert sorted(got) == list(range(1, 33)) and got == ref, (sorted(got), [s for s in ref if ref[s] != got.get(s)])
print("metrics: steps 1..32, last record of each equal to the uninterrupted run's loss")
EOP
  echo "killed at step 20, resumed at world 1 from step 16: $(exact "$work/b")"
  ;;
*)
  fail "unknown case"
  ;;
esac
echo "ok $case_name"
