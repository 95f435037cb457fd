#!/usr/bin/env bash
# bf16 against fp32 training speed (issue 9's 1.6x target), the decisive
# comparison in one command:
#
#   bench/bf16perf.sh [--rounds N] [--steps N] [--base BUILD_DIR]
#   (TAG=x names the file bf16perf-<date>-x.md)
#
# train-gpt, reference configuration (4 layers, 256 channels, micro-batch 8
# per rank, sequence 128), fp32 and --bf16, at 1 rank x 1 thread and 2 ranks
# x 1 thread, interleaved round by round (the order reversed every other
# round); medians of tokens/s (wall, after
# the first two steps) and of rank 0's CPU milliseconds per step over the
# same steps (steadier than wall time when other jobs load the machine).
# --base DIR adds a third variant, --bf16 from another build tree (the
# commit before a change), in the same rounds.
# Writes bench/results/bf16perf-<date>.md.
set -u
cd "$(dirname "$0")/.."
rounds=5 steps=40 base=""
while [ $# -gt 0 ]; do
  case "$1" in
  --rounds) rounds=$2; shift 2 ;;
  --steps) steps=$2; shift 2 ;;
  --base) base=$2; shift 2 ;;
  *) echo "usage: bench/bf16perf.sh [--rounds N] [--steps N] [--base BUILD_DIR]" >&2; exit 2 ;;
  esac
done
B=${BUILD:-build}
make -j2 --no-print-directory BUILD="$B" all >/dev/null || { echo "bench/bf16perf.sh: build of $B failed" >&2; exit 1; }
if [ -n "$base" ] && [ ! -x "$base/bin/train-gpt" ]; then
  echo "bench/bf16perf.sh: --base $base has no bin/train-gpt (build that tree first)" >&2
  exit 2
fi
export TANDEM_PROGRESS=off
date_tag=$(date +%Y-%m-%d)
out=bench/results/bf16perf-$date_tag${TAG:+-$TAG}.md
mkdir -p bench/results
log=$(mktemp /tmp/tandem-bench-bf16perf-XXXXXX)
trap 'rm -f "$log"' EXIT

value() { grep -o "$1=[^ ]*" | head -1 | cut -d= -f2; }
median() { sort -g | awk '{ a[NR] = $1 } END { if (NR == 0) { print "nan"; exit } if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
load_before=$(uptime | sed 's/.*load average: //')

variants="fp32 bf16"
[ -n "$base" ] && variants="fp32 bf16 base"
declare -A tps cpu
for ((r = 1; r <= rounds; r++)); do
  # the order reverses every other round: a variant that always ran after
  # another one came out ~5% off on the loaded machine
  order=$variants
  ((r % 2 == 0)) && order=$(echo "$variants" | tr ' ' '\n' | tac | tr '\n' ' ')
  for v in $order; do
    bin=$B/bin; flag=""
    [ "$v" != fp32 ] && flag=--bf16
    [ "$v" = base ] && bin=$base/bin
    for np in 1 2; do
      if [ $np = 1 ]; then
        o=$("$bin/train-gpt" --threads 1 --steps "$steps" --sample 0 $flag 2>>"$log")
      else
        o=$("$bin/tandemrun" -np 2 "$bin/train-gpt" --threads 1 --steps "$steps" --sample 0 $flag 2>>"$log")
      fi
      t=$(echo "$o" | value tokens_per_s) c=$(echo "$o" | value cpu_ms_per_step)
      tps[${v}_$np]+="$t " cpu[${v}_$np]+="${c:-nan} "
      echo "  round $r $v ${np}x1: $t tokens/s, ${c:-?} CPU ms/step (rank 0)" >&2
    done
  done
done
load_after=$(uptime | sed 's/.*load average: //')
med() { echo "$1" | tr ' ' '\n' | grep -v '^$' | grep -v nan | median; }

cpu_name=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
{
  echo "# bf16 against fp32 training speed — $date_tag"
  echo
  echo "Machine: $cpu_name, $(nproc) cores, $(. /etc/os-release; echo "$PRETTY_NAME"); Tandem $(git rev-parse --short HEAD 2>/dev/null), $(gcc --version | head -1)"
  echo "Load average (1, 5, 15 min) before: $load_before; after: $load_after (the machine is shared)."
  echo "Command: bench/bf16perf.sh --rounds $rounds --steps $steps${base:+ --base $base}"
  echo
  echo "train-gpt reference configuration (4 layers, 256 channels, 4 heads, sequence 128, micro-batch 8 per rank),"
  echo "$rounds interleaved rounds of $steps steps; medians. Tokens/s: wall, all ranks, after the first two steps."
  echo "CPU ms/step: rank 0's process CPU time per step over the same steps."
  echo
  echo "| ranks x threads | variant | tokens/s | CPU ms/step | tokens/s vs fp32 | CPU vs fp32 (fp32 / variant) |"
  echo "|---|---|---|---|---|---|"
  for np in 1 2; do
    f=$(med "${tps[fp32_$np]}") fc=$(med "${cpu[fp32_$np]}")
    for v in $variants; do
      t=$(med "${tps[${v}_$np]}") c=$(med "${cpu[${v}_$np]}")
      echo "| $np x 1 | $v | $t | $c | $(ratio "$t" "$f") | $(ratio "$fc" "$c") |"
    done
  done
  echo
  echo "Target: bf16 tokens/s >= 1.6x fp32 at 1 x 1 and 2 x 1."
  echo
  echo "All rounds (tokens/s; CPU ms/step):"
  for v in $variants; do
    for np in 1 2; do echo "- $v ${np}x1: ${tps[${v}_$np]}; ${cpu[${v}_$np]}"; done
  done
} >"$out"
cat "$out"
echo "bench/bf16perf.sh: wrote $out" >&2
