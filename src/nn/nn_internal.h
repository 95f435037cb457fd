/* src/nn private helpers: the seeded PRNG used for parameter init and
 * sampling, a vectorizable exp, the models' init entry points, and the
 * layer variants that overwrite instead of accumulate (the models use them
 * where a gradient buffer is written for the first time, to save a memset
 * and a pass over memory). */
#ifndef TD_NN_INTERNAL_H
#define TD_NN_INTERNAL_H

#include <math.h>
#include <stdint.h>
#if defined(__AVX512F__) || defined(__AVX__)
#include <immintrin.h>
#endif

#include "base/base.h"
#include "tandem/nn.h"

/* ---- PRNG: splitmix64 (one 64-bit word of state; good enough for init and
 * sampling, and trivially seekable per tensor) ---- */
typedef struct nn_rng {
  uint64_t state;
} nn_rng;

static inline uint64_t nn_rng_next(nn_rng *rng) {
  uint64_t z = (rng->state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
/* Uniform in [0, 1) with 24 bits. */
static inline float nn_rng_uniform(nn_rng *rng) { return (float)(nn_rng_next(rng) >> 40) * (1.0f / 16777216.0f); }
/* An independent stream per (seed, stream) pair, so that a tensor's initial
 * values do not depend on which tensors were initialized before it. */
static inline nn_rng nn_rng_stream(uint64_t seed, uint64_t stream) {
  nn_rng r = {seed ^ (stream * 0xD1B54A32D192ED03ull)};
  (void)nn_rng_next(&r);
  return r;
}
/* Fill dst with normal(0, std) values (Box-Muller, pairs). */
void nn_fill_normal(float *dst, size_t n, float std, nn_rng *rng);
void nn_fill_const(float *dst, size_t n, float value);

/* ---- exp, 16 lanes at a time (nn_expf_v16 below) ----
 * Written with GCC/Clang vector extensions because the scalar form does not
 * vectorize without -ffast-math (the clamps and floor are float compares
 * that gcc will not turn into blends under IEEE semantics). Cephes' expf:
 * x = n ln2 + r with n = round(x log2 e) (the 1.5*2^23 trick, no floor),
 * a degree-5 polynomial for e^r, and 2^n built in the exponent bits.
 * Relative error ~2e-7 on [-87, 88]; inputs are clamped to that range. */
/* Everything below is static inline, so the AVX-vs-SSE argument-passing ABI
 * that -Wpsabi warns about (on builds without -mavx) never crosses a call. */
#pragma GCC diagnostic ignored "-Wpsabi"

/* ---- 16-lane vectors (one AVX-512 register; two or four elsewhere) ----
 * The hot elementwise passes (GELU, layernorm, softmax) use these: on
 * AVX-512 machines -march=native makes gcc prefer 256-bit vectors for the
 * loops it vectorizes itself, which halves their throughput next to the
 * 512-bit sgemm kernels. Masked loads and stores handle the row tails. */
typedef float nn_v16f __attribute__((vector_size(64)));
typedef int32_t nn_v16i __attribute__((vector_size(64)));
#define NN_V16(v) {v, v, v, v, v, v, v, v, v, v, v, v, v, v, v, v}

static inline nn_v16f nn_v16_select(nn_v16i mask, nn_v16f a, nn_v16f b) { /* mask ? a : b */
  return (nn_v16f)(((nn_v16i)a & mask) | ((nn_v16i)b & ~mask));
}
static inline nn_v16f nn_v16_load(const float *p) {
  nn_v16f v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
static inline void nn_v16_store(float *p, nn_v16f v) { __builtin_memcpy(p, &v, sizeof v); }
/* Load n < 16 floats, the other lanes set to fill. */
static inline nn_v16f nn_v16_load_partial(const float *p, int n, float fill) {
#ifdef __AVX512F__
  return (nn_v16f)_mm512_mask_loadu_ps(_mm512_set1_ps(fill), (__mmask16)((1u << n) - 1), p);
#else
  nn_v16f v = NN_V16(fill);
  for (int i = 0; i < n; i++) v[i] = p[i];
  return v;
#endif
}
static inline void nn_v16_store_partial(float *p, nn_v16f v, int n) {
#ifdef __AVX512F__
  _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1), (__m512)v);
#else
  for (int i = 0; i < n; i++) p[i] = v[i];
#endif
}
static inline nn_v16f nn_v16_splat(float x) {
  nn_v16f v = {x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x};
  return v;
}
/* v with the lanes from n on set to 0 */
static inline nn_v16f nn_v16_first(nn_v16f v, int n) {
  const nn_v16i lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  return nn_v16_select(lane < n, v, (nn_v16f)NN_V16(0.0f));
}
static inline float nn_v16_sum(nn_v16f v) {
  float s = 0.0f;
  for (int i = 0; i < 16; i++) s += v[i];
  return s;
}
static inline nn_v16f nn_v16_max(nn_v16f a, nn_v16f b) { return nn_v16_select(a > b, a, b); }
static inline float nn_v16_hmax(nn_v16f v) {
  float m = v[0];
  for (int i = 1; i < 16; i++) m = v[i] > m ? v[i] : m;
  return m;
}
/* 1/d: the 14-bit hardware estimate and one Newton step (~1 ulp) where
 * AVX-512 has it, a division (~3x slower in these loops) elsewhere. */
static inline nn_v16f nn_v16_recip(nn_v16f d) {
#ifdef __AVX512F__
  nn_v16f r = (nn_v16f)_mm512_rcp14_ps((__m512)d);
  return r * (2.0f - d * r);
#elif defined(__AVX__)
  /* The 12-bit estimate per 8-lane half and one Newton step (~2e-7
   * relative): the division cost the AVX2 level most of its GELU speed
   * (bench/results/cpu-levels-*.md). */
  __m256 h[2];
  __builtin_memcpy(h, &d, sizeof h);
  for (int i = 0; i < 2; i++) {
    __m256 r = _mm256_rcp_ps(h[i]);
    h[i] = _mm256_mul_ps(r, _mm256_sub_ps(_mm256_set1_ps(2.0f), _mm256_mul_ps(h[i], r)));
  }
  __builtin_memcpy(&d, h, sizeof h);
  return d;
#else
  return 1.0f / d;
#endif
}
static inline nn_v16f nn_expf_v16(nn_v16f x) { /* see "exp, 16 lanes" above */
  const nn_v16f lo = NN_V16(-87.0f), hi = NN_V16(88.0f), magic = NN_V16(12582912.0f);
#ifdef __AVX512F__
  /* vmaxps/vminps return their second operand where either is NaN, so these
   * are the selects below exactly (NaN stays NaN) in 2 instructions, not 6 */
  x = (nn_v16f)_mm512_max_ps((__m512)lo, (__m512)x);
  x = (nn_v16f)_mm512_min_ps((__m512)hi, (__m512)x);
#elif defined(__AVX__)
  (void)lo, (void)hi;
  __m256 h[2]; /* the same per 8-lane half */
  __builtin_memcpy(h, &x, sizeof h);
  for (int i = 0; i < 2; i++)
    h[i] = _mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_max_ps(_mm256_set1_ps(-87.0f), h[i]));
  __builtin_memcpy(&x, h, sizeof h);
#else
  x = nn_v16_select(x < lo, lo, x);
  x = nn_v16_select(x > hi, hi, x);
#endif
  nn_v16f shifted = x * 1.44269504088896341f + magic;
  nn_v16f fx = shifted - magic;
  nn_v16i n = (nn_v16i)shifted - 0x4B400000;
  nn_v16f r = x - fx * 0.693359375f + fx * 2.12194440e-4f;
  nn_v16f y = r * 1.9875691500e-4f + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  return y * (nn_v16f)((n + 127) << 23);
}

/* GELU (tanh approximation) on 16 lanes. With u = sqrt(2/pi) (x + 0.044715 x^3)
 * and s = sigmoid(2u) = (1 + tanh u) / 2: gelu(x) = x s and
 * gelu'(x) = s + 2 x s (1 - s) du/dx, so one exponential and one reciprocal
 * give both (layers.c; matmul.c's GEMM epilogue uses the same). */
#define NN_GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */
static inline nn_v16f nn_gelu_sigmoid_v16(nn_v16f x) {
  nn_v16f u = NN_GELU_SCALE * x * (1.0f + 0.044715f * x * x);
  return nn_v16_recip(1.0f + nn_expf_v16(-2.0f * u));
}
static inline nn_v16f nn_gelu_grad_from_s(nn_v16f x, nn_v16f s) {
  return s + 2.0f * NN_GELU_SCALE * x * s * (1.0f - s) * (1.0f + 3.0f * 0.044715f * x * x);
}

#ifdef __AVX512F__
/* The 16 x 16 block in r (row i in r[i]) transposed in registers: pairs,
 * then quads (as doubles), then 128-bit lanes twice. */
static inline void nn_transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; i++) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; i++) {
    __m512d t0 = _mm512_castps_pd(t[4 * i]), t1 = _mm512_castps_pd(t[4 * i + 1]);
    __m512d t2 = _mm512_castps_pd(t[4 * i + 2]), t3 = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
  }
  for (int i = 0; i < 4; i++) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 4; i++) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    r[i + 4] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0x88);
    r[i + 12] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0xdd);
  }
}
#endif

/* Scalar exp through the vector kernel (same values as the loops). */
static inline float nn_expf(float x) {
  nn_v16f v = NN_V16(x);
  return nn_expf_v16(v)[0];
}

/* x[i] = exp(x[i] - shift) for i < n; returns the sum (for softmax). */
float nn_exp_shift_sum(float *x, int n, float shift);

/* td_nn_set_threads's value (settings.c: one per process, not per level). */
int nn_matmul_threads(void);
/* C (M, N) = beta C + op(A) op(B) + bias, op(A) (M, K), op(B) (K, N), every
 * element of both rounded to `dtype` (TD_BF16 or TD_F16) and the products
 * accumulated in f32 (matmul_bf16.c); bias (N) may be NULL; beta 0 does not
 * read C. Returns 0, computing nothing, for another dtype or out of memory. */
int nn_gemm_lowp(td_dtype dtype, int trans_a, int trans_b, int M, int N, int K, const float *A, int lda,
                 const float *B, int ldb, float beta, const float *bias, float *C, int ldc);

/* Whether nn_gemm_lowp at `dtype` takes matmul_bf16.c's portable path at
 * the active CPU level (always for f16; for bf16 below avx512bf16): it
 * rounds both operands into per-thread f32 scratch of M K + K N floats,
 * kept for the life of the thread, which a model's memory estimate counts
 * (gpt.c's activation_bytes). */
int nn_lowp_rounds_in_scratch(td_dtype dtype);

/* nn_gemm_lowp fused with what the linear layers do around it, in the
 * store of each tile instead of passes over C: C (M, N) = op(A) op(B) +
 * [c_in (rows ld_in apart; may be C: accumulate)] + [bias], then the
 * epilogue (NN_GEMM_GELU / NN_GEMM_MUL below, aux (M, N) rows ldc apart,
 * not overlapping C); and colsum (M) += the sum over k of op(A)[i][k] (the
 * f32 values, in depth order: the bias gradient of the weight-gradient
 * product, read while op(A) is packed) unless NULL. Returns 0, computing
 * nothing, for another dtype or out of memory (colsum untouched then). */
int nn_gemm_lowp_ep(td_dtype dtype, int trans_a, int trans_b, int M, int N, int K, const float *A, int lda,
                    const float *B, int ldb, const float *c_in, int ld_in, const float *bias, float *C, int ldc,
                    int epilogue, float *aux, float *colsum);
/* nn_gemm_lowp_ep with bf16 copies (dtype TD_BF16; NULL: none): A16 / B16,
 * unless NULL, are nn_to_bf16 of A / B (same row strides lda / ldb), read
 * by the packs instead of them when op is not a transpose (A / B are then
 * still read for colsum and by the fallbacks: pass both); C16, unless NULL,
 * receives the final C (after the epilogue) rounded to bf16, rows ldc
 * apart. The result is bit-identical to nn_gemm_lowp_ep's. */
int nn_gemm_lowp_x(td_dtype dtype, int trans_a, int trans_b, int M, int N, int K, const float *A, const uint16_t *A16,
                   int lda, const float *B, const uint16_t *B16, int ldb, const float *c_in, int ld_in,
                   const float *bias, float *C, int ldc, uint16_t *C16, int epilogue, float *aux, float *colsum);
/* dst[i] = bf16(src[i]), to nearest even, rounded as this level's bf16
 * products round their operands (matmul_bf16.c). */
void nn_to_bf16(uint16_t *dst, const float *src, size_t n);

/* layers_bf16.c: layers that also write a bf16 copy of their output (out16,
 * NULL: none) for the bf16 products that read it next, and the linear
 * layers that read such a copy of their input (inp16, NULL: none). Same
 * results as the f32 layers they wrap (layers_bf16.c explains why). */
void nn_layernorm_forward16(float *out, uint16_t *out16, float *mean, float *rstd, const float *inp,
                            const float *weight, const float *bias, int N, int C);
void nn_attention_forward16(float *out, uint16_t *out16, float *att, const float *inp, int B, int T, int C, int NH);
/* out = [resid +] inp @ weight^T + bias, then, when dgelu, out = gelu(out)
 * and dgelu = gelu'(x) (td_linear_forward, nn_linear_residual_forward,
 * nn_linear_gelu_forward); out16 its copy */
void nn_linear_forward16(float *out, uint16_t *out16, float *dgelu, const float *resid, const float *inp,
                         const uint16_t *inp16, const float *weight, const float *bias, int N, int IC, int OC);
/* nn_linear_backward_set (dgelu NULL) or nn_linear_backward_set_gelu */
void nn_linear_backward16(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                          const uint16_t *inp16, const float *weight, const float *dgelu, int N, int IC, int OC);
/* nn_attention_backward_set, with the bf16 products of attention_bf16.c at
 * the bf16 compute type (where they apply) */
void nn_attention_backward16(float *dinp, float *scratch, const float *dout, const float *inp, const float *att, int B,
                             int T, int C, int NH);

/* attention_bf16.c: causal attention (td_attention_forward, and
 * td_attention_backward with dinp = beta dinp + the gradient: beta 0 or 1)
 * with its products in bf16, f32 accumulation, softmax in f32. Return 0,
 * computing nothing, where they do not apply: below the avx512bf16 level,
 * head size not a multiple of 32, out of memory (the caller then runs the
 * f32 attention). Single-threaded, per-thread scratch. */
int nn_attention_forward_bf16(float *out, float *att, const float *inp, int B, int T, int C, int NH);
int nn_attention_backward_bf16(float *dinp, float beta, const float *dout, const float *inp, const float *att, int B,
                               int T, int C, int NH);

/* The portable matmul, also used when OpenBLAS is present by the tests that
 * check it against OpenBLAS. Same contract as td_sgemm. */
void nn_sgemm_portable(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                       const float *B, int ldb, float beta, float *C, int ldc);

/* C (M, N) = A (M, K) @ op(B) + [c_in (M, N, rows ld_in apart) + bias (N)],
 * op(B) = B (K, N) or, with trans_b, B^T for B (N, K); c_in may be C itself
 * (accumulate) or NULL, bias may be NULL. The linear layers' product
 * (matmul.c explains why it is not cblas_sgemm). Returns 0, computing
 * nothing, where it does not apply (N % 32 != 0, no AVX-512, no memory,
 * td_nn_set_threads above 1: it is single-threaded): the caller then uses
 * td_sgemm. */
int nn_gemm(int trans_b, int M, int N, int K, const float *A, int lda, const float *B, int ldb, const float *c_in,
            int ld_in, const float *bias, float *C, int ldc);
/* What nn_gemm_ep does to each final value x of C (aux is (M, N), rows ldc
 * apart): NN_GEMM_GELU stores gelu(x) in C and gelu'(x) in aux (as
 * nn_gelu_forward_cache), NN_GEMM_MUL stores x * aux (as
 * nn_gelu_backward_cached). Done on the tile in registers, it saves the
 * separate pass that read the product back from memory. */
enum { NN_GEMM_PLAIN = 0, NN_GEMM_GELU = 1, NN_GEMM_MUL = 2 };
/* nn_gemm with an epilogue (above); c_in must not be C with NN_GEMM_GELU
 * or NN_GEMM_MUL. Returns 0, computing nothing, where nn_gemm would. */
int nn_gemm_ep(int trans_b, int M, int N, int K, const float *A, int lda, const float *B, int ldb, const float *c_in,
               int ld_in, const float *bias, float *C, int ldc, int epilogue, float *aux);
/* C (M, N) += A^T @ B for A (K, M), B (K, N): the weight gradient
 * (dout^T @ inp); and colsum (M) += the sum of A's K rows unless NULL (the
 * bias gradient, added row by row in order as a separate loop would).
 * Returns 0, computing nothing, where nn_gemm would. */
int nn_gemm_tn(int M, int N, int K, const float *A, int lda, const float *B, int ldb, float *C, int ldc,
               float *colsum);

/* ---- overwrite variants (beta = 0 for the first write of a gradient) ---- */
/* As td_linear_backward; dinp is overwritten (=) instead of accumulated. */
void nn_linear_backward_set(float *dinp /* (N, IC) */, float *dweight /* (OC, IC) */, float *dbias /* (OC) */,
                            const float *dout /* (N, OC) */, const float *inp /* (N, IC) */,
                            const float *weight /* (OC, IC) */, int N, int IC, int OC);
/* out = resid + inp @ weight^T + bias: a linear layer fused with the residual add. out may not alias inp. */
void nn_linear_residual_forward(float *out /* (N, OC) */, const float *resid /* (N, OC) */,
                                const float *inp /* (N, IC) */, const float *weight /* (OC, IC) */,
                                const float *bias /* (OC) */, int N, int IC, int OC);
/* out = gelu(inp @ weight^T + bias) and dgelu = gelu' of the same (the linear
 * layer and nn_gelu_forward_cache, fused where nn_gemm applies). */
void nn_linear_gelu_forward(float *out /* (N, OC) */, float *dgelu /* (N, OC) */, const float *inp /* (N, IC) */,
                            const float *weight /* (OC, IC) */, const float *bias /* (OC) */, int N, int IC, int OC);
/* nn_linear_backward_set followed by dinp *= dgelu (nn_gelu_backward_cached):
 * the input gradient of a linear layer fed by a GELU, carried back through
 * the GELU (fused where nn_gemm applies). */
void nn_linear_backward_set_gelu(float *dinp /* (N, IC) */, float *dweight /* (OC, IC) */, float *dbias /* (OC) */,
                                 const float *dout /* (N, OC) */, const float *inp /* (N, IC) */,
                                 const float *weight /* (OC, IC) */, const float *dgelu /* (N, IC) */, int N, int IC,
                                 int OC);
/* As td_gelu_backward but dinp = (overwrite); dinp may alias dout. */
void nn_gelu_backward_set(float *dinp /* (n) */, const float *inp /* (n) */, const float *dout /* (n) */, size_t n);
/* out = gelu(inp) and dgelu = gelu'(inp) (the derivative, for nn_gelu_backward_cached);
 * dgelu may alias inp. */
void nn_gelu_forward_cache(float *out /* (n) */, float *dgelu /* (n) */, const float *inp /* (n) */, size_t n);
/* dinp = dgelu * dout (overwrite); dinp may alias dout. */
void nn_gelu_backward_cached(float *dinp /* (n) */, const float *dgelu /* (n) */, const float *dout /* (n) */,
                             size_t n);
/* As td_attention_backward but dinp is overwritten. */
void nn_attention_backward_set(float *dinp /* (B, T, 3C) */, float *scratch /* (T, T) */,
                               const float *dout /* (B, T, C) */, const float *inp /* (B, T, 3C) */,
                               const float *att /* (B, NH, T, T) */, int B, int T, int C, int NH);
/* As td_softmax_xent_backward but dlogits is overwritten. */
void nn_softmax_xent_backward_set(float *dlogits /* (N, V) */, const float *probs /* (N, V) */,
                                  const int32_t *targets /* (N) */, float dloss, int N, int V);

/* The attention's sgemm formulation (any head size): td_attention_* use it
 * where the head size is not a multiple of 16, and the tests compare the
 * register-tiled version against it. beta = 0 overwrites dinp, 1 accumulates. */
void nn_attention_forward_blas(float *out /* (B, T, C) */, float *att /* (B, NH, T, T) */,
                               const float *inp /* (B, T, 3C) */, int B, int T, int C, int NH);
void nn_attention_backward_blas(float *dinp /* (B, T, 3C) */, float beta, float *scratch /* (T, T) */,
                                const float *dout /* (B, T, C) */, const float *inp /* (B, T, 3C) */,
                                const float *att /* (B, NH, T, T) */, int B, int T, int C, int NH);

/* ---- models ---- */
/* The GPT's config, and a slot for its device twin's state (gpt_cuda.c),
 * which keeps the CPU model's tensor table, config text and initializer and
 * replaces its ops. nn_gpt_free_host frees the CPU side (what the CPU
 * destroy frees), for the device twin's destroy. */
const td_gpt_config *nn_gpt_config(const td_model *model);
void **nn_gpt_device_state(td_model *model);
void nn_gpt_free_host(td_model *model);
/* Where a GPT's (or a pipeline stage's, td_gpt_stage_create) tensors are in
 * its table, for the device twin: blocks idx_layer0 + l * 12 + which for its
 * n_layers blocks (l local); -1 for what the stage does not hold. idx_head is
 * the head's weight: wte's index when tied. A stage without the head has
 * idx_lnfw = idx_lnfb = n_tensors (the table's end sentinel). */
typedef struct nn_gpt_layout {
  int n_layers, has_embed, has_head;
  int idx_wte, idx_wpe, idx_layer0, idx_lnfw, idx_lnfb, idx_head;
} nn_gpt_layout;
void nn_gpt_layout_of(const td_model *model, nn_gpt_layout *out);
/* td_gpt_stage_set_output_grad's pointer (NULL: none set) */
const float *nn_gpt_stage_dout(const td_model *model);
/* td_gpt_stage_output / td_gpt_stage_input_grad of a CPU stage (model.c
 * dispatches; NULL for a device stage) */
const float *nn_gpt_stage_output(const td_model *model);
const float *nn_gpt_stage_input_grad(const td_model *model);
#ifdef TD_HAVE_CUDA
/* td_gpt_stage_output / td_gpt_stage_input_grad of a stage on a device: host
 * (pinned) copies made by its forward / backward */
const float *nn_gpt_cuda_stage_output(const td_model *model);
const float *nn_gpt_cuda_stage_input_grad(const td_model *model);
/* src/nn/cuda/gpt_cuda.c: turn a CPU GPT from td_gpt_create into its twin
 * on CUDA device dev (already opened); on failure the model is unchanged. */
td_status nn_gpt_cuda_attach(td_model *model, td_device dev);
/* td_gpt_set_tensor_split on such a model */
td_status nn_gpt_cuda_set_tensor_split(td_model *model, const td_gpt_tensor_split *split);
/* td_gpt_set_device_dtype on such a model */
td_status nn_gpt_cuda_set_dtype(td_model *model, td_dtype dtype);
#endif
void nn_gpt_init_params(const td_model *model, float *params, uint64_t seed);
void nn_gpt_init_params_range(const td_model *model, float *dst, uint64_t seed, size_t lo, size_t hi);
void nn_cnn_init_params(const td_model *model, float *params, uint64_t seed);

/* The blocking of the single-threaded f32 products (matmul.c), here so
 * that td_linear_scratch_bytes (settings.c) bounds the panels they keep
 * from the same numbers. */
#define NN_GEMM_MR 12  /* rows of C per tile */
#define NN_GEMM_KC 256 /* depth per packed block */
#define NN_GEMM_NC 256 /* columns per packed block */

#endif
