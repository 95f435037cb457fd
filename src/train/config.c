/* The training config: defaults, the JSON file (DeepSpeed ds_config key names
 * where the concept is the same), batch-size resolution for a world size, and
 * the learning-rate schedule. Every error says which key is wrong and what to
 * write instead: a config error is the first thing a new user meets. */
#include "train/core/core.h"
#include "train/deterministic/deterministic.h"
#include "train/elastic/elastic_config.h"
#include "train/offload/offload.h"
#include "train/precision/precision.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TD_HAVE_CJSON
#include <cjson/cJSON.h>
#endif

void td_train_config_defaults(td_train_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->seed = 1337;
  cfg->optimizer.kind = TD_OPTIMIZER_ADAMW;
  cfg->optimizer.lr = 3e-4f;
  cfg->optimizer.beta1 = 0.9f;
  cfg->optimizer.beta2 = 0.999f;
  cfg->optimizer.eps = 1e-8f;
  cfg->scheduler.kind = TD_SCHEDULE_CONSTANT;
  cfg->bucket_bytes = 25u << 20;
  cfg->first_bucket_bytes = 1u << 20;
  cfg->steps_per_print = 10;
  td_precision_config_defaults(&cfg->precision);
  td_offload_config_defaults(&cfg->offload);
  /* DeepSpeed's defaults for the ZeRO stage-3 knobs (numbers of parameters) */
  cfg->stage3_prefetch_bucket_size = 50000000;
  cfg->stage3_max_live_parameters = 1000000000;
  cfg->stage3_param_persistence_threshold = 100000;
  cfg->deterministic_reduction = -1; /* on under elastic training only */
  cfg->tensor_parallel = 1;
  cfg->pipeline_parallel = 1;
}

/* ---- batch sizes and ranges ---- */

/* micro x accum x world, or -1 when the product does not fit a long (the
 * config's limits allow 2^30 x 2^30 x any world size). */
static long batch_product(long micro, long accum, int world) {
  long micro_accum, product;
  if (__builtin_mul_overflow(micro, accum, &micro_accum) || __builtin_mul_overflow(micro_accum, (long)world, &product))
    return -1;
  return product;
}

static td_status batch_too_large(long micro, long accum, int world) {
  return td_error(TD_ERR_INVALID_ARGUMENT,
                  "batch sizes too large: micro %ld x accumulation %ld x %d ranks does not fit in 64 bits", micro,
                  accum, world);
}

/* pipeline_model_parallel_size: the names, and what the pipeline engine
 * (src/parallel/pipeline) does not compose with yet, refused before any
 * model is built. The layout itself (layers per stage, micro-batches of the
 * interleaved schedule) is checked by td_pipeline_check. */
static td_status pipeline_parallel_check(td_train_config *cfg) {
  if (cfg->pipeline_parallel == 0) cfg->pipeline_parallel = 1;
  const int pp = cfg->pipeline_parallel;
  if (pp < 0 || pp > 4096)
    return td_error(TD_ERR_INVALID_ARGUMENT, "pipeline_model_parallel_size %d: must be 1 (off) .. 4096", pp);
  if (cfg->pipeline_schedule[0] && strcmp(cfg->pipeline_schedule, "1f1b") && strcmp(cfg->pipeline_schedule, "interleaved"))
    return td_error(TD_ERR_INVALID_ARGUMENT, "pipeline schedule \"%s\": use \"1f1b\" or \"interleaved\"",
                    cfg->pipeline_schedule);
  if (cfg->pipeline_partition[0] && strcmp(cfg->pipeline_partition, "uniform") &&
      strcmp(cfg->pipeline_partition, "parameters") && strcmp(cfg->pipeline_partition, "compute"))
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "pipeline partition_method \"%s\" is not built: use \"uniform\", \"parameters\" or \"compute\"",
                    cfg->pipeline_partition);
  if (cfg->pipeline_chunks < 0 || cfg->pipeline_chunks > 64)
    return td_error(TD_ERR_INVALID_ARGUMENT, "pipeline chunks %d: must be 1 .. 64", cfg->pipeline_chunks);
  if (pp == 1) return TD_OK;
  const char *what = NULL;
  /* ZeRO-3 fetches each layer's parameters inside the model: the CPU's
   * stage models do (td_param_access, through the pipeline engine), a
   * device's do not */
  const int on_cpu = !cfg->device[0] || strcmp(cfg->device, "cpu") == 0;
  if (cfg->zero_stage >= 3 && !on_cpu) what = "ZeRO stage 3 on a GPU (use stage 0, 1 or 2 there, or the CPU)";
  else if (cfg->elasticity.enabled || cfg->deterministic_reduction == 1)
    what = "elastic training or deterministic reduction";
  /* on a GPU the stages compute in f32 or bf16 (what crosses between them is of that type) */
  else if (cfg->device[0] && strcmp(cfg->device, "cpu") != 0 && cfg->precision.compute == TD_F16)
    what = "a GPU in fp16 (train in bf16 or fp32 there)";
  if (what)
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "pipeline_model_parallel_size %d with %s is not built yet: drop one of them "
                    "(pipelines train on the CPU in fp32, bf16 or fp16 with ZeRO stage 0-3 and stage 3's NVMe "
                    "offload, on a GPU in fp32 or bf16 with ZeRO stage 0, 1 or 2; not elastically, not with "
                    "deterministic reduction)",
                    pp, what);
  return TD_OK;
}

/* tensor_model_parallel_size: what the tensor-parallel GPT (src/parallel)
 * does not do yet is refused here, before any model is built. */
static td_status tensor_parallel_check(td_train_config *cfg) {
  if (cfg->tensor_parallel == 0) cfg->tensor_parallel = 1;
  const int tp = cfg->tensor_parallel;
  if (tp < 0 || tp > 4096)
    return td_error(TD_ERR_INVALID_ARGUMENT, "tensor_model_parallel_size %d: must be 1 (off) .. 4096", tp);
  if (tp == 1) {
    if (cfg->sequence_parallel)
      return td_error(TD_ERR_INVALID_ARGUMENT, "sequence_parallel splits the sequence inside a tensor-parallel "
                      "group: set tensor_model_parallel_size to 2 or more, or drop sequence_parallel");
    return TD_OK;
  }
  const char *what = NULL;
  /* ZeRO-3 fetches each layer's parameters inside the model (td_param_access):
   * the tensor-parallel GPT does, on the CPU and on a device; stage 3's NVMe
   * offload then works on the shard's arena as on any other (a device
   * refuses offload by itself) */
  const int on_cpu = !cfg->device[0] || strcmp(cfg->device, "cpu") == 0;
  if (cfg->elasticity.enabled) what = "elastic training";
  else if (cfg->sequence_parallel && !on_cpu && cfg->pipeline_parallel > 1)
    return td_error(TD_ERR_INVALID_ARGUMENT, "sequence_parallel with pipeline stages on device %s is not built yet "
                    "(a device splits the sequence of the whole model only): drop sequence_parallel or "
                    "pipeline_model_parallel_size, or use --device cpu", cfg->device);
  if (what)
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "tensor_model_parallel_size %d with %s is not built yet: drop one of them "
                    "(tensor parallelism trains in fp32, bf16 or fp16, on a GPU in fp32 or bf16, with ZeRO stage 0-3 "
                    "and stage 3's NVMe offload; not elastically)", tp,
                    what);
  return TD_OK;
}

td_status td_train_config_resolve(td_train_config *cfg, int world) {
  if (world < 1) return td_error(TD_ERR_INVALID_ARGUMENT, "world size %d: must be at least 1", world);
  TD_CHECK(td_elasticity_resolve(cfg, world)); /* the micro-batch of an elastic config's batch */
  long G = cfg->train_batch_size;
  long m = cfg->micro_batch, a = cfg->grad_accum;
  if (G < 0) return td_error(TD_ERR_INVALID_ARGUMENT, "train_batch_size %ld: must be positive (or 0 to derive it)", G);
  if (m < 0)
    return td_error(TD_ERR_INVALID_ARGUMENT, "train_micro_batch_size_per_gpu %ld: must be positive (or 0 to derive it)", m);
  if (a < 0)
    return td_error(TD_ERR_INVALID_ARGUMENT, "gradient_accumulation_steps %ld: must be positive (or 0 to derive it)", a);
  if (G > 0) {
    if (m > 0 && a > 0) {
      long product = batch_product(m, a, world);
      if (product < 0) return batch_too_large(m, a, world);
      if (G != product)
        return td_error(TD_ERR_INVALID_ARGUMENT,
                        "train_batch_size %ld != %ld (micro) x %ld (accum) x %d (ranks) = %ld: set train_batch_size "
                        "to %ld or leave it out",
                        G, m, a, world, product, product);
    } else if (m > 0) {
      if (G % (m * world))
        return td_error(TD_ERR_INVALID_ARGUMENT,
                        "train_batch_size %ld is not a multiple of %ld (micro) x %d (ranks) = %ld: set "
                        "train_batch_size to a multiple of %ld (e.g. %ld) or leave it out",
                        G, m, world, m * world, m * world, (G / (m * world) + 1) * m * world);
      a = G / (m * world);
    } else if (a > 0) {
      if (G % (a * world))
        return td_error(TD_ERR_INVALID_ARGUMENT,
                        "train_batch_size %ld is not a multiple of %ld (accum) x %d (ranks) = %ld: set "
                        "train_batch_size to a multiple of %ld (e.g. %ld) or leave it out",
                        G, a, world, a * world, a * world, (G / (a * world) + 1) * a * world);
      m = G / (a * world);
    } else {
      if (G % world)
        return td_error(TD_ERR_INVALID_ARGUMENT,
                        "train_batch_size %ld is not a multiple of the %d ranks: set it to a multiple of %d "
                        "(e.g. %ld) or give train_micro_batch_size_per_gpu instead",
                        G, world, world, (G / world + 1) * world);
      a = 1;
      m = G / world;
    }
  } else {
    if (m == 0) m = 1;
    if (a == 0) a = 1;
    G = batch_product(m, a, world);
    if (G < 0) return batch_too_large(m, a, world);
  }
  if (m > (1L << 30) || a > (1L << 30))
    return td_error(TD_ERR_INVALID_ARGUMENT, "batch sizes too large: micro %ld, accumulation %ld", m, a);
  cfg->train_batch_size = G;
  cfg->micro_batch = (int)m;
  cfg->grad_accum = (int)a;

  if (cfg->zero_stage < 0 || cfg->zero_stage > 3)
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "zero_optimization.stage %d: must be 0 (off), 1 (optimizer state), 2 (+ gradients) or 3 (+ "
                    "parameters)", cfg->zero_stage);

  const td_optimizer_config *o = &cfg->optimizer;
  if (o->kind != TD_OPTIMIZER_SGD && o->kind != TD_OPTIMIZER_ADAMW)
    return td_error(TD_ERR_INVALID_ARGUMENT, "optimizer kind %d: use TD_OPTIMIZER_SGD or TD_OPTIMIZER_ADAMW", (int)o->kind);
  if (!(o->lr > 0) || !isfinite(o->lr))
    return td_error(TD_ERR_INVALID_ARGUMENT, "optimizer lr %g: must be a positive number (e.g. 3e-4)", o->lr);
  if (o->kind == TD_OPTIMIZER_ADAMW) {
    if (!(o->beta1 >= 0 && o->beta1 < 1) || !(o->beta2 >= 0 && o->beta2 < 1))
      return td_error(TD_ERR_INVALID_ARGUMENT, "optimizer betas [%g, %g]: each must be in [0, 1), e.g. [0.9, 0.999]",
                      o->beta1, o->beta2);
    if (!(o->eps > 0)) return td_error(TD_ERR_INVALID_ARGUMENT, "optimizer eps %g: must be positive, e.g. 1e-8", o->eps);
  }
  if (!(o->weight_decay >= 0) || !isfinite(o->weight_decay))
    return td_error(TD_ERR_INVALID_ARGUMENT, "optimizer weight_decay %g: must be >= 0", o->weight_decay);
  if (!(o->momentum >= 0 && o->momentum < 1))
    return td_error(TD_ERR_INVALID_ARGUMENT, "optimizer momentum %g: must be in [0, 1), e.g. 0.9", o->momentum);
  if (o->nesterov && o->momentum == 0)
    return td_error(TD_ERR_INVALID_ARGUMENT, "optimizer nesterov needs a momentum > 0 (e.g. 0.9)");

  const td_schedule_config *s = &cfg->scheduler;
  if ((int)s->kind < 0 || s->kind > TD_SCHEDULE_WARMUP_LINEAR)
    return td_error(TD_ERR_INVALID_ARGUMENT, "scheduler kind %d is unknown", (int)s->kind);
  if (s->warmup_steps < 0 || s->total_steps < 0)
    return td_error(TD_ERR_INVALID_ARGUMENT, "scheduler warmup_num_steps %ld / total_num_steps %ld: must be >= 0",
                    s->warmup_steps, s->total_steps);
  if (!(s->warmup_start_ratio >= 0 && s->warmup_start_ratio <= 1) || !(s->min_ratio >= 0 && s->min_ratio <= 1))
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "scheduler warmup start %g / minimum %g (fractions of lr): each must be in [0, 1]",
                    s->warmup_start_ratio, s->min_ratio);
  long total = s->total_steps ? s->total_steps : cfg->steps;
  if ((s->kind == TD_SCHEDULE_WARMUP_COSINE || s->kind == TD_SCHEDULE_WARMUP_LINEAR) && total > 0 &&
      total < s->warmup_steps)
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "scheduler total_num_steps %ld < warmup_num_steps %ld: the decay would end before warmup does; "
                    "set total_num_steps to at least %ld",
                    total, s->warmup_steps, s->warmup_steps);
  if (cfg->steps < 0) return td_error(TD_ERR_INVALID_ARGUMENT, "train_steps %ld: must be >= 0", cfg->steps);
  if (!(cfg->grad_clip >= 0) || !isfinite(cfg->grad_clip))
    return td_error(TD_ERR_INVALID_ARGUMENT, "gradient_clipping %g: must be >= 0 (0 turns clipping off)", cfg->grad_clip);
  if (cfg->bucket_bytes < sizeof(float) || cfg->first_bucket_bytes < sizeof(float))
    return td_error(TD_ERR_INVALID_ARGUMENT, "bucket_bytes %zu / first_bucket_bytes %zu: must be at least 4 (e.g. 25M and 1M)",
                    cfg->bucket_bytes, cfg->first_bucket_bytes);
  if (cfg->threads < 0) return td_error(TD_ERR_INVALID_ARGUMENT, "threads_per_rank %d: must be >= 0 (0: automatic)", cfg->threads);
  if (cfg->keep_last < 0)
    return td_error(TD_ERR_INVALID_ARGUMENT, "checkpoint keep_last %d: must be >= 0 (0 keeps every checkpoint)",
                    cfg->keep_last);
  if (cfg->checkpoint_every < 0)
    return td_error(TD_ERR_INVALID_ARGUMENT, "checkpoint save_every %ld: must be >= 0", cfg->checkpoint_every);
  if (cfg->steps_per_print < 0)
    return td_error(TD_ERR_INVALID_ARGUMENT, "steps_per_print %d: must be >= 0", cfg->steps_per_print);
  TD_CHECK(td_precision_config_check(cfg));
  TD_CHECK(td_offload_config_check(cfg));
  td_offload_config_apply(cfg);
  TD_CHECK(tensor_parallel_check(cfg));
  TD_CHECK(pipeline_parallel_check(cfg));
  return TD_OK;
}

/* ---- schedule ---- */

float td_train_lr_at(const td_train_config *cfg, long step) {
  const td_schedule_config *s = &cfg->scheduler;
  double lr = cfg->optimizer.lr;
  if (s->kind == TD_SCHEDULE_CONSTANT) return (float)lr;
  if (step < 0) step = 0;
  /* Warmup reaches the peak on its last step (llm.c's (step+1)/W), so no
   * step is wasted at a near-zero rate. */
  if (step < s->warmup_steps) {
    double frac = (double)(step + 1) / (double)s->warmup_steps;
    return (float)(lr * (s->warmup_start_ratio + (1.0 - s->warmup_start_ratio) * frac));
  }
  if (s->kind == TD_SCHEDULE_WARMUP) return (float)lr;
  long total = s->total_steps ? s->total_steps : cfg->steps;
  if (total <= s->warmup_steps) return (float)(lr * s->min_ratio);
  double progress = (double)(step - s->warmup_steps) / (double)(total - s->warmup_steps);
  if (progress > 1) progress = 1;
  double decay = s->kind == TD_SCHEDULE_WARMUP_COSINE ? 0.5 * (1.0 + cos(M_PI * progress)) : 1.0 - progress;
  return (float)(lr * (s->min_ratio + (1.0 - s->min_ratio) * decay));
}

/* ---- JSON ---- */

#ifdef TD_HAVE_CJSON

/* Levenshtein distance, for "did you mean" suggestions. */
static int edit_distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la > 63 || lb > 63) return 99;
  int prev[64], cur[64];
  for (size_t j = 0; j <= lb; j++) prev[j] = (int)j;
  for (size_t i = 1; i <= la; i++) {
    cur[0] = (int)i;
    for (size_t j = 1; j <= lb; j++) {
      int cost = a[i - 1] == b[j - 1] ? 0 : 1;
      int best = prev[j - 1] + cost;
      if (prev[j] + 1 < best) best = prev[j] + 1;
      if (cur[j - 1] + 1 < best) best = cur[j - 1] + 1;
      cur[j] = best;
    }
    memcpy(prev, cur, sizeof(int) * (lb + 1));
  }
  return prev[lb];
}

typedef struct parse_ctx {
  const char *source;
  td_train_config *cfg;
  /* Absolute WarmupLR bounds resolved against lr once everything is read. */
  double warmup_min_lr, warmup_max_lr;
  int has_warmup_min_lr, has_warmup_max_lr;
} parse_ctx;

/* Check that every key of obj is in `known`; return an error naming the
 * closest known key, or listing them all. */
static td_status check_keys(const parse_ctx *pc, const cJSON *obj, const char *where, const char *const *known,
                            int n_known) {
  const cJSON *item;
  cJSON_ArrayForEach(item, obj) {
    int found = 0;
    for (int i = 0; i < n_known; i++)
      if (strcmp(item->string, known[i]) == 0) found = 1;
    if (found) continue;
    int best = -1, best_d = 99;
    for (int i = 0; i < n_known; i++) {
      int d = edit_distance(item->string, known[i]);
      /* A truncated or extended key ("train_batch", "lr_max") is a likely slip too. */
      if (strlen(item->string) >= 4 && strlen(known[i]) >= 4 &&
          (strstr(known[i], item->string) || strstr(item->string, known[i])))
        d = TD_MIN(d, 1);
      if (d < best_d) best_d = d, best = i;
    }
    int limit = (int)strlen(item->string) / 3;
    if (limit < 2) limit = 2;
    if (best >= 0 && best_d <= limit)
      return td_error(TD_ERR_INVALID_ARGUMENT, "%s: unknown key \"%s\"%s%s; did you mean \"%s\"?", pc->source,
                      item->string, *where ? " in " : "", where, known[best]);
    char list[768];
    size_t len = 0;
    list[0] = '\0';
    for (int i = 0; i < n_known && len + 4 < sizeof list; i++)
      len += (size_t)snprintf(list + len, sizeof list - len, "%s\"%s\"", i ? ", " : "", known[i]);
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: unknown key \"%s\"%s%s; the keys allowed here are %s", pc->source,
                    item->string, *where ? " in " : "", where, list);
  }
  return TD_OK;
}

static td_status get_number(const parse_ctx *pc, const cJSON *item, const char *key, double lo, double hi,
                            double *out) {
  if (!cJSON_IsNumber(item))
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: %s must be a number, e.g. \"%s\": %g", pc->source, key,
                    item->string, lo > 0 ? lo : 1.0);
  double v = item->valuedouble;
  if (!(v >= lo && v <= hi) || !isfinite(v))
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: %s is %g; it must be between %g and %g", pc->source, key, v, lo, hi);
  *out = v;
  return TD_OK;
}

static td_status get_int(const parse_ctx *pc, const cJSON *item, const char *key, long lo, long hi, long *out) {
  if (!cJSON_IsNumber(item) || item->valuedouble != floor(item->valuedouble))
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: %s must be a whole number, e.g. \"%s\": %ld", pc->source, key,
                    item->string, lo > 1 ? lo : 1);
  double v = item->valuedouble;
  if (v < (double)lo || v > (double)hi)
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: %s is %.0f; it must be between %ld and %ld", pc->source, key, v, lo, hi);
  *out = (long)v;
  return TD_OK;
}

static td_status get_bool(const parse_ctx *pc, const cJSON *item, const char *key, int *out) {
  if (!cJSON_IsBool(item))
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: %s must be true or false", pc->source, key);
  *out = cJSON_IsTrue(item) ? 1 : 0;
  return TD_OK;
}

static td_status get_size(const parse_ctx *pc, const cJSON *item, const char *key, size_t *out) {
  if (cJSON_IsNumber(item)) {
    /* Beyond size_t (2^64), the conversion below would be undefined. */
    if (!(item->valuedouble >= 4 && item->valuedouble < 18446744073709551616.0) ||
        item->valuedouble != floor(item->valuedouble))
      return td_error(TD_ERR_INVALID_ARGUMENT,
                      "%s: %s is %g; give a whole number of bytes from 4 to 2^64-1 or a string like \"25M\"",
                      pc->source, key, item->valuedouble);
    *out = (size_t)item->valuedouble;
    return TD_OK;
  }
  if (cJSON_IsString(item) && td_parse_size(item->valuestring, out) == 0 && *out >= 4) return TD_OK;
  return td_error(TD_ERR_INVALID_ARGUMENT, "%s: %s must be a byte count such as 26214400 or \"25M\"", pc->source, key);
}

static td_status get_string(const parse_ctx *pc, const cJSON *item, const char *key, const char **out) {
  if (!cJSON_IsString(item))
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: %s must be a string", pc->source, key);
  *out = item->valuestring;
  return TD_OK;
}

static int name_is(const char *a, const char *b) { return strcasecmp(a, b) == 0; }

static td_status parse_optimizer(parse_ctx *pc, const cJSON *obj) {
  static const char *const keys[] = {"type", "params"};
  if (!cJSON_IsObject(obj))
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "%s: optimizer must be an object, e.g. \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 3e-4}}",
                    pc->source);
  TD_CHECK(check_keys(pc, obj, "optimizer", keys, 2));
  td_optimizer_config *o = &pc->cfg->optimizer;
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(obj, "type");
  if (!type)
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: optimizer needs a \"type\": \"AdamW\" or \"SGD\"", pc->source);
  const char *name = "";
  TD_CHECK(get_string(pc, type, "optimizer.type", &name));
  if (name_is(name, "adamw") || name_is(name, "adam"))
    o->kind = TD_OPTIMIZER_ADAMW;
  else if (name_is(name, "sgd"))
    o->kind = TD_OPTIMIZER_SGD;
  else
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: optimizer type \"%s\" is not supported; use \"AdamW\" or \"SGD\"",
                    pc->source, name);
  const cJSON *params = cJSON_GetObjectItemCaseSensitive(obj, "params");
  if (!params) return TD_OK;
  if (!cJSON_IsObject(params))
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: optimizer.params must be an object, e.g. {\"lr\": 3e-4}", pc->source);
  static const char *const adam_keys[] = {"lr", "betas", "eps", "weight_decay"};
  static const char *const sgd_keys[] = {"lr", "momentum", "weight_decay", "nesterov"};
  if (o->kind == TD_OPTIMIZER_ADAMW)
    TD_CHECK(check_keys(pc, params, "optimizer.params (AdamW)", adam_keys, 4));
  else
    TD_CHECK(check_keys(pc, params, "optimizer.params (SGD)", sgd_keys, 4));
  const cJSON *item;
  cJSON_ArrayForEach(item, params) {
    double v = 0;
    const char *k = item->string;
    if (strcmp(k, "lr") == 0) {
      TD_CHECK(get_number(pc, item, "optimizer.params.lr", 1e-12, 1e3, &v));
      o->lr = (float)v;
    } else if (strcmp(k, "eps") == 0) {
      TD_CHECK(get_number(pc, item, "optimizer.params.eps", 1e-30, 1.0, &v));
      o->eps = (float)v;
    } else if (strcmp(k, "weight_decay") == 0) {
      TD_CHECK(get_number(pc, item, "optimizer.params.weight_decay", 0, 1e3, &v));
      o->weight_decay = (float)v;
    } else if (strcmp(k, "momentum") == 0) {
      TD_CHECK(get_number(pc, item, "optimizer.params.momentum", 0, 0.999999, &v));
      o->momentum = (float)v;
    } else if (strcmp(k, "nesterov") == 0) {
      TD_CHECK(get_bool(pc, item, "optimizer.params.nesterov", &o->nesterov));
    } else if (strcmp(k, "betas") == 0) {
      if (!cJSON_IsArray(item) || cJSON_GetArraySize(item) != 2)
        return td_error(TD_ERR_INVALID_ARGUMENT, "%s: optimizer.params.betas must be a list of two numbers, e.g. [0.9, 0.999]",
                        pc->source);
      double b1 = 0, b2 = 0;
      TD_CHECK(get_number(pc, cJSON_GetArrayItem(item, 0), "optimizer.params.betas[0]", 0, 0.999999, &b1));
      TD_CHECK(get_number(pc, cJSON_GetArrayItem(item, 1), "optimizer.params.betas[1]", 0, 0.999999999, &b2));
      o->beta1 = (float)b1;
      o->beta2 = (float)b2;
    }
  }
  return TD_OK;
}

static td_status parse_scheduler(parse_ctx *pc, const cJSON *obj) {
  static const char *const keys[] = {"type", "params"};
  if (!cJSON_IsObject(obj))
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "%s: scheduler must be an object, e.g. \"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": "
                    "{\"warmup_num_steps\": 100, \"total_num_steps\": 1000}}",
                    pc->source);
  TD_CHECK(check_keys(pc, obj, "scheduler", keys, 2));
  td_schedule_config *s = &pc->cfg->scheduler;
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(obj, "type");
  if (!type)
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "%s: scheduler needs a \"type\": \"WarmupLR\", \"WarmupCosineLR\", \"WarmupDecayLR\" or \"Constant\"",
                    pc->source);
  const char *name = "";
  TD_CHECK(get_string(pc, type, "scheduler.type", &name));
  static const char *const warmup_keys[] = {"warmup_num_steps", "warmup_min_lr", "warmup_max_lr", "warmup_type"};
  static const char *const decay_keys[] = {"warmup_num_steps", "warmup_min_lr", "warmup_max_lr", "warmup_type",
                                           "total_num_steps"};
  static const char *const cosine_keys[] = {"warmup_num_steps", "total_num_steps", "warmup_min_ratio",
                                            "cos_min_ratio", "warmup_type"};
  const char *const *allowed;
  int n_allowed;
  if (strcmp(name, "WarmupLR") == 0) {
    s->kind = TD_SCHEDULE_WARMUP, allowed = warmup_keys, n_allowed = 4;
  } else if (strcmp(name, "WarmupDecayLR") == 0) {
    s->kind = TD_SCHEDULE_WARMUP_LINEAR, allowed = decay_keys, n_allowed = 5;
    s->min_ratio = 0;
  } else if (strcmp(name, "WarmupCosineLR") == 0) {
    s->kind = TD_SCHEDULE_WARMUP_COSINE, allowed = cosine_keys, n_allowed = 5;
  } else if (name_is(name, "constant") || name_is(name, "none")) {
    s->kind = TD_SCHEDULE_CONSTANT, allowed = NULL, n_allowed = 0;
  } else {
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "%s: scheduler type \"%s\" is not supported; use \"WarmupLR\", \"WarmupCosineLR\", "
                    "\"WarmupDecayLR\" or \"Constant\"",
                    pc->source, name);
  }
  const cJSON *params = cJSON_GetObjectItemCaseSensitive(obj, "params");
  if (!params) return TD_OK;
  if (!cJSON_IsObject(params))
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: scheduler.params must be an object", pc->source);
  char where[64];
  snprintf(where, sizeof where, "scheduler.params (%s)", name);
  TD_CHECK(check_keys(pc, params, where, allowed, n_allowed));
  const cJSON *item;
  cJSON_ArrayForEach(item, params) {
    const char *k = item->string;
    long n = 0;
    double v = 0;
    if (strcmp(k, "warmup_num_steps") == 0) {
      TD_CHECK(get_int(pc, item, "scheduler.params.warmup_num_steps", 0, 1L << 40, &n));
      s->warmup_steps = n;
    } else if (strcmp(k, "total_num_steps") == 0) {
      TD_CHECK(get_int(pc, item, "scheduler.params.total_num_steps", 0, 1L << 40, &n));
      s->total_steps = n;
    } else if (strcmp(k, "warmup_min_ratio") == 0) {
      TD_CHECK(get_number(pc, item, "scheduler.params.warmup_min_ratio", 0, 1, &v));
      s->warmup_start_ratio = (float)v;
    } else if (strcmp(k, "cos_min_ratio") == 0) {
      TD_CHECK(get_number(pc, item, "scheduler.params.cos_min_ratio", 0, 1, &v));
      s->min_ratio = (float)v;
    } else if (strcmp(k, "warmup_min_lr") == 0) {
      TD_CHECK(get_number(pc, item, "scheduler.params.warmup_min_lr", 0, 1e3, &pc->warmup_min_lr));
      pc->has_warmup_min_lr = 1;
    } else if (strcmp(k, "warmup_max_lr") == 0) {
      TD_CHECK(get_number(pc, item, "scheduler.params.warmup_max_lr", 1e-12, 1e3, &pc->warmup_max_lr));
      pc->has_warmup_max_lr = 1;
    } else if (strcmp(k, "warmup_type") == 0) {
      const char *wt = "";
      TD_CHECK(get_string(pc, item, "scheduler.params.warmup_type", &wt));
      if (strcmp(wt, "linear") != 0)
        return td_error(TD_ERR_INVALID_ARGUMENT,
                        "%s: scheduler.params.warmup_type \"%s\" is not supported; only \"linear\" is (or leave it out)",
                        pc->source, wt);
    }
  }
  return TD_OK;
}

static td_status parse_checkpoint(parse_ctx *pc, const cJSON *obj) {
  static const char *const keys[] = {"save_dir", "save_every", "keep_last", "allow_batch_size_change"};
  if (!cJSON_IsObject(obj))
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "%s: checkpoint must be an object, e.g. \"checkpoint\": {\"save_dir\": \"ckpt\", \"save_every\": 100}",
                    pc->source);
  TD_CHECK(check_keys(pc, obj, "checkpoint", keys, 4));
  const cJSON *item;
  cJSON_ArrayForEach(item, obj) {
    if (strcmp(item->string, "save_dir") == 0) {
      const char *dir = "";
      TD_CHECK(get_string(pc, item, "checkpoint.save_dir", &dir));
      if (strlen(dir) >= sizeof pc->cfg->checkpoint_dir)
        return td_error(TD_ERR_INVALID_ARGUMENT, "%s: checkpoint.save_dir is longer than %zu characters", pc->source,
                        sizeof pc->cfg->checkpoint_dir - 1);
      td_strlcpy(pc->cfg->checkpoint_dir, dir, sizeof pc->cfg->checkpoint_dir);
    } else if (strcmp(item->string, "keep_last") == 0) {
      long n = 0;
      TD_CHECK(get_int(pc, item, "checkpoint.keep_last", 0, 1L << 30, &n));
      pc->cfg->keep_last = (int)n;
    } else if (strcmp(item->string, "allow_batch_size_change") == 0) {
      int on = 0;
      TD_CHECK(get_bool(pc, item, "checkpoint.allow_batch_size_change", &on));
      pc->cfg->allow_batch_size_change = on;
    } else {
      long n = 0;
      TD_CHECK(get_int(pc, item, "checkpoint.save_every", 0, 1L << 40, &n));
      pc->cfg->checkpoint_every = n;
    }
  }
  return TD_OK;
}

/* zero_optimization: DeepSpeed's stage and stage-3 knobs (src/train/zero/).
 * DeepSpeed's other keys of the section that only tune its own buffers are
 * accepted and ignored where Tandem has no such buffer, so that ds_config
 * files load; anything else is an unknown key. */
static td_status parse_zero(parse_ctx *pc, const cJSON *obj) {
  static const char *const keys[] = {"stage", "stage3_prefetch_bucket_size", "stage3_max_live_parameters",
                                     "stage3_param_persistence_threshold", "overlap_comm", "contiguous_gradients",
                                     "reduce_scatter", "reduce_bucket_size", "allgather_bucket_size",
                                     "allgather_partitions", "offload_optimizer", "offload_param", "sub_group_size"};
  if (!cJSON_IsObject(obj))
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "%s: zero_optimization must be an object, e.g. \"zero_optimization\": {\"stage\": 2}", pc->source);
  TD_CHECK(check_keys(pc, obj, "zero_optimization", keys, (int)TD_ARRAY_SIZE(keys)));
  const cJSON *item;
  cJSON_ArrayForEach(item, obj) {
    long n = 0;
    if (strcmp(item->string, "stage") == 0) {
      TD_CHECK(get_int(pc, item, "zero_optimization.stage", 0, 3, &n));
      pc->cfg->zero_stage = (int)n;
    } else if (strcmp(item->string, "stage3_prefetch_bucket_size") == 0) {
      TD_CHECK(get_int(pc, item, "zero_optimization.stage3_prefetch_bucket_size", 0, 1L << 50, &n));
      pc->cfg->stage3_prefetch_bucket_size = n;
      pc->cfg->knobs_set |= TD_KNOB_STAGE3_PREFETCH;
    } else if (strcmp(item->string, "stage3_max_live_parameters") == 0) {
      TD_CHECK(get_int(pc, item, "zero_optimization.stage3_max_live_parameters", 0, 1L << 50, &n));
      pc->cfg->stage3_max_live_parameters = n;
      pc->cfg->knobs_set |= TD_KNOB_STAGE3_MAX_LIVE;
    } else if (strcmp(item->string, "stage3_param_persistence_threshold") == 0) {
      TD_CHECK(get_int(pc, item, "zero_optimization.stage3_param_persistence_threshold", 0, 1L << 50, &n));
      pc->cfg->stage3_param_persistence_threshold = n;
    } else if (strcmp(item->string, "offload_optimizer") == 0 || strcmp(item->string, "offload_param") == 0 ||
               strcmp(item->string, "sub_group_size") == 0) {
      TD_CHECK(td_offload_parse_json(item, pc->source, pc->cfg)); /* src/train/offload/offload_config.c */
    }
  }
  return TD_OK;
}

/* "pipeline": DeepSpeed's section name, with its "stages" and
 * PipelineModule's partition_method, plus the schedule and the chunks per
 * stage (Megatron-LM's interleaving). */
static td_status parse_pipeline(parse_ctx *pc, const cJSON *obj) {
  static const char *const keys[] = {"stages", "partition_method", "schedule", "chunks"};
  if (!cJSON_IsObject(obj))
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "%s: pipeline must be an object, e.g. \"pipeline\": {\"stages\": 2, \"partition_method\": "
                    "\"parameters\"}",
                    pc->source);
  TD_CHECK(check_keys(pc, obj, "pipeline", keys, (int)TD_ARRAY_SIZE(keys)));
  const cJSON *item;
  cJSON_ArrayForEach(item, obj) {
    long n = 0;
    const char *str = "";
    if (strcmp(item->string, "stages") == 0) {
      TD_CHECK(get_int(pc, item, "pipeline.stages", 1, 4096, &n));
      pc->cfg->pipeline_parallel = (int)n;
    } else if (strcmp(item->string, "chunks") == 0) {
      TD_CHECK(get_int(pc, item, "pipeline.chunks", 1, 64, &n));
      pc->cfg->pipeline_chunks = (int)n;
    } else {
      int is_schedule = strcmp(item->string, "schedule") == 0;
      TD_CHECK(get_string(pc, item, is_schedule ? "pipeline.schedule" : "pipeline.partition_method", &str));
      char *dst = is_schedule ? pc->cfg->pipeline_schedule : pc->cfg->pipeline_partition;
      if (strlen(str) >= 16)
        return td_error(TD_ERR_INVALID_ARGUMENT, "%s: pipeline.%s \"%s\": use %s", pc->source, item->string, str,
                        is_schedule ? "\"1f1b\" or \"interleaved\"" : "\"uniform\" or \"parameters\"");
      td_strlcpy(dst, str, 16);
    }
  }
  return TD_OK;
}

static td_status parse_root(parse_ctx *pc, const cJSON *root) {
  static const char *const keys[] = {
      "train_batch_size", "train_micro_batch_size_per_gpu", "train_micro_batch_size_per_rank",
      "gradient_accumulation_steps", "train_steps", "seed", "gradient_clipping", "steps_per_print",
      "threads_per_rank", "bucket_bytes", "first_bucket_bytes", "optimizer", "scheduler", "checkpoint",
      "fp16", "bf16", "zero_optimization", "communication_data_type", "activation_checkpointing", "elasticity", "aio",
      "deterministic_reduction", "deterministic_unit", "device", "tensor_model_parallel_size",
      "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size", "pipeline", "sequence_parallel"};
  if (!cJSON_IsObject(root))
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: the config must be a JSON object ({ ... })", pc->source);
  TD_CHECK(check_keys(pc, root, "", keys, (int)TD_ARRAY_SIZE(keys)));
  if (cJSON_GetObjectItemCaseSensitive(root, "train_micro_batch_size_per_gpu") &&
      cJSON_GetObjectItemCaseSensitive(root, "train_micro_batch_size_per_rank"))
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "%s: give train_micro_batch_size_per_gpu or its alias train_micro_batch_size_per_rank, not both",
                    pc->source);
  td_train_config *cfg = pc->cfg;
  const cJSON *item;
  cJSON_ArrayForEach(item, root) {
    const char *k = item->string;
    long n = 0;
    double v = 0;
    if (strcmp(k, "train_batch_size") == 0) {
      TD_CHECK(get_int(pc, item, k, 1, 1L << 40, &n));
      cfg->train_batch_size = n;
    } else if (strncmp(k, "train_micro_batch_size_per_", 27) == 0) {
      TD_CHECK(get_int(pc, item, k, 1, 1L << 30, &n));
      cfg->micro_batch = (int)n;
    } else if (strcmp(k, "gradient_accumulation_steps") == 0) {
      TD_CHECK(get_int(pc, item, k, 1, 1L << 30, &n));
      cfg->grad_accum = (int)n;
    } else if (strcmp(k, "train_steps") == 0) {
      TD_CHECK(get_int(pc, item, k, 0, 1L << 40, &n));
      cfg->steps = n;
    } else if (strcmp(k, "seed") == 0) {
      TD_CHECK(get_int(pc, item, k, 0, 1L << 53, &n));
      cfg->seed = (uint64_t)n;
    } else if (strcmp(k, "gradient_clipping") == 0) {
      TD_CHECK(get_number(pc, item, k, 0, 1e30, &v));
      cfg->grad_clip = (float)v;
    } else if (strcmp(k, "steps_per_print") == 0) {
      TD_CHECK(get_int(pc, item, k, 0, 1L << 30, &n));
      cfg->steps_per_print = (int)n;
    } else if (strcmp(k, "threads_per_rank") == 0) {
      TD_CHECK(get_int(pc, item, k, 0, 4096, &n));
      cfg->threads = (int)n;
    } else if (strcmp(k, "bucket_bytes") == 0) {
      TD_CHECK(get_size(pc, item, k, &cfg->bucket_bytes));
      cfg->knobs_set |= TD_KNOB_BUCKET_BYTES;
    } else if (strcmp(k, "first_bucket_bytes") == 0) {
      TD_CHECK(get_size(pc, item, k, &cfg->first_bucket_bytes));
    } else if (strcmp(k, "optimizer") == 0) {
      TD_CHECK(parse_optimizer(pc, item));
    } else if (strcmp(k, "scheduler") == 0) {
      TD_CHECK(parse_scheduler(pc, item));
    } else if (strcmp(k, "checkpoint") == 0) {
      TD_CHECK(parse_checkpoint(pc, item));
    } else if (strcmp(k, "fp16") == 0 || strcmp(k, "bf16") == 0 || strcmp(k, "communication_data_type") == 0 ||
               strcmp(k, "activation_checkpointing") == 0) {
      TD_CHECK(td_precision_parse_json(item, pc->source, cfg)); /* src/train/precision/precision_config.c */
    } else if (strcmp(k, "zero_optimization") == 0) {
      TD_CHECK(parse_zero(pc, item));
    } else if (strcmp(k, "elasticity") == 0) {
      TD_CHECK(td_elasticity_parse_json(item, pc->source, cfg)); /* src/train/elastic/elastic_config.c */
    } else if (strcmp(k, "aio") == 0) {
      TD_CHECK(td_offload_parse_json(item, pc->source, cfg)); /* src/train/offload/offload_config.c */
    } else if (strcmp(k, "device") == 0) {
      td_device dev;
      if (!cJSON_IsString(item) || strlen(item->valuestring) >= sizeof cfg->device ||
          td_device_parse(item->valuestring, &dev) != TD_OK)
        return td_error(TD_ERR_INVALID_ARGUMENT, "%s: \"device\" must be \"cpu\", \"cuda\" or \"cuda:N\"",
                        pc->source);
      snprintf(cfg->device, sizeof cfg->device, "%s", item->valuestring);
    } else if (strcmp(k, "tensor_model_parallel_size") == 0) {
      TD_CHECK(get_int(pc, item, k, 1, 4096, &n));
      cfg->tensor_parallel = (int)n;
    } else if (strcmp(k, "pipeline_model_parallel_size") == 0) {
      TD_CHECK(get_int(pc, item, k, 1, 4096, &n));
      cfg->pipeline_parallel = (int)n;
    } else if (strcmp(k, "virtual_pipeline_model_parallel_size") == 0) {
      TD_CHECK(get_int(pc, item, k, 1, 64, &n));
      cfg->pipeline_chunks = (int)n;
    } else if (strcmp(k, "pipeline") == 0) {
      TD_CHECK(parse_pipeline(pc, item));
    } else if (strcmp(k, "sequence_parallel") == 0) {
      if (!cJSON_IsBool(item))
        return td_error(TD_ERR_INVALID_ARGUMENT, "%s: \"sequence_parallel\" must be true or false", pc->source);
      cfg->sequence_parallel = cJSON_IsTrue(item);
    } else if (strncmp(k, "deterministic_", 14) == 0) {
      TD_CHECK(td_deterministic_parse_json(item, pc->source, cfg)); /* src/train/deterministic/deterministic_config.c */
    }
  }
  if (cfg->elasticity.enabled) TD_CHECK(td_elasticity_apply(root, pc->source, cfg));
  /* WarmupLR gives absolute rates; the config keeps fractions of the peak so
   * that a later --lr flag moves the whole schedule. */
  if (pc->has_warmup_max_lr) cfg->optimizer.lr = (float)pc->warmup_max_lr;
  if (pc->has_warmup_min_lr) {
    if (pc->warmup_min_lr > cfg->optimizer.lr)
      return td_error(TD_ERR_INVALID_ARGUMENT,
                      "%s: scheduler.params.warmup_min_lr %g is above the peak lr %g; warmup starts low and rises",
                      pc->source, pc->warmup_min_lr, (double)cfg->optimizer.lr);
    cfg->scheduler.warmup_start_ratio = (float)(pc->warmup_min_lr / cfg->optimizer.lr);
  }
  return TD_OK;
}

td_status td_train_config_parse_json(const char *text, const char *source, td_train_config *cfg) {
  if (!text || !cfg) return td_error(TD_ERR_INVALID_ARGUMENT, "td_train_config_parse_json: null text or config");
  return td_train_config_parse_json_buffer(text, strlen(text), source, cfg);
}

td_status td_train_config_parse_json_buffer(const char *text, size_t len, const char *source, td_train_config *cfg) {
  if ((!text && len) || !cfg)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_train_config_parse_json_buffer: null data or config");
  if (!source) source = "config";
  if (len && memchr(text, '\0', len))
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: the config holds a NUL byte at offset %zu; is it a text file?",
                    source, (size_t)((const char *)memchr(text, '\0', len) - text));
  cJSON *root = cJSON_ParseWithLength(text ? text : "", len);
  if (!root) {
    const char *at = cJSON_GetErrorPtr();
    int line = 1, col = 1;
    if (at && text && at >= text && at <= text + len) {
      for (const char *p = text; p < at; p++) {
        if (*p == '\n') line++, col = 1;
        else col++;
      }
    }
    /* The excerpt is bounded by the buffer: it need not be NUL-terminated. */
    char near[21] = "";
    if (at && text && at >= text && at <= text + len) {
      size_t k = TD_MIN((size_t)(text + len - at), sizeof near - 1);
      memcpy(near, at, k);
      near[k] = '\0';
    }
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s:%d:%d: not valid JSON near \"%s\" (check commas, quotes and braces)",
                    source, line, col, near);
  }
  /* Parse into a copy so that a failure leaves cfg unchanged. */
  td_train_config work = *cfg;
  parse_ctx pc = {.source = source, .cfg = &work};
  td_status st = parse_root(&pc, root);
  cJSON_Delete(root);
  if (st == TD_OK) *cfg = work;
  return st;
}

#else

td_status td_train_config_parse_json_buffer(const char *text, size_t len, const char *source, td_train_config *cfg) {
  (void)text, (void)len, (void)cfg;
  return td_train_config_parse_json(NULL, source, NULL);
}

td_status td_train_config_parse_json(const char *text, const char *source, td_train_config *cfg) {
  return td_error(TD_ERR_INVALID_USAGE,
                  "%s: config files need cJSON, which was not found when Tandem was built; apt-get install "
                  "libcjson-dev and rebuild",
                  source ? source : "config");
}

#endif

td_status td_train_config_load_json(const char *path, td_train_config *cfg) {
  if (!path || !cfg) return td_error(TD_ERR_INVALID_ARGUMENT, "td_train_config_load_json: null path or config");
  FILE *f = fopen(path, "rb");
  if (!f) return td_error(TD_ERR_IO, "cannot open config file %s: %s", path, strerror(errno));
  td_buf text = {0};
  int failed = td_buf_append_file(&text, f, 64u << 20);
  fclose(f);
  td_status st;
  if (text.failed) st = td_error(TD_ERR_SYSTEM, "out of memory reading %s", path);
  else if (failed) st = td_error(TD_ERR_IO, "cannot read config file %s", path);
  else if (text.len > (64u << 20))
    st = td_error(TD_ERR_IO, "config file %s is larger than 64 MiB; is it the right file?", path);
  else st = td_train_config_parse_json_buffer(text.data, text.len, path, cfg);
  td_buf_free(&text);
  return st;
}
