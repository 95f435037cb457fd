#!/usr/bin/env bash
# Steady-state cost of elastic training (issue 10): the GPT reference
# configuration (4 layers, 256 channels, 4 heads, sequence 128, micro-batch
# 8 per rank, AdamW) on 4 ranks at ZeRO stages 1 and 3, elastic off
# (tandemrun -np 4) and on (tandemrun --min-np 4 --max-np 4 -np 4: every
# step committed in memory, the shards replicated on a buddy rank),
# interleaved round by round. Reports medians of tokens/s (rank 0's
# tokens_per_s=, the first 2 steps left out) and of user+sys CPU seconds per
# rank (/usr/bin/time over the whole job, divided by 4: steadier than wall
# time on a loaded machine), the ratios on/off (target >= 0.95), and the
# load average. Writes bench/results/elastic-cost-<date>.md (-<HHMM>.md if
# that exists). BUILD=DIR: the build tree (default build; copy bin/ aside to
# rebuild while it runs).
#
#   bench/elastic_cost.sh [ROUNDS] [STEPS]       (default 3 rounds of 30 steps)
#   DETONLY=1 bench/elastic_cost.sh ...         "on" is deterministic reduction
#                                               alone (tandemrun -np 4, config
#                                               "deterministic_reduction": true,
#                                               not elastic): its share of the
#                                               cost; writes ...-detonly.md
set -u
cd "$(dirname "$0")/.."
rounds=${1:-3}
steps=${2:-30}
B=${BUILD:-build}
RUN="$B/bin/tandemrun"
GPT="$B/bin/train-gpt"
out=bench/results/elastic-cost-$(date -u +%Y-%m-%d)$([ "${DETONLY:-0}" = 1 ] && echo -detonly).md
# a second run the same day does not overwrite the first one's results
[ -e "$out" ] && out=${out%.md}-$(date -u +%H%M).md
tmp=$(mktemp -d /tmp/tandem-el2-cost-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export TANDEM_PROGRESS=off
args="--steps $steps --sample 0"
load0=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq 1 "$rounds"); do
  for stage in 1 3; do
    # ABBA: the order alternates by round, so that a load trend favours neither
    if [ $((r % 2)) = 1 ]; then modes="off on"; else modes="on off"; fi
    for mode in $modes; do
      if [ $mode = on ]; then launch="--min-np 4 --max-np 4 -np 4"; else launch="-np 4"; fi
      extra=
      if [ "${DETONLY:-0}" = 1 ] && [ $mode = on ]; then
        echo '{"deterministic_reduction": true}' >"$tmp/det.json"
        launch="-np 4" extra="--config $tmp/det.json"
      fi
      /usr/bin/time -f "%e %U %S" -o "$tmp/time" "$RUN" $launch "$GPT" $args $extra --zero-stage $stage >"$tmp/out" 2>"$tmp/err" ||
        { tail -20 "$tmp/err"; echo "run failed: stage $stage elastic $mode" >&2; exit 1; }
      tps=$(sed -n 's/.*: final_loss=[^ ]* tokens_per_s=\([0-9.]*\).*/\1/p' "$tmp/out" | head -1)
      read -r wall user sys <"$tmp/time"
      cpu=$(awk -v u="$user" -v s="$sys" 'BEGIN { printf "%.2f", (u + s) / 4 }')
      echo "$stage $mode $tps $cpu $wall" | tee -a "$tmp/rows"
    done
  done
done
load1=$(cut -d' ' -f1-3 /proc/loadavg)
med() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
{
  echo "# Elastic training: steady-state cost ($(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD))"
  echo
  echo "\`DETONLY=${DETONLY:-0} bench/elastic_cost.sh $rounds $steps\`: GPT reference configuration, 4 ranks on this host (2 cores), $steps steps,"
  echo "$rounds interleaved rounds, medians. Load average before: $load0; after: $load1."
  echo
  echo "| ZeRO stage | tokens/s off | tokens/s elastic | ratio (target >= 0.95) | CPU s/rank off | CPU s/rank elastic | CPU ratio |"
  echo "|---|---|---|---|---|---|---|"
  for stage in 1 3; do
    t_off=$(awk -v s=$stage '$1==s && $2=="off" {print $3}' "$tmp/rows" | med)
    t_on=$(awk -v s=$stage '$1==s && $2=="on" {print $3}' "$tmp/rows" | med)
    c_off=$(awk -v s=$stage '$1==s && $2=="off" {print $4}' "$tmp/rows" | med)
    c_on=$(awk -v s=$stage '$1==s && $2=="on" {print $4}' "$tmp/rows" | med)
    awk -v s=$stage -v a="$t_off" -v b="$t_on" -v c="$c_off" -v d="$c_on" \
      'BEGIN { printf "| %d | %.0f | %.0f | %.3f | %.2f | %.2f | %.3f |\n", s, a, b, b / a, c, d, c / d }'
  done
  echo
  echo "Rows (stage, elastic, tokens/s, CPU s per rank, wall s):"
  echo
  sed 's/^/    /' "$tmp/rows"
} >"$out"
cat "$out"
