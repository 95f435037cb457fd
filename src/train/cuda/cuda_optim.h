/* src/train/cuda: the optimizer's device kernels with host launchers: fused
 * AdamW over a flat range, the squared global norm (two passes, a fixed
 * reduction order: the same bits every run), scaling and dtype casts. Plain
 * C; every pointer is device memory; `stream` is a cudaStream_t (NULL: the
 * default stream); launches are asynchronous. Errors as src/nn/cuda's
 * launchers (TD_ERR_INVALID_ARGUMENT, TD_ERR_SYSTEM with file:line). */
#ifndef TD_TRAIN_CUDA_OPTIM_H
#define TD_TRAIN_CUDA_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "tandem/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* AdamW with bias correction and decoupled weight decay, the device twin of
 * src/train/optimizer.c's td_adamw_update (PyTorch's AdamW):
 *   g = grads * grad_scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 *   master -= lr (m / (1-b1^t) / (sqrt(v / (1-b2^t)) + eps) + wd master)
 * master, m, v: f32; grads: grad_dtype (f32 or bf16); params_copy: NULL, or
 * the working copy of the parameters written in the same pass (bf16 when
 * copy_dtype is TD_BF16: the master rounded to nearest even; f32 also
 * allowed). t >= 1 is the step number. */
td_status td_cuda_adamw(float *master /* (n) */, void *params_copy /* (n) or NULL */, td_dtype copy_dtype,
                        const void *grads /* (n) */, td_dtype grad_dtype, float *m /* (n) */, float *v /* (n) */,
                        size_t n, float lr, float beta1, float beta2, float eps, float weight_decay, long t,
                        float grad_scale, void *stream);

/* Blocks of the global norm's first pass: the size of its partials scratch. */
#define TD_CUDA_NORM_PARTIALS 512
/* *out = sum of x[i]^2 (f32, device memory), x of `dtype` (f32 or bf16).
 * Pass 1: TD_CUDA_NORM_PARTIALS blocks each sum a fixed strided subset into
 * partials[block]; pass 2: one block adds the partials in a fixed tree
 * order. The result depends on n only, never on timing or the device. */
td_status td_cuda_global_norm_squared(float *out /* (1) */, float *partials /* (TD_CUDA_NORM_PARTIALS) */,
                                      const void *x /* (n) */, size_t n, td_dtype dtype, void *stream);

/* x *= factor (one rounding per element for bf16). */
td_status td_cuda_scale(void *x /* (n) */, size_t n, float factor, td_dtype dtype, void *stream);
/* dst = src converted (f32 <-> bf16 round to nearest even, or a copy). */
td_status td_cuda_cast(void *dst /* (n) */, td_dtype dst_dtype, const void *src /* (n) */, td_dtype src_dtype,
                       size_t n, void *stream);

#ifdef __cplusplus
}
#endif
#endif
