#!/usr/bin/env bash
# What protected TCP streams cost (issue 19 item 7): 64 MiB f32 allreduce,
# 2 ranks, TANDEM_TCP_PROTECT=off / integrity / encrypt side by side,
#   - on loopback (TANDEM_TRANSPORT=tcp, one host), and
#   - across two network-namespace hosts on a veth bridge (tests/lib/netns.sh;
#     root), one rank each, started with torchrun's variables,
# interleaved round by round so that other users' load hits every mode
# alike; medians of the rounds and the median of the per-round ratios to off.
# Also the primitives' own throughput on this CPU (bench/protect_bench.c:
# seal + open of 256 KiB records, one thread): the bound the AEADs set.
# Writes bench/results/protect-<date>.md.
#
#   bench/protect.sh [--rounds N] [--iters N]
set -u
cd "$(dirname "$0")/.."
rounds=7
iters=10
while [ $# -gt 0 ]; do
  case "$1" in
  --rounds) rounds=$2; shift 2 ;;
  --iters) iters=$2; shift 2 ;;
  *) echo "usage: bench/protect.sh [--rounds N] [--iters N]" >&2; exit 2 ;;
  esac
done
B=${BUILD:-build}
PY=/usr/bin/python3
make -j2 "$B/bin/tandemrun" "$B/bin/tandem-bench" "$B/lib/libtandem.a" >/dev/null || { echo "protect.sh: build failed" >&2; exit 1; }
gcc -O2 -Iinclude -Isrc bench/protect_bench.c "$B/lib/libtandem.a" $(pkg-config --libs libsodium) -lm -lpthread \
  -o "$B/protect_bench" || exit 1
raw=$(mktemp /tmp/tandem-protect-bench.XXXXXX)
prims=$(mktemp /tmp/tandem-protect-prims.XXXXXX)
BENCH=$(cd "$B/bin" && pwd)/tandem-bench
RUN=$(cd "$B/bin" && pwd)/tandemrun
hosts=0
if [ "$(id -u)" = 0 ]; then
  . tests/lib/netns.sh
  netns_init
  NETNS_ON_EXIT='rm -f "$raw" "$prims"'
  netns_add_host a 10.77.9.1
  netns_add_host b 10.77.9.2
  hosts=1
else
  trap 'rm -f "$raw" "$prims"' EXIT
  echo "protect.sh: not root: no namespace hosts, loopback only" >&2
fi
secret=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
busbw() { awk '$0 ~ / 67108864 / && $NF == 0 {print $(NF-1)}' | head -1; }
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
"$B/protect_bench" 9 >"$prims"
for round in $(seq 1 "$rounds"); do
  for mode in off integrity encrypt; do
    bw=$(TANDEM_TRANSPORT=tcp TANDEM_TCP_PROTECT=$mode timeout 300 "$RUN" -np 2 "$BENCH" allreduce -b 64M -e 64M \
      -n "$iters" -w 2 2>&1 | busbw)
    echo "loopback $mode $round ${bw:-nan}" >>"$raw"
    if [ $hosts = 1 ]; then
      out=$(mktemp /tmp/tandem-protect-out.XXXXXX)
      port=$((29600 + round))
      for r in 0 1; do
        h=a addr=10.77.9.1
        [ $r = 1 ] && h=b addr=10.77.9.2
        netns_spawn $h env -u TANDEM_RANK -u TANDEM_WORLD_SIZE -u TANDEM_STORE -u TANDEM_LOCAL_RANK \
          -u TANDEM_LOCAL_SIZE RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=10.77.9.1 \
          MASTER_PORT=$port TANDEM_HOST_ADDR=$addr TANDEM_JOB_ID=protect-$$-$round-$mode TANDEM_SECRET=$secret \
          TANDEM_TCP_PROTECT=$mode "$BENCH" allreduce -b 64M -e 64M -n "$iters" -w 2 >"$out.$r" 2>&1
        eval "pid$r=\$NETNS_PID"
      done
      wait "$pid0" "$pid1"
      bw=$(busbw <"$out.0")
      [ -n "$bw" ] || { echo "protect.sh: hosts $mode round $round failed:" >&2; cat "$out.0" "$out.1" >&2; }
      echo "hosts $mode $round ${bw:-nan}" >>"$raw"
      rm -f "$out" "$out.0" "$out.1"
    fi
  done
  echo "protect.sh: round $round of $rounds done" >&2
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
result="bench/results/protect-$(date -u +%F).md"
$PY - "$raw" "$prims" "$result" "$rounds" "$iters" "$load_start" "$load_end" <<'EOF'
import math, statistics as st, sys, platform
raw, prims, result, rounds, iters, load0, load1 = sys.argv[1:8]
d = {}
for line in open(raw):
    where, mode, r, bw = line.split()
    d.setdefault(where, {}).setdefault(mode, {})[int(r)] = float(bw)
cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
with open(result, "w") as f:
    f.write("# Protected TCP streams: 64 MiB allreduce, 2 ranks, off / integrity / encrypt\n\n")
    f.write(f"`bench/protect.sh --rounds {rounds} --iters {iters}`: per round and mode, `TANDEM_TCP_PROTECT=MODE "
            f"tandem-bench allreduce -b 64M -e 64M -n {iters} -w 2` on loopback (`TANDEM_TRANSPORT=tcp tandemrun -np 2`) "
            "and across two network-namespace hosts (one rank each, veth bridge); modes interleaved.\n")
    f.write(f"Machine: {cpu}, {__import__('os').cpu_count()} CPUs, kernel {platform.release()}; "
            f"load average at start {load0}, at end {load1}.\n\n")
    f.write("| where | mode | median busbw GB/s | median of per-round ratios to off | rounds |\n|---|---|---|---|---|\n")
    for where in d:
        off = d[where].get("off", {})
        for mode in ("off", "integrity", "encrypt"):
            v = d[where].get(mode, {})
            good = [x for x in v.values() if not math.isnan(x)]
            ratios = [v[r] / off[r] for r in v if r in off and off[r] > 0 and not math.isnan(v[r])]
            med = st.median(good) if good else float("nan")
            rat = st.median(ratios) if ratios else float("nan")
            f.write(f"| {where} | {mode} | {med:.3f} | {rat:.3f} | {len(good)} |\n")
    f.write("\nThe primitives on this CPU (`bench/protect_bench.c`, seal + open of one 256 KiB record per "
            "iteration, one thread):\n\n```\n")
    f.write(open(prims).read())
    f.write("```\n")
print(open(result).read())
EOF
