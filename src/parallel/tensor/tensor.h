/* Tensor parallelism's layers (Megatron-LM's scheme), internal to
 * src/parallel: each is an nn kernel on this rank's shard plus the one
 * collective over the tensor-parallel communicator that makes the result
 * whole. Shapes: N rows (B*T), C channels; a `_local` width is this rank's
 * share. Backwards follow nn's convention (ACCUMULATE into weight and bias
 * gradients) except where a gradient must be reduced across ranks: those
 * outputs are SET (stated per function), since only this layer's
 * contribution may go through the allreduce.
 *
 *   column-parallel linear  Y_r = X W_r^T + b_r  (output columns split; X whole)
 *     forward: no communication (Megatron's f: identity)
 *     backward: dX = sum_r dY_r W_r -> one allreduce (f's backward)
 *   row-parallel linear     Y = sum_r X_r W_r^T + b  (input columns split)
 *     forward: one allreduce, then the bias once (Megatron's g)
 *     backward: dX_r = dY W_r, no communication (g's backward: identity)
 *   vocabulary-parallel embedding: rank r holds rows [v0, v1) of wte; a
 *     token outside them contributes zeros; one allreduce, then wpe.
 *   parallel cross-entropy: the logits of rows [v0, v1) only; the row max
 *     (allreduce MAX) and the sum of exponentials with the target's logit
 *     (one allreduce SUM of 2N floats) make the loss; the (N, V) logits are
 *     never gathered (Megatron's vocab_parallel_cross_entropy).
 *
 * Every collective's failure (a tensor-parallel peer died) is returned as
 * the comm's status with its message (which names the rank). */
#ifndef TD_PARALLEL_TENSOR_H
#define TD_PARALLEL_TENSOR_H

#include <stdint.h>

#include "tandem/parallel.h"

/* How a local tensor of the tensor-parallel GPT is cut from the unsplit
 * one, viewed as (rows, cols): REPL whole; ROWS rows [lo, lo+n) of each of
 * `blocks` equal row blocks (qkv: 3 blocks q, k, v); COLS columns [lo, lo+n)
 * of every row. gpt_tp.c cuts its initial values by it; ckpt_map.c maps a
 * checkpoint's unsplit coordinates by it. */
typedef enum { CUT_REPL, CUT_ROWS, CUT_COLS } cut_kind;
typedef struct cut {
  cut_kind kind;
  size_t rows, cols; /* of the unsplit tensor (per block for ROWS) */
  size_t lo, n;
  int blocks;
} cut;

/* The cut of the unsplit tensor `name` (td_gpt_create's names; count: its
 * floats) for tensor rank r of p: the one rule gpt_tp.c builds its shards
 * by (on the CPU and on a device) and ckpt_map.c maps checkpoints by.
 * Pure. */
cut tp_cut_of(const char *name, size_t count, const td_gpt_config *config, int p, int r);
/* The local floats of a cut. */
size_t tp_cut_count(const cut *k);

/* A tensor-parallel pipeline stage (the pipeline engine's chunks under TP x
 * PP): td_gpt_stage_create's blocks, embeddings and head, each tensor cut as
 * td_gpt_tp_create's, over the communicator `tensor` (world_rank: this
 * rank's, for messages). Inputs of a stage without the embeddings are the
 * previous stage's output rows on this rank: (B*T, C) floats, or with
 * sequence parallelism its (B*T/p, C) rows; the output, the gradient of the
 * output and of the input have that shape too. On a CUDA device (the
 * device GPT stage computing, as td_gpt_tp_create_on's model) these are
 * host (pinned) copies of whole rows (no sequence parallelism there). */
td_status tp_gpt_stage_create(const td_gpt_config *config, const td_gpt_stage *stage, td_device device,
                              td_comm *tensor, int world_rank, td_model **out);
const float *tp_gpt_stage_output(const td_model *model);
void tp_gpt_stage_set_output_grad(td_model *model, const float *dout);
const float *tp_gpt_stage_input_grad(const td_model *model);
/* The squared gradient, inside arena range [lo, hi), of the tensors this
 * rank holds but does not count in the model's norm: the replicated ones on
 * tensor ranks other than 0 (their gradients are equal on every rank of the
 * group). */
double tp_gpt_replicated_sq(const td_model *model, const float *grads, size_t lo, size_t hi);

/* The cut of each of a td_gpt_tp_create model's tensors (model->n_tensors,
 * in arena order; owned by the model), its config and its place (p ranks,
 * this one r) in the tensor group; NULL for any other model, and for a
 * tensor-parallel pipeline stage (its pipeline's map cuts by tp_cut_of). */
const cut *tp_gpt_cuts(const td_model *model, td_gpt_config *config, int *p, int *r);

/* out (N, OC) = allreduce_r(inp_local (N, IC_local) @ w_local (OC, IC_local)^T) + bias (OC, or NULL). */
td_status tp_row_linear_forward(float *out, const float *inp_local, const float *w_local, const float *bias, int N,
                                int IC_local, int OC, td_comm *comm);
/* dinp_local (N, IC_local) += dout @ w_local; dw_local, dbias += as td_linear_backward. No communication. */
void tp_row_linear_backward(float *dinp_local, float *dw_local, float *dbias, const float *dout, const float *inp_local,
                            const float *w_local, int N, int IC_local, int OC);
/* out_local (N, OC_local) = inp (N, IC) @ w_local^T + b_local. No communication. */
void tp_column_linear_forward(float *out_local, const float *inp, const float *w_local, const float *b_local, int N,
                              int IC, int OC_local);
/* dinp (N, IC) is SET to the whole input gradient (the allreduce over the
 * ranks of dout_local @ w_local); dw_local, db_local += as td_linear_backward. */
td_status tp_column_linear_backward(float *dinp, float *dw_local, float *db_local, const float *dout_local,
                                    const float *inp, const float *w_local, int N, int IC, int OC_local,
                                    td_comm *comm);

/* Sequence parallelism's variants (Megatron-LM's, Korthikanti et al. 2022):
 * the residual stream, LayerNorms and the embedding's output hold this
 * rank's N/p rows only (rows [r N/p, (r+1) N/p); N divisible by p); the
 * whole rows are gathered before a column-parallel product and the
 * row-parallel sum is reduce-scattered instead of allreduced. */
/* out_local (N/p, OC) = reduce_scatter_r(inp_local @ w_local^T) + bias; partial: (N, OC) scratch. */
td_status tp_row_linear_forward_sp(float *out_local, float *partial, const float *inp_local, const float *w_local,
                                   const float *bias, int N, int IC_local, int OC, td_comm *comm);
/* dinp_local (N/p, IC) is SET to this rank's rows of the input gradient (a
 * reduce-scatter of dout_local @ w_local); partial: (N, IC) scratch. */
td_status tp_column_linear_backward_sp(float *dinp_local, float *partial, float *dw_local, float *db_local,
                                       const float *dout_local, const float *inp, const float *w_local, int N, int IC,
                                       int OC_local, td_comm *comm);
/* out_local (N/p, C) = this rank's rows of wte[tokens] + wpe[t] (tokens (B, T) whole); partial: (N, C) scratch. */
td_status tp_embedding_forward_sp(float *out_local, float *partial, const int32_t *tokens, const float *wte_local,
                                  const float *wpe, int B, int T, int C, int v0, int V_local, td_comm *comm);

/* out (B, T, C) = wte[tokens] + wpe[t], wte_local holding vocabulary rows [v0, v0 + V_local).
 * Tokens must be in [0, V) (the caller checks). */
td_status tp_embedding_forward(float *out, const int32_t *tokens, const float *wte_local, const float *wpe, int B,
                               int T, int C, int v0, int V_local, td_comm *comm);
/* dwte_local += rows of the tokens in [v0, v0 + V_local); dwpe += per position. No communication. */
void tp_embedding_backward(float *dwte_local, float *dwpe, const float *dout, const int32_t *tokens, int B, int T, int C,
                           int v0, int V_local);

/* probs_local (N, V_local) = softmax over the whole vocabulary of the
 * logits, for this rank's columns (may alias logits_local); *loss_out = the
 * mean over N of -log p[target]. stats (3N floats): scratch. */
td_status tp_xent_forward(float *probs_local, const float *logits_local, const int32_t *targets, int N, int v0,
                          int V_local, float *stats, float *loss_out, td_comm *comm);
/* dlogits_local is SET to dloss * (probs - onehot) / N on this rank's columns. */
void tp_xent_backward(float *dlogits_local, const float *probs_local, const int32_t *targets, float dloss, int N,
                      int v0, int V_local);

#endif
