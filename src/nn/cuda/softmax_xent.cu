/* Softmax cross-entropy fused with its backward, in place (llm.c's
 * llmc/fused_classifier.cuh), the twin of td_softmax_xent_forward followed
 * by td_softmax_xent_backward into zeroed dlogits. One block per row:
 * the row's max and sum of exp(x - max) by block reductions, the loss
 * log(sum) + max - x[target] (exact even where the probability underflows),
 * then each thread overwrites the logits it owns with dloss/N (p - onehot).
 * Probabilities are never stored: (N, V) is read twice and written once. */
#include "cuda_common.cuh"
#include "cuda_layers.h"

#define XENT_THREADS 256

template <class T>
__global__ void softmax_xent_kernel(float *losses, T *logits, const int32_t *targets, float scale, int V) {
  int row = blockIdx.x;
  T *x = logits + (size_t)row * V;
  int target = targets[row];
  bool valid = target >= 0 && target < V;
  float x_target = valid ? td_to_f32(x[target]) : 0.0f; /* read before anything is overwritten */
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, td_to_f32(x[i]));
  mx = td_block_reduce(mx, true);
  float sum = 0.0f;
  for (int i = threadIdx.x; i < V; i += blockDim.x) sum += expf(td_to_f32(x[i]) - mx);
  sum = td_block_reduce(sum, false);
  float inv = 1.0f / sum;
  if (threadIdx.x == 0) losses[row] = valid ? logf(sum) + mx - x_target : NAN;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    float p = expf(td_to_f32(x[i]) - mx) * inv;
    x[i] = td_from_f32<T>(valid ? scale * (p - (i == target ? 1.0f : 0.0f)) : 0.0f);
  }
}

extern "C" td_status td_cuda_softmax_xent(float *losses, void *logits, const int32_t *targets, float dloss, int N,
                                          int V, td_dtype dtype, void *stream) {
  if (N < 0 || V <= 0) return td_error(TD_ERR_INVALID_ARGUMENT, "td_cuda_softmax_xent: shape N=%d V=%d", N, V);
  if (N == 0) return TD_OK;
  float scale = dloss / (float)N;
  TD_CUDA_DISPATCH(dtype, "td_cuda_softmax_xent", {
    TD_CUDA_LAUNCH(softmax_xent_kernel<td_elem>, N, XENT_THREADS, 0, stream, losses, (td_elem *)logits, targets, scale, V);
  });
  TD_CUDA_LAUNCH_CHECK("softmax_xent_kernel");
  return TD_OK;
}
