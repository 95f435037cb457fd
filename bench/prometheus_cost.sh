#!/usr/bin/env bash
# What serving Prometheus metrics costs training (issue 22 item 2; target
# <= 1% tokens/s): a 2-rank train-gpt job without the endpoint ('off'), with
# --prometheus-port scraped by Debian's prometheus every second ('on': each
# rank a target), and with tandemrun --prometheus-port ('job': one target,
# tandemrun fetching both ranks at each scrape), interleaved round by round so
# that other users' load hits all alike. Reports each
# round's tokens/s (the summary line's, after the first two steps),
# cpu_ms_per_step (rank 0's process CPU time per step after the first two)
# and the whole job's CPU time per step from getrusage (GNU time's wait4
# rusage of tandemrun and every rank: the ranks' server threads and, in
# 'job' mode, tandemrun's fetching and merging included; start-up is the
# same in every mode), the medians, and the median of the per-round ratios.
# And the endpoint's own CPU time, measured where it is spent: each rank
# prints at the end the CPU its server thread used (getrusage
# RUSAGE_THREAD) and what updating the series cost the training thread
# (CLOCK_THREAD_CPUTIME_ID around it), tandemrun what its job endpoint's
# thread used; set against rank 0's CPU per step that is the cost as a
# fraction, free of the noise other jobs add to a difference of two runs.
# CPU time is what other jobs' load on a shared machine stretches least:
# wall-clock tokens/s swings +-15% there. --interval S scrapes more often
# than once a second to make the cost per scrape stand out of the noise.
# Writes bench/results/prometheus-<date>.md.
#
#   bench/prometheus_cost.sh [--rounds N] [--steps N] [--interval SECONDS]
set -u
cd "$(dirname "$0")/.."
rounds=5
steps=60
interval=1
while [ $# -gt 0 ]; do
  case "$1" in
  --rounds) rounds=$2; shift 2 ;;
  --steps) steps=$2; shift 2 ;;
  --interval) interval=$2; shift 2 ;;
  *) echo "usage: bench/prometheus_cost.sh [--rounds N] [--steps N] [--interval SECONDS]" >&2; exit 2 ;;
  esac
done
[ -x /usr/bin/time ] || { echo "prometheus_cost.sh: GNU time (/usr/bin/time) is needed for the job's rusage" >&2; exit 1; }
B=${BUILD:-build}
command -v prometheus >/dev/null || { echo "prometheus_cost.sh: Debian's prometheus is not installed" >&2; exit 1; }
make -j2 "$B/bin/tandemrun" "$B/bin/train-gpt" >/dev/null || { echo "prometheus_cost.sh: build failed" >&2; exit 1; }
work=$(mktemp -d /tmp/tandem-prom-bench-XXXXXX)
prom=""
trap '[ -n "$prom" ] && kill $prom 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
base=$((30000 + RANDOM % 20000))
cat >"$work/prometheus.yml" <<EOC
global: {scrape_interval: ${interval}s, scrape_timeout: ${interval}s}
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
    out=$(TANDEM_PROGRESS=off timeout 600 /usr/bin/time -f 'rusage %e %U %S' "$B/bin/tandemrun" -np 2 $run_extra \
      "$B/bin/train-gpt" $MODEL $extra 2>&1)
    tps=$(echo "$out" | grep -o 'tokens_per_s=[0-9.]*' | head -1 | cut -d= -f2)
    cpu=$(echo "$out" | grep -o 'cpu_ms_per_step=[0-9.]*' | head -1 | cut -d= -f2)
    # the whole job: (user + system) CPU ms per step, and its wall seconds
    job_cpu=$(echo "$out" | awk -v n="$steps" '/^rusage / { printf "%.3f", ($3 + $4) * 1000 / n }')
    wall=$(echo "$out" | awk '/^rusage / { print $2 }')
    # rank 0's endpoint: scrapes, CPU ms serving them, CPU ms updating the series; tandemrun's job endpoint: scrapes, ms
    ep=$(echo "$out" | sed -n "s/.*rank 0's metrics endpoint: \([0-9]*\) scrapes, \([0-9.]*\) ms CPU serving them, \([0-9.]*\) ms CPU updating.*/\1 \2 \3/p" | head -1)
    jep=$(echo "$out" | sed -n "s/.*the job's metrics endpoint: \([0-9]*\) scrapes, \([0-9.]*\) ms CPU.*/\1 \2/p" | head -1)
    echo "$round $mode ${tps:-nan} ${cpu:-nan} ${job_cpu:-nan} ${wall:-nan} ${ep:-0 0 0} ${jep:-0 0}" | tee -a "$work/raw"
  done
done
scrapes=$(curl -sf "http://127.0.0.1:$((base + 5))/api/v1/query" --data-urlencode 'query=sum_over_time(up{job="tandem"}[1h])' |
  python3 -c 'import json,sys; print(sum(int(float(r["value"][1])) for r in json.load(sys.stdin)["data"]["result"]))' 2>/dev/null)
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
mkdir -p bench/results
res="bench/results/prometheus-$(date -u +%F).md"
n=2
while [ -e "$res" ]; do res="bench/results/prometheus-$(date -u +%F)-run$n.md"; n=$((n + 1)); done # keep earlier results
python3 - "$work/raw" "$rounds" "$steps" "$load_start" "$load_end" "${scrapes:-?}" "$MODEL" "$interval" >"$res" <<'EOP'
import statistics as st, sys
raw, rounds, steps, l0, l1, scrapes, model, interval = sys.argv[1:9]
rows = [l.split() for l in open(raw)]
by, job, ep = {}, {}, {}
for r, mode, tps, cpu, job_cpu, wall, scrapes0, serve0, update0, jscrapes, jserve in rows:
    by.setdefault(r, {})[mode] = (float(tps), float(cpu))
    job.setdefault(r, {})[mode] = (float(job_cpu), float(wall))
    ep.setdefault(mode, []).append((int(scrapes0), float(serve0), float(update0), int(jscrapes), float(jserve),
                                    float(cpu)))
print("# Prometheus endpoint: training cost (bench/prometheus_cost.sh)\n")
print(f"2 ranks under tandemrun, train-gpt {model}; 'on' = --prometheus-port with Debian's prometheus scraping "
      f"both ranks every {interval} s; 'job' = tandemrun --prometheus-port, prometheus scraping its one endpoint "
      f"every {interval} s "
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
print("\nThe whole job's CPU time per step (getrusage of tandemrun and both ranks, start-up included):\n")
print("| round | job cpu ms/step off | on | job | on/off | job/off | wall s off | on | job |")
print("|---|---|---|---|---|---|---|---|---|")
jratios = {"on": [], "job": []}
per_scrape = {"on": [], "job": []}
for r in sorted(job, key=int):
    if all(m in job[r] for m in ("off", "on", "job")):
        (c0, w0), (c1, w1), (c2, w2) = job[r]["off"], job[r]["on"], job[r]["job"]
        for m, c, w, targets in (("on", c1, w1, 2), ("job", c2, w2, 1)):
            jratios[m].append(c / c0)
            # extra CPU of the run over the scrapes it got (wall / interval per target)
            per_scrape[m].append((c - c0) * int(steps) / (w / float(interval) * targets))
        print(f"| {r} | {c0:.2f} | {c1:.2f} | {c2:.2f} | {c1 / c0:.4f} | {c2 / c0:.4f} | {w0:.1f} | {w1:.1f} | {w2:.1f} |")
print("\nThe endpoint's own CPU time, measured where it is spent: rank 0's training thread updating the series "
      "after each step (CLOCK_THREAD_CPUTIME_ID), its server thread per scrape (getrusage RUSAGE_THREAD), "
      "tandemrun's job endpoint thread per scrape (fetching both ranks and merging). The update is paid every step, "
      "a scrape once per interval whatever the step rate: at one scrape per second, its share of a rank that keeps "
      "one core busy is (ms per scrape) / 1000.\n")
print("| mode | update ms/step | share of rank 0's CPU per step | rank 0 ms/scrape (scrapes) | tandemrun ms/scrape (scrapes) |")
print("|---|---|---|---|---|")
for m in ("on", "job"):
    if m in ep:
        upd = st.median(x[2] / int(steps) for x in ep[m])
        share = st.median(x[2] / int(steps) / x[5] for x in ep[m] if x[5] > 0)
        per = [x[1] / x[0] for x in ep[m] if x[0] > 0]
        jper = [x[4] / x[3] for x in ep[m] if x[3] > 0]
        n0, nj = sum(x[0] for x in ep[m]), sum(x[3] for x in ep[m])
        print(f"| {m} | {upd:.4f} | {100 * share:.3f}% | {st.median(per) if per else 0:.4f} ({n0}) | "
              f"{st.median(jper) if jper else 0:.4f} ({nj}) |")
for m in ("on", "job"):
    if jratios[m]:
        print(f"\n{m}: the job's CPU per step, median per-round ratio {st.median(jratios[m]):.4f} "
              f"(cost {100 * (st.median(jratios[m]) - 1):+.2f}%); extra CPU per scrape, median "
              f"{st.median(per_scrape[m]):.2f} ms")
for m in ("on", "job"):
    print(f"\n{m}: median tokens/s {st.median(by[r][m][0] for r in by):.0f} against off "
          f"{st.median(by[r]['off'][0] for r in by):.0f}; median per-round ratio {st.median(ratios[m]):.4f} "
          f"(cost {100 * (1 - st.median(ratios[m])):.2f}%); median CPU-per-step ratio {st.median(cratios[m]):.4f}")
EOP
cat "$res"
