#!/usr/bin/env bash
# The PyTorch doors where communication decides the speed (issue 19 item 13):
# a DDP job and a Horovod-style job on a 100M-parameter model with a small
# batch (bench/py_doors.py says what each contender runs), Tandem against
# gloo side by side, 2 ranks of 1 thread each:
#   shm   one host: tandemrun -np 2 (Tandem over shared memory, gloo over
#         loopback TCP, as each runs on one host)
#   tcp   two network-namespace hosts with their own sshd
#         (tests/lib/sshhosts.sh), one rank each, started by tandemrun -H over
#         ssh from host a: both over TCP across the veth bridge
# Rounds interleave the contenders (the machine is shared: each round runs
# every one once, in turn); the compute-only floor (no communication) and
# the gradient's allreduce alone (gloo and tandem) run in each round too. Needs root for the namespaces (the tcp part; skipped
# with a note otherwise).
# CONTENDERS="buckets,gloo buckets,tandem" times the gradient's allreduce as
# DDP's buckets (not in the default set); DOOR_ARGS="--batch 1" passes
# options to every py_doors.py run (DOOR_ARGS=--timeline: each run also
# prints one extra step's backward timeline, and the allreduce door every
# rank's per-call wall, CPU and machine load, see bench/py_doors.py).
#   [PARTS="shm tcp"] [CONTENDERS="ddp,gloo ..."] [DOOR_ARGS=...] bench/py_doors.sh [ROUNDS] [STEPS] [MODELS] > raw.txt
#   bench/py_summarize_doors.py raw.txt > bench/results/py-doors-DATE.md
set -u
cd "$(dirname "$0")/.."
rounds=${1:-3} steps=${2:-6} models=${3:-"embed mlp"}
PARTS=${PARTS:-"shm tcp"}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 PYTHONPATH=$PWD/build/python
RUN=$PWD/build/bin/tandemrun PY=/usr/bin/python3
# DOOR BACKEND pairs; CONTENDERS="ddp,gloo ddp,tandem" runs a subset
read -r -a CONTENDERS <<<"${CONTENDERS:-compute,- ddp,gloo ddp,tandem ddpavg,tandem hvd,gloo hvd,tandem allreduce,gloo allreduce,tandem}"
# The CPU priority of this script's session (autogroup), which the ranks
# started over ssh must share: sshd gives each login a session of its own,
# and so a scheduling group of its own at nice 0, so without this the tcp
# ranks of a run through bench-lane.sh (nice -10) competed with every other
# session on the machine as equals while the shm part's ranks did not.
prio=$(sed -n 's/.*nice //p' /proc/self/autogroup 2>/dev/null)
prio=${prio:-0}
echo "# machine: $(getconf _NPROCESSORS_ONLN) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD), autogroup nice $prio"

one() { # PART MODEL DOOR BACKEND LAUNCH...
  local part=$1 model=$2 door=$3 backend=$4
  shift 4
  local be=()
  [ "$backend" != - ] && be=(--backend "$backend")
  # shellcheck disable=SC2086  # DOOR_ARGS: extra py_doors.py options, word-split on purpose
  "$@" $PY "$PWD/bench/py_doors.py" --model "$model" --door "$door" "${be[@]}" --steps "$steps" ${DOOR_ARGS:-} 2>&1 |
    grep -E '^\[0\] model=|^\[[0-9]+\] calls |rror' | head -6 |
    sed "s/^\[[0-9]*\] /part=$part load=$(cut -d' ' -f1 /proc/loadavg) /"
}

for part in $PARTS; do
  launch=()
  if [ "$part" = shm ]; then
    launch=(timeout 600 "$RUN" -np 2)
  else
    if [ "$(id -u)" != 0 ]; then
      echo "# tcp part skipped: network namespaces need root"
      continue
    fi
    . tests/lib/sshhosts.sh
    work=$(mktemp -d /tmp/tandem-pydoors-XXXXXX)
    NETNS_TAG_PREFIX=pd
    NETNS_ON_EXIT='rm -rf "$work"'
    sshhosts_init "$work/ssh"
    sshhosts_add a 10.77.16.1
    sshhosts_add b 10.77.16.2
    # From host a itself: rank 0 (on a) hosts torch's store at MASTER_ADDR,
    # and gloo binds the namespace's eth0 (its hostname resolves nowhere).
    # Each rank first joins this script's priority (its autogroup's nice).
    launch=(netns_run a timeout 600 "$RUN" -np 2 -H 10.77.16.1:1,10.77.16.2:1
            sh -c 'echo "$0" >/proc/self/autogroup 2>/dev/null; exec "$@"' "$prio"
            env MASTER_ADDR=10.77.16.1 GLOO_SOCKET_IFNAME=eth0)
  fi
  for model in $models; do
    for r in $(seq "$rounds"); do
      echo "# part $part model $model round $r"
      for c in "${CONTENDERS[@]}"; do
        one "$part" "$model" "${c%,*}" "${c#*,}" "${launch[@]}"
      done
    done
  done
done
