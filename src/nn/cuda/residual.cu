/* The residual stream's add and GELU on the device (llm.c's
 * llmc/{encoder,gelu}.cuh elementwise kernels): elementwise, one element per
 * thread, f32 arithmetic, one rounding per output. */
#include "cuda_common.cuh"
#include "cuda_layers.h"

template <class T> __global__ void residual_kernel(T *out, const T *a, const T *b, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = td_from_f32<T>(td_to_f32(a[i]) + td_to_f32(b[i]));
}

/* GPT-2's GELU: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */
template <class T> __global__ void gelu_forward_kernel(T *out, const T *inp, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float x = td_to_f32(inp[i]);
  float cube = 0.044715f * x * x * x;
  out[i] = td_from_f32<T>(0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + cube))));
}
template <class T> __global__ void gelu_backward_kernel(T *dinp, const T *inp, const T *dout, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float x = td_to_f32(inp[i]);
  float cube = 0.044715f * x * x * x;
  float arg = GELU_SCALE * (x + cube);
  float th = tanhf(arg);
  float sech2 = 1.0f - th * th;
  float grad = 0.5f * (1.0f + th) + x * 0.5f * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
  dinp[i] = td_from_f32<T>(td_to_f32(dinp[i]) + grad * td_to_f32(dout[i]));
}

extern "C" td_status td_cuda_residual_forward(void *out, const void *a, const void *b, size_t n, td_dtype dtype,
                                              void *stream) {
  if (n == 0) return TD_OK;
  TD_CUDA_DISPATCH(dtype, "td_cuda_residual_forward", {
    TD_CUDA_LAUNCH(residual_kernel<td_elem>, td_cuda_blocks(n, 256), 256, 0, stream, (td_elem *)out, (const td_elem *)a,
                   (const td_elem *)b, n);
  });
  TD_CUDA_LAUNCH_CHECK("residual_kernel");
  return TD_OK;
}

extern "C" td_status td_cuda_gelu_forward(void *out, const void *inp, size_t n, td_dtype dtype, void *stream) {
  if (n == 0) return TD_OK;
  TD_CUDA_DISPATCH(dtype, "td_cuda_gelu_forward", {
    TD_CUDA_LAUNCH(gelu_forward_kernel<td_elem>, td_cuda_blocks(n, 256), 256, 0, stream, (td_elem *)out, (const td_elem *)inp, n);
  });
  TD_CUDA_LAUNCH_CHECK("gelu_forward_kernel");
  return TD_OK;
}

extern "C" td_status td_cuda_gelu_backward(void *dinp, const void *inp, const void *dout, size_t n, td_dtype dtype,
                                           void *stream) {
  if (n == 0) return TD_OK;
  TD_CUDA_DISPATCH(dtype, "td_cuda_gelu_backward", {
    TD_CUDA_LAUNCH(gelu_backward_kernel<td_elem>, td_cuda_blocks(n, 256), 256, 0, stream, (td_elem *)dinp, (const td_elem *)inp,
                   (const td_elem *)dout, n);
  });
  TD_CUDA_LAUNCH_CHECK("gelu_backward_kernel");
  return TD_OK;
}
