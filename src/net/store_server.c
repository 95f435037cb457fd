/* The rendezvous store server: one thread, one poll loop, any number of
 * clients (PyTorch's TCPStore and Redis's ae loop are the models).
 *
 * Each client connection is a small state machine: read a fixed header, then
 * the body it announces, run the request, queue the response. A WAIT on a
 * missing key parks the client (no further reads from it) until a SET, ADD or
 * successful CAS of that key answers it, or its deadline passes and it gets a
 * TIMEOUT response; the poll timeout is the nearest parked deadline. A
 * GATHER parks the same way until all of its n keys exist; it remembers the
 * first index still missing, so that answering it costs O(n) lookups in all,
 * however the keys trickle in. A client
 * that dies mid-message, sends garbage or exceeds the size limits is dropped
 * alone; the others never notice. Reads stop while a response is still being
 * written, which bounds each client's memory to one request and one response.
 *
 * Dropping a client is a lingering close (Apache's and nginx's lingering_close
 * are the models): shut down our sending side, then read and discard what
 * the client still sends until it closes or STORE_LINGER_S pass, then close.
 * Closing a socket that holds unread input makes the kernel send a reset and
 * throw away the part of the send queue not yet on the wire, so the answers
 * to the requests before a bad one were lost whenever the client's window or
 * the congestion window still held them back (issue 22: fuzz_store saw it on
 * loopback under cubic and reno; tests/net/test_store_close.c pins it).
 *
 * Security (net.h, DESIGN.md §7): a new connection must first complete the
 * authentication handshake, driven from this loop without blocking; until
 * it has, no request byte is read, and a connection that fails it, or stays
 * silent past TANDEM_AUTH_TIMEOUT, is closed. The server bounds what clients
 * can make it hold: one request's body (TANDEM_STORE_MAX_REQUEST, default
 * 64 MiB), all keys, values and request bodies together
 * (TANDEM_STORE_MAX_BYTES, default 1 GiB; the table and the bodies in
 * flight are each bounded by it) and connections
 * (TANDEM_STORE_MAX_CLIENTS, default 8192). A request out of bounds closes
 * its connection with a logged reason (rate-limited, so a flood cannot fill
 * the log); a write beyond the total gets an error response.
 *
 * Values are copied in and out; the table is a chained hash that doubles when
 * full. Nothing here prints except debug logging. */
#include "net/net.h"
#include "net/store_proto.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct entry {
  struct entry *next;
  uint64_t hash;
  char *key;
  unsigned char *value;
  size_t len;
} entry;

#define STORE_DEFAULT_MAX_REQUEST ((size_t)64 << 20)
#define STORE_DEFAULT_MAX_BYTES ((size_t)1 << 30)
#define STORE_DEFAULT_MAX_CLIENTS 8192
/* A WAIT longer than this (a week) waits forever: keeps deadlines finite. */
#define STORE_MAX_WAIT_MS ((int64_t)7 * 24 * 3600 * 1000)
/* How long a dropped client's connection lingers (see the top): long enough
 * for the answers already queued to reach a live client; bounded, so that a
 * client that never closes cannot hold the descriptor. */
#define STORE_LINGER_S 2.0
/* Bytes discarded from a lingering client per poll round, so that one that
 * floods cannot keep the loop from the others. */
#define STORE_LINGER_DRAIN_BYTES ((size_t)256 << 10)

typedef struct client {
  int fd;
  bool dead; /* to be dropped: lingers first unless gone (see the top) */
  bool gone; /* its stream ended or broke: nothing to wait for, close at once */
  bool lingering;
  double linger_deadline;
  /* authentication, before any request (net.h) */
  bool authed;
  net_auth_acceptor auth;
  double auth_deadline;
  char peer[64]; /* "address:port", for messages */
  /* input: header, then body = key | a | b */
  unsigned char header[STORE_REQ_HEADER];
  size_t header_got;
  bool have_header;
  store_req_header req;
  unsigned char *body;
  size_t body_len, body_got;
  /* parked WAIT or GATHER: the key (GATHER: the prefix) lives in body until
   * answered */
  bool parked;
  double wait_deadline;
  uint64_t gather_n;    /* GATHER: number of keys */
  uint64_t gather_next; /* GATHER: first index not yet seen to exist */
  /* output */
  unsigned char *out;
  size_t out_len, out_sent, out_cap;
} client;

struct td_store_server {
  int listen_fd;
  int port;
  int wake_pipe[2];
  pthread_t thread;
  bool thread_started;
  /* table */
  entry **buckets;
  size_t n_buckets, n_entries;
  /* clients */
  client **clients;
  size_t n_clients, cap_clients;
  struct pollfd *pfds;
  size_t cap_pfds;
  /* Out of file descriptors: stop accepting for a moment instead of spinning
   * on a listening socket that stays readable. */
  double accept_paused_until;
  /* For the log at stop: how much start-up traffic a job caused. */
  uint64_t n_requests;
  size_t peak_clients;
  /* limits (read once at start) and what is held against them */
  size_t max_request, max_bytes, max_clients;
  size_t table_bytes;   /* keys + values in the table */
  size_t pending_bytes; /* request bodies being read or parked */
  /* rate-limited warnings */
  double last_warn;
  unsigned suppressed_warns;
};

/* A client misbehaved: say so, at most once a second (a flood of junk
 * connections must not become a flood of log lines). */
static void server_warn(td_store_server *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void server_warn(td_store_server *s, const char *fmt, ...) {
  double now = td_now();
  if (now - s->last_warn < 1.0) {
    s->suppressed_warns++;
    return;
  }
  char msg[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (s->suppressed_warns)
    TD_WARN("store server: %s (and %u similar messages in the last second)", msg, s->suppressed_warns);
  else
    TD_WARN("store server: %s", msg);
  s->last_warn = now;
  s->suppressed_warns = 0;
}

/* ---- table ---- */

static uint64_t hash_key(const char *key) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (const unsigned char *p = (const unsigned char *)key; *p; p++) h = (h ^ *p) * 1099511628211ull;
  return h;
}

static entry *table_find(td_store_server *s, const char *key) {
  uint64_t h = hash_key(key);
  for (entry *e = s->buckets[h & (s->n_buckets - 1)]; e; e = e->next)
    if (e->hash == h && strcmp(e->key, key) == 0) return e;
  return NULL;
}

static void table_grow(td_store_server *s) {
  size_t n = s->n_buckets * 2;
  entry **b = calloc(n, sizeof *b);
  if (!b) return; /* keep the longer chains; still correct */
  for (size_t i = 0; i < s->n_buckets; i++) {
    for (entry *e = s->buckets[i], *next; e; e = next) {
      next = e->next;
      e->next = b[e->hash & (n - 1)];
      b[e->hash & (n - 1)] = e;
    }
  }
  free(s->buckets);
  s->buckets = b;
  s->n_buckets = n;
}

/* Set key to a copy of value. Returns false on allocation failure. */
static bool table_set(td_store_server *s, const char *key, const void *value, size_t len) {
  unsigned char *copy = malloc(len ? len : 1);
  if (!copy) return false;
  if (len) memcpy(copy, value, len);
  entry *e = table_find(s, key);
  if (e) {
    s->table_bytes = s->table_bytes - e->len + len;
    free(e->value);
    e->value = copy;
    e->len = len;
    return true;
  }
  e = calloc(1, sizeof *e);
  char *key_copy = strdup(key);
  if (!e || !key_copy) {
    free(e);
    free(key_copy);
    free(copy);
    return false;
  }
  e->hash = hash_key(key);
  e->key = key_copy;
  e->value = copy;
  e->len = len;
  s->table_bytes += strlen(key) + 1 + len;
  e->next = s->buckets[e->hash & (s->n_buckets - 1)];
  s->buckets[e->hash & (s->n_buckets - 1)] = e;
  if (++s->n_entries > s->n_buckets) table_grow(s);
  return true;
}

static bool table_delete(td_store_server *s, const char *key) {
  uint64_t h = hash_key(key);
  for (entry **pp = &s->buckets[h & (s->n_buckets - 1)]; *pp; pp = &(*pp)->next) {
    entry *e = *pp;
    if (e->hash == h && strcmp(e->key, key) == 0) {
      *pp = e->next;
      s->table_bytes -= strlen(e->key) + 1 + e->len;
      free(e->key);
      free(e->value);
      free(e);
      s->n_entries--;
      return true;
    }
  }
  return false;
}

/* ---- responses ---- */

static bool out_reserve(client *c, size_t extra) {
  if (c->out_len + extra <= c->out_cap) return true;
  size_t cap = c->out_cap ? c->out_cap : 256;
  while (cap < c->out_len + extra) cap *= 2;
  unsigned char *p = realloc(c->out, cap);
  if (!p) return false;
  c->out = p;
  c->out_cap = cap;
  return true;
}

static void flush_client(client *c) {
  while (c->out_sent < c->out_len) {
    ssize_t n = send(c->fd, c->out + c->out_sent, c->out_len - c->out_sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c->out_sent += (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return; /* poll for POLLOUT */
    c->dead = c->gone = true;
    return;
  }
  /* All sent: keep the buffer if small, so that steady traffic does not
   * allocate; drop it after a large value. */
  c->out_len = c->out_sent = 0;
  if (c->out_cap > (1u << 20)) {
    free(c->out);
    c->out = NULL;
    c->out_cap = 0;
  }
}

static void respond(client *c, uint32_t status, uint32_t flags, int64_t num, const void *value, size_t len) {
  if (c->out_sent == c->out_len) c->out_len = c->out_sent = 0;
  if (!out_reserve(c, STORE_RESP_HEADER + len)) {
    c->dead = true; /* cannot answer: drop the client rather than desynchronise it */
    return;
  }
  store_resp_header h = {.status = status, .flags = flags, .len = len, .num = num};
  store_encode_resp(c->out + c->out_len, &h);
  c->out_len += STORE_RESP_HEADER;
  if (len) memcpy(c->out + c->out_len, value, len);
  c->out_len += len;
  flush_client(c);
}

static void respond_error(client *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void respond_error(client *c, const char *fmt, ...) {
  char msg[700];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  size_t len = n < 0 ? 0 : TD_MIN((size_t)n, sizeof msg - 1);
  respond(c, STORE_RESP_ERROR, 0, 0, msg, len);
}

static void reset_request(td_store_server *s, client *c) {
  s->pending_bytes -= c->body ? c->body_len + 1 : 0;
  free(c->body);
  c->body = NULL;
  c->body_len = c->body_got = 0;
  c->header_got = 0;
  c->have_header = false;
  c->parked = false;
}

/* ---- GATHER ---- */

static entry *gather_find(td_store_server *s, const char *prefix, uint64_t index) {
  char key[STORE_MAX_KEY + 24];
  snprintf(key, sizeof key, "%s%" PRIu64, prefix, index);
  return table_find(s, key);
}

/* Advance the client's first missing index; if none is missing, answer it
 * with all n records and return true. */
static bool gather_try(td_store_server *s, client *c) {
  const char *prefix = (const char *)c->body;
  while (c->gather_next < c->gather_n && gather_find(s, prefix, c->gather_next)) c->gather_next++;
  if (c->gather_next < c->gather_n) return false;
  uint64_t total = 0;
  for (uint64_t i = 0; i < c->gather_n; i++) {
    entry *e = gather_find(s, prefix, i);
    if (!e) { /* deleted since it was counted: wait for it again */
      c->gather_next = i;
      return false;
    }
    total += 8 + e->len;
  }
  if (total > STORE_MAX_VALUE) {
    respond_error(c, "store_gather on prefix '%s': the %" PRIu64 " values total %" PRIu64 " bytes, over the 64 MiB "
                  "limit of one response", prefix, c->gather_n, total);
    return true;
  }
  if (c->out_sent == c->out_len) c->out_len = c->out_sent = 0;
  if (!out_reserve(c, STORE_RESP_HEADER + (size_t)total)) {
    c->dead = true; /* cannot answer: drop the client rather than desynchronise it */
    return true;
  }
  store_resp_header h = {.status = STORE_RESP_OK, .flags = STORE_FLAG_FOUND, .len = total,
                         .num = (int64_t)c->gather_n};
  store_encode_resp(c->out + c->out_len, &h);
  c->out_len += STORE_RESP_HEADER;
  for (uint64_t i = 0; i < c->gather_n; i++) {
    entry *e = gather_find(s, prefix, i);
    td_put_le64(c->out + c->out_len, e->len);
    c->out_len += 8;
    if (e->len) memcpy(c->out + c->out_len, e->value, e->len);
    c->out_len += e->len;
  }
  flush_client(c);
  return true;
}

/* Answer every client parked on key with the key's current value, and every
 * GATHER whose prefix the key extends and which now has all its keys. */
static void wake_waiters(td_store_server *s, const char *key, const entry *e) {
  for (size_t i = 0; i < s->n_clients; i++) {
    client *c = s->clients[i];
    if (!c->parked || c->dead) continue;
    if (c->req.op == STORE_GATHER) {
      size_t prefix_len = c->req.key_len - 1; /* key_len counts the terminator */
      if (strncmp((const char *)c->body, key, prefix_len) == 0 && gather_try(s, c)) reset_request(s, c);
      continue;
    }
    if (strcmp((const char *)c->body, key) != 0) continue;
    respond(c, STORE_RESP_OK, STORE_FLAG_FOUND, 0, e->value, e->len);
    reset_request(s, c);
  }
}

/* ---- request handling ---- */

static void handle_request(td_store_server *s, client *c) {
  const store_req_header *r = &c->req;
  s->n_requests++;
  /* read_client made the key NUL-terminated; key_len counts the terminator. */
  char *key = (char *)c->body;
  const unsigned char *a = c->body + r->key_len;
  const unsigned char *b = a + r->a_len;
  entry *e;
  switch (r->op) {
  case STORE_SET:
  case STORE_CAS:
  case STORE_GET:
  case STORE_WAIT:
  case STORE_ADD:
  case STORE_DELETE:
  case STORE_GATHER:
    break;
  default:
    respond_error(c, "unknown store operation %u (client and server versions differ?)", r->op);
    reset_request(s, c);
    return;
  }
  /* The total the table may grow to (TANDEM_STORE_MAX_BYTES). */
  size_t grow = r->op == STORE_SET ? r->a_len : r->op == STORE_CAS ? r->b_len : r->op == STORE_ADD ? 32 : 0;
  if (grow && s->table_bytes + r->key_len + grow > s->max_bytes) {
    respond_error(c, "the store is full: it holds %zu bytes and TANDEM_STORE_MAX_BYTES is %zu; writing key '%s' "
                  "(%zu more bytes) was refused", s->table_bytes, s->max_bytes, key, grow);
    reset_request(s, c);
    return;
  }
  if (r->op == STORE_SET) {
    if (!table_set(s, key, a, r->a_len)) {
      respond_error(c, "store server out of memory setting key '%s' (%" PRIu64 " bytes)", key, r->a_len);
    } else {
      respond(c, STORE_RESP_OK, 0, 0, NULL, 0);
      wake_waiters(s, key, table_find(s, key));
    }
  } else if (r->op == STORE_GET) {
    e = table_find(s, key);
    if (e)
      respond(c, STORE_RESP_OK, STORE_FLAG_FOUND, 0, e->value, e->len);
    else
      respond(c, STORE_RESP_OK, 0, 0, NULL, 0);
  } else if (r->op == STORE_WAIT) {
    e = table_find(s, key);
    if (e) {
      respond(c, STORE_RESP_OK, STORE_FLAG_FOUND, 0, e->value, e->len);
    } else if (r->arg == 0) {
      respond(c, STORE_RESP_TIMEOUT, 0, 0, NULL, 0);
    } else {
      c->parked = true;
      /* arg comes from the wire: anything negative or beyond a week is
       * "forever", so no deadline arithmetic can overflow. */
      c->wait_deadline = r->arg < 0 || r->arg > STORE_MAX_WAIT_MS ? INFINITY : td_now() + (double)r->arg / 1000.0;
      return; /* body (and key) stay until answered */
    }
  } else if (r->op == STORE_ADD) {
    int64_t old = 0;
    e = table_find(s, key);
    if (e) {
      char text[32];
      bool ok = e->len > 0 && e->len < sizeof text;
      if (ok) {
        memcpy(text, e->value, e->len);
        text[e->len] = '\0';
        char *end;
        errno = 0;
        long long v = strtoll(text, &end, 10);
        ok = !errno && *end == '\0';
        old = v;
      }
      if (!ok) {
        respond_error(c, "store_add on key '%s': its value is not an integer (%zu bytes)", key, e->len);
        reset_request(s, c);
        return;
      }
    }
    /* Wrap like two's complement instead of overflowing (UB in C). */
    int64_t now = (int64_t)((uint64_t)old + (uint64_t)r->arg);
    char text[32];
    int n = snprintf(text, sizeof text, "%" PRId64, now);
    if (!table_set(s, key, text, (size_t)n)) {
      respond_error(c, "store server out of memory in store_add on key '%s'", key);
    } else {
      respond(c, STORE_RESP_OK, 0, now, NULL, 0);
      wake_waiters(s, key, table_find(s, key));
    }
  } else if (r->op == STORE_CAS) {
    e = table_find(s, key);
    bool match = (r->flags & STORE_FLAG_EXPECT_MISSING)
                     ? e == NULL
                     : (e && e->len == r->a_len && (r->a_len == 0 || memcmp(e->value, a, r->a_len) == 0));
    if (match && !table_set(s, key, b, r->b_len)) {
      respond_error(c, "store server out of memory in store_cas on key '%s'", key);
    } else {
      e = table_find(s, key);
      uint32_t flags = (e ? STORE_FLAG_FOUND : 0) | (match ? STORE_FLAG_SWAPPED : 0);
      respond(c, STORE_RESP_OK, flags, 0, e ? e->value : NULL, e ? e->len : 0);
      if (match) wake_waiters(s, key, e);
    }
  } else if (r->op == STORE_DELETE) {
    bool existed = table_delete(s, key);
    respond(c, STORE_RESP_OK, existed ? STORE_FLAG_SWAPPED : 0, 0, NULL, 0);
  } else if (r->op == STORE_GATHER) {
    uint64_t n = r->a_len == STORE_GATHER_COUNT_LEN ? td_get_le64(a) : 0;
    if (r->a_len != STORE_GATHER_COUNT_LEN || n == 0 || n > STORE_GATHER_MAX) {
      respond_error(c, "store_gather on prefix '%s': the count must be 1..%u (an 8-byte value)", key,
                    (unsigned)STORE_GATHER_MAX);
    } else {
      c->gather_n = n;
      c->gather_next = 0;
      if (!gather_try(s, c)) {
        if (r->arg == 0) {
          respond(c, STORE_RESP_TIMEOUT, 0, (int64_t)c->gather_next, NULL, 0);
        } else {
          c->parked = true;
          c->wait_deadline = r->arg < 0 ? INFINITY : td_now() + (double)r->arg / 1000.0;
          return; /* body (and prefix) stay until answered */
        }
      }
    }
  }
  reset_request(s, c);
}

int store_parse_req_header(const unsigned char *buf, size_t len, uint64_t max_request, store_req_header *out,
                           const char **why) {
  if (!buf || len != STORE_REQ_HEADER || store_decode_req(buf, out) != 0) {
    *why = "not a Tandem store request (bad magic)";
    return -1;
  }
  /* An unknown op is answered with an error, not dropped (handle_request):
   * the framing still holds when its sizes are sane. */
  if (out->key_len == 0 || out->key_len > STORE_MAX_KEY) {
    *why = "key length out of bounds";
    return -1;
  }
  if (out->a_len > STORE_MAX_VALUE || out->b_len > STORE_MAX_VALUE) {
    *why = "value larger than 64 MiB";
    return -1;
  }
  /* Each term is bounded above, so the sum cannot wrap. */
  if ((uint64_t)out->key_len + out->a_len + out->b_len > max_request) {
    *why = "request larger than TANDEM_STORE_MAX_REQUEST";
    return -1;
  }
  return 0;
}

/* Drive the authentication handshake (acceptor side) from the poll loop.
 * Returns true once the client is authenticated. */
static bool read_auth(td_store_server *s, client *c) {
  while (!c->dead && !c->authed && c->out_sent == c->out_len) {
    unsigned char in[NET_AUTH_HELLO_BYTES], msg[NET_AUTH_MSG_BYTES];
    ssize_t n = recv(c->fd, in, net_auth_acceptor_want(&c->auth), MSG_DONTWAIT);
    if (n == 0) {
      c->dead = c->gone = true;
      TD_DEBUG("store server: %s closed the connection during authentication", c->peer);
      return false;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) c->dead = c->gone = true;
      return false;
    }
    int r = net_auth_acceptor_feed(&c->auth, NET_AUTH_ROLE_STORE, "store", in, (size_t)n, msg);
    if (r == NET_AUTH_MORE) continue;
    if (r == NET_AUTH_FAIL) {
      server_warn(s, "closed the connection from %s: %s", c->peer,
                  c->auth.stage == 0 ? "it did not start with an authentication hello (not a Tandem store client of "
                                       "this version, or a stranger)"
                                     : "it failed authentication (it does not hold this job's secret)");
      c->dead = true;
      return false;
    }
    c->authed = r == NET_AUTH_DONE;
    if (c->out_sent == c->out_len) c->out_len = c->out_sent = 0;
    if (!out_reserve(c, sizeof msg)) {
      c->dead = true;
      return false;
    }
    memcpy(c->out + c->out_len, msg, sizeof msg);
    c->out_len += sizeof msg;
    flush_client(c);
  }
  return c->authed;
}

/* Read as much as is available; run each complete request. */
static void read_client(td_store_server *s, client *c) {
  if (!c->authed && !read_auth(s, c)) return;
  while (!c->dead && !c->parked && c->out_sent == c->out_len) {
    unsigned char *dst;
    size_t want;
    if (!c->have_header) {
      dst = c->header + c->header_got;
      want = STORE_REQ_HEADER - c->header_got;
    } else {
      dst = c->body + c->body_got;
      want = c->body_len - c->body_got;
    }
    if (want > 0) {
      ssize_t n = recv(c->fd, dst, want, MSG_DONTWAIT);
      if (n == 0) {
        c->dead = c->gone = true; /* closed, possibly mid-message */
        return;
      }
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) c->dead = c->gone = true;
        return;
      }
      if (!c->have_header)
        c->header_got += (size_t)n;
      else
        c->body_got += (size_t)n;
    }
    if (!c->have_header) {
      if (c->header_got < STORE_REQ_HEADER) continue;
      const char *why = NULL;
      if (store_parse_req_header(c->header, STORE_REQ_HEADER, s->max_request, &c->req, &why) != 0) {
        /* Not our protocol, or out of bounds: there is no way to resynchronise. */
        server_warn(s, "closed the connection from %s: malformed or oversized request (%s; key %" PRIu32
                       " bytes, values %" PRIu64 " + %" PRIu64 " bytes, limit %zu)",
                    c->peer, why, c->req.key_len, c->req.a_len, c->req.b_len, s->max_request);
        c->dead = true;
        return;
      }
      size_t body_len = (size_t)c->req.key_len + (size_t)c->req.a_len + (size_t)c->req.b_len;
      /* Request bodies in flight are bounded apart from the table (whose
       * growth gets an error response in handle_request). */
      if (s->pending_bytes + body_len + 1 > s->max_bytes) {
        server_warn(s, "closed the connection from %s: its %zu-byte request would take the requests in flight "
                       "past TANDEM_STORE_MAX_BYTES (%zu bytes pending, limit %zu)",
                    c->peer, body_len, s->pending_bytes, s->max_bytes);
        c->dead = true;
        return;
      }
      c->have_header = true;
      c->body_len = body_len;
      c->body_got = 0;
      /* One spare byte so that the key can be NUL-terminated in place. */
      c->body = malloc(c->body_len + 1);
      if (!c->body) {
        server_warn(s, "closed the connection from %s: out of memory for its %zu-byte request", c->peer, body_len);
        c->dead = true;
        return;
      }
      s->pending_bytes += c->body_len + 1;
      continue;
    }
    if (c->body_got < c->body_len) continue;
    /* Terminate the key without touching value A: shift A and B up by one. */
    size_t values = c->body_len - c->req.key_len;
    memmove(c->body + c->req.key_len + 1, c->body + c->req.key_len, values);
    c->body[c->req.key_len] = '\0';
    c->req.key_len += 1; /* handle_request sees the terminator as part of the key bytes */
    handle_request(s, c);
  }
}

/* Start a dropped client's lingering close (see the top). Returns false
 * when there is nothing to linger for: its stream already ended or broke,
 * or it has lingered already. */
static bool linger_start(td_store_server *s, client *c) {
  if (c->gone || c->lingering || shutdown(c->fd, SHUT_WR) != 0) return false;
  reset_request(s, c); /* its request, parked or half read, is void */
  free(c->out); /* unsent answers of a client given up on: no use now */
  c->out = NULL;
  c->out_len = c->out_sent = c->out_cap = 0;
  c->lingering = true;
  c->dead = false;
  c->linger_deadline = td_now() + STORE_LINGER_S;
  return true;
}

/* Discard what a lingering client sent; its end of stream (or an error)
 * ends the linger. */
static void linger_drain(client *c) {
  unsigned char scrap[4096];
  for (size_t total = 0; total < STORE_LINGER_DRAIN_BYTES;) {
    ssize_t n = recv(c->fd, scrap, sizeof scrap, MSG_DONTWAIT);
    if (n > 0) {
      total += (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) c->dead = c->gone = true;
    return;
  }
}

static void free_client(td_store_server *s, client *c) {
  close(c->fd);
  if (c->body) s->pending_bytes -= c->body_len + 1;
  free(c->body);
  free(c->out);
  free(c);
}

static void accept_clients(td_store_server *s) {
  for (;;) {
    int fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        if (td_now() >= s->accept_paused_until + 1.0)
          TD_WARN("store server: cannot accept more clients (%zu connected): %s; raise `ulimit -n`",
                  s->n_clients, strerror(errno));
        s->accept_paused_until = td_now() + 0.1;
      } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
        TD_WARN("store server: accept failed: %s (clients will retry)", strerror(errno));
      }
      return;
    }
    char peer[64] = "unknown peer";
    {
      struct sockaddr_storage ss;
      socklen_t len = sizeof ss;
      char host[INET6_ADDRSTRLEN];
      if (getpeername(fd, (struct sockaddr *)&ss, &len) == 0 && ss.ss_family == AF_INET &&
          inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, host, sizeof host))
        snprintf(peer, sizeof peer, "%s:%d", host, ntohs(((struct sockaddr_in *)&ss)->sin_port));
      else if (getpeername(fd, (struct sockaddr *)&ss, &len) == 0 && ss.ss_family == AF_INET6 &&
               inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, host, sizeof host))
        snprintf(peer, sizeof peer, "[%s]:%d", host, ntohs(((struct sockaddr_in6 *)&ss)->sin6_port));
    }
    size_t n_live = 0;
    for (size_t i = 0; i < s->n_clients && s->n_clients >= s->max_clients; i++)
      n_live += !s->clients[i]->dead && !s->clients[i]->lingering;
    if (s->n_clients >= s->max_clients && n_live >= s->max_clients) {
      server_warn(s, "refused a connection from %s: %zu clients are connected (TANDEM_STORE_MAX_CLIENTS)", peer,
                  s->n_clients);
      close(fd);
      continue;
    }
    (void)net_set_nodelay(fd);
    net_set_loss_recovery(fd);
    if (s->n_clients == s->cap_clients) {
      size_t cap = s->cap_clients ? s->cap_clients * 2 : 64;
      client **p = realloc(s->clients, cap * sizeof *p);
      if (!p) {
        close(fd);
        return;
      }
      s->clients = p;
      s->cap_clients = cap;
    }
    client *c = calloc(1, sizeof *c);
    if (!c) {
      close(fd);
      return;
    }
    c->fd = fd;
    c->auth_deadline = td_now() + net_auth_timeout_s();
    td_strlcpy(c->peer, peer, sizeof c->peer);
    s->clients[s->n_clients++] = c;
    if (s->n_clients > s->peak_clients) s->peak_clients = s->n_clients;
  }
}

static void *server_main(void *arg) {
  td_store_server *s = arg;
  for (;;) {
    /* Drop dead clients (swap-remove) once they have lingered. */
    for (size_t i = 0; i < s->n_clients;) {
      if (s->clients[i]->dead && !linger_start(s, s->clients[i])) {
        free_client(s, s->clients[i]);
        s->clients[i] = s->clients[--s->n_clients];
      } else {
        i++;
      }
    }
    size_t need = s->n_clients + 2;
    if (need > s->cap_pfds) {
      struct pollfd *p = realloc(s->pfds, need * 2 * sizeof *p);
      if (!p) {
        TD_WARN("store server: out of memory for %zu connections", s->n_clients);
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
        continue;
      }
      s->pfds = p;
      s->cap_pfds = need * 2;
    }
    double next_deadline = INFINITY;
    s->pfds[0] = (struct pollfd){.fd = s->wake_pipe[0], .events = POLLIN};
    bool accept_paused = td_now() < s->accept_paused_until;
    s->pfds[1] = (struct pollfd){.fd = s->listen_fd, .events = accept_paused ? 0 : POLLIN};
    if (accept_paused) next_deadline = s->accept_paused_until;
    for (size_t i = 0; i < s->n_clients; i++) {
      client *c = s->clients[i];
      if (c->lingering) {
        s->pfds[i + 2] = (struct pollfd){.fd = c->fd, .events = POLLIN};
        if (c->linger_deadline < next_deadline) next_deadline = c->linger_deadline;
        continue;
      }
      /* POLLRDHUP only while parked (a hang-up is all we wait for then):
       * a client that half-closed with answers still to write would
       * otherwise keep poll returning at once until they are out. */
      short ev = 0;
      if (c->out_sent < c->out_len)
        ev |= POLLOUT;
      else if (!c->parked)
        ev |= POLLIN;
      else
        ev |= POLLRDHUP;
      if (c->parked && c->wait_deadline < next_deadline) next_deadline = c->wait_deadline;
      if (!c->authed && c->auth_deadline < next_deadline) next_deadline = c->auth_deadline;
      s->pfds[i + 2] = (struct pollfd){.fd = c->fd, .events = ev};
    }
    int timeout_ms = -1;
    if (!isinf(next_deadline)) {
      double left = TD_MIN(next_deadline - td_now(), 1e6); /* keeps the int conversion in range */
      timeout_ms = left <= 0 ? 0 : (int)ceil(left * 1000.0);
    }
    int n = poll(s->pfds, s->n_clients + 2, timeout_ms);
    if (n < 0 && errno != EINTR) {
      TD_WARN("store server: poll failed: %s", strerror(errno));
      continue;
    }
    if (n > 0) {
      if (s->pfds[0].revents) break; /* stop requested */
      size_t n_polled = s->n_clients; /* accept appends; those are polled next round */
      for (size_t i = 0; i < n_polled; i++) {
        client *c = s->clients[i];
        short re = s->pfds[i + 2].revents;
        if (!re) continue;
        if (c->lingering) {
          linger_drain(c);
          continue;
        }
        if (re & POLLOUT) flush_client(c);
        if (re & (POLLIN | POLLERR | POLLHUP)) read_client(s, c);
        /* A parked client that hung up will never read its answer. */
        if (c->parked && (re & (POLLRDHUP | POLLHUP | POLLERR))) c->dead = true;
        /* After a flush the client may have a request already buffered. */
        if (!c->dead && !c->parked && c->out_sent == c->out_len && (re & POLLOUT)) read_client(s, c);
      }
      if (s->pfds[1].revents) accept_clients(s);
    }
    double now = td_now();
    for (size_t i = 0; i < s->n_clients; i++) {
      client *c = s->clients[i];
      if (c->lingering) {
        if (c->linger_deadline <= now) c->dead = c->gone = true;
        continue;
      }
      if (!c->authed && !c->dead && c->auth_deadline <= now) {
        server_warn(s, "closed the connection from %s: no authentication within %g s (TANDEM_AUTH_TIMEOUT)",
                    c->peer, net_auth_timeout_s());
        c->dead = true;
        continue;
      }
      if (c->parked && !c->dead && c->wait_deadline <= now) {
        /* num: for a GATHER, the first index still missing */
        respond(c, STORE_RESP_TIMEOUT, 0, c->req.op == STORE_GATHER ? (int64_t)c->gather_next : 0, NULL, 0);
        reset_request(s, c);
        read_client(s, c);
      }
    }
  }
  return NULL;
}

td_status store_server_start(const char *host, int port, td_store_server **out) {
  *out = NULL;
  td_store_server *s = calloc(1, sizeof *s);
  if (!s) return td_error(TD_ERR_SYSTEM, "out of memory creating the store server");
  s->listen_fd = -1;
  s->wake_pipe[0] = s->wake_pipe[1] = -1;
  td_status st = TD_OK;
  TD_CHECK_GOTO(net_auth_init(), st, fail);
  s->max_request = td_env_size("TANDEM_STORE_MAX_REQUEST", STORE_DEFAULT_MAX_REQUEST);
  s->max_bytes = td_env_size("TANDEM_STORE_MAX_BYTES", STORE_DEFAULT_MAX_BYTES);
  long max_clients = td_env_long("TANDEM_STORE_MAX_CLIENTS", STORE_DEFAULT_MAX_CLIENTS);
  s->max_clients = max_clients > 0 ? (size_t)max_clients : STORE_DEFAULT_MAX_CLIENTS;
  if (s->max_request < 1024) s->max_request = 1024;
  if (s->max_bytes < s->max_request) s->max_bytes = s->max_request;
  s->n_buckets = 256;
  s->buckets = calloc(s->n_buckets, sizeof *s->buckets);
  if (!s->buckets) {
    st = td_error(TD_ERR_SYSTEM, "out of memory creating the store server");
    goto fail;
  }
  TD_CHECK_GOTO(net_listen(host, port, 1024, &s->listen_fd, &s->port), st, fail);
  if (net_set_nonblocking(s->listen_fd, true) != 0 || pipe2(s->wake_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    st = td_error_errno("store server setup failed");
    goto fail;
  }
  /* The server thread takes no signals: they belong to the program's own
   * threads (tandemrun forwards them to workers). */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int err = pthread_create(&s->thread, NULL, server_main, s);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (err) {
    errno = err;
    st = td_error_errno("cannot start the store server thread");
    goto fail;
  }
  s->thread_started = true;
  *out = s;
  return TD_OK;
fail:
  store_server_stop(s);
  return st;
}

int store_server_port(const td_store_server *server) { return server ? server->port : -1; }

void store_server_stop(td_store_server *s) {
  if (!s) return;
  if (s->thread_started) {
    char byte = 1;
    ssize_t w;
    TD_SYSCALL_RETRY(w, write(s->wake_pipe[1], &byte, 1));
    (void)w;
    pthread_join(s->thread, NULL);
    TD_DEBUG("store server on port %d: %" PRIu64 " requests served, at most %zu connections at once", s->port,
             s->n_requests, s->peak_clients);
  }
  for (size_t i = 0; i < s->n_clients; i++) free_client(s, s->clients[i]);
  free(s->clients);
  free(s->pfds);
  if (s->buckets) {
    for (size_t i = 0; i < s->n_buckets; i++) {
      for (entry *e = s->buckets[i], *next; e; e = next) {
        next = e->next;
        free(e->key);
        free(e->value);
        free(e);
      }
    }
    free(s->buckets);
  }
  if (s->listen_fd >= 0) close(s->listen_fd);
  if (s->wake_pipe[0] >= 0) close(s->wake_pipe[0]);
  if (s->wake_pipe[1] >= 0) close(s->wake_pipe[1]);
  free(s);
}
