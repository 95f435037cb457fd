/* Ring allgather: every rank ends with all n shards (td_shard_range; shards
 * may differ in size by one element), the second half of the ring
 * allreduce.
 *
 * Rank r first places its own shard at its offset in recv; in step
 * s = 0..n-2 it sends shard r-s to its right neighbour and receives shard
 * r-s-1 from its left one, straight into place, and forwards it next step.
 *
 *   n = 3   step 0: r0 sends A -> r1, r1 sends B -> r2, r2 sends C -> r0
 *           step 1: r0 sends C -> r1, r1 sends A -> r2, r2 sends B -> r0
 *
 * Shards move in chunks of TANDEM_RING_CHUNK_BYTES, so a chunk is forwarded
 * in the next step while later chunks of the step are still in flight in
 * the socket buffers.
 *
 * Cost: (n-1)/n * bytes sent and received per rank, n-1 latency steps.
 * Limits: in place means send == recv + offset_r (elements). An empty shard
 * still exchanges one empty frame so that count disagreements are caught. */
#include "comm/algorithms/algorithms.h"
#include "comm/p2p/p2p.h"

td_status allgather_ring(td_comm *comm, const comm_op *op) {
  const int n = comm->size, r = comm->rank;
  const size_t esz = td_dtype_size(op->dtype);
  size_t own_off, own_len;
  td_shard_range(op->count, n, r, &own_off, &own_len);
  if (own_len) comm_copy_if_needed(elem_ptr(op->recv, own_off, esz), op->send, own_len * esz);
  if (n == 1) return TD_OK;

  const size_t chunk = ring_chunk_elems(comm, esz);
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  for (int s = 0; s < n - 1; s++) {
    int send_seg = (r - s + n) % n, recv_seg = (r - s - 1 + n) % n;
    size_t send_off, send_len, recv_off, recv_len;
    td_shard_range(op->count, n, send_seg, &send_off, &send_len);
    td_shard_range(op->count, n, recv_seg, &recv_off, &recv_len);
    size_t n_send = n_chunks(send_len, chunk), n_recv = n_chunks(recv_len, chunk);
    for (size_t i = 0; i < TD_MAX(n_send, n_recv); i++) {
      size_t sl = chunk_len(send_len, chunk, i), rl = chunk_len(recv_len, chunk, i);
      TD_CHECK(p2p_exchange(comm, op, i < n_send ? right : -1,
                            sl ? elem_ptr(op->recv, send_off + i * chunk, esz) : NULL, sl * esz,
                            i < n_recv ? left : -1, rl ? elem_ptr(op->recv, recv_off + i * chunk, esz) : NULL,
                            rl * esz));
    }
  }
  return TD_OK;
}
