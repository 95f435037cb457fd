/* Allreduce straight between host-shared buffers (td_mem_alloc on every
 * rank): each rank reduces its 1/n slice of the vector from every rank's
 * send buffer and writes the result into every rank's recv buffer.
 *
 *     shm_sync_shared      (caller: every rank's buffers are published)
 *     for my slice, in one pass (td_reduce_fanout):
 *         recv_k = op(send_0, ..., send_{n-1}) for every rank k   (rank order)
 *     shm_sync             (no rank returns while others still write to it)
 *
 * Nothing goes through the segment's slots, and no data crosses between
 * cores while being staged: per rank the traffic is n/n-th reads and writes
 * of the vector (2·B for 2 ranks), the minimum for an allreduce, against
 * about twice that plus cache-to-cache transfers for the slot pipeline
 * (allreduce_shm.c). Two syncs in all, whatever the size.
 *
 * In place is safe without more syncs: each element is read (from every
 * send) and written (to every recv) by exactly one rank, which reads before
 * it writes. Each element's result is computed once, so every rank gets the
 * same bits. TD_AVG is reduced as TD_SUM; select/select.c scales the result after
 * the final sync, when no peer writes to it any more. */
#include "comm/algorithms/algorithms.h"
#include "comm/transport/shm/shm.h"

#include <string.h>

td_status allreduce_shm_direct(td_comm *comm, const comm_op *op) {
  int n = comm->size, me = comm->rank;
  size_t es = td_dtype_size(op->dtype);
  char *send[n], *recv[n];
  for (int k = 0; k < n; k++) {
    TD_CHECK(shm_peer_buffer(comm, k, 0, &send[k]));
    TD_CHECK(shm_peer_buffer(comm, k, 1, &recv[k]));
  }
  size_t off, len;
  td_shard_range(op->count, n, me, &off, &len);
  const void *srcs[n];
  void *dsts[n];
  for (int k = 0; k < n; k++) {
    srcs[k] = send[k] + off * es;
    dsts[k] = recv[k] + off * es;
  }
  td_reduce_fanout(dsts, n, srcs, n, len, op->dtype, op->redop);
  return shm_sync(comm, op);
}
