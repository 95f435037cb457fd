/* libFuzzer harness for the connection handshake (src/net/auth.c): the
 * hello every store client and every TCP transport connection opens with,
 * and the challenge, proof and accept messages after it (wire format in
 * net.h). Byte 0 picks what the input plays:
 *   0: a connector talking to net_auth_accept (the store's and the TCP
 *      transport's listening side): the input is its HELLO + PROOF bytes;
 *   1: an acceptor answering net_auth_connect (a store client, a rank
 *      connecting to a lower rank): the input is its CHALLENGE + ACCEPT;
 *   2: both sides honest, over a socket pair, each with a fuzz-chosen role
 *      and context (which listener it thinks it talks to);
 *   3: the pure parsers alone, on the raw bytes.
 * (mode 2: bit 2 of byte 0 gives the connector the other context). Byte 1:
 * bit 0 = the role (store or tcp), the rest = rank + 1, of the side under
 * test (mode 2: of the connector; the acceptor expects tcp, context A).
 *
 * Oracle, from a decoding written here (magic "TDA1", integers LE):
 * - nobody without the key gets in: with fuzzed bytes on the other end,
 *   both sides fail (a valid proof or accept needs the random nonce of this
 *   very connection and the job key);
 * - the acceptor answers a hello with a challenge exactly when it is well
 *   formed with the expected role, and the connector sends its proof
 *   exactly when the challenge is well formed; neither sends anything else;
 * - honest peers agree (both succeed) exactly when role and context match;
 * - the parsers accept exactly the right length and magic, and encoding
 *   what they parsed gives back the same bytes.
 * Every side is bounded by a deadline; the peer's end is half-closed, so a
 * short input ends the exchange at once. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net/net.h"

#define CTX_A "tcp job/c0 0"
#define CTX_B "tcp job/c0 1"

static uint64_t le(const uint8_t *p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

static void fail(const char *what) {
  fprintf(stderr, "fuzz_hello: contract broken: %s (last error: %s)\n", what, td_last_error());
  __builtin_trap();
}

/* Everything the side under test wrote, after it returned. */
static size_t drain(int fd, uint8_t *buf, size_t cap) {
  size_t got = 0;
  for (;;) {
    ssize_t n = recv(fd, buf + got, cap - got, MSG_DONTWAIT);
    if (n <= 0) return got;
    got += (size_t)n;
    if (got == cap) return got;
  }
}

static bool well_formed(const uint8_t *p, size_t avail, size_t len) {
  return avail >= len && le(p, 4) == NET_AUTH_MAGIC;
}

typedef struct honest {
  int fd;
  uint32_t role;
  int32_t rank;
  const char *ctx;
  td_status st;
} honest;

static void *honest_connector(void *arg) {
  honest *h = arg;
  h->st = net_auth_connect(h->fd, h->role, h->rank, h->ctx, "the fuzzed acceptor", td_now() + 5.0);
  /* Unblock an acceptor still waiting for a proof this side will not send. */
  shutdown(h->fd, SHUT_WR);
  return NULL;
}

static void pure_parsers(const uint8_t *data, size_t size) {
  net_auth_hello hello;
  unsigned char out[NET_AUTH_HELLO_BYTES], payload[32], msg[NET_AUTH_MSG_BYTES];
  bool hello_ok = size == NET_AUTH_HELLO_BYTES && le(data, 4) == NET_AUTH_MAGIC;
  if ((net_auth_parse_hello(data, size, &hello) == 0) != hello_ok) fail("parse_hello: wrong verdict");
  if (hello_ok) {
    if (hello.role != le(data + 4, 4) || (uint32_t)hello.rank != le(data + 8, 4) || memcmp(hello.nonce, data + 12, 32))
      fail("parse_hello: wrong fields");
    net_auth_encode_hello(out, &hello);
    if (memcmp(out, data, NET_AUTH_HELLO_BYTES)) fail("encode_hello(parse_hello(x)) != x");
  }
  bool msg_ok = size == NET_AUTH_MSG_BYTES && le(data, 4) == NET_AUTH_MAGIC;
  if ((net_auth_parse_msg(data, size, payload) == 0) != msg_ok) fail("parse_msg: wrong verdict");
  if (msg_ok) {
    net_auth_encode_msg(msg, payload);
    if (memcmp(msg, data, NET_AUTH_MSG_BYTES)) fail("encode_msg(parse_msg(x)) != x");
  }
}

/* A job secret as tandemrun would hand it out (any 32+ bytes). */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
  setenv("TANDEM_SECRET", "fuzz-hello-0123456789abcdef0123456789abcdef", 1);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2) return 0;
  int mode = data[0] % 4;
  uint32_t role = (data[1] & 1) ? NET_AUTH_ROLE_TCP : NET_AUTH_ROLE_STORE;
  int32_t rank = (int32_t)(data[1] >> 1) - 1;
  const uint8_t *peer_bytes = data + 2;
  size_t n_peer = size - 2;

  if (mode == 3) {
    pure_parsers(peer_bytes, n_peer);
    return 0;
  }

  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) fail("socketpair");
  uint8_t written[256];

  if (mode == 2) {
    /* Honest peers: the connector's role and context from the input. */
    honest h = {.fd = sv[1], .role = role, .rank = rank, .ctx = (data[0] & 4) ? CTX_B : CTX_A};
    pthread_t thread;
    if (pthread_create(&thread, NULL, honest_connector, &h) != 0) fail("pthread_create");
    net_auth_hello got;
    td_status st = net_auth_accept(sv[0], NET_AUTH_ROLE_TCP, CTX_A, td_now() + 5.0, &got);
    shutdown(sv[0], SHUT_WR);
    pthread_join(thread, NULL);
    bool match = role == NET_AUTH_ROLE_TCP && strcmp(h.ctx, CTX_A) == 0;
    if ((st == TD_OK) != match) fail("the acceptor's verdict on honest peers is wrong");
    if ((h.st == TD_OK) != match) fail("the connector's verdict on honest peers is wrong");
    if (match && (got.rank != rank || got.role != role)) fail("the accepted hello lost its rank or role");
  } else {
    /* The other side is the fuzz input, written ahead and half-closed. */
    size_t n = n_peer < 4096 ? n_peer : 4096;
    if (n && send(sv[1], peer_bytes, n, MSG_NOSIGNAL) != (ssize_t)n) fail("socketpair send");
    shutdown(sv[1], SHUT_WR);
    if (mode == 0) {
      net_auth_hello got;
      td_status st = net_auth_accept(sv[0], role, CTX_A, td_now() + 5.0, &got);
      if (st == TD_OK) fail("the acceptor let in bytes that do not hold the key");
      shutdown(sv[0], SHUT_WR);
      size_t w = drain(sv[1], written, sizeof written);
      bool hello_ok = well_formed(peer_bytes, n, NET_AUTH_HELLO_BYTES) && le(peer_bytes + 4, 4) == role;
      if (w != (hello_ok ? NET_AUTH_MSG_BYTES : 0u)) fail("the acceptor's answer to the hello is wrong");
      if (w && le(written, 4) != NET_AUTH_MAGIC) fail("the challenge lacks the magic");
    } else {
      td_status st = net_auth_connect(sv[0], role, rank, CTX_A, "the fuzzed acceptor", td_now() + 5.0);
      if (st == TD_OK) fail("the connector accepted an acceptor that does not hold the key");
      shutdown(sv[0], SHUT_WR);
      size_t w = drain(sv[1], written, sizeof written);
      bool challenge_ok = well_formed(peer_bytes, n, NET_AUTH_MSG_BYTES);
      if (w != NET_AUTH_HELLO_BYTES + (challenge_ok ? NET_AUTH_MSG_BYTES : 0u)) fail("the connector sent the wrong bytes");
      if (le(written, 4) != NET_AUTH_MAGIC || le(written + 4, 4) != role || (int32_t)le(written + 8, 4) != rank)
        fail("the connector's hello is wrong");
      if (challenge_ok && le(written + NET_AUTH_HELLO_BYTES, 4) != NET_AUTH_MAGIC) fail("the proof lacks the magic");
    }
  }
  close(sv[0]);
  close(sv[1]);
  return 0;
}
