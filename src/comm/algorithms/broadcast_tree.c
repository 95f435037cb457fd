/* Binomial-tree broadcast (MPICH's MPIR_Bcast_intra_binomial), pipelined in
 * chunks for large messages.
 *
 * Ranks are numbered relative to the root (v = (r - root) mod n). Rank v
 * receives from v - lowbit(v) and sends to v + m for each power of two
 * m < lowbit(v) (m < n for the root), largest subtree first:
 *
 *   n = 8:   0 -> 4, 2, 1     4 -> 6, 5     2 -> 3     6 -> 7
 *
 * The buffer moves in chunks of TANDEM_BCAST_CHUNK_BYTES: while a rank
 * receives chunk i from its parent it forwards chunk i-1 to its children, so
 * the levels of the tree work at the same time instead of one after the
 * other.
 *
 * Cost: ceil(log2 n) + chunks - 1 steps; the root sends bytes times its
 * number of children (up to log2 n), which is what limits bandwidth; a
 * scatter-allgather broadcast would do better for huge messages on many
 * ranks. An empty buffer still sends one empty frame down the tree so that
 * disagreements on count or root are caught. */
#include "comm/algorithms/algorithms.h"
#include "comm/p2p/p2p.h"

td_status broadcast_tree(td_comm *comm, const comm_op *op) {
  const int n = comm->size, r = comm->rank, root = op->root;
  if (n == 1) return TD_OK;
  char *buf = op->recv ? op->recv : (char *)op->send;
  const size_t bytes = comm_op_bytes(op);
  const size_t esz = td_dtype_size(op->dtype);
  size_t chunk = comm_tun_bytes(comm->tun.bcast_chunk_bytes, BCAST_DEFAULT_CHUNK_BYTES) / esz * esz;
  if (chunk == 0) chunk = esz;

  const int v = (r - root + n) % n;
  int top = 1; /* the lowest set bit of v, or the first power of two >= n for the root */
  while (top < n && !(v & top)) top <<= 1;
  const int parent = v ? (v - top + root) % n : -1;
  p2p_xfer children[32];
  int n_children = 0;
  for (int m = top >> 1; m > 0; m >>= 1)
    if (v + m < n) children[n_children++] = (p2p_xfer){.peer = (v + m + root) % n};

  const size_t nch = n_chunks(bytes, chunk);
  /* Iteration i receives chunk i and forwards chunk i-1 (the root, having
   * nothing to receive, sends chunk i). */
  for (size_t i = 0; i <= nch; i++) {
    size_t send_idx = parent < 0 ? i : i - 1;
    bool sending = n_children > 0 && (parent < 0 ? i < nch : i >= 1);
    bool receiving = parent >= 0 && i < nch;
    if (!sending && !receiving) continue;
    if (sending) {
      size_t off = send_idx * chunk, len = bytes > off ? TD_MIN(chunk, bytes - off) : 0;
      for (int k = 0; k < n_children; k++) {
        children[k].buf = len ? buf + off : NULL;
        children[k].bytes = len;
      }
    }
    p2p_xfer from_parent = {.peer = parent};
    if (receiving) {
      size_t off = i * chunk;
      from_parent.bytes = bytes > off ? TD_MIN(chunk, bytes - off) : 0;
      from_parent.buf = from_parent.bytes ? buf + off : NULL;
    }
    TD_CHECK(p2p_run(comm, op, children, sending ? n_children : 0, &from_parent, receiving ? 1 : 0));
  }
  return TD_OK;
}
