/* ZeRO (DeepSpeed's Zero Redundancy Optimizer) for the trainer: which part
 * of each arena a rank keeps, and the hooks trainer.c calls at stages 1-3.
 *
 * Every arena (parameters, gradients, each optimizer state) is sharded the
 * same way: rank r owns the elements td_shard_range(n_params, world, r), the
 * one pure shard function of src/base (the collectives and checkpoints use
 * it too). What a rank holds per stage is described by the td_trainer
 * fields shard_lo/shard_hi, states_lo/states_hi and params_lo/params_hi
 * (core/core.h); this header is the machinery behind them:
 *
 *   shard.c    layout per stage, arenas that can give pages back
 *              (reserved address space + madvise), the gradient norm from
 *              per-shard partial sums, measured model-state bytes
 *   reduce.c   stage 2+: gradient buckets reduced into their owners'
 *              shards while backward runs; stages 1+: the optimizer on the
 *              shard, the allgather of updated parameters (stage 1 averages
 *              whole gradients with stage 0's allreduce buckets)
 *   fetch.c    stage 3: the td_param_access the model calls per layer
 *              (broadcast from the owners, prefetch, release)
 *   estimate.c bytes per rank per stage before anything is allocated
 *   pages.c    the granule pages are given back in: 2 MiB transparent
 *              huge pages for large arenas (faults cost per page)
 *   device.c   stages 1-2 for a model on a device (device arenas: the
 *              moments sharded, gradients reduced to their owners)
 *
 * Internal to src/train. */
#ifndef TD_TRAIN_ZERO_H
#define TD_TRAIN_ZERO_H

#include "train/core/core.h"

/* A launched piece of a gradient bucket (stage >= 1) or of a parameter
 * fetch (stage 3): one collective over [lo, hi) with root `owner`. */
typedef struct zero_piece {
  td_request *req; /* NULL once completed */
  size_t lo, hi;
  int owner;
} zero_piece;

/* A parameter range fetched at stage 3 and not yet released. */
typedef struct zero_live {
  size_t lo, hi;
  int first_piece, n_pieces; /* into fetch_pieces while in flight */
  bool pending;              /* broadcasts not yet waited for */
  bool persistent;           /* kept until the end of the step */
  int users;                 /* fetches of it (or of a range inside it) not yet released */
  unsigned long last_use;    /* for evicting the least recently used */
  bool deferred;             /* NVMe offload: broadcasts wait for the owner's disk read (disk_req) */
  struct td_aio_req *disk_req;
} zero_live;

typedef enum zero_mem_kind { ZERO_MEM_NONE, ZERO_MEM_ALLOC, ZERO_MEM_SHARED, ZERO_MEM_MAPPED } zero_mem_kind;

typedef struct zero_state {
  int stage;
  size_t page_floats;    /* floats per page */
  size_t granule_floats; /* floats per release granule of MAPPED arenas (pages.c) */
  zero_mem_kind params_kind, grads_kind;
  bool keep_grads; /* stage 2, small model: the gradient arena stays whole (zero_keeps_grads) */
  bool accum_sharded; /* stage 2+, gradient accumulation: every micro-step reduced into the shards (reduce.c) */

  /* stage >= 1: gradient buckets of the current step */
  zero_piece *pieces;
  int n_pieces, cap_pieces, n_done; /* pieces[0, n_done) completed (in order) */
  int n_buckets;
  size_t inflight_floats;     /* launched, not completed */
  size_t released_lo;         /* stage 2+: gradients from here up given back this step (reduce.c) */

  /* stage 3 */
  td_param_access access;
  zero_live *live;
  int n_live, cap_live;
  zero_piece *fetch_pieces;
  int n_fetch_pieces, cap_fetch_pieces;
  size_t live_floats;
  unsigned long use_clock;
  td_status status; /* first failure inside a fetch (the model cannot see it) */
  double fetch_wait_s; /* this step: blocked on parameter broadcasts not yet arrived (td_step_stats) */
  long n_fetches, n_prefetches; /* this step: ranges launched, and of those ahead of their fetch (td_step_stats) */
  bool params_partial; /* stages 1-2 after zero_rebind: only the shard is valid until the next step's allgather */
  bool status_from_disk; /* NVMe offload: that failure was a parameter read; the communicator is fine */
  bool gathered;    /* td_trainer_gather_params materialized the whole arena */

  /* measured model-state bytes (resident pages of params and grads, plus
   * the optimizer state), highest seen while measuring */
  bool measuring;
  long steps_seen; /* zero_step_begin calls so far */
  size_t peak_bytes;
  double *norm_partials; /* (world) */
} zero_state;

/* ---- estimate.c ---- */
/* td_trainer_estimate_memory without the layers above ZeRO (memory_fit.c adds
 * deterministic reduction's buffers). buckets: gradients are reduced in
 * buckets (false under deterministic reduction, whose exchange writes the
 * shard: no bucket of gradients is in flight beyond it). */
td_status zero_estimate_memory(const td_model *model, const td_train_config *cfg, int world, int stage, bool buckets,
                               td_memory_estimate *out);
/* Parameters of the model's largest stage-3 fetch group above the
 * persistence threshold (a transformer block): the least a rank holds
 * fetched while it computes; and, unless NULL, *persistent: those of the
 * groups under it, which stay live from their first fetch (fetch.c counts
 * them in the cache). memory_fit.c sizes the cache from both. */
/* The peers' host-shared arena pages this rank's RSS counts over the shm
 * transport's direct collectives (estimate.c says which; shared: the
 * arenas are host-shared where zero_arena_shareable allows, as
 * td_trainer_create on a communicator allocates them, false for a trainer
 * created unbound, whose arenas are private: nothing then; buckets: the
 * gradients reduced in buckets, not by deterministic reduction; broadcast:
 * the parameters broadcast from rank 0 at creation; direct_min:
 * td_comm_direct_min_bytes, 0: none). Pure. */
size_t zero_peer_mapped_bytes(const td_model *model, const td_train_config *cfg, int world, int stage, int rank,
                              bool shared, bool buckets, bool broadcast, size_t direct_min);
/* Whether any of trainer t's arenas is host-shared (trainer.c's gradients,
 * shard.c's parameter and gradient arenas) */
bool zero_arenas_shared(const td_trainer *t);
/* Whether an arena may live in host-shared memory (shard.c arena_for):
 * not with NVMe offload, nor an arena that gives pages back (mapped) in
 * huge granules. Pure. */
bool zero_arena_shareable(const td_train_config *cfg, bool huge, bool mapped);
size_t zero_largest_group(const td_model *model, long persistence_threshold, size_t *persistent);

/* ---- shard.c ---- */
/* Stage 2 keeps its whole gradient arena resident, as stage 1 does, when
 * the buckets resident at the peak of a step (2 x bucket_bytes, reduce.c)
 * cover the whole arena anyway: giving pages back then saves no peak memory and costs
 * their faults every step. Pure, the same on every rank; the estimate uses
 * it too. */
bool zero_keeps_grads(size_t n_params, int world, int stage, size_t bucket_bytes);
/* Sets t->zero_stage, the shard and the per-arena ranges (every stage,
 * stage 0 included: checkpoints use shard_lo/hi). */
void zero_layout(td_trainer *t);
/* Stage >= 1: allocate the arenas and the bookkeeping (t->zero). */
td_status zero_create(td_trainer *t);
void zero_destroy(td_trainer *t); /* frees what zero_create allocated; NULL-safe */
/* Global L2 norm of the averaged gradient from per-shard partial sums in a
 * fixed order (rank 0's shard, then rank 1's, ...), identical at every
 * stage for a given world size. Stage >= 2 allgathers the partials
 * (collective then). A model split across ranks (grad_norm_sq, nn.h): the
 * whole model's norm, each partial summed over the model's group first at
 * stage >= 2 (collective over that group at every stage). */
td_status zero_grad_norm(td_trainer *t, double *norm_out);

/* ---- pages.c ---- */
size_t zero_page_bytes(void);
/* The granule stage 2-3 arenas give memory back in for this model and world
 * size: 2 MiB (transparent huge pages) when rank 0's shard spans at least
 * two of them and THP is available, else the page size. Fails only on a
 * bad TANDEM_ZERO_HUGE_PAGES. The same answer on every rank. */
td_status zero_granule_bytes(size_t n_params, int world, size_t *out);
/* Reserved address space (no memory yet) for `bytes`, aligned to and
 * rounded up to `granule`, with MADV_HUGEPAGE when granule is larger than a
 * page. NULL when mmap fails. Freed with zero_unreserve. */
float *zero_reserve(size_t bytes, size_t granule);
/* The granule for a vector of `bytes` that another part of the trainer
 * reserves and gives back (deterministic reduction's gradient vectors):
 * 2 MiB when it spans two or more and huge pages are allowed, else the
 * page size. Fails only on a bad TANDEM_ZERO_HUGE_PAGES. */
td_status zero_vector_granule(size_t bytes, size_t *out);
void zero_unreserve(float *p, size_t bytes, size_t granule);
/* A zeroed optimizer-state shard of n_floats, on huge pages when huge pages
 * are allowed and it spans two or more; freed with td_free. Fails on a bad
 * TANDEM_ZERO_HUGE_PAGES or out of memory (message set). */
td_status zero_state_alloc(size_t n_floats, float **out);
/* Give the pages lying wholly inside arena range [lo, hi) back to the
 * system (they read as zeros afterwards), except the shard's. Only for
 * ZERO_MEM_MAPPED arenas. */
void zero_release(const td_trainer *t, float *arena, size_t lo, size_t hi);
/* Resident bytes of any region (mincore over its pages; only the parts of
 * the edge pages inside the region count). */
size_t zero_resident_bytes(const void *p, size_t bytes);
/* Resident bytes of the model state now: the parameter and gradient arenas,
 * the optimizer-state shards (or, offloaded, the RAM tile buffers), each
 * measured with mincore, at every stage. */
size_t zero_model_state_resident(const td_trainer *t);
/* Add the model state resident now to the peak (while measuring: the
 * first two steps). */
void zero_measure(td_trainer *t);
/* Model-state bytes this rank holds: the measured peak at stage >= 1 (or
 * what is resident now, if more), what is resident now at stage 0. */
size_t zero_model_state_bytes(const td_trainer *t);

/* ---- rebind.c ---- */
/* After t->comm, world and rank changed (elastic training): shard every
 * arena for the new world. The optimizer-state shards are reallocated
 * (zeros: the caller restores them), stage 3 keeps only the new parameter
 * shard resident. Local. */
td_status zero_rebind(td_trainer *t);

/* ---- reduce.c (stage >= 1) ---- */
void zero_step_begin(td_trainer *t);                       /* zero the gradients, reset the buckets */
void zero_bucket_launch(td_trainer *t, size_t lo, size_t hi); /* reduce [lo, hi) into the owners' shards */
td_status zero_wait_buckets(td_trainer *t);                 /* wait for every bucket; release */
/* Optimizer on the shard; stages 1-2 then allgather the parameters. */
td_status zero_update(td_trainer *t, float lr, float scale, long adam_t);
void zero_step_end(td_trainer *t); /* stage 3: drop the fetched parameters */
/* accum_sharded: after a micro-step's buckets were reduced into the
 * owners' shards (zero_wait_buckets), clear what lies outside this rank's
 * shard, so the next micro-step's backward starts from zeros there. */
void zero_micro_end(td_trainer *t);

/* ---- fetch.c (stage 3) ---- */
void zero_fetch_init(td_trainer *t); /* fills t->zero->access */
/* Wait for fetches still in flight, release every fetched range. */
void zero_fetch_reset(td_trainer *t);
/* Fetch the whole arena (collective); td_trainer_gather_params. */
td_status zero_fetch_all(td_trainer *t);

/* ---- device.c ---- */
/* Stages 1-3 on device arenas (device.c): a bucket's pieces reduced to
 * their owners (stages 2-3; requests pushed on t->requests), the norm from
 * the owners' shard sums, AdamW on the shard and (stages 1-2) the allgather
 * of the master params (with the bf16 copy rounded again). */
td_status zero_device_bucket_launch(td_trainer *t, size_t lo, size_t hi);
td_status zero_device_grad_norm(td_trainer *t, double *norm_out);
td_status zero_device_update(td_trainer *t, float lr, float grad_scale, long adam_t);
/* Stage 3 on a device: the parameter groups the model fetches are
 * broadcast from their owners into one of ZERO_DEV_SLOTS device buffers of
 * the largest group's size (device.c's comment). */
#define ZERO_DEV_SLOTS 2
typedef struct zero_dev_slot {
  char *mem;              /* device buffer of slot_params elements of the model's type */
  size_t lo, hi;          /* the arena range it holds, when valid */
  int users;              /* fetches not yet released */
  bool valid;             /* holds [lo, hi) of this step's parameters (once its broadcasts are waited for) */
  unsigned long last_use; /* the least recently used free slot is refilled first */
  /* a fill in flight (the prefetch): its broadcasts, one per owner, not yet waited for */
  td_request **reqs; /* world entries */
  int n_reqs;
} zero_dev_slot;
typedef struct zero_devfetch {
  td_param_access access;
  zero_dev_slot slot[ZERO_DEV_SLOTS];
  size_t slot_params;
  td_stream *copy_stream; /* the owner's copy of its piece into a slot (not the model's stream) */
  unsigned long clock;
  td_status status; /* first failure inside a fetch this step (the model sees only NULL) */
  double wait_s;    /* this step: in the fetches' copies and broadcasts */
  long n_fills;     /* this step: groups broadcast into a slot (td_step_stats.param_fetches) */
  long n_ahead;     /* of those, launched ahead of the model's fetch (param_prefetches) */
} zero_devfetch;
/* Elements of the fetch buffers a rank holds at `stage` (0 below stage 3
 * and on one rank, where the shard is the whole arena and a fetch returns
 * it). Pure: the estimate and the allocation both use it. */
size_t zero_device_pool_params(const td_model *model, int world, int stage);
/* Stage 3 on a device: the buffers and the td_param_access, set on the model. */
td_status zero_device_fetch_create(td_trainer *t);
void zero_device_fetch_destroy(td_trainer *t); /* NULL-safe; takes the access off the model */
/* Before a step (and after the parameters changed): nothing fetched is
 * valid. Waits for a fill still in flight (its broadcasts are collective:
 * every rank issued them); a failure there fails the step (dev_fetch->status). */
void zero_device_fetch_reset(td_trainer *t);
/* Device bytes of the model state a rank holds: f32 master params (the
 * shard's at stage 3), the model's gradients (f32, or bf16 with its bf16
 * copy of the params, the shard's at stage 3), n_states moments of `shard`
 * elements (n_params at stage 0) and stage 3's fetch buffers. Pure: the
 * memory fit's estimate and the measured figure are both this. */
size_t zero_device_state_bytes_for(const td_model *model, int world, int stage, int n_states, td_dtype compute);
/* The same, itemized into a td_memory_estimate (stage, world, n_params,
 * shard_params, params, grads, optimizer, live: the fetch buffers,
 * model_states); the rest of *out is left as it is. */
void zero_device_estimate(const td_model *model, int world, int stage, int n_states, td_dtype compute,
                          td_memory_estimate *out);
/* ...for this trainer as allocated */
size_t zero_device_state_bytes(const td_trainer *t);

#endif
