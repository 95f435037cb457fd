#!/usr/bin/env bash
# Speed of each CPU level of the kernels (src/base/cpu.c, TANDEM_CPU), side
# by side in one run, and the default (auto) build against an older build
# compiled with -march=native. Writes bench/results/cpu-levels-<date>.md.
#
#   bench/cpu_levels.sh [--rounds N] [--steps N] [--old BUILD_TREE]
#
# Per round, interleaved (load from other users of the machine hits every
# configuration alike), for auto, generic, avx2, avx512 (the levels this CPU
# supports) and, with --old, the old tree:
#   - GPT, reference configuration, 1 rank x 1 thread: train-gpt tokens/s
#     (wall clock; it excludes its first 2 steps), and test_gpt_speed's
#     tokens per CPU second (the same model, forward + backward + AdamW,
#     timed in the process's CPU time: on a machine shared with other jobs,
#     wall time mostly measures how often the process got a core);
#   - allreduce 64 MiB f32 sum, 2 ranks over shm, td_mem_alloc buffers:
#     tandem-bench busbw (GB/s).
# Then the kernels alone: test_nn_levels --bench (per CPU second, levels
# interleaved in one process). Each figure is the median of the rounds.
set -u
cd "$(dirname "$0")/.."
rounds=5
steps=30
old=""
while [ $# -gt 0 ]; do
  case "$1" in
  --rounds) rounds=$2; shift 2 ;;
  --steps) steps=$2; shift 2 ;;
  --old) old=$2; shift 2 ;;
  *) echo "usage: bench/cpu_levels.sh [--rounds N] [--steps N] [--old BUILD_TREE]" >&2; exit 2 ;;
  esac
done
B=${BUILD:-build}
make -j2 --no-print-directory BUILD="$B" all >/dev/null || { echo "bench/cpu_levels.sh: build of $B failed" >&2; exit 1; }
export TANDEM_PROGRESS=off
levels="auto"
for l in generic avx2 avx512; do
  "$B/tests/test_nn_levels" --supports $l && levels="$levels $l"
done
configs="$levels"
if [ -n "$old" ]; then
  for f in bin/train-gpt bin/tandem-bench bin/tandemrun tests/test_gpt_speed; do
    [ -x "$old/$f" ] || { echo "bench/cpu_levels.sh: $old/$f missing (make $old/$f in that tree)" >&2; exit 1; }
  done
  configs="old $configs"
fi
date_tag=$(date +%Y-%m-%d)
out=bench/results/cpu-levels-$date_tag.md
mkdir -p bench/results
log=$(mktemp /tmp/tandem-bench-levels-XXXXXX)
trap 'rm -f "$log"' EXIT

value() { grep -o "$1=[^ ]*" | head -1 | cut -d= -f2; }
median() { sort -g | awk '{ a[NR] = $1 } END { if (NR == 0) { print "nan"; exit } if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
busbw() { awk '$1 == 67108864 { print $7 }' | head -1; }

declare -A gpt gcpu ar
for ((r = 1; r <= rounds; r++)); do
  echo "round $r/$rounds" >&2
  for c in $configs; do
    tree=$B
    env_cpu=()
    if [ "$c" = old ]; then tree=$old; else env_cpu=(env TANDEM_CPU="$c"); fi
    t=$("${env_cpu[@]}" "$tree/bin/train-gpt" --threads 1 --steps "$steps" --sample 0 2>>"$log" | value tokens_per_s)
    gpt[$c]+="$t "
    tc=$("${env_cpu[@]}" "$tree/tests/test_gpt_speed" --threads 1 --steps 10 2>>"$log" | value tokens_per_cpu_s)
    gcpu[$c]+="$tc "
    bw=$("${env_cpu[@]}" "$tree/bin/tandemrun" -np 2 "$tree/bin/tandem-bench" allreduce -b 64M -e 64M -d f32 -o sum \
      2>>"$log" | sed 's/^\[0\] *//' | busbw)
    ar[$c]+="$bw "
    echo "  $c: gpt $t tokens/s, $tc tokens/cpu-s, allreduce 64M busbw $bw GB/s" >&2
  done
done
med() { echo "$1" | tr ' ' '\n' | grep -v '^$' | median; }
kern=$("$B/tests/test_nn_levels" --bench "$rounds")

{
  echo "# CPU levels: speed per level ($date_tag)"
  echo
  echo "Machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, load average at the end: $(cut -d' ' -f1-3 /proc/loadavg);"
  echo "levels this CPU supports: ${levels#auto }. Command: \`bench/cpu_levels.sh --rounds $rounds --steps $steps${old:+ --old $old}\`."
  echo "Rounds interleaved (every configuration once per round), medians of $rounds rounds. The machine"
  echo "was shared with other engineers' builds and tests while this ran: absolute figures are"
  echo "noisy, the comparison within a round is what the interleaving protects."
  echo
  echo "| configuration | GPT 1x1 tokens/s (wall) | GPT 1x1 tokens per CPU second | allreduce 64 MiB shm busbw GB/s | rounds: tokens/s; tokens/CPU-s; busbw |"
  echo "|---|---|---|---|---|"
  for c in $configs; do
    name=$c
    [ "$c" = old ] && name="old build ($old, -march=native)"
    [ "$c" = auto ] && name="auto (default: highest supported)"
    [ "$c" != old ] && [ "$c" != auto ] && name="TANDEM_CPU=$c"
    echo "| $name | $(med "${gpt[$c]}") | $(med "${gcpu[$c]}") | $(med "${ar[$c]}") | ${gpt[$c]}; ${gcpu[$c]}; ${ar[$c]} |"
  done
  echo
  echo "Kernels alone (test_nn_levels --bench $rounds: one thread, per CPU second, levels interleaved):"
  echo
  echo '```'
  echo "$kern"
  echo '```'
} >"$out"
cat "$out"
echo "wrote $out" >&2
