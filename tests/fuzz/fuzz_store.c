/* libFuzzer harness for the rendezvous store server (src/net/store_server.c):
 * its request parsing, request handling and connection state machine, run
 * for real: one server on 127.0.0.1 for the whole run (its own thread and
 * poll loop, exactly as tandemrun runs it). Each input connects 1 to 3
 * clients, sends each its share of the input as raw request bytes while
 * reading the responses, half-closes, and reads until the server closes
 * the connection; then the keys it wrote are deleted, so that every input
 * meets an empty store.
 *
 * Input: byte 0: bits 0-1 = number of clients - 1 (mod 3), bit 2 = lock-step
 * (each client sends one request, waits for its answer or 10 ms, then the
 * next, as real clients do; otherwise all at once); with 2 or 3 clients, the
 * next 2 bytes per extra client are the length (u16 LE) of each stream but
 * the last; the rest are the streams, back to back. Every client first
 * authenticates with the job secret (net_auth_connect, as store_connect
 * does) unless bit 3 of byte 0 is set: then client 1 is a stranger whose
 * bytes meet the server's handshake.
 *
 * Oracle, besides the sanitizers:
 * - the server answers within 10 s and closes every connection once the
 *   client has half-closed (no hang, whatever the bytes);
 * - a stranger gets at most the challenge to its hello, never a response;
 * - every response is well formed (magic, status, length) and there are
 *   never more responses than requests;
 * - with one client, the answers match a model of the protocol written
 *   here from store_proto.h's table (SET/GET/WAIT/ADD/CAS/DELETE, keys up
 *   to their first NUL byte), up to the first WAIT that parks (after which
 *   timing decides) or the first request the server must refuse.
 * A violation traps, so libFuzzer keeps the input like any crash. */
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net/net.h"
#include "net/store_proto.h" /* the op numbers; GATHER where the tree has it */

#define MAX_CLIENTS 3
#define REQ_HEADER 40
#define RESP_HEADER 32
#define MAGIC 0x31534454u /* "TDS1" */
#define MAX_KEY 4096
#define MAX_VALUE (64ull << 20)
#define DEADLINE_S 10.0

static uint64_t le(const uint8_t *p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

static void fail(const char *what) {
  fprintf(stderr, "fuzz_store: contract broken: %s\n", what);
  __builtin_trap();
}

/* ---- one client's connection ---- */

typedef struct conn {
  int fd;
  const uint8_t *out;
  size_t out_len, out_sent;
  bool shut, eof;
  /* lock-step: send one request, wait for its answer (at most 10 ms: it may
   * park), then the next; otherwise everything at once */
  bool lockstep;
  size_t limit, n_sent_requests;
  double stall_until;
  uint8_t *in;
  size_t in_len, in_cap;
} conn;

static void conn_read(conn *c) {
  for (;;) {
    if (c->in_cap - c->in_len < 65536) {
      size_t cap = c->in_cap ? c->in_cap * 2 : 131072;
      uint8_t *p = realloc(c->in, cap);
      if (!p) fail("out of memory in the harness");
      c->in = p;
      c->in_cap = cap;
    }
    ssize_t n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, MSG_DONTWAIT);
    if (n > 0) {
      c->in_len += (size_t)n;
      continue;
    }
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) c->eof = true;
    return;
  }
}

/* ---- the model: what one client should get back ---- */

typedef struct model_entry {
  char key[MAX_KEY + 1];
  const uint8_t *value; /* into the input */
  size_t len;
  bool present, known;  /* known = false after an ADD or an unknowable CAS */
} model_entry;

typedef struct model {
  model_entry *e;
  size_t n, cap;
} model;

static model_entry *model_lookup(model *m, const char *key) {
  for (size_t i = 0; i < m->n; i++)
    if (strcmp(m->e[i].key, key) == 0) return &m->e[i];
  return NULL;
}

static model_entry *model_find(model *m, const char *key) {
  model_entry *found = model_lookup(m, key);
  if (found) return found;
  if (m->n == m->cap) {
    size_t cap = m->cap ? m->cap * 2 : 16;
    model_entry *p = realloc(m->e, cap * sizeof *p);
    if (!p) fail("out of memory in the harness");
    m->e = p;
    m->cap = cap;
  }
  model_entry *e = &m->e[m->n++];
  memset(e, 0, sizeof *e);
  snprintf(e->key, sizeof e->key, "%s", key);
  e->known = true; /* a fresh server holds nothing */
  return e;
}

/* Check the responses `resp` (resp_len bytes) against the requests in
 * `req` (req_len bytes) of a single client. */
static void check_single(const uint8_t *req, size_t req_len, const uint8_t *resp, size_t resp_len) {
  model m = {0};
  size_t qo = 0, ro = 0;
  char key[MAX_KEY + 1];
  bool parked = false;
  for (;;) {
    if (req_len - qo < REQ_HEADER) break; /* the connection ended mid-header */
    const uint8_t *h = req + qo;
    uint32_t op = (uint32_t)le(h + 4, 4), key_len = (uint32_t)le(h + 8, 4), flags = (uint32_t)le(h + 12, 4);
    uint64_t a_len = le(h + 16, 8), b_len = le(h + 24, 8);
    int64_t arg = (int64_t)le(h + 32, 8);
    if (le(h, 4) != MAGIC || key_len == 0 || key_len > MAX_KEY || a_len > MAX_VALUE || b_len > MAX_VALUE) break;
    if (req_len - qo - REQ_HEADER < key_len + a_len + b_len) break; /* ended mid-body */
    const uint8_t *k = h + REQ_HEADER, *a = k + key_len, *b = a + a_len;
    qo += REQ_HEADER + key_len + a_len + b_len;
    size_t klen = strnlen((const char *)k, key_len); /* the server's keys are C strings */
    memcpy(key, k, klen);
    key[klen] = '\0';

    model_entry *e = op >= 1 && op <= 6 ? model_find(&m, key) : NULL;
#ifdef STORE_GATHER_MAX
    /* GATHER (key = prefix P, value A = count n as u64): answered once P0 ..
     * P<n-1> all exist. gather_missing = the first index the model knows is
     * missing (n if none); an unknown key on the way means timing decides. */
    uint64_t gather_n = a_len == 8 ? le(a, 8) : 0, gather_missing = gather_n;
    bool gather_valid = op == STORE_GATHER && gather_n >= 1 && gather_n <= STORE_GATHER_MAX, gather_unsure = false;
    if (gather_valid) {
      char *k = malloc(klen + 24);
      if (!k) fail("out of memory in the harness");
      for (uint64_t i = 0; i < gather_n; i++) {
        if (i > m.n) { /* more keys than the model holds: this one was never written */
          gather_missing = i;
          break;
        }
        snprintf(k, klen + 24, "%s%llu", key, (unsigned long long)i);
        model_entry *g = model_lookup(&m, k);
        if (g && !g->known) {
          gather_unsure = true;
          break;
        }
        if (!g || !g->present) {
          gather_missing = i;
          break;
        }
      }
      free(k);
      if (gather_unsure || (gather_missing < gather_n && arg != 0)) {
        parked = true;
        break;
      }
    }
#endif
    /* A WAIT that may park: when (or whether) it is answered is timing. */
    if (op == 3 && (!e->known || (!e->present && arg != 0))) {
      parked = true;
      break;
    }

    /* The next response. */
    if (resp_len - ro < RESP_HEADER) fail("a complete request got no response");
    const uint8_t *r = resp + ro;
    uint32_t status = (uint32_t)le(r + 4, 4), rflags = (uint32_t)le(r + 8, 4);
    uint64_t len = le(r + 16, 8);
    const uint8_t *value = r + RESP_HEADER;
    ro += RESP_HEADER + len;

    switch (op) {
    case 1: /* SET */
      if (status != 0 || rflags != 0 || len != 0) fail("SET was not answered OK");
      e->present = e->known = true, e->value = a, e->len = a_len;
      break;
    case 2: /* GET */
      if (status != 0) fail("GET was not answered OK");
      if (!e->known) break;
      if (e->present != !!(rflags & 1)) fail("GET: found flag differs from the model");
      if (e->present && (len != e->len || memcmp(value, e->value, len) != 0)) fail("GET: value differs from the model");
      if (!e->present && len != 0) fail("GET of a missing key returned a value");
      break;
    case 3: /* WAIT */
      if (e->present) {
        if (status != 0 || !(rflags & 1) || len != e->len || memcmp(value, e->value, len) != 0)
          fail("WAIT on a present key: wrong answer");
      } else if (status != 1) {
        fail("WAIT with timeout 0 on a missing key did not time out");
      }
      break;
    case 4: /* ADD */
      if (status != 0 && status != 2) fail("ADD got neither OK nor an error");
      if (status == 2 && e->known && !e->present) fail("ADD on a missing key was refused");
      e->known = false;
      break;
    case 5: { /* CAS */
      if (status != 0) fail("CAS was not answered OK");
      if (!e->known) break;
      bool match = (flags & 1) ? !e->present : e->present && e->len == a_len && memcmp(e->value, a, a_len) == 0;
      if (match) e->present = true, e->value = b, e->len = b_len;
      if (!!(rflags & 2) != match) fail("CAS: swapped flag differs from the model");
      if (!!(rflags & 1) != e->present) fail("CAS: found flag differs from the model");
      if (e->present && (len != e->len || memcmp(value, e->value, len) != 0)) fail("CAS: value differs from the model");
      break;
    }
    case 6: /* DELETE */
      if (status != 0) fail("DELETE was not answered OK");
      if (e->known && !!(rflags & 2) != e->present) fail("DELETE: existed flag differs from the model");
      e->present = false, e->known = true;
      break;
#ifdef STORE_GATHER_MAX
    case STORE_GATHER:
      if (!gather_valid) {
        if (status != 2) fail("GATHER with a bad count was not answered with an error");
      } else if (gather_missing < gather_n) {
        if (status != 1 || (uint64_t)le(r + 24, 8) != gather_missing)
          fail("GATHER with timeout 0 did not time out at the first missing index");
      } else {
        if (status != 0 || !(rflags & 1) || le(r + 24, 8) != gather_n) fail("GATHER of present keys: wrong header");
        char *k = malloc(klen + 24);
        if (!k) fail("out of memory in the harness");
        size_t vo = 0;
        for (uint64_t i = 0; i < gather_n; i++) {
          snprintf(k, klen + 24, "%s%llu", key, (unsigned long long)i);
          const model_entry *g = model_lookup(&m, k);
          if (len - vo < 8 || le(value + vo, 8) != g->len || len - vo - 8 < g->len ||
              memcmp(value + vo + 8, g->value, g->len) != 0)
            fail("GATHER: a record differs from the model");
          vo += 8 + g->len;
        }
        if (vo != len) fail("GATHER: records longer than the values");
        free(k);
      }
      break;
#endif
    default:
      if (status != 2) fail("an unknown operation was not answered with an error");
      break;
    }
  }
  if (!parked && ro != resp_len) fail("more responses than requests");
  free(m.e);
}

/* Every response well formed; returns how many. */
static size_t check_framing(const uint8_t *resp, size_t len) {
  size_t n = 0, o = 0;
  while (o < len) {
    if (len - o < RESP_HEADER) fail("a truncated response header");
    const uint8_t *r = resp + o;
    if (le(r, 4) != MAGIC) fail("a response without the magic");
    if (le(r + 4, 4) > 2) fail("a response with an unknown status");
    uint64_t vlen = le(r + 16, 8);
    if (vlen > MAX_VALUE || vlen > len - o - RESP_HEADER) fail("a response value beyond what was sent");
    o += RESP_HEADER + vlen;
    n++;
  }
  return n;
}

/* Complete responses received so far (framing checked at the end). */
static size_t complete_responses(const uint8_t *resp, size_t len) {
  size_t n = 0, o = 0;
  while (len - o >= RESP_HEADER) {
    uint64_t vlen = le(resp + o + 16, 8);
    if (vlen > len - o - RESP_HEADER) break;
    o += RESP_HEADER + vlen;
    n++;
  }
  return n;
}

/* Whether a complete request (header and body, as framed by its lengths)
 * starts at `o`; if so *end is where it ends. */
static bool request_span(const uint8_t *req, size_t len, size_t o, size_t *end) {
  if (len - o < REQ_HEADER) return false;
  size_t room = len - o - REQ_HEADER;
  uint64_t key_len = le(req + o + 8, 4), a_len = le(req + o + 16, 8), b_len = le(req + o + 24, 8);
  if (key_len > room || a_len > room || b_len > room || key_len + a_len + b_len > room) return false;
  *end = o + REQ_HEADER + key_len + a_len + b_len;
  return true;
}

/* How far lock-step may send from `o`: to the end of the request there, or
 * everything if it is not complete. */
static size_t send_limit(const uint8_t *req, size_t len, size_t o) {
  size_t end;
  return request_span(req, len, o, &end) ? end : len;
}

/* Requests in a stream, as the server frames them (bounded by the stream). */
static size_t count_requests(const uint8_t *req, size_t len) {
  size_t n = 0, o = 0, end;
  for (; request_span(req, len, o, &end); o = end) n++;
  return n;
}

/* One server for the whole run: starting one costs milliseconds (a thread,
 * under ASan), several times the rest of an input. forget_keys() empties
 * it after each input, so that every input meets an empty store, as the
 * model assumes, and replays alone exactly as it ran. */
static td_store_server *server;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  /* A job secret as tandemrun would hand it out (any 32+ bytes). */
  setenv("TANDEM_SECRET", "fuzz-store-0123456789abcdef0123456789abcdef", 1);
  if (store_server_start("127.0.0.1", 0, &server) != TD_OK) fail(td_last_error());
  return 0;
}

/* Prove the job secret as store_connect does. */
static void authenticate(int fd) {
  if (net_auth_connect(fd, NET_AUTH_ROLE_STORE, -1, "store", "the fuzzed store", td_now() + 5.0) != TD_OK)
    fail(td_last_error());
}

/* Delete every key the complete requests of a stream named (the server ran
 * exactly those), through a connection of its own. */
static void forget_keys(int port, const uint8_t *req, size_t len) {
  int fd;
  if (net_connect("127.0.0.1", port, 5.0, &fd) != TD_OK) fail(td_last_error());
  authenticate(fd);
  static uint8_t msg[REQ_HEADER + MAX_KEY];
  uint8_t resp[RESP_HEADER];
  size_t o = 0, end;
  while (request_span(req, len, o, &end)) {
    uint32_t key_len = (uint32_t)le(req + o + 8, 4);
    if (le(req + o, 4) != MAGIC || key_len == 0 || key_len > MAX_KEY || le(req + o + 16, 8) > MAX_VALUE ||
        le(req + o + 24, 8) > MAX_VALUE)
      break; /* the server dropped the connection here */
    memset(msg, 0, REQ_HEADER);
    for (int i = 0; i < 4; i++) {
      msg[i] = (uint8_t)(MAGIC >> (8 * i));
      msg[4 + i] = (uint8_t)(6u >> (8 * i)); /* DELETE */
      msg[8 + i] = (uint8_t)(key_len >> (8 * i));
    }
    memcpy(msg + REQ_HEADER, req + o + REQ_HEADER, key_len);
    if (net_send_all(fd, msg, REQ_HEADER + key_len, td_now() + 5.0) != TD_OK ||
        net_recv_all(fd, resp, RESP_HEADER, td_now() + 5.0) != TD_OK || le(resp + 16, 8) != 0)
      fail("the store did not answer a DELETE while emptying it");
    o = end;
  }
  close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  int n_clients = 1 + (data[0] & 3) % MAX_CLIENTS;
  bool lockstep = data[0] & 4;
  bool stranger = data[0] & 8;
  conn c[MAX_CLIENTS];
  memset(c, 0, sizeof c);
  size_t pos = 1 + (size_t)(n_clients - 1) * 2;
  if (pos > size) pos = size;
  for (int i = 0; i < n_clients; i++) {
    size_t len = size - pos;
    if (i < n_clients - 1 && 1 + 2 * (size_t)i + 2 <= size && (size_t)le(data + 1 + 2 * i, 2) < len)
      len = (size_t)le(data + 1 + 2 * i, 2);
    c[i].out = data + pos, c[i].out_len = len;
    c[i].lockstep = lockstep;
    c[i].limit = lockstep ? send_limit(c[i].out, len, 0) : len;
    pos += len;
  }

  int port = store_server_port(server);
  for (int i = 0; i < n_clients; i++) {
    if (net_connect("127.0.0.1", port, 5.0, &c[i].fd) != TD_OK) fail(td_last_error());
    /* The first client of a "stranger" input skips the handshake: its bytes
     * meet the server's authentication instead of its request parser. */
    if (!(stranger && i == 0)) authenticate(c[i].fd);
    net_set_nonblocking(c[i].fd, true);
  }

  double deadline = td_now() + DEADLINE_S;
  for (;;) {
    struct pollfd p[MAX_CLIENTS];
    int open = 0;
    double now = td_now();
    bool stepping = false;
    for (int i = 0; i < n_clients; i++) {
      conn *k = &c[i];
      if (k->lockstep && k->out_sent == k->limit && k->limit < k->out_len) {
        /* This request is out: next one once it is answered, or after 10 ms. */
        if (k->stall_until == 0) k->stall_until = now + 0.01, k->n_sent_requests++;
        if (complete_responses(k->in, k->in_len) >= k->n_sent_requests) {
          k->limit = send_limit(k->out, k->out_len, k->limit);
          k->stall_until = 0;
        } else if (now > k->stall_until) {
          k->lockstep = false; /* parked: the server reads no more anyway */
          k->limit = k->out_len;
        } else {
          stepping = true;
        }
      }
      if (!k->shut && k->out_sent == k->out_len) {
        shutdown(k->fd, SHUT_WR);
        k->shut = true;
      }
      bool can_send = !k->shut && k->out_sent < k->limit;
      p[i] = (struct pollfd){.fd = k->eof ? -1 : k->fd, .events = (short)(POLLIN | (can_send ? POLLOUT : 0))};
      open += !k->eof;
    }
    if (!open) break;
    double left = deadline - now;
    if (left <= 0) fail("the server neither answered nor closed a connection within 10 s");
    poll(p, (nfds_t)n_clients, stepping ? 5 : (int)(left * 1000) + 1);
    for (int i = 0; i < n_clients; i++) {
      conn *k = &c[i];
      if (k->eof) continue;
      if (!k->shut && k->out_sent < k->limit && (p[i].revents & POLLOUT)) {
        ssize_t n = send(k->fd, k->out + k->out_sent, k->limit - k->out_sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) k->out_sent += (size_t)n;
        else if (n < 0 && errno != EAGAIN && errno != EINTR) k->out_sent = k->out_len; /* dropped by the server */
      }
      if (p[i].revents & (POLLIN | POLLHUP | POLLERR)) conn_read(k);
    }
  }

  if (stranger) {
    /* All a stranger may get: the challenge to a well-formed hello (36
     * bytes), never a store response; then the connection closes. */
    if (c[0].in_len != 0 && !(c[0].in_len == NET_AUTH_MSG_BYTES && le(c[0].in, 4) == NET_AUTH_MAGIC))
      fail("an unauthenticated client got more than a challenge");
    c[0].in_len = 0, c[0].out_len = 0;
  }
  for (int i = 0; i < n_clients; i++) {
    size_t answers = check_framing(c[i].in, c[i].in_len);
    if (answers > count_requests(c[i].out, c[i].out_len)) fail("more responses than requests");
  }
  if (n_clients == 1 && !stranger) check_single(c[0].out, c[0].out_len, c[0].in, c[0].in_len);

  for (int i = 0; i < n_clients; i++) {
    close(c[i].fd);
    free(c[i].in);
  }
  for (int i = stranger ? 1 : 0; i < n_clients; i++) forget_keys(port, c[i].out, c[i].out_len);
  return 0;
}
