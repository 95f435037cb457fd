/* Optimizer kernels over flat arena ranges, gradient norm and clipping.
 * One pass each, written for the compiler to vectorize; they run once per
 * step over the whole arena, so they are memory-bound and need no threads at
 * the model sizes trained here. */
#include "train/core/core.h"

#include <math.h>
#if defined(__AVX__) || defined(__SSE2__)
#include <immintrin.h>
#endif

void td_sgd_update(float *restrict params, const float *restrict grads, float *restrict momentum_buf, size_t n,
                   float lr, float momentum, float weight_decay, int nesterov, float grad_scale) {
  /* PyTorch's SGD: g += wd*p; buf = momentum*buf + g; step = nesterov ? g + momentum*buf : buf.
   * A zero-initialized buffer makes the first step buf = g, as in PyTorch. */
  for (size_t i = 0; i < n; i++) {
    float g = grads[i] * grad_scale + weight_decay * params[i];
    float d = g;
    if (momentum != 0.0f) {
      float b = momentum * momentum_buf[i] + g;
      momentum_buf[i] = b;
      d = nesterov ? g + momentum * b : b;
    }
    params[i] -= lr * d;
  }
}

/* sqrtf over a block. Without -fno-math-errno (the library keeps libm's
 * errno semantics) GCC will not vectorize a loop calling sqrtf, which made
 * AdamW run at a third of memory speed; the hardware square root is
 * correctly rounded either way, so results do not depend on which path runs. */
static void sqrt_block(float *restrict x, size_t n) {
  size_t i = 0;
#ifdef __AVX__
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_sqrt_ps(_mm256_loadu_ps(x + i)));
#elif defined(__SSE2__)
  for (; i + 4 <= n; i += 4) _mm_storeu_ps(x + i, _mm_sqrt_ps(_mm_loadu_ps(x + i)));
#endif
  for (; i < n; i++) x[i] = sqrtf(x[i]);
}

void td_adamw_update(float *restrict params, const float *restrict grads, float *restrict m, float *restrict v,
                     size_t n, float lr, float beta1, float beta2, float eps, float weight_decay, long t,
                     float grad_scale) {
  /* Adam with bias correction and decoupled weight decay (PyTorch's AdamW,
   * llm.c's adamw kernel): p -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * p).
   * Blocks of 512 keep the square roots in L1 between the passes. */
  float c1 = 1.0f - powf(beta1, (float)t);
  float c2 = 1.0f - powf(beta2, (float)t);
  /* Reciprocals of the bias corrections: two of the three divisions per
   * element were the compute bound of this otherwise memory-bound pass
   * (3.3M parameters, warm caches: 2.5 -> 2.2 ms; the rest is memory traffic). */
  float inv_c1 = 1.0f / c1, inv_c2 = 1.0f / c2;
  float denom[512];
  for (size_t i0 = 0; i0 < n; i0 += 512) {
    size_t len = TD_MIN((size_t)512, n - i0);
    float *restrict pp = params + i0, *restrict mm = m + i0, *restrict vv = v + i0;
    const float *restrict gg = grads + i0;
    for (size_t i = 0; i < len; i++) {
      float g = gg[i] * grad_scale;
      float mi = beta1 * mm[i] + (1.0f - beta1) * g;
      float vi = beta2 * vv[i] + (1.0f - beta2) * g * g;
      mm[i] = mi;
      vv[i] = vi;
      denom[i] = vi * inv_c2;
    }
    sqrt_block(denom, len);
    for (size_t i = 0; i < len; i++) {
      float m_hat = mm[i] * inv_c1;
      pp[i] -= lr * (m_hat / (denom[i] + eps) + weight_decay * pp[i]);
    }
  }
}

double td_sum_squares(const float *x, size_t n) {
  /* Squares summed in float over blocks of 1024 (16 lanes, which gcc
   * vectorizes; the relative error of a block sum is ~1e-7), the blocks in
   * double: exact enough for any arena size. Converting every element to
   * double made this pass compute-bound (3.3M floats: 0.85 ms). */
  double total = 0;
  for (size_t i0 = 0; i0 < n; i0 += 1024) {
    size_t len = TD_MIN((size_t)1024, n - i0);
    const float *restrict xb = x + i0;
    float acc[16] = {0};
    size_t i = 0;
    for (; i + 16 <= len; i += 16)
      for (int k = 0; k < 16; k++) acc[k] += xb[i + k] * xb[i + k];
    float block = 0.0f;
    for (; i < len; i++) block += xb[i] * xb[i];
    for (int k = 0; k < 16; k++) block += acc[k];
    total += block;
  }
  return total;
}

double td_l2_norm(const float *x, size_t n) { return sqrt(td_sum_squares(x, n)); }

float td_clip_scale(double norm, float max_norm) {
  /* PyTorch's clip_grad_norm_: scale by max/(norm + 1e-6) when above max. */
  if (max_norm <= 0 || !(norm > max_norm)) return 1.0f;
  return (float)(max_norm / (norm + 1e-6));
}

int td_optimizer_n_states(td_optimizer_kind kind) { return kind == TD_OPTIMIZER_ADAMW ? 2 : 1; }

const char *td_optimizer_name(td_optimizer_kind kind) { return kind == TD_OPTIMIZER_ADAMW ? "adamw" : "sgd"; }
