/* The operation and its frame header: what every frame carries so that a
 * receiver can check that its peer is executing the same operation, the
 * one-line descriptions used in every mismatch and timeout message
 * ("allreduce(seq 7, count 1000, f32, sum)"), and the copy that starts many
 * algorithms. */
#include "comm/core/core.h"

#include <stdio.h>
#include <string.h>

const char *comm_kind_name(comm_kind kind) {
  switch (kind) {
  case COMM_ALLREDUCE: return "allreduce";
  case COMM_REDUCE: return "reduce";
  case COMM_BROADCAST: return "broadcast";
  case COMM_REDUCE_SCATTER: return "reduce_scatter";
  case COMM_ALLGATHER: return "allgather";
  case COMM_ALLTOALL: return "alltoall";
  case COMM_BARRIER: return "barrier";
  case COMM_SEND: return "send";
  case COMM_RECV: return "recv";
  }
  return "unknown-op";
}

void comm_hdr_fill(comm_hdr *h, const comm_op *op, int src_rank, uint64_t nbytes) {
  memset(h, 0, sizeof *h);
  h->magic = COMM_HDR_MAGIC;
  h->kind = (uint32_t)op->kind;
  h->seq = op->seq;
  h->count = op->count;
  h->dtype = (int32_t)op->user_dtype;
  h->redop = (int32_t)op->redop;
  h->root = op->root;
  h->src_rank = src_rank;
  h->nbytes = nbytes;
}

/* Shared by both describe functions: which fields are shown depends on the
 * kind, so that messages mention only what the user passed. `peer_word` is
 * "to"/"from" for point-to-point operations. */
static void describe(char *buf, size_t size, uint32_t kind, uint64_t seq, uint64_t count, int dtype, int redop,
                     int root, const char *peer_word, int peer) {
  const char *name = comm_kind_name((comm_kind)kind);
  const char *dt = td_dtype_name((td_dtype)dtype);
  const char *op = td_op_name((td_op)redop);
  unsigned long long s = (unsigned long long)seq, c = (unsigned long long)count;
  switch ((comm_kind)kind) {
  case COMM_ALLREDUCE:
  case COMM_REDUCE_SCATTER:
    snprintf(buf, size, "%s(seq %llu, count %llu, %s, %s)", name, s, c, dt, op);
    break;
  case COMM_REDUCE:
    snprintf(buf, size, "%s(seq %llu, count %llu, %s, %s, root %d)", name, s, c, dt, op, root);
    break;
  case COMM_BROADCAST:
    snprintf(buf, size, "%s(seq %llu, count %llu, %s, root %d)", name, s, c, dt, root);
    break;
  case COMM_ALLGATHER:
  case COMM_ALLTOALL:
    snprintf(buf, size, "%s(seq %llu, count %llu, %s)", name, s, c, dt);
    break;
  case COMM_BARRIER:
    snprintf(buf, size, "%s(seq %llu)", name, s);
    break;
  case COMM_SEND:
  case COMM_RECV:
    if (peer >= 0)
      snprintf(buf, size, "%s(seq %llu %s rank %d, count %llu, %s)", name, s, peer_word, peer, c, dt);
    else
      snprintf(buf, size, "%s(seq %llu, count %llu, %s)", name, s, c, dt);
    break;
  default:
    snprintf(buf, size, "unknown operation %u (seq %llu, count %llu, dtype %d, op %d, root %d)", kind, s, c,
             dtype, redop, root);
    break;
  }
}

void comm_op_describe(const comm_op *op, char *buf, size_t size) {
  describe(buf, size, (uint32_t)op->kind, op->seq, op->count, (int)op->user_dtype, (int)op->redop, op->root,
           op->kind == COMM_SEND ? "to" : "from", op->peer);
}

void comm_hdr_describe(const comm_hdr *h, char *buf, size_t size) {
  if (h->magic != COMM_HDR_MAGIC) {
    snprintf(buf, size, "a corrupt frame (magic 0x%08x, expected 0x%08x)", h->magic, COMM_HDR_MAGIC);
    return;
  }
  /* A SEND frame's interesting peer is its sender. */
  describe(buf, size, h->kind, h->seq, h->count, h->dtype, h->redop, h->root, "from", h->src_rank);
}

void comm_copy_if_needed(void *dst, const void *src, size_t bytes) {
  if (dst == src || bytes == 0) return;
  /* memmove: callers may pass overlapping shards (in-place layouts where
   * the user's buffers overlap partially are legal in the API). */
  memmove(dst, src, bytes);
}
