#!/usr/bin/env bash
# train-gpt --tensor-parallel (issue 21), with a tiny GPT so that each case
# finishes in seconds (also under ASan). Usage:
#   tests/parallel/tp_train_gpt.sh CASE BUILD_TREE
#   equal:   1 rank (micro-batch 8), TP=2 on 2 ranks (micro 8) and TP=2 x DP=2
#            on 4 ranks (micro 4), the same global batch of 8: every step's
#            loss (the --metrics file) within 1e-5 relative of the 1-rank run
#            (not bit for bit: the row-parallel products and the vocabulary-
#            parallel softmax add the ranks' partial sums in another order);
#            the config key tensor_model_parallel_size does what the flag does;
#            TP=2 with --sequence-parallel (4 ranks: TP=2 x DP=2, config key
#            sequence_parallel) the same; TP=2 x DP=2 with ZeRO-1 and 2 micro-steps
#            of 2 the same.
#   threed:  TP=2 x PP=2 on 4 ranks (4 micro-batches of 2) and TP=2 x PP=2 x DP=2
#            on 8 ranks (ZeRO-1, 4 micro-batches of 1, config keys
#            pipeline_model_parallel_size and tensor_model_parallel_size), 4
#            layers, against 1 rank with the same global batch of 8: every
#            step's loss within 1e-5 relative; sequence parallelism and
#            activation checkpointing on 4 ranks too.
#   half:    TP=2 x PP=2 --bf16 on 4 ranks and TP=2 x PP=2 x DP=2 --fp16 with
#            ZeRO-2 on 8 ranks against 1 rank in the same type, every step's
#            loss within half the type's unit roundoff (2^-9, 2^-12).
#   refused: layouts and combinations not built, each exit 2 with a message
#            saying what would work.
#   zero3:   ZeRO-3 with model parallelism on the CPU (the stage and tensor-
#            parallel models fetch each group from the data-parallel owners):
#            TP=2 x DP=2 4 steps saving at step 4, resumed under TP=2 x DP=2
#            ZeRO-0 for steps 5-8; PP=2 x DP=2 8 steps; TP=2 x PP=2 x DP=2
#            8 steps (4 micro-batches of 1) saving at step 4, resumed by 1
#            rank for steps 5-8; TP=2 x PP=2 x DP=2 with the parameters and
#            the optimizer state offloaded to NVMe files, 8 steps: every
#            loss within 1e-5 relative of the uninterrupted 1-rank run at the
#            same global batch of 8.
#   device:  (a CUDA tree: build/cudaemu, or a GPU's) on cuda:0 shared by 4
#            ranks, TP=2 x DP=2: ZeRO-3 (the device GPT's parameter fetches
#            follow the tensor shard's table) 4 steps saving at step 4, its
#            losses within 1e-6 of ZeRO-0's 8 uninterrupted steps, and the save
#            resumed under ZeRO-0 for steps 5-8 within 1e-6 of them too;
#            --sequence-parallel (TP=2 x DP=2) within 1e-5 of ZeRO-0 without it.
set -u
case_name=$1
B=$2
RUN="$B/bin/tandemrun"
GPT="$B/bin/train-gpt"
TINY="--layers 2 --channels 32 --heads 4 --seq 32 --threads 1 --steps 8 --sample 0 --seed 5"
work=$(mktemp -d /tmp/tandem-tp-XXXXXX)
trap 'rm -rf "$work"' EXIT
export TANDEM_PROGRESS=off

fail() { echo "FAIL($case_name): $*"; exit 1; }
metrics_losses() { sed -n 's/^{"step":\([0-9]*\),"loss":\([^,]*\),.*/\1 \2/p' "$1"; }
close_rel() { awk -v a="$1" -v b="$2" -v r="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b; exit !(d <= r * m) }'; }
# same_losses NAME GOT REF REF_NAME BOUND: GOT's "step loss" lines are REF's
# 8 steps, each loss within BOUND (relative) of REF's.
same_losses() {
  local name=$1 got=$2 ref=$3 ref_name=$4 bound=$5 step want step2 loss
  [ "$(wc -l <"$got")" -eq 8 ] || fail "$name has $(wc -l <"$got") loss lines, not 8"
  while read -r step want && read -r step2 loss <&3; do
    [ "$step" = "$step2" ] || fail "$name: step $step2 against $step"
    close_rel "$loss" "$want" "$bound" || fail "$name step $step: loss $loss, $ref_name $want (more than $bound apart)"
  done <"$ref" 3<"$got"
}

case "$case_name" in
equal)
  "$GPT" $TINY --micro-batch 8 --metrics "$work/one.jsonl" >"$work/one.out" 2>&1 || { cat "$work/one.out"; fail "1 rank"; }
  "$RUN" -np 2 "$GPT" $TINY --micro-batch 8 --tensor-parallel 2 --metrics "$work/tp2.jsonl" >"$work/tp2.out" 2>&1 ||
    { cat "$work/tp2.out"; fail "TP=2"; }
  echo '{"tensor_model_parallel_size": 2, "train_micro_batch_size_per_gpu": 4}' >"$work/ds.json"
  "$RUN" -np 4 "$GPT" $TINY --config "$work/ds.json" --metrics "$work/tp2dp2.jsonl" >"$work/tp2dp2.out" 2>&1 ||
    { cat "$work/tp2dp2.out"; fail "TP=2 x DP=2"; }
  "$RUN" -np 2 "$GPT" $TINY --micro-batch 8 --tensor-parallel 2 --sequence-parallel --metrics "$work/sp2.jsonl" \
    >"$work/sp2.out" 2>&1 || { cat "$work/sp2.out"; fail "TP=2 with sequence parallelism"; }
  echo '{"tensor_model_parallel_size": 2, "sequence_parallel": true, "train_micro_batch_size_per_gpu": 4}' >"$work/sp.json"
  "$RUN" -np 4 "$GPT" $TINY --config "$work/sp.json" --metrics "$work/sp2dp2.jsonl" >"$work/sp2dp2.out" 2>&1 ||
    { cat "$work/sp2dp2.out"; fail "TP=2 x DP=2 with sequence parallelism"; }
  grep -q "tensor_parallel=2 sequence_parallel=1" "$work/sp2dp2.out" || fail "the config key did not turn sequence parallelism on"
  "$RUN" -np 4 "$GPT" $TINY --micro-batch 2 --grad-accum 2 --tensor-parallel 2 --zero-stage 1 \
    --metrics "$work/z1accum.jsonl" >"$work/z1accum.out" 2>&1 || { cat "$work/z1accum.out"; fail "TP=2 x DP=2, ZeRO-1, accumulation"; }
  grep -q "zero_stage=1" "$work/z1accum.out" || fail "ZeRO-1 was not on"
  grep -q "tensor_parallel=2" "$work/tp2dp2.out" || fail "the config key did not turn tensor parallelism on"
  grep -q "global_batch=8 micro_batch=4" "$work/tp2dp2.out" || fail "TP=2 x DP=2 did not keep the global batch of 8"
  metrics_losses "$work/one.jsonl" >"$work/one.txt"
  [ "$(wc -l <"$work/one.txt")" -eq 8 ] || fail "the 1-rank run has $(wc -l <"$work/one.txt") loss lines, not 8"
  for run in tp2 tp2dp2 sp2 sp2dp2 z1accum; do
    metrics_losses "$work/$run.jsonl" >"$work/$run.txt"
    same_losses "$run" "$work/$run.txt" "$work/one.txt" "1 rank" 1e-5
    echo "$run: 8 losses within 1e-5 of 1 rank (last $(tail -1 "$work/$run.txt") vs $(tail -1 "$work/one.txt"))"
  done
  ;;
threed)
  T3="--layers 4 --channels 32 --heads 4 --seq 32 --threads 1 --steps 8 --sample 0 --seed 5"
  "$GPT" $T3 --micro-batch 8 --metrics "$work/one.jsonl" >"$work/one.out" 2>&1 || { cat "$work/one.out"; fail "1 rank"; }
  "$RUN" -np 4 "$GPT" $T3 --micro-batch 2 --grad-accum 4 --tensor-parallel 2 --pipeline-parallel 2 \
    --metrics "$work/tp2pp2.jsonl" >"$work/tp2pp2.out" 2>&1 || { cat "$work/tp2pp2.out"; fail "TP=2 x PP=2"; }
  "$RUN" -np 4 "$GPT" $T3 --micro-batch 2 --grad-accum 4 --tensor-parallel 2 --pipeline-parallel 2 \
    --sequence-parallel --metrics "$work/tp2pp2sp.jsonl" >"$work/tp2pp2sp.out" 2>&1 ||
    { cat "$work/tp2pp2sp.out"; fail "TP=2 x PP=2 with sequence parallelism"; }
  echo '{"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2, "train_micro_batch_size_per_gpu": 1,
         "gradient_accumulation_steps": 4, "zero_optimization": {"stage": 1}}' >"$work/3d.json"
  "$RUN" -np 8 "$GPT" $T3 --config "$work/3d.json" --metrics "$work/tp2pp2dp2.jsonl" >"$work/tp2pp2dp2.out" 2>&1 ||
    { cat "$work/tp2pp2dp2.out"; fail "TP=2 x PP=2 x DP=2"; }
  grep -q "global_batch=8 micro_batch=1 grad_accum=4" "$work/tp2pp2dp2.out" || fail "TP=2 x PP=2 x DP=2: not the global batch of 8"
  grep -q "zero_stage=1 .*tensor_parallel=2 sequence_parallel=0 pipeline_parallel=2" "$work/tp2pp2dp2.out" ||
    fail "TP=2 x PP=2 x DP=2: the config keys did not take effect"
  "$RUN" -np 4 "$GPT" $T3 --micro-batch 2 --grad-accum 4 --tensor-parallel 2 --pipeline-parallel 2 \
    --activation-checkpointing --metrics "$work/tp2pp2ckpt.jsonl" >"$work/tp2pp2ckpt.out" 2>&1 ||
    { cat "$work/tp2pp2ckpt.out"; fail "TP=2 x PP=2 with activation checkpointing"; }
  grep -q "activation_checkpointing=1" "$work/tp2pp2ckpt.out" || fail "activation checkpointing was not on"
  metrics_losses "$work/one.jsonl" >"$work/one.txt"
  [ "$(wc -l <"$work/one.txt")" -eq 8 ] || fail "the 1-rank run has $(wc -l <"$work/one.txt") loss lines, not 8"
  for run in tp2pp2 tp2pp2sp tp2pp2dp2 tp2pp2ckpt; do
    metrics_losses "$work/$run.jsonl" >"$work/$run.txt"
    same_losses "$run" "$work/$run.txt" "$work/one.txt" "1 rank" 1e-5
    echo "$run: 8 losses within 1e-5 of 1 rank (last $(tail -1 "$work/$run.txt") vs $(tail -1 "$work/one.txt"))"
  done
  ;;
device)
  TD="--layers 2 --channels 32 --heads 4 --seq 32 --threads 1 --sample 0 --seed 5 --device cuda:0 --micro-batch 4 --tensor-parallel 2"
  if ! "$RUN" -np 4 "$GPT" $TD --steps 8 --zero-stage 0 --metrics "$work/z0.jsonl" >"$work/z0.out" 2>&1; then
    if grep -q "there is no CUDA device\|built without CUDA" "$work/z0.out"; then
      [ -z "${TD_TEST_EXPECT_CUDA:-}" ] || { cat "$work/z0.out"; fail "TD_TEST_EXPECT_CUDA is set, but there is no device"; }
      echo "skipped: no CUDA device for $B: $(grep -m1 "CUDA" "$work/z0.out")"; exit 0
    fi
    cat "$work/z0.out"; fail "TP=2 x DP=2 ZeRO-0 on the device"
  fi
  "$RUN" -np 4 "$GPT" $TD --steps 4 --zero-stage 3 --save "$work/ck" --metrics "$work/z3.jsonl" >"$work/z3.out" 2>&1 ||
    { cat "$work/z3.out"; fail "TP=2 x DP=2 ZeRO-3 on the device"; }
  grep -q "zero_stage=3 .*tensor_parallel=2" "$work/z3.out" || fail "ZeRO-3 with TP=2 was not on"
  "$RUN" -np 4 "$GPT" $TD --steps 8 --zero-stage 0 --resume "$work/ck" --metrics "$work/res.jsonl" >"$work/res.out" 2>&1 ||
    { cat "$work/res.out"; fail "TP=2 x DP=2 ZeRO-0 resuming the ZeRO-3 save"; }
  "$RUN" -np 4 "$GPT" $TD --steps 8 --sequence-parallel --metrics "$work/sp.jsonl" >"$work/sp.out" 2>&1 ||
    { cat "$work/sp.out"; fail "TP=2 x DP=2 with sequence parallelism on the device"; }
  grep -q "tensor_parallel=2 sequence_parallel=1" "$work/sp.out" || fail "sequence parallelism was not on"
  metrics_losses "$work/z0.jsonl" >"$work/z0.txt"
  metrics_losses "$work/sp.jsonl" >"$work/sp.txt"
  same_losses sp "$work/sp.txt" "$work/z0.txt" "without sequence parallelism" 1e-5
  echo "device: TP=2 x DP=2 with sequence parallelism: 8 losses within 1e-5 of it without (last $(tail -1 "$work/sp.txt"))"
  metrics_losses "$work/z3.jsonl" >"$work/z3.txt"
  metrics_losses "$work/res.jsonl" >"$work/res.txt"
  [ "$(wc -l <"$work/z0.txt")" -eq 8 ] && [ "$(wc -l <"$work/z3.txt")" -eq 4 ] && [ "$(wc -l <"$work/res.txt")" -eq 4 ] ||
    fail "loss lines: $(wc -l <"$work/z0.txt") / $(wc -l <"$work/z3.txt") / $(wc -l <"$work/res.txt"), want 8 / 4 / 4"
  cat "$work/z3.txt" "$work/res.txt" >"$work/both.txt"
  same_losses "ZeRO-3, then resumed," "$work/both.txt" "$work/z0.txt" "ZeRO-0" 1e-6
  echo "device: TP=2 x DP=2 ZeRO-3 4 steps and its save resumed under ZeRO-0: 8 losses within 1e-6 of ZeRO-0's" \
    "(last $(tail -1 "$work/res.txt") vs $(tail -1 "$work/z0.txt"))"
  ;;
half)
  # the same global batch of 8 in bf16 / fp16 on 1 rank and on the grids
  T3="--layers 4 --channels 32 --heads 4 --seq 32 --threads 1 --steps 8 --sample 0 --seed 5"
  for dt in bf16 fp16; do
    "$GPT" $T3 --$dt --micro-batch 8 --metrics "$work/one_$dt.jsonl" >"$work/one_$dt.out" 2>&1 ||
      { cat "$work/one_$dt.out"; fail "1 rank $dt"; }
    metrics_losses "$work/one_$dt.jsonl" >"$work/one_$dt.txt"
  done
  "$RUN" -np 4 "$GPT" $T3 --bf16 --micro-batch 2 --grad-accum 4 --tensor-parallel 2 --pipeline-parallel 2 \
    --metrics "$work/tp2pp2_bf16.jsonl" >"$work/tp2pp2_bf16.out" 2>&1 || { cat "$work/tp2pp2_bf16.out"; fail "TP=2 x PP=2 bf16"; }
  "$RUN" -np 8 "$GPT" $T3 --fp16 --micro-batch 1 --grad-accum 4 --tensor-parallel 2 --pipeline-parallel 2 --zero-stage 2 \
    --metrics "$work/tp2pp2dp2z2_fp16.jsonl" >"$work/tp2pp2dp2z2_fp16.out" 2>&1 ||
    { cat "$work/tp2pp2dp2z2_fp16.out"; fail "TP=2 x PP=2 x DP=2 ZeRO-2 fp16"; }
  grep -q "zero_stage=2 .*tensor_parallel=2 sequence_parallel=0 pipeline_parallel=2" "$work/tp2pp2dp2z2_fp16.out" ||
    fail "TP=2 x PP=2 x DP=2: ZeRO-2 was not on"
  # bounds: half of each type's unit roundoff (2^-9 bf16, 2^-12 fp16; tests/parallel/test_tp.c says why)
  for run in tp2pp2_bf16:bf16:0.001953125 tp2pp2dp2z2_fp16:fp16:0.000244140625; do
    IFS=: read -r name dt bound <<<"$run"
    metrics_losses "$work/$name.jsonl" >"$work/$name.txt"
    same_losses "$name" "$work/$name.txt" "$work/one_$dt.txt" "1 rank $dt" "$bound"
    echo "$name: 8 losses within $bound of 1 rank in $dt (last $(tail -1 "$work/$name.txt") vs $(tail -1 "$work/one_$dt.txt"))"
  done
  ;;
zero3)
  T3="--layers 4 --channels 32 --heads 4 --seq 32 --threads 1 --sample 0 --seed 5"
  "$GPT" $T3 --steps 8 --micro-batch 8 --metrics "$work/one.jsonl" >"$work/one.out" 2>&1 || { cat "$work/one.out"; fail "1 rank"; }
  z3run() { # z3run NAME NP ARGS...: train-gpt at ZeRO stage 3 unless ARGS say otherwise
    local name=$1 np=$2
    shift 2
    "$RUN" -np "$np" "$GPT" $T3 "$@" --metrics "$work/$name.jsonl" >"$work/$name.out" 2>&1 ||
      { cat "$work/$name.out"; fail "$name: $*"; }
  }
  z3run tp2dp2 4 --steps 4 --micro-batch 4 --tensor-parallel 2 --zero-stage 3 --save "$work/ck_tp"
  grep -q "zero_stage=3 .*tensor_parallel=2" "$work/tp2dp2.out" || fail "TP=2 x DP=2: ZeRO-3 was not on"
  z3run tp2dp2_res 4 --steps 8 --micro-batch 4 --tensor-parallel 2 --zero-stage 0 --resume "$work/ck_tp"
  z3run pp2dp2 4 --steps 8 --micro-batch 2 --grad-accum 2 --pipeline-parallel 2 --zero-stage 3
  grep -q "zero_stage=3 .*pipeline_parallel=2" "$work/pp2dp2.out" || fail "PP=2 x DP=2: ZeRO-3 was not on"
  z3run tp2pp2dp2 8 --steps 4 --micro-batch 1 --grad-accum 4 --tensor-parallel 2 --pipeline-parallel 2 --zero-stage 3 \
    --save "$work/ck_3d"
  grep -q "zero_stage=3 .*tensor_parallel=2 .*pipeline_parallel=2" "$work/tp2pp2dp2.out" ||
    fail "TP=2 x PP=2 x DP=2: ZeRO-3 was not on"
  z3run tp2pp2dp2_res 1 --steps 8 --micro-batch 8 --resume "$work/ck_3d"
  # ZeRO-3's NVMe offload (the parameter shard and the optimizer state in files) under TP x PP x DP
  mkdir -p "$work/nvme"
  z3run tp2pp2dp2_nvme 8 --steps 8 --micro-batch 1 --grad-accum 4 --tensor-parallel 2 --pipeline-parallel 2 \
    --zero-stage 3 --offload-optimizer "nvme:$work/nvme" --offload-param "nvme:$work/nvme"
  grep -q "offload step=8 " "$work/tp2pp2dp2_nvme.out" || { cat "$work/tp2pp2dp2_nvme.out"; fail "offload was not on"; }
  metrics_losses "$work/one.jsonl" >"$work/one.txt"
  [ "$(wc -l <"$work/one.txt")" -eq 8 ] || fail "the 1-rank run has $(wc -l <"$work/one.txt") loss lines, not 8"
  for run in tp2dp2+tp2dp2_res pp2dp2 tp2pp2dp2+tp2pp2dp2_res tp2pp2dp2_nvme; do
    : >"$work/$run.txt"
    for part in ${run//+/ }; do metrics_losses "$work/$part.jsonl" >>"$work/$run.txt"; done
    same_losses "$run" "$work/$run.txt" "$work/one.txt" "1 rank" 1e-5
    echo "zero3 $run: 8 losses within 1e-5 of 1 rank (last $(tail -1 "$work/$run.txt") vs $(tail -1 "$work/one.txt"))"
  done
  ;;
refused)
  check() { # check NP NEEDLE ARGS...
    local np=$1 needle=$2
    shift 2
    "$RUN" -np "$np" "$GPT" $TINY "$@" >"$work/out" 2>&1
    local rc=$?
    [ "$rc" -ne 0 ] || { cat "$work/out"; fail "exit 0 for: $*"; }
    grep -q -- "$needle" "$work/out" || { cat "$work/out"; fail "no \"$needle\" for: $*"; }
  }
  check 2 "use tensor-parallel 1 or 2" --tensor-parallel 3
  check 2 "use tensor-parallel 1, 3 or 9" --tensor-parallel 2 --heads 9 --channels 36
  # elastic training: not built with model parallelism, said so (ZeRO-3 and its offload compose: the zero3 case)
  check 2 "tensor_model_parallel_size 2 with elastic training is not built yet: drop one of them" --tensor-parallel 2 \
    --elastic
  check 2 "set tensor_model_parallel_size to 2 or more" --sequence-parallel
  check 2 "--seq 33 must be divisible by 2" --tensor-parallel 2 --sequence-parallel --seq 33
  # 3D: what does not compose with tensor-parallel pipeline stages yet
  check 4 "with elastic training.* is not built yet: drop one of them" \
    --tensor-parallel 2 --pipeline-parallel 2 --elastic
  check 6 "use pipeline-parallel 1 or 3" --tensor-parallel 2 --pipeline-parallel 2
  echo "refused: ok"
  ;;
*)
  fail "unknown case"
  ;;
esac
