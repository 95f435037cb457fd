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
 * same bits. TD_AVG: the owner of a slice divides it block by block while
 * the block is in L1, then copies it to every rank's recv (a block is read
 * from every send before any recv of it is written, so in place stays
 * safe); select/select.c leaves allreduce_shm's results alone, so no rank
 * makes a pass over its whole recv afterwards. */
#include "comm/algorithms/algorithms.h"
#include "comm/transport/shm/shm.h"

#include <string.h>

/* Block of the reduce-divide-copy of TD_AVG (fits in L1, on the stack). */
#define SHM_DIRECT_AVG_BLOCK_BYTES ((size_t)16 << 10)

/* TD_AVG's slice, block by block: every rank's send reduced (in rank
 * order, as td_reduce_fanout) into an L1 buffer, divided there, copied to
 * every rank's recv. (Not reduced into this rank's own recv: in place that
 * is srcs[me], which td_reduce_multi may only write when it is the first or
 * second source.) */
static void reduce_avg_slice(void *const *dsts, const void *const *srcs, int n, size_t count, td_dtype dtype) {
  _Alignas(64) unsigned char tmp[SHM_DIRECT_AVG_BLOCK_BYTES];
  size_t es = td_dtype_size(dtype), block = SHM_DIRECT_AVG_BLOCK_BYTES / es;
  const void *part[n];
  for (size_t at = 0; at < count; at += block) {
    size_t m = TD_MIN(block, count - at);
    for (int k = 0; k < n; k++) part[k] = (const char *)srcs[k] + at * es;
    td_reduce_multi(tmp, part, n, m, dtype, TD_SUM);
    td_reduce_scale(tmp, m, dtype, n);
    for (int k = 0; k < n; k++) memcpy((char *)dsts[k] + at * es, tmp, m * es);
  }
}

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
  if (op->redop == TD_AVG)
    reduce_avg_slice(dsts, srcs, n, len, op->dtype);
  else
    td_reduce_fanout(dsts, n, srcs, n, len, op->dtype, op->redop);
  return shm_sync(comm, op);
}
