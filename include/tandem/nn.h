/* Tandem public API: the layer library (src/nn) — models, layers and datasets.
 *
 * Layers follow llm.c's train_gpt2.c: plain functions over float pointers,
 * `*_forward(out, ..., inp, params, ...)` and `*_backward(dinp, dparams, ...,
 * dout, ...)`, backward ACCUMULATING (+=) into gradients. Parameters of a
 * model live in one contiguous arena (and gradients in another of the same
 * layout), so that the training engine can reduce and shard flat ranges.
 * This layer does not communicate: src/train glues it to src/comm. */
#ifndef TANDEM_NN_H
#define TANDEM_NN_H

#include <stddef.h>
#include <stdint.h>

#include "base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- models ---- */

/* One named parameter tensor inside the arena. */
typedef struct td_param_tensor {
  const char *name;  /* "h0.attn.qkv.weight" */
  size_t offset;     /* in floats from the start of the arena */
  size_t count;      /* floats */
} td_param_tensor;

/* Called by backward as soon as the gradients of the arena range
 * [offset, offset+count) are final for this micro-batch, in reverse layer
 * order (the order gradients become ready). The training engine uses this to
 * launch bucket reductions while backward continues. */
typedef void (*td_grad_ready_fn)(void *ctx, size_t offset, size_t count);

typedef struct td_model td_model;
typedef struct td_model_ops {
  /* Size activation buffers for micro-batch size `batch`. May be called again
   * with another size. */
  td_status (*prepare)(td_model *model, int batch);
  /* Forward pass on `batch` samples; returns the mean loss per prediction
   * (per token for the GPT, per image for the CNN) and caches activations.
   * inputs: model-specific (int32 tokens (B,T) for the GPT, float images
   * (B,1,28,28) for the CNN); targets: int32, (B,T) or (B). */
  float (*forward)(td_model *model, const float *params, const void *inputs, const int32_t *targets, int batch);
  /* Backward of the last forward: grads += d(loss * loss_scale)/d(params).
   * Calls ready(ctx, ...) for each tensor whose gradient is complete (ready
   * may be NULL). */
  void (*backward)(td_model *model, const float *params, float *grads, float loss_scale, td_grad_ready_fn ready,
                   void *ctx);
  /* Predictions for the last forward: argmax class per sample/position into
   * out (int32, (B) or (B,T)). May be NULL for models without it. */
  void (*predict)(td_model *model, int32_t *out);
  void (*destroy)(td_model *model);
} td_model_ops;

struct td_model {
  const td_model_ops *ops;
  const char *kind;               /* "gpt", "cnn" */
  size_t n_params;                /* floats in the parameter arena */
  int n_tensors;
  const td_param_tensor *tensors; /* in arena order */
  size_t input_bytes;             /* bytes of one sample's input */
  size_t targets_per_sample;      /* int32 targets per sample (T for the GPT, 1 for the CNN) */
};

/* Fill the parameter arena with the model's initial values, deterministically
 * from seed (same on every rank and every world size). */
void td_model_init_params(const td_model *model, float *params, uint64_t seed);

typedef struct td_gpt_config {
  int vocab;    /* 256 for bytes */
  int layers;   /* L */
  int channels; /* C, divisible by heads */
  int heads;    /* NH */
  int seq;      /* T: maximum sequence length */
} td_gpt_config;
td_status td_gpt_create(const td_gpt_config *config, td_model **out);
/* Generate `n` tokens after the prompt (greedy if temperature <= 0), writing
 * them to out. Uses a private batch-1 workspace. */
td_status td_gpt_generate(td_model *model, const float *params, const int32_t *prompt, int n_prompt, int n,
                          float temperature, uint64_t seed, int32_t *out);

typedef struct td_cnn_config {
  int channels1; /* first conv's output channels (e.g. 32) */
  int channels2; /* second conv's output channels (e.g. 64) */
  int hidden;    /* dense layer width (e.g. 128) */
  int classes;   /* 10 */
} td_cnn_config;
/* conv5x5(1->c1)+ReLU -> maxpool2 -> conv5x5(c1->c2)+ReLU -> maxpool2 -> dense(hidden)+ReLU -> dense(classes) */
td_status td_cnn_create(const td_cnn_config *config, td_model **out);

void td_model_destroy(td_model *model); /* accepts NULL */

/* ---- datasets ----
 * A dataset is an indexable set of samples; the training engine's sampler
 * picks indices, the dataset copies samples into a batch. */
typedef struct td_dataset td_dataset;
struct td_dataset {
  size_t n_samples;
  size_t input_bytes;        /* bytes of one sample's input */
  size_t targets_per_sample; /* int32 targets per sample */
  /* Copy sample `index` into input (input_bytes) and targets. */
  void (*get)(const td_dataset *ds, size_t index, void *input, int32_t *targets);
  void (*destroy)(td_dataset *ds);
  void *impl;
};

/* Byte-level text: sample i is the window of seq+1 bytes starting at i*seq
 * (inputs = first seq bytes as int32, targets = the next byte of each). Reads
 * one file, or every regular file of a directory in name order (the fortune
 * databases under /usr/share/games/fortunes by default, skipping .dat). */
td_status td_text_dataset_open(const char *path, int seq, td_dataset **out);

/* Fashion-MNIST / MNIST IDX files (gzip'd or not): dir/{train,t10k}-images-idx3-ubyte[.gz]
 * and labels. Images become floats (x/255 - mean)/std. `split`: "train" or "test". */
td_status td_idx_dataset_open(const char *dir, const char *split, td_dataset **out);

void td_dataset_destroy(td_dataset *ds); /* accepts NULL */

/* Default data locations (Debian packages fortunes, dataset-fashion-mnist). */
#define TD_DEFAULT_TEXT_PATH "/usr/share/games/fortunes"
#define TD_DEFAULT_FMNIST_DIR "/usr/share/datasets/fashion-mnist"

/* ---- layers ----
 * (Declared below by src/nn: linear, embedding, layernorm, gelu, relu,
 * attention, conv2d, maxpool2d, softmax cross-entropy.) */

#ifdef __cplusplus
}
#endif
#endif
