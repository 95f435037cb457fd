/* Creating communicators, and where a failed call leaves its message.
 *
 *   tandemrun -np N test_comm_create order [REPS]
 *     Two threads per rank each create a communicator with
 *     td_comm_init_config and a job id of their own, REPS times over (the
 *     same job id again on every repetition, so its per-job-id count also
 *     advances). Even repetitions are staggered in opposite orders: on even
 *     ranks thread 1 starts once thread 0 has started, on odd ranks thread 0
 *     once thread 1 has; odd repetitions start both at once. Every
 *     communicator then runs an allreduce, a broadcast and an allgather whose
 *     values name the thread, the rank and the repetition, checked against
 *     closed forms: a communicator that joined the wrong thread of a peer
 *     gets another thread's numbers.
 *
 *   tandemrun -np N test_comm_create many RANKS_EXPECTED
 *     One communicator from the environment, one allreduce and one
 *     allgather checked exactly, finalize: the rendezvous of many ranks
 *     (tests/comm.suite runs it at 64 ranks).
 *
 *   tandemrun -np N test_comm_create errors
 *     The rule of include/tandem/base.h: every failed call leaves its message
 *     in td_last_error() of the calling thread; a call given a communicator
 *     also leaves it in td_comm_last_error(comm), where the sticky failure,
 *     once there, is never replaced. Checked for bad arguments, a failing
 *     request, a failed split, another thread's view, and after an abort. */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm_test_util.h"
#include "../common/check.h"

static int rank_, size_;

/* ---- order ---- */

typedef struct order_thread {
  int index; /* 0 or 1 */
  int rep;
  bool staggered;
  pthread_barrier_t *both;
  pthread_mutex_t *mu;
  pthread_cond_t *cv;
  int *started; /* per thread: has it called td_comm_init_config */
  char job_id[96];
} order_thread;

/* Collectives on c whose results identify (thread, rep) on every rank. */
static void check_comm(td_comm *c, int t, int rep) {
  int n = td_comm_size(c), r = td_comm_rank(c);
  CHECK_EQ_INT(n, size_);
  CHECK_EQ_INT(r, rank_);
  long long tag = 1000LL * (t + 1) + 100000LL * rep;
  long long mine = tag + r, sum = 0;
  CHECK_OK(td_allreduce(&mine, &sum, 1, TD_I64, TD_SUM, c));
  CHECK_EQ_INT(sum, tag * n + (long long)n * (n - 1) / 2);
  int root = rep % n;
  long long b = r == root ? tag + 7 : -1;
  CHECK_OK(td_broadcast(&b, 1, TD_I64, root, c));
  CHECK_EQ_INT(b, tag + 7);
  long long all[8] = {0};
  CHECK(n <= 8);
  CHECK_OK(td_allgather(&mine, all, (size_t)n, TD_I64, c));
  for (int i = 0; i < n; i++) CHECK_EQ_INT(all[i], tag + i);
}

static void *order_main(void *arg) {
  order_thread *o = arg;
  /* Staggered: on even ranks thread 0 goes first, on odd ranks thread 1. */
  int first = rank_ % 2;
  pthread_barrier_wait(o->both);
  if (o->staggered && o->index != first) {
    pthread_mutex_lock(o->mu);
    while (!o->started[first]) pthread_cond_wait(o->cv, o->mu);
    pthread_mutex_unlock(o->mu);
    /* Let the first thread get well into its rendezvous: the order then
     * differs between ranks in practice, not only in principle. */
    usleep(20000);
  }
  pthread_mutex_lock(o->mu);
  o->started[o->index] = 1;
  pthread_cond_broadcast(o->cv);
  pthread_mutex_unlock(o->mu);

  td_comm_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.job_id = o->job_id;
  td_comm *c = NULL;
  CHECK_OK(td_comm_init_config(&cfg, &c));
  check_comm(c, o->index, o->rep);
  CHECK_OK(td_comm_finalize(c));
  td_comm_destroy(c);
  return NULL;
}

static int run_order(int reps) {
  const char *job = getenv("TANDEM_JOB_ID");
  for (int rep = 0; rep < reps; rep++) {
    pthread_barrier_t both;
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    int started[2] = {0, 0};
    pthread_barrier_init(&both, NULL, 2);
    order_thread th[2];
    pthread_t tid[2];
    for (int t = 0; t < 2; t++) {
      th[t] = (order_thread){.index = t, .rep = rep, .staggered = rep % 2 == 0, .both = &both, .mu = &mu,
                             .cv = &cv, .started = started};
      snprintf(th[t].job_id, sizeof th[t].job_id, "%s-thread%d", job ? job : "order", t);
      CHECK(pthread_create(&tid[t], NULL, order_main, &th[t]) == 0);
    }
    for (int t = 0; t < 2; t++) pthread_join(tid[t], NULL);
    pthread_barrier_destroy(&both);
  }
  printf("order ok: rank %d of %d, %d repetitions of two communicators per rank\n", rank_, size_, reps);
  return 0;
}

/* ---- many ---- */

static int run_many(int expected) {
  td_comm *c = NULL;
  CHECK_OK(td_comm_init(&c));
  int n = td_comm_size(c), r = td_comm_rank(c);
  CHECK_EQ_INT(n, expected);
  /* sum of (r + 1)^2 over ranks = n(n+1)(2n+1)/6 */
  long long sq = (long long)(r + 1) * (r + 1), sum = 0;
  CHECK_OK(td_allreduce(&sq, &sum, 1, TD_I64, TD_SUM, c));
  CHECK_EQ_INT(sum, (long long)n * (n + 1) * (2 * n + 1) / 6);
  int *all = calloc((size_t)n, sizeof *all);
  CHECK(all != NULL);
  int mine = 3 * r + 1;
  CHECK_OK(td_allgather(&mine, all, (size_t)n, TD_I32, c));
  for (int i = 0; i < n; i++) CHECK_EQ_INT(all[i], 3 * i + 1);
  free(all);
  CHECK_OK(td_comm_finalize(c));
  if (r == 0) printf("many ok: %d ranks (%s)\n", n, td_comm_transport(c));
  td_comm_destroy(c);
  return 0;
}

/* ---- errors ---- */

#define CHECK_HAS(text, what)                                                                   \
  do {                                                                                          \
    const char *t_ = (text);                                                                    \
    if (!strstr(t_, what)) td_test_fail(__FILE__, __LINE__, "%s = '%s' lacks '%s'", #text, t_, what); \
  } while (0)

/* The message a bad-argument call left: the same in both places. */
static void expect_both(td_comm *c, td_status st, td_status expected, const char *needle) {
  if (st != expected)
    td_test_fail(__FILE__, __LINE__, "got %s, expected %s (%s)", td_status_str(st), td_status_str(expected),
                 td_last_error());
  CHECK_HAS(td_last_error(), needle);
  char thread_msg[1200];
  snprintf(thread_msg, sizeof thread_msg, "%s", td_last_error());
  if (strcmp(td_comm_last_error(c), thread_msg))
    td_test_fail(__FILE__, __LINE__, "td_comm_last_error '%s' != td_last_error '%s'", td_comm_last_error(c),
                 thread_msg);
}

typedef struct peek_arg {
  td_comm *comm;
  char comm_msg[1200];
  char own_msg[1200];
} peek_arg;

static void *peek_main(void *arg) {
  peek_arg *p = arg;
  snprintf(p->comm_msg, sizeof p->comm_msg, "%s", td_comm_last_error(p->comm));
  snprintf(p->own_msg, sizeof p->own_msg, "%s", td_last_error());
  return NULL;
}

static void peek_from_thread(td_comm *c, peek_arg *p) {
  memset(p, 0, sizeof *p);
  p->comm = c;
  pthread_t tid;
  CHECK(pthread_create(&tid, NULL, peek_main, p) == 0);
  pthread_join(tid, NULL);
}

static int run_errors(void) {
  td_comm *c = NULL;
  /* Creation fails: there is no communicator, the message is the thread's. */
  td_comm_config bad;
  memset(&bad, 0, sizeof bad);
  bad.world_size = 2;
  bad.rank = 5;
  CHECK_STATUS(td_comm_init_config(&bad, &c), TD_ERR_INVALID_ARGUMENT);
  CHECK(c == NULL);
  CHECK_HAS(td_last_error(), "rank 5 is outside");

  CHECK_OK(td_comm_init(&c));
  int n = td_comm_size(c);
  td_status st;
  CHECK(!strcmp(td_comm_last_error(c), ""));
  float buf[4] = {1, 2, 3, 4};

  /* Bad arguments: both places, and the communicator stays healthy. */
  expect_both(c, td_allreduce(NULL, buf, 4, TD_F32, TD_SUM, c), TD_ERR_INVALID_ARGUMENT, "td_allreduce: send buffer is NULL");
  expect_both(c, td_broadcast(buf, 4, TD_F32, n + 3, c), TD_ERR_INVALID_ARGUMENT, "td_broadcast: root");
  expect_both(c, td_allreduce(buf, buf, 4, (td_dtype)77, TD_SUM, c), TD_ERR_INVALID_ARGUMENT, "unknown dtype 77");
  td_request *req = (td_request *)&req;
  expect_both(c, td_iallreduce(buf, buf, 4, TD_F32, (td_op)55, c, &req), TD_ERR_INVALID_ARGUMENT, "unknown reduction op 55");
  CHECK(req == NULL);
  expect_both(c, td_send(buf, 4, TD_F32, -1, c), TD_ERR_INVALID_ARGUMENT, "td_send: peer -1");
  expect_both(c, td_comm_split(c, 0, 0, NULL), TD_ERR_INVALID_ARGUMENT, "td_comm_split: out is NULL");
  CHECK_EQ_INT(td_comm_status(c), TD_OK);

  /* Another thread sees the communicator's message; its own is empty. */
  peek_arg p;
  peek_from_thread(c, &p);
  CHECK_HAS(p.comm_msg, "td_comm_split: out is NULL");
  CHECK(!strcmp(p.own_msg, ""));

  /* Still works, and a success does not clear the last message (errno-like). */
  float ones[3] = {1, 1, 1}, sum[3] = {0, 0, 0};
  CHECK_OK(td_allreduce(ones, sum, 3, TD_F32, TD_SUM, c));
  for (int i = 0; i < 3; i++) CHECK_CLOSE(sum[i], (double)n, 0, 0);
  CHECK_HAS(td_comm_last_error(c), "td_comm_split: out is NULL");

  /* Break a communicator: the abort reason becomes the sticky message,
   * reported by every later call and never replaced, not even by a bad
   * argument. A world of one (a split by rank) keeps the abort local: an
   * abort of c itself would race with the peers' last collective. */
  td_comm *self = NULL;
  CHECK_OK(td_comm_split(c, rank_, 0, &self));
  CHECK(self != NULL);
  CHECK_EQ_INT(td_comm_size(self), 1);
  td_comm_abort(self, "test_comm_create aborts");
  CHECK_EQ_INT(td_comm_status(self), TD_ERR_REMOTE);
  CHECK_HAS(td_comm_last_error(self), "test_comm_create aborts");
  CHECK_STATUS(td_allreduce(ones, sum, 3, TD_F32, TD_SUM, self), TD_ERR_REMOTE);
  CHECK_HAS(td_last_error(), "test_comm_create aborts");
  CHECK_STATUS(td_allreduce(NULL, sum, 3, TD_F32, TD_SUM, self), TD_ERR_REMOTE);
  CHECK_HAS(td_last_error(), "test_comm_create aborts");
  CHECK_HAS(td_comm_last_error(self), "test_comm_create aborts");
  CHECK(!strstr(td_comm_last_error(self), "NULL"));
  CHECK_STATUS(td_iallreduce(ones, sum, 3, TD_F32, TD_SUM, self, &req), TD_ERR_REMOTE);
  CHECK(req == NULL);
  peek_from_thread(self, &p);
  CHECK_HAS(p.comm_msg, "test_comm_create aborts");
  CHECK(!strcmp(p.own_msg, ""));
  CHECK_STATUS(td_comm_finalize(self), TD_ERR_REMOTE);
  CHECK_HAS(td_last_error(), "test_comm_create aborts");
  td_comm_destroy(self);

  /* The parent is untouched by its child's failure, and its message is
   * still the last failed call on it. */
  CHECK_EQ_INT(td_comm_status(c), TD_OK);
  CHECK_HAS(td_comm_last_error(c), "td_comm_split: out is NULL");

  /* A request that fails reports through td_wait on the waiting thread and
   * on the communicator: a receive from a peer that sends something else
   * is a mismatch, which breaks c (sticky) on both ranks. */
  if (n >= 2 && rank_ < 2) {
    int other = 1 - rank_;
    float f = 1;
    double d = 1;
    td_request *rq = NULL;
    if (rank_ == 0) {
      CHECK_OK(td_isend(&f, 1, TD_F32, other, c, &rq));
    } else {
      CHECK_OK(td_irecv(&d, 1, TD_F64, other, c, &rq));
    }
    st = td_wait(rq);
    if (rank_ == 1) {
      CHECK_EQ_INT(st, TD_ERR_MISMATCH);
      CHECK_HAS(td_last_error(), "rank 0");
      CHECK_HAS(td_comm_last_error(c), "rank 0");
      char mine[1200];
      snprintf(mine, sizeof mine, "%s", td_last_error());
      CHECK(!strcmp(mine, td_comm_last_error(c)));
    }
  }
  td_comm_destroy(c);
  printf("errors ok: rank %d\n", rank_);
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *r = getenv("TANDEM_RANK"), *s = getenv("TANDEM_WORLD_SIZE");
  rank_ = r ? atoi(r) : 0;
  size_ = s ? atoi(s) : 1;
  if (argc >= 2 && !strcmp(argv[1], "order")) return run_order(argc >= 3 ? atoi(argv[2]) : 6);
  if (argc >= 3 && !strcmp(argv[1], "many")) return run_many(atoi(argv[2]));
  if (argc >= 2 && !strcmp(argv[1], "errors")) return run_errors();
  fprintf(stderr, "usage: test_comm_create order [REPS] | many RANKS | errors\n");
  return 2;
}
