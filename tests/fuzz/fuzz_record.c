/* libFuzzer harness for the protected TCP stream's receiving side
 * (src/comm/transport/tcp/stream.c over src/net/protect.c): what a rank
 * reads from a peer's connection with TANDEM_TCP_PROTECT on. The input's
 * bytes go into one end of a socket pair; the other end is read with
 * tcp_stream_recv (and tcp_stream_peek) in pieces of fuzz-chosen sizes.
 * Byte 0 picks what the input plays:
 *   0: a stranger's stream (no key): the bytes after byte 2 as they are;
 *   1: the honest peer's stream with one bit flipped: records of the
 *      payload sizes and contents the input gives, sealed with the peer's
 *      key, then bit (byte 1 | byte 2 << 8) of the stream flipped (or none
 *      when it lies past the end);
 *   2: as 1, with a record dropped (the index in byte 1) or repeated
 *      (byte 2 odd) instead of a flipped bit.
 * Bit 7 of byte 0: integrity (0) or encrypt (1); bits 3-6: the read size.
 *
 * Oracle, from the plaintext kept here: nothing is handed out that was not
 * sealed by the peer at that position of the stream; mode 0 hands out
 * nothing at all (a valid tag needs the key); in modes 1-2 the records
 * before the damage come out exactly, and the damaged one and everything
 * after it never do (the stream reports FORGED); an undamaged stream comes
 * out whole. The stream never reports a contract breach (MISUSE). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/transport/tcp/stream.h"

static void fail(const char *what) {
  fprintf(stderr, "fuzz_record: contract broken: %s\n", what);
  __builtin_trap();
}

static net_auth_session session(void) {
  net_auth_session s;
  memset(&s, 0, sizeof s);
  for (int i = 0; i < NET_AUTH_NONCE_BYTES; i++) {
    s.hello.nonce[i] = (unsigned char)i;
    s.nonce_s[i] = (unsigned char)(255 - i);
  }
  s.hello.rank = 1;
  return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int ready;
  if (!ready) {
    setenv("TANDEM_SECRET", "fuzz-record-secret-0123456789abcdef0123456789", 1);
    if (net_auth_init() != TD_OK) fail("net_auth_init");
    ready = 1;
  }
  if (size < 3) return 0;
  int mode = data[0] & 3;
  if (mode == 3) return 0;
  net_protect_mode pm = (data[0] & 0x80) ? NET_PROTECT_ENCRYPT : NET_PROTECT_INTEGRITY;
  size_t read_size = (size_t)((data[0] >> 3) & 15) * 37 + 1;
  net_auth_session s = session();
  tcp_stream sender, receiver;
  if (tcp_stream_init(&sender, pm, false, "fuzz", &s, true) != TD_OK ||
      tcp_stream_init(&receiver, pm, false, "fuzz", &s, false) != TD_OK)
    fail("tcp_stream_init");

  /* The wire bytes and, for modes 1-2, the plaintext the peer sealed. */
  const uint8_t *body = data + 3;
  size_t body_len = size - 3;
  uint8_t *wire = NULL, *plain = NULL;
  size_t wire_len = 0, plain_len = 0, good_plain = 0; /* plaintext before the damage */
  if (mode == 0) {
    wire = malloc(body_len + 1);
    memcpy(wire, body, body_len);
    wire_len = body_len;
  } else {
    /* records: a length byte (1..255 payload bytes, scaled), then payload */
    wire = malloc(body_len * 2 + 64 * (body_len + 1) + 64);
    plain = malloc(body_len + 1);
    size_t n_rec = 0, rec_start[512], rec_end[512], rec_plain_end[512];
    for (size_t i = 0; i < body_len && n_rec < 512;) {
      size_t len = body[i++] % 200 + 1;
      if (len > body_len - i) len = body_len - i;
      uint8_t hdr[NET_PROTECT_HDR_BYTES], tag[NET_PROTECT_TAG_BYTES];
      uint8_t *payload = malloc(len + 1);
      memcpy(payload, body + i, len);
      memcpy(plain + plain_len, body + i, len);
      net_protect_seal(&sender.send_key, hdr, payload, len, tag);
      rec_start[n_rec] = wire_len;
      memcpy(wire + wire_len, hdr, sizeof hdr);
      memcpy(wire + wire_len + sizeof hdr, payload, len);
      memcpy(wire + wire_len + sizeof hdr + len, tag, sizeof tag);
      wire_len += sizeof hdr + len + sizeof tag;
      rec_end[n_rec] = wire_len;
      plain_len += len;
      rec_plain_end[n_rec] = plain_len;
      n_rec++;
      free(payload);
      i += len;
    }
    good_plain = plain_len;
    if (mode == 1) {
      size_t bit = (size_t)data[1] | (size_t)data[2] << 8;
      if (bit / 8 < wire_len) {
        wire[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        size_t r = 0;
        while (rec_end[r] <= bit / 8) r++;
        good_plain = r ? rec_plain_end[r - 1] : 0;
      }
    } else if (n_rec > 0) {
      size_t r = data[1] % n_rec;
      size_t len = rec_end[r] - rec_start[r];
      good_plain = r ? rec_plain_end[r - 1] : 0;
      if (data[2] & 1) { /* repeated: the copy follows the original */
        memmove(wire + rec_end[r] + len, wire + rec_end[r], wire_len - rec_end[r]);
        memcpy(wire + rec_end[r], wire + rec_start[r], len);
        wire_len += len;
        good_plain = rec_plain_end[r];
      } else { /* dropped */
        memmove(wire + rec_start[r], wire + rec_end[r], wire_len - rec_end[r]);
        wire_len -= len; /* good_plain: the records before it */
      }
    }
  }

  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) != 0) fail("socketpair");
  int big = 1 << 22;
  setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
  setsockopt(sv[0], SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
  size_t off = 0;
  uint8_t *out = malloc(plain_len + read_size + 1);
  size_t got = 0;
  bool forged = false, ended = false;
  while (!forged && !ended) {
    while (off < wire_len) { /* feed what the socket takes */
      ssize_t w = send(sv[1], wire + off, wire_len - off, MSG_DONTWAIT);
      if (w <= 0) break;
      off += (size_t)w;
    }
    if (off == wire_len) shutdown(sv[1], SHUT_WR);
    if (got % 3 == 1) { /* a peek now and then: it must agree with the next receive */
      uint8_t peek[64];
      size_t seen = 0, wire_bytes = 0;
      int err = 0;
      tcp_stream_result r = tcp_stream_peek(&receiver, sv[0], peek, sizeof peek, &seen, &wire_bytes, &err);
      if (r == TCP_STREAM_MISUSE) fail("peek: misuse");
      if (r == TCP_STREAM_FORGED) forged = true;
      if (seen && (mode == 0 || got + seen > good_plain || memcmp(peek, plain + got, seen) != 0))
        fail("peek showed bytes the peer did not seal there");
      if (forged) break;
    }
    size_t moved = 0, wire_bytes = 0;
    int err = 0;
    size_t want = read_size;
    tcp_stream_result r = tcp_stream_recv(&receiver, sv[0], out + got, want, &moved, &wire_bytes, &err);
    if (r == TCP_STREAM_MISUSE) fail("recv: misuse");
    if (moved) {
      if (mode == 0) fail("a stranger's bytes were handed out");
      if (got + moved > good_plain || memcmp(out + got, plain + got, moved) != 0)
        fail("bytes handed out that the peer did not seal at that position");
      got += moved;
    }
    if (r == TCP_STREAM_FORGED) forged = true;
    else if (r == TCP_STREAM_IO) ended = true; /* EOF once everything was fed and read */
  }
  if (mode != 0 && good_plain == plain_len && !forged && got != plain_len)
    fail("an undamaged stream did not come out whole");
  if (mode != 0 && good_plain < plain_len && got > good_plain) fail("bytes after the damage came out");
  close(sv[0]);
  close(sv[1]);
  free(out);
  free(wire);
  free(plain);
  tcp_stream_free(&sender);
  tcp_stream_free(&receiver);
  return 0;
}
