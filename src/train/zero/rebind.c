/* ZeRO under elastic training: the trainer moves onto a communicator of
 * another world size, so every arena is sharded anew (td_shard_range over
 * the new world). The whole-size arenas (parameters, gradients) keep their
 * address: they are indexed by arena offset whatever the world. What depends
 * on the world is rebuilt: the optimizer-state shards (their new contents
 * come from the elastic restore, src/elastic/replica.c), the bucket
 * table (one piece per owner), the norm partials and, at stage 3, the fetch
 * tables; at stage 3 the parameter pages outside the new shard are given
 * back (the restore writes the shard); at stages 1-2 the next step starts
 * with an allgather of the parameter shards (zero_step_begin). */
#include "train/zero/zero.h"

#include <stdlib.h>
#include <string.h>

td_status zero_rebind(td_trainer *t) {
  zero_state *z = t->zero;
  if (!z) return TD_OK;
  for (int i = z->n_done; i < z->n_pieces; i++)
    if (z->pieces[i].req) td_wait(z->pieces[i].req); /* the old communicator fails them */
  z->n_pieces = z->n_done = 0;
  z->inflight_floats = 0;
  if (z->stage >= 3) {
    for (int i = 0; i < z->n_fetch_pieces; i++)
      if (z->fetch_pieces[i].req) td_wait(z->fetch_pieces[i].req);
    z->n_fetch_pieces = 0;
    z->n_live = 0;
    z->live_floats = 0;
    z->gathered = false;
  }
  /* a fetch failure of the old communicator is sticky until cleared */
  z->status = TD_OK;
  zero_layout(t);
  /* accumulating into shards needs peers (the arenas' kinds, keep_grads included, stay) */
  z->accum_sharded = z->stage >= 2 && !z->keep_grads && t->world > 1 && t->cfg.grad_accum > 1 &&
                     !t->model->ops->run_micro_batches; /* as zero_create */
  size_t shard = t->shard_hi - t->shard_lo;
  float *states[2] = {NULL, NULL};
  int cap_pieces = t->model->n_tensors + 2 + t->world;
  zero_piece *pieces = calloc((size_t)cap_pieces, sizeof *pieces);
  double *partials = calloc((size_t)t->world, sizeof *partials);
  bool ok = pieces && partials;
  for (int i = 0; i < t->n_states && ok; i++) ok = zero_state_alloc(shard, &states[i]) == TD_OK; /* zeros */
  zero_live *live = NULL;
  zero_piece *fetch_pieces = NULL;
  int cap_live = t->model->n_tensors + 8, cap_fetch = cap_live * (t->world + 1);
  if (ok && z->stage >= 3) {
    live = calloc((size_t)cap_live, sizeof *live);
    fetch_pieces = calloc((size_t)cap_fetch, sizeof *fetch_pieces);
    ok = live && fetch_pieces;
  }
  if (!ok) {
    free(pieces);
    free(partials);
    free(live);
    free(fetch_pieces);
    for (int i = 0; i < 2; i++) td_free(states[i]);
    return td_error(TD_ERR_SYSTEM, "rank %d: out of memory (or a bad TANDEM_ZERO_HUGE_PAGES) re-sharding ZeRO stage %d for %d ranks (shard of %zu)",
                    t->rank, z->stage, t->world, shard);
  }
  for (int i = 0; i < 2; i++) {
    td_free(t->states[i]);
    t->states[i] = states[i];
  }
  free(z->pieces);
  z->pieces = pieces;
  z->cap_pieces = cap_pieces;
  free(z->norm_partials);
  z->norm_partials = partials;
  if (z->stage >= 3) {
    free(z->live);
    free(z->fetch_pieces);
    z->live = live;
    z->cap_live = cap_live;
    z->fetch_pieces = fetch_pieces;
    z->cap_fetch_pieces = cap_fetch;
    /* only the new shard stays resident; the restore fills it */
    zero_release(t, t->params, 0, t->n_params);
  }
  if (z->stage >= 2) zero_release(t, t->grads, 0, t->n_params);
  /* stages 1-2 keep the whole parameter arena, but the elastic restore
   * fills only the shard: the next step allgathers it first */
  z->params_partial = z->stage < 3;
  return TD_OK;
}
