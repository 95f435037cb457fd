/* Mapping the other ranks' host-shared buffers (td_mem_alloc) for the direct
 * collectives: the setup probe, the per-peer cache of mapped regions, and
 * the sync that publishes where each rank's buffers lie.
 *
 * Why a probe at setup: whether a peer's region can be mapped depends on
 * policy (same user, /proc visible, no ptrace restriction), and every rank
 * must choose the same algorithm for a collective. Probing once, with every
 * answer in the segment before setup completes, gives each rank the same
 * shm_xmap(); a later mapping failure (out of memory, fds) is then an error
 * of the collective, not a silent divergence between ranks. */
#include "comm/transport/shm/shm.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define XPROBE_MAGIC 0x54444d584d4150ull /* "TDMXMAP" */

bool shm_xmap(const td_comm *comm) {
  shm_transport *t = shm_of(comm);
  return t && t->xmap;
}

void shm_xmap_publish(shm_transport *t) {
  shm_seg_header *h = (shm_seg_header *)t->map;
  h->xmap = 0;
  if (!t->base.comm->tun.shm_xmap || t->n < 2) return;
  void *probe = NULL;
  if (net_hostmem_alloc(sizeof(uint64_t), &probe) != TD_OK) {
    TD_DEBUG("shm transport: no host-shared probe region: %s", td_last_error());
    return;
  }
  *(uint64_t *)probe = XPROBE_MAGIC;
  if (!net_hostmem_find(probe, sizeof(uint64_t), &h->xprobe)) {
    net_hostmem_free(probe);
    return;
  }
  t->xprobe = probe;
  h->xmap = 1;
}

uint32_t shm_xmap_probe(shm_transport *t) {
  shm_seg_header *h = (shm_seg_header *)t->map;
  if (!h->xmap) return 0;
  if (t->rank == 0) return 1;
  void *base = NULL;
  if (net_hostmem_map_peer(h->leader_pid, &h->xprobe, &base) != TD_OK) {
    TD_DEBUG("shm transport: cannot map rank 0's buffers, collectives stage through the segment: %s",
             td_last_error());
    return 0;
  }
  uint32_t ok = *(volatile uint64_t *)base == XPROBE_MAGIC;
  munmap(base, h->xprobe.bytes);
  return ok;
}

void shm_xmap_setup_done(shm_transport *t) {
  t->xmap = t->n > 1;
  for (int r = 0; r < t->n; r++) t->xmap = t->xmap && t->ranks[r].xmap_ok;
  if (t->xprobe) {
    net_hostmem_free(t->xprobe);
    t->xprobe = NULL;
  }
  if (t->xmap) {
    t->pmaps = calloc((size_t)t->n * SHM_PEER_MAPS, sizeof *t->pmaps);
    t->pmap_next = calloc((size_t)t->n, sizeof *t->pmap_next);
    if (!t->pmaps || !t->pmap_next) {
      /* Every rank decided already; without the cache this rank would fail
       * its first direct collective with a clear error instead. */
      free(t->pmaps);
      free(t->pmap_next);
      t->pmaps = NULL;
      t->pmap_next = NULL;
    }
  }
}

void shm_unmap_peers(shm_transport *t) {
  if (t->pmaps)
    for (size_t i = 0; i < (size_t)t->n * SHM_PEER_MAPS; i++)
      if (t->pmaps[i].serial) munmap(t->pmaps[i].base, t->pmaps[i].bytes);
  free(t->pmaps);
  free(t->pmap_next);
  t->pmaps = NULL;
  t->pmap_next = NULL;
}

td_status shm_sync_shared(td_comm *comm, const comm_op *op, const void *send, size_t send_bytes, const void *recv,
                          size_t recv_bytes) {
  shm_transport *t = shm_of(comm);
  if (!t) return comm_fail(comm, TD_ERR_INTERNAL, "shm_sync_shared called without the shm transport");
  unsigned p = (unsigned)((t->epoch + 1) & 1);
  shm_rank_block *mine = &t->ranks[t->rank];
  const void *bufs[2] = {send, recv};
  size_t sizes[2] = {send_bytes, recv_bytes};
  for (int w = 0; w < 2; w++)
    if (!sizes[w] || !net_hostmem_find(bufs[w], sizes[w], &mine->xref[p][w])) mine->xref[p][w].fd = -1;
  return shm_sync_addrs(comm, op, send, recv);
}

bool shm_shared(const td_comm *comm, int rank, int which) {
  shm_transport *t = shm_of(comm);
  return t && rank >= 0 && rank < t->n && t->ranks[rank].xref[t->epoch & 1][which & 1].fd >= 0;
}

bool shm_all_shared(const td_comm *comm, int which) {
  for (int k = 0; k < comm->size; k++)
    if (!shm_shared(comm, k, which)) return false;
  return true;
}

td_status shm_peer_buffer(td_comm *comm, int rank, int which, char **out) {
  shm_transport *t = shm_of(comm);
  *out = NULL;
  unsigned p = (unsigned)(t->epoch & 1);
  if (rank == t->rank) {
    *out = (char *)(uintptr_t)t->ranks[rank].addr[p][which & 1];
    return TD_OK;
  }
  if (!t->pmaps)
    return comm_fail(comm, TD_ERR_SYSTEM, "rank %d: out of memory for the table of mapped peer buffers", t->rank);
  const net_hostmem_ref *ref = &t->ranks[rank].xref[p][which & 1];
  shm_peer_map *maps = &t->pmaps[(size_t)rank * SHM_PEER_MAPS];
  for (int i = 0; i < SHM_PEER_MAPS; i++)
    if (maps[i].serial == ref->serial && maps[i].bytes == ref->bytes) {
      *out = maps[i].base + ref->offset;
      return TD_OK;
    }
  void *base = NULL;
  /* The segment says which process to map from: it must be the rank the
   * rendezvous saw. */
  if (t->ranks[rank].pid != (int32_t)comm->pids[rank])
    return comm_fail(comm, TD_ERR_INTERNAL, "rank %d: the shared segment names process %d for rank %d, but rank %d "
                     "is process %d", t->rank, (int)t->ranks[rank].pid, rank, rank, (int)comm->pids[rank]);
  if (net_hostmem_map_peer((pid_t)t->ranks[rank].pid, ref, &base) != TD_OK)
    return comm_fail(comm, TD_ERR_SYSTEM,
                     "rank %d cannot map rank %d's host-shared buffer: %s (set TANDEM_SHM_XMAP=0 to stage "
                     "collectives through the shared segment instead)",
                     t->rank, rank, td_last_error());
  shm_peer_map *victim = &maps[t->pmap_next[rank]++ % SHM_PEER_MAPS];
  if (victim->serial) munmap(victim->base, victim->bytes);
  *victim = (shm_peer_map){ref->serial, ref->bytes, base};
  *out = (char *)base + ref->offset;
  return TD_OK;
}
