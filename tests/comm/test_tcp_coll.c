/* Multi-rank tests of the TCP transport and the point-to-point algorithms
 * (ring and recursive-doubling allreduce, ring reduce-scatter and allgather,
 * binomial broadcast and reduce, pairwise alltoall). Run under tandemrun
 * with TANDEM_TRANSPORT=tcp (and TANDEM_ALLREDUCE_ALGO=ring|rd):
 *
 *   test_tcp_coll coll [COUNTS]   every collective against closed forms
 *   test_tcp_coll kill VICTIM     VICTIM dies mid-collective; every survivor
 *                                 must fail within seconds naming it
 *   test_tcp_coll abort ABORTER   ABORTER calls td_comm_abort while the others
 *                                 wait in a collective; they must fail with
 *                                 its reason
 *   test_tcp_coll late            (TANDEM_TIMEOUT=2) the last rank joins an
 *                                 allreduce 3.5 s late: the others time out,
 *                                 and the late rank fails with their timeout
 *                                 too, though the frames it needs may already
 *                                 sit in its sockets
 *   test_tcp_coll disagree WHAT   WHAT = count|root: the last rank issues a
 *                                 different allreduce count or broadcast root;
 *                                 every rank gets TD_ERR_MISMATCH saying what
 *                                 differs, from the collective or (a rank whose
 *                                 part of the tree agreed) from its next call
 *
 * Inputs are small integers, exact in every dtype, so results are compared
 * exactly (after rounding the expectation into the dtype). */
#define _GNU_SOURCE 1
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/check.h"
#include "comm_test_util.h"

static int g_rank, g_size;

/* Input of rank r at index i for op. Products stay tiny (at most 2^3 for 8
 * ranks); sums at most 15 * 9 = 135 for 8 ranks, exact even in u8 and bf16. */
static double input(int r, size_t i, td_op op) {
  if (op == TD_PROD) return ((i + (size_t)r) % 3 == 0) ? 2.0 : 1.0;
  return (double)((r % 3 + 1) * (int)(i % 9 + 1));
}

static double expected(size_t i, td_op op, td_dtype dtype) {
  double acc = input(0, i, op);
  for (int r = 1; r < g_size; r++) {
    double v = input(r, i, op);
    acc = td_op_apply((td_op)op, acc, v);
  }
  if (op == TD_AVG) acc = ct_is_float(dtype) ? acc / g_size : (double)((long long)acc / g_size);
  return ct_round(acc, dtype);
}

/* Exact for integers; for f16/bf16 averages the division is rounded once. */
static void check_value(const char *what, double got, double want, td_dtype dtype, size_t count, size_t i) {
  double tol = (dtype == TD_F16 || dtype == TD_BF16) ? 0.01 * fabs(want) : 0.0;
  if (dtype == TD_F32) tol = 1e-6 * fabs(want);
  if (!(fabs(got - want) <= tol))
    td_test_fail(__FILE__, __LINE__, "rank %d: %s %s count %zu: element %zu is %.9g, expected %.9g", g_rank, what,
                 td_dtype_name(dtype), count, i, got, want);
}

static void *alloc_bytes(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  CHECK(p != NULL);
  return p;
}

static void test_allreduce(td_comm *comm, size_t count, td_dtype dtype, td_op op, int in_place) {
  size_t esz = td_dtype_size(dtype);
  char *send = alloc_bytes(count * esz), *recv = in_place ? send : alloc_bytes(count * esz);
  for (size_t i = 0; i < count; i++) td_dtype_set(send, i, dtype, input(g_rank, i, op));
  CHECK_OK(td_allreduce(send, recv, count, dtype, op, comm));
  for (size_t i = 0; i < count; i++)
    check_value("allreduce", td_dtype_get(recv, i, dtype), expected(i, op, dtype), dtype, count, i);
  /* Every rank holds the same bits (the ring divides an average once, at
   * each segment's owner): the smallest and the largest hash agree. */
  uint64_t h = 1469598103934665603ull; /* FNV-1a of the result */
  for (size_t b = 0; b < count * esz; b++) h = (h ^ (unsigned char)recv[b]) * 1099511628211ull;
  int64_t lo = (int64_t)(h >> 1), hi = lo;
  CHECK_OK(td_allreduce(&lo, &lo, 1, TD_I64, TD_MIN, comm));
  CHECK_OK(td_allreduce(&hi, &hi, 1, TD_I64, TD_MAX, comm));
  if (lo != hi)
    td_test_fail(__FILE__, __LINE__, "rank %d: allreduce %s %s count %zu: the ranks hold different results", g_rank,
                 td_dtype_name(dtype), td_op_name(op), count);
  if (!in_place) free(recv);
  free(send);
}

static void test_reduce_scatter(td_comm *comm, size_t count, td_dtype dtype, int in_place) {
  size_t esz = td_dtype_size(dtype), off, len;
  td_shard_range(count, g_size, g_rank, &off, &len);
  char *send = alloc_bytes(count * esz), *recv = in_place ? send + off * esz : alloc_bytes(len * esz);
  for (size_t i = 0; i < count; i++) td_dtype_set(send, i, dtype, input(g_rank, i, TD_SUM));
  CHECK_OK(td_reduce_scatter(send, recv, count, dtype, TD_SUM, comm));
  for (size_t i = 0; i < len; i++)
    check_value("reduce_scatter", td_dtype_get(recv, i, dtype), expected(off + i, TD_SUM, dtype), dtype, count, off + i);
  if (!in_place) free(recv);
  free(send);
}

static void test_allgather(td_comm *comm, size_t count, td_dtype dtype, int in_place) {
  size_t esz = td_dtype_size(dtype), off, len;
  td_shard_range(count, g_size, g_rank, &off, &len);
  char *recv = alloc_bytes(count * esz), *send = in_place ? recv + off * esz : alloc_bytes(len * esz);
  memset(recv, 0x5a, count * esz);
  for (size_t i = 0; i < len; i++) td_dtype_set(send, i, dtype, input(0, off + i, TD_SUM));
  CHECK_OK(td_allgather(send, recv, count, dtype, comm));
  for (size_t i = 0; i < count; i++)
    check_value("allgather", td_dtype_get(recv, i, dtype), ct_round(input(0, i, TD_SUM), dtype), dtype, count, i);
  if (!in_place) free(send);
  free(recv);
}

static void test_broadcast(td_comm *comm, size_t count, int root) {
  int32_t *buf = alloc_bytes(count * 4);
  for (size_t i = 0; i < count; i++) buf[i] = g_rank == root ? (int32_t)(i * 7 + (size_t)root) : -1;
  CHECK_OK(td_broadcast(buf, count, TD_I32, root, comm));
  for (size_t i = 0; i < count; i++) check_value("broadcast", buf[i], (double)(i * 7 + (size_t)root), TD_I32, count, i);
  free(buf);
}

static void test_reduce(td_comm *comm, size_t count, td_dtype dtype, int root) {
  size_t esz = td_dtype_size(dtype);
  char *send = alloc_bytes(count * esz), *recv = g_rank == root ? alloc_bytes(count * esz) : NULL;
  for (size_t i = 0; i < count; i++) td_dtype_set(send, i, dtype, input(g_rank, i, TD_SUM));
  CHECK_OK(td_reduce(send, recv, count, dtype, TD_SUM, root, comm));
  for (size_t i = 0; recv && i < count; i++)
    check_value("reduce", td_dtype_get(recv, i, dtype), expected(i, TD_SUM, dtype), dtype, count, i);
  free(recv);
  free(send);
}

static void test_alltoall(td_comm *comm, size_t count) {
  size_t n = (size_t)g_size;
  int32_t *send = alloc_bytes(n * count * 4), *recv = alloc_bytes(n * count * 4);
  for (size_t j = 0; j < n; j++)
    for (size_t i = 0; i < count; i++) send[j * count + i] = (int32_t)((size_t)g_rank * 100000 + j * 1000 + i % 1000);
  CHECK_OK(td_alltoall(send, recv, count, TD_I32, comm));
  for (size_t j = 0; j < n; j++)
    for (size_t i = 0; i < count; i++)
      check_value("alltoall", recv[j * count + i], (double)(j * 100000 + (size_t)g_rank * 1000 + i % 1000), TD_I32,
                  count, j * count + i);
  free(send);
  free(recv);
}

static int run_coll(td_comm *comm, const char *counts_arg) {
  size_t counts[16];
  int n_counts = 0;
  char list[256];
  snprintf(list, sizeof list, "%s", counts_arg ? counts_arg : "0,1,7,1000,65537");
  char *tokens[16];
  int n_tok = ct_split_list(list, tokens, 16);
  for (int k = 0; k < n_tok; k++) counts[n_counts++] = (size_t)strtoull(tokens[k], NULL, 10);

  static const td_dtype dtypes[] = {TD_F32, TD_F64, TD_F16, TD_BF16, TD_I32, TD_I64, TD_U8};
  static const td_op ops[] = {TD_SUM, TD_AVG, TD_MIN, TD_MAX, TD_PROD};
  for (int c = 0; c < n_counts; c++) {
    size_t count = counts[c];
    /* Every dtype and op on small counts; the large ones with f32 and bf16
     * sums, and up to 2M elements f32 and i32 averages (the ring divides them
     * chunk by chunk inside its reduce-scatter: allreduce_ring.c; 1000003
     * f32 on 2 ranks is 8 chunks per segment). */
    for (size_t d = 0; d < CT_ARRAY_SIZE(dtypes); d++)
      for (size_t o = 0; o < CT_ARRAY_SIZE(ops); o++) {
        bool large_sum = ops[o] == TD_SUM && (dtypes[d] == TD_F32 || dtypes[d] == TD_BF16);
        bool large_avg = ops[o] == TD_AVG && (dtypes[d] == TD_F32 || dtypes[d] == TD_I32) && count <= 2000000;
        if (count > 1000 && !large_sum && !large_avg) continue;
        test_allreduce(comm, count, dtypes[d], ops[o], (int)((d + o) % 2));
      }
    test_allreduce(comm, count, TD_F32, TD_SUM, 1);
    for (int in_place = 0; in_place < 2; in_place++) {
      test_reduce_scatter(comm, count, TD_F32, in_place);
      test_allgather(comm, count, in_place ? TD_BF16 : TD_F32, in_place);
    }
    test_reduce_scatter(comm, count, TD_F16, 0);
    for (int root = 0; root < g_size; root += (g_size > 4 ? 3 : 1)) {
      test_broadcast(comm, count, root);
      test_reduce(comm, count, root % 2 ? TD_BF16 : TD_F32, root);
    }
    test_alltoall(comm, count > 4096 ? 4096 : count);
  }
  CHECK_OK(td_comm_finalize(comm));
  printf("tcp-coll rank %d of %d ok (transport %s, counts %s)\n", g_rank, g_size, td_comm_transport(comm),
         counts_arg ? counts_arg : "default");
  return 0;
}

/* A failed operation must be TD_ERR_REMOTE, seen within 10 s, with a message
 * that contains `culprit` ("rank 2") and `detail` (may be NULL). */
static void expect_remote(td_status st, const char *msg, const char *culprit, const char *detail, double waited) {
  if (st != TD_ERR_REMOTE)
    td_test_fail(__FILE__, __LINE__, "rank %d: expected a remote error, got %s: %s", g_rank, td_status_str(st), msg);
  if (!strstr(msg, culprit))
    td_test_fail(__FILE__, __LINE__, "rank %d: the error does not name %s: %s", g_rank, culprit, msg);
  if (detail && !strstr(msg, detail))
    td_test_fail(__FILE__, __LINE__, "rank %d: the error does not say \"%s\": %s", g_rank, detail, msg);
  if (waited > 10.0) td_test_fail(__FILE__, __LINE__, "rank %d: the failure took %.1f s to arrive", g_rank, waited);
}

/* The victim dies while a large allreduce is in flight; survivors must see
 * TD_ERR_REMOTE naming it within seconds, and stay failed. */
static int run_kill(td_comm *comm, int victim) {
  const size_t count = 4u << 20; /* 16 MiB of f32: each op takes a while */
  float *buf = alloc_bytes(count * sizeof(float));
  for (size_t i = 0; i < count; i++) buf[i] = 1.0f;
  for (int iter = 0; iter < 1000; iter++) {
    if (g_rank == victim && iter == 2) {
      td_request *req = NULL;
      CHECK_OK(td_iallreduce(buf, buf, count, TD_F32, TD_SUM, comm, &req));
      usleep(20000);
      raise(SIGKILL);
    }
    double t0 = ct_now();
    td_status st = td_allreduce(buf, buf, count, TD_F32, TD_SUM, comm);
    double waited = ct_now() - t0;
    if (st == TD_OK) continue;
    const char *msg = td_comm_last_error(comm);
    char victim_name[32];
    snprintf(victim_name, sizeof victim_name, "rank %d", victim);
    expect_remote(st, msg, victim_name, NULL, waited);
    /* Sticky: the next operation fails at once with the same status. */
    CHECK_STATUS(td_allreduce(buf, buf, 16, TD_F32, TD_SUM, comm), TD_ERR_REMOTE);
    printf("tcp-kill survivor ok: rank %d noticed after %.2f s: %s\n", g_rank, waited, msg);
    fflush(stdout);
    free(buf);
    td_comm_destroy(comm);
    return 0;
  }
  td_test_fail(__FILE__, __LINE__, "rank %d: the collectives kept succeeding after rank %d died", g_rank, victim);
}

/* The aborter aborts while every other rank waits in an allreduce it never
 * joins; they must fail quickly with its reason. */
static int run_abort(td_comm *comm, int aborter) {
  float x[64] = {0};
  CHECK_OK(td_allreduce(x, x, 64, TD_F32, TD_SUM, comm)); /* everyone is wired and running */
  if (g_rank == aborter) {
    usleep(300000);
    td_comm_abort(comm, "test_tcp_coll stops the job on purpose");
    CHECK_STATUS(td_allreduce(x, x, 64, TD_F32, TD_SUM, comm), TD_ERR_REMOTE);
    printf("tcp-abort aborter ok: rank %d\n", g_rank);
  } else {
    double t0 = ct_now();
    td_status st = td_allreduce(x, x, 64, TD_F32, TD_SUM, comm);
    double waited = ct_now() - t0;
    const char *msg = td_comm_last_error(comm);
    char aborter_name[32];
    snprintf(aborter_name, sizeof aborter_name, "rank %d", aborter);
    expect_remote(st, msg, aborter_name, "stops the job on purpose", waited);
    printf("tcp-abort survivor ok: rank %d after %.2f s: %s\n", g_rank, waited, msg);
  }
  fflush(stdout);
  td_comm_destroy(comm);
  return 0;
}

/* Every later call fails with the same status and the message stays. */
static void expect_sticky(td_comm *comm, td_status expected) {
  char first[1024];
  snprintf(first, sizeof first, "%s", td_comm_last_error(comm));
  float x = 1;
  CHECK_STATUS(td_allreduce(&x, &x, 1, TD_F32, TD_SUM, comm), expected);
  CHECK_STATUS(td_comm_finalize(comm), expected);
  if (strcmp(first, td_comm_last_error(comm)))
    td_test_fail(__FILE__, __LINE__, "rank %d: the message changed from '%s' to '%s'", g_rank, first,
                 td_comm_last_error(comm));
}

static int run_late(td_comm *comm) {
  float x[4] = {1, 1, 1, 1};
  CHECK_OK(td_allreduce(x, x, 4, TD_F32, TD_SUM, comm));
  bool late = g_rank == g_size - 1;
  if (late) usleep(3500000);
  double t0 = ct_now();
  td_status st = td_allreduce(x, x, 4, TD_F32, TD_SUM, comm);
  double waited = ct_now() - t0;
  const char *msg = td_comm_last_error(comm);
  if (st != TD_ERR_TIMEOUT)
    td_test_fail(__FILE__, __LINE__, "rank %d%s: expected a timeout, got %s: %s", g_rank, late ? " (late)" : "",
                 td_status_str(st), msg);
  if (!strstr(msg, "TANDEM_TIMEOUT"))
    td_test_fail(__FILE__, __LINE__, "rank %d: the message does not name TANDEM_TIMEOUT: %s", g_rank, msg);
  if (late && (waited > 2.0 || !strstr(msg, "reported")))
    td_test_fail(__FILE__, __LINE__, "late rank %d: %.2f s for a relayed timeout: %s", g_rank, waited, msg);
  if (!late && (waited < 1.5 || waited > 5.0))
    td_test_fail(__FILE__, __LINE__, "rank %d: failed after %.2f s with TANDEM_TIMEOUT=2: %s", g_rank, waited, msg);
  expect_sticky(comm, TD_ERR_TIMEOUT);
  printf("tcp-late ok: rank %d%s after %.2f s: %s\n", g_rank, late ? " (late)" : "", waited, msg);
  fflush(stdout);
  td_comm_destroy(comm);
  return 0;
}

static int run_disagree(td_comm *comm, const char *what) {
  bool odd = g_rank == g_size - 1, root_case = !strcmp(what, "root");
  if (!root_case && strcmp(what, "count")) {
    fprintf(stderr, "test_tcp_coll disagree: unknown kind '%s' (count|root)\n", what);
    return 2;
  }
  float buf[1001] = {0};
  CHECK_OK(td_allreduce(buf, buf, 8, TD_F32, TD_SUM, comm));
  double t0 = ct_now();
  td_status st = root_case ? td_broadcast(buf, 1000, TD_F32, odd ? 1 : 0, comm)
                           : td_allreduce(buf, buf, odd ? 1001 : 1000, TD_F32, TD_SUM, comm);
  double waited = ct_now() - t0;
  const char *when = "in the collective";
  if (st == TD_OK && root_case) {
    /* This rank's part of the tree agreed, or it was a root itself (with
     * 2 ranks both are, and neither receives): the error comes with the
     * next call, issued (as after a compute step) once a rank that waits
     * has had the time to find out. */
    usleep(2000000);
    t0 = ct_now();
    st = td_barrier(comm);
    waited = ct_now() - t0;
    when = "in the next call";
  }
  const char *msg = td_comm_last_error(comm);
  if (st != TD_ERR_MISMATCH)
    td_test_fail(__FILE__, __LINE__, "rank %d (disagree %s): expected a mismatch, got %s: %s", g_rank, what,
                 td_status_str(st), msg);
  if (!strstr(msg, what))
    td_test_fail(__FILE__, __LINE__, "rank %d: the mismatch does not say that the %s differs: %s", g_rank, what, msg);
  char odd_name[32];
  snprintf(odd_name, sizeof odd_name, "rank %d", g_size - 1);
  if (!odd && !strstr(msg, odd_name))
    td_test_fail(__FILE__, __LINE__, "rank %d: the mismatch does not name %s: %s", g_rank, odd_name, msg);
  if (waited > 5.0) td_test_fail(__FILE__, __LINE__, "rank %d: the mismatch took %.1f s", g_rank, waited);
  expect_sticky(comm, TD_ERR_MISMATCH);
  printf("tcp-disagree ok: rank %d %s after %.2f s: %s\n", g_rank, when, waited, msg);
  fflush(stdout);
  td_comm_destroy(comm);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s coll [COUNTS] | kill VICTIM | abort ABORTER | late | disagree count|root\n",
            argv[0]);
    return 2;
  }
  td_comm *comm = NULL;
  CHECK_OK(td_comm_init(&comm));
  g_rank = td_comm_rank(comm);
  g_size = td_comm_size(comm);
  if (g_size > 1 && strcmp(td_comm_transport(comm), "tcp"))
    td_test_fail(__FILE__, __LINE__, "run with TANDEM_TRANSPORT=tcp (transport is %s)", td_comm_transport(comm));
  if (!strcmp(argv[1], "coll")) {
    int rc = run_coll(comm, argc > 2 ? argv[2] : NULL);
    td_comm_destroy(comm);
    return rc;
  }
  if (!strcmp(argv[1], "kill") && argc > 2) return run_kill(comm, atoi(argv[2]));
  if (!strcmp(argv[1], "abort") && argc > 2) return run_abort(comm, atoi(argv[2]));
  if (!strcmp(argv[1], "late")) return run_late(comm);
  if (!strcmp(argv[1], "disagree") && argc > 2) return run_disagree(comm, argv[2]);
  fprintf(stderr, "unknown mode %s\n", argv[1]);
  return 2;
}
