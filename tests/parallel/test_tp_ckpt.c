/* Tensor-parallel checkpoints against the unsplit GPT (issue 21 item 5).
 *
 *   test_tp_ckpt consolidate TP DIR   (world ranks: data x tensor TP)
 *     A td_gpt_tp_create model starts from the unsplit GPT's initial values
 *     (td_model_init_params of td_gpt_create, the independent reference
 *     here). Saved at step 0 under the layout, the checkpoint must describe
 *     the UNSPLIT model: kind "gpt", its config text and tensor table, and
 *     every parameter equal to the unsplit initializer's bit for bit; its
 *     consolidated safetensors file equals, byte for byte, that of a 1-rank
 *     trainer of td_gpt_create saved at step 0; the optimizer state arenas
 *     tile the unsplit model (zeros at step 0). The vocabulary (57) splits
 *     unevenly over 2, 3 and 4 ranks.
 *   test_tp_ckpt pipeline PP TIED DIR [TP]   (world ranks: data x pipeline PP x tensor TP)
 *     the same for td_gpt_pipeline_create_grid's stages (TIED 1: the last
 *     stage's copy of wte, written by stage 0 only: the checkpoint tiles
 *     exactly; TP > 1: tensor-parallel stages, 3D).
 *   test_tp_ckpt refused DIR          (2 ranks)
 *     a trainer of a tensor-parallel config or model that was not given its
 *     grid refuses to save or resume, saying what to call; td_trainer_set_grid
 *     refuses a model that is not split. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/check.h"
#include "tandem/parallel.h"
#include "train/checkpoint/ckpt.h"

static td_comm *world;

static td_gpt_config test_config(void) {
  return (td_gpt_config){.vocab = 57, .layers = 2, .channels = 24, .heads = 12, .seq = 8};
}

static td_status no_get(const td_dataset *ds, size_t index, void *input, int32_t *targets) {
  (void)ds;
  memset(input, 0, 8 * sizeof(int32_t));
  for (int j = 0; j < 8; j++) targets[j] = (int32_t)((index + (size_t)j) % 57);
  return TD_OK;
}
static void plain_destroy(td_dataset *ds) { free(ds); }
static td_dataset *make_dataset(void) {
  td_dataset *ds = calloc(1, sizeof *ds);
  ds->n_samples = 64;
  ds->input_bytes = 8 * sizeof(int32_t);
  ds->targets_per_sample = 8;
  ds->get = no_get;
  ds->destroy = plain_destroy;
  return ds;
}

static td_trainer *make_trainer(td_model *m, td_dataset *ds, td_comm *comm, int dp, int tp, int pp, int zero_stage) {
  td_train_config c;
  td_train_config_defaults(&c);
  c.micro_batch = 8 / dp;
  c.grad_accum = 1;
  c.seed = 11;
  c.optimizer.kind = TD_OPTIMIZER_ADAMW;
  c.threads = 1;
  c.zero_stage = zero_stage;
  c.tensor_parallel = tp;
  c.pipeline_parallel = pp;
  td_trainer *t = NULL;
  CHECK_OK(td_trainer_create(&c, m, ds, comm, &t));
  return t;
}

static unsigned char *read_all(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) td_test_fail(__FILE__, __LINE__, "cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *buf = malloc((size_t)len + 1);
  CHECK(fread(buf, 1, (size_t)len, f) == (size_t)len);
  fclose(f);
  *n = (size_t)len;
  return buf;
}

/* TP=tp x PP=pp (tied: the last stage's copy of wte) */
static void consolidate(int tp, int pp, int tied, const char *dir) {
  const int rank = td_comm_rank(world);
  td_grid *grid = NULL;
  CHECK_OK(td_grid_create(world, tp, pp, &grid));
  const int dp = td_grid_size(grid, TD_GRID_DATA);
  td_gpt_config cfg = test_config();
  cfg.tied = tied;
  td_dataset *ds = make_dataset();
  td_model *mt = NULL;
  if (pp > 1) {
    td_pipeline_config pc = {0};
    CHECK_OK(td_gpt_pipeline_create_grid(&cfg, &pc, grid, &mt));
  } else {
    CHECK_OK(td_gpt_tp_create(&cfg, grid, &mt));
  }
  td_trainer *t = make_trainer(mt, ds, td_grid_comm(grid, TD_GRID_DATA), dp, tp, pp, dp > 1 ? 1 : 0);
  CHECK_OK(td_trainer_set_grid(t, grid));
  char tp_dir[512], one_dir[512], out_tp[600], out_one[600];
  snprintf(tp_dir, sizeof tp_dir, "%s/tp", dir);
  snprintf(one_dir, sizeof one_dir, "%s/one", dir);
  CHECK_OK(td_trainer_save(t, tp_dir));
  if (rank == 0) {
    td_model *mf = NULL;
    CHECK_OK(td_gpt_create(&cfg, &mf));
    float *want = malloc(mf->n_params * sizeof(float)), *got = malloc(mf->n_params * sizeof(float));
    td_model_init_params(mf, want, 11);
    td_ckpt_dir d;
    CHECK_OK(td_ckpt_open(tp_dir, &d));
    CHECK(strcmp(d.m.kind, "gpt") == 0);
    CHECK(strcmp(d.m.model_config, mf->config) == 0);
    CHECK(d.m.n_params == mf->n_params);
    CHECK(d.m.n_tensors == mf->n_tensors);
    CHECK(d.m.world == td_comm_size(world));
    for (int i = 0; i < mf->n_tensors; i++) {
      CHECK(strcmp(d.m.tensors[i].name, mf->tensors[i].name) == 0);
      CHECK(d.m.tensors[i].offset == mf->tensors[i].offset && d.m.tensors[i].count == mf->tensors[i].count);
    }
    CHECK_OK(td_ckpt_read(&d, TD_CKPT_ARENA_PARAMS, 0, mf->n_params, got));
    for (size_t i = 0; i < mf->n_params; i++)
      if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
        td_test_fail(__FILE__, __LINE__, "TP=%d save: parameter %zu is %.9g, the unsplit initializer's %.9g", tp, i,
                     (double)got[i], (double)want[i]);
    for (int s = 0; s < 2; s++) { /* adamw m and v: every element present once (the parser checks tiling), zero */
      CHECK_OK(td_ckpt_read(&d, TD_CKPT_ARENA_STATE0 + s, 0, mf->n_params, got));
      for (size_t i = 0; i < mf->n_params; i++) CHECK(got[i] == 0.0f);
    }
    snprintf(out_tp, sizeof out_tp, "%s/tp.safetensors", dir);
    CHECK_OK(td_ckpt_consolidate(&d, out_tp));
    td_ckpt_close(&d);
    /* the same model trained by one rank, saved at step 0 */
    td_dataset *ds1 = make_dataset();
    td_trainer *one = make_trainer(mf, ds1, NULL, 1, 1, 1, 0);
    CHECK_OK(td_trainer_save(one, one_dir));
    CHECK_OK(td_ckpt_open(one_dir, &d));
    snprintf(out_one, sizeof out_one, "%s/one.safetensors", dir);
    CHECK_OK(td_ckpt_consolidate(&d, out_one));
    td_ckpt_close(&d);
    size_t na, nb;
    unsigned char *a = read_all(out_tp, &na), *b = read_all(out_one, &nb);
    CHECK(na == nb);
    CHECK(memcmp(a, b, na) == 0);
    printf("tp ckpt consolidate: TP=%d x PP=%d x DP=%d (ZeRO-%d%s) save at step 0 = the unsplit initializer bit for "
           "bit; safetensors equal to a 1-rank save's (%zu bytes)\n", tp, pp, dp, dp > 1 ? 1 : 0, tied ? ", tied" : "",
           na);
    free(a);
    free(b);
    free(want);
    free(got);
    td_trainer_destroy(one);
    td_dataset_destroy(ds1);
    td_model_destroy(mf);
  }
  td_trainer_destroy(t);
  td_model_destroy(mt);
  td_dataset_destroy(ds);
  td_grid_destroy(grid);
}

static void expect_message(td_status st, const char *needle) {
  if (st == TD_OK) td_test_fail(__FILE__, __LINE__, "succeeded; expected an error with \"%s\"", needle);
  if (!strstr(td_last_error(), needle))
    td_test_fail(__FILE__, __LINE__, "error \"%s\" does not say \"%s\"", td_last_error(), needle);
}

static void refused(const char *dir) {
  td_grid *grid = NULL;
  const int n = td_comm_size(world);
  CHECK_OK(td_grid_create(world, n, 1, &grid));
  td_gpt_config cfg = test_config();
  td_dataset *ds = make_dataset();
  td_model *mt = NULL, *mf = NULL;
  CHECK_OK(td_gpt_tp_create(&cfg, grid, &mt));
  CHECK_OK(td_gpt_create(&cfg, &mf));
  td_trainer *t = make_trainer(mt, ds, td_grid_comm(grid, TD_GRID_DATA), 1, n, 1, 0);
  expect_message(td_trainer_save(t, dir), "needs the grid: call td_trainer_set_grid");
  expect_message(td_trainer_resume(t, dir), "needs the grid: call td_trainer_set_grid");
  /* a config that does not say tensor_model_parallel_size: the model's kind does */
  td_trainer *unsaid = make_trainer(mt, ds, td_grid_comm(grid, TD_GRID_DATA), 1, 1, 1, 0);
  expect_message(td_trainer_save(unsaid, dir), "needs the grid: call td_trainer_set_grid");
  td_trainer_destroy(unsaid);
  td_trainer *plain = make_trainer(mf, ds, NULL, 1, 1, 1, 0);
  expect_message(td_trainer_set_grid(plain, grid), "is not split across ranks");
  td_trainer_destroy(plain);
  td_trainer_destroy(t);
  td_model_destroy(mt);
  td_model_destroy(mf);
  td_dataset_destroy(ds);
  td_grid_destroy(grid);
  if (td_comm_rank(world) == 0) printf("tp ckpt refused: ok\n");
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: test_tp_ckpt consolidate TP DIR | pipeline PP TIED DIR [TP] | refused DIR\n");
    return 2;
  }
  CHECK_OK(td_comm_init(&world));
  if (!strcmp(argv[1], "consolidate") && argc >= 4) {
    consolidate(atoi(argv[2]), 1, 0, argv[3]);
  } else if (!strcmp(argv[1], "pipeline") && argc >= 5) {
    consolidate(argc >= 6 ? atoi(argv[5]) : 1, atoi(argv[2]), atoi(argv[3]), argv[4]);
  } else if (!strcmp(argv[1], "refused")) {
    refused(argv[2]);
  } else {
    fprintf(stderr, "test_tp_ckpt: unknown mode %s\n", argv[1]);
    return 2;
  }
  CHECK_OK(td_comm_finalize(world));
  td_comm_destroy(world);
  return 0;
}
