#!/usr/bin/env bash
# Runs kill_rank.py under tandemrun and checks that every survivor reported
# the failure correctly ("kill ok rank R").   kill_rank.sh BUILD_TREE NP VICTIM [join]
set -u
B=$1 np=$2 victim=$3
out=$(PYTHONPATH="$B/python" "$B/bin/tandemrun" --grace 20 -np "$np" /usr/bin/python3 \
      "$(dirname "$0")/kill_rank.py" "$victim" ${4:-} 2>&1)
rc=$?
echo "$out"
[ "$rc" -ne 0 ] || { echo "FAIL: tandemrun exited 0 although rank $victim was killed"; exit 1; }
ok=$(grep -c "kill ok rank" <<<"$out")
[ "$ok" -eq $((np - 1)) ] || { echo "FAIL: $ok of $((np - 1)) survivors reported the failure"; exit 1; }
echo "python kill_rank: ok ($np ranks, rank $victim killed)"
