#!/usr/bin/env bash
# examples/python from the source tree, as README.md and docs/python.md show them (only
# PYTHONPATH set): the Horovod-style and the DDP-style script at 2 ranks
# print per-step losses of the whole batch, which must equal one process
# training on that whole batch (np 1, twice the per-rank batch) within
# 1e-5 relative. A tiny GPT keeps it to seconds.   examples_check.sh BUILD_TREE
set -u
B=$1
cd "$(dirname "$0")/../.."
small="--layers 1 --embd 32 --heads 2 --seq 16 --steps 3"
run() {  # np script batch
  env PYTHONPATH="$B/python" OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1 \
    "$B/bin/tandemrun" -np "$1" /usr/bin/python3 "examples/python/$2" $small --batch "$3" 2>&1
}
losses() { sed -n 's/^\(\[0\] \)\{0,1\}losses //p' <<<"$1"; }
ref_out=$(run 1 train_gpt_hvd.py 4) || { echo "$ref_out"; echo "FAIL: single-process run"; exit 1; }
ref=$(losses "$ref_out")
[ -n "$ref" ] || { echo "$ref_out"; echo "FAIL: no losses line from the single-process run"; exit 1; }
for s in train_gpt_hvd.py train_gpt_ddp.py; do
  out=$(run 2 $s 2) || { echo "$out"; echo "FAIL: $s at 2 ranks"; exit 1; }
  got=$(losses "$out")
  /usr/bin/python3 - "$ref" "$got" "$s" <<'PY' || exit 1
import sys
ref, got, name = [float(v) for v in sys.argv[1].split()], [float(v) for v in sys.argv[2].split()], sys.argv[3]
assert len(ref) == len(got) == 5, (name, ref, got)
bad = [(i, a, b) for i, (a, b) in enumerate(zip(ref, got)) if abs(a - b) > 1e-5 * abs(a)]
if bad:
    sys.exit(f"FAIL: {name} at 2 ranks differs from one process on the whole batch: {bad}")
print(f"{name}: 2 ranks = 1 process within 1e-5: {got}")
PY
done
echo "examples_check: ok"
