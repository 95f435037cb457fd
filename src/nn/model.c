/* Model-independent entry points: parameter init dispatch (to gpt.c and
 * cnn.c) and destroy. */
#include "nn_internal.h"

#include <string.h>

void td_model_init_params(const td_model *model, float *params, uint64_t seed) {
  if (!model || !params) return;
  if (strcmp(model->kind, "gpt") == 0)
    nn_gpt_init_params(model, params, seed);
  else if (strcmp(model->kind, "cnn") == 0)
    nn_cnn_init_params(model, params, seed);
}

td_status td_model_init_params_range(const td_model *model, float *dst, uint64_t seed, size_t lo, size_t hi) {
  if (!model || (!dst && hi > lo) || hi < lo || hi > model->n_params)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_model_init_params_range: bad arguments (range [%zu, %zu) of %zu)", lo,
                    hi, model ? model->n_params : 0);
  if (hi == lo) return TD_OK;
  if (strcmp(model->kind, "gpt") == 0) {
    nn_gpt_init_params_range(model, dst, seed, lo, hi);
    return TD_OK;
  }
  float *all = td_alloc(model->n_params * sizeof(float));
  if (!all)
    return td_error(TD_ERR_SYSTEM, "td_model_init_params_range: model \"%s\" has no range initializer and its %zu "
                    "parameters do not fit in memory at once", model->kind, model->n_params);
  memset(all, 0, model->n_params * sizeof(float));
  td_model_init_params(model, all, seed);
  memcpy(dst, all + lo, (hi - lo) * sizeof(float));
  td_free(all);
  return TD_OK;
}

void td_model_destroy(td_model *model) {
  if (model && model->ops && model->ops->destroy) model->ops->destroy(model);
}

void td_dataset_destroy(td_dataset *ds) {
  if (ds && ds->destroy) ds->destroy(ds);
}
