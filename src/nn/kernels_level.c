/* One level's kernel table (nn_kernels.h): compiled once per CPU level with
 * that level's flags, as matmul.c and layers.c are, so that the names below
 * are that level's functions. */
#include "nn_kernels.h"

#ifndef TD_LEVEL
#error "kernels_level.c is compiled only per CPU level (Makefile KERNEL_SRCS, -DTD_LEVEL=...)"
#endif

#define NN_KERNEL_ENTRY(name) .k_##name = name,
const nn_kernels NN_LEVEL_NAME(nn_kernels) = {NN_KERNEL_LIST(NN_KERNEL_ENTRY)};
