#!/usr/bin/env bash
# The matrix products alone (issue 9, bf16 target): GFLOP/s of Tandem's bf16
# product (vdpbf16ps), its own f32 products and OpenBLAS sgemm at the shapes
# of one GPT reference training step, one thread, per CPU second, against the
# CPU's peaks (bench/bf16gemm_bench.c says how).
#
#   bench/bf16gemm.sh [--rounds N] [--base REV]
#   (TAG=x names the file bf16gemm-<date>-x.md)
#
# --base REV: also the same benchmark built against commit REV's library
# and headers (exported with git archive into build/bf16gemm-base/ and built
# there once per commit, as bench/ckpt.sh does); the two binaries run
# alternately, the order reversed every other round, --rounds times each (5
# calls per variant and shape per run; every run's table is kept, with the
# medians of the "one step" rows).
# Writes bench/results/bf16gemm-<date>.md.
set -u
cd "$(dirname "$0")/.."
rounds=3 base=""
while [ $# -gt 0 ]; do
  case "$1" in
  --rounds) rounds=$2; shift 2 ;;
  --base) base=$2; shift 2 ;;
  *) echo "usage: bench/bf16gemm.sh [--rounds N] [--base REV]" >&2; exit 2 ;;
  esac
done
B=${BUILD:-build}
make -j2 --no-print-directory BUILD="$B" "$B/lib/libtandem.a" >/dev/null || { echo "bench/bf16gemm.sh: build of $B failed" >&2; exit 1; }
if [ -n "$base" ]; then
  rev=$(git rev-parse --short "$base^{commit}" 2>/dev/null) || { echo "bench/bf16gemm.sh: --base $base: not a commit of this repository" >&2; exit 2; }
  bt=build/bf16gemm-base/$rev
  if [ ! -f "$bt/built" ]; then
    rm -rf "$bt" && mkdir -p "$bt/src"
    git archive "$rev" | tar -x -C "$bt/src" || exit 1
    make -s -C "$bt/src" -j2 build/lib/libtandem.a >/dev/null || { echo "bench/bf16gemm.sh: building $rev failed" >&2; exit 1; }
    touch "$bt/built"
  fi
fi
libs="$(pkg-config --libs libsodium openblas libcjson zlib liburing 2>/dev/null) -lm -lpthread"
bin=$(mktemp -d /tmp/tandem-bf16gemm-XXXXXX)
trap 'rm -rf "$bin"' EXIT
gcc -O2 -Iinclude -Isrc bench/bf16gemm_bench.c "$B/lib/libtandem.a" $libs -o "$bin/new" || exit 1
variants=new
if [ -n "$base" ]; then
  gcc -O2 -I"$bt/src/include" -I"$bt/src/src" bench/bf16gemm_bench.c "$bt/src/build/lib/libtandem.a" $libs -o "$bin/base" || exit 1
  variants="new base"
fi
date_tag=$(date +%Y-%m-%d)
out=bench/results/bf16gemm-$date_tag${TAG:+-$TAG}.md
mkdir -p bench/results
load_before=$(uptime | sed 's/.*load average: //')
declare -A tables steps
for ((r = 1; r <= rounds; r++)); do
  order=$variants
  ((r % 2 == 0)) && order=$(echo "$variants" | tr ' ' '\n' | tac | tr '\n' ' ')
  for v in $order; do
    o=$("$bin/$v" 5) || { echo "bench/bf16gemm.sh: $v failed" >&2; exit 1; }
    tables[$v]+="run $r:"$'\n'"$o"$'\n'
    # the bf16 column of the "one step" row
    steps[$v]+="$(echo "$o" | awk '$1 == "one" && $2 == "step" { print $4 }') "
    echo "  round $r $v: one step bf16 $(echo "$o" | awk '$1 == "one" && $2 == "step" { print $4, "GFLOP/s, f32 own", $5, ", sgemm", $6 }')" >&2
  done
done
load_after=$(uptime | sed 's/.*load average: //')
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ a[NR] = $1 } END { if (NR == 0) { print "nan"; exit } if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
{
  echo "# bf16 matrix products alone — $date_tag"
  echo
  echo "Machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores; Tandem $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD 2>/dev/null || echo ' + uncommitted changes'), $(gcc --version | head -1)"
  echo "Load average (1, 5, 15 min) before: $load_before; after: $load_after (the machine is shared; GFLOP/s per CPU second)."
  echo "Command: bench/bf16gemm.sh --rounds $rounds${base:+ --base $base (commit $rev)}"
  echo
  for v in $variants; do
    echo "Median bf16 GFLOP/s of one step's linear products, $v: $(echo "${steps[$v]}" | median) (runs: ${steps[$v]})"
  done
  for v in $variants; do
    echo
    echo "## $v"
    echo
    echo '```'
    echo -n "${tables[$v]}"
    echo '```'
  done
} >"$out"
cat "$out"
echo "bench/bf16gemm.sh: wrote $out" >&2
