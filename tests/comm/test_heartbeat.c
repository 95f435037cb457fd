/* Heartbeats of the TCP transport: a lost host or a stopped process fails
 * every pending and later operation on every other rank with TD_ERR_REMOTE
 * naming it, within the heartbeat timeout; a rank that is merely busy is
 * never declared lost. Run with TANDEM_TRANSPORT=tcp (or on hosts that
 * differ) and the TANDEM_HEARTBEAT_* values the suite line gives:
 *
 *   test_heartbeat stop VICTIM RESUME_S   VICTIM stops itself (SIGSTOP) after a
 *        warm-up; every even survivor waits in a large allreduce (and has a
 *        second one queued behind it), every odd one
 *        is idle and watches td_comm_status. Each must fail naming VICTIM between
 *        timeout - interval and timeout + 2 intervals (+ slack, and +/- the
 *        seconds its threads measurably waited for a CPU). VICTIM resumes
 *        after RESUME_S and must find its communicator failed. With
 *        TANDEM_HEARTBEAT_MIN_TIMEOUT set: after 24 intervals of beats,
 *        between that floor - interval and half the timeout, and the error
 *        names the adaptive timeout.
 *   test_heartbeat busy BUSY_S            rank 1 computes for BUSY_S seconds
 *        (several heartbeat timeouts) without calling Tandem while rank 0 waits
 *        in an allreduce and the others sleep: the allreduce then completes with
 *        the right sums and the communicator stays healthy.
 *   test_heartbeat freeze ROUNDS FREEZE_S  every rank stopped at once (a
 *        helper process of rank 0 sends SIGSTOP to all, then SIGCONT after
 *        FREEZE_S), ROUNDS times, while every rank runs small allreduces back
 *        to back, as a machine whose CPUs all the ranks starve together (a
 *        quota, stolen time) would: no rank may declare another lost, though
 *        FREEZE_S is above the adaptive timeout (each watcher leaves the
 *        seconds it did not run itself out of the peers' silences), and
 *        every sum is right.
 *   test_heartbeat cut                    for tests/comm/deadhost.sh: ranks on
 *        two hosts (network namespaces) whose link the script cuts. Reads
 *        TEST_DIR (ready.<rank> written after the warm-up; "cut" holds the
 *        CLOCK_BOOTTIME second the link was cut), TEST_SCENARIO (blocked: in
 *        16 MiB allreduces back to back; idle: no call until failure, polling
 *        td_comm_status), TEST_LOST ("R@ADDR,..." the ranks on the other side)
 *        and TEST_BOUND (seconds from the cut to the failure, at most).
 *   test_heartbeat measure SECONDS LOSS    every rank idles SECONDS, then reads
 *        td_comm_heartbeat_stats: a row per peer; beats taken + missed
 *        between half and all of the ticks the peer had (SECONDS and the
 *        time since this process started, over TANDEM_HEARTBEAT_INTERVAL);
 *        a round trip from (nearly) every beat, the least under 50 ms on
 *        loopback; and the missed fraction equal to LOSS (0: none missed;
 *        else within 5 standard deviations of a binomial law: the suite
 *        line drops that fraction of UDP with iptables in a network
 *        namespace of its own).
 *
 * Every failure must be TD_ERR_REMOTE, name a lost rank with its address,
 * stay sticky, and td_comm_destroy must return promptly afterwards. */
#define _GNU_SOURCE 1
#include <signal.h>
#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../common/check.h"
#include "comm_test_util.h"

static int g_rank, g_size;

static double env_seconds(const char *name, double fallback) {
  const char *v = getenv(name);
  return v && *v ? atof(v) : fallback;
}

static double boottime_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_BOOTTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_s(double s) {
  struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

/* Seconds all of this process's threads spent waiting for a CPU (the
 * second field of /proc/self/task/TID/schedstat, run-queue time), summed; 0
 * where the kernel keeps no such count. On a loaded machine (CI runs the
 * trees side by side on 2 cores) the watcher thread that finds the victim,
 * or the main thread that starts the clock, can wait for a core, and the
 * failure's moment moves by as much: the stop test's bounds widen by this
 * measured wait, never by a guess. */
static double runqueue_wait_s(void) {
  DIR *dir = opendir("/proc/self/task");
  if (!dir) return 0;
  double sum = 0;
  struct dirent *e;
  while ((e = readdir(dir))) {
    if (e->d_name[0] == '.') continue;
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%.20s/schedstat", e->d_name);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    unsigned long long run_ns = 0, wait_ns = 0;
    if (fscanf(f, "%llu %llu", &run_ns, &wait_ns) == 2) sum += (double)wait_ns * 1e-9;
    fclose(f);
  }
  closedir(dir);
  return sum;
}

/* Input of rank r at i, and the closed-form sum over all ranks. */
static float input(int r, size_t i) { return (float)(r + 1) + (float)(i % 7); }
static float expected_sum(size_t i) { return (float)(g_size * (g_size + 1) / 2) + (float)g_size * (float)(i % 7); }

static float *alloc_filled(size_t count) {
  float *buf = malloc(count * sizeof *buf + 1);
  if (!buf) td_test_fail(__FILE__, __LINE__, "out of memory for %zu floats", count);
  for (size_t i = 0; i < count; i++) buf[i] = input(g_rank, i);
  return buf;
}

static void checked_allreduce(td_comm *comm, size_t count) {
  float *buf = alloc_filled(count);
  CHECK_OK(td_allreduce(buf, buf, count, TD_F32, TD_SUM, comm));
  for (size_t i = 0; i < count; i++)
    if (buf[i] != expected_sum(i))
      td_test_fail(__FILE__, __LINE__, "rank %d: allreduce of %zu: element %zu is %g, expected %g", g_rank, count, i,
                   (double)buf[i], (double)expected_sum(i));
  free(buf);
}

/* The failure every survivor must see, then stickiness and a prompt destroy. */
static void expect_lost(td_comm *comm, td_status st, const char *const *names, int n_names, double waited,
                        double min_s, double max_s) {
  const char *msg = td_comm_last_error(comm);
  if (st != TD_ERR_REMOTE)
    td_test_fail(__FILE__, __LINE__, "rank %d: expected a remote error, got %s: %s", g_rank, td_status_str(st), msg);
  bool named = false;
  for (int k = 0; k < n_names && !named; k++) named = strstr(msg, names[k]) != NULL;
  if (!named)
    td_test_fail(__FILE__, __LINE__, "rank %d: the error names none of the lost ranks (first: \"%s\"): %s", g_rank,
                 names[0], msg);
  if (waited < min_s || waited > max_s)
    td_test_fail(__FILE__, __LINE__, "rank %d: the failure came after %.2f s, expected %.2f to %.2f s: %s", g_rank,
                 waited, min_s, max_s, msg);
  float x = 1;
  CHECK_STATUS(td_allreduce(&x, &x, 1, TD_F32, TD_SUM, comm), TD_ERR_REMOTE);
  CHECK_STATUS(td_comm_status(comm), TD_ERR_REMOTE);
}

static void destroy_promptly(td_comm *comm) {
  double t0 = ct_now();
  td_comm_destroy(comm);
  double took = ct_now() - t0;
  if (took > 3.0) td_test_fail(__FILE__, __LINE__, "rank %d: td_comm_destroy took %.1f s after the failure", g_rank, took);
}

/* Poll the communicator's status without calling an operation, as an idle
 * program between steps would (or a thread that watches it). */
static td_status wait_for_failure(td_comm *comm, double limit_s) {
  double end = ct_now() + limit_s;
  while (td_comm_status(comm) == TD_OK && ct_now() < end) sleep_s(0.02);
  return td_comm_status(comm);
}

static int run_stop(td_comm *comm, int victim, double resume_s) {
  double interval = env_seconds("TANDEM_HEARTBEAT_INTERVAL", 1.0), timeout = env_seconds("TANDEM_HEARTBEAT_TIMEOUT", 6.0);
  /* Adaptive timeouts (TANDEM_HEARTBEAT_MIN_TIMEOUT): 24 intervals of
   * beats first (more than the 8 gaps the estimate needs), then the victim
   * must be found after the floor and well before the fixed timeout could
   * have said so: within half of it (the suite line sets it far above the
   * floor). */
  double floor_s = env_seconds("TANDEM_HEARTBEAT_MIN_TIMEOUT", -1.0);
  double lo = timeout - interval - 0.3, hi = timeout + 2 * interval + 2.5;
  if (floor_s > 0) {
    sleep_s(24 * interval);
    lo = floor_s - interval - 0.3;
    hi = 0.5 * timeout;
  }
  double waited_for_cpu = runqueue_wait_s();
  checked_allreduce(comm, 16);
  if (g_rank == victim) {
    pid_t parent = getpid();
    pid_t helper = fork();
    if (helper == 0) { /* only async-signal-safe calls in the child of a threaded process */
      struct timespec ts = {.tv_sec = (time_t)resume_s, .tv_nsec = 0};
      nanosleep(&ts, NULL);
      kill(parent, SIGCONT);
      _exit(0);
    }
    CHECK(helper > 0);
    raise(SIGSTOP);
    waitpid(helper, NULL, 0);
    float x = 1;
    td_status st = td_allreduce(&x, &x, 1, TD_F32, TD_SUM, comm);
    if (st == TD_OK)
      td_test_fail(__FILE__, __LINE__, "rank %d: resumed after %.0f s and its allreduce succeeded", g_rank, resume_s);
    printf("heartbeat-stop victim ok: rank %d resumed and got %s: %s\n", g_rank, td_status_str(st),
           td_comm_last_error(comm));
    fflush(stdout);
    destroy_promptly(comm);
    return 0;
  }
  char name[32];
  snprintf(name, sizeof name, "rank %d (", victim);
  const char *names[] = {name};
  double t0 = ct_now();
  td_status st;
  const char *how;
  if (g_rank % 2 == 0) {
    /* One operation running and one queued behind it: both must fail. */
    how = "blocked in an allreduce, a second one queued";
    float *buf = alloc_filled(1u << 20), *second = alloc_filled(1000);
    td_request *running = NULL, *queued = NULL;
    CHECK_OK(td_iallreduce(buf, buf, 1u << 20, TD_F32, TD_SUM, comm, &running));
    CHECK_OK(td_iallreduce(second, second, 1000, TD_F32, TD_SUM, comm, &queued));
    st = td_wait(running);
    td_status st_queued = td_wait(queued);
    if (st_queued != st)
      td_test_fail(__FILE__, __LINE__, "rank %d: the running allreduce ended with %s, the queued one with %s",
                   g_rank, td_status_str(st), td_status_str(st_queued));
    free(buf);
    free(second);
  } else {
    how = "idle";
    st = wait_for_failure(comm, timeout + 30.0);
  }
  double waited = ct_now() - t0;
  waited_for_cpu = runqueue_wait_s() - waited_for_cpu;
  expect_lost(comm, st, names, 1, waited, lo - waited_for_cpu, hi + waited_for_cpu);
  if (floor_s > 0 && !strstr(td_comm_last_error(comm), "its adaptive timeout"))
    td_test_fail(__FILE__, __LINE__, "rank %d: the error does not name the adaptive timeout: %s", g_rank,
                 td_comm_last_error(comm));
  printf("heartbeat-stop survivor ok: rank %d (%s) failed after %.2f s (bounds %.2f to %.2f s, %.2f s of them "
         "waiting for a CPU): %s\n",
         g_rank, how, waited, lo - waited_for_cpu, hi + waited_for_cpu, waited_for_cpu, td_comm_last_error(comm));
  fflush(stdout);
  destroy_promptly(comm);
  return 0;
}

static int run_busy(td_comm *comm, double busy_s) {
  checked_allreduce(comm, 16);
  const size_t count = 100003;
  double t0 = ct_now();
  if (g_rank == 1) {
    /* Compute, as a training step would, without calling Tandem. */
    volatile double acc = 0;
    while (ct_now() - t0 < busy_s)
      for (int i = 0; i < 1000000; i++) acc += (double)i * 1e-9;
  } else if (g_rank != 0) {
    sleep_s(busy_s);
  }
  checked_allreduce(comm, count); /* rank 0 waits here the whole time */
  double waited = ct_now() - t0;
  if (g_rank == 0 && waited < busy_s * 0.9)
    td_test_fail(__FILE__, __LINE__, "rank 0 waited only %.2f s for a rank busy for %.2f s", waited, busy_s);
  CHECK_OK(td_comm_status(comm));
  for (int k = 0; k < 3; k++) checked_allreduce(comm, 1000 + (size_t)k);
  CHECK_OK(td_comm_finalize(comm));
  printf("heartbeat-busy ok: rank %d after %.2f s\n", g_rank, waited);
  fflush(stdout);
  td_comm_destroy(comm);
  return 0;
}

static int run_freeze(td_comm *comm, int rounds, double freeze_s) {
  double interval = env_seconds("TANDEM_HEARTBEAT_INTERVAL", 1.0);
  /* Every rank's pid, for rank 0's helper (all ranks share this host). */
  int32_t *pids = calloc((size_t)g_size, sizeof *pids);
  CHECK(pids != NULL);
  pids[g_rank] = (int32_t)getpid();
  CHECK_OK(td_allreduce(pids, pids, (size_t)g_size, TD_I32, TD_SUM, comm));
  /* Rounds of 32 intervals: beats enough for the adaptive timeouts (and
   * after a freeze for the watchers to settle), the freeze in the middle. */
  double round_s = 32 * interval + freeze_s, t0 = ct_now();
  pid_t helper = -1;
  if (g_rank == 0) {
    helper = fork();
    CHECK(helper >= 0);
    if (helper == 0) {
      for (int r = 0; r < rounds; r++) {
        sleep_s(24 * interval);
        for (int p = 0; p < g_size; p++) kill(pids[p], SIGSTOP);
        sleep_s(freeze_s);
        for (int p = 0; p < g_size; p++) kill(pids[p], SIGCONT);
        sleep_s(8 * interval);
      }
      _exit(0);
    }
  }
  long n_ops = 0;
  for (;;) {
    /* Rank 0's clock decides when to stop, so that all make equal calls. */
    float stop = g_rank == 0 && ct_now() - t0 >= rounds * round_s + 2 * interval ? 1.0f : 0.0f;
    CHECK_OK(td_allreduce(&stop, &stop, 1, TD_F32, TD_SUM, comm));
    if (stop > 0) break;
    checked_allreduce(comm, 1000 + (size_t)(n_ops % 7));
    n_ops++;
    sleep_s(0.01);
  }
  /* The helper is done (its rounds took at most as long): ranks agree that
   * no freeze is left to come before they check the end. */
  if (helper > 0) {
    int status = 0;
    CHECK(waitpid(helper, &status, 0) == helper && WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  checked_allreduce(comm, 16);
  if (td_comm_status(comm) != TD_OK)
    td_test_fail(__FILE__, __LINE__, "rank %d: a freeze of every rank was declared a loss: %s", g_rank,
                 td_comm_last_error(comm));
  CHECK_OK(td_comm_finalize(comm));
  printf("heartbeat-freeze ok: rank %d, %d freezes of %.2f s, %ld allreduces, no peer lost\n", g_rank, rounds,
         freeze_s, n_ops);
  fflush(stdout);
  free(pids);
  td_comm_destroy(comm);
  return 0;
}

/* The CLOCK_BOOTTIME second the script cut the link, once it has. */
static bool read_cut_time(const char *dir, double *out) {
  char path[512];
  snprintf(path, sizeof path, "%s/cut", dir);
  FILE *f = fopen(path, "r");
  if (!f) return false;
  bool ok = fscanf(f, "%lf", out) == 1;
  fclose(f);
  return ok;
}

static int run_cut(td_comm *comm) {
  const char *dir = getenv("TEST_DIR"), *scenario = getenv("TEST_SCENARIO"), *lost = getenv("TEST_LOST");
  double bound = env_seconds("TEST_BOUND", 10.0);
  if (!dir || !scenario || !lost) {
    fprintf(stderr, "test_heartbeat cut: set TEST_DIR, TEST_SCENARIO and TEST_LOST\n");
    return 2;
  }
  /* "R@ADDR,..." -> "rank R (ADDR:" each. */
  char spec[512], names_buf[16][96];
  const char *names[16];
  int n_names = 0;
  snprintf(spec, sizeof spec, "%s", lost);
  for (char *tok = strtok(spec, ","); tok && n_names < 16; tok = strtok(NULL, ",")) {
    char *at = strchr(tok, '@');
    if (!at) td_test_fail(__FILE__, __LINE__, "TEST_LOST entry '%s' is not R@ADDR", tok);
    *at = '\0';
    snprintf(names_buf[n_names], sizeof names_buf[n_names], "rank %s (%s:", tok, at + 1);
    names[n_names] = names_buf[n_names];
    n_names++;
  }
  if (n_names == 0) td_test_fail(__FILE__, __LINE__, "TEST_LOST names no rank");

  checked_allreduce(comm, 1000);
  char path[512];
  snprintf(path, sizeof path, "%s/ready.%d", dir, g_rank);
  FILE *f = fopen(path, "w");
  CHECK(f != NULL);
  fclose(f);

  td_status st;
  if (!strcmp(scenario, "blocked")) {
    /* Large allreduces back to back: the cut finds this rank inside one,
     * with data in flight on the link. */
    const size_t count = 4u << 20;
    float *buf = alloc_filled(count);
    while ((st = td_allreduce(buf, buf, count, TD_F32, TD_SUM, comm)) == TD_OK) {
    }
    free(buf);
  } else if (!strcmp(scenario, "idle")) {
    double cut;
    double give_up = ct_now() + 60.0;
    while (!read_cut_time(dir, &cut) && ct_now() < give_up) {
      if (td_comm_status(comm) != TD_OK)
        td_test_fail(__FILE__, __LINE__, "rank %d failed before the link was cut: %s", g_rank,
                     td_comm_last_error(comm));
      sleep_s(0.02);
    }
    st = wait_for_failure(comm, bound + 30.0);
    if (st != TD_OK) {
      /* The next operation fails at once, with the same status. */
      float x = 1;
      double t0 = ct_now();
      CHECK_STATUS(td_allreduce(&x, &x, 1, TD_F32, TD_SUM, comm), st);
      if (ct_now() - t0 > 0.5) td_test_fail(__FILE__, __LINE__, "rank %d: a call after the failure took %.2f s", g_rank, ct_now() - t0);
    }
  } else {
    fprintf(stderr, "test_heartbeat cut: TEST_SCENARIO must be blocked or idle, not %s\n", scenario);
    return 2;
  }
  double failed_at = boottime_now(), cut;
  if (!read_cut_time(dir, &cut))
    td_test_fail(__FILE__, __LINE__, "rank %d failed before the link was cut (%s): %s", g_rank, td_status_str(st),
                 td_comm_last_error(comm));
  double waited = failed_at - cut;
  expect_lost(comm, st, names, n_names, waited, 0.0, bound);
  printf("heartbeat-cut ok: rank %d (%s) failed %.2f s after the cut: %s\n", g_rank, scenario, waited,
         td_comm_last_error(comm));
  fflush(stdout);
  destroy_promptly(comm);
  return 0;
}

static double g_started;

static int run_measure(td_comm *comm, double secs, double loss) {
  double interval = env_seconds("TANDEM_HEARTBEAT_INTERVAL", 1.0);
  CHECK_OK(td_barrier(comm));
  usleep((useconds_t)(secs * 1e6));
  td_heartbeat_stats rows[16];
  int n = td_comm_heartbeat_stats(comm, rows, 16);
  double alive = ct_now() - g_started;
  CHECK_EQ_INT(n, g_size - 1);
  CHECK_OK(td_comm_status(comm));
  for (int i = 0; i < n; i++) {
    const td_heartbeat_stats *r = &rows[i];
    double heard = (double)(r->beats + r->missed), frac = heard > 0 ? (double)r->missed / heard : 1;
    printf("rank %d from peer %d: %llu beats, %llu missed (%.3f), %llu round trips: last %.6f s, smoothed %.6f, "
           "least %.6f\n", g_rank, r->peer, (unsigned long long)r->beats, (unsigned long long)r->missed, frac,
           (unsigned long long)r->rtt_samples, r->rtt_s, r->rtt_smoothed_s, r->rtt_min_s);
    CHECK(r->peer >= 0 && r->peer < g_size && r->peer != g_rank);
    for (int j = 0; j < i; j++) CHECK(rows[j].peer != r->peer);
    CHECK(heard >= 0.5 * secs / interval);
    CHECK(heard <= alive / interval + 3);
    /* every beat after the peer took one of ours echoes it: at most the
     * peer's first beats carry no echo, a few at the start, and under loss
     * also those sent while all of ours to it were lost so far (k in a row:
     * probability LOSS^k; 1e-6 at k = log(1e-6) / log(LOSS), 20 at 0.5) */
    double unechoed = 3 + (loss > 0 ? ceil(log(1e-6) / log(loss)) : 0);
    CHECK((double)r->rtt_samples + unechoed >= (double)r->beats);
    CHECK(r->rtt_min_s > 0 && r->rtt_min_s < 0.05 && r->rtt_min_s <= r->rtt_smoothed_s && r->rtt_min_s <= r->rtt_s);
    if (loss == 0)
      CHECK(r->missed == 0);
    else
      CHECK(fabs(frac - loss) <= 5 * sqrt(loss * (1 - loss) / heard));
  }
  CHECK_OK(td_comm_finalize(comm));
  td_comm_destroy(comm);
  return 0;
}

int main(int argc, char **argv) {
  g_started = ct_now();
  if (argc < 2) {
    fprintf(stderr, "usage: %s stop VICTIM RESUME_S | busy BUSY_S | freeze ROUNDS FREEZE_S | cut | measure SECONDS LOSS\n",
            argv[0]);
    return 2;
  }
  td_comm *comm = NULL;
  CHECK_OK(td_comm_init(&comm));
  g_rank = td_comm_rank(comm);
  g_size = td_comm_size(comm);
  if (g_size < 2 || strcmp(td_comm_transport(comm), "tcp"))
    td_test_fail(__FILE__, __LINE__, "needs 2+ ranks on the tcp transport (have %d on %s)", g_size,
                 td_comm_transport(comm));
  if (!strcmp(argv[1], "stop") && argc > 3) return run_stop(comm, atoi(argv[2]), atof(argv[3]));
  if (!strcmp(argv[1], "busy") && argc > 2) return run_busy(comm, atof(argv[2]));
  if (!strcmp(argv[1], "freeze") && argc > 3) return run_freeze(comm, atoi(argv[2]), atof(argv[3]));
  if (!strcmp(argv[1], "cut")) return run_cut(comm);
  if (!strcmp(argv[1], "measure") && argc > 3) return run_measure(comm, atof(argv[2]), atof(argv[3]));
  fprintf(stderr, "unknown mode %s\n", argv[1]);
  return 2;
}
