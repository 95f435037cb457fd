#!/usr/bin/env bash
# The ZeRO memory estimate (train-gpt --estimate-memory) against what runs
# measure, per stage, on 2 and 4 ranks: model_state_bytes_per_rank (the
# trainer's own count: resident pages of the parameter and gradient arenas
# plus the optimizer state, the most seen in the first two steps, rank 0)
# against the estimate's model states, and peak RSS (max over ranks,
# /usr/bin/time) against the estimate's total (model states + activations).
# Stage 3 runs with stage3_max_live_parameters = stage3_prefetch_bucket_size
# = two blocks (as bench/zperf-search.sh: the defaults would keep a whole
# model this size fetched). Prints a markdown table on stdout.
#
#   bench/zperf-estimate.sh [--layers L] [--channels C] [--np "2 4"] [--stages "0 1 2 3"]
#
# Peak RSS also counts the program (~40 MiB) and, at stages 0-2 on the shm
# transport, the pages of the peers' host-shared arenas a rank reads in the
# direct collectives (they are the peers' memory, counted in both RSS
# figures), so RSS / estimate runs above 1 there; model states are the
# like-for-like comparison.
set -u
cd "$(dirname "$0")/.."
L=12; C=768; NPS="2 4"; STAGES="0 1 2 3"
while [ $# -gt 0 ]; do
  case "$1" in
  --layers) L=$2; shift 2 ;;
  --channels) C=$2; shift 2 ;;
  --np) NPS=$2; shift 2 ;;
  --stages) STAGES=$2; shift 2 ;;
  *) echo "usage: bench/zperf-estimate.sh [--layers L] [--channels C] [--np \"2 4\"] [--stages \"0 1 2 3\"]" >&2; exit 2 ;;
  esac
done
B=${BUILD:-build}
RUN="$B/bin/tandemrun"
GPT="$B/bin/train-gpt"
make -j2 --no-print-directory BUILD="$B" all >/dev/null || { echo "bench/zperf-estimate.sh: build of $B failed" >&2; exit 1; }
export TANDEM_PROGRESS=off
tmp=$(mktemp -d /tmp/tandem-zperf-est-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
two_blocks=$((2 * (12 * C * C + 13 * C)))
printf '{"zero_optimization": {"stage3_max_live_parameters": %d, "stage3_prefetch_bucket_size": %d}}\n' \
  "$two_blocks" "$two_blocks" >"$tmp/s3.json"
ARGS="--layers $L --channels $C --heads $((C / 64)) --seq 64 --micro-batch 1 --threads 1 --sample 0 --config $tmp/s3.json"
value() { grep -o "$1=[^ ]*" | head -1 | cut -d= -f2; }
mib() { awk -v b="${1:-0}" 'BEGIN { printf "%.1f", b / 1048576 }'; }
ratio() { awk -v a="${1:-0}" -v b="${2:-0}" 'BEGIN { if (b > 0) printf "%.3f", a / b; else print "n/a" }'; }
echo "| ranks | stage | model states measured MiB | estimate MiB (live) | measured / estimate | peak RSS MiB | estimate total MiB | RSS / total |"
echo "|---|---|---|---|---|---|---|---|"
for np in $NPS; do
  est=$("$RUN" -np "$np" "$GPT" $ARGS --estimate-memory 2>/dev/null | sed 's/^\[0\] //')
  for st in $STAGES; do
    rm -f "$tmp"/rss.*
    line=$("$RUN" -np "$np" sh -c '/usr/bin/time -o '"$tmp"'/rss.$TANDEM_RANK -f %M "$@"' sh "$GPT" $ARGS --steps 3 \
      --zero-stage "$st" 2>/dev/null | grep model_state_bytes_per_rank | head -1)
    ms=$(echo "$line" | value model_state_bytes_per_rank)
    kb=$(cat "$tmp"/rss.* 2>/dev/null | sort -g | tail -1)
    e=$(echo "$est" | grep "^stage=$st ")
    ems=$(echo "$e" | value model_state_bytes)
    tot=$(echo "$e" | value total)
    echo "| $np | $st | $(mib "$ms") | $(mib "$ems") ($(echo "$e" | value live)) | $(ratio "$ms" "$ems") | $(awk -v k="${kb:-0}" 'BEGIN { printf "%.0f", k / 1024 }') | $tot | $(awk -v k="${kb:-0}" -v t="${tot:-0}" 'BEGIN { if (t > 0) printf "%.3f", k / 1024 / t; else print "n/a" }') |"
  done
done
