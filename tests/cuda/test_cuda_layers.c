/* Every CUDA layer launcher (src/nn/cuda, src/train/cuda) against an
 * independent reference: the CPU fp32 layers of include/tandem/nn.h, or a
 * closed form computed here in double (AdamW, the global norm, casts).
 * Random inputs at odd sizes: B = 2, T = 1, 7, 33 (and 1023, 1024 with
 * --big, for the GPU run), C = 72 (not a multiple of 64), 3 heads of 24,
 * V = 97 (odd), in f32 and bf16; elementwise kernels also at sizes with a
 * tail and at unaligned pointers. Backward gradients start from random
 * values, so that accumulation (+=) is checked too.
 * Bounds, with ref the f32 CPU result and max|ref| over the tensor:
 *  - f32: max |got - ref| <= 1e-5 max|ref| (normwise relative: the two sides
 *    sum in different orders, so an element that cancels to ~0 can only be
 *    judged against the tensor's scale);
 *  - bf16: the inputs are bf16 values (rounded before both sides see them),
 *    the kernels compute in f32 and round each output once, so
 *    |got - ref| <= 2^-8 |ref| (bf16 has 8 significant bits: a rounding to
 *    nearest is off by at most half of 2^-7 relative) + 1e-5 max|ref| (the
 *    f32 part above). dwte is rounded once per position that adds into a row
 *    (k of them): (k + 1) 2^-8 max|ref|. The fused bf16 attention rounds P
 *    and dS before its tensor-core products: per-element bounds derived
 *    from the CPU's P, dS and inputs (fused_bf16_bounds).
 * The fused kernels run at head sizes 24 (CUDA cores), 64, 32 and 16 (tensor
 * cores in bf16: the FlashAttention-2 kernels; their backward in one pass
 * with TANDEM_CUDA_ATTENTION=onepass, which td_cuda_attention_backward_flags
 * turns into the flag the test passes), and at T = 130 (several 64-row tiles);
 * --attention: head size 64 at T = 17, 64, 127, 257 and 1024; --attention
 * hs128: head size 128 at T = 1, 7, 33, 64, 130, 257 (bf16) and 1, 7, 33
 * (f32); --attention small: head size 64 at T = 17, 64, 130 and 128 at 7,
 * 130. The fused forward runs with the flags TANDEM_CUDA_ATTENTION_STORE
 * asks for (td_cuda_attention_forward_flags), into an output filled with
 * NaN first.
 * Runs under the emulator in CI (tests/cudaemu.suite) and on a GPU
 * (tests/gpu.suite via scripts/gpu-check), the same binary source. Without
 * a device it prints SKIP and exits 0 (FAIL and 1 with TD_TEST_EXPECT_CUDA=1).
 * --bench [small]: per-kernel timings instead (see run_bench). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "../common/check.h"
#include "nn/cuda/cuda_layers.h"
#include "tandem/nn.h"
#include "train/cuda/cuda_optim.h"

static const double kF32Tol = 1e-5;
static const double kBf16Unit = 1.0 / 256.0; /* 2^-8 */

/* round-to-nearest-even f32 -> bf16 bits, written here (not the library's) */
static uint16_t ref_bf16_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static float ref_bf16_value(float f) {
  uint32_t u = (uint32_t)ref_bf16_bits(f) << 16;
  float r;
  memcpy(&r, &u, 4);
  return r;
}

static uint64_t rng = 0x5eed;

/* n random values in [-scale, scale), representable in dtype */
static float *rand_host(size_t n, float scale, td_dtype dtype) {
  float *p = td_test_rand_buf(&rng, n, scale);
  CHECK(p != NULL);
  if (dtype == TD_BF16)
    for (size_t i = 0; i < n; i++) p[i] = ref_bf16_value(p[i]);
  return p;
}

static size_t esize(td_dtype dtype) { return dtype == TD_BF16 ? 2 : 4; }

static void *upload(const float *h, size_t n, td_dtype dtype) {
  void *d = NULL;
  CHECK(cudaMalloc(&d, n ? n * esize(dtype) : 1) == cudaSuccess);
  if (!n) return d;
  if (dtype == TD_F32) {
    CHECK(cudaMemcpy(d, h, n * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  } else {
    uint16_t *tmp = malloc(n * 2);
    CHECK(tmp != NULL);
    for (size_t i = 0; i < n; i++) tmp[i] = ref_bf16_bits(h[i]);
    CHECK(cudaMemcpy(d, tmp, n * 2, cudaMemcpyHostToDevice) == cudaSuccess);
    free(tmp);
  }
  return d;
}

static float *download(const void *d, size_t n, td_dtype dtype) {
  float *h = malloc((n ? n : 1) * sizeof(float));
  CHECK(h != NULL);
  if (!n) return h;
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  if (dtype == TD_F32) {
    CHECK(cudaMemcpy(h, d, n * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
  } else {
    uint16_t *tmp = malloc(n * 2);
    CHECK(tmp != NULL);
    CHECK(cudaMemcpy(tmp, d, n * 2, cudaMemcpyDeviceToHost) == cudaSuccess);
    for (size_t i = 0; i < n; i++) {
      uint32_t u = (uint32_t)tmp[i] << 16;
      memcpy(&h[i], &u, 4);
    }
    free(tmp);
  }
  return h;
}

/* Compare a device tensor with the reference under the bounds above; `k`
 * roundings per element for bf16 (1 for a single rounded output). */
static void expect_close_k(const char *what, const void *dgot, const float *ref, size_t n, td_dtype dtype, int k) {
  float *got = download(dgot, n, dtype);
  double scale = 0;
  for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(ref[i]));
  for (size_t i = 0; i < n; i++) {
    double err = fabs((double)got[i] - ref[i]);
    double bound = dtype == TD_F32 ? kF32Tol * scale
                                   : (k == 1 ? kBf16Unit * fabs(ref[i]) : k * kBf16Unit * scale) + kF32Tol * scale;
    if (!(err <= bound + 1e-30)) {
      td_test_fail(__FILE__, __LINE__, "%s (%s): element %zu of %zu: got %.9g, reference %.9g (|err| %.3g > %.3g)",
                   what, td_dtype_name(dtype), i, n, got[i], ref[i], err, bound);
    }
  }
  free(got);
}
static void expect_close(const char *what, const void *dgot, const float *ref, size_t n, td_dtype dtype) {
  expect_close_k(what, dgot, ref, n, dtype, 1);
}


/* got within bound[i] + 1e-5 max|ref| of ref, element by element */
static void expect_within(const char *what, const void *dgot, const float *ref, const double *bound, size_t n,
                          td_dtype dtype) {
  float *got = download(dgot, n, dtype);
  double scale = 0;
  for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(ref[i]));
  for (size_t i = 0; i < n; i++) {
    double err = fabs((double)got[i] - ref[i]), b = bound[i] + kF32Tol * scale;
    if (!(err <= b + 1e-30))
      td_test_fail(__FILE__, __LINE__, "%s (%s): element %zu of %zu: got %.9g, reference %.9g (|err| %.3g > %.3g)",
                   what, td_dtype_name(dtype), i, n, got[i], ref[i], err, b);
  }
  free(got);
}

/* A product added to what the destination held (a residual, a gradient
 * accumulated), compared with the f32 result `ref`; terms[i] is the sum of
 * the magnitudes of what was added at i (the product's, the bias's, the
 * destination's). f32: as expect_close. bf16: the emulator rounds once (the
 * result), but cuBLASLt's epilogue on an H200 also rounds partial sums to
 * bf16 before the last addition, and its rounding is not always to nearest
 * (2026-11-28: -0.625 for -0.62862, where -0.62891 is nearest; 0.08789 for
 * 0.08631, three units of the result, when the product and the residual
 * nearly cancelled): two units of the terms plus one of the result. */
static void expect_accumulated(const char *what, const void *dgot, const float *ref, const double *terms, size_t n,
                               td_dtype dtype) {
  if (dtype == TD_F32) {
    expect_close(what, dgot, ref, n, dtype);
    return;
  }
  double *bound = malloc(sizeof(double) * (n ? n : 1));
  CHECK(bound != NULL);
  for (size_t i = 0; i < n; i++) bound[i] = kBf16Unit * (2 * terms[i] + fabs(ref[i]));
  expect_within(what, dgot, ref, bound, n, dtype);
  free(bound);
}

/* |a[i]| + |b[i]|, or |a[i] - b[i]| + |b[i]| with minus, into a new array */
static double *term_sums(const float *a, const float *b, size_t n, int minus) {
  double *t = malloc(sizeof(double) * (n ? n : 1));
  CHECK(t != NULL);
  for (size_t i = 0; i < n; i++) t[i] = fabs(minus ? (double)a[i] - b[i] : a[i]) + fabs(b[i]);
  return t;
}

/* Bounds of the fused bf16 attention (flash_attention.cu), per element, from
 * the CPU's f32 quantities, with u = 2^-8 (bf16's unit roundoff): P and dS
 * are rounded to bf16 before their products (the tensor-core path), dO.O is
 * formed from the rounded output, and each result is rounded once:
 *   out_i:  u (|out_i| + sum_j p_ij |v_j|)
 *   dv_j:   u (|ref| + sum_i p_ij |dO_i|)
 *   dq_i:   u |ref| + s sum_j e_ij |k_j|,  dk_j: u |ref| + s sum_i e_ij |q_i|,
 *   with e_ij = u (|dS_ij| + p_ij sum_d |dO_id O_id|), s = 1/sqrt(hs). */
static void fused_bf16_bounds(double *bout /* (B,T,C) */, double *bin /* (B,T,3C) */, const float *x, const float *att,
                              const float *out, const float *dy, const float *ref_out, const float *ref_din, int B,
                              int T, int C, int NH) {
  const double u = kBf16Unit;
  int hs = C / NH;
  double s = 1.0 / sqrt((double)hs);
  size_t nout = (size_t)B * T * C, nin = (size_t)B * T * 3 * C;
  for (size_t i = 0; i < nout; i++) bout[i] = u * fabs(ref_out[i]);
  for (size_t i = 0; i < nin; i++) bin[i] = u * fabs(ref_din[i]);
  double *dS = malloc(sizeof(double) * (size_t)T * T);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      const float *P = att + ((size_t)b * NH + h) * T * T;
#define Q_(t, d) x[((size_t)b * T + (t)) * 3 * C + (size_t)h * hs + (d)]
#define K_(t, d) x[((size_t)b * T + (t)) * 3 * C + C + (size_t)h * hs + (d)]
#define V_(t, d) x[((size_t)b * T + (t)) * 3 * C + 2 * C + (size_t)h * hs + (d)]
#define DO_(t, d) dy[((size_t)b * T + (t)) * C + (size_t)h * hs + (d)]
#define O_(t, d) out[((size_t)b * T + (t)) * C + (size_t)h * hs + (d)]
      for (int i = 0; i < T; i++) {
        double Di = 0, Dabs = 0;
        for (int d = 0; d < hs; d++) {
          Di += (double)DO_(i, d) * O_(i, d);
          Dabs += fabs((double)DO_(i, d) * O_(i, d));
        }
        for (int j = 0; j <= i; j++) {
          double p = P[(size_t)i * T + j], dp = 0;
          for (int d = 0; d < hs; d++) dp += (double)DO_(i, d) * V_(j, d);
          dS[(size_t)i * T + j] = u * (fabs(p * (dp - Di)) + p * Dabs); /* e_ij */
          for (int d = 0; d < hs; d++) {
            bout[((size_t)b * T + i) * C + (size_t)h * hs + d] += u * p * fabs(V_(j, d));
            bin[((size_t)b * T + j) * 3 * C + 2 * C + (size_t)h * hs + d] += u * p * fabs(DO_(i, d));
          }
        }
        for (int j = 0; j <= i; j++) {
          double e = dS[(size_t)i * T + j];
          for (int d = 0; d < hs; d++) {
            bin[((size_t)b * T + i) * 3 * C + (size_t)h * hs + d] += s * e * fabs(K_(j, d));
            bin[((size_t)b * T + j) * 3 * C + C + (size_t)h * hs + d] += s * e * fabs(Q_(i, d));
          }
        }
      }
#undef Q_
#undef K_
#undef V_
#undef DO_
#undef O_
    }
  free(dS);
}

static void *dev_f32(size_t n) {
  void *d = NULL;
  CHECK(cudaMalloc(&d, (n ? n : 1) * sizeof(float)) == cudaSuccess);
  return d;
}

/* td_encoder_buckets on the host and the buckets' device copies: *d_order
 * and *d_starts (cudaFree them); returns the bucket count. Checks the
 * buckets against their definition: every valid position once, one token
 * per bucket, positions increasing within it, the counters left zero. */
static int upload_buckets(const int32_t *tok, int BT, int V, int32_t **d_order, int32_t **d_starts) {
  int32_t *order = malloc(sizeof(int32_t) * (BT + 1)), *starts = malloc(sizeof(int32_t) * (BT + 2));
  int32_t *counts = calloc((size_t)V, sizeof(int32_t));
  CHECK(order && starts && counts);
  int nb = td_encoder_buckets(tok, BT, V, order, starts, counts);
  int valid = 0;
  for (int i = 0; i < BT; i++) valid += tok[i] >= 0 && tok[i] < V;
  CHECK(nb >= 0 && starts[0] == 0 && starts[nb] == valid);
  char *seen = calloc((size_t)BT + 1, 1);
  for (int b = 0; b < nb; b++) {
    CHECK(starts[b + 1] > starts[b]);
    for (int j = starts[b]; j < starts[b + 1]; j++) {
      CHECK(order[j] >= 0 && order[j] < BT && !seen[order[j]]);
      seen[order[j]] = 1;
      CHECK(tok[order[j]] == tok[order[starts[b]]]);
      if (j > starts[b]) CHECK(order[j] > order[j - 1]);
    }
    if (b > 0) CHECK(tok[order[starts[b]]] != tok[order[starts[b - 1]]]);
  }
  for (int v = 0; v < V; v++) CHECK(counts[v] == 0);
  CHECK(cudaMalloc((void **)d_order, sizeof(int32_t) * (BT + 1)) == cudaSuccess);
  CHECK(cudaMalloc((void **)d_starts, sizeof(int32_t) * (nb + 1)) == cudaSuccess);
  if (valid) CHECK(cudaMemcpy(*d_order, order, sizeof(int32_t) * valid, cudaMemcpyHostToDevice) == cudaSuccess);
  CHECK(cudaMemcpy(*d_starts, starts, sizeof(int32_t) * (nb + 1), cudaMemcpyHostToDevice) == cudaSuccess);
  free(order), free(starts), free(counts), free(seen);
  return nb;
}

/* tokens: a stride pattern with a repeated token (several positions add
 * into one row), and with `all_same` every position the same token (one
 * bucket of B T rows) */
static void test_encoder_tokens(int B, int T, int C, int V, td_dtype dt, int all_same) {
  size_t n = (size_t)B * T * C;
  int32_t *tok = malloc(sizeof(int32_t) * (size_t)B * T);
  int counts[1024] = {0}, max_count = 0;
  for (int i = 0; i < B * T; i++) {
    tok[i] = (int32_t)((i * 7 + 3) % V);
    if (i % 5 == 0) tok[i] = 11 % V; /* repeated: several positions add into one row */
    if (all_same) tok[i] = V - 1;
    if (++counts[tok[i]] > max_count) max_count = counts[tok[i]];
  }
  float *wte = rand_host((size_t)V * C, 1, dt), *wpe = rand_host((size_t)T * C, 1, dt);
  float *out = malloc(n * 4);
  td_embedding_forward(out, tok, wte, wpe, B, T, C);
  int32_t *dtok;
  CHECK(cudaMalloc((void **)&dtok, sizeof(int32_t) * (size_t)B * T) == cudaSuccess);
  CHECK(cudaMemcpy(dtok, tok, sizeof(int32_t) * (size_t)B * T, cudaMemcpyHostToDevice) == cudaSuccess);
  void *dwte_p = upload(wte, (size_t)V * C, dt), *dwpe_p = upload(wpe, (size_t)T * C, dt), *dout = dev_f32(n);
  CHECK_OK(td_cuda_encoder_forward(dout, dtok, dwte_p, dwpe_p, B, T, C, dt, NULL));
  expect_close("encoder forward", dout, out, n, dt);
  float *g = rand_host(n, 1, dt), *gwte = rand_host((size_t)V * C, 1, dt), *gwpe = rand_host((size_t)T * C, 1, dt);
  void *dg = upload(g, n, dt), *dgwte = upload(gwte, (size_t)V * C, dt), *dgwpe = upload(gwpe, (size_t)T * C, dt);
  float *gwte0_copy = malloc((size_t)V * C * sizeof(float));
  memcpy(gwte0_copy, gwte, (size_t)V * C * sizeof(float));
  td_embedding_backward(gwte, gwpe, g, tok, B, T, C);
  int32_t *dorder, *dstarts;
  int nb = upload_buckets(tok, B * T, V, &dorder, &dstarts);
  CHECK_OK(td_cuda_encoder_backward(dgwte, dgwpe, dg, dtok, dorder, dstarts, nb, B, T, C, dt, NULL));
  expect_close_k("encoder backward dwte", dgwte, gwte, (size_t)V * C, dt, dt == TD_BF16 ? max_count + 1 : 1);
  expect_close("encoder backward dwpe", dgwpe, gwpe, (size_t)T * C, dt);
  /* deterministic: a second run from the same start gives the same bits */
  float *first = download(dgwte, (size_t)V * C, dt);
  CHECK(cudaFree(dgwte) == cudaSuccess);
  dgwte = upload(gwte0_copy, (size_t)V * C, dt);
  CHECK_OK(td_cuda_encoder_backward(dgwte, NULL, dg, dtok, dorder, dstarts, nb, B, T, C, dt, NULL));
  float *second = download(dgwte, (size_t)V * C, dt);
  CHECK(memcmp(first, second, (size_t)V * C * sizeof(float)) == 0);
  free(first), free(second), free(gwte0_copy);
  cudaFree(dgwte);
  CHECK(cudaFree(dtok) == cudaSuccess);
  cudaFree(dorder), cudaFree(dstarts);
  cudaFree(dwte_p), cudaFree(dwpe_p), cudaFree(dout), cudaFree(dg), cudaFree(dgwpe);
  free(tok), free(wte), free(wpe), free(out), free(g), free(gwte), free(gwpe);
}
static void test_encoder(int B, int T, int C, int V, td_dtype dt) {
  test_encoder_tokens(B, T, C, V, dt, 0);
  test_encoder_tokens(B, T, C, V, dt, 1);
}

static void test_layernorm(int N, int C, td_dtype dt) {
  size_t n = (size_t)N * C;
  float *x = rand_host(n, 2, dt), *w = rand_host(C, 1, dt), *b = rand_host(C, 1, dt), *x2 = rand_host(n, 1, dt);
  float *out = malloc(n * 4), *mean = malloc(N * 4 + 4), *rstd = malloc(N * 4 + 4);
  td_layernorm_forward(out, mean, rstd, x, w, b, N, C);
  void *dx = upload(x, n, dt), *dw = upload(w, C, dt), *db = upload(b, C, dt), *dout = dev_f32(n);
  float *dmean = dev_f32(N), *drstd = dev_f32(N);
  CHECK_OK(td_cuda_layernorm_forward(dout, dmean, drstd, dx, dw, db, N, C, dt, NULL));
  expect_close("layernorm forward", dout, out, n, dt);
  expect_close("layernorm mean", dmean, mean, N, TD_F32);
  expect_close("layernorm rstd", drstd, rstd, N, TD_F32);
  /* backward, gradients starting from random values */
  float *dy = rand_host(n, 1, dt), *gx = rand_host(n, 1, dt), *gw = rand_host(C, 1, dt), *gb = rand_host(C, 1, dt);
  void *ddy = upload(dy, n, dt), *dgx = upload(gx, n, dt), *dgw = upload(gw, C, dt), *dgb = upload(gb, C, dt);
  td_layernorm_backward(gx, gw, gb, dy, x, w, mean, rstd, N, C);
  float *dscr = dev_f32(td_cuda_layernorm_backward_scratch_floats(N, C));
  CHECK_OK(td_cuda_layernorm_backward(dgx, dgw, dgb, dscr, ddy, dx, dw, dmean, drstd, N, C, dt, NULL));
  expect_close("layernorm backward dinp", dgx, gx, n, dt);
  expect_close("layernorm backward dweight", dgw, gw, C, dt);
  expect_close("layernorm backward dbias", dgb, gb, C, dt);
  /* deterministic, and each gradient alone (the others NULL) as with all
   * three: from the same start, e* gets two whole calls, f* one call per
   * gradient and one whole call; the same bits (not at the edge sweep's
   * 16k rows: six more launches of 1024 blocks cost the emulator too much) */
  if (N <= 1024) {
    float *gx0 = rand_host(n, 1, dt), *gw0 = rand_host(C, 1, dt), *gb0 = rand_host(C, 1, dt);
    void *ex = upload(gx0, n, dt), *ew = upload(gw0, C, dt), *eb = upload(gb0, C, dt);
    void *fx = upload(gx0, n, dt), *fw = upload(gw0, C, dt), *fb = upload(gb0, C, dt);
    CHECK_OK(td_cuda_layernorm_backward(ex, ew, eb, dscr, ddy, dx, dw, dmean, drstd, N, C, dt, NULL));
    CHECK_OK(td_cuda_layernorm_backward(ex, ew, eb, dscr, ddy, dx, dw, dmean, drstd, N, C, dt, NULL));
    CHECK_OK(td_cuda_layernorm_backward(fx, NULL, NULL, dscr, ddy, dx, dw, dmean, drstd, N, C, dt, NULL));
    CHECK_OK(td_cuda_layernorm_backward(NULL, fw, NULL, dscr, ddy, dx, dw, dmean, drstd, N, C, dt, NULL));
    CHECK_OK(td_cuda_layernorm_backward(NULL, NULL, fb, dscr, ddy, dx, dw, dmean, drstd, N, C, dt, NULL));
    CHECK_OK(td_cuda_layernorm_backward(fx, fw, fb, dscr, ddy, dx, dw, dmean, drstd, N, C, dt, NULL));
    float *ax = download(ex, n, dt), *aw = download(ew, C, dt), *ab = download(eb, C, dt);
    float *bx = download(fx, n, dt), *bw = download(fw, C, dt), *bb = download(fb, C, dt);
    CHECK(memcmp(ax, bx, n * 4) == 0 && memcmp(aw, bw, C * 4) == 0 && memcmp(ab, bb, C * 4) == 0);
    free(gx0), free(gw0), free(gb0);
    free(ax), free(aw), free(ab), free(bx), free(bw), free(bb);
    cudaFree(ex), cudaFree(ew), cudaFree(eb), cudaFree(fx), cudaFree(fw), cudaFree(fb);
  }
  /* scratch is required where the kernels use it */
  if (td_cuda_layernorm_backward_scratch_floats(N, C) > 0)
    CHECK_STATUS(td_cuda_layernorm_backward(dgx, dgw, dgb, NULL, ddy, dx, dw, dmean, drstd, N, C, dt, NULL),
                 TD_ERR_INVALID_ARGUMENT);
  cudaFree(dscr);
  /* fused residual + layer norm: residual rounded to dtype, then normalized */
  float *res = malloc(n * 4);
  for (size_t i = 0; i < n; i++) res[i] = dt == TD_BF16 ? ref_bf16_value(x[i] + x2[i]) : x[i] + x2[i];
  td_layernorm_forward(out, mean, rstd, res, w, b, N, C);
  void *dx2 = upload(x2, n, dt), *dres = dev_f32(n);
  CHECK_OK(td_cuda_residual_layernorm_forward(dres, dout, dmean, drstd, dx, dx2, dw, db, N, C, dt, NULL));
  expect_close("residual+layernorm residual", dres, res, n, dt);
  expect_close("residual+layernorm forward", dout, out, n, dt);
  /* the plain residual add */
  CHECK_OK(td_cuda_residual_forward(dres, dx, dx2, n, dt, NULL));
  expect_close("residual forward", dres, res, n, dt);
  cudaFree(dx), cudaFree(dw), cudaFree(db), cudaFree(dout), cudaFree(dmean), cudaFree(drstd), cudaFree(ddy);
  cudaFree(dgx), cudaFree(dgw), cudaFree(dgb), cudaFree(dx2), cudaFree(dres);
  free(x), free(w), free(b), free(x2), free(out), free(mean), free(rstd), free(dy), free(gx), free(gw), free(gb);
  free(res);
}

static void test_gelu(size_t n, td_dtype dt) {
  float *x = rand_host(n, 3, dt), *out = malloc(n * 4 + 4), *dy = rand_host(n, 1, dt), *gx = rand_host(n, 1, dt);
  td_gelu_forward(out, x, n);
  void *dx = upload(x, n, dt), *dout = dev_f32(n), *ddy = upload(dy, n, dt), *dgx = upload(gx, n, dt);
  CHECK_OK(td_cuda_gelu_forward(dout, dx, n, dt, NULL));
  expect_close("gelu forward", dout, out, n, dt);
  td_gelu_backward(gx, x, dy, n);
  CHECK_OK(td_cuda_gelu_backward(dgx, dx, ddy, n, dt, NULL));
  expect_close("gelu backward", dgx, gx, n, dt);
  /* in place over the output gradient: gelu'(x) dy, the CPU's backward into zeros */
  float *scaled = calloc(n + 1, 4);
  CHECK(scaled != NULL);
  td_gelu_backward(scaled, x, dy, n);
  CHECK_OK(td_cuda_gelu_grad_scale(ddy, dx, n, dt, NULL));
  expect_close("gelu grad scale (in place)", ddy, scaled, n, dt);
  free(scaled);
  cudaFree(dx), cudaFree(dout), cudaFree(ddy), cudaFree(dgx);
  free(x), free(out), free(dy), free(gx);
}

/* The 16-byte groups of the elementwise kernels: sizes that leave a tail,
 * and pointers one element off 16-byte alignment (the element-by-element
 * path), for GELU forward/backward and the residual add. */
static void test_elementwise_edges(td_dtype dt) {
  const size_t sizes[] = {1, 7, 1001};
  for (int si = 0; si < 3; si++)
    for (int off = 0; off < 2; off++) {
      size_t n = sizes[si], m = n + 1;
      float *x = rand_host(m, 3, dt), *dy = rand_host(m, 1, dt), *gx = rand_host(m, 1, dt), *out = malloc(m * 4);
      void *dx = upload(x, m, dt), *ddy = upload(dy, m, dt), *dgx = upload(gx, m, dt), *dout = dev_f32(m);
      size_t es = esize(dt);
      char *px = (char *)dx + off * es, *pdy = (char *)ddy + off * es, *pgx = (char *)dgx + off * es;
      char *pout = (char *)dout + off * es;
      td_gelu_forward(out + off, x + off, n);
      CHECK_OK(td_cuda_gelu_forward(pout, px, n, dt, NULL));
      float *got = download(dout, m, dt);
      for (size_t i = 0; i < n; i++) {
        double ref = out[off + i], bound = (dt == TD_F32 ? 1e-5 : kBf16Unit) * fabs(ref) + 1e-6;
        if (!(fabs(got[off + i] - ref) <= bound))
          td_test_fail(__FILE__, __LINE__, "gelu n=%zu offset %d element %zu: %.9g vs %.9g", n, off, i, got[off + i],
                       ref);
      }
      td_gelu_backward(gx + off, x + off, dy + off, n);
      CHECK_OK(td_cuda_gelu_backward(pgx, px, pdy, n, dt, NULL));
      expect_close("gelu backward (tail, offset)", dgx, gx, m, dt); /* the element outside stays as uploaded */
      for (size_t i = 0; i < n; i++) out[off + i] = x[off + i] + dy[off + i];
      if (dt == TD_BF16)
        for (size_t i = 0; i < n; i++) out[off + i] = ref_bf16_value(out[off + i]);
      CHECK_OK(td_cuda_residual_forward(pout, px, pdy, n, dt, NULL));
      float *res = download(dout, m, dt);
      for (size_t i = 0; i < n; i++) CHECK_CLOSE(res[off + i], out[off + i], dt == TD_F32 ? 1e-6 : 0, 1e-7);
      cudaFree(dx), cudaFree(ddy), cudaFree(dgx), cudaFree(dout);
      free(x), free(dy), free(gx), free(out), free(got), free(res);
    }
}

static void test_matmul(int N, int IC, int OC, int with_bias, td_dtype dt) {
  size_t ni = (size_t)N * IC, no = (size_t)N * OC, nw = (size_t)OC * IC;
  float *x = rand_host(ni, 1, dt), *w = rand_host(nw, 1, dt), *b = with_bias ? rand_host(OC, 1, dt) : NULL;
  float *out = malloc(no * 4 + 4);
  td_linear_forward(out, x, w, b, N, IC, OC);
  void *dx = upload(x, ni, dt), *dw = upload(w, nw, dt), *db = b ? upload(b, OC, dt) : NULL, *dout = dev_f32(no);
  CHECK_OK(td_cuda_matmul_forward(dout, dx, dw, db, N, IC, OC, dt, NULL));
  expect_close(with_bias ? "matmul forward (bias)" : "matmul forward", dout, out, no, dt);
  /* the fused forms: + residual (in place too), GELU with its input kept */
  float *res = rand_host(no, 1, dt), *sum = malloc(no * 4 + 4), *gel = malloc(no * 4 + 4);
  for (size_t i = 0; i < no; i++) sum[i] = out[i] + res[i];
  td_gelu_forward(gel, out, no);
  void *dres = upload(res, no, dt), *dpre = dev_f32(no);
  double *terms = term_sums(out, res, no, 0); /* |x w + b| + |res|, then the bias apart */
  if (b)
    for (size_t i = 0; i < no; i++) terms[i] += 2 * fabs(b[i % OC]);
  CHECK_OK(td_cuda_matmul_forward_ex(dout, NULL, dres, dx, dw, db, N, IC, OC, dt, NULL));
  expect_accumulated("matmul forward + residual", dout, sum, terms, no, dt);
  CHECK_OK(td_cuda_matmul_forward_ex(dres, NULL, dres, dx, dw, db, N, IC, OC, dt, NULL));
  expect_accumulated("matmul forward + residual in place", dres, sum, terms, no, dt);
  free(terms);
  CHECK_OK(td_cuda_matmul_forward_ex(dout, dpre, NULL, dx, dw, db, N, IC, OC, dt, NULL));
  expect_close("matmul forward pre-GELU", dpre, out, no, dt);
  if (dt == TD_F32) {
    expect_close("matmul forward GELU", dout, gel, no, dt);
  } else {
    /* GELU of the pre-activation, f32 (cuBLASLt's epilogue) or already
     * rounded (the tiled path), then rounded: |gelu'| <= 1.13 turns the
     * pre-activation's rounding into 1.13 u |pre| */
    double *bound = malloc(sizeof(double) * (no ? no : 1));
    for (size_t i = 0; i < no; i++) bound[i] = kBf16Unit * (fabs(gel[i]) + 1.13 * fabs(out[i]));
    expect_within("matmul forward GELU", dout, gel, bound, no, dt);
    free(bound);
  }
  CHECK_STATUS(td_cuda_matmul_forward_ex(dout, dpre, dres, dx, dw, db, N, IC, OC, dt, NULL), TD_ERR_INVALID_ARGUMENT);
  cudaFree(dres), cudaFree(dpre);
  free(res), free(sum), free(gel);
  float *dy = rand_host(no, 1, dt), *gx = rand_host(ni, 1, dt), *gw = rand_host(nw, 1, dt), *gb = rand_host(OC, 1, dt);
  void *ddy = upload(dy, no, dt), *dgx = upload(gx, ni, dt), *dgw = upload(gw, nw, dt), *dgb = upload(gb, OC, dt);
  /* the products alone (accumulated into zeros), for expect_accumulated's bound */
  float *px = calloc(ni + 1, 4), *pw = calloc(nw + 1, 4), *pb = calloc(OC + 1, 4);
  CHECK(px != NULL && pw != NULL && pb != NULL);
  td_linear_backward(px, pw, pb, dy, x, w, N, IC, OC);
  td_linear_backward(gx, gw, gb, dy, x, w, N, IC, OC);
  CHECK_OK(td_cuda_matmul_backward(dgx, dgw, dgb, ddy, dx, dw, N, IC, OC, dt, NULL));
  /* the terms: the product and what the destination held (the result less the product) */
  double *tx = term_sums(gx, px, ni, 1), *tw = term_sums(gw, pw, nw, 1), *tb = term_sums(gb, pb, OC, 1);
  expect_accumulated("matmul backward dinp", dgx, gx, tx, ni, dt);
  expect_accumulated("matmul backward dweight", dgw, gw, tw, nw, dt);
  expect_accumulated("matmul backward dbias", dgb, gb, tb, OC, dt);
  free(tx), free(tw), free(tb);
  free(px), free(pw), free(pb);
  cudaFree(dx), cudaFree(dw), cudaFree(db), cudaFree(dout), cudaFree(ddy), cudaFree(dgx), cudaFree(dgw), cudaFree(dgb);
  free(x), free(w), free(b), free(out), free(dy), free(gx), free(gw), free(gb);
}

/* td_cuda_matmul_backward_ex: the input gradient overwritten (dinp filled
 * with NaN first: a read of it shows), alone and with GELU's backward folded
 * in (dinp = gelu'(pre) P, P = dout @ weight), against the CPU's linear and
 * GELU backward; dweight and dbias still accumulate. pre in [-3, 3) covers
 * GELU's negative slope (x < -0.75). OC = 0 must give zeros.
 * bf16 bound of the fold: the f32 P times gelu'(pre) (f32 with tanhf),
 * rounded once: u |ref| at nearest. cuBLASLt's epilogue on the GPU may
 * round P to bf16 before it multiplies (u |gelu'| |P|), its final rounding
 * was seen a whole ulp off (2 u |ref|; expect_accumulated's comment), and
 * it may evaluate tanh with the hardware's tanh.approx.f32 (relative error
 * up to 2^-11, PTX ISA): an error d in th = tanh(c (x + a x^3)) moves
 * gelu'(x) = (1 + th)/2 + x c (1 - th^2)(1 + 3a x^2)/2 by at most
 * |d| (1/2 + |x| c (1 + 3a x^2)) (|th| <= 1), times |P|. So
 *   u (|gelu'(pre)| |P| + 2 |ref|) + 2^-11 (1/2 + |pre| c (1 + 3a pre^2)) |P|
 * (at |pre| = 3 the last term is 0.7 u |P|; leaving gelu' out misses by
 * |1 - gelu'| |P|, far outside it). */
static void test_matmul_overwrite(int N, int IC, int OC, td_dtype dt) {
  size_t ni = (size_t)N * IC, no = (size_t)N * OC, nw = (size_t)OC * IC;
  float *x = rand_host(ni + 1, 1, dt), *w = rand_host(nw + 1, 1, dt), *dy = rand_host(no + 1, 1, dt);
  float *pre = rand_host(ni + 1, 3, dt), *gw = rand_host(nw + 1, 1, dt), *gb = rand_host(OC + 1, 1, dt);
  float *nan_fill = malloc((ni + 1) * 4), *ones = malloc((ni + 1) * 4), *p = calloc(ni + 1, 4);
  float *pw = calloc(nw + 1, 4), *pb = calloc(OC + 1, 4), *ref = calloc(ni + 1, 4), *slope = calloc(ni + 1, 4);
  double *bound = malloc((ni + 1) * sizeof(double));
  CHECK(nan_fill && ones && p && pw && pb && ref && slope && bound);
  for (size_t i = 0; i <= ni; i++) nan_fill[i] = NAN, ones[i] = 1.0f;
  void *dx = upload(x, ni, dt), *dw = upload(w, nw, dt), *ddy = upload(dy, no, dt), *dpre = upload(pre, ni, dt);
  void *dgx = upload(nan_fill, ni, dt), *dgw = upload(gw, nw, dt), *dgb = upload(gb, OC, dt);
  td_linear_backward(p, pw, pb, dy, x, w, N, IC, OC); /* the products alone */
  td_linear_backward(NULL, gw, gb, dy, x, w, N, IC, OC); /* accumulated onto the initial values */
  td_gelu_backward(ref, pre, p, ni);                   /* gelu'(pre) P */
  td_gelu_backward(slope, pre, ones, ni);              /* gelu'(pre) */

  CHECK_OK(td_cuda_matmul_backward_ex(dgx, dgw, dgb, ddy, dx, dw, NULL, NULL, TD_CUDA_DINP_OVERWRITE, N, IC, OC, dt,
                                      NULL));
  expect_close("matmul backward dinp overwritten", dgx, p, ni, dt);
  double *tw = term_sums(gw, pw, nw, 1), *tb = term_sums(gb, pb, OC, 1); /* products and initial values */
  expect_accumulated("matmul backward dweight (dinp overwritten)", dgw, gw, tw, nw, dt);
  expect_accumulated("matmul backward dbias (dinp overwritten)", dgb, gb, tb, OC, dt);
  free(tw), free(tb);

  cudaFree(dgx);
  dgx = upload(nan_fill, ni, dt);
  CHECK_OK(td_cuda_matmul_backward_ex(dgx, NULL, NULL, ddy, dx, dw, dpre, NULL, TD_CUDA_DINP_OVERWRITE, N, IC, OC, dt,
                                      NULL));
  if (dt == TD_F32) {
    expect_close("matmul backward dinp with GELU's backward", dgx, ref, ni, dt);
  } else {
    const double c = 0.7978845608028654, a = 0.044715, tanh_err = 1.0 / 2048; /* sqrt(2/pi); 2^-11 */
    for (size_t i = 0; i < ni; i++) {
      double ax = fabs(pre[i]), dslope = tanh_err * (0.5 + ax * c * (1 + 3 * a * ax * ax));
      bound[i] = kBf16Unit * (fabs(slope[i]) * fabs(p[i]) + 2 * fabs(ref[i])) + dslope * fabs(p[i]);
    }
    expect_within("matmul backward dinp with GELU's backward", dgx, ref, bound, ni, dt);
  }
  /* the fold needs dinp and the overwrite, its bias gradient the fold;
   * unknown flags are refused */
  CHECK_STATUS(td_cuda_matmul_backward_ex(dgx, NULL, NULL, ddy, dx, dw, dpre, NULL, 0, N, IC, OC, dt, NULL),
               TD_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(td_cuda_matmul_backward_ex(NULL, dgw, NULL, ddy, dx, dw, dpre, NULL, TD_CUDA_DINP_OVERWRITE, N, IC, OC,
                                          dt, NULL),
               TD_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(td_cuda_matmul_backward_ex(dgx, NULL, NULL, ddy, dx, dw, NULL, dgb, TD_CUDA_DINP_OVERWRITE, N, IC, OC,
                                          dt, NULL),
               TD_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(td_cuda_matmul_backward_ex(dgx, NULL, NULL, ddy, dx, dw, NULL, NULL, 4, N, IC, OC, dt, NULL),
               TD_ERR_INVALID_ARGUMENT);
  cudaFree(dx), cudaFree(dw), cudaFree(ddy), cudaFree(dpre), cudaFree(dgx), cudaFree(dgw), cudaFree(dgb);
  free(x), free(w), free(dy), free(pre), free(gw), free(gb), free(nan_fill), free(ones);
  free(p), free(pw), free(pb), free(ref), free(slope), free(bound);
}

/* The bias gradients over 2 micro-batches (accumulated, as the trainer's
 * gradient accumulation needs): the GPT's fc2 backward shape, dinp =
 * gelu'(pre) (dout_m @ weight) overwritten each time, dweight and dbias +=
 * the weight-gradient product's and dout's column sums, dbias_gelu += dinp's
 * column sums (the bias gradient of the product that made pre), onto random
 * initial values, against the CPU's linear and GELU backward (the column
 * sums of the GELU-scaled product in double). Through cuBLASLt these come
 * from the BGRADB and DGELU_BGRAD epilogues, which write (not add) their
 * vector: a path that let them write into dbias keeps only the last
 * micro-batch and fails here. extra_flags TD_CUDA_DBIAS_COLUMN_SUM: the
 * column-sum kernel for both. Under the emulator, counts the bias gradients
 * the epilogues gave: 2 per call on the cuBLASLt path where they fit the
 * 256 KiB scratch, none with the flag, the tiled kernel or
 * TANDEM_CUDAEMU_LT_NO_BGRAD=1 (the fallback line), and no DGELU_BGRAD with
 * TANDEM_CUDAEMU_LT_NO_DGELU=1.
 * bf16 bound: each dinp element as test_matmul_overwrite's (the column sum
 * kernel reads the rounded dinp, the epilogue the f32 one), summed over the
 * rows, plus expect_accumulated's roundings of the sum. */
static void test_matmul_bias_grads(int N, int IC, int OC, td_dtype dt, int extra_flags) {
  const int micro = 2;
  size_t ni = (size_t)N * IC, no = (size_t)N * OC, nw = (size_t)OC * IC;
  float *x = rand_host(ni + 1, 1, dt), *w = rand_host(nw + 1, 1, dt), *pre = rand_host(ni + 1, 3, dt);
  float *gw = rand_host(nw + 1, 1, dt), *gb = rand_host(OC + 1, 1, dt), *gbg = rand_host(IC + 1, 1, dt);
  float *p = malloc((ni + 1) * 4), *r = malloc((ni + 1) * 4), *slope = calloc(ni + 1, 4), *ones = malloc((ni + 1) * 4);
  float *nan_fill = malloc((ni + 1) * 4);
  double *tw = calloc(nw + 1, sizeof(double)), *tb = calloc(OC + 1, sizeof(double)),
         *tbg = calloc(IC + 1, sizeof(double)), *sbg = calloc(IC + 1, sizeof(double));
  CHECK(p && r && slope && ones && nan_fill && tw && tb && tbg && sbg);
  for (size_t i = 0; i <= ni; i++) ones[i] = 1.0f, nan_fill[i] = NAN;
  td_gelu_backward(slope, pre, ones, ni); /* gelu'(pre) */
  for (size_t i = 0; i < nw; i++) tw[i] = fabs(gw[i]);
  for (int i = 0; i < OC; i++) tb[i] = fabs(gb[i]);
  for (int i = 0; i < IC; i++) tbg[i] = fabs(gbg[i]);
  void *dx = upload(x, ni, dt), *dw = upload(w, nw, dt), *dpre = upload(pre, ni, dt);
  void *dgw = upload(gw, nw, dt), *dgb = upload(gb, OC, dt), *dgbg = upload(gbg, IC, dt), *dgx = dev_f32(ni + 1);
  void *dnan = upload(nan_fill, ni, dt);
  const double c = 0.7978845608028654, a = 0.044715, tanh_err = 1.0 / 2048;
  long epilogues0 = td_cuda_matmul_bgrad_epilogues();
  for (int m = 0; m < micro; m++) {
    float *dy = rand_host(no + 1, 1, dt), *pw = calloc(nw + 1, 4), *pb = calloc(OC + 1, 4);
    CHECK(pw && pb);
    memset(p, 0, (ni + 1) * 4);
    memset(r, 0, (ni + 1) * 4);
    td_linear_backward(p, pw, pb, dy, x, w, N, IC, OC); /* this micro-batch's products */
    td_linear_backward(NULL, gw, gb, dy, x, w, N, IC, OC); /* the running sums */
    td_gelu_backward(r, pre, p, ni);                      /* dinp = gelu'(pre) P */
    for (size_t i = 0; i < nw; i++) tw[i] += fabs(pw[i]);
    for (int i = 0; i < OC; i++) tb[i] += fabs(pb[i]);
    for (int n = 0; n < N; n++)
      for (int i = 0; i < IC; i++) {
        size_t k = (size_t)n * IC + i;
        double ax = fabs(pre[k]), dslope = tanh_err * (0.5 + ax * c * (1 + 3 * a * ax * ax));
        sbg[i] += r[k];
        tbg[i] += fabs(slope[k]) * fabs(p[k]) + 2 * fabs(r[k]) + dslope * fabs(p[k]) / kBf16Unit;
      }
    void *ddy = upload(dy, no, dt);
    CHECK(cudaMemcpy(dgx, dnan, ni * esize(dt), cudaMemcpyDeviceToDevice) == cudaSuccess); /* a read shows */
    CHECK_OK(td_cuda_matmul_backward_ex(dgx, dgw, dgb, ddy, dx, dw, dpre, dgbg, TD_CUDA_DINP_OVERWRITE | extra_flags, N,
                                        IC, OC, dt, NULL));
    cudaFree(ddy);
    free(dy), free(pw), free(pb);
  }
  for (int i = 0; i < IC; i++) gbg[i] = (float)(gbg[i] + sbg[i]);
  expect_accumulated("matmul backward dweight (2 micro-batches)", dgw, gw, tw, nw, dt);
  expect_accumulated("matmul backward dbias (2 micro-batches)", dgb, gb, tb, OC, dt);
  expect_accumulated("matmul backward dbias of the GELU's input (2 micro-batches)", dgbg, gbg, tbg, IC, dt);
  long got = td_cuda_matmul_bgrad_epilogues() - epilogues0;
#ifdef TD_CUDA_EMU
  const char *no_bgrad = getenv("TANDEM_CUDAEMU_LT_NO_BGRAD");
  int lt = strcmp(td_cuda_matmul_backend(), "cublaslt") == 0 && !(no_bgrad && strcmp(no_bgrad, "1") == 0) &&
           !(extra_flags & TD_CUDA_DBIAS_COLUMN_SUM) && N > 0 && IC > 0 && OC > 0;
  const char *no_dgelu = getenv("TANDEM_CUDAEMU_LT_NO_DGELU"); /* no DGELU_BGRAD either */
  int dgelu = !(no_dgelu && strcmp(no_dgelu, "1") == 0);
  const size_t scratch = (size_t)256 << 10; /* matmul.cu's kBgradBytes */
  long want = lt ? micro * (((size_t)OC * esize(dt) <= scratch) + (dgelu && (size_t)IC * esize(dt) <= scratch)) : 0;
  if (got != want)
    td_test_fail(__FILE__, __LINE__, "matmul bias gradients N=%d IC=%d OC=%d %s flags %d: %ld from cuBLASLt's "
                 "epilogues, expected %ld", N, IC, OC, td_dtype_name(dt), extra_flags, got, want);
#else
  (void)got;
#endif
  cudaFree(dx), cudaFree(dw), cudaFree(dpre), cudaFree(dgw), cudaFree(dgb), cudaFree(dgbg), cudaFree(dgx), cudaFree(dnan);
  free(x), free(w), free(pre), free(gw), free(gb), free(gbg), free(p), free(r), free(slope), free(ones), free(nan_fill);
  free(tw), free(tb), free(tbg), free(sbg);
}

static void test_attention(int B, int T, int C, int NH, td_dtype dt) {
  size_t nin = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, natt = (size_t)B * NH * T * T;
  float *x = rand_host(nin, 1.5f, dt), *out = malloc(nout * 4), *att = malloc(natt * 4);
  td_attention_forward(out, att, x, B, T, C, NH);
  void *dx = upload(x, nin, dt), *dout = dev_f32(nout);
  float *datt = dev_f32(natt), *dscratch = dev_f32(natt);
  CHECK_OK(td_cuda_attention_forward(dout, datt, dx, B, T, C, NH, dt, NULL));
  expect_close("attention forward", dout, out, nout, dt);
  expect_close("attention weights", datt, att, natt, TD_F32);
  float *dy = rand_host(nout, 1, dt), *gx = rand_host(nin, 1, dt), *scratch = malloc((size_t)T * T * 4);
  void *ddy = upload(dy, nout, dt), *dgx = upload(gx, nin, dt);
  float *gx0 = malloc(nin * sizeof(float));
  memcpy(gx0, gx, nin * sizeof(float));
  td_attention_backward(gx, scratch, dy, x, att, B, T, C, NH);
  CHECK_OK(td_cuda_attention_backward(dgx, dscratch, ddy, dx, datt, B, T, C, NH, dt, NULL));
  expect_close("attention backward", dgx, gx, nin, dt);
  /* the fused kernels against the same references, the backward with the
   * flags TANDEM_CUDA_ATTENTION asks for (the one-pass line), its scratch
   * sized with the same; the forward with TANDEM_CUDA_ATTENTION_STORE's
   * (the direct-store line) */
  int att_flags = -1, fwd_flags = -1;
  CHECK_OK(td_cuda_attention_backward_flags(&att_flags));
  CHECK_OK(td_cuda_attention_forward_flags(&fwd_flags));
  float *dlse = dev_f32((size_t)B * NH * T);
  float *dD = dev_f32(td_cuda_flash_attention_backward_scratch_floats(B, T, C, NH, att_flags));
  void *dout2 = dev_f32(nout), *dgx2 = upload(gx0, nin, dt);
  /* out's rows past the last stored (out is (B, T, C)) stay NaN: a store
   * past a row's end or past row T - 1 shows */
  CHECK(cudaMemset(dout2, 0xff, nout * esize(dt)) == cudaSuccess);
  CHECK_OK(td_cuda_flash_attention_forward_ex(dout2, dlse, dx, B, T, C, NH, dt, fwd_flags, NULL));
  double *bout = NULL, *bin = NULL;
  if (dt == TD_BF16) {
    bout = malloc(sizeof(double) * nout);
    bin = malloc(sizeof(double) * nin);
    fused_bf16_bounds(bout, bin, x, att, out, dy, out, gx, B, T, C, NH);
    expect_within("fused attention forward", dout2, out, bout, nout, dt);
  } else {
    expect_close("fused attention forward", dout2, out, nout, dt);
  }
  float *lse = download(dlse, (size_t)B * NH * T, TD_F32);
  for (int r = 0; r < B * NH * T; r++) { /* lse = log sum_{t2 <= t} exp(q.k[t2] / sqrt(hs)), in double */
    int t = r % T, h = (r / T) % NH, b = r / (T * NH), hs = C / NH;
    const float *q = x + ((size_t)b * T + t) * 3 * C + (size_t)h * hs;
    double mx = -INFINITY, sum = 0, sc[1100];
    for (int t2 = 0; t2 <= t; t2++) {
      const float *k = x + ((size_t)b * T + t2) * 3 * C + C + (size_t)h * hs;
      double dot = 0;
      for (int d = 0; d < hs; d++) dot += (double)q[d] * k[d];
      sc[t2] = dot / sqrt((double)hs);
      mx = fmax(mx, sc[t2]);
    }
    for (int t2 = 0; t2 <= t; t2++) sum += exp(sc[t2] - mx);
    CHECK_CLOSE(lse[r], mx + log(sum), 1e-5, 1e-5);
  }
  CHECK_OK(td_cuda_flash_attention_backward_ex(dgx2, dD, ddy, dx, dout2, dlse, B, T, C, NH, dt, att_flags, NULL));
  if (dt == TD_BF16)
    expect_within("fused attention backward", dgx2, gx, bin, nin, dt);
  else
    expect_close("fused attention backward", dgx2, gx, nin, dt);
  free(bout), free(bin);
  /* deterministic: the same bits again */
  float *first = download(dgx2, nin, dt);
  cudaFree(dgx2);
  dgx2 = upload(gx0, nin, dt);
  CHECK_OK(td_cuda_flash_attention_backward_ex(dgx2, dD, ddy, dx, dout2, dlse, B, T, C, NH, dt, att_flags, NULL));
  float *second = download(dgx2, nin, dt);
  CHECK(memcmp(first, second, nin * sizeof(float)) == 0);
  /* TD_CUDA_DINP_OVERWRITE: the gradient alone, dinp never read (NaN there first) */
  float *grad = malloc(nin * sizeof(float));
  CHECK(grad != NULL);
  for (size_t i = 0; i < nin; i++) grad[i] = gx[i] - gx0[i];
  CHECK(cudaMemset(dgx2, 0xff, nin * esize(dt)) == cudaSuccess);
  CHECK_OK(td_cuda_flash_attention_backward_ex(dgx2, dD, ddy, dx, dout2, dlse, B, T, C, NH, dt,
                                               TD_CUDA_DINP_OVERWRITE | att_flags, NULL));
  if (dt == TD_BF16) {
    double *bo = malloc(sizeof(double) * nout), *bi = malloc(sizeof(double) * nin);
    CHECK(bo != NULL && bi != NULL);
    fused_bf16_bounds(bo, bi, x, att, out, dy, out, grad, B, T, C, NH);
    expect_within("fused attention backward (overwrite)", dgx2, grad, bi, nin, dt);
    free(bo), free(bi);
  } else {
    expect_close("fused attention backward (overwrite)", dgx2, grad, nin, dt);
  }
  CHECK_STATUS(td_cuda_flash_attention_backward_ex(dgx2, dD, ddy, dx, dout2, dlse, B, T, C, NH, dt,
                                                   TD_CUDA_DBIAS_COLUMN_SUM, NULL),
               TD_ERR_INVALID_ARGUMENT); /* a matmul flag */
  free(grad);
  cudaFree(dlse), cudaFree(dD), cudaFree(dout2), cudaFree(dgx2);
  free(lse), free(first), free(second), free(gx0);
  cudaFree(dx), cudaFree(dout), cudaFree(datt), cudaFree(dscratch), cudaFree(ddy), cudaFree(dgx);
  free(x), free(out), free(att), free(dy), free(gx), free(scratch);
}

static void test_softmax_xent(int N, int V, td_dtype dt) {
  size_t n = (size_t)N * V;
  float *logits = rand_host(n, 4, dt), *probs = malloc(n * 4), *dlogits = calloc(n, 4);
  int32_t *tgt = malloc(sizeof(int32_t) * N);
  for (int i = 0; i < N; i++) tgt[i] = (i * 13 + 5) % V;
  float dloss = 1.7f;
  float mean_loss = td_softmax_xent_forward(probs, logits, tgt, N, V);
  td_softmax_xent_backward(dlogits, probs, tgt, dloss, N, V);
  void *dlog = upload(logits, n, dt);
  float *dlosses = dev_f32(N);
  int32_t *dtgt;
  CHECK(cudaMalloc((void **)&dtgt, sizeof(int32_t) * N) == cudaSuccess);
  CHECK(cudaMemcpy(dtgt, tgt, sizeof(int32_t) * N, cudaMemcpyHostToDevice) == cudaSuccess);
  CHECK_OK(td_cuda_softmax_xent(dlosses, dlog, dtgt, dloss, N, V, dt, NULL));
  float *losses = download(dlosses, N, TD_F32);
  double sum = 0;
  for (int i = 0; i < N; i++) sum += losses[i];
  CHECK_CLOSE(sum / N, mean_loss, 1e-5, 0);
  expect_close("softmax xent dlogits", dlog, dlogits, n, dt);
  /* a target outside [0, V): NaN loss, zero gradient row */
  tgt[0] = V;
  CHECK(cudaMemcpy(dtgt, tgt, sizeof(int32_t) * N, cudaMemcpyHostToDevice) == cudaSuccess);
  void *dlog2 = upload(logits, n, dt);
  CHECK_OK(td_cuda_softmax_xent(dlosses, dlog2, dtgt, dloss, N, V, dt, NULL));
  float *l2 = download(dlosses, N, TD_F32), *g2 = download(dlog2, V, dt);
  CHECK(isnan(l2[0]));
  for (int v = 0; v < V; v++) CHECK(g2[v] == 0.0f);
  cudaFree(dlog), cudaFree(dlog2), cudaFree(dlosses), cudaFree(dtgt);
  free(logits), free(probs), free(dlogits), free(tgt), free(losses), free(l2), free(g2);
}

static void test_adamw(size_t n, td_dtype grad_dt) {
  float *p = rand_host(n, 1, TD_F32), *g = rand_host(n, 1, grad_dt), *m = rand_host(n, 0.1f, TD_F32);
  float *v = malloc(n * 4 + 4);
  for (size_t i = 0; i < n; i++) v[i] = fabsf(m[i]) * 0.3f;
  const float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
  const long t = 3;
  float *dp = upload(p, n, TD_F32), *dm = upload(m, n, TD_F32), *dv = upload(v, n, TD_F32);
  void *dg = upload(g, n, grad_dt), *dcopy;
  CHECK(cudaMalloc(&dcopy, n * 2 + 2) == cudaSuccess);
  CHECK_OK(td_cuda_adamw(dp, dcopy, TD_BF16, dg, grad_dt, dm, dv, n, lr, b1, b2, eps, wd, t, gs, NULL));
  float *rp = malloc(n * 4 + 4), *rm = malloc(n * 4 + 4), *rv = malloc(n * 4 + 4);
  for (size_t i = 0; i < n; i++) { /* in double: the closed form */
    double gi = (double)g[i] * gs;
    double mi = b1 * (double)m[i] + (1 - b1) * gi, vi = b2 * (double)v[i] + (1 - b2) * gi * gi;
    double mh = mi / (1 - pow(b1, t)), vh = vi / (1 - pow(b2, t));
    rp[i] = (float)(p[i] - lr * (mh / (sqrt(vh) + eps) + wd * p[i]));
    rm[i] = (float)mi;
    rv[i] = (float)vi;
  }
  expect_close("adamw params", dp, rp, n, TD_F32);
  expect_close("adamw m", dm, rm, n, TD_F32);
  expect_close("adamw v", dv, rv, n, TD_F32);
  /* the bf16 copy is exactly the new master rounded to nearest even */
  float *master = download(dp, n, TD_F32);
  uint16_t *copy = malloc(n * 2 + 2);
  CHECK(cudaMemcpy(copy, dcopy, n * 2, cudaMemcpyDeviceToHost) == cudaSuccess);
  for (size_t i = 0; i < n; i++) CHECK_EQ_INT(copy[i], ref_bf16_bits(master[i]));
  CHECK_STATUS(td_cuda_adamw(dp, NULL, TD_F32, dg, grad_dt, dm, dv, n, lr, b1, b2, eps, wd, 0, gs, NULL),
               TD_ERR_INVALID_ARGUMENT);
  cudaFree(dp), cudaFree(dm), cudaFree(dv), cudaFree(dg), cudaFree(dcopy);
  free(p), free(g), free(m), free(v), free(rp), free(rm), free(rv), free(master), free(copy);
}

static void test_norm_scale_cast(size_t n, td_dtype dt) {
  float *x = rand_host(n, 2, dt);
  void *dx = upload(x, n, dt);
  float *dout = dev_f32(1), *dpart = dev_f32(TD_CUDA_NORM_PARTIALS);
  CHECK_OK(td_cuda_global_norm_squared(dout, dpart, dx, n, dt, NULL));
  float *got = download(dout, 1, TD_F32);
  double ref = 0;
  for (size_t i = 0; i < n; i++) ref += (double)x[i] * x[i];
  CHECK_CLOSE(got[0], ref, 1e-5, 1e-30);
  CHECK_OK(td_cuda_global_norm_squared(dout, dpart, dx, n, dt, NULL));
  float *again = download(dout, 1, TD_F32);
  CHECK(memcmp(got, again, 4) == 0); /* the same bits */
  /* from the second element: a start off the 16-byte grid (the head) */
  if (n > 1) {
    CHECK_OK(td_cuda_global_norm_squared(dout, dpart, (char *)dx + esize(dt), n - 1, dt, NULL));
    float *off = download(dout, 1, TD_F32);
    CHECK_CLOSE(off[0], ref - (double)x[0] * x[0], 1e-5, 1e-30);
    free(off);
  }
  /* scale, then cast to the other type and back */
  float *scaled = malloc(n * 4 + 4);
  for (size_t i = 0; i < n; i++) scaled[i] = dt == TD_BF16 ? ref_bf16_value(x[i] * 0.37f) : x[i] * 0.37f;
  CHECK_OK(td_cuda_scale(dx, n, 0.37f, dt, NULL));
  expect_close("scale", dx, scaled, n, dt);
  td_dtype other = dt == TD_F32 ? TD_BF16 : TD_F32;
  void *dy;
  CHECK(cudaMalloc(&dy, n * 4 + 4) == cudaSuccess);
  CHECK_OK(td_cuda_cast(dy, other, dx, dt, n, NULL));
  float *cast = download(dy, n, other);
  for (size_t i = 0; i < n; i++) {
    float want = other == TD_BF16 ? ref_bf16_value(scaled[i]) : scaled[i];
    if (cast[i] != want) td_test_fail(__FILE__, __LINE__, "cast element %zu: %.9g != %.9g", i, cast[i], want);
  }
  CHECK_STATUS(td_cuda_cast(dy, TD_F16, dx, dt, n, NULL), TD_ERR_INVALID_ARGUMENT);
  cudaFree(dx), cudaFree(dout), cudaFree(dpart), cudaFree(dy);
  free(x), free(got), free(again), free(scaled), free(cast);
}

static void test_bad_arguments(void) {
  CHECK_STATUS(td_cuda_gelu_forward(NULL, NULL, 4, TD_F16, NULL), TD_ERR_INVALID_ARGUMENT);
  CHECK(strstr(td_last_error(), "f16") != NULL);
  CHECK_STATUS(td_cuda_attention_forward(NULL, NULL, NULL, 1, 4, 10, 3, TD_F32, NULL), TD_ERR_INVALID_ARGUMENT);
  CHECK(strstr(td_last_error(), "multiple of NH") != NULL);
  CHECK_STATUS(td_cuda_layernorm_forward(NULL, NULL, NULL, NULL, NULL, NULL, 4, 0, TD_F32, NULL),
               TD_ERR_INVALID_ARGUMENT);
  /* the attention path choice: TANDEM_CUDA_ATTENTION and the head size */
  int fused = -1;
  unsetenv("TANDEM_CUDA_ATTENTION");
  CHECK_OK(td_cuda_attention_fused(64, &fused));
  CHECK_EQ_INT(fused, 1);
  CHECK_OK(td_cuda_attention_fused(12, &fused));
  CHECK_EQ_INT(fused, 0);
  CHECK_OK(td_cuda_attention_fused(128, &fused)); /* LLaMA-style heads take the fused kernels */
  CHECK_EQ_INT(fused, 1);
  setenv("TANDEM_CUDA_ATTENTION", "unfused", 1);
  CHECK_OK(td_cuda_attention_fused(64, &fused));
  CHECK_EQ_INT(fused, 0);
  setenv("TANDEM_CUDA_ATTENTION", "fused", 1);
  CHECK_STATUS(td_cuda_attention_fused(12, &fused), TD_ERR_INVALID_ARGUMENT);
  CHECK(strstr(td_last_error(), "not 12") != NULL);
  CHECK_OK(td_cuda_attention_fused(128, &fused));
  CHECK_EQ_INT(fused, 1);
  CHECK_STATUS(td_cuda_attention_fused(96, &fused), TD_ERR_INVALID_ARGUMENT);
  CHECK(strstr(td_last_error(), "64, 128, not 96") != NULL);
  /* the backward's flags: the one-pass backward on request, read here only
   * (the launchers and the scratch size take the flag) */
  int flags = -1;
  unsetenv("TANDEM_CUDA_ATTENTION");
  CHECK_OK(td_cuda_attention_backward_flags(&flags));
  CHECK_EQ_INT(flags, 0);
  CHECK(td_cuda_flash_attention_backward_scratch_floats(2, 64, 128, 2, 0) == 2 * 2 * 64);
  CHECK(td_cuda_flash_attention_backward_scratch_floats(2, 64, 128, 2, TD_CUDA_ATTENTION_ONEPASS) > 2 * 2 * 64);
  setenv("TANDEM_CUDA_ATTENTION", "onepass", 1);
  CHECK_OK(td_cuda_attention_backward_flags(&flags));
  CHECK_EQ_INT(flags, TD_CUDA_ATTENTION_ONEPASS);
  CHECK_OK(td_cuda_attention_fused(64, &fused));
  CHECK_EQ_INT(fused, 1);
  /* the scratch size does not follow the environment: it takes the flags */
  CHECK(td_cuda_flash_attention_backward_scratch_floats(2, 64, 128, 2, 0) == 2 * 2 * 64);
  /* the wmma kernels are gone: refused, saying so */
  setenv("TANDEM_CUDA_ATTENTION", "wmma", 1);
  CHECK_STATUS(td_cuda_attention_fused(64, &fused), TD_ERR_INVALID_ARGUMENT);
  CHECK(strstr(td_last_error(), "removed") != NULL);
  CHECK_STATUS(td_cuda_attention_backward_flags(&flags), TD_ERR_INVALID_ARGUMENT);
  setenv("TANDEM_CUDA_ATTENTION", "flash", 1);
  CHECK_STATUS(td_cuda_attention_fused(64, &fused), TD_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(td_cuda_attention_backward_flags(&flags), TD_ERR_INVALID_ARGUMENT);
  unsetenv("TANDEM_CUDA_ATTENTION");
  CHECK_STATUS(td_cuda_flash_attention_forward(NULL, NULL, NULL, 1, 4, 36, 3, TD_F32, NULL), TD_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(td_cuda_flash_attention_forward(NULL, NULL, NULL, 1, 4, 192, 1, TD_BF16, NULL),
               TD_ERR_INVALID_ARGUMENT);
  CHECK(strstr(td_last_error(), "head size 192") != NULL);
  /* the one-pass backward's dQ parts only where it runs (not at 128) */
  CHECK(td_cuda_flash_attention_backward_scratch_floats(2, 64, 256, 2, TD_CUDA_ATTENTION_ONEPASS) == 2 * 2 * 64);
  /* the forward's store: TANDEM_CUDA_ATTENTION_STORE, read here only */
  const char *store_env = getenv("TANDEM_CUDA_ATTENTION_STORE");
  char *store_saved = store_env ? strdup(store_env) : NULL;
  unsetenv("TANDEM_CUDA_ATTENTION_STORE");
  CHECK_OK(td_cuda_attention_forward_flags(&flags));
  CHECK_EQ_INT(flags, 0);
  setenv("TANDEM_CUDA_ATTENTION_STORE", "staged", 1);
  CHECK_OK(td_cuda_attention_forward_flags(&flags));
  CHECK_EQ_INT(flags, 0);
  setenv("TANDEM_CUDA_ATTENTION_STORE", "direct", 1);
  CHECK_OK(td_cuda_attention_forward_flags(&flags));
  CHECK_EQ_INT(flags, TD_CUDA_ATTENTION_DIRECT_STORE);
  setenv("TANDEM_CUDA_ATTENTION_STORE", "vector", 1);
  CHECK_STATUS(td_cuda_attention_forward_flags(&flags), TD_ERR_INVALID_ARGUMENT);
  CHECK(strstr(td_last_error(), "staged") != NULL && strstr(td_last_error(), "direct") != NULL);
  if (store_saved)
    setenv("TANDEM_CUDA_ATTENTION_STORE", store_saved, 1);
  else
    unsetenv("TANDEM_CUDA_ATTENTION_STORE");
  free(store_saved);
  CHECK_STATUS(td_cuda_flash_attention_forward_ex(NULL, NULL, NULL, 1, 4, 256, 2, TD_BF16, TD_CUDA_ATTENTION_ONEPASS,
                                                  NULL),
               TD_ERR_INVALID_ARGUMENT);
  /* empty shapes launch nothing and succeed */
  CHECK_OK(td_cuda_matmul_forward(NULL, NULL, NULL, NULL, 0, 8, 8, TD_F32, NULL));
  CHECK_OK(td_cuda_encoder_forward(NULL, NULL, NULL, NULL, 0, 5, 8, TD_BF16, NULL));
}


/* ---- --bench: per-kernel time at a model shape, for scripts/gpu-check ----
 * Each launcher runs WARMUP times, then ITERS times between two events; the
 * table gives the mean time, the bytes it must move at least (each operand
 * read once, each output written once; gradients that accumulate read and
 * written) as GB/s, and its products as TFLOP/s, next to the GPU's memory
 * bandwidth (bench_hbm_gbs: from its name) and the H100/H200's compute
 * bounds (989 TFLOP/s dense bf16 tensor cores, 67 f32 CUDA cores). Not a
 * test: it checks only that the launchers succeed. */
typedef struct bench_shape {
  const char *name;
  int B, T, C, NH, V;
  int layers; /* for the optimizer rows' parameter count */
  int iters;
} bench_shape;

/* The memory bandwidth bound (GB/s) of the "of BW" column, from the GPU's
 * name (NVIDIA's datasheets): H200 4.8 TB/s, H100 SXM 3.35, H100 PCIe / NVL
 * 2.0 / 3.9, A100 80GB 2.039 (40GB 1.555); any other GPU: the H100 SXM's, said
 * so in *label. bench/torch_kernels.py's hbm_gbs is the same table. */
static double bench_hbm_gbs(const char *name, const char **label) {
  static const struct { const char *part, *also; double gbs; const char *label; } known[] = {
      {"H200", NULL, 4800.0, "H200: 4.8 TB/s"},         {"H100", "PCIe", 2000.0, "H100 PCIe: 2.0 TB/s"},
      {"H100", "NVL", 3900.0, "H100 NVL: 3.9 TB/s"},    {"H100", NULL, 3350.0, "H100 SXM: 3.35 TB/s"},
      {"A100", "80GB", 2039.0, "A100 80GB: 2.039 TB/s"}, {"A100", NULL, 1555.0, "A100 40GB: 1.555 TB/s"},
  };
  for (size_t i = 0; i < sizeof known / sizeof *known; i++)
    if (strstr(name, known[i].part) && (!known[i].also || strstr(name, known[i].also))) {
      *label = known[i].label;
      return known[i].gbs;
    }
  *label = "not a GPU this table knows: the H100 SXM's 3.35 TB/s";
  return 3350.0;
}

static double bench_time_us(cudaEvent_t e0, cudaEvent_t e1, int iters) {
  float ms = 0;
  CHECK(cudaEventSynchronize(e1) == cudaSuccess);
  CHECK(cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess);
  return ms * 1000.0 / iters;
}

#define BENCH(label, bytes, flops, call)                                                                    \
  do {                                                                                                      \
    for (int w_ = 0; w_ < 2; w_++) CHECK_OK(call);                                                          \
    CHECK(cudaEventRecord(e0, NULL) == cudaSuccess);                                                        \
    for (int i_ = 0; i_ < sh->iters; i_++) CHECK_OK(call);                                                  \
    CHECK(cudaEventRecord(e1, NULL) == cudaSuccess);                                                        \
    double us_ = bench_time_us(e0, e1, sh->iters), gbs_ = (double)(bytes) / us_ / 1e3,                      \
           tf_ = (double)(flops) / us_ / 1e6;                                                               \
    double bw_pct_ = 100.0 * gbs_ / hbm_gbs, fl_pct_ = 100.0 * tf_ / (dt == TD_BF16 ? 989.0 : 67.0);          \
    printf("| %-30s | %-4s | %10.1f | %8.1f | %5.1f%% | %8.2f | %5.1f%% |\n", label, td_dtype_name(dt), us_,    \
           gbs_, bw_pct_, tf_, fl_pct_);                                                                    \
  } while (0)

static void *dev_fill(size_t n, td_dtype dt, float scale) {
  /* random values made on the host in chunks (a GPT-2 sized tensor at once
   * would double the host memory); tensors over 16M elements (the logits,
   * wte, the optimizer's arrays) are zeros instead: making 10^9 random
   * numbers on the host would take longer than the benchmark, and no kernel
   * here runs faster on zeros (no data-dependent branches; zero is normal) */
  void *d = NULL;
  size_t es = esize(dt), chunk = (size_t)1 << 20;
  CHECK(cudaMalloc(&d, (n ? n : 1) * es) == cudaSuccess);
  if (n > ((size_t)16 << 20)) {
    CHECK(cudaMemset(d, 0, n * es) == cudaSuccess);
    return d;
  }
  for (size_t off = 0; off < n; off += chunk) {
    size_t len = n - off < chunk ? n - off : chunk;
    float *h = rand_host(len, scale, dt);
    void *tmp = upload(h, len, dt);
    CHECK(cudaMemcpy((char *)d + off * es, tmp, len * es, cudaMemcpyDeviceToDevice) == cudaSuccess);
    cudaFree(tmp);
    free(h);
  }
  return d;
}

static void run_bench(const bench_shape *sh, td_dtype dt) {
  const int B = sh->B, T = sh->T, C = sh->C, NH = sh->NH, V = sh->V;
  const size_t N = (size_t)B * T, es = esize(dt);
  const double nc = (double)N * C;
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess);
  int32_t *tok = malloc(N * sizeof(int32_t)), *dtok;
  for (size_t i = 0; i < N; i++) tok[i] = (int32_t)((i * 7919) % (size_t)V);
  CHECK(cudaMalloc((void **)&dtok, N * sizeof(int32_t)) == cudaSuccess);
  CHECK(cudaMemcpy(dtok, tok, N * sizeof(int32_t), cudaMemcpyHostToDevice) == cudaSuccess);
  int32_t *dorder, *dstarts; /* the encoder's buckets (made on the host in a step: not timed here) */
  int nb = upload_buckets(tok, (int)N, V, &dorder, &dstarts);
  /* text-like tokens: 96 of them, skewed (u^3 of a uniform u), as byte-level
   * text gives: a few buckets thousands of rows long */
  int32_t *tok2 = malloc(N * sizeof(int32_t)), *dorder2, *dstarts2;
  for (size_t i = 0; i < N; i++) {
    double u = (double)((i * 2654435761u) % 65536) / 65536.0;
    tok2[i] = (int32_t)(96 * u * u * u) % V;
  }
  int nb2 = upload_buckets(tok2, (int)N, V, &dorder2, &dstarts2);
  int32_t *dtok2;
  CHECK(cudaMalloc((void **)&dtok2, N * sizeof(int32_t)) == cudaSuccess);
  CHECK(cudaMemcpy(dtok2, tok2, N * sizeof(int32_t), cudaMemcpyHostToDevice) == cudaSuccess);
  void *wte = dev_fill((size_t)V * C, dt, 0.1f), *wpe = dev_fill((size_t)T * C, dt, 0.1f);
  void *x = dev_fill(N * C, dt, 1), *y = dev_fill(N * C, dt, 1), *g = dev_fill(N * C, dt, 1);
  void *x4 = dev_fill(N * 4 * C, dt, 1), *y4 = dev_fill(N * 4 * C, dt, 1), *g4 = dev_fill(N * 4 * C, dt, 1);
  void *qkv = dev_fill(N * 3 * C, dt, 1), *dqkv = dev_fill(N * 3 * C, dt, 1);
  void *w = dev_fill((size_t)4 * C * C, dt, 0.05f), *dw = dev_fill((size_t)4 * C * C, dt, 0.05f);
  void *bias = dev_fill((size_t)4 * C, dt, 0.1f), *dbias = dev_fill((size_t)4 * C, dt, 0.1f);
  void *gw = dev_fill((size_t)V * C, dt, 0.1f);
  float *mean = dev_f32(N), *rstd = dev_f32(N), *lse = dev_f32((size_t)B * NH * T);
  /* the scratch for every backward below, the one-pass A/B row's included
   * (sized for TD_CUDA_ATTENTION_ONEPASS: its dQ parts) */
  float *Dscr = dev_f32(td_cuda_flash_attention_backward_scratch_floats(B, T, C, NH, TD_CUDA_ATTENTION_ONEPASS));
  void *logits = dev_fill(N * (size_t)V, dt, 1);
  float *losses = dev_f32(N);
  struct cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0) == cudaSuccess);
  const char *bw_label;
  const double hbm_gbs = bench_hbm_gbs(prop.name, &bw_label);
  printf("\n%s shape: B=%d T=%d C=%d NH=%d V=%d, %s, mean of %d runs after 2 warm-up runs (matmul: %s)\n",
         sh->name, B, T, C, NH, V, td_dtype_name(dt), sh->iters, td_cuda_matmul_backend());
  printf("GPU %s; \"of BW\" against %s\n", prop.name, bw_label);
  printf("| %-30s | %-4s | %10s | %8s | %6s | %8s | %6s |\n", "kernel", "type", "time (us)", "GB/s", "of BW",
         "TFLOP/s", "of peak");
  printf("|---|---|---|---|---|---|---|\n");
  BENCH("encoder forward", nc * es * 3, 0, td_cuda_encoder_forward(x, dtok, wte, wpe, B, T, C, dt, NULL));
  BENCH("encoder backward", nc * es * 3 + (double)T * C * es, 0,
        td_cuda_encoder_backward(gw, wpe, g, dtok, dorder, dstarts, nb, B, T, C, dt, NULL));
  BENCH("encoder backward (96 skewed tokens)", nc * es * 3 + (double)T * C * es, 0,
        td_cuda_encoder_backward(gw, wpe, g, dtok2, dorder2, dstarts2, nb2, B, T, C, dt, NULL));
  BENCH("layernorm forward", nc * es * 2, 0, td_cuda_layernorm_forward(y, mean, rstd, x, w, bias, (int)N, C, dt, NULL));
  BENCH("residual+layernorm forward", nc * es * 4, 0,
        td_cuda_residual_layernorm_forward(g, y, mean, rstd, x, x, w, bias, (int)N, C, dt, NULL));
  float *ln_scr = dev_f32(td_cuda_layernorm_backward_scratch_floats((int)N, C));
  BENCH("layernorm backward", nc * es * 4, 0,
        td_cuda_layernorm_backward(g, dw, dbias, ln_scr, y, x, w, mean, rstd, (int)N, C, dt, NULL));
  cudaFree(ln_scr);
  BENCH("residual forward", nc * es * 3, 0, td_cuda_residual_forward(y, x, g, N * C, dt, NULL));
  BENCH("gelu forward", nc * 4 * es * 2, 0, td_cuda_gelu_forward(y4, x4, N * 4 * C, dt, NULL));
  BENCH("gelu backward", nc * 4 * es * 4, 0, td_cuda_gelu_backward(g4, x4, y4, N * 4 * C, dt, NULL));
  BENCH("matmul fwd qkv (C->3C)", (nc * 4 + 3.0 * C * C) * es, 2.0 * nc * 3 * C,
        td_cuda_matmul_forward(qkv, x, w, bias, (int)N, C, 3 * C, dt, NULL));
  BENCH("matmul fwd fc (C->4C)", (nc * 5 + 4.0 * C * C) * es, 2.0 * nc * 4 * C,
        td_cuda_matmul_forward(x4, x, w, bias, (int)N, C, 4 * C, dt, NULL));
  BENCH("matmul fwd fc + GELU", (nc * 9 + 4.0 * C * C) * es, 2.0 * nc * 4 * C,
        td_cuda_matmul_forward_ex(x4, y4, NULL, x, w, bias, (int)N, C, 4 * C, dt, NULL));
  BENCH("matmul fwd proj (4C->C)", (nc * 5 + 4.0 * C * C) * es, 2.0 * nc * 4 * C,
        td_cuda_matmul_forward(y, x4, w, bias, (int)N, 4 * C, C, dt, NULL));
  BENCH("matmul fwd proj + residual", (nc * 6 + 4.0 * C * C) * es, 2.0 * nc * 4 * C,
        td_cuda_matmul_forward_ex(y, NULL, g, x4, w, bias, (int)N, 4 * C, C, dt, NULL));
  BENCH("matmul bwd fc (C->4C)", (nc * 4 * 2 + nc * 2 + 8.0 * C * C) * es, 4.0 * nc * 4 * C,
        td_cuda_matmul_backward(g, dw, dbias, g4, x, w, (int)N, C, 4 * C, dt, NULL));
  /* A/B: the same call with dbias from the column-sum kernel (the row above
   * takes it from the weight-gradient product's BGRADB epilogue where
   * cuBLASLt has one), then the weight-gradient product and dbias alone */
  BENCH("matmul bwd fc (col-sum dbias)", (nc * 4 * 2 + nc * 2 + 8.0 * C * C) * es, 4.0 * nc * 4 * C,
        td_cuda_matmul_backward_ex(g, dw, dbias, g4, x, w, NULL, NULL, TD_CUDA_DBIAS_COLUMN_SUM, (int)N, C, 4 * C, dt,
                                   NULL));
  BENCH("matmul dW+dbias fc, epilogue", (nc * 4 + nc + 8.0 * C * C) * es, 2.0 * nc * 4 * C,
        td_cuda_matmul_backward(NULL, dw, dbias, g4, x, w, (int)N, C, 4 * C, dt, NULL));
  BENCH("matmul dW+dbias fc, column sum", (nc * 4 * 2 + nc + 8.0 * C * C) * es, 2.0 * nc * 4 * C,
        td_cuda_matmul_backward_ex(NULL, dw, dbias, g4, x, w, NULL, NULL, TD_CUDA_DBIAS_COLUMN_SUM, (int)N, C, 4 * C,
                                   dt, NULL));
  /* the GPT's fc2 input gradient with GELU's backward folded in (written, not
   * accumulated): it replaces fc2's dinp product plus the gelu backward row */
  BENCH("matmul dinp fc2 + dGELU", (nc * 9 + 4.0 * C * C) * es, 2.0 * nc * 4 * C,
        td_cuda_matmul_backward_ex(y4, NULL, NULL, g, NULL, w, x4, NULL, TD_CUDA_DINP_OVERWRITE, (int)N, 4 * C, C, dt,
                                   NULL));
  /* and with fc's bias gradient (dinp's column sums) from the DGELU_BGRAD
   * epilogue, against the column-sum kernel after it (the A/B) */
  BENCH("matmul dinp fc2+dGELU+dbias", (nc * 9 + 4.0 * C * C) * es, 2.0 * nc * 4 * C,
        td_cuda_matmul_backward_ex(y4, NULL, NULL, g, NULL, w, x4, dbias, TD_CUDA_DINP_OVERWRITE, (int)N, 4 * C, C, dt,
                                   NULL));
  BENCH("matmul dinp fc2+dGELU, col-sum", (nc * 13 + 4.0 * C * C) * es, 2.0 * nc * 4 * C,
        td_cuda_matmul_backward_ex(y4, NULL, NULL, g, NULL, w, x4, dbias,
                                   TD_CUDA_DINP_OVERWRITE | TD_CUDA_DBIAS_COLUMN_SUM, (int)N, 4 * C, C, dt, NULL));
  /* whether the epilogue rows above had their epilogues (a heuristic without
   * an algorithm for them takes the column sums: the A/B is then void) */
  printf("cuBLASLt bias-gradient epilogues (%s): %ld so far\n", td_dtype_name(dt), td_cuda_matmul_bgrad_epilogues());
  BENCH("matmul fwd lm head (C->V)", (nc + (double)N * V + (double)V * C) * es, 2.0 * nc * V,
        td_cuda_matmul_forward(logits, x, wte, NULL, (int)N, C, V, dt, NULL));
  BENCH("matmul bwd lm head (C->V)", (nc * 2 + (double)N * V + 2.0 * V * C) * es, 4.0 * nc * V,
        td_cuda_matmul_backward(g, gw, NULL, logits, x, wte, (int)N, C, V, dt, NULL));
  BENCH("softmax xent (in place)", (double)N * V * es * 2, 0,
        td_cuda_softmax_xent(losses, logits, dtok, 1.0f, (int)N, V, dt, NULL));
  double att_flops = 4.0 * B * NH * (double)T * T * (C / NH) / 2; /* causal: half of QK^T and PV */
  BENCH("flash attention forward", (N * 3 * C + nc) * es, att_flops,
        td_cuda_flash_attention_forward(y, lse, qkv, B, T, C, NH, dt, NULL));
  BENCH("flash attention backward", (N * 3 * C * 3 + nc * 2) * es, 2.5 * att_flops,
        td_cuda_flash_attention_backward(dqkv, Dscr, g, qkv, y, lse, B, T, C, NH, dt, NULL));
  if (dt == TD_BF16) { /* A/B: FlashAttention-2's backward in one pass (dQ's parts stored, then summed) */
    BENCH("flash attention backward (one-pass)", (N * 3 * C * 3 + nc * 2) * es, 2.5 * att_flops,
          td_cuda_flash_attention_backward_ex(dqkv, Dscr, g, qkv, y, lse, B, T, C, NH, dt, TD_CUDA_ATTENTION_ONEPASS,
                                              NULL));
    /* A/B: the forward's output stored from the registers, 4 bytes a lane
     * (the kernel before the staged 16-byte rows, TANDEM_CUDA_ATTENTION_STORE=direct) */
    BENCH("flash attention forward (direct store)", (N * 3 * C + nc) * es, att_flops,
          td_cuda_flash_attention_forward_ex(y, lse, qkv, B, T, C, NH, dt, TD_CUDA_ATTENTION_DIRECT_STORE, NULL));
    /* LLaMA-style heads of 128 at the same C (NH / 2 of them: the same
     * products' flops); 64 divides C for every bench shape with C % 128 == 0 */
    if (C % 128 == 0) {
      const int NH128 = C / 128;
      BENCH("flash attention forward hs128", (N * 3 * C + nc) * es, att_flops,
            td_cuda_flash_attention_forward(y, lse, qkv, B, T, C, NH128, dt, NULL));
      BENCH("flash attention forward hs128 (direct store)", (N * 3 * C + nc) * es, att_flops,
            td_cuda_flash_attention_forward_ex(y, lse, qkv, B, T, C, NH128, dt, TD_CUDA_ATTENTION_DIRECT_STORE, NULL));
      BENCH("flash attention backward hs128", (N * 3 * C * 3 + nc * 2) * es, 2.5 * att_flops,
            td_cuda_flash_attention_backward(dqkv, Dscr, g, qkv, y, lse, B, T, C, NH128, dt, NULL));
    }
  }
  size_t natt = (size_t)B * NH * T * T;
  float *att = NULL, *scr = NULL;
  if (cudaMalloc((void **)&att, natt * 4) == cudaSuccess && cudaMalloc((void **)&scr, natt * 4) == cudaSuccess) {
    BENCH("attention forward (unfused)", (N * 3 * C + nc) * es + natt * 4.0, att_flops,
          td_cuda_attention_forward(y, att, qkv, B, T, C, NH, dt, NULL));
    BENCH("attention backward (unfused)", (N * 3 * C * 3 + nc) * es + natt * 8.0, 2.5 * att_flops,
          td_cuda_attention_backward(dqkv, scr, g, qkv, att, B, T, C, NH, dt, NULL));
  } else {
    (void)cudaGetLastError();
    printf("| attention (unfused)          | %-4s | skipped: no memory for (B, NH, T, T) |\n", td_dtype_name(dt));
  }
  cudaFree(att), cudaFree(scr);
  /* the optimizer over the model's parameters (12 C^2 per layer, the embeddings) */
  size_t np = (size_t)V * C + (size_t)T * C + (size_t)sh->layers * 12 * C * C;
  float *master = dev_fill(np, TD_F32, 0.1f), *m = dev_fill(np, TD_F32, 0.01f), *v = dev_fill(np, TD_F32, 0.01f);
  CHECK(cudaMemset(v, 0, np * 4) == cudaSuccess);
  void *grads = dev_fill(np, dt, 0.01f), *copy = NULL;
  CHECK(cudaMalloc(&copy, np * 2) == cudaSuccess);
  float *norm = dev_f32(1), *parts = dev_f32(TD_CUDA_NORM_PARTIALS);
  BENCH("adamw (f32 master + bf16 copy)", np * (24.0 + es + 2), np * 12.0,
        td_cuda_adamw(master, copy, TD_BF16, grads, dt, m, v, np, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 1.0f, NULL));
  BENCH("global norm squared", (double)np * es, np * 2.0, td_cuda_global_norm_squared(norm, parts, grads, np, dt, NULL));
  printf("(%zu parameters in the optimizer rows)\n", np);
  cudaFree(master), cudaFree(m), cudaFree(v), cudaFree(grads), cudaFree(copy), cudaFree(norm), cudaFree(parts);
  cudaFree(dtok2), cudaFree(dorder2), cudaFree(dstarts2), free(tok2);
  cudaFree(dtok), cudaFree(dorder), cudaFree(dstarts), cudaFree(wte), cudaFree(wpe), cudaFree(x), cudaFree(y), cudaFree(g), cudaFree(x4), cudaFree(y4);
  cudaFree(g4), cudaFree(qkv), cudaFree(dqkv), cudaFree(w), cudaFree(dw), cudaFree(bias), cudaFree(dbias);
  cudaFree(gw), cudaFree(mean), cudaFree(rstd), cudaFree(lse), cudaFree(Dscr), cudaFree(logits), cudaFree(losses);
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  free(tok);
}

/* The bandwidth kernels at the edges of their vector split (16-byte groups
 * of 8 bf16 / 4 f32, rows that start off the grid when the row length is
 * not a multiple of 8, lanes with more than one group, the layer norm's
 * grid clamped at 1024 blocks) */
static void test_kernel_edges(td_dtype dt) {
  const int ln_C[] = {1, 3, 8, 13, 77, 264, 1000}, ln_N[] = {1, 5, 131};
  for (size_t i = 0; i < sizeof ln_C / sizeof *ln_C; i++)
    for (size_t j = 0; j < sizeof ln_N / sizeof *ln_N; j++) test_layernorm(ln_N[j], ln_C[i], dt);
  test_layernorm(4 * 4 * 1024 + 5, 2, dt); /* more rows than the grid's warps take once */
  const int xent_V[] = {1, 5, 8, 97, 4103, 8200};
  for (size_t i = 0; i < sizeof xent_V / sizeof *xent_V; i++) test_softmax_xent(3, xent_V[i], dt);
  /* the products' dbias column sum: 16-byte groups over more rows than its
   * 256 (128) row lanes with a partial 32-column block, and an odd OC (the
   * element kernel) */
  test_matmul(300, 24, 40, 1, dt);
  test_matmul(5, 24, 37, 1, dt);
  /* the overwritten input gradient and GELU's folded backward: 1 x 1, odd
   * sizes, the GPT's fc2 shape (N, 4C) <- (N, C) at C = 72, no OC (zeros) */
  test_matmul_overwrite(1, 1, 1, dt);
  test_matmul_overwrite(7, 13, 5, dt);
  test_matmul_overwrite(66, 288, 72, dt);
  test_matmul_overwrite(5, 24, 0, dt);
  /* the bias gradients over 2 micro-batches, from the epilogues and from the
   * column sums: 1 x 1, odd sizes, the fc2 shape at C = 72, a dbias wider
   * than the epilogues' scratch (f32: 65,536 entries) */
  for (int cs = 0; cs < 2; cs++) {
    int fl = cs ? TD_CUDA_DBIAS_COLUMN_SUM : 0;
    test_matmul_bias_grads(1, 1, 1, dt, fl);
    test_matmul_bias_grads(7, 13, 5, dt, fl);
    test_matmul_bias_grads(66, 288, 72, dt, fl);
  }
  test_matmul_bias_grads(2, 3, 65537, dt, 0);
  test_encoder(1, 1, 13, 5, dt);
  test_encoder(2, 7, 77, 40, dt);
  test_encoder(3, 5, 264, 97, dt);
  printf("%s: layernorm, softmax-xent, encoder, dbias (2 micro-batches) and overwrite/GELU-folded matmul edges match "
         "the CPU\n",
         td_dtype_name(dt));
}

int main(int argc, char **argv) {
  int big = argc > 1 && strcmp(argv[1], "--big") == 0;
  int bench = argc > 1 && strcmp(argv[1], "--bench") == 0;
  int attention_only = argc > 1 && strcmp(argv[1], "--attention") == 0;
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
    const char *e = getenv("TD_TEST_EXPECT_CUDA"); /* tests/gpu.suite: no device is a failure there */
    printf("%s: no CUDA device (%s)\n", e && strcmp(e, "1") == 0 ? "FAIL" : "SKIP",
           cudaGetErrorString(cudaGetLastError()));
    return e && strcmp(e, "1") == 0 ? 1 : 0;
  }
  if (bench) {
    /* --bench: GPT-2 124M's shape; --bench small: a tiny one (the emulator's smoke run) */
    bench_shape gpt2 = {"GPT-2 124M", 16, 1024, 768, 12, 50304, 12, 10};
    bench_shape small = {"small", 1, 33, 128, 2, 97, 1, 1}; /* head size 64 (and 128): the FlashAttention-2 rows */
    const bench_shape *sh = argc > 2 && strcmp(argv[2], "small") == 0 ? &small : &gpt2;
    run_bench(sh, TD_BF16);
    run_bench(sh, TD_F32);
    return 0;
  }
  if (attention_only) {
    /* --attention: the fused kernels at head size 64 (GPT-2's; bf16 takes
     * the FlashAttention-2 kernels there) across their tiles: T = 17 (one
     * partial tile), 64 (one whole backward tile), 127 (one forward tile of
     * 128 less a row), 257 (three forward tiles, the last a single row),
     * and 1024 (16 key tiles, GPT-2's length) on one batch row; then the
     * same in f32 at the small sizes (CUDA cores: the reference path) */
    const int Ts_att[] = {17, 64, 127, 257};
    if (argc > 2 && strcmp(argv[2], "small") == 0) { /* --attention small: bf16 at 1-3 tiles only */
      const int Ts_small[] = {17, 64, 130};
      for (int i = 0; i < 3; i++) test_attention(2, Ts_small[i], 128, 2, TD_BF16);
      printf("bf16 head size 64: fused attention at T = 17, 64, 130 matches the CPU\n");
      /* head size 128 (the forward's one-strip blocks, the backward's K and
       * V read from shared memory; the two passes under onepass too) */
      test_attention(1, 7, 256, 2, TD_BF16);
      test_attention(1, 130, 256, 2, TD_BF16);
      printf("bf16 head size 128: fused attention at T = 7, 130 matches the CPU\n");
      return 0;
    }
    if (argc > 2 && strcmp(argv[2], "hs128") == 0) {
      /* --attention hs128: LLaMA-style heads of 128 (2 of them, C = 256):
       * T = 1 (one row), 7, 33 (odd, inside a tile), 64 (one whole
       * forward block and backward tile), 130 (three tiles, the last 2
       * rows), 257 (five, the last a single row) in bf16 (the
       * FlashAttention-2 kernels); f32 at 1, 7, 33 (the CUDA cores' 16-row
       * tiles) */
      const int Ts_128[] = {1, 7, 33, 64, 130, 257};
      for (int i = 0; i < 6; i++) test_attention(i < 3 ? 2 : 1, Ts_128[i], 256, 2, TD_BF16);
      printf("bf16 head size 128: fused attention at T = 1, 7, 33, 64, 130, 257 matches the CPU\n");
      for (int i = 0; i < 3; i++) test_attention(2, Ts_128[i], 256, 2, TD_F32);
      printf("f32 head size 128: fused attention at T = 1, 7, 33 matches the CPU\n");
      return 0;
    }
    for (int i = 0; i < 4; i++) test_attention(2, Ts_att[i], 128, 2, TD_BF16);
    test_attention(1, 1024, 128, 2, TD_BF16);
    printf("bf16 head size 64: fused attention at T = 17, 64, 127, 257, 1024 matches the CPU\n");
    for (int i = 0; i < 2; i++) test_attention(2, Ts_att[i], 128, 2, TD_F32);
    printf("f32 head size 64: fused attention at T = 17, 64 matches the CPU\n");
    return 0;
  }
  const int B = 2, C = 72, NH = 3, V = 97;
  const int small_T[] = {1, 7, 33}, big_T[] = {1023, 1024};
  const int *Ts = big ? big_T : small_T;
  int n_T = big ? 2 : 3;
  const td_dtype dts[] = {TD_F32, TD_BF16};
  for (int d = 0; d < 2; d++) {
    td_dtype dt = dts[d];
    for (int i = 0; i < n_T; i++) {
      int T = Ts[i], N = B * T;
      test_encoder(B, T, C, V, dt);
      test_layernorm(N, C, dt);
      test_gelu((size_t)N * 4 * C, dt);
      test_matmul(N, C, 3 * C, 1, dt);
      test_matmul(N, C, V, 0, dt);
      test_attention(B, T, C, NH, dt);
      /* head sizes 32 and 16: bf16 takes the fused tensor-core kernels there */
      test_attention(B, T, 96, 3, dt);
      test_attention(B, T, 80, 5, dt);
      test_attention(B, T, 128, 2, dt); /* head size 64, GPT-2's */
      test_softmax_xent(N, V, dt);
      printf("%s T=%d: encoder, layernorm, residual, gelu, matmul, attention, softmax-xent match the CPU\n",
             td_dtype_name(dt), T);
    }
    /* several 64-row tiles (the tensor-core kernels' online softmax across
     * tiles, their last partial tile); the small T above fit in one */
    if (!big) test_attention(1, 130, 80, 5, dt);
    test_elementwise_edges(dt);
    if (!big) test_kernel_edges(dt);
    test_adamw(1000 + 37, dt);
    test_norm_scale_cast(big ? (size_t)1 << 22 : 5003, dt);
    test_norm_scale_cast(1, dt);
  }
  test_bad_arguments();
#ifdef TD_CUDA_EMU
  /* the emulator's cuBLASLt offers an algorithm for every product whose
   * description is right: a fallback here is a wrong shape, transpose or
   * leading dimension in matmul.cu, hidden by the tiled kernel */
  CHECK_EQ_INT(td_cuda_matmul_fallbacks(), 0);
#endif
  printf("cuda layers: all checks passed (matmul backend %s, %ld products fell back to the tiled kernel, %ld bias "
         "gradients from cuBLASLt's epilogues)\n",
         td_cuda_matmul_backend(), td_cuda_matmul_fallbacks(), td_cuda_matmul_bgrad_epilogues());
  return 0;
}
