/* Benchmark (run by hand, not in the suite): GPT training-step throughput on
 * one thread, the counterpart of shared/peers/torch_gpt_ddp.py 1 1. Each step
 * is forward + backward + a plain SGD update (and zeroing the gradients) on
 * random tokens; 2 warm-up steps, then `steps` timed ones; prints tokens/s.
 *
 *   build/<tree>/tests/test_gpt_speed [--layers 4] [--channels 256] [--heads 4]
 *        [--seq 128] [--micro-batch 8] [--steps 10] [--threads 1] [--repeat 1]
 *        [--attention]   also time attention: blocked sgemm vs plain loops
 */
#include <stdint.h>
#include <time.h>

#include "../common/check.h"
#include "nn/nn_internal.h"

/* llm.c-style loop attention (forward + backward), for the comparison */
static void attention_loops_forward(float *out, float *preatt, float *att, const float *inp, int B, int T, int C,
                                    int NH) {
  int C3 = C * 3, hs = C / NH;
  float scale = 1.0f / sqrtf(hs);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int h = 0; h < NH; h++) {
        const float *q = inp + b * T * C3 + t * C3 + h * hs;
        float *pre = preatt + b * NH * T * T + h * T * T + t * T;
        float *a = att + b * NH * T * T + h * T * T + t * T;
        float mx = -1e30f;
        for (int t2 = 0; t2 <= t; t2++) {
          const float *k = inp + b * T * C3 + t2 * C3 + h * hs + C;
          float v = 0;
          for (int i = 0; i < hs; i++) v += q[i] * k[i];
          v *= scale;
          mx = v > mx ? v : mx;
          pre[t2] = v;
        }
        float sum = 0;
        for (int t2 = 0; t2 <= t; t2++) sum += (a[t2] = nn_expf(pre[t2] - mx));
        for (int t2 = 0; t2 < T; t2++) a[t2] = t2 <= t ? a[t2] / sum : 0.0f;
        float *o = out + b * T * C + t * C + h * hs;
        for (int i = 0; i < hs; i++) o[i] = 0;
        for (int t2 = 0; t2 <= t; t2++) {
          const float *v = inp + b * T * C3 + t2 * C3 + h * hs + 2 * C;
          for (int i = 0; i < hs; i++) o[i] += a[t2] * v[i];
        }
      }
}

static void attention_loops_backward(float *dinp, float *dpreatt, float *datt, const float *dout, const float *inp,
                                     const float *att, int B, int T, int C, int NH) {
  int C3 = C * 3, hs = C / NH;
  float scale = 1.0f / sqrtf(hs);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int h = 0; h < NH; h++) {
        const float *a = att + b * NH * T * T + h * T * T + t * T;
        float *da = datt + b * NH * T * T + h * T * T + t * T;
        float *dpre = dpreatt + b * NH * T * T + h * T * T + t * T;
        float *dq = dinp + b * T * C3 + t * C3 + h * hs;
        const float *q = inp + b * T * C3 + t * C3 + h * hs;
        const float *d = dout + b * T * C + t * C + h * hs;
        for (int t2 = 0; t2 <= t; t2++) {
          const float *v = inp + b * T * C3 + t2 * C3 + h * hs + 2 * C;
          float *dv = dinp + b * T * C3 + t2 * C3 + h * hs + 2 * C;
          float s = 0;
          for (int i = 0; i < hs; i++) {
            s += v[i] * d[i];
            dv[i] += a[t2] * d[i];
          }
          da[t2] = s;
        }
        float dot = 0;
        for (int t2 = 0; t2 <= t; t2++) dot += a[t2] * da[t2];
        for (int t2 = 0; t2 <= t; t2++) dpre[t2] = a[t2] * (da[t2] - dot);
        for (int t2 = 0; t2 <= t; t2++) {
          const float *k = inp + b * T * C3 + t2 * C3 + h * hs + C;
          float *dk = dinp + b * T * C3 + t2 * C3 + h * hs + C;
          for (int i = 0; i < hs; i++) {
            dq[i] += k[i] * dpre[t2] * scale;
            dk[i] += q[i] * dpre[t2] * scale;
          }
        }
      }
}

/* CPU seconds of this process: on a shared machine, throughput per CPU
 * second is steadier than per wall second. */
static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void compare_attention(int B, int T, int C, int NH) {
  size_t n_in = (size_t)B * T * 3 * C, n_out = (size_t)B * T * C, n_att = (size_t)B * NH * T * T;
  float *inp = malloc(n_in * 4), *out = malloc(n_out * 4), *att = malloc(n_att * 4), *pre = malloc(n_att * 4);
  float *datt = malloc(n_att * 4), *dinp = calloc(n_in, 4), *dout = malloc(n_out * 4), *scratch = malloc(T * T * 4);
  for (size_t i = 0; i < n_in; i++) inp[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
  for (size_t i = 0; i < n_out; i++) dout[i] = (float)((i * 40503u) % 1000) / 1000.0f - 0.5f;
  int reps = 5;
  /* warm up: first-touch page faults and OpenBLAS's buffers */
  td_attention_forward(out, att, inp, B, T, C, NH);
  td_attention_backward(dinp, scratch, dout, inp, att, B, T, C, NH);
  attention_loops_forward(out, pre, att, inp, B, T, C, NH);
  attention_loops_backward(dinp, pre, datt, dout, inp, att, B, T, C, NH);
  double t0 = cpu_now();
  for (int r = 0; r < reps; r++) td_attention_forward(out, att, inp, B, T, C, NH);
  double t1 = cpu_now();
  for (int r = 0; r < reps; r++) td_attention_backward(dinp, scratch, dout, inp, att, B, T, C, NH);
  double t2 = cpu_now();
  for (int r = 0; r < reps; r++) attention_loops_forward(out, pre, att, inp, B, T, C, NH);
  double t3 = cpu_now();
  for (int r = 0; r < reps; r++) attention_loops_backward(dinp, pre, datt, dout, inp, att, B, T, C, NH);
  double t4 = cpu_now();
  printf("attention B=%d T=%d C=%d NH=%d (CPU ms per call): blocked sgemm fwd %.2f ms bwd %.2f ms | loops fwd %.2f ms bwd %.2f ms\n", B,
         T, C, NH, (t1 - t0) / reps * 1e3, (t2 - t1) / reps * 1e3, (t3 - t2) / reps * 1e3, (t4 - t3) / reps * 1e3);
  free(inp), free(out), free(att), free(pre), free(datt), free(dinp), free(dout), free(scratch);
}

int main(int argc, char **argv) {
  td_gpt_config cfg = {.vocab = 256, .layers = 4, .channels = 256, .heads = 4, .seq = 128};
  int B = 8, steps = 10, threads = 1, repeat = 1, attention = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int has = i + 1 < argc;
    if (!strcmp(a, "--layers") && has) cfg.layers = atoi(argv[++i]);
    else if (!strcmp(a, "--channels") && has) cfg.channels = atoi(argv[++i]);
    else if (!strcmp(a, "--heads") && has) cfg.heads = atoi(argv[++i]);
    else if (!strcmp(a, "--seq") && has) cfg.seq = atoi(argv[++i]);
    else if (!strcmp(a, "--micro-batch") && has) B = atoi(argv[++i]);
    else if (!strcmp(a, "--steps") && has) steps = atoi(argv[++i]);
    else if (!strcmp(a, "--threads") && has) threads = atoi(argv[++i]);
    else if (!strcmp(a, "--repeat") && has) repeat = atoi(argv[++i]);
    else if (!strcmp(a, "--attention")) attention = 1;
    else {
      fprintf(stderr, "usage: %s [--layers L] [--channels C] [--heads H] [--seq T] [--micro-batch B] [--steps N] "
                      "[--threads N] [--repeat N] [--attention]\n", argv[0]);
      return 2;
    }
  }
  td_nn_set_threads(threads);
  if (attention) compare_attention(B, cfg.seq, cfg.channels, cfg.heads);
  td_model *m;
  CHECK_OK(td_gpt_create(&cfg, &m));
  CHECK_OK(m->ops->prepare(m, B));
  float *params = td_alloc(m->n_params * sizeof(float)), *grads = td_calloc(m->n_params * sizeof(float));
  td_model_init_params(m, params, 1);
  int T = cfg.seq;
  int32_t *x = malloc((size_t)B * T * 4), *y = malloc((size_t)B * T * 4);
  uint64_t s = 42;
  for (int i = 0; i < B * T; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x[i] = (int32_t)(s >> 56);
    y[i] = (int32_t)((s >> 40) & 255);
  }
  for (int r = 0; r < repeat; r++) {
    double t0 = 0, c0 = 0, fwd = 0, bwd = 0, upd = 0;
    float loss = 0;
    for (int it = 0; it < steps + 2; it++) {
      if (it == 2) t0 = td_now(), c0 = cpu_now(), fwd = bwd = upd = 0;
      double a = td_now();
      loss = m->ops->forward(m, params, x, y, B);
      double b = td_now();
      m->ops->backward(m, params, grads, 1.0f, NULL, NULL);
      double c = td_now();
      for (size_t i = 0; i < m->n_params; i++) params[i] -= 1e-3f * grads[i];
      memset(grads, 0, m->n_params * sizeof(float));
      double d = td_now();
      fwd += b - a, bwd += c - b, upd += d - c;
    }
    double dt = td_now() - t0, dcpu = cpu_now() - c0;
    printf("tandem-nn gpt threads=%d params=%zu tokens_per_s=%.0f tokens_per_cpu_s=%.0f step_ms=%.1f (forward %.1f, backward %.1f, update "
           "%.1f) loss=%.4f matmul=%s\n",
           threads, m->n_params, (double)B * T * steps / dt, (double)B * T * steps / dcpu, dt / steps * 1e3, fwd / steps * 1e3, bwd / steps * 1e3,
           upd / steps * 1e3, loss, td_nn_matmul_backend());
  }
  td_free(params), td_free(grads), free(x), free(y);
  td_model_destroy(m);
  return 0;
}
