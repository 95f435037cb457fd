#!/usr/bin/env bash
# The comm table's TCP allreduce between two hosts, Tandem against gloo in
# the same run, and Tandem builds against each other (an A/B of two commits):
#   hosts     two network-namespace hosts on a veth bridge (tests/lib/netns.sh;
#             needs root), one rank each, started with torchrun's variables
#             as bench/protect.sh does (no ssh: the launcher is not timed)
#   loopback  one host, TANDEM_TRANSPORT=tcp tandemrun -np 2 as bench/run.sh's
#             "Tandem tcp" column; gloo on 127.0.0.1
# 2 ranks, f32 sum in place, bench/run.sh's sizes (4 KiB .. 256 MiB, x4) and
# caps (-T 256M; gloo: bench/gloo_allreduce.py, torch_allreduce.py's counts).
# Rounds interleave every contender (the machine is shared; the order
# rotates each round so no contender always runs after the same one); the
# table gives per size the median busbw of the rounds, its range, and each
# contender against gloo (median of the per-round ratios).
#   [TREES="main=build old=/tmp/x/build"] [PARTS="hosts loopback"] [SIZES="4096 65536"] bench/coll_hosts.sh [ROUNDS] > table.md
# Each TREES entry is LABEL=BUILD_DIR holding bin/tandemrun and bin/tandem-bench;
# the header names the commit checked out above BUILD_DIR (rebuild after a
# checkout or merge, or the programs are older than that commit).
set -u
cd "$(dirname "$0")/.."
rounds=${1:-3}
read -r -a trees <<<"${TREES:-main=build}"
PARTS=${PARTS:-"hosts loopback"}
PY=/usr/bin/python3
# SIZES (bytes, ascending, powers of 4 apart) overrides the table's sizes
read -r -a sizes <<<"${SIZES:-4096 65536 1048576 16777216 67108864 268435456}"
tb_args=(allreduce -b "${sizes[0]}" -e "${sizes[-1]}" -f 4 -n 1000 -w 3 -T 256M -c 1 -i 1)
for t in "${trees[@]}"; do
  d=${t#*=}
  [ -x "$d/bin/tandem-bench" ] && [ -x "$d/bin/tandemrun" ] ||
    { echo "coll_hosts.sh: $d/bin/tandem-bench or tandemrun missing: build it (make -j2 $d/bin/tandemrun $d/bin/tandem-bench)" >&2; exit 2; }
done
# RAW=FILE keeps the rows (part label round size time_us busbw load=)
raw=${RAW:-$(mktemp /tmp/tandem-coll-hosts.XXXXXX)}
keep=$([ -n "${RAW:-}" ] && echo 1)
: >"$raw"
if [[ " $PARTS " = *" hosts "* ]]; then
  if [ "$(id -u)" != 0 ]; then
    echo "coll_hosts.sh: hosts part skipped: network namespaces need root" >&2
    PARTS=${PARTS//hosts/}
    trap '[ -n "$keep" ] || rm -f "$raw"' EXIT
  else
    . tests/lib/netns.sh
    netns_init
    NETNS_ON_EXIT='[ -n "$keep" ] || rm -f "$raw"'
    netns_add_host a 10.77.18.1
    netns_add_host b 10.77.18.2
  fi
else
  trap '[ -n "$keep" ] || rm -f "$raw"' EXIT
fi
secret=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
load_start=$(cut -d' ' -f1-3 /proc/loadavg)

# rows: tandem-bench "size count dtype op time_us algbw busbw wrong" (wrong: 0),
# gloo "size time_us algbw busbw"; prints "size time_us busbw" per row
# (tandemrun's "[0] " prefix dropped; only the sizes of $sizes: -f 4 has more)
rows() {
  sed 's/^\[0\] *//' | awk -v g="$1" -v want=" ${sizes[*]} " '!/^#/ && NF >= 4 && index(want, " " $1 " ") {
    if (g) print $1, $2, $4; else if ($NF == 0) print $1, $5, $7 }'
}

one() { # PART ROUND LABEL DIR|gloo
  local part=$1 round=$2 label=$3 dir=$4 out r h addr port pids=()
  out=$(mktemp /tmp/tandem-coll-hosts-out.XXXXXX)
  port=$((29700 + RANDOM % 200))
  if [ "$part" = loopback ] && [ "$dir" = gloo ]; then
    for r in 0 1; do
      RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 600 $PY bench/gloo_allreduce.py \
        "${sizes[@]}" >"$out.$r" 2>&1 &
      pids+=($!)
    done
    wait "${pids[@]}"
  elif [ "$part" = loopback ]; then
    TANDEM_TRANSPORT=tcp timeout 600 "$dir/bin/tandemrun" -np 2 "$dir/bin/tandem-bench" "${tb_args[@]}" >"$out.0" 2>&1
  else
    for r in 0 1; do
      h=a addr=10.77.18.1
      [ $r = 1 ] && h=b addr=10.77.18.2
      if [ "$dir" = gloo ]; then
        netns_spawn $h env RANK=$r WORLD_SIZE=2 MASTER_ADDR=10.77.18.1 MASTER_PORT=$port GLOO_SOCKET_IFNAME=eth0 \
          timeout 600 $PY bench/gloo_allreduce.py "${sizes[@]}" >"$out.$r" 2>&1
      else
        netns_spawn $h env -u TANDEM_RANK -u TANDEM_WORLD_SIZE -u TANDEM_STORE -u TANDEM_LOCAL_RANK \
          -u TANDEM_LOCAL_SIZE RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=10.77.18.1 \
          MASTER_PORT=$port TANDEM_HOST_ADDR=$addr TANDEM_JOB_ID=coll-$$-$round-$label TANDEM_SECRET=$secret \
          timeout 600 "$dir/bin/tandem-bench" "${tb_args[@]}" >"$out.$r" 2>&1
      fi
      pids+=("$NETNS_PID")
    done
    wait "${pids[@]}"
  fi
  local got
  got=$(rows "$([ "$dir" = gloo ] && echo 1)" <"$out.0")
  if [ "$(echo "$got" | grep -c .)" != "${#sizes[@]}" ]; then
    echo "coll_hosts.sh: $part $label round $round failed (or a row was wrong):" >&2
    cat "$out.0" "$out.1" 2>/dev/null | tail -n 20 >&2
  fi
  echo "$got" | while read -r size us bw; do
    echo "$part $label $round $size $us $bw load=$(cut -d' ' -f1 /proc/loadavg)" >>"$raw"
  done
  rm -f "$out" "$out.0" "$out.1"
}

contenders=("${trees[@]}" gloo=gloo)
for round in $(seq 1 "$rounds"); do
  for part in $PARTS; do
    n=${#contenders[@]}
    for ((i = 0; i < n; i++)); do
      c=${contenders[$(((i + round - 1) % n))]}
      one "$part" "$round" "${c%%=*}" "${c#*=}"
    done
  done
  echo "coll_hosts.sh: round $round of $rounds done (load $(cut -d' ' -f1 /proc/loadavg))" >&2
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

commits=""
for t in "${trees[@]}"; do
  d=${t#*=}
  c=$(git -C "$d/.." rev-parse --short HEAD 2>/dev/null || echo '?')
  commits+="${t%%=*} = $d ($c$(git -C "$d/.." diff --quiet HEAD -- src include tools 2>/dev/null || echo ', src/tools modified')); "
done
$PY - "$raw" "$rounds" "$load_start" "$load_end" "$commits" <<'EOF'
import statistics as st, sys, platform, subprocess, collections
raw, rounds, l0, l1, commits = sys.argv[1:6]
rows = collections.defaultdict(dict)  # (part, label, size) -> {round: busbw}
times = collections.defaultdict(dict)
order = []
for line in open(raw):
    part, label, rnd, size, us, bw = line.split()[:6]
    rows[(part, label, int(size))][int(rnd)] = float(bw)
    times[(part, label, int(size))][int(rnd)] = float(us)
    if (part, label) not in order:
        order.append((part, label))
cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"], capture_output=True,
                     text=True).stdout.strip()
print(f"Machine: {cpu}, {subprocess.run(['nproc'], capture_output=True, text=True).stdout.strip()} cores; "
      f"kernel {platform.release()}. Rounds: {rounds}, contenders interleaved (order rotated each round). "
      f"Load average (1, 5, 15 min) {l0} at the start, {l1} at the end.  ")
print(f"Trees: {commits}  ")
print("busbw in GB/s (4 KiB: time per call in us), median of the rounds [min-max]; 'vs gloo' is the median of "
      "the per-round ratios (time ratio at 4 KiB, gloo / contender).\n")
for part in sorted({p for p, _ in order}):
    labels = [l for p, l in order if p == part]
    labels = [l for l in labels if l != "gloo"] + ["gloo"]
    sizes = sorted({s for p, l, s in rows if p == part})
    print(f"**{part}**\n")
    print("| size | " + " | ".join(labels) + " | " + " | ".join(f"{l} vs gloo" for l in labels if l != "gloo") + " |")
    print("|---" * (1 + 2 * len(labels) - 1) + "|")
    for s in sizes:
        cells, ratios = [], []
        lat = s <= 4096
        src = times if lat else rows
        for l in labels:
            v = src.get((part, l, s), {})
            if not v:
                cells.append("-")
                continue
            vals = list(v.values())
            f = (lambda x: f"{x:.1f} us") if lat else (lambda x: f"{x:.3f}")
            cells.append(f"{f(st.median(vals))} [{f(min(vals))}-{f(max(vals))}]")
        g = src.get((part, "gloo", s), {})
        for l in labels:
            if l == "gloo":
                continue
            v = src.get((part, l, s), {})
            rs = [(g[r] / v[r]) if lat else (v[r] / g[r]) for r in v if r in g and v[r] > 0 and g[r] > 0]
            ratios.append(f"{st.median(rs):.2f}x [{min(rs):.2f}-{max(rs):.2f}]" if rs else "-")
        name = f"{s >> 20} MiB" if s >= 1 << 20 else f"{s >> 10} KiB"
        print(f"| {name} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    print()
    trees = [l for l in labels if l != "gloo"]
    if len(trees) >= 2:  # the A/B: first tree against each other one, round by round
        a = trees[0]
        for b in trees[1:]:
            cells = []
            for s in sizes:
                src = times if s <= 4096 else rows
                va, vb = src.get((part, a, s), {}), src.get((part, b, s), {})
                rs = [(vb[r] / va[r]) if s <= 4096 else (va[r] / vb[r]) for r in va if r in vb and va[r] > 0 and vb[r] > 0]
                name = f"{s >> 20} MiB" if s >= 1 << 20 else f"{s >> 10} KiB"
                cells.append(f"{name} {st.median(rs):.2f}x [{min(rs):.2f}-{max(rs):.2f}]" if rs else f"{name} -")
            print(f"{part}, {a} against {b} (median of the per-round ratios, > 1: {a} faster): " + "; ".join(cells) + "\n")
EOF
