/* Alltoall straight from host-shared send buffers (td_mem_alloc on every
 * rank): each rank copies the block addressed to it from every other
 * rank's send into its own recv.
 *
 *     shm_sync_shared      (caller: every rank's send is published)
 *     recv block j = block me of send_j, for every j    (own: a local copy)
 *     shm_sync             (no rank returns while others still read its send)
 *
 * One copy per byte and two synchronizations, where the staged form
 * (alltoall_shm.c) copies twice and synchronizes once per slot-sized
 * round: on a loaded host each synchronization waits for the slowest
 * rank's next time slice. Not in place (tandem/comm.h). */
#include "comm/algorithms/algorithms.h"
#include "comm/transport/shm/shm.h"

#include <string.h>

td_status alltoall_shm_direct(td_comm *comm, const comm_op *op) {
  int n = comm->size, me = comm->rank;
  size_t block = op->count * td_dtype_size(op->dtype);
  char *recv = op->recv;
  for (int j = 0; j < n; j++) {
    const char *send;
    if (j == me) {
      send = op->send;
    } else {
      char *peer;
      TD_CHECK(shm_peer_buffer(comm, j, 0, &peer));
      send = peer;
    }
    if (block) memcpy(recv + (size_t)j * block, send + (size_t)me * block, block);
  }
  return shm_sync(comm, op);
}
