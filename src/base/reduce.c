/* Reduction kernels for every dtype and op. Written as plain loops over
 * restrict pointers so that gcc -O3 vectorizes them (SSE2, AVX2 or AVX-512:
 * this file is compiled once per CPU level, reduce_kernels.h); measured
 * before reaching for intrinsics. f16 and bf16 are
 * widened to f32, combined, and rounded once.
 *
 * Semantics every path shares (docs/collectives.md, "Reductions"), chosen so that the
 * result never depends on which rank combined which operands in which order:
 *   - Integer SUM and PROD wrap around modulo 2^bits (computed in unsigned
 *     arithmetic: signed overflow would be undefined behaviour).
 *   - Floating MIN and MAX are commutative bit for bit: if either operand is
 *     a NaN the result is the canonical quiet NaN (0x7fc00000 for f32,
 *     0x7ff8000000000000 for f64, 0x7e00 f16, 0x7fc0 bf16), and -0 orders
 *     below +0. They compare through an integer key that orders floats
 *     totally, so the loops are integer compares and blends, no branches.
 *   - Floating SUM and PROD are IEEE operations, commutative except for the
 *     payload of a NaN result; the algorithms combine in an order that every
 *     rank shares, so every rank still gets the same bits.
 *
 * td_reduce_multi works in tiles so that a tile of dst stays in L1 while each
 * source is folded into it: for n sources the traffic is n reads + 1 write. */
#include "reduce_kernels.h" /* first: this level's names (compiled once per CPU level) */

#include <string.h>

#ifdef __F16C__
#include <immintrin.h>
#endif

#define TILE 2048 /* elements per tile: 8 KiB of f32, 32 KiB with 4 sources */

/* Integer ops: U is the unsigned type of the same width; the conversion of
 * the wrapped result back to the signed type is modular in gcc and clang
 * (implementation-defined, not undefined). */
#define ISUM(T, U, a, b) ((T)((U)(a) + (U)(b)))
#define IPROD(T, U, a, b) ((T)((U)(a) * (U)(b)))
#define IMIN(T, U, a, b) ((b) < (a) ? (b) : (a))
#define IMAX(T, U, a, b) ((b) > (a) ? (b) : (a))
#define FSUM(T, U, a, b) ((a) + (b))
#define FPROD(T, U, a, b) ((a) * (b))

/* Floating MIN/MAX on the bit patterns (U: uint32_t or uint64_t, S the signed
 * type, B the width). key(x) flips the magnitude bits of negative values so
 * that signed-integer order is the total order -inf < ... < -0 < +0 < ... <
 * +inf; NaNs (|x| above the infinity pattern) give QNAN. */
#define FKEY(S, U, B, x) ((S)((x) ^ ((U)((S)(x) >> ((B) - 1)) >> 1)))
#define FISNAN(U, INF, x) (((x) & ~((U)1 << (sizeof(U) * 8 - 1))) > (INF))
#define FMINBITS(S, U, B, INF, QNAN, a, b)                                                                  \
  ((FISNAN(U, INF, a) | FISNAN(U, INF, b)) ? (QNAN) : FKEY(S, U, B, b) < FKEY(S, U, B, a) ? (b) : (a))
#define FMAXBITS(S, U, B, INF, QNAN, a, b)                                                                  \
  ((FISNAN(U, INF, a) | FISNAN(U, INF, b)) ? (QNAN) : FKEY(S, U, B, b) > FKEY(S, U, B, a) ? (b) : (a))
#define F32MIN(T, U, a, b) FMINBITS(int32_t, uint32_t, 32, 0x7f800000u, 0x7fc00000u, a, b)
#define F32MAX(T, U, a, b) FMAXBITS(int32_t, uint32_t, 32, 0x7f800000u, 0x7fc00000u, a, b)
#define F64MIN(T, U, a, b) FMINBITS(int64_t, uint64_t, 64, 0x7ff0000000000000ull, 0x7ff8000000000000ull, a, b)
#define F64MAX(T, U, a, b) FMAXBITS(int64_t, uint64_t, 64, 0x7ff0000000000000ull, 0x7ff8000000000000ull, a, b)

/* dst = op(dst, src) on elements of type T (-fno-strict-aliasing: float
 * buffers are read as their bit patterns where the op works on bits). */
#define DEFINE_INPLACE(name, T, U, OP)                                                              \
  static void name(T *restrict dst, const T *restrict src, size_t n) {                             \
    for (size_t i = 0; i < n; i++) dst[i] = OP(T, U, dst[i], src[i]);                               \
  }
/* dst = op(a, b) (dst may be the same memory as a or b: each element is read
 * before it is written). */
#define DEFINE_BINARY(name, T, U, OP)                                                               \
  static void name(T *dst, const T *a, const T *b, size_t n) {                                      \
    for (size_t i = 0; i < n; i++) dst[i] = OP(T, U, a[i], b[i]);                                    \
  }

/* T: the element type; U: the type MIN/MAX and integer SUM/PROD work in. */
#define DEFINE_TYPE(T, U, MT, suffix, SUM, PROD, MIN, MAX)                                          \
  DEFINE_INPLACE(sum_##suffix, T, U, SUM)                                                          \
  DEFINE_INPLACE(prod_##suffix, T, U, PROD)                                                        \
  DEFINE_INPLACE(min_##suffix, MT, U, MIN)                                                         \
  DEFINE_INPLACE(max_##suffix, MT, U, MAX)                                                         \
  DEFINE_BINARY(sum2_##suffix, T, U, SUM)                                                          \
  DEFINE_BINARY(prod2_##suffix, T, U, PROD)                                                        \
  DEFINE_BINARY(min2_##suffix, MT, U, MIN)                                                         \
  DEFINE_BINARY(max2_##suffix, MT, U, MAX)                                                         \
  static void inplace_##suffix(void *d, const void *s, size_t n, td_op op) {                       \
    switch (op) {                                                                                  \
    case TD_SUM: case TD_AVG: sum_##suffix(d, s, n); break;                                        \
    case TD_PROD: prod_##suffix(d, s, n); break;                                                   \
    case TD_MIN: min_##suffix(d, s, n); break;                                                     \
    case TD_MAX: max_##suffix(d, s, n); break;                                                     \
    default: break;                                                                                \
    }                                                                                              \
  }                                                                                                \
  static void binary_##suffix(void *d, const void *a, const void *b, size_t n, td_op op) {         \
    switch (op) {                                                                                  \
    case TD_SUM: case TD_AVG: sum2_##suffix(d, a, b, n); break;                                    \
    case TD_PROD: prod2_##suffix(d, a, b, n); break;                                               \
    case TD_MIN: min2_##suffix(d, a, b, n); break;                                                 \
    case TD_MAX: max2_##suffix(d, a, b, n); break;                                                 \
    default: break;                                                                                \
    }                                                                                              \
  }

DEFINE_TYPE(float, uint32_t, uint32_t, f32, FSUM, FPROD, F32MIN, F32MAX)
DEFINE_TYPE(double, uint64_t, uint64_t, f64, FSUM, FPROD, F64MIN, F64MAX)
DEFINE_TYPE(int32_t, uint32_t, int32_t, i32, ISUM, IPROD, IMIN, IMAX)
DEFINE_TYPE(int64_t, uint64_t, int64_t, i64, ISUM, IPROD, IMIN, IMAX)
DEFINE_TYPE(uint8_t, uint8_t, uint8_t, u8, ISUM, IPROD, IMIN, IMAX)

/* Conversions inlined here so that the loops below vectorize: bf16 is a
 * shift; f16 uses F16C's 8-wide vcvtph2ps/vcvtps2ph when the compiler targets
 * it (gcc 12 only emits scalar conversions for _Float16 loops), else the
 * portable routines of dtype.c. All round to nearest even and treat NaNs
 * exactly like td_f32_to_f16/td_f16_to_f32 and the bf16 pair (tests/base
 * checks every bit pattern, NaN payloads included). */
static inline float bf16_load(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}
static inline uint16_t bf16_store(float f) {
  uint32_t x;
  __builtin_memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40); /* quiet nan */
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

/* dst[i] = (float)src[i] for a tile. */
static void half_widen(float *restrict dst, const uint16_t *restrict src, size_t m, bool bf) {
  size_t i = 0;
  if (bf) {
    for (; i < m; i++) dst[i] = bf16_load(src[i]);
    return;
  }
#ifdef __F16C__
  for (; i + 8 <= m; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
#endif
  for (; i < m; i++) dst[i] = td_f16_to_f32(src[i]);
}

/* dst[i] = round(src[i]) for a tile. */
static void half_narrow(uint16_t *restrict dst, const float *restrict src, size_t m, bool bf) {
  size_t i = 0;
  if (bf) {
    for (; i < m; i++) dst[i] = bf16_store(src[i]);
    return;
  }
#ifdef __F16C__
  for (; i + 8 <= m; i += 8)
    _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
  for (; i < m; i++) dst[i] = td_f32_to_f16(src[i]);
}

/* f16/bf16: widen a tile of every source into f32, combine with the f32
 * kernels, round once. Every source tile is read before dst's tile is
 * written, so dst may be the same memory as any source. */
static void reduce_half(uint16_t *dst, const uint16_t *const *srcs, int n_srcs, size_t count, td_op op,
                        bool bf) {
  float acc[TILE], tmp[TILE];
  for (size_t base = 0; base < count; base += TILE) {
    size_t m = TD_MIN(TILE, count - base);
    half_widen(acc, srcs[0] + base, m, bf);
    for (int k = 1; k < n_srcs; k++) {
      half_widen(tmp, srcs[k] + base, m, bf);
      inplace_f32(acc, tmp, m, op);
    }
    half_narrow(dst + base, acc, m, bf);
  }
}

typedef void (*inplace_fn)(void *, const void *, size_t, td_op);
typedef void (*binary_fn)(void *, const void *, const void *, size_t, td_op);

static inplace_fn inplace_for(td_dtype dtype) {
  switch (dtype) {
  case TD_F32: return inplace_f32;
  case TD_F64: return inplace_f64;
  case TD_I32: return inplace_i32;
  case TD_I64: return inplace_i64;
  case TD_U8: return inplace_u8;
  default: return NULL;
  }
}

static binary_fn binary_for(td_dtype dtype) {
  switch (dtype) {
  case TD_F32: return binary_f32;
  case TD_F64: return binary_f64;
  case TD_I32: return binary_i32;
  case TD_I64: return binary_i64;
  case TD_U8: return binary_u8;
  default: return NULL;
  }
}

void td_reduce_inplace(void *dst, const void *src, size_t count, td_dtype dtype, td_op op) {
  if (count == 0) return;
  if (dtype == TD_F16 || dtype == TD_BF16) {
    const uint16_t *srcs[2] = {dst, src};
    reduce_half(dst, srcs, 2, count, op, dtype == TD_BF16);
    return;
  }
  inplace_fn fn = inplace_for(dtype);
  if (fn) fn(dst, src, count, op);
}

void td_reduce_multi(void *dst, const void *const *srcs, int n_srcs, size_t count, td_dtype dtype, td_op op) {
  if (count == 0 || n_srcs <= 0) return;
  size_t es = td_dtype_size(dtype);
  if (dtype == TD_F16 || dtype == TD_BF16) {
    reduce_half(dst, (const uint16_t *const *)srcs, n_srcs, count, op, dtype == TD_BF16);
    return;
  }
  binary_fn bin = binary_for(dtype);
  inplace_fn inp = inplace_for(dtype);
  if (!bin) return;
  if (n_srcs == 1) {
    if (dst != srcs[0]) __builtin_memmove(dst, srcs[0], count * es);
    return;
  }
  /* Tile so that dst's tile stays in L1 while sources 2..n are folded in. */
  for (size_t base = 0; base < count; base += TILE) {
    size_t m = TD_MIN(TILE, count - base);
    char *d = (char *)dst + base * es;
    bin(d, (const char *)srcs[0] + base * es, (const char *)srcs[1] + base * es, m, op);
    for (int k = 2; k < n_srcs; k++) inp(d, (const char *)srcs[k] + base * es, m, op);
  }
}

/* f32 sum into several outputs, a vector of 16 at a time: each source and
 * each output streams once, with no intermediate buffer (measured 64 MiB
 * over 2 ranks: 3.5 ms against 4.6 ms for reduce-into-L1 then copy). The
 * tail adds in the same order (srcs[0] + srcs[1] + ...), so vector and
 * scalar lanes give the same bits. */
typedef float v16f __attribute__((vector_size(64)));

static void fanout_f32_sum(float *const *dsts, int n_dsts, const float *const *srcs, int n_srcs, size_t count) {
  size_t i = 0;
  for (; i + 16 <= count; i += 16) {
    v16f acc, x;
    __builtin_memcpy(&acc, srcs[0] + i, sizeof acc);
    for (int k = 1; k < n_srcs; k++) {
      __builtin_memcpy(&x, srcs[k] + i, sizeof x);
      acc += x;
    }
    for (int j = 0; j < n_dsts; j++) __builtin_memcpy(dsts[j] + i, &acc, sizeof acc);
  }
  for (; i < count; i++) {
    float acc = srcs[0][i];
    for (int k = 1; k < n_srcs; k++) acc += srcs[k][i];
    for (int j = 0; j < n_dsts; j++) dsts[j][i] = acc;
  }
}

void td_reduce_fanout(void *const *dsts, int n_dsts, const void *const *srcs, int n_srcs, size_t count,
                      td_dtype dtype, td_op op) {
  if (count == 0 || n_dsts <= 0 || n_srcs <= 0) return;
  if (dtype == TD_F32 && (op == TD_SUM || op == TD_AVG)) {
    fanout_f32_sum((float *const *)dsts, n_dsts, (const float *const *)srcs, n_srcs, count);
    return;
  }
  /* Other types: reduce a tile into L1, then copy it out; a tile is read
   * from every src before any dst of it is written, so in place is safe. */
  size_t es = td_dtype_size(dtype), tile = (16u << 10) / es;
  _Alignas(64) unsigned char tmp[16u << 10];
  const void *part[n_srcs];
  for (size_t at = 0; at < count; at += tile) {
    size_t m = TD_MIN(tile, count - at);
    for (int k = 0; k < n_srcs; k++) part[k] = (const char *)srcs[k] + at * es;
    td_reduce_multi(tmp, part, n_srcs, m, dtype, op);
    for (int j = 0; j < n_dsts; j++) memcpy((char *)dsts[j] + at * es, tmp, m * es);
  }
}

void td_reduce_half_to_f32(float *dst, const void *src, size_t count, td_dtype dtype) {
  if (count == 0 || (dtype != TD_F16 && dtype != TD_BF16)) return;
  half_widen(dst, src, count, dtype == TD_BF16);
}

void td_reduce_f32_to_half(void *dst, const float *src, size_t count, td_dtype dtype, int divisor) {
  if (count == 0 || (dtype != TD_F16 && dtype != TD_BF16)) return;
  bool bf = dtype == TD_BF16;
  if (divisor <= 1) {
    half_narrow(dst, src, count, bf);
    return;
  }
  float tile[TILE];
  for (size_t base = 0; base < count; base += TILE) {
    size_t m = TD_MIN(TILE, count - base);
    for (size_t i = 0; i < m; i++) tile[i] = src[base + i] / (float)divisor;
    half_narrow((uint16_t *)dst + base, tile, m, bf);
  }
}

void td_reduce_scale(void *buf, size_t count, td_dtype dtype, int divisor) {
  if (divisor <= 1 || count == 0) return;
  switch (dtype) {
  case TD_F32: {
    float *p = buf, s = 1.0f / (float)divisor;
    for (size_t i = 0; i < count; i++) p[i] *= s;
    break;
  }
  case TD_F64: {
    double *p = buf;
    for (size_t i = 0; i < count; i++) p[i] /= divisor;
    break;
  }
  case TD_F16: case TD_BF16: {
    uint16_t *p = buf;
    bool bf = dtype == TD_BF16;
    float tile[TILE];
    for (size_t base = 0; base < count; base += TILE) {
      size_t m = TD_MIN(TILE, count - base);
      half_widen(tile, p + base, m, bf);
      for (size_t i = 0; i < m; i++) tile[i] /= (float)divisor;
      half_narrow(p + base, tile, m, bf);
    }
    break;
  }
  /* Integers: the wrapped sum divided by the number of ranks, truncated
   * toward zero (C division; divisor >= 2 cannot overflow). */
  case TD_I32: {
    int32_t *p = buf;
    for (size_t i = 0; i < count; i++) p[i] /= divisor;
    break;
  }
  case TD_I64: {
    int64_t *p = buf;
    for (size_t i = 0; i < count; i++) p[i] /= divisor;
    break;
  }
  case TD_U8: {
    uint8_t *p = buf;
    for (size_t i = 0; i < count; i++) p[i] = (uint8_t)(p[i] / divisor);
    break;
  }
  default: break;
  }
}
