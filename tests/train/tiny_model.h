/* A tiny model and dataset for the training-engine tests, independent of
 * src/nn: a 2-layer MLP classifier, x (D) -> relu(W1 x + b1) (H) -> W2 h + b2
 * (K) -> softmax cross-entropy, on a synthetic, deterministic dataset. Its
 * four tensors report gradient readiness in reverse arena order (b2, W2, b1,
 * W1), as a real model does. */
#ifndef TD_TEST_TINY_MODEL_H
#define TD_TEST_TINY_MODEL_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tandem/nn.h"

#define TINY_D 16
#define TINY_H 32
#define TINY_K 5

typedef struct tiny_model {
  td_model base;
  td_param_tensor tensors[4];
  int batch;
  float *x;     /* (B, D) */
  int32_t *y;   /* (B) */
  float *h;     /* (B, H) after relu */
  float *probs; /* (B, K) */
} tiny_model;

enum { TINY_W1 = 0, TINY_B1 = TINY_D * TINY_H, TINY_W2 = TINY_B1 + TINY_H, TINY_B2 = TINY_W2 + TINY_H * TINY_K,
       TINY_N = TINY_B2 + TINY_K };

static td_status tiny_prepare(td_model *m, int batch) {
  tiny_model *t = (tiny_model *)m;
  free(t->x), free(t->y), free(t->h), free(t->probs);
  t->batch = batch;
  t->x = malloc(sizeof(float) * (size_t)batch * TINY_D);
  t->y = malloc(sizeof(int32_t) * (size_t)batch);
  t->h = malloc(sizeof(float) * (size_t)batch * TINY_H);
  t->probs = malloc(sizeof(float) * (size_t)batch * TINY_K);
  return (t->x && t->y && t->h && t->probs) ? TD_OK : TD_ERR_SYSTEM;
}

static float tiny_forward(td_model *m, const float *p, const void *inputs, const int32_t *targets, int B) {
  tiny_model *t = (tiny_model *)m;
  memcpy(t->x, inputs, sizeof(float) * (size_t)B * TINY_D);
  memcpy(t->y, targets, sizeof(int32_t) * (size_t)B);
  double loss = 0;
  for (int b = 0; b < B; b++) {
    const float *x = t->x + b * TINY_D;
    float *h = t->h + b * TINY_H;
    for (int j = 0; j < TINY_H; j++) {
      float s = p[TINY_B1 + j];
      for (int i = 0; i < TINY_D; i++) s += p[TINY_W1 + j * TINY_D + i] * x[i];
      h[j] = s > 0 ? s : 0;
    }
    float *pr = t->probs + b * TINY_K, mx = -1e30f;
    for (int k = 0; k < TINY_K; k++) {
      float s = p[TINY_B2 + k];
      for (int j = 0; j < TINY_H; j++) s += p[TINY_W2 + k * TINY_H + j] * h[j];
      pr[k] = s;
      if (s > mx) mx = s;
    }
    float z = 0;
    for (int k = 0; k < TINY_K; k++) z += (pr[k] = expf(pr[k] - mx));
    for (int k = 0; k < TINY_K; k++) pr[k] /= z;
    loss -= log(pr[t->y[b]]);
  }
  return (float)(loss / B);
}

static void tiny_backward(td_model *m, const float *p, float *g, float scale, td_grad_ready_fn ready, void *ctx) {
  tiny_model *t = (tiny_model *)m;
  int B = t->batch;
  float *dh = calloc((size_t)B * TINY_H, sizeof(float));
  for (int b = 0; b < B; b++) {
    float *pr = t->probs + b * TINY_K, *h = t->h + b * TINY_H;
    for (int k = 0; k < TINY_K; k++) {
      float d = (pr[k] - (k == t->y[b])) * scale / (float)B;
      g[TINY_B2 + k] += d;
      for (int j = 0; j < TINY_H; j++) {
        g[TINY_W2 + k * TINY_H + j] += d * h[j];
        dh[b * TINY_H + j] += d * p[TINY_W2 + k * TINY_H + j];
      }
    }
  }
  if (ready) ready(ctx, TINY_B2, TINY_K), ready(ctx, TINY_W2, TINY_H * TINY_K);
  for (int b = 0; b < B; b++) {
    const float *x = t->x + b * TINY_D;
    for (int j = 0; j < TINY_H; j++) {
      if (t->h[b * TINY_H + j] <= 0) continue;
      float d = dh[b * TINY_H + j];
      g[TINY_B1 + j] += d;
      for (int i = 0; i < TINY_D; i++) g[TINY_W1 + j * TINY_D + i] += d * x[i];
    }
  }
  if (ready) ready(ctx, TINY_B1, TINY_H), ready(ctx, TINY_W1, TINY_D * TINY_H);
  free(dh);
}

static void tiny_predict(td_model *m, int32_t *out) {
  tiny_model *t = (tiny_model *)m;
  for (int b = 0; b < t->batch; b++) {
    int best = 0;
    for (int k = 1; k < TINY_K; k++)
      if (t->probs[b * TINY_K + k] > t->probs[b * TINY_K + best]) best = k;
    out[b] = best;
  }
}

static void tiny_destroy(td_model *m) {
  tiny_model *t = (tiny_model *)m;
  free(t->x), free(t->y), free(t->h), free(t->probs);
  free(t);
}

static const td_model_ops tiny_ops = {.prepare = tiny_prepare, .forward = tiny_forward, .backward = tiny_backward,
                                      .predict = tiny_predict, .destroy = tiny_destroy};

static td_model *tiny_model_create(void) {
  tiny_model *t = calloc(1, sizeof *t);
  t->base.ops = &tiny_ops;
  t->base.kind = "tiny-mlp";
  t->base.n_params = TINY_N;
  t->tensors[0] = (td_param_tensor){"fc1.weight", TINY_W1, TINY_D * TINY_H};
  t->tensors[1] = (td_param_tensor){"fc1.bias", TINY_B1, TINY_H};
  t->tensors[2] = (td_param_tensor){"fc2.weight", TINY_W2, TINY_H * TINY_K};
  t->tensors[3] = (td_param_tensor){"fc2.bias", TINY_B2, TINY_K};
  t->base.n_tensors = 4;
  t->base.tensors = t->tensors;
  t->base.input_bytes = sizeof(float) * TINY_D;
  t->base.targets_per_sample = 1;
  t->base.config = "inputs=16 hidden=32 classes=5";
  return &t->base;
}

/* Deterministic initial parameters (the same on every rank). */
static void tiny_init_params(float *p, uint64_t seed) {
  uint64_t s = seed * 2654435761u + 1;
  for (int i = 0; i < TINY_N; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    p[i] = ((float)((s >> 40) & 0xFFFF) / 65536.0f - 0.5f) * 0.5f;
  }
}

/* Synthetic dataset: sample i has features from a hash of i and the label of
 * its largest feature among the first K, so the task is learnable. */
static td_status tiny_get(const td_dataset *ds, size_t index, void *input, int32_t *targets) {
  (void)ds;
  float *x = input;
  uint64_t s = (uint64_t)index * 0x9E3779B97F4A7C15ull + 7;
  int best = 0;
  for (int i = 0; i < TINY_D; i++) {
    s ^= s >> 33, s *= 0xFF51AFD7ED558CCDull, s ^= s >> 29;
    x[i] = (float)((s >> 20) & 0xFFFF) / 32768.0f - 1.0f;
    if (i < TINY_K && x[i] > x[best]) best = i;
  }
  targets[0] = best;
  return TD_OK;
}

static void tiny_ds_destroy(td_dataset *ds) { free(ds); }

static td_dataset *tiny_dataset_create(size_t n) {
  td_dataset *ds = calloc(1, sizeof *ds);
  ds->n_samples = n;
  ds->input_bytes = sizeof(float) * TINY_D;
  ds->targets_per_sample = 1;
  ds->get = tiny_get;
  ds->destroy = tiny_ds_destroy;
  return ds;
}

#endif
