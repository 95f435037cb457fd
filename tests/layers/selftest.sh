#!/usr/bin/env bash
# scripts/check-layers against small objects and a small tree whose arrows
# are known: it must fail on a call or an #include from a lower layer to a
# higher one and on a circle, name the files and symbols, and pass once they
# are gone.
set -u
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d /tmp/tandem-layers.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; echo "---- check-layers output:"; cat "$tmp/out"; exit 1; }

# obj NAME 'C source': compile into $tmp/obj/NAME.o (NAME like src/base/a)
obj() {
  mkdir -p "$tmp/obj/$(dirname "$1")" "$tmp/src"
  printf '%s\n' "$2" >"$tmp/src/$(basename "$1").c"
  cc -c -o "$tmp/obj/$1.o" "$tmp/src/$(basename "$1").c" || exit 1
}

# base calls up into net; nn's c and d call each other; obs stands alone
obj src/base/a 'int net_b(void); int base_a(void) { return net_b(); }'
obj src/net/b 'int net_b(void) { return 1; }'
obj src/nn/c 'int nn_d(void); int nn_c(void) { return nn_d(); }'
obj src/nn/d 'int nn_c(void); int nn_d(int x) { return x ? nn_c() : 0; }'
obj src/obs/e 'static int quiet(void) { return 0; } int obs_e(void) { return quiet(); }'
set -- "$tmp"/obj/src/*/*.o
scripts/check-layers --objects "$tmp" "$@" >"$tmp/out" 2>&1
[ $? -eq 1 ] || fail "exit $? with an upward call and a circle, expected 1"
grep -q "src/base/a (base) -> src/net/b (net): net_b" "$tmp/out" || fail "the upward call base -> net is not named"
grep -q "objects: 2 of 5 files in 1 circle(s)" "$tmp/out" || fail "not exactly one circle of 2 among 5 files"
grep -q "circle of 2: src/nn/c src/nn/d" "$tmp/out" || fail "the circle c <-> d is not named"
grep -q "src/nn/c -> src/nn/d: nn_d" "$tmp/out" || fail "the arrow c -> d is not named with its symbol"
grep -q "src/nn/d -> src/nn/c: nn_c" "$tmp/out" || fail "the arrow d -> c is not named with its symbol"
grep -q "quiet" "$tmp/out" && fail "a static function was taken for an arrow"

# the same, untied: net calls down into base, d no longer calls c
obj src/base/a 'int base_a(void) { return 0; }'
obj src/net/b 'int base_a(void); int net_b(void) { return base_a(); }'
obj src/nn/d 'int nn_d(int x) { return x; }'
scripts/check-layers --objects "$tmp" "$@" >"$tmp/out" 2>&1 || fail "exit $? once untied, expected 0"
grep -q "objects: 0 of 5 files in 0 circle(s)" "$tmp/out" || fail "a circle reported where none is"
grep -q "net        1 files  uses: base" "$tmp/out" || fail "the layer picture does not show net using base"
# includes: base reaching up into net's header fails, net including base's passes
mkdir -p "$tmp/tree/src/base" "$tmp/tree/src/net"
printf '#include "net/net.h"\n' >"$tmp/tree/src/base/base.c"
printf '#include "base/base.h"\n' >"$tmp/tree/src/net/net.h"
: >"$tmp/tree/src/base/base.h"
scripts/check-layers --includes "$tmp/tree" >"$tmp/out" 2>&1
[ $? -eq 1 ] || fail "exit $? with an upward include, expected 1"
grep -q "src/base/base.c (base) includes src/net/net.h (net)" "$tmp/out" || fail "the upward include is not named"
grep -q "1 include(s) from a lower layer" "$tmp/out" || fail "not exactly one upward include"
printf '#include "base/base.h"\n' >"$tmp/tree/src/base/base.c"
scripts/check-layers --includes "$tmp/tree" >"$tmp/out" 2>&1 || fail "exit $? once the include points down, expected 0"
echo "PASS: check-layers names an upward include, an upward call and a circle (with their symbols), and passes once they are gone"
