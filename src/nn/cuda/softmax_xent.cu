/* Softmax cross-entropy fused with its backward, in place (llm.c's
 * llmc/fused_classifier.cuh), the twin of td_softmax_xent_forward followed
 * by td_softmax_xent_backward into zeroed dlogits. One block per row.
 *
 * Bandwidth: the logits are (N, V), 1.65 GB in bf16 at GPT-2 124M's shape
 * (N = 16384, V = 50304), so the kernel is worth what it moves. Pass 1
 * reads the row once and keeps, per thread, an online softmax (running max
 * m and sum s of exp(x - m), rescaled when m grows: Milakov & Gimelshein),
 * merged across the block in one max and one sum; pass 2 reads the row
 * again (a row is 100 KB; the ~260 rows in flight on an H100/H200 stay in
 * its 50 MB L2, so DRAM sees about one read) and overwrites it with
 * dloss/N (p - onehot). The old kernel read the row three times from
 * memory and computed exp twice: 4.77 ms on an H200 (20.6% of BW); this
 * one moves about N V es * 2 (0.69 ms at the bound). Loads and stores are
 * 16 bytes (8 bf16 or 4 f32) per thread where the row allows: each row is
 * split into a head up to its first 16-byte boundary, whole vectors, and a
 * tail, because rows of an odd V start anywhere.
 *
 * The loss is log(sum) + max - x[target] from the same pass (exact even
 * where the probability underflows); x[target] is read before the block's
 * first barrier, so before any thread writes the row.
 *
 * Determinism: each element is owned by a fixed thread (given V, the row's
 * address and the block size), each thread folds its elements in index
 * order, and the block merges the threads in td_block_reduce's fixed tree:
 * the same bits every run. */
#include "cuda_common.cuh"
#include "cuda_layers.h"

#define XENT_THREADS 512

/* (m, s) <- the online softmax state after also seeing x[0..k) */
__device__ __forceinline__ void xent_fold(float &m, float &s, const float *x, int k) {
  float mx = m;
  for (int j = 0; j < k; j++) mx = fmaxf(mx, x[j]);
  if (mx == -INFINITY) return; /* nothing finite yet: exp(-inf - -inf) would be NaN */
  float acc = s * expf(m - mx);
  for (int j = 0; j < k; j++) acc += expf(x[j] - mx);
  m = mx;
  s = acc;
}

/* the row split: elements [0, head) scalar, `nvec` whole 16-byte vectors,
 * then the tail [head + nvec * VW, V) scalar */
template <class T> struct xent_split {
  int head, nvec, tail;
  __device__ xent_split(const T *x, int V) {
    const int VW = td_vec_width<T>::value;
    head = (int)(((16 - ((uintptr_t)x & 15)) & 15) / sizeof(T));
    if (head > V) head = V;
    nvec = (V - head) / VW;
    tail = head + nvec * VW;
  }
};

template <class T>
__global__ void softmax_xent_kernel(float *losses, T *logits, const int32_t *targets, float scale, int V) {
  const int VW = td_vec_width<T>::value;
  int row = blockIdx.x;
  T *x = logits + (size_t)row * V;
  int target = targets[row];
  bool valid = target >= 0 && target < V;
  float x_target = valid && threadIdx.x == 0 ? td_to_f32(x[target]) : 0.0f;
  const xent_split<T> sp(x, V);
  T *xv = x + sp.head;

  /* pass 1: every element once, its thread's online (max, sum) */
  float m = -INFINITY, s = 0.0f, v[16 / sizeof(T)];
  for (int i = threadIdx.x; i < sp.head; i += blockDim.x) {
    v[0] = td_to_f32(x[i]);
    xent_fold(m, s, v, 1);
  }
#pragma unroll 4
  for (int g = threadIdx.x; g < sp.nvec; g += blockDim.x) {
    td_load_group(v, xv + (size_t)g * VW, VW, true);
    xent_fold(m, s, v, VW);
  }
  for (int i = sp.tail + threadIdx.x; i < V; i += blockDim.x) {
    v[0] = td_to_f32(x[i]);
    xent_fold(m, s, v, 1);
  }
  const float mx = td_block_reduce(m, true);
  const float sum = td_block_reduce(m == -INFINITY ? 0.0f : s * expf(m - mx), false);
  const float inv = 1.0f / sum;
  if (threadIdx.x == 0) losses[row] = valid ? logf(sum) + mx - x_target : NAN;

  /* pass 2: overwrite with scale * (p - onehot), the same split */
  for (int i = threadIdx.x; i < sp.head; i += blockDim.x) {
    float p = expf(td_to_f32(x[i]) - mx) * inv;
    x[i] = td_from_f32<T>(valid ? scale * (p - (i == target ? 1.0f : 0.0f)) : 0.0f);
  }
#pragma unroll 4
  for (int g = threadIdx.x; g < sp.nvec; g += blockDim.x) {
    T *p = xv + (size_t)g * VW;
    td_load_group(v, p, VW, true);
    const int i0 = sp.head + g * VW;
#pragma unroll
    for (int k = 0; k < VW; k++) {
      float q = expf(v[k] - mx) * inv;
      v[k] = valid ? scale * (q - (i0 + k == target ? 1.0f : 0.0f)) : 0.0f;
    }
    td_store_group(p, v, VW, true);
  }
  for (int i = sp.tail + threadIdx.x; i < V; i += blockDim.x) {
    float p = expf(td_to_f32(x[i]) - mx) * inv;
    x[i] = td_from_f32<T>(valid ? scale * (p - (i == target ? 1.0f : 0.0f)) : 0.0f);
  }
}

extern "C" td_status td_cuda_softmax_xent(float *losses, void *logits, const int32_t *targets, float dloss, int N,
                                          int V, td_dtype dtype, void *stream) {
  if (N < 0 || V <= 0) return td_error(TD_ERR_INVALID_ARGUMENT, "td_cuda_softmax_xent: shape N=%d V=%d", N, V);
  if (N == 0) return TD_OK;
  if (((uintptr_t)logits & (dtype == TD_BF16 ? 1 : 3)) != 0)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_cuda_softmax_xent: logits %p not aligned to their element size",
                    logits);
  float scale = dloss / (float)N;
  TD_CUDA_DISPATCH(dtype, "td_cuda_softmax_xent", {
    TD_CUDA_LAUNCH(softmax_xent_kernel<td_elem>, N, XENT_THREADS, 0, stream, losses, (td_elem *)logits, targets, scale, V);
  });
  TD_CUDA_LAUNCH_CHECK("softmax_xent_kernel");
  return TD_OK;
}
