#!/usr/bin/env bash
# The largest GPT (by parameter count) that trains 3 steps on 2 ranks at
# ZeRO stage 0 and at stage 3 within a per-rank RSS budget, and the same for
# PyTorch DDP + AdamW (fp32, the GPT of ../shared/peers/torch_gpt_ddp.py via
# bench/zero_peer.py). Writes bench/results/zperf-search-<date>.md.
#
#   bench/zperf-search.sh [--budget-mib M] [--channels C] [--no-torch]
#                         [--layout zero|tp2|pp2] [--estimate-only]
#
# --layout (default zero) picks what is searched on the 2 ranks: ZeRO stages
# 0 and 3 (data parallel), or tp2: tensor parallelism over both ranks (ZeRO
# stages 2-3 are not built with it), or pp2: two pipeline stages (1F1B, 2
# micro-batches of 1) with ZeRO-1, which on 2 ranks has one data-parallel
# rank per stage and so shards nothing. A layout's estimate is rank 0's
# (train-gpt --estimate-memory prints that one; a pipeline's last stage
# holds the head where the first holds the embeddings: with this
# vocabulary about the same). --estimate-only stops after the bisection on
# the estimate (no training: for sizes that would not finish in minutes or
# fit beside the other users of the machine).
#
# Tandem: 768 channels, 12 heads, sequence 64, micro-batch 1, growing depth.
# --estimate-memory brackets the depth (largest L whose estimated total plus
# 60 MiB of program fits the budget, found by bisection); real runs then
# confirm it: from the estimate's L, up one layer at a time while a run
# trains 3 steps within the budget (peak RSS of every rank, /usr/bin/time),
# down while it does not. Stage 3 runs with stage3_max_live_parameters and
# stage3_prefetch_bucket_size at two blocks' parameters (DeepSpeed's
# meaning; the defaults, 1e9 and 5e7, would let a whole model this size
# stay fetched). With a budget above 1536 MiB per rank every run holds
# /tmp/tandem-bigmem.lock (the machine is shared; runs above 3 GiB must).
#
# PyTorch: bytes per parameter measured as the slope of peak RSS between two
# depths, the largest depth predicted from it, then confirmed by one run
# (and one layer less if that run goes over the budget).
#
# The budget is per rank (default 4096 MiB: 8 GiB for the pair, a third of
# this shared 24 GiB machine). The stage-3/stage-0 ratio is the figure the
# issue targets (>= 1.8); it grows with the budget, because the fixed part
# (program, activations, buckets in flight) weighs less.
set -u
cd "$(dirname "$0")/.."
budget=4096; C=768; torch=1; layout=zero; estimate_only=0
args_given="$*"
while [ $# -gt 0 ]; do
  case "$1" in
  --budget-mib) budget=$2; shift 2 ;;
  --channels) C=$2; shift 2 ;;
  --no-torch) torch=0; shift ;;
  --layout) layout=$2; shift 2 ;;
  --estimate-only) estimate_only=1; shift ;;
  *) echo "usage: bench/zperf-search.sh [--budget-mib M] [--channels C] [--no-torch] [--layout zero|tp2|pp2] [--estimate-only]" >&2; exit 2 ;;
  esac
done
case "$layout" in zero|tp2|pp2) ;; *) echo "bench/zperf-search.sh: --layout zero, tp2 or pp2, not \"$layout\"" >&2; exit 2 ;; esac
B=${BUILD:-build}
RUN="$B/bin/tandemrun"
GPT="$B/bin/train-gpt"
PY=/usr/bin/python3
# runs whose two ranks may pass 3 GiB hold the machine-wide lock
LOCK=""
[ $((2 * budget)) -gt 3072 ] && LOCK="flock /tmp/tandem-bigmem.lock"
make -j2 --no-print-directory BUILD="$B" "$RUN" "$GPT" >/dev/null || { echo "bench/zperf-search.sh: build of $B failed" >&2; exit 1; }
export TANDEM_PROGRESS=off
tmp=$(mktemp -d /tmp/tandem-zperf-search-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
out=bench/results/zperf-search-$(date +%Y-%m-%d)$([ "$layout" = zero ] || echo "-$layout").md
mkdir -p bench/results
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
H=$((C / 64))
ARGS="--channels $C --heads $H --seq 64 --micro-batch 1 --threads 1 --sample 0"
value() { grep -o "$1=[^ ]*" | head -1 | cut -d= -f2; }
# two blocks' parameters: 12 C^2 + 13 C per block
two_blocks=$((2 * (12 * C * C + 13 * C)))
printf '{"zero_optimization": {"stage3_max_live_parameters": %d, "stage3_prefetch_bucket_size": %d}}\n' \
  "$two_blocks" "$two_blocks" >"$tmp/s3.json"

# what is searched: "name|ZeRO stage|flags"
case "$layout" in
zero) searches=("Tandem stage 0|0|" "Tandem stage 3|3|--config $tmp/s3.json") ;;
tp2) searches=("Tandem TP=2|0|--tensor-parallel 2") ;;
pp2) searches=("Tandem PP=2 + ZeRO-1|1|--pipeline-parallel 2 --grad-accum 2") ;;
esac
est_fits() { # STAGE L FLAGS: estimate total + 60 MiB <= budget
  local tot
  # shellcheck disable=SC2086
  tot=$("$RUN" -np 2 "$GPT" $3 $ARGS --layers "$2" --zero-stage "$1" --estimate-memory 2>/dev/null | grep "stage=$1 " | value total)
  awk -v t="${tot:-1e18}" -v b="$budget" 'BEGIN { exit !(t + 60 <= b) }'
}
# one real run: prints "ok|fail params peak_rss_mib s_per_step"
real_run() { # STAGE L FLAGS
  rm -f "$tmp"/rss.*
  local line t0 t1
  t0=$(date +%s.%N)
  # shellcheck disable=SC2086
  line=$($LOCK "$RUN" -np 2 sh -c '/usr/bin/time -o '"$tmp"'/rss.$$ -f "%M %U %S" "$@"' sh "$GPT" $3 $ARGS \
    --layers "$2" --steps 3 --zero-stage "$1" 2>>"$tmp/log" | grep final_loss)
  t1=$(date +%s.%N)
  local kb
  kb=$(cat "$tmp"/rss.* 2>/dev/null | awk '{ print $1 }' | sort -g | tail -1)
  local rss
  rss=$(awk -v k="${kb:-0}" 'BEGIN { printf "%.0f", k / 1024 }')
  local ok=fail
  [ -n "$(echo "$line" | value final_loss)" ] && [ "$rss" -le "$budget" ] && ok=ok
  echo "$ok $(echo "$line" | value params) $rss $(echo "$line" | value train_s) $(echo "$line" | value model_state_bytes_per_rank)"
}

rows=""; log_rows=""; est_rows=""
for search in "${searches[@]}"; do
  IFS='|' read -r name st flags <<<"$search"
  # bisection on the estimate: lo fits, hi does not
  lo=1; hi=2
  while est_fits "$st" $hi "$flags"; do lo=$hi; hi=$((hi * 2)); [ $hi -gt 4096 ] && break; done
  while [ $((hi - lo)) -gt 1 ]; do
    mid=$(((lo + hi) / 2))
    if est_fits "$st" $mid "$flags"; then lo=$mid; else hi=$mid; fi
  done
  L=$lo; est_L=$lo
  echo "search: $name, estimate says $L layers" >&2
  # shellcheck disable=SC2086
  est=$("$RUN" -np 2 "$GPT" $flags $ARGS --layers "$L" --zero-stage "$st" --estimate-memory 2>/dev/null)
  est_rows+="| $name | $L | $(echo "$est" | grep -o 'params=[0-9][0-9]*' | head -1 | cut -d= -f2) | $(echo "$est" | grep "stage=$st " | value total) | $(echo "$est" | grep "stage=$st " | value model_states) | $(echo "$est" | grep "stage=$st " | value activations) |"$'\n'
  if [ $estimate_only = 1 ]; then
    eval "params_$st=0"
    continue
  fi
  r=$(real_run "$st" $L "$flags"); log_rows+="| $name | $L | $r |"$'\n'; echo "  $L layers: $r" >&2
  if [ "${r%% *}" = ok ]; then
    best=$L; best_r=$r
    while :; do
      r=$(real_run "$st" $((L + 1)) "$flags"); log_rows+="| $name | $((L + 1)) | $r |"$'\n'; echo "  $((L + 1)) layers: $r" >&2
      [ "${r%% *}" = ok ] || break
      L=$((L + 1)); best=$L; best_r=$r
    done
  else
    best=0; best_r=""
    while [ $L -gt 1 ]; do
      L=$((L - 1))
      r=$(real_run "$st" $L "$flags"); log_rows+="| $name | $L | $r |"$'\n'; echo "  $L layers: $r" >&2
      if [ "${r%% *}" = ok ]; then best=$L; best_r=$r; break; fi
    done
  fi
  set -- $best_r
  rows+="| $name | $best | ${2:-} | ${3:-} | $(awk -v s="${4:-0}" 'BEGIN { printf "%.1f", s / 3 }') | $est_L |"$'\n'
  eval "params_$st=${2:-0}"
done

torch_rows=""
if [ $torch = 1 ]; then
  # peak RSS at two depths: the slope is bytes per parameter (DDP: parameters,
  # gradients, two Adam moments, the gradient buckets), the intercept the rest
  trun() { $LOCK "$PY" bench/zero_peer.py ddp 2 1 "$1" "$C" "$H" 64 1 3 2>>"$tmp/log" | grep peak_rss_mib; }
  a=$(trun 2); b=$(trun 8)
  pa=$(echo "$a" | value params); ra=$(echo "$a" | value peak_rss_mib)
  pb=$(echo "$b" | value params); rb=$(echo "$b" | value peak_rss_mib)
  bpp=$(awk -v pa="$pa" -v pb="$pb" -v ra="$ra" -v rb="$rb" 'BEGIN { printf "%.2f", (rb - ra) * 1048576 / (pb - pa) }')
  per_layer=$(((pb - pa) / 6))
  # the largest depth whose predicted RSS fits
  Lt=$(awk -v pa="$pa" -v ra="$ra" -v bpp="$bpp" -v pl="$per_layer" -v b="$budget" \
    'BEGIN { L = 2 + int((b - ra) * 1048576 / (bpp * pl)); print (L < 1 ? 1 : L) }')
  c=$(trun "$Lt"); rc=$(echo "$c" | value peak_rss_mib)
  if [ "${rc:-999999}" -gt "$budget" ] || [ -z "$c" ]; then
    torch_rows+="| torch DDP | $Lt | $(echo "$c" | value params) | ${rc:-failed} | $(echo "$c" | value step_ms) | over the budget |"$'\n'
    Lt=$((Lt - 1)); c=$(trun "$Lt"); rc=$(echo "$c" | value peak_rss_mib)
  fi
  torch_rows+="| torch DDP | $Lt | $(echo "$c" | value params) | $rc | $(echo "$c" | value step_ms) | largest |"$'\n'
  params_t=$(echo "$c" | value params)
fi
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
{
  echo "# Largest GPT on 2 ranks within $budget MiB RSS per rank ($(date -u '+%Y-%m-%d %H:%M UTC'))"
  echo
  echo "Command: \`bench/zperf-search.sh $args_given\`. Tandem $(git rev-parse --short HEAD); model: $C channels, $H heads, sequence 64, vocabulary 256, micro-batch 1, AdamW fp32, 3 steps, 1 thread per rank; layout $layout."
  echo "Load average before: $load_before; after: $load_after.$([ "$layout" = zero ] && echo " Stage 3 with stage3_max_live_parameters = stage3_prefetch_bucket_size = $two_blocks (two blocks).")"
  echo
  echo "The estimate's answer (train-gpt --estimate-memory, rank 0: the largest depth whose total + 60 MiB of program fits the budget):"
  echo
  echo "| run | layers | parameters of rank 0 | estimate total MiB | model states MiB | activations MiB |"
  echo "|---|---|---|---|---|---|"
  printf '%s' "$est_rows"
  if [ $estimate_only = 0 ]; then
    echo
    echo "Trained for 3 steps:"
    echo
    echo "| run | layers | parameters | peak RSS MiB (max of ranks) | s per step | layers the estimate picked |"
    echo "|---|---|---|---|---|---|"
    printf '%s' "$rows"
    [ "$layout" = zero ] && { echo; echo "Stage 3 / stage 0 parameters: **$(ratio "${params_3:-0}" "${params_0:-0}")** (target >= 1.8)."; }
    echo
    echo "Every real run (status, parameters, peak RSS MiB, train_s for 3 steps, model_state_bytes_per_rank):"
    echo
    echo "| run | layers | result |"
    echo "|---|---|---|"
    printf '%s' "$log_rows"
  else
    echo
    echo "Nothing was trained (--estimate-only)."
  fi
  if [ $torch = 1 ]; then
    echo
    echo "## PyTorch $("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null) DDP + AdamW (fp32, gloo), same model shape"
    echo
    echo "Peak RSS at 2 layers ($pa parameters): $ra MiB; at 8 layers ($pb): $rb MiB; slope **$bpp bytes per parameter**."
    echo
    echo "| run | layers | parameters | peak RSS MiB | ms per step | |"
    echo "|---|---|---|---|---|---|"
    printf '%s' "$torch_rows"
    echo
    echo "Tandem stage 0 / torch DDP parameters: $(ratio "${params_0:-0}" "${params_t:-0}"); stage 3 / torch DDP: $(ratio "${params_3:-0}" "${params_t:-0}")."
  fi
} >"$out"
cat "$out"
