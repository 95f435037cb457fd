/* Causal attention with bf16 products (src/nn/attention_bf16.c) at every
 * CPU level this machine runs, against double-precision references.
 *
 * The kernel rounds each product's operands to bf16 (q, k, v, P, dout, dS)
 * and accumulates in f32; softmax and its backward are f32. Two references,
 * both in double:
 *
 * - exact: the same roundings, applied to the operands in double (bf16 of
 *   q, k, v, dout; P as the kernel returned it in att; dS from the
 *   reference's own dS). What is left is f32 accumulation (2K 2^-24 of the
 *   sum of magnitudes for K terms), f32 softmax (1e-5 relative), and where
 *   the kernel's f32 dS lies within its accumulation error of a bf16
 *   rounding boundary, the other rounding: the bound takes bf16 of dS
 *   +- that error (rounding is monotonic) for each term. This catches
 *   errors far below bf16's own (a 0.3% softmax or a 1% dS error fail).
 * - unrounded: q, k, v, dout as given; the kernel must be within bf16's
 *   error bound of it, stage by stage (u = 2^-8, bf16's unit roundoff: a
 *   product of two rounded operands is off by at most (2u + u^2) |a b|):
 *   S = scale q k^T off by eS = scale (2.01u + g) sum |q k|; P = softmax(S)
 *   by P (exp(2 max_j eS) - 1 + 1e-5); out = P v by sum |v| (eP + (2.01u +
 *   g)(P + eP)); the backward likewise from the kernel's P.
 *
 * Since a kernel that skipped the rounding would pass the second, the test
 * also counts the outputs farther from the f32 attention than f32 error:
 * most must be. Shapes: T = 1, odd and across the 8-row tiles and the
 * 32-column padding (7, 33, 65), head sizes 32 and 64, several batches and
 * heads; head size 16 and the levels below avx512bf16 must decline (return
 * 0, nothing written). Backward with beta 0 (dinp poisoned with NaN: not
 * read) and 1 (added). Then the layer entry points (nn_attention_forward16
 * / nn_attention_backward16) take the bf16 kernel at the bf16 compute
 * type, bit for bit, and the f32 attention otherwise. */
#include <stdint.h>

#include "../common/check.h"
#include "nn/nn_kernels.h"

static uint64_t rng = 0xA77E27u;
static size_t n_checked, n_compared, n_far_from_f32;

#define U (1.0 / 256.0) /* bf16 unit roundoff (8 significant bits, to nearest) */

static double gam(int K) { return 2.0 * K * ldexp(1.0, -24); }

/* x rounded to f32, then to bf16 (nearest even), as the kernel rounds an f32 value */
static double bf(double x) {
  float f = (float)x;
  uint32_t u;
  memcpy(&u, &f, 4);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  memcpy(&f, &u, 4);
  return f;
}

/* the most bf16(x') can differ from bf16(x) for |x' - x| <= e */
static double bf_flip(double x, double e) {
  double r = bf(x);
  return fmax(fabs(bf(x + e) - r), fabs(bf(x - e) - r));
}

static void expect(const char *what, const char *level, int b, int i, int d, float got, double want, double tol) {
  if (!(fabs((double)got - want) <= tol))
    td_test_fail(__FILE__, __LINE__, "%s %s: [b %d][%d][%d] = %.9g, reference %.9g (bound %.3g)", level, what, b, i, d,
                 got, want, tol);
  n_checked++;
}

/* One shape at one level: forward, then backward with beta 0 and 1. */
static void check_shape(const nn_kernels *k, td_cpu_level level, int B, int T, int C, int NH) {
  const char *name = td_cpu_level_name(level);
  int hs = C / NH, C3 = 3 * C;
  int applies = level >= TD_CPU_AVX512BF16 && hs % 32 == 0;
  size_t n_inp = (size_t)B * T * C3, n_out = (size_t)B * T * C, n_att = (size_t)B * NH * T * T;
  float *inp = td_test_rand_buf(&rng, n_inp, 1.0f), *dout = td_test_rand_buf(&rng, n_out, 1.0f);
  float *out = malloc(n_out * 4), *att = malloc(n_att * 4), *out32 = malloc(n_out * 4), *att32 = malloc(n_att * 4);
  float *dinp = malloc(n_inp * 4), *dinp0 = td_test_rand_buf(&rng, n_inp, 1.0f), *dinp32 = malloc(n_inp * 4);
  float *scratch = malloc((size_t)T * T * 4);
  CHECK(out && att && out32 && att32 && dinp && dinp32 && scratch);
  for (size_t i = 0; i < n_out; i++) out[i] = NAN;
  for (size_t i = 0; i < n_att; i++) att[i] = NAN;
  int ok = k->k_nn_attention_forward_bf16(out, att, inp, B, T, C, NH);
  CHECK_EQ_INT(ok, applies);
  if (!applies) {
    /* declined: nothing written */
    for (size_t i = 0; i < n_out; i++) CHECK(isnan(out[i]));
    for (size_t i = 0; i < n_inp; i++) dinp[i] = 7.0f;
    CHECK_EQ_INT(k->k_nn_attention_backward_bf16(dinp, 0.0f, dout, inp, att, B, T, C, NH), 0);
    for (size_t i = 0; i < n_inp; i++) CHECK(dinp[i] == 7.0f);
    free(inp), free(dout), free(out), free(att), free(out32), free(att32), free(dinp), free(dinp0), free(dinp32);
    free(scratch);
    return;
  }
  k->k_td_attention_forward(out32, att32, inp, B, T, C, NH);
  double scale = 1.0 / sqrt((double)hs);
  size_t TT = (size_t)T * T;
  /* per (b, h): unrounded S, P and bounds; rounded-operand (exact-reference) S, P; then dS both ways */
  double *S = malloc(TT * 8), *eS = malloc(TT * 8), *P = malloc(TT * 8), *eP = malloc(TT * 8);
  double *Sx = malloc(TT * 8), *tSx = malloc(TT * 8);
  double *dS = malloc(TT * 8), *edS = malloc(TT * 8), *dSx = malloc(TT * 8), *tdSx = malloc(TT * 8);
  CHECK(S && eS && P && eP && Sx && tSx && dS && edS && dSx && tdSx);
  for (int bb = 0; bb < 2; bb++) { /* backward with beta 0 (dinp poisoned), then 1 (added to dinp0) */
    float beta = (float)bb;
    for (size_t i = 0; i < n_inp; i++) dinp[i] = bb ? dinp0[i] : NAN;
    CHECK_EQ_INT(k->k_nn_attention_backward_bf16(dinp, beta, dout, inp, att, B, T, C, NH), 1);
    if (bb) memcpy(dinp32, dinp0, n_inp * 4);
    if (bb)
      k->k_td_attention_backward(dinp32, scratch, dout, inp, att, B, T, C, NH);
    else
      k->k_nn_attention_backward_set(dinp32, scratch, dout, inp, att, B, T, C, NH);
    for (int b = 0; b < B; b++)
      for (int h = 0; h < NH; h++) {
        const float *q = inp + (size_t)b * T * C3 + h * hs, *kk = q + C, *v = q + 2 * C;
        const float *a = att + ((size_t)b * NH + h) * TT;
        const float *d = dout + (size_t)b * T * C + h * hs;
#define Q(i, e) ((double)q[(size_t)(i) * C3 + (e)])
#define K(i, e) ((double)kk[(size_t)(i) * C3 + (e)])
#define V(i, e) ((double)v[(size_t)(i) * C3 + (e)])
#define D(i, e) ((double)d[(size_t)(i) * C + (e)])
#define A(i, j) ((double)a[(size_t)(i) * T + (j)])
        /* forward (checked on the first pass) */
        for (int i = 0; i < T && bb == 0; i++) {
          double mx = -1e300, emax = 0, z = 0, mxx = -1e300, tmax = 0, zx = 0;
          for (int j = 0; j <= i; j++) {
            double s = 0, m = 0, sx = 0, mx_ = 0;
            for (int e = 0; e < hs; e++) {
              s += Q(i, e) * K(j, e), m += fabs(Q(i, e) * K(j, e));
              sx += bf(Q(i, e)) * bf(K(j, e)), mx_ += fabs(bf(Q(i, e)) * bf(K(j, e)));
            }
            size_t ij = (size_t)i * T + j;
            S[ij] = s * scale, Sx[ij] = sx * scale;
            eS[ij] = scale * m * (2.01 * U + gam(hs)) + ldexp(fabs(S[ij]), -22) + 1e-30;
            tSx[ij] = scale * mx_ * gam(hs) + ldexp(fabs(Sx[ij]), -22) + 1e-30;
            mx = fmax(mx, S[ij]), emax = fmax(emax, eS[ij]), mxx = fmax(mxx, Sx[ij]), tmax = fmax(tmax, tSx[ij]);
          }
          for (int j = 0; j <= i; j++) z += exp(S[(size_t)i * T + j] - mx), zx += exp(Sx[(size_t)i * T + j] - mxx);
          for (int j = 0; j < T; j++) {
            size_t ij = (size_t)i * T + j;
            P[ij] = j <= i ? exp(S[ij] - mx) / z : 0.0;
            eP[ij] = P[ij] * (exp(2 * emax) - 1 + 1e-5);
            if (j > i) {
              CHECK(a[ij] == 0.0f);
              continue;
            }
            double px = exp(Sx[ij] - mxx) / zx;
            expect("att (exact reference)", name, b, i, j, a[ij], px, px * (exp(2 * tmax) - 1 + 1e-5) + 1e-30);
            expect("att", name, b, i, j, a[ij], P[ij], eP[ij] + 1e-30);
          }
          for (int e = 0; e < hs; e++) {
            double y = 0, tol = 0, yx = 0, tx = 0;
            for (int j = 0; j <= i; j++) {
              double p = P[(size_t)i * T + j], ep = eP[(size_t)i * T + j];
              y += p * V(j, e);
              tol += fabs(V(j, e)) * (ep + (2.01 * U + gam(i + 1)) * (p + ep));
              yx += bf(A(i, j)) * bf(V(j, e)), tx += fabs(bf(A(i, j)) * bf(V(j, e)));
            }
            size_t at = ((size_t)b * T + i) * C + h * hs + e;
            expect("out (exact reference)", name, b, i, e, out[at], yx, gam(i + 1) * tx + ldexp(fabs(yx), -22) + 1e-30);
            expect("out", name, b, i, e, out[at], y, tol + ldexp(fabs(y), -22) + 1e-30);
            n_far_from_f32 += fabs((double)out[at] - out32[at]) > 1e-6 * (fabs(y) + 1e-3);
            n_compared++;
          }
        }
        /* backward from the kernel's P: dS unrounded (with bf16's bound) and exact (with f32's) */
        for (int i = 0; i < T; i++) {
          double dP[1024], edP[1024], dPx[1024], tdPx[1024];
          double dot = 0, edot = 0, mdot = 0, dotx = 0, tdotx = 0, mdotx = 0;
          for (int j = 0; j <= i; j++) {
            double s = 0, m = 0, sx = 0, mx_ = 0;
            for (int e = 0; e < hs; e++) {
              s += D(i, e) * V(j, e), m += fabs(D(i, e) * V(j, e));
              sx += bf(D(i, e)) * bf(V(j, e)), mx_ += fabs(bf(D(i, e)) * bf(V(j, e)));
            }
            dP[j] = s, edP[j] = m * (2.01 * U + gam(hs)) + 1e-30;
            dPx[j] = sx, tdPx[j] = mx_ * gam(hs) + 1e-30;
            dot += A(i, j) * s, edot += A(i, j) * edP[j], mdot += fabs(A(i, j) * s);
            dotx += A(i, j) * sx, tdotx += A(i, j) * tdPx[j], mdotx += fabs(A(i, j) * sx);
          }
          edot += gam(i + 1) * mdot, tdotx += gam(i + 1) * mdotx;
          for (int j = 0; j < T; j++) {
            size_t ij = (size_t)i * T + j;
            double p = j <= i ? A(i, j) : 0.0;
            dS[ij] = j <= i ? p * (dP[j] - dot) : 0.0;
            edS[ij] = j <= i ? p * (edP[j] + edot) + ldexp(p * (fabs(dP[j]) + fabs(dot)), -21) + 1e-30 : 0.0;
            dSx[ij] = j <= i ? p * (dPx[j] - dotx) : 0.0;
            tdSx[ij] = j <= i ? p * (tdPx[j] + tdotx) + ldexp(p * (fabs(dPx[j]) + fabs(dotx)), -21) + 1e-30 : 0.0;
          }
        }
        for (int i = 0; i < T; i++)
          for (int e = 0; e < hs; e++) {
            /* unrounded values and bounds g, t; exact-reference values and bounds gx, tx */
            double g[3] = {0, 0, 0}, t[3] = {0, 0, 0}, gx[3] = {0, 0, 0}, tx[3] = {0, 0, 0}, mag[3] = {0, 0, 0};
            for (int j = 0; j <= i; j++) { /* dq[i] from keys j <= i */
              size_t ij = (size_t)i * T + j;
              double s = dS[ij], es = edS[ij], sx = bf(dSx[ij]);
              g[0] += s * K(j, e);
              t[0] += fabs(K(j, e)) * (es + (2.01 * U + gam(i + 1)) * (fabs(s) + es));
              gx[0] += sx * bf(K(j, e));
              tx[0] += fabs(bf(K(j, e))) * bf_flip(dSx[ij], tdSx[ij]), mag[0] += fabs(sx * bf(K(j, e)));
            }
            for (int r = i; r < T; r++) { /* dk[i], dv[i] from queries r >= i */
              size_t ri = (size_t)r * T + i;
              double s = dS[ri], es = edS[ri], sx = bf(dSx[ri]), p = A(r, i);
              g[1] += s * Q(r, e);
              t[1] += fabs(Q(r, e)) * (es + (2.01 * U + gam(T - i + 1)) * (fabs(s) + es));
              gx[1] += sx * bf(Q(r, e));
              tx[1] += fabs(bf(Q(r, e))) * bf_flip(dSx[ri], tdSx[ri]), mag[1] += fabs(sx * bf(Q(r, e)));
              g[2] += p * D(r, e);
              t[2] += (2.01 * U + gam(T - i + 1)) * fabs(p * D(r, e));
              gx[2] += bf(p) * bf(D(r, e)), mag[2] += fabs(bf(p) * bf(D(r, e)));
            }
            tx[0] += gam(i + 1) * mag[0], tx[1] += gam(T - i + 1) * mag[1], tx[2] += gam(T - i + 1) * mag[2];
            for (int m = 0; m < 2; m++) g[m] *= scale, t[m] *= scale, gx[m] *= scale, tx[m] *= scale;
            size_t at = ((size_t)b * T + i) * C3 + h * hs + e;
            static const char *names[3] = {"dq", "dk", "dv"}, *names_x[3] = {"dq (exact reference)",
                                                                              "dk (exact reference)",
                                                                              "dv (exact reference)"};
            for (int m = 0; m < 3; m++) {
              double base = bb ? dinp0[at + (size_t)m * C] : 0.0;
              float got = dinp[at + (size_t)m * C];
              double slack = ldexp(fabs(g[m]) + fabs(base), -21) + 1e-30;
              expect(names_x[m], name, b, i, e, got, gx[m] + base, tx[m] + slack);
              expect(names[m], name, b, i, e, got, g[m] + base, t[m] + slack);
              n_far_from_f32 += fabs((double)got - dinp32[at + (size_t)m * C]) > 1e-6 * (fabs(g[m]) + 1e-3);
              n_compared++;
            }
          }
#undef Q
#undef K
#undef V
#undef D
#undef A
      }
  }
  free(S), free(eS), free(P), free(eP), free(Sx), free(tSx), free(dS), free(edS), free(dSx), free(tdSx);
  free(inp), free(dout), free(out), free(att), free(out32), free(att32), free(dinp), free(dinp0), free(dinp32);
  free(scratch);
}

/* The layer entry points pick the bf16 kernel at the bf16 compute type
 * (where it applies), the f32 attention otherwise: bit for bit. */
static void check_layers(const nn_kernels *k, td_cpu_level level, int B, int T, int C, int NH) {
  size_t n_inp = (size_t)B * T * 3 * C, n_out = (size_t)B * T * C, n_att = (size_t)B * NH * T * T;
  float *inp = td_test_rand_buf(&rng, n_inp, 1.0f), *dout = td_test_rand_buf(&rng, n_out, 1.0f);
  float *o1 = malloc(n_out * 4), *o2 = malloc(n_out * 4), *a1 = malloc(n_att * 4), *a2 = malloc(n_att * 4);
  float *d1 = malloc(n_inp * 4), *d2 = malloc(n_inp * 4), *scratch = malloc((size_t)T * T * 4);
  uint16_t *o16 = malloc(n_out * 2);
  CHECK(o1 && o2 && a1 && a2 && d1 && d2 && scratch && o16);
  for (int dt = 0; dt < 2; dt++) {
    CHECK_OK(td_nn_set_compute_dtype(dt ? TD_BF16 : TD_F32));
    int bf = dt && level >= TD_CPU_AVX512BF16 && (C / NH) % 32 == 0;
    k->k_nn_attention_forward16(o1, o16, a1, inp, B, T, C, NH);
    k->k_nn_attention_backward16(d1, scratch, dout, inp, a1, B, T, C, NH);
    if (bf) {
      CHECK(k->k_nn_attention_forward_bf16(o2, a2, inp, B, T, C, NH) == 1);
      CHECK(k->k_nn_attention_backward_bf16(d2, 0.0f, dout, inp, a2, B, T, C, NH) == 1);
    } else {
      k->k_td_attention_forward(o2, a2, inp, B, T, C, NH);
      k->k_nn_attention_backward_set(d2, scratch, dout, inp, a2, B, T, C, NH);
    }
    CHECK(memcmp(o1, o2, n_out * 4) == 0);
    CHECK(memcmp(a1, a2, n_att * 4) == 0);
    CHECK(memcmp(d1, d2, n_inp * 4) == 0);
    uint16_t ref16[1];
    for (size_t i = 0; i < n_out; i++) {
      k->k_nn_to_bf16(ref16, o1 + i, 1);
      CHECK(o16[i] == ref16[0]);
    }
  }
  CHECK_OK(td_nn_set_compute_dtype(TD_F32));
  free(inp), free(dout), free(o1), free(o2), free(a1), free(a2), free(d1), free(d2), free(scratch), free(o16);
}

int main(void) {
  setvbuf(stdout, NULL, _IONBF, 0);
  td_nn_set_threads(1);
  static const int shapes[][4] = {/* B, T, C, NH */
                                  {1, 1, 32, 1}, {2, 7, 64, 2}, {1, 33, 64, 1}, {1, 65, 128, 2}, {2, 40, 96, 3},
                                  {1, 17, 48, 3}};
  td_cpu_level top = td_cpu_supported();
  for (int l = 0; l <= (int)top; l++) {
    const nn_kernels *k = nn_kernels_for((td_cpu_level)l);
    for (size_t s = 0; s < TD_ARRAY_SIZE(shapes); s++)
      check_shape(k, (td_cpu_level)l, shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3]);
    check_layers(k, (td_cpu_level)l, 2, 33, 64, 1);
    check_layers(k, (td_cpu_level)l, 1, 9, 48, 3);
    printf("level %-10s: bf16 attention %s\n", td_cpu_level_name((td_cpu_level)l),
           l >= TD_CPU_AVX512BF16 ? "within its bounds of the double references" : "declined (f32 attention used)");
  }
  if (top < TD_CPU_AVX512BF16) {
    printf("(no AVX512-BF16 on this CPU: the bf16 attention was not run)\n");
    return 0;
  }
  printf("%zu values checked; of the %zu outputs (out, dq, dk, dv), %zu farther from the f32 attention than f32 "
         "error\n",
         n_checked, n_compared, n_far_from_f32);
  CHECK(n_far_from_f32 > n_compared / 2);
  return 0;
}
