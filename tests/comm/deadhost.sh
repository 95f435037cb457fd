#!/usr/bin/env bash
# A host is lost: 4 ranks on two hosts (network namespaces a and b, ranks 0
# and 1 on a, which also hosts the store, 2 and 3 on b), then the link
# between them is cut. Every rank must fail with TD_ERR_REMOTE naming a rank
# of the other host and its address, within TEST_BOUND seconds of the cut,
# and exit; nothing may hang. See tests/comm/test_heartbeat.c (mode cut).
#   deadhost.sh BUILD_TREE blocked|idle down|drop BOUND_S [VAR=VALUE...]
# blocked: the ranks are inside 16 MiB allreduces when the link goes;
# idle: they are between operations (and learn it from td_comm_status).
# down: b's interface goes down; drop: every packet is lost both ways with
# the link up. VAR=VALUE pairs go to every rank's environment.
# Needs root (namespaces): without it the test fails, saying so.
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
. "$here/../lib/netns.sh"
B=$1 scenario=$2 cut=$3 bound=$4
shift 4
prog=$(cd "$B/tests" && pwd)/test_heartbeat
[ -x "$prog" ] || fail "$prog not built"

netns_init
tmp=$(mktemp -d "/tmp/td-deadhost-$$.XXXXXX")
NETNS_ON_EXIT='rm -rf "$tmp"'
netns_add_host a 10.77.5.1
netns_add_host b 10.77.5.2

# The job secret the hardened transport asks for off loopback (256 bits, hex).
secret=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
unset_args=()
for v in "${LAUNCHER_VARS[@]}"; do unset_args+=(-u "$v"); done
n=4
pids=()
for ((r = 0; r < n; r++)); do
  if [ $r -lt 2 ]; then host=a addr=10.77.5.1 lost="2@10.77.5.2,3@10.77.5.2"
  else host=b addr=10.77.5.2 lost="0@10.77.5.1,1@10.77.5.1"; fi
  netns_spawn $host env "${unset_args[@]}" RANK=$r WORLD_SIZE=$n LOCAL_RANK=$((r % 2)) LOCAL_WORLD_SIZE=2 \
    MASTER_ADDR=10.77.5.1 MASTER_PORT=29500 TANDEM_HOST_ADDR=$addr TANDEM_JOB_ID=deadhost-$$ \
    TANDEM_SECRET=$secret TANDEM_CONNECT_TIMEOUT=20 TEST_DIR="$tmp" TEST_SCENARIO=$scenario TEST_LOST=$lost \
    TEST_BOUND=$bound "$@" "$prog" cut >"$tmp/out.$r" 2>&1
  pids+=("$NETNS_PID")
done

show() { local k; for ((k = 0; k < n; k++)); do sed "s/^/[rank $k] /" "$tmp/out.$k"; done; }
# Every rank has finished its warm-up allreduce, over the link, before the cut.
deadline=$((SECONDS + 30))
for ((r = 0; r < n; r++)); do
  while [ ! -e "$tmp/ready.$r" ]; do
    [ $SECONDS -ge $deadline ] && { show; fail "rank $r never finished its warm-up allreduce"; }
    kill -0 "${pids[$r]}" 2>/dev/null || { show; fail "rank $r exited before its warm-up allreduce finished"; }
    sleep 0.05
  done
done
sleep 0.5 # blocked: well inside the allreduces by now
# The time is taken before the cut, so the latency the ranks measure from
# it is never less than the true one; the file appears after the cut.
awk '{print $1}' /proc/uptime >"$tmp/cut.new"
netns_cut b "$cut"
mv "$tmp/cut.new" "$tmp/cut"
echo "deadhost: cut ($cut) the link of host b at boot time $(cat "$tmp/cut") s"

# Nothing may hang: every rank exits within the bound (plus start-up slack).
deadline=$((SECONDS + ${bound%.*} + 15))
status=0
for ((r = 0; r < n; r++)); do
  while kill -0 "${pids[$r]}" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
  if kill -0 "${pids[$r]}" 2>/dev/null; then
    echo "FAIL: rank $r still runs $((${bound%.*} + 15)) s after the cut" >&2
    status=1
    continue
  fi
  wait "${pids[$r]}"
  rc=$?
  [ $rc -eq 0 ] || { echo "FAIL: rank $r exited with $rc" >&2; status=1; }
done
show
ok=$(cat "$tmp"/out.* | grep -c 'heartbeat-cut ok')
[ "$ok" -eq $n ] || { echo "FAIL: $ok of $n ranks reported the lost host correctly" >&2; status=1; }
[ $status -eq 0 ] && echo "deadhost: ok ($scenario, $cut): every rank failed naming the other host"
exit $status
