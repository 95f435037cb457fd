#!/usr/bin/env bash
# What tensor parallelism's checkpoint form costs (issue 21 item 5): a
# GPT-2 124M-shaped model (bench/ckpt_tp_bench.c: vocab 50257, 12 layers,
# 768 channels, tied; AdamW) saved by 1 rank and by TP=2, each loaded by
# 1 rank and by TP=2. A TP save stores the unsplit model's arenas as
# ordinary format-2 pieces: the row-parallel weights (attention and MLP
# projections) are strided in the unsplit order, so each of their rows is a
# piece of its own. The table gives the manifest's size and piece count and
# the save/load times beside the 1-rank save's (median of --rounds, warm
# page cache: the checkpoint was just written). Writes
# bench/results/ckpt-tp-<date>.md.
#
#   bench/ckpt_tp.sh [--rounds N]
set -u
cd "$(dirname "$0")/.."
rounds=3
[ "${1:-}" = "--rounds" ] && rounds=$2
make -s -j2 build/lib/libtandem.a build/bin/tandemrun >/dev/null || { echo "build failed"; exit 1; }
LD=$(make -pn 2>/dev/null | grep -m1 "^LDLIBS :=" | sed 's/^LDLIBS := //')
gcc -O2 -Iinclude bench/ckpt_tp_bench.c build/lib/libtandem.a $LD -o build/ckpt_tp_bench || exit 1
w=$(mktemp -d /tmp/td-ckpt-tp-bench-XXXXXX) || exit 1
trap 'rm -rf "$w"' EXIT
raw="$w/raw.txt"
: >"$raw"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
run() { # run TP ARGS... -> seconds
  build/bin/tandemrun -np "$1" build/ckpt_tp_bench "${@:2}" "$1" 2>&1 | sed -n 's/^\(\[0\] \)\{0,1\}[a-z]* tp=[0-9]* seconds=//p'
}
for r in $(seq 1 "$rounds"); do
  for from in 1 2; do
    rm -rf "$w/c$from"
    s=$(run "$from" save "$w/c$from")
    [ -n "$s" ] || { echo "save tp=$from failed"; exit 1; }
    echo "save $from - $s" >>"$raw"
    for to in 1 2; do
      l=$(run "$to" load "$w/c$from")
      [ -n "$l" ] || { echo "load tp=$from -> tp=$to failed"; exit 1; }
      echo "load $from $to $l" >>"$raw"
    done
  done
done
for from in 1 2; do
  step=$(cat "$w/c$from/latest")
  eval "man$from=$(stat -c %s "$w/c$from/$step/manifest")"
  eval "pieces$from=$(grep -c '^piece ' "$w/c$from/$step/manifest")"
  eval "data$from=$(cat "$w/c$from/$step"/rank-*.bin | wc -c)"
done
med() { sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
out="bench/results/ckpt-tp-$(date -u +%F).md"
{
  echo "# Tensor-parallel checkpoints: manifest size and save/load time ($(date -u '+%F %H:%M UTC'))"
  echo
  echo "\`bench/ckpt_tp.sh --rounds $rounds\` on $(nproc) cores ($(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)),"
  echo "load average before: $load_before. GPT-2 124M shapes (vocab 50257, 12 layers, 768 channels, tied), AdamW:"
  echo "params, m, v. Median seconds over $rounds rounds; warm page cache."
  echo
  echo "| saved by | manifest bytes | pieces | data bytes | save s | load by 1 rank s | load by TP=2 s |"
  echo "|---|---|---|---|---|---|---|"
  for from in 1 2; do
    s=$(awk -v f=$from '$1 == "save" && $2 == f { print $4 }' "$raw" | med)
    l1=$(awk -v f=$from '$1 == "load" && $2 == f && $3 == 1 { print $4 }' "$raw" | med)
    l2=$(awk -v f=$from '$1 == "load" && $2 == f && $3 == 2 { print $4 }' "$raw" | med)
    eval "echo \"| $( [ $from = 1 ] && echo '1 rank' || echo 'TP=2' ) | \$man$from | \$pieces$from | \$data$from | $s | $l1 | $l2 |\""
  done
  echo
  echo "Raw (op, saved by, loaded by, seconds):"
  echo
  echo '```'
  cat "$raw"
  echo '```'
} >"$out"
cat "$out"
