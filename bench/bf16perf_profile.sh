#!/usr/bin/env bash
# Where a training step's CPU time goes, fp32 against bf16 (issue 9: "profile
# first"), and the bound it sets on the bf16/fp32 ratio.
#
#   bench/bf16perf_profile.sh [--steps N]      (needs perf: Debian linux-perf)
#
# train-gpt, reference configuration, 1 rank x 1 thread, under `perf record`
# (cpu-clock samples: CPU time, not wall time, so other jobs' load stretches
# it less). Kernels are grouped by what they do; each group's share of the
# samples, and its CPU ms per step (share x rank 0's CPU ms per step as
# train-gpt reports it; the start-up's page clearing, in "kernel", is
# outside that figure and is left out of it). Then the bound: the ratio if
# the bf16 products ran at the measured vdpbf16ps peak with the rest as
# measured, and if they were free.
set -u
cd "$(dirname "$0")/.."
steps=60
while [ $# -gt 0 ]; do
  case "$1" in
  --steps) steps=$2; shift 2 ;;
  *) echo "usage: bench/bf16perf_profile.sh [--steps N]" >&2; exit 2 ;;
  esac
done
command -v perf >/dev/null || { echo "bench/bf16perf_profile.sh: perf not found (apt-get install linux-perf)" >&2; exit 1; }
B=${BUILD:-build}
make -j2 --no-print-directory BUILD="$B" all >/dev/null || { echo "bench/bf16perf_profile.sh: build of $B failed" >&2; exit 1; }
export TANDEM_PROGRESS=off
tmp=$(mktemp -d /tmp/tandem-bf16perf-profile-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
echo "load before: $(uptime | sed 's/.*load average: //')"
for prec in fp32 bf16; do
  flag=""; [ $prec = bf16 ] && flag=--bf16
  perf record -q -o "$tmp/$prec.data" "$B/bin/train-gpt" --threads 1 --steps "$steps" --sample 0 $flag >"$tmp/$prec.out" 2>/dev/null
  perf report -i "$tmp/$prec.data" --no-children --sort symbol 2>/dev/null | grep -E '^ +[0-9]' >"$tmp/$prec.rep"
done
echo "load after: $(uptime | sed 's/.*load average: //')"
awk -v steps="$steps" '
  function group(s) {
    if (s ~ /^(bf_tile|gemm_tile|nn_gemm_ep|nn_gemm_tn|nn_gemm_[a-z0-9]+$|td_sgemm|sgemm_|dgemm_)/) return "linear products (tiles)";
    if (s ~ /^(bf_pack|gemm_pack|nn_gemm_lowp|nn_to_bf16)/) return "packing + f32->bf16 conversion";
    if (s ~ /^(att_tile|atb_|transpose_panel|copy_rows|nn_attention|td_attention|nn_exp_shift_sum)/) return "attention";
    if (s ~ /^td_layernorm/) return "layer norm";
    if (s ~ /gelu/) return "GELU (separate passes)";
    if (s ~ /softmax_xent|__logf/) return "softmax + loss";
    if (s ~ /^td_adamw/) return "AdamW";
    if (s ~ /^td_sum_squares/) return "gradient norm";
    if (s ~ /^td_embedding/) return "embedding";
    if (s ~ /^(__memmove|__memset|__memcpy|linear_backward)/) return "copies, bias sums";
    if ($2 == "[k]") return "kernel (mostly start-up page clearing)";
    return "other";
  }
  FNR == 1 { prec = FILENAME; sub(/.*\//, "", prec); sub(/\.rep$/, "", prec) }
  { p = $1; sub("%", "", p); g = group($3); share[prec, g] += p; names[g] = 1; if (g ~ /^kernel/) kern[prec] += p }
  END {
    for (pr in kern) ;
  }
  END {
    n = 0
    for (g in names) order[++n] = g
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (share["fp32", order[j]] > share["fp32", order[i]]) { t = order[i]; order[i] = order[j]; order[j] = t }
    printf "| group | fp32 %% | bf16 %% |\n|---|---|---|\n"
    for (i = 1; i <= n; i++) printf "| %s | %.1f | %.1f |\n", order[i], share["fp32", order[i]], share["bf16", order[i]]
  }' "$tmp/fp32.rep" "$tmp/bf16.rep" >"$tmp/table"
cpu32=$(grep -o 'cpu_ms_per_step=[^ ]*' "$tmp/fp32.out" | cut -d= -f2)
cpu16=$(grep -o 'cpu_ms_per_step=[^ ]*' "$tmp/bf16.out" | cut -d= -f2)
echo
echo "CPU ms per step (rank 0, after warm-up): fp32 $cpu32, bf16 $cpu16"
echo
cat "$tmp/table"
# ms per step: the shares renormalised without the start-up's kernel time
awk -F'|' -v c32="$cpu32" -v c16="$cpu16" '
  NR > 2 { g = $2; gsub(/^ +| +$/, "", g); a[g] = $3 + 0; b[g] = $4 + 0; if (g ~ /^kernel/) { k32 = $3 + 0; k16 = $4 + 0 } }
  END {
    printf "\nCPU ms per step by group (start-up kernel time left out):\n\n| group | fp32 ms | bf16 ms |\n|---|---|---|\n"
    for (g in a) if (g !~ /^kernel/) {
      x = a[g] / (100 - k32) * c32; y = b[g] / (100 - k16) * c16
      printf "| %s | %.1f | %.1f |\n", g, x, y
      if (g ~ /^linear products/) { p32 = x; p16 = y }
      if (g ~ /^packing/) { k16p = y }
    }
    rest16 = c16 - p16 - k16p
    flop = 2 * 3 * 1024 * (4 * 12 * 256 * 256 + 256 * 256)
    peak = flop / 411e9 * 1e3
    printf "\nbf16 products: %.1f ms/step = %.0f GFLOP/s (%.1f GFLOP per step in the linear layers; vdpbf16ps peak 411/core: %.1f ms)\n", p16, flop / (p16 * 1e-3) / 1e9, flop / 1e9, peak
    printf "Bound on bf16/fp32 (CPU): as measured %.2f; products at peak, packing as measured %.2f; products at peak and no packing %.2f; products free %.2f\n", c32 / c16, c32 / (peak + k16p + rest16), c32 / (peak + rest16), c32 / (k16p + rest16)
  }' "$tmp/table"
