/* Optimizer kernels over flat arena ranges, gradient norm and clipping.
 * One pass each, written for the compiler to vectorize; they run once per
 * step over the whole arena, so they are memory-bound and need no threads at
 * the model sizes trained here. */
#include "train/train_impl.h"

#include <math.h>

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

void td_adamw_update(float *restrict params, const float *restrict grads, float *restrict m, float *restrict v,
                     size_t n, float lr, float beta1, float beta2, float eps, float weight_decay, long t,
                     float grad_scale) {
  /* Adam with bias correction and decoupled weight decay (PyTorch's AdamW,
   * llm.c's adamw kernel): p -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * p). */
  float c1 = 1.0f - powf(beta1, (float)t);
  float c2 = 1.0f - powf(beta2, (float)t);
  for (size_t i = 0; i < n; i++) {
    float g = grads[i] * grad_scale;
    float mi = beta1 * m[i] + (1.0f - beta1) * g;
    float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    float m_hat = mi / c1;
    float v_hat = vi / c2;
    params[i] -= lr * (m_hat / (sqrtf(v_hat) + eps) + weight_decay * params[i]);
  }
}

double td_l2_norm(const float *x, size_t n) {
  /* Four double accumulators: exact enough for any arena size and still
   * vectorizable. */
  double acc[4] = {0, 0, 0, 0};
  size_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int k = 0; k < 4; k++) acc[k] += (double)x[i + k] * (double)x[i + k];
  for (; i < n; i++) acc[0] += (double)x[i] * (double)x[i];
  return sqrt((acc[0] + acc[1]) + (acc[2] + acc[3]));
}

float td_clip_scale(double norm, float max_norm) {
  /* PyTorch's clip_grad_norm_: scale by max/(norm + 1e-6) when above max. */
  if (max_norm <= 0 || !(norm > max_norm)) return 1.0f;
  return (float)(max_norm / (norm + 1e-6));
}

int td_optimizer_n_states(td_optimizer_kind kind) { return kind == TD_OPTIMIZER_ADAMW ? 2 : 1; }

const char *td_optimizer_name(td_optimizer_kind kind) { return kind == TD_OPTIMIZER_ADAMW ? "adamw" : "sgd"; }
