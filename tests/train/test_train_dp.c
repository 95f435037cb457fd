/* Multi-rank tests of the data-parallel engine, run under tandemrun:
 *
 *   test_train_dp equal MODEL ACCUM OPT
 *       N ranks (micro-batch G/(N*ACCUM)) train STEPS steps; every rank also
 *       trains a private world-of-one trainer on the whole global batch G.
 *       Losses and parameters must agree (within float summation noise), and
 *       gradients must have gone through several buckets.
 *   test_train_dp resume MODEL DIR
 *       An uninterrupted run of 6 steps versus 3 steps, save, a fresh trainer
 *       resuming and 3 more steps: the losses must be bit-identical. Then rank
 *       0 alone resumes the N-rank checkpoint on a world of one (shards
 *       reassembled) and must reproduce the losses within summation noise.
 *
 *   test_train_dp reload MODEL DIR
 *       Loads the step-3 checkpoint that `resume` left in DIR (written by a
 *       different number of ranks), trains 3 steps and compares the losses
 *       with an uninterrupted run on this world size (within summation noise).
 *
 *   test_train_dp fail MODEL [det STAGE | zero STAGE]
 *       Injected failures on one rank: a sample the dataset cannot deliver,
 *       a sample whose token makes the model's forward fail (NaN loss), and
 *       a failed allocation when the model is prepared. Each must fail the
 *       step on EVERY rank with a message naming the failing rank and the
 *       reason, leave the parameters bit-identical to a saved copy and the
 *       step count unchanged; the retried step then equals a run that never
 *       failed, bit for bit.
 *
 *   test_train_dp shareddir MODEL DIR
 *       Each rank saves into its own DIR/rank-R (as if every host had a
 *       local disk): refused on every rank, naming the rank that cannot see
 *       rank 0's directory. Then one shared directory works.
 *   test_train_dp ckpt-step MODEL DIR / ckpt-check MODEL DIR
 *       ckpt-step: with no checkpoint in DIR, train 3 steps and save; else
 *       resume, train 2 steps and save (run under TANDEM_CKPT_FAULT_AT to die
 *       part-way). ckpt-check: resume DIR, which must hold step 3 or step 5,
 *       and the next step's loss must equal an uninterrupted run's, exactly.
 *
 * MODEL: "tiny" (the test MLP), "gpt" (a small src/nn GPT on synthetic
 * text) or "cnn" (the src/nn CNN on synthetic images). OPT: sgd | adamw. */
#include "train/core/core.h"

#include <stdio.h>
#include <unistd.h>

#include "../common/check.h"
#include "tiny_model.h"

#define G 8 /* global batch */

static td_comm *comm_of_test;

/* ---- synthetic datasets for the src/nn models ---- */

enum { GPT_T = 16 };

static td_status text_get(const td_dataset *ds, size_t index, void *input, int32_t *targets) {
  (void)ds;
  /* A deterministic byte stream with structure (so the loss falls). */
  int32_t *tok = input;
  for (int j = 0; j <= GPT_T; j++) {
    size_t p = index * GPT_T + (size_t)j;
    int32_t v = (int32_t)("the quick brown fox jumps over the lazy dog. "[(p * 7) % 45]);
    if (j < GPT_T) tok[j] = v;
    if (j > 0) targets[j - 1] = v;
  }
  return TD_OK;
}

static td_status image_get(const td_dataset *ds, size_t index, void *input, int32_t *targets) {
  (void)ds;
  float *x = input;
  int label = (int)(index % 10);
  for (int i = 0; i < 28 * 28; i++) {
    uint64_t s = (uint64_t)(index * 784 + (size_t)i) * 0x9E3779B97F4A7C15ull;
    s ^= s >> 31;
    x[i] = (float)((s >> 40) & 0xFF) / 512.0f + (((i / 28) % 10) == label ? 1.0f : 0.0f);
  }
  targets[0] = label;
  return TD_OK;
}

static void plain_destroy(td_dataset *ds) { free(ds); }

typedef struct model_kit {
  const char *name;
  td_model *(*create)(void);
  td_dataset *(*dataset)(void);
  int custom_init; /* the tiny model is not known to td_model_init_params */
} model_kit;

static td_model *gpt_create(void) {
  td_gpt_config c = {.vocab = 256, .layers = 2, .channels = 32, .heads = 2, .seq = GPT_T};
  td_model *m = NULL;
  CHECK_OK(td_gpt_create(&c, &m));
  return m;
}
static td_dataset *gpt_dataset(void) {
  td_dataset *ds = calloc(1, sizeof *ds);
  ds->n_samples = 100;
  ds->input_bytes = GPT_T * sizeof(int32_t);
  ds->targets_per_sample = GPT_T;
  ds->get = text_get;
  ds->destroy = plain_destroy;
  return ds;
}
static td_model *cnn_create(void) {
  td_cnn_config c = {.channels1 = 4, .channels2 = 8, .hidden = 16, .classes = 10};
  td_model *m = NULL;
  CHECK_OK(td_cnn_create(&c, &m));
  return m;
}
static td_dataset *cnn_dataset(void) {
  td_dataset *ds = calloc(1, sizeof *ds);
  ds->n_samples = 60;
  ds->input_bytes = 28 * 28 * sizeof(float);
  ds->targets_per_sample = 1;
  ds->get = image_get;
  ds->destroy = plain_destroy;
  return ds;
}
static td_dataset *tiny_dataset(void) { return tiny_dataset_create(60); }

static const model_kit kits[] = {
    {"tiny", tiny_model_create, tiny_dataset, 1},
    {"gpt", gpt_create, gpt_dataset, 0},
    {"cnn", cnn_create, cnn_dataset, 0},
};

static const model_kit *find_kit(const char *name) {
  for (size_t i = 0; i < TD_ARRAY_SIZE(kits); i++)
    if (strcmp(kits[i].name, name) == 0) return &kits[i];
  fprintf(stderr, "unknown model %s (tiny, gpt, cnn)\n", name);
  exit(2);
}

/* "fail MODEL det STAGE": the trainers run deterministic reduction at that
 * ZeRO stage (-1: neither), whose exchange streams inside the last backward
 * and so must learn of a failed rank before it (deterministic/). */
static int det_stage = -1;
/* "fail MODEL zero STAGE": plain ZeRO at that stage; stage 3's forward
 * fetches parameters, so a rank whose forward refuses its inputs must be
 * found before it (td_model_ops.check_inputs). */
static int zero_only_stage = -1;

static td_trainer *make(const model_kit *kit, td_model *model, td_dataset *ds, td_comm *comm, int micro, int accum,
                        td_optimizer_kind opt) {
  td_train_config c;
  td_train_config_defaults(&c);
  c.train_batch_size = comm ? G : 0; /* exercise the consistency check on the distributed one */
  c.micro_batch = micro;
  c.grad_accum = accum;
  c.seed = 2024;
  c.optimizer.kind = opt;
  c.optimizer.lr = opt == TD_OPTIMIZER_SGD ? 0.05f : 3e-3f;
  c.optimizer.momentum = opt == TD_OPTIMIZER_SGD ? 0.9f : 0.0f;
  c.optimizer.weight_decay = 0.01f;
  c.scheduler = (td_schedule_config){TD_SCHEDULE_WARMUP_COSINE, 2, 10, 0.1f, 0.1f};
  c.grad_clip = 1.0f;
  c.threads = 1;
  /* Small buckets so that even the tiny model's gradient is cut into several. */
  c.first_bucket_bytes = 256;
  c.bucket_bytes = 1024;
  if (det_stage >= 0) {
    c.deterministic_reduction = 1;
    c.zero_stage = det_stage;
  }
  if (zero_only_stage >= 0) c.zero_stage = zero_only_stage;
  td_trainer *t = NULL;
  CHECK_OK(td_trainer_create(&c, model, ds, comm, &t));
  if (kit->custom_init) tiny_init_params(td_trainer_params_mut(t), 3);
  return t;
}

static td_optimizer_kind parse_opt(const char *s) { return strcmp(s, "sgd") == 0 ? TD_OPTIMIZER_SGD : TD_OPTIMIZER_ADAMW; }

static void run_equal(td_comm *comm, const model_kit *kit, int accum, td_optimizer_kind opt) {
  int world = td_comm_size(comm), rank = td_comm_rank(comm);
  CHECK(G % (world * accum) == 0);
  td_dataset *ds = kit->dataset();
  td_model *md = kit->create(), *mr = kit->create();
  td_trainer *dp = make(kit, md, ds, comm, G / (world * accum), accum, opt);
  td_trainer *ref = make(kit, mr, ds, NULL, G, 1, opt);
  size_t n = td_trainer_n_params(dp);
  /* Parameters start identical (broadcast from rank 0). */
  CHECK(memcmp(td_trainer_params(dp), td_trainer_params(ref), n * sizeof(float)) == 0);
  const int steps = 5;
  for (int s = 0; s < steps; s++) {
    td_step_stats a, b;
    CHECK_OK(td_trainer_step(dp, &a));
    CHECK_OK(td_trainer_step(ref, &b));
    if (rank == 0)
      printf("step %d loss %.7f ref %.7f norm %.6f ref %.6f buckets %d bytes %zu wait %.4fs\n", s + 1, a.loss, b.loss,
             a.grad_norm, b.grad_norm, a.n_buckets, a.comm_bytes, a.comm_wait_s);
    CHECK_CLOSE(a.loss, b.loss, 2e-5, 1e-6);
    CHECK_CLOSE(a.grad_norm, b.grad_norm, 1e-4, 1e-6);
    CHECK_CLOSE(a.lr, b.lr, 0, 0);
    CHECK_EQ_INT(a.samples, G);
    if (world > 1) {
      CHECK(a.n_buckets >= 2);
      CHECK_EQ_INT(a.comm_bytes, n * sizeof(float));
    } else {
      CHECK_EQ_INT(a.n_buckets, 0);
    }
  }
  const float *p = td_trainer_params(dp), *q = td_trainer_params(ref);
  double max_diff = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)p[i] - (double)q[i]);
    if (d > max_diff) max_diff = d;
    CHECK_CLOSE(p[i], q[i], 1e-4, 2e-5);
  }
  /* Every rank ends with the same parameters, bit for bit. */
  float *p0 = malloc(n * sizeof(float));
  memcpy(p0, p, n * sizeof(float));
  CHECK_OK(td_broadcast(p0, n, TD_F32, 0, comm));
  CHECK(memcmp(p0, p, n * sizeof(float)) == 0);
  free(p0);
  if (rank == 0)
    printf("equal %s world %d accum %d %s: %zu params, max |dp - single| = %.3g\n", kit->name, world, accum,
           td_optimizer_name(opt), n, max_diff);
  /* Evaluation split over the ranks equals evaluation on one (an odd count
   * leaves the ranks unequal shares). */
  double loss_dp, acc_dp, loss_ref, acc_ref;
  CHECK_OK(td_trainer_evaluate(dp, ds, 37, &loss_dp, &acc_dp));
  CHECK_OK(td_trainer_evaluate(ref, ds, 37, &loss_ref, &acc_ref));
  CHECK_CLOSE(loss_dp, loss_ref, 1e-4, 1e-6);
  CHECK_CLOSE(acc_dp, acc_ref, 0, 0.03); /* a near-tie can flip one prediction */
  CHECK(acc_dp >= 0 && acc_dp <= 1);
  if (rank == 0) printf("evaluate: loss %.6f accuracy %.4f (single rank %.6f %.4f)\n", loss_dp, acc_dp, loss_ref, acc_ref);
  /* A local failure on the last rank becomes a failure on every rank, and
   * the others' message names it. */
  if (world > 1) {
    td_status mine = rank == world - 1 ? td_error(TD_ERR_IO, "disk on fire") : TD_OK;
    td_status all = td_trainer_agree(dp, mine);
    CHECK_EQ_INT(all, TD_ERR_IO);
    char want[64];
    snprintf(want, sizeof want, "rank %d failed", world - 1);
    if (rank == world - 1) CHECK(strstr(td_last_error(), "disk on fire") != NULL);
    else if (!strstr(td_last_error(), want)) td_test_fail(__FILE__, __LINE__, "message: %s", td_last_error());
    CHECK_OK(td_trainer_agree(dp, TD_OK));
  }
  td_trainer_destroy(dp);
  td_trainer_destroy(ref);
  td_model_destroy(md);
  td_model_destroy(mr);
  td_dataset_destroy(ds);
}

static void run_resume(td_comm *comm, const model_kit *kit, const char *dir) {
  int world = td_comm_size(comm), rank = td_comm_rank(comm);
  int micro = G / world;
  td_dataset *ds = kit->dataset();
  td_model *m = kit->create();
  double losses[6];
  td_trainer *a = make(kit, m, ds, comm, micro, 1, TD_OPTIMIZER_ADAMW);
  for (int s = 0; s < 6; s++) {
    td_step_stats st;
    CHECK_OK(td_trainer_step(a, &st));
    losses[s] = st.loss;
  }
  size_t n = td_trainer_n_params(a);
  float *final_params = malloc(n * sizeof(float));
  memcpy(final_params, td_trainer_params(a), n * sizeof(float));
  td_trainer_destroy(a);

  td_trainer *b = make(kit, m, ds, comm, micro, 1, TD_OPTIMIZER_ADAMW);
  for (int s = 0; s < 3; s++) CHECK_OK(td_trainer_step(b, NULL));
  CHECK_OK(td_trainer_save(b, dir));
  td_trainer_destroy(b);

  td_trainer *c = make(kit, m, ds, comm, micro, 1, TD_OPTIMIZER_ADAMW);
  CHECK_OK(td_trainer_resume(c, dir));
  CHECK_EQ_INT(td_trainer_step_count(c), 3);
  for (int s = 3; s < 6; s++) {
    td_step_stats st;
    CHECK_OK(td_trainer_step(c, &st));
    if (rank == 0) printf("resumed step %d loss %.9f uninterrupted %.9f\n", s + 1, st.loss, losses[s]);
    if (st.loss != losses[s])
      td_test_fail(__FILE__, __LINE__, "step %d: resumed loss %.9g != uninterrupted %.9g", s + 1, st.loss, losses[s]);
  }
  CHECK(memcmp(td_trainer_params(c), final_params, n * sizeof(float)) == 0);
  td_trainer_destroy(c);

  /* Resharding: rank 0 loads the N-rank checkpoint on a world of one. */
  if (rank == 0) {
    td_model *m1 = kit->create();
    td_trainer *d = make(kit, m1, ds, NULL, G, 1, TD_OPTIMIZER_ADAMW);
    CHECK_OK(td_trainer_resume(d, dir));
    for (int s = 3; s < 6; s++) {
      td_step_stats st;
      CHECK_OK(td_trainer_step(d, &st));
      CHECK_CLOSE(st.loss, losses[s], 2e-5, 1e-6);
    }
    printf("resume %s world %d: exact; world-of-one reload within tolerance\n", kit->name, world);
    td_trainer_destroy(d);
    td_model_destroy(m1);
  }
  free(final_params);
  td_model_destroy(m);
  td_dataset_destroy(ds);
}

static void run_reload(td_comm *comm, const model_kit *kit, const char *dir) {
  int world = td_comm_size(comm), rank = td_comm_rank(comm);
  td_dataset *ds = kit->dataset();
  td_model *m = kit->create();
  double losses[6];
  td_trainer *a = make(kit, m, ds, comm, G / world, 1, TD_OPTIMIZER_ADAMW);
  for (int s = 0; s < 6; s++) {
    td_step_stats st;
    CHECK_OK(td_trainer_step(a, &st));
    losses[s] = st.loss;
  }
  td_trainer_destroy(a);
  td_trainer *b = make(kit, m, ds, comm, G / world, 1, TD_OPTIMIZER_ADAMW);
  CHECK_OK(td_trainer_resume(b, dir));
  CHECK_EQ_INT(td_trainer_step_count(b), 3);
  for (int s = 3; s < 6; s++) {
    td_step_stats st;
    CHECK_OK(td_trainer_step(b, &st));
    if (rank == 0) printf("reloaded step %d loss %.9f uninterrupted %.9f\n", s + 1, st.loss, losses[s]);
    CHECK_CLOSE(st.loss, losses[s], 2e-5, 1e-6);
  }
  td_trainer_destroy(b);
  td_model_destroy(m);
  td_dataset_destroy(ds);
}

static void run_shareddir(td_comm *comm, const model_kit *kit, const char *dir) {
  int world = td_comm_size(comm), rank = td_comm_rank(comm);
  td_dataset *ds = kit->dataset();
  td_model *m = kit->create();
  td_trainer *t = make(kit, m, ds, comm, G / world, 1, TD_OPTIMIZER_ADAMW);
  CHECK_OK(td_trainer_step(t, NULL));
  char own[600], shared[600];
  snprintf(own, sizeof own, "%s/rank-%d", dir, rank);
  snprintf(shared, sizeof shared, "%s/shared", dir);
  td_status s = td_trainer_save(t, own);
  if (rank == 0) printf("per-rank directories: %s: %s\n", td_status_str(s), td_last_error());
  CHECK_EQ_INT(s, TD_ERR_IO);
  if (!strstr(td_last_error(), "rank 1 cannot see the checkpoint directory") ||
      !strstr(td_last_error(), "per-host local directories are not supported"))
    td_test_fail(__FILE__, __LINE__, "rank %d: message: %s", rank, td_last_error());
  CHECK_OK(td_trainer_save(t, shared));
  td_trainer *u = make(kit, m, ds, comm, G / world, 1, TD_OPTIMIZER_ADAMW);
  CHECK_OK(td_trainer_resume(u, shared));
  CHECK_EQ_INT(td_trainer_step_count(u), 1);
  CHECK(memcmp(td_trainer_params(u), td_trainer_params(t), td_trainer_n_params(t) * sizeof(float)) == 0);
  td_trainer_destroy(t);
  td_trainer_destroy(u);
  td_model_destroy(m);
  td_dataset_destroy(ds);
}

static void run_ckpt_step(td_comm *comm, const model_kit *kit, const char *dir) {
  int world = td_comm_size(comm);
  td_dataset *ds = kit->dataset();
  td_model *m = kit->create();
  td_trainer *t = make(kit, m, ds, comm, G / world, 1, TD_OPTIMIZER_ADAMW);
  char latest[600];
  snprintf(latest, sizeof latest, "%s/latest", dir);
  int fresh = access(latest, F_OK) != 0;
  if (!fresh) CHECK_OK(td_trainer_resume(t, dir));
  for (int s = 0; s < (fresh ? 3 : 2); s++) CHECK_OK(td_trainer_step(t, NULL));
  CHECK_OK(td_trainer_save(t, dir));
  td_trainer_destroy(t);
  td_model_destroy(m);
  td_dataset_destroy(ds);
}

static void run_ckpt_check(td_comm *comm, const model_kit *kit, const char *dir) {
  int world = td_comm_size(comm), rank = td_comm_rank(comm);
  td_dataset *ds = kit->dataset();
  td_model *m = kit->create();
  td_trainer *t = make(kit, m, ds, comm, G / world, 1, TD_OPTIMIZER_ADAMW);
  CHECK_OK(td_trainer_resume(t, dir));
  long step = td_trainer_step_count(t);
  CHECK(step == 3 || step == 5);
  td_step_stats a, b;
  CHECK_OK(td_trainer_step(t, &a));
  td_trainer *ref = make(kit, m, ds, comm, G / world, 1, TD_OPTIMIZER_ADAMW);
  for (long s = 0; s <= step; s++) CHECK_OK(td_trainer_step(ref, &b));
  if (a.loss != b.loss) td_test_fail(__FILE__, __LINE__, "resumed at step %ld: loss %.9g != %.9g", step, a.loss, b.loss);
  CHECK(memcmp(td_trainer_params(t), td_trainer_params(ref), td_trainer_n_params(t) * sizeof(float)) == 0);
  if (rank == 0) printf("resumed the complete checkpoint of step %ld exactly\n", step);
  td_trainer_destroy(t);
  td_trainer_destroy(ref);
  td_model_destroy(m);
  td_dataset_destroy(ds);
}

/* ---- injected failures ---- */

/* A dataset that wraps another and, on rank fail_rank only, spoils its
 * fail_at-th get: kind 0 reports a read error, kind 1 delivers an
 * out-of-vocabulary token (the GPT's forward then returns NaN). */
typedef struct faulty_dataset {
  td_dataset base;
  td_dataset *inner;
  int rank, fail_rank, kind;
  long calls, fail_at; /* fail_at 0: disarmed */
} faulty_dataset;

static td_status faulty_get(const td_dataset *ds, size_t index, void *input, int32_t *targets) {
  faulty_dataset *f = (faulty_dataset *)ds->impl;
  td_status st = f->inner->get(f->inner, index, input, targets);
  if (st != TD_OK || f->rank != f->fail_rank || f->fail_at == 0 || ++f->calls != f->fail_at) return st;
  f->fail_at = 0; /* one shot: the retried step succeeds */
  if (f->kind == 0) return td_error(TD_ERR_IO, "injected read error in record %zu", index);
  ((int32_t *)input)[3] = 999;
  return TD_OK;
}

/* A model whose next prepare fails on one rank, as an allocation failure would. */
static const td_model_ops *inner_ops;
static td_model_ops prepare_fault_ops;
static int prepare_fault_armed;
static td_status faulty_prepare(td_model *m, int batch) {
  if (prepare_fault_armed) {
    prepare_fault_armed = 0;
    return td_error(TD_ERR_SYSTEM, "injected: out of memory for activations of micro-batch %d", batch);
  }
  return inner_ops->prepare(m, batch);
}

static void expect_failed_step(td_trainer *t, td_status want, int fail_rank, const char *reason) {
  int rank = td_comm_rank(comm_of_test);
  size_t n = td_trainer_n_params(t);
  long steps = td_trainer_step_count(t);
  float *before = malloc(n * sizeof(float));
  memcpy(before, td_trainer_params(t), n * sizeof(float));
  td_step_stats st;
  td_status s = td_trainer_step(t, &st);
  if (rank == 0 || rank == fail_rank) printf("rank %d: failed step: %s: %s\n", rank, td_status_str(s), td_last_error());
  if (s != want) td_test_fail(__FILE__, __LINE__, "rank %d: step returned %s, expected %s (%s)", rank, td_status_str(s),
                              td_status_str(want), td_last_error());
  char who[32];
  snprintf(who, sizeof who, "rank %d", fail_rank);
  if (!strstr(td_last_error(), who) || !strstr(td_last_error(), reason))
    td_test_fail(__FILE__, __LINE__, "rank %d: the message lacks \"%s\" or \"%s\": %s", rank, who, reason,
                 td_last_error());
  CHECK(memcmp(before, td_trainer_params(t), n * sizeof(float)) == 0);
  CHECK_EQ_INT(td_trainer_step_count(t), steps);
  free(before);
}

static void run_fail(td_comm *comm, const model_kit *kit) {
  int world = td_comm_size(comm), rank = td_comm_rank(comm);
  comm_of_test = comm;
  /* micro-batch 2 at least, so that evaluating one sample per rank makes the
   * next step prepare the model again (part 3) */
  const int accum = G / world >= 4 ? 2 : 1, micro = G / (world * accum);
  CHECK(micro >= 2);
  td_dataset *inner = kit->dataset();
  faulty_dataset *f = calloc(1, sizeof *f);
  f->base = *inner;
  f->base.get = faulty_get;
  f->base.destroy = NULL;
  f->base.impl = f;
  f->inner = inner;
  f->rank = rank;
  td_model *md = kit->create(), *mr = kit->create();
  inner_ops = md->ops;
  prepare_fault_ops = *md->ops;
  prepare_fault_ops.prepare = faulty_prepare;
  md->ops = &prepare_fault_ops;
  td_trainer *dp = make(kit, md, &f->base, comm, micro, accum, TD_OPTIMIZER_ADAMW);
  td_trainer *ref = make(kit, mr, inner, comm, micro, accum, TD_OPTIMIZER_ADAMW);
  td_step_stats a, b;
  CHECK_OK(td_trainer_step(dp, &a));
  CHECK_OK(td_trainer_step(ref, &b));
  CHECK(a.loss == b.loss);

  /* 1. The last rank's dataset fails in the second micro-step of step 2
   * (gets per step per rank: micro x accum). */
  f->fail_rank = world - 1;
  f->kind = 0;
  f->calls = 0;
  f->fail_at = micro * accum; /* the last sample of step 2 */
  expect_failed_step(dp, TD_ERR_IO, world - 1, "injected read error in record");
  if (rank == world - 1) CHECK(strstr(td_last_error(), "could not deliver sample") != NULL);
  CHECK_OK(td_trainer_step(dp, &a));
  CHECK_OK(td_trainer_step(ref, &b));
  if (a.loss != b.loss) td_test_fail(__FILE__, __LINE__, "retried step loss %.9g != %.9g", a.loss, b.loss);

  /* 2. A forward that fails (NaN loss) on rank 0, in the first micro-step. */
  if (strcmp(kit->name, "gpt") == 0) {
    f->fail_rank = 0;
    f->kind = 1;
    f->calls = 0;
    f->fail_at = 1;
    expect_failed_step(dp, TD_ERR_INVALID_ARGUMENT, 0, "outside the vocabulary");
    CHECK_OK(td_trainer_step(dp, &a));
    CHECK_OK(td_trainer_step(ref, &b));
    if (a.loss != b.loss) td_test_fail(__FILE__, __LINE__, "retried step loss %.9g != %.9g", a.loss, b.loss);
  }

  /* 3. An allocation failure on rank 1 % world when the step re-prepares
   * the model (evaluating one sample per rank left it sized for one). */
  double loss_e, acc_e;
  CHECK_OK(td_trainer_evaluate(dp, &f->base, (size_t)world, &loss_e, &acc_e));
  prepare_fault_armed = rank == 1 % world;
  expect_failed_step(dp, TD_ERR_SYSTEM, 1 % world, "injected: out of memory for activations");
  CHECK_OK(td_trainer_step(dp, &a));
  CHECK_OK(td_trainer_step(ref, &b));
  if (a.loss != b.loss) td_test_fail(__FILE__, __LINE__, "retried step loss %.9g != %.9g", a.loss, b.loss);
  CHECK(memcmp(td_trainer_params(dp), td_trainer_params(ref), td_trainer_n_params(dp) * sizeof(float)) == 0);

  /* 4. Evaluation: a sample that cannot be delivered fails it on every rank. */
  f->fail_rank = world - 1;
  f->kind = 0;
  f->calls = 0;
  f->fail_at = 2;
  td_status s = td_trainer_evaluate(dp, &f->base, 0, &loss_e, &acc_e);
  CHECK_EQ_INT(s, TD_ERR_IO);
  char who[32];
  snprintf(who, sizeof who, "rank %d", world - 1);
  CHECK(strstr(td_last_error(), who) != NULL && strstr(td_last_error(), "injected read error") != NULL);
  if (rank == 0) printf("fail %s world %d: every rank failed each spoiled step with the rank and reason\n", kit->name, world);

  td_trainer_destroy(dp);
  td_trainer_destroy(ref);
  md->ops = inner_ops;
  td_model_destroy(md);
  td_model_destroy(mr);
  free(f);
  td_dataset_destroy(inner);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s equal MODEL ACCUM OPT | resume MODEL DIR | reload MODEL DIR | fail MODEL [det STAGE | zero STAGE]\n",
            argv[0]);
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  td_comm *comm = NULL;
  CHECK_OK(td_comm_init(&comm));
  const model_kit *kit = find_kit(argv[2]);
  if (strcmp(argv[1], "equal") == 0 && argc >= 5) {
    run_equal(comm, kit, atoi(argv[3]), parse_opt(argv[4]));
  } else if (strcmp(argv[1], "resume") == 0 && argc >= 4) {
    run_resume(comm, kit, argv[3]);
  } else if (strcmp(argv[1], "shareddir") == 0 && argc >= 4) {
    run_shareddir(comm, kit, argv[3]);
  } else if (strcmp(argv[1], "ckpt-step") == 0 && argc >= 4) {
    run_ckpt_step(comm, kit, argv[3]);
  } else if (strcmp(argv[1], "ckpt-check") == 0 && argc >= 4) {
    run_ckpt_check(comm, kit, argv[3]);
  } else if (strcmp(argv[1], "fail") == 0) {
    if (argc >= 5 && strcmp(argv[3], "det") == 0) det_stage = atoi(argv[4]);
    if (argc >= 5 && strcmp(argv[3], "zero") == 0) zero_only_stage = atoi(argv[4]);
    run_fail(comm, kit);
  } else if (strcmp(argv[1], "reload") == 0 && argc >= 4) {
    run_reload(comm, kit, argv[3]);
  } else {
    fprintf(stderr, "bad arguments\n");
    return 2;
  }
  CHECK_OK(td_comm_finalize(comm));
  td_comm_destroy(comm);
  return 0;
}
