#!/usr/bin/env bash
# Start-up cost at scale: job wall time and td_comm_init time of
#   tandemrun -np N tandem-bench allreduce -b 4K -e 64K -f 16 -n 3
# at 8, 32, 64, 128 and 256 ranks, for this tree and, when --base DIR names
# another checkout (built with make), for that one, interleaved round by
# round so that load from other users hits both alike; medians of the
# rounds. Writes bench/results/init-<date>.md.
#
#   bench/init.sh [--rounds N] [--sizes "8 32 64"] [--base DIR] [--timeout S]
#
# The init time is the "# init:" line tandem-bench prints: td_comm_init on
# the slowest rank, which includes waiting for the last rank to be started.
# The base tree's tandem-bench may predate that line, so this script builds
# this tree's tools/tandem-bench.c against the base tree's library (public
# API only) into a temporary directory. The store requests of a job come
# from the store server's debug line (TANDEM_LOG=debug), in a separate run
# per size so that the timed runs do not pay for logging.
#
# Example (before/after the O(N) rendezvous):
#   git worktree add /tmp/rdv-base 713c809 && make -C /tmp/rdv-base -j2 all
#   bench/init.sh --base /tmp/rdv-base
set -u
cd "$(dirname "$0")/.."
rounds=3
sizes="8 32 64 128 256"
base=""
limit=600
while [ $# -gt 0 ]; do
  case "$1" in
  --rounds) rounds=$2; shift 2 ;;
  --sizes) sizes=$2; shift 2 ;;
  --base) base=$2; shift 2 ;;
  --timeout) limit=$2; shift 2 ;;
  *) echo "usage: bench/init.sh [--rounds N] [--sizes \"8 32 ...\"] [--base DIR] [--timeout S]" >&2; exit 2 ;;
  esac
done
B=${BUILD:-build}
PY=/usr/bin/python3
make -j2 all >/dev/null || { echo "init.sh: build failed" >&2; exit 1; }
tmp=$(mktemp -d /tmp/tandem-init-bench.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

trees="new"
declare -A RUNNER BENCH
RUNNER[new]="$B/bin/tandemrun"
BENCH[new]="$B/bin/tandem-bench"
if [ -n "$base" ]; then
  [ -x "$base/build/bin/tandemrun" ] || { echo "init.sh: $base/build/bin/tandemrun missing (run make there)" >&2; exit 1; }
  # shellcheck disable=SC2046
  gcc -std=gnu11 -O2 -pthread -I"$base/include" -I"$base/src" -o "$tmp/tandem-bench-base" tools/tandem-bench.c \
    "$base/build/lib/libtandem.a" $(grep -q sodium "$base/Makefile" && echo -lsodium) -lm -lpthread ||
    { echo "init.sh: cannot build tandem-bench against $base" >&2; exit 1; }
  trees="base new"
  RUNNER[base]="$base/build/bin/tandemrun"
  BENCH[base]="$tmp/tandem-bench-base"
fi

cmd_args="allreduce -b 4K -e 64K -f 16 -n 3"
raw="$tmp/raw.txt" # tree size round wall init ok
: >"$raw"
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
for round in $(seq 1 "$rounds"); do
  for n in $sizes; do
    for t in $trees; do
      out="$tmp/out-$t-$n-$round"
      t0=$(date +%s.%N)
      timeout "$limit" "${RUNNER[$t]}" -np "$n" "${BENCH[$t]}" $cmd_args >"$out" 2>&1
      rc=$?
      t1=$(date +%s.%N)
      init=$(sed -n 's/.*# init: td_comm_init took \([0-9.]*\) s.*/\1/p' "$out" | head -1)
      wall=$($PY -c "print(f'{$t1 - $t0:.3f}')")
      ok=0
      [ $rc -eq 0 ] && grep -q "# ok: 0 wrong" "$out" && ok=1
      echo "$t $n $round $wall ${init:-nan} $ok" >>"$raw"
      echo "round $round: $t np=$n wall ${wall}s init ${init:-?}s $([ $ok = 1 ] && echo ok || echo "FAILED rc=$rc")" >&2
    done
  done
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

# Store requests and connections per size (one extra run each, with logging).
reqs="$tmp/reqs.txt"
: >"$reqs"
for n in $sizes; do
  for t in $trees; do
    line=$(TANDEM_LOG=debug timeout "$limit" "${RUNNER[$t]}" -np "$n" "${BENCH[$t]}" allreduce -b 4K -e 4K -n 1 -w 0 2>&1 |
      grep "store server on port" | tail -1)
    r=$(echo "$line" | sed -n 's/.*: \([0-9]*\) requests served, at most \([0-9]*\) connections.*/\1 \2/p')
    echo "$t $n ${r:-- -}" >>"$reqs"
  done
done

date_tag=$(date -u +%F)
result="bench/results/init-$date_tag.md"
mkdir -p bench/results
$PY - "$raw" "$reqs" "$result" "$rounds" "$load_start" "$load_end" "$cmd_args" "$base" <<'EOF'
import statistics, sys, platform, subprocess
raw, reqs, result, rounds, load0, load1, cmd, base = sys.argv[1:9]
rows = {}
for line in open(raw):
    t, n, r, wall, init, ok = line.split()
    rows.setdefault((t, int(n)), []).append((float(wall), float(init), ok == "1"))
req = {}
for line in open(reqs):
    t, n, a, b = line.split()
    req[(t, int(n))] = (a, b)
sizes = sorted({n for (_, n) in rows})
trees = [t for t in ("base", "new") if any(k[0] == t for k in rows)]
def med(xs):
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")
cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"], capture_output=True,
                     text=True).stdout.strip()
ncpu = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
with open(result, "w") as f:
    f.write("# Start-up at scale: td_comm_init and job wall time\n\n")
    f.write(f"Command: `tandemrun -np N tandem-bench {cmd}`, {rounds} rounds interleaved, medians.\n")
    f.write(f"Machine: {cpu}, {ncpu} cores, kernel {platform.release()}. Load average (1, 5, 15 min) "
            f"at start {load0}, at end {load1}: other users' jobs shared the 2 cores, so wall times are "
            "upper bounds and vary from round to round.\n")
    if base:
        f.write(f"\n`base` is the tree at {base} (built there with make); `new` is this tree. Both run this tree's "
                "tandem-bench.c source.\n")
    f.write("\n| ranks | " + " | ".join(f"{t} init s | {t} wall s" for t in trees) + " | all correct |\n")
    f.write("|---|" + "---|---|" * len(trees) + "---|\n")
    for n in sizes:
        cells = []
        allok = True
        for t in trees:
            v = rows.get((t, n), [])
            cells.append(f"{med([x[1] for x in v]):.2f} | {med([x[0] for x in v]):.2f}")
            allok = allok and v and all(x[2] for x in v)
        f.write(f"| {n} | " + " | ".join(cells) + f" | {'yes' if allok else 'NO'} |\n")
    f.write("\nStore traffic of one job (`-b 4K -e 4K -n 1 -w 0`, from the store server's debug line; "
            "'-' where the tree does not log it):\n\n")
    f.write("| ranks | " + " | ".join(f"{t} requests | {t} connections" for t in trees) + " |\n")
    f.write("|---|" + "---|---|" * len(trees) + "\n")
    for n in sizes:
        f.write(f"| {n} | " + " | ".join(" | ".join(req.get((t, n), ("-", "-"))) for t in trees) + " |\n")
    f.write("\nEvery run, round by round (tree, ranks, round, wall s, init s, correct):\n\n```\n")
    f.write(open(raw).read())
    f.write("```\n")
print(result)
EOF
