/* Numerical contract of the reductions, through the public API, on whatever
 * transport and algorithm the suite line selects (TANDEM_TRANSPORT,
 * TANDEM_ALLREDUCE_ALGO, TANDEM_SHM_COLLECTIVES), with every reference
 * computed here independently of the library (own half-precision decoding,
 * exact sums in double, wrap-around in unsigned arithmetic):
 *
 *   test_numerics nan    f32/f64/f16/bf16 MIN and MAX with NaNs, signed
 *                        zeros and NaN payloads: NaN propagates as the
 *                        canonical quiet NaN, -0 < +0, and every rank has
 *                        the same bits (allgathered and compared); SUM with
 *                        NaNs: every rank has the same bits
 *   test_numerics wrap   i32/i64/u8 SUM, PROD and AVG that overflow: the
 *                        result wraps modulo 2^bits (closed form)
 *   test_numerics half   f16/bf16 SUM and AVG of non-integer inputs with
 *                        cancellation (the +100, 0.02, -100, 0.02 case): the
 *                        result is the exact sum rounded once to the half
 *                        type, within the f32 accumulation error
 *   test_numerics overflow  counts whose byte size overflows, td_mem_alloc
 *                        of nearly SIZE_MAX, a NaN or huge config timeout:
 *                        TD_ERR_INVALID_ARGUMENT, and the communicator lives on
 *   test_numerics all    all of the above (the default)
 *   test_numerics badenv VAR   (VAR set to a bad value) td_comm_init refuses
 *                        it with TD_ERR_INVALID_ARGUMENT naming VAR
 *   options: --large (counts 7 and 70001: past the single-sync shm path at 4+ ranks), --shared
 *   (buffers from td_mem_alloc, so that large shm reductions go direct)
 *
 * Each check covers allreduce (in and out of place), reduce at every root
 * and reduce-scatter, at counts that exercise vector lanes and scalar tails. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/check.h"
#include "comm_test_util.h"

static int g_rank, g_size;
static td_comm *g_comm;

/* --large adds a count past the single-sync shm path (pipelined slots), and
 * --shared allocates with td_mem_alloc (host-shared: the direct shm paths). */
static size_t k_counts[] = {1, 7, 37, 1000, 4099, 0};
static size_t n_counts = 5;
static bool g_shared;
static bool g_half_partials; /* TANDEM_HALF_PARTIALS=half: the documented looser bound */

/* ---- independent half-precision encoding and decoding ---- */

static double dec_f16(uint16_t h) {
  int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  double s = (h & 0x8000) ? -1.0 : 1.0;
  if (e == 0) return s * ldexp(m, -24);
  if (e == 31) return m ? NAN : s * INFINITY;
  return s * ldexp(m | 0x400, e - 25);
}
static double dec_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
/* v must be exactly representable as a normal half or zero. */
static uint16_t enc_f16_exact(double v) {
  if (v == 0) return signbit(v) ? 0x8000 : 0;
  int e;
  double m = frexp(fabs(v), &e); /* v = m * 2^e, m in [0.5, 1) */
  uint16_t bits = (uint16_t)(((e + 14) << 10) | ((int)ldexp(m, 11) & 0x3ff));
  return (uint16_t)(bits | (v < 0 ? 0x8000 : 0));
}
static uint16_t enc_bf16_exact(double v) {
  float f = (float)v;
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16);
}

/* ---- helpers ---- */

static void *xmalloc(size_t bytes) {
  void *p = NULL;
  if (g_shared) CHECK_OK(td_mem_alloc(bytes ? bytes : 1, &p));
  else p = malloc(bytes ? bytes : 1);
  CHECK(p != NULL);
  return p;
}
static void xfree(void *p) {
  if (g_shared) td_mem_free(p);
  else free(p);
}

static uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

/* Every rank's `bytes` of result are the same bits: allgather and compare. */
static void check_same_everywhere(const void *buf, size_t bytes, const char *what) {
  uint8_t *all = xmalloc(bytes * (size_t)g_size);
  CHECK_OK(td_allgather(buf, all, bytes * (size_t)g_size, TD_U8, g_comm));
  for (int r = 0; r < g_size; r++)
    for (size_t b = 0; b < bytes; b++)
      if (all[(size_t)r * bytes + b] != all[b])
        td_test_fail(__FILE__, __LINE__, "rank %d: %s: rank %d and rank 0 differ at byte %zu (%#x vs %#x)", g_rank,
                     what, r, b, all[(size_t)r * bytes + b], all[b]);
  xfree(all);
}

/* ---- NaN, signed zeros, MIN/MAX ---- */

static const td_dtype k_float_types[] = {TD_F32, TD_F64, TD_F16, TD_BF16};

/* Rank r's element i: a NaN (payload and sign vary with the rank), a signed
 * zero, or a small exact value; kind chosen so that some elements have NaNs
 * on some ranks only, and some have -0 on one rank and +0 on another. */
typedef struct elem { int kind; double v; unsigned payload; bool neg; } elem;
static elem nan_input(int r, size_t i) {
  uint64_t h = mix(i * 131 + (uint64_t)r * 7919 + 17);
  elem e = {0, 0, (unsigned)(r * 5 + 1), (r & 1) != 0};
  int k = (int)(h % 12);
  if (k == 0 && i % 3 == 0) e.kind = 1;                 /* NaN */
  else if (k <= 2) { e.kind = 2; e.neg = (h >> 8) & 1; } /* zero of either sign */
  else e.v = ((int)((h >> 16) % 23) - 11) * 0.5;
  return e;
}

static void store_elem(void *buf, size_t i, td_dtype dt, elem e) {
  switch (dt) {
  case TD_F32: {
    uint32_t u;
    float f = e.kind == 2 ? (e.neg ? -0.0f : 0.0f) : (float)e.v;
    memcpy(&u, &f, 4);
    if (e.kind == 1) u = (e.neg ? 0x80000000u : 0) | 0x7fc00000u | e.payload;
    ((uint32_t *)buf)[i] = u;
    break;
  }
  case TD_F64: {
    uint64_t u;
    double d = e.kind == 2 ? (e.neg ? -0.0 : 0.0) : e.v;
    memcpy(&u, &d, 8);
    if (e.kind == 1) u = (e.neg ? 0x8000000000000000ull : 0) | 0x7ff8000000000000ull | ((uint64_t)e.payload << 20);
    ((uint64_t *)buf)[i] = u;
    break;
  }
  case TD_F16:
  case TD_BF16: {
    double d = e.kind == 2 ? (e.neg ? -0.0 : 0.0) : e.v;
    uint16_t u = dt == TD_F16 ? enc_f16_exact(d) : enc_bf16_exact(d);
    if (e.kind == 1) u = (uint16_t)((e.neg ? 0x8000 : 0) | (dt == TD_F16 ? 0x7e00 : 0x7fc0) | e.payload);
    ((uint16_t *)buf)[i] = u;
    break;
  }
  default: break;
  }
}

/* The bits MIN/MAX over all ranks must give for element i. */
static uint64_t minmax_want(size_t i, td_dtype dt, td_op op) {
  bool any_nan = false, seeded = false;
  double best = 0;
  for (int r = 0; r < g_size; r++) {
    elem e = nan_input(r, i);
    if (e.kind == 1) { any_nan = true; continue; }
    double d = e.kind == 2 ? (e.neg ? -0.0 : 0.0) : e.v;
    if (!seeded) { best = d; seeded = true; continue; }
    bool take = op == TD_MIN ? (d < best || (d == best && signbit(d))) : (d > best || (d == best && !signbit(d)));
    if (take) best = d;
  }
  if (any_nan && g_size == 1) { /* nothing is combined: the input comes back as it is */
    uint8_t in[8];
    store_elem(in, 0, dt, nan_input(0, i));
    return dt == TD_F32 ? *(uint32_t *)in : dt == TD_F64 ? *(uint64_t *)in : *(uint16_t *)in;
  }
  if (any_nan) {
    switch (dt) {
    case TD_F32: return 0x7fc00000u;
    case TD_F64: return 0x7ff8000000000000ull;
    case TD_F16: return 0x7e00;
    default: return 0x7fc0;
    }
  }
  uint8_t tmp[8];
  elem w = {best == 0 ? 2 : 0, best, 0, signbit(best) != 0};
  store_elem(tmp, 0, dt, w);
  switch (dt) {
  case TD_F32: return *(uint32_t *)tmp;
  case TD_F64: return *(uint64_t *)tmp;
  default: return *(uint16_t *)tmp;
  }
}

static uint64_t load_bits(const void *buf, size_t i, td_dtype dt) {
  switch (dt) {
  case TD_F32: return ((const uint32_t *)buf)[i];
  case TD_F64: return ((const uint64_t *)buf)[i];
  default: return ((const uint16_t *)buf)[i];
  }
}

static bool is_nan_bits(uint64_t u, td_dtype dt) {
  switch (dt) {
  case TD_F32: return (u & 0x7fffffffu) > 0x7f800000u;
  case TD_F64: return (u & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
  case TD_F16: return (u & 0x7fff) > 0x7c00;
  default: return (u & 0x7fff) > 0x7f80;
  }
}

static void check_minmax_elem(const char *what, const void *buf, size_t i, size_t at, td_dtype dt, td_op op,
                              size_t count) {
  uint64_t got = load_bits(buf, i, dt), want = minmax_want(at, dt, op);
  if (got != want)
    td_test_fail(__FILE__, __LINE__, "rank %d of %d (%s): %s %s %s count %zu element %zu: bits %#llx, want %#llx",
                 g_rank, g_size, td_comm_transport(g_comm), what, td_dtype_name(dt), td_op_name(op), count, at,
                 (unsigned long long)got, (unsigned long long)want);
}

static void test_nan(void) {
  for (size_t ti = 0; ti < CT_ARRAY_SIZE(k_float_types); ti++) {
    td_dtype dt = k_float_types[ti];
    size_t es = td_dtype_size(dt);
    for (size_t ci = 0; ci < n_counts; ci++) {
      size_t count = k_counts[ci];
      char *send = xmalloc(count * es), *recv = xmalloc(count * es);
      for (size_t i = 0; i < count; i++) store_elem(send, i, dt, nan_input(g_rank, i));
      td_op ops[] = {TD_MIN, TD_MAX, TD_SUM};
      for (int oi = 0; oi < 3; oi++) {
        td_op op = ops[oi];
        /* allreduce, out of place and in place */
        for (int in_place = 0; in_place <= 1; in_place++) {
          char *out = recv;
          if (in_place) memcpy(out, send, count * es);
          CHECK_OK(td_allreduce(in_place ? out : send, out, count, dt, op, g_comm));
          check_same_everywhere(out, count * es, "allreduce with NaNs");
          for (size_t i = 0; i < count; i++) {
            if (op != TD_SUM) {
              check_minmax_elem("allreduce", out, i, i, dt, op, count);
            } else {
              bool any = false;
              for (int r = 0; r < g_size; r++) any |= nan_input(r, i).kind == 1;
              if (any && !is_nan_bits(load_bits(out, i, dt), dt))
                td_test_fail(__FILE__, __LINE__, "rank %d: sum of a NaN is not NaN (%s element %zu)", g_rank,
                             td_dtype_name(dt), i);
            }
          }
        }
        if (op == TD_SUM) continue;
        /* reduce-scatter: this rank's shard */
        size_t base = count / (size_t)g_size, extra = count % (size_t)g_size;
        size_t len = base + ((size_t)g_rank < extra), off = (size_t)g_rank * base + ((size_t)g_rank < extra ? (size_t)g_rank : extra);
        CHECK_OK(td_reduce_scatter(send, recv, count, dt, op, g_comm));
        for (size_t i = 0; i < len; i++) check_minmax_elem("reduce_scatter", recv, i, off + i, dt, op, count);
        /* reduce to the last rank */
        int root = g_size - 1;
        CHECK_OK(td_reduce(send, recv, count, dt, op, root, g_comm));
        if (g_rank == root)
          for (size_t i = 0; i < count; i++) check_minmax_elem("reduce", recv, i, i, dt, op, count);
      }
      xfree(send);
      xfree(recv);
    }
  }
}

/* ---- integer wrap-around ---- */

static void test_wrap(void) {
  const td_dtype types[] = {TD_I32, TD_I64, TD_U8};
  const td_op ops[] = {TD_SUM, TD_PROD, TD_AVG};
  for (size_t ti = 0; ti < CT_ARRAY_SIZE(types); ti++) {
    td_dtype dt = types[ti];
    size_t es = td_dtype_size(dt);
    for (size_t oi = 0; oi < CT_ARRAY_SIZE(ops); oi++) {
      td_op op = ops[oi];
      for (size_t ci = 0; ci < n_counts; ci++) {
        size_t count = k_counts[ci];
        char *send = xmalloc(count * es), *recv = xmalloc(count * es);
        /* Values near the top of the range, so that any two ranks overflow. */
        for (size_t i = 0; i < count; i++) {
          uint64_t v = op == TD_PROD ? 0x10001ull * (uint64_t)(g_rank + 2) + i : 0x7fffffffffffff00ull - i * 3 + (uint64_t)g_rank;
          if (dt == TD_I32) ((uint32_t *)send)[i] = op == TD_PROD ? (uint32_t)v : 0x7fffff00u - (uint32_t)i * 3 + (uint32_t)g_rank;
          if (dt == TD_I64) ((uint64_t *)send)[i] = v;
          if (dt == TD_U8) ((uint8_t *)send)[i] = (uint8_t)(op == TD_PROD ? v : 250 - i % 7 + (size_t)g_rank);
        }
        CHECK_OK(td_allreduce(send, recv, count, dt, op, g_comm));
        for (size_t i = 0; i < count; i++) {
          /* Closed form in unsigned arithmetic: every rank's value, combined. */
          uint64_t acc = op == TD_PROD ? 1 : 0;
          for (int r = 0; r < g_size; r++) {
            uint64_t v;
            if (dt == TD_I32) v = op == TD_PROD ? (uint32_t)(0x10001ull * (uint64_t)(r + 2) + i) : 0x7fffff00u - (uint32_t)i * 3 + (uint32_t)r;
            else if (dt == TD_I64) v = op == TD_PROD ? 0x10001ull * (uint64_t)(r + 2) + i : 0x7fffffffffffff00ull - i * 3 + (uint64_t)r;
            else v = (uint8_t)(op == TD_PROD ? 0x10001ull * (uint64_t)(r + 2) + i : 250 - i % 7 + (size_t)r);
            acc = op == TD_PROD ? acc * v : acc + v;
          }
          int64_t want;
          if (dt == TD_I32) {
            int32_t w = (int32_t)(uint32_t)acc;
            want = op == TD_AVG ? w / g_size : w;
          } else if (dt == TD_I64) {
            int64_t w = (int64_t)acc;
            want = op == TD_AVG ? w / g_size : w;
          } else {
            uint8_t w = (uint8_t)acc;
            want = op == TD_AVG ? w / g_size : w;
          }
          int64_t got = dt == TD_I32 ? ((int32_t *)recv)[i] : dt == TD_I64 ? ((int64_t *)recv)[i] : ((uint8_t *)recv)[i];
          if (got != want)
            td_test_fail(__FILE__, __LINE__, "rank %d of %d: allreduce %s %s count %zu element %zu: %lld, want %lld",
                         g_rank, g_size, td_dtype_name(dt), td_op_name(op), count, i, (long long)got,
                         (long long)want);
        }
        xfree(send);
        xfree(recv);
      }
    }
  }
  /* The headline case: INT32_MAX + 1 (+ 1 ...) over every rank. */
  int32_t v = g_rank == 0 ? INT32_MAX : 1, out = 0;
  CHECK_OK(td_allreduce(&v, &out, 1, TD_I32, TD_SUM, g_comm));
  CHECK_EQ_INT(out, (int32_t)(0x7fffffffu + (uint32_t)(g_size - 1)));
}

/* ---- half precision: one rounding of the f32 sum ---- */

/* The spacing of half values at magnitude |x| (f16: 11 significant bits,
 * subnormal spacing 2^-24; bf16: 8 bits). */
static double half_ulp(double x, td_dtype dt) {
  x = fabs(x);
  int e;
  frexp(x, &e); /* x in [2^(e-1), 2^e) */
  if (dt == TD_F16) return x < ldexp(1, -14) ? ldexp(1, -24) : ldexp(1, e - 11);
  return x < ldexp(1, -126) ? ldexp(1, -133) : ldexp(1, e - 8);
}

/* Rank r's element i: a non-integer of either sign whose magnitude varies
 * by 2^10 across ranks, so that partial sums lose bits when rounded to the
 * half type; element 0 is the reported case (+100, 0.02, -100, 0.02, then
 * 0.02 for ranks beyond 4). */
static uint16_t half_input(int r, size_t i, td_dtype dt) {
  double v;
  if (i == 0) {
    v = r % 4 == 0 ? 100.0 : r % 4 == 2 ? -100.0 : 0.02;
    if (r >= 4) v = 0.02;
  } else {
    uint64_t h = mix(i * 977 + (uint64_t)r * 104729 + 5);
    double m = 1.0 + (double)(h % 1000) / 1000.0; /* non-integer mantissa */
    int e = (int)((h >> 20) % 11) - 5;            /* 2^-5 .. 2^5 */
    v = ((h >> 40) & 1 ? -m : m) * ldexp(1, e);
  }
  /* round to the half type here, by hand: f16 by scaling to its grid */
  if (dt == TD_F16) {
    double u = half_ulp(v, TD_F16);
    return enc_f16_exact(nearbyint(v / u) * u);
  }
  double u = half_ulp(v, TD_BF16);
  return enc_bf16_exact(nearbyint(v / u) * u);
}

static void check_half(const char *what, const uint16_t *out, size_t i, size_t at, td_dtype dt, td_op op,
                       size_t count) {
  double s = 0, a = 0;
  for (int r = 0; r < g_size; r++) {
    double x = dt == TD_F16 ? dec_f16(half_input(r, at, dt)) : dec_bf16(half_input(r, at, dt));
    s += x; /* exact: at most 8 values of at most 11 bits within 2^-30..2^6 */
    a += fabs(x);
  }
  /* The f32 partial sums: n-1 additions, each off by at most 2^-24 of a
   * partial sum bounded by a; then one rounding to the half type (half an
   * ulp at the magnitude reached). AVG: divided in f32 (one more 2^-24). */
  double delta = (g_size - 1) * ldexp(a, -24) * 1.0001;
  double want = s;
  if (op == TD_AVG) {
    want = s / g_size;
    delta = delta / g_size + ldexp(fabs(want), -24);
  }
  double got = dt == TD_F16 ? dec_f16(out[i]) : dec_bf16(out[i]);
  double bound = delta + 0.5 * half_ulp(fabs(want) + delta, dt);
  if (g_half_partials) {
    /* TANDEM_HALF_PARTIALS=half (docs/collectives.md, "Half precision"): up to n-1 roundings of partial
     * sums bounded by sum |x|, then (AVG) the division rounded once more. */
    bound = delta + (g_size - 1) * 0.5 * half_ulp(a, dt);
    if (op == TD_AVG) bound = bound / g_size + 0.5 * half_ulp(fabs(want) + bound, dt);
  }
  if (!(fabs(got - want) <= bound))
    td_test_fail(__FILE__, __LINE__,
                 "rank %d of %d (%s): %s %s %s count %zu element %zu: %.9g, exact %.9g, off by %.3g > bound %.3g "
                 "(%.2f ulp)",
                 g_rank, g_size, td_comm_transport(g_comm), what, td_dtype_name(dt), td_op_name(op), count, at, got,
                 want, fabs(got - want), bound, fabs(got - want) / half_ulp(want, dt));
}

static void test_half(void) {
  const td_dtype types[] = {TD_F16, TD_BF16};
  const td_op ops[] = {TD_SUM, TD_AVG};
  for (size_t ti = 0; ti < 2; ti++) {
    td_dtype dt = types[ti];
    for (size_t oi = 0; oi < 2; oi++) {
      td_op op = ops[oi];
      for (size_t ci = 0; ci < n_counts; ci++) {
        size_t count = k_counts[ci];
        uint16_t *send = xmalloc(count * 2), *recv = xmalloc(count * 2);
        for (size_t i = 0; i < count; i++) send[i] = half_input(g_rank, i, dt);
        CHECK_OK(td_allreduce(send, recv, count, dt, op, g_comm));
        for (size_t i = 0; i < count; i++) check_half("allreduce", recv, i, i, dt, op, count);
        check_same_everywhere(recv, count * 2, "half allreduce");
        memcpy(recv, send, count * 2);
        CHECK_OK(td_allreduce(recv, recv, count, dt, op, g_comm)); /* in place */
        for (size_t i = 0; i < count; i++) check_half("allreduce in place", recv, i, i, dt, op, count);
        size_t base = count / (size_t)g_size, extra = count % (size_t)g_size;
        size_t len = base + ((size_t)g_rank < extra), off = (size_t)g_rank * base + ((size_t)g_rank < extra ? (size_t)g_rank : extra);
        CHECK_OK(td_reduce_scatter(send, recv, count, dt, op, g_comm));
        for (size_t i = 0; i < len; i++) check_half("reduce_scatter", recv, i, off + i, dt, op, count);
        for (int root = 0; root < g_size; root += g_size > 2 ? g_size - 1 : 1) {
          CHECK_OK(td_reduce(send, recv, count, dt, op, root, g_comm));
          if (g_rank == root)
            for (size_t i = 0; i < count; i++) check_half("reduce", recv, i, i, dt, op, count);
        }
        xfree(send);
        xfree(recv);
      }
    }
  }
}

/* ---- sizes and settings that cannot be honoured ---- */

/* td_comm_init must refuse the environment this process was started with
 * (one bad TANDEM_* variable, named `var`) with TD_ERR_INVALID_ARGUMENT and a
 * message naming the variable, before connecting to anything. */
static int test_bad_env(const char *var) {
  td_comm *comm = NULL;
  CHECK_STATUS(td_comm_init(&comm), TD_ERR_INVALID_ARGUMENT);
  CHECK(comm == NULL);
  if (!strstr(td_last_error(), var))
    td_test_fail(__FILE__, __LINE__, "the error does not name %s: %s", var, td_last_error());
  printf("test_numerics badenv %s=%s: refused: %s\n", var, getenv(var), td_last_error());
  return 0;
}

/* Counts whose byte size overflows, and a config timeout that is not a
 * number: TD_ERR_INVALID_ARGUMENT with a message, never a crash. */
static void test_overflow(void) {
  td_comm_config cfg = {0};
  cfg.timeout_s = NAN;
  td_comm *bad = NULL;
  CHECK_STATUS(td_comm_init_config(&cfg, &bad), TD_ERR_INVALID_ARGUMENT);
  CHECK(strstr(td_last_error(), "timeout") != NULL);
  cfg.timeout_s = 1e300;
  CHECK_STATUS(td_comm_init_config(&cfg, &bad), TD_ERR_INVALID_ARGUMENT);
  void *p = (void *)1;
  CHECK_STATUS(td_mem_alloc(SIZE_MAX - 10, &p), TD_ERR_INVALID_ARGUMENT);
  CHECK(p == NULL);
  char buf[16];
  CHECK_STATUS(td_allreduce(buf, buf, SIZE_MAX / 2 + 1, TD_F16, TD_SUM, g_comm), TD_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(td_allreduce(buf, buf, SIZE_MAX / 4 + 1, TD_F32, TD_SUM, g_comm), TD_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(td_reduce_scatter(buf, buf, SIZE_MAX / 8 + 1, TD_F64, TD_SUM, g_comm), TD_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(td_broadcast(buf, SIZE_MAX / 8 + 1, TD_I64, 0, g_comm), TD_ERR_INVALID_ARGUMENT);
  if (g_size > 1)
    CHECK_STATUS(td_alltoall(buf, buf + 8, SIZE_MAX / (size_t)g_size + 1, TD_U8, g_comm), TD_ERR_INVALID_ARGUMENT);
  CHECK(strstr(td_last_error(), "overflow") != NULL);
  /* The communicator is still healthy: a bad argument fails only the call. */
  int32_t one = 1, sum = 0;
  CHECK_OK(td_allreduce(&one, &sum, 1, TD_I32, TD_SUM, g_comm));
  CHECK_EQ_INT(sum, g_size);
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 && argv[1][0] != '-' ? argv[1] : "all";
  if (!strcmp(mode, "badenv") && argc > 2) return test_bad_env(argv[2]);
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--large")) { k_counts[0] = 7; k_counts[1] = 70001; n_counts = 2; }
    if (!strcmp(argv[i], "--shared")) g_shared = true;
  }
  g_half_partials = getenv("TANDEM_HALF_PARTIALS") && !strcmp(getenv("TANDEM_HALF_PARTIALS"), "half");
  CHECK_OK(td_comm_init(&g_comm));
  g_rank = td_comm_rank(g_comm);
  g_size = td_comm_size(g_comm);
  bool all = !strcmp(mode, "all");
  if (all || !strcmp(mode, "nan")) test_nan();
  if (all || !strcmp(mode, "wrap")) test_wrap();
  if (all || !strcmp(mode, "half")) test_half();
  if (all || !strcmp(mode, "overflow")) test_overflow();
  if (!all && strcmp(mode, "nan") && strcmp(mode, "wrap") && strcmp(mode, "half") && strcmp(mode, "overflow")) {
    fprintf(stderr, "usage: test_numerics [all|nan|wrap|half|overflow] [--large] [--shared] | badenv VAR\n");
    return 2;
  }
  if (g_rank == 0) printf("test_numerics %s: ok (%d ranks, %s)\n", mode, g_size, td_comm_transport(g_comm));
  CHECK_OK(td_comm_finalize(g_comm));
  td_comm_destroy(g_comm);
  return 0;
}
