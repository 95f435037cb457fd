/* Model-independent entry points: parameter init dispatch (to gpt.c and
 * cnn.c), the choice of device (td_gpt_create_on, td_gpt_stage_create_on:
 * gpt.c, then cuda/gpt_cuda.c on a CUDA device; a stage's exchanges with
 * its neighbours from either), and destroy. */
#include "nn_internal.h"

#include <string.h>

void td_model_init_params(const td_model *model, float *params, uint64_t seed) {
  if (!model || !params) return;
  if (model->ops && model->ops->init_params)
    model->ops->init_params(model, params, seed);
  else if (strcmp(model->kind, "gpt") == 0)
    nn_gpt_init_params(model, params, seed);
  else if (strcmp(model->kind, "cnn") == 0)
    nn_cnn_init_params(model, params, seed);
}

/* Move a model just built on the CPU to the (opened) CUDA device: *out on
 * success; on failure the model, still the CPU one (attach changes nothing
 * then), is destroyed. */
static td_status attach_device(td_model *model, td_device device, td_model **out) {
#ifdef TD_HAVE_CUDA
  td_status st = nn_gpt_cuda_attach(model, device);
  if (st != TD_OK) {
    td_model_destroy(model);
    return st;
  }
  *out = model;
  return TD_OK;
#else
  (void)device, (void)out;
  td_model_destroy(model);
  return td_error(TD_ERR_INTERNAL, "td_device_open accepted a CUDA device in a build without CUDA");
#endif
}

td_status td_gpt_create_on(const td_gpt_config *config, td_device device, td_model **out) {
  if (!out) return td_error(TD_ERR_INVALID_ARGUMENT, "td_gpt_create_on: out must not be NULL");
  *out = NULL;
  if (device.kind == TD_DEVICE_CPU) return td_gpt_create(config, out);
  /* says "built without CUDA", "no CUDA device: ..." or "cuda:N asked, M visible" */
  TD_CHECK(td_device_open(device));
  td_model *model = NULL;
  TD_CHECK(td_gpt_create(config, &model));
  return attach_device(model, device, out);
}

td_status td_gpt_stage_create_on(const td_gpt_config *config, const td_gpt_stage *stage, td_device device,
                                 td_model **out) {
  if (!out) return td_error(TD_ERR_INVALID_ARGUMENT, "td_gpt_stage_create_on: out must not be NULL");
  *out = NULL;
  if (device.kind == TD_DEVICE_CPU) return td_gpt_stage_create(config, stage, out);
  TD_CHECK(td_device_open(device)); /* "built without CUDA", "no CUDA device: ...", "cuda:N asked, M visible" */
  td_model *model = NULL;
  TD_CHECK(td_gpt_stage_create(config, stage, &model));
  return attach_device(model, device, out);
}

/* A stage's exchanges with its neighbours: the CPU stage's buffers
 * (gpt.c), or the pinned host copies of a device stage (gpt_cuda.c). */
static int on_device_gpt(const td_model *model) {
  return model && model->kind && !strcmp(model->kind, "gpt") && model->device.kind != TD_DEVICE_CPU;
}

const float *td_gpt_stage_output(const td_model *model) {
#ifdef TD_HAVE_CUDA
  if (on_device_gpt(model)) return nn_gpt_cuda_stage_output(model);
#endif
  return on_device_gpt(model) ? NULL : nn_gpt_stage_output(model);
}

const float *td_gpt_stage_input_grad(const td_model *model) {
#ifdef TD_HAVE_CUDA
  if (on_device_gpt(model)) return nn_gpt_cuda_stage_input_grad(model);
#endif
  return on_device_gpt(model) ? NULL : nn_gpt_stage_input_grad(model);
}

td_status td_gpt_set_device_dtype(td_model *model, td_dtype dtype) {
  if (!model || strcmp(model->kind, "gpt") != 0)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_gpt_set_device_dtype: model must be a GPT");
  if (model->device.kind == TD_DEVICE_CPU) {
    if (dtype == TD_F32) return TD_OK;
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_gpt_set_device_dtype: a CPU GPT's arenas are f32; for bf16 products "
                    "on the CPU use td_nn_set_compute_dtype (train-gpt --bf16)");
  }
#ifdef TD_HAVE_CUDA
  return nn_gpt_cuda_set_dtype(model, dtype);
#else
  return td_error(TD_ERR_INTERNAL, "td_gpt_set_device_dtype: a device model in a build without CUDA");
#endif
}

td_status td_gpt_set_tensor_split(td_model *model, const td_gpt_tensor_split *split) {
  if (!model || !model->kind || strcmp(model->kind, "gpt") != 0 || !split)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_gpt_set_tensor_split: model must be a GPT and split given");
  if (model->device.kind == TD_DEVICE_CPU)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_gpt_set_tensor_split: a CPU GPT is split by td_gpt_tp_create (the "
                    "CPU engine's tensor-parallel model), not in place");
#ifdef TD_HAVE_CUDA
  return nn_gpt_cuda_set_tensor_split(model, split);
#else
  return td_error(TD_ERR_INTERNAL, "td_gpt_set_tensor_split: a device model in a build without CUDA");
#endif
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
