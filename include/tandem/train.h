/* Tandem public API: the training engine (src/train).
 *
 * A td_trainer trains one td_model on one td_dataset with data parallelism
 * over a td_comm, the way PyTorch DDP or Horovod do: every rank holds the
 * whole model; parameters live in one 64-byte-aligned arena, gradients in a
 * second arena of the same layout and each optimizer state in one more
 * (llm.c's layout). Parameters are initialized from the seed and broadcast
 * from rank 0. One optimizer step runs `grad_accum` micro-steps of
 * `micro_batch` samples per rank; on the last micro-step, gradients are
 * averaged across ranks in buckets launched while backward still runs
 * (reverse arena order, first bucket small); then the engine clips, applies
 * the learning-rate schedule and the optimizer.
 *
 * Determinism: with global batch G = world x micro_batch x grad_accum, step t
 * uses the same G samples of a seeded, per-epoch shuffle whatever the world
 * size, each rank a disjoint slice. N ranks therefore compute the same update
 * as one rank with the whole batch (equal up to float summation order), and a
 * resumed run repeats an uninterrupted one bit for bit on the same world size.
 *
 * Threading: a trainer is used from one thread. Functions marked
 * "collective" must be called by every rank of the communicator in the same
 * order (they communicate); the others are local.
 *
 * Errors: functions return a td_status; the message is in td_last_error()
 * (and, for communication failures, td_comm_last_error()). The library never
 * prints to stdout: progress display is the caller's job (src/obs). */
#ifndef TANDEM_TRAIN_H
#define TANDEM_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "base.h"
#include "comm.h"
#include "device.h"
#include "elastic.h"
#include "nn.h"
#include "parallel.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- configuration ---- */

typedef enum td_optimizer_kind {
  TD_OPTIMIZER_SGD = 0,   /* SGD with (optionally Nesterov) momentum, L2 weight decay added to the gradient */
  TD_OPTIMIZER_ADAMW = 1, /* Adam with bias correction and decoupled weight decay (Loshchilov & Hutter) */
} td_optimizer_kind;

typedef enum td_schedule_kind {
  TD_SCHEDULE_CONSTANT = 0,      /* lr throughout */
  TD_SCHEDULE_WARMUP = 1,        /* linear warmup from lr*warmup_start_ratio to lr, then constant (DeepSpeed WarmupLR) */
  TD_SCHEDULE_WARMUP_COSINE = 2, /* linear warmup, then cosine decay to lr*min_ratio at total_steps (WarmupCosineLR) */
  TD_SCHEDULE_WARMUP_LINEAR = 3, /* linear warmup, then linear decay to lr*min_ratio at total_steps (WarmupDecayLR) */
} td_schedule_kind;

typedef struct td_optimizer_config {
  td_optimizer_kind kind;
  float lr;           /* peak learning rate */
  float beta1, beta2; /* AdamW moment decay rates */
  float eps;          /* AdamW denominator epsilon */
  float weight_decay; /* AdamW: decoupled (p -= lr*wd*p); SGD: added to the gradient (g += wd*p) */
  float momentum;     /* SGD momentum (0: plain SGD) */
  int nesterov;       /* SGD: 1 for Nesterov momentum */
} td_optimizer_config;

typedef struct td_schedule_config {
  td_schedule_kind kind;
  long warmup_steps;        /* steps of linear warmup (0: none) */
  long total_steps;         /* where the decay ends (0: the trainer's `steps`) */
  float warmup_start_ratio; /* lr at step 0 of warmup, as a fraction of the peak lr */
  float min_ratio;          /* lr at the end of the decay, as a fraction of the peak lr */
} td_schedule_config;

/* DeepSpeed's "elasticity" block (src/train/elastic/elastic_config.c;
 * docs/elastic.md). When enabled, the global batch is DeepSpeed's
 * choice: the batch size up to max_train_batch_size that a micro-batch of
 * micro_batch_sizes splits over the most world sizes in [min_gpus,
 * max_gpus], and the program trains elastically. */
typedef struct td_elasticity_config {
  int enabled;
  long max_train_batch_size;
  int micro_batch_sizes[16];
  int n_micro_batch_sizes;
  int min_gpus, max_gpus;   /* default 1 and 10000 (DeepSpeed's) */
  int prefer_larger_batch;  /* default 1 */
  int ignore_non_elastic_batch_info;
} td_elasticity_config;

/* Mixed precision (src/train/precision/; ds_config's "bf16", "fp16" and
 * "communication_data_type"). The master weights and the optimizer stay
 * f32; the linear layers' products round their operands to `compute` and
 * accumulate in f32 (td_nn_set_compute_dtype); layer norm, softmax,
 * attention, the loss and the optimizer are f32. fp16 scales the loss
 * (dynamic unless loss_scale > 0): a step whose gradients hold an inf or NaN
 * on any rank is skipped on every rank, and the scale shrinks (DeepSpeed's
 * DynamicLossScaler). */
typedef struct td_precision_config {
  td_dtype compute;        /* TD_F32 (default), TD_BF16 ("bf16": {"enabled": true}) or TD_F16 ("fp16") */
  td_dtype comm_dtype;     /* gradients on the wire: TD_F32 (default) or TD_BF16 / TD_F16 (summed in f32) */
  float loss_scale;        /* fp16: a fixed scale, or 0 for dynamic scaling (default) */
  int initial_scale_power; /* fp16 dynamic: the first scale is 2^this (default 16) */
  int loss_scale_window;   /* fp16 dynamic: clean steps before the scale doubles (default 1000) */
  int hysteresis;          /* fp16 dynamic: overflows in a row before the scale halves (default 2) */
  float min_loss_scale;    /* fp16 dynamic: the scale never goes below this (default 1) */
} td_precision_config;

/* Batch sizes: any of train_batch_size, micro_batch and grad_accum may be left
 * 0 ("derive it"); td_train_config_resolve fills them in from the world size
 * (as DeepSpeed does) and refuses inconsistent combinations. Zero-initializing
 * and calling td_train_config_defaults() is the way to start; new fields are
 * only ever appended, and get their defaults there. */
/* ZeRO-Infinity offload (DeepSpeed's zero_optimization.offload_optimizer,
 * offload_param, sub_group_size and the aio block; src/train/offload/).
 * device NONE keeps the state in RAM; CPU means the same on this CPU-only
 * build (the state already lives in host memory); NVME puts it in files
 * under nvme_path (one directory per job and rank, removed at exit):
 *   optimizer: the moments (and, with param NVME too, the f32 master
 *     weights, which are the parameters themselves in Tandem) are streamed
 *     through buffer_count buffers of sub_group_size elements per step;
 *   param: the rank's stage-3 parameter shard, read per layer ahead of use.
 * Stage 3 only. */
typedef enum { TD_OFFLOAD_NONE = 0, TD_OFFLOAD_CPU = 1, TD_OFFLOAD_NVME = 2 } td_offload_device;
typedef struct td_offload_config {
  td_offload_device optimizer_device;
  char optimizer_nvme_path[256];
  int optimizer_buffer_count; /* tile buffers of the optimizer step (default 4; 3+ overlaps read, update, write) */
  int pin_memory;             /* accepted (DeepSpeed's page-locked buffers; no device here to pin for) */
  td_offload_device param_device;
  char param_nvme_path[256];
  int param_buffer_count;     /* with param_buffer_size: parameters kept fetched at most (count x size) */
  long param_buffer_size;     /* parameters per buffer (default 1e8): also the largest range fetched ahead */
  long param_max_in_cpu;      /* parameters kept fetched at most (default 1e9) */
  long sub_group_size;        /* optimizer tile in elements (default 1e9, DeepSpeed's) */
  size_t aio_block_size;      /* bytes per I/O submission (default 1 MiB) */
  int aio_queue_depth;        /* submissions in flight (default 8) */
  int aio_thread_count;       /* threads of the pread/pwrite fallback (default 1) */
} td_offload_config;

typedef struct td_train_config {
  long train_batch_size; /* global batch G in samples per optimizer step (0: micro x accum x world) */
  int micro_batch;       /* samples per rank per micro-step (0: derive; 1 if nothing else is given) */
  int grad_accum;        /* micro-steps per optimizer step (0: derive; 1 if nothing else is given) */
  long steps;            /* optimizer steps to train (0: decided by the caller, e.g. from epochs) */
  uint64_t seed;         /* parameter initialization and data shuffling */
  td_optimizer_config optimizer;
  td_schedule_config scheduler;
  float grad_clip;           /* clip the global L2 norm of the averaged gradient to this (0: no clipping) */
  size_t bucket_bytes;       /* gradient bucket size (default 25 MiB) */
  size_t first_bucket_bytes; /* size of the first bucket launched, so communication starts early (default 1 MiB) */
  int threads;               /* compute threads per rank (0: online cores on this host / ranks on this host) */
  int steps_per_print;       /* for the caller's progress display (the engine does not print) */
  char checkpoint_dir[512];  /* where td_trainer_step saves every checkpoint_every steps ("" : never) */
  long checkpoint_every;     /* steps between automatic checkpoints (0: never) */
  int keep_last;             /* after each successful save, keep only this many newest checkpoints in the
                              * directory, always including the one `latest` names (0: keep all) */
  td_precision_config precision; /* bf16 / fp16 mixed precision (default f32) */
  int activation_checkpointing;  /* 1: models keep only each block's input and recompute the rest in backward */
  /* ZeRO (DeepSpeed's zero_optimization; docs/zero.md). Each rank owns the
   * element range td_shard_range(n_params, world, rank) of every arena.
   * 0: every rank holds everything (default); 1: optimizer state only for
   * the shard; 2: also gradients (reduced into their owner's shard during
   * backward); 3: also parameters (fetched per layer, released after). */
  int zero_stage;
  long stage3_prefetch_bucket_size;        /* parameters fetched ahead of use (default 5e7) */
  long stage3_max_live_parameters;         /* fetched parameters kept resident (cached) at most (1e9) */
  long stage3_param_persistence_threshold; /* fetch groups this small stay resident for the whole step (1e5) */
  td_elasticity_config elasticity;         /* "elasticity" (off by default) */
  td_offload_config offload;               /* ZeRO-Infinity NVMe offload (stage 3; docs/zero.md) */
  /* Deterministic reduction (docs/elastic.md, "Deterministic reduction"): every float
   * sum of a step in one order fixed by the global batch, so that any world
   * size computes the 1-rank bits. -1: on under elastic training, off
   * otherwise (default); 0: off (refused under elastic training); 1: on. */
  int deterministic_reduction;
  long deterministic_unit; /* samples per unit of the canonical sum (0: the default, docs/config.md) */
  /* td_trainer_resume refuses a checkpoint saved with another global batch
   * (train_batch_size), naming both: the schedule, the data order and the
   * loss scale of the saved run assume its batch. 1: load it anyway
   * (checkpoint.allow_batch_size_change; default 0). */
  int allow_batch_size_change;
  /* Where the model trains: "cpu", "cuda" or "cuda:N" (config key "device";
   * "": TANDEM_DEVICE, else "cpu"). td_train_device_select turns it into a
   * td_device for this rank. */
  char device[16];
  /* Tensor parallelism (Megatron-LM's tensor_model_parallel_size; docs/
   * training.md): ranks that split every layer of one model replica (0 or 1:
   * none). The trainer itself does not split anything: the program builds
   * the grid and the tensor-parallel model (include/tandem/parallel.h) and
   * gives the trainer the data-parallel communicator, so `world_size` in
   * td_train_config_resolve is the data-parallel size. Resolve refuses the
   * combinations not built yet (ZeRO-2/3, offload, elastic, a device, bf16/
   * fp16, activation checkpointing), naming each. */
  int tensor_parallel;
  /* Pipeline parallelism (Megatron-LM's pipeline_model_parallel_size,
   * DeepSpeed's "pipeline" section; docs/training.md): stages that each
   * hold consecutive layers of one model replica (0 or 1: none), and how
   * they run. As with tensor parallelism, the program builds the grid and
   * the pipeline model (td_gpt_pipeline_create) and gives the trainer the
   * data-parallel communicator; grad_accum is the pipeline's micro-batches
   * per step. Resolve refuses what is not built with it (ZeRO-2/3, offload,
   * elastic, a device, fp16, checkpoints, tensor parallelism at once). */
  int pipeline_parallel;
  char pipeline_schedule[16];  /* "1f1b" ("" : the default) or "interleaved" */
  int pipeline_chunks;         /* model chunks per stage (virtual_pipeline_model_parallel_size; 0: 1, or 2 interleaved) */
  char pipeline_partition[16]; /* "uniform" ("" : the default) or "parameters" (DeepSpeed's partition_method) */
  /* Megatron-LM's sequence parallelism inside each tensor group (config key
   * sequence_parallel; needs tensor_parallel > 1): td_gpt_tp_set_sequence_parallel. */
  int sequence_parallel;
  /* The memory knobs the user set (TD_KNOB_* bits; the config parser and
   * train-gpt's flags set them). A knob whose bit is clear keeps
   * DeepSpeed's default when the job fits; when it would not fit the
   * memory available to its ranks, td_trainer_create lowers it (docs/zero.md,
   * "Defaults that fit"). A knob whose bit is set is kept, and a job it
   * does not fit is refused. (sub_group_size: 0 is unset.) */
  unsigned knobs_set;
} td_train_config;

enum {
  TD_KNOB_BUCKET_BYTES = 1 << 0,     /* bucket_bytes */
  TD_KNOB_STAGE3_MAX_LIVE = 1 << 1,  /* stage3_max_live_parameters */
  TD_KNOB_STAGE3_PREFETCH = 1 << 2,  /* stage3_prefetch_bucket_size */
  TD_KNOB_PARAM_BUFFERS = 1 << 3,    /* offload_param buffer_count, buffer_size or max_in_cpu */
};

/* The device this rank trains on, from spec ("cpu", "cuda", "cuda:N"; NULL
 * or "": TANDEM_DEVICE, else "cpu"). "cuda" without an index picks
 * cuda:(local_rank % visible GPUs), so that a host's ranks spread over its
 * GPUs and share them when there are more ranks than GPUs (two ranks on one
 * GPU is the staged-collective case). The device is opened (made current on
 * this thread); a bad spelling, a build without CUDA, no GPU or an index
 * beyond the visible GPUs fail with the device layer's message, naming
 * where the spec came from. */
td_status td_train_device_select(const char *spec, int local_rank, td_device *out);

/* DeepSpeed's elastic batch choice (v0.1, deepspeed.elasticity): the
 * largest-compatibility global batch for cfg's micro_batch_sizes,
 * max_train_batch_size and [min_gpus, max_gpus]; the world sizes it splits
 * over go into valid (up to max_valid entries, ascending; *n_valid their
 * number). Pure. */
td_status td_elasticity_batch(const td_elasticity_config *e, long *batch_out, int *valid, int max_valid,
                              int *n_valid);

/* Defaults: AdamW lr 3e-4, betas (0.9, 0.999), eps 1e-8, weight decay 0;
 * constant schedule; no clipping; seed 1337; buckets 25 MiB (first 1 MiB);
 * threads 0 (auto); steps_per_print 10; batch sizes 0 (derived); ZeRO
 * stage 0 with DeepSpeed's stage-3 defaults. */
void td_train_config_defaults(td_train_config *cfg);

/* Read a JSON config file (DeepSpeed ds_config key names where the concept is
 * the same) into cfg, overwriting only the keys present, so that a caller can
 * apply defaults first and command-line flags afterwards. Keys:
 *   train_batch_size, train_micro_batch_size_per_gpu (or the alias
 *   train_micro_batch_size_per_rank), gradient_accumulation_steps,
 *   train_steps, seed, gradient_clipping, steps_per_print,
 *   threads_per_rank, bucket_bytes, first_bucket_bytes (numbers of bytes or
 *   strings such as "25M"),
 *   optimizer: {type: "AdamW"|"Adam"|"SGD", params: {lr, betas: [b1, b2], eps,
 *               weight_decay, momentum, nesterov}},
 *   scheduler: {type: "WarmupLR"|"WarmupCosineLR"|"WarmupDecayLR"|"Constant",
 *               params: {warmup_num_steps, total_num_steps, warmup_min_lr,
 *                        warmup_max_lr, warmup_min_ratio, cos_min_ratio}},
 *   checkpoint: {save_dir, save_every, keep_last, allow_batch_size_change},
 *   zero_optimization: {stage: 0-3, stage3_prefetch_bucket_size,
 *               stage3_max_live_parameters, stage3_param_persistence_threshold
 *               (DeepSpeed's other keys of the section are accepted, unused)};
 *   fp16, bf16 {enabled: false} are accepted (so that existing ds_config
 *   files load) and refused when switched on.
 * ("Adam" means AdamW, as DeepSpeed's default adam_w_mode does.) Unknown keys,
 * wrong types and out-of-range values are TD_ERR_INVALID_ARGUMENT with a
 * message naming the file, the key path and what to write instead ("unknown
 * key \"optimiser\"; did you mean \"optimizer\"?"). A missing or unreadable
 * file is TD_ERR_IO. Without cJSON (libcjson-dev) at build time it returns
 * TD_ERR_INVALID_USAGE saying so. Local, not collective. */
td_status td_train_config_load_json(const char *path, td_train_config *cfg);
/* The same from a string in memory; `source` names it in messages. */
td_status td_train_config_parse_json(const char *text, const char *source, td_train_config *cfg);
/* The same from `len` bytes at `data`, which need not be NUL-terminated (a
 * NUL byte inside is an error). No file I/O: the fuzzing entry point. */
td_status td_train_config_parse_json_buffer(const char *data, size_t len, const char *source, td_train_config *cfg);

/* Fill in derived batch sizes for `world_size` ranks and check the whole
 * config: G must equal micro x accum x world ("train_batch_size 64 != 8
 * (micro) x 2 (accum) x 2 (ranks) = 32: set train_batch_size to 32 or leave
 * it out"), rates and sizes must be in range. Updates cfg in place; returns
 * TD_ERR_INVALID_ARGUMENT with such a message. td_trainer_create calls it on
 * its own copy; callers may call it earlier to report errors before any
 * model is built. world_size counts data-parallel ranks (the world divided
 * by tensor_parallel). Local. */
td_status td_train_config_resolve(td_train_config *cfg, int world_size);

/* Learning rate of the schedule at optimizer step `step` (0-based: the lr
 * used by the first step is td_train_lr_at(cfg, 0)). Warmup rises linearly
 * from lr*(start + (1-start)/W) at step 0 to the peak lr at step W-1 (no step
 * wasted at a zero rate); the decay then runs from step W to total_steps.
 * `total_steps` 0 in the schedule falls back to cfg->steps. Pure. */
float td_train_lr_at(const td_train_config *cfg, long step);

/* ---- the trainer ---- */

typedef struct td_trainer td_trainer;

/* Statistics of one optimizer step, identical on every rank unless noted. */
typedef struct td_step_stats {
  long step;          /* optimizer steps done, including this one (1 after the first) */
  double loss;        /* mean loss over the global batch (per token for the GPT, per image for the CNN) */
  double lr;          /* learning rate used by this step */
  double grad_norm;   /* global L2 norm of the averaged gradient, before clipping */
  int clipped;        /* 1 if the gradient was scaled down by gradient clipping */
  long samples;       /* samples in this step, all ranks together (= train_batch_size) */
  long tokens;        /* predictions in this step, all ranks (samples x targets per sample) */
  double epoch;       /* epochs completed after this step (fractional: samples seen / dataset size) */
  double step_s;      /* wall time of the step on this rank */
  double compute_s;   /* this rank: time in data loading, forward, backward and optimizer */
  double comm_wait_s; /* this rank: time blocked waiting for gradient buckets and the loss reduction */
  double data_s;      /* this rank: time copying samples into the micro-batch (part of compute_s) */
  double optimizer_s; /* this rank: gradient norm, clipping and the update (part of compute_s) */
  double io_s;        /* this rank: writing the checkpoint this step saved (not part of step_s; 0 if none) */
  double fetch_wait_s; /* this rank, ZeRO stage 3: blocked waiting for parameter fetches (part of compute_s) */
  long param_fetches;   /* this rank, ZeRO stage 3 with more than one rank: parameter ranges broadcast this step */
  long param_prefetches; /* of those, launched ahead of the model's fetch (stage3_prefetch_bucket_size) */
  int n_buckets;      /* gradient buckets reduced in this step */
  size_t comm_bytes;  /* bytes of gradient this rank reduced in this step */
  int saved;          /* 1 if td_trainer_step wrote a checkpoint after this step */
  int skipped;        /* 1 if fp16 gradients overflowed on some rank and every rank skipped the update */
  double loss_scale;  /* fp16: the loss scale after this step (1 otherwise) */
  size_t memory_bytes;       /* this rank's share of physical memory after the step (Pss: pages shared with the
                              * host's other ranks count by their share) */
  size_t memory_limit_bytes; /* the memory available to this rank (0: unknown or TANDEM_MEMORY_LIMIT=off) */
  int memory_warning;        /* 1: memory_bytes is past 90% of memory_limit_bytes, 2: past 97% (also in the log) */
} td_step_stats;

/* Create a trainer. Collective over comm (stages 0-2 broadcast the
 * parameters from rank 0; at ZeRO stage 3 each rank initializes only its
 * own shard, in place, td_model_init_params_range); comm may be NULL for a
 * world of one. The trainer borrows model, dataset
 * and comm (the caller keeps ownership and destroys them after the trainer);
 * cfg is copied and resolved (td_train_config_resolve). Prepares the model
 * for micro_batch, allocates the arenas, initializes the parameters from
 * cfg->seed (td_model_init_params), sets the compute threads, and starts at
 * step 0 / sample 0. The dataset's input_bytes and targets_per_sample must
 * equal the model's. *out is NULL on failure. */
td_status td_trainer_create(const td_train_config *cfg, td_model *model, td_dataset *dataset, td_comm *comm,
                            td_trainer **out);
void td_trainer_destroy(td_trainer *trainer); /* accepts NULL; does not communicate */

/* One optimizer step: grad_accum micro-steps of forward + backward, the
 * bucketed gradient averaging overlapped with the last backward, clipping,
 * schedule and optimizer update. If cfg.checkpoint_dir and checkpoint_every
 * are set and the step count is a multiple of checkpoint_every, also saves a
 * checkpoint (stats->saved = 1). Collective. stats may be NULL.
 *
 * A local failure on any rank (the model's prepare fails, the dataset's get
 * returns an error, the forward returns a NaN loss) fails the step on EVERY
 * rank: the ranks agree on it in the loss reduction, before any gradient is
 * exchanged, and every rank returns the failing rank's status with a message
 * naming that rank, the step, micro-step and sample, and its reason ("rank 3
 * failed (I/O error): step 2, micro-step 0: the dataset could not deliver
 * sample 90: ..."). Parameters, optimizer state, the step count and the
 * sampler position are then unchanged and nothing is saved; the trainer
 * stays usable (the step may be retried). On a communication error the
 * trainer is unusable (destroy it). */
td_status td_trainer_step(td_trainer *trainer, td_step_stats *stats);

/* Mean loss and accuracy of the current parameters over `dataset` (or its
 * first max_samples samples if max_samples > 0), each rank evaluating a
 * disjoint share, combined with an allreduce. accuracy is the fraction of
 * predictions equal to their target, or -1 if the model has no predict.
 * Does not change parameters or training position. Collective. */
td_status td_trainer_evaluate(td_trainer *trainer, td_dataset *dataset, size_t max_samples, double *loss_out,
                              double *accuracy_out);

/* Save a checkpoint of the current state into root_dir/step-N (N = steps
 * done; step-N.1, step-N.2, ... if step-N exists) and point root_dir/latest
 * at it. Every rank writes its shard of the parameters and optimizer state
 * (td_shard_range over the arenas); rank 0 writes the manifest (format
 * version, world size, step, model kind, shape (td_model.config), size and
 * tensor table, seed and sampler position, config essentials, each shard's
 * size and CRC-32). Crash safety: everything goes into a fresh temporary
 * directory, is fsync'd, renamed to an unused name, and `latest` is replaced
 * atomically; older copies of the step and what cfg.keep_last prunes are
 * removed only after that. Whatever instant the process dies, `latest`
 * names a complete checkpoint. root_dir must be one directory every rank
 * sees (a shared file system across hosts): every rank checks that it sees
 * the directory rank 0 created, and the save fails on every rank, naming the
 * rank, if one does not. Collective. */
td_status td_trainer_save(td_trainer *trainer, const char *root_dir);

/* Load a checkpoint: `path` is a root dir (its `latest` is followed) or one
 * step-N directory. Checks the manifest (format, model kind, parameter count
 * and tensor table, optimizer kind) and every shard's size and CRC-32; a
 * truncated or corrupt checkpoint is refused with TD_ERR_IO naming the file
 * and what is wrong; one of another model shape (td_model.config: "heads: 2
 * in the checkpoint, 4 in this run") or optimizer with
 * TD_ERR_INVALID_ARGUMENT; the trainer is then left unchanged. The world size may
 * differ from the one that saved (shards are reassembled). Continues exactly:
 * the next td_trainer_step takes the same samples and gives the same loss as
 * the uninterrupted run. Collective (every rank reads; a failure on any rank
 * fails on all). */
td_status td_trainer_resume(td_trainer *trainer, const char *path);

/* What a checkpoint is, from its manifest alone (`path` as for
 * td_trainer_resume): the step it was taken after, the global batch it was
 * trained with (0: not recorded) and the world size that saved it. An
 * elastic job restarted from disk takes its global batch from here, whatever
 * world size it restarts at. TD_ERR_IO when there is no readable
 * checkpoint at `path`. Local (no communication). */
typedef struct td_checkpoint_info {
  long step;
  long train_batch_size;
  int world;
} td_checkpoint_info;
td_status td_checkpoint_info_read(const char *path, td_checkpoint_info *out);

/* The grid a model-parallel model (td_gpt_tp_create) is split over, for
 * checkpoints: td_trainer_save and td_trainer_resume then run over the
 * grid's whole world, and each rank writes and reads its shard in the
 * unsplit model's coordinates (td_shard_map), so that a save under any
 * layout (tensor-parallel size, data-parallel size, ZeRO stage) loads under
 * any other, and `tandem-ckpt consolidate` gives the unsplit model's
 * tensors. The trainer must have been created on td_grid_comm(grid,
 * TD_GRID_DATA); it borrows the grid (destroy the trainer first). Without
 * it a trainer of a tensor-parallel config refuses to save or resume.
 * Local (no communication); call it on every rank. */
td_status td_trainer_set_grid(td_trainer *trainer, const td_grid *grid);

/* Optional tracing of the engine's own phases, for a timeline (src/obs):
 * fn(ctx, name, begin_s, end_s) is called on the training thread after each
 * phase with monotonic times (the clock of td_now() in src/base). Names:
 * "data" (filling a micro-batch), "comm_wait" (blocked on gradient buckets
 * and the loss), "optimizer" (norm, clip and update), "checkpoint". Forward
 * and backward are the model's and can be traced by wrapping its ops.
 * fn NULL turns tracing off. Local. */
typedef void (*td_train_trace_fn)(void *ctx, const char *name, double begin_s, double end_s);
void td_trainer_set_trace(td_trainer *trainer, td_train_trace_fn fn, void *ctx);

/* ---- ZeRO ---- */

/* Bytes per rank of each part of the training state at one ZeRO stage,
 * computed before anything is allocated (DeepSpeed's
 * estimate_zero3_model_states_mem_needs_all_live). For the rank with the
 * largest shard (rank 0): ceil(n_params / world) parameters.
 *   params, grads, optimizer: the arenas (4 bytes per parameter each; the
 *     optimizer holds 1 (SGD) or 2 (AdamW) states), whole or sharded;
 *   live: buffers beyond the shards: stage 2+ gradients of the buckets in
 *     flight (at most 3 buckets plus the largest tensor), stage 3 fetched
 *     parameters kept resident (stage3_max_live_parameters, at least the
 *     largest fetch group, estimated as the largest name-prefix group of the
 *     tensor table, plus the groups under
 *     stage3_param_persistence_threshold), plus one page per tensor and
 *     rank for the pages straddling released pieces;
 *   deterministic: deterministic reduction's whole-model gradient vectors
 *     and exchange buffers (deterministic_reduction 1, or -1 with
 *     "elasticity" enabled; 0 otherwise);
 *   replicas: under elastic training ("elasticity" enabled) the memory of
 *     the copies kept for recovery (td_elastic_copy_bytes): their files
 *     are written in place at stage 0 (0 here); at stages 1-3 the staging
 *     chunk the buddy replicas move through; 0 otherwise;
 *   replica_disk: under elastic training the bytes of the commit files
 *     (td_elastic_copy_disk_bytes): at stage 0 the last two commits of the
 *     whole parameters and optimizer state; at stages 1-3 the last two
 *     commits of this rank's shards of them and of one ward's (uneven
 *     hosts can give a rank several wards: more);
 *   model_states: params + grads + optimizer + live + deterministic +
 *     replicas (what the trainer's td_trainer_model_state_bytes measures);
 *   activations: the model's activation and scratch memory for micro_batch
 *     (0 if the model does not say).
 * cfg must be resolved for `world` (td_train_config_resolve). Local, pure. */
typedef struct td_memory_estimate {
  int stage, world;
  size_t n_params, shard_params;
  size_t params, grads, optimizer, live, model_states, activations;
  size_t deterministic, replicas, replica_disk;
  /* NVMe offload (cfg->offload; stage 3): params and optimizer above count
   * only what stays in RAM; disk is the bytes of this rank's files under
   * nvme_path, offload_buffers the RAM of the optimizer's tile buffers
   * (counted in model_states). 0 without offload. */
  size_t disk, offload_buffers;
  /* What td_trainer_gather_params adds at stage 3 (the rest of the
   * parameter arena on every rank; 0 below stage 3): not part of the steps,
   * so not in model_states, but a run that gathers (train-gpt's sample)
   * needs it on top. */
  size_t gather;
  /* What the process adds during the steps beyond the arenas and
   * activations (compute scratch, communicator and I/O buffers): an
   * allowance for the threads and the model's products, plus comm_staging
   * below. A rank's peak RSS is bounded by model_states + activations +
   * runtime + what the process held before the trainer (+ the peers' pages
   * below, on shm). */
  size_t runtime;
  /* The model's communicators' staging pages (td_model_ops's
   * comm_staging_bytes; 0 over TCP and for a model that does not
   * communicate): comm_staging this rank's own, counted in runtime;
   * comm_staging_shared the peers' pages its RSS counts too (physically
   * theirs: not in runtime; the trainer's memory line adds it, as it adds
   * the peers' arena pages). */
  size_t comm_staging, comm_staging_shared;
} td_memory_estimate;
/* For a model on a device (td_model.device not the CPU) the figures are the
 * device's memory, what the trainer checks against the device at creation:
 * params (the f32 masters, the shard's at stage 3, and with bf16 the
 * model's bf16 copy), grads (whole, in the compute type), optimizer (the
 * AdamW moments, the shard's at stages 1-3), live (stage 3's two fetch
 * buffers of the largest parameter group), activations at cfg's
 * micro-batch, runtime (the CUDA libraries' workspace); the host-side
 * fields (deterministic, replicas, disk, gather) are 0 but comm_staging and
 * comm_staging_shared: host memory there (the tensor group's staged device
 * collectives: their host buffers and shm pages), not in runtime. */
td_status td_trainer_estimate_memory(const td_model *model, const td_train_config *cfg, int world, int stage,
                                     td_memory_estimate *out);

/* NVMe offload counters of this rank since the trainer was created (all
 * zero without offload). engine: "io_uring" or "threads"; direct: the files
 * are read and written with O_DIRECT (false: the file system refused it).
 * io_busy_s: time with at least one read or write outstanding (bandwidth =
 * bytes / io_busy_s); io_wait_s: the training thread blocked on I/O. The
 * optimizer step (opt_s) splits into the update kernel (opt_compute_s) and
 * waits for tile reads and writes; param_wait_s: fetches blocked on
 * parameter reads. disk_bytes: this rank's files. Local. */
typedef struct td_offload_stats {
  char engine[16];
  int direct;
  uint64_t bytes_read, bytes_written, direct_bytes;
  double io_busy_s, io_wait_s;
  double opt_s, opt_compute_s, opt_read_wait_s, opt_write_wait_s, param_wait_s;
  size_t disk_bytes;
  size_t tile;         /* floats per optimizer tile (sub_group_size as set or chosen) */
  size_t buffer_bytes; /* RAM the offload holds for the trainer's life: the tile buffers */
} td_offload_stats;
td_status td_trainer_offload_stats(const td_trainer *trainer, td_offload_stats *out);

/* Model-state bytes this rank holds, measured: the resident pages (mincore)
 * of the parameter and gradient arenas, of the optimizer state (offloaded:
 * its RAM tile buffers) and of deterministic reduction's buffers, plus the
 * elastic state's copies (td_elastic_copy_bytes) once registered; at stages
 * 1-3 the highest such count during the first two steps (or now, if
 * more). Local. */
size_t td_trainer_model_state_bytes(const td_trainer *trainer);

/* This rank's memory (issue 23): what the trainer compared at creation and
 * what the process holds now. estimate_bytes = the estimate of this
 * configuration (model states + activations, td_trainer_estimate_memory)
 * + baseline_bytes, the process's RSS before the arenas; limit_bytes = the
 * memory available to this rank (the least of MemAvailable, the cgroup
 * limit and TANDEM_MEMORY_LIMIT, divided among the host's ranks; 0:
 * unknown or TANDEM_MEMORY_LIMIT=off), limit_source says which; rss_bytes
 * and peak_rss_bytes: VmRSS and VmHWM now. Over the shm transport's
 * direct collectives a rank's RSS also counts the pages of its peers'
 * host-shared arenas that it reads and writes (RssShmem), physically the
 * peers' (once per host): estimate_bytes includes them, as the RSS counts
 * them, and shared_bytes says how much of it they are. The fit against
 * limit_bytes is of physical memory: estimate_bytes - shared_bytes
 * (docs/zero.md, "Memory at the edge"). Local. */
typedef struct td_trainer_memory_info {
  size_t estimate_bytes, baseline_bytes, limit_bytes, rss_bytes, peak_rss_bytes;
  size_t shared_bytes;
  char limit_source[400];
} td_trainer_memory_info;
td_status td_trainer_memory(const td_trainer *trainer, td_trainer_memory_info *out);
/* What td_trainer_create(cfg, model, ..., comm) would decide about memory,
 * without allocating the arenas: *fitted gets cfg resolved with the knobs
 * left unset chosen for the memory available (docs/zero.md, "Defaults that
 * fit"; fitted may be NULL), out the estimate per rank (with what this
 * process holds now) and that memory. Under cfg->elasticity.enabled it
 * plans the elastic trainer instead (td_trainer_create_unbound, then bound
 * at each epoch with its shards restored: no initial broadcast of the
 * parameters, and no knob lowered when the world is above one rank, as
 * that trainer has no communicator to agree on them at creation). Returns
 * TD_ERR_INVALID_USAGE with
 * td_trainer_create's refusal when the job would not fit. For planning
 * (train-gpt --estimate-memory's fit= line, bench/zperf-search.sh
 * --offload). Collective over comm (NULL: one rank). */
td_status td_trainer_fit_memory(const td_train_config *cfg, td_model *model, td_comm *comm, td_train_config *fitted,
                                td_trainer_memory_info *out);
int td_trainer_zero_stage(const td_trainer *trainer);
/* At ZeRO stage 3, gather the whole parameter arena so that
 * td_trainer_params() is complete (4 bytes per parameter, until the next
 * step); a no-op at stages 0-2. Collective. */
td_status td_trainer_gather_params(td_trainer *trainer);

/* ---- accessors (local) ---- */
long td_trainer_step_count(const td_trainer *trainer);        /* optimizer steps done */
long td_trainer_steps_per_epoch(const td_trainer *trainer);   /* dataset size / global batch, at least 1 */
const td_train_config *td_trainer_config(const td_trainer *trainer); /* the resolved config */
td_model *td_trainer_model(const td_trainer *trainer);
/* The parameter arena (model->n_params floats), identical on every rank
 * between steps (at ZeRO stage 3 only after td_trainer_gather_params);
 * valid until the trainer is destroyed. Rank 0 uses it to
 * generate text (td_gpt_generate) or to evaluate. When the model computes
 * on a device (td_model.device), this, td_trainer_grads and
 * td_trainer_params_mut are device pointers: read them with td_device_copy. */
const float *td_trainer_params(const td_trainer *trainer);
/* The averaged gradient of the last step (n_params floats, multiplied by the
 * fp16 loss scale the step used; 1 otherwise), until the next step begins; or
 * NULL where no rank holds it whole (ZeRO stage 2 and 3 shard it; stage 1
 * and NVMe offload do not promise it either). Local. For monitoring. */
const float *td_trainer_grads(const td_trainer *trainer);
float *td_trainer_params_mut(td_trainer *trainer); /* for tests and custom initialization before the first step */
size_t td_trainer_n_params(const td_trainer *trainer);
int td_trainer_threads(const td_trainer *trainer); /* compute threads this rank uses */

/* ---- the trainer under elastic training (tandem/elastic.h) ---- */

/* Register a trainer's whole state with e: parameters, optimizer state, the
 * step count, the sampler position and the global batch. At stage 0 that is
 * everything a step depends on. At ZeRO stages 1-3 the optimizer state (and
 * at stage 3 the parameters) are registered as shards
 * (td_elastic_register_shard), and td_trainer_elastic_rebind re-shards
 * them. Local. */
td_status td_trainer_elastic_register(td_trainer *t, td_elastic *e);

/* A trainer for rank `rank` of `world` with no communicator yet, for
 * elastic training: like td_trainer_create with comm NULL (local, nothing
 * communicates; cfg is resolved for `world`), but its ZeRO shards are cut
 * for that rank and world from the start, so that a process never holds the
 * whole model state it would give back at the first rebind (at stage 3 it
 * initializes only its parameter shard). It must be moved onto a
 * communicator with td_trainer_elastic_rebind before its first step.
 * Refused with NVMe offload. */
td_status td_trainer_create_unbound(const td_train_config *cfg, td_model *model, td_dataset *dataset, int world,
                                    int rank, td_trainer **out);

/* Move a trainer onto `comm` (NULL: a world of one), keeping its global
 * batch (td_elastic_batch_split with micro_hint and max_world), resizing
 * per-rank buffers. Call it from the reset callback. The trainer must have
 * been created with comm NULL (creation is then local, so a joining
 * process can create its trainer while the others train). At ZeRO stage >=
 * 1 the shards are cut anew for the new world and registered again with
 * the elastic state given to td_trainer_elastic_register (their contents
 * are then restored by td_elastic_run). Local. */
td_status td_trainer_elastic_rebind(td_trainer *t, td_comm *comm, int micro_hint, int max_world);

#ifdef __cplusplus
}
#endif
#endif
