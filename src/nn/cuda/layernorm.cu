/* Layer normalisation on the device (llm.c's llmc/layernorm.cuh), the twin
 * of td_layernorm_forward/backward, and the fused residual + layer norm.
 * Forward: one warp per row (three passes over the row: mean, variance of
 * the deviations, output), eps 1e-5 as PyTorch.
 * Backward: dinp one warp per row; dweight and dbias are sums over rows,
 * done without atomics by blocks of 32 channels x 32 row lanes: lane y sums
 * rows y, y+32, ... in order, then lane 0 adds the 32 partial sums in order
 * (a fixed order for given shapes: the same bits every run). */
#include "cuda_common.cuh"
#include "cuda_layers.h"

template <class T>
__device__ void layernorm_row(T *out, float *mean, float *rstd, const T *x, const T *weight, const T *bias, int row,
                              int C) {
  int lane = threadIdx.x % 32;
  float s = 0.0f;
  for (int c = lane; c < C; c += 32) s += td_to_f32(x[c]);
  float m = td_warp_sum(s) / C;
  float v = 0.0f;
  for (int c = lane; c < C; c += 32) {
    float d = td_to_f32(x[c]) - m;
    v += d * d;
  }
  float rs = 1.0f / sqrtf(td_warp_sum(v) / C + 1e-5f);
  for (int c = lane; c < C; c += 32)
    out[c] = td_from_f32<T>((td_to_f32(x[c]) - m) * rs * td_to_f32(weight[c]) + td_to_f32(bias[c]));
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = rs;
  }
}

template <class T>
__global__ void layernorm_forward_kernel(T *out, float *mean, float *rstd, const T *inp, const T *weight,
                                         const T *bias, int N, int C) {
  int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= N) return;
  layernorm_row(out + (size_t)row * C, mean, rstd, inp + (size_t)row * C, weight, bias, row, C);
}

/* residual = inp1 + inp2 (rounded to T), then its layer norm; each lane
 * reads back only the residual elements it wrote itself */
template <class T>
__global__ void residual_layernorm_forward_kernel(T *residual, T *out, float *mean, float *rstd, const T *inp1,
                                                  const T *inp2, const T *weight, const T *bias, int N, int C) {
  int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= N) return;
  int lane = threadIdx.x % 32;
  size_t off = (size_t)row * C;
  for (int c = lane; c < C; c += 32)
    residual[off + c] = td_from_f32<T>(td_to_f32(inp1[off + c]) + td_to_f32(inp2[off + c]));
  layernorm_row(out + off, mean, rstd, residual + off, weight, bias, row, C);
}

template <class T>
__global__ void layernorm_backward_dinp_kernel(T *dinp, const T *dout, const T *inp, const T *weight,
                                               const float *mean, const float *rstd, int N, int C) {
  int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= N) return;
  int lane = threadIdx.x % 32;
  const T *x = inp + (size_t)row * C, *dy = dout + (size_t)row * C;
  T *dx = dinp + (size_t)row * C;
  float m = mean[row], rs = rstd[row];
  float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
  for (int c = lane; c < C; c += 32) {
    float norm = (td_to_f32(x[c]) - m) * rs;
    float dnorm = td_to_f32(weight[c]) * td_to_f32(dy[c]);
    dnorm_sum += dnorm;
    dnorm_norm_sum += dnorm * norm;
  }
  float dnorm_mean = td_warp_sum(dnorm_sum) / C, dnorm_norm_mean = td_warp_sum(dnorm_norm_sum) / C;
  for (int c = lane; c < C; c += 32) {
    float norm = (td_to_f32(x[c]) - m) * rs;
    float dnorm = td_to_f32(weight[c]) * td_to_f32(dy[c]);
    float g = (dnorm - dnorm_mean - norm * dnorm_norm_mean) * rs;
    dx[c] = td_from_f32<T>(td_to_f32(dx[c]) + g);
  }
}

template <class T>
__global__ void layernorm_backward_params_kernel(T *dweight, T *dbias, const T *dout, const T *inp,
                                                 const float *mean, const float *rstd, int N, int C) {
  __shared__ float part_w[32][33], part_b[32][33];
  int c = blockIdx.x * 32 + threadIdx.x, y = threadIdx.y;
  float sw = 0.0f, sb = 0.0f;
  if (c < C)
    for (int r = y; r < N; r += 32) {
      float dy = td_to_f32(dout[(size_t)r * C + c]);
      sw += dy * (td_to_f32(inp[(size_t)r * C + c]) - mean[r]) * rstd[r];
      sb += dy;
    }
  part_w[y][threadIdx.x] = sw;
  part_b[y][threadIdx.x] = sb;
  __syncthreads();
  if (y == 0 && c < C) {
    float tw = 0.0f, tb = 0.0f;
    for (int k = 0; k < 32; k++) {
      tw += part_w[k][threadIdx.x];
      tb += part_b[k][threadIdx.x];
    }
    if (dweight) dweight[c] = td_from_f32<T>(td_to_f32(dweight[c]) + tw);
    if (dbias) dbias[c] = td_from_f32<T>(td_to_f32(dbias[c]) + tb);
  }
}

static td_status check_shape(const char *fname, int N, int C) {
  if (N < 0 || C <= 0) return td_error(TD_ERR_INVALID_ARGUMENT, "%s: shape N=%d C=%d", fname, N, C);
  return TD_OK;
}

extern "C" td_status td_cuda_layernorm_forward(void *out, float *mean, float *rstd, const void *inp,
                                               const void *weight, const void *bias, int N, int C, td_dtype dtype,
                                               void *stream) {
  TD_CHECK(check_shape("td_cuda_layernorm_forward", N, C));
  if (N == 0) return TD_OK;
  TD_CUDA_DISPATCH(dtype, "td_cuda_layernorm_forward", {
    TD_CUDA_LAUNCH(layernorm_forward_kernel<td_elem>, td_cuda_blocks((size_t)N, 8), 256, 0, stream, (td_elem *)out, mean, rstd,
                   (const td_elem *)inp, (const td_elem *)weight, (const td_elem *)bias, N, C);
  });
  TD_CUDA_LAUNCH_CHECK("layernorm_forward_kernel");
  return TD_OK;
}

extern "C" td_status td_cuda_residual_layernorm_forward(void *residual, void *out, float *mean, float *rstd,
                                                        const void *inp1, const void *inp2, const void *weight,
                                                        const void *bias, int N, int C, td_dtype dtype,
                                                        void *stream) {
  TD_CHECK(check_shape("td_cuda_residual_layernorm_forward", N, C));
  if (N == 0) return TD_OK;
  TD_CUDA_DISPATCH(dtype, "td_cuda_residual_layernorm_forward", {
    TD_CUDA_LAUNCH(residual_layernorm_forward_kernel<td_elem>, td_cuda_blocks((size_t)N, 8), 256, 0, stream,
                   (td_elem *)residual, (td_elem *)out, mean, rstd, (const td_elem *)inp1, (const td_elem *)inp2, (const td_elem *)weight,
                   (const td_elem *)bias, N, C);
  });
  TD_CUDA_LAUNCH_CHECK("residual_layernorm_forward_kernel");
  return TD_OK;
}

extern "C" td_status td_cuda_layernorm_backward(void *dinp, void *dweight, void *dbias, const void *dout,
                                                const void *inp, const void *weight, const float *mean,
                                                const float *rstd, int N, int C, td_dtype dtype, void *stream) {
  TD_CHECK(check_shape("td_cuda_layernorm_backward", N, C));
  if (N == 0) return TD_OK;
  TD_CUDA_DISPATCH(dtype, "td_cuda_layernorm_backward", {
    if (dinp) {
      TD_CUDA_LAUNCH(layernorm_backward_dinp_kernel<td_elem>, td_cuda_blocks((size_t)N, 8), 256, 0, stream, (td_elem *)dinp,
                     (const td_elem *)dout, (const td_elem *)inp, (const td_elem *)weight, mean, rstd, N, C);
      TD_CUDA_LAUNCH_CHECK("layernorm_backward_dinp_kernel");
    }
    if (dweight || dbias) {
      TD_CUDA_LAUNCH(layernorm_backward_params_kernel<td_elem>, td_cuda_blocks((size_t)C, 32), dim3(32, 32), 0, stream,
                     (td_elem *)dweight, (td_elem *)dbias, (const td_elem *)dout, (const td_elem *)inp, mean, rstd, N, C);
      TD_CUDA_LAUNCH_CHECK("layernorm_backward_params_kernel");
    }
  });
  return TD_OK;
}
