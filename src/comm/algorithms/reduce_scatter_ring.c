/* Ring reduce-scatter: rank r ends with segment r (td_shard_range) of the
 * reduction, the first half of the ring allreduce.
 *
 * In step s = 0..n-2, rank r sends the partial sum of segment r-1-s to its
 * right neighbour and receives the partial sum of segment r-2-s from its left
 * one, adding its own contribution; the segment received in the last step is
 * r itself, now complete, and goes straight into recv.
 *
 *   n = 3: segment 0's path        r1 (own) -> r2 (+own) -> r0 (+own = done)
 *
 * The user's send buffer is read-only, so partial sums live in one
 * segment-sized work buffer: chunk i of it is sent in step s and, once that
 * send has been handed to the transport, overwritten with chunk i of the
 * next partial sum. Chunks (TANDEM_RING_CHUNK_BYTES) arrive in a small
 * staging buffer that stays in cache; the next chunk streams into the
 * socket buffer while this one is folded.
 *
 * Cost: (n-1)/n * bytes sent and received per rank, n-1 latency steps.
 * Limits: f16/bf16 sums arrive as f32 partials (select/select.c) and round once,
 * or once per hop with TANDEM_HALF_PARTIALS=half; TD_AVG is summed (select/select.c
 * divides). In place: recv == send + offset_r (elements); segment r of send
 * is read only in the last step, as the rank's own contribution. */
#include "comm/algorithms/algorithms.h"
#include "comm/p2p/p2p.h"

td_status reduce_scatter_ring(td_comm *comm, const comm_op *op) {
  const int n = comm->size, r = comm->rank;
  const size_t esz = td_dtype_size(op->dtype);
  if (n == 1) {
    comm_copy_if_needed(op->recv, op->send, comm_op_bytes(op));
    return TD_OK;
  }
  const size_t chunk = ring_chunk_elems(comm, esz);
  const size_t max_segment = (op->count + (size_t)n - 1) / (size_t)n;
  char *partial = td_alloc(TD_MAX(max_segment, 1) * esz);
  char *stage = td_alloc(TD_MAX(TD_MIN(chunk, max_segment), 1) * esz);
  if (!partial || !stage) {
    td_free(partial);
    td_free(stage);
    return comm_fail(comm, TD_ERR_SYSTEM, "reduce_scatter_ring: out of memory for %zu bytes of work buffers",
                     max_segment * esz);
  }
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  td_status st = TD_OK;

  for (int s = 0; s < n - 1 && st == TD_OK; s++) {
    int send_seg = (r - 1 - s + 2 * n) % n, recv_seg = (r - 2 - s + 2 * n) % n;
    bool last = s == n - 2; /* recv_seg == r */
    size_t send_off, send_len, recv_off, recv_len;
    td_shard_range(op->count, n, send_seg, &send_off, &send_len);
    td_shard_range(op->count, n, recv_seg, &recv_off, &recv_len);
    /* Step 0 sends the rank's own contribution; later steps the partial sum. */
    const char *send_base = s == 0 ? elem_ptr(op->send, send_off, esz) : partial;
    size_t n_send = n_chunks(send_len, chunk), n_recv = n_chunks(recv_len, chunk);
    for (size_t i = 0; i < TD_MAX(n_send, n_recv); i++) {
      size_t sl = chunk_len(send_len, chunk, i), rl = chunk_len(recv_len, chunk, i);
      st = p2p_exchange(comm, op, i < n_send ? right : -1, sl ? elem_ptr(send_base, i * chunk, esz) : NULL,
                        sl * esz, i < n_recv ? left : -1, stage, rl * esz);
      if (st != TD_OK) break;
      if (rl == 0) continue;
      /* own contribution first, then the partial sum from the left */
      const void *srcs[2] = {elem_ptr(op->send, recv_off + i * chunk, esz), stage};
      char *dst = last ? elem_ptr(op->recv, i * chunk, esz) : elem_ptr(partial, i * chunk, esz);
      td_reduce_multi(dst, srcs, 2, rl, op->dtype, op->redop);
    }
  }
  td_free(partial);
  td_free(stage);
  return st;
}
