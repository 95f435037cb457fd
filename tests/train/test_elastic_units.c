/* Elastic training units (src/elastic, src/train/elastic), without launching processes:
 *
 *  - td_elastic_batch_split against a brute-force reference (every world
 *    size and micro-batch hint for several global batches), and its message
 *    listing the world sizes that keep the batch;
 *  - the membership protocol on a real store server in this process, each
 *    "process" a thread with its own store client: epoch 1 forms from the
 *    initial uids in age order; a member reported dead lets the survivors
 *    close epoch 2 at once (the oldest is rank 0), a replacement the
 *    launcher announced is waited for and admitted in the same round, a
 *    member of epoch 1 that comes back after epoch 2 formed is refused as
 *    stale, a joiner is seen as pending and admitted with everybody at the
 *    next round, and a round below min-np fails after the timeout. */
#include "elastic/elastic.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "../common/check.h"

static void batch_split_cases(void) {
  static const long batches[] = {1, 6, 8, 12, 24, 30, 97};
  for (size_t b = 0; b < sizeof batches / sizeof batches[0]; b++) {
    long G = batches[b];
    for (int world = 1; world <= 13; world++) {
      for (int hint = 1; hint <= 9; hint++) {
        int micro = -1, accum = -1;
        td_status st = td_elastic_batch_split(G, world, hint, 8, &micro, &accum);
        if (G % world) {
          CHECK_EQ_INT(st, TD_ERR_INVALID_ARGUMENT);
          continue;
        }
        CHECK_OK(st);
        /* Reference: the largest m <= hint dividing G/world. */
        long per = G / world, want = 1;
        for (long m = 1; m <= hint && m <= per; m++)
          if (per % m == 0) want = m;
        CHECK_EQ_INT(micro, want);
        CHECK_EQ_INT((long)micro * accum * world, G);
      }
    }
  }
  int micro, accum;
  CHECK_MSG(td_elastic_batch_split(8, 3, 2, 4, &micro, &accum), TD_ERR_INVALID_ARGUMENT,
            "the global batch 8 cannot be split over 3 ranks; world sizes that keep it: 1, 2, 4 ");
  CHECK_MSG(td_elastic_batch_split(12, 5, 3, 0, &micro, &accum), TD_ERR_INVALID_ARGUMENT,
            "world sizes that keep it: 1, 2, 3, 4, 6, 12 ");
  CHECK_STATUS(td_elastic_batch_split(0, 1, 1, 0, &micro, &accum), TD_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(td_elastic_batch_split(8, 0, 1, 0, &micro, &accum), TD_ERR_INVALID_ARGUMENT);
}

/* ---- membership on a real store ---- */

static char store_addr[64];
static const char *job = "unit";

static void member_init(el_membership *m, long uid, bool joiner, int initial_world) {
  memset(m, 0, sizeof *m);
  td_strlcpy(m->store_addr, store_addr, sizeof m->store_addr);
  td_strlcpy(m->job, job, sizeof m->job);
  m->uid = uid;
  m->joiner = joiner;
  m->initial_world = initial_world;
  m->min_np = 1;
  m->max_np = 1 << 30;
  m->timeout_s = 30;
  m->settle_s = 30; /* long: a round that closes early closes by the rules, not by the clock */
  m->replace_wait_s = 30; /* the same for replacements (one case shortens it) */
  CHECK_OK(store_connect(store_addr, 10, &m->store));
}

typedef struct {
  el_membership *m;
  td_status st;
  char err[512];
} round_arg;

static void *round_thread(void *p) {
  round_arg *a = p;
  a->st = el_membership_next(a->m);
  if (a->st != TD_OK) td_error_copy(a->err, sizeof a->err);
  return NULL;
}

/* Run one round on n members concurrently. */
static void run_round(el_membership **ms, int n, round_arg *args) {
  pthread_t th[8];
  for (int i = 0; i < n; i++) {
    args[i].m = ms[i];
    args[i].st = TD_ERR_INTERNAL;
    args[i].err[0] = 0;
    CHECK(pthread_create(&th[i], NULL, round_thread, &args[i]) == 0);
  }
  for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
}

static void check_members(const el_membership *m, int epoch, const long *uids, int n) {
  CHECK_EQ_INT(m->epoch, epoch);
  CHECK_EQ_INT(m->n_members, n);
  for (int i = 0; i < n; i++) CHECK_EQ_INT(m->members[i], uids[i]);
  int rank = -1;
  for (int i = 0; i < n; i++)
    if (uids[i] == m->uid) rank = i;
  CHECK_EQ_INT(m->rank, rank);
}

static void membership_cases(void) {
  td_store_server *server;
  CHECK_OK(store_server_start("127.0.0.1", 0, &server));
  snprintf(store_addr, sizeof store_addr, "127.0.0.1:%d", store_server_port(server));
  td_store *launcher;
  CHECK_OK(store_connect(store_addr, 10, &launcher));

  /* Epoch 1: uids 0..3, joined in reverse order; ranks follow age. */
  el_membership m[7];
  for (int i = 0; i < 4; i++) member_init(&m[i], i, false, 4);
  el_membership *all[4] = {&m[3], &m[2], &m[1], &m[0]};
  round_arg args[8];
  run_round(all, 4, args);
  for (int i = 0; i < 4; i++) CHECK_OK(args[i].st);
  const long e1[] = {0, 1, 2, 3};
  for (int i = 0; i < 4; i++) check_members(&m[i], 1, e1, 4);

  /* uid 0 (rank 0) dies; the launcher reports it with no replacement: the
   * three survivors close epoch 2 without waiting the settle time, and uid
   * 1, now the oldest, is rank 0. */
  CHECK_OK(el_report_dead(launcher, job, 0, "killed by signal 9", -1));
  double t0 = td_now();
  el_membership *surv[3] = {&m[1], &m[2], &m[3]};
  run_round(surv, 3, args);
  for (int i = 0; i < 3; i++) CHECK_OK(args[i].st);
  CHECK(td_now() - t0 < 10);
  const long e2[] = {1, 2, 3};
  for (int i = 1; i < 4; i++) check_members(&m[i], 2, e2, 3);

  /* uid 0 comes back (it was only stopped): refused as stale. */
  CHECK_MSG(el_membership_next(&m[0]), TD_ERR_REMOTE, "process 0 of epoch 1 is stale: the job already formed epoch 2");

  /* uid 3 dies and the launcher already started uid 4 to replace it: the
   * round waits for 4, which joins, and epoch 3 has 3 members again. */
  CHECK_OK(el_report_dead(launcher, job, 3, "killed by signal 9", 4));
  member_init(&m[4], 4, true, 4);
  el_membership *e3m[3] = {&m[1], &m[2], &m[4]};
  run_round(e3m, 3, args);
  for (int i = 0; i < 3; i++) CHECK_OK(args[i].st);
  const long e3[] = {1, 2, 4};
  check_members(&m[1], 3, e3, 3);
  check_members(&m[2], 3, e3, 3);
  check_members(&m[4], 3, e3, 3);

  /* A joiner (uid 5) registers for epoch 4: the members see it pending
   * (none before), then all form epoch 4 with it. */
  int pending = -1;
  CHECK_OK(el_membership_pending(&m[1], &pending));
  CHECK_EQ_INT(pending, 0);
  member_init(&m[5], 5, true, 4);
  pthread_t joiner;
  args[3].m = &m[5];
  CHECK(pthread_create(&joiner, NULL, round_thread, &args[3]) == 0);
  for (int i = 0; i < 200 && pending == 0; i++) {
    CHECK_OK(el_membership_pending(&m[1], &pending));
    if (!pending) {
      struct timespec ts = {0, 10 * 1000 * 1000};
      nanosleep(&ts, NULL);
    }
  }
  CHECK_EQ_INT(pending, 1);
  run_round(e3m, 3, args);
  pthread_join(joiner, NULL);
  for (int i = 0; i < 4; i++) CHECK_OK(args[i].st);
  const long e4[] = {1, 2, 4, 5};
  check_members(&m[5], 4, e4, 4);
  check_members(&m[1], 4, e4, 4);

  /* uid 4 dies with a replacement (uid 6) that is slow to start: with
   * TANDEM_ELASTIC_REPLACE_WAIT 0.3 s the survivors close epoch 5 without
   * it, long before the settle time (30 s); uid 6 then comes too late for
   * that round, registers for the next, and the members admit it in epoch
   * 6 as any joiner. */
  CHECK_OK(el_report_dead(launcher, job, 4, "killed by signal 9", 6));
  el_membership *e5m[3] = {&m[1], &m[2], &m[5]};
  for (int i = 0; i < 3; i++) e5m[i]->replace_wait_s = 0.3;
  t0 = td_now();
  run_round(e5m, 3, args);
  double took = td_now() - t0;
  for (int i = 0; i < 3; i++) CHECK_OK(args[i].st);
  if (!(took >= 0.25 && took < 10))
    td_test_fail(__FILE__, __LINE__, "epoch 5 closed after %.2f s: expected the replacement wait (0.3 s), not the "
                 "settle time (30 s)", took);
  const long e5[] = {1, 2, 5};
  for (int i = 0; i < 3; i++) check_members(e5m[i], 5, e5, 3);
  member_init(&m[6], 6, true, 4);
  args[3].m = &m[6];
  CHECK(pthread_create(&joiner, NULL, round_thread, &args[3]) == 0);
  pending = 0;
  for (int i = 0; i < 500 && pending == 0; i++) {
    CHECK_OK(el_membership_pending(&m[1], &pending));
    if (!pending) {
      struct timespec ts = {0, 10 * 1000 * 1000};
      nanosleep(&ts, NULL);
    }
  }
  CHECK_EQ_INT(pending, 1);
  run_round(e5m, 3, args);
  pthread_join(joiner, NULL);
  for (int i = 0; i < 4; i++) CHECK_OK(args[i].st);
  const long e6[] = {1, 2, 5, 6};
  check_members(&m[6], 6, e6, 4);
  check_members(&m[1], 6, e6, 4);

  /* tandemrun evicts uids 5 and 6 (their host's link is lossy) while both
   * still run (the kill goes through the lossy link): 6 had already taken
   * and written its slot of round 7, 5 was killed between taking its slot
   * and writing it (the hole that hung the s25 200-fault run: every reader
   * of round 7 waited 10 s for that key, and failed). The survivors close
   * epoch 7 without either, with no wait for the hole beyond a moment; 6
   * itself, still running, is refused, as is 5 had it lived. */
  {
    char key[64];
    int64_t slot = 0;
    snprintf(key, sizeof key, "%s/el/e7/n", job);
    CHECK_OK(store_add(launcher, key, 1, &slot)); /* 5's slot, never written */
    CHECK_OK(store_add(launcher, key, 1, &slot)); /* 6's */
    snprintf(key, sizeof key, "%s/el/e7/j%lld", job, (long long)(slot - 1));
    CHECK_OK(store_set_str(launcher, key, "6"));
  }
  CHECK_OK(el_report_dead(launcher, job, 5, "evicted: its host's link is lossy", -1));
  CHECK_OK(el_report_dead(launcher, job, 6, "evicted: its host's link is lossy", -1));
  /* 5, still running, tries round 7 again: refused, no slot taken. */
  CHECK_MSG(el_membership_next(&m[5]), TD_ERR_REMOTE, "process 5 was reported gone by the launcher (evicted: its "
            "host's link is lossy)");
  t0 = td_now();
  el_membership *e7m[2] = {&m[1], &m[2]};
  run_round(e7m, 2, args);
  took = td_now() - t0;
  for (int i = 0; i < 2; i++) {
    if (args[i].st != TD_OK) td_test_fail(__FILE__, __LINE__, "round 7 after the eviction: %s", args[i].err);
  }
  if (!(took < 3))
    td_test_fail(__FILE__, __LINE__, "epoch 7 closed after %.2f s: the survivors waited for evicted processes", took);
  const long e7[] = {1, 2};
  for (int i = 0; i < 2; i++) check_members(e7m[i], 7, e7, 2);
  {
    char key[64];
    int64_t n = 0;
    snprintf(key, sizeof key, "%s/el/e7/n", job);
    CHECK_OK(store_add(launcher, key, 0, &n));
    CHECK_EQ_INT(n, 4); /* 5's hole, 6, the two survivors: 5's second try took none */
  }

  /* Below min-np: two survivors of four, min-np 3, a short timeout. */
  m[1].min_np = m[2].min_np = 3;
  m[1].timeout_s = m[2].timeout_s = 1;
  m[1].settle_s = m[2].settle_s = 0.2;
  el_membership *low[2] = {&m[1], &m[2]};
  run_round(low, 2, args);
  for (int i = 0; i < 2; i++) {
    CHECK_EQ_INT(args[i].st, TD_ERR_TIMEOUT);
    CHECK(strstr(args[i].err, "fewer than the 3 that --min-np requires") != NULL);
  }

  for (int i = 0; i < 7; i++) el_membership_close(&m[i]);
  store_close(launcher);
  store_server_stop(server);
}

int main(void) {
  batch_split_cases();
  membership_cases();
  printf("elastic units: ok\n");
  return 0;
}
