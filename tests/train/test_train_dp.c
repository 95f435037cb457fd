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
 * MODEL: "tiny" (the test MLP), "gpt" (a small src/nn GPT on synthetic
 * text) or "cnn" (the src/nn CNN on synthetic images). OPT: sgd | adamw. */
#include "train/train_impl.h"

#include <stdio.h>
#include <unistd.h>

#include "../common/check.h"
#include "tiny_model.h"

#define G 8 /* global batch */

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

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s equal MODEL ACCUM OPT | resume MODEL DIR | reload MODEL DIR\n", argv[0]);
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
