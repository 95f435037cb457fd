/* The data-parallel trainer: arenas, the step (micro-steps, bucketed
 * gradient averaging overlapped with the last backward, clipping, schedule,
 * optimizer), evaluation and accessors. Checkpoints are in checkpoint.c.
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
#include "train/train_impl.h"

#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

td_status td_trainer_checkpoint_if_due(td_trainer *t, int *saved);

static int host_cores(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

td_status td_trainer_agree(td_trainer *t, td_status local) {
  if (!t->comm || t->world == 1) return local;
  /* Each rank reports its status in its own slot; a MAX-reduce tells every
   * rank which ranks failed (cheap: one small allreduce). */
  int32_t stack_flags[64];
  int32_t *flags = t->world <= 64 ? stack_flags : calloc((size_t)t->world, sizeof *flags);
  if (!flags) return td_error(TD_ERR_SYSTEM, "out of memory agreeing on a status");
  memset(flags, 0, sizeof(int32_t) * (size_t)t->world);
  flags[t->rank] = (int32_t)local;
  char saved[1024];
  td_error_copy(saved, sizeof saved);
  td_status st = td_allreduce(flags, flags, (size_t)t->world, TD_I32, TD_MAX, t->comm);
  if (st != TD_OK) {
    if (flags != stack_flags) free(flags);
    if (local != TD_OK) return td_error(local, "%s", saved);
    return td_error(st, "rank %d: %s", t->rank, td_comm_last_error(t->comm));
  }
  td_status result = local;
  if (local == TD_OK) {
    int first = -1, n_failed = 0;
    for (int r = 0; r < t->world; r++)
      if (flags[r] != TD_OK) {
        if (first < 0) first = r;
        n_failed++;
      }
    if (first >= 0)
      result = td_error((td_status)flags[first], "rank %d%s failed (%s); see %s log for the reason", first,
                        n_failed > 1 ? " and others" : "", td_status_str((td_status)flags[first]),
                        n_failed > 1 ? "their" : "its");
  } else {
    td_error(local, "%s", saved);
  }
  if (flags != stack_flags) free(flags);
  return result;
}

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

td_status td_trainer_create(const td_train_config *cfg_in, td_model *model, td_dataset *dataset, td_comm *comm,
                            td_trainer **out) {
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
  t->rank = comm ? td_comm_rank(comm) : 0;
  t->world = comm ? td_comm_size(comm) : 1;
  TD_CHECK_GOTO(td_train_config_resolve(&t->cfg, t->world), st, fail);

  int local_size = comm ? td_comm_local_size(comm) : 1;
  if (local_size < 1) local_size = 1;
  t->threads = t->cfg.threads > 0 ? t->cfg.threads : TD_MAX(1, host_cores() / local_size);
  td_nn_set_threads(t->threads);

  t->n_params = model->n_params;
  t->n_states = td_optimizer_n_states(t->cfg.optimizer.kind);
  size_t arena_bytes = t->n_params * sizeof(float);
  t->params = arena_alloc(arena_bytes); /* zeros for a model kind td_model_init_params does not know */
  t->grads = grads_alloc(t, arena_bytes);
  for (int i = 0; i < t->n_states; i++) t->states[i] = arena_alloc(arena_bytes);
  t->inputs = td_alloc((size_t)t->cfg.micro_batch * dataset->input_bytes);
  t->targets = td_alloc((size_t)t->cfg.micro_batch * dataset->targets_per_sample * sizeof(int32_t));
  t->tensor_ready = calloc((size_t)TD_MAX(model->n_tensors, 1), sizeof(size_t));
  if (!t->params || !t->grads || !t->states[0] || (t->n_states > 1 && !t->states[1]) || !t->inputs ||
      !t->targets || !t->tensor_ready) {
    st = td_error(TD_ERR_SYSTEM, "out of memory for the training arenas (%zu parameters, %d optimizer states)",
                  t->n_params, t->n_states);
    goto fail;
  }
  TD_CHECK_GOTO(td_sampler_init(&t->sampler, dataset->n_samples, t->cfg.seed), st, fail);
  st = model->ops->prepare(model, t->cfg.micro_batch);
  if (st != TD_OK) goto fail;
  t->prepared_batch = t->cfg.micro_batch;

  td_model_init_params(model, t->params, t->cfg.seed);
  /* Every rank could initialize identically from the seed, but broadcasting
   * from rank 0 also guards against any rank-dependent initializer. */
  if (comm && t->world > 1) {
    st = td_broadcast(t->params, t->n_params, TD_F32, 0, comm);
    if (st != TD_OK) {
      td_error(st, "rank %d: broadcasting the initial parameters failed: %s", t->rank, td_comm_last_error(comm));
      goto fail;
    }
  }
  *out = t;
  return TD_OK;
fail:
  td_trainer_destroy(t);
  return st;
}

void td_trainer_destroy(td_trainer *t) {
  if (!t) return;
  /* Requests can only be outstanding after a failed step; their buffers are
   * about to be freed, so wait for them (a broken communicator completes them
   * with an error). */
  for (int i = 0; i < t->n_requests; i++) td_wait(t->requests[i]);
  free(t->requests);
  td_free(t->params);
  if (t->grads_shared)
    td_mem_free(t->grads);
  else
    td_free(t->grads);
  for (int i = 0; i < 2; i++) td_free(t->states[i]);
  td_free(t->inputs);
  td_free(t->targets);
  free(t->tensor_ready);
  td_sampler_free(&t->sampler);
  free(t);
}

/* ---- bucketed gradient reduction ---- */

static td_status push_request(td_trainer *t, td_request *req) {
  if (t->n_requests == t->cap_requests) {
    int cap = t->cap_requests ? 2 * t->cap_requests : 16;
    td_request **grown = realloc(t->requests, (size_t)cap * sizeof *grown);
    if (!grown) {
      /* Keep the request completable rather than leaking it. */
      td_wait(req);
      return td_error(TD_ERR_SYSTEM, "out of memory for gradient bucket requests");
    }
    t->requests = grown;
    t->cap_requests = cap;
  }
  t->requests[t->n_requests++] = req;
  return TD_OK;
}

static void bucket_launch(td_trainer *t, size_t lo, size_t hi) {
  if (hi <= lo || t->bucket_status != TD_OK) return;
  td_request *req = NULL;
  td_status st = td_iallreduce(t->grads + lo, t->grads + lo, hi - lo, TD_F32, TD_AVG, t->comm, &req);
  if (st != TD_OK) {
    t->bucket_status = td_error(st, "rank %d: launching a gradient bucket of %zu floats failed: %s", t->rank, hi - lo,
                                td_comm_last_error(t->comm));
    return;
  }
  t->bucket_status = push_request(t, req);
  t->comm_bytes += (hi - lo) * sizeof(float);
  t->next_bucket = t->cfg.bucket_bytes / sizeof(float);
}

static size_t frontier_offset(const td_trainer *t) {
  const td_model *m = t->model;
  return t->frontier_tensor >= m->n_tensors ? t->n_params : m->tensors[t->frontier_tensor].offset;
}

static void on_grad_ready(void *ctx, size_t offset, size_t count) {
  td_trainer *t = ctx;
  const td_model *m = t->model;
  if (count == 0 || m->n_tensors == 0) return;
  /* Find the first tensor ending after `offset` (binary search), then credit
   * every tensor the range overlaps. */
  int lo = 0, hi = m->n_tensors;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (m->tensors[mid].offset + m->tensors[mid].count <= offset) lo = mid + 1;
    else hi = mid;
  }
  size_t end = offset + count;
  for (int i = lo; i < m->n_tensors && m->tensors[i].offset < end; i++) {
    size_t a = TD_MAX(offset, m->tensors[i].offset);
    size_t b = TD_MIN(end, m->tensors[i].offset + m->tensors[i].count);
    if (b > a) t->tensor_ready[i] += b - a;
  }
  while (t->frontier_tensor > 0 &&
         t->tensor_ready[t->frontier_tensor - 1] >= m->tensors[t->frontier_tensor - 1].count)
    t->frontier_tensor--;
  size_t front = frontier_offset(t);
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

static void load_micro_batch(td_trainer *t, int micro_step) {
  const td_dataset *ds = t->dataset;
  int b = t->cfg.micro_batch;
  uint64_t pos = td_sampler_position(t->consumed, t->world, t->rank, b, micro_step);
  size_t tps = ds->targets_per_sample;
  for (int k = 0; k < b; k++) {
    size_t index = td_sampler_index(&t->sampler, pos + (uint64_t)k);
    ds->get(ds, index, t->inputs + (size_t)k * ds->input_bytes, t->targets + (size_t)k * tps);
  }
}

td_status td_trainer_step(td_trainer *t, td_step_stats *stats) {
  if (!t) return td_error(TD_ERR_INVALID_ARGUMENT, "td_trainer_step: null trainer");
  if (t->prepared_batch != t->cfg.micro_batch) {
    TD_CHECK(t->model->ops->prepare(t->model, t->cfg.micro_batch));
    t->prepared_batch = t->cfg.micro_batch;
  }
  const td_model *m = t->model;
  const int accum = t->cfg.grad_accum;
  const int distributed = t->comm && t->world > 1;
  double t_start = td_now(), data_s = 0, wait_s = 0;
  td_status st = TD_OK;

  memset(t->grads, 0, t->n_params * sizeof(float));
  double loss_sum = 0;
  t->comm_bytes = 0;
  int n_buckets = 0;
  for (int micro = 0; micro < accum; micro++) {
    double d0 = td_now();
    load_micro_batch(t, micro);
    data_s += td_now() - d0;
    trace(t, "data", d0);
    float loss = m->ops->forward(t->model, t->params, t->inputs, t->targets, t->cfg.micro_batch);
    loss_sum += loss;
    int sync = distributed && micro == accum - 1;
    if (sync) {
      memset(t->tensor_ready, 0, (size_t)TD_MAX(m->n_tensors, 1) * sizeof(size_t));
      t->frontier_tensor = m->n_tensors;
      t->launched_lo = t->n_params;
      t->next_bucket = t->cfg.first_bucket_bytes / sizeof(float);
      t->bucket_status = TD_OK;
      t->n_requests = 0;
    }
    m->ops->backward(t->model, t->params, t->grads, 1.0f / (float)accum, sync ? on_grad_ready : NULL,
                     sync ? t : NULL);
    if (sync) {
      /* Whatever backward did not report (or a tensor reported out of order)
       * goes in one last bucket. */
      bucket_launch(t, 0, t->launched_lo);
      t->launched_lo = 0;
      n_buckets = t->n_requests;
    }
  }

  double loss = loss_sum / accum;
  if (distributed) {
    td_request *loss_req = NULL;
    if (t->bucket_status == TD_OK) {
      st = td_iallreduce(&loss, &loss, 1, TD_F64, TD_AVG, t->comm, &loss_req);
      if (st == TD_OK) st = push_request(t, loss_req);
      else td_error(st, "rank %d: averaging the loss failed: %s", t->rank, td_comm_last_error(t->comm));
    }
    td_status wst;
    wait_s = wait_requests(t, &wst);
    /* The message is the launch failure's, or the wait's if that came later. */
    if (t->bucket_status != TD_OK) return t->bucket_status;
    if (st == TD_OK) st = wst;
    if (st != TD_OK) return st;
  }

  /* Every rank holds the same averaged gradient, so the norm, the clip and
   * the update agree without further communication. */
  double opt0 = td_now();
  double norm = td_l2_norm(t->grads, t->n_params);
  float scale = td_clip_scale(norm, t->cfg.grad_clip);
  float lr = td_train_lr_at(&t->cfg, t->step);
  const td_optimizer_config *o = &t->cfg.optimizer;
  if (o->kind == TD_OPTIMIZER_ADAMW)
    td_adamw_update(t->params, t->grads, t->states[0], t->states[1], t->n_params, lr, o->beta1, o->beta2, o->eps,
                    o->weight_decay, t->step + 1, scale);
  else
    td_sgd_update(t->params, t->grads, t->states[0], t->n_params, lr, o->momentum, o->weight_decay, o->nesterov,
                  scale);
  t->step++;
  t->consumed += (uint64_t)t->cfg.train_batch_size;
  trace(t, "optimizer", opt0);

  int saved = 0;
  double step_s = td_now() - t_start;
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
    stats->n_buckets = n_buckets;
    stats->comm_bytes = t->comm_bytes;
    stats->saved = saved;
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

td_status td_trainer_evaluate(td_trainer *t, td_dataset *ds, size_t max_samples, double *loss_out,
                              double *accuracy_out) {
  if (!t || !ds) return td_error(TD_ERR_INVALID_ARGUMENT, "td_trainer_evaluate: null trainer or dataset");
  td_model *m = t->model;
  if (ds->input_bytes != m->input_bytes || ds->targets_per_sample != m->targets_per_sample)
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "td_trainer_evaluate: dataset samples (%zu input bytes, %zu targets) do not fit model \"%s\"",
                    ds->input_bytes, ds->targets_per_sample, m->kind);
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
    for (int k = 0; k < bs; k++)
      ds->get(ds, first + i + (size_t)k, t->inputs + (size_t)k * ds->input_bytes, t->targets + (size_t)k * tps);
    float loss = m->ops->forward(m, t->params, t->inputs, t->targets, bs);
    sums[0] += (double)loss * bs;
    if (pred) {
      m->ops->predict(m, pred);
      for (size_t k = 0; k < (size_t)bs * tps; k++) sums[1] += pred[k] == t->targets[k];
    }
  }
  free(pred);
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
size_t td_trainer_n_params(const td_trainer *t) { return t->n_params; }
int td_trainer_threads(const td_trainer *t) { return t->threads; }
