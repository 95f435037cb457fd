#!/bin/sh
# ZeRO stages 1-2 on a device (src/train/zero/device.c) against stage 0 on
# the same device, end to end with train-gpt (issue 18): 2 ranks sharing
# DEV (the staged device collectives), the tiny GPT of device_train.sh, 6
# steps with clipping active.
#   1. fp32: stages 1 and 2 give stage 0's losses within 1e-6 relative (the
#      update is elementwise on the shard; only the norm's summation order
#      differs), and stage 1 holds the closed-form model state: masters and
#      gradients whole (8 bytes a parameter), the two AdamW moments of the
#      shard only (8 bytes a parameter of it) where stage 0 holds them whole;
#   2. bf16 (f32 masters): stage 2 against stage 0 within 1e-6;
#   3. checkpoints of sharded device state: a stage-2 run on DEV saved at
#      step 3 resumed on the CPU (1 rank, stage 0) gives the device run's
#      losses 4-6 within 1e-4, and a CPU checkpoint resumed on DEV at stage 1
#      the CPU run's;
#   4. stage 3 on DEV is refused, saying why (the device model does not
#      fetch its parameters per layer).
# usage: device_zero.sh BUILD_TREE DEV
set -u
B=$1
DEV=$2
. "$(dirname "$0")/device_common.sh"
C6=$(echo $COMMON | sed 's/--steps 20/--steps 6/')

for z in 0 1 2; do
  run z$z "$RUN" -np 2 "$GPT" $C6 --micro-batch 2 --device "$DEV" --zero-stage $z --metrics "$dir/z$z.jsonl"
done
losses "$dir/z0.jsonl" "$dir/z1.jsonl" 1 6 "fp32 on $DEV, 2 ranks: stage 1 vs stage 0" 1e-6
losses "$dir/z0.jsonl" "$dir/z2.jsonl" 1 6 "fp32 on $DEV, 2 ranks: stage 2 vs stage 0" 1e-6
# model_state_bytes_per_rank (rank 0's): stage 0 = 16 p; stage 1 = 8 p + 8 shard
p=$(sed -n 's/.*final_loss=.* params=\([0-9]*\) .*/\1/p' "$dir/z0.out")
s0=$(sed -n 's/.*model_state_bytes_per_rank=\([0-9]*\).*/\1/p' "$dir/z0.out")
s1=$(sed -n 's/.*model_state_bytes_per_rank=\([0-9]*\).*/\1/p' "$dir/z1.out")
[ -n "$p" ] && [ -n "$s0" ] && [ -n "$s1" ] || fail "no params= or model_state_bytes_per_rank= in: $(tail -3 "$dir/z1.out")"
shard=$(( (p + 1) / 2 ))  # td_shard_range: rank 0 takes the odd element
[ "$s0" -eq $((16 * p)) ] || fail "stage 0 on $DEV holds $s0 bytes of model state, expected 16 x $p"
[ "$s1" -eq $((8 * p + 8 * shard)) ] || fail "stage 1 on $DEV holds $s1 bytes of model state, expected 8 x $p + 8 x $shard"
echo "model state per rank: stage 0 $s0 bytes, stage 1 $s1 bytes"

run b0 "$RUN" -np 2 "$GPT" $C6 --micro-batch 2 --device "$DEV" --bf16 --metrics "$dir/b0.jsonl"
run b2 "$RUN" -np 2 "$GPT" $C6 --micro-batch 2 --device "$DEV" --bf16 --zero-stage 2 --metrics "$dir/b2.jsonl" \
  --save "$dir/ck_b2" --save-every 3
losses "$dir/b0.jsonl" "$dir/b2.jsonl" 1 6 "bf16 on $DEV, 2 ranks: stage 2 vs stage 0" 1e-6

run cpu_b2 "$GPT" $C6 --micro-batch 4 --device cpu --resume "$dir/ck_b2/step-3" --metrics "$dir/cpu_b2.jsonl"
# the CPU continues in fp32 from the bf16 run's masters: steps 4-6 near the device's, within bf16's 1%
losses "$dir/b2.jsonl" "$dir/cpu_b2.jsonl" 4 6 "a stage-2 bf16 checkpoint from $DEV resumed on the CPU" 1e-2
run cpu "$GPT" $C6 --micro-batch 4 --device cpu --metrics "$dir/cpu.jsonl" --save "$dir/ck_cpu" --save-every 3
run z1r "$RUN" -np 2 "$GPT" $C6 --micro-batch 2 --device "$DEV" --zero-stage 1 --resume "$dir/ck_cpu/step-3" \
  --metrics "$dir/z1r.jsonl"
losses "$dir/cpu.jsonl" "$dir/z1r.jsonl" 4 6 "a CPU checkpoint resumed on $DEV at stage 1 (2 ranks)" 1e-4

if "$GPT" $C6 --micro-batch 4 --device "$DEV" --zero-stage 3 >"$dir/z3.out" 2>&1; then
  fail "ZeRO stage 3 on $DEV was accepted"
fi
grep -q "cannot fetch its parameters per layer" "$dir/z3.out" || fail "stage 3 on $DEV: unclear refusal: $(cat "$dir/z3.out")"
echo ok
