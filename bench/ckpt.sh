#!/usr/bin/env bash
# Checkpoint save and load time of the GPT reference configuration (3.4M
# parameters: parameters + AdamW m and v, ~40 MB), before and after the
# resharding checkpoint format, at 1 and 2 ranks, side by side in one run,
# with the disk's bandwidth next to them. Writes bench/results/ckpt-<date>.md.
#
#   bench/ckpt.sh [--rounds N] [--inner N] [--before REV]
#
# "before" is the library of REV (default: main, whose checkpoint.c is the
# format-1 code), built into build/ckpt-before/ from `git archive`; "after"
# is this tree. bench/ckpt_bench.c (public API only) is compiled against
# each. Every (version, world) pair runs once per round, interleaved, each
# run reporting the median of --inner save/load cycles; the table shows the
# median over rounds. Loads are cold: the new checkpoint's files are dropped
# from the page cache (posix_fadvise DONTNEED, only those files) before
# each load. The bound: dd with O_DIRECT, 256 MiB written and read on the
# same file system, and buffered dd with conv=fsync (what a save does).
set -u
cd "$(dirname "$0")/.."
rounds=3
inner=5
before=main
while [ $# -gt 0 ]; do
  case "$1" in
  --rounds) rounds=$2; shift 2 ;;
  --inner) inner=$2; shift 2 ;;
  --before) before=$2; shift 2 ;;
  *) echo "usage: bench/ckpt.sh [--rounds N] [--inner N] [--before REV]" >&2; exit 2 ;;
  esac
done
make -s -j2 all >/dev/null || { echo "build failed"; exit 1; }
bt=build/ckpt-before
rev=$(git rev-parse --short "$before") || exit 1
if [ ! -f "$bt/$rev.built" ]; then
  rm -rf "$bt" && mkdir -p "$bt/src"
  git archive "$before" | tar -x -C "$bt/src" || exit 1
  make -s -C "$bt/src" -j2 build/lib/libtandem.a >/dev/null || { echo "building $before failed"; exit 1; }
  touch "$bt/$rev.built"
fi
libs="$(pkg-config --libs libsodium openblas libcjson zlib 2>/dev/null) -lm -lpthread"
gcc -O2 -Iinclude bench/ckpt_bench.c build/lib/libtandem.a $libs -o build/ckpt_bench_after || exit 1
gcc -O2 -I"$bt/src/include" bench/ckpt_bench.c "$bt/src/build/lib/libtandem.a" $libs -o build/ckpt_bench_before || exit 1

w=$(mktemp -d /tmp/td-s13ckpt-bench-XXXXXX) || exit 1
trap 'rm -rf "$w"' EXIT
raw="$w/raw.txt"
: >"$raw"
# The disk: O_DIRECT sequential write and read, and a buffered write + fsync.
dd_rate() { sed -n 's/.*, \([0-9.]*\) \([kMG]\)B\/s$/\1 \2/p' | awk '{ m = $2 == "G" ? 1000 : $2 == "k" ? 0.001 : 1; printf "%.0f", $1 * m }'; }
disk_w=$(dd if=/dev/zero of="$w/dd.bin" bs=1M count=256 oflag=direct 2>&1 | dd_rate)
disk_r=$(dd if="$w/dd.bin" of=/dev/null bs=1M iflag=direct 2>&1 | dd_rate)
disk_f=$(dd if=/dev/zero of="$w/dd2.bin" bs=1M count=256 conv=fsync 2>&1 | dd_rate)
rm -f "$w/dd.bin" "$w/dd2.bin"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq 1 "$rounds"); do
  for np in 1 2; do
    for v in before after; do
      rm -rf "$w/ck-$v-$np"
      build/bin/tandemrun -np $np "build/ckpt_bench_$v" "$w/ck-$v-$np" "$inner" "$v" 2>&1 | sed 's/^\[0\] //' \
        | grep "^$v " | tee -a "$raw"
    done
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
med() { sort -g | awk '{ a[NR] = $1 } END { if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
field() { grep "^$1 world=$2 " "$raw" | grep -o "$3=[0-9.]*" | cut -d= -f2 | med; }
date=$(date -u +%Y-%m-%d)
out=bench/results/ckpt-$date.md
{
  echo "# Checkpoint save / load, GPT reference configuration ($date)"
  echo
  echo "Command: \`bench/ckpt.sh --rounds $rounds --inner $inner --before $before\` ($(git rev-parse --short HEAD) vs $before = $rev)."
  echo "Machine: $(nproc) cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo), checkpoints on $(df --output=source "$w" | tail -1) ($(df --output=fstype "$w" | tail -1))."
  echo "Load average (1, 5, 15 min) before: $load_before; after: $load_after (five other engineers share the machine)."
  echo
  echo "Disk bound (256 MiB, dd): O_DIRECT write $disk_w MB/s, O_DIRECT read $disk_r MB/s, buffered write + fsync $disk_f MB/s."
  echo
  echo "Checkpoint: $(grep -o 'params=[0-9]*' "$raw" | head -1 | cut -d= -f2) parameters, parameters + AdamW m and v in fp32,"
  echo "$(grep -o 'checkpoint_bytes=[0-9]*' "$raw" | grep -v '=-' | tail -1 | cut -d= -f2) bytes on disk (data files, manifest, token). Medians of $rounds rounds x $inner cycles; loads cold (page cache dropped for the checkpoint's files)."
  echo
  echo "| ranks | version | save s | save MB/s | load s | load MB/s | save after/before | load after/before |"
  echo "|---|---|---|---|---|---|---|---|"
  for np in 1 2; do
    sb=$(field before $np save_s); sa=$(field after $np save_s)
    lb=$(field before $np load_s); la=$(field after $np load_s)
    for v in before after; do
      s=$(field $v $np save_s); l=$(field $v $np load_s)
      sm=$(field $v $np save_MBps); lm=$(field $v $np load_MBps)
      if [ $v = after ]; then
        rs=$(awk -v a="$sa" -v b="$sb" 'BEGIN { printf "%.2fx time", a / b }')
        rl=$(awk -v a="$la" -v b="$lb" 'BEGIN { printf "%.2fx time", a / b }')
      else rs=""; rl=""; fi
      echo "| $np | $v | $s | $sm | $l | $lm | $rs | $rl |"
    done
  done
  echo
  echo "Raw lines (one per run, each the median of its $inner cycles):"
  echo
  echo '```'
  cat "$raw"
  echo '```'
} >"$out"
cat "$out"
