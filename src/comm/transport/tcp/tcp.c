/* The TCP transport: one connection per pair of ranks (a full mesh), used
 * between hosts and, with TANDEM_TRANSPORT=tcp, on one host.
 *
 * Wiring (tcp_transport_create): every rank listens on an ephemeral port and
 * publishes "<prefix>/tcp/<rank>" = "address:port <aes>" in the store (aes:
 * 1 if its CPU runs AES-256-GCM), reading all of them back with one
 * store_gather; rank i then
 * connects to every j < i and authenticates (net_auth_connect: its rank in
 * the hello, a MAC bound to the communicator and to j), and accepts one
 * connection from every j > i, checking the MAC (net_auth_accept) before
 * the socket joins the transport. A connector waits only on lower ranks'
 * accept loops, and rank 0 accepts at once, so the order cannot deadlock.
 *
 * The listener binds 127.0.0.1 when every rank of the communicator is on
 * this host; otherwise TANDEM_HOST_ADDR, TANDEM_IFACE's address, or the
 * local address of the connection to the store (the interface that routes
 * to it). A connection that fails authentication is closed with a warning
 * and never sees a byte of the job's data; one that stays silent is closed
 * after TANDEM_AUTH_TIMEOUT.
 *
 *        rank 0          rank 1          rank 2
 *        listen  <-----  connect
 *        listen  <---------------------  connect
 *                        listen  <-----  connect
 *
 * Afterwards the sockets are non-blocking with TCP_NODELAY and the socket
 * buffers of TANDEM_TCP_BUFFER_BYTES (at least 128 KiB); the framing engine
 * (p2p/p2p.c) drives them through try_send/try_recv/wait.
 *
 * Protected streams (TANDEM_TCP_PROTECT=integrity or encrypt; off by
 * default, for its measured cost: docs/security.md): each connection's
 * bytes travel as sealed records (stream.c) under keys derived from its
 * handshake, so data altered, injected, replayed or dropped on the path
 * fails the communicator naming the peer instead of reaching a sum.
 *
 * Failure: a rank that fails (comm_fail: mismatch, timeout, lost peer,
 * td_comm_abort) publishes its status and reason under "<prefix>/abort"
 * (first writer wins, so the root cause survives the cascade) and then shuts
 * its sockets (tcp_abort). A peer that sees the EOF, reset or broken pipe
 * relays the published failure as "rank R reported: ..." with the original
 * status when it is TD_ERR_MISMATCH or TD_ERR_TIMEOUT (a disagreement or a
 * stuck collective concerns every rank alike) and TD_ERR_REMOTE otherwise,
 * as the shm transport's abort block does. A connection that breaks with no
 * published reason means the peer exited or was killed: TD_ERR_REMOTE naming
 * it and its address. While blocked in wait(), every other peer's socket is
 * watched for a hang-up too, so that the cascade of aborts reaches every
 * rank within seconds wherever it started.
 *
 * Late completion: a rank can finish an operation from frames its peers
 * sent before one of them failed (a late rank after the others timed out, a
 * rank whose part of a broadcast tree only touched peers that agreed). So a
 * watcher thread sleeps in epoll_wait on the peers' hang-up events only
 * (arriving data never wakes it) and counts hang-ups; after every operation
 * op_done() compares that count with the last one it saw (one atomic load:
 * the normal path makes no system call). Only after a new hang-up does it
 * read "<prefix>/abort" from the store, and fails the operation with the
 * published status if there is one. A peer that hung up without publishing
 * (a clean exit after td_comm_finalize, or a killed process) fails nothing
 * there: the next exchange with it says whether it is gone.
 *
 * What is guaranteed: once a peer has failed and its hang-up has reached
 * this rank, this rank's current or next operation fails with the
 * published status, and td_comm_finalize (a barrier) counts as such an
 * operation. What is not: an operation that completed on this rank before
 * any peer failed (or before the failing peer's hang-up arrived and the
 * watcher counted it, normally microseconds on one host) returns TD_OK; the
 * error then comes from the next call, finalize included. A rank that never
 * calls again (it destroys the communicator without finalizing) does not
 * learn of it.
 *
 * Lost hosts (heartbeat.c): a host that loses power or its link sends no
 * FIN, and the kernel of a stopped process keeps acknowledging, so neither
 * shows up on the sockets. The watcher thread therefore also sends a small
 * UDP beat to every peer once per TANDEM_HEARTBEAT_INTERVAL (from the port
 * number the rank listens on, so peers need no other address) and drains
 * the beats that came, waking once per interval whatever the world size. It
 * runs whatever the application does: a rank busy computing for minutes
 * without calling Tandem still beats. A peer from which neither a beat nor
 * data arrived for TANDEM_HEARTBEAT_TIMEOUT is lost: the watcher fails the
 * communicator with TD_ERR_REMOTE naming it and its address, which fails
 * the operation in flight within a wait slice, everything queued, and every
 * later call, on a rank that is idle too. The usual abort then relays it.
 * Beats also carry a "my communicator failed" bit, on which a peer fetches
 * the published reason at once instead of at its next call. The watcher
 * uses its own store connection (the executing thread may be blocked on
 * comm->store, which a lost link can leave unanswered for a minute) and,
 * once the communicator has failed, breaks off such a late request; with a
 * partition that leaves the store on the other side, this side's ranks
 * still fail within the timeout, each naming a rank it lost. */
#define _GNU_SOURCE 1 /* POLLRDHUP; must precede the first system header */
#include "comm/rendezvous/rendezvous.h"
#include "comm/transport/tcp/heartbeat.h"
#include "comm/transport/tcp/stream.h"
#include "comm/transport/tcp/tcp.h"

#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

/* Longest single sleep in wait(), so that a failure recorded by another
 * thread is noticed promptly even if no socket becomes ready. */
#define TCP_WAIT_SLICE_S 0.1
/* Heartbeat defaults (TANDEM_HEARTBEAT_INTERVAL, TANDEM_HEARTBEAT_TIMEOUT):
 * a peer silent for the timeout is lost. A loss is found between timeout and
 * timeout + 2 intervals after the last beat (a beat is counted when the
 * tick after its arrival drains it), so 6 s and 1 s report a lost host within
 * 8 s, inside the 10 s DESIGN.md §3 promises, while a rank whose process is
 * starved of the CPU for a few seconds is not declared dead. */
#define TCP_DEFAULT_HEARTBEAT_INTERVAL_S 1.0
#define TCP_DEFAULT_HEARTBEAT_TIMEOUT_S 6.0
/* The watcher's own store connection (see watcher_store) gives up
 * connecting after this long: a store across a lost link never answers. */
#define TCP_WATCH_STORE_CONNECT_S 1.0
/* After a failure, a store request of the executing thread that is late by
 * this much is broken off (its answer no longer matters, and a store behind
 * a lost link would hold the failed operation for a minute). */
#define TCP_STORE_LATE_S 0.5
/* Listen again at most this often when the listener's port is taken for UDP. */
#define TCP_LISTEN_TRIES 16
/* Busy-poll this long before sleeping in poll(): a loopback round trip is a
 * few microseconds, a wake-up from poll() tens, so small messages pay the
 * sleep on every step without it (4 KiB allreduce, 2 ranks: 26-90 us
 * sleeping, about 11 us polling, like Open MPI). Only when every local rank
 * has a core; the loop yields every few microseconds. */
#define TCP_DEFAULT_SPIN_US 50.0
/* A rank that sees EOF waits this long for the peer's published reason:
 * the peer stores it before shutting its sockets, so it is normally there. */
#define TCP_REASON_WAIT_S 0.25
/* While a bystander peer has hung up, look for a published reason this often. */
#define TCP_REASON_RECHECK_S 0.25
/* Default socket buffer size (SO_SNDBUF/SO_RCVBUF; the kernel doubles it);
 * 0 keeps the kernel's autotuning. Measured with a 64 MiB f32 allreduce, 2
 * ranks on loopback, side by side: 1 MiB and 4 MiB ~1.78 GB/s busbw, 256 KiB
 * ~1.26, autotuning ~1.16 (it starts small and grows too late). 4 MiB also
 * leaves room for the bandwidth-delay product of a real LAN. */
#define TCP_DEFAULT_BUFFER_BYTES ((size_t)4 << 20)

/* Floor for TANDEM_TCP_BUFFER_BYTES. The buffers are set after the
 * connection exists, and a receive buffer smaller than the window the
 * kernel already advertised makes it drop segments, which come back only
 * after 200 ms retransmission timeouts (measured: 30x slower at 16 KiB). */
#define TCP_MIN_BUFFER_BYTES ((size_t)128 << 10)

typedef struct tcp_peer {
  int fd;        /* -1 for this rank */
  bool hung_up;  /* poll saw it hang up while it was not part of the transfer */
  char addr[96]; /* "host:port" it listened on, for messages */
  /* Bytes received from it so far (executing thread writes, watcher reads):
   * data from a peer proves it alive as well as a beat does, and a link
   * full of data may drop beats. */
  _Atomic uint64_t rx_bytes;
  uint64_t rx_seen; /* rx_bytes at the watcher's last tick (watcher only) */
  /* Sealed records instead of raw bytes (TANDEM_TCP_PROTECT; stream.c);
   * NULL: the connection is not protected. Executing thread only. */
  tcp_stream *stream;
  bool aes;      /* the peer's CPU runs AES-256-GCM (published with its address) */
} tcp_peer;

typedef struct tcp_transport {
  transport base;
  int rank, size;
  tcp_peer *peers;
  struct pollfd *pfds; /* scratch for wait(): one operation runs at a time */
  int *pfd_peer;       /* pfds[k] watches peers[pfd_peer[k]] */
  /* The watcher (see op_done and watcher_tick): a thread asleep in
   * epoll_wait on every peer's hang-up events and on stop_fd, counting
   * hang-ups, and waking once per heartbeat interval to send and check
   * beats. */
  int hup_fd, stop_fd;           /* -1 until created */
  /* transport_vtbl.wake: another thread of this rank queued operations;
   * wait() polls it beside the peers and returns once it is readable
   * (reading it), so that the send/recv stream pulls them (eventfd) */
  int wake_fd;
  pthread_t watcher;
  bool watcher_started;
  _Atomic unsigned hangups;      /* peers the watcher saw hang up so far */
  tcp_heartbeat *hb;             /* NULL when TANDEM_HEARTBEAT_TIMEOUT=0 */
  /* The peers declare_lost found silent, ascending, -1 after the last:
   * written once by the watcher, then published (NULL before). */
  _Atomic(int *) silent;
  double hb_interval_s, hb_timeout_s;
  double hb_floor_s;             /* the adaptive timeouts' floor; hb_timeout_s: fixed timeout */
  _Atomic int armed;             /* wiring done: silence counts from now on */
  /* The watcher may block in the store (publishing a failure to a store
   * that the lost link cut off); destroy then interrupts that call rather
   * than wait for it (Dekker-style pair: each sets its flag, then reads the
   * other's). */
  _Atomic int watcher_in_store, stopping;
  /* The watcher's own store connection, opened when it first needs the
   * store, so that it never queues behind (or holds up) the executing
   * thread's requests on comm->store. */
  td_store *_Atomic watch_store;
  double watch_store_retry_at;
  double armed_at;        /* watcher only: its first tick after arm_watcher */
  bool warned_never_beat; /* watcher only */
  unsigned hangups_checked;      /* the count op_done last acted on (executing thread only) */
  double next_reason_check;
  _Atomic int aborted;
  uint64_t spin_ns; /* busy-poll budget before sleeping in poll (0: never spin) */
} tcp_transport;

/* The authentication context of rank `acceptor`'s listener: a proof made
 * for one communicator or one listener is worthless for any other. */
static void auth_context(const td_comm *comm, int acceptor, char *buf, size_t size) {
  snprintf(buf, size, "tcp %s %d", comm->prefix, acceptor);
}

static uint64_t prefix_hash(const char *s) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static void abort_key(const td_comm *comm, char *buf, size_t size) { snprintf(buf, size, "%s/abort", comm->prefix); }

/* The abort record is text: "status <td_status number>\n<reason>". */
#define TCP_ABORT_STATUS_TAG "status "

/* The status a peer's failure has on this rank: a mismatch or a timeout is
 * the same condition on every rank; anything else is, here, a remote error
 * (a peer's own system error or misuse is not this rank's). */
static td_status relayed_status(long published) {
  if (published == TD_ERR_MISMATCH || published == TD_ERR_TIMEOUT) return (td_status)published;
  return TD_ERR_REMOTE;
}

/* The failure a peer published, waiting up to wait_s for it to appear (0:
 * just look). NULL if there is none; otherwise free() the result, whose
 * text is the reason, and *status_out is the status to relay it with. */
static char *published_reason(tcp_transport *t, td_store *store, double wait_s, td_status *status_out) {
  td_comm *comm = t->base.comm;
  *status_out = TD_ERR_REMOTE;
  if (!store) return NULL;
  char key[256];
  abort_key(comm, key, sizeof key);
  void *value = NULL;
  size_t len = 0;
  if (wait_s > 0) {
    if (store_wait(store, key, wait_s, &value, &len) != TD_OK) return NULL;
  } else {
    int found = 0;
    if (store_get(store, key, &value, &len, &found) != TD_OK || !found) return NULL;
  }
  /* The value is NUL-terminated (store_get). */
  char *text = value;
  size_t tag_len = strlen(TCP_ABORT_STATUS_TAG);
  if (!strncmp(text, TCP_ABORT_STATUS_TAG, tag_len)) {
    char *end = NULL;
    long published = strtol(text + tag_len, &end, 10);
    if (end && *end == '\n') {
      *status_out = relayed_status(published);
      memmove(text, end + 1, strlen(end + 1) + 1);
    }
  }
  return text;
}

/* Fail the communicator with the failure a peer published, if there is one
 * (waiting up to wait_s for it); TD_OK if there is none. */
static td_status relay_published_via(tcp_transport *t, td_store *store, double wait_s) {
  td_status status;
  char *reason = published_reason(t, store, wait_s, &status);
  if (!reason) return TD_OK;
  td_status st = comm_fail(t->base.comm, status, "%s", reason);
  free(reason);
  return st;
}
static td_status relay_published(tcp_transport *t, double wait_s) {
  return relay_published_via(t, t->base.comm->store, wait_s);
}

/* The watcher's store connection (NULL if the store cannot be reached now;
 * tried again after a few seconds). Watcher thread only. */
static td_store *watcher_store(tcp_transport *t) {
  td_store *s = atomic_load(&t->watch_store);
  td_comm *comm = t->base.comm;
  if (s || !comm->store) return s;
  double now = td_now();
  if (now < t->watch_store_retry_at) return NULL;
  t->watch_store_retry_at = now + 5.0;
  if (store_connect(store_address(comm->store), TCP_WATCH_STORE_CONNECT_S, &s) != TD_OK) {
    TD_DEBUG("tcp: rank %d's watcher cannot reach the store: %s", t->rank, td_last_error());
    return NULL;
  }
  atomic_store(&t->watch_store, s);
  /* Destroy may have looked for a connection to interrupt just before
   * this one existed (it sets stopping first, then looks). */
  if (atomic_load(&t->stopping)) return NULL;
  return s;
}

static bool on_watcher(const tcp_transport *t) {
  return t->watcher_started && pthread_equal(pthread_self(), t->watcher);
}

static td_status failed_status(tcp_transport *t) {
  td_status st = comm_status(t->base.comm);
  return st != TD_OK ? st : TD_ERR_REMOTE;
}

/* A connection broke (err = 0 for EOF, else errno). Relay the peer's reason
 * if it published one, else say that it went away. */
static td_status peer_broken(tcp_transport *t, int peer, int err) {
  td_comm *comm = t->base.comm;
  td_status st = comm_status(comm);
  if (st != TD_OK) return st;
  if (atomic_load(&t->aborted)) return failed_status(t);
  st = relay_published(t, TCP_REASON_WAIT_S);
  if (st != TD_OK) return st;
  const tcp_peer *p = &t->peers[peer];
  char name[160];
  comm_peer_name(comm, peer, p->addr, name, sizeof name);
  if (err == 0 || err == EPIPE || err == ECONNRESET)
    return comm_fail(comm, TD_ERR_REMOTE, "%s %s its connection to rank %d: it exited or was killed", name,
                     err == ECONNRESET ? "reset" : "closed", t->rank);
  return comm_fail(comm, TD_ERR_REMOTE, "the connection from rank %d to %s failed: %s", t->rank, name,
                   strerror(err));
}

/* A protected stream's failure as the communicator's: a socket error is a
 * broken connection as without protection; a record that fails its check
 * means someone on the path altered, replayed, reordered or dropped data
 * (or the ranks were started with different TANDEM_TCP_PROTECT): the
 * communicator fails naming the peer, and never hands the data out. */
static td_status stream_failed(tcp_transport *t, int peer, tcp_stream_result r, int err) {
  td_comm *comm = t->base.comm;
  const tcp_peer *p = &t->peers[peer];
  switch (r) {
  case TCP_STREAM_OK: return TD_OK;
  case TCP_STREAM_IO: return peer_broken(t, peer, err);
  case TCP_STREAM_FORGED:
    return comm_fail(comm, TD_ERR_REMOTE,
                     "rank %d: the data from rank %d (%s) failed its integrity check (record %llu of the connection, "
                     "TANDEM_TCP_PROTECT=%s): it was altered, replayed, reordered or dropped on the way, or the ranks "
                     "run with different TANDEM_TCP_PROTECT; none of it was used, and the connection is closed",
                     t->rank, peer, p->addr, (unsigned long long)p->stream->records_in + 1,
                     net_protect_mode_name(p->stream->recv_key.mode));
  case TCP_STREAM_MISUSE:
    return comm_fail(comm, TD_ERR_INTERNAL, "rank %d: the protected stream to rank %d (%s) was called with other "
                                            "bytes than the record in flight",
                     t->rank, peer, p->addr);
  case TCP_STREAM_NOMEM:
  default:
    return comm_fail(comm, TD_ERR_SYSTEM, "rank %d: out of memory for the protected stream to rank %d", t->rank, peer);
  }
}

/* What a non-blocking send to peer that returned n means: bytes moved, a
 * full socket buffer (nothing moved, try again), or a broken link. */
static td_status sent(tcp_transport *t, int peer, ssize_t n, size_t *moved) {
  if (n >= 0) {
    *moved = (size_t)n;
    return TD_OK;
  }
  if (errno == EAGAIN || errno == EWOULDBLOCK) return TD_OK;
  return peer_broken(t, peer, errno);
}

static td_status tcp_try_send(transport *base, int peer, const void *buf, size_t len, size_t *moved) {
  tcp_transport *t = (tcp_transport *)base;
  *moved = 0;
  if (atomic_load_explicit(&t->aborted, memory_order_relaxed)) return failed_status(t);
  if (len == 0) return TD_OK;
  if (t->peers[peer].stream) {
    /* (a record in flight references the caller's buffer: never touch it
     * once the communicator failed, when the caller may have let go) */
    if (comm_status(base->comm) != TD_OK) return comm_status(base->comm);
    int err = 0;
    return stream_failed(t, peer, tcp_stream_send(t->peers[peer].stream, t->peers[peer].fd, buf, len, moved, &err),
                         err);
  }
  ssize_t n;
  TD_SYSCALL_RETRY(n, send(t->peers[peer].fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL));
  return sent(t, peer, n, moved);
}

/* A frame's header and payload in one sendmsg. Measured with a 256 MiB f32
 * allreduce between two namespace hosts (2 ranks, 256 KiB ring chunks): the
 * header written alone went out as a segment of its own ahead of each
 * chunk's payload, one more trip through both hosts' TCP stacks per chunk
 * (bench/results/py-doors-2026-11-27-s19.md). A protected stream seals
 * records of its own, so it takes the bytes of a first (the engine calls
 * again for the rest). */
static td_status tcp_try_send2(transport *base, int peer, const void *a, size_t alen, const void *b, size_t blen,
                               size_t *moved) {
  tcp_transport *t = (tcp_transport *)base;
  if (t->peers[peer].stream || alen == 0 || blen == 0)
    return alen ? tcp_try_send(base, peer, a, alen, moved) : tcp_try_send(base, peer, b, blen, moved);
  *moved = 0;
  if (atomic_load_explicit(&t->aborted, memory_order_relaxed)) return failed_status(t);
  struct iovec iov[2] = {{.iov_base = (void *)a, .iov_len = alen}, {.iov_base = (void *)b, .iov_len = blen}};
  struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 2};
  ssize_t n;
  TD_SYSCALL_RETRY(n, sendmsg(t->peers[peer].fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL));
  return sent(t, peer, n, moved);
}

static td_status tcp_try_recv(transport *base, int peer, void *buf, size_t len, size_t *moved) {
  tcp_transport *t = (tcp_transport *)base;
  *moved = 0;
  if (atomic_load_explicit(&t->aborted, memory_order_relaxed)) return failed_status(t);
  if (len == 0) return TD_OK;
  if (t->peers[peer].stream) {
    if (comm_status(base->comm) != TD_OK) return comm_status(base->comm);
    int err = 0;
    size_t wire = 0;
    tcp_stream_result r = tcp_stream_recv(t->peers[peer].stream, t->peers[peer].fd, buf, len, moved, &wire, &err);
    if (wire) atomic_fetch_add_explicit(&t->peers[peer].rx_bytes, (uint64_t)wire, memory_order_relaxed);
    return stream_failed(t, peer, r, err);
  }
  ssize_t n;
  TD_SYSCALL_RETRY(n, recv(t->peers[peer].fd, buf, len, MSG_DONTWAIT));
  if (n > 0) {
    *moved = (size_t)n;
    atomic_fetch_add_explicit(&t->peers[peer].rx_bytes, (uint64_t)n, memory_order_relaxed);
    return TD_OK;
  }
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return TD_OK;
  return peer_broken(t, peer, n == 0 ? 0 : errno);
}

static td_status tcp_try_peek(transport *base, int peer, void *buf, size_t len, size_t *got) {
  tcp_transport *t = (tcp_transport *)base;
  *got = 0;
  if (atomic_load_explicit(&t->aborted, memory_order_relaxed)) return failed_status(t);
  if (t->peers[peer].stream) {
    if (comm_status(base->comm) != TD_OK) return comm_status(base->comm);
    int err = 0;
    size_t wire = 0;
    tcp_stream_result r = tcp_stream_peek(t->peers[peer].stream, t->peers[peer].fd, buf, len, got, &wire, &err);
    if (wire) atomic_fetch_add_explicit(&t->peers[peer].rx_bytes, (uint64_t)wire, memory_order_relaxed);
    /* a peek only looks: a broken socket is found by the next receive */
    return r == TCP_STREAM_IO ? TD_OK : stream_failed(t, peer, r, err);
  }
  ssize_t n;
  TD_SYSCALL_RETRY(n, recv(t->peers[peer].fd, buf, len, MSG_PEEK | MSG_DONTWAIT));
  if (n > 0) *got = (size_t)n;
  return TD_OK;
}

static bool contains(const int *list, int n, int value) {
  for (int i = 0; i < n; i++)
    if (list[i] == value) return true;
  return false;
}

/* Sleep until a socket of the transfer is ready, in slices of at most
 * TCP_WAIT_SLICE_S. Every other peer is watched for a hang-up (POLLRDHUP):
 * a bystander that hung up is not an error by itself (it may have finished
 * its last operation and exited), but if it published a reason, it failed,
 * and so does this rank. A peer that died without a reason is found by the
 * ranks that exchange data with it; their aborts then reach this rank. */
static td_status tcp_wait(transport *base, const int *send_peers, int n_send, const int *recv_peers, int n_recv,
                          double timeout_s) {
  tcp_transport *t = (tcp_transport *)base;
  td_comm *comm = base->comm;
  double deadline = td_now() + (timeout_s > 0 ? timeout_s : 0);
  for (;;) {
    td_status st = comm_status(comm);
    if (st != TD_OK) return st;
    if (atomic_load(&t->aborted)) return failed_status(t);

    /* Checked bytes already staged by a protected stream are ready now. */
    for (int i = 0; i < n_recv; i++) {
      const tcp_stream *ps = t->peers[recv_peers[i]].stream;
      if (ps && tcp_stream_pending_in(ps)) return TD_OK;
    }
    int n_pfds = 0;
    bool any_hung_up = false;
    for (int p = 0; p < t->size; p++) {
      if (p == t->rank) continue;
      short events = 0;
      if (contains(send_peers, n_send, p)) events |= POLLOUT;
      if (contains(recv_peers, n_recv, p)) events |= POLLIN;
      if (!events) {
        if (t->peers[p].hung_up) {
          any_hung_up = true;
          continue;
        }
        events = POLLRDHUP;
      }
      t->pfds[n_pfds] = (struct pollfd){.fd = t->peers[p].fd, .events = events | POLLRDHUP};
      t->pfd_peer[n_pfds++] = p;
    }
    /* the slot this rank's own peer entry leaves free (pfds holds size) */
    int wake_k = n_pfds;
    t->pfds[n_pfds] = (struct pollfd){.fd = t->wake_fd, .events = POLLIN};
    t->pfd_peer[n_pfds++] = -1;

    double now = td_now();
    if (any_hung_up && now >= t->next_reason_check) {
      t->next_reason_check = now + TCP_REASON_RECHECK_S;
      st = relay_published(t, 0);
      if (st != TD_OK) return st;
    }
    double slice = TD_MIN(deadline - now, TCP_WAIT_SLICE_S);
    if (any_hung_up) slice = TD_MIN(slice, TCP_REASON_RECHECK_S);
    int ms = slice > 0 ? (int)(slice * 1000.0 + 0.999) : 0;
    int ready = 0;
    /* The spin yields every few polls (a process holding the core the peer
     * wants runs at once). Not timed as shm's is (base/yield.c): over TCP
     * the yield often lets the rank's own progress thread or the kernel's
     * network work run for a while, and stopping the spin then cost py_doors'
     * 100M-float allreduce between two namespace hosts 1.23x its time, quiet
     * (bench/results/py-doors-2026-11-28-quiet-ab.md). */
    if (t->spin_ns && ms > 0) {
      uint64_t spin_end = td_now_ns() + t->spin_ns;
      for (unsigned i = 1; (ready = poll(t->pfds, (nfds_t)n_pfds, 0)) == 0; i++) {
        if ((i & 7) == 0) {
          if (td_now_ns() >= spin_end) break;
          sched_yield();
        }
      }
    }
    if (ready == 0) ready = poll(t->pfds, (nfds_t)n_pfds, ms);
    if (ready < 0) {
      if (errno == EINTR) continue;
      return comm_fail(comm, TD_ERR_SYSTEM, "rank %d: poll on its TCP connections failed: %s", t->rank,
                       strerror(errno));
    }
    bool progress = false;
    for (int k = 0; ready > 0 && k < n_pfds; k++) {
      short rev = t->pfds[k].revents;
      if (!rev) continue;
      if (k == wake_k) {
        uint64_t woken;
        ssize_t got;
        TD_SYSCALL_RETRY(got, read(t->wake_fd, &woken, sizeof woken));
        (void)got; /* EAGAIN: another reader took it; either way the caller pulls */
        progress = true;
        continue;
      }
      int p = t->pfd_peer[k];
      bool receiving = contains(recv_peers, n_recv, p), sending = contains(send_peers, n_send, p);
      bool hang_up = rev & (POLLRDHUP | POLLHUP | POLLERR);
      if (receiving) {
        /* Data, or the EOF after the last of it: try_recv will tell. */
        progress = true;
      } else if (sending && hang_up) {
        /* A peer that will never read what this rank still has to send
         * (polling on would return at once, again and again). */
        int err = 0;
        socklen_t len = sizeof err;
        if (!(rev & POLLERR) || getsockopt(t->peers[p].fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = 0;
        return peer_broken(t, p, err);
      } else if (sending) {
        progress = true;
      } else if (hang_up) {
        t->peers[p].hung_up = true;
        t->next_reason_check = 0;
        TD_DEBUG("tcp: rank %d (%s) hung up while rank %d waits on other peers", p, t->peers[p].addr, t->rank);
      }
    }
    if (progress) return TD_OK;
    if (td_now() >= deadline) return TD_OK; /* the caller checks its own deadline */
  }
}

/* Publish the reason (first one wins, so the root cause survives the
 * cascade), then shut every socket so that peers see EOF at once. */
static void tcp_abort(transport *base, td_status status, const char *reason) {
  tcp_transport *t = (tcp_transport *)base;
  if (atomic_exchange(&t->aborted, 1)) return;
  td_comm *comm = base->comm;
  /* From the watcher (a lost peer, a relayed failure), through its own
   * connection: the executing thread may hold comm->store in a request that
   * a lost link keeps unanswered. */
  td_store *store = on_watcher(t) ? watcher_store(t) : comm->store;
  if (store) {
    char key[256], msg[1400];
    abort_key(comm, key, sizeof key);
    /* comm_fail's messages start with "rank <this rank>: "; say it once. */
    const char *text = reason && *reason ? reason : td_status_str(status);
    char own[32];
    int own_len = snprintf(own, sizeof own, "rank %d: ", t->rank);
    if (own_len > 0 && !strncmp(text, own, (size_t)own_len)) text += own_len;
    int len = snprintf(msg, sizeof msg, TCP_ABORT_STATUS_TAG "%d\nrank %d reported: %s", (int)status, t->rank,
                       text);
    if (len < 0) len = 0;
    if ((size_t)len >= sizeof msg) len = (int)sizeof msg - 1;
    void *current = NULL;
    size_t current_len = 0;
    int swapped = 0;
    if (store_cas(store, key, NULL, 0, msg, (size_t)len, &current, &current_len, &swapped) != TD_OK)
      TD_WARN("tcp: rank %d could not publish its failure in the store (%s); peers will only see it disconnect",
              t->rank, td_last_error());
    free(current);
  } else if (comm->store) {
    TD_WARN("tcp: rank %d cannot reach the store at %s to publish its failure; peers will only see it disconnect "
            "or fall silent",
            t->rank, store_address(comm->store));
  }
  for (int p = 0; p < t->size; p++)
    if (t->peers[p].fd >= 0) shutdown(t->peers[p].fd, SHUT_RDWR);
}

/* The watcher's epoll tag for stop_fd (peers are tagged with their rank). */
#define TCP_WATCH_STOP UINT32_MAX

/* Run a store call from the watcher unless destroy has begun; destroy
 * interrupts one that is under way (see tcp_transport.stopping). */
static bool watcher_store_enter(tcp_transport *t) {
  atomic_store(&t->watcher_in_store, 1);
  if (!atomic_load(&t->stopping)) return true;
  atomic_store(&t->watcher_in_store, 0);
  return false;
}
static void watcher_store_leave(tcp_transport *t) { atomic_store(&t->watcher_in_store, 0); }

/* The communicator failed (or is about to, for a lost peer): a request of
 * the executing thread that the store is late to answer (a store behind
 * the lost link) must not hold the failed operation, so break it off. The
 * connection is not used again: every later operation fails first. */
static void break_late_store_request(tcp_transport *t) {
  td_store *store = t->base.comm->store;
  double late = store_overdue_s(store);
  if (late <= TCP_STORE_LATE_S) return;
  TD_DEBUG("tcp: rank %d breaks off a store request %.1f s overdue: the communicator has failed", t->rank, late);
  store_interrupt(store);
}

/* Same host part of "host:port" addresses? */
static bool same_host(const char *a, const char *b) {
  const char *ca = strrchr(a, ':'), *cb = strrchr(b, ':');
  size_t la = ca ? (size_t)(ca - a) : strlen(a), lb = cb ? (size_t)(cb - b) : strlen(b);
  return la == lb && memcmp(a, b, la) == 0;
}

/* Is peer p, on the lost peer's host, silent enough to be lost with it? A
 * cut or dead host silences all its ranks at once, but their timeouts run
 * out up to an interval apart; reporting only the first would leave the
 * others to the elastic settle time (3 s in the fault runs, where a cut
 * took 4 s instead of 1). Within an interval of its own timeout (and past
 * two intervals) a host-mate counts as lost too; one that still beats (a
 * single stopped process's neighbour) does not. */
static bool lost_with_host(tcp_transport *t, int lost, int p, double now) {
  if (p == t->rank || p == lost || !same_host(t->peers[p].addr, t->peers[lost].addr)) return false;
  double timeout = heartbeat_peer_timeout(t->hb, p, t->hb_timeout_s, NULL, NULL, NULL);
  return heartbeat_silence(t->hb, p, now) > TD_MAX(2 * t->hb_interval_s, timeout - t->hb_interval_s);
}

/* Fail the communicator for the peers whose beats stopped: the first one
 * silent for the timeout, and how many more are (a lost host takes all its
 * ranks with it: lost_with_host). Runs on the watcher thread, so an idle
 * rank learns it too: its next call, or td_comm_status, reports it. */
static void declare_lost(tcp_transport *t, int lost, double now) {
  char others[160] = "";
  size_t used = 0;
  int n_more = 0;
  int *silent = atomic_load(&t->silent) ? NULL : malloc(sizeof(int) * (size_t)(t->base.comm->size + 1));
  int n_silent = 0;
  for (int p = 0; p < t->size; p++) {
    /* lost is the first peer past its timeout: the others past theirs are above it. */
    bool timed_out = p > lost && heartbeat_lost(t->hb, p - 1, now, t->hb_timeout_s) == p;
    if (p != lost && !timed_out && !lost_with_host(t, lost, p, now)) continue;
    if (silent) silent[n_silent++] = p;
    if (p == lost) continue;
    if (n_more++ < 4 && used < sizeof others) {
      int n = snprintf(others + used, sizeof others - used, "%s%d", n_more > 1 ? ", " : "; also silent: rank ", p);
      if (n > 0) used += (size_t)n;
    } else if (n_more == 5 && used < sizeof others) {
      snprintf(others + used, sizeof others - used, ", ...");
    }
  }
  if (silent) {
    silent[n_silent] = -1;
    atomic_store(&t->silent, silent); /* before the failure that makes callers ask */
  }
  /* Which timeout decided: the fixed one, or the peer's adaptive one and
   * the beats it was computed from (the figures a false alarm is judged by). */
  char timeout[200];
  int n_gaps = 0;
  double mean_gap = 0, longest_gap = 0;
  double lost_after = heartbeat_peer_timeout(t->hb, lost, t->hb_timeout_s, &n_gaps, &mean_gap, &longest_gap);
  if (t->hb_floor_s < t->hb_timeout_s)
    snprintf(timeout, sizeof timeout,
             "its adaptive timeout %.2f s from %d gaps between its beats, mean %.3f s, longest %.3f s; "
             "TANDEM_HEARTBEAT_MIN_TIMEOUT=%g, TANDEM_HEARTBEAT_TIMEOUT=%g",
             lost_after, n_gaps, mean_gap, longest_gap, t->hb_floor_s, t->hb_timeout_s);
  else
    snprintf(timeout, sizeof timeout, "TANDEM_HEARTBEAT_TIMEOUT=%g", t->hb_timeout_s);
  /* The silence does not count the seconds this watcher itself did not
   * run (heartbeat_note_stall): said, so that a judge of a false alarm
   * sees how starved this rank was. */
  char stall[96] = "";
  double own_stall = heartbeat_own_stall(t->hb, lost);
  if (own_stall >= 0.05)
    snprintf(stall, sizeof stall, "; not counting %.1f s in which rank %d's own watcher did not run", own_stall,
             t->rank);
  break_late_store_request(t);
  if (!watcher_store_enter(t)) return;
  char name[160];
  comm_peer_name(t->base.comm, lost, t->peers[lost].addr, name, sizeof name);
  comm_fail(t->base.comm, TD_ERR_REMOTE,
            "%s sent no heartbeat to rank %d for %.1f s (%s%s): its host is down or "
            "cut off from this one, or the process is stopped%s",
            name, t->rank, heartbeat_silence(t->hb, lost, now), timeout, stall, others);
  watcher_store_leave(t);
  break_late_store_request(t);
}

/* Said once per communicator, a timeout after wiring: peers whose beats
 * never came (UDP filtered between the hosts?) are not watched. */
static void warn_never_beat(tcp_transport *t) {
  int first = heartbeat_never_beat(t->hb, -1);
  if (first < 0) return;
  int n = 0;
  for (int p = first; p >= 0; p = heartbeat_never_beat(t->hb, p)) n++;
  char more[48] = "";
  if (n > 1) snprintf(more, sizeof more, " and %d more rank%s", n - 1, n > 2 ? "s" : "");
  TD_WARN("tcp: rank %d never received a heartbeat from rank %d (%s)%s in %g s: is UDP to the TCP ports blocked "
          "between the hosts? A lost host among them is found only by TCP keepalive (about 60 s) or TANDEM_TIMEOUT",
          t->rank, first, t->peers[first].addr, more, t->hb_timeout_s);
}

/* One heartbeat tick: send beats (saying whether this communicator has
 * failed), drain those that arrived, and, once wiring is done and while
 * the communicator is healthy, act on what they say. */
static void watcher_tick(tcp_transport *t, double *last_tick, bool *armed_seen) {
  td_comm *comm = t->base.comm;
  bool failed = comm_status(comm) != TD_OK || atomic_load(&t->aborted);
  heartbeat_send(t->hb, failed);
  double now = td_now();
  /* How much later than due this tick runs: this thread was not running
   * (the whole process stopped, or starved with its peers); those seconds
   * do not count in the peers' silences (heartbeat_note_stall). Before the
   * drain, so that a beat drained now counts as heard after the stall. */
  heartbeat_note_stall(t->hb, now - *last_tick - t->hb_interval_s);
  *last_tick = now;
  heartbeat_drain(t->hb, now);
  for (int p = 0; p < t->size; p++) {
    uint64_t rx = atomic_load_explicit(&t->peers[p].rx_bytes, memory_order_relaxed);
    if (rx != t->peers[p].rx_seen) heartbeat_heard(t->hb, p, now);
    t->peers[p].rx_seen = rx;
  }
  if (failed) break_late_store_request(t);
  if (failed || !atomic_load(&t->armed)) return;
  if (!*armed_seen) {
    t->armed_at = now;
    *armed_seen = true;
    heartbeat_reset(t->hb, now);
    return;
  }
  if (!t->warned_never_beat && now - t->armed_at > t->hb_timeout_s) {
    t->warned_never_beat = true;
    warn_never_beat(t);
  }
  /* A peer says it failed: its reason is in the store (unless it could not
   * reach the store); relay it now rather than at this rank's next call. */
  if (heartbeat_failed_peer(t->hb) >= 0 && watcher_store_enter(t)) {
    td_store *store = watcher_store(t);
    if (store) (void)relay_published_via(t, store, 0);
    watcher_store_leave(t);
    if (comm_status(comm) != TD_OK) return;
  }
  int lost = heartbeat_lost(t->hb, -1, now, t->hb_timeout_s);
  if (lost >= 0) declare_lost(t, lost, now);
}

/* The watcher thread. Sleeps until a peer hangs up (EPOLLRDHUP; EPOLLHUP
 * and EPOLLERR are always reported) and counts it; arriving data is not in
 * the event mask, so it never wakes this thread: the data path pays nothing
 * for the watch. Each peer is registered one-shot, so it leaves the set once
 * reported. With heartbeats on, it also wakes once per interval for
 * watcher_tick (beats are drained then, not as they arrive, so the wake-ups
 * do not grow with the world size). */
static void *watcher_main(void *arg) {
  tcp_transport *t = arg;
  pthread_setname_np(pthread_self(), "td-tcp-watch");
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, NULL); /* signals belong to the application's threads */
  double last_tick = td_now(), next_tick = last_tick;
  bool armed_seen = false;
  for (;;) {
    int timeout_ms = -1;
    if (t->hb) {
      double left = next_tick - td_now();
      timeout_ms = left > 0 ? (int)(left * 1000.0 + 0.999) : 0;
    }
    struct epoll_event events[16];
    int n = epoll_wait(t->hup_fd, events, (int)TD_ARRAY_SIZE(events), timeout_ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      TD_WARN("tcp: rank %d stops watching its peers (epoll_wait: %s); a failure is then seen at the next exchange "
              "with the failed rank, and a lost host only through TANDEM_TIMEOUT",
              t->rank, strerror(errno));
      return NULL;
    }
    unsigned hung_up = 0;
    for (int k = 0; k < n; k++) {
      uint32_t tag = events[k].data.u32;
      if (tag == TCP_WATCH_STOP) return NULL;
      if (!atomic_load_explicit(&t->aborted, memory_order_relaxed)) /* else it is our own shutdown */
        TD_DEBUG("tcp: rank %d (%s) hung up on rank %d", (int)tag, t->peers[tag].addr, t->rank);
      /* A peer that closed its connection is found through that path
       * (EOF, its published reason); its beats stop for the same cause. */
      if (t->hb) heartbeat_forget(t->hb, (int)tag);
      hung_up++;
    }
    if (hung_up) atomic_fetch_add_explicit(&t->hangups, hung_up, memory_order_release);
    if (t->hb && td_now() >= next_tick) {
      watcher_tick(t, &last_tick, &armed_seen);
      next_tick = td_now() + t->hb_interval_s;
    }
  }
}

/* After each operation (see the file header). The normal path is one atomic
 * load; only after the watcher counted a new hang-up does this rank read the
 * store, so a peer that exited cleanly costs one look-up in the
 * communicator's life, not one per operation. A hang-up the watcher has not
 * counted yet (it arrived while this operation finished) is acted on after
 * the next operation, or fails it. Called on the executing thread. */
static td_status tcp_op_done(transport *base) {
  tcp_transport *t = (tcp_transport *)base;
  if (atomic_load_explicit(&t->aborted, memory_order_relaxed)) return failed_status(t);
  unsigned seen = atomic_load_explicit(&t->hangups, memory_order_acquire);
  if (seen == t->hangups_checked) return TD_OK;
  t->hangups_checked = seen;
  return relay_published(t, 0);
}

static void tcp_destroy(transport *base) {
  tcp_transport *t = (tcp_transport *)base;
  if (!t) return;
  /* The watcher first: nothing below may run while it still looks at t.
   * If it is blocked in the store (publishing a failure to a store the
   * lost link cut off), break that call off: the communicator is being
   * destroyed, and its store connection with it. */
  atomic_store(&t->stopping, 1);
  if (atomic_load(&t->watcher_in_store)) store_interrupt(atomic_load(&t->watch_store));
  if (t->watcher_started) {
    uint64_t one = 1;
    ssize_t w;
    TD_SYSCALL_RETRY(w, write(t->stop_fd, &one, sizeof one));
    (void)w;
    pthread_join(t->watcher, NULL);
  }
  if (t->hup_fd >= 0) close(t->hup_fd);
  if (t->stop_fd >= 0) close(t->stop_fd);
  if (t->wake_fd >= 0) close(t->wake_fd);
  heartbeat_close(t->hb);
  free(atomic_load(&t->silent));
  store_close(atomic_load(&t->watch_store));
  if (t->peers)
    for (int p = 0; p < t->size; p++) {
      if (t->peers[p].fd >= 0) close(t->peers[p].fd);
      tcp_stream_free(t->peers[p].stream);
      free(t->peers[p].stream);
    }
  free(t->peers);
  free(t->pfds);
  free(t->pfd_peer);
  free(t);
}

static int tcp_silent_peers(transport *base, int *ranks, int max) {
  const int *silent = atomic_load(&((tcp_transport *)base)->silent);
  int n = 0;
  for (; silent && silent[n] >= 0; n++)
    if (n < max) ranks[n] = silent[n];
  return n;
}

static int tcp_heartbeat_stats(transport *base, td_heartbeat_stats *rows, int max) {
  tcp_transport *t = (tcp_transport *)base;
  return t->hb ? heartbeat_stats(t->hb, rows, max) : 0;
}

static void tcp_wake(transport *base) {
  tcp_transport *t = (tcp_transport *)base;
  uint64_t one = 1;
  ssize_t w;
  TD_SYSCALL_RETRY(w, write(t->wake_fd, &one, sizeof one));
  (void)w; /* EAGAIN only at a counter near 2^64: it is readable then anyway */
}

static const transport_vtbl tcp_vtbl = {
    .name = "tcp",
    .try_send = tcp_try_send,
    .try_recv = tcp_try_recv,
    .try_send2 = tcp_try_send2,
    .wait = tcp_wait,
    .abort = tcp_abort,
    .destroy = tcp_destroy,
    .op_done = tcp_op_done,
    .try_peek = tcp_try_peek,
    .silent_peers = tcp_silent_peers,
    .heartbeat_stats = tcp_heartbeat_stats,
    .wake = tcp_wake,
};

/* A host that crashes or drops off the network sends no FIN. Heartbeats
 * find it within seconds; keepalive is the fallback when they are off
 * (TANDEM_HEARTBEAT_TIMEOUT=0): probes go out only on idle connections, so
 * busy ones pay nothing, and a dead host is found after about idle + count *
 * interval = 60 s. Best effort. */
static void set_keepalive(int fd) {
  int on = 1, idle_s = 30, interval_s = 10, count = 3;
  (void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
  (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof idle_s);
  (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof interval_s);
  (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
}

/* Names of the ranks above this one that have not connected, for the error. */
static void describe_missing(const tcp_transport *t, char *buf, size_t size) {
  size_t used = 0;
  int listed = 0;
  buf[0] = '\0';
  for (int p = t->rank + 1; p < t->size && used + 1 < size; p++) {
    if (t->peers[p].fd >= 0) continue;
    if (listed == 8) {
      snprintf(buf + used, size - used, ", ...");
      break;
    }
    int n = snprintf(buf + used, size - used, "%srank %d (%s)", listed ? ", " : "", p, t->peers[p].addr);
    if (n < 0) break;
    used += (size_t)n;
    listed++;
  }
}

/* Handshakes the accept loop runs at once: strangers beyond this many wait
 * in the listen backlog while the first ones time out. */
#define TCP_MAX_PENDING_AUTH 64

/* Right after peer p's handshake: its stream keys, from the session. The
 * cipher is AES-256-GCM when both CPUs run it, else ChaCha20-Poly1305. */
static td_status setup_stream(tcp_transport *t, int p, const char *ctx, const net_auth_session *session,
                              bool connector) {
  net_protect_mode mode = (net_protect_mode)t->base.comm->tun.tcp_protect;
  if (mode == NET_PROTECT_OFF) return TD_OK;
  tcp_stream *s = calloc(1, sizeof *s);
  if (!s) return td_error(TD_ERR_SYSTEM, "tcp: out of memory for a protected stream");
  bool aes = t->peers[t->rank].aes && t->peers[p].aes;
  td_status st = tcp_stream_init(s, mode, aes, ctx, session, connector);
  if (st != TD_OK) {
    free(s);
    return st;
  }
  t->peers[p].stream = s;
  return TD_OK;
}

/* During construction the caller may learn that a peer will never come
 * (td_comm_config.abandon: the elastic launcher reported it gone, e.g.
 * evicted while it still ran, after the peers' addresses were exchanged):
 * the waits for peers ask every TCP_ABANDON_SLICE_S instead of holding out
 * for TANDEM_CONNECT_TIMEOUT (the s26 200-fault run waited 60 s here for an
 * evicted process). */
#define TCP_ABANDON_SLICE_S 0.25
static bool tcp_abandoned(td_comm *comm, double *next_ask, char *why, size_t why_size) {
  if (!comm->abandon_fn) return false;
  double now = td_now();
  if (now < *next_ask) return false;
  *next_ask = now + TCP_ABANDON_SLICE_S;
  return comm->abandon_fn(comm->abandon_ctx, why, why_size);
}

typedef struct pending_conn {
  int fd;
  double deadline;
  net_auth_acceptor auth;
} pending_conn;

/* Accept from every higher rank, authenticating each (net.h). Handshakes
 * run side by side from one poll loop, so a stranger that stays silent
 * (dropped after TANDEM_AUTH_TIMEOUT) or answers wrongly (dropped at once,
 * with a warning) holds up no rank. Only an authenticated connection from a
 * higher rank not yet connected joins the transport. */
static td_status accept_peers(tcp_transport *t, int listen_fd, double deadline, double timeout_s) {
  td_comm *comm = t->base.comm;
  int expected = t->size - 1 - t->rank;
  char ctx[300];
  auth_context(comm, t->rank, ctx, sizeof ctx);
  pending_conn pend[TCP_MAX_PENDING_AUTH];
  struct pollfd pfds[TCP_MAX_PENDING_AUTH + 1];
  int n_pend = 0;
  td_status st = TD_OK;
  if (expected > 0 && net_set_nonblocking(listen_fd, true) != 0)
    return td_error_errno("tcp: rank %d cannot make its listening socket non-blocking", t->rank);
  double next_ask = td_now() + TCP_ABANDON_SLICE_S;
  while (expected > 0) {
    double now = td_now();
    char gone[400] = "";
    if (tcp_abandoned(comm, &next_ask, gone, sizeof gone)) {
      char missing[512];
      describe_missing(t, missing, sizeof missing);
      st = td_error(TD_ERR_REMOTE, "tcp: rank %d gave up waiting for %s to connect to it (communicator %s): %s",
                    t->rank, missing, comm->prefix, gone);
      break;
    }
    if (now >= deadline) {
      char missing[512];
      describe_missing(t, missing, sizeof missing);
      st = td_error(TD_ERR_TIMEOUT,
                    "tcp: %s did not connect to rank %d (%s) within %g s (TANDEM_CONNECT_TIMEOUT): the process "
                    "may have failed to start or crashed, or cannot reach this address (set TANDEM_HOST_ADDR or "
                    "TANDEM_IFACE to one it can reach)",
                    missing, t->rank, t->peers[t->rank].addr, timeout_s);
      break;
    }
    double wake = deadline;
    int n_pfds = 0;
    if (n_pend < TCP_MAX_PENDING_AUTH) pfds[n_pfds++] = (struct pollfd){.fd = listen_fd, .events = POLLIN};
    int first_pend = n_pfds;
    for (int i = 0; i < n_pend; i++) {
      pfds[n_pfds++] = (struct pollfd){.fd = pend[i].fd, .events = POLLIN};
      wake = TD_MIN(wake, pend[i].deadline);
    }
    int ms = (int)TD_MIN(TD_MAX((wake - now) * 1000.0 + 1, 0), comm->abandon_fn ? TCP_ABANDON_SLICE_S * 1000.0 : 1000.0);
    int ready = poll(pfds, (nfds_t)n_pfds, ms);
    if (ready < 0 && errno != EINTR) {
      st = td_error_errno("tcp: rank %d: poll on its listening socket failed", t->rank);
      break;
    }
    /* Existing handshakes first (their slots shift as they finish). */
    for (int k = n_pfds - 1; ready > 0 && k >= first_pend; k--) {
      if (!pfds[k].revents) continue;
      pending_conn *pc = &pend[k - first_pend];
      unsigned char in[NET_AUTH_HELLO_BYTES], out[NET_AUTH_MSG_BYTES];
      ssize_t n;
      TD_SYSCALL_RETRY(n, recv(pc->fd, in, net_auth_acceptor_want(&pc->auth), MSG_DONTWAIT));
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      int r = n > 0 ? net_auth_acceptor_feed(&pc->auth, NET_AUTH_ROLE_TCP, ctx, in, (size_t)n, out) : NET_AUTH_FAIL;
      if (r == NET_AUTH_MORE) continue;
      const char *why = NULL;
      if (r == NET_AUTH_FAIL)
        why = n <= 0 ? "it hung up during authentication"
              : pc->auth.stage == 0 ? "it sent no authentication hello"
                                    : "its proof does not match this job's secret";
      else if (net_send_all(pc->fd, out, NET_AUTH_MSG_BYTES, td_now() + net_auth_timeout_s()) != TD_OK)
        why = "it stopped reading during authentication";
      else if (r == NET_AUTH_REPLY)
        continue;
      else if (pc->auth.hello.rank <= t->rank || pc->auth.hello.rank >= t->size ||
               t->peers[pc->auth.hello.rank].fd >= 0)
        why = "authenticated, but its rank is not one this rank expects";
      if (why) {
        TD_WARN("tcp: rank %d (%s, communicator %s) closed a connection that is not from a new peer of this "
                "communicator: %s",
                t->rank, t->peers[t->rank].addr, comm->prefix, why);
        close(pc->fd);
      } else {
        int from = pc->auth.hello.rank;
        net_auth_session session = {.hello = pc->auth.hello};
        memcpy(session.nonce_s, pc->auth.nonce_s, sizeof session.nonce_s);
        t->peers[from].fd = pc->fd;
        expected--;
        st = setup_stream(t, from, ctx, &session, false);
      }
      *pc = pend[--n_pend];
      if (st != TD_OK) break;
    }
    if (st != TD_OK) break;
    /* Silent ones past their time. */
    now = td_now();
    for (int i = n_pend - 1; i >= 0; i--) {
      if (pend[i].deadline > now) continue;
      TD_WARN("tcp: rank %d (%s, communicator %s) closed a connection that did not authenticate within %g s "
              "(TANDEM_AUTH_TIMEOUT)",
              t->rank, t->peers[t->rank].addr, comm->prefix, net_auth_timeout_s());
      close(pend[i].fd);
      pend[i] = pend[--n_pend];
    }
    /* New connections. */
    while (first_pend == 1 && pfds[0].revents && n_pend < TCP_MAX_PENDING_AUTH) {
      int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
          TD_WARN("tcp: rank %d: accept failed: %s", t->rank, strerror(errno));
        break;
      }
      pend[n_pend++] = (pending_conn){.fd = fd, .deadline = td_now() + net_auth_timeout_s()};
    }
  }
  for (int i = 0; i < n_pend; i++) close(pend[i].fd);
  return st;
}

/* TANDEM_HEARTBEAT_INTERVAL and TANDEM_HEARTBEAT_TIMEOUT (each checked by
 * core/tunables.c), with their defaults and the rule that ties them. A timeout
 * of 0 turns heartbeats off (a lost host is then found through keepalive
 * after about a minute, or TANDEM_TIMEOUT). */
static td_status read_heartbeat_config(tcp_transport *t) {
  const comm_tunables *tun = &t->base.comm->tun;
  t->hb_interval_s = tun->heartbeat_interval_s < 0 ? TCP_DEFAULT_HEARTBEAT_INTERVAL_S : tun->heartbeat_interval_s;
  t->hb_timeout_s = tun->heartbeat_timeout_s < 0 ? TCP_DEFAULT_HEARTBEAT_TIMEOUT_S : tun->heartbeat_timeout_s;
  if (t->hb_timeout_s > 0 && !(t->hb_interval_s >= 0.01 && t->hb_interval_s * 2 <= t->hb_timeout_s))
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "TANDEM_HEARTBEAT_INTERVAL=%g with TANDEM_HEARTBEAT_TIMEOUT=%g: the interval must be at least "
                    "0.01 s and at most half the timeout, so that one lost beat is not a lost peer",
                    t->hb_interval_s, t->hb_timeout_s);
  /* TANDEM_HEARTBEAT_MIN_TIMEOUT: each peer's timeout adapts to how
   * regularly its beats come (heartbeat.h), between this floor and the
   * timeout, so that a quiet link decides fast and a loaded one is given
   * the time its own jitter asks for. The floor keeps one lost beat from
   * being a lost peer, as the fixed timeout's rule does. */
  t->hb_floor_s = t->hb_timeout_s;
  if (t->hb_timeout_s > 0 && tun->heartbeat_min_timeout_s >= 0) {
    if (!(tun->heartbeat_min_timeout_s >= 2 * t->hb_interval_s && tun->heartbeat_min_timeout_s <= t->hb_timeout_s))
      return td_error(TD_ERR_INVALID_ARGUMENT,
                      "TANDEM_HEARTBEAT_MIN_TIMEOUT=%g with TANDEM_HEARTBEAT_INTERVAL=%g and "
                      "TANDEM_HEARTBEAT_TIMEOUT=%g: the floor of the adaptive timeouts must be at least twice the "
                      "interval and at most the timeout",
                      tun->heartbeat_min_timeout_s, t->hb_interval_s, t->hb_timeout_s);
    t->hb_floor_s = tun->heartbeat_min_timeout_s;
  }
  return TD_OK;
}

/* Listen for peers on host (NULL: every interface), and open the heartbeat
 * socket on the same address and port number (UDP), so that the published
 * TCP address is also where beats go. Listens again in the rare case that
 * the port is taken for UDP. */
static td_status listen_beside_heartbeat(tcp_transport *t, const char *host, uint64_t hash, int *listen_fd,
                                         int *port) {
  for (int attempt = 1;; attempt++) {
    TD_CHECK(net_listen(host, 0, t->size + 16, listen_fd, port));
    if (t->hb_timeout_s <= 0) return TD_OK;
    bool port_taken = false;
    td_status st = heartbeat_open(*listen_fd, t->rank, t->size, hash, &t->hb, &port_taken);
    if (st == TD_OK) {
      if (t->hb_floor_s < t->hb_timeout_s) heartbeat_set_adaptive(t->hb, t->hb_interval_s, t->hb_floor_s);
      return TD_OK;
    }
    close(*listen_fd);
    *listen_fd = -1;
    if (!port_taken || attempt == TCP_LISTEN_TRIES) return st;
  }
}

/* Start the watcher once every peer's address is known, before the
 * connections are made: beats flow while a rank still waits in the wiring
 * for a slow peer, so it is not taken for lost. Its silences count only
 * after arm_watcher. */
static td_status start_watcher(tcp_transport *t) {
  if (t->hb)
    for (int p = 0; p < t->size; p++)
      if (p != t->rank) TD_CHECK(heartbeat_set_peer(t->hb, p, t->peers[p].addr));
  t->hup_fd = epoll_create1(EPOLL_CLOEXEC);
  t->stop_fd = eventfd(0, EFD_CLOEXEC);
  struct epoll_event stop_ev = {.events = EPOLLIN, .data.u32 = TCP_WATCH_STOP};
  if (t->hup_fd < 0 || t->stop_fd < 0 || epoll_ctl(t->hup_fd, EPOLL_CTL_ADD, t->stop_fd, &stop_ev) != 0)
    return td_error_errno("tcp: rank %d cannot create the epoll set that watches its peers", t->rank);
  int rc = pthread_create(&t->watcher, NULL, watcher_main, t);
  if (rc) {
    errno = rc;
    return td_error_errno("tcp: rank %d cannot start the thread that watches its peers", t->rank);
  }
  t->watcher_started = true;
  return TD_OK;
}

/* Wiring done: watch every connection for hang-ups (one-shot: a peer is
 * reported once) and let heartbeat silences count. */
static td_status arm_watcher(tcp_transport *t) {
  for (int p = 0; p < t->size; p++) {
    if (t->peers[p].fd < 0) continue;
    struct epoll_event ev = {.events = EPOLLRDHUP | EPOLLONESHOT, .data.u32 = (uint32_t)p};
    if (epoll_ctl(t->hup_fd, EPOLL_CTL_ADD, t->peers[p].fd, &ev) != 0)
      return td_error_errno("tcp: rank %d cannot watch its socket to rank %d (%s) for hang-ups", t->rank, p,
                            t->peers[p].addr);
  }
  atomic_store(&t->armed, 1);
  return TD_OK;
}

td_status tcp_transport_create(td_comm *comm, transport **out) {
  *out = NULL;
  if (!comm->store || comm->size < 2)
    return td_error(TD_ERR_INTERNAL, "tcp transport needs a store and at least 2 ranks (have %d)", comm->size);
  td_status st = TD_OK;
  int listen_fd = -1;
  tcp_transport *t = calloc(1, sizeof *t);
  if (!t) return td_error(TD_ERR_SYSTEM, "tcp: out of memory");
  t->base.vtbl = &tcp_vtbl;
  t->base.comm = comm;
  t->rank = comm->rank;
  t->size = comm->size;
  t->hup_fd = t->stop_fd = -1;
  t->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (t->wake_fd < 0) {
    st = td_error_errno("rank %d: tcp: cannot create the eventfd that wakes its waits", t->rank);
    goto fail;
  }
  t->peers = calloc((size_t)t->size, sizeof *t->peers);
  t->pfds = calloc((size_t)t->size, sizeof *t->pfds);
  t->pfd_peer = calloc((size_t)t->size, sizeof *t->pfd_peer);
  if (!t->peers || !t->pfds || !t->pfd_peer) {
    st = td_error(TD_ERR_SYSTEM, "tcp: out of memory for %d peers", t->size);
    goto fail;
  }
  for (int p = 0; p < t->size; p++) t->peers[p].fd = -1;

  /* The rendezvous already saw every rank alive, so wiring is quick unless a
   * rank died since or cannot reach this address. The core reads the same
   * variable with the same default for the rendezvous. */
  double timeout_s = comm->tun.connect_timeout_s;
  double deadline = td_now() + timeout_s;
  /* Tells this communicator's heartbeats from any other's that reach the port. */
  uint64_t hash = prefix_hash(comm->prefix);
  TD_CHECK_GOTO(read_heartbeat_config(t), st, fail);

  /* Listen (see the file header for the address) and publish. */
  int port = 0;
  char host[64] = "127.0.0.1";
  if (comm->local_size != comm->size) {
    if (comm->tun.host_addr[0] || comm->tun.iface[0]) {
      TD_CHECK_GOTO(net_local_address(comm->tun.host_addr, comm->tun.iface, host, sizeof host), st, fail);
    } else {
      TD_CHECK_GOTO(store_route_address(comm->store, host, sizeof host), st, fail);
      /* Rank 0 reaches a store it hosts over loopback; other hosts cannot. */
      if (net_is_loopback_host(host)) TD_CHECK_GOTO(net_local_address(NULL, NULL, host, sizeof host), st, fail);
    }
  }
  TD_CHECK_GOTO(listen_beside_heartbeat(t, host, hash, &listen_fd, &port), st, fail);
  snprintf(t->peers[t->rank].addr, sizeof t->peers[t->rank].addr, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host,
           port);
  t->peers[t->rank].aes = net_protect_aes_available();
  /* Publish ours and learn every peer's address: one SET and one GATHER.
   * The value is "<address> <1 if this CPU runs AES-256-GCM, else 0>". */
  char prefix[256], mine[sizeof t->peers[0].addr + 4];
  snprintf(prefix, sizeof prefix, "%s/tcp/", comm->prefix);
  snprintf(mine, sizeof mine, "%s %d", t->peers[t->rank].addr, t->peers[t->rank].aes ? 1 : 0);
  char **addrs = NULL;
  int missing = -1;
  st = comm_store_allgather(comm, prefix, mine, strlen(mine), TD_MAX(deadline - td_now(), 0.001), &addrs, &missing);
  if (st != TD_OK) {
    char why[512];
    td_error_copy(why, sizeof why);
    if (st == TD_ERR_TIMEOUT && missing >= 0)
      st = td_error(st, "tcp: rank %d (and maybe others) never published its address (store key %s%d) within %g s "
                        "(TANDEM_CONNECT_TIMEOUT): %s",
                    missing, prefix, missing, timeout_s, why);
    else
      st = td_error(st, "tcp: rank %d could not exchange addresses through the store: %s", t->rank, why);
    goto fail;
  }
  for (int p = 0; p < t->size && st == TD_OK; p++) {
    if (p == t->rank) continue;
    char *flag = strrchr(addrs[p], ' ');
    if (!flag || (strcmp(flag, " 0") && strcmp(flag, " 1"))) {
      st = td_error(TD_ERR_MISMATCH, "tcp: rank %d published \"%.100s\" as its address: not \"<address> <0|1>\" "
                                     "(a Tandem of another version?)",
                    p, addrs[p]);
      break;
    }
    *flag = '\0';
    t->peers[p].aes = flag[1] == '1';
    td_strlcpy(t->peers[p].addr, addrs[p], sizeof t->peers[p].addr);
  }
  free(addrs);
  if (st != TD_OK) goto fail;
  TD_CHECK_GOTO(start_watcher(t), st, fail);

  /* Connect down, then accept from above. */
  transport_test_gate();
  for (int p = 0; p < t->rank; p++) {
    char peer_host[64];
    int peer_port = 0;
    TD_CHECK_GOTO(net_parse_addr(t->peers[p].addr, peer_host, sizeof peer_host, &peer_port), st, fail);
    /* In slices when the wait can be abandoned (a peer that is gone
     * refuses or never answers until the deadline). */
    double next_ask = td_now() + TCP_ABANDON_SLICE_S;
    char gone[400] = "";
    for (;;) {
      double left = TD_MAX(deadline - td_now(), 0.001);
      st = net_connect(peer_host, peer_port, comm->abandon_fn ? TD_MIN(left, 1.0) : left, &t->peers[p].fd);
      if (st == TD_OK || (st != TD_ERR_REMOTE && st != TD_ERR_TIMEOUT) || !comm->abandon_fn || td_now() >= deadline)
        break;
      if (tcp_abandoned(comm, &next_ask, gone, sizeof gone)) {
        st = td_error(TD_ERR_REMOTE, "tcp: rank %d gave up connecting to rank %d at %s (communicator %s): %s",
                      t->rank, p, t->peers[p].addr, comm->prefix, gone);
        goto fail;
      }
    }
    if (st != TD_OK) {
      st = td_error(st, "tcp: rank %d cannot connect to rank %d at %s: %s", t->rank, p, t->peers[p].addr,
                    td_last_error());
      goto fail;
    }
    char ctx[300], who[200];
    auth_context(comm, p, ctx, sizeof ctx);
    snprintf(who, sizeof who, "rank %d (%s)", p, t->peers[p].addr);
    net_auth_session session;
    st = net_auth_connect_session(t->peers[p].fd, NET_AUTH_ROLE_TCP, t->rank, ctx, who, deadline, &session);
    if (st != TD_OK) {
      st = td_error(st, "tcp: rank %d cannot authenticate with rank %d at %s: %s", t->rank, p, t->peers[p].addr,
                    td_last_error());
      goto fail;
    }
    TD_CHECK_GOTO(setup_stream(t, p, ctx, &session, true), st, fail);
  }
  TD_CHECK_GOTO(accept_peers(t, listen_fd, deadline, timeout_s), st, fail);
  close(listen_fd);
  listen_fd = -1;

  {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    double spin_us = comm_tun_spin_us(comm->tun.tcp_spin_us, TCP_DEFAULT_SPIN_US);
    t->spin_ns = (spin_us > 0 && cpus >= comm->local_size) ? (uint64_t)(spin_us * 1e3) : 0;
  }
  size_t buffer_bytes = comm_tun_bytes(comm->tun.tcp_buffer_bytes, TCP_DEFAULT_BUFFER_BYTES);
  if (buffer_bytes > 0 && buffer_bytes < TCP_MIN_BUFFER_BYTES) {
    /* Said once per process, not once per communicator and rank. */
    static _Atomic int warned;
    if (!atomic_exchange(&warned, 1))
      TD_WARN("tcp: TANDEM_TCP_BUFFER_BYTES=%zu is below the floor of %zu bytes; using %zu (smaller socket "
              "buffers stall loopback transfers; 0 keeps the kernel's autotuning)",
              buffer_bytes, TCP_MIN_BUFFER_BYTES, TCP_MIN_BUFFER_BYTES);
    buffer_bytes = TCP_MIN_BUFFER_BYTES;
  }
  for (int p = 0; p < t->size; p++) {
    int fd = t->peers[p].fd;
    if (fd < 0) continue;
    if (net_set_nonblocking(fd, true) != 0 || net_set_nodelay(fd) != 0) {
      st = td_error_errno("tcp: rank %d cannot configure its socket to rank %d (%s)", t->rank, p, t->peers[p].addr);
      goto fail;
    }
    set_keepalive(fd);
    net_set_loss_recovery(fd); /* the accepted ones did not pass net_accept */
    if (buffer_bytes > 0) net_set_bufsizes(fd, (int)TD_MIN(buffer_bytes, (size_t)1 << 30));
  }

  TD_CHECK_GOTO(arm_watcher(t), st, fail);
  TD_DEBUG("tcp: rank %d connected to %d peers, listening address %s", t->rank, t->size - 1,
           t->peers[t->rank].addr);
  *out = &t->base;
  return TD_OK;

fail:
  if (listen_fd >= 0) close(listen_fd);
  tcp_destroy(&t->base);
  return st;
}
