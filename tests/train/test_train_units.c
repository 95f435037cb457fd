/* Unit tests of the training engine that need no communication: config
 * parsing and its error messages, batch-size resolution, the schedule,
 * optimizers against hand-computed values, clipping, CRC-32, the sampler's
 * properties, gradient accumulation, and checkpoints (round trip, exact
 * resume, corrupt / truncated refusal, crash leftovers) on a world of one
 * with the tiny test model. */
#include "train/core/core.h"

#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/check.h"
#include "tiny_model.h"

static td_status parse(const char *json, td_train_config *cfg) {
  td_train_config_defaults(cfg);
  return td_train_config_parse_json(json, "test.json", cfg);
}

static void test_config_valid(void) {
  td_train_config c;
  CHECK_OK(parse("{\"train_batch_size\": 32, \"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": 2,"
                 " \"train_steps\": 500, \"seed\": 7, \"gradient_clipping\": 1.0, \"steps_per_print\": 5,"
                 " \"threads_per_rank\": 1, \"bucket_bytes\": \"4M\", \"first_bucket_bytes\": 65536,"
                 " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001, \"betas\": [0.8, 0.95],"
                 "   \"eps\": 1e-6, \"weight_decay\": 0.1}},"
                 " \"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {\"warmup_num_steps\": 10,"
                 "   \"total_num_steps\": 400, \"warmup_min_ratio\": 0.1, \"cos_min_ratio\": 0.05}},"
                 " \"checkpoint\": {\"save_dir\": \"/tmp/x\", \"save_every\": 50}}",
                 &c));
  CHECK_EQ_INT(c.train_batch_size, 32);
  CHECK_EQ_INT(c.micro_batch, 4);
  CHECK_EQ_INT(c.grad_accum, 2);
  CHECK_EQ_INT(c.steps, 500);
  CHECK_EQ_INT(c.seed, 7);
  CHECK_CLOSE(c.grad_clip, 1.0, 0, 0);
  CHECK_EQ_INT(c.steps_per_print, 5);
  CHECK_EQ_INT(c.threads, 1);
  CHECK_EQ_INT(c.bucket_bytes, 4 << 20);
  CHECK_EQ_INT(c.first_bucket_bytes, 65536);
  CHECK_EQ_INT(c.optimizer.kind, TD_OPTIMIZER_ADAMW);
  CHECK_CLOSE(c.optimizer.lr, 0.001, 1e-7, 0);
  CHECK_CLOSE(c.optimizer.beta1, 0.8, 1e-7, 0);
  CHECK_CLOSE(c.optimizer.beta2, 0.95, 1e-7, 0);
  CHECK_CLOSE(c.optimizer.eps, 1e-6, 1e-6, 0);
  CHECK_CLOSE(c.optimizer.weight_decay, 0.1, 1e-7, 0);
  CHECK_EQ_INT(c.scheduler.kind, TD_SCHEDULE_WARMUP_COSINE);
  CHECK_EQ_INT(c.scheduler.warmup_steps, 10);
  CHECK_EQ_INT(c.scheduler.total_steps, 400);
  CHECK_CLOSE(c.scheduler.warmup_start_ratio, 0.1, 1e-7, 0);
  CHECK_CLOSE(c.scheduler.min_ratio, 0.05, 1e-7, 0);
  CHECK(strcmp(c.checkpoint_dir, "/tmp/x") == 0);
  CHECK_EQ_INT(c.checkpoint_every, 50);
  CHECK_OK(td_train_config_resolve(&c, 4));

  /* SGD, the per-rank alias and DeepSpeed's absolute WarmupLR bounds. */
  CHECK_OK(parse("{\"train_micro_batch_size_per_rank\": 3, \"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 0.5,"
                 " \"momentum\": 0.9, \"nesterov\": true}}, \"scheduler\": {\"type\": \"WarmupLR\", \"params\": "
                 "{\"warmup_min_lr\": 0.01, \"warmup_max_lr\": 0.1, \"warmup_num_steps\": 5, \"warmup_type\": \"linear\"}}}",
                 &c));
  CHECK_EQ_INT(c.micro_batch, 3);
  CHECK_EQ_INT(c.optimizer.kind, TD_OPTIMIZER_SGD);
  CHECK_CLOSE(c.optimizer.lr, 0.1, 1e-7, 0); /* warmup_max_lr is the peak */
  CHECK_CLOSE(c.optimizer.momentum, 0.9, 1e-7, 0);
  CHECK_EQ_INT(c.optimizer.nesterov, 1);
  CHECK_EQ_INT(c.scheduler.kind, TD_SCHEDULE_WARMUP);
  CHECK_CLOSE(c.scheduler.warmup_start_ratio, 0.1, 1e-6, 0);
  CHECK_OK(td_train_config_resolve(&c, 2));
  CHECK_EQ_INT(c.train_batch_size, 6);
  CHECK_EQ_INT(c.grad_accum, 1);

  /* From a file, and a missing file. */
  char path[] = "/tmp/td-train-cfg-XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  const char *text = "{\n  \"train_batch_size\": 16,\n  \"optimizer\": {\"type\": \"Adam\"}\n}\n";
  CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
  close(fd);
  td_train_config_defaults(&c);
  CHECK_OK(td_train_config_load_json(path, &c));
  CHECK_EQ_INT(c.train_batch_size, 16);
  CHECK_EQ_INT(c.optimizer.kind, TD_OPTIMIZER_ADAMW);
  unlink(path);
  CHECK_MSG(td_train_config_load_json("/nonexistent/ds_config.json", &c), TD_ERR_IO,
            "cannot open config file /nonexistent/ds_config.json");
}

static void test_config_errors(void) {
  td_train_config c;
  CHECK_MSG(parse("{\"optimiser\": {}}", &c), TD_ERR_INVALID_ARGUMENT,
            "test.json: unknown key \"optimiser\"; did you mean \"optimizer\"?");
  CHECK_MSG(parse("{\"train_batch\": 4}", &c), TD_ERR_INVALID_ARGUMENT, "did you mean \"train_batch_size\"?");
  /* "device": the spelling is checked here, the device itself when the rank selects it */
  CHECK_OK(parse("{\"device\": \"cuda:3\"}", &c));
  CHECK(strcmp(c.device, "cuda:3") == 0);
  CHECK_OK(parse("{}", &c));
  CHECK(strcmp(c.device, "") == 0);
  CHECK_MSG(parse("{\"device\": \"gpu\"}", &c), TD_ERR_INVALID_ARGUMENT, "\"device\" must be \"cpu\", \"cuda\" or \"cuda:N\"");
  CHECK_MSG(parse("{\"device\": 1}", &c), TD_ERR_INVALID_ARGUMENT, "\"device\" must be");
  CHECK_MSG(parse("{\"colour\": 4}", &c), TD_ERR_INVALID_ARGUMENT,
            "unknown key \"colour\"; the keys allowed here are \"train_batch_size\"");
  CHECK_MSG(parse("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lrr\": 1}}}", &c), TD_ERR_INVALID_ARGUMENT,
            "unknown key \"lrr\" in optimizer.params (AdamW); did you mean \"lr\"?");
  CHECK_MSG(parse("{\"optimizer\": {\"type\": \"SGD\", \"params\": {\"betas\": [0.9, 0.9]}}}", &c),
            TD_ERR_INVALID_ARGUMENT, "unknown key \"betas\" in optimizer.params (SGD)");
  CHECK_MSG(parse("{\"optimizer\": {\"type\": \"Lion\"}}", &c), TD_ERR_INVALID_ARGUMENT,
            "optimizer type \"Lion\" is not supported; use \"AdamW\" or \"SGD\"");
  CHECK_MSG(parse("{\"optimizer\": {\"params\": {}}}", &c), TD_ERR_INVALID_ARGUMENT, "optimizer needs a \"type\"");
  CHECK_MSG(parse("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"betas\": 0.9}}}", &c), TD_ERR_INVALID_ARGUMENT,
            "betas must be a list of two numbers, e.g. [0.9, 0.999]");
  CHECK_MSG(parse("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": -1}}}", &c), TD_ERR_INVALID_ARGUMENT,
            "optimizer.params.lr is -1; it must be between");
  CHECK_MSG(parse("{\"train_batch_size\": \"32\"}", &c), TD_ERR_INVALID_ARGUMENT,
            "train_batch_size must be a whole number");
  CHECK_MSG(parse("{\"gradient_accumulation_steps\": 2.5}", &c), TD_ERR_INVALID_ARGUMENT,
            "gradient_accumulation_steps must be a whole number");
  CHECK_MSG(parse("{\"train_micro_batch_size_per_gpu\": 2, \"train_micro_batch_size_per_rank\": 2}", &c),
            TD_ERR_INVALID_ARGUMENT, "not both");
  CHECK_MSG(parse("{\"scheduler\": {\"params\": {}}}", &c), TD_ERR_INVALID_ARGUMENT, "scheduler needs a \"type\"");
  CHECK_MSG(parse("{\"scheduler\": {\"type\": \"OneCycle\"}}", &c), TD_ERR_INVALID_ARGUMENT,
            "scheduler type \"OneCycle\" is not supported");
  CHECK_MSG(parse("{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"cos_min_ratio\": 0.1}}}", &c),
            TD_ERR_INVALID_ARGUMENT, "unknown key \"cos_min_ratio\" in scheduler.params (WarmupLR)");
  CHECK_MSG(parse("{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_type\": \"log\"}}}", &c),
            TD_ERR_INVALID_ARGUMENT, "warmup_type \"log\" is not supported");
  CHECK_MSG(parse("{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_min_lr\": 1.0}}}", &c),
            TD_ERR_INVALID_ARGUMENT, "warmup_min_lr 1 is above the peak lr");
  CHECK_MSG(parse("{\"checkpoint\": {\"save_dir\": 3}}", &c), TD_ERR_INVALID_ARGUMENT,
            "checkpoint.save_dir must be a string");
  CHECK_MSG(parse("{\"bucket_bytes\": \"lots\"}", &c), TD_ERR_INVALID_ARGUMENT,
            "bucket_bytes must be a byte count such as 26214400 or \"25M\"");
  CHECK_MSG(parse("{\n  \"seed\": 1,\n  \"steps_per_print\" 5\n}", &c), TD_ERR_INVALID_ARGUMENT,
            "test.json:3:");
  CHECK_OK(parse("{\"fp16\": {\"enabled\": true}}", &c)); /* mixed precision: tests/precision.suite */
  CHECK(c.precision.compute == TD_F16);
  CHECK_OK(parse("{\"zero_optimization\": {\"stage\": 2}}", &c));
  CHECK_EQ_INT(c.zero_stage, 2);
  CHECK_MSG(parse("{\"zero_optimization\": {\"stage\": 4}}", &c), TD_ERR_INVALID_ARGUMENT, "between 0 and 3");
  CHECK_MSG(parse("{\"zero_optimization\": {\"stag\": 1}}", &c), TD_ERR_INVALID_ARGUMENT, "stag");
  CHECK_OK(parse("{\"bf16\": {\"enabled\": false}, \"zero_optimization\": {\"stage\": 0}}", &c));
  CHECK_MSG(parse("[1, 2]", &c), TD_ERR_INVALID_ARGUMENT, "the config must be a JSON object");

  /* A failed parse leaves the config untouched. */
  td_train_config_defaults(&c);
  CHECK_STATUS(td_train_config_parse_json("{\"seed\": 5, \"bogus\": 1}", "x", &c), TD_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(c.seed, 1337);
}

static void test_resolve(void) {
  td_train_config c;
  td_train_config_defaults(&c);
  c.train_batch_size = 64, c.micro_batch = 8, c.grad_accum = 2;
  CHECK_MSG(td_train_config_resolve(&c, 2), TD_ERR_INVALID_ARGUMENT,
            "train_batch_size 64 != 8 (micro) x 2 (accum) x 2 (ranks) = 32: set train_batch_size to 32 or leave it out");
  c.train_batch_size = 32;
  CHECK_OK(td_train_config_resolve(&c, 2));
  /* Derivations, as DeepSpeed does them. */
  td_train_config_defaults(&c);
  c.train_batch_size = 48, c.micro_batch = 4;
  CHECK_OK(td_train_config_resolve(&c, 3));
  CHECK_EQ_INT(c.grad_accum, 4);
  td_train_config_defaults(&c);
  c.train_batch_size = 48, c.grad_accum = 2;
  CHECK_OK(td_train_config_resolve(&c, 4));
  CHECK_EQ_INT(c.micro_batch, 6);
  td_train_config_defaults(&c);
  c.train_batch_size = 12;
  CHECK_OK(td_train_config_resolve(&c, 4));
  CHECK_EQ_INT(c.micro_batch, 3);
  CHECK_EQ_INT(c.grad_accum, 1);
  td_train_config_defaults(&c);
  c.micro_batch = 5, c.grad_accum = 3;
  CHECK_OK(td_train_config_resolve(&c, 2));
  CHECK_EQ_INT(c.train_batch_size, 30);
  td_train_config_defaults(&c);
  CHECK_OK(td_train_config_resolve(&c, 3));
  CHECK_EQ_INT(c.train_batch_size, 3);
  td_train_config_defaults(&c);
  c.train_batch_size = 30, c.micro_batch = 8;
  CHECK_MSG(td_train_config_resolve(&c, 2), TD_ERR_INVALID_ARGUMENT,
            "train_batch_size 30 is not a multiple of 8 (micro) x 2 (ranks) = 16: set train_batch_size to a multiple "
            "of 16 (e.g. 32) or leave it out");
  td_train_config_defaults(&c);
  c.train_batch_size = 10;
  CHECK_MSG(td_train_config_resolve(&c, 4), TD_ERR_INVALID_ARGUMENT, "not a multiple of the 4 ranks");
  td_train_config_defaults(&c);
  c.scheduler.kind = TD_SCHEDULE_WARMUP_COSINE, c.scheduler.warmup_steps = 100, c.scheduler.total_steps = 50;
  CHECK_MSG(td_train_config_resolve(&c, 1), TD_ERR_INVALID_ARGUMENT, "set total_num_steps to at least 100");
  td_train_config_defaults(&c);
  c.optimizer.nesterov = 1;
  c.optimizer.kind = TD_OPTIMIZER_SGD;
  CHECK_MSG(td_train_config_resolve(&c, 1), TD_ERR_INVALID_ARGUMENT, "nesterov needs a momentum");
}

static void test_schedule(void) {
  td_train_config c;
  td_train_config_defaults(&c);
  c.optimizer.lr = 1.0f;
  CHECK_CLOSE(td_train_lr_at(&c, 0), 1.0, 0, 0);
  CHECK_CLOSE(td_train_lr_at(&c, 1000), 1.0, 0, 0);
  c.scheduler = (td_schedule_config){TD_SCHEDULE_WARMUP_COSINE, 10, 110, 0.0f, 0.1f};
  CHECK_CLOSE(td_train_lr_at(&c, 0), 0.1, 1e-6, 0);
  CHECK_CLOSE(td_train_lr_at(&c, 4), 0.5, 1e-6, 0);
  CHECK_CLOSE(td_train_lr_at(&c, 9), 1.0, 1e-6, 0);
  CHECK_CLOSE(td_train_lr_at(&c, 10), 1.0, 1e-6, 0);
  CHECK_CLOSE(td_train_lr_at(&c, 35), 0.8681980515, 1e-6, 0);
  CHECK_CLOSE(td_train_lr_at(&c, 60), 0.55, 1e-6, 0);
  CHECK_CLOSE(td_train_lr_at(&c, 110), 0.1, 1e-6, 0);
  CHECK_CLOSE(td_train_lr_at(&c, 500), 0.1, 1e-6, 0);
  c.scheduler.kind = TD_SCHEDULE_WARMUP_LINEAR;
  CHECK_CLOSE(td_train_lr_at(&c, 35), 0.775, 1e-6, 0);
  CHECK_CLOSE(td_train_lr_at(&c, 60), 0.55, 1e-6, 0);
  c.scheduler.kind = TD_SCHEDULE_WARMUP;
  c.scheduler.warmup_start_ratio = 0.5f;
  CHECK_CLOSE(td_train_lr_at(&c, 0), 0.55, 1e-6, 0);
  CHECK_CLOSE(td_train_lr_at(&c, 60), 1.0, 1e-6, 0);
  /* total_steps 0 falls back to the training length. */
  c.scheduler = (td_schedule_config){TD_SCHEDULE_WARMUP_COSINE, 0, 0, 0.0f, 0.0f};
  c.steps = 100;
  CHECK_CLOSE(td_train_lr_at(&c, 50), 0.5, 1e-6, 0);
}

static void test_optimizers(void) {
  float p = 1.0f, g = 0.5f, buf = 0.0f;
  td_sgd_update(&p, &g, &buf, 1, 0.1f, 0.9f, 0.0f, 0, 1.0f);
  CHECK_CLOSE(p, 0.95, 1e-6, 0);
  td_sgd_update(&p, &g, &buf, 1, 0.1f, 0.9f, 0.0f, 0, 1.0f);
  CHECK_CLOSE(buf, 0.95, 1e-6, 0);
  CHECK_CLOSE(p, 0.855, 1e-6, 0);
  p = 1.0f, buf = 0.0f;
  td_sgd_update(&p, &g, &buf, 1, 0.1f, 0.9f, 0.0f, 1, 1.0f); /* Nesterov: d = g + 0.9*buf = 0.95 */
  CHECK_CLOSE(p, 0.905, 1e-6, 0);
  p = 1.0f;
  td_sgd_update(&p, &g, NULL, 1, 0.1f, 0.0f, 0.1f, 0, 1.0f); /* plain, L2: g' = 0.5 + 0.1 */
  CHECK_CLOSE(p, 0.94, 1e-6, 0);
  p = 1.0f;
  td_sgd_update(&p, &g, NULL, 1, 0.1f, 0.0f, 0.0f, 0, 0.5f); /* clipped gradient */
  CHECK_CLOSE(p, 0.975, 1e-6, 0);

  float m = 0, v = 0;
  p = 1.0f;
  g = 0.5f;
  td_adamw_update(&p, &g, &m, &v, 1, 0.1f, 0.9f, 0.999f, 1e-8f, 0.01f, 1, 1.0f);
  CHECK_CLOSE(m, 0.05, 1e-6, 0);
  CHECK_CLOSE(v, 0.00025, 1e-4, 0); /* 1 - 0.999f is 0.00099998713 in float */
  CHECK_CLOSE(p, 0.899, 1e-6, 0);
  g = -0.25f;
  td_adamw_update(&p, &g, &m, &v, 1, 0.1f, 0.9f, 0.999f, 1e-8f, 0.01f, 2, 1.0f);
  CHECK_CLOSE(p, 0.8714672987, 2e-6, 0);

  /* Norm and clipping (PyTorch's clip_grad_norm_ factor). */
  float gr[5] = {3, 4, 0, 0, 0};
  CHECK_CLOSE(td_l2_norm(gr, 5), 5.0, 1e-12, 0);
  CHECK_CLOSE(td_clip_scale(5.0, 1.0f), 1.0 / (5.0 + 1e-6), 1e-7, 0);
  CHECK_CLOSE(td_clip_scale(5.0, 10.0f), 1.0, 0, 0);
  CHECK_CLOSE(td_clip_scale(5.0, 0.0f), 1.0, 0, 0);
  CHECK_EQ_INT(td_crc32(0, "123456789", 9), 0xCBF43926u);
}

static void test_sampler(void) {
  td_sampler s, s2;
  const size_t n = 37;
  CHECK_OK(td_sampler_init(&s, n, 42));
  CHECK_OK(td_sampler_init(&s2, n, 42));
  /* Every epoch is a permutation of [0, n); epochs differ; same seed, same stream. */
  int seen[37];
  size_t first_epoch[37];
  int same_as_first = 1;
  for (uint64_t e = 0; e < 3; e++) {
    memset(seen, 0, sizeof seen);
    for (size_t i = 0; i < n; i++) {
      size_t idx = td_sampler_index(&s, e * n + i);
      CHECK(idx < n);
      seen[idx]++;
      if (e == 0) first_epoch[i] = idx;
      else if (e == 1 && idx != first_epoch[i]) same_as_first = 0;
    }
    for (size_t i = 0; i < n; i++) CHECK_EQ_INT(seen[i], 1);
  }
  CHECK(!same_as_first);
  for (uint64_t p = 0; p < 3 * n; p += 5) CHECK_EQ_INT(td_sampler_index(&s, p), td_sampler_index(&s2, p));
  td_sampler_free(&s2);
  CHECK_OK(td_sampler_init(&s2, n, 43));
  int differs = 0;
  for (uint64_t p = 0; p < n; p++) differs |= td_sampler_index(&s, p) != td_sampler_index(&s2, p);
  CHECK(differs);
  td_sampler_free(&s2);

  /* World-size invariance: for G = 24 split as (world, micro, accum), the
   * ranks' slices are disjoint and their union is exactly the step's G
   * positions, i.e. the same samples as one rank with the whole batch. */
  const int G = 24;
  const int splits[][3] = {{1, 24, 1}, {2, 12, 1}, {2, 3, 4}, {4, 2, 3}, {8, 3, 1}, {3, 4, 2}};
  for (size_t k = 0; k < TD_ARRAY_SIZE(splits); k++) {
    int world = splits[k][0], micro = splits[k][1], accum = splits[k][2];
    CHECK_EQ_INT(world * micro * accum, G);
    for (uint64_t step = 0; step < 4; step++) {
      uint64_t consumed = step * G;
      int count[24] = {0};
      for (int r = 0; r < world; r++)
        for (int m = 0; m < accum; m++) {
          uint64_t pos = td_sampler_position(consumed, world, r, micro, m);
          for (int i = 0; i < micro; i++) {
            uint64_t q = pos + (uint64_t)i;
            CHECK(q >= consumed && q < consumed + G);
            count[q - consumed]++;
          }
        }
      for (int i = 0; i < G; i++) CHECK_EQ_INT(count[i], 1);
    }
  }
  td_sampler_free(&s);
}

/* ---- trainer on a world of one ---- */

static td_trainer *make_trainer(td_model *model, td_dataset *ds, int micro, int accum, td_optimizer_kind opt,
                                const char *ckpt_dir, long every) {
  td_train_config c;
  td_train_config_defaults(&c);
  c.micro_batch = micro;
  c.grad_accum = accum;
  c.seed = 99;
  c.optimizer.kind = opt;
  c.optimizer.lr = opt == TD_OPTIMIZER_SGD ? 0.1f : 0.01f;
  c.optimizer.momentum = opt == TD_OPTIMIZER_SGD ? 0.9f : 0.0f;
  c.optimizer.weight_decay = 0.01f;
  c.scheduler = (td_schedule_config){TD_SCHEDULE_WARMUP_COSINE, 2, 40, 0.0f, 0.1f};
  c.grad_clip = 5.0f;
  c.threads = 1;
  if (ckpt_dir) td_strlcpy(c.checkpoint_dir, ckpt_dir, sizeof c.checkpoint_dir);
  c.checkpoint_every = every;
  td_trainer *t = NULL;
  CHECK_OK(td_trainer_create(&c, model, ds, NULL, &t));
  tiny_init_params(td_trainer_params_mut(t), 5);
  return t;
}

static int n_traced[4];
static void count_trace(void *ctx, const char *name, double begin, double end) {
  CHECK(end >= begin);
  CHECK(ctx == (void *)n_traced);
  const char *names[4] = {"data", "optimizer", "comm_wait", "checkpoint"};
  for (int i = 0; i < 4; i++)
    if (strcmp(name, names[i]) == 0) n_traced[i]++;
}

static void test_training_and_accumulation(void) {
  td_dataset *ds = tiny_dataset_create(200);
  td_model *m1 = tiny_model_create(), *m2 = tiny_model_create();
  td_trainer *a = make_trainer(m1, ds, 8, 1, TD_OPTIMIZER_ADAMW, NULL, 0);
  td_trainer *b = make_trainer(m2, ds, 2, 4, TD_OPTIMIZER_ADAMW, NULL, 0);
  td_trainer_set_trace(b, count_trace, n_traced);
  CHECK_EQ_INT(td_trainer_steps_per_epoch(a), 25);
  double first = 0, last = 0, eval_before, acc_before, eval_after, acc_after;
  CHECK_OK(td_trainer_evaluate(a, ds, 0, &eval_before, &acc_before));
  for (int s = 0; s < 30; s++) {
    td_step_stats sa, sb;
    CHECK_OK(td_trainer_step(a, &sa));
    CHECK_OK(td_trainer_step(b, &sb));
    /* Same global batch: the same samples and the same mean loss. */
    CHECK_CLOSE(sa.loss, sb.loss, 1e-5, 1e-6);
    CHECK_EQ_INT(sa.step, s + 1);
    CHECK_EQ_INT(sa.samples, 8);
    CHECK_CLOSE(sa.lr, td_train_lr_at(td_trainer_config(a), s), 0, 0);
    CHECK_CLOSE(sa.epoch, (s + 1) * 8 / 200.0, 1e-12, 0);
    if (s == 0) first = sa.loss;
    last = sa.loss;
  }
  CHECK_EQ_INT(n_traced[0], 30 * 4); /* one "data" per micro-step */
  CHECK_EQ_INT(n_traced[1], 30);
  CHECK_EQ_INT(n_traced[2], 0); /* a world of one never communicates */
  const float *pa = td_trainer_params(a), *pb = td_trainer_params(b);
  for (size_t i = 0; i < td_trainer_n_params(a); i++) CHECK_CLOSE(pb[i], pa[i], 1e-4, 1e-5);
  CHECK(last < first);
  CHECK_OK(td_trainer_evaluate(a, ds, 0, &eval_after, &acc_after));
  CHECK(eval_after < eval_before);
  CHECK(acc_after > acc_before);
  CHECK(acc_after >= 0 && acc_after <= 1);
  /* Evaluation on a prefix is the mean over that prefix. */
  double l10, a10;
  CHECK_OK(td_trainer_evaluate(a, ds, 10, &l10, &a10));
  CHECK(fabs(a10 * 10 - round(a10 * 10)) < 1e-9);
  td_trainer_destroy(a);
  td_trainer_destroy(b);
  td_model_destroy(m1);
  td_model_destroy(m2);
  td_dataset_destroy(ds);
}

static void write_bytes(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  CHECK(f != NULL);
  CHECK(fwrite(data, 1, n, f) == n);
  fclose(f);
}

static void test_checkpoints(td_optimizer_kind opt) {
  char root[] = "/tmp/td-train-ckpt-XXXXXX";
  CHECK(mkdtemp(root) != NULL);
  char path[512], path2[600];
  td_dataset *ds = tiny_dataset_create(50); /* 6 steps of 8 cross an epoch boundary */
  td_model *m = tiny_model_create();

  /* Uninterrupted: 8 steps, automatic checkpoint every 4. */
  td_trainer *a = make_trainer(m, ds, 4, 2, opt, root, 4);
  double losses[8];
  for (int s = 0; s < 8; s++) {
    td_step_stats st;
    CHECK_OK(td_trainer_step(a, &st));
    losses[s] = st.loss;
    CHECK_EQ_INT(st.saved, (s + 1) % 4 == 0);
  }
  float *final_params = malloc(sizeof(float) * TINY_N);
  memcpy(final_params, td_trainer_params(a), sizeof(float) * TINY_N);
  td_trainer_destroy(a);
  snprintf(path, sizeof path, "%s/latest", root);
  FILE *f = fopen(path, "r");
  CHECK(f != NULL);
  char latest[64] = {0};
  CHECK(fgets(latest, sizeof latest, f) != NULL);
  fclose(f);
  CHECK(strcmp(latest, "step-8\n") == 0);

  /* Resume from step-4 explicitly: the same losses and parameters, bit for bit. */
  td_trainer *b = make_trainer(m, ds, 4, 2, opt, NULL, 0);
  snprintf(path, sizeof path, "%s/step-4", root);
  CHECK_OK(td_trainer_resume(b, path));
  CHECK_EQ_INT(td_trainer_step_count(b), 4);
  for (int s = 4; s < 8; s++) {
    td_step_stats st;
    CHECK_OK(td_trainer_step(b, &st));
    if (st.loss != losses[s]) td_test_fail(__FILE__, __LINE__, "step %d: resumed loss %.9g != %.9g", s, st.loss, losses[s]);
  }
  CHECK(memcmp(td_trainer_params(b), final_params, sizeof(float) * TINY_N) == 0);
  td_trainer_destroy(b);

  /* A different micro-batch split of the same global batch resumes too (not
   * bit-exact: the summation order differs). */
  td_trainer *c = make_trainer(m, ds, 8, 1, opt, NULL, 0);
  snprintf(path, sizeof path, "%s/step-4", root);
  CHECK_OK(td_trainer_resume(c, path));
  for (int s = 4; s < 8; s++) {
    td_step_stats st;
    CHECK_OK(td_trainer_step(c, &st));
    CHECK_CLOSE(st.loss, losses[s], 1e-5, 1e-6);
  }
  td_trainer_destroy(c);

  /* Crash leftovers: a half-written step-12.tmp and latest.tmp do not
   * disturb resume (which follows `latest`), and a later save of the same
   * step replaces them. */
  snprintf(path, sizeof path, "%s/step-12.tmp", root);
  CHECK(mkdir(path, 0755) == 0);
  snprintf(path2, sizeof path2, "%s/rank-0.bin", path);
  write_bytes(path2, "junk", 4);
  snprintf(path2, sizeof path2, "%s/latest.tmp", root);
  write_bytes(path2, "step-1", 6);
  td_trainer *d = make_trainer(m, ds, 4, 2, opt, NULL, 0);
  CHECK_OK(td_trainer_resume(d, root));
  CHECK_EQ_INT(td_trainer_step_count(d), 8);
  CHECK(memcmp(td_trainer_params(d), final_params, sizeof(float) * TINY_N) == 0);
  for (int s = 0; s < 4; s++) CHECK_OK(td_trainer_step(d, NULL));
  CHECK_OK(td_trainer_save(d, root));
  snprintf(path, sizeof path, "%s/step-12/manifest", root);
  struct stat sb;
  CHECK(stat(path, &sb) == 0);
  snprintf(path, sizeof path, "%s/step-12.tmp", root);
  CHECK(stat(path, &sb) != 0);
  /* Saving the same step again replaces it cleanly. */
  CHECK_OK(td_trainer_save(d, root));
  td_trainer_destroy(d);

  /* Corruption: one flipped byte in a shard. */
  snprintf(path, sizeof path, "%s/step-8/rank-0.bin", root);
  char *data;
  size_t n;
  {
    FILE *g = fopen(path, "rb");
    CHECK(g != NULL);
    fseek(g, 0, SEEK_END);
    n = (size_t)ftell(g);
    fseek(g, 0, SEEK_SET);
    data = malloc(n);
    CHECK(fread(data, 1, n, g) == n);
    fclose(g);
  }
  CHECK_EQ_INT(n, (size_t)TINY_N * 4 * (1 + td_optimizer_n_states(opt)));
  data[n / 2] ^= 0x10;
  write_bytes(path, data, n);
  td_trainer *e = make_trainer(m, ds, 4, 2, opt, NULL, 0);
  snprintf(path2, sizeof path2, "%s/step-8", root);
  CHECK_MSG(td_trainer_resume(e, path2), TD_ERR_IO, "rank-0.bin is corrupt: CRC-32");
  CHECK_EQ_INT(td_trainer_step_count(e), 0); /* left unchanged */
  /* Truncation. */
  data[n / 2] ^= 0x10;
  write_bytes(path, data, n - 100);
  CHECK_MSG(td_trainer_resume(e, path2), TD_ERR_IO, "the checkpoint is truncated");
  write_bytes(path, data, n);
  CHECK_OK(td_trainer_resume(e, path2));
  free(data);
  /* A truncated manifest. */
  snprintf(path, sizeof path, "%s/step-4/manifest", root);
  CHECK(truncate(path, 60) == 0);
  snprintf(path2, sizeof path2, "%s/step-4", root);
  CHECK_MSG(td_trainer_resume(e, path2), TD_ERR_IO, "manifest is truncated or corrupt");
  /* Nothing there. */
  CHECK_MSG(td_trainer_resume(e, "/tmp/td-no-such-checkpoint"), TD_ERR_IO, "no checkpoint in /tmp/td-no-such-checkpoint");
  /* Another optimizer's checkpoint is refused. */
  td_model *m2 = tiny_model_create();
  td_trainer *other = make_trainer(m2, ds, 4, 2, opt == TD_OPTIMIZER_SGD ? TD_OPTIMIZER_ADAMW : TD_OPTIMIZER_SGD, NULL, 0);
  CHECK_MSG(td_trainer_resume(other, root), TD_ERR_INVALID_ARGUMENT, "use the same optimizer type");
  td_trainer_destroy(other);
  td_model_destroy(m2);
  td_trainer_destroy(e);
  free(final_params);
  td_model_destroy(m);
  td_dataset_destroy(ds);
  snprintf(path, sizeof path, "rm -rf '%s'", root);
  CHECK(system(path) == 0);
}

int main(void) {
  test_config_valid();
  test_config_errors();
  test_resolve();
  test_schedule();
  test_optimizers();
  test_sampler();
  test_training_and_accumulation();
  test_checkpoints(TD_OPTIMIZER_ADAMW);
  test_checkpoints(TD_OPTIMIZER_SGD);
  printf("train units: ok\n");
  return 0;
}
