/* Single-copy point-to-point payloads over shared memory
 * (src/comm/transport/shm/shm_cma.c), run under tandemrun on one host:
 *
 *   test_shm_cma exchange SIZES   every rank sends every other rank one message
 *                                 of each size (bytes) at once (td_isend /
 *                                 td_irecv, then td_wait on all); the bytes
 *                                 received equal a closed form of (sender,
 *                                 receiver, size, index). Then, per pair, the
 *                                 ring's counters: with SHM_TEST_CMA=1 every
 *                                 payload of 64 KiB or more (the suite runs a
 *                                 4 KiB FIFO, so each of them is larger than
 *                                 the ring) went by post, read whole (posted ==
 *                                 taken == their sum), and the ring carried
 *                                 only the headers and the small payloads;
 *                                 with SHM_TEST_CMA=0 nothing was posted.
 *                                 SHM_TEST_CMA_OFF=K: rank K sets
 *                                 TANDEM_SHM_CMA=0 before td_comm_init, so
 *                                 nothing is posted to it nor by it, and every
 *                                 other pair posts.
 *   test_shm_cma dead             rank 1 posts a 4 MiB send to rank 0 and exits
 *                                 before rank 0 receives: rank 0's receive
 *                                 fails with TD_ERR_REMOTE naming rank 1 as
 *                                 dead, within seconds; prints "cma dead ok". */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/check.h"
#include "comm/transport/shm/shm.h"
#include "comm_test_util.h"

static int g_rank, g_size;

static unsigned char byte_of(int src, int dst, size_t size, size_t j) {
  return (unsigned char)((size_t)src * 131u + (size_t)dst * 17u + size * 3u + j * 7u + (j >> 11));
}

/* What a frame header costs in the ring: the engine's header
 * (src/comm/core/core.h), the same for every frame. */
#define HDR_BYTES sizeof(comm_hdr)

static int run_exchange(td_comm *c, char *list, int expect_cma, int cma_off_rank) {
  char *tok[32];
  int n_sizes = ct_split_list(list, tok, 32);
  size_t sizes[32];
  for (int k = 0; k < n_sizes; k++) sizes[k] = (size_t)strtoull(tok[k], NULL, 10);
  /* a receiver probes whether it can read a sender when it first reads
   * their ring: a round of 1-byte messages on every pair first, then the
   * counters are read before and after the exchange */
  shm_transport *t = shm_of(c);
  CHECK(t != NULL);
  for (int step = 1; step < g_size; step++) {
    unsigned char one = 1, got = 0;
    td_request *r2[2];
    CHECK_OK(td_isend(&one, 1, TD_U8, (g_rank + step) % g_size, c, &r2[0]));
    CHECK_OK(td_irecv(&got, 1, TD_U8, (g_rank - step + g_size) % g_size, c, &r2[1]));
    CHECK_OK(td_wait(r2[0]));
    CHECK_OK(td_wait(r2[1]));
    CHECK_EQ_INT(got, 1);
  }
  CHECK_OK(td_barrier(c));
  uint64_t posted0[64] = {0}, ring0[64] = {0};
  CHECK(g_size <= 64);
  for (int to = 0; to < g_size; to++) {
    if (to == g_rank) continue;
    posted0[to] = atomic_load(&shm_fifo_of(t, g_rank, to)->post_total);
    ring0[to] = atomic_load(&shm_fifo_of(t, g_rank, to)->head);
  }
  int n_msgs = (g_size - 1) * n_sizes;
  unsigned char **out = calloc((size_t)n_msgs, sizeof *out), **in = calloc((size_t)n_msgs, sizeof *in);
  td_request **req = calloc(2 * (size_t)n_msgs, sizeof *req);
  CHECK(out && in && req);
  int m = 0;
  for (int k = 0; k < n_sizes; k++) {
    for (int step = 1; step < g_size; step++, m++) {
      int to = (g_rank + step) % g_size, from = (g_rank - step + g_size) % g_size;
      out[m] = malloc(sizes[k] + 1);
      in[m] = malloc(sizes[k] + 1);
      CHECK(out[m] && in[m]);
      for (size_t j = 0; j < sizes[k]; j++) out[m][j] = byte_of(g_rank, to, sizes[k], j);
      memset(in[m], 0xEE, sizes[k] + 1);
      CHECK_OK(td_isend(out[m], sizes[k], TD_U8, to, c, &req[2 * m]));
      CHECK_OK(td_irecv(in[m], sizes[k], TD_U8, from, c, &req[2 * m + 1]));
    }
  }
  for (int i = 0; i < 2 * n_msgs; i++) CHECK_OK(td_wait(req[i]));
  m = 0;
  for (int k = 0; k < n_sizes; k++) {
    for (int step = 1; step < g_size; step++, m++) {
      int from = (g_rank - step + g_size) % g_size;
      for (size_t j = 0; j < sizes[k]; j++)
        if (in[m][j] != byte_of(from, g_rank, sizes[k], j))
          td_test_fail(__FILE__, __LINE__, "rank %d: byte %zu of the %zu-byte message from rank %d is %d, want %d",
                       g_rank, j, sizes[k], from, in[m][j], byte_of(from, g_rank, sizes[k], j));
      if (in[m][sizes[k]] != 0xEE)
        td_test_fail(__FILE__, __LINE__, "rank %d: the %zu-byte message from rank %d wrote past its end", g_rank,
                     sizes[k], from);
    }
  }
  /* the counters of the rings this rank wrote: every message above is
   * received, so nothing is in flight on them */
  size_t large = 0, small = 0;
  for (int k = 0; k < n_sizes; k++) {
    if (sizes[k] >= SHM_CMA_MIN_BYTES) large += sizes[k];
    else small += sizes[k];
  }
  for (int to = 0; to < g_size; to++) {
    if (to == g_rank) continue;
    shm_fifo *f = shm_fifo_of(t, g_rank, to);
    uint64_t taken = atomic_load(&f->post_taken) - posted0[to], posted = atomic_load(&f->post_total) - posted0[to];
    uint64_t ring = atomic_load(&f->head) - ring0[to];
    bool pair_cma = expect_cma && g_rank != cma_off_rank && to != cma_off_rank;
    uint64_t want_posted = pair_cma ? large : 0;
    if (posted != want_posted || taken != posted)
      td_test_fail(__FILE__, __LINE__, "rank %d -> %d: %llu bytes posted, %llu taken; want %llu both", g_rank, to,
                   (unsigned long long)posted, (unsigned long long)taken, (unsigned long long)want_posted);
    /* every frame's header, the small payloads, and without posts the large ones */
    uint64_t want_ring = (uint64_t)n_sizes * HDR_BYTES + small + (pair_cma ? 0 : large);
    if (ring != want_ring)
      td_test_fail(__FILE__, __LINE__, "rank %d -> %d: the ring carried %llu bytes, want %llu", g_rank, to,
                   (unsigned long long)ring, (unsigned long long)want_ring);
  }
  for (int i = 0; i < n_msgs; i++) {
    free(out[i]);
    free(in[i]);
  }
  free(out);
  free(in);
  free(req);
  printf("rank %d: cma exchange ok (%d sizes, %d ranks, cma %s)\n", g_rank, n_sizes, g_size,
         expect_cma ? "expected" : "off");
  return 0;
}

static int run_dead(td_comm *c) {
  const size_t bytes = (size_t)4 << 20;
  if (g_rank == 1) {
    unsigned char *buf = malloc(bytes);
    CHECK(buf);
    memset(buf, 7, bytes);
    td_request *req = NULL;
    CHECK_OK(td_isend(buf, bytes, TD_U8, 0, c, &req));
    usleep(500 * 1000); /* the progress thread posts it; then this process is gone */
    fflush(stdout);
    _exit(3);
  }
  if (g_rank != 0) return 0;
  usleep(1500 * 1000);
  unsigned char *buf = malloc(bytes);
  CHECK(buf);
  double t0 = ct_now();
  td_status st = td_recv(buf, bytes, TD_U8, 1, c);
  double took = ct_now() - t0;
  const char *why = td_last_error();
  if (st != TD_ERR_REMOTE || !strstr(why, "rank 1") || !strstr(why, "died"))
    td_test_fail(__FILE__, __LINE__, "rank 0: receive from the dead rank 1 returned %s (%s), want TD_ERR_REMOTE "
                 "naming rank 1 as dead", td_status_str(st), why);
  if (took > 5.0) td_test_fail(__FILE__, __LINE__, "rank 0: the failure took %.1f s", took);
  free(buf);
  printf("cma dead ok: %s\n", why);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: test_shm_cma exchange SIZES | dead\n");
    return 2;
  }
  const char *off = getenv("SHM_TEST_CMA_OFF");
  int cma_off_rank = off ? atoi(off) : -1;
  const char *rank_env = getenv("TANDEM_RANK");
  if (rank_env && atoi(rank_env) == cma_off_rank) setenv("TANDEM_SHM_CMA", "0", 1);
  td_comm *c = NULL;
  CHECK_OK(td_comm_init(&c));
  g_rank = td_comm_rank(c);
  g_size = td_comm_size(c);
  if (g_size < 2 || strcmp(td_comm_transport(c), "shm") != 0)
    td_test_fail(__FILE__, __LINE__, "needs 2+ ranks on the shm transport, got %d on %s", g_size,
                 td_comm_transport(c));
  int rc = 2;
  if (!strcmp(argv[1], "exchange") && argc > 2) {
    const char *e = getenv("SHM_TEST_CMA");
    rc = run_exchange(c, argv[2], e ? atoi(e) : 1, cma_off_rank);
  } else if (!strcmp(argv[1], "dead")) {
    rc = run_dead(c);
    td_comm_destroy(c);
    return rc;
  }
  CHECK_OK(td_comm_finalize(c));
  td_comm_destroy(c);
  return rc;
}
