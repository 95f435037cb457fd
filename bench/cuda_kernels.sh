#!/usr/bin/env bash
# Per-kernel timings of Tandem's CUDA kernels (src/nn/cuda, src/train/cuda) at
# GPT-2 124M's shape (B=16, T=1024, C=768, 12 heads, V=50304), bf16 and f32:
# time per call, GB/s and TFLOP/s beside the GPU's memory bandwidth (from its
# name: H200 4.8 TB/s, H100 SXM 3.35, ...; each table says which it used) and
# the H100/H200's compute (989 dense bf16 TFLOP/s, 67 f32). Runs `test_cuda_layers --bench` of a CUDA
# build; meant for scripts/gpu-check on the GPU machine. Writes
# bench/results/cuda-kernels-<date>.md (or $OUT/cuda-kernels.md when OUT is
# set) with the device, driver and toolkit, and prints a few `bench: ` lines
# (the products, attention, the fused classifier, AdamW) for gpu-check's
# summary table. The bf16 table has the attention backward twice, on the
# FlashAttention-2 kernels (src/nn/cuda/flash_attention_mma.cu) in two
# passes (the default) and in one (the one-pass row), the attention forward
# with its output staged through shared memory (the default) and stored
# from the registers (the direct-store rows), the attention at head size 128
# (C / 128 heads: the same flops; the hs128 rows), and the bias
# gradients from cuBLASLt's epilogues beside the column-sum kernel: the A/Bs
# in one run. Then, when python3 has torch with CUDA, PyTorch's kernels
# for the same work at the same shape (bench/torch_kernels.py: its SDPA
# backends, layer norm, cross entropy, embedding backward, fused AdamW) as a
# second table and `bench: torch kernel ...` lines: the library a user would
# pick, measured in the same run (TORCH_KERNELS_S, default 60 s).
#
#   bench/cuda_kernels.sh [BUILD [small]]   (default build; TANDEM_CUDA_MATMUL
#                                   applies as usual; TANDEM_CUDA_ATTENTION
#                                   does not: the rows choose their kernels;
#                                   small: a tiny shape, to try the script on
#                                   the emulator tree build/cudaemu)
set -u
cd "$(dirname "$0")/.."
B=${1:-${BUILD:-build}}
shape=${2:-}
bin=$B/tests/test_cuda_layers
if [ ! -x "$bin" ]; then
  echo "bench: cuda kernels: did not run: $bin missing (a CUDA build makes it: make all with a toolkit)"
  exit 1
fi
if [ -n "${OUT:-}" ]; then out=$OUT/cuda-kernels.md; else out=bench/results/cuda-kernels-$(date -u +%F).md; fi
mkdir -p "$(dirname "$out")"
{
  echo "# CUDA kernels at GPT-2 124M's shape ($(date -u '+%F %H:%M UTC'))"
  echo
  echo "Command: \`bench/cuda_kernels.sh $B\` (\`$bin --bench\`), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')."
  echo
  echo '```'
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv 2>&1 | head -3
  (nvcc --version 2>/dev/null || /usr/local/cuda/bin/nvcc --version 2>/dev/null) | tail -1
  echo '```'
} > "$out"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
timeout -k 5 "${CUDA_KERNELS_BENCH_S:-240}" "$bin" --bench $shape > "$log" 2>&1
rc=$?
if [ $rc != 0 ] || grep -q '^SKIP' "$log"; then
  cat "$log" >> "$out"
  echo "bench: cuda kernels: did not run: exit $rc: $(grep -m1 -E 'FAIL|error|SKIP' "$log" | cut -c1-150)"
  exit 1
fi
cat "$log" >> "$out"
# PyTorch's kernels for the same work at the same shape (bench/torch_kernels.py),
# when the python3 here has torch with CUDA: the library a user would pick,
# in the same run
if timeout 30 python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  if timeout -k 5 "${TORCH_KERNELS_S:-60}" python3 bench/torch_kernels.py --dtype bf16 >> "$log.torch" 2>&1; then
    cat "$log.torch" >> "$out"
    awk -F'|' '/^\| (sdpa|layernorm backward|cross entropy|embedding backward|adamw)/ {
      gsub(/^ +| +$/, "", $2); gsub(/ /, "", $3); gsub(/ /, "", $4); gsub(/ /, "", $5); gsub(/ /, "", $7);
      printf "bench: torch kernel %s %s: %s us, %s GB/s, %s TFLOP/s\n", $2, $3, $4, $5, $7 }' "$log.torch"
  else
    echo "bench: torch kernels: did not run: $(tail -1 "$log.torch" | cut -c1-150)"
  fi
  rm -f "$log.torch"
else
  echo "PyTorch's kernels: not measured (no python3 with torch and a CUDA device here)" >> "$out"
fi
echo "cuda kernels: table in $out" >&2
# one summary line per key row: "bench: kernel NAME TYPE us X tflops Y gbs Z"
awk -F'|' '/^\| (matmul fwd qkv|matmul bwd fc|matmul dW\+dbias|matmul dinp fc2|flash attention|attention (forward|backward) \(unfused\)|softmax xent|adamw|layernorm forward|layernorm backward|encoder backward|global norm|gelu forward)/ {
  gsub(/^ +| +$/, "", $2); gsub(/ /, "", $3); gsub(/ /, "", $4); gsub(/ /, "", $5); gsub(/ /, "", $7);
  printf "bench: kernel %s %s: %s us, %s GB/s, %s TFLOP/s\n", $2, $3, $4, $5, $7 }' "$log"
# whether cuBLASLt gave the bias gradients' epilogues (0: its heuristic had no
# algorithm with them, and the "epilogue" rows ran the column sums)
sed -n 's/^cuBLASLt bias-gradient epilogues (\(.*\)): \([0-9]*\) so far$/bench: kernel cuBLASLt bias-gradient epilogues \1: \2/p' "$log"
