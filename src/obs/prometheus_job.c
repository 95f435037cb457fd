/* One Prometheus endpoint for a whole job (tandemrun --prometheus-port):
 * each scrape of it fetches GET /metrics from every rank's endpoint and
 * answers with all of them merged, so that Prometheus needs one target per
 * job instead of one per rank (and a job whose ranks move between ports or
 * hosts needs no new scrape configuration).
 *
 * A proxy at scrape time, not a copy kept up to date: the numbers are as
 * fresh as the ranks', and between scrapes nothing runs. The ranks' series
 * already carry their rank label, so merging is regrouping: every metric
 * family's HELP and TYPE once, then its samples from every rank in rank
 * order (the text format wants a family's samples together). A rank that
 * does not answer within PROM_JOB_FETCH_TIMEOUT_S (or answers garbage) is
 * left out of that scrape and shows as tandem_job_rank_up{rank="R"} 0, so a
 * dashboard sees which rank is missing instead of a silent gap.
 *
 * Ranks are fetched one after another: a scrape costs the sum of the ranks'
 * answers (each a few hundred microseconds on loopback), bounded by the
 * timeout per rank that does not answer. */
#define _GNU_SOURCE 1
#include "base/base.h"
#include "obs/prometheus_server.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define PROM_JOB_FETCH_TIMEOUT_S 2.0
#define PROM_JOB_MAX_BODY (8u << 20) /* a rank's page is a few KiB; more is not a Tandem endpoint */

typedef struct prom_job {
  int n_targets;
  char **hosts;
  char **ports;
} prom_job;

/* ---- fetching one rank's page ---- */

static int connect_by_deadline(const char *host, const char *port, double deadline) {
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
  if (getaddrinfo(host, port, &hints, &res) != 0) return -1;
  int fd = -1;
  for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) continue;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) break;
    if (errno == EINPROGRESS) {
      int left_ms = (int)((deadline - td_now()) * 1000);
      struct pollfd pfd = {.fd = fd, .events = POLLOUT};
      int err = 0;
      socklen_t len = sizeof err;
      if (left_ms > 0 && poll(&pfd, 1, left_ms) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 &&
          err == 0)
        break;
    }
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  return fd;
}

/* GET /metrics from host:port; the body on a 200 answer, else NULL. */
static char *fetch_page(const char *host, const char *port, size_t *len_out) {
  double deadline = td_now() + PROM_JOB_FETCH_TIMEOUT_S;
  int fd = connect_by_deadline(host, port, deadline);
  if (fd < 0) return NULL;
  char req[300];
  int n = snprintf(req, sizeof req, "GET /metrics HTTP/1.1\r\nHost: %s:%s\r\nConnection: close\r\n\r\n", host, port);
  td_buf page = {0};
  size_t sent = 0;
  while (sent < (size_t)n) {
    ssize_t k = send(fd, req + sent, (size_t)n - sent, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) goto fail; /* a fresh socket's buffer holds the request: EAGAIN does not happen here */
    sent += (size_t)k;
  }
  for (;;) { /* the server answers and closes (Connection: close) */
    int left_ms = (int)((deadline - td_now()) * 1000);
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    if (left_ms <= 0) goto fail;
    int r = poll(&pfd, 1, left_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) goto fail;
    char chunk[16384];
    ssize_t k = recv(fd, chunk, sizeof chunk, 0);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k < 0) goto fail;
    if (k == 0) break;
    if (page.len + (size_t)k > PROM_JOB_MAX_BODY) goto fail;
    td_buf_append(&page, chunk, (size_t)k);
    if (page.failed) goto fail;
  }
  close(fd);
  fd = -1;
  const char *body = page.data ? strstr(page.data, "\r\n\r\n") : NULL;
  if (!body || strncmp(page.data, "HTTP/1.1 200 ", 13) != 0) goto fail;
  body += 4;
  *len_out = page.len - (size_t)(body - page.data);
  memmove(page.data, body, *len_out + 1);
  return page.data;
fail:
  if (fd >= 0) close(fd);
  td_buf_free(&page);
  return NULL;
}

/* ---- merging ---- */

typedef struct family {
  char name[128];
  char *help, *type; /* the lines, as the first rank sent them (NULL: none) */
  td_buf samples;
} family;

typedef struct family_set {
  family *items;
  int n, cap;
  int failed;
} family_set;

static family *family_get(family_set *fs, const char *name, size_t name_len) {
  if (name_len == 0 || name_len >= sizeof fs->items[0].name) return NULL;
  for (int i = 0; i < fs->n; i++)
    if (strlen(fs->items[i].name) == name_len && !memcmp(fs->items[i].name, name, name_len)) return &fs->items[i];
  if (fs->n == fs->cap) {
    int cap = fs->cap ? 2 * fs->cap : 64;
    family *grown = realloc(fs->items, (size_t)cap * sizeof *grown);
    if (!grown) {
      fs->failed = 1;
      return NULL;
    }
    fs->items = grown;
    fs->cap = cap;
  }
  family *f = &fs->items[fs->n++];
  memset(f, 0, sizeof *f);
  memcpy(f->name, name, name_len);
  return f;
}

/* The family a sample belongs to: its HELP/TYPE name. A counter's samples
 * are named as its family (Tandem's ranks write `# TYPE x_total counter`);
 * only the name up to '{' or ' ' is looked at. */
static size_t sample_name_len(const char *line, size_t len) {
  size_t i = 0;
  while (i < len && line[i] != '{' && line[i] != ' ') i++;
  return i;
}

/* Whether one rank's page is the text format this merge understands: every
 * line a comment or `name[{labels}] value`. A page that is not (a wrong
 * port answering something else) is left out whole. */
static int page_is_text_format(const char *page, size_t len) {
  for (size_t at = 0; at < len;) {
    const char *line = page + at;
    const char *nl = memchr(line, '\n', len - at);
    size_t n = nl ? (size_t)(nl - line) : len - at;
    at += n + 1;
    if (n == 0 || line[0] == '#') continue;
    size_t name = sample_name_len(line, n);
    if (name == 0 || name == n || !memchr(line + name, ' ', n - name)) return 0;
  }
  return 1;
}

static void merge_page(family_set *fs, const char *page, size_t len) {
  for (size_t at = 0; at < len && !fs->failed;) {
    const char *line = page + at;
    const char *nl = memchr(line, '\n', len - at);
    size_t n = nl ? (size_t)(nl - line) : len - at;
    at += n + 1;
    if (n == 0) continue;
    if (n > 7 && (!strncmp(line, "# HELP ", 7) || !strncmp(line, "# TYPE ", 7))) {
      const char *name = line + 7;
      size_t name_len = 0;
      while (7 + name_len < n && name[name_len] != ' ') name_len++;
      family *f = family_get(fs, name, name_len);
      if (!f) continue;
      char **slot = line[2] == 'H' ? &f->help : &f->type;
      if (!*slot) {
        *slot = strndup(line, n);
        if (!*slot) fs->failed = 1;
      }
      continue;
    }
    if (line[0] == '#') continue;
    family *f = family_get(fs, line, sample_name_len(line, n));
    if (!f) continue;
    td_buf_append(&f->samples, line, n);
    td_buf_append(&f->samples, "\n", 1);
    if (f->samples.failed) fs->failed = 1;
  }
}

static char *render_job(void *ctx, size_t *len_out) {
  prom_job *job = ctx;
  family_set fs = {0};
  td_buf own = {0}, out = {0};
  double t0 = td_now();
  td_buf_printf(&own, "# HELP tandem_job_rank_up 1: the rank's endpoint answered this scrape of the job endpoint, 0: "
                   "it did not\n# TYPE tandem_job_rank_up gauge\n");
  for (int r = 0; r < job->n_targets; r++) {
    size_t len = 0;
    char *page = fetch_page(job->hosts[r], job->ports[r], &len);
    int up = page && page_is_text_format(page, len);
    if (up) merge_page(&fs, page, len);
    free(page);
    td_buf_printf(&own, "tandem_job_rank_up{rank=\"%d\"} %d\n", r, up);
  }
  td_buf_printf(&own, "# HELP tandem_job_scrape_seconds time this scrape of the job endpoint took to fetch the ranks\n"
                   "# TYPE tandem_job_scrape_seconds gauge\ntandem_job_scrape_seconds %.6f\n", td_now() - t0);
  for (int i = 0; i < fs.n && !fs.failed; i++) {
    family *f = &fs.items[i];
    if (f->help) td_buf_printf(&out, "%s\n", f->help);
    if (f->type) td_buf_printf(&out, "%s\n", f->type);
    if (f->samples.len) td_buf_append(&out, f->samples.data, f->samples.len);
  }
  td_buf_append(&out, own.data ? own.data : "", own.len);
  for (int i = 0; i < fs.n; i++) free(fs.items[i].help), free(fs.items[i].type), td_buf_free(&fs.items[i].samples);
  free(fs.items);
  if (own.failed || fs.failed) out.failed = 1;
  td_buf_free(&own);
  return td_buf_take(&out, len_out);
}

static void job_free(void *ctx) {
  prom_job *job = ctx;
  if (!job) return;
  for (int i = 0; i < job->n_targets; i++) {
    if (job->hosts) free(job->hosts[i]);
    if (job->ports) free(job->ports[i]);
  }
  free(job->hosts);
  free(job->ports);
  free(job);
}

/* "HOST:PORT" or "[V6]:PORT" into its parts. */
static int split_target(const char *target, char **host, char **port) {
  const char *colon = strrchr(target, ':');
  if (!colon || colon == target || !colon[1]) return 0;
  for (const char *c = colon + 1; *c; c++)
    if (*c < '0' || *c > '9') return 0;
  const char *h = target;
  size_t hlen = (size_t)(colon - target);
  if (h[0] == '[' && hlen >= 2 && h[hlen - 1] == ']') h++, hlen -= 2;
  *host = strndup(h, hlen);
  *port = strdup(colon + 1);
  return *host && *port;
}

td_status td_prom_job_start(const char *bind_addr, int port, const char *const *targets, int n_targets,
                            td_prom **out) {
  *out = NULL;
  if (n_targets < 1 || !targets)
    return td_error(TD_ERR_INVALID_ARGUMENT, "prometheus job endpoint: no rank endpoints to serve (%d)", n_targets);
  prom_job *job = calloc(1, sizeof *job);
  if (!job || !(job->hosts = calloc((size_t)n_targets, sizeof *job->hosts)) ||
      !(job->ports = calloc((size_t)n_targets, sizeof *job->ports))) {
    job_free(job);
    return td_error(TD_ERR_SYSTEM, "prometheus job endpoint: out of memory");
  }
  job->n_targets = n_targets;
  for (int r = 0; r < n_targets; r++) {
    if (!targets[r] || !split_target(targets[r], &job->hosts[r], &job->ports[r])) {
      td_status st = td_error(TD_ERR_INVALID_ARGUMENT, "prometheus job endpoint: rank %d's endpoint '%s' is not "
                                                        "HOST:PORT", r, targets[r] ? targets[r] : "(null)");
      job_free(job);
      return st;
    }
  }
  td_status st = prom_start_with(bind_addr, port, render_job, job, job_free, out);
  if (st != TD_OK) job_free(job);
  return st;
}
