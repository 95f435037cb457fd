/* Collectives on device buffers (src/comm/device), run through tandemrun:
 *
 *   $RUN -np N build/tests/test_device_coll [--device cpu|cuda[:N]] [--large] [--kill R]
 *
 * Buffers come from td_device_alloc on the device asked for (default:
 * TANDEM_DEVICE, else cpu). On cpu the suite sets TANDEM_STAGE_HOST_BUFFERS=1
 * so that the staged path (device/staged.c) runs with the CPU device backend;
 * in the emulator tree (build/cudaemu) and on a GPU, cuda buffers take it for
 * real (or NCCL when every rank has its own GPU). The test checks that a
 * device path ran (comm->dev set up), not only the answers.
 *
 * Sweep: allreduce, reduce, broadcast, reduce_scatter, allgather, alltoall;
 * f32, f64, bf16, i32; sum, avg (floating), max, min; counts 0, 1, 2, 7, and
 * around the staged chunk (TANDEM_DEVICE_CHUNK_BYTES, converted to elements:
 * e-1, e, e+1, 2e, 3e+1, and for the sharded kinds n*e-1, n*e, n*e+1, n*e+n,
 * 3n+1), in place and out of place, roots 0 and n-1; the non-blocking form;
 * device and host collectives interleaved (sequence numbers stay in step).
 * Inputs are small integers: rank r, element i holds ((7i + 3r) mod 11) - 5,
 * exact in every dtype, so sums, maxima and minima are closed-form values
 * computed here without the library. avg on floating types may differ by
 * one rounding (the library may scale by a reciprocal).
 *
 * A device that cannot be opened is a skip ("skipped: no GPU: <why>", exit
 * 0), or a failure with TD_TEST_EXPECT_CUDA=N >= 1 (tests/gpu.suite and the
 * emulator's lines: the one convention of every device test).
 *
 * TANDEM_TEST_EXPECT_PATH=nccl|staged|self: fail unless that path ran
 * (tests/cudaemu.suite runs NCCL's path against tests/comm/fake_nccl.c).
 *
 * --kill R: rank R SIGKILLs itself during a long staged allreduce; the other
 * ranks must fail with TD_ERR_REMOTE naming rank R (never hang), print
 * "kill ok rank <r>" and exit 0. */
#include "../common/check.h"
#include "comm/device/device_coll.h"
#include "comm_test_util.h"
#include "tandem/device.h"

#include <signal.h>
#include <stdio.h>
#include <unistd.h>

static td_comm *comm;
static int rank_, nranks;
static td_device dev;
static long n_checks;

#define COMM_OK(expr)                                                                                       \
  do {                                                                                                      \
    td_status st_ = (expr);                                                                                 \
    if (st_ != TD_OK)                                                                                       \
      td_test_fail(__FILE__, __LINE__, "%s: %s: %s", #expr, td_status_str(st_), td_last_error());           \
  } while (0)

static double input(int r, size_t i) { return (double)((7 * (i % 11) + 3 * (size_t)r) % 11) - 5.0; }

/* The reduction of element i over all ranks, computed here. */
static double expected_reduce(td_op op, size_t i) {
  double acc = input(0, i);
  for (int r = 1; r < nranks; r++) {
    double x = input(r, i);
    if (op == TD_SUM || op == TD_AVG) acc += x;
    else if (op == TD_MAX) acc = x > acc ? x : acc;
    else if (op == TD_MIN) acc = x < acc ? x : acc;
  }
  if (op == TD_AVG) acc /= nranks;
  return acc;
}

static void *dev_alloc(size_t bytes) {
  void *p = NULL;
  COMM_OK(td_device_alloc(dev, bytes ? bytes : 1, &p));
  return p;
}

static td_device host_dev(void) {
  td_device h = {TD_DEVICE_CPU, 0};
  return h;
}

static void to_dev(void *d, const void *h, size_t bytes) {
  if (bytes) COMM_OK(td_device_copy(d, dev, h, host_dev(), bytes));
}
static void from_dev(void *h, const void *d, size_t bytes) {
  if (bytes) COMM_OK(td_device_copy(h, host_dev(), d, dev, bytes));
}

static void check_value(const char *what, size_t count, td_dtype dt, td_op op, size_t i, double got, double want,
                        bool inplace) {
  n_checks++;
  double tol = (op == TD_AVG && ct_is_float(dt)) ? fabs(want) * (dt == TD_BF16 ? 1e-2 : 1e-6) + 1e-12 : 0;
  if (fabs(got - want) > tol)
    td_test_fail(__FILE__, __LINE__, "rank %d: %s(count %zu, %s, %s, %s) element %zu: got %g, expected %g", rank_,
                 what, count, td_dtype_name(dt), td_op_name(op), inplace ? "in place" : "out of place", i, got, want);
}

/* Host array of n elements: rank r's inputs starting at element `first`. */
static void *host_inputs(td_dtype dt, size_t n, size_t first, int r) {
  size_t es = td_dtype_size(dt);
  char *h = malloc(n * es + 1);
  CHECK(h);
  for (size_t i = 0; i < n; i++) td_dtype_set(h, i, dt, input(r, first + i));
  return h;
}

static void run_allreduce_like(td_dtype dt, td_op op, size_t count, bool inplace, bool nonblocking, int root,
                               bool is_reduce) {
  size_t es = td_dtype_size(dt), bytes = count * es;
  void *h = host_inputs(dt, count, 0, rank_);
  void *send = dev_alloc(bytes), *recv = inplace ? send : dev_alloc(bytes);
  to_dev(send, h, bytes);
  if (!inplace) { /* poison recv: a chunk left unwritten shows */
    memset(h, 0x5a, bytes);
    to_dev(recv, h, bytes);
    free(h);
    h = host_inputs(dt, count, 0, rank_);
  }
  if (is_reduce) {
    COMM_OK(td_reduce(send, recv, count, dt, op, root, comm));
  } else if (nonblocking) {
    td_request *req = NULL;
    COMM_OK(td_iallreduce(send, recv, count, dt, op, comm, &req));
    COMM_OK(td_wait(req));
  } else {
    COMM_OK(td_allreduce(send, recv, count, dt, op, comm));
  }
  from_dev(h, recv, bytes);
  if (!is_reduce || rank_ == root)
    for (size_t i = 0; i < count; i++)
      check_value(is_reduce ? "reduce" : "allreduce", count, dt, op, i, td_dtype_get(h, i, dt),
                  ct_round(expected_reduce(op, i), dt), inplace);
  if (!inplace) td_device_free(dev, recv);
  td_device_free(dev, send);
  free(h);
}

static void run_broadcast(td_dtype dt, size_t count, int root) {
  size_t es = td_dtype_size(dt), bytes = count * es;
  void *h = host_inputs(dt, count, 0, rank_);
  void *buf = dev_alloc(bytes);
  to_dev(buf, h, bytes);
  COMM_OK(td_broadcast(buf, count, dt, root, comm));
  from_dev(h, buf, bytes);
  for (size_t i = 0; i < count; i++)
    check_value("broadcast", count, dt, TD_SUM, i, td_dtype_get(h, i, dt), input(root, i), false);
  td_device_free(dev, buf);
  free(h);
}

static void run_reduce_scatter(td_dtype dt, td_op op, size_t count, bool inplace) {
  size_t es = td_dtype_size(dt), off, len;
  td_shard_range(count, nranks, rank_, &off, &len);
  void *h = host_inputs(dt, count, 0, rank_);
  char *send = dev_alloc(count * es);
  to_dev(send, h, count * es);
  char *recv = inplace ? send + off * es : dev_alloc(len * es);
  COMM_OK(td_reduce_scatter(send, recv, count, dt, op, comm));
  from_dev(h, recv, len * es);
  for (size_t i = 0; i < len; i++)
    check_value("reduce_scatter", count, dt, op, off + i, td_dtype_get(h, i, dt),
                ct_round(expected_reduce(op, off + i), dt), inplace);
  if (!inplace) td_device_free(dev, recv);
  td_device_free(dev, send);
  free(h);
}

/* Rank r contributes its shard holding input(r, i) at global index i. */
static void run_allgather(td_dtype dt, size_t count, bool inplace) {
  size_t es = td_dtype_size(dt), off, len;
  td_shard_range(count, nranks, rank_, &off, &len);
  void *mine = host_inputs(dt, len, off, rank_);
  char *recv = dev_alloc(count * es);
  char *send = inplace ? recv + off * es : dev_alloc(len * es);
  to_dev(send, mine, len * es);
  COMM_OK(td_allgather(send, recv, count, dt, comm));
  char *h = malloc(count * es + 1);
  CHECK(h);
  from_dev(h, recv, count * es);
  for (int r = 0; r < nranks; r++) {
    size_t o, l;
    td_shard_range(count, nranks, r, &o, &l);
    for (size_t i = o; i < o + l; i++)
      check_value("allgather", count, dt, TD_SUM, i, td_dtype_get(h, i, dt), input(r, i), inplace);
  }
  if (!inplace) td_device_free(dev, send);
  td_device_free(dev, recv);
  free(mine);
  free(h);
}

/* Block j of rank r's send holds input(r, j * count + i); rank r's recv
 * block j must hold block r of rank j's send. */
static void run_alltoall(td_dtype dt, size_t count) {
  size_t es = td_dtype_size(dt), total = count * (size_t)nranks;
  void *h = host_inputs(dt, total, 0, rank_);
  void *send = dev_alloc(total * es), *recv = dev_alloc(total * es);
  to_dev(send, h, total * es);
  COMM_OK(td_alltoall(send, recv, count, dt, comm));
  from_dev(h, recv, total * es);
  for (int j = 0; j < nranks; j++)
    for (size_t i = 0; i < count; i++)
      check_value("alltoall", count, dt, TD_SUM, (size_t)j * count + i, td_dtype_get(h, (size_t)j * count + i, dt),
                  input(j, (size_t)rank_ * count + i), false);
  td_device_free(dev, send);
  td_device_free(dev, recv);
  free(h);
}

/* A host collective between device ones: every rank's sequence numbers
 * must still agree (a device op takes one per chunk). */
static void run_host_between(void) {
  int32_t v = rank_ + 1, sum = 0;
  COMM_OK(td_allreduce(&v, &sum, 1, TD_I32, TD_SUM, comm));
  CHECK_EQ_INT(sum, nranks * (nranks + 1) / 2);
  n_checks++;
}

/* The staged chunk in elements, from TANDEM_DEVICE_CHUNK_BYTES (plain
 * bytes or with a K/M suffix; unset: the documented 4M), read here rather
 * than through the library so that the counts around chunk edges do not
 * trust the code under test. */
static size_t chunk_elems(size_t es, bool sharded) {
  const char *v = getenv("TANDEM_DEVICE_CHUNK_BYTES");
  char *end = NULL;
  size_t bytes = v && *v ? (size_t)strtoull(v, &end, 10) : (size_t)4 << 20;
  if (end && (*end == 'K' || *end == 'k')) bytes <<= 10;
  if (end && (*end == 'M' || *end == 'm')) bytes <<= 20;
  size_t per = sharded ? es * (size_t)nranks : es;
  return bytes / per ? bytes / per : 1;
}

static void sweep(bool large) {
  const td_dtype dtypes[] = {TD_F32, TD_F64, TD_BF16, TD_I32};
  const td_op ops[] = {TD_SUM, TD_AVG, TD_MAX, TD_MIN};
  for (size_t d = 0; d < CT_ARRAY_SIZE(dtypes); d++) {
    td_dtype dt = dtypes[d];
    size_t es = td_dtype_size(dt), e = chunk_elems(es, false), se = chunk_elems(es, true), n = (size_t)nranks;
    size_t counts[] = {0, 1, 2, 7, e - 1, e, e + 1, 2 * e, 3 * e + 1, n * se - 1, n * se, n * se + 1,
                       n * se + n, 3 * n + 1, large ? 1000003 : 5};
    for (size_t c = 0; c < CT_ARRAY_SIZE(counts); c++) {
      size_t count = counts[c];
      for (size_t o = 0; o < CT_ARRAY_SIZE(ops); o++) {
        td_op op = ops[o];
        if (op == TD_AVG && !ct_is_float(dt)) continue;
        for (int inplace = 0; inplace < 2; inplace++) {
          run_allreduce_like(dt, op, count, inplace, false, 0, false);
          run_reduce_scatter(dt, op, count, inplace);
        }
        run_allreduce_like(dt, op, count, false, false, nranks - 1, true);
      }
      run_allreduce_like(dt, TD_SUM, count, false, true, 0, false); /* non-blocking */
      for (int inplace = 0; inplace < 2; inplace++) run_allgather(dt, count, inplace);
      run_broadcast(dt, count, 0);
      run_broadcast(dt, count, nranks - 1);
      run_alltoall(dt, count);
      run_host_between();
    }
  }
}

/* Rank `victim` dies during a long staged allreduce; survivors must fail
 * naming it. */
static int kill_test(int victim) {
  size_t count = (size_t)16 << 20; /* 64 MiB of f32: many chunks */
  float *buf = dev_alloc(count * sizeof(float));
  COMM_OK(td_device_memset0(dev, buf, count * sizeof(float)));
  COMM_OK(td_allreduce(buf, buf, count, TD_F32, TD_SUM, comm)); /* all alive: sets the path up */
  if (rank_ == victim) {
    td_request *req = NULL;
    COMM_OK(td_iallreduce(buf, buf, count, TD_F32, TD_SUM, comm, &req));
    usleep(20000);
    raise(SIGKILL);
  }
  td_status st = TD_OK;
  for (int i = 0; i < 50 && st == TD_OK; i++) st = td_allreduce(buf, buf, count, TD_F32, TD_SUM, comm);
  const char *msg = td_last_error();
  char want[32];
  snprintf(want, sizeof want, "rank %d", victim);
  if (st != TD_ERR_REMOTE || !strstr(msg, want))
    td_test_fail(__FILE__, __LINE__, "rank %d: expected TD_ERR_REMOTE naming rank %d, got %s: %s", rank_, victim,
                 td_status_str(st), msg);
  printf("kill ok rank %d: %s\n", rank_, msg);
  td_device_free(dev, buf);
  td_comm_destroy(comm);
  return 0;
}

int main(int argc, char **argv) {
  const char *spec = getenv("TANDEM_DEVICE");
  bool large = false;
  int victim = -1;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--device") && i + 1 < argc) spec = argv[++i];
    else if (!strcmp(argv[i], "--large")) large = true;
    else if (!strcmp(argv[i], "--kill") && i + 1 < argc) victim = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: %s [--device cpu|cuda[:N]] [--large] [--kill RANK]\n", argv[0]);
      return 2;
    }
  }
  COMM_OK(td_comm_init(&comm));
  rank_ = td_comm_rank(comm);
  nranks = td_comm_size(comm);
  /* "cuda" alone: this rank's share, cuda:(local rank % GPUs), as training does */
  if (td_train_device_select(spec ? spec : "cpu", td_comm_local_rank(comm), &dev) != TD_OK) {
    /* TD_TEST_EXPECT_CUDA >= 1 (tests/gpu.suite on the GPU machine, the
     * emulator's lines): a missing GPU fails; otherwise it is a skip */
    const char *expect = getenv("TD_TEST_EXPECT_CUDA");
    if (!expect || atoi(expect) < 1) {
      printf("skipped: no GPU: %s\n", td_last_error());
      return 0;
    }
    td_test_fail(__FILE__, __LINE__, "device %s: %s", spec, td_last_error());
  }
  if (victim >= 0) return kill_test(victim);

  double t0 = ct_now();
  sweep(large);
  /* the device path really ran (a CPU device only when staging host buffers
   * is on), and the one expected (TANDEM_TEST_EXPECT_PATH: nccl, staged) */
  CHECK(comm->dev != NULL);
  const char *expect_path = getenv("TANDEM_TEST_EXPECT_PATH");
  if (expect_path && strcmp(device_coll_path(comm), expect_path))
    td_test_fail(__FILE__, __LINE__, "rank %d: device collectives ran on the %s path, expected %s", rank_,
                 device_coll_path(comm), expect_path);
  COMM_OK(td_comm_finalize(comm));
  if (rank_ == 0)
    printf("test_device_coll: %ld checks passed on %d ranks, device %s, %s path, %.1f s\n", n_checks, nranks,
           dev.kind == TD_DEVICE_CPU ? "cpu (staged host buffers)" : "cuda", device_coll_path(comm), ct_now() - t0);
  td_comm_destroy(comm);
  return 0;
}
