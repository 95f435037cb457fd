/* A protected TCP stream (stream.c): the bytes the framing engine hands
 * the TCP transport for one peer travel as sealed records (src/net's
 * net_protect_*: integrity only, or encrypted), and come out of the
 * receiving end only once their record checked out. Non-blocking, over a
 * connected socket, in the transport's try_send/try_recv/try_peek shape.
 *
 * Contract with the caller (p2p.c keeps it): after a send reports 0 bytes
 * moved, the next send on the stream passes the same bytes again (the same
 * pointer, at least as long); a record is reported moved only once all of
 * it is in the kernel, so an operation never completes with its bytes
 * still here. Likewise a receive that reported 0 bytes is repeated with
 * the same buffer. Executing thread only. */
#ifndef TD_COMM_TRANSPORT_TCP_STREAM_H
#define TD_COMM_TRANSPORT_TCP_STREAM_H

#include "net/net.h"

/* Payload bytes per record: large enough that a record's fixed costs (its
 * 24 bytes, one AEAD setup, one extra system call) vanish, small enough
 * that a record in flight does not hold up the other peers of a ring. */
#define TCP_STREAM_RECORD_BYTES ((size_t)256 << 10)

typedef struct tcp_stream {
  net_protect_key send_key, recv_key;
  /* the record being written */
  unsigned char out_hdr[NET_PROTECT_HDR_BYTES], out_tag[NET_PROTECT_TAG_BYTES];
  const unsigned char *out_src; /* the caller's bytes it was sealed from */
  const unsigned char *out_payload; /* what goes on the wire: out_src, or enc_buf encrypted */
  size_t out_len;               /* payload bytes (0: no record in flight) */
  size_t out_sent;              /* bytes of header + payload + tag written */
  unsigned char *enc_buf;       /* ENCRYPT: the ciphertext of the record */
  /* the record being read */
  unsigned char in_hdr[NET_PROTECT_HDR_BYTES], in_tag[NET_PROTECT_TAG_BYTES];
  size_t in_hdr_got, in_len, in_got, in_tag_got;
  unsigned char *in_dst;        /* where its payload goes: the caller's buffer or stage */
  bool in_direct;               /* in_dst is the caller's buffer */
  unsigned char *stage;         /* records the caller asked for less than, and peeks */
  size_t stage_off, stage_len;  /* checked plaintext waiting in stage */
  uint64_t records_in;          /* records checked, for messages */
} tcp_stream;

typedef enum {
  TCP_STREAM_OK = 0,
  TCP_STREAM_IO,     /* the socket failed: *err is errno, 0 for EOF */
  TCP_STREAM_FORGED, /* a record failed its check (altered, replayed, reordered, dropped, another key or mode) */
  TCP_STREAM_MISUSE, /* the caller broke the contract above */
  TCP_STREAM_NOMEM
} tcp_stream_result;

/* Set up the keys of one connection (mode OFF: nothing to set up; the
 * transport then uses the socket directly). */
td_status tcp_stream_init(tcp_stream *s, net_protect_mode mode, bool aes, const char *ctx,
                          const net_auth_session *session, bool connector);
void tcp_stream_free(tcp_stream *s); /* zeroes the keys */

tcp_stream_result tcp_stream_send(tcp_stream *s, int fd, const void *buf, size_t len, size_t *moved, int *err);
/* *wire_bytes: bytes read from the socket (proof of life for heartbeats). */
tcp_stream_result tcp_stream_recv(tcp_stream *s, int fd, void *buf, size_t len, size_t *moved, size_t *wire_bytes,
                                  int *err);
/* Up to len checked bytes ahead, without consuming them (reads and checks
 * a whole record into the stage if needed; *got 0 if none is complete). */
tcp_stream_result tcp_stream_peek(tcp_stream *s, int fd, void *buf, size_t len, size_t *got, size_t *wire_bytes,
                                  int *err);
/* Checked bytes are waiting (a receive will move some without the socket). */
static inline bool tcp_stream_pending_in(const tcp_stream *s) { return s->stage_len > 0; }

#endif
