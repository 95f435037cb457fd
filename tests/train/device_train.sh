#!/bin/sh
# train-gpt on a device (--device DEV) against the CPU engine, end to end
# (issue 18; src/train/core/devops.h): a tiny GPT (2 layers, 32 channels,
# seq 16), 20 steps in fp32 with clipping active.
#   1. one rank on DEV: every step's loss within 1e-4 relative of the CPU's;
#   2. 2 ranks sharing DEV (micro-batch 2 each, gradients reduced through the
#      device collectives' staged path) against 1 rank on DEV with micro-batch
#      4: the same global batch, losses within 1e-4 relative;
#   3. a checkpoint saved on DEV at step 10 resumed on the CPU: steps 11-20
#      give the losses of the uninterrupted device run (within 1e-4), and a
#      CPU checkpoint resumed on DEV those of the CPU run;
#   4. bf16 mixed precision on DEV (f32 master weights and moments, the
#      model on a bf16 copy, bf16 gradients) against the CPU engine's bf16
#      (f32 everywhere but the products' operands, src/train/precision):
#      every step's loss within 1% relative (bf16 keeps 8 bits: 0.4% per
#      rounding; the device also rounds activations and gradients, so the
#      two differ in every layer, not only in the products); against the
#      CPU's fp32 within 1% as well; and 2 ranks sharing DEV in bf16 (the
#      gradients averaged in bf16) against 1 rank, within 1%; a bf16 run's
#      checkpoint (the f32 masters) resumed in bf16 gives its losses;
#   5. what a device trainer refuses (fp16) says so.
# ZeRO stages on DEV: device_zero.sh.
# usage: device_train.sh BUILD_TREE DEV   (the tree's train-gpt and tandemrun)
set -u
B=$1
DEV=$2
. "$(dirname "$0")/device_common.sh"
run cpu "$GPT" $COMMON --micro-batch 4 --device cpu --metrics "$dir/cpu.jsonl" --save "$dir/ck_cpu" --save-every 10
run dev "$GPT" $COMMON --micro-batch 4 --device "$DEV" --metrics "$dir/dev.jsonl" --save "$dir/ck_dev" --save-every 10
losses "$dir/cpu.jsonl" "$dir/dev.jsonl" 1 20 "1 rank on $DEV vs the CPU"
# the loss must fall (the run trains; a frozen model would match the CPU only if it were frozen too)
first=$(sed -n 's/.*"step":1,"loss":\([^,}]*\).*/\1/p' "$dir/dev.jsonl")
last=$(sed -n 's/.*"step":20,"loss":\([^,}]*\).*/\1/p' "$dir/dev.jsonl")
awk -v f="$first" -v l="$last" 'BEGIN { exit !(l < f - 0.5) }' || fail "the loss did not fall on $DEV: $first -> $last"

run dev2 "$RUN" -np 2 "$GPT" $COMMON --micro-batch 2 --device "$DEV" --metrics "$dir/dev2.jsonl"
losses "$dir/dev.jsonl" "$dir/dev2.jsonl" 1 20 "2 ranks sharing $DEV vs 1 rank, the same global batch"

[ -d "$dir/ck_dev/step-10" ] || fail "no step-10 checkpoint from the device run: $(ls "$dir/ck_dev")"
run resume_cpu "$GPT" $COMMON --micro-batch 4 --device cpu --resume "$dir/ck_dev/step-10" --metrics "$dir/rc.jsonl"
losses "$dir/dev.jsonl" "$dir/rc.jsonl" 11 20 "a $DEV checkpoint resumed on the CPU"
run resume_dev "$GPT" $COMMON --micro-batch 4 --device "$DEV" --resume "$dir/ck_cpu/step-10" --metrics "$dir/rd.jsonl"
losses "$dir/cpu.jsonl" "$dir/rd.jsonl" 11 20 "a CPU checkpoint resumed on $DEV"

# bf16 (fp32 masters): the emulator runs the kernels on the CPU, slowly, so
# the 2-rank run is 10 steps
run cpu16 "$GPT" $COMMON --micro-batch 4 --device cpu --bf16 --metrics "$dir/cpu16.jsonl"
run dev16 "$GPT" $COMMON --micro-batch 4 --device "$DEV" --bf16 --metrics "$dir/dev16.jsonl" --save "$dir/ck16" \
  --save-every 10
grep -q "precision=bf16" "$dir/dev16.out" || fail "the bf16 run on $DEV did not report precision=bf16: $(tail -3 "$dir/dev16.out")"
losses "$dir/cpu16.jsonl" "$dir/dev16.jsonl" 1 20 "bf16 on $DEV vs the CPU's bf16" 1e-2
losses "$dir/cpu.jsonl" "$dir/dev16.jsonl" 1 20 "bf16 on $DEV vs the CPU's fp32" 1e-2
# and it is bf16: the losses are not the fp32 device run's
grep -o '"loss":[^,]*' "$dir/dev.jsonl" >"$dir/l32"
grep -o '"loss":[^,]*' "$dir/dev16.jsonl" >"$dir/l16"
cmp -s "$dir/l32" "$dir/l16" &&
  fail "bf16 on $DEV gave the fp32 run's losses bit for bit: bf16 did not take effect"
# the checkpoint holds the f32 masters; the resumed run rounds its bf16 copy from them, as the optimizer did
run resume16 "$GPT" $COMMON --micro-batch 4 --device "$DEV" --bf16 --resume "$dir/ck16/step-10" --metrics "$dir/r16.jsonl"
losses "$dir/dev16.jsonl" "$dir/r16.jsonl" 11 20 "a bf16 checkpoint on $DEV resumed on $DEV" 1e-6
run dev16x2 "$RUN" -np 2 "$GPT" $(echo $COMMON | sed 's/--steps 20/--steps 10/') --micro-batch 2 --device "$DEV" --bf16 \
  --metrics "$dir/dev16x2.jsonl"
losses "$dir/dev16.jsonl" "$dir/dev16x2.jsonl" 1 10 "bf16: 2 ranks sharing $DEV vs 1 rank" 1e-2

if "$GPT" $COMMON --micro-batch 4 --device "$DEV" --fp16 >"$dir/f16.out" 2>&1; then
  fail "fp16 on $DEV was accepted"
fi
grep -q "does not support fp16 training" "$dir/f16.out" || fail "fp16 on $DEV: unclear refusal: $(cat "$dir/f16.out")"
echo ok
