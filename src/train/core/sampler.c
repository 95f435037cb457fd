/* The distributed sampler: a seeded shuffle per epoch, addressed by a global
 * stream position so that which samples a step uses depends on neither the
 * world size nor the micro-batch (see core/core.h). Regenerating a
 * permutation costs O(n) once per epoch. */
#include "train/core/core.h"

#include <string.h>

td_status td_sampler_init(td_sampler *s, size_t n_samples, uint64_t seed) {
  memset(s, 0, sizeof *s);
  if (n_samples == 0) return td_error(TD_ERR_INVALID_ARGUMENT, "the dataset has no samples");
  s->n_samples = n_samples;
  s->seed = seed;
  s->epoch = UINT64_MAX;
  s->perm = td_alloc(n_samples * sizeof *s->perm);
  if (!s->perm) return td_error(TD_ERR_SYSTEM, "out of memory for a %zu-sample shuffle", n_samples);
  return TD_OK;
}

void td_sampler_free(td_sampler *s) {
  td_free(s->perm);
  s->perm = NULL;
}

/* Uniform in [0, bound) without modulo bias (rejection on the 64-bit draw). */
static uint64_t bounded(uint64_t *state, uint64_t bound) {
  uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  uint64_t x;
  do x = td_splitmix64(state);
  while (x >= limit);
  return x % bound;
}

static void shuffle_epoch(td_sampler *s, uint64_t epoch) {
  uint64_t state = s->seed * 0x9E3779B97F4A7C15ull ^ (epoch + 1) * 0xD1B54A32D192ED03ull;
  for (size_t i = 0; i < s->n_samples; i++) s->perm[i] = i;
  for (size_t i = s->n_samples - 1; i > 0; i--) {
    size_t j = (size_t)bounded(&state, (uint64_t)i + 1);
    size_t tmp = s->perm[i];
    s->perm[i] = s->perm[j];
    s->perm[j] = tmp;
  }
  s->epoch = epoch;
}

size_t td_sampler_index(td_sampler *s, uint64_t position) {
  uint64_t epoch = position / s->n_samples;
  if (epoch != s->epoch) shuffle_epoch(s, epoch);
  return s->perm[position % s->n_samples];
}
