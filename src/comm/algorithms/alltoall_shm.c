/* Alltoall over the shared-memory segment: block j of every rank's send
 * (count elements) lands as block r (the sender) of rank j's recv.
 *
 * A pipeline over rounds, one sync each; in round k each rank stages piece
 * k (c elements) of each of its n blocks, then copies from every rank's slot
 * the piece addressed to it:
 *
 *     slot[me][p]: | piece k of block 0 | piece k of block 1 | ... |
 *     sync
 *     recv block j, piece k <- slot[j][p] at offset me*c    (all j)
 *
 * Messages whose n blocks fit in one slot take a single round. Cost per
 * rank: B staged and B copied out, B/(c·n) syncs. When every rank's send
 * is host-shared (td_mem_alloc), large messages take
 * alltoall_shm_direct.c instead, which stages nothing. Not in place
 * (tandem/comm.h). */
#include "comm/algorithms/algorithms.h"
#include "comm/transport/shm/shm.h"

#include <string.h>

td_status alltoall_shm(td_comm *comm, const comm_op *op) {
  int n = comm->size, me = comm->rank;
  size_t es = td_dtype_size(op->dtype), count = op->count;
  if (shm_trivial(comm)) {
    comm_copy_if_needed(op->recv, op->send, count * es);
    return TD_OK;
  }
  TD_CHECK(shm_require(comm, "alltoall_shm"));
  if (shm_xmap(comm) && count * es * (size_t)n >= SHM_DIRECT_MIN_BYTES) {
    TD_CHECK(shm_sync_shared(comm, op, op->send, count * es * (size_t)n, op->recv,
                             count * es * (size_t)n));
    if (shm_all_shared(comm, 0)) return alltoall_shm_direct(comm, op);
  }
  size_t piece = count * es * (size_t)n <= shm_slot_bytes(comm) ? count : shm_chunk_bytes(comm) / es / (size_t)n;
  piece = TD_MAX(piece, (size_t)1);
  size_t rounds = TD_MAX((count + piece - 1) / piece, (size_t)1); /* one sync even for count 0 */
  const char *send = op->send;
  char *recv = op->recv;
  for (size_t k = 0; k < rounds; k++) {
    size_t start = k * piece, m = count > start ? TD_MIN(piece, count - start) : 0;
    unsigned p = (unsigned)(shm_next_epoch(comm) & 1);
    char *slot = shm_slot(comm, me, p);
    for (int j = 0; j < n && m; j++)
      memcpy(slot + (size_t)j * piece * es, send + ((size_t)j * count + start) * es, m * es);
    TD_CHECK(shm_sync(comm, op));
    for (int j = 0; j < n && m; j++)
      memcpy(recv + ((size_t)j * count + start) * es, (const char *)shm_slot(comm, j, p) + (size_t)me * piece * es,
             m * es);
  }
  return TD_OK;
}
