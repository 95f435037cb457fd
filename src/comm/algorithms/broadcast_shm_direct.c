/* Broadcast straight from the root's host-shared buffer (td_mem_alloc at the
 * root): every other rank copies it into its own buffer, in parallel.
 *
 *     shm_sync_shared      (caller: the root's source is published)
 *     buf = src of root                             (every rank but the root)
 *     shm_sync             (the root returns only when everyone has read it)
 *
 * One copy per byte and rank instead of two through the segment's slots,
 * and the root copies nothing. */
#include "comm/algorithms/algorithms.h"
#include "comm/transport/shm/shm.h"

#include <string.h>

td_status broadcast_shm_direct(td_comm *comm, const comm_op *op, const char *src, char *buf) {
  size_t bytes = comm_op_bytes(op);
  if (comm->rank != op->root && bytes) {
    char *root_src;
    TD_CHECK(shm_peer_buffer(comm, op->root, 0, &root_src));
    memcpy(buf, root_src, bytes);
  } else if (comm->rank == op->root) {
    comm_copy_if_needed(buf, src, bytes);
  }
  return shm_sync(comm, op);
}
