#!/bin/sh
# tests/python/torchrun.sh BUILD NPROC [c]: a real torchrun job of NPROC
# workers (torch.distributed.run's agent, through tests/python/torchrun.py,
# which fixes Debian's torch 1.13 under Python 3.11). The agent serves
# torch's TCPStore on a free MASTER_PORT; the job's secret is a 0600 file
# (TANDEM_SECRET_FILE), as a launcher other than tandemrun needs
# (docs/security.md).
#   default: each worker runs tests/python/torchrun_job.py (Python finds
#            Tandem's store through the agent's);
#   c:       each worker is a C program (test_collectives --quick, closed
#            forms): first without TANDEM_STORE_PORT, which must fail naming
#            the agent's port and the variable, then with it.
set -eu
B=$1
N=$2
mode=${3:-python}
dir=$(mktemp -d /tmp/tandem-torchrun.XXXXXX)
trap 'rm -rf "$dir"' EXIT
umask 077
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/secret"
free_port() { /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
agent() { # AGENT-ARGS...: the agent on a free MASTER_PORT
  env PYTHONPATH="$B/python" PYTHONDONTWRITEBYTECODE=1 TANDEM_SECRET_FILE="$dir/secret" OMP_NUM_THREADS=1 \
    TANDEM_CONNECT_TIMEOUT=20 /usr/bin/python3 tests/python/torchrun.py --nnodes=1 --nproc_per_node="$N" \
    --master_addr=127.0.0.1 --master_port="$(free_port)" --max_restarts=0 --monitor_interval=1 "$@"
}
if [ "$mode" = python ]; then
  agent tests/python/torchrun_job.py
  exit
fi
if agent --no_python "$B/tests/test_collectives" --quick >"$dir/out" 2>&1; then
  cat "$dir/out"
  echo "FAIL: a C program under the torchrun agent started without TANDEM_STORE_PORT" >&2
  exit 1
fi
grep -q "whose own store listens on MASTER_PORT .*Set TANDEM_STORE_PORT" "$dir/out" || {
  cat "$dir/out"
  echo "FAIL: the refusal does not name the agent's port and TANDEM_STORE_PORT" >&2
  exit 1
}
echo "without TANDEM_STORE_PORT: $(grep -m1 -o 'rank [0-9]* of [0-9]* was started by a torchrun agent[^;]*' "$dir/out")"
TANDEM_STORE_PORT=$(free_port)
export TANDEM_STORE_PORT
agent --no_python "$B/tests/test_collectives" --quick
