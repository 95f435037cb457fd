/* Broadcast over the shared-memory segment: the root stages the buffer in
 * its slots chunk by chunk; every other rank copies each chunk out.
 *
 *     root:   slot[root][p] <- buf[k*c ..]
 *     sync                                   (one per chunk)
 *     others: buf[k*c ..] <- slot[root][p]
 *
 * The two parities pipeline the copies: while the others copy chunk k out
 * of parity p, the root already stages chunk k+1 in parity p^1; it rewrites
 * parity p only after the next sync, which the readers reach only when done.
 * Messages that fit in one slot take a single sync. Cost: the root copies B
 * once, every other rank copies B once (streaming stores when large).
 * When the root's buffer is host-shared (td_mem_alloc), large messages take
 * broadcast_shm_direct.c instead: the others copy straight from it. */
#include "comm/algorithms/algorithms.h"
#include "comm/transport/shm/shm.h"

#include <string.h>

#define SHM_STREAM_MIN ((size_t)4 << 20)

td_status broadcast_shm(td_comm *comm, const comm_op *op) {
  int me = comm->rank;
  size_t bytes = comm_op_bytes(op);
  /* The buffer: recv if the caller filled it, else send (same pointer). */
  char *buf = op->recv ? op->recv : (char *)op->send;
  const char *src = op->send ? op->send : op->recv;
  if (shm_trivial(comm)) {
    comm_copy_if_needed(buf, src, bytes);
    return TD_OK;
  }
  TD_CHECK(shm_require(comm, "broadcast_shm"));
  if (shm_xmap(comm) && bytes >= SHM_DIRECT_MIN_BYTES) {
    TD_CHECK(shm_sync_shared(comm, op, src, bytes, buf, bytes));
    if (shm_shared(comm, op->root, 0)) return broadcast_shm_direct(comm, op, src, buf);
  }
  if (me == op->root) comm_copy_if_needed(buf, src, bytes);
  size_t chunk = bytes <= shm_slot_bytes(comm) ? bytes : shm_chunk_bytes(comm);
  chunk = TD_MAX(chunk, (size_t)1);
  size_t rounds = TD_MAX((bytes + chunk - 1) / chunk, (size_t)1);
  bool stream = bytes >= SHM_STREAM_MIN;
  for (size_t k = 0; k < rounds; k++) {
    size_t start = k * chunk, m = bytes > start ? TD_MIN(chunk, bytes - start) : 0;
    unsigned p = (unsigned)(shm_next_epoch(comm) & 1);
    if (me == op->root && m) memcpy(shm_slot(comm, me, p), src + start, m);
    TD_CHECK(shm_sync(comm, op));
    if (me != op->root && m) shm_copy(buf + start, shm_slot(comm, op->root, p), m, stream);
  }
  return TD_OK;
}

/* algorithms.h: the root writes its slot, a round of up to a slot at a
 * time, the others read it; any rank may be the root. The largest message
 * up to count that fits one slot reaches furthest (a longer one goes by
 * chunks, at most a slot). */
void broadcast_shm_reach(const td_comm *comm, int me, size_t count, td_dtype dtype, size_t *reach) {
  (void)me;
  size_t bytes = count * td_dtype_size(dtype);
  if (comm->size < 2 || bytes == 0) return;
  bytes = TD_MIN(bytes, shm_slot_bytes(comm));
  for (int k = 0; k < comm->size; k++) reach[k] = TD_MAX(reach[k], bytes);
}
