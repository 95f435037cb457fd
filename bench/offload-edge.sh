#!/usr/bin/env bash
# One big offload run at the edge of this machine's memory (issue 23),
# inside a memory cgroup so that it can never OOM the machine's other users:
# the ranks read the cgroup's limit, so the knobs left unset are sized from
# it (the realistic setting). DeepSpeed's defaults otherwise: only stage 3,
# offload_optimizer and offload_param "nvme", bf16 and activation
# checkpointing are set (no sub_group_size, no buffer or cache knobs).
#
#   bench/offload-edge.sh LAYERS CHANNELS HEADS SEQ [LIMIT] [NVME_DIR]
#
# LIMIT: the cgroup's memory limit (default 18G, lowered to MemAvailable
# less 2 GiB when the machine has less). Prints and appends to OUT
# (default bench/results/offload-edge-DATE.md): the estimate per rank, each
# rank's peak RSS (VmHWM) and peak/estimate, the sum of the peaks, the
# cgroup's own peak, the losses, the wall time. Holds
# /tmp/tandem-bigmem.lock; runs at nice 10; deletes its offload files.
# ESTIMATE_ONLY=1: only print the estimate (no run, no cgroup). GPT and RUN
# name other binaries (a copy, so that rebuilding during the run cannot
# touch them); COMMIT then says which commit they were built from.
set -u
cd "$(dirname "$0")/.."
L=$1 C=$2 H=$3 SEQ=$4
limit=${5:-18G}
dir=${6:-/tmp/tandem-offload-edge}
B=${BUILD:-build}
GPT=${GPT:-$B/bin/train-gpt}
RUN=${RUN:-$B/bin/tandemrun}
out=${OUT:-bench/results/offload-edge-$(date -u +%Y-%m-%d).md}
steps=${STEPS:-3}
tmp=$(mktemp -d /tmp/tandem-offload-edge-XXXXXX)
job="$dir/job-$$"
mkdir -p "$job" bench/results
cg=""
cleanup() {
  rm -rf "$tmp" "$job"
  [ -n "$cg" ] && rmdir "$cg" 2>/dev/null
}
trap cleanup EXIT
cat >"$tmp/ds.json" <<JSON
{"zero_optimization": {"stage": 3,
   "offload_optimizer": {"device": "nvme", "nvme_path": "$job"},
   "offload_param": {"device": "nvme", "nvme_path": "$job"}},
 "bf16": {"enabled": true}, "activation_checkpointing": {"enabled": true},
 "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-4, "warmup_num_steps": 1000}},
 "gradient_clipping": 1.0, "steps_per_print": 1}
JSON
# a small repeated text: 3 steps of 2 sequences show the loss falling
python3 -c "import sys; open(sys.argv[1], 'w').write('the quick brown fox jumps over the lazy dog. ' * 4000)" "$tmp/text"
model="--layers $L --channels $C --heads $H --seq $SEQ --micro-batch 1"
args="--config $tmp/ds.json $model --steps $steps --sample 0 --lr 1e-4 --data $tmp/text --threads 1"

# the limit: at most MemAvailable less 2 GiB (the machine is shared)
to_bytes() { numfmt --from=iec "$1"; }
limit_b=$(to_bytes "$limit")
avail_b=$(($(awk '/^MemAvailable/ { print $2 }' /proc/meminfo) * 1024))
if [ $((avail_b - (2 << 30))) -lt "$limit_b" ]; then
  limit_b=$((avail_b - (2 << 30)))
  echo "offload-edge.sh: MemAvailable is $((avail_b >> 20)) MiB: limit lowered to $((limit_b >> 20)) MiB" >&2
fi

if [ "${ESTIMATE_ONLY:-0}" = 1 ]; then
  TANDEM_MEMORY_LIMIT=$limit_b "$RUN" -np 2 "$GPT" $args --estimate-memory 2>&1 | grep "stage=3 "
  exit 0
fi

# a memory cgroup for the job: v2 where this machine has it, else v1's memory controller
if [ -e /sys/fs/cgroup/cgroup.subtree_control ]; then
  cg=/sys/fs/cgroup/td-offload-edge-$$
  mkdir "$cg" && echo "$limit_b" >"$cg/memory.max" || { echo "offload-edge.sh: cannot create a v2 memory cgroup" >&2; exit 1; }
  peak_file=memory.peak
else
  base=/sys/fs/cgroup/memory$(sed -n 's/^[0-9]*:memory://p' /proc/self/cgroup)
  cg=${base%/}/td-offload-edge-$$
  mkdir "$cg" && echo "$limit_b" >"$cg/memory.limit_in_bytes" || { echo "offload-edge.sh: cannot create a v1 memory cgroup" >&2; exit 1; }
  peak_file=memory.max_usage_in_bytes
fi
echo "offload-edge.sh: $model, cgroup $cg limit $((limit_b >> 20)) MiB; load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
t0=$(date +%s)
flock /tmp/tandem-bigmem.lock sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec nice -n 10 "$@"' _ "$cg" \
  "$RUN" -np 2 "$GPT" $args >"$tmp/log" 2>&1
rc=$?
t1=$(date +%s)
cg_peak=$(cat "$cg/$peak_file" 2>/dev/null || echo 0)
oom=$(grep -s -E "oom_kill |oom_kill$" "$cg/memory.events" "$cg/memory.oom_control" | awk '{ print $NF }' | head -1)
rm -rf "$job"
grep -v "offload step=" "$tmp/log" | tail -30 >&2
mem=$(grep "memory rank=" "$tmp/log")
losses=$(grep -o "step [0-9]*/[0-9]* loss [0-9.a-z]*" "$tmp/log" | awk '{ printf "%s%s", sep, $4; sep = ", " }')
params=$(grep -o "params=[0-9]*" "$tmp/log" | head -1 | cut -d= -f2)
summary=$(echo "$mem" | awk '{
    for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
    printf "rank %s: estimate %.0f MiB, peak RSS %.0f MiB (%.3f); ", v["rank"], v["estimate_mib"], v["peak_rss_mib"], v["peak_rss_mib"] / v["estimate_mib"]
    sum += v["peak_rss_mib"]; est += v["estimate_mib"]
  } END { printf "sum of peaks %.0f MiB, of estimates %.0f MiB", sum, est }')
{
  echo
  echo "## $L layers x $C channels, $H heads, seq $SEQ ($params parameters), 2 ranks, $(date -u +%H:%MZ)"
  echo
  echo "Command: \`bench/offload-edge.sh $*\` (commit ${COMMIT:-$(git rev-parse --short HEAD)}); cgroup v$([ "$peak_file" = memory.peak ] && echo 2 || echo 1) limit $((limit_b >> 20)) MiB; machine: $(nproc) cores, $(free -g | awk '/^Mem/ { print $2 }') GiB, load before/after: see log"
  echo
  echo "- exit $rc in $((t1 - t0)) s; losses: $losses"
  echo "- $summary"
  echo "- cgroup peak (RSS + page cache + kernel): $((cg_peak >> 20)) MiB; OOM kills in the cgroup: ${oom:-0}"
  echo '```'
  grep -E "memory rank=|final_loss|activation_mib|^\[0\] train-gpt: (world|knobs)|refus|needs about|error|warn" "$tmp/log" | head -20
  grep "offload step=$steps" "$tmp/log"
  echo '```'
} | tee -a "$out"
exit $rc
