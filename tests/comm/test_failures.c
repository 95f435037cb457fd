/* Failure tests for the communication runtime: every failure must become a
 * clear error on every rank within seconds, never a hang or a crash.
 *
 *   test_failures kill VICTIM        (under $RUN --grace 20 -np N) VICTIM SIGKILLs
 *                                    itself mid-allreduce; survivors' pending and
 *                                    later ops fail with TD_ERR_REMOTE naming it
 *   test_failures mismatch WHAT      WHAT = count|dtype|op|root|order: the last rank
 *                                    issues a different collective; all ranks get
 *                                    TD_ERR_MISMATCH naming the ranks
 *   test_failures timeout            (TANDEM_TIMEOUT=2, 2 ranks) rank 1 sleeps:
 *                                    rank 0 gets TD_ERR_TIMEOUT after ~2 s
 *   test_failures abort              rank 0 calls td_comm_abort: everyone's next
 *                                    op fails with TD_ERR_REMOTE carrying the reason
 *   test_failures badargs            invalid arguments give TD_ERR_INVALID_ARGUMENT,
 *                                    and the communicator stays usable
 *   test_failures store-unreachable  (TANDEM_STORE=127.0.0.1:1, no launcher) init
 *                                    fails fast naming the address
 *   test_failures store-bad-addr     malformed store addresses are refused
 *   test_failures world ENV N        checks the rank/size detected from a
 *                                    launcher's environment and runs a collective
 *
 * Each rank asserts its own outcome and prints "<scenario> ok rank R ..." so
 * that shell drivers can count survivors. Exit 0 means this rank saw exactly
 * the failure it should have. */
#include "../common/check.h"
#include "comm_test_util.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

static td_comm *comm;
static int rank_, nranks;

#define COMM_OK(expr)                                                                              \
  do {                                                                                             \
    td_status s_ = (expr);                                                                         \
    if (s_ != TD_OK)                                                                               \
      td_test_fail(__FILE__, __LINE__, "%s returned %s: %s", #expr, td_status_str(s_),             \
                   comm ? td_comm_last_error(comm) : td_last_error());                             \
  } while (0)

/* An operation that must fail with `expected`; returns its message. */
#define EXPECT_FAIL(expr, expected)                                                                \
  do {                                                                                             \
    td_status s_ = (expr);                                                                         \
    if (s_ != (expected))                                                                          \
      td_test_fail(__FILE__, __LINE__, "%s returned %s, expected %s (%s)", #expr, td_status_str(s_), \
                   td_status_str(expected), td_comm_last_error(comm));                             \
  } while (0)

static void init_world(void) {
  td_status st = td_comm_init(&comm);
  if (st != TD_OK) td_test_fail(__FILE__, __LINE__, "td_comm_init: %s: %s", td_status_str(st), td_last_error());
  rank_ = td_comm_rank(comm);
  nranks = td_comm_size(comm);
}

static int mentions_rank(const char *msg, int r) {
  char pat[32];
  /* "rank 3" not followed by another digit (so "rank 1" does not match "rank 12") */
  snprintf(pat, sizeof pat, "rank %d", r);
  for (const char *p = strstr(msg, pat); p; p = strstr(p + 1, pat)) {
    char next = p[strlen(pat)];
    if (next < '0' || next > '9') return 1;
  }
  return 0;
}

/* After a failure: the communicator's status and message stay as they are,
 * and later operations of every kind fail with the same status. */
static void check_sticky(td_status expected) {
  char first[1024];
  snprintf(first, sizeof first, "%s", td_comm_last_error(comm));
  CHECK(first[0] != '\0');
  CHECK_EQ_INT(td_comm_status(comm), expected);
  float x = 1;
  EXPECT_FAIL(td_allreduce(&x, &x, 1, TD_F32, TD_SUM, comm), expected);
  EXPECT_FAIL(td_broadcast(&x, 1, TD_F32, 0, comm), expected);
  EXPECT_FAIL(td_barrier(comm), expected);
  td_request *req = NULL;
  td_status st = td_iallreduce(&x, &x, 1, TD_F32, TD_SUM, comm, &req);
  if (st == TD_OK) st = td_wait(req); /* failing at issue or at completion are both fine */
  CHECK_EQ_INT(st, expected);
  CHECK_EQ_INT(td_comm_status(comm), expected);
  if (strcmp(first, td_comm_last_error(comm)) != 0)
    td_test_fail(__FILE__, __LINE__, "sticky message changed from '%s' to '%s'", first, td_comm_last_error(comm));
  CHECK(td_comm_finalize(comm) == expected);
}

/* ---- kill ---- */

static double kill_delay_s = 0.3;

static void *killer_thread(void *arg) {
  (void)arg;
  usleep((useconds_t)(kill_delay_s * 1e6));
  kill(getpid(), SIGKILL);
  return NULL;
}

static int scenario_kill(int victim) {
  init_world();
  CHECK(nranks >= 2 && victim >= 0 && victim < nranks);
  size_t count = (size_t)2 << 20; /* 8 MiB of f32: each call takes a while */
  float *a = malloc(count * 4), *b = malloc(count * 4);
  CHECK(a && b);
  for (size_t i = 0; i < count; i++) a[i] = b[i] = 1.0f;
  COMM_OK(td_barrier(comm));
  double t_start = ct_now();
  if (rank_ == victim) {
    pthread_t th;
    CHECK(pthread_create(&th, NULL, killer_thread, NULL) == 0);
  }
  /* Two requests in flight at a time, then a blocking call: whichever is
   * running when the victim dies fails, and everything after it too. */
  td_status first = TD_OK;
  double t_fail = 0;
  long iters = 0;
  while (first == TD_OK) {
    td_request *ra = NULL, *rb = NULL;
    td_status sa = td_iallreduce(a, a, count, TD_F32, TD_MAX, comm, &ra);
    td_status sb = td_iallreduce(b, b, count, TD_F32, TD_MIN, comm, &rb);
    if (sa == TD_OK) sa = td_wait(ra);
    if (sb == TD_OK) sb = td_wait(rb);
    if (sa != TD_OK) {
      /* the later request was pending when the earlier one failed */
      CHECK_EQ_INT(sb, sa);
    }
    first = sa != TD_OK ? sa : sb;
    if (first == TD_OK) {
      float one = 1;
      first = td_allreduce(&one, &one, 1, TD_F32, TD_SUM, comm);
    }
    iters++;
    if (first != TD_OK) t_fail = ct_now();
    if (ct_now() - t_start > 60) td_test_fail(__FILE__, __LINE__, "no failure seen 60 s after the kill");
  }
  CHECK(rank_ != victim); /* the victim never gets here */
  const char *msg = td_comm_last_error(comm);
  double detect_s = t_fail - t_start - kill_delay_s;
  if (first != TD_ERR_REMOTE)
    td_test_fail(__FILE__, __LINE__, "first failure was %s, expected remote error: %s", td_status_str(first), msg);
  if (!mentions_rank(msg, victim))
    td_test_fail(__FILE__, __LINE__, "error message does not name the dead rank %d: %s", victim, msg);
  if (detect_s > 10) td_test_fail(__FILE__, __LINE__, "took %.1f s to notice the dead rank (limit 10 s)", detect_s);
  check_sticky(TD_ERR_REMOTE);
  printf("kill ok rank %d: failed after %ld iterations, %.2f s after the kill: %s\n", rank_, iters, detect_s, msg);
  fflush(stdout);
  td_comm_destroy(comm);
  free(a);
  free(b);
  return 0;
}

/* ---- mismatch ---- */

static int scenario_mismatch(const char *what) {
  init_world();
  CHECK(nranks >= 2);
  int odd = nranks - 1; /* the rank that disagrees */
  const char *must_mention = NULL;
  size_t count = 1000;
  td_dtype dtype = TD_F32;
  td_op op = TD_SUM;
  int root = 0, use_broadcast = 0, use_allreduce = 1;
  if (!strcmp(what, "count")) {
    if (rank_ == odd) count = 1001;
    must_mention = "1001";
  } else if (!strcmp(what, "dtype")) {
    if (rank_ == odd) dtype = TD_F64;
    must_mention = "f64";
  } else if (!strcmp(what, "op")) {
    if (rank_ == odd) op = TD_MAX;
    must_mention = "max";
  } else if (!strcmp(what, "root")) {
    use_allreduce = 0;
    use_broadcast = 1;
    if (rank_ == odd) root = 1;
    must_mention = "root";
  } else if (!strcmp(what, "order")) {
    if (rank_ == odd) {
      use_allreduce = 0;
      use_broadcast = 1;
    }
    must_mention = "broadcast";
  } else {
    fprintf(stderr, "test_failures mismatch: unknown kind '%s' (count|dtype|op|root|order)\n", what);
    return 2;
  }
  /* One good collective first, so the mismatch is not at sequence 0. */
  int32_t warm = 1;
  double *buf = calloc(2000, sizeof(double));
  CHECK(buf != NULL);
  double t0 = ct_now();
  /* A rank may still be finishing this first collective when a faster one
   * detects the mismatch and breaks the communicator: then the mismatch
   * surfaces here, which is as good. */
  td_status st = td_allreduce(&warm, &warm, 1, TD_I32, TD_SUM, comm);
  if (st == TD_OK) {
    CHECK_EQ_INT(warm, nranks);
    t0 = ct_now();
    if (use_allreduce) st = td_allreduce(buf, buf, count, dtype, op, comm);
    else st = td_broadcast(buf, count, dtype, root, comm);
  }
  (void)use_broadcast;
  if (st == TD_OK && !strcmp(what, "root")) {
    /* Over p2p, ranks that each think they are the root only send, so the
     * broadcast itself can complete everywhere; the unread frame it left
     * must then fail the next collective as a mismatch (the runtime's
     * documented behaviour: it has no extra round trip per broadcast). */
    int32_t next = 1;
    st = td_allreduce(&next, &next, 1, TD_I32, TD_SUM, comm);
  }
  double dt = ct_now() - t0;
  const char *msg = td_comm_last_error(comm);
  if (st != TD_ERR_MISMATCH)
    td_test_fail(__FILE__, __LINE__, "mismatch %s: got %s, expected mismatch: %s", what, td_status_str(st), msg);
  if (dt > 10) td_test_fail(__FILE__, __LINE__, "mismatch %s took %.1f s to detect (limit 10 s)", what, dt);
  /* The message names ranks: the odd one, or (on the odd one) another rank. */
  int names_other = 0;
  for (int r = 0; r < nranks; r++)
    if (r != rank_ && mentions_rank(msg, r)) names_other = 1;
  if (!(mentions_rank(msg, odd) || (rank_ == odd && names_other)))
    td_test_fail(__FILE__, __LINE__, "mismatch message does not name rank %d: %s", odd, msg);
  if (!strstr(msg, must_mention))
    td_test_fail(__FILE__, __LINE__, "mismatch message does not say what differs ('%s'): %s", must_mention, msg);
  check_sticky(TD_ERR_MISMATCH);
  printf("mismatch %s ok rank %d (%.2f s): %s\n", what, rank_, dt, msg);
  fflush(stdout);
  td_comm_destroy(comm);
  free(buf);
  return 0;
}

/* ---- timeout ---- */

static int scenario_timeout(void) {
  init_world();
  CHECK_EQ_INT(nranks, 2);
  float x = 1;
  COMM_OK(td_allreduce(&x, &x, 1, TD_F32, TD_SUM, comm));
  if (rank_ == 1) {
    usleep(3500000); /* past TANDEM_TIMEOUT=2 */
    double t0 = ct_now();
    td_status st = td_allreduce(&x, &x, 1, TD_F32, TD_SUM, comm);
    double dt = ct_now() - t0;
    /* Rank 0 gave up and broke the communicator: the late rank is told so
     * (remote error) or times out itself, promptly either way. */
    if (st != TD_ERR_REMOTE && st != TD_ERR_TIMEOUT)
      td_test_fail(__FILE__, __LINE__, "late rank got %s: %s", td_status_str(st), td_comm_last_error(comm));
    if (dt > 4) td_test_fail(__FILE__, __LINE__, "late rank waited %.1f s", dt);
    check_sticky(st);
    printf("timeout ok rank 1 (late, %s after %.2f s): %s\n", td_status_str(st), dt, td_comm_last_error(comm));
  } else {
    double t0 = ct_now();
    td_status st = td_allreduce(&x, &x, 1, TD_F32, TD_SUM, comm);
    double dt = ct_now() - t0;
    if (st != TD_ERR_TIMEOUT)
      td_test_fail(__FILE__, __LINE__, "got %s, expected timeout: %s", td_status_str(st), td_comm_last_error(comm));
    if (dt < 1.5 || dt > 4.5) td_test_fail(__FILE__, __LINE__, "timed out after %.2f s, TANDEM_TIMEOUT=2", dt);
    check_sticky(TD_ERR_TIMEOUT);
    printf("timeout ok rank 0 (%.2f s): %s\n", dt, td_comm_last_error(comm));
  }
  fflush(stdout);
  td_comm_destroy(comm);
  return 0;
}

/* ---- abort ---- */

static int scenario_abort(void) {
  init_world();
  CHECK(nranks >= 2);
  float x = 1;
  COMM_OK(td_allreduce(&x, &x, 1, TD_F32, TD_SUM, comm));
  const char *reason = "test_failures aborts on purpose";
  double t0 = ct_now();
  /* Rank 0 waits until the others surely finished the allreduce above (an
   * abort may fail an operation whose last frames are still in flight) and
   * sit in the next one. */
  if (rank_ == 0) {
    usleep(500000);
    td_comm_abort(comm, reason);
  }
  td_status st = td_allreduce(&x, &x, 1, TD_F32, TD_SUM, comm);
  double dt = ct_now() - t0;
  const char *msg = td_comm_last_error(comm);
  if (st != TD_ERR_REMOTE) td_test_fail(__FILE__, __LINE__, "got %s after abort, expected remote error: %s", td_status_str(st), msg);
  if (dt > 10) td_test_fail(__FILE__, __LINE__, "abort took %.1f s to reach rank %d", dt, rank_);
  if (!strstr(msg, reason)) td_test_fail(__FILE__, __LINE__, "message does not carry the abort reason: %s", msg);
  if (rank_ != 0 && !mentions_rank(msg, 0)) td_test_fail(__FILE__, __LINE__, "message does not name rank 0: %s", msg);
  check_sticky(TD_ERR_REMOTE);
  printf("abort ok rank %d (%.2f s): %s\n", rank_, dt, msg);
  fflush(stdout);
  td_comm_destroy(comm);
  return 0;
}

/* ---- bad arguments ---- */

#define EXPECT_INVALID(expr)                                                                       \
  do {                                                                                             \
    td_status s_ = (expr);                                                                         \
    if (s_ != TD_ERR_INVALID_ARGUMENT)                                                             \
      td_test_fail(__FILE__, __LINE__, "%s returned %s, expected invalid argument", #expr, td_status_str(s_)); \
    if (!td_last_error()[0] && !td_comm_last_error(comm)[0])                                       \
      td_test_fail(__FILE__, __LINE__, "%s: invalid argument without a message", #expr);           \
    n_bad++;                                                                                       \
  } while (0)

#define EXPECT_INVALID_REQ(call)                                                                   \
  do {                                                                                             \
    td_request *r_ = (td_request *)&r_;                                                            \
    td_status s_ = call;                                                                           \
    if (s_ != TD_ERR_INVALID_ARGUMENT)                                                             \
      td_test_fail(__FILE__, __LINE__, "%s returned %s, expected invalid argument", #call, td_status_str(s_)); \
    if (r_ != NULL) td_test_fail(__FILE__, __LINE__, "%s: *req_out not NULL on error", #call);      \
    n_bad++;                                                                                       \
  } while (0)

static int scenario_badargs(void) {
  init_world();
  int n_bad = 0;
  float buf[64] = {0}, out[64 * 8] = {0};
  td_dtype bad_dtype = (td_dtype)99;
  td_op bad_op = (td_op)99;
  EXPECT_INVALID(td_allreduce(NULL, buf, 5, TD_F32, TD_SUM, comm));
  EXPECT_INVALID(td_allreduce(buf, NULL, 5, TD_F32, TD_SUM, comm));
  EXPECT_INVALID(td_allreduce(buf, buf, 5, bad_dtype, TD_SUM, comm));
  EXPECT_INVALID(td_allreduce(buf, buf, 5, (td_dtype)-1, TD_SUM, comm));
  EXPECT_INVALID(td_allreduce(buf, buf, 5, TD_F32, bad_op, comm));
  EXPECT_INVALID(td_reduce(buf, buf, 5, TD_F32, TD_SUM, nranks, comm));
  EXPECT_INVALID(td_reduce(buf, buf, 5, TD_F32, TD_SUM, -1, comm));
  EXPECT_INVALID(td_reduce(buf, buf, 5, TD_F32, bad_op, 0, comm));
  EXPECT_INVALID(td_broadcast(NULL, 3, TD_F32, 0, comm));
  EXPECT_INVALID(td_broadcast(buf, 3, TD_F32, nranks, comm));
  EXPECT_INVALID(td_broadcast(buf, 3, TD_F32, -1, comm));
  EXPECT_INVALID(td_broadcast(buf, 3, bad_dtype, 0, comm));
  EXPECT_INVALID(td_reduce_scatter(buf, out, 5, TD_F32, bad_op, comm));
  EXPECT_INVALID(td_reduce_scatter(NULL, out, 5, TD_F32, TD_SUM, comm));
  EXPECT_INVALID(td_allgather(buf, out, 5, bad_dtype, comm));
  EXPECT_INVALID(td_allgather(buf, NULL, 5, TD_F32, comm));
  EXPECT_INVALID(td_alltoall(buf, NULL, 2, TD_F32, comm));
  EXPECT_INVALID(td_alltoall(buf, out, 2, bad_dtype, comm));
  EXPECT_INVALID(td_send(buf, 1, TD_F32, nranks, comm));
  EXPECT_INVALID(td_send(buf, 1, TD_F32, -1, comm));
  EXPECT_INVALID(td_recv(buf, 1, TD_F32, nranks + 5, comm));
  EXPECT_INVALID(td_send(NULL, 1, TD_F32, 0, comm));
  EXPECT_INVALID(td_recv(buf, 1, bad_dtype, 0, comm));
  EXPECT_INVALID_REQ(td_iallreduce(buf, buf, 5, bad_dtype, TD_SUM, comm, &r_));
  EXPECT_INVALID_REQ(td_iallreduce(NULL, buf, 5, TD_F32, TD_SUM, comm, &r_));
  EXPECT_INVALID_REQ(td_ireduce(buf, buf, 5, TD_F32, TD_SUM, nranks, comm, &r_));
  EXPECT_INVALID_REQ(td_ibroadcast(buf, 5, TD_F32, nranks, comm, &r_));
  EXPECT_INVALID_REQ(td_ireduce_scatter(buf, buf, 5, TD_F32, bad_op, comm, &r_));
  EXPECT_INVALID_REQ(td_iallgather(buf, out, 5, bad_dtype, comm, &r_));
  EXPECT_INVALID_REQ(td_ialltoall(NULL, out, 5, TD_F32, comm, &r_));
  EXPECT_INVALID_REQ(td_isend(buf, 1, TD_F32, nranks, comm, &r_));
  EXPECT_INVALID_REQ(td_irecv(buf, 1, TD_F32, -1, comm, &r_));
  /* A NULL communicator is refused too. */
  EXPECT_INVALID(td_allreduce(buf, buf, 1, TD_F32, TD_SUM, NULL));

  /* Arguments are checked before anything is sent: the communicator is still
   * healthy, and count 0 with NULL buffers is valid. */
  CHECK_EQ_INT(td_comm_status(comm), TD_OK);
  COMM_OK(td_allreduce(NULL, NULL, 0, TD_F32, TD_SUM, comm));
  COMM_OK(td_broadcast(NULL, 0, TD_F32, nranks - 1, comm));
  for (int i = 0; i < 5; i++) buf[i] = (float)(rank_ + i);
  COMM_OK(td_allreduce(buf, buf, 5, TD_F32, TD_SUM, comm));
  for (int i = 0; i < 5; i++) CHECK(buf[i] == (float)(nranks * (nranks - 1) / 2 + nranks * i));
  COMM_OK(td_comm_finalize(comm));
  /* A finalized communicator refuses work as a usage error. */
  CHECK_STATUS(td_allreduce(buf, buf, 5, TD_F32, TD_SUM, comm), TD_ERR_INVALID_USAGE);
  printf("badargs ok rank %d: %d invalid calls refused\n", rank_, n_bad);
  fflush(stdout);
  td_comm_destroy(comm);
  return 0;
}

/* ---- store problems ---- */

static int scenario_store_unreachable(void) {
  const char *addr = getenv("TANDEM_STORE");
  CHECK(addr != NULL);
  double t0 = ct_now();
  td_comm *c = NULL;
  td_status st = td_comm_init(&c);
  double dt = ct_now() - t0;
  if (st == TD_OK) td_test_fail(__FILE__, __LINE__, "td_comm_init succeeded with the store at %s", addr);
  CHECK(c == NULL);
  const char *msg = td_last_error();
  if (!strstr(msg, addr)) td_test_fail(__FILE__, __LINE__, "message does not name the store address %s: %s", addr, msg);
  if (dt > 10) td_test_fail(__FILE__, __LINE__, "init took %.1f s to give up (TANDEM_CONNECT_TIMEOUT)", dt);
  printf("store-unreachable ok: %s after %.2f s: %s\n", td_status_str(st), dt, msg);
  return 0;
}

static int scenario_store_bad_addr(void) {
  const char *bad[] = {"no-port-here", "127.0.0.1:", "127.0.0.1:notaport", "127.0.0.1:99999", ":29500", "[::1:29500"};
  for (size_t k = 0; k < CT_ARRAY_SIZE(bad); k++) {
    td_comm_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.rank = 1;
    cfg.world_size = 2;
    cfg.store = bad[k];
    cfg.timeout_s = 5;
    td_comm *c = NULL;
    double t0 = ct_now();
    td_status st = td_comm_init_config(&cfg, &c);
    double dt = ct_now() - t0;
    const char *msg = td_last_error();
    if (st != TD_ERR_INVALID_ARGUMENT)
      td_test_fail(__FILE__, __LINE__, "store '%s': got %s, expected invalid argument: %s", bad[k], td_status_str(st), msg);
    CHECK(c == NULL);
    if (!strstr(msg, bad[k])) td_test_fail(__FILE__, __LINE__, "message does not quote '%s': %s", bad[k], msg);
    if (dt > 2) td_test_fail(__FILE__, __LINE__, "store '%s' took %.1f s to refuse", bad[k], dt);
    printf("store-bad-addr ok '%s': %s\n", bad[k], msg);
  }
  /* A config asking for an impossible rank is refused as well. */
  td_comm_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.rank = 3;
  cfg.world_size = 2;
  cfg.store = "127.0.0.1:1";
  td_comm *c = NULL;
  CHECK_STATUS(td_comm_init_config(&cfg, &c), TD_ERR_INVALID_ARGUMENT);
  CHECK(c == NULL);
  return 0;
}

/* ---- launcher environments ---- */

static int scenario_world(const char *launcher, int expect_size) {
  init_world();
  if (nranks != expect_size)
    td_test_fail(__FILE__, __LINE__, "%s environment: world size %d, expected %d", launcher, nranks, expect_size);
  const char *rank_var = !strcmp(launcher, "ompi") ? "OMPI_COMM_WORLD_RANK" : !strcmp(launcher, "torchrun") ? "RANK" : NULL;
  int expect_rank = rank_var && getenv(rank_var) ? atoi(getenv(rank_var)) : 0;
  CHECK_EQ_INT(rank_, expect_rank);
  if (expect_size == 1) CHECK(!strcmp(td_comm_transport(comm), "self"));
  int64_t v = rank_ + 1;
  COMM_OK(td_allreduce(&v, &v, 1, TD_I64, TD_SUM, comm));
  CHECK_EQ_INT(v, (int64_t)nranks * (nranks + 1) / 2);
  COMM_OK(td_comm_finalize(comm));
  printf("world %s ok rank %d of %d, transport %s\n", launcher, rank_, nranks, td_comm_transport(comm));
  fflush(stdout);
  td_comm_destroy(comm);
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *s = argc > 1 ? argv[1] : "";
  if (!strcmp(s, "kill") && argc > 2) return scenario_kill(atoi(argv[2]));
  if (!strcmp(s, "mismatch") && argc > 2) return scenario_mismatch(argv[2]);
  if (!strcmp(s, "timeout")) return scenario_timeout();
  if (!strcmp(s, "abort")) return scenario_abort();
  if (!strcmp(s, "badargs")) return scenario_badargs();
  if (!strcmp(s, "store-unreachable")) return scenario_store_unreachable();
  if (!strcmp(s, "store-bad-addr")) return scenario_store_bad_addr();
  if (!strcmp(s, "world") && argc > 3) return scenario_world(argv[2], atoi(argv[3]));
  fprintf(stderr,
          "usage: test_failures kill VICTIM | mismatch count|dtype|op|root|order | timeout | abort | badargs |\n"
          "       store-unreachable | store-bad-addr | world self|ompi|torchrun N\n");
  return 2;
}
