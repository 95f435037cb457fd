/* The src/nn kernels of every CPU level this machine supports against the
 * generic level's, in one process (nn_kernels_for picks a level's table
 * directly), and a whole GPT forward and backward at each level
 * (nn_kernels_use). The per-level suite lines (nn.suite, TANDEM_CPU=...)
 * check each level against independent references; this checks that the
 * levels agree with each other.
 *
 * Tolerance, and why the levels are not bit-identical: the avx2 and avx512
 * kernels are compiled with FMA, and gcc contracts a*b + c into one fused
 * operation (one rounding instead of two); the avx512 level runs its own
 * register-tiled products (nn_gemm) where the others call sgemm, which sums
 * in another order; and its 1/x is rcp14 plus a Newton step (~1 ulp) where
 * the others divide. Every such difference is a rounding of a partial sum,
 * so over a dot product of K terms it is at most ~K u sum|a_i b_i|
 * (u = 2^-24), which for these inputs (|values| <= 1, K <= 128) is within
 * 2e-5 of the tensor's largest magnitude. The test asserts, per output
 * tensor: max |x_level - x_generic| <= 2e-5 * max(max |x_generic|, 1e-3).
 * The summation order of the 16-lane loops (layernorm, softmax, exp sums)
 * is the same at every level: nn_v16f is 16 lanes whatever the register
 * width. */
#include <stdint.h>
#include <time.h>

#include "../common/check.h"
#include "nn/nn_kernels.h"

static uint64_t rng_state = 777;
static float *rand_buf(size_t n, float scale) { return td_test_rand_buf(&rng_state, n, scale); }
static float *zero_buf(size_t n) { return calloc(n ? n : 1, sizeof(float)); }

#define LEVEL_RTOL 2e-5

/* The outputs of one level's run, kept for the comparison: name, values. */
enum { MAX_OUTS = 32 };
typedef struct run_outputs {
  int n;
  const char *name[MAX_OUTS];
  float *data[MAX_OUTS];
  size_t count[MAX_OUTS];
} run_outputs;

static void keep(run_outputs *r, const char *name, const float *x, size_t n) {
  CHECK(r->n < MAX_OUTS);
  r->name[r->n] = name;
  r->data[r->n] = malloc(n * sizeof(float));
  memcpy(r->data[r->n], x, n * sizeof(float));
  r->count[r->n++] = n;
}

/* Shapes: N = 70 rows (not a multiple of nn_gemm's 12-row tile), OC = 128
 * (nn_gemm applies at avx512) and 40 (it does not: sgemm at every level),
 * layernorm C = 100 (a 4-lane tail), attention head size 32 (the tiled
 * attention) with T = 33, softmax V = 77. */
enum { N = 70, IC = 96, OC = 128, OC2 = 40, LC = 100, GN = 1007, AB = 2, AT = 33, AC = 64, ANH = 2, SN = 10, SV = 77 };

static struct inputs {
  float *x, *w, *b, *w2, *dout, *dout2, *lnw, *lnb, *lnx, *lnd, *g, *gd, *qkv, *adout, *logits, *sa, *sb;
  int32_t targets[SN];
} in;

static void make_inputs(void) {
  in.x = rand_buf((size_t)N * IC, 1.0f), in.w = rand_buf((size_t)OC * IC, 0.5f), in.b = rand_buf(OC, 0.5f);
  in.w2 = rand_buf((size_t)OC2 * IC, 0.5f);
  in.dout = rand_buf((size_t)N * OC, 1.0f), in.dout2 = rand_buf((size_t)N * OC2, 1.0f);
  in.lnw = rand_buf(LC, 1.0f), in.lnb = rand_buf(LC, 1.0f), in.lnx = rand_buf((size_t)N * LC, 2.0f);
  in.lnd = rand_buf((size_t)N * LC, 1.0f);
  in.g = rand_buf(GN, 4.0f), in.gd = rand_buf(GN, 1.0f);
  in.qkv = rand_buf((size_t)AB * AT * 3 * AC, 1.0f), in.adout = rand_buf((size_t)AB * AT * AC, 1.0f);
  in.logits = rand_buf((size_t)SN * SV, 3.0f);
  for (int i = 0; i < SN; i++) in.targets[i] = (i * 31 + 5) % SV;
  in.sa = rand_buf(17 * 45, 1.0f), in.sb = rand_buf(23 * 45, 1.0f);
}

static void run_level(const nn_kernels *k, run_outputs *r) {
  float *out = zero_buf((size_t)N * OC), *aux = zero_buf((size_t)N * OC);
  k->k_td_linear_forward(out, in.x, in.w, in.b, N, IC, OC);
  keep(r, "linear_forward", out, (size_t)N * OC);
  k->k_td_linear_forward(out, in.x, in.w2, in.b, N, IC, OC2);
  keep(r, "linear_forward(OC=40)", out, (size_t)N * OC2);
  k->k_nn_linear_gelu_forward(out, aux, in.x, in.w, in.b, N, IC, OC);
  keep(r, "linear_gelu.out", out, (size_t)N * OC);
  keep(r, "linear_gelu.dgelu", aux, (size_t)N * OC);

  float *dinp = zero_buf((size_t)N * IC), *dw = zero_buf((size_t)OC * IC), *db = zero_buf(OC);
  k->k_td_linear_backward(dinp, dw, db, in.dout, in.x, in.w, N, IC, OC);
  keep(r, "linear_backward.dinp", dinp, (size_t)N * IC);
  keep(r, "linear_backward.dweight", dw, (size_t)OC * IC);
  keep(r, "linear_backward.dbias", db, OC);
  memset(dw, 0, (size_t)OC * IC * sizeof(float)), memset(db, 0, OC * sizeof(float));
  k->k_td_linear_backward(dinp, dw, db, in.dout2, in.x, in.w2, N, IC, OC2);
  keep(r, "linear_backward(OC=40).dweight", dw, (size_t)OC2 * IC);

  float *mean = zero_buf(N), *rstd = zero_buf(N), *lo = zero_buf((size_t)N * LC);
  k->k_td_layernorm_forward(lo, mean, rstd, in.lnx, in.lnw, in.lnb, N, LC);
  keep(r, "layernorm.out", lo, (size_t)N * LC);
  keep(r, "layernorm.rstd", rstd, N);
  float *ldx = zero_buf((size_t)N * LC), *ldw = zero_buf(LC), *ldb = zero_buf(LC);
  k->k_td_layernorm_backward(ldx, ldw, ldb, in.lnd, in.lnx, in.lnw, mean, rstd, N, LC);
  keep(r, "layernorm.dinp", ldx, (size_t)N * LC);
  keep(r, "layernorm.dweight", ldw, LC);

  float *go = zero_buf(GN), *gdx = zero_buf(GN);
  k->k_td_gelu_forward(go, in.g, GN);
  keep(r, "gelu.out", go, GN);
  k->k_td_gelu_backward(gdx, in.g, in.gd, GN);
  keep(r, "gelu.dinp", gdx, GN);

  float *ao = zero_buf((size_t)AB * AT * AC), *att = zero_buf((size_t)AB * ANH * AT * AT);
  float *adx = zero_buf((size_t)AB * AT * 3 * AC), *scratch = zero_buf((size_t)AT * AT);
  k->k_td_attention_forward(ao, att, in.qkv, AB, AT, AC, ANH);
  keep(r, "attention.out", ao, (size_t)AB * AT * AC);
  keep(r, "attention.att", att, (size_t)AB * ANH * AT * AT);
  k->k_td_attention_backward(adx, scratch, in.adout, in.qkv, att, AB, AT, AC, ANH);
  keep(r, "attention.dinp", adx, (size_t)AB * AT * 3 * AC);

  float *probs = zero_buf((size_t)SN * SV), *dl = zero_buf((size_t)SN * SV);
  float loss = k->k_td_softmax_xent_forward(probs, in.logits, in.targets, SN, SV);
  keep(r, "softmax_xent.loss", &loss, 1);
  keep(r, "softmax_xent.probs", probs, (size_t)SN * SV);
  k->k_td_softmax_xent_backward(dl, probs, in.targets, 1.0f / SN, SN, SV);
  keep(r, "softmax_xent.dlogits", dl, (size_t)SN * SV);

  float e[37];
  memcpy(e, in.g, sizeof e);
  float esum = k->k_nn_exp_shift_sum(e, 37, 4.0f);
  keep(r, "exp_shift_sum.x", e, 37);
  keep(r, "exp_shift_sum.sum", &esum, 1);

  float *sc = zero_buf(17 * 23);
  k->k_td_sgemm(0, 1, 17, 23, 45, 1.0f, in.sa, 45, in.sb, 45, 0.0f, sc, 23);
  keep(r, "sgemm", sc, 17 * 23);

  free(out), free(aux), free(dinp), free(dw), free(db), free(mean), free(rstd), free(lo), free(ldx), free(ldw);
  free(ldb), free(go), free(gdx), free(ao), free(att), free(adx), free(scratch), free(probs), free(dl), free(sc);
}

/* max |x - ref| / max(max |ref|, 1e-3): see the tolerance note at the top */
static double level_diff(const float *x, const float *ref, size_t n) {
  double worst = 0.0, scale = 1e-3;
  for (size_t i = 0; i < n; i++) {
    scale = fmax(scale, fabs(ref[i]));
    if (isnan(x[i]) != isnan(ref[i])) return INFINITY;
    worst = fmax(worst, fabs((double)x[i] - ref[i]));
  }
  return worst / scale;
}

static void kernels_agree(void) {
  td_cpu_level top = td_cpu_supported();
  printf("kernels at every supported level (this CPU: up to %s) against generic, tolerance %.0e of the tensor's "
         "largest magnitude\n",
         td_cpu_level_name(top), LEVEL_RTOL);
  /* the tables are distinct code: a level that fell back to another's
   * functions would compare equal and prove nothing */
  CHECK(nn_kernels_for(TD_CPU_GENERIC)->k_td_linear_forward != nn_kernels_for(TD_CPU_AVX2)->k_td_linear_forward);
  CHECK(nn_kernels_for(TD_CPU_AVX2)->k_td_linear_forward != nn_kernels_for(TD_CPU_AVX512)->k_td_linear_forward);
  make_inputs();
  run_outputs runs[TD_CPU_LEVELS] = {0};
  for (int l = 0; l <= (int)top; l++) run_level(nn_kernels_for((td_cpu_level)l), &runs[l]);
  for (int l = 1; l <= (int)top; l++) {
    CHECK_EQ_INT(runs[l].n, runs[0].n);
    double worst = 0.0;
    const char *worst_name = "";
    for (int o = 0; o < runs[0].n; o++) {
      double d = level_diff(runs[l].data[o], runs[0].data[o], runs[0].count[o]);
      if (d > LEVEL_RTOL)
        td_test_fail(__FILE__, __LINE__, "%s: level %s differs from generic by %.3g of its magnitude (> %.0e)",
                     runs[0].name[o], td_cpu_level_name((td_cpu_level)l), d, LEVEL_RTOL);
      if (d > worst) worst = d, worst_name = runs[0].name[o];
    }
    printf("  %-8s %d outputs agree with generic (worst %.2e, %s)\n", td_cpu_level_name((td_cpu_level)l),
           runs[0].n, worst, worst_name);
  }
  if (top == TD_CPU_GENERIC) printf("  (only generic here: nothing to compare)\n");
  for (int l = 0; l <= (int)top; l++)
    for (int o = 0; o < runs[l].n; o++) free(runs[l].data[o]);
}

/* A small GPT (channels 128: nn_gemm applies at avx512; head size 32: the
 * tiled attention) forward and backward at each level through the public
 * entry points: loss and gradients against the generic level's. */
static void gpt_agrees(void) {
  td_gpt_config cfg = {.vocab = 97, .layers = 2, .channels = 128, .heads = 4, .seq = 48};
  td_model *m;
  CHECK_OK(td_gpt_create(&cfg, &m));
  const int B = 2, T = 48;
  float *params = malloc(m->n_params * sizeof(float));
  td_model_init_params(m, params, 4242);
  int32_t tok[2 * 48], tgt[2 * 48];
  for (int i = 0; i < B * T; i++) tok[i] = (i * 37 + 11) % 97, tgt[i] = (i * 53 + 7) % 97;
  CHECK_OK(m->ops->prepare(m, B));
  td_cpu_level top = td_cpu_supported();
  float loss[TD_CPU_LEVELS] = {0};
  float *grads[TD_CPU_LEVELS] = {0};
  for (int l = 0; l <= (int)top; l++) {
    CHECK_OK(nn_kernels_use((td_cpu_level)l));
    grads[l] = calloc(m->n_params, sizeof(float));
    loss[l] = m->ops->forward(m, params, tok, tgt, B);
    m->ops->backward(m, params, grads[l], 1.0f, NULL, NULL);
    CHECK(isfinite(loss[l]));
  }
  printf("gpt (2 layers, 128 channels, B=%d T=%d): loss at generic %.7f\n", B, T, loss[0]);
  for (int l = 1; l <= (int)top; l++) {
    double dl = fabs((double)loss[l] - loss[0]) / fabs(loss[0]);
    double dg = level_diff(grads[l], grads[0], m->n_params);
    printf("  %-8s loss %.7f (relative difference %.2e), gradients differ by %.2e of their largest\n",
           td_cpu_level_name((td_cpu_level)l), loss[l], dl, dg);
    /* the loss is a mean over B T positions of values ~ln 97: FMA-level
     * differences in the products average out to well below LEVEL_RTOL */
    CHECK(dl <= LEVEL_RTOL);
    /* the gradients go through two layers' backward products, each adding
     * its own rounding differences: 5x the per-kernel bound */
    CHECK(dg <= 5 * LEVEL_RTOL);
  }
  /* a level above what the CPU runs is refused, not used */
  if (top < TD_CPU_AVX512) CHECK_STATUS(nn_kernels_use(TD_CPU_AVX512), TD_ERR_INVALID_ARGUMENT);
  CHECK_OK(nn_kernels_use(td_cpu_active()));
  for (int l = 0; l <= (int)top; l++) free(grads[l]);
  free(params);
  td_model_destroy(m);
}

/* --bench ROUNDS: each kernel's speed at every supported level, the levels
 * interleaved within each round (the machine is shared: a slow moment hits
 * all levels alike), medians over the rounds. Shapes of the reference GPT
 * (B T = 1024 rows, C = 256, the 768-wide qkv product). Not part of the
 * suite; bench/cpu_levels.sh runs it. */
static double median_of(double *x, int n) {
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && x[j - 1] > x[j]; j--) {
      double t = x[j];
      x[j] = x[j - 1], x[j - 1] = t;
    }
  return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

enum { BN = 1024, BIC = 256, BOC = 768, BT = 128, BC = 256, BNH = 4, BENCH_KERNELS = 5, MAX_ROUNDS = 64 };
static const char *const bench_names[BENCH_KERNELS] = {
    "linear forward (1024x256 @ 256x768) GFLOP/s", "linear backward (dinp + dweight + dbias) GFLOP/s",
    "portable sgemm (no OpenBLAS) 1024x256 @ 256x768 GFLOP/s", "gelu forward+grad (1024x1024) Gelem/s",
    "attention forward (B=8 T=128 C=256 NH=4) ms"};

/* this thread's CPU seconds: the machine is shared, and wall time would
 * count the moments another process had the core */
static double thread_cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double bench_one(const nn_kernels *k, int which) {
  static float *x, *w, *b, *o, *d, *dx, *dw, *db, *g, *gg, *qkv, *ao, *att;
  if (!x) {
    x = rand_buf((size_t)BN * BIC, 1.0f), w = rand_buf((size_t)BOC * BIC, 0.1f), b = rand_buf(BOC, 0.1f);
    o = zero_buf((size_t)BN * BOC), d = rand_buf((size_t)BN * BOC, 1.0f), dx = zero_buf((size_t)BN * BIC);
    dw = zero_buf((size_t)BOC * BIC), db = zero_buf(BOC), g = rand_buf((size_t)BN * 1024, 3.0f);
    gg = zero_buf((size_t)BN * 1024), qkv = rand_buf((size_t)8 * BT * 3 * BC, 1.0f);
    ao = zero_buf((size_t)8 * BT * BC), att = zero_buf((size_t)8 * BNH * BT * BT);
  }
  double flops = 2.0 * BN * BIC * BOC, t0 = thread_cpu_s(), t;
  int reps = 0;
  do { /* at least 0.2 CPU seconds per measurement */
    switch (which) {
      case 0: k->k_td_linear_forward(o, x, w, b, BN, BIC, BOC); break;
      case 1: k->k_td_linear_backward(dx, dw, db, d, x, w, BN, BIC, BOC); break;
      case 2: k->k_nn_sgemm_portable(0, 1, BN, BOC, BIC, 1.0f, x, BIC, w, BIC, 0.0f, o, BOC); break;
      case 3: k->k_nn_gelu_forward_cache(gg, o, g, (size_t)BN * 1024); break;
      default: k->k_td_attention_forward(ao, att, qkv, 8, BT, BC, BNH); break;
    }
    reps++;
    t = thread_cpu_s() - t0;
  } while (t < 0.2);
  switch (which) {
    case 0: case 2: return flops * reps / t * 1e-9;
    case 1: return 2 * flops * reps / t * 1e-9;
    case 3: return (double)BN * 1024 * reps / t * 1e-9;
    default: return t / reps * 1e3;
  }
}

static int bench(int rounds) {
  if (rounds < 1 || rounds > MAX_ROUNDS) rounds = 5;
  td_cpu_level top = td_cpu_supported();
  static double r[TD_CPU_LEVELS][BENCH_KERNELS][MAX_ROUNDS];
  for (int round = 0; round < rounds; round++)
    for (int kk = 0; kk < BENCH_KERNELS; kk++)
      for (int l = 0; l <= (int)top; l++) r[l][kk][round] = bench_one(nn_kernels_for((td_cpu_level)l), kk);
  printf("# kernel speed per CPU level, 1 thread, per CPU second, median of %d interleaved rounds (matmul backend: %s)\n", rounds,
         td_nn_matmul_backend());
  for (int kk = 0; kk < BENCH_KERNELS; kk++) {
    printf("%s", bench_names[kk]);
    for (int l = 0; l <= (int)top; l++)
      printf(" %s=%.2f", td_cpu_level_name((td_cpu_level)l), median_of(r[l][kk], rounds));
    printf("\n");
  }
  return 0;
}

/* Run with a TANDEM_CPU that must be refused (unknown, or above this CPU):
 * model creation fails naming the variable, and the kernels stay generic. */
static int expect_refused(void) {
  const char *env = getenv("TANDEM_CPU");
  printf("TANDEM_CPU=%s on a CPU supporting up to %s\n", env ? env : "(unset)", td_cpu_level_name(td_cpu_supported()));
  CHECK_STATUS(td_cpu_check(), TD_ERR_INVALID_ARGUMENT);
  td_gpt_config cfg = {.vocab = 97, .layers = 1, .channels = 32, .heads = 2, .seq = 8};
  td_model *m = (td_model *)&cfg;
  CHECK_STATUS(td_gpt_create(&cfg, &m), TD_ERR_INVALID_ARGUMENT);
  CHECK(m == NULL);
  printf("refused: %s\n", td_last_error());
  CHECK(strstr(td_last_error(), "TANDEM_CPU=") != NULL);
  CHECK_EQ_INT(td_cpu_active(), TD_CPU_GENERIC);
  CHECK_EQ_INT(strcmp(td_cpu_kernel_level(), "generic"), 0);
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  /* --supports LEVEL: exit 0 if this CPU runs LEVEL, 3 if not (tests/common/at_level.sh) */
  if (argc == 3 && strcmp(argv[1], "--supports") == 0) {
    for (int l = 0; l < TD_CPU_LEVELS; l++)
      if (strcmp(argv[2], td_cpu_level_name((td_cpu_level)l)) == 0) return l <= (int)td_cpu_supported() ? 0 : 3;
    fprintf(stderr, "unknown level %s\n", argv[2]);
    return 2;
  }
  if (argc == 2 && strcmp(argv[1], "--refused") == 0) return expect_refused();
  if (argc == 3 && strcmp(argv[1], "--bench") == 0) return bench(atoi(argv[2]));
  td_nn_set_threads(1);
  printf("CPU level in use: %s (TANDEM_CPU=%s)\n", td_cpu_kernel_level(), getenv("TANDEM_CPU") ? getenv("TANDEM_CPU") : "");
  kernels_agree();
  gpt_agrees();
  printf("every supported level agrees with generic\n");
  return 0;
}
