/* CUDA emulator (tests/cudaemu): the subset of cuda_bf16.h Tandem's kernels
 * use. __nv_bfloat16 holds the 16 raw bits; conversions from float round to
 * nearest even (ties to the even bf16), NaN becomes the canonical 0x7fff, as
 * the real __float2bfloat16 does; to float is exact. Arithmetic goes through
 * float (operator float), which is what kernels should write anyway: they
 * accumulate in f32. C++ only (kernels are C++); C code sees the bits. */
#ifndef TD_CUDAEMU_CUDA_BF16_H
#define TD_CUDAEMU_CUDA_BF16_H

#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
static inline unsigned short td_emu_f32_to_bf16_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
  u += 0x7fffu + ((u >> 16) & 1u);
  return (unsigned short)(u >> 16);
}
static inline float td_emu_bf16_bits_to_f32(unsigned short h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

struct __attribute__((aligned(2))) __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  __nv_bfloat16(float f) : __x(td_emu_f32_to_bf16_bits(f)) {}
  __nv_bfloat16(double d) : __x(td_emu_f32_to_bf16_bits((float)d)) {}
  __nv_bfloat16(int i) : __x(td_emu_f32_to_bf16_bits((float)i)) {}
  operator float() const { return td_emu_bf16_bits_to_f32(__x); }
};
struct __attribute__((aligned(4))) __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
typedef unsigned short __nv_bfloat16_raw_bits;

static inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
static inline float __bfloat162float(__nv_bfloat16 h) { return (float)h; }
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
  __nv_bfloat162 v;
  v.x = __nv_bfloat16(a);
  v.y = __nv_bfloat16(b);
  return v;
}
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) {
  __nv_bfloat16 h;
  h.__x = u;
  return h;
}
#endif
#endif
