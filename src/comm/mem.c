/* td_mem_alloc / td_mem_free: host-shared buffers (net/hostmem.c), which the
 * shm transport maps across ranks for the direct collectives. */
#include "comm/core/core.h"

td_status td_mem_alloc(size_t bytes, void **out) {
  if (!out) return td_error(TD_ERR_INVALID_ARGUMENT, "td_mem_alloc: out must not be NULL");
  *out = NULL;
  /* Rounding up to whole pages must not wrap around. */
  if (bytes > SIZE_MAX / 2)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_mem_alloc: %zu bytes is more than the address space can hold", bytes);
  return net_hostmem_alloc(bytes, out);
}

void td_mem_free(void *p) {
  if (p && !net_hostmem_free(p))
    td_log(TD_LOG_WARN, "td_mem_free(%p): not a block from td_mem_alloc (or freed twice); nothing freed", p);
}
