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
 *   3: the pure parsers alone, on the raw bytes;
 *   4: the acceptor's state machine (net_auth_acceptor_feed, what the store
 *      server's and the TCP transport's poll loops run) fed the input in
 *      pieces of a fuzz-chosen size;
 *   5: the same with an honest connector: the hello comes from the input
 *      (magic and role set right), the proof is computed with the key.
 * (modes 4-5: bits 3-7 of byte 0 give the piece size, 0 = all it wants)
 * (mode 2: bit 3 of byte 0 gives the connector the other context). Byte 1:
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

/* Feed `n` bytes to the acceptor machine in pieces of at most `piece`
 * (0: what it wants); returns the last verdict and counts the bytes it
 * took before that verdict. */
static int feed(net_auth_acceptor *a, const uint8_t *p, size_t n, size_t piece, size_t *taken,
                unsigned char out[NET_AUTH_MSG_BYTES]) {
  int r = NET_AUTH_MORE;
  *taken = 0;
  while (*taken < n && r == NET_AUTH_MORE) {
    size_t want = net_auth_acceptor_want(a);
    if (want == 0) fail("the machine wants nothing while it asks for more");
    size_t k = n - *taken < want ? n - *taken : want;
    if (piece && k > piece) k = piece;
    r = net_auth_acceptor_feed(a, NET_AUTH_ROLE_TCP, CTX_A, p + *taken, k, out);
    *taken += k;
  }
  return r;
}

static void acceptor_machine(const uint8_t *p, size_t n, size_t piece, bool honest) {
  net_auth_acceptor a;
  memset(&a, 0, sizeof a);
  unsigned char out[NET_AUTH_MSG_BYTES];
  size_t taken = 0;
  if (!honest) {
    int r = feed(&a, p, n, piece, &taken, out);
    bool magic_ok = n >= 4 && le(p, 4) == NET_AUTH_MAGIC;
    bool hello_ok = n >= NET_AUTH_HELLO_BYTES && magic_ok && le(p + 4, 4) == NET_AUTH_ROLE_TCP;
    if (n >= 4 && !magic_ok) {
      if (r != NET_AUTH_FAIL || taken > 4 + (piece ? piece : NET_AUTH_HELLO_BYTES))
        fail("a stream without the magic was not refused at its first bytes");
    } else if (n < NET_AUTH_HELLO_BYTES) {
      if (r != NET_AUTH_MORE) fail("a short, well-started hello did not ask for more");
    } else if (!hello_ok) {
      if (r != NET_AUTH_FAIL || taken != NET_AUTH_HELLO_BYTES) fail("a hello of another role was not refused");
    } else {
      if (r != NET_AUTH_REPLY || taken != NET_AUTH_HELLO_BYTES || le(out, 4) != NET_AUTH_MAGIC)
        fail("a well-formed hello got no challenge");
      /* The rest is a proof nobody without the key (and this nonce) can make. */
      r = feed(&a, p + taken, n - taken, piece, &taken, out);
      if (r == NET_AUTH_DONE || r == NET_AUTH_REPLY) fail("the machine accepted a forged proof");
      if ((r == NET_AUTH_FAIL) != (n - NET_AUTH_HELLO_BYTES >= NET_AUTH_MSG_BYTES))
        fail("a complete proof got no verdict, or a partial one got one");
    }
    return;
  }
  /* Honest: the hello's rank and nonce from the input, magic and role right. */
  uint8_t hello[NET_AUTH_HELLO_BYTES] = {0};
  memcpy(hello, p, n < sizeof hello ? n : sizeof hello);
  for (int i = 0; i < 4; i++) {
    hello[i] = (uint8_t)(NET_AUTH_MAGIC >> (8 * i));
    hello[4 + i] = (uint8_t)(NET_AUTH_ROLE_TCP >> (8 * i));
  }
  if (feed(&a, hello, sizeof hello, piece, &taken, out) != NET_AUTH_REPLY) fail("an honest hello got no challenge");
  net_auth_hello h;
  if (net_auth_parse_hello(hello, sizeof hello, &h) != 0) fail("parse_hello refused an honest hello");
  unsigned char nonce_s[NET_AUTH_NONCE_BYTES], mac[NET_AUTH_MAC_BYTES], proof[NET_AUTH_MSG_BYTES];
  memcpy(nonce_s, out + 4, sizeof nonce_s);
  net_auth_mac(false, CTX_A, &h, nonce_s, mac);
  net_auth_encode_msg(proof, mac);
  if (feed(&a, proof, sizeof proof, piece, &taken, out) != NET_AUTH_DONE) fail("an honest proof was refused");
  if (a.hello.rank != h.rank) fail("the machine lost the connector's rank");
  if (!net_auth_check(true, CTX_A, &h, nonce_s, out + 4)) fail("the acceptor's answer does not verify");
  if (net_auth_acceptor_want(&a) != 0) fail("an authenticated machine still wants bytes");
}

/* A job secret as tandemrun would hand it out (any 32+ bytes). */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
  setenv("TANDEM_SECRET", "fuzz-hello-0123456789abcdef0123456789abcdef", 1);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2) return 0;
  int mode = data[0] % 8;
  if (mode >= 6) mode -= 4; /* 6, 7: the machine again (it has the most to explore) */
  uint32_t role = (data[1] & 1) ? NET_AUTH_ROLE_TCP : NET_AUTH_ROLE_STORE;
  int32_t rank = (int32_t)(data[1] >> 1) - 1;
  const uint8_t *peer_bytes = data + 2;
  size_t n_peer = size - 2;

  if (mode == 3) {
    pure_parsers(peer_bytes, n_peer);
    return 0;
  }
  if (mode >= 4) {
    acceptor_machine(peer_bytes, n_peer, data[0] >> 3, mode == 5);
    return 0;
  }

  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) fail("socketpair");
  uint8_t written[256];

  if (mode == 2) {
    /* Honest peers: the connector's role and context from the input. */
    honest h = {.fd = sv[1], .role = role, .rank = rank, .ctx = (data[0] & 8) ? CTX_B : CTX_A};
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
