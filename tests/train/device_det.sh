#!/bin/sh
# Deterministic reduction with the model on a device (issue 18;
# src/train/deterministic/: each unit's gradient computed on DEV and summed
# on the host in the canonical tree): the tiny GPT of device_train.sh, 4
# steps, units of 2 samples, global batch 4.
#   1. 1 rank on DEV (stage 0) and 2 ranks sharing DEV (stage 2) give the
#      same final loss and parameters bit for bit (train-gpt's
#      final_loss_exact and params_hash), and 2 ranks at stage 1 too;
#   2. bf16 with deterministic reduction on DEV is refused, saying so.
# usage: device_det.sh BUILD_TREE DEV
set -u
B=$1
DEV=$2
. "$(dirname "$0")/device_common.sh"
echo '{"deterministic_reduction": true, "deterministic_unit": 2}' >"$dir/det.json"
C4="$(echo $COMMON | sed 's/--steps 20/--steps 4/') --config $dir/det.json"
run one "$GPT" $C4 --micro-batch 4 --device "$DEV"
run two2 "$RUN" -np 2 "$GPT" $C4 --micro-batch 2 --device "$DEV" --zero-stage 2
run two1 "$RUN" -np 2 "$GPT" $C4 --micro-batch 2 --device "$DEV" --zero-stage 1
exact() { sed -n 's/.*deterministic final_loss_exact=\([^ ]*\) params_hash=\([0-9a-f]*\).*/\1 \2/p' "$dir/$1.out"; }
a=$(exact one)
[ -n "$a" ] || fail "no deterministic summary from 1 rank on $DEV: $(tail -3 "$dir/one.out")"
[ "$(exact two2)" = "$a" ] || fail "2 ranks at stage 2 on $DEV: $(exact two2), 1 rank: $a"
[ "$(exact two1)" = "$a" ] || fail "2 ranks at stage 1 on $DEV: $(exact two1), 1 rank: $a"
echo "deterministic on $DEV: 1 rank and 2 ranks (stages 1, 2) bit for bit: $a"
if "$GPT" $C4 --micro-batch 4 --device "$DEV" --bf16 >"$dir/b.out" 2>&1; then
  fail "bf16 with deterministic reduction on $DEV was accepted"
fi
grep -q "does not support deterministic reduction in bf16" "$dir/b.out" || fail "unclear refusal: $(cat "$dir/b.out")"
echo ok
