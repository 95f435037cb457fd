/* The src/nn kernels compiled once per CPU level (Makefile KERNEL_SRCS:
 * matmul.c and layers.c), and the table that picks one level's set.
 *
 * Each kernel file is built three times, with -DTD_LEVEL=generic, avx2 or
 * avx512 and that level's -m flags. This header, included first by those
 * files, renames every function they define to name_<level> (the #defines
 * below also rename the declarations in tandem/nn.h and nn_internal.h and
 * every call between kernels, so that a kernel calls kernels of its own
 * level). kernels.c, compiled once for the baseline, defines the public
 * names: each forwards through the table of the level td_cpu_active()
 * chose. A function added to a kernel file must be added to both lists
 * below and get a forwarder in kernels.c; tests/base/check_levels.sh fails
 * the build tree when a level object defines an unrenamed global. */
#ifndef TD_NN_KERNELS_H
#define TD_NN_KERNELS_H

#ifdef TD_LEVEL
#define NN_LEVEL_CAT2(a, b) a##_##b
#define NN_LEVEL_CAT(a, b) NN_LEVEL_CAT2(a, b)
#define NN_LEVEL_NAME(name) NN_LEVEL_CAT(name, TD_LEVEL)
/* matmul.c */
#define td_sgemm NN_LEVEL_NAME(td_sgemm)
#define nn_sgemm_portable NN_LEVEL_NAME(nn_sgemm_portable)
#define nn_gemm NN_LEVEL_NAME(nn_gemm)
#define nn_gemm_ep NN_LEVEL_NAME(nn_gemm_ep)
#define nn_gemm_tn NN_LEVEL_NAME(nn_gemm_tn)
#define nn_gelu_forward_cache NN_LEVEL_NAME(nn_gelu_forward_cache)
#define nn_gelu_backward_cached NN_LEVEL_NAME(nn_gelu_backward_cached)
/* matmul_bf16.c */
#define nn_gemm_lowp NN_LEVEL_NAME(nn_gemm_lowp)
#define nn_gemm_lowp_ep NN_LEVEL_NAME(nn_gemm_lowp_ep)
#define nn_gemm_lowp_x NN_LEVEL_NAME(nn_gemm_lowp_x)
#define nn_to_bf16 NN_LEVEL_NAME(nn_to_bf16)
/* layers_bf16.c */
#define nn_layernorm_forward16 NN_LEVEL_NAME(nn_layernorm_forward16)
#define nn_attention_forward16 NN_LEVEL_NAME(nn_attention_forward16)
#define nn_linear_forward16 NN_LEVEL_NAME(nn_linear_forward16)
#define nn_linear_backward16 NN_LEVEL_NAME(nn_linear_backward16)
#define nn_attention_backward16 NN_LEVEL_NAME(nn_attention_backward16)
/* attention_bf16.c */
#define nn_attention_forward_bf16 NN_LEVEL_NAME(nn_attention_forward_bf16)
#define nn_attention_backward_bf16 NN_LEVEL_NAME(nn_attention_backward_bf16)
/* layers.c */
#define td_linear_forward NN_LEVEL_NAME(td_linear_forward)
#define nn_linear_residual_forward NN_LEVEL_NAME(nn_linear_residual_forward)
#define nn_linear_gelu_forward NN_LEVEL_NAME(nn_linear_gelu_forward)
#define td_linear_backward NN_LEVEL_NAME(td_linear_backward)
#define nn_linear_backward_set NN_LEVEL_NAME(nn_linear_backward_set)
#define nn_linear_backward_set_gelu NN_LEVEL_NAME(nn_linear_backward_set_gelu)
#define td_embedding_forward NN_LEVEL_NAME(td_embedding_forward)
#define td_embedding_backward NN_LEVEL_NAME(td_embedding_backward)
#define td_layernorm_forward NN_LEVEL_NAME(td_layernorm_forward)
#define td_layernorm_backward NN_LEVEL_NAME(td_layernorm_backward)
#define td_gelu_forward NN_LEVEL_NAME(td_gelu_forward)
#define td_gelu_backward NN_LEVEL_NAME(td_gelu_backward)
#define nn_gelu_backward_set NN_LEVEL_NAME(nn_gelu_backward_set)
#define nn_exp_shift_sum NN_LEVEL_NAME(nn_exp_shift_sum)
#define td_relu_forward NN_LEVEL_NAME(td_relu_forward)
#define td_relu_backward NN_LEVEL_NAME(td_relu_backward)
#define nn_attention_forward_blas NN_LEVEL_NAME(nn_attention_forward_blas)
#define nn_attention_backward_blas NN_LEVEL_NAME(nn_attention_backward_blas)
#define td_attention_forward NN_LEVEL_NAME(td_attention_forward)
#define td_attention_backward NN_LEVEL_NAME(td_attention_backward)
#define nn_attention_backward_set NN_LEVEL_NAME(nn_attention_backward_set)
#define td_conv2d_forward NN_LEVEL_NAME(td_conv2d_forward)
#define td_conv2d_backward NN_LEVEL_NAME(td_conv2d_backward)
#define td_maxpool2_forward NN_LEVEL_NAME(td_maxpool2_forward)
#define td_maxpool2_backward NN_LEVEL_NAME(td_maxpool2_backward)
#define td_softmax_xent_forward NN_LEVEL_NAME(td_softmax_xent_forward)
#define td_softmax_xent_backward NN_LEVEL_NAME(td_softmax_xent_backward)
#define nn_softmax_xent_backward_set NN_LEVEL_NAME(nn_softmax_xent_backward_set)
#endif

#include "nn_internal.h"

/* The same names, for the table: field k_<name> (## keeps the name from
 * being renamed, so that the struct is the same in every translation
 * unit), of the type of the function (the level's, which is the same). */
#define NN_KERNEL_LIST(X)                                                                                            \
  X(td_sgemm) X(nn_sgemm_portable) X(nn_gemm) X(nn_gemm_ep) X(nn_gemm_tn) X(nn_gemm_lowp) X(nn_gemm_lowp_ep) X(nn_gemm_lowp_x) X(nn_to_bf16) X(nn_layernorm_forward16) X(nn_attention_forward16) X(nn_linear_forward16) X(nn_linear_backward16) X(nn_attention_backward16) X(nn_attention_forward_bf16) X(nn_attention_backward_bf16) X(td_linear_forward)                     \
  X(nn_linear_residual_forward) X(nn_linear_gelu_forward) X(td_linear_backward) X(nn_linear_backward_set)          \
  X(nn_linear_backward_set_gelu) X(td_embedding_forward) X(td_embedding_backward) X(td_layernorm_forward)          \
  X(td_layernorm_backward) X(td_gelu_forward) X(nn_gelu_forward_cache) X(nn_gelu_backward_cached)                  \
  X(td_gelu_backward) X(nn_gelu_backward_set) X(nn_exp_shift_sum) X(td_relu_forward) X(td_relu_backward)           \
  X(nn_attention_forward_blas) X(nn_attention_backward_blas) X(td_attention_forward) X(td_attention_backward)      \
  X(nn_attention_backward_set) X(td_conv2d_forward) X(td_conv2d_backward) X(td_maxpool2_forward)                   \
  X(td_maxpool2_backward) X(td_softmax_xent_forward) X(td_softmax_xent_backward) X(nn_softmax_xent_backward_set)

#define NN_KERNEL_FIELD(name) __typeof__(name) *k_##name;
typedef struct nn_kernels {
  NN_KERNEL_LIST(NN_KERNEL_FIELD)
} nn_kernels;
#undef NN_KERNEL_FIELD

/* One table per level, defined by kernels_level.c compiled at that level. */
extern const nn_kernels nn_kernels_generic, nn_kernels_avx2, nn_kernels_avx512, nn_kernels_avx512bf16;

/* The table of a level (any level, whatever the CPU supports: calling an
 * avx512 kernel on a CPU without AVX-512 faults), for the tests that compare
 * levels within one process. */
const nn_kernels *nn_kernels_for(td_cpu_level level);
/* Make every public kernel name forward to `level` from now on (refused
 * above td_cpu_supported()). For the tests that run a whole model at each
 * level in one process; not thread-safe against running kernels. */
td_status nn_kernels_use(td_cpu_level level);

#endif
