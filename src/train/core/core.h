/* The core of src/train, below every part of the engine: the trainer's
 * state (struct td_trainer), td_trainer_agree, the distributed sampler,
 * optimizer kernels and CRC-32. The parts (zero/, deterministic/,
 * precision/, offload/, checkpoint/, elastic/) have a header each; trainer.c
 * and config.c, above them, drive them. Not part of the public API. */
#ifndef TD_TRAIN_CORE_H
#define TD_TRAIN_CORE_H

#include "base/base.h"
#include "tandem/parallel.h"
#include "tandem/train.h"
#include "train/core/devops.h"

/* ---- distributed sampler ----
 * The stream of samples is the concatenation of per-epoch permutations of
 * [0, n): position p (0, 1, 2, ...) is sample perm_{p / n}[p % n], where
 * perm_e is a Fisher-Yates shuffle seeded by (seed, e). A training step
 * consumes G consecutive positions; rank r's micro-step m takes positions
 * consumed + m*(world*micro) + r*micro + [0, micro). The mapping from
 * position to sample depends on neither world size nor micro-batch, which is
 * what makes N ranks compute what one rank does. The checkpointed state is
 * just `consumed`. */
typedef struct td_sampler {
  size_t n_samples;
  uint64_t seed;
  uint64_t epoch; /* epoch whose permutation is in perm (UINT64_MAX: none) */
  size_t *perm;   /* n_samples entries */
} td_sampler;

td_status td_sampler_init(td_sampler *s, size_t n_samples, uint64_t seed);
void td_sampler_free(td_sampler *s);
/* Sample index at stream position `position`. */
size_t td_sampler_index(td_sampler *s, uint64_t position);
/* First stream position of (rank, micro_step) in the step starting at `consumed`. */
static inline uint64_t td_sampler_position(uint64_t consumed, int world, int rank, int micro, int micro_step) {
  return consumed + (uint64_t)micro_step * (uint64_t)world * (uint64_t)micro + (uint64_t)rank * (uint64_t)micro;
}

/* splitmix64: the seeding mixer used for shuffles. */
static inline uint64_t td_splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* ---- optimizer kernels (one pass over a flat range) ----
 * grad_scale multiplies the gradient first (gradient clipping). `t` is the
 * 1-based step count for Adam's bias correction. */
void td_sgd_update(float *restrict params, const float *restrict grads, float *restrict momentum_buf, size_t n,
                   float lr, float momentum, float weight_decay, int nesterov, float grad_scale);
void td_adamw_update(float *restrict params, const float *restrict grads, float *restrict m, float *restrict v,
                     size_t n, float lr, float beta1, float beta2, float eps, float weight_decay, long t,
                     float grad_scale);
/* L2 norm of a vector, accumulated in double. */
double td_l2_norm(const float *x, size_t n);
/* Sum of squares of x[0, n) (float blocks of 1024, the blocks in double);
 * the gradient norm sums these per shard (src/train/zero/shard.c). */
double td_sum_squares(const float *x, size_t n);
/* Scale factor for clipping to max_norm (1 when max_norm <= 0 or norm <= max_norm). */
float td_clip_scale(double norm, float max_norm);

/* Number of optimizer-state arenas of an optimizer (SGD 1, AdamW 2). */
int td_optimizer_n_states(td_optimizer_kind kind);
const char *td_optimizer_name(td_optimizer_kind kind);

/* ---- CRC-32 (the zlib / IEEE 802.3 polynomial) ---- */
uint32_t td_crc32(uint32_t crc, const void *data, size_t n);

/* DeepSpeed's DynamicLossScaler, for fp16 (also a fixed scale); here because
 * the trainer holds one, its functions in precision/precision.h. */
typedef struct td_loss_scaler {
  double scale;           /* the current loss scale (1 when not fp16) */
  int dynamic;            /* 0: a fixed scale, never changed */
  long iter;              /* steps seen by the scaler (skipped ones included) */
  long last_overflow_iter; /* -1: none yet */
  int hysteresis_left;    /* overflows still tolerated before the next halving */
  long skipped;           /* steps skipped for overflow, in all */
} td_loss_scaler;

/* ---- threads.c: compute threads per rank when automatic ---- */
/* The cores this process may use (its affinity) divided among the host's
 * `local_ranks` ranks, at least 1. Local. */
int td_auto_threads(int local_ranks);
/* The ranks sharing this host: td_comm_host_size(comm), or with no
 * communicator yet (an unbound, elastic trainer) the slots the launcher
 * gave the host (TANDEM_LOCAL_SIZE; tandemrun --elastic sets it), 1 when
 * unset or out of range. The one reader of TANDEM_LOCAL_SIZE. Local. */
int td_host_ranks(const td_comm *comm);

/* ---- memory.c: the memory this rank may use, and what it holds ---- */
typedef struct td_mem_room {
  size_t host_bytes; /* the job's memory on this host (0: unknown, or TANDEM_MEMORY_LIMIT=off) */
  size_t rank_bytes; /* host_bytes / local_ranks: what this rank may hold in all */
  int local_ranks;
  char source[400]; /* which limit binds, in words ("MemAvailable 20480 MiB", a cgroup file, TANDEM_MEMORY_LIMIT) */
} td_mem_room;
/* Measure now (MemAvailable, the cgroup limit, TANDEM_MEMORY_LIMIT, with
 * what the host's ranks hold added back, each assumed to hold what this
 * process does); fails only on a malformed TANDEM_MEMORY_LIMIT. Local. */
td_status td_mem_room_get(int local_ranks, td_mem_room *out);
/* This process's resident bytes (VmRSS) and, when peak_out, its peak
 * (VmHWM); 0 where /proc does not tell. */
size_t td_mem_rss(size_t *peak_out);
/* This process's share of physical memory (Pss): pages shared with other
 * processes (the peers' host-shared arenas the shm collectives read, the
 * libraries) count by their share, so the host's ranks add up to what
 * they use. What the RSS watch compares with the limit. */
size_t td_mem_pss(void);

/* ---- the trainer ---- */
struct td_trainer {
  td_train_config cfg; /* resolved */
  td_model *model;
  td_dataset *dataset;
  td_comm *comm; /* NULL: world of one */
  int rank, world;
  int threads;

  size_t n_params;
  float *params;  /* (n_params) */
  float *grads;   /* (n_params) */
  bool grads_shared; /* grads came from td_mem_alloc (host-shared) */
  int n_states;   /* optimizer state arenas */
  float *states[2];
  /* The model's device (td_model.device) and its ops (core/devops.h): with
   * devops non-NULL, params, grads and states above are device arenas
   * (td_device_alloc), whole on every rank but the states at ZeRO stages
   * 1-3, which are the shard (zero/device.c), and at stage 3 params (and
   * model_params) too, and
   * dev_scratch is devops->scratch_floats of device memory. A shard-sized
   * arena is addressed like a whole one: params is then the address its
   * element 0 would have (dev_params_mem - shard_lo), so that params + i is
   * element i for i in the shard, as everywhere else; dev_params_mem and
   * dev_copy_mem hold what td_device_alloc returned (the same addresses as
   * params and model_params below stage 3), which is what is freed. */
  td_device device;
  const train_devops *devops;
  float *dev_scratch;
  void *dev_params_mem, *dev_copy_mem;
  struct zero_devfetch *dev_fetch; /* stage 3 on a device: the parameter fetches (zero/device.c) */
  /* bf16 mixed precision on a device (llm.c's and DeepSpeed's arrangement):
   * the model computes on model_params, a bf16 copy of the f32 masters in
   * params that the optimizer rewrites in its pass, and writes model_grads,
   * bf16 too, which the buckets reduce in bf16 and the norm and AdamW read;
   * grads is then NULL. Otherwise both are NULL and the model computes on
   * params and grads (f32). model_dtype is the element type the model
   * computes on. */
  td_dtype model_dtype;
  void *model_params, *model_grads;
  double *dev_norm_parts; /* ZeRO stages 1-2 on a device: the ranks' shard sums of squares (world) */
  int dev_buckets;        /* stage 2 on a device: buckets launched this step */

  long step;         /* optimizer steps done */
  uint64_t consumed; /* sampler stream positions consumed (step x G unless G changed) */
  td_sampler sampler;

  /* micro-batch buffers */
  unsigned char *inputs; /* (micro, input_bytes) */
  int32_t *targets;      /* (micro, targets_per_sample) */
  int prepared_batch;
  /* a model that runs a step's micro-batches together (run_micro_batches, a
   * pipeline stage): all of them, (grad_accum, micro, ...) */
  unsigned char *step_inputs;
  int32_t *step_targets;
  int step_inputs_accum; /* grad_accum they are sized for */

  /* bucketed gradient reduction of the current last micro-step */
  size_t *tensor_ready;   /* floats reported ready per tensor */
  int frontier_tensor;    /* lowest tensor index such that tensors [i, n) are all ready */
  size_t launched_lo;     /* arena offset below which nothing has been launched yet */
  size_t next_bucket;     /* floats the next bucket must reach before launch */
  td_request **requests;
  int n_requests, cap_requests;
  size_t comm_bytes;
  td_status bucket_status; /* first failure from a launch inside the ready callback */
  int32_t *agree_flags;     /* (world): td_trainer_agree's status table */

  /* Model parallelism (td_trainer_set_grid; NULL otherwise): the grid the
   * model is split over saves and loads checkpoints together, in the
   * unsplit model's coordinates (src/train/checkpoint/checkpoint.c). */
  const td_grid *grid;
  td_shard_map *shard_map;
  int32_t *grid_agree_flags; /* (grid's world) */

  /* Test hook (TANDEM_CKPT_FAULT_AT / TANDEM_CKPT_FAULT_RANK, read at
   * creation): die at this file operation of each save on that rank. */
  long ckpt_fault_at;
  int ckpt_fault_rank;

  /* mixed precision (src/train/precision/precision.c) */
  td_loss_scaler scaler;
  uint16_t *grads_half; /* communication_data_type bf16/fp16: the gradients on the wire (n_params), else NULL */
  long inject_inf_step; /* test hook TANDEM_FP16_INJECT_INF: step whose gradients get an inf here (-1: none) */

  td_train_trace_fn trace; /* optional phase tracing */
  void *trace_ctx;

  /* ---- ZeRO (src/train/zero/) ----
   * Every arena is sharded alike: this rank owns the arena elements
   * [shard_lo, shard_hi) = td_shard_range(n_params, world, rank), at every
   * stage (stage 0 included). What the rank holds:
   *   params:    n_params floats (arena element i at params[i]) at every
   *              stage; valid between steps on [params_lo, params_hi): the
   *              whole arena at stages 0-2, only the shard at stage 3 (the
   *              rest is address space whose pages were given back).
   *   grads:     n_params floats; after a step at stage >= 2 only the shard
   *              holds the averaged gradient.
   *   states[i]: (states_hi - states_lo) floats, states[i][k] being arena
   *              element states_lo + k: the whole arena at stage 0, the
   *              shard at stage >= 1.
   * Checkpoints read and write these ranges. */
  int zero_stage;
  size_t shard_lo, shard_hi;
  size_t states_lo, states_hi;
  size_t params_lo, params_hi;
  struct zero_state *zero; /* stage >= 1: buckets, fetches, memory (zero/zero.h) */
  struct td_elastic *elastic; /* td_trainer_elastic_register: where rebind re-registers the shards */
  struct offload_state *offload; /* stage 3 with NVMe offload: files, buffers, I/O (offload/offload.h) */
  struct det_state *det;     /* deterministic reduction on: units, exchange buffers (deterministic/deterministic.h) */

  /* memory at the edge (memory_fit.c) */
  td_mem_room mem_room; /* measured at creation */
  size_t mem_baseline;  /* RSS before the arenas: the largest of the ranks (least_room), so all fit alike */
  size_t mem_estimate;  /* what the estimate says this rank holds at most (baseline included) */
  size_t mem_peer_mapped; /* the peers' pages its RSS counts too: host-shared arenas (zero_peer_mapped_bytes), the model's groups' shm staging (comm_staging_shared) */
  int mem_warned;       /* the RSS warning level reached: 0 none, 1 past 90%, 2 past 97% */
  size_t mem_pss;       /* the last Pss read, and when (td_now): trainer_memory_watch reads it every step while */
  double mem_pss_at;    /* the RSS nears the limit, else after mem_pss_gap seconds */
  double mem_pss_gap;   /* 1000x the CPU the last read took, kept within 1-60 s (it walks the page tables) */
  bool offload_tile_chosen; /* sub_group_size was unset and chosen from the memory */
};

/* Agree on success across ranks: every rank passes its local status; returns
 * TD_OK only if all were OK. On a remote failure the local message says which
 * ranks failed; a rank's own failure keeps its message. Collective. */
td_status td_trainer_agree(td_trainer *t, td_status local);
/* The same over any group: `flags` (world int32) is scratch allocated by
 * the caller beforehand (an allocation failure here would leave this rank
 * out of the collective its peers wait in). */
td_status td_agree_over(td_comm *comm, int rank, int world, int32_t *flags, td_status local);
/* The arrays forward and backward take: the bf16 copies on a device in
 * mixed precision, else the f32 arenas (core/devops.c). */
const void *td_trainer_model_params(const td_trainer *t);
void *td_trainer_model_grads(const td_trainer *t);
/* After the f32 master params changed outside the optimizer (initialized,
 * broadcast, loaded from a checkpoint): rewrite the model's bf16 copy from
 * them; nothing without one (core/devops.c). */
td_status td_trainer_device_params_changed(td_trainer *t);

/* frontier.c: the frontier of final gradients during a backward (uses
 * t->tensor_ready and t->frontier_tensor). begin: nothing final yet;
 * credit: backward reported [offset, offset + count) final (the
 * td_grad_ready_fn arguments); both return the arena offset from which up
 * every gradient is final (n_params: none yet). */
void td_frontier_begin(td_trainer *t);
size_t td_frontier_credit(td_trainer *t, size_t offset, size_t count);
size_t td_frontier_offset(const td_trainer *t);

#endif
