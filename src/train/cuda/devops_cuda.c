/* The trainer's device ops on CUDA (core/devops.h): the global norm and
 * fused AdamW of src/train/cuda on the default stream. The model's own
 * stream has finished its work when forward/backward return
 * (td_gpt_create_on), and the blocking copy of the norm orders the rest. */
#include "train/core/devops.h"
#include "train/cuda/cuda_optim.h"

#include "base/base.h"

static td_status cuda_sum_squares(td_device dev, float *scratch, const void *x, td_dtype dtype, size_t n,
                                  double *out) {
  float host = 0;
  /* scratch[0] is the result, then the first pass's partials */
  TD_CHECK(td_cuda_global_norm_squared(scratch, scratch + 1, x, n, dtype, NULL));
  TD_CHECK(td_device_copy(&host, (td_device){TD_DEVICE_CPU, 0}, scratch, dev, sizeof host));
  *out = host;
  return TD_OK;
}

static td_status cuda_adamw(td_device dev, float *params, void *params_copy, const void *grads, td_dtype grad_dtype,
                            float *m, float *v, size_t n, float lr, float beta1, float beta2, float eps,
                            float weight_decay, long step, float grad_scale) {
  TD_CHECK(td_cuda_adamw(params, params_copy, TD_BF16, grads, grad_dtype, m, v, n, lr, beta1, beta2, eps,
                         weight_decay, step, grad_scale, NULL));
  return td_device_sync(dev);
}

static td_status cuda_cast(td_device dev, void *dst, td_dtype dst_dtype, const void *src, td_dtype src_dtype,
                           size_t n) {
  TD_CHECK(td_cuda_cast(dst, dst_dtype, src, src_dtype, n, NULL));
  return td_device_sync(dev);
}

const train_devops train_devops_cuda = {
    .name = "cuda",
    .scratch_floats = 1 + TD_CUDA_NORM_PARTIALS,
    .sum_squares = cuda_sum_squares,
    .adamw = cuda_adamw,
    .cast = cuda_cast,
};
