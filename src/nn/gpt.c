/* The character-level GPT: GPT-2's architecture at small scale (llm.c's
 * train_gpt2.c is the model), with the layout of shared/peers/
 * torch_gpt_ddp.py so that benchmarks compare like with like: learned token
 * and position embeddings; L pre-norm blocks of layernorm -> attention
 * (qkv Linear(C, 3C), proj Linear(C, C)) -> residual, layernorm -> MLP
 * (Linear(C, 4C), GELU, Linear(4C, C)) -> residual; a final layernorm; an LM
 * head Linear(C, V, bias=False) or, when tied, wte itself.
 *
 * Parameters are laid out layer by layer in forward order (wte, wpe, h0.*,
 * h1.*, ..., ln_f, lm_head), so that backward, which walks the layers in
 * reverse, finishes arena ranges from the end towards the start: the ready
 * callback then reports a descending sequence of contiguous ranges, which
 * the training engine packs into buckets without reordering.
 *
 * Activation memory is sized by prepare() for a micro-batch; backward uses a
 * handful of scratch buffers reused across layers (the gradient of the
 * residual stream, one C-, one 3C- and one 4C-wide buffer) rather than one
 * gradient per activation, which keeps its memory traffic close to forward's.
 *
 * Activation checkpointing (set_activation_checkpointing): the per-layer
 * buffers (ln1 .. fch_gelu) then exist for one layer only ("slot" 0), and
 * forward keeps just each block's output res3, which is the next block's
 * input. Backward recomputes block l from its input into the slot before
 * differentiating it: the same kernels on the same inputs, so the same bits
 * as without checkpointing, for one more forward of the blocks.
 *
 * Pipeline stages (td_gpt_stage_create): the same model restricted to the
 * blocks [first_layer, first_layer + n) plus the embeddings on the first
 * stage and the final layernorm, head and loss on the last. A stage's
 * tensor table is the slice of the whole model's (same names, same initial
 * values: each tensor draws from the stream of its index in the whole
 * model); a tied last stage without the embeddings holds its own copy of
 * wte for the head. Inputs of a later stage are the previous stage's
 * output activations, (B, T, C) floats, copied into `encoded`, the buffer
 * the first block reads; backward starts from the gradient of the output
 * (td_gpt_stage_set_output_grad) in dres, where the whole model has it at
 * that point, and leaves the gradient of the input in dres. The kernels and
 * their order are the whole model's, so a chain of stages computes the
 * whole model's bits. */
#include "nn_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

enum { P_LN1W, P_LN1B, P_QKVW, P_QKVB, P_PROJW, P_PROJB, P_LN2W, P_LN2B, P_FCW, P_FCB, P_FC2W, P_FC2B, P_PER_LAYER };

typedef struct gpt_acts {
  int B, T; /* sized for */
  int ckpt; /* 1: the per-layer buffers below hold one layer (activation checkpointing) */
  float *encoded;  /* (B, T, C) */
  float *ln1;      /* (L, B, T, C) */
  float *ln1_mean; /* (L, B, T) */
  float *ln1_rstd; /* (L, B, T) */
  float *qkv;      /* (L, B, T, 3C) */
  float *atty;     /* (L, B, T, C) */
  float *att;      /* (L, B, NH, T, T) */
  float *res2;     /* (L, B, T, C): residual after attention */
  float *ln2;      /* (L, B, T, C) */
  float *ln2_mean; /* (L, B, T) */
  float *ln2_rstd; /* (L, B, T) */
  float *fch;      /* (L, B, T, 4C): gelu'(fc output), all that backward needs of it */
  float *fch_gelu; /* (L, B, T, 4C) */
  float *res3;     /* (L, B, T, C): residual after the MLP = block output */
  float *lnf;      /* (B, T, C) */
  float *lnf_mean; /* (B, T) */
  float *lnf_rstd; /* (B, T) */
  float *probs;    /* (B, T, V): logits, then softmax in place */
  /* backward scratch */
  float *dres;     /* (B, T, C): gradient of the residual stream */
  float *dbuf_c;   /* (B, T, C) */
  float *dbuf_3c;  /* (B, T, 3C) */
  float *dbuf_4c;  /* (B, T, 4C) */
  float *dlogits;  /* (B, T, V) */
  float *datt;     /* (T, T) */
  float *memory;   /* the one allocation all of the above point into */
  size_t bytes;    /* of memory */
  /* bf16 copies of the activations that bf16 products read (layers_bf16.c),
   * laid out as their f32 originals; allocated by the first forward at the
   * bf16 compute type (acts16_ensure) */
  int use16;          /* the last forward wrote them (backward reads them) */
  uint16_t *ln1_16;   /* (L, B, T, C) */
  uint16_t *atty_16;  /* (L, B, T, C) */
  uint16_t *ln2_16;   /* (L, B, T, C) */
  uint16_t *fchg_16;  /* (L, B, T, 4C): of fch_gelu */
  uint16_t *lnf_16;   /* (B, T, C) */
  uint16_t *memory16; /* the one allocation they point into */
  size_t bytes16;     /* of memory16 */
} gpt_acts;

typedef struct gpt_model {
  td_model base; /* first: td_model * casts to gpt_model * */
  td_gpt_config cfg;
  td_param_tensor *tensors;
  char (*names)[48];
  /* offsets (in floats) of each tensor, by index into tensors */
  int idx_wte, idx_wpe, idx_layer0, idx_lnfw, idx_lnfb, idx_head; /* idx_head = -1 when tied */
  gpt_acts acts;
  /* the last forward */
  int last_B, last_T;
  int32_t *tokens_copy;
  int32_t *targets_copy;
  int have_targets;
  char config_text[160]; /* td_model.config */
  int ckpt;              /* activation checkpointing asked for (set_activation_checkpointing) */
  void *device_state;    /* the device twin's (nn_gpt_device_state); NULL on the CPU */
  /* pipeline stage (td_gpt_stage_create); the whole model is the stage
   * {0, cfg.layers, embed 1, head 1} */
  int n_layers;           /* blocks held (cfg.layers is the whole model's, for the initializer) */
  int first_layer;        /* the whole model's index of block 0 here */
  int has_embed, has_head;
  int *global_idx;        /* each tensor's index in the whole model's table (its random stream) */
  td_gpt_config acts_cfg; /* what the activations are sized for: n_layers blocks, vocab 0 without the head */
  const float *dout_ext;  /* a stage without the head: the gradient of its output, for the next backward */
} gpt_model;

static const td_model_ops gpt_ops;

static size_t tensor_off(const gpt_model *g, int idx) { return g->tensors[idx].offset; }
static int layer_idx(const gpt_model *g, int l, int which) { return g->idx_layer0 + l * P_PER_LAYER + which; }

static void acts_free(gpt_acts *a) {
  td_free(a->memory16);
  td_free(a->memory);
  memset(a, 0, sizeof *a);
}

/* Ask for transparent huge pages over a large buffer (before it is first
 * touched). The activations (~75 MB at the reference config) are streamed
 * by every layer and by OpenBLAS's packing, which walks rows and columns
 * kilobytes apart: with 4 KiB pages most of those accesses miss the TLB.
 * A hint only: nothing changes where THP is off or the call fails. */
static void nn_advise_huge_pages(void *ptr, size_t bytes) {
#ifdef MADV_HUGEPAGE
  const uintptr_t huge = (uintptr_t)2 << 20;
  uintptr_t lo = ((uintptr_t)ptr + huge - 1) & ~(huge - 1), hi = ((uintptr_t)ptr + bytes) & ~(huge - 1);
  if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
#else
  (void)ptr, (void)bytes;
#endif
}

/* Lay the activation buffers out from `base` (NULL: only count); returns
 * the floats they take. */
static size_t acts_plan(gpt_acts *a, const td_gpt_config *c, int B, int T, int ckpt, float *base) {
  /* L: layers of the buffers backward reads per layer; with checkpointing
   * one slot, recomputed, and only res3 (the block outputs) for every layer */
  size_t L = ckpt && c->layers > 0 ? 1 : (size_t)c->layers, C = c->channels, NH = c->heads, V = c->vocab;
  size_t L_res = c->layers;
  size_t BT = (size_t)B * T;
  /* the final LayerNorm's outputs: only a model with the head (a pipeline
   * stage before the last has vocab 0 here) writes them */
  size_t H = V > 0;
  struct {
    float **ptr;
    size_t n;
  } plan[] = {
      {&a->encoded, BT * C},     {&a->ln1, L * BT * C},       {&a->ln1_mean, L * BT},   {&a->ln1_rstd, L * BT},
      {&a->qkv, L * BT * 3 * C}, {&a->atty, L * BT * C},      {&a->att, L * B * NH * T * T},
      {&a->res2, L * BT * C},    {&a->ln2, L * BT * C},       {&a->ln2_mean, L * BT},   {&a->ln2_rstd, L * BT},
      {&a->fch, L * BT * 4 * C}, {&a->fch_gelu, L * BT * 4 * C}, {&a->res3, L_res * BT * C}, {&a->lnf, H * BT * C},
      {&a->lnf_mean, H * BT},    {&a->lnf_rstd, H * BT},          {&a->probs, BT * V},      {&a->dres, BT * C},
      {&a->dbuf_c, BT * C},      {&a->dbuf_3c, BT * 3 * C},   {&a->dbuf_4c, BT * 4 * C}, {&a->dlogits, BT * V},
      {&a->datt, (size_t)T * T},
  };
  size_t total = 0;
  for (size_t i = 0; i < TD_ARRAY_SIZE(plan); i++) {
    if (base) *plan[i].ptr = base + total;
    total += (plan[i].n + 15) & ~(size_t)15; /* 64-byte aligned */
  }
  return total;
}

static td_status acts_alloc(gpt_acts *a, const td_gpt_config *c, int B, int T, int ckpt) {
  acts_free(a);
  size_t total = acts_plan(a, c, B, T, ckpt, NULL);
  a->memory = td_alloc(total * sizeof(float));
  if (!a->memory)
    return td_error(TD_ERR_SYSTEM, "gpt: out of memory for activations of micro-batch %d x %d (%zu MiB)", B, T,
                    total * sizeof(float) >> 20);
  nn_advise_huge_pages(a->memory, total * sizeof(float));
  acts_plan(a, c, B, T, ckpt, a->memory);
  a->B = B;
  a->T = T;
  a->ckpt = ckpt && c->layers > 0;
  a->bytes = total * sizeof(float);
  return TD_OK;
}

/* The bf16 copies' sizes (in elements, each 64-byte aligned) for B x T
 * tokens; returns their sum. */
static size_t acts16_plan(const td_gpt_config *c, size_t BT, int ckpt, size_t n[5]) {
  size_t L = ckpt && c->layers > 0 ? 1 : (size_t)c->layers, C = c->channels, total = 0;
  size_t sizes[5] = {L * BT * C, L * BT * C, L * BT * C, L * BT * 4 * C, c->vocab > 0 ? BT * C : 0}; /* lnf: the head's */
  for (int i = 0; i < 5; i++) total += n[i] = (sizes[i] + 31) & ~(size_t)31;
  return total;
}

/* At the bf16 compute type, the bf16 copies (allocated once per acts):
 * sets a->use16 to whether the forward about to run writes them. Out of
 * memory only costs speed (the products pack from f32 then). */
static void acts16_ensure(gpt_acts *a, const td_gpt_config *c) {
  a->use16 = 0;
  if (td_nn_compute_dtype() != TD_BF16) return;
  size_t n[5], total = acts16_plan(c, (size_t)a->B * a->T, a->ckpt, n);
  uint16_t **ptr[] = {&a->ln1_16, &a->atty_16, &a->ln2_16, &a->fchg_16, &a->lnf_16};
  if (!a->memory16) {
    a->memory16 = td_alloc(total * sizeof(uint16_t));
    if (!a->memory16) return;
    nn_advise_huge_pages(a->memory16, total * sizeof(uint16_t));
    a->bytes16 = total * sizeof(uint16_t);
    total = 0;
    for (size_t i = 0; i < TD_ARRAY_SIZE(n); i++) {
      *ptr[i] = a->memory16 + total;
      total += n[i];
    }
  }
  a->use16 = 1;
}

/* The f32 scratch of the portable half-precision product (nn_gemm_lowp,
 * td_nn_lowp_scratch_bytes), sized by the largest product of the step and
 * kept by the thread. At 512 channels and micro-batch 4 x 128 that is fc2's
 * 8 MiB: measured, an fp16 run's peak RSS was 9 MiB more than a bf16 run's
 * beyond their estimates before it was counted. */
static size_t gpt_lowp_scratch_bytes(const gpt_model *g, size_t BT, td_dtype compute) {
  const size_t C = (size_t)g->cfg.channels, V = (size_t)g->cfg.vocab;
  size_t n = 0;
  if (g->n_layers > 0) {
    const size_t shapes[4][2] = {{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}}; /* qkv, proj, fc, fc2 */
    for (int i = 0; i < 4; i++) n = TD_MAX(n, td_nn_lowp_scratch_bytes(compute, BT, shapes[i][0], shapes[i][1]));
  }
  if (g->has_head) n = TD_MAX(n, td_nn_lowp_scratch_bytes(compute, BT, C, V)); /* the LM head */
  return n;
}

/* What a compute thread keeps for the products (td_model_ops): the largest
 * of the layers' panels, the blocks' four linear layers and the head's
 * (C to V: its weight's gradient packs V rows). */
static size_t gpt_thread_scratch_bytes(const td_model *model, int batch) {
  const gpt_model *g = (const gpt_model *)model;
  const size_t C = (size_t)g->cfg.channels, V = (size_t)g->cfg.vocab, BT = (size_t)batch * g->cfg.seq;
  size_t n = 0;
  if (g->n_layers > 0) {
    const size_t shapes[4][2] = {{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}}; /* qkv, proj, fc, fc2 */
    for (int i = 0; i < 4; i++) n = TD_MAX(n, td_linear_scratch_bytes(BT, shapes[i][0], shapes[i][1]));
  }
  if (g->has_head) n = TD_MAX(n, td_linear_scratch_bytes(BT, C, V));
  return n;
}

static size_t gpt_activation_bytes(const td_model *model, int batch, int checkpointing, td_dtype compute) {
  const gpt_model *g = (const gpt_model *)model;
  gpt_acts scratch = {0};
  size_t n16[5], BT = (size_t)batch * g->cfg.seq;
  /* plus the bf16 copies at the bf16 compute type, the token and target
   * copies, and the half-precision products' scratch */
  return acts_plan(&scratch, &g->acts_cfg, batch, g->cfg.seq, checkpointing, NULL) * sizeof(float) +
         (compute == TD_BF16 ? acts16_plan(&g->acts_cfg, BT, checkpointing, n16) * sizeof(uint16_t) : 0) +
         2 * BT * sizeof(int32_t) + gpt_lowp_scratch_bytes(g, BT, compute);
}

static td_status gpt_prepare(td_model *model, int batch) {
  gpt_model *g = (gpt_model *)model;
  if (batch <= 0) return td_error(TD_ERR_INVALID_ARGUMENT, "gpt: micro-batch must be positive, got %d", batch);
  if (g->acts.memory && g->acts.B == batch && g->acts.T == g->cfg.seq && g->acts.ckpt == (g->ckpt && g->n_layers > 0))
    return TD_OK;
  TD_CHECK(acts_alloc(&g->acts, &g->acts_cfg, batch, g->cfg.seq, g->ckpt));
  g->base.activation_bytes = g->acts.bytes;
  free(g->tokens_copy);
  free(g->targets_copy);
  size_t n = (size_t)batch * g->cfg.seq;
  g->tokens_copy = malloc(n * sizeof(int32_t));
  g->targets_copy = malloc(n * sizeof(int32_t));
  if (!g->tokens_copy || !g->targets_copy) return td_error(TD_ERR_SYSTEM, "gpt: out of memory for token buffers");
  return TD_OK;
}

/* ---- parameter groups for sharded parameters (td_param_access) ----
 * The groups the model fetches, each a contiguous arena range: the
 * embeddings (wte, wpe), one transformer block, the final layernorm with the
 * LM head, and, when tied, wte again for the head. */
typedef struct gpt_unit {
  size_t offset, count;
} gpt_unit;

static gpt_unit unit_emb(const gpt_model *g) { return (gpt_unit){0, tensor_off(g, g->idx_layer0)}; }
static gpt_unit unit_layer(const gpt_model *g, int l) {
  size_t lo = tensor_off(g, layer_idx(g, l, 0)), hi = tensor_off(g, layer_idx(g, l + 1, 0));
  return (gpt_unit){lo, hi - lo};
}
static gpt_unit unit_final(const gpt_model *g) {
  size_t lo = tensor_off(g, g->idx_lnfw);
  return (gpt_unit){lo, g->base.n_params - lo};
}
static gpt_unit unit_wte(const gpt_model *g) { return (gpt_unit){0, g->tensors[g->idx_wte].count}; }
static const gpt_unit unit_none = {0, 0};

static const float *unit_fetch(const td_param_access *pa, const float *params, gpt_unit u, gpt_unit next) {
  return pa ? pa->fetch(pa->ctx, u.offset, u.count, next.offset, next.count) : params;
}
static void unit_release(const td_param_access *pa, gpt_unit u) {
  if (pa) pa->release(pa->ctx, u.offset, u.count);
}

/* Block l's forward from its input `resid` (B, T, C) into the layer's
 * buffers (slot 0 under checkpointing) and res3[l]. */
static void block_forward(gpt_model *g, gpt_acts *a, const float *params, int l, const float *resid, int B, int T) {
  const int C = g->cfg.channels, NH = g->cfg.heads;
  const int BT = B * T;
  /* layer-stride of activations: sized for a->T, used at T <= a->T */
  const size_t sBT = (size_t)a->B * a->T;
  const size_t s = a->ckpt ? 0 : (size_t)l; /* the slot of the per-layer buffers */
#define W(which) (params + tensor_off(g, layer_idx(g, l, (which))))
  float *ln1 = a->ln1 + s * sBT * C, *ln1_mean = a->ln1_mean + s * sBT, *ln1_rstd = a->ln1_rstd + s * sBT;
  float *qkv = a->qkv + s * sBT * 3 * C, *atty = a->atty + s * sBT * C;
  float *att = a->att + s * (size_t)a->B * NH * a->T * a->T;
  float *res2 = a->res2 + s * sBT * C, *ln2 = a->ln2 + s * sBT * C;
  float *ln2_mean = a->ln2_mean + s * sBT, *ln2_rstd = a->ln2_rstd + s * sBT;
  float *fch = a->fch + s * sBT * 4 * C, *fch_gelu = a->fch_gelu + s * sBT * 4 * C;
  float *res3 = a->res3 + (size_t)l * sBT * C;
  /* bf16 copies of ln1, atty, ln2, fch_gelu, written by their producers for the products (NULL: none) */
  uint16_t *ln1_16 = a->use16 ? a->ln1_16 + s * sBT * C : NULL, *atty_16 = a->use16 ? a->atty_16 + s * sBT * C : NULL;
  uint16_t *ln2_16 = a->use16 ? a->ln2_16 + s * sBT * C : NULL;
  uint16_t *fchg_16 = a->use16 ? a->fchg_16 + s * sBT * 4 * C : NULL;
  nn_layernorm_forward16(ln1, ln1_16, ln1_mean, ln1_rstd, resid, W(P_LN1W), W(P_LN1B), BT, C);
  nn_linear_forward16(qkv, NULL, NULL, NULL, ln1, ln1_16, W(P_QKVW), W(P_QKVB), BT, C, 3 * C);
  nn_attention_forward16(atty, atty_16, att, qkv, B, T, C, NH);
  nn_linear_forward16(res2, NULL, NULL, resid, atty, atty_16, W(P_PROJW), W(P_PROJB), BT, C, C);
  nn_layernorm_forward16(ln2, ln2_16, ln2_mean, ln2_rstd, res2, W(P_LN2W), W(P_LN2B), BT, C);
  nn_linear_forward16(fch_gelu, fchg_16, fch, NULL, ln2, ln2_16, W(P_FCW), W(P_FCB), BT, C, 4 * C);
  nn_linear_forward16(res3, NULL, NULL, res2, fch_gelu, fchg_16, W(P_FC2W), W(P_FC2B), BT, 4 * C, C);
#undef W
}

/* The forward pass on B sequences of T <= seq tokens into `a`. Returns the
 * mean loss when targets are given, else 0 (probs then hold the softmax).
 * pa: fetch each group of parameters before use (NULL: params is whole). */
static float gpt_forward_impl(gpt_model *g, gpt_acts *a, const float *params, const td_param_access *pa,
                              const int32_t *tokens, const int32_t *targets, int B, int T) {
  const int L = g->n_layers, C = g->cfg.channels, V = g->cfg.vocab;
  const int BT = B * T;
  const size_t sBT = (size_t)a->B * a->T;
  acts16_ensure(a, &g->acts_cfg);
  if (a == &g->acts) g->base.activation_bytes = a->bytes + a->bytes16;
  if (g->has_embed) { /* a later pipeline stage finds its input in encoded already */
    params = unit_fetch(pa, params, unit_emb(g), L > 0 ? unit_layer(g, 0) : unit_final(g));
    td_embedding_forward(a->encoded, tokens, params + tensor_off(g, g->idx_wte), params + tensor_off(g, g->idx_wpe),
                         B, T, C);
    unit_release(pa, unit_emb(g));
  }
  const float *resid = a->encoded; /* (B, T, C) */
  for (int l = 0; l < L; l++) {
    params = unit_fetch(pa, params, unit_layer(g, l), l + 1 < L ? unit_layer(g, l + 1) : unit_final(g));
    block_forward(g, a, params, l, resid, B, T);
    resid = a->res3 + (size_t)l * sBT * C;
    unit_release(pa, unit_layer(g, l));
  }
  if (!g->has_head) return 0.0f; /* the output is res3 of the last block (td_gpt_stage_output) */
  const int tied = g->idx_head < 0;
  params = unit_fetch(pa, params, unit_final(g), tied ? unit_wte(g) : unit_none);
  if (tied) params = unit_fetch(pa, params, unit_wte(g), unit_none);
  uint16_t *lnf_16 = a->use16 ? a->lnf_16 : NULL;
  nn_layernorm_forward16(a->lnf, lnf_16, a->lnf_mean, a->lnf_rstd, resid, params + tensor_off(g, g->idx_lnfw),
                         params + tensor_off(g, g->idx_lnfb), BT, C);
  const float *head = params + tensor_off(g, tied ? g->idx_wte : g->idx_head);
  nn_linear_forward16(a->probs, NULL, NULL, NULL, a->lnf, lnf_16, head, NULL, BT, C, V);
  unit_release(pa, unit_final(g));
  if (tied) unit_release(pa, unit_wte(g));
  if (targets) return td_softmax_xent_forward(a->probs, a->probs, targets, BT, V);
  return 0.0f;
}

static td_status gpt_check_inputs(const td_model *model, const void *inputs, const int32_t *targets, int batch) {
  const gpt_model *g = (const gpt_model *)model;
  /* a later pipeline stage's inputs are activations, and only the last has targets */
  const int32_t *tokens = g->has_embed ? inputs : NULL;
  if (!g->has_head) targets = NULL;
  const uint32_t V = (uint32_t)g->cfg.vocab;
  size_t n = (size_t)batch * (size_t)g->cfg.seq;
  for (size_t i = 0; i < n; i++) {
    if (tokens && (uint32_t)tokens[i] >= V)
      return td_error(TD_ERR_INVALID_ARGUMENT, "gpt: token %d at position %zu is outside the vocabulary [0, %u)",
                      tokens[i], i, V);
    if (targets && (uint32_t)targets[i] >= V)
      return td_error(TD_ERR_INVALID_ARGUMENT, "gpt: target %d at position %zu is outside the vocabulary [0, %u)",
                      targets[i], i, V);
  }
  return TD_OK;
}

static float gpt_forward(td_model *model, const float *params, const void *inputs, const int32_t *targets,
                         int batch) {
  gpt_model *g = (gpt_model *)model;
  if (!g->acts.memory || g->acts.B != batch) {
    /* prepare() was not called for this batch size: size now (the contract
     * asks callers to prepare; this keeps a forgotten call from crashing) */
    if (gpt_prepare(model, batch) != TD_OK) return NAN;
  }
  const int T = g->cfg.seq;
  size_t n = (size_t)batch * T;
  if (g->has_embed)
    memcpy(g->tokens_copy, inputs, n * sizeof(int32_t));
  else /* a later pipeline stage: the previous stage's output activations */
    memcpy(g->acts.encoded, inputs, n * (size_t)g->cfg.channels * sizeof(float));
  if (!g->has_head) targets = NULL; /* only the last stage has a loss */
  /* an out-of-range token would index outside wte: refuse it (NaN loss, message in td_last_error) */
  if (gpt_check_inputs(model, inputs, targets, batch) != TD_OK) {
    g->have_targets = 0;
    g->last_B = 0;
    return NAN;
  }
  g->have_targets = targets != NULL;
  if (targets) memcpy(g->targets_copy, targets, n * sizeof(int32_t));
  g->last_B = batch;
  g->last_T = T;
  /* without targets the logits stay in probs: predict() takes the same argmax */
  return gpt_forward_impl(g, &g->acts, params, g->base.param_access, g->tokens_copy, targets ? g->targets_copy : NULL,
                          batch, T);
}

static void report(td_grad_ready_fn ready, void *ctx, const gpt_model *g, int idx) {
  if (ready) ready(ctx, g->tensors[idx].offset, g->tensors[idx].count);
}

static void gpt_backward(td_model *model, const float *params, float *grads, float loss_scale, td_grad_ready_fn ready,
                         void *ctx) {
  gpt_model *g = (gpt_model *)model;
  gpt_acts *a = &g->acts;
  const int L = g->n_layers, C = g->cfg.channels, NH = g->cfg.heads, V = g->cfg.vocab;
  const int B = g->last_B, T = g->last_T, BT = B * T;
  const size_t sBT = (size_t)a->B * a->T;
  const int32_t *targets = g->targets_copy;
  const td_param_access *pa = g->base.param_access;
  if (!g->has_head) {
    /* a pipeline stage before the last: its output's gradient came from the next stage */
    if (!B || !g->dout_ext) return;
    memcpy(a->dres, g->dout_ext, (size_t)BT * C * sizeof(float));
    g->dout_ext = NULL;
    goto blocks;
  }
  if (!g->have_targets) return; /* nothing to differentiate */

  const int tied = g->idx_head < 0;
  gpt_unit after_final = L > 0 ? unit_layer(g, L - 1) : unit_none;
  params = unit_fetch(pa, params, unit_final(g), tied ? unit_wte(g) : after_final);
  if (tied) params = unit_fetch(pa, params, unit_wte(g), after_final);

  /* loss -> logits -> lm head -> final layernorm */
  nn_softmax_xent_backward_set(a->dlogits, a->probs, targets, loss_scale, BT, V);
  const float *head = g->idx_head >= 0 ? params + tensor_off(g, g->idx_head) : params + tensor_off(g, g->idx_wte);
  float *dhead = grads + (g->idx_head >= 0 ? tensor_off(g, g->idx_head) : tensor_off(g, g->idx_wte));
  nn_linear_backward16(a->dbuf_c, dhead, NULL, a->dlogits, a->lnf, a->use16 ? a->lnf_16 : NULL, head, NULL, BT, C, V);
  if (g->idx_head >= 0 || !g->has_embed) report(ready, ctx, g, g->idx_head >= 0 ? g->idx_head : g->idx_wte);
  const float *last_res = L > 0 ? a->res3 + (L - 1) * sBT * C : a->encoded;
  memset(a->dres, 0, (size_t)BT * C * sizeof(float));
  td_layernorm_backward(a->dres, grads + tensor_off(g, g->idx_lnfw), grads + tensor_off(g, g->idx_lnfb), a->dbuf_c,
                        last_res, params + tensor_off(g, g->idx_lnfw), a->lnf_mean, a->lnf_rstd, BT, C);
  report(ready, ctx, g, g->idx_lnfb);
  report(ready, ctx, g, g->idx_lnfw);
  unit_release(pa, unit_final(g));
  if (tied) unit_release(pa, unit_wte(g));

blocks:
  for (int l = L - 1; l >= 0; l--) {
    params = unit_fetch(pa, params, unit_layer(g, l), l > 0 ? unit_layer(g, l - 1) : unit_none);
#define W(which) (params + tensor_off(g, layer_idx(g, l, (which))))
#define G(which) (grads + tensor_off(g, layer_idx(g, l, (which))))
#define READY(which) report(ready, ctx, g, layer_idx(g, l, (which)))
    const float *resid = l > 0 ? a->res3 + (l - 1) * sBT * C : a->encoded; /* block input */
    /* checkpointing: recompute the block's activations into slot 0 */
    if (a->ckpt) block_forward(g, a, params, l, resid, B, T);
    const size_t s = a->ckpt ? 0 : (size_t)l;
    const float *ln1 = a->ln1 + s * sBT * C, *ln1_mean = a->ln1_mean + s * sBT, *ln1_rstd = a->ln1_rstd + s * sBT;
    const float *qkv = a->qkv + s * sBT * 3 * C, *atty = a->atty + s * sBT * C;
    const float *att = a->att + s * (size_t)a->B * NH * a->T * a->T;
    const float *res2 = a->res2 + s * sBT * C, *ln2 = a->ln2 + s * sBT * C;
    const float *ln2_mean = a->ln2_mean + s * sBT, *ln2_rstd = a->ln2_rstd + s * sBT;
    const float *fch = a->fch + s * sBT * 4 * C, *fch_gelu = a->fch_gelu + s * sBT * 4 * C;
    /* MLP: res3 = res2 + fc2(gelu(fc(ln2(res2)))); dres holds d res3 */
    /* dbuf_4c = d fc output: fc2's input gradient times gelu' (fch) */
    nn_linear_backward16(a->dbuf_4c, G(P_FC2W), G(P_FC2B), a->dres, fch_gelu, a->use16 ? a->fchg_16 + s * sBT * 4 * C : NULL,
                         W(P_FC2W), fch, BT, 4 * C, C);
    READY(P_FC2B);
    READY(P_FC2W);
    nn_linear_backward16(a->dbuf_c, G(P_FCW), G(P_FCB), a->dbuf_4c, ln2, a->use16 ? a->ln2_16 + s * sBT * C : NULL,
                         W(P_FCW), NULL, BT, C, 4 * C);
    READY(P_FCB);
    READY(P_FCW);
    /* dres becomes d res2: the skip path plus the layernorm's input gradient */
    td_layernorm_backward(a->dres, G(P_LN2W), G(P_LN2B), a->dbuf_c, res2, W(P_LN2W), ln2_mean, ln2_rstd, BT, C);
    READY(P_LN2B);
    READY(P_LN2W);
    /* attention: res2 = resid + proj(attn(qkv(ln1(resid)))) */
    nn_linear_backward16(a->dbuf_c, G(P_PROJW), G(P_PROJB), a->dres, atty, a->use16 ? a->atty_16 + s * sBT * C : NULL,
                         W(P_PROJW), NULL, BT, C, C);
    READY(P_PROJB);
    READY(P_PROJW);
    nn_attention_backward16(a->dbuf_3c, a->datt, a->dbuf_c, qkv, att, B, T, C, NH);
    nn_linear_backward16(a->dbuf_c, G(P_QKVW), G(P_QKVB), a->dbuf_3c, ln1, a->use16 ? a->ln1_16 + s * sBT * C : NULL,
                         W(P_QKVW), NULL, BT, C, 3 * C);
    READY(P_QKVB);
    READY(P_QKVW);
    td_layernorm_backward(a->dres, G(P_LN1W), G(P_LN1B), a->dbuf_c, resid, W(P_LN1W), ln1_mean, ln1_rstd, BT, C);
    READY(P_LN1B);
    READY(P_LN1W);
    unit_release(pa, unit_layer(g, l));
#undef W
#undef G
#undef READY
  }
  if (!g->has_embed) return; /* dres: the gradient of the input (td_gpt_stage_input_grad) */
  td_embedding_backward(grads + tensor_off(g, g->idx_wte), grads + tensor_off(g, g->idx_wpe), a->dres,
                        g->tokens_copy, B, T, C);
  report(ready, ctx, g, g->idx_wpe);
  report(ready, ctx, g, g->idx_wte);
}

static void gpt_predict(td_model *model, int32_t *out) {
  gpt_model *g = (gpt_model *)model;
  const int V = g->cfg.vocab;
  if (!g->has_head) return; /* a pipeline stage before the last has no logits */
  size_t n = (size_t)g->last_B * g->last_T;
  for (size_t i = 0; i < n; i++) {
    const float *row = g->acts.probs + i * V; /* probabilities or logits: same argmax */
    int best = 0;
    for (int v = 1; v < V; v++)
      if (row[v] > row[best]) best = v;
    out[i] = best;
  }
}

const td_gpt_config *nn_gpt_config(const td_model *model) { return &((const gpt_model *)model)->cfg; }
void **nn_gpt_device_state(td_model *model) { return &((gpt_model *)model)->device_state; }

static void gpt_destroy(td_model *model) {
  gpt_model *g = (gpt_model *)model;
  if (!g) return;
  acts_free(&g->acts);
  free(g->tokens_copy);
  free(g->targets_copy);
  free(g->tensors);
  free(g->names);
  free(g->global_idx);
  free(g);
}

void nn_gpt_free_host(td_model *model) { gpt_destroy(model); }

static td_status gpt_set_activation_checkpointing(td_model *model, int on) {
  ((gpt_model *)model)->ckpt = on != 0;
  return TD_OK;
}

static const td_model_ops gpt_ops = {
    .check_inputs = gpt_check_inputs,
    .set_activation_checkpointing = gpt_set_activation_checkpointing,
    .activation_bytes = gpt_activation_bytes,
    .thread_scratch_bytes = gpt_thread_scratch_bytes,
    .prepare = gpt_prepare,
    .forward = gpt_forward,
    .backward = gpt_backward,
    .predict = gpt_predict,
    .destroy = gpt_destroy,
};

static td_status gpt_check_config(const td_gpt_config *c) {
  if (c->vocab <= 0 || c->layers < 0 || c->channels <= 0 || c->heads <= 0 || c->seq <= 0)
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "gpt: vocab %d, layers %d, channels %d, heads %d, seq %d: all must be positive (layers >= 0)",
                    c->vocab, c->layers, c->channels, c->heads, c->seq);
  if (c->channels % c->heads != 0)
    return td_error(TD_ERR_INVALID_ARGUMENT, "gpt: channels (%d) must be divisible by heads (%d); try --heads %d",
                    c->channels, c->heads, c->channels % 4 == 0 ? 4 : 1);
  return TD_OK;
}

/* The model holding blocks [first_layer, first_layer + n_layers), with the
 * embeddings (embed) and the final layernorm and head (head): the whole
 * model is (0, layers, 1, 1). */
static td_status gpt_build(const td_gpt_config *c, int first_layer, int n_layers, int embed, int head,
                           td_model **out) {
  gpt_model *g = calloc(1, sizeof *g);
  if (!g) return td_error(TD_ERR_SYSTEM, "gpt: out of memory");
  g->cfg = *c;
  g->first_layer = first_layer;
  g->n_layers = n_layers;
  g->has_embed = embed;
  g->has_head = head;
  g->acts_cfg = *c;
  g->acts_cfg.layers = n_layers;
  if (!head) g->acts_cfg.vocab = 0; /* no logits, no probabilities */
  int head_wte = head && !embed && c->tied; /* a tied last stage keeps its own wte for the head */
  int n = (embed ? 2 : 0) + head_wte + n_layers * P_PER_LAYER + (head ? 2 + (c->tied ? 0 : 1) : 0);
  /* one more entry: a sentinel at the arena's end, so that "the range after
   * the last block" (param-access prefetch hints) reads inside the table */
  g->tensors = calloc((size_t)n + 1, sizeof *g->tensors);
  g->names = calloc((size_t)n + 1, sizeof *g->names);
  g->global_idx = calloc((size_t)n + 1, sizeof *g->global_idx);
  if (!g->tensors || !g->names || !g->global_idx) {
    gpt_destroy(&g->base);
    return td_error(TD_ERR_SYSTEM, "gpt: out of memory");
  }
  size_t C = c->channels, V = c->vocab;
  size_t off = 0;
  int i = 0;
  const int g_layer0 = 2, g_lnfw = 2 + c->layers * P_PER_LAYER; /* indices in the whole model's table */
#define ADD(fmt_name, cnt, global)                                          \
  do {                                                                      \
    snprintf(g->names[i], sizeof g->names[i], "%s", fmt_name);              \
    g->tensors[i].name = g->names[i];                                       \
    g->tensors[i].offset = off;                                             \
    g->tensors[i].count = (cnt);                                            \
    g->global_idx[i] = (global);                                            \
    off += (cnt);                                                           \
    i++;                                                                    \
  } while (0)
  if (embed) {
    g->idx_wte = i;
    ADD("wte", V * C, 0);
    g->idx_wpe = i;
    ADD("wpe", (size_t)c->seq * C, 1);
  }
  if (head_wte) {
    g->idx_wte = i;
    ADD("wte", V * C, 0);
  }
  g->idx_layer0 = i;
  static const char *suffix[P_PER_LAYER] = {"ln1.weight",  "ln1.bias",    "attn.qkv.weight", "attn.qkv.bias",
                                            "attn.proj.weight", "attn.proj.bias", "ln2.weight", "ln2.bias",
                                            "mlp.fc.weight", "mlp.fc.bias", "mlp.proj.weight", "mlp.proj.bias"};
  size_t counts[P_PER_LAYER] = {C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C, 4 * C * C, C};
  for (int l = first_layer; l < first_layer + n_layers; l++)
    for (int w = 0; w < P_PER_LAYER; w++) {
      char name[48];
      snprintf(name, sizeof name, "h%d.%s", l, suffix[w]);
      ADD(name, counts[w], g_layer0 + l * P_PER_LAYER + w);
    }
  g->idx_lnfw = g->idx_lnfb = i; /* without the head: the sentinel */
  g->idx_head = -1;
  if (head) {
    g->idx_lnfw = i;
    ADD("ln_f.weight", C, g_lnfw);
    g->idx_lnfb = i;
    ADD("ln_f.bias", C, g_lnfw + 1);
    if (!c->tied) {
      g->idx_head = i;
      ADD("lm_head.weight", V * C, g_lnfw + 2);
    }
  }
#undef ADD
  g->tensors[n] = (td_param_tensor){"", off, 0};
  g->global_idx[n] = -1;
  g->base.ops = &gpt_ops;
  g->base.kind = "gpt";
  int whole = first_layer == 0 && n_layers == c->layers && embed && head;
  int len = snprintf(g->config_text, sizeof g->config_text, "vocab=%d layers=%d channels=%d heads=%d seq=%d tied=%d",
                     c->vocab, c->layers, c->channels, c->heads, c->seq, c->tied ? 1 : 0);
  if (!whole && len > 0 && (size_t)len < sizeof g->config_text)
    snprintf(g->config_text + len, sizeof g->config_text - (size_t)len, " stage_layers=%d-%d embed=%d head=%d",
             first_layer, first_layer + n_layers, embed, head);
  g->base.config = g->config_text;
  /* ZeRO-3: the whole model, or a pipeline stage whose engine hands it an
   * access shifted to its range of the rank's arena (the groups above are
   * ranges of this table either way; a stage lacks the ones it does not hold) */
  g->base.supports_param_access = 1;
  g->base.n_params = off;
  g->base.n_tensors = n;
  g->base.tensors = g->tensors;
  g->base.input_bytes = (size_t)c->seq * (embed ? sizeof(int32_t) : C * sizeof(float));
  g->base.targets_per_sample = (size_t)c->seq;
  *out = &g->base;
  return TD_OK;
}

td_status td_gpt_create(const td_gpt_config *config, td_model **out) {
  if (!config || !out) return td_error(TD_ERR_INVALID_ARGUMENT, "td_gpt_create: config and out must not be NULL");
  *out = NULL;
  TD_CHECK(td_cpu_check()); /* a TANDEM_CPU the kernels cannot honour is refused here */
  TD_CHECK(gpt_check_config(config));
  return gpt_build(config, 0, config->layers, 1, 1, out);
}

td_status td_gpt_stage_create(const td_gpt_config *config, const td_gpt_stage *stage, td_model **out) {
  if (!config || !stage || !out)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_gpt_stage_create: config, stage and out must not be NULL");
  *out = NULL;
  TD_CHECK(td_cpu_check());
  TD_CHECK(gpt_check_config(config));
  if (stage->first_layer < 0 || stage->n_layers < 0 || stage->first_layer + stage->n_layers > config->layers ||
      (stage->n_layers == 0 && !(stage->embed && stage->head)))
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "gpt: a pipeline stage of blocks [%d, %d) does not fit a model of %d layers (a stage holds at "
                    "least one block, inside [0, layers))",
                    stage->first_layer, stage->first_layer + stage->n_layers, config->layers);
  if (stage->embed != (stage->first_layer == 0) || stage->head != (stage->first_layer + stage->n_layers == config->layers))
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "gpt: the pipeline stage of blocks [%d, %d) must hold the embeddings exactly when it starts at "
                    "block 0 and the head exactly when it ends at block %d",
                    stage->first_layer, stage->first_layer + stage->n_layers, config->layers);
  return gpt_build(config, stage->first_layer, stage->n_layers, stage->embed != 0, stage->head != 0, out);
}

void nn_gpt_layout_of(const td_model *model, nn_gpt_layout *out) {
  const gpt_model *g = (const gpt_model *)model;
  *out = (nn_gpt_layout){.n_layers = g->n_layers,
                         .has_embed = g->has_embed,
                         .has_head = g->has_head,
                         .idx_wte = g->has_embed || (g->has_head && g->cfg.tied) ? g->idx_wte : -1,
                         .idx_wpe = g->has_embed ? g->idx_wpe : -1,
                         .idx_layer0 = g->idx_layer0,
                         .idx_lnfw = g->idx_lnfw,
                         .idx_lnfb = g->idx_lnfb,
                         .idx_head = g->has_head ? (g->cfg.tied ? g->idx_wte : g->idx_head) : -1};
}

const float *nn_gpt_stage_dout(const td_model *model) { return ((const gpt_model *)model)->dout_ext; }

/* A GPT, on the CPU (gpt_ops) or on a device (its twin keeps this struct and
 * replaces the ops: the device state is set). */
static gpt_model *as_stage(const td_model *model) {
  if (!model || !model->kind || strcmp(model->kind, "gpt") != 0) return NULL;
  gpt_model *g = (gpt_model *)model;
  return model->ops == &gpt_ops || g->device_state ? g : NULL;
}

const float *nn_gpt_stage_output(const td_model *model) {
  gpt_model *g = as_stage(model);
  if (!g || g->device_state || !g->acts.memory) return NULL;
  if (g->n_layers == 0) return g->acts.encoded;
  /* res3 holds every block's output, with or without checkpointing */
  return g->acts.res3 + (size_t)(g->n_layers - 1) * g->acts.B * g->acts.T * (size_t)g->cfg.channels;
}

void td_gpt_stage_set_output_grad(td_model *model, const float *dout) {
  gpt_model *g = as_stage(model);
  if (g) g->dout_ext = dout;
}

const float *nn_gpt_stage_input_grad(const td_model *model) {
  gpt_model *g = as_stage(model);
  if (g && g->device_state) return NULL;
  return g && g->acts.memory ? g->acts.dres : NULL;
}

/* GPT-2's initializer of tensor i: normal(0, *std) when *normal, else the
 * constant *value. */
static void gpt_tensor_init(const gpt_model *g, int i, float *std_out, float *value_out, int *normal_out) {
  /* GPT-2: weights normal(0, 0.02), the projections that write into the
   * residual stream scaled by 1/sqrt(2L) so that its variance does not grow
   * with depth; biases 0; layernorm gains 1. */
  float resid_std = 0.02f / sqrtf(2.0f * (float)(g->cfg.layers > 0 ? g->cfg.layers : 1));
  float std = 0.02f, value = 0.0f;
  int normal = 1;
  const int gi = g->global_idx[i], g_layer0 = 2, g_lnfw = 2 + g->cfg.layers * P_PER_LAYER; /* the whole model's */
  if (gi >= g_layer0 && gi < g_lnfw) {
    int which = (gi - g_layer0) % P_PER_LAYER;
    if (which == P_LN1W || which == P_LN2W) normal = 0, value = 1.0f;
    else if (which == P_PROJW || which == P_FC2W) std = resid_std;
    else if (which != P_QKVW && which != P_FCW) normal = 0, value = 0.0f; /* biases */
  } else if (gi == g_lnfw) {
    normal = 0, value = 1.0f;
  } else if (gi == g_lnfw + 1) {
    normal = 0, value = 0.0f;
  }
  *std_out = std, *value_out = value, *normal_out = normal;
}

void nn_gpt_init_params(const td_model *model, float *params, uint64_t seed) {
  const gpt_model *g = (const gpt_model *)model;
  for (int i = 0; i < g->base.n_tensors; i++) {
    const td_param_tensor *t = &g->tensors[i];
    float *p = params + t->offset;
    nn_rng rng = nn_rng_stream(seed, (uint64_t)g->global_idx[i] + 1); /* the whole model's stream */
    float std, value;
    int normal;
    gpt_tensor_init(g, i, &std, &value, &normal);
    if (normal)
      nn_fill_normal(p, t->count, std, &rng);
    else
      nn_fill_const(p, t->count, value);
  }
}

void nn_gpt_init_params_range(const td_model *model, float *dst, uint64_t seed, size_t lo, size_t hi) {
  const gpt_model *g = (const gpt_model *)model;
  /* A tensor's normal values come in pairs from one stream, so chunks of an
   * even length from the tensor's start draw exactly what one fill does;
   * the chunks before the range are drawn and dropped. */
  enum { CHUNK = 4096 };
  float scratch[CHUNK];
  for (int i = 0; i < g->base.n_tensors; i++) {
    const td_param_tensor *t = &g->tensors[i];
    size_t a = t->offset > lo ? t->offset : lo, b = t->offset + t->count < hi ? t->offset + t->count : hi;
    if (b <= a) continue;
    float std, value;
    int normal;
    gpt_tensor_init(g, i, &std, &value, &normal);
    if (!normal) {
      nn_fill_const(dst + (a - lo), b - a, value);
      continue;
    }
    nn_rng rng = nn_rng_stream(seed, (uint64_t)g->global_idx[i] + 1); /* the whole model's stream */
    for (size_t c0 = 0; t->offset + c0 < b; c0 += CHUNK) {
      size_t n = t->count - c0 < CHUNK ? t->count - c0 : CHUNK;
      nn_fill_normal(scratch, n, std, &rng);
      size_t ca = t->offset + c0, cb = ca + n; /* arena range of this chunk */
      size_t x = ca > a ? ca : a, y = cb < b ? cb : b;
      if (y > x) memcpy(dst + (x - lo), scratch + (x - ca), (y - x) * sizeof(float));
    }
  }
}

/* ---- sampling ---- */

td_status td_gpt_generate(td_model *model, const float *params, const int32_t *prompt, int n_prompt, int n,
                          float temperature, uint64_t seed, int32_t *out) {
  if (!model || strcmp(model->kind, "gpt") != 0)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_gpt_generate: model must be a GPT from td_gpt_create");
  if (model->device.kind != TD_DEVICE_CPU)
    return td_error(TD_ERR_INVALID_USAGE, "td_gpt_generate: the model computes on a GPU; sampling runs on the CPU "
                    "only: copy the parameters to the host and generate with a CPU GPT (td_gpt_create)");
  gpt_model *g = (gpt_model *)model;
  if (!g->has_embed || !g->has_head || g->n_layers != g->cfg.layers)
    return td_error(TD_ERR_INVALID_USAGE, "td_gpt_generate: the model is a pipeline stage (%s); generate with the "
                    "whole model (td_gpt_create) and the gathered parameters", g->config_text);
  const int T = g->cfg.seq, V = g->cfg.vocab;
  if (n < 0 || n_prompt < 0 || (n > 0 && !out) || (n_prompt > 0 && !prompt))
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_gpt_generate: bad arguments (n_prompt %d, n %d)", n_prompt, n);
  for (int i = 0; i < n_prompt; i++)
    if (prompt[i] < 0 || prompt[i] >= V)
      return td_error(TD_ERR_INVALID_ARGUMENT, "td_gpt_generate: prompt token %d at %d is outside [0, %d)",
                      prompt[i], i, V);
  gpt_acts a = {0};
  TD_CHECK(acts_alloc(&a, &g->cfg, 1, T, 0));
  int32_t *ctx = malloc((size_t)(n_prompt + n + 1) * sizeof(int32_t));
  if (!ctx) {
    acts_free(&a);
    return td_error(TD_ERR_SYSTEM, "td_gpt_generate: out of memory");
  }
  int len = 0;
  if (n_prompt == 0)
    ctx[len++] = '\n' < V ? '\n' : 0; /* start from a newline: the corpus's record separator */
  else
    for (int i = 0; i < n_prompt; i++) ctx[len++] = prompt[i];
  nn_rng rng = nn_rng_stream(seed, 0x5A3D);
  for (int s = 0; s < n; s++) {
    int w = len < T ? len : T;
    const int32_t *window = ctx + len - w;
    gpt_forward_impl(g, &a, params, NULL, window, NULL, 1, w);
    const float *logits = a.probs + (size_t)(w - 1) * V;
    int next = 0;
    if (temperature <= 0.0f) {
      for (int v = 1; v < V; v++)
        if (logits[v] > logits[next]) next = v;
    } else {
      float mx = logits[0];
      for (int v = 1; v < V; v++) mx = logits[v] > mx ? logits[v] : mx;
      double sum = 0.0;
      for (int v = 0; v < V; v++) sum += exp((double)(logits[v] - mx) / temperature);
      double r = (double)nn_rng_uniform(&rng) * sum, acc = 0.0;
      next = V - 1;
      for (int v = 0; v < V; v++) {
        acc += exp((double)(logits[v] - mx) / temperature);
        if (acc > r) {
          next = v;
          break;
        }
      }
    }
    ctx[len++] = next;
    out[s] = next;
  }
  free(ctx);
  acts_free(&a);
  return TD_OK;
}
