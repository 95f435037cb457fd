/* Layers that also write a bf16 copy of their output for the bf16 products
 * that read it next (mixed precision, td_nn_set_compute_dtype(TD_BF16)):
 * the GPT's layer norm outputs (read by the qkv and fc products), its
 * attention output (read by proj) and its GELU output (read by fc2), each
 * read twice per step: as op(A) of the forward product and as op(B) of the
 * weight gradient's. Packing them from f32 converted every element on each
 * read (~5% of a bf16 step); from the copy, the packs move half the bytes
 * and convert nothing.
 *
 * The copy is written where the output is still in cache: per row (layer
 * norm), per sequence (attention), in the product's tile store (GELU). Its
 * values are those the packs would have rounded the f32 output to (same
 * rounding, same instruction at each level), so the products, and the
 * training, come out bit-identical with or without the copies; the f32
 * output stays (the fallbacks and the f32 consumers read it). Every
 * function takes NULL for a copy it should not use or write, and then is
 * the f32 layer it wraps. Compiled once per CPU level (nn_kernels.h). */
#include "nn_kernels.h" /* first: names this level's functions (compiled once per CPU level) */

void nn_layernorm_forward16(float *out, uint16_t *out16, float *mean, float *rstd, const float *inp,
                            const float *weight, const float *bias, int N, int C) {
  if (!out16) {
    td_layernorm_forward(out, mean, rstd, inp, weight, bias, N, C);
    return;
  }
  /* row by row: each row's copy is made while it is in L1 */
  for (int n = 0; n < N; n++) {
    size_t o = (size_t)n * C;
    td_layernorm_forward(out + o, mean + n, rstd + n, inp + o, weight, bias, 1, C);
    nn_to_bf16(out16 + o, out + o, (size_t)C);
  }
}

/* At the bf16 compute type the attention's products are bf16 too
 * (attention_bf16.c) where that kernel applies, else f32. */
static void attention_forward_any(float *out, float *att, const float *inp, int B, int T, int C, int NH) {
  if (td_nn_compute_dtype() == TD_BF16 && nn_attention_forward_bf16(out, att, inp, B, T, C, NH)) return;
  td_attention_forward(out, att, inp, B, T, C, NH);
}

void nn_attention_forward16(float *out, uint16_t *out16, float *att, const float *inp, int B, int T, int C, int NH) {
  if (!out16) {
    attention_forward_any(out, att, inp, B, T, C, NH);
    return;
  }
  /* sequence by sequence (T x C floats, in L2 at the GPT's sizes) */
  for (int b = 0; b < B; b++) {
    size_t o = (size_t)b * T * C;
    attention_forward_any(out + o, att + (size_t)b * NH * T * T, inp + (size_t)b * T * 3 * C, 1, T, C, NH);
    nn_to_bf16(out16 + o, out + o, (size_t)T * C);
  }
}

void nn_attention_backward16(float *dinp, float *scratch, const float *dout, const float *inp, const float *att, int B,
                             int T, int C, int NH) {
  if (td_nn_compute_dtype() == TD_BF16 && nn_attention_backward_bf16(dinp, 0.0f, dout, inp, att, B, T, C, NH)) return;
  nn_attention_backward_set(dinp, scratch, dout, inp, att, B, T, C, NH);
}

void nn_linear_forward16(float *out, uint16_t *out16, float *dgelu, const float *resid, const float *inp,
                         const uint16_t *inp16, const float *weight, const float *bias, int N, int IC, int OC) {
  /* the bf16 product reads inp16 for inp and writes out16 in its store */
  if (td_nn_compute_dtype() == TD_BF16 &&
      nn_gemm_lowp_x(TD_BF16, 0, 1, N, OC, IC, inp, inp16, IC, weight, NULL, IC, resid, OC, bias, out, OC, out16,
                     dgelu ? NN_GEMM_GELU : NN_GEMM_PLAIN, dgelu, NULL))
    return;
  if (dgelu)
    nn_linear_gelu_forward(out, dgelu, inp, weight, bias, N, IC, OC);
  else if (resid)
    nn_linear_residual_forward(out, resid, inp, weight, bias, N, IC, OC);
  else
    td_linear_forward(out, inp, weight, bias, N, IC, OC);
  if (out16) nn_to_bf16(out16, out, (size_t)N * OC);
}

void nn_linear_backward16(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                          const uint16_t *inp16, const float *weight, const float *dgelu, int N, int IC, int OC) {
  if (!inp16 || td_nn_compute_dtype() != TD_BF16) {
    if (dgelu)
      nn_linear_backward_set_gelu(dinp, dweight, dbias, dout, inp, weight, dgelu, N, IC, OC);
    else
      nn_linear_backward_set(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
    return;
  }
  /* dinp as nn_linear_backward_set does it; then the weight gradient, op(B)
   * = inp packed from its copy (the bias gradient summed while dout is
   * packed), as linear_backward in layers.c orders them */
  if (dinp) {
    if (dgelu)
      nn_linear_backward_set_gelu(dinp, NULL, NULL, dout, inp, weight, dgelu, N, IC, OC);
    else
      nn_linear_backward_set(dinp, NULL, NULL, dout, inp, weight, N, IC, OC);
  }
  if (dweight && nn_gemm_lowp_x(TD_BF16, 1, 0, OC, IC, N, dout, NULL, OC, inp, inp16, IC, dweight, IC, NULL, dweight,
                                IC, NULL, NN_GEMM_PLAIN, NULL, dbias))
    return;
  if (dweight || dbias) nn_linear_backward_set(NULL, dweight, dbias, dout, inp, weight, N, IC, OC);
}
