/* Heartbeats of the TCP transport: the UDP socket, the beat datagram, and
 * the record of when each peer was last heard from (see heartbeat.h for the
 * contract, tcp.c for the thread that drives it).
 *
 * Why datagrams beside the TCP connections, not beats inside them: a beat in
 * a TCP stream waits behind every byte queued before it, so a link that is
 * merely full would look dead, and the stream's frames belong to the
 * executing thread, which may be blocked in a long transfer. And why beats
 * at all, not only TCP keepalive or TCP_USER_TIMEOUT: the kernel of a
 * SIGSTOPped (or hung) process keeps acknowledging, so only a beat that a
 * thread of the process sends proves that the process still runs; a lost
 * host is also found while data is in flight, where keepalive never probes.
 *
 * The beat, 64 bytes, native byte order (all ranks of a job run the same
 * build on the same architecture, as the op headers already assume):
 *   magic "TDHB" | flags (bit 0: my communicator failed) | communicator hash
 *   | sender rank | reserved | sequence | MAC
 * MAC = HMAC-SHA-256 under the job's key (net_auth_datagram_mac) of the 32
 * bytes before it, so only a process holding the job's secret can make a
 * beat; the sequence grows with every tick of the sender, and a receiver
 * takes a beat only if its sequence is above the last it took from that
 * rank, so a recorded beat replayed later proves nothing. A datagram that is
 * not a beat of this communicator from a peer rank, or fails either check,
 * is dropped (and counted in the debug log). Without the MAC a stranger
 * could keep a lost host looking alive for as long as it kept sending, or
 * make every rank look up a failure that did not happen. */
#define _GNU_SOURCE 1
#include "comm/transport/tcp/heartbeat.h"

#include <math.h>
#include <netdb.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "net/net.h"

#define HB_MAGIC 0x54444842u /* "TDHB" */
#define HB_FLAG_FAILED 1u

typedef struct hb_beat {
  uint32_t magic;
  uint32_t flags;
  uint64_t comm_hash;
  int32_t rank;
  uint32_t reserved;
  uint64_t seq;
  unsigned char mac[32]; /* of the fields above */
} hb_beat;
#define HB_MAC_LABEL "tandem heartbeat v1"
#define HB_BODY_BYTES offsetof(hb_beat, mac)
_Static_assert(sizeof(hb_beat) == 64 && offsetof(hb_beat, mac) == 32, "the heartbeat wire format is 64 bytes");

typedef struct hb_peer {
  struct sockaddr_storage to;
  socklen_t to_len; /* 0: this rank, or not set */
  double heard;     /* td_now() when a beat was last drained from it */
  double stalled_at_heard; /* the watcher's stalled total (tcp_heartbeat.stalled) then */
  bool forgotten;   /* hung up: its silence is no longer news */
  bool beat_seen;   /* a beat ever came: UDP gets through from it */
  bool failed;      /* its beats say its communicator failed */
  uint64_t seq;     /* the sequence of the last beat taken from it */
  /* Adaptive timeout only: the kernel arrival time (CLOCK_REALTIME seconds,
   * differences only) of its last beat, the gaps between its last HB_WINDOW
   * beats (a ring), and the timeout they give, recomputed at each beat. */
  double arrived;
  float *gaps;
  int n_gaps, next_gap;
  double stall;     /* the longest gap, decaying (HB_STALL_HALF_LIFE_S) */
  double timeout;
  char host[256];   /* its address without the port: the key of link_memory */
} hb_peer;

struct tcp_heartbeat {
  int fd;
  int family;
  int rank, size;
  uint64_t comm_hash;
  uint64_t seq;
  bool send_error_logged;
  uint64_t dropped; /* datagrams dropped: not ours, bad MAC, or replayed */
  hb_peer *peers;
  bool adaptive;    /* heartbeat_set_adaptive was called */
  double interval_s, floor_s;
  double stalled;   /* seconds the watcher was not running when due (heartbeat_note_stall), in all */
};

static void memory_seed(tcp_heartbeat *hb, hb_peer *peer);

td_status heartbeat_open(int listen_fd, int rank, int size, uint64_t comm_hash, tcp_heartbeat **out,
                         bool *port_taken) {
  *out = NULL;
  *port_taken = false;
  struct sockaddr_storage addr;
  socklen_t addr_len = sizeof addr;
  if (getsockname(listen_fd, (struct sockaddr *)&addr, &addr_len) != 0)
    return td_error_errno("tcp: rank %d cannot read its listening address for the heartbeat socket", rank);
  tcp_heartbeat *hb = calloc(1, sizeof *hb);
  if (hb) hb->peers = calloc((size_t)size, sizeof *hb->peers);
  if (!hb || !hb->peers) {
    heartbeat_close(hb);
    return td_error(TD_ERR_SYSTEM, "tcp: out of memory for the heartbeats of %d ranks", size);
  }
  hb->rank = rank;
  hb->size = size;
  hb->comm_hash = comm_hash;
  hb->family = addr.ss_family;
  hb->fd = socket(addr.ss_family, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (hb->fd < 0) {
    td_status st = td_error_errno("tcp: rank %d cannot create its heartbeat socket", rank);
    heartbeat_close(hb);
    return st;
  }
  if (bind(hb->fd, (struct sockaddr *)&addr, addr_len) != 0) {
    *port_taken = errno == EADDRINUSE;
    td_status st = td_error_errno("tcp: rank %d cannot bind its heartbeat socket beside its listener", rank);
    heartbeat_close(hb);
    return st;
  }
  /* Beats are drained once per tick, so the queue must hold a tick's worth
   * from every peer (each small datagram costs the buffer about 1 KiB);
   * the kernel caps the request at net.core.rmem_max. Best effort. */
  int want = (int)TD_MIN((size_t)size * 2048u, (size_t)64 << 20);
  int have = 0;
  socklen_t have_len = sizeof have;
  if (getsockopt(hb->fd, SOL_SOCKET, SO_RCVBUF, &have, &have_len) == 0 && have < want)
    (void)setsockopt(hb->fd, SOL_SOCKET, SO_RCVBUF, &want, sizeof want);
  *out = hb;
  return TD_OK;
}

td_status heartbeat_set_peer(tcp_heartbeat *hb, int peer, const char *addr) {
  char host[256];
  int port = 0;
  TD_CHECK(net_parse_addr(addr, host, sizeof host, &port));
  char port_text[16];
  snprintf(port_text, sizeof port_text, "%d", port);
  struct addrinfo hints = {.ai_family = hb->family, .ai_socktype = SOCK_DGRAM, .ai_flags = AI_NUMERICSERV};
  struct addrinfo *res = NULL;
  int gai = getaddrinfo(host, port_text, &hints, &res);
  if (gai != 0 || !res)
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "tcp: rank %d cannot resolve rank %d's address %s for heartbeats (%s): set TANDEM_HOST_ADDR on "
                    "that host to an %s address this one can reach",
                    hb->rank, peer, addr, gai ? gai_strerror(gai) : "no address",
                    hb->family == AF_INET6 ? "IPv6" : "IPv4");
  memcpy(&hb->peers[peer].to, res->ai_addr, res->ai_addrlen);
  hb->peers[peer].to_len = res->ai_addrlen;
  freeaddrinfo(res);
  snprintf(hb->peers[peer].host, sizeof hb->peers[peer].host, "%s", host);
  if (hb->adaptive && hb->peers[peer].gaps) memory_seed(hb, &hb->peers[peer]);
  return TD_OK;
}

void heartbeat_set_adaptive(tcp_heartbeat *hb, double interval_s, double floor_s) {
  /* The arrival times come from the kernel (the moment the datagram came
   * in), not from the drain once per tick, so that the gaps measure the
   * sender and the network, not how this tick's phase falls against the
   * sender's. Without them (never on Linux) the drain time is used. */
  int one = 1;
  if (setsockopt(hb->fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof one) != 0)
    TD_DEBUG("tcp: rank %d's heartbeat socket gives no arrival times (%s): the drain times are used", hb->rank,
             strerror(errno));
  for (int p = 0; p < hb->size; p++) {
    hb_peer *peer = &hb->peers[p];
    if (p == hb->rank) continue;
    /* Best effort: a peer without a window keeps the fixed timeout. */
    peer->gaps = malloc(sizeof *peer->gaps * HB_WINDOW);
  }
  hb->adaptive = true;
  hb->interval_s = interval_s;
  hb->floor_s = floor_s;
}

/* What the adaptive timeouts learnt of each host, kept past the
 * communicator that learnt it: an elastic job forms a new communicator at
 * every membership change, and one that started from no beats would apply
 * the fixed timeout for its first HB_MIN_GAPS intervals, just when the next
 * fault may come. The gaps measure the sending host's scheduling and the
 * link to it, which a new process there shares, so a new communicator's
 * peer on a known host starts from the window the last communicator closed
 * with. Process-wide, a few hosts (the least recently saved is replaced). */
#define HB_MEMORY_HOSTS 32
static struct {
  pthread_mutex_t lock;
  struct {
    char host[256];
    float gaps[HB_WINDOW];
    int n_gaps, next_gap;
    double stall;
    uint64_t saved; /* order of saving; 0: empty */
  } slot[HB_MEMORY_HOSTS];
  uint64_t saves;
} link_memory = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void memory_save(const hb_peer *peer) {
  if (!peer->gaps || peer->n_gaps < HB_MIN_GAPS || !peer->host[0]) return;
  pthread_mutex_lock(&link_memory.lock);
  int use = 0;
  for (int i = 0; i < HB_MEMORY_HOSTS; i++) {
    if (link_memory.slot[i].saved && !strcmp(link_memory.slot[i].host, peer->host)) {
      use = i;
      break;
    }
    if (link_memory.slot[i].saved < link_memory.slot[use].saved) use = i;
  }
  snprintf(link_memory.slot[use].host, sizeof link_memory.slot[use].host, "%s", peer->host);
  memcpy(link_memory.slot[use].gaps, peer->gaps, sizeof link_memory.slot[use].gaps);
  link_memory.slot[use].n_gaps = peer->n_gaps;
  link_memory.slot[use].next_gap = peer->next_gap;
  link_memory.slot[use].stall = peer->stall;
  link_memory.slot[use].saved = ++link_memory.saves;
  pthread_mutex_unlock(&link_memory.lock);
}

static void memory_seed(tcp_heartbeat *hb, hb_peer *peer) {
  pthread_mutex_lock(&link_memory.lock);
  for (int i = 0; i < HB_MEMORY_HOSTS; i++)
    if (link_memory.slot[i].saved && !strcmp(link_memory.slot[i].host, peer->host)) {
      memcpy(peer->gaps, link_memory.slot[i].gaps, sizeof link_memory.slot[i].gaps);
      peer->n_gaps = link_memory.slot[i].n_gaps;
      peer->next_gap = link_memory.slot[i].next_gap;
      peer->stall = link_memory.slot[i].stall;
      peer->timeout =
          heartbeat_adaptive_timeout(peer->gaps, peer->n_gaps, peer->stall, hb->interval_s, hb->floor_s, INFINITY);
      break;
    }
  pthread_mutex_unlock(&link_memory.lock);
}

double heartbeat_adaptive_timeout(const float *gaps, int n, double stall_s, double interval_s, double floor_s,
                                  double cap_s) {
  if (n < HB_MIN_GAPS) return cap_s;
  double sum = 0, longest = stall_s;
  for (int i = 0; i < n; i++) {
    sum += gaps[i];
    if (gaps[i] > longest) longest = gaps[i];
  }
  double mean = sum / n, var = 0;
  for (int i = 0; i < n; i++) var += ((double)gaps[i] - mean) * ((double)gaps[i] - mean);
  double sd = TD_MAX(sqrt(var / n), interval_s / 4);
  /* phi = -log10(P(a gap > t)) = 8 under the normal model: t = mean + z sd
   * with 1 - Phi(z) = 1e-8, z = 5.612. */
  double t = TD_MAX(mean + 5.612 * sd, HB_STALL_FACTOR * longest);
  return TD_MIN(TD_MAX(t, floor_s), cap_s);
}

double heartbeat_peer_timeout(const tcp_heartbeat *hb, int peer, double cap_s, int *n_gaps, double *mean_gap,
                              double *longest_gap) {
  const hb_peer *pe = &hb->peers[peer];
  bool adapts = hb->adaptive && pe->gaps && pe->n_gaps >= HB_MIN_GAPS;
  if (n_gaps) *n_gaps = pe->gaps ? pe->n_gaps : 0;
  double sum = 0, longest = pe->stall;
  for (int i = 0; (mean_gap || longest_gap) && pe->gaps && i < pe->n_gaps; i++) {
    sum += pe->gaps[i];
    if (pe->gaps[i] > longest) longest = pe->gaps[i];
  }
  if (mean_gap) *mean_gap = pe->gaps && pe->n_gaps ? sum / pe->n_gaps : 0;
  if (longest_gap) *longest_gap = longest;
  return adapts ? TD_MIN(pe->timeout, cap_s) : cap_s;
}

/* Peer's beat arrived at `arrived` (see hb_peer.arrived): one more gap in
 * its window, and its timeout anew (the cap is applied by the reader). */
static void note_arrival(tcp_heartbeat *hb, hb_peer *peer, double arrived) {
  if (!peer->gaps) return;
  if (peer->arrived > 0) {
    /* A clock step (the realtime clock set back or far forward) makes a
     * gap that is no measurement: kept within [0, an hour]. */
    double gap = TD_MIN(TD_MAX(arrived - peer->arrived, 0.0), 3600.0);
    peer->gaps[peer->next_gap] = (float)gap;
    peer->next_gap = (peer->next_gap + 1) % HB_WINDOW;
    if (peer->n_gaps < HB_WINDOW) peer->n_gaps++;
    peer->stall = TD_MAX(gap, peer->stall * exp2(-gap / HB_STALL_HALF_LIFE_S));
    peer->timeout =
        heartbeat_adaptive_timeout(peer->gaps, peer->n_gaps, peer->stall, hb->interval_s, hb->floor_s, INFINITY);
  }
  peer->arrived = arrived;
}

void heartbeat_close(tcp_heartbeat *hb) {
  if (!hb) return;
  if (hb->fd >= 0) close(hb->fd);
  for (int p = 0; hb->peers && p < hb->size; p++) {
    memory_save(&hb->peers[p]);
    free(hb->peers[p].gaps);
  }
  free(hb->peers);
  free(hb);
}

void heartbeat_send(tcp_heartbeat *hb, bool failed) {
  hb_beat beat = {.magic = HB_MAGIC, .flags = failed ? HB_FLAG_FAILED : 0, .comm_hash = hb->comm_hash,
                  .rank = hb->rank, .seq = ++hb->seq};
  net_auth_datagram_mac(HB_MAC_LABEL, &beat, HB_BODY_BYTES, beat.mac);
  for (int p = 0; p < hb->size; p++) {
    hb_peer *peer = &hb->peers[p];
    if (p == hb->rank || !peer->to_len || peer->forgotten) continue;
    ssize_t n;
    TD_SYSCALL_RETRY(n, sendto(hb->fd, &beat, sizeof beat, MSG_DONTWAIT | MSG_NOSIGNAL,
                               (struct sockaddr *)&peer->to, peer->to_len));
    /* A route that vanished (link down: ENETUNREACH) or a full queue loses
     * this beat, as the network would: the receiver's timeout decides. */
    if (n < 0 && !hb->send_error_logged) {
      hb->send_error_logged = true;
      TD_DEBUG("tcp: rank %d could not send a heartbeat to rank %d: %s", hb->rank, p, strerror(errno));
    }
  }
}

/* The kernel's arrival time of the datagram recvmsg just read, or -1. */
static double arrival_time(struct msghdr *msg) {
  for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(msg, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
      struct timespec ts;
      memcpy(&ts, CMSG_DATA(c), sizeof ts);
      return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
    }
  return -1;
}

void heartbeat_drain(tcp_heartbeat *hb, double now) {
  /* Drain time in the realtime clock, for a datagram without a stamp. */
  struct timespec real_now;
  clock_gettime(CLOCK_REALTIME, &real_now);
  double real = (double)real_now.tv_sec + (double)real_now.tv_nsec * 1e-9;
  for (;;) {
    hb_beat beat;
    ssize_t n;
    union {
      char buf[CMSG_SPACE(sizeof(struct timespec))];
      struct cmsghdr align;
    } control;
    struct iovec iov = {.iov_base = &beat, .iov_len = sizeof beat};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
                         .msg_controllen = sizeof control.buf};
    TD_SYSCALL_RETRY(n, recvmsg(hb->fd, &msg, MSG_DONTWAIT | MSG_TRUNC));
    if (n < 0) return; /* EAGAIN: drained (other errors: retried next tick) */
    if ((size_t)n != sizeof beat || beat.magic != HB_MAGIC || beat.comm_hash != hb->comm_hash || beat.rank < 0 ||
        beat.rank >= hb->size || beat.rank == hb->rank ||
        !net_auth_datagram_check(HB_MAC_LABEL, &beat, HB_BODY_BYTES, beat.mac) ||
        beat.seq <= hb->peers[beat.rank].seq) {
      if (hb->dropped++ == 0)
        TD_DEBUG("tcp: rank %d dropped a datagram on its heartbeat port that is not an authentic, fresh beat of "
                 "this communicator (%zd bytes)", hb->rank, n);
      continue;
    }
    hb_peer *peer = &hb->peers[beat.rank];
    peer->seq = beat.seq;
    peer->heard = now;
    peer->stalled_at_heard = hb->stalled;
    peer->beat_seen = true;
    if (beat.flags & HB_FLAG_FAILED) peer->failed = true;
    if (hb->adaptive) {
      double at = arrival_time(&msg);
      note_arrival(hb, peer, at > 0 ? at : real);
    }
  }
}

void heartbeat_heard(tcp_heartbeat *hb, int peer, double now) {
  if (peer >= 0 && peer < hb->size && hb->peers[peer].heard < now) {
    hb->peers[peer].heard = now;
    hb->peers[peer].stalled_at_heard = hb->stalled;
  }
}

void heartbeat_reset(tcp_heartbeat *hb, double now) {
  for (int p = 0; p < hb->size; p++) heartbeat_heard(hb, p, now);
}

void heartbeat_note_stall(tcp_heartbeat *hb, double stall_s) {
  if (stall_s > 0) hb->stalled += stall_s;
}

void heartbeat_forget(tcp_heartbeat *hb, int peer) {
  if (peer >= 0 && peer < hb->size) hb->peers[peer].forgotten = true;
}

int heartbeat_failed_peer(const tcp_heartbeat *hb) {
  for (int p = 0; p < hb->size; p++)
    if (hb->peers[p].failed) return p;
  return -1;
}

int heartbeat_lost(const tcp_heartbeat *hb, int after, double now, double timeout_s) {
  for (int p = after < 0 ? 0 : after + 1; p < hb->size; p++) {
    const hb_peer *peer = &hb->peers[p];
    if (p == hb->rank || !peer->to_len || peer->forgotten || !peer->beat_seen) continue;
    if (heartbeat_silence(hb, p, now) > heartbeat_peer_timeout(hb, p, timeout_s, NULL, NULL, NULL)) return p;
  }
  return -1;
}

int heartbeat_never_beat(const tcp_heartbeat *hb, int after) {
  for (int p = after < 0 ? 0 : after + 1; p < hb->size; p++) {
    const hb_peer *peer = &hb->peers[p];
    if (p != hb->rank && peer->to_len && !peer->forgotten && !peer->beat_seen) return p;
  }
  return -1;
}

double heartbeat_own_stall(const tcp_heartbeat *hb, int peer) {
  return hb->stalled - hb->peers[peer].stalled_at_heard;
}

double heartbeat_silence(const tcp_heartbeat *hb, int peer, double now) {
  return now - hb->peers[peer].heard - heartbeat_own_stall(hb, peer);
}
