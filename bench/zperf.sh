#!/usr/bin/env bash
# ZeRO stages 1-3 at speed: the GPT reference configuration on 2 ranks x 1
# thread at stages 0-3, with the ZeRO arenas (stage 2-3 gradients and
# parameters, stage 1-3 optimizer-state shards) on 4 KiB pages
# (TANDEM_ZERO_HUGE_PAGES=off, the code before src/train/zero/pages.c) and
# on 2 MiB huge-page granules (the default), interleaved round by round in
# one binary. Per configuration: tokens/s (median), ratio to stage 0
# (median of per-round ratios too), CPU seconds and minor faults per rank
# (getrusage via /usr/bin/time, steadier than wall time on a shared
# machine), and a per-step breakdown from the Chrome-trace timeline
# (forward, backward, optimizer, comm_wait; rank 0, steps 3..). Writes
# bench/results/zperf-<date>.md.
#
#   bench/zperf.sh [--rounds N] [--steps N] [--huge-only]
#
# --huge-only skips the 4 KiB-page rows (half the runs): the default
# configuration of every stage against stage 0.
set -u
cd "$(dirname "$0")/.."
rounds=3; steps=30; huge_only=0
while [ $# -gt 0 ]; do
  case "$1" in
  --rounds) rounds=$2; shift 2 ;;
  --steps) steps=$2; shift 2 ;;
  --huge-only) huge_only=1; shift ;;
  *) echo "usage: bench/zperf.sh [--rounds N] [--steps N] [--huge-only]" >&2; exit 2 ;;
  esac
done
B=${BUILD:-build}
make -j2 --no-print-directory BUILD="$B" all >/dev/null || { echo "bench/zperf.sh: build of $B failed" >&2; exit 1; }
export TANDEM_PROGRESS=off
tmp=$(mktemp -d /tmp/tandem-zperf-bench-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
out=bench/results/zperf-$(date +%Y-%m-%d).md
mkdir -p bench/results
load_before=$(cut -d' ' -f1-3 /proc/loadavg)

# one run: prints "tokens cpu_per_rank faults_per_rank fwd bwd opt comm"
run() { # HUGE STAGE
  rm -f "$tmp"/t.* "$tmp"/tl.json*
  local tok
  tok=$(TANDEM_ZERO_HUGE_PAGES=$1 TANDEM_TIMELINE="$tmp/tl.json" "$B/bin/tandemrun" -np 2 sh -c \
    '/usr/bin/time -o '"$tmp"'/t.$$ -f "%U %S %R" "$@"' sh "$B/bin/train-gpt" --threads 1 --steps "$steps" --sample 0 \
    --zero-stage "$2" 2>/dev/null | grep -o 'tokens_per_s=[^ ]*' | cut -d= -f2)
  local cpu
  cpu=$(cat "$tmp"/t.* | awk '{ c += $1 + $2; f += $3; n++ } END { if (n) printf "%.2f %d", c / n, f / n; else print "nan nan" }')
  local br
  br=$(/usr/bin/python3 - "$tmp/tl.json.0" <<'PY'
import json, sys, collections
try:
    ev = json.load(open(sys.argv[1]))
except Exception:
    print("nan nan nan nan"); sys.exit()
steps = [e for e in ev if e.get("cat") == "step"]
t0 = steps[2]["ts"] if len(steps) > 3 else 0
agg = collections.defaultdict(float)
for e in ev:
    if e.get("ph") == "X" and e.get("cat") != "step" and e["ts"] >= t0:
        agg[e["name"]] += e["dur"] / 1e3
n = max(len(steps) - 2, 1)
print(" ".join("%.1f" % (agg[k] / n) for k in ("forward", "backward", "optimizer", "comm_wait")))
PY
)
  echo "${tok:-nan} $cpu $br"
}

declare -A res
# stage 0 has no ZeRO arena: auto:0 is off:0 again (the noise)
configs="off:0 off:1 off:2 off:3 auto:0 auto:1 auto:2 auto:3"
[ "$huge_only" = 1 ] && configs="auto:0 auto:1 auto:2 auto:3"
for ((r = 1; r <= rounds; r++)); do
  for c in $configs; do
    v=$(run "${c%%:*}" "${c##*:}")
    res[$c]+="$v"$'\n'
    echo "round $r $c: $v" >&2
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

median_col() { # CONFIG COLUMN
  echo -n "${res[$1]}" | awk -v k="$2" '{ print $k }' | sort -g |
    awk '{ a[NR] = $1 } END { if (NR == 0) { print "nan"; exit } if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}
ratio_med() { # CONFIG BASE: median of per-round tokens/s ratios
  paste <(echo -n "${res[$1]}" | awk '{ print $1 }') <(echo -n "${res[$2]}" | awk '{ print $1 }') |
    awk '$2 > 0 { print $1 / $2 }' | sort -g |
    awk '{ a[NR] = $1 } END { if (NR == 0) { print "nan"; exit } if (NR % 2) printf "%.2f", a[(NR + 1) / 2]; else printf "%.2f", (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}
{
  echo "# ZeRO stages at speed: $([ "$huge_only" = 1 ] && echo 'huge-page granules only' || echo '4 KiB pages against huge-page granules') ($(date -u '+%Y-%m-%d %H:%M UTC'))"
  echo
  echo "Command: \`bench/zperf.sh --rounds $rounds --steps $steps$([ "$huge_only" = 1 ] && echo ' --huge-only')\` (each run: \`TANDEM_ZERO_HUGE_PAGES=off|auto tandemrun -np 2 train-gpt --threads 1 --steps $steps --sample 0 --zero-stage S\`, GPT reference configuration, 3.32M parameters)."
  echo "Rounds interleaved; medians over $rounds rounds. Load average before: $load_before; after: $load_after. Git: $(git rev-parse --short HEAD)."
  echo "CPU s and faults: per rank (user+sys and minor faults over the whole run, /usr/bin/time); stage 0 CPU / CPU is the throughput ratio the CPU time predicts on a quiet machine (1 thread per rank, 2 ranks on 2 cores). Breakdown: ms per step on rank 0, steps 3.., from TANDEM_TIMELINE (wall time: inflated by the load)."
  echo
  echo "| pages | stage | tokens/s | / stage 0 (same pages) | median of round ratios | CPU s per rank | stage 0 CPU / CPU | faults per rank | forward ms | backward ms | optimizer ms | comm wait ms |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
  for c in $configs; do
    base="${c%%:*}:0"
    t=$(median_col "$c" 1); t0=$(median_col "$base" 1)
    echo "| ${c%%:*} | ${c##*:} | $t | $(awk -v a="$t" -v b="$t0" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }') | $(ratio_med "$c" "$base") | $(median_col "$c" 2) | $(awk -v a="$(median_col "$base" 2)" -v b="$(median_col "$c" 2)" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }') | $(median_col "$c" 3) | $(median_col "$c" 4) | $(median_col "$c" 5) | $(median_col "$c" 6) | $(median_col "$c" 7) |"
  done
  echo
  echo "Raw rows (tokens/s, CPU s per rank, faults per rank, forward, backward, optimizer, comm wait):"
  echo
  for c in $configs; do echo "- $c: $(echo -n "${res[$c]}" | tr '\n' ';')"; done
} >"$out"
cat "$out"
