/* tandem._tandem: the CPython binding of Tandem's C ABI (include/tandem/comm.h).
 *
 * Thin on purpose (DESIGN.md §9): every collective goes straight to the C
 * library on the caller's memory, with no copy. A buffer argument is either
 *   - an object exporting the buffer protocol (NumPy arrays, bytearray,
 *     memoryview): it must be C-contiguous, writable where written, and hold
 *     at least count * dtype-size bytes; or
 *   - an int address (torch's Tensor.data_ptr()): trusted, the caller passes
 *     the object owning it as `keep` for non-blocking calls; or
 *   - None, allowed only when count is 0.
 * Non-blocking calls return a Request that owns the buffer views and the
 * `keep` object until the operation completes, so Python cannot free or
 * resize a buffer that the progress thread still reads or writes.
 *
 * The GIL is released around every call that can block (rendezvous, blocking
 * collectives, waits). The C communicator may be used by one thread at a
 * time, so each Comm carries a mutex taken around every issuing call; waits
 * do not need it (requests complete through their own futex word).
 *
 * Errors: Tandem's td_status becomes an exception of the TandemError family
 * (status and status_name attributes, the C message, which names ranks);
 * wrong arguments raise TypeError/ValueError before anything is issued. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "tandem/tandem.h"
#include "net/net.h" /* the rendezvous store server, for launchers whose own store Tandem cannot use */
#include "_tandem_api.h"

/* ---- exceptions ---- */

static PyObject *TandemError;          /* base: RuntimeError */
static PyObject *RemoteError;          /* TD_ERR_REMOTE */
static PyObject *MismatchError;        /* TD_ERR_MISMATCH */
static PyObject *TandemTimeoutError;   /* TD_ERR_TIMEOUT, also a TimeoutError */
static PyObject *InvalidArgumentError; /* TD_ERR_INVALID_ARGUMENT, also a ValueError */
static PyObject *InvalidUsageError;    /* TD_ERR_INVALID_USAGE */

static PyObject *error_class(td_status st) {
  switch (st) {
  case TD_ERR_REMOTE: return RemoteError;
  case TD_ERR_MISMATCH: return MismatchError;
  case TD_ERR_TIMEOUT: return TandemTimeoutError;
  case TD_ERR_INVALID_ARGUMENT: return InvalidArgumentError;
  case TD_ERR_INVALID_USAGE: return InvalidUsageError;
  default: return TandemError;
  }
}

/* Raise the exception for `st` with `msg`; returns NULL for `return raise(...)`. */
static PyObject *raise_status(td_status st, const char *msg) {
  PyObject *cls = error_class(st);
  PyObject *exc = PyObject_CallFunction(cls, "s", msg && *msg ? msg : td_status_str(st));
  if (!exc) return NULL;
  PyObject *code = PyLong_FromLong((long)st);
  PyObject *name = PyUnicode_FromString(td_status_str(st));
  if (code && name) {
    PyObject_SetAttrString(exc, "status", code);
    PyObject_SetAttrString(exc, "status_name", name);
  }
  Py_XDECREF(code);
  Py_XDECREF(name);
  PyErr_SetObject(cls, exc);
  Py_DECREF(exc);
  return NULL;
}

/* The message of a failure just returned on this thread: td_last_error()
 * holds it (the communicator's sticky message is the fallback). */
static PyObject *raise_last(td_status st, const td_comm *comm) {
  const char *msg = td_last_error();
  if ((!msg || !*msg) && comm) msg = td_comm_last_error(comm);
  return raise_status(st, msg);
}

/* ---- Comm ---- */

typedef struct {
  PyObject_HEAD
  td_comm *comm;
  pthread_mutex_t mu; /* serializes issuing calls (comm.h: one thread at a time) */
  int finalized;
} CommObject;

static PyTypeObject CommType;

/* Take the issue lock; if another thread holds it (a blocking collective
 * running without the GIL), wait for it without the GIL. */
static void comm_lock(CommObject *c) {
  if (pthread_mutex_trylock(&c->mu) == 0) return;
  Py_BEGIN_ALLOW_THREADS pthread_mutex_lock(&c->mu);
  Py_END_ALLOW_THREADS
}

static int comm_usable(CommObject *c) {
  if (!c->comm || c->finalized) {
    raise_status(TD_ERR_INVALID_USAGE,
                 "tandem: the communicator was shut down; call tandem.init() again before using it");
    return 0;
  }
  return 1;
}

static void Comm_dealloc(CommObject *c) {
  /* Requests hold a reference, so none is pending here. */
  if (c->comm) {
    td_comm *comm = c->comm;
    c->comm = NULL;
    Py_BEGIN_ALLOW_THREADS td_comm_destroy(comm);
    Py_END_ALLOW_THREADS
  }
  pthread_mutex_destroy(&c->mu);
  Py_TYPE(c)->tp_free((PyObject *)c);
}

static PyObject *comm_wrap(td_comm *comm) {
  CommObject *c = PyObject_New(CommObject, &CommType);
  if (!c) {
    td_comm_destroy(comm);
    return NULL;
  }
  c->comm = comm;
  c->finalized = 0;
  pthread_mutex_init(&c->mu, NULL);
  return (PyObject *)c;
}

/* ---- buffer arguments ---- */

typedef struct {
  Py_buffer view; /* view.obj != NULL when a buffer was acquired */
  void *ptr;
} buf_arg;

/* Resolve `obj` to a pointer for `count` elements of `dtype`. `what` names
 * the argument in messages. Returns 0 on success (release with buf_release). */
static int buf_get(PyObject *obj, int writable, size_t count, td_dtype dtype, const char *what, buf_arg *out) {
  memset(out, 0, sizeof *out);
  size_t need = count * td_dtype_size(dtype);
  if (obj == Py_None) {
    if (count != 0) {
      PyErr_Format(PyExc_ValueError, "tandem: %s is None but count is %zu", what, count);
      return -1;
    }
    return 0;
  }
  if (PyLong_Check(obj)) {
    void *p = PyLong_AsVoidPtr(obj);
    if (!p && PyErr_Occurred()) return -1;
    if (!p && count != 0) {
      PyErr_Format(PyExc_ValueError, "tandem: %s is a null address but count is %zu", what, count);
      return -1;
    }
    out->ptr = p;
    return 0;
  }
  int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(obj, &out->view, flags) != 0) {
    if (!PyObject_CheckBuffer(obj)) {
      PyErr_Clear();
      PyErr_Format(PyExc_TypeError,
                   "tandem: %s must support the buffer protocol (a NumPy array, bytearray, memoryview) "
                   "or be an int address, not %.100s",
                   what, Py_TYPE(obj)->tp_name);
    } else {
      PyObject *t, *v, *tb;
      PyErr_Fetch(&t, &v, &tb);
      PyObject *s = v ? PyObject_Str(v) : NULL;
      PyErr_Format(PyExc_ValueError, "tandem: %s must be a %sC-contiguous buffer (%s)", what,
                   writable ? "writable " : "", s ? PyUnicode_AsUTF8(s) : "?");
      Py_XDECREF(s);
      Py_XDECREF(t);
      Py_XDECREF(v);
      Py_XDECREF(tb);
    }
    memset(&out->view, 0, sizeof out->view);
    return -1;
  }
  if ((size_t)out->view.len < need) {
    PyErr_Format(PyExc_ValueError, "tandem: %s holds %zd bytes but %zu elements of %s need %zu", what,
                 out->view.len, count, td_dtype_name(dtype), need);
    PyBuffer_Release(&out->view);
    memset(&out->view, 0, sizeof out->view);
    return -1;
  }
  out->ptr = out->view.buf;
  return 0;
}

static void buf_release(buf_arg *b) {
  if (b->view.obj) PyBuffer_Release(&b->view);
  memset(&b->view, 0, sizeof b->view);
}

static int parse_dtype(int v, td_dtype *out) {
  if (v < 0 || v >= TD_DTYPE_COUNT) {
    PyErr_Format(PyExc_ValueError, "tandem: unknown dtype code %d (use tandem.F32 ... tandem.U8)", v);
    return -1;
  }
  *out = (td_dtype)v;
  return 0;
}

static int parse_op(int v, td_op *out) {
  if (v < 0 || v >= TD_OP_COUNT) {
    PyErr_Format(PyExc_ValueError, "tandem: unknown op code %d (use tandem.SUM, AVG, MIN, MAX, PROD)", v);
    return -1;
  }
  *out = (td_op)v;
  return 0;
}

static int parse_count(Py_ssize_t v, size_t *out) {
  if (v < 0) {
    PyErr_Format(PyExc_ValueError, "tandem: count must be >= 0, got %zd", v);
    return -1;
  }
  *out = (size_t)v;
  return 0;
}

static int check_root(CommObject *c, int root, const char *what) {
  int n = td_comm_size(c->comm);
  if (root < 0 || root >= n) {
    PyErr_Format(PyExc_ValueError, "tandem: %s %d is out of range for a world of %d ranks", what, root, n);
    return -1;
  }
  return 0;
}

/* ---- Request ---- */

typedef struct {
  PyObject_HEAD
  td_request *req;  /* NULL once completed (or while a thread waits on it) */
  CommObject *comm; /* keeps the communicator alive while the request is pending */
  buf_arg bufs[2];
  PyObject *keep;   /* objects owning int-address buffers, released at completion */
  PyObject *result; /* what wait() returns */
  int done;
  int waiting;
  td_status status;
  PyObject *error_msg; /* str, when status != TD_OK */
} RequestObject;

static PyTypeObject RequestType;

/* Completion on the GIL-holding thread: drop the buffers, remember the status. */
static void request_complete(RequestObject *r, td_status st) {
  r->done = 1;
  r->status = st;
  if (st != TD_OK) {
    const char *msg = td_last_error();
    if ((!msg || !*msg) && r->comm && r->comm->comm) msg = td_comm_last_error(r->comm->comm);
    r->error_msg = PyUnicode_FromString(msg ? msg : "");
    if (!r->error_msg) PyErr_Clear();
  }
  buf_release(&r->bufs[0]);
  buf_release(&r->bufs[1]);
  Py_CLEAR(r->keep);
}

static PyObject *request_outcome(RequestObject *r) {
  if (r->status != TD_OK)
    return raise_status(r->status, r->error_msg ? PyUnicode_AsUTF8(r->error_msg) : td_status_str(r->status));
  PyObject *res = r->result ? r->result : Py_None;
  Py_INCREF(res);
  return res;
}

static PyObject *Request_wait(RequestObject *r, PyObject *unused) {
  if (r->done) return request_outcome(r);
  if (r->waiting) return raise_status(TD_ERR_INVALID_USAGE, "tandem: another thread is already waiting on this request");
  td_request *req = r->req;
  r->waiting = 1;
  td_status st;
  Py_BEGIN_ALLOW_THREADS st = td_wait(req);
  Py_END_ALLOW_THREADS
  r->waiting = 0;
  r->req = NULL;
  request_complete(r, st);
  return request_outcome(r);
}

/* True once complete (the outcome, error or not, is then reported by wait()). */
static PyObject *Request_test(RequestObject *r, PyObject *unused) {
  if (r->done) Py_RETURN_TRUE;
  if (r->waiting) Py_RETURN_FALSE;
  int done = 0;
  td_status st = td_test(r->req, &done);
  if (!done) Py_RETURN_FALSE;
  r->req = NULL;
  request_complete(r, st);
  Py_RETURN_TRUE;
}

static PyObject *Request_get_done(RequestObject *r, void *closure) { return PyBool_FromLong(r->done); }

static void Request_dealloc(RequestObject *r) {
  /* An abandoned pending request still owns memory the progress thread uses:
   * finish it first (it ends: errors are sticky and every op has a deadline). */
  if (r->req && !r->waiting) {
    td_request *req = r->req;
    r->req = NULL;
    Py_BEGIN_ALLOW_THREADS td_wait(req);
    Py_END_ALLOW_THREADS
  }
  buf_release(&r->bufs[0]);
  buf_release(&r->bufs[1]);
  Py_CLEAR(r->keep);
  Py_CLEAR(r->result);
  Py_CLEAR(r->error_msg);
  Py_CLEAR(r->comm);
  Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyMethodDef Request_methods[] = {
    {"wait", (PyCFunction)Request_wait, METH_NOARGS,
     "Block (without the GIL) until the operation completes; return its result or raise its TandemError."},
    {"test", (PyCFunction)Request_test, METH_NOARGS, "True if the operation has completed (wait() then returns at once)."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Request_getset[] = {{"done", (getter)Request_get_done, NULL, "completed", NULL},
                                       {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject RequestType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tandem._tandem.Request",
    .tp_basicsize = sizeof(RequestObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A pending non-blocking collective; owns its buffers until it completes.",
    .tp_dealloc = (destructor)Request_dealloc,
    .tp_methods = Request_methods,
    .tp_getset = Request_getset,
};

/* A new request owning `bufs` (moved) and references to keep/result. */
static PyObject *request_new(CommObject *c, td_request *req, buf_arg *bufs, int n_bufs, PyObject *keep,
                             PyObject *result) {
  RequestObject *r = PyObject_New(RequestObject, &RequestType);
  if (!r) {
    /* Cannot own it: complete it here so the buffers outlive the operation. */
    Py_BEGIN_ALLOW_THREADS td_wait(req);
    Py_END_ALLOW_THREADS
    for (int i = 0; i < n_bufs; i++) buf_release(&bufs[i]);
    return NULL;
  }
  r->req = req;
  Py_INCREF(c);
  r->comm = c;
  memset(r->bufs, 0, sizeof r->bufs);
  for (int i = 0; i < n_bufs; i++) {
    r->bufs[i] = bufs[i];
    memset(&bufs[i], 0, sizeof bufs[i]);
  }
  r->keep = keep && keep != Py_None ? (Py_INCREF(keep), keep) : NULL;
  r->result = result && result != Py_None ? (Py_INCREF(result), result) : NULL;
  r->done = 0;
  r->waiting = 0;
  r->status = TD_OK;
  r->error_msg = NULL;
  return (PyObject *)r;
}

/* ---- collectives ----
 * Each has a blocking form and an i-form (same arguments plus keep=None,
 * result=None) returning a Request. */

enum coll_kind { K_ALLREDUCE, K_REDUCE, K_BROADCAST, K_REDUCE_SCATTER, K_ALLGATHER, K_ALLTOALL, K_SEND, K_RECV };

/* Element counts the send and receive buffers must hold for `kind`. */
static void coll_extent(enum coll_kind kind, size_t count, int size, int rank, size_t *send_n, size_t *recv_n) {
  size_t off, len;
  switch (kind) {
  case K_REDUCE_SCATTER:
    td_shard_range(count, size, rank, &off, &len);
    *send_n = count;
    *recv_n = len;
    break;
  case K_ALLGATHER:
    td_shard_range(count, size, rank, &off, &len);
    *send_n = len;
    *recv_n = count;
    break;
  case K_ALLTOALL:
    *send_n = count * (size_t)size;
    *recv_n = count * (size_t)size;
    break;
  default: *send_n = *recv_n = count; break;
  }
}

typedef struct {
  enum coll_kind kind;
  int has_op, has_root, has_recv, nonblocking;
  const char *name;
} coll_desc;

static td_status coll_issue(const coll_desc *d, CommObject *c, void *send, void *recv, size_t count, td_dtype dt,
                            td_op op, int root, td_request **req) {
  td_comm *comm = c->comm;
  if (!d->nonblocking) {
    switch (d->kind) {
    case K_ALLREDUCE: return td_allreduce(send, recv, count, dt, op, comm);
    case K_REDUCE: return td_reduce(send, recv, count, dt, op, root, comm);
    case K_BROADCAST: return td_broadcast(send, count, dt, root, comm);
    case K_REDUCE_SCATTER: return td_reduce_scatter(send, recv, count, dt, op, comm);
    case K_ALLGATHER: return td_allgather(send, recv, count, dt, comm);
    case K_ALLTOALL: return td_alltoall(send, recv, count, dt, comm);
    case K_SEND: return td_send(send, count, dt, root, comm);
    case K_RECV: return td_recv(send, count, dt, root, comm);
    }
  } else {
    switch (d->kind) {
    case K_ALLREDUCE: return td_iallreduce(send, recv, count, dt, op, comm, req);
    case K_REDUCE: return td_ireduce(send, recv, count, dt, op, root, comm, req);
    case K_BROADCAST: return td_ibroadcast(send, count, dt, root, comm, req);
    case K_REDUCE_SCATTER: return td_ireduce_scatter(send, recv, count, dt, op, comm, req);
    case K_ALLGATHER: return td_iallgather(send, recv, count, dt, comm, req);
    case K_ALLTOALL: return td_ialltoall(send, recv, count, dt, comm, req);
    case K_SEND: return td_isend(send, count, dt, root, comm, req);
    case K_RECV: return td_irecv(send, count, dt, root, comm, req);
    }
  }
  return TD_ERR_INTERNAL;
}

/* The common body: parse (send[, recv], count, dtype[, op][, root][, keep, result]). */
static PyObject *coll_call(const coll_desc *d, CommObject *c, PyObject *args, PyObject *kwargs) {
  PyObject *send_o = Py_None, *recv_o = Py_None, *keep = Py_None, *result = Py_None;
  Py_ssize_t count_v = 0;
  int dtype_v = 0, op_v = TD_SUM, root = 0;
  /* Build the keyword list for this collective's shape. */
  static char *kw_ar[] = {"send", "recv", "count", "dtype", "op", "keep", "result", NULL};
  static char *kw_red[] = {"send", "recv", "count", "dtype", "op", "root", "keep", "result", NULL};
  static char *kw_bc[] = {"buf", "count", "dtype", "root", "keep", "result", NULL};
  static char *kw_ag[] = {"send", "recv", "count", "dtype", "keep", "result", NULL};
  static char *kw_p2p[] = {"buf", "count", "dtype", "peer", "keep", "result", NULL};
  int ok;
  switch (d->kind) {
  case K_ALLREDUCE:
  case K_REDUCE_SCATTER:
    ok = PyArg_ParseTupleAndKeywords(args, kwargs, "OOnii|OO", kw_ar, &send_o, &recv_o, &count_v, &dtype_v, &op_v, &keep,
                                     &result);
    break;
  case K_REDUCE:
    ok = PyArg_ParseTupleAndKeywords(args, kwargs, "OOniii|OO", kw_red, &send_o, &recv_o, &count_v, &dtype_v, &op_v,
                                     &root, &keep, &result);
    break;
  case K_BROADCAST:
    ok = PyArg_ParseTupleAndKeywords(args, kwargs, "Oni|iOO", kw_bc, &send_o, &count_v, &dtype_v, &root, &keep,
                                     &result);
    break;
  case K_ALLGATHER:
  case K_ALLTOALL:
    ok = PyArg_ParseTupleAndKeywords(args, kwargs, "OOni|OO", kw_ag, &send_o, &recv_o, &count_v, &dtype_v, &keep,
                                     &result);
    break;
  default:
    ok = PyArg_ParseTupleAndKeywords(args, kwargs, "Onii|OO", kw_p2p, &send_o, &count_v, &dtype_v, &root, &keep,
                                     &result);
    break;
  }
  if (!ok) return NULL;
  if (!comm_usable(c)) return NULL;
  size_t count;
  td_dtype dt;
  td_op op = TD_SUM;
  if (parse_count(count_v, &count) || parse_dtype(dtype_v, &dt)) return NULL;
  if (d->has_op && parse_op(op_v, &op)) return NULL;
  if (d->has_root && check_root(c, root, d->kind == K_SEND || d->kind == K_RECV ? "peer" : "root")) return NULL;
  if (count > (SIZE_MAX / 16) / (size_t)td_comm_size(c->comm)) {
    PyErr_Format(PyExc_ValueError, "tandem: count %zu is too large", count);
    return NULL;
  }
  size_t send_n, recv_n;
  coll_extent(d->kind, count, td_comm_size(c->comm), td_comm_rank(c->comm), &send_n, &recv_n);
  buf_arg bufs[2];
  memset(bufs, 0, sizeof bufs);
  int write_first = d->kind == K_BROADCAST || d->kind == K_RECV;
  int in_place = d->has_recv && recv_o == send_o && send_o != Py_None && !PyLong_Check(send_o);
  size_t first_n = in_place && recv_n > send_n ? recv_n : send_n;
  if (buf_get(send_o, write_first || in_place, first_n, dt, in_place ? "buffer" : d->has_recv ? "send" : "buf",
              &bufs[0]))
    return NULL;
  int n_bufs = 1;
  if (d->has_recv) {
    if (in_place) {
      bufs[1].ptr = bufs[0].ptr; /* one view serves both roles */
    } else {
      /* reduce's recv matters only at the root */
      size_t need = d->kind == K_REDUCE && root != td_comm_rank(c->comm) && recv_o == Py_None ? 0 : recv_n;
      if (buf_get(recv_o, 1, need, dt, "recv", &bufs[1])) {
        buf_release(&bufs[0]);
        return NULL;
      }
    }
    n_bufs = 2;
  }
  /* An in-place call must pass the very same address (comm.h's layout rules):
   * the acquired views may alias one object, which is fine. */
  td_status st;
  td_request *req = NULL;
  void *sp = bufs[0].ptr, *rp = n_bufs > 1 ? bufs[1].ptr : NULL;
  if (d->kind == K_ALLGATHER && in_place && sp) {
    size_t off, len;
    td_shard_range(count, td_comm_size(c->comm), td_comm_rank(c->comm), &off, &len);
    sp = (char *)rp + off * td_dtype_size(dt); /* in place: the own shard already sits in recv */
  }
  if (d->kind == K_REDUCE_SCATTER && in_place && sp) {
    size_t off, len;
    td_shard_range(count, td_comm_size(c->comm), td_comm_rank(c->comm), &off, &len);
    rp = (char *)sp + off * td_dtype_size(dt);
  }
  if (d->nonblocking) {
    comm_lock(c);
    st = coll_issue(d, c, sp, rp, count, dt, op, root, &req);
    pthread_mutex_unlock(&c->mu);
  } else {
    Py_BEGIN_ALLOW_THREADS pthread_mutex_lock(&c->mu);
    st = coll_issue(d, c, sp, rp, count, dt, op, root, &req);
    pthread_mutex_unlock(&c->mu);
    Py_END_ALLOW_THREADS
  }
  if (st != TD_OK) {
    for (int i = 0; i < n_bufs; i++) buf_release(&bufs[i]);
    return raise_last(st, c->comm);
  }
  if (!d->nonblocking) {
    for (int i = 0; i < n_bufs; i++) buf_release(&bufs[i]);
    PyObject *res = result != Py_None ? result : Py_None;
    Py_INCREF(res);
    return res;
  }
  return request_new(c, req, bufs, n_bufs, keep, result);
}

#define COLL(fn, K, OP, ROOT, RECV, NB)                                                                               \
  static PyObject *Comm_##fn(CommObject *c, PyObject *args, PyObject *kw) {                                          \
    static const coll_desc d = {K, OP, ROOT, RECV, NB, #fn};                                                          \
    return coll_call(&d, c, args, kw);                                                                                \
  }
COLL(allreduce, K_ALLREDUCE, 1, 0, 1, 0)
COLL(iallreduce, K_ALLREDUCE, 1, 0, 1, 1)
COLL(reduce, K_REDUCE, 1, 1, 1, 0)
COLL(ireduce, K_REDUCE, 1, 1, 1, 1)
COLL(broadcast, K_BROADCAST, 0, 1, 0, 0)
COLL(ibroadcast, K_BROADCAST, 0, 1, 0, 1)
COLL(reduce_scatter, K_REDUCE_SCATTER, 1, 0, 1, 0)
COLL(ireduce_scatter, K_REDUCE_SCATTER, 1, 0, 1, 1)
COLL(allgather, K_ALLGATHER, 0, 0, 1, 0)
COLL(iallgather, K_ALLGATHER, 0, 0, 1, 1)
COLL(alltoall, K_ALLTOALL, 0, 0, 1, 0)
COLL(ialltoall, K_ALLTOALL, 0, 0, 1, 1)
COLL(send, K_SEND, 0, 1, 0, 0)
COLL(isend, K_SEND, 0, 1, 0, 1)
COLL(recv, K_RECV, 0, 1, 0, 0)
COLL(irecv, K_RECV, 0, 1, 0, 1)

static PyObject *Comm_barrier(CommObject *c, PyObject *unused) {
  if (!comm_usable(c)) return NULL;
  td_status st;
  Py_BEGIN_ALLOW_THREADS pthread_mutex_lock(&c->mu);
  st = td_barrier(c->comm);
  pthread_mutex_unlock(&c->mu);
  Py_END_ALLOW_THREADS
  if (st != TD_OK) return raise_last(st, c->comm);
  Py_RETURN_NONE;
}

static PyObject *Comm_ibarrier(CommObject *c, PyObject *unused) {
  if (!comm_usable(c)) return NULL;
  td_request *req = NULL;
  comm_lock(c);
  td_status st = td_ibarrier(c->comm, &req);
  pthread_mutex_unlock(&c->mu);
  if (st != TD_OK) return raise_last(st, c->comm);
  return request_new(c, req, NULL, 0, NULL, NULL);
}

static PyObject *Comm_rank(CommObject *c, PyObject *u) {
  return comm_usable(c) ? PyLong_FromLong(td_comm_rank(c->comm)) : NULL;
}
static PyObject *Comm_size(CommObject *c, PyObject *u) {
  return comm_usable(c) ? PyLong_FromLong(td_comm_size(c->comm)) : NULL;
}
static PyObject *Comm_local_rank(CommObject *c, PyObject *u) {
  return comm_usable(c) ? PyLong_FromLong(td_comm_local_rank(c->comm)) : NULL;
}
static PyObject *Comm_local_size(CommObject *c, PyObject *u) {
  return comm_usable(c) ? PyLong_FromLong(td_comm_local_size(c->comm)) : NULL;
}
static PyObject *Comm_transport(CommObject *c, PyObject *u) {
  return comm_usable(c) ? PyUnicode_FromString(td_comm_transport(c->comm)) : NULL;
}
static PyObject *Comm_status(CommObject *c, PyObject *u) {
  return PyLong_FromLong(c->comm ? td_comm_status(c->comm) : TD_ERR_INVALID_USAGE);
}
static PyObject *Comm_last_error(CommObject *c, PyObject *u) {
  return PyUnicode_FromString(c->comm ? td_comm_last_error(c->comm) : "");
}

/* Collective: wait for pending operations and leave together. Later calls
 * raise; the C communicator is destroyed when the last reference goes. */
static PyObject *Comm_finalize(CommObject *c, PyObject *u) {
  if (!c->comm || c->finalized) Py_RETURN_NONE;
  td_status st;
  Py_BEGIN_ALLOW_THREADS pthread_mutex_lock(&c->mu);
  st = td_comm_finalize(c->comm);
  pthread_mutex_unlock(&c->mu);
  Py_END_ALLOW_THREADS
  c->finalized = 1;
  if (st != TD_OK) return raise_last(st, c->comm);
  Py_RETURN_NONE;
}

static PyObject *Comm_abort(CommObject *c, PyObject *args) {
  const char *reason = "aborted from Python";
  if (!PyArg_ParseTuple(args, "|s", &reason)) return NULL;
  if (c->comm) td_comm_abort(c->comm, reason);
  Py_RETURN_NONE;
}

static PyObject *Comm_split(CommObject *c, PyObject *args) {
  int color, key;
  if (!PyArg_ParseTuple(args, "ii", &color, &key)) return NULL;
  if (!comm_usable(c)) return NULL;
  td_comm *out = NULL;
  td_status st;
  Py_BEGIN_ALLOW_THREADS pthread_mutex_lock(&c->mu);
  st = td_comm_split(c->comm, color, key, &out);
  pthread_mutex_unlock(&c->mu);
  Py_END_ALLOW_THREADS
  if (st != TD_OK) return raise_last(st, c->comm);
  if (!out) Py_RETURN_NONE;
  return comm_wrap(out);
}

#define KWM(fn, doc) {#fn, (PyCFunction)(void (*)(void))Comm_##fn, METH_VARARGS | METH_KEYWORDS, doc}
static PyMethodDef Comm_methods[] = {
    KWM(allreduce, "allreduce(send, recv, count, dtype, op): blocking; send is recv for in place"),
    KWM(iallreduce, "iallreduce(send, recv, count, dtype, op, keep=None, result=None) -> Request"),
    KWM(reduce, "reduce(send, recv, count, dtype, op, root)"),
    KWM(ireduce, "ireduce(send, recv, count, dtype, op, root, keep=None, result=None) -> Request"),
    KWM(broadcast, "broadcast(buf, count, dtype, root=0)"),
    KWM(ibroadcast, "ibroadcast(buf, count, dtype, root=0, keep=None, result=None) -> Request"),
    KWM(reduce_scatter, "reduce_scatter(send, recv, count, dtype, op): recv gets shard td_shard_range(count)"),
    KWM(ireduce_scatter, "ireduce_scatter(...) -> Request"),
    KWM(allgather, "allgather(send, recv, count, dtype): send is this rank's shard of count"),
    KWM(iallgather, "iallgather(...) -> Request"),
    KWM(alltoall, "alltoall(send, recv, count, dtype): count elements per rank block"),
    KWM(ialltoall, "ialltoall(...) -> Request"),
    KWM(send, "send(buf, count, dtype, peer)"),
    KWM(isend, "isend(buf, count, dtype, peer, keep=None) -> Request"),
    KWM(recv, "recv(buf, count, dtype, peer)"),
    KWM(irecv, "irecv(buf, count, dtype, peer, keep=None) -> Request"),
    {"barrier", (PyCFunction)Comm_barrier, METH_NOARGS, "barrier()"},
    {"ibarrier", (PyCFunction)Comm_ibarrier, METH_NOARGS, "ibarrier() -> Request"},
    {"rank", (PyCFunction)Comm_rank, METH_NOARGS, NULL},
    {"size", (PyCFunction)Comm_size, METH_NOARGS, NULL},
    {"local_rank", (PyCFunction)Comm_local_rank, METH_NOARGS, NULL},
    {"local_size", (PyCFunction)Comm_local_size, METH_NOARGS, NULL},
    {"transport", (PyCFunction)Comm_transport, METH_NOARGS, "'self', 'shm' or 'tcp'"},
    {"status", (PyCFunction)Comm_status, METH_NOARGS, "0, or the sticky error status"},
    {"last_error", (PyCFunction)Comm_last_error, METH_NOARGS, "the first error's message, '' if none"},
    {"finalize", (PyCFunction)Comm_finalize, METH_NOARGS, "collective orderly shutdown"},
    {"abort", (PyCFunction)Comm_abort, METH_VARARGS, "abort(reason): break the communicator on every rank"},
    {"split", (PyCFunction)Comm_split, METH_VARARGS, "split(color, key) -> Comm or None"},
    {NULL, NULL, 0, NULL}};

static PyTypeObject CommType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tandem._tandem.Comm",
    .tp_basicsize = sizeof(CommObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A Tandem communicator (td_comm); create with tandem._tandem.init().",
    .tp_dealloc = (destructor)Comm_dealloc,
    .tp_methods = Comm_methods,
};

/* ---- module functions ---- */

/* init(rank=-1, world_size=0, store=None, job_id=None, transport=None, timeout=0.0) -> Comm.
 * With no arguments the world comes from the environment (tandemrun, MPI,
 * Slurm, torchrun) or is a world of one. Blocks (without the GIL) until all
 * ranks joined. */
static PyObject *mod_init(PyObject *self, PyObject *args, PyObject *kwargs) {
  static char *kw[] = {"rank", "world_size", "store", "job_id", "transport", "timeout", NULL};
  int rank = -1, world = 0;
  const char *store = NULL, *job = NULL, *transport = NULL;
  double timeout = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|iizzzd", kw, &rank, &world, &store, &job, &transport, &timeout))
    return NULL;
  if (world < 0 || (world > 0 && (rank < 0 || rank >= world))) {
    PyErr_Format(PyExc_ValueError, "tandem: rank %d is out of range for world_size %d", rank, world);
    return NULL;
  }
  if (timeout < 0) {
    PyErr_Format(PyExc_ValueError, "tandem: timeout must be >= 0, got %g", timeout);
    return NULL;
  }
  td_comm_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.rank = world > 0 ? rank : 0;
  cfg.world_size = world;
  cfg.store = store;
  cfg.job_id = job;
  cfg.transport = transport;
  cfg.timeout_s = timeout;
  td_comm *comm = NULL;
  td_status st;
  Py_BEGIN_ALLOW_THREADS st = td_comm_init_config(&cfg, &comm);
  Py_END_ALLOW_THREADS
  if (st != TD_OK) return raise_last(st, NULL);
  return comm_wrap(comm);
}

static PyObject *mod_dtype_size(PyObject *self, PyObject *arg) {
  long v = PyLong_AsLong(arg);
  if (v == -1 && PyErr_Occurred()) return NULL;
  td_dtype dt;
  if (parse_dtype((int)v, &dt)) return NULL;
  return PyLong_FromSize_t(td_dtype_size(dt));
}

static PyObject *mod_status_str(PyObject *self, PyObject *arg) {
  long v = PyLong_AsLong(arg);
  if (v == -1 && PyErr_Occurred()) return NULL;
  return PyUnicode_FromString(td_status_str((td_status)v));
}

/* Raise the exception class of a status: lets Python code report failures
 * it detects (a Horovod-level mismatch) the same way as the C library. */
static PyObject *mod_raise_status(PyObject *self, PyObject *args) {
  int st;
  const char *msg;
  if (!PyArg_ParseTuple(args, "is", &st, &msg)) return NULL;
  return raise_status((td_status)st, msg);
}

/* host_store(bind_host) -> (server, port): start a Tandem rendezvous store
 * in this process on bind_host and a port the kernel picks; it runs in its
 * own thread until `server` (a capsule) is released. For launchers that
 * serve a store Tandem cannot use on the port it would take (torchrun's
 * agent holds MASTER_PORT): rank 0 hosts this one and publishes its address
 * through the launcher's store (tandem/__init__.py). Connections to it are
 * authenticated with the job's secret, as every store's. */
static void store_capsule_free(PyObject *cap) {
  td_store_server *server = PyCapsule_GetPointer(cap, "tandem._tandem.StoreServer");
  Py_BEGIN_ALLOW_THREADS store_server_stop(server);
  Py_END_ALLOW_THREADS
}

static PyObject *mod_host_store(PyObject *self, PyObject *args) {
  const char *host;
  if (!PyArg_ParseTuple(args, "s", &host)) return NULL;
  td_store_server *server = NULL;
  td_status st;
  Py_BEGIN_ALLOW_THREADS st = store_server_start(host, 0, &server);
  Py_END_ALLOW_THREADS
  if (st != TD_OK) return raise_last(st, NULL);
  PyObject *cap = PyCapsule_New(server, "tandem._tandem.StoreServer", store_capsule_free);
  if (!cap) {
    store_server_stop(server);
    return NULL;
  }
  return Py_BuildValue("(Ni)", cap, store_server_port(server));
}

static PyMethodDef module_methods[] = {
    {"init", (PyCFunction)(void (*)(void))mod_init, METH_VARARGS | METH_KEYWORDS,
     "init(rank=-1, world_size=0, store=None, job_id=None, transport=None, timeout=0.0) -> Comm"},
    {"host_store", mod_host_store, METH_VARARGS,
     "host_store(bind_host) -> (server, port): a rendezvous store in this process, until server is released"},
    {"dtype_size", mod_dtype_size, METH_O, "bytes per element of a dtype code"},
    {"status_str", mod_status_str, METH_O, "the name of a status code"},
    {"raise_status", mod_raise_status, METH_VARARGS, "raise_status(status, message): raise its TandemError class"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "tandem._tandem",
                                        "CPython binding of Tandem's C ABI.", -1, module_methods};

static PyObject *new_error(PyObject *m, const char *name, PyObject *bases, const char *doc) {
  char full[128];
  snprintf(full, sizeof full, "tandem.%s", name);
  PyObject *cls = PyErr_NewExceptionWithDoc(full, doc, bases, NULL);
  if (cls && PyModule_AddObjectRef(m, name, cls) < 0) Py_CLEAR(cls);
  return cls;
}

static td_comm *api_comm_of(void *obj) {
  PyObject *o = (PyObject *)obj;
  if (!PyObject_TypeCheck(o, &CommType)) {
    PyErr_SetString(PyExc_TypeError, "tandem: expected a tandem._tandem.Comm");
    return NULL;
  }
  CommObject *c = (CommObject *)o;
  return comm_usable(c) ? c->comm : NULL;
}

static const tandem_py_api py_api = {
    TANDEM_PY_API_VERSION, td_iallreduce, td_ireduce, td_ibroadcast, td_ireduce_scatter, td_iallgather,
    td_ialltoall,          td_ibarrier,   td_isend,     td_irecv,     td_wait,            td_test,
    td_last_error,         td_comm_last_error, td_status_str, api_comm_of};

PyMODINIT_FUNC PyInit__tandem(void) {
  if (PyType_Ready(&CommType) < 0 || PyType_Ready(&RequestType) < 0) return NULL;
  PyObject *m = PyModule_Create(&module_def);
  if (!m) return NULL;
  PyObject *cap = PyCapsule_New((void *)&py_api, "tandem._tandem._C_API", NULL);
  if (!cap || PyModule_AddObject(m, "_C_API", cap) < 0) {
    Py_XDECREF(cap);
    goto fail;
  }
  if (PyModule_AddObjectRef(m, "Comm", (PyObject *)&CommType) < 0 ||
      PyModule_AddObjectRef(m, "Request", (PyObject *)&RequestType) < 0)
    goto fail;
  TandemError = new_error(m, "TandemError", PyExc_RuntimeError,
                          "A Tandem operation failed; .status is the td_status code, .status_name its name.");
  if (!TandemError) goto fail;
  PyObject *b;
  RemoteError = new_error(m, "RemoteError", TandemError, "Another rank died, closed its connection or aborted.");
  MismatchError = new_error(m, "MismatchError", TandemError, "Ranks disagree on a collective.");
  b = PyTuple_Pack(2, TandemError, PyExc_TimeoutError);
  TandemTimeoutError = b ? new_error(m, "TandemTimeoutError", b, "An operation exceeded TANDEM_TIMEOUT.") : NULL;
  Py_XDECREF(b);
  b = PyTuple_Pack(2, TandemError, PyExc_ValueError);
  InvalidArgumentError = b ? new_error(m, "InvalidArgumentError", b, "Tandem rejected an argument.") : NULL;
  Py_XDECREF(b);
  InvalidUsageError = new_error(m, "InvalidUsageError", TandemError, "A call in the wrong state (shut down).");
  if (!RemoteError || !MismatchError || !TandemTimeoutError || !InvalidArgumentError || !InvalidUsageError) goto fail;
  static const struct {
    const char *name;
    int value;
  } consts[] = {{"F32", TD_F32},   {"F64", TD_F64},   {"F16", TD_F16},   {"BF16", TD_BF16},
                {"I32", TD_I32},   {"I64", TD_I64},   {"U8", TD_U8},     {"SUM", TD_SUM},
                {"AVG", TD_AVG},   {"MIN", TD_MIN},   {"MAX", TD_MAX},   {"PROD", TD_PROD},
                {"OK", TD_OK},     {"ERR_REMOTE", TD_ERR_REMOTE},       {"ERR_MISMATCH", TD_ERR_MISMATCH},
                {"ERR_TIMEOUT", TD_ERR_TIMEOUT}, {"ERR_INVALID_ARGUMENT", TD_ERR_INVALID_ARGUMENT},
                {"ERR_INVALID_USAGE", TD_ERR_INVALID_USAGE}};
  for (size_t i = 0; i < sizeof consts / sizeof consts[0]; i++)
    if (PyModule_AddIntConstant(m, consts[i].name, consts[i].value) < 0) goto fail;
  return m;
fail:
  Py_DECREF(m);
  return NULL;
}
