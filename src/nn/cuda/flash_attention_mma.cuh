/* The FlashAttention-2-style bf16 kernels on mma.sync (flash_attention_mma.cu),
 * for flash_attention.cu, which chooses between them and its own kernels.
 * Shapes and contracts are td_cuda_flash_attention_forward/backward's
 * (cuda_layers.h); the caller has checked the shape. */
#ifndef TD_NN_CUDA_FLASH_ATTENTION_MMA_CUH
#define TD_NN_CUDA_FLASH_ATTENTION_MMA_CUH

#include "tandem/base.h"

/* These kernels take the call: head size 16, 32, 48, 64 or 128, C a
 * multiple of 8 and the three tensors 16-byte aligned (their rows are read
 * 16 bytes at a time). */
extern "C" bool td_fa2_supported(int head_size, int C, const void *p1, const void *p2, const void *p3);
/* direct_store: the output stored from the registers, 4 bytes a lane (the
 * A/B of TD_CUDA_ATTENTION_DIRECT_STORE); else through shared memory in
 * 16-byte rows. */
extern "C" td_status td_fa2_forward(void *out, float *lse, const void *inp, int B, int T, int C, int NH,
                                    bool direct_store, void *stream);
/* D: (B, NH, T) rowsum(dO * O), already computed. Two passes (dK and dV,
 * then dQ with S and dP recomputed), or with onepass one pass that stores
 * each key block's part of each dQ tile in dq_parts
 * (td_fa2_dq_parts_floats(B, T, C, NH) f32, nothing to initialize) and
 * sums them in a fixed order after it (at head size 128 the two passes
 * run: onepass is ignored, dq_parts unused). add: dinp += the gradient, else
 * dinp = it (dinp is not read). */
extern "C" size_t td_fa2_dq_parts_floats(int B, int T, int C, int NH);
extern "C" td_status td_fa2_backward(void *dinp, const float *D, float *dq_parts, const void *dout, const void *inp,
                                     const float *lse, int B, int T, int C, int NH, bool onepass, bool add,
                                     void *stream);

#endif
