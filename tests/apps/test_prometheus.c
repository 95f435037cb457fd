/* src/obs/prometheus.c: the exposition text is exactly what the 0.0.4 text
 * format prescribes (HELP/TYPE once per family, samples grouped, NaN/+Inf
 * spelled as Prometheus parses them), and the HTTP side answers GET /metrics
 * with it over a real loopback socket, 404 for other paths, 405 for other
 * methods, 431 for a request over 4 KiB, nothing (connection closed) for a
 * request that never completes; a port in use is an error naming the port;
 * td_prom_clear empties the table.
 * The requests are written by hand here, not by the library.
 * prometheus_job.c: the job endpoint over three real rank endpoints, a
 * closed port and two listeners that never answer gives the ranks' families
 * merged (HELP/TYPE once, samples in rank order), the silent ranks as
 * tandem_job_rank_up 0, then its own table; the two silent ranks cost one
 * 2 s bound together (fetched at once), and less when the request announces
 * a shorter Prometheus scrape timeout; the same over HTTP; new targets with
 * process labels (an elastic job) replace the old ones, none at all too;
 * bad targets are refused. */
#include "base/base.h"
#include "../common/check.h"
#include "tandem/obs.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* Send `req` (len bytes) to 127.0.0.1:port and read the reply until the
 * server closes (at most 10 s). Returns the malloc'd reply. */
static char *http(int port, const char *req, size_t len) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  CHECK(fd >= 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  CHECK(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
  size_t sent = 0;
  while (sent < len) {
    ssize_t n = send(fd, req + sent, len - sent, MSG_NOSIGNAL);
    if (n <= 0) break; /* the server may answer 431 and close before all is sent */
    sent += (size_t)n;
  }
  size_t cap = 1 << 16, have = 0;
  char *buf = malloc(cap + 1);
  CHECK(buf != NULL);
  for (;;) {
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    CHECK(poll(&pfd, 1, 10000) == 1);
    ssize_t n = recv(fd, buf + have, cap - have, 0);
    if (n <= 0) break;
    have += (size_t)n;
    CHECK(have < cap);
  }
  buf[have] = 0;
  close(fd);
  return buf;
}

static void test_render(void) {
  td_prom *p = NULL;
  CHECK_OK(td_prom_start(NULL, 0, &p));
  td_prom_set(p, "tandem_loss", "gauge", "mean loss", "rank=\"0\"", 2.5);
  td_prom_set(p, "tandem_phase_seconds_total", "counter", "by phase", "rank=\"0\",phase=\"compute\"", 1);
  td_prom_set(p, "tandem_loss", "gauge", "mean loss", "rank=\"1\"", NAN);
  td_prom_add(p, "tandem_phase_seconds_total", "by phase", "rank=\"0\",phase=\"compute\"", 0.25);
  td_prom_set(p, "tandem_up", "gauge", "", NULL, INFINITY);
  td_prom_set(p, "bad name", "gauge", "ignored", NULL, 1); /* not a metric name: ignored */
  td_prom_set(p, "9lives", "gauge", "ignored", NULL, 1);
  size_t len = 0;
  char *text = td_prom_render(p, &len);
  CHECK(text != NULL);
  const char *want = "# HELP tandem_loss mean loss\n"
                     "# TYPE tandem_loss gauge\n"
                     "tandem_loss{rank=\"0\"} 2.5\n"
                     "tandem_loss{rank=\"1\"} NaN\n"
                     "# HELP tandem_phase_seconds_total by phase\n"
                     "# TYPE tandem_phase_seconds_total counter\n"
                     "tandem_phase_seconds_total{rank=\"0\",phase=\"compute\"} 1.25\n"
                     "# TYPE tandem_up gauge\n"
                     "tandem_up +Inf\n";
  if (strcmp(text, want) != 0) td_test_fail(__FILE__, __LINE__, "render:\n%s\nwanted:\n%s", text, want);
  CHECK_EQ_INT(len, strlen(want));
  free(text);

  /* 0.1 must come back as the same double: 17 significant digits */
  td_prom_set(p, "tandem_lr", "gauge", NULL, NULL, 0.1);
  text = td_prom_render(p, &len);
  const char *line = strstr(text, "\ntandem_lr ");
  CHECK(line != NULL);
  CHECK(strtod(line + strlen("\ntandem_lr "), NULL) == 0.1);
  free(text);

  /* the table holds 256 series; more are dropped, the others kept */
  for (int i = 0; i < 300; i++) {
    char labels[32];
    snprintf(labels, sizeof labels, "i=\"%d\"", i);
    td_prom_set(p, "tandem_many", "gauge", NULL, labels, i);
  }
  text = td_prom_render(p, &len);
  int n_many = 0;
  for (const char *c = text; (c = strstr(c, "tandem_many{")) != NULL; c++) n_many++;
  CHECK_EQ_INT(n_many, 256 - 5); /* 5 series existed already */
  CHECK(strstr(text, "tandem_loss{rank=\"0\"} 2.5\n") != NULL);
  free(text);
  /* cleared (an elastic process renumbered): nothing, then room for new series */
  td_prom_clear(p);
  td_prom_clear(NULL);
  text = td_prom_render(p, &len);
  CHECK(text && len == 0 && text[0] == 0);
  free(text);
  td_prom_set(p, "tandem_loss", "gauge", "mean loss", "rank=\"2\"", 1.5);
  td_prom_add(p, "tandem_tokens_total", "tokens", "rank=\"2\"", 64);
  text = td_prom_render(p, &len);
  CHECK(!strcmp(text, "# HELP tandem_loss mean loss\n# TYPE tandem_loss gauge\ntandem_loss{rank=\"2\"} 1.5\n"
                      "# HELP tandem_tokens_total tokens\n# TYPE tandem_tokens_total counter\n"
                      "tandem_tokens_total{rank=\"2\"} 64\n"));
  free(text);
  td_prom_stop(p);
  td_prom_stop(NULL);
}

static void test_http(void) {
  td_prom *p = NULL;
  CHECK_OK(td_prom_start("127.0.0.1", 0, &p));
  int port = td_prom_port(p);
  CHECK(port > 0);
  td_prom_set(p, "tandem_step", "gauge", "steps", "rank=\"3\"", 42);

  static const char get[] = "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: text/plain\r\n\r\n";
  char *r = http(port, get, sizeof get - 1);
  CHECK(!strncmp(r, "HTTP/1.1 200 OK\r\n", 17));
  CHECK(strstr(r, "Content-Type: text/plain; version=0.0.4") != NULL);
  const char *body = strstr(r, "\r\n\r\n");
  CHECK(body != NULL);
  body += 4;
  CHECK(!strcmp(body, "# HELP tandem_step steps\n# TYPE tandem_step gauge\ntandem_step{rank=\"3\"} 42\n"));
  const char *cl = strstr(r, "Content-Length: ");
  CHECK(cl && atol(cl + 16) == (long)strlen(body));
  free(r);

  static const char query[] = "GET /metrics?x=1 HTTP/1.0\n\n"; /* bare LF and a query string */
  r = http(port, query, sizeof query - 1);
  CHECK(!strncmp(r, "HTTP/1.1 200 OK\r\n", 17));
  free(r);

  const char *not_found[] = {"GET / HTTP/1.1\r\n\r\n", "GET /metricsX HTTP/1.1\r\n\r\n", "GET /metric HTTP/1.1\r\n\r\n"};
  for (int i = 0; i < 3; i++) {
    r = http(port, not_found[i], strlen(not_found[i]));
    if (strncmp(r, "HTTP/1.1 404 ", 13) != 0) td_test_fail(__FILE__, __LINE__, "%s -> %s", not_found[i], r);
    free(r);
  }
  static const char post[] = "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n";
  r = http(port, post, sizeof post - 1);
  CHECK(!strncmp(r, "HTTP/1.1 405 ", 13));
  free(r);

  /* over 4 KiB without the blank line: refused, not buffered without bound */
  size_t big_len = 6000;
  char *big = malloc(big_len);
  CHECK(big != NULL);
  memset(big, 'a', big_len);
  memcpy(big, "GET /metrics HTTP/1.1\r\nX: ", 26);
  r = http(port, big, big_len);
  CHECK(!strncmp(r, "HTTP/1.1 431 ", 13));
  free(r);
  free(big);

  /* half a request, then silence: the server gives up after 2 s and closes
   * (an empty reply), and serves the next client afterwards */
  double t0 = td_now();
  static const char half[] = "GET /metr";
  r = http(port, half, sizeof half - 1);
  CHECK_EQ_INT((int)strlen(r), 0);
  double waited = td_now() - t0;
  CHECK(waited >= 1.5 && waited < 8);
  free(r);
  r = http(port, get, sizeof get - 1);
  CHECK(!strncmp(r, "HTTP/1.1 200 OK\r\n", 17));
  free(r);
  CHECK_EQ_INT((long)td_prom_scrapes(p), 3);

  /* the same port again: an error that names it (the caller goes on) */
  td_prom *second = NULL;
  CHECK_MSG(td_prom_start(NULL, port, &second), TD_ERR_SYSTEM, "in use");
  CHECK(second == NULL);
  char num[16];
  snprintf(num, sizeof num, ":%d", port);
  CHECK(strstr(td_last_error(), num) != NULL);
  CHECK_MSG(td_prom_start("localhost", 0, &second), TD_ERR_INVALID_ARGUMENT, "not an IPv4 address");
  CHECK_MSG(td_prom_start(NULL, 70000, &second), TD_ERR_INVALID_ARGUMENT, "out of range");

  /* the server thread's CPU time: some of this process's, none for NULL */
  struct timespec cpu;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu);
  double serve_cpu = td_prom_serve_cpu_seconds(p);
  CHECK(serve_cpu >= 0 && serve_cpu <= (double)cpu.tv_sec + cpu.tv_nsec * 1e-9 + 1e-3);
  CHECK(td_prom_serve_cpu_seconds(NULL) == 0);
  /* stop returns promptly although the thread sleeps in poll */
  t0 = td_now();
  td_prom_stop(p);
  CHECK(td_now() - t0 < 1.0);
}

static const char *job_expected =
    "# HELP tandem_step steps\n# TYPE tandem_step gauge\n"
    "tandem_step{rank=\"0\"} 10\ntandem_step{rank=\"1\"} 11\ntandem_step{rank=\"2\"} 12\n"
    "# HELP tandem_phase_seconds_total by phase\n# TYPE tandem_phase_seconds_total counter\n"
    "tandem_phase_seconds_total{rank=\"0\",phase=\"compute\"} 0.5\n"
    "tandem_phase_seconds_total{rank=\"0\",phase=\"io\"} 0\n"
    "tandem_phase_seconds_total{rank=\"1\",phase=\"compute\"} 1.5\n"
    "tandem_phase_seconds_total{rank=\"1\",phase=\"io\"} 1\n"
    "tandem_phase_seconds_total{rank=\"2\",phase=\"compute\"} 2.5\n"
    "tandem_phase_seconds_total{rank=\"2\",phase=\"io\"} 2\n"
    "# HELP tandem_offload_read_bytes offload reads\n# TYPE tandem_offload_read_bytes gauge\n"
    "tandem_offload_read_bytes{rank=\"1\"} 4096\n"
    "# HELP tandem_job_rank_up 1: the rank's endpoint answered this scrape of the job endpoint, 0: it did not\n"
    "# TYPE tandem_job_rank_up gauge\n"
    "tandem_job_rank_up{rank=\"0\"} 1\ntandem_job_rank_up{rank=\"1\"} 1\ntandem_job_rank_up{rank=\"2\"} 1\n"
    "tandem_job_rank_up{rank=\"3\"} 0\ntandem_job_rank_up{rank=\"4\"} 0\ntandem_job_rank_up{rank=\"5\"} 0\n"
    "# HELP tandem_job_scrape_seconds time this scrape of the job endpoint took to fetch the ranks\n"
    "# TYPE tandem_job_scrape_seconds gauge\ntandem_job_scrape_seconds ";

static const char *job_own = "# HELP tandem_job_processes_running the launcher's\n"
                             "# TYPE tandem_job_processes_running gauge\ntandem_job_processes_running 6\n";

/* The merged text up to the scrape time, that time (the two silent ranks
 * cost the 2 s bound once, fetched at once: one after the other they took
 * 4 s), then the endpoint's own table. */
static void check_job_text(const char *text, double min_s, double max_s) {
  size_t n = strlen(job_expected);
  if (strncmp(text, job_expected, n) != 0) td_test_fail(__FILE__, __LINE__, "job endpoint text:\n%s", text);
  double took = atof(text + n);
  if (!(took >= min_s && took < max_s)) td_test_fail(__FILE__, __LINE__, "scrape took %g s, not in [%g, %g)", took, min_s, max_s);
  const char *own = strchr(text + n, '\n');
  CHECK(own && !strcmp(own + 1, job_own));
}

static void test_job(void) {
  td_prom *ranks[3];
  char targets_text[6][64];
  const char *targets[6];
  for (int r = 0; r < 3; r++) {
    CHECK_OK(td_prom_start(NULL, 0, &ranks[r]));
    char l[64];
    snprintf(l, sizeof l, "rank=\"%d\"", r);
    td_prom_set(ranks[r], "tandem_step", "gauge", "steps", l, 10 + r);
    snprintf(l, sizeof l, "rank=\"%d\",phase=\"compute\"", r);
    td_prom_set(ranks[r], "tandem_phase_seconds_total", "counter", "by phase", l, r + 0.5);
    snprintf(l, sizeof l, "rank=\"%d\",phase=\"io\"", r);
    td_prom_set(ranks[r], "tandem_phase_seconds_total", "counter", "by phase", l, r);
    if (r == 1) td_prom_set(ranks[r], "tandem_offload_read_bytes", "gauge", "offload reads", "rank=\"1\"", 4096);
    snprintf(targets_text[r], sizeof targets_text[r], "127.0.0.1:%d", td_prom_port(ranks[r]));
  }
  /* rank 3: a closed port (refused); ranks 4 and 5: listeners that never answer */
  int closed = socket(AF_INET, SOCK_STREAM, 0), silent = socket(AF_INET, SOCK_STREAM, 0);
  int silent2 = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t sl = sizeof sa;
  CHECK(bind(closed, (struct sockaddr *)&sa, sizeof sa) == 0);
  CHECK(getsockname(closed, (struct sockaddr *)&sa, &sl) == 0);
  snprintf(targets_text[3], sizeof targets_text[3], "localhost:%d", ntohs(sa.sin_port));
  close(closed);
  sa.sin_port = 0;
  CHECK(bind(silent, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(silent, 4) == 0);
  sl = sizeof sa;
  CHECK(getsockname(silent, (struct sockaddr *)&sa, &sl) == 0);
  snprintf(targets_text[4], sizeof targets_text[4], "[127.0.0.1]:%d", ntohs(sa.sin_port));
  sa.sin_port = 0;
  CHECK(bind(silent2, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(silent2, 4) == 0);
  sl = sizeof sa;
  CHECK(getsockname(silent2, (struct sockaddr *)&sa, &sl) == 0);
  snprintf(targets_text[5], sizeof targets_text[5], "127.0.0.1:%d", ntohs(sa.sin_port));
  for (int r = 0; r < 6; r++) targets[r] = targets_text[r];

  td_prom *job = NULL;
  CHECK_OK(td_prom_job_start(NULL, 0, targets, 6, &job));
  td_prom_set(job, "tandem_job_processes_running", "gauge", "the launcher's", NULL, 6); /* its own table */
  size_t len = 0;
  char *text = td_prom_render(job, &len);
  CHECK(text && len == strlen(text));
  check_job_text(text, 1.9, 3.5);
  free(text);
  static const char get[] = "GET /metrics HTTP/1.1\r\n\r\n";
  char *r = http(td_prom_port(job), get, sizeof get - 1);
  CHECK(!strncmp(r, "HTTP/1.1 200 OK\r\n", 17) && strstr(r, "\r\n\r\n"));
  check_job_text(strstr(r, "\r\n\r\n") + 4, 1.9, 3.5);
  free(r);
  /* Prometheus says its scrape times out after 0.5 s: the fetches stop at
   * 0.8 x 0.5 - 0.05 = 0.35 s, so that the answer still arrives in time */
  static const char get_short[] = "GET /metrics HTTP/1.1\r\nX-Prometheus-Scrape-Timeout-Seconds: 0.5\r\n\r\n";
  r = http(td_prom_port(job), get_short, sizeof get_short - 1);
  CHECK(strstr(r, "\r\n\r\n"));
  check_job_text(strstr(r, "\r\n\r\n") + 4, 0.33, 0.5);
  free(r);

  /* an elastic job's processes: new targets, labelled by process */
  const char *now[] = {targets_text[2], targets_text[0]};
  const char *labels[] = {"process=\"7\"", "process=\"9\""};
  CHECK_OK(td_prom_job_set_targets(job, now, labels, 2));
  text = td_prom_render(job, &len);
  CHECK(text && strstr(text, "tandem_step{rank=\"2\"} 12\ntandem_step{rank=\"0\"} 10\n# HELP"));
  CHECK(strstr(text, "tandem_job_rank_up{process=\"7\"} 1\ntandem_job_rank_up{process=\"9\"} 1\n# HELP"));
  CHECK(!strstr(text, "rank=\"1\"") && strstr(text, job_own));
  free(text);
  CHECK_OK(td_prom_job_set_targets(job, NULL, NULL, 0));
  text = td_prom_render(job, &len);
  CHECK(text && !strstr(text, "tandem_step") && !strstr(text, "tandem_job_rank_up{") && strstr(text, job_own));
  free(text);
  CHECK_MSG(td_prom_job_set_targets(job, now, NULL, -1), TD_ERR_INVALID_ARGUMENT, "no rank endpoints");
  CHECK_MSG(td_prom_job_set_targets(ranks[0], now, NULL, 1), TD_ERR_INVALID_USAGE, "not a job endpoint");
  td_prom_stop(job);
  close(silent);
  close(silent2);

  const char *bad[] = {"127.0.0.1:1", "no-port"};
  CHECK_MSG(td_prom_job_start(NULL, 0, bad, 2, &job), TD_ERR_INVALID_ARGUMENT, "rank 1's endpoint 'no-port'");
  CHECK(job == NULL);
  CHECK_MSG(td_prom_job_start(NULL, 0, bad, 0, &job), TD_ERR_INVALID_ARGUMENT, "no rank endpoints");
  CHECK_MSG(td_prom_job_start(NULL, 70000, bad, 1, &job), TD_ERR_INVALID_ARGUMENT, "out of range");
  for (int i = 0; i < 3; i++) td_prom_stop(ranks[i]);
}

int main(void) {
  test_render();
  test_http();
  test_job();
  printf("test_prometheus: ok\n");
  return 0;
}
