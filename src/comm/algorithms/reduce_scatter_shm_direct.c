/* Reduce-scatter straight from host-shared send buffers (td_mem_alloc on
 * every rank): rank r reduces its shard td_shard_range(count, n, r) from
 * every rank's send buffer into its own recv, in one pass.
 *
 *     shm_sync_shared      (caller: every rank's send is published)
 *     recv = op(send_0[shard], ..., send_{n-1}[shard])       (rank order)
 *     shm_sync             (no rank returns, and lets its caller change its
 *                           send, while others may still read it)
 *
 * Per rank the traffic is n reads of its shard and one write: nothing is
 * staged. In place (recv == send_me + off_me) is safe: each element of the
 * shard is read from every send before it is written, and no other rank
 * reads this rank's shard of anyone's send. TD_AVG is reduced as TD_SUM;
 * select/select.c scales the result. */
#include "comm/algorithms/algorithms.h"
#include "comm/transport/shm/shm.h"

td_status reduce_scatter_shm_direct(td_comm *comm, const comm_op *op) {
  int n = comm->size, me = comm->rank;
  size_t es = td_dtype_size(op->dtype), off, len;
  td_shard_range(op->count, n, me, &off, &len);
  const void *srcs[n];
  for (int k = 0; k < n; k++) {
    char *send;
    TD_CHECK(shm_peer_buffer(comm, k, 0, &send));
    srcs[k] = send + off * es;
  }
  void *dst = op->recv;
  td_reduce_fanout(&dst, 1, srcs, n, len, op->dtype, op->redop);
  return shm_sync(comm, op);
}
