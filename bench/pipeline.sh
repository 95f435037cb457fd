#!/usr/bin/env bash
# Pipeline parallelism (issue 21): throughput against data parallelism at the
# same global batch, and each stage's measured idle fraction against the
# 1F1B bubble (p-1)/(m+p-1). Writes bench/results/pipeline-<date>[-TAG].md.
#
#   bench/pipeline.sh [--rounds N] [--steps N] [--tag TAG]
#
# 1. Throughput: the GPT reference configuration (4 layers, 256 channels,
#    4 heads, sequence 128; AdamW) at a global batch of 64 sequences:
#    DP=2 (micro 8 x accum 4 x 2 ranks), PP=2 (micro 8 x 8 micro-batches),
#    PP=2 interleaved (2 chunks), PP=4 (micro 8 x 8 micro-batches, 4 ranks:
#    twice the ranks of the others, on the same cores). One thread per rank.
#    Rounds interleave the layouts; medians of train-gpt's tokens_per_s
#    (steps after the first two). Target: PP=2 >= 0.8x DP=2.
# 2. Idle fraction per stage: PP=2 and PP=4, 1F1B and interleaved (2
#    chunks; PP=4 only 1F1B: the 4 layers do not cut into 4 x 2 chunks), m = 4, 8, 16 micro-batches of 4 sequences; each rank's
#    `pipeline ... idle_fraction=` (1 - (forward + backward) / step time,
#    over the steps after the first), against (p-1)/(m+p-1) and, for the
#    interleaved schedule, (p-1)/(v m+p-1).
#
# The load of other users on the machine stretches every figure; `uptime`'s
# load average is recorded beside them. With more ranks than cores (PP=4 on
# 2 cores) a stage also waits for a core, which counts as idle here.
set -u
cd "$(dirname "$0")/.."
rounds=3; steps=8; tag=""
while [ $# -gt 0 ]; do
  case "$1" in
  --rounds) rounds=$2; shift 2 ;;
  --steps) steps=$2; shift 2 ;;
  --tag) tag="-$2"; shift 2 ;;
  *) echo "usage: bench/pipeline.sh [--rounds N] [--steps N] [--tag TAG]" >&2; exit 2 ;;
  esac
done
B=${BUILD:-build}
RUN="$B/bin/tandemrun"
GPT="$B/bin/train-gpt"
make -j2 --no-print-directory BUILD="$B" "$RUN" "$GPT" >/dev/null || { echo "bench/pipeline.sh: build of $B failed" >&2; exit 1; }
export TANDEM_PROGRESS=off
out=bench/results/pipeline-$(date +%Y-%m-%d)$tag.md
mkdir -p bench/results
log=$(mktemp /tmp/tandem-bench-pipeline-XXXXXX)
trap 'rm -f "$log"' EXIT

value() { grep -o "$1=[^ ]*" | head -1 | cut -d= -f2; }
median() { sort -g | awk '{ a[NR] = $1 } END { if (NR == 0) { print "nan"; exit } if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
ref="--layers 4 --channels 256 --heads 4 --seq 128 --threads 1 --sample 0 --steps $steps"

# name | ranks | flags
layouts=(
  "DP=2|2|--micro-batch 8 --grad-accum 4"
  "PP=2 (1f1b, m=8)|2|--micro-batch 8 --grad-accum 8 --pipeline-parallel 2"
  "PP=2 (interleaved x2, m=8)|2|--micro-batch 8 --grad-accum 8 --pipeline-parallel 2 --pipeline-schedule interleaved --pipeline-chunks 2"
  "PP=4 (1f1b, m=8)|4|--micro-batch 8 --grad-accum 8 --pipeline-parallel 4"
)
declare -A tps
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq 1 "$rounds"); do
  for l in "${layouts[@]}"; do
    IFS='|' read -r name np flags <<<"$l"
    # shellcheck disable=SC2086
    if ! timeout 900 "$RUN" -np "$np" "$GPT" $ref $flags >"$log" 2>&1; then
      echo "bench/pipeline.sh: $name failed:" >&2; tail -5 "$log" >&2; exit 1
    fi
    t=$(grep "final_loss=" "$log" | value tokens_per_s)
    tps[$name]="${tps[$name]:-} $t"
    echo "round $r: $name: $t tokens/s" >&2
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
dp=$(tr ' ' '\n' <<<"${tps[DP=2]}" | grep . | median)

{
  echo "# Pipeline parallelism — $(date +%Y-%m-%d)"
  echo
  echo "Machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), shared; load average $load_before before, $load_after after the throughput runs."
  echo "Command: \`bench/pipeline.sh --rounds $rounds --steps $steps\` (build: $B)."
  echo
  echo "## Throughput at a global batch of 64 sequences (reference GPT, 1 thread per rank)"
  echo
  echo "| layout | ranks | tokens/s (median of $rounds) | runs | x DP=2 |"
  echo "|---|---|---|---|---|"
  for l in "${layouts[@]}"; do
    IFS='|' read -r name np flags <<<"$l"
    m=$(tr ' ' '\n' <<<"${tps[$name]}" | grep . | median)
    echo "| $name | $np | $m | ${tps[$name]} | $(awk -v a="$m" -v b="$dp" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }') |"
  done
  echo
  echo "## Idle fraction per stage (micro-batches of 4 sequences)"
  echo
  echo "idle = 1 - (forward + backward) / step time, per rank, over the steps after the first."
  echo
  echo "| layout | m | stage | layers | idle measured | closed form | measured / closed form |"
  echo "|---|---|---|---|---|---|---|"
} >"$out"

for spec in "2|1f1b|1" "2|interleaved|2" "4|1f1b|1"; do  # 4 stages x 2 chunks needs 8 layers
  IFS='|' read -r p sched v <<<"$spec"
  for m in 4 8 16; do
    # shellcheck disable=SC2086
    if ! TANDEM_TIMEOUT=${TANDEM_TIMEOUT:-120} timeout 900 "$RUN" -np "$p" "$GPT" $ref --micro-batch 4 \
        --grad-accum "$m" --pipeline-parallel "$p" --pipeline-schedule "$sched" --pipeline-chunks "$v" >"$log" 2>&1; then
      echo "bench/pipeline.sh: p=$p $sched m=$m failed:" >&2; tail -3 "$log" >&2
      echo "| PP=$p $sched | $m | - | - | failed: $(grep -o 'did not finish within [0-9]* s' "$log" | head -1) | | |" >>"$out"
      continue
    fi
    closed=$(awk -v p="$p" -v m="$m" -v v="$v" 'BEGIN { printf "%.4f", (p - 1) / (v * m + p - 1) }')
    grep "pipeline rank=" "$log" | sort -t= -k3 -n | while read -r line; do
      s=$(value stage <<<"$line"); idle=$(value idle_fraction <<<"$line"); layers=$(value layers <<<"$line")
      echo "| PP=$p $sched$([ "$v" -gt 1 ] && echo " x$v") | $m | $s | $layers | $idle | $closed | $(awk -v a="$idle" -v b="$closed" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }') |" >>"$out"
    done
    echo "idle: p=$p $sched m=$m done" >&2
  done
done
echo >>"$out"
echo "Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)." >>"$out"
cat "$out"
