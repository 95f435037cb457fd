/* The stage-3 parameter shard on disk (offload_param "nvme").
 *
 * At creation each rank writes the initial values of its own shard, tile
 * by tile (td_model_init_params_range: the values td_model_init_params
 * gives, without ever holding the whole arena), so a model larger than the
 * machine's memory starts without a peak. Stage 3 in memory has every rank
 * initialize the whole arena and broadcasts rank 0's copy; here no rank
 * holds the whole arena, and the initializer is a pure function of the
 * seed, so each rank's shard is what rank 0's broadcast would have given.
 *
 * During a step, zero/fetch.c asks for a fetch group [lo, hi): the owner
 * of each piece of it reads that piece from its file straight into the
 * arena (O_DIRECT: file offsets and arena addresses agree modulo 4096,
 * offload.h), and only then broadcasts it. The read of the next group is
 * submitted with the current fetch, so it runs while the current layer
 * computes. */
#include "train/offload/offload.h"

td_status offload_params_init(td_trainer *t) {
  offload_state *o = t->offload;
  size_t tile = o->tile, base = o->file_base;
  /* two of the optimizer's buffers: initialize one while the other is written */
  float *buf[2] = {o->buffers, o->buffers + tile};
  td_aio_req *req[2] = {NULL, NULL};
  td_status st = TD_OK;
  int k = 0;
  for (size_t t0 = base; t0 < t->shard_hi && st == TD_OK; t0 += tile, k++) {
    size_t lo = TD_MAX(t0, t->shard_lo), hi = TD_MIN(t0 + tile, t->shard_hi);
    int b = k & 1;
    st = td_aio_wait(o->aio, req[b]);
    req[b] = NULL;
    if (st != TD_OK) break;
    float *dst = buf[b] + (lo - t0);
    st = td_model_init_params_range(t->model, dst, t->cfg.seed, lo, hi);
    if (st == TD_OK)
      st = td_aio_write(o->aio, o->params_file, dst, (hi - lo) * sizeof(float), (lo - base) * sizeof(float), &req[b]);
  }
  for (int b = 0; b < 2; b++) {
    td_status w = td_aio_wait(o->aio, req[b]);
    if (st == TD_OK) st = w;
  }
  if (st != TD_OK) {
    char why[1024];
    td_error_copy(why, sizeof why);
    return td_error(st, "rank %d: writing the initial parameters to the offload file failed: %s", t->rank, why);
  }
  return TD_OK;
}

td_status offload_params_read(td_trainer *t, size_t lo, size_t hi, td_aio_req **req_out) {
  offload_state *o = t->offload;
  *req_out = NULL;
  size_t a = TD_MAX(lo, t->shard_lo), b = TD_MIN(hi, t->shard_hi);
  if (b <= a) return TD_OK;
  return td_aio_read(o->aio, o->params_file, t->params + a, (b - a) * sizeof(float),
                     (a - o->file_base) * sizeof(float), req_out);
}

td_status offload_params_wait(td_trainer *t, td_aio_req *req) {
  if (!req) return TD_OK;
  double t0 = td_now();
  td_status st = td_aio_wait(t->offload->aio, req);
  t->offload->stats.param_wait_s += td_now() - t0;
  return st;
}
