/* barrier_shm (shm transport): one epoch of the shared segment's sync,
 * which also checks that every rank issued the same operation. Cost: one
 * arrival per rank on the segment, woken by futex when a rank sleeps. */
#include "comm/algorithms/algorithms.h"
#include "comm/transport/shm/shm.h"

td_status barrier_shm(td_comm *comm, const comm_op *op) { return shm_sync(comm, op); }
