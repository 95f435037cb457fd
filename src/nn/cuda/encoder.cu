/* Token + position embedding on the device (llm.c's llmc/encoder.cuh), the
 * twin of td_embedding_forward/backward.
 * Backward without atomics: dwte's rows are split into S = 32 classes by
 * token mod S; thread (class s, channel c) walks every position in order and
 * adds the positions whose token is in its class. So each dwte element is
 * summed by one thread in position order: the same bits every run, and no
 * sort of the tokens. Each thread reads all B*T tokens (4 bytes each,
 * broadcast within a warp), which is small beside the B*T*C gradient. */
#include "cuda_common.cuh"
#include "cuda_layers.h"

static const int kClasses = 32;

template <class T>
__global__ void encoder_forward_kernel(T *out, const int32_t *tokens, const T *wte, const T *wpe, int BT, int T_,
                                       int C) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)BT * C) return;
  int c = (int)(i % C), bt = (int)(i / C), t = bt % T_;
  out[i] = td_from_f32<T>(td_to_f32(wte[(size_t)tokens[bt] * C + c]) + td_to_f32(wpe[(size_t)t * C + c]));
}

template <class T>
__global__ void encoder_backward_wte_kernel(T *dwte, const T *dout, const int32_t *tokens, int BT, int C, int V) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  int cls = blockIdx.y * blockDim.y + threadIdx.y;
  if (c >= C || cls >= kClasses) return;
  for (int i = 0; i < BT; i++) {
    int tok = tokens[i];
    if (tok < 0 || tok >= V || tok % kClasses != cls) continue;
    T *d = dwte + (size_t)tok * C + c;
    *d = td_from_f32<T>(td_to_f32(*d) + td_to_f32(dout[(size_t)i * C + c]));
  }
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

extern "C" td_status td_cuda_encoder_backward(void *dwte, void *dwpe, const void *dout, const int32_t *tokens, int B,
                                              int T, int C, int V, td_dtype dtype, void *stream) {
  if (B < 0 || T < 0 || C < 0 || V < 0)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_cuda_encoder_backward: negative shape");
  if ((size_t)B * T * C == 0) return TD_OK;
  TD_CUDA_DISPATCH(dtype, "td_cuda_encoder_backward", {
    if (dwte) {
      dim3 block(32, 8), grid(td_cuda_blocks((size_t)C, 32), kClasses / 8);
      TD_CUDA_LAUNCH(encoder_backward_wte_kernel<td_elem>, grid, block, 0, stream, (td_elem *)dwte, (const td_elem *)dout, tokens,
                     B * T, C, V);
      TD_CUDA_LAUNCH_CHECK("encoder_backward_wte_kernel");
    }
    if (dwpe) {
      TD_CUDA_LAUNCH(encoder_backward_wpe_kernel<td_elem>, td_cuda_blocks((size_t)T * C, 256), 256, 0, stream, (td_elem *)dwpe,
                     (const td_elem *)dout, B, T, C);
      TD_CUDA_LAUNCH_CHECK("encoder_backward_wpe_kernel");
    }
  });
  return TD_OK;
}
