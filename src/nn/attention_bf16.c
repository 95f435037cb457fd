/* Causal self-attention with its four kinds of product in bf16 (mixed
 * precision, td_nn_set_compute_dtype(TD_BF16)): the same steps as the f32
 * attention with register tiles in layers.c, but each product's operands
 * are rounded to bf16 and multiplied on vdpbf16ps with f32 accumulation
 * (two products per f32 lane per instruction); the softmax, its backward
 * (dS = P (dP - rowsum(P dP))), the scale and the stored P stay f32.
 * Compiled once per CPU level (nn_kernels.h); only the avx512bf16 level has
 * the kernel, the others decline (return 0) and the caller runs the f32
 * attention (rounding there would cost time and buy nothing).
 *
 * Per (batch b, head h), q, k, v the (T, hs) slices of inp at row stride 3C:
 *
 *   forward   S = scale q k^T    A: q rows in bf16      B: k^T panel
 *             P = softmax(S)     f32 (att), and P's rows in bf16
 *             out = P v          A: P rows              B: v panel
 *   backward  dP = dout v^T      A: dout rows           B: v^T panel
 *             dS = P (dP - dot)  f32, rows in bf16 (for dq) and row pairs
 *                                interleaved (for dk)
 *             dq = scale dS k    A: dS rows             B: k panel
 *             dk = scale dS^T q  A: dS pairs (column)   B: q panel
 *             dv = P^T dout      A: P pairs (column)    B: dout panel
 *
 * vdpbf16ps multiplies pairs along the depth: the A operand is read as one
 * 32-bit pair (A(r, 2p), A(r, 2p+1)) broadcast to all lanes, B as a panel
 * whose row p holds, for each output column n, the pair (B(2p, n),
 * B(2p+1, n)). So each product needs its B (and for dk, dv its transposed
 * A) rearranged into pairs once per (b, h):
 *
 *   "panel" of x (T, hs):      pan[p][d] = (x[2p][d], x[2p+1][d])
 *                              rows 2p and 2p+1 interleaved, Tp/2 x hs
 *   "transposed panel" of x:   tpan[p][j] = (x[j][2p], x[j][2p+1])
 *                              = x's bf16 rows transposed as 32-bit words
 *                              (16 x 16 blocks in registers), hs/2 x Tp
 *
 * Depths past T (an odd T, the row padding to Tp = T rounded up to 32) are
 * zeros in both operands, so they add nothing. Tiles are 8 rows x 32
 * columns (16 accumulators); the causal structure is followed as in
 * layers.c: query rows [i0, i0+8) need keys [0, i0+8), key rows [j0, j0+8)
 * get contributions from queries [j0, T). Needs hs % 32 == 0 (the GPT's 64);
 * other head sizes decline. */
#include "nn_kernels.h" /* first: names this level's functions (compiled once per CPU level) */

#include <math.h>
#include <string.h>

#ifdef __AVX512BF16__
#include <immintrin.h>

#define ATB_R 8 /* rows per tile */

/* Per-thread scratch for the panels and tiles (model replicas run on threads). */
static __thread void *atb_scratch;
static __thread size_t atb_scratch_bytes;

static void *atb_scratch_get(size_t bytes) {
  if (atb_scratch_bytes < bytes) {
    td_free(atb_scratch);
    atb_scratch = td_alloc(bytes);
    atb_scratch_bytes = atb_scratch ? bytes : 0;
  }
  return atb_scratch;
}

static inline __m512 atb_load16(const float *p, int n) {
  if (n >= 16) return _mm512_loadu_ps(p);
  return n <= 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1u), p);
}

/* the 32 bf16 of (v0, v1) as 16 pairs (v0[i], v1[i]) */
static inline __m512i atb_interleave(__m512 v0, __m512 v1) {
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                       21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(v1, v0));
}

/* dst (rows x w pairs, rows dst_ld pairs apart) = the bf16 of n_rows rows
 * of x (rows ld apart), columns [0, n_cols); the rest of each row (up to 2w
 * values) and rows n_rows .. rows are zeros. */
static void atb_rows16(uint32_t *restrict dst, size_t dst_ld, const float *x, size_t ld, int n_rows, int rows,
                       int n_cols, int w) {
  for (int r = 0; r < rows; r++) {
    uint32_t *d = dst + (size_t)r * dst_ld;
    if (r >= n_rows) {
      memset(d, 0, (size_t)w * sizeof(uint32_t));
      continue;
    }
    const float *row = x + (size_t)r * ld;
    for (int c = 0; c < 2 * w; c += 32) {
      int n = n_cols - c;
      __m512i v = (__m512i)_mm512_cvtne2ps_pbh(atb_load16(row + c + 16, n - 16), atb_load16(row + c, n));
      if (2 * w - c >= 32)
        _mm512_storeu_si512(d + c / 2, v);
      else
        _mm512_mask_storeu_epi32(d + c / 2, (__mmask16)((1u << ((2 * w - c) / 2)) - 1u), v);
    }
  }
}

/* pan (pairs rows, pan_ld pairs apart, w a multiple of 16): pan[p][j] =
 * (x[2p][j], x[2p+1][j]), rows of x (ld apart) at or past n_rows and
 * columns at or past n_cols read as zeros. */
static void atb_panel(uint32_t *restrict pan, size_t pan_ld, const float *x, size_t ld, int n_rows, int pairs,
                      int n_cols, int w) {
  for (int p = 0; p < pairs; p++) {
    const float *r0 = 2 * p < n_rows ? x + (size_t)(2 * p) * ld : NULL;
    const float *r1 = 2 * p + 1 < n_rows ? x + (size_t)(2 * p + 1) * ld : NULL;
    for (int j = 0; j < w; j += 16) {
      __m512 v0 = r0 ? atb_load16(r0 + j, n_cols - j) : _mm512_setzero_ps();
      __m512 v1 = r1 ? atb_load16(r1 + j, n_cols - j) : _mm512_setzero_ps();
      _mm512_storeu_si512(pan + (size_t)p * pan_ld + j, atb_interleave(v0, v1));
    }
  }
}

/* tpan (hs/2 x Tp pairs): tpan[p][j] = (x[j][2p], x[j][2p+1]) for j < T,
 * zeros for T <= j < Tp: 16 rows x 32 depths converted to 16 x 16 pairs,
 * transposed in registers (hs % 32 == 0). */
static void atb_tpanel(uint32_t *restrict tpan, const float *x, size_t ld, int T, int Tp, int hs) {
  for (int j0 = 0; j0 < Tp; j0 += 16)
    for (int d0 = 0; d0 < hs; d0 += 32) {
      __m512 r[16];
      for (int i = 0; i < 16; i++) {
        const float *row = x + (size_t)(j0 + i) * ld + d0;
        r[i] = j0 + i < T ? (__m512)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(row + 16), _mm512_loadu_ps(row))
                          : _mm512_setzero_ps();
      }
      nn_transpose16(r); /* r[t]: pair t of the 16 rows */
      for (int t = 0; t < 16; t++) _mm512_storeu_ps((float *)(tpan + (size_t)(d0 / 2 + t) * Tp + j0), r[t]);
    }
}

/* c[r][0:16 NV] (r < rows) = alpha sum_{p < kp} A(r, p) . b[p][0:16 NV]
 * (+ beta c), A(r, p) = a[r * ars + p * aps] (a pair), b's rows ldb pairs
 * apart. All ATB_R rows of A are read (the scratch is padded so that they
 * exist); only rows < rows are stored. */
static inline __attribute__((always_inline)) void atb_tile(int NV, int rows, int kp, const uint32_t *a, size_t ars,
                                                           size_t aps, const uint32_t *b, size_t ldb, float *c,
                                                           size_t ldc, float alpha, float beta) {
  __m512 acc[ATB_R][2];
  for (int r = 0; r < ATB_R; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int p = 0; p < kp; p++) {
    const uint32_t *bp = b + (size_t)p * ldb;
    __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp);
    __m512bh b1 = NV > 1 ? (__m512bh)_mm512_loadu_si512(bp + 16) : b0;
    const uint32_t *ap = a + (size_t)p * aps;
#pragma GCC unroll 8
    for (int r = 0; r < ATB_R; r++) {
      __m512bh av = (__m512bh)_mm512_set1_epi32((int)ap[(size_t)r * ars]);
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
      if (NV > 1) acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
    }
  }
  __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  for (int r = 0; r < rows; r++)
    for (int v = 0; v < NV; v++) {
      float *cp = c + (size_t)r * ldc + 16 * v;
      __m512 x = _mm512_mul_ps(va, acc[r][v]);
      if (beta != 0.0f) x = _mm512_fmadd_ps(vb, _mm512_loadu_ps(cp), x);
      _mm512_storeu_ps(cp, x);
    }
}

static void atb_tile32(int rows, int kp, const uint32_t *a, size_t ars, size_t aps, const uint32_t *b, size_t ldb,
                       float *c, size_t ldc, float alpha, float beta) {
  atb_tile(2, rows, kp, a, ars, aps, b, ldb, c, ldc, alpha, beta);
}

/* Columns [0, width) of the result in 32s (b and c must have width rounded
 * up to 32 columns). */
static void atb_rows(int rows, int kp, int width, const uint32_t *a, size_t ars, size_t aps, const uint32_t *b,
                     size_t ldb, float *c, size_t ldc, float alpha, float beta) {
  for (int c0 = 0; c0 < width; c0 += 32)
    atb_tile32(rows, kp, a, ars, aps, b + c0, ldb, c + c0, ldc, alpha, beta);
}

static float atb_max(const float *x, int n) {
  float m = x[0];
  for (int i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
  return m;
}

static float atb_dot(const float *restrict x, const float *restrict y, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; i++) s += x[i] * y[i];
  return s;
}

static int atb_ok(int T, int C, int NH) { return T > 0 && NH > 0 && C % NH == 0 && (C / NH) % 32 == 0; }
#endif

int nn_attention_forward_bf16(float *out, float *att, const float *inp, int B, int T, int C, int NH) {
#ifdef __AVX512BF16__
  if (!atb_ok(T, C, NH)) return 0;
  int hs = C / NH, C3 = 3 * C, Tp = (T + 31) / 32 * 32, hw = hs / 2, tw = Tp / 2;
  float scale = 1.0f / sqrtf((float)hs);
  /* q16 (Tp x hw), kt (hw x Tp), vp (tw x hs) pairs; sc (8 x Tp) f32; p16 (8 x tw) pairs */
  size_t words = (size_t)Tp * hw + (size_t)hw * Tp + (size_t)tw * hs + (size_t)ATB_R * Tp + (size_t)ATB_R * tw;
  uint32_t *q16 = atb_scratch_get(words * sizeof(uint32_t));
  if (!q16) return 0;
  uint32_t *kt = q16 + (size_t)Tp * hw, *vp = kt + (size_t)hw * Tp;
  float *sc = (float *)(vp + (size_t)tw * hs);
  uint32_t *p16 = (uint32_t *)(sc + (size_t)ATB_R * Tp);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      const float *q = inp + (size_t)b * T * C3 + h * hs; /* (T, hs) at stride 3C */
      float *a = att + ((size_t)b * NH + h) * T * T;      /* (T, T) */
      float *o = out + (size_t)b * T * C + h * hs;         /* (T, hs) at stride C */
      atb_rows16(q16, (size_t)hw, q, (size_t)C3, T, Tp, hs, hw);
      atb_tpanel(kt, q + C, (size_t)C3, T, Tp, hs);
      atb_panel(vp, (size_t)hs, q + 2 * C, (size_t)C3, T, tw, hs, hs);
      for (int i0 = 0; i0 < T; i0 += ATB_R) {
        int rows = TD_MIN(ATB_R, T - i0), n_keys = i0 + rows, kp = (n_keys + 1) / 2;
        /* scores of rows [i0, i0+rows) against keys [0, n_keys) */
        atb_rows(rows, hw, n_keys, q16 + (size_t)i0 * hw, (size_t)hw, 1, kt, (size_t)Tp, sc, (size_t)Tp, scale,
                 0.0f);
        for (int r = 0; r < rows; r++) {
          int i = i0 + r;
          float *restrict row = a + (size_t)i * T, *restrict s_row = sc + (size_t)r * Tp;
          float sum = nn_exp_shift_sum(s_row, i + 1, atb_max(s_row, i + 1)), inv = 1.0f / sum;
          for (int j = 0; j <= i; j++) row[j] = s_row[j] * inv;
          for (int j = i + 1; j < T; j++) row[j] = 0.0f;
        }
        /* P's rows in bf16 (zero past the diagonal, and after an odd n_keys) */
        atb_rows16(p16, (size_t)tw, a + (size_t)i0 * T, (size_t)T, rows, ATB_R, n_keys, kp);
        /* out rows = P[rows, 0:n_keys] v[0:n_keys] */
        atb_rows(rows, kp, hs, p16, (size_t)tw, 1, vp, (size_t)hs, o + (size_t)i0 * C, (size_t)C, 1.0f, 0.0f);
      }
    }
  return 1;
#else
  (void)out, (void)att, (void)inp, (void)B, (void)T, (void)C, (void)NH;
  return 0;
#endif
}

int nn_attention_backward_bf16(float *dinp, float beta, const float *dout, const float *inp, const float *att, int B,
                               int T, int C, int NH) {
#ifdef __AVX512BF16__
  if (!atb_ok(T, C, NH)) return 0;
  int hs = C / NH, C3 = 3 * C, Tp = (T + 31) / 32 * 32, hw = hs / 2, tw = Tp / 2;
  float scale = 1.0f / sqrtf((float)hs);
  /* pairs: d16 (Tp x hw), vt (hw x Tp), kp_, qp, dp (tw x hs each), dsp, pp (tw x Tp each), ds16 (8 x tw);
   * f32: dpt, dst (8 x Tp each) */
  size_t words = (size_t)Tp * hw + (size_t)hw * Tp + 3 * (size_t)tw * hs + 2 * (size_t)tw * Tp +
                 (size_t)ATB_R * tw + 2 * (size_t)ATB_R * Tp;
  uint32_t *d16 = atb_scratch_get(words * sizeof(uint32_t));
  if (!d16) return 0;
  uint32_t *vt = d16 + (size_t)Tp * hw, *kpan = vt + (size_t)hw * Tp, *qpan = kpan + (size_t)tw * hs;
  uint32_t *dpan = qpan + (size_t)tw * hs, *dsp = dpan + (size_t)tw * hs, *pp = dsp + (size_t)tw * Tp;
  uint32_t *ds16 = pp + (size_t)tw * Tp;
  float *dpt = (float *)(ds16 + (size_t)ATB_R * tw), *dst = dpt + (size_t)ATB_R * Tp;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      const float *q = inp + (size_t)b * T * C3 + h * hs;
      const float *k = q + C, *v = q + 2 * C;
      float *dq = dinp + (size_t)b * T * C3 + h * hs;
      float *dk = dq + C, *dv = dq + 2 * C;
      const float *a = att + ((size_t)b * NH + h) * T * T;
      const float *d = dout + (size_t)b * T * C + h * hs;
      atb_rows16(d16, (size_t)hw, d, (size_t)C, T, Tp, hs, hw);
      atb_tpanel(vt, v, (size_t)C3, T, Tp, hs);
      atb_panel(kpan, (size_t)hs, k, (size_t)C3, T, tw, hs, hs);
      atb_panel(qpan, (size_t)hs, q, (size_t)C3, T, tw, hs, hs);
      atb_panel(dpan, (size_t)hs, d, (size_t)C, T, tw, hs, hs);
      /* P's row pairs interleaved: pp[p][j] = (P[2p][j], P[2p+1][j]), for
       * the columns that the dv tiles read: key rows [j0, j0+8) read pairs
       * p >= j0/2, so pair p is read up to column 2p+8 (P is zero past the
       * diagonal: half the panel is never built) */
      for (int p = 0; p < tw; p++)
        atb_panel(pp + (size_t)p * Tp, 0, a + (size_t)(2 * p) * T, (size_t)T, T - 2 * p, 1, T,
                  TD_MIN(Tp, (2 * p + 8 + 15) / 16 * 16));
      for (int i0 = 0; i0 < T; i0 += ATB_R) {
        int rows = TD_MIN(ATB_R, T - i0), n_keys = i0 + rows, kp = (n_keys + 1) / 2;
        /* dP = dout_h v^T on the causal columns */
        atb_rows(rows, hw, n_keys, d16 + (size_t)i0 * hw, (size_t)hw, 1, vt, (size_t)Tp, dpt, (size_t)Tp, 1.0f,
                 0.0f);
        /* dS = P (dP - rowsum(P dP)), zero past the diagonal up to the tile's last key */
        for (int r = 0; r < rows; r++) {
          int i = i0 + r;
          const float *restrict p = a + (size_t)i * T;
          const float *restrict g = dpt + (size_t)r * Tp;
          float *restrict s = dst + (size_t)r * Tp;
          float dot = atb_dot(p, g, i + 1);
          for (int j = 0; j <= i; j++) s[j] = p[j] * (g[j] - dot);
          for (int j = i + 1; j < Tp; j++) s[j] = 0.0f;
        }
        for (int r = rows; r < ATB_R; r++) memset(dst + (size_t)r * Tp, 0, (size_t)Tp * sizeof(float));
        /* dS's rows in bf16 (for dq), and its row pairs interleaved (for
         * dk, whose tiles read these pairs at columns below n_keys only) */
        int w16 = TD_MIN(Tp, (n_keys + 15) / 16 * 16);
        atb_rows16(ds16, (size_t)tw, dst, (size_t)Tp, ATB_R, ATB_R, 2 * kp, kp);
        for (int r = 0; r < ATB_R; r += 2)
          for (int j = 0; j < w16; j += 16)
            _mm512_storeu_si512(dsp + (size_t)((i0 + r) / 2) * Tp + j,
                                atb_interleave(_mm512_loadu_ps(dst + (size_t)r * Tp + j),
                                               _mm512_loadu_ps(dst + (size_t)(r + 1) * Tp + j)));
        /* dq rows = scale dS[rows, 0:n_keys] k[0:n_keys] */
        atb_rows(rows, kp, hs, ds16, (size_t)tw, 1, kpan, (size_t)hs, dq + (size_t)i0 * C3, (size_t)C3, scale, beta);
      }
      for (int j0 = 0; j0 < T; j0 += ATB_R) {
        int rows = TD_MIN(ATB_R, T - j0), p0 = j0 / 2, kp = (T - j0 + 1) / 2;
        /* key rows [j0, j0+rows) from queries [j0, T): dk = scale dS^T q, dv = P^T dout_h */
        atb_rows(rows, kp, hs, dsp + (size_t)p0 * Tp + j0, 1, (size_t)Tp, qpan + (size_t)p0 * hs, (size_t)hs,
                 dk + (size_t)j0 * C3, (size_t)C3, scale, beta);
        atb_rows(rows, kp, hs, pp + (size_t)p0 * Tp + j0, 1, (size_t)Tp, dpan + (size_t)p0 * hs, (size_t)hs,
                 dv + (size_t)j0 * C3, (size_t)C3, 1.0f, beta);
      }
    }
  return 1;
#else
  (void)dinp, (void)beta, (void)dout, (void)inp, (void)att, (void)B, (void)T, (void)C, (void)NH;
  return 0;
#endif
}
