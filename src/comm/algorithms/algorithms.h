/* The collective algorithms, one file each (the file header states its
 * steps, cost and limits). Each runs one op on the executing thread,
 * blocking until done, on top of p2p/ (any transport) or transport/shm's
 * primitives (the *_shm algorithms: all ranks on one host). An algorithm
 * calls only those and core/: it never picks another algorithm through the
 * table (select/) and never reaches the communicator's lifecycle. All ranks
 * must run the same algorithm: select/ decides from values equal on every
 * rank (size, count, dtype, env). Tests may call any algorithm directly. */
#ifndef TD_COMM_ALGORITHMS_H
#define TD_COMM_ALGORITHMS_H

#include "comm/core/core.h"

typedef td_status (*comm_algo_fn)(td_comm *comm, const comm_op *op);

td_status allreduce_ring(td_comm *comm, const comm_op *op);      /* allreduce_ring.c: bandwidth, p2p */
td_status allreduce_rd(td_comm *comm, const comm_op *op);        /* allreduce_rd.c: recursive doubling, latency, p2p */
td_status allreduce_shm(td_comm *comm, const comm_op *op);       /* allreduce_shm.c: parallel reduction in shm */
td_status reduce_scatter_ring(td_comm *comm, const comm_op *op); /* reduce_scatter_ring.c */
td_status reduce_scatter_shm(td_comm *comm, const comm_op *op);  /* reduce_scatter_shm.c */
td_status allgather_ring(td_comm *comm, const comm_op *op);      /* allgather_ring.c */
td_status allgather_shm(td_comm *comm, const comm_op *op);       /* allgather_shm.c */
td_status broadcast_tree(td_comm *comm, const comm_op *op);      /* broadcast_tree.c: binomial tree, p2p */
td_status broadcast_shm(td_comm *comm, const comm_op *op);       /* broadcast_shm.c */
td_status reduce_tree(td_comm *comm, const comm_op *op);         /* reduce_tree.c: binomial tree, p2p */
td_status reduce_shm(td_comm *comm, const comm_op *op);          /* reduce_shm.c */
td_status alltoall_pairwise(td_comm *comm, const comm_op *op);   /* alltoall_pairwise.c */
td_status alltoall_shm(td_comm *comm, const comm_op *op);        /* alltoall_shm.c */
td_status barrier_dissemination(td_comm *comm, const comm_op *op); /* barrier_dissemination.c: p2p */
td_status barrier_shm(td_comm *comm, const comm_op *op);         /* barrier_shm.c */
td_status p2p_send_recv(td_comm *comm, const comm_op *op);       /* sendrecv.c: td_send / td_recv */

/* ---- chunked pipelines of the p2p algorithms ----
 * The rings cut each segment into chunks of TANDEM_RING_CHUNK_BYTES, the
 * trees into TANDEM_BCAST_CHUNK_BYTES, so that consecutive steps overlap.
 *
 * Default ring chunk, measured on loopback TCP with 2 ranks (64 MiB f32,
 * side by side): CPU per operation and rank 64 KiB 21 ms, 256 KiB 18-19 ms,
 * 1 MiB 24-28 ms, 4 MiB 28 ms. Past L2 size the staging buffer falls out of
 * cache and each chunk is read from memory twice; below it, per-frame costs
 * (headers, syscalls, wake-ups) take over. */
#define RING_DEFAULT_CHUNK_BYTES ((size_t)256 << 10)
/* Default tree chunk: large enough that per-frame costs vanish, small
 * enough that the tree levels overlap. */
#define BCAST_DEFAULT_CHUNK_BYTES ((size_t)512 << 10)

/* The ring chunk in elements of elem_size (at least one). */
static inline size_t ring_chunk_elems(const td_comm *comm, size_t elem_size) {
  size_t elems = comm_tun_bytes(comm->tun.ring_chunk_bytes, RING_DEFAULT_CHUNK_BYTES) / elem_size;
  return elems ? elems : 1;
}
/* Chunks of a segment of len elements: an empty segment is one empty chunk,
 * whose frame still carries the header that catches a count disagreement. */
static inline size_t n_chunks(size_t len, size_t chunk) { return len ? (len + chunk - 1) / chunk : 1; }
/* Elements in chunk i of a segment of len (0 past its end). */
static inline size_t chunk_len(size_t len, size_t chunk, size_t i) {
  size_t begin = i * chunk;
  return begin >= len ? 0 : TD_MIN(chunk, len - begin);
}
/* base + elems elements, keeping NULL (a count-0 buffer) NULL. */
static inline char *elem_ptr(const void *base, size_t elems, size_t elem_size) {
  return base ? (char *)base + elems * elem_size : NULL;
}

/* ---- variants the *_shm entry points choose between ----
 * The direct algorithms on host-shared buffers, each called right after
 * shm_sync_shared found the buffers it reads shared (see each file):
 * allreduce: every rank's send and recv; reduce_scatter, allgather and
 * alltoall: every rank's send; broadcast: the root's send. */
td_status allreduce_shm_direct(td_comm *comm, const comm_op *op);
td_status reduce_scatter_shm_direct(td_comm *comm, const comm_op *op);
td_status allgather_shm_direct(td_comm *comm, const comm_op *op);
td_status alltoall_shm_direct(td_comm *comm, const comm_op *op);
td_status broadcast_shm_direct(td_comm *comm, const comm_op *op, const char *src, char *buf);
/* Collectives of at least this many bytes (the full vector) try the direct
 * algorithms: below it the single-sync staged forms are as fast. */
#define SHM_DIRECT_MIN_BYTES ((size_t)256 << 10)
/* ... and only when each rank's slice is at least a page: below that, each
 * peer buffer mapped (and each page of it touched for the first time) would
 * carry less than a page of data, n of them per rank. */
#define SHM_PAGE_BYTES ((size_t)4096)

/* allreduce_shm_tree.c: small messages among many ranks through a
 * reduction tree of this fan-in, which maps O(n) pages in the job instead
 * of O(n^2) (see there). allreduce_shm.c takes it above SHM_TREE_FANIN
 * ranks when each rank's slice of the message is under a page. */
#define SHM_TREE_FANIN 16
td_status allreduce_shm_tree(td_comm *comm, const comm_op *op);

/* ---- what the *_shm algorithms stage (td_comm_staging_bytes, mem.c) ----
 * For a collective of up to `count` elements of `dtype` on buffers that are
 * not host-shared: raise reach[k] (k: each rank of comm) to how far into
 * rank k's slots, in bytes from a slot's start, rank `me` writes or reads
 * (reach[me]: how far it writes its own). Either parity: which one a
 * collective starts on depends on what ran before it. Each follows its
 * algorithm's own forms and piece sizes, at the largest message of each
 * form up to count (a smaller message of another form may reach further:
 * a single-slot message against a chunked one). */
void allreduce_shm_reach(const td_comm *comm, int me, size_t count, td_dtype dtype, size_t *reach);
void allgather_shm_reach(const td_comm *comm, int me, size_t count, td_dtype dtype, size_t *reach);
void reduce_scatter_shm_reach(const td_comm *comm, int me, size_t count, td_dtype dtype, size_t *reach);
/* Any root. */
void broadcast_shm_reach(const td_comm *comm, int me, size_t count, td_dtype dtype, size_t *reach);

#endif
