#!/usr/bin/env bash
# The Prometheus endpoint against Debian's real `prometheus` server. Usage:
#   tests/apps/prometheus.sh CASE BUILD_TREE
# scrape:      a 4-rank train-gpt job under tandemrun serves --prometheus-port;
#              a prometheus server started here (loopback, 1 s scrapes) scrapes
#              it; every series is checked through the HTTP query API
#              (/api/v1/query): one per rank, `up` 1 for all four targets, and
#              a scraped (step, loss) pair equal to the JSONL metrics' line;
#              per-operation bytes against the parameter count and steps.
# job:         3 ranks under tandemrun --prometheus-port: prometheus scrapes
#              the one job endpoint and sees every rank's series (rank label),
#              tandem_job_rank_up 1 for each, a (step, loss) pair of rank 1
#              equal to the metrics file; rank 2 stopped (SIGSTOP) for a few
#              seconds: the job endpoint still answers within Prometheus'
#              1 s scrape timeout (up 1) with tandem_job_rank_up{rank="2"} 0;
#              bad tandemrun values refused.
# elastic:     tandemrun --min-np 2 --max-np 3 -np 3 --max-restarts 1
#              --prometheus-port: prometheus scrapes the job endpoint; process
#              1 killed (kill -9) and replaced by process 3 (port P+1+3): the
#              job endpoint follows (process 1's series end, process 3's
#              appear), every process reports epoch 2 at world 3 with its new
#              rank, the survivors one fault, the launcher one SIGKILL
#              failure, 3 initial starts and 1 replacement, 3 running.
# heartbeat:   2 ranks over TCP: each serves its heartbeats' round trip to
#              the other and the beats taken (growing) and missed (0 on
#              loopback), one row per (rank, peer).
# port-in-use: the metrics port already taken: a warning naming the port, and
#              training finishes with exit 0.
# Everything started here is stopped on exit, also on failure; each wait is
# bounded.
set -u
case_name=$1
B=$2
RUN="$B/bin/tandemrun"
GPT="$B/bin/train-gpt"
TINY="--layers 1 --channels 32 --heads 2 --seq 32 --threads 1"
work=$(mktemp -d /tmp/tandem-prom-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
export TANDEM_PROGRESS=plain

fail() {
  echo "FAIL($case_name): $*"
  for f in "$work"/*.log; do [ -e "$f" ] && { echo "--- $f"; tail -20 "$f"; }; done
  exit 1
}

# A base port whose next 10 ports nobody listens on (ss lists the listeners).
# Below the kernel's ephemeral range (ip_local_port_range starts at 32768), so
# an outgoing connection cannot take one of them between this check and the
# bind.
free_base() {
  local base i taken
  for _ in $(seq 50); do
    base=$((20000 + RANDOM % 12000))
    taken=0
    for i in 0 1 2 3 4 5 6 7 8 9; do
      ss -Hatn "sport = :$((base + i))" | grep -q . && taken=1
    done
    [ $taken = 0 ] && { echo $base; return; }
  done
  echo 0
}

# start_prometheus PORT TARGETS: a server on 127.0.0.1:PORT scraping the
# targets (a YAML list's inside) every second as job "tandem"; sets $api.
start_prometheus() {
  cat >"$work/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: tandem
    static_configs:
      - targets: [$2]
EOF
  prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
    --web.listen-address="127.0.0.1:$1" >"$work/prometheus.log" 2>&1 &
  pids+=($!)
  api="http://127.0.0.1:$1"
  for _ in $(seq 60); do curl -sf "$api/-/ready" >/dev/null && break; sleep 0.5; done
  curl -sf "$api/-/ready" >/dev/null || fail "prometheus not ready after 30 s"
}
# query EXPR -> the JSON answer of /api/v1/query
query() { curl -sf --max-time 5 "$api/api/v1/query" --data-urlencode "query=$1"; }
# count of the result vector of EXPR (0 on any error): one "value" pair per
# sample in Prometheus' compact JSON. (grep, not a python3 per call: each
# case makes 40 to 70 of these beside a training job that holds the cores,
# and under load each python3 start took 0.5 to 1.4 s, most of the case.)
count() { query "$1" | grep -o '"value":\[' | wc -l; }
# has_data ANSWER: a successful query whose result is not empty
has_data() { [[ $1 == *'"status":"success"'* && $1 != *'"result":[]'* ]]; }

# dashboard_has_data REGEX N: the shipped Grafana dashboard has at least N
# expressions matching REGEX, and each returns data (a few tries: a scrape
# that timed out on a loaded machine leaves a gap, and a [1m] rate needs
# two scrapes).
dashboard_has_data() {
  python3 -c 'import json,re,sys
for p in json.load(open(sys.argv[1]))["panels"]:
    for t in p["targets"]:
        e = t["expr"].replace("$job", "tandem")
        if re.search(sys.argv[2], e): print(e)' "$(dirname "$0")/../../examples/grafana/tandem.json" "$1" >"$work/exprs"
  [ "$(wc -l <"$work/exprs")" -ge "$2" ] || fail "fewer than $2 dashboard expressions match $1"
  local expr got
  while read -r expr; do
    got=0
    for _ in $(seq 20); do
      has_data "$(query "$expr")" && { got=1; break; }
      sleep 0.5
    done
    [ $got = 1 ] || fail "dashboard expression returned nothing: $expr"
  done <"$work/exprs"
}

case "$case_name" in
job)
  # tandemrun --prometheus-port: one target for the whole job; 3 ranks (odd)
  command -v prometheus >/dev/null || { echo "SKIP: Debian's prometheus is not installed (scripts/install-deps)"; exit 0; }
  base=$(free_base)
  [ "$base" != 0 ] || fail "no free ports"
  start_prometheus $((base + 4)) "'127.0.0.1:$base'"
  "$RUN" -np 3 --prometheus-port "$base" "$GPT" $TINY --steps 1000000 --micro-batch 2 --sample 0 \
    --metrics "$work/m.jsonl" >"$work/train.log" 2>&1 &
  train=$!
  pids+=($train)
  ok=0
  for _ in $(seq 90); do
    kill -0 $train 2>/dev/null || fail "the training job ended early"
    if [ "$(count 'up{job="tandem"} == 1')" = 1 ] && [ "$(count 'tandem_step > 2')" = 3 ]; then ok=1; break; fi
    sleep 1
  done
  [ $ok = 1 ] || { query 'up'; query tandem_step; fail "prometheus did not see 3 ranks past step 2 through the job endpoint within 90 s"; }
  grep -q "tandemrun: the job's metrics on http://127.0.0.1:$base/metrics (rank r serves on port $((base + 1))+r)" \
    "$work/train.log" || fail "tandemrun did not name the job's endpoint"
  for r in 0 1 2; do
    grep -q "rank $r serves metrics on http://127.0.0.1:$((base + 1 + r))/metrics" "$work/train.log" || fail "rank $r's port"
  done
  # every rank's series through the one target, each rank reachable
  [ "$(count "tandem_job_rank_up{instance=\"127.0.0.1:$base\"} == 1")" = 3 ] || { query tandem_job_rank_up; fail "not 3 ranks up"; }
  for s in tandem_loss tandem_tokens_total tandem_world_size tandem_collective_calls_total; do
    [ "$(count "count by (rank) ($s{instance=\"127.0.0.1:$base\"})")" = 3 ] || { query "$s"; fail "series $s: not 3 ranks"; }
  done
  [ "$(count 'tandem_step_phase_seconds{phase="comm_wait"}')" = 3 ] || fail "phases not per rank"
  # rank 1's step and loss from one scrape of the job endpoint against the file
  query '{__name__=~"tandem_step|tandem_loss",rank="1"}' >"$work/pair.json" || fail "query of step and loss"
  # A stopped rank: its endpoint accepts (the kernel) but never answers. The
  # ranks are fetched at once, within Prometheus' announced 1 s scrape
  # timeout, so the job endpoint still answers in time (fetched one after
  # the other with 2 s each, the whole scrape failed: up 0).
  stopped=$(ss -Hltnp "sport = :$((base + 3))" | sed -n 's/.*pid=\([0-9]*\).*/\1/p' | head -1)
  [ -n "$stopped" ] || fail "no process listens on rank 2's port $((base + 3))"
  kill -STOP "$stopped"
  seen=0
  for _ in $(seq 30); do
    if [ "$(count "tandem_job_rank_up{rank=\"2\"} == 0")" = 1 ]; then seen=1; break; fi
    sleep 0.5
  done
  # the scrapes while it was stopped, over the last 5 s
  query 'max_over_time(tandem_job_scrape_seconds[5s])' >"$work/scrape_s.json"
  query 'min_over_time(up{job="tandem"}[5s])' >"$work/up.json"
  kill -CONT "$stopped"
  [ $seen = 1 ] || fail "prometheus never saw rank 2 down while it was stopped"
  python3 - "$work/scrape_s.json" "$work/up.json" <<'EOP' || fail "the job endpoint missed Prometheus' scrape timeout with a stopped rank"
import json, sys
took = float(json.load(open(sys.argv[1]))["data"]["result"][0]["value"][1])
up = float(json.load(open(sys.argv[2]))["data"]["result"][0]["value"][1])
assert up == 1 and 0.5 < took < 1.0, (up, took)
print(f"rank 2 stopped: job endpoint up, slowest scrape {took:.3f} s (bound 0.75 s of the 1 s timeout)")
EOP
  for _ in $(seq 30); do
    [ "$(count 'tandem_job_rank_up == 1')" = 3 ] && break
    sleep 0.5
  done
  [ "$(count 'tandem_job_rank_up == 1')" = 3 ] || fail "rank 2 not back after SIGCONT"
  kill -TERM $train
  for _ in $(seq 20); do kill -0 $train 2>/dev/null || break; sleep 0.5; done
  python3 - "$work/pair.json" "$work/m.jsonl" <<'EOP' || fail "scraped loss differs from the metrics file"
import json, sys
got = {r["metric"]["__name__"]: r["value"] for r in json.load(open(sys.argv[1]))["data"]["result"]}
assert got["tandem_step"][0] == got["tandem_loss"][0], "step and loss from different scrapes"
step, loss = int(float(got["tandem_step"][1])), float(got["tandem_loss"][1])
want = [json.loads(l) for l in open(sys.argv[2]) if l.startswith(f'{{"step":{step},')]
assert want and abs(want[0]["loss"] - loss) <= 5e-9 * abs(loss), (step, loss, want)
print(f"through the job endpoint: rank 1 step {step} loss {loss!r} = metrics file {want[0]['loss']!r}")
EOP
  # bad values are usage errors that say what to do
  "$RUN" -np 2 --prometheus-port 65534 true >"$work/bad.log" 2>&1
  [ $? = 2 ] && grep -q "pass 65535; choose a lower port" "$work/bad.log" || fail "port past the range accepted"
  "$RUN" --min-np 1 --max-np 2 -np 2 --max-restarts 1 --prometheus-port 65533 true >"$work/bad2.log" 2>&1
  [ $? = 2 ] && grep -q "processes (-np + --max-restarts)' ports 65534..65536 pass 65535" "$work/bad2.log" ||
    { cat "$work/bad2.log"; fail "elastic: replacements' ports past the range accepted"; }
  echo "prometheus scraped 3 ranks through tandemrun's one endpoint"
  ;;
elastic)
  command -v prometheus >/dev/null || { echo "SKIP: Debian's prometheus is not installed (scripts/install-deps)"; exit 0; }
  base=$(free_base)
  [ "$base" != 0 ] || fail "no free ports"
  start_prometheus $((base + 9)) "'127.0.0.1:$base'"
  setsid "$RUN" --min-np 2 --max-np 3 -np 3 --max-restarts 1 --prometheus-port "$base" "$GPT" $TINY --steps 1000000 \
    --micro-batch 2 --sample 0 >"$work/train.log" 2>&1 &
  train=$!
  pids+=($train)
  waitq() { # EXPR N WHAT: up to 60 s until EXPR has N results
    for _ in $(seq 120); do [ "$(count "$1")" = "$2" ] && return 0; sleep 0.5; done
    query "$1"; fail "$3"
  }
  waitq 'tandem_step > 2' 3 "prometheus did not see 3 processes past step 2"
  waitq 'tandem_job_processes_running == 3' 1 "no tandem_job_processes_running 3"
  [ "$(count 'tandem_elastic_epoch{rank="1",process="1"} == 1')" = 1 ] || fail "process 1 is not rank 1 in epoch 1"
  victim=$(sed -n 's/.*elastic process 1 (pid \([0-9]*\)).*/\1/p' "$work/train.log")
  [ -n "$victim" ] || fail "no pid of process 1"
  kill -9 "$victim"
  waitq 'tandem_elastic_epoch == 2' 3 "not 3 processes in epoch 2"
  waitq 'tandem_step{process="3"} > 0' 1 "the replacement (process 3) never reported a step"
  grep -q "process 3 serves metrics on http://127.0.0.1:$((base + 4))/metrics" "$work/train.log" ||
    fail "process 3 not on port base + 1 + 3"
  # the job endpoint follows the membership: process 1 is gone from it
  waitq 'tandem_job_rank_up{process="1"}' 0 "process 1 still a target"
  waitq 'tandem_job_rank_up == 1' 3 "not 3 targets up"
  # every process renumbered: ranks 0..2 of world 3, labelled with their launch numbers
  for pr in '0 0' '1 2' '2 3'; do
    set -- $pr
    [ "$(count "tandem_world_size{rank=\"$1\",process=\"$2\"} == 3")" = 1 ] || { query tandem_world_size; fail "rank $1 is not process $2 at world 3"; }
  done
  # the survivors saw one fault, the replacement none (it joined); no disk restore
  [ "$(count 'tandem_elastic_membership_changes_total{cause="fault"} == 1')" = 2 ] || { query tandem_elastic_membership_changes_total; fail "fault counts"; }
  [ "$(count 'tandem_elastic_membership_changes_total{process="3",cause="fault"} == 0')" = 1 ] || fail "process 3's faults"
  [ "$(count 'tandem_elastic_disk_restores_total == 0')" = 3 ] || fail "disk restores"
  # the launcher's series
  [ "$(count 'tandem_job_process_failures_total{kind="SIGKILL"} == 1')" = 1 ] || { query tandem_job_process_failures_total; fail "no SIGKILL failure"; }
  [ "$(count 'tandem_job_process_starts_total{reason="initial"} == 3')" = 1 ] || fail "initial starts"
  [ "$(count 'tandem_job_process_starts_total{reason="replacement"} == 1')" = 1 ] || fail "replacement starts"
  waitq 'tandem_job_processes_running == 3' 1 "not 3 running after the replacement"
  # the rest of the series per process, as without --elastic
  for s in tandem_loss tandem_tokens_total tandem_collective_calls_total tandem_step_phase_seconds; do
    [ "$(count "count by (process) ($s)")" = 3 ] || { query "$s"; fail "series $s: not 3 processes"; }
  done
  # the shipped dashboard's elastic panels return data here
  dashboard_has_data 'elastic|job_process' 4
  kill -TERM $train
  for _ in $(seq 20); do kill -0 $train 2>/dev/null || break; sleep 0.5; done
  echo "prometheus followed the elastic job through a fault and a replacement"
  ;;
scrape)
  command -v prometheus >/dev/null || { echo "SKIP: Debian's prometheus is not installed (scripts/install-deps)"; exit 0; }
  base=$(free_base)
  [ "$base" != 0 ] || fail "no free ports"
  start_prometheus $((base + 4)) "'127.0.0.1:$base', '127.0.0.1:$((base + 1))', '127.0.0.1:$((base + 2))', '127.0.0.1:$((base + 3))'"

  # Long enough to be scraped several times; stopped below once checked.
  "$RUN" -np 4 "$GPT" $TINY --steps 1000000 --micro-batch 2 --sample 0 --metrics "$work/m.jsonl" \
    --prometheus-port "$base" >"$work/train.log" 2>&1 &
  train=$!
  pids+=($train)

  series="tandem_step tandem_loss tandem_learning_rate tandem_grad_norm tandem_loss_scale tandem_tokens_per_second
    tandem_tokens_total tandem_comm_bytes_total tandem_comm_buckets_total tandem_comm_bytes_per_step
    tandem_checkpoints_total tandem_skipped_steps_total tandem_resident_memory_bytes tandem_world_size"
  ok=0
  for _ in $(seq 90); do
    kill -0 $train 2>/dev/null || fail "the training job ended early"
    if [ "$(count 'up{job="tandem"} == 1')" = 4 ] && [ "$(count 'tandem_step > 2')" = 4 ]; then ok=1; break; fi
    sleep 1
  done
  [ $ok = 1 ] || { query 'up'; fail "prometheus did not see 4 ranks past step 2 within 90 s"; }
  for s in $series; do
    n=$(count "$s")
    [ "$n" = 4 ] || fail "series $s: $n ranks, expected 4"
  done
  # 7 phases x 4 ranks, for the last-step gauge and the total counter
  for s in tandem_step_phase_seconds tandem_phase_seconds_total; do
    n=$(count "$s")
    [ "$n" = 28 ] || fail "series $s: $n (rank, phase) pairs, expected 28"
  done
  [ "$(count 'tandem_phase_seconds_total{phase="comm_wait"} > 0')" = 4 ] || fail "no communication wait recorded"
  [ "$(count 'tandem_resident_memory_bytes > 1e6')" = 4 ] || fail "resident memory below 1 MB"
  [ "$(count 'tandem_world_size == 4')" = 4 ] || fail "world size is not 4"
  [ "$(count 'rate(tandem_tokens_total[5s]) > 0')" -ge 1 ] || fail "tokens_total does not grow"
  # The gradient bytes per step: 4 bytes per parameter, all reduced each step.
  params=$(grep -o 'params=[0-9]*' "$work/train.log" | head -1 | cut -d= -f2)
  [ -n "$params" ] || fail "no params= in the start line"
  [ "$(count "tandem_comm_bytes_per_step == $((params * 4))")" = 4 ] ||
    { query tandem_comm_bytes_per_step; fail "comm bytes per step are not 4 x $params"; }
  # Per operation and algorithm (4 ranks on shm: the shm algorithms). The
  # start broadcasts the parameters once; each step allreduces the gradients
  # and the 16-byte (loss, failed) pair, nothing else: allreduce bytes -
  # gradient bytes - 16 x steps (one scrape) is what start-up reduced (the
  # trainer's agreements, a few bytes per rank), the same two scrapes apart.
  for s in tandem_collective_calls_total tandem_collective_bytes_total tandem_collective_seconds_total \
    tandem_collective_bus_bytes_total tandem_collective_bus_bandwidth_bytes_per_second; do
    [ "$(count "$s{operation=\"allreduce\",algorithm=\"shm\"} > 0")" = 4 ] || { query "$s"; fail "series $s: not 4 ranks' shm allreduce"; }
  done
  [ "$(count "tandem_collective_bytes_total{operation=\"broadcast\",algorithm=\"shm\"} == $((params * 4))")" = 4 ] ||
    { query tandem_collective_bytes_total; fail "the start broadcast is not 4 x $params bytes"; }
  startup='sum by (rank) (tandem_collective_bytes_total{operation="allreduce"}) - sum by (rank) (tandem_comm_bytes_total) - 16 * sum by (rank) (tandem_step)'
  query "$startup" >"$work/startup1.json" || fail "query $startup"
  # the second query once every rank was scraped again (not a fixed 2.5 s)
  t1=$(query 'max(timestamp(tandem_step))' | sed -n 's/.*"value":\[[0-9.]*,"\([0-9.]*\)"\].*/\1/p')
  [ -n "$t1" ] || fail "no scrape time of tandem_step"
  for _ in $(seq 40); do [ "$(count "min(timestamp(tandem_step)) > $t1")" = 1 ] && break; sleep 0.25; done
  [ "$(count "min(timestamp(tandem_step)) > $t1")" = 1 ] || fail "no later scrape of all 4 ranks within 10 s"
  query "$startup" >"$work/startup2.json" || fail "query $startup"
  python3 - "$work/startup1.json" "$work/startup2.json" <<'EOF' || fail "allreduce bytes are not gradient bytes + 16 per step"
import json, sys
a, b = ({r["metric"]["rank"]: float(r["value"][1]) for r in json.load(open(p))["data"]["result"]} for p in sys.argv[1:3])
assert len(a) == 4 and a == b and all(0 <= v <= 4096 for v in a.values()), (a, b)
print(f"allreduce bytes = gradient bytes + 16 x steps + {a['0']:.0f} at start-up, two scrapes apart")
EOF
  # bus bytes: 2(n-1)/n = 1.5 times the allreduce bytes at 4 ranks
  [ "$(count 'tandem_collective_bus_bytes_total{operation="allreduce"} - 1.5 * tandem_collective_bytes_total{operation="allreduce"} == 0')" = 4 ] ||
    fail "allreduce bus bytes are not 1.5 x bytes"
  # Every PromQL expression of the shipped Grafana dashboard is accepted by
  # this Prometheus (Grafana itself is not in Debian) and, except for the
  # series that may be absent (offload, checkpoints, fp16 skips, a memory
  # limit), returns data.
  python3 -c 'import json,sys
for p in json.load(open(sys.argv[1]))["panels"]:
    for t in p["targets"]: print(t["expr"].replace("$job", "tandem"))' "$(dirname "$0")/../../examples/grafana/tandem.json" \
    >"$work/exprs" || fail "cannot read the dashboard"
  [ "$(wc -l <"$work/exprs")" -ge 10 ] || fail "too few dashboard expressions"
  # rate() over the dashboard's windows needs two samples: every rank has
  # been scraped twice by now (the wait above); a scrape that timed out on a
  # loaded machine leaves a gap, hence a few tries (instead of a fixed 2 s)
  while read -r expr; do
    answer=$(query "$expr") || fail "dashboard expression rejected: $expr"
    # (elastic, device and TCP heartbeat series: the elastic case, the
    # device tests and the heartbeat case; these 4 ranks share memory)
    case "$expr" in *offload*|*checkpoints*|*skipped*|*memory_limit*|*memory_share*|*elastic*|*job_process*|*device_memory*|*heartbeat*) continue ;; esac
    got=0
    for _ in $(seq 20); do
      has_data "$answer" && { got=1; break; }
      sleep 0.25
      answer=$(query "$expr") || fail "dashboard expression rejected: $expr"
    done
    [ $got = 1 ] || fail "dashboard expression returned nothing: $expr"
  done <"$work/exprs"
  # rank 0's step and loss from one scrape (same timestamp) against the file
  query '{__name__=~"tandem_step|tandem_loss",rank="0"}' >"$work/pair.json" || fail "query of step and loss"
  kill -TERM $train
  for _ in $(seq 20); do kill -0 $train 2>/dev/null || break; sleep 0.5; done
  python3 - "$work/pair.json" "$work/m.jsonl" <<'EOF' || fail "scraped loss differs from the metrics file"
import json, sys
res = json.load(open(sys.argv[1]))["data"]["result"]
got = {r["metric"]["__name__"]: r["value"] for r in res}
assert got["tandem_step"][0] == got["tandem_loss"][0], "step and loss from different scrapes"
step, loss = int(float(got["tandem_step"][1])), float(got["tandem_loss"][1])
lines = [json.loads(l) for l in open(sys.argv[2]) if l.startswith('{"step"')]
want = [l for l in lines if l["step"] == step]
assert want, f"step {step} not in the metrics file ({len(lines)} lines)"
# the file prints %.9g of the same double: equal to 9 significant digits
assert abs(want[0]["loss"] - loss) <= 5e-9 * abs(loss), (step, loss, want[0]["loss"])
print(f"scraped step {step} loss {loss!r} = metrics file {want[0]['loss']!r}")
EOF
  echo "prometheus scraped all series of 4 ranks"
  ;;

port-in-use)
  # The holder takes base+1 itself, trying other bases until a bind succeeds
  # and base is free too, so another program on the machine taking a port
  # between a check and the bind cannot fail the test.
  python3 -c 'import random,socket,time
for _ in range(200):
    base = random.randrange(20000, 32000)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", base + 1))
        t = socket.socket(); t.bind(("127.0.0.1", base)); t.close()
    except OSError:
        s.close(); continue
    s.listen(1); print("ready", base, flush=True); time.sleep(120)
    break' >"$work/holder.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 40); do grep -q ready "$work/holder.log" && break; sleep 0.25; done
  base=$(awk '/^ready/ {print $2}' "$work/holder.log")
  [ -n "$base" ] || fail "the holder found no free pair of ports"
  "$RUN" -np 2 "$GPT" $TINY --steps 3 --micro-batch 2 --sample 0 --prometheus-port "$base" >"$work/train.log" 2>&1 ||
    fail "training failed when the metrics port was in use"
  grep -q "rank 1: no metrics endpoint, training goes on: .*127.0.0.1:$((base + 1)).*in use" "$work/train.log" ||
    fail "no warning naming the port in use"
  grep -q "rank 0 serves metrics on http://127.0.0.1:$base/metrics" "$work/train.log" || fail "rank 0 did not serve"
  grep -q 'final_loss=' "$work/train.log" || fail "no summary line"
  # a bad value is a usage error (exit 2) that names the flag
  "$GPT" $TINY --steps 1 --prometheus-port 70000 >"$work/bad.log" 2>&1
  [ $? = 2 ] && grep -q -- '--prometheus-port must be between 0 and 65535' "$work/bad.log" || fail "bad port accepted"
  TANDEM_PROMETHEUS_PORT=x "$GPT" $TINY --steps 1 >"$work/bad2.log" 2>&1
  [ $? = 2 ] && grep -q 'TANDEM_PROMETHEUS_PORT expects an integer' "$work/bad2.log" || fail "bad env value accepted"
  "$GPT" $TINY --steps 1 --prometheus-port 0 --prometheus-bind localhost >"$work/bad3.log" 2>&1
  [ $? = 2 ] && grep -q "bind address 'localhost' is not an IPv4 address" "$work/bad3.log" || fail "bad address accepted"
  echo "port in use reported, training finished"
  ;;
heartbeat)
  # 2 ranks over TCP: each rank's heartbeat series for its one peer
  command -v prometheus >/dev/null || { echo "SKIP: Debian's prometheus is not installed (scripts/install-deps)"; exit 0; }
  base=$(free_base)
  [ "$base" != 0 ] || fail "no free ports"
  start_prometheus $((base + 4)) "'127.0.0.1:$base', '127.0.0.1:$((base + 1))'"
  TANDEM_TRANSPORT=tcp TANDEM_HEARTBEAT_INTERVAL=0.1 "$RUN" -np 2 "$GPT" $TINY --steps 1000000 --micro-batch 2 \
    --sample 0 --prometheus-port "$base" >"$work/train.log" 2>&1 &
  train=$!
  pids+=($train)
  ok=0
  for _ in $(seq 90); do
    kill -0 $train 2>/dev/null || fail "the training job ended early"
    [ "$(count 'tandem_heartbeats_received_total > 20')" = 2 ] && { ok=1; break; }
    sleep 1
  done
  [ $ok = 1 ] || { query '{__name__=~"tandem_heartbeat.*"}'; fail "no 2 ranks with 20 heartbeats within 90 s"; }
  # each rank watches the other, the round trip measured (loopback: under a
  # second even on a loaded machine), nothing missed on loopback
  [ "$(count 'tandem_heartbeats_received_total{rank="0",peer="1"}')" = 1 ] &&
    [ "$(count 'tandem_heartbeats_received_total{rank="1",peer="0"}')" = 1 ] ||
    { query tandem_heartbeats_received_total; fail "not one peer row per rank"; }
  [ "$(count '(tandem_heartbeat_rtt_seconds > 0) < 1')" = 2 ] || { query tandem_heartbeat_rtt_seconds; fail "round trips"; }
  [ "$(count 'tandem_heartbeats_missed_total == 0')" = 2 ] || { query tandem_heartbeats_missed_total; fail "missed beats on loopback"; }
  for _ in $(seq 20); do # two scrapes of each rank at least
    [ "$(count 'rate(tandem_heartbeats_received_total[5s]) > 0')" = 2 ] && break
    sleep 0.5
  done
  [ "$(count 'rate(tandem_heartbeats_received_total[5s]) > 0')" = 2 ] || fail "heartbeat counts do not grow"
  # the shipped dashboard's heartbeat panel returns data here
  dashboard_has_data 'heartbeat' 2
  kill -TERM $train
  echo "prometheus scraped both ranks' heartbeat round trips and counts"
  ;;
*)
  echo "unknown case $case_name"
  exit 2
  ;;
esac
