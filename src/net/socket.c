/* Sockets: address parsing, listen/connect/accept, and full transfers with
 * deadlines. Every blocking step waits in poll() with the time left, so that a
 * dead or stuck peer turns into TD_ERR_REMOTE or TD_ERR_TIMEOUT instead of a
 * hang. Sockets are created close-on-exec (tandemrun forks workers) and sends
 * use MSG_NOSIGNAL (a closed peer must not kill the process with SIGPIPE). */
#include "net/net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

td_status net_parse_addr(const char *text, char *host, size_t host_size, int *port_out) {
  if (!text || !*text)
    return td_error(TD_ERR_INVALID_ARGUMENT, "empty address: write host:port, e.g. 127.0.0.1:29500");
  const char *host_start = text, *host_end, *port_text;
  if (text[0] == '[') {
    /* "[v6]:port": the brackets keep the address's colons apart from the port's. */
    host_start = text + 1;
    host_end = strchr(host_start, ']');
    if (!host_end)
      return td_error(TD_ERR_INVALID_ARGUMENT, "address '%s' has no closing ']': write [v6-address]:port, e.g. [::1]:29500",
                      text);
    if (host_end[1] != ':')
      return td_error(TD_ERR_INVALID_ARGUMENT, "address '%s' has no ':port' after ']': write [v6-address]:port, e.g. [::1]:29500",
                      text);
    port_text = host_end + 2;
  } else {
    const char *colon = strrchr(text, ':');
    if (!colon)
      return td_error(TD_ERR_INVALID_ARGUMENT, "address '%s' has no port: write host:port, e.g. %s:29500", text, text);
    if (memchr(text, ':', (size_t)(colon - text)))
      return td_error(TD_ERR_INVALID_ARGUMENT,
                      "address '%s' is ambiguous: write an IPv6 address in brackets, e.g. [::1]:29500", text);
    host_end = colon;
    port_text = colon + 1;
  }
  size_t host_len = (size_t)(host_end - host_start);
  if (host_len == 0)
    return td_error(TD_ERR_INVALID_ARGUMENT, "address '%s' has no host: write host:port, e.g. 127.0.0.1:29500", text);
  if (host_len >= host_size)
    return td_error(TD_ERR_INVALID_ARGUMENT, "address '%s': the host name is longer than %zu characters", text,
                    host_size - 1);
  for (size_t i = 0; i < host_len; i++) {
    unsigned char c = (unsigned char)host_start[i];
    if (c <= ' ' || c == '/' || c == '[' || c == ']')
      return td_error(TD_ERR_INVALID_ARGUMENT, "address '%s': the host contains an invalid character", text);
  }
  if (!*port_text)
    return td_error(TD_ERR_INVALID_ARGUMENT, "address '%s' has an empty port: write host:port with a port 1-65535",
                    text);
  long port = 0;
  for (const char *p = port_text; *p; p++) {
    if (*p < '0' || *p > '9' || port > 65535)
      return td_error(TD_ERR_INVALID_ARGUMENT, "address '%s': port '%s' is not a number in 0-65535", text, port_text);
    port = port * 10 + (*p - '0');
  }
  if (port > 65535)
    return td_error(TD_ERR_INVALID_ARGUMENT, "address '%s': port '%s' is not a number in 0-65535", text, port_text);
  memcpy(host, host_start, host_len);
  host[host_len] = '\0';
  *port_out = (int)port;
  return TD_OK;
}

int net_set_nonblocking(int fd, bool on) {
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0) return -1;
  flags = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  return fcntl(fd, F_SETFL, flags);
}

int net_set_nodelay(int fd) {
  int one = 1;
  return setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Linux's per-socket cap on the retransmission timeout (6.15 and later; the
 * headers may predate it). */
#ifndef TCP_RTO_MAX_MS
#define TCP_RTO_MAX_MS 44
#endif

/* TANDEM_TCP_RTO_MAX in whole milliseconds: 0 leaves the kernel's defaults,
 * else 1-120 s (the kernel's range); a bad value is warned about once and
 * the default used. */
static int rto_max_ms(void) {
  static _Atomic int cached = -1;
  int ms = cached;
  if (ms >= 0) return ms;
  double s = td_env_double("TANDEM_TCP_RTO_MAX", NET_DEFAULT_RTO_MAX_S);
  if (!(s == 0 || (s >= 1 && s <= 120))) {
    TD_WARN("TANDEM_TCP_RTO_MAX must be 0 (the kernel's defaults) or 1-120 seconds; using %g s", NET_DEFAULT_RTO_MAX_S);
    s = NET_DEFAULT_RTO_MAX_S;
  }
  ms = (int)lround(s * 1000);
  cached = ms;
  return ms;
}

void net_set_loss_recovery(int fd) {
  /* Exponential back-off on a lossy link doubles the retransmission timeout
   * up to 120 s: after a few seconds of heavy loss a connection waited many
   * seconds after the link was good again (a step 23.7 s late after 4 s of
   * 50% loss, bench/results/faults-hosts-2026-11-27-200.md). Capped, a lost
   * segment is sent again within the cap; linear timeouts for thin streams
   * (few segments in flight, as in a collective's small messages and the
   * store's requests) keep the first retries at the base timeout. Both are
   * best effort: an older kernel keeps its defaults. */
  int ms = rto_max_ms();
  if (ms != 0) { /* else the kernel's defaults */
    (void)setsockopt(fd, IPPROTO_TCP, TCP_RTO_MAX_MS, &ms, sizeof ms);
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_THIN_LINEAR_TIMEOUTS, &one, sizeof one);
  }
  /* The congestion control. Where BBR is the system's default (the test
   * machine's), 4 s of 50% loss left a transfer's bandwidth estimate at
   * 11 kbit/s with a 5-segment window: a 200 KB collective message took
   * 50 s to get through after the link was good again, no packet lost
   * meanwhile (bench/results/faults-hosts-2026-11-28-probe-after.md). Loss-
   * based control (cubic; reno, which every kernel allows unprivileged
   * processes, when cubic is refused) halves its window and grows it back
   * in a few round trips. */
  const char *cc = td_env_str("TANDEM_TCP_CONGESTION", NET_DEFAULT_CONGESTION);
  if (!*cc || !strcmp(cc, "0")) return; /* the system's */
  if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc, (socklen_t)strlen(cc)) == 0) return;
  if (!strcmp(cc, "cubic")) {
    (void)setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, "reno", 4);
    return;
  }
  static int warned = 0; /* once per process; the builtin makes it safe across threads */
  if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
    TD_WARN("TANDEM_TCP_CONGESTION=%s was refused (%s): Tandem's connections keep the system's congestion control; "
            "name one in /proc/sys/net/ipv4/tcp_allowed_congestion_control, or 0", cc, strerror(errno));
}

void net_set_bufsizes(int fd, int bytes) {
  if (bytes <= 0) return;
  (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
  (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
}

void net_format_addr(char *buf, size_t size, const char *host, int port) {
  if (host && strchr(host, ':'))
    snprintf(buf, size, "[%s]:%d", host, port);
  else
    snprintf(buf, size, "%s:%d", host && *host ? host : "*", port);
}

/* The peer's address for error messages ("unknown peer" once it is gone). */
static void peer_name(int fd, char *buf, size_t size) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  char host[INET6_ADDRSTRLEN] = "";
  int port = 0;
  if (getpeername(fd, (struct sockaddr *)&ss, &len) == 0) {
    if (ss.ss_family == AF_INET) {
      struct sockaddr_in *in = (struct sockaddr_in *)&ss;
      inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
      port = ntohs(in->sin_port);
    } else if (ss.ss_family == AF_INET6) {
      struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
      inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
      port = ntohs(in6->sin6_port);
    }
  }
  if (host[0])
    net_format_addr(buf, size, host, port);
  else
    td_strlcpy(buf, "unknown peer", size);
}

static bool sockaddr_is_loopback(const struct sockaddr *sa) {
  if (sa->sa_family == AF_INET)
    return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
  if (sa->sa_family == AF_INET6) {
    const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(a)) return true;
    /* ::ffff:127.x.y.z */
    return IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127;
  }
  return false;
}

bool net_is_loopback_host(const char *host) {
  if (!host || !*host) return false;
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host, NULL, &hints, &res) != 0) return false;
  bool all = res != NULL;
  for (struct addrinfo *ai = res; ai; ai = ai->ai_next) all &= sockaddr_is_loopback(ai->ai_addr);
  freeaddrinfo(res);
  return all;
}

td_status net_socket_local_address(int fd, char *buf, size_t size) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0) return td_error_errno("getsockname failed");
  const void *addr = ss.ss_family == AF_INET6 ? (const void *)&((struct sockaddr_in6 *)&ss)->sin6_addr
                                              : (const void *)&((struct sockaddr_in *)&ss)->sin_addr;
  char text[INET6_ADDRSTRLEN];
  if (!inet_ntop(ss.ss_family, addr, text, sizeof text)) return td_error_errno("inet_ntop failed");
  td_strlcpy(buf, text, size);
  return TD_OK;
}

td_status net_listen_socket(const char *host, int port, int backlog, int *fd_out, int *port_out) {
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  char port_text[16];
  snprintf(port_text, sizeof port_text, "%d", port);
  const char *node = (host && *host) ? host : NULL;
  if (!node) hints.ai_family = AF_INET; /* "all interfaces" = 0.0.0.0, which every host supports */
  int gai = getaddrinfo(node, port_text, &hints, &res);
  if (gai != 0) {
    char addr[300];
    net_format_addr(addr, sizeof addr, node, port);
    return td_error(TD_ERR_INVALID_ARGUMENT, "cannot listen on %s: %s", addr, gai_strerror(gai));
  }
  int saved_errno = 0;
  int fd = -1;
  for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      saved_errno = errno;
      continue;
    }
    int one = 1;
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, backlog > 0 ? backlog : 128) == 0) break;
    saved_errno = errno;
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  if (fd < 0) {
    char addr[300];
    net_format_addr(addr, sizeof addr, node, port);
    errno = saved_errno;
    return td_error_errno("cannot listen on %s", addr);
  }
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0) {
    td_status st = td_error_errno("getsockname on a listening socket failed");
    close(fd);
    return st;
  }
  if (port_out)
    *port_out = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                         : ntohs(((struct sockaddr_in *)&ss)->sin_port);
  *fd_out = fd;
  return TD_OK;
}

/* Milliseconds left until deadline for poll(): -1 = no deadline. */
static int poll_ms(double deadline) {
  if (deadline < 0 || isinf(deadline)) return -1;
  double left = deadline - td_now();
  if (left <= 0) return 0;
  if (left > 3600) return 3600 * 1000;
  return (int)ceil(left * 1000.0);
}

/* One connect attempt to one resolved address, bounded by the deadline.
 * Returns the connected fd, or -1 with errno set to the reason. */
static int connect_once(const struct addrinfo *ai, double deadline) {
  int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
  if (fd < 0) return -1;
  if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) goto connected;
  if (errno != EINPROGRESS) goto fail;
  for (;;) {
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    int ms = poll_ms(deadline);
    int n = poll(&p, 1, ms);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) goto fail;
    if (n == 0) {
      errno = ETIMEDOUT;
      goto fail;
    }
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) goto fail;
    if (err) {
      errno = err;
      goto fail;
    }
    break;
  }
connected:
  if (net_set_nonblocking(fd, false) != 0) goto fail;
  (void)net_set_nodelay(fd);
  net_set_loss_recovery(fd);
  return fd;
fail:;
  int saved = errno;
  close(fd);
  errno = saved;
  return -1;
}

td_status net_connect_reason(const char *host, int port, double timeout_s, int *fd_out, char *reason,
                             size_t reason_size) {
  double start = td_now();
  double deadline = start + (timeout_s > 0 ? timeout_s : 0);
  double backoff = 0.01;
  char last_reason[256] = "no attempt made";
  char addr[300];
  net_format_addr(addr, sizeof addr, host, port);
  char port_text[16];
  snprintf(port_text, sizeof port_text, "%d", port);
  for (;;) {
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    int gai = getaddrinfo(host, port_text, &hints, &res);
    if (gai == 0) {
      for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        /* A single attempt may not use all the time left: a SYN lost to a
         * full backlog would otherwise eat the whole budget. */
        double attempt_deadline = TD_MIN(deadline, td_now() + 5.0);
        if (attempt_deadline < td_now() + 0.05) attempt_deadline = td_now() + 0.05;
        int fd = connect_once(ai, attempt_deadline);
        if (fd >= 0) {
          freeaddrinfo(res);
          *fd_out = fd;
          return TD_OK;
        }
        td_strlcpy(last_reason, strerror(errno), sizeof last_reason);
      }
      freeaddrinfo(res);
    } else {
      td_strlcpy(last_reason, gai == EAI_SYSTEM ? strerror(errno) : gai_strerror(gai), sizeof last_reason);
      /* A name that does not exist will not start existing: fail now. */
      if (gai != EAI_AGAIN && gai != EAI_SYSTEM) {
        if (reason) td_strlcpy(reason, last_reason, reason_size);
        return td_error(TD_ERR_INVALID_ARGUMENT, "cannot resolve host '%s' of address %s: %s", host, addr,
                        last_reason);
      }
    }
    double now = td_now();
    if (now >= deadline) break;
    double sleep_s = TD_MIN(backoff, deadline - now);
    struct timespec ts = {(time_t)sleep_s, (long)((sleep_s - (double)(time_t)sleep_s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
    backoff = TD_MIN(backoff * 2, 0.5);
  }
  if (reason) td_strlcpy(reason, last_reason, reason_size);
  return td_error(TD_ERR_REMOTE, "cannot connect to %s after %.1f s: %s", addr, td_now() - start, last_reason);
}

td_status net_connect(const char *host, int port, double timeout_s, int *fd_out) {
  return net_connect_reason(host, port, timeout_s, fd_out, NULL, 0);
}

td_status net_accept(int listen_fd, double deadline, int *fd_out) {
  for (;;) {
    struct pollfd p = {.fd = listen_fd, .events = POLLIN};
    int n = poll(&p, 1, poll_ms(deadline));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return td_error_errno("poll on listening socket failed");
    if (n == 0) return td_error(TD_ERR_TIMEOUT, "no connection arrived before the deadline");
    int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd >= 0) {
      (void)net_set_nodelay(fd);
      net_set_loss_recovery(fd);
      *fd_out = fd;
      return TD_OK;
    }
    /* The client may have given up between poll and accept; wait again. */
    if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED || errno == EPROTO) continue;
    return td_error_errno("accept failed");
  }
}

static bool is_remote_errno(int e) {
  return e == ECONNRESET || e == EPIPE || e == ENOTCONN || e == ECONNABORTED || e == ETIMEDOUT ||
         e == EHOSTUNREACH || e == ENETUNREACH;
}

/* Wait for the socket to become readable/writable; TD_ERR_TIMEOUT at the deadline. */
static td_status wait_fd(int fd, short events, double deadline, const char *what, size_t done, size_t len) {
  for (;;) {
    struct pollfd p = {.fd = fd, .events = events};
    int n = poll(&p, 1, poll_ms(deadline));
    if (n > 0) return TD_OK; /* errors and hang-ups surface in the next send/recv */
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return td_error_errno("poll while %s failed", what);
    char peer[320];
    peer_name(fd, peer, sizeof peer);
    return td_error(TD_ERR_TIMEOUT, "timed out %s %s (%zu of %zu bytes done)", what, peer, done, len);
  }
}

td_status net_send_all(int fd, const void *buf, size_t len, double deadline) {
  const char *p = buf;
  size_t done = 0;
  while (done < len) {
    /* MSG_DONTWAIT makes a blocking socket honour the deadline too. */
    ssize_t n = send(fd, p + done, len - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      TD_CHECK(wait_fd(fd, POLLOUT, deadline, "sending to", done, len));
      continue;
    }
    int e = errno;
    char peer[320];
    peer_name(fd, peer, sizeof peer);
    if (is_remote_errno(e))
      return td_error(TD_ERR_REMOTE, "connection to %s lost while sending (%zu of %zu bytes sent): %s", peer, done,
                      len, strerror(e));
    errno = e;
    return td_error_errno("send to %s failed", peer);
  }
  return TD_OK;
}

td_status net_recv_all(int fd, void *buf, size_t len, double deadline) {
  char *p = buf;
  size_t done = 0;
  while (done < len) {
    ssize_t n = recv(fd, p + done, len - done, MSG_DONTWAIT);
    if (n > 0) {
      done += (size_t)n;
      continue;
    }
    if (n == 0) {
      char peer[320];
      peer_name(fd, peer, sizeof peer);
      return td_error(TD_ERR_REMOTE, "connection closed by %s (%zu of %zu bytes received)", peer, done, len);
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      TD_CHECK(wait_fd(fd, POLLIN, deadline, "receiving from", done, len));
      continue;
    }
    int e = errno;
    char peer[320];
    peer_name(fd, peer, sizeof peer);
    if (is_remote_errno(e))
      return td_error(TD_ERR_REMOTE, "connection to %s lost while receiving (%zu of %zu bytes received): %s", peer,
                      done, len, strerror(e));
    errno = e;
    return td_error_errno("recv from %s failed", peer);
  }
  return TD_OK;
}
