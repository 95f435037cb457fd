/* Loading a checkpoint into a trainer, collectively: every rank opens the
 * checkpoint, checks that it is of this model (kind, shape, tensor table)
 * and optimizer, and reads exactly the element ranges it asked for from the
 * pieces that overlap them (read.c), whatever world size and ZeRO stage
 * wrote them. The ranks then agree, so that all succeed or all fail with
 * the failing rank's reason. */
#include "train/checkpoint/ckpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/checkpoint/io.h"
#include "train/core/core.h"

/* The value of `key` in a "k=v k=v" string, copied into out; 0 if absent. */
static int config_value(const char *config, const char *key, char *out, size_t size) {
  size_t klen = strlen(key);
  for (const char *p = config; p && *p;) {
    while (*p == ' ') p++;
    const char *end = strchr(p, ' ');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    if (n > klen && strncmp(p, key, klen) == 0 && p[klen] == '=') {
      size_t vlen = TD_MIN(n - klen - 1, size - 1);
      memcpy(out, p + klen + 1, vlen);
      out[vlen] = '\0';
      return 1;
    }
    p = end;
  }
  return 0;
}

/* Every key=value that differs between the checkpoint's model shape and
 * this model's, into msg ("layers: 4 in the checkpoint, 2 here; ..."). */
static int config_differences(const char *saved, const char *mine, char *msg, size_t size) {
  int n_diff = 0;
  size_t used = 0;
  msg[0] = '\0';
  const char *sources[2] = {saved, mine};
  for (int side = 0; side < 2; side++)
    for (const char *p = sources[side]; p && *p;) {
      while (*p == ' ') p++;
      const char *end = strchr(p, ' ');
      size_t n = end ? (size_t)(end - p) : strlen(p);
      const char *eq = memchr(p, '=', n);
      if (eq && eq > p && (size_t)(eq - p) < 64) {
        char key[64], a[64] = "(absent)", b[64] = "(absent)";
        memcpy(key, p, (size_t)(eq - p));
        key[eq - p] = '\0';
        int in_saved = config_value(saved, key, a, sizeof a), in_mine = config_value(mine, key, b, sizeof b);
        /* A key in both is reported once, from the checkpoint's side. */
        if ((side == 0 || !in_saved) && (!in_saved || !in_mine || strcmp(a, b) != 0)) {
          if (used < size) {
            int w = snprintf(msg + used, size - used, "%s%s: %s in the checkpoint, %s in this run", n_diff ? "; " : "",
                             key, a, b);
            if (w > 0) used += (size_t)w;
          }
          n_diff++;
        }
      }
      p = end;
    }
  return n_diff;
}


/* The checkpoint's model and optimizer against this trainer's. */
static td_status check_model(const td_trainer *t, const char *file, const td_ckpt_manifest *m) {
  const td_ckpt_group grp = td_ckpt_group_of(t);
  const td_model *model = grp.model;
  const char *kind = model->kind ? model->kind : "?";
  if (strcmp(m->kind, kind) != 0)
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: the checkpoint is of a \"%s\" model, this run trains a \"%s\"", file,
                    m->kind, kind);
  if (m->model_config[0] && model->config) {
    char diff[768];
    if (config_differences(m->model_config, model->config, diff, sizeof diff) > 0)
      return td_error(TD_ERR_INVALID_ARGUMENT,
                      "%s: the checkpoint is of a different %s model configuration (%s): resume with the saved run's "
                      "model flags",
                      file, kind, diff);
  }
  if (m->n_params != grp.n_params || m->n_tensor_lines != model->n_tensors)
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "%s: the checkpoint's model has %zu parameters in %d tensors, this one %zu in %d: use the same "
                    "model configuration (layers, channels, ...) as the saved run",
                    file, m->n_params, m->n_tensor_lines, grp.n_params, model->n_tensors);
  for (int i = 0; i < model->n_tensors; i++) {
    const td_param_tensor *p = &model->tensors[i];
    const td_ckpt_tensor *q = &m->tensors[i];
    if (p->offset != q->offset || p->count != q->count || (p->name && strcmp(p->name, q->name) != 0))
      return td_error(TD_ERR_INVALID_ARGUMENT,
                      "%s: tensor %d is \"%s\" (offset %zu, %zu floats) but this model has \"%s\" (offset %zu, "
                      "%zu floats): the checkpoint is from a different model configuration",
                      file, i, q->name, q->offset, q->count, p->name ? p->name : "?", p->offset, p->count);
  }
  if (strcmp(m->optimizer, td_optimizer_name(t->cfg.optimizer.kind)) != 0 || m->n_states != t->n_states)
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "%s: the checkpoint was trained with optimizer %s, this run uses %s: use the same optimizer type",
                    file, m->optimizer, td_optimizer_name(t->cfg.optimizer.kind));
  return TD_OK;
}

/* The arena table too: the same names and sizes (an optimizer change shows
 * up above; this catches a checkpoint whose arenas were cut differently). */
static td_status check_arenas(const td_trainer *t, const char *file, const td_ckpt_manifest *m) {
  td_ckpt_arena mine[TD_CKPT_MAX_ARENAS];
  int n = td_ckpt_trainer_arenas(t, mine);
  if (n != m->n_arenas)
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: the checkpoint holds %d arenas, this run's state has %d", file,
                    m->n_arenas, n);
  for (int a = 0; a < n; a++)
    if (strcmp(mine[a].name, m->arenas[a].name) != 0 || mine[a].count != m->arenas[a].count)
      return td_error(TD_ERR_INVALID_ARGUMENT,
                      "%s: arena %d is \"%s\" of %llu elements in the checkpoint, \"%s\" of %llu in this run", file,
                      a, m->arenas[a].name, (unsigned long long)m->arenas[a].count, mine[a].name,
                      (unsigned long long)mine[a].count);
  return TD_OK;
}

/* The global batch the checkpoint was trained with against this run's.
 * A different batch changes what a step means (the samples it averages,
 * the learning rate's schedule per sample, where the sampler's position
 * lands), so it is refused unless the run asks for it. 0 in the manifest:
 * not recorded (no batch to compare). */
static td_status check_batch(const td_trainer *t, const char *file, const td_ckpt_manifest *m) {
  unsigned long long mine = (unsigned long long)t->cfg.train_batch_size;
  if (!m->train_batch_size || m->train_batch_size == mine || t->cfg.allow_batch_size_change) return TD_OK;
  return td_error(TD_ERR_INVALID_ARGUMENT,
                  "%s: the checkpoint was trained with a global batch of %llu samples, this run's is %llu: resume "
                  "with train_batch_size %llu (micro-batch x grad-accum x ranks), or set "
                  "checkpoint.allow_batch_size_change (train-gpt, train-fmnist: --allow-batch-size-change) to go on "
                  "with %llu",
                  file, m->train_batch_size, mine, m->train_batch_size, mine);
}

static td_status load_local(td_trainer *t, const char *path, const td_ckpt_region *regions, int n_regions,
                            td_ckpt_manifest *m) {
  td_ckpt_dir d;
  TD_CHECK(td_ckpt_open(path, &d));
  char file[1300];
  ckpt_path_fmt(file, sizeof file, "%s/manifest", d.dir);
  td_status st = check_model(t, file, &d.m);
  if (st == TD_OK) st = check_arenas(t, file, &d.m);
  if (st == TD_OK) st = check_batch(t, file, &d.m);
  for (int i = 0; i < n_regions && st == TD_OK; i++)
    st = td_ckpt_read(&d, regions[i].arena, regions[i].lo, regions[i].hi, regions[i].data);
  if (st == TD_OK) {
    /* The manifest moves to the caller; the rest is closed. */
    *m = d.m;
    memset(&d.m, 0, sizeof d.m);
    d.m.n_files = m->n_files; /* td_ckpt_close closes the descriptors by this count */
  }
  td_ckpt_close(&d);
  return st;
}

td_status td_ckpt_load_regions(td_trainer *t, const char *path, const td_ckpt_region *regions, int n_regions,
                               td_ckpt_manifest *m) {
  memset(m, 0, sizeof *m);
  if (!t || !path || !*path) return td_error(TD_ERR_INVALID_ARGUMENT, "td_trainer_resume: null trainer or empty path");
  if (strlen(path) > 1000) return td_error(TD_ERR_INVALID_ARGUMENT, "checkpoint path too long: %s", path);
  td_status st = load_local(t, path, regions, n_regions, m);
  if (st != TD_OK) {
    char why[900];
    td_error_copy(why, sizeof why);
    st = td_error(st, "rank %d: %s", td_ckpt_group_of(t).rank, why);
  }
  st = td_ckpt_agree(t, st);
  if (st != TD_OK) td_ckpt_manifest_free(m);
  return st;
}
