/* Vocabulary-parallel token embedding and cross-entropy on the device
 * (Megatron-LM's VocabParallelEmbedding and vocab_parallel_cross_entropy),
 * the device twins of src/parallel/tensor/layers.c's tp_embedding_* and
 * tp_xent_*: a tensor rank holds vocabulary rows [v0, v0 + Vl) of wte (and
 * of an untied head) and the logits of those columns only. The collectives
 * between the steps are the caller's (gpt_cuda.c, through the tensor
 * split's allreduce); each launcher here is one step between two of them:
 *
 *   embedding: lookup (zeros for a token another rank holds) -> allreduce
 *              SUM -> position add. The sum has one nonzero term per
 *              element, so it is exact and the position add rounds once:
 *              one rank's encoder bits at any dtype.
 *   loss:      row max -> allreduce MAX -> sum of exp(x - max) and the
 *              target's x - max (from the rank that owns it, 0 elsewhere)
 *              -> allreduce SUM of the (N, 2) pairs -> loss and dlogits in
 *              place. The (N, V) logits are never gathered; 3 N floats
 *              cross the group.
 *
 * Kept apart from encoder.cu and softmax_xent.cu (the unsplit kernels) so
 * that each of the two may change inside without touching the other. */
#include "cuda_common.cuh"
#include "cuda_layers.h"

#define VP_THREADS 256
static const int kClasses = 32; /* as encoder.cu's backward: rows in classes by local row mod 32 */

template <class T>
__global__ void vp_lookup_kernel(T *out, const int32_t *tokens, const T *wte_local, int BT, int C, int v0, int Vl) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)BT * C) return;
  int c = (int)(i % C), local = tokens[i / C] - v0;
  out[i] = local >= 0 && local < Vl ? wte_local[(size_t)local * C + c] : td_from_f32<T>(0.0f);
}

/* row i of out is row row0 + i of the (B, T) positions */
template <class T> __global__ void vp_position_add_kernel(T *out, const T *wpe, int rows, int row0, int T_, int C) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)rows * C) return;
  int c = (int)(i % C), t = (int)(((size_t)row0 + i / C) % (size_t)T_);
  out[i] = td_from_f32<T>(td_to_f32(out[i]) + td_to_f32(wpe[(size_t)t * C + c]));
}

/* thread (class s, channel c) adds, in position order, the positions whose
 * local row is in class s: one thread per dwte element, no atomics */
template <class T>
__global__ void vp_backward_kernel(T *dwte_local, const T *dout, const int32_t *tokens, int BT, int C, int v0, int Vl) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  int cls = blockIdx.y * blockDim.y + threadIdx.y;
  if (c >= C || cls >= kClasses) return;
  for (int i = 0; i < BT; i++) {
    int local = tokens[i] - v0;
    if (local < 0 || local >= Vl || local % kClasses != cls) continue;
    T *d = dwte_local + (size_t)local * C + c;
    *d = td_from_f32<T>(td_to_f32(*d) + td_to_f32(dout[(size_t)i * C + c]));
  }
}

template <class T> __global__ void vp_row_max_kernel(float *row_max, const T *logits, int Vl) {
  const T *x = logits + (size_t)blockIdx.x * Vl;
  float m = -INFINITY;
  for (int i = threadIdx.x; i < Vl; i += blockDim.x) m = fmaxf(m, td_to_f32(x[i]));
  m = td_block_reduce(m, true);
  if (threadIdx.x == 0) row_max[blockIdx.x] = m;
}

template <class T>
__global__ void vp_row_sums_kernel(float *sums, const T *logits, const float *row_max, const int32_t *targets, int v0,
                                   int Vl) {
  const int row = blockIdx.x;
  const T *x = logits + (size_t)row * Vl;
  const float mx = row_max[row];
  float s = 0.0f;
  for (int i = threadIdx.x; i < Vl; i += blockDim.x) s += expf(td_to_f32(x[i]) - mx);
  s = td_block_reduce(s, false);
  if (threadIdx.x == 0) {
    int local = targets[row] - v0;
    sums[2 * row] = s;
    sums[2 * row + 1] = local >= 0 && local < Vl ? td_to_f32(x[local]) - mx : 0.0f;
  }
}

template <class T>
__global__ void vp_finish_kernel(float *losses, T *logits, const float *row_max, const float *sums,
                                 const int32_t *targets, float scale, int v0, int Vl) {
  const int row = blockIdx.x;
  T *x = logits + (size_t)row * Vl;
  const float mx = row_max[row], sum = sums[2 * row], inv = 1.0f / sum;
  const int local = targets[row] - v0;
  if (threadIdx.x == 0) losses[row] = logf(sum) - sums[2 * row + 1];
  for (int i = threadIdx.x; i < Vl; i += blockDim.x) {
    float p = expf(td_to_f32(x[i]) - mx) * inv;
    x[i] = td_from_f32<T>(scale * (p - (i == local ? 1.0f : 0.0f)));
  }
}

static td_status vp_shape(const char *fn, int N, int C, int v0, int Vl) {
  if (N < 0 || C < 0 || v0 < 0 || Vl <= 0)
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: shape N=%d C=%d rows [%d, %d + %d)", fn, N, C, v0, v0, Vl);
  return TD_OK;
}

extern "C" td_status td_cuda_vocab_embedding_lookup(void *out, const int32_t *tokens, const void *wte_local, int BT,
                                                    int C, int v0, int Vl, td_dtype dtype, void *stream) {
  TD_CHECK(vp_shape("td_cuda_vocab_embedding_lookup", BT, C, v0, Vl));
  const size_t n = (size_t)BT * C;
  if (n == 0) return TD_OK;
  TD_CUDA_DISPATCH(dtype, "td_cuda_vocab_embedding_lookup", {
    TD_CUDA_LAUNCH(vp_lookup_kernel<td_elem>, td_cuda_blocks(n, 256), 256, 0, stream, (td_elem *)out, tokens,
                   (const td_elem *)wte_local, BT, C, v0, Vl);
  });
  TD_CUDA_LAUNCH_CHECK("vp_lookup_kernel");
  return TD_OK;
}

extern "C" td_status td_cuda_position_add_rows(void *out, const void *wpe, int row0, int rows, int T, int C,
                                               td_dtype dtype, void *stream) {
  if (row0 < 0 || rows < 0 || T <= 0 || C < 0)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_cuda_position_add: rows [%d, %d + %d) of sequences of %d, %d channels",
                    row0, row0, rows, T, C);
  const size_t n = (size_t)rows * C;
  if (n == 0) return TD_OK;
  TD_CUDA_DISPATCH(dtype, "td_cuda_position_add", {
    TD_CUDA_LAUNCH(vp_position_add_kernel<td_elem>, td_cuda_blocks(n, 256), 256, 0, stream, (td_elem *)out,
                   (const td_elem *)wpe, rows, row0, T, C);
  });
  TD_CUDA_LAUNCH_CHECK("vp_position_add_kernel");
  return TD_OK;
}

extern "C" td_status td_cuda_position_add(void *out, const void *wpe, int B, int T, int C, td_dtype dtype,
                                          void *stream) {
  if (B < 0 || T < 0 || C < 0) return td_error(TD_ERR_INVALID_ARGUMENT, "td_cuda_position_add: negative shape");
  if ((size_t)B * T * C == 0) return TD_OK;
  return td_cuda_position_add_rows(out, wpe, 0, B * T, T, C, dtype, stream);
}

extern "C" td_status td_cuda_vocab_embedding_backward(void *dwte_local, const void *dout, const int32_t *tokens,
                                                      int BT, int C, int v0, int Vl, td_dtype dtype, void *stream) {
  TD_CHECK(vp_shape("td_cuda_vocab_embedding_backward", BT, C, v0, Vl));
  if ((size_t)BT * C == 0) return TD_OK;
  TD_CUDA_DISPATCH(dtype, "td_cuda_vocab_embedding_backward", {
    dim3 block(32, 8), grid(td_cuda_blocks((size_t)C, 32), kClasses / 8);
    TD_CUDA_LAUNCH(vp_backward_kernel<td_elem>, grid, block, 0, stream, (td_elem *)dwte_local, (const td_elem *)dout,
                   tokens, BT, C, v0, Vl);
  });
  TD_CUDA_LAUNCH_CHECK("vp_backward_kernel");
  return TD_OK;
}

extern "C" td_status td_cuda_vocab_xent_max(float *row_max, const void *logits, int N, int Vl, td_dtype dtype,
                                            void *stream) {
  TD_CHECK(vp_shape("td_cuda_vocab_xent_max", N, 0, 0, Vl));
  if (N == 0) return TD_OK;
  TD_CUDA_DISPATCH(dtype, "td_cuda_vocab_xent_max", {
    TD_CUDA_LAUNCH(vp_row_max_kernel<td_elem>, N, VP_THREADS, 0, stream, row_max, (const td_elem *)logits, Vl);
  });
  TD_CUDA_LAUNCH_CHECK("vp_row_max_kernel");
  return TD_OK;
}

extern "C" td_status td_cuda_vocab_xent_sums(float *sums, const void *logits, const float *row_max,
                                             const int32_t *targets, int N, int v0, int Vl, td_dtype dtype,
                                             void *stream) {
  TD_CHECK(vp_shape("td_cuda_vocab_xent_sums", N, 0, v0, Vl));
  if (N == 0) return TD_OK;
  TD_CUDA_DISPATCH(dtype, "td_cuda_vocab_xent_sums", {
    TD_CUDA_LAUNCH(vp_row_sums_kernel<td_elem>, N, VP_THREADS, 0, stream, sums, (const td_elem *)logits, row_max,
                   targets, v0, Vl);
  });
  TD_CUDA_LAUNCH_CHECK("vp_row_sums_kernel");
  return TD_OK;
}

extern "C" td_status td_cuda_vocab_xent_finish(float *losses, void *logits, const float *row_max, const float *sums,
                                               const int32_t *targets, float dloss, int N, int v0, int Vl,
                                               td_dtype dtype, void *stream) {
  TD_CHECK(vp_shape("td_cuda_vocab_xent_finish", N, 0, v0, Vl));
  if (N == 0) return TD_OK;
  const float scale = dloss / (float)N;
  TD_CUDA_DISPATCH(dtype, "td_cuda_vocab_xent_finish", {
    TD_CUDA_LAUNCH(vp_finish_kernel<td_elem>, N, VP_THREADS, 0, stream, losses, (td_elem *)logits, row_max, sums,
                   targets, scale, v0, Vl);
  });
  TD_CUDA_LAUNCH_CHECK("vp_finish_kernel");
  return TD_OK;
}
