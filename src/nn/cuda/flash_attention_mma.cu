/* Fused causal attention on the tensor cores, FlashAttention-2's design
 * (Dao, 2023) for bf16 inputs with head sizes 16, 32, 48, 64 and 128: the
 * default fused path for those (flash_attention.cu chooses it). Same contract as flash_attention.cu's kernels: qkv (B, T, 3C),
 * out (B, T, C), lse (B, NH, T) in natural-log units, dqkv += the gradient.
 *
 * Products are mma.sync m16n8k16 (bf16 in, f32 accumulation) through
 * mma_sm80.cuh, whose fragment layouts are documented, so that the scores S
 * never leave registers: row max and row sum by shuffles within the 4 lanes
 * of a quad (a quad holds one row's 8-column pieces), and P, rounded to
 * bf16, is the A operand of P V as it lies in the registers (two adjacent
 * 16 x 8 accumulator tiles are one 16 x 16 A fragment). Operand tiles are
 * staged in shared memory with 16-byte vector loads into rows padded by 8
 * bf16 (16 bytes), so that ldmatrix's 8 row addresses fall in 8 different
 * bank quads; B operands come from ldmatrix .x4 (K, Q, dO as stored: B = K^T
 * is "col" layout) and ldmatrix .x4.trans (V, dO, Q, K as the B of P V,
 * P^T dO, dS^T Q, dS K).
 *
 * forward: a block takes 128 query rows (4 warps x 32 rows: two m16 tiles
 *   a warp, so each K/V fragment loaded from shared memory feeds two
 *   products; at head size 128, 64 rows, one m16 tile a warp, with Q
 *   staged in V's buffer: fa2_fwd_shape), Q's fragments stay in registers, key tiles of 64 up to the
 *   diagonal, copied by cp.async with FA2's overlap in one K and one V
 *   buffer (V of this tile lands during Q K^T and the softmax, K of the
 *   next during P V); online softmax in base 2 (scores pre-scaled by
 *   log2(e)/sqrt(hs): exp2 is one instruction); the running row sum stays
 *   per lane and is summed over the quad once at the end (the rescaling
 *   factor is the same for the whole row). Blocks are issued heaviest first
 *   (the last query tiles have the most keys) against a causal tail. The
 *   output leaves through shared memory (each warp's rows of the Q tile)
 *   in 16-byte row vectors; TD_CUDA_ATTENTION_DIRECT_STORE keeps the 4-byte
 *   stores from the registers for the A/B.
 * backward, FA2's loop order: D = rowsum(dO * O) (flash_attention.cu's
 *   kernel), then one pass per key tile of 64 (4 warps x 16 keys) over the
 *   query tiles from the diagonal on, in the transposed form: S^T = K Q^T,
 *   dP^T = V dO^T, P^T = exp(S^T - lse), dS^T = P^T (dP^T - D), dV += P^T
 *   dO, dK += dS^T Q, with P^T and dS^T the A operands straight from
 *   registers; and one pass per query tile of 64 over the key tiles up to
 *   the diagonal for dQ += dS K (S and dP recomputed). dQ is not
 *   accumulated with atomics across key tiles, as FA2 does: a fixed order
 *   of additions gives the same bits on every run, which Tandem's
 *   deterministic training promises (the price is the recomputation of S
 *   and dP in the second pass: 2 of the backward's 5 products, ~40% more
 *   tensor-core work). Both passes double-buffer the other tiles: the next
 *   one's cp.async copies land during this one's products.
 *   TANDEM_CUDA_ATTENTION=onepass runs fa2_backward_kernel below instead
 *   (one pass, dQ's parts stored and summed in order after it), for A/B,
 *   at head sizes up to 64. At 128 the keys' pass reads K's and V's
 *   fragments from shared memory as each product needs them
 *   (fa2_twopass_layout), and the one-pass kernel is not offered.
 * nvcc -Xptxas -v for sm_90 (-O3), registers per thread / static shared
 * memory per block, 0 bytes of stack and spills in every kernel, measured
 * 2026-11-28 with CUDA 13.0 (/usr/local/cuda) and CI's 11.8
 * (/opt/tandem-cuda-11.8, clang-14 as host compiler):
 *            forward      backward dK,dV   backward dQ     smem (fwd, kv, q)
 *   HS=64    243 / 238    236 / 227        167 / 168       36864, 28160, 27648
 *   HS=48    218 / 216    186 / 197        162 / 168       28672, 22016, 21504
 *   HS=32    176 / 166    137 / 159        135 / 128       20480, 15872, 15360
 *   HS=16    168 / 163    128 / 154        126 / 128       12288,  9728,  9216
 *   At HS=64 the forward's 243 registers allow 2 blocks (8 warps) per SM,
 *   as FA2's own forward. Those backward figures are before the double
 *   buffering; with it (13.0, 2026-11-28): dK/dV 239 registers, 47,104
 *   bytes (2 blocks per SM), dQ 168 registers, 46,080 bytes (3 blocks) at
 *   HS=64, no spills.
 *   The one-pass backward: 240 / 218 registers at HS 64 / 48, no spills,
 *   56,320 bytes of dynamic shared memory at HS=64: 2 blocks per SM.
 *   Head size 128 and the staged output stores (13.0, 2026-11-28, s26):
 *   forward 174 registers, 34,816 bytes (both stores); HS=64 forward 241
 *   staged, 243 direct; backward dK/dV 255 registers, 105,472 bytes of
 *   dynamic shared memory (2 blocks per SM on an H100/H200's 227 KB); dQ
 *   255, 88,064 bytes; no spills in any kernel. Unmeasured on a GPU.
 * Not done: the causal diagonal tile is masked per element rather than
 * split; the backward's stores still go 4 bytes a lane. */
#include "cuda_common.cuh"
#include "flash_attention_mma.cuh"
#include "mma_sm80.cuh"

#define FA2_THREADS 128
#define FA2_TILE 64      /* key rows of a forward tile; rows of a backward block and tile */

/* scores scaled into base 2: exp(x) = exp2(x log2(e)) */
#define FA2_LOG2E 1.4426950408889634f
#define FA2_LN2 0.6931471805599453f

typedef __nv_bfloat16 bf16;

/* rows [r0, r0 + ROWS) of a (T, ld) bf16 matrix whose first column is at
 * src into a shared tile of row stride HS + 8, 16 bytes a load; rows at or
 * past T are zeros */
template <int HS, int ROWS>
__device__ __forceinline__ void fa2_load_tile(bf16 *tile, const bf16 *src, size_t ld, int r0, int T_) {
  constexpr int VPR = HS / 8; /* 16-byte vectors per row */
  for (int e = threadIdx.x; e < ROWS * VPR; e += FA2_THREADS) {
    int r = e / VPR, c = (e % VPR) * 8;
    int4 v = make_int4(0, 0, 0, 0);
    if (r0 + r < T_) v = *(const int4 *)(src + (size_t)(r0 + r) * ld + c);
    *(int4 *)(tile + r * (HS + 8) + c) = v;
  }
}

/* fa2_load_tile through cp.async, the copies only: they land while the
 * threads compute, as part of the thread's next td_cp_async_commit group */
template <int HS, int ROWS>
__device__ __forceinline__ void fa2_copy_tile_async(bf16 *tile, const bf16 *src, size_t ld, int r0, int T_) {
  constexpr int VPR = HS / 8;
  for (int e = threadIdx.x; e < ROWS * VPR; e += FA2_THREADS) {
    int r = e / VPR, c = (e % VPR) * 8;
    bool valid = r0 + r < T_;
    td_cp_async16(tile + r * (HS + 8) + c, src + (size_t)(valid ? r0 + r : 0) * ld + c, valid);
  }
}

/* fa2_copy_tile_async as one group: td_cp_async_wait<0> and a
 * __syncthreads before reading */
template <int HS, int ROWS>
__device__ __forceinline__ void fa2_load_tile_async(bf16 *tile, const bf16 *src, size_t ld, int r0, int T_) {
  fa2_copy_tile_async<HS, ROWS>(tile, src, ld, r0, T_);
  td_cp_async_commit();
}

/* A fragments of a 16-row strip of a shared tile (row stride HS + 8), all
 * HS / 16 k-chunks */
template <int HS> __device__ __forceinline__ void fa2_load_a(uint32_t a[HS / 16][4], const bf16 *strip) {
  int lane = threadIdx.x % 32;
#pragma unroll
  for (int kc = 0; kc < HS / 16; kc++) td_ldmatrix_x4(a[kc], strip + (lane % 16) * (HS + 8) + kc * 16 + (lane / 16) * 8);
}

/* acc[m][16 x 64] = A_m (16 x HS, fragments) times B^T for each of the MI
 * strips m, B the 64 x HS shared tile `tile` (row stride HS + 8): the
 * score-shaped products (Q K^T and the like). Each B fragment read from
 * shared memory feeds the MI strips' products. */
template <int HS, int MI>
__device__ __forceinline__ void fa2_scores(float acc[MI][8][4], const uint32_t a[MI][HS / 16][4], const bf16 *tile) {
  int lane = threadIdx.x % 32;
#pragma unroll
  for (int m = 0; m < MI; m++)
#pragma unroll
    for (int n = 0; n < 8; n++) acc[m][n][0] = acc[m][n][1] = acc[m][n][2] = acc[m][n][3] = 0.0f;
#pragma unroll
  for (int kc = 0; kc < HS / 16; kc++)
#pragma unroll
    for (int np = 0; np < 4; np++) {
      /* matrices: rows np*16 + 0..7 (cols kc*16 + 0..7, 8..15), rows + 8..15 (same) */
      uint32_t b[4];
      td_ldmatrix_x4(b, tile + (np * 16 + lane % 8 + (lane / 16) * 8) * (HS + 8) + kc * 16 + ((lane / 8) % 2) * 8);
#pragma unroll
      for (int m = 0; m < MI; m++) {
        td_mma_bf16_16816(acc[m][2 * np], a[m][kc], b, acc[m][2 * np]);
        td_mma_bf16_16816(acc[m][2 * np + 1], a[m][kc], b + 2, acc[m][2 * np + 1]);
      }
    }
}

/* fa2_scores<HS, 1> with A's fragments read from a 16-row strip of a
 * shared tile (row stride HS + 8) as each k-chunk needs them: at head size
 * 128 they would hold 32 registers a lane for the whole loop */
template <int HS> __device__ __forceinline__ void fa2_scores_strip(float acc[1][8][4], const bf16 *strip, const bf16 *tile) {
  int lane = threadIdx.x % 32;
#pragma unroll
  for (int n = 0; n < 8; n++) acc[0][n][0] = acc[0][n][1] = acc[0][n][2] = acc[0][n][3] = 0.0f;
#pragma unroll
  for (int kc = 0; kc < HS / 16; kc++) {
    uint32_t a[4];
    td_ldmatrix_x4(a, strip + (lane % 16) * (HS + 8) + kc * 16 + (lane / 16) * 8);
#pragma unroll
    for (int np = 0; np < 4; np++) {
      uint32_t b[4];
      td_ldmatrix_x4(b, tile + (np * 16 + lane % 8 + (lane / 16) * 8) * (HS + 8) + kc * 16 + ((lane / 8) % 2) * 8);
      td_mma_bf16_16816(acc[0][2 * np], a, b, acc[0][2 * np]);
      td_mma_bf16_16816(acc[0][2 * np + 1], a, b + 2, acc[0][2 * np + 1]);
    }
  }
}

/* A fragment of columns 16 kk .. 16 kk + 15 of a 16 x 64 accumulator, bf16 */
__device__ __forceinline__ void fa2_acc_to_a(uint32_t a[4], const float acc[8][4], int kk) {
  a[0] = td_pack_bf16x2(acc[2 * kk][0], acc[2 * kk][1]);
  a[1] = td_pack_bf16x2(acc[2 * kk][2], acc[2 * kk][3]);
  a[2] = td_pack_bf16x2(acc[2 * kk + 1][0], acc[2 * kk + 1][1]);
  a[3] = td_pack_bf16x2(acc[2 * kk + 1][2], acc[2 * kk + 1][3]);
}

/* out[m][16 x HS] += A_m (16 x 16: columns 16 kk .. of strip m) times the
 * tile's rows 16 kk .. 16 kk + 15 (16 x HS, row stride HS + 8), for each of
 * the MI strips; each B fragment feeds the MI products */
template <int HS, int MI>
__device__ __forceinline__ void fa2_times_rows(float out[MI][HS / 8][4], const uint32_t a[MI][4], const bf16 *tile,
                                               int kk) {
  int lane = threadIdx.x % 32;
#pragma unroll
  for (int dp = 0; dp < HS / 16; dp++) {
    uint32_t b[4];
    td_ldmatrix_x4_trans(b, tile + (kk * 16 + lane % 16) * (HS + 8) + dp * 16 + (lane / 16) * 8);
#pragma unroll
    for (int m = 0; m < MI; m++) {
      td_mma_bf16_16816(out[m][2 * dp], a[m], b, out[m][2 * dp]);
      td_mma_bf16_16816(out[m][2 * dp + 1], a[m], b + 2, out[m][2 * dp + 1]);
    }
  }
}

__device__ __forceinline__ float fa2_quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float fa2_quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

/* The forward's block shape at head size HS: MI m16 strips of query rows
 * a warp. Two up to head size 64 (each K/V fragment read from shared
 * memory then feeds two products); one at 128, where two would hold O, Q's
 * fragments and S in 128 + 64 + 64 registers a lane (spills). At 128 the
 * Q tile (64 rows) is staged in V's buffer, whose first tile is copied once
 * every warp holds its Q fragments: two tiles of 17,408 bytes, under the
 * 48 KB of static shared memory. */
template <int HS> struct fa2_fwd_shape {
  static constexpr int MI = HS <= 64 ? 2 : 1;
  static constexpr int ROWS = 4 * 16 * MI; /* query rows of a block */
  static constexpr bool Q_IN_V = HS > 64;
};

/* STAGED: each warp's output rows go through shared memory (its own rows
 * of the Q tile, or V's buffer at head size 128) and leave in 16-byte
 * stores, a row's HS / 8 vectors by consecutive lanes (whole 32-byte
 * sectors); otherwise each lane stores its accumulator pairs, 4 bytes at a
 * time, 8 rows of 16 bytes per instruction (the kernel as profiled on an
 * H200: 174 us against cuDNN's 111 us at GPT-2 124M's shape;
 * TD_CUDA_ATTENTION_DIRECT_STORE keeps it for the A/B). */
template <int HS, bool STAGED>
__global__ void __launch_bounds__(FA2_THREADS) fa2_forward_kernel(bf16 *out, float *lse, const bf16 *inp, int T_,
                                                                  int C, int NH, float scale_log2) {
  typedef fa2_fwd_shape<HS> shape;
  constexpr int LD = HS + 8, KC = HS / 16, DN = HS / 8, MI = shape::MI, ROWS = shape::ROWS;
  constexpr int Q_OWN = shape::Q_IN_V ? 0 : ROWS; /* rows of a separate Q buffer */
  __shared__ __align__(16) bf16 sm[(Q_OWN + 2 * FA2_TILE) * LD];
  bf16 *Ks = sm + Q_OWN * LD, *Vs = Ks + FA2_TILE * LD, *Qs = shape::Q_IN_V ? Vs : sm;
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  int q0 = (gridDim.x - 1 - blockIdx.x) * ROWS; /* heaviest first */
  size_t ld = (size_t)3 * C;
  const bf16 *qb = inp + (size_t)b * T_ * ld + (size_t)h * HS;
  fa2_load_tile_async<HS, ROWS>(Qs, qb, ld, q0, T_);
  fa2_load_tile_async<HS, FA2_TILE>(Ks, qb + C, ld, 0, T_);
  td_cp_async_wait<0>();
  __syncthreads();
  int wr0 = q0 + warp * 16 * MI; /* this warp's first query row */
  uint32_t qa[MI][KC][4];
#pragma unroll
  for (int mi = 0; mi < MI; mi++) fa2_load_a<HS>(qa[mi], Qs + (warp * 16 * MI + mi * 16) * LD);
  if (shape::Q_IN_V) __syncthreads(); /* every warp holds its Q fragments: V(0) may land on them */
  float o[MI][DN][4], m[MI][2], l[MI][2];
#pragma unroll
  for (int mi = 0; mi < MI; mi++) {
#pragma unroll
    for (int d = 0; d < DN; d++) o[mi][d][0] = o[mi][d][1] = o[mi][d][2] = o[mi][d][3] = 0.0f;
    m[mi][0] = m[mi][1] = -INFINITY;
    l[mi][0] = l[mi][1] = 0.0f;
  }
  int n_kt = (min(q0 + ROWS, T_) - 1) / FA2_TILE + 1;
  /* K and V tiles in one buffer each, FA2's overlap: V(kt) is copied while
   * S = Q K(kt)^T and its softmax are computed, K(kt + 1) while P V(kt) is */
  for (int kt = 0; kt < n_kt; kt++) {
    int j0 = kt * FA2_TILE;
    if (kt > 0) {
      td_cp_async_wait<0>(); /* K(kt) */
      __syncthreads();        /* ... visible; every warp is done with V(kt - 1) */
    }
    fa2_load_tile_async<HS, FA2_TILE>(Vs, qb + 2 * C, ld, j0, T_);
    /* j0 is a multiple of 64 and wr0 of 16 MI: a tile that starts past this
     * warp's first row starts past its last, every score masked */
    bool active = j0 <= wr0;
    bool diag = j0 + FA2_TILE - 1 > wr0; /* some key of the tile after some row: mask */
    float s[MI][8][4];
    if (active) {
      fa2_scores<HS, MI>(s, qa, Ks);
#pragma unroll
      for (int mi = 0; mi < MI; mi++) {
#pragma unroll
        for (int half = 0; half < 2; half++) {
          int i = wr0 + mi * 16 + half * 8 + g; /* the row of s[.][2 half + e] */
          float mx = -INFINITY;
#pragma unroll
          for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
              float v = s[mi][n][2 * half + e] * scale_log2;
              if (diag && j0 + n * 8 + 2 * t + e > i) v = -INFINITY;
              s[mi][n][2 * half + e] = v;
              mx = fmaxf(mx, v);
            }
          /* key j0 <= wr0 <= i is never masked: m_new is finite */
          float m_new = fmaxf(m[mi][half], fa2_quad_max(mx));
          float corr = exp2f(m[mi][half] - m_new); /* 0 on the first tile */
          m[mi][half] = m_new;
          float sum = 0.0f;
#pragma unroll
          for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
              float p = exp2f(s[mi][n][2 * half + e] - m_new);
              s[mi][n][2 * half + e] = p;
              sum += p;
            }
          l[mi][half] = l[mi][half] * corr + sum; /* this lane's columns only */
#pragma unroll
          for (int d = 0; d < DN; d++) {
            o[mi][d][2 * half] *= corr;
            o[mi][d][2 * half + 1] *= corr;
          }
        }
      }
    }
    td_cp_async_wait<0>(); /* V(kt) */
    __syncthreads();        /* ... visible; every warp is done with K(kt) */
    if (kt + 1 < n_kt) fa2_load_tile_async<HS, FA2_TILE>(Ks, qb + C, ld, j0 + FA2_TILE, T_);
    if (!active) continue;
#pragma unroll
    for (int kk = 0; kk < FA2_TILE / 16; kk++) {
      uint32_t pa[MI][4];
#pragma unroll
      for (int mi = 0; mi < MI; mi++) fa2_acc_to_a(pa[mi], s[mi], kk);
      fa2_times_rows<HS, MI>(o, pa, Vs, kk);
    }
  }
  /* this warp's rows of the Q tile (read by this warp only, at the start)
   * hold its output on the way out; in V's buffer, once every warp is done
   * with the last V tile (no copy is in flight then) */
  bf16 *stage = Qs + warp * 16 * MI * LD;
  if (STAGED && shape::Q_IN_V) __syncthreads();
#pragma unroll
  for (int mi = 0; mi < MI; mi++)
#pragma unroll
    for (int half = 0; half < 2; half++) {
      float lsum = fa2_quad_sum(l[mi][half]);
      int r = mi * 16 + half * 8 + g, i = wr0 + r;
      float inv = 1.0f / lsum;
      if (STAGED) {
#pragma unroll
        for (int d = 0; d < DN; d++)
          *(uint32_t *)(stage + r * LD + d * 8 + 2 * t) =
              td_pack_bf16x2(o[mi][d][2 * half] * inv, o[mi][d][2 * half + 1] * inv);
      }
      if (i >= T_) continue;
      if (!STAGED) {
        bf16 *orow = out + ((size_t)b * T_ + i) * C + (size_t)h * HS + 2 * t;
#pragma unroll
        for (int d = 0; d < DN; d++)
          *(uint32_t *)(orow + d * 8) = td_pack_bf16x2(o[mi][d][2 * half] * inv, o[mi][d][2 * half + 1] * inv);
      }
      if (t == 0) lse[(size_t)bh * T_ + i] = (m[mi][half] + log2f(lsum)) * FA2_LN2;
    }
  if (STAGED) {
    __syncwarp();
    constexpr int VPR = HS / 8; /* 16-byte vectors a row */
#pragma unroll
    for (int e = lane; e < 16 * MI * VPR; e += 32) {
      int r = e / VPR, c = (e % VPR) * 8, i = wr0 + r;
      if (i < T_) *(int4 *)(out + ((size_t)b * T_ + i) * C + (size_t)h * HS + c) = *(const int4 *)(stage + r * LD + c);
    }
  }
}

/* dinp's old value to add to: itself, or 0 when the call overwrites
 * (TD_CUDA_DINP_OVERWRITE: a scratch gradient that was never zeroed) */
__device__ __forceinline__ float fa2_old(const bf16 *x, bool add) { return add ? __bfloat162float(*x) : 0.0f; }

/* dinp rows r0 .. r0 + 15 of one part (q, k or v: base points at the
 * part's first column of batch row 0) += mul * a warp's 16 x HS
 * accumulator (C-fragment layout), or = it when !add */
template <int HS>
__device__ __forceinline__ void fa2_store_acc(bf16 *base, size_t ld, const float acc[HS / 8][4], int r0, int T_,
                                              float mul, bool add) {
  int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int half = 0; half < 2; half++) {
    int r = r0 + half * 8 + g;
    if (r >= T_) continue;
#pragma unroll
    for (int d = 0; d < HS / 8; d++) {
      bf16 *x = base + (size_t)r * ld + 2 * t + d * 8;
      *(uint32_t *)x = td_pack_bf16x2(fa2_old(x, add) + acc[d][2 * half] * mul,
                                      fa2_old(x + 1, add) + acc[d][2 * half + 1] * mul);
    }
  }
}

/* One tile pair on the keys' side, for the warp's 16 keys from wk0 (K, V
 * fragments a1, a2, or with OWN_SMEM their 16-row strips s1, s2 of shared
 * tiles) and the query tile from o0 (Q in t1, dO in t2, their lse in base 2
 * and D in Lc, Dc): S^T = K Q^T, dP^T = V dO^T, P^T and dS^T = P^T (dP^T -
 * D) left in s and dp (registers), dV += P^T dO, dK += dS^T Q. */
template <int HS, bool OWN_SMEM>
__device__ __forceinline__ void fa2_keys_step(float dk[1][HS / 8][4], float dv[1][HS / 8][4], float s[1][8][4],
                                              float dp[1][8][4], const uint32_t a1[1][HS / 16][4],
                                              const uint32_t a2[1][HS / 16][4], const bf16 *s1, const bf16 *s2,
                                              const bf16 *t1, const bf16 *t2, const float *Lc, const float *Dc, int o0,
                                              int wk0, int T_, float scale_log2) {
  int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  if constexpr (OWN_SMEM) {
    fa2_scores_strip<HS>(s, s1, t1);
    fa2_scores_strip<HS>(dp, s2, t2);
  } else {
    fa2_scores<HS, 1>(s, a1, t1);  /* S^T = K Q^T */
    fa2_scores<HS, 1>(dp, a2, t2); /* dP^T = V dO^T */
  }
#pragma unroll
  for (int half = 0; half < 2; half++) {
    int k = wk0 + half * 8 + g;
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        int c = n * 8 + 2 * t + e, q = o0 + c;
        /* k > q: above the diagonal; q >= T_ (hence k >= T_ too): padding */
        float p = (k <= q && q < T_) ? exp2f(s[0][n][2 * half + e] * scale_log2 - Lc[c]) : 0.0f;
        s[0][n][2 * half + e] = p;
        dp[0][n][2 * half + e] = p * (dp[0][n][2 * half + e] - Dc[c]);
      }
  }
#pragma unroll
  for (int kk = 0; kk < FA2_TILE / 16; kk++) {
    uint32_t pa[1][4], da[1][4];
    fa2_acc_to_a(pa[0], s[0], kk);
    fa2_times_rows<HS, 1>(dv, pa, t2, kk); /* dV += P^T dO */
    fa2_acc_to_a(da[0], dp[0], kk);
    fa2_times_rows<HS, 1>(dk, da, t1, kk); /* dK += dS^T Q */
  }
}

/* KEYS: a block owns 64 keys and accumulates dK, dV over the query tiles
 * from the diagonal on; otherwise it owns 64 queries and accumulates dQ
 * over the key tiles up to the diagonal. The warp's 16 own rows are the
 * products' M: own1/own2 = K/V (keys) or Q/dO (queries), the other tile's
 * oth1/oth2 = Q/dO or K/V.
 * Shared memory (dynamic; fa2_twopass_layout): the own tile, then the
 * other tiles, two buffers each (the next arrives by cp.async during this
 * one's products), then lse (base 2) and D of the keys' other tile, two
 * buffers. 47,104 bytes at head size 64. At 128 the keys' pass keeps K and
 * V in two own tiles and reads their fragments from there (OWN_SMEM: in
 * registers they, dK, dV, S and dP would need 256 a lane): 105,472 bytes;
 * the queries' pass 88,064. */
template <int HS, bool KEYS> struct fa2_twopass_layout {
  static constexpr bool OWN_SMEM = KEYS && HS > 64;
  static constexpr int TILE = FA2_TILE * (HS + 8), N_OWN = OWN_SMEM ? 2 : 1;
  static constexpr size_t oth1_off = (size_t)N_OWN * TILE, oth2_off = oth1_off + 2 * (size_t)TILE;
  static constexpr size_t bf16_elems = oth2_off + 2 * (size_t)TILE;
  static constexpr size_t bytes = bf16_elems * sizeof(bf16) + 4 * FA2_TILE * sizeof(float);
};

template <int HS, bool KEYS>
__global__ void __launch_bounds__(FA2_THREADS)
    fa2_backward_twopass_kernel(bf16 *dinp, const bf16 *dout, const bf16 *inp, const float *lse, const float *D, int T_, int C,
                        int NH, float scale, float scale_log2, bool add) {
  typedef fa2_twopass_layout<HS, KEYS> lay;
  constexpr int LD = HS + 8, KC = HS / 16, DN = HS / 8, TILE = lay::TILE;
  constexpr bool OWN_SMEM = lay::OWN_SMEM;
  TD_DYNAMIC_SMEM(char, smem);
  bf16 *own = (bf16 *)smem, *oth1 = own + lay::oth1_off, *oth2 = own + lay::oth2_off;
  float *Lt = (float *)(own + lay::bf16_elems), *Dt = Lt + 2 * FA2_TILE;
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  int n_tiles = (T_ + FA2_TILE - 1) / FA2_TILE;
  int tile = KEYS ? blockIdx.x : gridDim.x - 1 - blockIdx.x; /* heaviest first */
  int r0 = tile * FA2_TILE, wr0 = r0 + warp * FA2_TILE / 4;
  size_t ld = (size_t)3 * C;
  const bf16 *qb = inp + (size_t)b * T_ * ld + (size_t)h * HS, *ob = dout + (size_t)b * T_ * C + (size_t)h * HS;
  const float *lse_bh = lse + (size_t)bh * T_, *D_bh = D + (size_t)bh * T_;
  /* own fragments, through the one shared tile; or K and V kept in two */
  uint32_t a1[1][KC][4], a2[1][KC][4];
  const bf16 *s1 = own + warp * 16 * LD, *s2 = s1 + TILE; /* OWN_SMEM: this warp's strips of K and V */
  if constexpr (OWN_SMEM) {
    fa2_load_tile<HS, FA2_TILE>(own, qb + C, ld, r0, T_);
    fa2_load_tile<HS, FA2_TILE>(own + TILE, qb + 2 * C, ld, r0, T_);
    __syncthreads();
  } else {
    fa2_load_tile<HS, FA2_TILE>(own, KEYS ? qb + C : qb, ld, r0, T_);
    __syncthreads();
    fa2_load_a<HS>(a1[0], own + warp * 16 * LD);
    __syncthreads();
    if (KEYS)
      fa2_load_tile<HS, FA2_TILE>(own, qb + 2 * C, ld, r0, T_);
    else
      fa2_load_tile<HS, FA2_TILE>(own, ob, C, r0, T_);
    __syncthreads();
    fa2_load_a<HS>(a2[0], own + warp * 16 * LD);
  }
  /* queries: this lane's two rows' lse (base 2) and D */
  float Lrow[2] = {0.0f, 0.0f}, Drow[2] = {0.0f, 0.0f};
  if (!KEYS)
#pragma unroll
    for (int half = 0; half < 2; half++) {
      int i = wr0 + half * 8 + g;
      if (i < T_) {
        Lrow[half] = lse_bh[i] * FA2_LOG2E;
        Drow[half] = D_bh[i];
      }
    }
  float acc1[1][DN][4], acc2[1][DN][4]; /* keys: dK, dV; queries: dQ (acc2 unused) */
#pragma unroll
  for (int d = 0; d < DN; d++)
#pragma unroll
    for (int e = 0; e < 4; e++) acc1[0][d][e] = acc2[0][d][e] = 0.0f;
  int first = KEYS ? tile : 0, last = KEYS ? n_tiles - 1 : tile;
  /* the first other tile (and, for keys, its lse and D) */
  {
    int o0 = first * FA2_TILE;
    fa2_copy_tile_async<HS, FA2_TILE>(oth1, KEYS ? qb : qb + C, ld, o0, T_);
    if (KEYS)
      fa2_copy_tile_async<HS, FA2_TILE>(oth2, ob, C, o0, T_);
    else
      fa2_copy_tile_async<HS, FA2_TILE>(oth2, qb + 2 * C, ld, o0, T_);
    td_cp_async_commit();
    if (KEYS)
      for (int e = threadIdx.x; e < FA2_TILE; e += FA2_THREADS) {
        Lt[e] = o0 + e < T_ ? lse_bh[o0 + e] * FA2_LOG2E : 0.0f;
        Dt[e] = o0 + e < T_ ? D_bh[o0 + e] : 0.0f;
      }
  }
  for (int ot = first; ot <= last; ot++) {
    const int o0 = ot * FA2_TILE, buf = (ot - first) & 1;
    /* the next tile's copies (its buffer was freed by the last iteration's
     * closing barrier), and for keys its lse and D into registers */
    float nl = 0.0f, nd = 0.0f;
    if (ot < last) {
      int n0 = o0 + FA2_TILE;
      fa2_copy_tile_async<HS, FA2_TILE>(oth1 + (buf ^ 1) * TILE, KEYS ? qb : qb + C, ld, n0, T_);
      if (KEYS)
        fa2_copy_tile_async<HS, FA2_TILE>(oth2 + (buf ^ 1) * TILE, ob, C, n0, T_);
      else
        fa2_copy_tile_async<HS, FA2_TILE>(oth2 + (buf ^ 1) * TILE, qb + 2 * C, ld, n0, T_);
      td_cp_async_commit();
      if (KEYS && threadIdx.x < FA2_TILE && n0 + (int)threadIdx.x < T_) {
        nl = lse_bh[n0 + threadIdx.x] * FA2_LOG2E;
        nd = D_bh[n0 + threadIdx.x];
      }
      td_cp_async_wait<1>(); /* this tile's copies */
    } else {
      td_cp_async_wait<0>();
    }
    __syncthreads(); /* this tile is visible to every warp */
    const bf16 *t1 = oth1 + buf * TILE, *t2 = oth2 + buf * TILE;
    const float *Lc = Lt + buf * FA2_TILE, *Dc = Dt + buf * FA2_TILE;
    /* a tile wholly on the masked side of this warp's 16 rows: nothing to add */
    if (KEYS) {
      /* every query tile from the block's diagonal on reaches this warp's keys */
      float s[1][8][4], dp[1][8][4];
      fa2_keys_step<HS, OWN_SMEM>(acc1, acc2, s, dp, a1, a2, s1, s2, t1, t2, Lc, Dc, o0, wr0, T_, scale_log2);
    } else if (o0 <= wr0 + 15) { /* key tiles wholly after this warp's 16 queries add nothing */
      float s[1][8][4], dp[1][8][4];
      fa2_scores<HS, 1>(s, a1, t1);  /* S = Q K^T */
      fa2_scores<HS, 1>(dp, a2, t2); /* dP = dO V^T */
#pragma unroll
      for (int half = 0; half < 2; half++) {
        int q = wr0 + half * 8 + g;
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
          for (int e = 0; e < 2; e++) {
            int k = o0 + n * 8 + 2 * t + e;
            float p = (k <= q && q < T_) ? exp2f(s[0][n][2 * half + e] * scale_log2 - Lrow[half]) : 0.0f;
            dp[0][n][2 * half + e] = p * (dp[0][n][2 * half + e] - Drow[half]);
          }
      }
#pragma unroll
      for (int kk = 0; kk < FA2_TILE / 16; kk++) {
        uint32_t da[1][4];
        fa2_acc_to_a(da[0], dp[0], kk);
        fa2_times_rows<HS, 1>(acc1, da, t1, kk); /* dQ += dS K */
      }
    }
    if (KEYS && ot < last && threadIdx.x < FA2_TILE) {
      Lt[(buf ^ 1) * FA2_TILE + threadIdx.x] = nl;
      Dt[(buf ^ 1) * FA2_TILE + threadIdx.x] = nd;
    }
    __syncthreads(); /* every warp is done with this tile's buffers */
  }
  /* dinp += the gradient: dK and dQ carry the score scale, dV not */
  bf16 *head = dinp + (size_t)b * T_ * ld + (size_t)h * HS;
  if (KEYS) {
    fa2_store_acc<HS>(head + C, ld, acc1[0], wr0, T_, scale, add);
    fa2_store_acc<HS>(head + 2 * C, ld, acc2[0], wr0, T_, 1.0f, add);
  } else {
    fa2_store_acc<HS>(head, ld, acc1[0], wr0, T_, scale, add);
  }
}

/* The backward in one pass (FA2's loop order, with dQ's sums in a fixed
 * order rather than atomic): a block owns 64 keys (4 warps x 16) and walks
 * the query tiles from the last down to its diagonal. Per tile: S^T = K Q^T and dP^T =
 * V dO^T (K, V fragments in registers), P^T and dS^T in registers, dV +=
 * P^T dO and dK += dS^T Q; dS^T (bf16, as the products use it) goes to
 * shared memory, each warp takes dQ's 16 rows of the tile, dS K over the
 * block's 64 keys, and stores them (f32) as this key block's part of the
 * tile; fa2_dq_reduce_kernel then sums each tile's parts in key-block order
 * and adds the sum, scaled, into dinp's q part, rounding once. Q and dO
 * tiles are double-buffered: the next tile's cp.async copies land during
 * this tile's products.
 * First tried (2026-11-28): the parts added in place, key block by key
 * block, each waiting its turn on a flag: the add's latency then sat on
 * every block's critical path, 1.46 ms a layer on an H200 against the two
 * passes' 0.79. The parts cost 2 x n(n+1)/2 tiles of traffic instead
 * (~430 MB written and read a layer at GPT-2 124M's shape) and never wait. */
template <int HS> struct fa2_bwd_layout {
  static constexpr int LD = HS + 8, LDS = FA2_TILE + 8, TILE = FA2_TILE * LD;
  /* K (kept for dS K); Q and dO, two buffers each (buffer 1 of Q holds V
   * at the start); dS^T (64 keys x 64 queries); lse (base 2) and D, two
   * buffers each */
  static constexpr size_t k_off = 0, q_off = TILE, o_off = 3 * TILE, ds_off = 5 * TILE;
  static constexpr size_t bytes = (5 * (size_t)TILE + (size_t)FA2_TILE * LDS) * sizeof(bf16) + 4 * FA2_TILE * sizeof(float);
};

template <int HS>
__global__ void __launch_bounds__(FA2_THREADS)
    fa2_backward_kernel(bf16 *dinp, float *dq_parts, const bf16 *dout, const bf16 *inp, const float *lse,
                        const float *D, int T_, int C, int NH, float scale, float scale_log2, bool add) {
  typedef fa2_bwd_layout<HS> lay;
  constexpr int LD = lay::LD, LDS = lay::LDS, KC = HS / 16, DN = HS / 8;
  TD_DYNAMIC_SMEM(char, smem);
  bf16 *Ks = (bf16 *)smem + lay::k_off, *Qs = (bf16 *)smem + lay::q_off, *Os = (bf16 *)smem + lay::o_off;
  bf16 *dSs = (bf16 *)smem + lay::ds_off;
  float *Lt = (float *)(dSs + FA2_TILE * LDS), *Dt = Lt + 2 * FA2_TILE;
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  int n_tiles = (T_ + FA2_TILE - 1) / FA2_TILE;
  int kt = blockIdx.x, k0 = kt * FA2_TILE, wk0 = k0 + warp * 16; /* heaviest first: kt 0 has every query tile */
  size_t ld = (size_t)3 * C;
  const bf16 *qb = inp + (size_t)b * T_ * ld + (size_t)h * HS, *ob = dout + (size_t)b * T_ * C + (size_t)h * HS;
  const float *lse_bh = lse + (size_t)bh * T_, *D_bh = D + (size_t)bh * T_;
  /* this head's dQ parts: tile (kt, ot), ot >= kt, at kt n - kt (kt - 1) / 2 + ot - kt */
  float *parts = dq_parts + ((size_t)bh * n_tiles * (n_tiles + 1) / 2 + (size_t)kt * n_tiles -
                             (size_t)kt * (kt - 1) / 2) * FA2_TILE * HS;
  /* K, V (into Q's buffer 1) and the first query tile in one group */
  int ot = n_tiles - 1;
  fa2_copy_tile_async<HS, FA2_TILE>(Ks, qb + C, ld, k0, T_);
  fa2_copy_tile_async<HS, FA2_TILE>(Qs + lay::TILE, qb + 2 * C, ld, k0, T_);
  fa2_copy_tile_async<HS, FA2_TILE>(Qs, qb, ld, ot * FA2_TILE, T_);
  fa2_copy_tile_async<HS, FA2_TILE>(Os, ob, C, ot * FA2_TILE, T_);
  td_cp_async_commit();
  {
    int e = threadIdx.x % FA2_TILE, q = ot * FA2_TILE + e;
    if (threadIdx.x < FA2_TILE)
      Lt[e] = q < T_ ? lse_bh[q] * FA2_LOG2E : 0.0f;
    else
      Dt[e] = q < T_ ? D_bh[q] : 0.0f;
  }
  td_cp_async_wait<0>();
  __syncthreads();
  uint32_t a1[1][KC][4], a2[1][KC][4]; /* this warp's 16 keys: K and V fragments */
  fa2_load_a<HS>(a1[0], Ks + warp * 16 * LD);
  fa2_load_a<HS>(a2[0], Qs + lay::TILE + warp * 16 * LD);
  __syncthreads(); /* V's buffer is free for the next query tile */
  float acc1[1][DN][4], acc2[1][DN][4]; /* dK, dV */
#pragma unroll
  for (int d = 0; d < DN; d++)
#pragma unroll
    for (int e = 0; e < 4; e++) acc1[0][d][e] = acc2[0][d][e] = 0.0f;
  for (int it = 0; ot >= kt; it++, ot--) {
    int buf = it & 1, o0 = ot * FA2_TILE;
    const bf16 *Qc = Qs + buf * lay::TILE, *Oc = Os + buf * lay::TILE;
    const float *Lc = Lt + buf * FA2_TILE, *Dc = Dt + buf * FA2_TILE;
    /* the next tile's copies, and its lse or D into a register */
    float next_ld = 0.0f;
    if (ot > kt) {
      int n0 = o0 - FA2_TILE;
      fa2_copy_tile_async<HS, FA2_TILE>(Qs + (buf ^ 1) * lay::TILE, qb, ld, n0, T_);
      fa2_copy_tile_async<HS, FA2_TILE>(Os + (buf ^ 1) * lay::TILE, ob, C, n0, T_);
      td_cp_async_commit();
      int q = n0 + threadIdx.x % FA2_TILE; /* q < o0 <= T_ - 1: a row of the sequence */
      next_ld = threadIdx.x < FA2_TILE ? lse_bh[q] * FA2_LOG2E : D_bh[q];
      td_cp_async_wait<1>(); /* this tile's copies (issued one step ago) */
    } else {
      td_cp_async_wait<0>();
    }
    __syncthreads();
    float s[1][8][4], dp[1][8][4];
    fa2_keys_step<HS, false>(acc1, acc2, s, dp, a1, a2, NULL, NULL, Qc, Oc, Lc, Dc, o0, wk0, T_, scale_log2);
    /* dS^T to shared memory, rounded as the products above took it */
#pragma unroll
    for (int half = 0; half < 2; half++)
#pragma unroll
      for (int n = 0; n < 8; n++)
        *(uint32_t *)(dSs + (warp * 16 + half * 8 + g) * LDS + n * 8 + 2 * t) =
            td_pack_bf16x2(dp[0][n][2 * half], dp[0][n][2 * half + 1]);
    if (ot > kt) (threadIdx.x < FA2_TILE ? Lt : Dt)[(buf ^ 1) * FA2_TILE + threadIdx.x % FA2_TILE] = next_ld;
    __syncthreads(); /* dS^T complete */
    /* dQ rows warp*16 .. +15 of the tile: dS (16 queries x 64 keys, from
     * dS^T by ldmatrix .trans) times K (64 x HS) */
    float dq[1][DN][4];
#pragma unroll
    for (int d = 0; d < DN; d++) dq[0][d][0] = dq[0][d][1] = dq[0][d][2] = dq[0][d][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < FA2_TILE / 16; kk++) {
      uint32_t a[1][4];
      td_ldmatrix_x4_trans(a[0], dSs + (kk * 16 + (lane / 16) * 8 + lane % 8) * LDS + warp * 16 + ((lane / 8) % 2) * 8);
      fa2_times_rows<HS, 1>(dq, a, Ks, kk);
    }
    /* this key block's part of the tile's dQ */
    float *prow = parts + (size_t)(ot - kt) * FA2_TILE * HS + 2 * t;
#pragma unroll
    for (int half = 0; half < 2; half++) {
      float *pr = prow + (size_t)(warp * 16 + half * 8 + g) * HS;
#pragma unroll
      for (int d = 0; d < DN; d++) *(float2 *)(pr + d * 8) = make_float2(dq[0][d][2 * half], dq[0][d][2 * half + 1]);
    }
    if (ot > kt) __syncthreads(); /* dS^T and this step's buffers are free for the next */
  }
  /* dinp += dK (with the score scale), dV */
  bf16 *head = dinp + (size_t)b * T_ * ld + (size_t)h * HS;
  fa2_store_acc<HS>(head + C, ld, acc1[0], wk0, T_, scale, add);
  fa2_store_acc<HS>(head + 2 * C, ld, acc2[0], wk0, T_, 1.0f, add);
}

/* dinp's q part += scale * (the sum of a dQ tile's parts over key blocks
 * kt = 0 .. ot, in that order): one block per (tile, head), 4 columns a
 * thread (float4 reads of the parts). */
template <int HS>
__global__ void __launch_bounds__(256) fa2_dq_reduce_kernel(bf16 *dinp, const float *dq_parts, int T_, int C,
                                                            int NH, float scale, bool add) {
  int ot = blockIdx.x, bh = blockIdx.y, b = bh / NH, h = bh % NH, n_tiles = gridDim.x;
  const float *head = dq_parts + (size_t)bh * n_tiles * (n_tiles + 1) / 2 * FA2_TILE * HS;
  for (int e = threadIdx.x * 4; e < FA2_TILE * HS; e += 256 * 4) {
    int r = e / HS, c = e % HS, q = ot * FA2_TILE + r;
    if (q >= T_) continue;
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int kt = 0; kt <= ot; kt++) {
      size_t tile = (size_t)kt * n_tiles - (size_t)kt * (kt - 1) / 2 + (ot - kt);
      float4 v = *(const float4 *)(head + tile * FA2_TILE * HS + e);
      sum = make_float4(sum.x + v.x, sum.y + v.y, sum.z + v.z, sum.w + v.w);
    }
    bf16 *x = dinp + ((size_t)b * T_ + q) * 3 * C + (size_t)h * HS + c;
    uint32_t lo = td_pack_bf16x2(fa2_old(x, add) + sum.x * scale, fa2_old(x + 1, add) + sum.y * scale);
    uint32_t hi = td_pack_bf16x2(fa2_old(x + 2, add) + sum.z * scale, fa2_old(x + 3, add) + sum.w * scale);
    *(uint32_t *)x = lo;
    *(uint32_t *)(x + 2) = hi;
  }
}

extern "C" size_t td_fa2_dq_parts_floats(int B, int T, int C, int NH) {
  if (C / NH == 128) return 0; /* the two passes run there (td_fa2_backward) */
  size_t n = ((size_t)T + FA2_TILE - 1) / FA2_TILE;
  return (size_t)B * NH * n * (n + 1) / 2 * FA2_TILE * (size_t)(C / NH);
}

extern "C" bool td_fa2_supported(int head_size, int C, const void *p1, const void *p2, const void *p3) {
  return (head_size == 16 || head_size == 32 || head_size == 48 || head_size == 64 || head_size == 128) &&
         C % 8 == 0 && td_aligned16(p1, p2, p3);
}

/* Run the statements with the constant HS the runtime head size (16, 32, 48, 64, 128). */
#define FA2_DISPATCH_HS(hs, ...)                           \
  switch (hs) {                                            \
  case 16: { constexpr int HS = 16; __VA_ARGS__; } break;  \
  case 32: { constexpr int HS = 32; __VA_ARGS__; } break;  \
  case 48: { constexpr int HS = 48; __VA_ARGS__; } break;  \
  case 128: { constexpr int HS = 128; __VA_ARGS__; } break; \
  default: { constexpr int HS = 64; __VA_ARGS__; } break;  \
  }

/* A kernel's dynamic shared memory limit raised to `bytes` where they pass
 * the default 48 KB: once per kernel (the flag is the caller's, one per
 * instantiation), as a process drives one device. */
static td_status fa2_smem_limit(const void *kernel, size_t bytes, bool *set) {
  if (bytes <= 48 * 1024 || *set) return TD_OK;
  TD_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
  *set = true;
  return TD_OK;
}

extern "C" td_status td_fa2_forward(void *out, float *lse, const void *inp, int B, int T, int C, int NH,
                                    bool direct_store, void *stream) {
  int hs = C / NH;
  float scale_log2 = FA2_LOG2E / sqrtf((float)hs);
  FA2_DISPATCH_HS(hs, {
    dim3 grid(td_cuda_blocks((size_t)T, fa2_fwd_shape<HS>::ROWS), B * NH);
    auto *kernel = direct_store ? &fa2_forward_kernel<HS, false> : &fa2_forward_kernel<HS, true>;
    TD_CUDA_LAUNCH(kernel, grid, FA2_THREADS, 0, stream, (bf16 *)out, lse, (const bf16 *)inp, T, C, NH, scale_log2);
  });
  TD_CUDA_LAUNCH_CHECK("fa2_forward_kernel");
  return TD_OK;
}

extern "C" td_status td_fa2_backward(void *dinp, const float *D, float *dq_parts, const void *dout, const void *inp,
                                     const float *lse, int B, int T, int C, int NH, bool onepass, bool add,
                                     void *stream) {
  int hs = C / NH;
  float scale = 1.0f / sqrtf((float)hs), scale_log2 = scale * FA2_LOG2E;
  dim3 grid(td_cuda_blocks((size_t)T, FA2_TILE), B * NH);
  /* at head size 128 the one-pass kernel's fragments and dK, dV, dQ, S, dP
   * would spill: the two passes run */
  if (!onepass || hs == 128) {
    FA2_DISPATCH_HS(hs, {
      static bool kv_set = false, q_set = false;
      auto *kv = &fa2_backward_twopass_kernel<HS, true>;
      const size_t kv_bytes = fa2_twopass_layout<HS, true>::bytes, q_bytes = fa2_twopass_layout<HS, false>::bytes;
      TD_CHECK(fa2_smem_limit((const void *)kv, kv_bytes, &kv_set));
      TD_CUDA_LAUNCH(kv, grid, FA2_THREADS, kv_bytes, stream, (bf16 *)dinp, (const bf16 *)dout, (const bf16 *)inp,
                     lse, D, T, C, NH, scale, scale_log2, add);
      TD_CUDA_LAUNCH_CHECK("fa2_backward_twopass_kernel (dK, dV)");
      auto *qk = &fa2_backward_twopass_kernel<HS, false>;
      TD_CHECK(fa2_smem_limit((const void *)qk, q_bytes, &q_set));
      TD_CUDA_LAUNCH(qk, grid, FA2_THREADS, q_bytes, stream, (bf16 *)dinp, (const bf16 *)dout, (const bf16 *)inp,
                     lse, D, T, C, NH, scale, scale_log2, add);
      TD_CUDA_LAUNCH_CHECK("fa2_backward_twopass_kernel (dQ)");
    });
    return TD_OK;
  }
  switch (hs) { /* the one-pass kernel: head sizes 16 to 64 */
#define FA2_ONEPASS(HS_)                                                                                              \
  case HS_: {                                                                                                        \
    constexpr int HS = HS_;                                                                                          \
    auto *kernel = &fa2_backward_kernel<HS>;                                                                         \
    static bool set = false;                                                                                         \
    TD_CHECK(fa2_smem_limit((const void *)kernel, fa2_bwd_layout<HS>::bytes, &set));                                 \
    TD_CUDA_LAUNCH(kernel, grid, FA2_THREADS, fa2_bwd_layout<HS>::bytes, stream, (bf16 *)dinp, dq_parts,              \
                   (const bf16 *)dout, (const bf16 *)inp, lse, D, T, C, NH, scale, scale_log2, add);                 \
    TD_CUDA_LAUNCH_CHECK("fa2_backward_kernel");                                                                     \
    auto *reduce = &fa2_dq_reduce_kernel<HS>;                                                                        \
    TD_CUDA_LAUNCH(reduce, grid, 256, 0, stream, (bf16 *)dinp, (const float *)dq_parts, T, C, NH, scale, add);      \
    TD_CUDA_LAUNCH_CHECK("fa2_dq_reduce_kernel");                                                                    \
  } break;
    FA2_ONEPASS(16)
    FA2_ONEPASS(32)
    FA2_ONEPASS(48)
    FA2_ONEPASS(64)
#undef FA2_ONEPASS
  default:
    return td_error(TD_ERR_INTERNAL, "td_fa2_backward: head size %d reached the one-pass kernel", hs);
  }
  return TD_OK;
}
