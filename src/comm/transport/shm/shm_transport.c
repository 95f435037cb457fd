/* The shared-memory transport: every rank of the communicator on one host
 * maps one segment (layout in shm.h). Point-to-point bytes go through one
 * single-producer/single-consumer ring per ordered pair; collectives use the
 * per-rank slots and the epoch barrier of shm_sync.c. This file is the
 * vtable and the segment's creation; how a rank waits is in shm_wait.c.
 *
 * Failure: abort() records the first failure in the segment (CAS, first
 * writer wins) and rings every doorbell; every rank that then looks at the
 * segment fails with the recorded status and message. */
#define _GNU_SOURCE 1 /* sched_getaffinity, CPU_COUNT */
#include "comm/transport/shm/shm.h"

#include <limits.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SHM_DEFAULT_FIFO_BYTES ((size_t)256 << 10)
#define SHM_FIFO_BUDGET ((size_t)64 << 20)
#define SHM_DEFAULT_SLOT_BYTES ((size_t)1 << 20)
#define SHM_DEFAULT_CHUNK_BYTES ((size_t)1 << 20)
#define SHM_DEFAULT_SPIN_US 50.0

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* Place every part of the segment; returns the total size. Depends only on
 * n and the sizes from the header, so every rank computes the same layout. */
static size_t shm_layout(shm_transport *t, char *base) {
  size_t off = round_up(sizeof(shm_seg_header), SHM_LINE);
  t->abort_blk = (shm_abort_block *)(base + off);
  off += round_up(sizeof(shm_abort_block), SHM_LINE);
  t->ranks = (shm_rank_block *)(base + off);
  off += (size_t)t->n * round_up(sizeof(shm_rank_block), SHM_LINE);
  off = round_up(off, 4096);
  /* Stagger the slots by a few lines so that the same offset in different
   * slots does not map to the same cache set (4 KiB aliasing in the reduce). */
  t->slot_stride = round_up(t->slot_bytes, 4096) + 4 * SHM_LINE;
  t->slot_base = base + off;
  off += 2 * (size_t)t->n * t->slot_stride;
  off = round_up(off, 4096);
  /* The n(n-1) FIFOs come last: everything before them is O(n) and is
   * reserved at creation; a FIFO is reserved when a rank first uses it
   * (fifo_reserve), so that memory grows with the pairs that talk, not n^2. */
  t->fifo_off = off;
  t->fifo_stride = sizeof(shm_fifo) + round_up(t->fifo_bytes, SHM_LINE);
  t->fifo_base = base + off;
  off += (size_t)t->n * (size_t)(t->n - 1) * t->fifo_stride;
  return round_up(off, 4096);
}

/* Before a rank that did not create the segment trusts its header (the
 * name came through the store; the segment could be stale or tampered
 * with): every field must be what rank 0 could have written, and the layout
 * the fields give must be exactly the mapped size. The bounds come first so
 * that shm_layout's arithmetic cannot overflow. Sets the sizes in t. */
static td_status check_header(shm_transport *t, const td_comm *comm, size_t mapped) {
  const shm_seg_header *h = (const shm_seg_header *)t->map;
  size_t pairs = (size_t)t->n * (size_t)(t->n - 1);
  const char *bad = NULL;
  if (mapped < sizeof *h)
    bad = "smaller than its header";
  else if (h->magic != SHM_MAGIC)
    bad = "bad magic";
  else if (h->n_ranks != (uint32_t)t->n)
    bad = "wrong number of ranks";
  else if (h->total_bytes != mapped)
    bad = "total size differs from the mapped size";
  else if (h->fifo_bytes < 4096 || h->fifo_bytes % SHM_LINE || (pairs && h->fifo_bytes > mapped / pairs))
    bad = "FIFO size out of bounds";
  else if (h->slot_bytes < 4096 || h->slot_bytes % 4096 || h->slot_bytes > mapped / (2 * (size_t)t->n))
    bad = "slot size out of bounds";
  else if (h->chunk_bytes < SHM_LINE || h->chunk_bytes % SHM_LINE || h->chunk_bytes > h->slot_bytes)
    bad = "chunk size out of bounds";
  else if (h->leader_pid != (int32_t)comm->pids[0])
    bad = "its creator is not rank 0";
  else if (h->lazy_fifos > 1)
    bad = "bad FIFO reservation flag";
  if (!bad) {
    t->fifo_bytes = h->fifo_bytes;
    t->slot_bytes = h->slot_bytes;
    t->chunk_bytes = h->chunk_bytes;
    t->lazy_fifos = h->lazy_fifos;
    if (shm_layout(t, NULL) != mapped) bad = "its layout does not match its size";
  }
  if (bad)
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "rank %d: refusing shared-memory segment %s (%zu bytes) for %d ranks: %s (stale, another job's, "
                    "or tampered with)",
                    t->rank, t->name, mapped, t->n, bad);
  return TD_OK;
}

shm_fifo *shm_fifo_of(const shm_transport *t, int src, int dst) {
  size_t idx = (size_t)src * (size_t)(t->n - 1) + (size_t)(dst < src ? dst : dst - 1);
  return (shm_fifo *)(t->fifo_base + idx * t->fifo_stride);
}
static char *fifo_data(shm_fifo *f) { return (char *)(f + 1); }

size_t shm_fifo_pages(const td_comm *comm, int src, int dst) {
  shm_transport *t = shm_of(comm);
  if (!t || src < 0 || dst < 0 || src >= t->n || dst >= t->n || src == dst) return 0;
  size_t off = (size_t)((char *)shm_fifo_of(t, src, dst) - t->map);
  return ((off + t->fifo_stride + 4095) / 4096 - off / 4096) * 4096; /* as net_shm_populate rounds */
}

/* Before this rank first touches the FIFO between itself and peer (either
 * direction; `out`: the one it writes): reserve its pages, so that a full
 * /dev/shm is an error naming the segment instead of a SIGBUS. Nothing to
 * do when the segment was reserved whole at creation (older kernels). */
static td_status fifo_reserve(shm_transport *t, int peer, bool out) {
  uint8_t bit = out ? 1 : 2;
  if (t->fifo_ready[peer] & bit) return TD_OK;
  shm_fifo *f = out ? shm_fifo_of(t, t->rank, peer) : shm_fifo_of(t, peer, t->rank);
  if (t->lazy_fifos && net_shm_populate(f, t->fifo_stride) != TD_OK)
    return comm_fail(t->base.comm, TD_ERR_SYSTEM, "rank %d: cannot reserve the shared-memory FIFO %s rank %d: %s",
                     t->rank, out ? "to" : "from", peer, td_last_error());
  /* before the first read of it: may the peer post its payloads? */
  if (!out) shm_cma_probe(t, peer, f);
  t->fifo_ready[peer] |= bit;
  return TD_OK;
}

/* ---- point-to-point rings ---- */

static td_status shm_try_send(transport *xt, int peer, const void *buf, size_t len, size_t *moved) {
  shm_transport *t = (shm_transport *)xt;
  *moved = 0;
  if (peer < 0 || peer >= t->n || peer == t->rank)
    return comm_fail(xt->comm, TD_ERR_INTERNAL, "shm transport: send to invalid peer %d from rank %d", peer,
                     t->rank);
  td_status st = shm_check_abort(t);
  if (st != TD_OK) return st;
  TD_CHECK(fifo_reserve(t, peer, true));
  shm_fifo *f = shm_fifo_of(t, t->rank, peer);
  /* a posted payload: nothing goes into the ring until the peer took it */
  if (t->cma_send[peer].active) return shm_cma_sent(t, peer, f, buf, moved);
  uint64_t head = atomic_load_explicit(&f->head, memory_order_relaxed);
  uint64_t tail = atomic_load_explicit(&f->tail, memory_order_acquire);
  size_t space = t->fifo_bytes - (size_t)(head - tail);
  if (shm_cma_postable(t, f, len, space)) {
    shm_cma_post(t, peer, f, buf, len);
    return TD_OK;
  }
  size_t nb = TD_MIN(len, space);
  if (nb == 0) return TD_OK;
  size_t pos = (size_t)(head % t->fifo_bytes);
  size_t first = TD_MIN(nb, t->fifo_bytes - pos);
  memcpy(fifo_data(f) + pos, buf, first);
  if (nb > first) memcpy(fifo_data(f), (const char *)buf + first, nb - first);
  atomic_store_explicit(&f->head, head + nb, memory_order_release);
  shm_ring(t, peer);
  *moved = nb;
  return TD_OK;
}

static td_status shm_try_recv(transport *xt, int peer, void *buf, size_t len, size_t *moved) {
  shm_transport *t = (shm_transport *)xt;
  *moved = 0;
  if (peer < 0 || peer >= t->n || peer == t->rank)
    return comm_fail(xt->comm, TD_ERR_INTERNAL, "shm transport: receive from invalid peer %d on rank %d", peer,
                     t->rank);
  TD_CHECK(fifo_reserve(t, peer, false));
  shm_fifo *f = shm_fifo_of(t, peer, t->rank);
  uint64_t tail = atomic_load_explicit(&f->tail, memory_order_relaxed);
  uint64_t head = atomic_load_explicit(&f->head, memory_order_acquire);
  size_t avail = (size_t)(head - tail);
  size_t nb = TD_MIN(len, avail);
  if (nb == 0) {
    /* the ring's bytes are all before the peer's post (shm_cma.c) */
    if (len && shm_cma_pending(f)) return shm_cma_take(t, peer, f, buf, len, moved);
    /* Data a peer sent before failing is still delivered; only an empty
     * ring reports the failure. */
    return shm_check_abort(t);
  }
  size_t pos = (size_t)(tail % t->fifo_bytes);
  size_t first = TD_MIN(nb, t->fifo_bytes - pos);
  memcpy(buf, fifo_data(f) + pos, first);
  if (nb > first) memcpy((char *)buf + first, fifo_data(f), nb - first);
  atomic_store_explicit(&f->tail, tail + nb, memory_order_release);
  shm_ring(t, peer);
  *moved = nb;
  return TD_OK;
}

/* try_recv without consuming: for the stuck-operation diagnosis in p2p/p2p.c. */
static td_status shm_try_peek(transport *xt, int peer, void *buf, size_t len, size_t *got) {
  shm_transport *t = (shm_transport *)xt;
  *got = 0;
  if (peer < 0 || peer >= t->n || peer == t->rank || fifo_reserve(t, peer, false) != TD_OK) return TD_OK;
  shm_fifo *f = shm_fifo_of(t, peer, t->rank);
  uint64_t tail = atomic_load_explicit(&f->tail, memory_order_relaxed);
  uint64_t head = atomic_load_explicit(&f->head, memory_order_acquire);
  size_t nb = TD_MIN(len, (size_t)(head - tail));
  size_t pos = (size_t)(tail % t->fifo_bytes);
  size_t first = TD_MIN(nb, t->fifo_bytes - pos);
  memcpy(buf, fifo_data(f) + pos, first);
  if (nb > first) memcpy((char *)buf + first, fifo_data(f), nb - first);
  *got = nb;
  return TD_OK;
}

typedef struct wait_set {
  const int *send_peers, *recv_peers;
  int n_send, n_recv;
} wait_set;

static bool pairs_ready(shm_transport *t, const void *arg) {
  const wait_set *w = arg;
  /* another thread of this rank queued operations, or a peer's frame
   * stalled to it: the caller pulls or takes them (transport_vtbl.wake) */
  if (atomic_load_explicit(&t->ranks[t->rank].kick, memory_order_seq_cst)) return true;
  for (int i = 0; i < w->n_send; i++) {
    int p = w->send_peers[i];
    if (p < 0 || p >= t->n || p == t->rank) continue;
    shm_fifo *f = shm_fifo_of(t, t->rank, p);
    if (t->cma_send[p].active) {
      if (shm_cma_taken(t, p, f)) return true;
      continue;
    }
    uint64_t used = atomic_load_explicit(&f->head, memory_order_relaxed) -
                    atomic_load_explicit(&f->tail, memory_order_acquire);
    if (used < t->fifo_bytes) return true;
  }
  for (int i = 0; i < w->n_recv; i++) {
    int p = w->recv_peers[i];
    if (p < 0 || p >= t->n || p == t->rank) continue;
    shm_fifo *f = shm_fifo_of(t, p, t->rank);
    if (atomic_load_explicit(&f->head, memory_order_acquire) != atomic_load_explicit(&f->tail, memory_order_relaxed) ||
        shm_cma_pending(f))
      return true;
  }
  return false;
}

static td_status wait_pairs(shm_transport *t, const int *send_peers, int n_send, const int *recv_peers, int n_recv,
                            double timeout_s) {
  wait_set w = {send_peers, recv_peers, n_send, n_recv};
  td_status st = shm_check_abort(t);
  if (st != TD_OK) return st;
  /* pairs_ready reads these FIFOs' counters */
  for (int i = 0; i < n_send; i++)
    if (send_peers[i] >= 0 && send_peers[i] < t->n && send_peers[i] != t->rank)
      TD_CHECK(fifo_reserve(t, send_peers[i], true));
  for (int i = 0; i < n_recv; i++)
    if (recv_peers[i] >= 0 && recv_peers[i] < t->n && recv_peers[i] != t->rank)
      TD_CHECK(fifo_reserve(t, recv_peers[i], false));
  if (shm_spin(t, pairs_ready, &w)) return TD_OK;
  double end = timeout_s < 0 ? INFINITY : td_now() + timeout_s;
  for (;;) {
    st = shm_check_abort(t);
    if (st != TD_OK) return st;
    double now = td_now();
    if (now >= end) return TD_OK; /* the caller checks its deadline */
    if (now >= t->next_liveness) {
      t->next_liveness = now + SHM_SLICE_S;
      int dead = shm_find_dead(t, send_peers, n_send);
      if (dead < 0) dead = shm_find_dead(t, recv_peers, n_recv);
      if (dead >= 0) {
        if (pairs_ready(t, &w)) return TD_OK; /* drain what it sent first */
        return shm_fail_dead(t, dead, "exchanged messages with it");
      }
    }
    if (shm_sleep(t, pairs_ready, &w, TD_MIN(SHM_SLICE_S, end - now))) return TD_OK;
  }
}

static td_status shm_wait(transport *xt, const int *send_peers, int n_send, const int *recv_peers, int n_recv,
                          double timeout_s) {
  shm_transport *t = (shm_transport *)xt;
  td_status st = wait_pairs(t, send_peers, n_send, recv_peers, n_recv, timeout_s);
  /* the caller pulls what was queued before this (shm_wake sets the flag
   * after queuing); a later wake holds for the next wait */
  atomic_store_explicit(&t->ranks[t->rank].kick, 0, memory_order_seq_cst);
  return st;
}

static void shm_abort(transport *xt, td_status status, const char *reason) {
  shm_transport *t = (shm_transport *)xt;
  shm_abort_block *a = t->abort_blk;
  uint32_t expected = 0;
  if (atomic_compare_exchange_strong(&a->claimed, &expected, 1)) {
    a->status = (int32_t)status;
    a->rank = t->rank;
    td_strlcpy(a->msg, reason ? reason : "aborted", sizeof a->msg);
    atomic_store_explicit(&a->ready, 1, memory_order_release);
  }
  /* Every doorbell, ours included: another thread of this rank may sleep. */
  for (int k = 0; k < t->n; k++) {
    atomic_fetch_add_explicit(&t->ranks[k].bell, 1, memory_order_seq_cst);
    td_futex_wake(&t->ranks[k].bell, INT_MAX, true);
  }
}

static void shm_destroy(transport *xt) {
  shm_transport *t = (shm_transport *)xt;
  if (!t) return;
  if (t->name[0] && t->rank == 0) net_shm_unlink(t->name);
  if (t->map) {
    atomic_store_explicit(&t->ranks[t->rank].detached, 1, memory_order_release);
    for (int k = 0; k < t->n; k++)
      if (k != t->rank) shm_ring(t, k);
  }
  shm_unmap_peers(t);
  free(t->fifo_ready);
  free(t->cma_send);
  if (t->xprobe) net_hostmem_free(t->xprobe);
  net_shm_unmap(t->map, t->map_bytes);
  free(t);
}

static const transport_vtbl shm_vtbl = {
    .name = shm_transport_name,
    .try_send = shm_try_send,
    .try_recv = shm_try_recv,
    .wait = shm_wait,
    .abort = shm_abort,
    .destroy = shm_destroy,
    /* No op_done: a collective completes only through a sync that every
     * rank reached, and bytes a peer wrote into a ring before it failed were
     * sent, so a failure recorded afterwards must not fail what finished. */
    .try_peek = shm_try_peek,
    .bell_read = shm_bell_read,
    .bell_sleep = shm_bell_sleep,
    .bell_ring = shm_bell_ring,
    .take_stalled = shm_take_stalled,
    .wake = shm_wake,
};

/* ---- creation ---- */

static bool spin_allowed(int local_ranks) {
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) < online) online = CPU_COUNT(&set);
  return online >= local_ranks;
}

/* Wait for a store key in short slices, failing early if a rank that has
 * already mapped the segment died (the others would otherwise wait for the
 * whole timeout). */
static td_status wait_key(shm_transport *t, const char *key, char **value_out) {
  td_comm *comm = t->base.comm;
  double end = td_now() + comm->timeout_s;
  for (;;) {
    void *v = NULL;
    size_t len = 0;
    double left = end - td_now();
    if (left <= 0)
      return td_error(TD_ERR_TIMEOUT,
                      "rank %d: shared-memory setup did not finish within %g s (waiting for store key %s); did "
                      "every rank start? (TANDEM_TIMEOUT sets the limit)",
                      t->rank, comm->timeout_s, key);
    td_status st = store_wait(comm->store, key, TD_MIN(1.0, left), &v, &len);
    if (st == TD_OK) {
      *value_out = v;
      return TD_OK;
    }
    if (st != TD_ERR_TIMEOUT) return st;
    if (comm->pids) {
      /* A few ranks per slice, rotating (as in shm_sync.c): all of them
       * from every waiting rank was O(n^2) kill(2) calls per slice. */
      for (int i = 0, checked = 0; i < t->n && checked < SHM_LIVENESS_PER_SLICE; i++) {
        int r = (t->live_cursor + i) % t->n;
        if (r == t->rank || comm->pids[r] <= 0) continue;
        checked++;
        t->live_cursor = (r + 1) % t->n;
        if (!net_pid_alive(comm->pids[r]))
          return td_error(TD_ERR_REMOTE, "rank %d (pid %d) died during shared-memory setup of communicator %s",
                          r, (int)comm->pids[r], comm->prefix);
      }
    }
  }
}

td_status shm_transport_create(td_comm *comm, transport **out) {
  *out = NULL;
  if (!comm->store)
    return td_error(TD_ERR_INVALID_USAGE, "shm transport needs a rendezvous store (world of %d)", comm->size);
  if (comm->local_size != comm->size)
    return td_error(TD_ERR_INVALID_USAGE,
                    "shm transport needs every rank on one host, but only %d of %d ranks share this host; use "
                    "TANDEM_TRANSPORT=tcp or auto",
                    comm->local_size, comm->size);
  shm_transport *t = calloc(1, sizeof *t);
  if (!t) return td_error(TD_ERR_SYSTEM, "out of memory for the shm transport");
  t->base.vtbl = &shm_vtbl;
  t->base.comm = comm;
  t->rank = comm->rank;
  t->n = comm->size;
  t->spin = spin_allowed(comm->size);
  t->live_cursor = (t->rank + 1) % t->n;
  t->fifo_ready = calloc((size_t)t->n, 1);
  t->cma_send = calloc((size_t)t->n, sizeof *t->cma_send);
  t->cma = comm->tun.shm_cma;
  if (!t->fifo_ready || !t->cma_send) {
    free(t->fifo_ready);
    free(t->cma_send);
    free(t);
    return td_error(TD_ERR_SYSTEM, "out of memory for the shm transport");
  }
  t->spin_s = comm_tun_spin_us(comm->tun.shm_spin_us, SHM_DEFAULT_SPIN_US) * 1e-6;
  if (t->spin_s <= 0) t->spin = false;

  char key_seg[256], key_mapped[256], key_ready[256];
  snprintf(key_seg, sizeof key_seg, "%s/shm/segment", comm->prefix);
  snprintf(key_mapped, sizeof key_mapped, "%s/shm/mapped", comm->prefix);
  snprintf(key_ready, sizeof key_ready, "%s/shm/ready", comm->prefix);
  td_status st = TD_OK;
  char *value = NULL;

  if (t->rank == 0) {
    /* n(n-1) rings: keep their total within SHM_FIFO_BUDGET unless told. */
    size_t fifo_default = TD_MIN(SHM_DEFAULT_FIFO_BYTES, SHM_FIFO_BUDGET / ((size_t)t->n * (size_t)(t->n - 1) + 1));
    t->fifo_bytes = round_up(TD_MAX(comm_tun_bytes(comm->tun.shm_fifo_bytes, fifo_default), (size_t)4096), SHM_LINE);
    t->slot_bytes = round_up(TD_MAX(comm_tun_bytes(comm->tun.shm_slot_bytes, SHM_DEFAULT_SLOT_BYTES), (size_t)4096),
                             4096);
    t->chunk_bytes = round_up(TD_MAX(comm_tun_bytes(comm->tun.shm_chunk_bytes, SHM_DEFAULT_CHUNK_BYTES), (size_t)4096),
                              SHM_LINE);
    if (t->chunk_bytes > t->slot_bytes) t->chunk_bytes = t->slot_bytes;
    /* The segment grows as n^2 FIFOs and 2n slots: with each size capped
     * (core/tunables.c) only the rank count can make it overflow; check. */
    size_t fifos, fifo_total, slots, layout_total;
    if (__builtin_mul_overflow((size_t)t->n, (size_t)(t->n - 1), &fifos) ||
        __builtin_mul_overflow(fifos, t->fifo_bytes + sizeof(shm_fifo) + SHM_LINE, &fifo_total) ||
        __builtin_mul_overflow(2 * (size_t)t->n, t->slot_bytes + 5 * SHM_LINE + 4096, &slots) ||
        __builtin_add_overflow(fifo_total, slots, &layout_total) || layout_total > SIZE_MAX / 2) {
      st = td_error(TD_ERR_INVALID_ARGUMENT,
                    "shm transport: %d ranks with %zu-byte FIFOs and %zu-byte slots do not fit in the address space: "
                    "lower TANDEM_SHM_FIFO_BYTES / TANDEM_SHM_SLOT_BYTES",
                    t->n, t->fifo_bytes, t->slot_bytes);
      char msg[600];
      snprintf(msg, sizeof msg, "!rank 0: %s", td_last_error());
      (void)store_set_str(comm->store, key_seg, msg);
      goto fail;
    }
    size_t total = shm_layout(t, NULL);
    void *addr = NULL;
    bool lazy = false;
    st = net_shm_create_partial(comm->prefix, total, t->fifo_off, t->name, sizeof t->name, &addr, &lazy);
    if (st != TD_OK) {
      /* Tell the others why, so that they fail now instead of at timeout. */
      char msg[600];
      snprintf(msg, sizeof msg, "!rank 0 could not create the shared-memory segment: %s", td_last_error());
      (void)store_set_str(comm->store, key_seg, msg);
      td_error(st, "%s", msg + 1);
      goto fail;
    }
    t->map = addr;
    t->map_bytes = total;
    shm_layout(t, t->map);
    shm_seg_header *h = (shm_seg_header *)t->map;
    h->n_ranks = (uint32_t)t->n;
    h->total_bytes = total;
    h->fifo_bytes = t->fifo_bytes;
    h->slot_bytes = t->slot_bytes;
    h->chunk_bytes = t->chunk_bytes;
    h->leader_pid = (int32_t)getpid();
    h->lazy_fifos = lazy;
    t->lazy_fifos = lazy;
    shm_xmap_publish(t);
    h->magic = SHM_MAGIC;
    char v[256];
    snprintf(v, sizeof v, "%s %zu", t->name, total);
    TD_CHECK_GOTO(store_set_str(comm->store, key_seg, v), st, fail);
  } else {
    transport_test_gate();
    TD_CHECK_GOTO(wait_key(t, key_seg, &value), st, fail);
    if (value[0] == '!') {
      st = td_error(TD_ERR_REMOTE, "%s", value + 1);
      goto fail;
    }
    size_t total = 0;
    if (sscanf(value, "%127s %zu", t->name, &total) != 2) {
      st = td_error(TD_ERR_INTERNAL, "malformed shared-memory segment record '%s' in the store", value);
      goto fail;
    }
    void *addr = NULL;
    TD_CHECK_GOTO(net_shm_open(t->name, total, &addr), st, fail);
    t->map = addr;
    t->map_bytes = total;
    st = check_header(t, comm, total);
    if (st != TD_OK) {
      /* Nothing of it was touched: detach without announcing anything in it. */
      net_shm_unmap(t->map, total);
      t->map = NULL;
      t->map_bytes = 0;
      goto fail;
    }
    shm_layout(t, t->map);
  }
  t->ranks[t->rank].pid = (int32_t)getpid();
  t->ranks[t->rank].xmap_ok = shm_xmap_probe(t);
  shm_cma_publish(t);

  /* The last rank to map removes the name: from here on a killed job leaves
   * nothing behind in /dev/shm. */
  int64_t mapped = 0;
  TD_CHECK_GOTO(store_add(comm->store, key_mapped, 1, &mapped), st, fail);
  if (mapped == t->n) {
    net_shm_unlink(t->name);
    TD_CHECK_GOTO(store_set_str(comm->store, key_ready, "1"), st, fail);
  }
  free(value);
  value = NULL;
  TD_CHECK_GOTO(wait_key(t, key_ready, &value), st, fail);
  free(value);
  t->name[0] = '\0';
  shm_xmap_setup_done(t);
  TD_DEBUG("shm transport: %d ranks, fifo %zu, slot %zu, chunk %zu bytes, spin %s, direct access to host-shared "
           "buffers %s, single-copy payloads %s",
           t->n, t->fifo_bytes, t->slot_bytes, t->chunk_bytes, t->spin ? "on" : "off", t->xmap ? "on" : "off",
           t->cma ? "on where probed" : "off");
  *out = &t->base;
  return TD_OK;

fail:
  free(value);
  shm_destroy(&t->base);
  return st;
}
