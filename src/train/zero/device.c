/* ZeRO stages 1 and 2 on device arenas (issue 18): what zero/reduce.c and
 * zero/shard.c do for host arenas, for a model on a device (t->devops).
 *
 * A device model writes every gradient of every tensor during backward, so
 * its gradient array (t->model_grads or t->grads, f32 or bf16) is whole on
 * every rank at every stage; cudaMalloc'd memory cannot give pages back as
 * the host arenas do (pages.c). What the stages shard on a device:
 *
 *   stage 1  the AdamW moments: each rank keeps its shard
 *            td_shard_range(n_params, world, rank) of m and v (allocated
 *            shard-sized by trainer.c) and updates only that range of the
 *            master params; the gradients are averaged whole by stage 0's
 *            allreduce buckets (trainer.c).
 *   stage 2  as stage 1, and a gradient bucket [lo, hi) is cut at the shard
 *            boundaries, each piece reduced (td_ireduce, TD_AVG) to its
 *            owner only (a reduce-scatter's traffic, half an allreduce's):
 *
 *              shards:  [ rank 0      | rank 1      ]
 *              bucket:          [=======|===]
 *              pieces:          [ to 0 ][to 1]
 *
 *            Gradient accumulation adds the micro-steps locally first (the
 *            whole array is there anyway), so the last backward's buckets
 *            carry the sum, as at stage 0.
 *
 * After the update every rank allgathers the master params (f32, in place:
 * its own shard is already where the allgather puts it), and with bf16 the
 * model's copy is rounded again from them (td_trainer_device_params_changed).
 * The gradient norm is the sum of the owners' shard sums (device kernel,
 * fixed order), added in rank order on every rank: the same at stages 1
 * and 2; stage 0 sums the whole array in one pass, so stages 1-2 differ
 * from it by the rounding of the norm only (the clip factor), 1e-7
 * relative. Stage 3 (parameters fetched per layer) needs the device model
 * to honour td_param_access, which it does not yet: trainer.c refuses it.
 * Internal to src/train. */
#include "train/zero/zero.h"

#include <math.h>

static size_t model_es(const td_trainer *t) { return td_dtype_size(t->model_dtype); }

td_status zero_device_bucket_launch(td_trainer *t, size_t lo, size_t hi) {
  char *grads = td_trainer_model_grads(t);
  const size_t es = model_es(t);
  for (int r = 0; r < t->world; r++) {
    size_t off, len;
    td_shard_range(t->n_params, t->world, r, &off, &len);
    size_t a = TD_MAX(lo, off), b = TD_MIN(hi, off + len);
    if (b <= a) continue;
    td_request *req = NULL;
    td_status st = td_ireduce(grads + a * es, grads + a * es, b - a, t->model_dtype, TD_AVG, r, t->comm, &req);
    if (st != TD_OK)
      return td_error(st, "rank %d: reducing device gradients [%zu, %zu) to their owner, rank %d, failed: %s", t->rank,
                      a, b, r, td_comm_last_error(t->comm));
    if (t->n_requests == t->cap_requests) {
      td_wait(req);
      return td_error(TD_ERR_INTERNAL, "rank %d: more than %d gradient pieces in one step", t->rank, t->cap_requests);
    }
    t->requests[t->n_requests++] = req;
  }
  return TD_OK;
}

td_status zero_device_grad_norm(td_trainer *t, double *norm_out) {
  double part[1] = {0};
  const size_t es = model_es(t);
  const char *grads = td_trainer_model_grads(t);
  /* this rank's shard (whole on every rank at stage 1, reduced only there at stage 2) */
  TD_CHECK(t->devops->sum_squares(t->device, t->dev_scratch, grads + t->shard_lo * es, t->model_dtype,
                                  t->shard_hi - t->shard_lo, &part[0]));
  double total = part[0];
  if (t->comm && t->world > 1) {
    double *parts = t->dev_norm_parts;
    for (int r = 0; r < t->world; r++) parts[r] = 0;
    parts[t->rank] = part[0];
    td_status st = td_allgather(parts + t->rank, parts, (size_t)t->world, TD_F64, t->comm);
    if (st != TD_OK)
      return td_error(st, "rank %d: gathering the gradient norm's partial sums failed: %s", t->rank,
                      td_comm_last_error(t->comm));
    total = 0;
    for (int r = 0; r < t->world; r++) total += parts[r]; /* rank order: the same bits on every rank */
  }
  *norm_out = sqrt(total);
  return TD_OK;
}

td_status zero_device_update(td_trainer *t, float lr, float grad_scale, long adam_t) {
  const td_optimizer_config *o = &t->cfg.optimizer;
  const size_t lo = t->shard_lo, n = t->shard_hi - t->shard_lo, es = model_es(t);
  char *copy = t->model_params ? (char *)t->model_params + lo * es : NULL;
  const char *grads = (const char *)td_trainer_model_grads(t) + lo * es;
  /* the states are shard-sized: element 0 is element shard_lo */
  TD_CHECK(t->devops->adamw(t->device, t->params + lo, copy, grads, t->model_dtype, t->states[0], t->states[1], n, lr,
                            o->beta1, o->beta2, o->eps, o->weight_decay, adam_t, grad_scale));
  if (!t->comm || t->world == 1) return TD_OK;
  td_status st = td_allgather(t->params + lo, t->params, t->n_params, TD_F32, t->comm);
  if (st != TD_OK)
    return td_error(st, "rank %d: allgathering the updated device parameters failed: %s", t->rank,
                    td_comm_last_error(t->comm));
  return td_trainer_device_params_changed(t); /* the other shards of the bf16 copy */
}

size_t zero_device_state_bytes_for(size_t n_params, size_t shard, int n_states, td_dtype compute) {
  size_t bytes = n_params * sizeof(float); /* masters */
  bytes += compute == TD_BF16 ? 2 * n_params * sizeof(uint16_t) /* gradients and the params' copy */
                              : n_params * sizeof(float);
  return bytes + (size_t)n_states * shard * sizeof(float);
}

size_t zero_device_state_bytes(const td_trainer *t) {
  return zero_device_state_bytes_for(t->n_params, t->states_hi - t->states_lo, t->n_states, t->model_dtype);
}
