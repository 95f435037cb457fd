/* The progress engine: one thread per communicator runs queued operations
 * in issue order; a blocking call finding nothing queued or executing runs
 * its operation directly on the caller's thread instead (no hand-off, which
 * is what makes small shared-memory collectives take microseconds).
 *
 * td_wait also runs queued operations on the waiting thread when the
 * progress thread is idle (see help_progress). Send/recv operations run as
 * one set (p2p_stream) that outlives each run: a waiter leaves it as soon
 * as its own operation is done and the progress thread finishes the rest.
 *
 * Where the transport has a doorbell that peers can ring (shm), the idle
 * thread sleeps on it rather than on its condition variable: a peer whose
 * send stalls on a full buffer to this rank rings it, and the thread takes
 * that frame before any receive for it is posted (idle_wait), so that the
 * peer's send completes while this rank's threads compute.
 *
 * Requests complete through a futex word, so that waiting on a completed one
 * needs nothing from the communicator (a request may even outlive it):
 *   REQ_PENDING -> REQ_WAITED (a waiter is asleep) -> REQ_DONE.
 * td_wait spins a few microseconds first, but only when every local rank can
 * have its own CPU: with 8 ranks on 2 cores spinning steals the time the
 * peers need to make the progress we wait for. */
#define _GNU_SOURCE 1 /* pthread_setname_np; must precede the first system header */
#include "comm/device/device_coll.h"
#include "comm/p2p/p2p.h"
#include "comm/progress/progress.h"
#include "comm/select/select.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { REQ_PENDING = 0, REQ_WAITED = 1, REQ_DONE = 2 };

struct td_request {
  comm_op op;
  td_comm *comm;
  td_status status;
  char err[512];              /* the failure message, for td_last_error() on the waiting thread */
  bool spin;                  /* may td_wait spin before sleeping */
  _Atomic uint32_t state;
  struct td_request *next;
};

struct comm_request_queue {
  pthread_mutex_t mu;
  pthread_cond_t work_cv; /* the thread sleeps here while idle */
  pthread_cond_t idle_cv; /* progress_drain sleeps here */
  td_request *head, *tail;
  p2p_stream *stream;     /* send/recv operations taken off the queue, not done yet */
  bool stream_open;       /* the stream holds operations (set by whoever ran it last) */
  bool executing;         /* an operation runs (inline or on the thread) */
  /* Operations not complete yet: submitted requests until request_complete
   * (decremented before the request reads REQ_DONE), and a blocking call
   * running inline. What progress_busy reports: `executing` stays set a
   * moment after the last request completed (the thread still has to take
   * the lock), and a td_comm_destroy right after td_wait returned took that
   * for pending work and failed the communicator, under the peers still in
   * their last collective (c10d's destroy_process_group after async ops). */
  _Atomic int pending;
  bool bell_sleeping;     /* the thread sleeps on the transport's bell (wake_thread) */
  bool exec_waiter;       /* the thread waits on work_cv for `executing` to clear */
  bool stop;
  bool thread_started;
  bool spin;
  pthread_t thread;
};

/* Run one operation on the current thread: fail fast on a broken
 * communicator, start the deadline clock, execute. */
static td_status run_op(td_comm *comm, const comm_op *issued) {
  td_status st = comm_status(comm);
  if (st != TD_OK) return td_error(st, "%s", comm->err_msg);
  comm_op op = *issued;
  op.deadline = td_now() + comm->timeout_s;
  /* device buffers: the NCCL or staged path, which runs host chunks
   * through comm_execute itself (comm/device/device_coll.h) */
  st = op.on_device ? device_coll_execute(comm, &op) : comm_execute(comm, &op);
  /* The transport may have completed it from data sent before a peer failed. */
  if (st == TD_OK && comm->xport && comm->xport->vtbl->op_done) st = comm->xport->vtbl->op_done(comm->xport);
  /* (a staged device op records its last host chunk itself: that is what
   * went over the wire) */
  if (st == TD_OK && op.kind != COMM_SEND && op.kind != COMM_RECV && !op.on_device)
    comm_hdr_fill(&comm->last_coll, &op, comm->rank, 0);
  /* A broken communicator reports its sticky status and message, whichever
   * thread detected the failure. */
  td_status sticky = comm_status(comm);
  if (sticky != TD_OK) return td_error(sticky, "%s", comm->err_msg);
  return st;
}

static void request_complete(td_request *req, td_status status) {
  req->status = status;
  if (status != TD_OK) td_error_copy(req->err, sizeof req->err);
  /* Before the exchange: a waiter that sees REQ_DONE sees this too. */
  if (req->comm && req->comm->queue) atomic_fetch_sub_explicit(&req->comm->queue->pending, 1, memory_order_release);
  /* After this exchange the waiter may free req: touch nothing but the
   * futex word's address (a wake on freed memory is harmless). */
  uint32_t prev = atomic_exchange_explicit(&req->state, REQ_DONE, memory_order_acq_rel);
  if (prev == REQ_WAITED) td_futex_wake(&req->state, INT_MAX, false);
}

static bool is_p2p(const td_request *req) { return req->op.kind == COMM_SEND || req->op.kind == COMM_RECV; }

/* p2p_stream_run's callbacks: hand over the send/recv operations at the
 * head of the queue (each starts its deadline clock now), complete them, and
 * let a waiting thread that runs the stream go once its own request is done. */
typedef struct stream_ctx {
  td_comm *comm;
  const td_request *mine; /* the waiter's request; NULL on the progress thread */
} stream_ctx;

static int stream_pull(void *arg, comm_op *ops_out, void **tags_out, int max) {
  td_comm *comm = ((stream_ctx *)arg)->comm;
  comm_request_queue *q = comm->queue;
  int k = 0;
  pthread_mutex_lock(&q->mu);
  double deadline = td_now() + comm->timeout_s;
  while (k < max && q->head && is_p2p(q->head)) {
    td_request *req = q->head;
    q->head = req->next;
    if (!q->head) q->tail = NULL;
    ops_out[k] = req->op;
    ops_out[k].deadline = deadline;
    tags_out[k++] = req;
  }
  pthread_mutex_unlock(&q->mu);
  return k;
}

static void stream_done(void *arg, void *tag, td_status status) {
  (void)arg;
  request_complete(tag, status);
}

static bool stream_stop(void *arg) {
  const td_request *mine = ((stream_ctx *)arg)->mine;
  return mine && atomic_load_explicit(&mine->state, memory_order_acquire) == REQ_DONE;
}

/* Pending work: queued operations, or send/recv operations in the stream. */
static bool has_work(const comm_request_queue *q) { return q->head || q->stream_open; }

/* Wake the progress thread for queued work (q->mu held): it sleeps on
 * work_cv, or, where the transport has a doorbell that peers ring
 * (transport_vtbl.bell_*), on that. */
static void wake_thread(td_comm *comm, comm_request_queue *q) {
  pthread_cond_signal(&q->work_cv);
  if (q->bell_sleeping) comm->xport->vtbl->bell_ring(comm->xport, comm->rank, false);
  /* the send/recv stream running (on the thread or a waiter) pulls it */
  if (q->executing && comm->xport && comm->xport->vtbl->wake) comm->xport->vtbl->wake(comm->xport);
}

/* After an operation ran (q->mu held): the thread may wait for that. */
static void done_executing(comm_request_queue *q) {
  q->executing = false;
  if (q->exec_waiter) pthread_cond_signal(&q->work_cv);
}

/* Run what is next: the send/recv stream while it holds operations (it
 * takes the send/recv operations at the head of the queue too), else the
 * collective at the head. `mine`: the request of a waiting thread that runs
 * it (help_progress), which leaves the stream once that one is done; NULL
 * on the progress thread. Called with q->mu held and has_work(q); returns
 * with q->mu held. */
static void run_head(td_comm *comm, comm_request_queue *q, const td_request *mine) {
  q->executing = true;
  if (q->stream_open || is_p2p(q->head)) {
    stream_ctx ctx = {comm, mine};
    pthread_mutex_unlock(&q->mu);
    (void)p2p_stream_run(comm, q->stream, stream_pull, stream_done, stream_stop, &ctx);
    bool open = p2p_stream_pending(q->stream) > 0; /* only the executing thread touches the set */
    pthread_mutex_lock(&q->mu);
    q->stream_open = open;
  } else {
    td_request *req = q->head;
    q->head = req->next;
    if (!q->head) q->tail = NULL;
    pthread_mutex_unlock(&q->mu);
    request_complete(req, run_op(comm, &req->op));
    pthread_mutex_lock(&q->mu);
  }
  done_executing(q);
}

/* Idle, on a transport with a doorbell: take the frames that peers could
 * not finish sending to this rank (p2p_stream_take_unexpected), so that
 * their sends complete while this rank's threads compute; frames still
 * arriving keep the stream open, which the thread then runs. Called with
 * q->mu held and nothing executing; returns with it held. */
static void take_unexpected(td_comm *comm, comm_request_queue *q) {
  q->executing = true;
  pthread_mutex_unlock(&q->mu);
  (void)p2p_stream_take_unexpected(comm, q->stream); /* a failure is the communicator's, sticky */
  bool open = p2p_stream_pending(q->stream) > 0;
  pthread_mutex_lock(&q->mu);
  q->stream_open = q->stream_open || open;
  done_executing(q);
}

/* Sleep until there is work (q->mu held): on the transport's doorbell
 * where it has one, so that a peer's stalled send wakes this thread too. */
static void idle_wait(td_comm *comm, comm_request_queue *q) {
  transport *x = comm->xport;
  if (q->executing || !x || !x->vtbl->bell_read) {
    q->exec_waiter = q->executing;
    pthread_cond_wait(&q->work_cv, &q->mu);
    q->exec_waiter = false;
    return;
  }
  bool stalled = false;
  uint32_t seen = x->vtbl->bell_read(x, &stalled);
  if (stalled) {
    take_unexpected(comm, q);
    return;
  }
  q->bell_sleeping = true;
  pthread_mutex_unlock(&q->mu);
  /* the slice bounds a sleep whose wake-up was lost; nothing is polled */
  x->vtbl->bell_sleep(x, seen, 1.0);
  pthread_mutex_lock(&q->mu);
  q->bell_sleeping = false;
}

static void *progress_main(void *arg) {
  td_comm *comm = arg;
  comm_request_queue *q = comm->queue;
  pthread_setname_np(pthread_self(), "td-progress");
  pthread_mutex_lock(&q->mu);
  for (;;) {
    while (!q->stop && (!has_work(q) || q->executing)) idle_wait(comm, q);
    if (q->stop) break;
    run_head(comm, q, NULL);
    if (!has_work(q)) pthread_cond_broadcast(&q->idle_cv);
  }
  pthread_mutex_unlock(&q->mu);
  return NULL;
}

td_status progress_start(td_comm *comm) {
  comm_request_queue *q = calloc(1, sizeof *q);
  if (!q) return td_error(TD_ERR_SYSTEM, "out of memory creating the progress queue");
  td_status st = p2p_stream_create(&q->stream);
  if (st != TD_OK) {
    free(q);
    return st;
  }
  pthread_mutex_init(&q->mu, NULL);
  pthread_cond_init(&q->work_cv, NULL);
  pthread_cond_init(&q->idle_cv, NULL);
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  q->spin = cpus >= comm->host_size; /* every process of the host, not only this group's */
  comm->queue = q;
  if (comm->size == 1) return TD_OK; /* everything completes at issue: no thread needed */
  int rc = pthread_create(&q->thread, NULL, progress_main, comm);
  if (rc) {
    errno = rc;
    return td_error_errno("rank %d: cannot start the progress thread", comm->rank);
  }
  q->thread_started = true;
  return TD_OK;
}

void progress_stop(td_comm *comm) {
  comm_request_queue *q = comm->queue;
  if (!q) return;
  pthread_mutex_lock(&q->mu);
  q->stop = true;
  pthread_cond_broadcast(&q->work_cv);
  if (q->bell_sleeping) comm->xport->vtbl->bell_ring(comm->xport, comm->rank, false);
  pthread_mutex_unlock(&q->mu);
  if (q->thread_started) pthread_join(q->thread, NULL);
  /* Whatever never ran completes with an error; the owner still waits on it
   * (and so frees it). */
  td_request *req = q->head;
  while (req) {
    td_request *next = req->next;
    td_error(TD_ERR_INVALID_USAGE, "rank %d: the communicator was destroyed before this operation ran", comm->rank);
    request_complete(req, TD_ERR_INVALID_USAGE);
    req = next;
  }
  if (p2p_stream_pending(q->stream) > 0) {
    td_error(TD_ERR_INVALID_USAGE, "rank %d: the communicator was destroyed before this operation finished",
             comm->rank);
    p2p_stream_fail(q->stream, stream_done, NULL, TD_ERR_INVALID_USAGE);
  }
  p2p_stream_destroy(q->stream);
  pthread_cond_destroy(&q->work_cv);
  pthread_cond_destroy(&q->idle_cv);
  pthread_mutex_destroy(&q->mu);
  free(q);
  comm->queue = NULL;
}

bool progress_busy(td_comm *comm) {
  comm_request_queue *q = comm->queue;
  if (!q) return false;
  /* queued operations and the stream's are submitted requests: counted */
  return atomic_load_explicit(&q->pending, memory_order_acquire) > 0;
}

static td_request *request_new(td_comm *comm, const comm_op *op) {
  td_request *req = malloc(sizeof *req);
  if (!req) return NULL;
  memset(req, 0, offsetof(td_request, err) + 1);
  if (op) req->op = *op;
  req->comm = comm;
  req->spin = comm && comm->queue ? comm->queue->spin : false;
  req->next = NULL;
  atomic_init(&req->state, REQ_PENDING);
  return req;
}

td_request *progress_request_done(td_status status) {
  td_request *req = request_new(NULL, NULL);
  if (!req) return NULL;
  request_complete(req, status);
  return req;
}

td_status progress_submit(td_comm *comm, const comm_op *op, td_request **req_out) {
  comm_request_queue *q = comm->queue;
  td_request *req = request_new(comm, op);
  if (!req) return td_error(TD_ERR_SYSTEM, "rank %d: out of memory queuing an operation", comm->rank);
  pthread_mutex_lock(&q->mu);
  if (q->stop) {
    pthread_mutex_unlock(&q->mu);
    free(req);
    return td_error(TD_ERR_INVALID_USAGE, "rank %d: the communicator is being destroyed", comm->rank);
  }
  if (q->tail) q->tail->next = req;
  else q->head = req;
  q->tail = req;
  atomic_fetch_add_explicit(&q->pending, 1, memory_order_relaxed);
  wake_thread(comm, q);
  pthread_mutex_unlock(&q->mu);
  *req_out = req;
  return TD_OK;
}

td_status progress_run_blocking(td_comm *comm, const comm_op *op) {
  comm_request_queue *q = comm->queue;
  pthread_mutex_lock(&q->mu);
  /* (a send/recv goes through the stream while it holds frames that
   * arrived before their receive: p2p_stream_take_unexpected) */
  bool p2p = op->kind == COMM_SEND || op->kind == COMM_RECV;
  if (!has_work(q) && !q->executing && !q->stop && !(p2p && p2p_stream_holds_unexpected(q->stream))) {
    q->executing = true;
    atomic_fetch_add_explicit(&q->pending, 1, memory_order_relaxed);
    pthread_mutex_unlock(&q->mu);
    td_status st = run_op(comm, op);
    pthread_mutex_lock(&q->mu);
    done_executing(q);
    atomic_fetch_sub_explicit(&q->pending, 1, memory_order_release);
    if (has_work(q)) wake_thread(comm, q);
    else pthread_cond_broadcast(&q->idle_cv);
    pthread_mutex_unlock(&q->mu);
    return st;
  }
  pthread_mutex_unlock(&q->mu);
  /* Earlier non-blocking operations are pending: queue behind them so the
   * issue order (which every rank shares) is the execution order. */
  td_request *req;
  TD_CHECK(progress_submit(comm, op, &req));
  return td_wait(req);
}

td_status progress_drain(td_comm *comm) {
  comm_request_queue *q = comm->queue;
  if (!q) return comm_status(comm);
  pthread_mutex_lock(&q->mu);
  while (has_work(q) || q->executing) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 1;
    pthread_cond_timedwait(&q->idle_cv, &q->mu, &ts);
  }
  pthread_mutex_unlock(&q->mu);
  return comm_status(comm);
}

/* ---- requests ---- */

static td_status request_finish(td_request *req) {
  td_status st = req->status;
  td_comm *comm = req->comm;
  if (st != TD_OK) td_error(st, "%s", req->err);
  free(req);
  return comm_note_failure(comm, st);
}

/* The waiting thread runs queued operations itself, in queue order, up to
 * and including its own, when the progress thread is not busy with one:
 * "issue, then wait" then costs no hand-off between threads. It stops as
 * soon as its own is done, in the middle of the send/recv stream too (see
 * p2p.c): the progress thread keeps whatever is left. */
static void help_progress(td_request *req) {
  td_comm *comm = req->comm;
  comm_request_queue *q = comm ? comm->queue : NULL;
  if (!q) return;
  pthread_mutex_lock(&q->mu);
  while (atomic_load_explicit(&req->state, memory_order_acquire) != REQ_DONE && has_work(q) && !q->executing &&
         !q->stop) {
    run_head(comm, q, req);
  }
  if (has_work(q) && !q->executing) wake_thread(comm, q);
  if (!has_work(q) && !q->executing) pthread_cond_broadcast(&q->idle_cv);
  pthread_mutex_unlock(&q->mu);
}

td_status td_wait(td_request *req) {
  if (!req) return TD_OK;
  if (atomic_load_explicit(&req->state, memory_order_acquire) == REQ_DONE) return request_finish(req);
  help_progress(req);
  if (atomic_load_explicit(&req->state, memory_order_acquire) == REQ_DONE) return request_finish(req);
  if (req->spin) {
    uint64_t until = td_now_ns() + 5000;
    while (td_now_ns() < until) {
      if (atomic_load_explicit(&req->state, memory_order_acquire) == REQ_DONE) return request_finish(req);
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
  }
  for (;;) {
    uint32_t expected = REQ_PENDING;
    if (!atomic_compare_exchange_strong_explicit(&req->state, &expected, REQ_WAITED, memory_order_acq_rel,
                                                 memory_order_acquire) &&
        expected == REQ_DONE)
      break;
    /* The operation itself has a deadline; the 1 s slices only bound each
     * sleep so that a lost wake-up could never hang the caller. */
    td_futex_wait(&req->state, REQ_WAITED, 1.0, false);
    if (atomic_load_explicit(&req->state, memory_order_acquire) == REQ_DONE) break;
  }
  return request_finish(req);
}

td_status td_test(td_request *req, int *done) {
  if (!done) return td_error(TD_ERR_INVALID_ARGUMENT, "td_test: done is NULL");
  if (!req) {
    *done = 1;
    return TD_OK;
  }
  if (atomic_load_explicit(&req->state, memory_order_acquire) == REQ_DONE) {
    *done = 1;
    return request_finish(req);
  }
  *done = 0;
  return TD_ERR_IN_PROGRESS;
}
