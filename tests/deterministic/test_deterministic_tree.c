/* The canonical summation tree (src/train/deterministic/tree.c) against a plain
 * recursive reference: for every n <= 12 and every split of [0, n) into 1..5
 * contiguous ranges (empty ones included), each range's stack-built cover
 * equals det_cover and the reference node values bit for bit, and the
 * covers combined give the reference root bit for bit, in any order; the
 * same for the double tree. Larger n (not powers of two) with the even
 * td_shard_range splits; each range's last leaf pushed with its additions
 * deferred and applied in two chunks gives the same cover bits. The leaves
 * have mixed magnitudes, so that another
 * order of the same additions gives other bits (checked). The scratch
 * levels the combination writes are those det_scratch_levels_written
 * names (sentinel-filled scratch, compared after). */
#include "train/deterministic/deterministic.h"

#include "../common/check.h"

enum { LEN = 3, MAXN = 100, MAXW = 8 };
static float leaf[MAXN][LEN];
static double leaf64[MAXN];

/* node(start, level) by definition: halves of a power-of-two span, an
 * absent right half (at or past n) leaves the left one alone */
static float ref(size_t n, size_t lo, size_t span, int e) {
  if (span == 1) return leaf[lo][e];
  if (lo + span / 2 >= n) return ref(n, lo, span / 2, e);
  return ref(n, lo, span / 2, e) + ref(n, lo + span / 2, span / 2, e);
}
static double ref64(size_t n, size_t lo, size_t span) {
  if (span == 1) return leaf64[lo];
  if (lo + span / 2 >= n) return ref64(n, lo, span / 2);
  return ref64(n, lo, span / 2) + ref64(n, lo + span / 2, span / 2);
}
static int same(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

static long n_splits, n_written_levels; /* splits whose combination used scratch */

/* The streamed last leaf (deterministic.c): pushed with its additions
 * deferred while its vector is still zero, written afterwards, then added
 * chunk by chunk from the top ([2, 3) then [0, 2)): the cover equals the
 * reference bit for bit, as the immediate push gives it. */
static void check_deferred(size_t n, size_t a, size_t b, const det_block *cover, int nc) {
  static float vecs[DET_MAX_COVER + 2][LEN];
  int used = 0;
  det_acc acc;
  det_acc_begin(&acc, n, a, LEN);
  for (size_t u = a; u < b; u++) {
    float *v = acc.n_spare ? acc.spare[--acc.n_spare] : vecs[used++];
    bool last = u + 1 == b;
    memset(v, 0, sizeof vecs[0]);
    if (!last) memcpy(v, leaf[u], sizeof leaf[u]);
    acc.defer = last;
    det_acc_push(&acc, v);
    acc.defer = false;
    if (last) {
      memcpy(v, leaf[u], sizeof leaf[u]); /* backward writes the leaf after the push */
      det_acc_apply(&acc, 2, LEN);
      det_acc_apply(&acc, 0, 2);
    }
  }
  CHECK_EQ_INT(acc.n_stack, nc);
  for (int i = 0; i < nc; i++)
    for (int e = 0; e < LEN; e++)
      CHECK(same(acc.stack[i].vec[e], ref(n, cover[i].start, (size_t)1 << cover[i].level, e)));
}

/* One split: bounds[0] = 0 <= bounds[1] <= ... <= bounds[w] = n. */
static void check_split(size_t n, int w, const size_t *bounds) {
  static float vecs[MAXW][DET_MAX_COVER + 2][LEN];
  det_part parts[MAXW * DET_MAX_COVER];
  det_part_f64 parts64[MAXW * DET_MAX_COVER];
  int n_parts = 0;
  size_t span = (size_t)1 << det_levels(n);
  for (int r = 0; r < w; r++) {
    size_t a = bounds[r], b = bounds[r + 1];
    det_block cover[DET_MAX_COVER];
    int nc = det_cover(n, a, b, cover);
    if (a == b) CHECK_EQ_INT(nc, 0);
    int cap = det_acc_vectors(n, a, b), used = 0;
    CHECK(cap <= DET_MAX_COVER + 1);
    det_acc acc;
    det_acc_begin(&acc, n, a, LEN);
    for (size_t u = a; u < b; u++) {
      float *v = acc.n_spare ? acc.spare[--acc.n_spare] : NULL;
      if (!v) {
        CHECK(used < cap); /* det_acc_vectors bounds the vectors alive */
        v = vecs[r][used++];
      }
      memcpy(v, leaf[u], sizeof leaf[u]);
      det_acc_push(&acc, v);
    }
    CHECK_EQ_INT(acc.n_stack, nc);
    size_t at = a;
    for (int i = 0; i < nc; i++) {
      CHECK_EQ_INT(cover[i].start, at);
      CHECK(cover[i].end > cover[i].start && cover[i].end <= b);
      CHECK_EQ_INT(acc.stack[i].start, cover[i].start);
      size_t node_span = (size_t)1 << cover[i].level;
      CHECK_EQ_INT(cover[i].start % node_span, 0);
      CHECK_EQ_INT(TD_MIN(cover[i].start + node_span, n), cover[i].end);
      for (int e = 0; e < LEN; e++) CHECK(same(acc.stack[i].vec[e], ref(n, cover[i].start, node_span, e)));
      double v64 = det_node_f64(n, cover[i].start, cover[i].level, leaf64 + a, a);
      CHECK(v64 == ref64(n, cover[i].start, node_span));
      parts[n_parts] = (det_part){cover[i].start, cover[i].end, acc.stack[i].vec};
      parts64[n_parts++] = (det_part_f64){cover[i].start, cover[i].end, v64};
      at = cover[i].end;
    }
    CHECK_EQ_INT(at, b);
    if (b > a) check_deferred(n, a, b, cover, nc);
  }
  float s0[DET_MAX_LEVELS][LEN], *scratch[DET_MAX_LEVELS];
  for (int k = 0; k < DET_MAX_LEVELS; k++) scratch[k] = s0[k];
  /* the scratch levels the combination writes (the memory estimate counts
   * only those): a sentinel in every level, then which ones changed */
  for (int k = 0; k < DET_MAX_LEVELS; k++)
    for (int e = 0; e < LEN; e++) s0[k][e] = -7.25e30f;
  float root[LEN];
  CHECK_EQ_INT(det_combine_f32(n, parts, n_parts, root, LEN, scratch), 0);
  for (int e = 0; e < LEN; e++) CHECK(same(root[e], ref(n, 0, span, e)));
  uint64_t written = 0;
  for (int k = 0; k < DET_MAX_LEVELS; k++)
    for (int e = 0; e < LEN; e++)
      if (!same(s0[k][e], -7.25e30f)) written |= (uint64_t)1 << k;
  CHECK(det_scratch_levels_written(n, parts, n_parts) == written);
  if (w == 1 || n_parts == 1) CHECK(written == 0); /* the root is a part: nothing to sum */
  n_written_levels += written != 0;
  int ok = 0;
  CHECK(det_combine_f64(n, parts64, n_parts, &ok) == ref64(n, 0, span) && ok);
  /* the parts in reverse order */
  for (int i = 0; i < n_parts / 2; i++) {
    det_part p = parts[i];
    parts[i] = parts[n_parts - 1 - i];
    parts[n_parts - 1 - i] = p;
  }
  CHECK_EQ_INT(det_combine_f32(n, parts, n_parts, root, LEN, scratch), 0);
  for (int e = 0; e < LEN; e++) CHECK(same(root[e], ref(n, 0, span, e)));
  /* a missing part is refused, not summed short */
  if (n_parts > 1) {
    CHECK_EQ_INT(det_combine_f32(n, parts + 1, n_parts - 1, root, LEN, scratch), -1);
    (void)det_combine_f64(n, parts64 + 1, n_parts - 1, &ok);
    CHECK_EQ_INT(ok, 0);
  }
  n_splits++;
}

/* Every split of [0, n) into w ranges (bounds[1..w-1] non-decreasing). */
static void all_splits(size_t n, int w, size_t *bounds, int i) {
  if (i == w) {
    bounds[w] = n;
    check_split(n, w, bounds);
    return;
  }
  for (size_t x = bounds[i - 1]; x <= n; x++) {
    bounds[i] = x;
    all_splits(n, w, bounds, i + 1);
  }
}

int main(void) {
  uint64_t rng = 12345;
  for (int i = 0; i < MAXN; i++) {
    /* magnitudes from 2^-12 to 2^12: sums in another order round otherwise */
    float scale = ldexpf(1.0f, (int)(td_test_urand(&rng) * 12.0f));
    for (int e = 0; e < LEN; e++) leaf[i][e] = scale * td_test_urand(&rng);
    leaf64[i] = (double)scale * td_test_urand(&rng) * (1.0 + 1e-9 * i);
  }
  CHECK_EQ_INT(det_levels(0), 0);
  CHECK_EQ_INT(det_levels(1), 0);
  CHECK_EQ_INT(det_levels(2), 1);
  CHECK_EQ_INT(det_levels(3), 2);
  CHECK_EQ_INT(det_levels(12), 4);
  CHECK_EQ_INT(det_levels(16), 4);
  CHECK_EQ_INT(det_levels(17), 5);
  det_block c[DET_MAX_COVER];
  /* the example of tree.c's comment, and a whole range is the root alone */
  CHECK_EQ_INT(det_cover(12, 3, 9, c), 3);
  CHECK(c[0].start == 3 && c[0].end == 4 && c[1].start == 4 && c[1].end == 8 && c[2].start == 8 && c[2].end == 9);
  CHECK_EQ_INT(det_cover(12, 0, 12, c), 1);
  CHECK_EQ_INT(c[0].level, 4);
  CHECK_EQ_INT(det_cover(12, 5, 5, c), 0);
  size_t bounds[MAXW + 1] = {0};
  for (size_t n = 1; n <= 12; n++)
    for (int w = 1; w <= 5; w++) all_splits(n, w, bounds, 1);
  long exhaustive = n_splits;
  /* larger leaf counts, even splits (td_shard_range, as the trainer cuts units) */
  size_t big[] = {13, 16, 17, 31, 33, 64, 99, 100};
  for (size_t i = 0; i < TD_ARRAY_SIZE(big); i++)
    for (int w = 1; w <= MAXW; w++) {
      for (int r = 0; r < w; r++) {
        size_t off, len;
        td_shard_range(big[i], w, r, &off, &len);
        bounds[r] = off;
      }
      bounds[w] = big[i];
      check_split(big[i], w, bounds);
    }
  /* the test can fail: a left-to-right sum differs from the tree's */
  int differs = 0;
  for (int e = 0; e < LEN; e++) {
    float seq = 0.0f;
    for (size_t u = 0; u < 12; u++) seq += leaf[u][e];
    differs |= !same(seq, ref(12, 0, 16, e));
  }
  CHECK(differs);
  CHECK(n_written_levels > 0 && n_written_levels < n_splits); /* both kinds of split were seen */
  printf("canonical tree: %ld splits checked (%ld exhaustive, n <= 12 over 1..5 ranges; %ld summed in scratch)\n",
         n_splits, exhaustive, n_written_levels);
  return 0;
}
