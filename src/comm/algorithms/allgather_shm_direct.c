/* Allgather straight from host-shared send buffers (td_mem_alloc on every
 * rank): each rank copies every other rank's shard from that rank's send
 * into its own recv.
 *
 *     shm_sync_shared      (caller: every rank's send is published)
 *     recv[shard k] = send_k for every k != me     (own shard: the caller)
 *     shm_sync             (no rank returns while others still read its send)
 *
 * One copy per byte instead of two through the segment's slots. In place
 * (send_k == recv_k + off_k) is safe: a rank only ever writes the shards of
 * its recv that are not its own, and only its own shard is read by others. */
#include "comm/algorithms/algorithms.h"
#include "comm/transport/shm/shm.h"

#include <string.h>

td_status allgather_shm_direct(td_comm *comm, const comm_op *op) {
  int n = comm->size, me = comm->rank;
  size_t es = td_dtype_size(op->dtype);
  char *recv = op->recv;
  for (int k = 0; k < n; k++) {
    size_t off, len;
    td_shard_range(op->count, n, k, &off, &len);
    if (k == me || !len) continue;
    char *send;
    TD_CHECK(shm_peer_buffer(comm, k, 0, &send));
    memcpy(recv + off * es, send, len * es);
  }
  return shm_sync(comm, op);
}
