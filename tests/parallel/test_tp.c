/* Tensor parallelism (src/parallel/tensor) against the unsplit layers and
 * model of src/nn, under tandemrun -np P:
 *
 *   test_tp layers            each parallel layer (row- and column-parallel
 *                             linear, vocabulary-parallel embedding, parallel
 *                             cross-entropy) forward and backward against
 *                             the nn layer on the whole tensors, at odd sizes
 *                             and uneven splits (1, 7, 13 rows; 37 tokens).
 *   test_tp model TIED [sp]   td_gpt_tp_create on P ranks (sp: with sequence
 *                             parallelism) against td_gpt_create:
 *                             initial shards equal the cut of the unsplit
 *                             values (exactly), loss, every gradient tensor,
 *                             predictions and the gradient norm agree; the
 *                             ready callback reports every tensor once.
 *   test_tp refuse-sp         sequence parallelism's refusals, and those of 3D stages
 *                             (sp without a tensor group, heads the group does not divide);
 *                             with TD_TEST_DEVICE an odd sequence on the device too, and at
 *                             -np 4 a device's TP=2 x PP=2 stages with sp (not built).
 *   test_tp train TP STEPS [sp]  N ranks as data N/TP x tensor TP train STEPS
 *                             AdamW steps (clipping on) of a GPT with a
 *                             57-token vocabulary (uneven shards); every rank
 *                             also trains the unsplit GPT alone on the whole
 *                             global batch: losses within 1e-5 relative each
 *                             step, final shards within 1e-4 (but the key bias: see there).
 *   test_tp train TP STEPS [sp] [pp=PP] [tied] [zero1|zero2|zero3] [ckpt] [interleaved] [bf16|fp16]
 *                             the same with PP pipeline
 *                             stages of tensor-parallel layers (3D: N ranks
 *                             as data x pipeline PP x tensor TP; 4 blocks, 4
 *                             micro-batches per step through 1F1B; tied: a
 *                             tied wte, its gradient summed between the
 *                             first and the last stage per tensor rank;
 *                             zero1: ZeRO-1 over the data-parallel ranks;
 *                             zero2: ZeRO-2 (gradients reduced to their
 *                             owners' shards, the norm from the shards);
 *                             zero3: ZeRO-3 (on a device pp=1 only), also against
 *                             the same layout at ZeRO-0 trained beside it
 *                             (losses, norms and the shard's parameters
 *                             within 1e-6) and its model-state bytes per
 *                             rank (a device: against the closed form; the
 *                             CPU: the shard's 12 bytes a parameter at
 *                             least, ZeRO-0's at most);
 *                             sp on a device: also against the same layout
 *                             without sp trained beside it (1e-5; the first
 *                             loss bit for bit at TP=2) and its activations
 *                             (allocated = estimated, fewer);
 *                             bf16/fp16: both trainers in that mixed
 *                             precision, losses within a fraction of a half
 *                             ulp (test's bounds), fp16 with an inf in one
 *                             world rank's gradients at step 3 that every
 *                             rank must skip with the one rank's reference;
 *                             interleaved: Megatron's interleaved schedule,
 *                             2 chunks of 1 block per rank;
 *                             ckpt: activation checkpointing, and each step's
 *                             loss, norm and the final shards bit for bit
 *                             those of the same layout without it),
 *                             against the same unsplit single-rank training.
 *   test_tp bytes             parameters per rank at TP=2 (-np 2) or TP=2 x PP=2
 *                             (-np 4) at GPT-2 124M's shape against the closed
 *                             form (model_bytes); with TD_TEST_DEVICE also the
 *                             tensor group's host staging estimate.
 *   test_tp compose TP PP     a directly built TP (x PP) model in td_trainer_create:
 *                             bf16/fp16/f32 at ZeRO 0-3 accepted (ZeRO-3: the CPU's
 *                             tensor-parallel models and stages fetch their groups).
 *   test_tp kill TP VICTIM [pp=PP]   as train, but rank VICTIM SIGKILLs itself while
 *                             its step 2 reads data: every other rank's step
 *                             fails within the timeout with a message naming
 *                             the victim (no hang); prints "kill ok rank R".
 *
 * TD_TEST_DEVICE=cuda:N (train, kill): the tensor-parallel model
 * (td_gpt_tp_create_on; pipeline stages with td_pipeline_config.device) and
 * the one-rank reference compute on that device (the ranks share it), the
 * parameters read back from it; the vocabulary split as on the CPU (the
 * device's vocabulary-parallel embedding, head and cross-entropy).
 * TD_TEST_DEVICE=cuda: each rank on its own GPU (cuda:(local rank %
 * GPUs), td_train_device_select), so that the tensor group's allreduces can
 * take NCCL; TANDEM_TEST_EXPECT_PATH=nccl|staged: fail unless the tensor
 * group's device collectives took that path.
 * Without a device the test prints "skipped: no GPU: <why>" and passes,
 * unless TD_TEST_EXPECT_CUDA is set (then it fails).
 *
 * The expected shards are cut here from the unsplit tensors by Megatron's
 * layout written out independently of the library (cut_expected). */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/check.h"
#include "comm/device/device_coll.h"
#include "parallel/tensor/tensor.h"
#include "tandem/train.h"

static td_comm *world;
static int P, R; /* tensor-parallel size and rank (layers, model: the world) */
static td_device g_dev; /* TD_TEST_DEVICE, or the CPU */

/* n floats of an arena of the trainer's device, on the host (free with free) */
static float *host_copy(const float *arena, size_t n) { return td_test_host_copy(arena, g_dev, n); }

/* Split n into P parts with boundaries floor(k n / P): uneven for odd n. */
static void split(int n, int parts, int k, int *lo, int *len) {
  *lo = (int)((long)k * n / parts);
  *len = (int)((long)(k + 1) * n / parts) - *lo;
}

static float max_abs(const float *x, size_t n) {
  float m = 0;
  for (size_t i = 0; i < n; i++) m = fabsf(x[i]) > m ? fabsf(x[i]) : m;
  return m;
}
/* |got - want| <= rtol * max|want| + atol elementwise, naming what differs. */
static void check_near(const char *what, const float *got, const float *want, size_t n, double rtol, double atol) {
  double tol = rtol * max_abs(want, n) + atol;
  for (size_t i = 0; i < n; i++)
    if (!(fabs((double)got[i] - want[i]) <= tol))
      td_test_fail(__FILE__, __LINE__, "rank %d: %s[%zu] = %.9g, want %.9g (tolerance %.3g)", R, what, i, got[i],
                   want[i], tol);
}

static void expect_message(td_status st, const char *needle) {
  CHECK_EQ_INT(st, TD_ERR_INVALID_ARGUMENT);
  if (!strstr(td_last_error(), needle))
    td_test_fail(__FILE__, __LINE__, "message \"%s\" lacks \"%s\"", td_last_error(), needle);
}

/* ---- layers ---- */

static void layers(void) {
  uint64_t seed = 77;
  const int sizes[][3] = {{1, 5, 3}, {7, 13, 9}, {13, 8, 16}}; /* N, IC, OC */
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    const int N = sizes[s][0], IC = sizes[s][1], OC = sizes[s][2];
    float *x = td_test_rand_buf(&seed, (size_t)N * IC, 1.0f), *w = td_test_rand_buf(&seed, (size_t)OC * IC, 0.5f);
    float *b = td_test_rand_buf(&seed, OC, 0.5f), *dy = td_test_rand_buf(&seed, (size_t)N * OC, 1.0f);
    float *y = calloc((size_t)N * OC, 4), *dx = calloc((size_t)N * IC, 4), *dw = calloc((size_t)OC * IC, 4),
          *db = calloc(OC, 4);
    td_linear_forward(y, x, w, b, N, IC, OC);
    td_linear_backward(dx, dw, db, dy, x, w, N, IC, OC);
    /* row-parallel: this rank's input columns [lo, lo + n) */
    int lo, n;
    split(IC, P, R, &lo, &n);
    float *xl = calloc((size_t)N * n + 1, 4), *wl = calloc((size_t)OC * n + 1, 4), *yl = calloc((size_t)N * OC, 4);
    float *dxl = calloc((size_t)N * n + 1, 4), *dwl = calloc((size_t)OC * n + 1, 4), *dbl = calloc(OC, 4);
    for (int i = 0; i < N; i++) memcpy(xl + (size_t)i * n, x + (size_t)i * IC + lo, (size_t)n * 4);
    for (int o = 0; o < OC; o++) memcpy(wl + (size_t)o * n, w + (size_t)o * IC + lo, (size_t)n * 4);
    CHECK_OK(tp_row_linear_forward(yl, xl, wl, b, N, n, OC, world));
    check_near("row forward", yl, y, (size_t)N * OC, 1e-5, 1e-6);
    tp_row_linear_backward(dxl, dwl, dbl, dy, xl, wl, N, n, OC);
    float *want = calloc((size_t)OC * IC + (size_t)N * IC + 1, 4);
    for (int i = 0; i < N; i++) memcpy(want + (size_t)i * n, dx + (size_t)i * IC + lo, (size_t)n * 4);
    check_near("row dinp", dxl, want, (size_t)N * n, 1e-5, 1e-6);
    for (int o = 0; o < OC; o++) memcpy(want + (size_t)o * n, dw + (size_t)o * IC + lo, (size_t)n * 4);
    check_near("row dweight", dwl, want, (size_t)OC * n, 1e-5, 1e-6);
    check_near("row dbias", dbl, db, OC, 1e-6, 0);
    /* column-parallel: this rank's output rows [lo, lo + n) */
    split(OC, P, R, &lo, &n);
    float *yc = calloc((size_t)N * n + 1, 4), *dyc = calloc((size_t)N * n + 1, 4), *dxc = calloc((size_t)N * IC, 4);
    float *dwc = calloc((size_t)n * IC + 1, 4), *dbc = calloc((size_t)n + 1, 4);
    for (int i = 0; i < N; i++) memcpy(dyc + (size_t)i * n, dy + (size_t)i * OC + lo, (size_t)n * 4);
    tp_column_linear_forward(yc, x, w + (size_t)lo * IC, b + lo, N, IC, n);
    for (int i = 0; i < N; i++) memcpy(want + (size_t)i * n, y + (size_t)i * OC + lo, (size_t)n * 4);
    check_near("column forward", yc, want, (size_t)N * n, 1e-6, 1e-7);
    for (size_t i = 0; i < (size_t)N * IC; i++) dxc[i] = 1e9f; /* SET, not accumulated */
    CHECK_OK(tp_column_linear_backward(dxc, dwc, dbc, dyc, x, w + (size_t)lo * IC, N, IC, n, world));
    check_near("column dinp", dxc, dx, (size_t)N * IC, 1e-5, 1e-6);
    check_near("column dweight", dwc, dw + (size_t)lo * IC, (size_t)n * IC, 1e-6, 1e-7);
    check_near("column dbias", dbc, db + lo, n, 1e-6, 1e-7);
    free(x), free(w), free(b), free(dy), free(y), free(dx), free(dw), free(db), free(xl), free(wl), free(yl);
    free(dxl), free(dwl), free(dbl), free(want), free(yc), free(dyc), free(dxc), free(dwc), free(dbc);
  }
  /* sequence parallelism's variants: N = 3P rows, this rank's N/P of them */
  {
    const int N = 3 * P, IC = 10, OC = 7, rows = N / P, first = R * rows;
    float *x = td_test_rand_buf(&seed, (size_t)N * IC, 1.0f), *w = td_test_rand_buf(&seed, (size_t)OC * IC, 0.5f);
    float *b = td_test_rand_buf(&seed, OC, 0.5f), *dy = td_test_rand_buf(&seed, (size_t)N * OC, 1.0f);
    float *y = calloc((size_t)N * OC, 4), *dx = calloc((size_t)N * IC, 4), *dw = calloc((size_t)OC * IC, 4);
    td_linear_forward(y, x, w, b, N, IC, OC);
    td_linear_backward(dx, dw, NULL, dy, x, w, N, IC, OC);
    int lo, n;
    split(IC, P, R, &lo, &n); /* row-parallel: input columns */
    float *xl = calloc((size_t)N * n + 1, 4), *wl = calloc((size_t)OC * n + 1, 4), *part = calloc((size_t)N * OC, 4);
    float *yl = calloc((size_t)rows * OC, 4);
    for (int i = 0; i < N; i++) memcpy(xl + (size_t)i * n, x + (size_t)i * IC + lo, (size_t)n * 4);
    for (int o = 0; o < OC; o++) memcpy(wl + (size_t)o * n, w + (size_t)o * IC + lo, (size_t)n * 4);
    CHECK_OK(tp_row_linear_forward_sp(yl, part, xl, wl, b, N, n, OC, world));
    check_near("row forward (sp)", yl, y + (size_t)first * OC, (size_t)rows * OC, 1e-5, 1e-6);
    split(OC, P, R, &lo, &n); /* column-parallel: output rows */
    float *dyc = calloc((size_t)N * n + 1, 4), *dxl = calloc((size_t)rows * IC, 4), *dwc = calloc((size_t)n * IC + 1, 4);
    float *partc = calloc((size_t)N * IC, 4);
    for (int i = 0; i < N; i++) memcpy(dyc + (size_t)i * n, dy + (size_t)i * OC + lo, (size_t)n * 4);
    CHECK_OK(tp_column_linear_backward_sp(dxl, partc, dwc, NULL, dyc, x, w + (size_t)lo * IC, N, IC, n, world));
    check_near("column dinp (sp)", dxl, dx + (size_t)first * IC, (size_t)rows * IC, 1e-5, 1e-6);
    check_near("column dweight (sp)", dwc, dw + (size_t)lo * IC, (size_t)n * IC, 1e-6, 1e-7);
    /* embedding: B = P sequences of 3 tokens, 37-token vocabulary */
    const int V = 37, T = 3, C = 5;
    int32_t *tok = malloc((size_t)N * 4);
    for (int i = 0; i < N; i++) tok[i] = (i * 17 + 2) % V;
    float *wte = td_test_rand_buf(&seed, (size_t)V * C, 1.0f), *wpe = td_test_rand_buf(&seed, (size_t)T * C, 1.0f);
    float *emb = calloc((size_t)N * C, 4), *embl = calloc((size_t)rows * C, 4), *parte = calloc((size_t)N * C, 4);
    int v0, vl;
    split(V, P, R, &v0, &vl);
    td_embedding_forward(emb, tok, wte, wpe, P, T, C);
    CHECK_OK(tp_embedding_forward_sp(embl, parte, tok, wte + (size_t)v0 * C, wpe, P, T, C, v0, vl, world));
    check_near("embedding forward (sp)", embl, emb + (size_t)first * C, (size_t)rows * C, 1e-6, 0);
    free(x), free(w), free(b), free(dy), free(y), free(dx), free(dw), free(xl), free(wl), free(part), free(yl);
    free(dyc), free(dxl), free(dwc), free(partc), free(tok), free(wte), free(wpe), free(emb), free(embl), free(parte);
  }
  /* vocabulary-parallel embedding and cross-entropy, 37 tokens over P ranks */
  const int B = 3, T = 5, C = 6, V = 37, N = B * T;
  int32_t tokens[3 * 5], targets[3 * 5];
  for (int i = 0; i < N; i++) tokens[i] = (i * 11 + 3) % V, targets[i] = (i * 7 + 36) % V;
  tokens[0] = 0, tokens[1] = V - 1, targets[2] = 0, targets[3] = V - 1; /* the ends of the vocabulary */
  float *wte = td_test_rand_buf(&seed, (size_t)V * C, 1.0f), *wpe = td_test_rand_buf(&seed, (size_t)T * C, 1.0f);
  float *emb = calloc((size_t)N * C, 4), *embl = calloc((size_t)N * C, 4), *dout = td_test_rand_buf(&seed, (size_t)N * C, 1.0f);
  float *dwte = calloc((size_t)V * C, 4), *dwpe = calloc((size_t)T * C, 4), *dwtel = calloc((size_t)V * C, 4),
        *dwpel = calloc((size_t)T * C, 4);
  int v0, vl;
  split(V, P, R, &v0, &vl);
  td_embedding_forward(emb, tokens, wte, wpe, B, T, C);
  CHECK_OK(tp_embedding_forward(embl, tokens, wte + (size_t)v0 * C, wpe, B, T, C, v0, vl, world));
  check_near("embedding forward", embl, emb, (size_t)N * C, 1e-6, 0);
  td_embedding_backward(dwte, dwpe, dout, tokens, B, T, C);
  tp_embedding_backward(dwtel, dwpel, dout, tokens, B, T, C, v0, vl);
  check_near("embedding dwte", dwtel, dwte + (size_t)v0 * C, (size_t)vl * C, 1e-6, 0);
  check_near("embedding dwpe", dwpel, dwpe, (size_t)T * C, 1e-6, 0);
  float *logits = td_test_rand_buf(&seed, (size_t)N * V, 4.0f), *probs = calloc((size_t)N * V, 4);
  float *dlogits = calloc((size_t)N * V, 4);
  float *ll = calloc((size_t)N * vl + 1, 4), *dll = calloc((size_t)N * vl + 1, 4), *stats = calloc(3 * (size_t)N, 4);
  for (int i = 0; i < N; i++) memcpy(ll + (size_t)i * vl, logits + (size_t)i * V + v0, (size_t)vl * 4);
  float loss = td_softmax_xent_forward(probs, logits, targets, N, V), loss_tp = 0;
  td_softmax_xent_backward(dlogits, probs, targets, 0.5f, N, V);
  CHECK_OK(tp_xent_forward(ll, ll, targets, N, v0, vl, stats, &loss_tp, world));
  CHECK_CLOSE(loss_tp, loss, 1e-6, 0);
  float *want = calloc((size_t)N * vl + 1, 4);
  for (int i = 0; i < N; i++) memcpy(want + (size_t)i * vl, probs + (size_t)i * V + v0, (size_t)vl * 4);
  check_near("xent probs", ll, want, (size_t)N * vl, 1e-5, 1e-7);
  tp_xent_backward(dll, ll, targets, 0.5f, N, v0, vl);
  for (int i = 0; i < N; i++) memcpy(want + (size_t)i * vl, dlogits + (size_t)i * V + v0, (size_t)vl * 4);
  check_near("xent dlogits", dll, want, (size_t)N * vl, 1e-5, 1e-8);
  free(wte), free(wpe), free(emb), free(embl), free(dout), free(dwte), free(dwpe), free(dwtel), free(dwpel);
  free(logits), free(probs), free(dlogits), free(ll), free(dll), free(stats), free(want);
  if (R == 0) printf("tp layers: %d ranks: row/column linear, embedding, cross-entropy agree with the unsplit layers\n", P);
}

/* ---- the model ---- */

/* The shard of unsplit tensor `name` (whole values in `full`) on tensor
 * rank r of p, by Megatron's layout: returns its length, writes it to out. */
static size_t cut_expected(const td_gpt_config *c, const char *name, const float *full, size_t count, int p, int r,
                           float *out) {
  const size_t C = c->channels, Cl = C / p, F = 4 * C, Fl = F / p;
  size_t v0 = 0, vl = 0;
  td_shard_range((size_t)c->vocab, p, r, &v0, &vl); /* the documented split (on a device too) */
  const char *dot = strchr(name, '.');
  const char *suffix = name[0] == 'h' && dot ? dot + 1 : name;
  size_t n = 0;
  if (!strcmp(name, "wte") || !strcmp(name, "lm_head.weight")) {
    for (size_t v = 0; v < vl; v++)
      for (size_t k = 0; k < C; k++) out[n++] = full[(v0 + v) * C + k];
  } else if (!strcmp(suffix, "attn.qkv.weight") || !strcmp(suffix, "attn.qkv.bias")) {
    size_t width = strstr(suffix, "weight") ? C : 1;
    for (size_t part = 0; part < 3; part++) /* q, k, v: this rank's heads' rows of each */
      for (size_t row = r * Cl; row < (r + 1) * Cl; row++)
        for (size_t k = 0; k < width; k++) out[n++] = full[(part * C + row) * width + k];
  } else if (!strcmp(suffix, "attn.proj.weight")) {
    for (size_t row = 0; row < C; row++)
      for (size_t k = r * Cl; k < (r + 1) * Cl; k++) out[n++] = full[row * C + k];
  } else if (!strcmp(suffix, "mlp.fc.weight") || !strcmp(suffix, "mlp.fc.bias")) {
    size_t width = strstr(suffix, "weight") ? C : 1;
    for (size_t row = r * Fl; row < (r + 1) * Fl; row++)
      for (size_t k = 0; k < width; k++) out[n++] = full[row * width + k];
  } else if (!strcmp(suffix, "mlp.proj.weight")) {
    for (size_t row = 0; row < C; row++)
      for (size_t k = r * Fl; k < (r + 1) * Fl; k++) out[n++] = full[row * F + k];
  } else {
    memcpy(out, full, count * sizeof(float)); /* replicated */
    n = count;
  }
  return n;
}

static int n_ready_calls;
static unsigned char *ready_seen;
static void on_ready(void *ctx, size_t offset, size_t count) {
  (void)ctx;
  n_ready_calls++;
  for (size_t i = offset; i < offset + count; i++) {
    CHECK(!ready_seen[i]);
    ready_seen[i] = 1;
  }
}

static void model(int tied, int sp) {
  /* sequence parallelism splits the B*T rows: a sequence length every P divides */
  td_gpt_config cfg = {.vocab = 67, .layers = 2, .channels = 24, .heads = 6, .seq = sp ? 6 : 7, .tied = tied};
  const int B = 3, N = B * cfg.seq;
  td_model *full = NULL, *tp = NULL;
  td_grid *grid = NULL;
  CHECK_OK(td_grid_create(world, P, 1, &grid));
  CHECK_OK(td_gpt_create(&cfg, &full));
  CHECK_OK(td_gpt_tp_create(&cfg, grid, &tp));
  if (sp) CHECK_OK(td_gpt_tp_set_sequence_parallel(tp, 1));
  CHECK_EQ_INT(tp->n_tensors, full->n_tensors);
  float *pf = calloc(full->n_params, 4), *gf = calloc(full->n_params, 4);
  float *pt = calloc(tp->n_params, 4), *gt = calloc(tp->n_params, 4);
  float *want = calloc(full->n_params, 4);
  td_model_init_params(full, pf, 99);
  td_model_init_params(tp, pt, 99);
  size_t total = 0;
  for (int i = 0; i < tp->n_tensors; i++) {
    const td_param_tensor *a = &tp->tensors[i], *b = &full->tensors[i];
    CHECK(strcmp(a->name, b->name) == 0);
    size_t n = cut_expected(&cfg, b->name, pf + b->offset, b->count, P, R, want);
    CHECK_EQ_INT(a->count, n);
    CHECK_EQ_INT(a->offset, total);
    total += n;
    if (memcmp(pt + a->offset, want, n * 4) != 0) td_test_fail(__FILE__, __LINE__, "initial %s differs", a->name);
  }
  CHECK_EQ_INT(tp->n_params, total);
  int32_t *tok = malloc((size_t)N * 4), *tgt = malloc((size_t)N * 4), *pred_f = malloc((size_t)N * 4),
          *pred_t = malloc((size_t)N * 4);
  for (int i = 0; i < N; i++) tok[i] = (i * 13 + 5) % cfg.vocab, tgt[i] = (i * 29 + 1) % cfg.vocab;
  tok[0] = cfg.vocab - 1, tgt[1] = 0;
  CHECK_OK(full->ops->prepare(full, B));
  CHECK_OK(tp->ops->prepare(tp, B));
  float lf = full->ops->forward(full, pf, tok, tgt, B), lt = tp->ops->forward(tp, pt, tok, tgt, B);
  CHECK(isfinite(lt));
  CHECK_CLOSE(lt, lf, 1e-5, 0);
  full->ops->predict(full, pred_f);
  tp->ops->predict(tp, pred_t);
  for (int i = 0; i < N; i++) CHECK_EQ_INT(pred_t[i], pred_f[i]);
  full->ops->backward(full, pf, gf, 2.0f, NULL, NULL);
  ready_seen = calloc(tp->n_params, 1);
  n_ready_calls = 0;
  tp->ops->backward(tp, pt, gt, 2.0f, on_ready, NULL);
  CHECK_EQ_INT(n_ready_calls, tp->n_tensors);
  for (size_t i = 0; i < tp->n_params; i++) CHECK(ready_seen[i]);
  double sq_full = 0, sq_tp = 0;
  for (int i = 0; i < tp->n_tensors; i++) {
    const td_param_tensor *a = &tp->tensors[i], *b = &full->tensors[i];
    size_t n = cut_expected(&cfg, b->name, gf + b->offset, b->count, P, R, want);
    check_near(a->name, gt + a->offset, want, n, 1e-4, 1e-7);
  }
  for (size_t i = 0; i < full->n_params; i++) sq_full += (double)gf[i] * gf[i];
  for (size_t i = 0; i < tp->n_params; i++) sq_tp += (double)gt[i] * gt[i];
  CHECK(tp->ops->grad_norm_sq != NULL);
  /* ZeRO-2's use: the arena cut into pieces (an odd cut, through tensors),
   * each piece's norm summed over the group, the pieces' sums adding up to
   * the whole model's */
  const size_t cuts[] = {0, tp->n_params / 3 + 1, tp->n_params / 2 + 7, tp->n_params};
  double pieces = 0;
  for (int k = 0; k < 3; k++) {
    size_t lo = cuts[k], hi = cuts[k + 1]; /* n_params is far above 14 */
    double sq = 0;
    for (size_t i = lo; i < hi; i++) sq += (double)gt[i] * gt[i];
    CHECK_OK(tp->ops->grad_norm_sq(tp, gt, lo, hi, &sq));
    pieces += sq;
  }
  CHECK_OK(tp->ops->grad_norm_sq(tp, gt, 0, tp->n_params, &sq_tp));
  CHECK_CLOSE(sq_tp, sq_full, 1e-5, 0);
  CHECK_CLOSE(pieces, sq_full, 1e-5, 0);
  /* fp16's overflow flag: any rank's, on every rank */
  for (int who = 0; who < P; who++) {
    int32_t flag = R == who;
    CHECK_OK(tp->ops->group_max(tp, &flag));
    CHECK_EQ_INT(flag, 1);
  }
  int32_t none = 0;
  CHECK_OK(tp->ops->group_max(tp, &none));
  CHECK_EQ_INT(none, 0);
  /* out-of-vocabulary tokens are refused with NaN, not read */
  tok[2] = cfg.vocab;
  CHECK(isnan(tp->ops->forward(tp, pt, tok, tgt, B)));
  CHECK(strstr(td_last_error(), "outside the vocabulary"));
  if (R == 0)
    printf("tp model (%s%s): %d ranks: shards %zu of %zu parameters, loss %.7f vs %.7f, gradients and predictions "
           "agree\n", tied ? "tied" : "untied", sp ? ", sequence-parallel" : "", P, tp->n_params, full->n_params, lt, lf);
  free(ready_seen), free(pf), free(gf), free(pt), free(gt), free(want), free(tok), free(tgt), free(pred_f), free(pred_t);
  td_model_destroy(tp);
  td_model_destroy(full);
  td_grid_destroy(grid);
}

/* ---- training ---- */

enum { TRAIN_V = 57, TRAIN_T = 8, TRAIN_G = 8 };
static int kill_rank = -1; /* the world rank that SIGKILLs itself at its step 2's data */
#define OVERFLOW_STEP 3      /* fp16: the step whose gradients overflow on one rank */
static int world_rank;
static int train_step_now;

static td_status text_get(const td_dataset *ds, size_t index, void *input, int32_t *targets) {
  (void)ds;
  if (train_step_now == 1 && world_rank == kill_rank) raise(SIGKILL);
  int32_t *tok = input;
  for (int j = 0; j <= TRAIN_T; j++) {
    size_t p = index * TRAIN_T + (size_t)j;
    int32_t v = (int32_t)(("tensor parallel gpt; megatron's f and g. "[(p * 7) % 41]) % TRAIN_V);
    if (j < TRAIN_T) tok[j] = v;
    if (j > 0) targets[j - 1] = v;
  }
  return TD_OK;
}
static void plain_destroy(td_dataset *ds) { free(ds); }

static int train_zero; /* ZeRO stage of the model-parallel trainer (train ... zero1 | zero2) */
static int train_ckpt; /* activation checkpointing in the model-parallel trainer (train ... ckpt) */
static int train_interleaved; /* the pipeline's interleaved schedule, 2 chunks per rank (train ... interleaved) */
static td_dtype train_dtype = TD_F32; /* mixed precision of both trainers (train ... bf16 | fp16) */
/* A tied embedding (train ... tied): both trainers use AdamW's eps 1e-3.
 * The tied wte's gradient is summed in another order (the first and the
 * last stage's parts, each over its micro-batches) than one rank's, and
 * AdamW divides by sqrt(v) + eps: on an element whose gradient is ~0,
 * eps 1e-8 turns that rounding noise g into a step of about lr g / 1e-8,
 * which then moves the other weights apart through the forward. With
 * eps 1e-8, h2.mlp.proj.weight[232] of PP=2 x DP=2 ZeRO-2 ended 6.3e-6
 * apart against a 5.9e-6 bound on a machine whose OpenBLAS rounds
 * differently (2026-11-28; it had passed on the machine before), with the
 * losses within 3.7e-8. eps 1e-3 bounds such a step by lr g / 1e-3 (as
 * tests/pipeline/test_pipeline_train.c does on a device), while the
 * model still trains and the bounds stay as tight. */
static int train_tied;
static td_trainer *make_trainer(td_model *m, td_dataset *ds, td_comm *comm, int micro, int accum) {
  td_train_config c;
  td_train_config_defaults(&c);
  c.micro_batch = micro;
  c.grad_accum = accum;
  c.precision.compute = train_dtype;
  c.zero_stage = comm ? train_zero : 0;
  c.activation_checkpointing = comm ? train_ckpt : 0;
  c.seed = 7;
  c.optimizer.kind = TD_OPTIMIZER_ADAMW;
  c.optimizer.lr = 3e-3f;
  c.optimizer.weight_decay = 0.01f;
  if (train_tied) c.optimizer.eps = 1e-3f;
  c.grad_clip = 0.5f; /* small enough to clip: the model-parallel norm matters */
  c.threads = 1;
  c.first_bucket_bytes = 1024;
  c.bucket_bytes = 4096;
  td_trainer *t = NULL;
  CHECK_OK(td_trainer_create(&c, m, ds, comm, &t));
  return t;
}

static void train(int tp, int pp, int steps, int sp, int tied) {
  const int n = td_comm_size(world), rank = td_comm_rank(world);
  train_tied = tied;
  td_grid *grid = NULL;
  CHECK_OK(td_grid_create(world, tp, pp, &grid));
  P = tp;
  R = td_grid_rank(grid, TD_GRID_TENSOR);
  const int dp = td_grid_size(grid, TD_GRID_DATA);
  /* a pipeline: 2 blocks per stage (the second stage's names start at h2), 4 micro-batches */
  const int micro_steps = pp > 1 ? 4 : 1;
  td_gpt_config cfg = {.vocab = TRAIN_V, .layers = pp > 1 ? 4 : 2, .channels = 16, .heads = 4, .seq = TRAIN_T,
                       .tied = tied};
  CHECK(TRAIN_G % (dp * micro_steps) == 0);
  td_dataset *ds = calloc(1, sizeof *ds);
  ds->n_samples = 64;
  ds->input_bytes = TRAIN_T * sizeof(int32_t);
  ds->targets_per_sample = TRAIN_T;
  ds->get = text_get;
  ds->destroy = plain_destroy;
  td_model *mt = NULL, *mf = NULL, *mplain = NULL;
  /* the twin: the same layout without the one thing under test (checkpointing,
   * ZeRO-3, or on a device sequence parallelism), trained beside it */
  const enum { TWIN_NONE, TWIN_CKPT, TWIN_ZERO0, TWIN_NOSP } twin =
      train_ckpt ? TWIN_CKPT : train_zero == 3 ? TWIN_ZERO0 : sp && g_dev.kind != TD_DEVICE_CPU ? TWIN_NOSP : TWIN_NONE;
  for (int k = 0; k < 1 + (twin != TWIN_NONE); k++) {
    td_model **m = k == 0 ? &mt : &mplain;
    const int sp_here = sp && !(k == 1 && twin == TWIN_NOSP);
    if (pp > 1) {
      td_pipeline_config pc = {.sequence_parallel = sp_here, .device = g_dev};
      if (train_interleaved) pc.schedule = "interleaved", pc.chunks = 2;
      CHECK_OK(td_gpt_pipeline_create_grid(&cfg, &pc, grid, m));
    } else {
      CHECK_OK(td_gpt_tp_create_on(&cfg, grid, g_dev, m));
      if (sp_here) CHECK_OK(td_gpt_tp_set_sequence_parallel(*m, 1));
    }
  }
  CHECK_OK(td_gpt_create_on(&cfg, g_dev, &mf));
  /* fp16: one world rank alone (the last: last stage, last tensor rank, last
   * replica) finds an inf in its gradients at step OVERFLOW_STEP; the one
   * rank's reference finds one at the same step. Every rank must skip it. */
  const int overflow_rank = n - 1, dp_rank = td_grid_rank(grid, TD_GRID_DATA);
  char inject[32];
  snprintf(inject, sizeof inject, "%d:%d", OVERFLOW_STEP, dp_rank);
  if (train_dtype == TD_F16 && rank == overflow_rank) CHECK(setenv("TANDEM_FP16_INJECT_INF", inject, 1) == 0);
  td_trainer *t = make_trainer(mt, ds, td_grid_comm(grid, TD_GRID_DATA), TRAIN_G / dp / micro_steps, micro_steps);
  snprintf(inject, sizeof inject, "%d:0", OVERFLOW_STEP);
  if (train_dtype == TD_F16) CHECK(setenv("TANDEM_FP16_INJECT_INF", inject, 1) == 0);
  td_trainer *ref = kill_rank >= 0 ? NULL : make_trainer(mf, ds, NULL, TRAIN_G, 1);
  unsetenv("TANDEM_FP16_INJECT_INF");
  /* the bounds: f32 differs from one rank only in the order of f32 sums
   * (1e-5); in bf16/fp16 such a last-bit difference in a product's operand
   * can round it to the neighbouring half value (2^-8 relative in bf16,
   * 2^-11 in fp16), so the losses agree to a fraction of a half ulp (below) */
  const double loss_rtol = train_dtype == TD_BF16 ? 0x1p-9 : train_dtype == TD_F16 ? 0x1p-12 : 1e-5;
  const double norm_rtol = train_dtype == TD_BF16 ? 0x1p-6 : train_dtype == TD_F16 ? 0x1p-9 : 1e-4;
  double worst_loss = 0;
  td_trainer *plain = NULL;
  if (mplain) {
    const int saved_ckpt = train_ckpt, saved_zero = train_zero;
    train_ckpt = 0; /* make_trainer reads them */
    if (twin == TWIN_ZERO0) train_zero = 0;
    /* fp16: the twin finds the overflow where the trainer under test does (the same world rank and step) */
    snprintf(inject, sizeof inject, "%d:%d", OVERFLOW_STEP, dp_rank);
    if (train_dtype == TD_F16 && rank == overflow_rank) CHECK(setenv("TANDEM_FP16_INJECT_INF", inject, 1) == 0);
    plain = make_trainer(mplain, ds, td_grid_comm(grid, TD_GRID_DATA), TRAIN_G / dp / micro_steps, micro_steps);
    unsetenv("TANDEM_FP16_INJECT_INF");
    train_ckpt = saved_ckpt, train_zero = saved_zero;
    if (twin == TWIN_CKPT)
      CHECK(td_trainer_config(t)->activation_checkpointing && !td_trainer_config(plain)->activation_checkpointing);
    if (twin == TWIN_ZERO0) CHECK(td_trainer_zero_stage(t) == 3 && td_trainer_zero_stage(plain) == 0);
  }
  double worst_twin = 0;
  size_t acts_t = 0, acts_twin = 0; /* the models' activation allocations at the training micro-batch */
  for (int s = 0; s < steps; s++) {
    train_step_now = s;
    td_step_stats a, b;
    td_status st = td_trainer_step(t, &a);
    if (kill_rank >= 0 && s == 1) {
      /* the victim never gets here; the others must fail (no hang); its
       * tensor group names it: its tensor rank and the group's world ranks */
      if (st == TD_OK) td_test_fail(__FILE__, __LINE__, "rank %d: step 2 succeeded though rank %d died", rank, kill_rank);
      const char *msg = td_last_error();
      char world_name[32];
      snprintf(world_name, sizeof world_name, "world rank %d", kill_rank);
      if (rank / tp == kill_rank / tp) {
        char victim[32], group[64];
        snprintf(victim, sizeof victim, "rank %d ", kill_rank % tp);
        snprintf(group, sizeof group, "world ranks %d..%d", kill_rank / tp * tp, kill_rank / tp * tp + tp - 1);
        if (!strstr(msg, victim) || !strstr(msg, group) || !strstr(msg, "died") || !strstr(msg, world_name))
          td_test_fail(__FILE__, __LINE__, "rank %d: the failure \"%s\" does not name tensor %s(%s, %s)", rank, msg,
                       victim, group, world_name);
      }
      /* the victim's pipeline neighbour (its other stage, same replica and
       * tensor rank) names it by its world rank, not only by its rank in
       * the pipeline group */
      if (pp == 2 && rank != kill_rank && rank % tp == kill_rank % tp && rank / (tp * pp) == kill_rank / (tp * pp) &&
          (!strstr(msg, world_name) || !strstr(msg, "died")))
        td_test_fail(__FILE__, __LINE__, "rank %d: the failure \"%s\" does not name its pipeline neighbour as %s",
                     rank, msg, world_name);
      printf("kill ok rank %d: %s\n", rank, msg);
      fflush(stdout);
      _exit(0); /* the communicators are broken: leave without finalizing */
    }
    CHECK_OK(st);
    if (plain) {
      td_step_stats c;
      CHECK_OK(td_trainer_step(plain, &c));
      worst_twin = fmax(worst_twin, fabs(a.loss - c.loss) / fabs(c.loss));
      if (rank == 0 && twin != TWIN_CKPT)
        printf("step %d loss %.9g, %s %.9g\n", s + 1, a.loss, twin == TWIN_ZERO0 ? "ZeRO-0" : "without sp", c.loss);
      if (twin == TWIN_CKPT) { /* recomputation runs the same kernels and collectives on the same values: the same bits */
        if (memcmp(&a.loss, &c.loss, sizeof a.loss) != 0 || memcmp(&a.grad_norm, &c.grad_norm, sizeof a.grad_norm) != 0)
          td_test_fail(__FILE__, __LINE__, "rank %d step %d: with checkpointing loss %.17g norm %.17g, without %.17g %.17g",
                       rank, s + 1, a.loss, a.grad_norm, c.loss, c.grad_norm);
      } else if (twin == TWIN_ZERO0) {
        /* the fetched parameters are the owners' exact copies; the update of
         * the sharded masters is elementwise and the norm is summed from the
         * shards' sums (ZeRO-2's order): 1e-6 */
        CHECK_CLOSE(a.loss, c.loss, 1e-6, 0);
        CHECK_CLOSE(a.grad_norm, c.grad_norm, 1e-6, 0);
      } else {
        /* sequence parallelism: the forward is the same per-row arithmetic and
         * the reduce-scatter adds what the allreduce adds (in any order at 2
         * ranks: the first loss is the same bits there, checked); the
         * LayerNorms' weight gradients are the ranks' partial sums added:
         * another order, 1e-5 */
        if (s == 0 && tp == 2 && memcmp(&a.loss, &c.loss, sizeof a.loss) != 0)
          td_test_fail(__FILE__, __LINE__, "rank %d: the first loss %.9g with sequence parallelism, %.9g without", rank,
                       a.loss, c.loss);
        CHECK_CLOSE(a.loss, c.loss, loss_rtol, 0);
        CHECK_CLOSE(a.grad_norm, c.grad_norm, norm_rtol, 0);
      }
    }
    acts_t = mt->activation_bytes, acts_twin = mplain ? mplain->activation_bytes : 0;
    if (!ref) continue;
    CHECK_OK(td_trainer_step(ref, &b));
    if (rank == 0) printf("step %d loss %.7f ref %.7f norm %.6f ref %.6f%s\n", s + 1, a.loss, b.loss, a.grad_norm,
                          b.grad_norm, a.skipped ? " (skipped: fp16 overflow)" : "");
    /* fp16: the injected overflow is skipped by every rank of the grid, and
     * only it; the loss scales stay equal to the one rank's */
    CHECK_EQ_INT(a.skipped, b.skipped);
    CHECK_EQ_INT(a.skipped, train_dtype == TD_F16 && s + 1 == OVERFLOW_STEP);
    CHECK(a.loss_scale == b.loss_scale);
    worst_loss = fmax(worst_loss, fabs(a.loss - b.loss) / fabs(b.loss));
    CHECK_CLOSE(a.loss, b.loss, loss_rtol, 0);
    if (a.skipped) continue; /* no norm on a skipped step */
    CHECK_CLOSE(a.grad_norm, b.grad_norm, norm_rtol, 0);
    CHECK(b.grad_norm > 0.5); /* clipping was on */
  }
  if (ref && rank == 0) printf("largest relative loss difference to one rank: %.3g (bound %.3g)\n", worst_loss, loss_rtol);
  if (ref && train_zero == 3) {
    /* ZeRO-3 holds this rank's shard of the tensor shard's arena (addressed
     * like the whole arena): against the ZeRO-0 twin's same elements */
    size_t lo, len;
    td_shard_range(mt->n_params, dp, td_grid_rank(grid, TD_GRID_DATA), &lo, &len);
    float *pz = host_copy(td_trainer_params(t) + lo, len), *p0 = host_copy(td_trainer_params(plain) + lo, len);
    check_near("ZeRO-3 shard against ZeRO-0", pz, p0, len, 1e-6, 1e-7);
    free(pz);
    free(p0);
  }
  if (ref) {
    float *pt = train_zero == 3 ? NULL : host_copy(td_trainer_params(t), mt->n_params);
    float *pf = host_copy(td_trainer_params(ref), mf->n_params);
    float *want = malloc(mf->n_params * 4);
    for (int i = 0; pt && i < mt->n_tensors; i++) {
      /* the unsplit tensor of the same name (a pipeline stage holds some of them) */
      const char *name = mt->tensors[i].name;
      int u = 0;
      while (u < mf->n_tensors && strcmp(mf->tensors[u].name, name) != 0) u++;
      CHECK(u < mf->n_tensors);
      size_t k = cut_expected(&cfg, name, pf + mf->tensors[u].offset, mf->tensors[u].count, P, R, want);
      CHECK_EQ_INT(k, mt->tensors[i].count);
      const float *got = pt + mt->tensors[i].offset;
      if (train_dtype != TD_F32) {
        /* each step's operands round to bf16/fp16 (an f32 last-bit
         * difference can flip one), and AdamW steps lr-sized whatever the
         * gradient's size: elementwise, the weights agree to a few steps
         * of lr x (steps) only; the losses above are the measure */
        check_near(name, got, want, k, 0, 2e-2);
        continue;
      }
      if (strstr(name, "attn.qkv.bias")) {
        /* the key bias's gradient is zero in exact arithmetic (it adds the
         * same q.b to every score of a row; softmax ignores that), so its
         * values follow AdamW's normalized rounding noise, different in
         * every summation order: compare the query and value biases only */
        size_t third = k / 3;
        check_near("q bias", got, want, third, 1e-4, 1e-6);
        check_near("v bias", got + 2 * third, want + 2 * third, third, 1e-4, 1e-6);
        continue;
      }
      check_near(name, got, want, k, 1e-4, 1e-6);
    }
    free(want);
    free(pt);
    free(pf);
    /* not at ZeRO-3: a forward outside a step reads the fetch buffers the
     * last step left (the update after them makes them stale; the engine
     * refreshes them at the next step, and refuses evaluation there) */
    if (pp == 1 && train_dtype == TD_F32 && train_zero != 3) {
      /* one more forward of the trained models on a sequence (every tensor
       * rank alike) and their predictions: the argmax over the vocabulary
       * shards (MAX of the values, MIN of the index) is the unsplit one's */
      int32_t tok[TRAIN_T], tgt[TRAIN_T], pred_t[TRAIN_T], pred_f[TRAIN_T];
      for (int i = 0; i < TRAIN_T; i++) tok[i] = (i * 13 + 5) % TRAIN_V, tgt[i] = (i * 29 + 1) % TRAIN_V;
      tok[0] = TRAIN_V - 1, tgt[1] = 0; /* the ends of the vocabulary: the last and the first shard */
      float lt = mt->ops->forward(mt, td_trainer_params(t), tok, tgt, 1);
      float lf = mf->ops->forward(mf, td_trainer_params(ref), tok, tgt, 1);
      CHECK_CLOSE(lt, lf, loss_rtol, 0);
      mt->ops->predict(mt, pred_t);
      mf->ops->predict(mf, pred_f);
      for (int i = 0; i < TRAIN_T; i++) CHECK_EQ_INT(pred_t[i], pred_f[i]);
      if (rank == 0) printf("tp train: the predictions of a sequence equal one rank's\n");
    }
  }
  if (twin == TWIN_CKPT || twin == TWIN_NOSP) {
    /* checkpointing: every parameter bit for bit, from fewer activations;
     * sequence parallelism: within 1e-4 (the bound against one rank), and
     * fewer activations too (the residual stream's B*T/p rows) */
    float *pt = host_copy(td_trainer_params(t), mt->n_params), *pq = host_copy(td_trainer_params(plain), mt->n_params);
    if (twin == TWIN_CKPT) CHECK(memcmp(pt, pq, mt->n_params * sizeof(float)) == 0);
    else if (train_dtype == TD_F32) check_near("parameters against TP without sp", pt, pq, mt->n_params, 1e-4, 1e-6);
    else check_near("parameters against TP without sp", pt, pq, mt->n_params, 0, 2e-2); /* as against one rank */
    free(pt);
    free(pq);
    /* the allocation during training against the model's estimate for that micro-batch */
    const size_t est_t = mt->ops->activation_bytes(mt, TRAIN_G / dp / micro_steps, train_ckpt, train_dtype);
    const size_t est_twin = mplain->ops->activation_bytes(mplain, TRAIN_G / dp / micro_steps, 0, train_dtype);
    if (rank == 0)
      printf("activations: %zu bytes with %s, %zu without (the models' estimates: %zu, %zu)\n", acts_t,
             twin == TWIN_CKPT ? "checkpointing" : "sequence parallelism", acts_twin, est_t, est_twin);
    CHECK(acts_t > 0 && acts_t < acts_twin);
    if (g_dev.kind != TD_DEVICE_CPU && pp == 1) CHECK(acts_t == est_t && acts_twin == est_twin);
  }
  if (twin == TWIN_ZERO0) {
    /* model states per rank on the device: ZeRO-3 holds its 1/dp of the
     * tensor shard's f32 masters and AdamW moments (12 bytes a parameter),
     * the shard's whole gradient arena (4 n: the device's backward writes
     * every gradient before the owners' reduction, zero/device.c), and two
     * fetch buffers of the largest group (the embeddings, a block, or ln_f
     * with the head, of this tensor shard: summed from the table here);
     * ZeRO-0 all of the shard's (16 n) */
    size_t lo, len, largest = 0, group = 0;
    td_shard_range(mt->n_params, dp, td_grid_rank(grid, TD_GRID_DATA), &lo, &len);
    for (int i = 0; i < mt->n_tensors; i++) {
      const char *name = mt->tensors[i].name; /* a group starts at each block's h<l>.ln1.weight and at ln_f.weight */
      const int starts = (name[0] == 'h' && strstr(name, ".ln1.weight")) || !strcmp(name, "ln_f.weight");
      if (starts && i > 0) largest = group > largest ? group : largest, group = 0;
      group += mt->tensors[i].count;
    }
    largest = group > largest ? group : largest;
    const size_t z3 = td_trainer_model_state_bytes(t), z0 = td_trainer_model_state_bytes(plain);
    const size_t want3 = 12 * len + 4 * mt->n_params + 8 * largest;
    if (g_dev.kind == TD_DEVICE_CPU) {
      /* on the CPU the arenas are address space whose pages ZeRO-3 gives
       * back: the peak resident is this rank's 1/dp of the masters and the
       * AdamW moments (12 bytes a parameter), the gradients of the groups
       * reduced so far and the fetched groups (model_state_bytes measures
       * it); at most ZeRO-0's, and the sharded part is there */
      printf("model states: rank %d: ZeRO-3 %zu bytes (its shard's 12 x %zu = %zu), ZeRO-0 %zu (16 x %zu = %zu): "
             "%.3f of ZeRO-0\n", rank, z3, len, 12 * len, z0, mt->n_params, 16 * mt->n_params, (double)z3 / (double)z0);
      CHECK(z3 >= 12 * len && z3 < z0);
    } else {
      printf("model states: rank %d: ZeRO-3 %zu bytes (closed form 12 x %zu + 4 x %zu + 2 x 4 x %zu = %zu), ZeRO-0 %zu "
             "(16 x %zu = %zu): %.3f of ZeRO-0\n", rank, z3, len, mt->n_params, largest, want3, z0, mt->n_params,
             16 * mt->n_params, (double)z3 / (double)z0);
      CHECK_EQ_INT(z0, 16 * mt->n_params);
      CHECK_EQ_INT(z3, want3);
    }
  }
  td_trainer_destroy(plain);
  td_model_destroy(mplain);
  td_trainer_destroy(ref);
  td_trainer_destroy(t);
  td_model_destroy(mt);
  td_model_destroy(mf);
  td_dataset_destroy(ds);
  const char *expect_path = getenv("TANDEM_TEST_EXPECT_PATH"), *path = device_coll_path(td_grid_comm(grid, TD_GRID_TENSOR));
  if (expect_path && strcmp(path, expect_path) != 0)
    td_test_fail(__FILE__, __LINE__, "rank %d: the tensor group's device collectives took the %s path, expected %s",
                 rank, path, expect_path);
  td_grid_destroy(grid);
  if (rank == 0 && g_dev.kind != TD_DEVICE_CPU) {
    char name[16];
    printf("tp train: on %s%s (vocabulary-parallel embedding, head and loss), the tensor group's allreduces on the %s path\n",
           td_device_name(g_dev, name, sizeof name), getenv("TD_TEST_DEVICE")[4] ? ", shared by the ranks" : ", each rank on its own GPU",
           path);
  }
  if (rank == 0)
    printf("tp train: %d ranks as data %d x pipeline %d x tensor %d%s%s%s%s: %d steps equal to one rank\n", n, dp,
           pp, tp, sp ? " (sequence-parallel)" : "", tied ? " (tied)" : "",
           train_zero == 3 ? " (ZeRO-3, against ZeRO-0 within 1e-6)" : train_zero == 2 ? " (ZeRO-2)" : train_zero ? " (ZeRO-1)" : "",
           train_ckpt ? " (activation checkpointing: bit for bit the same without)" : "", steps);
  if (rank == 0 && train_interleaved) printf("tp train: the pipeline ran the interleaved schedule, 2 chunks per rank\n");
  if (rank == 0 && twin == TWIN_NOSP)
    printf("tp train: sequence-parallel against the same layout without it: largest relative loss difference %.3g\n",
           worst_twin);
  if (rank == 0 && train_zero == 3)
    printf("tp train: ZeRO-3 against ZeRO-0: largest relative loss difference %.3g\n", worst_twin);
  if (rank == 0 && train_dtype != TD_F32)
    printf("tp train: in %s against one rank in %s%s\n", td_dtype_name(train_dtype), td_dtype_name(train_dtype),
           train_dtype == TD_F16 ? ", every rank skipping the overflow one rank saw" : "");
}

/* sequence parallelism needs seq divisible by the group; other models are refused */
static void refuse_sp(void) {
  td_grid *grid = NULL;
  CHECK_OK(td_grid_create(world, P, 1, &grid));
  td_gpt_config cfg = {.vocab = 50, .layers = 1, .channels = 8, .heads = 2 * P, .seq = 2 * P + 1};
  cfg.channels = 4 * cfg.heads;
  td_model *tp = NULL, *plain = NULL;
  /* an odd sequence length is refused, on the CPU and (TD_TEST_DEVICE) on a device */
  for (int on_dev = g_dev.kind != TD_DEVICE_CPU; on_dev >= 0; on_dev--) { /* the CPU's last: kept below */
    CHECK_OK(td_gpt_tp_create_on(&cfg, grid, on_dev ? g_dev : (td_device){TD_DEVICE_CPU, 0}, &tp));
    if (P > 1) expect_message(td_gpt_tp_set_sequence_parallel(tp, 1), "use a sequence length divisible by");
    CHECK_OK(td_gpt_tp_set_sequence_parallel(tp, 0));
    if (on_dev) td_model_destroy(tp);
  }
  CHECK_OK(td_gpt_create(&cfg, &plain));
  expect_message(td_gpt_tp_set_sequence_parallel(plain, 1), "must come from td_gpt_tp_create");
  td_model_destroy(plain);
  td_model_destroy(tp);
  td_grid_destroy(grid);
  /* 3D: sequence parallelism needs a tensor group; the stages' heads must split over it */
  CHECK_OK(td_grid_create(world, 1, P, &grid));
  td_gpt_config c3 = {.vocab = 50, .layers = 2 * P, .channels = 16, .heads = 4, .seq = 8};
  td_pipeline_config pc = {.sequence_parallel = 1};
  td_model *m3 = NULL;
  expect_message(td_gpt_pipeline_create_grid(&c3, &pc, grid, &m3), "use tensor-parallel 2 or more");
  expect_message(td_gpt_pipeline_create(&c3, &pc, td_grid_comm(grid, TD_GRID_PIPELINE), &m3),
                 "use td_gpt_pipeline_create_grid");
  CHECK(m3 == NULL);
  td_grid_destroy(grid);
  if (P > 1) {
    CHECK_OK(td_grid_create(world, P, 1, &grid));
    c3.heads = 2 * P + 1; /* not divisible by the tensor group */
    c3.channels = 4 * c3.heads;
    pc.sequence_parallel = 0;
    expect_message(td_gpt_pipeline_create_grid(&c3, &pc, grid, &m3), "does not divide the");
    CHECK(m3 == NULL);
    td_grid_destroy(grid);
  }
  if (P == 4 && g_dev.kind != TD_DEVICE_CPU) {
    /* a device splits the sequence of the whole model only: TP=2 x PP=2 stages with it are refused */
    CHECK_OK(td_grid_create(world, 2, 2, &grid));
    td_gpt_config c4 = {.vocab = 50, .layers = 2, .channels = 16, .heads = 4, .seq = 8};
    td_pipeline_config pd = {.sequence_parallel = 1, .device = g_dev};
    expect_message(td_gpt_pipeline_create_grid(&c4, &pd, grid, &m3), "not on pipeline stages yet");
    CHECK(m3 == NULL);
    td_grid_destroy(grid);
  }
  if (R == 0) printf("tp refuse-sp: ok%s\n", P == 4 && g_dev.kind != TD_DEVICE_CPU ? " (and a device's pipeline stages)" : "");
}

/* What a tensor-parallel model (td_gpt_tp_create, or pipeline stages of
 * tensor-parallel layers) composes with in td_trainer_create: bf16, fp16
 * and f32 at ZeRO stages 0-2 are accepted (trained: the train lines);
 * stage 3 is refused on every rank, naming the stage that works, since its
 * per-layer parameter fetches are not built into these models. */
static void compose(int tp, int pp) {
  td_grid *grid = NULL;
  CHECK_OK(td_grid_create(world, tp, pp, &grid));
  td_gpt_config cfg = {.vocab = TRAIN_V, .layers = 4, .channels = 16, .heads = 4, .seq = TRAIN_T};
  td_dataset *ds = calloc(1, sizeof *ds);
  ds->n_samples = 64;
  ds->input_bytes = TRAIN_T * sizeof(int32_t);
  ds->targets_per_sample = TRAIN_T;
  ds->get = text_get;
  ds->destroy = plain_destroy;
  td_model *m = NULL;
  td_pipeline_config pc = {0};
  if (pp > 1) CHECK_OK(td_gpt_pipeline_create_grid(&cfg, &pc, grid, &m));
  else CHECK_OK(td_gpt_tp_create(&cfg, grid, &m));
  const td_dtype kinds[3] = {TD_BF16, TD_F16, TD_F32};
  for (int k = 0; k < 3; k++)
    for (int stage = 0; stage <= 3; stage++) {
      td_train_config c;
      td_train_config_defaults(&c);
      c.micro_batch = 2;
      c.grad_accum = pp > 1 ? 4 : 1;
      c.threads = 1;
      c.precision.compute = kinds[k];
      c.zero_stage = stage;
      CHECK_EQ_INT(c.tensor_parallel, 1); /* the defaults: the user did not say */
      td_trainer *t = NULL;
      CHECK_OK(td_trainer_create(&c, m, ds, td_grid_comm(grid, TD_GRID_DATA), &t)); /* ZeRO-3 too: the model fetches */
      td_trainer_destroy(t);
    }
  td_model_destroy(m);
  td_grid_destroy(grid);
  td_dataset_destroy(ds);
  if (td_comm_rank(world) == 0) printf("tp compose tp=%d pp=%d: bf16/fp16/f32 at ZeRO 0-3 accepted\n", tp, pp);
}

/* Parameters per rank under TP=2 (2 ranks) or TP=2 x PP=2 (4 ranks) at
 * GPT-2 124M's shape with an odd vocabulary (50,257: uneven shards), tied
 * and untied, against the closed form written out here: per block the
 * LayerNorms (4C) and the row-parallel biases (2C) whole, the rest
 * (12C^2 + 7C) split; the first stage wpe (TxC) and its vocabulary rows of
 * wte, the last ln_f (2C) and its rows of the head (or of the tied wte's
 * copy). Nothing is allocated: the tables only. On a device the embedding
 * and head are split as on the CPU (they were whole on each tensor rank
 * before), so the model state per rank at TP x PP = 4 is within 10% of a
 * quarter of the unsplit model's (untied; a tied pipeline keeps a copy of
 * wte on its last stage, printed). On a device also the tensor group's
 * host staging (comm_staging_bytes) against the staged path's buffers, and
 * (TP=2, untied) the activations with and without sequence parallelism at
 * micro-batch 1 and 4, their difference against its closed form. */
static void model_bytes(void) {
  const int n = td_comm_size(world), rank = td_comm_rank(world), tp = 2, pp = n / 2;
  CHECK(n == 2 || n == 4);
  td_grid *grid = NULL;
  CHECK_OK(td_grid_create(world, tp, pp, &grid));
  const int tr = td_grid_rank(grid, TD_GRID_TENSOR), stage = td_grid_rank(grid, TD_GRID_PIPELINE);
  for (int tied = 0; tied <= 1; tied++) {
    const td_gpt_config cfg = {.vocab = 50257, .layers = 12, .channels = 768, .heads = 12, .seq = 1024, .tied = tied};
    td_model *m = NULL;
    if (pp > 1) {
      td_pipeline_config pc = {.device = g_dev};
      CHECK_OK(td_gpt_pipeline_create_grid(&cfg, &pc, grid, &m));
    } else {
      CHECK_OK(td_gpt_tp_create_on(&cfg, grid, g_dev, &m));
    }
    const size_t V = 50257, C = 768, T = 1024, L = 12;
    const size_t vl = V / 2 + (tr == 0 ? V % 2 : 0); /* rank 0 takes the odd row */
    const size_t block = 6 * C + (12 * C * C + 7 * C) / 2;
    const int first = stage == 0, last = stage == pp - 1;
    size_t want = L / pp * block;
    if (first) want += vl * C + T * C;
    if (last) want += 2 * C + (tied && first ? 0 : vl * C);
    const size_t unsplit = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C + (tied ? 0 : V * C);
    const double ratio = (double)m->n_params / ((double)unsplit / (tp * pp));
    if (m->n_params != want)
      td_test_fail(__FILE__, __LINE__, "rank %d (tensor %d, stage %d, tied %d): %zu parameters, closed form %zu", rank,
                   tr, stage, tied, m->n_params, want);
    printf("model bytes: rank %d tensor %d stage %d %s: %zu parameters = %.4f x 1/%d of the unsplit %zu\n", rank, tr,
           stage, tied ? "tied" : "untied", m->n_params, ratio, tp * pp, unsplit);
    if (!tied || pp == 1) CHECK(ratio < 1.10);
    if (g_dev.kind != TD_DEVICE_CPU && pp == 1) {
      /* the staged device collectives' host buffers: 2 sets of an in and
       * an out buffer, each one 4 MiB chunk or the whole B*T*C f32 message
       * (3 MiB at micro-batch 1) */
      const size_t staged = 4 * (T * C * 4 < ((size_t)4 << 20) ? T * C * 4 : (size_t)4 << 20);
      size_t theirs = 0, bytes = m->ops->comm_staging_bytes ? m->ops->comm_staging_bytes(m, 1, &theirs) : 0;
      printf("model bytes: rank %d: the tensor group's host staging %zu bytes (%zu the peers'), staged buffers %zu\n",
             rank, bytes, theirs, staged);
      CHECK(bytes >= staged && bytes - theirs >= staged);
      if (!tied) {
        /* sequence parallelism's activations at this shape, f32, fused attention: the residual stream's
         * buffers keep R = B*T/2 of the B*T rows (per block ln1, res2, ln2, res3 and the LayerNorms'
         * mean and rstd; encoded, lnf with its statistics, dres), for the whole-row copies it adds
         * (a gathered LayerNorm output, dres gathered: B*T rows; a column-parallel input gradient's R
         * rows; a LayerNorm's 2C weight gradients, the bias half 512-byte aligned). Each buffer is
         * rounded to 256 bytes: the closed form within 256 x 40 bytes. */
        const size_t nosp1 = m->ops->activation_bytes(m, 1, 0, TD_F32), nosp4 = m->ops->activation_bytes(m, 4, 0, TD_F32);
        td_model *ms = NULL;
        CHECK_OK(td_gpt_tp_create_on(&cfg, grid, g_dev, &ms));
        CHECK_OK(td_gpt_tp_set_sequence_parallel(ms, 1));
        for (int B = 1; B <= 4; B += 3) {
          const size_t nosp = B == 1 ? nosp1 : nosp4, sp = ms->ops->activation_bytes(ms, B, 0, TD_F32);
          const size_t BT = (size_t)B * T, rows = BT / 2, es = 4;
          const long saving = (long)((BT - rows) * (es * C * (4 * L + 3) + 4 * (4 * L + 2))) -
                              (long)((2 * BT * C + rows * C + ((C + 127) / 128 * 128 + C)) * es);
          const long got = (long)nosp - (long)sp;
          printf("activations: rank %d micro-batch %d (T %zu): TP=2 %.1f MiB, with sequence parallelism %.1f MiB "
                 "(%.3f; closed-form saving %.1f MiB, the model's %.1f)\n", rank, B, T, nosp / 1048576.0,
                 sp / 1048576.0, (double)sp / (double)nosp, saving / 1048576.0, got / 1048576.0);
          CHECK(labs(got - saving) <= 256 * 40);
        }
        td_model_destroy(ms);
      }
    }
    td_model_destroy(m);
  }
  td_grid_destroy(grid);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: test_tp layers | model TIED | bytes | train TP STEPS [sp] [pp=PP] [tied] [zero1] [ckpt] [interleaved] | kill TP VICTIM [pp=PP] | compose TP PP\n");
    return 2;
  }
  const char *dev = getenv("TD_TEST_DEVICE");
  if (dev && *dev) {
    CHECK_OK(td_device_parse(dev, &g_dev));
    if (td_device_open(g_dev) != TD_OK) {
      if (getenv("TD_TEST_EXPECT_CUDA")) td_test_fail(__FILE__, __LINE__, "%s: %s", dev, td_last_error());
      printf("skipped: no GPU: %s: %s\n", dev, td_last_error());
      return 0;
    }
  }
  CHECK_OK(td_comm_init(&world));
  world_rank = td_comm_rank(world);
  if (dev && !strcmp(dev, "cuda")) CHECK_OK(td_train_device_select(dev, td_comm_local_rank(world), &g_dev));
  P = td_comm_size(world);
  R = td_comm_rank(world);
  if (!strcmp(argv[1], "layers")) {
    layers();
  } else if (!strcmp(argv[1], "model") && argc >= 3) {
    model(atoi(argv[2]), argc >= 4 && !strcmp(argv[3], "sp"));
  } else if (!strcmp(argv[1], "train") && argc >= 4) {
    int sp = 0, pp = 1, tied = 0;
    for (int i = 4; i < argc; i++) {
      if (!strcmp(argv[i], "sp")) sp = 1;
      else if (!strncmp(argv[i], "pp=", 3)) pp = atoi(argv[i] + 3);
      else if (!strcmp(argv[i], "tied")) tied = 1;
      else if (!strcmp(argv[i], "zero1")) train_zero = 1;
      else if (!strcmp(argv[i], "zero2")) train_zero = 2;
      else if (!strcmp(argv[i], "zero3")) train_zero = 3;
      else if (!strcmp(argv[i], "bf16")) train_dtype = TD_BF16;
      else if (!strcmp(argv[i], "fp16")) train_dtype = TD_F16;
      else if (!strcmp(argv[i], "ckpt")) train_ckpt = 1;
      else if (!strcmp(argv[i], "interleaved")) train_interleaved = 1;
      else {
        fprintf(stderr, "test_tp train: unknown option %s\n", argv[i]);
        return 2;
      }
    }
    train(atoi(argv[2]), pp, atoi(argv[3]), sp, tied);
  } else if (!strcmp(argv[1], "bytes")) {
    model_bytes();
  } else if (!strcmp(argv[1], "refuse-sp")) {
    refuse_sp();
  } else if (!strcmp(argv[1], "compose") && argc >= 4) {
    compose(atoi(argv[2]), atoi(argv[3]));
  } else if (!strcmp(argv[1], "kill") && argc >= 4) {
    kill_rank = atoi(argv[3]);
    int sp = 0, pp = 1;
    for (int i = 4; i < argc; i++) {
      if (!strcmp(argv[i], "sp")) sp = 1;
      else if (!strncmp(argv[i], "pp=", 3)) pp = atoi(argv[i] + 3);
    }
    train(atoi(argv[2]), pp, 3, sp, 0);
  } else {
    fprintf(stderr, "test_tp: unknown mode %s\n", argv[1]);
    return 2;
  }
  CHECK_OK(td_comm_finalize(world));
  td_comm_destroy(world);
  return 0;
}
