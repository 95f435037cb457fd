/* tandem-agent: tandemrun's agent on a remote host (like torchrun's per-host
 * agent or Open MPI's orted).
 *
 * tandemrun starts one per remote host over ssh, once, when it first places
 * a rank there (or the host returns after it was lost), and then has it
 * fork and exec every rank placed on that host: a start there costs a fork
 * and an exec instead of an ssh session and the user's login shell. It is
 * not meant to be run by hand. The messages (over ssh's stdin and stdout)
 * are in agent_protocol.h.
 *
 * What it guarantees:
 *   - no rank outlives tandemrun: EOF on stdin (tandemrun ended, was
 *     killed, or the connection broke) stops every rank (SIGTERM to its
 *     process group, SIGKILL 3 s later), and each rank has a parent-death
 *     signal, so a killed agent takes its ranks with it;
 *   - each rank's exit status goes back to tandemrun, after its output;
 *   - the job secret arrives on stdin and goes only into the ranks'
 *     environment: it is never on a command line, nor in the agent's own
 *     environment.
 * Single-threaded: one poll loop over stdin, a signalfd for SIGCHLD, and
 * each rank's stdout and stderr pipes. */
#define _GNU_SOURCE
#include "agent_protocol.h"

#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <time.h>

#define KILL_AFTER_TERM_S 3.0 /* as tandemrun's */

extern char **environ;

typedef struct {
  int32_t id;
  pid_t pid;
  int out_fd, err_fd; /* -1 once closed */
  bool running;
} rank_proc;

static rank_proc *ranks;
static int n_ranks, cap_ranks;
static char *secret; /* "TANDEM_SECRET=..." or NULL */
static int to_launcher = 1;
static bool launcher_gone; /* our stdout broke: nobody reads what we send */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void send_frame(int type, int32_t a, int32_t b, const void *body, size_t len) {
  if (!launcher_gone && !agent_send(to_launcher, type, a, b, body, len)) launcher_gone = true;
}

/* Forwards what one of a rank's pipes has; closes it at EOF. Returns true
 * if it read something. */
static bool forward(rank_proc *r, int *fd, int type) {
  char buf[AGENT_OUT_CHUNK];
  ssize_t n;
  do n = read(*fd, buf, sizeof buf);
  while (n < 0 && errno == EINTR);
  if (n > 0) {
    send_frame(type, r->id, 0, buf, (size_t)n);
    return true;
  }
  if (n < 0 && errno == EAGAIN) return false;
  close(*fd);
  *fd = -1;
  return false;
}

/* A rank's environment: ours, less what START sets, plus START's entries
 * and the secret. */
static char **rank_env(char **set, int n_set) {
  int n_ours = 0;
  while (environ[n_ours]) n_ours++;
  char **env = calloc((size_t)(n_ours + n_set + 2), sizeof *env);
  if (!env) return NULL;
  int n = 0;
  for (int i = 0; i < n_ours; i++) {
    const char *eq = strchr(environ[i], '=');
    size_t key = eq ? (size_t)(eq - environ[i]) + 1 : strlen(environ[i]);
    bool replaced = strncmp(environ[i], "TANDEM_SECRET=", 14) == 0;
    for (int k = 0; k < n_set && !replaced; k++) replaced = strncmp(environ[i], set[k], key) == 0;
    if (!replaced) env[n++] = environ[i];
  }
  for (int k = 0; k < n_set; k++) env[n++] = set[k];
  if (secret) env[n++] = secret;
  env[n] = NULL;
  return env;
}

/* The child between fork and exec: write-only messages to its stderr pipe. */
static void child_fail(const char *what, const char *arg) {
  char msg[1024];
  int len = snprintf(msg, sizeof msg, "tandem-agent: cannot %s '%s': %s\n", what, arg, strerror(errno));
  if (len > 0) agent_write_all(2, msg, (size_t)len < sizeof msg ? (size_t)len : sizeof msg - 1);
  _exit(127);
}

static void start_rank(int32_t id, int32_t n_env, const char *body, size_t len) {
  /* Split the body into cwd, n_env entries and the arguments. */
  int n_str = 0;
  for (size_t i = 0; i < len; i++) n_str += body[i] == '\0';
  char **strs = calloc((size_t)n_str + 1, sizeof *strs);
  char *copy = malloc(len + 1);
  if (!strs || !copy || len == 0 || body[len - 1] != '\0' || n_env < 0 || n_str < 2 + n_env) {
    free(strs);
    free(copy);
    send_frame(AGENT_STARTED, id, 0, NULL, 0);
    send_frame(AGENT_EXIT, id, 127 << 8, NULL, 0);
    return;
  }
  memcpy(copy, body, len);
  for (int i = 0, k = 0; k < n_str; k++) {
    strs[k] = copy + i;
    i += (int)strlen(copy + i) + 1;
  }
  const char *cwd = strs[0];
  char **env = rank_env(strs + 1, n_env);
  char **argv = strs + 1 + n_env;
  int out_pipe[2], err_pipe[2];
  if (!env || pipe2(out_pipe, O_CLOEXEC) != 0) {
    free(env), free(strs), free(copy);
    send_frame(AGENT_STARTED, id, 0, NULL, 0);
    send_frame(AGENT_EXIT, id, 127 << 8, NULL, 0);
    return;
  }
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    close(out_pipe[0]), close(out_pipe[1]);
    free(env), free(strs), free(copy);
    send_frame(AGENT_STARTED, id, 0, NULL, 0);
    send_frame(AGENT_EXIT, id, 127 << 8, NULL, 0);
    return;
  }
  pid_t agent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    /* Its own process group (signals reach its children); it dies with the
     * agent; the signal state a program expects. */
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != agent) _exit(127);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    if (chdir(cwd) != 0) child_fail("enter the working directory", cwd);
    environ = env; /* execvp searches the rank's PATH, as `env VARS PROGRAM` did */
    execvp(argv[0], argv);
    child_fail("execute", argv[0]);
  }
  int fork_errno = errno;
  close(out_pipe[1]);
  close(err_pipe[1]);
  free(env), free(strs), free(copy);
  if (pid < 0) {
    close(out_pipe[0]), close(err_pipe[0]);
    char msg[160];
    int n = snprintf(msg, sizeof msg, "tandem-agent: cannot start a process: fork failed: %s\n", strerror(fork_errno));
    send_frame(AGENT_STARTED, id, 0, NULL, 0);
    send_frame(AGENT_ERR, id, 0, msg, (size_t)n);
    send_frame(AGENT_EXIT, id, 127 << 8, NULL, 0);
    return;
  }
  setpgid(pid, pid); /* also in the child: whichever runs first */
  fcntl(out_pipe[0], F_SETFL, O_NONBLOCK);
  fcntl(err_pipe[0], F_SETFL, O_NONBLOCK);
  if (n_ranks == cap_ranks) {
    cap_ranks = cap_ranks ? 2 * cap_ranks : 8;
    rank_proc *r = realloc(ranks, sizeof *ranks * (size_t)cap_ranks);
    if (!r) _exit(1);
    ranks = r;
  }
  ranks[n_ranks++] = (rank_proc){.id = id, .pid = pid, .out_fd = out_pipe[0], .err_fd = err_pipe[0], .running = true};
  send_frame(AGENT_STARTED, id, pid, NULL, 0);
}

static void signal_rank(int32_t id, int sig) {
  for (int i = 0; i < n_ranks; i++)
    if (ranks[i].id == id && ranks[i].running && kill(-ranks[i].pid, sig) != 0) kill(ranks[i].pid, sig);
}

/* Reaps ended ranks: their remaining output, then EXIT. */
static void reap(void) {
  for (;;) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    for (int i = 0; i < n_ranks; i++) {
      rank_proc *r = &ranks[i];
      if (r->pid != pid || !r->running) continue;
      r->running = false;
      /* What it wrote before it ended is in the pipes now; a child of its
       * that still holds them is not waited for. */
      while (r->out_fd >= 0 && forward(r, &r->out_fd, AGENT_OUT)) {
      }
      while (r->err_fd >= 0 && forward(r, &r->err_fd, AGENT_ERR)) {
      }
      if (r->out_fd >= 0) close(r->out_fd), r->out_fd = -1;
      if (r->err_fd >= 0) close(r->err_fd), r->err_fd = -1;
      send_frame(AGENT_EXIT, r->id, status, NULL, 0);
      ranks[i] = ranks[--n_ranks];
      break;
    }
  }
}

/* tandemrun is gone: stop every rank, SIGKILL after KILL_AFTER_TERM_S. */
static int shut_down(int sigfd) {
  launcher_gone = true;
  for (int i = 0; i < n_ranks; i++)
    if (kill(-ranks[i].pid, SIGTERM) != 0) kill(ranks[i].pid, SIGTERM);
  double until = now_s() + KILL_AFTER_TERM_S;
  while (n_ranks > 0) {
    reap();
    if (n_ranks == 0) break;
    double left = until - now_s();
    if (left <= 0) {
      for (int i = 0; i < n_ranks; i++)
        if (kill(-ranks[i].pid, SIGKILL) != 0) kill(ranks[i].pid, SIGKILL);
      until = INFINITY;
      left = 1;
    }
    struct pollfd p = {.fd = sigfd, .events = POLLIN};
    (void)poll(&p, 1, (int)(left * 1000) + 1);
    struct signalfd_siginfo si;
    while (read(sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
    }
  }
  return 0;
}

int main(int argc, char **argv) {
  (void)argv;
  if (argc != 1 || isatty(0)) {
    fprintf(stderr, "tandem-agent: tandemrun starts this program on each remote host (docs/launcher.md); it takes "
                    "no arguments and is not run by hand\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  sigprocmask(SIG_BLOCK, &mask, NULL);
  int sigfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sigfd < 0) {
    fprintf(stderr, "tandem-agent: signalfd failed: %s\n", strerror(errno));
    return 1;
  }
  fcntl(0, F_SETFD, FD_CLOEXEC);
  fcntl(1, F_SETFD, FD_CLOEXEC);
  send_frame(AGENT_HELLO, AGENT_VERSION, (int32_t)getpid(), NULL, 0);
  agent_inbuf in = {0};
  struct pollfd *pfds = NULL;
  for (;;) {
    pfds = realloc(pfds, sizeof *pfds * (size_t)(2 + 2 * n_ranks));
    if (!pfds) return 1;
    int n_pfds = 0;
    pfds[n_pfds++] = (struct pollfd){.fd = 0, .events = POLLIN};
    pfds[n_pfds++] = (struct pollfd){.fd = sigfd, .events = POLLIN};
    for (int i = 0; i < n_ranks; i++) {
      pfds[n_pfds++] = (struct pollfd){.fd = ranks[i].out_fd, .events = POLLIN};
      pfds[n_pfds++] = (struct pollfd){.fd = ranks[i].err_fd, .events = POLLIN};
    }
    int n = poll(pfds, (nfds_t)n_pfds, 1000);
    if (n < 0 && errno != EINTR) break;
    /* Output before exits: a rank's EXIT follows all it wrote. */
    for (int p = 2, i = 0; n > 0 && i < n_ranks; i++, p += 2) {
      if (pfds[p].revents && ranks[i].out_fd >= 0) forward(&ranks[i], &ranks[i].out_fd, AGENT_OUT);
      if (pfds[p + 1].revents && ranks[i].err_fd >= 0) forward(&ranks[i], &ranks[i].err_fd, AGENT_ERR);
    }
    struct signalfd_siginfo si;
    while (read(sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
    }
    reap();
    if (launcher_gone) break;
    if (pfds[0].revents) {
      ssize_t got = agent_fill(0, &in);
      if (got == 0 || (got < 0 && errno != EAGAIN)) break;
      size_t off = 0;
      int type, rc;
      int32_t a, b;
      const char *body;
      size_t body_len;
      while ((rc = agent_next(&in, &off, &type, &a, &b, &body, &body_len)) == 1) {
        if (type == AGENT_SECRET) {
          free(secret);
          secret = malloc(body_len + 15);
          if (!secret) return 1;
          memcpy(secret, "TANDEM_SECRET=", 14);
          memcpy(secret + 14, body, body_len);
          secret[14 + body_len] = '\0';
        } else if (type == AGENT_START) {
          start_rank(a, b, body, body_len);
        } else if (type == AGENT_SIGNAL) {
          signal_rank(a, b);
        } else if (type == AGENT_PING) {
          send_frame(AGENT_PONG, a, 0, NULL, 0);
        }
      }
      if (rc < 0) {
        fprintf(stderr, "tandem-agent: a garbled message from tandemrun: stopping\n");
        break;
      }
      agent_consumed(&in, off);
    }
  }
  free(pfds);
  free(in.data);
  int rc = shut_down(sigfd);
  if (secret) memset(secret, 0, strlen(secret));
  free(secret);
  return rc;
}
