/* The bottom of the shared-memory transport, which its other files
 * (shm_transport.c, shm_sync.c, shm_xmap.c) build on: which communicators
 * use it (shm_of), and how a rank waits on the segment and learns that a
 * peer failed.
 *
 * Waiting: a rank that cannot progress spins briefly (only when every local
 * rank has a core of its own), then sleeps on its own doorbell futex in
 * slices of at most 100 ms. Between slices it checks the abort block, its
 * deadline, and that the peers it waits for are still alive, so that a
 * killed peer fails the wait within a fraction of a second. */
#include "comm/transport/shm/shm.h"

#include <immintrin.h>
#include <limits.h>

const char shm_transport_name[] = "shm";

shm_transport *shm_of(const td_comm *comm) {
  /* The name's address, not its text: as cheap as comparing the vtable
   * (called on every collective), without this file calling up into
   * shm_transport.c, where the vtable lives. */
  if (!comm || !comm->xport || comm->xport->vtbl->name != shm_transport_name) return NULL;
  return (shm_transport *)comm->xport;
}

size_t shm_chunk_bytes(const td_comm *comm) {
  shm_transport *t = shm_of(comm);
  return t ? t->chunk_bytes : 0;
}

/* Wake rank `peer` if one of its threads sleeps on its doorbell. The fence
 * pairs with the one in shm_sleep: either the sleeper sees our update before
 * it sleeps, or we see its `waiting` and wake it. */
void shm_ring(shm_transport *t, int peer) {
  shm_rank_block *rb = &t->ranks[peer];
  atomic_thread_fence(memory_order_seq_cst);
  if (atomic_load_explicit(&rb->waiting, memory_order_relaxed)) {
    atomic_fetch_add_explicit(&rb->bell, 1, memory_order_seq_cst);
    td_futex_wake(&rb->bell, INT_MAX, true);
  }
}

/* Sleep on our doorbell for at most slice_s unless ready(arg) already
 * holds. Returns ready(arg) as seen last. */
bool shm_sleep(shm_transport *t, shm_ready_fn ready, const void *arg, double slice_s) {
  shm_rank_block *me = &t->ranks[t->rank];
  uint32_t bell = atomic_load_explicit(&me->bell, memory_order_acquire);
  atomic_fetch_add_explicit(&me->waiting, 1, memory_order_seq_cst);
  atomic_thread_fence(memory_order_seq_cst);
  bool ok = ready(t, arg);
  if (!ok && !atomic_load_explicit(&t->abort_blk->ready, memory_order_acquire)) {
    (void)td_futex_wait(&me->bell, bell, slice_s, true);
    ok = ready(t, arg);
  }
  atomic_fetch_sub_explicit(&me->waiting, 1, memory_order_seq_cst);
  return ok;
}

/* TD_OK while healthy; otherwise fail the communicator with the status and
 * message some rank recorded in the abort block (or return the sticky one). */
td_status shm_check_abort(shm_transport *t) {
  td_comm *comm = t->base.comm;
  td_status st = comm_status(comm);
  if (st != TD_OK) return st;
  shm_abort_block *a = t->abort_blk;
  if (!atomic_load_explicit(&a->ready, memory_order_acquire)) return TD_OK;
  if (a->rank == t->rank) return (td_status)a->status;
  return comm_fail(comm, (td_status)a->status, "rank %d reported: %s", (int)a->rank, a->msg);
}

/* Spin briefly for ready(arg), checking the abort block. Only when every
 * local rank has a core; otherwise one sched_yield, since a spinning rank
 * would steal the core of the rank it waits for. Even with a core per rank,
 * another process (a build, a data loader) may hold the core the awaited
 * rank wants: the spin yields every few microseconds so that such a rank
 * runs at once instead of after the whole spin and a futex wake (measured
 * with a CPU hog on one of 2 cores: 4 KiB allreduce 42 us without the
 * yields; a yield costs ~0.2 us when nothing else is runnable). On a loaded
 * machine neither: see td_yield_timed (base/yield.c). */
bool shm_spin(shm_transport *t, shm_ready_fn ready, const void *arg) {
  if (ready(t, arg)) return true;
  if (!td_yield_allowed(&t->yield_off_until)) return false;
  if (!t->spin) {
    td_yield_timed(&t->yield_off_until);
    return ready(t, arg);
  }
  uint64_t end = td_now_ns() + (uint64_t)(t->spin_s * 1e9);
  for (unsigned i = 1;; i++) {
    for (int k = 0; k < 16; k++) _mm_pause();
    if (ready(t, arg)) return true;
    if (atomic_load_explicit(&t->abort_blk->ready, memory_order_relaxed)) return false;
    if ((i & 15) == 0) {
      if (td_now_ns() >= end) return false;
      if (!td_yield_timed(&t->yield_off_until)) return ready(t, arg);
    }
  }
}

/* The first of `peers` (n entries, -1 skipped) whose process is gone or
 * that destroyed its communicator, or -1. */
int shm_find_dead(shm_transport *t, const int *peers, int n) {
  for (int i = 0; i < n; i++) {
    int p = peers[i];
    if (p < 0 || p >= t->n || p == t->rank) continue;
    if (atomic_load_explicit(&t->ranks[p].detached, memory_order_acquire)) return p;
    pid_t pid = t->ranks[p].pid;
    if (pid > 0 && !net_pid_alive(pid)) return p;
  }
  return -1;
}

td_status shm_fail_dead(shm_transport *t, int peer, const char *while_doing) {
  /* A rank that detected a failure first (say, the death of another rank)
   * records it in the abort block and may then exit: its own departure is a
   * consequence, so relay the recorded cause rather than blame it. */
  td_status recorded = shm_check_abort(t);
  if (recorded != TD_OK) return recorded;
  char pid[24], name[96];
  snprintf(pid, sizeof pid, "pid %d", (int)t->ranks[peer].pid);
  comm_peer_name(t->base.comm, peer, pid, name, sizeof name);
  /* the output to look at is the world rank's (the launcher's prefix) */
  int world = t->base.comm->world_ranks[peer]; /* peer < n, checked by the callers */
  if (atomic_load_explicit(&t->ranks[peer].detached, memory_order_acquire))
    return comm_fail(t->base.comm, TD_ERR_REMOTE,
                     "%s destroyed its communicator while rank %d %s over shared memory (did it skip "
                     "td_comm_finalize, or fail earlier? look at rank %d's output)",
                     name, t->rank, while_doing, world);
  return comm_fail(t->base.comm, TD_ERR_REMOTE,
                   "%s died: its process is gone while rank %d %s over shared memory; look at rank "
                   "%d's output for the cause",
                   name, t->rank, while_doing, world);
}

/* ---- the progress thread's doorbell (transport_vtbl.bell_*) ----
 * A separate word from `bell`: the progress thread sleeps on it while idle,
 * and peers ring it only for point-to-point frames stalled on a full FIFO,
 * so that the collectives' rings of `bell` never wake it. */

uint32_t shm_bell_read(transport *xt, bool *stalled) {
  shm_transport *t = (shm_transport *)xt;
  shm_rank_block *me = &t->ranks[t->rank];
  uint32_t v = atomic_load_explicit(&me->p2p_bell, memory_order_seq_cst);
  bool any = false;
  for (size_t w = 0; w < TD_ARRAY_SIZE(me->stalled) && !any; w++)
    any = atomic_load_explicit(&me->stalled[w], memory_order_seq_cst) != 0;
  *stalled = any;
  return v;
}

void shm_bell_sleep(transport *xt, uint32_t seen, double timeout_s) {
  shm_transport *t = (shm_transport *)xt;
  shm_rank_block *me = &t->ranks[t->rank];
  atomic_fetch_add_explicit(&me->p2p_waiting, 1, memory_order_seq_cst);
  atomic_thread_fence(memory_order_seq_cst);
  if (atomic_load_explicit(&me->p2p_bell, memory_order_seq_cst) == seen &&
      !atomic_load_explicit(&t->abort_blk->ready, memory_order_acquire))
    (void)td_futex_wait(&me->p2p_bell, seen, timeout_s, true);
  atomic_fetch_sub_explicit(&me->p2p_waiting, 1, memory_order_seq_cst);
}

/* The stalled bit is set before the bell moves: a progress thread that sees
 * the new value (or is woken by it) then sees the bit. */
void shm_bell_ring(transport *xt, int rank, bool stalled) {
  shm_transport *t = (shm_transport *)xt;
  if (rank < 0 || rank >= t->n) return;
  shm_rank_block *rb = &t->ranks[rank];
  if (stalled) {
    unsigned bit = (unsigned)t->rank % SHM_STALL_BITS;
    atomic_fetch_or_explicit(&rb->stalled[bit / 32], 1u << (bit % 32), memory_order_seq_cst);
  }
  atomic_fetch_add_explicit(&rb->p2p_bell, 1, memory_order_seq_cst);
  if (atomic_load_explicit(&rb->p2p_waiting, memory_order_seq_cst)) td_futex_wake(&rb->p2p_bell, INT_MAX, true);
  /* a busy stream of that rank sleeps on its other bell (shm_wait): it
   * takes the frame too (p2p/p2p.c) */
  if (stalled) {
    atomic_store_explicit(&rb->kick, 1, memory_order_seq_cst);
    shm_ring(t, rank);
  }
}

/* transport_vtbl.wake: the kick first, then the bell (shm_sleep's fence
 * pairs with shm_ring's: either the waiter's ready() sees the kick, or the
 * ring sees the waiter and wakes it). */
void shm_wake(transport *xt) {
  shm_transport *t = (shm_transport *)xt;
  atomic_store_explicit(&t->ranks[t->rank].kick, 1, memory_order_seq_cst);
  shm_ring(t, t->rank);
}

int shm_take_stalled(transport *xt, int *peers, int max) {
  shm_transport *t = (shm_transport *)xt;
  shm_rank_block *me = &t->ranks[t->rank];
  int k = 0;
  for (size_t w = 0; w < TD_ARRAY_SIZE(me->stalled); w++) {
    if (!atomic_load_explicit(&me->stalled[w], memory_order_relaxed)) continue;
    uint32_t bits = atomic_exchange_explicit(&me->stalled[w], 0, memory_order_seq_cst);
    for (unsigned b = 0; b < 32; b++) {
      if (!(bits & (1u << b))) continue;
      /* every rank with this bit (one unless n > SHM_STALL_BITS) */
      for (int p = (int)(w * 32 + b); p < t->n && k < max; p += SHM_STALL_BITS)
        if (p != t->rank) peers[k++] = p;
    }
  }
  return k;
}
