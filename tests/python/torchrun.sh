#!/bin/sh
# tests/python/torchrun.sh BUILD NPROC: a real torchrun job of NPROC workers
# (torch.distributed.run's agent, through tests/python/torchrun.py, which
# fixes Debian's torch 1.13 under Python 3.11), each running
# tests/python/torchrun_job.py. The agent serves torch's TCPStore on a free
# MASTER_PORT; the job's secret is a 0600 file (TANDEM_SECRET_FILE), as a
# launcher other than tandemrun needs (docs/security.md).
set -eu
B=$1
N=$2
dir=$(mktemp -d /tmp/tandem-torchrun.XXXXXX)
trap 'rm -rf "$dir"' EXIT
umask 077
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/secret"
port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
env PYTHONPATH="$B/python" PYTHONDONTWRITEBYTECODE=1 TANDEM_SECRET_FILE="$dir/secret" OMP_NUM_THREADS=1 \
  /usr/bin/python3 tests/python/torchrun.py --nnodes=1 --nproc_per_node="$N" --master_addr=127.0.0.1 \
  --master_port="$port" --max_restarts=0 --monitor_interval=1 tests/python/torchrun_job.py
