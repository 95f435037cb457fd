/* Whole-model checks for the GPT and the CNN: parameter layout and count
 * (the GPT's equals shared/peers/torch_gpt_ddp.py's 3,323,392 at its
 * defaults), deterministic init, initial loss ~ ln(vocab), gradients of
 * every tensor against central finite differences on tiny configurations,
 * the ready callback's order and coverage, accumulation and loss scaling,
 * prediction and sampling. */
#include <stdint.h>

#include "../common/check.h"
#include "nn/nn_internal.h"

static uint64_t rng_state = 99;
static float urand(void) { return td_test_urand(&rng_state); } /* uniform in [-1, 1) */

/* ---- ready-callback recorder ---- */
typedef struct ready_log {
  size_t offset[4096], count[4096];
  int n;
} ready_log;
static void on_ready(void *ctx, size_t offset, size_t count) {
  ready_log *log = ctx;
  CHECK(log->n < 4096);
  log->offset[log->n] = offset;
  log->count[log->n] = count;
  log->n++;
}

/* Each tensor reported exactly once, as ranges that end where the next
 * (earlier in the arena) begins: a descending contiguous sweep. */
static void check_ready_order(const td_model *m, const ready_log *log, int tied_wte_last) {
  CHECK_EQ_INT(log->n, m->n_tensors);
  size_t expect_end = m->n_params;
  for (int i = 0; i < log->n; i++) {
    if (tied_wte_last && i == log->n - 1) {
      CHECK_EQ_INT(log->offset[i], 0); /* wte, final after the embedding's backward */
      break;
    }
    CHECK_EQ_INT(log->offset[i] + log->count[i], expect_end);
    expect_end = log->offset[i];
    if (tied_wte_last && i == log->n - 2) CHECK_EQ_INT(expect_end, m->tensors[1].offset); /* wpe */
  }
  if (!tied_wte_last) CHECK_EQ_INT(expect_end, 0);
}

/* ---- finite differences over a whole model ---- */
static double model_loss(td_model *m, float *params, const void *in, const int32_t *tgt, int B) {
  return m->ops->forward(m, params, in, tgt, B);
}

/* grads (from backward) against central differences for every parameter;
 * per element |fd - an| <= atol + rtol*max(|fd|,|an|), and per tensor the
 * relative error of the whole gradient vector below tensor_rtol. */
static int n_retried;
static void model_gradcheck(td_model *m, float *params, const float *grads, const void *in, const int32_t *tgt, int B,
                            float eps, double rtol, double atol, double tensor_rtol, int one_sided) {
  double l0 = model_loss(m, params, in, tgt, B);
  for (int t = 0; t < m->n_tensors; t++) {
    const td_param_tensor *tp = &m->tensors[t];
    double diff2 = 0, norm2 = 0, worst = 0;
    for (size_t i = 0; i < tp->count; i++) {
      float *p = params + tp->offset + i;
      double an = grads[tp->offset + i], fd = 0, err = 0;
      /* A ReLU or max-pool kink inside [x - e, x + e] spoils a central
       * difference: there the analytic gradient must match the derivative
       * from one side (the side without the kink, or the side the layer
       * picks when the kink is at x). Smaller steps are tried too. */
      float e = eps;
      for (int attempt = 0; attempt < 3; attempt++, e *= 1.0f / 3.0f) {
        float saved = *p;
        *p = saved + e;
        double lp = model_loss(m, params, in, tgt, B);
        *p = saved - e;
        double lm = model_loss(m, params, in, tgt, B);
        *p = saved;
        double step_p = (double)(saved + e) - saved, step_m = saved - (double)(saved - e);
        double cands[3] = {(lp - lm) / (step_p + step_m), (lp - l0) / step_p, (l0 - lm) / step_m};
        int ok = 0;
        for (int c = 0; c < (one_sided ? 3 : 1) && !ok; c++) {
          double cerr = fabs(cands[c] - an);
          if (c == 0 || cerr < err) fd = cands[c], err = cerr;
          /* the float loss carries ~1 ulp of rounding (2.4e-7 at 2.4), so a
           * step e cannot resolve gradients finer than ~ulp/e */
          double noise = 4e-7 * fmax(1.0, fabs(l0)) / e;
          ok = cerr <= atol + noise + rtol * fmax(fabs(cands[c]), fabs(an));
        }
        if (ok) break;
        if (attempt == 2)
          td_test_fail(__FILE__, __LINE__, "%s %s[%zu]: analytic %.7g vs finite difference %.7g (last step %g)",
                       m->kind, tp->name, i, an, fd, e);
        printf("    %s[%zu]: step %g gives %.7g vs analytic %.7g; retrying smaller\n", tp->name, i, e, fd, an);
        n_retried++;
      }
      diff2 += err * err;
      norm2 += fd * fd;
      worst = fmax(worst, err);
    }
    double rel = sqrt(diff2) / (sqrt(norm2) + 1e-12);
    if (rel > tensor_rtol && sqrt(norm2) > 1e-5)
      td_test_fail(__FILE__, __LINE__, "%s %s: relative error of the gradient %.3g > %g", m->kind, tp->name, rel,
                   tensor_rtol);
    printf("  %-22s %6zu ok  |g| %.3e  rel err %.2e  max abs err %.2e\n", tp->name, tp->count, sqrt(norm2), rel,
           worst);
  }
}

static void gpt_gradcheck(int tied) {
  td_gpt_config cfg = {.vocab = 11, .layers = 2, .channels = 8, .heads = 2, .seq = 5, .tied = tied};
  td_model *m;
  CHECK_OK(td_gpt_create(&cfg, &m));
  const int B = 2;
  CHECK_OK(m->ops->prepare(m, B));
  float *params = malloc(m->n_params * sizeof(float)), *grads = calloc(m->n_params, sizeof(float));
  /* larger than GPT-2's 0.02 so that every path carries a measurable gradient */
  for (size_t i = 0; i < m->n_params; i++) params[i] = 0.3f * urand();
  int32_t tok[10] = {1, 5, 10, 0, 3, 7, 7, 2, 9, 4}, tgt[10] = {5, 10, 0, 3, 8, 7, 2, 9, 4, 1};
  printf("gpt gradcheck (vocab 11, 2 layers, 8 channels, 2 heads, seq 5, batch 2, %s head)\n",
         tied ? "tied" : "untied");
  m->ops->forward(m, params, tok, tgt, B);
  ready_log log = {.n = 0};
  m->ops->backward(m, params, grads, 1.0f, on_ready, &log);
  check_ready_order(m, &log, tied);
  model_gradcheck(m, params, grads, tok, tgt, B, 3e-2f, 2e-2, 1e-4, 1e-2, 0);

  /* backward accumulates, and loss_scale scales */
  float *g2 = malloc(m->n_params * sizeof(float));
  memcpy(g2, grads, m->n_params * sizeof(float));
  m->ops->forward(m, params, tok, tgt, B);
  m->ops->backward(m, params, g2, 3.0f, NULL, NULL);
  for (size_t i = 0; i < m->n_params; i++) CHECK_CLOSE(g2[i], 4.0 * grads[i], 1e-4, 1e-7);
  free(g2);
  free(params), free(grads);
  td_model_destroy(m);
}

static void gpt_reference_config(void) {
  td_gpt_config cfg = {.vocab = 256, .layers = 4, .channels = 256, .heads = 4, .seq = 128};
  td_model *m;
  CHECK_OK(td_gpt_create(&cfg, &m));
  /* torch_gpt_ddp.py's GPT(256, 4, 256, 4, 128) has 3,323,392 parameters */
  CHECK_EQ_INT(m->n_params, 3323392);
  CHECK_EQ_INT(m->n_tensors, 2 + 4 * 12 + 3);
  CHECK(strcmp(m->tensors[0].name, "wte") == 0);
  CHECK(strcmp(m->tensors[m->n_tensors - 1].name, "lm_head.weight") == 0);
  size_t off = 0;
  for (int i = 0; i < m->n_tensors; i++) {
    CHECK_EQ_INT(m->tensors[i].offset, off);
    off += m->tensors[i].count;
  }
  CHECK_EQ_INT(off, m->n_params);
  CHECK_EQ_INT(m->input_bytes, 128 * 4);
  CHECK_EQ_INT(m->targets_per_sample, 128);

  /* deterministic init: same seed -> same bits; another seed -> different */
  float *p1 = malloc(m->n_params * sizeof(float)), *p2 = malloc(m->n_params * sizeof(float));
  td_model_init_params(m, p1, 1234);
  td_model_init_params(m, p2, 1234);
  CHECK(memcmp(p1, p2, m->n_params * sizeof(float)) == 0);
  td_model_init_params(m, p2, 1235);
  CHECK(memcmp(p1, p2, m->n_params * sizeof(float)) != 0);
  /* the init's statistics: wte ~ N(0, 0.02), residual projections 0.02/sqrt(8), ln gains 1, biases 0 */
  for (int i = 0; i < m->n_tensors; i++) {
    const td_param_tensor *t = &m->tensors[i];
    double s = 0, s2 = 0;
    for (size_t j = 0; j < t->count; j++) s += p1[t->offset + j], s2 += (double)p1[t->offset + j] * p1[t->offset + j];
    double mean = s / t->count, sd = sqrt(s2 / t->count - mean * mean);
    if (strstr(t->name, "proj.weight"))
      CHECK_CLOSE(sd, 0.02 / sqrt(8.0), 0.05, 0);
    else if (strstr(t->name, "bias"))
      CHECK(s2 == 0.0);
    else if (strstr(t->name, "ln"))
      CHECK(mean == 1.0 && sd < 1e-6);
    else
      CHECK_CLOSE(sd, 0.02, 0.05, 0);
  }

  /* initial loss ~ ln(256) = 5.545 on random tokens */
  const int B = 2, T = 128;
  int32_t *tok = malloc(B * T * sizeof(int32_t)), *tgt = malloc(B * T * sizeof(int32_t));
  for (int i = 0; i < B * T; i++) tok[i] = (int32_t)((urand() + 1.0f) * 128) & 255, tgt[i] = (tok[i] * 7 + 3) & 255;
  CHECK_OK(m->ops->prepare(m, B));
  float loss = m->ops->forward(m, p1, tok, tgt, B);
  printf("gpt reference config: %zu params, initial loss %.4f (ln 256 = %.4f)\n", m->n_params, loss, log(256.0));
  CHECK_CLOSE(loss, log(256.0), 0.02, 0);
  /* predict: argmax per position, in range */
  int32_t *pred = malloc(B * T * sizeof(int32_t));
  m->ops->predict(m, pred);
  for (int i = 0; i < B * T; i++) CHECK(pred[i] >= 0 && pred[i] < 256);
  /* greedy sampling is deterministic and in range */
  int32_t prompt[3] = {'T', 'h', 'e'}, s1[20], s2[20];
  CHECK_OK(td_gpt_generate(m, p1, prompt, 3, 20, 0.0f, 1, s1));
  CHECK_OK(td_gpt_generate(m, p1, prompt, 3, 20, 0.0f, 2, s2));
  CHECK(memcmp(s1, s2, sizeof s1) == 0);
  CHECK_OK(td_gpt_generate(m, p1, prompt, 3, 20, 1.0f, 7, s1));
  CHECK_OK(td_gpt_generate(m, p1, prompt, 3, 20, 1.0f, 7, s2));
  CHECK(memcmp(s1, s2, sizeof s1) == 0);
  for (int i = 0; i < 20; i++) CHECK(s1[i] >= 0 && s1[i] < 256);
  /* out-of-range tokens and targets are refused with NaN and a message */
  tok[5] = 256;
  CHECK(isnan(m->ops->forward(m, p1, tok, tgt, B)));
  CHECK(strstr(td_last_error(), "token 256 at position 5") != NULL);
  tok[5] = 1;
  tgt[7] = -1;
  CHECK(isnan(m->ops->forward(m, p1, tok, tgt, B)));
  CHECK(strstr(td_last_error(), "target -1 at position 7") != NULL);
  tgt[7] = 1;
  /* a bad prompt token is refused */
  int32_t bad[1] = {300};
  CHECK_STATUS(td_gpt_generate(m, p1, bad, 1, 2, 0.0f, 1, s1), TD_ERR_INVALID_ARGUMENT);
  free(pred), free(tok), free(tgt), free(p1), free(p2);
  td_model_destroy(m);

  /* tied head: V*C fewer parameters */
  cfg.tied = 1;
  CHECK_OK(td_gpt_create(&cfg, &m));
  CHECK_EQ_INT(m->n_params, 3323392 - 256 * 256);
  td_model_destroy(m);
  /* bad configs */
  cfg.heads = 3;
  CHECK_STATUS(td_gpt_create(&cfg, &m), TD_ERR_INVALID_ARGUMENT);
  CHECK(m == NULL);
}

static void cnn_checks(void) {
  td_cnn_config cfg = {.channels1 = 32, .channels2 = 64, .hidden = 128, .classes = 10};
  td_model *m;
  CHECK_OK(td_cnn_create(&cfg, &m));
  /* 32*25+32 + 64*32*25+64 + 128*64*49+128 + 10*128+10 */
  CHECK_EQ_INT(m->n_params, 832 + 51264 + 401536 + 1290);
  float *p1 = malloc(m->n_params * sizeof(float)), *p2 = malloc(m->n_params * sizeof(float));
  td_model_init_params(m, p1, 5);
  td_model_init_params(m, p2, 5);
  CHECK(memcmp(p1, p2, m->n_params * sizeof(float)) == 0);
  /* He init: conv2's weights have sd sqrt(2/800) */
  const td_param_tensor *c2 = &m->tensors[2];
  double s2 = 0;
  for (size_t j = 0; j < c2->count; j++) s2 += (double)p1[c2->offset + j] * p1[c2->offset + j];
  CHECK_CLOSE(sqrt(s2 / c2->count), sqrt(2.0 / 800), 0.03, 0);
  const int B = 4;
  float *x = malloc(B * 784 * sizeof(float));
  for (int i = 0; i < B * 784; i++) x[i] = urand();
  int32_t tgt[4] = {0, 3, 9, 3}, pred[4];
  CHECK_OK(m->ops->prepare(m, B));
  float loss = m->ops->forward(m, p1, x, tgt, B);
  printf("cnn 32/64/128/10: %zu params, initial loss %.3f (ln 10 = %.3f)\n", m->n_params, loss, log(10.0));
  CHECK(loss > 1.0f && loss < 4.0f);
  m->ops->predict(m, pred);
  for (int i = 0; i < B; i++) CHECK(pred[i] >= 0 && pred[i] < 10);
  int32_t bad_tgt[4] = {0, 10, 1, 1};
  CHECK(isnan(m->ops->forward(m, p1, x, bad_tgt, B)));
  CHECK(strstr(td_last_error(), "label 10 of sample 1") != NULL);
  free(p1), free(p2), free(x);
  td_model_destroy(m);

  /* gradcheck on a tiny CNN */
  td_cnn_config tiny = {.channels1 = 2, .channels2 = 3, .hidden = 5, .classes = 4};
  CHECK_OK(td_cnn_create(&tiny, &m));
  float *params = malloc(m->n_params * sizeof(float)), *grads = calloc(m->n_params, sizeof(float));
  td_model_init_params(m, params, 11);
  for (size_t i = 0; i < m->n_params; i++) params[i] += 0.05f * urand(); /* nonzero biases too */
  const int Bt = 2;
  float *xt = malloc(Bt * 784 * sizeof(float));
  for (int i = 0; i < Bt * 784; i++) xt[i] = urand();
  int32_t tt[2] = {1, 3};
  CHECK_OK(m->ops->prepare(m, Bt));
  m->ops->forward(m, params, xt, tt, Bt);
  ready_log log = {.n = 0};
  m->ops->backward(m, params, grads, 1.0f, on_ready, &log);
  check_ready_order(m, &log, 0);
  printf("cnn gradcheck (2/3/5/4, batch 2)\n");
  /* ReLU and max-pool kinks: one-sided differences accepted, and bounds
   * for the rounding noise of small steps (~1e-4 on gradients of ~1e-2);
   * the layer test checks conv2d, maxpool and relu tightly on their own */
  model_gradcheck(m, params, grads, xt, tt, Bt, 1e-3f, 3e-2, 1e-4, 5e-2, 1);
  free(params), free(grads), free(xt);
  td_model_destroy(m);
}

int main(void) {
  setvbuf(stdout, NULL, _IONBF, 0); /* interleave with failure messages on stderr */
  td_nn_set_threads(1);
  gpt_gradcheck(0);
  gpt_gradcheck(1);
  gpt_reference_config();
  cnn_checks();
  printf("model checks passed (%d elements needed a smaller finite-difference step)\n", n_retried);
  return 0;
}
