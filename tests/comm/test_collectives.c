/* Multi-rank collective tests, run through tandemrun on loopback:
 *
 *   $RUN -np N build/tests/test_collectives [options]
 *
 * Sweeps allreduce, reduce, broadcast, reduce_scatter, allgather, alltoall,
 * barrier, send/recv, split and the non-blocking forms over counts (0, 1,
 * small primes, counts not divisible by the world size, optionally 1M+3),
 * every dtype and op, in place and out of place, roots 0 and last. Results
 * are checked against closed-form values: inputs are small integers (sums
 * stay within +-100, products are powers of two up to 8 with signs), so every
 * dtype holds every partial result exactly whatever the algorithm's order;
 * only avg on floating types may differ from the reference by one rounding
 * (the library may scale by a reciprocal). Transports and algorithms are
 * chosen by the environment (TANDEM_TRANSPORT, TANDEM_ALLREDUCE_ALGO,
 * TANDEM_SHM_COLLECTIVES), so the suite runs this binary under a matrix.
 *
 * Options (comma-separated lists):
 *   --colls allreduce,reduce,broadcast,reduce_scatter,allgather,alltoall,
 *           barrier,sendrecv,split,nonblocking,p2p_any_order   (default: all)
 *           (p2p_any_order: every rank posts all irecvs before its isends, MPI style)
 *   --dtypes f32,f64,f16,bf16,i32,i64,u8            (default: all)
 *   --ops sum,avg,min,max,prod                      (default: all)
 *   --counts 0,1,7,...                              (default: 0,1,2,7,31,257,4099,3n+1)
 *   --large    also run a few collectives on 1M+3 elements
 *   --quick    counts 0,1,13,3n+1 and dtypes f32,bf16,i64,u8 (for big worlds)
 * Exits non-zero on the first wrong element or failed call, printing the
 * collective, its arguments, the index, the value and the expected value. */
#include "../common/check.h"
#include "comm_test_util.h"

#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

enum {
  C_ALLREDUCE = 1 << 0,
  C_REDUCE = 1 << 1,
  C_BROADCAST = 1 << 2,
  C_REDUCE_SCATTER = 1 << 3,
  C_ALLGATHER = 1 << 4,
  C_ALLTOALL = 1 << 5,
  C_BARRIER = 1 << 6,
  C_SENDRECV = 1 << 7,
  C_SPLIT = 1 << 8,
  C_NONBLOCKING = 1 << 9,
  C_P2P_ANY_ORDER = 1 << 10,
};
static const char *coll_names[] = {"allreduce", "reduce", "broadcast", "reduce_scatter", "allgather",
                                   "alltoall", "barrier", "sendrecv", "split", "nonblocking", "p2p_any_order"};

#define MAX_COUNTS 32
static struct {
  unsigned colls;
  unsigned dtypes; /* bit per td_dtype */
  unsigned ops;    /* bit per td_op */
  size_t counts[MAX_COUNTS];
  int n_counts;
  int large;
} opt;

static td_comm *comm;
static int rank_, nranks;
static long n_checks;

#define LARGE_COUNT ((size_t)1048576 + 3)

/* A call that must succeed; on failure prints the communicator's message. */
#define COMM_OK(expr)                                                                              \
  do {                                                                                             \
    td_status s_ = (expr);                                                                         \
    if (s_ != TD_OK)                                                                               \
      td_test_fail(__FILE__, __LINE__, "%s returned %s: %s", #expr, td_status_str(s_),             \
                   comm ? td_comm_last_error(comm) : td_last_error());                             \
  } while (0)

static void *xalloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  CHECK(p != NULL);
  return p;
}

/* ---- closed-form inputs and results ---- */

/* Never produced by any input or result below (sums stay <= 100, gathered
 * values <= 250): marks elements the library must overwrite. */
#define SENTINEL 253.0

static void fill_sentinel(void *buf, size_t n, td_dtype dtype) {
  for (size_t i = 0; i < n; i++) td_dtype_set(buf, i, dtype, SENTINEL);
}

static double red_input(int rank, size_t i, td_op op, td_dtype dtype) {
  if (op == TD_PROD) {
    if ((i + (size_t)rank) % 3 == 0) return 2;
    if (dtype != TD_U8 && (i * 5 + (size_t)rank) % 7 == 3) return -1;
    return 1;
  }
  double v = (double)(1 + (i * 7 + (size_t)rank * 3) % 11);
  /* Negative values exercise signed min/max/sum; avg stays non-negative so
   * that "integer division" has one meaning. */
  if (op != TD_AVG && dtype != TD_U8) v -= 4;
  return v;
}

static double red_expected(int n, size_t i, td_op op, td_dtype dtype) {
  double acc = red_input(0, i, op, dtype);
  for (int r = 1; r < n; r++) {
    double v = red_input(r, i, op, dtype);
    acc = td_op_apply((td_op)op, acc, v);
  }
  if (op == TD_AVG) {
    if (dtype == TD_F64) acc = acc / n;
    else if (ct_is_float(dtype)) acc = (double)((float)acc / (float)n);
    else acc = (double)((int64_t)acc / n);
  }
  return ct_round(acc, dtype);
}

static void check_red(const char *what, const void *buf, size_t at, size_t i, td_op op, td_dtype dtype, size_t count,
                      int in_place, int root) {
  double got = td_dtype_get(buf, at, dtype), want = red_expected(nranks, i, op, dtype);
  int ok = got == want;
  if (!ok && op == TD_AVG && ct_is_float(dtype)) {
    double eps = dtype == TD_F64 ? 0x1p-52 : dtype == TD_F32 ? 0x1p-23 : dtype == TD_F16 ? 0x1p-10 : 0x1p-7;
    ok = fabs(got - want) <= 2 * eps * fabs(want);
  }
  if (!ok)
    td_test_fail(__FILE__, __LINE__, "%s(count %zu, %s, %s, %s, root %d) on %d ranks: element %zu = %.9g, expected %.9g",
                 what, count, td_dtype_name(dtype), td_op_name(op), in_place ? "in place" : "out of place", root, nranks,
                 i, got, want);
}

static double gather_value(size_t i) { return (double)((i * 13 + 5) % 251); }
static double bcast_value(size_t i, int root) { return (double)((i * 13 + (size_t)root * 7 + 3) % 251); }
static double a2a_value(int src, int dst, size_t i) {
  return (double)(((size_t)src * 31 + (size_t)dst * 17 + i * 3) % 251);
}

static void check_value(const char *what, double got, double want, size_t i, td_dtype dtype, size_t count,
                        int in_place, int root) {
  if (got != want)
    td_test_fail(__FILE__, __LINE__, "%s(count %zu, %s, %s, root %d) on %d ranks: element %zu = %.9g, expected %.9g",
                 what, count, td_dtype_name(dtype), in_place ? "in place" : "out of place", root, nranks, i, got, want);
}

/* ---- one collective, one configuration ---- */

static void t_allreduce(size_t count, td_dtype dt, td_op op, int in_place) {
  size_t es = td_dtype_size(dt);
  void *send = xalloc(count * es), *recv = xalloc(count * es);
  void *in = in_place ? recv : send;
  for (size_t i = 0; i < count; i++) td_dtype_set(in, i, dt, red_input(rank_, i, op, dt));
  if (!in_place) fill_sentinel(recv, count, dt);
  COMM_OK(td_allreduce(count ? in : NULL, count ? recv : NULL, count, dt, op, comm));
  for (size_t i = 0; i < count; i++) check_red("allreduce", recv, i, i, op, dt, count, in_place, -1);
  /* out of place must leave the input untouched */
  if (!in_place)
    for (size_t i = 0; i < count; i++)
      check_value("allreduce input", td_dtype_get(send, i, dt), ct_round(red_input(rank_, i, op, dt), dt), i, dt, count, 0, -1);
  n_checks++;
  free(send);
  free(recv);
}

static void t_reduce(size_t count, td_dtype dt, td_op op, int in_place, int root) {
  size_t es = td_dtype_size(dt);
  void *send = xalloc(count * es), *recv = xalloc(count * es);
  void *in = in_place ? recv : send;
  for (size_t i = 0; i < count; i++) td_dtype_set(in, i, dt, red_input(rank_, i, op, dt));
  if (!in_place) fill_sentinel(recv, count, dt);
  /* Non-roots may pass NULL as recv (it is ignored there) when not in place. */
  void *out = (!in_place && rank_ != root && (count % 2)) ? NULL : recv;
  COMM_OK(td_reduce(count ? in : NULL, count ? out : NULL, count, dt, op, root, comm));
  if (rank_ == root)
    for (size_t i = 0; i < count; i++) check_red("reduce", recv, i, i, op, dt, count, in_place, root);
  n_checks++;
  free(send);
  free(recv);
}

static void t_broadcast(size_t count, td_dtype dt, int root) {
  void *buf = xalloc(count * td_dtype_size(dt));
  for (size_t i = 0; i < count; i++) td_dtype_set(buf, i, dt, rank_ == root ? bcast_value(i, root) : SENTINEL);
  COMM_OK(td_broadcast(count ? buf : NULL, count, dt, root, comm));
  for (size_t i = 0; i < count; i++) check_value("broadcast", td_dtype_get(buf, i, dt), bcast_value(i, root), i, dt, count, 1, root);
  n_checks++;
  free(buf);
}

static void t_reduce_scatter(size_t count, td_dtype dt, td_op op, int in_place) {
  size_t es = td_dtype_size(dt), off, len;
  td_shard_range(count, nranks, rank_, &off, &len);
  void *full = xalloc(count * es), *recv = xalloc(len * es);
  for (size_t i = 0; i < count; i++) td_dtype_set(full, i, dt, red_input(rank_, i, op, dt));
  fill_sentinel(recv, len, dt);
  void *out = in_place ? (char *)full + off * es : recv;
  COMM_OK(td_reduce_scatter(count ? full : NULL, count ? out : NULL, count, dt, op, comm));
  for (size_t i = 0; i < len; i++) check_red("reduce_scatter", out, i, off + i, op, dt, count, in_place, -1);
  n_checks++;
  free(full);
  free(recv);
}

static void t_allgather(size_t count, td_dtype dt, int in_place) {
  size_t es = td_dtype_size(dt), off, len;
  td_shard_range(count, nranks, rank_, &off, &len);
  void *recv = xalloc(count * es), *send = xalloc(len * es);
  fill_sentinel(recv, count, dt);
  for (size_t i = 0; i < len; i++) td_dtype_set(in_place ? recv : send, in_place ? off + i : i, dt, gather_value(off + i));
  const void *in = in_place ? (char *)recv + off * es : send;
  COMM_OK(td_allgather(count ? in : NULL, count ? recv : NULL, count, dt, comm));
  for (size_t i = 0; i < count; i++) check_value("allgather", td_dtype_get(recv, i, dt), gather_value(i), i, dt, count, in_place, -1);
  n_checks++;
  free(recv);
  free(send);
}

static void t_alltoall(size_t count, td_dtype dt) {
  size_t es = td_dtype_size(dt), total = count * (size_t)nranks;
  void *send = xalloc(total * es), *recv = xalloc(total * es);
  for (int dst = 0; dst < nranks; dst++)
    for (size_t i = 0; i < count; i++) td_dtype_set(send, (size_t)dst * count + i, dt, a2a_value(rank_, dst, i));
  fill_sentinel(recv, total, dt);
  COMM_OK(td_alltoall(count ? send : NULL, count ? recv : NULL, count, dt, comm));
  for (int src = 0; src < nranks; src++)
    for (size_t i = 0; i < count; i++)
      check_value("alltoall", td_dtype_get(recv, (size_t)src * count + i, dt), a2a_value(src, rank_, i), (size_t)src * count + i,
                  dt, count, 0, -1);
  n_checks++;
  free(send);
  free(recv);
}

/* Barrier semantics on one host: CLOCK_MONOTONIC is shared by the processes,
 * so no rank may leave before the last one arrived. The last rank arrives
 * late on purpose. */
static void t_barrier(void) {
  for (int round = 0; round < 3; round++) {
    int late = (round + nranks - 1) % nranks;
    if (rank_ == late) usleep(20000);
    double arrive = ct_now();
    COMM_OK(td_barrier(comm));
    double leave = ct_now();
    double *arrivals = xalloc(sizeof(double) * (size_t)nranks);
    COMM_OK(td_allgather(&arrive, arrivals, (size_t)nranks, TD_F64, comm));
    for (int r = 0; r < nranks; r++)
      if (leave < arrivals[r])
        td_test_fail(__FILE__, __LINE__, "barrier round %d: rank %d left at %.6f before rank %d arrived at %.6f", round,
                     rank_, leave, r, arrivals[r]);
    free(arrivals);
    n_checks++;
  }
}

/* Ring exchange: blocking (even ranks send first) and non-blocking with
 * several messages of different sizes in flight per pair, matched in order. */
static void t_sendrecv(td_dtype dt, int any_order) {
  if (nranks < 2) return;
  int next = (rank_ + 1) % nranks, prev = (rank_ + nranks - 1) % nranks;
  size_t es = td_dtype_size(dt);
  size_t counts[] = {1, 0, 4099, 31};
  enum { NM = 4 };
  /* blocking */
  for (int m = 0; m < NM; m++) {
    size_t count = counts[m];
    void *out = xalloc(count * es), *in = xalloc(count * es);
    for (size_t i = 0; i < count; i++) td_dtype_set(out, i, dt, a2a_value(rank_, next, i + (size_t)m));
    fill_sentinel(in, count, dt);
    if (rank_ % 2 == 0) {
      COMM_OK(td_send(count ? out : NULL, count, dt, next, comm));
      COMM_OK(td_recv(count ? in : NULL, count, dt, prev, comm));
    } else {
      COMM_OK(td_recv(count ? in : NULL, count, dt, prev, comm));
      COMM_OK(td_send(count ? out : NULL, count, dt, next, comm));
    }
    for (size_t i = 0; i < count; i++)
      check_value("recv (blocking ring)", td_dtype_get(in, i, dt), a2a_value(prev, rank_, i + (size_t)m), i, dt, count, 0, -1);
    free(out);
    free(in);
    n_checks++;
  }
  /* non-blocking: all sends and receives posted before any wait */
  void *outs[NM], *ins[NM];
  td_request *sreq[NM], *rreq[NM];
  for (int m = 0; m < NM; m++) {
    size_t count = counts[m];
    outs[m] = xalloc(count * es);
    ins[m] = xalloc(count * es);
    for (size_t i = 0; i < count; i++) td_dtype_set(outs[m], i, dt, a2a_value(rank_, next, i * 2 + (size_t)m));
    fill_sentinel(ins[m], count, dt);
  }
  /* Even ranks post their send first and odd ranks their receive; with
   * any_order every rank posts all receives before any send, as MPI code
   * does, which must not deadlock either. */
  int recv_first = any_order || rank_ % 2 == 1;
  for (int m = 0; m < NM; m++) {
    if (recv_first) COMM_OK(td_irecv(counts[m] ? ins[m] : NULL, counts[m], dt, prev, comm, &rreq[m]));
    if (!any_order || m == NM - 1)
      for (int k = any_order ? 0 : m; k <= m; k++)
        COMM_OK(td_isend(counts[k] ? outs[k] : NULL, counts[k], dt, next, comm, &sreq[k]));
    if (!recv_first) COMM_OK(td_irecv(counts[m] ? ins[m] : NULL, counts[m], dt, prev, comm, &rreq[m]));
  }
  for (int m = NM - 1; m >= 0; m--) {
    COMM_OK(td_wait(rreq[m]));
    COMM_OK(td_wait(sreq[m]));
  }
  for (int m = 0; m < NM; m++) {
    for (size_t i = 0; i < counts[m]; i++)
      check_value("irecv (ring)", td_dtype_get(ins[m], i, dt), a2a_value(prev, rank_, i * 2 + (size_t)m), i, dt, counts[m], 0, -1);
    free(outs[m]);
    free(ins[m]);
    n_checks++;
  }
}

/* Split into even and odd ranks (keys reversed, so sub-ranks count down),
 * run collectives on each half, then use the parent again. */
static void t_split(void) {
  int color = rank_ % 2;
  td_comm *sub = NULL;
  COMM_OK(td_comm_split(comm, color, -rank_, &sub));
  CHECK(sub != NULL);
  int sub_size = (nranks - color + 1) / 2;
  CHECK_EQ_INT(td_comm_size(sub), sub_size);
  /* members sorted by key -rank: the highest world rank is sub-rank 0 */
  int expect_rank = 0;
  for (int r = rank_ + 1; r < nranks; r++)
    if (r % 2 == color) expect_rank++;
  CHECK_EQ_INT(td_comm_rank(sub), expect_rank);

  /* sum of world ranks of this color and of each member's sub-rank */
  int64_t v[2] = {rank_, td_comm_rank(sub)}, sum_world = 0;
  for (int r = color; r < nranks; r += 2) sum_world += r;
  td_status st = td_allreduce(v, v, 2, TD_I64, TD_SUM, sub);
  if (st != TD_OK) td_test_fail(__FILE__, __LINE__, "allreduce on split: %s: %s", td_status_str(st), td_comm_last_error(sub));
  CHECK_EQ_INT(v[0], sum_world);
  CHECK_EQ_INT(v[1], (int64_t)sub_size * (sub_size - 1) / 2);

  /* broadcast from sub-rank 0 (the highest world rank of the color) */
  int32_t b = td_comm_rank(sub) == 0 ? 1000 + rank_ : -1;
  st = td_broadcast(&b, 1, TD_I32, 0, sub);
  if (st != TD_OK) td_test_fail(__FILE__, __LINE__, "broadcast on split: %s: %s", td_status_str(st), td_comm_last_error(sub));
  int highest = (nranks - 1) % 2 == color ? nranks - 1 : nranks - 2;
  CHECK_EQ_INT(b, 1000 + highest);

  /* Two communicators busy at once (data- and tensor-parallel groups): a
   * non-blocking allreduce on the parent stays in flight while blocking
   * collectives run on the child, each on its own progress path. */
  size_t big = 100003;
  int32_t *wv = xalloc(big * 4);
  for (size_t i = 0; i < big; i++) wv[i] = (int32_t)(i % 5) + rank_;
  td_request *wreq = NULL;
  COMM_OK(td_iallreduce(wv, wv, big, TD_I32, TD_SUM, comm, &wreq));
  for (int k = 0; k < 3; k++) {
    int64_t c = 1;
    st = td_allreduce(&c, &c, 1, TD_I64, TD_SUM, sub);
    if (st != TD_OK) td_test_fail(__FILE__, __LINE__, "allreduce on split while parent busy: %s: %s", td_status_str(st), td_comm_last_error(sub));
    CHECK_EQ_INT(c, sub_size);
  }
  COMM_OK(td_wait(wreq));
  for (size_t i = 0; i < big; i++)
    if (wv[i] != (int32_t)((i % 5) * (size_t)nranks) + nranks * (nranks - 1) / 2)
      td_test_fail(__FILE__, __LINE__, "iallreduce on the parent while the child worked: element %zu = %d", i, wv[i]);
  free(wv);

  /* a second level: split the sub-communicator again (a world of one each) */
  td_comm *single = NULL;
  st = td_comm_split(sub, td_comm_rank(sub), 0, &single);
  if (st != TD_OK) td_test_fail(__FILE__, __LINE__, "nested split: %s: %s", td_status_str(st), td_comm_last_error(sub));
  CHECK(single != NULL);
  CHECK_EQ_INT(td_comm_size(single), 1);
  float f = 3.0f;
  COMM_OK(td_allreduce(&f, &f, 1, TD_F32, TD_SUM, single));
  CHECK(f == 3.0f);
  CHECK_STATUS(td_comm_finalize(single), TD_OK);
  td_comm_destroy(single);

  CHECK_STATUS(td_comm_finalize(sub), TD_OK);
  td_comm_destroy(sub);

  /* a negative color joins no group */
  td_comm *none = (td_comm *)&none;
  COMM_OK(td_comm_split(comm, rank_ == 0 ? -1 : 0, rank_, &none));
  if (rank_ == 0) {
    CHECK(none == NULL);
  } else {
    CHECK(none != NULL);
    CHECK_EQ_INT(td_comm_size(none), nranks - 1);
    CHECK_EQ_INT(td_comm_rank(none), rank_ - 1);
    int32_t one = 1;
    st = td_allreduce(&one, &one, 1, TD_I32, TD_SUM, none);
    if (st != TD_OK) td_test_fail(__FILE__, __LINE__, "allreduce on split: %s: %s", td_status_str(st), td_comm_last_error(none));
    CHECK_EQ_INT(one, nranks - 1);
    CHECK_STATUS(td_comm_finalize(none), TD_OK);
    td_comm_destroy(none);
  }

  /* the parent still works after its children are gone */
  int32_t x = 1;
  COMM_OK(td_allreduce(&x, &x, 1, TD_I32, TD_SUM, comm));
  CHECK_EQ_INT(x, nranks);
  n_checks += 4;
}

/* Several non-blocking collectives in flight at once, polled with td_test,
 * plus a blocking call issued while they are queued (it runs after them). */
static void t_nonblocking(size_t count) {
  enum { NREQ = 8 };
  td_request *req[NREQ] = {0};
  int done[NREQ] = {0};
  size_t off, len;
  td_shard_range(count, nranks, rank_, &off, &len);
  int root = nranks - 1;

  float *ar = xalloc(count * 4);          /* iallreduce in place, f32 sum */
  int64_t *ar2_in = xalloc(count * 8), *ar2 = xalloc(count * 8); /* iallreduce i64 max */
  uint16_t *bc = xalloc(count * 2);       /* ibroadcast bf16 from the last rank */
  int32_t *rs_in = xalloc(count * 4), *rs = xalloc((len + 1) * 4); /* ireduce_scatter i32 min */
  double *ag_in = xalloc((len + 1) * 8), *ag = xalloc(count * 8); /* iallgather f64 */
  uint8_t *a2a_in = xalloc(count * (size_t)nranks), *a2a = xalloc(count * (size_t)nranks); /* ialltoall u8 */
  uint16_t *rd_in = xalloc(count * 2), *rd = xalloc(count * 2); /* ireduce f16 prod to root 0 */

  for (size_t i = 0; i < count; i++) {
    td_dtype_set(ar, i, TD_F32, red_input(rank_, i, TD_SUM, TD_F32));
    td_dtype_set(ar2_in, i, TD_I64, red_input(rank_, i, TD_MAX, TD_I64));
    td_dtype_set(bc, i, TD_BF16, rank_ == root ? bcast_value(i, root) : SENTINEL);
    td_dtype_set(rs_in, i, TD_I32, red_input(rank_, i, TD_MIN, TD_I32));
    td_dtype_set(rd_in, i, TD_F16, red_input(rank_, i, TD_PROD, TD_F16));
  }
  for (size_t i = 0; i < len; i++) td_dtype_set(ag_in, i, TD_F64, gather_value(off + i));
  for (int dst = 0; dst < nranks; dst++)
    for (size_t i = 0; i < count; i++) td_dtype_set(a2a_in, (size_t)dst * count + i, TD_U8, a2a_value(rank_, dst, i));

  COMM_OK(td_iallreduce(ar, ar, count, TD_F32, TD_SUM, comm, &req[0]));
  COMM_OK(td_iallreduce(ar2_in, ar2, count, TD_I64, TD_MAX, comm, &req[1]));
  COMM_OK(td_ibroadcast(bc, count, TD_BF16, root, comm, &req[2]));
  COMM_OK(td_ireduce_scatter(rs_in, rs, count, TD_I32, TD_MIN, comm, &req[3]));
  COMM_OK(td_iallgather(ag_in, ag, count, TD_F64, comm, &req[4]));
  COMM_OK(td_ialltoall(a2a_in, a2a, count, TD_U8, comm, &req[5]));
  COMM_OK(td_ireduce(rd_in, rd, count, TD_F16, TD_PROD, 0, comm, &req[6]));
  COMM_OK(td_ibarrier(comm, &req[7]));
  for (int k = 0; k < NREQ; k++) CHECK(req[k] != NULL);

  /* A blocking collective issued now runs after everything queued. */
  int32_t token = rank_ + 1;
  COMM_OK(td_allreduce(&token, &token, 1, TD_I32, TD_SUM, comm));
  CHECK_EQ_INT(token, (int64_t)nranks * (nranks + 1) / 2);

  /* Poll with td_test (in reverse order, to show completion does not depend
   * on which request is looked at first), sleeping between rounds. */
  double deadline = ct_now() + 60;
  int remaining = NREQ;
  while (remaining > 0) {
    for (int k = NREQ - 1; k >= 0; k--) {
      if (done[k]) continue;
      int d = 0;
      td_status st = td_test(req[k], &d);
      if (d) {
        if (st != TD_OK) td_test_fail(__FILE__, __LINE__, "request %d completed with %s: %s", k, td_status_str(st), td_comm_last_error(comm));
        done[k] = 1;
        remaining--;
      } else {
        CHECK_EQ_INT(st, TD_ERR_IN_PROGRESS);
      }
    }
    if (remaining > 0) {
      CHECK(ct_now() < deadline);
      usleep(200);
    }
  }
  for (size_t i = 0; i < count; i++) {
    check_red("iallreduce", ar, i, i, TD_SUM, TD_F32, count, 1, -1);
    check_red("iallreduce", ar2, i, i, TD_MAX, TD_I64, count, 0, -1);
    check_value("ibroadcast", td_dtype_get(bc, i, TD_BF16), bcast_value(i, root), i, TD_BF16, count, 1, root);
    check_value("iallgather", ag[i], gather_value(i), i, TD_F64, count, 0, -1);
    if (rank_ == 0) check_red("ireduce", rd, i, i, TD_PROD, TD_F16, count, 0, 0);
  }
  for (size_t i = 0; i < len; i++) check_red("ireduce_scatter", rs, i, off + i, TD_MIN, TD_I32, count, 0, -1);
  for (int src = 0; src < nranks; src++)
    for (size_t i = 0; i < count; i++)
      check_value("ialltoall", a2a[(size_t)src * count + i], a2a_value(src, rank_, i), i, TD_U8, count, 0, -1);

  /* td_wait on a fresh request, and a NULL request is TD_OK. */
  td_request *w = NULL;
  COMM_OK(td_iallreduce(ar2_in, ar2, count, TD_I64, TD_MAX, comm, &w));
  COMM_OK(td_wait(w));
  CHECK_STATUS(td_wait(NULL), TD_OK);
  for (size_t i = 0; i < count; i++) check_red("iallreduce (wait)", ar2, i, i, TD_MAX, TD_I64, count, 0, -1);

  free(ar); free(ar2_in); free(ar2); free(bc); free(rs_in); free(rs); free(ag_in); free(ag);
  free(a2a_in); free(a2a); free(rd_in); free(rd);
  n_checks += NREQ + 2;
}

/* ---- the sweep ---- */

static int want_dtype(td_dtype d) { return (opt.dtypes >> d) & 1; }
static int want_op(td_op o) { return (opt.ops >> o) & 1; }

static void sweep(void) {
  int roots[2] = {0, nranks - 1};
  int n_roots = nranks > 1 ? 2 : 1;
  for (int ci = 0; ci < opt.n_counts; ci++) {
    size_t count = opt.counts[ci];
    for (int d = 0; d < TD_DTYPE_COUNT; d++) {
      if (!want_dtype((td_dtype)d)) continue;
      for (int ip = 0; ip < 2; ip++) {
        for (int o = 0; o < TD_OP_COUNT; o++) {
          if (!want_op((td_op)o)) continue;
          if (opt.colls & C_ALLREDUCE) t_allreduce(count, (td_dtype)d, (td_op)o, ip);
          if (opt.colls & C_REDUCE)
            for (int r = 0; r < n_roots; r++) t_reduce(count, (td_dtype)d, (td_op)o, ip, roots[r]);
          if (opt.colls & C_REDUCE_SCATTER) t_reduce_scatter(count, (td_dtype)d, (td_op)o, ip);
        }
        if (opt.colls & C_ALLGATHER) t_allgather(count, (td_dtype)d, ip);
      }
      if (opt.colls & C_BROADCAST)
        for (int r = 0; r < n_roots; r++) t_broadcast(count, (td_dtype)d, roots[r]);
      if (opt.colls & C_ALLTOALL) t_alltoall(count, (td_dtype)d);
    }
  }
  if (opt.colls & C_BARRIER) t_barrier();
  if (opt.colls & C_SENDRECV) {
    t_sendrecv(TD_F32, 0);
    t_sendrecv(TD_U8, 0);
  }
  if (opt.colls & C_P2P_ANY_ORDER) t_sendrecv(TD_I32, 1);
  if (opt.colls & C_SPLIT) t_split();
  if (opt.colls & C_NONBLOCKING) {
    t_nonblocking(0);
    t_nonblocking(1);
    t_nonblocking(4099);
  }
  if (opt.large) {
    /* Large buffers cross every chunking and pipelining boundary. */
    if (opt.colls & C_ALLREDUCE) {
      t_allreduce(LARGE_COUNT, TD_F32, TD_SUM, 0);
      t_allreduce(LARGE_COUNT, TD_BF16, TD_AVG, 1);
      t_allreduce(LARGE_COUNT, TD_I64, TD_MAX, 0);
    }
    if (opt.colls & C_REDUCE) t_reduce(LARGE_COUNT, TD_F32, TD_MIN, 0, nranks - 1);
    if (opt.colls & C_REDUCE_SCATTER) t_reduce_scatter(LARGE_COUNT, TD_I32, TD_SUM, 1);
    if (opt.colls & C_ALLGATHER) t_allgather(LARGE_COUNT, TD_U8, 0);
    if (opt.colls & C_BROADCAST) t_broadcast(LARGE_COUNT, TD_F64, nranks - 1);
    if (opt.colls & C_ALLTOALL) t_alltoall(LARGE_COUNT / (size_t)nranks, TD_F16);
    if (opt.colls & C_NONBLOCKING) t_nonblocking(LARGE_COUNT / 4);
  }
}

static void usage_exit(const char *bad) {
  fprintf(stderr,
          "test_collectives: bad option '%s'\n"
          "usage: test_collectives [--colls LIST] [--dtypes LIST] [--ops LIST] [--counts LIST] [--large] [--quick]\n",
          bad);
  exit(2);
}

static void parse_options(int argc, char **argv) {
  opt.colls = (1u << CT_ARRAY_SIZE(coll_names)) - 1;
  opt.dtypes = (1u << TD_DTYPE_COUNT) - 1;
  opt.ops = (1u << TD_OP_COUNT) - 1;
  opt.n_counts = -1;
  int quick = 0;
  for (int a = 1; a < argc; a++) {
    char *items[64];
    if (!strcmp(argv[a], "--large")) { opt.large = 1; continue; }
    if (!strcmp(argv[a], "--quick")) { quick = 1; continue; }
    if (a + 1 >= argc) usage_exit(argv[a]);
    char *list = argv[++a];
    int n = ct_split_list(list, items, 64);
    if (!strcmp(argv[a - 1], "--colls")) {
      opt.colls = 0;
      for (int k = 0; k < n; k++) {
        int found = 0;
        for (size_t c = 0; c < CT_ARRAY_SIZE(coll_names); c++)
          if (!strcmp(items[k], coll_names[c])) { opt.colls |= 1u << c; found = 1; }
        if (!found) usage_exit(items[k]);
      }
    } else if (!strcmp(argv[a - 1], "--dtypes")) {
      opt.dtypes = 0;
      for (int k = 0; k < n; k++) {
        td_dtype d;
        if (td_dtype_parse(items[k], &d)) usage_exit(items[k]);
        opt.dtypes |= 1u << d;
      }
    } else if (!strcmp(argv[a - 1], "--ops")) {
      opt.ops = 0;
      for (int k = 0; k < n; k++) {
        td_op o;
        if (td_op_parse(items[k], &o)) usage_exit(items[k]);
        opt.ops |= 1u << o;
      }
    } else if (!strcmp(argv[a - 1], "--counts")) {
      opt.n_counts = 0;
      for (int k = 0; k < n && opt.n_counts < MAX_COUNTS; k++) {
        char *end;
        opt.counts[opt.n_counts++] = strtoull(items[k], &end, 10);
        if (*end) usage_exit(items[k]);
      }
    } else {
      usage_exit(argv[a - 1]);
    }
  }
  if (quick && opt.dtypes == (1u << TD_DTYPE_COUNT) - 1)
    opt.dtypes = (1u << TD_F32) | (1u << TD_BF16) | (1u << TD_I64) | (1u << TD_U8);
  if (opt.n_counts < 0) {
    static const size_t def[] = {0, 1, 2, 7, 31, 257, 4099};
    static const size_t quick_def[] = {0, 1, 13};
    const size_t *src = quick ? quick_def : def;
    size_t n = quick ? CT_ARRAY_SIZE(quick_def) : CT_ARRAY_SIZE(def);
    opt.n_counts = 0;
    for (size_t k = 0; k < n; k++) opt.counts[opt.n_counts++] = src[k];
    opt.counts[opt.n_counts++] = SIZE_MAX; /* placeholder: 3n+1, set once the world size is known */
  }
}

int main(int argc, char **argv) {
  parse_options(argc, argv);
  td_status st = td_comm_init(&comm);
  if (st != TD_OK) td_test_fail(__FILE__, __LINE__, "td_comm_init: %s: %s", td_status_str(st), td_last_error());
  rank_ = td_comm_rank(comm);
  nranks = td_comm_size(comm);
  CHECK(nranks >= 1 && rank_ >= 0 && rank_ < nranks);
  CHECK(td_comm_local_rank(comm) >= 0 && td_comm_local_rank(comm) < td_comm_local_size(comm));
  for (int k = 0; k < opt.n_counts; k++)
    if (opt.counts[k] == SIZE_MAX) opt.counts[k] = 3 * (size_t)nranks + 1; /* never divisible by n > 1 */

  double t0 = ct_now();
  sweep();
  COMM_OK(td_comm_finalize(comm));
  CHECK_EQ_INT(td_comm_status(comm), TD_OK);
  CHECK(strcmp(td_comm_last_error(comm), "") == 0);
  if (rank_ == 0)
    printf("test_collectives: %ld checks passed on %d ranks, transport %s, %.1f s\n", n_checks, nranks,
           td_comm_transport(comm), ct_now() - t0);
  td_comm_destroy(comm);
  return 0;
}
