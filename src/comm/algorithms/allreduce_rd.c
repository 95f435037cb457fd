/* Recursive-doubling allreduce: the latency algorithm (MPICH's
 * MPIR_Allreduce_intra_recursive_doubling, Thakur et al. 2005).
 *
 * With p the largest power of two <= n and rem = n - p, the first 2*rem
 * ranks fold in pairs: each even rank sends its vector to the odd rank
 * above it and sits out; the p remaining ranks are renumbered 0..p-1. Then
 * in round k = 0..log2(p)-1 each rank exchanges its whole vector with the
 * rank whose new number differs in bit k and combines the two. Finally each
 * odd rank of the fold hands the result back to its even partner.
 *
 *   n = 6 (p = 4, rem = 2)
 *   fold:       r0 -> r1, r2 -> r3          (new ranks: r1=0 r3=1 r4=2 r5=3)
 *   round 0:    r1 <-> r3, r4 <-> r5
 *   round 1:    r1 <-> r4, r3 <-> r5
 *   unfold:     r1 -> r0, r3 -> r2
 *
 * Cost: log2(p) (+2 when n is not a power of two) latency steps, each moving
 * the whole vector: bytes * log2(p) per rank. Best for small messages;
 * large ones belong to the ring (allreduce_ring.c).
 *
 * Limits: in each round both partners combine the same two vectors in the
 * same order (the lower rank's first: a NaN's payload out of a + b depends
 * on the order), so every rank ends with bitwise the same result. TD_AVG is summed (select/select.c
 * divides). The exchanged vectors are whole, so memory is one extra copy. */
#include "comm/algorithms/algorithms.h"
#include "comm/p2p/p2p.h"

/* buf = op(lower rank's vector, higher rank's vector), the same operand order
 * on both partners. */
static void combine(const comm_op *op, char *buf, const char *incoming, bool incoming_is_lower) {
  const void *srcs[2] = {incoming_is_lower ? (const void *)incoming : buf, incoming_is_lower ? (const void *)buf : incoming};
  td_reduce_multi(buf, srcs, 2, op->count, op->dtype, op->redop);
}

td_status allreduce_rd(td_comm *comm, const comm_op *op) {
  const int n = comm->size, r = comm->rank;
  const size_t bytes = comm_op_bytes(op);
  char *buf = op->recv;
  comm_copy_if_needed(op->recv, op->send, bytes);
  if (n == 1) return TD_OK;

  char *incoming = td_alloc(TD_MAX(bytes, 1));
  if (!incoming) return comm_fail(comm, TD_ERR_SYSTEM, "allreduce_rd: out of memory for %zu bytes", bytes);
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int rem = n - p;
  td_status st = TD_OK;

  /* Fold the extra ranks into their odd partners. */
  int new_rank;
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      st = p2p_exchange(comm, op, r + 1, buf, bytes, -1, NULL, 0);
      new_rank = -1;
    } else {
      st = p2p_exchange(comm, op, -1, NULL, 0, r - 1, incoming, bytes);
      if (st == TD_OK) combine(op, buf, incoming, true);
      new_rank = r / 2;
    }
  } else {
    new_rank = r - rem;
  }

  for (int mask = 1; st == TD_OK && new_rank >= 0 && mask < p; mask <<= 1) {
    int partner_new = new_rank ^ mask;
    int partner = partner_new < rem ? partner_new * 2 + 1 : partner_new + rem;
    st = p2p_exchange(comm, op, partner, buf, bytes, partner, incoming, bytes);
    if (st == TD_OK) combine(op, buf, incoming, partner < r);
  }

  /* Hand the result back to the ranks that sat out. */
  if (st == TD_OK && r < 2 * rem) {
    if (r % 2 == 0)
      st = p2p_exchange(comm, op, -1, NULL, 0, r + 1, buf, bytes);
    else
      st = p2p_exchange(comm, op, r - 1, buf, bytes, -1, NULL, 0);
  }
  td_free(incoming);
  return st;
}
