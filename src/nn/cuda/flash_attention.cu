/* Fused causal attention on the device, flash-style (FlashAttention-2's
 * loop order on CUDA cores), beside the unfused path of attention.cu:
 * neither the (B, NH, T, T) weights nor their gradient is ever stored, only
 * the log-sum-exp of each query row (B, NH, T) for backward.
 * Tiles of 32 rows; one thread per row of the tile; K/V (or Q/dO) tiles of
 * 32 rows staged in shared memory as f32 and read by all threads at the
 * same address (broadcast); accumulators in registers (HS, the head size,
 * is a template parameter so that they stay there); f32 arithmetic for f32
 * and bf16 inputs, one rounding per output.
 *   forward (per query tile): for each key tile up to the diagonal, the 32
 *     scores of the row, their max, rescale (online softmax), accumulate
 *     p v; out = acc / l, lse = m + log l.
 *   backward: D_i = dO_i . O_i per query row; then dK, dV per key tile
 *     (loop over query tiles from the diagonal: p = exp(s - lse), dv += p dO,
 *     ds = p (dO.v - D), dk += ds q / sqrt(hs)) and dQ per query tile (loop
 *     over key tiles up to the diagonal: dq += ds k / sqrt(hs)), recomputing
 *     p and ds in both instead of adding dq with atomics: the same bits
 *     every run.
 * Limits: head sizes 8, 16, 24, 32, 48, 64 (td_cuda_attention_fused says so;
 * others take the unfused path). No tensor cores yet: the products are
 * f32 FMAs. */
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"
#include "cuda_layers.h"

#define FA_TILE 32

template <class T, int HS>
__global__ void flash_forward_kernel(T *out, float *lse, const T *inp, int T_, int C, int NH, float scale) {
  __shared__ float Ks[FA_TILE][HS], Vs[FA_TILE][HS];
  int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  int tid = threadIdx.x, t = blockIdx.x * FA_TILE + tid;
  size_t row3 = (size_t)3 * C;
  const T *base = inp + (size_t)b * T_ * row3 + (size_t)h * HS;
  float q[HS], acc[HS];
  float m = -INFINITY, l = 0.0f;
#pragma unroll
  for (int d = 0; d < HS; d++) {
    q[d] = t < T_ ? td_to_f32(base[(size_t)t * row3 + d]) * scale : 0.0f;
    acc[d] = 0.0f;
  }
  for (int kt = 0; kt <= (int)blockIdx.x; kt++) {
    int j0 = kt * FA_TILE;
    for (int e = tid; e < FA_TILE * HS; e += FA_TILE) { /* coalesced: consecutive threads, consecutive d */
      int r = e / HS, d = e % HS;
      bool in = j0 + r < T_;
      Ks[r][d] = in ? td_to_f32(base[(size_t)(j0 + r) * row3 + C + d]) : 0.0f;
      Vs[r][d] = in ? td_to_f32(base[(size_t)(j0 + r) * row3 + 2 * C + d]) : 0.0f;
    }
    __syncthreads();
    if (t < T_) {
      int n_keys = min(FA_TILE, t - j0 + 1); /* causal: keys j0 .. t; t < T_ bounds them too */
      float s[FA_TILE];
      float tile_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < FA_TILE; j++) {
        float dot = 0.0f;
        if (j < n_keys) {
#pragma unroll
          for (int d = 0; d < HS; d++) dot += q[d] * Ks[j][d];
          tile_max = fmaxf(tile_max, dot);
        }
        s[j] = dot;
      }
      float m_new = fmaxf(m, tile_max);
      float corr = expf(m - m_new); /* 0 on the first tile (m = -inf) */
      l *= corr;
#pragma unroll
      for (int d = 0; d < HS; d++) acc[d] *= corr;
#pragma unroll
      for (int j = 0; j < FA_TILE; j++) {
        if (j < n_keys) {
          float p = expf(s[j] - m_new);
          l += p;
#pragma unroll
          for (int d = 0; d < HS; d++) acc[d] += p * Vs[j][d];
        }
      }
      m = m_new;
    }
    __syncthreads();
  }
  if (t < T_) {
    T *o = out + ((size_t)b * T_ + t) * C + (size_t)h * HS;
    float inv = 1.0f / l;
#pragma unroll
    for (int d = 0; d < HS; d++) o[d] = td_from_f32<T>(acc[d] * inv);
    lse[(size_t)bh * T_ + t] = m + logf(l);
  }
}

/* D[b, h, t] = dO . O over the head's channels */
template <class T>
__global__ void flash_backward_dot_kernel(float *D, const T *dout, const T *out, int B, int T_, int C, int NH) {
  size_t row = (size_t)blockIdx.x * blockDim.x + threadIdx.x; /* (b, h, t) */
  if (row >= (size_t)B * NH * T_) return;
  int t = (int)(row % T_), h = (int)((row / T_) % NH), b = (int)(row / ((size_t)T_ * NH));
  int hs = C / NH;
  size_t off = ((size_t)b * T_ + t) * C + (size_t)h * hs;
  float s = 0.0f;
  for (int d = 0; d < hs; d++) s += td_to_f32(dout[off + d]) * td_to_f32(out[off + d]);
  D[row] = s;
}

template <class T, int HS>
__global__ void flash_backward_kv_kernel(T *dinp, const T *dout, const T *inp, const float *lse, const float *D,
                                         int T_, int C, int NH, float scale) {
  __shared__ float Qs[FA_TILE][HS], dOs[FA_TILE][HS], Ls[FA_TILE], Ds[FA_TILE];
  /* this tile's own k and v rows: read by their thread only, padded so that
   * the 32 threads' rows fall in different banks (registers would hold
   * dk, dv, k and v: 4 HS floats, which spills at HS = 64) */
  __shared__ float Kown[FA_TILE][HS + 1], Vown[FA_TILE][HS + 1];
  int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  int tid = threadIdx.x, j = blockIdx.x * FA_TILE + tid; /* this thread's key row */
  size_t row3 = (size_t)3 * C;
  const T *base = inp + (size_t)b * T_ * row3 + (size_t)h * HS;
  const T *dbase = dout + (size_t)b * T_ * C + (size_t)h * HS;
  float dk[HS], dv[HS];
  float *k = Kown[tid], *v = Vown[tid];
#pragma unroll
  for (int d = 0; d < HS; d++) {
    k[d] = j < T_ ? td_to_f32(base[(size_t)j * row3 + C + d]) : 0.0f;
    v[d] = j < T_ ? td_to_f32(base[(size_t)j * row3 + 2 * C + d]) : 0.0f;
    dk[d] = dv[d] = 0.0f;
  }
  int n_tiles = (T_ + FA_TILE - 1) / FA_TILE;
  for (int qt = blockIdx.x; qt < n_tiles; qt++) {
    int i0 = qt * FA_TILE;
    for (int e = tid; e < FA_TILE * HS; e += FA_TILE) {
      int r = e / HS, d = e % HS;
      bool in = i0 + r < T_;
      Qs[r][d] = in ? td_to_f32(base[(size_t)(i0 + r) * row3 + d]) : 0.0f;
      dOs[r][d] = in ? td_to_f32(dbase[(size_t)(i0 + r) * C + d]) : 0.0f;
    }
    Ls[tid] = i0 + tid < T_ ? lse[(size_t)bh * T_ + i0 + tid] : 0.0f;
    Ds[tid] = i0 + tid < T_ ? D[(size_t)bh * T_ + i0 + tid] : 0.0f;
    __syncthreads();
    if (j < T_) {
#pragma unroll 1
      for (int i = 0; i < FA_TILE; i++) {
        int qi = i0 + i;
        if (qi < j || qi >= T_) continue; /* causal: queries at or after this key */
        float s = 0.0f, dp = 0.0f;
#pragma unroll
        for (int d = 0; d < HS; d++) {
          s += Qs[i][d] * k[d];
          dp += dOs[i][d] * v[d];
        }
        float p = expf(s * scale - Ls[i]);
        float ds = p * (dp - Ds[i]) * scale;
#pragma unroll
        for (int d = 0; d < HS; d++) {
          dv[d] += p * dOs[i][d];
          dk[d] += ds * Qs[i][d];
        }
      }
    }
    __syncthreads();
  }
  if (j < T_) {
    T *dkp = dinp + ((size_t)b * T_ + j) * row3 + C + (size_t)h * HS, *dvp = dkp + C;
#pragma unroll
    for (int d = 0; d < HS; d++) {
      dkp[d] = td_from_f32<T>(td_to_f32(dkp[d]) + dk[d]);
      dvp[d] = td_from_f32<T>(td_to_f32(dvp[d]) + dv[d]);
    }
  }
}

template <class T, int HS>
__global__ void flash_backward_q_kernel(T *dinp, const T *dout, const T *inp, const float *lse, const float *D, int T_,
                                        int C, int NH, float scale) {
  __shared__ float Ks[FA_TILE][HS], Vs[FA_TILE][HS];
  int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  int tid = threadIdx.x, i = blockIdx.x * FA_TILE + tid; /* this thread's query row */
  size_t row3 = (size_t)3 * C;
  const T *base = inp + (size_t)b * T_ * row3 + (size_t)h * HS;
  float q[HS], dO[HS], dq[HS];
  size_t dro = ((size_t)b * T_ + i) * C + (size_t)h * HS;
#pragma unroll
  for (int d = 0; d < HS; d++) {
    q[d] = i < T_ ? td_to_f32(base[(size_t)i * row3 + d]) : 0.0f;
    dO[d] = i < T_ ? td_to_f32(dout[dro + d]) : 0.0f;
    dq[d] = 0.0f;
  }
  float L = i < T_ ? lse[(size_t)bh * T_ + i] : 0.0f, Di = i < T_ ? D[(size_t)bh * T_ + i] : 0.0f;
  for (int kt = 0; kt <= (int)blockIdx.x; kt++) {
    int j0 = kt * FA_TILE;
    for (int e = tid; e < FA_TILE * HS; e += FA_TILE) {
      int r = e / HS, d = e % HS;
      bool in = j0 + r < T_;
      Ks[r][d] = in ? td_to_f32(base[(size_t)(j0 + r) * row3 + C + d]) : 0.0f;
      Vs[r][d] = in ? td_to_f32(base[(size_t)(j0 + r) * row3 + 2 * C + d]) : 0.0f;
    }
    __syncthreads();
    if (i < T_) {
      int n_keys = min(FA_TILE, i - j0 + 1);
#pragma unroll 1
      for (int j = 0; j < FA_TILE; j++) {
        if (j >= n_keys) continue;
        float s = 0.0f, dp = 0.0f;
#pragma unroll
        for (int d = 0; d < HS; d++) {
          s += q[d] * Ks[j][d];
          dp += dO[d] * Vs[j][d];
        }
        float p = expf(s * scale - L);
        float ds = p * (dp - Di) * scale;
#pragma unroll
        for (int d = 0; d < HS; d++) dq[d] += ds * Ks[j][d];
      }
    }
    __syncthreads();
  }
  if (i < T_) {
    T *dqp = dinp + ((size_t)b * T_ + i) * row3 + (size_t)h * HS;
#pragma unroll
    for (int d = 0; d < HS; d++) dqp[d] = td_from_f32<T>(td_to_f32(dqp[d]) + dq[d]);
  }
}

static bool head_size_supported(int hs) {
  return hs == 8 || hs == 16 || hs == 24 || hs == 32 || hs == 48 || hs == 64;
}

extern "C" td_status td_cuda_attention_fused(int head_size, int *fused_out) {
  const char *e = getenv("TANDEM_CUDA_ATTENTION");
  int want_fused = 1, forced = 0;
  if (e && *e) {
    if (strcmp(e, "unfused") == 0)
      want_fused = 0;
    else if (strcmp(e, "fused") == 0)
      forced = 1;
    else
      return td_error(TD_ERR_INVALID_ARGUMENT, "TANDEM_CUDA_ATTENTION=%s: use fused or unfused", e);
  }
  if (want_fused && !head_size_supported(head_size)) {
    if (forced)
      return td_error(TD_ERR_INVALID_ARGUMENT,
                      "TANDEM_CUDA_ATTENTION=fused: the fused kernel takes head sizes 8, 16, 24, 32, 48, 64, not %d "
                      "(unset it to use the unfused path)",
                      head_size);
    want_fused = 0;
  }
  *fused_out = want_fused;
  return TD_OK;
}

static td_status check_shape(const char *fname, int B, int T, int C, int NH) {
  if (B < 0 || T < 0 || C <= 0 || NH <= 0 || C % NH)
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: shape B=%d T=%d C=%d NH=%d (C must be a multiple of NH)", fname, B,
                    T, C, NH);
  if (!head_size_supported(C / NH))
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: head size %d: the fused kernel takes 8, 16, 24, 32, 48 or 64",
                    fname, C / NH);
  if ((size_t)B * NH > 65535)
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: B*NH = %zu exceeds the grid's 65535", fname, (size_t)B * NH);
  return TD_OK;
}

/* Run the statements with the constant HS the runtime head size. */
#define FA_DISPATCH_HS(hs, ...)                       \
  switch (hs) {                                       \
  case 8: { constexpr int HS = 8; __VA_ARGS__; } break;   \
  case 16: { constexpr int HS = 16; __VA_ARGS__; } break; \
  case 24: { constexpr int HS = 24; __VA_ARGS__; } break; \
  case 32: { constexpr int HS = 32; __VA_ARGS__; } break; \
  case 48: { constexpr int HS = 48; __VA_ARGS__; } break; \
  default: { constexpr int HS = 64; __VA_ARGS__; } break; \
  }

extern "C" td_status td_cuda_flash_attention_forward(void *out, float *lse, const void *inp, int B, int T, int C,
                                                     int NH, td_dtype dtype, void *stream) {
  TD_CHECK(check_shape("td_cuda_flash_attention_forward", B, T, C, NH));
  if ((size_t)B * T == 0) return TD_OK;
  int hs = C / NH;
  float scale = 1.0f / sqrtf((float)hs);
  dim3 grid(td_cuda_blocks((size_t)T, FA_TILE), B * NH);
  TD_CUDA_DISPATCH(dtype, "td_cuda_flash_attention_forward", {
    FA_DISPATCH_HS(hs, {
      auto *kernel = &flash_forward_kernel<td_elem, HS>;
      TD_CUDA_LAUNCH(kernel, grid, FA_TILE, 0, stream, (td_elem *)out, lse, (const td_elem *)inp, T, C, NH, scale);
    });
  });
  TD_CUDA_LAUNCH_CHECK("flash_forward_kernel");
  return TD_OK;
}

extern "C" td_status td_cuda_flash_attention_backward(void *dinp, float *scratch, const void *dout, const void *inp,
                                                      const void *out, const float *lse, int B, int T, int C, int NH,
                                                      td_dtype dtype, void *stream) {
  TD_CHECK(check_shape("td_cuda_flash_attention_backward", B, T, C, NH));
  if ((size_t)B * T == 0) return TD_OK;
  int hs = C / NH;
  float scale = 1.0f / sqrtf((float)hs);
  size_t rows = (size_t)B * NH * T;
  dim3 grid(td_cuda_blocks((size_t)T, FA_TILE), B * NH);
  TD_CUDA_DISPATCH(dtype, "td_cuda_flash_attention_backward", {
    TD_CUDA_LAUNCH(flash_backward_dot_kernel<td_elem>, td_cuda_blocks(rows, 256), 256, 0, stream, scratch,
                   (const td_elem *)dout, (const td_elem *)out, B, T, C, NH);
    TD_CUDA_LAUNCH_CHECK("flash_backward_dot_kernel");
    FA_DISPATCH_HS(hs, {
      auto *kv = &flash_backward_kv_kernel<td_elem, HS>;
      TD_CUDA_LAUNCH(kv, grid, FA_TILE, 0, stream, (td_elem *)dinp, (const td_elem *)dout, (const td_elem *)inp, lse,
                     (const float *)scratch, T, C, NH, scale);
      TD_CUDA_LAUNCH_CHECK("flash_backward_kv_kernel");
      auto *qk = &flash_backward_q_kernel<td_elem, HS>;
      TD_CUDA_LAUNCH(qk, grid, FA_TILE, 0, stream, (td_elem *)dinp, (const td_elem *)dout, (const td_elem *)inp, lse,
                     (const float *)scratch, T, C, NH, scale);
      TD_CUDA_LAUNCH_CHECK("flash_backward_q_kernel");
    });
  });
  return TD_OK;
}
