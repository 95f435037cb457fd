#!/bin/sh
# The device memory series of the Prometheus endpoint (examples/app_common.h,
# td_device_mem_info) for a model on a device: train-gpt --device DEV
# --prometheus-port 0 is scraped (curl, the endpoint's own text format)
# after step 2 has run:
#   tandem_device_memory_total_bytes{device=DEV:0} is the device's size
#   from an independent source: equal to the emulator's constant
#   (TD_TEST_DEVICE_TOTAL, its 8 GiB), or, on a real GPU, at most nvidia-smi's
#   memory.total and at least 97% of it (the CUDA runtime's total leaves out
#   what the driver reserves: 615 MiB of 143,771 on the first H200 run);
#   tandem_device_memory_used_bytes is at least the trainer's fp32 state on
#   the device (parameters, gradients, Adam's two moments: 16 bytes per
#   parameter) and at most the total;
#   a run on the CPU has no device series.
# usage: device_metrics.sh BUILD_TREE DEV
set -u
B=$1
DEV=$2
. "$(dirname "$0")/device_common.sh"
scrape() { # scrape LOG OUT: once the run passed step 2, its metrics page into OUT
  port=
  for _ in $(seq 600); do
    port=$(sed -n 's|.*rank 0 serves metrics on http://127.0.0.1:\([0-9]*\)/metrics.*|\1|p' "$1" | head -1)
    if [ -n "$port" ] && curl -sf --max-time 5 "http://127.0.0.1:$port/metrics" >"$2" &&
       awk '$1 ~ /^tandem_step[{]/ && $2 >= 2 { ok = 1 } END { exit !ok }' "$2"; then
      return 0
    fi
    sleep 0.5
  done
  cat "$1"
  fail "no scrape past step 2 within 300 s"
}
value() { awk -v n="$1" 'index($1, n "{") == 1 { print $2 }' "$2" | head -1; }
"$GPT" $COMMON --steps 100000 --micro-batch 4 --device "$DEV" --prometheus-port 0 >"$dir/dev.log" 2>&1 &
pid=$!
scrape "$dir/dev.log" "$dir/dev.txt"
kill "$pid"
wait "$pid" 2>/dev/null
params=$(sed -n 's/.*params=\([0-9]*\).*/\1/p' "$dir/dev.log" | head -1)
[ -n "$params" ] || fail "no params= in the start line: $(cat "$dir/dev.log")"
grep -q "^tandem_device_memory_used_bytes{rank=\"0\",device=\"$DEV:0\"} " "$dir/dev.txt" ||
  fail "no device label $DEV:0: $(grep device_memory "$dir/dev.txt")"
used=$(value tandem_device_memory_used_bytes "$dir/dev.txt")
total=$(value tandem_device_memory_total_bytes "$dir/dev.txt")
want=${TD_TEST_DEVICE_TOTAL:-} low=1
if [ -z "$want" ] && command -v nvidia-smi >/dev/null; then
  want=$(( $(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0) * 1048576 )) low=0.97
fi
[ -n "$want" ] || fail "no reference for the device's size (TD_TEST_DEVICE_TOTAL or nvidia-smi)"
awk -v t="$total" -v w="$want" -v l="$low" 'BEGIN { exit !(t <= w && t >= l * w) }' ||
  fail "total $total bytes, the device has $want (the metric must be within [$low, 1] of it)"
awk -v u="$used" -v t="$total" -v p="$params" 'BEGIN { exit !(u >= 16 * p && u <= t) }' ||
  fail "used $used bytes: not within 16 x $params parameters .. $total"
"$GPT" $COMMON --steps 100000 --micro-batch 4 --device cpu --prometheus-port 0 >"$dir/cpu.log" 2>&1 &
pid=$!
scrape "$dir/cpu.log" "$dir/cpu.txt"
kill "$pid"
wait "$pid" 2>/dev/null
grep -q device_memory "$dir/cpu.txt" && fail "a CPU run exports device memory"
echo "device memory on $DEV: used $used of $total bytes (>= 16 x $params parameters); none on the CPU"
