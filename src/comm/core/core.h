/* The operation core of src/comm: what every algorithm, transport and piece
 * of machinery above it may use, and nothing that calls up. The
 * communicator structure, the operation descriptor and its frame header,
 * the transport vtable, the tunables, the sticky-error machinery
 * (comm_fail) and small helpers. The files of core/ call only
 * src/base and src/net. The layer's public face is include/tandem/comm.h.
 *
 * src/comm, bottom to top (every call points down this list):
 *   core/          this header: op, header, failure, tunables
 *   rendezvous/    launcher variables, the rendezvous through the store
 *   transport/     tcp/ and shm/ behind the vtable below
 *   p2p/           framing: header + payload frames over a transport
 *   algorithms/    one file per collective algorithm (p2p/ or shm/)
 *   select/        the table that picks an algorithm for each op
 *   progress/      the progress engine: inline or queued execution
 *   collectives.c  the public collectives (argument checks, sequencing)
 *   mem.c          host-shared buffers (td_mem_alloc)
 *   comm.c         the communicator's lifecycle: init, split, finalize
 *
 * Data flow of one collective:
 *   td_allreduce()            collectives.c: validate arguments, build a comm_op
 *     -> progress_submit()    progress/: run inline (queue idle) or queue it
 *       -> comm_execute()     select/: pick the algorithm from size/world/env
 *         -> allreduce_ring() algorithms/: one file per algorithm, moving bytes with
 *            p2p_exchange()   p2p/: frames (header + payload) over the transport
 *            or shm_sync()    transport/shm: epoch barrier over the shared segment
 *
 * Failure model: any rank that detects an error calls comm_fail(), which
 * records the sticky error and tells every peer through the transport's
 * abort(); peers then fail their current and later operations with the same
 * message. Every wait has a deadline (op->deadline, from TANDEM_TIMEOUT). */
#ifndef TD_COMM_CORE_H
#define TD_COMM_CORE_H

#include <pthread.h>
#include <signal.h>
#include <sys/types.h>

#include "base/base.h"
#include "net/net.h"
#include "tandem/comm.h"

/* ---- operations ---- */

typedef enum comm_kind {
  COMM_ALLREDUCE = 1,
  COMM_REDUCE,
  COMM_BROADCAST,
  COMM_REDUCE_SCATTER,
  COMM_ALLGATHER,
  COMM_ALLTOALL,
  COMM_BARRIER,
  COMM_SEND,
  COMM_RECV,
} comm_kind;

const char *comm_kind_name(comm_kind kind);

/* (collective, algorithm) pairs one communicator keeps counts for: every
 * kind has one algorithm per transport family, so 9 kinds x 4 covers them. */
#define COMM_MAX_STAT_ROWS 36

/* One collective or point-to-point call, as issued by the user. */
typedef struct comm_op {
  comm_kind kind;
  const void *send; /* input (for broadcast: the buffer) */
  void *recv;       /* output (may equal send: in place) */
  size_t count;     /* elements, with the meaning documented in tandem/comm.h */
  td_dtype dtype;   /* the elements the algorithm moves and combines */
  /* The dtype the caller passed. It differs from dtype only while select/select.c
   * runs an f16/bf16 reduction on f32 partial results; frame headers and
   * messages carry user_dtype, so that a rank calling with f16 still
   * mismatches one calling with f32 for the same count. */
  td_dtype user_dtype;
  td_op redop;      /* reductions only */
  int root;         /* reduce/broadcast; -1 otherwise */
  int peer;         /* send/recv; -1 otherwise */
  uint64_t seq;     /* collectives: per-communicator sequence; p2p: per-pair sequence */
  double deadline;  /* td_now() seconds after which the op fails with TD_ERR_TIMEOUT */
  /* Buffers in device memory (or TANDEM_STAGE_HOST_BUFFERS=1): the
   * progress engine hands the op to device/device_coll.c instead of
   * select/, and it uses sequence numbers seq .. seq +
   * device_coll_seq_span() - 1. */
  bool on_device;
} comm_op;

/* What every frame carries so that receivers can check that both sides are
 * executing the same operation (DESIGN.md §3, "Failure"). 48 bytes. */
typedef struct comm_hdr {
  uint32_t magic;  /* COMM_HDR_MAGIC */
  uint32_t kind;   /* comm_kind; SEND frames are checked against RECV */
  uint64_t seq;
  uint64_t count;
  int32_t dtype, redop, root, src_rank;
  uint64_t nbytes; /* payload bytes following this header */
} comm_hdr;
#define COMM_HDR_MAGIC 0x54444d31u /* "TDM1" */

/* Fill a header describing `op` as sent by `src_rank` with nbytes payload. */
void comm_hdr_fill(comm_hdr *h, const comm_op *op, int src_rank, uint64_t nbytes);
/* Describe op for messages: "allreduce(seq 7, count 1000, f32, sum)". */
void comm_op_describe(const comm_op *op, char *buf, size_t size);
void comm_hdr_describe(const comm_hdr *h, char *buf, size_t size);

/* ---- transports ----
 * A transport moves bytes between this rank and every peer of the
 * communicator as independent ordered byte streams (one per direction per
 * pair), without blocking. The framing engine (p2p/p2p.c) builds everything else
 * on top. Implementations: transport/shm (same host) and transport/tcp. */
typedef struct transport transport;
typedef struct transport_vtbl {
  const char *name; /* "shm", "tcp" */
  /* Move up to len bytes to/from peer without blocking; *moved = bytes moved
   * (0 if it would block). On a broken peer (EOF, reset, dead process) call
   * comm_fail() with TD_ERR_REMOTE naming the peer and return that status. */
  td_status (*try_send)(transport *t, int peer, const void *buf, size_t len, size_t *moved);
  td_status (*try_recv)(transport *t, int peer, void *buf, size_t len, size_t *moved);
  /* Optional (NULL: the engine calls try_send twice). try_send of the bytes
   * of a (alen) followed by those of b (blen) in one call: *moved counts
   * from the start of a. The framing engine sends a frame's header and its
   * payload with it, so that TCP carries them as one stream write instead of
   * a header-only segment ahead of every payload (p2p/p2p.c). */
  td_status (*try_send2)(transport *t, int peer, const void *a, size_t alen, const void *b, size_t blen,
                         size_t *moved);
  /* Sleep until a try_send to one of send_peers or a try_recv from one of
   * recv_peers may make progress, or timeout_s passes, or the communicator
   * fails. Spurious returns are allowed; never spin. */
  td_status (*wait)(transport *t, const int *send_peers, int n_send, const int *recv_peers, int n_recv,
                    double timeout_s);
  /* Tell every peer that this communicator failed (called once, by
   * comm_fail, on the first error). Must not block for long. */
  void (*abort)(transport *t, td_status status, const char *reason);
  /* Release all resources. Does not communicate. */
  void (*destroy)(transport *t);
  /* Optional (NULL: nothing to check). Called on the executing thread after
   * each operation completed without error on this rank, before the caller
   * sees TD_OK: a transport that can complete an operation from data peers
   * sent before one of them failed checks here, cheaply (at most a syscall
   * on the normal path), whether one has failed, and if so fails the
   * communicator and returns that status. */
  td_status (*op_done)(transport *t);
  /* Optional (NULL: cannot peek). Copy up to len bytes that try_recv from
   * peer would return next into buf without consuming them, without
   * blocking; *got = bytes copied (0 if none). Used only by the stuck check
   * (p2p/p2p.c) to read the header of a frame that the algorithm never asked
   * for. A broken connection is left for try_recv to report. */
  td_status (*try_peek)(transport *t, int peer, void *buf, size_t len, size_t *got);
  /* Optional (NULL: none). The peers this transport found silent when it
   * failed the communicator (td_comm_silent_ranks). Any thread. */
  int (*silent_peers)(transport *t, int *ranks, int max);
  /* Optional (NULL: no rows). What the heartbeats measured of each peer
   * (td_comm_heartbeat_stats). Any thread. */
  int (*heartbeat_stats)(transport *t, td_heartbeat_stats *rows, int max);
  /* Optional, all four or none (NULL: the progress thread sleeps on a
   * condition variable that only this rank's threads signal). The progress
   * thread's doorbell, which peers ring too: a sender whose point-to-point
   * frame stalls on a full buffer to a rank that has posted no receive for
   * it rings that rank's bell as `stalled`, so that its idle progress thread
   * takes the frame into memory of its own and the send completes while
   * the receiver computes (MPI's unexpected messages; p2p/p2p.c).
   * bell_read: the bell's value, and in *stalled whether a peer rang as a
   * stalled sender since the last take_stalled. bell_sleep: until the value
   * differs from seen, or timeout_s; never spins. bell_ring: ring rank's
   * bell (this rank's own: a thread queued work). take_stalled: the peers
   * that rang as stalled senders (up to max, clearing them; a superset is
   * allowed), returns how many. */
  uint32_t (*bell_read)(transport *t, bool *stalled);
  void (*bell_sleep)(transport *t, uint32_t seen, double timeout_s);
  void (*bell_ring)(transport *t, int rank, bool stalled);
  int (*take_stalled)(transport *t, int *peers, int max);
  /* Optional (NULL: the send/recv stream wakes every 2 ms to pull new
   * operations, p2p/p2p.c). Make this rank's wait() in progress, or the
   * next one, return: another thread of this rank queued operations for
   * the thread that waits. With it the stream sleeps until a peer, a
   * queued operation, a stalled sender or a failure wakes it (the slices
   * only bound the deadline checks). Any thread; must not block. */
  void (*wake)(transport *t);
} transport_vtbl;

struct transport {
  const transport_vtbl *vtbl;
  td_comm *comm;
};

/* For tests that act on a half-built job (tests/net/test_security.c): if
 * TANDEM_TEST_TRANSPORT_GATE_FD names a descriptor, a rank reads one byte
 * (or EOF) from it after the rendezvous and before it connects to its TCP
 * peers or maps rank 0's segment. Unset, it costs one getenv per transport. */
#include <unistd.h>
static inline void transport_test_gate(void) {
  /* TANDEM_TEST_ELASTIC_STOP_BEFORE_CONNECT=UID: the elastic process with
   * that launch number stops itself after the peers' addresses were
   * exchanged, before any connection (tests/elastic/elastic.sh
   * abandon-connect kills it there). */
  long stop = td_env_long("TANDEM_TEST_ELASTIC_STOP_BEFORE_CONNECT", -1);
  if (stop >= 0 && td_env_long("TANDEM_ELASTIC_ID", -2) == stop) raise(SIGSTOP);
  long fd = td_env_long("TANDEM_TEST_TRANSPORT_GATE_FD", -1);
  if (fd < 0) return;
  char byte;
  ssize_t n;
  TD_SYSCALL_RETRY(n, read((int)fd, &byte, 1));
  (void)n;
}

/* ---- tunables (core/tunables.c) ----
 * Every TANDEM_* setting the layer uses, read and checked once when a
 * communicator is created. Unset byte sizes are COMM_TUN_UNSET and unset spin
 * times negative: the file that uses one applies its own default
 * (comm_tun_bytes). */
#define COMM_TUN_UNSET ((size_t)-1)
#define COMM_TUN_MAX_TIMEOUT_S 1e7 /* about 4 months: deadlines stay far from overflow */
enum { COMM_ALGO_AUTO = 0, COMM_ALGO_RING, COMM_ALGO_RD, COMM_ALGO_SHM };
enum { COMM_DEVICE_COLL_AUTO = 0, COMM_DEVICE_COLL_NCCL, COMM_DEVICE_COLL_STAGED };
typedef struct comm_tunables {
  double timeout_s;          /* TANDEM_TIMEOUT (td_comm_config.timeout_s wins), default 300 */
  double connect_timeout_s;  /* TANDEM_CONNECT_TIMEOUT, default 60 */
  int allreduce_algo;        /* TANDEM_ALLREDUCE_ALGO: COMM_ALGO_* */
  bool shm_collectives;      /* TANDEM_SHM_COLLECTIVES (default 1) */
  bool shm_xmap;             /* TANDEM_SHM_XMAP (default 1) */
  bool shm_cma;              /* TANDEM_SHM_CMA (default 1): single-copy shm payloads */
  bool half_partials;        /* TANDEM_HALF_PARTIALS=half: f16/bf16 partials travel in the half type */
  size_t rd_max_bytes;       /* TANDEM_RD_MAX_BYTES */
  size_t ring_chunk_bytes;   /* TANDEM_RING_CHUNK_BYTES */
  size_t bcast_chunk_bytes;  /* TANDEM_BCAST_CHUNK_BYTES (broadcast and reduce trees) */
  size_t shm_fifo_bytes;     /* TANDEM_SHM_FIFO_BYTES */
  size_t p2p_unexpected_bytes; /* TANDEM_P2P_UNEXPECTED_BYTES (p2p/p2p.c; 0: none taken) */
  size_t shm_slot_bytes;     /* TANDEM_SHM_SLOT_BYTES */
  size_t shm_chunk_bytes;    /* TANDEM_SHM_CHUNK_BYTES */
  size_t tcp_buffer_bytes;   /* TANDEM_TCP_BUFFER_BYTES (0: kernel autotuning) */
  size_t device_chunk_bytes; /* TANDEM_DEVICE_CHUNK_BYTES: staged device collectives (device/staged.c) */
  int device_coll;           /* TANDEM_DEVICE_COLL: COMM_DEVICE_COLL_* */
  bool stage_host_buffers;   /* TANDEM_STAGE_HOST_BUFFERS=1: host buffers take the staged device path too */
  double shm_spin_us;        /* TANDEM_SHM_SPIN_US */
  double tcp_spin_us;        /* TANDEM_TCP_SPIN_US */
  int tcp_protect;           /* TANDEM_TCP_PROTECT: a net_protect_mode (default off) */
  double heartbeat_interval_s; /* TANDEM_HEARTBEAT_INTERVAL (negative: unset) */
  double heartbeat_timeout_s;  /* TANDEM_HEARTBEAT_TIMEOUT (negative: unset; 0: off) */
  double heartbeat_min_timeout_s; /* TANDEM_HEARTBEAT_MIN_TIMEOUT (negative: unset: no adaptive timeout) */
  char host_addr[64];        /* TANDEM_HOST_ADDR: the address this rank publishes ("" unset) */
  char iface[16];            /* TANDEM_IFACE: the interface whose address it publishes ("" unset) */
} comm_tunables;

/* Fill *t from config (may be NULL) and the environment; a malformed or
 * out-of-range value is TD_ERR_INVALID_ARGUMENT naming the variable. */
td_status comm_tunables_read(const td_comm_config *config, comm_tunables *t);
static inline size_t comm_tun_bytes(size_t value, size_t dflt) { return value == COMM_TUN_UNSET ? dflt : value; }
static inline double comm_tun_spin_us(double value, double dflt) { return value < 0 ? dflt : value; }

/* ---- the communicator ---- */

typedef struct comm_request_queue comm_request_queue; /* progress/progress.c */

struct td_comm {
  int rank, size;
  int local_rank, local_size; /* among ranks with the same host identity */
  int host_size;              /* the job's ranks on this host: local_size of the communicator this one was
                                 split from, transitively (0 until set up) */
  int *local_ranks;           /* the local_size ranks on this host, ascending */
  int *world_ranks;           /* each rank's rank in the communicator of td_comm_init this one was split
                                 from (transitively): what a message about a peer names beside its rank here */
  bool split;                 /* made by td_comm_split (its ranks are not the world's) */
  pid_t *pids;                /* pid of every rank (valid for local ranks) */
  char **hosts;               /* host identity of every rank */
  char **addrs;               /* advertised "host" address of every rank */

  char prefix[160];           /* store namespace of this communicator, "job/c0", "job/c0.s1.c2" */
  td_store *store;            /* NULL for a world of one */
  td_store_server *store_server; /* when this rank hosts the store */
  double timeout_s;
  char transport_req[8];      /* "auto", "shm" or "tcp" */
  transport *xport;           /* NULL for a world of one */
  const char *xport_name;     /* "self", "shm", "tcp" */

  /* sticky error: first failure wins */
  pthread_mutex_t err_mu;
  _Atomic int err_status;     /* td_status; TD_OK while healthy */
  char err_msg[1024];
  /* The latest failure of a call on this communicator that did not break it
   * (bad argument, misuse); under err_mu. See comm_note_failure. */
  char call_msg[1024];

  /* sequencing (issue order; touched only by the issuing thread) */
  uint64_t coll_seq;
  uint64_t *send_seq, *recv_seq; /* per peer */
  uint64_t split_count;
  /* The last collective that completed on this rank (executing thread
   * only; magic 0 until one did): a frame of it still unread afterwards
   * tells how the peer ran it differently (p2p/p2p.c). */
  comm_hdr last_coll;

  /* progress engine (progress/progress.c) */
  comm_request_queue *queue;
  bool finalized;

  comm_tunables tun;          /* TANDEM_* settings, read once at creation */
  /* Unexpected point-to-point frames this communicator's stream may hold
   * (td_comm_hold_unexpected; p2p/p2p.c): at most unx_cap_bytes in all,
   * frames of at most unx_frame_bytes each; 0: none (the default). Set by
   * any thread, read by the executing one. TANDEM_P2P_UNEXPECTED_BYTES,
   * when set, overrides both. Not inherited by td_comm_split. */
  _Atomic size_t unx_cap_bytes, unx_frame_bytes;
  /* f32 partial results of half-precision reductions (select/select.c), kept and
   * grown between operations: a fresh buffer per call costs a page fault
   * per 4 KiB, which measured slower than the transfer itself. Touched only
   * by the executing thread (one operation at a time). */
  float *half_work;
  size_t half_work_count;

  /* collectives on device buffers (device/device_coll.c), set up by the
   * first one; NULL until then */
  struct device_coll *dev;

  /* What each (collective, algorithm) pair moved and took on this rank:
   * one row per pair seen, added by comm_execute (select/select.c) after
   * each operation, read by td_comm_collective_stats from any thread. */
  pthread_mutex_t stats_mu;
  struct comm_stat_row {
    comm_kind kind;
    const char *algorithm; /* a static string of select.c's name table */
    uint64_t calls, bytes;
    double seconds;
  } stats[COMM_MAX_STAT_ROWS];
  int n_stats;

  /* algorithm selection (select/select.c), from tun and the transport */
  int sel_allreduce;          /* forced allreduce algorithm, 0 = auto */
  size_t sel_rd_max_bytes;    /* auto: recursive doubling up to this size */
  bool sel_shm_collectives;   /* shm transport: use the *_shm algorithms */

  /* Construction only (td_comm_config.abandon): polled between slices of
   * the rendezvous waits; true means the others will never come (a member
   * was reported dead, a newer membership formed), with the reason in why. */
  bool (*abandon_fn)(void *ctx, char *why, size_t why_size);
  void *abandon_ctx;
};

/* ---- failure (core/failure.c) ---- */

/* Record the sticky error (first call wins; later calls return the first
 * status), log it at error level, and notify peers via the transport. Returns
 * the communicator's (first) status so callers can `return comm_fail(...)`. */
td_status comm_fail(td_comm *comm, td_status status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A peer as messages name it: "rank R (DETAIL)" for a communicator made by
 * td_comm_init, "rank R (world rank W, DETAIL)" for a split one, where R
 * alone would leave a reader of the job's output guessing which process it
 * was (a pipeline or tensor group's rank 1 is another process in every
 * group; the launcher prefixes output lines with world ranks). detail (a
 * pid, an address) may be NULL. Writes into buf and returns it. */
const char *comm_peer_name(const td_comm *comm, int peer, const char *detail, char *buf, size_t size);
/* Where a failed call's message goes (the rule stated in tandem/base.h):
 * the failing call has already put it in the calling thread's
 * td_last_error(); this also records it on comm for td_comm_last_error(),
 * unless comm is broken (its sticky message stays). Returns st; TD_OK,
 * TD_ERR_IN_PROGRESS and a NULL comm pass through untouched. Every public
 * entry point that takes a communicator returns through it. */
td_status comm_note_failure(td_comm *comm, td_status st);
/* TD_OK or the sticky error; cheap (one atomic load). */
static inline td_status comm_status(const td_comm *comm) {
  return (td_status)atomic_load_explicit(&((td_comm *)comm)->err_status, memory_order_acquire);
}
/* If the deadline has passed: fail with TD_ERR_TIMEOUT describing `op`. */
td_status comm_check_deadline(td_comm *comm, const comm_op *op);

/* Small shared helpers for algorithms (core/op.c). */
static inline size_t comm_op_bytes(const comm_op *op) { return op->count * td_dtype_size(op->dtype); }
/* Copy send -> recv unless in place (the first step of many algorithms). */
void comm_copy_if_needed(void *dst, const void *src, size_t bytes);

#endif
