/* td_mem_alloc / td_mem_free: host-shared buffers (net/hostmem.c), which the
 * shm transport maps across ranks for the direct collectives, and for
 * memory estimates: td_comm_direct_min_bytes (which collectives go direct)
 * and td_comm_staging_bytes (what the staged ones and the point-to-point
 * FIFOs make a rank touch of its communicator's segment). */
#include "comm/core/core.h"
#include "comm/algorithms/algorithms.h"
#include "comm/device/device_coll.h"
#include "comm/transport/shm/shm.h"

#include <stdlib.h>
#include <string.h>

td_status td_mem_alloc(size_t bytes, void **out) {
  if (!out) return td_error(TD_ERR_INVALID_ARGUMENT, "td_mem_alloc: out must not be NULL");
  *out = NULL;
  /* Rounding up to whole pages must not wrap around. */
  if (bytes > SIZE_MAX / 2)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_mem_alloc: %zu bytes is more than the address space can hold", bytes);
  return net_hostmem_alloc(bytes, out);
}

void td_mem_free(void *p) {
  if (p && !net_hostmem_free(p))
    td_log(TD_LOG_WARN, "td_mem_free(%p): not a block from td_mem_alloc (or freed twice); nothing freed", p);
}

size_t td_comm_direct_min_bytes(const td_comm *comm) { return shm_xmap(comm) ? SHM_DIRECT_MIN_BYTES : 0; }

/* How far rank `me` reaches into each rank's slots running the traffic's
 * shm collectives (algorithms.h: *_shm_reach); false when some of them go
 * point to point instead (over the FIFOs). */
static bool reach_of(const td_comm *comm, int me, const td_comm_traffic *tr, size_t *reach) {
  const td_dtype f32 = TD_F32;
  const size_t es = td_dtype_size(f32);
  bool shm_allreduce = comm->sel_allreduce == COMM_ALGO_SHM ||
                       (comm->sel_allreduce == COMM_ALGO_AUTO && comm->sel_shm_collectives);
  bool staged = true;
  if (tr->allreduce) {
    if (shm_allreduce) allreduce_shm_reach(comm, me, tr->allreduce / es, f32, reach);
    else staged = false;
  }
  if (comm->sel_shm_collectives) {
    if (tr->allgather) allgather_shm_reach(comm, me, tr->allgather / es, f32, reach);
    if (tr->reduce_scatter) reduce_scatter_shm_reach(comm, me, tr->reduce_scatter / es, f32, reach);
    if (tr->broadcast) broadcast_shm_reach(comm, me, tr->broadcast / es, f32, reach);
  } else if (tr->allgather || tr->reduce_scatter || tr->broadcast) {
    staged = false;
  }
  return staged;
}

/* The algorithms' own rules say how far into each rank's slots this rank
 * reaches, and how far each peer writes its own; the transport turns that
 * into pages (shm_slot_pages: both parities, and the kernel's fault-around
 * of the pages a peer wrote next to those read) and those of each FIFO. */
size_t td_comm_staging_bytes(const td_comm *comm, const td_comm_traffic *tr, size_t *peers) {
  if (peers) *peers = 0;
  if (!comm || !tr || comm->size < 2) return 0;
  const size_t device = tr->device ? staged_host_bytes(comm, tr->device) : 0; /* this rank's own */
  if (!shm_available(comm)) return device;
  int n = comm->size, me = comm->rank;
  /* reach: this rank's into every rank's slots; written[k]: how far rank k writes its own */
  size_t *reach = calloc(3 * (size_t)n, sizeof *reach), *written = reach + n, *scratch = reach + 2 * (size_t)n;
  unsigned char *fifo = calloc((size_t)n, 1); /* bit 0: the FIFO to that rank, bit 1: from it */
  if (!reach || !fifo) { /* an estimate, not an allocation: say so and count nothing */
    free(reach);
    free(fifo);
    td_log(TD_LOG_WARN, "td_comm_staging_bytes: out of memory for %d ranks' tables; staging not counted", n);
    return device;
  }
  if (!reach_of(comm, me, tr, reach)) /* the p2p algorithms' peers are a subset: every peer, both ways */
    for (int k = 0; k < n; k++) fifo[k] |= 3;
  for (int k = 0; k < n; k++) {
    memset(scratch, 0, (size_t)n * sizeof *scratch);
    reach_of(comm, k, tr, scratch);
    written[k] = scratch[k];
  }
  for (int i = 0; i < tr->n_send_peers; i++)
    if (tr->send_peers && tr->send_peers[i] >= 0 && tr->send_peers[i] < n) fifo[tr->send_peers[i]] |= 1;
  for (int i = 0; i < tr->n_recv_peers; i++)
    if (tr->recv_peers && tr->recv_peers[i] >= 0 && tr->recv_peers[i] < n) fifo[tr->recv_peers[i]] |= 2;
  size_t own = shm_slot_pages(comm, me, reach[me], 0, 0), theirs = 0;
  for (int k = 0; k < n; k++) {
    if (k == me) continue;
    theirs += shm_slot_pages(comm, k, reach[k], written[k], k > 0 ? written[k - 1] : 0);
    if (fifo[k] & 1) own += shm_fifo_pages(comm, me, k);    /* written here */
    if (fifo[k] & 2) theirs += shm_fifo_pages(comm, k, me); /* written by the peer */
  }
  free(reach);
  free(fifo);
  if (peers) *peers = theirs;
  return own + theirs + device;
}
