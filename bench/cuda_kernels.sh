#!/usr/bin/env bash
# Per-kernel timings of Tandem's CUDA kernels (src/nn/cuda, src/train/cuda) at
# GPT-2 124M's shape (B=16, T=1024, C=768, 12 heads, V=50304), bf16 and f32:
# time per call, GB/s and TFLOP/s beside the H100 SXM's bounds (3.35 TB/s,
# 989 dense bf16 TFLOP/s, 67 f32). Runs `test_cuda_layers --bench` of a CUDA
# build; meant for scripts/gpu-check on the GPU machine. Writes
# bench/results/cuda-kernels-<date>.md (or $OUT/cuda-kernels.md when OUT is
# set) with the device, driver and toolkit, and prints a few `bench: ` lines
# (the products, attention, the fused classifier, AdamW) for gpu-check's
# summary table.
#
#   bench/cuda_kernels.sh [BUILD [small]]   (default build; TANDEM_CUDA_MATMUL
#                                   and TANDEM_CUDA_ATTENTION apply as usual;
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
echo "cuda kernels: table in $out" >&2
# one summary line per key row: "bench: kernel NAME TYPE us X tflops Y gbs Z"
awk -F'|' '/^\| (matmul fwd qkv|matmul bwd fc|flash attention|attention (forward|backward) \(unfused\)|softmax xent|adamw|layernorm forward|gelu forward)/ {
  gsub(/^ +| +$/, "", $2); gsub(/ /, "", $3); gsub(/ /, "", $4); gsub(/ /, "", $5); gsub(/ /, "", $7);
  printf "bench: kernel %s %s: %s us, %s GB/s, %s TFLOP/s\n", $2, $3, $4, $5, $7 }' "$log"
