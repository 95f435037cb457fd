/* Fused AdamW on the device (llm.c's llmc/adamw.cuh): one pass over the
 * flat range reads the gradient (f32 or bf16), updates the f32 moments and
 * master weights, and writes the working copy of the parameters (bf16 for
 * mixed precision) in the same pass, so the copy costs no extra read of the
 * master. Bias corrections are computed once on the host. */
#include "nn/cuda/cuda_common.cuh"
#include "train/cuda/cuda_optim.h"

#include <math.h>

template <class G, class P>
__global__ void adamw_kernel(float *master, P *copy, const G *grads, float *m, float *v, size_t n, float lr,
                             float beta1, float beta2, float eps, float weight_decay, float inv_c1, float inv_c2,
                             float grad_scale) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float g = td_to_f32(grads[i]) * grad_scale;
  float mi = beta1 * m[i] + (1.0f - beta1) * g;
  float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
  m[i] = mi;
  v[i] = vi;
  float p = master[i];
  p -= lr * (mi * inv_c1 / (sqrtf(vi * inv_c2) + eps) + weight_decay * p);
  master[i] = p;
  if (copy) copy[i] = td_from_f32<P>(p);
}

template <class G>
static td_status adamw_launch(float *master, void *copy, td_dtype copy_dtype, const G *grads, float *m, float *v,
                              size_t n, float lr, float beta1, float beta2, float eps, float wd, float inv_c1,
                              float inv_c2, float grad_scale, void *stream) {
  unsigned blocks = td_cuda_blocks(n, 256);
  /* (through a pointer: a template-id with a comma cannot be a macro argument) */
  if (copy && copy_dtype == TD_BF16) {
    auto *kernel = &adamw_kernel<G, __nv_bfloat16>;
    TD_CUDA_LAUNCH(kernel, blocks, 256, 0, stream, master, (__nv_bfloat16 *)copy, grads, m, v, n, lr, beta1, beta2,
                   eps, wd, inv_c1, inv_c2, grad_scale);
  } else {
    auto *kernel = &adamw_kernel<G, float>;
    TD_CUDA_LAUNCH(kernel, blocks, 256, 0, stream, master, (float *)copy, grads, m, v, n, lr, beta1, beta2, eps, wd,
                   inv_c1, inv_c2, grad_scale);
  }
  TD_CUDA_LAUNCH_CHECK("adamw_kernel");
  return TD_OK;
}

extern "C" td_status td_cuda_adamw(float *master, void *params_copy, td_dtype copy_dtype, const void *grads,
                                   td_dtype grad_dtype, float *m, float *v, size_t n, float lr, float beta1,
                                   float beta2, float eps, float weight_decay, long t, float grad_scale,
                                   void *stream) {
  if (t < 1) return td_error(TD_ERR_INVALID_ARGUMENT, "td_cuda_adamw: step %ld (steps count from 1)", t);
  if (params_copy && copy_dtype != TD_F32 && copy_dtype != TD_BF16)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_cuda_adamw: parameter copy dtype %s (f32 or bf16)",
                    td_dtype_name(copy_dtype));
  if (n == 0) return TD_OK;
  /* as optimizer.c: the corrections in f32 from powf */
  float inv_c1 = 1.0f / (1.0f - powf(beta1, (float)t)), inv_c2 = 1.0f / (1.0f - powf(beta2, (float)t));
  if (grad_dtype == TD_F32)
    return adamw_launch(master, params_copy, copy_dtype, (const float *)grads, m, v, n, lr, beta1, beta2, eps,
                        weight_decay, inv_c1, inv_c2, grad_scale, stream);
  if (grad_dtype == TD_BF16)
    return adamw_launch(master, params_copy, copy_dtype, (const __nv_bfloat16 *)grads, m, v, n, lr, beta1, beta2, eps,
                        weight_decay, inv_c1, inv_c2, grad_scale, stream);
  return td_error(TD_ERR_INVALID_ARGUMENT, "td_cuda_adamw: gradient dtype %s (f32 or bf16)",
                  td_dtype_name(grad_dtype));
}
