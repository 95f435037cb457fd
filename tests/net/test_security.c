/* Only the job's own processes get in (issue 7, item 1). Each case runs real
 * processes: this program re-executes itself (/proc/self/exe) as a client
 * with another secret, with none, as a rank, or as an attacker, because the
 * job's key is loaded once per process.
 *
 *   test_security store    a store with secret S: clients with a wrong or no
 *                          secret, raw requests without a handshake, a bad
 *                          proof and a silent connector get nothing and
 *                          change nothing; oversized and malformed requests
 *                          close only their own connection; the byte and
 *                          connection limits hold; legitimate clients are
 *                          served throughout.
 *   test_security tcp      two TCP ranks started by this process; before
 *                          rank 1 joins, strangers connect to rank 0's
 *                          listener (the old hello, a wrong secret, a bad
 *                          proof, silence). None completes a hello and the
 *                          job's allreduce is still right.
 *   test_security shm      a segment with loose permissions or the wrong size
 *                          is refused by name; a 2-rank shm job whose segment
 *                          header is tampered with before rank 1 maps it fails
 *                          with an error naming the segment.
 *   test_security home     no secret given (mpirun, srun, torchrun): the
 *                          per-user ~/.tandem/secret is created 0600 on first
 *                          use and shared by the job's processes; another
 *                          home's secret and the old fixed key are refused;
 *                          loose permissions are refused; without any
 *                          secret only loopback listeners; ranks racing to
 *                          create it agree.
 *   test_security mitm     (root: its own network namespace) a proxy between
 *                          the two ranks of a TCP job flips one bit of a
 *                          data frame: unprotected the sum is silently
 *                          wrong (the control); with TANDEM_TCP_PROTECT
 *                          integrity or encrypt both ranks fail, rank 0
 *                          naming rank 1 and the record that failed.
 *   test_security flood-job  (under tandemrun -np 4) 1,000 junk connections
 *                          and oversized requests against the job's store
 *                          while the ranks run collectives and create
 *                          communicators: results stay right, no stranger
 *                          wrote a key. */
#define _GNU_SOURCE 1 /* unshare; before the first system header */
#include "../common/check.h"
#include "net/net.h"
#include "net/store_proto.h"
#include "comm/transport/shm/shm.h"
#include "tandem/tandem.h"

#include <sched.h>
#include <dirent.h>
#include <fcntl.h>
#include <glob.h>
#include <math.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define SECRET_A "sec-test-secret-A-0123456789abcdef0123456789abcdef"
#define SECRET_B "sec-test-secret-B-fedcba9876543210fedcba9876543210"

extern char **environ;

/* ---- helpers ---- */

static void msleep(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Run this program with args and extra "K=V" settings (value NULL: unset K);
 * returns the pid. stdin_fd >= 0 becomes the child's stdin. */
static bool env_named(const char *entry, const char *setting) {
  size_t n = strcspn(setting, "=");
  return !strncmp(entry, setting, n) && entry[n] == '=';
}

/* The environment and argv are built before fork: the caller may have
 * threads (a communicator's), so the child only calls dup2 and execve. */
static pid_t spawn_self_err(char *const args[], const char *const *sets, int stdin_fd, int stderr_fd) {
  size_t n_env = 0;
  while (environ[n_env]) n_env++;
  size_t n_sets = 0;
  while (sets && sets[n_sets]) n_sets++;
  char **envp = calloc(n_env + n_sets + 1, sizeof *envp);
  CHECK(envp);
  size_t k = 0;
  for (size_t i = 0; i < n_env; i++) {
    bool replaced = false;
    for (size_t j = 0; j < n_sets; j++) replaced |= env_named(environ[i], sets[j]);
    if (!replaced) envp[k++] = environ[i];
  }
  for (size_t j = 0; j < n_sets; j++)
    if (strchr(sets[j], '=')) envp[k++] = (char *)sets[j];
  envp[k] = NULL;
  char *argv[16] = {"test_security"};
  int n = 1;
  for (; args[n - 1] && n < 15; n++) argv[n] = args[n - 1];
  argv[n] = NULL;
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    if (stdin_fd >= 0) dup2(stdin_fd, 0);
    if (stderr_fd >= 0) dup2(stderr_fd, 2);
    execve("/proc/self/exe", argv, envp);
    _exit(127);
  }
  free(envp);
  return pid;
}

static pid_t spawn_self(char *const args[], const char *const *sets, int stdin_fd) {
  return spawn_self_err(args, sets, stdin_fd, -1);
}

static int wait_exit(pid_t pid) {
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* Read until EOF or error or timeout; returns the bytes received (the
 * stranger's whole take from the connection). */
static size_t drain(int fd, double timeout_s, bool *closed) {
  size_t total = 0;
  double deadline = td_now() + timeout_s;
  *closed = false;
  for (;;) {
    double left = deadline - td_now();
    if (left <= 0) return total;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, (int)(left * 1000) + 1) <= 0) continue;
    char buf[4096];
    ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      total += (size_t)n;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    *closed = true;
    return total;
  }
}

static int raw_connect(const char *addr) {
  char host[256];
  int port, fd;
  CHECK_OK(net_parse_addr(addr, host, sizeof host, &port));
  CHECK_OK(net_connect(host, port, 5.0, &fd));
  return fd;
}

/* A store request header + key (+ value bytes announced but maybe not sent). */
static void send_request(int fd, uint32_t op, const char *key, uint64_t a_len, uint64_t b_len, int64_t arg,
                         const void *a) {
  unsigned char h[STORE_REQ_HEADER];
  store_req_header r = {.op = op, .key_len = (uint32_t)strlen(key), .a_len = a_len, .b_len = b_len, .arg = arg};
  store_encode_req(h, &r);
  (void)net_send_all(fd, h, sizeof h, td_now() + 2);
  (void)net_send_all(fd, key, strlen(key), td_now() + 2);
  if (a) (void)net_send_all(fd, a, (size_t)a_len, td_now() + 2);
}

/* ---- child modes ---- */

/* A store client whose secret is not the job's: it must be turned away
 * quickly, and the message must not leak either secret. */
static int mode_wrong_client(const char *addr) {
  td_store *s = NULL;
  double t0 = td_now();
  td_status st = store_connect(addr, 5.0, &s);
  double took = td_now() - t0;
  if (st == TD_OK) {
    /* On a store without authentication: prove the damage. */
    (void)store_set_str(s, "stranger", "was here");
    fprintf(stderr, "wrong-secret client connected to %s\n", addr);
    return 1;
  }
  const char *why = td_last_error();
  if (strstr(why, SECRET_A) || strstr(why, SECRET_B)) {
    fprintf(stderr, "the error leaks a secret: %s\n", why);
    return 2;
  }
  if (!strstr(why, "TANDEM_SECRET")) {
    fprintf(stderr, "the error does not say what to set: %s\n", why);
    return 3;
  }
  if (took > 2.0) {
    fprintf(stderr, "turned away only after %.2f s\n", took);
    return 4;
  }
  return 0;
}

/* Authenticated (it holds the secret), then misbehaves: announces a request
 * beyond the limit; the server must close the connection without reading on. */
static int mode_oversize(const char *addr, uint64_t a_len, uint64_t b_len) {
  int fd = raw_connect(addr);
  CHECK_OK(net_auth_connect(fd, NET_AUTH_ROLE_STORE, -1, "store", "store", td_now() + 10));
  send_request(fd, STORE_CAS, "big", a_len, b_len, 0, NULL);
  bool closed;
  size_t got = drain(fd, 5.0, &closed);
  close(fd);
  if (!closed || got) {
    fprintf(stderr, "oversized request (%llu + %llu bytes): closed=%d, %zu bytes answered\n",
            (unsigned long long)a_len, (unsigned long long)b_len, closed, got);
    return 1;
  }
  return 0;
}

/* ---- store ---- */

static void test_store(void) {
  setenv("TANDEM_SECRET", SECRET_A, 1);
  setenv("TANDEM_AUTH_TIMEOUT", "1", 1);
  setenv("TANDEM_STORE_MAX_REQUEST", "1M", 1);
  setenv("TANDEM_STORE_MAX_BYTES", "4M", 1);
  setenv("TANDEM_STORE_MAX_CLIENTS", "40", 1);
  td_store_server *server = NULL;
  CHECK_OK(store_server_start("127.0.0.1", 0, &server));
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", store_server_port(server));
  td_store *ok = NULL;
  CHECK_OK(store_connect(addr, 5.0, &ok));
  CHECK_OK(store_set_str(ok, "k", "original"));

  /* A listener that never answers the hello (a stopped or cut-off peer):
   * the connector times out, and says which setting bounds a handshake. */
  {
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK(lfd >= 0 && bind(lfd, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(lfd, 4) == 0);
    socklen_t len = sizeof sa;
    CHECK(getsockname(lfd, (struct sockaddr *)&sa, &len) == 0);
    char silent[64];
    snprintf(silent, sizeof silent, "127.0.0.1:%d", ntohs(sa.sin_port));
    int fd = raw_connect(silent); /* completed by the kernel's backlog; nobody reads */
    CHECK_STATUS(net_auth_connect(fd, NET_AUTH_ROLE_STORE, -1, "store", "a silent peer", td_now() + 0.3),
                 TD_ERR_TIMEOUT);
    const char *why = td_last_error();
    if (!strstr(why, "a silent peer") || !strstr(why, "TANDEM_AUTH_TIMEOUT=1"))
      td_test_fail(__FILE__, __LINE__, "the handshake timeout does not name the peer and TANDEM_AUTH_TIMEOUT: %s", why);
    close(fd);
    close(lfd);
  }

  /* A wrong secret, and none: turned away, nothing written. */
  char *wrong_args[] = {"wrong-client", addr, NULL};
  const char *wrong_env[] = {"TANDEM_SECRET=" SECRET_B, NULL};
  CHECK_EQ_INT(wait_exit(spawn_self(wrong_args, wrong_env, -1)), 0);
  const char *none_env[] = {"TANDEM_SECRET", "TANDEM_SECRET_FILE", NULL};
  CHECK_EQ_INT(wait_exit(spawn_self(wrong_args, none_env, -1)), 0);
  /* A secret file others can read is refused, never used. */
  char path[] = "/tmp/tandem-sec-secret-XXXXXX";
  int sfd = mkstemp(path);
  CHECK(sfd >= 0);
  CHECK(write(sfd, SECRET_A "\n", strlen(SECRET_A) + 1) == (ssize_t)strlen(SECRET_A) + 1);
  close(sfd);
  CHECK(chmod(path, 0644) == 0);
  char file_env_buf[128];
  snprintf(file_env_buf, sizeof file_env_buf, "TANDEM_SECRET_FILE=%s", path);
  const char *loose_env[] = {"TANDEM_SECRET", file_env_buf, NULL};
  char *loose_args[] = {"loose-file", addr, NULL};
  CHECK_EQ_INT(wait_exit(spawn_self(loose_args, loose_env, -1)), 0);
  CHECK(chmod(path, 0600) == 0);
  char *file_args[] = {"file-client", addr, NULL};
  CHECK_EQ_INT(wait_exit(spawn_self(file_args, loose_env, -1)), 0); /* 0600: accepted */
  unlink(path);

  /* Raw requests without a handshake: set, get and wait get no answer. */
  uint32_t ops[] = {STORE_SET, STORE_GET, STORE_WAIT, STORE_ADD, STORE_DELETE};
  for (size_t i = 0; i < TD_ARRAY_SIZE(ops); i++) {
    int fd = raw_connect(addr);
    send_request(fd, ops[i], "k", ops[i] == STORE_SET ? 6 : 0, 0, ops[i] == STORE_WAIT ? 100 : 1, "hacked");
    bool closed;
    double t0 = td_now();
    CHECK_EQ_INT(drain(fd, 3.0, &closed), 0);
    CHECK(closed);
    CHECK(td_now() - t0 < 1.5);
    close(fd);
  }
  /* A hello, then a made-up proof: only the challenge comes back. */
  {
    int fd = raw_connect(addr);
    net_auth_hello h = {.role = NET_AUTH_ROLE_STORE, .rank = -1};
    memset(h.nonce, 7, sizeof h.nonce);
    unsigned char buf[NET_AUTH_HELLO_BYTES], proof[32];
    net_auth_encode_hello(buf, &h);
    CHECK_OK(net_send_all(fd, buf, sizeof buf, td_now() + 2));
    CHECK_OK(net_recv_all(fd, buf, NET_AUTH_MSG_BYTES, td_now() + 2));
    memset(proof, 0x5a, sizeof proof);
    net_auth_encode_msg(buf, proof);
    CHECK_OK(net_send_all(fd, buf, NET_AUTH_MSG_BYTES, td_now() + 2));
    send_request(fd, STORE_GET, "k", 0, 0, 0, NULL);
    bool closed;
    CHECK_EQ_INT(drain(fd, 3.0, &closed), 0);
    CHECK(closed);
    close(fd);
  }
  /* A silent connector is closed after TANDEM_AUTH_TIMEOUT (1 s here) and
   * holds nobody up meanwhile. */
  {
    int fd = raw_connect(addr);
    double t0 = td_now();
    char *v = NULL;
    CHECK_OK(store_wait_str(ok, "k", 1.0, &v));
    CHECK(strcmp(v, "original") == 0);
    free(v);
    CHECK(td_now() - t0 < 0.5);
    bool closed;
    CHECK_EQ_INT(drain(fd, 4.0, &closed), 0);
    CHECK(closed);
    CHECK(td_now() - t0 < 3.0);
    close(fd);
  }
  /* Authenticated but oversized (limit 1 MiB here; 64 MiB by default), and
   * a garbage header: each closes only its own connection. */
  char *big_args[] = {"oversize", addr, "1048577", "0", NULL};
  CHECK_EQ_INT(wait_exit(spawn_self(big_args, NULL, -1)), 0);
  char *big2_args[] = {"oversize", addr, "600000", "600000", NULL}; /* each fine, together too big */
  CHECK_EQ_INT(wait_exit(spawn_self(big2_args, NULL, -1)), 0);
  char *huge_args[] = {"oversize", addr, "18446744073709551615", "18446744073709551615", NULL};
  CHECK_EQ_INT(wait_exit(spawn_self(huge_args, NULL, -1)), 0);
  /* The total: 4 MiB here. Three 1000 KiB values fit, the fifth does not
   * and gets an error; the store keeps serving. */
  char *chunk = malloc(1000 * 1024);
  CHECK(chunk);
  memset(chunk, 'x', 1000 * 1024);
  for (int i = 0; i < 3; i++) {
    char key[16];
    snprintf(key, sizeof key, "fill%d", i);
    CHECK_OK(store_set(ok, key, chunk, 1000 * 1024));
  }
  td_status st = TD_OK;
  for (int i = 3; i < 6 && st == TD_OK; i++) {
    char key[16];
    snprintf(key, sizeof key, "fill%d", i);
    st = store_set(ok, key, chunk, 1000 * 1024);
  }
  CHECK(st != TD_OK);
  CHECK(strstr(td_last_error(), "TANDEM_STORE_MAX_BYTES") != NULL);
  free(chunk);
  for (int i = 0; i < 6; i++) {
    char key[16];
    snprintf(key, sizeof key, "fill%d", i);
    int existed;
    CHECK_OK(store_delete(ok, key, &existed));
  }
  /* A wait with a timeout from the wire beyond any deadline arithmetic is
   * a wait without a deadline; a shorter waiter is still timed out. */
  {
    int fd = raw_connect(addr);
    CHECK_OK(net_auth_connect(fd, NET_AUTH_ROLE_STORE, -1, "store", "store", td_now() + 5));
    send_request(fd, STORE_WAIT, "later", 0, 0, INT64_MAX, NULL);
    td_store *other = NULL;
    CHECK_OK(store_connect(addr, 5.0, &other));
    char *v = NULL;
    double t0 = td_now();
    CHECK_STATUS(store_wait_str(other, "never", 0.2, &v), TD_ERR_TIMEOUT);
    CHECK(td_now() - t0 < 2.0);
    CHECK_OK(store_set_str(other, "later", "now"));
    unsigned char resp[STORE_RESP_HEADER + 3];
    CHECK_OK(net_recv_all(fd, resp, sizeof resp, td_now() + 5));
    CHECK(memcmp(resp + STORE_RESP_HEADER, "now", 3) == 0);
    close(fd);
    store_close(other);
  }
  /* The connection limit (40 here): the 41st is refused at once, and a slot
   * frees when a connection goes. */
  {
    int fds[40];
    int n_open = 0;
    for (; n_open < 39; n_open++) { /* + ok = 40; authenticated, so that none times out */
      fds[n_open] = raw_connect(addr);
      CHECK_OK(net_auth_connect(fds[n_open], NET_AUTH_ROLE_STORE, -1, "store", "store", td_now() + 5));
    }
    int extra = raw_connect(addr);
    bool closed;
    CHECK_EQ_INT(drain(extra, 3.0, &closed), 0);
    CHECK(closed);
    close(extra);
    for (int i = 0; i < n_open; i++) close(fds[i]);
    td_store *again = NULL;
    double t0 = td_now();
    while (store_connect(addr, 5.0, &again) != TD_OK) {
      CHECK(td_now() - t0 < 5.0); /* the server notices the closes within a poll round */
      msleep(20);
    }
    store_close(again);
  }
  /* Nothing a stranger sent changed anything. */
  char *v = NULL;
  CHECK_OK(store_wait_str(ok, "k", 1.0, &v));
  CHECK(strcmp(v, "original") == 0);
  free(v);
  int found = 1;
  void *raw = NULL;
  size_t len;
  CHECK_OK(store_get(ok, "stranger", &raw, &len, &found));
  CHECK_EQ_INT(found, 0);
  store_close(ok);
  store_server_stop(server);
}

/* ---- tcp ---- */

/* The port of a TCP socket process pid listens on (its only listener). */
static int find_listen_port(pid_t pid, int not_port, double timeout_s) {
  double deadline = td_now() + timeout_s;
  while (td_now() < deadline) {
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(dir);
    unsigned long inodes[64];
    int n_inodes = 0;
    for (struct dirent *e; d && (e = readdir(d)) && n_inodes < 64;) {
      char path[600], link[64];
      snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
      ssize_t n = readlink(path, link, sizeof link - 1);
      if (n <= 0) continue;
      link[n] = '\0';
      if (sscanf(link, "socket:[%lu]", &inodes[n_inodes]) == 1) n_inodes++;
    }
    if (d) closedir(d);
    FILE *f = fopen("/proc/net/tcp", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
      unsigned port, st;
      unsigned long inode;
      if (sscanf(line, " %*d: %*x:%x %*x:%*x %x %*x:%*x %*x:%*x %*x %*d %*d %lu", &port, &st, &inode) != 3) continue;
      if (st != 0x0A || (int)port == not_port) continue; /* not_port: ours, inherited until exec */
      for (int i = 0; i < n_inodes; i++)
        if (inodes[i] == inode) {
          fclose(f);
          return (int)port;
        }
    }
    if (f) fclose(f);
    msleep(10);
  }
  return -1;
}

typedef struct {
  int port;
  const char *kind; /* "old-hello", "bad-proof", "silent" */
  const char *prefix;
  int connected_pipe; /* write one byte once connected */
  int ok;             /* result: 1 = the stranger got nothing and was closed */
  double closed_after;
} attacker;

static void *tcp_attacker(void *arg) {
  attacker *a = arg;
  int fd;
  CHECK_OK(net_connect("127.0.0.1", a->port, 5.0, &fd));
  double t0 = td_now();
  size_t expect = 0;
  if (!strcmp(a->kind, "old-hello")) {
    /* main's hello: magic "TDHC", rank 1, FNV-1a of the communicator prefix. */
    unsigned char h[16];
    uint64_t hash = 1469598103934665603ull;
    for (const char *p = a->prefix; *p; p++) hash = (hash ^ (unsigned char)*p) * 1099511628211ull;
    td_put_le32(h, 0x54444843u);
    td_put_le32(h + 4, 1);
    td_put_le64(h + 8, hash);
    CHECK_OK(net_send_all(fd, h, sizeof h, td_now() + 2));
  } else if (!strcmp(a->kind, "bad-proof")) {
    net_auth_hello h = {.role = NET_AUTH_ROLE_TCP, .rank = 1};
    memset(h.nonce, 3, sizeof h.nonce);
    unsigned char buf[NET_AUTH_HELLO_BYTES], proof[32];
    net_auth_encode_hello(buf, &h);
    CHECK_OK(net_send_all(fd, buf, sizeof buf, td_now() + 2));
    memset(proof, 0xa5, sizeof proof);
    net_auth_encode_msg(buf, proof);
    CHECK_OK(net_send_all(fd, buf, NET_AUTH_MSG_BYTES, td_now() + 2));
    expect = NET_AUTH_MSG_BYTES; /* the challenge, and nothing after it */
  }
  char byte = 1;
  CHECK(write(a->connected_pipe, &byte, 1) == 1);
  bool closed;
  size_t got = drain(fd, 60.0, &closed);
  a->closed_after = td_now() - t0;
  a->ok = closed && got == expect;
  close(fd);
  return NULL;
}

static int mode_tcp_rank(void) {
  int rank = atoi(getenv("TANDEM_RANK"));
  td_comm *comm = NULL;
  CHECK_OK(td_comm_init(&comm));
  CHECK_EQ_INT(strcmp(td_comm_transport(comm), "tcp"), 0);
  enum { N = 1001 };
  float *x = malloc(N * sizeof *x);
  for (int i = 0; i < N; i++) x[i] = (float)(i % 13) + (float)rank * 0.5f;
  CHECK_OK(td_allreduce(x, x, N, TD_F32, TD_SUM, comm));
  for (int i = 0; i < N; i++) CHECK_CLOSE(x[i], 2.0 * (i % 13) + 0.5, 0, 0);
  free(x);
  CHECK_OK(td_comm_finalize(comm));
  td_comm_destroy(comm);
  return 0;
}

/* A connector with the wrong secret against rank 0's listener; writes a
 * byte to notify_fd once connected. */
static int mode_tcp_wrong(int port, int notify_fd) {
  int fd;
  CHECK_OK(net_connect("127.0.0.1", port, 5.0, &fd));
  char byte = 1;
  if (write(notify_fd, &byte, 1) != 1) return 3;
  td_status st = net_auth_connect(fd, NET_AUTH_ROLE_TCP, 1, "tcp", "rank 0", td_now() + 60);
  close(fd);
  if (st == TD_OK) return 1;
  if (strstr(td_last_error(), SECRET_A) || strstr(td_last_error(), SECRET_B)) return 2;
  return 0;
}

static void test_tcp(void) {
  setenv("TANDEM_SECRET", SECRET_A, 1);
  td_store_server *server = NULL;
  CHECK_OK(store_server_start("127.0.0.1", 0, &server));
  char addr[64], job[64], prefix[80], store_env[96], job_env[96];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", store_server_port(server));
  snprintf(job, sizeof job, "sec%d", (int)getpid());
  snprintf(prefix, sizeof prefix, "%s/c0", job);
  snprintf(store_env, sizeof store_env, "TANDEM_STORE=%s", addr);
  snprintf(job_env, sizeof job_env, "TANDEM_JOB_ID=%s", job);
  int go[2];
  CHECK(pipe(go) == 0);
  char *rank_args[] = {"tcp-rank", NULL};
  const char *env0[] = {"TANDEM_RANK=0", "TANDEM_WORLD_SIZE=2", "TANDEM_TRANSPORT=tcp", "TANDEM_AUTH_TIMEOUT=1",
                        "TANDEM_LOCAL_RANK", "TANDEM_LOCAL_SIZE", store_env, job_env, NULL};
  const char *env1[] = {"TANDEM_RANK=1", "TANDEM_WORLD_SIZE=2", "TANDEM_TRANSPORT=tcp", "TANDEM_AUTH_TIMEOUT=1",
                        "TANDEM_TEST_TRANSPORT_GATE_FD=0",
                        "TANDEM_LOCAL_RANK", "TANDEM_LOCAL_SIZE", store_env, job_env, NULL};
  pid_t r0 = spawn_self(rank_args, env0, -1);
  pid_t r1 = spawn_self(rank_args, env1, go[0]);
  close(go[0]);
  int port = find_listen_port(r0, store_server_port(server), 30.0);
  CHECK(port > 0);

  /* The strangers queue at rank 0's listener before rank 1 connects. */
  int connected[2];
  CHECK(pipe(connected) == 0);
  attacker att[3] = {{port, "old-hello", prefix, connected[1], 0, 0},
                     {port, "bad-proof", prefix, connected[1], 0, 0},
                     {port, "silent", prefix, connected[1], 0, 0}};
  pthread_t threads[3];
  for (int i = 0; i < 3; i++) CHECK(pthread_create(&threads[i], NULL, tcp_attacker, &att[i]) == 0);
  char port_text[16];
  snprintf(port_text, sizeof port_text, "%d", port);
  char notify_text[16];
  snprintf(notify_text, sizeof notify_text, "%d", connected[1]);
  char *wrong_args[] = {"tcp-wrong", port_text, notify_text, NULL};
  const char *wrong_env[] = {"TANDEM_SECRET=" SECRET_B, NULL};
  pid_t wrong = spawn_self(wrong_args, wrong_env, -1);
  /* All four strangers are in rank 0's accept queue before rank 1 starts. */
  for (int i = 0; i < 4; i++) {
    char byte;
    CHECK(read(connected[0], &byte, 1) == 1);
  }
  char byte = 'g';
  CHECK(write(go[1], &byte, 1) == 1);
  close(go[1]);
  CHECK_EQ_INT(wait_exit(r0), 0);
  CHECK_EQ_INT(wait_exit(r1), 0);
  CHECK_EQ_INT(wait_exit(wrong), 0);
  for (int i = 0; i < 3; i++) {
    pthread_join(threads[i], NULL);
    if (!att[i].ok) td_test_fail(__FILE__, __LINE__, "stranger '%s' was not simply turned away", att[i].kind);
  }
  /* The silent one was dropped after TANDEM_AUTH_TIMEOUT, not at the end. */
  CHECK(att[2].closed_after < 20.0);
  close(connected[0]);
  close(connected[1]);
  store_server_stop(server);
}

/* ---- shm ---- */

static int mode_shm_rank(void) {
  int rank = atoi(getenv("TANDEM_RANK"));
  td_comm *comm = NULL;
  td_status st = td_comm_init(&comm);
  if (st != TD_OK) {
    fprintf(stderr, "rank %d: %s\n", rank, td_last_error());
    return 3;
  }
  td_comm_destroy(comm);
  return 0;
}

static void test_shm(void) {
  /* Unit level: loose mode, wrong size, foreign names. */
  char name[128];
  void *a = NULL;
  CHECK_OK(net_shm_create("sec-test", 8192, name, sizeof name, &a));
  void *b = NULL;
  CHECK_OK(net_shm_open(name, 8192, &b));
  net_shm_unmap(b, 8192);
  CHECK_STATUS(net_shm_open(name, 4096, &b), TD_ERR_INVALID_ARGUMENT); /* size must match exactly */
  CHECK(strstr(td_last_error(), name) != NULL);
  char path[160];
  snprintf(path, sizeof path, "/dev/shm%s", name);
  CHECK(chmod(path, 0666) == 0);
  CHECK_STATUS(net_shm_open(name, 8192, &b), TD_ERR_INVALID_ARGUMENT);
  CHECK(strstr(td_last_error(), name) && strstr(td_last_error(), "mode"));
  net_shm_unlink(name);
  net_shm_unmap(a, 8192);
  CHECK_STATUS(net_shm_open("/../../etc/passwd", 4096, &b), TD_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(net_shm_open("/someone-else", 4096, &b), TD_ERR_INVALID_ARGUMENT);

  /* A 2-rank shm job whose header is tampered with before rank 1 maps it. */
  setenv("TANDEM_SECRET", SECRET_A, 1);
  td_store_server *server = NULL;
  CHECK_OK(store_server_start("127.0.0.1", 0, &server));
  char store_env[96], job_env[96], job[64];
  snprintf(store_env, sizeof store_env, "TANDEM_STORE=127.0.0.1:%d", store_server_port(server));
  snprintf(job, sizeof job, "secshm%d", (int)getpid());
  snprintf(job_env, sizeof job_env, "TANDEM_JOB_ID=%s", job);
  int go[2], err1[2];
  CHECK(pipe(go) == 0);
  char *rank_args[] = {"shm-rank", NULL};
  const char *env0[] = {"TANDEM_RANK=0", "TANDEM_WORLD_SIZE=2", "TANDEM_TRANSPORT=shm", "TANDEM_CONNECT_TIMEOUT=5",
                        "TANDEM_LOCAL_RANK", "TANDEM_LOCAL_SIZE", store_env, job_env, NULL};
  const char *env1[] = {"TANDEM_RANK=1", "TANDEM_WORLD_SIZE=2", "TANDEM_TRANSPORT=shm", "TANDEM_CONNECT_TIMEOUT=5",
                        "TANDEM_TEST_TRANSPORT_GATE_FD=0",
                        "TANDEM_LOCAL_RANK", "TANDEM_LOCAL_SIZE", store_env, job_env, NULL};
  CHECK(pipe(err1) == 0);
  pid_t r0 = spawn_self(rank_args, env0, -1);
  pid_t r1 = spawn_self_err(rank_args, env1, go[0], err1[1]); /* its stderr comes back through a pipe */
  close(err1[1]);
  close(go[0]);
  /* Find rank 0's segment once its header is complete, and tamper with it:
   * FIFOs far larger than the segment. */
  char pattern[160];
  snprintf(pattern, sizeof pattern, "/dev/shm/tandem-%s*", job);
  double t0 = td_now();
  bool tampered = false;
  char seg[256] = "";
  while (!tampered && td_now() - t0 < 30) {
    glob_t g;
    if (glob(pattern, 0, NULL, &g) == 0 && g.gl_pathc == 1) {
      td_strlcpy(seg, g.gl_pathv[0], sizeof seg);
      int fd = open(seg, O_RDWR);
      if (fd >= 0) {
        shm_seg_header *h = mmap(NULL, sizeof *h, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (h != MAP_FAILED) {
          if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) == SHM_MAGIC) {
            h->fifo_bytes = (uint64_t)1 << 40;
            tampered = true;
          }
          munmap(h, sizeof *h);
        }
        close(fd);
      }
    }
    globfree(&g);
    if (!tampered) msleep(10);
  }
  CHECK(tampered);
  char byte = 'g';
  CHECK(write(go[1], &byte, 1) == 1);
  close(go[1]);
  char err[4096];
  size_t got = 0;
  ssize_t n;
  while (got + 1 < sizeof err && (n = read(err1[0], err + got, sizeof err - 1 - got)) > 0) got += (size_t)n;
  err[got] = '\0';
  close(err1[0]);
  CHECK_EQ_INT(wait_exit(r1), 3);
  (void)wait_exit(r0); /* it fails too: rank 1 never maps */
  const char *seg_name = strrchr(seg, '/');
  if (!strstr(err, "refusing shared-memory segment") || !strstr(err, seg_name) || !strstr(err, "FIFO size"))
    td_test_fail(__FILE__, __LINE__, "rank 1 did not refuse the tampered segment %s by name: %s", seg_name, err);
  store_server_stop(server);
}

/* ---- flood against a running 4-rank job ---- */

/* 1,000 junk connections, 50 open at a time, from a process without the
 * secret: random bytes, store requests without a handshake, announced huge
 * requests, hellos that stop. Exit 0 if none got an answer beyond a
 * challenge. */
static int mode_flood(const char *addr) {
  int bad = 0;
  for (int round = 0; round < 20; round++) {
    int fds[50];
    for (int i = 0; i < 50; i++) {
      fds[i] = raw_connect(addr);
      int kind = (round * 50 + i) % 4;
      if (kind == 0) {
        unsigned char junk[200];
        for (size_t k = 0; k < sizeof junk; k++) junk[k] = (unsigned char)(td_random_u64() & 0xff);
        (void)net_send_all(fds[i], junk, sizeof junk, td_now() + 2);
      } else if (kind == 1) {
        send_request(fds[i], STORE_SET, "stranger", 8, 0, 0, "was here");
      } else if (kind == 2) {
        send_request(fds[i], STORE_CAS, "stranger", STORE_MAX_VALUE, STORE_MAX_VALUE, 0, NULL);
      } else {
        net_auth_hello h = {.role = NET_AUTH_ROLE_STORE, .rank = -1};
        unsigned char buf[NET_AUTH_HELLO_BYTES];
        net_auth_encode_hello(buf, &h);
        (void)net_send_all(fds[i], buf, sizeof buf, td_now() + 2);
      }
    }
    for (int i = 0; i < 50; i++) {
      bool closed;
      if ((round * 50 + i) % 4 == 3) {
        /* A hello gets the challenge and nothing more (no proof follows). */
        unsigned char challenge[NET_AUTH_MSG_BYTES], extra;
        if (net_recv_all(fds[i], challenge, sizeof challenge, td_now() + 10) != TD_OK ||
            recv(fds[i], &extra, 1, MSG_DONTWAIT) >= 0)
          bad++;
      } else if (drain(fds[i], 10.0, &closed) != 0 || !closed) {
        bad++; /* anything else is closed at once, unanswered */
      }
      close(fds[i]);
    }
  }
  if (bad) fprintf(stderr, "flood: %d junk connections got answers\n", bad);
  return bad ? 1 : 0;
}

static int mode_flood_job(void) {
  td_comm *comm = NULL;
  CHECK_OK(td_comm_init(&comm));
  int rank = td_comm_rank(comm), size = td_comm_size(comm);
  const char *addr = getenv("TANDEM_STORE");
  CHECK(addr != NULL);
  pid_t flood = -1, big = -1;
  if (rank == 0) {
    char store_arg[128];
    td_strlcpy(store_arg, addr, sizeof store_arg);
    char *flood_args[] = {"flood", store_arg, NULL};
    const char *no_secret[] = {"TANDEM_SECRET", "TANDEM_SECRET_FILE", NULL};
    flood = spawn_self(flood_args, no_secret, -1);
    char *big_args[] = {"oversize", store_arg, "67108864", "67108864", NULL};
    big = spawn_self(big_args, NULL, -1);
  }
  /* Collectives and new communicators (rendezvous through the store) for as
   * long as the flood runs (rank 0 tells the others), and at least 40 times. */
  int flood_status = -1, big_status = -1;
  for (int iter = 0;; iter++) {
    int running = 0;
    if (rank == 0) {
      int status;
      if (flood_status < 0 && waitpid(flood, &status, WNOHANG) == flood)
        flood_status = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
      if (big_status < 0 && waitpid(big, &status, WNOHANG) == big)
        big_status = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
      running = flood_status < 0 || big_status < 0;
    }
    int any_running = 0;
    CHECK_OK(td_allreduce(&running, &any_running, 1, TD_I32, TD_MAX, comm));
    if (iter >= 40 && !any_running) break;
    size_t count = (size_t[]){0, 1, 7, 1000, 65537}[iter % 5];
    double *x = malloc((count + 1) * sizeof *x);
    for (size_t i = 0; i < count; i++) x[i] = (double)(rank + 1) * (double)(i + iter);
    CHECK_OK(td_allreduce(x, x, count, TD_F64, TD_SUM, comm));
    double ranks_sum = size * (size + 1) / 2.0;
    for (size_t i = 0; i < count; i++) CHECK_CLOSE(x[i], ranks_sum * (double)(i + iter), 0, 0);
    free(x);
    if (iter % 10 == 0) {
      td_comm *sub = NULL;
      CHECK_OK(td_comm_split(comm, rank % 2, rank, &sub));
      int v = rank, sum = 0;
      CHECK_OK(td_allreduce(&v, &sum, 1, TD_I32, TD_SUM, sub));
      CHECK_EQ_INT(sum, rank % 2 == 0 ? 0 + 2 : 1 + 3);
      CHECK_OK(td_comm_finalize(sub));
      td_comm_destroy(sub);
    }
  }
  if (rank == 0) {
    CHECK_EQ_INT(flood_status, 0);
    CHECK_EQ_INT(big_status, 0);
    /* No stranger wrote a key. */
    td_store *s = NULL;
    CHECK_OK(store_connect(addr, 5.0, &s));
    void *v = NULL;
    size_t len;
    int found = 1;
    CHECK_OK(store_get(s, "stranger", &v, &len, &found));
    CHECK_EQ_INT(found, 0);
    store_close(s);
  }
  CHECK_OK(td_comm_finalize(comm));
  td_comm_destroy(comm);
  return 0;
}

/* ---- a man in the middle (issue 19 item 7) ---- */

/* One rank of a 2-rank TCP job whose connection runs through the proxy:
 * 0 = the right sum; 3 = a wrong sum (the attack went through unseen);
 * 4 = the allreduce failed with a message naming the other rank (and, on
 * rank 0, which receives the altered record, saying it failed its check);
 * 5 = failed some other way. */
static int mode_mitm_rank(void) {
  int rank = atoi(getenv("TANDEM_RANK"));
  td_comm *comm = NULL;
  CHECK_OK(td_comm_init(&comm));
  CHECK_EQ_INT(strcmp(td_comm_transport(comm), "tcp"), 0);
  enum { N = 300001 }; /* 1.2 MB: several records */
  float *x = malloc(N * sizeof *x);
  for (int i = 0; i < N; i++) x[i] = (float)(i % 13) + (float)rank * 0.5f;
  td_status st = td_allreduce(x, x, N, TD_F32, TD_SUM, comm);
  int rc = 0;
  if (st != TD_OK) {
    const char *why = td_last_error();
    char other[32];
    snprintf(other, sizeof other, "rank %d", 1 - rank);
    fprintf(stderr, "[mitm rank %d] %s: %s\n", rank, td_status_str(st), why);
    rc = strstr(why, other) && (rank == 1 || strstr(why, "failed its integrity check")) ? 4 : 5;
  } else {
    for (int i = 0; i < N && !rc; i++)
      if (x[i] != 2.0f * (float)(i % 13) + 0.5f) {
        fprintf(stderr, "[mitm rank %d] element %d is %g, not %g: a silently wrong sum\n", rank, i, x[i],
                2.0 * (i % 13) + 0.5);
        rc = 3;
      }
    if (!rc) CHECK_OK(td_comm_finalize(comm));
  }
  free(x);
  td_comm_destroy(comm);
  return rc;
}

typedef struct mitm {
  int listen_fd, upstream_port;
  long flip_at;  /* byte of the rank 1 -> rank 0 direction to flip (0-based) */
  long forwarded; /* bytes forwarded that way */
  bool flipped;
} mitm;

/* The proxy: takes rank 1's connection (redirected here by the netfilter
 * rule), connects to rank 0 from 127.0.0.2 (which the rule leaves alone),
 * and copies both ways, flipping the lowest bit of one byte going to rank 0. */
static void *mitm_main(void *arg) {
  mitm *m = arg;
  int client = accept(m->listen_fd, NULL, NULL);
  CHECK(client >= 0);
  int up = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in src = {.sin_family = AF_INET}, dst = {.sin_family = AF_INET, .sin_port = htons((uint16_t)m->upstream_port)};
  inet_pton(AF_INET, "127.0.0.2", &src.sin_addr);
  inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
  CHECK(up >= 0 && bind(up, (struct sockaddr *)&src, sizeof src) == 0);
  CHECK(connect(up, (struct sockaddr *)&dst, sizeof dst) == 0);
  int fds[2] = {client, up}; /* direction k: fds[k] -> fds[1 - k]; k = 0 goes to rank 0 */
  bool open_dir[2] = {true, true};
  static char buf[1 << 16];
  double deadline = td_now() + 60;
  while ((open_dir[0] || open_dir[1]) && td_now() < deadline) {
    struct pollfd p[2] = {{.fd = fds[0], .events = open_dir[0] ? POLLIN : 0},
                          {.fd = fds[1], .events = open_dir[1] ? POLLIN : 0}};
    if (poll(p, 2, 200) <= 0) continue;
    for (int k = 0; k < 2; k++) {
      if (!open_dir[k] || !(p[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t n = recv(fds[k], buf, sizeof buf, 0);
      if (n <= 0) {
        open_dir[k] = false;
        shutdown(fds[1 - k], SHUT_WR);
        continue;
      }
      if (k == 0) {
        if (!m->flipped && m->flip_at >= m->forwarded && m->flip_at < m->forwarded + n) {
          buf[m->flip_at - m->forwarded] ^= 1;
          m->flipped = true;
        }
        m->forwarded += n;
      }
      if (net_send_all(fds[1 - k], buf, (size_t)n, td_now() + 30) != TD_OK) open_dir[k] = false;
    }
  }
  close(client);
  close(up);
  return NULL;
}

/* Runs one 2-rank job through the proxy with TANDEM_TCP_PROTECT=mode;
 * returns the two ranks' exit codes. */
static void mitm_job(const char *mode, int rc_out[2], long *flipped_at) {
  td_store_server *server = NULL;
  CHECK_OK(store_server_start("127.0.0.1", 0, &server));
  char store_env[96], job_env[96], protect_env[64];
  snprintf(store_env, sizeof store_env, "TANDEM_STORE=127.0.0.1:%d", store_server_port(server));
  snprintf(job_env, sizeof job_env, "TANDEM_JOB_ID=mitm%d%s", (int)getpid(), mode);
  snprintf(protect_env, sizeof protect_env, "TANDEM_TCP_PROTECT=%s", mode);
  int go[2];
  CHECK(pipe(go) == 0);
  char *rank_args[] = {"mitm-rank", NULL};
  const char *env0[] = {"TANDEM_RANK=0", "TANDEM_WORLD_SIZE=2", "TANDEM_TRANSPORT=tcp", "TANDEM_LOCAL_RANK",
                        "TANDEM_LOCAL_SIZE", "TANDEM_TIMEOUT=30", store_env, job_env, protect_env, NULL};
  const char *env1[] = {"TANDEM_RANK=1", "TANDEM_WORLD_SIZE=2", "TANDEM_TRANSPORT=tcp", "TANDEM_LOCAL_RANK",
                        "TANDEM_LOCAL_SIZE", "TANDEM_TIMEOUT=30", "TANDEM_TEST_TRANSPORT_GATE_FD=0",
                        store_env, job_env, protect_env, NULL};
  pid_t r0 = spawn_self(rank_args, env0, -1);
  pid_t r1 = spawn_self(rank_args, env1, go[0]);
  close(go[0]);
  int port = find_listen_port(r0, store_server_port(server), 30.0);
  CHECK(port > 0);
  /* Rank 1 waits at the gate with rank 0's address in hand: route its
   * connection through the proxy. */
  mitm m = {.upstream_port = port};
  /* past the handshake (hello + proof) and 4 KiB into the data: inside the
   * first data record (or, unprotected, the payload itself, where +3 is a
   * float's exponent byte: a low mantissa bit could vanish in the sum) */
  m.flip_at = NET_AUTH_HELLO_BYTES + NET_AUTH_MSG_BYTES + 4096 + 3;
  int lfd = -1, proxy_port = 0;
  CHECK_OK(net_listen("127.0.0.1", 0, 4, &lfd, &proxy_port));
  m.listen_fd = lfd;
  char cmd[256];
  snprintf(cmd, sizeof cmd,
           "iptables -t nat -F OUTPUT && iptables -t nat -A OUTPUT -p tcp -s 127.0.0.1 -d 127.0.0.1 --dport %d "
           "-j REDIRECT --to-ports %d",
           port, proxy_port);
  CHECK(system(cmd) == 0);
  pthread_t proxy;
  CHECK(pthread_create(&proxy, NULL, mitm_main, &m) == 0);
  char byte = 'g';
  CHECK(write(go[1], &byte, 1) == 1);
  close(go[1]);
  rc_out[0] = wait_exit(r0);
  rc_out[1] = wait_exit(r1);
  pthread_join(proxy, NULL);
  close(lfd);
  CHECK(m.flipped);
  *flipped_at = m.flip_at;
  store_server_stop(server);
}

static void test_mitm(void) {
  if (geteuid() != 0 || unshare(CLONE_NEWNET) != 0 || system("ip link set lo up") != 0 ||
      system("iptables -t nat -L OUTPUT -n >/dev/null 2>&1") != 0) {
    printf("SKIPPED: security mitm needs root, a network namespace of its own and iptables' nat table (to route "
           "rank 1's connection through the proxy)\n");
    return;
  }
  setenv("TANDEM_SECRET", SECRET_A, 1);
  int rc[2];
  long at = 0;
  /* The control: unprotected, the flipped bit reaches the sum unseen. */
  mitm_job("off", rc, &at);
  if (!(rc[0] == 3 || rc[1] == 3))
    td_test_fail(__FILE__, __LINE__, "unprotected: exit codes %d %d, expected a silently wrong sum (3)", rc[0], rc[1]);
  printf("TANDEM_TCP_PROTECT=off: byte %ld flipped by the proxy -> silently wrong sum (exit %d, %d)\n", at, rc[0],
         rc[1]);
  static const char *const modes[] = {"integrity", "encrypt"};
  for (int i = 0; i < 2; i++) {
    mitm_job(modes[i], rc, &at);
    if (rc[0] != 4 || rc[1] != 4)
      td_test_fail(__FILE__, __LINE__, "TANDEM_TCP_PROTECT=%s: exit codes %d %d, expected both to fail naming the "
                                       "other rank (4)",
                   modes[i], rc[0], rc[1]);
    printf("TANDEM_TCP_PROTECT=%s: byte %ld flipped -> both ranks fail, rank 0 naming rank 1's record that failed "
           "its check\n",
           modes[i], at);
  }
}

/* ---- the per-user secret (issue 19 item 6) ---- */

/* A process of the job (same user, same home): reads the key. */
static int mode_home_peer(const char *addr) {
  td_store *st = NULL;
  CHECK_OK(store_connect(addr, 5.0, &st));
  char *v = NULL;
  CHECK_OK(store_wait_str(st, "k", 1.0, &v));
  CHECK(strcmp(v, "home job") == 0);
  free(v);
  store_close(st);
  return 0;
}

/* Loading the key must fail with `fragment` in the message. */
static int mode_home_refused(const char *fragment) {
  td_status st = net_auth_init();
  if (st == TD_OK) return 1;
  if (!strstr(td_last_error(), fragment)) {
    fprintf(stderr, "refusal without \"%s\": %s\n", fragment, td_last_error());
    return 2;
  }
  return 0;
}

/* Listen on every interface: 0 if that is allowed, 10 if refused with the
 * message that says to set a secret. */
static int mode_listen_any(void) {
  int fd = -1, port = 0;
  td_status st = net_listen(NULL, 0, 4, &fd, &port);
  if (st == TD_OK) {
    close(fd);
    return 0;
  }
  return strstr(td_last_error(), "without a job secret") && strstr(td_last_error(), "TANDEM_SECRET") ? 10 : 3;
}

/* The key this process loaded, as a MAC of a fixed message (never the secret). */
static int mode_home_mac(void) {
  CHECK_OK(net_auth_init());
  unsigned char mac[32];
  net_auth_datagram_mac("test", "m", 1, mac);
  for (int i = 0; i < 32; i++) printf("%02x", mac[i]);
  printf("\n");
  return 0;
}

static void read_all(const char *path, char *buf, size_t size) {
  FILE *f = fopen(path, "r");
  CHECK(f != NULL);
  size_t n = fread(buf, 1, size - 1, f);
  buf[n] = '\0';
  fclose(f);
}

static void test_home(void) {
  char base[] = "/tmp/tandem-sec-home-XXXXXX";
  CHECK(mkdtemp(base) != NULL);
  char home_a[128], home_b[128], home_c[128], home_d[128], home_e[128], path[256], buf[256];
  snprintf(home_a, sizeof home_a, "%s/a", base);
  snprintf(home_b, sizeof home_b, "%s/b", base);
  snprintf(home_c, sizeof home_c, "%s/c", base);
  snprintf(home_d, sizeof home_d, "%s/d", base);
  snprintf(home_e, sizeof home_e, "%s/e", base);
  CHECK(mkdir(home_a, 0700) == 0 && mkdir(home_b, 0700) == 0 && mkdir(home_c, 0700) == 0 &&
        mkdir(home_d, 0700) == 0 && mkdir(home_e, 0700) == 0);

  /* This process is a job started by a launcher that sets no secret
   * (mpirun, srun, torchrun): its key comes from $HOME/.tandem/secret,
   * created now: 64 hex digits, 0600, in a 0700 directory. */
  unsetenv("TANDEM_SECRET");
  unsetenv("TANDEM_SECRET_FILE");
  setenv("HOME", home_a, 1);
  setenv("TANDEM_AUTH_TIMEOUT", "1", 1);
  CHECK_OK(net_auth_init());
  CHECK(net_auth_have_secret());
  struct stat sb;
  snprintf(path, sizeof path, "%s/.tandem", home_a);
  CHECK(stat(path, &sb) == 0 && S_ISDIR(sb.st_mode));
  CHECK_EQ_INT(sb.st_mode & 0777, 0700);
  snprintf(path, sizeof path, "%s/.tandem/secret", home_a);
  CHECK(stat(path, &sb) == 0 && S_ISREG(sb.st_mode));
  CHECK_EQ_INT(sb.st_mode & 0777, 0600);
  CHECK_EQ_INT(sb.st_uid, geteuid());
  read_all(path, buf, sizeof buf);
  CHECK_EQ_INT(strlen(buf), 65);
  CHECK_EQ_INT(strspn(buf, "0123456789abcdef"), 64);
  CHECK(buf[64] == '\n');
  char secret_a[65];
  memcpy(secret_a, buf, 64);
  secret_a[64] = '\0';

  td_store_server *server = NULL;
  CHECK_OK(store_server_start("127.0.0.1", 0, &server));
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", store_server_port(server));
  td_store *own = NULL;
  CHECK_OK(store_connect(addr, 5.0, &own));
  CHECK_OK(store_set_str(own, "k", "home job"));

  /* Another rank of the job (same user, same home): in. */
  char home_env[160];
  snprintf(home_env, sizeof home_env, "HOME=%s", home_a);
  const char *env_a[] = {home_env, "TANDEM_SECRET", "TANDEM_SECRET_FILE", NULL};
  char *peer_args[] = {"home-peer", addr, NULL};
  CHECK_EQ_INT(wait_exit(spawn_self(peer_args, env_a, -1)), 0);
  /* Another user (another home, so another secret): turned away. */
  char home_env_b[160];
  snprintf(home_env_b, sizeof home_env_b, "HOME=%s", home_b);
  const char *env_b[] = {home_env_b, "TANDEM_SECRET", "TANDEM_SECRET_FILE", NULL};
  char *wrong_args[] = {"wrong-client", addr, NULL};
  CHECK_EQ_INT(wait_exit(spawn_self(wrong_args, env_b, -1)), 0);
  snprintf(path, sizeof path, "%s/.tandem/secret", home_b);
  read_all(path, buf, sizeof buf);
  CHECK(strncmp(buf, secret_a, 64) != 0);
  /* No home and no variable: the fixed key of old (anybody can compute
   * it): turned away too; and such a process may listen on loopback only. */
  const char *env_none[] = {"HOME", "TANDEM_SECRET", "TANDEM_SECRET_FILE", NULL};
  CHECK_EQ_INT(wait_exit(spawn_self(wrong_args, env_none, -1)), 0);
  char *listen_args[] = {"listen-any", NULL};
  CHECK_EQ_INT(wait_exit(spawn_self(listen_args, env_none, -1)), 10);
  CHECK_EQ_INT(wait_exit(spawn_self(listen_args, env_a, -1)), 0); /* with the per-user secret: allowed */
  printf("per-user secret: the job's own rank joined; another home's secret and the fixed key refused; no secret: "
         "loopback only\n");

  /* A secret file or directory others can read or write: refused, saying
   * what to run; never used. */
  snprintf(path, sizeof path, "%s/.tandem", home_c);
  CHECK(mkdir(path, 0700) == 0);
  snprintf(path, sizeof path, "%s/.tandem/secret", home_c);
  FILE *f = fopen(path, "w");
  CHECK(f != NULL);
  fprintf(f, "%s\n", secret_a);
  fclose(f);
  char home_env_c[160];
  snprintf(home_env_c, sizeof home_env_c, "HOME=%s", home_c);
  const char *env_c[] = {home_env_c, "TANDEM_SECRET", "TANDEM_SECRET_FILE", NULL};
  char *refused_args[] = {"home-refused", "chmod 600", NULL};
  static const mode_t loose[] = {0604, 0640, 0644, 0610};
  for (size_t i = 0; i < TD_ARRAY_SIZE(loose); i++) {
    CHECK(chmod(path, loose[i]) == 0);
    CHECK_EQ_INT(wait_exit(spawn_self(refused_args, env_c, -1)), 0);
  }
  CHECK(chmod(path, 0600) == 0);
  snprintf(path, sizeof path, "%s/.tandem", home_c);
  CHECK(chmod(path, 0777) == 0);
  char *refused_dir_args[] = {"home-refused", "chmod 700", NULL};
  CHECK_EQ_INT(wait_exit(spawn_self(refused_dir_args, env_c, -1)), 0);
  CHECK(chmod(path, 0700) == 0);
  char *peer_c[] = {"home-peer", addr, NULL};
  CHECK_EQ_INT(wait_exit(spawn_self(peer_c, env_c, -1)), 0); /* the same secret, now 0600: in */
  printf("per-user secret readable by group or others, or in a directory others can write: refused\n");

  /* Ranks starting at once on a fresh home all end up with one secret and
   * nothing else is left in the directory. */
  enum { N_RACE = 8 };
  char home_env_d[160];
  snprintf(home_env_d, sizeof home_env_d, "HOME=%s", home_d);
  const char *env_d[] = {home_env_d, "TANDEM_SECRET", "TANDEM_SECRET_FILE", NULL};
  char *mac_args[] = {"home-mac", NULL};
  int pipes[N_RACE][2];
  pid_t pids[N_RACE];
  for (int i = 0; i < N_RACE; i++) {
    CHECK(pipe(pipes[i]) == 0);
    /* the child's stdout is the pipe: fork copies this process's fd 1 */
    fflush(stdout);
    int saved = dup(1);
    CHECK(dup2(pipes[i][1], 1) >= 0);
    pids[i] = spawn_self(mac_args, env_d, -1);
    CHECK(dup2(saved, 1) >= 0);
    close(saved);
    close(pipes[i][1]);
  }
  char first[80] = "";
  for (int i = 0; i < N_RACE; i++) {
    char got[80] = "";
    ssize_t n = read(pipes[i][0], got, sizeof got - 1);
    close(pipes[i][0]);
    CHECK_EQ_INT(wait_exit(pids[i]), 0);
    CHECK(n == 65);
    got[n] = '\0';
    if (i == 0) memcpy(first, got, sizeof got);
    else if (strcmp(first, got) != 0) td_test_fail(__FILE__, __LINE__, "rank %d loaded another key", i);
  }
  snprintf(path, sizeof path, "%s/.tandem", home_d);
  DIR *dir = opendir(path);
  CHECK(dir != NULL);
  int entries = 0;
  for (struct dirent *e; (e = readdir(dir));)
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
      CHECK(strcmp(e->d_name, "secret") == 0);
      entries++;
    }
  closedir(dir);
  CHECK_EQ_INT(entries, 1);
  printf("%d processes starting at once on a fresh home: one secret, one key, no temporary files left\n", N_RACE);

  /* A home the user cannot write (read-only): no secret, loopback only. */
  CHECK(chmod(home_e, 0500) == 0);
  char home_env_e[160];
  snprintf(home_env_e, sizeof home_env_e, "HOME=%s", home_e);
  const char *env_e[] = {home_env_e, "TANDEM_SECRET", "TANDEM_SECRET_FILE", NULL};
  if (geteuid() != 0) CHECK_EQ_INT(wait_exit(spawn_self(listen_args, env_e, -1)), 10);
  CHECK(chmod(home_e, 0700) == 0);

  store_close(own);
  store_server_stop(server);
  char cmd[200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", base);
  CHECK(system(cmd) == 0);
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "";
  if (!strcmp(mode, "wrong-client") && argc > 2) return mode_wrong_client(argv[2]);
  if (!strcmp(mode, "loose-file") && argc > 2) {
    /* A key file readable by others is refused (no connection is tried). */
    td_store *s = NULL;
    td_status st = store_connect(argv[2], 5.0, &s);
    if (st == TD_OK) return 1;
    return strstr(td_last_error(), "chmod 600") ? 0 : 2;
  }
  if (!strcmp(mode, "file-client") && argc > 2) {
    td_store *s = NULL;
    CHECK_OK(store_connect(argv[2], 5.0, &s));
    char *v = NULL;
    CHECK_OK(store_wait_str(s, "k", 1.0, &v));
    CHECK(strcmp(v, "original") == 0);
    free(v);
    store_close(s);
    return 0;
  }
  if (!strcmp(mode, "oversize") && argc > 4)
    return mode_oversize(argv[2], strtoull(argv[3], NULL, 10), strtoull(argv[4], NULL, 10));
  if (!strcmp(mode, "tcp-rank")) return mode_tcp_rank();
  if (!strcmp(mode, "tcp-wrong") && argc > 3) return mode_tcp_wrong(atoi(argv[2]), atoi(argv[3]));
  if (!strcmp(mode, "shm-rank")) return mode_shm_rank();
  if (!strcmp(mode, "flood") && argc > 2) return mode_flood(argv[2]);
  if (!strcmp(mode, "flood-job")) return mode_flood_job();
  if (!strcmp(mode, "mitm-rank")) return mode_mitm_rank();
  if (!strcmp(mode, "home-peer") && argc > 2) return mode_home_peer(argv[2]);
  if (!strcmp(mode, "home-refused") && argc > 2) return mode_home_refused(argv[2]);
  if (!strcmp(mode, "listen-any")) return mode_listen_any();
  if (!strcmp(mode, "home-mac")) return mode_home_mac();
  signal(SIGPIPE, SIG_IGN);
  if (!strcmp(mode, "store")) {
    test_store();
  } else if (!strcmp(mode, "tcp")) {
    test_tcp();
  } else if (!strcmp(mode, "shm")) {
    test_shm();
  } else if (!strcmp(mode, "home")) {
    test_home();
  } else if (!strcmp(mode, "mitm")) {
    test_mitm();
  } else {
    fprintf(stderr, "usage: test_security store|tcp|shm|home|mitm|flood-job\n");
    return 2;
  }
  printf("security %s ok\n", mode);
  return 0;
}
