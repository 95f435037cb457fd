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
 *   3. the exchange (reduce-scatter shape): owner j of arena range
 *      R_j = det_xfer_range(j) receives R_j of every rank's cover vectors
 *      (one alltoall, M vectors of C floats per pair, padded) and combines
 *      them in the tree into its gradient shard:
 *
 *        rank 0: cover [c00 | c01]   --R_1-->   rank 1 combines
 *        rank 1: cover [c10]         --R_0-->   node(0, K) on R_1
 *        ...
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
 * the rank with the most.
 *
 * Cost against the bucketed allreduce: the same compute (the unit is the
 * micro-batch by default), a memset of the gradient vector per unit, M
 * times a reduce-scatter's traffic (M = 1 when every rank holds one unit or
 * an aligned pair) and the allgather at stage 0; the exchange starts after
 * the last backward (not overlapped with it). */
#include "train/deterministic/deterministic.h"
#include "train/zero/zero.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static void free_buffers(det_state *c) {
  td_free(c->pool);
  if (c->send_shared)
    td_mem_free(c->send);
  else
    td_free(c->send);
  c->send_shared = false;
  td_free(c->recv);
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
  c->pool = c->send = c->recv = c->scratch = NULL;
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

void det_buffer_sizes(size_t n, size_t U, int W, int rank, int stage, det_sizes *out) {
  int max_cover = 0;
  size_t xfer = 0;
  for (int r = 0; r < W; r++) {
    size_t a, len, lo, hi;
    det_block cover[DET_MAX_COVER];
    td_shard_range(U, W, r, &a, &len);
    max_cover = TD_MAX(max_cover, det_cover(U, a, a + len, cover));
    det_xfer_range(n, W, r, &lo, &hi);
    xfer = TD_MAX(xfer, hi - lo);
  }
  size_t a, len;
  td_shard_range(U, W, rank, &a, &len);
  out->n_pool = det_acc_vectors(U, a, a + len);
  /* stage 3: a rank with fewer units than rank 0 computes dropped ones
   * beside its cover (det_forward_backward) */
  size_t first0, most;
  td_shard_range(U, W, 0, &first0, &most);
  if (stage >= 3 && len < most) out->n_pool++;
  out->max_cover = max_cover;
  out->xfer = xfer;
  out->levels = det_levels(U);
  out->scratch_len = W > 1 ? xfer : n;
  out->exchange = W > 1 ? (size_t)W * (size_t)max_cover * xfer : 0;
  /* What becomes resident: the pool, send and receive, the scratch levels;
   * of send only the other ranks' slots (exchange() never writes its own,
   * whose pages stay untouched), (W - 1) x M x C of its W x M x C. */
  size_t send_written = W > 1 ? (size_t)(W - 1) * (size_t)max_cover * xfer : 0;
  out->bytes = ((size_t)out->n_pool * n + out->exchange + send_written +
                (out->levels ? (size_t)out->levels * TD_MAX(out->scratch_len, (size_t)1) : 0)) * sizeof(float);
}

size_t det_resident_bytes(const td_trainer *t) {
  const det_state *c = t ? t->det : NULL;
  if (!c) return 0;
  det_sizes z;
  det_buffer_sizes(t->n_params, c->n_units, c->world, t->rank, t->zero_stage, &z);
  const size_t f = sizeof(float);
  return zero_resident_bytes(c->pool, (size_t)c->n_pool * t->n_params * f) +
         zero_resident_bytes(c->send, z.exchange * f) + zero_resident_bytes(c->recv, z.exchange * f) +
         zero_resident_bytes(c->scratch, (size_t)z.levels * TD_MAX(z.scratch_len, (size_t)1) * f);
}

td_status det_setup(td_trainer *t) {
  det_state *c = t->det;
  free_buffers(c);
  const size_t n = t->n_params, U = c->n_units;
  det_sizes z;
  det_buffer_sizes(n, U, t->world, t->rank, t->zero_stage, &z);
  c->n_pool = z.n_pool;
  c->max_cover = z.max_cover;
  c->xfer = z.xfer;
  c->world = t->world;
  int levels = z.levels;
  size_t scratch_len = z.scratch_len, n_leaves = (n + DET_NORM_LEAF - 1) / DET_NORM_LEAF;
  size_t exchange = z.exchange;
  const int W = t->world;
  c->pool = td_alloc((size_t)c->n_pool * n * sizeof(float));
  c->send = NULL;
  if (exchange && td_comm_local_size(t->comm) > 1 && !strcmp(td_comm_transport(t->comm), "shm")) {
    /* ranks on this host read each other's send directly (comm/alltoall_shm_direct.c) */
    void *p = NULL;
    if (td_mem_alloc(exchange * sizeof(float), &p) == TD_OK) {
      c->send = p;
      c->send_shared = true;
    }
  }
  if (exchange && !c->send) c->send = td_alloc(exchange * sizeof(float));
  c->recv = exchange ? td_alloc(exchange * sizeof(float)) : NULL;
  c->scratch = levels ? td_alloc((size_t)levels * TD_MAX(scratch_len, (size_t)1) * sizeof(float)) : NULL;
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
  if (!c->pool || (exchange && (!c->send || !c->recv)) || (levels && !c->scratch) || !c->losses || !c->leaves ||
      !c->norm_parts || !c->parts || !c->parts64 || !c->inputs || !c->targets) {
    free_buffers(c);
    return td_error(TD_ERR_SYSTEM, "rank %d: out of memory for deterministic reduction (%d gradient vectors of %zu "
                    "floats, exchange of %zu floats): use a larger deterministic_unit (fewer units per rank)",
                    t->rank, c->n_pool, n, exchange);
  }
  return TD_OK;
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

/* Where the reduced gradients are combined: t->grads, or for a model on a
 * device the host copy (det_state.host_grads). */
static float *det_grads(const td_trainer *t) { return t->det->host_grads ? t->det->host_grads : t->grads; }

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

/* Step 3 of the top comment: the covers of every rank combined into this
 * rank's range of t->grads (the whole arena at world 1). */
static td_status exchange(td_trainer *t, const det_acc *acc) {
  det_state *c = t->det;
  const size_t n = t->n_params, U = c->n_units, M = (size_t)c->max_cover, C = c->xfer;
  const int W = t->world, me = t->rank;
  det_part *all = c->parts;
  int n_all = 0;
  float *scratch[DET_MAX_LEVELS];
  size_t lo = 0, hi = n;
  if (W > 1) det_xfer_range(n, W, me, &lo, &hi);
  for (int k = 0; k < det_levels(U); k++) scratch[k] = c->scratch + (size_t)k * (W > 1 ? C : n);
  if (W > 1) {
    for (int j = 0; j < W; j++) {
      size_t jlo, jhi;
      det_xfer_range(n, W, j, &jlo, &jhi);
      if (j == me || jhi == jlo) continue;
      for (int i = 0; i < acc->n_stack; i++)
        memcpy(c->send + ((size_t)j * M + (size_t)i) * C, acc->stack[i].vec + jlo, (jhi - jlo) * sizeof(float));
    }
    td_status st = td_alltoall(c->send, c->recv, M * C, TD_F32, t->comm);
    if (st != TD_OK)
      return td_error(st, "rank %d: exchanging the gradient sums of the deterministic reduction failed: %s", t->rank,
                      td_comm_last_error(t->comm));
    t->comm_bytes += (size_t)(W - 1) * M * C * sizeof(float);
    for (int r = 0; r < W; r++) {
      size_t a, len;
      det_block cover[DET_MAX_COVER];
      td_shard_range(U, W, r, &a, &len);
      int nc = det_cover(U, a, a + len, cover);
      for (int i = 0; i < nc; i++) {
        const float *v = r == me ? acc->stack[i].vec + lo : c->recv + ((size_t)r * M + (size_t)i) * C;
        all[n_all++] = (det_part){cover[i].start, cover[i].end, v};
      }
    }
  } else {
    for (int i = 0; i < acc->n_stack; i++) {
      size_t end = TD_MIN(acc->stack[i].start + ((size_t)1 << acc->stack[i].level), U);
      all[n_all++] = (det_part){acc->stack[i].start, end, acc->stack[i].vec};
    }
  }
  float *grads = det_grads(t);
  int rc = hi > lo ? det_combine_f32(U, all, n_all, grads + lo, hi - lo, scratch) : 0;
  if (rc != 0)
    return td_error(TD_ERR_INTERNAL, "rank %d: the unit sums of %d ranks do not tile the %zu units", t->rank, W, U);
  if (W > 1 && t->zero_stage == 0) {
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
  memset(c->losses, 0, (U + 1) * sizeof *c->losses);
  det_acc acc;
  det_acc_begin(&acc, U, a, n);
  for (int i = c->n_pool - 1; i >= 0; i--) acc.spare[acc.n_spare++] = c->pool + (size_t)i * n;
  /* the unit gradients are 1/U of their unit's mean loss gradient (fp16: times the loss scale) */
  float scale = (float)(t->scaler.scale / (double)U);
  size_t rounds = fetching ? most : len;
  for (size_t i = 0; i < rounds; i++) {
    if (local != TD_OK && !fetching) break;
    size_t u = i < len ? a + i : 0; /* past its own: a dropped unit, for stage 3's fetches */
    double d0 = td_now();
    if (local == TD_OK) local = load_unit(t, u);
    *data_s += td_now() - d0;
    /* stage 3's forward communicates: a rank whose data failed must not skip it while the others wait */
    if (fetching) local = td_trainer_agree(t, local);
    if (local != TD_OK) break;
    double loss = 0;
    local = forward_unit(t, u, &loss);
    if (local != TD_OK) continue;
    float *vec = acc.n_spare ? acc.spare[--acc.n_spare] : NULL;
    if (!vec) {
      local = td_error(TD_ERR_INTERNAL, "rank %d: no free gradient vector for unit %zu", t->rank, u);
      continue;
    }
    if (t->devops) {
      /* on the device, into its gradient arena, then to the host vector */
      local = td_device_memset0(t->device, t->grads, n * sizeof(float));
      if (local == TD_OK) m->ops->backward(t->model, td_trainer_model_params(t), t->grads, scale, NULL, NULL);
      if (local == TD_OK) local = td_device_copy(vec, (td_device){TD_DEVICE_CPU, 0}, t->grads, t->device,
                                                 n * sizeof(float));
      if (local != TD_OK) {
        char why[512];
        td_error_copy(why, sizeof why);
        local = td_error(local, "rank %d: step %ld, unit %zu: the device gradients: %s", t->rank, t->step + 1, u, why);
      }
    } else {
      memset(vec, 0, n * sizeof(float));
      m->ops->backward(t->model, t->params, vec, scale, NULL, NULL);
    }
    if (t->zero && t->zero->status != TD_OK) local = t->zero->status; /* a fetch in backward failed */
    if (i < len) {
      c->losses[u] = loss;
      det_acc_push(&acc, vec);
    } else {
      acc.spare[acc.n_spare++] = vec;
    }
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

  double w0 = td_now();
  td_status st = exchange(t, &acc);
  *wait_s += td_now() - w0;
  return st;
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
