/* The frontier of final gradients (core.h): backward reports tensors whose
 * gradients are final (td_grad_ready_fn) in roughly reverse arena order;
 * the frontier is the lowest tensor index i such that tensors [i, n) are
 * all final, so that everything in the arena from its offset up is final.
 * A tensor reported out of order (a tied embedding, final only at the very
 * end) just holds the frontier back. The bucketed averaging (trainer.c)
 * and deterministic reduction's streamed exchange (deterministic/) both
 * launch communication behind it. */
#include "train/core/core.h"

#include <string.h>

void td_frontier_begin(td_trainer *t) {
  memset(t->tensor_ready, 0, (size_t)TD_MAX(t->model->n_tensors, 1) * sizeof(size_t));
  t->frontier_tensor = t->model->n_tensors;
}

size_t td_frontier_offset(const td_trainer *t) {
  const td_model *m = t->model;
  return t->frontier_tensor >= m->n_tensors ? t->n_params : m->tensors[t->frontier_tensor].offset;
}

size_t td_frontier_credit(td_trainer *t, size_t offset, size_t count) {
  const td_model *m = t->model;
  if (count == 0 || m->n_tensors == 0) return td_frontier_offset(t);
  /* Find the first tensor ending after `offset` (binary search), then credit
   * every tensor the range overlaps. */
  int lo = 0, hi = m->n_tensors;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (m->tensors[mid].offset + m->tensors[mid].count <= offset) lo = mid + 1;
    else hi = mid;
  }
  size_t end = offset + count;
  for (int i = lo; i < m->n_tensors && m->tensors[i].offset < end; i++) {
    size_t a = TD_MAX(offset, m->tensors[i].offset);
    size_t b = TD_MIN(end, m->tensors[i].offset + m->tensors[i].count);
    if (b > a) t->tensor_ready[i] += b - a;
  }
  while (t->frontier_tensor > 0 &&
         t->tensor_ready[t->frontier_tensor - 1] >= m->tensors[t->frontier_tensor - 1].count)
    t->frontier_tensor--;
  return td_frontier_offset(t);
}
