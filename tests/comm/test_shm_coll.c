/* Multi-rank tests of the shared-memory transport and its algorithms
 * (src/comm/algorithms/..._shm.c), run under tandemrun on one host:
 *
 *   test_shm_coll coll COUNT[,COUNT...]  every shm collective, closed-form results: all
 *                                        dtypes and ops for allreduce, reduce and
 *                                        reduce-scatter; in place and out of place;
 *                                        allreduce results the same bits on every
 *                                        rank, f32/f64 averages the bits of the sum
 *                                        divided once
 *   test_shm_coll kill VICTIM            VICTIM SIGKILLs itself; every survivor's
 *                                        allreduce fails with TD_ERR_REMOTE naming it
 *                                        within seconds; prints "shm kill ok ... job=ID"
 *   test_shm_coll leave VICTIM           VICTIM destroys its communicator without
 *                                        finalizing and stays alive: the same failure
 *   test_shm_coll mismatch               the last rank issues a different count, then a
 *                                        different root: TD_ERR_MISMATCH on every rank
 *
 * Suite lines set TANDEM_SHM_SLOT_BYTES / TANDEM_SHM_CHUNK_BYTES small so that
 * modest counts run the multi-chunk pipelines. Every value is a small integer,
 * exact in every dtype (products stay <= 2^n). */
#include <dirent.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/check.h"
#include "comm_test_util.h"

static int g_rank, g_size;

/* Set by tandemrun; segment names start with it. */
static const char *job_id(void) {
  const char *j = getenv("TANDEM_JOB_ID");
  return j && *j ? j : "?";
}

/* Input of rank r at element i for op: small, and for PROD only 1s and 2s. */
static double in_val(int r, size_t i, td_op op) {
  if (op == TD_PROD) return (double)(1 + ((i + (size_t)r) % 3 == 0));
  return (double)((i * 7 + (size_t)r * 3) % 11 + 1);
}

/* The closed-form reduced value at element i, as the dtype stores it. */
static double expect_reduced(size_t i, td_dtype dt, td_op op) {
  double acc = in_val(0, i, op);
  for (int r = 1; r < g_size; r++) acc = td_op_apply(op, acc, in_val(r, i, op));
  if (dt == TD_U8) acc = (double)((uint64_t)acc & 0xff);
  if (op == TD_AVG) {
    if (!ct_is_float(dt)) return ct_round(floor(acc / g_size), dt);
    return acc / g_size;
  }
  return ct_round(acc, dt);
}

static void check_elem(const char *what, const void *buf, size_t i, td_dtype dt, td_op op, double want) {
  double got = td_dtype_get(buf, i, dt);
  bool exact = op != TD_AVG || !ct_is_float(dt);
  double tol = exact ? 0 : (dt == TD_F16 || dt == TD_BF16) ? 1e-2 * fabs(want) + 1e-2 : 1e-5 * fabs(want);
  if (fabs(got - want) > tol)
    td_test_fail(__FILE__, __LINE__, "rank %d/%d %s %s %s element %zu: got %.9g want %.9g", g_rank, g_size, what,
                 td_dtype_name(dt), td_op_name(op), i, got, want);
}

/* SHM_TEST_ALLOC=shared: every buffer comes from td_mem_alloc (so that large
 * allreduces take the direct path); =mixed: all ranks but the last do (so
 * that every rank must fall back to staging, the same way). Shared buffers
 * start 64 bytes into their region, as a bucket inside a gradient arena. */
static bool g_shared;

static void *xmalloc(size_t bytes) {
  if (g_shared) {
    char *base = NULL;
    CHECK_OK(td_mem_alloc(bytes + 64, (void **)&base));
    ((char **)(base + 64))[-1] = base;
    return base + 64;
  }
  void *p = malloc(bytes ? bytes : 1);
  CHECK(p != NULL);
  return p;
}

static void xfree(void *p) {
  if (g_shared && p)
    td_mem_free(((char **)p)[-1]);
  else
    free(p);
}

/* TD_AVG of f32/f64 to the bit: the sum (exact: small integers) divided as
 * docs/c-api.md says ("divides once, after the sum"; f32 by multiplying
 * with the f32 reciprocal of n, f64 by dividing), as if a pass over the
 * whole result followed the sum. The shm allreduce divides each slice at its
 * owner instead (allreduce_shm.c): these must be the same bits. */
static void check_avg_bits(const char *buf, size_t count, td_dtype dt) {
  for (size_t i = 0; i < count; i++) {
    double sum = 0;
    for (int r = 0; r < g_size; r++) sum += in_val(r, i, TD_AVG);
    bool same;
    if (dt == TD_F32) {
      float want = (float)sum * (1.0f / (float)g_size), got;
      memcpy(&got, buf + i * 4, 4);
      same = !memcmp(&got, &want, 4);
    } else {
      double want = sum / g_size, got;
      memcpy(&got, buf + i * 8, 8);
      same = !memcmp(&got, &want, 8);
    }
    if (!same)
      td_test_fail(__FILE__, __LINE__, "rank %d/%d allreduce %s avg element %zu: got %.17g, want the bits of %.17g",
                   g_rank, g_size, td_dtype_name(dt), i, td_dtype_get(buf, i, dt),
                   dt == TD_F32 ? (double)((float)sum * (1.0f / (float)g_size)) : sum / g_size);
  }
}

/* Every rank holds the same bits: the smallest and largest hash of the
 * result (FNV-1a over 8-byte words, then the tail bytes) over the ranks
 * agree, found in one MAX allreduce of (hash, -hash). */
static void check_same_bits(td_comm *c, const char *buf, size_t bytes, td_dtype dt, td_op op, size_t count) {
  uint64_t h = 1469598103934665603ull, w;
  size_t b = 0;
  for (; b + 8 <= bytes; b += 8) {
    memcpy(&w, buf + b, 8);
    h = (h ^ w) * 1099511628211ull;
  }
  for (; b < bytes; b++) h = (h ^ (unsigned char)buf[b]) * 1099511628211ull;
  int64_t hl[2] = {(int64_t)(h >> 1), -(int64_t)(h >> 1)};
  CHECK_OK(td_allreduce(hl, hl, 2, TD_I64, TD_MAX, c));
  if (hl[0] != -hl[1])
    td_test_fail(__FILE__, __LINE__, "rank %d/%d allreduce %s %s count %zu: the ranks hold different bits", g_rank,
                 g_size, td_dtype_name(dt), td_op_name(op), count);
}

static void test_allreduce(td_comm *c, size_t count, td_dtype dt, td_op op, bool in_place) {
  size_t es = td_dtype_size(dt);
  char *send = xmalloc(count * es), *recv = in_place ? send : xmalloc(count * es);
  for (size_t i = 0; i < count; i++) td_dtype_set(send, i, dt, in_val(g_rank, i, op));
  CHECK_OK(td_allreduce(send, recv, count, dt, op, c));
  for (size_t i = 0; i < count; i++) check_elem("allreduce", recv, i, dt, op, expect_reduced(i, dt, op));
  if (op == TD_AVG && (dt == TD_F32 || dt == TD_F64)) check_avg_bits(recv, count, dt);
  /* Floating sums and averages are where the order of additions and where
   * the division happens could make ranks differ (integers and MIN/MAX are
   * exact); one extra small allreduce each, not for every op (the lines
   * with 8 ranks on 2 cores are bound by scheduling, one sync at a time). */
  if (ct_is_float(dt) && (op == TD_SUM || op == TD_AVG)) check_same_bits(c, recv, count * es, dt, op, count);
  if (!in_place) xfree(recv);
  xfree(send);
}

static void test_reduce(td_comm *c, size_t count, td_dtype dt, td_op op, int root) {
  size_t es = td_dtype_size(dt);
  char *send = xmalloc(count * es), *recv = xmalloc(count * es);
  for (size_t i = 0; i < count; i++) td_dtype_set(send, i, dt, in_val(g_rank, i, op));
  memset(recv, 0x5a, count * es);
  CHECK_OK(td_reduce(send, recv, count, dt, op, root, c));
  if (g_rank == root)
    for (size_t i = 0; i < count; i++) check_elem("reduce", recv, i, dt, op, expect_reduced(i, dt, op));
  xfree(recv);
  xfree(send);
}

static void test_reduce_scatter(td_comm *c, size_t count, td_dtype dt, td_op op, bool in_place) {
  size_t es = td_dtype_size(dt), off, len;
  td_shard_range(count, g_size, g_rank, &off, &len);
  char *send = xmalloc(count * es), *recv = in_place ? send + off * es : xmalloc(len * es);
  for (size_t i = 0; i < count; i++) td_dtype_set(send, i, dt, in_val(g_rank, i, op));
  CHECK_OK(td_reduce_scatter(send, recv, count, dt, op, c));
  for (size_t j = 0; j < len; j++) check_elem("reduce_scatter", recv, j, dt, op, expect_reduced(off + j, dt, op));
  if (!in_place) xfree(recv);
  xfree(send);
}

static double gather_val(size_t i) { return (double)((i * 13) % 97); }

static void test_allgather(td_comm *c, size_t count, td_dtype dt, bool in_place) {
  size_t es = td_dtype_size(dt), off, len;
  td_shard_range(count, g_size, g_rank, &off, &len);
  char *recv = xmalloc(count * es), *send = in_place ? recv + off * es : xmalloc(len * es);
  memset(recv, 0x5a, count * es);
  for (size_t j = 0; j < len; j++) td_dtype_set(send, j, dt, gather_val(off + j));
  CHECK_OK(td_allgather(send, recv, count, dt, c));
  for (size_t i = 0; i < count; i++) check_elem("allgather", recv, i, dt, TD_SUM, ct_round(gather_val(i), dt));
  if (!in_place) xfree(send);
  xfree(recv);
}

static void test_broadcast(td_comm *c, size_t count, td_dtype dt, int root) {
  size_t es = td_dtype_size(dt);
  char *buf = xmalloc(count * es);
  for (size_t i = 0; i < count; i++) td_dtype_set(buf, i, dt, g_rank == root ? gather_val(i + (size_t)root) : 0);
  CHECK_OK(td_broadcast(buf, count, dt, root, c));
  for (size_t i = 0; i < count; i++)
    check_elem("broadcast", buf, i, dt, TD_SUM, ct_round(gather_val(i + (size_t)root), dt));
  xfree(buf);
}

/* Block j of rank r's send, element t. */
static double a2a_val(int r, int j, size_t t) { return (double)(((size_t)r * 31 + (size_t)j * 7 + t) % 101); }

static void test_alltoall(td_comm *c, size_t count, td_dtype dt) {
  size_t es = td_dtype_size(dt), total = count * (size_t)g_size;
  char *send = xmalloc(total * es), *recv = xmalloc(total * es);
  for (int j = 0; j < g_size; j++)
    for (size_t t = 0; t < count; t++) td_dtype_set(send, (size_t)j * count + t, dt, a2a_val(g_rank, j, t));
  CHECK_OK(td_alltoall(send, recv, count, dt, c));
  for (int r = 0; r < g_size; r++)
    for (size_t t = 0; t < count; t++)
      check_elem("alltoall", recv, (size_t)r * count + t, dt, TD_SUM, ct_round(a2a_val(r, g_rank, t), dt));
  xfree(send);
  xfree(recv);
}

static int run_coll(td_comm *c, char *count_list) {
  char *items[16];
  int n_counts = ct_split_list(count_list, items, 16);
  for (int k = 0; k < n_counts; k++) {
    size_t count = strtoull(items[k], NULL, 10);
    for (int dt = 0; dt < TD_DTYPE_COUNT; dt++) {
      for (int op = 0; op < TD_OP_COUNT; op++) {
        test_allreduce(c, count, (td_dtype)dt, (td_op)op, (dt + op) % 2 == 0);
        test_reduce_scatter(c, count, (td_dtype)dt, (td_op)op, (dt + op) % 2 == 1);
        test_reduce(c, count, (td_dtype)dt, (td_op)op, (dt + op) % g_size);
      }
    }
    /* Both placements for the f32 sum, the training case. */
    test_allreduce(c, count, TD_F32, TD_SUM, true);
    test_allreduce(c, count, TD_F32, TD_SUM, false);
    test_reduce_scatter(c, count, TD_F32, TD_SUM, true);
    test_reduce_scatter(c, count, TD_F32, TD_SUM, false);
    td_dtype movers[] = {TD_F32, TD_U8, TD_F64, TD_BF16};
    for (size_t m = 0; m < CT_ARRAY_SIZE(movers); m++) {
      test_allgather(c, count, movers[m], m % 2 == 0);
      test_allgather(c, count, movers[m], m % 2 == 1);
      test_broadcast(c, count, movers[m], (int)(m + count) % g_size);
      test_alltoall(c, count, movers[m]);
    }
    if (g_rank == 0) printf("shm coll ok: n=%d count=%zu\n", g_size, count);
  }
  return 0;
}

/* No segment of this job may remain in /dev/shm once the communicator is up. */
static void check_no_segment(const char *job) {
  DIR *d = opendir("/dev/shm");
  if (!d) return;
  char want[160];
  snprintf(want, sizeof want, "tandem-%s", job);
  for (struct dirent *e; (e = readdir(d));)
    if (!strncmp(e->d_name, want, strlen(want)))
      td_test_fail(__FILE__, __LINE__, "rank %d: segment /dev/shm/%s still has a name after setup", g_rank,
                   e->d_name);
  closedir(d);
}

/* kill: the victim dies by SIGKILL; leave: it destroys its communicator
 * without finalizing and stays alive (its peers must not wait for it). */
static int run_kill(td_comm **cp, int victim, bool leave) {
  td_comm *c = *cp;
  CHECK(victim > 0 && victim < g_size);
  float x[4096];
  for (int i = 0; i < 4096; i++) x[i] = 1;
  CHECK_OK(td_allreduce(x, x, 4096, TD_F32, TD_SUM, c));
  CHECK_CLOSE(x[17], g_size, 0, 0);
  if (g_rank == victim) {
    usleep(200 * 1000);
    if (!leave) raise(SIGKILL);
    td_comm_destroy(c);
    *cp = NULL;
    sleep(2);
    return 0;
  }
  /* Survivors: a large (pipelined) allreduce the victim never joins. */
  size_t count = 1 << 20;
  float *big = xmalloc(count * sizeof *big);
  for (size_t i = 0; i < count; i++) big[i] = 1;
  double t0 = ct_now();
  td_status st = td_allreduce(big, big, count, TD_F32, TD_SUM, c);
  double dt = ct_now() - t0;
  CHECK_STATUS(st, TD_ERR_REMOTE);
  char want[32];
  snprintf(want, sizeof want, "rank %d", victim);
  const char *msg = td_comm_last_error(c);
  if (!strstr(msg, want)) td_test_fail(__FILE__, __LINE__, "error does not name %s: %s", want, msg);
  if (dt > 5.0) td_test_fail(__FILE__, __LINE__, "failure took %.2f s to detect (want < 5 s)", dt);
  /* Sticky: a later collective fails at once with the same status. */
  CHECK_STATUS(td_allreduce(x, x, 4, TD_F32, TD_SUM, c), TD_ERR_REMOTE);
  printf("shm %s ok rank %d after %.3f s job=%s\n", leave ? "leave" : "kill", g_rank, dt, job_id());
  fflush(stdout);
  xfree(big);
  return 0;
}

static int run_mismatch(td_comm *c) {
  CHECK(g_size >= 2);
  size_t count = g_rank == g_size - 1 ? 300001 : 300000;
  float *buf = xmalloc(count * sizeof *buf);
  for (size_t i = 0; i < count; i++) buf[i] = 1;
  CHECK_STATUS(td_allreduce(buf, buf, count, TD_F32, TD_SUM, c), TD_ERR_MISMATCH);
  const char *msg = td_comm_last_error(c);
  char want[32];
  snprintf(want, sizeof want, "rank %d", g_size - 1);
  if (!strstr(msg, want) || !strstr(msg, "count"))
    td_test_fail(__FILE__, __LINE__, "mismatch message does not name %s and the count: %s", want, msg);
  free(buf);
  printf("shm mismatch ok rank %d\n", g_rank);
  return 0;
}

/* td_mem_alloc's argument checks. */
static void check_mem_api(void) {
  void *p = (void *)1;
  CHECK(td_mem_alloc(0, &p) == TD_ERR_INVALID_ARGUMENT);
  CHECK(p == NULL);
  CHECK(td_mem_alloc(16, NULL) == TD_ERR_INVALID_ARGUMENT);
  CHECK_OK(td_mem_alloc(100000, &p));
  for (size_t i = 0; i < 100000; i++) CHECK(((unsigned char *)p)[i] == 0); /* zeroed */
  CHECK(((uintptr_t)p & 4095) == 0);                                         /* page-aligned */
  td_mem_free(p);
  td_mem_free(NULL);
  int not_ours = 0;
  td_mem_free(&not_ours); /* a warning, nothing freed, no crash */
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: test_shm_coll coll COUNTS | kill VICTIM | leave VICTIM | mismatch\n");
    return 2;
  }
  td_comm *c = NULL;
  CHECK_OK(td_comm_init(&c));
  g_rank = td_comm_rank(c);
  g_size = td_comm_size(c);
  if (g_size > 1 && strcmp(td_comm_transport(c), "shm") != 0)
    td_test_fail(__FILE__, __LINE__, "expected the shm transport, got %s", td_comm_transport(c));
  if (g_size > 1) check_no_segment(job_id());
  const char *alloc = getenv("SHM_TEST_ALLOC");
  if (alloc && !strcmp(alloc, "shared")) g_shared = true;
  if (alloc && !strcmp(alloc, "mixed")) g_shared = g_rank != g_size - 1;
  if (g_shared) check_mem_api();
  int rc = 2;
  if (!strcmp(argv[1], "coll") && argc > 2) {
    rc = run_coll(c, argv[2]);
    CHECK_OK(td_comm_finalize(c));
  } else if ((!strcmp(argv[1], "kill") || !strcmp(argv[1], "leave")) && argc > 2) {
    rc = run_kill(&c, atoi(argv[2]), argv[1][0] == 'l');
  } else if (!strcmp(argv[1], "mismatch")) {
    rc = run_mismatch(c);
  }
  td_comm_destroy(c);
  return rc;
}
