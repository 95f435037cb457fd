#!/usr/bin/env bash
# Checks a build tree's objects for the CPU-level split (Makefile
# KERNEL_SRCS, src/nn/nn_kernels.h, src/base/cpu.c):
#  1. no object outside the per-level kernel objects uses a wider register
#     than SSE (xmm): a ymm or zmm instruction there could run before the run
#     time chose a level, and fault on a CPU without AVX (the classic trap:
#     an inline helper from a header compiled with the wrong flags);
#  2. the generic level objects use no ymm/zmm, the avx2 ones no zmm;
#  3. every global a level object defines ends in _<level>, so that nothing
#     outside the dispatch table can reach a level's code by its plain name;
#  4. a level object calls no kernel by its plain (dispatched) name, so that
#     a kernel calls kernels of its own level.
# Usage: tests/base/check_levels.sh BUILD_TREE
set -u
B=${1:?usage: check_levels.sh BUILD_TREE}
lib="$B/lib/libtandem.a"
[ -f "$lib" ] || { echo "no $lib: build the tree first"; exit 1; }
fail=0
levels="generic avx2 avx512 avx512bf16"
tmp=$(mktemp -d /tmp/check_levels.$$.XXXX)
trap 'rm -rf "$tmp"' EXIT

# Per member of the library (archive members are what links into programs;
# stale objects in $B/obj are not): "member count" of instructions naming a
# ymm or zmm register, and of zmm alone.
objdump -d --no-show-raw-insn "$lib" | awk '
  /^[^ \t].*\.o:[ \t]+file format/ { m = $1; sub(/:$/, "", m); seen[m] = 1; next }
  /%ymm[0-9]/ { y[m]++ } /%zmm[0-9]/ { z[m]++ }
  END { for (m in seen) print m, y[m] + 0, z[m] + 0 }' | sort > "$tmp/regs"
n_plain=0 n_level=0
while read -r m ny nz; do
  case "$m" in
    *.generic.o) [ $((ny + nz)) -eq 0 ] || { echo "FAIL $m: $ny ymm + $nz zmm instructions at level generic"; fail=1; } ;;
    *.avx2.o) [ "$nz" -eq 0 ] || { echo "FAIL $m: $nz zmm instructions at level avx2"; fail=1; } ;;
    *.avx512.o | *.avx512bf16.o) ;;
    *) [ $((ny + nz)) -eq 0 ] || { echo "FAIL $m: $ny ymm + $nz zmm instructions in an object built for baseline x86-64"; fail=1; }
       n_plain=$((n_plain + 1)); continue ;;
  esac
  n_level=$((n_level + 1))
done < "$tmp/regs"
for o in $(find "$B/obj/tools" "$B/obj/examples" -name '*.o' 2>/dev/null); do
  n=$(objdump -d --no-show-raw-insn "$o" | grep -Ec '%(ymm|zmm)[0-9]')
  [ "$n" -eq 0 ] || { echo "FAIL $o: $n ymm/zmm instructions in a program object"; fail=1; }
  n_plain=$((n_plain + 1))
done
echo "baseline objects: $n_plain checked for ymm/zmm; level objects: $n_level"
[ "$n_level" -ge 15 ] || { echo "FAIL: expected the kernel objects of each of: $levels"; fail=1; }

# the kernel names, from the table list (the public, dispatched names)
cat src/nn/nn_kernels.h src/base/reduce_kernels.h | grep -o 'X([a-z_0-9]*)' | sed 's/X(\(.*\))/\1/' | sort -u > "$tmp/kernels"
[ -s "$tmp/kernels" ] || { echo "FAIL: no kernel names found in the kernel headers"; exit 1; }
nm "$lib" 2>/dev/null | awk '
  /^[^ \t].*\.o:$/ { m = $1; sub(/:$/, "", m); next }
  NF == 3 && $2 ~ /^[TDRB]$/ { print m, "def", $3 }
  NF == 2 && $1 == "U" { print m, "use", $2 }' > "$tmp/syms"
for l in $levels; do
  bad=$(awk -v l="$l" '$1 ~ "\\." l "\\.o$" && $2 == "def" && $3 !~ "_" l "$" { print $1 ": " $3 }' "$tmp/syms")
  [ -z "$bad" ] || { echo "FAIL: globals without the _$l suffix in level objects:"; echo "$bad"; fail=1; }
  plain=$(awk -v l="$l" '$1 ~ "\\." l "\\.o$" && $2 == "use" { print $3 }' "$tmp/syms" | grep -Fxf "$tmp/kernels")
  [ -z "$plain" ] || { echo "FAIL: level $l objects call dispatched names (not their level's): $plain"; fail=1; }
done
[ $fail -eq 0 ] && echo "ok: only the level objects use AVX registers; level globals all suffixed"
exit $fail
