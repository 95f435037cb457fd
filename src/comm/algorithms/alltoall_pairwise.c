/* Pairwise-exchange alltoall (MPICH's MPIR_Alltoall_intra_pairwise).
 *
 * Rank r copies its own block, then in step s = 1..n-1 sends block r+s to
 * rank r+s and receives block r-s from rank r-s, so that every rank has
 * exactly one partner to send to and one to receive from in each step and
 * no link carries two messages at once.
 *
 *   n = 4, step 1: 0->1 1->2 2->3 3->0    step 2: 0->2 1->3 2->0 3->1
 *
 * Cost: n-1 latency steps, (n-1) blocks sent and received per rank.
 * Limits: not in place (send and recv are distinct buffers of n blocks). */
#include "comm/algorithms/algorithms.h"
#include "comm/p2p/p2p.h"

td_status alltoall_pairwise(td_comm *comm, const comm_op *op) {
  const int n = comm->size, r = comm->rank;
  const size_t block = comm_op_bytes(op);
  const char *send = op->send;
  char *recv = op->recv;
  if (block) comm_copy_if_needed(recv + (size_t)r * block, send + (size_t)r * block, block);
  for (int s = 1; s < n; s++) {
    int to = (r + s) % n, from = (r - s + n) % n;
    TD_CHECK(p2p_exchange(comm, op, to, block ? send + (size_t)to * block : NULL, block, from,
                          block ? recv + (size_t)from * block : NULL, block));
  }
  return TD_OK;
}
