/* ZeRO stages 1-3 on device arenas (issue 18): what zero/reduce.c,
 * zero/shard.c and zero/fetch.c do for host arenas, for a model on a device
 * (t->devops).
 *
 * A device model writes every gradient of every tensor during backward, so
 * its gradient array (t->model_grads or t->grads, f32 or bf16) is whole on
 * every rank at every stage; cudaMalloc'd memory cannot give pages back as
 * the host arenas do (pages.c). What the stages shard on a device:
 *
 *   stage 1  the AdamW moments: each rank keeps its shard
 *            td_shard_range(n_params, world, rank) of m and v (allocated
 *            shard-sized by trainer.c) and updates only that range of the
 *            master params; the gradients are averaged whole by stage 0's
 *            allreduce buckets (trainer.c).
 *   stage 2  as stage 1, and a gradient bucket [lo, hi) is cut at the shard
 *            boundaries, each piece reduced (td_ireduce, TD_AVG) to its
 *            owner only (a reduce-scatter's traffic, half an allreduce's):
 *
 *              shards:  [ rank 0      | rank 1      ]
 *              bucket:          [=======|===]
 *              pieces:          [ to 0 ][to 1]
 *
 *            Gradient accumulation adds the micro-steps locally first (the
 *            whole array is there anyway), so the last backward's buckets
 *            carry the sum, as at stage 0.
 *
 * After the update every rank allgathers the master params (f32, in place:
 * its own shard is already where the allgather puts it), and with bf16 the
 * model's copy is rounded again from them (td_trainer_device_params_changed).
 * The gradient norm is the sum of the owners' shard sums (device kernel,
 * fixed order), added in rank order on every rank: the same at stages 1
 * and 2; stage 0 sums the whole array in one pass, so stages 1-2 differ
 * from it by the rounding of the norm only (the clip factor), 1e-7
 * relative.
 *
 *   stage 3  as stage 2, and the parameters are sharded too: a rank holds
 *            the f32 masters of its shard only (and, in bf16, the model's
 *            bf16 copy of its shard), addressed like a whole arena
 *            (core.h: t->params + i is element i for i in the shard). The
 *            model brackets each group of parameters (the embeddings, a
 *            block, the head) with td_param_access's fetch and release,
 *            as the CPU GPT does for fetch.c; here a fetch fills one of
 *            ZERO_DEV_SLOTS device buffers, each the size of the model's
 *            largest group, with the group in the model's type: the owner
 *            of each piece copies it from its shard, then broadcasts it
 *            (the device collectives: staged through pinned host memory
 *            when ranks share a GPU, NCCL when each has its own):
 *
 *              shards:  [ rank 0          | rank 1          ]
 *              fetch block 3:        [=====|===]
 *              slot:                 [ from 0 | from 1 ]
 *
 *            and returns the address element 0 of the arena would have
 *            if the slot were the arena (slot - lo), so the model indexes
 *            with tensor offsets as usual. A released group stays in its
 *            slot, valid for the rest of the step (parameters change only
 *            in the update), and a fetch of it or of a range inside it
 *            (the tied head's wte inside the embeddings) costs nothing;
 *            a fetch of another group refills the least recently used
 *            free slot. Two slots hold what the GPT has in use at once
 *            (the head and, tied, the embedding matrix); a model that
 *            holds more fails its step saying so. The gradients stay
 *            whole, as at stages 1-2 (the device model writes every
 *            tensor's gradient in backward), reduced to their owners; the
 *            update writes the shard's masters (and bf16 copy), and
 *            nothing is allgathered.
 *
 *            Prefetch: with each fetch the model names the group it will
 *            fetch next; once the current group is ready, that group's
 *            broadcasts are launched (non-blocking) into the other slot,
 *            if it is free and the group is at most
 *            stage3_prefetch_bucket_size parameters, so that they travel
 *            (the device collectives' own streams and thread) while the
 *            model's stream computes with the current group; the model's
 *            fetch of it then waits only for what has not arrived:
 *
 *              model stream:  [ block l computes ][ block l+1 ...
 *              slot A:        [ block l, in use  ]  (released: free)
 *              slot B:        [ bcast block l+1 ]-> waited at its fetch
 *
 *            A slot is refilled only when free: the model released it
 *            after its stream finished reading it (gpt_cuda.c), so a
 *            prefetch never overwrites parameters still being read.
 *            The GPT with L blocks and a tied head, per micro-step:
 *            forward fills L + 3 groups (the embeddings, the blocks, the
 *            final layernorm, wte again for the head), backward L (the
 *            final group and wte are still in the slots), each but the
 *            first of a pass launched ahead: 2L + 3 fills, 2L + 1 ahead
 *            (td_step_stats.param_fetches and param_prefetches).
 *            Not done: cudaMalloc'd slots smaller than the largest
 *            group. Every rank makes the same fetches in the same order,
 *            and the slot chosen depends only on them, so the broadcasts
 *            match; a failure is kept in dev_fetch->status (the model
 *            sees a NULL base and stops) and fails the step.
 * Internal to src/train. */
#include "train/zero/zero.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

static size_t model_es(const td_trainer *t) { return td_dtype_size(t->model_dtype); }

td_status zero_device_bucket_launch(td_trainer *t, size_t lo, size_t hi) {
  char *grads = td_trainer_model_grads(t);
  const size_t es = model_es(t);
  for (int r = 0; r < t->world; r++) {
    size_t off, len;
    td_shard_range(t->n_params, t->world, r, &off, &len);
    size_t a = TD_MAX(lo, off), b = TD_MIN(hi, off + len);
    if (b <= a) continue;
    td_request *req = NULL;
    td_status st = td_ireduce(grads + a * es, grads + a * es, b - a, t->model_dtype, TD_AVG, r, t->comm, &req);
    if (st != TD_OK)
      return td_error(st, "rank %d: reducing device gradients [%zu, %zu) to their owner, rank %d, failed: %s", t->rank,
                      a, b, r, td_comm_last_error(t->comm));
    if (t->n_requests == t->cap_requests) {
      td_wait(req);
      return td_error(TD_ERR_INTERNAL, "rank %d: more than %d gradient pieces in one step", t->rank, t->cap_requests);
    }
    t->requests[t->n_requests++] = req;
  }
  return TD_OK;
}

td_status zero_device_grad_norm(td_trainer *t, double *norm_out) {
  double part[1] = {0};
  const size_t es = model_es(t);
  const char *grads = td_trainer_model_grads(t);
  /* this rank's shard (whole on every rank at stage 1, reduced only there at stage 2) */
  TD_CHECK(t->devops->sum_squares(t->device, t->dev_scratch, grads + t->shard_lo * es, t->model_dtype,
                                  t->shard_hi - t->shard_lo, &part[0]));
  /* a model split across ranks (a pipeline stage): this shard's share of the whole model's */
  if (t->model->ops->grad_norm_sq)
    TD_CHECK(t->model->ops->grad_norm_sq(t->model, (const float *)(const void *)grads, t->shard_lo, t->shard_hi,
                                         &part[0]));
  double total = part[0];
  if (t->comm && t->world > 1) {
    double *parts = t->dev_norm_parts;
    for (int r = 0; r < t->world; r++) parts[r] = 0;
    parts[t->rank] = part[0];
    td_status st = td_allgather(parts + t->rank, parts, (size_t)t->world, TD_F64, t->comm);
    if (st != TD_OK)
      return td_error(st, "rank %d: gathering the gradient norm's partial sums failed: %s", t->rank,
                      td_comm_last_error(t->comm));
    total = 0;
    for (int r = 0; r < t->world; r++) total += parts[r]; /* rank order: the same bits on every rank */
  }
  *norm_out = sqrt(total);
  return TD_OK;
}

td_status zero_device_update(td_trainer *t, float lr, float grad_scale, long adam_t) {
  const td_optimizer_config *o = &t->cfg.optimizer;
  const size_t lo = t->shard_lo, n = t->shard_hi - t->shard_lo, es = model_es(t);
  char *copy = t->model_params ? (char *)t->model_params + lo * es : NULL;
  const char *grads = (const char *)td_trainer_model_grads(t) + lo * es;
  /* the states are shard-sized: element 0 is element shard_lo */
  TD_CHECK(t->devops->adamw(t->device, t->params + lo, copy, grads, t->model_dtype, t->states[0], t->states[1], n, lr,
                            o->beta1, o->beta2, o->eps, o->weight_decay, adam_t, grad_scale));
  /* stage 3: the shard is all a rank holds; the next step fetches the rest */
  if (!t->comm || t->world == 1 || t->zero_stage >= 3) return TD_OK;
  td_status st = td_allgather(t->params + lo, t->params, t->n_params, TD_F32, t->comm);
  if (st != TD_OK)
    return td_error(st, "rank %d: allgathering the updated device parameters failed: %s", t->rank,
                    td_comm_last_error(t->comm));
  return td_trainer_device_params_changed(t); /* the other shards of the bf16 copy */
}

/* ---- stage 3: the fetches ---- */

size_t zero_device_pool_params(const td_model *model, int world, int stage) {
  if (stage < 3 || world <= 1) return 0;
  return ZERO_DEV_SLOTS * zero_largest_group(model, 0, NULL);
}

static void fetch_fail(td_trainer *t, td_status st, const char *what, size_t lo, size_t hi) {
  zero_devfetch *f = t->dev_fetch;
  if (f->status != TD_OK) return;
  char why[768];
  td_error_copy(why, sizeof why);
  f->status = td_error(st, "rank %d: ZeRO stage 3 on a device: %s parameters [%zu, %zu) failed: %s", t->rank, what,
                       lo, hi, why);
}

/* the address of element 0 of an arena whose element `lo` is at `mem` */
static const float *based(const void *mem, size_t lo, size_t es) {
  return (const float *)((uintptr_t)mem - (uintptr_t)(lo * es));
}

/* Launch the broadcasts filling slot sl with [lo, hi): the owner of each
 * piece copies it from its shard into the slot (on the fetch's own stream,
 * waited for: a broadcast's input must be final when it is issued), then
 * every rank issues the piece's broadcast from that owner, non-blocking.
 * The requests stay on the slot until wait_slot. */
static td_status launch_fill(td_trainer *t, zero_dev_slot *sl, size_t lo, size_t hi) {
  zero_devfetch *f = t->dev_fetch;
  const size_t es = model_es(t);
  const char *own = td_trainer_model_params(t); /* this rank's shard, addressed as the whole arena */
  sl->valid = false;
  sl->n_reqs = 0;
  for (int r = 0; r < t->world; r++) {
    size_t off, len;
    td_shard_range(t->n_params, t->world, r, &off, &len);
    size_t a = TD_MAX(lo, off), b = TD_MIN(hi, off + len);
    if (b <= a) continue;
    char *dst = sl->mem + (a - lo) * es;
    if (r == t->rank) {
      TD_CHECK(td_copy_async(dst, own + a * es, (b - a) * es, f->copy_stream));
      TD_CHECK(td_stream_sync(f->copy_stream));
    }
    td_request *req = NULL;
    td_status st = td_ibroadcast(dst, b - a, t->model_dtype, r, t->comm, &req);
    if (st != TD_OK)
      return td_error(st, "broadcasting [%zu, %zu) from rank %d: %s", a, b, r, td_comm_last_error(t->comm));
    sl->reqs[sl->n_reqs++] = req;
  }
  sl->lo = lo;
  sl->hi = hi;
  sl->valid = true; /* usable once wait_slot returned */
  f->n_fills++;
  return TD_OK;
}

/* Wait for the slot's broadcasts still in flight; all of them, also after
 * one failed (the others are the peers' too, and a request must be waited
 * for once). */
static td_status wait_slot(td_trainer *t, zero_dev_slot *sl) {
  zero_devfetch *f = t->dev_fetch;
  td_status first = TD_OK;
  if (!sl->n_reqs) return TD_OK;
  double w0 = td_now();
  for (int i = 0; i < sl->n_reqs; i++) {
    td_status st = td_wait(sl->reqs[i]);
    if (st != TD_OK && first == TD_OK)
      first = td_error(st, "waiting for the broadcasts of [%zu, %zu): %s", sl->lo, sl->hi, td_comm_last_error(t->comm));
  }
  sl->n_reqs = 0;
  f->wait_s += td_now() - w0;
  if (first != TD_OK) sl->valid = false;
  return first;
}

/* The free slot to fill (not in use; the least recently used), or NULL. */
static zero_dev_slot *free_slot(zero_devfetch *f) {
  zero_dev_slot *sl = NULL;
  for (int i = 0; i < ZERO_DEV_SLOTS; i++)
    if (!f->slot[i].users && (!sl || f->slot[i].last_use < sl->last_use)) sl = &f->slot[i];
  return sl;
}

static zero_dev_slot *holding(zero_devfetch *f, size_t lo, size_t hi) {
  for (int i = 0; i < ZERO_DEV_SLOTS; i++) {
    zero_dev_slot *sl = &f->slot[i];
    if (sl->valid && sl->lo <= lo && hi <= sl->hi) return sl;
  }
  return NULL;
}

/* The model's hint: launch the next group's broadcasts into the other slot
 * now, so that they travel while the group just returned computes. Only
 * into a free slot (never one the model holds), when the group fits the
 * slot and stage3_prefetch_bucket_size. A slot with a fill still in flight
 * is waited for before it is filled again (a request is waited for once). */
static void prefetch(td_trainer *t, size_t lo, size_t hi) {
  zero_devfetch *f = t->dev_fetch;
  if (hi <= lo || hi - lo > f->slot_params || hi - lo > (size_t)t->cfg.stage3_prefetch_bucket_size ||
      holding(f, lo, hi))
    return;
  zero_dev_slot *sl = free_slot(f);
  if (!sl) return;
  td_status st = wait_slot(t, sl);
  if (st == TD_OK) st = launch_fill(t, sl, lo, hi);
  if (st != TD_OK) {
    fetch_fail(t, st, "prefetching", lo, hi);
    return;
  }
  f->n_ahead++;
  sl->last_use = ++f->clock;
}

static const float *dev_fetch(void *ctx, size_t offset, size_t count, size_t next_offset, size_t next_count) {
  td_trainer *t = ctx;
  zero_devfetch *f = t->dev_fetch;
  const size_t es = model_es(t), lo = offset, hi = TD_MIN(offset + count, t->n_params);
  if (f->status != TD_OK) return NULL;
  /* held already (released, in use, or prefetched): the same step's parameters */
  zero_dev_slot *sl = holding(f, lo, hi);
  if (!sl) {
    if (hi - lo > f->slot_params) {
      td_error(TD_ERR_INTERNAL, "a group of %zu parameters is larger than the fetch buffers (%zu)", hi - lo,
               f->slot_params);
      fetch_fail(t, TD_ERR_INTERNAL, "fetching", lo, hi);
      return NULL;
    }
    sl = free_slot(f);
    if (!sl) {
      td_error(TD_ERR_INTERNAL, "the model holds more than %d parameter groups at once", ZERO_DEV_SLOTS);
      fetch_fail(t, TD_ERR_INTERNAL, "fetching", lo, hi);
      return NULL;
    }
    td_status st = wait_slot(t, sl); /* a prefetch the model did not ask for after all */
    if (st == TD_OK) {
      double w0 = td_now();
      st = launch_fill(t, sl, lo, hi);
      f->wait_s += td_now() - w0; /* the owner's copy and the issue; wait_slot below adds the wait */
    }
    if (st != TD_OK) {
      fetch_fail(t, st, "fetching", lo, hi);
      return NULL;
    }
  }
  td_status st = wait_slot(t, sl);
  if (st != TD_OK) {
    fetch_fail(t, st, "fetching", lo, hi);
    return NULL;
  }
  sl->users++;
  sl->last_use = ++f->clock;
  prefetch(t, next_offset, TD_MIN(next_offset + next_count, t->n_params));
  if (f->status != TD_OK) { /* the prefetch failed: the step fails, this group is released by nobody */
    sl->users--;
    return NULL;
  }
  return based(sl->mem, sl->lo, es);
}

static void dev_release(void *ctx, size_t offset, size_t count) {
  td_trainer *t = ctx;
  zero_devfetch *f = t->dev_fetch;
  size_t lo = offset, hi = TD_MIN(offset + count, t->n_params);
  /* the smallest slot in use holding the range (a range inside a larger one is counted there) */
  zero_dev_slot *best = NULL;
  for (int i = 0; i < ZERO_DEV_SLOTS; i++) {
    zero_dev_slot *sl = &f->slot[i];
    if (sl->valid && sl->users && sl->lo <= lo && hi <= sl->hi && (!best || sl->hi - sl->lo < best->hi - best->lo))
      best = sl;
  }
  if (best) best->users--;
}

/* One rank: the shard is the whole arena, and a fetch returns it. */
static const float *whole_fetch(void *ctx, size_t offset, size_t count, size_t next_offset, size_t next_count) {
  (void)offset, (void)count, (void)next_offset, (void)next_count;
  return td_trainer_model_params(ctx);
}
static void whole_release(void *ctx, size_t offset, size_t count) { (void)ctx, (void)offset, (void)count; }

td_status zero_device_fetch_create(td_trainer *t) {
  zero_devfetch *f = calloc(1, sizeof *f);
  if (!f) return td_error(TD_ERR_SYSTEM, "rank %d: out of memory for the stage-3 fetch table", t->rank);
  t->dev_fetch = f;
  f->slot_params = zero_device_pool_params(t->model, t->world, t->zero_stage) / ZERO_DEV_SLOTS;
  if (f->slot_params) {
    td_status st = td_stream_create(t->device, &f->copy_stream);
    for (int i = 0; i < ZERO_DEV_SLOTS && st == TD_OK; i++) {
      f->slot[i].reqs = calloc((size_t)t->world, sizeof *f->slot[i].reqs);
      if (!f->slot[i].reqs) st = td_error(TD_ERR_SYSTEM, "out of memory");
      if (st == TD_OK) st = td_device_alloc(t->device, f->slot_params * model_es(t), (void **)&f->slot[i].mem);
    }
    if (st != TD_OK) {
      char why[512];
      td_error_copy(why, sizeof why);
      return td_error(st, "rank %d: ZeRO stage 3: the parameter fetch buffers (%d x %zu parameters): %s", t->rank,
                      ZERO_DEV_SLOTS, f->slot_params, why);
    }
  }
  f->access = f->slot_params ? (td_param_access){dev_fetch, dev_release, t}
                             : (td_param_access){whole_fetch, whole_release, t};
  t->model->param_access = &f->access;
  return TD_OK;
}

void zero_device_fetch_destroy(td_trainer *t) {
  zero_devfetch *f = t->dev_fetch;
  if (!f) return;
  if (t->model && t->model->param_access == &f->access) t->model->param_access = NULL;
  for (int i = 0; i < ZERO_DEV_SLOTS; i++) {
    (void)wait_slot(t, &f->slot[i]); /* no broadcast may still write the buffer */
    td_device_free(t->device, f->slot[i].mem);
    free(f->slot[i].reqs);
  }
  td_stream_destroy(f->copy_stream);
  free(f);
  t->dev_fetch = NULL;
}

void zero_device_fetch_reset(td_trainer *t) {
  zero_devfetch *f = t->dev_fetch;
  if (!f) return;
  f->status = TD_OK;
  f->wait_s = 0;
  f->n_fills = f->n_ahead = 0;
  for (int i = 0; i < ZERO_DEV_SLOTS; i++) {
    zero_dev_slot *sl = &f->slot[i];
    td_status st = wait_slot(t, sl); /* a prefetch the last step did not use */
    if (st != TD_OK) fetch_fail(t, st, "finishing a prefetch of", sl->lo, sl->hi);
    sl->valid = false, sl->users = 0;
  }
  f->wait_s = 0;
}

/* ---- model-state bytes ---- */

/* masters and (bf16) the model's copy of `held` parameters, gradients of
 * all n, moments of `shard`, `pool` fetch-buffer elements: into out's
 * params, grads, optimizer, live and model_states */
static void state_bytes(size_t n, size_t held, size_t shard, int n_states, td_dtype compute, size_t pool,
                        td_memory_estimate *out) {
  size_t es = compute == TD_BF16 ? sizeof(uint16_t) : sizeof(float);
  out->params = held * sizeof(float) + (compute == TD_BF16 ? held * sizeof(uint16_t) : 0);
  out->grads = n * es;
  out->optimizer = (size_t)n_states * shard * sizeof(float);
  out->live = pool * es;
  out->model_states = out->params + out->grads + out->optimizer + out->live;
}

void zero_device_estimate(const td_model *model, int world, int stage, int n_states, td_dtype compute,
                          td_memory_estimate *out) {
  size_t n = model->n_params, off, shard;
  td_shard_range(n, world, 0, &off, &shard); /* rank 0's shard is the largest */
  out->stage = stage;
  out->world = world;
  out->n_params = n;
  out->shard_params = shard;
  state_bytes(n, stage >= 3 ? shard : n, stage >= 1 ? shard : n, n_states, compute,
              zero_device_pool_params(model, world, stage), out);
}

size_t zero_device_state_bytes_for(const td_model *model, int world, int stage, int n_states, td_dtype compute) {
  td_memory_estimate e = {0};
  zero_device_estimate(model, world, stage, n_states, compute, &e);
  return e.model_states;
}

size_t zero_device_state_bytes(const td_trainer *t) {
  td_memory_estimate e = {0};
  state_bytes(t->n_params, t->params_hi - t->params_lo, t->states_hi - t->states_lo, t->n_states, t->model_dtype,
              t->dev_fetch ? ZERO_DEV_SLOTS * t->dev_fetch->slot_params : 0, &e);
  return e.model_states;
}
