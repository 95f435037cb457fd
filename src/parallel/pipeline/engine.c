/* The pipeline engine: one rank's part of a GPT cut into stages
 * (td_gpt_pipeline_create), presented to the trainer as a td_model whose
 * arena is this rank's chunks back to back and whose run_micro_batches op
 * runs one step of the schedule (schedule.c).
 *
 * Each chunk keeps one GPT stage model (td_gpt_stage_create) per
 * micro-batch that can be in flight on it (td_pp_max_in_flight: p-s for
 * 1F1B), all computing on the same parameter and gradient ranges; micro-
 * batch i uses slot i mod slots (forwards and backwards of a chunk both go
 * in micro-batch order, so a slot is free again when its next micro-batch
 * comes). The engine walks the action list:
 *
 *   recv_act   td_irecv into the slot's input buffer, wait (the wait is the
 *              bubble, counted as recv_wait)
 *   forward    the slot's model on its input (tokens on the first stage)
 *   send_act   td_isend of a copy of the slot model's output; sends are
 *              waited for only at the end of the step (pp_send says why)
 *   recv_grad, backward, send_grad   the same with gradients
 *
 * Sends and receives between two ranks are issued in the same order on
 * both (tests/pipeline: the simulator), which point-to-point matching
 * requires, and the communicator's progress thread moves posted sends while
 * this thread computes. On shm, a message larger than the FIFO is taken by
 * the receiving rank's progress thread before the receive is posted
 * (unexpected frames), up to the messages the schedule can have waiting at
 * this stage (td_pp_max_unexpected), a cap the engine sets on its own
 * communicator only and the memory estimate counts (unexpected_bytes; 0
 * over TCP, whose socket buffers hold the data instead).
 *
 * Order of sums: every gradient is accumulated by the stage models exactly
 * as the whole model accumulates it over the micro-steps of a step (the
 * same kernels, the same micro-batch order), so pipeline-only layouts give
 * one rank's bits. A tied wte is the exception: its two halves (the head's
 * on the last stage, the embedding's on the first) are summed at the end of
 * the step, where the whole model interleaves them per micro-batch.
 *
 * 3D (td_gpt_pipeline_create_grid with a tensor group): the stage models
 * are tensor-parallel (tp_gpt_stage_create, parallel/tensor); the pipeline
 * communicator joins the ranks of one tensor coordinate, so every transfer
 * here is between equal tensor ranks of neighbouring stages and carries
 * this rank's rows of the activation (all of them, or B*T/tp with sequence
 * parallelism). The tensor collectives run inside the stage models.
 *
 * On a device (pp->device, td_gpt_stage_create_on): the stage models keep
 * parameters, gradients and activations in device memory and hand the
 * engine host (pinned) copies of what crosses between stages, so the
 * transfers here are the CPU's, unchanged: activations and their gradients
 * go device -> pinned host -> td_isend/td_irecv (shm or TCP) -> pinned host
 * -> device. NCCL's send/recv is not used (a rank pair sharing one GPU, the
 * case the tests and the lent machine have, could not use it anyway). The
 * arenas the trainer gives are device pointers: the tied wte's exchange and
 * the gradient norm's share of it copy that tensor through the host (f32:
 * a tied GPT's device pipeline in bf16 is refused). In bf16
 * (pp_set_device_dtype) the stages compute in bf16 and the messages are
 * bf16 (act_dtype), the arenas bf16 (at()). Tensor-parallel stages on a
 * device are td_gpt_tp_create_on's (their allreduces on device buffers).
 *
 * ZeRO stage 3 (the trainer's td_param_access on this model): each chunk
 * hands its stage models that access shifted to the chunk's range of the
 * arena (shift_fetch), so they fetch each group from the data-parallel
 * owners just before use, in forward and backward, as a whole model does.
 *
 * Failures: a NaN forward (a bad token) or a failed transfer aborts the
 * pipeline communicator with the reason, so that every other stage's
 * pending receive fails within seconds naming this rank. */
#include "parallel/pipeline/pipeline.h"
#include "parallel/tensor/tensor.h"

#include "tandem/comm.h"
#include "tandem/nn.h"
#include "tandem/parallel.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct pp_chunk {
  struct pp_model *owner;         /* the engine (shift_fetch) */
  td_param_access access;         /* ZeRO stage 3: the engine's, shifted to this chunk's range (set on its slots) */
  int model_stage;                /* chunk * p + stage */
  td_gpt_stage range;             /* its blocks, embeddings, head */
  size_t offset, n_params;        /* in this rank's arena */
  int first_tensor;               /* in this rank's tensor table */
  int n_slots;
  td_model **slot;                /* n_slots stage models */
  float **act_in, **grad_in;      /* per slot: received input activation / output gradient (B, T, C) */
} pp_chunk;

/* A posted send and the copy it reads. Sends read copies, not the slot
 * models' buffers, so that nothing waits for a send to finish before the
 * end of the step: a send completes only once its receiver takes it, and a
 * rank waiting on its send while its neighbour waits on one of its own
 * (the interleaved schedule, where two ranks are each other's previous and
 * next stage) would never post the receives that finish them. */
typedef struct pp_send {
  float *buf; /* (B, T, C) */
  td_request *req;
} pp_send;

typedef struct pp_model {
  td_model base; /* first: td_model * casts to pp_model * */
  td_gpt_config cfg;
  td_comm *comm;
  td_comm *tensor;       /* tensor-parallel stages (TP x PP): the grid's tensor group; NULL: whole-width stages */
  int tp, sp, world_rank; /* tensor-parallel size (1: none), sequence parallelism, this rank in the world */
  int p, s, v;
  td_pp_schedule_kind kind;
  pp_chunk *chunks;
  td_param_tensor *tensors;
  int batch; /* prepared micro-batch (0: none) */
  int ckpt;
  int tied_wte; /* index in the table of this rank's wte to sum with the other end's (-1: none) */
  float *tied_scratch;
  float *tied_host; /* on a device: this rank's tied wte gradient, copied to the host */
  td_dtype act_dtype; /* of the activations and gradients that cross: f32, or a device stage's bf16 */
  size_t act_es;      /* its size, also the arenas' element size (a device model's type; at): f32 on the CPU */
  td_device dev;    /* where the stage models compute (the arenas live) */
  char config_text[256];
  void (*trace)(void *ctx, const char *name, double begin_s, double end_s);
  void *trace_ctx;
  pp_send *sends; /* posted (req set) or free for reuse */
  int n_sends;
  td_pipeline_stats stats;
  int warm; /* a step has run (stats count the steps after the first) */
} pp_model;

static const td_model_ops pp_ops;

/* ---- configuration ---- */

static td_status parse_config(const td_pipeline_config *pp, td_pp_schedule_kind *kind, int *chunks,
                              td_pp_partition_method *method) {
  const char *sched = pp && pp->schedule ? pp->schedule : "1f1b";
  if (!strcmp(sched, "1f1b"))
    *kind = TD_PP_1F1B;
  else if (!strcmp(sched, "interleaved"))
    *kind = TD_PP_INTERLEAVED;
  else
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "pipeline: schedule \"%s\" is not built: use \"1f1b\" (PipeDream-Flush) or \"interleaved\" "
                    "(Megatron-LM's, with --pipeline-chunks 2 or more)",
                    sched);
  *chunks = pp && pp->chunks > 0 ? pp->chunks : (*kind == TD_PP_INTERLEAVED ? 2 : 1);
  return td_pp_partition_method_parse(pp && pp->partition ? pp->partition : "uniform", method);
}

static td_status cut_layers(const td_gpt_config *c, td_pp_partition_method method, int parts, int *first) {
  size_t *w = malloc((size_t)(c->layers > 0 ? c->layers : 1) * sizeof *w);
  if (!w) return td_error(TD_ERR_SYSTEM, "pipeline: out of memory");
  if (c->layers > 0) td_pp_gpt_layer_weights(c, method, w);
  td_status st = td_pp_partition(method, w, c->layers, parts, first);
  free(w);
  return st;
}

td_status td_pipeline_check(const td_gpt_config *config, const td_pipeline_config *pp, int stages,
                            int micro_batches) {
  if (!config) return td_error(TD_ERR_INVALID_ARGUMENT, "td_pipeline_check: config is required");
  td_pp_schedule_kind kind = TD_PP_1F1B;
  int chunks = 1;
  td_pp_partition_method method = TD_PP_PARTITION_UNIFORM;
  TD_CHECK(parse_config(pp, &kind, &chunks, &method));
  TD_CHECK(td_pp_schedule_check(kind, stages, micro_batches, chunks));
  if (config->layers < stages * chunks)
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "pipeline: %d layers cannot be cut into %d stages x %d chunks (at least one block each): use "
                    "--pipeline-parallel %d or less%s, or --layers %d or more",
                    config->layers, stages, chunks, config->layers / chunks > 0 ? config->layers / chunks : 1,
                    chunks > 1 ? " or fewer --pipeline-chunks" : "", stages * chunks);
  return TD_OK;
}

/* ---- ZeRO stage 3: the trainer's parameter access, per chunk ----
 * The trainer sets td_param_access on this model, whose arena is the
 * rank's chunks back to back; a chunk's stage models index their own
 * table from 0, so each chunk hands them the same access shifted by its
 * offset (CPU stages, f32 arenas). Every data-parallel replica of this
 * stage runs the same schedule, so the fetches come in one order on the
 * ranks that broadcast them; the stage models' hint of the next group is
 * their own next one, which the schedule may not take next (a miss is a
 * fetch like any other). */
static const float *shift_fetch(void *ctx, size_t offset, size_t count, size_t next_offset, size_t next_count) {
  const pp_chunk *ch = ctx;
  const td_param_access *pa = ch->owner->base.param_access;
  return pa->fetch(pa->ctx, ch->offset + offset, count, ch->offset + next_offset, next_count) + ch->offset;
}
static void shift_release(void *ctx, size_t offset, size_t count) {
  const pp_chunk *ch = ctx;
  const td_param_access *pa = ch->owner->base.param_access;
  pa->release(pa->ctx, ch->offset + offset, count);
}
/* The slot model about to run: given the shifted access when the trainer set one on this model. */
static td_model *with_access(const pp_model *m, pp_chunk *ch, td_model *sm) {
  sm->param_access = m->base.param_access ? &ch->access : NULL;
  return sm;
}

/* ---- the model ops ---- */

static void pp_free_chunk(pp_chunk *c) {
  for (int i = 0; i < c->n_slots; i++) {
    td_model_destroy(c->slot[i]);
    td_free(c->act_in[i]);
    td_free(c->grad_in[i]);
  }
  free(c->slot);
  free(c->act_in);
  free(c->grad_in);
  memset(c, 0, sizeof *c);
}

/* Wait for every posted send (a failed step's complete with the error),
 * then free their copies. */
static void free_sends(pp_model *m) {
  for (int i = 0; i < m->n_sends; i++) {
    (void)td_wait(m->sends[i].req);
    td_free(m->sends[i].buf);
  }
  free(m->sends);
  m->sends = NULL;
  m->n_sends = 0;
}

static void pp_destroy(td_model *model) {
  pp_model *m = (pp_model *)model;
  if (!m) return;
  free_sends(m);
  for (int c = 0; m->chunks && c < m->v; c++) pp_free_chunk(&m->chunks[c]);
  free(m->chunks);
  free(m->tensors);
  td_free(m->tied_scratch);
  td_free(m->tied_host);
  free(m);
}

/* Element `off` of an arena of the stage models' type (bf16 on a device in bf16). */
static float *at(const pp_model *m, const float *arena, size_t off) {
  return (float *)((const char *)arena + off * m->act_es);
}

/* The elements (of act_dtype) of one activation message: the stage output's rows on this
 * rank, all B*T of them, or B*T/tp with sequence parallelism (each tensor
 * rank of a stage sends its own rows to the same tensor rank of the next). */
static size_t act_floats(const pp_model *m, int batch) {
  return (size_t)batch * (size_t)m->cfg.seq / (size_t)(m->sp ? m->tp : 1) * (size_t)m->cfg.channels;
}

/* The stage models' pipeline accessors: nn's GPT stage, or the tensor-parallel one. */
static td_status stage_create(const pp_model *m, const td_gpt_stage *range, td_model **out) {
  if (!m->tensor) return td_gpt_stage_create_on(&m->cfg, range, m->dev, out);
  TD_CHECK(tp_gpt_stage_create(&m->cfg, range, m->dev, m->tensor, m->world_rank, out));
  td_status st = m->sp ? td_gpt_tp_set_sequence_parallel(*out, 1) : TD_OK; /* refused for a device's stage */
  if (st != TD_OK) {
    td_model_destroy(*out);
    *out = NULL;
  }
  return st;
}
static const float *stage_output(const pp_model *m, const td_model *sm) {
  return m->tensor ? tp_gpt_stage_output(sm) : td_gpt_stage_output(sm);
}
static const float *stage_input_grad(const pp_model *m, const td_model *sm) {
  return m->tensor ? tp_gpt_stage_input_grad(sm) : td_gpt_stage_input_grad(sm);
}
static void stage_set_output_grad(const pp_model *m, td_model *sm, const float *dout) {
  if (m->tensor) tp_gpt_stage_set_output_grad(sm, dout);
  else td_gpt_stage_set_output_grad(sm, dout);
}

/* Slot i's receive buffers for the prepared micro-batch. */
static td_status alloc_slot_buffers(pp_model *m, pp_chunk *c, int i) {
  td_free(c->act_in[i]);
  td_free(c->grad_in[i]);
  c->act_in[i] = c->grad_in[i] = NULL;
  size_t bytes = act_floats(m, m->batch) * m->act_es;
  if (!c->range.embed && !(c->act_in[i] = td_alloc(bytes)))
    return td_error(TD_ERR_SYSTEM, "pipeline: out of memory for activations (%zu bytes)", bytes);
  if (!c->range.head && !(c->grad_in[i] = td_alloc(bytes)))
    return td_error(TD_ERR_SYSTEM, "pipeline: out of memory for activation gradients (%zu bytes)", bytes);
  return TD_OK;
}

/* Grow chunk c to n slots, each prepared for the current micro-batch. */
static td_status ensure_slots(pp_model *m, pp_chunk *c, int n) {
  if (n <= c->n_slots) return TD_OK;
  td_model **slot = realloc(c->slot, (size_t)n * sizeof *slot);
  if (slot) c->slot = slot;
  float **act_in = realloc(c->act_in, (size_t)n * sizeof *act_in);
  if (act_in) c->act_in = act_in;
  float **grad_in = realloc(c->grad_in, (size_t)n * sizeof *grad_in);
  if (grad_in) c->grad_in = grad_in;
  if (!slot || !act_in || !grad_in) return td_error(TD_ERR_SYSTEM, "pipeline: out of memory for slots");
  for (int i = c->n_slots; i < n; i++) {
    c->slot[i] = NULL;
    c->act_in[i] = c->grad_in[i] = NULL;
    TD_CHECK(stage_create(m, &c->range, &c->slot[i]));
    c->n_slots = i + 1; /* owned from here: pp_free_chunk releases it */
    if (m->ckpt) TD_CHECK(c->slot[i]->ops->set_activation_checkpointing(c->slot[i], 1));
    if (m->act_dtype != TD_F32) TD_CHECK(c->slot[i]->ops->set_device_dtype(c->slot[i], m->act_dtype));
    if (m->batch > 0) {
      TD_CHECK(c->slot[i]->ops->prepare(c->slot[i], m->batch));
      TD_CHECK(alloc_slot_buffers(m, c, i));
    }
  }
  return TD_OK;
}

/* The slot models stay (the tensor table names theirs); their activations
 * and the receive buffers are sized anew. */
static td_status pp_prepare(td_model *model, int batch) {
  pp_model *m = (pp_model *)model;
  if (batch <= 0) return td_error(TD_ERR_INVALID_ARGUMENT, "pipeline: micro-batch must be positive, got %d", batch);
  if (batch == m->batch) return TD_OK;
  m->batch = batch;
  m->base.activation_bytes = 0;
  free_sends(m); /* their copies are sized for the old micro-batch */
  for (int c = 0; c < m->v; c++) {
    pp_chunk *ch = &m->chunks[c];
    for (int i = 0; i < ch->n_slots; i++) {
      TD_CHECK(ch->slot[i]->ops->prepare(ch->slot[i], batch));
      TD_CHECK(alloc_slot_buffers(m, ch, i));
      m->base.activation_bytes += ch->slot[i]->activation_bytes;
    }
  }
  return TD_OK;
}

static float pp_forward(td_model *model, const float *params, const void *inputs, const int32_t *targets, int batch) {
  (void)model, (void)params, (void)inputs, (void)targets, (void)batch;
  td_error(TD_ERR_INVALID_USAGE, "pipeline: a pipeline stage runs a step's micro-batches together "
                                 "(run_micro_batches, through td_trainer_step); a lone forward (evaluation, "
                                 "sampling) is not built for pipelines");
  return NAN;
}

static void pp_backward(td_model *model, const float *params, float *grads, float loss_scale, td_grad_ready_fn ready,
                        void *ctx) {
  (void)model, (void)params, (void)grads, (void)loss_scale, (void)ready, (void)ctx;
}

static td_status pp_set_ckpt(td_model *model, int on) {
  pp_model *m = (pp_model *)model;
  m->ckpt = on != 0;
  for (int c = 0; c < m->v; c++)
    for (int i = 0; i < m->chunks[c].n_slots; i++)
      TD_CHECK(m->chunks[c].slot[i]->ops->set_activation_checkpointing(m->chunks[c].slot[i], on));
  m->batch = 0; /* the next prepare lays the activations out again */
  return TD_OK;
}

/* Activation slots per chunk at most, whatever the step's micro-batch
 * count: p - s under 1F1B; the interleaved schedule's warm-up holds more
 * (about 2(p-s-1) + (v-1)p forwards across the chunks), taken from the
 * schedule itself at a count past its warm-up, p(v+2) micro-batches, where
 * the in-flight maximum no longer grows (0: the schedule refused). */
static size_t max_slots(const pp_model *m) {
  if (m->v == 1) return (size_t)(m->p - m->s);
  int n_micro = m->p * (m->v + 2);
  int n = td_pp_schedule_length(m->kind, m->p, n_micro, m->v, m->s);
  if (n <= 0) return 0;
  td_pp_action *acts = malloc((size_t)n * sizeof *acts);
  if (!acts) return 0;
  int slots = td_pp_schedule(m->kind, m->p, n_micro, m->v, m->s, acts, n, &n) == TD_OK
                  ? td_pp_max_in_flight(acts, n, m->v)
                  : 0;
  free(acts);
  return slots > 0 ? (size_t)slots : 0;
}

/* The activation messages (and their gradients) that can reach this rank
 * before it posts their receives, at m micro-batches a step: what its
 * communicator's progress thread may take into buffers of its own (shm
 * unexpected frames, td_comm_hold_unexpected), so that a neighbour's send
 * larger than the FIFO completes while this rank computes rather than in
 * its next receive's wait. Counted in the estimate at m past the warm-up
 * (p(v+2), as max_slots), where the closed form stops growing, as far as
 * the communicator holds any (td_comm_unexpected_limit: not over TCP;
 * TANDEM_P2P_UNEXPECTED_BYTES when set). */
static size_t unexpected_bytes(const pp_model *m, int batch, int n_micro) {
  int msgs = td_pp_max_unexpected(m->kind, m->p, n_micro, m->v, m->s);
  return msgs > 0 ? (size_t)msgs * act_floats(m, batch) * m->act_es : 0;
}

static size_t pp_activation_bytes(const td_model *model, int batch, int checkpointing, td_dtype compute) {
  const pp_model *m = (const pp_model *)model;
  size_t total = 0, slots = max_slots(m);
  if (slots == 0) slots = (size_t)(m->p - m->s) * (size_t)m->v; /* the schedule will refuse; an upper guess */
  for (int c = 0; c < m->v; c++) {
    const pp_chunk *ch = &m->chunks[c];
    size_t one = ch->slot[0]->ops->activation_bytes(ch->slot[0], batch, checkpointing, compute);
    const size_t es = m->dev.kind != TD_DEVICE_CPU && compute == TD_BF16 ? 2 : sizeof(float); /* what crosses */
    size_t io = ((ch->range.embed ? 0 : 1) + (ch->range.head ? 0 : 1)) * act_floats(m, batch) * es;
    total += slots * (one + io);
  }
  return total + td_comm_unexpected_limit(m->comm, unexpected_bytes(m, batch, m->p * (m->v + 2)));
}

/* One thread runs every slot's products in turn: the largest chunk's
 * scratch, once (not per slot, as the activations are). */
static size_t pp_thread_scratch_bytes(const td_model *model, int batch) {
  const pp_model *m = (const pp_model *)model;
  size_t n = 0;
  for (int c = 0; c < m->v; c++) {
    const td_model *s = m->chunks[c].slot[0];
    if (s->ops->thread_scratch_bytes) n = TD_MAX(n, s->ops->thread_scratch_bytes(s, batch));
  }
  return n;
}

/* What a step stages (td_model_ops): on the pipeline communicator, the
 * activations and their gradients to and from the neighbouring stages
 * (1F1B: the previous and the next; interleaved: both, around the ring),
 * the tied wte with the other end, and the loss's broadcast and the norm's
 * allreduce (a few bytes); with tensor-parallel stages, the tensor group's
 * collectives, the same for every chunk (one group, one micro-batch). */
static size_t pp_comm_staging_bytes(const td_model *model, int batch, size_t *peers) {
  const pp_model *m = (const pp_model *)model;
  int ranks[3], n = 0;
  if (m->p > 1) {
    if (m->v > 1 || m->s > 0) ranks[n++] = (m->s + m->p - 1) % m->p;
    if ((m->v > 1 || m->s < m->p - 1) && (n == 0 || ranks[0] != (m->s + 1) % m->p)) ranks[n++] = (m->s + 1) % m->p;
    int other = m->s == 0 ? m->p - 1 : 0;
    if (m->tied_wte >= 0 && other != m->s && !(n > 0 && ranks[0] == other) && !(n > 1 && ranks[1] == other))
      ranks[n++] = other;
  }
  td_comm_traffic tr = {.allreduce = sizeof(double), .broadcast = sizeof(double), .send_peers = ranks,
                        .recv_peers = ranks, .n_send_peers = n, .n_recv_peers = n};
  size_t theirs = 0, all = td_comm_staging_bytes(m->comm, &tr, &theirs), tensor = 0, tensor_theirs = 0;
  for (int c = 0; c < m->v && m->tensor; c++) {
    const td_model *s = m->chunks[c].slot[0];
    size_t t_theirs = 0, t = s->ops->comm_staging_bytes ? s->ops->comm_staging_bytes(s, batch, &t_theirs) : 0;
    if (t > tensor) tensor = t, tensor_theirs = t_theirs;
  }
  if (peers) *peers = theirs + tensor_theirs;
  return all + tensor;
}

static void pp_init_params(const td_model *model, float *params, uint64_t seed) {
  const pp_model *m = (const pp_model *)model;
  for (int c = 0; c < m->v; c++) td_model_init_params(m->chunks[c].slot[0], params + m->chunks[c].offset, seed);
}

/* The whole model's squared gradient norm: this rank's part [lo, hi) of
 * its arena, less what lies there of a tied wte copy on the last stage (the
 * first stage counts the summed gradient) and, with tensor-parallel stages,
 * of the replicated tensors on tensor ranks but 0; summed over the stages
 * (and the tensor group). */
static td_status pp_grad_norm_sq(td_model *model, const float *grads, size_t lo, size_t hi, double *sum_sq) {
  pp_model *m = (pp_model *)model;
  double local = *sum_sq;
  for (int c = 0; m->tensor && c < m->v; c++) {
    const pp_chunk *ch = &m->chunks[c];
    size_t a = TD_MAX(lo, ch->offset), b = TD_MIN(hi, ch->offset + ch->n_params);
    if (b > a) local -= tp_gpt_replicated_sq(ch->slot[0], at(m, grads, ch->offset), a - ch->offset, b - ch->offset);
  }
  if (m->tied_wte >= 0 && m->s == m->p - 1) {
    const td_param_tensor *t = &m->tensors[m->tied_wte];
    size_t a = TD_MAX(lo, t->offset), b = TD_MIN(hi, t->offset + t->count);
    const float *g = grads;
    if (m->dev.kind != TD_DEVICE_CPU && b > a) { /* the device arena's copy of [a, b), through the host */
      td_status st = td_device_copy(m->tied_host, (td_device){TD_DEVICE_CPU, 0}, grads + a, m->dev,
                                    (b - a) * sizeof(float));
      if (st != TD_OK) return st;
      g = m->tied_host - a;
    }
    double copy = 0;
    for (size_t i = a; i < b; i++) copy += (double)g[i] * g[i];
    local -= copy;
    if (local < 0) local = 0;
  }
  td_status st = td_allreduce(&local, sum_sq, 1, TD_F64, TD_SUM, m->comm);
  if (st != TD_OK)
    return td_error(st, "pipeline stage %d: summing the gradient norm over the stages failed: %s", m->s,
                    td_comm_last_error(m->comm));
  if (m->tensor && (st = td_allreduce(sum_sq, sum_sq, 1, TD_F64, TD_SUM, m->tensor)) != TD_OK)
    return td_error(st, "pipeline stage %d: summing the gradient norm over the tensor-parallel group failed: %s",
                    m->s, td_comm_last_error(m->tensor));
  if (*sum_sq < 0) *sum_sq = 0; /* rounding of the subtractions */
  return TD_OK;
}

/* fp16's overflow decision, taken by every stage and tensor rank: the
 * maximum over the stages, then over the tensor group (each stage's tensor
 * rank t holds the stages' maximum for t after the first). */
static td_status pp_group_max(td_model *model, int32_t *flag) {
  pp_model *m = (pp_model *)model;
  td_status st = td_allreduce(flag, flag, 1, TD_I32, TD_MAX, m->comm);
  if (st != TD_OK)
    return td_error(st, "pipeline stage %d: agreeing on an fp16 overflow over the stages failed: %s", m->s,
                    td_comm_last_error(m->comm));
  if (m->tensor && (st = td_allreduce(flag, flag, 1, TD_I32, TD_MAX, m->tensor)) != TD_OK)
    return td_error(st, "pipeline stage %d: agreeing on an fp16 overflow over the tensor-parallel group failed: %s",
                    m->s, td_comm_last_error(m->tensor));
  return TD_OK;
}

/* ---- one step ---- */

typedef struct ready_shift {
  td_grad_ready_fn ready;
  void *ctx;
  size_t offset;
} ready_shift;

static void ready_shifted(void *ctx, size_t offset, size_t count) {
  ready_shift *r = ctx;
  r->ready(r->ctx, r->offset + offset, count);
}

/* This thread's CPU seconds (the stats' forward_cpu_s, backward_cpu_s). */
static double thread_cpu_s(void) {
  struct timespec ts;
  return clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) == 0 ? (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec : 0.0;
}

static void span(pp_model *m, const char *name, double t0, double t1) {
  if (m->trace) m->trace(m->trace_ctx, name, t0, t1);
}

/* A failure on this rank: break the group so that the other stages fail
 * now, naming this rank, rather than at their receive timeout. */
static td_status fail_group(pp_model *m, td_status st, const char *what) {
  char why[768];
  td_error_copy(why, sizeof why);
  char reason[1024];
  snprintf(reason, sizeof reason, "pipeline stage %d failed: %s: %s", m->s, what, why);
  if (m->p > 1 && td_comm_status(m->comm) == TD_OK) td_comm_abort(m->comm, reason);
  return td_error(st, "%s", reason);
}

static td_status wait_req(pp_model *m, td_request **req, double *wait_s) {
  if (!*req) return TD_OK;
  double t0 = td_now();
  td_status st = td_wait(*req);
  *req = NULL;
  double t1 = td_now();
  *wait_s += t1 - t0;
  if (t1 - t0 > 1e-5) span(m, "send_wait", t0, t1);
  return st;
}

/* Copy n floats into a free send buffer (one whose send has finished, or a
 * new one) and post its send to peer. */
static td_status post_send(pp_model *m, const float *src, size_t n, int peer) {
  pp_send *free_one = NULL;
  for (int i = 0; i < m->n_sends && !free_one; i++) {
    pp_send *x = &m->sends[i];
    if (x->req) {
      int done = 0;
      td_status st = td_test(x->req, &done);
      if (!done) continue;
      x->req = NULL;
      if (st != TD_OK) return st;
    }
    free_one = x;
  }
  if (!free_one) {
    pp_send *grown = realloc(m->sends, (size_t)(m->n_sends + 1) * sizeof *grown);
    if (!grown) return td_error(TD_ERR_SYSTEM, "pipeline: out of memory for send buffers");
    m->sends = grown;
    free_one = &m->sends[m->n_sends];
    free_one->req = NULL;
    if (!(free_one->buf = td_alloc(act_floats(m, m->batch) * m->act_es)))
      return td_error(TD_ERR_SYSTEM, "pipeline: out of memory for a send buffer");
    m->n_sends++;
  }
  memcpy(free_one->buf, src, n * m->act_es);
  m->stats.bytes_sent += (double)n * m->act_es;
  return td_isend(free_one->buf, n, m->act_dtype, peer, m->comm, &free_one->req);
}

static td_status recv_into(pp_model *m, float *buf, size_t n, int peer, const char *what, int micro) {
  td_request *req = NULL;
  double t0 = td_now();
  td_status st = td_irecv(buf, n, m->act_dtype, peer, m->comm, &req);
  if (st == TD_OK) st = td_wait(req);
  double t1 = td_now();
  m->stats.recv_wait_s += t1 - t0;
  span(m, "recv_wait", t0, t1);
  if (st != TD_OK) {
    td_error(st, "receiving the %s of micro-batch %d from stage %d: %s", what, micro, peer,
             td_comm_last_error(m->comm));
    return st;
  }
  return TD_OK;
}

/* The tied wte: the first stage's and the last stage's halves, summed the
 * same way on both (first + last), so the two copies stay equal. */
static td_status tied_sum(pp_model *m, float *grads) {
  const td_param_tensor *t = &m->tensors[m->tied_wte];
  const td_device host = {TD_DEVICE_CPU, 0};
  float *mine = grads + t->offset;
  if (m->dev.kind != TD_DEVICE_CPU) /* summed on the host (both ends alike), then copied back */
    TD_CHECK(td_device_copy(m->tied_host, host, mine, m->dev, t->count * sizeof(float)));
  float *dev_mine = mine;
  if (m->dev.kind != TD_DEVICE_CPU) mine = m->tied_host;
  int other = m->s == 0 ? m->p - 1 : 0;
  td_request *sreq = NULL, *rreq = NULL;
  td_status st = td_isend(mine, t->count, TD_F32, other, m->comm, &sreq);
  if (st == TD_OK) st = td_irecv(m->tied_scratch, t->count, TD_F32, other, m->comm, &rreq);
  td_status st2 = td_wait(rreq), st3 = td_wait(sreq);
  if (st == TD_OK) st = st2 != TD_OK ? st2 : st3;
  if (st != TD_OK) {
    td_error(st, "exchanging the tied embedding's gradient with stage %d: %s", other, td_comm_last_error(m->comm));
    return st;
  }
  const float *first = m->s == 0 ? mine : m->tied_scratch, *last = m->s == 0 ? m->tied_scratch : mine;
  for (size_t i = 0; i < t->count; i++) mine[i] = first[i] + last[i];
  if (m->dev.kind != TD_DEVICE_CPU) return td_device_copy(dev_mine, m->dev, mine, host, t->count * sizeof(float));
  return TD_OK;
}

static td_status pp_run(td_model *model, const float *params, float *grads, const void *inputs,
                        const int32_t *targets, int batch, int n_micro, float loss_scale, td_grad_ready_fn ready,
                        void *ctx, double *loss_out) {
  pp_model *m = (pp_model *)model;
  *loss_out = NAN;
  double t_begin = td_now();
  TD_CHECK(pp_prepare(model, batch));
  int n = td_pp_schedule_length(m->kind, m->p, n_micro, m->v, m->s);
  if (n <= 0) return td_pp_schedule_check(m->kind, m->p, n_micro, m->v); /* says why */
  td_pp_action *acts = malloc((size_t)n * sizeof *acts);
  if (!acts) return td_error(TD_ERR_SYSTEM, "pipeline: out of memory for the schedule");
  td_status st = td_pp_schedule(m->kind, m->p, n_micro, m->v, m->s, acts, n, &n);
  int slots = st == TD_OK ? td_pp_max_in_flight(acts, n, m->v) : 0;
  for (int c = 0; st == TD_OK && c < m->v; c++) st = ensure_slots(m, &m->chunks[c], slots);
  if (st != TD_OK) {
    free(acts);
    return st;
  }
  td_comm_hold_unexpected(m->comm, unexpected_bytes(m, batch, n_micro), act_floats(m, batch) * m->act_es);
  const size_t BTC = act_floats(m, batch), T = (size_t)m->cfg.seq;
  const size_t in_bytes = (size_t)batch * m->base.input_bytes, tgt_count = (size_t)batch * T;
  const int last_model_stage = m->p * m->v - 1;
  /* whether ready may be reported as the last backward of a chunk runs: not
   * with a tied wte, whose gradient is final only after the exchange */
  const int report = ready && m->tied_wte < 0;
  double loss_sum = 0;
  const char *what = "";
  int micro_failed = -1;
  double t_send;
  for (int i = 0; i < n && st == TD_OK; i++) {
    const td_pp_action *a = &acts[i];
    pp_chunk *ch = &m->chunks[a->chunk];
    const int sl = a->micro % ch->n_slots;
    td_model *sm = ch->slot[sl];
    micro_failed = a->micro;
    switch (a->kind) {
    case TD_PP_RECV_ACT:
      what = "receive";
      st = recv_into(m, ch->act_in[sl], BTC, a->peer, "activations", a->micro);
      break;
    case TD_PP_RECV_GRAD:
      what = "receive";
      st = recv_into(m, ch->grad_in[sl], BTC, a->peer, "activation gradients", a->micro);
      break;
    case TD_PP_FORWARD: {
      what = "forward";
      const void *in = ch->range.embed ? (const void *)((const char *)inputs + (size_t)a->micro * in_bytes)
                                       : (const void *)ch->act_in[sl];
      const int32_t *tg = targets + (size_t)a->micro * tgt_count;
      double t0 = td_now(), c0 = thread_cpu_s();
      td_error(TD_OK, "%s", "");
      float loss = sm->ops->forward(with_access(m, ch, sm), at(m, params, ch->offset), in, tg, batch);
      double t1 = td_now();
      m->stats.forward_cpu_s += thread_cpu_s() - c0;
      m->stats.forward_s += t1 - t0;
      span(m, "forward", t0, t1);
      if (isnan(loss)) {
        if (!td_last_error()[0]) td_error(TD_ERR_INVALID_ARGUMENT, "the loss is NaN (diverged? lower the learning rate)");
        st = TD_ERR_INVALID_ARGUMENT;
      } else if (ch->model_stage == last_model_stage) {
        loss_sum += loss; /* forwards run in micro-batch order: the trainer's sum */
      }
      break;
    }
    case TD_PP_SEND_ACT:
      what = "send";
      t_send = td_now();
      st = post_send(m, stage_output(m, sm), BTC, a->peer);
      span(m, "send", t_send, td_now()); /* copying and posting: the transfer runs on the communicator's thread */
      if (st != TD_OK) td_error(st, "sending activations to stage %d: %s", a->peer, td_comm_last_error(m->comm));
      break;
    case TD_PP_BACKWARD: {
      what = "backward";
      if (!ch->range.head) stage_set_output_grad(m, sm, ch->grad_in[sl]);
      ready_shift rs = {ready, ctx, ch->offset};
      int last = report && a->micro == n_micro - 1;
      double t0 = td_now(), c0 = thread_cpu_s();
      sm->ops->backward(with_access(m, ch, sm), at(m, params, ch->offset), at(m, grads, ch->offset), loss_scale,
                        last ? ready_shifted : NULL,
                        last ? &rs : NULL);
      double t1 = td_now();
      m->stats.backward_cpu_s += thread_cpu_s() - c0;
      m->stats.backward_s += t1 - t0;
      span(m, "backward", t0, t1);
      break;
    }
    case TD_PP_SEND_GRAD:
      what = "send";
      t_send = td_now();
      st = post_send(m, stage_input_grad(m, sm), BTC, a->peer);
      span(m, "send", t_send, td_now());
      if (st != TD_OK)
        td_error(st, "sending activation gradients to stage %d: %s", a->peer, td_comm_last_error(m->comm));
      break;
    }
  }
  free(acts);
  if (st != TD_OK) {
    char where[96];
    snprintf(where, sizeof where, "micro-batch %d (%s)", micro_failed, what);
    return fail_group(m, st, where);
  }
  /* every receive of this rank is done; its sends finish as the others' are */
  for (int i = 0; i < m->n_sends && st == TD_OK; i++) st = wait_req(m, &m->sends[i].req, &m->stats.send_wait_s);
  if (st != TD_OK) {
    td_error(st, "sending to a neighbour stage: %s", td_comm_last_error(m->comm));
    return fail_group(m, st, "the end of the step");
  }
  if (m->tied_wte >= 0 && (st = tied_sum(m, grads)) != TD_OK) return fail_group(m, st, "the tied embedding");
  /* the loss: the last stage's mean, as the trainer computes it, to every stage */
  double loss = m->s == m->p - 1 ? loss_sum / n_micro : 0.0;
  if (m->p > 1) {
    double t0 = td_now();
    st = td_broadcast(&loss, 1, TD_F64, m->p - 1, m->comm);
    m->stats.recv_wait_s += td_now() - t0;
    if (st != TD_OK) {
      td_error(st, "receiving the loss from the last stage: %s", td_comm_last_error(m->comm));
      return fail_group(m, st, "the loss broadcast");
    }
  }
  *loss_out = loss;
  if (!m->warm) {
    /* the first step allocates the slots' activations: not the pipeline's time */
    m->warm = 1;
    td_pipeline_stats keep = m->stats;
    memset(&m->stats, 0, sizeof m->stats);
    m->stats.stage = keep.stage, m->stats.stages = keep.stages, m->stats.chunks = keep.chunks;
    m->stats.tensor = keep.tensor;
    memcpy(m->stats.first_layer, keep.first_layer, sizeof keep.first_layer);
    memcpy(m->stats.n_layers, keep.n_layers, sizeof keep.n_layers);
    return TD_OK;
  }
  m->stats.steps++;
  m->stats.step_s += td_now() - t_begin;
  return TD_OK;
}

/* bf16 on a device (td_gpt_set_device_dtype's, for the trainer's mixed
 * precision): every stage model computes in it, and the activations and
 * their gradients cross between stages in it (half the bytes; exactly what
 * the next stage's bf16 kernels read). A tied wte's exchange is f32 on the
 * host (tied_sum), so a tied GPT is refused. Before the first prepare. */
static td_status pp_set_device_dtype(td_model *model, td_dtype dtype) {
  pp_model *m = (pp_model *)model;
  if (m->dev.kind == TD_DEVICE_CPU || (dtype != TD_F32 && dtype != TD_BF16))
    return td_error(TD_ERR_INVALID_ARGUMENT, "pipeline: stages on a device compute in f32 or bf16 (%s asked%s)",
                    td_dtype_name(dtype), m->dev.kind == TD_DEVICE_CPU ? " of stages on the CPU" : "");
  if (dtype == TD_BF16 && m->tied_wte >= 0)
    return td_error(TD_ERR_INVALID_USAGE, "pipeline: a tied GPT's stages on a GPU train in fp32 only (the tied "
                    "embedding's gradient is summed between the first and last stage in f32): untie it or train in "
                    "fp32");
  if (m->batch != 0)
    return td_error(TD_ERR_INVALID_USAGE, "pipeline: set the device dtype before the first prepare");
  for (int c = 0; c < m->v; c++)
    for (int i = 0; i < m->chunks[c].n_slots; i++) {
      td_model *sm = m->chunks[c].slot[i];
      TD_CHECK(sm->ops->set_device_dtype(sm, dtype));
    }
  m->act_dtype = dtype;
  m->act_es = td_dtype_size(dtype);
  return TD_OK;
}

static const td_model_ops pp_ops = {
    .prepare = pp_prepare,
    .forward = pp_forward,
    .backward = pp_backward,
    .predict = NULL,
    .destroy = pp_destroy,
    .set_activation_checkpointing = pp_set_ckpt,
    .activation_bytes = pp_activation_bytes,
    .thread_scratch_bytes = pp_thread_scratch_bytes,
    .comm_staging_bytes = pp_comm_staging_bytes,
    .init_params = pp_init_params,
    .grad_norm_sq = pp_grad_norm_sq,
    .group_max = pp_group_max,
    .run_micro_batches = pp_run,
    .set_device_dtype = pp_set_device_dtype,
};

/* ---- creation ---- */

/* tensor: the tensor-parallel group of tensor-parallel stages, or NULL. */
static td_status pipeline_create(const td_gpt_config *config, const td_pipeline_config *pp, td_comm *pipeline,
                                 td_comm *tensor, int world_rank, td_model **out) {
  const td_device dev = pp ? pp->device : (td_device){TD_DEVICE_CPU, 0};
  td_pp_schedule_kind kind = TD_PP_1F1B;
  int v = 1;
  td_pp_partition_method method = TD_PP_PARTITION_UNIFORM;
  TD_CHECK(parse_config(pp, &kind, &v, &method));
  const int p = td_comm_size(pipeline), s = td_comm_rank(pipeline);
  /* micro-batches are checked per step; here what the layout alone decides */
  TD_CHECK(td_pipeline_check(config, pp, p, kind == TD_PP_INTERLEAVED ? p : 1));
  int *first = malloc((size_t)(p * v + 1) * sizeof *first);
  pp_model *m = calloc(1, sizeof *m);
  if (m) m->chunks = calloc((size_t)v, sizeof *m->chunks);
  if (!first || !m || !m->chunks) {
    free(first);
    if (m) free(m->chunks);
    free(m);
    return td_error(TD_ERR_SYSTEM, "pipeline: out of memory");
  }
  m->base.ops = &pp_ops;
  m->cfg = *config;
  m->comm = pipeline;
  m->tensor = tensor;
  m->tp = tensor ? td_comm_size(tensor) : 1;
  m->sp = tensor && pp && pp->sequence_parallel;
  m->world_rank = world_rank;
  m->dev = dev;
  m->act_dtype = TD_F32;
  m->act_es = sizeof(float);
  m->p = p, m->s = s, m->v = v, m->kind = kind;
  m->tied_wte = -1;
  td_status st = cut_layers(config, method, p * v, first);
  int n_tensors = 0;
  size_t off = 0;
  for (int c = 0; c < v && st == TD_OK; c++) {
    pp_chunk *ch = &m->chunks[c];
    int k = c * p + s;
    ch->owner = m;
    ch->access = (td_param_access){shift_fetch, shift_release, ch};
    ch->model_stage = k;
    ch->range = (td_gpt_stage){first[k], first[k + 1] - first[k], k == 0, k == p * v - 1};
    st = ensure_slots(m, ch, 1);
    if (st != TD_OK) break;
    ch->offset = off;
    ch->n_params = ch->slot[0]->n_params;
    ch->first_tensor = n_tensors;
    off += ch->n_params;
    n_tensors += ch->slot[0]->n_tensors;
  }
  free(first);
  if (st == TD_OK && !(m->tensors = calloc((size_t)n_tensors + 1, sizeof *m->tensors)))
    st = td_error(TD_ERR_SYSTEM, "pipeline: out of memory");
  if (st != TD_OK) {
    pp_destroy(&m->base);
    return st;
  }
  int len = snprintf(m->config_text, sizeof m->config_text,
                     "vocab=%d layers=%d channels=%d heads=%d seq=%d tied=%d pipeline=%d/%d chunks=%d tensor=%d/%d "
                     "sequence_parallel=%d layers_here=",
                     config->vocab, config->layers, config->channels, config->heads, config->seq, config->tied ? 1 : 0,
                     s, p, v, tensor ? td_comm_rank(tensor) : 0, m->tp, m->sp);
  for (int c = 0; c < v; c++) {
    pp_chunk *ch = &m->chunks[c];
    const td_model *sm = ch->slot[0];
    for (int i = 0; i < sm->n_tensors; i++) {
      td_param_tensor t = sm->tensors[i];
      t.offset += ch->offset;
      m->tensors[ch->first_tensor + i] = t; /* the name is the stage model's, alive as long as it */
      if (config->tied && p * v > 1 && !strcmp(t.name, "wte")) m->tied_wte = ch->first_tensor + i;
    }
    if (len > 0 && (size_t)len < sizeof m->config_text)
      len += snprintf(m->config_text + len, sizeof m->config_text - (size_t)len, "%s%d-%d", c ? "," : "",
                      ch->range.first_layer, ch->range.first_layer + ch->range.n_layers);
    if (c < 8) m->stats.first_layer[c] = ch->range.first_layer, m->stats.n_layers[c] = ch->range.n_layers;
  }
  m->tensors[n_tensors] = (td_param_tensor){"", off, 0};
  if (m->tied_wte >= 0 &&
      (!(m->tied_scratch = td_alloc(m->tensors[m->tied_wte].count * sizeof(float))) ||
       (dev.kind != TD_DEVICE_CPU && !(m->tied_host = td_alloc(m->tensors[m->tied_wte].count * sizeof(float)))))) {
    pp_destroy(&m->base);
    return td_error(TD_ERR_SYSTEM, "pipeline: out of memory for the tied embedding's exchange");
  }
  m->stats.stage = s, m->stats.stages = p, m->stats.chunks = v, m->stats.tensor = m->tp;
  m->base.kind = "gpt_pipeline";
  m->base.device = dev;
  m->base.config = m->config_text;
  m->base.n_params = off;
  m->base.n_tensors = n_tensors;
  m->base.tensors = m->tensors;
  m->base.input_bytes = (size_t)config->seq * sizeof(int32_t); /* every stage is given the step's tokens */
  m->base.targets_per_sample = (size_t)config->seq;
  /* ZeRO-3: when every stage model fetches its groups (CPU stages; a device's do not) */
  m->base.supports_param_access = 1;
  for (int c = 0; c < v; c++) m->base.supports_param_access &= m->chunks[c].slot[0]->supports_param_access != 0;
  *out = &m->base;
  return TD_OK;
}

td_status td_gpt_pipeline_create(const td_gpt_config *config, const td_pipeline_config *pp, td_comm *pipeline,
                                 td_model **out) {
  if (!config || !pipeline || !out)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_gpt_pipeline_create: config, pipeline and out are required");
  *out = NULL;
  if (pp && pp->sequence_parallel)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_gpt_pipeline_create: sequence parallelism splits a tensor-parallel "
                    "group's sequence: use td_gpt_pipeline_create_grid with tensor-parallel 2 or more");
  return pipeline_create(config, pp, pipeline, NULL, td_comm_rank(pipeline), out);
}

td_status td_gpt_pipeline_create_grid(const td_gpt_config *config, const td_pipeline_config *pp, const td_grid *grid,
                                      td_model **out) {
  if (!config || !grid || !out)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_gpt_pipeline_create_grid: config, grid and out are required");
  *out = NULL;
  td_comm *tensor = td_grid_comm(grid, TD_GRID_TENSOR);
  const int tp = td_comm_size(tensor);
  TD_CHECK(td_grid_check_gpt(config, tp, 1)); /* the pipeline's own cut is td_pipeline_check's */
  if (pp && pp->sequence_parallel && (tp < 2 || config->seq % tp != 0))
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "sequence parallelism splits each sequence's %d positions over the %d tensor-parallel ranks: "
                    "use tensor-parallel 2 or more and a sequence length divisible by it", config->seq, tp);
  return pipeline_create(config, pp, td_grid_comm(grid, TD_GRID_PIPELINE), tp > 1 ? tensor : NULL,
                         td_comm_rank(td_grid_world(grid)), out);
}

static pp_model *as_pipeline(const td_model *model) {
  return model && model->ops == &pp_ops ? (pp_model *)model : NULL;
}

td_status td_gpt_pipeline_stats(const td_model *model, td_pipeline_stats *out) {
  pp_model *m = as_pipeline(model);
  if (!m || !out) return td_error(TD_ERR_INVALID_ARGUMENT, "td_gpt_pipeline_stats: not a pipeline model");
  *out = m->stats;
  return TD_OK;
}

void td_gpt_pipeline_set_trace(td_model *model, void (*fn)(void *ctx, const char *name, double begin_s, double end_s),
                               void *ctx) {
  pp_model *m = as_pipeline(model);
  if (!m) return;
  m->trace = fn;
  m->trace_ctx = ctx;
}
