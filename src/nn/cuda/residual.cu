/* The residual stream's add and GELU on the device (llm.c's
 * llmc/{encoder,gelu}.cuh elementwise kernels): 16 bytes per thread (8 bf16
 * or 4 f32, one int4 access each way when the pointers allow), f32
 * arithmetic, one rounding per output. One kernel template and one launcher
 * template, instantiated per operation (the profile names the kernels
 * elementwise_kernel<T, residual_op> and so on). */
#include "cuda_common.cuh"
#include "cuda_layers.h"

/* One kernel for the four: thread g handles elements [g V, g V + V) of n,
 * V = td_vec_width<T>, and computes out = Op::apply(out, x, y) in f32 over
 * them; Op says which of out and y it reads (the others are not loaded).
 * The ops (td_gelu, td_gelu_grad: cuda_common.cuh): */
struct residual_op { /* out = x + y */
  static const bool reads_out = false, reads_y = true;
  __device__ static float apply(float, float x, float y) { return x + y; }
};
struct gelu_forward_op { /* out = gelu(x) */
  static const bool reads_out = false, reads_y = false;
  __device__ static float apply(float, float x, float) { return td_gelu(x); }
};
struct gelu_backward_op { /* dinp += gelu'(inp) dout: out dinp, x inp, y dout */
  static const bool reads_out = true, reads_y = true;
  __device__ static float apply(float dx, float x, float dy) { return dx + td_gelu_grad(x) * dy; }
};
/* d = gelu'(inp) d in place: GELU's backward when its output gradient is
 * already in d (matmul.cu, where cuBLASLt offers no DGELU epilogue) */
struct gelu_grad_scale_op {
  static const bool reads_out = true, reads_y = false;
  __device__ static float apply(float d, float x, float) { return d * td_gelu_grad(x); }
};

template <class T, class Op>
__global__ void elementwise_kernel(T *out, const T *x, const T *y, size_t n, bool vec) {
  const int V = td_vec_width<T>::value;
  size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * V;
  if (i0 >= n) return;
  int cnt = n - i0 < (size_t)V ? (int)(n - i0) : V;
  float o[16 / sizeof(T)] = {0}, a[16 / sizeof(T)], b[16 / sizeof(T)] = {0};
  td_load_group(a, x + i0, cnt, vec);
  if (Op::reads_y) td_load_group(b, y + i0, cnt, vec);
  if (Op::reads_out) td_load_group(o, out + i0, cnt, vec);
  for (int k = 0; k < cnt; k++) o[k] = Op::apply(o[k], a[k], b[k]);
  td_store_group(out + i0, o, cnt, vec);
}

/* The launchers' one body: 256 threads of 16 bytes a block, the vector
 * path where out, x and y (when read) are 16-byte aligned. */
template <class Op>
static td_status elementwise(const char *fname, void *out, const void *x, const void *y, size_t n, td_dtype dtype,
                             void *stream) {
  if (n == 0) return TD_OK;
  const size_t per_block = (size_t)256 * (16 / (dtype == TD_BF16 ? 2 : 4));
  const unsigned blocks = (unsigned)((n + per_block - 1) / per_block);
  const void *y_or_x = Op::reads_y ? y : x;
  TD_CUDA_DISPATCH(dtype, fname, {
    TD_CUDA_LAUNCH((elementwise_kernel<td_elem, Op>), blocks, 256, 0, stream, (td_elem *)out, (const td_elem *)x,
                   (const td_elem *)y_or_x, n, td_aligned16(out, x, y_or_x));
  });
  TD_CUDA_LAUNCH_CHECK(fname);
  return TD_OK;
}

extern "C" td_status td_cuda_residual_forward(void *out, const void *a, const void *b, size_t n, td_dtype dtype,
                                              void *stream) {
  return elementwise<residual_op>("td_cuda_residual_forward", out, a, b, n, dtype, stream);
}

extern "C" td_status td_cuda_gelu_forward(void *out, const void *inp, size_t n, td_dtype dtype, void *stream) {
  return elementwise<gelu_forward_op>("td_cuda_gelu_forward", out, inp, NULL, n, dtype, stream);
}

extern "C" td_status td_cuda_gelu_backward(void *dinp, const void *inp, const void *dout, size_t n, td_dtype dtype,
                                           void *stream) {
  return elementwise<gelu_backward_op>("td_cuda_gelu_backward", dinp, inp, dout, n, dtype, stream);
}

extern "C" td_status td_cuda_gelu_grad_scale(void *d, const void *inp, size_t n, td_dtype dtype, void *stream) {
  return elementwise<gelu_grad_scale_op>("td_cuda_gelu_grad_scale", d, inp, NULL, n, dtype, stream);
}
