/* Every layer's backward against central finite differences of its forward,
 * plus the matmul (OpenBLAS and the portable nest against a double-precision
 * reference) and the blocked sgemm attention against a plain-loop reference.
 *
 * Method: for a layer y = f(x, params), take the scalar loss
 * L = sum_i w_i y_i (w fixed random, the sum in double) so that dL/dy = w;
 * run backward with dout = w into gradients pre-filled with 1.0 (which also
 * checks that backward accumulates), and compare each gradient element with
 * (L(x + eps) - L(x - eps)) / 2eps. Shapes are small so that every element
 * is checked. Error measure: |fd - an| <= atol + rtol * max(|fd|, |an|). */
#include <stdint.h>

#include "../common/check.h"
#include "nn/nn_internal.h"

static uint64_t rng_state = 12345;
static float *rand_buf(size_t n, float scale) { return td_test_rand_buf(&rng_state, n, scale); }
static float *const_buf(size_t n, float v) {
  float *p = malloc((n ? n : 1) * sizeof(float));
  for (size_t i = 0; i < n; i++) p[i] = v;
  return p;
}

/* the layer under test: runs forward into `out_buf` and returns sum w*y */
typedef void (*forward_fn)(void);
static forward_fn g_forward;
static float *g_out, *g_w;
static size_t g_n_out;
static double loss_now(void) {
  g_forward();
  double s = 0.0;
  for (size_t i = 0; i < g_n_out; i++) s += (double)g_w[i] * g_out[i];
  return s;
}

static int n_checked;
/* grad holds 1.0 + analytic gradient. */
static void fd_check(const char *what, float *x, size_t n, const float *grad, double eps, double rtol, double atol) {
  double worst = 0.0;
  for (size_t i = 0; i < n; i++) {
    float saved = x[i];
    x[i] = saved + (float)eps;
    double lp = loss_now();
    x[i] = saved - (float)eps;
    double lm = loss_now();
    x[i] = saved;
    double step = (double)(saved + (float)eps) - (double)(saved - (float)eps); /* the step actually taken */
    double fd = (lp - lm) / step;
    double an = (double)grad[i] - 1.0;
    double err = fabs(fd - an), bound = atol + rtol * fmax(fabs(fd), fabs(an));
    if (err > bound)
      td_test_fail(__FILE__, __LINE__, "%s[%zu]: analytic %.7g vs finite difference %.7g (err %.3g > %.3g)", what, i,
                   an, fd, err, bound);
    if (err / (fabs(fd) + 1e-6) > worst) worst = err / (fabs(fd) + 1e-6);
    n_checked++;
  }
  loss_now(); /* leave the forward state of the unperturbed input */
  printf("  %-28s %5zu elements ok (worst relative error %.2e)\n", what, n, worst);
}

/* ---- linear ---- */
enum { LN_N = 5, LN_IC = 7, LN_OC = 6 };
static float *lin_x, *lin_wt, *lin_b;
static void lin_fwd(void) { td_linear_forward(g_out, lin_x, lin_wt, lin_b, LN_N, LN_IC, LN_OC); }
static void test_linear(void) {
  printf("linear\n");
  lin_x = rand_buf(LN_N * LN_IC, 1.0f);
  lin_wt = rand_buf(LN_OC * LN_IC, 0.5f);
  lin_b = rand_buf(LN_OC, 0.5f);
  g_n_out = LN_N * LN_OC;
  g_out = rand_buf(g_n_out, 1.0f);
  g_w = rand_buf(g_n_out, 1.0f);
  g_forward = lin_fwd;
  float *dx = const_buf(LN_N * LN_IC, 1.0f), *dw = const_buf(LN_OC * LN_IC, 1.0f), *db = const_buf(LN_OC, 1.0f);
  td_linear_backward(dx, dw, db, g_w, lin_x, lin_wt, LN_N, LN_IC, LN_OC);
  fd_check("linear.dinp", lin_x, LN_N * LN_IC, dx, 1e-2, 1e-3, 1e-4);
  fd_check("linear.dweight", lin_wt, LN_OC * LN_IC, dw, 1e-2, 1e-3, 1e-4);
  fd_check("linear.dbias", lin_b, LN_OC, db, 1e-2, 1e-3, 1e-4);
  /* the overwrite variant gives the same dinp */
  float *dx2 = const_buf(LN_N * LN_IC, 123.0f);
  nn_linear_backward_set(dx2, NULL, NULL, g_w, lin_x, lin_wt, LN_N, LN_IC, LN_OC);
  for (int i = 0; i < LN_N * LN_IC; i++) CHECK_CLOSE(dx2[i], dx[i] - 1.0f, 1e-5, 1e-6);
  /* the fused residual forward equals resid + linear */
  float *resid = rand_buf(g_n_out, 1.0f), *fused = rand_buf(g_n_out, 1.0f);
  nn_linear_residual_forward(fused, resid, lin_x, lin_wt, lin_b, LN_N, LN_IC, LN_OC);
  lin_fwd();
  for (size_t i = 0; i < g_n_out; i++) CHECK_CLOSE(fused[i], resid[i] + g_out[i], 1e-5, 1e-6);
  free(dx2), free(resid), free(fused);
  free(lin_x), free(lin_wt), free(lin_b), free(g_out), free(g_w), free(dx), free(dw), free(db);
}

/* ---- embedding ---- */
enum { EM_B = 2, EM_T = 3, EM_C = 4, EM_V = 5 };
static float *em_wte, *em_wpe;
static int32_t em_tok[EM_B * EM_T] = {1, 4, 1, 0, 2, 1}; /* a repeated token checks accumulation */
static void em_fwd(void) { td_embedding_forward(g_out, em_tok, em_wte, em_wpe, EM_B, EM_T, EM_C); }
static void test_embedding(void) {
  printf("embedding\n");
  em_wte = rand_buf(EM_V * EM_C, 1.0f);
  em_wpe = rand_buf(EM_T * EM_C, 1.0f);
  g_n_out = EM_B * EM_T * EM_C;
  g_out = rand_buf(g_n_out, 1.0f);
  g_w = rand_buf(g_n_out, 1.0f);
  g_forward = em_fwd;
  float *dte = const_buf(EM_V * EM_C, 1.0f), *dpe = const_buf(EM_T * EM_C, 1.0f);
  td_embedding_backward(dte, dpe, g_w, em_tok, EM_B, EM_T, EM_C);
  fd_check("embedding.dwte", em_wte, EM_V * EM_C, dte, 1e-2, 1e-3, 1e-4);
  fd_check("embedding.dwpe", em_wpe, EM_T * EM_C, dpe, 1e-2, 1e-3, 1e-4);
  free(em_wte), free(em_wpe), free(g_out), free(g_w), free(dte), free(dpe);
}

/* ---- layernorm ---- */
enum { LNM_N = 4, LNM_C = 9 };
static float *lnm_x, *lnm_wt, *lnm_b, lnm_mean[LNM_N], lnm_rstd[LNM_N];
static void lnm_fwd(void) { td_layernorm_forward(g_out, lnm_mean, lnm_rstd, lnm_x, lnm_wt, lnm_b, LNM_N, LNM_C); }
static void test_layernorm(void) {
  printf("layernorm\n");
  lnm_x = rand_buf(LNM_N * LNM_C, 2.0f);
  lnm_wt = rand_buf(LNM_C, 1.0f);
  lnm_b = rand_buf(LNM_C, 1.0f);
  g_n_out = LNM_N * LNM_C;
  g_out = rand_buf(g_n_out, 1.0f);
  g_w = rand_buf(g_n_out, 1.0f);
  g_forward = lnm_fwd;
  lnm_fwd();
  /* closed form: each normalized row has mean 0 and variance 1 before the affine map */
  for (int n = 0; n < LNM_N; n++) {
    double m = 0, v = 0;
    for (int c = 0; c < LNM_C; c++) m += lnm_x[n * LNM_C + c];
    m /= LNM_C;
    for (int c = 0; c < LNM_C; c++) v += (lnm_x[n * LNM_C + c] - m) * (lnm_x[n * LNM_C + c] - m);
    v /= LNM_C;
    CHECK_CLOSE(lnm_mean[n], m, 1e-5, 1e-6);
    CHECK_CLOSE(lnm_rstd[n], 1.0 / sqrt(v + 1e-5), 1e-5, 1e-6);
  }
  float *dx = const_buf(g_n_out, 1.0f), *dw = const_buf(LNM_C, 1.0f), *db = const_buf(LNM_C, 1.0f);
  td_layernorm_backward(dx, dw, db, g_w, lnm_x, lnm_wt, lnm_mean, lnm_rstd, LNM_N, LNM_C);
  fd_check("layernorm.dinp", lnm_x, g_n_out, dx, 1e-2, 2e-3, 2e-4);
  fd_check("layernorm.dweight", lnm_wt, LNM_C, dw, 1e-2, 1e-3, 1e-4);
  fd_check("layernorm.dbias", lnm_b, LNM_C, db, 1e-2, 1e-3, 1e-4);
  free(lnm_x), free(lnm_wt), free(lnm_b), free(g_out), free(g_w), free(dx), free(dw), free(db);
}

/* ---- GELU, ReLU ---- */
enum { ACT_N = 41 };
static float *act_x;
static void gelu_fwd(void) { td_gelu_forward(g_out, act_x, ACT_N); }
static void relu_fwd(void) { td_relu_forward(g_out, act_x, ACT_N); }
static void test_activations(void) {
  printf("gelu, relu\n");
  act_x = rand_buf(ACT_N, 4.0f);
  g_n_out = ACT_N;
  g_out = rand_buf(g_n_out, 1.0f);
  g_w = rand_buf(g_n_out, 1.0f);
  /* closed form GELU values: gelu(0) = 0, gelu(x) ~ x for large x, tanh formula at 1 */
  float probe[3] = {0.0f, 1.0f, 6.0f}, res[3];
  td_gelu_forward(res, probe, 3);
  CHECK_CLOSE(res[0], 0.0, 0, 1e-7);
  CHECK_CLOSE(res[1], 0.5 * (1 + tanh(sqrt(2 / M_PI) * (1 + 0.044715))), 1e-6, 1e-7);
  CHECK_CLOSE(res[2], 6.0, 1e-6, 0);
  g_forward = gelu_fwd;
  float *dx = const_buf(ACT_N, 1.0f);
  td_gelu_forward(g_out, act_x, ACT_N);
  td_gelu_backward(dx, act_x, g_w, ACT_N);
  fd_check("gelu.dinp", act_x, ACT_N, dx, 1e-3, 3e-3, 3e-4);
  float *dx2 = malloc(ACT_N * sizeof(float));
  memcpy(dx2, g_w, ACT_N * sizeof(float));
  nn_gelu_backward_set(dx2, act_x, dx2, ACT_N); /* in place on dout */
  for (int i = 0; i < ACT_N; i++) CHECK_CLOSE(dx2[i], dx[i] - 1.0f, 1e-5, 1e-6);
  /* the model's path: forward keeps gelu' (in place of its input), backward multiplies */
  float *y2 = malloc(ACT_N * sizeof(float)), *cache = malloc(ACT_N * sizeof(float));
  memcpy(cache, act_x, ACT_N * sizeof(float));
  nn_gelu_forward_cache(y2, cache, cache, ACT_N);
  for (int i = 0; i < ACT_N; i++) CHECK_CLOSE(y2[i], g_out[i], 1e-6, 1e-7);
  memcpy(dx2, g_w, ACT_N * sizeof(float));
  nn_gelu_backward_cached(dx2, cache, dx2, ACT_N);
  for (int i = 0; i < ACT_N; i++) CHECK_CLOSE(dx2[i], dx[i] - 1.0f, 1e-5, 1e-6);
  free(y2), free(cache);
  /* ReLU: keep inputs away from the kink at 0 */
  for (int i = 0; i < ACT_N; i++) act_x[i] = act_x[i] >= 0 ? act_x[i] + 0.1f : act_x[i] - 0.1f;
  g_forward = relu_fwd;
  relu_fwd();
  for (int i = 0; i < ACT_N; i++) dx[i] = 1.0f;
  td_relu_backward(dx, g_out, g_w, ACT_N);
  fd_check("relu.dinp", act_x, ACT_N, dx, 1e-2, 1e-4, 1e-5);
  free(act_x), free(g_out), free(g_w), free(dx), free(dx2);
}

/* ---- linear + GELU, fused (nn_gemm_ep's epilogues) against the separate calls ----
 * and the products against double-precision loops. IC = 300 is two depth
 * blocks, so the epilogue must wait for the last one; N and OC2 leave 4 or
 * 8 rows past the last full 12-row tile (the constant-row partial tiles of
 * nn_gemm and nn_gemm_tn). */
static void check_linear_gelu_fused(int N, int OC2) {
  enum { IC = 300, OC = 64 };
  size_t nO = (size_t)N * OC;
  float *x = rand_buf((size_t)N * IC, 1.0f), *w = rand_buf((size_t)OC * IC, 0.1f), *b = rand_buf(OC, 0.1f);
  float *y = malloc(nO * 4), *g = malloc(nO * 4), *y2 = malloc(nO * 4), *g2 = malloc(nO * 4);
  nn_linear_gelu_forward(y, g, x, w, b, N, IC, OC);
  td_linear_forward(g2, x, w, b, N, IC, OC);
  for (int n = 0; n < N; n++)
    for (int o = 0; o < OC; o++) {
      double ref = b[o];
      for (int k = 0; k < IC; k++) ref += (double)x[(size_t)n * IC + k] * w[(size_t)o * IC + k];
      CHECK_CLOSE(g2[(size_t)n * OC + o], ref, 1e-5, 1e-5);
    }
  nn_gelu_forward_cache(y2, g2, g2, nO);
  for (size_t i = 0; i < nO; i++) {
    CHECK_CLOSE(y[i], y2[i], 1e-5, 1e-6);
    CHECK_CLOSE(g[i], g2[i], 1e-5, 1e-6);
  }
  /* backward of a linear (OC2 x OC) fed by that GELU: its dinp times gelu' */
  float *w2 = rand_buf((size_t)OC2 * OC, 0.1f), *dout = rand_buf((size_t)N * OC2, 1.0f);
  float *dx = malloc(nO * 4), *dx2 = malloc(nO * 4);
  float *dw = const_buf((size_t)OC2 * OC, 0.0f), *dw2 = const_buf((size_t)OC2 * OC, 0.0f);
  float *db = const_buf(OC2, 0.0f), *db2 = const_buf(OC2, 0.0f);
  nn_linear_backward_set_gelu(dx, dw, db, dout, y, w2, g, N, OC, OC2);
  nn_linear_backward_set(dx2, dw2, db2, dout, y, w2, N, OC, OC2);
  nn_gelu_backward_cached(dx2, g, dx2, nO);
  for (size_t i = 0; i < nO; i++) CHECK_CLOSE(dx[i], dx2[i], 1e-5, 1e-6);
  for (int i = 0; i < OC2 * OC; i++) CHECK_CLOSE(dw[i], dw2[i], 1e-5, 1e-6);
  for (int i = 0; i < OC2; i++) CHECK_CLOSE(db[i], db2[i], 1e-5, 1e-6);
  for (int n = 0; n < N; n++)
    for (int o = 0; o < OC; o++) {
      double ref = 0;
      for (int j = 0; j < OC2; j++) ref += (double)dout[(size_t)n * OC2 + j] * w2[(size_t)j * OC + o];
      CHECK_CLOSE(dx[(size_t)n * OC + o], ref * g[(size_t)n * OC + o], 1e-5, 1e-5);
    }
  for (int j = 0; j < OC2; j++)
    for (int o = 0; o < OC; o++) {
      double ref = 0;
      for (int n = 0; n < N; n++) ref += (double)dout[(size_t)n * OC2 + j] * y[(size_t)n * OC + o];
      CHECK_CLOSE(dw[(size_t)j * OC + o], ref, 1e-5, 1e-5);
    }
  free(x), free(w), free(b), free(y), free(g), free(y2), free(g2), free(w2), free(dout), free(dx), free(dx2);
  free(dw), free(dw2), free(db), free(db2);
}

static void test_linear_gelu_fused(void) {
  check_linear_gelu_fused(37, 96); /* 1 row past the tiles; 96 = 8 x 12 */
  check_linear_gelu_fused(40, 88); /* 4 past, in nn_gemm and nn_gemm_tn */
  check_linear_gelu_fused(44, 92); /* 8 past */
  printf("linear + GELU fused: matches the separate calls and double-precision products\n");
}

/* ---- attention ---- */
static int at_B = 2, at_T = 5, at_C = 8, at_NH = 2;
static float *at_x, *at_att;
static void at_fwd(void) { td_attention_forward(g_out, at_att, at_x, at_B, at_T, at_C, at_NH); }

/* plain-loop reference in double (llm.c's attention_forward) */
static void attention_reference(double *out, const float *inp, int B, int T, int C, int NH) {
  int hs = C / NH;
  double scale = 1.0 / sqrt(hs);
  double *w = malloc((size_t)T * sizeof(double));
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int h = 0; h < NH; h++) {
        const float *q = inp + ((size_t)b * T + t) * 3 * C + h * hs;
        double mx = -1e300;
        for (int t2 = 0; t2 <= t; t2++) {
          const float *k = inp + ((size_t)b * T + t2) * 3 * C + C + h * hs;
          double s = 0;
          for (int i = 0; i < hs; i++) s += (double)q[i] * k[i];
          w[t2] = s * scale;
          if (w[t2] > mx) mx = w[t2];
        }
        double sum = 0;
        for (int t2 = 0; t2 <= t; t2++) sum += (w[t2] = exp(w[t2] - mx));
        double *o = out + ((size_t)b * T + t) * C + h * hs;
        for (int i = 0; i < hs; i++) o[i] = 0;
        for (int t2 = 0; t2 <= t; t2++) {
          const float *v = inp + ((size_t)b * T + t2) * 3 * C + 2 * C + h * hs;
          for (int i = 0; i < hs; i++) o[i] += w[t2] / sum * v[i];
        }
      }
  free(w);
}

static void test_attention(void) {
  printf("attention\n");
  at_x = rand_buf((size_t)at_B * at_T * 3 * at_C, 1.0f);
  at_att = rand_buf((size_t)at_B * at_NH * at_T * at_T, 1.0f);
  g_n_out = (size_t)at_B * at_T * at_C;
  g_out = rand_buf(g_n_out, 1.0f);
  g_w = rand_buf(g_n_out, 1.0f);
  g_forward = at_fwd;
  at_fwd();
  float *dx = const_buf((size_t)at_B * at_T * 3 * at_C, 1.0f);
  float *scratch = malloc((size_t)at_T * at_T * sizeof(float));
  td_attention_backward(dx, scratch, g_w, at_x, at_att, at_B, at_T, at_C, at_NH);
  fd_check("attention.dinp", at_x, (size_t)at_B * at_T * 3 * at_C, dx, 1e-2, 3e-3, 3e-4);
  free(at_x), free(at_att), free(g_out), free(g_w), free(dx), free(scratch);

  /* the blocked sgemm version against the loop reference, at a size with
   * several row blocks and a ragged last block */
  int B = 2, T = 75, C = 48, NH = 3;
  float *x = rand_buf((size_t)B * T * 3 * C, 1.0f), *att = malloc((size_t)B * NH * T * T * sizeof(float));
  float *out = malloc((size_t)B * T * C * sizeof(float));
  double *ref = malloc((size_t)B * T * C * sizeof(double));
  td_attention_forward(out, att, x, B, T, C, NH);
  attention_reference(ref, x, B, T, C, NH);
  for (size_t i = 0; i < (size_t)B * T * C; i++) CHECK_CLOSE(out[i], ref[i], 1e-4, 1e-5);
  /* attention rows are probability distributions, zero above the diagonal */
  for (int bh = 0; bh < B * NH; bh++)
    for (int i = 0; i < T; i++) {
      double s = 0;
      for (int j = 0; j < T; j++) {
        float p = att[((size_t)bh * T + i) * T + j];
        if (j > i) CHECK(p == 0.0f);
        s += p;
      }
      CHECK_CLOSE(s, 1.0, 1e-5, 0);
    }
  /* and its backward (overwrite variant) against the accumulate variant */
  float *dout = rand_buf((size_t)B * T * C, 1.0f), *d1 = const_buf((size_t)B * T * 3 * C, 0.0f);
  float *d2 = const_buf((size_t)B * T * 3 * C, 7.0f), *sc = malloc((size_t)T * T * sizeof(float));
  td_attention_backward(d1, sc, dout, x, att, B, T, C, NH);
  nn_attention_backward_set(d2, sc, dout, x, att, B, T, C, NH);
  for (size_t i = 0; i < (size_t)B * T * 3 * C; i++) CHECK_CLOSE(d2[i], d1[i], 1e-5, 1e-6);
  printf("  %-28s matches the loop reference at B=%d T=%d C=%d NH=%d\n", "attention (blocked sgemm)", B, T, C, NH);
  /* head size 16: td_attention_* took the register-tiled path; the sgemm
   * formulation (checked by finite differences above at head size 4) agrees */
  float *out_b = malloc((size_t)B * T * C * sizeof(float)), *att_b = malloc((size_t)B * NH * T * T * sizeof(float));
  float *d3 = const_buf((size_t)B * T * 3 * C, 0.0f);
  nn_attention_forward_blas(out_b, att_b, x, B, T, C, NH);
  for (size_t i = 0; i < (size_t)B * T * C; i++) CHECK_CLOSE(out[i], out_b[i], 1e-5, 1e-6);
  for (size_t i = 0; i < (size_t)B * NH * T * T; i++) CHECK_CLOSE(att[i], att_b[i], 1e-5, 1e-7);
  nn_attention_backward_blas(d3, 1.0f, sc, dout, x, att, B, T, C, NH);
  for (size_t i = 0; i < (size_t)B * T * 3 * C; i++) CHECK_CLOSE(d1[i], d3[i], 1e-4, 1e-5);
  printf("  %-28s matches the sgemm version (forward, backward)\n", "attention (register tiles)");
  free(x), free(att), free(out), free(ref), free(dout), free(d1), free(d2), free(sc), free(out_b), free(att_b), free(d3);
}

/* ---- conv2d ---- */
static int cv_B = 2, cv_IC = 2, cv_OC = 3, cv_H = 5, cv_W = 4, cv_K = 3, cv_pad = 1;
static float *cv_x, *cv_wt, *cv_b, *cv_scratch;
static void cv_fwd(void) {
  td_conv2d_forward(g_out, cv_scratch, cv_x, cv_wt, cv_b, cv_B, cv_IC, cv_OC, cv_H, cv_W, cv_K, cv_pad);
}
static void test_conv2d_case(int K, int pad) {
  cv_K = K, cv_pad = pad;
  int OH = cv_H + 2 * pad - K + 1, OW = cv_W + 2 * pad - K + 1;
  printf("conv2d K=%d pad=%d (%dx%d -> %dx%d)\n", K, pad, cv_H, cv_W, OH, OW);
  size_t nx = (size_t)cv_B * cv_IC * cv_H * cv_W, nw = (size_t)cv_OC * cv_IC * K * K;
  cv_x = rand_buf(nx, 1.0f);
  cv_wt = rand_buf(nw, 0.5f);
  cv_b = rand_buf(cv_OC, 0.5f);
  cv_scratch = malloc(2 * (size_t)cv_IC * K * K * OH * OW * sizeof(float));
  g_n_out = (size_t)cv_B * cv_OC * OH * OW;
  g_out = rand_buf(g_n_out, 1.0f);
  g_w = rand_buf(g_n_out, 1.0f);
  g_forward = cv_fwd;
  cv_fwd();
  /* direct convolution in double for one output element per (b, oc) corner */
  for (int b = 0; b < cv_B; b++)
    for (int oc = 0; oc < cv_OC; oc++)
      for (int oh = 0; oh < OH; oh++)
        for (int ow = 0; ow < OW; ow++) {
          double s = cv_b[oc];
          for (int ic = 0; ic < cv_IC; ic++)
            for (int ki = 0; ki < K; ki++)
              for (int kj = 0; kj < K; kj++) {
                int ih = oh + ki - pad, iw = ow + kj - pad;
                if (ih < 0 || ih >= cv_H || iw < 0 || iw >= cv_W) continue;
                s += (double)cv_wt[((oc * cv_IC + ic) * K + ki) * K + kj] *
                     cv_x[(((size_t)b * cv_IC + ic) * cv_H + ih) * cv_W + iw];
              }
          CHECK_CLOSE(g_out[(((size_t)b * cv_OC + oc) * OH + oh) * OW + ow], s, 1e-5, 1e-5);
        }
  float *dx = const_buf(nx, 1.0f), *dw = const_buf(nw, 1.0f), *db = const_buf(cv_OC, 1.0f);
  td_conv2d_backward(dx, dw, db, cv_scratch, g_w, cv_x, cv_wt, cv_B, cv_IC, cv_OC, cv_H, cv_W, K, pad);
  fd_check("conv2d.dinp", cv_x, nx, dx, 1e-2, 1e-3, 2e-4);
  fd_check("conv2d.dweight", cv_wt, nw, dw, 1e-2, 1e-3, 2e-4);
  fd_check("conv2d.dbias", cv_b, cv_OC, db, 1e-2, 1e-3, 2e-4);
  free(cv_x), free(cv_wt), free(cv_b), free(cv_scratch), free(g_out), free(g_w), free(dx), free(dw), free(db);
}

/* ---- maxpool ---- */
enum { MP_B = 2, MP_C = 2, MP_H = 4, MP_W = 6 };
static float *mp_x;
static int32_t mp_am[MP_B * MP_C * MP_H * MP_W / 4];
static void mp_fwd(void) { td_maxpool2_forward(g_out, mp_am, mp_x, MP_B, MP_C, MP_H, MP_W); }
static void test_maxpool(void) {
  printf("maxpool2\n");
  size_t nx = MP_B * MP_C * MP_H * MP_W;
  mp_x = malloc(nx * sizeof(float));
  /* distinct values at least 0.1 apart so that eps never changes a winner */
  for (size_t i = 0; i < nx; i++) mp_x[i] = 0.1f * (float)((i * 37) % nx) - 2.0f;
  g_n_out = nx / 4;
  g_out = rand_buf(g_n_out, 1.0f);
  g_w = rand_buf(g_n_out, 1.0f);
  g_forward = mp_fwd;
  mp_fwd();
  for (size_t o = 0; o < g_n_out; o++) {
    size_t plane = o / (MP_H / 2 * MP_W / 2), r = o % (MP_H / 2 * MP_W / 2);
    size_t oh = r / (MP_W / 2), ow = r % (MP_W / 2);
    const float *x = mp_x + plane * MP_H * MP_W;
    float m = fmaxf(fmaxf(x[2 * oh * MP_W + 2 * ow], x[2 * oh * MP_W + 2 * ow + 1]),
                    fmaxf(x[(2 * oh + 1) * MP_W + 2 * ow], x[(2 * oh + 1) * MP_W + 2 * ow + 1]));
    CHECK(g_out[o] == m);
  }
  float *dx = const_buf(nx, 1.0f);
  td_maxpool2_backward(dx, g_w, mp_am, MP_B, MP_C, MP_H, MP_W);
  fd_check("maxpool2.dinp", mp_x, nx, dx, 1e-2, 1e-4, 1e-5);
  free(mp_x), free(g_out), free(g_w), free(dx);
}

/* ---- softmax cross-entropy ---- */
enum { SX_N = 4, SX_V = 7 };
static float *sx_logits, sx_probs[SX_N * SX_V], sx_loss;
static int32_t sx_tgt[SX_N] = {0, 6, 3, 3};
static void sx_fwd(void) { sx_loss = td_softmax_xent_forward(sx_probs, sx_logits, sx_tgt, SX_N, SX_V); }
static double sx_loss_now(void) {
  sx_fwd();
  return sx_loss;
}
static void test_softmax_xent(void) {
  printf("softmax cross-entropy\n");
  sx_logits = rand_buf(SX_N * SX_V, 3.0f);
  sx_fwd();
  double ref = 0;
  for (int n = 0; n < SX_N; n++) {
    double mx = -1e30, s = 0;
    for (int v = 0; v < SX_V; v++) mx = fmax(mx, sx_logits[n * SX_V + v]);
    for (int v = 0; v < SX_V; v++) s += exp(sx_logits[n * SX_V + v] - mx);
    ref += -(sx_logits[n * SX_V + sx_tgt[n]] - mx - log(s));
  }
  CHECK_CLOSE(sx_loss, ref / SX_N, 1e-6, 1e-7);
  /* uniform logits: loss = ln V exactly */
  float zeros[SX_N * SX_V] = {0}, pr[SX_N * SX_V];
  CHECK_CLOSE(td_softmax_xent_forward(pr, zeros, sx_tgt, SX_N, SX_V), log(SX_V), 1e-6, 0);
  /* the loss is scalar here: check dloss = 2 */
  float dl[SX_N * SX_V];
  for (int i = 0; i < SX_N * SX_V; i++) dl[i] = 1.0f;
  td_softmax_xent_backward(dl, sx_probs, sx_tgt, 2.0f, SX_N, SX_V);
  double worst = 0;
  for (int i = 0; i < SX_N * SX_V; i++) {
    float saved = sx_logits[i];
    sx_logits[i] = saved + 1e-2f;
    double lp = sx_loss_now();
    sx_logits[i] = saved - 1e-2f;
    double lm = sx_loss_now();
    sx_logits[i] = saved;
    double fd = 2.0 * (lp - lm) / 2e-2, an = dl[i] - 1.0;
    CHECK_CLOSE(an, fd, 2e-3, 2e-4);
    worst = fmax(worst, fabs(an - fd));
    n_checked++;
  }
  sx_fwd();
  float dset[SX_N * SX_V];
  nn_softmax_xent_backward_set(dset, sx_probs, sx_tgt, 2.0f, SX_N, SX_V);
  for (int i = 0; i < SX_N * SX_V; i++) CHECK_CLOSE(dset[i], dl[i] - 1.0f, 1e-6, 1e-7);
  /* probs may alias logits */
  float alias[SX_N * SX_V];
  memcpy(alias, sx_logits, sizeof alias);
  CHECK_CLOSE(td_softmax_xent_forward(alias, alias, sx_tgt, SX_N, SX_V), sx_loss, 1e-7, 0);
  for (int i = 0; i < SX_N * SX_V; i++) CHECK_CLOSE(alias[i], sx_probs[i], 1e-7, 0);
  printf("  %-28s %5d elements ok (worst abs error %.2e)\n", "softmax_xent.dlogits", SX_N * SX_V, worst);
  free(sx_logits);
}

/* ---- matmul ---- */
static void test_sgemm(void) {
  printf("sgemm (%s)\n", td_nn_matmul_backend());
  /* shapes straddling the portable nest's blocks (KC 256, NC 512) and the 4-row tail */
  int shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {33, 17, 300}, {6, 530, 20}, {0, 4, 4}, {5, 3, 0}};
  for (size_t s = 0; s < TD_ARRAY_SIZE(shapes); s++)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++) {
        int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        int lda = (ta ? M : K) + 2, ldb = (tb ? K : N) + 1, ldc = N + 3;
        float *A = rand_buf((size_t)(ta ? K : M) * lda, 1.0f), *B = rand_buf((size_t)(tb ? N : K) * ldb, 1.0f);
        float *C0 = rand_buf((size_t)M * ldc, 1.0f);
        float *C1 = malloc(((size_t)M * ldc + 1) * sizeof(float)), *C2 = malloc(((size_t)M * ldc + 1) * sizeof(float));
        memcpy(C1, C0, (size_t)M * ldc * sizeof(float));
        memcpy(C2, C0, (size_t)M * ldc * sizeof(float));
        float alpha = 0.75f, beta = s % 2 ? 0.0f : 0.5f;
        td_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C1, ldc);
        nn_sgemm_portable(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C2, ldc);
        for (int i = 0; i < M; i++)
          for (int j = 0; j < N; j++) {
            double ref = beta * C0[(size_t)i * ldc + j];
            for (int k = 0; k < K; k++)
              ref += alpha * (double)(ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]) *
                     (tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j]);
            double tol = 1e-6 * (K + 1) + 1e-6;
            CHECK_CLOSE(C1[(size_t)i * ldc + j], ref, 0, tol * 4);
            CHECK_CLOSE(C2[(size_t)i * ldc + j], ref, 0, tol * 4);
          }
        /* padding columns between N and ldc are untouched */
        for (int i = 0; i < M; i++)
          for (int j = N; j < ldc; j++) {
            CHECK(C1[(size_t)i * ldc + j] == C0[(size_t)i * ldc + j]);
            CHECK(C2[(size_t)i * ldc + j] == C0[(size_t)i * ldc + j]);
          }
        free(A), free(B), free(C0), free(C1), free(C2);
      }
  printf("  %-28s td_sgemm and the portable nest match a double reference\n", "sgemm");
}

/* The linear layers' own product (nn_gemm) against a double reference: shapes
 * across its blocks (12-row tiles, 120-row L2 blocks, depth 256, 256-column
 * panels), both B layouts, with and without bias and initial C (none, C
 * itself, another matrix). Without AVX-512 it declines (returns 0). */
static void test_nn_gemm(void) {
  printf("nn_gemm\n");
  int shapes[][3] = {{1, 32, 1}, {13, 64, 5}, {250, 288, 600}, {120, 32, 256}};
  int ran = 0;
  for (size_t s = 0; s < TD_ARRAY_SIZE(shapes); s++)
    for (int tb = 0; tb < 2; tb++)
      for (int mode = 0; mode < 3; mode++) { /* c_in: 0 none, 1 = C (accumulate), 2 separate */
        int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        int lda = K + 3, ldb = (tb ? K : N) + 5, ldc = N + 7, ld_in = N + 2;
        float *A = rand_buf((size_t)M * lda, 1.0f), *B = rand_buf((size_t)(tb ? N : K) * ldb, 1.0f);
        float *C0 = rand_buf((size_t)M * ldc, 1.0f), *C = malloc((size_t)M * ldc * sizeof(float));
        float *in = rand_buf((size_t)M * ld_in, 1.0f), *bias = (mode + (int)s) % 2 ? rand_buf((size_t)N, 1.0f) : NULL;
        memcpy(C, C0, (size_t)M * ldc * sizeof(float));
        const float *c_in = mode == 1 ? C : mode == 2 ? in : NULL;
        int ld_c_in = mode == 1 ? ldc : ld_in;
        if (!nn_gemm(tb, M, N, K, A, lda, B, ldb, c_in, ld_c_in, bias, C, ldc)) {
          for (size_t i = 0; i < (size_t)M * ldc; i++) CHECK(C[i] == C0[i]);
        } else {
          ran++;
          for (int i = 0; i < M; i++) {
            for (int j = 0; j < N; j++) {
              double ref = (bias ? bias[j] : 0.0) + (mode == 1   ? C0[(size_t)i * ldc + j]
                                                     : mode == 2 ? in[(size_t)i * ld_in + j]
                                                                 : 0.0);
              for (int k = 0; k < K; k++)
                ref += (double)A[(size_t)i * lda + k] * (tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j]);
              CHECK_CLOSE(C[(size_t)i * ldc + j], ref, 0, 4e-6 * (K + 2));
            }
            for (int j = N; j < ldc; j++) CHECK(C[(size_t)i * ldc + j] == C0[(size_t)i * ldc + j]);
          }
        }
        free(A), free(B), free(C0), free(C), free(in), free(bias);
      }
  /* the transposed-A form (weight gradients): C += A^T B, across its blocks */
  {
    int tn_shapes[][3] = {{1, 32, 1}, {13, 64, 5}, {250, 288, 600}, {120, 32, 256}};
    for (size_t s = 0; s < TD_ARRAY_SIZE(tn_shapes); s++) {
      int M = tn_shapes[s][0], N = tn_shapes[s][1], K = tn_shapes[s][2];
      int lda = M + 3, ldb = N + 5, ldc = N + 7;
      float *A = rand_buf((size_t)K * lda, 1.0f), *B = rand_buf((size_t)K * ldb, 1.0f);
      float *C0 = rand_buf((size_t)M * ldc, 1.0f), *C = malloc((size_t)M * ldc * sizeof(float));
      memcpy(C, C0, (size_t)M * ldc * sizeof(float));
      float *cs = rand_buf((size_t)M, 1.0f), *cs0 = malloc((size_t)M * sizeof(float));
      memcpy(cs0, cs, (size_t)M * sizeof(float));
      if (nn_gemm_tn(M, N, K, A, lda, B, ldb, C, ldc, cs)) {
        ran++;
        for (int i = 0; i < M; i++) {
          for (int j = 0; j < N; j++) {
            double ref = C0[(size_t)i * ldc + j];
            for (int k = 0; k < K; k++) ref += (double)A[(size_t)k * lda + i] * B[(size_t)k * ldb + j];
            CHECK_CLOSE(C[(size_t)i * ldc + j], ref, 0, 4e-6 * (K + 2));
          }
          for (int j = N; j < ldc; j++) CHECK(C[(size_t)i * ldc + j] == C0[(size_t)i * ldc + j]);
          double col = cs0[i];
          for (int k = 0; k < K; k++) col += A[(size_t)k * lda + i];
          CHECK_CLOSE(cs[i], col, 0, 4e-6 * (K + 2));
        }
      } else {
        for (size_t i = 0; i < (size_t)M * ldc; i++) CHECK(C[i] == C0[i]);
      }
      free(A), free(B), free(C0), free(C), free(cs), free(cs0);
    }
  }
  /* the linear layers that route through it, at widths it takes (IC, OC % 32 == 0) */
  {
    enum { N = 37, IC = 64, OC = 96 };
    float *x = rand_buf(N * IC, 1.0f), *w = rand_buf(OC * IC, 1.0f), *bias = rand_buf(OC, 1.0f);
    float *resid = rand_buf(N * OC, 1.0f), *dout = rand_buf(N * OC, 1.0f);
    float *out = malloc(N * OC * sizeof(float)), *fused = malloc(N * OC * sizeof(float));
    float *dx = rand_buf(N * IC, 1.0f), *dx_set = malloc(N * IC * sizeof(float));
    float *dx0 = malloc(N * IC * sizeof(float));
    memcpy(dx0, dx, N * IC * sizeof(float));
    td_linear_forward(out, x, w, bias, N, IC, OC);
    nn_linear_residual_forward(fused, resid, x, w, bias, N, IC, OC);
    float *dw = rand_buf(OC * IC, 1.0f), *dw0 = malloc(OC * IC * sizeof(float));
    memcpy(dw0, dw, OC * IC * sizeof(float));
    float *db = rand_buf(OC, 1.0f), *db0 = malloc(OC * sizeof(float));
    memcpy(db0, db, OC * sizeof(float));
    td_linear_backward(dx, dw, db, dout, x, w, N, IC, OC);
    for (int o = 0; o < OC; o++) {
      double ref = db0[o];
      for (int n = 0; n < N; n++) ref += dout[n * OC + o];
      CHECK_CLOSE(db[o], ref, 0, 4e-6 * N);
    }
    free(db), free(db0);
    for (int o = 0; o < OC; o++)
      for (int i = 0; i < IC; i++) {
        double ref = dw0[o * IC + i];
        for (int n = 0; n < N; n++) ref += (double)dout[n * OC + o] * x[n * IC + i];
        CHECK_CLOSE(dw[o * IC + i], ref, 0, 4e-6 * N);
      }
    free(dw), free(dw0);
    nn_linear_backward_set(dx_set, NULL, NULL, dout, x, w, N, IC, OC);
    for (int n = 0; n < N; n++) {
      for (int o = 0; o < OC; o++) {
        double ref = bias[o];
        for (int i = 0; i < IC; i++) ref += (double)x[n * IC + i] * w[o * IC + i];
        CHECK_CLOSE(out[n * OC + o], ref, 0, 4e-6 * IC);
        CHECK_CLOSE(fused[n * OC + o], ref + resid[n * OC + o], 0, 4e-6 * IC);
      }
      for (int i = 0; i < IC; i++) {
        double ref = 0;
        for (int o = 0; o < OC; o++) ref += (double)dout[n * OC + o] * w[o * IC + i];
        CHECK_CLOSE(dx_set[n * IC + i], ref, 0, 4e-6 * OC);
        CHECK_CLOSE(dx[n * IC + i], ref + dx0[n * IC + i], 0, 4e-6 * OC);
      }
    }
    free(x), free(w), free(bias), free(resid), free(dout), free(out), free(fused), free(dx), free(dx_set), free(dx0);
  }
  /* a width that is not a multiple of 32 is declined untouched */
  float a = 1.0f, b[20] = {0}, c[20] = {0};
  CHECK(nn_gemm(0, 1, 20, 1, &a, 1, b, 20, NULL, 0, NULL, c, 20) == 0);
  /* the AVX-512 products exist only at that CPU level (the test itself is
   * built for baseline x86-64): every shape ran there, none elsewhere */
  CHECK(ran == (td_cpu_active() >= TD_CPU_AVX512 ? (int)TD_ARRAY_SIZE(shapes) * 6 + 4 : 0));
  printf("  %-28s %d products match a double reference\n", "nn_gemm", ran);
}

int main(void) {
  td_nn_set_threads(1);
  test_sgemm();
  test_nn_gemm();
  test_linear();
  test_embedding();
  test_layernorm();
  test_activations();
  test_linear_gelu_fused();
  test_attention();
  test_conv2d_case(3, 1);
  test_conv2d_case(5, 2);
  test_conv2d_case(2, 0);
  test_conv2d_case(4, 3); /* padding wider than the kernel's reach: whole padded rows and columns */
  test_maxpool();
  test_softmax_xent();
  printf("all layer gradients match finite differences (%d elements)\n", n_checked);
  return 0;
}
