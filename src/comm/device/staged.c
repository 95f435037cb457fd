/* The staged path for collectives on device buffers: every placement that
 * NCCL cannot serve (several ranks sharing one GPU, no NCCL, a CPU build
 * with TANDEM_STAGE_HOST_BUFFERS=1) runs here.
 *
 * Steps, per chunk k of the operation (chunks are cut so that each one is
 * itself a collective of the same kind on packed host buffers):
 *
 *   device send --D2H (stream in)--> host in[k%2] --host algorithm--> host out[k%2]
 *        --H2D (stream out)--> device recv
 *
 * and the chunks are pipelined over two buffer sets, so that while the host
 * algorithm (select.c, shm or TCP) reduces chunk k, chunk k+1 is copied
 * down and chunk k-1 copied up:
 *
 *   stream in    D2H0  D2H1        D2H2        D2H3
 *   host               red0        red1        red2        red3
 *   stream out               H2D0        H2D1        H2D2        H2D3
 *
 * Ordering rules that make reuse of a set safe: the D2H of chunk k is waited
 * for (event) before its reduction; the reduction of chunk k writes out[s]
 * only after the H2D of chunk k-2 (same set) finished reading it (event);
 * in[s] is rewritten by the D2H of chunk k+2 only after the reduction of
 * chunk k returned (the host loop issues it later). Where in and out are
 * one buffer (broadcast), the D2H of chunk k also waits for the H2D of
 * chunk k-2.
 *
 * How each kind is cut (e = chunk elements; n ranks; offsets in elements):
 *   allreduce, reduce, broadcast: [k e, (k+1) e) of the vector.
 *   reduce-scatter, allgather: piece k of every rank's shard
 *     (td_shard_range): rank j's elements [k e, (k+1) e) of its shard, the
 *     last piece holding the rest. Packed rank after rank, the pieces of
 *     chunk k are exactly the td_shard_range shards of their sum, so the
 *     host reduce-scatter/allgather of that sum does the right thing.
 *   alltoall: elements [k e, (k+1) e) of every block.
 * The number of chunks (staged_chunks) depends only on kind, count, dtype,
 * ranks and TANDEM_DEVICE_CHUNK_BYTES, so every rank cuts alike; chunk k
 * runs with sequence number op->seq + k (device_coll_seq_span).
 *
 * Cost: 2 copies of each byte over PCIe/NVLink-C2C plus the host
 * algorithm; with the copies overlapped, a large operation runs at the
 * speed of the slowest of the three (bench: tandem-bench --stage-host).
 * Memory: 2 sets x 2 pinned buffers of about TANDEM_DEVICE_CHUNK_BYTES,
 * kept and grown between operations (pinned allocation is slow). */
#include "comm/device/device_coll.h"

#include <string.h>

#define N_SETS STAGED_SETS

struct staged_state {
  td_device dev;
  td_stream *in, *out;
  td_event *in_done[N_SETS], *out_done[N_SETS];
  bool out_pending[N_SETS]; /* an H2D from this set was issued and not yet waited for */
  void *host_in[N_SETS], *host_out[N_SETS];
  size_t host_bytes; /* of each host buffer */
  bool shared_in[N_SETS], shared_out[N_SETS]; /* which come from td_mem_alloc (host_alloc) */
};

/* A staging buffer. Ranks that share this host over the shm transport get
 * host-shared memory (td_mem_alloc), so that the host algorithm on a chunk
 * reads and writes the peers' staging buffers directly (*_shm_direct)
 * instead of copying through the segment's slots: a 4 MiB allreduce on 2
 * ranks ran at 6.4 GB/s busbw with td_mem_alloc buffers against 0.9 GB/s
 * with malloc'd ones (tandem-bench -R 1/-R 0, 2-core VM, 2026-11-27). It is
 * then page-locked for the device's DMA (td_host_register). Otherwise (TCP,
 * or a failure) pinned memory from td_host_alloc_pinned. */
static void *host_alloc(td_comm *comm, size_t bytes, bool *shared) {
  void *p = NULL;
  if (*shared) {
    if (td_mem_alloc(bytes, &p) == TD_OK) {
      if (td_host_register(p, bytes) == TD_OK) return p;
      td_mem_free(p);
    }
    TD_DEBUG("rank %d: staged device collectives: pinned private buffers (%s)", comm->rank, td_last_error());
    *shared = false;
  }
  return td_host_alloc_pinned(bytes, &p) == TD_OK ? p : NULL;
}

static void host_free(void *p, bool shared) {
  if (!p) return;
  if (!shared) {
    td_host_free_pinned(p);
    return;
  }
  td_host_unregister(p);
  td_mem_free(p);
}

void staged_destroy(staged_state *st) {
  if (!st) return;
  /* Nothing may still read or write the pinned buffers. */
  if (st->in) (void)td_stream_sync(st->in);
  if (st->out) (void)td_stream_sync(st->out);
  for (int s = 0; s < N_SETS; s++) {
    td_event_destroy(st->in_done[s]);
    td_event_destroy(st->out_done[s]);
    host_free(st->host_in[s], st->shared_in[s]);
    host_free(st->host_out[s], st->shared_out[s]);
  }
  td_stream_destroy(st->in);
  td_stream_destroy(st->out);
  td_free(st);
}

td_status staged_create(td_device dev, staged_state **out) {
  *out = NULL;
  staged_state *st = td_alloc(sizeof *st);
  if (!st) return td_error(TD_ERR_SYSTEM, "staged device collectives: out of memory");
  memset(st, 0, sizeof *st);
  st->dev = dev;
  td_status rc = td_stream_create(dev, &st->in);
  if (rc == TD_OK) rc = td_stream_create(dev, &st->out);
  for (int s = 0; s < N_SETS && rc == TD_OK; s++) {
    rc = td_event_create(dev, &st->in_done[s]);
    if (rc == TD_OK) rc = td_event_create(dev, &st->out_done[s]);
  }
  if (rc != TD_OK) {
    staged_destroy(st);
    return rc;
  }
  *out = st;
  return TD_OK;
}

/* ---- how an operation is cut ---- */

typedef struct plan {
  comm_kind kind;
  size_t count, esize;
  int n, rank, root;
  size_t e;          /* elements per chunk (per rank piece / per block for the packed kinds) */
  uint64_t n_chunks;
  size_t base, rem;  /* reduce-scatter, allgather: count / n, count % n */
} plan;

static bool packed_kind(comm_kind kind) {
  return kind == COMM_REDUCE_SCATTER || kind == COMM_ALLGATHER || kind == COMM_ALLTOALL;
}

static plan plan_make(const comm_op *op, int n, int rank, size_t chunk_bytes) {
  plan p;
  memset(&p, 0, sizeof p);
  p.kind = op->kind;
  p.count = op->count;
  p.esize = td_dtype_size(op->dtype);
  p.n = n;
  p.rank = rank;
  p.root = op->root;
  size_t per = packed_kind(op->kind) ? p.esize * (size_t)n : p.esize;
  p.e = chunk_bytes / per ? chunk_bytes / per : 1;
  size_t span = p.count; /* elements cut into pieces of e */
  if (op->kind == COMM_REDUCE_SCATTER || op->kind == COMM_ALLGATHER) {
    p.base = p.count / (size_t)n;
    p.rem = p.count % (size_t)n;
    span = p.base;
  }
  p.n_chunks = span ? (span + p.e - 1) / p.e : 1;
  return p;
}

uint64_t staged_chunks(const comm_op *op, int size, size_t chunk_bytes) {
  return plan_make(op, size, 0, chunk_bytes).n_chunks;
}


/* Vector kinds: chunk k is [*off, *off + *len). */
static void vector_piece(const plan *p, uint64_t k, size_t *off, size_t *len) {
  *off = (size_t)k * p->e;
  *len = TD_MIN(p->e, p->count - *off);
}

/* Shard kinds: rank j's piece k, as an offset into the whole vector. */
static void shard_piece(const plan *p, uint64_t k, int j, size_t *off, size_t *len) {
  size_t shard_off = (size_t)j * p->base + TD_MIN((size_t)j, p->rem);
  size_t shard_len = p->base + ((size_t)j < p->rem);
  size_t start = (size_t)k * p->e;
  *off = shard_off + start;
  *len = k + 1 < p->n_chunks ? p->e : shard_len - start;
}

/* Alltoall: the elements of chunk k in each block. */
static void block_piece(const plan *p, uint64_t k, size_t *off, size_t *len) {
  *off = (size_t)k * p->e;
  *len = TD_MIN(p->e, p->count - *off);
}

/* Largest packed chunk in elements, for the host buffers: the last piece of
 * a shard holds at most e + 1 elements (base a multiple of e, plus the
 * remainder's one). */
static size_t plan_max_elems(const plan *p) {
  if (p->kind == COMM_ALLTOALL) return p->e * (size_t)p->n;
  if (packed_kind(p->kind)) return (p->e + 1) * (size_t)p->n;
  return p->e;
}

/* ---- copies ---- */

static td_status copy(td_comm *comm, void *dst, const void *src, size_t bytes, td_stream *s, const char *what) {
  if (!bytes) return TD_OK;
  td_status st = td_copy_async(dst, src, bytes, s);
  if (st != TD_OK)
    return comm_fail(comm, st, "rank %d: staged device collective: copying %zu bytes %s failed: %s", comm->rank,
                     bytes, what, td_last_error());
  return TD_OK;
}

/* Issue the device -> host copies of chunk k into in (async on st->in).
 * Returns the element count of the chunk's host collective. */
static td_status stage_in(td_comm *comm, staged_state *st, const plan *p, const comm_op *op, uint64_t k, char *in,
                          size_t *sub_count) {
  const char *send = op->send;
  size_t es = p->esize, off, len;
  switch (p->kind) {
  case COMM_ALLREDUCE:
  case COMM_REDUCE:
  case COMM_BROADCAST:
    vector_piece(p, k, &off, &len);
    *sub_count = len;
    if (p->kind == COMM_BROADCAST && p->rank != p->root) return TD_OK; /* nothing to send */
    return copy(comm, in, send + off * es, len * es, st->in, "device to host");
  case COMM_REDUCE_SCATTER: {
    size_t packed = 0;
    for (int j = 0; j < p->n; j++) {
      shard_piece(p, k, j, &off, &len);
      TD_CHECK(copy(comm, in + packed * es, send + off * es, len * es, st->in, "device to host"));
      packed += len;
    }
    *sub_count = packed;
    return TD_OK;
  }
  case COMM_ALLGATHER: {
    size_t total = 0, mine_len = 0;
    for (int j = 0; j < p->n; j++) {
      shard_piece(p, k, j, &off, &len);
      total += len;
      if (j == p->rank) mine_len = len;
    }
    *sub_count = total;
    /* send holds only this rank's shard: piece k starts k e into it */
    return copy(comm, in, send + (size_t)k * p->e * es, mine_len * es, st->in, "device to host");
  }
  case COMM_ALLTOALL:
    block_piece(p, k, &off, &len);
    *sub_count = len;
    for (int j = 0; j < p->n; j++)
      TD_CHECK(copy(comm, in + (size_t)j * len * es, send + ((size_t)j * p->count + off) * es, len * es, st->in,
                    "device to host"));
    return TD_OK;
  default:
    return comm_fail(comm, TD_ERR_INTERNAL, "staged device collective: %s cannot be staged",
                     comm_kind_name(p->kind));
  }
}

/* Issue the host -> device copies of chunk k from out (async on st->out). */
static td_status stage_out(td_comm *comm, staged_state *st, const plan *p, const comm_op *op, uint64_t k,
                           const char *out) {
  char *recv = op->recv;
  size_t es = p->esize, off, len;
  switch (p->kind) {
  case COMM_ALLREDUCE:
  case COMM_REDUCE:
  case COMM_BROADCAST:
    if (p->kind == COMM_REDUCE && p->rank != p->root) return TD_OK;
    if (p->kind == COMM_BROADCAST && p->rank == p->root) return TD_OK; /* its buffer is the source */
    vector_piece(p, k, &off, &len);
    return copy(comm, recv + off * es, out, len * es, st->out, "host to device");
  case COMM_REDUCE_SCATTER:
    shard_piece(p, k, p->rank, &off, &len);
    return copy(comm, recv + (size_t)k * p->e * es, out, len * es, st->out, "host to device");
  case COMM_ALLGATHER: {
    size_t packed = 0;
    for (int j = 0; j < p->n; j++) {
      shard_piece(p, k, j, &off, &len);
      TD_CHECK(copy(comm, recv + off * es, out + packed * es, len * es, st->out, "host to device"));
      packed += len;
    }
    return TD_OK;
  }
  case COMM_ALLTOALL:
    block_piece(p, k, &off, &len);
    for (int j = 0; j < p->n; j++)
      TD_CHECK(copy(comm, recv + ((size_t)j * p->count + off) * es, out + (size_t)j * len * es, len * es, st->out,
                    "host to device"));
    return TD_OK;
  default:
    return comm_fail(comm, TD_ERR_INTERNAL, "staged device collective: %s cannot be staged",
                     comm_kind_name(p->kind));
  }
}

static td_status ensure_host(td_comm *comm, staged_state *st, size_t bytes) {
  if (bytes <= st->host_bytes) return TD_OK;
  for (int s = 0; s < N_SETS; s++) {
    host_free(st->host_in[s], st->shared_in[s]);
    host_free(st->host_out[s], st->shared_out[s]);
    st->host_in[s] = st->host_out[s] = NULL;
  }
  st->host_bytes = 0;
  /* Any mix is correct: the host algorithms take the direct path only when
   * every rank's buffers of an operation are host-shared. */
  bool want_shared = comm->size > 1 && comm->xport_name && !strcmp(comm->xport_name, "shm");
  for (int s = 0; s < N_SETS; s++) {
    st->shared_in[s] = st->shared_out[s] = want_shared;
    st->host_in[s] = host_alloc(comm, bytes, &st->shared_in[s]);
    st->host_out[s] = host_alloc(comm, bytes, &st->shared_out[s]);
    if (!st->host_in[s] || !st->host_out[s])
      return comm_fail(comm, TD_ERR_SYSTEM, "rank %d: staged device collective: pinned host memory of 4 x %zu bytes: "
                                            "%s (lower TANDEM_DEVICE_CHUNK_BYTES)",
                       comm->rank, bytes, td_last_error());
  }
  st->host_bytes = bytes;
  return TD_OK;
}

static td_status record(td_comm *comm, td_event *ev, td_stream *s) {
  td_status st = td_event_record(ev, s);
  if (st != TD_OK)
    return comm_fail(comm, st, "rank %d: staged device collective: recording an event failed: %s", comm->rank,
                     td_last_error());
  return TD_OK;
}

static td_status wait_event(td_comm *comm, td_event *ev, const char *what) {
  td_status st = td_event_sync(ev);
  if (st != TD_OK)
    return comm_fail(comm, st, "rank %d: staged device collective: waiting for the %s copies failed: %s", comm->rank,
                     what, td_last_error());
  return TD_OK;
}

td_status staged_execute(td_comm *comm, staged_state *st, const comm_op *op) {
  size_t chunk_bytes = comm_tun_bytes(comm->tun.device_chunk_bytes, DEVICE_CHUNK_BYTES_DEFAULT);
  plan p = plan_make(op, comm->size, comm->rank, chunk_bytes);
  TD_CHECK(ensure_host(comm, st, plan_max_elems(&p) * p.esize));
  /* Broadcast reduces nothing: the host collective runs in place in one
   * buffer, which the next-but-one D2H rewrites (see the ordering rules). */
  bool one_buffer = p.kind == COMM_BROADCAST;
  size_t sub_counts[N_SETS] = {0};
  for (int s = 0; s < N_SETS; s++) st->out_pending[s] = false;

  td_status rc = TD_OK;
  /* chunk 0 down */
  rc = stage_in(comm, st, &p, op, 0, st->host_in[0], &sub_counts[0]);
  if (rc == TD_OK) rc = record(comm, st->in_done[0], st->in);
  for (uint64_t k = 0; k < p.n_chunks && rc == TD_OK; k++) {
    int s = (int)(k % N_SETS);
    if (k + 1 < p.n_chunks) { /* next chunk down while this one is reduced */
      int s1 = (int)((k + 1) % N_SETS);
      if (one_buffer && st->out_pending[s1]) {
        if ((rc = wait_event(comm, st->out_done[s1], "host to device")) != TD_OK) break;
        st->out_pending[s1] = false;
      }
      rc = stage_in(comm, st, &p, op, k + 1, st->host_in[s1], &sub_counts[s1]);
      if (rc == TD_OK) rc = record(comm, st->in_done[s1], st->in);
      if (rc != TD_OK) break;
    }
    if ((rc = wait_event(comm, st->in_done[s], "device to host")) != TD_OK) break;
    if (st->out_pending[s]) {
      if ((rc = wait_event(comm, st->out_done[s], "host to device")) != TD_OK) break;
      st->out_pending[s] = false;
    }
    comm_op sub = *op;
    sub.on_device = false;
    sub.seq = op->seq + k;
    sub.count = sub_counts[s];
    sub.send = st->host_in[s];
    sub.recv = one_buffer ? st->host_in[s] : st->host_out[s];
    if ((rc = comm_execute(comm, &sub)) != TD_OK) break;
    comm_hdr_fill(&comm->last_coll, &sub, comm->rank, 0); /* for p2p's leftover-frame diagnosis */
    if ((rc = stage_out(comm, st, &p, op, k, sub.recv)) != TD_OK) break;
    if ((rc = record(comm, st->out_done[s], st->out)) != TD_OK) break;
    st->out_pending[s] = true;
  }
  /* Whatever happened, no copy may still be running when the caller gets
   * its buffers back (or frees them after an error). */
  td_status in_rc = td_stream_sync(st->in), out_rc = td_stream_sync(st->out);
  if (rc == TD_OK && (in_rc != TD_OK || out_rc != TD_OK))
    rc = comm_fail(comm, in_rc != TD_OK ? in_rc : out_rc,
                   "rank %d: staged device collective: a copy failed: %s", comm->rank, td_last_error());
  return rc;
}
