/* td_trainer_save and td_trainer_resume: the one place that knows where the
 * trainer keeps each arena. Everything below it (save.c, load.c, read.c)
 * sees only (arena id, pointer, [lo, hi)) regions, so a ZeRO stage that
 * keeps only a shard of an arena changes held() and nothing else:
 *
 *   held(arena)   the range this rank keeps in memory, and where
 *   save          held ∩ td_shard_range(count, world, rank): each element is
 *                 written once, by 1/world of the ranks' bandwidth each
 *   resume        held: the whole arena at stage 0, the shard at stage >= 1;
 *                 an arena held whole is read 1/world per rank and
 *                 allgathered (the checkpoint is read once, not world times)
 *
 * Under model parallelism (td_trainer_set_grid) the trainer's arenas are
 * this rank's shard of the model: the ranges above are in the shard's
 * (local) coordinates among the data-parallel ranks that hold the same
 * shard, and each is cut by the shard map into regions of the UNSPLIT
 * model's arenas (td_shard_map's runs; a replicated run is saved by its
 * writer only, loaded by all). The save and the load then run over the
 * grid's whole world, so a checkpoint holds the unsplit model exactly once,
 * whichever layout wrote it.
 *
 * Resume reads into staging buffers and copies into the arenas only once
 * every rank has verified its reads, so that a refused checkpoint leaves
 * the trainer unchanged. */
#include "train/checkpoint/ckpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "train/core/core.h"

/* A trainer of a model-parallel config without its grid would save each
 * shard or stage as a whole model. */
static td_status check_layout(const td_trainer *t, const char *what) {
  const char *kind = t->model->kind ? t->model->kind : "";
  const int split = t->cfg.tensor_parallel > 1 || t->cfg.pipeline_parallel > 1 || !strcmp(kind, "gpt-tp") ||
                    !strcmp(kind, "gpt_pipeline"); /* the models td_shard_map_create maps */
  if (split && !t->shard_map)
    return td_error(TD_ERR_INVALID_USAGE, "rank %d: %s under tensor_model_parallel_size %d x "
                    "pipeline_model_parallel_size %d needs the grid: call td_trainer_set_grid(trainer, grid) after "
                    "td_trainer_create", t->rank, what, t->cfg.tensor_parallel, t->cfg.pipeline_parallel);
  return TD_OK;
}

/* The regions of local elements [lo, hi) of `arena` (data: element lo),
 * in the checkpoint's coordinates: itself without a shard map; else one
 * per overlapping run of the map (only the runs this rank writes when
 * `writing`). Appended to *list (grown); 0 when out of memory. */
typedef struct region_list {
  td_ckpt_region *r;
  int n, cap;
} region_list;

static int region_push(region_list *l, td_ckpt_region region) {
  if (l->n == l->cap) {
    int ncap = l->cap ? 2 * l->cap : 16;
    td_ckpt_region *grown = realloc(l->r, (size_t)ncap * sizeof *grown);
    if (!grown) return 0;
    l->r = grown;
    l->cap = ncap;
  }
  l->r[l->n++] = region;
  return 1;
}

static int map_regions(const td_trainer *t, region_list *l, int arena, float *data, uint64_t lo, uint64_t hi,
                       int writing) {
  if (!t->shard_map) return region_push(l, (td_ckpt_region){arena, data, lo, hi});
  const td_shard_map *map = t->shard_map;
  /* first run that ends after lo (runs tile [0, n_local) in order) */
  int a = 0, b = map->n_runs;
  while (a < b) {
    int mid = a + (b - a) / 2;
    if (map->runs[mid].local + map->runs[mid].count <= lo) a = mid + 1;
    else b = mid;
  }
  for (int i = a; i < map->n_runs && map->runs[i].local < hi; i++) {
    const td_shard_run *run = &map->runs[i];
    if (writing && !run->writer) continue;
    uint64_t x = TD_MAX(lo, (uint64_t)run->local), y = TD_MIN(hi, (uint64_t)(run->local + run->count));
    if (y <= x) continue;
    uint64_t u = run->unsplit + (x - run->local);
    if (!region_push(l, (td_ckpt_region){arena, data + (x - lo), u, u + (y - x)})) return 0;
  }
  return 1;
}

/* The range [*lo, *hi) of `arena` this rank holds (in its own arena's
 * coordinates), and the memory of element *lo. At ZeRO stage 0 every rank
 * holds every arena whole. */
static float *held(td_trainer *t, int arena, uint64_t *lo, uint64_t *hi) {
  /* core/core.h: params[i] is element i, valid on [params_lo, params_hi);
   * states[k][j] is element states_lo + j (the shard at ZeRO stage >= 1) */
  if (arena == TD_CKPT_ARENA_PARAMS) {
    *lo = t->params_lo;
    *hi = t->params_hi;
    return t->params + t->params_lo;
  }
  *lo = t->states_lo;
  *hi = t->states_hi;
  return t->states[arena - TD_CKPT_ARENA_STATE0];
}

/* A staging buffer on transparent huge pages where the system offers them
 * (the hint must come before the first touch): a resume writes every byte
 * of it once, and with 4 KiB pages the page faults cost more than the reads
 * (measured: bench/ckpt.sh; faults are dear on virtual machines). */
static float *staging_alloc(size_t floats) {
  size_t bytes = TD_MAX(floats, 1) * sizeof(float);
  void *p = td_alloc(bytes);
#ifdef MADV_HUGEPAGE
  if (p) {
    const uintptr_t huge = (uintptr_t)2 << 20;
    uintptr_t lo = ((uintptr_t)p + huge - 1) & ~(huge - 1), hi = ((uintptr_t)p + bytes) & ~(huge - 1);
    if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
  }
#endif
  return p;
}

td_status td_trainer_save(td_trainer *t, const char *root) {
  if (!t) return td_error(TD_ERR_INVALID_ARGUMENT, "td_trainer_save: null trainer");
  if (t->offload)
    return td_error(TD_ERR_INVALID_USAGE, "rank %d: td_trainer_save: checkpoints of a trainer with NVMe offload are not "
                    "supported yet (the state is in files under nvme_path); train without checkpoints or without "
                    "offload", t->rank);
  TD_CHECK(check_layout(t, "td_trainer_save"));
  region_list regions = {0};
  float *host[TD_CKPT_MAX_ARENAS] = {0}; /* device arenas: their host copies (whole: stage 0 on a device) */
  int n = 1 + t->n_states;
  td_status st = TD_OK;
  for (int a = 0; a < n && st == TD_OK; a++) {
    uint64_t lo, hi;
    float *data = held(t, a, &lo, &hi);
    if (t->devops) {
      /* a device's checkpoint is the host's: the same files, loadable on CPUs */
      host[a] = staging_alloc((size_t)(hi - lo));
      st = host[a] ? td_device_copy(host[a], (td_device){TD_DEVICE_CPU, 0}, data, t->device,
                                    (size_t)(hi - lo) * sizeof(float))
                   : td_error(TD_ERR_SYSTEM, "rank %d: out of memory copying the device arenas to the host for the "
                              "checkpoint", t->rank);
      data = host[a];
    }
    /* among the data-parallel ranks that hold this arena (or this shard of
     * the model), each writes 1/world */
    size_t off, len;
    td_shard_range(t->n_params, t->world, t->rank, &off, &len);
    uint64_t w_lo = TD_MAX(lo, (uint64_t)off), w_hi = TD_MIN(hi, (uint64_t)(off + len));
    if (w_hi < w_lo) w_hi = w_lo;
    if (st == TD_OK && !map_regions(t, &regions, a, data + (w_lo - lo), w_lo, w_hi, 1))
      st = td_error(TD_ERR_SYSTEM, "rank %d: out of memory for the checkpoint's regions", t->rank);
  }
  /* every rank agrees on its regions first: one whose copy or list failed
   * must not leave the others saving alone */
  if (t->devops || t->shard_map) st = td_ckpt_agree(t, st);
  if (st == TD_OK) st = td_ckpt_save_regions(t, root, regions.r, regions.n);
  for (int a = 0; a < n; a++) td_free(host[a]);
  free(regions.r);
  return st;
}

td_status td_trainer_resume(td_trainer *t, const char *path) {
  if (!t) return td_error(TD_ERR_INVALID_ARGUMENT, "td_trainer_resume: null trainer");
  if (t->offload)
    return td_error(TD_ERR_INVALID_USAGE, "rank %d: td_trainer_resume: checkpoints of a trainer with NVMe offload are not "
                    "supported yet (the state is in files under nvme_path); train without checkpoints or without "
                    "offload", t->rank);
  TD_CHECK(check_layout(t, "td_trainer_resume"));
  region_list regions = {0};
  float *arena_mem[TD_CKPT_MAX_ARENAS], *staging[TD_CKPT_MAX_ARENAS], *part[TD_CKPT_MAX_ARENAS];
  uint64_t held_lo[TD_CKPT_MAX_ARENAS], held_hi[TD_CKPT_MAX_ARENAS];
  int gather[TD_CKPT_MAX_ARENAS];
  int n = 1 + t->n_states;
  const int distributed = t->comm && t->world > 1;
  td_status st = TD_OK;
  for (int a = 0; a < n; a++) {
    arena_mem[a] = held(t, a, &held_lo[a], &held_hi[a]);
    staging[a] = staging_alloc((size_t)(held_hi[a] - held_lo[a]));
    if (!staging[a]) st = td_error(TD_ERR_SYSTEM, "rank %d: out of memory staging the checkpoint", t->rank);
    /* An arena every data-parallel rank holds whole: each reads 1/world of
     * it and the ranks allgather the rest (one read of the checkpoint in all
     * instead of one per rank); a sharded arena: this rank's range, read
     * directly. */
    gather[a] = distributed && held_lo[a] == 0 && held_hi[a] == t->n_params;
    size_t off = 0, len = (size_t)(held_hi[a] - held_lo[a]);
    if (gather[a]) td_shard_range(t->n_params, t->world, t->rank, &off, &len);
    part[a] = staging[a] ? staging[a] + off : NULL;
    if (st == TD_OK && !map_regions(t, &regions, a, part[a], held_lo[a] + off, held_lo[a] + off + len, 0))
      st = td_error(TD_ERR_SYSTEM, "rank %d: out of memory for the checkpoint's regions", t->rank);
  }
  /* Every rank must take part in the load's agreement: a failed staging
   * allocation becomes an empty request plus a failure agreed on below. */
  td_ckpt_manifest m;
  memset(&m, 0, sizeof m);
  if (st == TD_OK) {
    st = td_ckpt_load_regions(t, path, regions.r, regions.n, &m);
  } else {
    char why[512];
    td_error_copy(why, sizeof why);
    st = td_ckpt_agree(t, td_error(st, "%s", why));
  }
  free(regions.r);
  /* Every rank verified its reads (agreed): complete the whole arenas, and
   * agree once more (a rank whose allgather failed must not leave the
   * others committing alone). */
  const int loaded = st == TD_OK;
  for (int a = 0; a < n && st == TD_OK; a++)
    if (gather[a]) {
      st = td_allgather(part[a], staging[a], t->n_params, TD_F32, t->comm);
      if (st != TD_OK)
        st = td_error(st, "rank %d: gathering the checkpoint's %s failed: %s", t->rank, a ? "optimizer state" :
                      "parameters", td_comm_last_error(t->comm));
    }
  if (loaded) st = td_ckpt_agree(t, st);
  if (st == TD_OK) {
  /* Commit. */
    for (int a = 0; a < n && st == TD_OK; a++) {
      size_t bytes = (size_t)(held_hi[a] - held_lo[a]) * sizeof(float);
      if (t->devops) /* a CPU's checkpoint on a device: copied in */
        st = td_device_copy(arena_mem[a], t->device, staging[a], (td_device){TD_DEVICE_CPU, 0}, bytes);
      else
        memcpy(arena_mem[a], staging[a], bytes);
    }
    if (st == TD_OK) st = td_trainer_device_params_changed(t); /* bf16 on a device: the model's copy */
    t->step = m.step;
    t->consumed = m.consumed;
    if (m.has_scaler) {
      /* fp16's loss scaler: its state is the run's; its mode (fixed or dynamic) this config's */
      t->scaler.scale = t->cfg.precision.compute == TD_F16 ? m.scaler_scale : 1.0;
      t->scaler.iter = m.scaler_iter;
      t->scaler.last_overflow_iter = m.scaler_last_overflow;
      t->scaler.hysteresis_left = m.scaler_hysteresis_left;
      t->scaler.skipped = m.scaler_skipped;
    }
    if (t->rank == 0 && m.dataset_samples != (unsigned long long)t->dataset->n_samples)
      TD_WARN("the checkpoint was trained on a dataset of %llu samples, this one has %zu: training continues, but "
              "not on the data order the saved run would have seen",
              m.dataset_samples, t->dataset->n_samples);
    if (m.seed != t->cfg.seed) {
      /* The data order is part of the run being continued: keep its seed. */
      TD_INFO("resuming a run saved with seed %llu (this run's seed %llu is ignored for the data order)", m.seed,
              (unsigned long long)t->cfg.seed);
      t->cfg.seed = m.seed;
      t->sampler.seed = m.seed;
      t->sampler.epoch = UINT64_MAX;
    }
  }
  for (int a = 0; a < n; a++) td_free(staging[a]);
  td_ckpt_manifest_free(&m);
  return st;
}

td_status td_checkpoint_info_read(const char *path, td_checkpoint_info *out) {
  if (!out) return td_error(TD_ERR_INVALID_ARGUMENT, "td_checkpoint_info_read: out is NULL");
  memset(out, 0, sizeof *out);
  td_ckpt_dir d;
  TD_CHECK(td_ckpt_open(path, &d));
  out->step = d.m.step;
  out->train_batch_size = (long)d.m.train_batch_size;
  out->world = d.m.world;
  td_ckpt_close(&d);
  return TD_OK;
}
