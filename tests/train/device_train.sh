#!/bin/sh
# train-gpt on a device (--device DEV) against the CPU engine, end to end
# (issue 18; src/train/core/devops.h): a tiny GPT (2 layers, 32 channels,
# seq 16), 20 steps in fp32 with clipping active.
#   1. one rank on DEV: every step's loss within 1e-4 relative of the CPU's;
#   2. 2 ranks sharing DEV (micro-batch 2 each, gradients reduced through the
#      device collectives' staged path) against 1 rank on DEV with micro-batch
#      4: the same global batch, losses within 1e-4 relative (6 steps);
#   3. a checkpoint saved on DEV at step 15 resumed on the CPU: steps 16-20
#      give the losses of the uninterrupted device run (within 1e-4), and a
#      CPU checkpoint resumed on DEV those of the CPU run;
# (the runs on DEV beyond the first are as short as what they check allows:
# in the emulator a step on DEV costs ~0.4 s of CPU)
#   4. what a device trainer refuses (fp16) says so; activation checkpointing
#      gives the losses of the run without it bit for bit, and the memory
#      estimate counts the activations it does not keep;
#   5. device memory is checked against the device, not the host: a job
#      whose activations cannot fit the device is refused at creation,
#      naming the device and what would fit; one that fits the device runs
#      under a host memory limit its device arenas would exceed.
# bf16 on DEV: device_bf16.sh; ZeRO stages on DEV: device_zero.sh.
# usage: device_train.sh BUILD_TREE DEV   (the tree's train-gpt and tandemrun)
set -u
B=$1
DEV=$2
. "$(dirname "$0")/device_common.sh"
run cpu "$GPT" $COMMON --micro-batch 4 --device cpu --metrics "$dir/cpu.jsonl" --save "$dir/ck_cpu" --save-every 15
run dev "$GPT" $COMMON --micro-batch 4 --device "$DEV" --metrics "$dir/dev.jsonl" --save "$dir/ck_dev" --save-every 15
losses "$dir/cpu.jsonl" "$dir/dev.jsonl" 1 20 "1 rank on $DEV vs the CPU"
# the loss must fall (the run trains; a frozen model would match the CPU only if it were frozen too)
first=$(sed -n 's/.*"step":1,"loss":\([^,}]*\).*/\1/p' "$dir/dev.jsonl")
last=$(sed -n 's/.*"step":20,"loss":\([^,}]*\).*/\1/p' "$dir/dev.jsonl")
awk -v f="$first" -v l="$last" 'BEGIN { exit !(l < f - 0.5) }' || fail "the loss did not fall on $DEV: $first -> $last"

# activation checkpointing on DEV: each block recomputed in backward from its kept input, the same losses bit for
# bit (6 steps); --estimate-memory's device activations with it are smaller by at least the L - 1 blocks' 15
# C-wide rows a position it does not keep (4 layers, 64 channels, micro-batch 4 x 64 positions, f32: 2.8 MiB)
run ckpt "$GPT" $(echo $COMMON | sed 's/--steps 20/--steps 6/') --micro-batch 4 --device "$DEV" \
  --activation-checkpointing --metrics "$dir/ckpt.jsonl"
losses "$dir/dev.jsonl" "$dir/ckpt.jsonl" 1 6 "1 rank on $DEV with activation checkpointing vs without" 0
grep -q "activation_checkpointing=1" "$dir/ckpt.out" || fail "checkpointing on $DEV: not reported: $(tail -3 "$dir/ckpt.out")"
BIG="--data $dir/corpus.txt --layers 4 --channels 64 --heads 2 --seq 64 --micro-batch 4 --device $DEV --estimate-memory"
run est_plain "$GPT" $BIG
run est_ckpt "$GPT" $BIG --activation-checkpointing
a0=$(sed -n 's/^stage=0 .* activations=\([0-9.]*\) .*/\1/p' "$dir/est_plain.out")
a1=$(sed -n 's/^stage=0 .* activations=\([0-9.]*\) .*/\1/p' "$dir/est_ckpt.out")
awk -v a0="$a0" -v a1="$a1" 'BEGIN { exit !(a0 != "" && a1 != "" && a0 - a1 >= 3 * 256 * 15 * 64 * 4 / 1048576 - 0.2) }' ||
  fail "activation checkpointing on $DEV: --estimate-memory says ${a1:-?} MiB of activations, without it ${a0:-?}"
echo "activations on $DEV (4 layers, estimate): $a0 MiB, with checkpointing $a1 MiB"

run dev2 "$RUN" -np 2 "$GPT" $(echo $COMMON | sed 's/--steps 20/--steps 6/') --micro-batch 2 --device "$DEV" \
  --metrics "$dir/dev2.jsonl"
losses "$dir/dev.jsonl" "$dir/dev2.jsonl" 1 6 "2 ranks sharing $DEV vs 1 rank, the same global batch"

[ -d "$dir/ck_dev/step-15" ] || fail "no step-15 checkpoint from the device run: $(ls "$dir/ck_dev")"
run resume_cpu "$GPT" $COMMON --micro-batch 4 --device cpu --resume "$dir/ck_dev/step-15" --metrics "$dir/rc.jsonl"
losses "$dir/dev.jsonl" "$dir/rc.jsonl" 16 20 "a $DEV checkpoint resumed on the CPU"
run resume_dev "$GPT" $COMMON --micro-batch 4 --device "$DEV" --resume "$dir/ck_cpu/step-15" --metrics "$dir/rd.jsonl"
losses "$dir/cpu.jsonl" "$dir/rd.jsonl" 16 20 "a CPU checkpoint resumed on $DEV"

if "$GPT" $COMMON --micro-batch 4 --device "$DEV" --fp16 >"$dir/f16.out" 2>&1; then
  fail "fp16 on $DEV was accepted"
fi
grep -q "does not support fp16 training" "$dir/f16.out" || fail "fp16 on $DEV: unclear refusal: $(cat "$dir/f16.out")"
# GPT-2's vocabulary at seq 1024: f32 logits alone about 1.5x the device's
# size, under it in bf16 (micro-batch 64, 13 GiB, on the emulator's 8 GiB;
# scaled by nvidia-smi's memory.total on a GPU: the first H200 run, 139 GiB,
# accepted the emulator's 13 GiB job)
dev_mib=8192
if command -v nvidia-smi >/dev/null 2>&1; then
  dev_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 2>/dev/null | head -1)
  case $dev_mib in '' | *[!0-9]*) dev_mib=8192 ;; esac
fi
big_mb=$((64 * dev_mib / 8192))
if "$GPT" --data "$dir/corpus.txt" --vocab 50304 --layers 2 --channels 64 --heads 2 --seq 1024 --micro-batch $big_mb \
    --steps 1 --sample 0 --device "$DEV" >"$dir/big.out" 2>&1; then
  fail "a job needing about 1.5x the device's $dev_mib MiB was accepted on $DEV: $(tail -2 "$dir/big.out")"
fi
grep -q "of device memory on $DEV" "$dir/big.out" && grep -q "It would fit with: bf16" "$dir/big.out" ||
  fail "the device memory refusal is unclear: $(cat "$dir/big.out")"
# 25 MiB of device arenas and 12 MiB of activations, a 40 MiB host limit (this process is about 20 MiB)
TANDEM_MEMORY_LIMIT=40M run hostlimit "$GPT" --data "$dir/corpus.txt" --vocab 50304 --layers 1 --channels 16 \
  --heads 2 --seq 16 --micro-batch 4 --steps 1 --sample 0 --device "$DEV"
echo ok
