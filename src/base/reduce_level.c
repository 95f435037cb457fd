/* One level's reduction table (reduce_kernels.h): compiled once per CPU
 * level with that level's flags, as reduce.c is. */
#include "reduce_kernels.h"

#ifndef TD_LEVEL
#error "reduce_level.c is compiled only per CPU level (Makefile KERNEL_SRCS, -DTD_LEVEL=...)"
#endif

#define TD_REDUCE_KERNEL_ENTRY(name) .k_##name = name,
const td_reduce_kernels TD_REDUCE_LEVEL_NAME(td_reduce_kernels) = {TD_REDUCE_KERNEL_LIST(TD_REDUCE_KERNEL_ENTRY)};
