#!/usr/bin/env bash
# What serving Prometheus metrics costs training (issue 22 item 2; target
# <= 1% tokens/s): a 2-rank train-gpt job without the endpoint and with
# --prometheus-port scraped by Debian's prometheus every second, interleaved
# round by round so that other users' load hits both alike. Reports each
# round's tokens/s (the summary line's, after the first two steps) and
# cpu_ms_per_step (rank 0's process CPU time per step, which other jobs'
# load stretches less), the medians, and the median of the per-round ratios.
# Writes bench/results/prometheus-<date>.md.
#
#   bench/prometheus_cost.sh [--rounds N] [--steps N]
set -u
cd "$(dirname "$0")/.."
rounds=5
steps=60
while [ $# -gt 0 ]; do
  case "$1" in
  --rounds) rounds=$2; shift 2 ;;
  --steps) steps=$2; shift 2 ;;
  *) echo "usage: bench/prometheus_cost.sh [--rounds N] [--steps N]" >&2; exit 2 ;;
  esac
done
B=${BUILD:-build}
command -v prometheus >/dev/null || { echo "prometheus_cost.sh: Debian's prometheus is not installed" >&2; exit 1; }
make -j2 "$B/bin/tandemrun" "$B/bin/train-gpt" >/dev/null || { echo "prometheus_cost.sh: build failed" >&2; exit 1; }
work=$(mktemp -d /tmp/tandem-prom-bench-XXXXXX)
prom=""
trap '[ -n "$prom" ] && kill $prom 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
base=$((30000 + RANDOM % 20000))
cat >"$work/prometheus.yml" <<EOC
global: {scrape_interval: 1s, scrape_timeout: 1s}
scrape_configs:
  - job_name: tandem
    static_configs: [{targets: ['127.0.0.1:$base', '127.0.0.1:$((base + 1))']}]
EOC
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
  --web.listen-address="127.0.0.1:$((base + 2))" >"$work/prometheus.log" 2>&1 &
prom=$!
MODEL="--layers 4 --channels 128 --heads 4 --seq 64 --micro-batch 4 --sample 0 --steps $steps"
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
for round in $(seq 1 "$rounds"); do
  for mode in off on; do
    extra=""
    [ $mode = on ] && extra="--prometheus-port $base"
    out=$(TANDEM_PROGRESS=off timeout 600 "$B/bin/tandemrun" -np 2 "$B/bin/train-gpt" $MODEL $extra 2>&1)
    tps=$(echo "$out" | grep -o 'tokens_per_s=[0-9.]*' | head -1 | cut -d= -f2)
    cpu=$(echo "$out" | grep -o 'cpu_ms_per_step=[0-9.]*' | head -1 | cut -d= -f2)
    echo "$round $mode ${tps:-nan} ${cpu:-nan}" | tee -a "$work/raw"
  done
done
scrapes=$(curl -sf "http://127.0.0.1:$((base + 2))/api/v1/query" --data-urlencode 'query=sum_over_time(up{job="tandem"}[1h])' |
  python3 -c 'import json,sys; print(sum(int(float(r["value"][1])) for r in json.load(sys.stdin)["data"]["result"]))' 2>/dev/null)
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
mkdir -p bench/results
res="bench/results/prometheus-$(date -u +%F).md"
python3 - "$work/raw" "$rounds" "$steps" "$load_start" "$load_end" "${scrapes:-?}" "$MODEL" >"$res" <<'EOP'
import statistics as st, sys
raw, rounds, steps, l0, l1, scrapes, model = sys.argv[1:8]
rows = [l.split() for l in open(raw)]
by = {}
for r, mode, tps, cpu in rows:
    by.setdefault(r, {})[mode] = (float(tps), float(cpu))
print("# Prometheus endpoint: training cost (bench/prometheus_cost.sh)\n")
print(f"2 ranks under tandemrun, train-gpt {model}; 'on' = --prometheus-port with Debian's prometheus scraping "
      f"both ranks every 1 s ({scrapes} successful scrapes over the run). Rounds interleaved. Load average at start "
      f"{l0}, at end {l1} (shared 2-core machine).\n")
print("| round | tokens/s off | tokens/s on | on/off | cpu ms/step off | cpu ms/step on |")
print("|---|---|---|---|---|---|")
ratios, cratios = [], []
for r in sorted(by, key=int):
    if "off" in by[r] and "on" in by[r]:
        (t0, c0), (t1, c1) = by[r]["off"], by[r]["on"]
        ratios.append(t1 / t0)
        cratios.append(c1 / c0)
        print(f"| {r} | {t0:.0f} | {t1:.0f} | {t1 / t0:.3f} | {c0:.1f} | {c1:.1f} |")
offs = [by[r]["off"][0] for r in by]
ons = [by[r]["on"][0] for r in by]
print(f"\nmedian tokens/s: off {st.median(offs):.0f}, on {st.median(ons):.0f}; "
      f"median per-round ratio on/off {st.median(ratios):.4f} (cost {100 * (1 - st.median(ratios)):.2f}%); "
      f"median CPU-per-step ratio {st.median(cratios):.4f}")
EOP
cat "$res"
