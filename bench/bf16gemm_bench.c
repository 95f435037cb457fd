/* GEMM micro-benchmark for bench/bf16gemm.sh: Tandem's bf16 product
 * (nn_gemm_lowp_x at the avx512bf16 level), its f32 products (the linear
 * layers' own AVX-512 kernels, nn_gemm / nn_gemm_tn) and OpenBLAS's sgemm,
 * at the shapes of one training step of the GPT reference configuration (4
 * layers, C 256, B 8 x T 128 = 1024 rows, vocabulary 256), one thread.
 *
 * Each product is called the way the model calls it: forward C = A W^T with
 * A's bf16 copy (written by the layer before), the input gradient dout W,
 * the weight gradient dout^T inp with inp's bf16 copy. Timing is the
 * thread's CPU time (CLOCK_THREAD_CPUTIME_ID), not wall time: the machine
 * this runs on is shared, and CPU time is what a quiet machine's wall time
 * would be. The variants alternate call by call within each round (no
 * variant always runs after the same one's cache footprint); medians over
 * rounds. GFLOP/s is 2MNK over the median, next to this core's peaks
 * measured here first (24 independent vdpbf16ps / vfmadd chains on
 * registers: what a product could reach if memory and packing were free).
 *
 *   bf16gemm_bench [ROUNDS]       (default 15)
 *
 * Built by bench/bf16gemm.sh against build/lib/libtandem.a (uses the
 * library's internal kernel tables, src/nn/nn_kernels.h). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nn/nn_kernels.h"

#include <immintrin.h>

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float uniform(void) {
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static double cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* GFLOP/s of 24 independent chains of vdpbf16ps (bf16 != 0) or vfmadd231ps
 * on registers, 512-bit (64 and 32 flops per instruction), per CPU second */
__attribute__((target("avx512f,avx512bf16"))) static double peak(int bf16) {
  __m512 acc[24];
  for (int i = 0; i < 24; i++) acc[i] = _mm512_setzero_ps();
  __m512 x = _mm512_set1_ps(1e-9f);
  long n = 4000000;
  double t0 = cpu_s();
  for (long i = 0; i < n; i++) {
    if (bf16) {
#pragma GCC unroll 24
      for (int j = 0; j < 24; j++) acc[j] = _mm512_dpbf16_ps(acc[j], (__m512bh)x, (__m512bh)x);
    } else {
#pragma GCC unroll 24
      for (int j = 0; j < 24; j++) acc[j] = _mm512_fmadd_ps(x, x, acc[j]);
    }
    __asm__ volatile("" : "+v"(x)); /* one operand the compiler cannot hoist */
  }
  double t = cpu_s() - t0;
  float sum = 0;
  for (int i = 0; i < 24; i++) sum += _mm512_reduce_add_ps(acc[i]);
  if (sum == 12345.0f) printf(" ");
  return n * 24.0 * (bf16 ? 64 : 32) / t * 1e-9;
}

/* kinds of product in a linear layer */
enum { FWD, DINP, DW };
typedef struct shape {
  const char *name;
  int kind, N, IC, OC; /* rows (B T), input and output features */
  int per_step;        /* how many per training step */
} shape;

int main(int argc, char **argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 15;
  if (rounds < 1 || rounds > 201) {
    fprintf(stderr, "usage: bf16gemm_bench [ROUNDS (1-201)]\n");
    return 2;
  }
  if (td_cpu_supported() < TD_CPU_AVX512BF16) {
    printf("bf16gemm_bench: needs AVX512-BF16 (this CPU: %s)\n", td_cpu_level_name(td_cpu_supported()));
    return 0;
  }
  td_nn_set_threads(1);
  const nn_kernels *k16 = nn_kernels_for(TD_CPU_AVX512BF16), *k32 = nn_kernels_for(TD_CPU_AVX512);
  enum { BT = 1024, C = 256, V = 256, L = 4 };
  /* MxNxK of each: FWD (BT x OC x IC), DINP (BT x IC x OC), DW (OC x IC x BT) */
  const shape shapes[] = {
      {"fwd qkv", FWD, BT, C, 3 * C, L},     {"fwd attproj", FWD, BT, C, C, L},
      {"fwd fc", FWD, BT, C, 4 * C, L},      {"fwd fc2", FWD, BT, 4 * C, C, L},
      {"fwd head", FWD, BT, C, V, 1},        {"dinp qkv", DINP, BT, C, 3 * C, L},
      {"dinp attproj", DINP, BT, C, C, L},   {"dinp fc", DINP, BT, C, 4 * C, L},
      {"dinp fc2", DINP, BT, 4 * C, C, L},   {"dinp head", DINP, BT, C, V, 1},
      {"dW qkv", DW, BT, C, 3 * C, L},       {"dW attproj", DW, BT, C, C, L},
      {"dW fc", DW, BT, C, 4 * C, L},        {"dW fc2", DW, BT, 4 * C, C, L},
      {"dW head", DW, BT, C, V, 1},
  };
  size_t big = (size_t)BT * 4 * C;
  float *inp = malloc(big * sizeof(float)), *w = malloc(big * sizeof(float)), *dout = malloc(big * sizeof(float));
  float *out = malloc(big * sizeof(float));
  uint16_t *inp16 = malloc(big * sizeof(uint16_t));
  if (!inp || !w || !dout || !out || !inp16) return 1;
  for (size_t i = 0; i < big; i++) inp[i] = uniform(), w[i] = 0.05f * uniform(), dout[i] = 0.01f * uniform();
  k16->k_nn_to_bf16(inp16, inp, big);

  double peak16 = peak(1), peak32 = peak(0);
  printf("one thread, CPU time, %d rounds (variants alternating), medians; this core's peaks (measured now, registers "
         "only): vdpbf16ps %.0f, f32 FMA %.0f GFLOP/s\n",
         rounds, peak16, peak32);
  printf("%-13s %16s %8s %8s %8s %9s %9s\n", "product", "M x N x K", "bf16", "f32 own", "sgemm", "bf16/own",
         "bf16/sgemm");
  double step[3] = {0, 0, 0}, step_flop = 0;
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    const shape *sh = &shapes[s];
    int N = sh->N, IC = sh->IC, OC = sh->OC, M, Nn, K;
    if (sh->kind == FWD) M = N, Nn = OC, K = IC;
    else if (sh->kind == DINP) M = N, Nn = IC, K = OC;
    else M = OC, Nn = IC, K = N;
    double t[3][201];
    for (int r = 0; r < rounds; r++)
      for (int i = 0; i < 3; i++) {
        int v = (r + i) % 3; /* the order rotates round by round */
        double t0 = cpu_s();
        int ok = 1;
        if (sh->kind == FWD) {
          if (v == 0)
            ok = k16->k_nn_gemm_lowp_x(TD_BF16, 0, 1, M, Nn, K, inp, inp16, IC, w, NULL, IC, NULL, 0, NULL, out, Nn,
                                       NULL, NN_GEMM_PLAIN, NULL, NULL);
          else if (v == 1)
            ok = k32->k_nn_gemm(1, M, Nn, K, inp, IC, w, IC, NULL, 0, NULL, out, Nn);
          else
            k32->k_td_sgemm(0, 1, M, Nn, K, 1.0f, inp, IC, w, IC, 0.0f, out, Nn);
        } else if (sh->kind == DINP) {
          if (v == 0)
            ok = k16->k_nn_gemm_lowp_x(TD_BF16, 0, 0, M, Nn, K, dout, NULL, OC, w, NULL, IC, NULL, 0, NULL, out, Nn,
                                       NULL, NN_GEMM_PLAIN, NULL, NULL);
          else if (v == 1)
            ok = k32->k_nn_gemm(0, M, Nn, K, dout, OC, w, IC, NULL, 0, NULL, out, Nn);
          else
            k32->k_td_sgemm(0, 0, M, Nn, K, 1.0f, dout, OC, w, IC, 0.0f, out, Nn);
        } else {
          if (v == 0)
            ok = k16->k_nn_gemm_lowp_x(TD_BF16, 1, 0, M, Nn, K, dout, NULL, OC, inp, inp16, IC, out, Nn, NULL, out,
                                       Nn, NULL, NN_GEMM_PLAIN, NULL, NULL); /* accumulated, as the model does */
          else if (v == 1)
            ok = k32->k_nn_gemm_tn(M, Nn, K, dout, OC, inp, IC, out, Nn, NULL);
          else
            k32->k_td_sgemm(1, 0, M, Nn, K, 1.0f, dout, OC, inp, IC, 0.0f, out, Nn);
        }
        if (!ok) {
          fprintf(stderr, "bf16gemm_bench: %s variant %d declined the product (out of memory?)\n", sh->name, v);
          return 1;
        }
        t[v][r] = cpu_s() - t0;
      }
    double med[3], flop = 2.0 * M * Nn * K;
    for (int v = 0; v < 3; v++) {
      qsort(t[v], (size_t)rounds, sizeof(double), cmp_double);
      med[v] = t[v][rounds / 2];
      step[v] += med[v] * sh->per_step;
    }
    step_flop += flop * sh->per_step;
    char dims[32];
    snprintf(dims, sizeof dims, "%dx%dx%d", M, Nn, K);
    printf("%-13s %16s %8.1f %8.1f %8.1f %8.2fx %8.2fx\n", sh->name, dims, flop / med[0] * 1e-9, flop / med[1] * 1e-9,
           flop / med[2] * 1e-9, med[1] / med[0], med[2] / med[0]);
  }
  printf("%-13s %16s %8.1f %8.1f %8.1f %8.2fx %8.2fx\n", "one step", "(weighted)", step_flop / step[0] * 1e-9,
         step_flop / step[1] * 1e-9, step_flop / step[2] * 1e-9, step[1] / step[0], step[2] / step[0]);
  printf("one step's linear products: bf16 %.1f ms, f32 own %.1f ms, sgemm %.1f ms of CPU (%.2f GFLOP); at the peaks: "
         "bf16 %.1f ms (%.0f%% reached), f32 %.1f ms (own: %.0f%% reached)\n",
         step[0] * 1e3, step[1] * 1e3, step[2] * 1e3, step_flop * 1e-9, step_flop / peak16 * 1e-6,
         100.0 * step_flop / step[0] * 1e-9 / peak16, step_flop / peak32 * 1e-6,
         100.0 * step_flop / step[1] * 1e-9 / peak32);
  free(inp), free(w), free(dout), free(out), free(inp16);
  return 0;
}
