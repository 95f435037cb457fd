/* The GPT on a device (td_gpt_create_on; src/nn/cuda/gpt_cuda.c) against
 * the CPU GPT (src/nn/gpt.c) as the reference: the same tensor table and
 * config, then per config the loss, every gradient tensor (after one and
 * after two accumulated backward passes, with loss scales 1 and 2), the
 * order of the ready callbacks and the predictions, fp32 within 1e-5
 * relative; then with bf16 parameters, gradients and activations
 * (td_gpt_set_device_dtype) within bf16's bound (loss 2%, each gradient
 * tensor 6% of its largest entry; the CPU reference stays fp32). Configs sweep the edges: no layers, T = 1, odd vocabularies and
 * sequence lengths, tied and untied heads, head sizes of both attention
 * paths' kernels (128 among them). Then, as ZeRO stage 3 runs it, with a td_param_access
 * (written here, not the engine's) that gives each fetched group a buffer
 * of its own and fills it with NaNs at its release: the same loss and
 * gradients bit for bit with the arena argument NULL, every fetch released,
 * the groups gpt.c fetches (a kernel reading a group it did not fetch, or
 * after releasing it, reads NaN or outside an allocation, which ASan
 * catches in the emulator). Then with activation checkpointing (each block
 * recomputed in backward from its kept input): the same loss, gradients
 * and ready order bit for bit as without it, also under that access, and
 * the smaller activation memory it reports is what it allocated.
 *
 * Runs in every tree, like test_device: without CUDA in the build it checks
 * that asking for a CUDA GPT says so; in a CUDA build without a GPU, that it
 * says there is no device; with a GPU, or in the emulator tree with pretend
 * GPUs, the comparison. TD_TEST_EXPECT_CUDA=N: the visible count must be N. */
#include "../common/check.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

static const td_device CPU = {TD_DEVICE_CPU, 0};

#ifdef TD_HAVE_CUDA
typedef struct ready_log {
  size_t offset[512], count[512];
  int n;
} ready_log;

static void on_ready(void *ctx, size_t offset, size_t count) {
  ready_log *log = ctx;
  CHECK(log->n < 512);
  log->offset[log->n] = offset;
  log->count[log->n] = count;
  log->n++;
}

/* Per tensor: max |got - want| <= rtol * max |want| + 1e-30 (elementwise
 * relative error is meaningless for entries that cancel to ~0). */
static void check_tensors(const td_model *m, const float *got, const float *want, double rtol, const char *what) {
  for (int i = 0; i < m->n_tensors; i++) {
    const td_param_tensor *t = &m->tensors[i];
    double scale = 0, err = 0;
    size_t worst = 0;
    for (size_t k = 0; k < t->count; k++) {
      double w = want[t->offset + k], g = got[t->offset + k];
      if (!isfinite(g)) td_test_fail(__FILE__, __LINE__, "%s: %s[%zu] is %g", what, t->name, k, g);
      scale = fmax(scale, fabs(w));
      if (fabs(g - w) > err) err = fabs(g - w), worst = k;
    }
    if (err > rtol * scale + 1e-30)
      td_test_fail(__FILE__, __LINE__, "%s: %s differs by %.3g at [%zu] (%.9g vs %.9g), %.3g of its largest %.3g", what,
                   t->name, err, worst, got[t->offset + worst], want[t->offset + worst], err / scale, scale);
  }
}

/* n values of dtype (f32 or bf16) between device memory and f32 host arrays */
static void to_device(void *dst, const float *src, size_t n, td_dtype dtype, td_device gpu) {
  if (dtype == TD_F32) {
    CHECK_OK(td_device_copy(dst, gpu, src, CPU, n * sizeof(float)));
    return;
  }
  uint16_t *h = malloc((n ? n : 1) * sizeof(uint16_t));
  CHECK(h);
  for (size_t i = 0; i < n; i++) h[i] = td_f32_to_bf16(src[i]);
  CHECK_OK(td_device_copy(dst, gpu, h, CPU, n * sizeof(uint16_t)));
  free(h);
}
static void from_device(float *dst, const void *src, size_t n, td_dtype dtype, td_device gpu) {
  if (dtype == TD_F32) {
    CHECK_OK(td_device_copy(dst, CPU, src, gpu, n * sizeof(float)));
    return;
  }
  uint16_t *h = malloc((n ? n : 1) * sizeof(uint16_t));
  CHECK(h);
  CHECK_OK(td_device_copy(h, CPU, src, gpu, n * sizeof(uint16_t)));
  for (size_t i = 0; i < n; i++) dst[i] = td_bf16_to_f32(h[i]);
  free(h);
}

/* The test's td_param_access: a fetched group in a device buffer of its own */
typedef struct test_access {
  td_device gpu;
  const char *arena; /* the whole parameters, of the model's type */
  size_t es;
  struct {
    char *mem;
    size_t lo, hi;
    int live;
  } f[64];
  int n, live;
} test_access;

static const float *ta_fetch(void *ctx, size_t offset, size_t count, size_t next_offset, size_t next_count) {
  test_access *a = ctx;
  CHECK(a->n < 64);
  CHECK(count > 0);
  /* the prefetch hint names another group: none overlaps the one fetched */
  CHECK(next_count == 0 || next_offset + next_count <= offset || next_offset >= offset + count);
  char *mem = NULL;
  CHECK_OK(td_device_alloc(a->gpu, count * a->es, (void **)&mem));
  CHECK_OK(td_device_copy(mem, a->gpu, a->arena + offset * a->es, a->gpu, count * a->es));
  CHECK_OK(td_device_sync(a->gpu));
  a->f[a->n].mem = mem;
  a->f[a->n].lo = offset;
  a->f[a->n].hi = offset + count;
  a->f[a->n].live = 1;
  a->n++;
  a->live++;
  return (const float *)((uintptr_t)mem - (uintptr_t)(offset * a->es));
}

static void ta_release(void *ctx, size_t offset, size_t count) {
  test_access *a = ctx;
  for (int i = a->n - 1; i >= 0; i--)
    if (a->f[i].live && a->f[i].lo == offset && a->f[i].hi == offset + count) {
      /* all ones: NaN in f32 and in bf16 */
      unsigned char *nan = malloc(count * a->es);
      CHECK(nan);
      memset(nan, 0xff, count * a->es);
      CHECK_OK(td_device_copy(a->f[i].mem, a->gpu, nan, CPU, count * a->es));
      free(nan);
      a->f[i].live = 0;
      a->live--;
      return;
    }
  td_test_fail(__FILE__, __LINE__, "release of [%zu, %zu), which is not fetched", offset, offset + count);
}

/* ta starts empty, fetching from the device arena (elements of es bytes) */
static td_param_access ta_start(test_access *ta, td_device gpu, const void *arena, size_t es) {
  memset(ta, 0, sizeof *ta);
  ta->gpu = gpu;
  ta->arena = arena;
  ta->es = es;
  return (td_param_access){ta_fetch, ta_release, ta};
}

/* One plain step of dev from zeroed gradients (the whole arena, no ready
 * callback), the reference the other ways of running it must match bit for
 * bit: its loss, and its gradients as f32 in grads_out (n of them). */
static float reference_step(td_model *dev, const float *d_params, float *d_grads, const int32_t *tokens,
                            const int32_t *targets, int B, float loss_scale, float *grads_out, size_t n,
                            td_dtype dtype, td_device gpu) {
  CHECK_OK(td_device_memset0(gpu, d_grads, n * td_dtype_size(dtype)));
  float loss = dev->ops->forward(dev, d_params, tokens, targets, B);
  dev->ops->backward(dev, d_params, d_grads, loss_scale, NULL, NULL);
  from_device(grads_out, d_grads, n, dtype, gpu);
  return loss;
}

static void compare(td_gpt_config cfg, int B, float loss_scale, td_dtype dtype, td_device gpu) {
  printf("config vocab=%d layers=%d channels=%d heads=%d seq=%d tied=%d B=%d loss_scale=%g %s\n", cfg.vocab,
         cfg.layers, cfg.channels, cfg.heads, cfg.seq, cfg.tied, B, loss_scale, td_dtype_name(dtype));
  const double loss_rtol = dtype == TD_F32 ? 1e-5 : 2e-2, grad_rtol = dtype == TD_F32 ? 1e-5 : 6e-2;
  const size_t es = td_dtype_size(dtype);
  td_model *cpu = NULL, *dev = NULL;
  CHECK_OK(td_gpt_create(&cfg, &cpu));
  CHECK_OK(td_gpt_create_on(&cfg, gpu, &dev));
  CHECK_OK(td_gpt_set_device_dtype(dev, dtype));
  CHECK_EQ_INT(dev->device.kind, TD_DEVICE_CUDA);
  CHECK_EQ_INT(dev->device.index, gpu.index);
  CHECK_EQ_INT(cpu->device.kind, TD_DEVICE_CPU);
  CHECK(strcmp(dev->kind, "gpt") == 0);
  CHECK(strcmp(dev->config, cpu->config) == 0);
  CHECK_EQ_INT(dev->n_params, cpu->n_params);
  CHECK_EQ_INT(dev->n_tensors, cpu->n_tensors);
  for (int i = 0; i < cpu->n_tensors; i++) {
    CHECK(strcmp(dev->tensors[i].name, cpu->tensors[i].name) == 0);
    CHECK_EQ_INT(dev->tensors[i].offset, cpu->tensors[i].offset);
    CHECK_EQ_INT(dev->tensors[i].count, cpu->tensors[i].count);
  }
  CHECK(dev->ops->set_activation_checkpointing != NULL);
  CHECK_EQ_INT(dev->supports_param_access, 1);

  const size_t n = cpu->n_params, BT = (size_t)B * cfg.seq;
  float *params = malloc(n * sizeof(float)), *params2 = malloc(n * sizeof(float));
  float *grads = calloc(n, sizeof(float)), *dgrads_host = malloc(n * sizeof(float));
  CHECK(params && params2 && grads && dgrads_host);
  td_model_init_params(cpu, params, 1234);
  td_model_init_params(dev, params2, 1234); /* the device model's initializer is the CPU one */
  CHECK(memcmp(params, params2, n * sizeof(float)) == 0);
  float *d_params = NULL, *d_grads = NULL; /* arenas of dtype, typed as the model API takes them */
  CHECK_OK(td_device_alloc(gpu, n * es, (void **)&d_params));
  CHECK_OK(td_device_alloc(gpu, n * es, (void **)&d_grads));
  to_device(d_params, params, n, dtype, gpu);
  CHECK_OK(td_device_memset0(gpu, d_grads, n * es));

  int32_t *tokens = malloc(BT * sizeof(int32_t)), *targets = malloc(BT * sizeof(int32_t));
  int32_t *pred_cpu = malloc(BT * sizeof(int32_t)), *pred_dev = malloc(BT * sizeof(int32_t));
  CHECK(tokens && targets && pred_cpu && pred_dev);
  uint64_t rng = 99 + (uint64_t)cfg.vocab;
  for (size_t i = 0; i < BT; i++) {
    tokens[i] = (int32_t)((td_test_urand(&rng) + 1.0f) * 0.5f * (float)cfg.vocab) % cfg.vocab;
    targets[i] = (int32_t)((td_test_urand(&rng) + 1.0f) * 0.5f * (float)cfg.vocab) % cfg.vocab;
  }
  CHECK_OK(cpu->ops->prepare(cpu, B));
  CHECK_OK(dev->ops->prepare(dev, B));
  CHECK(dev->activation_bytes > 0);
  CHECK_EQ_INT(dev->ops->activation_bytes(dev, B, 0, dtype), dev->activation_bytes);
  /* (equal for the tiniest shapes, whose buffers all round up to 256 bytes) */
  if (dtype == TD_BF16) CHECK(dev->ops->activation_bytes(dev, B, 0, TD_F32) >= dev->activation_bytes);

  static ready_log log_cpu, log_dev;
  for (int step = 1; step <= 2; step++) {
    float loss_cpu = cpu->ops->forward(cpu, params, tokens, targets, B);
    float loss_dev = dev->ops->forward(dev, d_params, tokens, targets, B);
    if (!isfinite(loss_dev)) td_test_fail(__FILE__, __LINE__, "device loss %g: %s", loss_dev, td_last_error());
    CHECK_CLOSE(loss_dev, loss_cpu, loss_rtol, 0);
    /* a fresh model's loss is about log(V) */
    CHECK_CLOSE(loss_cpu, log((double)cfg.vocab), 0.2, 0);
    log_cpu.n = log_dev.n = 0;
    cpu->ops->backward(cpu, params, grads, loss_scale, on_ready, &log_cpu);
    dev->ops->backward(dev, d_params, d_grads, loss_scale, on_ready, &log_dev);
    CHECK_EQ_INT(log_dev.n, log_cpu.n);
    CHECK_EQ_INT(log_cpu.n, cpu->n_tensors);
    for (int i = 0; i < log_cpu.n; i++) {
      CHECK_EQ_INT(log_dev.offset[i], log_cpu.offset[i]);
      CHECK_EQ_INT(log_dev.count[i], log_cpu.count[i]);
    }
    from_device(dgrads_host, d_grads, n, dtype, gpu);
    check_tensors(cpu, dgrads_host, grads, grad_rtol, step == 1 ? "gradients" : "gradients after two steps");
  }
  /* as at ZeRO stage 3: every group through the test's access, the arena
   * argument NULL; the same bits as from the whole arena */
  {
    float *ref = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
    CHECK(ref && got);
    float loss_ref = reference_step(dev, d_params, d_grads, tokens, targets, B, loss_scale, ref, n, dtype, gpu);
    static test_access ta;
    td_param_access pa = ta_start(&ta, gpu, d_params, es);
    dev->param_access = &pa;
    CHECK_OK(td_device_memset0(gpu, d_grads, n * es));
    float loss_pa = dev->ops->forward(dev, NULL, tokens, targets, B);
    CHECK_EQ_INT(ta.live, 0);
    /* forward: the embeddings, each block, the head's group (and wte again when tied) */
    CHECK_EQ_INT(ta.n, cfg.layers + 2 + cfg.tied);
    ready_log *log = &log_dev;
    log->n = 0;
    dev->ops->backward(dev, NULL, d_grads, loss_scale, on_ready, log);
    CHECK_EQ_INT(ta.live, 0);
    CHECK_EQ_INT(ta.n, 2 * cfg.layers + 3 + 2 * cfg.tied); /* backward: no embeddings */
    CHECK_EQ_INT(log->n, cpu->n_tensors);
    from_device(got, d_grads, n, dtype, gpu);
    dev->param_access = NULL;
    CHECK(memcmp(&loss_pa, &loss_ref, sizeof loss_pa) == 0);
    CHECK(memcmp(got, ref, n * sizeof(float)) == 0);
    for (int i = 0; i < ta.n; i++) td_device_free(gpu, ta.f[i].mem);
    memcpy(dgrads_host, got, n * sizeof(float)); /* what d_grads holds now, for the check below */
    free(ref), free(got);
  }

  /* activation checkpointing: one layer's buffers, each block recomputed in
   * backward: the bits of the run without it, also under the stage-3 access */
  {
    float *ref = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
    CHECK(ref && got);
    float loss_ref = reference_step(dev, d_params, d_grads, tokens, targets, B, loss_scale, ref, n, dtype, gpu);
    const size_t plain_bytes = dev->activation_bytes;
    CHECK_OK(dev->ops->set_activation_checkpointing(dev, 1));
    CHECK_OK(dev->ops->prepare(dev, B));
    CHECK_EQ_INT(dev->activation_bytes, dev->ops->activation_bytes(dev, B, 1, dtype));
    CHECK_EQ_INT(plain_bytes, dev->ops->activation_bytes(dev, B, 0, dtype));
    /* one block keeps as much as without; with more, the L - 1 blocks'
     * activations that are not kept (ln1, qkv, atty, res2, ln2, fch and
     * fch_gelu: 15 C-wide rows a position) are not allocated, less what
     * the 256-byte rounding of 12 buffers may hide */
    if (cfg.layers <= 1) CHECK_EQ_INT(dev->activation_bytes, plain_bytes);
    else CHECK(dev->activation_bytes + (size_t)(cfg.layers - 1) * BT * 15 * cfg.channels * es <= plain_bytes + 12 * 256);
    for (int pass = 0; pass < 2; pass++) {
      static test_access ta;
      td_param_access pa = ta_start(&ta, gpu, d_params, es);
      dev->param_access = pass == 1 ? &pa : NULL;
      CHECK_OK(td_device_memset0(gpu, d_grads, n * es));
      float loss_ck = dev->ops->forward(dev, pass == 1 ? NULL : d_params, tokens, targets, B);
      log_dev.n = 0;
      dev->ops->backward(dev, pass == 1 ? NULL : d_params, d_grads, loss_scale, on_ready, &log_dev);
      dev->param_access = NULL;
      CHECK_EQ_INT(log_dev.n, log_cpu.n);
      for (int i = 0; i < log_cpu.n; i++) CHECK_EQ_INT(log_dev.offset[i], log_cpu.offset[i]);
      if (pass == 1) {
        CHECK_EQ_INT(ta.live, 0);
        CHECK_EQ_INT(ta.n, 2 * cfg.layers + 3 + 2 * cfg.tied); /* the groups of the run without checkpointing */
        for (int i = 0; i < ta.n; i++) td_device_free(gpu, ta.f[i].mem);
      }
      from_device(got, d_grads, n, dtype, gpu);
      CHECK(memcmp(&loss_ck, &loss_ref, sizeof loss_ck) == 0);
      CHECK(memcmp(got, ref, n * sizeof(float)) == 0);
    }
    CHECK_OK(dev->ops->set_activation_checkpointing(dev, 0));
    CHECK_OK(dev->ops->prepare(dev, B));
    CHECK_EQ_INT(dev->activation_bytes, plain_bytes);
    memcpy(dgrads_host, got, n * sizeof(float)); /* what d_grads holds now, for the check below */
    free(ref), free(got);
  }

  /* backward without a new forward: nothing more is added */
  dev->ops->backward(dev, d_params, d_grads, loss_scale, NULL, NULL);
  from_device(params2, d_grads, n, dtype, gpu);
  CHECK(memcmp(params2, dgrads_host, n * sizeof(float)) == 0);

  /* predictions after a forward with targets (the device recomputes the
   * logits its fused loss overwrote), then without targets */
  (void)cpu->ops->forward(cpu, params, tokens, targets, B);
  (void)dev->ops->forward(dev, d_params, tokens, targets, B);
  cpu->ops->predict(cpu, pred_cpu);
  dev->ops->predict(dev, pred_dev);
  /* bf16 logits may order near-ties differently: only their range then */
  for (size_t i = 0; i < BT; i++)
    if (dtype == TD_F32) CHECK_EQ_INT(pred_dev[i], pred_cpu[i]);
    else CHECK(pred_dev[i] >= 0 && pred_dev[i] < cfg.vocab);
  CHECK_EQ_INT(dev->ops->forward(dev, d_params, tokens, NULL, B), 0);
  int32_t *pred_again = malloc(BT * sizeof(int32_t));
  CHECK(pred_again);
  memset(pred_again, 0xff, BT * sizeof(int32_t));
  dev->ops->predict(dev, pred_again);
  for (size_t i = 0; i < BT; i++) CHECK_EQ_INT(pred_again[i], dtype == TD_F32 ? pred_cpu[i] : pred_dev[i]);
  free(pred_again);

  /* a token outside the vocabulary: NaN, a message, and no backward */
  tokens[BT - 1] = cfg.vocab;
  float bad = dev->ops->forward(dev, d_params, tokens, targets, B);
  CHECK(isnan(bad));
  CHECK(strstr(td_last_error(), "outside the vocabulary") != NULL);
  dev->ops->backward(dev, d_params, d_grads, loss_scale, NULL, NULL);
  from_device(params2, d_grads, n, dtype, gpu);
  CHECK(memcmp(params2, dgrads_host, n * sizeof(float)) == 0);

  int32_t out[2];
  CHECK_MSG(td_gpt_generate(dev, d_params, NULL, 0, 2, 0.0f, 1, out), TD_ERR_INVALID_USAGE, "sampling runs on the CPU");

  td_device_free(gpu, d_params);
  td_device_free(gpu, d_grads);
  free(params), free(params2), free(grads), free(dgrads_host);
  free(tokens), free(targets), free(pred_cpu), free(pred_dev);
  td_model_destroy(cpu);
  td_model_destroy(dev);
}
#endif

int main(void) {
  td_gpt_config cfg = {.vocab = 37, .layers = 2, .channels = 48, .heads = 2, .seq = 7, .tied = 0};
  td_device gpu = {TD_DEVICE_CUDA, 0};
  td_model *m = NULL;
  /* the CPU through create_on is td_gpt_create */
  CHECK_OK(td_gpt_create_on(&cfg, CPU, &m));
  CHECK_EQ_INT(m->device.kind, TD_DEVICE_CPU);
  CHECK(m->ops->set_activation_checkpointing != NULL);
  CHECK_OK(td_gpt_set_device_dtype(m, TD_F32));
  CHECK_MSG(td_gpt_set_device_dtype(m, TD_BF16), TD_ERR_INVALID_ARGUMENT, "td_nn_set_compute_dtype");
  td_model_destroy(m);
  m = (td_model *)1;
  td_gpt_config bad = cfg;
  bad.heads = 5;
  CHECK_MSG(td_gpt_create_on(&bad, CPU, &m), TD_ERR_INVALID_ARGUMENT, "divisible by heads");
  CHECK(m == NULL);
  const char *expect = getenv("TD_TEST_EXPECT_CUDA");
  int count = td_device_count(TD_DEVICE_CUDA);
  if (expect) CHECK_EQ_INT(count, atoi(expect));
#ifndef TD_HAVE_CUDA
  m = (td_model *)1;
  CHECK_MSG(td_gpt_create_on(&cfg, gpu, &m), TD_ERR_INVALID_USAGE, "built without CUDA");
  CHECK(m == NULL);
  printf("test_gpt_device: skipped the comparison: this build has no CUDA backend (checked that it says so)\n");
#else
  if (count == 0) {
    m = (td_model *)1;
    CHECK_MSG(td_gpt_create_on(&cfg, gpu, &m), TD_ERR_INVALID_USAGE, "there is no CUDA device");
    CHECK(m == NULL);
    printf("test_gpt_device: skipped the comparison: built with CUDA, but no device here (checked that it says so)\n");
    return 0;
  }
  CHECK_MSG(td_gpt_create_on(&cfg, (td_device){TD_DEVICE_CUDA, count}, &m), TD_ERR_INVALID_USAGE, "visible");
  const td_gpt_config tied = {.vocab = 19, .layers = 1, .channels = 32, .heads = 4, .seq = 5, .tied = 1};
  for (int d = 0; d < 2; d++) {
    td_dtype dtype = d == 0 ? TD_F32 : TD_BF16;
    /* head size 24 (fused attention where it is chosen), odd V and T, untied */
    compare(cfg, 3, 1.0f, dtype, gpu);
    /* tied head, head size 8, loss scale 2 */
    compare(tied, 2, 2.0f, dtype, gpu);
    /* no blocks at all, one position */
    compare((td_gpt_config){.vocab = 11, .layers = 0, .channels = 16, .heads = 2, .seq = 1, .tied = 0}, 1, 1.0f,
            dtype, gpu);
    /* head size 20: only the unfused attention takes it */
    compare((td_gpt_config){.vocab = 13, .layers = 1, .channels = 40, .heads = 2, .seq = 9, .tied = 0}, 2, 0.5f,
            dtype, gpu);
    /* head size 128 (LLaMA-style heads): the fused kernels' 128 (bf16 on
     * the tensor cores, f32 on the CUDA cores' 16-row tiles) */
    compare((td_gpt_config){.vocab = 17, .layers = 1, .channels = 128, .heads = 1, .seq = 7, .tied = 0}, 2, 1.0f,
            dtype, gpu);
  }
  CHECK_OK(td_gpt_create_on(&cfg, gpu, &m));
  CHECK_MSG(td_gpt_set_device_dtype(m, TD_F16), TD_ERR_INVALID_ARGUMENT, "f32 or bf16");
  td_model_destroy(m);
  printf("test_gpt_device: the device GPT matches the CPU GPT\n");
#endif
  return 0;
}
