/* The Prometheus endpoint: a rank's current metrics in Prometheus' text
 * exposition format (version 0.0.4), served over HTTP on GET /metrics.
 *
 * The training thread stores numbers with td_prom_set (a mutex-protected
 * table, no I/O); one server thread answers scrapes. The server thread
 * sleeps in poll() on the listening socket and a wake pipe, so it costs
 * nothing between scrapes and stops at once on td_prom_stop. Requests are
 * handled one at a time (a scraper asks every few seconds): a request must
 * arrive whole within PROM_REQUEST_TIMEOUT_MS and fit PROM_MAX_REQUEST bytes,
 * so that a slow or hostile client cannot hold the thread or its memory.
 *
 * A job's endpoint (prometheus_job.c) is this server with another source
 * of text in front of its table: each scrape fetches and merges the ranks'
 * endpoints, within the scrape timeout Prometheus announces in its
 * X-Prometheus-Scrape-Timeout-Seconds header.
 *
 * Protection: the socket binds to 127.0.0.1 unless the caller names another
 * address, so only processes on the same host can read it. The endpoint is
 * read-only (numbers, no control) and unauthenticated, because Prometheus'
 * scraper speaks plain HTTP; exposing it beyond the host is the operator's
 * explicit choice (and then a firewall's business). */
#define _GNU_SOURCE 1
#include "base/base.h"
#include "obs/prometheus_server.h"
#include "tandem/obs.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#define PROM_MAX_SERIES 256
#define PROM_MAX_REQUEST 4096
#define PROM_REQUEST_TIMEOUT_MS 2000

typedef struct prom_series {
  char name[64];
  char labels[96]; /* `key="value",...` without braces, "" for none */
  char type[8];    /* "gauge" or "counter" */
  char help[96];
  double value;
} prom_series;

struct td_prom {
  pthread_mutex_t lock;
  prom_series series[PROM_MAX_SERIES];
  int n_series;
  int dropped; /* series refused because the table was full (reported once) */
  int hint;    /* where find_series looks first: after the series found last */
  int listen_fd;
  int wake[2]; /* td_prom_stop writes to wake[1] to end the server thread */
  int port;
  pthread_t thread;
  int thread_started;
  unsigned long scrapes;
  double serve_cpu_s; /* the server thread's CPU time after its last request (getrusage RUSAGE_THREAD) */
  /* another source of the text than the table (prometheus_job.c) */
  prom_render_fn render;
  void *render_ctx;
  void (*render_ctx_free)(void *ctx);
};

/* ---- the table ---- */

static int valid_name(const char *name) {
  if (!name || !*name || strlen(name) >= sizeof ((prom_series *)0)->name) return 0;
  for (const char *c = name; *c; c++) {
    int ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || *c == '_' || *c == ':' ||
             (c != name && *c >= '0' && *c <= '9');
    if (!ok) return 0;
  }
  return 1;
}

/* The index of NAME{LABELS} in the table, or n_series when absent. The
 * search starts after the series found last: a program sets its series in
 * the same order at every step, so each lookup usually costs one compare
 * instead of a scan of the table (the training thread pays for it). Called
 * with the lock held. */
static int find_series(td_prom *p, const char *name, const char *labels) {
  for (int k = 0; k < p->n_series; k++) {
    int i = (p->hint + k) % p->n_series;
    if (!strcmp(p->series[i].name, name) && !strcmp(p->series[i].labels, labels)) {
      p->hint = i + 1;
      return i;
    }
  }
  return p->n_series;
}

/* Set (add: add to) the value of NAME{LABELS}, creating it when absent. */
static void store_series(td_prom *p, const char *name, const char *type, const char *help, const char *labels,
                         double value, int add) {
  if (!p || !valid_name(name)) return;
  if (!labels) labels = "";
  pthread_mutex_lock(&p->lock);
  int i = find_series(p, name, labels);
  if (i == p->n_series) {
    if (p->n_series == PROM_MAX_SERIES || strlen(labels) >= sizeof p->series[0].labels) {
      if (!p->dropped++) TD_WARN("prometheus: series %s{%s} not exported (table full or labels too long)", name, labels);
      pthread_mutex_unlock(&p->lock);
      return;
    }
    prom_series *s = &p->series[p->n_series++];
    td_strlcpy(s->name, name, sizeof s->name);
    td_strlcpy(s->labels, labels, sizeof s->labels);
    td_strlcpy(s->type, type && !strcmp(type, "counter") ? "counter" : "gauge", sizeof s->type);
    td_strlcpy(s->help, help ? help : "", sizeof s->help);
    s->value = 0;
  }
  p->series[i].value = add ? p->series[i].value + value : value;
  pthread_mutex_unlock(&p->lock);
}

void td_prom_set(td_prom *p, const char *name, const char *type, const char *help, const char *labels,
                 double value) {
  store_series(p, name, type, help, labels, value, 0);
}

void td_prom_add(td_prom *p, const char *name, const char *help, const char *labels, double delta) {
  store_series(p, name, "counter", help, labels, delta, 1);
}

void td_prom_clear(td_prom *p) {
  if (!p) return;
  pthread_mutex_lock(&p->lock);
  p->n_series = 0;
  p->hint = 0;
  pthread_mutex_unlock(&p->lock);
}

void td_prom_begin(td_prom *p) {
  if (p) pthread_mutex_lock(&p->lock);
}
void td_prom_end(td_prom *p) {
  if (p) pthread_mutex_unlock(&p->lock);
}

/* The table's exposition text: series grouped by name, each group with its
 * HELP and TYPE line once (the format requires a family's samples to be
 * together), after `head` (head_len bytes, may be 0). */
static char *render_table(td_prom *p, const char *head, size_t head_len, size_t *len_out) {
  td_buf out = {0};
  td_buf_append(&out, head, head_len);
  pthread_mutex_lock(&p->lock);
  char *done = calloc((size_t)p->n_series + 1, 1);
  if (!done) out.failed = 1;
  for (int i = 0; !out.failed && i < p->n_series; i++) {
    if (done[i]) continue;
    const prom_series *f = &p->series[i];
    if (f->help[0]) td_buf_printf(&out, "# HELP %s %s\n", f->name, f->help);
    td_buf_printf(&out, "# TYPE %s %s\n", f->name, f->type);
    for (int j = i; j < p->n_series; j++) {
      const prom_series *s = &p->series[j];
      if (done[j] || strcmp(s->name, f->name)) continue;
      done[j] = 1;
      char num[40];
      if (isnan(s->value)) snprintf(num, sizeof num, "NaN");
      else if (isinf(s->value)) snprintf(num, sizeof num, s->value > 0 ? "+Inf" : "-Inf");
      else snprintf(num, sizeof num, "%.17g", s->value);
      if (s->labels[0]) td_buf_printf(&out, "%s{%s} %s\n", s->name, s->labels, num);
      else td_buf_printf(&out, "%s %s\n", s->name, num);
    }
  }
  pthread_mutex_unlock(&p->lock);
  free(done);
  return td_buf_take(&out, len_out);
}

/* The text a scrape gets: a job endpoint's merged ranks (fetched within
 * budget_s, <= 0: their default bound), then the table. */
static char *render_scrape(td_prom *p, double budget_s, size_t *len_out) {
  size_t head_len = 0;
  char *head = NULL;
  if (p->render && !(head = p->render(p->render_ctx, budget_s, &head_len))) return NULL;
  char *text = render_table(p, head ? head : "", head_len, len_out);
  free(head);
  return text;
}

char *td_prom_render(td_prom *p, size_t *len_out) { return render_scrape(p, 0, len_out); }

void *prom_render_ctx(td_prom *p, prom_render_fn render) { return p && p->render == render ? p->render_ctx : NULL; }

/* The seconds Prometheus gives this scrape (its scrape_timeout, sent as
 * X-Prometheus-Scrape-Timeout-Seconds), less a margin for the answer to
 * travel, or 0 when the request does not say. */
static double scrape_budget(const char *req) {
  static const char name[] = "\nx-prometheus-scrape-timeout-seconds:";
  for (const char *at = req; (at = strchr(at, '\n')); at++) {
    if (strncasecmp(at, name, sizeof name - 1) != 0) continue;
    double timeout = strtod(at + sizeof name - 1, NULL);
    return timeout > 0 ? TD_MAX(0.05, timeout * 0.8 - 0.05) : 0;
  }
  return 0;
}

/* ---- the HTTP side ---- */

static void send_all(int fd, const char *data, size_t len) {
  while (len > 0) {
    ssize_t n = send(fd, data, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      struct pollfd pfd = {.fd = fd, .events = POLLOUT};
      if (poll(&pfd, 1, PROM_REQUEST_TIMEOUT_MS) <= 0) return; /* the client stopped reading */
      continue;
    }
    if (n <= 0) return;
    data += n;
    len -= (size_t)n;
  }
}

static void send_response(int fd, const char *status, const char *type, const char *body, size_t body_len) {
  char head[256];
  int n = snprintf(head, sizeof head,
                   "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n", status,
                   type, body_len);
  send_all(fd, head, (size_t)n);
  send_all(fd, body, body_len);
}

/* Read one request head (up to the blank line) within the time and size
 * bounds, then answer it. Only the request line matters: GET /metrics (a
 * query string is ignored) gets the metrics, other paths 404, other methods
 * 405, a request too large 431, a truncated or slow one nothing. */
static void serve_one(td_prom *p, int fd) {
  char req[PROM_MAX_REQUEST + 1];
  size_t have = 0;
  double deadline = td_now() + PROM_REQUEST_TIMEOUT_MS / 1000.0;
  while (!memmem(req, have, "\r\n\r\n", 4) && !memmem(req, have, "\n\n", 2)) {
    if (have == PROM_MAX_REQUEST) {
      static const char msg[] = "request header too large\n";
      send_response(fd, "431 Request Header Fields Too Large", "text/plain", msg, sizeof msg - 1);
      return;
    }
    int left_ms = (int)((deadline - td_now()) * 1000);
    if (left_ms <= 0) return;
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int r = poll(&pfd, 1, left_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return;
    ssize_t n = recv(fd, req + have, PROM_MAX_REQUEST - have, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return;
    have += (size_t)n;
  }
  req[have] = 0;
  if (strncmp(req, "GET ", 4) != 0) {
    static const char msg[] = "only GET /metrics is served\n";
    send_response(fd, "405 Method Not Allowed", "text/plain", msg, sizeof msg - 1);
    return;
  }
  const char *path = req + 4;
  size_t path_len = strcspn(path, " ?\r\n");
  if (path_len != 8 || strncmp(path, "/metrics", 8) != 0) {
    static const char msg[] = "not found: this endpoint serves GET /metrics only\n";
    send_response(fd, "404 Not Found", "text/plain", msg, sizeof msg - 1);
    return;
  }
  size_t len = 0;
  char *body = render_scrape(p, scrape_budget(req), &len);
  if (!body) {
    static const char msg[] = "out of memory\n";
    send_response(fd, "500 Internal Server Error", "text/plain", msg, sizeof msg - 1);
    return;
  }
  send_response(fd, "200 OK", "text/plain; version=0.0.4; charset=utf-8", body, len);
  free(body);
  pthread_mutex_lock(&p->lock);
  p->scrapes++;
  pthread_mutex_unlock(&p->lock);
}

/* Closing a socket with unread input makes the kernel send a reset, which
 * can destroy the reply before the client reads it (a 431 after a too large
 * request). So: end our side, then discard what the client still sends, for
 * at most 200 ms and 64 KiB. */
static void close_gracefully(int fd) {
  shutdown(fd, SHUT_WR);
  char sink[4096];
  size_t drained = 0;
  double deadline = td_now() + 0.2;
  while (drained < 65536) {
    int left_ms = (int)((deadline - td_now()) * 1000);
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    if (left_ms <= 0 || poll(&pfd, 1, left_ms) <= 0) break;
    ssize_t n = recv(fd, sink, sizeof sink, 0);
    if (n <= 0) break;
    drained += (size_t)n;
  }
  close(fd);
}

static void *server_main(void *arg) {
  td_prom *p = arg;
  for (;;) {
    struct pollfd pfd[2] = {{.fd = p->listen_fd, .events = POLLIN}, {.fd = p->wake[0], .events = POLLIN}};
    int r = poll(pfd, 2, -1); /* blocks until a client or td_prom_stop */
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 || pfd[1].revents) break;
    if (!(pfd[0].revents & POLLIN)) continue;
    int fd = accept4(p->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue; /* EAGAIN, a client gone before accept, or EMFILE: try again at the next poll */
    serve_one(p, fd);
    close_gracefully(fd);
    struct rusage ru;
    if (getrusage(RUSAGE_THREAD, &ru) == 0) {
      pthread_mutex_lock(&p->lock);
      p->serve_cpu_s = (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                       (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
      pthread_mutex_unlock(&p->lock);
    }
  }
  return NULL;
}

td_status td_prom_start(const char *bind_addr, int port, td_prom **out) {
  return prom_start_with(bind_addr, port, NULL, NULL, NULL, out);
}

td_status prom_start_with(const char *bind_addr, int port, prom_render_fn render, void *render_ctx,
                          void (*render_ctx_free)(void *ctx), td_prom **out) {
  *out = NULL;
  if (port < 0 || port > 65535)
    return td_error(TD_ERR_INVALID_ARGUMENT, "prometheus: port %d is out of range (0-65535; 0 picks a free one)", port);
  const char *addr = bind_addr && *bind_addr ? bind_addr : "127.0.0.1";
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1)
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "prometheus: bind address '%s' is not an IPv4 address (give e.g. 127.0.0.1 or 0.0.0.0)", addr);
  td_prom *p = calloc(1, sizeof *p);
  if (!p) return td_error(TD_ERR_SYSTEM, "prometheus: out of memory");
  p->listen_fd = p->wake[0] = p->wake[1] = -1;
  p->render = render;
  p->render_ctx = render_ctx;
  p->render_ctx_free = render_ctx_free;
  /* recursive: td_prom_begin holds it across a batch of td_prom_set calls */
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
  pthread_mutex_init(&p->lock, &attr);
  pthread_mutexattr_destroy(&attr);
  td_status st = TD_OK;
  p->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (p->listen_fd < 0) {
    st = td_error_errno("prometheus: socket");
    goto fail;
  }
  int one = 1;
  setsockopt(p->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(p->listen_fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    st = td_error_errno("prometheus: cannot listen on %s:%d (%s; choose another --prometheus-port)", addr, port,
                        errno == EADDRINUSE ? "the port is in use" : "bind failed");
    goto fail;
  }
  if (listen(p->listen_fd, 16) != 0) {
    st = td_error_errno("prometheus: listen on %s:%d", addr, port);
    goto fail;
  }
  socklen_t sl = sizeof sa;
  getsockname(p->listen_fd, (struct sockaddr *)&sa, &sl);
  p->port = ntohs(sa.sin_port);
  if (pipe2(p->wake, O_CLOEXEC) != 0) {
    st = td_error_errno("prometheus: pipe");
    goto fail;
  }
  if (pthread_create(&p->thread, NULL, server_main, p) != 0) {
    st = td_error(TD_ERR_SYSTEM, "prometheus: cannot start the server thread");
    goto fail;
  }
  p->thread_started = 1;
  *out = p;
  return TD_OK;
fail:
  p->render_ctx_free = NULL; /* on failure the caller keeps its context */
  td_prom_stop(p);
  return st;
}

int td_prom_port(const td_prom *p) { return p ? p->port : -1; }

unsigned long td_prom_scrapes(td_prom *p) {
  if (!p) return 0;
  pthread_mutex_lock(&p->lock);
  unsigned long n = p->scrapes;
  pthread_mutex_unlock(&p->lock);
  return n;
}

double td_prom_serve_cpu_seconds(td_prom *p) {
  if (!p) return 0;
  pthread_mutex_lock(&p->lock);
  double s = p->serve_cpu_s;
  pthread_mutex_unlock(&p->lock);
  return s;
}

void td_prom_stop(td_prom *p) {
  if (!p) return;
  if (p->thread_started) {
    char c = 1;
    while (write(p->wake[1], &c, 1) < 0 && errno == EINTR) {
    }
    pthread_join(p->thread, NULL);
  }
  if (p->listen_fd >= 0) close(p->listen_fd);
  if (p->wake[0] >= 0) close(p->wake[0]);
  if (p->wake[1] >= 0) close(p->wake[1]);
  if (p->render_ctx_free) p->render_ctx_free(p->render_ctx);
  pthread_mutex_destroy(&p->lock);
  free(p);
}
