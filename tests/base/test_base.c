/* Unit tests for src/base: half-precision conversions (exhaustive over all
 * 65536 f16/bf16 bit patterns), reduction kernels for every dtype and op
 * against scalar reference loops, the shard function, size parsing, futex
 * wait timeouts, the growing text buffer (td_buf), the process's age. */
#include <pthread.h>
#include <stdint.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../common/check.h"
#include "base/base.h"
#include "base/reduce_kernels.h"

static void test_half_roundtrip(void) {
  /* Every finite f16 value converts to f32 and back unchanged. */
  for (uint32_t h = 0; h < 65536; h++) {
    uint16_t x = (uint16_t)h;
    float f = td_f16_to_f32(x);
    if ((x & 0x7c00) == 0x7c00 && (x & 0x3ff)) { CHECK(f != f); continue; } /* nan */
    uint16_t back = td_f32_to_f16(f);
    if (back != x) td_test_fail(__FILE__, __LINE__, "f16 %#x -> %g -> %#x", x, f, back);
    float bf = td_bf16_to_f32(x);
    if (bf != bf) continue;
    CHECK_EQ_INT(td_f32_to_bf16(bf), x);
  }
  /* Known values and rounding. */
  CHECK_CLOSE(td_f16_to_f32(0x3c00), 1.0, 0, 0);
  CHECK_CLOSE(td_f16_to_f32(0xc000), -2.0, 0, 0);
  CHECK_CLOSE(td_f16_to_f32(0x0001), 5.960464477539063e-08, 0, 0); /* smallest subnormal */
  CHECK_EQ_INT(td_f32_to_f16(65504.0f), 0x7bff);
  CHECK_EQ_INT(td_f32_to_f16(70000.0f), 0x7c00);      /* overflow to inf */
  CHECK_EQ_INT(td_f32_to_f16(1.0f + 1.0f / 2048), 0x3c00); /* tie rounds to even */
  CHECK_EQ_INT(td_f32_to_f16(1.0f + 3.0f / 2048), 0x3c02); /* tie rounds to even (up) */
  CHECK_EQ_INT(td_f32_to_f16(2.98023224e-08f), 0x0000);    /* 2^-25 ties to even zero */
  CHECK_EQ_INT(td_f32_to_f16(4.0e-08f), 0x0001);
  CHECK_EQ_INT(td_f32_to_bf16(1.0f), 0x3f80);
  CHECK_EQ_INT(td_f32_to_bf16(1.00390625f), 0x3f80); /* tie to even */
  CHECK_EQ_INT(td_f32_to_bf16(1.01171875f), 0x3f82); /* tie to even (up) */
}

/* Reference: reduce element i of n_srcs sources in double (exact for the
 * small integers used here) and compare with the kernels. */
static double ref_value(int src, size_t i, td_op op) {
  if (op == TD_PROD) return ((i + (size_t)src) % 3 == 0) ? 2.0 : 1.0;
  return (double)((int)((i * 7 + (size_t)src * 13) % 23) - (op == TD_SUM || op == TD_AVG ? 0 : 11));
}

static void test_reduce_kernels(void) {
  const size_t counts[] = {0, 1, 7, 2048, 2049, 10007};
  for (int dt = 0; dt < TD_DTYPE_COUNT; dt++) {
    for (int op = 0; op < TD_OP_COUNT; op++) {
      for (int n_srcs = 1; n_srcs <= 5; n_srcs++) {
        if (dt == TD_U8 && op != TD_SUM && op != TD_AVG && op != TD_PROD) {
          /* u8 min/max over non-negative values only */
        }
        for (size_t ci = 0; ci < TD_ARRAY_SIZE(counts); ci++) {
          size_t count = counts[ci], es = td_dtype_size((td_dtype)dt);
          void *srcs[5];
          for (int k = 0; k < n_srcs; k++) {
            srcs[k] = td_alloc(count * es + 1);
            for (size_t i = 0; i < count; i++) {
              double v = ref_value(k, i, (td_op)op);
              if (dt == TD_U8 && v < 0) v = -v;
              td_dtype_set(srcs[k], i, (td_dtype)dt, v);
            }
          }
          void *dst = td_alloc(count * es + 1);
          td_reduce_multi(dst, (const void *const *)srcs, n_srcs, count, (td_dtype)dt, (td_op)op);
          /* Also check the in-place pairwise kernel chained over sources. */
          void *acc = td_alloc(count * es + 1);
          if (count) memcpy(acc, srcs[0], count * es);
          for (int k = 1; k < n_srcs; k++) td_reduce_inplace(acc, srcs[k], count, (td_dtype)dt, (td_op)op);
          for (size_t i = 0; i < count; i++) {
            double want = td_dtype_get(srcs[0], i, (td_dtype)dt);
            for (int k = 1; k < n_srcs; k++) {
              double v = td_dtype_get(srcs[k], i, (td_dtype)dt);
              want = td_op_apply((td_op)op, want, v);
            }
            if (dt == TD_U8) want = (double)((uint8_t)(int)want);
            double got = td_dtype_get(dst, i, (td_dtype)dt), got2 = td_dtype_get(acc, i, (td_dtype)dt);
            if (got != want || got2 != want)
              td_test_fail(__FILE__, __LINE__, "%s %s n_srcs=%d count=%zu i=%zu: multi %g inplace %g want %g",
                           td_dtype_name((td_dtype)dt), td_op_name((td_op)op), n_srcs, count, i, got, got2, want);
          }
          /* td_reduce_fanout: the same bits into several outputs, also when
           * every output is one of the inputs (the in-place allreduce). */
          void *fan[3], *alias[5];
          for (int j = 0; j < 3; j++) fan[j] = td_alloc(count * es + 1);
          td_reduce_fanout(fan, 3, (const void *const *)srcs, n_srcs, count, (td_dtype)dt, (td_op)op);
          for (int k = 0; k < n_srcs; k++) {
            alias[k] = td_alloc(count * es + 1);
            if (count) memcpy(alias[k], srcs[k], count * es);
          }
          td_reduce_fanout(alias, n_srcs, (const void *const *)alias, n_srcs, count, (td_dtype)dt, (td_op)op);
          for (int j = 0; j < 3 + n_srcs; j++) {
            void *out = j < 3 ? fan[j] : alias[j - 3];
            if (count && memcmp(out, dst, count * es) != 0)
              td_test_fail(__FILE__, __LINE__, "%s %s n_srcs=%d count=%zu: fanout output %d differs from multi",
                           td_dtype_name((td_dtype)dt), td_op_name((td_op)op), n_srcs, count, j);
          }
          for (int j = 0; j < 3; j++) td_free(fan[j]);
          for (int k = 0; k < n_srcs; k++) td_free(alias[k]);
          for (int k = 0; k < n_srcs; k++) td_free(srcs[k]);
          td_free(dst);
          td_free(acc);
        }
      }
    }
  }
  /* Aliasing dst == srcs[0] is allowed. */
  float a[5] = {1, 2, 3, 4, 5}, b[5] = {10, 20, 30, 40, 50};
  const void *s[2] = {a, b};
  td_reduce_multi(a, s, 2, 5, TD_F32, TD_SUM);
  for (int i = 0; i < 5; i++) CHECK_CLOSE(a[i], 11.0 * (i + 1), 0, 0);
  /* Scaling for TD_AVG. */
  int32_t iv[3] = {7, -7, 9};
  td_reduce_scale(iv, 3, TD_I32, 2);
  CHECK_EQ_INT(iv[0], 3); CHECK_EQ_INT(iv[1], -3); CHECK_EQ_INT(iv[2], 4);
  uint16_t bv[2] = {td_f32_to_bf16(6.0f), td_f32_to_bf16(-3.0f)};
  td_reduce_scale(bv, 2, TD_BF16, 3);
  CHECK_CLOSE(td_bf16_to_f32(bv[0]), 2.0, 0, 0);
  CHECK_CLOSE(td_bf16_to_f32(bv[1]), -1.0, 0, 0);
}

/* The reduce kernels use their own inlined (vectorizable) half conversions:
 * they must agree bit for bit with td_f16_to_f32/td_f32_to_f16 and the bf16
 * pair, for every input pattern and for sums that need rounding. */
static void test_half_kernels_match_reference(void) {
  enum { N = 65536 };
  uint16_t *all = td_alloc(N * 2), *out = td_alloc(N * 2), *other = td_alloc(N * 2);
  for (uint32_t h = 0; h < N; h++) all[h] = (uint16_t)h;
  for (int bf = 0; bf <= 1; bf++) {
    td_dtype dt = bf ? TD_BF16 : TD_F16;
    const void *one[1] = {all};
    td_reduce_multi(out, one, 1, N, dt, TD_SUM); /* load + store round trip */
    for (uint32_t h = 0; h < N; h++) {
      float f = bf ? td_bf16_to_f32(all[h]) : td_f16_to_f32(all[h]);
      /* a NaN comes back quiet with its payload (F16C's rule, scalar or not) */
      uint16_t want = f != f ? (uint16_t)(all[h] | (bf ? 0x40 : 0x200)) : all[h];
      if (out[h] != want) td_test_fail(__FILE__, __LINE__, "%s round trip %#x -> %#x", td_dtype_name(dt), all[h], out[h]);
    }
    /* Pairwise sums and products with rounding: a pseudo-random partner each. */
    uint64_t x = 88172645463325252ull;
    for (uint32_t h = 0; h < N; h++) {
      x ^= x << 13; x ^= x >> 7; x ^= x << 17;
      other[h] = (uint16_t)x;
    }
    for (int op = TD_SUM; op <= TD_PROD; op++) {
      if (op == TD_AVG) continue;
      const void *two[2] = {all, other};
      td_reduce_multi(out, two, 2, N, dt, (td_op)op);
      for (uint32_t h = 0; h < N; h++) {
        float a = bf ? td_bf16_to_f32(all[h]) : td_f16_to_f32(all[h]);
        float b = bf ? td_bf16_to_f32(other[h]) : td_f16_to_f32(other[h]);
        float r = op == TD_SUM ? a + b : op == TD_PROD ? a * b : op == TD_MIN ? fminf(a, b) : fmaxf(a, b);
        if ((op == TD_MIN || op == TD_MAX) && a == 0 && b == 0)
          r = op == TD_MIN ? (signbit(a) ? a : b) : (signbit(a) ? b : a); /* -0 < +0 */
        if (a != a || b != b) r = __builtin_nanf("");
        uint16_t want = bf ? td_f32_to_bf16(r) : td_f32_to_f16(r);
        float got_f = bf ? td_bf16_to_f32(out[h]) : td_f16_to_f32(out[h]);
        float want_f = bf ? td_bf16_to_f32(want) : td_f16_to_f32(want);
        if (want_f != want_f && (op == TD_MIN || op == TD_MAX)) { /* the canonical quiet NaN */
          CHECK_EQ_INT(out[h], bf ? 0x7fc0 : 0x7e00);
          continue;
        }
        if (want_f != want_f && (a != a || b != b)) { CHECK(got_f != got_f); continue; }
        if (out[h] != want)
          td_test_fail(__FILE__, __LINE__, "%s %s(%#x, %#x) = %#x, want %#x", td_dtype_name(dt),
                       td_op_name((td_op)op), all[h], other[h], out[h], want);
      }
    }
  }
  td_free(all);
  td_free(out);
  td_free(other);
}

/* Floating MIN/MAX: NaN propagates as the canonical quiet NaN, -0 < +0, and
 * op(a, b) has the same bits as op(b, a) for every pair, on the vector and
 * the scalar lanes (a count that is not a multiple of any vector width).
 * Integer SUM/PROD wrap (closed form, computed here in unsigned). */
static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static void test_minmax_nan_and_wrap(void) {
  enum { N = 37 };
  const float special[] = {0.0f, -0.0f, 1.0f, -1.0f, 2.5f, INFINITY, -INFINITY, NAN, -NAN, 1e-45f};
  const int ns = (int)TD_ARRAY_SIZE(special);
  uint32_t nan_payload = 0x7f812345u, neg_nan = 0xffc00001u;
  float x[N], y[N], xy[N], yx[N];
  for (int op = TD_MIN; op <= TD_MAX; op++) {
    for (int i = 0; i < ns + 2; i++) {
      for (int j = 0; j < ns + 2; j++) {
        float a, b;
        if (i < ns) a = special[i]; else memcpy(&a, i == ns ? &nan_payload : &neg_nan, 4);
        if (j < ns) b = special[j]; else memcpy(&b, j == ns ? &nan_payload : &neg_nan, 4);
        for (int k = 0; k < N; k++) { x[k] = a; y[k] = b; }
        const void *s1[2] = {x, y}, *s2[2] = {y, x};
        td_reduce_multi(xy, s1, 2, N, TD_F32, (td_op)op);
        td_reduce_multi(yx, s2, 2, N, TD_F32, (td_op)op);
        uint32_t want;
        if (a != a || b != b) want = 0x7fc00000u;
        else if (a == b) want = op == TD_MIN ? (f32_bits(a) | f32_bits(b)) : (f32_bits(a) & f32_bits(b));
        else want = f32_bits(op == TD_MIN ? (a < b ? a : b) : (a > b ? a : b));
        for (int k = 0; k < N; k++)
          if (f32_bits(xy[k]) != want || f32_bits(yx[k]) != want)
            td_test_fail(__FILE__, __LINE__, "f32 %s(%#x, %#x) lane %d: %#x / %#x, want %#x", td_op_name((td_op)op),
                         f32_bits(a), f32_bits(b), k, f32_bits(xy[k]), f32_bits(yx[k]), want);
        /* f64: the same rules on the same values */
        double dx[N], dy[N], dxy[N], dyx[N];
        for (int k = 0; k < N; k++) { dx[k] = a; dy[k] = b; }
        const void *d1[2] = {dx, dy};
        td_reduce_multi(dxy, d1, 2, N, TD_F64, (td_op)op);
        td_reduce_inplace(dy, dx, N, TD_F64, (td_op)op); /* in place, the other order */
        memcpy(dyx, dy, sizeof dyx);
        for (int k = 0; k < N; k++) {
          uint64_t u1, u2;
          memcpy(&u1, &dxy[k], 8);
          memcpy(&u2, &dyx[k], 8);
          uint64_t w64;
          if (a != a || b != b) w64 = 0x7ff8000000000000ull;
          else { double w = op == TD_MIN ? (a < b ? a : b) : (a > b ? a : b);
                 if (a == b) w = op == TD_MIN ? (signbit(a) ? (double)a : (double)b) : (signbit(a) ? (double)b : (double)a);
                 memcpy(&w64, &w, 8); }
          if (u1 != w64 || u2 != w64)
            td_test_fail(__FILE__, __LINE__, "f64 %s(%g, %g) lane %d: %#llx / %#llx, want %#llx",
                         td_op_name((td_op)op), a, b, k, (unsigned long long)u1, (unsigned long long)u2,
                         (unsigned long long)w64);
        }
      }
    }
  }
  /* Integer wrap: INT32_MAX + 1, INT32_MIN * -1, INT64_MAX + INT64_MAX, 255 + 1. */
  int32_t i1[N], i2[N];
  for (int k = 0; k < N; k++) { i1[k] = INT32_MAX; i2[k] = k + 1; }
  td_reduce_inplace(i1, i2, N, TD_I32, TD_SUM);
  for (int k = 0; k < N; k++) CHECK_EQ_INT(i1[k], (int32_t)(0x7fffffffu + (uint32_t)(k + 1)) );
  CHECK_EQ_INT(i1[0], INT32_MIN);
  for (int k = 0; k < N; k++) { i1[k] = INT32_MIN; i2[k] = -1; }
  td_reduce_inplace(i1, i2, N, TD_I32, TD_PROD);
  for (int k = 0; k < N; k++) CHECK_EQ_INT(i1[k], INT32_MIN);
  int64_t l1[N], l2[N];
  for (int k = 0; k < N; k++) { l1[k] = INT64_MAX; l2[k] = INT64_MAX - k; }
  const void *ls[2] = {l1, l2};
  td_reduce_multi(l1, ls, 2, N, TD_I64, TD_SUM);
  for (int k = 0; k < N; k++) CHECK_EQ_INT(l1[k], -2 - k);
  for (int k = 0; k < N; k++) { l1[k] = INT64_MAX; l2[k] = 3; }
  td_reduce_inplace(l1, l2, N, TD_I64, TD_PROD);
  for (int k = 0; k < N; k++) CHECK_EQ_INT(l1[k], INT64_MAX - 2); /* 3 * (2^63 - 1) mod 2^64 = 2^63 - 3 */
  uint8_t u1[N], u2[N];
  for (int k = 0; k < N; k++) { u1[k] = 255; u2[k] = (uint8_t)k; }
  td_reduce_inplace(u1, u2, N, TD_U8, TD_SUM);
  for (int k = 0; k < N; k++) CHECK_EQ_INT(u1[k], (k + 255) % 256);
  /* Integer AVG: the wrapped sum divided with truncation toward zero. */
  int32_t avg[2] = {INT32_MIN, -7};
  td_reduce_scale(avg, 2, TD_I32, 3);
  CHECK_EQ_INT(avg[0], INT32_MIN / 3);
  CHECK_EQ_INT(avg[1], -2);
}

static void test_dtype_get_set(void) {
  uint8_t buf[16];
  td_dtype_set(buf, 1, TD_U8, 300.0); /* stores wrap like a C conversion */
  CHECK_EQ_INT(buf[1], 300 % 256);
  td_dtype_set(buf, 1, TD_BF16, 1.00390625); /* rounds to nearest even */
  CHECK_CLOSE(td_dtype_get(buf, 1, TD_BF16), 1.0, 0, 0);
  td_dtype_set(buf, 0, TD_I64, -5.0);
  CHECK_CLOSE(td_dtype_get(buf, 0, TD_I64), -5.0, 0, 0);
  CHECK(isnan(td_dtype_get(buf, 0, (td_dtype)99)));
  td_dtype_set(buf, 0, (td_dtype)99, 1.0); /* unknown dtype: no write */
  CHECK_CLOSE(td_dtype_get(buf, 0, TD_I64), -5.0, 0, 0);
}

static void test_shard(void) {
  for (size_t count = 0; count < 50; count++) {
    for (int n = 1; n <= 9; n++) {
      size_t next = 0;
      for (int r = 0; r < n; r++) {
        size_t off, len;
        td_shard_range(count, n, r, &off, &len);
        CHECK_EQ_INT(off, next);
        CHECK(len == count / (size_t)n || len == count / (size_t)n + 1);
        next = off + len;
      }
      CHECK_EQ_INT(next, count);
    }
  }
  size_t off, len;
  td_shard_range(10, 3, 5, &off, &len); /* out of range rank: empty */
  CHECK_EQ_INT(len, 0);
}

static void test_parse(void) {
  size_t x;
  CHECK(td_parse_size("25M", &x) == 0 && x == 25u << 20);
  CHECK(td_parse_size("4K", &x) == 0 && x == 4096);
  CHECK(td_parse_size("1GiB", &x) == 0 && x == 1u << 30);
  CHECK(td_parse_size("123", &x) == 0 && x == 123);
  CHECK(td_parse_size("12Q", &x) != 0);
  CHECK(td_parse_size("", &x) != 0);
  td_dtype dt;
  td_op op;
  CHECK(td_dtype_parse("bfloat16", &dt) == 0 && dt == TD_BF16);
  CHECK(td_dtype_parse("F32", &dt) == 0 && dt == TD_F32);
  CHECK(td_dtype_parse("complex", &dt) != 0);
  CHECK(td_op_parse("avg", &op) == 0 && op == TD_AVG);
  CHECK(td_op_parse("xor", &op) != 0);
  CHECK(strcmp(td_dtype_name((td_dtype)99), "?") == 0);
  CHECK_EQ_INT(td_dtype_size((td_dtype)99), 0);
  setenv("TANDEM_TEST_SIZE", "2M", 1);
  CHECK_EQ_INT(td_env_size("TANDEM_TEST_SIZE", 5), 2u << 20);
  setenv("TANDEM_TEST_LONG", "notanumber", 1);
  CHECK_EQ_INT(td_env_long("TANDEM_TEST_LONG", 42), 42);
  CHECK(strcmp(td_status_str(TD_ERR_MISMATCH), "collective mismatch") == 0);
  CHECK(td_error(TD_ERR_IO, "file %s", "x") == TD_ERR_IO);
  CHECK(strcmp(td_last_error(), "file x") == 0);
}

static _Atomic uint32_t word;
static void *waker(void *arg) {
  (void)arg;
  usleep(20000);
  atomic_store(&word, 1);
  td_futex_wake(&word, 1, false);
  return NULL;
}

static void test_futex(void) {
  atomic_store(&word, 0);
  double t0 = td_now();
  CHECK_EQ_INT(td_futex_wait(&word, 0, 0.05, false), ETIMEDOUT);
  CHECK(td_now() - t0 >= 0.04);
  pthread_t th;
  pthread_create(&th, NULL, waker, NULL);
  while (atomic_load(&word) == 0) td_futex_wait(&word, 0, 5.0, false);
  pthread_join(th, NULL);
  CHECK(td_now() - t0 < 4.0);
  CHECK_EQ_INT(td_futex_wait(&word, 0, 1.0, false), 0); /* value differs: returns at once */
}

/* src/base/cpu.c: TANDEM_CPU's parser on every case, and the detected level
 * against the kernel's view of the CPU (/proc/cpuinfo's flags, which Linux
 * clears for features whose register state it does not save). */
static int cpuinfo_has(const char *flags, const char *flag) {
  size_t n = strlen(flag);
  for (const char *p = flags; (p = strstr(p, flag)) != NULL; p += n)
    if ((p == flags || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\n' || p[n] == '\0')) return 1;
  return 0;
}

static void test_cpu_level(void) {
  char err[256];
  td_cpu_level out;
  for (int sup = 0; sup < TD_CPU_LEVELS; sup++) {
    const char *autos[] = {NULL, "", "auto", "AUTO"};
    for (size_t i = 0; i < TD_ARRAY_SIZE(autos); i++) {
      out = (td_cpu_level)-1;
      CHECK_OK(td_cpu_parse(autos[i], (td_cpu_level)sup, &out, err, sizeof err));
      CHECK_EQ_INT(out, sup);
    }
    const char *names[] = {"generic", "avx2", "avx512", "avx512bf16"};
    for (int l = 0; l < TD_CPU_LEVELS; l++) {
      err[0] = '\0';
      td_status st = td_cpu_parse(names[l], (td_cpu_level)sup, &out, err, sizeof err);
      if (l <= sup) {
        CHECK_OK(st);
        CHECK_EQ_INT(out, l);
      } else { /* a level the CPU lacks: refused, naming it and what is available */
        CHECK_STATUS(st, TD_ERR_INVALID_ARGUMENT);
        CHECK(strstr(err, names[l]) != NULL && strstr(err, "does not support") != NULL);
        CHECK(strstr(err, names[sup]) != NULL);
      }
    }
    CHECK_STATUS(td_cpu_parse("avx1024", (td_cpu_level)sup, &out, err, sizeof err), TD_ERR_INVALID_ARGUMENT);
    CHECK(strstr(err, "TANDEM_CPU=avx1024") != NULL && strstr(err, "not a CPU level") != NULL);
    CHECK_STATUS(td_cpu_parse("avx2 ", (td_cpu_level)sup, &out, err, sizeof err), TD_ERR_INVALID_ARGUMENT);
  }
  CHECK_EQ_INT(strcmp(td_cpu_level_name(TD_CPU_AVX512), "avx512"), 0);
  CHECK_EQ_INT(strcmp(td_cpu_level_name((td_cpu_level)7), "unknown"), 0);

  /* the process's level: never above what the CPU supports */
  CHECK(td_cpu_active() <= td_cpu_supported());
  const char *env = getenv("TANDEM_CPU");
  if (!env || !*env) {
    CHECK_EQ_INT(td_cpu_active(), td_cpu_supported());
    CHECK_OK(td_cpu_check());
  }
  CHECK_EQ_INT(strcmp(td_cpu_kernel_level(), td_cpu_level_name(td_cpu_active())), 0);

  /* detection against /proc/cpuinfo (skipped under an emulator, whose
   * /proc/cpuinfo is the host's: TD_TEST_NO_CPUINFO=1) */
  FILE *f = getenv("TD_TEST_NO_CPUINFO") ? NULL : fopen("/proc/cpuinfo", "r");
  if (f) {
    char line[8192];
    int expect = -1;
    while (fgets(line, sizeof line, f))
      if (strncmp(line, "flags", 5) == 0) {
        int v3 = cpuinfo_has(line, "avx2") && cpuinfo_has(line, "fma") && cpuinfo_has(line, "f16c");
        int v4 = cpuinfo_has(line, "avx512f") && cpuinfo_has(line, "avx512bw") && cpuinfo_has(line, "avx512dq") &&
                 cpuinfo_has(line, "avx512vl");
        int bf16 = cpuinfo_has(line, "avx512_bf16");
        expect = v3 && v4 && bf16 ? TD_CPU_AVX512BF16 : v3 && v4 ? TD_CPU_AVX512 : v3 ? TD_CPU_AVX2 : TD_CPU_GENERIC;
        break;
      }
    fclose(f);
    if (expect >= 0) {
      printf("cpu level: detected %s, /proc/cpuinfo says %s\n", td_cpu_level_name(td_cpu_supported()),
             td_cpu_level_name((td_cpu_level)expect));
      CHECK_EQ_INT(td_cpu_supported(), expect);
    }
  }
}

/* The reduction kernels of every CPU level this machine supports give the
 * same bits as the generic level's (reduce_kernels.h): every dtype and op,
 * through every entry point, on counts around the vector widths and tile
 * sizes, with NaNs (payloads), infinities, -0 and subnormals among the
 * inputs. Exact equality, not a tolerance: the kernels combine elementwise
 * in a fixed order, and no level may contract or reorder them. */
static uint64_t lv_rng = 0x1234567;
static uint64_t lv_next(void) {
  lv_rng = lv_rng * 6364136223846793005ull + 1442695040888963407ull;
  return lv_rng >> 16;
}
static void lv_fill(void *buf, size_t count, td_dtype dtype) {
  size_t es = td_dtype_size(dtype);
  unsigned char *p = buf;
  for (size_t i = 0; i < count; i++) {
    uint64_t r = lv_next();
    if (dtype == TD_F32) {
      static const uint32_t special[] = {0x7fc00000u, 0x7f800001u, 0xffc12345u, 0x7f800000u, 0xff800000u,
                                         0x80000000u, 0x00000001u, 0x807fffffu};
      float f = (float)((int64_t)(r % 2000001) - 1000000) / 997.0f;
      uint32_t bits;
      memcpy(&bits, &f, 4);
      if (r % 53 == 0) bits = special[(r >> 20) % 8];
      memcpy(p + i * 4, &bits, 4);
    } else if (dtype == TD_F64) {
      double d = (double)((int64_t)(r % 2000001) - 1000000) / 997.0;
      if (r % 53 == 0) d = (r >> 20) % 2 ? NAN : -0.0;
      memcpy(p + i * 8, &d, 8);
    } else if (dtype == TD_F16 || dtype == TD_BF16) {
      uint16_t h = (uint16_t)r; /* any bit pattern: NaNs, infinities, subnormals included */
      if (dtype == TD_F16 && (h & 0x7c00) == 0x7c00 && r % 7) h &= 0xbfff; /* mostly finite */
      if (dtype == TD_BF16 && (h & 0x7f80) == 0x7f80 && r % 7) h &= 0xbfff;
      memcpy(p + i * 2, &h, 2);
    } else {
      memcpy(p + i * es, &r, es);
    }
  }
}

static void test_reduce_levels_agree(void) {
  td_cpu_level top = td_cpu_supported();
  const td_dtype dtypes[] = {TD_F32, TD_F64, TD_F16, TD_BF16, TD_I32, TD_I64, TD_U8};
  const td_op ops[] = {TD_SUM, TD_PROD, TD_MIN, TD_MAX, TD_AVG};
  const size_t counts[] = {0, 1, 7, 15, 16, 17, 33, 2047, 2049, 5003};
  enum { MAXN = 5003, NS = 5 };
  int compared = 0;
  CHECK(td_reduce_kernels_for(TD_CPU_GENERIC)->k_td_reduce_multi != td_reduce_kernels_for(TD_CPU_AVX2)->k_td_reduce_multi);
  for (size_t di = 0; di < TD_ARRAY_SIZE(dtypes); di++) {
    td_dtype dt = dtypes[di];
    size_t es = td_dtype_size(dt), bytes = MAXN * es;
    unsigned char *src[NS], *out[TD_CPU_LEVELS][4];
    for (int k = 0; k < NS; k++) src[k] = malloc(bytes), lv_fill(src[k], MAXN, dt);
    for (int l = 0; l < TD_CPU_LEVELS; l++)
      for (int j = 0; j < 4; j++) out[l][j] = malloc(bytes * 3);
    for (size_t oi = 0; oi < TD_ARRAY_SIZE(ops); oi++)
      for (size_t ci = 0; ci < TD_ARRAY_SIZE(counts); ci++) {
        size_t n = counts[ci];
        for (int l = 0; l <= (int)top; l++) {
          const td_reduce_kernels *k = td_reduce_kernels_for((td_cpu_level)l);
          for (int j = 0; j < 4; j++) memset(out[l][j], 0xa5, bytes * 3); /* what no kernel writes stays equal */
          memcpy(out[l][0], src[0], bytes);
          k->k_td_reduce_inplace(out[l][0], src[1], n, dt, ops[oi]);
          const void *srcs[NS] = {src[0], src[1], src[2], src[3], src[4]};
          k->k_td_reduce_multi(out[l][1], srcs, NS, n, dt, ops[oi]);
          void *dsts[2] = {out[l][2], out[l][3]};
          memcpy(out[l][2], src[2], bytes), memcpy(out[l][3], src[3], bytes);
          k->k_td_reduce_fanout(dsts, 2, srcs, 3, n, dt, ops[oi]);
          k->k_td_reduce_scale(out[l][1], n, dt, 3);
          if (dt == TD_F16 || dt == TD_BF16) { /* the f32 partials' conversions, into the spare half of out[l][2] */
            float *wide = (float *)(out[l][2] + ((bytes + 63) & ~(size_t)63)); /* n / 2 floats fit in 2 MAXN bytes */
            k->k_td_reduce_half_to_f32(wide, src[4], n / 2, dt);
            k->k_td_reduce_f32_to_half(out[l][3] + bytes, wide, n / 2, dt, 3);
          }
        }
        for (int l = 1; l <= (int)top; l++)
          for (int j = 0; j < 4; j++) {
            if (memcmp(out[l][j], out[0][j], bytes * 3) != 0)
              td_test_fail(__FILE__, __LINE__, "%s %s count %zu: level %s's output %d differs from generic's",
                           td_dtype_name(dt), td_op_name(ops[oi]), n, td_cpu_level_name((td_cpu_level)l), j);
            compared++;
          }
      }
    for (int k = 0; k < NS; k++) free(src[k]);
    for (int l = 0; l < TD_CPU_LEVELS; l++)
      for (int j = 0; j < 4; j++) free(out[l][j]);
  }
  printf("reduce kernels: %d outputs at levels above generic (up to %s) equal generic's bit for bit\n", compared,
         td_cpu_level_name(top));
}

/* td_buf against a reference built independently: every piece also goes
 * through snprintf into a fixed array, and the two must agree byte for byte
 * across many growths (lines longer than the free room, binary bytes, NULs). */
static void test_text_buf(void) {
  td_buf b = {0};
  size_t len = 7;
  char *empty = td_buf_take(&b, &len); /* nothing appended: "" of length 0 */
  CHECK(empty != NULL);
  CHECK_EQ_INT(len, 0);
  CHECK_EQ_INT(empty[0], 0);
  free(empty);
  CHECK(b.data == NULL && b.len == 0 && b.cap == 0);

  enum { REF_CAP = 1 << 16 };
  char *ref = malloc(REF_CAP);
  CHECK(ref != NULL);
  size_t ref_len = 0;
  char wide[700];
  memset(wide, 'w', sizeof wide - 1);
  wide[sizeof wide - 1] = 0;
  for (int i = 0; i < 300; i++) {
    if (i % 7 == 3) { /* a line longer than any room left: formats twice */
      td_buf_printf(&b, "[%d:%s]", i, wide);
      ref_len += (size_t)snprintf(ref + ref_len, REF_CAP - ref_len, "[%d:%s]", i, wide);
    } else if (i % 5 == 0) { /* raw bytes, a NUL among them */
      const char raw[3] = {'x', 0, (char)i};
      td_buf_append(&b, raw, sizeof raw);
      memcpy(ref + ref_len, raw, sizeof raw);
      ref_len += sizeof raw;
    } else {
      td_buf_printf(&b, "%d %.3f %s\n", i, i / 8.0, i % 2 ? "odd" : "even");
      ref_len += (size_t)snprintf(ref + ref_len, REF_CAP - ref_len, "%d %.3f %s\n", i, i / 8.0, i % 2 ? "odd" : "even");
    }
    CHECK(!b.failed);
    CHECK_EQ_INT(b.len, ref_len);
    CHECK(b.cap > b.len && b.data[b.len] == 0); /* always NUL-terminated */
  }
  CHECK(ref_len < REF_CAP);
  td_buf_append(&b, "", 0); /* nothing: no change */
  td_buf_printf(&b, "%s", "");
  CHECK_EQ_INT(b.len, ref_len);
  char *text = td_buf_take(&b, &len);
  CHECK(text != NULL);
  CHECK_EQ_INT(len, ref_len);
  CHECK(memcmp(text, ref, ref_len) == 0);
  free(text);
  free(ref);

  /* Out of memory (here: a size no allocation can hold) is sticky: later
   * appends do nothing, take frees what there was and gives NULL. */
  td_buf_printf(&b, "kept until the failure");
  td_buf_append(&b, "x", SIZE_MAX - 4);
  CHECK(b.failed);
  CHECK_EQ_INT(b.len, strlen("kept until the failure"));
  td_buf_printf(&b, "%d", 12345);
  td_buf_append(&b, "abc", 3);
  CHECK_EQ_INT(b.len, strlen("kept until the failure"));
  len = 99;
  CHECK(td_buf_take(&b, &len) == NULL);
  CHECK_EQ_INT(len, 99); /* untouched on failure */
  CHECK(b.data == NULL && !b.failed);
  td_buf_printf(&b, "again");
  CHECK(strcmp(b.data, "again") == 0);
  td_buf_free(&b);
  td_buf_free(&b); /* twice, and NULL: both fine */
  td_buf_free(NULL);

  /* A whole file (several reads), and one cut short past a limit. */
  FILE *f = tmpfile();
  CHECK(f != NULL);
  for (int i = 0; i < 200000; i++) fputc('a' + i % 26, f);
  rewind(f);
  CHECK(td_buf_append_file(&b, f, SIZE_MAX) == 0);
  CHECK_EQ_INT(b.len, 200000);
  for (int i = 0; i < 200000; i++)
    if (b.data[i] != 'a' + i % 26) td_test_fail(__FILE__, __LINE__, "byte %d of the file read back differs", i);
  CHECK_EQ_INT(b.data[b.len], 0);
  td_buf_free(&b);
  rewind(f);
  CHECK(td_buf_append_file(&b, f, 1000) == 0); /* stops once past 1000 bytes, long before the end */
  CHECK(b.len > 1000 && b.len < 200000);
  td_buf_free(&b);
  fclose(f);
  printf("text buffer: 300 pieces over many growths equal snprintf's; failure sticky; a file read whole and cut\n");
}

/* td_process_age: it grows as the monotonic clock does while the process
 * sleeps, and a child forked later is younger than its parent by at least
 * the parent's life before the fork (the kernel's start times, not ours). */
static void test_process_age(void) {
  double a = td_process_age(), t0 = td_now();
  CHECK(a >= 0);
  struct timespec ts = {0, 300 * 1000 * 1000};
  while (nanosleep(&ts, &ts) != 0) {
  }
  double b = td_process_age(), slept = td_now() - t0;
  CHECK(b - a >= slept - 0.001); /* the same start time: the difference is BOOTTIME's, at least MONOTONIC's */
  int fds[2];
  CHECK(pipe(fds) == 0);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    double child = td_process_age();
    ssize_t w = write(fds[1], &child, sizeof child);
    _exit(w == (ssize_t)sizeof child ? 0 : 1);
  }
  double child = -1;
  CHECK(read(fds[0], &child, sizeof child) == (ssize_t)sizeof child);
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
  close(fds[0]), close(fds[1]);
  double parent = td_process_age();
  CHECK(child >= 0);
  CHECK(parent - child >= 0.29); /* the parent had lived 0.3 s before the fork; ticks are 10 ms */
}

int main(void) {
  test_process_age();
  test_half_roundtrip();
  test_reduce_kernels();
  test_half_kernels_match_reference();
  test_minmax_nan_and_wrap();
  test_dtype_get_set();
  test_shard();
  test_parse();
  test_futex();
  test_cpu_level();
  test_reduce_levels_agree();
  test_text_buf();
  printf("test_base: ok\n");
  return 0;
}
