/* ZeRO stages 2 and 3 on huge-page granules (src/train/zero/pages.c), run
 * under tandemrun on 2-3 ranks:
 *
 *   test_zperf huge
 *       A GPT large enough that each rank's shard spans several 2 MiB huge
 *       pages (6 layers, 384 channels: 10.7M parameters), so stage 2's
 *       gradient arena and stage 3's parameter arena give memory back in
 *       huge granules. Trainers at stages 0, 2 and 3 step in lockstep:
 *         - every step's loss and gradient norm, and the parameters after it
 *           (stage 3: gathered), equal stage 0's BIT FOR BIT;
 *         - the model-state bytes each rank measures are at least the ZeRO
 *           formula (4Ψ + 12Ψ/N, 16Ψ/N, computed here) and at most the
 *           estimate, and stage 3 holds less than stage 2, which holds less
 *           than stage 0 (the savings survive the coarser granule);
 *         - the page faults of a steady-state step (getrusage, around that
 *           trainer's step alone) at stages 2 and 3 exceed stage 0's by
 *           less than an eighth of the 4 KiB pages outside the shard. With
 *           4 KiB granules every one of those pages faults again each step
 *           (the gradients at stage 2, parameters and gradients at 3), so
 *           this fails without huge granules.
 *       The granule is 2 MiB where the system has transparent huge pages
 *       (sysfs, read here) and TANDEM_ZERO_HUGE_PAGES is not "off"; a
 *       trainer that then uses 4 KiB granules fails the test. With 4 KiB
 *       granules (no THP, or "off": tests/zperf.suite runs both) the memory
 *       checks are the same, and the fault check is the reverse one: at
 *       least half of the pages outside the shard fault again each step,
 *       which shows that they are given back (nothing is skipped).
 *   test_zperf units
 *       TANDEM_ZERO_HUGE_PAGES: a bad value fails trainer creation and the
 *       estimate naming the variable; "off" keeps 4 KiB granules.
 *       Optimizer-state shards (zero_state_alloc): zeroed, and on huge pages
 *       where THP is on: allocating 8 MiB costs fewer than 512 page faults
 *       (about 3, not under ASan, whose allocator keeps its own pages),
 *       against at least 1024 (one per 4 KiB) with
 *       TANDEM_ZERO_HUGE_PAGES=off. */
#include "train/core/core.h"
#include "train/zero/zero.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "../common/check.h"

enum { T_SEQ = 17, G = 6, STEPS = 4 };

static td_dataset *text_dataset(void) {
  return td_test_text_dataset("pack my box with five dozen liquor jugs! ", 5, T_SEQ, 120, NULL);
}

static td_model *gpt(int layers, int channels, int heads) { return td_test_byte_gpt(layers, channels, heads, T_SEQ); }

static void config(td_train_config *c, int world, int stage) {
  td_train_config_defaults(c);
  c->train_batch_size = G;
  c->micro_batch = G / world;
  c->seed = 11;
  c->optimizer.kind = TD_OPTIMIZER_ADAMW;
  c->optimizer.lr = 3e-3f;
  c->optimizer.weight_decay = 0.01f;
  c->grad_clip = 0.5f;
  c->threads = 1;
  c->first_bucket_bytes = 1u << 20; /* several buckets, crossing shard and granule boundaries */
  c->bucket_bytes = 6u << 20;
  c->zero_stage = stage;
  /* groups are given back as soon as released: granules come and go within the step */
  c->stage3_max_live_parameters = 1;
  c->stage3_param_persistence_threshold = 0;
}

static void run_huge(td_comm *comm) {
  int world = td_comm_size(comm), rank = td_comm_rank(comm);
  const int stages[3] = {0, 2, 3};
  td_dataset *ds = text_dataset();
  td_model *m[3];
  td_trainer *tr[3];
  for (int i = 0; i < 3; i++) {
    m[i] = gpt(6, 384, 6);
    td_train_config c;
    config(&c, world, stages[i]);
    CHECK_OK(td_trainer_create(&c, m[i], ds, comm, &tr[i]));
  }
  size_t n = td_trainer_n_params(tr[0]), off, shard;
  td_shard_range(n, world, rank, &off, &shard);
  size_t psi = n * 4, sh = shard * 4, outside_pages = (psi - sh) / 4096;
  const char *huge_env = getenv("TANDEM_ZERO_HUGE_PAGES");
  const int huge = td_test_thp_on() && world > 1 && !(huge_env && strcmp(huge_env, "off") == 0);
  for (int i = 1; i < 3; i++) CHECK_EQ_INT(tr[i]->zero->granule_floats * sizeof(float), huge ? (size_t)2 << 20 : zero_page_bytes());
  long faults[3] = {0};
  for (int step = 1; step <= STEPS; step++) {
    td_step_stats st[3];
    for (int i = 0; i < 3; i++) {
      long f0 = td_test_minor_faults();
      CHECK_OK(td_trainer_step(tr[i], &st[i]));
      if (step >= 3) faults[i] += td_test_minor_faults() - f0; /* steady state: steps 3.. */
    }
    CHECK_OK(td_trainer_gather_params(tr[2]));
    for (int i = 1; i < 3; i++) {
      if (memcmp(&st[i].loss, &st[0].loss, sizeof(double)) != 0 ||
          memcmp(&st[i].grad_norm, &st[0].grad_norm, sizeof(double)) != 0)
        td_test_fail(__FILE__, __LINE__, "rank %d step %d stage %d: loss %.17g norm %.17g, stage 0: %.17g %.17g", rank,
                     step, stages[i], st[i].loss, st[i].grad_norm, st[0].loss, st[0].grad_norm);
      if (memcmp(td_trainer_params(tr[i]), td_trainer_params(tr[0]), psi) != 0)
        td_test_fail(__FILE__, __LINE__, "rank %d step %d stage %d: parameters differ from stage 0's", rank, step,
                     stages[i]);
    }
    if (rank == 0) printf("step %d loss %.9f norm %.9f: stages 2, 3 equal bit for bit\n", step, st[0].loss,
                          st[0].grad_norm);
  }
  size_t got[3];
  for (int i = 0; i < 3; i++) got[i] = td_trainer_model_state_bytes(tr[i]);
  size_t formula[3] = {4 * psi, psi + 3 * sh, 4 * sh};
  for (int i = 1; i < 3; i++) {
    td_train_config c;
    config(&c, world, stages[i]);
    CHECK_OK(td_train_config_resolve(&c, world));
    td_memory_estimate e;
    CHECK_OK(td_trainer_estimate_memory(m[i], &c, world, stages[i], &e));
    printf("rank %d stage %d: measured %zu bytes, formula %zu, estimate %zu; faults per steady step %ld (stage 0: "
           "%ld; pages outside the shard %zu)\n",
           rank, stages[i], got[i], formula[i], e.model_states, faults[i] / (STEPS - 2), faults[0] / (STEPS - 2),
           outside_pages);
    CHECK(got[i] >= formula[i]);
    CHECK(got[i] <= e.model_states);
    if (huge) CHECK(faults[i] - faults[0] < (long)(outside_pages / 8) * (STEPS - 2));
    else CHECK(faults[i] - faults[0] >= (long)(outside_pages / 2) * (STEPS - 2)); /* given back, faulted again */
  }
  CHECK(got[2] < got[1] && got[1] < got[0]);
  for (int i = 0; i < 3; i++) {
    td_trainer_destroy(tr[i]);
    td_model_destroy(m[i]);
  }
  td_dataset_destroy(ds);
  if (rank == 0) printf("OK: %s granules on %d ranks\n", huge ? "2 MiB" : "4 KiB", world);
}

static void run_units(void) {
  td_dataset *ds = text_dataset();
  td_model *m = gpt(1, 32, 4);
  td_train_config c;
  config(&c, 1, 2);
  CHECK_OK(td_train_config_resolve(&c, 1));
  td_memory_estimate e;
  td_trainer *t = NULL;
  setenv("TANDEM_ZERO_HUGE_PAGES", "yes", 1);
  CHECK_MSG(td_trainer_create(&c, m, ds, NULL, &t), TD_ERR_INVALID_ARGUMENT, "TANDEM_ZERO_HUGE_PAGES=yes");
  CHECK(t == NULL);
  CHECK_MSG(td_trainer_estimate_memory(m, &c, 2, 3, &e), TD_ERR_INVALID_ARGUMENT, "use auto");
  CHECK_OK(td_trainer_estimate_memory(m, &c, 2, 1, &e)); /* stages 0-1 give nothing back: no granule */
  setenv("TANDEM_ZERO_HUGE_PAGES", "off", 1);
  size_t g = 0;
  CHECK_OK(zero_granule_bytes((size_t)1 << 30, 2, &g)); /* a 4 GiB arena: huge if allowed */
  CHECK_EQ_INT(g, zero_page_bytes());
  setenv("TANDEM_ZERO_HUGE_PAGES", "auto", 1);
  CHECK_OK(zero_granule_bytes((size_t)1 << 30, 2, &g));
  CHECK_EQ_INT(g, td_test_thp_on() ? (size_t)2 << 20 : zero_page_bytes());
  CHECK_OK(zero_granule_bytes((size_t)1 << 30, 1, &g)); /* one rank gives nothing back */
  CHECK_EQ_INT(g, zero_page_bytes());
  CHECK_OK(zero_granule_bytes((1u << 21) - 2, 2, &g)); /* shards just under two huge pages */
  CHECK_EQ_INT(g, zero_page_bytes());
  CHECK_OK(zero_granule_bytes(1u << 21, 2, &g)); /* exactly two */
  CHECK_EQ_INT(g, td_test_thp_on() ? (size_t)2 << 20 : zero_page_bytes());
  CHECK_OK(td_trainer_create(&c, m, ds, NULL, &t));
  CHECK_OK(td_trainer_step(t, NULL));
  td_trainer_destroy(t);
  const size_t state_floats = (size_t)2 << 20; /* 8 MiB */
  for (int off = 1; off >= 0; off--) { /* off first: nothing freed yet that the allocator could hand back touched */
    setenv("TANDEM_ZERO_HUGE_PAGES", off ? "off" : "auto", 1);
    float *st = NULL;
    long f0 = td_test_minor_faults();
    CHECK_OK(zero_state_alloc(state_floats, &st));
    long faults = td_test_minor_faults() - f0;
    for (size_t i = 0; i < state_floats; i += 4099) CHECK(st[i] == 0.0f);
    printf("optimizer-state shard of 8 MiB, TANDEM_ZERO_HUGE_PAGES=%s: %ld page faults\n", off ? "off" : "auto",
           faults);
    if (off) CHECK(faults >= 1024);
#ifndef __SANITIZE_ADDRESS__ /* ASan's allocator serves it from its own regions, on 4 KiB pages */
    else if (td_test_thp_on()) CHECK(faults < 512);
#endif
    td_free(st);
  }
  setenv("TANDEM_ZERO_HUGE_PAGES", "sometimes", 1);
  float *bad = NULL;
  CHECK_MSG(zero_state_alloc(16, &bad), TD_ERR_INVALID_ARGUMENT, "TANDEM_ZERO_HUGE_PAGES=sometimes");
  unsetenv("TANDEM_ZERO_HUGE_PAGES");
  td_model_destroy(m);
  td_dataset_destroy(ds);
  printf("OK units\n");
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc >= 2 && strcmp(argv[1], "units") == 0) {
    run_units();
    return 0;
  }
  if (argc < 2 || strcmp(argv[1], "huge") != 0) {
    fprintf(stderr, "usage: %s huge | units\n", argv[0]);
    return 2;
  }
  td_comm *comm = NULL;
  CHECK_OK(td_comm_init(&comm));
  run_huge(comm);
  CHECK_OK(td_comm_finalize(comm));
  td_comm_destroy(comm);
  return 0;
}
