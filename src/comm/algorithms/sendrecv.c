/* td_send / td_recv: one frame each way, matched per ordered pair of ranks
 * by per-pair sequence numbers. The receiver's RECV operation accepts only a
 * SEND frame of the same sequence, count and dtype (p2p/p2p.c checks it), so a
 * size or type disagreement is a TD_ERR_MISMATCH rather than corrupt data. */
#include "comm/algorithms/algorithms.h"
#include "comm/p2p/p2p.h"

td_status p2p_send_recv(td_comm *comm, const comm_op *op) {
  size_t bytes = comm_op_bytes(op);
  if (op->kind == COMM_SEND) return p2p_exchange(comm, op, op->peer, op->send, bytes, -1, NULL, 0);
  if (op->kind == COMM_RECV) return p2p_exchange(comm, op, -1, NULL, 0, op->peer, op->recv, bytes);
  return comm_fail(comm, TD_ERR_INTERNAL, "p2p_send_recv called for a %s", comm_kind_name(op->kind));
}
