/* The point-to-point framing engine. Every message is one frame, a comm_hdr
 * followed by its payload, on the ordered byte stream between two ranks.
 * p2p_run drives any number of sends and receives of one operation at once
 * over the transport's non-blocking try_send/try_recv, so that patterns
 * where everybody sends first (rings, pairwise exchanges) never deadlock on
 * full buffers. When nothing moves it sleeps in the transport's wait() in
 * slices of at most 100 ms, checking between slices for a failure reported
 * by another thread and for the operation's deadline.
 *
 * Every received header is compared with the operation this rank executes:
 * a difference means the ranks issued different collectives (or the same
 * one with different arguments), reported as TD_ERR_MISMATCH naming both. */
#include "comm/p2p/p2p.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Payloads up to this size travel in one buffer with their header: one
 * transport call (one syscall, one packet on TCP) instead of two. */
#define P2P_PACK_MAX 464

typedef struct xfer_state {
  union {
    comm_hdr hdr;
    unsigned char packed[sizeof(comm_hdr) + P2P_PACK_MAX];
  } u;
  size_t hdr_done, data_done;
  size_t frame_bytes; /* packed sends: header + payload in u.packed */
  bool done;
} xfer_state;

/* Only the first unfinished transfer per peer and direction may move: the
 * stream is ordered, so a second frame to the same peer must wait. */
static bool blocked_by_earlier(const p2p_xfer *x, const xfer_state *s, int i) {
  for (int j = 0; j < i; j++)
    if (x[j].peer == x[i].peer && !s[j].done) return true;
  return false;
}

static td_status step_send(td_comm *comm, const p2p_xfer *x, xfer_state *s, bool *moved_any) {
  transport *t = comm->xport;
  size_t moved;
  if (s->frame_bytes) {
    while (s->hdr_done < s->frame_bytes) {
      TD_CHECK(t->vtbl->try_send(t, x->peer, s->u.packed + s->hdr_done, s->frame_bytes - s->hdr_done, &moved));
      if (!moved) return TD_OK;
      s->hdr_done += moved;
      *moved_any = true;
    }
    s->done = true;
    return TD_OK;
  }
  while (s->hdr_done < sizeof(comm_hdr)) {
    const char *hdr = (const char *)&s->u.hdr + s->hdr_done;
    size_t hdr_left = sizeof(comm_hdr) - s->hdr_done;
    if (t->vtbl->try_send2) /* header and payload in one write (see try_send2) */
      TD_CHECK(t->vtbl->try_send2(t, x->peer, hdr, hdr_left, x->buf, x->bytes, &moved));
    else
      TD_CHECK(t->vtbl->try_send(t, x->peer, hdr, hdr_left, &moved));
    if (!moved) return TD_OK;
    *moved_any = true;
    if (moved <= hdr_left) {
      s->hdr_done += moved;
      continue;
    }
    s->hdr_done = sizeof(comm_hdr);
    s->data_done = moved - hdr_left;
  }
  while (s->data_done < x->bytes) {
    TD_CHECK(t->vtbl->try_send(t, x->peer, (char *)x->buf + s->data_done, x->bytes - s->data_done, &moved));
    if (!moved) return TD_OK;
    s->data_done += moved;
    *moved_any = true;
  }
  s->done = true;
  return TD_OK;
}

/* Which arguments of two operation headers differ, as "operation, count".
 * The reduction op and the root mean something only when the kinds agree. */
static void diff_fields(const comm_hdr *a, const comm_hdr *b, char *buf, size_t size) {
  bool same_kind = a->kind == b->kind;
  const struct { bool differs; const char *name; } diffs[] = {
      {!same_kind, "operation"},           {a->seq != b->seq, "order"},
      {a->count != b->count, "count"},     {a->dtype != b->dtype, "dtype"},
      {same_kind && a->redop != b->redop, "op"}, {same_kind && a->root != b->root, "root"},
  };
  size_t used = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < TD_ARRAY_SIZE(diffs); i++)
    if (diffs[i].differs && used < size)
      used += (size_t)snprintf(buf + used, size - used, "%s%s", used ? ", " : "", diffs[i].name);
}

/* The received header h from `peer` must describe `op` with `bytes` of
 * payload. */
static td_status check_header(td_comm *comm, const comm_op *op, int peer, size_t bytes, const comm_hdr *h) {
  comm_kind expected_kind = op->kind == COMM_RECV ? COMM_SEND : op->kind;
  char mine[256], theirs[256];
  if (h->magic == COMM_HDR_MAGIC && h->kind == (uint32_t)expected_kind && h->seq == op->seq &&
      h->count == op->count && h->dtype == (int32_t)op->user_dtype && h->redop == (int32_t)op->redop &&
      h->root == op->root && h->src_rank == peer && h->nbytes == bytes)
    return TD_OK;
  comm_op_describe(op, mine, sizeof mine);
  comm_hdr_describe(h, theirs, sizeof theirs);
  if (h->magic != COMM_HDR_MAGIC)
    return comm_fail(comm, TD_ERR_MISMATCH, "rank %d received %s from rank %d while executing %s", comm->rank,
                     theirs, peer, mine);
  if (h->src_rank != peer)
    return comm_fail(comm, TD_ERR_INTERNAL, "rank %d received a frame claiming to come from rank %d on the stream "
                                            "from rank %d (%s, while executing %s)",
                     comm->rank, h->src_rank, peer, theirs, mine);
  /* A frame of the collective this rank finished last, still unread: the
   * peer ran that collective differently (as the root of a broadcast that
   * this rank thought had another root, say), so compare it with that one. */
  const comm_hdr *last = &comm->last_coll;
  if (h->kind != COMM_SEND && last->magic == COMM_HDR_MAGIC && h->seq == last->seq &&
      (h->kind != last->kind || h->count != last->count || h->dtype != last->dtype || h->redop != last->redop ||
       h->root != last->root)) {
    char fields[96], before[256];
    comm_hdr_describe(last, before, sizeof before);
    char *from = strstr(before, " from rank"); /* it describes this rank's own operation */
    if (from) *from = '\0';
    diff_fields(last, h, fields, sizeof fields);
    return comm_fail(comm, TD_ERR_MISMATCH,
                     "rank %d issued %s but rank %d sent %s (they differ in %s; the frame was still unread at "
                     "the next operation); every rank must issue the same collectives in the same order with the "
                     "same count, dtype, op and root",
                     comm->rank, before, peer, theirs, fields);
  }
  if (h->kind == (uint32_t)expected_kind && h->seq == op->seq && h->count == op->count &&
      h->dtype == (int32_t)op->user_dtype && h->redop == (int32_t)op->redop && h->root == op->root)
    return comm_fail(comm, TD_ERR_MISMATCH,
                     "rank %d expected %zu payload bytes from rank %d in %s but got %llu: the ranks chose "
                     "different algorithms (do all ranks set the same TANDEM_* variables?)",
                     comm->rank, bytes, peer, mine, (unsigned long long)h->nbytes);
  comm_hdr expected;
  comm_hdr_fill(&expected, op, comm->rank, bytes);
  expected.kind = (uint32_t)expected_kind;
  char fields[96];
  diff_fields(&expected, h, fields, sizeof fields);
  return comm_fail(comm, TD_ERR_MISMATCH,
                   "rank %d issued %s but rank %d sent %s (they differ in %s); every rank must issue the same "
                   "collectives in the same order with the same count, dtype, op and root",
                   comm->rank, mine, peer, theirs, fields);
}

static td_status step_recv(td_comm *comm, const comm_op *op, const p2p_xfer *x, xfer_state *s, bool *moved_any) {
  transport *t = comm->xport;
  size_t moved;
  while (s->hdr_done < sizeof(comm_hdr)) {
    TD_CHECK(t->vtbl->try_recv(t, x->peer, (char *)&s->u.hdr + s->hdr_done, sizeof(comm_hdr) - s->hdr_done, &moved));
    if (!moved) return TD_OK;
    s->hdr_done += moved;
    *moved_any = true;
    if (s->hdr_done == sizeof(comm_hdr)) TD_CHECK(check_header(comm, op, x->peer, x->bytes, &s->u.hdr));
  }
  while (s->data_done < x->bytes) {
    TD_CHECK(t->vtbl->try_recv(t, x->peer, (char *)x->buf + s->data_done, x->bytes - s->data_done, &moved));
    if (!moved) return TD_OK;
    s->data_done += moved;
    *moved_any = true;
  }
  s->done = true;
  return TD_OK;
}

static td_status check_peer(td_comm *comm, const comm_op *op, int peer, const char *what) {
  if (peer < comm->size && peer != comm->rank) return TD_OK;
  char desc[256];
  comm_op_describe(op, desc, sizeof desc);
  return comm_fail(comm, TD_ERR_INTERNAL, "rank %d: %s: invalid %s peer %d (world size %d)", comm->rank, desc, what,
                   peer, comm->size);
}

/* ---- stuck-collective check ----
 * Frames carry headers, so most disagreements are caught when the first
 * frame arrives. But ranks that issued different collectives may all wait
 * to receive and never exchange a frame (e.g. an allreduce on some ranks
 * against a broadcast on others). So a collective that has moved nothing
 * for P2P_STUCK_CHECK_S publishes its header in the store, under
 * "<prefix>/op/<rank>", and compares it with those published by the peers
 * it waits for: the same sequence number with different arguments is a
 * mismatch. Costs nothing while data moves.
 *
 * Peers that disagree on the shape of the exchange (the root of a tree)
 * may also have finished without waiting for anything, leaving a frame
 * this rank's algorithm never reads. So the stuck check also looks, where
 * the transport can peek, at the next frame from every peer it is not in
 * the middle of receiving from (that stream is at a frame boundary): a
 * collective frame of this sequence number with other arguments, or of an
 * earlier one (every frame of a collective is read within it), is a
 * mismatch. Frames of later collectives (a faster peer) and of send/recv
 * are left alone. */
#define P2P_STUCK_CHECK_S 1.0

/* The mismatch report for a frame header h, seen on the stream from peer,
 * that disagrees with op. */
static td_status report_frame_mismatch(td_comm *comm, const comm_op *op, int peer, const comm_hdr *h) {
  char mine[256], theirs[256], fields[96];
  comm_op_describe(op, mine, sizeof mine);
  comm_hdr_describe(h, theirs, sizeof theirs);
  comm_hdr expected;
  comm_hdr_fill(&expected, op, comm->rank, h->nbytes);
  diff_fields(&expected, h, fields, sizeof fields);
  return comm_fail(comm, TD_ERR_MISMATCH,
                   "rank %d issued %s but rank %d sent %s (they differ in %s); every rank must issue the same "
                   "collectives in the same order with the same count, dtype, op and root",
                   comm->rank, mine, peer, theirs, fields);
}

/* The peek half of the stuck check; recv_peers are the peers this rank is
 * receiving from (possibly in the middle of a frame). */
static td_status peek_bystanders(td_comm *comm, const comm_op *op, const int *recv_peers, int n_recv) {
  transport *t = comm->xport;
  if (!t->vtbl->try_peek) return TD_OK;
  for (int p = 0; p < comm->size; p++) {
    if (p == comm->rank) continue;
    bool receiving = false;
    for (int i = 0; i < n_recv && !receiving; i++) receiving = recv_peers[i] == p;
    if (receiving) continue;
    comm_hdr h;
    size_t got = 0;
    TD_CHECK(t->vtbl->try_peek(t, p, &h, sizeof h, &got));
    if (got < sizeof h || h.magic != COMM_HDR_MAGIC || h.kind == COMM_SEND || h.seq > op->seq) continue;
    if (h.seq == op->seq && h.kind == (uint32_t)op->kind && h.count == op->count &&
        h.dtype == (int32_t)op->user_dtype && h.redop == (int32_t)op->redop && h.root == op->root)
      continue;
    return report_frame_mismatch(comm, op, p, &h);
  }
  return TD_OK;
}

static td_status check_stuck(td_comm *comm, const comm_op *op, const int *peers, int n_peers, int n_send_peers) {
  if (op->kind == COMM_SEND || op->kind == COMM_RECV) return TD_OK;
  TD_CHECK(peek_bystanders(comm, op, peers + n_send_peers, n_peers - n_send_peers));
  if (!comm->store) return TD_OK;
  char key[224];
  comm_hdr mine;
  comm_hdr_fill(&mine, op, comm->rank, 0);
  snprintf(key, sizeof key, "%s/op/%d", comm->prefix, comm->rank);
  if (store_set(comm->store, key, &mine, sizeof mine) != TD_OK) return TD_OK; /* best effort */
  for (int i = 0; i < n_peers; i++) {
    void *value = NULL;
    size_t len = 0;
    int found = 0;
    snprintf(key, sizeof key, "%s/op/%d", comm->prefix, peers[i]);
    if (store_get(comm->store, key, &value, &len, &found) != TD_OK || !found) continue;
    comm_hdr theirs;
    bool usable = len == sizeof theirs;
    if (usable) memcpy(&theirs, value, sizeof theirs);
    free(value);
    if (!usable || theirs.magic != COMM_HDR_MAGIC || theirs.seq != op->seq) continue;
    if (theirs.kind == mine.kind && theirs.count == mine.count && theirs.dtype == mine.dtype &&
        theirs.redop == mine.redop && theirs.root == mine.root)
      continue;
    char a[256], b[256];
    comm_op_describe(op, a, sizeof a);
    comm_hdr_describe(&theirs, b, sizeof b);
    /* The header describes the peer's own operation, not a frame it sent. */
    char *from = strstr(b, " from rank");
    if (from) *from = '\0';
    char fields[96];
    diff_fields(&mine, &theirs, fields, sizeof fields);
    return comm_fail(comm, TD_ERR_MISMATCH,
                     "rank %d issued %s but rank %d issued %s (they differ in %s); every rank must issue the same "
                     "collectives in the same order with the same count, dtype, op and root",
                     comm->rank, a, peers[i], b, fields);
  }
  return TD_OK;
}

#define SOP(i) (sops ? sops[i] : op)
#define ROP(i) (rops ? rops[i] : op)

/* The engine. Transfer i of each direction belongs to operation sops[i] /
 * rops[i] (its header is built from / checked against it), or to `op` when
 * the array is NULL. */
static td_status run_xfers(td_comm *comm, const comm_op *op, const comm_op *const *sops, const p2p_xfer *sends,
                           int n_sends, const comm_op *const *rops, const p2p_xfer *recvs, int n_recvs) {
  td_status st = comm_status(comm);
  if (st != TD_OK) return st;
  if (!comm->xport)
    return comm_fail(comm, TD_ERR_INTERNAL, "rank %d: point-to-point transfer without a transport (world size %d)",
                     comm->rank, comm->size);

  xfer_state stack_states[16];
  int n_total = n_sends + n_recvs;
  xfer_state *states = n_total <= 16 ? stack_states : malloc((size_t)n_total * sizeof *states);
  if (!states) return comm_fail(comm, TD_ERR_SYSTEM, "out of memory for %d transfers", n_total);
  xfer_state *ss = states, *rs = states + n_sends;

  int n_left = 0;
  for (int i = 0; i < n_sends; i++) {
    xfer_state *s = &ss[i];
    s->hdr_done = s->data_done = s->frame_bytes = 0;
    s->done = sends[i].peer < 0;
    if (s->done) continue;
    TD_CHECK_GOTO(check_peer(comm, SOP(i), sends[i].peer, "send"), st, out);
    n_left++;
    comm_hdr_fill(&s->u.hdr, SOP(i), comm->rank, sends[i].bytes);
    if (sends[i].bytes <= P2P_PACK_MAX) {
      if (sends[i].bytes) memcpy(s->u.packed + sizeof(comm_hdr), sends[i].buf, sends[i].bytes);
      s->frame_bytes = sizeof(comm_hdr) + sends[i].bytes;
    }
  }
  for (int i = 0; i < n_recvs; i++) {
    xfer_state *s = &rs[i];
    s->hdr_done = s->data_done = s->frame_bytes = 0;
    s->done = recvs[i].peer < 0;
    if (s->done) continue;
    TD_CHECK_GOTO(check_peer(comm, ROP(i), recvs[i].peer, "receive"), st, out);
    n_left++;
  }

  /* An operation built without a deadline still gets the configured one. */
  double deadline = op->deadline > 0 ? op->deadline : td_now() + comm->timeout_s;
  int stack_peers[32];
  int *wait_peers = n_total <= 32 ? stack_peers : malloc((size_t)n_total * sizeof *wait_peers);
  if (!wait_peers) {
    st = comm_fail(comm, TD_ERR_SYSTEM, "out of memory for %d transfers", n_total);
    goto out;
  }

  double next_stuck_check = td_now() + P2P_STUCK_CHECK_S;
  bool rang = false; /* a td_send stalled on a full buffer rang its receiver (see p2p_stream_run) */
  while (n_left > 0) {
    bool moved = false;
    for (int i = 0; i < n_sends; i++) {
      if (ss[i].done || blocked_by_earlier(sends, ss, i)) continue;
      TD_CHECK_GOTO(step_send(comm, &sends[i], &ss[i], &moved), st, out_peers);
      if (ss[i].done) n_left--;
      else if (op->kind == COMM_SEND && !rang && !ss[i].frame_bytes && ss[i].hdr_done == sizeof(comm_hdr) &&
               comm->xport->vtbl->bell_ring) {
        comm->xport->vtbl->bell_ring(comm->xport, sends[i].peer, true);
        rang = true;
      }
    }
    for (int i = 0; i < n_recvs; i++) {
      if (rs[i].done || blocked_by_earlier(recvs, rs, i)) continue;
      TD_CHECK_GOTO(step_recv(comm, ROP(i), &recvs[i], &rs[i], &moved), st, out_peers);
      if (rs[i].done) n_left--;
    }
    if (moved) next_stuck_check = td_now() + P2P_STUCK_CHECK_S;
    if (n_left == 0 || moved) continue;

    st = comm_status(comm);
    if (st != TD_OK) goto out_peers;
    double left = deadline - td_now();
    if (left <= 0) {
      char desc[256];
      int stuck = -1;
      const comm_op *stuck_op = op;
      const char *dir = "receive from";
      for (int i = 0; i < n_recvs && stuck < 0; i++)
        if (!rs[i].done) stuck = recvs[i].peer, stuck_op = ROP(i);
      for (int i = 0; i < n_sends && stuck < 0; i++)
        if (!ss[i].done) stuck = sends[i].peer, stuck_op = SOP(i), dir = "send to";
      comm_op_describe(stuck_op, desc, sizeof desc);
      st = comm_fail(comm, TD_ERR_TIMEOUT, "%s did not finish within %g s (TANDEM_TIMEOUT): still waiting to %s rank %d",
                     desc, comm->timeout_s, dir, stuck);
      goto out_peers;
    }
    int n_wait_send = 0, n_wait_recv = 0;
    for (int i = 0; i < n_sends; i++)
      if (!ss[i].done) wait_peers[n_wait_send++] = sends[i].peer;
    for (int i = 0; i < n_recvs; i++)
      if (!rs[i].done) wait_peers[n_wait_send + n_wait_recv++] = recvs[i].peer;
    if (td_now() >= next_stuck_check) {
      next_stuck_check = td_now() + P2P_STUCK_CHECK_S;
      TD_CHECK_GOTO(check_stuck(comm, op, wait_peers, n_wait_send + n_wait_recv, n_wait_send), st,
                    out_peers);
    }
    st = comm->xport->vtbl->wait(comm->xport, wait_peers, n_wait_send, wait_peers + n_wait_send, n_wait_recv,
                                 left < 0.1 ? left : 0.1);
    if (st != TD_OK && st != TD_ERR_TIMEOUT) goto out_peers;
    st = TD_OK;
  }
  st = comm_status(comm);

out_peers:
  if (wait_peers != stack_peers) free(wait_peers);
out:
  if (states != stack_states) free(states);
  return st;
}

#undef SOP
#undef ROP

td_status p2p_run(td_comm *comm, const comm_op *op, const p2p_xfer *sends, int n_sends, const p2p_xfer *recvs,
                  int n_recvs) {
  return run_xfers(comm, op, NULL, sends, n_sends, NULL, recvs, n_recvs);
}

/* ---- the send/recv stream ----
 * Non-blocking sends and receives must progress together, as in MPI: a
 * rank may post all its receives before its sends, or a ring of isend +
 * irecv may carry messages larger than any buffer. The progress engine runs
 * queued send/recv operations here as one growing set: operations queued
 * while the set runs join it (pulled between steps, and at least every
 * P2P_STREAM_SLICE_S while it waits), and each completes on its own as soon
 * as its frame is through. Frames to (from) one peer still go in issue
 * order.
 *
 * The set outlives a run: a thread that runs it to finish one operation of
 * its own (td_wait helping) leaves as soon as that one is done, and the
 * progress thread carries on with the rest. A waiter that stayed until the
 * whole set drained would also wait for its earlier sends, which finish
 * only when their receiver posts the receives; two ranks each waiting so
 * for the other (a pipeline whose stages are each other's neighbours both
 * ways) would never post them. */

#define P2P_STREAM_FIRST 64
/* How long the stream sleeps before it looks for operations queued
 * meanwhile: on a transport that can be woken for them
 * (transport_vtbl.wake), only the deadline checks bound the sleep. On 2
 * cores with 4 ranks the 2 ms slice made 100-200 wake-ups per rank per
 * training step of deterministic reduction's exchange (its stream waits
 * for peers still in backward). */
#define P2P_STREAM_SLICE_S 0.002
#define P2P_STREAM_WOKEN_SLICE_S 0.1

/* ---- unexpected frames ----
 * A send frame larger than the transport's buffer moves only while its
 * receiver reads it. So that such a send completes while the receiver
 * computes, whether or not it has posted the receive yet (a pipeline stage
 * posts it only when it needs the data), the receiver's idle progress
 * thread takes the frame into a buffer of its own when the sender rings it
 * as stalled (transport_vtbl.bell_*, shm only): an "unexpected" entry of
 * the set, which reads the frame like a receive. A receive that joins the
 * set later takes the oldest unexpected frame from its peer: a finished one
 * is copied out; one still arriving is taken over (its bytes so far copied,
 * the rest read straight into the receive's buffer). Headers are checked
 * against the receive when it joins, as they are for a receive that reads
 * the frame itself.
 *
 * A communicator takes none unless its owner asks (td_comm_hold_unexpected:
 * the pipeline engine does for its own communicator, with a cap of the
 * activation messages its schedule can have in flight, which its memory
 * estimate counts), because the frames held are memory: taken on every
 * communicator (TANDEM_P2P_UNEXPECTED_BYTES=64M), an elastic commit's
 * exchange, taken ahead of its receives, put a stage-3 rank 4-12% above
 * its estimate (memory_bound_elastic_stage3). A frame beyond the cap, or
 * larger than the largest frame asked for, waits in the transport for its
 * receive, as before (MPI's eager/rendezvous split).
 *
 * The buffers are kept for reuse (a free list, best fit), never more bytes
 * in all, held or free, than the cap: a fresh malloc per frame (mmap'ed at
 * these sizes) faulted in every page of every message again (an elastic
 * 2-rank run with a 64 MiB cap: 169 page faults per rank per step instead
 * of 15; bench/pipeline_faults.sh measures a pipeline's). */
typedef struct unexpected_frame {
  struct unexpected_frame *next; /* arrival order; or the free list */
  comm_hdr hdr;
  size_t size; /* bytes buf holds */
  void *buf;   /* just after this struct, in the same allocation */
} unexpected_frame;

typedef struct stream_entry {
  comm_op op;
  void *tag;
  p2p_xfer x;
  xfer_state s;
  unexpected_frame *unx; /* non-NULL: a frame nobody asked for yet, read into x.buf = unx->buf */
  bool rang;       /* send: the receiver was rung as this frame stalled */
} stream_entry;

struct p2p_stream {
  stream_entry *e; /* in issue order */
  int n, cap;
  comm_op *pulled; /* cap each: scratch for pull() */
  void **tags;
  int *wait_peers; /* 2 * cap */
  unexpected_frame *unx_head, *unx_tail; /* unexpected frames fully read */
  size_t unx_bytes;                      /* held by those and by unexpected entries */
  unexpected_frame *unx_free;            /* buffers kept for the next frames */
  size_t unx_kept;                       /* bytes of every buffer, held or free: at most the cap */
};

/* The cap and the largest frame taken: the communicator's
 * (td_comm_hold_unexpected), or TANDEM_P2P_UNEXPECTED_BYTES for both. */
static size_t unexpected_cap(const td_comm *comm, size_t *frame_max) {
  if (comm->tun.p2p_unexpected_bytes != COMM_TUN_UNSET) {
    *frame_max = comm->tun.p2p_unexpected_bytes;
    return comm->tun.p2p_unexpected_bytes;
  }
  td_comm *c = (td_comm *)comm;
  *frame_max = atomic_load_explicit(&c->unx_frame_bytes, memory_order_relaxed);
  return atomic_load_explicit(&c->unx_cap_bytes, memory_order_relaxed);
}

static void frame_free(p2p_stream *s, unexpected_frame *u) {
  s->unx_kept -= u->size;
  free(u);
}

/* Free kept buffers while more than cap bytes are kept (the cap lowered). */
static void frames_trim(p2p_stream *s, size_t cap) {
  while (s->unx_free && s->unx_kept > cap) {
    unexpected_frame *u = s->unx_free;
    s->unx_free = u->next;
    frame_free(s, u);
  }
}

/* A buffer for an n-byte frame: the smallest free one that holds it, else a
 * new one if it fits under cap (after freeing kept ones that do not
 * serve); NULL: the frame stays in the transport. */
static unexpected_frame *frame_get(p2p_stream *s, size_t n, size_t cap) {
  unexpected_frame **best = NULL;
  for (unexpected_frame **pp = &s->unx_free; *pp; pp = &(*pp)->next)
    if ((*pp)->size >= n && (!best || (*pp)->size < (*best)->size)) best = pp;
  unexpected_frame *u;
  if (best) {
    u = *best;
    *best = u->next;
    return u;
  }
  while (s->unx_free && s->unx_kept + n > cap) {
    u = s->unx_free;
    s->unx_free = u->next;
    frame_free(s, u);
  }
  if (n > cap || s->unx_kept > cap - n || !(u = malloc(sizeof *u + n))) return NULL;
  u->size = n;
  u->buf = u + 1;
  s->unx_kept += n;
  return u;
}

/* A frame done with goes back to the free list (freed if the cap was lowered). */
static void frame_put(p2p_stream *s, unexpected_frame *u, size_t cap) {
  if (s->unx_kept > cap) {
    frame_free(s, u);
    return;
  }
  u->next = s->unx_free;
  s->unx_free = u;
}

td_status p2p_stream_create(p2p_stream **out) {
  p2p_stream *s = calloc(1, sizeof *s);
  if (!s) return td_error(TD_ERR_SYSTEM, "out of memory for the point-to-point stream");
  *out = s;
  return TD_OK;
}

void p2p_stream_destroy(p2p_stream *s) {
  if (!s) return;
  while (s->unx_head) {
    unexpected_frame *u = s->unx_head;
    s->unx_head = u->next;
    free(u);
  }
  while (s->unx_free) {
    unexpected_frame *u = s->unx_free;
    s->unx_free = u->next;
    free(u);
  }
  free(s->e);
  free(s->pulled);
  free(s->tags);
  free(s->wait_peers);
  free(s);
}

int p2p_stream_pending(const p2p_stream *s) { return s ? s->n : 0; }
bool p2p_stream_holds_unexpected(const p2p_stream *s) { return s && (s->unx_head || s->unx_bytes); }

/* Room for cap operations: a set only grows, so that operations queued by a
 * rank that posts many before it waits never queue behind a full set. */
static bool stream_grow(p2p_stream *s, int cap) {
  if (cap <= s->cap) return true;
  stream_entry *e = realloc(s->e, (size_t)cap * sizeof *e);
  if (e) s->e = e;
  comm_op *pulled = realloc(s->pulled, (size_t)cap * sizeof *pulled);
  if (pulled) s->pulled = pulled;
  void **tags = realloc(s->tags, (size_t)cap * sizeof *tags);
  if (tags) s->tags = tags;
  int *wait_peers = realloc(s->wait_peers, 2 * (size_t)cap * sizeof *wait_peers);
  if (wait_peers) s->wait_peers = wait_peers;
  if (!e || !pulled || !tags || !wait_peers) return false;
  s->cap = cap;
  return true;
}

void p2p_stream_fail(p2p_stream *s, p2p_stream_done_fn done, void *ctx, td_status status) {
  for (int i = 0; s && i < s->n; i++) {
    if (s->e[i].unx) {
      frame_free(s, s->e[i].unx);
      s->unx_bytes -= s->e[i].x.bytes;
    } else {
      done(ctx, s->e[i].tag, status);
    }
  }
  if (s) s->n = 0;
}

/* A receive (e) joining the set takes the oldest unexpected frame from its
 * peer, if any: *taken says so; a finished frame completes it here (*done_now),
 * one still arriving is taken over by its entry (slot j), e is dropped. */
static td_status match_unexpected(td_comm *comm, p2p_stream *s, stream_entry *e, bool *taken, bool *done_now) {
  *taken = *done_now = false;
  unexpected_frame *prev = NULL, *u = s->unx_head;
  while (u && u->hdr.src_rank != e->x.peer) prev = u, u = u->next;
  if (u) {
    TD_CHECK(check_header(comm, &e->op, e->x.peer, e->x.bytes, &u->hdr));
    if (e->x.bytes) memcpy(e->x.buf, u->buf, e->x.bytes);
    if (prev) prev->next = u->next;
    else s->unx_head = u->next;
    if (s->unx_tail == u) s->unx_tail = prev;
    s->unx_bytes -= e->x.bytes;
    frame_put(s, u, unexpected_cap(comm, &(size_t){0}));
    *taken = *done_now = true;
    return TD_OK;
  }
  for (int j = 0; j < s->n; j++) {
    stream_entry *a = &s->e[j];
    if (!a->unx || a->x.peer != e->x.peer) continue;
    TD_CHECK(check_header(comm, &e->op, e->x.peer, e->x.bytes, &a->s.u.hdr));
    if (a->s.data_done) memcpy(e->x.buf, a->x.buf, a->s.data_done);
    frame_put(s, a->unx, unexpected_cap(comm, &(size_t){0}));
    a->unx = NULL;
    s->unx_bytes -= a->x.bytes;
    a->op = e->op;
    a->tag = e->tag;
    a->x.buf = e->x.buf;
    *taken = true;
    return TD_OK;
  }
  return TD_OK;
}

/* An unexpected entry that is fully read moves to the list of finished
 * frames. */
static void keep_unexpected(p2p_stream *s, stream_entry *a) {
  unexpected_frame *u = a->unx;
  u->next = NULL;
  u->hdr = a->s.u.hdr;
  if (s->unx_tail) s->unx_tail->next = u;
  else s->unx_head = u;
  s->unx_tail = u;
}

td_status p2p_stream_take_unexpected(td_comm *comm, p2p_stream *s) {
  transport *t = comm->xport;
  if (!t || !t->vtbl->take_stalled || !t->vtbl->try_peek || comm->size < 2) return TD_OK;
  int *peers = malloc((size_t)comm->size * sizeof *peers);
  if (!peers) return comm_fail(comm, TD_ERR_SYSTEM, "rank %d: out of memory for %d peers", comm->rank, comm->size);
  int k = t->vtbl->take_stalled(t, peers, comm->size);
  size_t frame_max = 0, cap = unexpected_cap(comm, &frame_max);
  frames_trim(s, cap);
  td_status st = TD_OK;
  for (int i = 0; i < k && st == TD_OK; i++) {
    int p = peers[i];
    /* Only at a frame boundary that no entry reads from: a receive or an
     * unexpected entry from p already in the set has (or will have) it. */
    bool busy = false;
    for (int j = 0; j < s->n && !busy; j++) busy = s->e[j].op.kind == COMM_RECV && s->e[j].x.peer == p;
    if (busy) continue;
    for (;;) { /* every frame waiting, while they fit */
      comm_hdr h;
      size_t got = 0;
      if ((st = t->vtbl->try_peek(t, p, &h, sizeof h, &got)) != TD_OK) break;
      if (got < sizeof h || h.magic != COMM_HDR_MAGIC || h.kind != COMM_SEND || h.src_rank != p || h.nbytes == 0 ||
          h.nbytes > frame_max)
        break;
      if (s->n == s->cap && !stream_grow(s, s->cap ? 2 * s->cap : P2P_STREAM_FIRST)) {
        st = comm_fail(comm, TD_ERR_SYSTEM, "out of memory for the point-to-point stream");
        break;
      }
      unexpected_frame *u = frame_get(s, (size_t)h.nbytes, cap);
      if (!u) break; /* beyond the cap (or out of memory): left in the transport for its receive */
      void *buf = u->buf;
      size_t moved = 0;
      if ((st = t->vtbl->try_recv(t, p, &h, sizeof h, &moved)) != TD_OK || moved != sizeof h) {
        frame_put(s, u, cap);
        if (st == TD_OK) /* try_recv returns what try_peek saw */
          st = comm_fail(comm, TD_ERR_INTERNAL, "rank %d: a peeked frame header from rank %d was not there", comm->rank, p);
        break;
      }
      stream_entry *a = &s->e[s->n++];
      memset(a, 0, sizeof *a);
      a->op.kind = COMM_RECV;
      a->op.peer = p;
      a->op.deadline = td_now() + comm->timeout_s; /* the sender is in the middle of it */
      a->x = (p2p_xfer){p, buf, (size_t)h.nbytes};
      a->s.u.hdr = h;
      a->s.hdr_done = sizeof h;
      a->unx = u;
      s->unx_bytes += a->x.bytes;
      bool moved_any = false;
      if ((st = step_recv(comm, &a->op, &a->x, &a->s, &moved_any)) != TD_OK) break;
      if (!a->s.done) break; /* the rest comes on the stream */
      keep_unexpected(s, a);
      s->n--;
    }
  }
  free(peers);
  return st;
}

static bool stream_blocked(const stream_entry *e, int i) {
  for (int j = 0; j < i; j++)
    if (e[j].op.kind == e[i].op.kind && e[j].op.peer == e[i].op.peer) return true;
  return false;
}

td_status p2p_stream_run(td_comm *comm, p2p_stream *set, p2p_stream_pull_fn pull, p2p_stream_done_fn done,
                         p2p_stream_stop_fn stop, void *ctx) {
  td_status st = TD_OK;
  if (!set->cap && !stream_grow(set, P2P_STREAM_FIRST)) {
    st = comm_fail(comm, TD_ERR_SYSTEM, "out of memory for the point-to-point stream");
    /* Still take (and fail) whatever is queued so that nobody waits on it. */
    comm_op one;
    void *tag;
    while (pull(ctx, &one, &tag, 1) == 1) done(ctx, tag, st);
    return st;
  }
  if (!comm->xport) {
    st = comm_fail(comm, TD_ERR_INTERNAL, "rank %d: point-to-point transfer without a transport", comm->rank);
    goto fail_all;
  }

  for (;;) {
    /* Join newly queued operations, growing the set when it is full. */
    bool joined = false, completed = false;
    if (set->n == set->cap && !stream_grow(set, 2 * set->cap)) {
      st = comm_fail(comm, TD_ERR_SYSTEM, "out of memory for %d point-to-point operations", 2 * set->cap);
      goto fail_all;
    }
    int k = pull(ctx, set->pulled, set->tags, set->cap - set->n);
    for (int i = 0; i < k; i++) {
      stream_entry *ne = &set->e[set->n++];
      memset(&ne->s, 0, sizeof ne->s);
      ne->op = set->pulled[i];
      ne->tag = set->tags[i];
      ne->x.peer = ne->op.peer;
      ne->x.bytes = comm_op_bytes(&ne->op);
      ne->x.buf = ne->op.kind == COMM_SEND ? (void *)ne->op.send : ne->op.recv;
      ne->unx = NULL;
      ne->rang = false;
      joined = true;
      if (ne->op.kind == COMM_SEND) {
        comm_hdr_fill(&ne->s.u.hdr, &ne->op, comm->rank, ne->x.bytes);
        if (ne->x.bytes <= P2P_PACK_MAX) {
          if (ne->x.bytes) memcpy(ne->s.u.packed + sizeof(comm_hdr), ne->x.buf, ne->x.bytes);
          ne->s.frame_bytes = sizeof(comm_hdr) + ne->x.bytes;
        }
        continue;
      }
      if (!set->unx_head && set->unx_bytes == 0) continue; /* nothing unexpected held */
      bool taken, done_now;
      st = match_unexpected(comm, set, ne, &taken, &done_now);
      if (st != TD_OK) goto fail_all;
      if (done_now) done(ctx, ne->tag, TD_OK), completed = true;
      if (taken) set->n--; /* completed, or its unexpected entry reads the rest */
    }
    if (set->n == 0) break;
    st = comm_status(comm);
    if (st != TD_OK) goto fail_all;

    stream_entry *e = set->e;
    int n = set->n;
    bool moved = false;
    for (int i = 0; i < n; i++) {
      if (stream_blocked(e, i)) continue;
      if (e[i].op.kind == COMM_SEND)
        st = step_send(comm, &e[i].x, &e[i].s, &moved);
      else
        st = step_recv(comm, &e[i].op, &e[i].x, &e[i].s, &moved);
      if (st != TD_OK) goto fail_all;
      /* A frame stalled on a full buffer after its header went in: ring the
       * receiver, whose idle progress thread may take it (once per frame). */
      if (e[i].op.kind == COMM_SEND && !e[i].s.done && !e[i].rang && !e[i].s.frame_bytes &&
          e[i].s.hdr_done == sizeof(comm_hdr) && comm->xport->vtbl->bell_ring) {
        comm->xport->vtbl->bell_ring(comm->xport, e[i].op.peer, true);
        e[i].rang = true;
      }
    }
    /* Complete finished operations, keeping the rest in issue order; first
     * let the transport say whether they only completed from data sent
     * before a peer failed. */
    bool any_done = false;
    for (int i = 0; i < n && !any_done; i++) any_done = e[i].s.done;
    if (any_done && comm->xport->vtbl->op_done) {
      st = comm->xport->vtbl->op_done(comm->xport);
      if (st != TD_OK) goto fail_all;
    }
    int kept = 0;
    for (int i = 0; i < n; i++) {
      if (!e[i].s.done)
        e[kept++] = e[i];
      else if (e[i].unx)
        keep_unexpected(set, &e[i]);
      else
        done(ctx, e[i].tag, TD_OK);
    }
    set->n = n = kept;
    /* (a receive completed from an unexpected frame as it joined counts: a
     * waiter that stayed for the rest of the set could deadlock, see above) */
    if ((any_done || completed) && stop && stop(ctx)) return TD_OK; /* the rest stays in the set */
    if (moved || joined || n == 0) continue;

    /* Nothing moved. A busy stream (a stage whose own sends wait for its
     * neighbour) keeps the progress thread from ever going idle, where it
     * takes stalled frames (progress.c): take them here too. */
    if (comm->xport->vtbl->bell_read) {
      bool stalled = false;
      (void)comm->xport->vtbl->bell_read(comm->xport, &stalled);
      if (stalled) {
        st = p2p_stream_take_unexpected(comm, set);
        if (st != TD_OK) goto fail_all;
        continue;
      }
    }
    /* Check deadlines, then sleep briefly on the peers. */
    double now = td_now();
    for (int i = 0; i < n; i++) {
      if (now < e[i].op.deadline) continue;
      char desc[256];
      comm_op_describe(&e[i].op, desc, sizeof desc);
      st = comm_fail(comm, TD_ERR_TIMEOUT, "%s did not finish within %g s (TANDEM_TIMEOUT): rank %d never %s",
                     desc, comm->timeout_s, e[i].op.peer,
                     e[i].op.kind == COMM_SEND ? "took the message" : "sent the message");
      goto fail_all;
    }
    int *wait_peers = set->wait_peers, n_send = 0, n_recv = 0;
    for (int i = 0; i < n; i++)
      if (e[i].op.kind == COMM_SEND) wait_peers[n_send++] = e[i].op.peer;
    for (int i = 0; i < n; i++)
      if (e[i].op.kind == COMM_RECV) wait_peers[n_send + n_recv++] = e[i].op.peer;
    st = comm->xport->vtbl->wait(comm->xport, wait_peers, n_send, wait_peers + n_send, n_recv,
                                 comm->xport->vtbl->wake ? P2P_STREAM_WOKEN_SLICE_S : P2P_STREAM_SLICE_S);
    if (st != TD_OK && st != TD_ERR_TIMEOUT) goto fail_all;
    st = TD_OK;
  }
  return TD_OK;

fail_all:
  /* The communicator is broken (sticky): every operation in the set, and
   * every one still queued behind it, fails with its status. */
  if (comm_status(comm) != TD_OK) st = td_error(comm_status(comm), "%s", comm->err_msg);
  p2p_stream_fail(set, done, ctx, st);
  {
    comm_op one;
    void *tag;
    while (pull(ctx, &one, &tag, 1) == 1) done(ctx, tag, st);
  }
  return st;
}

td_status p2p_exchange(td_comm *comm, const comm_op *op, int to, const void *sbuf, size_t sbytes, int from,
                       void *rbuf, size_t rbytes) {
  p2p_xfer send = {to, (void *)sbuf, sbytes};
  p2p_xfer recv = {from, rbuf, rbytes};
  return p2p_run(comm, op, &send, to >= 0 ? 1 : 0, &recv, from >= 0 ? 1 : 0);
}
