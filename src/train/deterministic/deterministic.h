/* Deterministic reduction (config "deterministic_reduction"): a training
 * step whose every float sum is taken in one order fixed by the global
 * batch, never by the world size, so that N ranks compute bit for bit what
 * one rank computes, and an elastic resize continues the very same
 * training (DESIGN.md §4, §8).
 *
 * The global batch of B samples is cut into U = B / unit "units" of `unit`
 * consecutive sampler positions. Each unit's gradient and loss are computed
 * on their own (one micro-step of `unit` samples into a zeroed vector), and
 * the step's gradient is the sum of the U unit gradients in ONE binary tree
 * over the unit indices, pairwise left + right in fp32:
 *
 *     node(s, k) = the leaves [s, s + 2^k) clipped to [0, U)
 *                = node(s, k-1) + node(s + 2^(k-1), k-1)   (right non-empty)
 *                = node(s, k-1)                             (right empty)
 *     sum        = node(0, K), 2^K >= U
 *
 * Rank r owns the contiguous units [a, b) = td_shard_range(U, world, r).
 * It sums them, locally and in that tree, into the maximal nodes inside
 * [a, b) (its "cover", O(log U) vectors: tree.c). The exchange (deterministic.c)
 * sends each reduction shard's part of every cover vector to the shard's
 * owner, which combines all ranks' covers in the same tree. The loss and
 * the gradient norm are summed in trees too (leaves: the unit losses; the
 * sums of squares of 1024-float blocks of the arena). Nothing else in the
 * step adds floats across ranks.
 *
 *   tree.c             the pure dyadic-block math (covers, the stack that
 *                      builds a cover leaf by leaf, combining covers)
 *   deterministic.c        the step's units, the exchange, the norm
 *   deterministic_config.c the two config keys, the default unit, refusals
 *
 * Internal to src/train. */
#ifndef TD_TRAIN_DETERMINISTIC_H
#define TD_TRAIN_DETERMINISTIC_H

#include "train/core/core.h"

/* ---- tree.c (pure) ---- */
enum { DET_MAX_LEVELS = 62, DET_MAX_COVER = 2 * DET_MAX_LEVELS + 2 };

/* A node of the tree over n leaves: leaves [start, end), end = min(start +
 * 2^level, n). */
typedef struct det_block {
  size_t start, end;
  int level;
} det_block;

/* K: the smallest level with 2^K >= n (0 for n <= 1). */
int det_levels(size_t n);
/* The maximal nodes inside [a, b) (a <= b <= n), left to right, into out
 * (DET_MAX_COVER entries); returns their number (0 for a == b). */
int det_cover(size_t n, size_t a, size_t b, det_block *out);

/* Builds a rank's cover vector by vector: leaves a, a+1, ... are pushed in
 * order; siblings are added (left += right) as soon as both are there, so
 * that after leaf b-1 the stack holds exactly det_cover(n, a, b). Vectors
 * freed by an addition go to `spare` for the caller's next leaf. */
typedef struct det_node {
  size_t start;
  int level;
  float *vec;
} det_node;
typedef struct det_add {
  float *dst;
  const float *src;
} det_add;
typedef struct det_acc {
  size_t n, next, len; /* leaves of the tree, next leaf expected, floats per vector */
  det_node stack[DET_MAX_COVER + 1];
  int n_stack;
  float *spare[DET_MAX_COVER + 2];
  int n_spare;
  /* defer: a push records its sibling additions (dst += src, in order)
   * instead of doing them, for a leaf whose vector is not written yet
   * (the streamed last unit: det_acc_apply adds range by range as
   * backward finishes them; elementwise, so the same bits) */
  bool defer;
  det_add ops[DET_MAX_COVER + 1];
  int n_ops;
} det_acc;
void det_acc_begin(det_acc *acc, size_t n, size_t first, size_t len);
/* Push leaf acc->next with its vector (acc takes it). */
void det_acc_push(det_acc *acc, float *vec);
/* The deferred additions, on the elements [lo, hi) of their vectors. */
void det_acc_apply(det_acc *acc, size_t lo, size_t hi);
/* Vectors the stack holds at most while leaves [a, b) are pushed (plus
 * one for the leaf being computed: det_acc_vectors). */
int det_acc_vectors(size_t n, size_t a, size_t b);

/* A cover node's value, from any rank. */
typedef struct det_part {
  size_t start, end;
  const float *vec;
} det_part;
/* dst[0, len) = node(0, K) from parts that tile [0, n) (every rank's
 * cover, in any order). scratch: det_levels(n) vectors of len floats.
 * Returns 0, or -1 when the parts do not tile the leaves. */
int det_combine_f32(size_t n, const det_part *parts, int n_parts, float *dst, size_t len, float **scratch);
/* The scratch levels det_combine_f32 writes for these parts (bit l:
 * scratch[l]; the others are never touched, so never resident): a level
 * is written where a right child must itself be summed. Pure. */
uint64_t det_scratch_levels_written(size_t n, const det_part *parts, int n_parts);

/* The same tree over doubles. node value from leaf values v[leaf - first]
 * (leaves [start, end) of the node must be there). */
double det_node_f64(size_t n, size_t start, int level, const double *v, size_t first);
typedef struct det_part_f64 {
  size_t start, end;
  double value;
} det_part_f64;
/* node(0, K) from parts tiling [0, n); *ok = 0 when they do not. */
double det_combine_f64(size_t n, const det_part_f64 *parts, int n_parts, int *ok);

/* ---- deterministic.c: the trainer's deterministic step ---- */
enum { DET_NORM_LEAF = 1024 }; /* arena floats per leaf of the gradient norm's tree */

typedef struct det_state {
  size_t unit, n_units; /* samples per unit; U */
  int world;            /* the world the buffers below are cut for */
  int max_cover;        /* most cover vectors of any rank (M) */
  size_t chunk;         /* floats per chunk of the streamed exchange (B) */
  size_t granule;       /* floats per page the pool is given back in (2 MiB huge pages for large models) */
  size_t vec_stride;    /* floats between pool vectors (n rounded up to a granule) */
  size_t released_lo;   /* the streamed vector is given back (kept: zeroed) from here up (granule-aligned, a chunk's start when kept, or n) */
  float *pool;          /* n_pool reserved vectors of n_params floats: unit gradients and cover sums */
  int n_pool;
  size_t pool_bytes;    /* reserved */
  float *recv[2];       /* world x M x B each: two chunks in flight (world > 1) */
  float *scratch;       /* levels(U) x B */
  td_request **reqs[2]; /* a chunk's transfers, 2 x world x M per slot */
  int n_reqs[2];
  size_t slot_chunk[2]; /* chunk in each slot, SIZE_MAX: none */
  size_t n_launched;    /* chunks launched this step, top down */
  float *streamed;      /* the vector the last backward writes (pages given back, or zeroed, chunk by chunk) */
  bool keep_streamed;   /* det_keeps_streamed: zeroed chunk by chunk instead, pages kept */
  float *zeroed;        /* the pool vector left all zeros by the last step's stream (kept), or NULL */
  td_status stream_st;  /* first failure of the streamed exchange */
  det_acc acc;          /* this rank's cover stack (the streamed leaf's additions deferred) */
  long steps_seen;
  bool measuring;       /* the first two steps: the resident peak is tracked */
  size_t peak_bytes;
  double *losses;       /* U unit losses + the failure flag */
  double *leaves;       /* the norm's leaf values of this rank */
  size_t n_leaf_cap;
  double *norm_parts;   /* world x DET_MAX_COVER: every rank's cover values of the norm */
  det_part *parts;    /* world x DET_MAX_COVER: the exchange's table (no allocation inside a step) */
  det_part_f64 *parts64; /* the same for the norm */
  unsigned char *inputs; /* (unit, input_bytes) */
  int32_t *targets;      /* (unit, targets_per_sample) */
  /* A model on a device (t->devops): each unit's gradient is computed into
   * the device gradient arena and copied into a pool vector; the exchange,
   * the combination and the norm run on the host as for a host model, into
   * host_grads (n_params floats), whose reduced range is then copied to the
   * device arena for the optimizer. NULL for a host model (t->grads). */
  float *host_grads;
} det_state;

/* The arena range that rank r's reduction shard combines: its ZeRO shard
 * [lo, hi), extended up to the next leaf boundary of the norm so that the
 * owner holds whole leaves (neighbours compute the overlap alike). */
void det_xfer_range(size_t n_params, int world, int r, size_t *lo, size_t *hi);
/* The buffers of the reduction for rank `rank` of W over U units at ZeRO
 * stage `stage` for `model`'s n floats (what det_setup allocates): n_pool
 * gradient vectors reserved (address space), of which `whole` become
 * resident whole (the unit gradients and cover sums of the units before
 * the last) and one is streamed (the last backward's: resident only in the
 * granules backward has written and the exchange not yet given back, up to
 * `window` floats, from the model's tensor table: deterministic.c,
 * streamed_window); two receive buffers of `exchange` floats each,
 * `levels` scratch vectors of `chunk` floats (only those the combination
 * writes become resident). Pure; the estimate (det_estimate_bytes) and
 * det_setup share it. */
typedef struct det_sizes {
  int n_pool, whole, max_cover, levels;
  size_t chunk, exchange, window, granule; /* granule: floats per page the vectors are given back in */
  size_t bytes; /* what of them becomes resident at the peak */
} det_sizes;
void det_buffer_sizes(size_t n, const td_model *model, size_t U, int W, int rank, int stage, det_sizes *out);
/* Whether the streamed vector keeps its pages (zeroed behind the
 * exchange) and the trainer's gradient arena keeps only the reduction's
 * range: ZeRO stage 1 on 2+ ranks (deterministic.c, top comment). */
bool det_keeps_streamed(int world, int stage);
/* What of the trainer's gradient arena stays resident on `rank` when
 * det_keeps_streamed: its reduction range (det_xfer_range), in pages. */
size_t det_grads_resident_bytes(size_t n_params, int world, int rank);
/* Resident bytes of those buffers (mincore; the peak of the first two
 * steps, or now if more; 0 when off). */
size_t det_resident_bytes(const td_trainer *t);
/* (Re)cut the buffers for t->world (t->det->unit set). Local. */
td_status det_setup(td_trainer *t);
void det_free(td_trainer *t);
/* The step up to reduced gradients: units forward and backward, the loss
 * (canonical, agreed with every rank's status), the exchange. On return
 * t->grads holds the gradient on the whole arena (stage 0) or on at least
 * the shard (stages 1-3). Collective. */
td_status det_forward_backward(td_trainer *t, double *loss_out, double *data_s, double *wait_s);
/* The global L2 norm of the reduced gradient in the canonical tree. */
td_status det_grad_norm(td_trainer *t, double *norm_out);

/* ---- deterministic_config.c ---- */
/* Bytes of rank 0's reduction buffers at their peak for `model` on
 * `world` ranks at `stage` when cfg turns deterministic reduction on (1, or
 * -1 with "elasticity" enabled), else 0: td_trainer_estimate_memory's
 * `deterministic` term. Pure. */
size_t det_estimate_bytes(const td_train_config *cfg, const td_model *model, int world, int stage);
/* What the reduction runs on comm (td_comm_traffic, for
 * td_comm_staging_bytes: over shm the point-to-point FIFOs of the exchange,
 * to and from each peer it trades chunks with, and the few doubles of the
 * losses and the norm) added to *tr, its peer lists in `peers` (2 x the
 * communicator's size ints); nothing when cfg leaves deterministic
 * reduction off. */
void det_comm_traffic(const td_train_config *cfg, size_t n_params, const td_comm *comm, int *peers,
                      td_comm_traffic *tr);
/* "deterministic_reduction" (a boolean) or "deterministic_unit" (an
 * integer >= 1), a cJSON * item, into cfg. */
td_status td_deterministic_parse_json(const void *item, const char *source, td_train_config *cfg);
/* At td_trainer_create: turn deterministic reduction on if the config
 * asks (refusing what cannot be canonical), with the default unit for
 * this world. */
td_status det_trainer_init(td_trainer *t);
/* Elastic training: on at registration (refused if the config says
 * false); at each rebind the unit is kept (the default is fixed at the
 * first into cfg.deterministic_unit, part of the elastic state: the
 * largest divisor of the batch not above micro_hint nor batch /
 * max_world) and the buffers are recut. */
td_status det_elastic_enable(td_trainer *t);
td_status det_elastic_rebind(td_trainer *t, int micro_hint, int max_world);
/* The default unit: the largest divisor of batch that is at most
 * micro and at most batch / max_world (max_world <= 0: no bound). */
long det_default_unit(long batch, int micro, int max_world);

#endif
