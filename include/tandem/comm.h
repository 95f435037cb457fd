/* Tandem public API: communicators and collectives.
 *
 * A communicator (td_comm) is a group of ranks, one OS process each, that
 * issue the same collectives in the same order (as in MPI and NCCL). Ranks on
 * one host talk through a shared-memory segment, ranks on different hosts (or
 * every rank when TANDEM_TRANSPORT=tcp) through TCP sockets.
 *
 * Threading: a communicator may be used from one application thread at a time
 * (calls from several threads must be serialized by the caller). Each
 * communicator owns one progress thread that runs non-blocking operations in
 * the order they were issued; a blocking call issued while nothing is queued
 * runs directly on the caller's thread (lowest latency).
 *
 * Errors are sticky: once an operation fails (a peer died, ranks disagreed on
 * a collective, a timeout), every pending and later operation on that
 * communicator fails with the same status and message until it is destroyed.
 * The message names the ranks involved. Where a failed call's message goes
 * (td_last_error() of the calling thread, always; td_comm_last_error() of
 * the communicator it was given) is stated once, in tandem/base.h.
 *
 * Buffers: "count" is in elements of `dtype`. A buffer may be NULL only when
 * its count is 0. In-place operation is requested by passing the same pointer
 * as send and receive buffer (see each collective for the exact layout).
 * Buffers of a non-blocking operation must stay valid and untouched until
 * td_wait/td_test reports completion. */
#ifndef TANDEM_COMM_H
#define TANDEM_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include "base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct td_comm td_comm;
typedef struct td_request td_request;

/* Explicit configuration; zero-initialize and set what you need. Fields left
 * 0/NULL are taken from the environment (DESIGN.md §2). */
typedef struct td_comm_config {
  int rank;              /* this process's rank, 0-based (used when world_size > 0) */
  int world_size;        /* 0: detect from the environment */
  const char *store;     /* "host:port" of the rendezvous store; NULL: from the environment */
  const char *job_id;    /* namespace in the store; NULL: from TANDEM_JOB_ID or "default" */
  const char *transport; /* "auto" (NULL), "shm" or "tcp" */
  double timeout_s;      /* 0: TANDEM_TIMEOUT or 300 s; when set, also caps the
                          * start-up wait (TANDEM_CONNECT_TIMEOUT, default 60 s) */
  /* Optional (NULL: wait the whole TANDEM_CONNECT_TIMEOUT). Polled on the
   * constructing thread between slices (0.25 s) of the rendezvous waits for
   * the other ranks' store keys: returning true, with the reason in `why`,
   * makes the construction fail at once with TD_ERR_REMOTE. For a caller
   * that learns by other means that a rank will never come (the elastic
   * layer: a member died between its membership round and the rendezvous).
   * abandon_ctx is passed back and used only until the call returns. */
  bool (*abandon)(void *abandon_ctx, char *why, size_t why_size);
  void *abandon_ctx;
} td_comm_config;

/* Create the world communicator from the environment (TANDEM_* set by
 * tandemrun, then Open MPI, PMI, Slurm, torchrun variables); with none of
 * them it is a world of one. Blocks until every rank has joined or the
 * timeout passes. *out is NULL on failure; td_last_error() says why.
 *
 * What pairs the communicators of different ranks is the job id
 * (td_comm_config.job_id, else TANDEM_JOB_ID, else the launcher's) and, for
 * several communicators with the same job id in one process, their order:
 * the k-th created with a job id on one rank joins the k-th created with it
 * on the others. So communicators with distinct job ids may be created from
 * any threads, concurrently, and in a different order on every rank; those
 * sharing a job id (td_comm_init again after td_comm_destroy) must be
 * created in the same order on every rank, as MPI_Comm_dup requires, and
 * never concurrently by several threads of a rank (give each its own job
 * id). Thread-safe. */
td_status td_comm_init(td_comm **out);
td_status td_comm_init_config(const td_comm_config *config, td_comm **out);

int td_comm_rank(const td_comm *comm);
int td_comm_size(const td_comm *comm);
/* The rank in the communicator of td_comm_init that `rank` of comm was
 * split from (transitively; itself for such a communicator), -1 for a rank
 * out of range. Messages about a peer of a split communicator name it too
 * ("rank 1 (world rank 5)"). Any thread. */
int td_comm_world_rank(const td_comm *comm, int rank);
int td_comm_local_rank(const td_comm *comm); /* rank among the ranks on this host */
int td_comm_local_size(const td_comm *comm); /* number of ranks of comm on this host */
/* Ranks of the whole job on this host: td_comm_local_size of the
 * communicator comm was split from (transitively). What shares this host's
 * memory and cores: a tensor- or data-parallel group of a 3D layout counts
 * every process of the host, not only its own members. */
int td_comm_host_size(const td_comm *comm);
const char *td_comm_transport(const td_comm *comm); /* "self", "shm" or "tcp" */
/* The peers whose silence made this rank fail the communicator (no
 * heartbeat nor data for TANDEM_HEARTBEAT_TIMEOUT: stopped, cut off, or on
 * a dead host): up to max of them into ranks, ascending; returns how many
 * there are. 0 when it did not fail that way on this rank (a peer's report,
 * a closed connection) or the transport has no heartbeats (shm, a world of
 * one). Elastic training uses it to go on without them at once. Any thread. */
int td_comm_silent_ranks(const td_comm *comm, int *ranks, int max);
/* The host identity of `rank` (ranks with equal identities share memory);
 * "" for a rank out of range. Valid while comm lives. */
const char *td_comm_host(const td_comm *comm, int rank);

/* Collective over `comm`: ranks with the same `color` form a new
 * communicator, ordered by (key, old rank). A negative color gives *out = NULL
 * (the rank joins no group). */
td_status td_comm_split(td_comm *comm, int color, int key, td_comm **out);

/* Unexpected point-to-point messages (shm; docs/collectives.md): let comm's
 * progress thread take up to max_bytes of send frames of at most
 * max_frame_bytes each, from peers whose send stalled on a full FIFO,
 * before this rank posts their receives, so that those sends complete while
 * this rank computes (MPI's unexpected messages). The buffers, at most
 * max_bytes in all, are kept for reuse: count max_bytes in the memory this
 * rank needs. 0 (the default of every communicator, and of those
 * td_comm_split makes) takes none. TANDEM_P2P_UNEXPECTED_BYTES, when set,
 * overrides both on every communicator. Any thread; accepts NULL. The
 * pipeline engine sets it on its communicator (docs/training.md). */
void td_comm_hold_unexpected(td_comm *comm, size_t max_bytes, size_t max_frame_bytes);
/* The most bytes comm would hold under td_comm_hold_unexpected(comm,
 * max_bytes, ...), for a memory estimate: 0 where its transport takes no
 * unexpected frames (tcp, a world of one), TANDEM_P2P_UNEXPECTED_BYTES
 * when set, else max_bytes. */
size_t td_comm_unexpected_limit(const td_comm *comm, size_t max_bytes);

/* Wait for every pending operation, then synchronize with all ranks so that
 * none leaves while others still need it. Returns the first error seen. */
td_status td_comm_finalize(td_comm *comm);

/* Release everything (threads, sockets, shared memory). Accepts NULL. Does not
 * communicate: call td_comm_finalize first for an orderly exit. */
void td_comm_destroy(td_comm *comm);

/* Break the communicator on purpose: pending and later operations here fail
 * with TD_ERR_REMOTE, and peers are told so (with `reason`) within seconds. */
void td_comm_abort(td_comm *comm, const char *reason);

/* The message of the sticky error once comm is broken, before that of the
 * latest failed call on comm, "" if none (the rule in tandem/base.h). Any
 * thread may call it; the string stays valid until this thread calls it
 * again or comm is destroyed. */
const char *td_comm_last_error(const td_comm *comm);
/* TD_OK, or the sticky error status of the communicator. */
td_status td_comm_status(const td_comm *comm);

/* What the host-buffer operations on comm moved and took on this rank, one
 * row per (operation, algorithm) pair that ran, for metrics (Prometheus) and
 * benchmarks. bytes is each call's data size as nccl-tests counts it (the
 * whole buffer: count elements; alltoall count x size); seconds is the time
 * this rank spent executing them, waiting for slower peers included;
 * bus_bytes is bytes times the operation's bus factor (allreduce
 * 2(n-1)/n; reduce_scatter, allgather, alltoall (n-1)/n; broadcast,
 * reduce, send, recv 1; barrier 0), so that bus_bytes / seconds is
 * nccl-tests' bus bandwidth, comparable across world sizes. A world of one
 * moves nothing and keeps no rows; device-buffer collectives are not
 * counted. Copies up to max_rows rows and returns how many there are. */
typedef struct td_coll_stats {
  const char *operation; /* "allreduce", "reduce_scatter", ..., "send", "recv" */
  const char *algorithm; /* "ring", "rd" (recursive doubling), "shm", "tree", "pairwise", "dissemination", "p2p" */
  uint64_t calls;
  uint64_t bytes;
  double seconds;
  double bus_bytes;
} td_coll_stats;
int td_comm_collective_stats(const td_comm *comm, td_coll_stats *rows, int max_rows);

/* What this rank's heartbeats measured of each peer, for metrics
 * (Prometheus) and for judging a link: one row per peer the transport sends
 * beats to (the TCP transport with heartbeats on; none over shm, in a world
 * of one, or with TANDEM_HEARTBEAT_TIMEOUT=0). Each beat echoes the send
 * time of the last beat its sender took from its destination and how long
 * it held it (RTCP's LSR/DLSR), so a round trip is measured from every
 * beat that comes back, with no extra packet, and neither host's clock
 * needs to agree with the other's. rtt_s is the last round trip,
 * rtt_smoothed_s TCP's smoothed estimate of them (RFC 6298, gain 1/8), both
 * 0 until rtt_samples > 0. A round trip counts the network both ways and
 * how late each side's watcher thread sent its beat (on a loaded host, its
 * scheduling delay), not the time a beat waited for the next tick. beats:
 * beats taken from the peer; missed: beats the peer sent that never
 * arrived or came late (gaps in its sequence), so missed / (beats + missed)
 * is the loss rate of the peer-to-this-rank direction. Counts since the
 * communicator was created. Copies up to max_rows rows, returns how many
 * there are. Any thread. */
typedef struct td_heartbeat_stats {
  int peer; /* rank in comm */
  uint64_t beats, missed, rtt_samples;
  double rtt_s, rtt_smoothed_s, rtt_min_s;
} td_heartbeat_stats;
int td_comm_heartbeat_stats(const td_comm *comm, td_heartbeat_stats *rows, int max_rows);

/* ---- Blocking collectives ----
 * allreduce:      recv[i] = op over ranks of send[i], i < count. In place: send == recv.
 * reduce:         as allreduce, result only at root (recv ignored elsewhere; may be NULL).
 * broadcast:      buf of root copied to every rank.
 * reduce_scatter: send holds `count` elements on every rank; rank r receives the
 *                 reduced shard td_shard_range(count, size, r) into recv. In place:
 *                 recv == send + offset_r (elements).
 * allgather:      rank r contributes the shard td_shard_range(count, size, r) from
 *                 send; recv receives all `count` elements. In place:
 *                 send == recv + offset_r (elements).
 * alltoall:       send holds size blocks of `count` elements; block j goes to rank j,
 *                 which stores it as block r (the sender's rank) of recv. Not in place.
 * send/recv:      point to point, matched in issue order per pair of ranks; count and
 *                 dtype must agree on both sides. */
td_status td_allreduce(const void *send, void *recv, size_t count, td_dtype dtype, td_op op, td_comm *comm);
td_status td_reduce(const void *send, void *recv, size_t count, td_dtype dtype, td_op op, int root, td_comm *comm);
td_status td_broadcast(void *buf, size_t count, td_dtype dtype, int root, td_comm *comm);
td_status td_reduce_scatter(const void *send, void *recv, size_t count, td_dtype dtype, td_op op, td_comm *comm);
td_status td_allgather(const void *send, void *recv, size_t count, td_dtype dtype, td_comm *comm);
td_status td_alltoall(const void *send, void *recv, size_t count, td_dtype dtype, td_comm *comm);
td_status td_barrier(td_comm *comm);
td_status td_send(const void *buf, size_t count, td_dtype dtype, int peer, td_comm *comm);
td_status td_recv(void *buf, size_t count, td_dtype dtype, int peer, td_comm *comm);

/* ---- Non-blocking forms ----
 * Same arguments plus *req_out, which receives a request to pass to td_wait or
 * td_test exactly once to completion. Operations run in issue order on the
 * communicator's progress thread. On a returned error *req_out is NULL. */
td_status td_iallreduce(const void *send, void *recv, size_t count, td_dtype dtype, td_op op, td_comm *comm, td_request **req_out);
td_status td_ireduce(const void *send, void *recv, size_t count, td_dtype dtype, td_op op, int root, td_comm *comm, td_request **req_out);
td_status td_ibroadcast(void *buf, size_t count, td_dtype dtype, int root, td_comm *comm, td_request **req_out);
td_status td_ireduce_scatter(const void *send, void *recv, size_t count, td_dtype dtype, td_op op, td_comm *comm, td_request **req_out);
td_status td_iallgather(const void *send, void *recv, size_t count, td_dtype dtype, td_comm *comm, td_request **req_out);
td_status td_ialltoall(const void *send, void *recv, size_t count, td_dtype dtype, td_comm *comm, td_request **req_out);
td_status td_ibarrier(td_comm *comm, td_request **req_out);
td_status td_isend(const void *buf, size_t count, td_dtype dtype, int peer, td_comm *comm, td_request **req_out);
td_status td_irecv(void *buf, size_t count, td_dtype dtype, int peer, td_comm *comm, td_request **req_out);

/* Block until the request completes (spins briefly, then sleeps), free it, and
 * return its status. A NULL request is TD_OK. */
td_status td_wait(td_request *req);
/* Non-blocking check. If complete: *done = 1, the request is freed, its status
 * returned. Otherwise *done = 0 and TD_ERR_IN_PROGRESS is returned. */
td_status td_test(td_request *req, int *done);

/* ---- Host-shared buffers (like ncclMemAlloc or MPI_Alloc_mem) ----
 * Memory that the other ranks on this host can map. A large collective
 * whose buffers lie inside such memory on every rank skips the staging
 * copies through the transport: each rank reads and writes its share of the
 * others' buffers directly (allreduce over shm is about 2-3x faster at 64 MiB
 * than with malloc'd buffers). Any buffer still works with every collective;
 * this is only faster. The memory is zeroed and page-aligned, counts against
 * shared memory (tmpfs, memory cgroup), and stays mapped in peers that used it
 * until their communicator is destroyed. Thread-safe.
 * td_mem_alloc: *out is NULL on failure (td_last_error() says why).
 * td_mem_free: accepts NULL; p must come from td_mem_alloc. */
td_status td_mem_alloc(size_t bytes, void **out);
void td_mem_free(void *p);
/* The smallest collective, in bytes of the whole vector, that comm runs
 * directly on the ranks' host-shared buffers (each rank then maps the
 * pages of its peers' buffers that it reads or writes, and its RSS counts
 * them although they exist once on the host); 0 when comm never does (not
 * the shm transport, or TANDEM_SHM_XMAP=0). The allreduce also needs each
 * rank's slice to be at least a page. For memory estimates (issue 23).
 * Any thread. */
size_t td_comm_direct_min_bytes(const td_comm *comm);

/* What a rank runs on a communicator, for td_comm_staging_bytes: the
 * largest message of each collective, in bytes of the whole vector of
 * 4-byte elements (f32 or i32, what the trainer's and the models'
 * collectives carry; 0: none of that kind), and the peers (ranks of the
 * communicator) it sends to and receives from point to point. device: the
 * largest collective on device buffers, in bytes (a device model's tensor
 * group); its host side is in the collectives above too. */
typedef struct td_comm_traffic {
  size_t allreduce, allgather, reduce_scatter, broadcast;
  const int *send_peers, *recv_peers;
  int n_send_peers, n_recv_peers;
  size_t device;
} td_comm_traffic;

/* Bytes of comm's staging memory that this rank's RSS counts once it has
 * run `traffic` (collectives of up to those sizes on buffers that are not
 * host-shared, and point-to-point messages): over the shm transport, the
 * pages of the segment's collective slots it writes or reads, its own and
 * its peers' (a page of the shared segment counts in the RSS of every
 * process that touched it), as each algorithm stages a message of that
 * size (its form, chunk and slot sizes, either slot parity), and the
 * point-to-point FIFOs it uses, each reserved whole at its first use;
 * collectives that go point to point over shm (TANDEM_ALLREDUCE_ALGO=ring
 * or rd, TANDEM_SHM_COLLECTIVES=0) count the FIFOs to and from every peer.
 * *peers (may be NULL): of it, the pages that are physically the peers'
 * (their slots, the FIFOs they write into), so that a host's sum counts
 * each page once. 0 over other transports (TCP's scratch is the process's
 * heap, freed after each call). With traffic->device, plus the host
 * buffers the staged device collectives copy through (2 sets of an in and
 * an out buffer of up to one chunk, TANDEM_DEVICE_CHUNK_BYTES), this
 * rank's own, over any transport; counted as if staged (under NCCL an
 * upper bound: its buffers are its own). For memory estimates (issue 23):
 * the reservation of the whole segment is not what a rank touches. Any
 * thread. */
size_t td_comm_staging_bytes(const td_comm *comm, const td_comm_traffic *traffic, size_t *peers);

#ifdef __cplusplus
}
#endif
#endif
