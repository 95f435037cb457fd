/* The parameter initializers the models share (gpt.c, cnn.c), below them
 * and below model.c's dispatch. Compiled once, for the baseline CPU (not a
 * per-level kernel file), so that initial parameters never depend on the
 * CPU. */
#include "nn_internal.h"

void nn_fill_normal(float *dst, size_t n, float std, nn_rng *rng) {
  for (size_t i = 0; i < n; i += 2) {
    /* Box-Muller; u1 in (0, 1] so that log is finite */
    float u1 = 1.0f - nn_rng_uniform(rng);
    float u2 = nn_rng_uniform(rng);
    float r = sqrtf(-2.0f * logf(u1));
    dst[i] = std * r * cosf(6.28318530717958648f * u2);
    if (i + 1 < n) dst[i + 1] = std * r * sinf(6.28318530717958648f * u2);
  }
}

void nn_fill_const(float *dst, size_t n, float value) {
  for (size_t i = 0; i < n; i++) dst[i] = value;
}
