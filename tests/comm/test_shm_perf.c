/* Hand-run benchmark of allreduce over shared memory (not part of the suite;
 * tandem-bench is the full tool). Mirrors ../shared/peers/mpi_allreduce.c so
 * that figures compare one to one: f32 sum in place (out of place with
 * TEST_SHM_PERF_OOP=1), 3 warm-up calls, then `iters` timed calls; the time is
 * the slowest rank's mean, and each size is measured REPS times (median shown).
 *
 *   tandemrun -np 2 build/bin/../tests/test_shm_perf [REPS] BYTES...
 * Prints: size_bytes time_us algbw_GBs busbw_GBs (median), min/max time_us. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/check.h"
#include "comm_test_util.h"

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  td_comm *c = NULL;
  CHECK_OK(td_comm_init(&c));
  int rank = td_comm_rank(c), n = td_comm_size(c);
  int first = 1, reps = 5;
  if (argc > 2 && strchr(argv[1], 'x')) reps = atoi(argv[1] + 1), first = 2;
  bool oop = getenv("TEST_SHM_PERF_OOP") && atoi(getenv("TEST_SHM_PERF_OOP"));
  if (rank == 0)
    printf("# tandem allreduce n=%d transport=%s %s, median of %d\n"
           "# size_bytes time_us algbw_GBs busbw_GBs min_us max_us\n",
           n, td_comm_transport(c), oop ? "out of place" : "in place", reps);
  for (int a = first; a < argc; a++) {
    size_t bytes = strtoull(argv[a], NULL, 10), count = bytes / 4;
    float *buf = malloc(count * 4 + 64), *out = malloc(count * 4 + 64);
    for (size_t i = 0; i < count; i++) buf[i] = 1.0f;
    memset(out, 0, count * 4);
    float *recv = oop ? out : buf;
    int iters = (int)((256u << 20) / (bytes + 1) / 4);
    if (iters < 5) iters = 5;
    if (iters > 1000) iters = 1000;
    double times[64];
    for (int r = 0; r < reps && r < 64; r++) {
      for (int i = 0; i < 3; i++) CHECK_OK(td_allreduce(buf, recv, count, TD_F32, TD_SUM, c));
      CHECK_OK(td_barrier(c));
      double t0 = ct_now();
      for (int i = 0; i < iters; i++) CHECK_OK(td_allreduce(buf, recv, count, TD_F32, TD_SUM, c));
      double dt = (ct_now() - t0) / iters, max_dt = 0;
      CHECK_OK(td_allreduce(&dt, &max_dt, 1, TD_F64, TD_MAX, c));
      times[r] = max_dt;
    }
    qsort(times, (size_t)reps, sizeof *times, cmp_double);
    double med = times[reps / 2];
    if (rank == 0)
      printf("%zu %.2f %.3f %.3f %.2f %.2f\n", bytes, med * 1e6, bytes / med / 1e9,
             bytes * 2.0 * (n - 1) / n / med / 1e9, times[0] * 1e6, times[reps - 1] * 1e6);
    fflush(stdout);
    free(buf);
    free(out);
  }
  CHECK_OK(td_comm_finalize(c));
  td_comm_destroy(c);
  return 0;
}
