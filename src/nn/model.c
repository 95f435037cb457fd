/* Model-independent entry points: parameter init dispatch and destroy. */
#include "nn_internal.h"

#include <string.h>

void td_model_init_params(const td_model *model, float *params, uint64_t seed) {
  if (!model || !params) return;
  if (strcmp(model->kind, "gpt") == 0)
    nn_gpt_init_params(model, params, seed);
  else if (strcmp(model->kind, "cnn") == 0)
    nn_cnn_init_params(model, params, seed);
}

void td_model_destroy(td_model *model) {
  if (model && model->ops && model->ops->destroy) model->ops->destroy(model);
}

void td_dataset_destroy(td_dataset *ds) {
  if (ds && ds->destroy) ds->destroy(ds);
}
