/* td_mem_alloc / td_mem_free: host-shared buffers (net/hostmem.c), which the
 * shm transport maps across ranks for the direct collectives, and
 * td_comm_direct_min_bytes: which collectives go direct (for estimates). */
#include "comm/core/core.h"
#include "comm/algorithms/algorithms.h"
#include "comm/transport/shm/shm.h"

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

size_t td_comm_direct_min_bytes(const td_comm *comm) { return shm_xmap(comm) ? SHM_DIRECT_MIN_BYTES : 0; }
