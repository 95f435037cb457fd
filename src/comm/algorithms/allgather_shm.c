/* Allgather over the shared-memory segment: rank r contributes the shard
 * td_shard_range(count, n, r) and every rank receives all count elements.
 *
 * A pipeline over rounds, one sync each; in round k each rank stages the
 * k-th piece (c elements) of its shard in its slot, then every rank copies
 * every other rank's piece out:
 *
 *     slot[me][p] <- send[k*c ..]            (piece k of my shard)
 *     sync
 *     recv[off_j + k*c ..] <- slot[j][p]     for every j != me
 *
 * A slot of parity p is rewritten two epochs later, after every reader
 * arrived at the epoch in between. The own shard goes straight from send to
 * recv (nothing to do in place, where send == recv + off_me). Messages that
 * fit in one slot take a single round. Cost per rank: B/n staged, B·(n-1)/n
 * copied out with streaming stores when large, B/(c) syncs per n ranks.
 * When every rank's send is host-shared (td_mem_alloc), large messages take
 * allgather_shm_direct.c instead, which stages nothing. */
#include "comm/algorithms/algorithms.h"
#include "comm/transport/shm/shm.h"

#include <string.h>

#define SHM_STREAM_MIN ((size_t)4 << 20)

/* Elements of a shard staged per round: the whole largest shard (len0)
 * when it fits a slot, else a chunk. */
static size_t piece_of(const td_comm *comm, size_t len0, size_t es) {
  size_t piece = len0 * es <= shm_slot_bytes(comm) ? len0 : shm_chunk_bytes(comm) / es;
  return TD_MAX(piece, (size_t)1);
}

td_status allgather_shm(td_comm *comm, const comm_op *op) {
  int n = comm->size, me = comm->rank;
  size_t es = td_dtype_size(op->dtype), count = op->count;
  size_t off[n], len[n];
  for (int r = 0; r < n; r++) td_shard_range(count, n, r, &off[r], &len[r]);
  char *recv = op->recv;
  const char *send = op->send;
  if (len[me]) comm_copy_if_needed(recv + off[me] * es, send, len[me] * es);
  if (shm_trivial(comm)) return TD_OK;
  TD_CHECK(shm_require(comm, "allgather_shm"));
  if (shm_xmap(comm) && count * es >= SHM_DIRECT_MIN_BYTES) {
    TD_CHECK(shm_sync_shared(comm, op, send, len[me] * es, recv, count * es));
    if (shm_all_shared(comm, 0)) return allgather_shm_direct(comm, op);
  }
  size_t piece = piece_of(comm, len[0], es);
  size_t rounds = TD_MAX((len[0] + piece - 1) / piece, (size_t)1); /* one sync even for count 0 */
  bool stream = count * es >= SHM_STREAM_MIN;
  for (size_t k = 0; k < rounds; k++) {
    size_t start = k * piece;
    unsigned p = (unsigned)(shm_next_epoch(comm) & 1);
    size_t mine = len[me] > start ? TD_MIN(piece, len[me] - start) : 0;
    /* Read the own piece from recv: in place, send may overlap it. */
    if (mine) memcpy(shm_slot(comm, me, p), recv + (off[me] + start) * es, mine * es);
    TD_CHECK(shm_sync(comm, op));
    for (int j = 0; j < n; j++) {
      size_t m = len[j] > start ? TD_MIN(piece, len[j] - start) : 0;
      if (j == me || !m) continue;
      shm_copy(recv + (off[j] + start) * es, shm_slot(comm, j, p), m * es, stream);
    }
  }
  return TD_OK;
}

/* algorithms.h: every rank writes its first piece into its own slot and
 * reads every other rank's; at count and at the largest count whose shards
 * still fit a slot whole (past it the piece drops to a chunk). */
static void reach_at(const td_comm *comm, size_t count, size_t es, size_t *reach) { /* the same from every rank */
  size_t off, len, len0;
  td_shard_range(count, comm->size, 0, &off, &len0);
  size_t piece = piece_of(comm, len0, es);
  for (int k = 0; k < comm->size; k++) {
    td_shard_range(count, comm->size, k, &off, &len);
    reach[k] = TD_MAX(reach[k], TD_MIN(piece, len) * es);
  }
}

void allgather_shm_reach(const td_comm *comm, int me, size_t count, td_dtype dtype, size_t *reach) {
  (void)me;
  size_t es = td_dtype_size(dtype), whole = shm_slot_bytes(comm) / TD_MAX(es, (size_t)1) * (size_t)comm->size;
  if (comm->size < 2 || count == 0 || es == 0) return;
  reach_at(comm, count, es, reach);
  if (whole < count) reach_at(comm, whole, es, reach);
}
