#!/usr/bin/env bash
# Python bindings vs their peers, side by side in one run, rounds interleaved
# (the machine is shared: every round runs each contender once, in turn):
#   - the GPT of shared/peers/torch_gpt_ddp.py, 2 ranks x 1 thread:
#     tandem.torch.DistributedOptimizer, init_process_group("tandem") + DDP,
#     and DDP over gloo (the same script, --backend gloo), tokens/s;
#     the losses of each against one process on the whole batch; and the
#     same step with no communication at all (bench/py_gpt_compute.py, 2
#     processes side by side): the floor no backend can beat;
#   - allreduce from Python (tandem.torch allreduce_) vs C's tandem-bench
#     (malloc'd buffers, -R 0, in place), 4 KiB latency and 64 MiB busbw.
#     The 4 KiB Python line runs twice: as shipped (each tandem.torch call
#     preceded by hvd.join()'s 64-byte descriptor) and with TANDEM_JOIN=0.
# OMP_NUM_THREADS=1 and OPENBLAS_NUM_THREADS=1 for every side: Debian's torch
# ignores set_num_threads for its OpenBLAS products.
#   bench/python.sh [ROUNDS] [STEPS] > raw.txt; bench/py_summarize.py raw.txt
set -u
cd "$(dirname "$0")/.."
rounds=${1:-3} steps=${2:-6}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 PYTHONPATH=build/python
RUN=build/bin/tandemrun PY=/usr/bin/python3 EX=examples/python
echo "# machine: $(getconf _NPROCESSORS_ONLN) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# single process on the whole batch (16 samples), for the loss reference"
$RUN -np 1 $PY $EX/train_gpt_hvd.py --batch 16 --steps "$steps" 2>&1 | sed 's/^\[0\] /single /'
for r in $(seq "$rounds"); do
  echo "# round $r, load $(cut -d' ' -f1 /proc/loadavg)"
  $RUN -np 2 $PY $EX/train_gpt_hvd.py --steps "$steps" 2>&1 | grep -E '^\[0\] (tandem|losses)' | sed 's/^\[0\] /hvd /'
  $RUN -np 2 $PY $EX/train_gpt_ddp.py --steps "$steps" --backend tandem 2>&1 | grep -E '^\[0\] (ddp|losses)' | sed 's/^\[0\] /ddp-tandem /'
  $RUN -np 2 $PY $EX/train_gpt_ddp.py --steps "$steps" --backend gloo 2>&1 | grep -E '^\[0\] (ddp|losses)' | sed 's/^\[0\] /ddp-gloo /'
  $RUN -np 2 $PY bench/py_gpt_compute.py --steps "$steps" 2>&1 | grep -E '^\[0\] compute' | sed 's/^\[0\] //'
  $RUN -np 2 build/bin/tandem-bench allreduce -b 4K -e 4K -n 20000 -w 2000 -R 0 -i 1 2>&1 | grep -E '^\[0\] +4096' | sed 's/^\[0\]/c-4K/'
  $RUN -np 2 $PY bench/py_allreduce.py 4096 2>&1 | grep '^\[0\] py' | sed 's/^\[0\]/py-4K/'
  TANDEM_JOIN=0 $RUN -np 2 $PY bench/py_allreduce.py 4096 2>&1 | grep '^\[0\] py' | sed 's/^\[0\]/py-4K-nojoin/'
  $RUN -np 2 build/bin/tandem-bench allreduce -b 64M -e 64M -n 20 -w 3 -R 0 -i 1 2>&1 | grep -E '^\[0\] +67108864' | sed 's/^\[0\]/c-64M/'
  $RUN -np 2 $PY bench/py_allreduce.py 67108864 2>&1 | grep '^\[0\] py' | sed 's/^\[0\]/py-64M/'
done
