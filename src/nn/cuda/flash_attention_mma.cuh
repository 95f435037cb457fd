/* The FlashAttention-2-style bf16 kernels on mma.sync (flash_attention_mma.cu),
 * for flash_attention.cu, which chooses between them and its own kernels.
 * Shapes and contracts are td_cuda_flash_attention_forward/backward's
 * (cuda_layers.h); the caller has checked the shape. */
#ifndef TD_NN_CUDA_FLASH_ATTENTION_MMA_CUH
#define TD_NN_CUDA_FLASH_ATTENTION_MMA_CUH

#include "tandem/base.h"

/* These kernels take the call: head size 16, 32, 48 or 64, C a multiple of
 * 8 and the three tensors 16-byte aligned (their rows are read 16 bytes at
 * a time). */
extern "C" bool td_fa2_supported(int head_size, int C, const void *p1, const void *p2, const void *p3);
extern "C" td_status td_fa2_forward(void *out, float *lse, const void *inp, int B, int T, int C, int NH, void *stream);
/* D: (B, NH, T) rowsum(dO * O), already computed. One pass with ordered
 * dQ sums in dq_acc ((B, NH, T, C / NH) f32, nothing to initialize) and
 * turns ((B, NH, ceil(T / 64)) ints, zeroed here), or with twopass the
 * earlier kernels (dK, dV, then dQ with S and dP recomputed; dq_acc and
 * turns unused). */
extern "C" td_status td_fa2_backward(void *dinp, const float *D, float *dq_acc, int *turns, const void *dout,
                                     const void *inp, const float *lse, int B, int T, int C, int NH, bool twopass,
                                     void *stream);

#endif
