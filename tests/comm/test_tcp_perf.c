/* Allreduce timing over whatever transport the environment selects, for
 * comparing the TCP path with its peers by hand (not part of the suite;
 * performance is never asserted in tests):
 *
 *   TANDEM_TRANSPORT=tcp build/bin/tandemrun -np 2 build/tests/test_tcp_perf [BYTES...] [-n ITERS] [-w WARMUP]
 *
 * Prints, like shared/peers, one row per size on rank 0:
 *   size_bytes time_us algbw_GBs busbw_GBs cpu_ms
 * with the median over iterations of the slowest rank's time, busbw =
 * algbw * 2(n-1)/n, and cpu_ms the user+system CPU time per operation of
 * rank 0 (useful when the machine is shared and wall time is noisy). The
 * result is checked once per size (inputs 1.0 on every rank). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "../common/check.h"
#include "comm_test_util.h"

static double cpu_seconds(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
         (double)ru.ru_stime.tv_usec * 1e-6;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  size_t sizes[32];
  int n_sizes = 0, iters = 20, warmup = 3;
  for (int a = 1; a < argc; a++) {
    if (!strcmp(argv[a], "-n") && a + 1 < argc) iters = atoi(argv[++a]);
    else if (!strcmp(argv[a], "-w") && a + 1 < argc) warmup = atoi(argv[++a]);
    else if (n_sizes < 32) sizes[n_sizes++] = (size_t)strtoull(argv[a], NULL, 10);
  }
  if (!n_sizes) sizes[n_sizes++] = (size_t)64 << 20;
  if (iters < 1 || iters > 1000) iters = 20;

  td_comm *comm = NULL;
  CHECK_OK(td_comm_init(&comm));
  int rank = td_comm_rank(comm), size = td_comm_size(comm);
  if (rank == 0) {
    printf("# tandem allreduce f32 sum in place, n=%d, transport %s, %d iterations (median)\n", size,
           td_comm_transport(comm), iters);
    printf("# size_bytes time_us algbw_GBs busbw_GBs cpu_ms\n");
  }
  double *times = calloc((size_t)iters, sizeof *times);
  CHECK(times != NULL);
  for (int s = 0; s < n_sizes; s++) {
    size_t count = sizes[s] / sizeof(float);
    float *buf = malloc(count * sizeof(float) + 1);
    CHECK(buf != NULL);
    for (size_t i = 0; i < count; i++) buf[i] = 1.0f;
    CHECK_OK(td_allreduce(buf, buf, count, TD_F32, TD_SUM, comm));
    for (size_t i = 0; i < count; i++) CHECK_CLOSE(buf[i], (double)size, 0, 0);
    for (int w = 0; w < warmup; w++) CHECK_OK(td_allreduce(buf, buf, count, TD_F32, TD_SUM, comm));
    double cpu0 = cpu_seconds();
    for (int it = 0; it < iters; it++) {
      CHECK_OK(td_barrier(comm));
      double t0 = ct_now();
      CHECK_OK(td_allreduce(buf, buf, count, TD_F32, TD_SUM, comm));
      double dt = ct_now() - t0;
      /* the slowest rank's time */
      CHECK_OK(td_allreduce(&dt, &dt, 1, TD_F64, TD_MAX, comm));
      times[it] = dt;
    }
    double cpu = (cpu_seconds() - cpu0) / iters;
    qsort(times, (size_t)iters, sizeof *times, cmp_double);
    double med = times[iters / 2], bytes = (double)(count * sizeof(float));
    double algbw = bytes / med / 1e9, busbw = algbw * 2.0 * (size - 1) / (size > 0 ? size : 1);
    if (rank == 0)
      printf("%zu %.2f %.3f %.3f %.1f\n", count * sizeof(float), med * 1e6, algbw, busbw, cpu * 1e3);
    fflush(stdout);
    free(buf);
  }
  free(times);
  CHECK_OK(td_comm_finalize(comm));
  td_comm_destroy(comm);
  return 0;
}
