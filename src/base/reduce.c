/* Reduction kernels for every dtype and op. Written as plain loops over
 * restrict pointers so that gcc -O3 vectorizes them (AVX2/AVX-512 with
 * -march=native); measured before reaching for intrinsics. f16 and bf16 are
 * widened to f32, combined, and rounded once.
 *
 * td_reduce_multi works in tiles so that a tile of dst stays in L1 while each
 * source is folded into it: for n sources the traffic is n reads + 1 write. */
#include "base.h"

#define TILE 2048 /* elements per tile: 8 KiB of f32, 32 KiB with 4 sources */

#define OP_SUM(a, b) ((a) + (b))
#define OP_PROD(a, b) ((a) * (b))
#define OP_MIN(a, b) ((b) < (a) ? (b) : (a))
#define OP_MAX(a, b) ((b) > (a) ? (b) : (a))

/* dst = op(dst, src) for a native type. */
#define DEFINE_INPLACE(name, T, OP)                                                 \
  static void name(T *restrict dst, const T *restrict src, size_t n) {              \
    for (size_t i = 0; i < n; i++) dst[i] = OP(dst[i], src[i]);                      \
  }
/* dst = op(a, b) for a native type (dst may equal a). */
#define DEFINE_BINARY(name, T, OP)                                                  \
  static void name(T *dst, const T *a, const T *restrict b, size_t n) {             \
    for (size_t i = 0; i < n; i++) dst[i] = OP(a[i], b[i]);                          \
  }

#define DEFINE_TYPE(T, suffix)                                                      \
  DEFINE_INPLACE(sum_##suffix, T, OP_SUM)                                            \
  DEFINE_INPLACE(prod_##suffix, T, OP_PROD)                                          \
  DEFINE_INPLACE(min_##suffix, T, OP_MIN)                                            \
  DEFINE_INPLACE(max_##suffix, T, OP_MAX)                                            \
  DEFINE_BINARY(sum2_##suffix, T, OP_SUM)                                            \
  DEFINE_BINARY(prod2_##suffix, T, OP_PROD)                                          \
  DEFINE_BINARY(min2_##suffix, T, OP_MIN)                                            \
  DEFINE_BINARY(max2_##suffix, T, OP_MAX)                                            \
  static void inplace_##suffix(void *d, const void *s, size_t n, td_op op) {         \
    switch (op) {                                                                    \
    case TD_SUM: case TD_AVG: sum_##suffix(d, s, n); break;                          \
    case TD_PROD: prod_##suffix(d, s, n); break;                                     \
    case TD_MIN: min_##suffix(d, s, n); break;                                       \
    case TD_MAX: max_##suffix(d, s, n); break;                                       \
    default: break;                                                                  \
    }                                                                                \
  }                                                                                  \
  static void binary_##suffix(void *d, const void *a, const void *b, size_t n, td_op op) { \
    switch (op) {                                                                    \
    case TD_SUM: case TD_AVG: sum2_##suffix(d, a, b, n); break;                      \
    case TD_PROD: prod2_##suffix(d, a, b, n); break;                                 \
    case TD_MIN: min2_##suffix(d, a, b, n); break;                                   \
    case TD_MAX: max2_##suffix(d, a, b, n); break;                                   \
    default: break;                                                                  \
    }                                                                                \
  }

DEFINE_TYPE(float, f32)
DEFINE_TYPE(double, f64)
DEFINE_TYPE(int32_t, i32)
DEFINE_TYPE(int64_t, i64)
DEFINE_TYPE(uint8_t, u8)

static inline float half_load(const uint16_t *p, size_t i, bool bf) {
  return bf ? td_bf16_to_f32(p[i]) : td_f16_to_f32(p[i]);
}

static inline float apply_f32(float a, float b, td_op op) {
  switch (op) {
  case TD_PROD: return a * b;
  case TD_MIN: return OP_MIN(a, b);
  case TD_MAX: return OP_MAX(a, b);
  default: return a + b;
  }
}

/* f16/bf16: widen a tile of every source into f32, combine, round once. */
static void reduce_half(uint16_t *dst, const uint16_t *const *srcs, int n_srcs, size_t count, td_op op,
                        bool bf) {
  float acc[TILE];
  for (size_t base = 0; base < count; base += TILE) {
    size_t m = TD_MIN(TILE, count - base);
    const uint16_t *s0 = srcs[0] + base;
    for (size_t i = 0; i < m; i++) acc[i] = half_load(s0, i, bf);
    for (int k = 1; k < n_srcs; k++) {
      const uint16_t *sk = srcs[k] + base;
      for (size_t i = 0; i < m; i++) acc[i] = apply_f32(acc[i], half_load(sk, i, bf), op);
    }
    uint16_t *d = dst + base;
    if (bf)
      for (size_t i = 0; i < m; i++) d[i] = td_f32_to_bf16(acc[i]);
    else
      for (size_t i = 0; i < m; i++) d[i] = td_f32_to_f16(acc[i]);
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
    for (size_t i = 0; i < count; i++) {
      float v = half_load(p, i, bf) / (float)divisor;
      p[i] = bf ? td_f32_to_bf16(v) : td_f32_to_f16(v);
    }
    break;
  }
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
