/* The squared global norm of the gradients and the elementwise scale/cast
 * kernels of the optimizer step (llm.c's llmc/global_norm.cuh).
 * Norm, deterministic in two passes: pass 1 has a fixed number of blocks
 * (TD_CUDA_NORM_PARTIALS) of 256 threads; thread j of block b sums the
 * elements i = b*256 + j + k*(blocks*256) in k order, the block adds its
 * threads' sums in a fixed tree (td_block_reduce);
 * pass 2, one block, adds the partials the same way. No atomics: the bits
 * depend on n only. */
#include "nn/cuda/cuda_common.cuh"
#include "train/cuda/cuda_optim.h"

#define NORM_THREADS 256

template <class T> __global__ void norm_partials_kernel(float *partials, const T *x, size_t n) {
  float s = 0.0f;
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    float e = td_to_f32(x[i]);
    s += e * e;
  }
  float total = td_block_reduce(s, false);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

__global__ void norm_final_kernel(float *out, const float *partials, int n_partials) {
  float s = 0.0f;
  for (int i = threadIdx.x; i < n_partials; i += blockDim.x) s += partials[i];
  float total = td_block_reduce(s, false);
  if (threadIdx.x == 0) *out = total;
}

template <class T> __global__ void scale_kernel(T *x, size_t n, float factor) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = td_from_f32<T>(td_to_f32(x[i]) * factor);
}

template <class D, class S> __global__ void cast_kernel(D *dst, const S *src, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = td_from_f32<D>(td_to_f32(src[i]));
}

extern "C" td_status td_cuda_global_norm_squared(float *out, float *partials, const void *x, size_t n,
                                                 td_dtype dtype, void *stream) {
  TD_CUDA_DISPATCH(dtype, "td_cuda_global_norm_squared", {
    TD_CUDA_LAUNCH(norm_partials_kernel<td_elem>, TD_CUDA_NORM_PARTIALS, NORM_THREADS, 0, stream, partials, (const td_elem *)x,
                   n);
  });
  TD_CUDA_LAUNCH_CHECK("norm_partials_kernel");
  TD_CUDA_LAUNCH(norm_final_kernel, 1, NORM_THREADS, 0, stream, out, (const float *)partials, TD_CUDA_NORM_PARTIALS);
  TD_CUDA_LAUNCH_CHECK("norm_final_kernel");
  return TD_OK;
}

extern "C" td_status td_cuda_scale(void *x, size_t n, float factor, td_dtype dtype, void *stream) {
  if (n == 0) return TD_OK;
  TD_CUDA_DISPATCH(dtype, "td_cuda_scale",
                   { TD_CUDA_LAUNCH(scale_kernel<td_elem>, td_cuda_blocks(n, 256), 256, 0, stream, (td_elem *)x, n, factor); });
  TD_CUDA_LAUNCH_CHECK("scale_kernel");
  return TD_OK;
}

extern "C" td_status td_cuda_cast(void *dst, td_dtype dst_dtype, const void *src, td_dtype src_dtype, size_t n,
                                  void *stream) {
  if ((dst_dtype != TD_F32 && dst_dtype != TD_BF16) || (src_dtype != TD_F32 && src_dtype != TD_BF16))
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_cuda_cast: %s to %s (f32 and bf16 only)", td_dtype_name(src_dtype),
                    td_dtype_name(dst_dtype));
  if (n == 0) return TD_OK;
  /* (through a pointer: a template-id with a comma cannot be a macro argument) */
  if (dst_dtype == TD_F32 && src_dtype == TD_F32) {
    auto *kernel = &cast_kernel<float, float>;
    TD_CUDA_LAUNCH(kernel, td_cuda_blocks(n, 256), 256, 0, stream, (float *)dst, (const float *)src, n);
  } else if (dst_dtype == TD_F32) {
    auto *kernel = &cast_kernel<float, __nv_bfloat16>;
    TD_CUDA_LAUNCH(kernel, td_cuda_blocks(n, 256), 256, 0, stream, (float *)dst, (const __nv_bfloat16 *)src, n);
  } else if (src_dtype == TD_F32) {
    auto *kernel = &cast_kernel<__nv_bfloat16, float>;
    TD_CUDA_LAUNCH(kernel, td_cuda_blocks(n, 256), 256, 0, stream, (__nv_bfloat16 *)dst, (const float *)src, n);
  } else {
    auto *kernel = &cast_kernel<__nv_bfloat16, __nv_bfloat16>;
    TD_CUDA_LAUNCH(kernel, td_cuda_blocks(n, 256), 256, 0, stream, (__nv_bfloat16 *)dst, (const __nv_bfloat16 *)src,
                   n);
  }
  TD_CUDA_LAUNCH_CHECK("cast_kernel");
  return TD_OK;
}
