#!/usr/bin/env bash
# hvd.join()'s descriptor on a training step: the GPT of examples/python
# through DistributedOptimizer, 2 ranks, with TANDEM_JOIN=1 (default) and 0,
# rounds interleaved; CPU seconds of all ranks from this shell's children.
#   bench/py_join_gpt.sh > raw.txt
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 PYTHONPATH=build/python
for r in 1 2 3; do
  for v in 1 0; do
    echo "# round $r TANDEM_JOIN=$v load $(cut -d' ' -f1 /proc/loadavg)"
    s0=$(awk '{print $14+$15+$16+$17}' /proc/$$/stat)
    TANDEM_JOIN=$v timeout 300 build/bin/tandemrun -np 2 /usr/bin/python3 examples/python/train_gpt_hvd.py --steps 6 2>&1 | grep -E '^\[0\] (tandem|losses)'
    s1=$(awk '{print $14+$15+$16+$17}' /proc/$$/stat)
    echo "cpu_s_all_ranks $(( (s1 - s0) / $(getconf CLK_TCK) ))"
  done
done
echo END
