/* Mixed precision and activation checkpointing in the training engine
 * (src/train/precision/, src/nn/gpt.c):
 *
 *   test_precision_train units
 *       The fp16 loss scaler against DeepSpeed's rules written out by hand
 *       (a closed sequence of scales); the config keys (bf16, fp16,
 *       communication_data_type, activation_checkpointing) and their errors.
 *   test_precision_train close
 *       A small GPT trained in f32, bf16 and fp16 from the same start: after
 *       STEPS steps the half-precision losses are within 1% of f32's, and
 *       not equal to it (the half products really ran).
 *   test_precision_train ckpt
 *       The same GPT with and without activation checkpointing, in f32 and in
 *       bf16: every step's loss, gradient norm and the final parameters are
 *       bit-identical; the activation memory is smaller with checkpointing.
 *   test_precision_train resume DIR
 *       fp16 with an overflow injected at step 2 (the scale halves, Adam's
 *       step count lags): 6 uninterrupted steps against 3, save, a fresh
 *       trainer resuming and 3 more: losses and scales bit-identical (the
 *       loss scaler is in the checkpoint).
 *   test_precision_train overflow          (under tandemrun, any world)
 *       fp16 with hysteresis 1; TANDEM_FP16_INJECT_INF=3:R puts an inf into
 *       rank R's gradients at step 3 only, after the reduction: every rank
 *       skips step 3 (parameters unchanged, bit for bit), the scale halves,
 *       the other steps update; the ranks' parameters stay identical.
 *   test_precision_train commtype          (under tandemrun, world >= 2)
 *       communication_data_type bf16: half the gradient bytes on the wire,
 *       the ranks stay identical, and the losses stay within 1% of an f32
 *       exchange. */
#include "train/precision/precision.h"

#include <stdio.h>

#include "../common/check.h"

enum { T = 32 };

static td_status text_get(const td_dataset *ds, size_t index, void *input, int32_t *targets) {
  (void)ds;
  int32_t *tok = input;
  static const char text[] = "it was the best of times, it was the worst of times, it was the age of wisdom. ";
  for (int j = 0; j <= T; j++) {
    size_t p = index * 5 + (size_t)j;
    int32_t v = (int32_t)text[p % (sizeof text - 1)];
    if (j < T) tok[j] = v;
    if (j > 0) targets[j - 1] = v;
  }
  return TD_OK;
}

static void plain_destroy(td_dataset *ds) { free(ds); }

static td_dataset *dataset(void) {
  td_dataset *ds = calloc(1, sizeof *ds);
  CHECK(ds);
  ds->n_samples = 160;
  ds->input_bytes = T * sizeof(int32_t);
  ds->targets_per_sample = T;
  ds->get = text_get;
  ds->destroy = plain_destroy;
  return ds;
}

static td_model *gpt(int layers) {
  td_gpt_config c = {.vocab = 256, .layers = layers, .channels = 64, .heads = 2, .seq = T};
  td_model *m = NULL;
  CHECK_OK(td_gpt_create(&c, &m));
  return m;
}

static td_train_config config(int micro) {
  td_train_config c;
  td_train_config_defaults(&c);
  c.micro_batch = micro;
  c.grad_accum = 1;
  c.seed = 7;
  c.optimizer.lr = 3e-3f;
  c.threads = 1;
  return c;
}

/* ---- units ---- */

static void scaler_units(void) {
  /* DeepSpeed's DynamicLossScaler, by hand: window 3, hysteresis 2, start 2^4,
   * min 4. o = overflow, . = clean. */
  td_precision_config p;
  td_precision_config_defaults(&p);
  p.compute = TD_F16;
  p.initial_scale_power = 4;
  p.loss_scale_window = 3;
  p.hysteresis = 2;
  p.min_loss_scale = 4;
  td_loss_scaler s;
  td_loss_scaler_init(&s, &p);
  CHECK(s.scale == 16 && s.dynamic);
  /* DeepSpeed (runtime/fp16/loss_scaler.py): an overflow with hysteresis
   * left > 1 only decrements it; at 1 the scale halves (not below min) and
   * the count stays at 1, so that later overflows halve at once, until a
   * clean window ((iter - last_overflow) % window == 0) doubles the scale
   * and restores the hysteresis. */
  const char *events = "...oo...oo.ooo";
  const double want[] = {16, 16, 32, /* o: 2 -> 1 */ 32, /* o: halve */ 16, 16, 16, /* window: x2, hyst 2 */ 32,
                         /* o: 2 -> 1 */ 32, /* o */ 16, 16, /* o */ 8, /* o */ 4, /* o: min */ 4};
  CHECK_EQ_INT(strlen(events), TD_ARRAY_SIZE(want));
  for (size_t i = 0; events[i]; i++) {
    td_loss_scaler_update(&s, &p, events[i] == 'o');
    if (s.scale != want[i])
      td_test_fail(__FILE__, __LINE__, "after event %zu (%c) the scale is %g, DeepSpeed's rules give %g", i, events[i],
                   s.scale, want[i]);
  }
  CHECK_EQ_INT(s.skipped, 7);
  /* a clean window after the start doubles: window 3 -> at iters 2, 5, 8 */
  td_loss_scaler_init(&s, &p);
  for (int i = 0; i < 9; i++) td_loss_scaler_update(&s, &p, 0);
  CHECK(s.scale == 16 * 8);
  /* a fixed scale never moves */
  p.loss_scale = 128;
  td_loss_scaler_init(&s, &p);
  td_loss_scaler_update(&s, &p, 1);
  td_loss_scaler_update(&s, &p, 0);
  CHECK(s.scale == 128 && !s.dynamic && s.skipped == 1);
  /* not fp16: scale 1 */
  p.compute = TD_BF16;
  td_loss_scaler_init(&s, &p);
  CHECK(s.scale == 1);
  printf("loss scaler follows DeepSpeed's DynamicLossScaler\n");
}

static void config_units(void) {
#ifdef TD_HAVE_CJSON
  td_train_config c;
  td_train_config_defaults(&c);
  CHECK(c.precision.compute == TD_F32 && c.precision.comm_dtype == TD_F32 && c.activation_checkpointing == 0);
  CHECK_OK(td_train_config_parse_json("{\"bf16\": {\"enabled\": true}, \"communication_data_type\": \"bf16\"}", "t", &c));
  CHECK(c.precision.compute == TD_BF16 && c.precision.comm_dtype == TD_BF16);
  CHECK_OK(td_train_config_parse_json("{\"bf16\": {\"enabled\": false}}", "t", &c));
  CHECK(c.precision.compute == TD_F32);
  CHECK_OK(td_train_config_parse_json("{\"fp16\": {\"enabled\": true, \"loss_scale\": 0, \"initial_scale_power\": 12, "
                                      "\"loss_scale_window\": 500, \"hysteresis\": 1, \"min_loss_scale\": 2}}",
                                      "t", &c));
  CHECK(c.precision.compute == TD_F16 && c.precision.initial_scale_power == 12 && c.precision.loss_scale_window == 500 &&
        c.precision.hysteresis == 1 && c.precision.min_loss_scale == 2);
  CHECK_MSG(td_train_config_parse_json("{\"bf16\": {\"enabled\": true}}", "t", &c), TD_ERR_INVALID_ARGUMENT,
            "both enabled");
  CHECK_MSG(td_train_config_parse_json("{\"fp16\": {\"enabled\": true, \"loss_scal\": 1}}", "cfg.json", &c),
            TD_ERR_INVALID_ARGUMENT, "unknown key \"loss_scal\" in fp16");
  CHECK_MSG(td_train_config_parse_json("{\"fp16\": {\"hysteresis\": 0}}", "t", &c), TD_ERR_INVALID_ARGUMENT,
            "fp16.hysteresis");
  CHECK_MSG(td_train_config_parse_json("{\"communication_data_type\": \"int8\"}", "t", &c), TD_ERR_INVALID_ARGUMENT,
            "communication_data_type must be");
  td_train_config_defaults(&c);
  CHECK_OK(td_train_config_parse_json("{\"activation_checkpointing\": {\"partition_activations\": false, "
                                      "\"contiguous_memory_optimization\": true, \"number_checkpoints\": 4}}",
                                      "t", &c));
  CHECK_EQ_INT(c.activation_checkpointing, 1);
  CHECK_OK(td_train_config_parse_json("{\"activation_checkpointing\": {\"enabled\": false}}", "t", &c));
  CHECK_EQ_INT(c.activation_checkpointing, 0);
  CHECK_MSG(td_train_config_parse_json("{\"activation_checkpointing\": {\"cpu_checkpointing\": true}}", "t", &c),
            TD_ERR_INVALID_ARGUMENT, "cpu_checkpointing is not supported");
  /* resolve checks what a program sets directly */
  td_train_config_defaults(&c);
  c.micro_batch = 1;
  c.precision.compute = TD_I32;
  CHECK_MSG(td_train_config_resolve(&c, 1), TD_ERR_INVALID_ARGUMENT, "compute type");
  printf("config keys parsed and checked\n");
#else
  printf("config keys: skipped (built without cJSON)\n");
#endif
}

/* ---- training runs ---- */

static void train(td_train_config c, int layers, int steps, double *losses, double *norms, float **params_out,
                  size_t *act_bytes) {
  td_dataset *ds = dataset();
  td_model *m = gpt(layers);
  td_trainer *t = NULL;
  CHECK_OK(td_trainer_create(&c, m, ds, NULL, &t));
  for (int s = 0; s < steps; s++) {
    td_step_stats st;
    CHECK_OK(td_trainer_step(t, &st));
    CHECK(!st.skipped);
    losses[s] = st.loss;
    if (norms) norms[s] = st.grad_norm;
  }
  if (act_bytes) *act_bytes = m->activation_bytes;
  size_t n = td_trainer_n_params(t);
  if (params_out) {
    *params_out = malloc(n * sizeof(float));
    CHECK(*params_out);
    memcpy(*params_out, td_trainer_params(t), n * sizeof(float));
  }
  td_trainer_destroy(t);
  td_model_destroy(m);
  ds->destroy(ds);
}

static void run_close(void) {
  enum { STEPS = 40 };
  double l32[STEPS], lbf[STEPS], lfp[STEPS];
  td_train_config c = config(8);
  train(c, 2, STEPS, l32, NULL, NULL, NULL);
  c.precision.compute = TD_BF16;
  train(c, 2, STEPS, lbf, NULL, NULL, NULL);
  c.precision.compute = TD_F16;
  train(c, 2, STEPS, lfp, NULL, NULL, NULL);
  printf("level %s: loss step 1 %.5f, step %d: f32 %.5f bf16 %.5f fp16 %.5f\n", td_cpu_kernel_level(), l32[0], STEPS,
         l32[STEPS - 1], lbf[STEPS - 1], lfp[STEPS - 1]);
  CHECK(l32[STEPS - 1] < 0.8 * l32[0]); /* it learned something */
  CHECK_CLOSE(lbf[STEPS - 1], l32[STEPS - 1], 0.01, 0);
  CHECK_CLOSE(lfp[STEPS - 1], l32[STEPS - 1], 0.01, 0);
  /* the half products ran: the loss sequences are not f32's */
  CHECK(lbf[STEPS - 1] != l32[STEPS - 1] && lfp[STEPS - 1] != l32[STEPS - 1] && lbf[STEPS - 1] != lfp[STEPS - 1]);
  /* and the compute type is back to f32 after the steps */
  CHECK_EQ_INT(td_nn_compute_dtype(), TD_F32);
}

static void run_ckpt(void) {
  enum { STEPS = 4, LAYERS = 4 };
  for (int half = 0; half < 2; half++) {
    double la[STEPS], lb[STEPS], na[STEPS], nb[STEPS];
    float *pa, *pb;
    size_t bytes_a, bytes_b;
    td_train_config c = config(4);
    c.precision.compute = half ? TD_BF16 : TD_F32;
    train(c, LAYERS, STEPS, la, na, &pa, &bytes_a);
    c.activation_checkpointing = 1;
    train(c, LAYERS, STEPS, lb, nb, &pb, &bytes_b);
    for (int s = 0; s < STEPS; s++) {
      if (la[s] != lb[s] || na[s] != nb[s])
        td_test_fail(__FILE__, __LINE__, "%s step %d: loss %.9g / %.9g, norm %.9g / %.9g without / with checkpointing",
                     half ? "bf16" : "f32", s + 1, la[s], lb[s], na[s], nb[s]);
    }
    td_model *m = gpt(LAYERS);
    CHECK(memcmp(pa, pb, m->n_params * sizeof(float)) == 0);
    td_model_destroy(m);
    printf("%s: %d steps bit-identical with checkpointing; activations %zu -> %zu bytes\n", half ? "bf16" : "f32",
           STEPS, bytes_a, bytes_b);
    CHECK(bytes_b > 0 && bytes_b < bytes_a * 3 / 4);
    free(pa), free(pb);
  }
  /* a model without the op: refused, naming it */
  td_train_config c = config(4);
  c.activation_checkpointing = 1;
  td_cnn_config cc = {.channels1 = 2, .channels2 = 2, .hidden = 4, .classes = 10};
  td_model *cnn = NULL;
  CHECK_OK(td_cnn_create(&cc, &cnn));
  td_dataset ds = {.n_samples = 4, .input_bytes = 28 * 28 * sizeof(float), .targets_per_sample = 1};
  td_trainer *t = NULL;
  CHECK_MSG(td_trainer_create(&c, cnn, &ds, NULL, &t), TD_ERR_INVALID_ARGUMENT, "does not support");
  td_model_destroy(cnn);
}

static void run_resume(const char *dir) {
  setenv("TANDEM_FP16_INJECT_INF", "2:0", 1); /* read when each trainer is created */
  td_train_config c = config(4);
  c.precision.compute = TD_F16;
  c.precision.initial_scale_power = 10;
  c.precision.hysteresis = 1;
  c.precision.loss_scale_window = 3; /* the scale also grows again inside the run */
  double want[6], want_scale[6], got[6], got_scale[6];
  td_dataset *ds = dataset();
  td_model *m = gpt(2);
  td_trainer *t = NULL;
  CHECK_OK(td_trainer_create(&c, m, ds, NULL, &t));
  for (int s = 0; s < 6; s++) {
    td_step_stats st;
    CHECK_OK(td_trainer_step(t, &st));
    want[s] = st.loss, want_scale[s] = st.loss_scale;
    CHECK_EQ_INT(st.skipped, s == 1);
  }
  td_trainer_destroy(t);
  CHECK_OK(td_trainer_create(&c, m, ds, NULL, &t));
  for (int s = 0; s < 3; s++) {
    td_step_stats st;
    CHECK_OK(td_trainer_step(t, &st));
    got[s] = st.loss, got_scale[s] = st.loss_scale;
  }
  CHECK_OK(td_trainer_save(t, dir));
  td_trainer_destroy(t);
  CHECK_OK(td_trainer_create(&c, m, ds, NULL, &t));
  CHECK_OK(td_trainer_resume(t, dir));
  for (int s = 3; s < 6; s++) {
    td_step_stats st;
    CHECK_OK(td_trainer_step(t, &st));
    got[s] = st.loss, got_scale[s] = st.loss_scale;
  }
  for (int s = 0; s < 6; s++) {
    printf("step %d: loss %.7f / %.7f scale %g / %g\n", s + 1, want[s], got[s], want_scale[s], got_scale[s]);
    CHECK(got[s] == want[s] && got_scale[s] == want_scale[s]);
  }
  CHECK(want_scale[0] == 1024 && want_scale[1] == 512 && want_scale[5] > 512); /* halved, then grew */
  td_trainer_destroy(t);
  td_model_destroy(m);
  ds->destroy(ds);
  unsetenv("TANDEM_FP16_INJECT_INF");
}

/* ---- multi-rank ---- */

static uint64_t hash_params(const float *p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  const unsigned char *b = (const unsigned char *)p;
  for (size_t i = 0; i < n * sizeof(float); i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

/* every rank's parameters hash the same */
static void check_ranks_agree(td_comm *comm, const td_trainer *t) {
  int64_t h[2];
  h[0] = (int64_t)(hash_params(td_trainer_params(t), td_trainer_n_params(t)) >> 1);
  h[1] = -h[0];
  CHECK_OK(td_allreduce(h, h, 2, TD_I64, TD_MAX, comm));
  CHECK(h[0] == -h[1]);
}

static void run_overflow(td_comm *comm) {
  int rank = td_comm_rank(comm), world = td_comm_size(comm);
  const char *inj = getenv("TANDEM_FP16_INJECT_INF");
  CHECK(inj && strncmp(inj, "3:", 2) == 0); /* the suite line sets it */
  td_dataset *ds = dataset();
  td_model *m = gpt(2);
  td_train_config c = config(2);
  c.precision.compute = TD_F16;
  c.precision.initial_scale_power = 8;
  c.precision.hysteresis = 1;
  c.precision.loss_scale_window = 1000;
  td_trainer *t = NULL;
  CHECK_OK(td_trainer_create(&c, m, ds, comm, &t));
  size_t n = td_trainer_n_params(t);
  float *before = malloc(n * sizeof(float));
  CHECK(before);
  for (int s = 1; s <= 5; s++) {
    memcpy(before, td_trainer_params(t), n * sizeof(float));
    td_step_stats st;
    CHECK_OK(td_trainer_step(t, &st));
    int same = memcmp(before, td_trainer_params(t), n * sizeof(float)) == 0;
    if (rank == 0)
      printf("step %d: loss %.5f skipped %d scale %g params %s\n", s, st.loss, st.skipped, st.loss_scale,
             same ? "unchanged" : "updated");
    CHECK_EQ_INT(st.step, s);
    CHECK_EQ_INT(st.skipped, s == 3);
    CHECK_EQ_INT(same, s == 3);
    CHECK(st.loss_scale == (s < 3 ? 256.0 : 128.0));
    CHECK(isfinite(st.loss));
    check_ranks_agree(comm, t);
  }
  if (rank == 0) printf("%d ranks: the injected overflow skipped step 3 everywhere and halved the scale\n", world);
  free(before);
  td_trainer_destroy(t);
  td_model_destroy(m);
  ds->destroy(ds);
}

static void run_commtype(td_comm *comm) {
  enum { STEPS = 12 };
  int rank = td_comm_rank(comm), world = td_comm_size(comm);
  double loss[2][STEPS];
  size_t bytes[2];
  for (int k = 0; k < 2; k++) {
    td_dataset *ds = dataset();
    td_model *m = gpt(2);
    td_train_config c = config(2);
    c.precision.compute = TD_BF16;
    c.precision.comm_dtype = k ? TD_BF16 : TD_F32;
    td_trainer *t = NULL;
    CHECK_OK(td_trainer_create(&c, m, ds, comm, &t));
    for (int s = 0; s < STEPS; s++) {
      td_step_stats st;
      CHECK_OK(td_trainer_step(t, &st));
      loss[k][s] = st.loss;
      bytes[k] = st.comm_bytes;
    }
    check_ranks_agree(comm, t);
    td_trainer_destroy(t);
    td_model_destroy(m);
    ds->destroy(ds);
  }
  if (rank == 0)
    printf("%d ranks, bf16 compute: gradient exchange f32 %zu bytes/step, bf16 %zu; loss after %d steps %.5f / %.5f\n",
           world, bytes[0], bytes[1], STEPS, loss[0][STEPS - 1], loss[1][STEPS - 1]);
  CHECK_EQ_INT(bytes[1] * 2, bytes[0]);
  CHECK_CLOSE(loss[1][STEPS - 1], loss[0][STEPS - 1], 0.01, 0);
  CHECK(loss[1][STEPS - 1] != loss[0][STEPS - 1]);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  if (argc < 2) {
    fprintf(stderr, "usage: %s units | close | ckpt | resume DIR | overflow | commtype\n", argv[0]);
    return 2;
  }
  if (!strcmp(argv[1], "units")) {
    scaler_units();
    config_units();
  } else if (!strcmp(argv[1], "close")) {
    run_close();
  } else if (!strcmp(argv[1], "ckpt")) {
    run_ckpt();
  } else if (!strcmp(argv[1], "resume") && argc == 3) {
    run_resume(argv[2]);
  } else if (!strcmp(argv[1], "overflow") || !strcmp(argv[1], "commtype")) {
    td_comm *comm = NULL;
    CHECK_OK(td_comm_init(&comm));
    if (!strcmp(argv[1], "overflow"))
      run_overflow(comm);
    else
      run_commtype(comm);
    td_comm_destroy(comm);
  } else {
    fprintf(stderr, "unknown mode %s\n", argv[1]);
    return 2;
  }
  printf("ok\n");
  return 0;
}
