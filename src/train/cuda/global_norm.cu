/* The squared global norm of the gradients and the elementwise scale/cast
 * kernels of the optimizer step (llm.c's llmc/global_norm.cuh).
 * Norm, deterministic in two passes: pass 1 has a fixed number of blocks
 * (TD_CUDA_NORM_PARTIALS) of 256 threads; the array is read as 16-byte
 * vectors (8 bf16 or 4 f32) after a head up to its first 16-byte boundary
 * (block 0's first threads take the head's and the tail's elements, fewer
 * than 8 each); thread j
 * of block b sums vectors g = b*256 + j + k*(blocks*256) in k order, the
 * block adds its threads' sums in a fixed tree (td_block_reduce);
 * pass 2, one block, adds the partials the same way. No atomics: the bits
 * depend on n and the pointer's alignment only.
 * Bandwidth: the old pass 1 loaded one element (2 bytes in bf16) per
 * thread per step, 131k threads with 256 KB in flight: 354 us for GPT-2
 * 124M's bf16 gradients on an H200 (21% of BW). 16 bytes per load, four in
 * flight (unrolled), give each SM the bytes in flight its share of the
 * bandwidth needs (about 25 KB: 4.8 TB/s times ~0.7 us of latency over 132
 * SMs). */
#include "nn/cuda/cuda_common.cuh"
#include "train/cuda/cuda_optim.h"

#define NORM_THREADS 256

template <class T> __global__ void norm_partials_kernel(float *partials, const T *x, size_t n) {
  const int VW = td_vec_width<T>::value;
  size_t head = (((16 - ((uintptr_t)x & 15)) & 15) / sizeof(T));
  if (head > n) head = n;
  const size_t nvec = (n - head) / VW, tail = head + nvec * VW;
  const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
  float s = 0.0f, v[16 / sizeof(T)];
  if (tid < head) {
    float e = td_to_f32(x[tid]);
    s += e * e;
  }
  const T *xv = x + head;
#pragma unroll 4
  for (size_t g = tid; g < nvec; g += stride) {
    td_load_group(v, xv + g * VW, VW, true);
#pragma unroll
    for (int k = 0; k < VW; k++) s += v[k] * v[k];
  }
  if (tail + tid < n) { /* fewer than VW elements: the first threads take one each */
    float e = td_to_f32(x[tail + tid]);
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
  if (((uintptr_t)x & (dtype == TD_BF16 ? 1 : 3)) != 0)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_cuda_global_norm_squared: %p not aligned to its element size", x);
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
