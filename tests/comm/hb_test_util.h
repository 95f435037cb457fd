/* What the one-process heartbeat tests share (test_hb_auth.c,
 * test_hb_adaptive.c, test_hb_rtt.c): loopback listeners for heartbeat
 * objects to bind beside, and a pair of ranks 0 and 1 whose rank 1 beats
 * into a capture socket the test reads, so that the test decides what
 * reaches rank 0, when and how often. */
#ifndef TD_HB_TEST_UTIL_H
#define TD_HB_TEST_UTIL_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../common/check.h"
#include "comm/transport/tcp/heartbeat.h"
#include "net/net.h"

/* A TCP listener on 127.0.0.1 (a heartbeat binds beside it); its port. */
static inline int hbt_listener(int *port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  CHECK(fd >= 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  CHECK(bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
  CHECK(listen(fd, 1) == 0);
  socklen_t len = sizeof a;
  CHECK(getsockname(fd, (struct sockaddr *)&a, &len) == 0);
  *port = ntohs(a.sin_port);
  return fd;
}

/* One datagram to 127.0.0.1:port. */
static inline void hbt_send_to(int port, const void *buf, size_t len) {
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  CHECK(fd >= 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  CHECK(sendto(fd, buf, len, 0, (struct sockaddr *)&a, sizeof a) == (ssize_t)len);
  close(fd);
}

/* Drain hb's socket at time now: loopback delivers at once, and a short
 * pause makes sure the datagram is queued. */
static inline void hbt_drain(tcp_heartbeat *hb, double now) {
  usleep(20000);
  heartbeat_drain(hb, now);
}

/* Ranks 0 and 1 of a communicator (hash) on loopback: rank 0 beats to
 * rank 1's port (p1), rank 1 to the capture socket `cap` (kernel arrival
 * times on it when timestamps); rank 0's port is p0. Needs TANDEM_SECRET. */
typedef struct {
  int l0, l1, p0, p1, cap;
  tcp_heartbeat *hb0, *hb1;
} hbt_pair;

static inline void hbt_pair_open(hbt_pair *t, uint64_t hash, bool timestamps) {
  CHECK(getenv("TANDEM_SECRET") != NULL);
  CHECK_OK(net_auth_init());
  t->l0 = hbt_listener(&t->p0);
  t->l1 = hbt_listener(&t->p1);
  bool taken;
  CHECK_OK(heartbeat_open(t->l0, 0, 2, hash, &t->hb0, &taken));
  CHECK_OK(heartbeat_open(t->l1, 1, 2, hash, &t->hb1, &taken));
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", t->p1);
  CHECK_OK(heartbeat_set_peer(t->hb0, 1, addr));
  t->cap = socket(AF_INET, SOCK_DGRAM, 0);
  struct sockaddr_in ca = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  CHECK(t->cap >= 0 && bind(t->cap, (struct sockaddr *)&ca, sizeof ca) == 0);
  int one = 1;
  if (timestamps) CHECK(setsockopt(t->cap, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof one) == 0);
  socklen_t clen = sizeof ca;
  CHECK(getsockname(t->cap, (struct sockaddr *)&ca, &clen) == 0);
  snprintf(addr, sizeof addr, "127.0.0.1:%d", ntohs(ca.sin_port));
  CHECK_OK(heartbeat_set_peer(t->hb1, 0, addr));
}

static inline void hbt_pair_close(hbt_pair *t) {
  heartbeat_close(t->hb0);
  heartbeat_close(t->hb1);
  close(t->l0);
  close(t->l1);
  close(t->cap);
}

#endif
