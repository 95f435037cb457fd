/* ZeRO stage 2+: gradients reduced into their owners' shards; stages 1+:
 * the optimizer on the shard, the updated parameters allgathered.
 *
 * The trainer forms gradient buckets as at stage 0 (trainer.c: the
 * frontier of final tensors, flat arena ranges, first bucket small); here a
 * bucket [lo, hi) is cut at the shard boundaries and each piece is reduced
 * (td_ireduce, TD_AVG) to the rank owning it, while backward goes on:
 *
 *     shards:   [ rank 0      | rank 1      | rank 2      ]
 *     bucket:           [==========|====]
 *     pieces:           [ to 0 ][ to 1 ]        (reduce, root = owner)
 *
 * Each rank sends every gradient once and receives only its shard, the
 * traffic of a reduce-scatter (half an allreduce); the allgather of the
 * updated parameters after the step is the other half, so a step moves
 * what stage 0's allreduce moves. With host-shared gradient arenas (ranks
 * on one host, shm transport) a bucket is instead allreduced in one direct
 * operation and the pages outside the shard are given back afterwards:
 * the same memory, more bytes moved but far fewer synchronizations (next
 * paragraph). Stage 1, which keeps whole gradients
 * anyway, averages them with stage 0's allreduce buckets instead: on one
 * host the shm transport's direct allreduce over the host-shared gradient
 * arena synchronizes the ranks twice per bucket, where a reduce staged
 * through the segment does twice per chunk, and on a loaded machine each
 * synchronization costs a scheduling delay (measured: stage 1 with reduce
 * pieces ran at 0.73-0.81x stage 0 on 2 ranks at load ~20-60). At stage 2 the gradient arena gives back
 * the pages of a piece once it is reduced (this rank does not own it), so
 * a rank keeps its shard plus the buckets in flight. Double buffering:
 * once a bucket is launched, backward waits for the one before it (which
 * had the new bucket's whole backward to travel, so it is normally done),
 * so at most two buckets are resident, the one in flight and the one being
 * filled or just launched (estimate.c counts them; DeepSpeed bounds its
 * reduce buckets the same way).
 *
 * Bit for bit: the optimizer kernels are elementwise, so updating a shard
 * gives the bits the whole-arena update gives there; the shm transport's
 * reduce and allreduce both sum the ranks' values in rank order and divide
 * once (src/comm/select/select.c), and the gradient norm uses the same per-shard partial
 * sums at every stage (shard.c).
 *
 * Gradient accumulation (grad_accum > 1) at stage 2+ on several ranks
 * (accum_sharded): a rank does not hold whole gradients across the
 * micro-steps; every micro-step's backward reduces its buckets into the
 * owners' shards as the last one does, and the shard accumulates:
 *
 *     micro-step k:  owner's shard  = sum of steps < k + own gradient k
 *                    reduce (SUM)  -> + every other rank's gradient k
 *
 * each rank's gradient carrying 1/(grad_accum x world) in backward's scale
 * (trainer.c). Memory stays the shard plus the buckets in flight; the
 * traffic is a reduce-scatter per micro-step. The sum's order changes
 * (micro-steps outside, ranks inside, where stage 0 sums each rank's
 * micro-steps first), so on 2+ ranks the result differs from stage 0's in
 * rounding: about 1e-7 relative per gradient, losses within 1e-6 relative
 * (tests/zero/test_zero.c equal), not bit for bit. Where stage 2 keeps its
 * gradient arena (keep_grads) it accumulates locally as stage 0 does and
 * stays bit for bit. */
#include "train/zero/zero.h"
#include "train/offload/offload.h"

#include <string.h>

/* Stage 2+: zeros outside the shard: released pages read as zeros, and the
 * edge granules, which stay, may hold an old bucket's values. */
static void clear_outside_shard(td_trainer *t) {
  zero_state *z = t->zero;
  zero_release(t, t->grads, 0, t->n_params);
  size_t pf = z->grads_kind == ZERO_MEM_MAPPED ? z->granule_floats : z->page_floats;
  size_t lo_page = t->shard_lo / pf * pf, hi_page = TD_MIN((t->shard_hi + pf - 1) / pf * pf, t->n_params);
  memset(t->grads + lo_page, 0, (t->shard_lo - lo_page) * sizeof(float));
  if (hi_page > t->shard_hi) memset(t->grads + t->shard_hi, 0, (hi_page - t->shard_hi) * sizeof(float));
}

void zero_step_begin(td_trainer *t) {
  zero_state *z = t->zero;
  /* the first two steps this trainer runs (also after a resume at step k) */
  z->measuring = z->steps_seen++ < 2;
  if (z->stage >= 3) zero_fetch_reset(t);
  z->fetch_wait_s = 0; /* counted per step */
  z->n_fetches = z->n_prefetches = 0;
  /* Deterministic reduction (train/deterministic) writes the reduced
   * gradients over its whole range: backward runs into its own vectors, and
   * zeroing this arena (whole at stage 1: a 4-byte store per parameter per
   * step) would be undone. */
  if (z->stage >= 2 && !z->keep_grads) {
    clear_outside_shard(t);
    if (!t->det) memset(t->grads + t->shard_lo, 0, (t->shard_hi - t->shard_lo) * sizeof(float));
  } else if (!t->det) {
    memset(t->grads, 0, t->n_params * sizeof(float));
  }
  z->n_pieces = z->n_done = z->n_buckets = 0;
  z->inflight_floats = 0;
  z->released_lo = t->n_params; /* nothing released this step yet */
  if (z->params_partial) {
    /* elastic re-sharding restored only each rank's shard of the parameters
     * (src/train/zero/rebind.c): every rank is here at the same step */
    z->params_partial = false;
    if (t->comm && t->world > 1) {
      td_status st = td_allgather(t->params + t->shard_lo, t->params, t->n_params, TD_F32, t->comm);
      if (st != TD_OK && z->status == TD_OK)
        z->status = td_error(st, "rank %d: gathering the re-sharded parameters failed: %s", t->rank,
                             td_comm_last_error(t->comm));
    }
  }
}

/* Stage 2+: a reduced piece this rank does not own is given back at once
 * (complete_pieces), but releases round inward (pages.c), so a granule it
 * shares with the piece above would stay. Here the granules above the
 * lowest completed piece with nothing in flight above it go too, the shard
 * excepted: buckets are launched from the top of the arena down (the
 * frontier of final gradients) and nothing above the frontier is written
 * again this step, so everything there that is reduced and not owned is
 * dead. z->released_lo, granule-aligned, is where that range starts. */
static void release_reduced(td_trainer *t) {
  zero_state *z = t->zero;
  if (z->stage < 2 || z->n_done == 0) return;
  size_t x = z->pieces[z->n_done - 1].lo;
  for (int i = z->n_done; i < z->n_pieces; i++) x = TD_MAX(x, z->pieces[i].hi);
  size_t g = z->grads_kind == ZERO_MEM_MAPPED ? z->granule_floats : z->page_floats;
  x = (x + g - 1) / g * g;
  if (x >= z->released_lo) return;
  zero_release(t, t->grads, x, z->released_lo);
  z->released_lo = x;
}

/* Complete pieces in launch order: all that are done (block = false) or
 * the oldest one (block = true). A piece this rank does not own is given
 * back at stage 2+. Returns the first failure. */
static td_status complete_pieces(td_trainer *t, bool block) {
  zero_state *z = t->zero;
  td_status first = TD_OK;
  while (z->n_done < z->n_pieces) {
    zero_piece *p = &z->pieces[z->n_done];
    td_status st;
    if (block) {
      st = td_wait(p->req);
    } else {
      int done = 0;
      st = td_test(p->req, &done);
      if (!done) break;
    }
    p->req = NULL;
    if (st != TD_OK && first == TD_OK) first = st;
    z->inflight_floats -= p->hi - p->lo;
    if (p->owner != t->rank) zero_release(t, t->grads, p->lo, p->hi);
    z->n_done++;
    release_reduced(t);
    if (block) break;
  }
  return first;
}

void zero_bucket_launch(td_trainer *t, size_t lo, size_t hi) {
  zero_state *z = t->zero;
  if (hi <= lo || t->bucket_status != TD_OK) return;
  /* host-shared gradients: one direct allreduce (see the top), owner -1 */
  int first_new = z->n_pieces; /* this bucket's pieces start here */
  for (int r = z->grads_kind == ZERO_MEM_SHARED ? -1 : 0; r < t->world; r++) {
    size_t off = 0, len = t->n_params;
    if (r >= 0) td_shard_range(t->n_params, t->world, r, &off, &len);
    size_t a = TD_MAX(lo, off), b = TD_MIN(hi, off + len);
    if (b <= a) continue;
    if (z->n_pieces == z->cap_pieces) {
      t->bucket_status = td_error(TD_ERR_INTERNAL, "rank %d: more than %d gradient pieces in one step", t->rank,
                                  z->cap_pieces);
      return;
    }
    td_request *req = NULL;
    /* accumulating into the shards: the owner's copy holds the earlier
     * micro-steps' sum, so the ranks' gradients (divided by the world size
     * in backward's scale, trainer.c) are summed onto it */
    td_op op = z->accum_sharded ? TD_SUM : TD_AVG;
    td_status st = r < 0 ? td_iallreduce(t->grads + a, t->grads + a, b - a, TD_F32, op, t->comm, &req)
                         : td_ireduce(t->grads + a, t->grads + a, b - a, TD_F32, op, r, t->comm, &req);
    if (st != TD_OK) {
      t->bucket_status = td_error(st, "rank %d: reducing gradients [%zu, %zu) to their owner, rank %d, failed: %s",
                                  t->rank, a, b, r, td_comm_last_error(t->comm));
      return;
    }
    z->pieces[z->n_pieces++] = (zero_piece){req, a, b, r};
    z->inflight_floats += b - a;
    if (r < 0) break;
  }
  z->n_buckets++;
  t->comm_bytes += (hi - lo) * sizeof(float);
  t->next_bucket = t->cfg.bucket_bytes / sizeof(float);
  if (z->stage >= 2) {
    zero_measure(t); /* the high-water mark: just launched, nothing released yet */
    td_status st = complete_pieces(t, false);
    while (st == TD_OK && z->n_done < first_new) st = complete_pieces(t, true); /* the buckets before this one */
    if (st != TD_OK)
      t->bucket_status = td_error(st, "rank %d: reducing a gradient bucket failed: %s", t->rank,
                                  td_comm_last_error(t->comm));
  }
}

td_status zero_wait_buckets(td_trainer *t) {
  zero_state *z = t->zero;
  zero_measure(t);
  td_status first = TD_OK;
  while (z->n_done < z->n_pieces) {
    td_status st = complete_pieces(t, true);
    if (st != TD_OK && first == TD_OK) first = st;
  }
  z->n_pieces = z->n_done = 0;
  if (first != TD_OK)
    return td_error(first, "rank %d: reducing gradients into their owners' shards failed: %s", t->rank,
                    td_comm_last_error(t->comm));
  return TD_OK;
}

td_status zero_update(td_trainer *t, float lr, float scale, long adam_t) {
  if (offload_states_on_disk(t)) return offload_update(t, lr, scale, adam_t); /* streamed in tiles (offload/opt_step.c) */
  size_t lo = t->shard_lo, n = t->shard_hi - t->shard_lo;
  const td_optimizer_config *o = &t->cfg.optimizer;
  if (o->kind == TD_OPTIMIZER_ADAMW)
    td_adamw_update(t->params + lo, t->grads + lo, t->states[0], t->states[1], n, lr, o->beta1, o->beta2, o->eps,
                    o->weight_decay, adam_t, scale);
  else
    td_sgd_update(t->params + lo, t->grads + lo, t->states[0], n, lr, o->momentum, o->weight_decay, o->nesterov,
                  scale);
  zero_measure(t);
  if (t->zero_stage >= 3 || !t->comm || t->world == 1) return TD_OK;
  /* in place: this rank's shard is already where the allgather puts it */
  td_status st = td_allgather(t->params + lo, t->params, t->n_params, TD_F32, t->comm);
  if (st != TD_OK)
    return td_error(st, "rank %d: allgathering the updated parameters failed: %s", t->rank,
                    td_comm_last_error(t->comm));
  return TD_OK;
}

void zero_micro_end(td_trainer *t) {
  clear_outside_shard(t);
  t->zero->released_lo = t->n_params; /* the next backward writes the whole arena again */
}

void zero_step_end(td_trainer *t) {
  zero_state *z = t->zero;
  if (z && z->stage >= 3) zero_fetch_reset(t);
}
