#!/bin/sh
# tandem-ckpt on a real train-gpt checkpoint saved by 2 ranks: info and
# verify succeed and describe it; consolidate writes a safetensors file that
# Python's json and struct read back (every tensor of the manifest, sizes
# adding up to the file); a checkpoint resumed by 3 ranks and by 1 continues
# with the losses of the 2-rank run (same global batch); then a truncated
# data file, a flipped bit, a missing data file and a bad command line each
# give a clear error and the documented exit status (1, or 2 for usage); a
# resume with another global batch is refused unless allowed.
# usage: tool.sh BUILD_TREE
set -u
B=$1
CK="$B/bin/tandem-ckpt"
GPT="$B/bin/train-gpt"
RUN="$B/bin/tandemrun"
PY=/usr/bin/python3
w=$(mktemp -d /tmp/td-s13ckpt-tool-XXXXXX) || exit 1
trap 'rm -rf "$w"' EXIT
export TANDEM_PROGRESS=plain
fail() { echo "FAILED: $*"; exit 1; }
ARGS="--layers 1 --channels 32 --heads 2 --seq 32 --threads 1 --micro-batch 6 --sample 0"
# 2 ranks: 4 steps straight (the reference), and 2 steps saved.
"$RUN" -np 2 "$GPT" $ARGS --steps 4 --metrics "$w/ref.jsonl" >"$w/ref.out" 2>&1 || { cat "$w/ref.out"; fail "reference run"; }
"$RUN" -np 2 "$GPT" $ARGS --steps 2 --save "$w/c" >"$w/s.out" 2>&1 || { cat "$w/s.out"; fail "save run"; }
"$CK" info "$w/c" >"$w/info" 2>&1 || { cat "$w/info"; fail "info"; }
cat "$w/info"
grep -q '^step         2$' "$w/info" || fail "info: no step 2"
grep -q '^saved by     2 ranks at ZeRO stage 0' "$w/info" || fail "info: saved-by line"
grep -q 'rank-1.bin .* params\[[0-9]*,[0-9]*) adamw.m' "$w/info" || fail "info: no pieces of rank-1.bin"
grep -q '^verified .* every size and CRC-32 matches' "$w/info" || fail "info: not verified"
"$CK" verify "$w/c" >"$w/v" 2>&1 || { cat "$w/v"; fail "verify of a good checkpoint"; }
grep -q '^ok: .*step-2 (step 2): 2 files, 6 pieces' "$w/v" || { cat "$w/v"; fail "verify output"; }
"$CK" consolidate "$w/c" "$w/p.safetensors" >"$w/cons" 2>&1 || { cat "$w/cons"; fail "consolidate"; }
n_params=$(sed -n 's/^model .*: \([0-9]*\) parameters in \([0-9]*\) tensors$/\1 \2/p' "$w/info")
[ -n "$n_params" ] || fail "no parameter count in info"
"$PY" - "$w/p.safetensors" $n_params <<'PYEOF' || fail "the safetensors file does not read back"
import json, struct, sys
data = open(sys.argv[1], "rb").read()
n_params, n_tensors = int(sys.argv[2]), int(sys.argv[3])
(hlen,) = struct.unpack("<Q", data[:8])
header = json.loads(data[8:8 + hlen])
meta = header.pop("__metadata__")
assert meta["format"] == "pt" and meta["step"] == "2", meta
assert len(header) == n_tensors, (len(header), n_tensors)
total = 0
for name, t in header.items():
    a, b = t["data_offsets"]
    assert t["dtype"] == "F32" and b - a == 4 * t["shape"][0], (name, t)
    total += b - a
assert total == 4 * n_params and len(data) == 8 + hlen + total, (total, n_params, len(data))
vals = struct.unpack("<%df" % (total // 4), data[8 + hlen:])
assert all(v == v for v in vals), "NaN in the parameters"
print("safetensors: %d tensors, %d parameters, header %d bytes" % (len(header), n_params, hlen))
PYEOF
# Resumed by 3 ranks and by 1: the same steps 3-4 as the 2-rank run.
for np in 3 1; do
  "$RUN" -np $np "$GPT" $ARGS --micro-batch $((12 / np)) --steps 4 --resume "$w/c" --metrics "$w/r$np.jsonl" \
    >"$w/r$np.out" 2>&1 || { cat "$w/r$np.out"; fail "resume at $np ranks"; }
  "$PY" - "$w/ref.jsonl" "$w/r$np.jsonl" <<'PYEOF' || fail "resume at $np ranks: losses differ from the 2-rank run"
import json, sys
ref = {j["step"]: j["loss"] for j in map(json.loads, open(sys.argv[1])) if "step" in j and "loss" in j}
got = {j["step"]: j["loss"] for j in map(json.loads, open(sys.argv[2])) if "step" in j and "loss" in j}
assert sorted(got) == [3, 4], got
for s in got:
    assert abs(got[s] - ref[s]) <= 2e-5 * abs(ref[s]), (s, got[s], ref[s])
print("resumed steps", sorted(got), "losses", [got[s] for s in sorted(got)], "reference", [ref[s] for s in sorted(got)])
PYEOF
done
# Damage.
step=$(cat "$w/c/latest")
expect() { # expect CODE FRAGMENT CMD...
  want=$1 frag=$2
  shift 2
  "$@" >"$w/o" 2>&1
  rc=$?
  cat "$w/o"
  [ $rc = "$want" ] || fail "exit $rc (wanted $want) from $*"
  grep -q -- "$frag" "$w/o" || fail "no \"$frag\" in the message of $*"
}
cp -a "$w/c" "$w/t"
size=$(stat -c %s "$w/t/$step/rank-1.bin")
truncate -s $((size - 1)) "$w/t/$step/rank-1.bin"
expect 1 "rank-1.bin is $((size - 1)) bytes but the manifest says $size: the checkpoint is truncated" "$CK" verify "$w/t"
expect 1 "the checkpoint is truncated" "$CK" info "$w/t"
cp -a "$w/c" "$w/f"
byte=$(od -An -tu1 -j 5000 -N1 "$w/f/$step/rank-0.bin" | tr -d ' ')
printf "$(printf '\\%03o' $((byte ^ 1)))" | dd of="$w/f/$step/rank-0.bin" bs=1 seek=5000 conv=notrunc status=none
expect 1 "rank-0.bin is corrupt: CRC-32 [0-9a-f]* where the manifest says [0-9a-f]*, in bytes \[0, " "$CK" verify "$w/f"
expect 1 "is corrupt" "$CK" consolidate "$w/f" "$w/f.safetensors"
[ ! -e "$w/f.safetensors" ] && [ ! -e "$w/f.safetensors.tmp" ] || fail "consolidate left a file behind"
cp -a "$w/c" "$w/m"
rm "$w/m/$step/rank-1.bin"
expect 1 "the checkpoint is incomplete" "$CK" verify "$w/m"
expect 1 "no checkpoint in $w/nothing" "$CK" verify "$w/nothing"
expect 2 "usage: tandem-ckpt" "$CK" frobnicate "$w/c"
expect 2 "usage: tandem-ckpt" "$CK" consolidate "$w/c"
# Another global batch (2 ranks x 3 = 6, saved with 12): refused naming both
# values and the flag; with --allow-batch-size-change it trains on from step 2.
expect 1 "trained with a global batch of 12 samples, this run's is 6" \
  "$RUN" -np 2 "$GPT" $ARGS --micro-batch 3 --steps 3 --resume "$w/c"
grep -q -- "--allow-batch-size-change" "$w/o" || fail "the refusal does not name --allow-batch-size-change"
"$RUN" -np 2 "$GPT" $ARGS --micro-batch 3 --steps 3 --resume "$w/c" --allow-batch-size-change \
  --metrics "$w/b.jsonl" >"$w/b.out" 2>&1 || { cat "$w/b.out"; fail "--allow-batch-size-change"; }
"$PY" - "$w/b.jsonl" <<'PYEOF' || fail "--allow-batch-size-change: not one step of 6 samples after step 2"
import json, sys
got = [j for j in map(json.loads, open(sys.argv[1])) if "step" in j and "loss" in j]
assert [j["step"] for j in got] == [3], got
print("allowed: step 3 after the 12-sample checkpoint of step 2, loss", got[0]["loss"])
PYEOF
echo ok
