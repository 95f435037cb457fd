/* The GPT's pipeline stages (td_gpt_stage_create) against the whole model:
 * a chain of stages, each fed the previous one's output and backpropagating
 * the next one's input gradient, gives the whole model's loss and
 * gradients bit for bit (untied head: the same kernels in the same order),
 * and the whole model's initial values; a tied model's wte gradient is the
 * sum of the first stage's and the last stage's copy's (equal up to
 * rounding: the whole model adds them in another order). Cuts: every
 * layer its own stage, uneven cuts, one stage; activation checkpointing on
 * and off; refused ranges. */
#include "../common/check.h"

#include <string.h>

static void fill_tokens(int32_t *x, size_t n, int V, uint64_t *rng) {
  for (size_t i = 0; i < n; i++) x[i] = (int32_t)((td_test_urand(rng) + 1.0f) * 0.5f * V) % V;
}

/* Index of tensor `name` in model m (-1: none). */
static int find(const td_model *m, const char *name) {
  for (int i = 0; i < m->n_tensors; i++)
    if (strcmp(m->tensors[i].name, name) == 0) return i;
  return -1;
}

static void run(const td_gpt_config *cfg, const int *cuts, int n_stages, int ckpt, int B) {
  const int T = cfg->seq, C = cfg->channels, V = cfg->vocab;
  const size_t BT = (size_t)B * T;
  uint64_t rng = 777 + (uint64_t)n_stages;
  int32_t *tokens = malloc(BT * sizeof *tokens), *targets = malloc(BT * sizeof *targets);
  fill_tokens(tokens, BT, V, &rng);
  fill_tokens(targets, BT, V, &rng);
  const float loss_scale = 0.25f;

  td_model *whole;
  CHECK_OK(td_gpt_create(cfg, &whole));
  if (ckpt) CHECK_OK(whole->ops->set_activation_checkpointing(whole, 1));
  float *wp = malloc(whole->n_params * sizeof(float)), *wg = calloc(whole->n_params, sizeof(float));
  td_model_init_params(whole, wp, 42);
  CHECK_OK(whole->ops->prepare(whole, B));
  float wloss = whole->ops->forward(whole, wp, tokens, targets, B);
  whole->ops->backward(whole, wp, wg, loss_scale, NULL, NULL);

  td_model *st[16];
  float *sp[16], *sg[16];
  float *act = NULL;
  float sloss = 0;
  for (int s = 0; s < n_stages; s++) {
    td_gpt_stage stage = {cuts[s], cuts[s + 1] - cuts[s], s == 0, s == n_stages - 1};
    CHECK_OK(td_gpt_stage_create(cfg, &stage, &st[s]));
    if (ckpt) CHECK_OK(st[s]->ops->set_activation_checkpointing(st[s], 1));
    CHECK_EQ_INT(st[s]->input_bytes, s == 0 ? T * sizeof(int32_t) : (size_t)T * C * sizeof(float));
    sp[s] = malloc(st[s]->n_params * sizeof(float));
    sg[s] = calloc(st[s]->n_params, sizeof(float));
    td_model_init_params(st[s], sp[s], 42);
    /* the same initial values as the whole model's tensor of the same name */
    for (int i = 0; i < st[s]->n_tensors; i++) {
      int w = find(whole, st[s]->tensors[i].name);
      CHECK(w >= 0);
      CHECK_EQ_INT(st[s]->tensors[i].count, whole->tensors[w].count);
      CHECK(memcmp(sp[s] + st[s]->tensors[i].offset, wp + whole->tensors[w].offset,
                   whole->tensors[w].count * sizeof(float)) == 0);
    }
    CHECK_OK(st[s]->ops->prepare(st[s], B));
    float l = st[s]->ops->forward(st[s], sp[s], s == 0 ? (const void *)tokens : (const void *)act, targets, B);
    if (s == n_stages - 1) sloss = l;
    else {
      CHECK(l == 0.0f);
      act = (float *)td_gpt_stage_output(st[s]);
      CHECK(act != NULL);
    }
  }
  if (!(sloss == wloss)) td_test_fail(__FILE__, __LINE__, "loss %.9g != whole %.9g", sloss, wloss);
  const float *dout = NULL;
  for (int s = n_stages - 1; s >= 0; s--) {
    if (s < n_stages - 1) td_gpt_stage_set_output_grad(st[s], dout);
    st[s]->ops->backward(st[s], sp[s], sg[s], loss_scale, NULL, NULL);
    if (s > 0) dout = td_gpt_stage_input_grad(st[s]);
  }
  /* every tensor's gradient */
  int tied_copies = 0;
  for (int s = 0; s < n_stages; s++)
    for (int i = 0; i < st[s]->n_tensors; i++) {
      const td_param_tensor *t = &st[s]->tensors[i];
      const td_param_tensor *w = &whole->tensors[find(whole, t->name)];
      const float *a = sg[s] + t->offset, *b = wg + w->offset;
      if (cfg->tied && strcmp(t->name, "wte") == 0 && n_stages > 1) {
        tied_copies++;
        continue;
      }
      for (size_t k = 0; k < t->count; k++)
        if (memcmp(&a[k], &b[k], sizeof(float)) != 0)
          td_test_fail(__FILE__, __LINE__, "stage %d of %d, %s[%zu]: %.9g != whole %.9g", s, n_stages, t->name, k,
                       a[k], b[k]);
    }
  if (cfg->tied && n_stages > 1) {
    CHECK_EQ_INT(tied_copies, 2);
    const td_param_tensor *w = &whole->tensors[find(whole, "wte")];
    const td_param_tensor *a = &st[0]->tensors[find(st[0], "wte")];
    const td_param_tensor *h = &st[n_stages - 1]->tensors[find(st[n_stages - 1], "wte")];
    for (size_t k = 0; k < w->count; k++)
      CHECK_CLOSE(sg[0][a->offset + k] + sg[n_stages - 1][h->offset + k], wg[w->offset + k], 1e-5, 1e-7);
  }
  for (int s = 0; s < n_stages; s++) {
    td_model_destroy(st[s]);
    free(sp[s]);
    free(sg[s]);
  }
  td_model_destroy(whole);
  free(wp), free(wg), free(tokens), free(targets);
}

int main(void) {
  td_gpt_config cfg = {.vocab = 37, .layers = 4, .channels = 24, .heads = 3, .seq = 7, .tied = 0};
  const int every[] = {0, 1, 2, 3, 4}, uneven[] = {0, 3, 4}, two[] = {0, 2, 4}, one[] = {0, 4};
  for (int tied = 0; tied <= 1; tied++)
    for (int ckpt = 0; ckpt <= 1; ckpt++) {
      cfg.tied = tied;
      run(&cfg, every, 4, ckpt, 3);
      run(&cfg, uneven, 2, ckpt, 1);
      run(&cfg, two, 2, ckpt, 2);
      run(&cfg, one, 1, ckpt, 2);
    }
  printf("stage chains equal the whole model (untied: bit for bit)\n");
  /* refused ranges */
  td_model *m = NULL;
  td_gpt_stage bad[] = {{-1, 2, 0, 0}, {3, 2, 0, 1}, {1, 0, 0, 0}, {0, 2, 0, 0}, {1, 2, 1, 0}, {2, 2, 0, 0}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    CHECK_STATUS(td_gpt_stage_create(&cfg, &bad[i], &m), TD_ERR_INVALID_ARGUMENT);
    CHECK(m == NULL);
    CHECK(strstr(td_last_error(), "stage of blocks"));
  }
  /* a stage without the head has no loss and no predictions; generate refuses stages */
  td_gpt_stage first = {0, 2, 1, 0};
  CHECK_OK(td_gpt_stage_create(&cfg, &first, &m));
  CHECK(strstr(m->config, "stage_layers=0-2") != NULL);
  int32_t prompt[1] = {1}, out[2];
  float *p = calloc(m->n_params, sizeof(float));
  CHECK_STATUS(td_gpt_generate(m, p, prompt, 1, 2, 0.0f, 1, out), TD_ERR_INVALID_USAGE);
  free(p);
  td_model_destroy(m);
  printf("ok\n");
  return 0;
}
