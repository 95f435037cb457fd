/* Fused causal attention on the device, flash-style (FlashAttention-2's
 * loop order on CUDA cores), beside the unfused path of attention.cu:
 * neither the (B, NH, T, T) weights nor their gradient is ever stored, only
 * the log-sum-exp of each query row (B, NH, T) for backward. Arithmetic in
 * f32 for f32 and bf16 inputs, one rounding per output.
 *   forward (per query tile): for each key tile up to the diagonal, the 32
 *     scores of the row, their max, rescale (online softmax), accumulate
 *     p v; out = acc / l, lse = m + log l.
 *   backward: D_i = dO_i . O_i per query row; then dK, dV per key tile
 *     (loop over query tiles from the diagonal: p = exp(s - lse), dv += p dO,
 *     ds = p (dO.v - D), dk += ds q / sqrt(hs)) and dQ per query tile (loop
 *     over key tiles up to the diagonal: dq += ds k / sqrt(hs)), recomputing
 *     p and ds in both instead of adding dq with atomics: the same bits
 *     every run.
 * Two implementations of that plan:
 *  - bf16 with head size 16, 32, 48, 64 or 128 (and 16-byte aligned rows),
 *    the default: FlashAttention-2's kernels on mma.sync with the scores in
 *    registers (flash_attention_mma.cu); the backward in two passes, or in
 *    one with TD_CUDA_ATTENTION_ONEPASS (the A/B of scripts/gpu-check);
 *  - everything else (f32, bf16 with head size 8, 24 or unaligned rows):
 *    CUDA cores, tiles of
 *    32 rows, one thread per row, K/V (or Q/dO) tiles staged in shared memory
 *    as f32 and read by all threads at the same address (broadcast);
 *    accumulators in registers (HS, the head size, is a template parameter
 *    so that they stay there).
 * Limits: head sizes 8, 16, 24, 32, 48, 64, 128 (td_cuda_attention_fused
 * says so; others take the unfused path). At 128 the CUDA cores' tiles are
 * 16 rows (fa_tile) and their per-thread rows of 128 floats spill to local
 * memory: a reference path (f32), as it is at every head size.
 * (Until 2026-11-28 a third, bf16 on the warp matrix API (wmma), served
 * TANDEM_CUDA_ATTENTION=wmma and bf16 rows not 16-byte aligned: on an H200
 * it took 3,395 us forward against FlashAttention-2's 174 us. Nothing
 * needed it: FlashAttention-2's kernels take all its head sizes, and
 * unaligned rows, which no Tandem model makes, now take the CUDA cores.) */
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"
#include "cuda_layers.h"
#include "flash_attention_mma.cuh"

/* rows of a tile, and threads of a block: 32; 16 at head size 128, where
 * 32 would put the backward's K, V, Q and dO tiles past the 48 KB of static
 * shared memory */
static __host__ __device__ constexpr int fa_tile(int hs) { return hs > 64 ? 16 : 32; }

template <class T, int HS>
__global__ void flash_forward_kernel(T *out, float *lse, const T *inp, int T_, int C, int NH, float scale) {
  constexpr int TILE = fa_tile(HS);
  __shared__ float Ks[TILE][HS], Vs[TILE][HS];
  int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  int tid = threadIdx.x, t = blockIdx.x * TILE + tid;
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
    int j0 = kt * TILE;
    for (int e = tid; e < TILE * HS; e += TILE) { /* coalesced: consecutive threads, consecutive d */
      int r = e / HS, d = e % HS;
      bool in = j0 + r < T_;
      Ks[r][d] = in ? td_to_f32(base[(size_t)(j0 + r) * row3 + C + d]) : 0.0f;
      Vs[r][d] = in ? td_to_f32(base[(size_t)(j0 + r) * row3 + 2 * C + d]) : 0.0f;
    }
    __syncthreads();
    if (t < T_) {
      int n_keys = min(TILE, t - j0 + 1); /* causal: keys j0 .. t; t < T_ bounds them too */
      float s[TILE];
      float tile_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < TILE; j++) {
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
      for (int j = 0; j < TILE; j++) {
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

/* D[b, h, t] = dO . O over the head's channels. Rows are taken in memory
 * order (b, t, h: a head's hs channels are contiguous), `lpr` lanes to a
 * row (a power of two up to 8 dividing the row's 16-byte vectors), each
 * lane a strided share of the row's vectors, then a shuffle sum over the
 * lpr lanes (aligned groups within the warp); lpr = 0: rows that are not
 * 16-byte vectors, one thread each, element by element. The first version
 * took a thread per row in (b, h, t) order, 2-byte loads 1.5 KB apart
 * across a warp: 104 us a layer at GPT-2 124M's shape on an H200 (ncu,
 * 2026-11-28), for 50 MB of reads (~12 us at 4.3 TB/s). */
template <class T>
__global__ void flash_backward_dot_kernel(float *D, const T *dout, const T *out, int B, int T_, int C, int NH,
                                          int lpr) {
  const int VW = td_vec_width<T>::value, hs = C / NH;
  const size_t n_rows = (size_t)B * T_ * NH;
  const size_t g = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int per = lpr ? lpr : 1;
  size_t row = g / per; /* (b, t, h), h fastest */
  const int part = (int)(g % per);
  float s = 0.0f;
  if (row < n_rows) {
    const T *a = dout + row * hs, *o = out + row * hs;
    if (lpr) {
      float fa[16 / sizeof(T)], fo[16 / sizeof(T)];
      for (int v = part; v < hs / VW; v += lpr) {
        td_load_group(fa, a + v * VW, VW, true);
        td_load_group(fo, o + v * VW, VW, true);
#pragma unroll
        for (int k = 0; k < VW; k++) s += fa[k] * fo[k];
      }
    } else {
      for (int d = 0; d < hs; d++) s += td_to_f32(a[d]) * td_to_f32(o[d]);
    }
  }
  /* the lpr lanes of a row are consecutive and aligned: xor within them */
  for (int m = 1; m < per; m *= 2) s += __shfl_xor_sync(0xffffffffu, s, m);
  if (row < n_rows && part == 0) {
    int h = (int)(row % NH), t = (int)((row / NH) % T_), b = (int)(row / ((size_t)NH * T_));
    D[((size_t)b * NH + h) * T_ + t] = s;
  }
}

/* flash_backward_dot_kernel's lanes per row: 0 unless rows are whole,
 * aligned 16-byte vectors */
template <class T> static int dot_lanes(int hs, const void *dout, const void *out) {
  const int VW = td_vec_width<T>::value;
  if (hs % VW || (((uintptr_t)dout | (uintptr_t)out) & 15)) return 0;
  int vecs = hs / VW, lpr = 1;
  while (lpr < 8 && vecs % (2 * lpr) == 0) lpr *= 2;
  return lpr;
}

template <class T, int HS>
__global__ void flash_backward_kv_kernel(T *dinp, const T *dout, const T *inp, const float *lse, const float *D,
                                         int T_, int C, int NH, float scale) {
  constexpr int TILE = fa_tile(HS);
  __shared__ float Qs[TILE][HS], dOs[TILE][HS], Ls[TILE], Ds[TILE];
  /* this tile's own k and v rows: read by their thread only, padded so that
   * the 32 threads' rows fall in different banks (registers would hold
   * dk, dv, k and v: 4 HS floats, which spills at HS = 64) */
  __shared__ float Kown[TILE][HS + 1], Vown[TILE][HS + 1];
  int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  int tid = threadIdx.x, j = blockIdx.x * TILE + tid; /* this thread's key row */
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
  int n_tiles = (T_ + TILE - 1) / TILE;
  for (int qt = blockIdx.x; qt < n_tiles; qt++) {
    int i0 = qt * TILE;
    for (int e = tid; e < TILE * HS; e += TILE) {
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
      for (int i = 0; i < TILE; i++) {
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
  constexpr int TILE = fa_tile(HS);
  __shared__ float Ks[TILE][HS], Vs[TILE][HS];
  int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  int tid = threadIdx.x, i = blockIdx.x * TILE + tid; /* this thread's query row */
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
    int j0 = kt * TILE;
    for (int e = tid; e < TILE * HS; e += TILE) {
      int r = e / HS, d = e % HS;
      bool in = j0 + r < T_;
      Ks[r][d] = in ? td_to_f32(base[(size_t)(j0 + r) * row3 + C + d]) : 0.0f;
      Vs[r][d] = in ? td_to_f32(base[(size_t)(j0 + r) * row3 + 2 * C + d]) : 0.0f;
    }
    __syncthreads();
    if (i < T_) {
      int n_keys = min(TILE, i - j0 + 1);
#pragma unroll 1
      for (int j = 0; j < TILE; j++) {
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
  return hs == 8 || hs == 16 || hs == 24 || hs == 32 || hs == 48 || hs == 64 || hs == 128;
}

/* TANDEM_CUDA_ATTENTION, read when a model is created (never by the
 * kernels' launchers): 0 unset/empty, 1 unfused, 2 fused, 3 onepass (fused,
 * with FlashAttention-2's one-pass backward); -1 anything else */
static int attention_env(const char **value) {
  const char *e = getenv("TANDEM_CUDA_ATTENTION");
  *value = e;
  if (!e || !*e) return 0;
  if (strcmp(e, "unfused") == 0) return 1;
  if (strcmp(e, "fused") == 0) return 2;
  if (strcmp(e, "onepass") == 0) return 3;
  return -1;
}

static td_status attention_env_error(const char *e) {
  if (strcmp(e, "wmma") == 0)
    return td_error(TD_ERR_INVALID_ARGUMENT, "TANDEM_CUDA_ATTENTION=wmma: the wmma attention kernels were removed "
                    "(FlashAttention-2's, the default, took 174 us where they took 3,395 us on an H200); unset it, or "
                    "use fused, onepass or unfused");
  return td_error(TD_ERR_INVALID_ARGUMENT, "TANDEM_CUDA_ATTENTION=%s: use fused, onepass or unfused", e);
}

/* TANDEM_CUDA_ATTENTION_STORE, read when a model is created: how the
 * FlashAttention-2 forward stores its output (the A/B of scripts/gpu-check) */
extern "C" td_status td_cuda_attention_forward_flags(int *flags_out) {
  const char *e = getenv("TANDEM_CUDA_ATTENTION_STORE");
  if (!e || !*e || strcmp(e, "staged") == 0) {
    *flags_out = 0;
    return TD_OK;
  }
  if (strcmp(e, "direct") == 0) {
    *flags_out = TD_CUDA_ATTENTION_DIRECT_STORE;
    return TD_OK;
  }
  return td_error(TD_ERR_INVALID_ARGUMENT, "TANDEM_CUDA_ATTENTION_STORE=%s: use staged (the default: the output "
                  "through shared memory in 16-byte rows) or direct (from the registers, 4 bytes a lane)", e);
}

extern "C" td_status td_cuda_attention_backward_flags(int *flags_out) {
  const char *e;
  int mode = attention_env(&e);
  if (mode < 0) return attention_env_error(e);
  *flags_out = mode == 3 ? TD_CUDA_ATTENTION_ONEPASS : 0;
  return TD_OK;
}

extern "C" td_status td_cuda_attention_fused(int head_size, int *fused_out) {
  const char *e;
  int mode = attention_env(&e);
  if (mode < 0) return attention_env_error(e);
  int want_fused = mode != 1, forced = mode >= 2;
  if (want_fused && !head_size_supported(head_size)) {
    if (forced)
      return td_error(TD_ERR_INVALID_ARGUMENT,
                      "TANDEM_CUDA_ATTENTION=%s: the fused kernel takes head sizes 8, 16, 24, 32, 48, 64, 128, not %d "
                      "(unset it to use the unfused path)",
                      e, head_size);
    want_fused = 0;
  }
  *fused_out = want_fused;
  return TD_OK;
}

/* The FlashAttention-2 kernels serve this call (bf16, their head sizes,
 * aligned rows). */
static bool use_fa2(td_dtype dtype, int hs, int C, const void *p1, const void *p2, const void *p3) {
  return dtype == TD_BF16 && td_fa2_supported(hs, C, p1, p2, p3);
}

/* The backward's scratch: D ((B, NH, T), rounded up to 64 floats), then,
 * with TD_CUDA_ATTENTION_ONEPASS (FlashAttention-2's one-pass backward), its
 * dQ parts (td_fa2_dq_parts_floats: ~430 MB at GPT-2 124M's shape, so only
 * then). The same flags size the scratch and run the backward. */
static size_t fa_scratch_d_floats(int B, int T, int NH) { return ((size_t)B * NH * T + 63) & ~(size_t)63; }
extern "C" size_t td_cuda_flash_attention_backward_scratch_floats(int B, int T, int C, int NH, int flags) {
  if (B <= 0 || T <= 0 || NH <= 0) return 0;
  return fa_scratch_d_floats(B, T, NH) + ((flags & TD_CUDA_ATTENTION_ONEPASS) ? td_fa2_dq_parts_floats(B, T, C, NH) : 0);
}

static td_status check_shape(const char *fname, int B, int T, int C, int NH) {
  if (B < 0 || T < 0 || C <= 0 || NH <= 0 || C % NH)
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: shape B=%d T=%d C=%d NH=%d (C must be a multiple of NH)", fname, B,
                    T, C, NH);
  if (!head_size_supported(C / NH))
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: head size %d: the fused kernel takes 8, 16, 24, 32, 48, 64 or 128",
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
  case 128: { constexpr int HS = 128; __VA_ARGS__; } break; \
  default: { constexpr int HS = 64; __VA_ARGS__; } break; \
  }

extern "C" td_status td_cuda_flash_attention_forward(void *out, float *lse, const void *inp, int B, int T, int C,
                                                     int NH, td_dtype dtype, void *stream) {
  return td_cuda_flash_attention_forward_ex(out, lse, inp, B, T, C, NH, dtype, 0, stream);
}

extern "C" td_status td_cuda_flash_attention_forward_ex(void *out, float *lse, const void *inp, int B, int T, int C,
                                                        int NH, td_dtype dtype, int flags, void *stream) {
  TD_CHECK(check_shape("td_cuda_flash_attention_forward", B, T, C, NH));
  if (flags & ~TD_CUDA_ATTENTION_DIRECT_STORE)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_cuda_flash_attention_forward_ex: unknown flags %#x "
                    "(TD_CUDA_ATTENTION_DIRECT_STORE is the one)", flags);
  if ((size_t)B * T == 0) return TD_OK;
  int hs = C / NH;
  float scale = 1.0f / sqrtf((float)hs);
  if (use_fa2(dtype, hs, C, out, inp, NULL))
    return td_fa2_forward(out, lse, inp, B, T, C, NH, (flags & TD_CUDA_ATTENTION_DIRECT_STORE) != 0, stream);
  TD_CUDA_DISPATCH(dtype, "td_cuda_flash_attention_forward", {
    FA_DISPATCH_HS(hs, {
      dim3 grid(td_cuda_blocks((size_t)T, fa_tile(HS)), B * NH);
      auto *kernel = &flash_forward_kernel<td_elem, HS>;
      TD_CUDA_LAUNCH(kernel, grid, fa_tile(HS), 0, stream, (td_elem *)out, lse, (const td_elem *)inp, T, C, NH, scale);
    });
  });
  TD_CUDA_LAUNCH_CHECK("flash_forward_kernel");
  return TD_OK;
}

extern "C" td_status td_cuda_flash_attention_backward(void *dinp, float *scratch, const void *dout, const void *inp,
                                                      const void *out, const float *lse, int B, int T, int C, int NH,
                                                      td_dtype dtype, void *stream) {
  return td_cuda_flash_attention_backward_ex(dinp, scratch, dout, inp, out, lse, B, T, C, NH, dtype, 0, stream);
}

extern "C" td_status td_cuda_flash_attention_backward_ex(void *dinp, float *scratch, const void *dout, const void *inp,
                                                         const void *out, const float *lse, int B, int T, int C, int NH,
                                                         td_dtype dtype, int flags, void *stream) {
  TD_CHECK(check_shape("td_cuda_flash_attention_backward", B, T, C, NH));
  if (flags & ~(TD_CUDA_DINP_OVERWRITE | TD_CUDA_ATTENTION_ONEPASS))
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_cuda_flash_attention_backward_ex: unknown flags %#x "
                    "(TD_CUDA_DINP_OVERWRITE and TD_CUDA_ATTENTION_ONEPASS are the ones)", flags);
  if ((size_t)B * T == 0) return TD_OK;
  const bool overwrite = (flags & TD_CUDA_DINP_OVERWRITE) != 0;
  int hs = C / NH;
  float scale = 1.0f / sqrtf((float)hs);
  size_t rows = (size_t)B * NH * T;
  TD_CUDA_DISPATCH(dtype, "td_cuda_flash_attention_backward", {
    const int lpr = dot_lanes<td_elem>(hs, dout, out);
    TD_CUDA_LAUNCH(flash_backward_dot_kernel<td_elem>, td_cuda_blocks(rows * (lpr ? lpr : 1), 256), 256, 0, stream,
                   scratch, (const td_elem *)dout, (const td_elem *)out, B, T, C, NH, lpr);
    TD_CUDA_LAUNCH_CHECK("flash_backward_dot_kernel");
    if (use_fa2(dtype, hs, C, dinp, dout, inp))
      return td_fa2_backward(dinp, scratch, scratch + fa_scratch_d_floats(B, T, NH), dout, inp, lse, B, T, C, NH,
                             (flags & TD_CUDA_ATTENTION_ONEPASS) != 0, !overwrite, stream);
    /* the other kernels add: overwriting is zeroing first */
    if (overwrite)
      TD_CUDA_CHECK(cudaMemsetAsync(dinp, 0, (size_t)B * T * 3 * C * sizeof(td_elem), (cudaStream_t)stream));
    FA_DISPATCH_HS(hs, {
      dim3 grid(td_cuda_blocks((size_t)T, fa_tile(HS)), B * NH);
      auto *kv = &flash_backward_kv_kernel<td_elem, HS>;
      TD_CUDA_LAUNCH(kv, grid, fa_tile(HS), 0, stream, (td_elem *)dinp, (const td_elem *)dout, (const td_elem *)inp, lse,
                     (const float *)scratch, T, C, NH, scale);
      TD_CUDA_LAUNCH_CHECK("flash_backward_kv_kernel");
      auto *qk = &flash_backward_q_kernel<td_elem, HS>;
      TD_CUDA_LAUNCH(qk, grid, fa_tile(HS), 0, stream, (td_elem *)dinp, (const td_elem *)dout, (const td_elem *)inp, lse,
                     (const float *)scratch, T, C, NH, scale);
      TD_CUDA_LAUNCH_CHECK("flash_backward_q_kernel");
    });
  });
  return TD_OK;
}
