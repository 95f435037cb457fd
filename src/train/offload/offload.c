/* The offload's life cycle in the trainer: what goes to disk, the files,
 * the tile buffers and the I/O engine (offload.h describes the layout).
 * Created after the ZeRO arenas, destroyed (files removed) on every exit
 * path of the trainer, failures included. */

#include "train/offload/offload.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* Open a file of the job directory and reserve its blocks, so that a full
 * disk shows now and not in the middle of a step. Files read as zeros
 * (the moments' initial value). */
static td_status open_file(td_trainer *t, const char *name, size_t bytes, td_aio_file **out) {
  offload_state *o = t->offload;
  char path[700];
  snprintf(path, sizeof path, "%s/%s", o->dir, name);
  TD_CHECK(td_aio_open(o->aio, path, true, out));
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return td_error(TD_ERR_IO, "rank %d: reopening %s failed: %s", t->rank, path, strerror(errno));
  int rc = posix_fallocate(fd, 0, (off_t)bytes);
  if (rc == EOPNOTSUPP || rc == EINVAL) rc = ftruncate(fd, (off_t)bytes) == 0 ? 0 : errno;
  close(fd);
  if (rc != 0)
    return td_error(TD_ERR_IO, "rank %d: reserving %zu bytes for %s failed: %s; %s", t->rank, bytes, path,
                    strerror(rc),
                    rc == ENOSPC ? "free space under nvme_path or point it at a larger disk" : "check the disk");
  return TD_OK;
}

td_status offload_create(td_trainer *t) {
  const td_offload_config *c = &t->cfg.offload;
  bool params = c->param_device == TD_OFFLOAD_NVME, states = c->optimizer_device == TD_OFFLOAD_NVME;
  if (!params && !states) return TD_OK; /* "none" and "cpu": the state stays in this host's memory */
  offload_state *o = calloc(1, sizeof *o);
  if (!o) return td_error(TD_ERR_SYSTEM, "rank %d: out of memory for the offload state", t->rank);
  t->offload = o;
  o->lock_fd = -1;
  o->params_on_disk = params;
  o->states_on_disk = states;
  size_t shard = t->shard_hi - t->shard_lo;
  size_t lead = t->shard_lo % OFFLOAD_ALIGN_FLOATS;
  TD_CHECK(offload_dir_create(t, c->optimizer_nvme_path, td_offload_disk_bytes(&t->cfg, shard, lead)));
  char who[64];
  snprintf(who, sizeof who, "rank %d offload", t->rank);
  td_aio_config ac = {c->aio_block_size, c->aio_queue_depth, c->aio_thread_count};
  TD_CHECK(td_aio_create(&ac, who, &o->aio));
  o->file_base = t->shard_lo / OFFLOAD_ALIGN_FLOATS * OFFLOAD_ALIGN_FLOATS;
  size_t file_bytes = round_up((t->shard_hi - o->file_base) * sizeof(float), TD_AIO_ALIGN);
  if (params) TD_CHECK(open_file(t, "params.f32", file_bytes, &o->params_file));
  if (states) {
    static const char *const adam[] = {"exp_avg.f32", "exp_avg_sq.f32"}, *const sgd[] = {"momentum.f32"};
    for (int i = 0; i < t->n_states; i++)
      TD_CHECK(open_file(t, t->n_states == 2 ? adam[i] : sgd[i], file_bytes, &o->state_files[i]));
  }
  if (states) {
    o->tile = td_offload_tile(&t->cfg, shard);
    o->n_buffers = td_offload_buffer_count(&t->cfg, shard);
    size_t arrays = (size_t)t->n_states + (params ? 1 : 0);
    o->buffers = td_aio_alloc((size_t)o->n_buffers * arrays * o->tile * sizeof(float));
    if (!o->buffers)
      return td_error(TD_ERR_SYSTEM, "rank %d: out of memory for %d offload buffers of %zu floats (lower "
                      "zero_optimization.sub_group_size or offload_optimizer.buffer_count)", t->rank, o->n_buffers,
                      o->tile * arrays);
  }
  TD_INFO("rank %d: NVMe offload in %s (%s%s), %s; RAM: %.1f MiB of tile buffers (sub_group_size %zu%s)", t->rank,
          o->dir, params ? "parameters, " : "", states ? "optimizer state" : "", td_aio_engine_name(o->aio),
          (double)td_offload_buffer_bytes(&t->cfg, shard) / 1048576.0, o->tile,
          t->offload_tile_chosen ? ", chosen from the memory: it was not set" : "");
  return TD_OK;
}

void offload_destroy(td_trainer *t) {
  offload_state *o = t ? t->offload : NULL;
  if (!o) return;
  td_aio_destroy(o->aio); /* waits for anything in flight */
  td_aio_close(o->params_file);
  for (int i = 0; i < 2; i++) td_aio_close(o->state_files[i]);
  td_aio_free(o->buffers);
  offload_dir_remove(o);
  free(o);
  t->offload = NULL;
}

td_status td_trainer_offload_stats(const td_trainer *t, td_offload_stats *out) {
  if (!t || !out) return td_error(TD_ERR_INVALID_ARGUMENT, "td_trainer_offload_stats: null argument");
  memset(out, 0, sizeof *out);
  const offload_state *o = t->offload;
  if (!o) return TD_OK;
  td_aio_stats a;
  td_aio_get_stats(o->aio, &a);
  td_strlcpy(out->engine, td_aio_engine_name(o->aio), sizeof out->engine);
  out->direct = (o->params_file && td_aio_file_direct(o->params_file)) ||
                (o->state_files[0] && td_aio_file_direct(o->state_files[0]));
  out->bytes_read = a.bytes_read;
  out->bytes_written = a.bytes_written;
  out->direct_bytes = a.direct_bytes;
  out->io_busy_s = a.busy_s;
  out->io_wait_s = a.wait_s;
  out->opt_s = o->stats.opt_s;
  out->opt_compute_s = o->stats.opt_compute_s;
  out->opt_read_wait_s = o->stats.opt_read_wait_s;
  out->opt_write_wait_s = o->stats.opt_write_wait_s;
  out->param_wait_s = o->stats.param_wait_s;
  out->disk_bytes = td_offload_disk_bytes(&t->cfg, t->shard_hi - t->shard_lo, t->shard_lo - o->file_base);
  out->tile = o->tile;
  out->buffer_bytes = td_offload_buffer_bytes(&t->cfg, t->shard_hi - t->shard_lo);
  return TD_OK;
}
