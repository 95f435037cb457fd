/* The reduction kernels (reduce.c) compiled once per CPU level, as the src/nn
 * kernels are (src/nn/nn_kernels.h explains the scheme): reduce.c includes
 * this header first, which, when the Makefile compiles it with
 * -DTD_LEVEL=<level>, renames each public function to name_<level>;
 * reduce_dispatch.c defines the public names, forwarding through the table
 * of the level td_cpu_active() chose; reduce_level.c defines each level's
 * table. The kernels give the same bits at every level (no operation in
 * them is contracted or reordered by the wider instruction sets:
 * test_base checks every dtype and op across levels). */
#ifndef TD_REDUCE_KERNELS_H
#define TD_REDUCE_KERNELS_H

#ifdef TD_LEVEL
#define TD_REDUCE_CAT2(a, b) a##_##b
#define TD_REDUCE_CAT(a, b) TD_REDUCE_CAT2(a, b)
#define TD_REDUCE_LEVEL_NAME(name) TD_REDUCE_CAT(name, TD_LEVEL)
#define td_reduce_inplace TD_REDUCE_LEVEL_NAME(td_reduce_inplace)
#define td_reduce_multi TD_REDUCE_LEVEL_NAME(td_reduce_multi)
#define td_reduce_fanout TD_REDUCE_LEVEL_NAME(td_reduce_fanout)
#define td_reduce_half_to_f32 TD_REDUCE_LEVEL_NAME(td_reduce_half_to_f32)
#define td_reduce_f32_to_half TD_REDUCE_LEVEL_NAME(td_reduce_f32_to_half)
#define td_reduce_scale TD_REDUCE_LEVEL_NAME(td_reduce_scale)
#endif

#include "base.h"

#define TD_REDUCE_KERNEL_LIST(X) \
  X(td_reduce_inplace) X(td_reduce_multi) X(td_reduce_fanout) X(td_reduce_half_to_f32) X(td_reduce_f32_to_half) \
  X(td_reduce_scale)

/* field k_<name> (## keeps the name itself from being renamed) */
#define TD_REDUCE_KERNEL_FIELD(name) __typeof__(name) *k_##name;
typedef struct td_reduce_kernels {
  TD_REDUCE_KERNEL_LIST(TD_REDUCE_KERNEL_FIELD)
} td_reduce_kernels;
#undef TD_REDUCE_KERNEL_FIELD

extern const td_reduce_kernels td_reduce_kernels_generic, td_reduce_kernels_avx2, td_reduce_kernels_avx512,
    td_reduce_kernels_avx512bf16;

/* A level's table, whatever the CPU supports (calling a level the CPU lacks
 * faults): for the tests that compare levels in one process. */
const td_reduce_kernels *td_reduce_kernels_for(td_cpu_level level);

#endif
