/* Layer normalisation on the device (llm.c's llmc/layernorm.cuh), the twin
 * of td_layernorm_forward/backward, and the fused residual + layer norm.
 * Forward: one warp per row (three passes over the row: mean, variance of
 * the deviations, output), eps 1e-5 as PyTorch.
 *
 * Backward (llm.c's layernorm_backward_kernel10, made deterministic): one
 * kernel reads each row of x and dout once from memory and writes dinp
 * once; it is bandwidth-bound (4 N C element moves: read x, dout, dinp,
 * write dinp, 101 MB in bf16 at GPT-2 124M's N = 16384, C = 768, ~21 us at
 * an H200's 4.8 TB/s). A fixed grid of G blocks of W warps (W = 4, fewer
 * for wide rows; G = min(ceil(N / 4W), 1024): each warp at least 4 rows);
 * warp w of block b takes rows b W + w + k G W in k order, one lane per
 * 16-byte group of 8 bf16 (4 f32) channels, the row's two sums (dnorm and
 * dnorm * norm) by warp shuffles, then dinp += and the row's dweight and
 * dbias terms added into the warp's own slice of shared memory (2 C
 * floats; no other warp writes it, so no atomics). At the block's end the
 * W slices are added in warp order into the block's partial row of the
 * scratch (G x 2 C floats, 6 MB at that shape); a second kernel adds the G
 * partials of each channel, 32 row-lanes each summing a fixed strided
 * subset in order and lane 0 the 32 sums in order, into dweight and dbias.
 * Every sum has an order fixed by (N, C): the same bits every run.
 * The old pair (dinp by one warp per row, dweight/dbias by C/32 blocks of
 * 32 x 32 threads, each walking all rows) ran in 525 us on an H200 in bf16
 * (5.7% of BW, x25 per GPT-2 step): its parameter kernel had 24 blocks for
 * 132 SMs. It stays for rows too wide for the shared slices (C > 6144). */
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

/* ---- backward: the fused kernel and its final reduction (see the top) ---- */
#define LNB_MAX_WARPS 4
#define LNB_MIN_ROWS 4 /* rows per warp at least: partials stay small beside the rows */
#define LNB_MAX_BLOCKS 1024
#define LNB_SMEM_BYTES (48 * 1024)

/* A warp's slice of C channels, padded to whole groups of 32 lanes x VW:
 * lane l's j-th channel of group g, c = g 32 VW + l VW + j, is kept at
 * g 32 VW + j 32 + l, so that the 32 lanes' updates of their j-th channels
 * fall in 32 different banks. Kept at c itself, the lanes' addresses were
 * VW floats apart: 8-way conflicts for bf16 on every one of the 2 C updates
 * a row, which made the kernel 73 us a layer norm at GPT-2 124M's shape on
 * an H200 (ncu, 2026-11-28) for ~100 MB of traffic (~25 us). */
__host__ __device__ static inline int lnb_padded(int C, int VW) { return (C + 32 * VW - 1) / (32 * VW) * (32 * VW); }
__device__ __forceinline__ int lnb_slot(int c, int VW) {
  int g = c / (32 * VW), r = c % (32 * VW);
  return g * 32 * VW + (r % VW) * 32 + r / VW;
}

/* warps per block for rows of C channels (0: too wide for the shared
 * slices, the old kernels run), for every dtype alike (bf16's padding, the
 * wider), so that the scratch's size needs no dtype */
static int lnb_warps(int C) {
  int w = LNB_SMEM_BYTES / (int)(2 * sizeof(float)) / lnb_padded(C, 8);
  return w > LNB_MAX_WARPS ? LNB_MAX_WARPS : w;
}
static int lnb_blocks(int N, int W) {
  long rows = (long)W * LNB_MIN_ROWS, g = (N + rows - 1) / rows;
  return (int)(g > LNB_MAX_BLOCKS ? LNB_MAX_BLOCKS : g < 1 ? 1 : g);
}

template <class T>
__global__ void layernorm_backward_kernel(T *dinp, float *partials, const T *dout, const T *inp, const T *weight,
                                          const float *mean, const float *rstd, int N, int C) {
  const int VW = td_vec_width<T>::value;
  TD_DYNAMIC_SMEM(float, slices);
  const int W = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32, Cp = lnb_padded(C, VW);
  float *sw = slices + (size_t)warp * 2 * Cp, *sb = sw + Cp;
  for (int c = lane; c < 2 * Cp; c += 32) sw[c] = 0.0f;
  __syncwarp();
  for (int row = blockIdx.x * W + warp; row < N; row += gridDim.x * W) {
    const T *x = inp + (size_t)row * C, *dy = dout + (size_t)row * C;
    T *dx = dinp ? dinp + (size_t)row * C : NULL;
    /* 16-byte accesses when this row's pointers allow (C a multiple of VW
     * keeps every row aligned); elementwise otherwise */
    const bool vec = (((uintptr_t)x | (uintptr_t)dy | (uintptr_t)weight | (uintptr_t)dx) & 15) == 0;
    const float m = mean[row], rs = rstd[row];
    float fw[16 / sizeof(T)], fx[16 / sizeof(T)], fdy[16 / sizeof(T)], fdx[16 / sizeof(T)];
    float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
    for (int c0 = lane * VW; c0 < C; c0 += 32 * VW) {
      const int k = C - c0 < VW ? C - c0 : VW;
      td_load_group(fw, weight + c0, k, vec);
      td_load_group(fx, x + c0, k, vec);
      td_load_group(fdy, dy + c0, k, vec);
      for (int j = 0; j < k; j++) {
        float dnorm = fw[j] * fdy[j];
        dnorm_sum += dnorm;
        dnorm_norm_sum += dnorm * ((fx[j] - m) * rs);
      }
    }
    const float dnorm_mean = td_warp_sum(dnorm_sum) / C, dnorm_norm_mean = td_warp_sum(dnorm_norm_sum) / C;
    for (int c0 = lane * VW; c0 < C; c0 += 32 * VW) {
      const int k = C - c0 < VW ? C - c0 : VW;
      /* the second read of the row hits L1/L2: the warp read it just now */
      td_load_group(fw, weight + c0, k, vec);
      td_load_group(fx, x + c0, k, vec);
      td_load_group(fdy, dy + c0, k, vec);
      if (dx) td_load_group(fdx, dx + c0, k, vec);
      const int base = c0 - lane * VW + lane; /* lnb_slot(c0 + j) = base + 32 j */
      for (int j = 0; j < k; j++) {
        float norm = (fx[j] - m) * rs, dnorm = fw[j] * fdy[j];
        sw[base + 32 * j] += fdy[j] * norm;
        sb[base + 32 * j] += fdy[j];
        if (dx) fdx[j] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * rs;
      }
      if (dx) td_store_group(dx + c0, fdx, k, vec);
    }
    __syncwarp(); /* (each lane's channels are the same in every row: no lane
                   * updates another's slice entries; this only keeps rows apart) */
  }
  __syncthreads();
  for (int c = threadIdx.x; c < 2 * C; c += blockDim.x) {
    const int at = (c < C ? 0 : Cp) + lnb_slot(c < C ? c : c - C, VW);
    float acc = 0.0f;
    for (int w = 0; w < W; w++) acc += slices[(size_t)w * 2 * Cp + at];
    partials[(size_t)blockIdx.x * 2 * C + c] = acc;
  }
}

/* dweight (columns [0, C) of the partials) and dbias ([C, 2C)) += the sum
 * over the G partial rows: thread (x, y) sums rows y, y+32, ... of column
 * blockIdx.x*32 + x in order, then y = 0 the 32 sums in order */
template <class T>
__global__ void layernorm_backward_final_kernel(T *dweight, T *dbias, const float *partials, int G, int C) {
  __shared__ float part[32][33];
  const int col = blockIdx.x * 32 + threadIdx.x, y = threadIdx.y;
  float s = 0.0f;
  if (col < 2 * C)
    for (int b = y; b < G; b += 32) s += partials[(size_t)b * 2 * C + col];
  part[y][threadIdx.x] = s;
  __syncthreads();
  if (y != 0 || col >= 2 * C) return;
  float t = 0.0f;
  for (int k = 0; k < 32; k++) t += part[k][threadIdx.x];
  T *d = col < C ? (dweight ? dweight + col : NULL) : (dbias ? dbias + (col - C) : NULL);
  if (d) *d = td_from_f32<T>(td_to_f32(*d) + t);
}

extern "C" size_t td_cuda_layernorm_backward_scratch_floats(int N, int C) {
  if (N <= 0 || C <= 0) return 0;
  int W = lnb_warps(C);
  return W ? (size_t)lnb_blocks(N, W) * 2 * (size_t)C : 0;
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

extern "C" td_status td_cuda_layernorm_backward(void *dinp, void *dweight, void *dbias, float *scratch,
                                                const void *dout, const void *inp, const void *weight,
                                                const float *mean, const float *rstd, int N, int C, td_dtype dtype,
                                                void *stream) {
  TD_CHECK(check_shape("td_cuda_layernorm_backward", N, C));
  if (N == 0) return TD_OK;
  const int W = lnb_warps(C);
  if (W > 0 && !scratch)
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "td_cuda_layernorm_backward: scratch is NULL; pass td_cuda_layernorm_backward_scratch_floats(%d, "
                    "%d) floats of device memory",
                    N, C);
  TD_CUDA_DISPATCH(dtype, "td_cuda_layernorm_backward", {
    if (W > 0) {
      const int G = lnb_blocks(N, W);
      const size_t smem = (size_t)W * 2 * lnb_padded(C, td_vec_width<td_elem>::value) * sizeof(float);
      TD_CUDA_LAUNCH(layernorm_backward_kernel<td_elem>, G, W * 32, smem, stream,
                     (td_elem *)dinp, scratch, (const td_elem *)dout, (const td_elem *)inp, (const td_elem *)weight,
                     mean, rstd, N, C);
      TD_CUDA_LAUNCH_CHECK("layernorm_backward_kernel");
      if (dweight || dbias) {
        TD_CUDA_LAUNCH(layernorm_backward_final_kernel<td_elem>, td_cuda_blocks((size_t)2 * C, 32), dim3(32, 32), 0,
                       stream, (td_elem *)dweight, (td_elem *)dbias, (const float *)scratch, G, C);
        TD_CUDA_LAUNCH_CHECK("layernorm_backward_final_kernel");
      }
    } else {
      if (dinp) {
        TD_CUDA_LAUNCH(layernorm_backward_dinp_kernel<td_elem>, td_cuda_blocks((size_t)N, 8), 256, 0, stream,
                       (td_elem *)dinp, (const td_elem *)dout, (const td_elem *)inp, (const td_elem *)weight, mean,
                       rstd, N, C);
        TD_CUDA_LAUNCH_CHECK("layernorm_backward_dinp_kernel");
      }
      if (dweight || dbias) {
        TD_CUDA_LAUNCH(layernorm_backward_params_kernel<td_elem>, td_cuda_blocks((size_t)C, 32), dim3(32, 32), 0,
                       stream, (td_elem *)dweight, (td_elem *)dbias, (const td_elem *)dout, (const td_elem *)inp, mean,
                       rstd, N, C);
        TD_CUDA_LAUNCH_CHECK("layernorm_backward_params_kernel");
      }
    }
  });
  return TD_OK;
}
