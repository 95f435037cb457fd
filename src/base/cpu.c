/* The CPU level the SIMD kernels run at, chosen once per process.
 *
 * The library is built for baseline x86-64 (SSE2, what Debian's amd64
 * packages assume), so that it runs on any x86-64 machine; the hot kernels
 * (src/nn matrix products and layers, src/base reductions) are compiled
 * once more per level with that level's instruction set (Makefile,
 * KERNEL_SRCS) and picked here at run time. Detection is cpuid plus the OS
 * check: a CPU can have AVX-512 units that the kernel does not save on a
 * context switch (XCR0 says which register states it does), and executing
 * them then faults exactly like a CPU without them. */
#include "base.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

/* XCR0 (XGETBV with ecx = 0), valid only when cpuid says OSXSAVE. Inline
 * assembly rather than _xgetbv, which needs -mxsave on this baseline. */
static uint64_t read_xcr0(void) {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((uint64_t)hi << 32) | lo;
}

static td_cpu_level detect(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return TD_CPU_GENERIC;
  bool fma = c & bit_FMA, osxsave = c & bit_OSXSAVE, avx = c & bit_AVX, f16c = c & bit_F16C;
  if (!osxsave || !avx) return TD_CPU_GENERIC;
  uint64_t xcr0 = read_xcr0();
  /* bits 1 (XMM) and 2 (YMM upper halves): the OS saves AVX state */
  if ((xcr0 & 0x6) != 0x6) return TD_CPU_GENERIC;
  if (__get_cpuid_max(0, NULL) < 7) return TD_CPU_GENERIC;
  __cpuid_count(7, 0, a, b, c, d);
  bool avx2 = b & bit_AVX2;
  if (!(avx2 && fma && f16c)) return TD_CPU_GENERIC;
  /* the avx512 kernels are built with -mavx512f -mavx512bw -mavx512dq
   * -mavx512vl (x86-64-v4's set); XCR0 bits 5-7: opmask, ZMM0-15 upper
   * halves, ZMM16-31 */
  bool v4 = (b & bit_AVX512F) && (b & bit_AVX512BW) && (b & bit_AVX512DQ) && (b & bit_AVX512VL);
  if (!v4 || (xcr0 & 0xe6) != 0xe6) return TD_CPU_AVX2;
  /* AVX512-BF16: cpuid leaf 7 sub-leaf 1, eax bit 5 (same register state) */
  __cpuid_count(7, 0, a, b, c, d);
  unsigned max_sub = a;
  if (max_sub >= 1) {
    __cpuid_count(7, 1, a, b, c, d);
    if (a & (1u << 5)) return TD_CPU_AVX512BF16;
  }
  return TD_CPU_AVX512;
}
#else
static td_cpu_level detect(void) { return TD_CPU_GENERIC; }
#endif

static const char *const level_names[TD_CPU_LEVELS] = {"generic", "avx2", "avx512", "avx512bf16"};

const char *td_cpu_level_name(td_cpu_level level) {
  return (unsigned)level < TD_CPU_LEVELS ? level_names[level] : "unknown";
}

td_status td_cpu_parse(const char *text, td_cpu_level supported, td_cpu_level *out, char *err, size_t err_size) {
  if (!text || !*text || strcasecmp(text, "auto") == 0) {
    *out = supported;
    return TD_OK;
  }
  for (int l = 0; l < TD_CPU_LEVELS; l++) {
    if (strcasecmp(text, level_names[l]) != 0) continue;
    if (l > (int)supported) {
      snprintf(err, err_size,
               "TANDEM_CPU=%s: this CPU (or its operating system) does not support %s instructions; the highest "
               "level here is %s. Unset TANDEM_CPU or set it to generic%s",
               text, level_names[l], level_names[supported], supported >= TD_CPU_AVX512 ? ", avx2, avx512" : supported >= TD_CPU_AVX2 ? ", avx2" : "");
      return TD_ERR_INVALID_ARGUMENT;
    }
    *out = (td_cpu_level)l;
    return TD_OK;
  }
  snprintf(err, err_size, "TANDEM_CPU=%s: not a CPU level; use auto (the default), generic, avx2, avx512 or avx512bf16", text);
  return TD_ERR_INVALID_ARGUMENT;
}

static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;
static td_cpu_level cpu_supported, cpu_active;
static td_status cpu_status;
static char cpu_err[256];

static void cpu_init(void) {
  cpu_supported = detect();
  cpu_status = td_cpu_parse(td_env_str("TANDEM_CPU", NULL), cpu_supported, &cpu_active, cpu_err, sizeof cpu_err);
  /* a refused TANDEM_CPU leaves the kernels on the level every x86-64 has:
   * the calls that can fail (td_cpu_check) report it, the void kernels
   * never run instructions the CPU lacks */
  if (cpu_status != TD_OK) cpu_active = TD_CPU_GENERIC;
}

td_cpu_level td_cpu_supported(void) {
  pthread_once(&cpu_once, cpu_init);
  return cpu_supported;
}

td_cpu_level td_cpu_active(void) {
  pthread_once(&cpu_once, cpu_init);
  return cpu_active;
}

td_status td_cpu_check(void) {
  pthread_once(&cpu_once, cpu_init);
  if (cpu_status != TD_OK) return td_error(cpu_status, "%s", cpu_err);
  return TD_OK;
}

const char *td_cpu_kernel_level(void) { return td_cpu_level_name(td_cpu_active()); }
