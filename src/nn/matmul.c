/* The one matrix product every layer uses: row-major sgemm.
 *
 * With OpenBLAS (TD_HAVE_OPENBLAS) this is cblas_sgemm. Without it, a
 * portable loop nest: op(B) is packed block by block (KC x NC floats, kept
 * in L2) into a contiguous panel, and each row of C is updated four rows at
 * a time with contiguous, restrict-qualified inner loops over N that the
 * compiler vectorizes. It reaches a fraction of OpenBLAS's speed (no
 * register tiling in assembly) but has no dependency. */
#include "nn_internal.h"

#include <stdlib.h>
#include <string.h>

#ifdef TD_HAVE_OPENBLAS
#include <cblas.h>
#endif

void td_nn_set_threads(int n_threads) {
#ifdef TD_HAVE_OPENBLAS
  openblas_set_num_threads(n_threads < 1 ? 1 : n_threads);
#else
  (void)n_threads;
#endif
}

const char *td_nn_matmul_backend(void) {
#ifdef TD_HAVE_OPENBLAS
  return "openblas";
#else
  return "portable";
#endif
}

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
