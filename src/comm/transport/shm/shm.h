/* The shared-memory transport, for itself, the communicator's lifecycle
 * (the constructor) and the *_shm algorithms (the primitives and the
 * segment layout). Its files, bottom to top: shm_wait.c (shm_of, waiting,
 * failure checks), shm_sync.c (the collective primitives), shm_xmap.c
 * (mapping peers' host-shared buffers), shm_cma.c (single-copy
 * point-to-point payloads), shm_transport.c (the vtable and
 * the segment's creation).
 *
 * One segment per communicator, created by rank 0 and unlinked as soon as
 * every rank has mapped it (a killed job leaves nothing in /dev/shm):
 *
 *   [seg_header][abort block][rank block x n][slots: n x 2][fifo x n(n-1)]
 *
 * Everything before the FIFOs (O(n)) is reserved at creation; each FIFO is
 * reserved by the first rank that uses it, so that the memory of a job
 * grows with n and the pairs that exchange messages, not with n^2.
 *
 * Every field written by one rank and polled by others sits on its own cache
 * line, so that a poll never steals a line that its owner is writing. */
#ifndef TD_SHM_TRANSPORT_H
#define TD_SHM_TRANSPORT_H

#include "comm/core/core.h"

/* Map (rank 0: create) the communicator's segment, wiring through
 * comm->store under comm->prefix; returns when every rank has attached. */
td_status shm_transport_create(td_comm *comm, transport **out);

/* ---- collective primitives for the *_shm algorithms ----
 * Available when comm->xport is the shm transport (all ranks on one host).
 * Each rank owns two slots (parity 0 and 1) of shm_slot_bytes() bytes that
 * every rank can read. The rule that makes reuse safe without extra
 * handshakes: a rank writes its slot of parity p only between the end of
 * sync epoch e-1 and its arrival at epoch e, where e % 2 == p; peers read
 * that slot only after sync e and before their arrival at e+1. */
bool shm_available(const td_comm *comm);
size_t shm_slot_bytes(const td_comm *comm);
/* The epoch the next shm_sync will complete; its parity selects the slots. */
uint64_t shm_next_epoch(const td_comm *comm);
void *shm_slot(const td_comm *comm, int rank, unsigned parity);
/* For td_comm_staging_bytes (comm/mem.c): bytes of the whole pages of
 * both of rank's slots that a process's RSS counts once it has touched
 * their first `reach` bytes, and the FIFO from src to dst (reserved whole
 * at its first use). `written` > 0: the slots are another rank's, which
 * wrote their first `written` bytes, and this process only read them: a
 * read fault also maps the pages around it that are already there (the
 * kernel's fault-around, 64 KiB aligned windows by default), so the pages
 * of [0, written) in the window of the last page read count too (and
 * within reach those of the windows before: counted, as reach covers them),
 * and a window reaching past the slot's end all of it (the next slot's
 * pages: an upper bound), and one reaching before its start the pages of
 * the slot before that its owner wrote (written_before: how far the rank
 * before wrote its own). 0 off the shm transport. */
size_t shm_slot_pages(const td_comm *comm, int rank, size_t reach, size_t written, size_t written_before);
size_t shm_fifo_pages(const td_comm *comm, int src, int dst);
/* Arrive at the next epoch and wait (spin briefly, then futex) for every rank
 * to arrive. Compares every rank's op header for this epoch: disagreement is
 * TD_ERR_MISMATCH naming the ranks. Fails on abort, dead peer or deadline. */
td_status shm_sync(td_comm *comm, const comm_op *op);

#define SHM_LINE 64
#define SHM_MAGIC 0x54444d5348u /* "TDMSH" */
#define SHM_STALL_BITS 1024 /* senders per rank told apart by a stall (more: a few extra looks) */

typedef struct shm_seg_header {
  uint64_t magic;
  uint32_t n_ranks;
  uint32_t lazy_fifos;  /* 1: each FIFO is reserved by its first user (net_shm_populate) */
  uint64_t total_bytes;
  uint64_t fifo_bytes;  /* capacity of each pair FIFO */
  uint64_t slot_bytes;  /* each collective slot */
  uint64_t chunk_bytes; /* pipeline chunk of the large-message algorithms */
  int32_t leader_pid;   /* rank 0, whose probe region the others try to map */
  uint32_t xmap;             /* mapping each other's host-shared buffers allowed (TANDEM_SHM_XMAP) */
  net_hostmem_ref xprobe;    /* rank 0's probe region, which the others try to map */
} shm_seg_header;

/* First failure of the communicator. `claimed` is won by CAS; the winner
 * fills status/rank/msg and then sets `ready`, which readers check. */
typedef struct shm_abort_block {
  _Alignas(SHM_LINE) _Atomic uint32_t claimed;
  _Atomic uint32_t ready;
  int32_t status;
  int32_t rank;
  char msg[1008];
} shm_abort_block;

typedef struct shm_rank_block {
  /* written once at attach; `detached` when the rank destroys its
   * communicator, so that peers still waiting for it fail at once */
  _Alignas(SHM_LINE) int32_t pid;
  _Atomic uint32_t detached;
  uint32_t xmap_ok; /* this rank could map rank 0's host-shared probe region */
  uint64_t cma_probe; /* where peers read this process's probe constant (shm_cma.c) */
  /* doorbell: bumped by peers that made progress possible for this rank
   * (data or space in a FIFO, an arrival, an abort); `waiting` counts this
   * rank's threads asleep on it, so that peers skip the futex_wake syscall
   * when nobody sleeps. */
  _Alignas(SHM_LINE) _Atomic uint32_t bell;
  _Atomic uint32_t waiting;
  /* set by this rank's threads when they queue point-to-point work
   * (transport_vtbl.wake) and by a peer ringing as a stalled sender: the
   * next shm_wait returns at once, so that its caller pulls or takes them;
   * cleared as a wait returns */
  _Atomic uint32_t kick;
  /* the progress thread's doorbell (transport_vtbl.bell_*): bumped by
   * this rank's own threads when they queue work, and by a peer whose
   * point-to-point frame stalls on a full FIFO to this rank, which also
   * sets its bit in `stalled` (rank mod SHM_STALL_BITS) so that the
   * progress thread knows which FIFOs to look at */
  _Alignas(SHM_LINE) _Atomic uint32_t p2p_bell;
  _Atomic uint32_t p2p_waiting;
  _Atomic uint32_t stalled[SHM_STALL_BITS / 32];
  /* the last epoch this rank arrived at, and its op header per parity */
  _Alignas(SHM_LINE) _Atomic uint64_t arrived;
  comm_hdr hdr[2];
  uint64_t addr[2][2]; /* per parity: buffer addresses published with the header */
  net_hostmem_ref xref[2][2]; /* per parity: where they lie in host-shared memory (fd -1: not) */
} shm_rank_block;

/* Single-producer/single-consumer byte ring: head and tail are running byte
 * totals, each on its own line; data follows the control block. The post
 * lines are the pair's single-copy mailbox (shm_cma.c): running totals of
 * bytes posted by the producer and taken by the consumer, the current
 * post's address in the producer and the total it starts at. */
enum { SHM_CMA_UNKNOWN = 0, SHM_CMA_YES = 1, SHM_CMA_NO = 2 };
typedef struct shm_fifo {
  _Alignas(SHM_LINE) _Atomic uint64_t head; /* bytes written by the producer */
  _Alignas(SHM_LINE) _Atomic uint64_t tail; /* bytes consumed by the consumer */
  _Alignas(SHM_LINE) _Atomic uint64_t post_total; /* producer: bytes ever posted */
  uint64_t post_addr, post_base;                  /* producer: the current post */
  _Alignas(SHM_LINE) _Atomic uint64_t post_taken; /* consumer: bytes of posts read */
  _Atomic uint32_t cma_state;                     /* consumer: SHM_CMA_*, whether it can read the producer */
} shm_fifo;

/* A rank's own view of its single-copy post to one peer. */
typedef struct shm_cma_sender {
  bool active;       /* posted, not all of it reported taken yet */
  uint64_t reported; /* post_taken already reported to the caller as moved */
} shm_cma_sender;

/* A peer's host-shared region mapped here (cached across collectives). */
typedef struct shm_peer_map {
  uint64_t serial; /* 0: empty */
  uint64_t bytes;
  char *base;
} shm_peer_map;
#define SHM_PEER_MAPS 8 /* cached regions per peer (a training job uses one or two) */

typedef struct shm_transport {
  transport base;
  char *map;          /* the whole segment */
  size_t map_bytes;
  char name[128];     /* segment name, "" once unlinked */
  int rank, n;
  size_t fifo_bytes, slot_bytes, slot_stride, chunk_bytes;
  shm_abort_block *abort_blk;
  shm_rank_block *ranks; /* n entries */
  char *fifo_base;       /* n(n-1) rings of (sizeof(shm_fifo) + fifo_bytes) */
  size_t fifo_stride;
  size_t fifo_off;       /* where the FIFOs start: the bytes before are reserved at creation */
  bool lazy_fifos;       /* FIFOs are reserved on first use (fifo_reserve) */
  uint8_t *fifo_ready;   /* n: bit 0 our FIFO to that peer reserved, bit 1 its FIFO to us */
  char *slot_base;       /* 2n slots of slot_stride */
  uint64_t epoch;        /* the last epoch this rank completed */
  bool spin;             /* spinning allowed: a core per local rank */
  bool xmap;             /* every rank can map every other's host-shared buffers */
  void *xprobe;          /* rank 0: the probe region, freed once setup completes */
  shm_peer_map *pmaps;   /* n x SHM_PEER_MAPS */
  unsigned *pmap_next;   /* n: round-robin victim */
  bool cma;             /* single-copy payloads allowed here (TANDEM_SHM_CMA) */
  shm_cma_sender *cma_send; /* n: this rank's posts, per peer */
  double spin_s;
  _Atomic uint64_t yield_off_until; /* td_now_ns(): waits sleep at once until then (shm_spin) */
  double next_liveness; /* td_now() of the next dead-peer check */
  int live_cursor;      /* the rank the next dead-peer check of a sync starts at */
} shm_transport;

/* The ring from src to dst (src != dst, both < n; shm_transport.c). */
shm_fifo *shm_fifo_of(const shm_transport *t, int src, int dst);

/* shm_wait.c: the shm transport of comm (NULL if comm does not use it),
 * recognized by its vtable's name pointing at shm_transport_name. */
extern const char shm_transport_name[];
shm_transport *shm_of(const td_comm *comm);

/* Bytes per pipeline chunk for the large-message algorithms (<= slot). */
size_t shm_chunk_bytes(const td_comm *comm);


/* shm_sync that also publishes two addresses of this rank's buffers for the
 * epoch (shm_sync_shared uses it; valid until the rank's arrival two epochs
 * later). */
td_status shm_sync_addrs(td_comm *comm, const comm_op *op, const void *addr0, const void *addr1);

/* Direct collectives on host-shared buffers (td_mem_alloc): every rank can
 * map every other's (probed at setup, TANDEM_SHM_XMAP=0 turns it off); equal
 * on every rank. */
bool shm_xmap(const td_comm *comm);
/* shm_sync that also publishes where this rank's send (send_bytes) and recv
 * (recv_bytes) buffers lie in host-shared memory; shm_shared then tells,
 * the same on every rank, whether rank's buffer `which` (0 send, 1 recv)
 * does (until the next sync). A NULL or empty buffer is not shared. */
td_status shm_sync_shared(td_comm *comm, const comm_op *op, const void *send, size_t send_bytes, const void *recv,
                          size_t recv_bytes);
bool shm_shared(const td_comm *comm, int rank, int which);
/* shm_shared for `which` of every rank. */
bool shm_all_shared(const td_comm *comm, int which);
/* After shm_sync_shared found rank's buffer `which` (0 send, 1 recv)
 * shared, and until the next sync: where it is in this process. */
td_status shm_peer_buffer(td_comm *comm, int rank, int which, char **out);
/* Unmap every cached peer region (transport teardown). */
void shm_unmap_peers(shm_transport *t);
/* Setup: rank 0 publishes a probe region; the others try to map it. */
void shm_xmap_publish(shm_transport *t);
uint32_t shm_xmap_probe(shm_transport *t);
void shm_xmap_setup_done(shm_transport *t);

/* shm_cma.c: single-copy payloads (protocol in its top comment). A
 * payload goes by post when it is at least this large and does not fit in
 * the ring's free space. */
#define SHM_CMA_MIN_BYTES ((size_t)64 << 10)
/* At attach: where peers read this process's probe constant. */
void shm_cma_publish(shm_transport *t);
/* Before this rank first reads the ring from peer: whether it can read
 * peer's memory, published in from_peer->cma_state for the peer. */
void shm_cma_probe(shm_transport *t, int peer, shm_fifo *from_peer);
/* Whether a payload of len bytes, with `space` free in the ring, goes by
 * post to the consumer of to_peer. */
bool shm_cma_postable(const shm_transport *t, const shm_fifo *to_peer, size_t len, size_t space);
/* Post buf[0, len) to peer (nothing posted to it before is left) and ring. */
void shm_cma_post(shm_transport *t, int peer, shm_fifo *to_peer, const void *buf, size_t len);
/* With a post to peer active: the bytes peer took since the last call
 * (*moved); buf must be where the caller's payload goes on. */
td_status shm_cma_sent(shm_transport *t, int peer, shm_fifo *to_peer, const void *buf, size_t *moved);
/* Consumer: a post from the producer of from_peer holds bytes not taken. */
bool shm_cma_pending(const shm_fifo *from_peer);
/* Producer: peer took bytes of this rank's active post not reported yet. */
bool shm_cma_taken(const shm_transport *t, int peer, const shm_fifo *to_peer);
/* Consumer: read up to len bytes of peer's post into buf (*moved), ring. */
td_status shm_cma_take(shm_transport *t, int peer, shm_fifo *from_peer, void *buf, size_t len, size_t *moved);

/* Copy bytes; with `stream`, destination lines are written with
 * non-temporal stores (for large outputs that will not be read again soon,
 * which saves the read-for-ownership of every destination line). */
void shm_copy(void *dst, const void *src, size_t bytes, bool stream);

/* shm_wait.c: doorbells, spinning, sleeping and failure checks, for the
 * other files of the transport. */
void shm_ring(shm_transport *t, int peer);
/* transport_vtbl.bell_read/bell_sleep/bell_ring/take_stalled */
uint32_t shm_bell_read(transport *xt, bool *stalled);
void shm_bell_sleep(transport *xt, uint32_t seen, double timeout_s);
void shm_bell_ring(transport *xt, int rank, bool stalled);
int shm_take_stalled(transport *xt, int *peers, int max);
/* transport_vtbl.wake (shm_wait in shm_transport.c returns on it). */
void shm_wake(transport *xt);
typedef bool (*shm_ready_fn)(shm_transport *t, const void *arg);
bool shm_spin(shm_transport *t, shm_ready_fn ready, const void *arg);
bool shm_sleep(shm_transport *t, shm_ready_fn ready, const void *arg, double slice_s);
td_status shm_check_abort(shm_transport *t);
int shm_find_dead(shm_transport *t, const int *peers, int n);
td_status shm_fail_dead(shm_transport *t, int peer, const char *while_doing);
#define SHM_SLICE_S 0.1 /* longest sleep between failure checks */
#define SHM_LIVENESS_PER_SLICE 4 /* ranks whose process a waiting rank checks per slice */

/* For algorithms: the world of one and count 0 cases, common to all. */
static inline bool shm_trivial(const td_comm *comm) { return comm->size <= 1; }
/* TD_OK when comm runs on the shm transport; otherwise an internal error
 * naming the algorithm (select/select.c only picks *_shm there: a caller that
 * bypasses it gets an error instead of a crash). */
td_status shm_require(td_comm *comm, const char *algorithm);

#endif
