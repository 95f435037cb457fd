/* The fused half-precision product nn_gemm_lowp_ep (src/nn/matmul_bf16.c)
 * at every CPU level this machine runs, against double-precision
 * references written here:
 *
 *   C = op(A) op(B) + [c_in] + [bias], then the epilogue: none, GELU (C =
 *   gelu(x), aux = gelu'(x), tanh approximation) or MUL (C = x aux); and
 *   colsum[i] += sum_k op(A)[i][k] from the unrounded f32 values.
 *
 * The product's reference rounds each operand to bf16 (bits) or f16
 * (arithmetic) and sums in double; the allowed error is that of f32
 * accumulation, 2^-20 sqrt(K + 2) sum |a b| (test_precision_gemm.c explains
 * it). GELU and gelu' are computed in double from that reference x; their
 * slopes are below 1.2 and 0.9, plus 4e-6 relative for the kernel's
 * exponential and reciprocal, and gelu_grad_amp for gelu' at large |x|. colsum against a double sum, to the f32
 * rounding of K additions.
 *
 * Shapes: 1 and odd sizes, the tile (12 x 32) and block edges (96 rows,
 * 256 deep, 512 wide) crossed, all four transpositions, c_in separate (with
 * a row stride of its own) or C itself, ldc > N (padding untouched), aux
 * beside C, K = 0 (C = c_in + bias, epilogue still applied), N = 0 (colsum
 * alone). Then the linear layers built on it (forward with residual, with
 * GELU, backward with the GELU's derivative and the bias gradient) at the
 * bf16 compute type against the same references. */
#include <stdint.h>

#include "../common/check.h"
#include "nn/nn_kernels.h"

static uint64_t rng = 0xB16F0u;

static double ref_round(float x, td_dtype dtype) {
  if (dtype == TD_F16) {
    if (x == 0) return x;
    int e;
    frexp(x, &e);
    double q = ldexp(1.0, (e - 11 < -24) ? -24 : e - 11);
    return nearbyint(x / q) * q; /* |x| <= 4 here: no overflow */
  }
  uint32_t u;
  memcpy(&u, &x, 4);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static double gelu_ref(double x) { return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }
static double gelu_grad_ref(double x) {
  double u = sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x), t = tanh(u);
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * sqrt(2.0 / M_PI) * (1.0 + 3.0 * 0.044715 * x * x);
}

/* The kernels' s = sigmoid(2u) carries a relative error up to ~4e-7 (the
 * exponential and the Newton-refined reciprocal), and gelu' = s + 2 x s (1 -
 * s) (1 + 3 0.044715 x^2) multiplies it by up to 2 |x| (1 + 0.134 x^2): at
 * |x| = 40 that is 3e-3 (where gelu' is 1 within 1e-300, a case training
 * meets rarely). The bound allowed for that part of gelu''s error. */
static double gelu_grad_amp(double x) { return 4e-7 * (1.0 + 2.0 * fabs(x) * (1.0 + 3.0 * 0.044715 * x * x)); }

static size_t n_checked;

enum { IN_NONE, IN_SEPARATE, IN_C };

static void check_case(const nn_kernels *k, const char *level, td_dtype dtype, int ta, int tb, int M, int N, int K,
                       int in_mode, int with_bias, int epilogue, int with_colsum) {
  int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 5, ld_in = N + 2;
  size_t na = (size_t)(ta ? K : M) * lda + 1, nb = (size_t)(tb ? N : K) * ldb + 1, nc = (size_t)M * ldc + 1;
  float *A = td_test_rand_buf(&rng, na, 2.0f), *B = td_test_rand_buf(&rng, nb, 1.0f);
  float *C = malloc(nc * sizeof(float)), *C0 = td_test_rand_buf(&rng, nc, 1.0f);
  float *cin = td_test_rand_buf(&rng, (size_t)M * ld_in + 1, 1.0f), *bias = td_test_rand_buf(&rng, (size_t)N + 1, 1.0f);
  float *aux = td_test_rand_buf(&rng, nc, 1.5f), *aux0 = malloc(nc * sizeof(float));
  float *colsum = td_test_rand_buf(&rng, (size_t)M + 1, 1.0f), *colsum0 = malloc(((size_t)M + 1) * sizeof(float));
  CHECK(A && B && C && C0 && cin && bias && aux && aux0 && colsum && colsum0);
  if (in_mode != IN_C)
    for (size_t i = 0; i < nc; i++) C0[i] = NAN; /* must not be read */
  for (int i = 0; i < M; i++)
    for (int j = N; j < ldc; j++) C0[(size_t)i * ldc + j] = aux[(size_t)i * ldc + j] = 12345.0f;
  memcpy(C, C0, nc * sizeof(float));
  memcpy(aux0, aux, nc * sizeof(float));
  memcpy(colsum0, colsum, ((size_t)M + 1) * sizeof(float));
  const float *c_in = in_mode == IN_SEPARATE ? cin : in_mode == IN_C ? C : NULL;
  int ldi = in_mode == IN_SEPARATE ? ld_in : ldc;
  CHECK(k->k_nn_gemm_lowp_ep(dtype, ta, tb, M, N, K, A, lda, B, ldb, c_in, ldi, with_bias ? bias : NULL, C, ldc,
                             epilogue, epilogue != NN_GEMM_PLAIN ? aux : NULL, with_colsum ? colsum : NULL) == 1);
  char what[160];
  snprintf(what, sizeof what, "%s %s ta=%d tb=%d M=%d N=%d K=%d in=%d bias=%d epilogue=%d", level,
           td_dtype_name(dtype), ta, tb, M, N, K, in_mode, with_bias, epilogue);
  for (int i = 0; i < M; i++) {
    for (int j = 0; j < N; j++) {
      double ref = 0, mag = 0;
      for (int kk = 0; kk < K; kk++) {
        float a = ta ? A[(size_t)kk * lda + i] : A[(size_t)i * lda + kk];
        float b = tb ? B[(size_t)j * ldb + kk] : B[(size_t)kk * ldb + j];
        double p = ref_round(a, dtype) * ref_round(b, dtype);
        ref += p;
        mag += fabs(p);
      }
      double base = (with_bias ? bias[j] : 0.0);
      if (in_mode == IN_SEPARATE) base += cin[(size_t)i * ld_in + j];
      if (in_mode == IN_C) base += C0[(size_t)i * ldc + j];
      double x = ref + base, tol = ldexp(1.0, -20) * sqrt(K + 2.0) * (mag + fabs(base)) + 1e-30;
      double got = C[(size_t)i * ldc + j], want = x, tol_c = tol;
      size_t at = (size_t)i * ldc + j;
      if (epilogue == NN_GEMM_GELU) {
        want = gelu_ref(x), tol_c = 1.2 * tol + 4e-6 * fabs(want) + 1e-7;
        double g = gelu_grad_ref(x), tol_g = 0.9 * tol + 4e-6 * fabs(g) + gelu_grad_amp(x) + 1e-7;
        if (!(fabs(aux[at] - g) <= tol_g))
          td_test_fail(__FILE__, __LINE__, "%s: gelu'[%d][%d] = %.9g, reference %.9g (tol %.3g)", what, i, j,
                       aux[at], g, tol_g);
      } else if (epilogue == NN_GEMM_MUL) {
        want = x * aux0[at], tol_c = tol * fabs(aux0[at]) + 1e-7 * fabs(want) + 1e-30;
        CHECK(aux[at] == aux0[at]); /* read only */
      }
      if (!(fabs(got - want) <= tol_c))
        td_test_fail(__FILE__, __LINE__, "%s: C[%d][%d] = %.9g, reference %.9g (tol %.3g)", what, i, j, got, want,
                     tol_c);
      n_checked++;
    }
    for (int j = N; j < ldc; j++) CHECK(C[(size_t)i * ldc + j] == 12345.0f && aux[(size_t)i * ldc + j] == 12345.0f);
    if (with_colsum) {
      double s = colsum0[i], mag = fabs(s);
      for (int kk = 0; kk < K; kk++) {
        double a = ta ? A[(size_t)kk * lda + i] : A[(size_t)i * lda + kk];
        s += a, mag += fabs(a);
      }
      double tol = ldexp(1.0, -24) * (K + 1.0) * mag;
      if (!(fabs(colsum[i] - s) <= tol))
        td_test_fail(__FILE__, __LINE__, "%s: colsum[%d] = %.9g, reference %.9g (tol %.3g)", what, i, colsum[i], s,
                     tol);
    } else {
      CHECK(colsum[i] == colsum0[i]);
    }
  }
  CHECK(colsum[M] == colsum0[M]);
  free(A), free(B), free(C), free(C0), free(cin), free(bias), free(aux), free(aux0), free(colsum), free(colsum0);
}

static void sweep(td_cpu_level level) {
  const nn_kernels *k = nn_kernels_for(level);
  const char *name = td_cpu_level_name(level);
  static const int shapes[][3] = {{1, 1, 1},    {1, 1, 2},    {2, 3, 1},     {3, 5, 7},   {12, 32, 8},
                                  {13, 33, 9},  {11, 31, 17}, {25, 17, 64},  {97, 65, 33}, {5, 520, 3},
                                  {7, 40, 257}};
  int v = 0;
  for (size_t s = 0; s < TD_ARRAY_SIZE(shapes); s++)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++)
        for (int ep = 0; ep < 3; ep++, v++) {
          td_dtype dtype = v % 5 == 4 ? TD_F16 : TD_BF16;
          /* MUL follows a product that overwrites (the GELU's backward); the others take any input */
          int in_mode = ep == NN_GEMM_MUL ? IN_NONE : v % 3;
          check_case(k, name, dtype, ta, tb, shapes[s][0], shapes[s][1], shapes[s][2], in_mode, v % 2,
                     ep, (v + ta) % 2);
        }
  /* every block edge at once (96 rows, 256 deep, 512 wide), each transposition once */
  for (int t = 0; t < 4; t++)
    check_case(k, name, TD_BF16, t / 2, t % 2, 110, 530, 400, t == 3 ? IN_NONE : t, t % 2, t == 3 ? NN_GEMM_MUL : t,
               t / 2);
  /* K = 0: C = c_in + bias, then the epilogue; colsum unchanged */
  check_case(k, name, TD_BF16, 0, 0, 3, 4, 0, IN_SEPARATE, 1, NN_GEMM_GELU, 1);
  check_case(k, name, TD_BF16, 1, 1, 3, 4, 0, IN_C, 0, NN_GEMM_PLAIN, 0);
  /* N = 0: no C, but colsum still sums op(A) (a bias gradient of an empty layer is not a case, an empty output is) */
  float c = 7.0f, cs[3] = {1, 2, 3}, a[6] = {1, 2, 3, 4, 5, 6};
  CHECK(k->k_nn_gemm_lowp_ep(TD_BF16, 1, 0, 3, 0, 2, a, 3, &c, 1, NULL, 0, NULL, &c, 1, NN_GEMM_PLAIN, NULL, cs) == 1);
  CHECK(c == 7.0f && cs[0] == 1 + 1 + 4 && cs[1] == 2 + 2 + 5 && cs[2] == 3 + 3 + 6);
  /* M = 0: nothing */
  CHECK(k->k_nn_gemm_lowp_ep(TD_BF16, 0, 0, 0, 1, 1, &c, 1, &c, 1, NULL, 0, NULL, &c, 1, NN_GEMM_GELU, &c, NULL) == 1);
  CHECK(c == 7.0f);
  /* a type the kernel does not compute: declined, nothing written */
  CHECK(k->k_nn_gemm_lowp_ep(TD_F64, 0, 0, 1, 1, 1, &c, 1, &c, 1, NULL, 0, NULL, &c, 1, NN_GEMM_PLAIN, NULL, cs) == 0);
  CHECK(c == 7.0f && cs[0] == 6);
  printf("level %-10s: fused half-precision products match the double references\n", name);
}

/* The linear layers at one level under bf16: forward with a residual, with
 * GELU (out and the cached derivative), and the backward through the GELU
 * with the bias gradient, against the references above. */
static void layers(td_cpu_level level) {
  const nn_kernels *k = nn_kernels_for(level);
  enum { N = 37, IC = 45, OC = 70 };
  float *inp = td_test_rand_buf(&rng, N * IC, 1.0f), *w = td_test_rand_buf(&rng, OC * IC, 0.5f);
  float *b = td_test_rand_buf(&rng, OC, 0.5f), *resid = td_test_rand_buf(&rng, N * OC, 1.0f);
  float *out = malloc(N * OC * sizeof(float)), *dg = malloc(N * OC * sizeof(float));
  float *dout = td_test_rand_buf(&rng, N * IC, 1.0f), *dinp = malloc(N * OC * sizeof(float));
  float *dw = calloc(IC * OC, sizeof(float)), *db = calloc(IC, sizeof(float));
  CHECK(inp && w && b && resid && out && dg && dout && dinp && dw && db);
  CHECK_OK(td_nn_set_compute_dtype(TD_BF16));
  /* residual: out = resid + inp W^T + b */
  k->k_nn_linear_residual_forward(out, resid, inp, w, b, N, IC, OC);
  for (int n = 0; n < N; n++)
    for (int o = 0; o < OC; o++) {
      double r = (double)resid[n * OC + o] + b[o], mag = fabs(r);
      for (int i = 0; i < IC; i++) {
        double p = ref_round(inp[n * IC + i], TD_BF16) * ref_round(w[o * IC + i], TD_BF16);
        r += p, mag += fabs(p);
      }
      CHECK_CLOSE(out[n * OC + o], r, 0, ldexp(1.0, -20) * sqrt(IC + 2.0) * mag);
    }
  /* GELU: out = gelu(x), dg = gelu'(x), x = inp W^T + b */
  k->k_nn_linear_gelu_forward(out, dg, inp, w, b, N, IC, OC);
  for (int n = 0; n < N; n++)
    for (int o = 0; o < OC; o++) {
      double x = b[o], mag = fabs(x);
      for (int i = 0; i < IC; i++) {
        double p = ref_round(inp[n * IC + i], TD_BF16) * ref_round(w[o * IC + i], TD_BF16);
        x += p, mag += fabs(p);
      }
      double tol = ldexp(1.0, -20) * sqrt(IC + 2.0) * mag;
      CHECK_CLOSE(out[n * OC + o], gelu_ref(x), 4e-6, 1.2 * tol + 1e-7);
      CHECK_CLOSE(dg[n * OC + o], gelu_grad_ref(x), 4e-6, 0.9 * tol + gelu_grad_amp(x) + 1e-7);
    }
  /* backward of a layer IC -> OC read the other way: a layer OC -> IC whose
   * input is `out`, gradient dout (N, IC): dinp (N, OC) = (dout W') * dg,
   * dW' (IC, OC) += dout^T out, db (IC) += column sums of dout; W' = w
   * read as (IC, OC) */
  k->k_nn_linear_backward_set_gelu(dinp, dw, db, dout, out, w, dg, N, OC, IC);
  for (int n = 0; n < N; n++)
    for (int o = 0; o < OC; o++) {
      double r = 0, mag = 0;
      for (int i = 0; i < IC; i++) {
        double p = ref_round(dout[n * IC + i], TD_BF16) * ref_round(w[i * OC + o], TD_BF16);
        r += p, mag += fabs(p);
      }
      CHECK_CLOSE(dinp[n * OC + o], r * dg[n * OC + o], 1e-7,
                  ldexp(1.0, -20) * sqrt(IC + 2.0) * mag * fabs(dg[n * OC + o]));
    }
  for (int i = 0; i < IC; i++) {
    double s = 0, smag = 0;
    for (int n = 0; n < N; n++) s += dout[n * IC + i], smag += fabs(dout[n * IC + i]);
    CHECK_CLOSE(db[i], s, 0, ldexp(1.0, -24) * N * smag);
    for (int o = 0; o < OC; o++) {
      double r = 0, mag = 0;
      for (int n = 0; n < N; n++) {
        double p = ref_round(dout[n * IC + i], TD_BF16) * ref_round(out[n * OC + o], TD_BF16);
        r += p, mag += fabs(p);
      }
      CHECK_CLOSE(dw[i * OC + o], r, 0, ldexp(1.0, -20) * sqrt(N + 2.0) * mag);
    }
  }
  CHECK_OK(td_nn_set_compute_dtype(TD_F32));
  free(inp), free(w), free(b), free(resid), free(out), free(dg), free(dout), free(dinp), free(dw), free(db);
  printf("level %-10s: bf16 linear layers (residual, GELU, backward with bias) match the references\n",
         td_cpu_level_name(level));
}

int main(void) {
  setvbuf(stdout, NULL, _IONBF, 0);
  td_nn_set_threads(1);
  td_cpu_level top = td_cpu_supported();
  for (int l = 0; l <= (int)top; l++) sweep((td_cpu_level)l);
  for (int l = 0; l <= (int)top; l++) layers((td_cpu_level)l);
  if (top < TD_CPU_AVX512BF16) printf("(no AVX512-BF16 on this CPU: the native bf16 kernel was not run)\n");
  printf("%zu outputs checked\n", n_checked);
  return 0;
}
