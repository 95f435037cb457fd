/* ZeRO shard bookkeeping: which arena ranges a rank keeps per stage, the
 * arenas whose pages can be given back (allocated here; pages.c gives the
 * pages back and measures what a rank holds), the gradient norm from shards.
 *
 * Arenas that shrink. The model indexes parameters and gradients by arena
 * offset (tensor table), so the engine keeps full-size arenas as reserved
 * address space (mmap MAP_NORESERVE) and gives the pages it does not need
 * back with madvise(MADV_DONTNEED): a page is resident only while it holds
 * something this rank needs (its shard, a bucket in flight, a fetched
 * layer). A released page reads as zeros when touched again, which is also
 * how stage >= 2 zeroes its gradients. Pages straddling a range's edge are
 * kept (at most one per edge). Stage 1 keeps ordinary arenas. */
#include "train/zero/zero.h"
#include "train/offload/offload.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

void zero_layout(td_trainer *t) {
  t->zero_stage = t->cfg.zero_stage;
  size_t len = 0;
  td_shard_range(t->n_params, t->world, t->rank, &t->shard_lo, &len);
  t->shard_hi = t->shard_lo + len;
  t->states_lo = t->zero_stage >= 1 ? t->shard_lo : 0;
  t->states_hi = t->zero_stage >= 1 ? t->shard_hi : t->n_params;
  t->params_lo = t->zero_stage >= 3 ? t->shard_lo : 0;
  t->params_hi = t->zero_stage >= 3 ? t->shard_hi : t->n_params;
}

static float *alloc_zeroed(size_t bytes) {
  void *p = td_alloc(bytes ? bytes : sizeof(float));
  if (p) memset(p, 0, bytes ? bytes : sizeof(float));
  return p;
}

/* An arena the collectives reach directly: with ranks sharing this host
 * over the shm transport, host-shared memory (td_mem_alloc), so that the
 * allgather, allreduce and broadcast read the peers' buffers instead of
 * staging through the segment (two synchronizations per operation instead
 * of two per chunk). Its pages are given back with MADV_REMOVE (a hole in
 * the memfd). Otherwise `fallback`: reserved address space when pages are
 * given back (MAPPED), plain memory when not (ALLOC). An arena that gives
 * pages back in huge granules is always MAPPED: shared memory has no huge
 * pages here, and 4 KiB faults cost more than staging (pages.c). */
static float *arena_for(td_trainer *t, zero_mem_kind fallback, zero_mem_kind *kind) {
  size_t bytes = t->n_params * sizeof(float);
  bool huge = t->zero->granule_floats > t->zero->page_floats;
  if (zero_arena_shareable(&t->cfg, huge, fallback == ZERO_MEM_MAPPED) && t->comm && t->world > 1 &&
      td_comm_local_size(t->comm) > 1 &&
      !strcmp(td_comm_transport(t->comm), "shm")) {
    void *p = NULL;
    if (td_mem_alloc(bytes, &p) == TD_OK) {
      *kind = ZERO_MEM_SHARED;
      return p;
    }
    TD_DEBUG("rank %d: ZeRO arena in plain memory (%s)", t->rank, td_last_error());
  }
  *kind = fallback;
  return fallback == ZERO_MEM_MAPPED ? zero_reserve(bytes, t->zero->granule_floats * sizeof(float))
                                     : alloc_zeroed(bytes);
}

bool zero_arena_shareable(const td_train_config *cfg, bool huge, bool mapped) {
  /* Not with NVMe offload: host-shared memory is allocated whole up front
   * (posix_fallocate), and the arenas of a model offloaded because it does
   * not fit must stay address space whose pages come and go. */
  bool offload = cfg->offload.optimizer_device == TD_OFFLOAD_NVME || cfg->offload.param_device == TD_OFFLOAD_NVME;
  return !offload && !(huge && mapped);
}

bool zero_arenas_shared(const td_trainer *t) {
  const zero_state *z = t->zero;
  return t->grads_shared || (z && (z->params_kind == ZERO_MEM_SHARED || z->grads_kind == ZERO_MEM_SHARED));
}

bool zero_keeps_grads(size_t n_params, int world, int stage, size_t bucket_bytes) {
  return stage == 2 && world > 1 && n_params <= TD_MAX(2 * (bucket_bytes / sizeof(float)), (size_t)1);
}

td_status zero_create(td_trainer *t) {
  zero_state *z = calloc(1, sizeof *z);
  if (!z) return td_error(TD_ERR_SYSTEM, "rank %d: out of memory for the ZeRO state", t->rank);
  t->zero = z;
  z->stage = t->zero_stage;
  z->page_floats = zero_page_bytes() / sizeof(float);
  z->granule_floats = z->page_floats;
  z->status = TD_OK;
  if (z->stage >= 2) {
    size_t granule = 0;
    td_status gst = zero_granule_bytes(t->n_params, t->world, &granule);
    if (gst != TD_OK) return gst; /* the same on every rank: the environment */
    z->granule_floats = granule / sizeof(float);
  }
  size_t shard = t->shard_hi - t->shard_lo;
  t->params = arena_for(t, z->stage >= 3 ? ZERO_MEM_MAPPED : ZERO_MEM_ALLOC, &z->params_kind);
  /* Stage 3 holds only its shard from the start (trainer.c initializes the
   * shard in place): a host-shared arena comes with all its pages reserved
   * (td_mem_alloc), so give back those outside the shard before anything is
   * written; reserved address space has none yet. */
  if (z->stage >= 3 && t->params) zero_release(t, t->params, 0, t->n_params);
  /* kept whole: plain or host-shared memory (the direct allreduce), never
   * given back; given back: reserved address space */
  z->keep_grads = zero_keeps_grads(t->n_params, t->world, z->stage, t->cfg.bucket_bytes);
  /* (not for a model that runs a step's micro-batches together, a pipeline
   * stage: it accumulates them whole and reports each tensor once, final) */
  z->accum_sharded = z->stage >= 2 && !z->keep_grads && t->world > 1 && t->cfg.grad_accum > 1 &&
                     !t->model->ops->run_micro_batches;
  /* Stage 1 under deterministic reduction (train/deterministic/; elastic
   * training turns it on): it writes only its range of the gradient arena
   * and nothing reads the rest, so the arena is address space whose pages
   * come with those writes, never whole, not even at start-up. */
  bool det = t->cfg.deterministic_reduction == 1 ||
             (t->cfg.deterministic_reduction < 0 && t->cfg.elasticity.enabled);
  if (z->stage >= 2) {
    t->grads = arena_for(t, z->keep_grads ? ZERO_MEM_ALLOC : ZERO_MEM_MAPPED, &z->grads_kind);
  } else if (det) {
    t->grads = zero_reserve(t->n_params * sizeof(float), z->page_floats * sizeof(float));
    z->grads_kind = ZERO_MEM_MAPPED;
  } else {
    z->grads_kind = ZERO_MEM_NONE; /* stage 1: the trainer's own gradient arena (trainer.c) */
  }
  /* NVMe offload keeps the optimizer state in files (offload/) */
  bool states_in_ram = t->cfg.offload.optimizer_device != TD_OFFLOAD_NVME;
  for (int i = 0; states_in_ram && i < t->n_states; i++) {
    td_status sst = zero_state_alloc(shard, &t->states[i]);
    if (sst != TD_OK) return sst; /* a bad TANDEM_ZERO_HUGE_PAGES: the same on every rank */
  }
  /* a bucket splits into at most one piece per owner: buckets + world */
  z->cap_pieces = t->model->n_tensors + 2 + t->world;
  z->pieces = calloc((size_t)z->cap_pieces, sizeof *z->pieces);
  z->norm_partials = calloc((size_t)t->world, sizeof *z->norm_partials);
  if (!t->params || ((z->stage >= 2 || det) && !t->grads) ||
      (states_in_ram && (!t->states[0] || (t->n_states > 1 && !t->states[1]))) || !z->pieces ||
      !z->norm_partials)
    return td_error(TD_ERR_SYSTEM,
                    "rank %d: out of memory for the ZeRO stage-%d arenas (%zu parameters, shard of %zu)", t->rank,
                    z->stage, t->n_params, shard);
  if (z->stage >= 3) zero_fetch_init(t);
  if (z->stage >= 3 && !t->model->param_access)
    return td_error(TD_ERR_SYSTEM, "rank %d: out of memory for the stage-3 fetch tables", t->rank);
  z->measuring = true;
  return TD_OK;
}

static void free_arena(const zero_state *z, float *p, zero_mem_kind kind, size_t bytes) {
  if (!p) return;
  if (kind == ZERO_MEM_MAPPED) zero_unreserve(p, bytes, z->granule_floats * sizeof(float));
  else if (kind == ZERO_MEM_SHARED) td_mem_free(p);
  else td_free(p);
}

void zero_destroy(td_trainer *t) {
  zero_state *z = t ? t->zero : NULL;
  if (!z) return;
  for (int i = z->n_done; i < z->n_pieces; i++)
    if (z->pieces[i].req) td_wait(z->pieces[i].req);
  for (int i = 0; i < z->n_fetch_pieces; i++)
    if (z->fetch_pieces[i].req) td_wait(z->fetch_pieces[i].req);
  for (int i = 0; i < z->n_live; i++) /* parameter reads into the arena (NVMe offload) */
    if (z->live[i].disk_req) (void)offload_params_wait(t, z->live[i].disk_req);
  if (t->model && t->model->param_access == &z->access) t->model->param_access = NULL;
  size_t bytes = t->n_params * sizeof(float);
  free_arena(z, t->params, z->params_kind, bytes);
  if (z->grads_kind != ZERO_MEM_NONE) {
    free_arena(z, t->grads, z->grads_kind, bytes);
    t->grads = NULL;
  }
  t->params = NULL;
  for (int i = 0; i < 2; i++) {
    td_free(t->states[i]);
    t->states[i] = NULL;
  }
  free(z->pieces);
  free(z->live);
  free(z->fetch_pieces);
  free(z->norm_partials);
  free(z);
  t->zero = NULL;
}

td_status zero_grad_norm(td_trainer *t, double *norm_out) {
  /* The same partition at every stage, so that stage 0 and stage 2 agree
   * bit for bit (clipping multiplies every gradient by max_norm / norm). */
  td_model *m = t->model;
  double total = 0;
  if (t->zero_stage >= 2 && t->comm && t->world > 1) { /* only the shard is reduced */
    double *part = t->zero->norm_partials;
    memset(part, 0, sizeof(double) * (size_t)t->world);
    part[t->rank] = td_sum_squares(t->grads + t->shard_lo, t->shard_hi - t->shard_lo);
    /* a model split across ranks: this shard's share of the whole model,
     * summed over the model's group (its replicated tensors counted once,
     * by the shard that holds them on one rank of the group) */
    if (m->ops->grad_norm_sq) TD_CHECK(m->ops->grad_norm_sq(m, t->grads, t->shard_lo, t->shard_hi, &part[t->rank]));
    td_status st = td_allgather(part + t->rank, part, (size_t)t->world, TD_F64, t->comm);
    if (st != TD_OK)
      return td_error(st, "rank %d: gathering the gradient norm's partial sums failed: %s", t->rank,
                      td_comm_last_error(t->comm));
    for (int r = 0; r < t->world; r++) total += part[r];
  } else {
    for (int r = 0; r < t->world; r++) {
      size_t off, len;
      td_shard_range(t->n_params, t->world, r, &off, &len);
      total += td_sum_squares(t->grads + off, len);
    }
    /* every rank holds the whole averaged gradient of its part of the model */
    if (m->ops->grad_norm_sq) TD_CHECK(m->ops->grad_norm_sq(m, t->grads, 0, t->n_params, &total));
  }
  *norm_out = sqrt(total);
  return TD_OK;
}

size_t zero_model_state_bytes(const td_trainer *t) {
  /* stage 0's arenas neither grow nor shrink: what is resident now */
  size_t now = zero_model_state_resident(t);
  return t->zero ? TD_MAX(t->zero->peak_bytes, now) : now;
}
