/* src/net: sockets, shared-memory segments, host identity and the rendezvous
 * store (a TCP key-value store like PyTorch's TCPStore). Calls only src/base.
 *
 * Every blocking call takes a timeout and fails with a message that names the
 * address and the reason; nothing here prints or exits. */
#ifndef TD_NET_H
#define TD_NET_H

#include "base/base.h"

#include <sys/types.h>

/* ---- authentication (auth.c) ----
 * A job is its processes: every store and TCP transport connection proves,
 * both ways and before anything else crosses it, that both ends hold the
 * job's secret. The secret (>= 32 bytes) comes from TANDEM_SECRET or from
 * the file TANDEM_SECRET_FILE (owned by this user, no group/other access:
 * anything looser is refused); tandemrun makes a fresh 256-bit one per job.
 * Without either, the job still runs with an empty secret, but every
 * listener refuses a non-loopback address (net_listen), so only processes
 * of this host can connect.
 *
 * Handshake (connector C, acceptor A; fixed-size messages, integers LE):
 *   C -> A  HELLO     magic "TDA1" | role u32 | rank i32 | nonce_c[32]   (44 bytes)
 *   A -> C  CHALLENGE magic | nonce_s[32]                              (36 bytes)
 *   C -> A  PROOF     magic | HMAC(key, "connector" | ctx | role | rank | nonce_c | nonce_s)
 *   A -> C  ACCEPT    magic | HMAC(key, "acceptor"  | ctx | role | rank | nonce_c | nonce_s)
 * key = BLAKE2b-256 of the secret; HMAC is HMAC-SHA-256 (libsodium); ctx
 * names the listener ("store", or "tcp <communicator> <acceptor rank>"), so
 * a proof made for one connection, direction or listener is worthless for
 * any other; fresh nonces on both sides defeat replay, and the direction
 * label defeats reflection. A acts only after C's PROOF verifies (in
 * constant time); a peer that fails closes the connection and learns
 * nothing. Both sides bound the whole exchange by a deadline. */

#define NET_AUTH_MAGIC 0x31414454u /* "TDA1" */
#define NET_AUTH_NONCE_BYTES 32
#define NET_AUTH_MAC_BYTES 32
#define NET_AUTH_HELLO_BYTES 44
#define NET_AUTH_MSG_BYTES 36 /* CHALLENGE, PROOF and ACCEPT */
#define NET_AUTH_ROLE_STORE 1u
#define NET_AUTH_ROLE_TCP 2u
/* MAC of a datagram (heartbeats), keyed like the handshake and separated
 * from it and from other datagram kinds by `label`: HMAC-SHA-256(key,
 * label | msg). The check is constant-time. Replay is the caller's to
 * refuse (a sequence number inside msg). */
void net_auth_datagram_mac(const char *label, const void *msg, size_t len, unsigned char mac[32]);
bool net_auth_datagram_check(const char *label, const void *msg, size_t len, const unsigned char mac[32]);

/* Default bound on a whole handshake (TANDEM_AUTH_TIMEOUT overrides): a
 * silent connector holds a store slot or a transport's accept loop no
 * longer than this. A connector that answers wrongly is dropped at once. */
#define NET_AUTH_DEFAULT_TIMEOUT_S 5.0

typedef struct net_auth_hello {
  uint32_t role;
  int32_t rank; /* the connecting rank (TCP), -1 for a store client */
  unsigned char nonce[NET_AUTH_NONCE_BYTES];
} net_auth_hello;

/* Load the job's key once per process (thread-safe; later calls return the
 * first outcome): from TANDEM_SECRET, else TANDEM_SECRET_FILE, else the
 * per-user $HOME/.tandem/secret (created 0600 on first use), else no secret
 * (no usable HOME: a fixed key, loopback listeners only). Fails with
 * TD_ERR_INVALID_ARGUMENT naming the variable or file (never the secret) if
 * the secret is too short or its file unreadable or readable by others. */
td_status net_auth_init(void);
/* Does this process hold a job secret (after a successful net_auth_init)? */
bool net_auth_have_secret(void);
/* The handshake bound in seconds (TANDEM_AUTH_TIMEOUT, default 5). */
double net_auth_timeout_s(void);

/* Pure parsers and encoders (no socket: the fuzz harnesses call these).
 * parse functions return 0, or -1 on a wrong length or magic. */
int net_auth_parse_hello(const unsigned char *buf, size_t len, net_auth_hello *out);
void net_auth_encode_hello(unsigned char out[NET_AUTH_HELLO_BYTES], const net_auth_hello *hello);
int net_auth_parse_msg(const unsigned char *buf, size_t len, unsigned char payload[32]);
void net_auth_encode_msg(unsigned char out[NET_AUTH_MSG_BYTES], const unsigned char payload[32]);
/* A fresh random nonce. */
void net_auth_nonce(unsigned char nonce[NET_AUTH_NONCE_BYTES]);
/* The MAC one side sends (acceptor = false: the connector's PROOF). */
void net_auth_mac(bool acceptor, const char *ctx, const net_auth_hello *hello,
                  const unsigned char nonce_s[NET_AUTH_NONCE_BYTES], unsigned char mac[NET_AUTH_MAC_BYTES]);
/* Constant-time check of a received MAC. */
bool net_auth_check(bool acceptor, const char *ctx, const net_auth_hello *hello,
                    const unsigned char nonce_s[NET_AUTH_NONCE_BYTES], const unsigned char mac[NET_AUTH_MAC_BYTES]);

/* The acceptor side as a state machine over bytes (pure, no socket), for
 * poll loops that run many handshakes at once (the store server, the TCP
 * transport's accept loop) and for fuzzing. Zero-initialise, then feed it
 * at most net_auth_acceptor_want() bytes at a time. */
typedef struct net_auth_acceptor {
  int stage; /* 0: reading the HELLO, 1: reading the PROOF, 2: authenticated */
  size_t got;
  unsigned char in[NET_AUTH_HELLO_BYTES];
  net_auth_hello hello; /* valid from stage 1 */
  unsigned char nonce_s[NET_AUTH_NONCE_BYTES];
} net_auth_acceptor;
enum { NET_AUTH_FAIL = -1, NET_AUTH_MORE = 0, NET_AUTH_REPLY = 1, NET_AUTH_DONE = 2 };
size_t net_auth_acceptor_want(const net_auth_acceptor *a);
/* Returns NET_AUTH_MORE (feed more), NET_AUTH_REPLY (send out, then feed
 * more), NET_AUTH_DONE (send out: the connector is authenticated) or
 * NET_AUTH_FAIL (close: not a hello of `role`, or a wrong proof; a stream
 * that does not start with the magic fails after its first 4 bytes). */
int net_auth_acceptor_feed(net_auth_acceptor *a, uint32_t role, const char *ctx, const unsigned char *data, size_t n,
                           unsigned char out[NET_AUTH_MSG_BYTES]);

/* Blocking handshakes on a connected socket, bounded by deadline (td_now()
 * seconds). peer names the other end for messages ("rank 3 (10.0.0.2:4000)",
 * "the rendezvous store at ..."). The connector fails with TD_ERR_REMOTE if
 * the acceptor closes (its secret differs) or answers wrongly; the acceptor
 * returns the connector's hello in *hello_out. */
td_status net_auth_connect(int fd, uint32_t role, int32_t rank, const char *ctx, const char *peer, double deadline);
td_status net_auth_accept(int fd, uint32_t role, const char *ctx, double deadline, net_auth_hello *hello_out);

/* What both ends of one authenticated connection know, and nobody without
 * the job's secret can use: the two fresh nonces of its handshake. Stream
 * keys are derived from it (net_protect_derive). */
typedef struct net_auth_session {
  net_auth_hello hello;                      /* the connector's hello (its rank, its nonce) */
  unsigned char nonce_s[NET_AUTH_NONCE_BYTES]; /* the acceptor's nonce */
} net_auth_session;
/* The handshakes above, also returning the session. */
td_status net_auth_connect_session(int fd, uint32_t role, int32_t rank, const char *ctx, const char *peer,
                                   double deadline, net_auth_session *session_out);
td_status net_auth_accept_session(int fd, uint32_t role, const char *ctx, double deadline,
                                  net_auth_session *session_out);
/* 32 bytes = keyed BLAKE2b(job key; label, fields, extra, both nonces of
 * the session): a key for one purpose of one connection. */
void net_auth_derive(const char *label, const void *fields, size_t fields_len, const unsigned char *extra,
                     size_t extra_len, const net_auth_session *session, unsigned char out[32]);

/* ---- protected streams (protect.c) ----
 * Records of at most NET_PROTECT_RECORD_MAX payload bytes, each sealed
 * with a per-connection, per-direction key and the direction's record
 * counter as nonce: integrity only (the payload travels as it is) or
 * encrypted (in place). See protect.c for the format and the reasoning. */
typedef enum { NET_PROTECT_OFF = 0, NET_PROTECT_INTEGRITY = 1, NET_PROTECT_ENCRYPT = 2 } net_protect_mode;
#define NET_PROTECT_HDR_BYTES 8
#define NET_PROTECT_TAG_BYTES 16
#define NET_PROTECT_RECORD_MAX ((size_t)1 << 20)

typedef struct net_protect_key {
  net_protect_mode mode;
  bool aes;          /* AES-256-GCM, else ChaCha20-Poly1305 (IETF) */
  uint64_t counter;  /* records of this direction so far: the next nonce */
  unsigned char key[32];
  struct crypto_aead_aes256gcm_state_ *aes_state; /* libsodium's expanded AES key (aligned), when aes */
} net_protect_key;

/* "off", "integrity", "encrypt" (<-> the enum); parse returns -1 on other text. */
const char *net_protect_mode_name(net_protect_mode mode);
int net_protect_parse_mode(const char *text, net_protect_mode *out);
/* Can this CPU run AES-256-GCM (AES-NI and PCLMUL)? */
bool net_protect_aes_available(void);
/* The two directions' keys of the connection whose handshake gave
 * `session` (ctx: the listener's context, as in the handshake); the
 * connector's send key is the acceptor's receive key and vice versa. mode
 * OFF: zeroed keys. Clear both with net_protect_key_clear. */
td_status net_protect_derive(net_protect_mode mode, bool aes, const char *ctx, const net_auth_session *session,
                             bool connector, net_protect_key *send_out, net_protect_key *recv_out);
void net_protect_key_clear(net_protect_key *k); /* accepts NULL */
/* Seal len (<= NET_PROTECT_RECORD_MAX) bytes at data as the next record:
 * writes its header and tag; encrypts data in place in ENCRYPT mode. */
void net_protect_seal(net_protect_key *k, unsigned char hdr[NET_PROTECT_HDR_BYTES], unsigned char *data, size_t len,
                      unsigned char tag[NET_PROTECT_TAG_BYTES]);
/* A record header's payload length; -1 if it is no record header or the
 * length exceeds NET_PROTECT_RECORD_MAX. */
int net_protect_parse_hdr(const unsigned char hdr[NET_PROTECT_HDR_BYTES], size_t *len_out);
/* Check the next record (and decrypt it in place): false if it was
 * altered, replayed, reordered, follows a dropped one, or was sealed under
 * another key; the counter then stays, and the stream is unusable. */
bool net_protect_open(net_protect_key *k, const unsigned char hdr[NET_PROTECT_HDR_BYTES], unsigned char *data,
                      size_t len, const unsigned char tag[NET_PROTECT_TAG_BYTES]);

/* Is host (a name or address; NULL or "" = all interfaces) a loopback-only
 * address? Anything that resolves to 127.0.0.0/8 or ::1 is. */
bool net_is_loopback_host(const char *host);

/* ---- addresses and sockets ---- */

/* Parse "host:port" (host may be a name, an IPv4 address, or "[v6]").
 * Returns TD_ERR_INVALID_ARGUMENT with a message quoting `text` if malformed. */
td_status net_parse_addr(const char *text, char *host, size_t host_size, int *port_out);

/* Listen on host:port (port 0 picks a free port; host NULL or "" = all
 * interfaces). Returns the socket and the port actually bound. Without a job
 * secret (net_auth_init) only a loopback host is allowed: anything else
 * fails with TD_ERR_INVALID_ARGUMENT saying to set TANDEM_SECRET. */
td_status net_listen(const char *host, int port, int backlog, int *fd_out, int *port_out);
/* The same without the secret check (socket.c, below auth.c, which applies it). */
td_status net_listen_socket(const char *host, int port, int backlog, int *fd_out, int *port_out);
/* "host:port" or "[v6]:port" (host NULL or "": "*"), for messages. */
void net_format_addr(char *buf, size_t size, const char *host, int port);

/* Connect to host:port, retrying refused/unreachable attempts with backoff
 * until timeout_s passes; the error names the address and the last reason. */
td_status net_connect(const char *host, int port, double timeout_s, int *fd_out);
/* As net_connect, also copying the last failure's reason alone (e.g.
 * "Connection refused") into reason, for callers that word their own message. */
td_status net_connect_reason(const char *host, int port, double timeout_s, int *fd_out, char *reason,
                             size_t reason_size);

/* Accept one connection before the deadline (monotonic td_now() seconds; a
 * negative deadline waits forever, as in net_send_all/net_recv_all). */
td_status net_accept(int listen_fd, double deadline, int *fd_out);

/* Blocking full transfers on a (blocking or non-blocking) socket, failing at
 * the deadline with TD_ERR_TIMEOUT, on EOF/reset with TD_ERR_REMOTE. */
td_status net_send_all(int fd, const void *buf, size_t len, double deadline);
td_status net_recv_all(int fd, void *buf, size_t len, double deadline);

int net_set_nonblocking(int fd, bool on);
int net_set_nodelay(int fd);
/* How a connection recovers from loss (best effort): the retransmission
 * timeout at most TANDEM_TCP_RTO_MAX seconds (default below; 0: the
 * kernel's defaults, 120 s and no linear timeouts) and linear timeouts
 * while few segments are in flight, so that a connection resumes within
 * about that bound once a lossy link is good again; and the congestion
 * control TANDEM_TCP_CONGESTION (default cubic: reno where cubic is
 * refused; 0: the system's). cubic is the cure where BBR's bandwidth
 * estimate collapsed after seconds of heavy loss and held a collective to
 * kilobytes a second for 50 s. (It was the system's for a while because
 * fuzz_store lost store answers under cubic, tests/fuzz/regress/store/
 * cc-cubic-1: that was the store server's close, fixed in store_server.c.)
 * Every socket of net_connect, net_accept, the store and the TCP transport
 * gets it. */
#define NET_DEFAULT_RTO_MAX_S 1.0
#define NET_DEFAULT_CONGESTION "cubic"
void net_set_loss_recovery(int fd);
/* Set SO_SNDBUF/SO_RCVBUF (best effort). */
void net_set_bufsizes(int fd, int bytes);

/* The address other hosts should use to reach this one: host_addr if set
 * (TANDEM_HOST_ADDR), else the IPv4 address of interface iface if set
 * (TANDEM_IFACE), else the first non-loopback IPv4 address, else 127.0.0.1.
 * NULL or "" is unset. The caller reads the variables (a communicator once,
 * in src/comm/core/tunables.c; tandemrun for itself): this layer never does. */
td_status net_local_address(const char *host_addr, const char *iface, char *buf, size_t size);
/* The address of this end of a connected socket (the interface that routes
 * to its peer), as text. */
td_status net_socket_local_address(int fd, char *buf, size_t size);
/* The IPv4 address of interface name (TANDEM_IFACE); the error names it. */
td_status net_iface_address(const char *name, char *buf, size_t size);

/* A string equal for exactly the processes that can share memory and see each
 * other's pids: hostname + boot id + ipc and pid namespaces. */
td_status net_host_identity(char *buf, size_t size);

/* Is the process alive (not gone, not a zombie)? Only for pids on this host. */
bool net_pid_alive(pid_t pid);

/* ---- shared-memory segments (POSIX shm) ---- */

/* Create a new segment with a unique name "/tandem-<tag>-<random>" (written to
 * name_out), size bytes, zero-filled, mapped read-write. */
td_status net_shm_create(const char *tag, size_t size, char *name_out, size_t name_size, void **addr_out);
/* net_shm_create that reserves (allocates up front, so that a full /dev/shm
 * is an error here) only the first `reserve` bytes when the kernel can
 * reserve the rest later through net_shm_populate (Linux >= 5.14); *lazy
 * tells whether it did. Otherwise, or with reserve >= size, all of it. */
td_status net_shm_create_partial(const char *tag, size_t size, size_t reserve, char *name_out, size_t name_size,
                                 void **addr_out, bool *lazy);
/* Allocate the pages of [addr, addr + bytes) of a mapped segment now
 * (MADV_POPULATE_WRITE): an error instead of a SIGBUS at first touch when
 * /dev/shm is full. */
td_status net_shm_populate(void *addr, size_t bytes);
/* Open and map an existing segment of the given size. Refused (naming it)
 * unless the name is one net_shm_create makes and the segment is this
 * user's, mode 0600, and exactly size bytes. */
td_status net_shm_open(const char *name, size_t size, void **addr_out);
/* Remove the name (the memory lives on while mapped). Ranks unlink right after
 * everyone has mapped, so that a killed job leaves nothing in /dev/shm. */
void net_shm_unlink(const char *name);
void net_shm_unmap(void *addr, size_t size);

/* ---- host-shared memory (memfd regions other processes can map) ----
 * What td_mem_alloc hands out: anonymous memory backed by a memfd that stays
 * open, so that another process of the same user on this host can map the
 * same pages through /proc/<pid>/fd/<fd> (no name in /dev/shm, nothing left
 * behind when a process is killed). Collectives whose buffers all lie in such
 * regions read and write each other's buffers directly (allreduce_shm_direct.c).
 * The region table is process-wide and thread-safe. */
typedef struct net_hostmem_ref {
  uint64_t serial; /* unique per region in its process (never reused) */
  uint64_t offset; /* of the buffer from the region's start */
  uint64_t bytes;  /* the region's size */
  int32_t fd;      /* the region's memfd in its process */
} net_hostmem_ref;

/* bytes (> 0) of zeroed, page-aligned, host-shared memory. */
td_status net_hostmem_alloc(size_t bytes, void **out);
/* Free a region from net_hostmem_alloc (its start address); false if p is
 * not one (nothing is freed then). Peers that mapped it keep their mapping
 * (and the pages) until they unmap it. */
bool net_hostmem_free(void *p);
/* Does [p, p + len) lie inside one host-shared region of this process? */
bool net_hostmem_find(const void *p, size_t len, net_hostmem_ref *ref);
/* Map the region `ref` of process `pid` into this process (read-write). The
 * error says why (another user, /proc hidden, out of memory). */
td_status net_hostmem_map_peer(pid_t pid, const net_hostmem_ref *ref, void **base_out);

/* ---- TCP connection statistics (tcp_diag.c) ----
 * Every TCP connection of this network namespace (any process's, as `ss -ti`
 * shows them), with how many segments it retransmitted so far. */
typedef struct {
  uint64_t cookie;        /* the kernel's id of the socket: stable while it lives */
  int family;             /* AF_INET (an IPv4-mapped IPv6 peer included) or AF_INET6 */
  unsigned char peer[16]; /* the peer's address (4 bytes for AF_INET) */
  uint32_t total_retrans; /* tcpi_total_retrans */
  bool timed_out;         /* a segment's retransmission timer fired and it is not acknowledged yet
                             (tcpi_retransmits or tcpi_backoff > 0, or congestion state Loss) */
  bool have_info;
} net_tcp_conn;
/* Fills at most max entries; returns how many, or -1 (errno set) when the
 * kernel's sock_diag interface cannot be used. */
int net_tcp_conns(net_tcp_conn *out, int max);

/* ---- rendezvous store: client ----
 * Thread-safe (one mutex per client). Keys are strings (< 512 bytes), values
 * are bytes (<= 64 MiB). One request is in flight per client: a store_wait
 * holds the client until it is answered, so threads that wait at the same time
 * as others use the store should each have their own client. After a transfer
 * fails half-way the client stays broken (TD_ERR_REMOTE on every call). */
typedef struct td_store td_store;

/* Connect to "host:port", retrying until timeout_s; the error names the
 * address, e.g. "cannot reach the rendezvous store at 10.0.0.1:29500 after
 * 30 s: connection refused". */
td_status store_connect(const char *addr, double timeout_s, td_store **out);
void store_close(td_store *store); /* accepts NULL */
const char *store_address(const td_store *store);
/* Break off the request another thread has in flight (it fails at once and
 * the client is broken from then on), e.g. when the store's host was lost
 * and the connection is about to be closed. Any thread; does not block. */
void store_interrupt(td_store *store); /* accepts NULL */
/* How long the request in flight on this client has been waiting for its
 * answer beyond the wait it asked for (0: none in flight, or not late).
 * Any thread; does not block. */
double store_overdue_s(const td_store *store);
/* This end's address on the connection to the store: the local interface
 * that routes to it (listeners of multi-host jobs bind there). */
td_status store_route_address(td_store *store, char *buf, size_t size);

td_status store_set(td_store *store, const char *key, const void *value, size_t len);
/* Non-blocking read: *found = 0 if the key does not exist (value NULL). The
 * value is malloc'd, NUL-terminated for convenience; free() it. */
td_status store_get(td_store *store, const char *key, void **value_out, size_t *len_out, int *found);
/* Block until the key exists (or timeout_s: TD_ERR_TIMEOUT naming the key),
 * then return its value as store_get does. */
td_status store_wait(td_store *store, const char *key, double timeout_s, void **value_out, size_t *len_out);
/* Atomically add delta to an integer key (missing = 0); returns the new value. */
td_status store_add(td_store *store, const char *key, int64_t delta, int64_t *result_out);
/* Compare-and-set: if the key's value equals expected (expected NULL: key
 * missing) set it to desired. *current_out (malloc'd) receives the value after
 * the call; *swapped tells whether the swap happened. */
td_status store_cas(td_store *store, const char *key, const void *expected, size_t expected_len,
                    const void *desired, size_t desired_len, void **current_out, size_t *current_len,
                    int *swapped);
td_status store_delete(td_store *store, const char *key, int *existed);

/* Block until the n keys "<prefix>0" .. "<prefix><n-1>" all exist (or
 * timeout_s: TD_ERR_TIMEOUT naming the first missing key, whose index goes to
 * *missing_out), then return their values with one request: *values_out is
 * one malloc'd block of n pointers to NUL-terminated copies (free() it once);
 * lens_out, if not NULL, has room for n lengths. */
td_status store_gather(td_store *store, const char *prefix, int n, double timeout_s, char ***values_out,
                       size_t *lens_out, int *missing_out);
/* Every one of n participants publishes one value and learns all n: set
 * "<prefix><rank>", then store_gather. Two requests per participant, where
 * waiting for the keys one by one costs n. */
td_status store_allgather(td_store *store, const char *prefix, int rank, int n, const void *value, size_t len,
                          double timeout_s, char ***values_out, size_t *lens_out, int *missing_out);

/* Convenience: set/wait string values. */
td_status store_set_str(td_store *store, const char *key, const char *value);
td_status store_wait_str(td_store *store, const char *key, double timeout_s, char **value_out);

/* ---- rendezvous store: server ----
 * Runs in its own thread (poll loop) until stopped. Hosted by tandemrun, or by
 * rank 0 when another launcher started the job. */
typedef struct td_store_server td_store_server;
td_status store_server_start(const char *host, int port, td_store_server **out);
int store_server_port(const td_store_server *server);
void store_server_stop(td_store_server *server); /* accepts NULL */

#endif
