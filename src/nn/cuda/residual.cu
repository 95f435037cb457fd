/* The residual stream's add and GELU on the device (llm.c's
 * llmc/{encoder,gelu}.cuh elementwise kernels): 16 bytes per thread (8 bf16
 * or 4 f32, one int4 access each way when the pointers allow), f32
 * arithmetic, one rounding per output. */
#include "cuda_common.cuh"
#include "cuda_layers.h"

/* thread g handles elements [g V, g V + V) of n, V = td_vec_width<T> */
#define GROUP_SETUP(T)                                                       \
  const int V = td_vec_width<T>::value;                                      \
  size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * V;           \
  if (i0 >= n) return;                                                       \
  int cnt = n - i0 < (size_t)V ? (int)(n - i0) : V;

template <class T> __global__ void residual_kernel(T *out, const T *a, const T *b, size_t n, bool vec) {
  GROUP_SETUP(T)
  float x[16 / sizeof(T)], y[16 / sizeof(T)];
  td_load_group(x, a + i0, cnt, vec);
  td_load_group(y, b + i0, cnt, vec);
  for (int k = 0; k < cnt; k++) x[k] += y[k];
  td_store_group(out + i0, x, cnt, vec);
}

/* GELU: td_gelu / td_gelu_grad (cuda_common.cuh) */
template <class T> __global__ void gelu_forward_kernel(T *out, const T *inp, size_t n, bool vec) {
  GROUP_SETUP(T)
  float x[16 / sizeof(T)];
  td_load_group(x, inp + i0, cnt, vec);
  for (int k = 0; k < cnt; k++) x[k] = td_gelu(x[k]);
  td_store_group(out + i0, x, cnt, vec);
}
template <class T> __global__ void gelu_backward_kernel(T *dinp, const T *inp, const T *dout, size_t n, bool vec) {
  GROUP_SETUP(T)
  float x[16 / sizeof(T)], dy[16 / sizeof(T)], dx[16 / sizeof(T)];
  td_load_group(x, inp + i0, cnt, vec);
  td_load_group(dy, dout + i0, cnt, vec);
  td_load_group(dx, dinp + i0, cnt, vec);
  for (int k = 0; k < cnt; k++) dx[k] += td_gelu_grad(x[k]) * dy[k];
  td_store_group(dinp + i0, dx, cnt, vec);
}

/* d = gelu'(inp) d in place: GELU's backward when its output gradient is
 * already in d (matmul.cu, where cuBLASLt offers no DGELU epilogue) */
template <class T> __global__ void gelu_grad_scale_kernel(T *d, const T *inp, size_t n, bool vec) {
  GROUP_SETUP(T)
  float x[16 / sizeof(T)], dy[16 / sizeof(T)];
  td_load_group(x, inp + i0, cnt, vec);
  td_load_group(dy, d + i0, cnt, vec);
  for (int k = 0; k < cnt; k++) dy[k] *= td_gelu_grad(x[k]);
  td_store_group(d + i0, dy, cnt, vec);
}

static unsigned group_blocks(size_t n, td_dtype dtype) {
  size_t per_block = (size_t)256 * (16 / (dtype == TD_BF16 ? 2 : 4));
  return (unsigned)((n + per_block - 1) / per_block);
}

extern "C" td_status td_cuda_residual_forward(void *out, const void *a, const void *b, size_t n, td_dtype dtype,
                                              void *stream) {
  if (n == 0) return TD_OK;
  TD_CUDA_DISPATCH(dtype, "td_cuda_residual_forward", {
    TD_CUDA_LAUNCH(residual_kernel<td_elem>, group_blocks(n, dtype), 256, 0, stream, (td_elem *)out,
                   (const td_elem *)a, (const td_elem *)b, n, td_aligned16(out, a, b));
  });
  TD_CUDA_LAUNCH_CHECK("residual_kernel");
  return TD_OK;
}

extern "C" td_status td_cuda_gelu_forward(void *out, const void *inp, size_t n, td_dtype dtype, void *stream) {
  if (n == 0) return TD_OK;
  TD_CUDA_DISPATCH(dtype, "td_cuda_gelu_forward", {
    TD_CUDA_LAUNCH(gelu_forward_kernel<td_elem>, group_blocks(n, dtype), 256, 0, stream, (td_elem *)out,
                   (const td_elem *)inp, n, td_aligned16(out, inp, inp));
  });
  TD_CUDA_LAUNCH_CHECK("gelu_forward_kernel");
  return TD_OK;
}

extern "C" td_status td_cuda_gelu_backward(void *dinp, const void *inp, const void *dout, size_t n, td_dtype dtype,
                                           void *stream) {
  if (n == 0) return TD_OK;
  TD_CUDA_DISPATCH(dtype, "td_cuda_gelu_backward", {
    TD_CUDA_LAUNCH(gelu_backward_kernel<td_elem>, group_blocks(n, dtype), 256, 0, stream, (td_elem *)dinp,
                   (const td_elem *)inp, (const td_elem *)dout, n, td_aligned16(dinp, inp, dout));
  });
  TD_CUDA_LAUNCH_CHECK("gelu_backward_kernel");
  return TD_OK;
}

extern "C" td_status td_cuda_gelu_grad_scale(void *d, const void *inp, size_t n, td_dtype dtype, void *stream) {
  if (n == 0) return TD_OK;
  TD_CUDA_DISPATCH(dtype, "td_cuda_gelu_grad_scale", {
    TD_CUDA_LAUNCH(gelu_grad_scale_kernel<td_elem>, group_blocks(n, dtype), 256, 0, stream, (td_elem *)d,
                   (const td_elem *)inp, n, td_aligned16(d, inp, inp));
  });
  TD_CUDA_LAUNCH_CHECK("gelu_grad_scale_kernel");
  return TD_OK;
}
