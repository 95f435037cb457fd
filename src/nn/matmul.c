/* Matrix products: td_sgemm, the row-major sgemm every layer can use, and
 * (at the end of this file) nn_gemm / nn_gemm_tn, the AVX-512 products the
 * linear layers use where they apply. Compiled once per CPU level
 * (nn_kernels.h): the AVX-512 products exist only in the avx512 level; at
 * the other levels nn_gemm declines and the layers use td_sgemm.
 *
 * With OpenBLAS (TD_HAVE_OPENBLAS) td_sgemm is cblas_sgemm. Without it, a
 * portable loop nest: op(B) is packed block by block (KC x NC floats, kept
 * in L2) into a contiguous panel, and each row of C is updated four rows at
 * a time with contiguous, restrict-qualified inner loops over N that the
 * compiler vectorizes. It reaches a fraction of OpenBLAS's speed (no
 * register tiling in assembly) but has no dependency. */
#include "nn_kernels.h" /* first: names this level's functions (compiled once per CPU level) */

#include <stdlib.h>
#include <string.h>

#ifdef TD_HAVE_OPENBLAS
#include <cblas.h>
#endif

#ifdef __AVX512F__
/* Whether the single-threaded products should run (settings.c: td_nn_set_threads). */
static int gemm_single_thread(void) {
#ifdef TD_HAVE_OPENBLAS
  return nn_matmul_threads() <= 1;
#else
  return 1; /* the portable nest is single-threaded too */
#endif
}
#endif

#define KC 256 /* rows of op(B) per packed panel */
#define NC 512 /* columns of op(B) per packed panel: KC*NC*4 = 512 KiB, fits L2 */

/* C[i, j0:j0+nc] += sum_k a_k[i] * panel[k, 0:nc] for rows i0..i0+mr-1 (mr <= 4). */
static void update_rows(float *restrict C, int ldc, int mr, const float *a_rows[4], int a_step, int kc,
                        const float *restrict panel, int nc, float alpha) {
  float *restrict c0 = C;
  float *restrict c1 = mr > 1 ? C + ldc : C;
  float *restrict c2 = mr > 2 ? C + 2 * (size_t)ldc : C;
  float *restrict c3 = mr > 3 ? C + 3 * (size_t)ldc : C;
  if (mr == 4) {
    for (int k = 0; k < kc; k++) {
      float a0 = alpha * a_rows[0][(size_t)k * a_step], a1 = alpha * a_rows[1][(size_t)k * a_step];
      float a2 = alpha * a_rows[2][(size_t)k * a_step], a3 = alpha * a_rows[3][(size_t)k * a_step];
      const float *restrict b = panel + (size_t)k * nc;
      for (int j = 0; j < nc; j++) {
        c0[j] += a0 * b[j];
        c1[j] += a1 * b[j];
        c2[j] += a2 * b[j];
        c3[j] += a3 * b[j];
      }
    }
    return;
  }
  float *rows[4] = {c0, c1, c2, c3};
  for (int r = 0; r < mr; r++) {
    float *restrict c = rows[r];
    for (int k = 0; k < kc; k++) {
      float a = alpha * a_rows[r][(size_t)k * a_step];
      const float *restrict b = panel + (size_t)k * nc;
      for (int j = 0; j < nc; j++) c[j] += a * b[j];
    }
  }
}

void nn_sgemm_portable(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                       const float *B, int ldb, float beta, float *C, int ldc) {
  for (int i = 0; i < M; i++) {
    float *restrict c = C + (size_t)i * ldc;
    if (beta == 0.0f)
      memset(c, 0, (size_t)N * sizeof(float));
    else if (beta != 1.0f)
      for (int j = 0; j < N; j++) c[j] *= beta;
  }
  if (K == 0 || alpha == 0.0f) return;
  float *panel = malloc((size_t)KC * NC * sizeof(float));
  for (int j0 = 0; j0 < N; j0 += NC) {
    int nc = TD_MIN(NC, N - j0);
    for (int k0 = 0; k0 < K; k0 += KC) {
      int kc = TD_MIN(KC, K - k0);
      const float *bp;
      int ldp;
      if (panel) {
        /* pack op(B)[k0:k0+kc, j0:j0+nc] contiguously */
        for (int k = 0; k < kc; k++) {
          float *restrict dst = panel + (size_t)k * nc;
          if (!trans_b) {
            memcpy(dst, B + (size_t)(k0 + k) * ldb + j0, (size_t)nc * sizeof(float));
          } else {
            for (int j = 0; j < nc; j++) dst[j] = B[(size_t)(j0 + j) * ldb + k0 + k];
          }
        }
        bp = panel;
        ldp = nc;
      } else if (!trans_b) {
        /* out of memory for the panel: work straight from B */
        bp = B + (size_t)k0 * ldb + j0;
        ldp = ldb;
      } else {
        /* no panel and a transposed B: plain dot products */
        for (int i = 0; i < M; i++)
          for (int j = 0; j < nc; j++) {
            float s = 0.0f;
            for (int k = 0; k < kc; k++) {
              float a = trans_a ? A[(size_t)(k0 + k) * lda + i] : A[(size_t)i * lda + k0 + k];
              s += a * B[(size_t)(j0 + j) * ldb + k0 + k];
            }
            C[(size_t)i * ldc + j0 + j] += alpha * s;
          }
        continue;
      }
      /* A element (i, k) is at A[i*lda + k] or, transposed, A[k*lda + i] */
      int a_step = trans_a ? lda : 1;
      for (int i0 = 0; i0 < M; i0 += 4) {
        int mr = TD_MIN(4, M - i0);
        const float *a_rows[4];
        for (int r = 0; r < 4; r++) {
          int i = i0 + TD_MIN(r, mr - 1);
          a_rows[r] = trans_a ? A + (size_t)k0 * lda + i : A + (size_t)i * lda + k0;
        }
        if (ldp == nc) {
          update_rows(C + (size_t)i0 * ldc + j0, ldc, mr, a_rows, a_step, kc, bp, nc, alpha);
        } else {
          for (int k = 0; k < kc; k++)
            for (int r = 0; r < mr; r++) {
              float a = alpha * a_rows[r][(size_t)k * a_step];
              float *restrict c = C + (size_t)(i0 + r) * ldc + j0;
              const float *restrict b = bp + (size_t)k * ldp;
              for (int j = 0; j < nc; j++) c[j] += a * b[j];
            }
        }
      }
    }
  }
  free(panel);
}

void td_sgemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
              int ldb, float beta, float *C, int ldc) {
  if (M <= 0 || N <= 0) return;
#ifdef TD_HAVE_OPENBLAS
  if (K <= 0) {
    /* cblas rejects K = 0 on some versions; the product is empty */
    nn_sgemm_portable(trans_a, trans_b, M, N, 0, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha,
              A, lda, B, ldb, beta, C, ldc);
#else
  nn_sgemm_portable(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
}

/* ---- the layers' own product, AVX-512 ----
 * C = A op(B) for the linear layers' forward and input-gradient products,
 * where OpenBLAS spent ~16% of a GPT step packing operands (both A and B,
 * every call): here only op(B) (the weight, or a 256-column block of it) is
 * packed, into 32-column panels; A is read in place, rows 12 at a time,
 * each element broadcast against two 16-lane vectors of the panel (24
 * accumulators, the BLIS layout without the A pack): a KC x 32 panel of B
 * (32 KiB) stays in L1 while the tile moves down an MC x KC block of A (in
 * L2). Hot, the kernel runs at ~97% of the FMA peak; at B=8 T=128 C=256 the
 * products run 0-10% faster than cblas_sgemm (N = 256: ~10%; N = 768,
 * 1024: equal), and the
 * first-block store folds in the bias, the residual or the old C, which
 * removes the separate pass that prefilled C with the bias (~2% of a step)
 * and the memset OpenBLAS does for beta = 0. The weight-gradient product
 * (nn_gemm_tn, A transposed) does pack A, into 12-row panels (a 48-byte
 * copy per row of dout): broadcasting down columns of A in place was 10-20%
 * slower than OpenBLAS, packed it runs the GPT backward ~4% faster than
 * cblas_sgemm did. Both are single-threaded (td_nn_set_threads). */
#ifdef __AVX512F__
#define G_MR NN_GEMM_MR
#define G_NR 32  /* columns of C per tile (two vectors) */
#define G_KC NN_GEMM_KC
#define G_MC 120 /* rows of A per L2 block */
_Static_assert(G_MC % G_MR == 0, "row blocks are whole tiles (nn_gemm_tn indexes its A panels by row)");
#define G_NC NN_GEMM_NC
#define G_PACK_ROWS 8 /* rows of an operand per pass of a pack (8 rows of 1024 floats: 32 KiB, in L1) */

/* One tile: C[0:mr, 0:32] = A[0:mr, 0:kc] (rows lda apart) @ bp (kc x 32,
 * packed) + (first ? c_in + bias : C). Inlined with mr a constant into the
 * two callers below, so that the 24 accumulators stay in registers. */
static inline __attribute__((always_inline)) void gemm_tile(int mr, int kc, const float *a, size_t lda,
                                                             const float *bp, float *c, size_t ldc, int first,
                                                             const float *c_in, size_t ld_in, const float *bias) {
  /* Ask for the lines this tile stores (and adds) now, so that they arrive
   * during the k loop: in the forward the outputs are activations last
   * touched a step ago and the residual a layer ago, and taking those misses
   * at the store cost ~5% of the forward products' time. */
  for (int r = 0; r < mr; r++) {
    __builtin_prefetch(c + (size_t)r * ldc, 1, 3);
    __builtin_prefetch(c + (size_t)r * ldc + 16, 1, 3);
    if (first && c_in) {
      __builtin_prefetch(c_in + (size_t)r * ld_in, 0, 3);
      __builtin_prefetch(c_in + (size_t)r * ld_in + 16, 0, 3);
    }
  }
  nn_v16f acc[G_MR][2];
  for (int r = 0; r < G_MR; r++) acc[r][0] = acc[r][1] = (nn_v16f)NN_V16(0.0f);
  if (mr == G_MR) {
    /* four base pointers, rows at +0, +lda, +2 lda of each: keeps the row
     * addresses in registers (12 separate pointers spilled to the stack) */
    const float *base[4] = {a, a + 3 * lda, a + 6 * lda, a + 9 * lda};
    for (int k = 0; k < kc; k++) {
      nn_v16f b0 = nn_v16_load(bp + (size_t)k * G_NR), b1 = nn_v16_load(bp + (size_t)k * G_NR + 16);
#pragma GCC unroll 4
      for (int q = 0; q < 4; q++) {
        nn_v16f a0 = nn_v16_splat(base[q][k]), a1 = nn_v16_splat(base[q][k + lda]);
        nn_v16f a2 = nn_v16_splat(base[q][k + 2 * lda]);
        acc[3 * q][0] += a0 * b0, acc[3 * q][1] += a0 * b1;
        acc[3 * q + 1][0] += a1 * b0, acc[3 * q + 1][1] += a1 * b1;
        acc[3 * q + 2][0] += a2 * b0, acc[3 * q + 2][1] += a2 * b1;
      }
    }
  } else {
    for (int k = 0; k < kc; k++) {
      nn_v16f b0 = nn_v16_load(bp + (size_t)k * G_NR), b1 = nn_v16_load(bp + (size_t)k * G_NR + 16);
      for (int r = 0; r < mr; r++) {
        nn_v16f av = nn_v16_splat(a[(size_t)r * lda + k]);
        acc[r][0] += av * b0, acc[r][1] += av * b1;
      }
    }
  }
  nn_v16f bias0 = NN_V16(0.0f), bias1 = NN_V16(0.0f);
  if (first && bias) bias0 = nn_v16_load(bias), bias1 = nn_v16_load(bias + 16);
  for (int r = 0; r < mr; r++) {
    float *cp = c + (size_t)r * ldc;
    nn_v16f x0 = acc[r][0], x1 = acc[r][1];
    if (!first) {
      x0 += nn_v16_load(cp), x1 += nn_v16_load(cp + 16);
    } else {
      x0 += bias0, x1 += bias1;
      if (c_in) {
        const float *ip = c_in + (size_t)r * ld_in;
        x0 += nn_v16_load(ip), x1 += nn_v16_load(ip + 16);
      }
    }
    nn_v16_store(cp, x0);
    nn_v16_store(cp + 16, x1);
  }
}

static void gemm_tile_full(int kc, const float *a, size_t lda, const float *bp, float *c, size_t ldc, int first,
                           const float *c_in, size_t ld_in, const float *bias) {
  gemm_tile(G_MR, kc, a, lda, bp, c, ldc, first, c_in, ld_in, bias);
}

/* The last rows of A (M % 12: 4 at M = B T = 1024). With mr a constant the
 * accumulators stay in registers; with mr a variable they live on the stack
 * and the 4-row tile ran at ~40% of the full tile's speed per row. */
static void gemm_tile_part4(int kc, const float *a, size_t lda, const float *bp, float *c, size_t ldc, int first,
                            const float *c_in, size_t ld_in, const float *bias) {
  gemm_tile(4, kc, a, lda, bp, c, ldc, first, c_in, ld_in, bias);
}

static void gemm_tile_part8(int kc, const float *a, size_t lda, const float *bp, float *c, size_t ldc, int first,
                            const float *c_in, size_t ld_in, const float *bias) {
  gemm_tile(8, kc, a, lda, bp, c, ldc, first, c_in, ld_in, bias);
}

static void gemm_tile_part(int mr, int kc, const float *a, size_t lda, const float *bp, float *c, size_t ldc,
                           int first, const float *c_in, size_t ld_in, const float *bias) {
  if (mr == 4) {
    gemm_tile_part4(kc, a, lda, bp, c, ldc, first, c_in, ld_in, bias);
    return;
  }
  if (mr == 8) {
    gemm_tile_part8(kc, a, lda, bp, c, ldc, first, c_in, ld_in, bias);
    return;
  }
  gemm_tile(mr, kc, a, lda, bp, c, ldc, first, c_in, ld_in, bias);
}

/* bp[j/32][k][j%32] = op(B)(k0 + k, j0 + j) for k < kc, j < nc (nc % 32 == 0). */
static void gemm_pack_b(float *restrict bp, int trans_b, const float *B, size_t ldb, int k0, int kc, int j0, int nc) {
  if (!trans_b) {
    /* G_PACK_ROWS rows at a time, panel by panel: the rows stay in L1 and
     * each panel gets one contiguous 1 KiB run of stores. Row by row, the
     * stores went to nc/32 places kc * 128 bytes apart (32 KiB: one L1 set),
     * and stalled on them; panel by panel over all kc rows, every row was
     * read in 128-byte pieces nc/32 times over. */
    for (int kb = 0; kb < kc; kb += G_PACK_ROWS) {
      int ke = TD_MIN(kc, kb + G_PACK_ROWS);
      for (int jp = 0; jp < nc; jp += G_NR) {
        float *dst = bp + (size_t)jp * kc;
        const float *src = B + (size_t)k0 * ldb + j0 + jp;
        for (int k = kb; k < ke; k++) memcpy(dst + (size_t)k * G_NR, src + (size_t)k * ldb, G_NR * sizeof(float));
      }
    }
    return;
  }
  /* op(B)(k, j) = B[j][k]: 16 x 16 blocks transposed in registers (one
   * element at a time, 128 bytes apart, this pack was ~3% of a GPT step) */
  for (int jp = 0; jp < nc; jp += G_NR) {
    float *restrict dst = bp + (size_t)jp * kc;
    const float *src = B + (size_t)(j0 + jp) * ldb + k0;
    int k = 0;
    for (; k + 16 <= kc; k += 16)
      for (int h = 0; h < G_NR; h += 16) {
        __m512 r[16];
        for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(src + (size_t)(h + i) * ldb + k);
        nn_transpose16(r);
        for (int i = 0; i < 16; i++) _mm512_storeu_ps(dst + (size_t)(k + i) * G_NR + h, r[i]);
      }
    for (; k < kc; k++)
      for (int j = 0; j < G_NR; j++) dst[(size_t)k * G_NR + j] = src[(size_t)j * ldb + k];
  }
}

/* The weight-gradient tile: C[0:mr, 0:32] += Ap^T-panel (kc x 12, packed,
 * zero past mr) @ bp (kc x 32). The packed A makes the 12 broadcasts of a
 * step one contiguous 48-byte read. */
static inline __attribute__((always_inline)) void gemm_tile_packed_a(int mr, int rows, int kc, const float *ap,
                                                                      const float *bp, float *c, size_t ldc) {
  for (int r = 0; r < mr; r++) {
    __builtin_prefetch(c + (size_t)r * ldc, 1, 3);
    __builtin_prefetch(c + (size_t)r * ldc + 16, 1, 3);
  }
  nn_v16f acc[G_MR][2];
  for (int r = 0; r < G_MR; r++) acc[r][0] = acc[r][1] = (nn_v16f)NN_V16(0.0f);
  for (int k = 0; k < kc; k++) {
    nn_v16f b0 = nn_v16_load(bp + (size_t)k * G_NR), b1 = nn_v16_load(bp + (size_t)k * G_NR + 16);
    const float *a = ap + (size_t)k * G_MR;
#pragma GCC unroll 12
    for (int r = 0; r < rows; r++) { /* rows (a constant) >= mr of the panel's 12 */
      nn_v16f av = nn_v16_splat(a[r]);
      acc[r][0] += av * b0, acc[r][1] += av * b1;
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < rows; r++) { /* a constant bound, so that acc stays in registers */
    if (r >= mr) break;
    float *cp = c + (size_t)r * ldc;
    nn_v16_store(cp, nn_v16_load(cp) + acc[r][0]);
    nn_v16_store(cp + 16, nn_v16_load(cp + 16) + acc[r][1]);
  }
}

static void gemm_tile_packed_a_full(int kc, const float *ap, const float *bp, float *c, size_t ldc) {
  gemm_tile_packed_a(G_MR, G_MR, kc, ap, bp, c, ldc);
}

/* The last rows (M % 12: 4 at M = 256 or 1024) computed in 4 or 8 rows of
 * the panel, not all 12 (the products of the zero rows were 2/3 of the
 * 4-row tile's time). */
static void gemm_tile_packed_a_part4(int mr, int kc, const float *ap, const float *bp, float *c, size_t ldc) {
  gemm_tile_packed_a(mr, 4, kc, ap, bp, c, ldc);
}

static void gemm_tile_packed_a_part8(int mr, int kc, const float *ap, const float *bp, float *c, size_t ldc) {
  gemm_tile_packed_a(mr, 8, kc, ap, bp, c, ldc);
}

static void gemm_tile_packed_a_part(int mr, int kc, const float *ap, const float *bp, float *c, size_t ldc) {
  if (mr <= 4)
    gemm_tile_packed_a_part4(mr, kc, ap, bp, c, ldc);
  else if (mr <= 8)
    gemm_tile_packed_a_part8(mr, kc, ap, bp, c, ldc);
  else
    gemm_tile_packed_a(mr, G_MR, kc, ap, bp, c, ldc);
}

/* cs[j] += rows[r][j] for r < n in order (the same sums as row by row),
 * eight rows per pass over cs. */
static void colsum_rows(float *restrict cs, const float *rows, size_t ld, int n, int M) {
  int r = 0;
  for (; r + G_PACK_ROWS <= n; r += G_PACK_ROWS) {
    const float *restrict x = rows + (size_t)r * ld;
    for (int j = 0; j < M; j++) {
      float s = cs[j];
#pragma GCC unroll 8
      for (int q = 0; q < G_PACK_ROWS; q++) s += x[(size_t)q * ld + j];
      cs[j] = s;
    }
  }
  for (; r < n; r++) {
    const float *restrict x = rows + (size_t)r * ld;
    for (int j = 0; j < M; j++) cs[j] += x[j];
  }
}

/* nn_gemm_ep's epilogue on a finished block of C (rows x cols, cols % 16
 * == 0), while the block is in L2: the separate pass it replaces read C
 * back from memory (GELU forward and backward were ~3.5% of a GPT step,
 * fused here ~2.5%). Done in the tiles' stores instead, it made the
 * products slower by more than it saved (measured: the time gemm_tile_full
 * spent outside its k loop doubled). */
static void gemm_epilogue(int ep, float *C, float *aux, size_t ldc, int rows, int cols) {
  for (int r = 0; r < rows; r++) {
    float *c = C + (size_t)r * ldc, *x = aux + (size_t)r * ldc;
    for (int j = 0; j < cols; j += 16) {
      nn_v16f v = nn_v16_load(c + j);
      if (ep == NN_GEMM_GELU) {
        nn_v16f s = nn_gelu_sigmoid_v16(v);
        nn_v16_store(x + j, nn_gelu_grad_from_s(v, s));
        nn_v16_store(c + j, v * s);
      } else {
        nn_v16_store(c + j, nn_v16_load(x + j) * v);
      }
    }
  }
}

static __thread float *gemm_panel;
static __thread float *gemm_apanel; /* nn_gemm_tn's op(A), G_KC deep, in 12-row panels */
static __thread size_t gemm_apanel_n; /* G_KC x G_NC, per thread (model replicas run on threads) */

int nn_gemm_ep(int trans_b, int M, int N, int K, const float *A, int lda, const float *B, int ldb, const float *c_in,
               int ld_in, const float *bias, float *C, int ldc, int epilogue, float *aux) {
  if (M <= 0 || N <= 0 || K <= 0 || N % G_NR != 0 || !gemm_single_thread()) return 0;
  if (!gemm_panel) {
    gemm_panel = td_alloc((size_t)G_KC * G_NC * sizeof(float));
    if (!gemm_panel) return 0;
  }
  for (int j0 = 0; j0 < N; j0 += G_NC) {
    int nc = TD_MIN(G_NC, N - j0);
    for (int k0 = 0; k0 < K; k0 += G_KC) {
      int kc = TD_MIN(G_KC, K - k0), first = k0 == 0;
      int ep = k0 + kc == K ? epilogue : NN_GEMM_PLAIN;
      gemm_pack_b(gemm_panel, trans_b, B, (size_t)ldb, k0, kc, j0, nc);
      for (int i0 = 0; i0 < M; i0 += G_MC) {
        int mc = TD_MIN(G_MC, M - i0);
        for (int jp = 0; jp < nc; jp += G_NR) {
          const float *bp = gemm_panel + (size_t)jp * kc;
          const float *bias_j = bias ? bias + j0 + jp : NULL;
          for (int ir = 0; ir < mc; ir += G_MR) {
            int i = i0 + ir, mr = TD_MIN(G_MR, mc - ir);
            const float *a = A + (size_t)i * lda + k0;
            float *c = C + (size_t)i * ldc + j0 + jp;
            const float *in = c_in ? c_in + (size_t)i * ld_in + j0 + jp : NULL;
            if (mr == G_MR)
              gemm_tile_full(kc, a, (size_t)lda, bp, c, (size_t)ldc, first, in, (size_t)ld_in, bias_j);
            else
              gemm_tile_part(mr, kc, a, (size_t)lda, bp, c, (size_t)ldc, first, in, (size_t)ld_in, bias_j);
          }
        }
        if (ep != NN_GEMM_PLAIN)
          gemm_epilogue(ep, C + (size_t)i0 * ldc + j0, aux + (size_t)i0 * ldc + j0, (size_t)ldc, mc, nc);
      }
    }
  }
  return 1;
}

int nn_gemm_tn(int M, int N, int K, const float *A, int lda, const float *B, int ldb, float *C, int ldc,
               float *colsum) {
  if (M <= 0 || N <= 0 || K <= 0 || N % G_NR != 0 || !gemm_single_thread()) return 0;
  size_t tiles = ((size_t)M + G_MR - 1) / G_MR, a_need = tiles * G_MR * G_KC;
  if (!gemm_panel) gemm_panel = td_alloc((size_t)G_KC * G_NC * sizeof(float));
  if (gemm_apanel_n < a_need) {
    td_free(gemm_apanel);
    gemm_apanel = td_alloc(a_need * sizeof(float));
    gemm_apanel_n = gemm_apanel ? a_need : 0;
  }
  if (!gemm_panel || !gemm_apanel) return 0;
  for (int k0 = 0; k0 < K; k0 += G_KC) {
    int kc = TD_MIN(G_KC, K - k0);
    /* all of op(A)'s rows for this depth block, once (not once per column
     * block): ap[t][k][r] = A[k0 + k][12 t + r], 0 past M; row by row, so
     * that each row of A is read once, in order */
    for (int kb = 0; kb < kc; kb += G_PACK_ROWS) {
      /* G_PACK_ROWS rows at a time, tile by tile (see gemm_pack_b) */
      int ke = TD_MIN(kc, kb + G_PACK_ROWS);
      const float *rows = A + (size_t)k0 * lda;
      int i = 0;
      for (; i + G_MR <= M; i += G_MR) {
        float *d = gemm_apanel + (size_t)i * kc;
        for (int k = kb; k < ke; k++) memcpy(d + (size_t)k * G_MR, rows + (size_t)k * lda + i, G_MR * sizeof(float));
      }
      if (i < M)
        for (int k = kb; k < ke; k++) {
          float *d = gemm_apanel + (size_t)i * kc + (size_t)k * G_MR;
          for (int r = 0; r < G_MR; r++) d[r] = i + r < M ? rows[(size_t)k * lda + i + r] : 0.0f;
        }
      if (colsum) /* the rows are in L1 now: the bias gradient costs no pass of its own */
        colsum_rows(colsum, rows + (size_t)kb * lda, (size_t)lda, ke - kb, M);
    }
    for (int j0 = 0; j0 < N; j0 += G_NC) {
      int nc = TD_MIN(G_NC, N - j0);
      gemm_pack_b(gemm_panel, 0, B, (size_t)ldb, k0, kc, j0, nc);
      for (int i0 = 0; i0 < M; i0 += G_MC) {
        int mc = TD_MIN(G_MC, M - i0);
        for (int jp = 0; jp < nc; jp += G_NR) {
          const float *bp = gemm_panel + (size_t)jp * kc;
          for (int ir = 0; ir < mc; ir += G_MR) {
            int mr = TD_MIN(G_MR, mc - ir);
            float *c = C + (size_t)(i0 + ir) * ldc + j0 + jp;
            const float *ap = gemm_apanel + (size_t)(i0 + ir) * kc; /* G_MC is a multiple of G_MR */
            if (mr == G_MR)
              gemm_tile_packed_a_full(kc, ap, bp, c, (size_t)ldc);
            else
              gemm_tile_packed_a_part(mr, kc, ap, bp, c, (size_t)ldc);
          }
        }
      }
    }
  }
  return 1;
}
#else
int nn_gemm_ep(int trans_b, int M, int N, int K, const float *A, int lda, const float *B, int ldb, const float *c_in,
               int ld_in, const float *bias, float *C, int ldc, int epilogue, float *aux) {
  (void)trans_b, (void)M, (void)N, (void)K, (void)A, (void)lda, (void)B, (void)ldb, (void)c_in, (void)ld_in;
  (void)bias, (void)C, (void)ldc, (void)epilogue, (void)aux;
  return 0;
}

int nn_gemm_tn(int M, int N, int K, const float *A, int lda, const float *B, int ldb, float *C, int ldc,
               float *colsum) {
  (void)M, (void)N, (void)K, (void)A, (void)lda, (void)B, (void)ldb, (void)C, (void)ldc, (void)colsum;
  return 0;
}
#endif

int nn_gemm(int trans_b, int M, int N, int K, const float *A, int lda, const float *B, int ldb, const float *c_in,
            int ld_in, const float *bias, float *C, int ldc) {
  return nn_gemm_ep(trans_b, M, N, K, A, lda, B, ldb, c_in, ld_in, bias, C, ldc, NN_GEMM_PLAIN, NULL);
}

/* ---- the GELU epilogue as a pass over memory (layers.c's GELU block says
 * why gelu' is cached): at every level, for the layers and for
 * nn_gemm_lowp_ep's portable path (matmul_bf16.c) ---- */
void nn_gelu_forward_cache(float *out, float *dgelu, const float *inp, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    nn_v16f x = nn_v16_load(inp + i), s = nn_gelu_sigmoid_v16(x);
    nn_v16_store(out + i, x * s);
    nn_v16_store(dgelu + i, nn_gelu_grad_from_s(x, s)); /* after reading inp: dgelu may alias it */
  }
  if (i < n) {
    int rest = (int)(n - i);
    nn_v16f x = nn_v16_load_partial(inp + i, rest, 0.0f), s = nn_gelu_sigmoid_v16(x);
    nn_v16_store_partial(out + i, x * s, rest);
    nn_v16_store_partial(dgelu + i, nn_gelu_grad_from_s(x, s), rest);
  }
}

void nn_gelu_backward_cached(float *dinp, const float *dgelu, const float *dout, size_t n) {
  float *restrict dx = dinp;
  const float *restrict g = dgelu;
  if (dinp == dout) {
    for (size_t i = 0; i < n; i++) dx[i] *= g[i];
  } else {
    const float *restrict d = dout;
    for (size_t i = 0; i < n; i++) dx[i] = g[i] * d[i];
  }
}
