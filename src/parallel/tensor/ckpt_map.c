/* The tensor-parallel GPT's shard map (include/tandem/parallel.h,
 * td_shard_map): where each element of this rank's arena lives in the
 * unsplit GPT's arena, so that checkpoints store the unsplit model and any
 * layout (1 rank, data-parallel, ZeRO-1, another tensor-parallel size)
 * loads them. The cut of each tensor is the one the model was initialized
 * by (gpt_tp.c, tp_gpt_cuts), so the map and the model cannot disagree.
 *
 * Cost: one run per row of each row-parallel weight (attention and MLP
 * projections: C rows each per layer), a few per other tensor; GPT-2 124M
 * at TP=2 is 18,4xx runs per rank (bench/ckpt-tp.sh measures what that
 * costs a checkpoint's manifest and load). */
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

/* The runs of one tensor: local elements from `local`, the unsplit tensor at `unsplit`. */
static int cut_runs(run_list *l, const cut *k, size_t local, size_t unsplit, int replica_writer) {
  switch (k->kind) {
  case CUT_REPL:
    return run_push(l, local, unsplit, k->rows * k->cols, replica_writer);
  case CUT_ROWS:
    for (int b = 0; b < k->blocks; b++, local += k->n * k->cols)
      if (!run_push(l, local, unsplit + ((size_t)b * k->rows + k->lo) * k->cols, k->n * k->cols, 1)) return 0;
    return 1;
  case CUT_COLS:
    for (size_t row = 0; row < k->rows; row++, local += k->n)
      if (!run_push(l, local, unsplit + row * k->cols + k->lo, k->n, 1)) return 0;
    return 1;
  }
  return 0;
}

td_status td_shard_map_create(const td_model *model, td_shard_map **out) {
  if (!out) return td_error(TD_ERR_INVALID_ARGUMENT, "td_shard_map_create: out must not be NULL");
  *out = NULL;
  td_gpt_config config;
  int p = 0, r = 0;
  const cut *cuts = model ? tp_gpt_cuts(model, &config, &p, &r) : NULL;
  if (!cuts)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_shard_map_create: a \"%s\" model is not split across ranks (only "
                    "td_gpt_tp_create's models have a shard map)", model && model->kind ? model->kind : "?");
  td_shard_map *map = calloc(1, sizeof *map);
  if (!map) return td_error(TD_ERR_SYSTEM, "td_shard_map_create: out of memory");
  td_status st = td_gpt_create(&config, &map->unsplit);
  run_list l = {0};
  for (int i = 0; i < model->n_tensors && st == TD_OK; i++) {
    const td_param_tensor *mine = &model->tensors[i], *whole = &map->unsplit->tensors[i];
    if (!cut_runs(&l, &cuts[i], mine->offset, whole->offset, r == 0))
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
