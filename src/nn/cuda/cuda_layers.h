/* src/nn/cuda: the GPT's layers as CUDA kernels with host launchers, the
 * device twins of include/tandem/nn.h's CPU layers (same argument order and
 * shapes; backward ACCUMULATES with +=; a gradient pointer may be NULL when
 * not wanted). Plain C, so that C code (src/nn/cuda/gpt_cuda.c) calls them.
 *
 * Every pointer is device memory. `dtype` (TD_F32 or TD_BF16) is the type of
 * the activations, parameters and their gradients; arithmetic is f32 inside
 * every kernel, and statistics (layer norm's mean and rstd), attention
 * weights, losses and optimizer state are always f32. `stream` is a
 * cudaStream_t (NULL: the default stream); launches are asynchronous.
 * Returns TD_OK, or TD_ERR_INVALID_ARGUMENT (bad dtype or shape) or
 * TD_ERR_SYSTEM (the launch failed) with "file:line: ..." in td_last_error().
 * Errors of a kernel's execution show at the next synchronizing call.
 * All results are deterministic: Tandem's kernels use no float atomics and
 * reduce in a fixed order that depends on the shapes only; cuBLASLt gives
 * the same bits run to run on the same GPU model and library version (its
 * documented guarantee for one algorithm, and the heuristic picks the same
 * one for the same shapes). */
#ifndef TD_NN_CUDA_LAYERS_H
#define TD_NN_CUDA_LAYERS_H

#include <stddef.h>
#include <stdint.h>

#include "tandem/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:] (td_embedding_forward). Tokens
 * outside [0, V) are not checked here (the model checks them on the host). */
td_status td_cuda_encoder_forward(void *out /* (B, T, C) */, const int32_t *tokens /* (B, T) */,
                                  const void *wte /* (V, C) */, const void *wpe /* (maxT, C) */, int B, int T, int C,
                                  td_dtype dtype, void *stream);
/* The positions of a batch's tokens grouped by token, for
 * td_cuda_encoder_backward (host memory, a stable counting sort): returns
 * the number of buckets n (distinct tokens in [0, V); tokens outside are
 * left out); bucket b is positions order[starts[b] .. starts[b+1]), one
 * token's, in position order. order: BT ints, starts: BT + 1 ints, counts:
 * V ints that are zero on entry and are zero again on return. */
int td_encoder_buckets(const int32_t *tokens /* (BT) */, int BT, int V, int32_t *order, int32_t *starts,
                       int32_t *counts);
/* dwte[tokens[b,t],:] += dout[b,t,:], dwpe[t,:] += sum_b dout[b,t,:].
 * order, starts (device copies of td_encoder_buckets' arrays) and
 * n_buckets say which positions add into which dwte row (needed when dwte
 * is not NULL). Each (row, channel) of dwte is summed by one thread in
 * position order: no atomics, the same bits every run. */
td_status td_cuda_encoder_backward(void *dwte /* (V, C) or NULL */, void *dwpe /* (maxT, C) or NULL */,
                                   const void *dout /* (B, T, C) */, const int32_t *tokens /* (B, T) */,
                                   const int32_t *order /* (B T) */, const int32_t *starts /* (n_buckets + 1) */,
                                   int n_buckets, int B, int T, int C, td_dtype dtype, void *stream);

/* Layer normalisation over the last dimension, eps 1e-5 (td_layernorm_forward). */
td_status td_cuda_layernorm_forward(void *out /* (N, C) */, float *mean /* (N) */, float *rstd /* (N) */,
                                    const void *inp /* (N, C) */, const void *weight /* (C) */,
                                    const void *bias /* (C) */, int N, int C, td_dtype dtype, void *stream);
/* Fused residual + layer norm (llm.c's fused_residual_forward): residual =
 * inp1 + inp2, then out = layernorm(residual). residual may not alias out. */
td_status td_cuda_residual_layernorm_forward(void *residual /* (N, C) */, void *out /* (N, C) */,
                                             float *mean /* (N) */, float *rstd /* (N) */,
                                             const void *inp1 /* (N, C) */, const void *inp2 /* (N, C) */,
                                             const void *weight /* (C) */, const void *bias /* (C) */, int N, int C,
                                             td_dtype dtype, void *stream);
/* td_layernorm_backward: dinp += ..., dweight += ..., dbias += ... (each
 * may be NULL). scratch: td_cuda_layernorm_backward_scratch_floats(N, C)
 * floats of device memory (the blocks' partial dweight/dbias rows, summed in
 * a fixed order: no atomics); not read after the call's kernels finish, so
 * launches on one stream may share it. */
td_status td_cuda_layernorm_backward(void *dinp /* (N, C) */, void *dweight /* (C) */, void *dbias /* (C) */,
                                     float *scratch, const void *dout /* (N, C) */, const void *inp /* (N, C) */,
                                     const void *weight /* (C) */, const float *mean /* (N) */,
                                     const float *rstd /* (N) */, int N, int C, td_dtype dtype, void *stream);
size_t td_cuda_layernorm_backward_scratch_floats(int N, int C);

/* out = a + b elementwise (the residual stream); out may alias a or b. */
td_status td_cuda_residual_forward(void *out /* (n) */, const void *a /* (n) */, const void *b /* (n) */, size_t n,
                                   td_dtype dtype, void *stream);

/* GELU, tanh approximation (td_gelu_forward / td_gelu_backward). */
td_status td_cuda_gelu_forward(void *out /* (n) */, const void *inp /* (n) */, size_t n, td_dtype dtype,
                               void *stream);
td_status td_cuda_gelu_backward(void *dinp /* (n) */, const void *inp /* (n) */, const void *dout /* (n) */,
                                size_t n, td_dtype dtype, void *stream);
/* d = gelu'(inp) * d in place: GELU's backward over an output gradient
 * already in d (td_cuda_matmul_backward_ex's pre_gelu where cuBLASLt has
 * no DGELU algorithm). */
td_status td_cuda_gelu_grad_scale(void *d /* (n) */, const void *inp /* (n) */, size_t n, td_dtype dtype,
                                  void *stream);

/* out = inp @ weight^T + bias (td_linear_forward); bias may be NULL. Through
 * cuBLASLt on a GPU build; Tandem's tiled kernel under the emulator or with
 * TANDEM_CUDA_MATMUL=kernel. f32 products accumulate in f32; bf16 products
 * read bf16 operands and accumulate in f32. */
td_status td_cuda_matmul_forward(void *out /* (N, OC) */, const void *inp /* (N, IC) */,
                                 const void *weight /* (OC, IC) */, const void *bias /* (OC) or NULL */, int N,
                                 int IC, int OC, td_dtype dtype, void *stream);
/* The forward with the fusions the GPT uses (src/nn's nn_linear_forward16):
 *  - pre_gelu != NULL: pre_gelu = inp @ weight^T + bias, out = gelu(pre_gelu)
 *    (the MLP's first product; cuBLASLt's GELU epilogue, the tanh form);
 *  - residual != NULL: out = residual + inp @ weight^T + bias (the
 *    projections back into the residual stream; residual may be out).
 * Not both at once (TD_ERR_INVALID_ARGUMENT). */
td_status td_cuda_matmul_forward_ex(void *out /* (N, OC) */, void *pre_gelu /* (N, OC) or NULL */,
                                    const void *residual /* (N, OC) or NULL */, const void *inp /* (N, IC) */,
                                    const void *weight /* (OC, IC) */, const void *bias /* (OC) or NULL */, int N,
                                    int IC, int OC, td_dtype dtype, void *stream);
/* td_linear_backward: dinp += dout @ weight, dweight += dout^T @ inp,
 * dbias += column sums of dout (each NULL: skipped). */
td_status td_cuda_matmul_backward(void *dinp /* (N, IC) or NULL */, void *dweight /* (OC, IC) or NULL */,
                                  void *dbias /* (OC) or NULL */, const void *dout /* (N, OC) */,
                                  const void *inp /* (N, IC) */, const void *weight /* (OC, IC) */, int N, int IC,
                                  int OC, td_dtype dtype, void *stream);
/* The backward with the GPT's options:
 *  - flags TD_CUDA_DINP_OVERWRITE: dinp = dout @ weight, written without
 *    being read (cuBLASLt's beta 0), so a scratch input gradient needs no
 *    zeroing first (dweight and dbias still accumulate);
 *  - pre_gelu != NULL (needs dinp and TD_CUDA_DINP_OVERWRITE): the product
 *    is GELU's output gradient and pre_gelu GELU's input (the forward's
 *    td_cuda_matmul_forward_ex pre_gelu): dinp = gelu'(pre_gelu) * (dout @
 *    weight), td_cuda_gelu_backward folded into the product (cuBLASLt's
 *    DGELU epilogue; the tiled kernel's epilogue does the same), one
 *    rounding of the f32 value where the two launches rounded twice. Where
 *    cuBLASLt offers no DGELU algorithm for the shape: its plain product,
 *    then td_cuda_gelu_grad_scale (two roundings; not counted in
 *    td_cuda_matmul_fallbacks, which counts products taking the tiled kernel);
 *  - dbias_gelu != NULL (needs pre_gelu): dbias_gelu += the column sums of
 *    that dinp, the bias gradient of the product whose output pre_gelu
 *    was (the GPT's fc; its own backward then takes dbias NULL). Through
 *    cuBLASLt's DGELU_BGRAD epilogue; without an algorithm for it, DGELU and
 *    the column-sum kernel;
 *  - dbias (through cuBLASLt: the weight-gradient product's BGRADB epilogue
 *    when dweight is asked too; else the column-sum kernel) and dbias_gelu
 *    accumulate, as every gradient here: the epilogue writes a scratch
 *    vector that a small kernel adds in (bf16: two roundings);
 *  - flags TD_CUDA_DBIAS_COLUMN_SUM: no bias gradient epilogue, the
 *    column-sum kernel for both (the A/B of bench/cuda_kernels.sh).
 * Other flags, or pre_gelu / dbias_gelu without what they need:
 * TD_ERR_INVALID_ARGUMENT. */
enum {
  TD_CUDA_DINP_OVERWRITE = 1,
  TD_CUDA_DBIAS_COLUMN_SUM = 2,
  TD_CUDA_ATTENTION_ONEPASS = 4,
  TD_CUDA_ATTENTION_DIRECT_STORE = 8
};
td_status td_cuda_matmul_backward_ex(void *dinp /* (N, IC) or NULL */, void *dweight /* (OC, IC) or NULL */,
                                     void *dbias /* (OC) or NULL */, const void *dout /* (N, OC) */,
                                     const void *inp /* (N, IC) */, const void *weight /* (OC, IC) */,
                                     const void *pre_gelu /* (N, IC) or NULL */, void *dbias_gelu /* (IC) or NULL */,
                                     int flags, int N, int IC, int OC, td_dtype dtype, void *stream);
/* "cublaslt" or "kernel": which path td_cuda_matmul_* take in this process. */
const char *td_cuda_matmul_backend(void);
/* Products that took the tiled kernel although cuBLASLt was chosen, because
 * its heuristic offered no algorithm (this process, all threads). */
long td_cuda_matmul_fallbacks(void);
/* Bias gradients that came out of cuBLASLt's epilogues (BGRADB, DGELU_BGRAD)
 * rather than the column-sum kernel (this process, all threads). */
long td_cuda_matmul_bgrad_epilogues(void);

/* Causal multi-head self-attention core (td_attention_forward): inp holds
 * q, k, v side by side (B, T, 3C); att caches the softmax weights (zero
 * above the diagonal), f32. The unfused, correct path: scores and causal
 * softmax in one kernel, then the weighted sum of v. */
td_status td_cuda_attention_forward(void *out /* (B, T, C) */, float *att /* (B, NH, T, T) */,
                                    const void *inp /* (B, T, 3C) */, int B, int T, int C, int NH, td_dtype dtype,
                                    void *stream);
/* dinp += d(q, k, v). scratch holds the gradient of the pre-softmax scores
 * (f32, (B, NH, T, T): the CPU layer needs only (T, T), the device computes
 * every head at once). */
td_status td_cuda_attention_backward(void *dinp /* (B, T, 3C) */, float *scratch /* (B, NH, T, T) */,
                                     const void *dout /* (B, T, C) */, const void *inp /* (B, T, 3C) */,
                                     const float *att /* (B, NH, T, T) */, int B, int T, int C, int NH,
                                     td_dtype dtype, void *stream);

/* Fused (flash-style) attention, the same contract as the pair above
 * without the (B, NH, T, T) caches: forward keeps lse, the log-sum-exp of
 * each query row's scaled scores (f32, (B, NH, T)); backward reads the
 * forward's out and lse and needs a scratch of
 * td_cuda_flash_attention_backward_scratch_floats(B, T, C, NH, flags)
 * floats. Head sizes (C / NH) 8, 16, 24, 32, 48, 64, 128; others
 * TD_ERR_INVALID_ARGUMENT. Deterministic (no float atomics: fixed orders of
 * addition). bf16 at head sizes 16, 32, 48, 64, 128 with 16-byte aligned
 * rows runs FlashAttention-2's kernels (flash_attention_mma.cu), everything
 * else the CUDA-core ones. The launchers read no environment. */
td_status td_cuda_flash_attention_forward(void *out /* (B, T, C) */, float *lse /* (B, NH, T) */,
                                          const void *inp /* (B, T, 3C) */, int B, int T, int C, int NH,
                                          td_dtype dtype, void *stream);
/* The forward with flags: TD_CUDA_ATTENTION_DIRECT_STORE stores the
 * FlashAttention-2 kernel's output from its registers, 4 bytes a lane (the
 * kernel before its output went through shared memory in 16-byte rows:
 * the A/B of scripts/gpu-check); other kernels ignore it. Other flags
 * TD_ERR_INVALID_ARGUMENT. */
td_status td_cuda_flash_attention_forward_ex(void *out /* (B, T, C) */, float *lse /* (B, NH, T) */,
                                             const void *inp /* (B, T, 3C) */, int B, int T, int C, int NH,
                                             td_dtype dtype, int flags, void *stream);
td_status td_cuda_flash_attention_backward(void *dinp /* (B, T, 3C) */, float *scratch /* see above */,
                                           const void *dout /* (B, T, C) */, const void *inp /* (B, T, 3C) */,
                                           const void *out /* (B, T, C) */, const float *lse /* (B, NH, T) */, int B,
                                           int T, int C, int NH, td_dtype dtype, void *stream);
/* The backward with flags:
 *  - TD_CUDA_DINP_OVERWRITE (above): dinp = the gradient, not read first
 *    (the FlashAttention-2 kernels write it; the others zero it, then add);
 *  - TD_CUDA_ATTENTION_ONEPASS: FlashAttention-2's backward in one pass
 *    (each key block's part of each dQ tile stored, then summed in order;
 *    the A/B beside the default two passes) where those kernels run (head
 *    sizes 16 to 64: at 128 the two passes run); the scratch must have been
 *    sized with this flag too.
 * Other flags TD_ERR_INVALID_ARGUMENT. */
td_status td_cuda_flash_attention_backward_ex(void *dinp /* (B, T, 3C) */, float *scratch, const void *dout,
                                              const void *inp, const void *out, const float *lse, int B, int T, int C,
                                              int NH, td_dtype dtype, int flags, void *stream);
/* Floats of td_cuda_flash_attention_backward's scratch for a backward run
 * with these flags: D (B, NH, T), and with TD_CUDA_ATTENTION_ONEPASS the
 * one-pass backward's dQ parts (~430 MB at GPT-2 124M's shape); 0 for an
 * empty shape. Other flags do not change it. */
size_t td_cuda_flash_attention_backward_scratch_floats(int B, int T, int C, int NH, int flags);
/* Which attention path a model with this head size should take:
 * *fused_out = 1 for the fused kernels, 0 for the unfused pair. The fused
 * path unless TANDEM_CUDA_ATTENTION=unfused or the head size is not one the
 * fused kernels take; TANDEM_CUDA_ATTENTION=fused (or onepass) with such a
 * head size, or any other value, is TD_ERR_INVALID_ARGUMENT with the reason.
 * Reads the environment on every call (call it when the model is created). */
td_status td_cuda_attention_fused(int head_size, int *fused_out);
/* The flags a model passes to td_cuda_flash_attention_backward_ex and its
 * scratch size: TD_CUDA_ATTENTION_ONEPASS when TANDEM_CUDA_ATTENTION=onepass,
 * else 0; a value td_cuda_attention_fused refuses is refused here too.
 * Reads the environment on every call (call it when the model is created). */
td_status td_cuda_attention_backward_flags(int *flags_out);
/* The flags a model passes to td_cuda_flash_attention_forward_ex:
 * TD_CUDA_ATTENTION_DIRECT_STORE when TANDEM_CUDA_ATTENTION_STORE=direct,
 * 0 when it is unset, empty or staged; any other value
 * TD_ERR_INVALID_ARGUMENT with the reason. Reads the environment on every
 * call (call it when the model is created). */
td_status td_cuda_attention_forward_flags(int *flags_out);

/* Softmax cross-entropy fused with its backward, in place (llm.c's
 * fused_classifier): losses[n] = -log softmax(logits[n])[targets[n]] (f32),
 * then logits[n] is OVERWRITTEN with dloss * (softmax - onehot) / N, the
 * gradient td_softmax_xent_backward would add to zeroed dlogits; the
 * probabilities are never stored. A target outside [0, V) gives a NaN loss
 * and a zero gradient row. */
td_status td_cuda_softmax_xent(float *losses /* (N) */, void *logits /* (N, V): in logits, out dlogits */,
                               const int32_t *targets /* (N) */, float dloss, int N, int V, td_dtype dtype,
                               void *stream);

/* Vocabulary-parallel embedding and cross-entropy (vocab_parallel.cu): a
 * tensor rank holds vocabulary rows [v0, v0 + Vl) of wte (Vl >= 1); the
 * caller runs the tensor group's collectives between the steps.
 * Embedding: lookup (out = the token's local row, zeros for a token outside
 * [v0, v0 + Vl)), allreduce SUM of out, then td_cuda_position_add
 * (out[b,t,:] += wpe[t,:]). Backward: td_cuda_vocab_embedding_backward adds
 * dout's rows into the local rows of the tokens in range (deterministic,
 * as td_cuda_encoder_backward; dwpe through td_cuda_encoder_backward with
 * dwte NULL). */
td_status td_cuda_vocab_embedding_lookup(void *out /* (BT, C) */, const int32_t *tokens /* (BT) */,
                                         const void *wte_local /* (Vl, C) */, int BT, int C, int v0, int Vl,
                                         td_dtype dtype, void *stream);
td_status td_cuda_position_add(void *out /* (B, T, C) */, const void *wpe /* (maxT, C) */, int B, int T, int C,
                               td_dtype dtype, void *stream);
/* The same for rows [row0, row0 + rows) of the (B, T) positions, in out's
 * rows 0 .. rows - 1 (a sequence-parallel rank's piece: position (row0 + i) mod T). */
td_status td_cuda_position_add_rows(void *out /* (rows, C) */, const void *wpe /* (maxT, C) */, int row0, int rows,
                                    int T, int C, td_dtype dtype, void *stream);
td_status td_cuda_vocab_embedding_backward(void *dwte_local /* (Vl, C) */, const void *dout /* (BT, C) */,
                                           const int32_t *tokens /* (BT) */, int BT, int C, int v0, int Vl,
                                           td_dtype dtype, void *stream);
/* The parallel cross-entropy over logits (N, Vl) of columns [v0, v0 + Vl):
 *   td_cuda_vocab_xent_max: row_max[n] = this rank's row maximum; then the
 *     caller's allreduce MAX of row_max (N f32);
 *   td_cuda_vocab_xent_sums: sums[2n] = sum of exp(x - row_max[n]) over the
 *     local columns, sums[2n+1] = x[target] - row_max[n] where this rank
 *     holds the target, else 0; then the caller's allreduce SUM of sums
 *     (2N f32);
 *   td_cuda_vocab_xent_finish: losses[n] = log(sums[2n]) - sums[2n+1], and
 *     the logits OVERWRITTEN with dloss * (softmax - onehot) / N on the
 *     local columns (as td_cuda_softmax_xent). Targets must lie in [0, V)
 *     (the model checks them on the host). */
td_status td_cuda_vocab_xent_max(float *row_max /* (N) */, const void *logits /* (N, Vl) */, int N, int Vl,
                                 td_dtype dtype, void *stream);
td_status td_cuda_vocab_xent_sums(float *sums /* (N, 2) */, const void *logits /* (N, Vl) */,
                                  const float *row_max /* (N) */, const int32_t *targets /* (N) */, int N, int v0,
                                  int Vl, td_dtype dtype, void *stream);
td_status td_cuda_vocab_xent_finish(float *losses /* (N) */, void *logits /* (N, Vl): in logits, out dlogits */,
                                    const float *row_max /* (N) */, const float *sums /* (N, 2) */,
                                    const int32_t *targets /* (N) */, float dloss, int N, int v0, int Vl,
                                    td_dtype dtype, void *stream);

#ifdef __cplusplus
}
#endif
#endif
