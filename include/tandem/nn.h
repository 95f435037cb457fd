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
#include "device.h"

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

/* Parameter access for sharded parameters (ZeRO stage 3): the training
 * engine sets td_model.param_access, and the model then brackets every use
 * of a group of parameters (a layer) in forward and backward with
 * fetch/release, so that only the groups in use need to be resident. src/nn
 * stays free of communication: how the engine gathers them is its business.
 *   fetch(ctx, offset, count, next_offset, next_count): make the arena range
 *     [offset, offset+count) readable and return the arena's base pointer
 *     (index it with tensor offsets as usual). next_*: the range the model
 *     will fetch next (a prefetch hint; next_count 0: none). It does not fail
 *     from the model's point of view: the engine records a failure and fails
 *     the step afterwards.
 *   release(ctx, offset, count): the model is done with the range for now.
 * Without param_access (NULL) the `params` argument is used directly, which
 * is what the engine does at ZeRO stages 0-2. Training thread only. */
typedef struct td_param_access {
  const float *(*fetch)(void *ctx, size_t offset, size_t count, size_t next_offset, size_t next_count);
  void (*release)(void *ctx, size_t offset, size_t count);
  void *ctx;
} td_param_access;

typedef struct td_model td_model;
typedef struct td_model_ops {
  /* Size activation buffers for micro-batch size `batch`. May be called again
   * with another size. */
  td_status (*prepare)(td_model *model, int batch);
  /* Forward pass on `batch` samples; returns the mean loss per prediction
   * (per token for the GPT, per image for the CNN) and caches activations.
   * inputs: model-specific (int32 tokens (B,T) for the GPT, float images
   * (B,1,28,28) for the CNN); targets: int32, (B,T) or (B). Returns NaN,
   * with the reason in td_last_error(), for a token or target outside the
   * vocabulary/classes or when activations cannot be allocated; backward
   * after such a forward does nothing. */
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
  /* Optional (NULL: not supported). on = 1: forward keeps only each
   * transformer block's input and backward recomputes the block before
   * differentiating it (activation checkpointing; the same results, bit for
   * bit); 0: forward keeps everything. Takes effect at the next prepare. */
  td_status (*set_activation_checkpointing)(td_model *model, int on);
  /* Bytes of activation and scratch memory prepare(batch) and the first
   * forward allocate with activation checkpointing on or off and at the
   * compute type `compute` (TD_BF16 adds the bf16 copies the products read),
   * whatever the model is set to now (for memory estimates before a trainer
   * exists). May be NULL. */
  size_t (*activation_bytes)(const td_model *model, int batch, int checkpointing, td_dtype compute);
  /* Optional (NULL: the models of src/nn, initialized by kind): fill the
   * arena with the model's initial values from seed, as
   * td_model_init_params. For models built above this layer (the
   * tensor-parallel GPT of src/parallel, whose arena is a shard). */
  void (*init_params)(const td_model *model, float *params, uint64_t seed);
  /* Optional (NULL: the arena is the whole model). For a model whose arena
   * is one rank's shard of a model split across ranks (tensor or pipeline
   * parallelism): *sum_sq holds the sum of squares of grads[lo, hi), the
   * part of this rank's gradient arena it counts (the whole arena, or its
   * ZeRO-2 shard of it: the other data-parallel ranks count the rest);
   * replace it with the sum over the model's group of every rank's
   * [lo, hi), counting a tensor replicated across the group once (its
   * elements inside [lo, hi) are left out on all ranks but one), so that
   * gradient clipping scales every shard alike. Every rank of the group
   * passes the same lo and hi relative to its own arena's data-parallel
   * sharding. Collective over the model's own group; the training thread
   * calls it once per step with the averaged gradient. */
  td_status (*grad_norm_sq)(td_model *model, const float *grads, size_t lo, size_t hi, double *sum_sq);
  /* Optional (NULL: the arena is the whole model). For a model split across
   * ranks: *flag becomes the maximum of every rank's *flag over the model's
   * own group, so that a decision one shard makes alone (fp16's skip of a
   * step whose gradients overflowed) is taken by every rank holding a part
   * of the model. Collective over that group. */
  td_status (*group_max)(td_model *model, int32_t *flag);
  /* Optional (NULL: forward's own checks only): TD_OK when forward would
   * accept these inputs and targets (tokens, targets, labels in range), or
   * the reason forward would give, without computing anything. The trainer
   * asks before a forward that communicates (ZeRO stage 3 fetches its
   * parameters inside forward), so that a rank with bad data is named by
   * every rank instead of leaving the others in a fetch it never joins. */
  td_status (*check_inputs)(const td_model *model, const void *inputs, const int32_t *targets, int batch);
  /* Optional (NULL: the trainer runs forward and backward per micro-step).
   * For a model whose micro-batches must run together (a pipeline stage of
   * src/parallel/pipeline, where they overlap across ranks): forward and
   * backward of all n_micro micro-batches of a step, `batch` samples each;
   * micro-batch i's inputs start at byte i*batch*input_bytes of inputs, its
   * targets at element i*batch*targets_per_sample. grads += the gradient of
   * loss_scale x each micro-batch's mean loss, summed; ready(ctx, ...) as in
   * backward, once per tensor whose gradient is final (ready may be NULL).
   * *loss_out: the mean of the micro-batches' losses, the same on every
   * rank of the model's group. Collective over that group; a failure there
   * (a dead peer, a bad token on another stage) fails every rank of it,
   * naming the rank. */
  td_status (*run_micro_batches)(td_model *model, const float *params, float *grads, const void *inputs,
                                 const int32_t *targets, int batch, int n_micro, float loss_scale,
                                 td_grad_ready_fn ready, void *ctx, double *loss_out);
  /* Optional (NULL: f32 only). On a device model, the element type of the
   * params and grads arrays forward and backward take (and of the
   * activations): TD_F32 or TD_BF16 (td_gpt_set_device_dtype). The training
   * engine calls it at td_trainer_create for bf16 mixed precision on a
   * device, then keeps the f32 masters itself and hands the model a bf16
   * copy. Takes effect at the next prepare. */
  td_status (*set_device_dtype)(td_model *model, td_dtype dtype);
  /* Optional (NULL: none). Bytes each compute thread keeps for the model's
   * matrix products at micro-batch `batch` (td_linear_scratch_bytes of its
   * largest layer): allocated by the first step and kept, once per thread
   * whatever the activations held (memory estimates count it per thread,
   * not per pipeline slot). */
  size_t (*thread_scratch_bytes)(const td_model *model, int batch);
  /* Optional (NULL: none). For a model split across ranks that
   * communicates inside its steps (the tensor group's collectives, a
   * pipeline's transfers): bytes of its communicators' staging memory that
   * a rank's RSS counts once it has run a step at micro-batch `batch`
   * (td_comm_staging_bytes of what its forward and backward run: 0 over
   * TCP); *peers: of it, the pages that are physically the peers'. For
   * memory estimates. */
  size_t (*comm_staging_bytes)(const td_model *model, int batch, size_t *peers);
} td_model_ops;

struct td_model {
  const td_model_ops *ops;
  const char *kind;               /* "gpt", "cnn" */
  size_t n_params;                /* floats in the parameter arena */
  int n_tensors;
  const td_param_tensor *tensors; /* in arena order */
  size_t input_bytes;             /* bytes of one sample's input */
  size_t targets_per_sample;      /* int32 targets per sample (T for the GPT, 1 for the CNN) */
  /* The model's shape as space-separated "key=value" pairs, e.g. "vocab=256
   * layers=2 channels=64 heads=4 seq=64 tied=0". Checkpoints record it and
   * refuse to resume onto a model whose pairs differ, naming each difference
   * (the tensor table alone misses shape-preserving changes such as the
   * number of heads). NULL: not recorded. */
  const char *config;
  size_t activation_bytes; /* activation memory the last prepare allocated (0: not reported) */
  /* Set by the training engine at ZeRO stage 3 (see td_param_access); NULL
   * otherwise. Models that ignore it cannot train at stage 3 (the engine
   * checks td_model.supports_param_access). */
  const td_param_access *param_access;
  int supports_param_access; /* set by the model: it honours param_access */
  /* Where the model computes (td_gpt_create_on): on a CUDA device, the
   * params and grads that forward and backward take are device pointers to
   * arenas of the same layout, and the activations live there too; inputs,
   * targets, the loss and predictions stay host memory. {TD_DEVICE_CPU, 0}
   * for every model made by the plain constructors. */
  td_device device;
};

/* Fill the parameter arena with the model's initial values, deterministically
 * from seed (same on every rank and every world size). */
void td_model_init_params(const td_model *model, float *params, uint64_t seed);
/* The same values for the elements [lo, hi) only, into dst[0, hi - lo), so
 * that a rank can initialize its shard of a model larger than its memory
 * (NVMe offload). Without a model-specific way it initializes a temporary
 * whole arena (TD_ERR_SYSTEM when that does not fit). */
td_status td_model_init_params_range(const td_model *model, float *dst, uint64_t seed, size_t lo, size_t hi);

typedef struct td_gpt_config {
  int vocab;    /* 256 for bytes */
  int layers;   /* L */
  int channels; /* C, divisible by heads */
  int heads;    /* NH */
  int seq;      /* T: maximum sequence length */
  int tied;     /* 1: the LM head reuses wte (GPT-2); 0 (default): its own (V, C) weight, no bias,
                 * as shared/peers/torch_gpt_ddp.py */
} td_gpt_config;
td_status td_gpt_create(const td_gpt_config *config, td_model **out);
/* A pipeline stage of the GPT (src/parallel/pipeline): the blocks
 * [first_layer, first_layer + n_layers), with the token and position
 * embeddings when it starts at block 0 (embed) and the final layernorm, the
 * head and the loss when it ends at the last block (head). Its tensor table
 * is the whole model's slice in the same order, with the same names and the
 * same initial values (td_model_init_params), plus, for a tied model's last
 * stage without the embeddings, a copy of "wte" for the head (its gradient
 * is the head's share only: the caller adds the first stage's). Forward's
 * inputs: tokens (B, T) int32 with the embeddings, else the previous
 * stage's output activations (B, T, C) floats (input_bytes says which);
 * targets are read only with the head, and forward returns the loss there,
 * 0 elsewhere. A chain of stages computes the whole model's bits: the same
 * kernels in the same order. On the CPU (a device: td_gpt_stage_create_on); activation checkpointing works as in
 * the whole model; ZeRO stage 3's param_access is not supported. Refused
 * (TD_ERR_INVALID_ARGUMENT) when the range is outside [0, layers), empty, or
 * embed/head disagree with where it starts and ends. */
typedef struct td_gpt_stage {
  int first_layer, n_layers;
  int embed; /* 1: first_layer == 0 */
  int head;  /* 1: first_layer + n_layers == layers */
} td_gpt_stage;
td_status td_gpt_stage_create(const td_gpt_config *config, const td_gpt_stage *stage, td_model **out);
/* The same stage computing on `device`, as td_gpt_create_on is to
 * td_gpt_create (CPU: exactly td_gpt_stage_create). On a CUDA device its
 * arenas are device memory (f32, or bf16 after td_gpt_set_device_dtype),
 * while the activations it exchanges stay host memory, of the arenas' type:
 * forward copies a later stage's input (B, T, C) in from the host, and the stage accessors below
 * return pinned host copies that forward and backward make of the output and
 * of the input's gradient, so that a pipeline moves them with the host's
 * point-to-point transfers unchanged. */
td_status td_gpt_stage_create_on(const td_gpt_config *config, const td_gpt_stage *stage, td_device device,
                                 td_model **out);
/* A stage without the head: its last forward's output activations (B, T, C),
 * valid until its next prepare or forward (NULL before the first prepare). */
const float *td_gpt_stage_output(const td_model *model);
/* A stage without the head: the gradient of that output, read by the next
 * backward (the pointer must stay valid until then; it is used once). */
void td_gpt_stage_set_output_grad(td_model *model, const float *dout /* (B, T, C) */);
/* A stage without the embeddings: after backward, the gradient of its
 * input activations (B, T, C), valid until its next backward. */
const float *td_gpt_stage_input_grad(const td_model *model);
/* The same GPT (same tensor table, config text and initial values, so that
 * checkpoints move between devices) computing on `device`. CPU: exactly
 * td_gpt_create. CUDA (src/nn/cuda/gpt_cuda.c, in builds with CUDA): opens
 * the device (td_device_open's errors, e.g. "built without CUDA"), and the
 * model's forward/backward take device pointers to f32 parameter and
 * gradient arenas; every layer runs as a CUDA kernel (src/nn/cuda) on the
 * model's own stream; forward and backward return with that work done.
 * Backward calls ready() once a block's gradients are in device memory (the
 * stream is synchronized per block, only when ready is given); f32 arenas
 * unless td_gpt_set_device_dtype says bf16. ZeRO stage 3's param_access
 * and activation checkpointing work as on the CPU; not supported there
 * yet: td_gpt_generate (refused). */
td_status td_gpt_create_on(const td_gpt_config *config, td_device device, td_model **out);
/* The element type of a device GPT's parameter and gradient arenas and of
 * its activations: TD_F32 (the default) or TD_BF16, llm.c's and DeepSpeed's
 * mixed precision, where params and grads point to bf16 arrays with the
 * same element offsets as the f32 ones (the engine keeps the f32 master
 * weights and writes the bf16 copy, e.g. src/train/cuda's td_cuda_adamw);
 * layer-norm statistics, attention weights and losses stay f32, and every
 * kernel computes in f32. Takes effect at the next prepare (the activations
 * are laid out again). A CPU GPT's arenas are f32 only (its bf16 products:
 * td_nn_set_compute_dtype). */
td_status td_gpt_set_device_dtype(td_model *model, td_dtype dtype);
/* Tensor parallelism on a device (Megatron-LM's split; src/parallel's
 * td_gpt_tp_create_on builds it): a device GPT (or stage) from
 * td_gpt_create_on computes tensor rank `rank` of `size`: heads
 * [rank NH/size, (rank+1) NH/size) of the attention (qkv column-parallel,
 * the projection row-parallel), the same share of the MLP's 4C features
 * (fc column-parallel, its projection row-parallel), and vocabulary rows
 * [vocab_lo, vocab_lo + vocab_count) of the token embedding and the head
 * (vocabulary-parallel: the lookup of its rows, zeros elsewhere, summed
 * over the group; the head's logits of its rows only and Megatron's
 * parallel cross-entropy, which never forms the (B, T, V) logits). The
 * position embedding, LayerNorms and the row-parallel biases are
 * replicated. vocab_count 0: the vocabulary whole on every rank. `tensors`
 * is the shard's table (the model's entries in its order, shard counts, an
 * end sentinel; borrowed) and `allreduce` reduces `count` elements of `buf`
 * by `op` (TD_SUM; TD_MAX and, on host buffers, TD_MIN for the loss and
 * predictions) over the tensor group in place, returning once the result is
 * in `buf`: device memory of the arenas' type or f32 (the loss's row
 * statistics), or host memory (predict's argmax). Tandem's device
 * collectives do (staged through pinned host memory, or NCCL). Per
 * micro-batch: one call after each row-parallel product in forward and
 * each column-parallel input gradient in backward, one for the embedding,
 * one for the head's input gradient and two for the loss. Set before the
 * first prepare; ZeRO stage 3's param_access then fetches the groups of
 * `tensors` (n_params elements). A CPU GPT: TD_ERR_INVALID_ARGUMENT (its
 * tensor parallelism is src/parallel's own model, td_gpt_tp_create).
 *
 * sequence_parallel (Megatron-LM's sequence parallelism; the whole model,
 * not a pipeline stage; B*T divisible by size): the residual stream, the
 * LayerNorms and the embedding's output hold rows [rank R, (rank+1) R) of
 * the B*T, R = B*T/size; `allgather` collects the ranks' R-row pieces
 * (`local`, this rank's) into `whole` (count: the whole's elements) before
 * each column-parallel product, and `reduce_scatter` sums `whole` over the
 * group into this rank's piece `local` after each row-parallel product
 * (and for each column-parallel input gradient), both on device buffers of
 * the arenas' type, returning once the result is there; the LayerNorms'
 * weight gradients, then partial, go through `allreduce` (2C each). */
typedef struct td_gpt_tensor_split {
  int size, rank;
  const td_param_tensor *tensors;
  size_t n_params;
  td_status (*allreduce)(void *ctx, void *buf, size_t count, td_dtype dtype, td_op op);
  void *ctx;
  int vocab_lo, vocab_count;
  int sequence_parallel;
  td_status (*allgather)(void *ctx, const void *local, void *whole, size_t count, td_dtype dtype);
  td_status (*reduce_scatter)(void *ctx, const void *whole, void *local, size_t count, td_dtype dtype);
} td_gpt_tensor_split;
td_status td_gpt_set_tensor_split(td_model *model, const td_gpt_tensor_split *split);
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
  /* Copy sample `index` (< n_samples) into input (input_bytes) and targets.
   * Returns TD_OK, or, when the sample cannot be delivered (a read error, a
   * corrupt record, an index out of range, no memory), an error status with
   * the reason in td_last_error() naming the sample and the file or record.
   * The training engine then fails the step on every rank with that reason
   * and updates nothing. Called from the training thread only. */
  td_status (*get)(const td_dataset *ds, size_t index, void *input, int32_t *targets);
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
 * Plain functions over float pointers, in the style of llm.c's train_gpt2.c.
 * Shapes are in comments; N is a number of rows (B*T for sequences). Every
 * backward ACCUMULATES (+=) into its gradient outputs, so callers zero them
 * first (or rely on a residual stream adding into them). A gradient pointer
 * may be NULL when that gradient is not wanted (e.g. dinp of a first layer).
 * None of these lock or fail, and they are reentrant. Matrix products go
 * through OpenBLAS when the build found it (TD_HAVE_OPENBLAS), else through a
 * portable cache-blocked loop nest, which mallocs a 512 KiB packing panel per
 * product (and, should that fail, runs unpacked). */

/* Threads OpenBLAS may use in this process (the training engine gives each
 * rank cores/ranks). No effect without OpenBLAS. Call before compute, from one
 * thread. */
void td_nn_set_threads(int n_threads);
/* The precision of the linear layers' matrix products on the calling
 * thread (mixed precision, src/train/precision/): TD_F32 (the default),
 * TD_BF16 or TD_F16. With a half type, each product rounds its operands
 * (activations, weights, output gradients) to that type and accumulates in
 * f32; everything else (layer norm, softmax, attention, loss, gradients'
 * accumulation) stays f32. bf16 runs on vdpbf16ps at TANDEM_CPU=avx512bf16,
 * on rounded f32 products elsewhere. Thread-local: set it on the thread that
 * runs forward and backward. TD_ERR_INVALID_ARGUMENT for other types. */
td_status td_nn_set_compute_dtype(td_dtype dtype);
td_dtype td_nn_compute_dtype(void);
/* Bytes of f32 scratch the calling thread keeps for a half-precision
 * product of a linear layer of `in` to `out` features on `rows` rows
 * (forward, and both products of its backward) at compute type `compute`
 * on this CPU: 0 where the products round in registers or for TD_F32. For
 * memory estimates of models built above src/nn (the tensor-parallel GPT). */
size_t td_nn_lowp_scratch_bytes(td_dtype compute, size_t rows, size_t in, size_t out);
/* "openblas" or "portable": which matmul the library was built with. */
const char *td_nn_matmul_backend(void);

/* Row-major C (M,N) = alpha * op(A) op(B) + beta * C, op = transpose if trans_*;
 * lda/ldb/ldc are row strides. The one matrix product every layer uses. */
void td_sgemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
              int ldb, float beta, float *C, int ldc);

/* Bytes a thread keeps allocated after the products of a linear layer of
 * `in` to `out` features on `rows` rows (the packed panels of the
 * single-threaded products): for memory estimates (td_model_ops's
 * thread_scratch_bytes). */
size_t td_linear_scratch_bytes(size_t rows, size_t in, size_t out);

/* out = inp @ weight^T + bias. weight (OC, IC) as in PyTorch; bias may be NULL. */
void td_linear_forward(float *out /* (N, OC) */, const float *inp /* (N, IC) */, const float *weight /* (OC, IC) */,
                       const float *bias /* (OC) or NULL */, int N, int IC, int OC);
void td_linear_backward(float *dinp /* (N, IC) or NULL */, float *dweight /* (OC, IC) or NULL */,
                        float *dbias /* (OC) or NULL */, const float *dout /* (N, OC) */,
                        const float *inp /* (N, IC) */, const float *weight /* (OC, IC) */, int N, int IC, int OC);

/* out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]. Tokens must be in [0, V). */
void td_embedding_forward(float *out /* (B, T, C) */, const int32_t *tokens /* (B, T) */, const float *wte /* (V, C) */,
                          const float *wpe /* (maxT, C) */, int B, int T, int C);
void td_embedding_backward(float *dwte /* (V, C) or NULL */, float *dwpe /* (maxT, C) or NULL */,
                           const float *dout /* (B, T, C) */, const int32_t *tokens /* (B, T) */, int B, int T, int C);

/* Layer normalisation over the last dimension (eps 1e-5, as PyTorch). mean and
 * rstd are caches for backward. */
void td_layernorm_forward(float *out /* (N, C) */, float *mean /* (N) */, float *rstd /* (N) */,
                          const float *inp /* (N, C) */, const float *weight /* (C) */, const float *bias /* (C) */,
                          int N, int C);
void td_layernorm_backward(float *dinp /* (N, C) */, float *dweight /* (C) */, float *dbias /* (C) */,
                           const float *dout /* (N, C) */, const float *inp /* (N, C) */, const float *weight /* (C) */,
                           const float *mean /* (N) */, const float *rstd /* (N) */, int N, int C);

/* GELU, tanh approximation (GPT-2's). */
void td_gelu_forward(float *out /* (n) */, const float *inp /* (n) */, size_t n);
void td_gelu_backward(float *dinp /* (n) */, const float *inp /* (n) */, const float *dout /* (n) */, size_t n);

/* ReLU. out may alias inp. Backward reads the forward OUTPUT (or input: same sign). */
void td_relu_forward(float *out /* (n) */, const float *inp /* (n) */, size_t n);
void td_relu_backward(float *dinp /* (n) */, const float *out /* (n) */, const float *dout /* (n) */, size_t n);

/* Causal multi-head self-attention core: inp holds q, k, v side by side
 * (B, T, 3C), heads of size C/NH; out (B, T, C) is the concatenation of the
 * heads' softmax(q k^T / sqrt(hs)) v. att caches the softmax weights
 * (zero above the diagonal). Backward needs a scratch of T*T floats. */
void td_attention_forward(float *out /* (B, T, C) */, float *att /* (B, NH, T, T) */, const float *inp /* (B, T, 3C) */,
                          int B, int T, int C, int NH);
void td_attention_backward(float *dinp /* (B, T, 3C) */, float *scratch /* (T, T) */, const float *dout /* (B, T, C) */,
                           const float *inp /* (B, T, 3C) */, const float *att /* (B, NH, T, T) */, int B, int T, int C,
                           int NH);

/* 2-D convolution, stride 1, zero padding `pad`, square kernel K:
 * OH = H + 2 pad - K + 1, OW = W + 2 pad - K + 1. weight (OC, IC, K, K).
 * Forward needs a scratch of IC*K*K*OH*OW floats (im2col), backward twice that. */
void td_conv2d_forward(float *out /* (B, OC, OH, OW) */, float *scratch /* (IC*K*K, OH*OW) */,
                       const float *inp /* (B, IC, H, W) */, const float *weight /* (OC, IC, K, K) */,
                       const float *bias /* (OC) or NULL */, int B, int IC, int OC, int H, int W, int K, int pad);
void td_conv2d_backward(float *dinp /* (B, IC, H, W) or NULL */, float *dweight /* (OC, IC, K, K) */,
                        float *dbias /* (OC) or NULL */, float *scratch /* (2, IC*K*K, OH*OW) */,
                        const float *dout /* (B, OC, OH, OW) */, const float *inp /* (B, IC, H, W) */,
                        const float *weight /* (OC, IC, K, K) */, int B, int IC, int OC, int H, int W, int K, int pad);

/* 2x2 max-pool, stride 2 (H, W even). argmax caches the winning input index
 * (within each (b, c) plane) for backward. */
void td_maxpool2_forward(float *out /* (B, C, H/2, W/2) */, int32_t *argmax /* (B, C, H/2, W/2) */,
                         const float *inp /* (B, C, H, W) */, int B, int C, int H, int W);
void td_maxpool2_backward(float *dinp /* (B, C, H, W) */, const float *dout /* (B, C, H/2, W/2) */,
                          const int32_t *argmax /* (B, C, H/2, W/2) */, int B, int C, int H, int W);

/* Softmax cross-entropy fused with the final logits: probs = softmax(logits)
 * (probs may alias logits); returns the mean over the N predictions of
 * -log probs[target]. Backward: dlogits += dloss * (probs - onehot) / N, with
 * dloss the gradient of the returned mean. */
float td_softmax_xent_forward(float *probs /* (N, V) */, const float *logits /* (N, V) */,
                              const int32_t *targets /* (N) */, int N, int V);
void td_softmax_xent_backward(float *dlogits /* (N, V) */, const float *probs /* (N, V) */,
                              const int32_t *targets /* (N) */, float dloss, int N, int V);

#ifdef __cplusplus
}
#endif
#endif
