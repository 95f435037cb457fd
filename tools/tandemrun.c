/* tandemrun: start N ranks of a program, like mpirun, horovodrun or torchrun.
 *
 *   tandemrun -np N [-H host1:slots,host2:slots | --hostfile FILE]
 *             [--timeout SECONDS] [--grace SECONDS] PROGRAM [ARGS...]
 *
 * It hosts the rendezvous store in a thread, gives every worker TANDEM_RANK,
 * TANDEM_WORLD_SIZE, TANDEM_LOCAL_RANK, TANDEM_LOCAL_SIZE, TANDEM_STORE and
 * TANDEM_JOB_ID, and then supervises them from one poll loop:
 *
 *   - output: each worker's stdout and stderr come through pipes and are
 *     re-emitted whole line by whole line, prefixed "[RANK] ";
 *   - signals: SIGINT/SIGTERM/SIGHUP arrive on a signalfd and are forwarded
 *     to every worker's process group (SIGKILL follows 3 s later);
 *   - failure: the first worker to exit non-zero or by a signal is the root
 *     cause. The others get --grace seconds to notice and exit by themselves
 *     (so that they can print their own errors naming the lost rank), then
 *     SIGTERM, then SIGKILL 3 s later. tandemrun prints one line naming the
 *     root cause and exits with its code (128 + signal for a signal);
 *   - --timeout bounds the whole job; it then stops everything and exits 124.
 *
 * Local hosts are started with fork/exec, each worker in its own process group
 * (so that its children are signalled too) and with a parent-death signal (so
 * that a killed tandemrun does not leave orphans). On a remote host, one
 * tandem-agent started over ssh forks and execs the ranks ("per-host
 * agents" below); without one, each rank starts with $TANDEM_SSH (default
 * "ssh -o BatchMode=yes") HOST 'cd CWD && ... env VARS PROGRAM ARGS ...'
 * (start_worker_here_or_ssh), as sessions of one master connection per
 * host ("ssh connection sharing" below). Ranks fill hosts slot by slot, in
 * the order given.
 *
 * A remote worker's ssh (without an agent) has a "lifeline" on its stdin: a pipe that tandemrun
 * holds open while the worker runs. The remote shell runs the program in the
 * background and watches its stdin; EOF there means tandemrun stopped the
 * worker (it killed ssh), or tandemrun or its ssh died, or the connection
 * was lost: the shell then stops the program (SIGTERM, SIGKILL 3 s later),
 * so that no remote orphan outlives its launcher (sshd signals nothing to
 * a command without a terminal). The shell exits with the program's status,
 * 128 + N for a signal N, which ssh passes on (ssh itself reports a remote
 * death by a signal as 255, the code of its own failures).
 *
 * The job's secret (net.h, "authentication"): unless TANDEM_SECRET or
 * TANDEM_SECRET_FILE is already set, tandemrun draws 256 bits from
 * getrandom() and puts them, hex-encoded, in TANDEM_SECRET, which local
 * workers inherit. Remote workers get it on ssh's stdin (the remote command
 * reads it into its own environment first), never in the command line that
 * ps and ssh logs show; a user-given TANDEM_SECRET_FILE is passed by path
 * (the file must then exist on every host).
 *
 * --prometheus-port P serves one Prometheus endpoint for the whole job on P
 * (src/obs/prometheus_job.c: each scrape fetches every rank's and merges
 * them); the ranks get TANDEM_PROMETHEUS_PORT=P+1, so rank r serves on
 * P+1+r on its host. In elastic mode the port is the process's launch
 * number's (P+1+ID: it stays while ranks are renumbered), the endpoint
 * fetches the processes running now, and it adds the launcher's own
 * series: processes running, started (initial or replacement) and failed
 * (by signal or exit). */
#include "net/net.h"
#include "elastic/membership.h"
#include "elastic/lossy.h"
#include "agent_protocol.h"
#include "tandem/obs.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TANDEMRUN_VERSION "0.1.0"
#define KILL_AFTER_TERM_S 3.0
#define DRAIN_AFTER_EXIT_S 1.0
#define LINE_MAX_BYTES (64 * 1024)

extern char **environ;

static struct sigaction original_sigpipe;

typedef struct {
  char *name;
  int slots;
  bool local;
  double blacklisted_until; /* elastic: no new workers here before this time */
  int young_failures;       /* elastic: processes here that failed young, in a row */
  double last_failure;      /* elastic: when a process here last failed (0: never) */
  bool evicted;             /* elastic: its link was judged lossy; no new process here until it is clean */
  double evicted_at;
  double pongs_since;       /* elastic: since when its agent has answered every ping within LOSSY_PONG_LAG_S (0: not) */
} host_spec;

/* Elastic back-off on a host whose replacements fail young (within
 * HOST_YOUNG_S of their start: a dead host's ssh, a bad disk, a crash at
 * start-up; the initial processes do not count: a fault injected or
 * suffered early in a job is no sign of a bad host). The first such failure is retried at once (on another host
 * with a free slot if there is one: free_slot); after the n-th in a row
 * (n >= 2) no new process starts there for HOST_BACKOFF_S * 2^(n-2), at
 * most HOST_BACKOFF_MAX_S (or --blacklist-cooldown when longer), so that a
 * failing host cannot use up --max-restarts in a burst of retries. A
 * process that fails after running longer (killed, a lost link) is an
 * ordinary fault: it ends the streak and is replaced at once, so the world
 * size comes back in the same round. */
#define HOST_YOUNG_S 3.0
#define HOST_BACKOFF_S 1.0
#define HOST_BACKOFF_MAX_S 30.0

typedef struct {
  char *data;
  size_t len, cap;
} line_buf;

typedef struct {
  int rank, local_rank, local_size;
  host_spec *host;
  pid_t pid;
  int out_fd, err_fd; /* -1 once closed */
  line_buf out_buf, err_buf;
  bool running;   /* started and not yet reaped */
  bool signalled; /* we sent it a signal */
  double started; /* td_now() at its start */
  int wait_status;
  bool joiner; /* elastic: started after the job began (joins at a commit) */
  int lifeline_fd; /* remote: write end of ssh's stdin, held open while it runs (-1: none) */
  int stop_sig;    /* --end-stopped: it was stopped by this signal and ended by us (0: not so) */
  bool shared;     /* remote: its ssh is a session of its host's master connection */
  int agent;          /* remote: 1 + the index of the host agent that runs it (0: started over ssh) */
  bool agent_pending; /* queued until that agent says hello (sent no START yet) */
  double end_by;      /* agent's: signalled; ended here at this time if its agent has not reported it (0: not so) */
  int end_sig;        /* the signal that set end_by */
} worker;

typedef struct {
  int n_ranks;
  host_spec *hosts;
  int n_hosts;
  double timeout_s; /* 0 = none */
  double grace_s;
  char **argv; /* PROGRAM ARGS..., NULL-terminated */
  char *program_path; /* resolved for local workers */
  /* elastic mode (--min-np/--max-np): see the "elastic" section below */
  bool elastic;
  int min_np, max_np;
  const char *discovery; /* --host-discovery-script */
  int max_restarts;
  double cooldown_s, elastic_timeout_s;
  bool end_stopped; /* --end-stopped: a stopped process is ended and reported lost at once */
  int prom_port;         /* --prometheus-port: the job's endpoint (0: none) */
  const char *prom_bind; /* --prometheus-bind: its address (NULL: 127.0.0.1) */
} options;

/* ---- small helpers ---- */

static void die_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die_usage(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("tandemrun: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputs(" (see tandemrun --help)\n", stderr);
  va_end(ap);
  exit(2);
}

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) {
    fprintf(stderr, "tandemrun: out of memory\n");
    exit(1);
  }
  return p;
}

static char *xstrdup(const char *s) {
  char *p = xmalloc(strlen(s) + 1);
  strcpy(p, s);
  return p;
}

static char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *xasprintf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s = NULL;
  if (vasprintf(&s, fmt, ap) < 0) {
    fprintf(stderr, "tandemrun: out of memory\n");
    exit(1);
  }
  va_end(ap);
  return s;
}

static void write_all_fd(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return; /* our own output is gone (closed pipe): drop it */
    p += w;
    n -= (size_t)w;
  }
}

static const char *signal_name(int sig, char *buf, size_t size) {
  const char *abbrev = sigabbrev_np(sig);
  if (abbrev)
    snprintf(buf, size, "SIG%s", abbrev);
  else
    snprintf(buf, size, "signal %d", sig);
  return buf;
}

static void usage(FILE *f) {
  fputs("usage: tandemrun -np N [-H HOST:SLOTS,... | --hostfile FILE] [--timeout SECONDS] [--grace SECONDS]\n"
        "                 PROGRAM [ARGS...]\n"
        "\n"
        "Starts N ranks of PROGRAM and hosts their rendezvous store. Each rank gets TANDEM_RANK,\n"
        "TANDEM_WORLD_SIZE, TANDEM_LOCAL_RANK, TANDEM_LOCAL_SIZE, TANDEM_STORE and TANDEM_JOB_ID.\n"
        "\n"
        "  -np N, -n N          number of ranks (required)\n"
        "  -H LIST              hosts and slots, e.g. -H node1:4,node2:4 (a host without :SLOTS has 1);\n"
        "                       ranks fill the hosts slot by slot; default: all N on this host\n"
        "  --hostfile FILE      one host per line: HOST, HOST:SLOTS or HOST slots=SLOTS; '#' comments\n"
        "  --timeout SECONDS    stop the whole job after this long and exit 124\n"
        "  --grace SECONDS      after a rank fails, give the others this long to exit by themselves\n"
        "                       before stopping them (default 2)\n"
        "  --min-np A, --max-np B  elastic mode: keep training while at least A ranks live, at most B;\n"
        "                       a lost rank does not stop the job: survivors go on at the new size,\n"
        "                       replacements or new slots start ranks that join at a step boundary\n"
        "  --host-discovery-script S  elastic: run S every second; it prints HOST:SLOTS lines\n"
        "  --max-restarts K     elastic: start at most K workers after the initial ones (default 3)\n"
        "  --blacklist-cooldown S  elastic: no new worker on a host for S s after one failed there (default 0)\n"
        "  --elastic-timeout S  elastic: stop when fewer than --min-np ranks live for S s (default 600)\n"
        "  --end-stopped        elastic: a local process stopped by a signal (SIGSTOP, SIGTSTP) is ended and\n"
        "                       reported lost at once, without waiting for its heartbeats to be missed\n"
        "  --prometheus-port P  serve the whole job's Prometheus metrics on port P (rank r serves on\n"
        "                       P+1+r: TANDEM_PROMETHEUS_PORT=P+1; elastic: process ID on P+1+ID)\n"
        "  --prometheus-bind A  the address of that endpoint (default 127.0.0.1)\n"
        "  -h, --help           this text\n"
        "  --version            print the version\n"
        "\n"
        "Output lines are prefixed with \"[RANK] \". SIGINT, SIGTERM and SIGHUP are forwarded to all\n"
        "ranks. When a rank fails, the others are stopped and tandemrun exits with the failed rank's\n"
        "exit code (128+N for signal N) after one line naming it.\n"
        "\n"
        "Remote hosts (anything but localhost, 127.x, ::1 and this host's name) are started with\n"
        "$TANDEM_SSH (default \"ssh -o BatchMode=yes\"), passing the working directory and the\n"
        "TANDEM_*, OMP_*, OPENBLAS_*, PATH, LD_LIBRARY_PATH, PYTHONPATH and sanitizer variables;\n"
        "with OpenSSH, one connection per host carries all its ranks (TANDEM_SSH_SHARE=0: one each).\n"
        "The store then listens on all interfaces; TANDEM_HOST_ADDR sets the address ranks dial.\n",
        f);
}

/* ---- hosts ---- */

static bool host_is_local(const char *name) {
  if (strcmp(name, "localhost") == 0 || strncmp(name, "127.", 4) == 0 || strcmp(name, "::1") == 0 ||
      strcmp(name, "[::1]") == 0)
    return true;
  char me[256];
  if (gethostname(me, sizeof me) != 0) return false;
  me[sizeof me - 1] = '\0';
  if (strcmp(name, me) == 0) return true;
  /* "node7" matches "node7.cluster.example" and the other way round */
  size_t a = strcspn(name, "."), b = strcspn(me, ".");
  return a == b && strncmp(name, me, a) == 0 && (!name[a] || !me[b]);
}

static void add_host(options *o, const char *name, int slots) {
  o->hosts = realloc(o->hosts, (size_t)(o->n_hosts + 1) * sizeof *o->hosts);
  if (!o->hosts) {
    fprintf(stderr, "tandemrun: out of memory\n");
    exit(1);
  }
  o->hosts[o->n_hosts].name = xstrdup(name);
  o->hosts[o->n_hosts].slots = slots;
  o->hosts[o->n_hosts].local = host_is_local(name);
  o->n_hosts++;
}

/* Parse a positive slot count; -1 if not one. */
static int parse_slots(const char *text) {
  if (!*text) return -1;
  long v = 0;
  for (const char *p = text; *p; p++) {
    if (*p < '0' || *p > '9' || v > 100000) return -1;
    v = v * 10 + (*p - '0');
  }
  return v >= 1 && v <= 100000 ? (int)v : -1;
}

/* "host" or "host:slots" (a bracketed IPv6 address may precede :slots). */
static bool parse_host_item(options *o, const char *item) {
  char name[256];
  const char *colon = NULL;
  if (item[0] == '[') {
    const char *close = strchr(item, ']');
    if (!close) return false;
    colon = close[1] == ':' ? close + 1 : NULL;
    if (close[1] && !colon) return false;
  } else {
    colon = strrchr(item, ':');
  }
  size_t name_len = colon ? (size_t)(colon - item) : strlen(item);
  if (name_len == 0 || name_len >= sizeof name) return false;
  memcpy(name, item, name_len);
  name[name_len] = '\0';
  if (strpbrk(name, " \t,=")) return false;
  int slots = 1;
  if (colon && (slots = parse_slots(colon + 1)) < 0) return false;
  add_host(o, name, slots);
  return true;
}

static void parse_host_list(options *o, const char *list) {
  char *copy = xstrdup(list);
  char *save = NULL;
  int n = 0;
  for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save), n++) {
    if (!parse_host_item(o, item))
      die_usage("-H: '%s' is not HOST or HOST:SLOTS; write e.g. -H node1:4,node2:4", item);
  }
  if (n == 0) die_usage("-H needs a list of hosts, e.g. -H node1:4,node2:4");
  free(copy);
}

static void parse_hostfile(options *o, const char *path) {
  FILE *f = fopen(path, "re");
  if (!f) die_usage("cannot read hostfile '%s': %s", path, strerror(errno));
  char line[1024];
  int line_no = 0, n = 0;
  while (fgets(line, sizeof line, f)) {
    line_no++;
    line[strcspn(line, "#\r\n")] = '\0';
    char *fields[3];
    int n_fields = 0;
    char *save = NULL;
    for (char *t = strtok_r(line, " \t", &save); t; t = strtok_r(NULL, " \t", &save)) {
      if (n_fields == 3) break;
      fields[n_fields++] = t;
    }
    if (n_fields == 0) continue;
    bool ok;
    if (n_fields == 1) {
      ok = parse_host_item(o, fields[0]);
    } else if (n_fields == 2 && strncmp(fields[1], "slots=", 6) == 0 && !strchr(fields[0], ':')) {
      int slots = parse_slots(fields[1] + 6);
      ok = slots > 0;
      if (ok) add_host(o, fields[0], slots);
    } else {
      ok = false;
    }
    if (!ok) {
      fclose(f);
      die_usage("hostfile %s line %d is not 'HOST', 'HOST:SLOTS' or 'HOST slots=SLOTS' (SLOTS a positive integer)",
                path, line_no);
    }
    n++;
  }
  fclose(f);
  if (n == 0) die_usage("hostfile %s lists no hosts; write one per line, e.g. 'node1 slots=4'", path);
}

/* ---- options ---- */

static double parse_seconds(const char *opt, const char *text, bool allow_zero) {
  char *end;
  errno = 0;
  double v = strtod(text, &end);
  if (errno || end == text || *end || !isfinite(v) || v < 0 || (!allow_zero && v == 0))
    die_usage("%s '%s' is not a number of seconds; write e.g. %s 60", opt, text, opt);
  return v;
}

/* Find an executable the way execvp would; NULL if there is none. */
static char *resolve_program(const char *prog, char *why, size_t why_size) {
  if (strchr(prog, '/')) {
    struct stat st;
    if (stat(prog, &st) != 0) {
      snprintf(why, why_size, "%s", strerror(errno));
      return NULL;
    }
    if (S_ISDIR(st.st_mode) || access(prog, X_OK) != 0) {
      snprintf(why, why_size, "%s", S_ISDIR(st.st_mode) ? "it is a directory" : "it is not executable (chmod +x?)");
      return NULL;
    }
    return xstrdup(prog);
  }
  const char *path = getenv("PATH");
  if (!path || !*path) path = "/usr/local/bin:/usr/bin:/bin";
  char *copy = xstrdup(path);
  char *save = NULL;
  for (char *dir = strtok_r(copy, ":", &save); dir; dir = strtok_r(NULL, ":", &save)) {
    char *full = xasprintf("%s/%s", *dir ? dir : ".", prog);
    struct stat st;
    if (stat(full, &st) == 0 && !S_ISDIR(st.st_mode) && access(full, X_OK) == 0) {
      free(copy);
      return full;
    }
    free(full);
  }
  free(copy);
  snprintf(why, why_size, "not found in PATH (give a path such as ./%s)", prog);
  return NULL;
}

static void parse_options(int argc, char **argv, options *o) {
  memset(o, 0, sizeof *o);
  o->grace_s = 2.0;
  o->max_restarts = -1; /* not given */
  const char *hosts_arg = NULL, *hostfile = NULL;
  int i = 1;
  for (; i < argc; i++) {
    const char *a = argv[i];
    if (a[0] != '-') break;
    if (strcmp(a, "--") == 0) {
      i++;
      break;
    }
    const char *value = NULL;
    const char *eq = strncmp(a, "--", 2) == 0 ? strchr(a, '=') : NULL;
    char name[64];
    if (eq) {
      snprintf(name, sizeof name, "%.*s", (int)(eq - a), a);
      value = eq + 1;
    } else {
      snprintf(name, sizeof name, "%s", a);
    }
#define NEED_VALUE()                                                              \
  do {                                                                            \
    if (!value) {                                                                 \
      if (i + 1 >= argc) die_usage("%s needs a value", name);                     \
      value = argv[++i];                                                          \
    }                                                                             \
  } while (0)
    if (strcmp(name, "-h") == 0 || strcmp(name, "--help") == 0) {
      usage(stdout);
      exit(0);
    } else if (strcmp(name, "--version") == 0) {
      printf("tandemrun (Tandem) %s\n", TANDEMRUN_VERSION);
      exit(0);
    } else if (strcmp(name, "-np") == 0 || strcmp(name, "-n") == 0 || strcmp(name, "--np") == 0) {
      NEED_VALUE();
      char *end;
      errno = 0;
      long n = strtol(value, &end, 10);
      if (errno || end == value || *end || n < 1 || n > 100000)
        die_usage("-np '%s' is not a positive number of ranks; write e.g. -np 4", value);
      o->n_ranks = (int)n;
    } else if (strcmp(name, "-H") == 0 || strcmp(name, "--hosts") == 0 || strcmp(name, "--host") == 0) {
      NEED_VALUE();
      hosts_arg = value;
    } else if (strcmp(name, "--hostfile") == 0 || strcmp(name, "-hostfile") == 0) {
      NEED_VALUE();
      hostfile = value;
    } else if (strcmp(name, "--timeout") == 0) {
      NEED_VALUE();
      o->timeout_s = parse_seconds("--timeout", value, false);
    } else if (strcmp(name, "--grace") == 0) {
      NEED_VALUE();
      o->grace_s = parse_seconds("--grace", value, true);
    } else if (strcmp(name, "--min-np") == 0 || strcmp(name, "--max-np") == 0 || strcmp(name, "--max-restarts") == 0) {
      NEED_VALUE();
      char *end;
      errno = 0;
      long n = strtol(value, &end, 10);
      bool restarts = name[6] == 'r';
      if (errno || end == value || *end || n < (restarts ? 0 : 1) || n > 100000)
        die_usage("%s '%s' is not a %s number; write e.g. %s 2", name, value, restarts ? "non-negative" : "positive",
                  name);
      if (restarts)
        o->max_restarts = (int)n;
      else if (name[3] == 'i')
        o->min_np = (int)n;
      else
        o->max_np = (int)n;
      if (!restarts) o->elastic = true;
    } else if (strcmp(name, "--host-discovery-script") == 0) {
      NEED_VALUE();
      o->discovery = value;
    } else if (strcmp(name, "--blacklist-cooldown") == 0) {
      NEED_VALUE();
      o->cooldown_s = parse_seconds("--blacklist-cooldown", value, true);
    } else if (strcmp(name, "--elastic-timeout") == 0) {
      NEED_VALUE();
      o->elastic_timeout_s = parse_seconds("--elastic-timeout", value, false);
    } else if (strcmp(name, "--end-stopped") == 0) {
      if (value) die_usage("--end-stopped takes no value");
      o->end_stopped = true;
    } else if (strcmp(name, "--prometheus-port") == 0) {
      NEED_VALUE();
      char *end = NULL;
      long port = strtol(value, &end, 10);
      if (!*value || *end || port < 1 || port > 65534)
        die_usage("--prometheus-port '%s' is not a port (1-65534: the job's endpoint; ranks take the ports after it)",
                  value);
      o->prom_port = (int)port;
    } else if (strcmp(name, "--prometheus-bind") == 0) {
      NEED_VALUE();
      struct in_addr ignored;
      if (inet_pton(AF_INET, value, &ignored) != 1)
        die_usage("--prometheus-bind '%s' is not an IPv4 address (e.g. 127.0.0.1, or 0.0.0.0 for every interface)",
                  value);
      o->prom_bind = value;
    } else {
      die_usage("unknown option '%s'; the options are -np, -H, --hostfile, --timeout, --grace, --min-np, --max-np, "
                "--host-discovery-script, --max-restarts, --blacklist-cooldown, --elastic-timeout, "
                "--end-stopped, --prometheus-port, --prometheus-bind, --help, --version",
                a);
    }
#undef NEED_VALUE
  }
  if (o->elastic) {
    if (!o->min_np) o->min_np = 1;
    if (!o->max_np) o->max_np = TD_MAX(o->min_np, o->n_ranks);
    if (o->min_np > o->max_np) die_usage("--min-np %d exceeds --max-np %d", o->min_np, o->max_np);
    if (!o->n_ranks) o->n_ranks = o->max_np;
    if (o->n_ranks < o->min_np || o->n_ranks > o->max_np)
      die_usage("-np %d is outside --min-np %d .. --max-np %d", o->n_ranks, o->min_np, o->max_np);
    if (!o->elastic_timeout_s) o->elastic_timeout_s = 600;
    if (o->max_restarts < 0) o->max_restarts = 3;
  } else if (o->discovery || o->max_restarts >= 0 || o->cooldown_s || o->elastic_timeout_s || o->end_stopped) {
    die_usage("--host-discovery-script, --max-restarts, --blacklist-cooldown, --elastic-timeout and --end-stopped "
              "need elastic mode: add --min-np A --max-np B");
  }
  if (o->n_ranks == 0) die_usage("-np is missing: write tandemrun -np N PROGRAM [ARGS...]");
  if (o->prom_bind && !o->prom_port) die_usage("--prometheus-bind needs --prometheus-port");
  /* elastic: a port per process ever started, the replacements' too */
  long n_ports = o->n_ranks + (o->elastic ? o->max_restarts : 0);
  if (o->prom_port && (long)o->prom_port + n_ports > 65535)
    die_usage("--prometheus-port %d: the %s' ports %d..%ld pass 65535; choose a lower port", o->prom_port,
              o->elastic ? "processes (-np + --max-restarts)" : "ranks", o->prom_port + 1, o->prom_port + n_ports);
  if (i >= argc) die_usage("no program given: write tandemrun -np %d PROGRAM [ARGS...]", o->n_ranks);
  if (hosts_arg && hostfile) die_usage("give either -H or --hostfile, not both");
  if (hosts_arg) parse_host_list(o, hosts_arg);
  if (hostfile) parse_hostfile(o, hostfile);
  if (o->discovery && (hosts_arg || hostfile)) die_usage("give either -H/--hostfile or --host-discovery-script");
  if (o->n_hosts == 0 && !o->discovery) add_host(o, "localhost", o->n_ranks);
  long total = 0;
  for (int h = 0; h < o->n_hosts; h++) total += o->hosts[h].slots;
  if (total < o->n_ranks && !o->elastic)
    die_usage("-np %d needs %d slots but the hosts give %ld: add slots (HOST:SLOTS) or lower -np", o->n_ranks,
              o->n_ranks, total);
  o->argv = argv + i;
  bool any_local = o->discovery != NULL;
  for (int h = 0; h < o->n_hosts; h++) any_local |= o->hosts[h].local;
  char why[300];
  o->program_path = resolve_program(o->argv[0], why, sizeof why);
  if (!o->program_path) {
    if (any_local) die_usage("cannot run '%s': %s", o->argv[0], why);
    o->program_path = xstrdup(o->argv[0]); /* remote only: the remote PATH decides */
  }
}

/* ---- environment ---- */

static bool env_is_ours(const char *entry) {
  static const char *ours[] = {"TANDEM_RANK=", "TANDEM_WORLD_SIZE=", "TANDEM_LOCAL_RANK=", "TANDEM_LOCAL_SIZE=",
                               "TANDEM_STORE=", "TANDEM_JOB_ID=", "TANDEM_ELASTIC=",
                               "TANDEM_ELASTIC_ID=", "TANDEM_ELASTIC_JOIN=", "TANDEM_ELASTIC_MIN_NP=",
                               "TANDEM_ELASTIC_MAX_NP=", "TANDEM_ELASTIC_TIMEOUT="};
  for (size_t i = 0; i < TD_ARRAY_SIZE(ours); i++)
    if (strncmp(entry, ours[i], strlen(ours[i])) == 0) return true;
  return false;
}

/* Variables worth carrying to a remote host. */
static bool env_is_secret(const char *entry) { return strncmp(entry, "TANDEM_SECRET=", 14) == 0; }

static bool env_is_forwarded(const char *entry) {
  if (env_is_secret(entry)) return false; /* it goes on stdin */
  static const char *prefixes[] = {"TANDEM_", "OMP_", "OPENBLAS_", "ASAN_OPTIONS=", "UBSAN_OPTIONS=",
                                   "LSAN_OPTIONS=", "PATH=", "LD_LIBRARY_PATH=", "PYTHONPATH="};
  if (strncmp(entry, "TANDEM_SSH=", 11) == 0) return false;
  for (size_t i = 0; i < TD_ARRAY_SIZE(prefixes); i++)
    if (strncmp(entry, prefixes[i], strlen(prefixes[i])) == 0) return true;
  return false;
}

/* Single-quote for a POSIX shell. */
static char *shell_quote(const char *s) {
  size_t n = 2;
  for (const char *p = s; *p; p++) n += *p == '\'' ? 4 : 1;
  char *q = xmalloc(n + 1), *o = q;
  *o++ = '\'';
  for (const char *p = s; *p; p++) {
    if (*p == '\'') {
      memcpy(o, "'\\''", 4);
      o += 4;
    } else {
      *o++ = *p;
    }
  }
  *o++ = '\'';
  *o = '\0';
  return q;
}

typedef struct {
  char **items;
  size_t n, cap;
} str_list;

static void list_push(str_list *l, char *s) {
  if (l->n + 1 >= l->cap) {
    l->cap = l->cap ? l->cap * 2 : 32;
    l->items = realloc(l->items, l->cap * sizeof *l->items);
    if (!l->items) {
      fprintf(stderr, "tandemrun: out of memory\n");
      exit(1);
    }
  }
  l->items[l->n++] = s;
  l->items[l->n] = NULL;
}

static void list_free(str_list *l) {
  for (size_t i = 0; i < l->n; i++) free(l->items[i]);
  free(l->items);
}

/* ---- the job ---- */

typedef struct {
  options opt;
  worker *workers;
  int n_workers;
  int n_running;
  td_store_server *store;
  char store_addr[300];
  char job_id[64];
  int sigfd;
  /* failure handling */
  int root_rank;      /* first failed rank, -1 if none */
  int root_others;    /* ranks still running when it failed */
  int interrupt_sig;  /* signal that interrupted the job, 0 if none */
  bool timed_out;
  bool stopping;      /* SIGTERM (or the forwarded signal) sent */
  double grace_deadline, kill_deadline, job_deadline;
  bool killed;
  /* elastic mode */
  int cap_workers;
  int initial_world;   /* workers started together: they form epoch 1 */
  int extra_started;   /* workers started after those (--max-restarts) */
  int n_lost;          /* workers that failed while the job went on */
  host_spec **ehosts;  /* every host ever known (stable pointers) */
  int n_ehosts;
  td_store *client;    /* to report lost workers (el_report_dead) */
  td_prom *prom;       /* --prometheus-port: the job's endpoint */
  bool done;           /* a worker finished training (exited 0) */
  bool metrics_stale;  /* elastic: a process started or ended since the job endpoint's targets were set */
  bool below_failed;   /* stopped: below --min-np past --elastic-timeout */
  double below_since;  /* when the live count fell below --min-np (INFINITY: not below) */
  double next_discovery;
  double discovery_interval_s; /* TANDEM_DISCOVERY_INTERVAL, default 1 s */
  /* ssh connection sharing (below): one master connection per remote host */
  int share;               /* -1: not decided yet, 0: off, 1: on */
  char *share_dir;         /* private directory of the control sockets (NULL: not made yet) */
  struct ssh_master *masters;
  int n_masters;
  /* per-host agents (below) */
  int agents;       /* -1: not decided yet, 0: off, 1: on */
  char *agent_path; /* tandem-agent's path on every remote host */
  double probe_max_s; /* TANDEM_AGENT_PROBE: most seconds between background starts (0: none) */
  struct host_agent *agent_list;
  int n_agents;
  /* lossy hosts (elastic, with agents: lossy_tick) */
  el_lossy_cfg lossy_cfg;
  el_lossy *lossy;        /* NULL: not watching */
  double lossy_next_sample, lossy_next_ping;
  int32_t ping_seq;
  double ping_sent[64];   /* when ping seq was sent, at [seq % 64] */
  int64_t last_commits;   /* <job>/el/commits at the last sample (el_report_commit) */
  double last_progress;   /* when it last grew: the job made progress */
  double min_np_said;     /* when "not evicting: --min-np" was last said */
  int n_evictions;
} job;

/* Build "K=V" entries for one worker. */
static void worker_vars(const job *j, const worker *w, str_list *vars) {
  list_push(vars, xasprintf("TANDEM_RANK=%d", w->rank));
  list_push(vars, xasprintf("TANDEM_WORLD_SIZE=%d", j->opt.elastic ? j->initial_world : j->opt.n_ranks));
  if (j->opt.elastic) {
    /* The launch number is the process's age: ranks of later epochs are
     * ordered by it (tandem/elastic.h). */
    list_push(vars, xasprintf("TANDEM_ELASTIC=1"));
    list_push(vars, xasprintf("TANDEM_ELASTIC_ID=%d", w->rank));
    list_push(vars, xasprintf("TANDEM_ELASTIC_JOIN=%d", w->joiner ? 1 : 0));
    list_push(vars, xasprintf("TANDEM_ELASTIC_MIN_NP=%d", j->opt.min_np));
    list_push(vars, xasprintf("TANDEM_ELASTIC_MAX_NP=%d", j->opt.max_np));
    list_push(vars, xasprintf("TANDEM_ELASTIC_TIMEOUT=%g", j->opt.elastic_timeout_s));
  }
  list_push(vars, xasprintf("TANDEM_LOCAL_RANK=%d", w->local_rank));
  list_push(vars, xasprintf("TANDEM_LOCAL_SIZE=%d", w->local_size));
  list_push(vars, xasprintf("TANDEM_STORE=%s", j->store_addr));
  list_push(vars, xasprintf("TANDEM_JOB_ID=%s", j->job_id));
  if (j->opt.prom_port) list_push(vars, xasprintf("TANDEM_PROMETHEUS_PORT=%d", j->opt.prom_port + 1));
}

/* Entries of our environment that worker_vars replaces. */
static bool env_is_replaced(const job *j, const char *entry) {
  return env_is_ours(entry) || (j->opt.prom_port && strncmp(entry, "TANDEM_PROMETHEUS_PORT=", 23) == 0);
}

/* What a remote worker gets set on top of its host's environment: our
 * forwarded variables and its own (never the secret: see the file header). */
static void remote_vars(const job *j, const worker *w, str_list *out) {
  for (char **e = environ; *e; e++)
    if (env_is_forwarded(*e) && !env_is_replaced(j, *e)) list_push(out, xstrdup(*e));
  worker_vars(j, w, out);
}

/* ---- ssh connection sharing ----
 * Every ssh start of a rank used to make a connection of its own: TCP, key
 * exchange, authentication, sshd forking and re-executing itself, and only
 * then the user's shell. On the loaded test machine that was 1.0-1.5 s per
 * start: 0.4-0.6 s the connection, the rest the user's shell start-up
 * (bench/results/ssh-start-2026-11-27.md); a host that returned to an
 * elastic job paid the connection once per process, all at once. tandemrun now
 * opens one OpenSSH master connection per remote host (ssh -M -N, a child of
 * tandemrun in its own process group, dying with it) before it starts the
 * host's first rank, and starts every rank there as a session of that
 * connection (ControlPath in a private 0700 directory; the sessions need no
 * key exchange or authentication). A session whose master is gone, or that
 * finds no socket, makes its own connection (OpenSSH falls back by itself),
 * so sharing never stops a start that would have worked without it. The
 * lifeline (file header) works the same: the master forwards EOF on a
 * session's stdin, and closes a session whose ssh was killed.
 * TANDEM_SSH_SHARE=0 turns this off; it is also off when TANDEM_SSH is not
 * OpenSSH's ssh (another program would not know -M or ControlPath). */
#define SHARE_WAIT_S 5.0       /* at most this long for a new master before starting the ranks without it */
#define SHARE_MAX_SESSIONS 10  /* sshd's default MaxSessions; more ranks on a host connect on their own */

typedef struct ssh_master {
  char *host;
  char *path;     /* its control socket */
  pid_t pid;      /* 0: none running */
  double started; /* td_now() at its start */
} ssh_master;

/* TANDEM_SSH split into words (default "ssh -o BatchMode=yes"). */
static void ssh_words(str_list *args) {
  char *ssh = xstrdup(td_env_str("TANDEM_SSH", "ssh -o BatchMode=yes"));
  char *save = NULL;
  for (char *t = strtok_r(ssh, " \t", &save); t; t = strtok_r(NULL, " \t", &save)) list_push(args, xstrdup(t));
  free(ssh);
  if (args->n == 0) list_push(args, xstrdup("ssh"));
}

static bool share_on(job *j) {
  if (j->share < 0) {
    str_list words = {0};
    ssh_words(&words);
    const char *base = strrchr(words.items[0], '/');
    base = base ? base + 1 : words.items[0];
    j->share = td_env_long("TANDEM_SSH_SHARE", 1) != 0 && strcmp(base, "ssh") == 0;
    list_free(&words);
    if (j->share) {
      char tmpl[] = "/tmp/tandemrun-ssh-XXXXXX"; /* short: a socket path has at most 107 bytes */
      if (mkdtemp(tmpl)) { /* 0700: only this user reaches the sockets */
        j->share_dir = xstrdup(tmpl);
      } else {
        fprintf(stderr, "tandemrun: cannot create a directory for shared ssh connections (%s): every rank "
                        "connects on its own\n", strerror(errno));
        j->share = 0;
      }
    }
  }
  return j->share == 1;
}

/* The start of every child tandemrun forks (a rank, an ssh master), before
 * its exec: async-signal-safe calls only. A process group of its own; it
 * dies with tandemrun, even a SIGKILLed one (and exits at once if tandemrun
 * is already gone); the signal state tandemrun started with: our own
 * SIGPIPE ignore undone, nothing blocked; what the user ignored (nohup's
 * SIGHUP) stays ignored. */
static void child_begin(pid_t parent) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);
  sigset_t none;
  sigemptyset(&none);
  sigaction(SIGPIPE, &original_sigpipe, NULL);
  sigprocmask(SIG_SETMASK, &none, NULL);
}

static ssh_master *master_of(job *j, const char *host) {
  for (int i = 0; i < j->n_masters; i++)
    if (!strcmp(j->masters[i].host, host)) return &j->masters[i];
  j->masters = realloc(j->masters, sizeof *j->masters * (size_t)(j->n_masters + 1));
  if (!j->masters) exit(1);
  ssh_master *m = &j->masters[j->n_masters];
  m->host = xstrdup(host);
  m->path = xasprintf("%s/%d", j->share_dir, j->n_masters);
  m->pid = 0;
  m->started = 0;
  j->n_masters++;
  return m;
}

static bool master_ready(const ssh_master *m) {
  struct stat st;
  return m->pid > 0 && stat(m->path, &st) == 0; /* ssh links the socket in once authenticated */
}

/* reap(): a master that ended (its host died, or the connection broke). */
static bool master_reaped(job *j, pid_t pid) {
  for (int i = 0; i < j->n_masters; i++)
    if (j->masters[i].pid == pid) {
      j->masters[i].pid = 0;
      return true;
    }
  return false;
}

/* Start host's master connection if none runs. */
static void master_start(job *j, const char *host) {
  if (!share_on(j)) return;
  ssh_master *m = master_of(j, host);
  if (m->pid > 0) return;
  unlink(m->path); /* a killed master's stale socket would keep the new one from listening */
  str_list args = {0};
  ssh_words(&args);
  list_push(&args, xstrdup("-M"));
  list_push(&args, xstrdup("-N"));
  list_push(&args, xstrdup("-o"));
  list_push(&args, xstrdup("ControlPersist=no"));
  list_push(&args, xstrdup("-o"));
  list_push(&args, xasprintf("ControlPath=%s", m->path));
  list_push(&args, xstrdup(host));
  int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) { /* async-signal-safe only until exec (start_worker says why) */
    child_begin(parent);
    if (devnull >= 0) dup2(devnull, 0), dup2(devnull, 1), dup2(devnull, 2);
    execvp(args.items[0], args.items);
    _exit(127);
  }
  if (devnull >= 0) close(devnull);
  list_free(&args);
  if (pid > 0) {
    setpgid(pid, pid);
    m->pid = pid;
    m->started = td_now();
  }
}

/* The control socket to start a rank on host through, or NULL (connect on
 * its own). Waits for a master started less than SHARE_WAIT_S ago: a
 * session then costs no second connection. */
static const char *master_for_rank(job *j, const char *host) {
  if (!share_on(j)) return NULL;
  master_start(j, host);
  ssh_master *m = master_of(j, host);
  int sessions = 0;
  for (int i = 0; i < j->n_workers; i++)
    sessions += j->workers[i].running && j->workers[i].shared && !strcmp(j->workers[i].host->name, host);
  if (sessions >= SHARE_MAX_SESSIONS) return NULL;
  while (m->pid > 0 && !master_ready(m) && td_now() < m->started + SHARE_WAIT_S) {
    int status;
    if (waitpid(m->pid, &status, WNOHANG) == m->pid) { /* it failed: the rank connects on its own */
      m->pid = 0;
      break;
    }
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  return master_ready(m) ? m->path : NULL;
}

/* At the end of the job: the masters closed, their directory removed. */
static void masters_stop(job *j) {
  for (int i = 0; i < j->n_masters; i++) {
    ssh_master *m = &j->masters[i];
    if (m->pid > 0) {
      kill(m->pid, SIGTERM);
      double until = td_now() + KILL_AFTER_TERM_S;
      while (waitpid(m->pid, NULL, WNOHANG) == 0 && td_now() < until) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
      }
      if (kill(m->pid, SIGKILL) == 0) waitpid(m->pid, NULL, 0);
    }
    unlink(m->path);
    free(m->host);
    free(m->path);
  }
  free(j->masters);
  j->masters = NULL;
  j->n_masters = 0;
  if (j->share_dir) rmdir(j->share_dir);
  free(j->share_dir);
  j->share_dir = NULL;
}

/* Start one worker by fork/exec here or its own ssh; on failure to start,
 * print why and return false. The child does only async-signal-safe work
 * between fork and exec: tandemrun has a store thread, so the child must
 * not touch locks such as malloc's. */
static bool start_worker_here_or_ssh(job *j, worker *w) {
  str_list vars = {0}, env = {0}, args = {0};
  bool send_secret = false;
  worker_vars(j, w, &vars);
  const char *exec_path;
  if (w->host->local) {
    for (char **e = environ; *e; e++)
      if (!env_is_replaced(j, *e)) list_push(&env, xstrdup(*e));
    for (size_t i = 0; i < vars.n; i++) list_push(&env, xstrdup(vars.items[i]));
    for (char **a = j->opt.argv; *a; a++) list_push(&args, xstrdup(*a));
    exec_path = j->opt.program_path;
  } else {
    /* ssh HOST 'cd CWD && ... env VARS PROGRAM ARGS ...' (remote_command);
     * the secret is read from stdin first. ssh itself does not need it. */
    for (char **e = environ; *e; e++)
      if (!env_is_secret(*e)) list_push(&env, xstrdup(*e));
    ssh_words(&args);
    const char *control = master_for_rank(j, w->host->name);
    w->shared = control != NULL;
    if (control) {
      list_push(&args, xstrdup("-o"));
      list_push(&args, xstrdup("ControlMaster=no"));
      list_push(&args, xstrdup("-o"));
      list_push(&args, xasprintf("ControlPath=%s", control));
    }
    list_push(&args, xstrdup(w->host->name));
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd)) strcpy(cwd, ".");
    char *q = shell_quote(cwd);
    send_secret = getenv("TANDEM_SECRET") != NULL;
    char *cmd = xasprintf(send_secret ? "cd %s && IFS= read -r TANDEM_SECRET && export TANDEM_SECRET && { env"
                                      : "cd %s && { env",
                          q);
    free(q);
    str_list set = {0};
    remote_vars(j, w, &set);
    for (size_t i = 0; i < set.n; i++) {
      q = shell_quote(set.items[i]);
      char *next = xasprintf("%s %s", cmd, q);
      free(cmd);
      free(q);
      cmd = next;
    }
    list_free(&set);
    for (char **a = j->opt.argv; *a; a++) {
      q = shell_quote(a == j->opt.argv ? j->opt.argv[0] : *a);
      char *next = xasprintf("%s %s", cmd, q);
      free(cmd);
      free(q);
      cmd = next;
    }
    /* The program in the background; a watcher on stdin (the lifeline, see
     * the file header) stops it at EOF; the shell exits with its status.
     * POSIX gives an asynchronous list /dev/null as stdin unless redirected:
     * hence fd 3. */
    char *next = xasprintf("%s </dev/null 3<&- & p=$!; { while read -r _; do :; done; kill -TERM $p; sleep %g; "
                           "kill -KILL $p; } <&3 >/dev/null 2>&1 & w=$!; exec 3<&-; wait $p; s=$?; "
                           "kill $w 2>/dev/null; exit $s; } 3<&0",
                           cmd, KILL_AFTER_TERM_S);
    free(cmd);
    list_push(&args, next);
    exec_path = NULL; /* execvpe on args[0] */
  }

  int out_pipe[2], err_pipe[2], exec_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0 || pipe2(exec_pipe, O_CLOEXEC) != 0) {
    fprintf(stderr, "tandemrun: cannot create pipes for rank %d: %s\n", w->rank, strerror(errno));
    list_free(&vars);
    list_free(&env);
    list_free(&args);
    return false;
  }
  int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
  int secret_pipe[2] = {-1, -1}; /* remote: the secret line, then the lifeline */
  if (!w->host->local && pipe2(secret_pipe, O_CLOEXEC) != 0) {
    fprintf(stderr, "tandemrun: cannot create a pipe for rank %d: %s\n", w->rank, strerror(errno));
    close(out_pipe[0]), close(out_pipe[1]), close(err_pipe[0]), close(err_pipe[1]);
    close(exec_pipe[0]), close(exec_pipe[1]);
    if (devnull >= 0) close(devnull);
    list_free(&vars);
    list_free(&env);
    list_free(&args);
    return false;
  }
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    child_begin(parent);
    if (secret_pipe[0] >= 0)
      dup2(secret_pipe[0], 0);
    else if (devnull >= 0)
      dup2(devnull, 0);
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    if (exec_path)
      execve(exec_path, args.items, env.items);
    else
      execvpe(args.items[0], args.items, env.items);
    int e = errno;
    ssize_t wr = write(exec_pipe[1], &e, sizeof e);
    (void)wr;
    _exit(127);
  }
  int fork_errno = errno;
  if (devnull >= 0) close(devnull);
  if (secret_pipe[0] >= 0) {
    close(secret_pipe[0]);
    if (pid > 0 && send_secret) {
      /* One short line into an empty pipe: it never blocks. ssh forwards
       * it to the remote shell's read. */
      const char *secret = getenv("TANDEM_SECRET");
      size_t len = strlen(secret);
      ssize_t wr;
      TD_SYSCALL_RETRY(wr, write(secret_pipe[1], secret, len));
      if (wr == (ssize_t)len) TD_SYSCALL_RETRY(wr, write(secret_pipe[1], "\n", 1));
      if (wr < 0) fprintf(stderr, "tandemrun: cannot pass the job secret to rank %d: %s\n", w->rank, strerror(errno));
    }
    /* Held open while the worker runs: the lifeline (file header). */
    if (pid > 0)
      w->lifeline_fd = secret_pipe[1];
    else
      close(secret_pipe[1]);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  close(exec_pipe[1]);
  const char *what = exec_path ? exec_path : args.items[0];
  char *what_copy = xstrdup(what);
  list_free(&vars);
  list_free(&env);
  list_free(&args);
  if (pid < 0) {
    fprintf(stderr, "tandemrun: cannot start rank %d: fork failed: %s\n", w->rank, strerror(fork_errno));
    close(out_pipe[0]);
    close(err_pipe[0]);
    close(exec_pipe[0]);
    free(what_copy);
    return false;
  }
  setpgid(pid, pid); /* also done in the child: whichever runs first wins the race */
  w->pid = pid;
  w->started = td_now();
  w->running = true;
  j->n_running++;
  j->metrics_stale = true;
  w->out_fd = out_pipe[0];
  w->err_fd = err_pipe[0];
  /* EOF means exec succeeded (close-on-exec); an int means it failed. */
  int exec_errno = 0;
  ssize_t n;
  TD_SYSCALL_RETRY(n, read(exec_pipe[0], &exec_errno, sizeof exec_errno));
  close(exec_pipe[0]);
  if (n == (ssize_t)sizeof exec_errno) {
    fprintf(stderr, "tandemrun: rank %d (host %s) could not execute '%s': %s\n", w->rank, w->host->name, what_copy,
            strerror(exec_errno));
  }
  free(what_copy);
  return true;
}

static void worker_signal(job *j, worker *w, int sig);

static void kill_all(job *j, int sig) {
  for (int i = 0; i < j->n_workers; i++) {
    worker *w = &j->workers[i];
    if (!w->running) continue;
    w->signalled = true;
    worker_signal(j, w, sig);
  }
}

static void begin_stop(job *j, int sig) {
  kill_all(j, sig);
  if (!j->stopping) {
    j->stopping = true;
    j->kill_deadline = td_now() + KILL_AFTER_TERM_S;
  }
}

/* Emit complete lines from buf to fd, each prefixed; keep the rest. */
static void emit_lines(int rank, line_buf *b, int fd, bool flush_all) {
  if (b->len == 0) return;
  char prefix[24];
  int plen = snprintf(prefix, sizeof prefix, "[%d] ", rank);
  size_t start = 0;
  /* Gather into one write so that lines from other ranks cannot interleave. */
  size_t out_cap = b->len + 64 * ((b->len / 16) + 2), out_len = 0;
  char *out = xmalloc(out_cap);
  for (;;) {
    char *nl = memchr(b->data + start, '\n', b->len - start);
    size_t line_len;
    bool add_newline = false;
    if (nl) {
      line_len = (size_t)(nl - (b->data + start)) + 1;
    } else if (b->len - start > 0 && (flush_all || b->len - start >= LINE_MAX_BYTES)) {
      line_len = b->len - start;
      add_newline = true;
    } else {
      break;
    }
    if (out_len + (size_t)plen + line_len + 1 > out_cap) {
      out_cap = (out_len + (size_t)plen + line_len + 1) * 2;
      out = realloc(out, out_cap);
      if (!out) exit(1);
    }
    memcpy(out + out_len, prefix, (size_t)plen);
    out_len += (size_t)plen;
    memcpy(out + out_len, b->data + start, line_len);
    out_len += line_len;
    if (add_newline) out[out_len++] = '\n';
    start += line_len;
  }
  write_all_fd(fd, out, out_len);
  free(out);
  memmove(b->data, b->data + start, b->len - start);
  b->len -= start;
}

/* Read what is available from one pipe. Returns false at EOF. */
static bool pump(int rank, int *fdp, line_buf *b, int out_fd) {
  if (b->cap - b->len < 65536) {
    b->cap = b->cap ? b->cap * 2 : 131072;
    b->data = realloc(b->data, b->cap);
    if (!b->data) exit(1);
  }
  ssize_t n;
  TD_SYSCALL_RETRY(n, read(*fdp, b->data + b->len, b->cap - b->len));
  if (n > 0) {
    b->len += (size_t)n;
    emit_lines(rank, b, out_fd, false);
    return true;
  }
  if (n < 0 && errno == EAGAIN) return true;
  emit_lines(rank, b, out_fd, true);
  close(*fdp);
  *fdp = -1;
  return false;
}

/* A remote worker's status is its shell's, through ssh: a death by signal
 * N arrives as code 128 + N (file header), named here. */
/* The signal that ended worker w, or 0: a remote worker's ssh passes a
 * death by signal N on as exit code 128 + N. */
static int worker_end_signal(const worker *w) {
  int status = w->wait_status, code = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
  if (WIFSIGNALED(status)) return WTERMSIG(status);
  return !w->host->local && code > 128 && code < 128 + 65 ? code - 128 : 0;
}

static void describe_status(const worker *w, char *buf, size_t size) {
  char name[32];
  int status = w->wait_status, code = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
  if (w->stop_sig)
    snprintf(buf, size, "was stopped by signal %d (%s), so tandemrun ended it", w->stop_sig,
             signal_name(w->stop_sig, name, sizeof name));
  else if (WIFSIGNALED(status))
    snprintf(buf, size, "was killed by signal %d (%s)", WTERMSIG(status), signal_name(WTERMSIG(status), name,
                                                                                         sizeof name));
  else if (worker_end_signal(w))
    snprintf(buf, size, "exited with code %d: killed by signal %d (%s) on its host", code, code - 128,
             signal_name(code - 128, name, sizeof name));
  else
    snprintf(buf, size, "exited with code %d", code);
}

static void elastic_reaped(job *j, worker *w, bool failed);
static void elastic_tick(job *j);

/* Worker w stopped (SIGSTOP, SIGTSTP, ...): its kernel still acknowledges
 * TCP, so its peers would learn it only when its heartbeats are missed (a
 * timeout, and a false alarm's risk if that timeout is short). Its parent
 * knows at once (WUNTRACED). With --end-stopped (elastic) a stopped member
 * is a lost one: ended now, so that its reaping reports it to the survivors
 * (el_report_dead) and starts its replacement without the heartbeat wait.
 * Otherwise the stop is only said: a debugger's or a user's stop may be
 * resumed in time, and the heartbeats decide. A worker that tandemrun
 * itself signalled is left to that signal. Local workers only: a remote
 * one's parent is ssh, which does not stop with it. */
static void worker_stopped(job *j, worker *w, int sig) {
  char name[32];
  if (w->signalled || j->stopping || j->done) return;
  if (!j->opt.end_stopped) {
    fprintf(stderr, "tandemrun: %s %d (pid %d, host %s) was stopped by signal %d (%s); its peers fail when its "
            "heartbeats are missed unless it is resumed (SIGCONT) in time\n", j->opt.elastic ? "process" : "rank",
            w->rank, (int)w->pid, w->host->name, sig, signal_name(sig, name, sizeof name));
    return;
  }
  w->stop_sig = sig;
  if (kill(-w->pid, SIGKILL) != 0) kill(w->pid, SIGKILL);
}

/* Worker w ended with wait status `status` (reaped here, or reported by
 * its host's agent). */
static void worker_ended(job *j, worker *w, int status) {
  w->running = false;
  w->agent_pending = false;
  w->wait_status = status;
  if (w->lifeline_fd >= 0) close(w->lifeline_fd);
  w->lifeline_fd = -1;
  j->n_running--;
  j->metrics_stale = true;
  bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  if (j->opt.elastic) {
    elastic_reaped(j, w, failed); /* may move j->workers */
    return;
  }
  /* The first failure that we did not cause ourselves is the root cause. */
  if (failed && j->root_rank < 0 && !w->signalled && !j->timed_out && !j->interrupt_sig) {
    j->root_rank = w->rank;
    j->root_others = j->n_running;
    if (j->n_running > 0) j->grace_deadline = td_now() + j->opt.grace_s;
  }
}

static bool agent_reaped(job *j, pid_t pid, int status);

static void reap(job *j) {
  for (;;) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG | WUNTRACED);
    if (pid <= 0) return;
    if (!WIFSTOPPED(status) && (master_reaped(j, pid) || agent_reaped(j, pid, status))) continue;
    for (int i = 0; i < j->n_workers; i++) {
      worker *w = &j->workers[i];
      if (w->pid != pid || !w->running || w->agent) continue; /* an agent's rank's pid is its host's */
      if (WIFSTOPPED(status))
        worker_stopped(j, w, WSTOPSIG(status));
      else
        worker_ended(j, w, status);
      break;
    }
  }
}

/* ---- per-host agents ----
 * Even on a shared connection, each ssh start of a rank runs the user's
 * login shell (root's .bashrc runs `pyenv init` on the test machine: about
 * 1 s at load) before the program's exec. tandemrun therefore starts one
 * tandem-agent per remote host (tools/tandem-agent.c, like torchrun's
 * per-host agent or Open MPI's orted) over ssh, once, when it first places
 * a rank there or the host returns after it was lost, and has it fork and
 * exec every rank placed there (agent_protocol.h): a start there then costs
 * a fork and an exec, as on this host. The session is ssh's own (no master
 * connection); the secret goes on its stdin, and the agent puts it only in
 * the ranks' environment. The agent reports each rank's output and exit
 * status; a death by signal N is passed on as code 128 + N, as the shell
 * did. The agent's end is its host's: every rank it ran is lost (code
 * 255, as ssh's), and the elastic logic replaces them as for any lost host.
 * It stops its ranks when its stdin closes (tandemrun ended or was killed:
 * the ssh child dies with it), and its ranks die with it.
 *
 * Ranks queue on an agent until it says hello. If it cannot start (ssh
 * fails, or no hello within AGENT_WAIT_S), those ranks start over ssh each
 * as before (connection sharing above), and the next rank placed there
 * tries an agent again; if the remote shell finds no tandem-agent (127),
 * the host's ranks always go over ssh. TANDEM_AGENT=0 turns agents off;
 * TANDEM_AGENT=PATH names the program on the remote hosts (default: the
 * tandem-agent beside this tandemrun, at the same path there).
 *
 * Elastic jobs start an agent again, in the background, on a host where
 * one ended (the host was lost): after AGENT_PROBE_S, then doubling up to
 * AGENT_PROBE_MAX_S while the host does not answer, whether or not the
 * discovery script lists the host now. A host that comes back so has its
 * agent (ssh's connection, the login shell) ready before the job grows onto
 * it, and the grow pays a fork and the rank's own start instead of an ssh
 * start (1.9-7.0 s at load 20-30, 81% of a grow: grow p95 7.69 -> 2.37 s,
 * bench/results/grow-breakdown-2026-11-28.md). A host the last discovery
 * does not list gets background starts only until one fails at the longest
 * interval (tries at 0.25, 0.75, 1.75, 3.75 and 7.75 s by default): a host
 * being restarted answers within that, while one dropped for good would
 * otherwise get an ssh start every AGENT_PROBE_MAX_S for the rest of the
 * job. When the discovery lists it again, the background starts begin
 * again (and a rank placed there starts its agent anyway).
 * A probe that fails is quiet (TANDEM_LOG=info says so). TANDEM_AGENT_PROBE
 * sets AGENT_PROBE_MAX_S; 0 turns background starts off. */
#define AGENT_WAIT_S 15.0
#define AGENT_PROBE_S 0.25
#define AGENT_PROBE_MAX_S 8.0

typedef struct host_agent {
  char *host;
  pid_t pid;        /* its ssh (0: none running) */
  int to_fd;        /* its stdin (-1: closed) */
  int from_fd;      /* its stdout (-1: closed) */
  bool ready;       /* it said hello */
  bool missing;     /* the remote shell found no tandem-agent: ranks there go over ssh */
  double started;   /* td_now() at its start */
  double probe_at;  /* elastic: start it again in the background at this time (0: not planned) */
  int probe_fails;  /* background starts in a row that got no hello */
  bool probe_dropped; /* background starts given up: the discovery script does not list the host */
  double echoed_sent; /* when the newest ping it answered was sent (0: none yet) */
  agent_inbuf in;
} host_agent;

static bool start_worker_here_or_ssh(job *j, worker *w);

static bool agents_on(job *j) {
  if (j->agents < 0) {
    const char *setting = td_env_str("TANDEM_AGENT", NULL);
    j->agents = !(setting && !strcmp(setting, "0"));
    j->probe_max_s = td_env_double("TANDEM_AGENT_PROBE", AGENT_PROBE_MAX_S);
    if (!(j->probe_max_s >= 0)) {
      fprintf(stderr, "tandemrun: TANDEM_AGENT_PROBE must be 0 (no background agent starts) or the most seconds "
                      "between them; using %g\n", AGENT_PROBE_MAX_S);
      j->probe_max_s = AGENT_PROBE_MAX_S;
    }
    if (j->agents && setting && *setting) {
      j->agent_path = xstrdup(setting);
    } else if (j->agents) {
      char self[PATH_MAX];
      ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
      char *slash = n > 0 ? (self[n] = '\0', strrchr(self, '/')) : NULL;
      if (slash) {
        *slash = '\0';
        j->agent_path = xasprintf("%s/tandem-agent", self);
      } else {
        fprintf(stderr, "tandemrun: cannot find its own path (%s), so not tandem-agent's: each remote rank starts "
                        "over ssh (set TANDEM_AGENT=PATH)\n", strerror(errno));
        j->agents = 0;
      }
    }
  }
  return j->agents == 1;
}

static int agent_index(job *j, const char *host) {
  for (int i = 0; i < j->n_agents; i++)
    if (!strcmp(j->agent_list[i].host, host)) return i;
  j->agent_list = realloc(j->agent_list, sizeof *j->agent_list * (size_t)(j->n_agents + 1));
  if (!j->agent_list) exit(1);
  j->agent_list[j->n_agents] = (host_agent){.host = xstrdup(host), .to_fd = -1, .from_fd = -1};
  return j->n_agents++;
}

/* Start host's agent unless one runs (or none can). */
static void agent_start(job *j, const char *host) {
  if (!agents_on(j)) return;
  int ai = agent_index(j, host); /* before taking the list: it may grow */
  host_agent *a = &j->agent_list[ai];
  if (a->missing || a->pid > 0 || a->from_fd >= 0) return;
  int to[2], from[2];
  if (pipe2(to, O_CLOEXEC) != 0) return;
  if (pipe2(from, O_CLOEXEC) != 0) {
    close(to[0]), close(to[1]);
    return;
  }
  str_list args = {0}, env = {0};
  for (char **e = environ; *e; e++) /* the secret goes on stdin; ssh itself does not need it */
    if (!env_is_secret(*e)) list_push(&env, xstrdup(*e));
  ssh_words(&args);
  list_push(&args, xstrdup(host));
  char *q = shell_quote(j->agent_path);
  list_push(&args, xasprintf("exec %s", q));
  free(q);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) { /* async-signal-safe only until exec (start_worker_here_or_ssh says why) */
    child_begin(parent);
    dup2(to[0], 0);
    dup2(from[1], 1);
    execvpe(args.items[0], args.items, env.items);
    _exit(127);
  }
  list_free(&args);
  list_free(&env);
  close(to[0]);
  close(from[1]);
  if (pid < 0) {
    close(to[1]), close(from[0]);
    return;
  }
  setpgid(pid, pid);
  fcntl(from[0], F_SETFL, O_NONBLOCK);
  /* A write to an agent whose ssh takes nothing for AGENT_WRITE_WAIT_MS
   * fails (the agent is then lost) instead of stopping tandemrun's loop. */
  fcntl(to[1], F_SETFL, O_NONBLOCK);
  a->pid = pid;
  a->to_fd = to[1];
  a->from_fd = from[0];
  a->ready = false;
  a->started = td_now();
  a->in.len = 0;
  const char *secret = getenv("TANDEM_SECRET");
  if (secret && !agent_send(a->to_fd, AGENT_SECRET, 0, 0, secret, strlen(secret)))
    fprintf(stderr, "tandemrun: cannot pass the job secret to the agent on host %s: %s\n", host, strerror(errno));
}

/* START for a queued worker (index wi); false if the agent is gone. */
static bool agent_send_start(job *j, int wi) {
  worker *w = &j->workers[wi];
  host_agent *a = &j->agent_list[w->agent - 1];
  str_list set = {0};
  remote_vars(j, w, &set);
  char cwd[PATH_MAX];
  if (!getcwd(cwd, sizeof cwd)) strcpy(cwd, ".");
  size_t len = strlen(cwd) + 1;
  for (size_t i = 0; i < set.n; i++) len += strlen(set.items[i]) + 1;
  for (char **arg = j->opt.argv; *arg; arg++) len += strlen(*arg) + 1;
  char *body = xmalloc(len), *o = body;
  o = stpcpy(o, cwd) + 1;
  for (size_t i = 0; i < set.n; i++) o = stpcpy(o, set.items[i]) + 1;
  for (char **arg = j->opt.argv; *arg; arg++) o = stpcpy(o, *arg) + 1;
  bool ok = len <= AGENT_FRAME_MAX - 64 && agent_send(a->to_fd, AGENT_START, w->rank, (int32_t)set.n, body, len);
  free(body);
  list_free(&set);
  w->agent_pending = false;
  return ok;
}

/* Queued worker wi cannot go through its agent: start it over ssh. */
static void agent_fall_back(job *j, int wi) {
  worker *w = &j->workers[wi];
  w->running = false;
  w->agent_pending = false;
  w->agent = 0;
  j->n_running--;
  if (w->signalled) { /* stopped before it ever started */
    j->n_running++;
    w->running = true;
    worker_ended(j, w, W_EXITCODE(128 + SIGTERM, 0));
    return;
  }
  if (!start_worker_here_or_ssh(j, w)) {
    j->n_running++;
    w->running = true;
    worker_ended(j, w, W_EXITCODE(127, 0));
  }
}

/* An agent's ssh ended with `status`: a remote shell that found no
 * tandem-agent (127 before any hello) means none is installed there. */
static void agent_ended(job *j, host_agent *a, int status) {
  a->pid = 0;
  if (!a->ready && WIFEXITED(status) && WEXITSTATUS(status) == 127) {
    a->missing = true;
    fprintf(stderr, "tandemrun: host %s has no %s (the remote shell exited 127): its ranks start over ssh each; "
                    "install Tandem at the same path there, or set TANDEM_AGENT\n", a->host, j->agent_path);
  }
}

/* Elastic: whether the last discovery (or -H) gives host any slots. */
static bool host_listed(const job *j, const char *host) {
  for (int h = 0; h < j->n_ehosts; h++)
    if (!strcmp(j->ehosts[h]->name, host)) return j->ehosts[h]->slots > 0;
  return false;
}

/* Agent ai is gone (EOF, an error, a garbled message, or no hello in
 * time): its queued ranks start over ssh, its started ones are lost. */
static void agent_lost(job *j, int ai, const char *why) {
  host_agent *a = &j->agent_list[ai];
  bool was_ready = a->ready;
  if (a->to_fd >= 0) close(a->to_fd);
  if (a->from_fd >= 0) close(a->from_fd);
  a->to_fd = a->from_fd = -1;
  if (a->pid > 0) { /* reaped now, so that a replacement placed there can start a new agent at once */
    int status;
    kill(-a->pid, SIGKILL);
    if (waitpid(a->pid, &status, 0) == a->pid) agent_ended(j, a, status);
  }
  a->ready = false;
  if (j->opt.elastic && !j->stopping && !j->done && !a->missing && j->probe_max_s > 0) { /* the next background start */
    a->probe_fails = was_ready ? 0 : a->probe_fails + 1;
    double wait = TD_MIN(AGENT_PROBE_S * ldexp(1.0, TD_MIN(a->probe_fails, 10)), j->probe_max_s);
    a->probe_dropped = !was_ready && wait >= j->probe_max_s && !host_listed(j, a->host);
    a->probe_at = a->probe_dropped ? 0 : td_now() + wait;
    if (a->probe_dropped)
      TD_INFO("no more background agent starts on host %s: it did not answer %d tries and the discovery script does "
              "not list it", a->host, a->probe_fails);
  }
  int n_lost = 0, n_queued = 0;
  for (int i = 0; i < j->n_workers; i++) {
    n_lost += j->workers[i].running && j->workers[i].agent == ai + 1 && !j->workers[i].agent_pending;
    n_queued += j->workers[i].running && j->workers[i].agent == ai + 1 && j->workers[i].agent_pending;
  }
  char host[256];
  snprintf(host, sizeof host, "%s", a->host); /* a may move: the ranks' ends can start a new agent */
  if (was_ready && !j->stopping && !j->done)
    fprintf(stderr, "tandemrun: the agent on host %s ended (%s): %d rank%s there %s lost\n", host, why, n_lost,
            n_lost == 1 ? "" : "s", n_lost == 1 ? "is" : "are");
  else if (!was_ready && !j->stopping && n_queued > 0)
    fprintf(stderr, "tandemrun: no agent started on host %s (%s): its ranks start over ssh each\n", host, why);
  else if (!was_ready)
    TD_INFO("no agent started on host %s (%s); trying again in %.2f s", host, why,
            j->agent_list[ai].probe_at > 0 ? j->agent_list[ai].probe_at - td_now() : 0.0);
  for (int i = 0; i < j->n_workers; i++) {
    worker *w = &j->workers[i];
    if (!w->running || w->agent != ai + 1) continue;
    if (w->agent_pending) {
      agent_fall_back(j, i);
    } else {
      emit_lines(w->rank, &w->out_buf, 1, true);
      emit_lines(w->rank, &w->err_buf, 2, true);
      worker_ended(j, w, W_EXITCODE(255, 0));
    }
  }
}

/* reap(): an agent's ssh ended. */
static bool agent_reaped(job *j, pid_t pid, int status) {
  for (int i = 0; i < j->n_agents; i++) {
    host_agent *a = &j->agent_list[i];
    if (a->pid != pid) continue;
    agent_ended(j, a, status);
    if (a->from_fd >= 0) agent_lost(j, i, "its ssh exited");
    return true;
  }
  return false;
}

/* What agent ai sent: hello, starts, output, exits. */
static void agent_read(job *j, int ai) {
  host_agent *a = &j->agent_list[ai];
  ssize_t got = agent_fill(a->from_fd, &a->in);
  if (got < 0 && errno == EAGAIN) return;
  if (got <= 0) {
    agent_lost(j, ai, got == 0 ? "its connection closed" : strerror(errno));
    return;
  }
  size_t off = 0;
  int type, rc;
  int32_t x, y;
  const char *body;
  size_t len;
  while ((rc = agent_next(&j->agent_list[ai].in, &off, &type, &x, &y, &body, &len)) == 1) {
    a = &j->agent_list[ai];
    if (type == AGENT_HELLO) {
      if (x != AGENT_VERSION) {
        agent_consumed(&a->in, off);
        agent_lost(j, ai, "it speaks another version: install the same Tandem on every host");
        return;
      }
      a->ready = true;
      a->probe_fails = 0;
      TD_INFO("the agent on host %s answered %.3f s after its ssh started", a->host, td_now() - a->started);
      for (int i = 0; i < j->n_workers; i++) {
        worker *w = &j->workers[i];
        if (!w->running || w->agent != ai + 1 || !w->agent_pending) continue;
        if (w->signalled) {
          w->agent_pending = false;
          worker_ended(j, w, W_EXITCODE(128 + SIGTERM, 0));
        } else if (!agent_send_start(j, i)) {
          w->agent_pending = true;
          agent_consumed(&j->agent_list[ai].in, off);
          agent_lost(j, ai, "it stopped reading");
          return;
        }
      }
      continue;
    }
    if (type == AGENT_PONG) { /* lossy_tick's pings: the traffic, and how far behind the answers are */
      if (x <= j->ping_seq && j->ping_seq - x < 64 && j->ping_sent[x % 64] > a->echoed_sent)
        a->echoed_sent = j->ping_sent[x % 64];
      continue;
    }
    if (x < 0 || x >= j->n_workers || j->workers[x].agent != ai + 1 || !j->workers[x].running) continue;
    worker *w = &j->workers[x];
    if (type == AGENT_STARTED) {
      w->pid = y;
      TD_INFO("process %d runs on host %s (pid %d), %.3f s after it was placed", w->rank, a->host, (int)y,
              td_now() - w->started);
    } else if (type == AGENT_OUT || type == AGENT_ERR) {
      line_buf *b = type == AGENT_OUT ? &w->out_buf : &w->err_buf;
      if (b->cap - b->len < len) {
        b->cap = b->len + len + 131072;
        b->data = realloc(b->data, b->cap);
        if (!b->data) exit(1);
      }
      memcpy(b->data + b->len, body, len);
      b->len += len;
      emit_lines(w->rank, b, type == AGENT_OUT ? 1 : 2, false);
    } else if (type == AGENT_EXIT) {
      emit_lines(w->rank, &w->out_buf, 1, true);
      emit_lines(w->rank, &w->err_buf, 2, true);
      int status = y;
      if (WIFSIGNALED(status)) status = W_EXITCODE(128 + WTERMSIG(status), 0); /* as the remote shell reported it */
      /* Its end may start others (elastic) and grow agent_list: the loop
       * takes the agent anew for each frame; the frames' bytes do not move
       * (nothing reads into this buffer meanwhile). */
      worker_ended(j, w, status);
    }
  }
  a = &j->agent_list[ai];
  if (rc < 0) {
    agent_lost(j, ai, "a garbled message");
    return;
  }
  agent_consumed(&a->in, off);
}

/* Agents with no hello after AGENT_WAIT_S: given up (their ranks go over
 * ssh). Ranks signalled through an agent that has not reported their end
 * KILL_AFTER_TERM_S + 1 s later (its host unreachable: a cut link) are
 * ended here, as killing a rank's own ssh ended it at once: the agent
 * stops them when its connection finally breaks. */
static void agents_tick(job *j) {
  double now = td_now();
  for (int i = 0; i < j->n_agents; i++)
    if (j->agent_list[i].from_fd >= 0 && !j->agent_list[i].ready && now > j->agent_list[i].started + AGENT_WAIT_S)
      agent_lost(j, i, "no answer in time");
  for (int i = 0; i < j->n_agents; i++) { /* background starts (above); agent_start does not move the list */
    host_agent *a = &j->agent_list[i];
    if (a->probe_at <= 0 || now < a->probe_at) continue;
    a->probe_at = 0;
    if (j->stopping || j->done || a->missing || a->from_fd >= 0 || a->pid > 0) continue;
    TD_INFO("starting the agent on host %s again in the background", a->host);
    agent_start(j, a->host);
  }
  for (int i = 0; i < j->n_workers; i++) { /* worker_ended may move j->workers: indices only */
    worker *w = &j->workers[i];
    if (w->running && w->agent && w->end_by > 0 && now > w->end_by)
      worker_ended(j, w, W_EXITCODE(128 + w->end_sig, 0));
  }
}

/* At the end of the job: stdin closed (each agent stops what still runs
 * and exits), then its ssh ended. */
static void agents_stop(job *j) {
  for (int i = 0; i < j->n_agents; i++) {
    host_agent *a = &j->agent_list[i];
    if (a->to_fd >= 0) close(a->to_fd);
    if (a->from_fd >= 0) close(a->from_fd);
    if (a->pid > 0) {
      double until = td_now() + KILL_AFTER_TERM_S + 1;
      while (waitpid(a->pid, NULL, WNOHANG) == 0 && td_now() < until) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
      }
      if (kill(-a->pid, SIGKILL) == 0) waitpid(a->pid, NULL, 0);
    }
    free(a->host);
    free(a->in.data);
  }
  free(j->agent_list);
  j->agent_list = NULL;
  j->n_agents = 0;
  free(j->agent_path);
  j->agent_path = NULL;
}

/* A signal to worker w: its process group here, or its host agent's
 * message (a queued worker is ended when its agent answers). */
static void worker_signal(job *j, worker *w, int sig) {
  if (!w->agent) {
    if (kill(-w->pid, sig) != 0) kill(w->pid, sig);
    return;
  }
  host_agent *a = &j->agent_list[w->agent - 1];
  bool sent = w->agent_pending || (a->to_fd >= 0 && agent_send(a->to_fd, AGENT_SIGNAL, w->rank, sig, NULL, 0));
  if (w->end_by == 0 || !sent) { /* not taken: ended at the next tick */
    w->end_by = td_now() + (sent ? KILL_AFTER_TERM_S + 1 : 0);
    w->end_sig = sig;
  }
}

/* Start one worker: here, through its host's agent, or over ssh. */
static bool start_worker(job *j, worker *w) {
  if (w->host->local || !agents_on(j)) return start_worker_here_or_ssh(j, w);
  agent_start(j, w->host->name);
  int ai = agent_index(j, w->host->name);
  host_agent *a = &j->agent_list[ai];
  if (a->from_fd < 0) return start_worker_here_or_ssh(j, w); /* none runs, or none can */
  w->agent = ai + 1;
  w->agent_pending = true;
  w->pid = 0;
  w->started = td_now();
  w->running = true;
  j->n_running++;
  j->metrics_stale = true;
  if (a->ready && !agent_send_start(j, (int)(w - j->workers))) {
    w->agent_pending = true;
    agent_lost(j, ai, "it stopped reading");
  }
  return true;
}

/* ---- elastic mode ----
 * Workers are numbered by launch (their TANDEM_ELASTIC_ID and output
 * prefix); a lost one does not stop the job: the launcher tells the store
 * (el_report_dead, so survivors need not wait for it), blacklists its host
 * for --blacklist-cooldown, and starts a replacement while slots and
 * --max-restarts allow; it joins at the survivors' next commit. Below
 * --min-np for --elastic-timeout seconds the job stops. The first worker to
 * exit 0 means training is done: no more starts, and processes outside the
 * final membership (joiners still waiting, refused stale ones) are
 * stopped. */

static int host_used(const job *j, const host_spec *h) {
  int n = 0;
  for (int i = 0; i < j->n_workers; i++) n += j->workers[i].running && j->workers[i].host == h;
  return n;
}

/* A host with a free slot that is not backed off; of those, the one whose
 * last failure is oldest (never failed: first), so that a replacement goes
 * elsewhere than where its predecessor just failed whenever it can. */
static host_spec *free_slot(const job *j, double now) {
  host_spec *best = NULL;
  for (int h = 0; h < j->n_ehosts; h++) {
    host_spec *hs = j->ehosts[h];
    if (now >= hs->blacklisted_until && !hs->evicted && host_used(j, hs) < hs->slots &&
        (!best || hs->last_failure < best->last_failure))
      best = hs;
  }
  return best;
}

/* Process `uid`, started at `started` (a replacement or not), failed on h:
 * the back-off above. */
static void host_failed(const job *j, host_spec *h, int uid, bool replacement, double started, double now) {
  h->last_failure = now;
  h->young_failures = replacement && now - started < HOST_YOUNG_S ? h->young_failures + 1 : 0;
  double backoff = 0;
  if (h->young_failures >= 2)
    backoff = TD_MIN(HOST_BACKOFF_S * ldexp(1.0, TD_MIN(h->young_failures - 2, 10)), HOST_BACKOFF_MAX_S);
  backoff = TD_MAX(backoff, j->opt.cooldown_s);
  if (h->young_failures >= 2)
    fprintf(stderr, "tandemrun: process %d failed %.1f s after its start on host %s (%d such failure%s there in a "
            "row): no new process there for %.0f s\n", uid, now - started, h->name, h->young_failures,
            h->young_failures == 1 ? "" : "s", backoff);
  if (backoff > 0) h->blacklisted_until = now + backoff;
}

static void elastic_add_host(job *j, const char *name, int slots) {
  for (int h = 0; h < j->n_ehosts; h++)
    if (!strcmp(j->ehosts[h]->name, name)) {
      j->ehosts[h]->slots = slots;
      return;
    }
  j->ehosts = realloc(j->ehosts, sizeof *j->ehosts * (size_t)(j->n_ehosts + 1));
  host_spec *hs = calloc(1, sizeof *hs);
  if (!j->ehosts || !hs) exit(1);
  hs->name = xstrdup(name);
  hs->slots = slots;
  hs->local = host_is_local(name);
  j->ehosts[j->n_ehosts++] = hs;
}

/* Run the discovery script: its HOST:SLOTS lines replace the slot counts
 * (a host it no longer lists keeps its running workers but gets no new
 * ones). A failing script or a bad line is reported and changes nothing. */
static void elastic_discover(job *j) {
  FILE *f = popen(j->opt.discovery, "re");
  if (!f) {
    fprintf(stderr, "tandemrun: cannot run --host-discovery-script '%s': %s\n", j->opt.discovery, strerror(errno));
    return;
  }
  char line[512];
  char names[64][256];
  int slots[64], n = 0;
  bool bad = false;
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "#\r\n")] = '\0';
    char *p = line + strspn(line, " \t");
    if (!*p) continue;
    char *colon = strrchr(p, ':');
    int sl = colon ? parse_slots(colon + 1) : 1;
    size_t len = colon ? (size_t)(colon - p) : strlen(p);
    if (sl < 1 || len == 0 || len >= sizeof names[0] || n == 64) {
      bad = true;
      continue;
    }
    memcpy(names[n], p, len);
    names[n][len] = '\0';
    slots[n++] = sl;
  }
  int rc = pclose(f);
  if (bad || (rc != -1 && rc != 0)) {
    fprintf(stderr, "tandemrun: --host-discovery-script '%s' %s; keeping the hosts known before\n", j->opt.discovery,
            bad ? "printed a line that is not HOST:SLOTS (or more than 64 hosts)" : "failed");
    return;
  }
  char before[1024] = "", after[1024] = "";
  size_t len = 0;
  for (int h = 0; h < j->n_ehosts && len < sizeof before; h++)
    len += (size_t)snprintf(before + len, sizeof before - len, " %s:%d", j->ehosts[h]->name, j->ehosts[h]->slots);
  for (int h = 0; h < j->n_ehosts; h++) j->ehosts[h]->slots = 0;
  for (int i = 0; i < n; i++) elastic_add_host(j, names[i], slots[i]);
  for (int i = 0; i < j->n_agents; i++) { /* listed again: background starts again (agents_tick) */
    host_agent *a = &j->agent_list[i];
    if (a->probe_dropped && host_listed(j, a->host)) {
      a->probe_dropped = false;
      a->probe_fails = 0;
      a->probe_at = td_now();
    }
  }
  len = 0;
  for (int h = 0; h < j->n_ehosts && len < sizeof after; h++)
    if (j->ehosts[h]->slots) len += (size_t)snprintf(after + len, sizeof after - len, " %s:%d", j->ehosts[h]->name,
                                                     j->ehosts[h]->slots);
  /* Say when the slots change, not at every poll. */
  char now_all[1024] = "";
  len = 0;
  for (int h = 0; h < j->n_ehosts && len < sizeof now_all; h++)
    len += (size_t)snprintf(now_all + len, sizeof now_all - len, " %s:%d", j->ehosts[h]->name, j->ehosts[h]->slots);
  if (j->n_workers > 0 && strcmp(before, now_all))
    fprintf(stderr, "tandemrun: discovered hosts now:%s\n", after[0] ? after : " none");
}

static worker *new_worker(job *j, host_spec *h) {
  if (j->n_workers == j->cap_workers) {
    j->cap_workers = j->cap_workers ? 2 * j->cap_workers : 8;
    j->workers = realloc(j->workers, sizeof *j->workers * (size_t)j->cap_workers);
    if (!j->workers) exit(1);
  }
  worker *w = &j->workers[j->n_workers];
  memset(w, 0, sizeof *w);
  w->rank = j->n_workers++;
  w->host = h;
  w->local_rank = host_used(j, h);
  w->local_size = h->slots;
  w->out_fd = w->err_fd = -1;
  w->lifeline_fd = -1;
  return w;
}

/* Processes outside the final membership will never be needed. */
static void elastic_finish(job *j) {
  char key[200];
  void *cur = NULL, *members = NULL;
  int found = 0;
  snprintf(key, sizeof key, "%s/el/cur", j->job_id);
  if (store_get(j->client, key, &cur, NULL, &found) == TD_OK && found) {
    snprintf(key, sizeof key, "%s/el/e%s/m", j->job_id, (char *)cur);
    if (store_get(j->client, key, &members, NULL, &found) != TD_OK || !found) members = NULL;
  }
  for (int i = 0; i < j->n_workers; i++) {
    worker *w = &j->workers[i];
    if (!w->running) continue;
    bool member = false;
    for (const char *p = members; p && *p;) {
      char *end;
      long u = strtol(p, &end, 10);
      if (end == p) break;
      member |= u == w->rank;
      p = end;
    }
    if (!member && members) {
      w->signalled = true;
      worker_signal(j, w, SIGTERM);
    }
  }
  free(cur);
  free(members);
}

/* tandemrun's --min-np watch and the survivors' own rendezvous both end
 * after --elastic-timeout, each by its own clock: a survivor that saw the
 * death first (shared memory, before tandemrun reaped it) may give up
 * first and exit 1 while tandemrun's watch still runs. Whichever clock
 * runs out first, the user gets a below --min-np line and exit 1 (not
 * "every process failed"); our_clock: tandemrun's own watch ran out. */
static void below_min_np_stop(job *j, bool our_clock) {
  j->below_failed = true;
  if (our_clock)
    fprintf(stderr, "tandemrun: only %d process%s left, below --min-np %d, for %g s (--elastic-timeout): stopping "
                    "the job. Add hosts or slots (--host-discovery-script), allow restarts (--max-restarts), or "
                    "lower --min-np\n",
            j->n_running, j->n_running == 1 ? "" : "es", j->opt.min_np, j->opt.elastic_timeout_s);
  else
    fprintf(stderr, "tandemrun: only %d process%s left, below --min-np %d: the last one exited (a survivor gives "
                    "up after --elastic-timeout %g s below --min-np, by its own clock): stopping the job. Add hosts "
                    "or slots (--host-discovery-script), allow restarts (--max-restarts), or lower --min-np\n",
            j->n_running, j->n_running == 1 ? "" : "es", j->opt.min_np, j->opt.elastic_timeout_s);
  begin_stop(j, SIGTERM);
}

static void elastic_reaped(job *j, worker *w, bool failed) {
  /* A joiner that ended is no longer on its way (if it never took a join
   * slot, the members would otherwise wait TANDEM_ELASTIC_JOIN_WAIT for it). */
  if (w->joiner && j->client && el_report_came(j->client, j->job_id, w->rank) != TD_OK)
    fprintf(stderr, "tandemrun: could not report process %d's end to the store: %s\n", w->rank, td_last_error());
  if (!failed) {
    if (!j->done) {
      j->done = true;
      elastic_finish(j);
    }
    return;
  }
  if (w->signalled || j->timed_out || j->interrupt_sig || j->below_failed || j->done) return;
  /* Below --min-np already before this exit, and it was an exit (not a
   * crash by signal): the survivors' own --elastic-timeout ended it. */
  bool gave_up = !isinf(j->below_since) && WIFEXITED(w->wait_status);
  char how[96];
  describe_status(w, how, sizeof how);
  j->n_lost++;
  if (j->prom) {
    char kind[48], name[32];
    int sig = worker_end_signal(w);
    snprintf(kind, sizeof kind, "kind=\"%s\"", sig ? signal_name(sig, name, sizeof name) : "exit");
    td_prom_add(j->prom, "tandem_job_process_failures_total", "processes of the job lost while it went on, by kind: "
                "the signal that ended them, or exit (a non-zero exit code)", kind, 1);
  }
  if (j->n_running > 0)
    fprintf(stderr, "tandemrun: process %d (pid %d, host %s) %s; the job goes on with %d process%s\n", w->rank,
            (int)w->pid, w->host->name, how, j->n_running, j->n_running == 1 ? "" : "es");
  else
    fprintf(stderr, "tandemrun: process %d (pid %d, host %s) %s; no process is left\n", w->rank, (int)w->pid,
            w->host->name, how);
  host_failed(j, w->host, w->rank, w->joiner, w->started, td_now());
  /* Start the replacement before telling the survivors, so that they wait
   * for it in the round they are forming (el_report_dead). */
  int uid = w->rank, before = j->n_workers;
  elastic_tick(j); /* may move j->workers: w is not used after this */
  long replacement = j->n_workers > before ? j->workers[before].rank : -1;
  if (j->client && el_report_dead(j->client, j->job_id, uid, how, replacement) != TD_OK)
    fprintf(stderr, "tandemrun: could not report process %d lost to the store: %s\n", uid, td_last_error());
  if (gave_up && j->n_running == 0 && !j->below_failed && !j->done) below_min_np_stop(j, false);
}

/* ---- lossy hosts ----
 * A host whose link loses packets stalls the whole job, and neither side
 * of the bad link can tell whose link it is (each sees the other stall).
 * tandemrun is a third vantage point: it pings every agent every
 * LOSSY_PING_S, counts the segments its kernel retransmits on its
 * connections to each host (src/elastic/lossy.c) and, when one host's
 * connections retransmit while the others' are clean and the job is
 * stalled (el_lossy_pick), evicts that host as if it had been lost: its
 * processes are reported dead and killed, the survivors are told to break
 * off their step (<job>/el/evict/<n>, watched by every process), and no
 * process starts there until its link has been clean for
 * TANDEM_EVICT_CLEAN seconds; then the usual scale-up brings it back. */
#define LOSSY_PING_S 0.1
#define LOSSY_SAMPLE_S 0.1
/* An agent link is live when the newest ping it answered was sent at most
 * this long ago (pings go every LOSSY_PING_S; a loaded launcher reads the
 * answers late by a poll round or two). */
#define LOSSY_PONG_LAG_S 1.0

static void lossy_start(job *j) {
  if (!j->opt.elastic || !agents_on(j)) return;
  if (el_lossy_config(&j->lossy_cfg) != TD_OK) {
    fprintf(stderr, "tandemrun: %s\n", td_last_error());
    exit(2);
  }
  if (!j->lossy_cfg.on) return;
  j->lossy = calloc(1, sizeof *j->lossy);
  if (!j->lossy) exit(1);
  el_lossy_init(j->lossy);
  j->last_progress = td_now();
}

static void lossy_stop(job *j) {
  if (!j->lossy) return;
  el_lossy_free(j->lossy);
  free(j->lossy);
  j->lossy = NULL;
}

static void evict_host(job *j, int hi, const char *why) {
  host_spec *h = j->ehosts[hi];
  double now = td_now();
  h->evicted = true;
  h->evicted_at = now;
  int n = 0;
  char uids[512] = "";
  size_t len = 0;
  for (int i = 0; i < j->n_workers; i++) {
    worker *w = &j->workers[i];
    if (!w->running || w->host != h || w->signalled) continue;
    n++;
    if (len < sizeof uids) len += (size_t)snprintf(uids + len, sizeof uids - len, "%s%d", len ? " " : "", w->rank);
  }
  j->n_evictions++;
  fprintf(stderr, "tandemrun: evicting host %s: its link is lossy (%s); its %d process%s (%s) %s stopped and the "
          "job goes on with %d; the host is used again once its link has been clean for %g s\n", h->name, why, n,
          n == 1 ? "" : "es", uids, n == 1 ? "is" : "are", j->n_running - n, j->lossy_cfg.clean_s);
  td_prom_add(j->prom, "tandem_job_evictions_total", "hosts evicted because their link was lossy", NULL, 1);
  /* Dead first, so that the round the survivors form does not wait for
   * them; then the survivors are told to break off their step. */
  for (int i = 0; i < j->n_workers; i++) {
    worker *w = &j->workers[i];
    if (!w->running || w->host != h || w->signalled) continue;
    if (j->client && el_report_dead(j->client, j->job_id, w->rank, "evicted: its host's link is lossy", -1) != TD_OK)
      fprintf(stderr, "tandemrun: could not report process %d evicted to the store: %s\n", w->rank, td_last_error());
  }
  char key[200];
  snprintf(key, sizeof key, "%s/el/evict/%d", j->job_id, j->n_evictions);
  if (j->client && store_set_str(j->client, key, uids) != TD_OK)
    fprintf(stderr, "tandemrun: could not tell the processes of the eviction: %s\n", td_last_error());
  for (int i = 0; i < j->n_workers; i++) { /* worker_signal does not move j->workers */
    worker *w = &j->workers[i];
    if (!w->running || w->host != h || w->signalled) continue;
    w->signalled = true;
    worker_signal(j, w, SIGKILL);
  }
}

static void lossy_tick(job *j) {
  if (!j->lossy || j->done || j->stopping) return;
  double now = td_now();
  if (now >= j->lossy_next_ping) {
    j->lossy_next_ping = now + LOSSY_PING_S;
    j->ping_seq++;
    j->ping_sent[j->ping_seq % 64] = now;
    for (int i = 0; i < j->n_agents; i++) {
      host_agent *a = &j->agent_list[i];
      /* One small frame: a full pipe (ssh not reading) is a lost ping, not a wait. */
      if (a->ready && a->to_fd >= 0) {
        struct {
          uint32_t len;
          uint8_t type;
          int32_t x, y;
        } __attribute__((packed)) f = {9, AGENT_PING, j->ping_seq, 0};
        ssize_t w = write(a->to_fd, &f, sizeof f);
        (void)w;
      }
    }
  }
  if (now < j->lossy_next_sample) return;
  j->lossy_next_sample = now + LOSSY_SAMPLE_S;
  bool any_remote = false; /* a job on the launcher's host alone has no link to judge */
  for (int i = 0; i < j->n_ehosts; i++) any_remote |= !j->ehosts[i]->local;
  if (!any_remote) return;
  char key[200];
  int64_t commits = 0;
  snprintf(key, sizeof key, "%s/el/commits", j->job_id);
  if (j->client && store_add(j->client, key, 0, &commits) == TD_OK && commits != j->last_commits) {
    j->last_commits = commits;
    j->last_progress = now;
  }
  el_lossy *l = j->lossy;
  while (l->n_hosts < j->n_ehosts && l->n_hosts < EL_LOSSY_MAX_HOSTS)
    el_lossy_set_host(l, l->n_hosts, j->ehosts[l->n_hosts]->name);
  if (!el_lossy_sample(l, now)) {
    fprintf(stderr, "tandemrun: cannot read the TCP statistics of its connections (sock_diag: %s): hosts whose link "
            "is lossy are not evicted in this job\n", strerror(errno));
    lossy_stop(j);
    return;
  }
  el_lossy_view v[EL_LOSSY_MAX_HOSTS];
  int n = TD_MIN(j->n_ehosts, EL_LOSSY_MAX_HOSTS), ranks_left = 0;
  for (int i = 0; i < n; i++) {
    host_spec *h = j->ehosts[i];
    v[i] = (el_lossy_view){.retrans = el_lossy_window(l, i, now, j->lossy_cfg.window_s), .conns = l->hosts[i].conns,
                           .remote = !h->local};
    for (int k = 0; k < j->n_workers; k++)
      v[i].ranks += j->workers[k].running && !j->workers[k].signalled && j->workers[k].host == h;
    /* The rule for letting an evicted host back: its link is clean when,
     * for TANDEM_EVICT_CLEAN seconds, its agent answered every ping within
     * LOSSY_PONG_LAG_S and tandemrun's connections to it retransmitted
     * nothing. Quiet connections alone do not prove it: during a cut a
     * connection's retransmission timer backs off (ssh's to seconds), so
     * it sends nothing for seconds, and the segments the fault left
     * unacknowledged are sent again only after the link is back: those
     * leftovers evicted a just-restored host again (the s25 200-fault
     * run). An answer to a ping sent after the fault means the agent's
     * stream has caught up: TCP delivers in order, so everything sent
     * before that ping arrived. */
    int ai = -1;
    for (int k = 0; k < j->n_agents && ai < 0; k++)
      if (!strcmp(j->agent_list[k].host, h->name)) ai = k;
    bool live = ai >= 0 && j->agent_list[ai].ready && j->agent_list[ai].echoed_sent > 0 &&
                now - j->agent_list[ai].echoed_sent <= LOSSY_PONG_LAG_S;
    if (!live)
      h->pongs_since = 0;
    else if (h->pongs_since == 0)
      h->pongs_since = now;
    if (h->evicted && now - h->evicted_at >= j->lossy_cfg.clean_s && v[i].conns > 0 && h->pongs_since > 0 &&
        now - h->pongs_since >= j->lossy_cfg.clean_s && el_lossy_window(l, i, now, j->lossy_cfg.clean_s) == 0) {
      h->evicted = false;
      int old = el_lossy_forget_backlog(l, i);
      fprintf(stderr, "tandemrun: host %s's link has been clean for %g s (its agent answered every ping within %g "
              "s, no segment retransmitted): it takes processes again\n", h->name, j->lossy_cfg.clean_s,
              LOSSY_PONG_LAG_S);
      if (old)
        TD_INFO("%d connection%s to host %s still hold%s segments from the fault: %s retransmissions do not count",
                old, old == 1 ? "" : "s", h->name, old == 1 ? "s" : "", old == 1 ? "its" : "their");
    }
  }
  char why[300];
  int pick = el_lossy_pick(&j->lossy_cfg, v, n, now - j->last_progress, why, sizeof why);
  if (pick < 0 || j->ehosts[pick]->evicted) return;
  for (int i = 0; i < n; i++) ranks_left += i == pick ? 0 : v[i].ranks;
  if (ranks_left < j->opt.min_np) {
    if (now - j->min_np_said > 10)
      fprintf(stderr, "tandemrun: host %s's link is lossy (%s), but evicting it would leave %d process%s, below "
              "--min-np %d: it stays\n", j->ehosts[pick]->name, why, ranks_left, ranks_left == 1 ? "" : "es",
              j->opt.min_np);
    j->min_np_said = now;
    return;
  }
  evict_host(j, pick, why);
}

/* Once per poll round: discovery, replacements and scale-up, the --min-np
 * watch. */
static void elastic_tick(job *j) {
  double now = td_now();
  if (j->opt.discovery && now >= j->next_discovery) {
    elastic_discover(j);
    j->next_discovery = now + j->discovery_interval_s;
  }
  if (j->done || j->stopping) return;
  while (j->n_running < j->opt.max_np && j->extra_started < j->opt.max_restarts) {
    host_spec *h = free_slot(j, now);
    if (!h) break;
    worker *w = new_worker(j, h);
    w->joiner = true;
    j->extra_started++;
    fprintf(stderr, "tandemrun: starting process %d on host %s to join the job (%d of --max-restarts %d)\n",
            w->rank, h->name, j->extra_started, j->opt.max_restarts);
    /* On its way: the members let a joiner that is already waiting wait
     * for it (el_membership_pending), so that both join in one change. */
    if (j->client && el_report_started(j->client, j->job_id) != TD_OK)
      fprintf(stderr, "tandemrun: could not report process %d's start to the store: %s\n", w->rank, td_last_error());
    if (!start_worker(j, w)) {
      if (j->client) (void)el_report_came(j->client, j->job_id, w->rank); /* never on its way after all */
      break;
    }
    td_prom_add(j->prom, "tandem_job_process_starts_total", "processes tandemrun started, by reason",
                "reason=\"replacement\"", 1);
  }
  if (j->n_running >= j->opt.min_np) {
    j->below_since = INFINITY;
  } else if (isinf(j->below_since)) {
    j->below_since = now;
  } else if (now - j->below_since >= j->opt.elastic_timeout_s) {
    below_min_np_stop(j, true);
  }
}

/* Elastic start: the hosts (from -H, a hostfile, localhost or the discovery
 * script, which may first have to offer --min-np slots), then -np workers
 * (fewer if the slots are fewer, but at least --min-np). Returns false if
 * --min-np slots never appeared within --elastic-timeout. */
static bool elastic_place(job *j) {
  for (int h = 0; h < j->opt.n_hosts; h++) {
    elastic_add_host(j, j->opt.hosts[h].name, j->opt.hosts[h].slots);
  }
  double deadline = td_now() + j->opt.elastic_timeout_s;
  for (;;) {
    if (j->opt.discovery) elastic_discover(j);
    long total = 0;
    for (int h = 0; h < j->n_ehosts; h++) total += j->ehosts[h]->slots;
    if (total >= j->opt.min_np) break;
    if (td_now() >= deadline) {
      fprintf(stderr, "tandemrun: only %ld slot%s after %g s (--elastic-timeout), fewer than --min-np %d: not "
                      "starting the job\n",
              total, total == 1 ? "" : "s", j->opt.elastic_timeout_s, j->opt.min_np);
      return false;
    }
    struct timespec ts = {1, 0};
    nanosleep(&ts, NULL);
  }
  j->discovery_interval_s = td_env_double("TANDEM_DISCOVERY_INTERVAL", 1.0);
  if (!(j->discovery_interval_s >= 0.01 && j->discovery_interval_s <= 3600)) {
    fprintf(stderr, "tandemrun: TANDEM_DISCOVERY_INTERVAL must be 0.01 .. 3600 seconds\n");
    return false;
  }
  j->next_discovery = td_now() + j->discovery_interval_s;
  /* Slot by slot, host by host, as without elastic mode. */
  for (int h = 0; h < j->n_ehosts && j->n_workers < j->opt.n_ranks; h++)
    for (int s = 0; s < j->ehosts[h]->slots && j->n_workers < j->opt.n_ranks; s++) {
      worker *w = new_worker(j, j->ehosts[h]);
      w->local_rank = s;
    }
  for (int i = 0; i < j->n_workers; i++) {
    int on_host = 0;
    for (int k = 0; k < j->n_workers; k++) on_host += j->workers[k].host == j->workers[i].host;
    j->workers[i].local_size = on_host;
  }
  j->initial_world = j->n_workers;
  j->below_since = INFINITY;
  return true;
}

/* Worker w's endpoint as the job endpoint fetches it: on its host
 * (loopback for local ranks; a remote rank must bind an address this host
 * reaches, TANDEM_PROMETHEUS_BIND, or it shows as down), port P+1 + its
 * number (the rank; elastic: the launch number). */
static char *worker_metrics_target(const job *j, const worker *w) {
  const host_spec *h = w->host;
  bool v6 = !h->local && strchr(h->name, ':');
  return xasprintf(v6 ? "[%s]:%d" : "%s:%d", h->local ? "127.0.0.1" : h->name, j->opt.prom_port + 1 + w->rank);
}

/* Elastic: the job endpoint fetches the processes running now, labelled
 * process="ID" (their rank changes with each epoch; the ranks' own series
 * carry it), and says how many run. After each start or end of one. */
static void job_metrics_follow(job *j) {
  if (!j->prom || !j->metrics_stale) return;
  j->metrics_stale = false;
  char **targets = xmalloc((size_t)(j->n_workers + 1) * sizeof *targets);
  char **labels = xmalloc((size_t)(j->n_workers + 1) * sizeof *labels);
  int n = 0;
  for (int i = 0; i < j->n_workers; i++) {
    if (!j->workers[i].running) continue;
    targets[n] = worker_metrics_target(j, &j->workers[i]);
    labels[n++] = xasprintf("process=\"%d\"", j->workers[i].rank);
  }
  if (td_prom_job_set_targets(j->prom, (const char *const *)targets, (const char *const *)labels, n) != TD_OK)
    fprintf(stderr, "tandemrun: warning: the job metrics endpoint keeps its old targets: %s\n", td_last_error());
  td_prom_set(j->prom, "tandem_job_processes_running", "gauge", "processes of the job running now", NULL,
              j->n_running);
  for (int i = 0; i < n; i++) free(targets[i]), free(labels[i]);
  free(targets);
  free(labels);
}

/* The job's Prometheus endpoint. A port in use is reported and the job goes
 * on, as for the ranks' own endpoints. */
static void start_job_metrics(job *j) {
  char **targets = xmalloc((size_t)j->n_workers * sizeof *targets);
  for (int r = 0; r < j->n_workers; r++) targets[r] = worker_metrics_target(j, &j->workers[r]);
  td_status st = td_prom_job_start(j->opt.prom_bind, j->opt.prom_port, (const char *const *)targets, j->n_workers,
                                   &j->prom);
  if (st != TD_OK)
    fprintf(stderr, "tandemrun: warning: no job metrics endpoint, the job goes on: %s\n", td_last_error());
  else
    fprintf(stderr, "tandemrun: the job's metrics on http://%s:%d/metrics (%s r serves on port %d+r)\n",
            j->opt.prom_bind ? j->opt.prom_bind : "127.0.0.1", j->opt.prom_port, j->opt.elastic ? "process" : "rank",
            j->opt.prom_port + 1);
  for (int r = 0; r < j->n_workers; r++) free(targets[r]);
  free(targets);
  if (j->prom && j->opt.elastic)
    td_prom_add(j->prom, "tandem_job_process_starts_total", "processes tandemrun started, by reason",
                "reason=\"initial\"", j->n_workers);
}

static int run_job(job *j) {
  /* Hosts and ranks: slot by slot, in order. Entries naming the same machine
   * (a host listed twice, or localhost and this host's name) form one group,
   * so that local ranks and sizes count every rank on that machine. */
  bool all_local = true;
  if (j->opt.elastic) {
    if (!elastic_place(j)) return 1;
    for (int h = 0; h < j->n_ehosts; h++) all_local &= j->ehosts[h]->local;
    /* A discovery script may add remote hosts later: then listen on the
     * network from the start. */
    if (j->opt.discovery) all_local = false;
    goto placed;
  }
  j->workers = calloc((size_t)j->opt.n_ranks, sizeof *j->workers);
  int *group = calloc((size_t)j->opt.n_hosts, sizeof *group);
  int *group_size = calloc((size_t)j->opt.n_hosts, sizeof *group_size);
  int *group_next = calloc((size_t)j->opt.n_hosts, sizeof *group_next);
  if (!j->workers || !group || !group_size || !group_next) exit(1);
  for (int h = 0; h < j->opt.n_hosts; h++) {
    const host_spec *hs = &j->opt.hosts[h];
    group[h] = h;
    for (int g = 0; g < h; g++) {
      const host_spec *other = &j->opt.hosts[g];
      if ((hs->local && other->local) || (!hs->local && !other->local && strcmp(hs->name, other->name) == 0)) {
        group[h] = group[g];
        break;
      }
    }
  }
  j->n_workers = j->opt.n_ranks;
  int rank = 0;
  for (int h = 0; h < j->opt.n_hosts && rank < j->opt.n_ranks; h++) {
    int on_host = TD_MIN(j->opt.hosts[h].slots, j->opt.n_ranks - rank);
    for (int l = 0; l < on_host; l++, rank++) {
      worker *w = &j->workers[rank];
      w->rank = rank;
      w->host = &j->opt.hosts[h];
      w->local_rank = group_next[group[h]]++;
      w->out_fd = w->err_fd = -1;
  w->lifeline_fd = -1;
    }
    group_size[group[h]] += on_host;
  }
  for (int r = 0; r < j->n_workers; r++)
    j->workers[r].local_size = group_size[group[j->workers[r].host - j->opt.hosts]];
  free(group);
  free(group_size);
  free(group_next);
  for (int i = 0; i < j->n_workers; i++) all_local &= j->workers[i].host->local;
placed:;

  /* Signals arrive on a signalfd; block them before the store thread starts
   * so that no thread takes them asynchronously. */
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGHUP);
  sigaddset(&mask, SIGCHLD);
  sigprocmask(SIG_BLOCK, &mask, NULL);
  struct sigaction ignore = {.sa_handler = SIG_IGN};
  sigaction(SIGPIPE, &ignore, &original_sigpipe);
  j->sigfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
  if (j->sigfd < 0) {
    fprintf(stderr, "tandemrun: signalfd failed: %s\n", strerror(errno));
    return 1;
  }

  /* Orphaned grandchildren of workers are reparented to us and reaped here,
   * instead of lingering as zombies under a container's init. */
  (void)prctl(PR_SET_CHILD_SUBREAPER, 1);

  /* The job's secret, before anything listens (see the file header). */
  if (!getenv("TANDEM_SECRET") && !td_env_str("TANDEM_SECRET_FILE", NULL)) {
    unsigned char random[32];
    size_t got = 0;
    while (got < sizeof random) {
      ssize_t n = getrandom(random + got, sizeof random - got, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        fprintf(stderr, "tandemrun: cannot draw the job secret from getrandom(): %s\n", strerror(errno));
        return 1;
      }
      got += (size_t)n;
    }
    char hex[2 * sizeof random + 1];
    for (size_t i = 0; i < sizeof random; i++) snprintf(hex + 2 * i, 3, "%02x", random[i]);
    setenv("TANDEM_SECRET", hex, 1);
    memset(random, 0, sizeof random);
    memset(hex, 0, sizeof hex);
  }
  td_status st = net_auth_init();
  if (st != TD_OK) {
    fprintf(stderr, "tandemrun: %s\n", td_last_error());
    return 1;
  }

  /* Loopback when every rank is here; else the address remote ranks dial
   * (TANDEM_HOST_ADDR, TANDEM_IFACE's, or the first non-loopback one). */
  char host_addr[256] = "127.0.0.1";
  if (!all_local && net_local_address(td_env_str("TANDEM_HOST_ADDR", NULL), td_env_str("TANDEM_IFACE", NULL), host_addr,
                                      sizeof host_addr) != TD_OK) {
    fprintf(stderr, "tandemrun: %s\n", td_last_error());
    return 1;
  }
  st = store_server_start(host_addr, 0, &j->store);
  if (st != TD_OK) {
    fprintf(stderr, "tandemrun: cannot start the rendezvous store: %s\n", td_last_error());
    return 1;
  }
  if (strchr(host_addr, ':'))
    snprintf(j->store_addr, sizeof j->store_addr, "[%s]:%d", host_addr, store_server_port(j->store));
  else
    snprintf(j->store_addr, sizeof j->store_addr, "%s:%d", host_addr, store_server_port(j->store));
  snprintf(j->job_id, sizeof j->job_id, "%d-%016llx", (int)getpid(), (unsigned long long)td_random_u64());
  if (j->opt.elastic && store_connect(j->store_addr, 30, &j->client) != TD_OK) {
    fprintf(stderr, "tandemrun: cannot connect to its own store: %s\n", td_last_error());
    store_server_stop(j->store);
    return 1;
  }

  if (j->opt.prom_port) start_job_metrics(j);
  lossy_start(j);

  j->root_rank = -1;
  double start = td_now();
  j->job_deadline = j->opt.timeout_s > 0 ? start + j->opt.timeout_s : INFINITY;
  j->grace_deadline = INFINITY;
  j->kill_deadline = INFINITY;
  int n_started = 0;
  /* The initial workers only: a worker reaped during this loop (SIGCHLD
   * below) may already have had its replacement started by elastic_tick,
   * which appends to j->workers; starting that one again here would fork it
   * twice and leave a count that never reaches 0 (tandemrun then hung). */
  const int n_initial = j->n_workers;
  /* Every remote host's agent at once (or, without agents, its master
   * connection): the first rank on each waits for its own only. */
  for (int i = 0; i < n_initial; i++)
    if (!j->workers[i].host->local) {
      if (agents_on(j))
        agent_start(j, j->workers[i].host->name);
      else
        master_start(j, j->workers[i].host->name);
    }
  for (int i = 0; i < n_initial; i++) {
    if (!start_worker(j, &j->workers[i])) break;
    n_started++;
    /* A signal during a long start-up (ssh) should not wait for the rest. */
    struct signalfd_siginfo si;
    if (read(j->sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
      if (si.ssi_signo == SIGCHLD) {
        reap(j);
      } else {
        j->interrupt_sig = (int)si.ssi_signo;
        break;
      }
    }
  }
  bool start_failed = n_started < n_initial && !j->interrupt_sig;
  if (start_failed || j->interrupt_sig) begin_stop(j, j->interrupt_sig ? j->interrupt_sig : SIGTERM);

  double drain_deadline = INFINITY;
  struct pollfd *pfds = NULL;
  int *owner = NULL;
  for (;;) {
    agents_tick(j);
    if (j->opt.elastic) {
      lossy_tick(j);
      elastic_tick(j);
      job_metrics_follow(j);
    }
    pfds = realloc(pfds, sizeof *pfds * (size_t)(2 * j->n_workers + j->n_agents + 1));
    owner = realloc(owner, sizeof *owner * (size_t)(2 * j->n_workers + j->n_agents + 1));
    if (!pfds || !owner) exit(1);
    double now = td_now();
    int n_open = 0;
    for (int i = 0; i < j->n_workers; i++) n_open += (j->workers[i].out_fd >= 0) + (j->workers[i].err_fd >= 0);
    if (j->n_running == 0) {
      if (n_open == 0) break;
      /* All exited; a grandchild may still hold a pipe. Give output a moment. */
      if (isinf(drain_deadline)) drain_deadline = now + DRAIN_AFTER_EXIT_S;
      if (now >= drain_deadline) break;
    }
    if (now >= j->job_deadline && !j->timed_out && !j->interrupt_sig && j->n_running > 0) {
      j->timed_out = true;
      if (j->root_rank < 0 && !j->interrupt_sig) j->root_others = j->n_running;
      begin_stop(j, SIGTERM);
    }
    if (now >= j->grace_deadline && j->n_running > 0) {
      j->grace_deadline = INFINITY;
      begin_stop(j, SIGTERM);
    }
    if (now >= j->kill_deadline && j->n_running > 0 && !j->killed) {
      j->killed = true;
      kill_all(j, SIGKILL);
    }
    double next = TD_MIN(TD_MIN(j->job_deadline, j->grace_deadline), TD_MIN(drain_deadline, j->kill_deadline));
    /* Wake when --elastic-timeout runs out, not up to a poll slice later. */
    if (j->opt.elastic && !j->stopping && !j->done) next = TD_MIN(next, j->below_since + j->opt.elastic_timeout_s);
    for (int i = 0; i < j->n_agents; i++) /* an agent's background start */
      if (j->agent_list[i].probe_at > 0) next = TD_MIN(next, j->agent_list[i].probe_at);
    if (j->lossy) next = TD_MIN(next, TD_MIN(j->lossy_next_ping, j->lossy_next_sample));
    int timeout_ms = isinf(next) ? -1 : (int)TD_MAX(0, ceil((next - now) * 1000.0));
    if (timeout_ms > 1000 || timeout_ms < 0) {
      /* SIGCHLD is coalesced by signalfd; reap at least once a second anyway. */
      timeout_ms = 1000;
    }
    int n_pfds = 0;
    pfds[n_pfds] = (struct pollfd){.fd = j->sigfd, .events = POLLIN};
    owner[n_pfds++] = -1;
    for (int i = 0; i < j->n_workers; i++) {
      if (j->workers[i].out_fd >= 0) {
        pfds[n_pfds] = (struct pollfd){.fd = j->workers[i].out_fd, .events = POLLIN};
        owner[n_pfds++] = 2 * i;
      }
      if (j->workers[i].err_fd >= 0) {
        pfds[n_pfds] = (struct pollfd){.fd = j->workers[i].err_fd, .events = POLLIN};
        owner[n_pfds++] = 2 * i + 1;
      }
    }
    int n_worker_fds = n_pfds, n_workers_polled = j->n_workers;
    for (int i = 0; i < j->n_agents; i++)
      if (j->agent_list[i].from_fd >= 0) {
        pfds[n_pfds] = (struct pollfd){.fd = j->agent_list[i].from_fd, .events = POLLIN};
        owner[n_pfds++] = 2 * n_workers_polled + i;
      }
    int n = poll(pfds, (nfds_t)n_pfds, timeout_ms);
    if (n < 0 && errno != EINTR) {
      fprintf(stderr, "tandemrun: poll failed: %s\n", strerror(errno));
      begin_stop(j, SIGKILL);
    }
    for (int p = n_worker_fds; n > 0 && p < n_pfds; p++) /* may end workers, start others, move j->workers */
      if (pfds[p].revents && j->agent_list[owner[p] - 2 * n_workers_polled].from_fd == pfds[p].fd)
        agent_read(j, owner[p] - 2 * n_workers_polled);
    for (int p = 1; n > 0 && p < n_worker_fds; p++) {
      if (!pfds[p].revents) continue;
      worker *w = &j->workers[owner[p] / 2];
      if (owner[p] % 2 == 0)
        pump(w->rank, &w->out_fd, &w->out_buf, 1);
      else
        pump(w->rank, &w->err_fd, &w->err_buf, 2);
    }
    struct signalfd_siginfo si;
    while (read(j->sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
      int sig = (int)si.ssi_signo;
      if (sig == SIGCHLD) continue;
      if (j->interrupt_sig && sig == j->interrupt_sig) {
        /* Asked twice: stop waiting for the workers to be polite. */
        j->killed = true;
        kill_all(j, SIGKILL);
        continue;
      }
      if (!j->interrupt_sig) {
        j->interrupt_sig = sig;
        if (j->root_rank < 0 && !j->timed_out) j->root_others = j->n_running;
      }
      kill_all(j, sig);
      if (!j->stopping) {
        j->stopping = true;
        j->kill_deadline = td_now() + KILL_AFTER_TERM_S;
      }
    }
    reap(j);
  }
  free(pfds);
  free(owner);
  /* Any grandchild still holding a pipe is part of a finished job: stop it. */
  for (int i = 0; i < j->n_workers; i++) {
    worker *w = &j->workers[i];
    if (w->pid > 0 && !w->agent && (w->out_fd >= 0 || w->err_fd >= 0)) kill(-w->pid, SIGKILL);
    if (w->out_fd >= 0) emit_lines(w->rank, &w->out_buf, 1, true), close(w->out_fd);
    if (w->err_fd >= 0) emit_lines(w->rank, &w->err_buf, 2, true), close(w->err_fd);
    free(w->out_buf.data);
    free(w->err_buf.data);
  }
  agents_stop(j); /* before the reaping below, which would take their ssh's status */
  lossy_stop(j);
  /* Reap what we killed (and any orphans handed to us), briefly. */
  for (double until = td_now() + 0.5; td_now() < until;) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid < 0) break; /* ECHILD: nothing left */
    if (pid == 0) {
      struct timespec ts = {0, 5 * 1000 * 1000};
      nanosleep(&ts, NULL);
    }
  }
  store_close(j->client);
  store_server_stop(j->store);
  if (j->prom) /* what the job endpoint cost (bench/prometheus_cost.sh) */
    fprintf(stderr, "tandemrun: the job's metrics endpoint: %lu scrapes, %.3f ms CPU serving them\n",
            td_prom_scrapes(j->prom), td_prom_serve_cpu_seconds(j->prom) * 1e3);
  td_prom_stop(j->prom);
  j->prom = NULL;
  close(j->sigfd);

  masters_stop(j);

  /* One root-cause line, and the exit code. */
  char how[96], name[32];
  int code = 0;
  if (j->opt.elastic && !j->timed_out && !j->interrupt_sig) {
    if (j->below_failed) {
      code = 1;
    } else if (j->done) {
      if (j->n_lost > 0)
        fprintf(stderr, "tandemrun: the job finished after losing %d process%s (started %d more)\n", j->n_lost,
                j->n_lost == 1 ? "" : "es", j->extra_started);
    } else {
      fprintf(stderr, "tandemrun: every process of the elastic job failed (%d lost); none finished training\n",
              j->n_lost);
      code = 1;
    }
  } else if (j->root_rank >= 0) {
    worker *w = &j->workers[j->root_rank];
    describe_status(w, how, sizeof how);
    char others[96] = "";
    if (j->root_others > 0)
      snprintf(others, sizeof others, "; stopped the other %d rank%s", j->root_others, j->root_others == 1 ? "" : "s");
    const char *hint = "";
    if (!w->host->local && WIFEXITED(w->wait_status) && WEXITSTATUS(w->wait_status) == 255)
      hint = " (ssh could not reach the host or lost the connection to it? check TANDEM_SSH)";
    else if (WIFEXITED(w->wait_status) && WEXITSTATUS(w->wait_status) == 127)
      hint = " (the program could not be started)";
    fprintf(stderr, "tandemrun: rank %d (pid %d, host %s) %s%s%s\n", w->rank, (int)w->pid, w->host->name, how, hint,
            others);
    code = WIFSIGNALED(w->wait_status) ? 128 + WTERMSIG(w->wait_status) : WEXITSTATUS(w->wait_status);
    if (code == 0) code = 1;
  } else if (j->timed_out) {
    fprintf(stderr, "tandemrun: the job ran past --timeout %g s; stopped the %d rank%s still running\n",
            j->opt.timeout_s, j->root_others, j->root_others == 1 ? "" : "s");
    code = 124;
  } else if (j->interrupt_sig) {
    fprintf(stderr, "tandemrun: received %s; forwarded it to the %d running rank%s and stopped the job\n",
            signal_name(j->interrupt_sig, name, sizeof name), j->root_others, j->root_others == 1 ? "" : "s");
    code = 128 + j->interrupt_sig;
  } else if (start_failed) {
    fprintf(stderr, "tandemrun: could not start rank %d; stopped the %d rank%s already started\n", n_started,
            n_started, n_started == 1 ? "" : "s");
    code = 1;
  } else {
    /* All exited 0, or failures that we caused only (not possible without a root cause). */
    for (int i = 0; i < j->n_workers; i++) {
      worker *w = &j->workers[i];
      if (!(WIFEXITED(w->wait_status) && WEXITSTATUS(w->wait_status) == 0)) {
        describe_status(w, how, sizeof how);
        fprintf(stderr, "tandemrun: rank %d (pid %d, host %s) %s\n", w->rank, (int)w->pid, w->host->name, how);
        code = 1;
        break;
      }
    }
  }
  free(j->workers);
  for (int h = 0; h < j->n_ehosts; h++) free(j->ehosts[h]->name), free(j->ehosts[h]);
  free(j->ehosts);
  return code;
}

int main(int argc, char **argv) {
  job j;
  memset(&j, 0, sizeof j);
  j.share = -1;
  j.agents = -1;
  td_log_set_prefix("tandemrun"); /* its TANDEM_LOG=info lines: tandem[tandemrun] info: ... */
  parse_options(argc, argv, &j.opt);
  int code = run_job(&j);
  for (int h = 0; h < j.opt.n_hosts; h++) free(j.opt.hosts[h].name);
  free(j.opt.hosts);
  free(j.opt.program_path);
  return code;
}
