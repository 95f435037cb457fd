#!/usr/bin/env bash
# Start-up under srun against tandemrun (issue 22 item 1; target: srun's
# <= 1.2x tandemrun's), on a real Slurm cluster of namespace hosts
# (tests/lib/slurmcluster.sh; root, slurm-wlm and munge). The same 4-rank,
# 2-node train-gpt job, started round by round by each launcher on the same
# two nodes, n1 and n2: `srun -N2 --ntasks-per-node=2` (a fresh allocation
# each time: Slurm's scheduling is part of srun's start-up) and `tandemrun
# -np 4 -H n1:2,n2:2` (remote ranks over ssh, as tandemrun starts them on a
# cluster without Slurm). Two figures per round, both wall clock from the
# moment the launcher command starts:
#   to step 1   until rank 0 logs step 1 in its metrics file (its "time");
#               rendezvous, wiring and one step, no training afterwards
#   whole job   until the launcher exits after --steps 1 (tear-down included)
# Reports the medians and the median of the per-round ratios. Writes
# bench/results/slurm-startup-<date>.md.
#
#   bench/slurm_startup.sh [--rounds N]
set -u
cd "$(dirname "$0")/.."
rounds=9
while [ $# -gt 0 ]; do
  case "$1" in
  --rounds) rounds=$2; shift 2 ;;
  *) echo "usage: bench/slurm_startup.sh [--rounds N]" >&2; exit 2 ;;
  esac
done
B=${BUILD:-build}
make -j2 "$B/bin/tandemrun" "$B/bin/train-gpt" >/dev/null || { echo "slurm_startup.sh: build failed" >&2; exit 1; }
. tests/lib/slurmcluster.sh
if why=$(slurm_missing); then echo "slurm_startup.sh: cannot run: $why" >&2; exit 1; fi
GPT=$(cd "$B/bin" && pwd)/train-gpt
RUN=$(cd "$B/bin" && pwd)/tandemrun
work=$(mktemp -d /tmp/tandem-slurm-bench-XXXXXX)
chmod 711 "$work"
NETNS_TAG_PREFIX=sb
NETNS_ON_EXIT='rm -rf "$work"'
slurm_init "$work/c" 10.77.18 n1 n2
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/secret"
chmod 600 "$work/secret"
export TANDEM_SECRET_FILE=$work/secret TANDEM_PROGRESS=off
ARGS="--layers 2 --channels 64 --heads 2 --seq 64 --threads 1 --sample 0 --micro-batch 3 --steps 1"
load_start=$(cut -d' ' -f1-3 /proc/loadavg)

one() { # NAME CMD...: prints "to_step1 whole"
  local name=$1 t0 t1 step1
  shift
  rm -f "$work/$name.jsonl"
  t0=$(date +%s.%N)
  slurm_run "$@" --metrics "$work/$name.jsonl" >"$work/$name.out" 2>&1 ||
    { cat "$work/$name.out" >&2; echo "slurm_startup.sh: the $name job failed" >&2; exit 1; }
  t1=$(date +%s.%N)
  step1=$(sed -n 's/.*"time":\([0-9.]*\).*/\1/p' "$work/$name.jsonl" | head -1)
  [ -n "$step1" ] || { echo "slurm_startup.sh: no step 1 in the $name job's metrics" >&2; exit 1; }
  awk -v a="$t0" -v s="$step1" -v b="$t1" 'BEGIN { printf "%.3f %.3f\n", s - a, b - a }'
}
: >"$work/rows"
for r in $(seq 1 "$rounds"); do
  s=$(one srun timeout 60 srun -N2 --ntasks-per-node=2 -w n1,n2 "$GPT" $ARGS)
  t=$(one tandemrun timeout 60 "$RUN" -np 4 -H 10.77.18.1:2,10.77.18.2:2 "$GPT" $ARGS)
  echo "$r $s $t" >>"$work/rows"
  echo "round $r: srun $s, tandemrun $t (to step 1, whole job; s)"
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
mkdir -p bench/results
res="bench/results/slurm-startup-$(date -u +%F).md"
python3 - "$work/rows" "$res" "$rounds" "$load_start" "$load_end" "$(nproc)" <<'PY'
import statistics, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1])]
res, rounds, l0, l1, cores = sys.argv[2:]
med = lambda i: statistics.median(r[i] for r in rows)
ratio = lambda i, j: statistics.median(r[i] / r[j] for r in rows)
with open(res, "w") as f:
    f.write("# Start-up under srun against tandemrun (bench/slurm_startup.sh)\n\n")
    f.write("4-rank, 2-node train-gpt (--layers 2 --channels 64 --steps 1), the same two namespace-host nodes\n")
    f.write("of a real Slurm cluster (slurm-wlm 22.05, munge; tests/lib/slurmcluster.sh); srun -N2\n")
    f.write("--ntasks-per-node=2 (a fresh allocation per run) against tandemrun -np 4 -H n1:2,n2:2 (ssh).\n")
    f.write("Wall clock from the launcher's start: to rank 0's step-1 metrics line, and to the launcher's exit.\n")
    f.write("Rounds interleaved. Machine: %s cores shared with other users; load %s at the start, %s at the end.\n\n" % (cores, l0, l1))
    f.write("| round | srun to step 1 (s) | srun whole (s) | tandemrun to step 1 (s) | tandemrun whole (s) |\n|---|---|---|---|---|\n")
    for r in rows:
        f.write("| %d | %.3f | %.3f | %.3f | %.3f |\n" % tuple([int(r[0])] + r[1:]))
    f.write("| median | %.3f | %.3f | %.3f | %.3f |\n\n" % (med(1), med(2), med(3), med(4)))
    f.write("Median of the per-round ratios srun / tandemrun: to step 1 %.2f, whole job %.2f (target <= 1.2).\n"
            % (ratio(1, 3), ratio(2, 4)))
print(open(res).read())
PY
