/* Per-connection TCP statistics of every TCP socket in this network
 * namespace, by peer address (the kernel's sock_diag netlink interface, as
 * `ss -ti` reads them): how many segments each connection retransmitted.
 *
 * tandemrun uses it as a third vantage point on a host's link (issue 22):
 * its own connections to that host (the agent's ssh, the ranks' store
 * connections) retransmit while its connections to the other hosts stay
 * clean when that host's link loses packets; a merely loaded host does not
 * make a kernel retransmit. No privileges are needed (a process sees the
 * sockets of its namespace, as ss does). */
#include "net/net.h"

#include <arpa/inet.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* One dump request (family) on fd; appends to out. Returns the entries
 * found, or -1 on an error (errno set). */
static int dump_family(int fd, int family, net_tcp_conn *out, int max, int n) {
  struct {
    struct nlmsghdr nlh;
    struct inet_diag_req_v2 req;
  } msg;
  memset(&msg, 0, sizeof msg);
  msg.nlh.nlmsg_len = sizeof msg;
  msg.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  msg.nlh.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  msg.req.sdiag_family = (unsigned char)family;
  msg.req.sdiag_protocol = IPPROTO_TCP;
  /* Every state but LISTEN and the closed ones: a connection that is
   * closing may still be retransmitting its last data. */
  msg.req.idiag_states = ~((1u << 10) | (1u << 7)); /* TCP_LISTEN, TCP_CLOSE */
  msg.req.idiag_ext = 1u << (INET_DIAG_INFO - 1);
  struct sockaddr_nl nl = {.nl_family = AF_NETLINK};
  if (sendto(fd, &msg, sizeof msg, 0, (struct sockaddr *)&nl, sizeof nl) < 0) return -1;
  static __thread char buf[65536] __attribute__((aligned(8)));
  for (;;) {
    ssize_t got = recv(fd, buf, sizeof buf, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (got == 0) return n;
    for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, (size_t)got); h = NLMSG_NEXT(h, got)) {
      if (h->nlmsg_type == NLMSG_DONE) return n;
      if (h->nlmsg_type == NLMSG_ERROR) {
        const struct nlmsgerr *e = NLMSG_DATA(h);
        errno = e->error ? -e->error : EPROTO;
        return -1;
      }
      if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY) continue;
      const struct inet_diag_msg *d = NLMSG_DATA(h);
      net_tcp_conn c;
      memset(&c, 0, sizeof c);
      c.family = d->idiag_family;
      c.cookie = (uint64_t)d->id.idiag_cookie[0] | (uint64_t)d->id.idiag_cookie[1] << 32;
      if (c.family == AF_INET) {
        memcpy(c.peer, d->id.idiag_dst, 4);
      } else {
        memcpy(c.peer, d->id.idiag_dst, 16);
        /* An IPv4-mapped IPv6 peer counts as its IPv4 address. */
        static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        if (!memcmp(c.peer, mapped, 12)) {
          memmove(c.peer, c.peer + 12, 4);
          memset(c.peer + 4, 0, 12);
          c.family = AF_INET;
        }
      }
      int len = (int)(h->nlmsg_len - NLMSG_LENGTH(sizeof *d));
      for (struct rtattr *a = (struct rtattr *)(d + 1); RTA_OK(a, len); a = RTA_NEXT(a, len)) {
        if (a->rta_type != INET_DIAG_INFO) continue;
        struct tcp_info ti;
        memset(&ti, 0, sizeof ti);
        size_t have = RTA_PAYLOAD(a);
        memcpy(&ti, RTA_DATA(a), have < sizeof ti ? have : sizeof ti);
        c.total_retrans = ti.tcpi_total_retrans;
        c.timed_out = ti.tcpi_retransmits > 0 || ti.tcpi_backoff > 0 || ti.tcpi_ca_state == 4 /* TCP_CA_Loss */;
        c.have_info = true;
      }
      if (c.have_info && n < max) out[n++] = c;
    }
  }
}

int net_tcp_conns(net_tcp_conn *out, int max) {
  int fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (fd < 0) return -1;
  struct timeval tv = {1, 0}; /* the kernel answers at once; bounded all the same */
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  int n = dump_family(fd, AF_INET, out, max, 0);
  if (n >= 0) n = dump_family(fd, AF_INET6, out, max, n);
  int saved = errno;
  close(fd);
  errno = saved;
  return n;
}
