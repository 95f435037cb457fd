/* The offload keys of the training config, with DeepSpeed's ds_config names
 * and meanings (docs/zero.md, "NVMe offload"):
 *
 *   "zero_optimization": {
 *     "stage": 3,
 *     "sub_group_size": 1e9,
 *     "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme",
 *                           "buffer_count": 4, "pin_memory": false},
 *     "offload_param": {"device": "nvme", "nvme_path": "/local_nvme",
 *                       "buffer_count": 5, "buffer_size": 1e8,
 *                       "max_in_cpu": 1e9, "pin_memory": false}},
 *   "aio": {"block_size": 1048576, "queue_depth": 8, "thread_count": 1,
 *           "single_submit": false, "overlap_events": true}
 *
 * device "cpu" is accepted: on this CPU-only build the state already lives
 * in host memory, so it means what "none" means. single_submit and
 * overlap_events tune DeepSpeed's libaio loop; Tandem's engine always
 * submits in batches and overlaps, so they are accepted as booleans only. */
#include "train/offload/offload.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#ifdef TD_HAVE_CJSON
#include <cjson/cJSON.h>
#endif

void td_offload_config_defaults(td_offload_config *o) {
  memset(o, 0, sizeof *o);
  o->optimizer_device = TD_OFFLOAD_NONE;
  o->optimizer_buffer_count = 4;
  o->param_device = TD_OFFLOAD_NONE;
  o->param_buffer_count = 5;
  o->param_buffer_size = 100000000;
  o->param_max_in_cpu = 1000000000;
  o->sub_group_size = 0; /* unset: chosen from the shard and the memory (td_offload_config_fit) */
  o->aio_block_size = 1 << 20;
  o->aio_queue_depth = 8;
  o->aio_thread_count = 1;
}

td_status td_offload_config_check(const td_train_config *cfg) {
  const td_offload_config *o = &cfg->offload;
  if ((unsigned)o->optimizer_device > TD_OFFLOAD_NVME || (unsigned)o->param_device > TD_OFFLOAD_NVME)
    return td_error(TD_ERR_INVALID_ARGUMENT, "offload device: use none, cpu or nvme");
  bool opt = o->optimizer_device == TD_OFFLOAD_NVME, par = o->param_device == TD_OFFLOAD_NVME;
  if ((opt || par) && cfg->zero_stage != 3)
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "zero_optimization.offload_%s.device \"nvme\" needs ZeRO stage 3 (zero_optimization.stage is %d): "
                    "set \"stage\": 3 (--zero-stage 3) or device \"none\"",
                    opt ? "optimizer" : "param", cfg->zero_stage);
  if (opt && !o->optimizer_nvme_path[0])
    return td_error(TD_ERR_INVALID_ARGUMENT, "zero_optimization.offload_optimizer: device \"nvme\" needs \"nvme_path\", "
                    "a directory on a fast local disk");
  if (par && !o->param_nvme_path[0])
    return td_error(TD_ERR_INVALID_ARGUMENT, "zero_optimization.offload_param: device \"nvme\" needs \"nvme_path\", "
                    "a directory on a fast local disk");
  if (opt && par && strcmp(o->optimizer_nvme_path, o->param_nvme_path) != 0)
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "offload_optimizer.nvme_path \"%s\" and offload_param.nvme_path \"%s\" differ: Tandem keeps the "
                    "master weights and the parameters in one file (they are the same f32 values), so give both the "
                    "same path", o->optimizer_nvme_path, o->param_nvme_path);
  if (par && !opt)
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "offload_param \"nvme\" without offload_optimizer \"nvme\": the optimizer would have to read the "
                    "parameters back into RAM; offload both (as DeepSpeed's ZeRO-Infinity does) or set offload_param "
                    "to \"none\"");
  if (o->optimizer_buffer_count < 1 || o->optimizer_buffer_count > 64)
    return td_error(TD_ERR_INVALID_ARGUMENT, "offload_optimizer.buffer_count %d: must be in [1, 64] (4: reads ahead "
                    "and writes behind the tile being updated)", o->optimizer_buffer_count);
  if (o->param_buffer_count < 1 || o->param_buffer_size < 1 || o->param_max_in_cpu < 1)
    return td_error(TD_ERR_INVALID_ARGUMENT, "offload_param: buffer_count, buffer_size and max_in_cpu must be >= 1");
  if (o->sub_group_size < 0)
    return td_error(TD_ERR_INVALID_ARGUMENT, "zero_optimization.sub_group_size %ld: must be >= 1 (e.g. 1e9), or "
                    "left out to have it chosen from the memory", o->sub_group_size);
  if (o->aio_block_size < TD_AIO_ALIGN || o->aio_block_size % TD_AIO_ALIGN != 0 || o->aio_block_size > (1u << 30))
    return td_error(TD_ERR_INVALID_ARGUMENT, "aio.block_size %zu: must be a multiple of %d up to 1 GiB (e.g. 1048576)",
                    o->aio_block_size, TD_AIO_ALIGN);
  if (o->aio_queue_depth < 1 || o->aio_queue_depth > 4096)
    return td_error(TD_ERR_INVALID_ARGUMENT, "aio.queue_depth %d: must be in [1, 4096] (e.g. 8)", o->aio_queue_depth);
  if (o->aio_thread_count < 1 || o->aio_thread_count > 256)
    return td_error(TD_ERR_INVALID_ARGUMENT, "aio.thread_count %d: must be in [1, 256]", o->aio_thread_count);
  return TD_OK;
}

void td_offload_config_apply(td_train_config *cfg) {
  const td_offload_config *o = &cfg->offload;
  if (o->param_device != TD_OFFLOAD_NVME) return;
  /* DeepSpeed's parameter buffers, in Tandem's terms: the fetched groups
   * live in the arena's address space, so buffer_count x buffer_size and
   * max_in_cpu bound how many parameters stay fetched, and a group larger
   * than one buffer is not read ahead */
  long cap = o->param_buffer_count * o->param_buffer_size;
  if (cap < 0 || cap / o->param_buffer_count != o->param_buffer_size) cap = o->param_buffer_size;
  cap = TD_MIN(cap, o->param_max_in_cpu);
  cfg->stage3_max_live_parameters = TD_MIN(cfg->stage3_max_live_parameters, cap);
  cfg->stage3_prefetch_bucket_size = TD_MIN(cfg->stage3_prefetch_bucket_size, o->param_buffer_size);
}

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

size_t td_offload_disk_bytes(const td_train_config *cfg, size_t shard_params, size_t lead_params) {
  const td_offload_config *o = &cfg->offload;
  /* each file: the shard after lead_params (shard_lo - file_base), in whole blocks */
  size_t file = round_up((shard_params + lead_params) * sizeof(float), TD_AIO_ALIGN);
  size_t n = 0;
  if (o->optimizer_device == TD_OFFLOAD_NVME) n += (size_t)td_optimizer_n_states(cfg->optimizer.kind);
  if (o->param_device == TD_OFFLOAD_NVME) n += 1;
  return n * file;
}

/* The arrays each tile buffer holds: the optimizer states, and the
 * parameters when they are on disk too. */
static size_t tile_arrays(const td_train_config *cfg) {
  return (size_t)td_optimizer_n_states(cfg->optimizer.kind) + (cfg->offload.param_device == TD_OFFLOAD_NVME);
}

/* sub_group_size left unset: tiles whose buffers (buffer_count x arrays x
 * tile) take at most 1/32 of the rank's memory, no more than 16Mi
 * parameters (64 MiB per array and read: enough to keep a disk busy; what
 * DeepSpeed users tune it to), no fewer than 256Ki (1 MiB reads). DeepSpeed's
 * default (1e9: the whole shard of a model up to 1e9 x ranks parameters,
 * in each of 4 buffers) is what made the 2.52B run refuse (issue 23). */
#define OFFLOAD_TILE_MAX ((size_t)16 << 20)
#define OFFLOAD_TILE_MIN ((size_t)256 << 10)

void td_offload_config_fit(td_train_config *cfg, size_t rank_bytes) {
  td_offload_config *o = &cfg->offload;
  if (o->sub_group_size > 0 || o->optimizer_device != TD_OFFLOAD_NVME) return;
  size_t tile = OFFLOAD_TILE_MAX;
  size_t per_tile_float = (size_t)o->optimizer_buffer_count * tile_arrays(cfg) * sizeof(float);
  if (rank_bytes > 0) tile = TD_MIN(tile, rank_bytes / 32 / per_tile_float);
  tile = TD_MAX(tile, OFFLOAD_TILE_MIN);
  o->sub_group_size = (long)round_up(tile, OFFLOAD_ALIGN_FLOATS);
}

bool td_offload_tile_lower(td_train_config *cfg) {
  td_offload_config *o = &cfg->offload;
  if (o->optimizer_device != TD_OFFLOAD_NVME || o->sub_group_size <= (long)OFFLOAD_TILE_MIN) return false;
  o->sub_group_size = (long)round_up(TD_MAX((size_t)o->sub_group_size / 2, OFFLOAD_TILE_MIN), OFFLOAD_ALIGN_FLOATS);
  return true;
}

size_t td_offload_tile(const td_train_config *cfg, size_t shard_params) {
  td_train_config c = *cfg;
  td_offload_config_fit(&c, 0); /* unset and not fitted yet: the largest automatic tile */
  size_t sub = c.offload.sub_group_size > 0 ? (size_t)c.offload.sub_group_size : OFFLOAD_TILE_MAX;
  return round_up(TD_MIN(sub, shard_params + OFFLOAD_ALIGN_FLOATS), OFFLOAD_ALIGN_FLOATS);
}

/* The most tiles a shard is cut into: from file_base, up to 1023 elements
 * below the shard. */
static size_t max_tiles(size_t shard_params, size_t tile) {
  return (shard_params + OFFLOAD_ALIGN_FLOATS - 1 + tile - 1) / tile;
}

int td_offload_buffer_count(const td_train_config *cfg, size_t shard_params) {
  size_t n_tiles = max_tiles(shard_params, td_offload_tile(cfg, shard_params));
  return (int)TD_MAX((size_t)1, TD_MIN((size_t)cfg->offload.optimizer_buffer_count, n_tiles));
}

size_t td_offload_buffer_bytes(const td_train_config *cfg, size_t shard_params) {
  const td_offload_config *o = &cfg->offload;
  if (o->optimizer_device != TD_OFFLOAD_NVME) return 0;
  size_t tile = td_offload_tile(cfg, shard_params), arrays = tile_arrays(cfg);
  size_t n_tiles = max_tiles(shard_params, tile);
  size_t allocated = (size_t)td_offload_buffer_count(cfg, shard_params) * arrays * tile * sizeof(float);
  /* pages are resident once touched: with no more tiles than buffers each
   * tile has its own buffer and the shard's short edges leave the rest of
   * theirs untouched (one page more at each end of each tile's array) */
  size_t touched = arrays * ((shard_params + OFFLOAD_ALIGN_FLOATS) * sizeof(float) + n_tiles * 2 * TD_AIO_ALIGN);
  return TD_MIN(allocated, touched);
}

#ifdef TD_HAVE_CJSON
static td_status bad(const char *source, const char *where, const char *what) {
  return td_error(TD_ERR_INVALID_ARGUMENT, "%s: %s %s", source, where, what);
}

static td_status get_whole(const char *source, const char *where, const cJSON *item, double lo, double hi, long *out) {
  if (!cJSON_IsNumber(item) || item->valuedouble != floor(item->valuedouble) || item->valuedouble < lo ||
      item->valuedouble > hi)
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: %s must be a whole number in [%g, %g]", source, where, lo, hi);
  *out = (long)item->valuedouble;
  return TD_OK;
}

static td_status get_bool(const char *source, const char *where, const cJSON *item) {
  if (!cJSON_IsBool(item)) return bad(source, where, "must be true or false");
  return TD_OK;
}

static td_status unknown(const char *source, const char *where, const char *key, const char *list) {
  return td_error(TD_ERR_INVALID_ARGUMENT, "%s: unknown key \"%s\" in %s; the keys allowed there are %s", source, key,
                  where, list);
}

static td_status get_device(const char *source, const char *where, const cJSON *item, td_offload_device *out) {
  const char *s = cJSON_IsString(item) ? item->valuestring : NULL;
  if (s && strcmp(s, "nvme") == 0) *out = TD_OFFLOAD_NVME;
  else if (s && strcmp(s, "cpu") == 0) *out = TD_OFFLOAD_CPU;
  else if (s && strcmp(s, "none") == 0) *out = TD_OFFLOAD_NONE;
  else if (cJSON_IsNull(item)) *out = TD_OFFLOAD_NONE;
  else return bad(source, where, "must be \"nvme\", \"cpu\" or \"none\"");
  return TD_OK;
}

static td_status get_path(const char *source, const char *where, const cJSON *item, char *dst, size_t cap) {
  if (!cJSON_IsString(item) || !item->valuestring[0]) return bad(source, where, "must be a directory path (a string)");
  if (strlen(item->valuestring) >= cap)
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: %s is longer than %zu characters", source, where, cap - 1);
  td_strlcpy(dst, item->valuestring, cap);
  return TD_OK;
}

static td_status parse_offload(const cJSON *obj, const char *source, bool param, td_train_config *cfg) {
  td_offload_config *o = &cfg->offload;
  const char *where = param ? "zero_optimization.offload_param" : "zero_optimization.offload_optimizer";
  if (!cJSON_IsObject(obj))
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: %s must be an object, e.g. {\"device\": \"nvme\", \"nvme_path\": "
                    "\"/local_nvme\"}", source, where);
  char key[128];
  const cJSON *item;
  cJSON_ArrayForEach(item, obj) {
    const char *k = item->string;
    long n = 0;
    snprintf(key, sizeof key, "%s.%s", where, k);
    if (strcmp(k, "device") == 0) {
      TD_CHECK(get_device(source, key, item, param ? &o->param_device : &o->optimizer_device));
    } else if (strcmp(k, "nvme_path") == 0) {
      if (param) TD_CHECK(get_path(source, key, item, o->param_nvme_path, sizeof o->param_nvme_path));
      else TD_CHECK(get_path(source, key, item, o->optimizer_nvme_path, sizeof o->optimizer_nvme_path));
    } else if (strcmp(k, "buffer_count") == 0) {
      TD_CHECK(get_whole(source, key, item, 1, 64, &n));
      if (param) o->param_buffer_count = (int)n, cfg->knobs_set |= TD_KNOB_PARAM_BUFFERS;
      else o->optimizer_buffer_count = (int)n;
    } else if (strcmp(k, "pin_memory") == 0) {
      TD_CHECK(get_bool(source, key, item));
      o->pin_memory = cJSON_IsTrue(item);
    } else if (param && strcmp(k, "buffer_size") == 0) {
      TD_CHECK(get_whole(source, key, item, 1, 1e15, &n));
      o->param_buffer_size = n;
      cfg->knobs_set |= TD_KNOB_PARAM_BUFFERS;
    } else if (param && strcmp(k, "max_in_cpu") == 0) {
      TD_CHECK(get_whole(source, key, item, 1, 1e15, &n));
      o->param_max_in_cpu = n;
      cfg->knobs_set |= TD_KNOB_PARAM_BUFFERS;
    } else if (!param && strcmp(k, "ratio") == 0) {
      /* DeepSpeed's partial offload of the optimizer to the CPU: only 1 (everything) here */
      if (!cJSON_IsNumber(item) || item->valuedouble != 1.0)
        return bad(source, key, "must be 1 (Tandem offloads the whole optimizer state)");
    } else {
      return unknown(source, where, k,
                     param ? "\"device\", \"nvme_path\", \"buffer_count\", \"buffer_size\", \"max_in_cpu\", "
                             "\"pin_memory\""
                           : "\"device\", \"nvme_path\", \"buffer_count\", \"pin_memory\", \"ratio\"");
    }
  }
  return TD_OK;
}

static td_status parse_aio(const cJSON *obj, const char *source, td_offload_config *o) {
  if (!cJSON_IsObject(obj))
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: aio must be an object, e.g. {\"block_size\": 1048576, "
                    "\"queue_depth\": 8}", source);
  const cJSON *item;
  cJSON_ArrayForEach(item, obj) {
    const char *k = item->string;
    char key[64];
    snprintf(key, sizeof key, "aio.%s", k);
    long n = 0;
    if (strcmp(k, "block_size") == 0) {
      TD_CHECK(get_whole(source, key, item, TD_AIO_ALIGN, 1 << 30, &n));
      if (n % TD_AIO_ALIGN != 0) return bad(source, key, "must be a multiple of 4096 (O_DIRECT), e.g. 1048576");
      o->aio_block_size = (size_t)n;
    } else if (strcmp(k, "queue_depth") == 0) {
      TD_CHECK(get_whole(source, key, item, 1, 4096, &n));
      o->aio_queue_depth = (int)n;
    } else if (strcmp(k, "thread_count") == 0) {
      TD_CHECK(get_whole(source, key, item, 1, 256, &n));
      o->aio_thread_count = (int)n;
    } else if (strcmp(k, "single_submit") == 0 || strcmp(k, "overlap_events") == 0) {
      TD_CHECK(get_bool(source, key, item));
    } else {
      return unknown(source, "aio", k,
                     "\"block_size\", \"queue_depth\", \"thread_count\", \"single_submit\", \"overlap_events\"");
    }
  }
  return TD_OK;
}

td_status td_offload_parse_json(const void *item_ptr, const char *source, td_train_config *cfg) {
  const cJSON *item = item_ptr;
  const char *k = item->string;
  td_offload_config *o = &cfg->offload;
  if (strcmp(k, "offload_optimizer") == 0) return parse_offload(item, source, false, cfg);
  if (strcmp(k, "offload_param") == 0) return parse_offload(item, source, true, cfg);
  if (strcmp(k, "aio") == 0) return parse_aio(item, source, o);
  if (strcmp(k, "sub_group_size") == 0) {
    long n = 0;
    TD_CHECK(get_whole(source, "zero_optimization.sub_group_size", item, 1, 1e15, &n));
    o->sub_group_size = n;
    return TD_OK;
  }
  return td_error(TD_ERR_INTERNAL, "%s: td_offload_parse_json called for key \"%s\"", source, k);
}
#endif
