/* Reduce-scatter over the shared-memory segment: rank r ends with the
 * reduced shard td_shard_range(count, n, r) in recv. Every rank reduces its
 * own shard, so the work is split n ways.
 *
 * A pipeline over rounds; in round k each rank stages the k-th piece (c
 * elements) of every rank's shard, one sync, then each rank reduces its own
 * piece over all n slots straight into recv (one sync per round: a slot of
 * parity p is rewritten two epochs later, after every reader has arrived at
 * the epoch in between):
 *
 *     slot[me][p]:  | piece k of shard 0 | piece k of shard 1 | ... |   (c elements each)
 *     sync
 *     recv[k*c ..] = reduce over j of slot[j][p] at offset me*c
 *
 * Messages that fit in one slot take a single round. In place (recv ==
 * send + offset_me) is safe: a round reads the inputs of its own pieces
 * before writing the output piece, and the output piece is never read again.
 * Cost per rank: read B, write B/n plus B/n·n cache-resident reads, B/(c·n)
 * syncs. TD_AVG is reduced as TD_SUM; select/select.c scales the result. When
 * every rank's send is host-shared (td_mem_alloc), large messages take
 * reduce_scatter_shm_direct.c instead, which stages nothing. */
#include "comm/algorithms/algorithms.h"
#include "comm/transport/shm/shm.h"

#include <string.h>

/* Elements of each shard staged per round: the whole largest shard (len0)
 * when n of them fit a slot, else 1/n of a chunk. */
static size_t piece_of(const td_comm *comm, size_t len0, size_t es) {
  size_t n = (size_t)comm->size;
  size_t piece = n * len0 * es <= shm_slot_bytes(comm) ? len0 : shm_chunk_bytes(comm) / es / n;
  return TD_MAX(piece, (size_t)1);
}

td_status reduce_scatter_shm(td_comm *comm, const comm_op *op) {
  int n = comm->size, me = comm->rank;
  size_t es = td_dtype_size(op->dtype), count = op->count;
  if (shm_trivial(comm)) {
    comm_copy_if_needed(op->recv, op->send, count * es);
    return TD_OK;
  }
  TD_CHECK(shm_require(comm, "reduce_scatter_shm"));
  size_t off[n], len[n];
  for (int r = 0; r < n; r++) td_shard_range(count, n, r, &off[r], &len[r]);
  if (shm_xmap(comm) && count * es >= SHM_DIRECT_MIN_BYTES) {
    TD_CHECK(shm_sync_shared(comm, op, op->send, count * es, op->recv, len[me] * es));
    if (shm_all_shared(comm, 0)) return reduce_scatter_shm_direct(comm, op);
  }
  size_t piece = piece_of(comm, len[0], es);
  size_t rounds = TD_MAX((len[0] + piece - 1) / piece, (size_t)1); /* one sync even for count 0 */
  const char *send = op->send;
  char *recv = op->recv;
  const void *srcs[n];
  for (size_t k = 0; k < rounds; k++) {
    size_t start = k * piece;
    unsigned p = (unsigned)(shm_next_epoch(comm) & 1);
    char *slot = shm_slot(comm, me, p);
    for (int r = 0; r < n; r++) {
      size_t m = len[r] > start ? TD_MIN(piece, len[r] - start) : 0;
      if (m) memcpy(slot + (size_t)r * piece * es, send + (off[r] + start) * es, m * es);
    }
    TD_CHECK(shm_sync(comm, op));
    size_t m = len[me] > start ? TD_MIN(piece, len[me] - start) : 0;
    if (!m) continue;
    for (int j = 0; j < n; j++) srcs[j] = (const char *)shm_slot(comm, j, p) + (size_t)me * piece * es;
    td_reduce_multi(recv + start * es, srcs, n, m, op->dtype, op->redop);
  }
  return TD_OK;
}

/* algorithms.h: every rank writes a piece of each rank's shard into its own
 * slot (piece r at r pieces in) and reads its own piece of every slot; at
 * count and at the largest count whose shards still fit a slot whole. */
static void reach_at(const td_comm *comm, int me, size_t count, size_t es, size_t *reach) {
  int n = comm->size;
  size_t off, len, len0, mine = 0;
  td_shard_range(count, n, 0, &off, &len0);
  size_t piece = piece_of(comm, len0, es);
  for (int r = 0; r < n; r++) {
    td_shard_range(count, n, r, &off, &len);
    if (len) mine = TD_MAX(mine, ((size_t)r * piece + TD_MIN(piece, len)) * es);
  }
  reach[me] = TD_MAX(reach[me], mine);
  td_shard_range(count, n, me, &off, &len);
  if (len == 0) return;
  for (int k = 0; k < n; k++) reach[k] = TD_MAX(reach[k], ((size_t)me * piece + TD_MIN(piece, len)) * es);
}

void reduce_scatter_shm_reach(const td_comm *comm, int me, size_t count, td_dtype dtype, size_t *reach) {
  size_t es = td_dtype_size(dtype), n = (size_t)comm->size;
  if (n < 2 || count == 0 || es == 0) return;
  size_t whole = shm_slot_bytes(comm) / es / n * n; /* n shards of len0 = slot / es / n */
  reach_at(comm, me, count, es, reach);
  if (whole > 0 && whole < count) reach_at(comm, me, whole, es, reach);
}
