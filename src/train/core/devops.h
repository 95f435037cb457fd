/* The trainer's one seam to the device its model computes on (issue 18):
 * chosen once at td_trainer_create from td_model.device. NULL means the
 * host arenas and the host code paths as they always were; otherwise the
 * params, grads and optimizer states are device arenas (td_device_alloc),
 * zeroed and copied through the device layer, and the two steps that read
 * every element on the host — the gradient norm and the optimizer update —
 * go through these functions. Collectives need nothing here: the comm layer
 * recognizes device pointers (src/comm/device). */
#ifndef TD_TRAIN_CORE_DEVOPS_H
#define TD_TRAIN_CORE_DEVOPS_H

#include <stddef.h>

#include "tandem/base.h"
#include "tandem/device.h"

typedef struct train_devops {
  const char *name;
  size_t scratch_floats; /* device scratch the trainer allocates for sum_squares */
  /* *out = sum of x[i]^2 over the device array x of n elements of `dtype`
   * (f32 or bf16), in a fixed order (the same bits every run) */
  td_status (*sum_squares)(td_device dev, float *scratch, const void *x, td_dtype dtype, size_t n, double *out);
  /* td_adamw_update's contract on device arenas: f32 master params and
   * moments, grads of grad_dtype (f32 or bf16); params_copy NULL, or the
   * model's bf16 working copy of the params, rewritten from the updated
   * masters in the same pass (mixed precision) */
  td_status (*adamw)(td_device dev, float *params, void *params_copy, const void *grads, td_dtype grad_dtype,
                     float *m, float *v, size_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
                     long step, float grad_scale);
  /* dst (n elements of dst_dtype) = src (n of src_dtype), f32 <-> bf16
   * rounding to nearest even; blocking */
  td_status (*cast)(td_device dev, void *dst, td_dtype dst_dtype, const void *src, td_dtype src_dtype, size_t n);
} train_devops;

/* The ops for `dev`: *out = NULL for the CPU; an error for a device kind
 * this build cannot train on. */
td_status train_devops_for(td_device dev, const train_devops **out);

#ifdef TD_HAVE_CUDA
extern const train_devops train_devops_cuda; /* src/train/cuda/devops_cuda.c */
#endif

#endif
