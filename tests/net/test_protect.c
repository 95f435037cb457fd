/* Protected-stream records (src/net/protect.c), for each cipher this CPU
 * runs (ChaCha20-Poly1305 always, AES-256-GCM with AES-NI) and both modes:
 *   - the two ends of a real handshake (a socketpair, connector on a
 *     thread) derive matching keys: each one's send key is the other's
 *     receive key, the directions differ, another connection's differ;
 *   - records of 0, 1, 15, 16, 17, 4095 bytes, 64 KiB and the maximum open
 *     to what was sealed; integrity leaves the bytes as they are, encryption
 *     changes them; the tag equals libsodium's own AEAD called here with the
 *     derived key and the record counter as nonce (the reference);
 *   - a flipped bit anywhere (header length, payload, tag), a replayed,
 *     a reordered and a dropped record, a record of the other direction, of
 *     another connection and of the other mode all fail, leave the counter
 *     where it was, and the right record still opens after them;
 *   - a bad header (magic, a length over the maximum) is refused. */
#include "../common/check.h"
#include "net/net.h"

#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct {
  int fd;
  net_auth_session session;
} connector_arg;

static void *connector_main(void *arg) {
  connector_arg *c = arg;
  CHECK_OK(net_auth_connect_session(c->fd, NET_AUTH_ROLE_TCP, 3, "tcp test 0", "the acceptor", td_now() + 10,
                                    &c->session));
  return NULL;
}

/* One authenticated connection: both ends' sessions. */
static void handshake(net_auth_session *conn, net_auth_session *acc) {
  int sv[2];
  CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  connector_arg c = {.fd = sv[1]};
  pthread_t th;
  CHECK(pthread_create(&th, NULL, connector_main, &c) == 0);
  CHECK_OK(net_auth_accept_session(sv[0], NET_AUTH_ROLE_TCP, "tcp test 0", td_now() + 10, acc));
  pthread_join(th, NULL);
  *conn = c.session;
  CHECK(memcmp(conn, acc, sizeof *conn) == 0); /* both ends saw the same nonces and hello */
  CHECK_EQ_INT(acc->hello.rank, 3);
  close(sv[0]);
  close(sv[1]);
}

typedef struct {
  unsigned char hdr[NET_PROTECT_HDR_BYTES], tag[NET_PROTECT_TAG_BYTES];
  unsigned char *data;
  size_t len;
} record;

static void seal(net_protect_key *k, record *r, const unsigned char *plain, size_t len) {
  r->data = malloc(len ? len : 1);
  if (len) memcpy(r->data, plain, len);
  r->len = len;
  net_protect_seal(k, r->hdr, r->data, len, r->tag);
}

/* Open a copy (a failed open may scribble over the data). */
static bool open_copy(net_protect_key *k, const record *r, unsigned char *out) {
  if (r->len) memcpy(out, r->data, r->len);
  return net_protect_open(k, r->hdr, out, r->len, r->tag);
}

static void test_cipher(bool aes, const net_auth_session *s_conn, const net_auth_session *s_acc,
                        const net_auth_session *other) {
  const char *name = aes ? "AES-256-GCM" : "ChaCha20-Poly1305";
  static const size_t sizes[] = {0, 1, 15, 16, 17, 4095, 65536, NET_PROTECT_RECORD_MAX};
  unsigned char *plain = malloc(NET_PROTECT_RECORD_MAX), *out = malloc(NET_PROTECT_RECORD_MAX);
  for (size_t i = 0; i < NET_PROTECT_RECORD_MAX; i++) plain[i] = (unsigned char)(i * 7 + 1);
  for (int mode = NET_PROTECT_INTEGRITY; mode <= NET_PROTECT_ENCRYPT; mode++) {
    net_protect_key c_send, c_recv, a_send, a_recv, o_send, o_recv, m_send, m_recv;
    CHECK_OK(net_protect_derive(mode, aes, "tcp test 0", s_conn, true, &c_send, &c_recv));
    CHECK_OK(net_protect_derive(mode, aes, "tcp test 0", s_acc, false, &a_send, &a_recv));
    CHECK_OK(net_protect_derive(mode, aes, "tcp test 0", other, true, &o_send, &o_recv));
    int other_mode = mode == NET_PROTECT_INTEGRITY ? NET_PROTECT_ENCRYPT : NET_PROTECT_INTEGRITY;
    CHECK_OK(net_protect_derive(other_mode, aes, "tcp test 0", s_conn, true, &m_send, &m_recv));
    CHECK(memcmp(c_send.key, a_recv.key, 32) == 0 && memcmp(a_send.key, c_recv.key, 32) == 0);
    CHECK(memcmp(c_send.key, c_recv.key, 32) != 0);
    CHECK(memcmp(c_send.key, o_send.key, 32) != 0 && memcmp(c_send.key, m_send.key, 32) != 0);

    /* Round trips, both directions, checked against libsodium directly. */
    for (size_t si = 0; si < TD_ARRAY_SIZE(sizes); si++) {
      size_t len = sizes[si];
      for (int dir = 0; dir < 2; dir++) {
        net_protect_key *tx = dir ? &a_send : &c_send, *rx = dir ? &c_recv : &a_recv;
        uint64_t n = tx->counter;
        record r;
        seal(tx, &r, plain, len);
        CHECK_EQ_INT(tx->counter, n + 1);
        if (mode == NET_PROTECT_INTEGRITY) CHECK(len == 0 || memcmp(r.data, plain, len) == 0);
        else if (len >= 16) CHECK(memcmp(r.data, plain, len) != 0);
        /* the reference: the AEAD with the record counter as nonce */
        unsigned char nonce[12] = {0}, tag[16], *ct = malloc(len + 1);
        for (int b = 0; b < 8; b++) nonce[b] = (unsigned char)(n >> (8 * b));
        unsigned long long tl;
        bool enc = mode == NET_PROTECT_ENCRYPT;
        if (aes)
          crypto_aead_aes256gcm_encrypt_detached(ct, tag, &tl, enc ? plain : ct, enc ? len : 0, enc ? NULL : plain,
                                                 enc ? 0 : len, NULL, nonce, tx->key);
        else
          crypto_aead_chacha20poly1305_ietf_encrypt_detached(ct, tag, &tl, enc ? plain : ct, enc ? len : 0,
                                                             enc ? NULL : plain, enc ? 0 : len, NULL, nonce, tx->key);
        CHECK(memcmp(tag, r.tag, 16) == 0);
        if (enc && len) CHECK(memcmp(ct, r.data, len) == 0);
        free(ct);
        CHECK(open_copy(rx, &r, out));
        CHECK(len == 0 || memcmp(out, plain, len) == 0);
        CHECK_EQ_INT(rx->counter, n + 1);
        free(r.data);
      }
    }

    /* Tampering: every kind fails and leaves the counter; the true record
     * then still opens. */
    record r1, r2, r3;
    seal(&c_send, &r1, plain, 5000);
    seal(&c_send, &r2, plain + 5000, 5000);
    seal(&c_send, &r3, plain + 10000, 300);
    uint64_t at = a_recv.counter;
    static const size_t flips[] = {0, 1, 2, 2499, 4999};
    for (size_t f = 0; f < TD_ARRAY_SIZE(flips); f++) {
      r1.data[flips[f]] ^= 0x20;
      CHECK(!open_copy(&a_recv, &r1, out));
      r1.data[flips[f]] ^= 0x20;
    }
    for (int b = 0; b < 16; b++) {
      r1.tag[b] ^= 1;
      CHECK(!open_copy(&a_recv, &r1, out));
      r1.tag[b] ^= 1;
    }
    r1.hdr[0] ^= 1; /* another length: the parser or the tag catches it */
    CHECK(!open_copy(&a_recv, &r1, out));
    r1.hdr[0] ^= 1;
    CHECK(!open_copy(&a_recv, &r2, out)); /* reordered (r2 before r1) */
    CHECK(!open_copy(&a_recv, &r3, out)); /* r1 and r2 dropped */
    CHECK_EQ_INT(a_recv.counter, at);
    CHECK(!open_copy(&c_recv, &r1, out));  /* reflected back to its sender */
    CHECK(!open_copy(&o_recv, &r1, out));  /* another connection */
    CHECK(!open_copy(&m_recv, &r1, out));  /* the same connection in the other mode */
    CHECK(open_copy(&a_recv, &r1, out));
    CHECK(memcmp(out, plain, 5000) == 0);
    CHECK(!open_copy(&a_recv, &r1, out)); /* replayed */
    CHECK(open_copy(&a_recv, &r2, out) && memcmp(out, plain + 5000, 5000) == 0);
    CHECK(open_copy(&a_recv, &r3, out) && memcmp(out, plain + 10000, 300) == 0);
    free(r1.data);
    free(r2.data);
    free(r3.data);

    net_protect_key *keys[] = {&c_send, &c_recv, &a_send, &a_recv, &o_send, &o_recv, &m_send, &m_recv};
    for (size_t i = 0; i < TD_ARRAY_SIZE(keys); i++) net_protect_key_clear(keys[i]);
    printf("%s %s: keys match across the handshake; %zu sizes open as sealed and match libsodium; flipped bits, "
           "replay, reorder, drop, reflection, another connection or mode refused\n",
           name, net_protect_mode_name(mode), TD_ARRAY_SIZE(sizes));
  }
  free(plain);
  free(out);
}

int main(void) {
  setenv("TANDEM_SECRET", "protect-test-secret-0123456789abcdef0123456789", 1);
  CHECK_OK(net_auth_init());
  net_auth_session conn, acc, other, other_acc;
  handshake(&conn, &acc);
  handshake(&other, &other_acc);
  CHECK(memcmp(conn.nonce_s, other.nonce_s, NET_AUTH_NONCE_BYTES) != 0);

  /* Headers. */
  unsigned char hdr[NET_PROTECT_HDR_BYTES];
  size_t len = 0;
  net_protect_key k;
  CHECK_OK(net_protect_derive(NET_PROTECT_INTEGRITY, false, "x", &conn, true, &k, &(net_protect_key){0}));
  unsigned char byte = 9, tag[NET_PROTECT_TAG_BYTES];
  net_protect_seal(&k, hdr, &byte, 1, tag);
  CHECK_EQ_INT(net_protect_parse_hdr(hdr, &len), 0);
  CHECK_EQ_INT(len, 1);
  unsigned char bad[NET_PROTECT_HDR_BYTES];
  memcpy(bad, hdr, sizeof bad);
  bad[5] ^= 1;
  CHECK_EQ_INT(net_protect_parse_hdr(bad, &len), -1);
  memcpy(bad, hdr, sizeof bad);
  bad[2] = 0x10; /* 1 MiB + 1 */
  bad[0] = 1;
  CHECK_EQ_INT(net_protect_parse_hdr(bad, &len), -1);
  net_protect_key_clear(&k);
  net_protect_mode m;
  CHECK(net_protect_parse_mode("integrity", &m) == 0 && m == NET_PROTECT_INTEGRITY);
  CHECK(net_protect_parse_mode("Encrypt", &m) == -1);

  test_cipher(false, &conn, &acc, &other);
  if (net_protect_aes_available())
    test_cipher(true, &conn, &acc, &other);
  else
    printf("AES-256-GCM: not run (this CPU has no AES-NI/PCLMUL; ChaCha20-Poly1305 is what it uses)\n");
  printf("protect: ok\n");
  return 0;
}
