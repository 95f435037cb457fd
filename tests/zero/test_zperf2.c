/* ZeRO at speed, part 2 (src/train/zero/), run under tandemrun:
 *
 *   test_zperf2 keep
 *       Stage 2 on a model whose whole gradient arena fits the buckets
 *       allowed in flight (2 x bucket_bytes) keeps that arena (keep_grads):
 *       with gradient accumulation it equals stage 0 BIT FOR BIT (it
 *       accumulates locally, as stage 0 does); its model-state bytes are
 *       what it keeps (parameters and gradients whole, optimizer state
 *       sharded: 8Ψ + 8Ψ/N here) and equal the estimate exactly; a steady
 *       step faults no more pages than stage 0's (plus 16), where the same
 *       model with small buckets gives its gradients back and faults at
 *       least half of the 4 KiB pages outside its shard every step.
 *   test_zperf2 maxlive
 *       Stage 3's stage3_max_live_parameters bounds the fetched parameters
 *       the model is not using (DeepSpeed's meaning): for caps from 1
 *       parameter to the default, after every fetch and release the cached
 *       ranges hold at most the cap, and the pages resident outside the
 *       shard (mincore, independent of the engine's count) at most the live
 *       ranges plus their edge pages; every step equals stage 0's bit for
 *       bit. Then the case the cap once broke: a range fetched inside a
 *       larger cached one, whose prefetch needs room: the larger range is
 *       in use and must stay (it was evicted, and the model read zeros).
 *   test_zperf2 nested
 *       Stage 3's fetch cache gives back a released range whose span holds
 *       other live ranges: their pages must stay, whatever the order of the
 *       live list (two nested ranges, the higher one first, once lost the
 *       lower one's pages, which read zeros). Two ranges in each rank's
 *       shard span, disjoint or overlapping, fetched in every order, then
 *       the whole arena fetched around them and evicted: every rank reads
 *       the nested ranges equal to stage 0's parameters, and the pages
 *       outside the shard and the live ranges were given back (mincore).
 *   test_zperf2 estimate
 *       The estimate (td_trainer_estimate_memory) against the model-state
 *       bytes a rank measures, at stages 2 and 3 on huge-page granules (a
 *       GPT whose shards span several 2 MiB pages; buckets and
 *       stage3_max_live_parameters small against the shard, as for a large
 *       model): at most the estimate (it is a bound: buckets in flight, the
 *       cache, their edge granules) and, on rank 0 whose shard the estimate
 *       takes, at least 90% of it on 2 ranks (86% on 4: see below).
 *       On 4 KiB granules where there are no transparent huge pages, or
 *       with TANDEM_ZERO_HUGE_PAGES=off (tests/zperf2.suite runs both):
 *       the same bounds, never skipped.
 *   test_zperf2 kill
 *       Stage 3, the last rank dies (SIGKILL) inside its forward's first
 *       fetch, while the others wait for its shard: every other rank's
 *       step fails naming that rank, within the communicator's timeout,
 *       never hangs. Run with `tandemrun --grace` long enough for the
 *       survivors to report (tests/zperf2.suite). */
#include "train/core/core.h"
#include "train/zero/zero.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "../common/check.h"

enum { T_SEQ = 17 };

static td_dataset *text_dataset(void) {
  return td_test_text_dataset("sphinx of black quartz, judge my vow. ", 3, T_SEQ, 240, NULL);
}

static td_model *gpt(int layers, int channels, int heads) { return td_test_byte_gpt(layers, channels, heads, T_SEQ); }

static void config(td_train_config *c, int world, int accum, int stage) {
  td_train_config_defaults(c);
  c->train_batch_size = 12;
  c->grad_accum = accum;
  c->micro_batch = 12 / (world * accum);
  c->seed = 5;
  c->optimizer.kind = TD_OPTIMIZER_ADAMW;
  c->optimizer.lr = 3e-3f;
  c->optimizer.weight_decay = 0.01f;
  c->grad_clip = 0.5f;
  c->threads = 1;
  c->first_bucket_bytes = 4096;
  c->zero_stage = stage;
}

static void same_step(const td_trainer *a, const td_step_stats *sa, const td_trainer *b, const td_step_stats *sb,
                      int rank, int step, const char *what) {
  if (memcmp(&sa->loss, &sb->loss, sizeof(double)) != 0 || memcmp(&sa->grad_norm, &sb->grad_norm, sizeof(double)) != 0)
    td_test_fail(__FILE__, __LINE__, "rank %d step %d %s: loss %.17g norm %.17g, stage 0: %.17g %.17g", rank, step,
                 what, sb->loss, sb->grad_norm, sa->loss, sa->grad_norm);
  if (memcmp(td_trainer_params(a), td_trainer_params(b), td_trainer_n_params(a) * sizeof(float)) != 0)
    td_test_fail(__FILE__, __LINE__, "rank %d step %d %s: parameters differ from stage 0's", rank, step, what);
}

static void run_keep(td_comm *comm) {
  int world = td_comm_size(comm), rank = td_comm_rank(comm);
  td_dataset *ds = text_dataset();
  td_model *m[3];
  td_trainer *tr[3];
  for (int i = 0; i < 3; i++) {
    m[i] = gpt(2, 64, 4);
    td_train_config c;
    config(&c, world, 2, i == 0 ? 0 : 2);
    if (i == 2) c.bucket_bytes = 64 << 10; /* 2 buckets hold less than the arena: given back */
    CHECK_OK(td_trainer_create(&c, m[i], ds, comm, &tr[i]));
  }
  CHECK(tr[1]->zero->keep_grads && !tr[1]->zero->accum_sharded);
  CHECK(!tr[2]->zero->keep_grads && tr[2]->zero->accum_sharded);
  size_t n = td_trainer_n_params(tr[0]), off, shard;
  td_shard_range(n, world, rank, &off, &shard);
  size_t psi = n * 4, sh = shard * 4, outside_pages = (psi - sh) / 4096;
  long faults[3] = {0};
  const int steps = 5;
  for (int step = 1; step <= steps; step++) {
    td_step_stats st[3];
    for (int i = 0; i < 3; i++) {
      long f0 = td_test_minor_faults();
      CHECK_OK(td_trainer_step(tr[i], &st[i]));
      if (step >= 3) faults[i] += td_test_minor_faults() - f0;
    }
    same_step(tr[0], &st[0], tr[1], &st[1], rank, step, "stage 2 keeping its gradients");
  }
  for (int i = 0; i < 3; i++) faults[i] /= steps - 2;
  size_t got[3];
  td_memory_estimate e[3];
  for (int i = 1; i < 3; i++) {
    got[i] = td_trainer_model_state_bytes(tr[i]);
    CHECK_OK(td_trainer_estimate_memory(m[i], td_trainer_config(tr[i]), world, 2, &e[i]));
  }
  printf("rank %d: %zu parameters; stage 2 keeping: %zu bytes (estimate %zu), faults per step %ld; giving back: %zu "
         "bytes (estimate %zu), faults %ld; stage 0 faults %ld; pages outside the shard %zu\n",
         rank, n, got[1], e[1].model_states, faults[1], got[2], e[2].model_states, faults[2], faults[0], outside_pages);
  CHECK_EQ_INT(got[1], 2 * psi + 2 * sh);
  size_t shard0, off0;
  td_shard_range(n, world, 0, &off0, &shard0);
  CHECK_EQ_INT(e[1].model_states, 2 * psi + 2 * shard0 * 4); /* rank 0's shard: the largest */
  if (rank == 0) CHECK_EQ_INT(got[1], e[1].model_states);
  CHECK(got[2] < got[1]);
  CHECK(got[2] <= e[2].model_states + (rank == 0 ? 0 : 4 * 4096));
  CHECK(faults[1] <= faults[0] + 16);
  CHECK(faults[2] >= faults[0] + (long)outside_pages / 2);
  for (int i = 0; i < 3; i++) {
    td_trainer_destroy(tr[i]);
    td_model_destroy(m[i]);
  }
  td_dataset_destroy(ds);
  if (rank == 0) printf("OK: stage 2 keeps its gradient arena on %d ranks\n", world);
}

/* ---- maxlive ---- */

/* A spy between the model and the engine's td_param_access. */
typedef struct spy {
  const td_param_access *inner;
  td_param_access outer;
  td_trainer *t;
  size_t cap, page_floats;
  long calls;
  int kill_rank, kill_step; /* kill: this rank dies in its first fetch of this step */
} spy;

/* floats of the live ranges the model is using, and of those it is not */
static void live_split(const zero_state *z, size_t *used, size_t *cached) {
  *used = *cached = 0;
  for (int i = 0; i < z->n_live; i++) {
    size_t len = z->live[i].hi - z->live[i].lo;
    if (z->live[i].users) *used += len;
    else if (!z->live[i].persistent) *cached += len;
  }
}

static size_t resident_outside_shard(const td_trainer *t, size_t page_floats) {
  size_t n_pages = (t->n_params + page_floats - 1) / page_floats, count = 0;
  unsigned char *vec = malloc(n_pages);
  CHECK(vec != NULL);
  CHECK(mincore((void *)t->params, n_pages * page_floats * sizeof(float), vec) == 0);
  for (size_t p = 0; p < n_pages; p++) {
    size_t lo = p * page_floats, hi = lo + page_floats;
    if ((vec[p] & 1) && !(lo >= t->shard_lo && hi <= t->shard_hi)) count += page_floats;
  }
  free(vec);
  return count;
}

static void spy_check(spy *s, const char *what) {
  const zero_state *z = s->t->zero;
  size_t used, cached;
  live_split(z, &used, &cached);
  /* the cache gives ranges back down to the cap; only in-use and prefetched ranges may push past it */
  if (cached > s->cap)
    td_test_fail(__FILE__, __LINE__, "after %s %ld: %zu cached floats over stage3_max_live_parameters %zu", what,
                 s->calls, cached, s->cap);
  size_t resident = resident_outside_shard(s->t, s->page_floats);
  size_t bound = z->live_floats + (size_t)(2 * z->n_live + 2) * s->page_floats;
  if (resident > bound)
    td_test_fail(__FILE__, __LINE__, "after %s %ld: %zu floats resident outside the shard, live ranges %zu (+ edges: "
                 "%zu): a released range was not given back", what, s->calls, resident, z->live_floats, bound);
}

static const float *spy_fetch(void *ctx, size_t offset, size_t count, size_t next_offset, size_t next_count) {
  spy *s = ctx;
  if (s->kill_step && s->t->step + 1 == s->kill_step && td_comm_rank(s->t->comm) == s->kill_rank) {
    printf("rank %d: dying in the forward of step %d\n", s->kill_rank, s->kill_step);
    fflush(stdout);
    raise(SIGKILL);
  }
  const float *p = s->inner->fetch(s->inner->ctx, offset, count, next_offset, next_count);
  s->calls++;
  if (!s->kill_step) spy_check(s, "fetch");
  return p;
}

static void spy_release(void *ctx, size_t offset, size_t count) {
  spy *s = ctx;
  s->inner->release(s->inner->ctx, offset, count);
  s->calls++;
  if (!s->kill_step) spy_check(s, "release");
}

static void spy_attach(spy *s, td_trainer *t) {
  s->t = t;
  s->inner = t->model->param_access;
  s->outer = (td_param_access){spy_fetch, spy_release, s};
  t->model->param_access = &s->outer;
  s->cap = (size_t)t->cfg.stage3_max_live_parameters;
  s->page_floats = zero_page_bytes() / sizeof(float);
}

/* A range fetched inside a larger cached one; the prefetch named with it
 * needs the cache's room, and the larger range must stay: it is in use. */
static void contained_fetch(td_trainer *t3, const float *reference, int rank) {
  size_t n = t3->n_params, a_hi = 2 * n / 3, b_hi = n / 3;
  t3->cfg.stage3_max_live_parameters = (long)a_hi; /* A fits; A and C do not */
  t3->cfg.stage3_prefetch_bucket_size = (long)n;
  const td_param_access *pa = &t3->zero->access;
  pa->fetch(pa->ctx, 0, a_hi, 0, 0);
  pa->release(pa->ctx, 0, a_hi); /* cached: under the cap */
  CHECK_EQ_INT(t3->zero->n_live, 1);
  const float *p = pa->fetch(pa->ctx, 0, b_hi, a_hi, n - a_hi); /* B inside A, prefetch C */
  CHECK(t3->zero->status == TD_OK);
  for (size_t i = 0; i < b_hi; i++)
    if (memcmp(&p[i], &reference[i], sizeof(float)) != 0)
      td_test_fail(__FILE__, __LINE__, "rank %d: parameter %zu of a range fetched inside a cached one is %.9g, not "
                   "%.9g: the cached range was given back while in use", rank, i, p[i], reference[i]);
  pa->release(pa->ctx, 0, b_hi);
  zero_fetch_reset(t3);
}

static void run_maxlive(td_comm *comm) {
  int world = td_comm_size(comm), rank = td_comm_rank(comm);
  td_dataset *ds = text_dataset();
  td_model *m0 = gpt(4, 48, 4);
  td_train_config c;
  config(&c, world, 1, 0);
  c.bucket_bytes = 16 << 10;
  td_trainer *t0 = NULL;
  CHECK_OK(td_trainer_create(&c, m0, ds, comm, &t0));
  /* one transformer block's parameters: the span of tensors named h0.* */
  size_t h0_lo = 0, h0_hi = 0;
  for (int i = 0; i < m0->n_tensors; i++)
    if (strncmp(m0->tensors[i].name, "h0.", 3) == 0) {
      if (!h0_hi) h0_lo = m0->tensors[i].offset;
      h0_hi = m0->tensors[i].offset + m0->tensors[i].count;
    }
  size_t block = h0_hi - h0_lo;
  CHECK(block > 0);
  size_t wte = m0->tensors[0].count;
  const long caps[5] = {1, (long)block, (long)(wte + block), (long)(2 * block + 100), 1000000000L};
  td_trainer *t3[5];
  td_model *m3[5];
  spy spies[5];
  for (int k = 0; k < 5; k++) {
    m3[k] = gpt(4, 48, 4);
    config(&c, world, 1, 3);
    c.bucket_bytes = 16 << 10;
    c.stage3_max_live_parameters = caps[k];
    c.stage3_prefetch_bucket_size = (long)block;
    c.stage3_param_persistence_threshold = 0;
    CHECK_OK(td_trainer_create(&c, m3[k], ds, comm, &t3[k]));
    memset(&spies[k], 0, sizeof spies[k]);
    spy_attach(&spies[k], t3[k]);
  }
  contained_fetch(t3[0], td_trainer_params(t0), rank);
  t3[0]->cfg.stage3_max_live_parameters = caps[0];
  t3[0]->cfg.stage3_prefetch_bucket_size = (long)block;
  for (int step = 1; step <= 3; step++) {
    td_step_stats s0, s3;
    CHECK_OK(td_trainer_step(t0, &s0));
    for (int k = 0; k < 5; k++) {
      CHECK_OK(td_trainer_step(t3[k], &s3));
      CHECK_OK(td_trainer_gather_params(t3[k]));
      char what[64];
      snprintf(what, sizeof what, "stage 3, max live %ld", caps[k]);
      same_step(t0, &s0, t3[k], &s3, rank, step, what);
    }
  }
  if (rank == 0)
    for (int k = 0; k < 5; k++)
      printf("max live %ld (block %zu): %ld fetches and releases checked\n", caps[k], block, spies[k].calls);
  for (int k = 0; k < 5; k++) {
    td_trainer_destroy(t3[k]);
    td_model_destroy(m3[k]);
  }
  td_trainer_destroy(t0);
  td_model_destroy(m0);
  td_dataset_destroy(ds);
  if (rank == 0) printf("OK: stage3_max_live_parameters bounds the cache on %d ranks\n", world);
}

/* ---- nested ---- */

/* Range k of the four nested ranges in one trial: two in each rank's shard
 * span (so each rank has some outside its own shard, whose pages a release
 * gives back), disjoint or overlapping each other. */
static void nested_range(const td_trainer *t, int overlap, int k, size_t *lo, size_t *hi) {
  size_t off, len;
  td_shard_range(t->n_params, t->world, k / 2 % t->world, &off, &len);
  size_t e = len / 8;
  size_t a = k % 2 ? (overlap ? 3 : 5) : 1;
  *lo = off + a * e;
  *hi = off + (a + (overlap ? 3 : 1)) * e;
}

/* Nested ranges from..3 of a trial hold stage 0's parameters `ref`. */
static void nested_check(const td_trainer *t3, const float *ref, int overlap, int from, const int order[4],
                         const char *released) {
  for (int k = from; k < 4; k++) {
    size_t lo, hi;
    nested_range(t3, overlap, k, &lo, &hi);
    for (size_t i = lo; i < hi; i++)
      if (memcmp(&t3->params[i], &ref[i], sizeof(float)) != 0)
        td_test_fail(__FILE__, __LINE__, "rank %d, %s ranges, fetch order %d%d%d%d: parameter %zu of nested range "
                     "[%zu, %zu) is %.9g, not %.9g: its pages were given back with %s", t3->rank,
                     overlap ? "overlapping" : "disjoint", order[0], order[1], order[2], order[3], i, lo, hi,
                     t3->params[i], ref[i], released);
  }
}

static void run_nested(td_comm *comm) {
  int world = td_comm_size(comm), rank = td_comm_rank(comm);
  CHECK(world >= 2); /* one rank keeps its whole arena: nothing is given back */
  td_dataset *ds = text_dataset();
  td_model *m0 = gpt(4, 48, 4), *m3 = gpt(4, 48, 4);
  td_train_config c;
  config(&c, world, 1, 0);
  td_trainer *t0 = NULL, *t3 = NULL;
  CHECK_OK(td_trainer_create(&c, m0, ds, comm, &t0));
  config(&c, world, 1, 3);
  c.stage3_max_live_parameters = 1; /* a released range is given back at once */
  c.stage3_param_persistence_threshold = 0;
  CHECK_OK(td_trainer_create(&c, m3, ds, comm, &t3));
  const float *ref = td_trainer_params(t0);
  const td_param_access *pa = &t3->zero->access;
  size_t n = t3->n_params, page_floats = zero_page_bytes() / sizeof(float);
  CHECK(n / world / 8 >= 2 * page_floats); /* each nested range spans whole pages */
  long trials = 0;
  for (int overlap = 0; overlap < 2; overlap++)
    for (int perm = 0; perm < 24; perm++) { /* every fetch order of the four */
      int order[4] = {0, 1, 2, 3}, left = perm;
      for (int i = 0; i < 4; i++) { /* perm in the factorial base picks the order */
        int j = i + left % (4 - i);
        left /= 4 - i;
        int tmp = order[i];
        order[i] = order[j];
        order[j] = tmp;
      }
      for (int i = 0; i < 4; i++) {
        size_t lo, hi;
        nested_range(t3, overlap, order[i], &lo, &hi);
        pa->fetch(pa->ctx, lo, hi - lo, 0, 0);
      }
      CHECK_EQ_INT(t3->zero->n_live, 4);
      pa->fetch(pa->ctx, 0, n, 0, 0); /* around them all: a live range of its own */
      CHECK_EQ_INT(t3->zero->n_live, 5);
      pa->release(pa->ctx, 0, n); /* over the cap: given back, the nested four in use */
      CHECK_EQ_INT(t3->zero->n_live, 4);
      CHECK(t3->zero->status == TD_OK);
      nested_check(t3, ref, overlap, 0, order, "the range around them");
      size_t resident = resident_outside_shard(t3, page_floats);
      size_t bound = t3->zero->live_floats + (size_t)(2 * t3->zero->n_live + 2) * page_floats;
      if (resident > bound)
        td_test_fail(__FILE__, __LINE__, "rank %d: %zu floats resident outside the shard, nested ranges %zu (+ "
                     "edges: %zu): the range around them was not given back", rank, resident,
                     t3->zero->live_floats, bound);
      for (int k = 0; k < 4; k++) { /* each given back in turn: the others, overlapping or not, stay */
        size_t lo, hi;
        nested_range(t3, overlap, k, &lo, &hi);
        pa->release(pa->ctx, lo, hi - lo);
        nested_check(t3, ref, overlap, k + 1, order, "another nested range");
      }
      CHECK_EQ_INT(t3->zero->n_live, 0);
      zero_fetch_reset(t3);
      trials++;
    }
  td_trainer_destroy(t3);
  td_trainer_destroy(t0);
  td_model_destroy(m3);
  td_model_destroy(m0);
  td_dataset_destroy(ds);
  if (rank == 0) printf("OK: %ld fetch orders of nested ranges kept their pages on %d ranks\n", trials, world);
}

/* ---- estimate ---- */

enum { EST_LAYERS = 8, EST_C = 512 };

static void run_estimate(td_comm *comm) {
  int world = td_comm_size(comm), rank = td_comm_rank(comm);
  const char *huge_env = getenv("TANDEM_ZERO_HUGE_PAGES");
  const size_t granule = td_test_thp_on() && !(huge_env && strcmp(huge_env, "off") == 0) ? (size_t)2 << 20
                                                                                           : zero_page_bytes();
  td_dataset *ds = text_dataset();
  for (int stage = 2; stage <= 3; stage++) {
    td_model *m = gpt(EST_LAYERS, EST_C, 8);
    td_train_config c;
    config(&c, world, 1, stage);
    c.train_batch_size = world; /* one sample per rank: the memory is the point, not the compute */
    c.micro_batch = 1;
    c.bucket_bytes = 1 << 20;
    size_t block = 12 * EST_C * EST_C + 13 * EST_C;
    c.stage3_max_live_parameters = (long)(3 * block); /* three blocks cached of eight */
    c.stage3_prefetch_bucket_size = (long)block;
    CHECK_OK(td_train_config_resolve(&c, world));
    td_memory_estimate e;
    CHECK_OK(td_trainer_estimate_memory(m, &c, world, stage, &e));
    td_trainer *t = NULL;
    CHECK_OK(td_trainer_create(&c, m, ds, comm, &t));
    CHECK_EQ_INT(t->zero->granule_floats * sizeof(float), granule);
    for (int i = 0; i < 2; i++) CHECK_OK(td_trainer_step(t, NULL)); /* the trainer measures the first two */
    size_t got = td_trainer_model_state_bytes(t), n = t->n_params;
    size_t shard = t->shard_hi - t->shard_lo;
    size_t formula = stage == 2 ? 4 * n + 12 * shard : 16 * shard;
    printf("rank %d stage %d: %zu parameters; measured %zu bytes, estimate %zu (live %zu), formula %zu: measured / "
           "estimate %.3f\n", rank, stage, n, got, e.model_states, e.live, formula, (double)got / e.model_states);
    CHECK(got >= formula);
    CHECK(got <= e.model_states + (rank == 0 ? 0 : 2 * granule));
    /* within 10% on 2 ranks; on 4 the shard is 25 MB and the bound's worst
     * case (two buckets in flight, each with a spilled tensor, and a run's
     * edge granules) weighs 10% of it, reached only when reductions lag:
     * measured 0.90-0.93 here, 0.93 at 12 blocks of 768 (bench/results) */
    if (rank == 0) CHECK(got >= e.model_states - e.model_states / (world <= 2 ? 10 : 7));
    td_trainer_destroy(t);
    td_model_destroy(m);
  }
  td_dataset_destroy(ds);
  if (rank == 0)
    printf("OK: the estimate bounds the measured bytes within %d%% on %d ranks, %zu KiB granules\n",
           world <= 2 ? 10 : 14, world, granule >> 10);
}

/* ---- kill ---- */

static void run_kill(td_comm *comm) {
  int world = td_comm_size(comm), rank = td_comm_rank(comm);
  td_dataset *ds = text_dataset();
  td_model *m = gpt(2, 48, 4);
  td_train_config c;
  config(&c, world, 1, 3);
  td_trainer *t = NULL;
  CHECK_OK(td_trainer_create(&c, m, ds, comm, &t));
  spy s;
  memset(&s, 0, sizeof s);
  spy_attach(&s, t);
  s.kill_rank = world - 1;
  s.kill_step = 2;
  CHECK_OK(td_trainer_step(t, NULL));
  double t0 = td_now();
  td_status st = td_trainer_step(t, NULL);
  double waited = td_now() - t0;
  char expect[32];
  snprintf(expect, sizeof expect, "rank %d", world - 1);
  printf("rank %d: after %.1f s: %s: %s\n", rank, waited, td_status_str(st), td_last_error());
  CHECK(st != TD_OK);
  CHECK(strstr(td_last_error(), expect) != NULL);
  CHECK_EQ_INT(td_trainer_step_count(t), 1);
  printf("OK: rank %d's death at stage 3 failed rank %d's step naming it\n", world - 1, rank);
  fflush(stdout);
  /* the communicator is broken: no finalize (it would wait for the dead rank) */
  _exit(0);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc < 2 || (strcmp(argv[1], "keep") != 0 && strcmp(argv[1], "maxlive") != 0 && strcmp(argv[1], "kill") != 0 &&
                    strcmp(argv[1], "estimate") != 0 && strcmp(argv[1], "nested") != 0)) {
    fprintf(stderr, "usage: %s keep | maxlive | nested | estimate | kill\n", argv[0]);
    return 2;
  }
  td_comm *comm = NULL;
  CHECK_OK(td_comm_init(&comm));
  if (strcmp(argv[1], "keep") == 0) run_keep(comm);
  else if (strcmp(argv[1], "maxlive") == 0) run_maxlive(comm);
  else if (strcmp(argv[1], "nested") == 0) run_nested(comm);
  else if (strcmp(argv[1], "estimate") == 0) run_estimate(comm);
  else run_kill(comm);
  CHECK_OK(td_comm_finalize(comm));
  td_comm_destroy(comm);
  return 0;
}
