#!/bin/sh
# bf16 mixed precision on a device (issue 18) against the CPU engine, end to
# end with train-gpt: the tiny GPT of device_train.sh, 20 steps, clipping
# active.
#   bf16 on DEV (f32 master weights and moments, the
#   model on a bf16 copy, bf16 gradients) against the CPU engine's bf16
#   (f32 everywhere but the products' operands, src/train/precision):
#   every step's loss within 1% relative (bf16 keeps 8 bits: 0.4% per
#   rounding; the device also rounds activations and gradients, so the
#   two differ in every layer, not only in the products); against the
#   CPU's fp32 within 1% as well; and 2 ranks sharing DEV in bf16 (the
#   gradients averaged in bf16) against 1 rank, within 1%; a bf16 run's
#   checkpoint (the f32 masters) resumed in bf16 gives its losses;
# usage: device_bf16.sh BUILD_TREE DEV
set -u
B=$1
DEV=$2
. "$(dirname "$0")/device_common.sh"
run cpu "$GPT" $COMMON --micro-batch 4 --device cpu --metrics "$dir/cpu.jsonl"
# bf16 (fp32 masters): the emulator runs the kernels on the CPU, slowly
# (~0.4 s of CPU a step), so the resumed run is 5 steps, the 2-rank run 6
run cpu16 "$GPT" $COMMON --micro-batch 4 --device cpu --bf16 --metrics "$dir/cpu16.jsonl"
run dev16 "$GPT" $COMMON --micro-batch 4 --device "$DEV" --bf16 --metrics "$dir/dev16.jsonl" --save "$dir/ck16" \
  --save-every 15
grep -q "precision=bf16" "$dir/dev16.out" || fail "the bf16 run on $DEV did not report precision=bf16: $(tail -3 "$dir/dev16.out")"
losses "$dir/cpu16.jsonl" "$dir/dev16.jsonl" 1 20 "bf16 on $DEV vs the CPU's bf16" 1e-2
# within 1% of the CPU's fp32, and visibly not fp32: fp32 on DEV matches the
# CPU within 1e-6 (device_train.sh), bf16 must differ by more than 1e-5
vs32=$(losses "$dir/cpu.jsonl" "$dir/dev16.jsonl" 1 20 "bf16 on $DEV vs the CPU's fp32" 1e-2) || fail "$vs32"
echo "$vs32"
echo "$vs32" | awk '{ for (i = 1; i < NF; i++) if ($i == "within") w = $(i + 1) } END { exit !(w > 1e-5) }' ||
  fail "bf16 on $DEV is as close to fp32 as fp32 is: bf16 did not take effect ($vs32)"
# the checkpoint holds the f32 masters; the resumed run rounds its bf16 copy from them, as the optimizer did
run resume16 "$GPT" $COMMON --micro-batch 4 --device "$DEV" --bf16 --resume "$dir/ck16/step-15" --metrics "$dir/r16.jsonl"
losses "$dir/dev16.jsonl" "$dir/r16.jsonl" 16 20 "a bf16 checkpoint on $DEV resumed on $DEV" 1e-6
run dev16x2 "$RUN" -np 2 "$GPT" $(echo $COMMON | sed 's/--steps 20/--steps 6/') --micro-batch 2 --device "$DEV" --bf16 \
  --metrics "$dir/dev16x2.jsonl"
losses "$dir/dev16.jsonl" "$dir/dev16x2.jsonl" 1 6 "bf16: 2 ranks sharing $DEV vs 1 rank" 1e-2

echo ok
