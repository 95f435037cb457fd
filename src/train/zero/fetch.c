/* ZeRO stage 3: parameters fetched per layer through the model's
 * td_param_access (src/nn never calls src/comm; it asks the engine).
 *
 * A rank keeps only its shard of the parameter arena resident. When the
 * model fetches a range (a transformer block, the embeddings, the head),
 * each piece of it is broadcast from the rank owning that piece into the
 * same place of every rank's arena, and the model reads it there; when the
 * model releases the range, its pages are given back (shard.c), so the
 * arena's address space is the reusable buffer and physical memory holds
 * the shard plus the live ranges:
 *
 *     shards:  [ rank 0            | rank 1            ]
 *     fetch h2:             [=====|==]                 (bcast from 0, from 1)
 *     prefetch h3:                   [=======]         (launched, not waited)
 *
 * With the fetch, the model names the range it will fetch next; the engine
 * launches that one right away (non-blocking), so it travels while the
 * current layer computes. DeepSpeed's knobs keep their meaning, counted in
 * parameters: stage3_prefetch_bucket_size (a next range larger than this is
 * not fetched ahead), stage3_max_live_parameters (how many fetched
 * parameters may stay resident: a range the model released stays cached,
 * and is reused without communication when fetched again in the same step,
 * until the cap asks for its memory, least recently used first) and
 * stage3_param_persistence_threshold (ranges this small stay resident from
 * their first fetch to the end of the step whatever the cap; DeepSpeed
 * keeps such parameters unpartitioned, Tandem keeps them sharded between
 * steps). Parameters do not change within a step, so a cached range is as
 * good as a fresh fetch; giving pages back and faulting them in again costs
 * page faults and zeroing (a quarter of stage 3's CPU time at the reference
 * configuration when nothing was cached).
 *
 * Every rank makes the same fetch calls in the same order (same model, same
 * micro-batch count), and every decision here depends only on them and the
 * configuration, so the broadcasts match across ranks. A failure is kept in
 * z->status (the model cannot see it) and fails the step afterwards. */
#include "train/zero/zero.h"
#include "train/offload/offload.h"

#include <stdlib.h>

static zero_live *find_live(zero_state *z, size_t lo, size_t hi, bool exact) {
  for (int i = 0; i < z->n_live; i++) {
    zero_live *l = &z->live[i];
    if (exact ? (l->lo == lo && l->hi == hi) : (l->lo <= lo && hi <= l->hi)) return l;
  }
  return NULL;
}

static void fail_why(td_trainer *t, td_status st, const char *what, size_t lo, size_t hi, const char *why) {
  zero_state *z = t->zero;
  if (z->status == TD_OK)
    z->status = td_error(st, "rank %d: ZeRO stage 3: %s parameters [%zu, %zu) failed: %s", t->rank, what, lo, hi, why);
}

static void fail(td_trainer *t, td_status st, const char *what, size_t lo, size_t hi) {
  fail_why(t, st, what, lo, hi, td_comm_last_error(t->comm));
}

/* NVMe offload: this rank's part of [lo, hi) comes from its file; the
 * broadcasts wait until it is in (offload/param_store.c). */
static void fail_disk(td_trainer *t, const char *what, size_t lo, size_t hi) {
  char why[1024];
  td_error_copy(why, sizeof why);
  if (t->zero->status == TD_OK) t->zero->status_from_disk = true;
  fail_why(t, TD_ERR_IO, what, lo, hi, why);
}

static void launch_broadcasts(td_trainer *t, zero_live *l, bool after_disk_failure);

/* Launch the broadcasts of [lo, hi) from their owners; a live entry. */
static zero_live *launch(td_trainer *t, size_t lo, size_t hi) {
  zero_state *z = t->zero;
  if (z->n_live == z->cap_live) {
    fail(t, TD_ERR_INTERNAL, "fetching (too many live ranges)", lo, hi);
    return NULL;
  }
  zero_live *l = &z->live[z->n_live++];
  *l = (zero_live){lo, hi, z->n_fetch_pieces, 0, true, false, 0, ++z->use_clock, false, NULL};
  z->live_floats += hi - lo;
  if (t->comm && t->world > 1) z->n_fetches++;
  if (offload_params_on_disk(t)) {
    if (z->status == TD_OK && offload_params_read(t, lo, hi, &l->disk_req) != TD_OK) fail_disk(t, "reading", lo, hi);
    l->deferred = true; /* on every rank alike, so the broadcasts keep one order */
    return l;
  }
  launch_broadcasts(t, l, false);
  return l;
}

/* after_disk_failure: this rank's parameter read failed, but the
 * communicator is fine and the peers are about to broadcast: take part
 * (with whatever the arena holds), so nobody waits; the step fails here. */
static void launch_broadcasts(td_trainer *t, zero_live *l, bool after_disk_failure) {
  zero_state *z = t->zero;
  size_t lo = l->lo, hi = l->hi;
  l->first_piece = z->n_fetch_pieces;
  l->n_pieces = 0;
  if (!t->comm || t->world == 1 || (z->status != TD_OK && !after_disk_failure)) {
    l->pending = false;
    return;
  }
  for (int r = 0; r < t->world; r++) {
    size_t off, len;
    td_shard_range(t->n_params, t->world, r, &off, &len);
    size_t a = TD_MAX(lo, off), b = TD_MIN(hi, off + len);
    if (b <= a) continue;
    if (z->n_fetch_pieces == z->cap_fetch_pieces) {
      fail(t, TD_ERR_INTERNAL, "fetching (too many pieces in flight)", lo, hi);
      break;
    }
    td_request *req = NULL;
    td_status st = td_ibroadcast(t->params + a, b - a, TD_F32, r, t->comm, &req);
    if (st != TD_OK) {
      fail(t, st, "broadcasting", a, b);
      break;
    }
    z->fetch_pieces[z->n_fetch_pieces++] = (zero_piece){req, a, b, r};
    l->n_pieces++;
  }
}

static void wait_live(td_trainer *t, zero_live *l) {
  zero_state *z = t->zero;
  if (!l->pending) return;
  if (l->deferred) {
    l->deferred = false;
    if (offload_params_wait(t, l->disk_req) != TD_OK) fail_disk(t, "reading", l->lo, l->hi);
    l->disk_req = NULL;
    launch_broadcasts(t, l, z->status_from_disk);
    if (!l->pending) return;
  }
  double w0 = td_now();
  for (int i = l->first_piece; i < l->first_piece + l->n_pieces; i++) {
    zero_piece *p = &z->fetch_pieces[i];
    if (!p->req) continue;
    td_status st = td_wait(p->req);
    p->req = NULL;
    if (st != TD_OK) fail(t, st, "waiting for", p->lo, p->hi);
  }
  z->fetch_wait_s += td_now() - w0;
  l->pending = false;
  /* the piece table is a stack of what is in flight: drop the completed tail */
  while (z->n_fetch_pieces > 0 && !z->fetch_pieces[z->n_fetch_pieces - 1].req) z->n_fetch_pieces--;
}

static void drop_live(td_trainer *t, zero_live *l) {
  zero_state *z = t->zero;
  wait_live(t, l);
  size_t lo = l->lo, hi = l->hi;
  z->live_floats -= hi - lo;
  *l = z->live[--z->n_live];
  /* Give the pages back, but not those of the other live ranges overlapping
   * this one (the tied head's wte inside the embeddings): the span minus
   * their union, walked in address order (the live list is in no order:
   * taking its entries as they came, a range nested in the middle released
   * everything below it, another live range there included). The span is
   * widened to whole granules first: a granule shared with a neighbour that
   * is not live goes too (releases round inward: pages.c), one a live range
   * still uses is cut off below. The live list is short (a few ranges). */
  size_t g = z->params_kind == ZERO_MEM_MAPPED ? z->granule_floats : z->page_floats;
  lo = lo / g * g;
  hi = TD_MIN((hi + g - 1) / g * g, t->n_params);
  for (size_t at = lo; at < hi;) {
    const zero_live *next = NULL; /* the lowest-starting live range still ahead of `at` */
    for (int i = 0; i < z->n_live; i++) {
      const zero_live *o = &z->live[i];
      if (o->hi > at && o->lo < hi && (!next || o->lo < next->lo)) next = o;
    }
    if (!next) {
      zero_release(t, t->params, at, hi);
      break;
    }
    if (next->lo > at) zero_release(t, t->params, at, next->lo);
    at = next->hi; /* > at: every turn moves on */
  }
}

/* Give back cached ranges (released by the model, not persistent, not in
 * flight), least recently used first, until `need` more floats fit under
 * stage3_max_live_parameters. Returns whether they fit. */
static bool make_room(td_trainer *t, size_t need) {
  zero_state *z = t->zero;
  size_t cap = (size_t)t->cfg.stage3_max_live_parameters;
  while (z->live_floats + need > cap) {
    zero_live *victim = NULL;
    for (int i = 0; i < z->n_live; i++) {
      zero_live *l = &z->live[i];
      if (!l->users && !l->persistent && !l->pending && (!victim || l->last_use < victim->last_use)) victim = l;
    }
    if (!victim) return false;
    drop_live(t, victim);
  }
  return true;
}

static const float *fetch(void *ctx, size_t offset, size_t count, size_t next_offset, size_t next_count) {
  td_trainer *t = ctx;
  zero_state *z = t->zero;
  size_t lo = offset, hi = TD_MIN(offset + count, t->n_params);
  if (hi > lo && !z->gathered) {
    zero_live *l = find_live(z, lo, hi, false);
    if (!l) {
      (void)make_room(t, hi - lo); /* a fetch the model needs goes ahead even over the cap */
      l = launch(t, lo, hi);
    }
    if (l) {
      wait_live(t, l);
      /* in use until released, also when the range lies inside a larger
       * live one (the tied head's wte inside the cached embeddings): else
       * the prefetch's make_room below could evict it under the model */
      l->users++;
      l->last_use = ++z->use_clock;
    }
    size_t nlo = next_offset, nhi = TD_MIN(next_offset + next_count, t->n_params);
    if (nhi > nlo && !find_live(z, nlo, nhi, false) && nhi - nlo <= (size_t)t->cfg.stage3_prefetch_bucket_size &&
        make_room(t, nhi - nlo) && launch(t, nlo, nhi) && t->comm && t->world > 1)
      z->n_prefetches++;
    zero_measure(t);
  }
  return t->params;
}

static void release(void *ctx, size_t offset, size_t count) {
  td_trainer *t = ctx;
  zero_state *z = t->zero;
  size_t lo = offset, hi = TD_MIN(offset + count, t->n_params);
  zero_live *l = find_live(z, lo, hi, true);
  if (!l || !l->users) { /* fetched inside a larger live range: the smallest such in use */
    l = NULL;
    for (int i = 0; i < z->n_live; i++) {
      zero_live *o = &z->live[i];
      if (o->users && o->lo <= lo && hi <= o->hi && (!l || o->hi - o->lo < l->hi - l->lo)) l = o;
    }
    if (!l) return;
  }
  l->users--;
  if (l->lo == lo && l->hi == hi && hi - lo <= (size_t)t->cfg.stage3_param_persistence_threshold) l->persistent = true;
  (void)make_room(t, 0); /* cached while the cap allows */
}

void zero_fetch_init(td_trainer *t) {
  zero_state *z = t->zero;
  z->cap_live = t->model->n_tensors + 8;
  z->cap_fetch_pieces = z->cap_live * (t->world + 1);
  z->live = calloc((size_t)z->cap_live, sizeof *z->live);
  z->fetch_pieces = calloc((size_t)z->cap_fetch_pieces, sizeof *z->fetch_pieces);
  if (!z->live || !z->fetch_pieces) return; /* zero_create reports it */
  z->access = (td_param_access){fetch, release, t};
  t->model->param_access = &z->access;
}

void zero_fetch_reset(td_trainer *t) {
  zero_state *z = t->zero;
  while (z->n_live > 0) drop_live(t, &z->live[z->n_live - 1]);
  z->n_fetch_pieces = 0;
  z->live_floats = 0;
  /* also the granules the drops kept because a neighbour was live (pages.c) */
  zero_release(t, t->params, 0, t->n_params);
  z->gathered = false;
}

td_status zero_fetch_all(td_trainer *t) {
  zero_state *z = t->zero;
  zero_fetch_reset(t);
  if (offload_params_on_disk(t)) { /* the shard first comes back from disk */
    td_aio_req *req = NULL;
    td_status st = offload_params_read(t, t->shard_lo, t->shard_hi, &req);
    if (st == TD_OK) st = offload_params_wait(t, req);
    TD_CHECK(td_trainer_agree(t, st)); /* no rank left in the allgather below */
  }
  if (t->comm && t->world > 1) {
    td_status st = td_allgather(t->params + t->shard_lo, t->params, t->n_params, TD_F32, t->comm);
    if (st != TD_OK)
      return td_error(st, "rank %d: gathering the stage-3 parameters failed: %s", t->rank,
                      td_comm_last_error(t->comm));
  }
  z->gathered = true;
  return TD_OK;
}
