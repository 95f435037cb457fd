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
 * Ranks are fetched all at once (one poll loop): a scrape costs the slowest
 * rank's answer, and at most PROM_JOB_FETCH_TIMEOUT_S, or less when
 * Prometheus says its scrape timeout is shorter, however many ranks are
 * silent.
 *
 * The targets can change while the endpoint runs (td_prom_job_set_targets:
 * an elastic job's processes come and go), and the endpoint has a table of
 * its own for the launcher's series (processes started, lost by kind),
 * rendered after the ranks' families. */
#define _GNU_SOURCE 1
#include "base/base.h"
#include "obs/prometheus_server.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define PROM_JOB_FETCH_TIMEOUT_S 2.0
#define PROM_JOB_MAX_BODY (8u << 20) /* a rank's page is a few KiB; more is not a Tandem endpoint */

/* Where to fetch: target i is hosts[i]:ports[i], named in
 * tandem_job_rank_up by labels[i] (`rank="R"`, or `process="ID"` when an
 * elastic job's processes come and go). */
typedef struct job_targets {
  int n;
  char **hosts, **ports, **labels;
} job_targets;

typedef struct prom_job {
  pthread_mutex_t lock; /* targets: replaced by td_prom_job_set_targets while a scrape may run */
  job_targets targets;
} prom_job;

/* ---- fetching every rank's page at once ----
 * One fetch per target, all driven by one poll loop under one deadline: a
 * rank that does not answer (a stopped process, a cut link) costs the
 * scrape its deadline once, however many such ranks there are, instead of
 * a timeout each one after another. */

enum { FETCH_CONNECTING, FETCH_SENDING, FETCH_READING, FETCH_DONE, FETCH_FAILED };

typedef struct fetch {
  int fd;
  int state;
  char req[300];
  size_t req_len, sent;
  td_buf page;
} fetch;

/* Resolve and start a non-blocking connect; the state it reached. */
static int fetch_begin(fetch *f, const char *host, const char *port) {
  f->fd = -1;
  int n = snprintf(f->req, sizeof f->req, "GET /metrics HTTP/1.1\r\nHost: %s:%s\r\nConnection: close\r\n\r\n", host,
                   port);
  if (n < 0 || (size_t)n >= sizeof f->req) return FETCH_FAILED;
  f->req_len = (size_t)n;
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
  if (getaddrinfo(host, port, &hints, &res) != 0) return FETCH_FAILED;
  int state = FETCH_FAILED;
  for (struct addrinfo *ai = res; ai && state == FETCH_FAILED; ai = ai->ai_next) {
    f->fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (f->fd < 0) continue;
    if (connect(f->fd, ai->ai_addr, ai->ai_addrlen) == 0) state = FETCH_SENDING;
    else if (errno == EINPROGRESS) state = FETCH_CONNECTING;
    else {
      close(f->fd);
      f->fd = -1;
    }
  }
  freeaddrinfo(res);
  return state;
}

/* Advance one fetch whose socket poll() reported ready. */
static int fetch_step(fetch *f, short revents) {
  if (f->state == FETCH_CONNECTING) {
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(f->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) return FETCH_FAILED;
    f->state = FETCH_SENDING;
  }
  if (f->state == FETCH_SENDING) {
    while (f->sent < f->req_len) {
      ssize_t k = send(f->fd, f->req + f->sent, f->req_len - f->sent, MSG_NOSIGNAL);
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && errno == EAGAIN) return FETCH_SENDING;
      if (k <= 0) return FETCH_FAILED;
      f->sent += (size_t)k;
    }
    return FETCH_READING;
  }
  if (!(revents & (POLLIN | POLLHUP | POLLERR))) return f->state;
  for (;;) { /* the server answers and closes (Connection: close) */
    char chunk[16384];
    ssize_t k = recv(f->fd, chunk, sizeof chunk, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && errno == EAGAIN) return FETCH_READING;
    if (k < 0) return FETCH_FAILED;
    if (k == 0) return FETCH_DONE;
    if (f->page.len + (size_t)k > PROM_JOB_MAX_BODY) return FETCH_FAILED;
    td_buf_append(&f->page, chunk, (size_t)k);
    if (f->page.failed) return FETCH_FAILED;
  }
}

/* The body of a complete 200 answer, moved to the front of the page
 * (length in *len_out); NULL for anything else. */
static char *fetch_body(fetch *f, size_t *len_out) {
  const char *body = f->page.data ? strstr(f->page.data, "\r\n\r\n") : NULL;
  if (f->state != FETCH_DONE || !body || strncmp(f->page.data, "HTTP/1.1 200 ", 13) != 0) return NULL;
  body += 4;
  *len_out = f->page.len - (size_t)(body - f->page.data);
  memmove(f->page.data, body, *len_out + 1);
  return f->page.data;
}

/* GET /metrics from every target at once, until each answered or failed or
 * budget_s passed; fetches[i] holds target i's outcome. */
static void fetch_all(fetch *fetches, int n, char *const *hosts, char *const *ports, double budget_s) {
  double deadline = td_now() + budget_s;
  struct pollfd *pfd = calloc((size_t)n + 1, sizeof *pfd);
  int *which = calloc((size_t)n + 1, sizeof *which);
  for (int i = 0; i < n; i++) {
    fetches[i].state = fetch_begin(&fetches[i], hosts[i], ports[i]);
    if (fetches[i].state == FETCH_SENDING) fetches[i].state = fetch_step(&fetches[i], 0);
  }
  while (pfd && which) {
    int n_poll = 0;
    for (int i = 0; i < n; i++) {
      fetch *f = &fetches[i];
      if (f->state == FETCH_DONE || f->state == FETCH_FAILED) continue;
      pfd[n_poll] = (struct pollfd){.fd = f->fd, .events = f->state == FETCH_READING ? POLLIN : POLLOUT};
      which[n_poll++] = i;
    }
    int left_ms = (int)((deadline - td_now()) * 1000);
    if (n_poll == 0 || left_ms <= 0) break;
    int r = poll(pfd, (nfds_t)n_poll, left_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) break;
    for (int k = 0; k < n_poll; k++)
      if (pfd[k].revents) fetches[which[k]].state = fetch_step(&fetches[which[k]], pfd[k].revents);
  }
  for (int i = 0; i < n; i++) { /* what did not finish in time (or at all, out of memory) failed */
    if (fetches[i].state != FETCH_DONE) fetches[i].state = FETCH_FAILED;
    if (fetches[i].fd >= 0) close(fetches[i].fd);
    fetches[i].fd = -1;
  }
  free(pfd);
  free(which);
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

static void targets_free(job_targets *t) {
  for (int i = 0; i < t->n; i++) {
    if (t->hosts) free(t->hosts[i]);
    if (t->ports) free(t->ports[i]);
    if (t->labels) free(t->labels[i]);
  }
  free(t->hosts);
  free(t->ports);
  free(t->labels);
  memset(t, 0, sizeof *t);
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

/* Parse targets (and their labels, NULL: rank="i") into *out. */
static td_status targets_parse(const char *const *targets, const char *const *labels, int n, job_targets *out) {
  memset(out, 0, sizeof *out);
  if (n < 0 || (n > 0 && !targets))
    return td_error(TD_ERR_INVALID_ARGUMENT, "prometheus job endpoint: no rank endpoints to serve (%d)", n);
  size_t count = n > 0 ? (size_t)n : 1;
  out->hosts = calloc(count, sizeof *out->hosts);
  out->ports = calloc(count, sizeof *out->ports);
  out->labels = calloc(count, sizeof *out->labels);
  out->n = n;
  if (!out->hosts || !out->ports || !out->labels) {
    targets_free(out);
    return td_error(TD_ERR_SYSTEM, "prometheus job endpoint: out of memory");
  }
  for (int r = 0; r < n; r++) {
    if (!targets[r] || !split_target(targets[r], &out->hosts[r], &out->ports[r])) {
      td_status st = td_error(TD_ERR_INVALID_ARGUMENT, "prometheus job endpoint: rank %d's endpoint '%s' is not "
                                                        "HOST:PORT", r, targets[r] ? targets[r] : "(null)");
      targets_free(out);
      return st;
    }
    char rank_label[32];
    snprintf(rank_label, sizeof rank_label, "rank=\"%d\"", r);
    out->labels[r] = strdup(labels && labels[r] ? labels[r] : rank_label);
    if (!out->labels[r]) {
      targets_free(out);
      return td_error(TD_ERR_SYSTEM, "prometheus job endpoint: out of memory");
    }
  }
  return TD_OK;
}

/* A deep copy of the current targets, so that a scrape runs without the lock. */
static int targets_copy(prom_job *job, job_targets *out) {
  pthread_mutex_lock(&job->lock);
  const job_targets *t = &job->targets;
  size_t count = t->n > 0 ? (size_t)t->n : 1;
  out->n = t->n;
  out->hosts = calloc(count, sizeof *out->hosts);
  out->ports = calloc(count, sizeof *out->ports);
  out->labels = calloc(count, sizeof *out->labels);
  int ok = out->hosts && out->ports && out->labels;
  for (int i = 0; ok && i < t->n; i++) {
    out->hosts[i] = strdup(t->hosts[i]);
    out->ports[i] = strdup(t->ports[i]);
    out->labels[i] = strdup(t->labels[i]);
    ok = out->hosts[i] && out->ports[i] && out->labels[i];
  }
  pthread_mutex_unlock(&job->lock);
  if (!ok) targets_free(out);
  return ok;
}

static char *render_job(void *ctx, double budget_s, size_t *len_out) {
  prom_job *job = ctx;
  job_targets t;
  if (!targets_copy(job, &t)) return NULL;
  family_set fs = {0};
  td_buf own = {0}, out = {0};
  double t0 = td_now();
  fetch *fetches = calloc((size_t)t.n + 1, sizeof *fetches);
  if (!fetches) {
    targets_free(&t);
    return NULL;
  }
  if (budget_s <= 0 || budget_s > PROM_JOB_FETCH_TIMEOUT_S) budget_s = PROM_JOB_FETCH_TIMEOUT_S;
  fetch_all(fetches, t.n, t.hosts, t.ports, budget_s);
  td_buf_printf(&own, "# HELP tandem_job_rank_up 1: the rank's endpoint answered this scrape of the job endpoint, 0: "
                      "it did not\n# TYPE tandem_job_rank_up gauge\n");
  for (int r = 0; r < t.n; r++) {
    size_t len = 0;
    char *page = fetch_body(&fetches[r], &len);
    int up = page && page_is_text_format(page, len);
    if (up) merge_page(&fs, page, len);
    td_buf_free(&fetches[r].page);
    td_buf_printf(&own, "tandem_job_rank_up{%s} %d\n", t.labels[r], up);
  }
  free(fetches);
  targets_free(&t);
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
  targets_free(&job->targets);
  pthread_mutex_destroy(&job->lock);
  free(job);
}

td_status td_prom_job_start(const char *bind_addr, int port, const char *const *targets, int n_targets,
                            td_prom **out) {
  *out = NULL;
  if (n_targets < 1 || !targets)
    return td_error(TD_ERR_INVALID_ARGUMENT, "prometheus job endpoint: no rank endpoints to serve (%d)", n_targets);
  prom_job *job = calloc(1, sizeof *job);
  if (!job) return td_error(TD_ERR_SYSTEM, "prometheus job endpoint: out of memory");
  pthread_mutex_init(&job->lock, NULL);
  td_status st = targets_parse(targets, NULL, n_targets, &job->targets);
  if (st == TD_OK) st = prom_start_with(bind_addr, port, render_job, job, job_free, out);
  if (st != TD_OK) job_free(job);
  return st;
}

td_status td_prom_job_set_targets(td_prom *prom, const char *const *targets, const char *const *labels,
                                  int n_targets) {
  prom_job *job = prom_render_ctx(prom, render_job);
  if (!job)
    return td_error(TD_ERR_INVALID_USAGE, "td_prom_job_set_targets: not a job endpoint (td_prom_job_start makes one)");
  job_targets fresh;
  td_status st = targets_parse(targets, labels, n_targets, &fresh);
  if (st != TD_OK) return st;
  pthread_mutex_lock(&job->lock);
  job_targets old = job->targets;
  job->targets = fresh;
  pthread_mutex_unlock(&job->lock);
  targets_free(&old);
  return TD_OK;
}
