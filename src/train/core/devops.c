/* train_devops_for: which device ops the trainer uses (core/devops.h), and
 * the trainer's view of the model's arrays on a device (core.h). */
#include "train/core/devops.h"
#include "train/core/core.h"

#include "base/base.h"

td_status train_devops_for(td_device dev, const train_devops **out) {
  *out = NULL;
  if (dev.kind == TD_DEVICE_CPU) return TD_OK;
#ifdef TD_HAVE_CUDA
  if (dev.kind == TD_DEVICE_CUDA) {
    *out = &train_devops_cuda;
    return TD_OK;
  }
#endif
  return td_error(TD_ERR_INVALID_ARGUMENT, "the trainer cannot train on device kind %d in this build (built without "
                  "CUDA?): train on \"cpu\" or rebuild with a CUDA toolkit", (int)dev.kind);
}

const void *td_trainer_model_params(const td_trainer *t) { return t->model_params ? t->model_params : t->params; }
void *td_trainer_model_grads(const td_trainer *t) { return t->model_grads ? t->model_grads : t->grads; }

td_status td_trainer_device_params_changed(td_trainer *t) {
  if (!t->model_params) return TD_OK;
  /* the masters a rank holds: the whole arena, or the shard at ZeRO stage 3 */
  const size_t lo = t->params_lo, n = t->params_hi - t->params_lo;
  td_status st = t->devops->cast(t->device, (char *)t->model_params + lo * td_dtype_size(t->model_dtype),
                                 t->model_dtype, t->params + lo, TD_F32, n);
  if (st != TD_OK) {
    char why[512]; /* td_error must not format its own buffer into itself */
    td_error_copy(why, sizeof why);
    return td_error(st, "rank %d: rounding the %zu master parameters into the model's %s copy failed: %s", t->rank,
                    n, td_dtype_name(t->model_dtype), why);
  }
  return TD_OK;
}
