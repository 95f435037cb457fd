/* The sticky error of a communicator: the first failure wins, is logged,
 * is told to every peer through the transport's abort(), and fails every
 * pending and later operation with the same status and message
 * (include/tandem/comm.h, "Errors are sticky"). Every file of src/comm
 * reports through comm_fail; a public call's non-breaking failure (a bad
 * argument) is kept apart by comm_note_failure, for td_comm_last_error.
 * td_comm_abort breaks a communicator on purpose through the same path. */
#include "comm/core/core.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static td_status fail_message(td_comm *comm, td_status status, const char *msg) {
  pthread_mutex_lock(&comm->err_mu);
  td_status first = comm_status(comm);
  if (first != TD_OK) {
    pthread_mutex_unlock(&comm->err_mu);
    return first;
  }
  td_strlcpy(comm->err_msg, msg, sizeof comm->err_msg);
  /* Publish the message before the status: readers check the status first. */
  atomic_store_explicit(&comm->err_status, (int)status, memory_order_release);
  pthread_mutex_unlock(&comm->err_mu);

  td_log(TD_LOG_ERROR, "%s (%s)", comm->err_msg, td_status_str(status));
  td_error(status, "%s", comm->err_msg);
  if (comm->xport && comm->xport->vtbl->abort) comm->xport->vtbl->abort(comm->xport, status, comm->err_msg);
  return status;
}

td_status comm_fail(td_comm *comm, td_status status, const char *fmt, ...) {
  if (status == TD_OK) status = TD_ERR_INTERNAL;
  char body[900], msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(body, sizeof body, fmt, ap);
  va_end(ap);
  /* Say which rank saw it, unless the message already starts by naming one
   * (a mismatch report, an error relayed from a peer). */
  if (!strncmp(body, "rank ", 5))
    td_strlcpy(msg, body, sizeof msg);
  else
    snprintf(msg, sizeof msg, "rank %d: %s", comm->rank, body);
  return fail_message(comm, status, msg);
}

const char *comm_peer_name(const td_comm *comm, int peer, const char *detail, char *buf, size_t size) {
  bool split = comm && comm->split && comm->world_ranks && peer >= 0 && peer < comm->size;
  const char *sep = detail && *detail ? ", " : "";
  if (split)
    snprintf(buf, size, "rank %d (world rank %d%s%s)", peer, comm->world_ranks[peer], sep, detail ? detail : "");
  else if (*sep)
    snprintf(buf, size, "rank %d (%s)", peer, detail);
  else
    snprintf(buf, size, "rank %d", peer);
  return buf;
}

td_status comm_note_failure(td_comm *comm, td_status st) {
  if (st == TD_OK || st == TD_ERR_IN_PROGRESS || !comm) return st;
  pthread_mutex_lock(&comm->err_mu);
  if (comm_status(comm) == TD_OK) td_strlcpy(comm->call_msg, td_last_error(), sizeof comm->call_msg);
  pthread_mutex_unlock(&comm->err_mu);
  return st;
}

td_status comm_check_deadline(td_comm *comm, const comm_op *op) {
  td_status st = comm_status(comm);
  if (st != TD_OK) return st;
  if (td_now() < op->deadline) return TD_OK;
  char desc[256];
  comm_op_describe(op, desc, sizeof desc);
  return comm_fail(comm, TD_ERR_TIMEOUT, "%s did not finish within %g s (TANDEM_TIMEOUT)", desc, comm->timeout_s);
}

void td_comm_abort(td_comm *comm, const char *reason) {
  if (!comm) return;
  char msg[1024];
  snprintf(msg, sizeof msg, "aborted by rank %d: %s", comm->rank, reason && *reason ? reason : "no reason given");
  fail_message(comm, TD_ERR_REMOTE, msg);
}

const char *td_comm_last_error(const td_comm *comm) {
  if (!comm) return "";
  /* The sticky message never changes once set; a call message may be
   * replaced by another thread's failure at any moment, so the caller gets
   * a copy of it in a buffer of its own thread. */
  if (comm_status(comm) != TD_OK) return comm->err_msg;
  static _Thread_local char copy[sizeof comm->call_msg];
  td_comm *c = (td_comm *)comm;
  pthread_mutex_lock(&c->err_mu);
  if (comm_status(comm) != TD_OK)
    td_strlcpy(copy, comm->err_msg, sizeof copy);
  else
    td_strlcpy(copy, comm->call_msg, sizeof copy);
  pthread_mutex_unlock(&c->err_mu);
  return copy;
}
td_status td_comm_status(const td_comm *comm) { return comm ? comm_status(comm) : TD_ERR_INVALID_ARGUMENT; }
