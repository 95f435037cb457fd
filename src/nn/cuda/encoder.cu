/* Token + position embedding on the device (llm.c's llmc/encoder.cuh), the
 * twin of td_embedding_forward/backward.
 *
 * Backward without atomics, bucketed by token (llm.c's arrangement): the
 * host groups the positions by token with a stable counting sort
 * (td_encoder_buckets: the tokens are on the host before they are copied
 * up), so bucket b lists the positions of one token in position order.
 * Block (bucket b, channel group) sums dout's rows of those positions for
 * its 32 x 8 bf16 (x 4 f32) channels, 16 bytes per lane per row, in f32:
 * its 8 warps take every 8th row of the bucket, in position order, and
 * warp 0 adds their 8 sums in warp order, then adds the total to the
 * token's dwte row once. Each dwte element's sum has one order fixed by
 * the tokens: the same bits every run, and one bf16 rounding per element
 * instead of one per position. Memory: dout read once (B T C) plus one read and write of
 * each distinct token's row, ~75 MB in bf16 at GPT-2 124M's shape (B T =
 * 16384, C = 768), ~16 us at an H200's 4.8 TB/s. The old kernel split dwte
 * into 32 classes (token mod 32) and had each of C x 32 threads walk all B T
 * tokens in order: 1.76 ms on an H200 (1.3% of BW). The first bucketed
 * kernel gave each bucket one warp: 33 us on uniformly random tokens, but
 * 1.29 ms a step on train-gpt's text (ncu, H200, 2026-11-28), whose byte
 * tokens make about a hundred buckets, the largest thousands of rows long,
 * each one warp's serial sum; eight warps a bucket cut that chain by 8. A
 * token that fills a large share of the batch (padding) still costs in
 * proportion to its count / 8.
 * dwpe[t] += sum over b of dout[b, t], one thread per (t, channel) adding
 * the B rows in b order. */
#include "cuda_common.cuh"
#include "cuda_layers.h"

template <class T>
__global__ void encoder_forward_kernel(T *out, const int32_t *tokens, const T *wte, const T *wpe, int BT, int T_,
                                       int C) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)BT * C) return;
  int c = (int)(i % C), bt = (int)(i / C), t = bt % T_;
  out[i] = td_from_f32<T>(td_to_f32(wte[(size_t)tokens[bt] * C + c]) + td_to_f32(wpe[(size_t)t * C + c]));
}

#define ENC_WARPS 8 /* warps per block: one bucket's rows, split between them */

template <class T>
__global__ void __launch_bounds__(32 * ENC_WARPS)
    encoder_backward_wte_kernel(T *dwte, const T *dout, const int32_t *tokens, const int32_t *order,
                                const int32_t *starts, int C, bool vec) {
  const int VW = td_vec_width<T>::value;
  const int bucket = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int c0 = (blockIdx.y * 32 + lane) * VW, lo = starts[bucket], hi = starts[bucket + 1];
  const int k = c0 >= C ? 0 : (C - c0 < VW ? C - c0 : VW);
  __shared__ float part[ENC_WARPS][32 * (16 / sizeof(T))];
  float acc[16 / sizeof(T)] = {0}, v[16 / sizeof(T)];
  /* warp w: rows lo + w, lo + w + ENC_WARPS, ... of the bucket, in order */
  if (k > 0) {
#pragma unroll 4
    for (int j = lo + warp; j < hi; j += ENC_WARPS) {
      td_load_group(v, dout + (size_t)order[j] * C + c0, k, vec);
      for (int e = 0; e < k; e++) acc[e] += v[e];
    }
  }
  for (int e = 0; e < VW; e++) part[warp][lane * VW + e] = acc[e];
  __syncthreads();
  if (warp != 0 || k == 0) return;
  /* the warps' sums in warp order, then once into the token's row */
  for (int e = 0; e < VW; e++) acc[e] = 0.0f;
  for (int w = 0; w < ENC_WARPS; w++)
    for (int e = 0; e < k; e++) acc[e] += part[w][lane * VW + e];
  T *d = dwte + (size_t)tokens[order[lo]] * C + c0;
  td_load_group(v, d, k, vec);
  for (int e = 0; e < k; e++) v[e] += acc[e];
  td_store_group(d, v, k, vec);
}

/* dwpe[t, c] += sum over b of dout[b, t, c], b in order */
template <class T> __global__ void encoder_backward_wpe_kernel(T *dwpe, const T *dout, int B, int T_, int C) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)T_ * C) return;
  float acc = 0.0f;
  for (int b = 0; b < B; b++) acc += td_to_f32(dout[(size_t)b * T_ * C + i]);
  dwpe[i] = td_from_f32<T>(td_to_f32(dwpe[i]) + acc);
}

extern "C" td_status td_cuda_encoder_forward(void *out, const int32_t *tokens, const void *wte, const void *wpe,
                                             int B, int T, int C, td_dtype dtype, void *stream) {
  if (B < 0 || T < 0 || C < 0) return td_error(TD_ERR_INVALID_ARGUMENT, "td_cuda_encoder_forward: negative shape");
  size_t n = (size_t)B * T * C;
  if (n == 0) return TD_OK;
  TD_CUDA_DISPATCH(dtype, "td_cuda_encoder_forward", {
    TD_CUDA_LAUNCH(encoder_forward_kernel<td_elem>, td_cuda_blocks(n, 256), 256, 0, stream, (td_elem *)out, tokens,
                   (const td_elem *)wte, (const td_elem *)wpe, B * T, T, C);
  });
  TD_CUDA_LAUNCH_CHECK("encoder_forward_kernel");
  return TD_OK;
}

extern "C" int td_encoder_buckets(const int32_t *tokens, int BT, int V, int32_t *order, int32_t *starts,
                                  int32_t *counts) {
  /* pass 1: counts, and the tokens in order of first appearance (in starts) */
  int nb = 0;
  for (int i = 0; i < BT; i++) {
    int tok = tokens[i];
    if (tok < 0 || tok >= V) continue;
    if (counts[tok]++ == 0) starts[nb++] = tok;
  }
  /* bucket starts; counts become each token's write cursor */
  int run = 0;
  for (int b = 0; b < nb; b++) {
    int tok = starts[b], n = counts[tok];
    starts[b] = counts[tok] = run;
    run += n;
  }
  starts[nb] = run;
  /* pass 2: positions in order (stable), then counts back to zero */
  for (int i = 0; i < BT; i++) {
    int tok = tokens[i];
    if (tok >= 0 && tok < V) order[counts[tok]++] = i;
  }
  for (int i = 0; i < BT; i++) {
    int tok = tokens[i];
    if (tok >= 0 && tok < V) counts[tok] = 0;
  }
  return nb;
}

extern "C" td_status td_cuda_encoder_backward(void *dwte, void *dwpe, const void *dout, const int32_t *tokens,
                                              const int32_t *order, const int32_t *starts, int n_buckets, int B,
                                              int T, int C, td_dtype dtype, void *stream) {
  if (B < 0 || T < 0 || C < 0 || n_buckets < 0)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_cuda_encoder_backward: negative shape");
  if ((size_t)B * T * C == 0) return TD_OK;
  if (dwte && n_buckets > 0 && (!order || !starts))
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "td_cuda_encoder_backward: dwte needs the token buckets (order, starts from td_encoder_buckets)");
  TD_CUDA_DISPATCH(dtype, "td_cuda_encoder_backward", {
    if (dwte && n_buckets > 0) {
      const int VW = td_vec_width<td_elem>::value;
      const bool vec = td_aligned16(dwte, dout, dout) && ((size_t)C * sizeof(td_elem)) % 16 == 0;
      dim3 grid((unsigned)n_buckets, td_cuda_blocks((size_t)C, 32 * VW));
      TD_CUDA_LAUNCH(encoder_backward_wte_kernel<td_elem>, grid, 32 * ENC_WARPS, 0, stream, (td_elem *)dwte,
                     (const td_elem *)dout, tokens, order, starts, C, vec);
      TD_CUDA_LAUNCH_CHECK("encoder_backward_wte_kernel");
    }
    if (dwpe) {
      TD_CUDA_LAUNCH(encoder_backward_wpe_kernel<td_elem>, td_cuda_blocks((size_t)T * C, 256), 256, 0, stream,
                     (td_elem *)dwpe, (const td_elem *)dout, B, T, C);
      TD_CUDA_LAUNCH_CHECK("encoder_backward_wpe_kernel");
    }
  });
  return TD_OK;
}
