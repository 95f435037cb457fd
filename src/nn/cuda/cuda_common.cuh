/* Shared helpers of Tandem's CUDA kernels (src/nn/cuda, src/train/cuda):
 * the launch macro that nvcc and the CPU emulator (tests/cudaemu) both
 * understand, error checks that name file and line and return td_status
 * (library code never exits), element loads/stores for the two activation
 * types (f32, bf16: arithmetic is always f32), warp/block reductions.
 * Only the CUDA runtime subset of tests/cudaemu/include/cuda_runtime.h may
 * be used, so that CI runs this code under the emulator. */
#ifndef TD_NN_CUDA_COMMON_CUH
#define TD_NN_CUDA_COMMON_CUH

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "tandem/base.h"

/* src/base/base.h is C11 (stdatomic.h) and cannot be included from C++:
 * its error setter, declared again with the same signature. */
extern "C" td_status td_error(td_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#ifndef TD_CUDA_EMU
/* under the emulator, tests/cudaemu/include/cuda_emu.h defines these */
#define TD_CUDA_LAUNCH(kernel, grid, block, smem, stream, ...) \
  kernel<<<(grid), (block), (smem), (cudaStream_t)(stream)>>>(__VA_ARGS__)
#define TD_DYNAMIC_SMEM(T, name) extern __shared__ __align__(128) T name[] /* cp.async/ldmatrix: 16 B */
#endif

/* A CUDA runtime call that must succeed; on failure return TD_ERR_SYSTEM
 * with "file:line: call: CUDA error name: text" in td_last_error(). */
#define TD_CUDA_CHECK(call)                                                                                   \
  do {                                                                                                        \
    cudaError_t td_cuda_e_ = (call);                                                                          \
    if (td_cuda_e_ != cudaSuccess)                                                                            \
      return td_error(TD_ERR_SYSTEM, "%s:%d: %s: %s: %s", __FILE__, __LINE__, #call,                          \
                      cudaGetErrorName(td_cuda_e_), cudaGetErrorString(td_cuda_e_));                          \
  } while (0)
/* After TD_CUDA_LAUNCH: the launch's own error (bad configuration, too much
 * shared memory), named by kernel, file and line. Errors of the kernel's
 * execution show at the next synchronizing call. */
#define TD_CUDA_LAUNCH_CHECK(kernel_name)                                                                     \
  do {                                                                                                        \
    cudaError_t td_cuda_e_ = cudaGetLastError();                                                              \
    if (td_cuda_e_ != cudaSuccess)                                                                            \
      return td_error(TD_ERR_SYSTEM, "%s:%d: launch of %s: %s: %s", __FILE__, __LINE__, kernel_name,          \
                      cudaGetErrorName(td_cuda_e_), cudaGetErrorString(td_cuda_e_));                          \
  } while (0)

/* Evaluate a td_status expression; return it on failure (base.h's TD_CHECK). */
#ifndef TD_CHECK
#define TD_CHECK(expr)              \
  do {                              \
    td_status td_check_s_ = (expr); \
    if (td_check_s_ != TD_OK)       \
      return td_check_s_;           \
  } while (0)
#endif

/* Run the statements after fname with `td_elem` the element type of `dtype`
 * (float or __nv_bfloat16); any other dtype returns TD_ERR_INVALID_ARGUMENT
 * naming the function. */
#define TD_CUDA_DISPATCH(dtype, fname, ...)                                                                   \
  do {                                                                                                        \
    if ((dtype) == TD_F32) {                                                                                  \
      typedef float td_elem;                                                                                  \
      __VA_ARGS__;                                                                                            \
    } else if ((dtype) == TD_BF16) {                                                                          \
      typedef __nv_bfloat16 td_elem;                                                                          \
      __VA_ARGS__;                                                                                            \
    } else {                                                                                                  \
      return td_error(TD_ERR_INVALID_ARGUMENT, "%s: dtype %s: CUDA layers take f32 or bf16", fname,            \
                      td_dtype_name(dtype));                                                                  \
    }                                                                                                         \
  } while (0)

__device__ __forceinline__ float td_to_f32(float x) { return x; }
__device__ __forceinline__ float td_to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T> __device__ __forceinline__ T td_from_f32(float x);
template <> __device__ __forceinline__ float td_from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 td_from_f32<__nv_bfloat16>(float x) { return __float2bfloat16(x); }

__device__ __forceinline__ float td_warp_sum(float v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float td_warp_max(float v) {
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/* Sum (or max) over the whole block, every thread gets the result. The
 * order is fixed by the block size (shuffles within warps, then the warps'
 * results by shuffles in lane order): the same bits every run. blockDim.x a
 * multiple of 32, at most 1024; every thread of the block must call it. */
__device__ __forceinline__ float td_block_reduce(float v, bool is_max) {
  __shared__ float td_block_partials[32];
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
  v = is_max ? td_warp_max(v) : td_warp_sum(v);
  if (lane == 0) td_block_partials[warp] = v;
  __syncthreads();
  float r = lane < n_warps ? td_block_partials[lane] : (is_max ? -INFINITY : 0.0f);
  r = is_max ? td_warp_max(r) : td_warp_sum(r);
  __syncthreads(); /* the partials are reused by the next call */
  return r;
}

/* Elementwise kernels move 16 bytes per thread (8 bf16 or 4 f32) where they
 * can: TD_VEC<T> elements, read and written with one int4 access when `vec`
 * (the host found every pointer 16-byte aligned) and the thread has a whole
 * group; elementwise otherwise (the tail, unaligned pointers). */
template <class T> struct td_vec_width { static const int value = 16 / sizeof(T); };
template <class T>
__device__ __forceinline__ void td_load_group(float *dst, const T *src, int count, bool vec) {
  const int V = td_vec_width<T>::value;
  if (vec && count == V) {
    int4 raw = *(const int4 *)src;
    T vals[V];
    memcpy(vals, &raw, 16);
#pragma unroll
    for (int k = 0; k < V; k++) dst[k] = td_to_f32(vals[k]);
  } else {
    for (int k = 0; k < count; k++) dst[k] = td_to_f32(src[k]);
  }
}
template <class T>
__device__ __forceinline__ void td_store_group(T *dst, const float *src, int count, bool vec) {
  const int V = td_vec_width<T>::value;
  if (vec && count == V) {
    T vals[V];
#pragma unroll
    for (int k = 0; k < V; k++) vals[k] = td_from_f32<T>(src[k]);
    int4 raw;
    memcpy(&raw, vals, 16);
    *(int4 *)dst = raw;
  } else {
    for (int k = 0; k < count; k++) dst[k] = td_from_f32<T>(src[k]);
  }
}
/* GPT-2's GELU (tanh form), 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))),
 * and its derivative: one definition for the elementwise kernels
 * (residual.cu) and the products that fold GELU into their epilogue
 * (matmul.cu's tiled kernel; cuBLASLt's GELU_AUX and DGELU use the same form). */
#define TD_GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */
__device__ __forceinline__ float td_gelu(float x) {
  float cube = 0.044715f * x * x * x;
  return 0.5f * x * (1.0f + tanhf(TD_GELU_SCALE * (x + cube)));
}
__device__ __forceinline__ float td_gelu_grad(float x) {
  float cube = 0.044715f * x * x * x;
  float th = tanhf(TD_GELU_SCALE * (x + cube));
  float sech2 = 1.0f - th * th;
  return 0.5f * (1.0f + th) + x * 0.5f * sech2 * TD_GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
}

static inline bool td_aligned16(const void *a, const void *b, const void *c) {
  return (((uintptr_t)a | (uintptr_t)b | (uintptr_t)c) & 15) == 0;
}

static inline unsigned td_cuda_blocks(size_t n, unsigned threads) { return (unsigned)((n + threads - 1) / threads); }

#endif
