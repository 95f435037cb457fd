/* A worker for the launcher tests (tests/net/launcher.sh), run under
 * tandemrun; not a test by itself. Options are carried out in this order:
 *
 *   --ignore-term           ignore SIGTERM (tests the SIGKILL that follows)
 *   --pidfile DIR           write DIR/pid.RANK, start a grandchild that sleeps
 *                           and write its pid to DIR/gpid.RANK
 *   --print-env             print "rank=.. world=.. local_rank=.. local_size=..
 *                           store=.. job=.. cwd=.."
 *   --lines N               print "out RANK i" to stdout and "err RANK i" to
 *                           stderr for i < N
 *   --partial TEXT          write TEXT to stdout without a newline
 *   --store-barrier         every rank adds 1 to a store counter and waits
 *                           until all WORLD ranks have (checks TANDEM_STORE)
 *   --fail R:exit:CODE:AFTER    on rank R, after AFTER seconds, exit with
 *   --fail R:signal:SIG:AFTER   CODE or kill itself with SIG (repeatable)
 *   --sleep S               sleep S seconds
 *   --exit CODE             exit with CODE (default 0) */
#include "net/net.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void sleep_s(double s) {
  if (s <= 0) return;
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

static int env_int(const char *name) {
  const char *v = getenv(name);
  return v ? atoi(v) : -1;
}

int main(int argc, char **argv) {
  int rank = env_int("TANDEM_RANK"), world = env_int("TANDEM_WORLD_SIZE");
  bool ignore_term = false, print_env = false, barrier = false;
  const char *pid_dir = NULL, *partial = NULL;
  int n_lines = 0, exit_code = 0;
  double sleep_for = 0;
  const char *fails[16];
  int n_fails = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--ignore-term")) ignore_term = true;
    else if (!strcmp(a, "--print-env")) print_env = true;
    else if (!strcmp(a, "--store-barrier")) barrier = true;
    else if (!strcmp(a, "--pidfile") && v) pid_dir = argv[++i];
    else if (!strcmp(a, "--lines") && v) n_lines = atoi(argv[++i]);
    else if (!strcmp(a, "--partial") && v) partial = argv[++i];
    else if (!strcmp(a, "--fail") && v && n_fails < 16) fails[n_fails++] = argv[++i];
    else if (!strcmp(a, "--sleep") && v) sleep_for = atof(argv[++i]);
    else if (!strcmp(a, "--exit") && v) exit_code = atoi(argv[++i]);
    else {
      fprintf(stderr, "test_launch_child: unknown argument '%s'\n", a);
      return 99;
    }
  }
  if (ignore_term) signal(SIGTERM, SIG_IGN);
  if (pid_dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/pid.%d", pid_dir, rank);
    FILE *f = fopen(path, "w");
    if (f) {
      fprintf(f, "%d\n", (int)getpid());
      fclose(f);
    }
    pid_t g = fork();
    if (g == 0) {
      /* The grandchild stays in the worker's process group; it must die
       * with the worker when tandemrun stops the job. */
      sleep_s(120);
      _exit(0);
    }
    snprintf(path, sizeof path, "%s/gpid.%d", pid_dir, rank);
    f = fopen(path, "w");
    if (f) {
      fprintf(f, "%d\n", (int)g);
      fclose(f);
    }
  }
  if (print_env) {
    char cwd[512];
    if (!getcwd(cwd, sizeof cwd)) strcpy(cwd, "?");
    printf("rank=%s world=%s local_rank=%s local_size=%s store=%s job=%s cwd=%s\n", getenv("TANDEM_RANK"),
           getenv("TANDEM_WORLD_SIZE"), getenv("TANDEM_LOCAL_RANK"), getenv("TANDEM_LOCAL_SIZE"),
           getenv("TANDEM_STORE"), getenv("TANDEM_JOB_ID"), cwd);
    fflush(stdout);
  }
  for (int i = 0; i < n_lines; i++) {
    printf("out %d %d\n", rank, i);
    fprintf(stderr, "err %d %d\n", rank, i);
  }
  if (partial) printf("%s", partial);
  fflush(stdout);
  if (barrier) {
    td_store *s = NULL;
    if (store_connect(getenv("TANDEM_STORE"), 10.0, &s) != TD_OK) {
      fprintf(stderr, "store_connect: %s\n", td_last_error());
      return 98;
    }
    int64_t n = 0;
    if (store_add(s, "arrived", 1, &n) != TD_OK) return 97;
    if (n == world && store_set_str(s, "all-arrived", "yes") != TD_OK) return 96;
    char *v = NULL;
    if (store_wait_str(s, "all-arrived", 10.0, &v) != TD_OK) {
      fprintf(stderr, "store_wait: %s\n", td_last_error());
      return 95;
    }
    printf("barrier passed\n");
    fflush(stdout);
    free(v);
    store_close(s);
  }
  for (int i = 0; i < n_fails; i++) {
    int fail_rank;
    char how[16];
    int value;
    double after;
    if (sscanf(fails[i], "%d:%15[a-z]:%d:%lf", &fail_rank, how, &value, &after) != 4) {
      fprintf(stderr, "test_launch_child: --fail wants R:exit:CODE:AFTER or R:signal:SIG:AFTER\n");
      return 99;
    }
    if (fail_rank != rank) continue;
    sleep_s(after);
    fprintf(stderr, "rank %d failing on purpose (%s %d)\n", rank, how, value);
    if (!strcmp(how, "signal")) {
      signal(value, SIG_DFL);
      kill(getpid(), value);
      sleep_s(10);
    }
    return value;
  }
  sleep_s(sleep_for);
  return exit_code;
}
