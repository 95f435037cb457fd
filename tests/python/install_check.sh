#!/usr/bin/env bash
# `make install` into a scratch DESTDIR, then use what it installed the way
# a user would: a C program built only from `pkg-config tandem` runs a
# 2-rank allreduce under the installed tandemrun, and Debian's
# /usr/bin/python3 imports the installed package from the directory it
# searches for PREFIX (checked against its own sys.path), at 1 and 2 ranks.
#   install_check.sh BUILD_TREE
set -u
B=$1
tmp=$(mktemp -d /tmp/tandem-install-check.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
prefix=/usr/local
root=$tmp/root
make -s install BUILD="$B" DESTDIR="$root" PREFIX="$prefix" >"$tmp/make.log" 2>&1 ||
  { cat "$tmp/make.log"; fail "make install DESTDIR=$root failed"; }
inst=$root$prefix
for f in lib/libtandem.a lib/libtandem.so include/tandem/tandem.h include/tandem/comm.h bin/tandemrun \
         lib/pkgconfig/tandem.pc; do
  [ -e "$inst/$f" ] || fail "make install did not install $prefix/$f"
done
grep -q "^prefix=$prefix\$" "$inst/lib/pkgconfig/tandem.pc" || fail "tandem.pc does not name prefix=$prefix"

# C: flags from pkg-config only (its prefix moved to the scratch root)
pc() { PKG_CONFIG_PATH="$inst/lib/pkgconfig" pkg-config --define-variable=prefix="$inst" "$@" tandem; }
cat >"$tmp/prog.c" <<'C'
#include <stdio.h>
#include <tandem/tandem.h>
int main(void) {
  td_comm *c = NULL;
  if (td_comm_init(&c) != TD_OK) { fprintf(stderr, "init: %s\n", td_last_error()); return 1; }
  int n = td_comm_size(c), r = td_comm_rank(c);
  double x[3] = {r + 1.0, 2.0 * (r + 1), 0.5};
  if (td_allreduce(x, x, 3, TD_F64, TD_SUM, c) != TD_OK) { fprintf(stderr, "%s\n", td_comm_last_error(c)); return 1; }
  double s = n * (n + 1) / 2.0;
  int ok = x[0] == s && x[1] == 2 * s && x[2] == 0.5 * n;
  printf("rank %d: %s\n", r, ok ? "sum ok" : "WRONG SUM");
  ok = ok && td_comm_finalize(c) == TD_OK;
  td_comm_destroy(c);
  return ok ? 0 : 1;
}
C
# shellcheck disable=SC2046
cc -std=c11 $(pc --cflags) "$tmp/prog.c" -o "$tmp/prog" $(pc --libs --static) ||
  fail "a program built with pkg-config tandem's flags does not compile or link"
# the scratch root is not in ld.so's cache (a real install: run ldconfig once)
out=$(LD_LIBRARY_PATH="$inst/lib" "$inst/bin/tandemrun" -np 2 "$tmp/prog" 2>&1) || { echo "$out"; fail "the pkg-config program failed"; }
[ "$(grep -c "sum ok" <<<"$out")" -eq 2 ] || { echo "$out"; fail "not every rank got the closed-form sum"; }

# Python: the directory make install chose is on Debian's python3's own path
site=$(/usr/bin/python3 -c 'import sys; print("\n".join(sys.path))' | grep -x "$prefix/lib/python3[.0-9]*/dist-packages" | head -1)
[ -n "$site" ] || fail "/usr/bin/python3 searches no $prefix/lib/python3*/dist-packages"
[ -d "$root$site/tandem/torch" ] || fail "make install did not put the package in $site (what /usr/bin/python3 searches)"
cat >"$tmp/use.py" <<'PY'
import torch, tandem, tandem.torch as hvd
hvd.init()
assert tandem.__file__.startswith(__import__("os").environ["EXPECT_DIR"]), tandem.__file__
t = hvd.allreduce(torch.full((4,), float(hvd.rank() + 1)), op=hvd.Sum)
n = hvd.size()
assert torch.equal(t, torch.full((4,), n * (n + 1) / 2)), t
print(f"python ok rank {hvd.rank()}", flush=True)
hvd.shutdown()
PY
for np in 1 2; do
  out=$(env -u PYTHONPATH PYTHONPATH="$root$site" EXPECT_DIR="$root$site" PYTHONDONTWRITEBYTECODE=1 \
        "$inst/bin/tandemrun" -np $np /usr/bin/python3 "$tmp/use.py" 2>&1) ||
    { echo "$out"; fail "the installed Python package failed at $np ranks"; }
  [ "$(grep -c "python ok" <<<"$out")" -eq $np ] || { echo "$out"; fail "not every rank ran"; }
done
echo "install_check: ok (pkg-config C program at 2 ranks; Python package in $site at 1 and 2 ranks)"
