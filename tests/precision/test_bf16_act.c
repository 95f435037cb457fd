/* The bf16 copies of activations (src/nn/layers_bf16.c and matmul_bf16.c's
 * nn_gemm_lowp_x / nn_to_bf16) at every CPU level this machine runs,
 * against references written here:
 *
 * - nn_to_bf16: each value against the nearest bf16 chosen in double (ties
 *   to the even mantissa; NaN stays NaN; a denormal input may read as a
 *   signed zero at the avx512bf16 level, where vcvtneps2bf16 treats
 *   denormal inputs as zero), lengths 0, 1 and around the 16-lane vectors,
 *   nothing written past n.
 * - nn_gemm_lowp_x: C against the double sum of the bf16-rounded products
 *   (tolerance of f32 accumulation, as test_bf16_fused.c); with A16 / B16
 *   the f32 operand is poisoned with NaN (so the copy must be what is read)
 *   and C must equal, to the bit, nn_gemm_lowp_ep's from the f32 operands;
 *   C16 equals the reference rounding of the final C (after GELU too), and
 *   the padding of C16's rows is untouched. Odd and edge sizes (tile 12 x
 *   32, blocks 96 x 256 x 512), all transpositions.
 * - the layers: layer norm against a double layer norm, attention against a
 *   double causal attention, both with out16 the rounding of out and out
 *   bit-identical to the f32 layer's; the linear layers reading inp16 bit-
 *   identical to the f32-sourced ones, out16 the rounding of out, at the
 *   bf16 and (out16 alone) the f32 compute type. */
#include <stdint.h>

#include "../common/check.h"
#include "nn/nn_kernels.h"

static uint64_t rng = 0xB16AC7u;
static size_t n_checked;

static float bits_f(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint32_t f_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

/* the nearest bf16 to x, chosen by comparing distances in double */
static uint16_t ref_bf16(float x) {
  if (isnan(x)) return 0x7fc0;
  uint32_t u = f_bits(x);
  uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u; /* toward zero, away from zero (same sign) */
  double dl = fabs((double)x - (double)bits_f(lo));
  double dh = isinf(bits_f(hi)) || isnan(bits_f(hi)) ? fabs((double)x - ldexp(1.0, 128) * (x < 0 ? -1 : 1))
                                                      : fabs((double)x - (double)bits_f(hi));
  if (dl < dh) return (uint16_t)(lo >> 16);
  if (dh < dl) return (uint16_t)(hi >> 16);
  return ((lo >> 16) & 1) ? (uint16_t)(hi >> 16) : (uint16_t)(lo >> 16);
}
static double bf(float x) { return (double)bits_f((uint32_t)ref_bf16(x) << 16); }

static void check_to_bf16(const nn_kernels *k, td_cpu_level level) {
  static const int lens[] = {0, 1, 2, 15, 16, 17, 31, 33, 100};
  for (size_t li = 0; li < TD_ARRAY_SIZE(lens); li++) {
    int n = lens[li];
    float *src = td_test_rand_buf(&rng, (size_t)n + 1, 3.0f);
    uint16_t *dst = malloc(((size_t)n + 4) * sizeof(uint16_t));
    CHECK(src && dst);
    /* specials and ties among the random values */
    const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, bits_f(0x3f808000u) /* tie, even below */,
                             bits_f(0x3f818000u) /* tie, even above */, bits_f(0x7f7fffffu) /* to inf */,
                             bits_f(0x00000005u) /* denormal */, bits_f(0x80400000u), 1e30f, -3.14159f};
    for (int i = 0; i < n; i++)
      if (i % 3 == 0) src[i] = special[(i / 3) % TD_ARRAY_SIZE(special)];
    for (int i = 0; i < n + 4; i++) dst[i] = 0xABCD;
    k->k_nn_to_bf16(dst, src, (size_t)n);
    for (int i = 0; i < n; i++) {
      uint16_t want = ref_bf16(src[i]);
      int denormal = fpclassify(src[i]) == FP_SUBNORMAL;
      int ok = isnan(src[i]) ? ((dst[i] & 0x7f80) == 0x7f80 && (dst[i] & 0x7f) != 0)
                             : dst[i] == want || (denormal && level == TD_CPU_AVX512BF16 &&
                                                  (dst[i] & 0x7fff) == 0 && (dst[i] >> 15) == (f_bits(src[i]) >> 31));
      if (!ok)
        td_test_fail(__FILE__, __LINE__, "%s: nn_to_bf16(%.9g = 0x%08x) = 0x%04x, reference 0x%04x (n=%d i=%d)",
                     td_cpu_level_name(level), src[i], f_bits(src[i]), dst[i], want, n, i);
      n_checked++;
    }
    for (int i = n; i < n + 4; i++) CHECK(dst[i] == 0xABCD);
    free(src), free(dst);
  }
}

static void check_gemm(const nn_kernels *k, td_cpu_level level, int ta, int tb, int M, int N, int K, int use_a16,
                       int use_b16, int gelu) {
  int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 5;
  size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb, nc = (size_t)M * ldc;
  float *A = td_test_rand_buf(&rng, na, 2.0f), *B = td_test_rand_buf(&rng, nb, 1.0f);
  float *bias = td_test_rand_buf(&rng, (size_t)N, 1.0f);
  float *C = malloc((nc + 1) * sizeof(float)), *Cref = malloc((nc + 1) * sizeof(float));
  float *aux = malloc((nc + 1) * sizeof(float)), *auxref = malloc((nc + 1) * sizeof(float));
  uint16_t *A16 = malloc((na + 1) * 2), *B16 = malloc((nb + 1) * 2), *C16 = malloc((nc + 1) * 2);
  float *Ap = malloc((na + 1) * sizeof(float)), *Bp = malloc((nb + 1) * sizeof(float));
  CHECK(A && B && bias && C && Cref && aux && auxref && A16 && B16 && C16 && Ap && Bp);
  for (size_t i = 0; i < na; i++) A16[i] = ref_bf16(A[i]), Ap[i] = NAN;
  for (size_t i = 0; i < nb; i++) B16[i] = ref_bf16(B[i]), Bp[i] = NAN;
  for (size_t i = 0; i < nc; i++) C16[i] = 0xABCD;
  int a16 = use_a16 && !ta, b16 = use_b16 && !tb; /* where a copy stands for its operand */
  int ep = gelu ? NN_GEMM_GELU : NN_GEMM_PLAIN;
  CHECK(k->k_nn_gemm_lowp_ep(TD_BF16, ta, tb, M, N, K, A, lda, B, ldb, NULL, 0, bias, Cref, ldc, ep,
                             gelu ? auxref : NULL, NULL) == 1);
  CHECK(k->k_nn_gemm_lowp_x(TD_BF16, ta, tb, M, N, K, a16 ? Ap : A, use_a16 ? A16 : NULL, lda, b16 ? Bp : B,
                            use_b16 ? B16 : NULL, ldb, NULL, 0, bias, C, ldc, C16, ep, gelu ? aux : NULL, NULL) == 1);
  char what[160];
  snprintf(what, sizeof what, "%s ta=%d tb=%d M=%d N=%d K=%d a16=%d b16=%d gelu=%d", td_cpu_level_name(level), ta,
           tb, M, N, K, use_a16, use_b16, gelu);
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      size_t at = (size_t)i * ldc + j;
      double ref = 0, mag = 0;
      for (int kk = 0; kk < K; kk++) {
        float a = ta ? A[(size_t)kk * lda + i] : A[(size_t)i * lda + kk];
        float b = tb ? B[(size_t)j * ldb + kk] : B[(size_t)kk * ldb + j];
        double p = bf(a) * bf(b);
        ref += p, mag += fabs(p);
      }
      double x = ref + bias[j], tol = ldexp(1.0, -20) * sqrt(K + 2.0) * (mag + fabs(bias[j])) + 1e-30;
      double want = x;
      if (gelu) want = 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))),
                tol = 1.2 * tol + 4e-6 * fabs(want) + 1e-7;
      if (!(fabs(C[at] - want) <= tol))
        td_test_fail(__FILE__, __LINE__, "%s: C[%d][%d] = %.9g, reference %.9g (tol %.3g)", what, i, j, C[at], want,
                     tol);
      if (f_bits(C[at]) != f_bits(Cref[at]) || (gelu && f_bits(aux[at]) != f_bits(auxref[at])))
        td_test_fail(__FILE__, __LINE__, "%s: C[%d][%d] = %.9g, from the f32 operands %.9g: not bit-identical", what,
                     i, j, C[at], Cref[at]);
      if (C16[at] != ref_bf16(C[at]))
        td_test_fail(__FILE__, __LINE__, "%s: C16[%d][%d] = 0x%04x, rounding of C 0x%04x", what, i, j, C16[at],
                     ref_bf16(C[at]));
      n_checked++;
    }
  for (int i = 0; i < M; i++)
    for (int j = N; j < ldc && (size_t)i * ldc + j < nc; j++) CHECK(C16[(size_t)i * ldc + j] == 0xABCD);
  free(A), free(B), free(bias), free(C), free(Cref), free(aux), free(auxref), free(A16), free(B16), free(C16);
  free(Ap), free(Bp);
}

static void sweep_gemm(const nn_kernels *k, td_cpu_level level) {
  static const int sizes[][3] = {{1, 1, 1}, {1, 1, 2}, {3, 5, 7},     {12, 32, 16},  {13, 33, 17},
                                 {25, 70, 3}, {97, 40, 257}, {30, 513, 64}};
  for (size_t s = 0; s < TD_ARRAY_SIZE(sizes); s++)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++)
        for (int u = 0; u < 4; u++)
          if (s < 5 || u == 0 || u == 3) /* the large shapes: no copy, or both */
            check_gemm(k, level, ta, tb, sizes[s][0], sizes[s][1], sizes[s][2], u & 1, u >> 1, (int)((s + u) % 2));
  /* K = 0: C = bias, its copy still written */
  check_gemm(k, level, 0, 0, 5, 9, 0, 1, 1, 1);
}

static void check_layers(const nn_kernels *k, td_cpu_level level) {
  const char *name = td_cpu_level_name(level);
  /* layer norm, C odd and a vector multiple */
  for (int C = 1; C <= 70; C += 23) {
    int N = 7;
    float *x = td_test_rand_buf(&rng, (size_t)N * C, 2.0f), *w = td_test_rand_buf(&rng, (size_t)C, 1.0f);
    float *b = td_test_rand_buf(&rng, (size_t)C, 0.5f);
    float *o = malloc((size_t)N * C * 4), *o2 = malloc((size_t)N * C * 4), *m = malloc(N * 4), *r = malloc(N * 4);
    float *m2 = malloc(N * 4), *r2 = malloc(N * 4);
    uint16_t *o16 = malloc((size_t)N * C * 2);
    CHECK(x && w && b && o && o2 && m && r && m2 && r2 && o16);
    k->k_nn_layernorm_forward16(o, o16, m, r, x, w, b, N, C);
    k->k_td_layernorm_forward(o2, m2, r2, x, w, b, N, C);
    for (int n = 0; n < N; n++) {
      double mean = 0, var = 0;
      for (int c = 0; c < C; c++) mean += x[n * C + c];
      mean /= C;
      for (int c = 0; c < C; c++) var += (x[n * C + c] - mean) * (x[n * C + c] - mean);
      double rs = 1.0 / sqrt(var / C + 1e-5);
      CHECK_CLOSE(m[n], mean, 1e-5, 1e-6);
      CHECK_CLOSE(r[n], rs, 1e-5, 0);
      CHECK(f_bits(m[n]) == f_bits(m2[n]) && f_bits(r[n]) == f_bits(r2[n]));
      for (int c = 0; c < C; c++) {
        size_t at = (size_t)n * C + c;
        CHECK_CLOSE(o[at], (x[at] - mean) * rs * w[c] + b[c], 1e-5, 1e-5);
        CHECK(f_bits(o[at]) == f_bits(o2[at]));
        CHECK(o16[at] == ref_bf16(o[at]));
        n_checked++;
      }
    }
    free(x), free(w), free(b), free(o), free(o2), free(m), free(r), free(m2), free(r2), free(o16);
  }
  /* causal attention: B sequences, T odd, head size 8 */
  {
    const int B = 3, T = 9, C = 16, NH = 2, hs = C / NH;
    float *qkv = td_test_rand_buf(&rng, (size_t)B * T * 3 * C, 1.0f);
    float *o = malloc((size_t)B * T * C * 4), *o2 = malloc((size_t)B * T * C * 4);
    float *att = malloc((size_t)B * NH * T * T * 4), *att2 = malloc((size_t)B * NH * T * T * 4);
    uint16_t *o16 = malloc((size_t)B * T * C * 2);
    CHECK(qkv && o && o2 && att && att2 && o16);
    k->k_nn_attention_forward16(o, o16, att, qkv, B, T, C, NH);
    k->k_td_attention_forward(o2, att2, qkv, B, T, C, NH);
    for (int b = 0; b < B; b++)
      for (int t = 0; t < T; t++)
        for (int h = 0; h < NH; h++) {
          const float *q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
          double s[64], mx = -1e300, z = 0;
          for (int u = 0; u <= t; u++) {
            const float *kk = qkv + ((size_t)b * T + u) * 3 * C + C + h * hs;
            double d = 0;
            for (int e = 0; e < hs; e++) d += (double)q[e] * kk[e];
            s[u] = d / sqrt((double)hs);
            if (s[u] > mx) mx = s[u];
          }
          for (int u = 0; u <= t; u++) z += (s[u] = exp(s[u] - mx));
          for (int e = 0; e < hs; e++) {
            double y = 0;
            for (int u = 0; u <= t; u++) y += s[u] / z * qkv[((size_t)b * T + u) * 3 * C + 2 * C + h * hs + e];
            size_t at = ((size_t)b * T + t) * C + h * hs + e;
            CHECK_CLOSE(o[at], y, 1e-5, 1e-5);
            CHECK(f_bits(o[at]) == f_bits(o2[at]));
            CHECK(o16[at] == ref_bf16(o[at]));
            n_checked++;
          }
        }
    free(qkv), free(o), free(o2), free(att), free(att2), free(o16);
  }
  /* linear layers reading inp16 / writing out16 against the f32-sourced ones */
  for (int pass = 0; pass < 2; pass++) {
    td_dtype dt = pass == 0 ? TD_BF16 : TD_F32;
    CHECK_OK(td_nn_set_compute_dtype(dt));
    const int N = 37, IC = 50, OC = 70;
    float *x = td_test_rand_buf(&rng, (size_t)N * IC, 1.0f), *w = td_test_rand_buf(&rng, (size_t)OC * IC, 0.3f);
    float *bias = td_test_rand_buf(&rng, (size_t)OC, 0.2f), *res = td_test_rand_buf(&rng, (size_t)N * OC, 1.0f);
    float *dout = td_test_rand_buf(&rng, (size_t)N * OC, 1.0f);
    size_t no = (size_t)N * OC, ni = (size_t)N * IC, nw = (size_t)OC * IC;
    float *y = malloc(no * 4), *y2 = malloc(no * 4), *g = malloc(no * 4), *g2 = malloc(no * 4);
    float *dx = malloc(ni * 4), *dx2 = malloc(ni * 4), *dw = calloc(nw, 4), *dw2 = calloc(nw, 4);
    float *db = calloc(OC, 4), *db2 = calloc(OC, 4);
    uint16_t *x16 = malloc(ni * 2), *y16 = malloc(no * 2);
    CHECK(x && w && bias && res && dout && y && y2 && g && g2 && dx && dx2 && dw && dw2 && db && db2 && x16 && y16);
    for (size_t i = 0; i < ni; i++) x16[i] = ref_bf16(x[i]);
    const uint16_t *in16 = dt == TD_BF16 ? x16 : NULL;
    for (int kind = 0; kind < 3; kind++) { /* plain, residual, GELU */
      k->k_nn_linear_forward16(y, y16, kind == 2 ? g : NULL, kind == 1 ? res : NULL, x, in16, w, bias, N, IC, OC);
      if (kind == 0) k->k_td_linear_forward(y2, x, w, bias, N, IC, OC);
      if (kind == 1) k->k_nn_linear_residual_forward(y2, res, x, w, bias, N, IC, OC);
      if (kind == 2) k->k_nn_linear_gelu_forward(y2, g2, x, w, bias, N, IC, OC);
      for (size_t i = 0; i < no; i++) {
        if (f_bits(y[i]) != f_bits(y2[i]) || (kind == 2 && f_bits(g[i]) != f_bits(g2[i])) || y16[i] != ref_bf16(y[i]))
          td_test_fail(__FILE__, __LINE__, "%s %s linear kind %d: out[%zu] %.9g vs %.9g, out16 0x%04x vs 0x%04x",
                       name, td_dtype_name(dt), kind, i, y[i], y2[i], y16[i], ref_bf16(y[i]));
        n_checked++;
      }
    }
    /* backward with the GELU's derivative (g from the last forward) and without */
    for (int with_g = 0; with_g < 2; with_g++) {
      memset(dw, 0, nw * 4), memset(dw2, 0, nw * 4), memset(db, 0, OC * 4), memset(db2, 0, OC * 4);
      /* dinp = dout (N, OC) @ w (OC, IC): the layer maps IC -> OC, g is (N, OC): use it on the
       * input side of a layer OC -> IC by swapping roles, as gpt.c's fc2 does */
      k->k_nn_linear_backward16(dx, dw, db, dout, x, in16, w, NULL, N, IC, OC);
      k->k_nn_linear_backward_set(dx2, dw2, db2, dout, x, w, N, IC, OC);
      if (with_g) {
        /* fc2-like: inp (N, OC) with gelu' (N, OC), out (N, IC) */
        uint16_t *y16b = malloc(no * 2);
        float *dxo = malloc(no * 4), *dxo2 = malloc(no * 4), *dwo = calloc(nw, 4), *dwo2 = calloc(nw, 4);
        float *dbo = calloc(IC, 4), *dbo2 = calloc(IC, 4), *wt = td_test_rand_buf(&rng, nw, 0.3f);
        CHECK(y16b && dxo && dxo2 && dwo && dwo2 && dbo && dbo2 && wt);
        for (size_t i = 0; i < no; i++) y16b[i] = ref_bf16(y[i]);
        k->k_nn_linear_backward16(dxo, dwo, dbo, dx2, y, dt == TD_BF16 ? y16b : NULL, wt, g, N, OC, IC);
        k->k_nn_linear_backward_set_gelu(dxo2, dwo2, dbo2, dx2, y, wt, g, N, OC, IC);
        for (size_t i = 0; i < no; i++) CHECK(f_bits(dxo[i]) == f_bits(dxo2[i]));
        for (size_t i = 0; i < nw; i++) CHECK(f_bits(dwo[i]) == f_bits(dwo2[i]));
        for (int i = 0; i < IC; i++) CHECK(f_bits(dbo[i]) == f_bits(dbo2[i]));
        n_checked += no + nw + IC;
        free(y16b), free(dxo), free(dxo2), free(dwo), free(dwo2), free(dbo), free(dbo2), free(wt);
      }
      for (size_t i = 0; i < ni; i++) CHECK(f_bits(dx[i]) == f_bits(dx2[i]));
      for (size_t i = 0; i < nw; i++) CHECK(f_bits(dw[i]) == f_bits(dw2[i]));
      for (int i = 0; i < OC; i++) CHECK(f_bits(db[i]) == f_bits(db2[i]));
      /* and the weight gradient against a double reference of the bf16 products */
      for (int o = 0; o < OC; o += 7)
        for (int i = 0; i < IC; i += 3) {
          double r = 0, mag = 0;
          for (int n = 0; n < N; n++) {
            double p = (dt == TD_BF16 ? bf(dout[(size_t)n * OC + o]) * bf(x[(size_t)n * IC + i])
                                      : (double)dout[(size_t)n * OC + o] * x[(size_t)n * IC + i]);
            r += p, mag += fabs(p);
          }
          CHECK_CLOSE(dw[(size_t)o * IC + i], r, 0, ldexp(1.0, -20) * sqrt(N + 2.0) * mag + 1e-30);
        }
      n_checked += ni + nw + OC;
    }
    free(x), free(w), free(bias), free(res), free(dout), free(y), free(y2), free(g), free(g2), free(dx), free(dx2);
    free(dw), free(dw2), free(db), free(db2), free(x16), free(y16);
  }
  CHECK_OK(td_nn_set_compute_dtype(TD_F32));
}

int main(void) {
  setvbuf(stdout, NULL, _IONBF, 0);
  td_nn_set_threads(1);
  td_cpu_level top = td_cpu_supported();
  for (int l = 0; l <= (int)top; l++) {
    const nn_kernels *k = nn_kernels_for((td_cpu_level)l);
    check_to_bf16(k, (td_cpu_level)l);
    sweep_gemm(k, (td_cpu_level)l);
    check_layers(k, (td_cpu_level)l);
    printf("level %-10s: bf16 copies (conversion, products from and to copies, layers) match the references\n",
           td_cpu_level_name((td_cpu_level)l));
  }
  if (top < TD_CPU_AVX512BF16) printf("(no AVX512-BF16 on this CPU: the native bf16 kernel was not run)\n");
  printf("%zu outputs checked\n", n_checked);
  return 0;
}
