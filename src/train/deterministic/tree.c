/* The canonical summation tree's math (deterministic.h): pure functions over
 * leaf indices and vectors, no communication.
 *
 * The tree over n leaves is the complete binary tree over [0, 2^K) with
 * the leaves at n and beyond absent; a node with an absent right half
 * equals its left half. A contiguous range [a, b) of leaves is covered by
 * its maximal nodes (a segment tree's decomposition: at most two per
 * level), e.g. n = 12, a rank holding [3, 9):
 *
 *     level 2:  [0      4)[4      8)[8    12)
 *     level 1:  [0  2)[2  4)[4  6)[6  8)[8 10)[10 12)
 *     leaves:    0  1  2 [3][4  5  6  7][8] 9  10 11
 *     cover of [3, 9): node(3,0), node(4,2), node(8,0)
 *
 * Whichever ranks hold which ranges, combining their covers top-down from
 * the root reaches exactly those nodes, so the root is the same sum of the
 * same pairs: the result does not depend on the split. Cost: a rank adds
 * its leaves once (b - a - |cover| vector additions); the combination adds
 * each cover vector once more. */
#include "train/deterministic/deterministic.h"

#include <string.h>

int det_levels(size_t n) {
  int k = 0;
  while (k < DET_MAX_LEVELS && ((size_t)1 << k) < n) k++;
  return k;
}

static size_t node_end(size_t n, size_t start, int level) {
  size_t span = (size_t)1 << level;
  return n - start < span ? n : start + span;
}

int det_cover(size_t n, size_t a, size_t b, det_block *out) {
  int k_max = det_levels(n), count = 0;
  size_t s = a;
  while (s < b && count < DET_MAX_COVER) {
    /* the highest node starting at s (aligned) that ends inside [s, b) */
    int level = 0;
    while (level < k_max && s % ((size_t)1 << (level + 1)) == 0 && node_end(n, s, level + 1) <= b) level++;
    out[count++] = (det_block){s, node_end(n, s, level), level};
    s = node_end(n, s, level);
  }
  return count;
}

static void add_into(float *restrict dst, const float *restrict src, size_t len) {
  for (size_t i = 0; i < len; i++) dst[i] = dst[i] + src[i];
}

void det_acc_begin(det_acc *acc, size_t n, size_t first, size_t len) {
  acc->n = n;
  acc->next = first;
  acc->len = len;
  acc->n_stack = 0;
  acc->n_spare = 0;
  acc->defer = false;
  acc->n_ops = 0;
}

/* Raise the top node while its right half is absent (same leaves, same
 * value), then add siblings: the left one (below) += the right one (top). */
static void settle(det_acc *acc, float **freed, int *n_freed) {
  int k_max = det_levels(acc->n);
  for (;;) {
    det_node *top = &acc->stack[acc->n_stack - 1];
    while (top->level < k_max && top->start % ((size_t)1 << (top->level + 1)) == 0 &&
           acc->n - top->start <= ((size_t)1 << top->level))
      top->level++;
    if (acc->n_stack < 2) return;
    det_node *left = &acc->stack[acc->n_stack - 2];
    if (left->level != top->level || left->start % ((size_t)1 << (left->level + 1)) != 0 ||
        top->start != left->start + ((size_t)1 << left->level))
      return;
    if (left->vec && top->vec) {
      if (acc->defer)
        acc->ops[acc->n_ops++] = (det_add){left->vec, top->vec};
      else
        add_into(left->vec, top->vec, acc->len);
    }
    left->level++;
    freed[(*n_freed)++] = top->vec;
    acc->n_stack--;
  }
}

void det_acc_push(det_acc *acc, float *vec) {
  float *freed[DET_MAX_COVER + 1];
  int n_freed = 0;
  acc->stack[acc->n_stack++] = (det_node){acc->next++, 0, vec};
  settle(acc, freed, &n_freed);
  for (int i = 0; i < n_freed && acc->n_spare < (int)TD_ARRAY_SIZE(acc->spare); i++)
    acc->spare[acc->n_spare++] = freed[i];
}

void det_acc_apply(det_acc *acc, size_t lo, size_t hi) {
  for (int i = 0; i < acc->n_ops; i++) add_into(acc->ops[i].dst + lo, acc->ops[i].src + lo, hi - lo);
}

int det_acc_vectors(size_t n, size_t a, size_t b) {
  /* the same stack without vectors: before each push it holds the settled
   * nodes, and the new leaf's vector is one more */
  det_acc acc;
  det_acc_begin(&acc, n, a, 0);
  int peak = 0;
  for (size_t u = a; u < b; u++) {
    peak = TD_MAX(peak, acc.n_stack + 1);
    det_acc_push(&acc, NULL);
    acc.n_spare = 0;
  }
  return peak;
}

static const det_part *find_part(const det_part *parts, int n_parts, size_t start, size_t end) {
  for (int i = 0; i < n_parts; i++)
    if (parts[i].start == start && parts[i].end == end) return &parts[i];
  return NULL;
}

static void add3(float *dst, const float *left, const float *right, size_t len) {
  /* dst may be left (in place); never right */
  for (size_t i = 0; i < len; i++) dst[i] = left[i] + right[i];
}

/* The node's value: a part's own vector when one holds exactly this node
 * (no copy), else left + right written into buf (the right half into this
 * level's scratch; deeper levels use lower ones). NULL: a leaf is missing. */
static const float *combine(size_t n, size_t start, int level, const det_part *parts, int n_parts, float *buf,
                            size_t len, float **scratch) {
  size_t end = node_end(n, start, level);
  const det_part *p = find_part(parts, n_parts, start, end);
  if (p) return p->vec;
  if (level == 0) return NULL;
  size_t mid = start + ((size_t)1 << (level - 1));
  if (mid >= n) return combine(n, start, level - 1, parts, n_parts, buf, len, scratch);
  const float *left = combine(n, start, level - 1, parts, n_parts, buf, len, scratch);
  const float *right = left ? combine(n, mid, level - 1, parts, n_parts, scratch[level - 1], len, scratch) : NULL;
  if (!right) return NULL;
  add3(buf, left, right, len);
  return buf;
}

int det_combine_f32(size_t n, const det_part *parts, int n_parts, float *dst, size_t len, float **scratch) {
  if (n == 0) return n_parts == 0 ? 0 : -1;
  const float *root = combine(n, 0, det_levels(n), parts, n_parts, dst, len, scratch);
  if (!root) return -1;
  if (root != dst && len) memcpy(dst, root, len * sizeof(float));
  return 0;
}

/* combine()'s walk without values: which scratch levels it writes (bit l:
 * scratch[l]; buf -1 is dst). false: a leaf is missing. */
static bool scratch_walk(size_t n, size_t start, int level, const det_part *parts, int n_parts, int buf,
                         uint64_t *mask) {
  if (find_part(parts, n_parts, start, node_end(n, start, level))) return true;
  if (level == 0) return false;
  size_t mid = start + ((size_t)1 << (level - 1));
  if (mid >= n) return scratch_walk(n, start, level - 1, parts, n_parts, buf, mask);
  if (!scratch_walk(n, start, level - 1, parts, n_parts, buf, mask) ||
      !scratch_walk(n, mid, level - 1, parts, n_parts, level - 1, mask))
    return false;
  if (buf >= 0) *mask |= (uint64_t)1 << buf;
  return true;
}

uint64_t det_scratch_levels_written(size_t n, const det_part *parts, int n_parts) {
  uint64_t mask = 0;
  if (n > 0) (void)scratch_walk(n, 0, det_levels(n), parts, n_parts, -1, &mask);
  return mask;
}

double det_node_f64(size_t n, size_t start, int level, const double *v, size_t first) {
  if (level == 0) return v[start - first];
  size_t mid = start + ((size_t)1 << (level - 1));
  double left = det_node_f64(n, start, level - 1, v, first);
  if (mid >= n) return left;
  return left + det_node_f64(n, mid, level - 1, v, first);
}

static double combine_f64(size_t n, size_t start, int level, const det_part_f64 *parts, int n_parts, int *ok) {
  size_t end = node_end(n, start, level);
  for (int i = 0; i < n_parts; i++)
    if (parts[i].start == start && parts[i].end == end) return parts[i].value;
  if (level == 0) {
    *ok = 0;
    return 0;
  }
  size_t mid = start + ((size_t)1 << (level - 1));
  double left = combine_f64(n, start, level - 1, parts, n_parts, ok);
  if (mid >= n) return left;
  return left + combine_f64(n, mid, level - 1, parts, n_parts, ok);
}

double det_combine_f64(size_t n, const det_part_f64 *parts, int n_parts, int *ok) {
  *ok = 1;
  if (n == 0) return 0;
  return combine_f64(n, 0, det_levels(n), parts, n_parts, ok);
}
