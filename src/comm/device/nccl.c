/* The NCCL path for collectives on device buffers: used when every rank
 * of the communicator has a GPU of its own (device_coll.c decides).
 *
 * libnccl.so.2 is loaded with dlopen, never linked: a build or a machine
 * without NCCL still runs everything through the staged path, and says so.
 * The few entry points used are declared here with NCCL's documented ABI
 * (nccl.h, stable since 2.x; ncclBfloat16 and ncclAvg need 2.10), so no
 * CUDA or NCCL header is needed to compile this file.
 *
 * One NCCL communicator and one stream per Tandem communicator (STYLE.md);
 * the NCCL id travels through the rendezvous store, whose connections are
 * authenticated (device_coll.c).
 *
 * Tandem's semantics that NCCL does not give are declined (nccl_supports),
 * and those operations take the staged path, which every rank then takes
 * alike (the decision depends only on op and the tunables):
 *   - float MIN/MAX: Tandem returns the canonical NaN if any input is NaN
 *     and orders -0 below +0 (tandem/base.h); NCCL does not promise either.
 *   - integer AVG: Tandem divides the wrapped sum, truncating; ncclAvg is
 *     for floating types.
 *   - f16/bf16 SUM/PROD/AVG: Tandem rounds once (f32 partials); NCCL's ring
 *     rounds at every hop, which is what TANDEM_HALF_PARTIALS=half accepts,
 *     so with that setting they run on NCCL.
 * Shards that are not all equal (count % n != 0) run as grouped
 * reduce/broadcast per owner, alltoall as grouped send/recv.
 *
 * Waiting: NCCL itself would wait forever for a dead peer. The host waits
 * for an event behind the operation in slices of at most 1 ms of sleep,
 * and between slices checks the communicator's health (a failure a peer
 * reported, the transport's own check, the liveness of local peers'
 * processes) and the deadline; on a failure it aborts the NCCL
 * communicator, which unblocks the stream, and fails with a message naming
 * the rank. */
#include "comm/device/device_coll.h"

#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

typedef struct ncclComm *ncclComm_t;
typedef struct { char internal[NCCL_ID_BYTES]; } ncclUniqueId;
typedef int ncclResult_t; /* ncclSuccess = 0 */
enum { ncclInt8 = 0, ncclUint8 = 1, ncclInt32 = 2, ncclUint32 = 3, ncclInt64 = 4, ncclUint64 = 5, ncclFloat16 = 6,
       ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9 };
enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 };
typedef void *cudaStream_t;

static struct {
  void *lib;
  int version;
  char why[256];
  bool tried;
  ncclResult_t (*get_version)(int *);
  ncclResult_t (*get_unique_id)(ncclUniqueId *);
  ncclResult_t (*comm_init_rank)(ncclComm_t *, int, ncclUniqueId, int);
  ncclResult_t (*comm_destroy)(ncclComm_t);
  ncclResult_t (*comm_abort)(ncclComm_t);
  const char *(*get_error_string)(ncclResult_t);
  ncclResult_t (*all_reduce)(const void *, void *, size_t, int, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*reduce)(const void *, void *, size_t, int, int, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*broadcast)(const void *, void *, size_t, int, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*reduce_scatter)(const void *, void *, size_t, int, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*all_gather)(const void *, void *, size_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*send)(const void *, size_t, int, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*recv)(void *, size_t, int, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*group_start)(void);
  ncclResult_t (*group_end)(void);
} nccl;

static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;

#define NCCL_MIN_VERSION 21000 /* 2.10: bf16 and ncclAvg */

static bool load(void) {
  nccl.lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (!nccl.lib) {
    snprintf(nccl.why, sizeof nccl.why, "libnccl.so.2 not found (%s)", dlerror());
    return false;
  }
  struct { void **slot; const char *name; } syms[] = {
      {(void **)&nccl.get_version, "ncclGetVersion"},       {(void **)&nccl.get_unique_id, "ncclGetUniqueId"},
      {(void **)&nccl.comm_init_rank, "ncclCommInitRank"},  {(void **)&nccl.comm_destroy, "ncclCommDestroy"},
      {(void **)&nccl.comm_abort, "ncclCommAbort"},         {(void **)&nccl.get_error_string, "ncclGetErrorString"},
      {(void **)&nccl.all_reduce, "ncclAllReduce"},         {(void **)&nccl.reduce, "ncclReduce"},
      {(void **)&nccl.broadcast, "ncclBroadcast"},          {(void **)&nccl.reduce_scatter, "ncclReduceScatter"},
      {(void **)&nccl.all_gather, "ncclAllGather"},         {(void **)&nccl.send, "ncclSend"},
      {(void **)&nccl.recv, "ncclRecv"},                    {(void **)&nccl.group_start, "ncclGroupStart"},
      {(void **)&nccl.group_end, "ncclGroupEnd"},
  };
  for (size_t i = 0; i < TD_ARRAY_SIZE(syms); i++) {
    *syms[i].slot = dlsym(nccl.lib, syms[i].name);
    if (!*syms[i].slot) {
      snprintf(nccl.why, sizeof nccl.why, "libnccl.so.2 lacks %s", syms[i].name);
      return false;
    }
  }
  if (nccl.get_version(&nccl.version) != 0 || nccl.version < NCCL_MIN_VERSION) {
    snprintf(nccl.why, sizeof nccl.why, "NCCL %d is older than 2.10", nccl.version);
    return false;
  }
  return true;
}

bool nccl_loadable(char *why, size_t why_size) {
  pthread_mutex_lock(&load_mu);
  if (!nccl.tried) {
    nccl.tried = true;
    if (!load() && nccl.lib) {
      dlclose(nccl.lib);
      nccl.lib = NULL;
    }
  }
  bool ok = nccl.lib != NULL;
  if (!ok) snprintf(why, why_size, "%s", nccl.why);
  pthread_mutex_unlock(&load_mu);
  return ok;
}

int nccl_version(void) { return nccl.version; }

static td_status nccl_error(ncclResult_t r, const char *what) {
  return td_error(TD_ERR_SYSTEM, "NCCL %s failed: %s (NCCL_DEBUG=WARN says more)", what, nccl.get_error_string(r));
}

td_status nccl_make_id(unsigned char id[NCCL_ID_BYTES]) {
  ncclUniqueId uid;
  ncclResult_t r = nccl.get_unique_id(&uid);
  if (r != 0) return nccl_error(r, "ncclGetUniqueId");
  memcpy(id, uid.internal, NCCL_ID_BYTES);
  return TD_OK;
}

struct nccl_state {
  td_device dev;
  ncclComm_t nc;
  td_stream *stream;
  td_event *done;
  bool broken;
};

void nccl_destroy(nccl_state *ns, bool abort_it) {
  if (!ns) return;
  if (ns->nc) {
    if (abort_it || ns->broken) nccl.comm_abort(ns->nc);
    else nccl.comm_destroy(ns->nc);
  }
  td_event_destroy(ns->done);
  td_stream_destroy(ns->stream);
  td_free(ns);
}

td_status nccl_create(td_comm *comm, td_device dev, const unsigned char id[NCCL_ID_BYTES], nccl_state **out) {
  *out = NULL;
  nccl_state *ns = td_alloc(sizeof *ns);
  if (!ns) return td_error(TD_ERR_SYSTEM, "NCCL: out of memory");
  memset(ns, 0, sizeof *ns);
  ns->dev = dev;
  td_status st = td_stream_create(dev, &ns->stream);
  if (st == TD_OK) st = td_event_create(dev, &ns->done);
  if (st == TD_OK) {
    ncclUniqueId uid;
    memcpy(uid.internal, id, NCCL_ID_BYTES);
    ncclResult_t r = nccl.comm_init_rank(&ns->nc, comm->size, uid, comm->rank);
    if (r != 0) {
      ns->nc = NULL;
      st = td_error(TD_ERR_SYSTEM, "rank %d: NCCL ncclCommInitRank on cuda:%d failed: %s (NCCL_DEBUG=WARN says "
                    "more; TANDEM_DEVICE_COLL=staged avoids NCCL)",
                    comm->rank, dev.index, nccl.get_error_string(r));
    }
  }
  if (st != TD_OK) {
    nccl_destroy(ns, true);
    return st;
  }
  *out = ns;
  return TD_OK;
}

static int nccl_dtype(td_dtype d) {
  switch (d) {
  case TD_F32: return ncclFloat32;
  case TD_F64: return ncclFloat64;
  case TD_F16: return ncclFloat16;
  case TD_BF16: return ncclBfloat16;
  case TD_I32: return ncclInt32;
  case TD_I64: return ncclInt64;
  case TD_U8: return ncclUint8;
  default: return -1;
  }
}

static int nccl_op(td_op op) {
  switch (op) {
  case TD_SUM: return ncclSum;
  case TD_AVG: return ncclAvg;
  case TD_MIN: return ncclMin;
  case TD_MAX: return ncclMax;
  case TD_PROD: return ncclProd;
  default: return -1;
  }
}

static bool is_float(td_dtype d) { return d == TD_F32 || d == TD_F64 || d == TD_F16 || d == TD_BF16; }

bool nccl_supports(const td_comm *comm, const comm_op *op) {
  if (nccl_dtype(op->dtype) < 0) return false;
  bool reduces = op->kind == COMM_ALLREDUCE || op->kind == COMM_REDUCE || op->kind == COMM_REDUCE_SCATTER;
  if (!reduces) return op->kind == COMM_BROADCAST || op->kind == COMM_ALLGATHER || op->kind == COMM_ALLTOALL;
  if (is_float(op->dtype) && (op->redop == TD_MIN || op->redop == TD_MAX)) return false;
  if (!is_float(op->dtype) && op->redop == TD_AVG) return false;
  bool half = op->dtype == TD_F16 || op->dtype == TD_BF16;
  return !half || comm->tun.half_partials;
}

/* A local peer's process is gone (kill -9 leaves no word behind). */
static int dead_local_peer(const td_comm *comm) {
  for (int i = 0; i < comm->local_size; i++) {
    int r = comm->local_ranks[i];
    if (r != comm->rank && kill(comm->pids[r], 0) != 0 && errno == ESRCH) return r;
  }
  return -1;
}

static td_status wait_done(td_comm *comm, nccl_state *ns, const comm_op *op) {
  char what[160];
  comm_op_describe(op, what, sizeof what);
  td_status st = td_event_record(ns->done, ns->stream);
  if (st != TD_OK) return comm_fail(comm, st, "rank %d: NCCL %s: %s", comm->rank, what, td_last_error());
  long sleep_ns = 1000;
  for (int polls = 0;; polls++) {
    bool done = false;
    st = td_event_query(ns->done, &done);
    if (st != TD_OK) return comm_fail(comm, st, "rank %d: NCCL %s: %s", comm->rank, what, td_last_error());
    if (done) return TD_OK;
    td_status health = comm_status(comm);
    if (health == TD_OK && comm->xport && comm->xport->vtbl->op_done) health = comm->xport->vtbl->op_done(comm->xport);
    int dead = -1;
    if (health == TD_OK && polls % 64 == 63) dead = dead_local_peer(comm);
    if (health == TD_OK && dead < 0 && td_now() <= op->deadline) {
      struct timespec ts = {0, sleep_ns};
      nanosleep(&ts, NULL);
      if (sleep_ns < 1000000) sleep_ns *= 2;
      continue;
    }
    /* Unblock the stream before anyone frees the buffers. */
    ns->broken = true;
    nccl.comm_abort(ns->nc);
    ns->nc = NULL;
    if (dead >= 0)
      return comm_fail(comm, TD_ERR_REMOTE, "rank %d: NCCL %s: rank %d (pid %ld) died", comm->rank, what, dead,
                       (long)comm->pids[dead]);
    if (health != TD_OK) return comm_fail(comm, health, "%s", comm->err_msg);
    return comm_fail(comm, TD_ERR_TIMEOUT, "rank %d: NCCL %s did not finish within %g s (TANDEM_TIMEOUT)", comm->rank,
                     what, comm->timeout_s);
  }
}

td_status nccl_execute(td_comm *comm, nccl_state *ns, const comm_op *op) {
  if (ns->broken || !ns->nc)
    return comm_fail(comm, TD_ERR_INVALID_USAGE, "rank %d: the NCCL communicator was aborted after a failure",
                     comm->rank);
  cudaStream_t s = td_stream_native(ns->stream);
  int dt = nccl_dtype(op->dtype), rop = nccl_op(op->redop), n = comm->size;
  size_t es = td_dtype_size(op->dtype), off, len;
  const char *send = op->send;
  char *recv = op->recv;
  bool even = op->count % (size_t)n == 0;
  ncclResult_t r = 0;
  switch (op->kind) {
  case COMM_ALLREDUCE: r = nccl.all_reduce(send, recv, op->count, dt, rop, ns->nc, s); break;
  case COMM_REDUCE: r = nccl.reduce(send, recv, op->count, dt, rop, op->root, ns->nc, s); break;
  case COMM_BROADCAST: r = nccl.broadcast(send, recv, op->count, dt, op->root, ns->nc, s); break;
  case COMM_REDUCE_SCATTER:
    if (even) {
      r = nccl.reduce_scatter(send, recv, op->count / (size_t)n, dt, rop, ns->nc, s);
      break;
    }
    /* Uneven shards: a reduce to each owner, grouped into one launch. */
    nccl.group_start();
    for (int j = 0; j < n && r == 0; j++) {
      td_shard_range(op->count, n, j, &off, &len);
      if (len) r = nccl.reduce(send + off * es, j == comm->rank ? recv : NULL, len, dt, rop, j, ns->nc, s);
    }
    if (nccl.group_end() != 0 && r == 0) r = 1;
    break;
  case COMM_ALLGATHER:
    if (even) {
      r = nccl.all_gather(send, recv, op->count / (size_t)n, dt, ns->nc, s);
      break;
    }
    nccl.group_start();
    for (int j = 0; j < n && r == 0; j++) {
      td_shard_range(op->count, n, j, &off, &len);
      if (len) r = nccl.broadcast(j == comm->rank ? send : NULL, recv + off * es, len, dt, j, ns->nc, s);
    }
    if (nccl.group_end() != 0 && r == 0) r = 1;
    break;
  case COMM_ALLTOALL:
    nccl.group_start();
    for (int j = 0; j < n && r == 0; j++) {
      r = nccl.send(send + (size_t)j * op->count * es, op->count, dt, j, ns->nc, s);
      if (r == 0) r = nccl.recv(recv + (size_t)j * op->count * es, op->count, dt, j, ns->nc, s);
    }
    if (nccl.group_end() != 0 && r == 0) r = 1;
    break;
  default:
    return comm_fail(comm, TD_ERR_INTERNAL, "NCCL path: %s is not a device collective", comm_kind_name(op->kind));
  }
  if (r != 0) {
    char what[160];
    comm_op_describe(op, what, sizeof what);
    nccl_error(r, what);
    return comm_fail(comm, TD_ERR_SYSTEM, "rank %d: %s", comm->rank, td_last_error());
  }
  return wait_done(comm, ns, op);
}
