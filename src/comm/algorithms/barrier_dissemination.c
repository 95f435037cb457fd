/* barrier_dissemination (any transport, p2p): ceil(log2 n) rounds; in round
 * k rank r sends an empty frame to (r + 2^k) mod n and receives one from
 * (r - 2^k) mod n. After the last round every rank has heard, directly or
 * transitively, from every other, so none leaves before all have arrived.
 *
 *   n = 5, round 0: 0->1 1->2 2->3 3->4 4->0
 *          round 1: 0->2 1->3 2->4 3->0 4->1
 *          round 2: 0->4 1->0 2->1 3->2 4->3
 *
 * Cost: ceil(log2 n) latencies, no payload. Each round talks to a different
 * peer, so frames of one barrier never queue behind each other. */
#include "comm/algorithms/algorithms.h"
#include "comm/p2p/p2p.h"

td_status barrier_dissemination(td_comm *comm, const comm_op *op) {
  int n = comm->size, r = comm->rank;
  for (int dist = 1; dist < n; dist <<= 1)
    TD_CHECK(p2p_exchange(comm, op, (r + dist) % n, NULL, 0, (r - dist + n) % n, NULL, 0));
  return TD_OK;
}
