/* The tensor-parallel GPT (Megatron-LM's scheme over src/nn's GPT): a
 * td_model whose parameter arena is this rank's shard of td_gpt_create's,
 * so that the trainer, ZeRO-1 and the optimizer work on it unchanged and
 * reduce gradients over the data-parallel group only.
 *
 * What each of p tensor-parallel ranks holds (C channels, NH heads, V vocab):
 *   wte, lm_head   vocabulary rows td_shard_range(V, p, r) (may be uneven)
 *   qkv            the q, k and v rows of heads [r NH/p, (r+1) NH/p): column-parallel
 *   attn.proj      the matching C/p input columns: row-parallel
 *   mlp.fc         rows [r 4C/p, (r+1) 4C/p) with their bias: column-parallel
 *   mlp.proj       the matching 4C/p input columns: row-parallel
 *   replicated     wpe, both LayerNorms per block and ln_f, the biases of the
 *                  two row-parallel products: their inputs and output
 *                  gradients are whole on every rank, so their gradients
 *                  come out equal everywhere without communication (with
 *                  sequence parallelism the LayerNorms' are partial: below).
 *
 * Per block and micro-batch: one allreduce of B*T*C floats after each
 * row-parallel product in forward (attention, MLP) and one after each
 * column-parallel product's input gradient in backward; plus the
 * embedding's and the LM head's (and the cross-entropy's 3*B*T floats).
 *
 * Same initial values as the unsplit GPT (each shard is cut from the
 * unsplit initializer's values for its tensor), so TP=p trains the same
 * model as one rank; it differs in the last bits only because the
 * row-parallel sums and the LM head's softmax denominators add the ranks'
 * partial sums in another order.
 *
 * Sequence parallelism (td_gpt_tp_set_sequence_parallel): the residual
 * stream, the LayerNorms and the embedding's output keep B*T/p rows per rank;
 * the LayerNorm outputs are allgathered before each column-parallel
 * product (in forward, and again in backward for its weight gradient: only
 * the local rows are kept), the row-parallel sums reduce-scattered, the
 * residual gradient allgathered before each row-parallel backward and the
 * column-parallel input gradients reduce-scattered; the LayerNorms' weight
 * gradients, then partial, are allreduced (2C floats each).
 *
 * Activation checkpointing (set_activation_checkpointing) keeps each
 * block's output and recomputes the block, collectives included, in
 * backward: the same bits as without it, for one more forward.
 *
 * Mixed precision (bf16/fp16, td_nn_set_compute_dtype on the training
 * thread): the linear products round their operands as the unsplit GPT's
 * do (td_linear_*); activations, and so the tensor group's collectives,
 * stay f32, as the unsplit GPT's activations do on the CPU: the allreduced
 * partial sums are the f32 accumulators one rank would have summed in
 * another order, so TP adds no rounding one rank does not have. The
 * attention's products stay f32 (src/nn's bf16 attention kernel is
 * internal to nn), where the unsplit GPT at bf16 on an avx512bf16 CPU with
 * head sizes a multiple of 32 rounds them to bf16.
 *
 * On a CUDA device (td_gpt_tp_create_on): `full` is the device GPT (or
 * stage) from td_gpt_create_on, told its tensor rank and this table by
 * td_gpt_set_tensor_split, and it computes the shard: the same Megatron
 * split of the blocks, with its allreduces (row-parallel forward,
 * column-parallel input gradients) on device buffers through Tandem's
 * device collectives (dev_allreduce: staged through pinned host memory
 * when ranks share a GPU, NCCL when each has its own), and the same
 * vocabulary shard of wte and the head as here, with the device's parallel
 * cross-entropy (its row max and sums allreduced, MAX then SUM). This file
 * keeps the table, the cuts, the initial values, the norm and the failure
 * message; the device model computes. Sequence parallelism there is the
 * same split of the residual stream's rows as here, its allgathers and
 * reduce-scatters on device buffers (dev_allgather, dev_reduce_scatter;
 * the whole model only, not pipeline stages yet). ZeRO stage 3 on a device: the
 * engine's td_param_access, set on this wrapper, is handed to the device
 * model before each of its passes, and its fetches follow this table.
 *
 * ZeRO stage 3 on the CPU (td_model.param_access, set by the trainer on
 * this model, or by the pipeline engine on a stage): the arena the trainer
 * shards over the data-parallel ranks is this tensor shard's, so each
 * group fetched is a range of this table, the same groups as src/nn's GPT
 * (the embeddings, one block, ln_f with the head, and wte again for a tied
 * head), each fetched just before it is used in forward and backward (and
 * again for a checkpointed block's recomputation) and released after. The
 * fetches go over the data-parallel communicator, the collectives inside a
 * block over the tensor group's: every rank makes both in one order. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../base/base.h"
#include "tensor.h"

enum { P_LN1W, P_LN1B, P_QKVW, P_QKVB, P_PROJW, P_PROJB, P_LN2W, P_LN2B, P_FCW, P_FCB, P_FC2W, P_FC2B, P_PER_LAYER };

/* cut: how a local tensor is cut from the unsplit one (tensor.h; ckpt_map.c reads it too) */

/* Shapes: BT = B*T whole rows; R = the residual stream's rows on this rank:
 * BT, or BT/p with sequence parallelism (sp). With sp a LayerNorm's output
 * is kept for this rank's rows only and gathered into `gathered` whenever a
 * column-parallel product needs the whole rows, in forward and again in
 * backward (Megatron-LM's choice: one more allgather per product instead of
 * L whole-row copies). */
typedef struct tp_acts {
  int B, sp, ckpt;                /* sized for (ckpt: the per-layer buffers below res3 for one layer) */
  float *encoded;                 /* (R, C) */
  float *ln1, *ln1_mean, *ln1_rstd; /* (L, R, C), (L, R) x2 */
  float *qkv;                     /* (L, BT, 3C/p) */
  float *atty;                    /* (L, BT, C/p) */
  float *att;                     /* (L, B, NH/p, T, T) */
  float *res2;                    /* (L, R, C) */
  float *ln2, *ln2_mean, *ln2_rstd; /* as ln1 */
  float *fch;                     /* (L, BT, 4C/p): fc output before GELU */
  float *fchg;                    /* (L, BT, 4C/p): after GELU */
  float *res3;                    /* (L, R, C) */
  float *lnf, *lnf_mean, *lnf_rstd; /* (R, C), (R) x2 */
  float *probs;                   /* (BT, V/p): logits, then probabilities */
  float *stats;                   /* (3 BT): the cross-entropy's row statistics */
  float *gathered;                /* (BT, C): a LayerNorm output's whole rows (sp) */
  float *dres;                    /* (R, C): gradient of the residual stream */
  float *dfull;                   /* (BT, C): dres gathered (sp) */
  float *dloc;                    /* (R, C): a column-parallel input gradient's rows (sp) */
  float *dln;                     /* (2C): one LayerNorm's gradient before its allreduce (sp) */
  float *dbuf_c;                  /* (BT, C): partial sums before their collective */
  float *dbuf_cl;                 /* (BT, C/p) */
  float *dbuf_3c;                 /* (BT, 3C/p) */
  float *dbuf_f, *dbuf_f2;        /* (BT, 4C/p) */
  float *dlogits;                 /* (BT, V/p) */
  float *datt;                    /* (T, T) */
  float *memory;
  size_t bytes;
} tp_acts;

typedef struct tp_gpt {
  td_model base; /* first */
  td_gpt_config cfg;
  td_model *full; /* the unsplit GPT (or pipeline stage): its tensor table and initializer (never prepared) */
  int first_layer, L;       /* the blocks held: [first_layer, first_layer + L) (the whole model: 0, layers) */
  int has_embed, has_head;  /* a pipeline stage may lack either (tp_gpt_stage_create) */
  const float *dout_ext;    /* a stage without the head: its output's gradient (tp_gpt_stage_set_output_grad) */
  td_comm *comm; /* the grid's tensor-parallel communicator */
  int p, r;
  int world_rank, world_first; /* this rank's and the tensor group's first world rank (consecutive) */
  int C, Cl, NHl, Fl; /* channels, C/p, heads/p, 4C/p */
  int v0, Vl;         /* this rank's vocabulary rows */
  td_param_tensor *tensors;
  cut *cuts;
  char (*names)[48];
  int idx_wte, idx_wpe, idx_layer0, idx_lnfw, idx_lnfb, idx_head; /* idx_head -1 when tied; -1: not held */
  tp_acts acts;
  int sp;   /* sequence parallelism asked for (td_gpt_tp_set_sequence_parallel; applied at prepare) */
  int ckpt; /* activation checkpointing asked for (set_activation_checkpointing; applied at prepare) */
  int last_B, have_targets, forwarded; /* forwarded: a stage without the head ran its forward */
  int32_t *tokens, *targets;
  td_model *dev;    /* on a device: `full` itself, which computes the shard (NULL on the CPU) */
  td_dtype dtype;   /* on a device: its arenas' element type (td_gpt_set_device_dtype) */
  td_status failed; /* sticky: a collective failed (a peer died); forward refuses */
  char failed_msg[512];
  char config_text[200];
} tp_gpt;

static size_t off_of(const tp_gpt *g, int i) { return g->tensors[i].offset; }
static int lidx(const tp_gpt *g, int l, int which) { return g->idx_layer0 + l * P_PER_LAYER + which; }

/* ---- activations ---- */

static size_t acts_plan(tp_acts *a, const tp_gpt *g, int B, int sp, int ckpt, float *base) {
  /* Lk: layers of the per-layer buffers; with checkpointing one (recomputed in backward), res3 keeps L */
  size_t L = g->L, Lk = ckpt && L > 0 ? 1 : L, T = g->cfg.seq, BT = (size_t)B * T, C = g->C, Cl = g->Cl, Fl = g->Fl;
  size_t R = sp ? BT / g->p : BT, F = sp ? BT : 0; /* F: the gathered copies, only with sp */
  size_t Vl = g->has_head ? (size_t)g->Vl : 0, H = g->has_head ? 1 : 0; /* a stage without the head: no logits */
  struct {
    float **ptr;
    size_t n;
  } plan[] = {
      {&a->encoded, R * C},       {&a->ln1, Lk * R * C},    {&a->ln1_mean, Lk * R},  {&a->ln1_rstd, Lk * R},
      {&a->gathered, F * C},      {&a->qkv, Lk * BT * 3 * Cl}, {&a->atty, Lk * BT * Cl},
      {&a->att, Lk * B * g->NHl * T * T},
      {&a->res2, Lk * R * C},     {&a->ln2, Lk * R * C},    {&a->ln2_mean, Lk * R},  {&a->ln2_rstd, Lk * R},
      {&a->fch, Lk * BT * Fl},    {&a->fchg, Lk * BT * Fl}, {&a->res3, L * R * C},
      {&a->lnf, H * R * C},       {&a->lnf_mean, H * R},    {&a->lnf_rstd, H * R},
      {&a->probs, BT * Vl},       {&a->stats, 3 * BT * H},      {&a->dres, R * C},       {&a->dfull, F * C},
      {&a->dloc, sp ? R * C : 0}, {&a->dln, sp ? 2 * C : 0}, {&a->dbuf_c, BT * C},   {&a->dbuf_cl, BT * Cl},
      {&a->dbuf_3c, BT * 3 * Cl}, {&a->dbuf_f, BT * Fl},    {&a->dbuf_f2, BT * Fl},  {&a->dlogits, BT * Vl},
      {&a->datt, T * T},
  };
  size_t total = 0;
  for (size_t i = 0; i < sizeof plan / sizeof plan[0]; i++) {
    if (base) *plan[i].ptr = base + total;
    total += (plan[i].n + 15) & ~(size_t)15; /* 64-byte aligned */
  }
  if (base && !sp) a->dfull = a->dres; /* the whole rows are the local ones */
  return total;
}

/* Activations, the token and target copies, and at a half compute type the
 * scratch of its largest local product (td_nn_lowp_scratch_bytes; the
 * products run on whole B*T rows, with sequence parallelism too). */
static size_t tp_activation_bytes(const td_model *model, int batch, int checkpointing, td_dtype compute) {
  const tp_gpt *g = (const tp_gpt *)model;
  tp_acts scratch = {0};
  size_t BT = (size_t)batch * g->cfg.seq, C = (size_t)g->C, lowp = 0;
  if (g->L > 0) {
    const size_t shapes[4][2] = {{C, 3 * (size_t)g->Cl}, {(size_t)g->Cl, C}, {C, (size_t)g->Fl}, {(size_t)g->Fl, C}};
    for (int i = 0; i < 4; i++) lowp = TD_MAX(lowp, td_nn_lowp_scratch_bytes(compute, BT, shapes[i][0], shapes[i][1]));
  }
  if (g->has_head) lowp = TD_MAX(lowp, td_nn_lowp_scratch_bytes(compute, BT, C, (size_t)g->Vl));
  return acts_plan(&scratch, g, batch, g->sp, checkpointing != 0, NULL) * sizeof(float) + 2 * BT * sizeof(int32_t) +
         lowp;
}

/* What a compute thread keeps for the products (td_model_ops): the largest
 * of this rank's layers' panels (column-parallel qkv and fc to their local
 * features, row-parallel proj and fc2 to C, the head to its vocabulary
 * rows), on the whole micro-batch's rows (sequence parallelism multiplies
 * no more). */
static size_t tp_thread_scratch_bytes(const td_model *model, int batch) {
  const tp_gpt *g = (const tp_gpt *)model;
  const size_t BT = (size_t)batch * g->cfg.seq, C = (size_t)g->C, Cl = (size_t)g->Cl, Fl = (size_t)g->Fl;
  size_t n = 0;
  if (g->L > 0) {
    const size_t shapes[4][2] = {{C, 3 * Cl}, {Cl, C}, {C, Fl}, {Fl, C}}; /* qkv, proj, fc, fc2 */
    for (int i = 0; i < 4; i++) n = TD_MAX(n, td_linear_scratch_bytes(BT, shapes[i][0], shapes[i][1]));
  }
  if (g->has_head) n = TD_MAX(n, td_linear_scratch_bytes(BT, C, (size_t)g->Vl));
  return n;
}

/* What the tensor group's collectives stage (td_model_ops): every
 * collective on the residual stream carries the micro-batch's whole B*T*C
 * floats (the row-parallel sums, the column-parallel input gradients, the
 * embedding's rows), an allreduce, or with sp a reduce-scatter and an
 * allgather; the others are smaller (the cross-entropy's 2 B*T row sums,
 * the LayerNorms' 2C with sp, a norm, a flag). */
static size_t tp_comm_staging_bytes(const td_model *model, int batch, size_t *peers) {
  const tp_gpt *g = (const tp_gpt *)model;
  const size_t BT = (size_t)batch * g->cfg.seq, C = (size_t)g->C, f = sizeof(float);
  td_comm_traffic tr = {0};
  if (g->sp) {
    tr.allreduce = TD_MAX(2 * BT, 2 * C) * f;
    tr.allgather = tr.reduce_scatter = BT * C * f;
  } else {
    tr.allreduce = TD_MAX(BT * C, 2 * BT) * f;
  }
  return td_comm_staging_bytes(g->comm, &tr, peers);
}

/* Activation checkpointing: forward keeps each block's output (res3) and
 * one layer's other buffers; backward recomputes block l from its input
 * before differentiating it (with its collectives: every rank of the group
 * recomputes in the same order). Applied at the next prepare. */
static td_status tp_set_ckpt(td_model *model, int on) {
  ((tp_gpt *)model)->ckpt = on != 0;
  return TD_OK;
}

static td_status tp_prepare(td_model *model, int batch) {
  tp_gpt *g = (tp_gpt *)model;
  if (batch <= 0) return td_error(TD_ERR_INVALID_ARGUMENT, "gpt-tp: micro-batch must be positive, got %d", batch);
  if (g->sp && ((long)batch * g->cfg.seq) % g->p != 0) /* seq % p is checked when sp is set */
    return td_error(TD_ERR_INTERNAL, "gpt-tp: %d x %d rows do not split over %d ranks", batch, g->cfg.seq, g->p);
  if (g->acts.memory && g->acts.B == batch && g->acts.sp == g->sp && g->acts.ckpt == g->ckpt) return TD_OK;
  td_free(g->acts.memory);
  memset(&g->acts, 0, sizeof g->acts);
  size_t total = acts_plan(&g->acts, g, batch, g->sp, g->ckpt, NULL);
  float *mem = td_alloc(total * sizeof(float));
  size_t n = (size_t)batch * g->cfg.seq;
  int32_t *tokens = realloc(g->tokens, n * sizeof(int32_t));
  if (tokens) g->tokens = tokens;
  int32_t *targets = realloc(g->targets, n * sizeof(int32_t));
  if (targets) g->targets = targets;
  if (!mem || !tokens || !targets) {
    td_free(mem);
    return td_error(TD_ERR_SYSTEM, "gpt-tp: out of memory for the activations of micro-batch %d (%zu MiB)", batch,
                    total * sizeof(float) >> 20);
  }
  acts_plan(&g->acts, g, batch, g->sp, g->ckpt, mem);
  g->acts.memory = mem;
  g->acts.B = batch;
  g->acts.sp = g->sp;
  g->acts.ckpt = g->ckpt;
  g->acts.bytes = total * sizeof(float);
  g->base.activation_bytes = g->acts.bytes;
  return TD_OK;
}

/* ---- parameter groups fetched under td_param_access (ZeRO stage 3) ----
 * Contiguous ranges of this rank's table: the embeddings (the tensors
 * before the first block: wte, wpe), block l, ln_f with the untied head,
 * and a tied head's wte. A stage lacks what it does not hold (count 0).
 * Without param_access every fetch returns `params` itself. */
typedef struct tp_unit {
  size_t offset, count;
} tp_unit;

static const tp_unit unit_none = {0, 0};
static tp_unit unit_span(const tp_gpt *g, int first, int end) {
  return (tp_unit){off_of(g, first), off_of(g, end) - off_of(g, first)};
}
static tp_unit unit_emb(const tp_gpt *g) {
  return g->has_embed ? unit_span(g, 0, g->L > 0 ? g->idx_layer0 : g->idx_lnfw) : unit_none;
}
static tp_unit unit_layer(const tp_gpt *g, int l) { return unit_span(g, lidx(g, l, 0), lidx(g, l + 1, 0)); }
static tp_unit unit_final(const tp_gpt *g) {
  return g->has_head ? unit_span(g, g->idx_lnfw, g->base.n_tensors) : unit_none;
}
static tp_unit unit_wte(const tp_gpt *g) {
  return g->has_head && g->idx_head < 0 ? (tp_unit){off_of(g, g->idx_wte), g->tensors[g->idx_wte].count} : unit_none;
}
static const float *unit_fetch(const tp_gpt *g, const float *params, tp_unit u, tp_unit next) {
  const td_param_access *pa = g->base.param_access;
  return pa && u.count ? pa->fetch(pa->ctx, u.offset, u.count, next.offset, next.count) : params;
}
static void unit_release(const tp_gpt *g, tp_unit u) {
  const td_param_access *pa = g->base.param_access;
  if (pa && u.count) pa->release(pa->ctx, u.offset, u.count);
}

/* ---- failures: a collective's error becomes sticky ---- */

static int fail(tp_gpt *g, td_status st) {
  if (st == TD_OK) return 0;
  if (g->failed == TD_OK) {
    char why[320];
    td_error_copy(why, sizeof why);
    g->failed = st;
    /* the comm names ranks of the tensor group: say which world ranks they are */
    snprintf(g->failed_msg, sizeof g->failed_msg,
             "tensor-parallel GPT on world rank %d (tensor rank %d of %d; tensor ranks 0..%d are world ranks %d..%d): %s",
             g->world_rank, g->r, g->p, g->p - 1, g->world_first, g->world_first + g->p - 1, why);
  }
  return 1;
}

/* ---- forward ---- */

static void add_into(float *restrict dst, const float *restrict src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

/* The row-parallel product into the residual stream's rows: allreduced,
 * or reduce-scattered with sp (dbuf_c holds the partial sums). */
static td_status row_forward(tp_gpt *g, float *out, const float *inp_local, const float *w, const float *bias, int BT,
                             int IC_local) {
  if (g->acts.sp) return tp_row_linear_forward_sp(out, g->acts.dbuf_c, inp_local, w, bias, BT, IC_local, g->C, g->comm);
  return tp_row_linear_forward(out, inp_local, w, bias, BT, IC_local, g->C, g->comm);
}
/* With sp: the whole rows of a (R, C) buffer into (BT, C); else nothing (they alias). */
static td_status gather_rows(tp_gpt *g, float *full, const float *local, int BT) {
  return g->acts.sp ? td_allgather(local, full, (size_t)BT * g->C, TD_F32, g->comm) : TD_OK;
}
/* The whole rows of a LayerNorm output for a column-parallel product: the
 * buffer itself, or with sp its rows gathered into acts.gathered. NULL
 * after a failed collective. */
static const float *whole_rows(tp_gpt *g, const float *local, int BT) {
  if (!g->acts.sp) return local;
  return fail(g, gather_rows(g, g->acts.gathered, local, BT)) ? NULL : g->acts.gathered;
}

/* Returns 0, or 1 after a failed collective (recorded in g->failed). */
static int block_forward(tp_gpt *g, const float *params, int l, const float *resid, int B) {
  tp_acts *a = &g->acts;
  const int T = g->cfg.seq, C = g->C, Cl = g->Cl, Fl = g->Fl, BT = B * T, R = a->sp ? BT / g->p : BT;
  const size_t sBT = (size_t)a->B * T, sR = a->sp ? sBT / g->p : sBT;
#define W(which) (params + off_of(g, lidx(g, l, (which))))
  const size_t k = a->ckpt ? 0 : (size_t)l; /* the per-layer buffers' slot: one with checkpointing */
  float *ln1 = a->ln1 + k * sR * C, *ln1_mean = a->ln1_mean + k * sR, *ln1_rstd = a->ln1_rstd + k * sR;
  float *qkv = a->qkv + k * sBT * 3 * Cl, *atty = a->atty + k * sBT * Cl;
  float *att = a->att + k * a->B * g->NHl * T * T;
  float *res2 = a->res2 + k * sR * C, *ln2 = a->ln2 + k * sR * C;
  float *ln2_mean = a->ln2_mean + k * sR, *ln2_rstd = a->ln2_rstd + k * sR;
  float *fch = a->fch + k * sBT * Fl, *fchg = a->fchg + k * sBT * Fl, *res3 = a->res3 + l * sR * C;
  td_layernorm_forward(ln1, ln1_mean, ln1_rstd, resid, W(P_LN1W), W(P_LN1B), R, C);
  const float *whole = whole_rows(g, ln1, BT);
  if (!whole) return 1;
  tp_column_linear_forward(qkv, whole, W(P_QKVW), W(P_QKVB), BT, C, 3 * Cl);
  td_attention_forward(atty, att, qkv, B, T, Cl, g->NHl); /* this rank's heads */
  if (fail(g, row_forward(g, res2, atty, W(P_PROJW), W(P_PROJB), BT, Cl))) return 1;
  add_into(res2, resid, (size_t)R * C);
  td_layernorm_forward(ln2, ln2_mean, ln2_rstd, res2, W(P_LN2W), W(P_LN2B), R, C);
  if (!(whole = whole_rows(g, ln2, BT))) return 1;
  tp_column_linear_forward(fch, whole, W(P_FCW), W(P_FCB), BT, C, Fl);
  td_gelu_forward(fchg, fch, (size_t)BT * Fl);
  if (fail(g, row_forward(g, res3, fchg, W(P_FC2W), W(P_FC2B), BT, Fl))) return 1;
  add_into(res3, res2, (size_t)R * C);
#undef W
  return 0;
}

static float tp_forward(td_model *model, const float *params, const void *inputs, const int32_t *targets, int batch) {
  tp_gpt *g = (tp_gpt *)model;
  g->have_targets = 0;
  g->forwarded = 0;
  g->last_B = 0;
  if (g->failed != TD_OK) {
    td_error(g->failed, "%s", g->failed_msg);
    return NAN;
  }
  if ((!g->acts.memory || g->acts.B != batch || g->acts.sp != g->sp || g->acts.ckpt != g->ckpt) &&
      tp_prepare(model, batch) != TD_OK)
    return NAN;
  const int T = g->cfg.seq, V = g->cfg.vocab, L = g->L, C = g->C, BT = batch * T;
  const int R = g->acts.sp ? BT / g->p : BT;
  const size_t n = (size_t)BT, sR = (size_t)R;
  if (!g->has_head) targets = NULL; /* only the last pipeline stage has a loss */
  if (g->has_embed) memcpy(g->tokens, inputs, n * sizeof(int32_t));
  for (size_t i = 0; i < n; i++)
    if ((g->has_embed && (uint32_t)g->tokens[i] >= (uint32_t)V) || (targets && (uint32_t)targets[i] >= (uint32_t)V)) {
      int bad_token = g->has_embed && (uint32_t)g->tokens[i] >= (uint32_t)V;
      td_error(TD_ERR_INVALID_ARGUMENT, "gpt-tp: %s %d at position %zu is outside the vocabulary [0, %d)",
               bad_token ? "token" : "target", bad_token ? g->tokens[i] : targets[i], i, V);
      return NAN;
    }
  if (targets) memcpy(g->targets, targets, n * sizeof(int32_t));
  tp_acts *a = &g->acts;
  const float *p = params; /* under param_access: the arena with the group in use fetched */
  if (g->has_embed) {
    p = unit_fetch(g, params, unit_emb(g), L > 0 ? unit_layer(g, 0) : unit_final(g));
    const float *wte = p + off_of(g, g->idx_wte), *wpe = p + off_of(g, g->idx_wpe);
    td_status st = a->sp ? tp_embedding_forward_sp(a->encoded, a->dbuf_c, g->tokens, wte, wpe, batch, T, C, g->v0,
                                                   g->Vl, g->comm)
                         : tp_embedding_forward(a->encoded, g->tokens, wte, wpe, batch, T, C, g->v0, g->Vl, g->comm);
    unit_release(g, unit_emb(g));
    if (fail(g, st)) goto failed;
  } else {
    /* a later pipeline stage: the previous stage's output, this rank's rows of it (all of them without sp) */
    memcpy(a->encoded, inputs, sR * C * sizeof(float));
  }
  const float *resid = a->encoded;
  for (int l = 0; l < L; l++) {
    p = unit_fetch(g, params, unit_layer(g, l), l + 1 < L ? unit_layer(g, l + 1) : unit_final(g));
    const int bad = block_forward(g, p, l, resid, batch);
    unit_release(g, unit_layer(g, l));
    if (bad) goto failed;
    resid = a->res3 + l * sR * C;
  }
  if (!g->has_head) { /* the output is resid (tp_gpt_stage_output) */
    g->last_B = batch;
    g->forwarded = 1;
    return 0.0f;
  }
  p = unit_fetch(g, params, unit_final(g), unit_wte(g));
  if (unit_wte(g).count) p = unit_fetch(g, params, unit_wte(g), unit_none);
  td_layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, resid, p + off_of(g, g->idx_lnfw), p + off_of(g, g->idx_lnfb),
                       R, C);
  const float *whole = whole_rows(g, a->lnf, BT);
  if (whole) tp_column_linear_forward(a->probs, whole, p + off_of(g, g->idx_head >= 0 ? g->idx_head : g->idx_wte), NULL,
                                      BT, C, g->Vl);
  unit_release(g, unit_final(g));
  unit_release(g, unit_wte(g));
  if (!whole) goto failed;
  g->last_B = batch;
  if (!targets) return 0.0f; /* the logits stay in probs for predict */
  float loss = 0.0f;
  if (fail(g, tp_xent_forward(a->probs, a->probs, g->targets, BT, g->v0, g->Vl, a->stats, &loss, g->comm)))
    goto failed;
  g->have_targets = 1;
  return loss;
failed:
  g->last_B = 0;
  td_error(g->failed, "%s", g->failed_msg);
  return NAN;
}

/* ---- backward ---- */

static void report(td_grad_ready_fn ready, void *ctx, const tp_gpt *g, int idx) {
  if (ready) ready(ctx, g->tensors[idx].offset, g->tensors[idx].count);
}

/* A column-parallel product's input gradient, for this rank's residual
 * rows: allreduced into dbuf_c (returned), or reduce-scattered into dloc
 * with sp. NULL after a failed collective. */
static const float *column_backward(tp_gpt *g, float *dw, float *db, const float *dout_local, const float *inp_full,
                                    const float *w, int BT, int OC_local) {
  tp_acts *a = &g->acts;
  td_status st = a->sp ? tp_column_linear_backward_sp(a->dloc, a->dbuf_c, dw, db, dout_local, inp_full, w, BT, g->C,
                                                      OC_local, g->comm)
                       : tp_column_linear_backward(a->dbuf_c, dw, db, dout_local, inp_full, w, BT, g->C, OC_local,
                                                   g->comm);
  if (fail(g, st)) return NULL;
  return a->sp ? a->dloc : a->dbuf_c;
}

/* LayerNorm backward on this rank's rows into dres. With sp its weight and
 * bias gradients are partial (this rank's rows): summed over the tensor
 * group before they are added (only this micro-batch's share goes through
 * the allreduce: the arena accumulates). Returns 1 after a failed collective. */
static int layernorm_backward(tp_gpt *g, float *dw, float *db, const float *dout, const float *inp, const float *w,
                              const float *mean, const float *rstd, int R) {
  tp_acts *a = &g->acts;
  const int C = g->C;
  if (!a->sp) {
    td_layernorm_backward(a->dres, dw, db, dout, inp, w, mean, rstd, R, C);
    return 0;
  }
  memset(a->dln, 0, 2 * (size_t)C * sizeof(float));
  td_layernorm_backward(a->dres, a->dln, a->dln + C, dout, inp, w, mean, rstd, R, C);
  if (fail(g, td_allreduce(a->dln, a->dln, 2 * (size_t)C, TD_F32, TD_SUM, g->comm))) return 1;
  add_into(dw, a->dln, (size_t)C);
  add_into(db, a->dln + C, (size_t)C);
  return 0;
}

/* loss -> logits -> LM head (column-parallel over the vocabulary) -> ln_f,
 * leaving the gradient of the last block's output in dres. Returns 1 after
 * a failed collective. */
static int head_backward(tp_gpt *g, const float *params, float *grads, float loss_scale, td_grad_ready_fn ready,
                         void *ctx) {
  tp_acts *a = &g->acts;
  const int L = g->L, C = g->C, BT = g->last_B * g->cfg.seq, R = a->sp ? BT / g->p : BT;
  const size_t sR = a->sp ? (size_t)a->B * g->cfg.seq / g->p : (size_t)a->B * g->cfg.seq;
  const int tied = g->idx_head < 0, head = tied ? g->idx_wte : g->idx_head;
  tp_xent_backward(a->dlogits, a->probs, g->targets, loss_scale, BT, g->v0, g->Vl);
  const float *whole = whole_rows(g, a->lnf, BT), *dln = NULL;
  if (!whole) return 1;
  if (!(dln = column_backward(g, grads + off_of(g, head), NULL, a->dlogits, whole, params + off_of(g, head), BT, g->Vl)))
    return 1;
  if (!tied || !g->has_embed) report(ready, ctx, g, head); /* a tied wte is final after the embedding's part */
  const float *last = L > 0 ? a->res3 + (L - 1) * sR * C : a->encoded;
  memset(a->dres, 0, (size_t)R * C * sizeof(float));
  if (layernorm_backward(g, grads + off_of(g, g->idx_lnfw), grads + off_of(g, g->idx_lnfb), dln, last,
                         params + off_of(g, g->idx_lnfw), a->lnf_mean, a->lnf_rstd, R))
    return 1;
  report(ready, ctx, g, g->idx_lnfb);
  report(ready, ctx, g, g->idx_lnfw);
  return 0;
}

/* Block l's backward: dres holds the gradient of its output (this rank's
 * rows) and leaves that of its input; params hold the block's parameters
 * (fetched under param_access). Returns 1 after a failed collective. */
static int block_backward(tp_gpt *g, const float *params, float *grads, int l, td_grad_ready_fn ready, void *ctx) {
  tp_acts *a = &g->acts;
  const int T = g->cfg.seq, C = g->C, Cl = g->Cl, Fl = g->Fl, B = g->last_B, BT = B * T;
  const int R = a->sp ? BT / g->p : BT;
  const size_t sBT = (size_t)a->B * T, sR = a->sp ? sBT / g->p : sBT;
  const float *whole = NULL, *dln = NULL;
#define W(which) (params + off_of(g, lidx(g, l, (which))))
#define G(which) (grads + off_of(g, lidx(g, l, (which))))
#define READY(which) report(ready, ctx, g, lidx(g, l, (which)))
  const float *resid = l > 0 ? a->res3 + (l - 1) * sR * C : a->encoded;
  /* checkpointing: block l's buffers again, recomputed from its input
   * (the same kernels and collectives on the same values: the same bits) */
  if (a->ckpt && block_forward(g, params, l, resid, B)) return 1;
  const size_t k = a->ckpt ? 0 : (size_t)l;
  const float *ln1_mean = a->ln1_mean + k * sR, *ln1_rstd = a->ln1_rstd + k * sR;
  const float *ln1 = a->ln1 + k * sR * C, *ln2 = a->ln2 + k * sR * C;
  const float *qkv = a->qkv + k * sBT * 3 * Cl, *atty = a->atty + k * sBT * Cl;
  const float *att = a->att + k * a->B * g->NHl * T * T;
  const float *res2 = a->res2 + k * sR * C;
  const float *ln2_mean = a->ln2_mean + k * sR, *ln2_rstd = a->ln2_rstd + k * sR;
  const float *fch = a->fch + k * sBT * Fl, *fchg = a->fchg + k * sBT * Fl;
  /* MLP; dres holds d res3 (this rank's rows); the row-parallel product needs the whole rows */
  if (fail(g, gather_rows(g, a->dfull, a->dres, BT))) return 1;
  memset(a->dbuf_f, 0, (size_t)BT * Fl * sizeof(float));
  tp_row_linear_backward(a->dbuf_f, G(P_FC2W), G(P_FC2B), a->dfull, fchg, W(P_FC2W), BT, Fl, C);
  READY(P_FC2B);
  READY(P_FC2W);
  memset(a->dbuf_f2, 0, (size_t)BT * Fl * sizeof(float));
  td_gelu_backward(a->dbuf_f2, fch, a->dbuf_f, (size_t)BT * Fl);
  if (!(whole = whole_rows(g, ln2, BT))) return 1;
  if (!(dln = column_backward(g, G(P_FCW), G(P_FCB), a->dbuf_f2, whole, W(P_FCW), BT, Fl))) return 1;
  READY(P_FCB);
  READY(P_FCW);
  if (layernorm_backward(g, G(P_LN2W), G(P_LN2B), dln, res2, W(P_LN2W), ln2_mean, ln2_rstd, R)) return 1;
  READY(P_LN2B);
  READY(P_LN2W);
  /* attention; dres now holds d res2 */
  if (fail(g, gather_rows(g, a->dfull, a->dres, BT))) return 1;
  memset(a->dbuf_cl, 0, (size_t)BT * Cl * sizeof(float));
  tp_row_linear_backward(a->dbuf_cl, G(P_PROJW), G(P_PROJB), a->dfull, atty, W(P_PROJW), BT, Cl, C);
  READY(P_PROJB);
  READY(P_PROJW);
  memset(a->dbuf_3c, 0, (size_t)BT * 3 * Cl * sizeof(float));
  td_attention_backward(a->dbuf_3c, a->datt, a->dbuf_cl, qkv, att, B, T, Cl, g->NHl);
  if (!(whole = whole_rows(g, ln1, BT))) return 1;
  if (!(dln = column_backward(g, G(P_QKVW), G(P_QKVB), a->dbuf_3c, whole, W(P_QKVW), BT, 3 * Cl))) return 1;
  READY(P_QKVB);
  READY(P_QKVW);
  if (layernorm_backward(g, G(P_LN1W), G(P_LN1B), dln, resid, W(P_LN1W), ln1_mean, ln1_rstd, R)) return 1;
  READY(P_LN1B);
  READY(P_LN1W);
#undef W
#undef G
#undef READY
  return 0;
}

static void tp_backward(td_model *model, const float *params, float *grads, float loss_scale, td_grad_ready_fn ready,
                        void *ctx) {
  tp_gpt *g = (tp_gpt *)model;
  if (g->failed != TD_OK) return;
  tp_acts *a = &g->acts;
  const int L = g->L, T = g->cfg.seq, C = g->C, B = g->last_B, BT = B * T;
  const int R = a->sp ? BT / g->p : BT;
  if (g->has_head) {
    if (!g->have_targets) return; /* nothing to differentiate */
    const tp_unit after = L > 0 ? unit_layer(g, L - 1) : unit_none;
    const float *p = unit_fetch(g, params, unit_final(g), unit_wte(g).count ? unit_wte(g) : after);
    if (unit_wte(g).count) p = unit_fetch(g, params, unit_wte(g), after);
    const int bad = head_backward(g, p, grads, loss_scale, ready, ctx);
    unit_release(g, unit_final(g));
    unit_release(g, unit_wte(g));
    if (bad) return;
  } else {
    /* a pipeline stage before the last: its output's gradient (this rank's rows) came from the next stage */
    if (!g->forwarded || !g->dout_ext) return;
    memcpy(a->dres, g->dout_ext, (size_t)R * C * sizeof(float));
    g->dout_ext = NULL;
  }
  for (int l = L - 1; l >= 0; l--) {
    const float *p = unit_fetch(g, params, unit_layer(g, l), l > 0 ? unit_layer(g, l - 1) : unit_none);
    const int bad = block_backward(g, p, grads, l, ready, ctx);
    unit_release(g, unit_layer(g, l));
    if (bad) return;
  }
  g->forwarded = 0;
  if (!g->has_embed) return; /* dres: the gradient of the input, this rank's rows (tp_gpt_stage_input_grad) */
  /* the whole rows again (sp): every rank then adds the same wpe gradient (no parameters read: nothing fetched) */
  if (fail(g, gather_rows(g, a->dfull, a->dres, BT))) return;
  tp_embedding_backward(grads + off_of(g, g->idx_wte), grads + off_of(g, g->idx_wpe), a->dfull, g->tokens, B, T, C,
                        g->v0, g->Vl);
  report(ready, ctx, g, g->idx_wpe);
  report(ready, ctx, g, g->idx_wte);
}

/* The argmax over the whole vocabulary: the largest value (allreduce MAX),
 * then the smallest index holding it (allreduce MIN), as the unsplit
 * model's first maximum. On a failed collective every prediction is -1. */
static void tp_predict(td_model *model, int32_t *out) {
  tp_gpt *g = (tp_gpt *)model;
  const size_t n = (size_t)g->last_B * g->cfg.seq;
  if (!g->has_head) { /* a pipeline stage before the last has no logits */
    for (size_t i = 0; i < n; i++) out[i] = -1;
    return;
  }
  float *best = g->acts.stats; /* 2n floats: n values, then n indices as int32 */
  int32_t *index = (int32_t *)(g->acts.stats + n);
  for (size_t i = 0; i < n; i++) {
    const float *row = g->acts.probs + i * g->Vl;
    int b = 0;
    for (int v = 1; v < g->Vl; v++)
      if (row[v] > row[b]) b = v;
    best[i] = row[b];
    index[i] = g->v0 + b;
  }
  float *mine = malloc((n ? n : 1) * sizeof(float));
  td_status st = mine ? TD_OK : td_error(TD_ERR_SYSTEM, "gpt-tp: out of memory for predictions");
  if (st == TD_OK) {
    memcpy(mine, best, n * sizeof(float));
    st = td_allreduce(best, best, n, TD_F32, TD_MAX, g->comm);
  }
  if (st == TD_OK) {
    for (size_t i = 0; i < n; i++)
      if (mine[i] != best[i]) index[i] = INT32_MAX;
    st = td_allreduce(index, out, n, TD_I32, TD_MIN, g->comm);
  }
  free(mine);
  if (fail(g, st))
    for (size_t i = 0; i < n; i++) out[i] = -1;
}

/* ---- parameters: cut from the unsplit GPT's initial values ---- */

static void cut_copy(const cut *k, const float *whole, float *local) {
  switch (k->kind) {
  case CUT_REPL:
    memcpy(local, whole, k->rows * k->cols * sizeof(float));
    break;
  case CUT_ROWS:
    for (int b = 0; b < k->blocks; b++) {
      memcpy(local, whole + (b * k->rows + k->lo) * k->cols, k->n * k->cols * sizeof(float));
      local += k->n * k->cols;
    }
    break;
  case CUT_COLS:
    for (size_t row = 0; row < k->rows; row++) memcpy(local + row * k->n, whole + row * k->cols + k->lo, k->n * sizeof(float));
    break;
  }
}

static void tp_init_params(const td_model *model, float *params, uint64_t seed) {
  const tp_gpt *g = (const tp_gpt *)model;
  size_t largest = 0;
  for (int i = 0; i < g->base.n_tensors; i++)
    largest = g->full->tensors[i].count > largest ? g->full->tensors[i].count : largest;
  float *whole = td_alloc((largest ? largest : 1) * sizeof(float));
  for (int i = 0; i < g->base.n_tensors; i++) {
    const td_param_tensor *t = &g->full->tensors[i];
    if (!whole) {
      /* td_model_init_params cannot fail; without the scratch leave a mark
       * the first loss shows (NaN) rather than a silently different model */
      for (size_t j = 0; j < g->tensors[i].count; j++) params[g->tensors[i].offset + j] = NAN;
      continue;
    }
    (void)td_model_init_params_range(g->full, whole, seed, t->offset, t->offset + t->count);
    cut_copy(&g->cuts[i], whole, params + g->tensors[i].offset);
  }
  td_free(whole);
}

/* The whole model's squared gradient norm: the split tensors' squares from
 * every rank, the replicated ones (equal everywhere) from rank 0 only. */
static td_status tp_grad_norm_sq(td_model *model, const float *grads, size_t lo, size_t hi, double *sum_sq) {
  tp_gpt *g = (tp_gpt *)model;
  double mine = *sum_sq - tp_gpt_replicated_sq(model, grads, lo, hi);
  td_status st = td_allreduce(&mine, sum_sq, 1, TD_F64, TD_SUM, g->comm);
  if (fail(g, st)) return td_error(g->failed, "%s", g->failed_msg);
  if (*sum_sq < 0) *sum_sq = 0; /* rounding of the subtraction */
  return TD_OK;
}

/* fp16's overflow decision, taken by the whole tensor group */
static td_status tp_group_max(td_model *model, int32_t *flag) {
  tp_gpt *g = (tp_gpt *)model;
  td_status st = td_allreduce(flag, flag, 1, TD_I32, TD_MAX, g->comm);
  if (fail(g, st)) return td_error(g->failed, "%s", g->failed_msg);
  return TD_OK;
}

static void tp_destroy(td_model *model) {
  tp_gpt *g = (tp_gpt *)model;
  if (!g) return;
  td_free(g->acts.memory);
  free(g->tokens);
  free(g->targets);
  free(g->tensors);
  free(g->cuts);
  free(g->names);
  td_model_destroy(g->full);
  free(g);
}

static const td_model_ops tp_ops = {
    .prepare = tp_prepare,
    .forward = tp_forward,
    .backward = tp_backward,
    .predict = tp_predict,
    .destroy = tp_destroy,
    .activation_bytes = tp_activation_bytes,
    .thread_scratch_bytes = tp_thread_scratch_bytes,
    .comm_staging_bytes = tp_comm_staging_bytes,
    .set_activation_checkpointing = tp_set_ckpt,
    .init_params = tp_init_params,
    .grad_norm_sq = tp_grad_norm_sq,
    .group_max = tp_group_max,
};

/* ---- on a device: the device GPT computes, this wrapper keeps the rest ---- */

/* td_gpt_tensor_split's allreduce: the device buffer summed over the tensor
 * group by Tandem's device collectives (blocking: the sums are in device
 * memory on return). A peer's death becomes this model's sticky failure,
 * its message naming the world ranks. */
static td_status dev_allreduce(void *ctx, void *buf, size_t count, td_dtype dtype, td_op op) {
  tp_gpt *g = ctx;
  if (g->failed == TD_OK) (void)fail(g, td_allreduce(buf, buf, count, dtype, op, g->comm));
  return g->failed == TD_OK ? TD_OK : td_error(g->failed, "%s", g->failed_msg);
}
/* Sequence parallelism's (td_gpt_tensor_split): the ranks' R-row pieces of
 * `count` elements gathered, and the sum of `count` scattered into them
 * (td_shard_range's shards: rows [r R, (r+1) R) since p divides B*T). */
static td_status dev_allgather(void *ctx, const void *local, void *whole, size_t count, td_dtype dtype) {
  tp_gpt *g = ctx;
  if (g->failed == TD_OK) (void)fail(g, td_allgather(local, whole, count, dtype, g->comm));
  return g->failed == TD_OK ? TD_OK : td_error(g->failed, "%s", g->failed_msg);
}
static td_status dev_reduce_scatter(void *ctx, const void *whole, void *local, size_t count, td_dtype dtype) {
  tp_gpt *g = ctx;
  if (g->failed == TD_OK) (void)fail(g, td_reduce_scatter(whole, local, count, dtype, TD_SUM, g->comm));
  return g->failed == TD_OK ? TD_OK : td_error(g->failed, "%s", g->failed_msg);
}
/* The split the device model computes (sp: with sequence parallelism). */
static td_status dev_split(tp_gpt *g, int sp) {
  const td_gpt_tensor_split split = {.size = g->p, .rank = g->r, .tensors = g->tensors, .n_params = g->base.n_params,
                                     .allreduce = dev_allreduce, .ctx = g, .vocab_lo = g->v0, .vocab_count = g->Vl,
                                     .sequence_parallel = sp, .allgather = dev_allgather,
                                     .reduce_scatter = dev_reduce_scatter};
  return td_gpt_set_tensor_split(g->dev, &split);
}

/* The device model, with the engine's parameter access (ZeRO stage 3) the
 * trainer set on this wrapper: its fetches then follow this table. */
static td_model *dev_of(td_model *model) {
  tp_gpt *g = (tp_gpt *)model;
  g->dev->param_access = model->param_access;
  return g->dev;
}

static td_status dev_prepare(td_model *model, int batch) {
  tp_gpt *g = (tp_gpt *)model;
  td_status st = g->dev->ops->prepare(g->dev, batch);
  model->activation_bytes = g->dev->activation_bytes;
  return st;
}

static float dev_forward(td_model *model, const float *params, const void *inputs, const int32_t *targets,
                         int batch) {
  tp_gpt *g = (tp_gpt *)model;
  if (g->failed != TD_OK) {
    td_error(g->failed, "%s", g->failed_msg);
    return NAN;
  }
  float loss = g->dev->ops->forward(dev_of(model), params, inputs, targets, batch);
  model->activation_bytes = g->dev->activation_bytes; /* a forward at a new batch lays them out */
  return loss;
}

static void dev_backward(td_model *model, const float *params, float *grads, float loss_scale, td_grad_ready_fn ready,
                         void *ctx) {
  tp_gpt *g = (tp_gpt *)model;
  g->dev->ops->backward(dev_of(model), params, grads, loss_scale, ready, ctx);
}

static void dev_predict(td_model *model, int32_t *out) {
  tp_gpt *g = (tp_gpt *)model;
  g->dev->ops->predict(dev_of(model), out); /* its argmax over the group's vocabulary shards: the same everywhere */
}

static td_status dev_set_ckpt(td_model *model, int on) {
  tp_gpt *g = (tp_gpt *)model;
  TD_CHECK(g->dev->ops->set_activation_checkpointing(g->dev, on));
  model->activation_bytes = g->dev->activation_bytes;
  return TD_OK;
}

static size_t dev_activation_bytes(const td_model *model, int batch, int checkpointing, td_dtype compute) {
  const tp_gpt *g = (const tp_gpt *)model;
  return g->dev->ops->activation_bytes(g->dev, batch, checkpointing, compute); /* sized for the shard */
}

/* The tensor group's host staging on a device (td_model_ops): its
 * allreduces carry the micro-batch's B*T*C elements of the model's type
 * (the row-parallel sums, the column-parallel input gradients, the
 * embedding) or the loss's 2 B*T f32 row sums, on device buffers: the
 * staged path's host buffers and the host collective's shm pages they
 * move through (td_comm_staging_bytes). With sequence parallelism the
 * B*T*C ones are allgathers and reduce-scatters, the allreduces the loss's
 * and the LayerNorms' weight gradients (2C elements and their padding). */
static size_t dev_comm_staging_bytes(const td_model *model, int batch, size_t *peers) {
  const tp_gpt *g = (const tp_gpt *)model;
  const size_t BT = (size_t)batch * g->cfg.seq, es = td_dtype_size(g->dtype), rows = BT * g->C * es;
  const size_t sums = TD_MAX(2 * BT * 4, (2 * (size_t)g->C + 128) * es);
  td_comm_traffic tr = {.allreduce = TD_MAX(rows, sums), .device = rows};
  if (g->sp) tr.allreduce = sums, tr.allgather = tr.reduce_scatter = rows;
  return td_comm_staging_bytes(g->comm, &tr, peers);
}

static td_status dev_set_dtype(td_model *model, td_dtype dtype) {
  tp_gpt *g = (tp_gpt *)model;
  TD_CHECK(g->dev->ops->set_device_dtype(g->dev, dtype));
  g->dtype = dtype;
  return TD_OK;
}

static const td_model_ops tp_dev_ops = {
    .prepare = dev_prepare,
    .forward = dev_forward,
    .backward = dev_backward,
    .predict = dev_predict,
    .destroy = tp_destroy,
    .activation_bytes = dev_activation_bytes,
    .comm_staging_bytes = dev_comm_staging_bytes,
    .set_activation_checkpointing = dev_set_ckpt,
    .init_params = tp_init_params,
    .grad_norm_sq = tp_grad_norm_sq,
    .group_max = tp_group_max,
    .set_device_dtype = dev_set_dtype,
};

td_status td_gpt_tp_set_sequence_parallel(td_model *model, int on) {
  if (!model || !model->kind || strcmp(model->kind, "gpt-tp") != 0)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_gpt_tp_set_sequence_parallel: the model must come from td_gpt_tp_create");
  tp_gpt *g = (tp_gpt *)model;
  if (on && g->cfg.seq % g->p != 0)
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "sequence parallelism splits each sequence's %d positions over %d tensor-parallel ranks: use a "
                    "sequence length divisible by %d (e.g. %d)", g->cfg.seq, g->p, g->p,
                    (g->cfg.seq / g->p + 1) * g->p);
  if (g->dev) TD_CHECK(dev_split(g, on != 0)); /* the device model computes it (refused for a stage, or after prepare) */
  g->sp = on != 0;
  return TD_OK;
}

cut tp_cut_of(const char *name, size_t count, const td_gpt_config *config, int p, int r) {
  const size_t C = (size_t)config->channels, Cl = C / (size_t)p, Fl = 4 * C / (size_t)p;
  if (strcmp(name, "wte") == 0 || strcmp(name, "lm_head.weight") == 0) {
    size_t v0, vl;
    td_shard_range((size_t)config->vocab, p, r, &v0, &vl);
    return (cut){CUT_ROWS, (size_t)config->vocab, C, v0, vl, 1};
  }
  const char *dot = name[0] == 'h' ? strchr(name, '.') : NULL; /* "h<l>.<suffix>" */
  if (dot) {
    const char *w = dot + 1;
    if (!strcmp(w, "attn.qkv.weight")) return (cut){CUT_ROWS, C, C, (size_t)r * Cl, Cl, 3};
    if (!strcmp(w, "attn.qkv.bias")) return (cut){CUT_ROWS, C, 1, (size_t)r * Cl, Cl, 3};
    if (!strcmp(w, "attn.proj.weight")) return (cut){CUT_COLS, C, C, (size_t)r * Cl, Cl, 1};
    if (!strcmp(w, "mlp.fc.weight")) return (cut){CUT_ROWS, 4 * C, C, (size_t)r * Fl, Fl, 1};
    if (!strcmp(w, "mlp.fc.bias")) return (cut){CUT_ROWS, 4 * C, 1, (size_t)r * Fl, Fl, 1};
    if (!strcmp(w, "mlp.proj.weight")) return (cut){CUT_COLS, C, 4 * C, (size_t)r * Fl, Fl, 1};
  }
  return (cut){CUT_REPL, count, 1, 0, 0, 1}; /* LayerNorms, wpe, the row-parallel biases */
}

size_t tp_cut_count(const cut *k) {
  return k->kind == CUT_REPL ? k->rows * k->cols : k->kind == CUT_ROWS ? (size_t)k->blocks * k->n * k->cols
                                                                       : k->rows * k->n;
}

/* The shard of the unsplit model `full` (td_gpt_create's, or a pipeline
 * stage's from td_gpt_stage_create; the model takes it) over `tensor`. */
static td_status tp_build(const td_gpt_config *config, td_model *full, const td_gpt_stage *stage, td_comm *tensor,
                          int world_rank, td_model **out) {
  const int p = td_comm_size(tensor), r = td_comm_rank(tensor);
  tp_gpt *g = calloc(1, sizeof *g);
  if (!g) {
    td_model_destroy(full);
    return td_error(TD_ERR_SYSTEM, "gpt-tp: out of memory");
  }
  g->cfg = *config;
  g->full = full;
  g->first_layer = stage->first_layer;
  g->L = stage->n_layers;
  g->has_embed = stage->embed != 0;
  g->has_head = stage->head != 0;
  g->comm = tensor;
  g->p = p;
  g->r = r;
  g->dev = full->device.kind != TD_DEVICE_CPU ? full : NULL;
  g->dtype = TD_F32;
  g->world_rank = world_rank;
  g->world_first = world_rank - r;
  g->C = config->channels;
  g->Cl = config->channels / p;
  g->NHl = config->heads / p;
  g->Fl = 4 * config->channels / p;
  size_t v0 = 0, vl = 0;
  td_shard_range((size_t)config->vocab, p, r, &v0, &vl);
  g->v0 = (int)v0;
  g->Vl = (int)vl;
  const int n = full->n_tensors;
  g->tensors = calloc((size_t)n + 1, sizeof *g->tensors); /* + the end sentinel, as the unsplit table's */
  g->cuts = calloc((size_t)n, sizeof *g->cuts);
  g->names = calloc((size_t)n, sizeof *g->names);
  if (!g->tensors || !g->cuts || !g->names) {
    tp_destroy(&g->base);
    return td_error(TD_ERR_SYSTEM, "gpt-tp: out of memory");
  }
  g->idx_wte = g->idx_wpe = g->idx_head = g->idx_layer0 = -1;
  g->idx_lnfw = g->idx_lnfb = n;
  size_t off = 0;
  for (int i = 0; i < n; i++) {
    const char *name = full->tensors[i].name;
    cut k = tp_cut_of(name, full->tensors[i].count, config, p, r);
    if (!strcmp(name, "wte")) g->idx_wte = i;
    else if (!strcmp(name, "lm_head.weight")) g->idx_head = i;
    else if (!strcmp(name, "wpe")) g->idx_wpe = i;
    else if (!strcmp(name, "ln_f.weight")) g->idx_lnfw = i;
    else if (!strcmp(name, "ln_f.bias")) g->idx_lnfb = i;
    else if (name[0] == 'h' && g->idx_layer0 < 0) g->idx_layer0 = i; /* the first block's first tensor */
    g->cuts[i] = k;
    snprintf(g->names[i], sizeof g->names[i], "%s", name);
    g->tensors[i].name = g->names[i];
    g->tensors[i].offset = off;
    g->tensors[i].count = tp_cut_count(&k);
    off += g->tensors[i].count;
  }
  g->tensors[n] = (td_param_tensor){"", off, 0};
  g->base.ops = &tp_ops;
  g->base.kind = "gpt-tp";
  snprintf(g->config_text, sizeof g->config_text, "%s tensor_parallel=%d tensor_rank=%d", full->config, p, r);
  g->base.config = g->config_text;
  g->base.n_params = off; /* before dev_split below */
  g->base.n_tensors = n;
  g->base.tensors = g->tensors;
  g->base.input_bytes = (size_t)config->seq * (g->has_embed ? sizeof(int32_t) : (size_t)g->C * sizeof(float));
  g->base.targets_per_sample = (size_t)config->seq;
  g->base.device = full->device;
  g->base.supports_param_access = 1; /* ZeRO-3 on the CPU: the whole model or a stage (unit_fetch) */
  if (g->dev) {
    g->base.ops = &tp_dev_ops;
    g->base.supports_param_access = full->supports_param_access; /* ZeRO-3 (dev_of): the whole model, not a stage */
    td_status st = dev_split(g, 0);
    if (st != TD_OK) {
      tp_destroy(&g->base);
      return st;
    }
  }
  *out = &g->base;
  return TD_OK;
}

td_status td_gpt_tp_create(const td_gpt_config *config, const td_grid *grid, td_model **out) {
  return td_gpt_tp_create_on(config, grid, (td_device){TD_DEVICE_CPU, 0}, out);
}

td_status td_gpt_tp_create_on(const td_gpt_config *config, const td_grid *grid, td_device device, td_model **out) {
  if (!out) return td_error(TD_ERR_INVALID_ARGUMENT, "td_gpt_tp_create: out must not be NULL");
  *out = NULL;
  if (!config || !grid) return td_error(TD_ERR_INVALID_ARGUMENT, "td_gpt_tp_create: config and grid must be given");
  if (td_grid_size(grid, TD_GRID_PIPELINE) != 1)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_gpt_tp_create: the tensor-parallel GPT holds every layer; with "
                    "pipeline-parallel %d use td_gpt_pipeline_create_grid (tensor-parallel pipeline stages)",
                    td_grid_size(grid, TD_GRID_PIPELINE));
  td_comm *tensor = td_grid_comm(grid, TD_GRID_TENSOR);
  TD_CHECK(td_grid_check_gpt(config, td_comm_size(tensor), 1));
  td_model *full = NULL;
  TD_CHECK(td_gpt_create_on(config, device, &full)); /* its refusals (channels % heads, ..., the device's) */
  td_gpt_stage whole = {0, config->layers, 1, 1};
  return tp_build(config, full, &whole, tensor, td_comm_rank(td_grid_world(grid)), out);
}

td_status tp_gpt_stage_create(const td_gpt_config *config, const td_gpt_stage *stage, td_device device,
                              td_comm *tensor, int world_rank, td_model **out) {
  *out = NULL;
  TD_CHECK(td_grid_check_gpt(config, td_comm_size(tensor), 1));
  td_model *full = NULL;
  TD_CHECK(td_gpt_stage_create_on(config, stage, device, &full)); /* its refusals (the range, the device) */
  return tp_build(config, full, stage, tensor, world_rank, out);
}

static tp_gpt *as_tp(const td_model *model) {
  return model && (model->ops == &tp_ops || model->ops == &tp_dev_ops) ? (tp_gpt *)model : NULL;
}

const float *tp_gpt_stage_output(const td_model *model) {
  const tp_gpt *g = as_tp(model);
  if (g && g->dev) return td_gpt_stage_output(g->dev); /* its pinned host copy */
  if (!g || !g->acts.memory) return NULL;
  if (g->L == 0) return g->acts.encoded;
  const size_t sR = (size_t)g->acts.B * g->cfg.seq / (g->acts.sp ? (size_t)g->p : 1);
  return g->acts.res3 + (size_t)(g->L - 1) * sR * g->C;
}

void tp_gpt_stage_set_output_grad(td_model *model, const float *dout) {
  tp_gpt *g = as_tp(model);
  if (g && g->dev) td_gpt_stage_set_output_grad(g->dev, dout);
  else if (g) g->dout_ext = dout;
}

const float *tp_gpt_stage_input_grad(const td_model *model) {
  const tp_gpt *g = as_tp(model);
  if (g && g->dev) return td_gpt_stage_input_grad(g->dev);
  return g && g->acts.memory ? g->acts.dres : NULL;
}

/* The squares of elements [a, b) of a gradient arena: on the host f32; on
 * a device of the model's type, read through a host buffer in chunks (the
 * replicated tensors: wpe, the LayerNorms, the row-parallel biases). NAN
 * when a copy fails. */
static double sum_sq(const tp_gpt *g, const float *grads, size_t a, size_t b) {
  double sq = 0;
  const td_device where = td_pointer_device(grads);
  if (where.kind == TD_DEVICE_CPU) {
    for (size_t j = a; j < b; j++) sq += (double)grads[j] * grads[j];
    return sq;
  }
  enum { CHUNK = 1 << 16 };
  const size_t es = td_dtype_size(g->dtype);
  char *host = malloc(CHUNK * es);
  if (!host) return NAN;
  for (size_t j = a; j < b; j += CHUNK) {
    const size_t n = TD_MIN((size_t)CHUNK, b - j);
    if (td_device_copy(host, (td_device){TD_DEVICE_CPU, 0}, (const char *)grads + j * es, where, n * es) != TD_OK) {
      sq = NAN;
      break;
    }
    for (size_t k = 0; k < n; k++) {
      float x;
      if (es == 2) {
        uint16_t h;
        memcpy(&h, host + k * 2, 2);
        x = td_bf16_to_f32(h);
      } else {
        memcpy(&x, host + k * 4, 4);
      }
      sq += (double)x * x;
    }
  }
  free(host);
  return sq;
}

double tp_gpt_replicated_sq(const td_model *model, const float *grads, size_t lo, size_t hi) {
  const tp_gpt *g = as_tp(model);
  double sq = 0;
  if (!g || g->r == 0) return 0;
  for (int i = 0; i < g->base.n_tensors; i++)
    if (g->cuts[i].kind == CUT_REPL) {
      size_t a = TD_MAX(lo, g->tensors[i].offset), b = TD_MIN(hi, g->tensors[i].offset + g->tensors[i].count);
      if (b > a) sq += sum_sq(g, grads, a, b);
    }
  return sq;
}

const cut *tp_gpt_cuts(const td_model *model, td_gpt_config *config, int *p, int *r) {
  const tp_gpt *g = as_tp(model);
  if (!g || !g->has_embed || !g->has_head || g->L != g->cfg.layers) return NULL; /* stages: mapped by their pipeline */
  *config = g->cfg;
  *p = g->p;
  *r = g->r;
  return g->cuts;
}
