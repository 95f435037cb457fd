/* Memory at the edge (memory_fit.h): refuse at start what cannot fit,
 * size the unset knobs from the memory, watch the RSS during the run.
 *
 * Why at start: a job that does not fit otherwise runs until the kernel's
 * OOM killer ends it, with no message and nothing saved (issue 23: a
 * 2.52B-parameter GPT on 2 ranks was killed after 400 s). The estimate
 * (zero/estimate.c) counts what the trainer allocates; this process's RSS
 * before the arenas (code, libraries, communicator, model tables) is
 * measured and added. */
#include "train/memory_fit.h"
#include "train/offload/offload.h"
#include "train/zero/zero.h"
#include "train/deterministic/deterministic.h"

#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/vfs.h>
#include <time.h>

#define MIB(x) ((double)(x) / 1048576.0)
#define TMPFS_MAGIC_NUMBER 0x01021994 /* linux/magic.h's TMPFS_MAGIC */

/* cuBLASLt's workspace (src/nn/cuda/matmul.cu: 32 MiB) and the kernels'
 * scratch, with room to spare */
#define DEVICE_RUNTIME_BYTES ((size_t)64 << 20)

/* A model on a device: its device memory (zero/device.c's arenas, the
 * activations at the micro-batch in the compute type, the library's
 * workspace), which is what device_memory_fit checks. */
static void device_estimate(const td_model *model, const td_train_config *cfg, int world, int stage, int batch,
                            td_dtype compute, td_memory_estimate *out) {
  memset(out, 0, sizeof *out);
  zero_device_estimate(model, world, stage, td_optimizer_n_states(cfg->optimizer.kind), compute, out);
  out->activations = model->ops->activation_bytes
                         ? model->ops->activation_bytes(model, batch, cfg->activation_checkpointing, compute)
                         : 0;
  out->runtime = DEVICE_RUNTIME_BYTES;
  /* host memory beside the device's: the model's communicators' staging
   * (a device tensor group's staged collectives: train.h), not in runtime */
  if (model->ops->comm_staging_bytes) {
    size_t theirs = 0, all = model->ops->comm_staging_bytes(model, batch, &theirs);
    out->comm_staging = all - TD_MIN(theirs, all);
    out->comm_staging_shared = TD_MIN(theirs, all);
  }
}

/* The whole estimate of one rank (public: train.h). It lives here, with
 * the fit that uses it, so that trainer.c calls down into this file and
 * nothing here calls back up into trainer.c. */
td_status td_trainer_estimate_memory(const td_model *model, const td_train_config *cfg, int world, int stage,
                                     td_memory_estimate *out) {
  if (!model || !cfg)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_trainer_estimate_memory: model, cfg and out are required");
  if (model->device.kind != TD_DEVICE_CPU) {
    if (!out || world < 1 || stage < 0 || stage > 3)
      return td_error(TD_ERR_INVALID_ARGUMENT, "td_trainer_estimate_memory: out is required, world >= 1, stage 0-3 "
                      "(got world %d, stage %d)", world, stage);
    device_estimate(model, cfg, world, stage, cfg->micro_batch > 0 ? cfg->micro_batch : 1, cfg->precision.compute,
                    out);
    return TD_OK;
  }
  size_t det = det_estimate_bytes(cfg, model, world, stage);
  /* automatic threads_per_rank: as many as a trainer on this host would run
   * (the launcher's ranks on it sharing its cores), each with its buffers */
  td_train_config c = *cfg;
  if (c.threads <= 0) c.threads = td_auto_threads(td_host_ranks(NULL));
  TD_CHECK(zero_estimate_memory(model, &c, world, stage, det == 0, out));
  out->deterministic = det;
  if (det && det_keeps_streamed(world, stage)) {
    /* stage 1 under deterministic reduction: the gradient arena keeps only
     * the reduction's range, its streamed vector is kept whole instead (in
     * det) */
    size_t g = det_grads_resident_bytes(out->n_params, world, 0);
    out->model_states = out->model_states - out->grads + g;
    out->grads = g;
  }
  if (cfg->elasticity.enabled) {
    /* two commits of each copy, in files (trainer_elastic.c registers the
     * parameters and the optimizer state: whole at stage 0, written in
     * place, nothing resident; as shards at stages 1-3, through one
     * staging chunk of at most one buffer's shard) */
    size_t row = (1 + (size_t)td_optimizer_n_states(cfg->optimizer.kind)) * sizeof(float);
    if (stage == 0) {
      out->replicas = 0;
      out->replica_disk = 2 * row * out->n_params;
    } else {
      out->replicas = TD_MIN((size_t)TD_ELASTIC_STAGING_BYTES, out->shard_params * sizeof(float));
      out->replica_disk = 2 * 2 * row * out->shard_params; /* own + one ward */
    }
  }
  out->model_states += out->deterministic + out->replicas;
  return TD_OK;
}

/* Offload files on tmpfs are memory (shmem), not disk: the estimate's disk
 * bytes then count against the host's memory too. */
static size_t offload_files_in_memory(const td_trainer *t, const td_memory_estimate *e) {
  const td_offload_config *o = &t->cfg.offload;
  const char *path = o->optimizer_device == TD_OFFLOAD_NVME ? o->optimizer_nvme_path
                     : o->param_device == TD_OFFLOAD_NVME   ? o->param_nvme_path
                                                            : NULL;
  struct statfs fs;
  return path && statfs(path, &fs) == 0 && fs.f_type == TMPFS_MAGIC_NUMBER ? e->disk : 0;
}

/* Pages of the shm transport's staging that the trainer's own traffic
 * makes this rank's RSS count (td_comm_staging_bytes: 0 over TCP), *theirs
 * the peers' part of them: deterministic reduction's point-to-point
 * exchange (det_comm_traffic), and at stage 3 the fetches' broadcasts of
 * up to a group from its owner when the parameter arena is not
 * host-shared (zero_arena_shareable: on huge pages), staged through the
 * segment's slots. With private arenas (shared false: an elastic trainer,
 * created unbound) every collective on them is staged: the parameters'
 * allgather at stages 1-2 and the reduced gradients' at stage 0 under
 * deterministic reduction (buckets false), the buckets' allreduce or
 * reduce-scatter otherwise, stage 3's fetches. The estimate proper
 * (td_trainer_estimate_memory) has no communicator; the fit and the memory
 * line add these. */
static size_t trainer_staging(const td_trainer *t, bool shared, bool buckets, size_t *theirs) {
  *theirs = 0;
  if (!t->comm || t->world < 2) return 0;
  int *peers = calloc(2 * (size_t)t->world, sizeof *peers);
  if (!peers) return 0; /* an estimate, not an allocation */
  td_comm_traffic tr = {0};
  det_comm_traffic(&t->cfg, t->n_params, t->comm, peers, &tr);
  if (!shared) {
    size_t whole = t->n_params * sizeof(float), bucket = TD_MIN(t->cfg.bucket_bytes, whole);
    if (t->zero_stage == 1 || t->zero_stage == 2 || (t->zero_stage == 0 && !buckets))
      tr.allgather = TD_MAX(tr.allgather, whole);
    if (buckets && t->zero_stage <= 1) tr.allreduce = TD_MAX(tr.allreduce, bucket);
    if (buckets && t->zero_stage >= 2) tr.reduce_scatter = TD_MAX(tr.reduce_scatter, bucket);
  }
  if (t->zero_stage >= 3) {
    size_t granule = 0, persistent = 0;
    bool huge = zero_granule_bytes(t->n_params, t->world, &granule) == TD_OK && granule > zero_page_bytes();
    if (!shared || !zero_arena_shareable(&t->cfg, huge, true))
      tr.broadcast = zero_largest_group(t->model, t->cfg.stage3_param_persistence_threshold, &persistent) *
                     sizeof(float);
  }
  size_t bytes = td_comm_staging_bytes(t->comm, &tr, theirs);
  free(peers);
  return bytes;
}

/* The estimate of this trainer's rank under cfg: at the compute threads it
 * runs when cfg leaves them automatic (t->threads, from its
 * communicator's ranks on this host). */
static td_status estimate_at(const td_trainer *t, const td_train_config *cfg, int world, int stage,
                             td_memory_estimate *e) {
  td_train_config c = *cfg;
  if (c.threads <= 0 && t->threads > 0) c.threads = t->threads;
  return td_trainer_estimate_memory(t->model, &c, world, stage, e);
}

/* Bytes the steps need per rank under cfg at `world` ranks and `stage`. */
static size_t need_bytes(const td_trainer *t, const td_train_config *cfg, int world, int stage) {
  td_memory_estimate e;
  if (estimate_at(t, cfg, world, stage, &e) != TD_OK) return SIZE_MAX;
  return e.model_states + e.activations + e.runtime + t->mem_baseline;
}

/* The knobs the user left unset (c->knobs_set; sub_group_size 0), lowered
 * from DeepSpeed's defaults until the estimate of this rank under c at
 * `stage` fits `target`, in the order that costs the least speed:
 *   1. stage3_max_live_parameters (and offload_param's buffers, which cap
 *      it): beyond the group in use and the one fetched ahead, the cache
 *      only saves fetching a released group again within the step, and
 *      with activation checkpointing backward fetches nearly every group
 *      again anyway. In whole groups above the persistent ones (fetch.c
 *      caches groups, and counts the persistent ones in the cap), not below
 *      two: then the next group is still fetched ahead. Whole groups also
 *      make the choice a step function of the room, so that a process
 *      whose own RSS differs by a few KiB (--estimate-memory's) chooses
 *      the same;
 *   2. sub_group_size (when tile_chosen: it was chosen, not set): the
 *      optimizer's tile buffers, halved down to 1 MiB reads;
 *   3. bucket_bytes (stages 2-3: two buckets of gradients in flight),
 *      halved down to 1 MiB: more, smaller collectives.
 * Then, from the model: an unset stage3_prefetch_bucket_size that a block
 * exceeds (DeepSpeed's 5e7 is less than one block of a GPT of 2048
 * channels or more: nothing would be read ahead) is raised to one block
 * when the cache holds two, and unset offload_param buffers are reported
 * as what they bound. Every rank computes the same from the same room
 * (the least of the ranks', trainer_memory_fit), so the fetch decisions,
 * which must match across ranks (zero/fetch.c), match. Writes the knobs it
 * changed to `chosen`. */
static void fit_unset_knobs(const td_trainer *t, td_train_config *c, int stage, bool tile_chosen, size_t target,
                            size_t files, char *chosen, size_t cap) {
  size_t off = 0;
  chosen[0] = 0;
#define NOTE(...) (off += (size_t)snprintf(chosen + off, off < cap ? cap - off : 0, __VA_ARGS__))
  size_t need = need_bytes(t, c, t->world, stage) + files, persistent = 0;
  size_t group = stage >= 3 ? zero_largest_group(t->model, c->stage3_param_persistence_threshold, &persistent) : 0;
  long live_before = c->stage3_max_live_parameters;
  if (stage >= 3 && group > 0 && !(c->knobs_set & TD_KNOB_STAGE3_MAX_LIVE)) {
    long n = (long)t->n_params, kept = (long)persistent, g = (long)group;
    long least = TD_MIN(kept + 2 * g, n), live = TD_MIN(c->stage3_max_live_parameters, n);
    while (need > target && live > least) {
      size_t excess = (need - target + sizeof(float) - 1) / sizeof(float);
      long want = live - least > (long)excess ? live - (long)excess : least;
      long whole = kept + TD_MAX(2L, (want - kept) / g) * g; /* want, down to whole groups */
      live = TD_MAX(least, whole < live ? whole : live - g);
      c->stage3_max_live_parameters = live;
      need = need_bytes(t, c, t->world, stage) + files;
    }
  }
  if (tile_chosen)
    while (need > target && td_offload_tile_lower(c)) need = need_bytes(t, c, t->world, stage) + files;
  if (stage >= 2 && !(c->knobs_set & TD_KNOB_BUCKET_BYTES)) {
    size_t before = c->bucket_bytes;
    while (need > target && c->bucket_bytes > ((size_t)1 << 20)) {
      c->bucket_bytes = TD_MAX(c->bucket_bytes / 2, (size_t)1 << 20);
      c->first_bucket_bytes = TD_MIN(c->first_bucket_bytes, c->bucket_bytes);
      need = need_bytes(t, c, t->world, stage) + files;
    }
    if (c->bucket_bytes != before) NOTE(" bucket_bytes %zu", c->bucket_bytes);
  }
  if (stage >= 3) {
    if (c->stage3_max_live_parameters != live_before)
      NOTE(" stage3_max_live_parameters %ld", c->stage3_max_live_parameters);
    td_offload_config *o = &c->offload;
    /* offload_param buffers the user set keep bounding what is read ahead (td_offload_config_apply) */
    bool capped = o->param_device == TD_OFFLOAD_NVME && (c->knobs_set & TD_KNOB_PARAM_BUFFERS) &&
                  o->param_buffer_size < (long)group;
    if (!(c->knobs_set & TD_KNOB_STAGE3_PREFETCH) && !capped && c->stage3_prefetch_bucket_size < (long)group &&
        c->stage3_max_live_parameters >= 2 * (long)group) {
      c->stage3_prefetch_bucket_size = (long)group;
      NOTE(" stage3_prefetch_bucket_size %ld (one block)", c->stage3_prefetch_bucket_size);
    }
    if (o->param_device == TD_OFFLOAD_NVME && !(c->knobs_set & TD_KNOB_PARAM_BUFFERS) && off > 0) {
      o->param_buffer_size = TD_MAX(o->param_buffer_size, c->stage3_prefetch_bucket_size);
      o->param_buffer_count = (int)TD_MAX(1L, TD_MIN(64L, (c->stage3_max_live_parameters + o->param_buffer_size - 1) /
                                                              o->param_buffer_size));
      o->param_max_in_cpu = TD_MAX(o->param_max_in_cpu, c->stage3_max_live_parameters);
      NOTE(" offload_param.buffer_size %ld buffer_count %d", o->param_buffer_size, o->param_buffer_count);
    }
  }
  if (tile_chosen) NOTE(" sub_group_size %ld", c->offload.sub_group_size);
#undef NOTE
}

/* Append to buf what would fit the rank's memory, by the estimate: other
 * stages, offload, micro-batch 1, checkpointing, more ranks. */
static void what_fits(const td_trainer *t, size_t room, char *buf, size_t cap) {
  const td_train_config *cfg = &t->cfg;
  size_t off = 0;
  /* the options, each after ": " (the first) or "; " */
#define ADD(...) (off += (size_t)snprintf(buf + off, off < cap ? cap - off : 0, "%s", off ? "; " : ": "), \
                  off += (size_t)snprintf(buf + off, off < cap ? cap - off : 0, __VA_ARGS__))
  bool offloaded = cfg->offload.optimizer_device == TD_OFFLOAD_NVME || cfg->offload.param_device == TD_OFFLOAD_NVME;
  for (int s = 0; s <= 3 && !offloaded; s++) {
    size_t n = need_bytes(t, cfg, t->world, s);
    if (s != t->zero_stage && n <= room) ADD("ZeRO stage %d (%.0f MiB per rank)", s, MIB(n));
  }
  if (cfg->offload.param_device != TD_OFFLOAD_NVME) {
    /* with the knobs the trainer would lower there (the cache of fetched
     * groups first), checked by the estimate at those knobs */
    td_train_config c = *cfg;
    c.zero_stage = 3;
    c.offload.optimizer_device = c.offload.param_device = TD_OFFLOAD_NVME;
    long before = c.offload.sub_group_size;
    td_offload_config_fit(&c, room);
    char knobs[256];
    fit_unset_knobs(t, &c, 3, c.offload.sub_group_size != before, room - room / 20, 0, knobs, sizeof knobs);
    size_t n = need_bytes(t, &c, t->world, 3);
    if (n <= room)
      ADD("stage 3 with offload_optimizer and offload_param \"nvme\" (--offload-optimizer nvme:DIR --offload-param "
          "nvme:DIR) and stage3_max_live_parameters %ld (%.0f MiB per rank; the knobs left unset are lowered so:%s)",
          c.stage3_max_live_parameters, MIB(n), knobs[0] ? knobs : " none needed");
  }
  if (cfg->micro_batch > 1) {
    td_train_config c = *cfg;
    c.micro_batch = 1;
    size_t n = need_bytes(t, &c, t->world, t->zero_stage);
    if (n <= room) ADD("--micro-batch 1 with gradient accumulation (%.0f MiB per rank)", MIB(n));
  }
  if (!cfg->activation_checkpointing) {
    td_train_config c = *cfg;
    c.activation_checkpointing = 1;
    size_t n = need_bytes(t, &c, t->world, t->zero_stage);
    if (n <= room) ADD("activation checkpointing (%.0f MiB per rank)", MIB(n));
  }
  if (t->zero_stage >= 1) { /* sharded state shrinks with more ranks, each with this much memory */
    int w = t->world;
    while (w < (1 << 16) && need_bytes(t, cfg, w, t->zero_stage) > room) w = w < 4 ? w + 1 : w + w / 4;
    while (w - 1 > t->world && w < (1 << 16) && need_bytes(t, cfg, w - 1, t->zero_stage) <= room) w--; /* the least */
    if (w < (1 << 16) && w > t->world)
      ADD("%d ranks or more, on more hosts (%.0f MiB per rank)", w, MIB(need_bytes(t, cfg, w, t->zero_stage)));
  }
  if (off == 0) ADD("nothing of these by the estimate: more memory per rank, or a smaller model");
  snprintf(buf + off, off < cap ? cap - off : 0,
           ". Activations scale with --seq and --micro-batch; TANDEM_MEMORY_LIMIT=off skips this check");
#undef ADD
}

/* ---- a model on a device ----
 * Its arenas (zero/device.c) and activations are device memory, checked
 * against what the device has free; host memory then holds this process
 * (the baseline, measured) and small staging buffers, and is only watched.
 * The device's free memory is shared by the ranks the device-selection
 * policy puts on it (td_train_device_select: local rank % GPUs): every rank
 * asks before any allocates (the agreement below comes first). */

typedef struct device_need {
  size_t states, activations, total;
} device_need;

static device_need device_need_ckpt(const td_trainer *t, int stage, int batch, td_dtype compute, int ckpt) {
  td_memory_estimate e;
  td_train_config cfg = t->cfg;
  cfg.activation_checkpointing = ckpt;
  device_estimate(t->model, &cfg, t->world, stage, batch, compute, &e);
  return (device_need){e.model_states, e.activations, e.model_states + e.activations + e.runtime};
}

static device_need device_need_for(const td_trainer *t, int stage, int batch, td_dtype compute) {
  return device_need_ckpt(t, stage, batch, compute, t->cfg.activation_checkpointing);
}

static td_status device_memory_fit(td_trainer *t) {
  const td_device dev = t->model->device;
  char name[16];
  td_device_name(dev, name, sizeof name);
  size_t free_bytes = 0, total_bytes = 0;
  td_status st = td_device_mem_info(dev, &free_bytes, &total_bytes);
  if (st != TD_OK) { /* the room is unknown: not a reason to refuse */
    TD_DEBUG("rank %d: device memory of %s unknown (%s): not checked", t->rank, name, td_last_error());
    return td_trainer_agree(t, TD_OK);
  }
  int local = t->comm ? td_comm_host_size(t->comm) : 1, n_dev = td_device_count(dev.kind);
  int sharing = n_dev > 0 ? local / n_dev + (dev.index < local % n_dev) : 1;
  if (sharing < 1) sharing = 1;
  size_t room = free_bytes / (size_t)sharing;
  const td_dtype compute = t->cfg.precision.compute;
  device_need need = device_need_for(t, t->zero_stage, t->cfg.micro_batch, compute);
  t->mem_estimate = t->mem_baseline; /* the host's share: this process */
  if (need.total > room) {
    char fits[512];
    size_t off = 0;
#define ADD_FIT(...) (off += (size_t)snprintf(fits + off, off < sizeof fits ? sizeof fits - off : 0, __VA_ARGS__))
    if (compute == TD_F32 && device_need_for(t, t->zero_stage, t->cfg.micro_batch, TD_BF16).total <= room)
      ADD_FIT("; bf16 (--bf16)");
    for (int s = 1; s <= 3; s++)
      if (s != t->zero_stage && device_need_for(t, s, t->cfg.micro_batch, compute).total <= room)
        ADD_FIT("; ZeRO stage %d", s);
    if (!t->cfg.activation_checkpointing &&
        device_need_ckpt(t, t->zero_stage, t->cfg.micro_batch, compute, 1).total <= room)
      ADD_FIT("; activation checkpointing (--activation-checkpointing)");
    int b = t->cfg.micro_batch / 2;
    while (b >= 1 && device_need_for(t, t->zero_stage, b, compute).total > room) b /= 2;
    if (b >= 1) ADD_FIT("; --micro-batch %d with gradient accumulation", b);
    if (off == 0)
      ADD_FIT("; none of bf16, ZeRO stages 1-3, activation checkpointing or a smaller micro-batch: more GPUs, or a "
              "smaller model");
#undef ADD_FIT
    st = td_error(TD_ERR_INVALID_USAGE,
                  "rank %d: this job needs about %.0f MiB of device memory on %s (model states %.0f, activations "
                  "%.0f at micro-batch %d, library workspace %.0f) but %.0f MiB are free for this rank (%.0f of "
                  "%.0f MiB free, shared by %d rank%s on it). It would fit with: %s",
                  t->rank, MIB(need.total), name, MIB(need.states), MIB(need.activations), t->cfg.micro_batch,
                  MIB(DEVICE_RUNTIME_BYTES), MIB(room), MIB(free_bytes), MIB(total_bytes), sharing,
                  sharing == 1 ? "" : "s", fits + 2);
  }
  return td_trainer_agree(t, st);
}


/* The least room of the ranks (0: unknown, on every rank alike) and the
 * largest baseline: the knobs fitted from them must be the same on every
 * rank (zero/fetch.c, and the gradient buckets' sizes), and each rank's own
 * RSS before the arenas differs by a few KiB to MiB. With its own baseline
 * a rank near a threshold halved bucket_bytes where its peer did not, and
 * their reductions disagreed in count (memory_refuse_limit, seen in CI). */
static td_status least_room(td_trainer *t, size_t *room) {
  if (!t->comm || t->world == 1) return TD_OK;
  int64_t r[2] = {*room ? (int64_t)TD_MIN(*room, (size_t)INT64_MAX) : INT64_MAX,
                  -(int64_t)TD_MIN(t->mem_baseline, (size_t)INT64_MAX)}; /* min of -x: the max of x */
  td_status st = td_allreduce(r, r, 2, TD_I64, TD_MIN, t->comm);
  if (st != TD_OK) return td_error(st, "rank %d: agreeing on the memory per rank: %s", t->rank, td_comm_last_error(t->comm));
  *room = r[0] == INT64_MAX ? 0 : (size_t)r[0];
  t->mem_baseline = (size_t)-r[1];
  return TD_OK;
}

/* trainer_memory_fit, or (elastic_plan) the plan of an elastic trainer
 * that td_trainer_fit_memory makes with a communicator in hand: that
 * trainer is created unbound (td_trainer_create_unbound: no communicator
 * to agree on lowered knobs with, no initial broadcast) and bound at each
 * epoch with its shards restored, which trainer_memory_rebind estimates */
static td_status memory_fit(td_trainer *t, bool elastic_plan) {
  td_status st = td_mem_room_get(td_host_ranks(t->comm), &t->mem_room);
  t->mem_baseline = td_mem_rss(NULL);
  if (t->model->device.kind != TD_DEVICE_CPU) return st != TD_OK ? td_trainer_agree(t, st) : device_memory_fit(t);
  size_t room = t->mem_room.rank_bytes;
  td_status agreed = least_room(t, &room); /* collective: every rank calls it, also after a failed probe */
  if (st == TD_OK) st = agreed;
  char chosen[512] = "";
  td_memory_estimate e;
  if (st == TD_OK) { /* unset knobs from the memory (room 0: unknown) */
    long before = t->cfg.offload.sub_group_size;
    td_offload_config_fit(&t->cfg, room);
    t->offload_tile_chosen = t->cfg.offload.sub_group_size != before;
    st = estimate_at(t, &t->cfg, t->world, t->zero_stage, &e);
  }
  /* lowered only as far as needed to fit, with 5% left for what the
   * estimate cannot see (other processes' growth, the allocator) */
  /* An unbound (elastic) trainer has no communicator to agree on the room
   * with, and the knobs must match across ranks: it keeps the defaults. */
  bool agreeable = elastic_plan ? t->world == 1 : t->comm || t->world == 1;
  if (st == TD_OK && room > 0 && agreeable)
    fit_unset_knobs(t, &t->cfg, t->zero_stage, t->offload_tile_chosen, room - room / 20,
                    offload_files_in_memory(t, &e), chosen, sizeof chosen);
  if (st == TD_OK && chosen[0])
    TD_INFO("rank %d: chosen from the model and the %.0f MiB available to each rank (%s), as they were not set:%s",
            t->rank, MIB(room), t->mem_room.source, chosen);
  if (st == TD_OK) st = estimate_at(t, &t->cfg, t->world, t->zero_stage, &e);
  if (st == TD_OK) {
    size_t files = offload_files_in_memory(t, &e);
    /* td_trainer_create on a communicator shares the arenas where it can
     * and broadcasts the parameters; an elastic trainer does neither */
    bool bound = t->comm != NULL && !elastic_plan;
    size_t staged_theirs = 0, staged = trainer_staging(t, bound, e.deterministic == 0, &staged_theirs);
    size_t need = e.model_states + e.activations + e.runtime + t->mem_baseline + files + (staged - staged_theirs);
    t->mem_estimate = need;
    /* what the RSS counts on top (the memory line, td_trainer_memory); the
     * check below is of physical memory, where those pages are the peers' */
    t->mem_peer_mapped = zero_peer_mapped_bytes(t->model, &t->cfg, t->world, t->zero_stage, t->rank, bound,
                                                e.deterministic == 0, bound,
                                                t->comm ? td_comm_direct_min_bytes(t->comm) : 0) +
                         e.comm_staging_shared + /* the model's own groups' staging pages in the peers' slots */
                         staged_theirs;
    if (room > 0 && need > room) {
      char fits[1024], tmpfs[80] = "";
      what_fits(t, room, fits, sizeof fits);
      if (files) snprintf(tmpfs, sizeof tmpfs, "; offload files on tmpfs (memory) %.0f", MIB(files));
      st = td_error(TD_ERR_INVALID_USAGE,
                    "rank %d: this job needs about %.0f MiB per rank (model states %.0f, of which offload buffers "
                    "%.0f; activations %.0f; compute and I/O scratch %.0f; this process before the arenas %.0f%s) "
                    "but %.0f MiB are available to it (%s, shared by %d ranks on this "
                    "host%s%s). It would fit with%s",
                    t->rank, MIB(need), MIB(e.model_states), MIB(e.offload_buffers), MIB(e.activations),
                    MIB(e.runtime), MIB(t->mem_baseline), tmpfs, MIB(room), t->mem_room.source,
                    t->mem_room.local_ranks, chosen[0] ? "; the knobs not set already lowered to" : "", chosen, fits);
    }
  }
  return td_trainer_agree(t, st);
}

td_status trainer_memory_fit(td_trainer *t) { return memory_fit(t, false); }

/* At an elastic membership change (trainer_elastic.c), after the new
 * world's batch split and before its shards are cut: the shards grow as
 * the world shrinks (16Ψ/N at stage 3), so a world that fitted may not
 * now. Measured afresh: the memory each rank of the new epoch may use (its
 * host may have lost or gained ranks; the room counts what the host's
 * ranks hold back in, so the arenas held now do not make it look full) and
 * the estimate at the new world; the knobs stay (they were chosen for the
 * job and must match across ranks), and so does the baseline measured
 * before the arenas. Refused on every rank when some rank would not fit,
 * before anything is allocated. Collective over the new communicator. */
td_status trainer_memory_rebind(td_trainer *t, int old_world) {
  if (t->model->device.kind != TD_DEVICE_CPU) return TD_OK; /* elastic training runs on the CPU */
  td_status st = td_mem_room_get(t->comm ? td_host_ranks(t->comm) : 1, &t->mem_room); /* NULL: a world of one */
  size_t room = t->mem_room.rank_bytes;
  td_status agreed = least_room(t, &room); /* collective: every rank calls it */
  if (st == TD_OK) st = agreed;
  td_memory_estimate e;
  if (st == TD_OK) st = estimate_at(t, &t->cfg, t->world, t->zero_stage, &e);
  if (st == TD_OK) {
    bool shared = zero_arenas_shared(t); /* private when created unbound */
    size_t staged_theirs = 0, staged = trainer_staging(t, shared, e.deterministic == 0, &staged_theirs);
    size_t need = e.model_states + e.activations + e.runtime + t->mem_baseline + (staged - staged_theirs);
    size_t before = t->mem_estimate;
    t->mem_estimate = need;
    t->mem_peer_mapped = zero_peer_mapped_bytes(t->model, &t->cfg, t->world, t->zero_stage, t->rank,
                                                shared,
                                                e.deterministic == 0, false, /* the shards are restored */
                                                td_comm_direct_min_bytes(t->comm)) +
                         e.comm_staging_shared + staged_theirs;
    if (room > 0 && need > room) {
      char fits[1024];
      what_fits(t, room, fits, sizeof fits);
      st = td_error(TD_ERR_INVALID_USAGE,
                    "rank %d: the job went from %d to %d ranks, and at %d ranks (the shards grow as the world "
                    "shrinks) it needs about %.0f MiB per rank (%.0f before; model states %.0f, activations %.0f "
                    "at micro-batch %d, compute scratch %.0f, this process before the arenas %.0f) but %.0f MiB "
                    "are available to it (%s, shared by %d ranks on this host). Not resized: nothing was "
                    "allocated for %d ranks, and the job stops here rather than run out of memory; the last "
                    "checkpoint (train-gpt --save DIR --save-every N) resumes it (--resume DIR). Bring the lost "
                    "ranks back (--min-np %d keeps it from going below them), or restart it so that it fits "
                    "with%s",
                    t->rank, old_world, t->world, t->world, MIB(need), MIB(before), MIB(e.model_states),
                    MIB(e.activations), t->cfg.micro_batch, MIB(e.runtime), MIB(t->mem_baseline), MIB(room),
                    t->mem_room.source, t->mem_room.local_ranks, t->world, old_world, fits);
    } else {
      TD_INFO("rank %d: memory at %d ranks: about %.0f MiB per rank (%.0f at %d), %.0f MiB available to it (%s)",
              t->rank, t->world, MIB(need), MIB(before), old_world, MIB(room), t->mem_room.source);
    }
  }
  return td_trainer_agree(t, st);
}

td_status trainer_gather_fits(td_trainer *t) {
  td_status st = TD_OK;
  size_t room = t->mem_room.rank_bytes;
  if (room > 0 && t->zero_stage >= 3) {
    td_memory_estimate e;
    st = estimate_at(t, &t->cfg, t->world, t->zero_stage, &e);
    /* the estimate, not the RSS now: every rank decides alike. (The cache
     * of fetched groups is emptied first, but the gradient buckets' pages
     * may still be there: measured, the whole estimate stays.) */
    size_t need = t->mem_estimate + e.gather;
    if (st == TD_OK && need > room)
      st = td_error(TD_ERR_INVALID_USAGE,
                    "rank %d: gathering the whole parameter arena (ZeRO stage 3) needs %.0f MiB more on every rank, "
                    "%.0f MiB with what it holds, but %.0f MiB are available to it (%s): not gathered",
                    t->rank, MIB(e.gather), MIB(need), MIB(room), t->mem_room.source);
  }
  return td_trainer_agree(t, st);
}

/* This thread's CPU seconds: what a read of /proc costs it, whatever the
 * load (wall time would count the waits for a core). */
static double thread_cpu_s(void) {
  struct timespec ts;
  return clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) == 0 ? (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec : 0.0;
}

/* After every step. The Pss (smaps_rollup) makes the kernel walk every page
 * table of the process: measured, it was half the CPU of a small model's
 * step, and read once a second still 0.5-0.8% of a training run's CPU
 * (smaps_account; the walk grows with the RSS). The RSS (two counters in
 * /proc/self/status) bounds it from above, so the Pss is read afresh every
 * step while the RSS is past 90% of the room, where a warning may be due,
 * and otherwise, for the series, after a gap of 1000 times the CPU the last
 * read took, 1 to 60 s: at most 0.1% of a core, whatever the size. */
#define PSS_READ_SHARE 1000.0
void trainer_memory_watch(td_trainer *t, td_step_stats *stats) {
  size_t room = t->mem_room.rank_bytes, rss = td_mem_rss(NULL);
  double now = td_now(), gap = TD_MIN(60.0, TD_MAX(1.0, t->mem_pss_gap));
  if (t->mem_pss_at == 0 || now - t->mem_pss_at >= gap || (room && rss > room / 100 * 90)) {
    double cpu = thread_cpu_s();
    t->mem_pss = td_mem_pss();
    t->mem_pss_gap = PSS_READ_SHARE * (thread_cpu_s() - cpu);
    t->mem_pss_at = now;
  }
  rss = t->mem_pss < rss ? t->mem_pss : rss; /* a Pss read earlier may exceed what is resident now */
  stats->memory_bytes = rss;
  stats->memory_limit_bytes = room;
  if (room == 0) return;
  int level = rss > room / 100 * 97 ? 2 : rss > room / 100 * 90 ? 1 : 0;
  if (level > t->mem_warned) {
    TD_WARN("rank %d: its share of memory (Pss) %.0f MiB is %.0f%% of the %.0f MiB available to this rank (%s) "
            "after step %ld; the estimate was %.0f MiB: the kernel may end the job when memory runs out",
            t->rank, MIB(rss), 100.0 * (double)rss / (double)room, MIB(room), t->mem_room.source, t->step,
            MIB(t->mem_estimate));
    t->mem_warned = level;
  }
  stats->memory_warning = level;
}

/* The estimate as the RSS counts it (the peers' pages mapped here too) and
 * the part of it that is physically the peers' (shared_bytes). */
static void fill_memory_info(const td_trainer *t, td_trainer_memory_info *out) {
  out->estimate_bytes = t->mem_estimate + t->mem_peer_mapped;
  out->shared_bytes = t->mem_peer_mapped;
  out->baseline_bytes = t->mem_baseline;
  out->limit_bytes = t->mem_room.rank_bytes;
  td_strlcpy(out->limit_source, t->mem_room.host_bytes ? t->mem_room.source : "none", sizeof out->limit_source);
  out->rss_bytes = td_mem_rss(&out->peak_rss_bytes);
}

td_status td_trainer_memory(const td_trainer *t, td_trainer_memory_info *out) {
  if (!t || !out) return td_error(TD_ERR_INVALID_ARGUMENT, "td_trainer_memory: null argument");
  memset(out, 0, sizeof *out);
  fill_memory_info(t, out);
  return TD_OK;
}

td_status td_trainer_fit_memory(const td_train_config *cfg, td_model *model, td_comm *comm, td_train_config *fitted,
                                td_trainer_memory_info *out) {
  if (!cfg || !model || !out)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_trainer_fit_memory: cfg, model and out are required");
  memset(out, 0, sizeof *out);
  /* a trainer with its tables only: what trainer_create holds when it fits */
  td_trainer *t = calloc(1, sizeof *t);
  int world = comm ? td_comm_size(comm) : 1;
  int32_t *flags = calloc((size_t)world, sizeof *flags);
  if (!t || !flags) {
    free(t);
    free(flags);
    return td_error(TD_ERR_SYSTEM, "td_trainer_fit_memory: out of memory for the trainer's tables");
  }
  t->cfg = *cfg;
  t->model = model;
  t->comm = comm;
  t->rank = comm ? td_comm_rank(comm) : 0;
  t->world = world;
  t->agree_flags = flags;
  t->n_params = model->n_params;
  t->n_states = td_optimizer_n_states(cfg->optimizer.kind);
  t->threads = cfg->threads > 0 ? cfg->threads : td_auto_threads(td_host_ranks(t->comm)); /* as trainer.c runs them */
  td_status st = td_train_config_resolve(&t->cfg, world); /* the same on every rank: no collective skipped alone */
  if (st == TD_OK) {
    zero_layout(t);
    st = memory_fit(t, t->cfg.elasticity.enabled); /* elastic: as trainer_memory_rebind will estimate it */
  }
  fill_memory_info(t, out);
  if (fitted) *fitted = t->cfg;
  free(flags);
  free(t);
  return st;
}
