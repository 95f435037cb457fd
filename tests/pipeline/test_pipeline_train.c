/* Pipeline-parallel training against the same training without a pipeline
 * (run under tandemrun; the world is laid out by the process grid as
 * data x pipeline):
 *
 *   equal PP SCHEDULE CHUNKS MICRO TIED ZERO CKPT PARTITION [bf16] [big] [steps=N]
 *     (N steps, default 4)
 *     trains a small GPT for a few steps with PP stages and MICRO
 *     micro-batches per step (the gradient accumulation), and, on the same
 *     data-parallel communicator, the whole model with a plain trainer (one
 *     rank's training when the data-parallel group is one rank; ZERO 2
 *     and 3: against the whole model at stage 1, which computes their bits;
 *     at 3 the stage models fetch each group through the pipeline's
 *     td_param_access and the parameters are gathered before the
 *     comparison). Untied:
 *     every step's loss and every parameter after the last step equal the
 *     reference bit for bit (the stages sum in the whole model's order; the
 *     data-parallel average is the same on the same bucketed values). Tied
 *     (trained with SGD): within 1e-5 relative (the wte halves are summed in
 *     another order).
 *   kill VICTIM
 *     PP = world; rank VICTIM SIGKILLs itself in its second step while
 *     activations are in flight; every survivor's step must fail within
 *     seconds with a remote error naming the rank ("kill ok rank R").
 *   refuse
 *     layouts and settings that must be refused, with their messages.
 *
 * TD_TEST_DEVICE=cuda:N (equal, kill): the stages and the reference model
 * compute on that device (td_pipeline_config.device, td_gpt_create_on; the
 * ranks share it), f32, or bf16 with the bf16 option (the stages exchange bf16); the same assertions, the parameters read back
 * from the device. Without a device there the test prints "skipped: no GPU:
 * <why>" and passes, unless TD_TEST_EXPECT_CUDA is set (then it fails). */
#include "../common/check.h"

#include <signal.h>
#include <unistd.h>

#include "tandem/parallel.h"

static const char text[] =
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light.";

static td_device g_dev; /* TD_TEST_DEVICE, or the CPU */

/* n floats of an arena of the trainer's device, on the host (free with free) */
static float *host_copy(const float *arena, size_t n) { return td_test_host_copy(arena, g_dev, n); }

static td_gpt_config gpt_config(int tied) {
  return (td_gpt_config){.vocab = 256, .layers = 4, .channels = 16, .heads = 2, .seq = 8, .tied = tied};
}

static void train_config(td_train_config *cfg, int micro_batches, int zero, int ckpt, long steps) {
  td_train_config_defaults(cfg);
  cfg->optimizer.kind = TD_OPTIMIZER_ADAMW;
  cfg->optimizer.lr = 1e-2f;
  cfg->optimizer.weight_decay = 0.01f;
  cfg->micro_batch = 2;
  cfg->grad_accum = micro_batches;
  cfg->steps = steps;
  cfg->threads = 1;
  cfg->seed = 4242;
  cfg->zero_stage = zero;
  cfg->activation_checkpointing = ckpt;
  cfg->first_bucket_bytes = 4096; /* several buckets at this size */
  cfg->bucket_bytes = 8192;
}

static int find(const td_model *m, const char *name) {
  for (int i = 0; i < m->n_tensors; i++)
    if (!strcmp(m->tensors[i].name, name)) return i;
  return -1;
}

static int mode_equal(int argc, char **argv) {
  CHECK(argc >= 10);
  int pp = atoi(argv[2]), chunks = atoi(argv[4]), micro = atoi(argv[5]), tied = atoi(argv[6]);
  int zero = atoi(argv[7]), ckpt = atoi(argv[8]);
  td_pipeline_config pc = {.schedule = argv[3], .chunks = chunks, .partition = argv[9], .device = g_dev};
  long steps = 4;
  int big = 0, bf16 = 0;
  const char *firsts = NULL; /* first=A,B,..: stage s must start at layer A, B, ... (1F1B) */
  for (int i = 10; i < argc; i++) {
    if (!strcmp(argv[i], "big")) big = 1;
    else if (!strcmp(argv[i], "bf16")) bf16 = 1;
    else if (!strncmp(argv[i], "steps=", 6) && atol(argv[i] + 6) > 1) steps = atol(argv[i] + 6);
    else if (!strncmp(argv[i], "first=", 6)) firsts = argv[i] + 6;
    else
      td_test_fail(__FILE__, __LINE__, "test_pipeline_train equal: unknown option %s (big, bf16, steps=N, first=A,B,..)",
                   argv[i]);
  }
  td_comm *world;
  CHECK_OK(td_comm_init(&world));
  int rank = td_comm_rank(world);
  td_grid *grid;
  CHECK_OK(td_grid_create(world, 1, pp, &grid));
  td_comm *dp = td_grid_comm(grid, TD_GRID_DATA), *pipe = td_grid_comm(grid, TD_GRID_PIPELINE);
  int stage = td_grid_rank(grid, TD_GRID_PIPELINE);
  td_gpt_config gc = gpt_config(tied);
  if (big) gc.channels = 64, gc.seq = 32; /* 64 KiB messages at micro-batch 8: more than a shm slot holds */
  td_dataset *ds = td_test_text_dataset(text, 7, (size_t)gc.seq, 200, NULL);
  td_train_config cfg;
  train_config(&cfg, micro, zero, ckpt, steps);
  if (big) cfg.micro_batch = 8;
  if (bf16) cfg.precision.compute = TD_BF16; /* bf16 products, f32 master */
  /* a device trains with AdamW only: tied there, the losses within 1e-5 and
   * the parameters within 1e-6. The tied wte's gradient is summed in
   * another order (each stage's micro-batches, then the two stages) than
   * the whole model's, and AdamW divides by sqrt(v) + eps: on an element
   * whose gradient is ~0 that turns rounding noise g into a step of about
   * lr g / eps. With eps 1e-8 one element moved 1.4e-4 apart (2026-11-28,
   * after the encoder backward's sum order changed; 3.7e-6 before). eps
   * 1e-3 bounds such a step by lr g / 1e-3: 1e-9 for noise of 1e-10,
   * while the model still trains (the losses are checked to fall). */
  const int adam_tied = tied && g_dev.kind != TD_DEVICE_CPU;
  if (adam_tied) cfg.optimizer.eps = 1e-3f;
  if (tied && !adam_tied) {
    /* SGD: AdamW's normalization turns the rounding differences of the
     * tied wte's sum into lr-sized steps on elements whose gradient is ~0 */
    cfg.optimizer.kind = TD_OPTIMIZER_SGD;
    cfg.optimizer.lr = 0.5f;
    cfg.optimizer.momentum = 0.9f;
  }

  td_model *pm, *whole;
  CHECK_OK(td_pipeline_check(&gc, &pc, pp, micro));
  CHECK_OK(td_gpt_pipeline_create(&gc, &pc, pipe, &pm));
  CHECK_OK(td_gpt_create_on(&gc, g_dev, &whole));
  td_trainer *tp, *tr;
  CHECK_OK(td_trainer_create(&cfg, pm, ds, dp, &tp));
  /* ZeRO-2's reduction to the owners and its sharded update give stage 1's
   * bits (zero/reduce.c), where the whole model at stage 2 would reduce
   * every micro-step into the shards (another order): stage 1 is the
   * reference */
  if (zero >= 2) cfg.zero_stage = 1; /* ZeRO-3 too: its fetches are the owners' exact copies, its update stage 2's */
  CHECK_OK(td_trainer_create(&cfg, whole, ds, dp, &tr));
  CHECK(td_trainer_n_params(tp) < td_trainer_n_params(tr) || pp == 1);
  double first_loss = 0, last_loss = 0;
  for (long s = 0; s < steps; s++) {
    td_step_stats a, b;
    CHECK_OK(td_trainer_step(tp, &a));
    CHECK_OK(td_trainer_step(tr, &b));
    if (tied) {
      CHECK_CLOSE(a.loss, b.loss, 1e-5, 0);
    } else if (memcmp(&a.loss, &b.loss, sizeof a.loss) != 0) {
      td_test_fail(__FILE__, __LINE__, "rank %d stage %d step %ld: pipeline loss %.17g != reference %.17g", rank,
                   stage, s + 1, a.loss, b.loss);
    }
    if (s == 0) first_loss = b.loss;
    last_loss = b.loss;
  }
  CHECK(last_loss < first_loss); /* it trains: the comparison is not between two idle models */
  /* every parameter this stage holds against the whole model's tensor of the same name (ZeRO-3: gathered first) */
  if (zero == 3) CHECK_OK(td_trainer_gather_params(tp));
  float *p = host_copy(td_trainer_params(tp), td_trainer_n_params(tp));
  float *r = host_copy(td_trainer_params(tr), td_trainer_n_params(tr));
  size_t compared = 0;
  double max_diff = 0;
  for (int i = 0; i < pm->n_tensors; i++) {
    const td_param_tensor *t = &pm->tensors[i];
    int w = find(whole, t->name);
    CHECK(w >= 0);
    CHECK_EQ_INT(t->count, whole->tensors[w].count);
    for (size_t k = 0; k < t->count; k++) {
      float x = p[t->offset + k], y = r[whole->tensors[w].offset + k];
      if (fabs((double)x - y) > max_diff) max_diff = fabs((double)x - y);
      if (adam_tied) CHECK_CLOSE(x, y, 1e-5, 1e-6);
      else if (tied) CHECK_CLOSE(x, y, 1e-4, 1e-7);
      else if (memcmp(&x, &y, sizeof x) != 0)
        td_test_fail(__FILE__, __LINE__, "rank %d stage %d: %s[%zu] = %.9g, reference %.9g", rank, stage, t->name, k,
                     x, y);
    }
    compared += t->count;
  }
  free(p);
  free(r);
  td_pipeline_stats ps;
  CHECK_OK(td_gpt_pipeline_stats(pm, &ps));
  CHECK_EQ_INT(ps.steps, steps - 1); /* the first step is warm-up */
  CHECK_EQ_INT(ps.stage, stage);
  CHECK(ps.forward_s > 0 && ps.backward_s > 0 && ps.step_s >= ps.forward_s + ps.backward_s);
  if (firsts) { /* the cut the line names: this stage's first layer, the next stage's or the end its last */
    int want[16], n_want = 0;
    for (const char *q = firsts; *q && n_want < 16; q = *q == ',' ? q + 1 : q) want[n_want++] = (int)strtol(q, (char **)&q, 10);
    CHECK(stage < n_want);
    CHECK_EQ_INT(ps.first_layer[0], want[stage]);
    CHECK_EQ_INT(ps.first_layer[0] + ps.n_layers[0], stage + 1 < n_want ? want[stage + 1] : gc.layers);
  }
  char devname[16];
  td_device_name(g_dev, devname, sizeof devname);
  printf("rank %d stage %d/%d on %s: %zu parameters (%s) equal%s (largest difference %.3g) over %ld steps, loss %.6f -> "
         "%.6f, layers %d-%d\n",
         rank, stage, pp, devname, compared, pm->config, tied ? " within 1e-5" : " bit for bit", max_diff, steps,
         first_loss, last_loss, ps.first_layer[0], ps.first_layer[0] + ps.n_layers[0]);
  td_trainer_destroy(tp);
  td_trainer_destroy(tr);
  td_model_destroy(pm);
  td_model_destroy(whole);
  td_dataset_destroy(ds);
  td_grid_destroy(grid);
  CHECK_OK(td_comm_finalize(world));
  td_comm_destroy(world);
  return 0;
}

static int kill_victim, kill_count;
static void kill_trace(void *ctx, const char *name, double b, double e) {
  (void)ctx, (void)b, (void)e;
  /* the second step's first receive on the victim: its neighbours are sending */
  if (!strcmp(name, "recv_wait") && ++kill_count == 2 * 8 + 1) raise(SIGKILL);
}

static int mode_kill(int argc, char **argv) {
  CHECK(argc >= 3);
  kill_victim = atoi(argv[2]);
  td_comm *world;
  CHECK_OK(td_comm_init(&world));
  int rank = td_comm_rank(world), n = td_comm_size(world);
  td_grid *grid;
  CHECK_OK(td_grid_create(world, 1, n, &grid));
  /* bigger activations (B*T*C = 8*64*64 floats, 128 KiB): transfers take a while */
  td_gpt_config gc = {.vocab = 256, .layers = n, .channels = 64, .heads = 2, .seq = 64, .tied = 0};
  /* on a device, 8 KiB messages (4*16*32 floats): the emulator runs the kernels on the CPU */
  const int on_dev = g_dev.kind != TD_DEVICE_CPU;
  if (on_dev) gc.channels = 32, gc.seq = 16;
  td_dataset *ds = td_test_text_dataset(text, 7, (size_t)gc.seq, 200, NULL);
  td_train_config cfg;
  train_config(&cfg, 8, 0, 0, 3);
  cfg.micro_batch = on_dev ? 4 : 8;
  td_model *pm;
  td_pipeline_config pc = {.device = g_dev};
  CHECK_OK(td_gpt_pipeline_create(&gc, &pc, td_grid_comm(grid, TD_GRID_PIPELINE), &pm));
  if (rank == kill_victim) td_gpt_pipeline_set_trace(pm, kill_trace, NULL);
  td_trainer *t;
  CHECK_OK(td_trainer_create(&cfg, pm, ds, td_grid_comm(grid, TD_GRID_DATA), &t));
  td_status st = TD_OK;
  double t_fail = 0;
  for (int s = 0; s < 3 && st == TD_OK; s++) {
    double t0 = td_timeline_now();
    st = td_trainer_step(t, NULL);
    t_fail = td_timeline_now() - t0;
  }
  CHECK(rank != kill_victim); /* the victim never gets here */
  if (st == TD_OK) td_test_fail(__FILE__, __LINE__, "rank %d: every step succeeded although rank %d died", rank,
                                kill_victim);
  const char *msg = td_last_error();
  char want[32];
  snprintf(want, sizeof want, "rank %d", kill_victim);
  if (!strstr(msg, want)) td_test_fail(__FILE__, __LINE__, "rank %d: the error does not name %s: %s", rank, want, msg);
  CHECK(st == TD_ERR_REMOTE || st == TD_ERR_TIMEOUT);
  CHECK(t_fail < 30);
  printf("kill ok rank %d (%s after %.1f s): %s\n", rank, td_status_str(st), t_fail, msg);
  fflush(stdout);
  td_trainer_destroy(t);
  td_model_destroy(pm);
  td_dataset_destroy(ds);
  td_grid_destroy(grid);
  td_comm_destroy(world);
  return 0;
}

static int mode_refuse(void) {
  td_gpt_config gc = gpt_config(0);
  td_pipeline_config pc = {0};
  CHECK_STATUS(td_pipeline_check(&gc, &pc, 5, 4), TD_ERR_INVALID_ARGUMENT); /* 4 layers on 5 stages */
  CHECK(strstr(td_last_error(), "--pipeline-parallel 4 or less"));
  pc.schedule = "gpipe";
  CHECK_STATUS(td_pipeline_check(&gc, &pc, 2, 4), TD_ERR_INVALID_ARGUMENT);
  CHECK(strstr(td_last_error(), "1f1b"));
  pc.schedule = "interleaved";
  CHECK_STATUS(td_pipeline_check(&gc, &pc, 2, 3), TD_ERR_INVALID_ARGUMENT); /* 3 micro-batches, 2 stages */
  CHECK(strstr(td_last_error(), "multiple of 2"));
  pc.chunks = 4;
  CHECK_STATUS(td_pipeline_check(&gc, &pc, 2, 4), TD_ERR_INVALID_ARGUMENT); /* 2 x 4 chunks > 4 layers */
  CHECK(strstr(td_last_error(), "chunks"));
  pc = (td_pipeline_config){.schedule = "1f1b", .chunks = 2};
  CHECK_STATUS(td_pipeline_check(&gc, &pc, 2, 4), TD_ERR_INVALID_ARGUMENT);
  pc = (td_pipeline_config){.partition = "type:transformer"};
  CHECK_STATUS(td_pipeline_check(&gc, &pc, 2, 4), TD_ERR_INVALID_ARGUMENT);
  CHECK(strstr(td_last_error(), "parameters"));
  pc = (td_pipeline_config){0};
  CHECK_OK(td_pipeline_check(&gc, &pc, 4, 1)); /* m < p is fine for 1f1b */
  /* the trainer refuses what does not compose with a pipeline yet */
  td_comm *world;
  CHECK_OK(td_comm_init(&world));
  td_model *pm;
  CHECK_OK(td_gpt_pipeline_create(&gc, &pc, world, &pm));
  CHECK(isnan(pm->ops->forward(pm, NULL, NULL, NULL, 1)));
  CHECK(strstr(td_last_error(), "run_micro_batches"));
  td_dataset *ds = td_test_text_dataset(text, 7, (size_t)gc.seq, 200, NULL);
  td_train_config cfg;
  /* (checkpoints compose: saved by the whole grid, tests/parallel/tp_ckpt.sh pipeline) */
  /* ZeRO-2, ZeRO-3 (the CPU's stage models fetch their groups) and fp16
   * compose (tests/parallel/test_tp); deterministic reduction does not
   * yet, refused naming it */
  train_config(&cfg, 2, 3, 0, 1);
  cfg.deterministic_reduction = 1;
  td_trainer *t = NULL;
  CHECK(td_trainer_create(&cfg, pm, ds, NULL, &t) != TD_OK);
  CHECK(t == NULL);
  if (!strstr(td_last_error(), "pipeline parallelism does not support deterministic reduction"))
    td_test_fail(__FILE__, __LINE__, "%s", td_last_error());
  for (int i = 0; i < 3; i++) {
    train_config(&cfg, 2, i == 0 ? 2 : i == 1 ? 3 : 0, 0, 1);
    if (i == 2) cfg.precision.compute = TD_F16;
    CHECK_OK(td_trainer_create(&cfg, pm, ds, NULL, &t));
    td_trainer_destroy(t);
  }
  td_model_destroy(pm);
  td_dataset_destroy(ds);
  td_comm_destroy(world);
  printf("refusals ok\n");
  return 0;
}

int main(int argc, char **argv) {
  const char *dev = getenv("TD_TEST_DEVICE");
  if (dev && *dev) {
    CHECK_OK(td_device_parse(dev, &g_dev));
    if (td_device_open(g_dev) != TD_OK) {
      if (getenv("TD_TEST_EXPECT_CUDA")) td_test_fail(__FILE__, __LINE__, "%s: %s", dev, td_last_error());
      printf("skipped: no GPU: %s: %s\n", dev, td_last_error());
      return 0;
    }
  }
  if (argc >= 2 && !strcmp(argv[1], "equal")) return mode_equal(argc, argv);
  if (argc >= 2 && !strcmp(argv[1], "kill")) return mode_kill(argc, argv);
  if (argc >= 2 && !strcmp(argv[1], "refuse")) return mode_refuse();
  fprintf(stderr, "usage: test_pipeline_train equal|kill|refuse ...\n");
  return 2;
}
