/* TCP's retransmission back-off is bounded on Tandem's sockets
 * (net_set_loss_recovery): after a link drops every packet for
 * DROP_S seconds, a byte sent during the outage arrives within about
 * TANDEM_TCP_RTO_MAX (1 s) of the link coming back, and their congestion
 * control is TANDEM_TCP_CONGESTION's (cubic by default), not the system's. The reference is a
 * plain socket with the kernel's settings beside it in the same outage: its
 * timeout doubles (0.2, 0.4, ... 3.2, 6.4 s), so its byte comes seconds
 * later; the test fails if ours is no faster than that.
 *
 * Runs in a network namespace of its own (unshare), the outage an iptables
 * DROP rule on its loopback; without root, iptables or a kernel with
 * TCP_RTO_MAX_MS (Linux 6.15) it says it skipped and why. */
#include "net/net.h" /* first: base.h defines _GNU_SOURCE (unshare) */
#include "../common/check.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define DROP_S 7.0

static void skip(const char *why) {
  printf("SKIPPED test_retransmit: %s\n", why);
  exit(0);
}

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* Seconds until one byte can be read from fd (or -1 after limit_s). */
static double wait_byte(int fd, double t0, double limit_s) {
  for (;;) {
    double left = t0 + limit_s - td_now();
    if (left <= 0) return -1;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int n = poll(&p, 1, (int)(left * 1000) + 1);
    if (n > 0) {
      char c;
      if (read(fd, &c, 1) == 1) return td_now() - t0;
      return -1;
    }
    if (n < 0 && errno != EINTR) return -1;
  }
}

int main(void) {
  if (unshare(CLONE_NEWNET) != 0) skip("cannot create a network namespace (needs root)");
  if (system("ip link set lo up") != 0) skip("cannot bring up loopback in the new namespace (iproute2)");
  if (system("iptables -L INPUT -n >/dev/null 2>&1") != 0) skip("iptables does not work here");
  {
    int probe = socket(AF_INET, SOCK_STREAM, 0), ms = 1000;
    bool has = setsockopt(probe, IPPROTO_TCP, 44 /* TCP_RTO_MAX_MS */, &ms, sizeof ms) == 0;
    close(probe);
    if (!has) skip("this kernel has no TCP_RTO_MAX_MS (Linux 6.15 or later)");
  }
  setenv("TANDEM_TCP_RTO_MAX", "1", 1);

  int listen_fd = -1, port = 0;
  CHECK_OK(net_listen("127.0.0.1", 0, 8, &listen_fd, &port));
  /* Ours: net_connect / net_accept. */
  int ours_tx = -1, ours_rx = -1;
  CHECK_OK(net_connect("127.0.0.1", port, 5.0, &ours_tx));
  CHECK_OK(net_accept(listen_fd, td_now() + 5.0, &ours_rx));
  int ms = 0;
  socklen_t len = sizeof ms;
  CHECK(getsockopt(ours_tx, IPPROTO_TCP, 44, &ms, &len) == 0);
  CHECK_EQ_INT(ms, 1000);
  /* The reference: a plain socket, the kernel's defaults. */
  int plain_tx = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  CHECK(plain_tx >= 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  CHECK(connect(plain_tx, (struct sockaddr *)&sa, sizeof sa) == 0);
  int plain_rx = accept(listen_fd, NULL, NULL);
  CHECK(plain_rx >= 0);
  ms = 0;
  len = sizeof ms;
  CHECK(getsockopt(plain_tx, IPPROTO_TCP, 44, &ms, &len) == 0);
  CHECK(ms > 60000); /* the kernel's 120 s: the reference is what it should be */
  /* The congestion control: cubic on both ends of ours (reno if this
   * kernel has no cubic), not the system's default (BBR on the test
   * machine, whose bandwidth estimate collapsed after heavy loss). */
  {
    char avail[512] = "";
    FILE *f = fopen("/proc/sys/net/ipv4/tcp_available_congestion_control", "r");
    if (f) {
      if (!fgets(avail, sizeof avail, f)) avail[0] = '\0';
      fclose(f);
    }
    const char *want = strstr(avail, "cubic") ? "cubic" : "reno";
    int fds[2] = {ours_tx, ours_rx};
    for (int i = 0; i < 2; i++) {
      char name[32] = "";
      socklen_t nlen = sizeof name;
      CHECK(getsockopt(fds[i], IPPROTO_TCP, TCP_CONGESTION, name, &nlen) == 0);
      CHECK(strcmp(name, want) == 0);
    }
    printf("congestion control of our sockets: %s (available: %.*s)\n", want, (int)strcspn(avail, "\n"), avail);
  }

  CHECK(system("iptables -A INPUT -i lo -j DROP") == 0);
  double t0 = td_now();
  CHECK(write(ours_tx, "o", 1) == 1);
  CHECK(write(plain_tx, "p", 1) == 1);
  sleep_s(DROP_S);
  CHECK(system("iptables -D INPUT -i lo -j DROP") == 0);
  double back = td_now() - t0;
  double ours = wait_byte(ours_rx, t0, DROP_S + 30);
  double plain = wait_byte(plain_rx, t0, DROP_S + 30);
  printf("link down %.2f s: our byte arrived %.2f s after the link was back, the plain socket's %.2f s after\n", back,
         ours - back, plain - back);
  CHECK(ours > 0 && plain > 0);
  /* Ours: within the 1 s cap plus the base timeout and scheduling slack. */
  CHECK(ours - back < 2.5);
  /* The kernel's back-off: its retries at 0.2, 0.6, 1.4, 3.0, 6.2, 12.6 s
   * put the byte about 5.6 s after the link came back at 7 s. */
  CHECK(plain - back > 3.0);
  close(ours_tx), close(ours_rx), close(plain_tx), close(plain_rx), close(listen_fd);
  printf("PASS test_retransmit\n");
  return 0;
}
