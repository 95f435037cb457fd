/* The trainer under elastic training: which of its memory is the state, and
 * how it moves onto the communicator of a new epoch (tandem/elastic.h).
 *
 * A step depends on the parameters, the optimizer state, the step count
 * (Adam's bias correction, the schedule) and the sampler position; the
 * global batch rides along so that a joining process learns it from its
 * peers. Gradients are rebuilt by every step and are not state. Because the
 * sampler addresses samples by global stream position, a new world size
 * reads exactly the samples the old one would have (core/core.h). */
#include "train/core/core.h"
#include "train/memory_fit.h"
#include "train/zero/zero.h"
#include "train/deterministic/deterministic.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The sharded arenas of ZeRO stage >= 1: the optimizer states, and at
 * stage 3 the parameters (this rank's shard of each; core/core.h). */
static td_status register_shards(td_trainer *t, td_elastic *e) {
  size_t lo = t->shard_lo, hi = t->shard_hi;
  for (int i = 0; i < t->n_states; i++) {
    const char *name = i == 0 ? "optimizer_state_0" : "optimizer_state_1";
    TD_CHECK(td_elastic_register_shard(e, name, t->states[i], sizeof(float), t->n_params, lo, hi));
  }
  /* the parameters too, cut alike (a quarter of the bytes to copy at 4
   * ranks); the first step after a restore allgathers them. At stages 1-2
   * every rank holds them all, equal after the update's allgather (zero/):
   * a commit sends none of them, the buddy writes its ward's range from its
   * own arena (a third less to move) */
  if (t->zero_stage <= 2)
    return td_elastic_register_shard_whole(e, "params", t->params, sizeof(float), t->n_params, lo, hi);
  return td_elastic_register_shard(e, "params", t->params + lo, sizeof(float), t->n_params, lo, hi);
}

td_status td_trainer_elastic_register(td_trainer *t, td_elastic *e) {
  if (!t || !e) return td_error(TD_ERR_INVALID_ARGUMENT, "td_trainer_elastic_register: trainer and state required");
  /* the offloaded parameters live in per-rank files cut for one world size */
  if (t->offload)
    return td_error(TD_ERR_INVALID_USAGE, "elastic training with NVMe offload (the config's \"aio\"/offload) is not "
                                          "supported: turn one of them off");
  size_t bytes = t->n_params * sizeof(float);
  t->elastic = e;
  /* every step in the canonical order, so that a resize keeps the bits (deterministic/) */
  TD_CHECK(det_elastic_enable(t));
  if (t->zero_stage >= 1) {
    TD_CHECK(register_shards(t, e));
  } else {
    TD_CHECK(td_elastic_register(e, "params", t->params, bytes));
    TD_CHECK(td_elastic_register(e, "optimizer_state_0", t->states[0], bytes));
    if (t->n_states > 1) TD_CHECK(td_elastic_register(e, "optimizer_state_1", t->states[1], bytes));
  }
  TD_CHECK(td_elastic_register(e, "step", &t->step, sizeof t->step));
  TD_CHECK(td_elastic_register(e, "consumed", &t->consumed, sizeof t->consumed));
  /* the unit of the canonical sum: one value for the whole job (deterministic/) */
  TD_CHECK(td_elastic_register(e, "deterministic_unit", &t->cfg.deterministic_unit, sizeof t->cfg.deterministic_unit));
  return td_elastic_register(e, "train_batch_size", &t->cfg.train_batch_size, sizeof t->cfg.train_batch_size);
}

td_status td_trainer_elastic_rebind(td_trainer *t, td_comm *comm, int micro_hint, int max_world) {
  if (!t) return td_error(TD_ERR_INVALID_ARGUMENT, "td_trainer_elastic_rebind: trainer is NULL");
  int world = comm ? td_comm_size(comm) : 1;
  int micro = 0, accum = 0;
  TD_CHECK(td_elastic_batch_split(t->cfg.train_batch_size, world, micro_hint, max_world, &micro, &accum));
  /* Requests of an interrupted step belong to the old communicator, which
   * completes them with its error; nothing of theirs is needed. */
  for (int i = 0; i < t->n_requests; i++) td_wait(t->requests[i]);
  t->n_requests = 0;
  int32_t *flags = calloc((size_t)world, sizeof *flags);
  unsigned char *inputs = td_alloc((size_t)micro * t->dataset->input_bytes);
  int32_t *targets = td_alloc((size_t)micro * t->dataset->targets_per_sample * sizeof(int32_t));
  if (!flags || !inputs || !targets) {
    free(flags);
    td_free(inputs);
    td_free(targets);
    return td_error(TD_ERR_SYSTEM, "elastic: out of memory for the micro-batch of %d samples", micro);
  }
  free(t->agree_flags);
  td_free(t->inputs);
  td_free(t->targets);
  t->agree_flags = flags;
  t->inputs = inputs;
  t->targets = targets;
  int old_world = t->world;
  t->comm = comm;
  t->rank = comm ? td_comm_rank(comm) : 0;
  t->world = world;
  t->cfg.micro_batch = micro;
  t->cfg.grad_accum = accum;
  if (t->cfg.threads <= 0) {
    t->threads = td_auto_threads(comm ? td_host_ranks(comm) : 1);
    td_nn_set_threads(t->threads);
  }
  /* the shards grow when the world shrinks: refused here, before they are
   * cut, when the new world does not fit (memory_fit.c) */
  TD_CHECK(trainer_memory_rebind(t, old_world));
  /* The model is prepared for the new micro-batch by the next step. */
  t->prepared_batch = -1;
  if (t->zero) { /* ZeRO: shards cut for the new world, filled by the elastic restore */
    TD_CHECK(zero_rebind(t));
    if (t->elastic) TD_CHECK(register_shards(t, t->elastic));
  } else {
    /* stage 0 has no ZeRO state, but checkpoints write shard_lo/hi: cut
     * them for the new world too (they kept the old world's otherwise) */
    zero_layout(t);
  }
  /* the units' split and the exchange buffers follow the world */
  if (t->elastic || t->det || t->cfg.deterministic_reduction == 1)
    TD_CHECK(det_elastic_rebind(t, micro_hint, max_world));
  return TD_OK;
}
