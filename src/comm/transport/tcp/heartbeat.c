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
 * The beat, 80 bytes, native byte order (all ranks of a job run the same
 * build on the same architecture, as the op headers already assume):
 *   magic "TDHB" | flags (bit 0: my communicator failed) | communicator hash
 *   | sender rank | echo hold | sequence | sent | echo sent | MAC
 * sent is the sender's clock when it sent the beat; echo sent is the `sent`
 * of the last beat the sender took from this beat's destination, and echo
 * hold how long before this send that beat arrived (both 0: none yet). The
 * destination then has a round trip from its own clock alone: now - echo
 * sent - echo hold (RTCP's LSR/DLSR, RFC 3550 6.4.1), with no extra packet
 * and no clock agreement between the hosts; a lost beat only makes the next
 * echo older and its hold longer. So each destination gets its own beat.
 * MAC = HMAC-SHA-256 under the job's key (net_auth_datagram_mac) of the 48
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
  uint32_t echo_hold_us; /* from the echoed beat's arrival to this send (capped at ~71 minutes) */
  uint64_t seq;
  int64_t sent_ns;       /* CLOCK_REALTIME of the sender (differences only) */
  int64_t echo_sent_ns;  /* sent_ns of the last beat taken from the destination; 0: none */
  unsigned char mac[32]; /* of the fields above */
} hb_beat;
#define HB_MAC_LABEL "tandem heartbeat v2"
#define HB_BODY_BYTES offsetof(hb_beat, mac)
_Static_assert(sizeof(hb_beat) == 80 && offsetof(hb_beat, mac) == 48, "the heartbeat wire format is 80 bytes");

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
  /* The echo this rank owes the peer: the sent_ns of the last beat taken
   * from it and that beat's arrival (realtime ns). */
  int64_t echo_sent_ns, echo_arrived_ns;
  /* What the beats measured (heartbeat_stats; under tcp_heartbeat.stats_lock). */
  uint64_t beats, missed, rtt_samples;
  double rtt, srtt, rtt_min;
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
  pthread_mutex_t stats_lock; /* the peers' measured fields, read by heartbeat_stats on any thread */
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
  pthread_mutex_init(&hb->stats_lock, NULL);
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
  /* The kernel's arrival time of each beat (recvmsg's SCM_TIMESTAMPNS), not
   * the drain once per tick: the adaptive timeouts' gaps then measure the
   * sender and the network, not how this tick's phase falls against the
   * sender's, and an echo's hold is the time the beat really waited here.
   * Without them (never on Linux) the drain time is used. */
  int one = 1;
  if (setsockopt(hb->fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof one) != 0)
    TD_DEBUG("tcp: rank %d's heartbeat socket gives no arrival times (%s): the drain times are used", rank,
             strerror(errno));
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
  pthread_mutex_destroy(&hb->stats_lock);
  free(hb);
}

static int64_t realtime_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void heartbeat_send(tcp_heartbeat *hb, bool failed) {
  hb_beat beat = {.magic = HB_MAGIC, .flags = failed ? HB_FLAG_FAILED : 0, .comm_hash = hb->comm_hash,
                  .rank = hb->rank, .seq = ++hb->seq};
  for (int p = 0; p < hb->size; p++) {
    hb_peer *peer = &hb->peers[p];
    if (p == hb->rank || !peer->to_len || peer->forgotten) continue;
    /* One MAC per destination (a microsecond each), since each carries its
     * own echo. The clock is read last, so that the hold and the send time
     * leave out the MAC's time. */
    beat.sent_ns = realtime_ns();
    beat.echo_sent_ns = peer->echo_sent_ns;
    int64_t hold_us = (beat.sent_ns - peer->echo_arrived_ns) / 1000;
    beat.echo_hold_us = peer->echo_sent_ns ? (uint32_t)TD_MIN(TD_MAX(hold_us, (int64_t)0), (int64_t)UINT32_MAX) : 0;
    net_auth_datagram_mac(HB_MAC_LABEL, &beat, HB_BODY_BYTES, beat.mac);
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

/* The kernel's arrival time (CLOCK_REALTIME ns) of the datagram recvmsg
 * just read, or -1. */
static int64_t arrival_ns(struct msghdr *msg) {
  for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(msg, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
      struct timespec ts;
      memcpy(&ts, CMSG_DATA(c), sizeof ts);
      return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    }
  return -1;
}

/* Peer's beat, taken, arrived at `arrived` (realtime ns): its sequence gap
 * and the round trip its echo closes. */
static void note_measures(tcp_heartbeat *hb, hb_peer *peer, const hb_beat *beat, int64_t arrived) {
  /* A round trip only from an echo of a beat this rank sent (a clock set
   * back, or an echo from before this process, gives none), of an hour
   * at most. */
  double rtt = -1;
  if (beat->echo_sent_ns > 0)
    rtt = (double)(arrived - beat->echo_sent_ns) * 1e-9 - (double)beat->echo_hold_us * 1e-6;
  pthread_mutex_lock(&hb->stats_lock);
  if (peer->seq > 0 && beat->seq > peer->seq + 1) peer->missed += beat->seq - peer->seq - 1;
  peer->beats++;
  if (rtt >= 0 && rtt < 3600) {
    peer->rtt = rtt;
    /* RFC 6298 2.2-2.3: the first sample is the estimate, then gain 1/8. */
    peer->srtt = peer->rtt_samples ? peer->srtt + (rtt - peer->srtt) / 8 : rtt;
    peer->rtt_min = peer->rtt_samples ? TD_MIN(peer->rtt_min, rtt) : rtt;
    peer->rtt_samples++;
  }
  pthread_mutex_unlock(&hb->stats_lock);
}

int heartbeat_stats(tcp_heartbeat *hb, td_heartbeat_stats *rows, int max) {
  int n = 0;
  pthread_mutex_lock(&hb->stats_lock);
  for (int p = 0; p < hb->size; p++) {
    const hb_peer *peer = &hb->peers[p];
    if (p == hb->rank || !peer->to_len) continue;
    if (n < max)
      rows[n] = (td_heartbeat_stats){.peer = p, .beats = peer->beats, .missed = peer->missed,
                                     .rtt_samples = peer->rtt_samples, .rtt_s = peer->rtt,
                                     .rtt_smoothed_s = peer->srtt, .rtt_min_s = peer->rtt_min};
    n++;
  }
  pthread_mutex_unlock(&hb->stats_lock);
  return n;
}

void heartbeat_drain(tcp_heartbeat *hb, double now) {
  /* Drain time in the realtime clock, for a datagram without a stamp. */
  int64_t real = realtime_ns();
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
    int64_t at = arrival_ns(&msg);
    if (at <= 0) at = real;
    note_measures(hb, peer, &beat, at);
    peer->seq = beat.seq;
    peer->heard = now;
    peer->stalled_at_heard = hb->stalled;
    peer->beat_seen = true;
    peer->echo_sent_ns = beat.sent_ns;
    peer->echo_arrived_ns = at;
    if (beat.flags & HB_FLAG_FAILED) peer->failed = true;
    if (hb->adaptive) note_arrival(hb, peer, (double)at * 1e-9);
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
