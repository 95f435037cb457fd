/* Half-precision matrix products for mixed-precision training
 * (src/train/precision/): nn_gemm_lowp, C (f32) = beta C + op(A) op(B) +
 * bias, where every element of op(A) and op(B) is first rounded to bf16 (or
 * f16) and the products are accumulated in f32. Compiled once per CPU level
 * (nn_kernels.h).
 *
 * At the avx512bf16 level, bf16 runs on vdpbf16ps (two bf16 products summed
 * into each f32 lane, ~1.8x the f32 FMA rate of this machine's cores):
 *
 *   op(B) block (KC deep, NC wide) packed once into 32-column panels of
 *   bf16 pairs:   bp[p][j] = (B(2p, j), B(2p+1, j))  (p: pair of depths)
 *   op(A) block (MC rows) packed into bf16 rows, depth padded to even:
 *                 ap[i][2p], ap[i][2p+1]; or, when A is transposed (the
 *                 weight gradient: rows of A run along i), pairs-major
 *                 ap[p][i] = (A(i, 2p), A(i, 2p+1)), built with vector
 *                 interleaves instead of a scatter (1.5x on that product)
 *   tile 12 x 32: per pair p, two panel loads and 12 broadcasts of A's pair
 *                 feed 24 vdpbf16ps into 24 f32 accumulators.
 *
 * An odd depth is padded with a zero. Edges of M and N are zero-padded in
 * the packs and stored with masks. The first depth block's store adds beta
 * C and the bias, later ones add to C.
 *
 * Below that level (and always for f16: this CPU has no f16 dot product),
 * the portable path rounds op(A) and op(B) into f32 scratch and multiplies
 * them with td_sgemm: a product of two bf16 (or f16) values is exact in
 * f32, so it computes the same products with f32 accumulation, at f32
 * speed. Both keep their scratch per thread (model replicas run on threads)
 * for the life of the thread. */
#include "nn_kernels.h" /* first: names this level's functions (compiled once per CPU level) */

#include <stdlib.h>
#include <string.h>

#if defined(__F16C__)
#include <immintrin.h>
#endif

/* round to nearest even, NaN kept quiet (as td_f32_to_bf16) */
static inline float round_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u)
    x |= 0x00400000u;
  else
    x = (x + 0x7fffu + ((x >> 16) & 1u));
  x &= 0xffff0000u;
  memcpy(&f, &x, 4);
  return f;
}

/* dst[i] = round(src[i]) for n values, rounding to `dtype` (TD_BF16 or TD_F16). */
static void round_row(float *restrict dst, const float *restrict src, size_t n, td_dtype dtype) {
  if (dtype == TD_BF16) {
    for (size_t i = 0; i < n; i++) dst[i] = round_bf16(src[i]);
    return;
  }
  size_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT)));
#endif
  for (; i < n; i++) dst[i] = td_f16_to_f32(td_f32_to_f16(src[i]));
}

static __thread float *lowp_scratch;
static __thread size_t lowp_scratch_n;

/* The portable path (see the top of the file). Returns 0 when out of memory. */
/* dst[i] = the bf16 src[i] as f32 (exact) */
static void widen_row(float *restrict dst, const uint16_t *restrict src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = td_bf16_to_f32(src[i]);
}

static int gemm_lowp_rounded(td_dtype dtype, int trans_a, int trans_b, int M, int N, int K, const float *A,
                             const uint16_t *A16, int lda, const float *B, const uint16_t *B16, int ldb, float beta,
                             const float *bias, float *C, int ldc) {
  size_t na = (size_t)M * K, nb = (size_t)K * N;
  if (lowp_scratch_n < na + nb) {
    td_free(lowp_scratch);
    lowp_scratch = td_alloc((na + nb) * sizeof(float));
    lowp_scratch_n = lowp_scratch ? na + nb : 0;
    if (!lowp_scratch) return 0;
  }
  /* rounded copies keep the operands' layout (rows of op's source) */
  float *ar = lowp_scratch, *br = lowp_scratch + na;
  int a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
  int b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
  /* a bf16 copy is already rounded: widened back, it gives the same values */
  for (int r = 0; r < a_rows; r++)
    if (A16)
      widen_row(ar + (size_t)r * a_cols, A16 + (size_t)r * lda, (size_t)a_cols);
    else
      round_row(ar + (size_t)r * a_cols, A + (size_t)r * lda, (size_t)a_cols, dtype);
  for (int r = 0; r < b_rows; r++)
    if (B16)
      widen_row(br + (size_t)r * b_cols, B16 + (size_t)r * ldb, (size_t)b_cols);
    else
      round_row(br + (size_t)r * b_cols, B + (size_t)r * ldb, (size_t)b_cols, dtype);
  if (bias) {
    for (int i = 0; i < M; i++) {
      float *restrict c = C + (size_t)i * ldc;
      if (beta == 0.0f)
        memcpy(c, bias, (size_t)N * sizeof(float));
      else
        for (int j = 0; j < N; j++) c[j] = beta * c[j] + bias[j];
    }
    beta = 1.0f;
  }
  td_sgemm(trans_a, trans_b, M, N, K, 1.0f, ar, a_cols, br, b_cols, beta, C, ldc);
  return 1;
}

#ifdef __AVX512BF16__
#include <immintrin.h>

#define BF_MR 12  /* rows of C per tile */
#define BF_NR 32  /* columns of C per tile (two vectors) */
/* depth per block (even): a 32-column panel is 16 KiB, and with a tile's 12
 * rows of A (6 KiB) it fits this CPU's 32 KiB L1; at 384 (24 + 9 KiB) it
 * did not, and a GPT step's products ran ~6% slower (bench/bf16gemm.sh) */
#define BF_KC 256
#define BF_MC 96  /* rows of A per block (a multiple of BF_MR) */
#define BF_NC 512 /* columns of B per block: 256 KiB of panels */
_Static_assert(BF_KC % 2 == 0 && BF_MC % BF_MR == 0 && BF_NC % BF_NR == 0, "blocks are whole pairs and tiles");

static __thread uint32_t *bf_bpanel; /* (BF_KC/2) x BF_NC pairs */
/* op(A)'s rows for one depth block: where N spans several column blocks,
 * all ceil(M / BF_MC) row blocks of BF_MC x BF_KC bf16, packed in the first
 * column block and read again by the others (packing them per column block
 * again cost ~4% of a bf16 GPT step: N is 768 or 1024 in half of its
 * products); else one row block, reused row block after row block */
static __thread uint16_t *bf_apanel;
static __thread size_t bf_apanel_blocks;

/* 16 floats to 16 bf16 (nearest even) */
static inline __m256i cvt16(__m512 v) { return (__m256i)_mm512_cvtneps_pbh(v); }

/* 16 floats of a row (fewer at an edge: the rest read as 0) */
static inline __m512 load16(const float *p, int n) {
  return n >= 16 ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1u), p);
}

/* the 32 bf16 of cvtne2ps(v1, v0) (lanes 0-15 from v0, 16-31 from v1)
 * reordered into 16 pairs (v0[i], v1[i]) */
static inline __m512i interleave_pairs(__m512 v0, __m512 v1) {
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                       21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(v1, v0));
}

/* n (<= 32) bf16 of a row as a vector, the rest zero */
static inline __m512i load32h(const uint16_t *p, int n) {
  return n >= 32 ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16(n <= 0 ? 0 : (__mmask32)((1ull << n) - 1u), p);
}

/* bp: the block op(B)[k0 : k0+kc, j0 : j0+nc] as 32-column panels of pairs,
 * panel q at bp + q * (kp * 32), kp = ceil(kc / 2); zeros past nc and kc.
 * B16 (not transposed only): B's bf16 copy (rows ldb apart), read instead
 * of B: the pairs are interleaved from half the bytes, with no conversion. */
static void bf_pack_b(uint32_t *restrict bp, int trans_b, const float *B, const uint16_t *B16, size_t ldb, int k0,
                      int kc, int j0, int nc) {
  int kp = (kc + 1) / 2;
  for (int q = 0; q * BF_NR < nc; q++) {
    uint32_t *panel = bp + (size_t)q * kp * BF_NR;
    int jn = TD_MIN(BF_NR, nc - q * BF_NR), jb = j0 + q * BF_NR;
    if (!trans_b && B16) {
      /* pair j of the 32: (row 2p [j], row 2p+1 [j]) */
      const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                          37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
      const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
      for (int p = 0; p < kp; p++) {
        const uint16_t *r0 = B16 + (size_t)(k0 + 2 * p) * ldb + jb;
        __m512i v0 = load32h(r0, jn), v1 = 2 * p + 1 < kc ? load32h(r0 + ldb, jn) : _mm512_setzero_si512();
        _mm512_storeu_si512(panel + (size_t)p * BF_NR, _mm512_permutex2var_epi16(v0, lo, v1));
        _mm512_storeu_si512(panel + (size_t)p * BF_NR + 16, _mm512_permutex2var_epi16(v0, hi, v1));
      }
    } else if (!trans_b) {
      /* rows 2p and 2p+1 of B, 16 columns at a time, interleaved */
      for (int p = 0; p < kp; p++) {
        const float *r0 = B + (size_t)(k0 + 2 * p) * ldb + jb;
        const float *r1 = 2 * p + 1 < kc ? r0 + ldb : NULL;
        for (int h = 0; h < BF_NR; h += 16) {
          int n = TD_MAX(0, TD_MIN(16, jn - h));
          __m512 v0 = n ? load16(r0 + h, n) : _mm512_setzero_ps();
          __m512 v1 = n && r1 ? load16(r1 + h, n) : _mm512_setzero_ps();
          _mm512_storeu_si512(panel + (size_t)p * BF_NR + h, interleave_pairs(v0, v1));
        }
      }
    } else {
      /* column j of op(B) is row j of B (the weights of a linear layer's
       * forward): 16 columns x 16 pairs at a time, each row's 32 depths
       * converted to 16 pairs in one register, the 16 x 16 block of pairs
       * transposed in registers so that the panel is written in whole
       * lines (a scalar scatter of the pairs down the panel's columns made
       * this pack ~1% of a bf16 GPT step) */
      for (int h = 0; h < BF_NR; h += 16) {
        int nj = TD_MAX(0, TD_MIN(16, jn - h));
        for (int k = 0; k < kc; k += 32) {
          int n0 = TD_MIN(16, kc - k), n1 = TD_MAX(0, TD_MIN(16, kc - k - 16));
          __m512 r[16];
          for (int j = 0; j < 16; j++) {
            if (j >= nj) {
              r[j] = _mm512_setzero_ps();
              continue;
            }
            const float *row = B + (size_t)(jb + h + j) * ldb + k0 + k;
            __m512 lo = load16(row, n0), hi = n1 ? load16(row + 16, n1) : _mm512_setzero_ps();
            r[j] = (__m512)_mm512_cvtne2ps_pbh(hi, lo); /* pair t = depths (k + 2t, k + 2t + 1) */
          }
          nn_transpose16(r); /* r[t]: pair t of the 16 columns */
          int np = TD_MIN(16, (kc - k + 1) / 2);
          for (int t = 0; t < np; t++) _mm512_storeu_ps((float *)(panel + (size_t)(k / 2 + t) * BF_NR + h), r[t]);
        }
      }
    }
  }
}

/* ap: rows i0 .. i0+mc of op(A)[:, k0 : k0+kc] as bf16 rows of kp pairs
 * (a zero after an odd depth), BF_MR-padded with zero rows. colsum: unless
 * NULL, colsum[i] += op(A)[i][k] over the block's depths, in order (the
 * bias gradient of the weight-gradient product, from the f32 values). */
static void bf_pack_a(uint16_t *restrict ap, int trans_a, const float *A, const uint16_t *A16, size_t lda, int i0,
                      int mc, int k0, int kc, float *colsum) {
  int kp = (kc + 1) / 2, mcp = (mc + BF_MR - 1) / BF_MR * BF_MR;
  size_t rs = (size_t)kp * 2; /* bf16 per packed row */
  if (!trans_a && A16) {
    /* A's bf16 copy: the rows are already what the tiles read */
    for (int i = 0; i < mc; i++) {
      uint16_t *d = ap + (size_t)i * rs;
      memcpy(d, A16 + (size_t)(i0 + i) * lda + k0, (size_t)kc * sizeof(uint16_t));
      if (kc & 1) d[kc] = 0;
      if (colsum) {
        const float *row = A + (size_t)(i0 + i) * lda + k0;
        float s = colsum[i0 + i];
        for (int k = 0; k < kc; k++) s += row[k];
        colsum[i0 + i] = s;
      }
    }
  } else if (!trans_a) {
    for (int i = 0; i < mc; i++) {
      const float *row = A + (size_t)(i0 + i) * lda + k0;
      uint16_t *d = ap + (size_t)i * rs;
      for (int k = 0; k < kc; k += 16) _mm256_storeu_si256((__m256i *)(d + k), cvt16(load16(row + k, kc - k)));
      if (kc & 1) d[kc] = 0;
      if (colsum) {
        float s = colsum[i0 + i];
        for (int k = 0; k < kc; k++) s += row[k];
        colsum[i0 + i] = s;
      }
    }
  } else {
    /* op(A)[i][k] = A[k][i]: rows k of A are contiguous in i, so this pack
     * is pairs-major instead: ((uint32_t *)ap)[p * mcp + i] = (A[2p][i],
     * A[2p+1][i]), rows 2p and 2p+1 interleaved 16 columns at a time, as
     * bf_pack_b does (bf_tile reads it with row step 1, pair step mcp) */
    uint32_t *pairs = (uint32_t *)ap;
    for (int p = 0; p < kp; p++) {
      const float *r0 = A + (size_t)(k0 + 2 * p) * lda + i0;
      const float *r1 = 2 * p + 1 < kc ? r0 + lda : NULL;
      for (int i = 0; i < mcp; i += 16) {
        int n = TD_MAX(0, TD_MIN(16, mc - i));
        __m512 v0 = n ? load16(r0 + i, n) : _mm512_setzero_ps();
        __m512 v1 = n && r1 ? load16(r1 + i, n) : _mm512_setzero_ps();
        if (colsum && n) {
          __mmask16 m = (__mmask16)(n >= 16 ? 0xffff : (1u << n) - 1u);
          __m512 s = _mm512_add_ps(_mm512_maskz_loadu_ps(m, colsum + i0 + i), v0);
          if (r1) s = _mm512_add_ps(s, v1);
          _mm512_mask_storeu_ps(colsum + i0 + i, m, s);
        }
        _mm512_mask_storeu_epi32(pairs + (size_t)p * mcp + i, (__mmask16)(mcp - i >= 16 ? 0xffff : (1u << (mcp - i)) - 1u),
                                 interleave_pairs(v0, v1));
      }
    }
    return;
  }
  for (int i = mc; i < mcp; i++) memset(ap + (size_t)i * rs, 0, rs * sizeof(uint16_t));
}

/* What a tile adds and does when it stores (gemm_bf16_native). */
typedef struct bf_store {
  const float *c_in; /* first depth block: + beta c_in (NULL: nothing; may be C) */
  size_t ld_in;
  float beta;
  const float *bias; /* first depth block: + bias (NULL: nothing), at this tile's column */
  int epilogue;      /* last depth block: NN_GEMM_* on the final value */
  float *aux;        /* NN_GEMM_GELU / NN_GEMM_MUL's (M, N), rows ldc apart, at this tile */
  uint16_t *c16;     /* last depth block: the final C rounded to bf16 too, rows ldc apart (NULL: not) */
} bf_store;

/* One row of a tile's final values x0, x1 (16 + 16 lanes, masks m0, m1) stored with the epilogue. */
static inline void bf_store_row(float *cr, float *ar, uint16_t *c16, __m512 x0, __m512 x1, __mmask16 m0, __mmask16 m1,
                                int epilogue) {
  if (epilogue == NN_GEMM_GELU) {
    nn_v16f v0 = (nn_v16f)x0, v1 = (nn_v16f)x1;
    nn_v16f s0 = nn_gelu_sigmoid_v16(v0), s1 = nn_gelu_sigmoid_v16(v1);
    _mm512_mask_storeu_ps(ar, m0, (__m512)nn_gelu_grad_from_s(v0, s0));
    _mm512_mask_storeu_ps(ar + 16, m1, (__m512)nn_gelu_grad_from_s(v1, s1));
    x0 = (__m512)(v0 * s0);
    x1 = (__m512)(v1 * s1);
  } else if (epilogue == NN_GEMM_MUL) {
    x0 = _mm512_mul_ps(x0, _mm512_maskz_loadu_ps(m0, ar));
    x1 = _mm512_mul_ps(x1, _mm512_maskz_loadu_ps(m1, ar + 16));
  }
  _mm512_mask_storeu_ps(cr, m0, x0);
  _mm512_mask_storeu_ps(cr + 16, m1, x1);
  if (c16) {
    _mm256_mask_storeu_epi16(c16, m0, cvt16(x0));
    _mm256_mask_storeu_epi16(c16 + 16, m1, cvt16(x1));
  }
}

/* One 12 x 32 tile over kp pairs: A's pair (row r, pair p) is at a[r *
 * row_step + p * pair_step] (uint32 units: rows layout, or pairs layout),
 * bp one panel. Stores rows < mr, columns < nr: the first depth block adds
 * st's c_in and bias, later ones add C; the last applies st's epilogue.
 * Inlined into the two layouts' callers so that the steps are constants
 * where they can be. */
static inline __attribute__((always_inline)) void bf_tile_any(int kp, const uint32_t *a, size_t row_step,
                                                              size_t pair_step, const uint32_t *bp, float *c,
                                                              size_t ldc, int mr, int nr, int first, int last,
                                                              const bf_store *st) {
  __m512 acc[BF_MR][2];
  for (int r = 0; r < BF_MR; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  /* C's rows, which the store below reads (later depth blocks, c_in = C)
   * and writes, fetched now for writing: C is 1-4 MiB at the GPT's sizes,
   * beyond L2, and the tile's products (~1500 cycles) hide the misses
   * (+3-5% on a step's products, bench/bf16gemm.sh; prefetching A's rows
   * ahead in the loop as well measured 1-2% slower) */
  for (int r = 0; r < mr; r++) {
    __builtin_prefetch(c + (size_t)r * ldc, 1, 3);
    if (nr > 16) __builtin_prefetch(c + (size_t)r * ldc + 16, 1, 3);
  }
  for (int p = 0; p < kp; p++) {
    __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + (size_t)p * BF_NR);
    __m512bh b1 = (__m512bh)_mm512_loadu_si512(bp + (size_t)p * BF_NR + 16);
    const uint32_t *ap = a + (size_t)p * pair_step;
#pragma GCC unroll 12
    for (int r = 0; r < BF_MR; r++) {
      __m512bh av = (__m512bh)_mm512_set1_epi32((int)ap[(size_t)r * row_step]);
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
    }
  }
  __mmask16 m0 = nr >= 16 ? 0xffff : (__mmask16)((1u << nr) - 1u);
  __mmask16 m1 = nr >= 32 ? 0xffff : nr <= 16 ? 0 : (__mmask16)((1u << (nr - 16)) - 1u);
  __m512 bias0 = _mm512_setzero_ps(), bias1 = _mm512_setzero_ps();
  if (first && st->bias) {
    bias0 = _mm512_maskz_loadu_ps(m0, st->bias);
    bias1 = _mm512_maskz_loadu_ps(m1, st->bias + 16);
  }
  int use_in = first && st->c_in && st->beta != 0.0f, ep = last ? st->epilogue : NN_GEMM_PLAIN;
  for (int r = 0; r < mr; r++) {
    float *cr = c + (size_t)r * ldc;
    __m512 x0 = acc[r][0], x1 = acc[r][1];
    if (first) {
      x0 = _mm512_add_ps(x0, bias0);
      x1 = _mm512_add_ps(x1, bias1);
      if (use_in) {
        const float *ir = st->c_in + (size_t)r * st->ld_in;
        x0 = _mm512_fmadd_ps(_mm512_set1_ps(st->beta), _mm512_maskz_loadu_ps(m0, ir), x0);
        x1 = _mm512_fmadd_ps(_mm512_set1_ps(st->beta), _mm512_maskz_loadu_ps(m1, ir + 16), x1);
      }
    } else {
      x0 = _mm512_add_ps(x0, _mm512_maskz_loadu_ps(m0, cr));
      x1 = _mm512_add_ps(x1, _mm512_maskz_loadu_ps(m1, cr + 16));
    }
    bf_store_row(cr, ep ? st->aux + (size_t)r * ldc : NULL, last && st->c16 ? st->c16 + (size_t)r * ldc : NULL, x0, x1,
                 m0, m1, ep);
  }
}

/* rows layout: row r at r * rp pairs, its pairs consecutive */
static void bf_tile(int kp, const uint32_t *a, size_t rp, const uint32_t *bp, float *c, size_t ldc, int mr, int nr,
                    int first, int last, const bf_store *st) {
  bf_tile_any(kp, a, rp, 1, bp, c, ldc, mr, nr, first, last, st);
}

/* pairs layout: pair p at p * mcp, the rows' pairs consecutive */
static void bf_tile_t(int kp, const uint32_t *a, size_t mcp, const uint32_t *bp, float *c, size_t ldc, int mr,
                      int nr, int first, int last, const bf_store *st) {
  bf_tile_any(kp, a, 1, mcp, bp, c, ldc, mr, nr, first, last, st);
}

/* Blocking: for each depth block, for each column block, op(B)'s panels
 * (once), then the tiles, row block by row block; op(A)'s row block is
 * packed right before its tiles in the first column block and read again
 * by the others. Returns 0 when out of memory (nothing written). */
static int gemm_bf16_native(int trans_a, int trans_b, int M, int N, int K, const float *A, const uint16_t *A16,
                            int lda, const float *B, const uint16_t *B16, int ldb, const float *c_in, size_t ld_in,
                            float beta, const float *bias, float *C, int ldc, uint16_t *C16, int epilogue, float *aux,
                            float *colsum) {
  /* with one column block, every row block is packed into the same place
   * (a buffer that stays in L2); with more, each keeps its own for reuse */
  int keep_a = N > BF_NC;
  size_t a_blocks = keep_a ? (size_t)(M + BF_MC - 1) / BF_MC : 1;
  if (!bf_bpanel) bf_bpanel = td_alloc((size_t)(BF_KC / 2) * BF_NC * sizeof(uint32_t));
  if (bf_apanel_blocks < a_blocks) {
    td_free(bf_apanel);
    bf_apanel = td_alloc(a_blocks * BF_MC * BF_KC * sizeof(uint16_t));
    bf_apanel_blocks = bf_apanel ? a_blocks : 0;
  }
  if (!bf_bpanel || !bf_apanel) return 0;
  for (int k0 = 0; k0 < K; k0 += BF_KC) {
    int kc = TD_MIN(BF_KC, K - k0), kp = (kc + 1) / 2, first = k0 == 0, last = k0 + kc >= K;
    for (int j0 = 0; j0 < N; j0 += BF_NC) {
      int nc = TD_MIN(BF_NC, N - j0);
      bf_pack_b(bf_bpanel, trans_b, B, B16, (size_t)ldb, k0, kc, j0, nc);
      for (int i0 = 0; i0 < M; i0 += BF_MC) {
        int mc = TD_MIN(BF_MC, M - i0);
        uint16_t *ablock = bf_apanel + (keep_a ? (size_t)(i0 / BF_MC) * BF_MC * BF_KC : 0);
        /* packed just before its first use (still in L1/L2 for the tiles), kept for the next column blocks */
        if (j0 == 0) bf_pack_a(ablock, trans_a, A, A16, (size_t)lda, i0, mc, k0, kc, colsum);
        const uint32_t *apairs = (const uint32_t *)ablock;
        size_t rp = (size_t)kp, mcp = (size_t)(mc + BF_MR - 1) / BF_MR * BF_MR;
        for (int jp = 0; jp < nc; jp += BF_NR) {
          const uint32_t *bp = bf_bpanel + (size_t)(jp / BF_NR) * kp * BF_NR;
          int nr = TD_MIN(BF_NR, nc - jp);
          for (int ir = 0; ir < mc; ir += BF_MR) {
            size_t row = (size_t)(i0 + ir), col = (size_t)(j0 + jp);
            float *c = C + row * ldc + col;
            bf_store st = {c_in ? c_in + row * ld_in + col : NULL, ld_in, beta, bias ? bias + col : NULL, epilogue,
                           aux ? aux + row * ldc + col : NULL, C16 ? C16 + row * ldc + col : NULL};
            if (!trans_a)
              bf_tile(kp, apairs + (size_t)ir * rp, rp, bp, c, (size_t)ldc, TD_MIN(BF_MR, mc - ir), nr, first, last,
                      &st);
            else
              bf_tile_t(kp, apairs + ir, mcp, bp, c, (size_t)ldc, TD_MIN(BF_MR, mc - ir), nr, first, last, &st);
          }
        }
      }
    }
  }
  return 1;
}
#endif

/* The epilogue of nn_gemm_lowp_ep, as a pass over C's rows (the portable
 * path and K = 0); colsum from the f32 values of op(A), in depth order. */
static void lowp_epilogue(int M, int N, float *C, int ldc, int epilogue, float *aux) {
  for (int i = 0; i < M && epilogue != NN_GEMM_PLAIN; i++) {
    float *c = C + (size_t)i * ldc, *x = aux + (size_t)i * ldc;
    if (epilogue == NN_GEMM_GELU)
      nn_gelu_forward_cache(c, x, c, (size_t)N);
    else
      nn_gelu_backward_cached(c, x, c, (size_t)N);
  }
}

static void lowp_colsum(int trans_a, int M, int K, const float *A, int lda, float *colsum) {
  for (int i = 0; i < M; i++) {
    float s = colsum[i];
    for (int k = 0; k < K; k++) s += trans_a ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
    colsum[i] = s;
  }
}

/* Both entry points: C = beta c_in + op(A) op(B) + bias, then the epilogue
 * (c_in NULL or beta 0: not read; c_in may be C). */
/* C16 (rows ldc apart): unless NULL, the final C rounded to bf16 as well */
static void lowp_store16(int M, int N, const float *C, int ldc, uint16_t *C16) {
  for (int i = 0; i < M && C16; i++) nn_to_bf16(C16 + (size_t)i * ldc, C + (size_t)i * ldc, (size_t)N);
}

static int gemm_lowp_any(td_dtype dtype, int trans_a, int trans_b, int M, int N, int K, const float *A,
                         const uint16_t *A16, int lda, const float *B, const uint16_t *B16, int ldb, const float *c_in,
                         int ld_in, float beta, const float *bias, float *C, int ldc, uint16_t *C16, int epilogue,
                         float *aux, float *colsum) {
  if (M <= 0 || N <= 0) {
    if (M > 0 && colsum && K > 0) lowp_colsum(trans_a, M, K, A, lda, colsum);
    return 1;
  }
  if (dtype != TD_BF16 && dtype != TD_F16) return 0;
  /* the bf16 copies only where they can stand for their operand */
  if (dtype != TD_BF16 || trans_a) A16 = NULL;
  if (dtype != TD_BF16 || trans_b) B16 = NULL;
  if (c_in && beta == 0.0f) c_in = NULL;
  if (K <= 0) {
    /* an empty product: C = beta c_in + bias, then the epilogue */
    for (int i = 0; i < M; i++) {
      float *restrict c = C + (size_t)i * ldc;
      const float *in = c_in ? c_in + (size_t)i * ld_in : NULL;
      for (int j = 0; j < N; j++) c[j] = (in ? beta * in[j] : 0.0f) + (bias ? bias[j] : 0.0f);
    }
    lowp_epilogue(M, N, C, ldc, epilogue, aux);
    lowp_store16(M, N, C, ldc, C16);
    return 1;
  }
#ifdef __AVX512BF16__
  if (dtype == TD_BF16)
    return gemm_bf16_native(trans_a, trans_b, M, N, K, A, A16, lda, B, B16, ldb, c_in, (size_t)ld_in, beta, bias, C,
                            ldc, C16, epilogue, aux, colsum);
#endif
  if (c_in && c_in != C)
    for (int i = 0; i < M; i++) memcpy(C + (size_t)i * ldc, c_in + (size_t)i * ld_in, (size_t)N * sizeof(float));
  if (!gemm_lowp_rounded(dtype, trans_a, trans_b, M, N, K, A, A16, lda, B, B16, ldb, c_in ? beta : 0.0f, bias, C,
                         ldc))
    return 0;
  lowp_epilogue(M, N, C, ldc, epilogue, aux);
  lowp_store16(M, N, C, ldc, C16);
  if (colsum) lowp_colsum(trans_a, M, K, A, lda, colsum);
  return 1;
}

int nn_gemm_lowp(td_dtype dtype, int trans_a, int trans_b, int M, int N, int K, const float *A, int lda,
                 const float *B, int ldb, float beta, const float *bias, float *C, int ldc) {
  return gemm_lowp_any(dtype, trans_a, trans_b, M, N, K, A, NULL, lda, B, NULL, ldb, C, ldc, beta, bias, C, ldc, NULL,
                       NN_GEMM_PLAIN, NULL, NULL);
}

int nn_gemm_lowp_ep(td_dtype dtype, int trans_a, int trans_b, int M, int N, int K, const float *A, int lda,
                    const float *B, int ldb, const float *c_in, int ld_in, const float *bias, float *C, int ldc,
                    int epilogue, float *aux, float *colsum) {
  return gemm_lowp_any(dtype, trans_a, trans_b, M, N, K, A, NULL, lda, B, NULL, ldb, c_in, ld_in, 1.0f, bias, C, ldc,
                       NULL, epilogue, aux, colsum);
}

int nn_gemm_lowp_x(td_dtype dtype, int trans_a, int trans_b, int M, int N, int K, const float *A, const uint16_t *A16,
                   int lda, const float *B, const uint16_t *B16, int ldb, const float *c_in, int ld_in,
                   const float *bias, float *C, int ldc, uint16_t *C16, int epilogue, float *aux, float *colsum) {
  return gemm_lowp_any(dtype, trans_a, trans_b, M, N, K, A, A16, lda, B, B16, ldb, c_in, ld_in, 1.0f, bias, C, ldc,
                       C16, epilogue, aux, colsum);
}

void nn_to_bf16(uint16_t *dst, const float *src, size_t n) {
  size_t i = 0;
#ifdef __AVX512BF16__
  /* the tail through the same instruction: the packs' rounding, to the bit */
  for (; i < n; i += 16) {
    int r = (int)TD_MIN((size_t)16, n - i);
    _mm256_mask_storeu_epi16(dst + i, (__mmask16)((1u << r) - 1u), cvt16(load16(src + i, r)));
  }
#endif
  for (; i < n; i++) dst[i] = td_f32_to_bf16(src[i]);
}
