#!/usr/bin/env bash
# What serving Prometheus metrics costs training (issue 22 item 2; target
# <= 1% tokens/s): a 2-rank train-gpt job without the endpoint ('off'), with
# --prometheus-port scraped by Debian's prometheus every second ('on': each
# rank a target), and with tandemrun --prometheus-port ('job': one target,
# tandemrun fetching both ranks at each scrape), interleaved round by round so
# that other users' load hits all alike. Reports each
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
    static_configs: [{targets: ['127.0.0.1:$base', '127.0.0.1:$((base + 1))', '127.0.0.1:$((base + 2))']}]
EOC
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
  --web.listen-address="127.0.0.1:$((base + 5))" >"$work/prometheus.log" 2>&1 &
prom=$!
MODEL="--layers 4 --channels 128 --heads 4 --seq 64 --micro-batch 4 --sample 0 --steps $steps"
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
for round in $(seq 1 "$rounds"); do
  for mode in off on job; do
    extra="" run_extra=""
    [ $mode = on ] && extra="--prometheus-port $base"
    [ $mode = job ] && run_extra="--prometheus-port $((base + 2))" # ranks on base+3, base+4
    out=$(TANDEM_PROGRESS=off timeout 600 "$B/bin/tandemrun" -np 2 $run_extra "$B/bin/train-gpt" $MODEL $extra 2>&1)
    tps=$(echo "$out" | grep -o 'tokens_per_s=[0-9.]*' | head -1 | cut -d= -f2)
    cpu=$(echo "$out" | grep -o 'cpu_ms_per_step=[0-9.]*' | head -1 | cut -d= -f2)
    echo "$round $mode ${tps:-nan} ${cpu:-nan}" | tee -a "$work/raw"
  done
done
scrapes=$(curl -sf "http://127.0.0.1:$((base + 5))/api/v1/query" --data-urlencode 'query=sum_over_time(up{job="tandem"}[1h])' |
  python3 -c 'import json,sys; print(sum(int(float(r["value"][1])) for r in json.load(sys.stdin)["data"]["result"]))' 2>/dev/null)
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
mkdir -p bench/results
res="bench/results/prometheus-$(date -u +%F).md"
n=2
while [ -e "$res" ]; do res="bench/results/prometheus-$(date -u +%F)-run$n.md"; n=$((n + 1)); done # keep earlier results
python3 - "$work/raw" "$rounds" "$steps" "$load_start" "$load_end" "${scrapes:-?}" "$MODEL" >"$res" <<'EOP'
import statistics as st, sys
raw, rounds, steps, l0, l1, scrapes, model = sys.argv[1:8]
rows = [l.split() for l in open(raw)]
by = {}
for r, mode, tps, cpu in rows:
    by.setdefault(r, {})[mode] = (float(tps), float(cpu))
print("# Prometheus endpoint: training cost (bench/prometheus_cost.sh)\n")
print(f"2 ranks under tandemrun, train-gpt {model}; 'on' = --prometheus-port with Debian's prometheus scraping "
      f"both ranks every 1 s; 'job' = tandemrun --prometheus-port, prometheus scraping its one endpoint every 1 s "
      f"({scrapes} successful scrapes over the run). Rounds interleaved. Load average at start {l0}, at end {l1} "
      f"(shared 2-core machine).\n")
print("| round | tokens/s off | on | job | on/off | job/off | cpu ms/step off | on | job |")
print("|---|---|---|---|---|---|---|---|---|")
ratios = {"on": [], "job": []}
cratios = {"on": [], "job": []}
for r in sorted(by, key=int):
    if all(m in by[r] for m in ("off", "on", "job")):
        (t0, c0), (t1, c1), (t2, c2) = by[r]["off"], by[r]["on"], by[r]["job"]
        for m, t, c in (("on", t1, c1), ("job", t2, c2)):
            ratios[m].append(t / t0)
            cratios[m].append(c / c0)
        print(f"| {r} | {t0:.0f} | {t1:.0f} | {t2:.0f} | {t1 / t0:.3f} | {t2 / t0:.3f} | {c0:.1f} | {c1:.1f} | {c2:.1f} |")
for m in ("on", "job"):
    print(f"\n{m}: median tokens/s {st.median(by[r][m][0] for r in by):.0f} against off "
          f"{st.median(by[r]['off'][0] for r in by):.0f}; median per-round ratio {st.median(ratios[m]):.4f} "
          f"(cost {100 * (1 - st.median(ratios[m])):.2f}%); median CPU-per-step ratio {st.median(cratios[m]):.4f}")
EOP
cat "$res"
