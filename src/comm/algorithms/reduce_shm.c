/* Reduce to a root over the shared-memory segment.
 *
 * Small messages (one slot, n x bytes <= SHM_REDUCE_SMALL_TOTAL), one sync: every rank
 * stages its input, the root reduces all n slots into recv.
 *
 * Large messages, the allreduce pipeline without its all-to-all copy-out:
 *
 *     copy my chunk into slot[me][p]
 *     sync
 *     reduce my 1/n slice over slot[0..n-1][p] into slot[me][p^1]
 *     sync
 *     root: copy every rank's reduced slice into recv
 *
 * so the reduction work is split n ways and the root only gathers.
 * TD_AVG is reduced as TD_SUM; select/select.c scales the result at the root. */
#include "comm/algorithms/algorithms.h"
#include "comm/transport/shm/shm.h"

#include <string.h>

/* As in allreduce_shm.c: bytes read by the root, message x ranks. */
#define SHM_REDUCE_SMALL_TOTAL ((size_t)512 << 10)

td_status reduce_shm(td_comm *comm, const comm_op *op) {
  int n = comm->size, me = comm->rank;
  size_t es = td_dtype_size(op->dtype), bytes = comm_op_bytes(op);
  bool root = me == op->root;
  if (shm_trivial(comm)) {
    comm_copy_if_needed(op->recv, op->send, bytes);
    return TD_OK;
  }
  TD_CHECK(shm_require(comm, "reduce_shm"));
  const char *send = op->send;
  char *recv = op->recv;
  const void *srcs[n];
  if (bytes * (size_t)n <= SHM_REDUCE_SMALL_TOTAL && bytes <= shm_slot_bytes(comm)) {
    unsigned p = (unsigned)(shm_next_epoch(comm) & 1);
    if (bytes) memcpy(shm_slot(comm, me, p), send, bytes);
    TD_CHECK(shm_sync(comm, op));
    if (!root) return TD_OK;
    for (int k = 0; k < n; k++) srcs[k] = shm_slot(comm, k, p);
    td_reduce_multi(recv, srcs, n, op->count, op->dtype, op->redop);
    return TD_OK;
  }
  size_t chunk = TD_MAX(shm_chunk_bytes(comm) / es, (size_t)1);
  for (size_t base = 0; base < op->count; base += chunk) {
    size_t m = TD_MIN(chunk, op->count - base), off, len;
    unsigned p = (unsigned)(shm_next_epoch(comm) & 1);
    memcpy(shm_slot(comm, me, p), send + base * es, m * es);
    TD_CHECK(shm_sync(comm, op));
    td_shard_range(m, n, me, &off, &len);
    for (int k = 0; k < n; k++) srcs[k] = (const char *)shm_slot(comm, k, p) + off * es;
    td_reduce_multi((char *)shm_slot(comm, me, p ^ 1) + off * es, srcs, n, len, op->dtype, op->redop);
    TD_CHECK(shm_sync(comm, op));
    if (!root) continue;
    for (int k = 0; k < n; k++) {
      td_shard_range(m, n, k, &off, &len);
      memcpy(recv + (base + off) * es, (const char *)shm_slot(comm, k, p ^ 1) + off * es, len * es);
    }
  }
  return TD_OK;
}
