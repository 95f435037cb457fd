/* The public collective and point-to-point entry points: argument checks
 * (a bad argument is TD_ERR_INVALID_ARGUMENT with a message, never a
 * crash), the comm_op each call becomes, its sequence number, and the
 * world-of-one path (plain copies, no progress thread involved). Everything
 * else goes to the progress engine: inline for blocking calls when nothing
 * is pending, queued otherwise. */
#include "comm/core/core.h"
#include "comm/progress/progress.h"
#include "comm/device/device_coll.h"

#include <stdint.h>
#include <string.h>

static td_status check_comm(td_comm *comm, const char *fn) {
  if (!comm) return td_error(TD_ERR_INVALID_ARGUMENT, "%s: the communicator is NULL", fn);
  td_status st = comm_status(comm);
  if (st != TD_OK) return td_error(st, "%s", comm->err_msg);
  if (comm->finalized)
    return td_error(TD_ERR_INVALID_USAGE, "%s: rank %d: the communicator was finalized", fn, comm->rank);
  return TD_OK;
}

static td_status check_dtype(td_dtype dtype, const char *fn) {
  if ((unsigned)dtype >= TD_DTYPE_COUNT)
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: unknown dtype %d (use TD_F32, TD_F64, TD_F16, TD_BF16, TD_I32, "
                                             "TD_I64 or TD_U8)",
                    fn, (int)dtype);
  return TD_OK;
}

static td_status check_op(td_op op, const char *fn) {
  if ((unsigned)op >= TD_OP_COUNT)
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: unknown reduction op %d (use TD_SUM, TD_AVG, TD_MIN, TD_MAX or "
                                             "TD_PROD)",
                    fn, (int)op);
  return TD_OK;
}

/* count elements of dtype, times `blocks`, must fit in size_t. */
static td_status check_count(size_t count, size_t blocks, td_dtype dtype, const char *fn) {
  size_t esize = td_dtype_size(dtype);
  if (count && (blocks > SIZE_MAX / count || count * blocks > SIZE_MAX / esize))
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: count %zu of %s overflows the address space", fn, count,
                    td_dtype_name(dtype));
  return TD_OK;
}

static td_status check_buf(const void *buf, size_t count, const char *what, const char *fn) {
  if (!buf && count)
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: %s buffer is NULL with count %zu (NULL is allowed only for count 0)",
                    fn, what, count);
  return TD_OK;
}

static td_status check_rank(const td_comm *comm, int rank, const char *what, const char *fn) {
  if (rank < 0 || rank >= comm->size)
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: %s %d is outside 0..%d (communicator of %d ranks)", fn, what, rank,
                    comm->size - 1, comm->size);
  return TD_OK;
}

/* A world of one: every collective is a copy (or nothing); TD_AVG divides
 * by 1. Point-to-point cannot reach here (a peer would be this rank). */
static void self_execute(const comm_op *op) {
  size_t bytes = comm_op_bytes(op);
  switch (op->kind) {
  case COMM_ALLREDUCE:
  case COMM_REDUCE:
  case COMM_REDUCE_SCATTER:
  case COMM_ALLGATHER:
  case COMM_ALLTOALL:
    comm_copy_if_needed(op->recv, op->send, bytes);
    break;
  default:
    break;
  }
}

static comm_op make_op(comm_kind kind, const void *send, void *recv, size_t count, td_dtype dtype, td_op redop,
                       int root) {
  comm_op op;
  memset(&op, 0, sizeof op);
  op.kind = kind;
  op.send = send;
  op.recv = recv;
  op.count = count;
  op.dtype = dtype;
  op.user_dtype = dtype;
  op.redop = redop;
  op.root = root;
  op.peer = -1;
  return op;
}

/* Hand a validated op (sequence number assigned) to the engine. */
static td_status issue(td_comm *comm, const comm_op *op, td_request **req_out) {
  if (comm->size == 1) {
    if (op->on_device) TD_CHECK(device_coll_execute(comm, op));
    else self_execute(op);
    if (!req_out) return TD_OK;
    *req_out = progress_request_done(TD_OK);
    return *req_out ? TD_OK : td_error(TD_ERR_SYSTEM, "out of memory allocating a request");
  }
  if (req_out) return progress_submit(comm, op, req_out);
  return progress_run_blocking(comm, op);
}

/* A collective on device buffers is set up (first time) and takes one
 * sequence number per staged chunk (comm/device/device_coll.h). */
static td_status issue_collective(td_comm *comm, comm_op *op, td_request **req_out) {
  td_device dev;
  if (device_coll_wants(comm, op, &dev)) {
    TD_CHECK(device_coll_setup(comm, dev));
    op->on_device = true;
    op->seq = comm->coll_seq;
    comm->coll_seq += device_coll_seq_span(comm, op);
    return issue(comm, op, req_out);
  }
  op->seq = comm->coll_seq++;
  return issue(comm, op, req_out);
}

#define BEGIN()                 \
  if (req_out) *req_out = NULL; \
  TD_CHECK(check_comm(comm, fn_name))

/* ---- non-blocking forms (the blocking ones pass req_out = NULL) ---- */

static td_status do_allreduce(const void *send, void *recv, size_t count, td_dtype dtype, td_op op, td_comm *comm,
                              td_request **req_out, const char *fn_name) {
  BEGIN();
  TD_CHECK(check_dtype(dtype, fn_name));
  TD_CHECK(check_op(op, fn_name));
  TD_CHECK(check_count(count, 1, dtype, fn_name));
  TD_CHECK(check_buf(send, count, "send", fn_name));
  TD_CHECK(check_buf(recv, count, "receive", fn_name));
  comm_op o = make_op(COMM_ALLREDUCE, send, recv, count, dtype, op, -1);
  return issue_collective(comm, &o, req_out);
}

static td_status do_reduce(const void *send, void *recv, size_t count, td_dtype dtype, td_op op, int root,
                           td_comm *comm, td_request **req_out, const char *fn_name) {
  BEGIN();
  TD_CHECK(check_dtype(dtype, fn_name));
  TD_CHECK(check_op(op, fn_name));
  TD_CHECK(check_rank(comm, root, "root", fn_name));
  TD_CHECK(check_count(count, 1, dtype, fn_name));
  TD_CHECK(check_buf(send, count, "send", fn_name));
  if (comm->rank == root) TD_CHECK(check_buf(recv, count, "receive (at the root)", fn_name));
  comm_op o = make_op(COMM_REDUCE, send, recv, count, dtype, op, root);
  return issue_collective(comm, &o, req_out);
}

static td_status do_broadcast(void *buf, size_t count, td_dtype dtype, int root, td_comm *comm,
                              td_request **req_out, const char *fn_name) {
  BEGIN();
  TD_CHECK(check_dtype(dtype, fn_name));
  TD_CHECK(check_rank(comm, root, "root", fn_name));
  TD_CHECK(check_count(count, 1, dtype, fn_name));
  TD_CHECK(check_buf(buf, count, "the", fn_name));
  comm_op o = make_op(COMM_BROADCAST, buf, buf, count, dtype, TD_SUM, root);
  return issue_collective(comm, &o, req_out);
}

static td_status do_reduce_scatter(const void *send, void *recv, size_t count, td_dtype dtype, td_op op,
                                   td_comm *comm, td_request **req_out, const char *fn_name) {
  BEGIN();
  TD_CHECK(check_dtype(dtype, fn_name));
  TD_CHECK(check_op(op, fn_name));
  TD_CHECK(check_count(count, 1, dtype, fn_name));
  size_t offset, len;
  td_shard_range(count, comm->size, comm->rank, &offset, &len);
  TD_CHECK(check_buf(send, count, "send", fn_name));
  TD_CHECK(check_buf(recv, len, "receive", fn_name));
  comm_op o = make_op(COMM_REDUCE_SCATTER, send, recv, count, dtype, op, -1);
  return issue_collective(comm, &o, req_out);
}

static td_status do_allgather(const void *send, void *recv, size_t count, td_dtype dtype, td_comm *comm,
                              td_request **req_out, const char *fn_name) {
  BEGIN();
  TD_CHECK(check_dtype(dtype, fn_name));
  TD_CHECK(check_count(count, 1, dtype, fn_name));
  size_t offset, len;
  td_shard_range(count, comm->size, comm->rank, &offset, &len);
  TD_CHECK(check_buf(send, len, "send", fn_name));
  TD_CHECK(check_buf(recv, count, "receive", fn_name));
  comm_op o = make_op(COMM_ALLGATHER, send, recv, count, dtype, TD_SUM, -1);
  return issue_collective(comm, &o, req_out);
}

static td_status do_alltoall(const void *send, void *recv, size_t count, td_dtype dtype, td_comm *comm,
                             td_request **req_out, const char *fn_name) {
  BEGIN();
  TD_CHECK(check_dtype(dtype, fn_name));
  TD_CHECK(check_count(count, (size_t)comm->size, dtype, fn_name));
  TD_CHECK(check_buf(send, count, "send", fn_name));
  TD_CHECK(check_buf(recv, count, "receive", fn_name));
  if (count && send == recv)
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: alltoall cannot run in place (send == recv): pass a separate "
                                             "receive buffer",
                    fn_name);
  comm_op o = make_op(COMM_ALLTOALL, send, recv, count, dtype, TD_SUM, -1);
  return issue_collective(comm, &o, req_out);
}

static td_status do_barrier(td_comm *comm, td_request **req_out, const char *fn_name) {
  BEGIN();
  comm_op o = make_op(COMM_BARRIER, NULL, NULL, 0, TD_U8, TD_SUM, -1);
  return issue_collective(comm, &o, req_out);
}

static td_status do_p2p(comm_kind kind, void *buf, size_t count, td_dtype dtype, int peer, td_comm *comm,
                        td_request **req_out, const char *fn_name) {
  if (req_out) *req_out = NULL;
  TD_CHECK(check_comm(comm, fn_name));
  TD_CHECK(check_dtype(dtype, fn_name));
  TD_CHECK(check_rank(comm, peer, "peer", fn_name));
  if (peer == comm->rank)
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: rank %d cannot %s itself", fn_name, peer,
                    kind == COMM_SEND ? "send to" : "receive from");
  TD_CHECK(check_count(count, 1, dtype, fn_name));
  TD_CHECK(check_buf(buf, count, "the", fn_name));
  if (buf && td_pointer_device(buf).kind != TD_DEVICE_CPU)
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: the buffer is device memory, which send/recv do not take yet: copy "
                                             "it to host memory (td_device_copy) first",
                    fn_name);
  comm_op o = make_op(kind, buf, buf, count, dtype, TD_SUM, -1);
  o.peer = peer;
  o.seq = kind == COMM_SEND ? comm->send_seq[peer]++ : comm->recv_seq[peer]++;
  return issue(comm, &o, req_out);
}

/* ---- public API ---- */

td_status td_allreduce(const void *send, void *recv, size_t count, td_dtype dtype, td_op op, td_comm *comm) {
  return comm_note_failure(comm, do_allreduce(send, recv, count, dtype, op, comm, NULL, "td_allreduce"));
}
td_status td_reduce(const void *send, void *recv, size_t count, td_dtype dtype, td_op op, int root, td_comm *comm) {
  return comm_note_failure(comm, do_reduce(send, recv, count, dtype, op, root, comm, NULL, "td_reduce"));
}
td_status td_broadcast(void *buf, size_t count, td_dtype dtype, int root, td_comm *comm) {
  return comm_note_failure(comm, do_broadcast(buf, count, dtype, root, comm, NULL, "td_broadcast"));
}
td_status td_reduce_scatter(const void *send, void *recv, size_t count, td_dtype dtype, td_op op, td_comm *comm) {
  return comm_note_failure(comm, do_reduce_scatter(send, recv, count, dtype, op, comm, NULL, "td_reduce_scatter"));
}
td_status td_allgather(const void *send, void *recv, size_t count, td_dtype dtype, td_comm *comm) {
  return comm_note_failure(comm, do_allgather(send, recv, count, dtype, comm, NULL, "td_allgather"));
}
td_status td_alltoall(const void *send, void *recv, size_t count, td_dtype dtype, td_comm *comm) {
  return comm_note_failure(comm, do_alltoall(send, recv, count, dtype, comm, NULL, "td_alltoall"));
}
td_status td_barrier(td_comm *comm) { return comm_note_failure(comm, do_barrier(comm, NULL, "td_barrier")); }
td_status td_send(const void *buf, size_t count, td_dtype dtype, int peer, td_comm *comm) {
  return comm_note_failure(comm, do_p2p(COMM_SEND, (void *)buf, count, dtype, peer, comm, NULL, "td_send"));
}
td_status td_recv(void *buf, size_t count, td_dtype dtype, int peer, td_comm *comm) {
  return comm_note_failure(comm, do_p2p(COMM_RECV, buf, count, dtype, peer, comm, NULL, "td_recv"));
}

/* Non-blocking forms: the same checks, plus the request pointer. */
#define NEED_REQ(fn)                                                                       \
  if (!req_out) return td_error(TD_ERR_INVALID_ARGUMENT, fn ": req_out is NULL")

td_status td_iallreduce(const void *send, void *recv, size_t count, td_dtype dtype, td_op op, td_comm *comm,
                        td_request **req_out) {
  NEED_REQ("td_iallreduce");
  return comm_note_failure(comm, do_allreduce(send, recv, count, dtype, op, comm, req_out, "td_iallreduce"));
}
td_status td_ireduce(const void *send, void *recv, size_t count, td_dtype dtype, td_op op, int root, td_comm *comm,
                     td_request **req_out) {
  NEED_REQ("td_ireduce");
  return comm_note_failure(comm, do_reduce(send, recv, count, dtype, op, root, comm, req_out, "td_ireduce"));
}
td_status td_ibroadcast(void *buf, size_t count, td_dtype dtype, int root, td_comm *comm, td_request **req_out) {
  NEED_REQ("td_ibroadcast");
  return comm_note_failure(comm, do_broadcast(buf, count, dtype, root, comm, req_out, "td_ibroadcast"));
}
td_status td_ireduce_scatter(const void *send, void *recv, size_t count, td_dtype dtype, td_op op, td_comm *comm,
                             td_request **req_out) {
  NEED_REQ("td_ireduce_scatter");
  return comm_note_failure(comm, do_reduce_scatter(send, recv, count, dtype, op, comm, req_out, "td_ireduce_scatter"));
}
td_status td_iallgather(const void *send, void *recv, size_t count, td_dtype dtype, td_comm *comm,
                        td_request **req_out) {
  NEED_REQ("td_iallgather");
  return comm_note_failure(comm, do_allgather(send, recv, count, dtype, comm, req_out, "td_iallgather"));
}
td_status td_ialltoall(const void *send, void *recv, size_t count, td_dtype dtype, td_comm *comm,
                       td_request **req_out) {
  NEED_REQ("td_ialltoall");
  return comm_note_failure(comm, do_alltoall(send, recv, count, dtype, comm, req_out, "td_ialltoall"));
}
td_status td_ibarrier(td_comm *comm, td_request **req_out) {
  NEED_REQ("td_ibarrier");
  return comm_note_failure(comm, do_barrier(comm, req_out, "td_ibarrier"));
}
td_status td_isend(const void *buf, size_t count, td_dtype dtype, int peer, td_comm *comm, td_request **req_out) {
  NEED_REQ("td_isend");
  return comm_note_failure(comm, do_p2p(COMM_SEND, (void *)buf, count, dtype, peer, comm, req_out, "td_isend"));
}
td_status td_irecv(void *buf, size_t count, td_dtype dtype, int peer, td_comm *comm, td_request **req_out) {
  NEED_REQ("td_irecv");
  return comm_note_failure(comm, do_p2p(COMM_RECV, buf, count, dtype, peer, comm, req_out, "td_irecv"));
}
