/* The trainer's step under deterministic reduction (deterministic.h): units,
 * the exchange of cover sums, the canonical loss and gradient norm.
 *
 * Step, on each of W ranks holding units [a, b) of U:
 *   1. for each unit u in [a, b): forward + backward of its `unit` samples
 *      (sampler positions consumed + u*unit + [0, unit)) into a zeroed
 *      vector, pushed on the cover stack (tree.c), which adds siblings at
 *      once: a rank keeps at most O(log U) vectors of the arena's size.
 *   2. the unit losses and a failure flag: every rank writes only its own
 *      units' slots, the others are 0, so a SUM allreduce moves them
 *      exactly (x + 0 = x); then each rank sums them in the tree.
 *   3. the exchange (reduce-scatter shape), streamed: owner j of arena
 *      range R_j = det_xfer_range(j) receives R_j of every rank's cover
 *      vectors and combines them in the tree into its gradient shard. The
 *      arena is cut into chunks of B floats, exchanged top down, one
 *      point-to-point message per (rank, cover vector, owner) and chunk:
 *
 *        rank 0: cover [c00 | c01]   --chunk k of R_1-->   rank 1 combines
 *        rank 1: cover [c10]         --chunk k of R_0-->   node(0, K) there
 *
 *      The exchange runs inside the last unit's backward: a chunk leaves as
 *      soon as the frontier of final gradients (core/frontier.c) passes
 *      below it, the last leaf's additions into the cover (deferred,
 *      det_acc_apply) done chunk by chunk first, and the last backward's
 *      vector gives its pages back behind the exchange (at stage 1 it is
 *      zeroed there instead and kept: below). So a rank holds
 *      whole-model vectors only for the units before its last (none when it
 *      has one unit per step, as elastic training's default unit gives),
 *      plus two chunks in flight (receive buffers of W x M x B floats) and
 *      the tree's scratch (levels x B): bounded, not the model's size.
 *      Before that backward every rank agrees that all computed their
 *      forwards (td_trainer_agree), so that a failed rank never leaves the
 *      others waiting for its chunks. Every rank issues its transfers in
 *      one global order (chunk, then owner, then sender, then cover
 *      vector) and the communicator's progress thread runs them in issue
 *      order, so the earliest unfinished transfer always has both ends at
 *      it: no deadlock, whatever the covers' shapes.
 *
 *      Stage 0 then allgathers the shards (every rank steps the whole
 *      arena); stages 1-3 keep them (the optimizer steps the shard).
 *   4. the gradient norm: leaves are the sums of squares of 1024-float
 *      blocks of the arena (td_sum_squares), rank j holding the leaves that
 *      start in its shard (R_j reaches the end of its last one); each rank
 *      sends its leaves' cover values (allgather of a few doubles).
 *
 * At ZeRO stage 3 every forward and backward fetches parameters
 * (collective), so a rank with fewer units runs extra forwards and
 * backwards of unit 0 whose results it drops: every rank runs as many as
 * the rank with the most. At stages 0-2 a rank with fewer units streams its
 * cover while the others run their last backward.
 *
 * Bit for bit: combining chunk by chunk adds the same pairs in the same
 * order as combining whole vectors (every operation is elementwise), so
 * the result is the unstreamed one's at every world size and chunk size.
 *
 * Cost against the bucketed allreduce: the same compute (the unit is the
 * micro-batch by default), a memset of the gradient vector per unit before
 * the last, M times a reduce-scatter's traffic (M = 1 when every rank holds
 * one unit or an aligned pair), overlapped with the last backward, and the
 * allgather at stage 0.
 *
 * The streamed vector's zeros. Given back (madvise), its pages come back
 * zeroed by the kernel at backward's first touch: on huge pages a read
 * fault maps the zero page and the write fault then allocates and clears
 * 2 MiB, inside backward, every step (perf: clear_page_erms was 4.9% of an
 * elastic stage-1 run's cycles). At stage 1 on 2+ ranks the trainer's
 * gradient arena is whole, but this reduction writes only its range of it
 * (det_xfer_range) and nothing reads the rest: so that rest is given back
 * once (det_setup), and the streamed vector keeps its pages instead,
 * zeroed chunk by chunk right after each chunk is combined and sent (still
 * in cache) - about the memory of before, without the faults. Stages 0
 * (the arena is whole: the allgather fills it) and 2-3 (the arena is the
 * shard already) give the vector back as above. */
#include "train/deterministic/deterministic.h"
#include "train/zero/zero.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

void det_xfer_range(size_t n_params, int world, int r, size_t *lo, size_t *hi) {
  size_t len = 0;
  td_shard_range(n_params, world, r, lo, &len);
  size_t end = *lo + len;
  if (len) end = TD_MIN((end + DET_NORM_LEAF - 1) / DET_NORM_LEAF * DET_NORM_LEAF, n_params);
  *hi = end;
}

/* Leaves of the norm's tree rank r holds: those starting in its shard. */
static void leaf_range(size_t n_params, int world, int r, size_t *la, size_t *lb) {
  size_t lo, len;
  td_shard_range(n_params, world, r, &lo, &len);
  *la = (lo + DET_NORM_LEAF - 1) / DET_NORM_LEAF;
  *lb = (lo + len + DET_NORM_LEAF - 1) / DET_NORM_LEAF;
}

/* Give back the whole pages inside [p, p + bytes) (rounded inward: the
 * buffer may share its first and last pages with other allocations). */
static void release_inside(void *p, size_t bytes, bool shared) {
  const uintptr_t page = zero_page_bytes(), a = ((uintptr_t)p + page - 1) / page * page,
                  b = ((uintptr_t)p + bytes) / page * page;
  if (b > a) (void)madvise((void *)a, b - a, shared ? MADV_REMOVE : MADV_DONTNEED);
}

bool det_keeps_streamed(int world, int stage) { return stage == 1 && world > 1; }

size_t det_grads_resident_bytes(size_t n_params, int world, int rank) {
  size_t lo, hi, page = zero_page_bytes();
  det_xfer_range(n_params, world, rank, &lo, &hi);
  /* release_inside rounds inward: the two edge pages stay */
  return hi > lo ? ((hi - lo) * sizeof(float) + 2 * page - 1) / page * page : 0;
}

static void free_buffers(det_state *c) {
  zero_unreserve(c->pool, c->pool_bytes, c->granule * sizeof(float));
  for (int k = 0; k < 2; k++) {
    td_free(c->recv[k]);
    free(c->reqs[k]);
    c->recv[k] = NULL;
    c->reqs[k] = NULL;
  }
  td_free(c->scratch);
  free(c->losses);
  free(c->leaves);
  free(c->norm_parts);
  free(c->parts);
  free(c->parts64);
  td_free(c->inputs);
  td_free(c->targets);
  td_free(c->host_grads);
  c->host_grads = NULL;
  c->pool = c->scratch = c->streamed = c->zeroed = NULL;
  c->pool_bytes = 0;
  c->losses = c->leaves = c->norm_parts = NULL;
  c->parts = NULL;
  c->parts64 = NULL;
  c->inputs = NULL;
  c->targets = NULL;
}

void det_free(td_trainer *t) {
  if (!t || !t->det) return;
  free_buffers(t->det);
  free(t->det);
  t->det = NULL;
}

/* Floats per chunk of the streamed exchange: two chunks in flight hold 2 x
 * W x M x B floats; about 8 MiB of them, at most a sixteenth of the arena
 * (at least 64 KiB a message, at most the arena), whole pages so that the
 * streamed vector gives its pages back chunk by chunk.
 * TANDEM_TEST_DET_CHUNK sets it (tests). */
static size_t chunk_floats(size_t n, int W, int M) {
  const size_t page = zero_page_bytes() / sizeof(float);
  size_t b = ((size_t)1 << 20) / ((size_t)TD_MAX(W, 1) * (size_t)TD_MAX(M, 1));
  b = TD_MIN(b, n / 16); /* a small model: the chunks in flight stay a small part of a vector */
  b = TD_MAX(b, (size_t)16384);
  /* tests: many chunks on a small model (the bits must not change) */
  long test = td_env_long("TANDEM_TEST_DET_CHUNK", 0);
  if (test > 0) b = (size_t)test;
  b = TD_MIN(b, TD_MAX(n, (size_t)1));
  return (b + page - 1) / page * page;
}

/* Whether backward writes the first tensor's gradient at its start and
 * reports it only at its end: a tied embedding ("tied=1" in the model's
 * shape, nn.h), which the head writes first and the embedding finishes. */
static bool first_tensor_held(const td_model *m) {
  const char *p = m->config;
  while (p && (p = strstr(p, "tied=1")) != NULL) {
    if ((p == m->config || p[-1] == ' ') && (p[6] == '\0' || p[6] == ' ')) return true;
    p += 6;
  }
  return false;
}

/* The streamed vector's peak in floats (whole granules, as backward's
 * first touches and the give-backs come): backward writes the tensors in
 * reverse arena order and reports each once written (nn.h), a held first
 * tensor (first_tensor_held) keeping its granules throughout. After tensor
 * i the frontier is its offset; every chunk from there up is launched, and
 * each launch finishes the chunk launched before it, whose granules from
 * its start up are given back (stream_launch, stream_finish). The peak is
 * when a tensor has just been written: resident then are those from its
 * granule up to the lowest given back, and the held tensor's. */
static size_t streamed_window(size_t n, const td_model *m, size_t B, size_t g) {
  const size_t top = (n + g - 1) / g * g;
  if (!m || m->n_tensors == 0 || n == 0) return top; /* no reports: the frontier never moves, all of it is written */
  const size_t K = (n + B - 1) / B;
  const td_param_tensor *first = &m->tensors[0];
  const bool held = first_tensor_held(m);
  const size_t h0 = held ? first->offset / g * g : 0;
  const size_t h1 = held ? TD_MIN((first->offset + first->count + g - 1) / g * g, top) : 0;
  size_t rel = top, launched = 0, peak = 0;
  for (int i = m->n_tensors - 1; i >= 0; i--) {
    const size_t low = TD_MIN(m->tensors[i].offset / g * g, rel);
    const size_t overlap = TD_MIN(rel, h1) > TD_MAX(low, h0) ? TD_MIN(rel, h1) - TD_MAX(low, h0) : 0;
    peak = TD_MAX(peak, (rel - low) + (h1 - h0) - overlap);
    while (launched < K && (K - 1 - launched) * B >= m->tensors[i].offset) {
      size_t k = K - 1 - launched++;
      if (k + 1 < K) rel = TD_MIN(rel, ((k + 1) * B + g - 1) / g * g);
    }
  }
  return TD_MIN(peak, top);
}

/* Scratch levels written by the combination of every rank's cover (tree.c). */
static int scratch_levels_written(size_t U, int W, int levels) {
  det_part *parts = calloc((size_t)W * DET_MAX_COVER, sizeof *parts);
  if (!parts) return levels; /* all of them: the bound */
  int n_parts = 0;
  for (int r = 0; r < W; r++) {
    size_t a, len;
    det_block cover[DET_MAX_COVER];
    td_shard_range(U, W, r, &a, &len);
    int nc = det_cover(U, a, a + len, cover);
    for (int i = 0; i < nc; i++) parts[n_parts++] = (det_part){cover[i].start, cover[i].end, NULL};
  }
  uint64_t mask = det_scratch_levels_written(U, parts, n_parts);
  free(parts);
  int count = 0;
  for (; mask; mask &= mask - 1) count++;
  return count;
}

void det_buffer_sizes(size_t n, const td_model *model, size_t U, int W, int rank, int stage, det_sizes *out) {
  int max_cover = 0;
  for (int r = 0; r < W; r++) {
    size_t a, len;
    det_block cover[DET_MAX_COVER];
    td_shard_range(U, W, r, &a, &len);
    max_cover = TD_MAX(max_cover, det_cover(U, a, a + len, cover));
  }
  size_t a, len, first0, most;
  td_shard_range(U, W, rank, &a, &len);
  td_shard_range(U, W, 0, &first0, &most);
  out->n_pool = det_acc_vectors(U, a, a + len);
  /* the last backward's vector is streamed: this rank's last unit when it
   * has as many as rank 0 (the most), else at stage 3 a dropped unit's
   * (det_forward_backward), beside the cover */
  bool streams_leaf = len == most && len > 0, dropped = stage >= 3 && len < most;
  if (dropped) out->n_pool++;
  det_acc acc;
  det_acc_begin(&acc, U, a, 0);
  int whole = 0;
  for (size_t u = a; u < a + len; u++) {
    whole = TD_MAX(whole, acc.n_stack + (streams_leaf && u + 1 == a + len ? 0 : 1));
    det_acc_push(&acc, NULL);
    acc.n_spare = 0;
  }
  whole = TD_MAX(whole, acc.n_stack - (streams_leaf ? 1 : 0)); /* the cover, the streamed leaf apart */
  out->whole = whole;
  out->max_cover = TD_MAX(max_cover, 1);
  out->chunk = chunk_floats(n, W, out->max_cover);
  out->levels = det_levels(U);
  out->exchange = W > 1 ? (size_t)W * (size_t)out->max_cover * out->chunk : 0;
  size_t granule = zero_page_bytes();
  (void)zero_vector_granule(n * sizeof(float), &granule); /* a bad TANDEM_ZERO_HUGE_PAGES fails the creation */
  out->granule = granule / sizeof(float);
  /* a vector's granules: the pool's stride (det_setup) */
  size_t stride = (TD_MAX(n, (size_t)1) + out->granule - 1) / out->granule * out->granule;
  out->window = streams_leaf || dropped ? streamed_window(n, model, out->chunk, out->granule) : 0;
  if (out->window && det_keeps_streamed(W, stage)) out->window = stride; /* kept whole (top comment) */
  /* resident at the peak: the whole vectors (each its stride), the window,
   * the two receive buffers (of which the other ranks' slots are written:
   * (W - 1) x M x B each) and the scratch levels the combination writes
   * (with one unit per rank on 2 ranks, none: both parts are the root's
   * children) */
  size_t recv_written = W > 1 ? 2 * (size_t)(W - 1) * (size_t)out->max_cover * out->chunk : 0;
  size_t scratch_written = (size_t)scratch_levels_written(U, W, out->levels) * out->chunk;
  out->bytes = ((size_t)whole * stride + out->window + recv_written + scratch_written) * sizeof(float);
}

static size_t resident_now(const td_trainer *t) {
  const det_state *c = t->det;
  size_t bytes = zero_resident_bytes(c->pool, c->pool_bytes);
  size_t exchange = (size_t)c->world * (size_t)c->max_cover * c->chunk * sizeof(float);
  for (int k = 0; k < 2; k++)
    if (c->recv[k]) bytes += zero_resident_bytes(c->recv[k], exchange);
  if (c->scratch) bytes += zero_resident_bytes(c->scratch, (size_t)det_levels(c->n_units) * c->chunk * sizeof(float));
  return bytes;
}

static void measure(td_trainer *t) {
  det_state *c = t->det;
  if (!c->measuring) return;
  size_t now = resident_now(t);
  if (now > c->peak_bytes) c->peak_bytes = now;
}

size_t det_resident_bytes(const td_trainer *t) {
  const det_state *c = t ? t->det : NULL;
  if (!c || !c->pool) return 0;
  return TD_MAX(c->peak_bytes, resident_now(t));
}

td_status det_setup(td_trainer *t) {
  det_state *c = t->det;
  free_buffers(c);
  const size_t n = t->n_params, U = c->n_units;
  const int W = t->world;
  det_sizes z;
  det_buffer_sizes(n, t->model, U, W, t->rank, t->zero_stage, &z);
  size_t granule_bytes = zero_page_bytes();
  TD_CHECK(zero_vector_granule(n * sizeof(float), &granule_bytes));
  c->granule = granule_bytes / sizeof(float);
  c->n_pool = z.n_pool;
  c->max_cover = z.max_cover;
  c->chunk = z.chunk;
  c->world = W;
  c->vec_stride = (TD_MAX(n, (size_t)1) + c->granule - 1) / c->granule * c->granule;
  c->pool_bytes = (size_t)c->n_pool * c->vec_stride * sizeof(float);
  c->slot_chunk[0] = c->slot_chunk[1] = SIZE_MAX;
  c->peak_bytes = 0;
  c->steps_seen = 0;
  c->keep_streamed = det_keeps_streamed(W, t->zero_stage);
  if (c->keep_streamed && !t->devops && t->grads) {
    /* the gradient arena outside this rank's range: never written or read
     * again under this reduction (top comment) */
    size_t lo, hi;
    det_xfer_range(n, W, t->rank, &lo, &hi);
    release_inside(t->grads, lo * sizeof(float), t->grads_shared);
    release_inside(t->grads + hi, (n - hi) * sizeof(float), t->grads_shared);
  }
  size_t n_leaves = (n + DET_NORM_LEAF - 1) / DET_NORM_LEAF;
  /* address space only: a vector's pages come with backward's writes and
   * the streamed one gives them back (madvise) */
  c->pool = zero_reserve(c->pool_bytes, granule_bytes);
  bool ok = c->pool != NULL;
  for (int k = 0; k < 2 && W > 1; k++) {
    c->recv[k] = td_alloc(z.exchange * sizeof(float));
    c->reqs[k] = calloc(2 * (size_t)W * (size_t)c->max_cover, sizeof *c->reqs[k]);
    ok = ok && c->recv[k] && c->reqs[k];
  }
  c->scratch = z.levels ? td_alloc((size_t)z.levels * c->chunk * sizeof(float)) : NULL;
  c->losses = calloc(U + 1, sizeof *c->losses);
  c->leaves = calloc(TD_MAX(n_leaves, (size_t)1), sizeof *c->leaves);
  c->norm_parts = calloc((size_t)W * DET_MAX_COVER, sizeof *c->norm_parts);
  c->parts = calloc((size_t)W * DET_MAX_COVER, sizeof *c->parts);
  c->parts64 = calloc((size_t)W * DET_MAX_COVER, sizeof *c->parts64);
  c->inputs = td_alloc(c->unit * t->dataset->input_bytes);
  c->targets = td_alloc(c->unit * t->dataset->targets_per_sample * sizeof(int32_t));
  if (t->devops && !(c->host_grads = td_alloc(TD_MAX(n, (size_t)1) * sizeof(float)))) {
    free_buffers(c);
    return td_error(TD_ERR_SYSTEM, "rank %d: out of memory for the host copy of the device gradients (%zu floats) "
                    "of deterministic reduction", t->rank, n);
  }
  if (!ok || (z.levels && !c->scratch) || !c->losses || !c->leaves || !c->norm_parts || !c->parts || !c->parts64 ||
      !c->inputs || !c->targets) {
    free_buffers(c);
    return td_error(TD_ERR_SYSTEM, "rank %d: out of memory for deterministic reduction (%d gradient vectors of %zu "
                    "floats reserved, exchange of 2 x %zu floats): use a larger deterministic_unit (fewer units per "
                    "rank)", t->rank, c->n_pool, n, z.exchange);
  }
  return TD_OK;
}

/* Give back the granules wholly inside elements [lo, hi) of a pool vector
 * (they read as zeros afterwards); from the arena's end (hi >= n) the last
 * granule counts as whole. */
static void release_vec(const td_trainer *t, float *vec, size_t lo, size_t hi) {
  const det_state *c = t->det;
  const size_t g = c->granule;
  size_t p0 = (lo + g - 1) / g * g, p1 = hi >= t->n_params ? c->vec_stride : hi / g * g;
  if (p1 > p0) (void)madvise(vec + p0, (p1 - p0) * sizeof(float), MADV_DONTNEED);
}

/* Where the reduced gradients are combined: t->grads, or for a model on a
 * device the host copy (det_state.host_grads). */
static float *det_grads(const td_trainer *t) { return t->det->host_grads ? t->det->host_grads : t->grads; }

/* A model on a device: a unit's backward into the device gradient arena
 * (zeroed first), then copied into the host vector vec. */
static td_status device_backward(td_trainer *t, float *vec, float scale, size_t u) {
  const size_t n = t->n_params;
  td_status st = td_device_memset0(t->device, t->grads, n * sizeof(float));
  if (st == TD_OK) t->model->ops->backward(t->model, td_trainer_model_params(t), t->grads, scale, NULL, NULL);
  if (st == TD_OK) st = td_device_copy(vec, (td_device){TD_DEVICE_CPU, 0}, t->grads, t->device, n * sizeof(float));
  if (st == TD_OK) return TD_OK;
  char why[512];
  td_error_copy(why, sizeof why);
  return td_error(st, "rank %d: step %ld, unit %zu: the device gradients: %s", t->rank, t->step + 1, u, why);
}

/* The samples of unit u into the unit buffers. */
static td_status load_unit(td_trainer *t, size_t u) {
  const det_state *c = t->det;
  const td_dataset *ds = t->dataset;
  uint64_t pos = t->consumed + (uint64_t)u * c->unit;
  size_t tps = ds->targets_per_sample;
  for (size_t k = 0; k < c->unit; k++) {
    size_t index = td_sampler_index(&t->sampler, pos + k);
    td_status st = ds->get(ds, index, c->inputs + k * ds->input_bytes, c->targets + k * tps);
    if (st != TD_OK) {
      char why[768];
      td_error_copy(why, sizeof why);
      return td_error(st, "rank %d: step %ld, unit %zu: the dataset could not deliver sample %zu: %s", t->rank,
                      t->step + 1, u, index, why[0] ? why : "no reason given");
    }
  }
  return TD_OK;
}

static td_status forward_unit(td_trainer *t, size_t u, double *loss_out) {
  td_error(TD_OK, "%s", "");
  const det_state *c = t->det;
  float loss = t->model->ops->forward(t->model, td_trainer_model_params(t), c->inputs, c->targets, (int)c->unit);
  if (isnan(loss)) {
    char why[768];
    td_error_copy(why, sizeof why);
    return td_error(TD_ERR_INVALID_ARGUMENT, "rank %d: step %ld, unit %zu: the %s model's forward failed: %s",
                    t->rank, t->step + 1, u, t->model->kind ? t->model->kind : "?",
                    *why ? why : "the loss is NaN (diverged? lower the learning rate or clip gradients)");
  }
  if (t->zero && t->zero->status != TD_OK) return t->zero->status;
  *loss_out = loss;
  return TD_OK;
}

/* ---- step 3, the streamed exchange ---- */

/* Chunk k of the arena: [k B, min((k + 1) B, n)). */
static void chunk_range(const td_trainer *t, size_t k, size_t *x, size_t *y) {
  *x = k * t->det->chunk;
  *y = TD_MIN(*x + t->det->chunk, t->n_params);
}

static size_t n_chunks(const td_trainer *t) { return (t->n_params + t->det->chunk - 1) / t->det->chunk; }

static void stream_fail(td_trainer *t, td_status st, const char *what) {
  det_state *c = t->det;
  if (c->stream_st == TD_OK)
    c->stream_st = td_error(st, "rank %d: %s in the exchange of deterministic reduction's gradient sums failed: %s",
                            t->rank, what, td_comm_last_error(t->comm));
}

/* Wait for the chunk in `slot`, combine this rank's part of it into
 * t->grads, give the streamed vector's pages of it back. */
static void stream_finish(td_trainer *t, int slot) {
  det_state *c = t->det;
  size_t k = c->slot_chunk[slot];
  if (k == SIZE_MAX) return;
  c->slot_chunk[slot] = SIZE_MAX;
  for (int i = 0; i < c->n_reqs[slot]; i++) {
    td_status st = td_wait(c->reqs[slot][i]);
    if (st != TD_OK) stream_fail(t, st, "a transfer");
  }
  c->n_reqs[slot] = 0;
  const size_t U = c->n_units, M = (size_t)c->max_cover, B = c->chunk;
  const int W = t->world, me = t->rank;
  size_t x, y, lo = 0, hi = t->n_params;
  chunk_range(t, k, &x, &y);
  if (W > 1) det_xfer_range(t->n_params, W, me, &lo, &hi);
  x = TD_MAX(x, lo);
  y = TD_MIN(y, hi);
  if (c->stream_st == TD_OK && y > x) {
    det_part *all = c->parts;
    int n_all = 0;
    float *scratch[DET_MAX_LEVELS];
    for (int l = 0; l < det_levels(U); l++) scratch[l] = c->scratch + (size_t)l * B;
    for (int r = 0; r < W; r++) {
      size_t a, len;
      det_block cover[DET_MAX_COVER];
      td_shard_range(U, W, r, &a, &len);
      int nc = det_cover(U, a, a + len, cover);
      for (int i = 0; i < nc; i++) {
        const float *v = r == me ? c->acc.stack[i].vec + x : c->recv[slot] + ((size_t)r * M + (size_t)i) * B;
        all[n_all++] = (det_part){cover[i].start, cover[i].end, v};
      }
    }
    if (det_combine_f32(U, all, n_all, det_grads(t) + x, y - x, scratch) != 0 && c->stream_st == TD_OK)
      c->stream_st = td_error(TD_ERR_INTERNAL, "rank %d: the unit sums of %d ranks do not tile the %zu units", me,
                              W, U);
  }
  /* chunks finish top down: everything of the streamed vector from this
   * chunk up is dead, given back in whole granules, or zeroed when kept */
  size_t cx, cy;
  chunk_range(t, k, &cx, &cy);
  size_t from = c->keep_streamed ? cx : (cx + c->granule - 1) / c->granule * c->granule;
  if (c->streamed && from < c->released_lo) {
    if (c->keep_streamed)
      memset(c->streamed + from, 0, (c->released_lo - from) * sizeof(float));
    else
      release_vec(t, c->streamed, from, c->released_lo);
    c->released_lo = from;
  }
}

/* Chunk k of every cover vector is final here: do the streamed leaf's
 * deferred additions on it, send it to its owners, receive this rank's
 * part from every rank, then finish the chunk launched before (two in
 * flight). Transfers in the global order of the top comment. */
static void stream_launch(td_trainer *t, size_t k) {
  det_state *c = t->det;
  const size_t U = c->n_units, M = (size_t)c->max_cover, B = c->chunk;
  const int W = t->world, me = t->rank;
  size_t x0, y0;
  chunk_range(t, k, &x0, &y0);
  det_acc_apply(&c->acc, x0, y0);
  int slot = (int)(c->n_launched++ % 2);
  stream_finish(t, slot); /* normally already finished: two chunks back */
  c->slot_chunk[slot] = k;
  if (W > 1 && c->stream_st == TD_OK) {
    size_t a, len;
    det_block cover[DET_MAX_COVER];
    for (int j = 0; j < W; j++) {
      size_t lo, hi;
      det_xfer_range(t->n_params, W, j, &lo, &hi);
      size_t x = TD_MAX(x0, lo), y = TD_MIN(y0, hi);
      if (y <= x) continue;
      for (int r = 0; r < W && c->stream_st == TD_OK; r++) {
        if (r == j || (r != me && j != me)) continue;
        td_shard_range(U, W, r, &a, &len);
        int nc = det_cover(U, a, a + len, cover);
        for (int i = 0; i < nc; i++) {
          td_request *req = NULL;
          td_status st =
              r == me ? td_isend(c->acc.stack[i].vec + x, y - x, TD_F32, j, t->comm, &req)
                      : td_irecv(c->recv[slot] + ((size_t)r * M + (size_t)i) * B, y - x, TD_F32, r, t->comm, &req);
          if (st != TD_OK) {
            stream_fail(t, st, r == me ? "sending a chunk" : "receiving a chunk");
            break;
          }
          c->reqs[slot][c->n_reqs[slot]++] = req;
          if (r == me) t->comm_bytes += (y - x) * sizeof(float);
        }
      }
    }
  }
  measure(t); /* the high-water mark: a chunk just launched, the one before not yet given back */
  stream_finish(t, 1 - slot);
}

/* Launch every chunk at or above arena offset `front` not launched yet. */
static void stream_up_to(td_trainer *t, size_t front) {
  det_state *c = t->det;
  size_t K = n_chunks(t);
  while (c->n_launched < K) {
    size_t k = K - 1 - c->n_launched, x, y;
    chunk_range(t, k, &x, &y);
    if (x < front) return;
    stream_launch(t, k);
  }
}

static void on_grad_ready(void *ctx, size_t offset, size_t count) {
  td_trainer *t = ctx;
  if (count == 0 || t->model->n_tensors == 0) return;
  measure(t); /* the streamed vector's high-water mark: a tensor just written, nothing of it given back yet */
  stream_up_to(t, td_frontier_credit(t, offset, count));
}

/* The rest of the exchange after the last backward (or without one), then
 * stage 0's allgather. */
static td_status stream_end(td_trainer *t) {
  det_state *c = t->det;
  stream_up_to(t, 0);
  stream_finish(t, (int)(c->n_launched % 2));
  stream_finish(t, (int)((c->n_launched + 1) % 2));
  measure(t);
  /* every chunk finished: a kept vector is zeros again for the next step */
  c->zeroed = c->keep_streamed && c->released_lo == 0 ? c->streamed : NULL;
  c->streamed = NULL;
  if (c->stream_st != TD_OK) return c->stream_st;
  const size_t n = t->n_params;
  float *grads = det_grads(t);
  if (t->world > 1 && t->zero_stage == 0) {
    /* in place: the shard is where the allgather puts it */
    td_status st = td_allgather(grads + t->shard_lo, grads, n, TD_F32, t->comm);
    if (st != TD_OK)
      return td_error(st, "rank %d: allgathering the reduced gradients failed: %s", t->rank,
                      td_comm_last_error(t->comm));
    t->comm_bytes += n * sizeof(float);
  }
  if (t->devops) {
    /* to the device arena, what the optimizer reads: the whole gradient at
     * stage 0, the shard at stages 1-2 (zero/device.c) */
    size_t a = t->zero_stage >= 1 ? t->shard_lo : 0, b = t->zero_stage >= 1 ? t->shard_hi : n;
    td_status st = td_device_copy(t->grads + a, t->device, grads + a, (td_device){TD_DEVICE_CPU, 0},
                                  (b - a) * sizeof(float));
    if (st != TD_OK) {
      char why[512];
      td_error_copy(why, sizeof why);
      return td_error(st, "rank %d: copying the reduced gradients to the device failed: %s", t->rank, why);
    }
  }
  return TD_OK;
}

td_status det_forward_backward(td_trainer *t, double *loss_out, double *data_s, double *wait_s) {
  det_state *c = t->det;
  const td_model *m = t->model;
  const size_t n = t->n_params, U = c->n_units;
  const int distributed = t->comm && t->world > 1, fetching = t->zero_stage >= 3 && distributed;
  size_t a, len, first0, most;
  td_shard_range(U, t->world, t->rank, &a, &len);
  td_shard_range(U, t->world, 0, &first0, &most); /* rank 0 holds the most units */
  td_status local = TD_OK;
  if (t->prepared_batch != (int)c->unit) {
    local = m->ops->prepare(t->model, (int)c->unit);
    if (local != TD_OK) {
      char why[768];
      td_error_copy(why, sizeof why);
      local = td_error(local, "rank %d: step %ld: preparing the model for units of %zu samples failed: %s", t->rank,
                       t->step + 1, c->unit, why);
    } else {
      t->prepared_batch = (int)c->unit;
    }
  }
  if (t->zero) zero_step_begin(t);
  t->comm_bytes = 0;
  c->measuring = c->steps_seen++ < 2;
  c->stream_st = TD_OK;
  c->n_launched = 0;
  c->streamed = NULL;
  c->released_lo = n;
  memset(c->losses, 0, (U + 1) * sizeof *c->losses);
  det_acc *acc = &c->acc;
  det_acc_begin(acc, U, a, n);
  for (int i = c->n_pool - 1; i >= 0; i--) acc->spare[acc->n_spare++] = c->pool + (size_t)i * c->vec_stride;
  /* the unit gradients are 1/U of their unit's mean loss gradient (fp16: times the loss scale) */
  float scale = (float)(t->scaler.scale / (double)U);
  /* Rounds: a rank's own units; at stage 3 every rank runs the most (the
   * extra ones dropped). The last round of a rank that has one is the
   * streamed backward; the others stream their covers without one. */
  size_t rounds = fetching ? most : len;
  bool streams = rounds == most && rounds > 0;
  bool agreed = false;
  for (size_t i = 0; i < rounds; i++) {
    bool last = streams && i + 1 == rounds;
    size_t u = i < len ? a + i : 0; /* past its own: a dropped unit, for stage 3's fetches */
    double d0 = td_now();
    if (local == TD_OK) local = load_unit(t, u);
    *data_s += td_now() - d0;
    /* stage 3's forward communicates: a rank whose data failed must not skip it while the others wait */
    if (fetching) local = td_trainer_agree(t, local);
    if (fetching && local != TD_OK) break;
    double loss = 0;
    if (local == TD_OK) local = forward_unit(t, u, &loss);
    if (last) {
      /* the exchange inside this backward needs every rank's chunks */
      double w0 = td_now();
      local = distributed ? td_trainer_agree(t, local) : local;
      *wait_s += td_now() - w0;
      agreed = true;
      if (local != TD_OK) break;
    }
    if (local != TD_OK) continue;
    float *vec = acc->n_spare ? acc->spare[--acc->n_spare] : NULL;
    if (!vec) {
      local = td_error(TD_ERR_INTERNAL, "rank %d: no free gradient vector for unit %zu", t->rank, u);
      if (last) stream_fail(t, local, "finding a vector"); /* the others stream: so does this rank, without it */
      continue;
    }
    /* the zeros a kept streamed vector was left with last step hold only
     * until its first use this step (a vector freed by a merge is used again) */
    bool zeroed = vec == c->zeroed;
    if (zeroed) c->zeroed = NULL;
    if (!last && t->devops) {
      local = device_backward(t, vec, scale, u);
    } else if (!last) {
      memset(vec, 0, n * sizeof(float));
      m->ops->backward(t->model, t->params, vec, scale, NULL, NULL);
    } else {
      if (!c->keep_streamed)
        release_vec(t, vec, 0, n); /* zeros without touching a page: backward faults in what it writes */
      else if (!zeroed)
        memset(vec, 0, n * sizeof(float)); /* the first step, or a vector used before */
      c->released_lo = n;
      if (i < len) {
        acc->defer = true; /* its additions into the cover wait for backward, chunk by chunk */
        det_acc_push(acc, vec);
        acc->defer = false;
      }
      c->streamed = vec;
      td_frontier_begin(t);
      if (t->devops) {
        /* the device's gradients reach the host vector whole: the stream
         * then runs its chunks at once (a failed copy fails every chunk,
         * so that this rank still takes part in the exchange) */
        td_status dst = device_backward(t, vec, scale, u);
        if (dst != TD_OK) stream_fail(t, dst, "the device backward");
        on_grad_ready(t, 0, n);
      } else {
        m->ops->backward(t->model, t->params, vec, scale, on_grad_ready, t);
      }
    }
    if (t->zero && t->zero->status != TD_OK) local = t->zero->status; /* a fetch in backward failed */
    if (i < len) {
      c->losses[u] = loss;
      if (!last) det_acc_push(acc, vec);
    } else if (!last) {
      acc->spare[acc->n_spare++] = vec;
    }
  }
  /* a rank without a last backward (fewer units, stages 0-2) agrees where the others do */
  if (!agreed && distributed && !fetching) {
    double w0 = td_now();
    local = td_trainer_agree(t, local);
    *wait_s += td_now() - w0;
    agreed = true;
  }
  if (local == TD_OK && (agreed || !distributed)) {
    double w0 = td_now();
    td_status st = stream_end(t);
    *wait_s += td_now() - w0;
    if (st != TD_OK) local = st;
  }

  /* step 2: the losses and every rank's status, 8 (U + 1) bytes */
  c->losses[U] = local == TD_OK ? 0.0 : 1.0;
  if (distributed) {
    double w0 = td_now();
    td_status st = td_allreduce(c->losses, c->losses, U + 1, TD_F64, TD_SUM, t->comm);
    *wait_s += td_now() - w0;
    if (st != TD_OK)
      return td_error(st, "rank %d: agreeing on the step's unit losses and status failed: %s", t->rank,
                      td_comm_last_error(t->comm));
    if (c->losses[U] != 0.0) {
      td_status all = td_trainer_agree(t, local);
      return all != TD_OK ? all : td_error(TD_ERR_INTERNAL, "rank %d: the step status reduction and the agreement "
                                                              "disagree", t->rank);
    }
  } else if (local != TD_OK) {
    return local;
  }
  *loss_out = det_node_f64(U, 0, det_levels(U), c->losses, 0) / (double)U;
  return TD_OK;
}

td_status det_grad_norm(td_trainer *t, double *norm_out) {
  det_state *c = t->det;
  const size_t n = t->n_params, n_leaves = (n + DET_NORM_LEAF - 1) / DET_NORM_LEAF;
  const int W = t->world;
  /* stage 0 holds the whole reduced gradient: all leaves here, no communication */
  int whole = !(t->comm && W > 1) || t->zero_stage == 0;
  size_t la = 0, lb = n_leaves;
  if (!whole) leaf_range(n, W, t->rank, &la, &lb);
  for (size_t l = la; l < lb; l++)
    c->leaves[l - la] = td_sum_squares(det_grads(t) + l * DET_NORM_LEAF, TD_MIN((size_t)DET_NORM_LEAF, n - l * DET_NORM_LEAF));
  double total;
  if (whole) {
    total = det_node_f64(n_leaves, 0, det_levels(n_leaves), c->leaves, 0);
  } else {
    double *mine = c->norm_parts + (size_t)t->rank * DET_MAX_COVER;
    det_block cover[DET_MAX_COVER];
    int nc = det_cover(n_leaves, la, lb, cover);
    for (int i = 0; i < nc; i++) mine[i] = det_node_f64(n_leaves, cover[i].start, cover[i].level, c->leaves, la);
    td_status st = td_allgather(mine, c->norm_parts, (size_t)W * DET_MAX_COVER, TD_F64, t->comm);
    if (st != TD_OK)
      return td_error(st, "rank %d: gathering the gradient norm's partial sums failed: %s", t->rank,
                      td_comm_last_error(t->comm));
    det_part_f64 *parts = c->parts64;
    int n_parts = 0, ok = 0;
    for (int r = 0; r < W; r++) {
      size_t ra, rb;
      leaf_range(n, W, r, &ra, &rb);
      nc = det_cover(n_leaves, ra, rb, cover);
      for (int i = 0; i < nc; i++)
        parts[n_parts++] = (det_part_f64){cover[i].start, cover[i].end, c->norm_parts[(size_t)r * DET_MAX_COVER + (size_t)i]};
    }
    total = det_combine_f64(n_leaves, parts, n_parts, &ok);
    if (!ok) return td_error(TD_ERR_INTERNAL, "rank %d: the gradient norm's leaves do not tile the arena", t->rank);
  }
  *norm_out = sqrt(total);
  return TD_OK;
}
