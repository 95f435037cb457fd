#!/usr/bin/env bash
# The CPU cost of tandemrun's lossy-host watch per hour (bench/lossy_cost.c):
# a sock_diag sample, a store request and a ping per host every 0.1 s,
# measured in a fresh network namespace (tandemrun's own connections only)
# with CONNS loopback connection pairs open. Needs root (unshare -n).
#
#   bench/lossy_cost.sh [BUILD] [CONNS] [ROUNDS] [HOSTS]   (build, 14, 5000, 2)
set -eu
cd "$(dirname "$0")/.."
B=${1:-build}
CONNS=${2:-14}
ROUNDS=${3:-5000}
HOSTS=${4:-2}
gcc -O2 -Iinclude -Isrc bench/lossy_cost.c "$B/lib/libtandem.a" $(pkg-config --libs libsodium) -lm -lpthread \
  -o "$B/lossy_cost"
echo "load: $(uptime)"
for r in 1 2 3; do
  unshare -n sh -c 'ip link set lo up && "$0" "$1" "$2" "$3"' "$B/lossy_cost" "$CONNS" "$ROUNDS" "$HOSTS"
  /usr/bin/time -f "round $r: user %U s, sys %S s" unshare -n sh -c 'ip link set lo up && "$0" "$1" "$2" "$3" >/dev/null' \
    "$B/lossy_cost" "$CONNS" "$ROUNDS" "$HOSTS"
done
echo "load: $(uptime)"
