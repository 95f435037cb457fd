/* The shared-memory collective primitives of shm.h: per-rank slots
 * and the epoch barrier (shm_sync) that orders every access to them.
 *
 * shm_sync(epoch e): publish this rank's op header in its parity-(e % 2)
 * entry, store `arrived = e`, ring the peers that sleep if this arrival
 * completed the epoch, wait until every
 * rank has arrived at e, then compare every header with rank 0's. The header
 * of parity e % 2 is rewritten only at epoch e + 2, which no rank can reach
 * before every rank arrived at e + 1, i.e. finished comparing at e; so no
 * extra handshake is needed. The same argument makes the slots reusable
 * (see the rule in shm.h). */
#include "comm/transport/shm/shm.h"

#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

bool shm_available(const td_comm *comm) { return shm_of(comm) != NULL; }

td_status shm_require(td_comm *comm, const char *algorithm) {
  if (shm_available(comm)) return TD_OK;
  return comm_fail(comm, TD_ERR_INTERNAL, "%s selected but communicator uses the %s transport", algorithm,
                   comm->xport_name ? comm->xport_name : "?");
}

size_t shm_slot_bytes(const td_comm *comm) {
  shm_transport *t = shm_of(comm);
  return t ? t->slot_bytes : 0;
}

uint64_t shm_next_epoch(const td_comm *comm) {
  shm_transport *t = shm_of(comm);
  return t ? t->epoch + 1 : 0;
}

void *shm_slot(const td_comm *comm, int rank, unsigned parity) {
  shm_transport *t = shm_of(comm);
  if (!t || rank < 0 || rank >= t->n) return NULL;
  return t->slot_base + ((size_t)rank * 2 + (parity & 1)) * t->slot_stride;
}

/* Pages from the page holding `off` (from the segment's start, which is
 * page-aligned) to the one holding its last byte of `bytes`. */
static size_t span_pages(size_t off, size_t bytes) {
  return bytes ? ((off + bytes + 4095) / 4096 - off / 4096) * 4096 : 0;
}

/* The kernel's fault_around_bytes (mm/memory.c) since Linux 3.15: a read
 * fault on a file or shmem mapping maps the pages of the aligned window
 * around it that the page cache already holds up to date. */
#define SHM_FAULT_AROUND_BYTES ((size_t)64 << 10)

size_t shm_slot_pages(const td_comm *comm, int rank, size_t reach, size_t written, size_t written_before) {
  shm_transport *t = shm_of(comm);
  if (!t || rank < 0 || rank >= t->n || reach == 0) return 0;
  reach = TD_MIN(reach, t->slot_bytes);
  size_t total = 0;
  for (unsigned q = 0; q < 2; q++) {
    const char *slot = shm_slot(comm, rank, q);
    size_t off = (size_t)(slot - t->map), end = reach;
    if (written > 0) { /* read only: fault-around */
      const uintptr_t mask = SHM_FAULT_AROUND_BYTES - 1, first = (uintptr_t)slot, last = first + reach - 1;
      size_t window = (size_t)(((last | mask) + 1) - first);
      /* within the slot the pages its owner wrote; past its end (the next
       * slot's first pages, written by whoever owns it) all of the window */
      end = window > t->slot_bytes ? window : TD_MAX(reach, TD_MIN(written, window));
      /* before its start, the previous slot's tail: the pages of it its
       * owner wrote (q 1's: the same rank's q 0; q 0's: the rank before's
       * q 1, none before rank 0's) in the window of the first byte read */
      size_t before = q == 1 ? written : rank > 0 ? written_before : 0;
      uintptr_t prev = first - t->slot_stride, lo = TD_MAX(first & ~mask, prev);
      uintptr_t hi = TD_MIN(first & ~(uintptr_t)4095, prev + TD_MIN(before, t->slot_bytes)); /* pages wholly before */
      if (before > 0 && hi > lo) total += ((hi - (lo & ~(uintptr_t)4095)) + 4095) / 4096 * 4096;
    }
    total += span_pages(off, end);
  }
  return total;
}

typedef struct arrival_arg {
  uint64_t epoch;
} arrival_arg;

static bool all_arrived(shm_transport *t, const void *arg) {
  uint64_t e = ((const arrival_arg *)arg)->epoch;
  for (int k = 0; k < t->n; k++)
    if (atomic_load_explicit(&t->ranks[k].arrived, memory_order_acquire) < e) return false;
  return true;
}

/* "1, 3 and 5" into buf: the ranks that have not arrived at epoch e. */
static void missing_ranks(shm_transport *t, uint64_t e, char *buf, size_t size) {
  size_t len = 0;
  buf[0] = '\0';
  for (int k = 0; k < t->n && len + 16 < size; k++)
    if (atomic_load_explicit(&t->ranks[k].arrived, memory_order_acquire) < e)
      len += (size_t)snprintf(buf + len, size - len, "%s%d", len ? ", " : "", k);
}

static td_status wait_arrivals(shm_transport *t, uint64_t e, const comm_op *op) {
  td_comm *comm = t->base.comm;
  arrival_arg arg = {e};
  if (shm_spin(t, all_arrived, &arg)) return TD_OK;
  double deadline = op->deadline > 0 ? op->deadline : td_now() + comm->timeout_s;
  for (;;) {
    td_status st = shm_check_abort(t);
    if (st != TD_OK) return st;
    double now = td_now();
    if (now >= deadline) {
      if (all_arrived(t, &arg)) return TD_OK;
      char what[160], who[256];
      comm_op_describe(op, what, sizeof what);
      missing_ranks(t, e, who, sizeof who);
      return comm_fail(comm, TD_ERR_TIMEOUT,
                       "rank %d timed out in %s: rank(s) %s did not reach it within the deadline (TANDEM_TIMEOUT=%g "
                       "s); a rank is stuck, or the ranks issued different collectives",
                       t->rank, what, who, comm->timeout_s);
    }
    if (now >= t->next_liveness) {
      t->next_liveness = now + SHM_SLICE_S;
      /* At most SHM_LIVENESS_PER_SLICE missing ranks per slice, going on
       * where the last slice stopped (the first slice starts after this
       * rank, so the waiting ranks look at different ones): checking every
       * missing rank cost each of n waiting ranks up to n kill(2) calls per
       * slice, O(n^2) system calls in the job (a quarter of the machine at
       * 256 ranks on 2 cores). A dead rank is still found within a slice or
       * two while others wait with this one, within n / 4 slices at worst. */
      int checked = 0;
      for (int i = 0; i < t->n && checked < SHM_LIVENESS_PER_SLICE; i++) {
        int k = (t->live_cursor + i) % t->n;
        if (k == t->rank || atomic_load_explicit(&t->ranks[k].arrived, memory_order_acquire) >= e) continue;
        checked++;
        t->live_cursor = (k + 1) % t->n;
        if (shm_find_dead(t, &k, 1) == k) {
          if (atomic_load_explicit(&t->ranks[k].arrived, memory_order_acquire) >= e) continue;
          char what[160], doing[240];
          comm_op_describe(op, what, sizeof what);
          snprintf(doing, sizeof doing, "waited for it in %s", what);
          return shm_fail_dead(t, k, doing);
        }
      }
    }
    if (shm_sleep(t, all_arrived, &arg, TD_MIN(SHM_SLICE_S, deadline - now))) return TD_OK;
  }
}

/* Fields in which two headers differ, e.g. "count, dtype"; "" if none. */
static void header_diff(const comm_hdr *a, const comm_hdr *b, char *buf, size_t size) {
  buf[0] = '\0';
  size_t len = 0;
#define FIELD(f, name) \
  if (a->f != b->f) len += (size_t)snprintf(buf + len, size > len ? size - len : 0, "%s%s", len ? ", " : "", name)
  FIELD(kind, "operation");
  if (a->kind != b->kind) return; /* the other fields mean different things then */
  FIELD(seq, "sequence number (order)");
  FIELD(count, "count");
  FIELD(dtype, "dtype");
  FIELD(redop, "reduction op");
  FIELD(root, "root");
#undef FIELD
}

td_status shm_sync(td_comm *comm, const comm_op *op) { return shm_sync_addrs(comm, op, NULL, NULL); }

td_status shm_sync_addrs(td_comm *comm, const comm_op *op, const void *addr0, const void *addr1) {
  shm_transport *t = shm_of(comm);
  if (!t) return comm_fail(comm, TD_ERR_INTERNAL, "shm_sync called on a communicator without the shm transport");
  td_status st = shm_check_abort(t);
  if (st != TD_OK) return st;
  uint64_t e = t->epoch + 1;
  unsigned p = (unsigned)(e & 1);
  shm_rank_block *mine = &t->ranks[t->rank];
  comm_hdr_fill(&mine->hdr[p], op, t->rank, 0);
  mine->addr[p][0] = (uint64_t)(uintptr_t)addr0;
  mine->addr[p][1] = (uint64_t)(uintptr_t)addr1;
  atomic_store_explicit(&mine->arrived, e, memory_order_release);
  /* Only a rank that completes the epoch wakes the sleepers: ringing on
   * every arrival woke every sleeping rank N times per epoch (N^2 wake-ups,
   * most of a 256-rank collective on 2 cores). The fence pairs with those
   * of the other arrivals: of ranks arriving at once, the one whose fence
   * comes last sees every arrival, so at least one rank rings; and with
   * shm_sleep's fence, a sleeper either sees the completing arrival or is
   * seen waiting by the ringer. */
  atomic_thread_fence(memory_order_seq_cst);
  arrival_arg complete = {e};
  if (all_arrived(t, &complete))
    for (int k = 0; k < t->n; k++)
      if (k != t->rank) shm_ring(t, k);
  TD_CHECK(wait_arrivals(t, e, op));
  t->epoch = e;

  /* Everyone compares against rank 0, so every rank reports the same pair. */
  const comm_hdr *ref = &t->ranks[0].hdr[p];
  for (int k = 1; k < t->n; k++) {
    const comm_hdr *h = &t->ranks[k].hdr[p];
    char fields[128];
    header_diff(ref, h, fields, sizeof fields);
    if (!fields[0]) continue;
    char a[160], b[160];
    comm_hdr_describe(ref, a, sizeof a);
    comm_hdr_describe(h, b, sizeof b);
    return comm_fail(comm, TD_ERR_MISMATCH,
                     "ranks disagree on a collective (they differ in %s): rank 0 issued %s but rank %d issued %s; "
                     "every rank must issue the same collectives in the same order with the same count, dtype, op "
                     "and root",
                     fields, a, k, b);
  }
  return TD_OK;
}

void shm_copy(void *dst, const void *src, size_t bytes, bool stream) {
#if defined(__SSE2__)
  /* SSE2 (baseline x86-64), not AVX: a streaming copy is bound by memory,
   * not by the width of the stores, and the library is built for any x86-64
   * (src/base/cpu.c). Four 16-byte stores fill one 64-byte line. */
  if (stream && bytes >= 8192) {
    char *d = dst;
    const char *s = src;
    size_t head = (SHM_LINE - ((uintptr_t)d & (SHM_LINE - 1))) & (SHM_LINE - 1);
    memcpy(d, s, head);
    d += head;
    s += head;
    bytes -= head;
    size_t body = bytes & ~(size_t)(SHM_LINE - 1);
    for (size_t i = 0; i < body; i += SHM_LINE) {
      __m128i x0 = _mm_loadu_si128((const __m128i *)(s + i));
      __m128i x1 = _mm_loadu_si128((const __m128i *)(s + i + 16));
      __m128i x2 = _mm_loadu_si128((const __m128i *)(s + i + 32));
      __m128i x3 = _mm_loadu_si128((const __m128i *)(s + i + 48));
      _mm_stream_si128((__m128i *)(d + i), x0);
      _mm_stream_si128((__m128i *)(d + i + 16), x1);
      _mm_stream_si128((__m128i *)(d + i + 32), x2);
      _mm_stream_si128((__m128i *)(d + i + 48), x3);
    }
    _mm_sfence(); /* streaming stores are weakly ordered: publish before any flag */
    memcpy(d + body, s + body, bytes - body);
    return;
  }
#endif
  (void)stream;
  memcpy(dst, src, bytes);
}
