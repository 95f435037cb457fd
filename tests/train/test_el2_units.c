/* Elastic training beyond stage 0 (src/elastic/replica.c and src/train/elastic/
 * elastic_config.c), without launching processes:
 *
 *  - el_rep_buddies on every host layout of 1..8 ranks (1+1, 2+1, 3+1,
 *    2+2+1, one host, interleaved, ...): copies off their host whenever
 *    another host exists, the fewest per rank, a deadlock-free exchange;
 *  - el_rep_choose, which commit the survivors rebuild, on hand-made
 *    holdings of 4 ranks (own pieces, buddy replicas, two commits each),
 *    against a brute-force per-element coverage reference: a lost rank
 *    covered by its buddy's replica; a rank one commit behind (the newer
 *    commit is then incomplete); a replica still in flight (older commit);
 *    a rank and its buddy both lost (no commit: the hole is reported);
 *    pieces of two layouts (world 4 and world 3) mixed;
 *  - td_elasticity_batch against DeepSpeed's own unit test
 *    (test_elastic.py test_basic_10k: batch 9792, 23 valid world sizes) and
 *    a case worked by hand; the "elasticity" config block: the batch keys
 *    beside it refused unless ignore_non_elastic_batch_info, min_time and
 *    model parallelism refused with their reason, the micro-batch per world
 *    size, and the world sizes listed when one cannot keep the batch. */
#include "elastic/elastic.h"

#include <stdio.h>
#include <string.h>

#include "../common/check.h"

enum { W = 4 };

static void set_piece(int64_t *d, int rank, int slot, int64_t lo, int64_t hi, int64_t commit) {
  int64_t *p = d + (size_t)rank * EL_DESC_LEN(4) + EL_D_PIECES + 3 * slot;
  p[0] = lo;
  p[1] = hi;
  p[2] = commit;
}

static void clear(int64_t *d, int world, int64_t total) {
  for (int r = 0; r < world; r++) {
    int64_t *x = d + (size_t)r * EL_DESC_LEN(4);
    x[EL_D_WHOLE0] = x[EL_D_WHOLE1] = -1;
    x[EL_D_TOTAL] = total;
    x[EL_D_ROW] = 8;
    for (int s = 0; s < 4; s++) set_piece(d, r, s, 0, 0, -1);
  }
}

/* Reference: the newest commit some rank holds whole whose pieces cover
 * every element, element by element. */
static int64_t brute_choose(const int64_t *d, int world, int64_t total) {
  int64_t best = -1;
  for (int r = 0; r < world; r++)
    for (int g = 0; g < 2; g++) {
      int64_t c = d[(size_t)r * EL_DESC_LEN(4) + g];
      if (c <= best) continue;
      int ok = 1;
      for (int64_t x = 0; x < total && ok; x++) {
        int held = 0;
        for (int q = 0; q < world && !held; q++)
          for (int s = 0; s < 4 && !held; s++) {
            const int64_t *p = d + (size_t)q * EL_DESC_LEN(4) + EL_D_PIECES + 3 * s;
            held = p[2] == c && p[0] <= x && x < p[1];
          }
        ok = held;
      }
      if (ok) best = c;
    }
  return best;
}

/* World-4 holdings of 100 elements at commits c (own[0], rep[0]) and c-1
 * (own[1], rep[1]); rank r's range [25r, 25r+25), its buddy r+1. `alive`
 * marks the ranks whose descriptor is kept (a survivor's), in order. */
static int survivors(int64_t *d, const int *alive, int n_alive, int64_t c) {
  clear(d, W, 100);
  int n = 0;
  for (int r = 0; r < W; r++) {
    if (!alive[r]) continue;
    int64_t *x = d + (size_t)n * EL_DESC_LEN(4);
    x[EL_D_WHOLE0] = c;
    x[EL_D_WHOLE1] = c - 1;
    int ward = (r + W - 1) % W;
    set_piece(d, n, 0, 25 * r, 25 * r + 25, c);
    set_piece(d, n, 1, 25 * r, 25 * r + 25, c - 1);
    set_piece(d, n, 2, 25 * ward, 25 * ward + 25, c);
    set_piece(d, n, 3, 25 * ward, 25 * ward + 25, c - 1);
    n++;
  }
  CHECK_EQ_INT(n, n_alive);
  return n;
}

static void choose_cases(void) {
  int64_t d[W * EL_DESC_LEN(4)], lo, hi;
  /* rank 1 lost: its range is rank 2's replica */
  int a1[W] = {1, 0, 1, 1};
  int n = survivors(d, a1, 3, 7);
  CHECK_EQ_INT(el_rep_choose(d, n, 4, &lo, &hi), 7);
  CHECK_EQ_INT(brute_choose(d, n, 100), 7);

  /* ... and rank 2 (rank 0 of the survivors' list is rank 0) one commit
   * behind: it failed inside step 7, so its own commit 7 does not exist */
  int n2 = survivors(d, a1, 3, 7);
  set_piece(d, 1, 0, 50, 75, 6); /* survivor #1 = rank 2: own[0] at 6 */
  set_piece(d, 1, 1, 50, 75, 5);
  d[1 * EL_DESC_LEN(4) + EL_D_WHOLE0] = 6;
  d[1 * EL_DESC_LEN(4) + EL_D_WHOLE1] = 5;
  set_piece(d, 2, 2, 50, 75, 6); /* rank 3 holds rank 2's replica at 6 and 5 */
  set_piece(d, 2, 3, 50, 75, 5);
  set_piece(d, 1, 2, 25, 50, 6); /* and rank 2 holds rank 1's at 6, 5 */
  set_piece(d, 1, 3, 25, 50, 5);
  CHECK_EQ_INT(el_rep_choose(d, n2, 4, &lo, &hi), 6);
  CHECK_EQ_INT(brute_choose(d, n2, 100), 6);

  /* rank 1 lost while its replica of commit 7 was in flight: rank 2 holds
   * it at 6 only (rep[1] invalid) -> everybody goes back to 6 */
  survivors(d, a1, 3, 7);
  set_piece(d, 1, 2, 25, 50, 6);
  set_piece(d, 1, 3, 0, 0, -1);
  CHECK_EQ_INT(el_rep_choose(d, 3, 4, &lo, &hi), 6);
  CHECK_EQ_INT(brute_choose(d, 3, 100), 6);

  /* ranks 1 and 2 (1's buddy) lost: [25, 50) is nowhere */
  int a2[W] = {1, 0, 0, 1};
  n = survivors(d, a2, 2, 7);
  CHECK_EQ_INT(el_rep_choose(d, n, 4, &lo, &hi), -1);
  CHECK_EQ_INT(brute_choose(d, n, 100), -1);
  CHECK_EQ_INT(lo, 25);
  CHECK_EQ_INT(hi, 50);

  /* two layouts: a world-3 epoch (ranges of 34, 33, 33) whose repair was
   * cut short: rank A swapped to its world-3 pieces, ranks B and C kept
   * their world-4 holdings; commit 9 is covered only by both together */
  clear(d, 3, 100);
  for (int r = 0; r < 3; r++) d[(size_t)r * EL_DESC_LEN(4) + EL_D_WHOLE0] = 9;
  set_piece(d, 0, 0, 0, 34, 9);   /* A: world-3 own */
  set_piece(d, 0, 2, 67, 100, 9); /* A: world-3 replica of the last range */
  set_piece(d, 1, 0, 25, 50, 9);  /* B: world-4 own */
  set_piece(d, 2, 0, 50, 75, 9);  /* C: world-4 own */
  set_piece(d, 2, 2, 25, 50, 9);
  CHECK_EQ_INT(el_rep_choose(d, 3, 4, &lo, &hi), 9);
  CHECK_EQ_INT(brute_choose(d, 3, 100), 9);
  set_piece(d, 2, 0, 50, 66, 9); /* one element short: 66 is nowhere */
  CHECK_EQ_INT(el_rep_choose(d, 3, 4, &lo, &hi), -1);
  CHECK_EQ_INT(lo, 66);
  CHECK_EQ_INT(hi, 67);

  /* nothing sharded (stage 0): the newest whole commit */
  clear(d, 2, 0);
  d[EL_D_WHOLE0] = 4;
  d[EL_D_WHOLE1] = 3;
  d[EL_DESC_LEN(4) + EL_D_WHOLE0] = 5;
  CHECK_EQ_INT(el_rep_choose(d, 2, 4, &lo, &hi), 5);
}

static void elasticity_cases(void) {
  /* DeepSpeed tests/unit/elasticity/test_elastic.py, test_basic_10k */
  td_elasticity_config e;
  memset(&e, 0, sizeof e);
  e.enabled = 1;
  e.max_train_batch_size = 10000;
  int mbs[] = {8, 12, 16, 17};
  for (int i = 0; i < 4; i++) e.micro_batch_sizes[i] = mbs[i];
  e.n_micro_batch_sizes = 4;
  e.min_gpus = 32;
  e.max_gpus = 1500;
  e.prefer_larger_batch = 1;
  long batch = 0;
  int valid[64], n = 0;
  CHECK_OK(td_elasticity_batch(&e, &batch, valid, 64, &n));
  CHECK_EQ_INT(batch, 9792);
  CHECK_EQ_INT(n, 23);
  for (int i = 0; i < n; i++) { /* the property DeepSpeed's test checks */
    CHECK(batch % valid[i] == 0);
    int found = 0;
    for (int k = 0; k < 4; k++) found |= (batch / valid[i]) % mbs[k] == 0;
    CHECK(found);
    CHECK(valid[i] >= 32 && valid[i] <= 1500);
  }
  /* by hand: max 30, micro {3, 6}, 2..4 ranks. Candidates 3*6 = 18 (valid
   * 2, 3) and 6*4 = 24 (valid 2, 4): a tie, the larger batch wins; the
   * smaller when prefer_larger_batch is false */
  memset(&e, 0, sizeof e);
  e.enabled = 1;
  e.max_train_batch_size = 30;
  e.micro_batch_sizes[0] = 3;
  e.micro_batch_sizes[1] = 6;
  e.n_micro_batch_sizes = 2;
  e.min_gpus = 2;
  e.max_gpus = 4;
  e.prefer_larger_batch = 1;
  CHECK_OK(td_elasticity_batch(&e, &batch, valid, 64, &n));
  CHECK_EQ_INT(batch, 24);
  CHECK_EQ_INT(n, 2);
  CHECK_EQ_INT(valid[0], 2);
  CHECK_EQ_INT(valid[1], 4);
  e.prefer_larger_batch = 0;
  CHECK_OK(td_elasticity_batch(&e, &batch, valid, 64, &n));
  CHECK_EQ_INT(batch, 18);
  CHECK_EQ_INT(valid[1], 3);

  const char *block = "\"elasticity\": {\"enabled\": true, \"max_train_batch_size\": 30, \"micro_batch_sizes\": [3, 6], "
                      "\"min_gpus\": 2, \"max_gpus\": 4, \"version\": 0.1";
  char text[512];
  td_train_config cfg;
  td_train_config_defaults(&cfg);
  snprintf(text, sizeof text, "{%s}}", block);
  CHECK_OK(td_train_config_parse_json(text, "t.json", &cfg));
  CHECK_EQ_INT(cfg.elasticity.enabled, 1);
  CHECK_EQ_INT(cfg.train_batch_size, 24);
  td_train_config c4 = cfg, c2 = cfg, c3 = cfg;
  CHECK_OK(td_train_config_resolve(&c4, 4));
  CHECK_EQ_INT(c4.micro_batch, 6);
  CHECK_EQ_INT(c4.grad_accum, 1);
  CHECK_OK(td_train_config_resolve(&c2, 2));
  CHECK_EQ_INT(c2.micro_batch, 6);
  CHECK_EQ_INT(c2.grad_accum, 2);
  CHECK_MSG(td_train_config_resolve(&c3, 3), TD_ERR_INVALID_ARGUMENT, "world sizes that keep it: 2, 4");

  td_train_config_defaults(&cfg);
  snprintf(text, sizeof text, "{\"train_batch_size\": 64, %s}}", block);
  CHECK_MSG(td_train_config_parse_json(text, "t.json", &cfg), TD_ERR_INVALID_ARGUMENT, "ignore_non_elastic_batch_info");
  td_train_config_defaults(&cfg);
  snprintf(text, sizeof text, "{\"train_batch_size\": 64, %s, \"ignore_non_elastic_batch_info\": true}}", block);
  CHECK_OK(td_train_config_parse_json(text, "t.json", &cfg));
  CHECK_EQ_INT(cfg.train_batch_size, 24);
  td_train_config_defaults(&cfg);
  snprintf(text, sizeof text, "{%s, \"min_time\": 20}}", block);
  CHECK_MSG(td_train_config_parse_json(text, "t.json", &cfg), TD_ERR_INVALID_ARGUMENT, "min_time");
  snprintf(text, sizeof text, "{%s, \"min_time\": 0}}", block);
  CHECK_OK(td_train_config_parse_json(text, "t.json", &cfg));
  snprintf(text, sizeof text, "{%s, \"version\": 0.2, \"model_parallel_size\": 2}}", block);
  CHECK_MSG(td_train_config_parse_json(text, "t.json", &cfg), TD_ERR_INVALID_ARGUMENT, "no model parallelism");
  snprintf(text, sizeof text, "{%s, \"num_gpus_per_node\": 8}}", block);
  CHECK_MSG(td_train_config_parse_json(text, "t.json", &cfg), TD_ERR_INVALID_ARGUMENT, "scales by process");
  snprintf(text, sizeof text, "{%s, \"max_nodes\": 8}}", block);
  CHECK_MSG(td_train_config_parse_json(text, "t.json", &cfg), TD_ERR_INVALID_ARGUMENT, "not a key of DeepSpeed's");
  td_train_config_defaults(&cfg);
  CHECK_MSG(td_train_config_parse_json("{\"elasticity\": {\"enabled\": true}}", "t.json", &cfg),
            TD_ERR_INVALID_ARGUMENT, "needs max_train_batch_size and micro_batch_sizes");
  td_train_config_defaults(&cfg);
  CHECK_MSG(td_train_config_parse_json("{\"elasticity\": {\"enabled\": true, \"max_train_batch_size\": 4, "
                                       "\"micro_batch_sizes\": [8]}}", "t.json", &cfg),
            TD_ERR_INVALID_ARGUMENT, "at most the maximum batch");
  /* disabled: parsed, the batch untouched */
  td_train_config_defaults(&cfg);
  CHECK_OK(td_train_config_parse_json("{\"train_batch_size\": 64, \"elasticity\": {\"enabled\": false}}", "t.json", &cfg));
  CHECK_EQ_INT(cfg.train_batch_size, 64);
  CHECK_EQ_INT(cfg.elasticity.enabled, 0);
}

/* ---- el_rep_buddies on every host layout of 1..8 ranks ---- */

/* Checks one layout against what a buddy map must give, computed here
 * from the layout alone: a rank's copy is never on itself, off its host
 * whenever there is another host, and no rank keeps more copies than the
 * layout forces (ceil(L / (world - L)) when one host holds L > world / 2
 * ranks, else exactly one each); and the exchange (each rank's operations
 * in the senders' order, a transfer done when both ends reach it) runs to
 * the end. Returns the number of cross-host copies. */
static int check_buddies(const int *host_of, int world, const char *name) {
  int buddy[16], wards[16] = {0}, host_size[16] = {0};
  for (int i = 0; i < 16; i++) buddy[i] = -7;
  el_rep_buddies(host_of, world, buddy);
  if (world == 1) {
    CHECK_EQ_INT(buddy[0], -1);
    return 0;
  }
  int n_hosts = 0, largest = 0;
  for (int i = 0; i < world; i++) {
    if (host_size[host_of[i]]++ == 0) n_hosts++;
    if (host_size[host_of[i]] > largest) largest = host_size[host_of[i]];
  }
  int cross = 0;
  for (int i = 0; i < world; i++) {
    if (buddy[i] < 0 || buddy[i] >= world || buddy[i] == i)
      td_test_fail(__FILE__, __LINE__, "%s: rank %d's buddy is %d", name, i, buddy[i]);
    if (n_hosts > 1 && host_of[buddy[i]] == host_of[i])
      td_test_fail(__FILE__, __LINE__, "%s: rank %d's buddy %d is on its own host although there are %d hosts", name,
                   i, buddy[i], n_hosts);
    cross += host_of[buddy[i]] != host_of[i];
    wards[buddy[i]]++;
  }
  int most = 0;
  for (int i = 0; i < world; i++) most = wards[i] > most ? wards[i] : most;
  int want = 2 * largest > world && n_hosts > 1 ? (largest + (world - largest) - 1) / (world - largest) : 1;
  if (most != want)
    td_test_fail(__FILE__, __LINE__, "%s: a rank keeps %d copies, the layout needs at most %d", name, most, want);
  if (want == 1)
    for (int i = 0; i < world; i++) CHECK_EQ_INT(wards[i], 1); /* a permutation */
  /* The exchange: rank q's operations are, for j = 0..world-1, "send to
   * buddy" when j == q and "receive from j" when buddy[j] == q. */
  int next[16] = {0}, done = 0;
  for (bool moved = true; moved;) {
    moved = false;
    for (int j = 0; j < world; j++) {
      /* transfer j -> buddy[j] is ready when it is both ends' next operation */
      int b = buddy[j], op_j = -1, op_b = -1, n = 0;
      for (int k = 0; k < world; k++) {
        if (k == j || buddy[k] == j) {
          if (n == next[j] && op_j < 0) op_j = k;
          n++;
        }
      }
      n = 0;
      for (int k = 0; k < world; k++)
        if (k == b || buddy[k] == b) {
          if (n == next[b] && op_b < 0) op_b = k;
          n++;
        }
      if (op_j == j && op_b == j) {
        next[j]++;
        next[b]++;
        done++;
        moved = true;
      }
    }
  }
  if (done != world) td_test_fail(__FILE__, __LINE__, "%s: the exchange stops after %d of %d transfers", name, done, world);
  return cross;
}

static void buddy_cases(void) {
  /* Every layout: a restricted growth string names each set partition of
   * the ranks into hosts once (host of rank i <= 1 + the largest before). */
  long layouts = 0;
  for (int world = 1; world <= 8; world++) {
    int h[16] = {0};
    for (;;) {
      char name[64];
      int n = snprintf(name, sizeof name, "world %d hosts", world);
      for (int i = 0; i < world && n < (int)sizeof name - 2; i++) n += snprintf(name + n, sizeof name - (size_t)n, " %d", h[i]);
      check_buddies(h, world, name);
      layouts++;
      int i = world - 1;
      for (; i > 0; i--) {
        int top = 0;
        for (int k = 0; k < i; k++) top = h[k] > top ? h[k] : top;
        if (h[i] <= top) {
          h[i]++;
          break;
        }
        h[i] = 0;
      }
      if (i == 0) break;
      for (int k = i + 1; k < world; k++) h[k] = 0;
    }
  }
  CHECK_EQ_INT(layouts, 1 + 2 + 5 + 15 + 52 + 203 + 877 + 4140); /* Bell numbers 1..8 */
  /* The named layouts, closed form. 2+1 (a 2x2 job after its first loss):
   * both ranks of host 0 keep their copy on rank 2, which keeps its on 0. */
  int b[8];
  const int h11[] = {0, 1}, h21[] = {0, 0, 1}, h31[] = {0, 0, 0, 1}, h221[] = {0, 0, 1, 1, 2}, h4[] = {0, 0, 0, 0};
  el_rep_buddies(h11, 2, b);
  CHECK(b[0] == 1 && b[1] == 0);
  el_rep_buddies(h21, 3, b);
  CHECK(b[0] == 2 && b[1] == 2 && b[2] == 0);
  el_rep_buddies(h31, 4, b);
  CHECK(b[0] == 3 && b[1] == 3 && b[2] == 3 && b[3] == 0);
  el_rep_buddies(h221, 5, b); /* a shift by 2 over the list 0 1 | 2 3 | 4 */
  CHECK(b[0] == 2 && b[1] == 3 && b[2] == 4 && b[3] == 0 && b[4] == 1);
  el_rep_buddies(h4, 4, b);
  CHECK(b[0] == 1 && b[1] == 2 && b[2] == 3 && b[3] == 0);
  /* Interleaved ranks (hosts a b a b a): host a holds 3 of 5. */
  const int hab[] = {0, 1, 0, 1, 0};
  CHECK_EQ_INT(check_buddies(hab, 5, "a b a b a"), 5);
  printf("buddies: %ld host layouts of 1..8 ranks: every copy off its host whenever another host exists, the "
         "fewest copies per rank, the exchange deadlock-free\n",
         layouts);
}

int main(void) {
  buddy_cases();
  choose_cases();
  elasticity_cases();
  printf("el2 units: ok\n");
  return 0;
}
