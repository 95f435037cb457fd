#!/usr/bin/env bash
# tandem-bench's contract: one row per size with exactly the columns
# size_bytes count dtype redop time_us algbw_GBs busbw_GBs wrong, wrong = 0
# with -c 1, busbw = algbw x nccl-tests' factor, exit 0; bad usage exits
# non-zero with a message.
#   bench_smoke.sh BUILD_TREE
set -u
. "$(dirname "$0")/lib.sh"
B=$1
RUN=$B/bin/tandemrun
check_rows() { # COLLECTIVE NP DTYPE OUTPUT
  local coll=$1 np=$2 dtype=$3 out=$4
  awk -v coll="$coll" -v n="$np" -v dtype="$dtype" '
    { sub(/^\[[0-9]+\] /, "") }
    /^#/ { if ($0 ~ /size_bytes +count +dtype +redop +time_us +algbw_GBs +busbw_GBs +wrong/) header = 1; next }
    NF == 0 { next }
    {
      rows++
      if (NF != 8) { print "row with " NF " columns: " $0; bad = 1; next }
      if ($1 !~ /^[0-9]+$/ || $2 !~ /^[0-9]+$/ || $3 != dtype) { print "bad size/count/dtype: " $0; bad = 1 }
      if ($8 != 0) { print "wrong elements: " $0; bad = 1 }
      f = coll == "allreduce" ? 2 * (n - 1) / n : coll == "broadcast" ? 1 : (n - 1) / n
      if ($6 >= 0.2 && ($7 / $6 < f * 0.97 || $7 / $6 > f * 1.03)) { print "busbw/algbw != " f ": " $0; bad = 1 }
      if ($5 <= 0) { print "non-positive time: " $0; bad = 1 }
    }
    END {
      if (!header) { print "no column header line"; bad = 1 }
      if (rows < 3) { print "only " rows " rows"; bad = 1 }
      exit bad
    }' <<<"$out" || fail "$coll (np $np, $dtype): malformed output"
}
for coll in allreduce reduce_scatter allgather broadcast alltoall; do
  out=$("$RUN" -np 3 "$B/bin/tandem-bench" "$coll" -b 4 -e 64K -f 8 -n 3 -w 1 -d bf16 -o max -r 2 2>&1) ||
    { echo "$out"; fail "tandem-bench $coll exited non-zero over shm"; }
  check_rows "$coll" 3 bf16 "$out"
  out=$(TANDEM_TRANSPORT=tcp "$RUN" -np 2 "$B/bin/tandem-bench" "$coll" -b 1K -e 1M -f 32 -n 2 -w 1 -d i64 -o sum 2>&1) ||
    { echo "$out"; fail "tandem-bench $coll exited non-zero over tcp"; }
  check_rows "$coll" 2 i64 "$out"
done
out=$("$RUN" -np 2 "$B/bin/tandem-bench" allreduce -b 1K -e 4M -f 16 -n 4 -w 1 -d f16 -o avg -i 1 2>&1) ||
  { echo "$out"; fail "in-place f16 avg allreduce"; }
check_rows allreduce 2 f16 "$out"
echo "$out"
# bad usage: non-zero exit and a message, never a hang or a crash
for bad in "nosuch" "allreduce -d f99" "allreduce -o nope" "allreduce -b 1M -e 1K" "allreduce -f 1" "alltoall -i 1" \
  "allreduce -b 12Q" "allreduce -b 0"; do
  msg=$("$B/bin/tandem-bench" $bad 2>&1)
  rc=$?
  [ $rc -ne 0 ] && [ $rc -lt 128 ] || fail "tandem-bench $bad: exit $rc"
  grep -q "tandem-bench" <<<"$msg" || fail "tandem-bench $bad: no message"
done
echo "bench_smoke: ok"
