/* Authentication of every connection of a job (the contract and the wire
 * format are in net.h): the job's key, the handshake's pure parsers and MAC,
 * and the blocking connector/acceptor sides used by the store client and the
 * TCP transport. The store server runs the acceptor side from its poll loop
 * with the same pure functions.
 *
 * Why libsodium: it is maintained, in Debian (libsodium-dev), small, and
 * gives exactly the three pieces needed with no configuration to get wrong:
 * a CSPRNG (randombytes_buf, getrandom underneath), HMAC-SHA-256
 * (crypto_auth_hmacsha256) and a constant-time compare (crypto_verify_32).
 * HMAC-SHA-256 rather than keyed BLAKE2b because it is the standard MAC
 * every auditor knows; the key itself is BLAKE2b-256 of the secret
 * (crypto_generichash), so a secret of any length and alphabet becomes a
 * uniform 32-byte key. The secret itself never appears in a message. */
#include "net/net.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

/* At least 256 bits if the secret is random bytes; a hex or base64 string of
 * 32 characters carries less, but it is the shortest we accept. */
#define AUTH_MIN_SECRET_BYTES 32
#define AUTH_MAX_SECRET_BYTES 4096
/* $HOME/.tandem/secret longer than this is refused (messages quote it). */
#define AUTH_HOME_PATH_MAX 320

static pthread_once_t auth_once = PTHREAD_ONCE_INIT;
static td_status auth_status;
static char auth_error[1024];
static bool auth_have_secret;
static double auth_timeout_s = NET_AUTH_DEFAULT_TIMEOUT_S;
static unsigned char auth_key[crypto_auth_hmacsha256_KEYBYTES];

static void derive_key(const unsigned char *secret, size_t len) {
  crypto_generichash_state h;
  static const char domain[] = "tandem job secret v1";
  crypto_generichash_init(&h, NULL, 0, sizeof auth_key);
  crypto_generichash_update(&h, (const unsigned char *)domain, sizeof domain);
  crypto_generichash_update(&h, secret, len);
  crypto_generichash_final(&h, auth_key, sizeof auth_key);
}

/* Read a secret file (`what` names it: TANDEM_SECRET_FILE or the per-user
 * secret) into buf. The file must be a regular file owned
 * by this user with no group/other permissions, like ssh's private keys:
 * a secret others can read keeps nobody out, so it is refused, not warned. */
static bool read_secret_file(const char *what, const char *path, unsigned char *buf, size_t size, size_t *len_out) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    snprintf(auth_error, sizeof auth_error, "cannot open %s '%s': %s", what, path, strerror(errno));
    return false;
  }
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    snprintf(auth_error, sizeof auth_error, "%s '%s' is not a regular file", what, path);
    close(fd);
    return false;
  }
  if (sb.st_uid != geteuid() || (sb.st_mode & 077)) {
    snprintf(auth_error, sizeof auth_error,
             "refusing %s '%s': it must be owned by uid %u and not accessible to group or others "
             "(it is owned by uid %u, mode %04o); run: chmod 600 '%s'",
             what, path, (unsigned)geteuid(), (unsigned)sb.st_uid, (unsigned)(sb.st_mode & 07777), path);
    close(fd);
    return false;
  }
  size_t got = 0;
  for (;;) {
    ssize_t n;
    TD_SYSCALL_RETRY(n, read(fd, buf + got, size - got));
    if (n < 0) {
      snprintf(auth_error, sizeof auth_error, "cannot read %s '%s': %s", what, path, strerror(errno));
      close(fd);
      return false;
    }
    if (n == 0) break;
    got += (size_t)n;
    if (got == size) {
      snprintf(auth_error, sizeof auth_error, "%s '%s' is larger than %d bytes", what, path,
               AUTH_MAX_SECRET_BYTES);
      close(fd);
      return false;
    }
  }
  close(fd);
  /* A trailing newline (echo > file) is not part of the secret. */
  while (got > 0 && (buf[got - 1] == '\n' || buf[got - 1] == '\r')) got--;
  *len_out = got;
  return true;
}

/* The per-user secret, for launchers that hand out none (mpirun, srun,
 * torchrun): $HOME/.tandem/secret, created on first use with 256 random
 * bits (hex) and mode 0600 in a 0700 directory, as ssh keeps ~/.ssh. Every
 * process of this user on every host that shares the home directory (as
 * clusters do) reads the same one; another user can read neither. The file
 * is written under a temporary name and link()ed into place, so that ranks
 * starting at once on one host (or on several over NFS, where link is
 * atomic too) all end up with the one that won. Returns false with
 * auth_error set on a refusal (loose permissions, another owner) or an I/O
 * failure, true with *len_out 0 when there is no home directory to use. */
static bool read_home_secret(unsigned char *buf, size_t size, size_t *len_out, char *path, size_t path_size) {
  *len_out = 0;
  const char *home = getenv("HOME");
  if (!home || home[0] != '/') return true;
  char dir[AUTH_HOME_PATH_MAX - 8];
  if ((size_t)snprintf(dir, sizeof dir, "%s/.tandem", home) >= sizeof dir ||
      (size_t)snprintf(path, path_size, "%s/secret", dir) >= path_size) {
    snprintf(auth_error, sizeof auth_error, "the per-user secret's path under HOME '%s' is too long", home);
    return false;
  }
  if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
    if (errno == EACCES || errno == EROFS || errno == ENOENT) return true; /* no usable home: no secret */
    snprintf(auth_error, sizeof auth_error, "cannot create '%s' for the per-user job secret: %s", dir, strerror(errno));
    return false;
  }
  struct stat sb;
  if (lstat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode) || sb.st_uid != geteuid() || (sb.st_mode & 022)) {
    snprintf(auth_error, sizeof auth_error,
             "refusing the per-user job secret in '%s': the directory must be this user's (uid %u) and writable by "
             "nobody else; run: chmod 700 '%s' (or set TANDEM_SECRET_FILE)",
             dir, (unsigned)geteuid(), dir);
    return false;
  }
  if (access(path, F_OK) != 0) {
    unsigned char bits[32];
    char hex[2 * sizeof bits + 2], tmp[AUTH_HOME_PATH_MAX + 24];
    randombytes_buf(bits, sizeof bits);
    sodium_bin2hex(hex, sizeof hex, bits, sizeof bits);
    sodium_memzero(bits, sizeof bits);
    size_t hex_len = strlen(hex);
    hex[hex_len] = '\n';
    uint32_t tag = randombytes_random();
    snprintf(tmp, sizeof tmp, "%s.%ld.%08x", path, (long)getpid(), (unsigned)tag);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
      snprintf(auth_error, sizeof auth_error, "cannot create the per-user job secret '%s': %s", tmp, strerror(errno));
      sodium_memzero(hex, sizeof hex);
      return false;
    }
    ssize_t n;
    TD_SYSCALL_RETRY(n, write(fd, hex, hex_len + 1));
    bool written = n == (ssize_t)(hex_len + 1) && fsync(fd) == 0;
    int write_errno = errno;
    close(fd);
    sodium_memzero(hex, sizeof hex);
    /* link fails with EEXIST when another process got there first: its
     * file is the secret then. */
    if (!written || (link(tmp, path) != 0 && errno != EEXIST)) {
      snprintf(auth_error, sizeof auth_error, "cannot write the per-user job secret '%s': %s", path,
               strerror(written ? errno : write_errno));
      unlink(tmp);
      return false;
    }
    unlink(tmp);
  }
  return read_secret_file("the per-user job secret (used when TANDEM_SECRET and TANDEM_SECRET_FILE are unset)",
                          path, buf, size, len_out);
}

static void auth_load(void) {
  if (sodium_init() < 0) {
    auth_status = TD_ERR_SYSTEM;
    snprintf(auth_error, sizeof auth_error, "libsodium failed to initialise (no entropy source?)");
    return;
  }
  double timeout = td_env_double("TANDEM_AUTH_TIMEOUT", NET_AUTH_DEFAULT_TIMEOUT_S);
  if (timeout > 0 && timeout <= 3600) auth_timeout_s = timeout;
  const char *text = getenv("TANDEM_SECRET");
  const char *path = td_env_str("TANDEM_SECRET_FILE", NULL);
  unsigned char *secret = sodium_malloc(AUTH_MAX_SECRET_BYTES);
  if (!secret) {
    auth_status = TD_ERR_SYSTEM;
    snprintf(auth_error, sizeof auth_error, "out of memory loading the job secret");
    return;
  }
  size_t len = 0;
  const char *source = NULL;
  if (text && *text) {
    /* The variable wins: tandemrun sets it for workers, whatever file the
     * user's environment also names. */
    len = strlen(text);
    source = "TANDEM_SECRET";
    if (len >= AUTH_MAX_SECRET_BYTES) {
      auth_status = TD_ERR_INVALID_ARGUMENT;
      snprintf(auth_error, sizeof auth_error, "TANDEM_SECRET is %zu bytes long; the limit is %d", len,
               AUTH_MAX_SECRET_BYTES - 1);
      goto out;
    }
    memcpy(secret, text, len);
  } else if (path) {
    source = "TANDEM_SECRET_FILE";
    if (!read_secret_file("TANDEM_SECRET_FILE", path, secret, AUTH_MAX_SECRET_BYTES, &len)) {
      auth_status = TD_ERR_INVALID_ARGUMENT;
      goto out;
    }
  }
  char home_path[AUTH_HOME_PATH_MAX];
  if (!source) {
    if (!read_home_secret(secret, AUTH_MAX_SECRET_BYTES, &len, home_path, sizeof home_path)) {
      auth_status = TD_ERR_INVALID_ARGUMENT;
      goto out;
    }
    if (len) source = home_path;
  }
  if (source && len < AUTH_MIN_SECRET_BYTES) {
    auth_status = TD_ERR_INVALID_ARGUMENT;
    snprintf(auth_error, sizeof auth_error,
             "the job secret from %s is %zu bytes; it must be at least %d random bytes, the same on every rank "
             "(for example: head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n')",
             source, len, AUTH_MIN_SECRET_BYTES);
    goto out;
  }
  /* len 0: no secret at all (no usable HOME and no variable): a fixed key,
   * so listeners stay on loopback (net_listen) */
  derive_key(secret, len);
  auth_have_secret = source != NULL;
  auth_status = TD_OK;
out:
  sodium_free(secret); /* zeroes it */
}

td_status net_auth_init(void) {
  pthread_once(&auth_once, auth_load);
  if (auth_status != TD_OK) return td_error(auth_status, "%s", auth_error);
  return TD_OK;
}

bool net_auth_have_secret(void) { return net_auth_init() == TD_OK && auth_have_secret; }

double net_auth_timeout_s(void) {
  pthread_once(&auth_once, auth_load);
  return auth_timeout_s;
}

/* ---- pure parts ---- */

int net_auth_parse_hello(const unsigned char *buf, size_t len, net_auth_hello *out) {
  if (!buf || len != NET_AUTH_HELLO_BYTES || td_get_le32(buf) != NET_AUTH_MAGIC) return -1;
  out->role = td_get_le32(buf + 4);
  out->rank = (int32_t)td_get_le32(buf + 8);
  memcpy(out->nonce, buf + 12, NET_AUTH_NONCE_BYTES);
  return 0;
}

void net_auth_encode_hello(unsigned char out[NET_AUTH_HELLO_BYTES], const net_auth_hello *hello) {
  td_put_le32(out, NET_AUTH_MAGIC);
  td_put_le32(out + 4, hello->role);
  td_put_le32(out + 8, (uint32_t)hello->rank);
  memcpy(out + 12, hello->nonce, NET_AUTH_NONCE_BYTES);
}

int net_auth_parse_msg(const unsigned char *buf, size_t len, unsigned char payload[32]) {
  if (!buf || len != NET_AUTH_MSG_BYTES || td_get_le32(buf) != NET_AUTH_MAGIC) return -1;
  memcpy(payload, buf + 4, 32);
  return 0;
}

void net_auth_encode_msg(unsigned char out[NET_AUTH_MSG_BYTES], const unsigned char payload[32]) {
  td_put_le32(out, NET_AUTH_MAGIC);
  memcpy(out + 4, payload, 32);
}

void net_auth_nonce(unsigned char nonce[NET_AUTH_NONCE_BYTES]) {
  pthread_once(&auth_once, auth_load);
  randombytes_buf(nonce, NET_AUTH_NONCE_BYTES);
}

void net_auth_mac(bool acceptor, const char *ctx, const net_auth_hello *hello,
                  const unsigned char nonce_s[NET_AUTH_NONCE_BYTES], unsigned char mac[NET_AUTH_MAC_BYTES]) {
  pthread_once(&auth_once, auth_load);
  /* Every field is fixed-size or length-prefixed, so no two different
   * transcripts hash the same bytes. */
  static const char label_c[] = "tandem auth v1 connector", label_a[] = "tandem auth v1 acceptor";
  const char *label = acceptor ? label_a : label_c;
  size_t ctx_len = ctx ? strlen(ctx) : 0;
  unsigned char fields[12];
  td_put_le32(fields, (uint32_t)ctx_len);
  td_put_le32(fields + 4, hello->role);
  td_put_le32(fields + 8, (uint32_t)hello->rank);
  crypto_auth_hmacsha256_state st;
  crypto_auth_hmacsha256_init(&st, auth_key, sizeof auth_key);
  crypto_auth_hmacsha256_update(&st, (const unsigned char *)label, strlen(label) + 1);
  crypto_auth_hmacsha256_update(&st, fields, 4);
  if (ctx_len) crypto_auth_hmacsha256_update(&st, (const unsigned char *)ctx, ctx_len);
  crypto_auth_hmacsha256_update(&st, fields + 4, 8);
  crypto_auth_hmacsha256_update(&st, hello->nonce, NET_AUTH_NONCE_BYTES);
  crypto_auth_hmacsha256_update(&st, nonce_s, NET_AUTH_NONCE_BYTES);
  crypto_auth_hmacsha256_final(&st, mac);
}

bool net_auth_check(bool acceptor, const char *ctx, const net_auth_hello *hello,
                    const unsigned char nonce_s[NET_AUTH_NONCE_BYTES], const unsigned char mac[NET_AUTH_MAC_BYTES]) {
  unsigned char expected[NET_AUTH_MAC_BYTES];
  net_auth_mac(acceptor, ctx, hello, nonce_s, expected);
  bool ok = crypto_verify_32(expected, mac) == 0;
  sodium_memzero(expected, sizeof expected);
  return ok;
}

void net_auth_datagram_mac(const char *label, const void *msg, size_t len, unsigned char mac[NET_AUTH_MAC_BYTES]) {
  pthread_once(&auth_once, auth_load);
  /* The label (with its NUL) separates this use of the key from the
   * handshake's, whose labels differ. */
  crypto_auth_hmacsha256_state st;
  crypto_auth_hmacsha256_init(&st, auth_key, sizeof auth_key);
  crypto_auth_hmacsha256_update(&st, (const unsigned char *)label, strlen(label) + 1);
  crypto_auth_hmacsha256_update(&st, msg, len);
  crypto_auth_hmacsha256_final(&st, mac);
}

bool net_auth_datagram_check(const char *label, const void *msg, size_t len,
                             const unsigned char mac[NET_AUTH_MAC_BYTES]) {
  unsigned char expected[NET_AUTH_MAC_BYTES];
  net_auth_datagram_mac(label, msg, len, expected);
  bool ok = crypto_verify_32(expected, mac) == 0;
  sodium_memzero(expected, sizeof expected);
  return ok;
}

size_t net_auth_acceptor_want(const net_auth_acceptor *a) {
  if (a->stage >= 2) return 0;
  return (a->stage == 0 ? NET_AUTH_HELLO_BYTES : NET_AUTH_MSG_BYTES) - a->got;
}

int net_auth_acceptor_feed(net_auth_acceptor *a, uint32_t role, const char *ctx, const unsigned char *data, size_t n,
                           unsigned char out[NET_AUTH_MSG_BYTES]) {
  size_t want = net_auth_acceptor_want(a);
  if (a->stage >= 2 || n > want) return NET_AUTH_FAIL;
  memcpy(a->in + a->got, data, n);
  a->got += n;
  if (a->stage == 0 && a->got >= 4 && td_get_le32(a->in) != NET_AUTH_MAGIC) return NET_AUTH_FAIL;
  if (n < want) return NET_AUTH_MORE;
  size_t len = a->got;
  a->got = 0;
  if (a->stage == 0) {
    if (net_auth_parse_hello(a->in, len, &a->hello) != 0 || a->hello.role != role) return NET_AUTH_FAIL;
    net_auth_nonce(a->nonce_s);
    net_auth_encode_msg(out, a->nonce_s);
    a->stage = 1;
    return NET_AUTH_REPLY;
  }
  unsigned char payload[32];
  if (net_auth_parse_msg(a->in, len, payload) != 0 || !net_auth_check(false, ctx, &a->hello, a->nonce_s, payload))
    return NET_AUTH_FAIL;
  net_auth_mac(true, ctx, &a->hello, a->nonce_s, payload);
  net_auth_encode_msg(out, payload);
  a->stage = 2;
  return NET_AUTH_DONE;
}

/* ---- blocking sides ---- */

void net_auth_derive(const char *label, const void *fields, size_t fields_len, const unsigned char *extra,
                     size_t extra_len, const net_auth_session *session, unsigned char out[32]) {
  pthread_once(&auth_once, auth_load);
  /* Keyed BLAKE2b (a PRF under the job key), its input separated from the
   * handshake's HMAC input by construction (another primitive) and from
   * other derivations by the label with its NUL. */
  crypto_generichash_state h;
  crypto_generichash_init(&h, auth_key, sizeof auth_key, 32);
  crypto_generichash_update(&h, (const unsigned char *)label, strlen(label) + 1);
  crypto_generichash_update(&h, fields, fields_len);
  if (extra_len) crypto_generichash_update(&h, extra, extra_len);
  crypto_generichash_update(&h, session->hello.nonce, NET_AUTH_NONCE_BYTES);
  crypto_generichash_update(&h, session->nonce_s, NET_AUTH_NONCE_BYTES);
  crypto_generichash_final(&h, out, 32);
}

td_status net_auth_connect(int fd, uint32_t role, int32_t rank, const char *ctx, const char *peer, double deadline) {
  return net_auth_connect_session(fd, role, rank, ctx, peer, deadline, NULL);
}

td_status net_auth_connect_session(int fd, uint32_t role, int32_t rank, const char *ctx, const char *peer,
                                   double deadline, net_auth_session *session_out) {
  TD_CHECK(net_auth_init());
  net_auth_hello hello = {.role = role, .rank = rank};
  net_auth_nonce(hello.nonce);
  unsigned char buf[NET_AUTH_HELLO_BYTES], payload[32], mac[NET_AUTH_MAC_BYTES];
  net_auth_encode_hello(buf, &hello);
  td_status st = net_send_all(fd, buf, NET_AUTH_HELLO_BYTES, deadline);
  if (st != TD_OK) goto transfer_failed;
  st = net_recv_all(fd, buf, NET_AUTH_MSG_BYTES, deadline);
  if (st != TD_OK) goto transfer_failed;
  if (net_auth_parse_msg(buf, NET_AUTH_MSG_BYTES, payload) != 0)
    return td_error(TD_ERR_REMOTE, "%s answered the authentication hello with something else: it is not a Tandem "
                                   "peer of this version", peer);
  unsigned char nonce_s[NET_AUTH_NONCE_BYTES];
  memcpy(nonce_s, payload, sizeof nonce_s);
  net_auth_mac(false, ctx, &hello, nonce_s, mac);
  net_auth_encode_msg(buf, mac);
  st = net_send_all(fd, buf, NET_AUTH_MSG_BYTES, deadline);
  if (st != TD_OK) goto transfer_failed;
  st = net_recv_all(fd, buf, NET_AUTH_MSG_BYTES, deadline);
  if (st != TD_OK) goto transfer_failed;
  if (net_auth_parse_msg(buf, NET_AUTH_MSG_BYTES, payload) != 0 || !net_auth_check(true, ctx, &hello, nonce_s, payload))
    return td_error(TD_ERR_REMOTE, "%s failed to prove it holds this job's secret: another job, or a stranger, is "
                                   "listening at its address; not using it", peer);
  if (session_out) {
    session_out->hello = hello;
    memcpy(session_out->nonce_s, nonce_s, NET_AUTH_NONCE_BYTES);
  }
  return TD_OK;
transfer_failed:;
  char why[300];
  td_error_copy(why, sizeof why);
  if (st == TD_ERR_TIMEOUT)
    return td_error(TD_ERR_TIMEOUT,
                    "authentication with %s timed out: %s. The peer did not answer the handshake in time: it is "
                    "stopped, overloaded or cut off (the listener side gives up after TANDEM_AUTH_TIMEOUT=%g s; raise "
                    "it on a slow or loaded network)",
                    peer, why, net_auth_timeout_s());
  return td_error(TD_ERR_REMOTE,
                  "authentication with %s failed: %s. The peer closes the connection when the job secrets differ: "
                  "every process of a job needs the same TANDEM_SECRET or TANDEM_SECRET_FILE (tandemrun sets it "
                  "for its workers; without either, each user's ~/.tandem/secret is used, which hosts share only "
                  "through a shared home directory)",
                  peer, why);
}

td_status net_auth_accept(int fd, uint32_t role, const char *ctx, double deadline, net_auth_hello *hello_out) {
  net_auth_session session;
  TD_CHECK(net_auth_accept_session(fd, role, ctx, deadline, &session));
  *hello_out = session.hello;
  return TD_OK;
}

td_status net_auth_accept_session(int fd, uint32_t role, const char *ctx, double deadline,
                                  net_auth_session *session_out) {
  TD_CHECK(net_auth_init());
  net_auth_acceptor a = {0};
  unsigned char buf[NET_AUTH_HELLO_BYTES], out[NET_AUTH_MSG_BYTES];
  for (;;) {
    size_t want = net_auth_acceptor_want(&a);
    TD_CHECK(net_recv_all(fd, buf, want, deadline));
    int r = net_auth_acceptor_feed(&a, role, ctx, buf, want, out);
    if (r == NET_AUTH_FAIL)
      return td_error(TD_ERR_REMOTE, a.stage == 0 ? "the connector sent no valid authentication hello"
                                                  : "the connector's proof does not match this job's secret");
    TD_CHECK(net_send_all(fd, out, NET_AUTH_MSG_BYTES, deadline));
    if (r == NET_AUTH_DONE) {
      session_out->hello = a.hello;
      memcpy(session_out->nonce_s, a.nonce_s, NET_AUTH_NONCE_BYTES);
      return TD_OK;
    }
  }
}

/* The listener policy lives here, with the secret it depends on; the
 * socket itself is socket.c's (net_listen_socket). */
td_status net_listen(const char *host, int port, int backlog, int *fd_out, int *port_out) {
  /* Without a job secret, a listener on a routable address would let any
   * host that reaches it join the job; loopback keeps other hosts out. */
  TD_CHECK(net_auth_init());
  if (!net_auth_have_secret() && !net_is_loopback_host(host)) {
    char addr[300];
    net_format_addr(addr, sizeof addr, host && *host ? host : "0.0.0.0", port);
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "refusing to listen on %s without a job secret: anyone who can reach it could join the job. Set "
                    "TANDEM_SECRET (at least 32 random characters) or TANDEM_SECRET_FILE (a 0600 file) to the same "
                    "value on every rank, or run every rank on this host (tandemrun does this for you)",
                    addr);
  }
  return net_listen_socket(host, port, backlog, fd_out, port_out);
}
