/* td_comm_collective_stats against a known sequence of operations: every
 * row's call count and byte count exact, the algorithm the one the selection
 * table (docs/collectives.md) names for this transport and these settings,
 * bus bytes = bytes x nccl-tests' bus factor written out here, and the
 * seconds positive and no more than the wall time around the operations.
 * Run under tandemrun with 2..N ranks and the transport/algorithm settings
 * of the suite line; a world of one must report no rows. */
#include "../common/check.h"

#include <time.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static const td_coll_stats *find(const td_coll_stats *rows, int n, const char *operation) {
  const td_coll_stats *hit = NULL;
  for (int i = 0; i < n; i++)
    if (!strcmp(rows[i].operation, operation)) {
      CHECK(hit == NULL); /* one algorithm per operation in this run */
      hit = &rows[i];
    }
  if (!hit) td_test_fail(__FILE__, __LINE__, "no row for %s", operation);
  return hit;
}

static void expect(const td_coll_stats *rows, int n, const char *operation, const char *algorithm, uint64_t calls,
                   uint64_t bytes, double factor, double wall_s) {
  const td_coll_stats *r = find(rows, n, operation);
  if (strcmp(r->algorithm, algorithm))
    td_test_fail(__FILE__, __LINE__, "%s ran %s, expected %s", operation, r->algorithm, algorithm);
  CHECK_EQ_INT((long long)r->calls, (long long)calls);
  CHECK_EQ_INT((long long)r->bytes, (long long)bytes);
  CHECK_CLOSE(r->bus_bytes, (double)bytes * factor, 1e-12, 0);
  CHECK(r->seconds > 0 && r->seconds <= wall_s);
}

int main(void) {
  td_comm *comm;
  CHECK_OK(td_comm_init(&comm));
  int rank = td_comm_rank(comm), n = td_comm_size(comm);
  /* odd sizes and a zero-count call, which moves nothing and is not counted */
  enum { SMALL = 37, LARGE = 100003 };
  size_t cap = (size_t)LARGE * (size_t)n;
  float *a = calloc(cap, sizeof(float)), *b = calloc(cap, sizeof(float));
  CHECK(a && b);
  double t0 = now_s();
  CHECK_OK(td_allreduce(a, b, SMALL, TD_F32, TD_SUM, comm));
  CHECK_OK(td_allreduce(a, b, LARGE, TD_F32, TD_AVG, comm));
  CHECK_OK(td_allreduce(a, b, 0, TD_F32, TD_SUM, comm));
  CHECK_OK(td_reduce_scatter(a, b, LARGE, TD_F32, TD_SUM, comm));
  CHECK_OK(td_allgather(a, b, SMALL, TD_F32, comm));
  CHECK_OK(td_broadcast(a, LARGE, TD_F32, 0, comm));
  CHECK_OK(td_alltoall(a, b, SMALL, TD_F32, comm));
  CHECK_OK(td_barrier(comm));
  CHECK_OK(td_barrier(comm));
  if (n > 1) { /* rank 0 sends SMALL floats to rank 1 */
    if (rank == 0) CHECK_OK(td_send(a, SMALL, TD_F32, 1, comm));
    if (rank == 1) CHECK_OK(td_recv(b, SMALL, TD_F32, 0, comm));
  }
  double wall = now_s() - t0;
  td_coll_stats rows[40];
  int count = td_comm_collective_stats(comm, rows, 40);
  if (n == 1) {
    CHECK_EQ_INT(count, 0);
    printf("world of one: no rows\n");
  } else {
    /* the selection table for these settings (docs/collectives.md) */
    const char *algo_env = getenv("TANDEM_ALLREDUCE_ALGO");
    const char *shm_env = getenv("TANDEM_SHM_COLLECTIVES");
    int shm = !strcmp(td_comm_transport(comm), "shm") && !(shm_env && !strcmp(shm_env, "0"));
    const char *allreduce_small = shm ? "shm" : "rd", *allreduce_large = shm ? "shm" : "ring";
    if (algo_env && strcmp(algo_env, "auto")) allreduce_small = allreduce_large = algo_env;
    double f_ar = 2.0 * (n - 1) / n, f_rs = (double)(n - 1) / n;
    uint64_t fsz = sizeof(float);
    if (!strcmp(allreduce_small, allreduce_large)) {
      expect(rows, count, "allreduce", allreduce_small, 2, (SMALL + LARGE) * fsz, f_ar, wall);
    } else { /* recursive doubling for the small one, the ring for the large one */
      int seen = 0;
      for (int i = 0; i < count; i++) {
        if (strcmp(rows[i].operation, "allreduce")) continue;
        uint64_t want = !strcmp(rows[i].algorithm, allreduce_small) ? SMALL * fsz : LARGE * fsz;
        CHECK_EQ_INT((long long)rows[i].calls, 1);
        CHECK_EQ_INT((long long)rows[i].bytes, (long long)want);
        CHECK_CLOSE(rows[i].bus_bytes, (double)want * f_ar, 1e-12, 0);
        seen++;
      }
      CHECK_EQ_INT(seen, 2);
    }
    expect(rows, count, "reduce_scatter", shm ? "shm" : "ring", 1, LARGE * fsz, f_rs, wall);
    expect(rows, count, "allgather", shm ? "shm" : "ring", 1, SMALL * fsz, f_rs, wall);
    expect(rows, count, "broadcast", shm ? "shm" : "tree", 1, LARGE * fsz, 1.0, wall);
    expect(rows, count, "alltoall", shm ? "shm" : "pairwise", 1, SMALL * fsz * (uint64_t)n, f_rs, wall);
    expect(rows, count, "barrier", shm ? "shm" : "dissemination", 2, 0, 0.0, wall);
    int p2p_rows = rank <= 1 ? 1 : 0;
    if (rank == 0) expect(rows, count, "send", "p2p", 1, SMALL * fsz, 1.0, wall);
    if (rank == 1) expect(rows, count, "recv", "p2p", 1, SMALL * fsz, 1.0, wall);
    int want_rows = (strcmp(allreduce_small, allreduce_large) ? 2 : 1) + 5 + p2p_rows;
    CHECK_EQ_INT(count, want_rows);
    /* a short table gets the first rows and the full count */
    td_coll_stats one;
    CHECK_EQ_INT(td_comm_collective_stats(comm, &one, 1), count);
    CHECK(!strcmp(one.operation, rows[0].operation) && one.calls == rows[0].calls);
    CHECK_EQ_INT(td_comm_collective_stats(comm, NULL, 0), count);
    if (rank == 0)
      printf("%d ranks on %s: %d rows, allreduce %s/%s\n", n, td_comm_transport(comm), count, allreduce_small,
             allreduce_large);
  }
  CHECK_EQ_INT(td_comm_collective_stats(NULL, rows, 40), 0);
  free(a);
  free(b);
  CHECK_OK(td_comm_finalize(comm));
  td_comm_destroy(comm);
  return 0;
}
