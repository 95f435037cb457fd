/* A test double of libnccl.so.2 (tests/cudaemu.suite): the NCCL entry points
 * that src/comm/device/nccl.c loads, implemented on the host for the ranks
 * of one machine, so that Tandem's NCCL path (dlopen and the symbol and
 * version checks, the path vote and the id exchange through the store, the
 * mapping of each collective onto NCCL calls: uneven shards as grouped
 * reduces and broadcasts, alltoall as grouped send/recv, and the host wait on
 * an event) runs in CI, where there is neither a GPU nor NCCL. Built as
 * build/cudaemu/tests/fake_nccl/libnccl.so.2 and found through
 * LD_LIBRARY_PATH. It runs in the emulator tree, where device memory is host
 * memory, so it can read and write the buffers it is given.
 *
 * How it moves data: ncclGetUniqueId draws a random name; every rank maps
 * the shared-memory file of that name, which holds a generation barrier and
 * one slot of SLOT_BYTES per rank. Every collective runs when called (calls
 * inside ncclGroupStart/End when the group ends, in call order), in chunks:
 * each rank copies its part of the chunk into its slot, barrier, each rank
 * computes its result from all slots, barrier. The stream is ignored: the
 * work is done when the call returns, which the host wait then sees at
 * once. Waits sleep 20 us between polls and give up (abort) after 60 s, so a
 * broken test fails instead of hanging. Only what Tandem sends through NCCL
 * is implemented (nccl.c's nccl_supports). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define SLOT_BYTES ((size_t)1 << 20)
#define MAX_RANKS 64
#define MAX_GROUP 256

typedef struct { char internal[128]; } ncclUniqueId;
typedef int ncclResult_t;
enum { ncclSuccess = 0, ncclInvalidArgument = 4, ncclInternalError = 3 };
enum { ncclInt8 = 0, ncclUint8 = 1, ncclInt32 = 2, ncclUint32 = 3, ncclInt64 = 4, ncclUint64 = 5, ncclFloat16 = 6,
       ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9 };
enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 };

typedef struct shared {
  _Atomic uint64_t arrived;
  char pad[56];
  /* then MAX_RANKS slots of SLOT_BYTES */
} shared;

struct ncclComm {
  int rank, n;
  shared *sh;
  size_t map_bytes;
  uint64_t barriers;
  char name[128];
};
typedef struct ncclComm *ncclComm_t;

/* ---- queued calls of a group ---- */
typedef enum { OP_ALLREDUCE, OP_REDUCE, OP_BCAST, OP_RS, OP_AG, OP_SEND, OP_RECV } op_kind;
typedef struct call {
  op_kind kind;
  const void *send;
  void *recv;
  size_t count;
  int dtype, op, root, peer;
  ncclComm_t comm;
} call;
static call group[MAX_GROUP];
static int group_depth, group_n;

ncclResult_t ncclGetVersion(int *v) {
  *v = 22800; /* claims 2.28, the lent machine's */
  return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) { return r == ncclSuccess ? "no error" : "fake NCCL error"; }

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  memset(id, 0, sizeof *id);
  uint64_t token = 0;
  if (getrandom(&token, sizeof token, 0) != sizeof token) return ncclInternalError;
  snprintf(id->internal, sizeof id->internal, "/tandem-fake-nccl-%016llx", (unsigned long long)token);
  return ncclSuccess;
}

static char *slot(ncclComm_t c, int r) { return (char *)(c->sh + 1) + (size_t)r * SLOT_BYTES; }

static void barrier(ncclComm_t c) {
  uint64_t target = (++c->barriers) * (uint64_t)c->n;
  atomic_fetch_add(&c->sh->arrived, 1);
  struct timespec ts = {0, 20000};
  for (long polls = 0; atomic_load(&c->sh->arrived) < target; polls++) {
    if (polls > 3000000) { /* 60 s */
      fprintf(stderr, "fake NCCL rank %d: a peer never arrived\n", c->rank);
      abort();
    }
    nanosleep(&ts, NULL);
  }
}

ncclResult_t ncclCommInitRank(ncclComm_t *out, int n, ncclUniqueId id, int rank) {
  if (n < 1 || n > MAX_RANKS || rank < 0 || rank >= n || id.internal[0] != '/') return ncclInvalidArgument;
  ncclComm_t c = calloc(1, sizeof *c);
  if (!c) return ncclInternalError;
  c->rank = rank;
  c->n = n;
  snprintf(c->name, sizeof c->name, "%s", id.internal);
  c->map_bytes = sizeof(shared) + (size_t)MAX_RANKS * SLOT_BYTES;
  int fd = shm_open(c->name, O_CREAT | O_RDWR, 0600);
  if (fd < 0 || ftruncate(fd, (off_t)c->map_bytes) != 0) {
    free(c);
    return ncclInternalError;
  }
  c->sh = mmap(NULL, c->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (c->sh == MAP_FAILED) {
    free(c);
    return ncclInternalError;
  }
  barrier(c); /* everyone mapped it */
  if (rank == 0) shm_unlink(c->name);
  *out = c;
  return ncclSuccess;
}

static ncclResult_t destroy(ncclComm_t c) {
  if (!c) return ncclSuccess;
  munmap(c->sh, c->map_bytes);
  free(c);
  return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t c) { return destroy(c); }
ncclResult_t ncclCommAbort(ncclComm_t c) { return destroy(c); }

/* ---- element arithmetic ---- */
static size_t dsize(int dt) {
  switch (dt) {
  case ncclInt8: case ncclUint8: return 1;
  case ncclFloat16: case ncclBfloat16: return 2;
  case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
  default: return 8;
  }
}

/* acc[i] = acc[i] op x[i] for the types Tandem sends here (floats: SUM,
 * PROD, AVG; integers: SUM, PROD, MIN, MAX with wrap-around). */
static void combine(void *acc, const void *x, size_t n, int dt, int op) {
#define COMBINE(T)                                                              \
  do {                                                                          \
    T *a = acc;                                                                 \
    const T *b = x;                                                             \
    for (size_t i = 0; i < n; i++) {                                            \
      if (op == ncclSum || op == ncclAvg) a[i] = (T)(a[i] + b[i]);              \
      else if (op == ncclProd) a[i] = (T)(a[i] * b[i]);                         \
      else if (op == ncclMax) a[i] = a[i] > b[i] ? a[i] : b[i];                 \
      else a[i] = a[i] < b[i] ? a[i] : b[i];                                    \
    }                                                                           \
  } while (0)
  switch (dt) {
  case ncclUint8: COMBINE(uint8_t); break;
  case ncclInt8: COMBINE(int8_t); break;
  case ncclInt32: COMBINE(uint32_t); break; /* wraps as two's complement; min/max below */
  case ncclInt64: COMBINE(uint64_t); break;
  case ncclFloat32: COMBINE(float); break;
  case ncclFloat64: COMBINE(double); break;
  default: abort(); /* half types never come here (nccl.c declines them) */
  }
#undef COMBINE
}

static void combine_signed(void *acc, const void *x, size_t n, int dt, int op) {
  if ((op == ncclMax || op == ncclMin) && dt == ncclInt32) {
    int32_t *a = acc;
    const int32_t *b = x;
    for (size_t i = 0; i < n; i++) a[i] = op == ncclMax ? (a[i] > b[i] ? a[i] : b[i]) : (a[i] < b[i] ? a[i] : b[i]);
  } else if ((op == ncclMax || op == ncclMin) && dt == ncclInt64) {
    int64_t *a = acc;
    const int64_t *b = x;
    for (size_t i = 0; i < n; i++) a[i] = op == ncclMax ? (a[i] > b[i] ? a[i] : b[i]) : (a[i] < b[i] ? a[i] : b[i]);
  } else {
    combine(acc, x, n, dt, op);
  }
}

static void finish_avg(void *acc, size_t n, int dt, int op, int ranks) {
  if (op != ncclAvg) return;
  if (dt == ncclFloat32)
    for (size_t i = 0; i < n; i++) ((float *)acc)[i] /= (float)ranks;
  else if (dt == ncclFloat64)
    for (size_t i = 0; i < n; i++) ((double *)acc)[i] /= ranks;
}

/* Reduce count elements over ranks: every rank publishes send, `out` (may be
 * NULL: not this rank's result) gets the reduction of [first, first+len)
 * of each chunk. The general engine behind allreduce, reduce and
 * reduce-scatter. */
static void reduce_range(ncclComm_t c, const char *send, size_t count, int dt, int op, char *out, size_t first,
                         size_t len) {
  size_t es = dsize(dt), per = SLOT_BYTES / es;
  for (size_t base = 0; base < count; base += per) {
    size_t m = count - base < per ? count - base : per;
    memcpy(slot(c, c->rank), send + base * es, m * es);
    barrier(c);
    size_t lo = first > base ? first : base, hi = first + len < base + m ? first + len : base + m;
    if (out && lo < hi) {
      char *dst = out + (lo - first) * es;
      memcpy(dst, slot(c, 0) + (lo - base) * es, (hi - lo) * es);
      for (int r = 1; r < c->n; r++) combine_signed(dst, slot(c, r) + (lo - base) * es, hi - lo, dt, op);
      finish_avg(dst, hi - lo, dt, op, c->n);
    }
    barrier(c);
  }
}

/* Rank root's count elements into every rank's recv. */
static void bcast(ncclComm_t c, const char *send, char *recv, size_t count, int dt, int root) {
  size_t es = dsize(dt), per = SLOT_BYTES / es;
  for (size_t base = 0; base < count; base += per) {
    size_t m = count - base < per ? count - base : per;
    if (c->rank == root) memcpy(slot(c, root), send + base * es, m * es);
    barrier(c);
    if (recv && (c->rank != root || recv != send)) memcpy(recv + base * es, slot(c, root), m * es);
    barrier(c);
  }
}

static void run(const call *k) {
  ncclComm_t c = k->comm;
  size_t es = dsize(k->dtype);
  switch (k->kind) {
  case OP_ALLREDUCE:
    reduce_range(c, k->send, k->count, k->dtype, k->op, k->recv, 0, k->count);
    break;
  case OP_REDUCE:
    reduce_range(c, k->send, k->count, k->dtype, k->op, c->rank == k->root ? k->recv : NULL, 0, k->count);
    break;
  case OP_BCAST:
    bcast(c, k->send, k->recv, k->count, k->dtype, k->root);
    break;
  case OP_RS: /* recv gets block `rank` of the reduced n * count input */
    reduce_range(c, k->send, k->count * (size_t)c->n, k->dtype, k->op, k->recv, (size_t)c->rank * k->count, k->count);
    break;
  case OP_AG:
    for (int r = 0; r < c->n; r++)
      bcast(c, r == c->rank ? k->send : NULL, (char *)k->recv + (size_t)r * k->count * es, k->count, k->dtype, r);
    break;
  default:
    break;
  }
  (void)es;
}

/* A group of sends and receives: every rank's group holds one send and one
 * receive per peer (Tandem's alltoall); run as rounds of one (sender,
 * receiver) pair shift each: round s, rank r sends to r+s and receives from
 * r-s. */
static void run_p2p(call *calls, int n_calls) {
  ncclComm_t c = calls[0].comm;
  for (int s = 0; s < c->n; s++) {
    int to = (c->rank + s) % c->n, from = (c->rank - s + c->n) % c->n;
    const call *snd = NULL, *rcv = NULL;
    for (int i = 0; i < n_calls; i++) {
      if (calls[i].kind == OP_SEND && calls[i].peer == to) snd = &calls[i];
      if (calls[i].kind == OP_RECV && calls[i].peer == from) rcv = &calls[i];
    }
    size_t es = snd ? dsize(snd->dtype) : rcv ? dsize(rcv->dtype) : 1, per = SLOT_BYTES / es;
    size_t count = snd ? snd->count : rcv ? rcv->count : 0;
    for (size_t base = 0; base < count || base == 0; base += per) {
      size_t m = count - base < per ? count - base : per;
      if (snd) memcpy(slot(c, c->rank), (const char *)snd->send + base * es, m * es);
      barrier(c);
      if (rcv) memcpy((char *)rcv->recv + base * es, slot(c, from), m * es);
      barrier(c);
      if (count == 0) break;
    }
  }
}

static ncclResult_t submit(call k) {
  bool reduces = k.kind == OP_ALLREDUCE || k.kind == OP_REDUCE || k.kind == OP_RS;
  bool half = k.dtype == ncclFloat16 || k.dtype == ncclBfloat16;
  if (!k.comm || k.dtype < ncclInt8 || k.dtype > ncclBfloat16 || (reduces && half))
    return ncclInvalidArgument; /* Tandem sends no half-type reduction here by default */
  if (group_depth > 0) {
    if (group_n == MAX_GROUP) return ncclInternalError;
    group[group_n++] = k;
    return ncclSuccess;
  }
  run(&k);
  return ncclSuccess;
}

ncclResult_t ncclGroupStart(void) {
  group_depth++;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
  if (group_depth == 0) return ncclInvalidArgument;
  if (--group_depth > 0) return ncclSuccess;
  int n = group_n;
  group_n = 0;
  if (n && (group[0].kind == OP_SEND || group[0].kind == OP_RECV)) {
    run_p2p(group, n);
    return ncclSuccess;
  }
  for (int i = 0; i < n; i++) run(&group[i]);
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, int dt, int op, ncclComm_t c, void *stream) {
  return submit((call){OP_ALLREDUCE, s, r, n, dt, op, 0, -1, c});
}
ncclResult_t ncclReduce(const void *s, void *r, size_t n, int dt, int op, int root, ncclComm_t c, void *stream) {
  return submit((call){OP_REDUCE, s, r, n, dt, op, root, -1, c});
}
ncclResult_t ncclBroadcast(const void *s, void *r, size_t n, int dt, int root, ncclComm_t c, void *stream) {
  return submit((call){OP_BCAST, s, r, n, dt, ncclSum, root, -1, c});
}
ncclResult_t ncclReduceScatter(const void *s, void *r, size_t n, int dt, int op, ncclComm_t c, void *stream) {
  return submit((call){OP_RS, s, r, n, dt, op, 0, -1, c});
}
ncclResult_t ncclAllGather(const void *s, void *r, size_t n, int dt, ncclComm_t c, void *stream) {
  return submit((call){OP_AG, s, r, n, dt, ncclSum, 0, -1, c});
}
ncclResult_t ncclSend(const void *s, size_t n, int dt, int peer, ncclComm_t c, void *stream) {
  if (group_depth == 0) return ncclInvalidArgument; /* Tandem only sends inside a group */
  return submit((call){OP_SEND, s, NULL, n, dt, ncclSum, 0, peer, c});
}
ncclResult_t ncclRecv(void *r, size_t n, int dt, int peer, ncclComm_t c, void *stream) {
  if (group_depth == 0) return ncclInvalidArgument;
  return submit((call){OP_RECV, NULL, r, n, dt, ncclSum, 0, peer, c});
}
