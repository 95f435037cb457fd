/* Half-precision matrix products (src/nn/matmul_bf16.c, nn_gemm_lowp) at
 * every CPU level this machine runs, against double-precision references.
 *
 * The reference rounds each operand to bf16 (bits) or f16 (arithmetic), both
 * written here, multiplies and sums in double. The kernel
 * accumulates in f32, whose rounding errors grow like sqrt(K) in practice
 * (the worst case, K, would be too loose to see anything): the allowed error
 * is |C - ref| <= 2^-20 sqrt(K + 2) sum_k |a_k b_k| + 1e-30. A kernel that
 * did not round its operands is off by ~2^-9 sqrt(K) of a typical product
 * (bf16's precision), outside the bound; the test checks that directly.
 *
 * Shapes: 1 and odd sizes, edges of the tiles (12 x 32) and of the blocks
 * (96 rows, 256 deep, 512 wide: 97, 257, 520), all four transpositions,
 * beta 0 (C full of NaN: must not be read) and 1, a bias, ldc > N (the
 * padding must stay untouched), K = 0.
 *
 * --bench ROUNDS: the GPT reference configuration's linear-layer products,
 * single-threaded, bf16 at avx512bf16 against the f32 products at avx512
 * (the layers' own nn_gemm/nn_gemm_tn) and OpenBLAS's sgemm, interleaved
 * rounds, medians, GFLOP/s next to this CPU's peaks. */
#include <stdint.h>
#include <time.h>

#include "../common/check.h"
#include "nn/nn_kernels.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float uniform(void) {
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* f16 nearest-even by arithmetic: the quantum is 2^(e - 11) for |x| in
 * [2^(e-1), 2^e), never below the subnormal step 2^-24; past 65520: inf */
static double round_f16(double x) {
  if (x == 0) return x;
  int e;
  frexp(x, &e);
  double q = ldexp(1.0, (e - 11 < -24) ? -24 : e - 11);
  double r = nearbyint(x / q) * q;
  return fabs(r) >= 65520.0 ? copysign(INFINITY, x) : r;
}

static double ref_round(float x, td_dtype dtype) {
  if (dtype == TD_F16) return round_f16(x);
  uint32_t u;
  memcpy(&u, &x, 4);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u; /* nearest even (no NaN here) */
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static size_t n_checked, n_far_from_f32;

static void check_case(const nn_kernels *k, const char *level, td_dtype dtype, int ta, int tb, int M, int N, int K,
                       float beta, int with_bias) {
  int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 5; /* strides wider than the rows */
  size_t na = (size_t)(ta ? K : M) * lda + 1, nb = (size_t)(tb ? N : K) * ldb + 1, nc = (size_t)M * ldc + 1;
  float *A = malloc(na * sizeof(float)), *B = malloc(nb * sizeof(float)), *C = malloc(nc * sizeof(float));
  float *C0 = malloc(nc * sizeof(float)), *bias = malloc((size_t)(N + 1) * sizeof(float));
  CHECK(A && B && C && C0 && bias);
  for (size_t i = 0; i < na; i++) A[i] = uniform();
  for (size_t i = 0; i < nb; i++) B[i] = uniform();
  for (int j = 0; j < N; j++) bias[j] = uniform();
  for (size_t i = 0; i < nc; i++) C0[i] = beta == 0.0f ? NAN : uniform();
  /* the padding columns hold a sentinel either way */
  for (int i = 0; i < M; i++)
    for (int j = N; j < ldc; j++) C0[(size_t)i * ldc + j] = 12345.0f;
  memcpy(C, C0, nc * sizeof(float));
  CHECK(k->k_nn_gemm_lowp(dtype, ta, tb, M, N, K, A, lda, B, ldb, beta, with_bias ? bias : NULL, C, ldc) == 1);
  for (int i = 0; i < M; i++) {
    for (int j = 0; j < N; j++) {
      double ref = 0, mag = 0, exact = 0;
      for (int kk = 0; kk < K; kk++) {
        float a = ta ? A[(size_t)kk * lda + i] : A[(size_t)i * lda + kk];
        float b = tb ? B[(size_t)j * ldb + kk] : B[(size_t)kk * ldb + j];
        double p = ref_round(a, dtype) * ref_round(b, dtype);
        ref += p;
        mag += fabs(p);
        exact += (double)a * b;
      }
      double base = (beta == 0.0f ? 0.0 : (double)beta * C0[(size_t)i * ldc + j]) + (with_bias ? bias[j] : 0.0);
      double got = C[(size_t)i * ldc + j], want = ref + base;
      double tol = ldexp(1.0, -20) * sqrt(K + 2.0) * (mag + fabs(base)) + 1e-30;
      if (!(fabs(got - want) <= tol))
        td_test_fail(__FILE__, __LINE__,
                     "%s %s ta=%d tb=%d M=%d N=%d K=%d beta=%g bias=%d: C[%d][%d] = %.9g, reference %.9g (tol %.3g)",
                     level, td_dtype_name(dtype), ta, tb, M, N, K, beta, with_bias, i, j, got, want, tol);
      if (fabs(got - (exact + base)) > 2 * tol) n_far_from_f32++;
      n_checked++;
    }
    for (int j = N; j < ldc; j++) CHECK(C[(size_t)i * ldc + j] == 12345.0f);
  }
  free(A), free(B), free(C), free(C0), free(bias);
}

static void sweep(td_cpu_level level) {
  const nn_kernels *k = nn_kernels_for(level);
  const char *name = td_cpu_level_name(level);
  static const int shapes[][3] = {{1, 1, 1},   {1, 1, 2},    {2, 3, 1},   {3, 5, 7},     {12, 32, 8},
                                  {13, 33, 9}, {11, 31, 17}, {25, 17, 64}, {97, 65, 129}, {5, 520, 3},
                                  {7, 40, 257}};
  for (size_t s = 0; s < TD_ARRAY_SIZE(shapes); s++)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++)
        for (int d = 0; d < 2; d++) {
          td_dtype dtype = d ? TD_F16 : TD_BF16;
          int variant = (int)(s + ta + tb + d) % 3;
          check_case(k, name, dtype, ta, tb, shapes[s][0], shapes[s][1], shapes[s][2], variant == 1 ? 1.0f : 0.0f,
                     variant != 0);
        }
  /* one product across every block edge at once (96 rows, 256 deep, 512 wide) */
  check_case(k, name, TD_BF16, 0, 1, 110, 530, 400, 1.0f, 1);
  check_case(k, name, TD_BF16, 1, 0, 100, 515, 390, 0.0f, 0);
  /* K = 0: C = beta C + bias */
  check_case(k, name, TD_BF16, 0, 0, 3, 4, 0, 1.0f, 1);
  /* M or N = 0: nothing to do, nothing touched */
  float c = 7.0f;
  CHECK(k->k_nn_gemm_lowp(TD_BF16, 0, 0, 0, 1, 1, &c, 1, &c, 1, 0.0f, NULL, &c, 1) == 1 && c == 7.0f);
  CHECK(k->k_nn_gemm_lowp(TD_BF16, 0, 0, 1, 0, 1, &c, 1, &c, 1, 0.0f, NULL, &c, 1) == 1 && c == 7.0f);
  /* a type the kernel does not compute: declined, nothing written */
  CHECK(k->k_nn_gemm_lowp(TD_F64, 0, 0, 1, 1, 1, &c, 1, &c, 1, 0.0f, NULL, &c, 1) == 0 && c == 7.0f);
  printf("level %-10s: half-precision products match the double references\n", name);
}

/* The layers take the half-precision path when the thread's compute type
 * says so, and only then: a linear layer's output under bf16 equals the
 * bf16 product plus bias, and differs from the f32 layer's. */
static void layer_hook(void) {
  enum { N = 9, IC = 40, OC = 33 };
  float inp[N * IC], w[OC * IC], b[OC], out32[N * OC], out16[N * OC];
  for (int i = 0; i < N * IC; i++) inp[i] = uniform();
  for (int i = 0; i < OC * IC; i++) w[i] = uniform();
  for (int i = 0; i < OC; i++) b[i] = uniform();
  CHECK_EQ_INT(td_nn_compute_dtype(), TD_F32);
  td_linear_forward(out32, inp, w, b, N, IC, OC);
  CHECK_OK(td_nn_set_compute_dtype(TD_BF16));
  td_linear_forward(out16, inp, w, b, N, IC, OC);
  CHECK_OK(td_nn_set_compute_dtype(TD_F32));
  CHECK_STATUS(td_nn_set_compute_dtype(TD_I32), TD_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(td_nn_compute_dtype(), TD_F32);
  size_t differ = 0;
  for (int i = 0; i < N; i++)
    for (int o = 0; o < OC; o++) {
      double r = b[o], mag = fabs(b[o]);
      for (int k = 0; k < IC; k++) {
        double p = ref_round(inp[i * IC + k], TD_BF16) * ref_round(w[o * IC + k], TD_BF16);
        r += p;
        mag += fabs(p);
      }
      CHECK_CLOSE(out16[i * OC + o], r, 0, ldexp(1.0, -20) * sqrt(IC + 2.0) * mag);
      differ += out16[i * OC + o] != out32[i * OC + o];
    }
  CHECK(differ > (size_t)(N * OC) / 2);
  printf("linear layer: bf16 path taken under td_nn_set_compute_dtype(TD_BF16) only\n");
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static int bench(int rounds) {
  if (rounds < 1 || rounds > 101) rounds = 11;
  if (td_cpu_supported() < TD_CPU_AVX512) {
    printf("bench: needs AVX-512 (this CPU: %s)\n", td_cpu_level_name(td_cpu_supported()));
    return 0;
  }
  td_nn_set_threads(1);
  int have_bf16 = td_cpu_supported() >= TD_CPU_AVX512BF16;
  const nn_kernels *k32 = nn_kernels_for(TD_CPU_AVX512), *k16 = nn_kernels_for(have_bf16 ? TD_CPU_AVX512BF16 : TD_CPU_AVX512);
  /* GPT reference config (4 layers, C 256, B 8, T 128: BT 1024), its linear products */
  struct { const char *name; int ta, tb, M, N, K; } shapes[] = {
      {"fwd qkv  1024x768x256", 0, 1, 1024, 768, 256},   {"fwd fc   1024x1024x256", 0, 1, 1024, 1024, 256},
      {"fwd proj 1024x256x1024", 0, 1, 1024, 256, 1024}, {"bwd dinp 1024x256x1024", 0, 0, 1024, 256, 1024},
      {"bwd dW   1024x256x1024", 1, 0, 1024, 256, 1024}, {"bwd dW   256x1024x1024", 1, 0, 256, 1024, 1024},
  };
  size_t big = 1024 * 1024 * 4;
  float *A = malloc(big * sizeof(float)), *B = malloc(big * sizeof(float)), *C = malloc(big * sizeof(float));
  CHECK(A && B && C);
  for (size_t i = 0; i < big; i++) A[i] = uniform(), B[i] = uniform(), C[i] = 0;
  printf("single thread, %d interleaved rounds, medians; peaks of this CPU (measured): bf16 dot 411, f32 FMA 224 GFLOP/s "
         "per core\n", rounds);
  printf("%-26s %10s %10s %10s %9s %9s\n", "product (MxNxK)", "bf16", "f32 own", "sgemm", "bf16/own", "bf16/sgemm");
  double total[3] = {0, 0, 0};
  for (size_t s = 0; s < TD_ARRAY_SIZE(shapes); s++) {
    int ta = shapes[s].ta, tb = shapes[s].tb, M = shapes[s].M, N = shapes[s].N, K = shapes[s].K;
    int lda = ta ? M : K, ldb = tb ? K : N;
    double t[3][101];
    for (int r = 0; r < rounds; r++) {
      for (int v = 0; v < 3; v++) {
        double t0 = now_s();
        if (v == 0)
          k16->k_nn_gemm_lowp(TD_BF16, ta, tb, M, N, K, A, lda, B, ldb, 0.0f, NULL, C, N);
        else if (v == 1) {
          int ok = ta ? k32->k_nn_gemm_tn(M, N, K, A, lda, B, ldb, C, N, NULL)
                      : k32->k_nn_gemm(tb, M, N, K, A, lda, B, ldb, NULL, 0, NULL, C, N);
          if (!ok) k32->k_td_sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, N);
        } else
          k32->k_td_sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, N);
        t[v][r] = now_s() - t0;
      }
    }
    double med[3];
    for (int v = 0; v < 3; v++) {
      qsort(t[v], (size_t)rounds, sizeof(double), cmp_double);
      med[v] = t[v][rounds / 2];
      total[v] += med[v];
    }
    double flop = 2.0 * M * N * K;
    printf("%-26s %10.1f %10.1f %10.1f %8.2fx %8.2fx\n", shapes[s].name, flop / med[0] * 1e-9, flop / med[1] * 1e-9,
           flop / med[2] * 1e-9, med[1] / med[0], med[2] / med[0]);
  }
  printf("%-26s %10s %10s %10s %8.2fx %8.2fx\n", "all six (time ratio)", "", "", "", total[1] / total[0],
         total[2] / total[0]);
  if (!have_bf16) printf("(no AVX512-BF16 here: the bf16 column is the rounded f32 fallback)\n");
  free(A), free(B), free(C);
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  if (argc == 3 && strcmp(argv[1], "--bench") == 0) return bench(atoi(argv[2]));
  td_nn_set_threads(1);
  td_cpu_level top = td_cpu_supported();
  for (int l = 0; l <= (int)top; l++) sweep((td_cpu_level)l);
  if (top < TD_CPU_AVX512BF16) printf("(no AVX512-BF16 on this CPU: the native bf16 kernel was not run)\n");
  /* the rounded operands matter: most outputs are far from the unrounded product */
  printf("%zu outputs checked, %zu of them farther from the f32 product than the tolerance\n", n_checked,
         n_far_from_f32);
  CHECK(n_far_from_f32 > n_checked / 2);
  layer_hook();
  return 0;
}
