/* The public names of the reduction kernels (reduce_kernels.h): each forwards
 * to the kernel of the CPU level td_cpu_active() chose. Compiled once, for
 * the baseline CPU. One indirect call per reduction of a whole chunk. */
#include "reduce_kernels.h"

static const td_reduce_kernels *const level_tables[TD_CPU_LEVELS] = {
    &td_reduce_kernels_generic, &td_reduce_kernels_avx2, &td_reduce_kernels_avx512,
    &td_reduce_kernels_avx512bf16};
static const td_reduce_kernels *active_table; /* NULL until the first call */

const td_reduce_kernels *td_reduce_kernels_for(td_cpu_level level) {
  return (unsigned)level < TD_CPU_LEVELS ? level_tables[level] : level_tables[TD_CPU_GENERIC];
}

static inline const td_reduce_kernels *kern(void) {
  const td_reduce_kernels *k = __atomic_load_n(&active_table, __ATOMIC_ACQUIRE);
  if (__builtin_expect(k == NULL, 0)) {
    k = level_tables[td_cpu_active()]; /* racing first calls all store the same table */
    __atomic_store_n(&active_table, k, __ATOMIC_RELEASE);
  }
  return k;
}

void td_reduce_inplace(void *dst, const void *src, size_t count, td_dtype dtype, td_op op) {
  kern()->k_td_reduce_inplace(dst, src, count, dtype, op);
}

void td_reduce_multi(void *dst, const void *const *srcs, int n_srcs, size_t count, td_dtype dtype, td_op op) {
  kern()->k_td_reduce_multi(dst, srcs, n_srcs, count, dtype, op);
}

void td_reduce_fanout(void *const *dsts, int n_dsts, const void *const *srcs, int n_srcs, size_t count,
                      td_dtype dtype, td_op op) {
  kern()->k_td_reduce_fanout(dsts, n_dsts, srcs, n_srcs, count, dtype, op);
}

void td_reduce_half_to_f32(float *dst, const void *src, size_t count, td_dtype dtype) {
  kern()->k_td_reduce_half_to_f32(dst, src, count, dtype);
}

void td_reduce_f32_to_half(void *dst, const float *src, size_t count, td_dtype dtype, int divisor) {
  kern()->k_td_reduce_f32_to_half(dst, src, count, dtype, divisor);
}

void td_reduce_scale(void *buf, size_t count, td_dtype dtype, int divisor) {
  kern()->k_td_reduce_scale(buf, count, dtype, divisor);
}
