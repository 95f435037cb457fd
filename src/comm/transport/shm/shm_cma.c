/* Single-copy point-to-point payloads over shared memory (cross-memory
 * attach, process_vm_readv), as Open MPI's shared-memory transport does for
 * large messages (its "smsc/cma" component).
 *
 * Why: through the FIFO a payload is copied twice (into the ring, out of
 * it), and a payload larger than the ring moves in ring-sized pieces, each
 * a sleep and a wake on both sides when the ranks outnumber the cores (no
 * spinning). Deterministic reduction's exchange sent ~830 KiB chunks through
 * 256 KiB rings: ~125 voluntary context switches per rank per step, where the
 * bucketed allreduce needs ~12. A posted payload is read by the receiver
 * straight from the sender's buffer, in one call: one wake on each side per
 * message, one copy.
 *
 * The protocol, per ordered pair (fields in shm_fifo, shm.h):
 *
 *   sender: try_send(buf, len) with len larger than the ring's free space
 *           (so a payload that fits is still copied and completes eagerly,
 *           as before) and at least SHM_CMA_MIN_BYTES, when the receiver
 *           found that it can read this process (cma_state == SHM_CMA_YES):
 *             post_addr = buf, post_base = post_total, post_total += len
 *           (release), ring; reports 0 bytes moved. It writes nothing into
 *           the ring until the receiver has taken all of it, so every ring
 *           byte before the post is read first, and none after it.
 *           Later calls report what the receiver took (post_taken), which
 *           is when the bytes count as sent: the caller keeps its buffer
 *           until then, as for any unfinished send.
 *   receiver: the ring empty and post_taken < post_total: process_vm_readv
 *           from post_addr + (post_taken - post_base), post_taken += n
 *           (release), ring.
 *
 * Whether the receiver may read the sender's memory is policy (same user,
 * the Yama ptrace scope, seccomp): the receiver probes it once per sender,
 * when it first uses that ring, reading a constant of the sender's image,
 * and publishes the answer for the sender (cma_state). A sender that sees
 * no "yes" copies through the ring, so the ranks never need to agree, and
 * TANDEM_SHM_CMA=0 on either side keeps that pair on the ring. */
#define _GNU_SOURCE 1 /* process_vm_readv */
#include "comm/transport/shm/shm.h"

#include <errno.h>
#include <string.h>
#include <sys/uio.h>

/* What the probe reads from a peer: the same bytes in every process of
 * this library (a constant of its image, so its address is valid in the
 * peer for as long as the peer runs). */
static const char cma_probe[16] = "TDM-CMA-PROBE-1";

void shm_cma_publish(shm_transport *t) {
  t->ranks[t->rank].cma_probe = (uint64_t)(uintptr_t)cma_probe;
}

/* Read n bytes of process pid at remote into local; returns the bytes read
 * (short only if a call returned short twice) or -1 with errno. */
static ssize_t read_peer(pid_t pid, void *local, uint64_t remote, size_t n) {
  size_t done = 0;
  while (done < n) {
    struct iovec l = {(char *)local + done, n - done};
    struct iovec r = {(void *)(uintptr_t)(remote + done), n - done};
    ssize_t got = process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return done ? (ssize_t)done : -1;
    if (got == 0) break;
    done += (size_t)got;
  }
  return (ssize_t)done;
}

void shm_cma_probe(shm_transport *t, int peer, shm_fifo *from_peer) {
  uint32_t answer = SHM_CMA_NO;
  if (t->cma) {
    char got[sizeof cma_probe] = {0};
    const shm_rank_block *pb = &t->ranks[peer];
    ssize_t n = pb->cma_probe ? read_peer(pb->pid, got, pb->cma_probe, sizeof got) : -1;
    if (n == (ssize_t)sizeof got && !memcmp(got, cma_probe, sizeof got))
      answer = SHM_CMA_YES;
    else
      TD_DEBUG("shm transport: rank %d cannot read rank %d's memory (%s): its large messages to this rank go "
               "through the FIFO",
               t->rank, peer, n < 0 ? strerror(errno) : "the probe read other bytes");
  }
  atomic_store_explicit(&from_peer->cma_state, answer, memory_order_release);
}

bool shm_cma_postable(const shm_transport *t, const shm_fifo *to_peer, size_t len, size_t space) {
  return t->cma && len > space && len >= SHM_CMA_MIN_BYTES &&
         atomic_load_explicit(&to_peer->cma_state, memory_order_acquire) == SHM_CMA_YES;
}

void shm_cma_post(shm_transport *t, int peer, shm_fifo *to_peer, const void *buf, size_t len) {
  shm_cma_sender *s = &t->cma_send[peer];
  uint64_t total = atomic_load_explicit(&to_peer->post_total, memory_order_relaxed);
  to_peer->post_addr = (uint64_t)(uintptr_t)buf;
  to_peer->post_base = total;
  s->active = true;
  s->reported = total;
  atomic_store_explicit(&to_peer->post_total, total + len, memory_order_release);
  shm_ring(t, peer);
}

td_status shm_cma_sent(shm_transport *t, int peer, shm_fifo *to_peer, const void *buf, size_t *moved) {
  shm_cma_sender *s = &t->cma_send[peer];
  /* the caller goes on with the same payload: its next byte is the first
   * the receiver has not reported taking */
  if ((uint64_t)(uintptr_t)buf != to_peer->post_addr + (s->reported - to_peer->post_base))
    return comm_fail(t->base.comm, TD_ERR_INTERNAL,
                     "rank %d: a send to rank %d went on from another buffer while its single-copy payload was posted",
                     t->rank, peer);
  uint64_t taken = atomic_load_explicit(&to_peer->post_taken, memory_order_acquire);
  *moved = (size_t)(taken - s->reported);
  s->reported = taken;
  if (taken == atomic_load_explicit(&to_peer->post_total, memory_order_relaxed)) s->active = false;
  return TD_OK;
}

bool shm_cma_pending(const shm_fifo *from_peer) {
  return atomic_load_explicit(&from_peer->post_total, memory_order_acquire) !=
         atomic_load_explicit(&from_peer->post_taken, memory_order_relaxed);
}

bool shm_cma_taken(const shm_transport *t, int peer, const shm_fifo *to_peer) {
  return atomic_load_explicit(&to_peer->post_taken, memory_order_acquire) != t->cma_send[peer].reported;
}

td_status shm_cma_take(shm_transport *t, int peer, shm_fifo *from_peer, void *buf, size_t len, size_t *moved) {
  *moved = 0;
  uint64_t total = atomic_load_explicit(&from_peer->post_total, memory_order_acquire);
  uint64_t taken = atomic_load_explicit(&from_peer->post_taken, memory_order_relaxed);
  if (total == taken || len == 0) return TD_OK;
  /* post_addr and post_base were written before post_total (release) and
   * stay until everything posted is taken */
  uint64_t remote = from_peer->post_addr + (taken - from_peer->post_base);
  size_t n = (size_t)TD_MIN((uint64_t)len, total - taken);
  ssize_t got = read_peer(t->ranks[peer].pid, buf, remote, n);
  if (got <= 0) {
    int err = got < 0 ? errno : EIO;
    if (err == ESRCH) return shm_fail_dead(t, peer, "read its message");
    return comm_fail(t->base.comm, TD_ERR_SYSTEM,
                     "rank %d: reading a %zu-byte message straight from rank %d's memory failed: %s (set "
                     "TANDEM_SHM_CMA=0 to copy every message through the shared-memory FIFO)",
                     t->rank, n, peer, strerror(err));
  }
  atomic_store_explicit(&from_peer->post_taken, taken + (uint64_t)got, memory_order_release);
  shm_ring(t, peer);
  *moved = (size_t)got;
  return TD_OK;
}
