/* Protected TCP streams (the contract is in stream.h; the record format and
 * the keys in src/net/protect.c).
 *
 * Sending: the caller's bytes are cut into records of at most
 * TCP_STREAM_RECORD_BYTES. Integrity only, the record's payload is the
 * caller's buffer itself (sealing reads it; sendmsg writes header, buffer
 * and tag from where they are: no copy). Encrypted, the payload is first
 * copied to enc_buf and encrypted there. A record is reported moved once
 * its last byte is in the kernel; until then the caller retries with the
 * same bytes and each retry writes more.
 *
 * Receiving: a record whose payload fits the caller's request is read
 * straight into the caller's buffer and reported only after its tag
 * checked out (the bytes sit there unreported until then); a larger one
 * (a header-and-payload frame read header first, or a peek) goes to the
 * stage and is handed out from there. A record that fails its check is
 * never handed out, and the stream is dead from then on (the transport
 * fails the communicator naming the peer). */
#include "comm/transport/tcp/stream.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#define HDR NET_PROTECT_HDR_BYTES
#define TAG NET_PROTECT_TAG_BYTES

_Static_assert(TCP_STREAM_RECORD_BYTES <= NET_PROTECT_RECORD_MAX, "records within the format's limit");

td_status tcp_stream_init(tcp_stream *s, net_protect_mode mode, bool aes, const char *ctx,
                          const net_auth_session *session, bool connector) {
  memset(s, 0, sizeof *s);
  return net_protect_derive(mode, aes, ctx, session, connector, &s->send_key, &s->recv_key);
}

void tcp_stream_free(tcp_stream *s) {
  if (!s) return;
  net_protect_key_clear(&s->send_key);
  net_protect_key_clear(&s->recv_key);
  free(s->enc_buf);
  free(s->stage);
  memset(s, 0, sizeof *s);
}

tcp_stream_result tcp_stream_send(tcp_stream *s, int fd, const void *buf, size_t len, size_t *moved, int *err) {
  *moved = 0;
  const unsigned char *src = buf;
  if (!s->out_len) {
    if (!len) return TCP_STREAM_OK;
    size_t n = len < TCP_STREAM_RECORD_BYTES ? len : TCP_STREAM_RECORD_BYTES;
    if (s->send_key.mode == NET_PROTECT_ENCRYPT) {
      if (!s->enc_buf && !(s->enc_buf = malloc(TCP_STREAM_RECORD_BYTES))) return TCP_STREAM_NOMEM;
      memcpy(s->enc_buf, src, n);
      net_protect_seal(&s->send_key, s->out_hdr, s->enc_buf, n, s->out_tag);
      s->out_payload = s->enc_buf;
    } else {
      /* integrity only: sealing reads the bytes, it does not change them */
      net_protect_seal(&s->send_key, s->out_hdr, (unsigned char *)src, n, s->out_tag);
      s->out_payload = src;
    }
    s->out_src = src;
    s->out_len = n;
    s->out_sent = 0;
  } else if (src != s->out_src || len < s->out_len) {
    return TCP_STREAM_MISUSE;
  }
  const size_t total = HDR + s->out_len + TAG;
  while (s->out_sent < total) {
    struct iovec iov[3];
    int n_iov = 0;
    size_t off = s->out_sent;
    const struct { const unsigned char *p; size_t n; } parts[3] = {
        {s->out_hdr, HDR}, {s->out_payload, s->out_len}, {s->out_tag, TAG}};
    for (int i = 0; i < 3; i++) {
      if (off >= parts[i].n) {
        off -= parts[i].n;
        continue;
      }
      iov[n_iov++] = (struct iovec){(void *)(parts[i].p + off), parts[i].n - off};
      off = 0;
    }
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n_iov};
    ssize_t w;
    TD_SYSCALL_RETRY(w, sendmsg(fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL));
    if (w < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return TCP_STREAM_OK;
      *err = errno;
      return TCP_STREAM_IO;
    }
    s->out_sent += (size_t)w;
  }
  *moved = s->out_len;
  s->out_len = s->out_sent = 0;
  s->out_src = s->out_payload = NULL;
  return TCP_STREAM_OK;
}

/* Read more of the current record: into dst (the caller's buffer, room for
 * dst_len) if it fits there and no record is under way elsewhere, else
 * into the stage (dst NULL: always the stage). *done: a whole record was
 * read and checked; it is in the caller's buffer if *direct, else staged. */
static tcp_stream_result pull(tcp_stream *s, int fd, unsigned char *dst, size_t dst_len, bool *done, bool *direct,
                              size_t *wire_bytes, int *err) {
  *done = false;
  while (s->in_hdr_got < HDR) {
    ssize_t r;
    TD_SYSCALL_RETRY(r, recv(fd, s->in_hdr + s->in_hdr_got, HDR - s->in_hdr_got, MSG_DONTWAIT));
    if (r > 0) {
      s->in_hdr_got += (size_t)r;
      *wire_bytes += (size_t)r;
      continue;
    }
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return TCP_STREAM_OK;
    *err = r == 0 ? 0 : errno;
    return TCP_STREAM_IO;
  }
  if (!s->in_dst) {
    /* A new record: its header says how long; where does it go? */
    if (net_protect_parse_hdr(s->in_hdr, &s->in_len) != 0) return TCP_STREAM_FORGED;
    s->in_direct = dst && s->in_len <= dst_len;
    if (!s->in_direct && !s->stage && !(s->stage = malloc(TCP_STREAM_RECORD_BYTES))) return TCP_STREAM_NOMEM;
    if (!s->in_direct && s->in_len > TCP_STREAM_RECORD_BYTES) return TCP_STREAM_FORGED; /* longer than we send */
    s->in_dst = s->in_direct ? dst : s->stage;
    s->in_got = s->in_tag_got = 0;
  } else if (s->in_direct && (dst != s->in_dst || dst_len < s->in_len)) {
    return TCP_STREAM_MISUSE;
  }
  while (s->in_got < s->in_len || s->in_tag_got < TAG) {
    struct iovec iov[2];
    int n_iov = 0;
    if (s->in_got < s->in_len) iov[n_iov++] = (struct iovec){s->in_dst + s->in_got, s->in_len - s->in_got};
    iov[n_iov++] = (struct iovec){s->in_tag + s->in_tag_got, TAG - s->in_tag_got};
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n_iov};
    ssize_t r;
    TD_SYSCALL_RETRY(r, recvmsg(fd, &mh, MSG_DONTWAIT));
    if (r > 0) {
      size_t n = (size_t)r, to_payload = s->in_len - s->in_got;
      if (n <= to_payload) {
        s->in_got += n;
      } else {
        s->in_got = s->in_len;
        s->in_tag_got += n - to_payload;
      }
      *wire_bytes += n;
      continue;
    }
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return TCP_STREAM_OK;
    *err = r == 0 ? 0 : errno;
    return TCP_STREAM_IO;
  }
  if (!net_protect_open(&s->recv_key, s->in_hdr, s->in_dst, s->in_len, s->in_tag)) return TCP_STREAM_FORGED;
  s->records_in++;
  *done = true;
  *direct = s->in_direct;
  if (!s->in_direct) {
    s->stage_off = 0;
    s->stage_len = s->in_len;
  }
  s->in_hdr_got = 0;
  s->in_dst = NULL;
  return TCP_STREAM_OK;
}

tcp_stream_result tcp_stream_recv(tcp_stream *s, int fd, void *buf, size_t len, size_t *moved, size_t *wire_bytes,
                                  int *err) {
  *moved = 0;
  *wire_bytes = 0;
  if (!len) return TCP_STREAM_OK;
  for (;;) {
    if (s->stage_len) {
      size_t n = len < s->stage_len ? len : s->stage_len;
      memcpy(buf, s->stage + s->stage_off, n);
      s->stage_off += n;
      s->stage_len -= n;
      *moved = n;
      return TCP_STREAM_OK;
    }
    bool done = false, direct = false;
    tcp_stream_result r = pull(s, fd, buf, len, &done, &direct, wire_bytes, err);
    if (r != TCP_STREAM_OK || !done) return r;
    if (direct) {
      *moved = s->in_len;
      return TCP_STREAM_OK;
    }
  }
}

tcp_stream_result tcp_stream_peek(tcp_stream *s, int fd, void *buf, size_t len, size_t *got, size_t *wire_bytes,
                                  int *err) {
  *got = 0;
  *wire_bytes = 0;
  if (!s->stage_len) {
    if (s->in_dst && s->in_direct) return TCP_STREAM_OK; /* a receive is under way: no boundary to look past */
    bool done = false, direct = false;
    tcp_stream_result r = pull(s, fd, NULL, 0, &done, &direct, wire_bytes, err);
    if (r != TCP_STREAM_OK || !done) return r;
  }
  size_t n = len < s->stage_len ? len : s->stage_len;
  memcpy(buf, s->stage + s->stage_off, n);
  *got = n;
  return TCP_STREAM_OK;
}
