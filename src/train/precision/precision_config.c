/* The mixed-precision and activation-checkpointing keys of the training
 * config, with DeepSpeed's ds_config names and meanings:
 *
 *   "bf16": {"enabled": true}
 *   "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 16,
 *            "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1}
 *   "communication_data_type": "fp32" | "bf16" | "fp16"
 *   "activation_checkpointing": {"enabled": true, ...}
 *
 * loss_scale 0 means dynamic scaling (DeepSpeed's default). An
 * activation_checkpointing object switches checkpointing on unless it says
 * "enabled": false (DeepSpeed switches it on from model code; here the
 * engine does it for the models that support it). Its DeepSpeed options
 * that Tandem does not implement (partition_activations, cpu_checkpointing,
 * synchronize_checkpoint_boundary, profile) are refused when true. */
#include "train/precision/precision.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#ifdef TD_HAVE_CJSON
#include <cjson/cJSON.h>
#endif

void td_precision_config_defaults(td_precision_config *p) {
  memset(p, 0, sizeof *p);
  p->compute = TD_F32;
  p->comm_dtype = TD_F32;
  p->loss_scale = 0.0f;
  p->initial_scale_power = 16;
  p->loss_scale_window = 1000;
  p->hysteresis = 2;
  p->min_loss_scale = 1.0f;
}

td_status td_precision_config_check(const td_train_config *cfg) {
  const td_precision_config *p = &cfg->precision;
  if (p->compute != TD_F32 && p->compute != TD_BF16 && p->compute != TD_F16)
    return td_error(TD_ERR_INVALID_ARGUMENT, "precision: compute type %s: use f32, bf16 or fp16",
                    td_dtype_name(p->compute));
  if (p->comm_dtype != TD_F32 && p->comm_dtype != TD_BF16 && p->comm_dtype != TD_F16)
    return td_error(TD_ERR_INVALID_ARGUMENT, "communication_data_type %s: use \"fp32\", \"bf16\" or \"fp16\"",
                    td_dtype_name(p->comm_dtype));
  if (!(p->loss_scale >= 0.0f) || !isfinite(p->loss_scale))
    return td_error(TD_ERR_INVALID_ARGUMENT, "fp16.loss_scale %g: must be >= 0 (0: dynamic)", (double)p->loss_scale);
  if (p->initial_scale_power < 0 || p->initial_scale_power > 126)
    return td_error(TD_ERR_INVALID_ARGUMENT, "fp16.initial_scale_power %d: must be in [0, 126] (e.g. 16)",
                    p->initial_scale_power);
  if (p->loss_scale_window < 1)
    return td_error(TD_ERR_INVALID_ARGUMENT, "fp16.loss_scale_window %d: must be >= 1 (e.g. 1000)",
                    p->loss_scale_window);
  if (p->hysteresis < 1)
    return td_error(TD_ERR_INVALID_ARGUMENT, "fp16.hysteresis %d: must be >= 1 (e.g. 2)", p->hysteresis);
  if (!(p->min_loss_scale > 0.0f) || !isfinite(p->min_loss_scale))
    return td_error(TD_ERR_INVALID_ARGUMENT, "fp16.min_loss_scale %g: must be > 0 (e.g. 1)",
                    (double)p->min_loss_scale);
  if (cfg->activation_checkpointing != 0 && cfg->activation_checkpointing != 1)
    return td_error(TD_ERR_INVALID_ARGUMENT, "activation_checkpointing %d: must be 0 or 1",
                    cfg->activation_checkpointing);
  return TD_OK;
}

#ifdef TD_HAVE_CJSON
static int known(const char *key, const char *const *keys, int n) {
  for (int i = 0; i < n; i++)
    if (strcmp(key, keys[i]) == 0) return 1;
  return 0;
}

static td_status unknown_key(const char *source, const char *where, const char *key, const char *const *keys, int n) {
  char list[256];
  size_t len = 0;
  list[0] = '\0';
  for (int i = 0; i < n && len + 4 < sizeof list; i++)
    len += (size_t)snprintf(list + len, sizeof list - len, "%s\"%s\"", i ? ", " : "", keys[i]);
  return td_error(TD_ERR_INVALID_ARGUMENT, "%s: unknown key \"%s\" in %s; the keys allowed there are %s", source, key,
                  where, list);
}

static td_status get_bool(const char *source, const char *where, const cJSON *item, int *out) {
  if (!cJSON_IsBool(item))
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: %s.%s must be true or false", source, where, item->string);
  *out = cJSON_IsTrue(item);
  return TD_OK;
}

static td_status get_num(const char *source, const char *where, const cJSON *item, int whole, double lo, double hi,
                         double *out) {
  if (!cJSON_IsNumber(item) || (whole && item->valuedouble != floor(item->valuedouble)) || item->valuedouble < lo ||
      item->valuedouble > hi)
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: %s.%s must be a %s in [%g, %g]", source, where, item->string,
                    whole ? "whole number" : "number", lo, hi);
  *out = item->valuedouble;
  return TD_OK;
}

static td_status parse_half(const cJSON *obj, const char *source, const char *where, td_train_config *cfg) {
  static const char *const bf16_keys[] = {"enabled"};
  static const char *const fp16_keys[] = {"enabled",           "loss_scale", "initial_scale_power",
                                          "loss_scale_window", "hysteresis", "min_loss_scale"};
  int is_fp16 = strcmp(where, "fp16") == 0;
  const char *const *keys = is_fp16 ? fp16_keys : bf16_keys;
  int n_keys = is_fp16 ? (int)TD_ARRAY_SIZE(fp16_keys) : (int)TD_ARRAY_SIZE(bf16_keys);
  if (!cJSON_IsObject(obj))
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: %s must be an object, e.g. \"%s\": {\"enabled\": true}", source,
                    where, where);
  td_precision_config *p = &cfg->precision;
  int enabled = 0;
  const cJSON *item;
  cJSON_ArrayForEach(item, obj) {
    const char *k = item->string;
    double v = 0;
    if (!known(k, keys, n_keys)) return unknown_key(source, where, k, keys, n_keys);
    if (strcmp(k, "enabled") == 0) {
      TD_CHECK(get_bool(source, where, item, &enabled));
    } else if (strcmp(k, "loss_scale") == 0) {
      TD_CHECK(get_num(source, where, item, 0, 0, 1e30, &v));
      p->loss_scale = (float)v;
    } else if (strcmp(k, "initial_scale_power") == 0) {
      TD_CHECK(get_num(source, where, item, 1, 0, 126, &v));
      p->initial_scale_power = (int)v;
    } else if (strcmp(k, "loss_scale_window") == 0) {
      TD_CHECK(get_num(source, where, item, 1, 1, 1 << 30, &v));
      p->loss_scale_window = (int)v;
    } else if (strcmp(k, "hysteresis") == 0) {
      TD_CHECK(get_num(source, where, item, 1, 1, 1 << 30, &v));
      p->hysteresis = (int)v;
    } else if (strcmp(k, "min_loss_scale") == 0) {
      TD_CHECK(get_num(source, where, item, 0, 1e-30, 1e30, &v));
      p->min_loss_scale = (float)v;
    }
  }
  td_dtype mine = is_fp16 ? TD_F16 : TD_BF16, other = is_fp16 ? TD_BF16 : TD_F16;
  if (enabled) {
    if (p->compute == other)
      return td_error(TD_ERR_INVALID_ARGUMENT, "%s: fp16 and bf16 are both enabled; enable one of them", source);
    p->compute = mine;
  } else if (p->compute == mine) {
    p->compute = TD_F32;
  }
  return TD_OK;
}

static td_status parse_checkpointing(const cJSON *obj, const char *source, td_train_config *cfg) {
  static const char *const keys[] = {"enabled",           "partition_activations",           "cpu_checkpointing",
                                     "number_checkpoints", "contiguous_memory_optimization", "synchronize_checkpoint_boundary",
                                     "profile"};
  const char *where = "activation_checkpointing";
  if (!cJSON_IsObject(obj))
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: activation_checkpointing must be an object, e.g. {\"enabled\": true}",
                    source);
  int enabled = 1;
  const cJSON *item;
  cJSON_ArrayForEach(item, obj) {
    const char *k = item->string;
    if (!known(k, keys, (int)TD_ARRAY_SIZE(keys))) return unknown_key(source, where, k, keys, (int)TD_ARRAY_SIZE(keys));
    if (strcmp(k, "enabled") == 0) {
      TD_CHECK(get_bool(source, where, item, &enabled));
    } else if (strcmp(k, "number_checkpoints") == 0) {
      /* DeepSpeed's count of checkpointed layers for its own bookkeeping;
       * here every transformer block is one checkpoint */
      if (!cJSON_IsNull(item) && !cJSON_IsNumber(item))
        return td_error(TD_ERR_INVALID_ARGUMENT, "%s: %s.number_checkpoints must be a number or null", source, where);
    } else if (strcmp(k, "contiguous_memory_optimization") == 0) {
      int on = 0;
      TD_CHECK(get_bool(source, where, item, &on)); /* the kept block inputs are one buffer either way */
    } else {
      int on = 0;
      TD_CHECK(get_bool(source, where, item, &on));
      if (on)
        return td_error(TD_ERR_INVALID_ARGUMENT,
                        "%s: %s.%s is not supported (each rank keeps its blocks' inputs in its own memory); set it to "
                        "false or remove it",
                        source, where, k);
    }
  }
  cfg->activation_checkpointing = enabled;
  return TD_OK;
}

td_status td_precision_parse_json(const void *item_ptr, const char *source, td_train_config *cfg) {
  const cJSON *item = item_ptr;
  const char *k = item->string;
  if (strcmp(k, "bf16") == 0 || strcmp(k, "fp16") == 0) return parse_half(item, source, k, cfg);
  if (strcmp(k, "activation_checkpointing") == 0) return parse_checkpointing(item, source, cfg);
  if (strcmp(k, "communication_data_type") == 0) {
    const char *s = cJSON_IsString(item) ? item->valuestring : NULL;
    if (s && (strcmp(s, "fp32") == 0 || strcmp(s, "float32") == 0)) cfg->precision.comm_dtype = TD_F32;
    else if (s && (strcmp(s, "bf16") == 0 || strcmp(s, "bfloat16") == 0)) cfg->precision.comm_dtype = TD_BF16;
    else if (s && (strcmp(s, "fp16") == 0 || strcmp(s, "float16") == 0)) cfg->precision.comm_dtype = TD_F16;
    else
      return td_error(TD_ERR_INVALID_ARGUMENT, "%s: communication_data_type must be \"fp32\", \"bf16\" or \"fp16\"",
                      source);
    return TD_OK;
  }
  return td_error(TD_ERR_INTERNAL, "%s: td_precision_parse_json called for key \"%s\"", source, k);
}
#endif
