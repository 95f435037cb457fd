/* The store server drops a client (a malformed request, or a parked WAIT
 * whose client half-closed) without losing the responses it already sent.
 *
 * The bug this pins (issue 22): closing a TCP socket that still holds
 * unread input makes the kernel send a reset and throw away whatever of
 * the send queue is not on the wire yet. The server answered every request
 * before the bad one, but the answers still queued in the kernel were lost:
 * fuzz_store saw it on loopback only when cubic or reno (no pacing) let the
 * congestion window, not the client, hold the last answer back. Here the
 * client's own small receive window holds the answers back instead, which
 * does not depend on congestion control or timing: the client pipelines
 * requests whose answers far exceed its window, then the bad bytes, and
 * reads only afterwards. It must get every answer, then an orderly end of
 * stream (not ECONNRESET).
 *
 * The wire format is written out here from the protocol's table (40-byte
 * request header: magic, op, key length, flags, value lengths, argument;
 * 32-byte response header: magic, status, flags, pad, length, number), not
 * with the library's encoders. A third part sends one request stream cut
 * at every awkward size (1, 3, 39, 40, 41 bytes, ...) and checks each
 * answer against values computed here. */
#define _GNU_SOURCE 1 /* POLLRDHUP */
#include "../common/check.h"
#include "net/net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAGIC 0x31534454u /* "TDS1" */
#define REQ 40
#define RESP 32
enum { OP_SET = 1, OP_GET = 2, OP_WAIT = 3, OP_ADD = 4, OP_DELETE = 6 };

static int g_port;

static void put_le(unsigned char *p, uint64_t v, int n) {
  for (int i = 0; i < n; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint64_t get_le(const unsigned char *p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

typedef struct buf {
  unsigned char *p;
  size_t len, cap;
} buf;

static void buf_add(buf *b, const void *data, size_t n) {
  if (b->len + n > b->cap) {
    b->cap = (b->len + n) * 2;
    b->p = realloc(b->p, b->cap);
    CHECK(b->p != NULL);
  }
  memcpy(b->p + b->len, data, n);
  b->len += n;
}

static void add_request(buf *b, uint32_t op, const char *key, const void *value, uint64_t len, int64_t arg) {
  unsigned char h[REQ] = {0};
  put_le(h, MAGIC, 4);
  put_le(h + 4, op, 4);
  put_le(h + 8, strlen(key), 4);
  put_le(h + 16, len, 8);
  put_le(h + 32, (uint64_t)arg, 8);
  buf_add(b, h, REQ);
  buf_add(b, key, strlen(key));
  if (len) buf_add(b, value, len);
}

/* A loopback connection to the server, authenticated as store_connect does;
 * rcvbuf > 0 sets a small receive buffer before connecting, so that the
 * window the server sees is small from the start. */
static int connect_client(int rcvbuf) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  CHECK(fd >= 0);
  if (rcvbuf > 0) CHECK(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf) == 0);
  int one = 1;
  CHECK(setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) == 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_port)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  CHECK(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
  CHECK_OK(net_auth_connect(fd, NET_AUTH_ROLE_STORE, -1, "store", "the test's store", td_now() + 5.0));
  return fd;
}

static void send_all(int fd, const void *p, size_t n) { CHECK_OK(net_send_all(fd, p, n, td_now() + 10.0)); }

/* Everything until the server ends the stream; *reset: whether it ended with
 * ECONNRESET rather than an orderly end of stream. */
static buf read_to_end(int fd, bool *reset) {
  buf b = {0};
  *reset = false;
  double deadline = td_now() + 10.0;
  for (;;) {
    unsigned char chunk[65536];
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int left = (int)((deadline - td_now()) * 1000);
    CHECK(left > 0); /* the server neither answered nor closed within 10 s */
    (void)poll(&p, 1, left);
    ssize_t n = recv(fd, chunk, sizeof chunk, MSG_DONTWAIT);
    if (n > 0) {
      buf_add(&b, chunk, (size_t)n);
      continue;
    }
    if (n == 0) return b;
    if (errno == EAGAIN || errno == EINTR) continue;
    CHECK_EQ_INT(errno, ECONNRESET);
    *reset = true;
    return b;
  }
}

/* Wait until the server has acted on everything sent: its reset, end of
 * stream or hang-up shows as an event; with the fix none comes while the
 * answers are held back by our window, so this waits out `seconds`. */
static void let_server_act(int fd, double seconds) {
  struct pollfd p = {.fd = fd, .events = POLLRDHUP};
  (void)poll(&p, 1, (int)(seconds * 1000));
}

/* Check `n_get` answers of GET `value` after one SET answer. */
static void check_set_then_gets(const buf *r, const unsigned char *value, size_t vlen, int n_get) {
  size_t want = RESP + (size_t)n_get * (RESP + vlen);
  if (r->len != want)
    td_test_fail(__FILE__, __LINE__, "got %zu bytes of answers, want %zu (a SET and %d GETs of %zu bytes)", r->len,
                 want, n_get, vlen);
  const unsigned char *p = r->p;
  CHECK_EQ_INT(get_le(p, 4), MAGIC);
  CHECK_EQ_INT(get_le(p + 4, 4), 0);  /* OK */
  CHECK_EQ_INT(get_le(p + 16, 8), 0); /* no value */
  p += RESP;
  for (int i = 0; i < n_get; i++, p += RESP + vlen) {
    CHECK_EQ_INT(get_le(p, 4), MAGIC);
    CHECK_EQ_INT(get_le(p + 4, 4), 0);
    CHECK_EQ_INT(get_le(p + 8, 4) & 1, 1); /* found */
    CHECK_EQ_INT(get_le(p + 16, 8), vlen);
    CHECK(memcmp(p + RESP, value, vlen) == 0);
  }
}

enum { VLEN = 2000, N_GET = 32, RCVBUF = 4096 };

/* Answers far beyond the client's window, then a header the server must
 * refuse (a value over 64 MiB) and bytes it will never read. */
static void test_malformed_after_answers(void) {
  unsigned char value[VLEN];
  for (int i = 0; i < VLEN; i++) value[i] = (unsigned char)(i * 7 + 3);
  buf req = {0};
  add_request(&req, OP_SET, "close/k", value, VLEN, 0);
  for (int i = 0; i < N_GET; i++) add_request(&req, OP_GET, "close/k", NULL, 0, 0);
  unsigned char bad[REQ] = {0};
  put_le(bad, MAGIC, 4);
  put_le(bad + 4, OP_DELETE, 4);
  put_le(bad + 8, 7, 4);
  put_le(bad + 16, (uint64_t)1 << 56, 8); /* a value of 2^56 bytes: refused */
  buf_add(&req, bad, REQ);
  buf_add(&req, "junk that follows the refused header", 36);

  int fd = connect_client(RCVBUF);
  send_all(fd, req.p, req.len);
  let_server_act(fd, 1.0);
  bool reset;
  buf r = read_to_end(fd, &reset);
  check_set_then_gets(&r, value, VLEN, N_GET);
  CHECK(!reset); /* an orderly end, after every answer */
  close(fd);
  free(r.p);
  free(req.p);
  printf("malformed request after %d pipelined answers: all %zu bytes of answers, then an orderly close\n", N_GET + 1,
         (size_t)RESP + N_GET * (RESP + VLEN));
}

/* The same answers, then a WAIT that parks and a request after it; the
 * client half-closes. The server drops a parked client that hung up (it
 * cannot read the answer), but the answers before the WAIT must arrive. */
static void test_parked_half_close(void) {
  unsigned char value[VLEN];
  for (int i = 0; i < VLEN; i++) value[i] = (unsigned char)(i * 13 + 1);
  buf req = {0};
  add_request(&req, OP_SET, "close/p", value, VLEN, 0);
  for (int i = 0; i < N_GET; i++) add_request(&req, OP_GET, "close/p", NULL, 0, 0);
  add_request(&req, OP_WAIT, "close/never-set", NULL, 0, 5000);
  add_request(&req, OP_GET, "close/p", NULL, 0, 0);

  int fd = connect_client(RCVBUF);
  send_all(fd, req.p, req.len);
  CHECK(shutdown(fd, SHUT_WR) == 0);
  let_server_act(fd, 1.0);
  bool reset;
  buf r = read_to_end(fd, &reset);
  check_set_then_gets(&r, value, VLEN, N_GET);
  CHECK(!reset);
  close(fd);
  free(r.p);
  free(req.p);
  printf("parked WAIT, then a half-close: the %d answers before it, then an orderly close\n", N_GET + 1);
}

/* One request stream, sent in pieces of `piece` bytes (each its own
 * segment: TCP_NODELAY, a pause between); every answer is checked. */
static void run_split(size_t piece, int round) {
  char key[32], ckey[32];
  snprintf(key, sizeof key, "split/%d", round);
  snprintf(ckey, sizeof ckey, "split/c%d", round);
  static const char v1[] = "first value", v2[] = "a second, longer value: 0123456789";
  buf req = {0};
  add_request(&req, OP_SET, key, v1, sizeof v1 - 1, 0);
  add_request(&req, OP_GET, key, NULL, 0, 0);
  add_request(&req, OP_ADD, ckey, NULL, 0, 5);
  add_request(&req, OP_ADD, ckey, NULL, 0, -12);
  add_request(&req, OP_SET, key, v2, sizeof v2 - 1, 0);
  add_request(&req, OP_WAIT, key, NULL, 0, 1000); /* present: answered at once */
  add_request(&req, OP_DELETE, key, NULL, 0, 0);
  add_request(&req, OP_GET, key, NULL, 0, 0);
  add_request(&req, OP_DELETE, ckey, NULL, 0, 0);

  int fd = connect_client(0);
  for (size_t o = 0; o < req.len; o += piece) {
    send_all(fd, req.p + o, TD_MIN(piece, req.len - o));
    if (piece < 64) usleep(200); /* separate segments, at most a few ms per stream */
  }
  CHECK(shutdown(fd, SHUT_WR) == 0);
  bool reset;
  buf r = read_to_end(fd, &reset);
  CHECK(!reset);
  /* status, flags, value, number of each answer, in order */
  struct {
    uint32_t flags;
    const char *value;
    size_t len;
    int64_t num;
  } want[] = {
      {0, "", 0, 0},                 /* SET */
      {1, v1, sizeof v1 - 1, 0},     /* GET: found */
      {0, "", 0, 5},                 /* ADD: 0 + 5 */
      {0, "", 0, -7},                /* ADD: 5 - 12 */
      {0, "", 0, 0},                 /* SET */
      {1, v2, sizeof v2 - 1, 0},     /* WAIT: found */
      {2, "", 0, 0},                 /* DELETE: existed */
      {0, "", 0, 0},                 /* GET: missing */
      {2, "", 0, 0},                 /* DELETE: existed */
  };
  size_t o = 0;
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    if (r.len - o < RESP) td_test_fail(__FILE__, __LINE__, "piece %zu: answer %zu missing", piece, i);
    const unsigned char *p = r.p + o;
    CHECK_EQ_INT(get_le(p, 4), MAGIC);
    CHECK_EQ_INT(get_le(p + 4, 4), 0);
    CHECK_EQ_INT(get_le(p + 8, 4), want[i].flags);
    CHECK_EQ_INT(get_le(p + 16, 8), want[i].len);
    CHECK_EQ_INT((int64_t)get_le(p + 24, 8), want[i].num);
    CHECK(r.len - o - RESP >= want[i].len && memcmp(p + RESP, want[i].value, want[i].len) == 0);
    o += RESP + want[i].len;
  }
  CHECK_EQ_INT(o, r.len); /* nothing more */
  close(fd);
  free(r.p);
  free(req.p);
}

static void test_splits(void) {
  static const size_t pieces[] = {1, 2, 3, 7, 39, 40, 41, 79, 80, 81, 4096};
  for (size_t i = 0; i < sizeof pieces / sizeof pieces[0]; i++) run_split(pieces[i], (int)i);
  printf("one request stream cut into pieces of 1 to 4096 bytes: every answer as computed\n");
}

int main(void) {
  td_store_server *srv = NULL;
  CHECK_OK(store_server_start("127.0.0.1", 0, &srv));
  g_port = store_server_port(srv);
  test_malformed_after_answers();
  test_parked_half_close();
  test_splits();
  store_server_stop(srv);
  printf("test_store_close: all checks passed\n");
  return 0;
}
