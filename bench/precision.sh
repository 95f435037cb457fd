#!/usr/bin/env bash
# Mixed precision and activation checkpointing (issue 9), side by side in one
# run. Writes bench/results/precision-<date>.md.
#
#   bench/precision.sh [--rounds N] [--steps N] [--loss-steps N] [--ckpt-steps N]
#   (TAG=x names the file precision-<date>-x.md)
#
# 1. The linear layers' matrix products, single-threaded: bf16 (vdpbf16ps)
#    against the f32 products (the layers' own AVX-512 kernel and OpenBLAS
#    sgemm), GPT reference shapes (test_precision_gemm --bench).
# 2. train-gpt tokens/s, reference configuration (4 layers, 256 channels,
#    micro-batch 8 per rank), fp32 against --bf16, at 1 rank x 1 thread and 2
#    ranks x 1 thread, the four interleaved round by round; medians.
#    Target: bf16 >= 1.6x fp32 at both.
# 3. The loss after --loss-steps (default 500; 0 skips it) steps, fp32 and
#    bf16, 2 ranks: target within 1%.
# 4. Activation checkpointing on a 12-layer GPT (reference width), 1 x 1,
#    with and without, interleaved: tokens/s (target >= 0.7x) and the
#    activation memory the model allocated (target <= 1/4), with peak RSS.
set -u
cd "$(dirname "$0")/.."
rounds=3 steps=40 loss_steps=500 ckpt_steps=12
while [ $# -gt 0 ]; do
  case "$1" in
  --rounds) rounds=$2; shift 2 ;;
  --steps) steps=$2; shift 2 ;;
  --loss-steps) loss_steps=$2; shift 2 ;;
  --ckpt-steps) ckpt_steps=$2; shift 2 ;;
  *) echo "usage: bench/precision.sh [--rounds N] [--steps N] [--loss-steps N] [--ckpt-steps N]" >&2; exit 2 ;;
  esac
done
B=${BUILD:-build}
RUN="$B/bin/tandemrun"
GPT="$B/bin/train-gpt"
make -j2 --no-print-directory BUILD="$B" all >/dev/null || { echo "bench/precision.sh: build of $B failed" >&2; exit 1; }
export TANDEM_PROGRESS=off
date_tag=$(date +%Y-%m-%d)
out=bench/results/precision-$date_tag${TAG:+-$TAG}.md
mkdir -p bench/results
log=$(mktemp /tmp/tandem-bench-precision-mp-XXXXXX)
trap 'rm -f "$log"' EXIT

value() { grep -o "$1=[^ ]*" | head -1 | cut -d= -f2; }
median() { sort -g | awk '{ a[NR] = $1 } END { if (NR == 0) { print "nan"; exit } if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
load_before=$(uptime | sed 's/.*load average: //')

echo "1. kernels" >&2
kern=$("$B/tests/test_precision_gemm" --bench 11 2>&1)

echo "2. tokens/s, $rounds rounds" >&2
declare -A runs
for ((r = 1; r <= rounds; r++)); do
  for prec in fp32 bf16; do
    flag=""; [ $prec = bf16 ] && flag=--bf16
    t=$("$GPT" --threads 1 --steps "$steps" --sample 0 $flag 2>>"$log" | value tokens_per_s)
    runs[${prec}_11]+="$t "
    t2=$("$RUN" -np 2 "$GPT" --threads 1 --steps "$steps" --sample 0 $flag 2>>"$log" | value tokens_per_s)
    runs[${prec}_21]+="$t2 "
    echo "  round $r $prec: 1x1 $t, 2x1 $t2 tokens/s" >&2
  done
done
med() { echo "${runs[$1]:-}" | tr ' ' '\n' | grep -v '^$' | median; }
f11=$(med fp32_11); b11=$(med bf16_11); f21=$(med fp32_21); b21=$(med bf16_21)

lf="not run" lb="not run" lerr="n/a"
if [ "$loss_steps" -gt 0 ]; then
  echo "3. loss after $loss_steps steps, 2 ranks" >&2
  lf=$("$RUN" -np 2 "$GPT" --threads 1 --steps "$loss_steps" --sample 0 2>>"$log" | value final_loss)
  lb=$("$RUN" -np 2 "$GPT" --threads 1 --steps "$loss_steps" --sample 0 --bf16 2>>"$log" | value final_loss)
  lerr=$(awk -v a="$lb" -v b="$lf" 'BEGIN { d = a - b; if (d < 0) d = -d; printf "%.2f%%", 100 * d / b }')
fi

echo "4. activation checkpointing, 12 layers, $rounds rounds" >&2
for ((r = 1; r <= rounds; r++)); do
  for ck in 0 1; do
    flag=""; [ $ck = 1 ] && flag=--activation-checkpointing
    o=$("$GPT" --threads 1 --layers 12 --steps "$ckpt_steps" --sample 0 $flag 2>>"$log")
    runs[ck${ck}_t]+="$(echo "$o" | value tokens_per_s) "
    runs[ck${ck}_act]=$(echo "$o" | value activation_mib)
    runs[ck${ck}_rss]+="$(echo "$o" | value max_rss_mib) "
    echo "  round $r checkpointing=$ck: $(echo "$o" | value tokens_per_s) tokens/s, activations $(echo "$o" | value activation_mib) MiB" >&2
  done
done
c0=$(med ck0_t); c1=$(med ck1_t); r0=$(med ck0_rss); r1=$(med ck1_rss)
load_after=$(uptime | sed 's/.*load average: //')

cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
{
  echo "# Mixed precision and activation checkpointing — $date_tag"
  echo
  echo "Machine: $cpu, $(nproc) cores, $(. /etc/os-release; echo "$PRETTY_NAME"); Tandem $(git rev-parse --short HEAD 2>/dev/null), $(gcc --version | head -1)"
  echo "Load average (1, 5, 15 min) before: $load_before; after: $load_after (the machine is shared)."
  echo
  echo "## 1. Matrix products, one thread (GFLOP/s)"
  echo
  echo '```'
  echo "$kern"
  echo '```'
  echo
  echo "## 2. train-gpt, reference configuration, tokens/s (median of $rounds interleaved rounds, $steps steps each)"
  echo
  echo "| ranks x threads | fp32 | bf16 | bf16 / fp32 | target |"
  echo "|---|---|---|---|---|"
  echo "| 1 x 1 | $f11 | $b11 | $(ratio "$b11" "$f11") | >= 1.6 |"
  echo "| 2 x 1 | $f21 | $b21 | $(ratio "$b21" "$f21") | >= 1.6 |"
  echo
  echo "All rounds: fp32 1x1: ${runs[fp32_11]}; bf16 1x1: ${runs[bf16_11]}; fp32 2x1: ${runs[fp32_21]}; bf16 2x1: ${runs[bf16_21]}"
  echo
  echo "## 3. Loss after $loss_steps steps, 2 ranks"
  echo
  echo "fp32 $lf, bf16 $lb: difference $lerr (target within 1%)."
  echo
  echo "## 4. Activation checkpointing, 12-layer GPT (256 channels, micro-batch 8), 1 x 1"
  echo
  echo "| | tokens/s (median) | activation memory (MiB) | peak RSS (MiB) |"
  echo "|---|---|---|---|"
  echo "| without | $c0 | ${runs[ck0_act]} | $r0 |"
  echo "| with | $c1 | ${runs[ck1_act]} | $r1 |"
  echo "| with / without | $(ratio "$c1" "$c0") (target >= 0.7) | $(ratio "${runs[ck1_act]}" "${runs[ck0_act]}") (target <= 0.25) | $(ratio "$r1" "$r0") |"
  echo
  echo "All rounds (tokens/s): without ${runs[ck0_t]}; with ${runs[ck1_t]}"
} >"$out"
cat "$out"
echo "bench/precision.sh: wrote $out" >&2
