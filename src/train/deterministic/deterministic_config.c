/* The config keys of deterministic reduction (deterministic.h) and when it is
 * on:
 *
 *   "deterministic_reduction": true | false   default: on under elastic
 *                                             training, off otherwise
 *   "deterministic_unit": N                   samples per unit; default
 *                                             below
 *
 * Default unit: the largest divisor of the global batch B that is at most
 * the micro-batch (the most samples one forward of the job holds) and at
 * most B / the largest world size allowed (the current one, or tandemrun's
 * --max-np under elastic training), so that no rank of the largest world
 * is left without a unit. Without elasticity that is the micro-batch: the
 * step runs as many forwards of the same size as without deterministic
 * reduction. Under elastic training it is fixed when the job starts and
 * kept through every resize (every process derives the same value from
 * the batch, the micro-batch asked for and --max-np).
 *
 * Refused, because their sums cannot be canonical: gradients communicated
 * in bf16/fp16 (communication_data_type: the rounding to 16 bits would
 * happen on partial sums whose grouping depends on the world) and NVMe
 * offload (its optimizer step and files are cut per rank and world). */
#include "train/deterministic/deterministic.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TD_HAVE_CJSON
#include <cjson/cJSON.h>
#endif

td_status td_deterministic_parse_json(const void *item_v, const char *source, td_train_config *cfg) {
#ifdef TD_HAVE_CJSON
  const cJSON *item = item_v;
  if (strcmp(item->string, "deterministic_reduction") == 0) {
    if (!cJSON_IsBool(item))
      return td_error(TD_ERR_INVALID_ARGUMENT, "%s: deterministic_reduction must be true or false", source);
    cfg->deterministic_reduction = cJSON_IsTrue(item) ? 1 : 0;
    return TD_OK;
  }
  if (strcmp(item->string, "deterministic_unit") == 0) {
    double v = cJSON_IsNumber(item) ? item->valuedouble : -1;
    if (!(v >= 1 && v <= 1099511627776.0) || v != floor(v))
      return td_error(TD_ERR_INVALID_ARGUMENT,
                      "%s: deterministic_unit must be a whole number of samples >= 1 that divides train_batch_size "
                      "(e.g. the micro-batch)", source);
    cfg->deterministic_unit = (long)v;
    return TD_OK;
  }
  return td_error(TD_ERR_INVALID_ARGUMENT, "%s: unknown key \"%s\"", source, item->string);
#else
  (void)item_v;
  (void)cfg;
  return td_error(TD_ERR_INVALID_USAGE, "%s: built without cJSON", source);
#endif
}

long det_default_unit(long batch, int micro, int max_world) {
  long bound = micro > 0 ? micro : batch;
  if (max_world > 0) bound = TD_MIN(bound, batch / max_world);
  if (bound < 1) bound = 1;
  long unit = TD_MIN(bound, batch);
  while (unit > 1 && batch % unit) unit--;
  return unit;
}

/* Units per step when cfg turns deterministic reduction on at `world`
 * ranks, else 0. */
static size_t units_of(const td_train_config *cfg, int world) {
  bool on = cfg->deterministic_reduction == 1 || (cfg->deterministic_reduction < 0 && cfg->elasticity.enabled);
  long batch = cfg->train_batch_size;
  if (!on || batch < 1 || world < 1) return 0;
  long unit = cfg->deterministic_unit > 0 ? cfg->deterministic_unit : det_default_unit(batch, cfg->micro_batch, world);
  if (unit < 1 || batch % unit) return 0; /* refused at creation */
  return (size_t)(batch / unit);
}

size_t det_estimate_bytes(const td_train_config *cfg, const td_model *model, int world, int stage) {
  size_t U = units_of(cfg, world);
  if (!U) return 0;
  det_sizes z;
  det_buffer_sizes(model->n_params, model, U, world, 0, stage, &z);
  return z.bytes;
}

void det_comm_traffic(const td_train_config *cfg, size_t n_params, const td_comm *comm, int *peers,
                      td_comm_traffic *tr) {
  const int W = comm ? td_comm_size(comm) : 1, me = comm ? td_comm_rank(comm) : 0;
  size_t U = units_of(cfg, W);
  if (!U || W < 2) return;
  int *to = peers, *from = peers + W, n_to = 0, n_from = 0;
  size_t a, mine, lo, hi;
  td_shard_range(U, W, me, &a, &mine);
  det_xfer_range(n_params, W, me, &lo, &hi);
  for (int r = 0; r < W; r++) {
    if (r == me) continue;
    size_t units, rlo, rhi;
    td_shard_range(U, W, r, &a, &units);
    det_xfer_range(n_params, W, r, &rlo, &rhi);
    if (mine && rhi > rlo) to[n_to++] = r;    /* this rank's cover chunks of r's range */
    if (units && hi > lo) from[n_from++] = r; /* r's cover chunks of this rank's range */
  }
  tr->send_peers = to;
  tr->recv_peers = from;
  tr->n_send_peers = n_to;
  tr->n_recv_peers = n_from;
  /* the unit losses' allreduce and the norm's allgather: a few doubles */
  tr->allreduce = TD_MAX(tr->allreduce, (U + 1) * sizeof(double));
  tr->allgather = TD_MAX(tr->allgather, (size_t)W * DET_MAX_COVER * sizeof(double));
}

static td_status check_combination(const td_trainer *t, const char *why) {
  const td_train_config *c = &t->cfg;
  if (c->precision.comm_dtype != TD_F32)
    return td_error(TD_ERR_INVALID_ARGUMENT, "deterministic reduction (%s) cannot be kept with "
                    "communication_data_type \"%s\": 16-bit partial sums round by world size; use \"fp32\"%s", why,
                    td_dtype_name(c->precision.comm_dtype),
                    t->elastic ? "" : " or set deterministic_reduction to false");
  if (c->offload.optimizer_device == TD_OFFLOAD_NVME || c->offload.param_device == TD_OFFLOAD_NVME)
    return td_error(TD_ERR_INVALID_ARGUMENT, "deterministic reduction (%s) does not support NVMe offload "
                    "(its files and optimizer tiles are cut per rank): turn offload to nvme off%s", why,
                    t->elastic ? "" : " or set deterministic_reduction to false");
  return TD_OK;
}

static td_status check_unit(long unit, long batch) {
  if (unit < 1 || unit > batch || batch % unit) {
    char divisors[256] = "";
    size_t len = 0;
    for (long d = 1; d <= batch && len + 24 < sizeof divisors; d++)
      if (batch % d == 0) len += (size_t)snprintf(divisors + len, sizeof divisors - len, len ? ", %ld" : "%ld", d);
    return td_error(TD_ERR_INVALID_ARGUMENT, "deterministic_unit %ld does not divide train_batch_size %ld: use one "
                    "of %s%s", unit, batch, divisors, len + 24 >= sizeof divisors ? ", ..." : "");
  }
  return TD_OK;
}

/* Allocate the state for the unit and the current world. */
static td_status enable(td_trainer *t, long unit) {
  TD_CHECK(check_unit(unit, t->cfg.train_batch_size));
  if (!t->det) {
    t->det = calloc(1, sizeof *t->det);
    if (!t->det) return td_error(TD_ERR_SYSTEM, "out of memory for the deterministic reduction state");
  }
  t->det->unit = (size_t)unit;
  t->det->n_units = (size_t)(t->cfg.train_batch_size / unit);
  return det_setup(t);
}

td_status det_trainer_init(td_trainer *t) {
  if (t->cfg.deterministic_reduction != 1) {
    if (t->cfg.deterministic_unit > 0 && t->cfg.deterministic_reduction == 0)
      return td_error(TD_ERR_INVALID_ARGUMENT, "deterministic_unit is set but deterministic_reduction is false: "
                      "remove one of them");
    return TD_OK; /* the elastic registration may still turn it on */
  }
  TD_CHECK(check_combination(t, "deterministic_reduction true"));
  /* created unbound (td_trainer_create_unbound): the units and exchange
   * buffers are cut at the first rebind (det_elastic_rebind) */
  if (!t->comm && t->world > 1) return TD_OK;
  long unit = t->cfg.deterministic_unit > 0 ? t->cfg.deterministic_unit
                                            : det_default_unit(t->cfg.train_batch_size, t->cfg.micro_batch, t->world);
  return enable(t, unit);
}

td_status det_elastic_enable(td_trainer *t) {
  if (t->cfg.deterministic_reduction == 0)
    return td_error(TD_ERR_INVALID_ARGUMENT, "elastic training keeps every step bit for bit through resizes with "
                    "deterministic reduction: remove \"deterministic_reduction\": false from the config");
  return check_combination(t, "always on under elastic training");
}

td_status det_elastic_rebind(td_trainer *t, int micro_hint, int max_world) {
  /* Fixed at the first rebind and kept in cfg.deterministic_unit, which
   * the elastic state carries (trainer_elastic.c): a process that joins
   * later receives it with the parameters instead of deriving its own. */
  if (t->cfg.deterministic_unit <= 0)
    t->cfg.deterministic_unit = det_default_unit(t->cfg.train_batch_size, micro_hint, max_world);
  return enable(t, t->cfg.deterministic_unit);
}
