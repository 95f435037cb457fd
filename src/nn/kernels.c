/* The public names of the src/nn kernels (nn_kernels.h): each forwards to
 * the kernel of the CPU level td_cpu_active() chose, through that level's
 * table. Compiled once, for the baseline CPU; the table is picked on the
 * first call (td_cpu_active reads TANDEM_CPU and cpuid once per process).
 * Every forwarder is one indirect call: the kernels it reaches each work on
 * whole tensors, so it costs nothing measurable. Above the level kernels
 * (kernels_level.c's tables); their settings are below both (settings.c). */
#include "nn_kernels.h"

static const nn_kernels *const level_tables[TD_CPU_LEVELS] = {&nn_kernels_generic, &nn_kernels_avx2,
                                                              &nn_kernels_avx512, &nn_kernels_avx512bf16};
static const nn_kernels *active_table; /* NULL until the first call */

const nn_kernels *nn_kernels_for(td_cpu_level level) {
  return (unsigned)level < TD_CPU_LEVELS ? level_tables[level] : level_tables[TD_CPU_GENERIC];
}

td_status nn_kernels_use(td_cpu_level level) {
  if ((unsigned)level >= TD_CPU_LEVELS || level > td_cpu_supported())
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "nn_kernels_use(%d): level %s is not supported by this CPU "
                    "(highest: %s)",
                    (int)level, td_cpu_level_name(level), td_cpu_level_name(td_cpu_supported()));
  __atomic_store_n(&active_table, level_tables[level], __ATOMIC_RELEASE);
  return TD_OK;
}

static inline const nn_kernels *kern(void) {
  const nn_kernels *k = __atomic_load_n(&active_table, __ATOMIC_ACQUIRE);
  if (__builtin_expect(k == NULL, 0)) {
    /* racing first calls all store the same table */
    k = level_tables[td_cpu_active()];
    __atomic_store_n(&active_table, k, __ATOMIC_RELEASE);
  }
  return k;
}

void td_sgemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
              int ldb, float beta, float *C, int ldc) {
  kern()->k_td_sgemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void nn_sgemm_portable(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                       const float *B, int ldb, float beta, float *C, int ldc) {
  kern()->k_nn_sgemm_portable(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

int nn_gemm(int trans_b, int M, int N, int K, const float *A, int lda, const float *B, int ldb, const float *c_in,
            int ld_in, const float *bias, float *C, int ldc) {
  return kern()->k_nn_gemm(trans_b, M, N, K, A, lda, B, ldb, c_in, ld_in, bias, C, ldc);
}

int nn_gemm_ep(int trans_b, int M, int N, int K, const float *A, int lda, const float *B, int ldb, const float *c_in,
               int ld_in, const float *bias, float *C, int ldc, int epilogue, float *aux) {
  return kern()->k_nn_gemm_ep(trans_b, M, N, K, A, lda, B, ldb, c_in, ld_in, bias, C, ldc, epilogue, aux);
}

int nn_gemm_tn(int M, int N, int K, const float *A, int lda, const float *B, int ldb, float *C, int ldc,
               float *colsum) {
  return kern()->k_nn_gemm_tn(M, N, K, A, lda, B, ldb, C, ldc, colsum);
}

int nn_lowp_rounds_in_scratch(td_dtype dtype) {
  return dtype == TD_F16 || (dtype == TD_BF16 && kern() != level_tables[TD_CPU_AVX512BF16]);
}

/* The portable half-precision product rounds both operands into f32
 * scratch, M K + K N floats, kept by the thread at its largest: a linear
 * layer of `in` to `out` features on `rows` rows multiplies (rows, in)
 * (in, out) forward, (rows, out) (out, in) for the input's gradient and
 * (out, rows) (rows, in) for the weight's. */
size_t td_nn_lowp_scratch_bytes(td_dtype compute, size_t rows, size_t in, size_t out) {
  if (!nn_lowp_rounds_in_scratch(compute)) return 0;
  size_t floats = TD_MAX(TD_MAX(rows * in + in * out, rows * out + out * in), out * rows + rows * in);
  return floats * sizeof(float);
}

int nn_gemm_lowp(td_dtype dtype, int trans_a, int trans_b, int M, int N, int K, const float *A, int lda,
                 const float *B, int ldb, float beta, const float *bias, float *C, int ldc) {
  return kern()->k_nn_gemm_lowp(dtype, trans_a, trans_b, M, N, K, A, lda, B, ldb, beta, bias, C, ldc);
}

int nn_gemm_lowp_ep(td_dtype dtype, int trans_a, int trans_b, int M, int N, int K, const float *A, int lda,
                    const float *B, int ldb, const float *c_in, int ld_in, const float *bias, float *C, int ldc,
                    int epilogue, float *aux, float *colsum) {
  return kern()->k_nn_gemm_lowp_ep(dtype, trans_a, trans_b, M, N, K, A, lda, B, ldb, c_in, ld_in, bias, C, ldc,
                                   epilogue, aux, colsum);
}

int nn_gemm_lowp_x(td_dtype dtype, int trans_a, int trans_b, int M, int N, int K, const float *A, const uint16_t *A16,
                   int lda, const float *B, const uint16_t *B16, int ldb, const float *c_in, int ld_in,
                   const float *bias, float *C, int ldc, uint16_t *C16, int epilogue, float *aux, float *colsum) {
  return kern()->k_nn_gemm_lowp_x(dtype, trans_a, trans_b, M, N, K, A, A16, lda, B, B16, ldb, c_in, ld_in, bias, C, ldc,
                                  C16, epilogue, aux, colsum);
}

void nn_to_bf16(uint16_t *dst, const float *src, size_t n) { kern()->k_nn_to_bf16(dst, src, n); }

void nn_layernorm_forward16(float *out, uint16_t *out16, float *mean, float *rstd, const float *inp,
                            const float *weight, const float *bias, int N, int C) {
  kern()->k_nn_layernorm_forward16(out, out16, mean, rstd, inp, weight, bias, N, C);
}

void nn_attention_forward16(float *out, uint16_t *out16, float *att, const float *inp, int B, int T, int C, int NH) {
  kern()->k_nn_attention_forward16(out, out16, att, inp, B, T, C, NH);
}

void nn_linear_forward16(float *out, uint16_t *out16, float *dgelu, const float *resid, const float *inp,
                         const uint16_t *inp16, const float *weight, const float *bias, int N, int IC, int OC) {
  kern()->k_nn_linear_forward16(out, out16, dgelu, resid, inp, inp16, weight, bias, N, IC, OC);
}

void nn_attention_backward16(float *dinp, float *scratch, const float *dout, const float *inp, const float *att, int B,
                             int T, int C, int NH) {
  kern()->k_nn_attention_backward16(dinp, scratch, dout, inp, att, B, T, C, NH);
}

int nn_attention_forward_bf16(float *out, float *att, const float *inp, int B, int T, int C, int NH) {
  return kern()->k_nn_attention_forward_bf16(out, att, inp, B, T, C, NH);
}

int nn_attention_backward_bf16(float *dinp, float beta, const float *dout, const float *inp, const float *att, int B,
                               int T, int C, int NH) {
  return kern()->k_nn_attention_backward_bf16(dinp, beta, dout, inp, att, B, T, C, NH);
}

void nn_linear_backward16(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                          const uint16_t *inp16, const float *weight, const float *dgelu, int N, int IC, int OC) {
  kern()->k_nn_linear_backward16(dinp, dweight, dbias, dout, inp, inp16, weight, dgelu, N, IC, OC);
}

void td_linear_forward(float *out, const float *inp, const float *weight, const float *bias, int N, int IC, int OC) {
  kern()->k_td_linear_forward(out, inp, weight, bias, N, IC, OC);
}

void nn_linear_residual_forward(float *out, const float *resid, const float *inp, const float *weight,
                                const float *bias, int N, int IC, int OC) {
  kern()->k_nn_linear_residual_forward(out, resid, inp, weight, bias, N, IC, OC);
}

void nn_linear_gelu_forward(float *out, float *dgelu, const float *inp, const float *weight, const float *bias, int N,
                            int IC, int OC) {
  kern()->k_nn_linear_gelu_forward(out, dgelu, inp, weight, bias, N, IC, OC);
}

void td_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                        const float *weight, int N, int IC, int OC) {
  kern()->k_td_linear_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
}

void nn_linear_backward_set(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *weight, int N, int IC, int OC) {
  kern()->k_nn_linear_backward_set(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
}

void nn_linear_backward_set_gelu(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                                 const float *weight, const float *dgelu, int N, int IC, int OC) {
  kern()->k_nn_linear_backward_set_gelu(dinp, dweight, dbias, dout, inp, weight, dgelu, N, IC, OC);
}

void td_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe, int B, int T, int C) {
  kern()->k_td_embedding_forward(out, tokens, wte, wpe, B, T, C);
}

void td_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens, int B, int T, int C) {
  kern()->k_td_embedding_backward(dwte, dwpe, dout, tokens, B, T, C);
}

void td_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                          const float *bias, int N, int C) {
  kern()->k_td_layernorm_forward(out, mean, rstd, inp, weight, bias, N, C);
}

void td_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                           const float *weight, const float *mean, const float *rstd, int N, int C) {
  kern()->k_td_layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
}

void td_gelu_forward(float *out, const float *inp, size_t n) { kern()->k_td_gelu_forward(out, inp, n); }

void nn_gelu_forward_cache(float *out, float *dgelu, const float *inp, size_t n) {
  kern()->k_nn_gelu_forward_cache(out, dgelu, inp, n);
}

void nn_gelu_backward_cached(float *dinp, const float *dgelu, const float *dout, size_t n) {
  kern()->k_nn_gelu_backward_cached(dinp, dgelu, dout, n);
}

void td_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
  kern()->k_td_gelu_backward(dinp, inp, dout, n);
}

void nn_gelu_backward_set(float *dinp, const float *inp, const float *dout, size_t n) {
  kern()->k_nn_gelu_backward_set(dinp, inp, dout, n);
}

float nn_exp_shift_sum(float *x, int n, float shift) { return kern()->k_nn_exp_shift_sum(x, n, shift); }

void td_relu_forward(float *out, const float *inp, size_t n) { kern()->k_td_relu_forward(out, inp, n); }

void td_relu_backward(float *dinp, const float *out, const float *dout, size_t n) {
  kern()->k_td_relu_backward(dinp, out, dout, n);
}

void nn_attention_forward_blas(float *out, float *att, const float *inp, int B, int T, int C, int NH) {
  kern()->k_nn_attention_forward_blas(out, att, inp, B, T, C, NH);
}

void nn_attention_backward_blas(float *dinp, float beta, float *scratch, const float *dout, const float *inp,
                                const float *att, int B, int T, int C, int NH) {
  kern()->k_nn_attention_backward_blas(dinp, beta, scratch, dout, inp, att, B, T, C, NH);
}

void td_attention_forward(float *out, float *att, const float *inp, int B, int T, int C, int NH) {
  kern()->k_td_attention_forward(out, att, inp, B, T, C, NH);
}

void td_attention_backward(float *dinp, float *scratch, const float *dout, const float *inp, const float *att, int B,
                           int T, int C, int NH) {
  kern()->k_td_attention_backward(dinp, scratch, dout, inp, att, B, T, C, NH);
}

void nn_attention_backward_set(float *dinp, float *scratch, const float *dout, const float *inp, const float *att,
                               int B, int T, int C, int NH) {
  kern()->k_nn_attention_backward_set(dinp, scratch, dout, inp, att, B, T, C, NH);
}

void td_conv2d_forward(float *out, float *scratch, const float *inp, const float *weight, const float *bias, int B,
                       int IC, int OC, int H, int W, int K, int pad) {
  kern()->k_td_conv2d_forward(out, scratch, inp, weight, bias, B, IC, OC, H, W, K, pad);
}

void td_conv2d_backward(float *dinp, float *dweight, float *dbias, float *scratch, const float *dout, const float *inp,
                        const float *weight, int B, int IC, int OC, int H, int W, int K, int pad) {
  kern()->k_td_conv2d_backward(dinp, dweight, dbias, scratch, dout, inp, weight, B, IC, OC, H, W, K, pad);
}

void td_maxpool2_forward(float *out, int32_t *argmax, const float *inp, int B, int C, int H, int W) {
  kern()->k_td_maxpool2_forward(out, argmax, inp, B, C, H, W);
}

void td_maxpool2_backward(float *dinp, const float *dout, const int32_t *argmax, int B, int C, int H, int W) {
  kern()->k_td_maxpool2_backward(dinp, dout, argmax, B, C, H, W);
}

float td_softmax_xent_forward(float *probs, const float *logits, const int32_t *targets, int N, int V) {
  return kern()->k_td_softmax_xent_forward(probs, logits, targets, N, V);
}

void td_softmax_xent_backward(float *dlogits, const float *probs, const int32_t *targets, float dloss, int N, int V) {
  kern()->k_td_softmax_xent_backward(dlogits, probs, targets, dloss, N, V);
}

void nn_softmax_xent_backward_set(float *dlogits, const float *probs, const int32_t *targets, float dloss, int N,
                                  int V) {
  kern()->k_nn_softmax_xent_backward_set(dlogits, probs, targets, dloss, N, V);
}
