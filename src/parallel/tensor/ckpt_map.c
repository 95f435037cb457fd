/* The shard map of a split GPT (include/tandem/parallel.h, td_shard_map):
 * where each element of this rank's arena lives in the unsplit GPT's arena,
 * so that checkpoints store the unsplit model and any layout (1 rank,
 * data-parallel, ZeRO-1, another tensor- or pipeline-parallel size) loads
 * them. Tensor parallelism: the cut of each tensor is the one the model was
 * initialized by (gpt_tp.c, tp_gpt_cuts / tp_cut_of), so the map and the
 * model cannot disagree. Pipeline stages: tensors found by name, whole or
 * (tensor-parallel stages, 3D) cut by tp_cut_of.
 *
 * Cost: one run per row of each row-parallel weight (attention and MLP
 * projections: C rows each per layer), a few per other tensor; GPT-2 124M
 * at TP=2 is about 18,500 runs per rank, 18,432 of them rows
 * (bench/ckpt_tp.sh measures what that costs a checkpoint's manifest and
 * load). A pipeline stage is one run per tensor (merged when adjacent). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../base/base.h"
#include "tensor.h"

typedef struct run_list {
  td_shard_run *runs;
  int n, cap;
} run_list;

/* Append a run, merged into the last one when both coordinates continue it. */
static int run_push(run_list *l, size_t local, size_t unsplit, size_t count, int writer) {
  if (count == 0) return 1;
  if (l->n > 0) {
    td_shard_run *last = &l->runs[l->n - 1];
    if (last->writer == writer && last->local + last->count == local && last->unsplit + last->count == unsplit) {
      last->count += count;
      return 1;
    }
  }
  if (l->n == l->cap) {
    int ncap = l->cap ? 2 * l->cap : 64;
    td_shard_run *grown = realloc(l->runs, (size_t)ncap * sizeof *grown);
    if (!grown) return 0;
    l->runs = grown;
    l->cap = ncap;
  }
  l->runs[l->n++] = (td_shard_run){local, unsplit, count, writer};
  return 1;
}

/* The runs of one tensor: local elements from `local`, the unsplit tensor
 * at `unsplit`. replica_writer: whether this rank writes a replicated
 * tensor (tensor rank 0); writer: whether it writes this tensor at all (0:
 * a tied copy another stage writes). */
static int cut_runs(run_list *l, const cut *k, size_t local, size_t unsplit, int replica_writer, int writer) {
  switch (k->kind) {
  case CUT_REPL:
    return run_push(l, local, unsplit, k->rows * k->cols, replica_writer && writer);
  case CUT_ROWS:
    for (int b = 0; b < k->blocks; b++, local += k->n * k->cols)
      if (!run_push(l, local, unsplit + ((size_t)b * k->rows + k->lo) * k->cols, k->n * k->cols, writer)) return 0;
    return 1;
  case CUT_COLS:
    for (size_t row = 0; row < k->rows; row++, local += k->n)
      if (!run_push(l, local, unsplit + row * k->cols + k->lo, k->n, writer)) return 0;
    return 1;
  }
  return 0;
}

/* The integer after "key=" in a "k=v k=v" config text; 0 if absent. */
static int config_int(const char *text, const char *key, int *out) {
  size_t n = strlen(key);
  for (const char *p = text; p && *p; p = strchr(p, ' '), p = p ? p + 1 : NULL)
    if (strncmp(p, key, n) == 0 && p[n] == '=') return sscanf(p + n + 1, "%d", out) == 1;
  return 0;
}

/* A pipeline stage (td_gpt_pipeline_create, kind "gpt_pipeline"): its
 * tensors are tensors of the unsplit GPT under the same names, at their own
 * local offsets (chunks back to back), whole or, with tensor-parallel stages
 * (td_gpt_pipeline_create_grid), cut by tp_cut_of for its tensor rank. A
 * tied model's last stage holds a copy of "wte" (its shard) whose value and
 * optimizer state equal stage 0's (its gradient is summed with stage 0's
 * every step): stage 0 writes it. Read from the model's public description:
 * config text "vocab=... pipeline=S/P ... tensor=R/P" and tensor names. */
static td_status pipeline_config(const td_model *model, td_gpt_config *config, int *stage, int *p, int *r) {
  const char *t = model->config;
  int tied = 0, stages = 0;
  if (!t || !config_int(t, "vocab", &config->vocab) || !config_int(t, "layers", &config->layers) ||
      !config_int(t, "channels", &config->channels) || !config_int(t, "heads", &config->heads) ||
      !config_int(t, "seq", &config->seq) || !config_int(t, "tied", &tied) || !strstr(t, "pipeline=") ||
      sscanf(strstr(t, "pipeline=") + 9, "%d/%d", stage, &stages) != 2)
    return td_error(TD_ERR_INTERNAL, "td_shard_map_create: the pipeline model's description \"%s\" lacks its shape",
                    t ? t : "");
  *r = 0, *p = 1;
  if (strstr(t, "tensor=") && (sscanf(strstr(t, "tensor=") + 7, "%d/%d", r, p) != 2 || *p < 1 || *r < 0 || *r >= *p))
    return td_error(TD_ERR_INTERNAL, "td_shard_map_create: the pipeline model's tensor place in \"%s\" is unreadable", t);
  config->tied = tied;
  return TD_OK;
}

td_status td_shard_map_create(const td_model *model, td_shard_map **out) {
  if (!out) return td_error(TD_ERR_INVALID_ARGUMENT, "td_shard_map_create: out must not be NULL");
  *out = NULL;
  td_gpt_config config;
  int p = 0, r = 0, stage = -1;
  const cut *cuts = model ? tp_gpt_cuts(model, &config, &p, &r) : NULL;
  const int pipeline = !cuts && model && model->kind && strcmp(model->kind, "gpt_pipeline") == 0;
  if (!cuts && !pipeline)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_shard_map_create: a \"%s\" model is not split across ranks (only "
                    "td_gpt_tp_create's and td_gpt_pipeline_create's models have a shard map)",
                    model && model->kind ? model->kind : "?");
  if (pipeline) TD_CHECK(pipeline_config(model, &config, &stage, &p, &r));
  td_shard_map *map = calloc(1, sizeof *map);
  if (!map) return td_error(TD_ERR_SYSTEM, "td_shard_map_create: out of memory");
  td_status st = td_gpt_create(&config, &map->unsplit);
  run_list l = {0};
  for (int i = 0, j = 0; i < model->n_tensors && st == TD_OK; i++) {
    const td_param_tensor *mine = &model->tensors[i];
    if (pipeline) {
      /* the unsplit tensor of the same name (tables in the same order: search on from the last match) */
      const td_model *u = map->unsplit;
      int k = 0;
      while (k < u->n_tensors && strcmp(u->tensors[(j + k) % u->n_tensors].name, mine->name) != 0) k++;
      const td_param_tensor *whole = k < u->n_tensors ? &u->tensors[(j + k) % u->n_tensors] : NULL;
      cut c = tp_cut_of(mine->name, whole ? whole->count : 0, &config, p, r);
      if (!whole || tp_cut_count(&c) != mine->count) {
        st = td_error(TD_ERR_INTERNAL, "td_shard_map_create: the pipeline stage's tensor %s (%zu floats) is not "
                      "one of the unsplit GPT's (tensor rank %d of %d)", mine->name, mine->count, r, p);
        break;
      }
      j = (j + k) % u->n_tensors;
      /* a tied last stage's wte copy is stage 0's; a replicated tensor is tensor rank 0's */
      const int writer = strcmp(mine->name, "wte") != 0 || stage == 0;
      if (!cut_runs(&l, &c, mine->offset, whole->offset, r == 0, writer))
        st = td_error(TD_ERR_SYSTEM, "td_shard_map_create: out of memory for the runs of tensor %s", mine->name);
      continue;
    }
    const td_param_tensor *whole = &map->unsplit->tensors[i];
    if (!cut_runs(&l, &cuts[i], mine->offset, whole->offset, r == 0, 1))
      st = td_error(TD_ERR_SYSTEM, "td_shard_map_create: out of memory for the runs of tensor %s", mine->name);
  }
  if (st != TD_OK) {
    free(l.runs);
    td_shard_map_destroy(map);
    return st;
  }
  map->runs = l.runs;
  map->n_runs = l.n;
  map->n_local = model->n_params;
  *out = map;
  return TD_OK;
}

void td_shard_map_destroy(td_shard_map *map) {
  if (!map) return;
  td_model_destroy(map->unsplit);
  free(map->runs);
  free(map);
}
