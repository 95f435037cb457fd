/* ZeRO-Infinity NVMe offload for the trainer (DeepSpeed's offload_optimizer
 * and offload_param with device "nvme"): the parts of a stage-3 rank's
 * training state that live in files instead of RAM, and the hooks
 * trainer.c, zero/shard.c and zero/fetch.c call.
 *
 *   offload.c        creation and removal: files, buffers, engine; counters
 *   aio.c            asynchronous I/O (io_uring, or pread/pwrite threads)
 *   offload_config.c the config keys (offload_optimizer, offload_param,
 *                    sub_group_size, aio) and their checks
 *   swap_dir.c       the job directory under nvme_path: free-space and
 *                    writability checks, a lock per job so that the next
 *                    start removes a killed job's files, removal at exit
 *   opt_step.c       the optimizer step streamed in tiles (sub_group_size)
 *                    with read-ahead and write-behind
 *   param_store.c    the stage-3 parameter shard on disk: initialized
 *                    there, read per layer ahead of use
 *
 * What lives where (this rank's shard [shard_lo, shard_hi)):
 *   gradients    RAM (the f32 shard of the stage-3 gradient arena, as
 *                DeepSpeed's offload keeps them on the host)
 *   parameters   offload_param nvme: file "params.f32"; otherwise RAM.
 *                Tandem computes from the f32 parameters (bf16 rounds them
 *                per product panel), so they are also the master weights:
 *                the optimizer streams them through the same file
 *   moments      offload_optimizer nvme: "exp_avg.f32", "exp_avg_sq.f32"
 *                (SGD: "momentum.f32"); otherwise RAM
 * Element i of the shard is at byte 4 * (i - file_base) of each file, with
 * file_base = shard_lo rounded down to 1024 elements, so that a range's
 * file offset and its address in the page-aligned arena agree modulo 4096
 * and O_DIRECT can move it in place.
 *
 * Internal to src/train. */
#ifndef TD_TRAIN_OFFLOAD_H
#define TD_TRAIN_OFFLOAD_H

#include "train/offload/aio.h"
#include "train/core/core.h"

#define OFFLOAD_ALIGN_FLOATS (TD_AIO_ALIGN / sizeof(float))

typedef struct offload_stats {
  double opt_compute_s;    /* the update kernel on tiles */
  double opt_read_wait_s;  /* optimizer blocked on tile reads */
  double opt_write_wait_s; /* optimizer blocked on tile writes (buffer reuse, the end of the step) */
  double opt_s;            /* the whole tiled step */
  double param_wait_s;     /* fetches blocked on parameter reads */
  long steps;
} offload_stats;

typedef struct offload_state {
  bool params_on_disk, states_on_disk;
  td_aio *aio;
  char dir[512]; /* this job and rank's directory under nvme_path */
  int lock_fd;
  size_t file_base;
  td_aio_file *params_file;
  td_aio_file *state_files[2];
  /* the tiled optimizer step */
  size_t tile;    /* floats per tile (sub_group_size rounded up to 1024) */
  int n_buffers;  /* buffer_count */
  float *buffers; /* n_buffers x (1 + n_states) x tile floats, aligned */
  offload_stats stats;
} offload_state;

/* ---- offload_config.c ---- */
void td_offload_config_defaults(td_offload_config *o);
td_status td_offload_config_check(const td_train_config *cfg);
/* Resolve: offload_param's buffers bound the stage-3 live and prefetch caps. */
void td_offload_config_apply(td_train_config *cfg);
/* One key of zero_optimization ("offload_optimizer", "offload_param",
 * "sub_group_size") or the root "aio" (a cJSON *) into cfg. */
td_status td_offload_parse_json(const void *item, const char *source, td_train_config *cfg);
/* Bytes this configuration puts on disk per rank for a shard of
 * `shard_params` elements starting lead_params after file_base (files
 * rounded to whole blocks; rank 0's lead is 0). */
size_t td_offload_disk_bytes(const td_train_config *cfg, size_t shard_params, size_t lead_params);
/* Bytes of RAM the offload's tile buffers hold per rank (what the tiles
 * touch of the buffers allocated: td_offload_buffer_count of them). */
size_t td_offload_buffer_bytes(const td_train_config *cfg, size_t shard_params);
/* Floats per optimizer tile for a shard of shard_params (sub_group_size,
 * or the automatic choice when it is unset, at most the shard). */
size_t td_offload_tile(const td_train_config *cfg, size_t shard_params);
/* The tile buffers allocated: buffer_count, but no more than the shard
 * has tiles (a buffer no tile uses would be memory for nothing). */
int td_offload_buffer_count(const td_train_config *cfg, size_t shard_params);
/* sub_group_size unset (0): choose it from rank_bytes, the memory this
 * rank may use (0: unknown). A value the user set is kept. */
void td_offload_config_fit(td_train_config *cfg, size_t rank_bytes);
/* Halve a sub_group_size chosen by td_offload_config_fit, no lower than the
 * smallest automatic tile (256Ki: 1 MiB reads); false when it is there
 * already or nothing is offloaded. memory_fit.c calls it only for a tile
 * the user did not set. */
bool td_offload_tile_lower(td_train_config *cfg);

/* ---- swap_dir.c ---- */
/* Remove the directories of dead jobs under `path` (their lock is free);
 * check that `path` is a writable directory with `needed` free bytes;
 * create this rank's directory and hold its lock. */
td_status offload_dir_create(td_trainer *t, const char *path, size_t needed);
void offload_dir_remove(offload_state *o); /* files and directory; NULL-safe */

/* ---- offload.c: the trainer hooks ---- */
/* After zero_create: NULL t->offload when nothing is offloaded to disk;
 * otherwise the directory, files, buffers, engine. Local. */
td_status offload_create(td_trainer *t);
void offload_destroy(td_trainer *t); /* removes the files; NULL-safe */
static inline bool offload_params_on_disk(const td_trainer *t) { return t->offload && t->offload->params_on_disk; }
static inline bool offload_states_on_disk(const td_trainer *t) { return t->offload && t->offload->states_on_disk; }

/* param_store.c: write the initial parameters of the shard (what
 * td_model_init_params gives) to the file, without the whole arena. */
td_status offload_params_init(td_trainer *t);
/* Submit the read of the shard's part of arena range [lo, hi) into
 * t->params (NULL request when the shard has none of it). */
td_status offload_params_read(td_trainer *t, size_t lo, size_t hi, td_aio_req **req_out);
td_status offload_params_wait(td_trainer *t, td_aio_req *req);

/* opt_step.c: the optimizer on the shard, streamed through the files. */
td_status offload_update(td_trainer *t, float lr, float scale, long adam_t);

#endif
