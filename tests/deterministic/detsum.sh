#!/usr/bin/env bash
# Deterministic reduction end to end (src/train/deterministic/): train-gpt with
# "deterministic_reduction": true.
#
#   detsum.sh B ranks STAGE...  global batch 12 in units of 2 (6 units: 6,
#                               3, 2 and 2,2,1,1 per rank at 1-4 ranks,
#                               several per rank = accumulation), clipping
#                               on: at each ZeRO stage the final loss and
#                               parameter hash of 2, 3 and 4 ranks equal
#                               the 1-rank run's bit for bit (and a 1-rank
#                               run with units of 3, another sum, differs:
#                               the comparison can fail), also with
#                               the exchange streamed in chunks of one
#                               page (TANDEM_TEST_DET_CHUNK)
#   detsum.sh B refuse          the combinations that cannot be canonical
#                               are refused with a message naming the fix
set -u
B=$1
case_name=$2
shift 2
RUN="$B/bin/tandemrun"
GPT="$B/bin/train-gpt"
work=$(mktemp -d /tmp/tandem-detsum-XXXXXX)
trap 'rm -rf "$work"' EXIT
export TANDEM_PROGRESS=off
M="--layers 1 --channels 32 --heads 2 --seq 32 --threads 1 --sample 0 --steps ${DETSUM_STEPS:-8}"
fail() { echo "FAIL($case_name): $*"; exit 1; }
cfg() { printf '{"train_batch_size": 12, "gradient_clipping": 0.5, %s}' "$2" >"$work/$1.json"; }
exact() { # exact NP ARGS...: "loss hash" of a run
  local np=$1
  shift
  "$RUN" -np "$np" "$GPT" $M "$@" >"$work/out" 2>&1 || { tail -20 "$work/out"; fail "train-gpt -np $np $* failed"; }
  sed -n 's/.*deterministic final_loss_exact=\([^ ]*\) params_hash=\([^ ]*\).*/\1 \2/p' "$work/out"
}
# refused CONFIG_BODY PATTERN [NP ARGS...]: the run fails naming PATTERN
refused() {
  local body=$1 pattern=$2 np=${3:-1}
  shift 3 2>/dev/null || shift $#
  cfg bad "$body"
  "$RUN" -np "$np" "$GPT" $M --config "$work/bad.json" "$@" >"$work/out" 2>&1 && fail "accepted: $body $*"
  grep -q -- "$pattern" "$work/out" || { tail -5 "$work/out"; fail "no message '$pattern' for: $body $*"; }
  echo "refused: $body $* -> $(grep -m1 -o -- "$pattern.*" "$work/out" | cut -c1-100)"
}

case "$case_name" in
ranks)
  cfg det '"deterministic_reduction": true, "deterministic_unit": 2'
  for stage in "$@"; do
    ref=$(exact 1 --config "$work/det.json" --zero-stage "$stage")
    [ -n "$ref" ] || fail "no deterministic summary line at 1 rank"
    for np in 2 3 4; do
      got=$(exact "$np" --config "$work/det.json" --zero-stage "$stage")
      [ "$got" = "$ref" ] || fail "stage $stage, $np ranks: $got, 1 rank: $ref"
    done
    # the streamed exchange in many chunks of 1024 floats (one page): the same bits
    for np in 1 3; do
      got=$(TANDEM_TEST_DET_CHUNK=1024 exact "$np" --config "$work/det.json" --zero-stage "$stage")
      [ "$got" = "$ref" ] || fail "stage $stage, $np ranks, chunks of 1024 floats: $got, 1 rank: $ref"
    done
    echo "stage $stage: 1, 2, 3, 4 ranks: $ref"
  done
  cfg det3 '"deterministic_reduction": true, "deterministic_unit": 3'
  other=$(exact 1 --config "$work/det3.json")
  [ -n "$other" ] && [ "$other" != "$ref" ] || fail "units of 3 gave the bits of units of 2 ($other)"
  ;;
refuse)
  refused '"deterministic_reduction": true, "deterministic_unit": 5' "deterministic_unit 5 does not divide train_batch_size 12: use one of 1, 2, 3, 4, 6, 12"
  refused '"deterministic_reduction": true, "deterministic_unit": 0' "deterministic_unit must be a whole number"
  refused '"deterministic_reduction": 1' "deterministic_reduction must be true or false"
  refused '"deterministic_reduction": false, "deterministic_unit": 2' "deterministic_unit is set but deterministic_reduction is false"
  refused '"deterministic_reduction": true, "communication_data_type": "bf16"' 'communication_data_type "bf16": 16-bit partial sums round by world size; use "fp32"' 2
  refused '"deterministic_reduction": true' "does not support NVMe offload" 1 --zero-stage 3 --offload-optimizer "nvme:$work"
  cfg off '"deterministic_reduction": false'
  "$RUN" --min-np 1 --max-np 2 -np 2 --max-restarts 0 "$GPT" $M --config "$work/off.json" >"$work/out" 2>&1 && fail "elastic training accepted deterministic_reduction false"
  grep -q 'remove "deterministic_reduction": false from the config' "$work/out" || { tail -5 "$work/out"; fail "no message for elastic with deterministic_reduction false"; }
  echo "refused: elastic training with deterministic_reduction false"
  ;;
*) fail "unknown case" ;;
esac
echo "PASS($case_name)"
