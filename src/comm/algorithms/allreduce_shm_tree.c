/* Allreduce of small messages among many ranks over the shared segment: a
 * reduction tree of fan-in SHM_TREE_FANIN through the slots, whose root's
 * result every rank then copies.
 *
 * Why: the flat algorithms of allreduce_shm.c make every rank read every
 * other rank's slot (the single-sync form reads all n inputs, the pipeline
 * reads its slice of each). Slots lie a megabyte apart, so each read is a
 * page this process has not mapped yet: n first-touch page faults per rank,
 * n^2 in the job, each tens of microseconds in a virtual machine (measured
 * here: 256 ranks, 4 KiB, the first allreduce took 3.6 s, almost all of it
 * page faults). In the tree a rank reads at most SHM_TREE_FANIN slots per
 * level it leads plus the root's, so the job maps O(n) pages.
 *
 *   epoch e:    every rank copies send into slot[r][p]          sync
 *   level 0:    r % G == 0 reduces slot[r .. r+G-1][p]
 *               into slot[r][p^1]                               sync
 *   level 1:    r % G^2 == 0 reduces slot[r + j*G][p^1], j < G
 *               into slot[r][p]                                 sync
 *   ...         until one group spans every rank (rank 0 holds the result)
 *   every rank: recv = slot[0][last parity]
 *
 * The slot rule of transport/shm/shm.h holds: a rank writes its slot of parity q
 * only before arriving at an epoch of parity q, and reads a slot of parity
 * q only after that epoch's sync and before its next arrival. Every rank
 * copies the same bytes, so results agree bit for bit. Syncs: 1 +
 * ceil(log_G n) (3 for 17..256 ranks) against 1 or 2 for the flat forms, so
 * allreduce_shm.c takes the tree only when many ranks would otherwise touch
 * many pages for little data (see there). f16/bf16 are not taken here: each
 * level would round the partial sums to the half type (select/select.c's rule that
 * halves accumulate in f32). TD_AVG: rank 0 divides the root's sum once, in
 * its slot, before the last sync, so every rank copies the same divided bits
 * (select/select.c leaves allreduce_shm's results alone). */
#include "comm/algorithms/algorithms.h"
#include "comm/transport/shm/shm.h"

#include <string.h>

td_status allreduce_shm_tree(td_comm *comm, const comm_op *op) {
  int n = comm->size, me = comm->rank;
  size_t bytes = comm_op_bytes(op);
  if (bytes > shm_slot_bytes(comm))
    return comm_fail(comm, TD_ERR_INTERNAL, "allreduce_shm_tree: %zu bytes do not fit a %zu-byte slot", bytes,
                     shm_slot_bytes(comm));
  unsigned p = (unsigned)(shm_next_epoch(comm) & 1);
  if (bytes) memcpy(shm_slot(comm, me, p), op->send, bytes);
  TD_CHECK(shm_sync(comm, op));
  const void *srcs[SHM_TREE_FANIN];
  for (long span = 1; span < n; span *= SHM_TREE_FANIN) {
    long group = span * SHM_TREE_FANIN;
    if (me % group == 0 && bytes) {
      int k = 0;
      for (long c = me; c < n && k < SHM_TREE_FANIN; c += span) srcs[k++] = shm_slot(comm, (int)c, p);
      td_reduce_multi(shm_slot(comm, me, p ^ 1), srcs, k, op->count, op->dtype, op->redop);
      if (op->redop == TD_AVG && group >= n) td_reduce_scale(shm_slot(comm, me, p ^ 1), op->count, op->dtype, n);
    }
    p ^= 1;
    TD_CHECK(shm_sync(comm, op));
  }
  if (bytes) memcpy(op->recv, shm_slot(comm, 0, p), bytes);
  return TD_OK;
}
