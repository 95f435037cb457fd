#!/usr/bin/env bash
# The larger-than-RAM run (issue 9): a GPT of ~2.5 billion parameters
# (32 layers x 2560 channels, 20 heads, byte vocabulary, 32-byte sequences,
# micro-batch 1) on 2 ranks with ZeRO stage 3 + offload_optimizer nvme +
# offload_param nvme + bf16 + activation checkpointing, then fio on the same
# file system with the same block size and O_DIRECT, reads and writes, for
# the bandwidth the offload achieves against what the disk gives.
#
#   bench/offload.sh [NVME_DIR] [STEPS]      (default /tmp/tandem-offload-bench, 5)
#
# MODEL="--layers 4 ..." and OUT=FILE run a smaller model into another
# results file (NEED_GB lowers the free-space check).
# Needs ~32 GB free under NVME_DIR (checked first; 45 GB asked for margin)
# and holds /tmp/tandem-bigmem.lock for the run (the ranks' RSS is ~12 GiB
# together). Peak RSS of each rank is read from /proc/PID/status (VmHWM)
# every second, and the train-gpt summary prints each rank's getrusage peak
# and its offload counters. Results: bench/results/offload-DATE.md. Every
# file under NVME_DIR is deleted afterwards.
set -u
cd "$(dirname "$0")/.."
dir=${1:-/tmp/tandem-offload-bench}
steps=${2:-5}
need_gb=${NEED_GB:-45}
mkdir -p "$dir" bench/results
free_gb=$(df -BG --output=avail "$dir" | tail -1 | tr -dc 0-9)
if [ "$free_gb" -lt "$need_gb" ]; then
  echo "offload.sh: $dir has ${free_gb} GB free; the run needs ${need_gb} GB (set NEED_GB to override)" >&2
  exit 1
fi
make -j2 all >/dev/null || exit 1
out=${OUT:-bench/results/offload-$(date -u +%Y-%m-%d).md}
log=$(mktemp /tmp/tandem-offload-bench-log.XXXXXX)
cfg=$(mktemp /tmp/tandem-offload-bench-cfg.XXXXXX.json)
cat >"$cfg" <<EOF
{"zero_optimization": {"stage": 3, "sub_group_size": 16777216,
   "stage3_max_live_parameters": 100000000, "stage3_prefetch_bucket_size": 100000000,
   "offload_optimizer": {"device": "nvme", "nvme_path": "$dir", "buffer_count": 4},
   "offload_param": {"device": "nvme", "nvme_path": "$dir", "buffer_count": 2, "buffer_size": 100000000}},
 "aio": {"block_size": 1048576, "queue_depth": 16, "thread_count": 2},
 "bf16": {"enabled": true}, "activation_checkpointing": {"enabled": true},
 "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-4, "warmup_num_steps": 1000}},
 "gradient_clipping": 1.0, "steps_per_print": 1}
EOF
# WarmupLR (to 1e-4 over 1000 steps): the first steps of a 2.5B model at a
# constant 2e-5 overshot (losses 5.91, 15.17, 9.83, ... on 2026-11-23); a
# warmup is what DeepSpeed's configs for models this size use.
# A small repeated text, so that 5 steps of 2 x 32 bytes show the loss falling
# (with the whole fortunes corpus each step's 64 bytes differ too much to tell).
data=$(mktemp /tmp/tandem-offload-bench-text.XXXXXX)
python3 -c "import sys; open(sys.argv[1], 'w').write('the quick brown fox jumps over the lazy dog. ' * 4000)" "$data"
metrics=$(mktemp /tmp/tandem-offload-bench-metrics.XXXXXX)
model=${MODEL:-"--layers 32 --channels 2560 --heads 20 --seq 32 --micro-batch 1"}
trap 'rm -rf "$dir"/tandem-offload-* "$dir"/fio-* "$cfg" "$log" "$log.rss" "$log.head" "$data" "$metrics"' EXIT

echo "offload.sh: load before: $(uptime)" | tee "$log.head"
build/bin/tandemrun -np 2 build/bin/train-gpt --config "$cfg" $model --estimate-memory 2>&1 | grep -E "stage=3" | tee -a "$log.head"
t0=$(date +%s)
# the run, under the machine's big-memory lock; RSS sampled every second
flock /tmp/tandem-bigmem.lock bash -c '
  build/bin/tandemrun -np 2 build/bin/train-gpt --config "$1" $2 --steps "$3" --sample 0 --lr 1e-4 \
    --data "$5" --metrics "$6" >"$4" 2>&1 &
  launcher=$!
  peak=0
  while kill -0 $launcher 2>/dev/null; do
    sum=0
    for p in $(pgrep -f "build/bin/train-gpt --config $1" || true); do
      r=$(awk "/^VmRSS/ {print \$2}" /proc/$p/status 2>/dev/null || echo 0)
      sum=$((sum + ${r:-0}))
    done
    [ $sum -gt $peak ] && peak=$sum && echo "$peak" >"$4.rss"
    sleep 1
  done
  wait $launcher
' _ "$cfg" "$model" "$steps" "$log" "$data" "$metrics"
rc=$?
t1=$(date +%s)
cat "$log"
peak_kib=$(cat "$log.rss" 2>/dev/null || echo 0)
echo "offload.sh: train-gpt exit $rc in $((t1 - t0)) s; peak of the summed VmRSS of both ranks (1 s samples): $((peak_kib / 1024)) MiB"
echo "offload.sh: load after run: $(uptime)"
rm -rf "$dir"/tandem-offload-*

# fio: same file system, 1 MiB blocks, O_DIRECT, io_uring, 2 jobs (the 2 ranks) x queue depth 16
fio_out=$(mktemp /tmp/tandem-offload-bench-fio.XXXXXX)
for rw in write read; do
  fio --name=fio-$rw --directory="$dir" --filename_format='fio-$jobnum' --rw=$rw --bs=1M --direct=1 \
      --ioengine=io_uring --iodepth=16 --numjobs=2 --size=2G --group_reporting --output-format=terse \
      --terse-version=3 >>"$fio_out" 2>&1
done
# terse v3: field 7 = read bandwidth KiB/s, field 48 = write bandwidth KiB/s
fio_w=$(awk -F';' 'NR==1 {printf "%.3f", $48 * 1024 / 1e9}' "$fio_out")
fio_r=$(awk -F';' 'NR==2 {printf "%.3f", $7 * 1024 / 1e9}' "$fio_out")
rm -f "$fio_out" "$dir"/fio-*
echo "offload.sh: fio 1 MiB O_DIRECT io_uring qd16 x 2 jobs on $dir: write ${fio_w} GB/s, read ${fio_r} GB/s"

{
  echo "# NVMe offload: the larger-than-RAM run ($(date -u +%Y-%m-%dT%H:%MZ))"
  echo
  echo "Command: \`bench/offload.sh $dir $steps\` (commit $(git rev-parse --short HEAD)); machine: $(nproc) cores, $(free -g | awk '/Mem/ {print $2}') GiB RAM"
  echo
  echo '```'
  cat "$log.head"
  grep -E "world=|step [0-9]+/|final_loss|precision=|offload step" "$log"
  echo "per-step metrics (rank 0):"
  cat "$metrics"
  echo "peak summed VmRSS of both ranks: $((peak_kib / 1024)) MiB; wall $((t1 - t0)) s; exit $rc"
  echo "fio (same dir, bs 1M, O_DIRECT, io_uring, iodepth 16, 2 jobs): write ${fio_w} GB/s, read ${fio_r} GB/s"
  echo "load after: $(uptime)"
  echo '```'
} >"$out"
echo "offload.sh: results in $out"
exit $rc
