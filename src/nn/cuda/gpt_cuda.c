/* src/nn/cuda/gpt_cuda.c: the GPT (src/nn/gpt.c) on a CUDA device. The CPU
 * model stays what it is for everything but computing: its tensor table,
 * config text and initializer (so that parameters, checkpoints and the
 * engine's buckets are the same on both), and this file replaces its ops
 * with ones whose params and grads are device pointers to arenas of the
 * same layout, of f32 or (td_gpt_set_device_dtype) bf16 elements; the
 * activations are of that type too, the statistics, attention weights and
 * losses f32. Every layer is a launch of src/nn/cuda's kernels, in the
 * order and with the shapes of gpt.c's forward and backward (llm.c's
 * train_gpt2.cu is the model), on one stream that the model owns.
 *
 * Memory, allocated by prepare(batch) on the device in one block:
 *   forward:  encoded; per layer ln1 (+mean, rstd), qkv, atty, the attention
 *             cache (att (B,NH,T,T) for the unfused kernels, lse (B,NH,T) for
 *             the fused ones), res2, ln2 (+mean, rstd), fch (pre-GELU), fch_gelu,
 *             res3; lnf (+mean, rstd); logits (B,T,V) (this rank's V/tp
 *             columns under tensor parallelism, with the parallel loss's
 *             row statistics (B,T,3)); losses (B,T); tokens and targets (int32)
 *   backward: dres (the residual stream's gradient), dbuf_c, dbuf_3c,
 *             dbuf_4c (GELU's input gradient: fc2's input gradient with
 *             GELU's backward folded into the product), the
 *             attention's scratch, the layer norms' partial sums
 *             (ln_scratch), and the encoder's token buckets (tok_order,
 *             tok_starts: td_encoder_buckets on the host, copied up)
 * and in pinned host memory the tokens, targets and per-position losses, so
 * that their copies are asynchronous.
 *
 * The loss: the fused softmax-cross-entropy writes each position's loss and
 * turns the logits into their gradient in place (at dloss 1; backward with
 * another loss_scale recomputes the logits and runs it again at that scale);
 * the mean over positions is summed on the host in double, in position order. predict() after a forward with
 * targets recomputes the logits from lnf (one product) since the fused
 * kernel overwrote them; a backward after that predict does nothing.
 *
 * Both forward and backward return with their work done (the loss is on the
 * host; the gradients in device memory), so the engine may read the arenas
 * on any stream.
 *
 * Products: through td_cuda_matmul_forward_ex where an epilogue saves a
 * pass: the attention and MLP projections add the residual stream in the
 * product's epilogue, and the MLP's first product applies bias and GELU
 * there, writing the pre-GELU input (fch) backward needs beside it.
 *
 * Activation checkpointing (set_activation_checkpointing, as gpt.c): the
 * per-layer buffers (ln1 .. fch_gelu and their statistics, the attention
 * cache) then exist for one layer only, slot 0, and forward keeps each
 * block's output res3 (the next block's input) for every layer. Backward
 * recomputes block l from its input into the slot before differentiating
 * it: the same launches on the same inputs, so the same bits as without
 * checkpointing, for one more forward of the blocks.
 *
 * Attention: the fused (flash-style) kernels where td_cuda_attention_fused
 * picks them for the head size (TANDEM_CUDA_ATTENTION), else the unfused
 * pair, whose (B, NH, T, T) weights per layer cost far more memory.
 *
 * Sharded parameters (ZeRO stage 3: td_model.param_access set by the
 * engine): forward and backward fetch each group before its kernels and
 * release it after, the groups and order of gpt.c (the embeddings, each
 * block, the final layernorm with the head, and the tied head's wte again;
 * backward needs no embeddings), each group through the base pointer its
 * fetch returned. A release first waits for the model's stream: the
 * engine may refill the group's memory as soon as it is released, and the
 * kernels reading it are queued, not done. A fetch that returns NULL (the
 * engine's failure) ends the pass as a failed launch does. Under tensor
 * parallelism the groups are cut from the shard's table (offsets and end):
 * each tensor rank fetches its own shard's groups from its data-parallel
 * owners, which hold shards of that arena.
 *
 * Pipeline stages (td_gpt_stage_create_on; gpt.c's stage, nn_gpt_layout
 * says which tensors it holds): the same launches for its blocks only, the
 * encoder on the first stage, the final layernorm, head and loss on the
 * last. A later stage's forward copies its input (B, T, C) f32 from the host
 * through the pinned h_in into `encoded`; a stage without the head ends its
 * forward by copying the last block's output to the pinned h_out
 * (td_gpt_stage_output), and its backward starts from the output's gradient
 * (td_gpt_stage_set_output_grad, through h_in into dres) where the whole
 * model has it; a stage without the embeddings ends its backward by copying
 * dres, its input's gradient, to h_out (td_gpt_stage_input_grad). So a chain
 * of stages runs the whole model's launches in its order on exact copies:
 * its bits. The exchanges are of the model's type (f32, or bf16 after
 * td_gpt_set_device_dtype: the bf16 values the next kernels read).
 *
 * Tensor parallelism (td_gpt_set_tensor_split; src/parallel's
 * td_gpt_tp_create_on): the arenas follow the shard's table (`tab`), and the
 * blocks compute tensor rank tr of tp: qkv's rows of heads [tr NH/tp, ...)
 * (column-parallel: the attention runs on C/tp channels, NH/tp heads), the
 * attention projection over those C/tp input columns and the MLP's 4C/tp
 * features (fc column-parallel, its projection row-parallel). Each
 * row-parallel product leaves the epilogue's residual add and writes its
 * partial sum (tensor rank 0's with the bias), which the split's allreduce
 * sums in place before the residual is added; each column-parallel
 * product's input gradient is summed so before its LayerNorm's backward.
 * The stream is synchronized before each (the collective reads the device
 * buffer when called). The token embedding and the head are
 * vocabulary-parallel (split.vocab_lo/vocab_count: rows [v0, v0 + Vl) of
 * wte and of an untied head; vocab_parallel.cu): the lookup writes this
 * rank's rows and zeros for the other ranks' tokens, summed over the group
 * before wpe is added (exact: one nonzero term, so one rank's bits); the
 * head's logits are (B*T, Vl) and the loss Megatron's parallel
 * cross-entropy (loss_forward: the row max allreduced with MAX, the sums
 * of exponentials and the target's logit with SUM; the whole logits are
 * never formed); the head's input gradient is summed over the group like a
 * column-parallel product's; the embedding's backward adds into its rows
 * only. predict's argmax combines the ranks' (MAX, then MIN of the index).
 * The LayerNorms and wpe run whole, and their gradients come out equal on
 * every rank.
 *
 * Sequence parallelism (split.sequence_parallel; Megatron-LM's, as
 * src/parallel/tensor/gpt_tp.c does it on the CPU): the residual stream,
 * the LayerNorms and the embedding's output keep rows [tr R, (tr+1) R) of
 * the B*T, R = B*T/tp (encoded, ln1, res2, ln2, res3, lnf, dres and their
 * statistics: the activations that shrink). Each LayerNorm output is
 * allgathered into `gathered` before its column-parallel product (again in
 * backward for the weight gradient: one whole-row buffer, not L); each
 * row-parallel product's partial sums (all B*T rows, in dbuf_c) are
 * reduce-scattered into this rank's rows before the residual add; the
 * embedding's lookup likewise, then wpe of those rows' positions. In
 * backward dres is allgathered (dfull) before each row-parallel product
 * and the embedding, and each column-parallel input gradient
 * reduce-scattered (dloc); the LayerNorms' weight gradients, then partial,
 * are allreduced (dln) before they are added. The products, the attention
 * and the loss run on all B*T rows as without it.
 *
 * Errors: forward returns NaN with the launcher's message in
 * td_last_error(); backward cannot return one, so it stops at the first
 * failure, logs it, and the next forward returns NaN with the same message. */
#include "nn/cuda/cuda_layers.h"
#include "nn/nn_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { P_LN1W, P_LN1B, P_QKVW, P_QKVB, P_PROJW, P_PROJB, P_LN2W, P_LN2B, P_FCW, P_FCB, P_FC2W, P_FC2B, P_PER_LAYER };

typedef struct cuda_acts {
  int B; /* sized for; T is the config's seq */
  /* of the model's dtype (bytes: element i of x is x + i * es) */
  char *encoded, *ln1, *qkv, *atty, *res2, *ln2, *fch, *fch_gelu, *res3, *lnf, *logits;
  char *dres, *dbuf_c, *dbuf_3c, *dbuf_4c;
  /* sequence parallelism only: a LayerNorm output's whole rows (gathered),
   * dres's whole rows (dfull), a column-parallel input gradient's local rows
   * (dloc), one LayerNorm's partial weight and bias gradients (dln) */
  char *gathered, *dfull, *dloc, *dln;
  /* always f32 */
  float *ln1_mean, *ln1_rstd, *attc, *ln2_mean, *ln2_rstd, *lnf_mean, *lnf_rstd, *losses, *att_scratch;
  float *ln_scratch; /* the layer norms' backward partials (td_cuda_layernorm_backward) */
  float *xent_stats; /* the parallel cross-entropy's row max (BT), then (sum exp, target) pairs (2 BT) */
  int32_t *tokens, *targets;
  int32_t *tok_order, *tok_starts; /* the tokens' buckets for the encoder's backward (td_encoder_buckets) */
  void *memory; /* the device block all of the above point into */
  size_t bytes;
  /* pinned host staging */
  int32_t *h_tokens, *h_targets;
  int32_t *h_order, *h_starts; /* td_encoder_buckets' output, on its way up */
  int32_t *h_counts;           /* its V counters (plain host memory, zero between calls) */
  float *h_losses;
  /* a pipeline stage's (B, T, C) exchanges with the host: h_in takes a later
   * stage's input activations and a stage's output gradient on their way in,
   * h_out the output activations and the input's gradient on their way out
   * (read by the pipeline until the stage's next forward or backward) */
  float *h_in, *h_out;
} cuda_acts;

typedef struct gpt_cuda {
  td_device dev;
  td_stream *stream;
  td_event *ready_event; /* recorded after a group of gradients (flush_ready) */
  nn_gpt_layout lay;          /* where its tensors are (a pipeline stage holds some of the model's) */
  int stage;                  /* a pipeline stage (not the whole model): activations cross to the host */
  td_dtype dtype;             /* of params, grads and activations: TD_F32 or TD_BF16 (td_gpt_set_device_dtype) */
  size_t es;                  /* its size in bytes */
  int fused_attention;        /* td_cuda_attention_fused for this head size */
  int attention_flags;        /* td_cuda_attention_backward_flags: its scratch and its backward */
  int attention_fwd_flags;    /* td_cuda_attention_forward_flags: its forward */
  int ckpt;                   /* activation checkpointing: the per-layer buffers hold one layer (slot 0) */
  cuda_acts acts;
  int last_B;
  const void *last_params; /* the last forward's (predict recomputes the logits with them) */
  int have_targets;   /* the last forward had targets: logits hold dlogits */
  td_status error;    /* sticky failure of a backward (see the file comment) */
  char error_msg[512];
  /* tensor parallelism (td_gpt_set_tensor_split): rank tr of tp; the
   * table the arenas follow (the model's own, or the shard's); the
   * vocabulary rows [v0, v0 + Vl) of wte and the head (vsplit: fewer than
   * the whole vocabulary, so the embedding and the loss are vocabulary-parallel) */
  int tp, tr;
  int v0, Vl, vsplit;
  const td_param_tensor *tab;
  size_t n_params; /* the elements `tab` lays out (the shard's under tensor parallelism) */
  td_status (*allreduce)(void *ctx, void *buf, size_t count, td_dtype dtype, td_op op);
  void *allreduce_ctx;
  /* sequence parallelism (split.sequence_parallel): the residual stream's
   * rows [tr R, (tr+1) R), R = B*T/tp, on this rank; the split's collectives */
  int sp;
  td_status (*allgather)(void *ctx, const void *local, void *whole, size_t count, td_dtype dtype);
  td_status (*reduce_scatter)(void *ctx, const void *whole, void *local, size_t count, td_dtype dtype);
} gpt_cuda;

static gpt_cuda *state(td_model *model) { return *nn_gpt_device_state(model); }

/* This rank's widths under tensor parallelism (the whole model's at tp 1):
 * attention channels C/tp (its heads NH/tp), MLP features 4C/tp. */
static int width_att(const gpt_cuda *gc, const td_gpt_config *c) { return c->channels / gc->tp; }
static int heads_local(const gpt_cuda *gc, const td_gpt_config *c) { return c->heads / gc->tp; }
static int width_mlp(const gpt_cuda *gc, const td_gpt_config *c) { return 4 * c->channels / gc->tp; }

/* The sum over the tensor group of a device buffer the stream wrote (in
 * place): the stream first, since the collective reads it when called. */
static td_status group_reduce(gpt_cuda *gc, void *buf, size_t count, td_dtype dtype, td_op op) {
  TD_CHECK(td_stream_sync(gc->stream));
  return gc->allreduce(gc->allreduce_ctx, buf, count, dtype, op);
}
static td_status tensor_allreduce(gpt_cuda *gc, void *buf, size_t count) {
  return group_reduce(gc, buf, count, gc->dtype, TD_SUM);
}

/* Sequence parallelism: the residual stream's rows on this rank (B*T/tp;
 * all B*T without it), and its collectives on the model's type: the
 * ranks' pieces of a (B*T, C) buffer gathered whole, and a whole buffer's
 * sum over the group scattered into the pieces. */
static int rows_local(const gpt_cuda *gc, int BT) { return gc->sp ? BT / gc->tp : BT; }
static td_status gather_rows(gpt_cuda *gc, const void *local, void *whole, int BT, int C) {
  TD_CHECK(td_stream_sync(gc->stream));
  return gc->allgather(gc->allreduce_ctx, local, whole, (size_t)BT * C, gc->dtype);
}
static td_status scatter_rows(gpt_cuda *gc, const void *whole, void *local, int BT, int C) {
  TD_CHECK(td_stream_sync(gc->stream));
  return gc->reduce_scatter(gc->allreduce_ctx, whole, local, (size_t)BT * C, gc->dtype);
}
/* The whole rows of a LayerNorm output for a column-parallel product: the
 * buffer itself, or with sp its pieces gathered into acts.gathered. */
static td_status whole_rows(gpt_cuda *gc, const void *local, int BT, int C, const void **whole) {
  *whole = local;
  if (!gc->sp) return TD_OK;
  *whole = gc->acts.gathered;
  return gather_rows(gc, local, gc->acts.gathered, BT, C);
}

/* Offset (elements) of tensor `which` of block l (this model's, 0 ..
 * n_layers - 1), and of table entry i, from the CPU model's table (gpt.c's
 * order: wte, wpe, 12 per block, ln_f.weight, ln_f.bias, lm_head.weight
 * unless tied; a stage holds a slice of it, nn_gpt_layout says where). */
static size_t off_layer(const td_model *m, int l, int which) {
  const gpt_cuda *g = *nn_gpt_device_state((td_model *)m);
  return g->tab[g->lay.idx_layer0 + l * P_PER_LAYER + which].offset;
}
static const td_param_tensor *table(const td_model *m) {
  return ((const gpt_cuda *)*nn_gpt_device_state((td_model *)m))->tab;
}
static size_t off_named(const td_model *m, int i) { return table(m)[i].offset; }
/* element `off` of an arena of the model's dtype */
#define AT(arena, off) ((char *)(arena) + (size_t)(off) * gc->es)
/* layer l's slice of a per-layer activation of `width` channels (slot 0
 * for every layer under checkpointing: `slot` is l or 0) */
#define ACT(buf, width) (a->buf + (size_t)slot * sBT * (width) * gc->es)
/* the same for the residual stream's (R, C) buffers (R = B*T/tp with sequence parallelism) */
#define ACTR(buf) (a->buf + (size_t)slot * sR * C * gc->es)

/* The attention cache per layer: (B, NH, T, T) unfused, (B, NH, T) fused. */
static size_t att_cache_floats(const gpt_cuda *gc, const td_gpt_config *c, int B) {
  size_t bnh_t = (size_t)B * heads_local(gc, c) * c->seq;
  return gc->fused_attention ? bnh_t : bnh_t * c->seq;
}

/* dln's bias half starts ln_pad(C) elements in, on a 512-byte boundary as the arena's buffers do */
static size_t ln_pad(size_t C) { return (C + 127) & ~(size_t)127; }

/* Lay out (or, with base NULL, size) the device block. Every buffer starts
 * on a 256-byte boundary, as cudaMalloc's own do. */
static size_t acts_plan(cuda_acts *a, const gpt_cuda *gc, const td_gpt_config *c, int B, char *base) {
  /* L: layers of the buffers backward reads per layer (one slot, recomputed,
   * under checkpointing); res3, the block outputs, for every layer */
  const int n_layers = gc->lay.n_layers;
  const size_t L = gc->ckpt && n_layers > 0 ? 1 : (size_t)n_layers, L_res = (size_t)n_layers;
  /* a stage without the head has no logits; under vocabulary parallelism
   * this rank's Vl columns of them, and the loss's row statistics */
  const size_t C = (size_t)c->channels, V = gc->lay.has_head ? (size_t)gc->Vl : 0, es = gc->es;
  const size_t stats = gc->lay.has_head && gc->vsplit ? 3 : 0;
  const size_t BT = (size_t)B * c->seq, att = att_cache_floats(gc, c, B);
  const size_t Ca = (size_t)width_att(gc, c), F = (size_t)width_mlp(gc, c); /* C and 4C at tp 1 */
  /* R: the residual stream's rows (B*T/tp with sequence parallelism); SP:
   * its whole-row copies and partial gradients exist only then */
  const size_t R = (size_t)rows_local(gc, (int)BT), SP = gc->sp ? 1 : 0;
  size_t off = 0;
#define TAKE(ptr, type, count)                                         \
  do {                                                                 \
    (ptr) = base ? (type *)(base + off) : NULL;                        \
    off += (((size_t)(count) * sizeof(type)) + 255) & ~(size_t)255;    \
  } while (0)
  TAKE(a->encoded, char, R * C * es);
  TAKE(a->ln1, char, L * R * C * es);
  TAKE(a->ln1_mean, float, L * R);
  TAKE(a->ln1_rstd, float, L * R);
  TAKE(a->qkv, char, L * BT * 3 * Ca * es);
  TAKE(a->atty, char, L * BT * Ca * es);
  TAKE(a->attc, float, L * att);
  TAKE(a->res2, char, L * R * C * es);
  TAKE(a->ln2, char, L * R * C * es);
  TAKE(a->ln2_mean, float, L * R);
  TAKE(a->ln2_rstd, float, L * R);
  TAKE(a->fch, char, L * BT * F * es);
  TAKE(a->fch_gelu, char, L * BT * F * es);
  TAKE(a->res3, char, L_res * R * C * es);
  TAKE(a->lnf, char, R * C * es);
  TAKE(a->lnf_mean, float, R);
  TAKE(a->lnf_rstd, float, R);
  TAKE(a->logits, char, BT * V * es);
  TAKE(a->losses, float, BT);
  TAKE(a->xent_stats, float, stats * BT);
  TAKE(a->dres, char, R * C * es);
  TAKE(a->gathered, char, SP * BT * C * es);
  TAKE(a->dfull, char, SP * BT * C * es);
  TAKE(a->dloc, char, SP * R * C * es);
  TAKE(a->dln, char, SP * (ln_pad(C) + C) * es);
  TAKE(a->dbuf_c, char, BT * C * es);
  TAKE(a->dbuf_3c, char, BT * 3 * Ca * es);
  TAKE(a->dbuf_4c, char, BT * F * es);
  /* the fused backward's scratch (D; the one-pass backward's dQ parts);
   * the unfused one's is the size of its cache */
  TAKE(a->att_scratch, float,
       gc->fused_attention ? td_cuda_flash_attention_backward_scratch_floats(B, c->seq, (int)Ca, heads_local(gc, c),
                                                                             gc->attention_flags)
                           : att);
  TAKE(a->ln_scratch, float, td_cuda_layernorm_backward_scratch_floats((int)BT, (int)C));
  TAKE(a->tokens, int32_t, BT);
  TAKE(a->targets, int32_t, BT);
  TAKE(a->tok_order, int32_t, gc->lay.has_embed ? BT : 0);
  TAKE(a->tok_starts, int32_t, gc->lay.has_embed ? BT + 1 : 0);
#undef TAKE
  return off;
}

static void acts_free(gpt_cuda *gc) {
  cuda_acts *a = &gc->acts;
  td_device_free(gc->dev, a->memory);
  td_host_free_pinned(a->h_tokens);
  td_host_free_pinned(a->h_targets);
  td_host_free_pinned(a->h_losses);
  td_host_free_pinned(a->h_order);
  td_host_free_pinned(a->h_starts);
  free(a->h_counts);
  td_host_free_pinned(a->h_in);
  td_host_free_pinned(a->h_out);
  memset(a, 0, sizeof *a);
}

/* The device block for `batch` with activations of type `compute` (TD_BF16
 * or f32), with or without activation checkpointing. */
static size_t gpt_cuda_activation_bytes(const td_model *model, int batch, int checkpointing, td_dtype compute) {
  gpt_cuda as = *(const gpt_cuda *)*nn_gpt_device_state((td_model *)model);
  as.es = compute == TD_BF16 ? 2 : sizeof(float);
  as.ckpt = checkpointing != 0;
  cuda_acts a;
  return batch > 0 ? acts_plan(&a, &as, nn_gpt_config(model), batch, NULL) : 0;
}

static td_status gpt_cuda_prepare(td_model *model, int batch) {
  gpt_cuda *gc = state(model);
  const td_gpt_config *c = nn_gpt_config(model);
  if (batch <= 0) return td_error(TD_ERR_INVALID_ARGUMENT, "gpt (cuda): micro-batch must be positive, got %d", batch);
  if (gc->acts.memory && gc->acts.B == batch) return TD_OK;
  /* the old buffers may still be read by queued work */
  TD_CHECK(td_stream_sync(gc->stream));
  acts_free(gc);
  cuda_acts *a = &gc->acts;
  size_t bytes = acts_plan(a, gc, c, batch, NULL);
  size_t BT = (size_t)batch * c->seq;
  td_status st = td_device_alloc(gc->dev, bytes, &a->memory);
  if (st == TD_OK) st = td_host_alloc_pinned(BT * sizeof(int32_t), (void **)&a->h_tokens);
  if (st == TD_OK) st = td_host_alloc_pinned(BT * sizeof(int32_t), (void **)&a->h_targets);
  if (st == TD_OK) st = td_host_alloc_pinned(BT * sizeof(float), (void **)&a->h_losses);
  if (st == TD_OK && gc->lay.has_embed) st = td_host_alloc_pinned(BT * sizeof(int32_t), (void **)&a->h_order);
  if (st == TD_OK && gc->lay.has_embed) st = td_host_alloc_pinned((BT + 1) * sizeof(int32_t), (void **)&a->h_starts);
  if (st == TD_OK && gc->lay.has_embed && !(a->h_counts = calloc((size_t)c->vocab, sizeof(int32_t))))
    st = td_error(TD_ERR_SYSTEM, "out of host memory for the encoder's %d token counters", c->vocab);
  if (st == TD_OK && gc->stage) st = td_host_alloc_pinned(BT * c->channels * gc->es, (void **)&a->h_in);
  if (st == TD_OK && gc->stage) st = td_host_alloc_pinned(BT * c->channels * gc->es, (void **)&a->h_out);
  if (st != TD_OK) {
    char msg[400];
    snprintf(msg, sizeof msg, "%s", td_last_error());
    acts_free(gc);
    return td_error(st, "gpt (cuda): activations for micro-batch %d (%.1f MiB): %s", batch,
                    (double)bytes / (1 << 20), msg);
  }
  acts_plan(a, gc, c, batch, a->memory);
  a->B = batch;
  a->bytes = bytes;
  model->activation_bytes = bytes;
  gc->last_B = 0;
  gc->have_targets = 0;
  return TD_OK;
}

/* Evaluate a launcher; on failure leave the function through `fail`. */
#define RUN(call)                    \
  do {                               \
    if ((call) != TD_OK) goto fail;  \
  } while (0)

/* ---- the parameter groups fetched under td_param_access (gpt.c's) ---- */
typedef struct gpt_unit {
  size_t offset, count;
} gpt_unit;
/* tensors: wte, wpe, 12 per layer, ln_f.weight, ln_f.bias, lm_head.weight
 * unless tied. Only the whole model fetches (a stage has no param_access);
 * a stage's units are its slice's all the same. */
static const nn_gpt_layout *layout(const td_model *m) {
  return &((const gpt_cuda *)*nn_gpt_device_state((td_model *)m))->lay;
}
static gpt_unit unit_emb(const td_model *m) {
  return layout(m)->has_embed ? (gpt_unit){0, off_named(m, layout(m)->idx_layer0)} : (gpt_unit){0, 0};
}
static gpt_unit unit_layer(const td_model *m, int l) {
  const int i = layout(m)->idx_layer0 + l * P_PER_LAYER; /* the block after the last: the table's next entry */
  size_t lo = off_named(m, i), hi = off_named(m, i + P_PER_LAYER);
  return (gpt_unit){lo, hi - lo};
}
static gpt_unit unit_final(const td_model *m) {
  size_t lo = off_named(m, layout(m)->idx_lnfw); /* no head: the end sentinel, an empty unit */
  return (gpt_unit){lo, ((const gpt_cuda *)*nn_gpt_device_state((td_model *)m))->n_params - lo};
}
static gpt_unit unit_wte(const td_model *m) {
  const int i = layout(m)->idx_wte;
  return i >= 0 ? (gpt_unit){off_named(m, i), table(m)[i].count} : (gpt_unit){0, 0};
}
static const gpt_unit unit_none = {0, 0};

/* The arena base to index group u's tensors with: params itself without
 * param_access; NULL when the engine's fetch failed (message set). */
static const char *fetch_unit(const td_model *m, const void *params, gpt_unit u, gpt_unit next) {
  const td_param_access *pa = m->param_access;
  if (!pa) return params;
  const float *base = pa->fetch(pa->ctx, u.offset, u.count, next.offset, next.count);
  if (!base)
    td_error(TD_ERR_SYSTEM, "gpt (cuda): fetching the parameters [%zu, %zu) failed (the training engine reports why)",
             u.offset, u.offset + u.count);
  return (const char *)base;
}
/* The kernels queued on the stream read the group: they finish before the
 * engine may refill its memory. */
static td_status release_unit(const td_model *m, gpt_cuda *gc, gpt_unit u) {
  const td_param_access *pa = m->param_access;
  if (!pa) return TD_OK;
  td_status st = td_stream_sync(gc->stream);
  pa->release(pa->ctx, u.offset, u.count);
  return st;
}
#define FETCH(base, u, next)                                           \
  do {                                                                 \
    if (!((base) = fetch_unit(model, params, (u), (next)))) goto fail; \
  } while (0)

/* The LM head's product: logits = lnf @ head^T, head read through `params`
 * (the arena base its group was fetched at). */
static td_status head_forward(td_model *model, const void *params) {
  gpt_cuda *gc = state(model);
  const td_gpt_config *c = nn_gpt_config(model);
  const int BT = gc->last_B * c->seq;
  const void *head = AT(params, off_named(model, gc->lay.idx_head)), *lnf;
  /* with sp lnf's pieces gathered: acts.gathered then holds the whole lnf until the next gather (backward's head) */
  TD_CHECK(whole_rows(gc, gc->acts.lnf, BT, c->channels, &lnf));
  return td_cuda_matmul_forward(gc->acts.logits, lnf, head, NULL, BT, c->channels, gc->Vl, gc->dtype,
                                td_stream_native(gc->stream));
}

/* The loss of the logits (BT, Vl) at `dloss`, in place: each position's
 * loss into losses, the logits turned into their gradient. Whole: the
 * fused kernel. Vocabulary-parallel (Megatron's vocab_parallel_cross_entropy):
 * the row max over the group (allreduce MAX), the sums of exponentials and
 * the target's logit from the rank that holds it (one allreduce SUM of the
 * pairs), then the loss and the gradient of this rank's columns; 3 BT f32
 * cross the group, never the logits. */
static td_status loss_forward(gpt_cuda *gc, int BT, float dloss) {
  cuda_acts *a = &gc->acts;
  void *s = td_stream_native(gc->stream);
  if (!gc->vsplit) return td_cuda_softmax_xent(a->losses, a->logits, a->targets, dloss, BT, gc->Vl, gc->dtype, s);
  float *row_max = a->xent_stats, *sums = a->xent_stats + BT;
  TD_CHECK(td_cuda_vocab_xent_max(row_max, a->logits, BT, gc->Vl, gc->dtype, s));
  TD_CHECK(group_reduce(gc, row_max, (size_t)BT, TD_F32, TD_MAX));
  TD_CHECK(td_cuda_vocab_xent_sums(sums, a->logits, row_max, a->targets, BT, gc->v0, gc->Vl, gc->dtype, s));
  TD_CHECK(group_reduce(gc, sums, 2 * (size_t)BT, TD_F32, TD_SUM));
  return td_cuda_vocab_xent_finish(a->losses, a->logits, row_max, sums, a->targets, dloss, BT, gc->v0, gc->Vl,
                                   gc->dtype, s);
}

/* A projection back into the residual stream: out = resid + inp @ w^T +
 * bias, the residual in the product's epilogue. Row-parallel under tensor
 * parallelism (Megatron's g): each rank's partial product over its input
 * columns, tensor rank 0's with the bias, summed over the group into out,
 * then the residual added; out may not alias resid then. */
static td_status row_forward(gpt_cuda *gc, void *out, const void *resid, const void *inp, const void *w,
                             const void *bias, int BT, int IC, int C) {
  void *s = td_stream_native(gc->stream);
  if (gc->tp == 1) return td_cuda_matmul_forward_ex(out, NULL, resid, inp, w, bias, BT, IC, C, gc->dtype, s);
  if (gc->sp) { /* the partial sums of all B*T rows in dbuf_c, reduce-scattered into this rank's rows of out */
    TD_CHECK(td_cuda_matmul_forward(gc->acts.dbuf_c, inp, w, gc->tr == 0 ? bias : NULL, BT, IC, C, gc->dtype, s));
    TD_CHECK(scatter_rows(gc, gc->acts.dbuf_c, out, BT, C));
    return td_cuda_residual_forward(out, out, resid, (size_t)rows_local(gc, BT) * C, gc->dtype, s);
  }
  TD_CHECK(td_cuda_matmul_forward(out, inp, w, gc->tr == 0 ? bias : NULL, BT, IC, C, gc->dtype, s));
  TD_CHECK(tensor_allreduce(gc, out, (size_t)BT * C));
  return td_cuda_residual_forward(out, out, resid, (size_t)BT * C, gc->dtype, s);
}

/* Block l's forward from its input `resid` (B, T, C) into the per-layer
 * buffers (slot 0 under checkpointing) and res3[l], the block's parameters
 * read through `pl` (the base its group was fetched at). Forward runs it
 * for every block; backward again under checkpointing. */
static td_status block_forward(td_model *model, const char *pl, int l, const char *resid, int B) {
  gpt_cuda *gc = state(model);
  const td_gpt_config *c = nn_gpt_config(model);
  const int C = c->channels, T = c->seq, BT = B * T;
  const int Ca = width_att(gc, c), NHl = heads_local(gc, c), F = width_mlp(gc, c); /* this rank's (tp) */
  const td_dtype dt = gc->dtype;
  cuda_acts *a = &gc->acts;
  void *s = td_stream_native(gc->stream);
  const int R = rows_local(gc, BT); /* the residual stream's and LayerNorms' rows here */
  const size_t sBT = (size_t)BT, sR = (size_t)R, att = att_cache_floats(gc, c, B), slot = gc->ckpt ? 0 : (size_t)l;
#define W(which) AT(pl, off_layer(model, l, (which)))
  char *ln1 = ACTR(ln1), *qkv = ACT(qkv, 3 * Ca), *atty = ACT(atty, Ca), *res2 = ACTR(res2), *ln2 = ACTR(ln2);
  char *fch = ACT(fch, F), *fch_gelu = ACT(fch_gelu, F), *res3 = a->res3 + (size_t)l * sR * C * gc->es;
  float *ln1_mean = a->ln1_mean + slot * sR, *ln1_rstd = a->ln1_rstd + slot * sR, *attc = a->attc + slot * att;
  float *ln2_mean = a->ln2_mean + slot * sR, *ln2_rstd = a->ln2_rstd + slot * sR;
  const void *whole; /* a LayerNorm output's whole rows (gathered with sp) */
  TD_CHECK(td_cuda_layernorm_forward(ln1, ln1_mean, ln1_rstd, resid, W(P_LN1W), W(P_LN1B), R, C, dt, s));
  TD_CHECK(whole_rows(gc, ln1, BT, C, &whole));
  TD_CHECK(td_cuda_matmul_forward(qkv, whole, W(P_QKVW), W(P_QKVB), BT, C, 3 * Ca, dt, s));
  if (gc->fused_attention)
    TD_CHECK(td_cuda_flash_attention_forward_ex(atty, attc, qkv, B, T, Ca, NHl, dt, gc->attention_fwd_flags, s));
  else
    TD_CHECK(td_cuda_attention_forward(atty, attc, qkv, B, T, Ca, NHl, dt, s));
  /* the products' epilogues (cuBLASLt's bias + residual, bias + GELU
   * keeping the pre-GELU input for backward): no separate pass over
   * (B, T, C) or (B, T, 4C) for the residual adds or the GELU, and one
   * rounding where the unfused pair rounds twice */
  TD_CHECK(row_forward(gc, res2, resid, atty, W(P_PROJW), W(P_PROJB), BT, Ca, C));
  TD_CHECK(td_cuda_layernorm_forward(ln2, ln2_mean, ln2_rstd, res2, W(P_LN2W), W(P_LN2B), R, C, dt, s));
  TD_CHECK(whole_rows(gc, ln2, BT, C, &whole));
  TD_CHECK(td_cuda_matmul_forward_ex(fch_gelu, fch, NULL, whole, W(P_FCW), W(P_FCB), BT, C, F, dt, s));
  TD_CHECK(row_forward(gc, res3, res2, fch_gelu, W(P_FC2W), W(P_FC2B), BT, F, C));
#undef W
  return TD_OK;
}

static float gpt_cuda_forward(td_model *model, const float *params, const void *inputs, const int32_t *targets,
                              int batch) {
  gpt_cuda *gc = state(model);
  const td_gpt_config *c = nn_gpt_config(model);
  const nn_gpt_layout *ly = &gc->lay;
  const int L = ly->n_layers, C = c->channels, T = c->seq, V = c->vocab;
  const int B = batch, BT = B * T;
  void *s = td_stream_native(gc->stream);
  if (!ly->has_head) targets = NULL; /* only the last pipeline stage has a loss */
  if (gc->error != TD_OK) {
    td_error(gc->error, "gpt (cuda): an earlier backward failed: %s", gc->error_msg);
    return NAN;
  }
  if (!gc->acts.memory || gc->acts.B != batch) {
    /* prepare() was not called for this batch size (as gpt.c: size now) */
    if (gpt_cuda_prepare(model, batch) != TD_OK) return NAN;
  }
  cuda_acts *a = &gc->acts;
  gc->last_B = 0;
  gc->have_targets = 0;
  /* tokens and targets are checked on the host: out of range would index
   * outside wte in the encoder (the kernels do not check) */
  const int32_t *tokens = ly->has_embed ? inputs : NULL; /* a later stage's inputs are activations */
  for (size_t i = 0; i < (size_t)BT; i++)
    if ((tokens && (uint32_t)tokens[i] >= (uint32_t)V) || (targets && (uint32_t)targets[i] >= (uint32_t)V)) {
      int bad_token = tokens && (uint32_t)tokens[i] >= (uint32_t)V;
      td_error(TD_ERR_INVALID_ARGUMENT, "gpt: %s %d at position %zu is outside the vocabulary [0, %d)",
               bad_token ? "token" : "target", bad_token ? tokens[i] : targets[i], i, V);
      return NAN;
    }
  /* the previous step's copies out of the staging buffers must be done */
  RUN(td_stream_sync(gc->stream));
  const size_t sBT = (size_t)BT;
  const int R = rows_local(gc, BT); /* the residual stream's rows here (a stage has sp off: all of them) */
  if (tokens) {
    memcpy(a->h_tokens, tokens, (size_t)BT * sizeof(int32_t));
    RUN(td_copy_async(a->tokens, a->h_tokens, (size_t)BT * sizeof(int32_t), gc->stream));
  } else { /* the previous stage's output (B, T, C) of the model's type, through pinned memory into encoded */
    memcpy(a->h_in, inputs, sBT * C * gc->es);
    RUN(td_copy_async(a->encoded, a->h_in, sBT * C * gc->es, gc->stream));
  }
  if (targets) {
    memcpy(a->h_targets, targets, (size_t)BT * sizeof(int32_t));
    RUN(td_copy_async(a->targets, a->h_targets, (size_t)BT * sizeof(int32_t), gc->stream));
  }

  const td_dtype dt = gc->dtype;
  const int tied = c->tied != 0;
  const char *pe, *pl, *pf, *pw;
  if (ly->has_embed) {
    FETCH(pe, unit_emb(model), L > 0 ? unit_layer(model, 0) : unit_final(model));
    const char *wte = AT(pe, off_named(model, ly->idx_wte)), *wpe = AT(pe, off_named(model, ly->idx_wpe));
    if (gc->sp) { /* as below, the sum reduce-scattered: this rank's rows of the positions, then their wpe */
      RUN(td_cuda_vocab_embedding_lookup(a->dbuf_c, a->tokens, wte, BT, C, gc->v0, gc->Vl, dt, s));
      RUN(scatter_rows(gc, a->dbuf_c, a->encoded, BT, C));
      RUN(td_cuda_position_add_rows(a->encoded, wpe, gc->tr * R, R, T, C, dt, s));
    } else if (gc->vsplit) { /* this rank's rows, zeros for the others' tokens, summed over the group; then wpe */
      RUN(td_cuda_vocab_embedding_lookup(a->encoded, a->tokens, wte, BT, C, gc->v0, gc->Vl, dt, s));
      RUN(tensor_allreduce(gc, a->encoded, sBT * C));
      RUN(td_cuda_position_add(a->encoded, wpe, B, T, C, dt, s));
    } else {
      RUN(td_cuda_encoder_forward(a->encoded, a->tokens, wte, wpe, B, T, C, dt, s));
    }
    RUN(release_unit(model, gc, unit_emb(model)));
  }
  const char *resid = a->encoded; /* (R, C): all B*T rows, or this rank's with sp */
  for (int l = 0; l < L; l++) {
    FETCH(pl, unit_layer(model, l), l + 1 < L ? unit_layer(model, l + 1) : unit_final(model));
    RUN(block_forward(model, pl, l, resid, B));
    resid = a->res3 + (size_t)l * R * C * gc->es;
    RUN(release_unit(model, gc, unit_layer(model, l)));
  }
  if (!ly->has_head) { /* a pipeline stage's output, the last block's, to the host for the next stage */
    RUN(td_copy_async(a->h_out, resid, sBT * C * gc->es, gc->stream));
    RUN(td_stream_sync(gc->stream));
    gc->last_B = B;
    gc->have_targets = 1; /* backward has its activations (and takes the output's gradient) */
    return 0.0f;
  }
  FETCH(pf, unit_final(model), tied ? unit_wte(model) : unit_none);
  pw = pf;
  if (tied) FETCH(pw, unit_wte(model), unit_none);
  const size_t lnf_w = off_named(model, ly->idx_lnfw), lnf_b = off_named(model, ly->idx_lnfb);
  RUN(td_cuda_layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, resid, AT(pf, lnf_w), AT(pf, lnf_b), R, C, dt,
                                s));
  gc->last_B = B;
  gc->last_params = params; /* predict() fetches again under param_access */
  RUN(head_forward(model, pw));
  RUN(release_unit(model, gc, unit_final(model)));
  if (tied) RUN(release_unit(model, gc, unit_wte(model)));
  if (!targets) {
    /* logits stay for predict() */
    RUN(td_stream_sync(gc->stream));
    return 0.0f;
  }
  RUN(loss_forward(gc, BT, 1.0f));
  RUN(td_copy_async(a->h_losses, a->losses, (size_t)BT * sizeof(float), gc->stream));
  RUN(td_stream_sync(gc->stream));
  double sum = 0.0;
  for (int i = 0; i < BT; i++) sum += a->h_losses[i];
  gc->have_targets = 1;
  return (float)(sum / BT);
fail:
  gc->last_B = 0;
  return NAN;
}

/* ready for tensor i of the table */
static void report(td_grad_ready_fn ready, void *ctx, const td_model *m, int i) {
  if (ready) ready(ctx, table(m)[i].offset, table(m)[i].count);
}

/* Gradients are reported once their kernels have finished, one group (a
 * block, the head, the embeddings) behind the launches: `idx` holds the
 * tensor indexes of the group being queued, in the order gpt.c reports
 * them; flush_ready records gc->ready_event after them and moves them to
 * `prev`, but first waits for the event recorded after the previous group
 * and reports that one. So the host waits for block l while block l - 1's
 * launches are already queued, and the device does not drain between the
 * blocks (a stream sync per block did: the launch queue emptied each time,
 * and the next block's launches started from an idle GPU). Same order, same
 * kernels: the same bits and the same report sequence as before. One event
 * suffices: it is re-recorded only after its last record was waited for. */
typedef struct pending_ready {
  int idx[P_PER_LAYER + 2], n;
  int prev[P_PER_LAYER + 2], n_prev; /* queued before gc->ready_event's last record */
} pending_ready;

static td_status flush_ready(gpt_cuda *gc, const td_model *m, pending_ready *p, td_grad_ready_fn ready, void *ctx) {
  if (!ready) {
    p->n = p->n_prev = 0;
    return TD_OK;
  }
  if (p->n_prev) {
    TD_CHECK(td_event_sync(gc->ready_event));
    for (int i = 0; i < p->n_prev; i++) report(ready, ctx, m, p->prev[i]);
    p->n_prev = 0;
  }
  if (p->n) {
    TD_CHECK(td_event_record(gc->ready_event, gc->stream));
    memcpy(p->prev, p->idx, sizeof(int) * (size_t)p->n);
    p->n_prev = p->n;
    p->n = 0;
  }
  return TD_OK;
}

/* The last groups, after the stream has been synchronized. */
static void flush_ready_done(const td_model *m, pending_ready *p, td_grad_ready_fn ready, void *ctx) {
  for (int i = 0; ready && i < p->n_prev; i++) report(ready, ctx, m, p->prev[i]);
  for (int i = 0; ready && i < p->n; i++) report(ready, ctx, m, p->idx[i]);
  p->n = p->n_prev = 0;
}

/* A column-parallel product's input gradient, whose partial sums over this
 * rank's columns are in dbuf_c (all B*T rows), summed over the tensor
 * group (Megatron's f backward): allreduced in place, or with sp
 * reduce-scattered into this rank's rows (dloc). *dout: the result. */
static td_status column_input_grad(gpt_cuda *gc, int BT, int C, const char **dout) {
  cuda_acts *a = &gc->acts;
  *dout = gc->sp ? a->dloc : a->dbuf_c;
  if (gc->tp == 1) return TD_OK;
  return gc->sp ? scatter_rows(gc, a->dbuf_c, a->dloc, BT, C) : tensor_allreduce(gc, a->dbuf_c, (size_t)BT * C);
}

/* LayerNorm backward on this rank's R rows into dres (+= its input
 * gradient) and the weight and bias gradients (+=). With sp those are
 * partial (this rank's rows): computed into dln, summed over the group
 * (only this pass's share: the arena accumulates micro-batches), then
 * added. */
static td_status ln_backward(gpt_cuda *gc, void *dw, void *db, const void *dout, const void *inp, const void *w,
                             const float *mean, const float *rstd, int R, int C) {
  cuda_acts *a = &gc->acts;
  void *s = td_stream_native(gc->stream);
  const td_dtype dt = gc->dtype;
  if (!gc->sp)
    return td_cuda_layernorm_backward(a->dres, dw, db, a->ln_scratch, dout, inp, w, mean, rstd, R, C, dt, s);
  const size_t n = ln_pad((size_t)C) + (size_t)C; /* the weight's C, padding, the bias's C */
  char *dlw = a->dln, *dlb = a->dln + ln_pad((size_t)C) * gc->es;
  TD_CHECK(td_memset0_async(a->dln, n * gc->es, gc->stream));
  TD_CHECK(td_cuda_layernorm_backward(a->dres, dlw, dlb, a->ln_scratch, dout, inp, w, mean, rstd, R, C, dt, s));
  TD_CHECK(tensor_allreduce(gc, a->dln, n));
  TD_CHECK(td_cuda_residual_forward(dw, dw, dlw, (size_t)C, dt, s));
  return td_cuda_residual_forward(db, db, dlb, (size_t)C, dt, s);
}

static void gpt_cuda_backward(td_model *model, const float *params, float *grads, float loss_scale,
                              td_grad_ready_fn ready, void *ctx) {
  gpt_cuda *gc = state(model);
  const td_gpt_config *c = nn_gpt_config(model);
  const nn_gpt_layout *ly = &gc->lay;
  const int L = ly->n_layers, C = c->channels, T = c->seq, V = c->vocab;
  const int Ca = width_att(gc, c), NHl = heads_local(gc, c), F = width_mlp(gc, c); /* this rank's (tp) */
  const int B = gc->last_B, BT = B * T;
  if (!gc->have_targets || B == 0 || gc->error != TD_OK) return; /* nothing to differentiate */
  gc->have_targets = 0; /* the logits' gradient is consumed below */
  cuda_acts *a = &gc->acts;
  void *s = td_stream_native(gc->stream);
  td_stream *st = gc->stream;
  const int R = rows_local(gc, BT); /* the residual stream's rows here */
  const size_t sBT = (size_t)BT, sR = (size_t)R, att = att_cache_floats(gc, c, B);
  const int tied = c->tied != 0;
  const int idx_lnfw = ly->idx_lnfw, idx_lnfb = ly->idx_lnfb, idx_head = ly->idx_head;
  const char *dln_in;         /* a LayerNorm output's gradient, summed over the group (this rank's rows) */
  const void *whole, *dwhole; /* a LayerNorm output's and dres's whole rows (gathered with sp) */
  const td_dtype dt = gc->dtype;
  const size_t es = gc->es;
  pending_ready pend = {.n = 0, .n_prev = 0};
  const char *pf, *pw, *pl;
  int n_buckets = 0;
  const gpt_unit after_final = L > 0 ? unit_layer(model, L - 1) : unit_none;
  if (ly->has_embed && !gc->vsplit) {
    /* the encoder's buckets (positions grouped by token), from the tokens
     * forward left in pinned memory: the host sorts them while the device
     * runs what is queued before it, and they go up behind it */
    n_buckets = td_encoder_buckets(a->h_tokens, BT, V, a->h_order, a->h_starts, a->h_counts);
    RUN(td_copy_async(a->tok_order, a->h_order, sBT * sizeof(int32_t), st));
    RUN(td_copy_async(a->tok_starts, a->h_starts, ((size_t)n_buckets + 1) * sizeof(int32_t), st));
  }
  if (!ly->has_head) {
    /* a pipeline stage before the last: the gradient of its output, from
     * the next stage through pinned memory, is d res3 of its last block */
    const float *dout = nn_gpt_stage_dout(model);
    if (!dout) {
      td_error(TD_ERR_INVALID_USAGE, "gpt (cuda): a pipeline stage's backward needs the gradient of its output "
                                     "(td_gpt_stage_set_output_grad)");
      goto fail;
    }
    memcpy(a->h_in, dout, sBT * C * es);
    RUN(td_copy_async(a->dres, a->h_in, sBT * C * es, st));
    goto blocks;
  }
  FETCH(pf, unit_final(model), tied ? unit_wte(model) : after_final);
  pw = pf;
  if (tied) FETCH(pw, unit_wte(model), after_final);

  /* loss -> logits (already their gradient at dloss 1) -> lm head -> final
   * layernorm. Another loss scale (fp16's) recomputes the logits and runs the
   * fused loss again at that scale: one more product, and the same single
   * rounding of the gradient as gpt.c's */
  if (loss_scale != 1.0f) {
    RUN(head_forward(model, pw));
    RUN(loss_forward(gc, BT, loss_scale));
  }
  /* lnf's whole rows: with sp, acts.gathered holds them since the last head_forward (forward's, or the one above) */
  RUN(td_cuda_matmul_backward_ex(a->dbuf_c, AT(grads, off_named(model, idx_head)), NULL, a->logits,
                                 gc->sp ? a->gathered : a->lnf, AT(pw, off_named(model, idx_head)), NULL, NULL,
                                 TD_CUDA_DINP_OVERWRITE, BT, C, gc->Vl, dt, s));
  if (!tied) pend.idx[pend.n++] = idx_head;
  /* the vocabulary-parallel head is column-parallel: its input gradient is the sum of the ranks' */
  dln_in = a->dbuf_c;
  if (gc->vsplit) RUN(column_input_grad(gc, BT, C, &dln_in));
  const char *last_res = L > 0 ? a->res3 + (size_t)(L - 1) * sR * C * es : a->encoded;
  RUN(td_memset0_async(a->dres, sR * C * es, st));
  RUN(ln_backward(gc, AT(grads, off_named(model, idx_lnfw)), AT(grads, off_named(model, idx_lnfb)), dln_in, last_res,
                  AT(pf, off_named(model, idx_lnfw)), a->lnf_mean, a->lnf_rstd, R, C));
  pend.idx[pend.n++] = idx_lnfb;
  pend.idx[pend.n++] = idx_lnfw;
  RUN(flush_ready(gc, model, &pend, ready, ctx));
  RUN(release_unit(model, gc, unit_final(model)));
  if (tied) RUN(release_unit(model, gc, unit_wte(model)));

blocks:
  for (int l = L - 1; l >= 0; l--) {
    FETCH(pl, unit_layer(model, l), l > 0 ? unit_layer(model, l - 1) : unit_none);
#define W(which) AT(pl, off_layer(model, l, (which)))
#define G(which) AT(grads, off_layer(model, l, (which)))
#define READY(which) (pend.idx[pend.n++] = ly->idx_layer0 + l * P_PER_LAYER + (which))
    const char *resid = l > 0 ? a->res3 + (size_t)(l - 1) * sR * C * es : a->encoded; /* block input */
    /* checkpointing: the block's activations recomputed into slot 0 */
    if (gc->ckpt) RUN(block_forward(model, pl, l, resid, B));
    const size_t slot = gc->ckpt ? 0 : (size_t)l;
    const char *ln1 = ACTR(ln1), *qkv = ACT(qkv, 3 * Ca), *atty = ACT(atty, Ca), *res2 = ACTR(res2);
    const char *ln2 = ACTR(ln2), *fch = ACT(fch, F), *fch_gelu = ACT(fch_gelu, F);
    const float *ln1_mean = a->ln1_mean + slot * sR, *ln1_rstd = a->ln1_rstd + slot * sR;
    const float *attc = a->attc + slot * att;
    const float *ln2_mean = a->ln2_mean + slot * sR, *ln2_rstd = a->ln2_rstd + slot * sR;
    /* MLP: res3 = res2 + fc2(gelu(fc(ln2(res2)))); dres holds d res3 (with
     * sp gathered whole for the row-parallel fc2). The input gradients
     * overwrite their scratch buffers (no zeroing pass); fc2's is GELU's
     * output gradient, and the product's epilogue applies gelu'(fch) to it:
     * dbuf_4c is d fch, the fc product's output gradient, and its column
     * sums, fc's bias gradient, come out of that epilogue too (DGELU_BGRAD),
     * so fc's own backward takes no dbias */
    dwhole = a->dres;
    if (gc->sp) {
      RUN(gather_rows(gc, a->dres, a->dfull, BT, C));
      dwhole = a->dfull;
    }
    RUN(td_cuda_matmul_backward_ex(a->dbuf_4c, G(P_FC2W), G(P_FC2B), dwhole, fch_gelu, W(P_FC2W), fch, G(P_FCB),
                                   TD_CUDA_DINP_OVERWRITE, BT, F, C, dt, s));
    READY(P_FC2B);
    READY(P_FC2W);
    RUN(whole_rows(gc, ln2, BT, C, &whole));
    RUN(td_cuda_matmul_backward_ex(a->dbuf_c, G(P_FCW), NULL, a->dbuf_4c, whole, W(P_FCW), NULL, NULL,
                                   TD_CUDA_DINP_OVERWRITE, BT, C, F, dt, s));
    READY(P_FCB);
    READY(P_FCW);
    /* column-parallel (Megatron's f backward): the input gradient is the sum of the ranks' */
    RUN(column_input_grad(gc, BT, C, &dln_in));
    /* dres becomes d res2: the skip path plus the layernorm's input gradient */
    RUN(ln_backward(gc, G(P_LN2W), G(P_LN2B), dln_in, res2, W(P_LN2W), ln2_mean, ln2_rstd, R, C));
    READY(P_LN2B);
    READY(P_LN2W);
    /* attention: res2 = resid + proj(attn(qkv(ln1(resid)))) */
    if (gc->sp) {
      RUN(gather_rows(gc, a->dres, a->dfull, BT, C));
      dwhole = a->dfull;
    }
    RUN(td_cuda_matmul_backward_ex(a->dbuf_c, G(P_PROJW), G(P_PROJB), dwhole, atty, W(P_PROJW), NULL, NULL,
                                   TD_CUDA_DINP_OVERWRITE, BT, Ca, C, dt, s));
    READY(P_PROJB);
    READY(P_PROJW);
    /* the attention's input gradient: written (fused), or accumulated into zeros (unfused) */
    if (gc->fused_attention) {
      RUN(td_cuda_flash_attention_backward_ex(a->dbuf_3c, a->att_scratch, a->dbuf_c, qkv, atty, attc, B, T, Ca, NHl,
                                              dt, TD_CUDA_DINP_OVERWRITE | gc->attention_flags, s));
    } else {
      RUN(td_memset0_async(a->dbuf_3c, sBT * 3 * Ca * es, st));
      RUN(td_cuda_attention_backward(a->dbuf_3c, a->att_scratch, a->dbuf_c, qkv, attc, B, T, Ca, NHl, dt, s));
    }
    RUN(whole_rows(gc, ln1, BT, C, &whole));
    RUN(td_cuda_matmul_backward_ex(a->dbuf_c, G(P_QKVW), G(P_QKVB), a->dbuf_3c, whole, W(P_QKVW), NULL, NULL,
                                   TD_CUDA_DINP_OVERWRITE, BT, C, 3 * Ca, dt, s));
    READY(P_QKVB);
    READY(P_QKVW);
    RUN(column_input_grad(gc, BT, C, &dln_in));
    RUN(ln_backward(gc, G(P_LN1W), G(P_LN1B), dln_in, resid, W(P_LN1W), ln1_mean, ln1_rstd, R, C));
    READY(P_LN1B);
    READY(P_LN1W);
    RUN(flush_ready(gc, model, &pend, ready, ctx));
    RUN(release_unit(model, gc, unit_layer(model, l)));
#undef W
#undef G
#undef READY
  }
  if (ly->has_embed) {
    char *dwte = AT(grads, off_named(model, ly->idx_wte)), *dwpe = AT(grads, off_named(model, ly->idx_wpe));
    dwhole = a->dres; /* with sp its whole rows: every rank then adds the same wpe gradient */
    if (gc->sp) {
      RUN(gather_rows(gc, a->dres, a->dfull, BT, C));
      dwhole = a->dfull;
    }
    if (gc->vsplit) { /* into this rank's rows only; wpe's whole, as every rank's dres is */
      RUN(td_cuda_vocab_embedding_backward(dwte, dwhole, a->tokens, BT, C, gc->v0, gc->Vl, dt, s));
      RUN(td_cuda_encoder_backward(NULL, dwpe, dwhole, a->tokens, NULL, NULL, 0, B, T, C, dt, s));
    } else {
      RUN(td_cuda_encoder_backward(dwte, dwpe, a->dres, a->tokens, a->tok_order, a->tok_starts, n_buckets, B, T, C,
                                   dt, s));
    }
    pend.idx[pend.n++] = ly->idx_wpe;
    pend.idx[pend.n++] = ly->idx_wte;
    RUN(flush_ready(gc, model, &pend, ready, ctx));
  } else { /* a later pipeline stage: the gradient of its input, dres, to the host for the previous stage */
    RUN(td_copy_async(a->h_out, a->dres, sBT * C * es, st));
  }
  /* the gradients are complete when backward returns, whatever stream the
   * caller reads them on next */
  RUN(td_stream_sync(gc->stream));
  flush_ready_done(model, &pend, ready, ctx);
  return;
fail:
  gc->error = TD_ERR_SYSTEM;
  snprintf(gc->error_msg, sizeof gc->error_msg, "%s", td_last_error());
  TD_WARN("gpt (cuda): backward failed: %s", gc->error_msg);
}

/* The argmax over the whole vocabulary of each position's logits: this
 * rank's columns' first maximum; under vocabulary parallelism then the
 * largest value over the group (allreduce MAX) and the smallest index
 * holding it (allreduce MIN), the unsplit model's first maximum. A rank
 * whose copy failed still joins both collectives (its peers wait in them). */
static void gpt_cuda_predict(td_model *model, int32_t *out) {
  gpt_cuda *gc = state(model);
  const td_gpt_config *c = nn_gpt_config(model);
  const int Vl = gc->Vl;
  const size_t n = (size_t)gc->last_B * c->seq;
  if (n == 0 || !gc->lay.has_head) return; /* a pipeline stage before the last has no logits */
  const size_t logit_bytes = (n * Vl * gc->es + 7) & ~(size_t)7; /* the statistics after them, aligned */
  char *host = malloc(logit_bytes + n * (2 * sizeof(float) + sizeof(int32_t)));
  if (!host) {
    TD_WARN("gpt (cuda): predict: out of host memory for %zu logits", n * Vl);
    for (size_t i = 0; i < n; i++) out[i] = -1;
    return;
  }
  float *best = (float *)(host + logit_bytes), *mine = best + n;
  int32_t *index = (int32_t *)(mine + n);
  /* predict cannot fail either: on an error the predictions are -1 */
  td_status st = TD_OK;
  if (gc->have_targets) {
    /* the fused loss overwrote the logits with their gradient: recompute
     * them from lnf with the last forward's parameters (so a backward after
     * predict has nothing to differentiate) */
    gc->have_targets = 0;
    /* under param_access, the head's group fetched again (every rank predicts alike) */
    gpt_unit u = c->tied ? unit_wte(model) : unit_final(model);
    const char *head = fetch_unit(model, gc->last_params, u, unit_none);
    st = head ? head_forward(model, head) : TD_ERR_SYSTEM;
    if (head) {
      td_status rst = release_unit(model, gc, u);
      if (st == TD_OK) st = rst;
    }
  }
  if (st == TD_OK)
    st = td_device_copy(host, (td_device){TD_DEVICE_CPU, 0}, gc->acts.logits, gc->dev, n * Vl * gc->es);
  for (size_t i = 0; i < n; i++) {
    best[i] = -INFINITY;
    index[i] = INT32_MAX;
    for (int v = 0; st == TD_OK && v < Vl; v++) {
      float x;
      if (gc->dtype == TD_BF16) {
        uint16_t h;
        memcpy(&h, host + (i * Vl + v) * 2, 2);
        x = td_bf16_to_f32(h);
      } else {
        memcpy(&x, host + (i * Vl + v) * 4, 4);
      }
      if (v == 0 || x > best[i]) best[i] = x, index[i] = gc->v0 + v;
    }
    mine[i] = best[i];
  }
  if (st != TD_OK) TD_WARN("gpt (cuda): predict: %s", td_last_error());
  td_status group = TD_OK;
  if (gc->vsplit) {
    group = gc->allreduce(gc->allreduce_ctx, best, n, TD_F32, TD_MAX);
    for (size_t i = 0; group == TD_OK && i < n; i++)
      if (mine[i] != best[i]) index[i] = INT32_MAX;
    if (group == TD_OK) group = gc->allreduce(gc->allreduce_ctx, index, n, TD_I32, TD_MIN);
    if (group != TD_OK) TD_WARN("gpt (cuda): predict: %s", td_last_error());
  }
  for (size_t i = 0; i < n; i++) out[i] = st == TD_OK && group == TD_OK && index[i] != INT32_MAX ? index[i] : -1;
  free(host);
}

static void gpt_cuda_destroy(td_model *model) {
  if (!model) return;
  gpt_cuda *gc = state(model);
  if (gc) {
    if (gc->stream) (void)td_stream_sync(gc->stream);
    acts_free(gc);
    td_event_destroy(gc->ready_event);
    td_stream_destroy(gc->stream);
    free(gc);
    *nn_gpt_device_state(model) = NULL;
  }
  nn_gpt_free_host(model);
}

static td_status gpt_cuda_set_activation_checkpointing(td_model *model, int on) {
  gpt_cuda *gc = state(model);
  if ((on != 0) == gc->ckpt) return TD_OK;
  /* the activations are laid out for the other setting: the next prepare
   * (or forward) lays them out again */
  TD_CHECK(td_stream_sync(gc->stream));
  acts_free(gc);
  model->activation_bytes = 0;
  gc->last_B = 0;
  gc->have_targets = 0;
  gc->ckpt = on != 0;
  return TD_OK;
}

static const td_model_ops gpt_cuda_ops = {
    .prepare = gpt_cuda_prepare,
    .forward = gpt_cuda_forward,
    .backward = gpt_cuda_backward,
    .predict = gpt_cuda_predict,
    .destroy = gpt_cuda_destroy,
    .set_activation_checkpointing = gpt_cuda_set_activation_checkpointing,
    .activation_bytes = gpt_cuda_activation_bytes,
    .set_device_dtype = nn_gpt_cuda_set_dtype,
};

td_status nn_gpt_cuda_attach(td_model *model, td_device dev) {
  const td_gpt_config *c = nn_gpt_config(model);
  gpt_cuda *gc = calloc(1, sizeof *gc);
  if (!gc) return td_error(TD_ERR_SYSTEM, "gpt (cuda): out of memory");
  gc->dev = dev;
  nn_gpt_layout_of(model, &gc->lay);
  gc->stage = !(gc->lay.has_embed && gc->lay.has_head && gc->lay.n_layers == c->layers);
  gc->dtype = TD_F32;
  gc->es = sizeof(float);
  gc->tp = 1;
  gc->Vl = c->vocab;
  gc->tab = model->tensors;
  gc->n_params = model->n_params;
  td_status st = td_cuda_attention_fused(c->channels / c->heads, &gc->fused_attention);
  if (st == TD_OK) st = td_cuda_attention_backward_flags(&gc->attention_flags);
  if (st == TD_OK) st = td_cuda_attention_forward_flags(&gc->attention_fwd_flags);
  if (st == TD_OK) st = td_stream_create(dev, &gc->stream);
  if (st == TD_OK) st = td_event_create(dev, &gc->ready_event);
  if (st != TD_OK) {
    td_stream_destroy(gc->stream);
    free(gc);
    return st;
  }
  *nn_gpt_device_state(model) = gc;
  model->ops = &gpt_cuda_ops;
  model->device = dev;
  /* ZeRO stage 3: the engine's fetches (see the file comment); not for a stage (gpt.c's rule) */
  model->supports_param_access = !gc->stage;
  return TD_OK;
}

const float *nn_gpt_cuda_stage_output(const td_model *model) {
  const gpt_cuda *gc = *nn_gpt_device_state((td_model *)model);
  return gc->stage && !gc->lay.has_head ? gc->acts.h_out : NULL;
}

const float *nn_gpt_cuda_stage_input_grad(const td_model *model) {
  const gpt_cuda *gc = *nn_gpt_device_state((td_model *)model);
  return gc->stage && !gc->lay.has_embed ? gc->acts.h_out : NULL;
}

td_status nn_gpt_cuda_set_dtype(td_model *model, td_dtype dtype) {
  gpt_cuda *gc = state(model);
  if (dtype != TD_F32 && dtype != TD_BF16)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_gpt_set_device_dtype: %s: a GPT on a GPU computes in f32 or bf16",
                    td_dtype_name(dtype));
  if (dtype == gc->dtype) return TD_OK;
  /* the activations are laid out for the old type: the next prepare (or
   * forward) lays them out again */
  TD_CHECK(td_stream_sync(gc->stream));
  acts_free(gc);
  model->activation_bytes = 0;
  gc->last_B = 0;
  gc->have_targets = 0;
  gc->dtype = dtype;
  gc->es = td_dtype_size(dtype);
  return TD_OK;
}

td_status nn_gpt_cuda_set_tensor_split(td_model *model, const td_gpt_tensor_split *split) {
  gpt_cuda *gc = state(model);
  const td_gpt_config *c = nn_gpt_config(model);
  const int p = split->size;
  if (p < 1 || split->rank < 0 || split->rank >= p || c->heads % p != 0 || !split->tensors ||
      (p > 1 && !split->allreduce))
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_gpt_set_tensor_split: rank %d of %d over %d heads (the heads must "
                    "split evenly; the table and, with 2 or more ranks, the allreduce given)", split->rank, p,
                    c->heads);
  const int whole = split->vocab_count == 0;
  if (!whole && (split->vocab_lo < 0 || split->vocab_count < 0 || split->vocab_lo + split->vocab_count > c->vocab ||
                 !split->allreduce))
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_gpt_set_tensor_split: vocabulary rows [%d, %d + %d) outside the "
                    "%d tokens (or no allreduce given); give a shard of [0, %d), or vocab_count 0 for the whole",
                    split->vocab_lo, split->vocab_lo, split->vocab_count, c->vocab, c->vocab);
  if (gc->acts.memory)
    return td_error(TD_ERR_INVALID_USAGE, "td_gpt_set_tensor_split: set it before the model's first prepare");
  if (split->sequence_parallel && (p < 2 || whole || !split->allgather || !split->reduce_scatter || c->seq % p != 0))
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_gpt_set_tensor_split: sequence parallelism needs 2 or more tensor "
                    "ranks, a vocabulary shard, the allgather and reduce-scatter, and a sequence length divisible "
                    "by them (%d ranks, sequence %d)", p, c->seq);
  if (split->sequence_parallel && gc->stage)
    return td_error(TD_ERR_INVALID_ARGUMENT, "sequence parallelism on a device runs on the whole model, not on "
                    "pipeline stages yet: drop --sequence-parallel or --pipeline-parallel there, or use the CPU");
  /* the fused attention takes the same head size: C/p over NH/p heads */
  gc->tp = p;
  gc->tr = split->rank;
  gc->tab = split->tensors;
  gc->n_params = split->n_params;
  gc->allreduce = split->allreduce;
  gc->allreduce_ctx = split->ctx;
  gc->v0 = whole ? 0 : split->vocab_lo;
  gc->Vl = whole ? c->vocab : split->vocab_count;
  gc->vsplit = gc->Vl < c->vocab;
  gc->sp = split->sequence_parallel != 0;
  gc->allgather = split->allgather;
  gc->reduce_scatter = split->reduce_scatter;
  /* ZeRO stage 3 (supports_param_access as attach set it): the groups are
   * cut from the shard's table, whose offsets the engine's fetches use */
  return TD_OK;
}
