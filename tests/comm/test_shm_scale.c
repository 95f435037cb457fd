/* The shared-memory transport at many ranks: what it costs a job must grow
 * with n, not n^2 (issue 7 item 10).
 *
 *   tandemrun -np N test_shm_scale tree
 *     Allreduce over more than 16 ranks with under a page per rank's slice
 *     (the reduction tree of allreduce_shm_tree.c): every dtype and op,
 *     counts 0..4099, against closed-form results, and non-integer f32
 *     sums identical bit for bit on every rank. With N >= 64, the first
 *     4 KiB allreduce after a barrier may take at most 32 minor page faults
 *     per rank: every rank reading every other rank's slot takes >= N - 1.
 *   tandemrun -np N test_shm_scale fifo
 *     The segment's n(n-1) point-to-point FIFOs are reserved only when
 *     used: after setup, less than a quarter of the segment is allocated
 *     (st_blocks through /proc/self/map_files; with 64 KiB slots the FIFOs are most of it), and a ring of
 *     sends and receives between neighbours delivers its data and reserves
 *     only the FIFOs it used. */
#define _GNU_SOURCE 1
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/check.h"
#include "comm_test_util.h"

static long minflt(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}

/* Input of rank r at element i: 1..11, or 1/2 for PROD (at most a third of
 * the ranks hold a 2 at any index), exact in every dtype. */
static double input(int r, size_t i, td_op op) {
  if (op == TD_PROD) return ((i + (size_t)r) % 3 == 0) ? 2 : 1;
  return (double)(1 + (i * 7 + (size_t)r * 3) % 11);
}

static double expected(int n, size_t i, td_op op, td_dtype dtype) {
  double acc = input(0, i, op);
  for (int r = 1; r < n; r++) {
    double v = input(r, i, op);
    acc = op == TD_PROD ? acc * v : op == TD_MIN ? (v < acc ? v : acc) : op == TD_MAX ? (v > acc ? v : acc) : acc + v;
  }
  if (dtype == TD_U8) acc = (double)((uint64_t)acc & 0xff); /* u8 arithmetic wraps */
  if (op == TD_AVG) {
    if (ct_is_float(dtype)) return ct_round(acc / n, dtype);
    return (double)((int64_t)acc / n);
  }
  return ct_round(acc, dtype);
}

static uint64_t fnv(const void *p, size_t bytes) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < bytes; i++) h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ull;
  return h;
}

static int run_tree(void) {
  td_comm *c = NULL;
  CHECK_OK(td_comm_init(&c));
  int n = td_comm_size(c), r = td_comm_rank(c);
  CHECK(n > 16);
  CHECK_OK(td_barrier(c));

  /* First touch: the first 4 KiB allreduce after setup. */
  float *v = malloc(1024 * sizeof *v);
  CHECK(v != NULL);
  for (int i = 0; i < 1024; i++) v[i] = (float)(r + i);
  long f0 = minflt();
  CHECK_OK(td_allreduce(v, v, 1024, TD_F32, TD_SUM, c));
  long faults = minflt() - f0;
  for (int i = 0; i < 1024; i++) CHECK_EQ_INT(v[i], (long long)n * i + (long long)n * (n - 1) / 2);
  free(v);
  if (n >= 64 && faults > 32)
    td_test_fail(__FILE__, __LINE__, "rank %d of %d: the first 4 KiB allreduce took %ld minor page faults (at most 32: "
                 "a rank must not touch a page of every other rank's slot)", r, n, faults);

  static const td_dtype dtypes[] = {TD_F32, TD_F64, TD_I32, TD_I64, TD_U8, TD_F16, TD_BF16};
  static const td_op ops[] = {TD_SUM, TD_PROD, TD_MIN, TD_MAX, TD_AVG};
  static const size_t counts[] = {0, 1, 7, 1000, 4099};
  size_t max = 4099;
  unsigned char *in = malloc(max * 8), *out = malloc(max * 8);
  CHECK(in && out);
  for (size_t d = 0; d < CT_ARRAY_SIZE(dtypes); d++)
    for (size_t o = 0; o < CT_ARRAY_SIZE(ops); o++)
      for (size_t k = 0; k < CT_ARRAY_SIZE(counts); k++) {
        td_dtype dt = dtypes[d];
        td_op op = ops[o];
        size_t count = counts[k];
        if ((dt == TD_F16 || dt == TD_BF16) && (op == TD_PROD || op == TD_AVG)) continue;
        for (size_t i = 0; i < count; i++) td_dtype_set(in, i, dt, input(r, i, op));
        memset(out, 0xee, max * 8);
        bool in_place = k % 2;
        if (in_place) memcpy(out, in, count * td_dtype_size(dt));
        CHECK_OK(td_allreduce(in_place ? out : in, out, count, dt, op, c));
        for (size_t i = 0; i < count; i++) {
          double got = td_dtype_get(out, i, dt), want = expected(n, i, op, dt);
          if (op == TD_AVG && ct_is_float(dt) ? !(fabs(got - want) <= 1e-6 * fabs(want)) : got != want)
            td_test_fail(__FILE__, __LINE__, "rank %d of %d: allreduce %s %s count %zu (%s): element %zu is %.9g, "
                         "expected %.9g", r, n, td_dtype_name(dt), td_op_name(op), count,
                         in_place ? "in place" : "out of place", i, got, want);
        }
      }

  /* Non-integer f32 sums: close to the exact sum, the same bits everywhere. */
  float *x = (float *)in, *s = (float *)out;
  for (size_t i = 0; i < 1000; i++) x[i] = (float)(r + 1) * 0.1f + (float)i * 1e-3f;
  CHECK_OK(td_allreduce(x, s, 1000, TD_F32, TD_SUM, c));
  for (size_t i = 0; i < 1000; i++) {
    double exact = 0;
    for (int q = 0; q < n; q++) exact += (double)((float)(q + 1) * 0.1f + (float)i * 1e-3f);
    CHECK_CLOSE(s[i], exact, 1e-5, 0);
  }
  uint64_t h = fnv(s, 1000 * sizeof *s), *all = malloc((size_t)n * sizeof *all);
  CHECK(all != NULL);
  CHECK_OK(td_allgather(&h, all, (size_t)n, TD_I64, c));
  for (int q = 0; q < n; q++)
    if (all[q] != h) td_test_fail(__FILE__, __LINE__, "ranks %d and %d got different f32 sums", r, q);
  free(all);
  free(in);
  free(out);
  CHECK_OK(td_comm_finalize(c));
  if (r == 0) printf("tree ok: %d ranks, %ld page faults in the first 4 KiB allreduce on rank 0\n", n, faults);
  td_comm_destroy(c);
  return 0;
}

/* The shared segment's mapping in this process: "/dev/shm/tandem-...". */
static void find_segment(char *path, size_t path_size, size_t *bytes) {
  FILE *f = fopen("/proc/self/maps", "r");
  CHECK(f != NULL);
  char line[512];
  path[0] = '\0';
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    if (strstr(line, "/dev/shm/tandem-") && sscanf(line, "%lx-%lx", &lo, &hi) == 2) {
      snprintf(path, path_size, "/proc/self/map_files/%lx-%lx", lo, hi);
      *bytes = hi - lo;
    }
  }
  fclose(f);
  CHECK(path[0] != '\0');
}

/* Bytes of the segment that are allocated (reserved or written): its
 * st_blocks, through the mapping (the name is unlinked after setup). */
static size_t allocated(const char *path) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) td_test_fail(__FILE__, __LINE__, "cannot open %s (%s): this test needs CAP_SYS_ADMIN", path,
                           strerror(errno));
  struct stat st;
  CHECK(fstat(fd, &st) == 0);
  close(fd);
  return (size_t)st.st_blocks * 512;
}

static int run_fifo(void) {
  td_comm *c = NULL;
  CHECK_OK(td_comm_init(&c));
  int n = td_comm_size(c), r = td_comm_rank(c);
  CHECK(!strcmp(td_comm_transport(c), "shm"));
  CHECK_OK(td_barrier(c));
  char path[128];
  size_t bytes = 0;
  find_segment(path, sizeof path, &bytes);
  size_t before = allocated(path);
  if (before * 4 > bytes)
    td_test_fail(__FILE__, __LINE__, "rank %d of %d: %zu of the segment's %zu bytes are allocated after setup (the "
                 "FIFOs must be reserved only when used)", r, n, before, bytes);
  /* A ring: send to the next rank, receive from the previous one (even
   * ranks send first, so that the exchange cannot deadlock on full FIFOs). */
  enum { COUNT = 50000 };
  int32_t *sbuf = malloc(COUNT * sizeof *sbuf), *rbuf = malloc(COUNT * sizeof *rbuf);
  CHECK(sbuf && rbuf);
  for (int i = 0; i < COUNT; i++) sbuf[i] = r * 1000003 + i;
  int next = (r + 1) % n, prev = (r + n - 1) % n;
  if (r % 2 == 0) {
    CHECK_OK(td_send(sbuf, COUNT, TD_I32, next, c));
    CHECK_OK(td_recv(rbuf, COUNT, TD_I32, prev, c));
  } else {
    CHECK_OK(td_recv(rbuf, COUNT, TD_I32, prev, c));
    CHECK_OK(td_send(sbuf, COUNT, TD_I32, next, c));
  }
  for (int i = 0; i < COUNT; i++) CHECK_EQ_INT(rbuf[i], prev * 1000003 + i);
  CHECK_OK(td_barrier(c));
  size_t after = allocated(path);
  /* n FIFOs used in all; each at most bytes / (n (n-1)) plus a page either side. */
  size_t bound = before + (size_t)n * (bytes / ((size_t)n * (n - 1)) + 2 * 4096);
  if (after > bound)
    td_test_fail(__FILE__, __LINE__, "rank %d of %d: %zu bytes allocated after the ring (before %zu, bound %zu)", r, n,
                 after, before, bound);
  free(sbuf);
  free(rbuf);
  CHECK_OK(td_comm_finalize(c));
  if (r == 0)
    printf("fifo ok: %d ranks, segment %zu bytes, %zu allocated after setup, %zu after a ring of sends\n", n, bytes,
           before, after);
  td_comm_destroy(c);
  return 0;
}

int main(int argc, char **argv) {
  if (argc >= 2 && !strcmp(argv[1], "tree")) return run_tree();
  if (argc >= 2 && !strcmp(argv[1], "fifo")) return run_fifo();
  fprintf(stderr, "usage: test_shm_scale tree | fifo\n");
  return 2;
}
