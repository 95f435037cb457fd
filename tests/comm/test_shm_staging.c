/* td_comm_staging_bytes against the kernel's count (issue 23): the pages of
 * a shm communicator's segment that a rank's RSS gains by running
 * collectives and point-to-point messages on malloc'd buffers.
 *
 *   test_shm_staging KIND COUNT[,COUNT...]
 *     KIND: allreduce, allgather, reduce_scatter, broadcast (every rank a
 *     root in turn), p2p (a ring: each rank sends COUNT floats to the next
 *     and receives from the previous), or mixed (an allreduce of COUNT and
 *     an allgather and a reduce-scatter of 3 x COUNT, one traffic).
 *
 * For each COUNT, on a communicator split afresh from the world (its own
 * segment, nothing of its slots or FIFOs touched yet): RssShmem of
 * /proc/self/status before, the operations (run three times, a barrier
 * before the third, so that both slot parities take every role, as the
 * estimate assumes), RssShmem after. The difference, the kernel's figure,
 * must be close to what td_comm_staging_bytes says for that traffic: equal
 * to the page for most kinds, sizes and rank counts (the kernel maps pages
 * around each read fault, which the estimate follows), at most one
 * fault-around window (64 KiB) above it (seen: 3 pages, a mixed traffic on
 * 3 ranks) and at least half of it (seen below it: a reduce-scatter's rank
 * > 0 reads its slice of a peer's slot at an offset, which the estimate
 * counts from the slot's start; a FIFO's pages once mapped on one side
 * only); and the results are checked against their closed forms so that the
 * operations really ran. Over TCP (TANDEM_TRANSPORT=tcp) it must say 0. At
 * the default 1 MiB slots: smaller ones than the 64 KiB window make a read
 * map pages of several slots, which the estimate bounds loosely. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/check.h"
#include "tandem/tandem.h"

static int g_rank, g_size;

/* The kernel's fault-around window (64 KiB): a read fault maps the pages
 * around it that are already there; the estimate follows its rule
 * (shm_slot_pages), but pages another comm's or a neighbouring slot's
 * owner wrote near a window were seen counted up to 3 pages over it. */
#define FAULT_AROUND ((size_t)64 << 10)

/* RssShmem in bytes (the shared pages this process has mapped and touched). */
static size_t rss_shmem(void) {
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) td_test_fail(__FILE__, __LINE__, "cannot read /proc/self/status");
  char line[256];
  size_t kib = 0;
  bool found = false;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "RssShmem: %zu kB", &kib) == 1) {
      found = true;
      break;
    }
  fclose(f);
  if (!found) td_test_fail(__FILE__, __LINE__, "no RssShmem in /proc/self/status (kernel older than 4.5?)");
  return kib << 10;
}

static float val(int rank, size_t i) { return (float)((i * 5 + (size_t)rank * 3) % 13 + 1); }

static void fill(float *buf, size_t n, int rank) {
  for (size_t i = 0; i < n; i++) buf[i] = val(rank, i);
}

static void check_sum(const float *buf, size_t n, size_t first, const char *what) {
  for (size_t i = 0; i < n; i++) {
    float want = 0;
    for (int r = 0; r < g_size; r++) want += val(r, first + i);
    if (buf[i] != want)
      td_test_fail(__FILE__, __LINE__, "rank %d %s element %zu: got %g want %g", g_rank, what, first + i, buf[i],
                   want);
  }
}

/* One round of KIND on comm at count floats; the results checked. */
static void run_once(td_comm *c, const char *kind, size_t count, float *a, float *b) {
  int me = td_comm_rank(c), n = td_comm_size(c);
  if (!strcmp(kind, "allreduce")) {
    fill(a, count, me);
    CHECK_OK(td_allreduce(a, a, count, TD_F32, TD_SUM, c));
    check_sum(a, count, 0, "allreduce");
  } else if (!strcmp(kind, "allgather")) {
    size_t off, len;
    td_shard_range(count, n, me, &off, &len);
    for (size_t i = 0; i < len; i++) a[i] = val(0, off + i);
    CHECK_OK(td_allgather(a, b, count, TD_F32, c));
    for (size_t i = 0; i < count; i++)
      if (b[i] != val(0, i)) td_test_fail(__FILE__, __LINE__, "rank %d allgather element %zu: got %g", me, i, b[i]);
  } else if (!strcmp(kind, "reduce_scatter")) {
    size_t off, len;
    td_shard_range(count, n, me, &off, &len);
    fill(a, count, me);
    CHECK_OK(td_reduce_scatter(a, b, count, TD_F32, TD_SUM, c));
    check_sum(b, len, off, "reduce_scatter");
  } else if (!strcmp(kind, "broadcast")) {
    for (int root = 0; root < n; root++) {
      for (size_t i = 0; i < count; i++) a[i] = me == root ? val(root, i) : -1.0f;
      CHECK_OK(td_broadcast(a, count, TD_F32, root, c));
      for (size_t i = 0; i < count; i++)
        if (a[i] != val(root, i))
          td_test_fail(__FILE__, __LINE__, "rank %d broadcast from %d element %zu: got %g", me, root, i, a[i]);
    }
  } else if (!strcmp(kind, "p2p")) {
    int next = (me + 1) % n, prev = (me + n - 1) % n;
    fill(a, count, me);
    td_request *s = NULL, *r = NULL;
    CHECK_OK(td_isend(a, count, TD_F32, next, c, &s));
    CHECK_OK(td_irecv(b, count, TD_F32, prev, c, &r));
    CHECK_OK(td_wait(r));
    CHECK_OK(td_wait(s));
    for (size_t i = 0; i < count; i++)
      if (b[i] != val(prev, i)) td_test_fail(__FILE__, __LINE__, "rank %d p2p element %zu: got %g", me, i, b[i]);
  } else if (!strcmp(kind, "mixed")) {
    run_once(c, "allreduce", count, a, b);
    run_once(c, "allgather", 3 * count, a, b);
    run_once(c, "reduce_scatter", 3 * count, a, b);
  } else {
    td_test_fail(__FILE__, __LINE__, "unknown kind %s", kind);
  }
}

static td_comm_traffic traffic_of(const char *kind, size_t count, int *next, int *prev, td_comm *c) {
  size_t bytes = count * sizeof(float);
  td_comm_traffic t = {0};
  if (!strcmp(kind, "allreduce")) t.allreduce = bytes;
  if (!strcmp(kind, "allgather")) t.allgather = bytes;
  if (!strcmp(kind, "reduce_scatter")) t.reduce_scatter = bytes;
  if (!strcmp(kind, "broadcast")) t.broadcast = bytes;
  if (!strcmp(kind, "mixed")) t.allreduce = bytes, t.allgather = t.reduce_scatter = 3 * bytes;
  if (!strcmp(kind, "p2p")) {
    *next = (td_comm_rank(c) + 1) % td_comm_size(c);
    *prev = (td_comm_rank(c) + td_comm_size(c) - 1) % td_comm_size(c);
    t.send_peers = next, t.n_send_peers = 1;
    t.recv_peers = prev, t.n_recv_peers = 1;
  }
  return t;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: test_shm_staging allreduce|allgather|reduce_scatter|broadcast|p2p|mixed COUNT[,COUNT...]\n");
    return 2;
  }
  const char *kind = argv[1];
  td_comm *world = NULL;
  CHECK_OK(td_comm_init(&world));
  g_rank = td_comm_rank(world);
  g_size = td_comm_size(world);
  if (g_size < 2) {
    printf("SKIPPED: needs 2+ ranks (got %d)\n", g_size);
    td_comm_destroy(world);
    return 0;
  }
  if (strcmp(td_comm_transport(world), "shm") != 0) { /* its scratch is the heap's: nothing staged in a segment */
    int next = -1, prev = -1;
    td_comm_traffic t = traffic_of("mixed", 1 << 20, &next, &prev, world);
    if (td_comm_staging_bytes(world, &t, NULL) != 0)
      td_test_fail(__FILE__, __LINE__, "the %s transport says it has staging", td_comm_transport(world));
    printf("rank %d: %s has no staging: ok\n", g_rank, td_comm_transport(world));
    CHECK_OK(td_comm_finalize(world));
    td_comm_destroy(world);
    return 0;
  }
  char *list = strdup(argv[2]);
  for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
    size_t count = strtoull(tok, NULL, 10), room = 3 * count + 1;
    float *a = malloc(room * sizeof(float)), *b = malloc(room * sizeof(float));
    if (!a || !b) td_test_fail(__FILE__, __LINE__, "out of memory for %zu floats", room);
    /* touched here first, so that only the segment's pages can change RssShmem */
    memset(a, 0, room * sizeof(float));
    memset(b, 0, room * sizeof(float));
    td_comm *c = NULL;
    CHECK_OK(td_comm_split(world, 0, g_rank, &c));
    CHECK_OK(td_barrier(c));
    int next = -1, prev = -1;
    td_comm_traffic t = traffic_of(kind, count, &next, &prev, c);
    size_t theirs = 0, want = td_comm_staging_bytes(c, &t, &theirs);
    size_t before = rss_shmem();
    /* twice back to back, then after one barrier (a sync): whether a round
     * takes an odd or an even number of syncs, some two rounds start on
     * different parities */
    for (int round = 0; round < 3; round++) {
      if (round == 2) CHECK_OK(td_barrier(c));
      run_once(c, kind, count, a, b);
    }
    size_t got = rss_shmem() - before;
    printf("rank %d/%d %s count %zu: RssShmem +%zu KiB, td_comm_staging_bytes %zu KiB (peers' %zu)\n", g_rank,
           g_size, kind, count, got >> 10, want >> 10, theirs >> 10);
    /* a FIFO the progress thread reserved before `before` (seen on one rank of 2) is not in the difference */
    size_t fifo_early = !strcmp(kind, "p2p") ? 2 * 4096 : 0;
    if (got > want + FAULT_AROUND || got + fifo_early < want / 2)
      td_test_fail(__FILE__, __LINE__, "rank %d %s of %zu floats: the segment's pages in RSS grew by %zu bytes, "
                   "td_comm_staging_bytes says %zu", g_rank, kind, count, got, want);
    if (theirs > want) td_test_fail(__FILE__, __LINE__, "the peers' part %zu exceeds the whole %zu", theirs, want);
    CHECK_OK(td_comm_finalize(c));
    td_comm_destroy(c);
    free(a);
    free(b);
  }
  free(list);
  /* nothing to count off the shm transport, nor without a communicator */
  td_comm_traffic t = {.allreduce = 1 << 20};
  if (td_comm_staging_bytes(NULL, &t, NULL) != 0) td_test_fail(__FILE__, __LINE__, "a NULL comm has staging");
  CHECK_OK(td_comm_finalize(world));
  td_comm_destroy(world);
  printf("rank %d: staging ok\n", g_rank);
  return 0;
}
