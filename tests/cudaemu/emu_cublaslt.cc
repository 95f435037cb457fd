/* CUDA emulator (tests/cudaemu): cuBLASLt's matmul subset (include/cublasLt.h)
 * as a plain loop with cuBLASLt's documented semantics. Column-major: element
 * (r, c) of a layout with leading dimension ld is at r + c ld. Checks what
 * the real library refuses: shapes that do not agree, a leading dimension
 * below the rows, mixed element types, an epilogue it does not know. */
#include <cublasLt.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_bf16.h>

struct td_emu_lt_handle {
  int magic;
};
struct td_emu_lt_desc {
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  int epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void *bias = nullptr;
  void *aux = nullptr;
  int64_t aux_ld = 0;
};
struct td_emu_lt_layout {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
};
struct td_emu_lt_pref {
  int unused;
};

/* emu_runtime.cc: whether [p, p + bytes) lies inside one device or pinned allocation */
namespace td_emu {
bool inside_allocation(const void *p, size_t bytes);
}

/* Operand (rows, cols, ld) of element type t at p: false, with a message,
 * when the elements it addresses leave its allocation (on a GPU: a fault or
 * garbage). The product below reads A and B unsanitized, so this check is
 * what ASan's was for them. */
static bool operand_inside(const char *what, const void *p, cudaDataType_t t, uint64_t rows, uint64_t cols, int64_t ld) {
  if (rows == 0 || cols == 0) return true;
  size_t bytes = ((size_t)(cols - 1) * (size_t)ld + rows) * (t == CUDA_R_16BF ? 2 : 4);
  if (td_emu::inside_allocation(p, bytes)) return true;
  fprintf(stderr, "cudaemu: cublasLtMatmul: %s (%llu x %llu, ld %lld: %zu bytes from %p) is not inside one device allocation\n",
          what, (unsigned long long)rows, (unsigned long long)cols, (long long)ld, bytes, p);
  return false;
}

/* col[i] = sum over k of op(A)(i, k) op(B)(k, j), i < m: each sum from 0 in
 * k order, as the instrumented loop before it did (no FMA at the baseline
 * -march, no reassociation without -ffast-math: the same f32 results).
 * The operands were checked against their allocations (operand_inside), so
 * this innermost loop (m n K multiply-adds a product; at -O1 with ASan, ~7%
 * of a training line's CPU on the emulator) is compiled without the
 * sanitizers and optimized. */
#if defined(__clang__) /* no per-function optimize attribute: the tree's level */
#define TD_EMU_HOT_LOOP __attribute__((noinline, no_sanitize("address", "undefined")))
#else
#define TD_EMU_HOT_LOOP __attribute__((noinline, no_sanitize("address", "undefined"), optimize("O2")))
#endif
template <class T>
TD_EMU_HOT_LOOP static void
column_product(float *__restrict col, const T *A, size_t a_row_step, size_t a_k_step, const T *b_col, size_t b_k_step,
               uint64_t m, uint64_t K) {
  for (uint64_t i = 0; i < m; i++) {
    const T *a_row = A + i * a_row_step;
    float s = 0.0f;
    for (uint64_t k = 0; k < K; k++) s += (float)a_row[k * a_k_step] * (float)b_col[k * b_k_step];
    col[i] = s;
  }
}

static float get(const void *p, cudaDataType_t t, size_t i) {
  return t == CUDA_R_16BF ? (float)((const __nv_bfloat16 *)p)[i] : ((const float *)p)[i];
}
static void put(void *p, cudaDataType_t t, size_t i, float v) {
  if (t == CUDA_R_16BF)
    ((__nv_bfloat16 *)p)[i] = __nv_bfloat16(v);
  else
    ((float *)p)[i] = v;
}

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle) {
  if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new td_emu_lt_handle{0x1717};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc, cublasComputeType_t compute, cudaDataType_t scale) {
  if (!desc || compute != CUBLAS_COMPUTE_32F || scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  *desc = new td_emu_lt_desc();
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t size) {
  if (!desc || !buf) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
  case CUBLASLT_MATMUL_DESC_TRANSA:
  case CUBLASLT_MATMUL_DESC_TRANSB: {
    if (size != sizeof(cublasOperation_t)) return CUBLAS_STATUS_INVALID_VALUE;
    cublasOperation_t op;
    memcpy(&op, buf, sizeof op);
    (attr == CUBLASLT_MATMUL_DESC_TRANSA ? desc->ta : desc->tb) = op;
    return CUBLAS_STATUS_SUCCESS;
  }
  case CUBLASLT_MATMUL_DESC_EPILOGUE: {
    if (size != sizeof(cublasLtEpilogue_t)) return CUBLAS_STATUS_INVALID_VALUE;
    cublasLtEpilogue_t e;
    memcpy(&e, buf, sizeof e);
    if (e != CUBLASLT_EPILOGUE_DEFAULT && e != CUBLASLT_EPILOGUE_BIAS && e != CUBLASLT_EPILOGUE_GELU_AUX &&
        e != CUBLASLT_EPILOGUE_GELU_AUX_BIAS && e != CUBLASLT_EPILOGUE_DGELU && e != CUBLASLT_EPILOGUE_DGELU_BGRAD &&
        e != CUBLASLT_EPILOGUE_BGRADA && e != CUBLASLT_EPILOGUE_BGRADB)
      return CUBLAS_STATUS_NOT_SUPPORTED;
    desc->epilogue = e;
    return CUBLAS_STATUS_SUCCESS;
  }
  case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
    if (size != sizeof(void *)) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(&desc->bias, buf, sizeof(void *));
    return CUBLAS_STATUS_SUCCESS;
  case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
    if (size != sizeof(void *)) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(&desc->aux, buf, sizeof(void *));
    return CUBLAS_STATUS_SUCCESS;
  case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
    if (size != sizeof(int64_t)) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(&desc->aux_ld, buf, sizeof(int64_t));
    return CUBLAS_STATUS_SUCCESS;
  }
  return CUBLAS_STATUS_NOT_SUPPORTED;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType_t type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
  if (!layout || (type != CUDA_R_32F && type != CUDA_R_16BF) || ld < (int64_t)rows || ld < 1)
    return CUBLAS_STATUS_INVALID_VALUE;
  *layout = new td_emu_lt_layout{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref) {
  if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
  *pref = new td_emu_lt_pref{0};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                    size_t size) {
  return pref && buf ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

/* the shapes agree: op(A) is (m, k), op(B) (k, n), C and D (m, n) */
static bool shapes_agree(const td_emu_lt_desc *desc, const td_emu_lt_layout *a, const td_emu_lt_layout *b,
                         const td_emu_lt_layout *c, const td_emu_lt_layout *d) {
  uint64_t m = d->rows, n = d->cols;
  uint64_t am = desc->ta == CUBLAS_OP_T ? a->cols : a->rows, ak = desc->ta == CUBLAS_OP_T ? a->rows : a->cols;
  uint64_t bk = desc->tb == CUBLAS_OP_T ? b->cols : b->rows, bn = desc->tb == CUBLAS_OP_T ? b->rows : b->cols;
  return am == m && bn == n && ak == bk && c->rows == m && c->cols == n && a->type == b->type &&
         c->type == d->type && a->type == d->type;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t *results, int *n_results) {
  if (!handle || !desc || !a || !b || !c || !d || !pref || requested < 1 || !results || !n_results)
    return CUBLAS_STATUS_INVALID_VALUE;
  *n_results = 0;
  if (!shapes_agree(desc, a, b, c, d)) return CUBLAS_STATUS_NOT_SUPPORTED;
  /* TANDEM_CUDAEMU_LT_NO_DGELU=1: no algorithm for the DGELU epilogue, as a
   * cuBLASLt without one for the shape would answer (the caller's other path) */
  const char *no_dgelu = getenv("TANDEM_CUDAEMU_LT_NO_DGELU");
  const bool is_dgelu = desc->epilogue == CUBLASLT_EPILOGUE_DGELU || desc->epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD;
  if (is_dgelu && no_dgelu && strcmp(no_dgelu, "1") == 0) return CUBLAS_STATUS_NOT_SUPPORTED;
  /* TANDEM_CUDAEMU_LT_NO_BGRAD=1: none for the bias gradient epilogues
   * (BGRADA, BGRADB, DGELU_BGRAD): the column-sum kernel's path */
  const char *no_bgrad = getenv("TANDEM_CUDAEMU_LT_NO_BGRAD");
  const bool is_bgrad = desc->epilogue == CUBLASLT_EPILOGUE_BGRADA || desc->epilogue == CUBLASLT_EPILOGUE_BGRADB ||
                        desc->epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD;
  if (is_bgrad && no_bgrad && strcmp(no_bgrad, "1") == 0) return CUBLAS_STATUS_NOT_SUPPORTED;
  memset(&results[0], 0, sizeof results[0]);
  results[0].state = CUBLAS_STATUS_SUCCESS;
  *n_results = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t a, const void *B, cublasLtMatrixLayout_t b, const void *beta,
                              const void *C, cublasLtMatrixLayout_t c, void *D, cublasLtMatrixLayout_t d,
                              const cublasLtMatmulAlgo_t *algo, void *workspace, size_t workspace_bytes,
                              cudaStream_t stream) {
  if (!handle || !desc || !alpha || !beta || !A || !B || !D || !a || !b || !c || !d || !algo)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (!shapes_agree(desc, a, b, c, d)) {
    fprintf(stderr, "cudaemu: cublasLtMatmul: shapes do not agree\n");
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  bool gelu = desc->epilogue == CUBLASLT_EPILOGUE_GELU_AUX || desc->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  bool with_bias = desc->epilogue == CUBLASLT_EPILOGUE_BIAS || desc->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  bool dgelu = desc->epilogue == CUBLASLT_EPILOGUE_DGELU || desc->epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD;
  bool bgrad_a = desc->epilogue == CUBLASLT_EPILOGUE_BGRADA, bgrad_b = desc->epilogue == CUBLASLT_EPILOGUE_BGRADB;
  bool bgrad_d = desc->epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD;
  if (((with_bias || bgrad_a || bgrad_b || bgrad_d) && !desc->bias) ||
      ((gelu || dgelu) && (!desc->aux || desc->aux_ld < (int64_t)d->rows)))
    return CUBLAS_STATUS_INVALID_VALUE;
  float al, be;
  memcpy(&al, alpha, 4);
  memcpy(&be, beta, 4);
  uint64_t m = d->rows, n = d->cols, K = desc->ta == CUBLAS_OP_T ? a->rows : a->cols;
  cudaDataType_t t = d->type;
  if (!operand_inside("A", A, a->type, a->rows, a->cols, a->ld) || !operand_inside("B", B, b->type, b->rows, b->cols, b->ld) ||
      !operand_inside("D", D, d->type, d->rows, d->cols, d->ld) ||
      (be != 0.0f && !operand_inside("C", C, c->type, c->rows, c->cols, c->ld)) ||
      (with_bias && !operand_inside("the bias", desc->bias, t, m, 1, (int64_t)(m ? m : 1))) ||
      ((gelu || dgelu) && !operand_inside("the GELU aux", desc->aux, t, m, n, desc->aux_ld)))
    return CUBLAS_STATUS_INVALID_VALUE;
  /* element (i, k) of op(A) at i a_row_step + k a_k_step; (k, j) of op(B) at
   * j b_col_step + k b_k_step */
  size_t a_row_step = desc->ta == CUBLAS_OP_T ? (size_t)a->ld : 1, a_k_step = desc->ta == CUBLAS_OP_T ? 1 : (size_t)a->ld;
  size_t b_col_step = desc->tb == CUBLAS_OP_T ? 1 : (size_t)b->ld, b_k_step = desc->tb == CUBLAS_OP_T ? (size_t)b->ld : 1;
  /* BGRADA/BGRADB: op(A)'s row sums or op(B)'s column sums over k, from the
   * operands alone, as plain sums in double written in D's type (the
   * library's Ctype rule for a bias gradient): an independent reference for
   * matmul.cu's epilogue path and its column-sum kernel */
  void *bgrad = (void *)desc->bias;
  if (bgrad_a)
    for (uint64_t i = 0; i < m; i++) {
      double s = 0.0;
      for (uint64_t k = 0; k < K; k++) s += get(A, a->type, desc->ta == CUBLAS_OP_T ? k + i * a->ld : i + k * a->ld);
      put(bgrad, t, i, (float)s);
    }
  if (bgrad_b)
    for (uint64_t j = 0; j < n; j++) {
      double s = 0.0;
      for (uint64_t k = 0; k < K; k++) s += get(B, b->type, desc->tb == CUBLAS_OP_T ? j + k * b->ld : k + j * b->ld);
      put(bgrad, t, j, (float)s);
    }
  double *row_sums = NULL; /* DGELU_BGRAD: D's row sums, before D's rounding */
  if (bgrad_d && !(row_sums = (double *)calloc(m ? m : 1, sizeof(double)))) return CUBLAS_STATUS_ALLOC_FAILED;
  /* D may be C: compute each column into a buffer before writing it */
  float *col = (float *)malloc(sizeof(float) * (m ? m : 1));
  if (!col) {
    free(row_sums);
    return CUBLAS_STATUS_ALLOC_FAILED;
  }
  for (uint64_t j = 0; j < n; j++) {
    if (a->type == CUDA_R_16BF)
      column_product(col, (const __nv_bfloat16 *)A, a_row_step, a_k_step, (const __nv_bfloat16 *)B + j * b_col_step,
                     b_k_step, m, K);
    else
      column_product(col, (const float *)A, a_row_step, a_k_step, (const float *)B + j * b_col_step, b_k_step, m, K);
    for (uint64_t i = 0; i < m; i++) {
      float v = al * col[i];
      if (be != 0.0f) v += be * get(C, c->type, i + j * c->ld);
      if (with_bias) v += get(desc->bias, t, i);
      col[i] = v;
    }
    for (uint64_t i = 0; i < m; i++) {
      float v = col[i];
      if (gelu) {
        put(desc->aux, t, i + j * desc->aux_ld, v);
        v = 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
      } else if (dgelu) { /* GELU's derivative at its input, the tanh form */
        float x = get(desc->aux, t, i + j * desc->aux_ld), c = 0.7978845608028654f;
        float th = tanhf(c * (x + 0.044715f * x * x * x));
        v *= 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * c * (1.0f + 3.0f * 0.044715f * x * x);
      }
      if (row_sums) row_sums[i] += v;
      put(D, t, i + j * d->ld, v);
    }
  }
  if (row_sums)
    for (uint64_t i = 0; i < m; i++) put(bgrad, t, i, (float)row_sums[i]);
  free(row_sums);
  free(col);
  return CUBLAS_STATUS_SUCCESS;
}

} // extern "C"
