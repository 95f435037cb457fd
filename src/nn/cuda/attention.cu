/* Causal multi-head self-attention on the device: the unfused, correct path
 * (llm.c's first train_gpt2.cu), the twin of td_attention_forward/backward.
 * inp (B, T, 3C) holds q, k, v; head h uses channels [h hs, (h+1) hs) of each.
 * Forward, one warp per query row (b, h, t):
 *   1. scores s[t2] = q.k[t2] / sqrt(hs) for t2 <= t, the row's max and the
 *      sum of exp(s - max), att[t2] = exp(s - max) / sum, zero above t;
 *   2. out[b, t, h] = sum_t2 att[t2] v[t2] (lanes over the head's channels).
 * Backward, without atomics, by the index each gradient belongs to:
 *   A. per query row t1: datt[t2] = dout[t1].v[t2], dpre = att (datt -
 *      sum(att datt)) into scratch, dq[t1] += dpre . k / sqrt(hs);
 *   B. per key row t2: dv[t2] += sum_{t1>=t2} att[t1, t2] dout[t1],
 *      dk[t2] += sum_{t1>=t2} dpre[t1, t2] q[t1] / sqrt(hs).
 * Cost: O(B NH T^2 hs) like the CPU layer, with att and scratch of
 * B NH T^2 floats in device memory; the fused flash-style kernel that keeps
 * neither is the faster path still to come. */
#include "cuda_common.cuh"
#include "cuda_layers.h"

template <class T>
__global__ void attention_softmax_kernel(float *att, const T *inp, int B, int T_, int C, int NH) {
  int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; /* (b, h, t) */
  if (row >= B * NH * T_) return;
  int lane = threadIdx.x % 32, t = row % T_, h = (row / T_) % NH, b = row / (T_ * NH);
  int hs = C / NH;
  float scale = 1.0f / sqrtf((float)hs);
  const T *q = inp + ((size_t)b * T_ + t) * 3 * C + (size_t)h * hs;
  float *a = att + (size_t)row * T_;
  float mx = -INFINITY;
  for (int t2 = lane; t2 <= t; t2 += 32) {
    const T *k = inp + ((size_t)b * T_ + t2) * 3 * C + C + (size_t)h * hs;
    float s = 0.0f;
    for (int d = 0; d < hs; d++) s += td_to_f32(q[d]) * td_to_f32(k[d]);
    s *= scale;
    a[t2] = s;
    mx = fmaxf(mx, s);
  }
  mx = td_warp_max(mx);
  float sum = 0.0f;
  for (int t2 = lane; t2 <= t; t2 += 32) {
    float e = expf(a[t2] - mx);
    a[t2] = e;
    sum += e;
  }
  float inv = 1.0f / td_warp_sum(sum);
  for (int t2 = lane; t2 < T_; t2 += 32) a[t2] = t2 <= t ? a[t2] * inv : 0.0f;
}

template <class T>
__global__ void attention_value_kernel(T *out, const float *att, const T *inp, int B, int T_, int C, int NH) {
  int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= B * NH * T_) return;
  int lane = threadIdx.x % 32, t = row % T_, h = (row / T_) % NH, b = row / (T_ * NH);
  int hs = C / NH;
  const float *a = att + (size_t)row * T_;
  T *o = out + ((size_t)b * T_ + t) * C + (size_t)h * hs;
  for (int d = lane; d < hs; d += 32) {
    float acc = 0.0f;
    for (int t2 = 0; t2 <= t; t2++) acc += a[t2] * td_to_f32(inp[((size_t)b * T_ + t2) * 3 * C + 2 * C + (size_t)h * hs + d]);
    o[d] = td_from_f32<T>(acc);
  }
}

template <class T>
__global__ void attention_backward_query_kernel(T *dinp, float *dpre, const T *dout, const T *inp, const float *att,
                                                int B, int T_, int C, int NH) {
  int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= B * NH * T_) return;
  int lane = threadIdx.x % 32, t = row % T_, h = (row / T_) % NH, b = row / (T_ * NH);
  int hs = C / NH;
  float scale = 1.0f / sqrtf((float)hs);
  const float *a = att + (size_t)row * T_;
  float *dp = dpre + (size_t)row * T_;
  const T *dy = dout + ((size_t)b * T_ + t) * C + (size_t)h * hs;
  float dot = 0.0f;
  for (int t2 = lane; t2 <= t; t2 += 32) {
    const T *v = inp + ((size_t)b * T_ + t2) * 3 * C + 2 * C + (size_t)h * hs;
    float s = 0.0f;
    for (int d = 0; d < hs; d++) s += td_to_f32(dy[d]) * td_to_f32(v[d]);
    dp[t2] = s; /* datt for now */
    dot += a[t2] * s;
  }
  dot = td_warp_sum(dot);
  for (int t2 = lane; t2 < T_; t2 += 32) dp[t2] = t2 <= t ? a[t2] * (dp[t2] - dot) : 0.0f;
  __syncwarp(); /* every lane reads the whole dpre row below */
  T *dq = dinp + ((size_t)b * T_ + t) * 3 * C + (size_t)h * hs;
  for (int d = lane; d < hs; d += 32) {
    float acc = 0.0f;
    for (int t2 = 0; t2 <= t; t2++) acc += dp[t2] * td_to_f32(inp[((size_t)b * T_ + t2) * 3 * C + C + (size_t)h * hs + d]);
    dq[d] = td_from_f32<T>(td_to_f32(dq[d]) + acc * scale);
  }
}

template <class T>
__global__ void attention_backward_key_kernel(T *dinp, const float *dpre, const T *dout, const T *inp, const float *att,
                                              int B, int T_, int C, int NH) {
  int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; /* (b, h, t2) */
  if (row >= B * NH * T_) return;
  int lane = threadIdx.x % 32, t2 = row % T_, h = (row / T_) % NH, b = row / (T_ * NH);
  int hs = C / NH;
  float scale = 1.0f / sqrtf((float)hs);
  size_t head_rows = ((size_t)b * NH + h) * T_; /* first (b, h, t1) row of att */
  T *dk = dinp + ((size_t)b * T_ + t2) * 3 * C + C + (size_t)h * hs;
  T *dv = dk + C;
  for (int d = lane; d < hs; d += 32) {
    float ak = 0.0f, av = 0.0f;
    for (int t1 = t2; t1 < T_; t1++) {
      size_t idx = (head_rows + t1) * T_ + t2;
      ak += dpre[idx] * td_to_f32(inp[((size_t)b * T_ + t1) * 3 * C + (size_t)h * hs + d]);
      av += att[idx] * td_to_f32(dout[((size_t)b * T_ + t1) * C + (size_t)h * hs + d]);
    }
    dk[d] = td_from_f32<T>(td_to_f32(dk[d]) + ak * scale);
    dv[d] = td_from_f32<T>(td_to_f32(dv[d]) + av);
  }
}

static td_status check_shape(const char *fname, int B, int T, int C, int NH) {
  if (B < 0 || T < 0 || C <= 0 || NH <= 0 || C % NH)
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: shape B=%d T=%d C=%d NH=%d (C must be a multiple of NH)", fname, B,
                    T, C, NH);
  return TD_OK;
}

extern "C" td_status td_cuda_attention_forward(void *out, float *att, const void *inp, int B, int T, int C, int NH,
                                               td_dtype dtype, void *stream) {
  TD_CHECK(check_shape("td_cuda_attention_forward", B, T, C, NH));
  size_t rows = (size_t)B * NH * T;
  if (rows == 0) return TD_OK;
  TD_CUDA_DISPATCH(dtype, "td_cuda_attention_forward", {
    TD_CUDA_LAUNCH(attention_softmax_kernel<td_elem>, td_cuda_blocks(rows, 8), 256, 0, stream, att, (const td_elem *)inp, B, T,
                   C, NH);
    TD_CUDA_LAUNCH_CHECK("attention_softmax_kernel");
    TD_CUDA_LAUNCH(attention_value_kernel<td_elem>, td_cuda_blocks(rows, 8), 256, 0, stream, (td_elem *)out, (const float *)att,
                   (const td_elem *)inp, B, T, C, NH);
    TD_CUDA_LAUNCH_CHECK("attention_value_kernel");
  });
  return TD_OK;
}

extern "C" td_status td_cuda_attention_backward(void *dinp, float *scratch, const void *dout, const void *inp,
                                                const float *att, int B, int T, int C, int NH, td_dtype dtype,
                                                void *stream) {
  TD_CHECK(check_shape("td_cuda_attention_backward", B, T, C, NH));
  size_t rows = (size_t)B * NH * T;
  if (rows == 0) return TD_OK;
  TD_CUDA_DISPATCH(dtype, "td_cuda_attention_backward", {
    TD_CUDA_LAUNCH(attention_backward_query_kernel<td_elem>, td_cuda_blocks(rows, 8), 256, 0, stream, (td_elem *)dinp, scratch,
                   (const td_elem *)dout, (const td_elem *)inp, att, B, T, C, NH);
    TD_CUDA_LAUNCH_CHECK("attention_backward_query_kernel");
    TD_CUDA_LAUNCH(attention_backward_key_kernel<td_elem>, td_cuda_blocks(rows, 8), 256, 0, stream, (td_elem *)dinp,
                   (const float *)scratch, (const td_elem *)dout, (const td_elem *)inp, att, B, T, C, NH);
    TD_CUDA_LAUNCH_CHECK("attention_backward_key_kernel");
  });
  return TD_OK;
}
