/* The messages between tandemrun and tandem-agent, its per-host agent
 * (tools/tandem-agent.c; docs/launcher.md, "per-host agents").
 *
 * tandemrun starts one agent per remote host over ssh and talks to it over
 * that session's stdin (tandemrun -> agent) and stdout (agent -> tandemrun);
 * ssh has authenticated the session, so the messages need no secret of
 * their own. Each message is a frame: a 4-byte length (of what follows,
 * host byte order: both ends run the same build), a 1-byte type, then the
 * type's payload. Integers are int32 in host byte order; strings are
 * NUL-terminated.
 *
 *   tandemrun -> agent
 *     SECRET  the job secret's bytes (at most once, first): the agent keeps it
 *             in memory and puts it in each rank's environment only
 *     START   id, n_env, n_argv, then cwd, n_env "K=V" and n_argv strings:
 *             fork a rank in cwd with the agent's environment plus these
 *     SIGNAL  id, signal: to that rank's process group
 *     PING    a sequence number: answered with a PONG at once (tandemrun
 *             pings every agent every TANDEM_EVICT_PING seconds so that
 *             each host's link carries traffic whose retransmissions it
 *             can count: a lossy host is evicted, docs/elastic.md)
 *   agent -> tandemrun
 *     HELLO   version, the agent's pid
 *     STARTED id, pid (0: fork failed; an EXIT follows)
 *     OUT/ERR id, bytes the rank wrote to its stdout/stderr
 *     EXIT    id, the rank's wait status (after its last OUT/ERR)
 *     PONG    the PING's sequence number
 *
 * EOF on the agent's stdin (tandemrun ended, killed, or its connection was
 * lost) makes the agent stop every rank (SIGTERM, SIGKILL 3 s later) and
 * exit; EOF on its stdout makes tandemrun count every rank there lost. */
#ifndef TANDEM_AGENT_PROTOCOL_H
#define TANDEM_AGENT_PROTOCOL_H

#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define AGENT_VERSION 1
#define AGENT_FRAME_MAX (16u * 1024 * 1024) /* a START's environment and arguments fit well below */
#define AGENT_OUT_CHUNK 65536               /* OUT/ERR bytes per frame */

enum {
  AGENT_SECRET = 1,
  AGENT_START = 2,
  AGENT_SIGNAL = 3,
  AGENT_PING = 4,
  AGENT_HELLO = 10,
  AGENT_STARTED = 11,
  AGENT_OUT = 12,
  AGENT_ERR = 13,
  AGENT_EXIT = 14,
  AGENT_PONG = 15,
};

#define AGENT_WRITE_WAIT_MS 5000 /* a non-blocking peer that takes nothing for this long is gone */

/* Writes all of p (retrying EINTR and short writes; on a non-blocking fd,
 * waiting up to AGENT_WRITE_WAIT_MS at a time for room); false on an error
 * or that wait running out (errno ETIMEDOUT). */
static inline bool agent_write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n > 0) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EAGAIN) {
      struct pollfd pfd = {.fd = fd, .events = POLLOUT};
      int r = poll(&pfd, 1, AGENT_WRITE_WAIT_MS);
      if (r < 0 && errno == EINTR) continue;
      if (r == 0) errno = ETIMEDOUT;
      if (r <= 0) return false;
      continue;
    }
    if (w <= 0) return false;
    c += w;
    n -= (size_t)w;
  }
  return true;
}

/* One frame: type, two ints (either may be unused: pass what the type
 * needs), then body. One write() when it fits a pipe's atomic size, so
 * that a reader never sees half of a small frame. */
static inline bool agent_send(int fd, int type, int32_t a, int32_t b, const void *body, size_t body_len) {
  char head[13];
  uint32_t len = (uint32_t)(1 + 8 + body_len);
  memcpy(head, &len, 4);
  head[4] = (char)type;
  memcpy(head + 5, &a, 4);
  memcpy(head + 9, &b, 4);
  if (body_len <= 4096 - sizeof head) {
    char frame[4096];
    memcpy(frame, head, sizeof head);
    if (body_len) memcpy(frame + sizeof head, body, body_len);
    return agent_write_all(fd, frame, sizeof head + body_len);
  }
  return agent_write_all(fd, head, sizeof head) && agent_write_all(fd, body, body_len);
}

/* An input buffer of frames. */
typedef struct {
  char *data;
  size_t len, cap;
} agent_inbuf;

/* Reads what fd has into b. Returns >0 bytes read, 0 at EOF, -1 on an
 * error (EAGAIN: -1 with errno EAGAIN). */
static inline ssize_t agent_fill(int fd, agent_inbuf *b) {
  if (b->cap - b->len < 65536) {
    size_t cap = b->cap ? b->cap * 2 : 131072;
    char *d = realloc(b->data, cap);
    if (!d) {
      errno = ENOMEM;
      return -1;
    }
    b->data = d;
    b->cap = cap;
  }
  ssize_t n;
  do n = read(fd, b->data + b->len, b->cap - b->len);
  while (n < 0 && errno == EINTR);
  if (n > 0) b->len += (size_t)n;
  return n;
}

/* The next complete frame in b at *off: its type, ints a and b, body and
 * body length; advances *off. Returns 1 for a frame, 0 if none is complete
 * yet, -1 if the stream is garbled (a length out of range). */
static inline int agent_next(const agent_inbuf *b, size_t *off, int *type, int32_t *a, int32_t *bb,
                             const char **body, size_t *body_len) {
  if (b->len - *off < 4) return 0;
  uint32_t len;
  memcpy(&len, b->data + *off, 4);
  if (len < 9 || len > AGENT_FRAME_MAX) return -1;
  if (b->len - *off - 4 < len) return 0;
  const char *p = b->data + *off + 4;
  *type = (unsigned char)p[0];
  memcpy(a, p + 1, 4);
  memcpy(bb, p + 5, 4);
  *body = p + 9;
  *body_len = len - 9;
  *off += 4 + len;
  return 1;
}

/* Drops the frames before off. */
static inline void agent_consumed(agent_inbuf *b, size_t off) {
  memmove(b->data, b->data + off, b->len - off);
  b->len -= off;
}

#endif
