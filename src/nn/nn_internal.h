/* src/nn private helpers: the seeded PRNG used for parameter init and
 * sampling, a vectorizable exp, the models' init entry points, and the
 * layer variants that overwrite instead of accumulate (the models use them
 * where a gradient buffer is written for the first time, to save a memset
 * and a pass over memory). */
#ifndef TD_NN_INTERNAL_H
#define TD_NN_INTERNAL_H

#include <math.h>
#include <stdint.h>

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

/* exp(x) for x in roughly [-87, 88], relative error ~2e-7, written so that
 * loops calling it vectorize (no calls, no branches): Cephes' expf. */
static inline float nn_expf(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  float fx = floorf(x * 1.44269504088896341f + 0.5f);
  float r = x - fx * 0.693359375f + fx * 2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  int32_t bits = ((int32_t)fx + 127) << 23;
  float scale;
  __builtin_memcpy(&scale, &bits, sizeof scale);
  return y * scale;
}
/* tanh via exp; absolute error ~1e-7. */
static inline float nn_tanhf(float x) { return 1.0f - 2.0f / (nn_expf(2.0f * x) + 1.0f); }

/* The portable matmul, also used when OpenBLAS is present by the tests that
 * check it against OpenBLAS. Same contract as td_sgemm. */
void nn_sgemm_portable(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                       const float *B, int ldb, float beta, float *C, int ldc);

/* ---- overwrite variants (beta = 0 for the first write of a gradient) ---- */
/* As td_linear_backward; dinp is overwritten (=) instead of accumulated. */
void nn_linear_backward_set(float *dinp /* (N, IC) */, float *dweight /* (OC, IC) */, float *dbias /* (OC) */,
                            const float *dout /* (N, OC) */, const float *inp /* (N, IC) */,
                            const float *weight /* (OC, IC) */, int N, int IC, int OC);
/* out = resid + inp @ weight^T + bias: a linear layer fused with the residual add. out may not alias inp. */
void nn_linear_residual_forward(float *out /* (N, OC) */, const float *resid /* (N, OC) */,
                                const float *inp /* (N, IC) */, const float *weight /* (OC, IC) */,
                                const float *bias /* (OC) */, int N, int IC, int OC);
/* As td_gelu_backward but dinp = (overwrite); dinp may alias dout. */
void nn_gelu_backward_set(float *dinp /* (n) */, const float *inp /* (n) */, const float *dout /* (n) */, size_t n);
/* As td_attention_backward but dinp is overwritten. */
void nn_attention_backward_set(float *dinp /* (B, T, 3C) */, float *scratch /* (T, T) */,
                               const float *dout /* (B, T, C) */, const float *inp /* (B, T, 3C) */,
                               const float *att /* (B, NH, T, T) */, int B, int T, int C, int NH);
/* As td_softmax_xent_backward but dlogits is overwritten. */
void nn_softmax_xent_backward_set(float *dlogits /* (N, V) */, const float *probs /* (N, V) */,
                                  const int32_t *targets /* (N) */, float dloss, int N, int V);

/* ---- models ---- */
void nn_gpt_init_params(const td_model *model, float *params, uint64_t seed);
void nn_cnn_init_params(const td_model *model, float *params, uint64_t seed);

#endif
