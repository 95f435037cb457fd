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
 * Three implementations of that plan:
 *  - bf16 with head size 16, 32, 48 or 64 (and 16-byte aligned rows), the
 *    default: FlashAttention-2's kernels on mma.sync with the scores in
 *    registers (flash_attention_mma.cu);
 *  - bf16 with a head size that is a multiple of 16 where that does not
 *    apply, or everywhere with TANDEM_CUDA_ATTENTION=wmma (the A/B switch
 *    of scripts/gpu-check and bench/cuda_kernels.sh): tensor cores through
 *    the warp matrix API (wmma, 16x16x16 bf16 products accumulating in f32).
 *    Tiles of 64 rows, 4 warps of 16 rows each. The products go through
 *    fragments; what needs a row (masking, the online softmax, its rescale
 *    of the output) goes through each warp's f32 tile in shared memory,
 *    because a fragment's element-to-lane mapping is unspecified. P and dS
 *    are rounded to bf16 before their products, as FlashAttention does.
 *  - everything else (f32, bf16 with head size 8, 24): CUDA cores, tiles of
 *    32 rows, one thread per row, K/V (or Q/dO) tiles staged in shared memory
 *    as f32 and read by all threads at the same address (broadcast);
 *    accumulators in registers (HS, the head size, is a template parameter
 *    so that they stay there).
 * Limits: head sizes 8, 16, 24, 32, 48, 64 (td_cuda_attention_fused says so;
 * others take the unfused path). */
#include <stdlib.h>
#include <string.h>

#include <mma.h>

#include "cuda_common.cuh"
#include "cuda_layers.h"
#include "flash_attention_mma.cuh"

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


/* ---- tensor cores (bf16, HS a multiple of 16) ---- */
using namespace nvcuda;
#define WM_ROWS 64    /* rows of a block's tile: 4 warps x 16 */
#define WM_THREADS 128
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> frag_a;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> frag_b_row;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> frag_b_col;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_acc;

/* Shared-memory layout of the tensor-core kernels, in bytes from the dynamic
 * buffer. Row strides are padded (8 bf16, 4 f32) against bank conflicts and
 * keep every 16x16 tile 32-byte aligned, as wmma requires. */
template <int HS> struct wm_layout {
  static const int LDT = HS + 8; /* bf16 tiles (64, HS) */
  static const int LDS = WM_ROWS + 4; /* f32 (16, 64) per warp */
  static const int LDP = WM_ROWS + 8; /* bf16 (16, 64) per warp */
  static const size_t tile_bytes = (size_t)WM_ROWS * LDT * 2;
  static const size_t s_bytes = (size_t)16 * LDS * 4;
  static const size_t p_bytes = (size_t)16 * LDP * 2;
  /* four bf16 tiles, then per warp: two f32 (16, 64) tiles, two bf16 ones,
   * and 4 x 16 row statistics */
  static const size_t warp_bytes = 2 * s_bytes + 2 * p_bytes + 4 * 16 * 4;
  static const size_t bytes = 4 * tile_bytes + 4 * warp_bytes + 2 * WM_ROWS * 4;
};

/* rows [r0, r0 + 64) of one of q, k, v (which: 0, 1, 2) or of dout (which: -1)
 * of head (b, h) into a bf16 tile; rows at or past T are zeros */
__device__ void wm_load_tile(__nv_bfloat16 *tile, int ld, const __nv_bfloat16 *inp, const __nv_bfloat16 *dout, int b,
                             int h, int r0, int which, int T_, int C, int HS) {
  for (int e = threadIdx.x; e < WM_ROWS * HS; e += blockDim.x) {
    int r = e / HS, d = e % HS, t = r0 + r;
    __nv_bfloat16 v = __float2bfloat16(0.0f);
    if (t < T_)
      v = which < 0 ? dout[((size_t)b * T_ + t) * C + (size_t)h * HS + d]
                    : inp[((size_t)b * T_ + t) * 3 * C + (size_t)which * C + (size_t)h * HS + d];
    tile[r * ld + d] = v;
  }
}

/* out (16 x 64, f32, ld LDS) = A rows (16 x HS, bf16 row-major, ld LDT) times
 * B^T where B is (64 x HS) row-major: the score-shaped products */
template <int HS>
__device__ void wm_rows_times_tile_t(float *out, const __nv_bfloat16 *A, const __nv_bfloat16 *B) {
  typedef wm_layout<HS> L;
  frag_a a;
  frag_b_col bt;
  frag_acc acc;
  for (int n = 0; n < WM_ROWS / 16; n++) {
    wmma::fill_fragment(acc, 0.0f);
    for (int k = 0; k < HS / 16; k++) {
      wmma::load_matrix_sync(a, A + k * 16, L::LDT);
      wmma::load_matrix_sync(bt, B + (size_t)n * 16 * L::LDT + k * 16, L::LDT);
      wmma::mma_sync(acc, a, bt, acc);
    }
    wmma::store_matrix_sync(out + n * 16, acc, L::LDS, wmma::mem_row_major);
  }
}

/* acc[n] (+)= P (16 x 64, bf16, ld LDP) times B (64 x HS, bf16 row-major, ld LDT) */
template <int HS> __device__ void wm_p_times_tile(frag_acc *acc, const __nv_bfloat16 *P, const __nv_bfloat16 *B) {
  typedef wm_layout<HS> L;
  frag_a a;
  frag_b_row b;
#pragma unroll
  for (int n = 0; n < HS / 16; n++)
    for (int k = 0; k < WM_ROWS / 16; k++) {
      wmma::load_matrix_sync(a, P + k * 16, L::LDP);
      wmma::load_matrix_sync(b, B + (size_t)k * 16 * L::LDT + n * 16, L::LDT);
      wmma::mma_sync(acc[n], a, b, acc[n]);
    }
}

template <int HS>
__global__ void __launch_bounds__(WM_THREADS) flash_forward_wmma_kernel(__nv_bfloat16 *out, float *lse,
                                                                        const __nv_bfloat16 *inp, int T_, int C, int NH,
                                                                        float scale) {
  typedef wm_layout<HS> L;
  TD_DYNAMIC_SMEM(char, smem);
  __nv_bfloat16 *Qs = (__nv_bfloat16 *)smem, *Ks = Qs + WM_ROWS * L::LDT, *Vs = Ks + WM_ROWS * L::LDT;
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  char *wbase = smem + 4 * L::tile_bytes + warp * L::warp_bytes;
  float *S = (float *)wbase, *O = (float *)(wbase + L::s_bytes); /* O: (16, HS) in an (16, LDS) tile */
  __nv_bfloat16 *P = (__nv_bfloat16 *)(wbase + 2 * L::s_bytes);
  float *m_row = (float *)(wbase + 2 * L::s_bytes + 2 * L::p_bytes), *l_row = m_row + 16, *corr_row = l_row + 16;
  int bh = blockIdx.y, b = bh / NH, h = bh % NH, q0 = blockIdx.x * WM_ROWS;
  wm_load_tile(Qs, L::LDT, inp, NULL, b, h, q0, 0, T_, C, HS);
  for (int e = lane; e < 16 * HS; e += 32) O[(e / HS) * L::LDS + e % HS] = 0.0f;
  if (lane < 16) {
    m_row[lane] = -INFINITY;
    l_row[lane] = 0.0f;
  }
  int r = lane >> 1, half = lane & 1, qi = q0 + warp * 16 + r;
  for (int kt = 0; kt <= (int)blockIdx.x; kt++) {
    int j0 = kt * WM_ROWS;
    __syncthreads(); /* the previous tiles are no longer read */
    wm_load_tile(Ks, L::LDT, inp, NULL, b, h, j0, 1, T_, C, HS);
    wm_load_tile(Vs, L::LDT, inp, NULL, b, h, j0, 2, T_, C, HS);
    __syncthreads();
    wm_rows_times_tile_t<HS>(S, Qs + warp * 16 * L::LDT, Ks);
    __syncwarp();
    /* two lanes per row, 32 columns each: mask, max, exp, sum */
    float mx = -INFINITY;
    for (int c = half * 32; c < half * 32 + 32; c++) {
      int j = j0 + c;
      float sc = (j <= qi && j < T_) ? S[r * L::LDS + c] * scale : -INFINITY;
      S[r * L::LDS + c] = sc;
      mx = fmaxf(mx, sc);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    float m_old = m_row[r], m_new = fmaxf(m_old, mx);
    /* a row past T can be fully masked in a tile: keep it finite */
    float m_use = m_new == -INFINITY ? 0.0f : m_new;
    float corr = expf(m_old - m_use), sum = 0.0f;
    for (int c = half * 32; c < half * 32 + 32; c++) {
      float p = expf(S[r * L::LDS + c] - m_use);
      P[r * L::LDP + c] = __float2bfloat16(p);
      sum += p;
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    __syncwarp(); /* both lanes of a row have read m_row */
    if (!half) {
      m_row[r] = m_new;
      l_row[r] = l_row[r] * corr + sum;
      corr_row[r] = corr;
    }
    __syncwarp();
    frag_acc acc[HS / 16];
#pragma unroll
    for (int n = 0; n < HS / 16; n++) wmma::fill_fragment(acc[n], 0.0f);
    wm_p_times_tile<HS>(acc, P, Vs);
#pragma unroll
    for (int n = 0; n < HS / 16; n++) wmma::store_matrix_sync(S + n * 16, acc[n], L::LDS, wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < 16 * HS; e += 32) {
      int rr = e / HS, d = e % HS;
      O[rr * L::LDS + d] = O[rr * L::LDS + d] * corr_row[rr] + S[rr * L::LDS + d];
    }
    __syncwarp();
  }
  for (int e = lane; e < 16 * HS; e += 32) {
    int rr = e / HS, d = e % HS, t = q0 + warp * 16 + rr;
    if (t < T_) out[((size_t)b * T_ + t) * C + (size_t)h * HS + d] = __float2bfloat16(O[rr * L::LDS + d] / l_row[rr]);
  }
  if (lane < 16 && q0 + warp * 16 + lane < T_)
    lse[(size_t)bh * T_ + q0 + warp * 16 + lane] = m_row[lane] + logf(l_row[lane]);
}

/* dK, dV for a tile of 64 keys (16 per warp), over the query tiles from the
 * diagonal on; dQ for a tile of 64 queries over the key tiles up to the
 * diagonal. `which_rows` = 1: this block's rows are keys (dK/dV); 0: queries. */
/* dinp[b, t0 + r, which part] += mul * acc (16 x HS), through the warp's f32
 * tile `stage`; dinp points at the head's first channel */
template <int HS>
__device__ void wm_add_rows(__nv_bfloat16 *dinp, float *stage, const frag_acc *acc, int b, int t0, int which, float mul,
                            int T_, int C) {
  typedef wm_layout<HS> L;
  int lane = threadIdx.x % 32;
  __syncwarp();
#pragma unroll
  for (int n = 0; n < HS / 16; n++) wmma::store_matrix_sync(stage + n * 16, acc[n], L::LDS, wmma::mem_row_major);
  __syncwarp();
  for (int e = lane; e < 16 * HS; e += 32) {
    int rr = e / HS, d = e % HS, t = t0 + rr;
    if (t >= T_) continue;
    __nv_bfloat16 *g = dinp + ((size_t)b * T_ + t) * 3 * C + (size_t)which * C + d;
    *g = __float2bfloat16(__bfloat162float(*g) + stage[rr * L::LDS + d] * mul);
  }
}

template <int HS>
__global__ void __launch_bounds__(WM_THREADS) flash_backward_wmma_kernel(__nv_bfloat16 *dinp, const __nv_bfloat16 *dout,
                                                                         const __nv_bfloat16 *inp, const float *lse,
                                                                         const float *D, int T_, int C, int NH,
                                                                         float scale, int keys) {
  typedef wm_layout<HS> L;
  TD_DYNAMIC_SMEM(char, smem);
  /* own rows: (K, V) for keys, (Q, dO) for queries; other rows: (Q, dO) or (K, V) */
  __nv_bfloat16 *own1 = (__nv_bfloat16 *)smem, *own2 = own1 + WM_ROWS * L::LDT;
  __nv_bfloat16 *oth1 = own2 + WM_ROWS * L::LDT, *oth2 = oth1 + WM_ROWS * L::LDT;
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  char *wbase = smem + 4 * L::tile_bytes + warp * L::warp_bytes;
  float *S = (float *)wbase, *dP = (float *)(wbase + L::s_bytes);
  __nv_bfloat16 *P = (__nv_bfloat16 *)(wbase + 2 * L::s_bytes), *dS = P + 16 * L::LDP;
  float *Lt = (float *)(smem + 4 * L::tile_bytes + 4 * L::warp_bytes), *Dt = Lt + WM_ROWS;
  int bh = blockIdx.y, b = bh / NH, h = bh % NH, r0 = blockIdx.x * WM_ROWS;
  int n_tiles = (T_ + WM_ROWS - 1) / WM_ROWS;
  wm_load_tile(own1, L::LDT, inp, dout, b, h, r0, keys ? 1 : 0, T_, C, HS);
  wm_load_tile(own2, L::LDT, inp, dout, b, h, r0, keys ? 2 : -1, T_, C, HS);
  if (!keys)
    for (int e = threadIdx.x; e < WM_ROWS; e += blockDim.x) {
      Lt[e] = r0 + e < T_ ? lse[(size_t)bh * T_ + r0 + e] : 0.0f;
      Dt[e] = r0 + e < T_ ? D[(size_t)bh * T_ + r0 + e] : 0.0f;
    }
  frag_acc acc1[HS / 16], acc2[HS / 16]; /* keys: dK, dV; queries: dQ (acc2 unused) */
#pragma unroll
  for (int n = 0; n < HS / 16; n++) {
    wmma::fill_fragment(acc1[n], 0.0f);
    wmma::fill_fragment(acc2[n], 0.0f);
  }
  int r = lane >> 1, half = lane & 1, my_row = r0 + warp * 16 + r;
  int first = keys ? (int)blockIdx.x : 0, last = keys ? n_tiles - 1 : (int)blockIdx.x;
  for (int ot = first; ot <= last; ot++) {
    int o0 = ot * WM_ROWS;
    __syncthreads();
    wm_load_tile(oth1, L::LDT, inp, dout, b, h, o0, keys ? 0 : 1, T_, C, HS);
    wm_load_tile(oth2, L::LDT, inp, dout, b, h, o0, keys ? -1 : 2, T_, C, HS);
    if (keys)
      for (int e = threadIdx.x; e < WM_ROWS; e += blockDim.x) {
        Lt[e] = o0 + e < T_ ? lse[(size_t)bh * T_ + o0 + e] : 0.0f;
        Dt[e] = o0 + e < T_ ? D[(size_t)bh * T_ + o0 + e] : 0.0f;
      }
    __syncthreads();
    /* keys: S^T = K Q^T, dP^T = V dO^T; queries: S = Q K^T, dP = dO V^T */
    wm_rows_times_tile_t<HS>(S, own1 + warp * 16 * L::LDT, oth1);
    wm_rows_times_tile_t<HS>(dP, own2 + warp * 16 * L::LDT, oth2);
    __syncwarp();
    for (int c = half * 32; c < half * 32 + 32; c++) {
      int other = o0 + c;
      int q = keys ? other : my_row, k = keys ? my_row : other;
      float l = keys ? Lt[c] : Lt[warp * 16 + r], d = keys ? Dt[c] : Dt[warp * 16 + r];
      float p = (k <= q && q < T_ && k < T_) ? expf(S[r * L::LDS + c] * scale - l) : 0.0f;
      P[r * L::LDP + c] = __float2bfloat16(p);
      dS[r * L::LDP + c] = __float2bfloat16(p * (dP[r * L::LDS + c] - d));
    }
    __syncwarp();
    if (keys) {
      wm_p_times_tile<HS>(acc2, P, oth2);  /* dV += P^T dO */
      wm_p_times_tile<HS>(acc1, dS, oth1); /* dK += dS^T Q */
    } else {
      wm_p_times_tile<HS>(acc1, dS, oth1); /* dQ += dS K */
    }
  }
  /* add into dinp through this warp's f32 tile: dK and dQ carry the score
   * scale, dV not */
  if (keys) {
    wm_add_rows<HS>(dinp + (size_t)h * HS, S, acc1, b, r0 + warp * 16, 1, scale, T_, C);
    wm_add_rows<HS>(dinp + (size_t)h * HS, S, acc2, b, r0 + warp * 16, 2, 1.0f, T_, C);
  } else {
    wm_add_rows<HS>(dinp + (size_t)h * HS, S, acc1, b, r0 + warp * 16, 0, scale, T_, C);
  }
}

/* Raise a kernel's dynamic shared-memory limit to what it uses, once per
 * kernel (*done: the caller's flag for that kernel). */
static td_status wm_set_smem(const void *kernel, size_t bytes, bool *done) {
  if (!*done) {
    TD_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    *done = true;
  }
  return TD_OK;
}

template <int HS>
static td_status wm_forward(void *out, float *lse, const void *inp, int B, int T, int C, int NH, float scale,
                            void *stream) {
  auto *kernel = &flash_forward_wmma_kernel<HS>;
  static bool smem_set = false;
  TD_CHECK(wm_set_smem((const void *)kernel, wm_layout<HS>::bytes, &smem_set));
  dim3 grid(td_cuda_blocks((size_t)T, WM_ROWS), B * NH);
  TD_CUDA_LAUNCH(kernel, grid, WM_THREADS, wm_layout<HS>::bytes, stream, (__nv_bfloat16 *)out, lse,
                 (const __nv_bfloat16 *)inp, T, C, NH, scale);
  TD_CUDA_LAUNCH_CHECK("flash_forward_wmma_kernel");
  return TD_OK;
}

template <int HS>
static td_status wm_backward(void *dinp, const float *D, const void *dout, const void *inp, const float *lse, int B,
                             int T, int C, int NH, float scale, void *stream) {
  auto *kernel = &flash_backward_wmma_kernel<HS>;
  static bool smem_set = false;
  TD_CHECK(wm_set_smem((const void *)kernel, wm_layout<HS>::bytes, &smem_set));
  dim3 grid(td_cuda_blocks((size_t)T, WM_ROWS), B * NH);
  for (int keys = 1; keys >= 0; keys--) {
    TD_CUDA_LAUNCH(kernel, grid, WM_THREADS, wm_layout<HS>::bytes, stream, (__nv_bfloat16 *)dinp,
                   (const __nv_bfloat16 *)dout, (const __nv_bfloat16 *)inp, lse, D, T, C, NH, scale, keys);
    TD_CUDA_LAUNCH_CHECK("flash_backward_wmma_kernel");
  }
  return TD_OK;
}

/* the tensor-core path serves this call */
static bool use_wmma(td_dtype dtype, int hs) { return dtype == TD_BF16 && hs % 16 == 0 && hs <= 64; }

static bool head_size_supported(int hs) {
  return hs == 8 || hs == 16 || hs == 24 || hs == 32 || hs == 48 || hs == 64;
}

/* TANDEM_CUDA_ATTENTION: 0 unset/empty, 1 unfused, 2 fused, 3 wmma (fused,
 * with the wmma kernels where the mma ones would run); -1 anything else */
static int attention_env(const char **value) {
  const char *e = getenv("TANDEM_CUDA_ATTENTION");
  *value = e;
  if (!e || !*e) return 0;
  if (strcmp(e, "unfused") == 0) return 1;
  if (strcmp(e, "fused") == 0) return 2;
  if (strcmp(e, "wmma") == 0) return 3;
  if (strcmp(e, "twopass") == 0) return 4;
  return -1;
}

extern "C" td_status td_cuda_attention_fused(int head_size, int *fused_out) {
  const char *e;
  int mode = attention_env(&e);
  if (mode < 0)
    return td_error(TD_ERR_INVALID_ARGUMENT, "TANDEM_CUDA_ATTENTION=%s: use fused, wmma, twopass or unfused", e);
  int want_fused = mode != 1, forced = mode >= 2;
  if (want_fused && !head_size_supported(head_size)) {
    if (forced)
      return td_error(TD_ERR_INVALID_ARGUMENT,
                      "TANDEM_CUDA_ATTENTION=%s: the fused kernel takes head sizes 8, 16, 24, 32, 48, 64, not %d "
                      "(unset it to use the unfused path)",
                      e, head_size);
    want_fused = 0;
  }
  *fused_out = want_fused;
  return TD_OK;
}

/* The FlashAttention-2 kernels serve this call (bf16, their head sizes,
 * aligned rows) unless TANDEM_CUDA_ATTENTION=wmma asks for the wmma ones. */
static bool use_fa2(td_dtype dtype, int hs, int C, const void *p1, const void *p2, const void *p3) {
  const char *e;
  return dtype == TD_BF16 && attention_env(&e) != 3 && td_fa2_supported(hs, C, p1, p2, p3);
}

/* The backward's scratch: D ((B, NH, T), rounded up to 64 floats), then
 * the FlashAttention-2 backward's ordered dQ sums ((B, NH, T, hs) f32) and
 * its turns ((B, NH, ceil(T / 64)) ints). */
static size_t fa_scratch_d_floats(int B, int T, int NH) { return ((size_t)B * NH * T + 63) & ~(size_t)63; }
extern "C" size_t td_cuda_flash_attention_backward_scratch_floats(int B, int T, int C, int NH) {
  if (B <= 0 || T <= 0 || NH <= 0) return 0;
  return fa_scratch_d_floats(B, T, NH) + (size_t)B * T * C + (size_t)B * NH * ((T + 63) / 64);
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
  if (use_fa2(dtype, hs, C, out, inp, NULL)) return td_fa2_forward(out, lse, inp, B, T, C, NH, stream);
  if (use_wmma(dtype, hs)) {
    if (hs == 16) return wm_forward<16>(out, lse, inp, B, T, C, NH, scale, stream);
    if (hs == 32) return wm_forward<32>(out, lse, inp, B, T, C, NH, scale, stream);
    if (hs == 48) return wm_forward<48>(out, lse, inp, B, T, C, NH, scale, stream);
    return wm_forward<64>(out, lse, inp, B, T, C, NH, scale, stream);
  }
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
    if (use_fa2(dtype, hs, C, dinp, dout, inp)) {
      const char *e;
      float *dq_acc = scratch + fa_scratch_d_floats(B, T, NH);
      int *turns = (int *)(dq_acc + (size_t)B * T * C);
      return td_fa2_backward(dinp, scratch, dq_acc, turns, dout, inp, lse, B, T, C, NH, attention_env(&e) == 4,
                             stream);
    }
    if (use_wmma(dtype, hs)) {
      if (hs == 16) return wm_backward<16>(dinp, scratch, dout, inp, lse, B, T, C, NH, scale, stream);
      if (hs == 32) return wm_backward<32>(dinp, scratch, dout, inp, lse, B, T, C, NH, scale, stream);
      if (hs == 48) return wm_backward<48>(dinp, scratch, dout, inp, lse, B, T, C, NH, scale, stream);
      return wm_backward<64>(dinp, scratch, dout, inp, lse, B, T, C, NH, scale, stream);
    }
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
