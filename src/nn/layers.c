/* Layers: forward and backward over plain float pointers, after llm.c's
 * train_gpt2.c. Every backward accumulates (+=) into its gradients unless it
 * is one of the nn_*_set variants (nn_internal.h), which overwrite so that
 * the models need not clear a buffer they are about to fill.
 *
 * Hot loops keep their inner dimension contiguous, take restrict pointers
 * and call nothing but inline helpers, so that gcc vectorizes them at -O3;
 * matrix products go through td_sgemm (OpenBLAS or the portable nest). */
#include "nn_kernels.h" /* first: names this level's functions (compiled once per CPU level) */

#include <float.h>
#include <string.h>

/* ---- linear ----
 * Under mixed precision (td_nn_set_compute_dtype) the products take the
 * half-precision path (nn_gemm_lowp); the bias, residual, GELU and bias
 * gradient stay f32 around them. */

void td_linear_forward(float *out, const float *inp, const float *weight, const float *bias, int N, int IC, int OC) {
  /* out (N, OC) = inp (N, IC) @ weight^T (IC, OC) */
  td_dtype lowp = td_nn_compute_dtype();
  if (lowp != TD_F32 && nn_gemm_lowp(lowp, 0, 1, N, OC, IC, inp, IC, weight, IC, 0.0f, bias, out, OC)) return;
  if (nn_gemm(1, N, OC, IC, inp, IC, weight, IC, NULL, 0, bias, out, OC)) return;
  float beta = 0.0f;
  if (bias) {
    for (int n = 0; n < N; n++) memcpy(out + (size_t)n * OC, bias, (size_t)OC * sizeof(float));
    beta = 1.0f;
  }
  td_sgemm(0, 1, N, OC, IC, 1.0f, inp, IC, weight, IC, beta, out, OC);
}

void nn_linear_residual_forward(float *out, const float *resid, const float *inp, const float *weight,
                                const float *bias, int N, int IC, int OC) {
  td_dtype lowp = td_nn_compute_dtype();
  /* the residual is read in the tiles' first store (no copy into out first) */
  if (lowp != TD_F32 &&
      nn_gemm_lowp_ep(lowp, 0, 1, N, OC, IC, inp, IC, weight, IC, resid, OC, bias, out, OC, NN_GEMM_PLAIN, NULL, NULL))
    return;
  if (nn_gemm(1, N, OC, IC, inp, IC, weight, IC, resid, OC, bias, out, OC)) return;
  for (int n = 0; n < N; n++) {
    float *restrict o = out + (size_t)n * OC;
    const float *restrict r = resid + (size_t)n * OC;
    if (bias)
      for (int j = 0; j < OC; j++) o[j] = r[j] + bias[j];
    else
      memcpy(o, r, (size_t)OC * sizeof(float));
  }
  td_sgemm(0, 1, N, OC, IC, 1.0f, inp, IC, weight, IC, 1.0f, out, OC);
}

void nn_linear_gelu_forward(float *out, float *dgelu, const float *inp, const float *weight, const float *bias, int N,
                            int IC, int OC) {
  td_dtype lowp = td_nn_compute_dtype();
  if (lowp == TD_F32 && nn_gemm_ep(1, N, OC, IC, inp, IC, weight, IC, NULL, 0, bias, out, OC, NN_GEMM_GELU, dgelu))
    return;
  if (lowp != TD_F32 &&
      nn_gemm_lowp_ep(lowp, 0, 1, N, OC, IC, inp, IC, weight, IC, NULL, 0, bias, out, OC, NN_GEMM_GELU, dgelu, NULL))
    return;
  td_linear_forward(dgelu, inp, weight, bias, N, IC, OC);
  nn_gelu_forward_cache(out, dgelu, dgelu, (size_t)N * OC);
}

/* dgelu: unless NULL, dinp (beta_dinp 0 only) is multiplied by it (a GELU's backward). */
static void linear_backward(float *dinp, float beta_dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, const float *dgelu, int N, int IC, int OC) {
  /* under mixed precision the two products are half-precision (each falls
   * back to f32 only when out of memory for its scratch) */
  td_dtype lowp = td_nn_compute_dtype();
  if (lowp != TD_F32 && dinp &&
      nn_gemm_lowp_ep(lowp, 0, 0, N, IC, OC, dout, OC, weight, IC, beta_dinp != 0.0f ? dinp : NULL, IC, NULL, dinp,
                      IC, dgelu ? NN_GEMM_MUL : NN_GEMM_PLAIN, (float *)dgelu, NULL))
    dinp = NULL; /* done, the GELU's backward included */
  /* the bias gradient is summed while dout is packed */
  if (lowp != TD_F32 && dweight &&
      nn_gemm_lowp_ep(lowp, 1, 0, OC, IC, N, dout, OC, inp, IC, dweight, IC, NULL, dweight, IC, NN_GEMM_PLAIN, NULL,
                      dbias))
    dweight = dbias = NULL; /* done */
  /* dinp (N, IC) = dout (N, OC) @ weight (OC, IC) */
  if (dinp && !nn_gemm_ep(0, N, IC, OC, dout, OC, weight, IC, beta_dinp != 0.0f ? dinp : NULL, IC, NULL, dinp, IC,
                          dgelu ? NN_GEMM_MUL : NN_GEMM_PLAIN, (float *)dgelu)) {
    td_sgemm(0, 0, N, IC, OC, 1.0f, dout, OC, weight, IC, beta_dinp, dinp, IC);
    if (dgelu) nn_gelu_backward_cached(dinp, dgelu, dinp, (size_t)N * IC);
  }
  /* dweight (OC, IC) += dout^T (OC, N) @ inp (N, IC) */
  if (dweight && nn_gemm_tn(OC, IC, N, dout, OC, inp, IC, dweight, IC, dbias)) dbias = NULL; /* summed there */
  else if (dweight) td_sgemm(1, 0, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dweight, IC);
  if (dbias) {
    float *restrict db = dbias;
    for (int n = 0; n < N; n++) {
      const float *restrict d = dout + (size_t)n * OC;
      for (int j = 0; j < OC; j++) db[j] += d[j];
    }
  }
}

void td_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                        const float *weight, int N, int IC, int OC) {
  linear_backward(dinp, 1.0f, dweight, dbias, dout, inp, weight, NULL, N, IC, OC);
}

void nn_linear_backward_set(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *weight, int N, int IC, int OC) {
  linear_backward(dinp, 0.0f, dweight, dbias, dout, inp, weight, NULL, N, IC, OC);
}

void nn_linear_backward_set_gelu(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                                 const float *weight, const float *dgelu, int N, int IC, int OC) {
  linear_backward(dinp, 0.0f, dweight, dbias, dout, inp, weight, dgelu, N, IC, OC);
}

/* ---- embedding ---- */

void td_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe, int B, int T,
                          int C) {
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      float *restrict o = out + ((size_t)b * T + t) * C;                  /* (C) */
      const float *restrict te = wte + (size_t)tokens[(size_t)b * T + t] * C; /* (C) */
      const float *restrict pe = wpe + (size_t)t * C;                      /* (C) */
      for (int c = 0; c < C; c++) o[c] = te[c] + pe[c];
    }
}

void td_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens, int B, int T, int C) {
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      const float *restrict d = dout + ((size_t)b * T + t) * C;
      if (dwte) {
        float *restrict dte = dwte + (size_t)tokens[(size_t)b * T + t] * C;
        for (int c = 0; c < C; c++) dte[c] += d[c];
      }
      if (dwpe) {
        float *restrict dpe = dwpe + (size_t)t * C;
        for (int c = 0; c < C; c++) dpe[c] += d[c];
      }
    }
}

/* ---- layernorm ----
 * Rows of C floats, reductions in 16-lane accumulators: gcc does not
 * vectorize a float sum without -ffast-math, and scalar reductions made
 * layernorm ~4% of a GPT step. Tail lanes load as the mean (forward) or 0
 * (backward) so that they add nothing. */

void td_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                          const float *bias, int N, int C) {
  const float eps = 1e-5f;
  const int tail = C % 16, C16 = C - tail;
  for (int n = 0; n < N; n++) {
    const float *restrict x = inp + (size_t)n * C;
    float *restrict o = out + (size_t)n * C;
    nn_v16f acc = NN_V16(0.0f);
    for (int c = 0; c < C16; c += 16) acc += nn_v16_load(x + c);
    if (tail) acc += nn_v16_load_partial(x + C16, tail, 0.0f);
    float m = nn_v16_sum(acc) / C;
    nn_v16f var = NN_V16(0.0f);
    for (int c = 0; c < C16; c += 16) {
      nn_v16f d = nn_v16_load(x + c) - m;
      var += d * d;
    }
    if (tail) {
      nn_v16f d = nn_v16_load_partial(x + C16, tail, m) - m;
      var += d * d;
    }
    float rs = 1.0f / sqrtf(nn_v16_sum(var) / C + eps);
    for (int c = 0; c < C16; c += 16)
      nn_v16_store(o + c, (nn_v16_load(x + c) - m) * rs * nn_v16_load(weight + c) + nn_v16_load(bias + c));
    if (tail)
      nn_v16_store_partial(o + C16,
                           (nn_v16_load_partial(x + C16, tail, m) - m) * rs *
                                   nn_v16_load_partial(weight + C16, tail, 0.0f) +
                               nn_v16_load_partial(bias + C16, tail, 0.0f),
                           tail);
    mean[n] = m;
    rstd[n] = rs;
  }
}

/* One row of layernorm backward on lanes [c, c + 16) (the first `lanes` of them). */
static inline void layernorm_backward_lanes(float *dx, float *dw, float *db, const float *d, const float *x,
                                            const float *w, float m, float rs, float dnorm_mean,
                                            float dnorm_norm_mean, int lanes) {
  nn_v16f dv, xv, wv;
  if (lanes == 16) {
    dv = nn_v16_load(d), xv = nn_v16_load(x), wv = nn_v16_load(w);
  } else {
    dv = nn_v16_load_partial(d, lanes, 0.0f), xv = nn_v16_load_partial(x, lanes, m);
    wv = nn_v16_load_partial(w, lanes, 0.0f);
  }
  nn_v16f norm = (xv - m) * rs;
  nn_v16f g = (wv * dv - dnorm_mean - norm * dnorm_norm_mean) * rs;
  if (lanes == 16) {
    if (db) nn_v16_store(db, nn_v16_load(db) + dv);
    if (dw) nn_v16_store(dw, nn_v16_load(dw) + norm * dv);
    nn_v16_store(dx, nn_v16_load(dx) + g);
  } else {
    if (db) nn_v16_store_partial(db, nn_v16_load_partial(db, lanes, 0.0f) + dv, lanes);
    if (dw) nn_v16_store_partial(dw, nn_v16_load_partial(dw, lanes, 0.0f) + norm * dv, lanes);
    nn_v16_store_partial(dx, nn_v16_load_partial(dx, lanes, 0.0f) + g, lanes);
  }
}

void td_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                           const float *weight, const float *mean, const float *rstd, int N, int C) {
  const int tail = C % 16, C16 = C - tail;
  for (int n = 0; n < N; n++) {
    const float *restrict d = dout + (size_t)n * C;
    const float *restrict x = inp + (size_t)n * C;
    float *restrict dx = dinp + (size_t)n * C;
    float m = mean[n], rs = rstd[n];
    /* two reductions: mean of dnorm and mean of dnorm * norm */
    nn_v16f acc_d = NN_V16(0.0f), acc_dn = NN_V16(0.0f);
    for (int c = 0; c < C16; c += 16) {
      nn_v16f norm = (nn_v16_load(x + c) - m) * rs;
      nn_v16f dnorm = nn_v16_load(weight + c) * nn_v16_load(d + c);
      acc_d += dnorm;
      acc_dn += dnorm * norm;
    }
    if (tail) {
      nn_v16f norm = (nn_v16_load_partial(x + C16, tail, m) - m) * rs;
      nn_v16f dnorm = nn_v16_load_partial(weight + C16, tail, 0.0f) * nn_v16_load_partial(d + C16, tail, 0.0f);
      acc_d += dnorm;
      acc_dn += dnorm * norm;
    }
    float dnorm_mean = nn_v16_sum(acc_d) / C, dnorm_norm_mean = nn_v16_sum(acc_dn) / C;
    for (int c = 0; c < C16; c += 16)
      layernorm_backward_lanes(dx + c, dweight ? dweight + c : NULL, dbias ? dbias + c : NULL, d + c, x + c,
                               weight + c, m, rs, dnorm_mean, dnorm_norm_mean, 16);
    if (tail)
      layernorm_backward_lanes(dx + C16, dweight ? dweight + C16 : NULL, dbias ? dbias + C16 : NULL, d + C16,
                               x + C16, weight + C16, m, rs, dnorm_mean, dnorm_norm_mean, tail);
  }
}

/* ---- GELU (tanh approximation) ----
 * With u = sqrt(2/pi) (x + 0.044715 x^3) and s = sigmoid(2u) = (1 + tanh u) / 2:
 *   gelu(x) = x s,   gelu'(x) = s + 2 x s (1 - s) du/dx.
 * One exponential and one reciprocal give both, so the model's forward
 * stores gelu' (nn_gelu_forward_cache, in matmul.c beside the GEMM's GELU
 * epilogue, which matmul_bf16.c uses too) and its backward is one multiply
 * instead of recomputing tanh (GELU fell from ~7% of a GPT step to ~2.5%). */

/* nn_gelu_sigmoid_v16 and nn_gelu_grad_from_s are in nn_internal.h (the GEMM epilogue uses them too). */
#define gelu_sigmoid_v16 nn_gelu_sigmoid_v16
#define gelu_grad_from_s nn_gelu_grad_from_s

void td_gelu_forward(float *out, const float *inp, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    nn_v16f x = nn_v16_load(inp + i);
    nn_v16_store(out + i, x * gelu_sigmoid_v16(x));
  }
  if (i < n) {
    int rest = (int)(n - i);
    nn_v16f x = nn_v16_load_partial(inp + i, rest, 0.0f);
    nn_v16_store_partial(out + i, x * gelu_sigmoid_v16(x), rest);
  }
}

/* dinp (+)= gelu'(inp) * dout; dinp may alias dout (each chunk is read first) */
static void gelu_backward(float *dinp, int accumulate, const float *inp, const float *dout, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    nn_v16f x = nn_v16_load(inp + i);
    nn_v16f g = gelu_grad_from_s(x, gelu_sigmoid_v16(x)) * nn_v16_load(dout + i);
    if (accumulate) g += nn_v16_load(dinp + i);
    nn_v16_store(dinp + i, g);
  }
  if (i < n) {
    int rest = (int)(n - i);
    nn_v16f x = nn_v16_load_partial(inp + i, rest, 0.0f);
    nn_v16f g = gelu_grad_from_s(x, gelu_sigmoid_v16(x)) * nn_v16_load_partial(dout + i, rest, 0.0f);
    if (accumulate) g += nn_v16_load_partial(dinp + i, rest, 0.0f);
    nn_v16_store_partial(dinp + i, g, rest);
  }
}

void td_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
  gelu_backward(dinp, 1, inp, dout, n);
}

void nn_gelu_backward_set(float *dinp, const float *inp, const float *dout, size_t n) {
  gelu_backward(dinp, 0, inp, dout, n);
}

float nn_exp_shift_sum(float *x, int n, float shift) {
  nn_v16f acc = NN_V16(0.0f);
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    nn_v16f e = nn_expf_v16(nn_v16_load(x + i) - shift);
    nn_v16_store(x + i, e);
    acc += e;
  }
  if (i < n) {
    nn_v16f e = nn_expf_v16(nn_v16_load_partial(x + i, n - i, 0.0f) - shift);
    nn_v16_store_partial(x + i, e, n - i);
    acc += nn_v16_first(e, n - i);
  }
  return nn_v16_sum(acc);
}

/* max of x[0..n) */
static float max_of(const float *x, int n) {
  nn_v16f mx = NN_V16(-FLT_MAX);
  int i = 0;
  for (; i + 16 <= n; i += 16) mx = nn_v16_max(mx, nn_v16_load(x + i));
  if (i < n) mx = nn_v16_max(mx, nn_v16_load_partial(x + i, n - i, -FLT_MAX));
  return nn_v16_hmax(mx);
}

/* sum of a[j] b[j] over j < n */
static float dot_of(const float *a, const float *b, int n) {
  nn_v16f acc = NN_V16(0.0f);
  int i = 0;
  for (; i + 16 <= n; i += 16) acc += nn_v16_load(a + i) * nn_v16_load(b + i);
  if (i < n) acc += nn_v16_load_partial(a + i, n - i, 0.0f) * nn_v16_load_partial(b + i, n - i, 0.0f);
  return nn_v16_sum(acc);
}

/* x[j] *= s over j < n */
static void scale_of(float *x, int n, float s) {
  float *restrict p = x;
  for (int i = 0; i < n; i++) p[i] *= s;
}

/* ---- ReLU ---- */

void td_relu_forward(float *out, const float *inp, size_t n) {
  for (size_t i = 0; i < n; i++) out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
}

void td_relu_backward(float *dinp, const float *out, const float *dout, size_t n) {
  float *restrict dx = dinp;
  const float *restrict y = out, *restrict d = dout;
  for (size_t i = 0; i < n; i++) dx[i] += y[i] > 0.0f ? d[i] : 0.0f;
}

/* ---- causal self-attention ----
 * Per (batch b, head h), with q, k, v the (T, hs) slices of inp at row
 * stride 3C:
 *   S = q k^T * scale           one sgemm (T x T x hs)
 *   P = causal_softmax(S)       row by row, zero above the diagonal (att)
 *   out_h = P v                 one sgemm (T x hs x T), written at row stride C
 * Backward:
 *   dP = dout_h v^T             dv += P^T dout_h
 *   dS = P * (dP - rowsum(P * dP))  (masked), then
 *   dq += scale dS k            dk += scale dS^T q
 * The products are tiny per head (T=128, hs=64) but OpenBLAS still runs them
 * ~4.5x faster than llm.c-style scalar loops at B=8 T=128 C=256 NH=4 (forward
 * 1.7 ms vs 7.4 ms, backward 2.0 ms vs 9.7 ms of CPU per layer; measured with
 * tests/nn/test_gpt_speed --attention; 64-row blocks measured the same).
 * To skip the masked upper triangle, rows are processed in blocks: rows
 * [i0, i1) need only columns [0, i1). */

#define ATT_ROW_BLOCK 32

static void causal_softmax_rows(float *restrict att, int T, int i0, int i1) {
  for (int i = i0; i < i1; i++) {
    float *restrict row = att + (size_t)i * T;
    float sum = nn_exp_shift_sum(row, i + 1, max_of(row, i + 1));
    scale_of(row, i + 1, 1.0f / sum);
    for (int j = i + 1; j < T; j++) row[j] = 0.0f;
  }
}

void nn_attention_forward_blas(float *out, float *att, const float *inp, int B, int T, int C, int NH) {
  int hs = C / NH;
  float scale = 1.0f / sqrtf((float)hs);
  int C3 = 3 * C;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      const float *q = inp + (size_t)b * T * C3 + h * hs; /* (T, hs) at stride 3C */
      const float *k = q + C;
      const float *v = q + 2 * C;
      float *a = att + ((size_t)b * NH + h) * T * T; /* (T, T) */
      float *o = out + (size_t)b * T * C + h * hs;    /* (T, hs) at stride C */
      for (int i0 = 0; i0 < T; i0 += ATT_ROW_BLOCK) {
        int i1 = TD_MIN(T, i0 + ATT_ROW_BLOCK);
        /* S[i0:i1, 0:i1] = q[i0:i1] k[0:i1]^T */
        td_sgemm(0, 1, i1 - i0, i1, hs, scale, q + (size_t)i0 * C3, C3, k, C3, 0.0f, a + (size_t)i0 * T, T);
        causal_softmax_rows(a, T, i0, i1);
        /* out[i0:i1] = P[i0:i1, 0:i1] v[0:i1] */
        td_sgemm(0, 0, i1 - i0, hs, i1, 1.0f, a + (size_t)i0 * T, T, v, C3, 0.0f, o + (size_t)i0 * C, C);
      }
    }
}

void nn_attention_backward_blas(float *dinp, float beta, float *scratch, const float *dout, const float *inp,
                                const float *att, int B, int T, int C, int NH) {
  int hs = C / NH;
  float scale = 1.0f / sqrtf((float)hs);
  int C3 = 3 * C;
  float *ds = scratch; /* (T, T): dP, then dS in place */
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      const float *q = inp + (size_t)b * T * C3 + h * hs;
      const float *k = q + C;
      const float *v = q + 2 * C;
      float *dq = dinp + (size_t)b * T * C3 + h * hs;
      float *dk = dq + C;
      float *dv = dq + 2 * C;
      const float *a = att + ((size_t)b * NH + h) * T * T;
      const float *d = dout + (size_t)b * T * C + h * hs;
      /* dP = dout_h v^T (lower triangle blocks only), dS in place */
      for (int i0 = 0; i0 < T; i0 += ATT_ROW_BLOCK) {
        int i1 = TD_MIN(T, i0 + ATT_ROW_BLOCK);
        td_sgemm(0, 1, i1 - i0, i1, hs, 1.0f, d + (size_t)i0 * C, C, v, C3, 0.0f, ds + (size_t)i0 * T, T);
        for (int i = i0; i < i1; i++) {
          const float *restrict p = a + (size_t)i * T;
          float *restrict g = ds + (size_t)i * T;
          float dot = dot_of(p, g, i + 1);
          for (int j = 0; j <= i; j++) g[j] = p[j] * (g[j] - dot);
          for (int j = i + 1; j < i1; j++) g[j] = 0.0f;
        }
      }
      /* The upper-right blocks of P and dS are zero, so the full products
       * below only need K = rows up to the block end; done per row block. */
      for (int i0 = 0; i0 < T; i0 += ATT_ROW_BLOCK) {
        int i1 = TD_MIN(T, i0 + ATT_ROW_BLOCK);
        /* dq[i0:i1] = scale dS[i0:i1, 0:i1] k[0:i1] */
        td_sgemm(0, 0, i1 - i0, hs, i1, scale, ds + (size_t)i0 * T, T, k, C3, beta, dq + (size_t)i0 * C3, C3);
      }
      for (int j0 = 0; j0 < T; j0 += ATT_ROW_BLOCK) {
        int j1 = TD_MIN(T, j0 + ATT_ROW_BLOCK);
        /* rows j0..j1 of dk and dv: sum over i >= j0 (P and dS are zero above the diagonal)
         * dk[j0:j1] = scale dS[j0:T, j0:j1]^T q[j0:T];  dv[j0:j1] = P[j0:T, j0:j1]^T dout_h[j0:T] */
        td_sgemm(1, 0, j1 - j0, hs, T - j0, scale, ds + (size_t)j0 * T + j0, T, q + (size_t)j0 * C3, C3, beta,
                 dk + (size_t)j0 * C3, C3);
        td_sgemm(1, 0, j1 - j0, hs, T - j0, 1.0f, a + (size_t)j0 * T + j0, T, d + (size_t)j0 * C, C, beta,
                 dv + (size_t)j0 * C3, C3);
      }
    }
}

/* ---- attention with register tiles ----
 * The same products as above, but each is a loop of 8-row tiles held in
 * 16-lane registers (8 rows x 32 columns of the result: 16 accumulators, per
 * step 2 loads, 8 broadcasts, 16 FMAs), working on the operands in place.
 * Per (b, h) only k^T (forward) or v^T (backward) is copied, into a
 * column-padded (hs, Tp) panel. The causal structure is followed tile by
 * tile: query rows [i0, i0+8) need keys [0, i0+8), key rows [j0, j0+8) get
 * contributions from queries [j0, T). At B=8 T=128 C=256 NH=4 this takes
 * forward 1.12 -> 0.55 ms and backward 1.60 -> 0.95 ms of CPU per layer
 * (minimum of 30 calls); OpenBLAS's per-call overhead and its small-matrix
 * kernels dominated at these sizes. Needs hs % 16 == 0; other head sizes
 * use the sgemm version. */

#define AT_R 8 /* rows per tile */

/* c[r][0:16 NV] = alpha sum_{k<K} A(r, k) b[k][0:16 NV] + beta c[r][...] for r < rows,
 * where A(r, k) = a[r*ars + k*acs] and b rows are ldb apart. Rows past `rows`
 * repeat the last valid one (never read out of bounds) and are not stored. */
static inline __attribute__((always_inline)) void att_tile(int NV, int rows, int K, const float *a, size_t ars,
                                                           size_t acs, const float *b, size_t ldb, float *c,
                                                           size_t ldc, float alpha, float beta) {
  nn_v16f acc[AT_R][2];
  const float *ar[AT_R];
  for (int r = 0; r < AT_R; r++) {
    ar[r] = a + (size_t)(r < rows ? r : rows - 1) * ars;
    acc[r][0] = acc[r][1] = (nn_v16f)NN_V16(0.0f);
  }
  for (int k = 0; k < K; k++) {
    const float *bk = b + (size_t)k * ldb;
    nn_v16f b0 = nn_v16_load(bk), b1 = NV > 1 ? nn_v16_load(bk + 16) : b0;
    size_t ak = (size_t)k * acs;
#pragma GCC unroll 8
    for (int r = 0; r < AT_R; r++) {
      nn_v16f av = nn_v16_splat(ar[r][ak]);
      acc[r][0] += av * b0;
      if (NV > 1) acc[r][1] += av * b1;
    }
  }
  for (int r = 0; r < rows; r++)
    for (int v = 0; v < NV; v++) {
      float *cp = c + (size_t)r * ldc + 16 * v;
      nn_v16f x = alpha * acc[r][v];
      if (beta != 0.0f) x += beta * nn_v16_load(cp);
      nn_v16_store(cp, x);
    }
}

/* The 32-column tiles, and the columns of an hs-wide result in 32s and a 16. */
static void att_tile32(int rows, int K, const float *a, size_t ars, size_t acs, const float *b, size_t ldb, float *c,
                       size_t ldc, float alpha, float beta) {
  att_tile(2, rows, K, a, ars, acs, b, ldb, c, ldc, alpha, beta);
}
static void att_tile16(int rows, int K, const float *a, size_t ars, size_t acs, const float *b, size_t ldb, float *c,
                       size_t ldc, float alpha, float beta) {
  att_tile(1, rows, K, a, ars, acs, b, ldb, c, ldc, alpha, beta);
}
/* Columns [0, width) of the result, width rounded up to 16: in 32s, and a 16
 * where 16 or fewer remain (b and c must have the rounded-up columns). */
static void att_rows(int rows, int K, int width, const float *a, size_t ars, size_t acs, const float *b, size_t ldb,
                     float *c, size_t ldc, float alpha, float beta) {
  int c0 = 0;
  for (; c0 + 16 < width; c0 += 32) att_tile32(rows, K, a, ars, acs, b + c0, ldb, c + c0, ldc, alpha, beta);
  if (c0 < width) att_tile16(rows, K, a, ars, acs, b + c0, ldb, c + c0, ldc, alpha, beta);
}

/* Per-thread scratch: the transposed panel (hs, Tp) and a tile of scores (AT_R, Tp). */
static __thread float *att_scratch;
static __thread size_t att_scratch_n;

static float *att_scratch_get(size_t n) {
  if (att_scratch_n < n) {
    td_free(att_scratch);
    att_scratch = td_alloc(n * sizeof(float));
    att_scratch_n = att_scratch ? n : 0;
  }
  return att_scratch;
}

/* panel[d][j] = x[j][d] (rows of x ld apart) for j < T, 0 for T <= j < Tp.
 * With AVX-512, 16 x 16 blocks through registers, reading each line of x
 * once: element by element (a store per element 512 bytes apart, or a
 * gather per 16 rows 3C apart, which thrash a few L1 sets) the transposes
 * took ~20-40% of the attention's own time. */
static void transpose_panel(float *restrict panel, const float *restrict x, size_t ld, int T, int Tp, int hs) {
  int j0 = 0;
#ifdef __AVX512F__
  for (; j0 + 16 <= T; j0 += 16)
    for (int d0 = 0; d0 < hs; d0 += 16) { /* hs % 16 == 0 on this path */
      __m512 r[16];
      for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(x + (size_t)(j0 + i) * ld + d0);
      nn_transpose16(r);
      for (int i = 0; i < 16; i++) _mm512_storeu_ps(panel + (size_t)(d0 + i) * Tp + j0, r[i]);
    }
#endif
  for (int d = 0; d < hs; d++) {
    float *restrict dst = panel + (size_t)d * Tp;
    for (int j = j0; j < T; j++) dst[j] = x[(size_t)j * ld + d];
    for (int j = T; j < Tp; j++) dst[j] = 0.0f;
  }
}

/* dst (T, hs) contiguous = x (T, hs) at row stride ld. The tiles read their
 * row operand as T rows 3C apart otherwise, which maps onto few cache sets
 * and made the timings vary by 2x from run to run. */
static void copy_rows(float *restrict dst, const float *restrict x, size_t ld, int T, int hs) {
  for (int j = 0; j < T; j++) memcpy(dst + (size_t)j * hs, x + (size_t)j * ld, (size_t)hs * sizeof(float));
}

static int attention_tiled_ok(int T, int C, int NH) { return (C / NH) % 16 == 0 && T > 0; }

static int attention_forward_tiled(float *out, float *att, const float *inp, int B, int T, int C, int NH) {
  int hs = C / NH, C3 = 3 * C, Tp = (T + 31) / 32 * 32;
  float scale = 1.0f / sqrtf((float)hs);
  float *kt = att_scratch_get((size_t)(hs + AT_R) * Tp + (size_t)T * hs);
  if (!kt) return 0;
  float *sc = kt + (size_t)hs * Tp; /* (AT_R, Tp) scores */
  float *vh = sc + (size_t)AT_R * Tp; /* (T, hs) */
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      const float *q = inp + (size_t)b * T * C3 + h * hs; /* (T, hs) at stride 3C */
      const float *v = q + 2 * C;
      float *a = att + ((size_t)b * NH + h) * T * T; /* (T, T) */
      float *o = out + (size_t)b * T * C + h * hs;    /* (T, hs) at stride C */
      transpose_panel(kt, q + C, C3, T, Tp, hs);
      copy_rows(vh, v, C3, T, hs);
      for (int i0 = 0; i0 < T; i0 += AT_R) {
        int rows = TD_MIN(AT_R, T - i0), n_keys = i0 + rows;
        /* scores of rows [i0, i0+rows) against keys [0, n_keys), 32 at a time */
        att_rows(rows, hs, n_keys, q + (size_t)i0 * C3, C3, 1, kt, Tp, sc, Tp, scale, 0.0f);
        for (int r = 0; r < rows; r++) {
          int i = i0 + r;
          float *restrict row = a + (size_t)i * T, *restrict s_row = sc + (size_t)r * Tp;
          float sum = nn_exp_shift_sum(s_row, i + 1, max_of(s_row, i + 1)), inv = 1.0f / sum;
          for (int j = 0; j <= i; j++) row[j] = s_row[j] * inv;
          for (int j = i + 1; j < T; j++) row[j] = 0.0f;
        }
        /* out rows = P[rows, 0:n_keys] v[0:n_keys] */
        att_rows(rows, n_keys, hs, a + (size_t)i0 * T, T, 1, vh, hs, o + (size_t)i0 * C, C, 1.0f, 0.0f);
      }
    }
  return 1;
}

static int attention_backward_tiled(float *dinp, float beta, float *ds, const float *dout, const float *inp,
                                    const float *att, int B, int T, int C, int NH) {
  int hs = C / NH, C3 = 3 * C, Tp = (T + 31) / 32 * 32;
  float scale = 1.0f / sqrtf((float)hs);
  float *vt = att_scratch_get((size_t)(hs + AT_R) * Tp + (size_t)3 * T * hs);
  if (!vt) return 0;
  float *dp = vt + (size_t)hs * Tp; /* (AT_R, Tp) */
  float *qh = dp + (size_t)AT_R * Tp, *kh = qh + (size_t)T * hs, *dh = kh + (size_t)T * hs; /* (T, hs) each */
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      const float *q = inp + (size_t)b * T * C3 + h * hs;
      const float *k = q + C;
      float *dq = dinp + (size_t)b * T * C3 + h * hs;
      float *dk = dq + C;
      float *dv = dq + 2 * C;
      const float *a = att + ((size_t)b * NH + h) * T * T;
      const float *d = dout + (size_t)b * T * C + h * hs;
      transpose_panel(vt, q + 2 * C, C3, T, Tp, hs);
      copy_rows(qh, q, C3, T, hs);
      copy_rows(kh, k, C3, T, hs);
      copy_rows(dh, d, C, T, hs);
      for (int i0 = 0; i0 < T; i0 += AT_R) {
        int rows = TD_MIN(AT_R, T - i0), n_keys = i0 + rows;
        /* dP = dout_h v^T on the causal columns */
        att_rows(rows, hs, n_keys, dh + (size_t)i0 * hs, hs, 1, vt, Tp, dp, Tp, 1.0f, 0.0f);
        /* dS = P (dP - rowsum(P dP)), zero above the diagonal up to the tile's last key */
        for (int r = 0; r < rows; r++) {
          int i = i0 + r;
          const float *restrict p = a + (size_t)i * T;
          const float *restrict g = dp + (size_t)r * Tp;
          float *restrict out_row = ds + (size_t)i * T;
          float dot = dot_of(p, g, i + 1);
          for (int j = 0; j <= i; j++) out_row[j] = p[j] * (g[j] - dot);
          for (int j = i + 1; j < n_keys; j++) out_row[j] = 0.0f;
        }
        /* dq rows = scale dS[rows, 0:n_keys] k[0:n_keys] */
        att_rows(rows, n_keys, hs, ds + (size_t)i0 * T, T, 1, kh, hs, dq + (size_t)i0 * C3, C3, scale, beta);
      }
      for (int j0 = 0; j0 < T; j0 += AT_R) {
        int rows = TD_MIN(AT_R, T - j0), n_q = T - j0;
        /* key rows [j0, j0+rows) from queries [j0, T): dk = scale dS^T q, dv = P^T dout_h */
        att_rows(rows, n_q, hs, ds + (size_t)j0 * T + j0, 1, T, qh + (size_t)j0 * hs, hs, dk + (size_t)j0 * C3, C3,
                 scale, beta);
        att_rows(rows, n_q, hs, a + (size_t)j0 * T + j0, 1, T, dh + (size_t)j0 * hs, hs, dv + (size_t)j0 * C3, C3,
                 1.0f, beta);
      }
    }
  return 1;
}

void td_attention_forward(float *out, float *att, const float *inp, int B, int T, int C, int NH) {
  if (attention_tiled_ok(T, C, NH) && attention_forward_tiled(out, att, inp, B, T, C, NH)) return;
  nn_attention_forward_blas(out, att, inp, B, T, C, NH);
}

static void attention_backward(float *dinp, float beta, float *scratch, const float *dout, const float *inp,
                               const float *att, int B, int T, int C, int NH) {
  if (attention_tiled_ok(T, C, NH) && attention_backward_tiled(dinp, beta, scratch, dout, inp, att, B, T, C, NH))
    return;
  nn_attention_backward_blas(dinp, beta, scratch, dout, inp, att, B, T, C, NH);
}

void td_attention_backward(float *dinp, float *scratch, const float *dout, const float *inp, const float *att, int B,
                           int T, int C, int NH) {
  attention_backward(dinp, 1.0f, scratch, dout, inp, att, B, T, C, NH);
}

void nn_attention_backward_set(float *dinp, float *scratch, const float *dout, const float *inp, const float *att,
                               int B, int T, int C, int NH) {
  attention_backward(dinp, 0.0f, scratch, dout, inp, att, B, T, C, NH);
}

/* ---- 2-D convolution (im2col + sgemm) ----
 * col[(ic*K + ki)*K + kj][oh*OW + ow] = inp[ic][oh + ki - pad][ow + kj - pad] (0 outside),
 * then out_b (OC, OH*OW) = weight (OC, IC*K*K) @ col. */

static void im2col(float *restrict col, const float *restrict inp, int IC, int H, int W, int K, int pad, int OH,
                   int OW) {
  for (int ic = 0; ic < IC; ic++)
    for (int ki = 0; ki < K; ki++)
      for (int kj = 0; kj < K; kj++) {
        float *restrict dst = col + ((size_t)(ic * K + ki) * K + kj) * OH * OW;
        const float *src = inp + (size_t)ic * H * W;
        for (int oh = 0; oh < OH; oh++) {
          int ih = oh + ki - pad;
          float *restrict row = dst + (size_t)oh * OW;
          if (ih < 0 || ih >= H) {
            memset(row, 0, (size_t)OW * sizeof(float));
            continue;
          }
          /* columns ow with 0 <= ow + kj - pad < W read the input; the rest are padding */
          int ow0 = TD_MIN(OW, TD_MAX(0, pad - kj)), ow1 = TD_MAX(ow0, TD_MIN(OW, W + pad - kj));
          for (int ow = 0; ow < ow0; ow++) row[ow] = 0.0f;
          if (ow1 > ow0) memcpy(row + ow0, src + (size_t)ih * W + ow0 + kj - pad, (size_t)(ow1 - ow0) * sizeof(float));
          for (int ow = ow1; ow < OW; ow++) row[ow] = 0.0f;
        }
      }
}

static void col2im_add(float *restrict dinp, const float *restrict col, int IC, int H, int W, int K, int pad, int OH,
                       int OW) {
  for (int ic = 0; ic < IC; ic++)
    for (int ki = 0; ki < K; ki++)
      for (int kj = 0; kj < K; kj++) {
        const float *restrict src = col + ((size_t)(ic * K + ki) * K + kj) * OH * OW;
        float *dst = dinp + (size_t)ic * H * W;
        for (int oh = 0; oh < OH; oh++) {
          int ih = oh + ki - pad;
          if (ih < 0 || ih >= H) continue;
          int ow0 = TD_MAX(0, pad - kj), ow1 = TD_MIN(OW, W + pad - kj);
          float *restrict d = dst + (size_t)ih * W + kj - pad;
          const float *restrict s_row = src + (size_t)oh * OW;
          for (int ow = ow0; ow < ow1; ow++) d[ow] += s_row[ow];
        }
      }
}

void td_conv2d_forward(float *out, float *scratch, const float *inp, const float *weight, const float *bias, int B,
                       int IC, int OC, int H, int W, int K, int pad) {
  int OH = H + 2 * pad - K + 1, OW = W + 2 * pad - K + 1;
  int P = OH * OW, R = IC * K * K;
  for (int b = 0; b < B; b++) {
    const float *x = inp + (size_t)b * IC * H * W;
    float *o = out + (size_t)b * OC * P; /* (OC, P) */
    im2col(scratch, x, IC, H, W, K, pad, OH, OW);
    float beta = 0.0f;
    if (bias) {
      for (int oc = 0; oc < OC; oc++) {
        float *restrict row = o + (size_t)oc * P;
        for (int p = 0; p < P; p++) row[p] = bias[oc];
      }
      beta = 1.0f;
    }
    td_sgemm(0, 0, OC, P, R, 1.0f, weight, R, scratch, P, beta, o, P);
  }
}

void td_conv2d_backward(float *dinp, float *dweight, float *dbias, float *scratch, const float *dout,
                        const float *inp, const float *weight, int B, int IC, int OC, int H, int W, int K, int pad) {
  int OH = H + 2 * pad - K + 1, OW = W + 2 * pad - K + 1;
  int P = OH * OW, R = IC * K * K;
  float *col = scratch;                  /* (R, P) */
  float *dcol = scratch + (size_t)R * P; /* (R, P) */
  for (int b = 0; b < B; b++) {
    const float *d = dout + (size_t)b * OC * P; /* (OC, P) */
    if (dbias)
      for (int oc = 0; oc < OC; oc++) {
        const float *restrict row = d + (size_t)oc * P;
        float s = 0.0f;
        for (int p = 0; p < P; p++) s += row[p];
        dbias[oc] += s;
      }
    if (dweight) {
      im2col(col, inp + (size_t)b * IC * H * W, IC, H, W, K, pad, OH, OW);
      /* dweight (OC, R) += dout_b (OC, P) @ col^T (P, R) */
      td_sgemm(0, 1, OC, R, P, 1.0f, d, P, col, P, 1.0f, dweight, R);
    }
    if (dinp) {
      /* dcol (R, P) = weight^T (R, OC) @ dout_b (OC, P) */
      td_sgemm(1, 0, R, P, OC, 1.0f, weight, R, d, P, 0.0f, dcol, P);
      col2im_add(dinp + (size_t)b * IC * H * W, dcol, IC, H, W, K, pad, OH, OW);
    }
  }
}

/* ---- 2x2 max-pool ---- */

void td_maxpool2_forward(float *out, int32_t *argmax, const float *inp, int B, int C, int H, int W) {
  int OH = H / 2, OW = W / 2;
  for (size_t plane = 0; plane < (size_t)B * C; plane++) {
    const float *x = inp + plane * H * W;
    float *o = out + plane * OH * OW;
    int32_t *am = argmax + plane * OH * OW;
    for (int oh = 0; oh < OH; oh++)
      for (int ow = 0; ow < OW; ow++) {
        int best = (2 * oh) * W + 2 * ow;
        int cand[3] = {best + 1, best + W, best + W + 1};
        for (int c = 0; c < 3; c++)
          if (x[cand[c]] > x[best]) best = cand[c];
        o[oh * OW + ow] = x[best];
        am[oh * OW + ow] = best;
      }
  }
}

void td_maxpool2_backward(float *dinp, const float *dout, const int32_t *argmax, int B, int C, int H, int W) {
  int OH = H / 2, OW = W / 2;
  for (size_t plane = 0; plane < (size_t)B * C; plane++) {
    float *dx = dinp + plane * H * W;
    const float *d = dout + plane * OH * OW;
    const int32_t *am = argmax + plane * OH * OW;
    for (int i = 0; i < OH * OW; i++) dx[am[i]] += d[i];
  }
}

/* ---- softmax cross-entropy ---- */

float td_softmax_xent_forward(float *probs, const float *logits, const int32_t *targets, int N, int V) {
  double loss = 0.0;
  for (int n = 0; n < N; n++) {
    const float *x = logits + (size_t)n * V; /* (V) */
    float *p = probs + (size_t)n * V;        /* (V), may alias x */
    float x_target = x[targets[n]];          /* read before p overwrites it */
    float mx = max_of(x, V);
    if (p != x) memcpy(p, x, (size_t)V * sizeof(float));
    float sum = nn_exp_shift_sum(p, V, mx);
    float inv = 1.0f / sum;
    for (int v = 0; v < V; v++) p[v] *= inv;
    /* -log p[target] from the logits: exact even where p underflows */
    loss += (double)logf(sum) + (double)mx - (double)x_target;
  }
  return N > 0 ? (float)(loss / N) : 0.0f;
}

static void softmax_xent_backward(float *dlogits, int accumulate, const float *probs, const int32_t *targets,
                                  float dloss, int N, int V) {
  float scale = N > 0 ? dloss / (float)N : 0.0f;
  for (int n = 0; n < N; n++) {
    float *restrict d = dlogits + (size_t)n * V;
    const float *restrict p = probs + (size_t)n * V;
    if (accumulate)
      for (int v = 0; v < V; v++) d[v] += scale * p[v];
    else
      for (int v = 0; v < V; v++) d[v] = scale * p[v];
    d[targets[n]] -= scale;
  }
}

void td_softmax_xent_backward(float *dlogits, const float *probs, const int32_t *targets, float dloss, int N, int V) {
  softmax_xent_backward(dlogits, 1, probs, targets, dloss, N, V);
}

void nn_softmax_xent_backward_set(float *dlogits, const float *probs, const int32_t *targets, float dloss, int N,
                                  int V) {
  softmax_xent_backward(dlogits, 0, probs, targets, dloss, N, V);
}
