#!/usr/bin/env bash
# cJSON is optional (Makefile): every source file that mentions it must
# compile without it. A full build with HAVE_CJSON=0 takes minutes, so this
# compiles just those files (those that name cJSON) the way such a build would: no -DTD_HAVE_CJSON,
# and a poisoned <cjson/cJSON.h> first on the include path, so that an
# unguarded #include fails even on a machine where libcjson-dev is installed.
# Usage: tests/build/check_optional.sh BUILD_TREE (its flags: make -n)
set -u
cd "$(dirname "$0")/../.."
B=${1:-build}
tmp=$(mktemp -d /tmp/tandem-nocjson.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/poison/cjson"
echo '#error "cJSON.h included in a build without cJSON: guard the #include with #ifdef TD_HAVE_CJSON"' \
  > "$tmp/poison/cjson/cJSON.h"
# The compiler flags of this tree with cJSON taken out.
san=0; opt=-O3
case "$B" in *asan*) san=1; opt=-O1 ;; esac
flags=$(make -s --no-print-directory -f - print-cflags BUILD="$B" SAN=$san OPT="$opt" HAVE_CJSON=0 <<'MK'
include Makefile
print-cflags:
	@echo $(CFLAGS)
MK
)
[ -n "$flags" ] || { echo "FAIL: could not read CFLAGS from the Makefile"; exit 1; }
case " $flags " in *TD_HAVE_CJSON*) echo "FAIL: HAVE_CJSON=0 still defines TD_HAVE_CJSON: $flags"; exit 1 ;; esac
files=$(grep -rl 'cJSON' src tools examples --include='*.c' | sort)
[ -n "$files" ] || { echo "FAIL: no file mentions cJSON (the check would prove nothing)"; exit 1; }
rc=0; n=0
for f in $files; do
  n=$((n + 1))
  # shellcheck disable=SC2086
  # -MF: the tree's -MMD would otherwise leave an a-NAME.d in the current directory
  if ! gcc $flags -Werror=implicit-function-declaration -I"$tmp/poison" -fsyntax-only -MF "$tmp/deps.d" "$f" 2>"$tmp/err"; then
    echo "FAIL: $f does not compile without cJSON:"; sed 's/^/    /' "$tmp/err" | head -20; rc=1
  fi
done
[ $rc = 0 ] && echo "PASS: $n files that mention cJSON compile without it"
exit $rc
