#!/usr/bin/env bash
# Allreduce side by side with the peers (DESIGN.md §6, issue 2 §9): Tandem over
# shared memory (buffers from td_mem_alloc, and from malloc) and over TCP, Open MPI over shared memory and over TCP, and
# PyTorch's gloo, 2 ranks, f32 sum, sizes 4 KiB .. 256 MiB (x4 steps), in one
# run. Rounds are interleaved (every program once per round, BENCH_ROUNDS
# rounds, default 3) and the median time per size is reported, because the
# machine is shared and noisy. Writes bench/results/allreduce-<date>.md with
# the table, the ratios, the machine and the exact commands; raw outputs go
# to $BUILD/bench-logs/.
#
#   bench/run.sh                 (as root: installs missing peers with apt-get)
#   BUILD=build/x bench/run.sh   use another build tree (built or brought up to date first)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
B=${BUILD:-build}
peers=$(cd "$repo/../shared/peers" && pwd)
rounds=${BENCH_ROUNDS:-3}
np=2
sizes=(4096 16384 65536 262144 1048576 4194304 16777216 67108864 268435456)
logdir=$B/bench-logs
mkdir -p "$logdir" bench/results

# ---- peers: Open MPI and PyTorch (Debian packages), installed if missing
need=()
command -v mpicc >/dev/null 2>&1 || need+=(libopenmpi-dev)
command -v mpirun >/dev/null 2>&1 || need+=(openmpi-bin)
/usr/bin/python3 -c 'import torch' >/dev/null 2>&1 || need+=(python3-torch)
if [ ${#need[@]} -gt 0 ]; then
  echo "bench: installing ${need[*]}"
  if [ "$(id -u)" -ne 0 ]; then echo "bench: run as root, or: apt-get install ${need[*]}" >&2; exit 1; fi
  apt-get install -y "${need[@]}" >/dev/null || { apt-get update >/dev/null && apt-get install -y "${need[@]}" >/dev/null; }
fi

# ---- builds
# Always (incremental): the figures must come from the tree they are labelled with.
make -j2 --no-print-directory BUILD="$B" all >/dev/null
mkdir -p "$B/peers"
mpicc -O2 -o "$B/peers/mpi_allreduce" "$peers/mpi_allreduce.c"
gcc -O3 -march=native -fopenmp -o "$B/peers/membw" "$peers/membw.c"

# ---- the programs, each printing one row per size
tb_args=(allreduce -b 4K -e 256M -f 4 -n 1000 -w 3 -T 256M -c 1 -i 1)
declare -A cmd
cmd[tandem-shm]="$B/bin/tandemrun -np $np $B/bin/tandem-bench ${tb_args[*]}"
cmd[tandem-shm-malloc]="$B/bin/tandemrun -np $np $B/bin/tandem-bench ${tb_args[*]} -R 0"
cmd[tandem-tcp]="env TANDEM_TRANSPORT=tcp $B/bin/tandemrun -np $np $B/bin/tandem-bench ${tb_args[*]}"
cmd[mpi-shm]="mpirun --allow-run-as-root --oversubscribe -np $np $B/peers/mpi_allreduce ${sizes[*]}"
cmd[mpi-tcp]="mpirun --allow-run-as-root --oversubscribe --mca btl tcp,self -np $np $B/peers/mpi_allreduce ${sizes[*]}"
cmd[gloo]="/usr/bin/python3 $peers/torch_allreduce.py $np ${sizes[*]}"
order=(tandem-shm tandem-shm-malloc tandem-tcp mpi-shm mpi-tcp gloo)

stamp=$(date +%F)
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for ((r = 1; r <= rounds; r++)); do
  for p in "${order[@]}"; do
    echo "bench: round $r/$rounds: $p"
    if ! ${cmd[$p]} >"$logdir/$p.$r.log" 2>&1; then
      echo "bench: $p failed in round $r:" >&2
      tail -n 20 "$logdir/$p.$r.log" >&2
      exit 1
    fi
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
echo "bench: memory bandwidth (membw)"
"$B/peers/membw" >"$logdir/membw.log" 2>&1

# ---- the machine
machine="$(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores online \
($(lscpu | sed -n 's/^Thread(s) per core: *//p') thread(s) per core), \
$(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo) memory, kernel $(uname -r), $(. /etc/os-release && echo "$PRETTY_NAME")"
versions="tandem $(git -C "$repo" rev-parse --short HEAD) (working tree); $(mpirun --version 2>&1 | head -1); torch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)' 2>/dev/null)"

out=bench/results/allreduce-$stamp.md
args=(--np "$np" --rounds "$rounds" --logdir "$logdir" --machine "$machine" --versions "$versions"
  --membw "$logdir/membw.log" --out "$out" --load "before $load_before, after $load_after")
for p in "${order[@]}"; do args+=(--program "$p=${cmd[$p]}"); done
/usr/bin/python3 bench/summarize.py "${args[@]}"
echo "bench: wrote $out"
