#!/usr/bin/env bash
# train-gpt --pipeline-parallel: the final loss of PP=2 (1F1B and
# interleaved) equals one rank's with the same global batch to the printed
# digits (the library tests compare every bit), each rank reports its
# stage's time, and layouts that cannot work exit 2 saying what would.
# With DEV (cuda, cuda:0): both runs on that device (the 2 ranks share it:
# their stages' activations cross through pinned host memory), a PP=2
# checkpoint resumed by one rank there; tensor parallelism there: TP=2 and
# TP=2 x PP=2 (4 ranks) within 1e-5 relative of one rank (the row-parallel
# sums add the ranks' partial products in another order), a TP=2 device
# checkpoint resumed by one rank; PP=2 in bf16 (the activations cross in
# bf16) against one bf16 rank there to the printed digits; and the
# refusals: sequence parallelism and a tied GPT's pipeline in bf16 on a
# device.
#   train_gpt.sh BUILD_TREE [DEV]
set -u
B=$1
DEV=${2:-cpu}
fail() { echo "train_gpt.sh: FAIL: $*"; exit 1; }
export TANDEM_PROGRESS=off
refuse() { # EXPECTED-TEXT NP FLAGS...
  local want=$1 np=$2; shift 2
  out=$("$B/bin/tandemrun" -np "$np" "$B/bin/train-gpt" ${TD_TEXT:+--data "$TD_TEXT"} "$@" 2>&1); rc=$?
  [ $rc -ne 0 ] || fail "train-gpt $* exited 0"
  grep -q -- "$want" <<<"$out" || fail "train-gpt $*: no \"$want\" in: $out"
}
args="--layers 4 --channels 32 --heads 2 --seq 16 --micro-batch 2 --grad-accum 4 --steps 3 --sample 0 --threads 1"
schedules="1f1b interleaved"
# the emulator runs a device's kernels on the CPU, ~30x slower: 2 layers, 1F1B (the library test covers interleaved)
[ "$DEV" = cpu ] ||
  args="--layers 2 --channels 32 --heads 2 --seq 16 --micro-batch 2 --grad-accum 2 --steps 2 --sample 0 --threads 1
        --device $DEV" schedules=1f1b
# TD_TEXT: the corpus where the default one is absent (scripts/gpu-check sets it on the GPU machine)
[ -z "${TD_TEXT:-}" ] || args="$args --data $TD_TEXT"
one=$("$B/bin/tandemrun" -np 1 "$B/bin/train-gpt" $args 2>&1) || fail "one rank: $one"
loss1=$(grep -o "final_loss=[^ ]*" <<<"$one")
[ -n "$loss1" ] || fail "no final_loss in: $one"
for sched in $schedules; do
  pp=$("$B/bin/tandemrun" -np 2 "$B/bin/train-gpt" $args --pipeline-parallel 2 --pipeline-schedule $sched 2>&1) ||
    fail "PP=2 $sched: $pp"
  echo "$pp" | grep -E "final_loss|pipeline rank"
  loss2=$(grep -o "final_loss=[^ ]*" <<<"$pp")
  [ "$loss1" = "$loss2" ] || fail "PP=2 $sched: $loss2, one rank: $loss1"
  [ "$(grep -c "pipeline rank=" <<<"$pp")" -eq 2 ] || fail "PP=2 $sched: not every stage reported its time"
done
if [ "$DEV" != cpu ]; then
  # a PP=2 checkpoint of device stages (saved by the grid as the unsplit model) resumed by one rank on DEV: its
  # last step's loss is the pipeline's
  ck=$(mktemp -d /tmp/td-ppdev-XXXXXX)
  trap 'rm -rf "$ck"' EXIT
  pp=$("$B/bin/tandemrun" -np 2 "$B/bin/train-gpt" $args --pipeline-parallel 2 --save "$ck" --save-every 1 2>&1) ||
    fail "PP=2 with --save: $pp"
  [ -d "$ck/step-1" ] || fail "PP=2 on $DEV saved no step-1 checkpoint: $(ls "$ck")"
  res=$("$B/bin/tandemrun" -np 1 "$B/bin/train-gpt" $args --resume "$ck/step-1" 2>&1) || fail "resume: $res"
  loss3=$(grep -o "final_loss=[^ ]*" <<<"$res")
  [ "$loss1" = "$loss3" ] || fail "a PP=2 checkpoint on $DEV resumed by one rank: $loss3, uninterrupted: $loss1"
  echo "a PP=2 checkpoint on $DEV resumed by one rank: $loss3"
  close() { # WHAT LOSS: within 1e-5 relative of loss1
    awk -v a="${2#final_loss=}" -v b="${loss1#final_loss=}" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= 1e-5 * b) }' ||
      fail "$1 on $DEV: $2, one rank: $loss1 (bound 1e-5 relative)"
    echo "$1 on $DEV: $2 (one rank: $loss1)"
  }
  tp=$("$B/bin/tandemrun" -np 2 "$B/bin/train-gpt" $args --tensor-parallel 2 --save "$ck/tp" --save-every 1 2>&1) ||
    fail "TP=2: $tp"
  close "TP=2" "$(grep -o "final_loss=[^ ]*" <<<"$tp")"
  [ -d "$ck/tp/step-1" ] || fail "TP=2 on $DEV saved no step-1 checkpoint: $(ls "$ck/tp")"
  res=$("$B/bin/tandemrun" -np 1 "$B/bin/train-gpt" $args --resume "$ck/tp/step-1" 2>&1) || fail "TP=2 resume: $res"
  close "a TP=2 checkpoint resumed by one rank" "$(grep -o "final_loss=[^ ]*" <<<"$res")"
  tpp=$("$B/bin/tandemrun" -np 4 "$B/bin/train-gpt" $args --tensor-parallel 2 --pipeline-parallel 2 2>&1) ||
    fail "TP=2 x PP=2: $tpp"
  close "TP=2 x PP=2" "$(grep -o "final_loss=[^ ]*" <<<"$tpp")"
  one16=$("$B/bin/tandemrun" -np 1 "$B/bin/train-gpt" $args --bf16 2>&1) || fail "one rank in bf16: $one16"
  pp16=$("$B/bin/tandemrun" -np 2 "$B/bin/train-gpt" $args --bf16 --pipeline-parallel 2 2>&1) || fail "PP=2 bf16: $pp16"
  l1=$(grep -o "final_loss=[^ ]*" <<<"$one16") l2=$(grep -o "final_loss=[^ ]*" <<<"$pp16")
  [ -n "$l1" ] && [ "$l1" = "$l2" ] || fail "PP=2 in bf16 on $DEV: $l2, one bf16 rank: $l1"
  echo "PP=2 in bf16 on $DEV: $l2 (one bf16 rank: $l1)"
  refuse "a tied GPT's stages on a GPU train in fp32 only" 2 $args --bf16 --tied --pipeline-parallel 2
fi
refuse "does not divide the world of 3" 3 --pipeline-parallel 2 --steps 1
refuse "must be a multiple of 2" 2 --pipeline-parallel 2 --pipeline-schedule interleaved --grad-accum 3 --steps 1
refuse "--layers 2 or more" 2 --pipeline-parallel 2 --layers 1 --steps 1
refuse "pipeline_model_parallel_size 2 with elastic training or deterministic reduction is not built yet" 2 \
  --pipeline-parallel 2 --elastic --steps 1
# refused by the config in any build, before a device is opened
refuse "sequence_parallel with pipeline stages on device cuda" 4 --tensor-parallel 2 --pipeline-parallel 2 --sequence-parallel --device cuda --steps 1
echo "train_gpt.sh: ok ($loss1 on one rank and PP=2, on $DEV)"
