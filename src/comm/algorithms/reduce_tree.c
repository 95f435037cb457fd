/* Binomial-tree reduce (MPICH's MPIR_Reduce_intra_binomial), pipelined in
 * chunks for large messages.
 *
 * The tree is the broadcast's (broadcast_tree.c) with the arrows reversed:
 * relative rank v = (r - root) mod n receives from its children v + m
 * (powers of two m < lowbit(v)), combines their partial results with its own
 * input, and sends the sum to its parent v - lowbit(v).
 *
 *   n = 8:   7 -> 6     6, 5 -> 4     3 -> 2     4, 2, 1 -> 0 (root)
 *
 * The vector moves in chunks of TANDEM_BCAST_CHUNK_BYTES: while a rank
 * receives chunk i from its children it sends its combined chunk i-1 up, so
 * every level of the tree is busy at once. A rank combines its own input and
 * all its children's chunks in one pass (td_reduce_multi). f16/bf16 sums
 * arrive as f32 partials (select/select.c), rounded once at the root; with
 * TANDEM_HALF_PARTIALS=half they are rounded once per rank.
 *
 * Cost: ceil(log2 n) + chunks - 1 steps; the root receives bytes times its
 * number of children. Memory: one chunk per child plus two for the partial
 * sum. TD_AVG is summed (select/select.c divides at the root). recv is used only at
 * the root (in place there: send == recv). */
#include "comm/algorithms/algorithms.h"
#include "comm/p2p/p2p.h"

td_status reduce_tree(td_comm *comm, const comm_op *op) {
  const int n = comm->size, r = comm->rank, root = op->root;
  const size_t esz = td_dtype_size(op->dtype);
  if (n == 1) {
    comm_copy_if_needed(op->recv, op->send, comm_op_bytes(op));
    return TD_OK;
  }
  size_t chunk = comm_tun_bytes(comm->tun.bcast_chunk_bytes, BCAST_DEFAULT_CHUNK_BYTES) / esz;
  if (chunk == 0) chunk = 1;
  chunk = TD_MIN(chunk, TD_MAX(op->count, 1));

  const int v = (r - root + n) % n;
  int top = 1;
  while (top < n && !(v & top)) top <<= 1;
  const int parent = v ? (v - top + root) % n : -1;
  p2p_xfer children[32];
  int n_children = 0;
  for (int m = top >> 1; m > 0; m >>= 1)
    if (v + m < n) children[n_children++] = (p2p_xfer){.peer = (v + m + root) % n};

  /* stage: one chunk per child; partial: two chunks (one being sent up while
   * the next is combined), needed only by inner ranks. A leaf sends its input. */
  char *stage = NULL, *partial = NULL;
  if (n_children) {
    stage = td_alloc((size_t)n_children * chunk * esz);
    partial = parent >= 0 ? td_alloc(2 * chunk * esz) : NULL;
    if (!stage || (parent >= 0 && !partial)) {
      td_free(stage);
      td_free(partial);
      return comm_fail(comm, TD_ERR_SYSTEM, "reduce_tree: out of memory for %d chunks of %zu bytes",
                       n_children + 2, chunk * esz);
    }
  }

  td_status st = TD_OK;
  const size_t nch = n_chunks(op->count, chunk);
  for (size_t i = 0; i <= nch && st == TD_OK; i++) {
    /* Iteration i receives chunk i from the children and sends chunk i-1 up. */
    bool receiving = n_children > 0 && i < nch;
    bool sending = parent >= 0 && (n_children ? i >= 1 : i < nch);
    size_t send_idx = n_children ? i - 1 : i;
    if (!sending && !receiving) continue;
    p2p_xfer up = {.peer = parent};
    if (sending) {
      size_t off = send_idx * chunk, len = op->count > off ? TD_MIN(chunk, op->count - off) : 0;
      up.bytes = len * esz;
      up.buf = !len ? NULL : n_children ? partial + (send_idx % 2) * chunk * esz : elem_ptr(op->send, off, esz);
    }
    size_t off = i * chunk, len = op->count > off ? TD_MIN(chunk, op->count - off) : 0;
    if (receiving)
      for (int k = 0; k < n_children; k++) {
        children[k].buf = len ? stage + (size_t)k * chunk * esz : NULL;
        children[k].bytes = len * esz;
      }
    st = p2p_run(comm, op, &up, sending ? 1 : 0, children, receiving ? n_children : 0);
    if (st != TD_OK || !receiving || len == 0) continue;
    const void *srcs[33];
    srcs[0] = elem_ptr(op->send, off, esz);
    for (int k = 0; k < n_children; k++) srcs[1 + k] = stage + (size_t)k * chunk * esz;
    char *dst = parent < 0 ? elem_ptr(op->recv, off, esz) : partial + (i % 2) * chunk * esz;
    td_reduce_multi(dst, srcs, 1 + n_children, len, op->dtype, op->redop);
  }
  td_free(stage);
  td_free(partial);
  return st;
}
