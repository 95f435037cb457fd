/* ZeRO stages 1-3 against stage 0, run under tandemrun on 1-4 ranks:
 *
 *   test_zero equal ACCUM OPT TIED [STEPS]
 *       Four trainers on the same ranks, the same global batch and seed, at
 *       stages 0, 1, 2 and 3, step in lockstep. Every step's loss and
 *       gradient norm, and the parameters after it (stage 3: gathered),
 *       must equal stage 0's BIT FOR BIT (zero/reduce.c says why they can).
 *       The GPT has 35 channels and 17 positions, so its parameter count is
 *       odd and divides by none of 2, 3, 4: shards of unequal length.
 *       Gradient clipping is on and active, so the norm from shards matters.
 *       TIED 1: the LM head is wte (reported ready last).
 *       Except with gradient accumulation on 2+ ranks at stages 2-3 when
 *       they accumulate into the shards (zero/reduce.c: the sum's order
 *       changes): there losses and norms within 1e-6 relative of stage 0's,
 *       parameters within 1e-5 of their largest magnitude (AdamW divides
 *       each update by its gradient's size, so rounding differences of small
 *       gradients move parameters more than the loss), and the traffic is a
 *       reduce-scatter per micro-step (ACCUM times stage 0's bytes).
 *   test_zero memory
 *       Per stage, the model-state bytes a rank measures
 *       (td_trainer_model_state_bytes) against the ZeRO formulas computed
 *       here from the parameter count (16Ψ; 8Ψ + 8Ψ/N; 4Ψ + 12Ψ/N; 16Ψ/N
 *       with AdamW) and against td_trainer_estimate_memory: exact at stages
 *       0-1; at stages 2-3 at least the formula, at most the estimate
 *       (formula + live buffers) and within 10% of it; and each stage must
 *       really hold less than the one before.
 *   test_zero fail
 *       At stage 3 (whose forward communicates) one rank cannot deliver a
 *       sample: the step fails on every rank naming it, the step count
 *       stays, and the retried step equals stage 0's bit for bit.
 *   test_zero units
 *       World of one: estimate edge cases (world larger than the parameter
 *       count, SGD's single state), stage 3 refused for a model without
 *       parameter access; td_trainer_create_unbound at stage 3 for each
 *       rank of 3: its shard initialized in place equals the whole-arena
 *       initializer's values, nothing outside it, no step before a rebind. */
#include "train/core/core.h"
#include "train/zero/zero.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <unistd.h>

#include "../common/check.h"
#include "../train/tiny_model.h"

enum { T_SEQ = 17, G = 12 };

/* Fault injection for `fail`: this rank's deliveries fail while armed. */
static int fault_armed;
static td_dataset *text_dataset(void) {
  return td_test_text_dataset("the quick brown fox jumps over the lazy dog. ", 7, T_SEQ, 240, &fault_armed);
}

static td_model *gpt(int layers, int channels, int heads, int tied) {
  td_gpt_config c = {.vocab = 256, .layers = layers, .channels = channels, .heads = heads, .seq = T_SEQ, .tied = tied};
  td_model *m = NULL;
  CHECK_OK(td_gpt_create(&c, &m));
  return m;
}

static void base_config(td_train_config *c, int world, int accum, td_optimizer_kind opt, int stage) {
  td_train_config_defaults(c);
  c->train_batch_size = G;
  c->grad_accum = accum;
  c->micro_batch = G / (world * accum);
  c->seed = 7;
  c->optimizer.kind = opt;
  c->optimizer.lr = opt == TD_OPTIMIZER_SGD ? 0.05f : 3e-3f;
  c->optimizer.momentum = opt == TD_OPTIMIZER_SGD ? 0.9f : 0.0f;
  c->optimizer.weight_decay = 0.01f;
  c->scheduler = (td_schedule_config){TD_SCHEDULE_WARMUP_COSINE, 2, 10, 0.1f, 0.1f};
  c->grad_clip = 0.5f;
  c->threads = 1;
  c->first_bucket_bytes = 512; /* several buckets, some crossing shard boundaries */
  c->bucket_bytes = 4096;
  c->zero_stage = stage;
}

static void run_equal(td_comm *comm, int accum, td_optimizer_kind opt, int tied, int steps) {
  int world = td_comm_size(comm), rank = td_comm_rank(comm);
  CHECK(G % (world * accum) == 0);
  td_dataset *ds = text_dataset();
  td_model *models[4];
  td_trainer *tr[4];
  for (int s = 0; s < 4; s++) {
    models[s] = gpt(2, 35, 5, tied);
    td_train_config c;
    base_config(&c, world, accum, opt, s);
    if (s == 3) { /* some groups persist, a block's range stays cached, others are given back */
      c.stage3_param_persistence_threshold = 2000;
      c.stage3_max_live_parameters = 16000;
    }
    CHECK_OK(td_trainer_create(&c, models[s], ds, comm, &tr[s]));
    CHECK_EQ_INT(td_trainer_zero_stage(tr[s]), s);
  }
  size_t n = td_trainer_n_params(tr[0]);
  if (rank == 0) printf("world %d, %zu parameters (odd: %d), accum %d, tied %d\n", world, n, (int)(n % 2), accum, tied);
  CHECK(n % 2 == 1 && n % 3 != 0);
  int clipped = 0;
  double worst = 0, worst_p = 0; /* largest relative differences (losses and norms, parameters) where bits may differ */
  for (int step = 1; step <= steps; step++) {
    td_step_stats st[4];
    for (int s = 0; s < 4; s++) CHECK_OK(td_trainer_step(tr[s], &st[s]));
    CHECK_OK(td_trainer_gather_params(tr[3]));
    /* only stage 3 fetches parameters; its waits are part of its compute time */
    for (int s = 0; s < 3; s++) CHECK(st[s].fetch_wait_s == 0);
    CHECK(st[3].fetch_wait_s >= 0 && st[3].fetch_wait_s <= st[3].compute_s);
    if (world > 1) CHECK(st[3].fetch_wait_s > 0);
    /* and counts the ranges it broadcast: some every step on several ranks
     * (the cap above gives ranges back), none on one; a prefetch is one of
     * them (whether one fits under the cap depends on the shard sizes; the
     * device's closed-form counts: tests/train/device_zero.sh) */
    for (int s = 0; s < 3; s++) CHECK(st[s].param_fetches == 0 && st[s].param_prefetches == 0);
    CHECK(world > 1 ? st[3].param_fetches > 0 : st[3].param_fetches == 0);
    CHECK(st[3].param_prefetches >= 0 && st[3].param_prefetches <= st[3].param_fetches);
    clipped += st[0].clipped;
    for (int s = 1; s < 4; s++) {
      if (rank == 0 && s == 1)
        printf("step %d loss %.9f norm %.9f buckets %d | stage 2 buckets %d\n", step, st[0].loss, st[0].grad_norm,
               st[0].n_buckets, st[2].n_buckets);
      const int sharded = tr[s]->zero->accum_sharded;
      CHECK_EQ_INT(sharded, s >= 2 && world > 1 && accum > 1); /* the tests' buckets are small: no keep_grads */
      const float *p = td_trainer_params(tr[s]), *q = td_trainer_params(tr[0]);
      if (sharded) {
        double dl = fabs(st[s].loss - st[0].loss) / fabs(st[0].loss);
        double dn = fabs(st[s].grad_norm - st[0].grad_norm) / fabs(st[0].grad_norm);
        float scale = 0, dp = 0;
        for (size_t i = 0; i < n; i++) scale = fmaxf(scale, fabsf(q[i])), dp = fmaxf(dp, fabsf(p[i] - q[i]));
        worst = fmax(worst, fmax(dl, dn));
        worst_p = fmax(worst_p, dp / scale);
        if (!(dl <= 1e-6 && dn <= 1e-6 && dp <= 1e-5f * scale))
          td_test_fail(__FILE__, __LINE__, "rank %d step %d stage %d: loss %.17g norm %.17g (stage 0: %.17g %.17g), "
                       "parameters up to %.3g off (scale %.3g): over 1e-6 relative (parameters 1e-5)", rank, step, s, st[s].loss,
                       st[s].grad_norm, st[0].loss, st[0].grad_norm, dp, scale);
        CHECK_EQ_INT(st[s].comm_bytes, (size_t)accum * st[0].comm_bytes);
        continue;
      }
      if (memcmp(&st[s].loss, &st[0].loss, sizeof(double)) != 0 ||
          memcmp(&st[s].grad_norm, &st[0].grad_norm, sizeof(double)) != 0)
        td_test_fail(__FILE__, __LINE__, "rank %d step %d stage %d: loss %.17g norm %.17g, stage 0: loss %.17g norm %.17g",
                     rank, step, s, st[s].loss, st[s].grad_norm, st[0].loss, st[0].grad_norm);
      for (size_t i = 0; i < n; i++)
        if (memcmp(&p[i], &q[i], sizeof(float)) != 0)
          td_test_fail(__FILE__, __LINE__, "rank %d step %d stage %d: parameter %zu is %.9g, stage 0 has %.9g", rank,
                       step, s, i, p[i], q[i]);
      if (world > 1) CHECK(st[s].n_buckets >= 2);
      CHECK_EQ_INT(st[s].comm_bytes, st[0].comm_bytes);
    }
  }
  CHECK(clipped > 0); /* the clipping path ran */
  /* Evaluation at stage 3 (gathers the arena) equals stage 0's. */
  double l0 = 0, l3 = 0;
  CHECK_OK(td_trainer_evaluate(tr[0], ds, 40, &l0, NULL));
  CHECK_OK(td_trainer_evaluate(tr[3], ds, 40, &l3, NULL));
  if (tr[3]->zero->accum_sharded)
    CHECK(fabs(l3 - l0) <= 1e-6 * fabs(l0));
  else
    CHECK(memcmp(&l0, &l3, sizeof l0) == 0);
  for (int s = 0; s < 4; s++) {
    td_trainer_destroy(tr[s]);
    td_model_destroy(models[s]);
  }
  td_dataset_destroy(ds);
  if (rank == 0 && worst > 0)
    printf("OK: stage 1 bit for bit; stages 2-3 accumulating into shards: losses and norms within %.2g relative of "
           "stage 0, parameters %.2g, over %d steps on %d ranks\n", worst, worst_p, steps, world);
  else if (rank == 0)
    printf("OK: stages 1, 2, 3 equal stage 0 bit for bit over %d steps on %d ranks\n", steps, world);
}

static void run_memory(td_comm *comm) {
  int world = td_comm_size(comm), rank = td_comm_rank(comm);
  td_dataset *ds = text_dataset();
  size_t measured[4] = {0};
  for (int s = 0; s < 4; s++) {
    td_model *m = gpt(4, 128, 4, 0);
    td_train_config c;
    base_config(&c, world, 1, TD_OPTIMIZER_ADAMW, s);
    c.stage3_param_persistence_threshold = 0;
    c.stage3_max_live_parameters = 1; /* nothing cached or prefetched: only the group in use */
    CHECK_OK(td_train_config_resolve(&c, world));
    td_memory_estimate e;
    CHECK_OK(td_trainer_estimate_memory(m, &c, world, s, &e));
    td_trainer *t = NULL;
    CHECK_OK(td_trainer_create(&c, m, ds, comm, &t));
    for (int i = 0; i < 3; i++) CHECK_OK(td_trainer_step(t, NULL));
    size_t n = td_trainer_n_params(t), off, shard;
    td_shard_range(n, world, rank, &off, &shard);
    size_t psi = n * 4, sh = shard * 4;
    /* ZeRO paper, fp32 AdamW: parameters, gradients, 2 moments */
    size_t formula = s == 0 ? 4 * psi : s == 1 ? 2 * psi + 2 * sh : s == 2 ? psi + 3 * sh : 4 * sh;
    size_t got = td_trainer_model_state_bytes(t);
    measured[s] = got;
    size_t shard0, off0;
    td_shard_range(n, world, 0, &off0, &shard0);
    CHECK_EQ_INT(e.shard_params, shard0);
    printf("rank %d stage %d: measured %zu bytes, formula %zu, estimate %zu (live %zu), activations %zu\n", rank, s,
           got, formula, e.model_states, e.live, e.activations);
    CHECK(e.activations > 0);
    if (s <= 1 || world == 1) {
      CHECK_EQ_INT(got, formula);
    } else {
      CHECK(got >= formula);
      CHECK(got <= e.model_states + (rank == 0 ? 0 : 4 * 4096)); /* rank 0's shard is the largest */
      /* The estimate is within 10%; it is rank 0's, and at stage 3 which
       * fetched groups a rank does not own itself varies by rank. */
      if (rank == 0 || s == 2) CHECK(got >= e.model_states - e.model_states / 10);
    }
    td_trainer_destroy(t);
    td_model_destroy(m);
  }
  if (world > 1) /* each stage really holds less */
    for (int s = 1; s < 4; s++) CHECK(measured[s] < measured[s - 1]);
  td_dataset_destroy(ds);
}

/* A sample that rank 1 cannot deliver at stage 3 (whose forward
 * communicates): every rank fails the step naming rank 1, nothing changes,
 * and the retried step equals stage 0's, bit for bit. */
static void run_fail(td_comm *comm) {
  int world = td_comm_size(comm), rank = td_comm_rank(comm);
  td_dataset *ds = text_dataset();
  td_model *m0 = gpt(2, 35, 5, 0), *m3 = gpt(2, 35, 5, 0);
  td_train_config c;
  base_config(&c, world, 1, TD_OPTIMIZER_ADAMW, 0);
  td_trainer *t0 = NULL, *t3 = NULL;
  CHECK_OK(td_trainer_create(&c, m0, ds, comm, &t0));
  c.zero_stage = 3;
  c.stage3_param_persistence_threshold = 0;
  CHECK_OK(td_trainer_create(&c, m3, ds, comm, &t3));
  td_step_stats a, b;
  CHECK_OK(td_trainer_step(t0, &a));
  CHECK_OK(td_trainer_step(t3, &b));
  CHECK(memcmp(&a.loss, &b.loss, sizeof a.loss) == 0);
  fault_armed = rank == world - 1;
  char expect[64];
  snprintf(expect, sizeof expect, "rank %d", world - 1);
  CHECK_MSG(td_trainer_step(t3, &b), TD_ERR_IO, expect);
  CHECK(strstr(td_last_error(), "injected failure") != NULL);
  CHECK_EQ_INT(td_trainer_step_count(t3), 1);
  fault_armed = 0;
  CHECK_OK(td_trainer_step(t0, &a));
  CHECK_OK(td_trainer_step(t3, &b));
  CHECK(memcmp(&a.loss, &b.loss, sizeof a.loss) == 0);
  CHECK_OK(td_trainer_gather_params(t3));
  CHECK(memcmp(td_trainer_params(t0), td_trainer_params(t3), td_trainer_n_params(t0) * sizeof(float)) == 0);
  td_trainer_destroy(t0);
  td_trainer_destroy(t3);
  td_model_destroy(m0);
  td_model_destroy(m3);
  td_dataset_destroy(ds);
  if (rank == 0) printf("OK: a failed sample at stage 3 fails the step on every rank; the retry equals stage 0\n");
}

/* td_trainer_create_unbound (elastic processes): a stage-3 trainer cut for
 * rank r of W holds exactly its shard of the values the whole-arena
 * initializer gives (computed here with td_model_init_params), nothing
 * outside it, refuses to step before it is bound, and bad ranks are
 * refused. Odd parameter count, 3 ranks: shards of unequal length. */
static void run_unbound(void) {
  td_dataset *ds = text_dataset();
  td_model *m = gpt(2, 35, 5, 0);
  size_t n = m->n_params;
  float *ref = calloc(n, sizeof *ref);
  CHECK(ref != NULL);
  td_model_init_params(m, ref, 7);
  td_trainer *t = NULL;
  const int world = 3;
  for (int r = 0; r < world; r++) {
    td_train_config c;
    base_config(&c, world, 1, TD_OPTIMIZER_ADAMW, 3);
    CHECK_OK(td_trainer_create_unbound(&c, m, ds, world, r, &t));
    size_t off, len;
    td_shard_range(n, world, r, &off, &len);
    CHECK(len > 0 && t->shard_lo == off && t->shard_hi == off + len);
    const float *p = td_trainer_params(t);
    CHECK(memcmp(p + off, ref + off, len * sizeof(float)) == 0);
    /* outside the shard: zeros (never written; pages straddling the shard's edges hold it) */
    size_t nonzero = 0;
    for (size_t i = 0; i < n; i++)
      if ((i < off || i >= off + len) && p[i] != 0.0f) nonzero++;
    CHECK_EQ_INT(nonzero, 0);
    CHECK_MSG(td_trainer_step(t, NULL), TD_ERR_INVALID_USAGE, "td_trainer_elastic_rebind");
    td_trainer_destroy(t);
  }
  /* an elastic process does not assume the whole host's memory: it shares
   * it with the host's slots (TANDEM_LOCAL_SIZE, which tandemrun sets) */
  const char *saved_local = getenv("TANDEM_LOCAL_SIZE");
  char *saved = saved_local ? strdup(saved_local) : NULL;
  setenv("TANDEM_MEMORY_LIMIT", "1G", 1);
  for (int slots = 1; slots <= 4; slots += 3) {
    char v[16];
    snprintf(v, sizeof v, "%d", slots);
    setenv("TANDEM_LOCAL_SIZE", v, 1);
    td_train_config c;
    base_config(&c, world, 1, TD_OPTIMIZER_ADAMW, 3);
    CHECK_OK(td_trainer_create_unbound(&c, m, ds, world, 0, &t));
    td_trainer_memory_info mi;
    CHECK_OK(td_trainer_memory(t, &mi));
    if (strncmp(mi.limit_source, "TANDEM_MEMORY_LIMIT", 19) == 0)
      CHECK_EQ_INT(mi.limit_bytes, ((size_t)1 << 30) / (size_t)slots);
    else /* MemAvailable is below 1 GiB here: it binds, divided alike */
      printf("unbound: the memory limit is %s, not TANDEM_MEMORY_LIMIT: the division by slots is not checked\n",
             mi.limit_source);
    td_trainer_destroy(t);
  }
  unsetenv("TANDEM_MEMORY_LIMIT");
  if (saved) setenv("TANDEM_LOCAL_SIZE", saved, 1);
  else unsetenv("TANDEM_LOCAL_SIZE");
  free(saved);
  td_train_config c;
  base_config(&c, world, 1, TD_OPTIMIZER_ADAMW, 3);
  CHECK_MSG(td_trainer_create_unbound(&c, m, ds, world, world, &t), TD_ERR_INVALID_ARGUMENT, "0 <= rank < world");
  CHECK(t == NULL);
  CHECK_STATUS(td_trainer_create_unbound(&c, m, ds, 0, 0, &t), TD_ERR_INVALID_ARGUMENT);
  free(ref);
  td_model_destroy(m);
  td_dataset_destroy(ds);
}

static void run_units(void) {
  td_train_config c;
  base_config(&c, 1, 1, TD_OPTIMIZER_SGD, 1);
  CHECK_OK(td_train_config_resolve(&c, 1));
  td_model *m = tiny_model_create();
  td_memory_estimate e;
  /* more ranks than parameters: rank 0 owns one, others none */
  CHECK_OK(td_trainer_estimate_memory(m, &c, (int)TINY_N + 5, 3, &e));
  CHECK_EQ_INT(e.shard_params, 1);
  CHECK_EQ_INT(e.params, 4);
  CHECK_EQ_INT(e.optimizer, 4); /* SGD: one state */
  CHECK_OK(td_trainer_estimate_memory(m, &c, 1, 0, &e));
  CHECK_EQ_INT(e.model_states, 3 * 4 * TINY_N);
  CHECK_EQ_INT(e.live, 0);
  CHECK_STATUS(td_trainer_estimate_memory(m, &c, 0, 1, &e), TD_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(td_trainer_estimate_memory(m, &c, 2, 4, &e), TD_ERR_INVALID_ARGUMENT);
  td_dataset *ds = tiny_dataset_create(60);
  td_trainer *t = NULL;
  c.zero_stage = 3;
  CHECK_MSG(td_trainer_create(&c, m, ds, NULL, &t), TD_ERR_INVALID_ARGUMENT, "cannot fetch its parameters");
  /* Checkpoints at stage >= 1: tests/ckpt.suite (every world x stage). */
  c.zero_stage = 2;
  CHECK_OK(td_trainer_create(&c, m, ds, NULL, &t));
  tiny_init_params(td_trainer_params_mut(t), 3);
  CHECK_OK(td_trainer_step(t, NULL));
  td_trainer_destroy(t);
  td_dataset_destroy(ds);
  td_model_destroy(m);
  run_unbound();
  printf("OK units\n");
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc >= 2 && strcmp(argv[1], "units") == 0) {
    run_units();
    return 0;
  }
  td_comm *comm = NULL;
  CHECK_OK(td_comm_init(&comm));
  if (argc >= 5 && strcmp(argv[1], "equal") == 0) {
    run_equal(comm, atoi(argv[2]), strcmp(argv[3], "sgd") == 0 ? TD_OPTIMIZER_SGD : TD_OPTIMIZER_ADAMW, atoi(argv[4]),
              argc >= 6 ? atoi(argv[5]) : 6);
  } else if (argc >= 2 && strcmp(argv[1], "fail") == 0) {
    run_fail(comm);
  } else if (argc >= 2 && strcmp(argv[1], "memory") == 0) {
    run_memory(comm);
  } else {
    fprintf(stderr, "usage: %s equal ACCUM sgd|adamw TIED [STEPS] | memory | fail | units\n", argv[0]);
    return 2;
  }
  CHECK_OK(td_comm_finalize(comm));
  td_comm_destroy(comm);
  return 0;
}
