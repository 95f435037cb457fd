#!/bin/bash
# Memory at the edge (issue 23), on real train-gpt processes (2 ranks):
#   bound  ARGS...  every rank's peak RSS (VmHWM, the kernel's figure) is at
#                   most the trainer's estimate and at least 0.9x it (CONFIG:
#                   a JSON config given with --config as well; NP: ranks, 2
#                   unless set; GPT_MODEL=small: the 4 x 256 reference
#                   GPT instead of the 6 x 512 one below)
#   refuse          a job ~20% too large for TANDEM_MEMORY_LIMIT is refused on
#                   every rank within 5 s, with the estimate, the memory and
#                   what would fit; the stage-3-with-offload suggestion, with
#                   the stage3_max_live_parameters it names, trains at that
#                   limit; 20% below the limit it trains
#   cgroup          the same limit set by a memory cgroup (v1 or v2) the test
#                   creates as root (skipped, saying why, where it cannot)
#   gather          stage 3: the sample's whole-arena gather that would not fit
#                   is refused on every rank and the run ends normally
#   watch           a rank whose RSS passes 90% of its limit says so in the log
#                   and in the metrics
#   defaults        stage 3 with both offloads and the cache knobs unset, at a
#                   limit ~36% below what DeepSpeed's defaults need: the knobs
#                   are lowered (the log says which), it trains, every rank's
#                   peak RSS is within [0.9, 1.0] x its estimate and the
#                   estimate within the limit; the same job with those knobs
#                   set is refused
#   shrink          elastic training at stage 3 on 2 ranks, each its own
#                   "host" (an IPC namespace of its own, TANDEM_LOCAL_SIZE=1:
#                   a host's memory limit is then one rank's), rank 1 killed:
#                   at a limit that still holds the survivor's grown shards
#                   the estimate is redone for the world of 1 (the epoch's
#                   memory line) and the peak stays within [0.9, 1.0] x it;
#                   at one that does not, the survivor refuses the new world
#                   before allocating it, saying what to do, and is not
#                   killed (skipped where unshare -i is not allowed)
#   prefetch        a block larger than DeepSpeed's stage3_prefetch_bucket_size
#                   (2560 channels: 78.7M > 5e7): unset, it becomes one block
#                   (the fit line); set, or bounded by offload_param buffers the
#                   user set, it is kept (nothing is allocated: --estimate-memory)
# usage: memory_edge.sh MODE BUILD_DIR [ARGS...]
set -u
mode=$1 B=$2
shift 2
GPT="$B/bin/train-gpt"
RUN="$B/bin/tandemrun"
tmp=$(mktemp -d /tmp/td-memedge-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
# a GPT of ~19M parameters (arenas of 73 MiB): a few hundred MB per rank; GPT_MODEL=small: the reference GPT of
# bench/ (4 x 256, 1.7M parameters), ranks of 40-110 MiB
MODEL="--layers 6 --channels 512 --heads 8 --seq 128 --micro-batch 4 --steps 2 --sample 0"
[ "${GPT_MODEL:-}" = small ] && MODEL="--layers 4 --channels 256 --heads 4 --seq 128 --micro-batch 4 --steps 2 --sample 0"

# the estimate of a configuration per rank in MiB (train-gpt --estimate-memory's total for its stage)
estimate() {
  local stage=$1
  shift
  timeout 60 "$RUN" -np 2 "$GPT" "$@" --estimate-memory 2>&1 | grep "stage=$stage " | head -1 |
    sed 's/.*total=\([0-9.]*\).*/\1/'
}

case "$mode" in
bound)
  set -- "${@//@TMP@/$tmp}" # offload files in the test's directory
  if [ -n "${CONFIG:-}" ]; then
    echo "${CONFIG//@TMP@/$tmp}" >"$tmp/c.json"
    set -- "$@" --config "$tmp/c.json"
  fi
  np=${NP:-2}
  # the run ends 15 s before the line's own timeout (tests/run.sh's TD_LINE_TIMEOUT), so a slow or stuck run
  # leaves its output in the log instead of an empty one
  run_s=$((${TD_LINE_TIMEOUT:-255} - 15))
  out=$(timeout "$run_s" "$RUN" -np "$np" "$GPT" $MODEL "$@" 2>&1) ||
    { echo "$out" | tail -20; fail "the run failed or took over $run_s s"; }
  lines=$(echo "$out" | grep "memory rank=")
  [ "$(echo "$lines" | grep -c .)" = "$np" ] || { echo "$out" | tail; fail "expected a memory line per rank"; }
  echo "$lines"
  # BOUND_LOW: the tightness side (a suite line that lowers it says why); the safety side stays 1.0
  low=${BOUND_LOW:-0.9}
  echo "$lines" | awk -v low="$low" '{
      for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
      r = v["peak_rss_mib"] / v["estimate_mib"];
      printf "rank %s: peak %.1f MiB / estimate %.1f MiB = %.3f\n", v["rank"], v["peak_rss_mib"], v["estimate_mib"], r;
      if (r > 1.0 || r < low) bad = 1
    } END { exit bad }' || fail "peak RSS outside [$low, 1.0] x estimate"
  ;;
refuse | cgroup)
  args="--zero-stage 1"
  per_rank=$(estimate 1 $MODEL $args)
  [ -n "$per_rank" ] || fail "no estimate"
  # the job's memory on this host: 2 ranks x (estimate + ~8 MiB of process) is ~20% too large for `small`
  job=$(awk -v e="$per_rank" 'BEGIN { printf "%d", 2 * (e + 8) * 1048576 }')
  small=$(awk -v j="$job" 'BEGIN { printf "%d", j / 1.2 }')
  big=$(awk -v j="$job" 'BEGIN { printf "%d", j * 1.2 }')
  echo "estimate $per_rank MiB per rank; job ~$((job >> 20)) MiB; limits $((small >> 20)) and $((big >> 20)) MiB"
  if [ "$mode" = refuse ]; then
    launch() { env TANDEM_MEMORY_LIMIT=$1 timeout 120 "$RUN" -np 2 "$GPT" $MODEL $args; }
    source_word="TANDEM_MEMORY_LIMIT"
  else
    # a child of this process's memory cgroup, v2 or v1
    cg=""
    if [ -w /sys/fs/cgroup/cgroup.subtree_control ] && grep -q '^0::' /proc/self/cgroup; then
      base=/sys/fs/cgroup$(sed -n 's/^0:://p' /proc/self/cgroup)
      [ -e "$base/memory.max" ] || base=""
      limit_file=memory.max
    else
      rel=$(sed -n 's/^[0-9]*:memory://p' /proc/self/cgroup)
      base=/sys/fs/cgroup/memory${rel%/}
      limit_file=memory.limit_in_bytes
    fi
    if [ -n "$base" ] && mkdir "$base/td-memedge-$$" 2>/dev/null; then cg="$base/td-memedge-$$"; fi
    if [ -z "$cg" ] || ! echo "$small" >"$cg/$limit_file" 2>/dev/null; then
      [ -n "$cg" ] && rmdir "$cg"
      echo "SKIPPED: cannot create a memory cgroup here (needs root and a writable cgroup hierarchy); the refuse test covers TANDEM_MEMORY_LIMIT"
      exit 0
    fi
    trap 'rmdir "$cg" 2>/dev/null; rm -rf "$tmp"' EXIT
    # the shell moves itself into the cgroup before starting the job: every rank inherits it
    launch() {
      echo "$1" >"$cg/$limit_file" || return 99
      sh -c "echo \$\$ > $cg/cgroup.procs && exec timeout 120 $RUN -np 2 $GPT $MODEL $args"
    }
    source_word="cgroup"
  fi
  t0=$(date +%s.%N)
  out=$(launch "$small" 2>&1)
  rc=$?
  t1=$(date +%s.%N)
  echo "$out" | grep -i "needs about" | head -2
  [ $rc != 0 ] || fail "a job 20% too large was not refused"
  for r in 0 1; do
    echo "$out" | grep "^\[$r\]" | grep -q "needs about .* MiB per rank" || fail "rank $r did not say it was refused"
  done
  echo "$out" | grep "needs about" | grep -q "available to it ($source_word" || fail "the message does not name $source_word"
  echo "$out" | grep "needs about" | grep -q "It would fit with.*\(stage\|ranks\|micro-batch\|checkpointing\)" ||
    fail "the message does not say what would fit"
  echo "$out" | grep -q "step 1\|final_loss" && fail "a refused job trained"
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "refused in %.2f s\n", b - a; exit !(b - a < 5) }' || fail "refused too late"
  if [ "$mode" = refuse ]; then
    # the suggestion of stage 3 with both offloads names the cache it was checked at: with it that job trains at
    # the same limit, each rank's peak RSS within its share
    live=$(echo "$out" | grep "^\[0\]" | grep -o "nvme:DIR) and stage3_max_live_parameters [0-9]*" | head -1 | awk '{ print $NF }')
    [ -n "$live" ] || fail "the message does not suggest stage 3 with offload and its stage3_max_live_parameters"
    echo "{\"zero_optimization\": {\"stage3_max_live_parameters\": $live}}" >"$tmp/s.json"
    s3=$(env TANDEM_MEMORY_LIMIT=$small timeout 120 "$RUN" -np 2 "$GPT" $MODEL --zero-stage 3 --offload-optimizer "nvme:$tmp" \
      --offload-param "nvme:$tmp" --config "$tmp/s.json" 2>&1) ||
      { echo "$s3" | grep -v "offload step" | tail; fail "the suggested stage 3 with offload (stage3_max_live_parameters $live) did not train"; }
    echo "$s3" | grep "memory rank=" | awk -v lim="$((small >> 20))" '{
        for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
        printf "suggested stage 3 with offload, rank %s: peak %.1f MiB (estimate %.1f, share of the limit %.0f)\n",
               v["rank"], v["peak_rss_mib"], v["estimate_mib"], lim / 2;
        n++; if (v["peak_rss_mib"] > lim / 2) bad = 1
      } END { exit bad || n != 2 }' || fail "the suggested configuration went past the limit"
  fi
  out=$(launch "$big" 2>&1) || { echo "$out" | tail; fail "a job 20% under the limit was refused"; }
  echo "$out" | grep "memory rank=0"
  echo "$out" | grep "memory rank=0" | grep -q "limit=\"$source_word" || fail "the limit that bound is not $source_word"
  ;;
gather)
  # a small cache of fetched groups: the steps hold a fraction of the arena, the gather all of it
  echo '{"zero_optimization": {"stage": 3, "stage3_max_live_parameters": 100000}}' >"$tmp/c.json"
  args="--zero-stage 3 --config $tmp/c.json"
  per_rank=$(estimate 3 $MODEL $args)
  gather=$(timeout 60 "$RUN" -np 2 "$GPT" $MODEL $args --estimate-memory 2>&1 | grep "stage=3 " | head -1 |
    sed 's/.*gather=\([0-9.]*\).*/\1/')
  # room for the steps (estimate + the process's ~8 MiB + 2), not for the arena's other shard on top
  limit=$(awk -v e="$per_rank" 'BEGIN { printf "%d", 2 * (e + 10) * 1048576 }')
  echo "estimate $per_rank MiB per rank, gather $gather MiB more; TANDEM_MEMORY_LIMIT $((limit >> 20)) MiB"
  out=$(env TANDEM_MEMORY_LIMIT=$limit timeout 120 "$RUN" -np 2 "$GPT" ${MODEL/--sample 0/--sample 20} $args 2>&1) ||
    { echo "$out" | tail; fail "the run failed instead of skipping the sample"; }
  echo "$out" | grep "no sample" | head -1
  echo "$out" | grep -q "no sample: .*gathering the whole parameter arena" || fail "the gather was not refused"
  echo "$out" | grep -q "final_loss=" || fail "no summary after the refused gather"
  ;;
watch)
  args="--zero-stage 0"
  per_rank=$(estimate 0 $MODEL $args)
  # a limit the estimate fits (with its 16 MiB allowance) but the RSS passes 90% of
  limit=$(awk -v e="$per_rank" 'BEGIN { printf "%d", 2 * (e + 8) * 1.02 * 1048576 }')
  out=$(env TANDEM_MEMORY_LIMIT=$limit timeout 120 "$RUN" -np 2 "$GPT" $MODEL $args --metrics "$tmp/m.jsonl" 2>&1) ||
    { echo "$out" | tail; fail "the run failed"; }
  echo "$out" | grep "share of memory" | head -2
  for r in 0 1; do
    echo "$out" | grep "^\[$r\]" | grep -q "rank $r: its share of memory (Pss) .* of the .* MiB available" ||
      fail "rank $r did not warn"
  done
  head -1 "$tmp/m.jsonl"
  grep -q '"memory_warning":[12]' "$tmp/m.jsonl" || fail "no memory_warning in the metrics"
  grep -q '"memory_mib":' "$tmp/m.jsonl" || fail "no memory_mib in the metrics"
  ;;
defaults)
  args="--zero-stage 3 --bf16 --activation-checkpointing --offload-optimizer nvme:$tmp --offload-param nvme:$tmp"
  per_rank=$(estimate 3 $MODEL $args) # DeepSpeed's defaults (nothing lowered: --estimate-memory does not fit)
  [ -n "$per_rank" ] || fail "no estimate"
  # 0.64: the tile chosen from the memory alone does not fit it, the cache must shrink too
  limit=$(awk -v e="$per_rank" 'BEGIN { printf "%d", 2 * (e + 10) * 0.64 * 1048576 }')
  echo "estimate at DeepSpeed's defaults $per_rank MiB per rank; TANDEM_MEMORY_LIMIT $((limit >> 20)) MiB for 2 ranks"
  out=$(env TANDEM_LOG=info TANDEM_MEMORY_LIMIT=$limit timeout 120 "$RUN" -np 2 "$GPT" $MODEL $args 2>&1) ||
    { echo "$out" | grep -v "offload step" | tail; fail "the job with unset knobs did not train"; }
  echo "$out" | grep "chosen from the model" | head -1
  # td_trainer_fit_memory (--estimate-memory's fit line) decides as the trainer did: same knobs, fits
  fit=$(env TANDEM_MEMORY_LIMIT=$limit timeout 60 "$RUN" -np 2 "$GPT" $MODEL $args --estimate-memory 2>&1 | grep "fit: ")
  echo "$fit" | cut -c1-200
  echo "$fit" | grep -q "fits=1" || fail "td_trainer_fit_memory says the job does not fit"
  knobs=$(echo "$out" | grep "train-gpt: knobs" | sed 's/.*knobs //')
  [ -n "$knobs" ] && echo "$fit" | grep -qF "$knobs" || fail "the fit's knobs ($fit) differ from the trainer's ($knobs)"
  for r in 0 1; do
    echo "$out" | grep "^\[$r\]" | grep "chosen from the model" | grep -q "stage3_max_live_parameters [0-9]" ||
      fail "rank $r did not lower stage3_max_live_parameters"
  done
  echo "$out" | grep -q "final_loss=" || fail "no summary"
  echo "$out" | grep "memory rank=" | awk -v lim="$((limit >> 20))" '{
      for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
      r = v["peak_rss_mib"] / v["estimate_mib"];
      printf "rank %s: peak %.1f MiB / estimate %.1f MiB = %.3f (limit per rank %.0f MiB)\n", v["rank"],
             v["peak_rss_mib"], v["estimate_mib"], r, lim / 2;
      n++; if (r > 1.0 || r < 0.9 || v["estimate_mib"] > lim / 2) bad = 1
    } END { exit bad || n != 2 }' || fail "peak outside [0.9, 1.0] x the estimate, or the estimate above the limit"
  # the same knobs set by the user are kept, and the job is refused
  echo '{"zero_optimization": {"stage3_max_live_parameters": 1000000000, "sub_group_size": 16777216}}' >"$tmp/set.json"
  out=$(env TANDEM_MEMORY_LIMIT=$limit timeout 60 "$RUN" -np 2 "$GPT" $MODEL $args --config "$tmp/set.json" 2>&1) &&
    fail "the job with the knobs set at DeepSpeed's defaults was not refused"
  echo "$out" | grep "needs about" | head -1 | cut -c1-300
  for r in 0 1; do
    echo "$out" | grep "^\[$r\]" | grep -q "needs about .* MiB per rank" || fail "rank $r did not say it was refused"
  done
  echo "$out" | grep "needs about" | grep -q "stage3_max_live_parameters" && fail "a knob the user set was lowered"
  env TANDEM_MEMORY_LIMIT=$limit timeout 60 "$RUN" -np 2 "$GPT" $MODEL $args --config "$tmp/set.json" --estimate-memory 2>&1 |
    grep "fit: " | grep -q "fits=0" || fail "td_trainer_fit_memory says the refused job fits"
  ;;
shrink)
  if ! unshare -i true 2>/dev/null; then
    echo "SKIPPED: unshare -i (an IPC namespace per rank, to give each its own host) is not allowed here"
    exit 0
  fi
  small="--layers 4 --channels 256 --heads 4 --seq 128 --micro-batch 4 --sample 0 --zero-stage 3"
  e2=$(timeout 60 "$RUN" -np 2 "$GPT" $small --elastic --estimate-memory 2>&1 | grep "stage=3 " | head -1 |
    sed 's/.*total=\([0-9.]*\).*/\1/')
  e1=$(timeout 60 "$RUN" -np 1 "$GPT" $small --elastic --estimate-memory 2>&1 | grep "stage=3 " | head -1 |
    sed 's/.*total=\([0-9.]*\).*/\1/')
  [ -n "$e1" ] && [ -n "$e2" ] || fail "no estimate"
  # each rank a host of its own: its memory limit is then its own
  printf '#!/bin/sh\nTANDEM_LOCAL_SIZE=1 exec unshare -i %s "$@"\n' "$(cd "$(dirname "$GPT")" && pwd)/train-gpt" >"$tmp/gpt"
  chmod +x "$tmp/gpt"
  # run LIMIT_MIB: 2 ranks, rank 1 killed at step 3, the survivor goes on alone (or refuses to)
  run() {
    rm -f "$tmp/out"
    TANDEM_MEMORY_LIMIT=$(($1 << 20)) setsid timeout 150 "$RUN" --min-np 1 --max-np 2 -np 2 --max-restarts 0 "$tmp/gpt" \
      $small --steps 12 >"$tmp/out" 2>&1 &
    local job=$! victim="" i
    for i in $(seq 1 1200); do
      grep -q "step 3 loss" "$tmp/out" && victim=$(sed -n 's/.*elastic process 1 (pid \([0-9]*\)).*/\1/p' "$tmp/out" | head -1)
      [ -n "$victim" ] && break
      sleep 0.05
    done
    [ -n "$victim" ] || { kill -9 -- -$job 2>/dev/null; cat "$tmp/out"; fail "the job did not reach step 3"; }
    kill -9 "$victim"
    wait $job
    rc=$?
  }
  # well above what 1 rank needs (e1 and ~10 MiB of process; a rank alone on its host runs more threads)
  above=$(awk -v a="$e1" 'BEGIN { printf "%d", a + 40 }')
  echo "--estimate-memory per rank at stage 3: $e2 MiB at 2 ranks, $e1 MiB at 1; limit per host $above MiB"
  run "$above"
  grep "memory epoch=\|memory rank=" "$tmp/out"
  [ $rc = 0 ] || { tail -20 "$tmp/out"; fail "the shrink that fits failed (exit $rc)"; }
  grep -q "memory epoch=2 rank=0 world=1 " "$tmp/out" || fail "no memory line for the epoch of 1 rank"
  grep "memory epoch=\|memory rank=0" "$tmp/out" | awk '{
      for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
      if ($0 ~ /epoch=1 rank=0/) e1 = v["estimate_mib"]
      if ($0 ~ /epoch=2 rank=0/) e2 = v["estimate_mib"]
      if ($0 ~ /memory rank=0/) { peak = v["peak_rss_mib"]; est = v["estimate_mib"] }
    } END {
      printf "estimate redone: %.1f MiB at 2 ranks, %.1f at 1; peak %.1f / estimate %.1f = %.3f\n", e1, e2, peak, est, peak / est
      exit !(e2 > e1 && est == e2 && peak <= est && peak >= 0.9 * est)
    }' || fail "the estimate was not redone for the smaller world, or the peak is outside [0.9, 1.0] x it"
  # between the trainer's own estimates at 2 ranks and at 1: the start fits, the shrink does not
  between=$(grep "memory epoch=" "$tmp/out" | grep "rank=0" | sed 's/.*estimate_mib=\([0-9.]*\).*/\1/' |
    awk '{ v[NR] = $1 } END { printf "%d", (v[1] + v[2]) / 2 }')
  echo "limit per host $between MiB"
  run "$between"
  grep "went from" "$tmp/out" | head -1 | cut -c1-400
  [ $rc != 0 ] || fail "the shrink that does not fit was not refused"
  grep "^\[0\]" "$tmp/out" | grep -q "the job went from 2 to 1 ranks.*needs about .* MiB per rank.*Not resized" ||
    fail "the survivor did not refuse the new world with the estimate"
  grep "went from" "$tmp/out" | grep -q "Bring the lost ranks back" || fail "the refusal does not say what to do"
  grep -q "^\[0\].*error: elastic training failed" "$tmp/out" || fail "the survivor did not stop with its error"
  ;;
prefetch)
  big="--layers 2 --channels 2560 --heads 20 --seq 64 --micro-batch 1 --zero-stage 3"
  knob() { # JSON-config -> the fit line's stage3_prefetch_bucket_size
    echo "$1" >"$tmp/p.json"
    timeout 60 "$RUN" -np 2 "$GPT" $big --config "$tmp/p.json" --estimate-memory 2>&1 | grep "fit: " |
      grep -o "stage3_prefetch_bucket_size=[0-9]*" | cut -d= -f2
  }
  block=$((12 * 2560 * 2560 + 13 * 2560)) # a block's parameters: 78676480
  got=$(knob '{}')
  echo "unset: $got (a block: $block)"
  [ "$got" = "$block" ] || fail "an unset prefetch bucket was not raised to one block"
  got=$(knob '{"zero_optimization": {"stage3_prefetch_bucket_size": 1000}}')
  echo "set to 1000: $got"
  [ "$got" = 1000 ] || fail "a prefetch bucket the user set was changed"
  got=$(knob "{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"$tmp\"},
    \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"$tmp\", \"buffer_size\": 60000000}}}")
  echo "offload_param.buffer_size 6e7 set: $got"
  [ "$got" = 50000000 ] || fail "the prefetch went past the parameter buffers the user set"
  ;;
*)
  fail "unknown mode $mode"
  ;;
esac
echo "OK $mode"
