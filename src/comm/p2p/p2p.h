/* The point-to-point framing engine (p2p.c): every message is one frame, a
 * comm_hdr followed by its payload, over the transport's ordered byte
 * streams. What the p2p algorithms (algorithms/) and the progress engine's
 * send/recv streams build on; it calls only core/ and, through the
 * vtable, the transport. */
#ifndef TD_COMM_P2P_H
#define TD_COMM_P2P_H

#include "comm/core/core.h"

typedef struct p2p_xfer {
  int peer;    /* rank; -1 entries are skipped */
  void *buf;   /* send: data to send (const in spirit); recv: destination */
  size_t bytes;
} p2p_xfer;

/* Send one frame (header + payload) to each send peer and receive one frame
 * from each recv peer, all progressing concurrently, blocking (without
 * spinning) until done. Received headers are checked against `op`: a
 * different kind, seq, count, dtype, op, root or payload size is a
 * TD_ERR_MISMATCH naming both ranks and both operations. */
td_status p2p_run(td_comm *comm, const comm_op *op, const p2p_xfer *sends, int n_sends, const p2p_xfer *recvs,
                  int n_recvs);
/* The common case: send to `to` and receive from `from` (either may be -1). */
td_status p2p_exchange(td_comm *comm, const comm_op *op, int to, const void *sbuf, size_t sbytes, int from,
                       void *rbuf, size_t rbytes);

/* Queued send/recv operations run as one set that progresses concurrently
 * and grows while it runs (the progress engine's td_isend/td_irecv
 * streams). The set (p2p_stream) outlives a run: p2p_stream_run pulls
 * queued operations in with pull() (up to max more, deadlines set, a tag
 * each; 0: none now), reports each completion with done(), in any order,
 * and returns when pull() has nothing more and the set is empty, or, after
 * a completion, when stop() (may be NULL) says so, leaving the unfinished
 * operations in the set for the next run, on any thread (never two at
 * once). On a failure every operation in the set and every one pulled
 * afterwards is completed with the error. */
typedef struct p2p_stream p2p_stream;
typedef int (*p2p_stream_pull_fn)(void *ctx, comm_op *ops_out, void **tags_out, int max);
typedef void (*p2p_stream_done_fn)(void *ctx, void *tag, td_status status);
typedef bool (*p2p_stream_stop_fn)(void *ctx);
td_status p2p_stream_create(p2p_stream **out);
void p2p_stream_destroy(p2p_stream *set); /* the set must be empty (p2p_stream_fail first) */
int p2p_stream_pending(const p2p_stream *set); /* operations in the set, not yet done */
td_status p2p_stream_run(td_comm *comm, p2p_stream *set, p2p_stream_pull_fn pull, p2p_stream_done_fn done,
                         p2p_stream_stop_fn stop, void *ctx);
/* Take the point-to-point frames that peers could not finish sending
 * (they rang this rank as stalled senders, transport_vtbl.bell_ring) into
 * the set as unexpected frames that no receive has asked for yet; a receive
 * that joins the set later takes them (p2p.c). Call on the thread that
 * runs the set, while no other thread reads the transport; afterwards
 * p2p_stream_pending says whether frames are still arriving (run the set
 * to finish them). */
td_status p2p_stream_take_unexpected(td_comm *comm, p2p_stream *set);
/* The set holds unexpected frames: a send/recv must then run through the
 * set (a receive that read the transport itself would miss them). */
bool p2p_stream_holds_unexpected(const p2p_stream *set);
/* Complete every operation left in the set with status (a communicator
 * destroyed while they were in flight). */
void p2p_stream_fail(p2p_stream *set, p2p_stream_done_fn done, void *ctx, td_status status);

#endif
