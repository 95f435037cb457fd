/* Element types and operators: sizes, names, parsing, half-precision
 * conversions and the shard function shared by reduce-scatter, allgather and
 * ZeRO. */
#include "base.h"

#include <math.h>
#include <string.h>
#include <strings.h>

size_t td_dtype_size(td_dtype dtype) {
  switch (dtype) {
  case TD_F32: case TD_I32: return 4;
  case TD_F64: case TD_I64: return 8;
  case TD_F16: case TD_BF16: return 2;
  case TD_U8: return 1;
  default: return 0;
  }
}

static const char *dtype_names[TD_DTYPE_COUNT] = {"f32", "f64", "f16", "bf16", "i32", "i64", "u8"};
static const char *op_names[TD_OP_COUNT] = {"sum", "avg", "min", "max", "prod"};

const char *td_dtype_name(td_dtype dtype) {
  return ((unsigned)dtype < TD_DTYPE_COUNT) ? dtype_names[dtype] : "?";
}

const char *td_op_name(td_op op) { return ((unsigned)op < TD_OP_COUNT) ? op_names[op] : "?"; }

int td_dtype_parse(const char *name, td_dtype *out) {
  static const struct { const char *alias; td_dtype dtype; } aliases[] = {
      {"float", TD_F32}, {"float32", TD_F32}, {"double", TD_F64}, {"float64", TD_F64},
      {"half", TD_F16}, {"float16", TD_F16}, {"bfloat16", TD_BF16}, {"int32", TD_I32},
      {"int", TD_I32}, {"int64", TD_I64}, {"uint8", TD_U8}, {"byte", TD_U8},
  };
  for (int i = 0; i < TD_DTYPE_COUNT; i++)
    if (!strcasecmp(name, dtype_names[i])) { *out = (td_dtype)i; return 0; }
  for (size_t i = 0; i < TD_ARRAY_SIZE(aliases); i++)
    if (!strcasecmp(name, aliases[i].alias)) { *out = aliases[i].dtype; return 0; }
  return -1;
}

int td_op_parse(const char *name, td_op *out) {
  for (int i = 0; i < TD_OP_COUNT; i++)
    if (!strcasecmp(name, op_names[i])) { *out = (td_op)i; return 0; }
  if (!strcasecmp(name, "mean")) { *out = TD_AVG; return 0; }
  if (!strcasecmp(name, "product")) { *out = TD_PROD; return 0; }
  return -1;
}

float td_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else { /* subnormal: normalize */
      int e = -1;
      do { e++; mant <<= 1; } while (!(mant & 0x400));
      bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((mant & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    /* inf, or nan made quiet with its payload kept (as F16C's vcvtph2ps) */
    bits = sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

uint16_t td_f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) /* nan: quiet, keeping the top payload bits (as F16C's vcvtps2ph) */
    return (uint16_t)(sign | 0x7e00 | ((absx >> 13) & 0x3ff));
  if (absx == 0x7f800000u) return (uint16_t)(sign | 0x7c00); /* inf */
  if (absx >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
    return (uint16_t)(sign | 0x7c00);
  if (absx < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
    if (absx < 0x33000000u) return (uint16_t)sign; /* < 2^-25 rounds to zero */
    uint32_t e = absx >> 23;
    uint32_t mant = (absx & 0x7fffff) | 0x800000;
    /* value = mant * 2^(e-150) and a half subnormal counts units of 2^-24,
     * so the half mantissa is mant >> (126 - e), rounded to nearest even. */
    uint32_t shift = 126 - e; /* 14..24 */
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) half++;
    return (uint16_t)(sign | half);
  }
  uint32_t bits = absx - (112u << 23); /* rebias exponent 127 -> 15 */
  uint32_t half = bits >> 13;
  uint32_t rem = bits & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) half++;
  return (uint16_t)(sign | half);
}

float td_bf16_to_f32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

uint16_t td_f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40); /* quiet nan */
  uint32_t rounding = 0x7fff + ((x >> 16) & 1);
  return (uint16_t)((x + rounding) >> 16);
}

void td_shard_range(size_t count, int n, int rank, size_t *offset_out, size_t *len_out) {
  if (n <= 0 || rank < 0 || rank >= n) {
    *offset_out = 0;
    *len_out = 0;
    return;
  }
  size_t base = count / (size_t)n, extra = count % (size_t)n, r = (size_t)rank;
  *len_out = base + (r < extra ? 1 : 0);
  *offset_out = r * base + (r < extra ? r : extra);
}

double td_dtype_get(const void *buf, size_t i, td_dtype dtype) {
  switch (dtype) {
  case TD_F32: return ((const float *)buf)[i];
  case TD_F64: return ((const double *)buf)[i];
  case TD_F16: return td_f16_to_f32(((const uint16_t *)buf)[i]);
  case TD_BF16: return td_bf16_to_f32(((const uint16_t *)buf)[i]);
  case TD_I32: return ((const int32_t *)buf)[i];
  case TD_I64: return (double)((const int64_t *)buf)[i];
  case TD_U8: return ((const uint8_t *)buf)[i];
  default: return __builtin_nan("");
  }
}

void td_dtype_set(void *buf, size_t i, td_dtype dtype, double value) {
  switch (dtype) {
  case TD_F32: ((float *)buf)[i] = (float)value; break;
  case TD_F64: ((double *)buf)[i] = value; break;
  case TD_F16: ((uint16_t *)buf)[i] = td_f32_to_f16((float)value); break;
  case TD_BF16: ((uint16_t *)buf)[i] = td_f32_to_bf16((float)value); break;
  case TD_I32: ((int32_t *)buf)[i] = (int32_t)value; break;
  case TD_I64: ((int64_t *)buf)[i] = (int64_t)value; break;
  case TD_U8: ((uint8_t *)buf)[i] = (uint8_t)value; break;
  default: break;
  }
}

double td_op_apply(td_op op, double a, double b) {
  switch (op) {
  case TD_PROD: return a * b;
  /* NaN propagates, and -0 orders below +0, as the kernels (reduce.c) do. */
  case TD_MIN: return a != a || b != b ? __builtin_nan("") : b < a || (b == a && signbit(b)) ? b : a;
  case TD_MAX: return a != a || b != b ? __builtin_nan("") : b > a || (b == a && !signbit(b)) ? b : a;
  default: return a + b;
  }
}
