/* The Fashion-MNIST CNN (TensorFlow's two-convolution tutorial network):
 *   (B,1,28,28) conv5x5 pad 2 (1->c1) + ReLU -> maxpool2 -> (B,c1,14,14)
 *   conv5x5 pad 2 (c1->c2) + ReLU -> maxpool2 -> (B,c2,7,7)
 *   dense (c2*49 -> hidden) + ReLU -> dense (hidden -> classes) -> softmax cross-entropy
 * Parameters in forward order: conv1.weight, conv1.bias, conv2.weight,
 * conv2.bias, fc1.weight, fc1.bias, fc2.weight, fc2.bias. He (Kaiming)
 * normal init for the layers followed by ReLU, LeCun normal (1/fan_in) for
 * the logits layer, zero biases. The loss is the mean over images. */
#include "nn_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { C_CONV1W, C_CONV1B, C_CONV2W, C_CONV2B, C_FC1W, C_FC1B, C_FC2W, C_FC2B, C_N };

typedef struct cnn_model {
  td_model base;
  td_cnn_config cfg;
  char config_text[128]; /* td_model.config */
  td_param_tensor tensors[C_N];
  int B; /* activations sized for */
  int last_B;
  float *c1;      /* (B, c1, 28, 28): conv1 output after ReLU */
  float *p1;      /* (B, c1, 14, 14) */
  int32_t *p1_am; /* (B, c1, 14, 14) */
  float *c2;      /* (B, c2, 14, 14) after ReLU */
  float *p2;      /* (B, c2, 7, 7) */
  int32_t *p2_am; /* (B, c2, 7, 7) */
  float *h;       /* (B, hidden) after ReLU */
  float *probs;   /* (B, classes): logits, then softmax */
  float *input;   /* (B, 1, 28, 28): copy of the last input */
  int32_t *targets;
  int have_targets;
  /* backward */
  float *dc1;     /* (B, c1, 28, 28) */
  float *dp1;     /* (B, c1, 14, 14) */
  float *dc2;     /* (B, c2, 14, 14) */
  float *dp2;     /* (B, c2, 7, 7) */
  float *dh;      /* (B, hidden) */
  float *dlogits; /* (B, classes) */
  float *scratch; /* conv im2col: 2 * max(1*25*784, c1*25*196) */
  void *memory;
} cnn_model;

#define IMG 28

static size_t align16(size_t n) { return (n + 15) & ~(size_t)15; }

static td_status cnn_prepare(td_model *model, int batch) {
  cnn_model *m = (cnn_model *)model;
  if (batch <= 0) return td_error(TD_ERR_INVALID_ARGUMENT, "cnn: micro-batch must be positive, got %d", batch);
  if (m->memory && m->B == batch) return TD_OK;
  td_free(m->memory);
  m->memory = NULL;
  size_t B = batch, c1 = m->cfg.channels1, c2 = m->cfg.channels2, hid = m->cfg.hidden, K = m->cfg.classes;
  size_t scratch = 2 * TD_MAX((size_t)25 * IMG * IMG, c1 * 25 * 14 * 14);
  size_t sizes[] = {B * c1 * 784, B * c1 * 196, B * c1 * 196, B * c2 * 196, B * c2 * 49, B * c2 * 49,
                    B * hid,      B * K,        B * 784,      B,            B * c1 * 784, B * c1 * 196,
                    B * c2 * 196, B * c2 * 49,  B * hid,      B * K,        scratch};
  void **ptrs[] = {(void **)&m->c1, (void **)&m->p1,      (void **)&m->p1_am,   (void **)&m->c2,
                   (void **)&m->p2, (void **)&m->p2_am,   (void **)&m->h,       (void **)&m->probs,
                   (void **)&m->input, (void **)&m->targets, (void **)&m->dc1,  (void **)&m->dp1,
                   (void **)&m->dc2, (void **)&m->dp2,    (void **)&m->dh,      (void **)&m->dlogits,
                   (void **)&m->scratch};
  size_t total = 0;
  for (size_t i = 0; i < TD_ARRAY_SIZE(sizes); i++) total += align16(sizes[i]);
  m->memory = td_alloc(total * 4); /* every element is 4 bytes (float or int32) */
  if (!m->memory) return td_error(TD_ERR_SYSTEM, "cnn: out of memory for activations of micro-batch %d", batch);
  char *p = m->memory;
  for (size_t i = 0; i < TD_ARRAY_SIZE(sizes); i++) {
    *ptrs[i] = p;
    p += align16(sizes[i]) * 4;
  }
  m->B = batch;
  return TD_OK;
}

/* ReLU backward in place: d = out > 0 ? d : 0 */
static void relu_mask(float *restrict d, const float *restrict out, size_t n) {
  for (size_t i = 0; i < n; i++) d[i] = out[i] > 0.0f ? d[i] : 0.0f;
}

#define PW(i) (params + m->tensors[(i)].offset)
#define GW(i) (grads + m->tensors[(i)].offset)

static td_status cnn_check_inputs(const td_model *model, const void *inputs, const int32_t *targets, int batch) {
  const cnn_model *m = (const cnn_model *)model;
  (void)inputs; /* images: any float is a valid pixel */
  const int K = m->cfg.classes;
  if (targets)
    for (int b = 0; b < batch; b++)
      if ((uint32_t)targets[b] >= (uint32_t)K)
        return td_error(TD_ERR_INVALID_ARGUMENT, "cnn: label %d of sample %d is outside [0, %d)", targets[b], b, K);
  return TD_OK;
}

static float cnn_forward(td_model *model, const float *params, const void *inputs, const int32_t *targets,
                         int batch) {
  cnn_model *m = (cnn_model *)model;
  if (!m->memory || m->B != batch)
    if (cnn_prepare(model, batch) != TD_OK) return NAN;
  const int B = batch, c1 = m->cfg.channels1, c2 = m->cfg.channels2, hid = m->cfg.hidden, K = m->cfg.classes;
  if (cnn_check_inputs(model, inputs, targets, batch) != TD_OK) {
    m->have_targets = 0;
    m->last_B = 0;
    return NAN;
  }
  memcpy(m->input, inputs, (size_t)B * 784 * sizeof(float));
  m->have_targets = targets != NULL;
  if (targets) memcpy(m->targets, targets, (size_t)B * sizeof(int32_t));
  m->last_B = B;
  td_conv2d_forward(m->c1, m->scratch, m->input, PW(C_CONV1W), PW(C_CONV1B), B, 1, c1, IMG, IMG, 5, 2);
  td_relu_forward(m->c1, m->c1, (size_t)B * c1 * 784);
  td_maxpool2_forward(m->p1, m->p1_am, m->c1, B, c1, IMG, IMG);
  td_conv2d_forward(m->c2, m->scratch, m->p1, PW(C_CONV2W), PW(C_CONV2B), B, c1, c2, 14, 14, 5, 2);
  td_relu_forward(m->c2, m->c2, (size_t)B * c2 * 196);
  td_maxpool2_forward(m->p2, m->p2_am, m->c2, B, c2, 14, 14);
  td_linear_forward(m->h, m->p2, PW(C_FC1W), PW(C_FC1B), B, c2 * 49, hid);
  td_relu_forward(m->h, m->h, (size_t)B * hid);
  td_linear_forward(m->probs, m->h, PW(C_FC2W), PW(C_FC2B), B, hid, K);
  if (!targets) return 0.0f;
  return td_softmax_xent_forward(m->probs, m->probs, m->targets, B, K);
}

static void cnn_backward(td_model *model, const float *params, float *grads, float loss_scale, td_grad_ready_fn ready,
                         void *ctx) {
  cnn_model *m = (cnn_model *)model;
  if (!m->have_targets) return;
  const int B = m->last_B, c1 = m->cfg.channels1, c2 = m->cfg.channels2, hid = m->cfg.hidden, K = m->cfg.classes;
#define READY(i) \
  do { if (ready) ready(ctx, m->tensors[(i)].offset, m->tensors[(i)].count); } while (0)
  nn_softmax_xent_backward_set(m->dlogits, m->probs, m->targets, loss_scale, B, K);
  nn_linear_backward_set(m->dh, GW(C_FC2W), GW(C_FC2B), m->dlogits, m->h, PW(C_FC2W), B, hid, K);
  READY(C_FC2B);
  READY(C_FC2W);
  /* ReLU in place: h > 0 where it passed */
  relu_mask(m->dh, m->h, (size_t)B * hid);
  nn_linear_backward_set(m->dp2, GW(C_FC1W), GW(C_FC1B), m->dh, m->p2, PW(C_FC1W), B, c2 * 49, hid);
  READY(C_FC1B);
  READY(C_FC1W);
  memset(m->dc2, 0, (size_t)B * c2 * 196 * sizeof(float));
  td_maxpool2_backward(m->dc2, m->dp2, m->p2_am, B, c2, 14, 14);
  relu_mask(m->dc2, m->c2, (size_t)B * c2 * 196);
  memset(m->dp1, 0, (size_t)B * c1 * 196 * sizeof(float));
  td_conv2d_backward(m->dp1, GW(C_CONV2W), GW(C_CONV2B), m->scratch, m->dc2, m->p1, PW(C_CONV2W), B, c1, c2, 14, 14,
                     5, 2);
  READY(C_CONV2B);
  READY(C_CONV2W);
  memset(m->dc1, 0, (size_t)B * c1 * 784 * sizeof(float));
  td_maxpool2_backward(m->dc1, m->dp1, m->p1_am, B, c1, IMG, IMG);
  relu_mask(m->dc1, m->c1, (size_t)B * c1 * 784);
  td_conv2d_backward(NULL, GW(C_CONV1W), GW(C_CONV1B), m->scratch, m->dc1, m->input, PW(C_CONV1W), B, 1, c1, IMG,
                     IMG, 5, 2);
  READY(C_CONV1B);
  READY(C_CONV1W);
#undef READY
}

static void cnn_predict(td_model *model, int32_t *out) {
  cnn_model *m = (cnn_model *)model;
  const int K = m->cfg.classes;
  for (int b = 0; b < m->last_B; b++) {
    const float *row = m->probs + (size_t)b * K;
    int best = 0;
    for (int k = 1; k < K; k++)
      if (row[k] > row[best]) best = k;
    out[b] = best;
  }
}

static void cnn_destroy(td_model *model) {
  cnn_model *m = (cnn_model *)model;
  if (!m) return;
  td_free(m->memory);
  free(m);
}

static const td_model_ops cnn_ops = {
    .check_inputs = cnn_check_inputs,
    .prepare = cnn_prepare,
    .forward = cnn_forward,
    .backward = cnn_backward,
    .predict = cnn_predict,
    .destroy = cnn_destroy,
};

td_status td_cnn_create(const td_cnn_config *config, td_model **out) {
  if (!config || !out) return td_error(TD_ERR_INVALID_ARGUMENT, "td_cnn_create: config and out must not be NULL");
  *out = NULL;
  TD_CHECK(td_cpu_check()); /* a TANDEM_CPU the kernels cannot honour is refused here */
  const td_cnn_config *c = config;
  if (c->channels1 <= 0 || c->channels2 <= 0 || c->hidden <= 0 || c->classes <= 0)
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "cnn: channels1 %d, channels2 %d, hidden %d, classes %d must all be positive (e.g. 32 64 128 10)",
                    c->channels1, c->channels2, c->hidden, c->classes);
  cnn_model *m = calloc(1, sizeof *m);
  if (!m) return td_error(TD_ERR_SYSTEM, "cnn: out of memory");
  m->cfg = *c;
  static const char *names[C_N] = {"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias",
                                   "fc1.weight",   "fc1.bias",   "fc2.weight",   "fc2.bias"};
  size_t c1 = c->channels1, c2 = c->channels2, hid = c->hidden, K = c->classes;
  size_t counts[C_N] = {c1 * 25, c1, c2 * c1 * 25, c2, hid * c2 * 49, hid, K * hid, K};
  size_t off = 0;
  for (int i = 0; i < C_N; i++) {
    m->tensors[i].name = names[i];
    m->tensors[i].offset = off;
    m->tensors[i].count = counts[i];
    off += counts[i];
  }
  m->base.ops = &cnn_ops;
  m->base.kind = "cnn";
  snprintf(m->config_text, sizeof m->config_text, "channels1=%d channels2=%d hidden=%d classes=%d", c->channels1,
           c->channels2, c->hidden, c->classes);
  m->base.config = m->config_text;
  m->base.n_params = off;
  m->base.n_tensors = C_N;
  m->base.tensors = m->tensors;
  m->base.input_bytes = 784 * sizeof(float);
  m->base.targets_per_sample = 1;
  *out = &m->base;
  return TD_OK;
}

void nn_cnn_init_params(const td_model *model, float *params, uint64_t seed) {
  const cnn_model *m = (const cnn_model *)model;
  size_t c1 = m->cfg.channels1, c2 = m->cfg.channels2, hid = m->cfg.hidden;
  /* fan_in of each weight; He for ReLU layers (2/fan_in), LeCun for the logits (1/fan_in) */
  struct {
    int idx;
    float gain;
    size_t fan_in;
  } w[] = {{C_CONV1W, 2.0f, 25}, {C_CONV2W, 2.0f, c1 * 25}, {C_FC1W, 2.0f, c2 * 49}, {C_FC2W, 1.0f, hid}};
  for (int i = 0; i < C_N; i++) nn_fill_const(params + m->tensors[i].offset, m->tensors[i].count, 0.0f);
  for (size_t i = 0; i < TD_ARRAY_SIZE(w); i++) {
    nn_rng rng = nn_rng_stream(seed, (uint64_t)w[i].idx + 1);
    const td_param_tensor *t = &m->tensors[w[i].idx];
    nn_fill_normal(params + t->offset, t->count, sqrtf(w[i].gain / (float)w[i].fan_in), &rng);
  }
}
