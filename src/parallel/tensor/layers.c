/* Tensor parallelism's layers (tensor.h has the scheme and the contracts):
 * nn's kernels on the local shard, one collective where the pieces meet.
 *
 * Cost per call, N rows, C channels, p ranks: the row-parallel forward and
 * the column-parallel backward each allreduce N*C floats; the embedding
 * allreduces N*C; the cross-entropy allreduces 3N (max, then sum and target
 * logit), where gathering the logits would move N*V. With sequence
 * parallelism each allreduce becomes a reduce-scatter, and the model adds an
 * allgather before each column-parallel product: the same bytes on a ring
 * (an allreduce is a reduce-scatter plus an allgather), while everything
 * between them (LayerNorms, residuals, dropout's place) runs on N/p rows. */
#include "tensor.h"

#include <math.h>
#include <string.h>

td_status tp_row_linear_forward(float *out, const float *inp_local, const float *w_local, const float *bias, int N,
                                int IC_local, int OC, td_comm *comm) {
  const size_t n = (size_t)N * OC;
  td_linear_forward(out, inp_local, w_local, NULL, N, IC_local, OC);
  td_status st = td_allreduce(out, out, n, TD_F32, TD_SUM, comm);
  if (st != TD_OK) return st;
  /* the bias once, after the sum: it is replicated, not split */
  if (bias)
    for (size_t i = 0; i < (size_t)N; i++) {
      float *row = out + i * OC;
      for (int o = 0; o < OC; o++) row[o] += bias[o];
    }
  return TD_OK;
}

void tp_row_linear_backward(float *dinp_local, float *dw_local, float *dbias, const float *dout, const float *inp_local,
                            const float *w_local, int N, int IC_local, int OC) {
  /* dout is the same on every rank (the residual stream's gradient), so the
   * replicated bias gets the same gradient everywhere: nothing to reduce */
  td_linear_backward(dinp_local, dw_local, dbias, dout, inp_local, w_local, N, IC_local, OC);
}

void tp_column_linear_forward(float *out_local, const float *inp, const float *w_local, const float *b_local, int N,
                              int IC, int OC_local) {
  td_linear_forward(out_local, inp, w_local, b_local, N, IC, OC_local);
}

td_status tp_column_linear_backward(float *dinp, float *dw_local, float *db_local, const float *dout_local,
                                    const float *inp, const float *w_local, int N, int IC, int OC_local,
                                    td_comm *comm) {
  const size_t n = (size_t)N * IC;
  memset(dinp, 0, n * sizeof(float));
  td_linear_backward(dinp, dw_local, db_local, dout_local, inp, w_local, N, IC, OC_local);
  return td_allreduce(dinp, dinp, n, TD_F32, TD_SUM, comm);
}

/* The row-parallel sum as a reduce-scatter: rank r keeps rows [r N/p, (r+1) N/p). */
td_status tp_row_linear_forward_sp(float *out_local, float *partial, const float *inp_local, const float *w_local,
                                   const float *bias, int N, int IC_local, int OC, td_comm *comm) {
  const int rows = N / td_comm_size(comm);
  td_linear_forward(partial, inp_local, w_local, NULL, N, IC_local, OC);
  td_status st = td_reduce_scatter(partial, out_local, (size_t)N * OC, TD_F32, TD_SUM, comm);
  if (st != TD_OK) return st;
  if (bias)
    for (int i = 0; i < rows; i++) {
      float *row = out_local + (size_t)i * OC;
      for (int o = 0; o < OC; o++) row[o] += bias[o];
    }
  return TD_OK;
}

td_status tp_column_linear_backward_sp(float *dinp_local, float *partial, float *dw_local, float *db_local,
                                       const float *dout_local, const float *inp, const float *w_local, int N, int IC,
                                       int OC_local, td_comm *comm) {
  memset(partial, 0, (size_t)N * IC * sizeof(float));
  td_linear_backward(partial, dw_local, db_local, dout_local, inp, w_local, N, IC, OC_local);
  return td_reduce_scatter(partial, dinp_local, (size_t)N * IC, TD_F32, TD_SUM, comm);
}

/* This rank's rows of the vocabulary shard's lookup (zeros for other tokens). */
static void embedding_lookup(float *out, const int32_t *tokens, const float *wte_local, int N, int C, int v0,
                             int V_local) {
  for (int i = 0; i < N; i++) {
    float *row = out + (size_t)i * C;
    int local = tokens[i] - v0;
    if (local >= 0 && local < V_local)
      memcpy(row, wte_local + (size_t)local * C, (size_t)C * sizeof(float));
    else
      memset(row, 0, (size_t)C * sizeof(float));
  }
}

td_status tp_embedding_forward_sp(float *out_local, float *partial, const int32_t *tokens, const float *wte_local,
                                  const float *wpe, int B, int T, int C, int v0, int V_local, td_comm *comm) {
  const int N = B * T, rows = N / td_comm_size(comm), first = rows * td_comm_rank(comm);
  embedding_lookup(partial, tokens, wte_local, N, C, v0, V_local);
  td_status st = td_reduce_scatter(partial, out_local, (size_t)N * C, TD_F32, TD_SUM, comm);
  if (st != TD_OK) return st;
  for (int i = 0; i < rows; i++) {
    float *row = out_local + (size_t)i * C;
    const float *pos = wpe + (size_t)((first + i) % T) * C;
    for (int c = 0; c < C; c++) row[c] += pos[c];
  }
  return TD_OK;
}

td_status tp_embedding_forward(float *out, const int32_t *tokens, const float *wte_local, const float *wpe, int B,
                               int T, int C, int v0, int V_local, td_comm *comm) {
  const size_t n = (size_t)B * T * C;
  embedding_lookup(out, tokens, wte_local, B * T, C, v0, V_local);
  td_status st = td_allreduce(out, out, n, TD_F32, TD_SUM, comm);
  if (st != TD_OK) return st;
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      float *row = out + ((size_t)b * T + t) * C;
      const float *pos = wpe + (size_t)t * C;
      for (int c = 0; c < C; c++) row[c] += pos[c];
    }
  return TD_OK;
}

void tp_embedding_backward(float *dwte_local, float *dwpe, const float *dout, const int32_t *tokens, int B, int T, int C,
                           int v0, int V_local) {
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      const float *g = dout + ((size_t)b * T + t) * C;
      int local = tokens[b * T + t] - v0;
      if (dwte_local && local >= 0 && local < V_local) {
        float *dst = dwte_local + (size_t)local * C;
        for (int c = 0; c < C; c++) dst[c] += g[c];
      }
      if (dwpe) {
        float *dst = dwpe + (size_t)t * C;
        for (int c = 0; c < C; c++) dst[c] += g[c];
      }
    }
}

td_status tp_xent_forward(float *probs_local, const float *logits_local, const int32_t *targets, int N, int v0,
                          int V_local, float *stats, float *loss_out, td_comm *comm) {
  float *row_max = stats, *sums = stats + N; /* sums: (N, 2) = sum of exp, target logit */
  /* 1. the row maximum over the whole vocabulary */
  for (int i = 0; i < N; i++) {
    const float *x = logits_local + (size_t)i * V_local;
    float m = -INFINITY;
    for (int v = 0; v < V_local; v++) m = x[v] > m ? x[v] : m;
    row_max[i] = m;
  }
  td_status st = td_allreduce(row_max, row_max, (size_t)N, TD_F32, TD_MAX, comm);
  if (st != TD_OK) return st;
  /* 2. the sum of exp(x - max) and the target's logit (from its owner) */
  for (int i = 0; i < N; i++) {
    const float *x = logits_local + (size_t)i * V_local;
    float *p = probs_local + (size_t)i * V_local;
    int local = targets[i] - v0;
    /* before the exponentials: probs may overwrite the logits */
    sums[2 * i + 1] = local >= 0 && local < V_local ? x[local] - row_max[i] : 0.0f;
    float sum = 0.0f;
    for (int v = 0; v < V_local; v++) {
      p[v] = expf(x[v] - row_max[i]);
      sum += p[v];
    }
    sums[2 * i] = sum;
  }
  st = td_allreduce(sums, sums, 2 * (size_t)N, TD_F32, TD_SUM, comm);
  if (st != TD_OK) return st;
  double loss = 0.0;
  for (int i = 0; i < N; i++) {
    float *p = probs_local + (size_t)i * V_local;
    const float inv = 1.0f / sums[2 * i];
    for (int v = 0; v < V_local; v++) p[v] *= inv;
    loss += logf(sums[2 * i]) - sums[2 * i + 1]; /* -log softmax[target] */
  }
  *loss_out = N > 0 ? (float)(loss / N) : 0.0f;
  return TD_OK;
}

void tp_xent_backward(float *dlogits_local, const float *probs_local, const int32_t *targets, float dloss, int N,
                      int v0, int V_local) {
  const float scale = N > 0 ? dloss / (float)N : 0.0f;
  for (int i = 0; i < N; i++) {
    const float *p = probs_local + (size_t)i * V_local;
    float *d = dlogits_local + (size_t)i * V_local;
    for (int v = 0; v < V_local; v++) d[v] = scale * p[v];
    int local = targets[i] - v0;
    if (local >= 0 && local < V_local) d[local] -= scale;
  }
}
