/* The data-parallel trainer: arenas, the step (micro-steps, bucketed
 * gradient averaging overlapped with the last backward, clipping, schedule,
 * optimizer), evaluation and accessors. Checkpoints are in checkpoint/.
 *
 * Gradient buckets. Backward reports tensors whose gradients are final
 * (td_grad_ready_fn), in roughly reverse arena order. The engine keeps a
 * "frontier": the lowest tensor index i such that tensors [i, n) are all
 * final. The range between the frontier and the lowest offset already
 * launched is the pending bucket; once it holds first_bucket_bytes (then
 * bucket_bytes) it is averaged in place with td_iallreduce while backward
 * goes on. Because the arena is contiguous, a bucket is a flat range and needs
 * no packing copy. A tensor reported out of order (a tied embedding whose
 * gradient is final only at the very end) just holds the frontier back.
 *
 *        arena:  [ t0 | t1 | t2 | t3 | t4 | t5 ]
 *        ready:                 ^^^^^^^^^^^^^^   frontier = offset(t3)
 *        launched:                   [t4  t5]    launched_lo = offset(t4)
 *        pending bucket:        [t3]             launched when big enough
 *
 * Losses. Each micro-step's forward returns the mean loss of its micro-batch;
 * all micro-batches have the same size, so the global-batch mean is the mean
 * of the micro means, averaged over ranks. Backward runs with loss_scale =
 * 1/grad_accum and buckets average (TD_AVG) over ranks, so the gradient is
 * that of the global-batch mean. */
#include "train/core/core.h"
#include "train/zero/zero.h"
#include "train/offload/offload.h"
#include "train/deterministic/deterministic.h"
#include "train/precision/precision.h"
#include "train/memory_fit.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

td_status td_trainer_checkpoint_if_due(td_trainer *t, int *saved);

/* A zeroed arena on transparent huge pages where the system offers them
 * (THP "madvise": the hint must come before the first touch). The optimizer
 * streams all arenas every step; with 4 KiB pages that is a TLB miss per
 * 1024 floats of each of the 4 streams. Freed with td_free. */
static void *arena_alloc(size_t bytes) {
  void *p = td_alloc(bytes);
  if (!p) return NULL;
#ifdef MADV_HUGEPAGE
  const uintptr_t huge = (uintptr_t)2 << 20;
  uintptr_t lo = ((uintptr_t)p + huge - 1) & ~(huge - 1), hi = ((uintptr_t)p + bytes) & ~(huge - 1);
  if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
#endif
  memset(p, 0, bytes);
  return p;
}

/* The gradient arena, which the buckets allreduce in place. With ranks
 * sharing this host over the shm transport it is host-shared memory
 * (td_mem_alloc), so that each rank reduces its share of every rank's
 * gradients directly instead of staging them through the segment (2-3x
 * faster for large buckets). Plain memory when that is not possible. */
static float *grads_alloc(td_trainer *t, size_t bytes) {
  if (t->comm && t->world > 1 && td_comm_local_size(t->comm) > 1 && !strcmp(td_comm_transport(t->comm), "shm")) {
    void *p = NULL;
    if (td_mem_alloc(bytes, &p) == TD_OK) {
      t->grads_shared = true;
      return p;
    }
    TD_DEBUG("rank %d: gradients in plain memory (%s)", t->rank, td_last_error());
  }
  return arena_alloc(bytes);
}

/* ---- a model on a device (core/devops.h) ----
 * What the trainer does on a device today: AdamW at ZeRO stages 0-3
 * (stages 1-3: zero/device.c; stage 3 with a model that fetches per layer,
 * as the GPT does), in fp32 or in bf16 mixed precision (f32 masters and
 * moments, the model on a bf16 copy, bf16 gradients reduced in bf16; see
 * core.h). What it does not do yet is refused here, naming what to change. */
static td_status device_refusals(const td_trainer *t) {
  char name[16];
  td_device_name(t->device, name, sizeof name);
  const char *what = NULL;
  if (t->cfg.offload.optimizer_device != TD_OFFLOAD_NONE || t->cfg.offload.param_device != TD_OFFLOAD_NONE)
    what = "offload (remove offload_optimizer / offload_param)";
  else if (t->cfg.elasticity.enabled) what = "elastic training (remove elasticity)";
  else if (t->cfg.deterministic_reduction == 1 && t->cfg.precision.compute != TD_F32)
    what = "deterministic reduction in bf16 (train in fp32, or remove deterministic_reduction)";
  else if (t->cfg.deterministic_reduction == 1 && t->zero_stage >= 3)
    what = "deterministic reduction at ZeRO stage 3 (use stage 0-2, or remove deterministic_reduction)";
  else if (t->cfg.optimizer.kind != TD_OPTIMIZER_ADAMW) what = "an optimizer other than AdamW (use \"AdamW\")";
  else if (t->cfg.precision.compute == TD_F16)
    what = "fp16 training (train in bf16 or fp32: bf16 needs no loss scaling)";
  else if (t->cfg.precision.comm_dtype == TD_F16 ||
           (t->cfg.precision.compute == TD_F32 && t->cfg.precision.comm_dtype != TD_F32))
    what = "a communication_data_type other than the compute type (the gradients are reduced in the model's own "
           "type: remove communication_data_type)";
  else if (t->cfg.precision.compute == TD_BF16 && !t->model->ops->set_device_dtype)
    what = "bf16 for this model (it computes in f32 only on a device: train in fp32)";
  if (!what) return TD_OK;
  return td_error(TD_ERR_INVALID_USAGE, "rank %d: training on %s does not support %s yet; or train on the CPU "
                  "(--device cpu)", t->rank, name, what);
}

/* A device arena of `held` elements of `es` bytes, whole or (stage 3) the
 * shard's, addressed like the whole arena (core.h): *mem is the allocation,
 * *base the address of element 0. */
static td_status device_arena(td_trainer *t, size_t held, size_t es, void **mem, void **base) {
  TD_CHECK(td_device_alloc(t->device, TD_MAX(held, (size_t)1) * es, mem));
  *base = (void *)((uintptr_t)*mem - (uintptr_t)(t->params_lo * es));
  return td_device_memset0(t->device, *mem, held * es); /* a model kind the initializer does not know */
}

static td_status device_arenas_alloc(td_trainer *t, size_t arena_bytes) {
  /* the masters: whole at stages 0-2, the shard at stage 3 (zero_layout) */
  const size_t held = t->params_hi - t->params_lo;
  void *base = NULL;
  TD_CHECK(device_arena(t, held, sizeof(float), &t->dev_params_mem, &base));
  t->params = base;
  if (t->cfg.precision.compute == TD_BF16) {
    /* the model computes on bf16 copies; the f32 gradient arena is not needed */
    TD_CHECK(t->model->ops->set_device_dtype(t->model, TD_BF16));
    t->model_dtype = TD_BF16;
    TD_CHECK(device_arena(t, held, sizeof(uint16_t), &t->dev_copy_mem, &t->model_params));
    TD_CHECK(td_device_alloc(t->device, t->n_params * sizeof(uint16_t), &t->model_grads));
    TD_CHECK(td_device_memset0(t->device, t->model_grads, t->n_params * sizeof(uint16_t)));
  } else {
    TD_CHECK(td_device_alloc(t->device, arena_bytes, (void **)&t->grads));
  }
  /* the whole arena at stage 0, the shard at stages 1-3 (zero_layout) */
  size_t states_bytes = TD_MAX(t->states_hi - t->states_lo, (size_t)1) * sizeof(float);
  for (int i = 0; i < t->n_states; i++) {
    TD_CHECK(td_device_alloc(t->device, states_bytes, (void **)&t->states[i]));
    TD_CHECK(td_device_memset0(t->device, t->states[i], states_bytes));
  }
  if (t->zero_stage >= 1 && !(t->dev_norm_parts = calloc((size_t)t->world, sizeof(double))))
    return td_error(TD_ERR_SYSTEM, "rank %d: out of memory for the norm's partial sums", t->rank);
  if (t->zero_stage >= 3) TD_CHECK(zero_device_fetch_create(t));
  return td_device_alloc(t->device, t->devops->scratch_floats * sizeof(float), (void **)&t->dev_scratch);
}

/* The masters a rank holds, [params_lo, params_hi): initialized on the host
 * (the same values as on a CPU; at stage 3 only the shard's, as there), then
 * copied in. */
static td_status device_init_params(td_trainer *t) {
  const size_t lo = t->params_lo, n = t->params_hi - t->params_lo;
  float *host = td_alloc(TD_MAX(n, (size_t)1) * sizeof(float));
  if (!host) return td_error(TD_ERR_SYSTEM, "rank %d: out of memory initializing %zu parameters on the host", t->rank,
                             n);
  memset(host, 0, n * sizeof(float));
  td_status st = TD_OK;
  if (lo == 0 && n == t->n_params)
    td_model_init_params(t->model, host, t->cfg.seed);
  else
    st = td_model_init_params_range(t->model, host, t->cfg.seed, lo, lo + n);
  if (st == TD_OK)
    st = td_device_copy(t->params + lo, t->device, host, (td_device){TD_DEVICE_CPU, 0}, n * sizeof(float));
  td_free(host);
  return st;
}

/* td_trainer_create, and td_trainer_create_unbound (comm NULL, world and
 * rank given: the arenas are cut for that world, and nothing communicates). */
static td_status trainer_create(const td_train_config *cfg_in, td_model *model, td_dataset *dataset, td_comm *comm,
                                int world, int rank, td_trainer **out) {
  if (out) *out = NULL;
  if (!cfg_in || !model || !dataset || !out)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_trainer_create: config, model, dataset and out are required");
  if (!model->ops || !model->ops->forward || !model->ops->backward || !model->ops->prepare)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_trainer_create: model \"%s\" has no prepare/forward/backward",
                    model->kind ? model->kind : "?");
  if (dataset->input_bytes != model->input_bytes || dataset->targets_per_sample != model->targets_per_sample)
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "td_trainer_create: dataset samples (%zu input bytes, %zu targets) do not fit model \"%s\" (%zu "
                    "input bytes, %zu targets): check the sequence length or the dataset",
                    dataset->input_bytes, dataset->targets_per_sample, model->kind, model->input_bytes,
                    model->targets_per_sample);
  if (model->n_params == 0) return td_error(TD_ERR_INVALID_ARGUMENT, "td_trainer_create: model has no parameters");

  td_trainer *t = calloc(1, sizeof *t);
  if (!t) return td_error(TD_ERR_SYSTEM, "out of memory for the trainer");
  td_status st = TD_OK;
  t->cfg = *cfg_in;
  t->model = model;
  t->dataset = dataset;
  t->comm = comm;
  t->rank = comm ? td_comm_rank(comm) : rank;
  t->world = comm ? td_comm_size(comm) : world;
  TD_CHECK_GOTO(td_train_config_resolve(&t->cfg, t->world), st, fail);
  t->ckpt_fault_at = td_env_long("TANDEM_CKPT_FAULT_AT", 0);
  t->ckpt_fault_rank = (int)td_env_long("TANDEM_CKPT_FAULT_RANK", 0);

  /* every process of the host shares its cores; an unbound (elastic)
   * trainer's host runs as many as the launcher gave it slots */
  t->threads = t->cfg.threads > 0 ? t->cfg.threads : td_auto_threads(td_host_ranks(comm));
  td_nn_set_threads(t->threads);

  t->n_params = model->n_params;
  t->n_states = td_optimizer_n_states(t->cfg.optimizer.kind);
  zero_layout(t);
  if (t->zero_stage >= 3 && !model->supports_param_access) {
    st = td_error(TD_ERR_INVALID_ARGUMENT, "ZeRO stage 3: model \"%s\" cannot fetch its parameters per layer "
                  "(td_param_access); use stage 2 or lower", model->kind ? model->kind : "?");
    goto fail;
  }
  if (t->zero_stage >= 2 && t->cfg.precision.comm_dtype != TD_F32) {
    /* stage 2 reduces straight into the owners' shards of the f32 arena; a
     * half-precision shadow of the buckets is not built for that path */
    st = td_error(TD_ERR_INVALID_ARGUMENT, "communication_data_type %s is not supported at ZeRO stage %d yet: "
                  "use \"fp32\" or stage 0-1", td_dtype_name(t->cfg.precision.comm_dtype), t->zero_stage);
    goto fail;
  }
  if (model->ops->run_micro_batches) {
    /* a pipeline stage: what composes with it so far */
    const char *what = NULL;
    /* (ZeRO-3: the stage models fetch each group through the pipeline's
     * td_param_access, checked above with supports_param_access) */
    if (t->cfg.deterministic_reduction == 1 || t->cfg.elasticity.enabled)
      what = "deterministic reduction and elastic training (remove deterministic_reduction and elasticity)";
    /* checkpoints: saved and loaded by the whole grid (td_trainer_set_grid; refused without it); on a
     * device the stages compute in f32 or bf16 (the pipeline's set_device_dtype; a tied GPT's in f32 only) */
    if (what) {
      st = td_error(TD_ERR_INVALID_USAGE, "rank %d: pipeline parallelism does not support %s yet", t->rank, what);
      goto fail;
    }
  }
  /* before any arena: a job that cannot fit is refused on every rank, here
   * (memory_fit.c), not ended by the kernel's OOM killer mid-run */
  t->agree_flags = calloc((size_t)t->world, sizeof *t->agree_flags);
  if (!t->agree_flags) {
    st = td_error(TD_ERR_SYSTEM, "out of memory for the trainer's tables");
    goto fail;
  }
  TD_CHECK_GOTO(trainer_memory_fit(t), st, fail);
  size_t arena_bytes = t->n_params * sizeof(float);
  t->model_dtype = TD_F32;
  t->device = model->device;
  TD_CHECK_GOTO(train_devops_for(t->device, &t->devops), st, fail);
  if (t->devops) {
    TD_CHECK_GOTO(device_refusals(t), st, fail);
    TD_CHECK_GOTO(device_arenas_alloc(t, arena_bytes), st, fail);
  } else if (t->zero_stage >= 1) {
    TD_CHECK_GOTO(zero_create(t), st, fail);
    /* stage 1 keeps whole gradients, averaged as at stage 0 (under
     * deterministic reduction zero_create reserved them) */
    if (t->zero_stage == 1 && !t->grads && !(t->grads = grads_alloc(t, arena_bytes))) {
      st = td_error(TD_ERR_SYSTEM, "rank %d: out of memory for the gradient arena (%zu parameters)", t->rank,
                    t->n_params);
      goto fail;
    }
  } else {
    t->params = arena_alloc(arena_bytes); /* zeros for a model kind td_model_init_params does not know */
    t->grads = grads_alloc(t, arena_bytes);
    for (int i = 0; i < t->n_states; i++) t->states[i] = arena_alloc(arena_bytes);
  }
  t->inputs = td_alloc((size_t)t->cfg.micro_batch * dataset->input_bytes);
  t->targets = td_alloc((size_t)t->cfg.micro_batch * dataset->targets_per_sample * sizeof(int32_t));
  t->tensor_ready = calloc((size_t)TD_MAX(model->n_tensors, 1), sizeof(size_t));
  t->cap_requests = model->n_tensors + 2 + t->world; /* a bucket's pieces per owner: buckets + world */
  t->requests = calloc((size_t)t->cap_requests, sizeof *t->requests);
  bool states_in_ram = t->cfg.offload.optimizer_device != TD_OFFLOAD_NVME || t->zero_stage < 3;
  if (!t->requests || !t->agree_flags || !t->params || !td_trainer_model_grads(t) ||
      (states_in_ram && (!t->states[0] || (t->n_states > 1 && !t->states[1]))) || !t->inputs ||
      !t->targets || !t->tensor_ready) {
    st = td_error(TD_ERR_SYSTEM, "out of memory for the training arenas (%zu parameters, %d optimizer states)",
                  t->n_params, t->n_states);
    goto fail;
  }
  if (t->cfg.offload.optimizer_device == TD_OFFLOAD_NVME || t->cfg.offload.param_device == TD_OFFLOAD_NVME) {
    /* files under nvme_path (offload/); every rank has checked its space
     * before any rank writes */
    st = td_trainer_agree(t, offload_create(t));
    if (st != TD_OK) goto fail;
  }
  TD_CHECK_GOTO(td_sampler_init(&t->sampler, dataset->n_samples, t->cfg.seed), st, fail);
  TD_CHECK_GOTO(det_trainer_init(t), st, fail); /* deterministic_reduction: the units' buffers */
  TD_CHECK_GOTO(td_precision_trainer_init(t), st, fail); /* before prepare: checkpointing sizes activations */
  st = model->ops->prepare(model, t->cfg.micro_batch);
  if (st != TD_OK) goto fail;
  t->prepared_batch = t->cfg.micro_batch;

  if (offload_params_on_disk(t)) {
    /* each rank writes its own shard's initial values to disk (offload/param_store.c) */
    st = td_trainer_agree(t, offload_params_init(t));
    if (st != TD_OK) goto fail;
  } else if (t->zero_stage >= 3) {
    /* Each rank initializes its own shard in place: the initializer is a
     * pure function of the seed (td_model_init_params_range gives the
     * values td_model_init_params would), so no rank ever holds the whole
     * arena and the start-up peak stays below the steady state's. */
    if (t->devops) {
      st = device_init_params(t);
      if (st == TD_OK) st = td_trainer_device_params_changed(t); /* the shard's bf16 copy, if any */
    } else {
      st = td_model_init_params_range(model, t->params + t->shard_lo, t->cfg.seed, t->shard_lo, t->shard_hi);
    }
    st = td_trainer_agree(t, st);
    if (st != TD_OK) goto fail;
  } else {
    if (t->devops) /* initialized on the host (the same values as on a CPU), then copied in */
      st = device_init_params(t);
    else
      td_model_init_params(model, t->params, t->cfg.seed);
    if (st != TD_OK) goto fail;
    /* Every rank could initialize identically from the seed, but
     * broadcasting from rank 0 also guards against any rank-dependent
     * initializer. */
    if (comm && t->world > 1) {
      st = td_broadcast(t->params, t->n_params, TD_F32, 0, comm);
      if (st != TD_OK) {
        td_error(st, "rank %d: broadcasting the initial parameters failed: %s", t->rank, td_comm_last_error(comm));
        goto fail;
      }
    }
    TD_CHECK_GOTO(td_trainer_device_params_changed(t), st, fail); /* the bf16 copy, if any */
  }
  *out = t;
  return TD_OK;
fail:
  td_trainer_destroy(t);
  return st;
}

td_status td_trainer_create(const td_train_config *cfg, td_model *model, td_dataset *dataset, td_comm *comm,
                            td_trainer **out) {
  return trainer_create(cfg, model, dataset, comm, 1, 0, out);
}

td_status td_trainer_create_unbound(const td_train_config *cfg, td_model *model, td_dataset *dataset, int world,
                                    int rank, td_trainer **out) {
  if (out) *out = NULL;
  if (world < 1 || rank < 0 || rank >= world)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_trainer_create_unbound: rank %d of world %d: need 0 <= rank < world",
                    rank, world);
  if (model && model->device.kind != TD_DEVICE_CPU)
    return td_error(TD_ERR_INVALID_USAGE, "td_trainer_create_unbound: elastic training on a device is not supported "
                                          "yet: train on the CPU (--device cpu)");
  if (cfg && (cfg->offload.optimizer_device == TD_OFFLOAD_NVME || cfg->offload.param_device == TD_OFFLOAD_NVME))
    return td_error(TD_ERR_INVALID_USAGE, "td_trainer_create_unbound: NVMe offload cuts its files for one world "
                                          "size at creation: create the trainer with its communicator");
  return trainer_create(cfg, model, dataset, NULL, world, rank, out);
}

void td_trainer_destroy(td_trainer *t) {
  if (!t) return;
  /* Requests can only be outstanding after a failed step; their buffers are
   * about to be freed, so wait for them (a broken communicator completes them
   * with an error). */
  for (int i = 0; i < t->n_requests; i++) td_wait(t->requests[i]);
  zero_destroy(t);
  offload_destroy(t); /* removes the offload files, also after a failure */
  free(t->requests);
  free(t->agree_flags);
  free(t->grid_agree_flags);
  td_shard_map_destroy(t->shard_map);
  if (t->devops) {
    zero_device_fetch_destroy(t);
    td_device_free(t->device, t->dev_params_mem);
    td_device_free(t->device, t->dev_copy_mem);
    td_device_free(t->device, t->grads);
    for (int i = 0; i < 2; i++) td_device_free(t->device, t->states[i]);
    td_device_free(t->device, t->dev_scratch);
    td_device_free(t->device, t->model_grads);
    free(t->dev_norm_parts);
    t->params = t->grads = t->states[0] = t->states[1] = NULL;
  }
  td_free(t->params);
  if (t->grads_shared)
    td_mem_free(t->grads);
  else
    td_free(t->grads);
  for (int i = 0; i < 2; i++) td_free(t->states[i]);
  td_free(t->inputs);
  td_free(t->step_inputs);
  td_free(t->step_targets);
  td_free(t->targets);
  free(t->tensor_ready);
  td_sampler_free(&t->sampler);
  td_precision_trainer_free(t);
  det_free(t);
  free(t);
}

/* ---- bucketed gradient reduction ---- */

/* The request array is sized at creation for the most buckets a step can
 * launch (one per tensor, plus the final one), so that a step never
 * allocates here: a failed allocation half-way through the buckets would
 * leave this rank short of collectives its peers wait for. */
static td_status push_request(td_trainer *t, td_request *req) {
  if (t->n_requests == t->cap_requests) {
    td_wait(req); /* keep it completable rather than leaking it */
    return td_error(TD_ERR_INTERNAL, "rank %d: more than %d gradient buckets in one step", t->rank, t->cap_requests);
  }
  t->requests[t->n_requests++] = req;
  return TD_OK;
}

static void bucket_launch(td_trainer *t, size_t lo, size_t hi) {
  if (t->zero && t->zero_stage >= 2) {
    zero_bucket_launch(t, lo, hi); /* reduced into the owners' shards */
    return;
  }
  if (hi <= lo || t->bucket_status != TD_OK) return;
  if (t->devops && t->zero_stage >= 2) { /* zero/device.c: pieces reduced to their owners */
    t->bucket_status = zero_device_bucket_launch(t, lo, hi);
    t->dev_buckets++;
    t->comm_bytes += (hi - lo) * td_dtype_size(t->model_dtype);
    t->next_bucket = t->cfg.bucket_bytes / sizeof(float);
    return;
  }
  td_request *req = NULL;
  td_dtype dtype;
  td_op op;
  void *buf = td_precision_bucket_buffer(t, lo, hi, &dtype, &op); /* the arena, or its half-precision shadow */
  td_status st = td_iallreduce(buf, buf, hi - lo, dtype, op, t->comm, &req);
  if (st != TD_OK) {
    t->bucket_status = td_error(st, "rank %d: launching a gradient bucket of %zu floats failed: %s", t->rank, hi - lo,
                                td_comm_last_error(t->comm));
    return;
  }
  t->bucket_status = push_request(t, req);
  t->comm_bytes += (hi - lo) * td_dtype_size(dtype);
  t->next_bucket = t->cfg.bucket_bytes / sizeof(float);
}

static void on_grad_ready(void *ctx, size_t offset, size_t count) {
  td_trainer *t = ctx;
  if (count == 0 || t->model->n_tensors == 0) return;
  size_t front = td_frontier_credit(t, offset, count);
  if (t->launched_lo > front && t->launched_lo - front >= t->next_bucket) {
    bucket_launch(t, front, t->launched_lo);
    t->launched_lo = front;
  }
}

void td_trainer_set_trace(td_trainer *t, td_train_trace_fn fn, void *ctx) {
  t->trace = fn;
  t->trace_ctx = ctx;
}

static void trace(const td_trainer *t, const char *name, double begin) {
  if (t->trace) t->trace(t->trace_ctx, name, begin, td_now());
}

static double wait_requests(td_trainer *t, td_status *st_out) {
  double t0 = td_now();
  if (t->zero && t->zero_stage >= 2) {
    *st_out = zero_wait_buckets(t);
    trace(t, "comm_wait", t0);
    return td_now() - t0;
  }
  td_status first = TD_OK;
  for (int i = 0; i < t->n_requests; i++) {
    td_status st = td_wait(t->requests[i]);
    if (st != TD_OK && first == TD_OK) first = st;
  }
  t->n_requests = 0;
  trace(t, "comm_wait", t0);
  if (first != TD_OK)
    td_error(first, "rank %d: averaging gradients failed: %s", t->rank, td_comm_last_error(t->comm));
  *st_out = first;
  return td_now() - t0;
}

/* Copy this rank's samples of one micro-step into the batch buffers. A
 * sample the dataset cannot deliver fails the micro-step with the rank, the
 * sample and the dataset's reason. */
static td_status load_micro_batch(td_trainer *t, int micro_step) {
  const td_dataset *ds = t->dataset;
  int b = t->cfg.micro_batch;
  uint64_t pos = td_sampler_position(t->consumed, t->world, t->rank, b, micro_step);
  size_t tps = ds->targets_per_sample;
  for (int k = 0; k < b; k++) {
    size_t index = td_sampler_index(&t->sampler, pos + (uint64_t)k);
    td_status st = ds->get(ds, index, t->inputs + (size_t)k * ds->input_bytes, t->targets + (size_t)k * tps);
    if (st != TD_OK) {
      char why[768]; /* td_error must not format its own buffer into itself */
      td_error_copy(why, sizeof why);
      return td_error(st, "rank %d: step %ld, micro-step %d: the dataset could not deliver sample %zu: %s", t->rank,
                      t->step + 1, micro_step, index, why[0] ? why : "no reason given");
    }
  }
  return TD_OK;
}

/* One forward; a NaN loss is a failed forward (nn.h: the model leaves the
 * reason in td_last_error(), which is cleared first so that a NaN without a
 * reason, a diverged model, is told apart from a stale message). */
static td_status forward_micro_batch(td_trainer *t, const char *where, int batch, double *loss_out) {
  td_error(TD_OK, "%s", "");
  float loss = t->model->ops->forward(t->model, td_trainer_model_params(t), t->inputs, t->targets, batch);
  if (isnan(loss)) {
    char why[768];
    td_error_copy(why, sizeof why);
    return td_error(TD_ERR_INVALID_ARGUMENT, "rank %d: %s: the %s model's forward failed: %s", t->rank, where,
                    t->model->kind ? t->model->kind : "?",
                    *why ? why : "the loss is NaN (diverged? lower the learning rate or clip gradients)");
  }
  *loss_out = loss;
  return TD_OK;
}

/* Backward's loss scale: the micro-steps' mean; ZeRO stages 2-3
 * accumulating into shards also divide by the world size here, since their
 * buckets are summed onto the shards (zero/reduce.c). */
static float backward_scale(const td_trainer *t) {
  double scale = t->scaler.scale / t->cfg.grad_accum;
  if (t->zero && t->zero->accum_sharded) scale /= t->world;
  return (float)scale;
}

/* Before a backward whose gradient buckets are reduced as they are final. */
static void begin_buckets(td_trainer *t) {
  td_frontier_begin(t);
  t->launched_lo = t->n_params;
  t->next_bucket = t->cfg.first_bucket_bytes / sizeof(float);
  t->bucket_status = TD_OK;
  t->n_requests = 0;
  t->dev_buckets = 0;
}

/* ZeRO stages 2-3 under gradient accumulation (zero->accum_sharded): a
 * micro-step before the last reduces its gradients into the owners' shards
 * (zero/reduce.c), then clears the rest. Every rank has agreed it computed
 * its forward. */
static td_status sharded_micro_backward(td_trainer *t, double *wait_s) {
  begin_buckets(t);
  t->model->ops->backward(t->model, td_trainer_model_params(t), td_trainer_model_grads(t), backward_scale(t),
                          on_grad_ready, t);
  bucket_launch(t, 0, t->launched_lo);
  t->launched_lo = 0;
  td_status wst;
  *wait_s += wait_requests(t, &wst);
  if (t->bucket_status != TD_OK) return t->bucket_status;
  if (wst != TD_OK) return wst;
  zero_micro_end(t);
  return TD_OK;
}

static td_status trainer_step(td_trainer *t, td_step_stats *stats);

/* The step runs with the thread's compute type set to the config's
 * (mixed precision: the linear layers' products in bf16/fp16). */
td_status td_trainer_step(td_trainer *t, td_step_stats *stats) {
  if (!t) return td_error(TD_ERR_INVALID_ARGUMENT, "td_trainer_step: null trainer");
  if (!t->comm && t->world > 1)
    return td_error(TD_ERR_INVALID_USAGE, "td_trainer_step: the trainer was created unbound for %d ranks: move it "
                                          "onto its communicator with td_trainer_elastic_rebind first", t->world);
  td_dtype saved = td_nn_compute_dtype();
  td_nn_set_compute_dtype(t->cfg.precision.compute);
  td_status st = trainer_step(t, stats);
  td_nn_set_compute_dtype(saved);
  return st;
}

static td_status step_finish(td_trainer *t, td_step_stats *stats, double loss, double t_start, double data_s,
                             double wait_s, int n_buckets);

/* A model that runs a step's micro-batches together (run_micro_batches: a
 * pipeline stage). Every micro-batch is loaded first (a pipeline's first
 * stage reads the tokens, its last the targets, both as the sampler gives
 * them to this data-parallel rank), then the model runs the step; its
 * gradients are averaged over the data-parallel ranks in buckets as they
 * become final, as after the plain path's last micro-step. A failure inside
 * the model has already failed its pipeline group (the model says so); it
 * is returned at once, without the data-parallel agreement, which the
 * failed stage's peers in other replicas then see as a lost rank. */
static td_status micro_batches_step(td_trainer *t, td_status local, double t_start, td_step_stats *stats) {
  const td_model *m = t->model;
  const int accum = t->cfg.grad_accum, b = t->cfg.micro_batch;
  const int distributed = t->comm && t->world > 1;
  const size_t in_bytes = (size_t)b * t->dataset->input_bytes, n_tgt = (size_t)b * t->dataset->targets_per_sample;
  double data_s = 0, wait_s = 0;
  if (local == TD_OK && t->step_inputs_accum != accum) {
    td_free(t->step_inputs);
    td_free(t->step_targets);
    t->step_inputs = td_alloc((size_t)accum * in_bytes);
    t->step_targets = td_alloc((size_t)accum * n_tgt * sizeof(int32_t));
    t->step_inputs_accum = t->step_inputs && t->step_targets ? accum : 0;
    if (!t->step_inputs_accum)
      local = td_error(TD_ERR_SYSTEM, "rank %d: out of memory for the step's %d micro-batches", t->rank, accum);
  }
  for (int micro = 0; micro < accum && local == TD_OK; micro++) {
    double d0 = td_now();
    local = load_micro_batch(t, micro);
    if (local == TD_OK) {
      memcpy(t->step_inputs + (size_t)micro * in_bytes, t->inputs, in_bytes);
      memcpy(t->step_targets + (size_t)micro * n_tgt, t->targets, n_tgt * sizeof(int32_t));
    }
    data_s += td_now() - d0;
    trace(t, "data", d0);
  }
  /* Stage 3: the step's forwards fetch parameters from the data-parallel
   * peers, so a rank whose data failed must not leave them waiting there:
   * agree first (a failed prepare agreed already, in trainer_step, on every
   * rank alike, and agrees here again on every rank alike) */
  if (t->zero_stage >= 3 && distributed) local = td_trainer_agree(t, local);
  int sync = distributed, n_buckets = 0;
  if (sync) begin_buckets(t);
  double loss = 0;
  if (local == TD_OK)
    local = m->ops->run_micro_batches(t->model, td_trainer_model_params(t), td_trainer_model_grads(t), t->step_inputs,
                                      t->step_targets, b, accum,
                                      backward_scale(t), sync ? on_grad_ready : NULL, sync ? t : NULL, &loss);
  if (local == TD_OK && t->zero && t->zero->status != TD_OK) local = t->zero->status; /* a failed fetch */
  if (local != TD_OK) return local;
  if (sync) {
    bucket_launch(t, 0, t->launched_lo);
    t->launched_lo = 0;
    n_buckets = t->n_requests;
    /* the loss, averaged over the data-parallel ranks (each replica's pipeline gave its own) */
    double w0 = td_now();
    td_status st = td_allreduce(&loss, &loss, 1, TD_F64, TD_AVG, t->comm);
    td_status wst;
    (void)wait_requests(t, &wst); /* traces "comm_wait" */
    wait_s += td_now() - w0;
    if (st != TD_OK)
      return td_error(st, "rank %d: averaging the step's loss failed: %s", t->rank, td_comm_last_error(t->comm));
    if (t->bucket_status != TD_OK) return t->bucket_status;
    if (wst != TD_OK) return wst;
    td_precision_after_sync(t);
  }
  return step_finish(t, stats, loss, t_start, data_s, wait_s, n_buckets);
}

static td_status trainer_step(td_trainer *t, td_step_stats *stats) {
  const td_model *m = t->model;
  const int accum = t->cfg.grad_accum;
  const int distributed = t->comm && t->world > 1;
  double t_start = td_now(), data_s = 0, wait_s = 0;
  td_status st = TD_OK;
  if (t->det) { /* deterministic reduction: units summed in one tree (deterministic/) */
    double loss = 0;
    TD_CHECK(det_forward_backward(t, &loss, &data_s, &wait_s));
    return step_finish(t, stats, loss, t_start, data_s, wait_s, distributed ? 1 : 0);
  }

  /* A rank that fails locally (prepare, data, forward) stops computing but
   * still takes part in the status agreement below, which comes before any
   * gradient bucket is launched: the failure is known to every rank while
   * no rank has started a collective the failed one would not join. */
  td_status local = TD_OK;
  if (t->prepared_batch != t->cfg.micro_batch) {
    local = m->ops->prepare(t->model, t->cfg.micro_batch);
    if (local != TD_OK) {
      char why[768];
      td_error_copy(why, sizeof why);
      local = td_error(local, "rank %d: step %ld: preparing the model for micro-batch %d failed: %s", t->rank,
                       t->step + 1, t->cfg.micro_batch, why);
    } else
      t->prepared_batch = t->cfg.micro_batch;
  }
  if (t->zero)
    zero_step_begin(t);
  else if (t->devops) {
    zero_device_fetch_reset(t); /* stage 3: the last step's parameters are stale */
    td_status zst =
        td_device_memset0(t->device, td_trainer_model_grads(t), t->n_params * td_dtype_size(t->model_dtype));
    if (local == TD_OK) local = zst; /* keep a failed prepare's reason */
  } else
    memset(t->grads, 0, t->n_params * sizeof(float));
  /* Stage 3 agrees before each forward (below); a rank whose prepare failed
   * skips the micro-steps, so it joins the first of those agreements here. */
  if (local != TD_OK && t->zero_stage >= 3 && distributed) local = td_trainer_agree(t, local);
  if (m->ops->run_micro_batches) return micro_batches_step(t, local, t_start, stats);
  double loss_sum = 0;
  t->comm_bytes = 0;
  int n_buckets = 0;
  for (int micro = 0; micro < accum && local == TD_OK; micro++) {
    double d0 = td_now();
    local = load_micro_batch(t, micro);
    data_s += td_now() - d0;
    trace(t, "data", d0);
    /* Stage 3's forward communicates (parameter fetches): a rank whose data
     * failed, or whose forward would refuse its inputs before fetching, must
     * not skip the fetches while the others wait, so agree first. */
    if (t->zero_stage >= 3 && distributed) {
      if (local == TD_OK && m->ops->check_inputs &&
          (local = m->ops->check_inputs(t->model, t->inputs, t->targets, t->cfg.micro_batch)) != TD_OK) {
        char why[768]; /* td_error must not format its own buffer into itself */
        td_error_copy(why, sizeof why);
        local = td_error(local, "rank %d: step %ld, micro-step %d: the %s model's forward refuses its inputs: %s",
                         t->rank, t->step + 1, micro, t->model->kind ? t->model->kind : "?", why);
      }
      local = td_trainer_agree(t, local);
    }
    double loss = 0;
    if (local == TD_OK) {
      char where[64];
      snprintf(where, sizeof where, "step %ld, micro-step %d", t->step + 1, micro);
      local = forward_micro_batch(t, where, t->cfg.micro_batch, &loss);
      if (local == TD_OK && t->zero && t->zero->status != TD_OK) local = t->zero->status;
      if (local == TD_OK && t->dev_fetch && t->dev_fetch->status != TD_OK) local = t->dev_fetch->status;
    }
    loss_sum += loss;
    /* The last micro-step's backward launches the buckets: it waits for the agreement. */
    if (micro < accum - 1 && t->zero && t->zero->accum_sharded) {
      local = td_trainer_agree(t, local); /* this one's buckets too */
      if (local == TD_OK) local = sharded_micro_backward(t, &wait_s);
    } else if (local == TD_OK && micro < accum - 1)
      m->ops->backward(t->model, td_trainer_model_params(t), td_trainer_model_grads(t), backward_scale(t), NULL, NULL);
  }
  double loss = loss_sum / accum;

  /* The agreement rides on the loss reduction, which every step needs
   * anyway: [mean loss, failed?] averaged over ranks, 16 bytes. A non-zero
   * second element means some rank failed; only then a second round
   * (td_trainer_agree) finds which and carries its reason to every rank. */
  if (distributed) {
    double w0 = td_now();
    double pair[2] = {local == TD_OK ? loss : 0.0, local == TD_OK ? 0.0 : 1.0};
    st = td_allreduce(pair, pair, 2, TD_F64, TD_AVG, t->comm);
    wait_s += td_now() - w0;
    trace(t, "comm_wait", w0);
    if (st != TD_OK)
      return td_error(st, "rank %d: agreeing on the step's loss and status failed: %s", t->rank,
                      td_comm_last_error(t->comm));
    if (pair[1] != 0.0) {
      td_status all = td_trainer_agree(t, local);
      /* Every rank must fail here; the reduction said one did. */
      return all != TD_OK ? all : td_error(TD_ERR_INTERNAL, "rank %d: the step status reduction and the agreement "
                                                              "disagree", t->rank);
    }
    loss = pair[0];
  } else if (local != TD_OK) {
    return local;
  }

  /* Backward of the last micro-step, with gradient buckets averaged over
   * ranks as soon as they are final. */
  int sync = distributed;
  if (sync) begin_buckets(t);
  m->ops->backward(t->model, td_trainer_model_params(t), td_trainer_model_grads(t), backward_scale(t),
                   sync ? on_grad_ready : NULL, sync ? t : NULL);
  if (sync) {
    /* Whatever backward did not report (or a tensor reported out of order)
     * goes in one last bucket. */
    bucket_launch(t, 0, t->launched_lo);
    t->launched_lo = 0;
    n_buckets = t->zero && t->zero_stage >= 2 ? t->zero->n_buckets
                : t->devops && t->zero_stage >= 2 ? t->dev_buckets
                                                  : t->n_requests;
    td_status wst;
    wait_s += wait_requests(t, &wst);
    /* The message is the launch failure's, or the wait's if that came later. */
    if (t->bucket_status != TD_OK) return t->bucket_status;
    if (wst != TD_OK) return wst;
    td_precision_after_sync(t);
  }
  return step_finish(t, stats, loss, t_start, data_s, wait_s, n_buckets);
}

/* After the gradients are reduced: overflow check, norm, clip, update,
 * checkpoint, statistics. */
static td_status step_finish(td_trainer *t, td_step_stats *stats, double loss, double t_start, double data_s,
                             double wait_s, int n_buckets) {
  const td_model *m = t->model;
  /* fp16: an inf or NaN in any rank's gradients skips the step everywhere */
  int overflow = 0;
  TD_CHECK(td_precision_check_overflow(t, &overflow));
  if (overflow) {
    td_precision_on_overflow(t);
    t->step++;
    t->consumed += (uint64_t)t->cfg.train_batch_size;
  }

  /* Every rank holds the same averaged gradient, so the norm, the clip and
   * the update agree without further communication. */
  double opt0 = td_now();
  if (t->zero && t->zero->status != TD_OK) return t->zero->status; /* a fetch in backward failed */
  if (t->dev_fetch && t->dev_fetch->status != TD_OK) return t->dev_fetch->status;
  double norm = 0;
  float scale = 1.0f, lr = td_train_lr_at(&t->cfg, t->step);
  if (!overflow) {
    /* the loss scale (fp16) divides out here, folded into the clip factor */
    double loss_scale = t->scaler.scale;
    /* from per-shard partial sums, at every stage; or in the canonical tree */
    if (t->det) {
      TD_CHECK(det_grad_norm(t, &norm)); /* the canonical tree, on the host (a device's: its host copy) */
    } else if (t->devops && t->zero_stage >= 1) {
      TD_CHECK(zero_device_grad_norm(t, &norm));
    } else if (t->devops) { /* every rank holds the whole averaged gradient (stage 0) */
      TD_CHECK(t->devops->sum_squares(t->device, t->dev_scratch, td_trainer_model_grads(t), t->model_dtype,
                                      t->n_params, &norm));
      /* a model split across ranks (a pipeline stage): the whole model's */
      if (t->model->ops->grad_norm_sq)
        TD_CHECK(t->model->ops->grad_norm_sq(t->model, td_trainer_model_grads(t), 0, t->n_params, &norm));
      norm = sqrt(norm);
    } else {
      TD_CHECK(zero_grad_norm(t, &norm)); /* a model split across ranks: the whole model's (zero/shard.c) */
    }
    if (t->model->ops->grad_norm_sq && t->det) { /* a shard of a model split across ranks: the whole model's norm */
      double sum_sq = norm * norm;
      TD_CHECK(t->model->ops->grad_norm_sq(t->model, t->grads, 0, t->n_params, &sum_sq));
      norm = sqrt(sum_sq);
    }
    norm /= loss_scale;
    scale = td_clip_scale(norm, t->cfg.grad_clip);
    const td_optimizer_config *o = &t->cfg.optimizer;
    float grad_scale = (float)(scale / loss_scale);
    /* skipped steps (fp16 overflow) do not count in Adam's bias correction */
    long adam_t = t->step + 1 - t->scaler.skipped;
    /* the fence: the last commit's copy of the shards (taken while this
     * step's forward and backward ran) must be complete before they change */
    if (t->elastic) TD_CHECK(td_elastic_commit_wait(t->elastic));
    if (t->zero)
      TD_CHECK(zero_update(t, lr, grad_scale, adam_t));
    else if (t->devops && t->zero_stage >= 1) /* AdamW only (device_refusals) */
      TD_CHECK(zero_device_update(t, lr, grad_scale, adam_t));
    else if (t->devops)
      TD_CHECK(t->devops->adamw(t->device, t->params, t->model_params, td_trainer_model_grads(t), t->model_dtype,
                                t->states[0], t->states[1], t->n_params, lr, o->beta1, o->beta2, o->eps,
                                o->weight_decay, adam_t, grad_scale));
    else if (o->kind == TD_OPTIMIZER_ADAMW)
      td_adamw_update(t->params, t->grads, t->states[0], t->states[1], t->n_params, lr, o->beta1, o->beta2, o->eps,
                      o->weight_decay, adam_t, grad_scale);
    else
      td_sgd_update(t->params, t->grads, t->states[0], t->n_params, lr, o->momentum, o->weight_decay, o->nesterov,
                    grad_scale);
    t->step++;
    t->consumed += (uint64_t)t->cfg.train_batch_size;
    td_precision_on_clean_step(t);
  }
  zero_step_end(t);
  trace(t, "optimizer", opt0);

  int saved = 0;
  double t_end = td_now(), step_s = t_end - t_start;
  TD_CHECK(td_trainer_checkpoint_if_due(t, &saved));
  if (stats) {
    memset(stats, 0, sizeof *stats);
    stats->step = t->step;
    stats->loss = loss;
    stats->lr = lr;
    stats->grad_norm = norm;
    stats->clipped = scale < 1.0f;
    stats->samples = t->cfg.train_batch_size;
    stats->tokens = t->cfg.train_batch_size * (long)m->targets_per_sample;
    stats->epoch = (double)t->consumed / (double)t->dataset->n_samples;
    stats->step_s = step_s;
    stats->comm_wait_s = wait_s;
    stats->compute_s = step_s - wait_s;
    stats->data_s = data_s;
    stats->optimizer_s = t_end - opt0;
    stats->io_s = saved ? td_now() - t_end : 0.0;
    stats->fetch_wait_s = t->zero ? t->zero->fetch_wait_s : t->dev_fetch ? t->dev_fetch->wait_s : 0.0;
    stats->param_fetches = t->zero ? t->zero->n_fetches : t->dev_fetch ? t->dev_fetch->n_fills : 0;
    stats->param_prefetches = t->zero ? t->zero->n_prefetches : t->dev_fetch ? t->dev_fetch->n_ahead : 0;
    stats->n_buckets = n_buckets;
    stats->comm_bytes = t->comm_bytes;
    stats->saved = saved;
    stats->skipped = overflow;
    stats->loss_scale = t->scaler.scale;
    trainer_memory_watch(t, stats);
  }
  return TD_OK;
}

td_status td_trainer_checkpoint_if_due(td_trainer *t, int *saved) {
  *saved = 0;
  if (!t->cfg.checkpoint_dir[0] || t->cfg.checkpoint_every <= 0 || t->step % t->cfg.checkpoint_every != 0)
    return TD_OK;
  double t0 = td_now();
  TD_CHECK(td_trainer_save(t, t->cfg.checkpoint_dir));
  trace(t, "checkpoint", t0);
  *saved = 1;
  return TD_OK;
}

/* ---- evaluation ---- */

static td_status trainer_evaluate(td_trainer *t, td_dataset *ds, size_t max_samples, double *loss_out,
                                  double *accuracy_out);

td_status td_trainer_evaluate(td_trainer *t, td_dataset *ds, size_t max_samples, double *loss_out,
                              double *accuracy_out) {
  if (!t || !ds) return td_error(TD_ERR_INVALID_ARGUMENT, "td_trainer_evaluate: null trainer or dataset");
  td_dtype saved = td_nn_compute_dtype();
  td_nn_set_compute_dtype(t->cfg.precision.compute);
  td_status st = trainer_evaluate(t, ds, max_samples, loss_out, accuracy_out);
  td_nn_set_compute_dtype(saved);
  return st;
}

static td_status trainer_evaluate(td_trainer *t, td_dataset *ds, size_t max_samples, double *loss_out,
                                  double *accuracy_out) {
  td_model *m = t->model;
  if (ds->input_bytes != m->input_bytes || ds->targets_per_sample != m->targets_per_sample)
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "td_trainer_evaluate: dataset samples (%zu input bytes, %zu targets) do not fit model \"%s\"",
                    ds->input_bytes, ds->targets_per_sample, m->kind);
  /* Stage 3: the ranks evaluate different numbers of batches, so the
   * per-layer fetches would not match; gather the whole arena once instead
   * (4 bytes per parameter for the duration). */
  const td_param_access *access = m->param_access;
  if (t->zero_stage >= 3 && t->devops)
    return td_error(TD_ERR_INVALID_USAGE, "rank %d: td_trainer_evaluate at ZeRO stage 3 on a device is not supported "
                    "yet (the ranks would evaluate different numbers of batches, each fetching parameters): evaluate "
                    "at stage 0-2", t->rank);
  if (t->zero_stage >= 3) {
    td_status gst = zero_fetch_all(t);
    if (gst != TD_OK) return gst;
    m->param_access = NULL;
  }
  size_t n = ds->n_samples;
  if (max_samples > 0 && max_samples < n) n = max_samples;
  size_t first, len;
  td_shard_range(n, t->world, t->rank, &first, &len);
  size_t tps = ds->targets_per_sample;
  int chunk = t->cfg.micro_batch;
  int32_t *pred = m->ops->predict ? malloc((size_t)chunk * tps * sizeof(int32_t)) : NULL;
  if (m->ops->predict && !pred) return td_error(TD_ERR_SYSTEM, "out of memory for evaluation predictions");
  /* sums[0]: loss x samples, sums[1]: correct predictions. */
  double sums[2] = {0, 0};
  td_status st = TD_OK;
  for (size_t i = 0; i < len; i += (size_t)chunk) {
    int bs = (int)TD_MIN((size_t)chunk, len - i);
    if (bs != t->prepared_batch) {
      st = m->ops->prepare(m, bs);
      if (st != TD_OK) break;
      t->prepared_batch = bs;
    }
    for (int k = 0; k < bs && st == TD_OK; k++) {
      size_t index = first + i + (size_t)k;
      st = ds->get(ds, index, t->inputs + (size_t)k * ds->input_bytes, t->targets + (size_t)k * tps);
      if (st != TD_OK) {
        char why[768];
        td_error_copy(why, sizeof why);
        st = td_error(st, "rank %d: evaluation: the dataset could not deliver sample %zu: %s", t->rank, index, why);
      }
    }
    if (st != TD_OK) break;
    double loss = 0;
    st = forward_micro_batch(t, "evaluation", bs, &loss);
    if (st != TD_OK) break;
    sums[0] += loss * bs;
    if (pred) {
      m->ops->predict(m, pred);
      for (size_t k = 0; k < (size_t)bs * tps; k++) sums[1] += pred[k] == t->targets[k];
    }
  }
  free(pred);
  if (t->zero_stage >= 3) {
    m->param_access = access;
    zero_fetch_reset(t);
  }
  st = td_trainer_agree(t, st);
  if (st != TD_OK) return st;
  if (t->comm && t->world > 1) {
    st = td_allreduce(sums, sums, 2, TD_F64, TD_SUM, t->comm);
    if (st != TD_OK)
      return td_error(st, "rank %d: combining evaluation results failed: %s", t->rank, td_comm_last_error(t->comm));
  }
  if (loss_out) *loss_out = n ? sums[0] / (double)n : 0;
  if (accuracy_out) *accuracy_out = m->ops->predict && n ? sums[1] / ((double)n * (double)tps) : -1;
  return TD_OK;
}

/* ---- accessors ---- */

long td_trainer_step_count(const td_trainer *t) { return t->step; }
long td_trainer_steps_per_epoch(const td_trainer *t) {
  long n = (long)(t->dataset->n_samples / (size_t)t->cfg.train_batch_size);
  return n > 0 ? n : 1;
}
const td_train_config *td_trainer_config(const td_trainer *t) { return &t->cfg; }
td_model *td_trainer_model(const td_trainer *t) { return t->model; }
const float *td_trainer_params(const td_trainer *t) { return t->params; }
float *td_trainer_params_mut(td_trainer *t) { return t->params; }
const float *td_trainer_grads(const td_trainer *t) {
  int offload = t->cfg.offload.optimizer_device == TD_OFFLOAD_NVME || t->cfg.offload.param_device == TD_OFFLOAD_NVME;
  return t->zero_stage == 0 && !offload && t->step > 0 ? t->grads : NULL;
}
size_t td_trainer_n_params(const td_trainer *t) { return t->n_params; }
int td_trainer_threads(const td_trainer *t) { return t->threads; }

/* ---- ZeRO ---- */

size_t td_trainer_model_state_bytes(const td_trainer *t) {
  if (t->devops) return zero_device_state_bytes(t); /* device memory, at every stage */
  size_t copies = t->elastic ? td_elastic_copy_bytes(t->elastic) : 0; /* the elastic state's, for recovery */
  return zero_model_state_bytes(t) + det_resident_bytes(t) + copies;
}

int td_trainer_zero_stage(const td_trainer *t) { return t->zero_stage; }

td_status td_trainer_gather_params(td_trainer *t) {
  if (!t) return td_error(TD_ERR_INVALID_ARGUMENT, "td_trainer_gather_params: null trainer");
  if (t->zero_stage < 3) return TD_OK;
  if (t->devops) /* the same answer on every rank */
    return td_error(TD_ERR_INVALID_USAGE, "rank %d: td_trainer_gather_params at ZeRO stage 3 on a device is not "
                    "supported yet (each rank holds its shard of the parameters only): train at stage 0-2 to read "
                    "the whole parameters", t->rank);
  TD_CHECK(trainer_gather_fits(t)); /* refused on every rank rather than killed by the kernel */
  return zero_fetch_all(t);
}
