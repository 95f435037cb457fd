/* Ring allreduce: the bandwidth algorithm over point-to-point transports
 * (Patarasuk & Yuan; what NCCL, Gloo and Horovod run between hosts).
 *
 * The buffer is cut into n segments (td_shard_range). Reduce-scatter: in
 * step s = 0..n-2, rank r sends segment r-s to its right neighbour and
 * receives segment r-s-1 from its left one, folding it into its copy; after
 * n-1 steps rank r holds segment r+1 fully reduced. Allgather: n-1 more
 * steps pass the reduced segments around the ring (rank r sends segment
 * r+1-s, receives r-s).
 *
 *   n = 3, reduce-scatter step 0        allgather step 0
 *   r0: send S0 -> r1, recv S2 <- r2    r0: send S1 -> r1, recv S0 <- r2
 *   r1: send S1 -> r2, recv S0 <- r0    r1: send S2 -> r2, recv S1 <- r0
 *   r2: send S2 -> r0, recv S1 <- r1    r2: send S0 -> r0, recv S2 <- r1
 *
 * Each segment moves in chunks of TANDEM_RING_CHUNK_BYTES. A chunk is
 * received into a small staging buffer that stays in cache and folded into
 * place; meanwhile the next chunk streams into the kernel's socket buffer,
 * so the reduction overlaps the transfer. Every element passes each link
 * twice: 2(n-1)/n * bytes sent and received per rank, in 2(n-1) latency
 * steps of at least one frame each, so small messages are better served by
 * recursive doubling (allreduce_rd.c).
 *
 * Limits: every rank receives the same result, folded in ring order. f16 and
 * bf16 sums reach this file as f32 partials (select/select.c), so they round once;
 * with TANDEM_HALF_PARTIALS=half they round once per hop.
 *
 * TD_AVG: each rank divides the segment it owns as the last step of the
 * reduce-scatter folds it, chunk by chunk while the chunk is still in cache,
 * and the allgather hands the divided values around, so a rank scales 1/n
 * of the buffer instead of all of it afterwards (select/select.c leaves
 * this algorithm's results alone). The owner applies the same division to
 * the same sum that every rank would have, so the result is bitwise the one
 * a division after the allreduce gives. (A whole-buffer pass is a read and
 * a write of the gradient in DRAM: tens of ms per rank for the 403 MB of
 * tandem.torch's Average in bench/py_doors.py; bench/results/
 * py-doors-2026-11-27-s19.md has the CPU time measured.)
 * An empty segment still exchanges one empty frame, so that ranks that
 * disagree on the count find out from the frame headers. */
#include "comm/algorithms/algorithms.h"
#include "comm/p2p/p2p.h"

td_status allreduce_ring(td_comm *comm, const comm_op *op) {
  const int n = comm->size, r = comm->rank;
  const size_t esz = td_dtype_size(op->dtype);
  char *buf = op->recv;
  comm_copy_if_needed(op->recv, op->send, comm_op_bytes(op));
  if (n == 1) return TD_OK;

  const size_t chunk = ring_chunk_elems(comm, esz);
  const size_t max_segment = (op->count + (size_t)n - 1) / (size_t)n;
  char *stage = td_alloc(TD_MAX(TD_MIN(chunk, max_segment), 1) * esz);
  if (!stage) return comm_fail(comm, TD_ERR_SYSTEM, "allreduce_ring: out of memory for the staging buffer");
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  td_status st = TD_OK;

  for (int phase = 0; phase < 2 && st == TD_OK; phase++) {
    for (int s = 0; s < n - 1 && st == TD_OK; s++) {
      /* phase 0 (reduce-scatter): send r-s, receive r-s-1 and fold it in;
       * phase 1 (allgather): send r+1-s, receive r-s in place. */
      int send_seg = phase == 0 ? (r - s + n) % n : (r + 1 - s + n) % n;
      int recv_seg = (send_seg + n - 1) % n;
      size_t send_off, send_len, recv_off, recv_len;
      td_shard_range(op->count, n, send_seg, &send_off, &send_len);
      td_shard_range(op->count, n, recv_seg, &recv_off, &recv_len);
      size_t n_send = n_chunks(send_len, chunk), n_recv = n_chunks(recv_len, chunk);
      for (size_t i = 0; i < TD_MAX(n_send, n_recv); i++) {
        size_t sl = chunk_len(send_len, chunk, i), rl = chunk_len(recv_len, chunk, i);
        char *send_ptr = sl ? elem_ptr(buf, send_off + i * chunk, esz) : NULL;
        char *recv_dst = rl ? elem_ptr(buf, recv_off + i * chunk, esz) : NULL;
        st = p2p_exchange(comm, op, i < n_send ? right : -1, send_ptr, sl * esz, i < n_recv ? left : -1,
                          phase == 0 ? stage : recv_dst, rl * esz);
        if (st != TD_OK) break;
        if (phase == 0 && rl > 0) {
          td_reduce_inplace(recv_dst, stage, rl, op->dtype, op->redop);
          if (op->redop == TD_AVG && s == n - 2) td_reduce_scale(recv_dst, rl, op->dtype, n);
        }
      }
    }
  }
  td_free(stage);
  return st;
}
