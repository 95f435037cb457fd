/* The config's "elasticity" block, DeepSpeed's keys (deepspeed.elasticity):
 *
 *   enabled                        train elastically (train-gpt, train-fmnist)
 *   max_train_batch_size           } the global batch is DeepSpeed's choice
 *   micro_batch_sizes              } among them (td_elasticity_batch: v0.1's
 *   min_gpus, max_gpus             } algorithm); min/max_gpus also bound the
 *   prefer_larger_batch            } world size (tandemrun --min-np/--max-np)
 *   ignore_non_elastic_batch_info  batch keys beside the block are an error
 *                                  unless true (then they are ignored), as
 *                                  in DeepSpeed
 *   version                        0.1, or 0.2 with one process per node and
 *                                  no model parallelism (then the same)
 *   min_time                       refused unless 0: a scheduler's minimum
 *                                  time between rescales; Tandem rescales
 *                                  when the membership changes
 *   num_gpus_per_node, model_parallel_size   v0.2's: only 1 is accepted
 *
 * Tandem's world sizes are processes, DeepSpeed's "gpus". */
#include "train/elastic/elastic_config.h"

#ifdef TD_HAVE_CJSON
#include <cjson/cJSON.h>
#endif
#include <math.h>
#include <stdio.h>
#include <string.h>

static const long hcn[] = {1,      2,      4,      6,      12,     24,     36,     48,     60,     120,
                           180,    240,    360,    720,    840,    1260,   1680,   2520,   5040,   7560,
                           10080,  15120,  20160,  25200,  27720,  45360,  50400,  55440,  83160,  110880,
                           166320, 221760, 277200, 332640, 498960, 554400, 665280, 720720};

static long gcd_l(long a, long b) {
  while (b) {
    long t = a % b;
    a = b;
    b = t;
  }
  return a;
}

/* DeepSpeed's get_valid_gpus: the world sizes that split `batch` with one
 * of the micro-batches (batch / micro ranks, or a divisor of it up to its
 * half), within [lo, hi]. Writes up to max entries of the ascending set. */
static int valid_worlds(long batch, const td_elasticity_config *e, int *out, int max) {
  int n = 0;
  for (long w = e->min_gpus; w <= e->max_gpus; w++) {
    bool ok = false;
    for (int k = 0; k < e->n_micro_batch_sizes && !ok; k++) {
      long m = e->micro_batch_sizes[k];
      if (batch % m) continue;
      long most = batch / m;
      ok = w == most || (w <= most / 2 && most % w == 0);
    }
    if (ok) {
      if (out && n < max) out[n] = (int)w;
      n++;
    }
  }
  return n;
}

td_status td_elasticity_batch(const td_elasticity_config *e, long *batch_out, int *valid, int max_valid,
                              int *n_valid) {
  if (!e || !batch_out || e->n_micro_batch_sizes < 1 || e->max_train_batch_size < 1)
    return td_error(TD_ERR_INVALID_ARGUMENT, "elasticity: micro_batch_sizes and max_train_batch_size are required");
  long lcm = 1, smallest = e->micro_batch_sizes[0];
  for (int k = 0; k < e->n_micro_batch_sizes; k++) {
    long m = e->micro_batch_sizes[k];
    if (m > e->max_train_batch_size)
      return td_error(TD_ERR_INVALID_ARGUMENT, "elasticity: micro batch size %ld is above max_train_batch_size %ld; "
                                               "every micro batch size must be at most the maximum batch",
                      m, e->max_train_batch_size);
    lcm = lcm / gcd_l(lcm, m) * m;
    if (lcm > (1L << 40)) lcm = 1L << 40; /* beyond any batch: a candidate of its own */
    if (m < smallest) smallest = m;
  }
  /* get_candidate_batch_sizes: per base, the largest highly composite
   * multiple not above the maximum (the base itself when it is above). */
  long cands[17];
  int nc = 0;
  for (int k = 0; k <= e->n_micro_batch_sizes; k++) {
    long base = k < e->n_micro_batch_sizes ? e->micro_batch_sizes[k] : lcm, c;
    if (base >= e->max_train_batch_size) {
      c = base;
    } else {
      long v = e->max_train_batch_size / base;
      int i = 0;
      while (i < (int)TD_ARRAY_SIZE(hcn) && hcn[i] <= v) i++;
      c = (i == (int)TD_ARRAY_SIZE(hcn) ? hcn[i - 1] : hcn[i - 1]) * base;
    }
    bool dup = false;
    for (int j = 0; j < nc; j++) dup |= cands[j] == c;
    if (!dup) cands[nc++] = c;
  }
  /* get_best_candidates: the most valid world sizes; ties to the larger
   * (or smaller) batch */
  long best = smallest;
  int best_n = 0;
  for (int j = 0; j < nc; j++) {
    int n = valid_worlds(cands[j], e, NULL, 0);
    if (n > best_n || (n == best_n && (e->prefer_larger_batch ? cands[j] > best : cands[j] < best))) {
      best_n = n;
      best = cands[j];
    }
  }
  if (best_n == 0)
    return td_error(TD_ERR_INVALID_ARGUMENT, "elasticity: no batch up to max_train_batch_size %ld splits into the "
                                             "micro batch sizes over any world size from min_gpus %d to max_gpus "
                                             "%d: raise max_train_batch_size or widen the range",
                    e->max_train_batch_size, e->min_gpus, e->max_gpus);
  *batch_out = best;
  int n = valid_worlds(best, e, valid, max_valid);
  if (n_valid) *n_valid = n;
  return TD_OK;
}

/* The JSON side, compiled only with cJSON (optional: without it config.c
 * refuses config files before any of this is reached). */
#ifdef TD_HAVE_CJSON
static td_status bad(const char *source, const char *what) {
  return td_error(TD_ERR_INVALID_ARGUMENT, "%s: elasticity.%s", source, what);
}

td_status td_elasticity_parse_json(const void *item_v, const char *source, td_train_config *cfg) {
  const cJSON *obj = item_v;
  td_elasticity_config *e = &cfg->elasticity;
  if (!cJSON_IsObject(obj))
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: elasticity must be an object, e.g. \"elasticity\": {\"enabled\": "
                                             "true, \"max_train_batch_size\": 48, \"micro_batch_sizes\": [2, 4]}",
                    source);
  memset(e, 0, sizeof *e);
  e->min_gpus = 1;
  e->max_gpus = 10000;
  e->prefer_larger_batch = 1;
  int mp = 1, per_node = 1;
  double version = 0.1;
  const cJSON *it;
  char msg[300];
  cJSON_ArrayForEach(it, obj) {
    const char *k = it->string;
    if (!strcmp(k, "enabled") || !strcmp(k, "prefer_larger_batch") || !strcmp(k, "ignore_non_elastic_batch_info")) {
      if (!cJSON_IsBool(it)) {
        snprintf(msg, sizeof msg, "%s must be true or false", k);
        return bad(source, msg);
      }
      int v = cJSON_IsTrue(it);
      if (!strcmp(k, "enabled")) e->enabled = v;
      else if (!strcmp(k, "prefer_larger_batch")) e->prefer_larger_batch = v;
      else e->ignore_non_elastic_batch_info = v;
    } else if (!strcmp(k, "micro_batch_sizes")) {
      int n = cJSON_GetArraySize(it);
      if (!cJSON_IsArray(it) || n < 1 || n > (int)TD_ARRAY_SIZE(e->micro_batch_sizes))
        return bad(source, "micro_batch_sizes must be a list of 1 to 16 positive whole numbers, e.g. [2, 4, 6]");
      for (int i = 0; i < n; i++) {
        const cJSON *x = cJSON_GetArrayItem(it, i);
        if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || x->valuedouble < 1 ||
            x->valuedouble > (1 << 20))
          return bad(source, "micro_batch_sizes must hold positive whole numbers (at most 2^20), e.g. [2, 4, 6]");
        e->micro_batch_sizes[i] = (int)x->valuedouble;
      }
      e->n_micro_batch_sizes = n;
    } else if (!strcmp(k, "max_train_batch_size") || !strcmp(k, "min_gpus") || !strcmp(k, "max_gpus") ||
               !strcmp(k, "model_parallel_size") || !strcmp(k, "num_gpus_per_node") || !strcmp(k, "min_time")) {
      double lim = !strcmp(k, "max_train_batch_size") ? 1e12 : 1e6;
      if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) || it->valuedouble < 0 ||
          it->valuedouble > lim) {
        snprintf(msg, sizeof msg, "%s must be a whole number from 0 to %.0f", k, lim);
        return bad(source, msg);
      }
      long v = (long)it->valuedouble;
      if (!strcmp(k, "max_train_batch_size")) e->max_train_batch_size = v;
      else if (!strcmp(k, "min_gpus")) e->min_gpus = (int)v;
      else if (!strcmp(k, "max_gpus")) e->max_gpus = (int)v;
      else if (!strcmp(k, "model_parallel_size")) mp = (int)v;
      else if (!strcmp(k, "num_gpus_per_node")) per_node = (int)v;
      else if (v != 0)
        return bad(source, "min_time is a job scheduler's minimum run time between rescales; Tandem rescales when "
                           "a process is lost or slots appear (tandemrun --min-np/--max-np): remove it or set 0");
    } else if (!strcmp(k, "version")) {
      if (!cJSON_IsNumber(it) || (fabs(it->valuedouble - 0.1) > 1e-9 && fabs(it->valuedouble - 0.2) > 1e-9))
        return bad(source, "version must be 0.1 or 0.2");
      version = it->valuedouble;
    } else {
      snprintf(msg, sizeof msg, "%s is not a key of DeepSpeed's elasticity block; the keys are enabled, "
                                "max_train_batch_size, micro_batch_sizes, min_gpus, max_gpus, min_time, "
                                "prefer_larger_batch, ignore_non_elastic_batch_info, version, num_gpus_per_node, "
                                "model_parallel_size", k);
      return bad(source, msg);
    }
  }
  if (mp != 1)
    return bad(source, "model_parallel_size: Tandem trains data-parallel only (ZeRO shards, no model parallelism); "
                       "use 1 or leave it out");
  if (per_node != 1)
    return bad(source, "num_gpus_per_node: Tandem scales by process, not by node (each process is one \"gpu\" of "
                       "min_gpus/max_gpus); use 1 or leave it out");
  (void)version; /* 0.2 with one process per node and no model parallelism is 0.1 */
  if (!e->enabled) return TD_OK;
  if (e->n_micro_batch_sizes == 0 || e->max_train_batch_size == 0)
    return bad(source, "enabled needs max_train_batch_size and micro_batch_sizes, e.g. \"max_train_batch_size\": "
                       "48, \"micro_batch_sizes\": [2, 4]");
  if (e->min_gpus < 1 || e->max_gpus < e->min_gpus) {
    snprintf(msg, sizeof msg, "min_gpus %d and max_gpus %d: need 1 <= min_gpus <= max_gpus", e->min_gpus,
             e->max_gpus);
    return bad(source, msg);
  }
  return TD_OK;
}

td_status td_elasticity_apply(const void *root_v, const char *source, td_train_config *cfg) {
  const cJSON *root = root_v;
  td_elasticity_config *e = &cfg->elasticity;
  static const char *const batch_keys[] = {"train_batch_size", "train_micro_batch_size_per_gpu",
                                           "train_micro_batch_size_per_rank", "gradient_accumulation_steps"};
  for (int i = 0; i < (int)TD_ARRAY_SIZE(batch_keys); i++) {
    if (!cJSON_GetObjectItemCaseSensitive(root, batch_keys[i])) continue;
    if (!e->ignore_non_elastic_batch_info)
      return td_error(TD_ERR_INVALID_ARGUMENT, "%s: \"%s\" is given beside an enabled \"elasticity\" block, which "
                                               "chooses the batch itself: remove it, or set "
                                               "elasticity.ignore_non_elastic_batch_info to true to ignore it",
                      source, batch_keys[i]);
  }
  long batch = 0;
  TD_CHECK(td_elasticity_batch(e, &batch, NULL, 0, NULL));
  cfg->train_batch_size = batch;
  cfg->micro_batch = 0;
  cfg->grad_accum = 0;
  return TD_OK;
}

#endif /* TD_HAVE_CJSON */

td_status td_elasticity_resolve(td_train_config *cfg, int world) {
  const td_elasticity_config *e = &cfg->elasticity;
  if (!e->enabled || cfg->micro_batch != 0 || cfg->grad_accum != 0 || cfg->train_batch_size <= 0) return TD_OK;
  long G = cfg->train_batch_size;
  int best = 0;
  for (int k = 0; k < e->n_micro_batch_sizes; k++) {
    long m = e->micro_batch_sizes[k];
    if (G % world == 0 && (G / world) % m == 0 && m > best) best = (int)m;
  }
  if (best > 0) {
    cfg->micro_batch = best;
    cfg->grad_accum = (int)(G / world / best);
    return TD_OK;
  }
  int valid[64], n = 0;
  long check = 0;
  (void)td_elasticity_batch(e, &check, valid, (int)TD_ARRAY_SIZE(valid), &n);
  char list[400] = "";
  size_t len = 0;
  for (int i = 0; i < n && i < (int)TD_ARRAY_SIZE(valid) && len + 12 < sizeof list; i++)
    len += (size_t)snprintf(list + len, sizeof list - len, i ? ", %d" : "%d", valid[i]);
  return td_error(TD_ERR_INVALID_ARGUMENT, "elasticity: the batch %ld chosen from micro_batch_sizes and "
                                           "max_train_batch_size cannot be split over %d ranks; world sizes that "
                                           "keep it: %s",
                  G, world, n ? list : "none");
}
