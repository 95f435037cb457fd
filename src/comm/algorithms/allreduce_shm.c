/* Allreduce over the shared-memory segment: every local rank reduces its own
 * slice in parallel (DESIGN.md §3), so that the work is split n ways and the
 * data crosses memory about as few times as it can.
 *
 * More than SHM_TREE_FANIN ranks with under a page per rank's slice (not
 * f16/bf16): the reduction tree of allreduce_shm_tree.c, which keeps the
 * pages each rank maps O(1) instead of O(n).
 *
 * Small messages (n x bytes <= SHM_ALLREDUCE_SMALL_TOTAL, one slot), one sync:
 *
 *     rank r: send ──copy──> slot[r]      ─┐
 *                         shm_sync         │ every rank reads every slot
 *     rank r: recv <──reduce── slot[0..n-1]┘ (same order on every rank,
 *                                              so results are bitwise equal)
 *
 * Large messages: a pipeline over chunks of shm_chunk_bytes(), sized so that
 * a chunk's slots stay in cache; two syncs per chunk (parity p = epoch % 2):
 *
 *     copy the other ranks' slices of my chunk into slot[me][p]
 *     sync                                       (all chunks in)
 *     reduce my 1/n slice: my send slice and slot[j != me][p]
 *            into recv and the same slice of slot[me][p^1]
 *     sync                                       (all slices reduced)
 *     copy every other rank's reduced slice of slot[*][p^1] into recv, then
 *     the next chunk's copy-in, both before the next arrival.
 *
 * Cost per rank for B bytes: read B from send and write B to recv (the only
 * DRAM traffic when the slots stay in cache), plus about 2B·(n-1)/n + B/n
 * of cache-resident copies, and 2·B/chunk syncs. The reduce reads the own
 * slice from send and writes it to recv and the slot in one pass, so a rank
 * stages only what the others need and never copies its own result back
 * (64 MiB, 2 ranks, in place: 11.3 -> 10.0 ms here). Large outputs that are
 * not the input are written with streaming stores (no read-for-ownership).
 * When every rank's buffers are host-shared (td_mem_alloc), large messages
 * take allreduce_shm_direct.c, which needs none of the staging. (A
 * single-copy variant through process_vm_readv measured no faster than this
 * pipeline and was removed: the kernel copies page by page.)
 * TD_AVG: every path divides the sum itself, where it is computed and
 * before it is shared (select/select.c leaves this algorithm's results
 * alone): the pipeline and the direct path each divide their own 1/n slice
 * while it is in L1, the tree its root's result once, the single-sync form
 * its own small result. Each element is still the sum, computed once,
 * times td_reduce_scale's factor, so the bits are those a division of the
 * whole result afterwards gives, without that pass: a read and a write of
 * the whole buffer on every rank (403 MB for the 100M-parameter gradient of
 * bench/py_doors.py). */
#include "comm/algorithms/algorithms.h"
#include "comm/transport/shm/shm.h"

#include <string.h>

/* Up to this many bytes read per rank (message x ranks), the single-sync
 * reduction, where every rank reads all n inputs, beats the pipeline, where
 * each rank reduces 1/n of them (measured with 2 ranks: 256 KiB, 31 vs 34 us). */
#define SHM_ALLREDUCE_SMALL_TOTAL ((size_t)512 << 10)
/* Block of the fused reduce-and-copy of the own slice (fits in L1). */
#define SHM_FUSE_BLOCK_BYTES ((size_t)16 << 10)
/* Outputs at least this large are written with streaming stores. */
#define SHM_STREAM_MIN ((size_t)4 << 20)

static td_status allreduce_small(td_comm *comm, const comm_op *op, size_t bytes) {
  int n = comm->size;
  unsigned p = (unsigned)(shm_next_epoch(comm) & 1);
  if (bytes) memcpy(shm_slot(comm, comm->rank, p), op->send, bytes);
  TD_CHECK(shm_sync(comm, op));
  const void *srcs[n];
  for (int k = 0; k < n; k++) srcs[k] = shm_slot(comm, k, p);
  td_reduce_multi(op->recv, srcs, n, op->count, op->dtype, op->redop);
  if (op->redop == TD_AVG) td_reduce_scale(op->recv, op->count, op->dtype, n);
  return TD_OK;
}

/* Reduce this rank's slice into both recv and its result slot, block by
 * block so that the second write copies from L1: one pass over the inputs
 * instead of a reduce plus a later copy. Streaming outputs are reduced into
 * the slot and streamed to recv; others are reduced into recv (in place:
 * srcs[0] is that same memory, which td_reduce_multi allows). TD_AVG
 * divides each block in L1, before it is copied anywhere. */
static void reduce_own_slice(char *recv, char *slot, const void *const *srcs, int n, size_t count, const comm_op *op,
                             bool stream) {
  size_t es = td_dtype_size(op->dtype), block = SHM_FUSE_BLOCK_BYTES / es;
  const void *part[n];
  for (size_t at = 0; at < count; at += block) {
    size_t m = TD_MIN(block, count - at);
    for (int k = 0; k < n; k++) part[k] = (const char *)srcs[k] + at * es;
    char *dst = (stream ? slot : recv) + at * es;
    td_reduce_multi(dst, part, n, m, op->dtype, op->redop);
    if (op->redop == TD_AVG) td_reduce_scale(dst, m, op->dtype, n);
    if (stream)
      shm_copy(recv + at * es, dst, m * es, true);
    else
      memcpy(slot + at * es, dst, m * es);
  }
}

static td_status allreduce_pipelined(td_comm *comm, const comm_op *op, size_t bytes) {
  int n = comm->size, me = comm->rank;
  size_t es = td_dtype_size(op->dtype);
  size_t chunk = TD_MAX(shm_chunk_bytes(comm) / es, (size_t)1);
  bool stream = op->send != op->recv && bytes >= SHM_STREAM_MIN;
  const char *send = op->send;
  char *recv = op->recv;
  const void *srcs[n];
  size_t off[n], len[n];
  for (size_t base = 0; base < op->count; base += chunk) {
    size_t m = TD_MIN(chunk, op->count - base);
    for (int k = 0; k < n; k++) td_shard_range(m, n, k, &off[k], &len[k]);
    unsigned p = (unsigned)(shm_next_epoch(comm) & 1);
    /* Stage only the slices the other ranks reduce; my own slice is read
     * straight from send below. */
    char *mine = shm_slot(comm, me, p);
    for (int k = 0; k < n; k++)
      if (k != me && len[k]) memcpy(mine + off[k] * es, send + (base + off[k]) * es, len[k] * es);
    TD_CHECK(shm_sync(comm, op));
    srcs[0] = send + (base + off[me]) * es;
    for (int k = 0, j = 1; k < n; k++)
      if (k != me) srcs[j++] = (const char *)shm_slot(comm, k, p) + off[me] * es;
    reduce_own_slice(recv + (base + off[me]) * es, (char *)shm_slot(comm, me, p ^ 1) + off[me] * es, srcs, n,
                     len[me], op, stream);
    TD_CHECK(shm_sync(comm, op));
    for (int k = 0; k < n; k++)
      if (k != me && len[k])
        shm_copy(recv + (base + off[k]) * es, (const char *)shm_slot(comm, k, p ^ 1) + off[k] * es, len[k] * es,
                 stream);
  }
  return TD_OK;
}

/* Which form a message of `bytes` takes (the same on every rank). */
typedef enum { FORM_TREE, FORM_SMALL, FORM_LARGE } allreduce_form;

static allreduce_form form_of(const td_comm *comm, size_t bytes, td_dtype dtype) {
  size_t n = (size_t)comm->size;
  /* Many ranks, under a page per rank's slice: the flat forms below would
   * have every rank touch a page of every other rank's slot (n^2 first-touch
   * page faults in the job); the tree touches O(n). Not for f16/bf16, whose
   * partial sums must not be rounded per level (allreduce_shm_tree.c). */
  if (n > SHM_TREE_FANIN && bytes < n * SHM_PAGE_BYTES && bytes <= shm_slot_bytes(comm) && dtype != TD_F16 &&
      dtype != TD_BF16)
    return FORM_TREE;
  if (bytes * n <= SHM_ALLREDUCE_SMALL_TOTAL && bytes <= shm_slot_bytes(comm)) return FORM_SMALL;
  return FORM_LARGE;
}

td_status allreduce_shm(td_comm *comm, const comm_op *op) {
  size_t bytes = comm_op_bytes(op);
  if (shm_trivial(comm)) {
    comm_copy_if_needed(op->recv, op->send, bytes);
    return TD_OK;
  }
  TD_CHECK(shm_require(comm, "allreduce_shm"));
  size_t n = (size_t)comm->size;
  allreduce_form form = form_of(comm, bytes, op->dtype);
  if (form == FORM_TREE) return allreduce_shm_tree(comm, op);
  if (form == FORM_SMALL) return allreduce_small(comm, op, bytes);
  /* Direct access maps every peer's buffer once (cached): worth it for
   * large messages only, as for the other collectives (shm.h). */
  if (shm_xmap(comm) && bytes >= SHM_DIRECT_MIN_BYTES && bytes >= n * SHM_PAGE_BYTES) {
    /* One extra sync (a microsecond) decides, the same on every rank,
     * whether every buffer is host-shared; most of the time in a training
     * job they are (the gradient arena). */
    TD_CHECK(shm_sync_shared(comm, op, op->send, bytes, op->recv, bytes));
    if (shm_all_shared(comm, 0) && shm_all_shared(comm, 1)) return allreduce_shm_direct(comm, op);
  }
  return allreduce_pipelined(comm, op, bytes);
}

/* The reach of one form at `count` elements (algorithms.h): what the code
 * above writes and reads of each rank's slots. */
static void form_reach(const td_comm *comm, int me, allreduce_form form, size_t count, size_t es, size_t *reach) {
  int n = comm->size;
  size_t bytes = count * es;
  if (form == FORM_SMALL) { /* its own slot written, every slot read: the whole message */
    for (int k = 0; k < n; k++) reach[k] = TD_MAX(reach[k], bytes);
  } else if (form == FORM_TREE) { /* allreduce_shm_tree.c: its own slot, its children's at each level it leads, the root's */
    reach[me] = TD_MAX(reach[me], bytes);
    reach[0] = TD_MAX(reach[0], bytes);
    for (long span = 1; span < n && me % (span * SHM_TREE_FANIN) == 0; span *= SHM_TREE_FANIN)
      for (long c = me, k = 0; c < n && k < SHM_TREE_FANIN; c += span, k++) reach[c] = TD_MAX(reach[c], bytes);
  } else { /* allreduce_pipelined at its first (largest) chunk of m elements */
    size_t m = TD_MIN(TD_MAX(shm_chunk_bytes(comm) / es, (size_t)1), count), off, len, my_off, my_len;
    td_shard_range(m, n, me, &my_off, &my_len);
    for (int k = 0; k < n; k++) {
      td_shard_range(m, n, k, &off, &len);
      /* own slots: every slice (the others' staged, its own reduced); a peer's: its slice of my part (read to
       * reduce), its own reduced slice (copied out) */
      size_t end = k == me ? m * es : TD_MAX(my_off + my_len, off + len) * es;
      reach[k] = TD_MAX(reach[k], end);
    }
  }
}

void allreduce_shm_reach(const td_comm *comm, int me, size_t count, td_dtype dtype, size_t *reach) {
  size_t es = td_dtype_size(dtype), n = (size_t)comm->size;
  if (n < 2 || count == 0 || es == 0) return;
  allreduce_form form = form_of(comm, count * es, dtype);
  form_reach(comm, me, form, count, es, reach);
  if (form != FORM_LARGE) return;
  /* the largest message below it of the single-slot form (the tree, with many ranks) */
  size_t below = n > SHM_TREE_FANIN ? n * SHM_PAGE_BYTES - 1 : SHM_ALLREDUCE_SMALL_TOTAL / n;
  below = TD_MIN(below, shm_slot_bytes(comm)) / es;
  if (below > 0 && below < count) form_reach(comm, me, form_of(comm, below * es, dtype), below, es, reach);
}
