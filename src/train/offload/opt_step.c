/* The optimizer step of an offloaded shard, streamed through its files in
 * tiles of sub_group_size elements (DeepSpeed's sub groups).
 *
 * Each tile's arrays (the parameters when they are on disk, then each
 * optimizer state) go into one of buffer_count buffers. With B buffers,
 * the reads run L = B - 2 tiles ahead and a tile's writes have one whole
 * update to finish before its buffer is read into again:
 *
 *   buffers:   b0        b1        b2        b3          (B = 4, L = 2)
 *   tile k:    write k-1 update k  read k+1  read k+2
 *
 *   for k: wait the writes of tile k+L-B (buffer (k+L) % B), read tile k+L;
 *          wait the reads of tile k; update; write tile k
 *
 * (B = 2: one tile ahead, writes drained before the buffer is reused;
 * B = 1: no overlap.) The update is the same kernel on the same values as
 * in memory (td_adamw_update / td_sgd_update work element by element), so
 * the result is bit for bit stage 3's. Gradients stay in RAM.
 *
 * Tiles are cut at multiples of the tile size from file_base, so every
 * tile but the first and last is aligned in the file, and its place in its
 * buffer keeps the file's alignment: O_DIRECT moves all but the edges. */
#include "train/offload/offload.h"

#include <string.h>

typedef struct tile_io {
  td_aio_req *req[3];
  int n;
} tile_io;

static td_status drain(td_trainer *t, tile_io *io, double *wait_s) {
  td_status first = TD_OK;
  double t0 = td_now();
  for (int j = 0; j < io->n; j++) {
    td_status st = td_aio_wait(t->offload->aio, io->req[j]);
    if (st != TD_OK && first == TD_OK) first = st;
    io->req[j] = NULL;
  }
  io->n = 0;
  *wait_s += td_now() - t0;
  return first;
}

/* The arrays of tile k in buffer b: [0] parameters (on disk) or NULL, then the states. */
static float *array_of(const offload_state *o, int n_arrays, int b, int j) {
  return o->buffers + ((size_t)b * (size_t)n_arrays + (size_t)j) * o->tile;
}

static void tile_range(const td_trainer *t, size_t k, size_t *lo, size_t *hi, size_t *start) {
  const offload_state *o = t->offload;
  size_t t0 = o->file_base + k * o->tile;
  *start = t0;
  *lo = TD_MAX(t0, t->shard_lo);
  *hi = TD_MIN(t0 + o->tile, t->shard_hi);
}

/* Submit the reads (write = false) or writes of tile k's arrays in buffer b. */
static td_status tile_submit(td_trainer *t, size_t k, int b, bool write, tile_io *io) {
  offload_state *o = t->offload;
  int n_arrays = t->n_states + (o->params_on_disk ? 1 : 0);
  size_t lo, hi, start;
  tile_range(t, k, &lo, &hi, &start);
  size_t bytes = (hi - lo) * sizeof(float);
  uint64_t off = (uint64_t)(lo - o->file_base) * sizeof(float);
  for (int j = 0; j < n_arrays; j++) {
    td_aio_file *f = o->params_on_disk ? (j == 0 ? o->params_file : o->state_files[j - 1]) : o->state_files[j];
    float *p = array_of(o, n_arrays, b, j) + (lo - start);
    td_status st = write ? td_aio_write(o->aio, f, p, bytes, off, &io->req[io->n])
                         : td_aio_read(o->aio, f, p, bytes, off, &io->req[io->n]);
    if (st != TD_OK) return st;
    io->n++;
  }
  return TD_OK;
}

td_status offload_update(td_trainer *t, float lr, float scale, long adam_t) {
  offload_state *o = t->offload;
  double step0 = td_now();
  const td_optimizer_config *opt = &t->cfg.optimizer;
  int B = o->n_buffers, n_arrays = t->n_states + (o->params_on_disk ? 1 : 0);
  size_t n_tiles = t->shard_hi > t->shard_lo ? (t->shard_hi - o->file_base + o->tile - 1) / o->tile : 0;
  int L = B >= 3 ? B - 2 : B == 2 ? 1 : 0;
  tile_io reads[64], writes[64];
  memset(reads, 0, sizeof reads);
  memset(writes, 0, sizeof writes);
  td_status st = TD_OK;
  /* Read tile k into its buffer once that buffer's writes are done. */
#define ISSUE(k)                                                                      \
  do {                                                                                \
    int b_ = (int)((k) % (size_t)B);                                                  \
    if (st == TD_OK) st = drain(t, &writes[b_], &o->stats.opt_write_wait_s);          \
    if (st == TD_OK) st = tile_submit(t, (k), b_, false, &reads[b_]);                 \
  } while (0)
  for (size_t k = 0; k < (size_t)L && k < n_tiles; k++) ISSUE(k);
  for (size_t k = 0; k < n_tiles && st == TD_OK; k++) {
    if (L == 0) ISSUE(k);
    else if (k + (size_t)L < n_tiles) ISSUE(k + (size_t)L);
    int b = (int)(k % (size_t)B);
    if (st == TD_OK) st = drain(t, &reads[b], &o->stats.opt_read_wait_s);
    if (st != TD_OK) break;
    size_t lo, hi, start;
    tile_range(t, k, &lo, &hi, &start);
    size_t n = hi - lo, at = lo - start;
    float *p = o->params_on_disk ? array_of(o, n_arrays, b, 0) + at : t->params + lo;
    int s0 = o->params_on_disk ? 1 : 0;
    float *m = array_of(o, n_arrays, b, s0) + at;
    double c0 = td_now();
    if (opt->kind == TD_OPTIMIZER_ADAMW)
      td_adamw_update(p, t->grads + lo, m, array_of(o, n_arrays, b, s0 + 1) + at, n, lr, opt->beta1, opt->beta2,
                      opt->eps, opt->weight_decay, adam_t, scale);
    else
      td_sgd_update(p, t->grads + lo, m, n, lr, opt->momentum, opt->weight_decay, opt->nesterov, scale);
    o->stats.opt_compute_s += td_now() - c0;
    st = tile_submit(t, k, b, true, &writes[b]);
  }
#undef ISSUE
  /* every request is waited for, also after a failure: the buffers are reused */
  for (int b = 0; b < B; b++) {
    td_status r = drain(t, &reads[b], &o->stats.opt_read_wait_s);
    td_status w = drain(t, &writes[b], &o->stats.opt_write_wait_s);
    if (st == TD_OK) st = r != TD_OK ? r : w;
  }
  o->stats.opt_s += td_now() - step0;
  o->stats.steps++;
  if (st != TD_OK) {
    char why[1024];
    td_error_copy(why, sizeof why);
    return td_error(st, "rank %d: the offloaded optimizer step failed: %s", t->rank, why);
  }
  return TD_OK;
}
