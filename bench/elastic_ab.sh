#!/usr/bin/env bash
# A/B of elastic training's steady-state cost between two builds (issue 19):
# the GPT reference configuration of bench/elastic_cost.sh (4 layers, 256
# channels, 4 heads, sequence 128, micro-batch 8 per rank, AdamW) on 4 ranks
# at one ZeRO stage, elastic on (tandemrun --min-np 4 --max-np 4 -np 4) with
# build A and with build B, and elastic off with build B (the reference the
# ratios are taken to), alternating A B off / off B A round by round so that
# a load trend favours neither. Per build: medians and ranges of tokens/s
# (rank 0's tokens_per_s=, the first 2 steps left out), of user+sys CPU
# seconds per rank (/usr/bin/time over the whole job, divided by 4) and of
# the peak RSS of the largest rank (KiB). Writes
# bench/results/elastic-ab-<date>-stage<S>.md.
#
#   bench/elastic_ab.sh BUILD_A BUILD_B [STAGE] [ROUNDS] [STEPS]   (stage 0, 3 rounds, 12 steps)
#
# BUILD_A and BUILD_B are build trees (BUILD/bin/tandemrun, BUILD/bin/train-gpt).
set -u
cd "$(dirname "$0")/.."
A=${1:?usage: elastic_ab.sh BUILD_A BUILD_B [STAGE] [ROUNDS] [STEPS]}
B=${2:?usage: elastic_ab.sh BUILD_A BUILD_B [STAGE] [ROUNDS] [STEPS]}
stage=${3:-0}
rounds=${4:-3}
steps=${5:-12}
out=bench/results/elastic-ab-$(date -u +%Y-%m-%d)-stage$stage.md
tmp=$(mktemp -d /tmp/tandem-elastic-ab-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export TANDEM_PROGRESS=off
load0=$(cut -d' ' -f1-3 /proc/loadavg)
run() { # LABEL BUILD LAUNCH...
  local label=$1 build=$2
  shift 2
  rm -f "$tmp"/rss.*
  /usr/bin/time -f "%e %U %S" -o "$tmp/time" "$build/bin/tandemrun" "$@" \
    sh -c '/usr/bin/time -o '"$tmp"'/rss.$$ -f %M "$@"' sh "$build/bin/train-gpt" \
    --steps "$steps" --sample 0 --zero-stage "$stage" >"$tmp/out" 2>"$tmp/err" ||
    { tail -20 "$tmp/err"; echo "run failed: $label" >&2; exit 1; }
  local tps wall user sys cpu kb
  tps=$(sed -n 's/.*: final_loss=[^ ]* tokens_per_s=\([0-9.]*\).*/\1/p' "$tmp/out" | head -1)
  read -r wall user sys <"$tmp/time"
  cpu=$(awk -v u="$user" -v s="$sys" 'BEGIN { printf "%.2f", (u + s) / 4 }')
  kb=$(cat "$tmp"/rss.* | sort -g | tail -1)
  echo "$label $tps $cpu $wall $kb" | tee -a "$tmp/rows"
}
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) = 1 ]; then order="A B off"; else order="off B A"; fi
  for m in $order; do
    case $m in
      A) run A "$A" --min-np 4 --max-np 4 -np 4 ;;
      B) run B "$B" --min-np 4 --max-np 4 -np 4 ;;
      off) run off "$B" -np 4 ;;
    esac
  done
done
load1=$(cut -d' ' -f1-3 /proc/loadavg)
stat() { # LABEL COLUMN: median [min-max]
  awk -v l="$1" -v c="$2" '$1 == l {print $c}' "$tmp/rows" | sort -g |
    awk '{a[NR]=$1} END {m = (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2; printf "%g [%g-%g]", m, a[1], a[NR]}'
}
med() { awk -v l="$1" -v c="$2" '$1 == l {print $c}' "$tmp/rows" | sort -g |
  awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
{
  echo "# Elastic training A/B at ZeRO stage $stage ($(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD))"
  echo
  echo "\`bench/elastic_ab.sh $A $B $stage $rounds $steps\`: GPT reference configuration, 4 ranks on this host"
  echo "($(nproc) cores), $steps steps, $rounds rounds alternating A B off / off B A; median [min-max]."
  echo "Load average before: $load0; after: $load1. A: \`$A\`, B: \`$B\`, off: B without --min-np/--max-np."
  echo
  echo "| run | tokens/s | CPU s/rank | peak RSS KiB (largest rank) | tokens/s ratio to off | CPU ratio off/run |"
  echo "|---|---|---|---|---|---|"
  t_off=$(med off 2) c_off=$(med off 3)
  for l in A B off; do
    awk -v l="$l" -v t="$(stat "$l" 2)" -v c="$(stat "$l" 3)" -v k="$(stat "$l" 5)" -v tm="$(med "$l" 2)" \
      -v cm="$(med "$l" 3)" -v to="$t_off" -v co="$c_off" \
      'BEGIN { printf "| %s | %s | %s | %s | %.3f | %.3f |\n", l, t, c, k, tm / to, co / cm }'
  done
  echo
  echo "Rows (run, tokens/s, CPU s per rank, wall s, peak RSS KiB):"
  echo
  sed 's/^/    /' "$tmp/rows"
} >"$out"
cat "$out"
