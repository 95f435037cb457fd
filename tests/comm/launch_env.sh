#!/usr/bin/env bash
# Starts N processes by hand with another launcher's variables, as mpirun or
# torchrun would, and checks that they form one world without tandemrun.
#   launch_env.sh BUILD_TREE self|ompi|torchrun N PROGRAM [ARGS...]
# self: one process with no launcher variables (a world of one; N must be 1).
# ompi: OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}, TANDEM_STORE unset,
#       rank 0 hosts the store on TANDEM_STORE_PORT.
# torchrun: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT.
# Every process must exit 0 within the caller's timeout.
set -u
. "$(dirname "$0")/lib.sh"
B=$1 mode=$2 n=$3
shift 3
port=$(free_port) || fail "no free port found"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pids=()
for ((r = 0; r < n; r++)); do
  # A connect timeout below the suite's limit: if rank 0 cannot host the
  # store, its peers report that themselves instead of being cut off.
  case $mode in
  self) vars=() ;;
  ompi) vars=(OMPI_COMM_WORLD_RANK=$r OMPI_COMM_WORLD_SIZE=$n OMPI_COMM_WORLD_LOCAL_RANK=$r
    OMPI_COMM_WORLD_LOCAL_SIZE=$n TANDEM_STORE_PORT=$port TANDEM_CONNECT_TIMEOUT=15) ;;
  torchrun) vars=(RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port
    TANDEM_CONNECT_TIMEOUT=15) ;;
  *) fail "unknown mode $mode" ;;
  esac
  (clean_env "${vars[@]}" "$@" >"$tmp/out.$r" 2>&1; echo $? >"$tmp/rc.$r") &
  pids+=($!)
done
# A process that fails makes its peers fail too (they lose it), so waiting
# for all of them terminates; the suite's timeout stops a hang.
status=0
for ((r = 0; r < n; r++)); do
  wait "${pids[$r]}"
  sed "s/^/[$mode $r] /" "$tmp/out.$r"
  rc=$(cat "$tmp/rc.$r" 2>/dev/null || echo missing)
  if [ "$rc" != 0 ]; then
    echo "FAIL: rank $r exited with $rc" >&2
    status=1
  fi
done
[ $status -eq 0 ] && echo "launch_env: ok ($mode, $n processes)"
exit $status
