/* src/obs/prometheus.c: the exposition text is exactly what the 0.0.4 text
 * format prescribes (HELP/TYPE once per family, samples grouped, NaN/+Inf
 * spelled as Prometheus parses them), and the HTTP side answers GET /metrics
 * with it over a real loopback socket, 404 for other paths, 405 for other
 * methods, 431 for a request over 4 KiB, nothing (connection closed) for a
 * request that never completes; a port in use is an error naming the port.
 * The requests are written by hand here, not by the library. */
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

  /* stop returns promptly although the thread sleeps in poll */
  t0 = td_now();
  td_prom_stop(p);
  CHECK(td_now() - t0 < 1.0);
}

int main(void) {
  test_render();
  test_http();
  printf("test_prometheus: ok\n");
  return 0;
}
