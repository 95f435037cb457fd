/* train_devops_for: which device ops the trainer uses (core/devops.h). */
#include "train/core/devops.h"

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
