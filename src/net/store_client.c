/* The rendezvous store client: one TCP connection, one request in flight,
 * guarded by a mutex so that any thread may call it. A wait holds the mutex
 * until it is answered, so threads that wait concurrently should each use
 * their own client. A transfer that fails half-way leaves the stream in an
 * unknown place, so the client then stays broken (sticky error) and every
 * later call fails with the first reason. */
#include "net/net.h"
#include "net/store_proto.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

struct td_store {
  pthread_mutex_t mutex;
  int fd;
  char addr[300];
  double op_timeout_s; /* transport deadline for one request, beyond any wait */
  bool broken;
  char broken_reason[1024];
  /* td_now_ns() by which the request in flight should be answered (its
   * own wait included); 0 when none is. Read without the mutex by
   * store_overdue_s. */
  _Atomic int64_t due_ns;
};

td_status store_connect(const char *addr, double timeout_s, td_store **out) {
  *out = NULL;
  if (!addr)
    return td_error(TD_ERR_INVALID_ARGUMENT, "no rendezvous store address given (set TANDEM_STORE=host:port)");
  char host[256];
  int port;
  td_status st = net_parse_addr(addr, host, sizeof host, &port);
  if (st != TD_OK) {
    char why[800];
    td_error_copy(why, sizeof why);
    return td_error(st, "bad rendezvous store address: %s (check TANDEM_STORE)", why);
  }
  if (port == 0)
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "bad rendezvous store address '%s': port 0 cannot be dialled (check TANDEM_STORE)", addr);
  int fd = -1;
  char reason[256] = "";
  double start = td_now();
  st = net_connect_reason(host, port, timeout_s, &fd, reason, sizeof reason);
  if (st == TD_ERR_INVALID_ARGUMENT)
    return td_error(st, "cannot resolve the rendezvous store host '%s' in '%s': %s (check TANDEM_STORE)", host, addr,
                    reason);
  if (st != TD_OK)
    return td_error(TD_ERR_REMOTE, "cannot reach the rendezvous store at %s after %.1f s: %s (is tandemrun running? "
                    "check TANDEM_STORE)", addr, td_now() - start, reason);
  /* Prove this process holds the job's secret, and check that the store
   * does, before a single key crosses the connection. */
  char peer[340];
  snprintf(peer, sizeof peer, "the rendezvous store at %s", addr);
  st = net_auth_connect(fd, NET_AUTH_ROLE_STORE, -1, "store", peer, td_now() + TD_MAX(timeout_s, net_auth_timeout_s()));
  if (st != TD_OK) {
    close(fd);
    return st;
  }
  td_store *s = calloc(1, sizeof *s);
  if (!s) {
    close(fd);
    return td_error(TD_ERR_SYSTEM, "out of memory creating a store client");
  }
  pthread_mutex_init(&s->mutex, NULL);
  s->fd = fd;
  td_strlcpy(s->addr, addr, sizeof s->addr);
  s->op_timeout_s = TD_MAX(timeout_s, 60.0);
  *out = s;
  return TD_OK;
}

void store_close(td_store *s) {
  if (!s) return;
  if (s->fd >= 0) close(s->fd);
  pthread_mutex_destroy(&s->mutex);
  free(s);
}

const char *store_address(const td_store *s) { return s ? s->addr : ""; }

/* Without the mutex: its holder is the thread to interrupt. shutdown() wakes
 * its poll() with an error and leaves the descriptor open until store_close,
 * so no other file can take its number meanwhile. */
void store_interrupt(td_store *s) {
  if (s && s->fd >= 0) shutdown(s->fd, SHUT_RDWR);
}

double store_overdue_s(const td_store *s) {
  if (!s) return 0;
  int64_t due = atomic_load(&((td_store *)s)->due_ns);
  if (due == 0) return 0;
  double late = (double)((int64_t)td_now_ns() - due) * 1e-9;
  return late > 0 ? late : 0;
}

td_status store_route_address(td_store *s, char *buf, size_t size) {
  pthread_mutex_lock(&s->mutex);
  td_status st = net_socket_local_address(s->fd, buf, size);
  pthread_mutex_unlock(&s->mutex);
  return st;
}

/* Mark the connection unusable and return the error with the store's address. */
static td_status mark_broken(td_store *s, td_status st, const char *what) {
  char why[512];
  td_error_copy(why, sizeof why);
  snprintf(s->broken_reason, sizeof s->broken_reason, "%s failed: %s", what, why);
  s->broken = true;
  return td_error(st, "rendezvous store at %s: %s (did tandemrun, or the rank hosting the store, exit?)", s->addr,
                  s->broken_reason);
}

/* One request/response exchange. wait_s bounds how long the server may hold
 * the answer (WAIT); negative = forever. On success *value_out (if non-NULL)
 * is malloc'd and NUL-terminated, or NULL when the response carried none. */
static td_status exchange(td_store *s, const char *what, uint32_t op, const char *key, uint32_t flags,
                          const void *a, size_t a_len, const void *b, size_t b_len, int64_t arg, double wait_s,
                          store_resp_header *resp, void **value_out) {
  if (value_out) *value_out = NULL;
  if (!s) return td_error(TD_ERR_INVALID_ARGUMENT, "%s: store is NULL", what);
  if (!key || !*key) return td_error(TD_ERR_INVALID_ARGUMENT, "%s: the key is empty", what);
  size_t key_len = strlen(key);
  if (key_len >= 512)
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: key '%.40s...' is %zu bytes; keys must be under 512", what, key,
                    key_len);
  if (a_len > STORE_MAX_VALUE || b_len > STORE_MAX_VALUE)
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s on key '%s': value of %zu bytes exceeds the 64 MiB limit", what, key,
                    TD_MAX(a_len, b_len));
  if ((a_len && !a) || (b_len && !b))
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s on key '%s': NULL value with non-zero length", what, key);

  pthread_mutex_lock(&s->mutex);
  td_status st;
  void *value = NULL;
  if (s->broken) {
    st = td_error(TD_ERR_REMOTE, "rendezvous store at %s: connection broken earlier (%s)", s->addr, s->broken_reason);
    goto done;
  }
  /* Header, key and small values go out in one send. */
  unsigned char small[STORE_REQ_HEADER + 512 + 4096];
  store_req_header h = {.op = op, .key_len = (uint32_t)key_len, .flags = flags, .a_len = a_len, .b_len = b_len,
                        .arg = arg};
  store_encode_req(small, &h);
  memcpy(small + STORE_REQ_HEADER, key, key_len);
  size_t used = STORE_REQ_HEADER + key_len;
  bool values_inline = a_len + b_len <= sizeof small - used;
  if (values_inline) {
    if (a_len) memcpy(small + used, a, a_len);
    used += a_len;
    if (b_len) memcpy(small + used, b, b_len);
    used += b_len;
  }
  double deadline = td_now() + s->op_timeout_s;
  atomic_store(&s->due_ns, wait_s < 0 || wait_s > 1e9 ? INT64_MAX : (int64_t)td_now_ns() + (int64_t)(wait_s * 1e9));
  if ((st = net_send_all(s->fd, small, used, deadline)) != TD_OK ||
      (!values_inline && a_len && (st = net_send_all(s->fd, a, a_len, deadline)) != TD_OK) ||
      (!values_inline && b_len && (st = net_send_all(s->fd, b, b_len, deadline)) != TD_OK)) {
    st = mark_broken(s, st, what);
    goto done;
  }
  double recv_deadline = wait_s < 0 ? -1.0 : td_now() + wait_s + s->op_timeout_s;
  unsigned char rh[STORE_RESP_HEADER];
  if ((st = net_recv_all(s->fd, rh, sizeof rh, recv_deadline)) != TD_OK) {
    st = mark_broken(s, st, what);
    goto done;
  }
  if (store_decode_resp(rh, resp) != 0 || resp->len > STORE_MAX_VALUE) {
    td_error(TD_ERR_REMOTE, "the reply is not from a Tandem rendezvous store (is TANDEM_STORE pointing at another "
             "service?)");
    st = mark_broken(s, TD_ERR_REMOTE, what);
    goto done;
  }
  value = malloc(resp->len + 1);
  if (!value) {
    td_error(TD_ERR_SYSTEM, "out of memory for a %" PRIu64 "-byte value", resp->len);
    st = mark_broken(s, TD_ERR_SYSTEM, what);
    goto done;
  }
  if (resp->len && (st = net_recv_all(s->fd, value, resp->len, td_now() + s->op_timeout_s)) != TD_OK) {
    free(value);
    value = NULL;
    st = mark_broken(s, st, what);
    goto done;
  }
  ((char *)value)[resp->len] = '\0';
  if (resp->status == STORE_RESP_ERROR) {
    st = td_error(TD_ERR_INVALID_USAGE, "rendezvous store at %s: %s", s->addr, (char *)value);
    free(value);
    value = NULL;
    goto done;
  }
  st = TD_OK;
done:
  atomic_store(&s->due_ns, 0);
  pthread_mutex_unlock(&s->mutex);
  if (st == TD_OK && value_out)
    *value_out = value;
  else
    free(value);
  return st;
}

td_status store_set(td_store *store, const char *key, const void *value, size_t len) {
  store_resp_header r;
  return exchange(store, "store_set", STORE_SET, key, 0, value, len, NULL, 0, 0, 0, &r, NULL);
}

td_status store_get(td_store *store, const char *key, void **value_out, size_t *len_out, int *found) {
  store_resp_header r;
  void *v = NULL;
  *value_out = NULL;
  if (len_out) *len_out = 0;
  *found = 0;
  TD_CHECK(exchange(store, "store_get", STORE_GET, key, 0, NULL, 0, NULL, 0, 0, 0, &r, &v));
  if (!(r.flags & STORE_FLAG_FOUND)) {
    free(v);
    return TD_OK;
  }
  *value_out = v;
  if (len_out) *len_out = (size_t)r.len;
  *found = 1;
  return TD_OK;
}

td_status store_wait(td_store *store, const char *key, double timeout_s, void **value_out, size_t *len_out) {
  store_resp_header r;
  void *v = NULL;
  if (value_out) *value_out = NULL;
  if (len_out) *len_out = 0;
  /* NaN or beyond a week: wait forever (the server does the same with
   * what it reads; the conversion below then stays in range). */
  if (!(timeout_s < 7 * 24 * 3600.0)) timeout_s = -1;
  int64_t ms = timeout_s < 0 ? -1 : (int64_t)(timeout_s * 1000.0 + 0.5);
  TD_CHECK(exchange(store, "store_wait", STORE_WAIT, key, 0, NULL, 0, NULL, 0, ms, timeout_s, &r, &v));
  if (r.status == STORE_RESP_TIMEOUT) {
    free(v);
    return td_error(TD_ERR_TIMEOUT,
                    "timed out after %.1f s waiting for key '%s' in the rendezvous store at %s (did every rank "
                    "start? a rank that failed before publishing it leaves the others waiting)",
                    timeout_s, key, store->addr);
  }
  if (value_out)
    *value_out = v;
  else
    free(v);
  if (len_out) *len_out = (size_t)r.len;
  return TD_OK;
}

td_status store_add(td_store *store, const char *key, int64_t delta, int64_t *result_out) {
  store_resp_header r;
  TD_CHECK(exchange(store, "store_add", STORE_ADD, key, 0, NULL, 0, NULL, 0, delta, 0, &r, NULL));
  if (result_out) *result_out = r.num;
  return TD_OK;
}

td_status store_cas(td_store *store, const char *key, const void *expected, size_t expected_len, const void *desired,
                    size_t desired_len, void **current_out, size_t *current_len, int *swapped) {
  store_resp_header r;
  void *v = NULL;
  if (current_out) *current_out = NULL;
  if (current_len) *current_len = 0;
  uint32_t flags = expected ? 0 : STORE_FLAG_EXPECT_MISSING;
  TD_CHECK(exchange(store, "store_cas", STORE_CAS, key, flags, expected, expected ? expected_len : 0, desired,
                    desired_len, 0, 0, &r, &v));
  if (swapped) *swapped = (r.flags & STORE_FLAG_SWAPPED) ? 1 : 0;
  if ((r.flags & STORE_FLAG_FOUND) && current_out) {
    *current_out = v;
    if (current_len) *current_len = (size_t)r.len;
  } else {
    free(v);
  }
  return TD_OK;
}

td_status store_delete(td_store *store, const char *key, int *existed) {
  store_resp_header r;
  TD_CHECK(exchange(store, "store_delete", STORE_DELETE, key, 0, NULL, 0, NULL, 0, 0, 0, &r, NULL));
  if (existed) *existed = (r.flags & STORE_FLAG_SWAPPED) ? 1 : 0;
  return TD_OK;
}

td_status store_set_str(td_store *store, const char *key, const char *value) {
  if (!value) return td_error(TD_ERR_INVALID_ARGUMENT, "store_set_str on key '%s': value is NULL", key ? key : "");
  return store_set(store, key, value, strlen(value));
}

td_status store_wait_str(td_store *store, const char *key, double timeout_s, char **value_out) {
  void *v = NULL;
  TD_CHECK(store_wait(store, key, timeout_s, &v, NULL));
  *value_out = v;
  return TD_OK;
}

td_status store_gather(td_store *store, const char *prefix, int n, double timeout_s, char ***values_out,
                       size_t *lens_out, int *missing_out) {
  *values_out = NULL;
  if (missing_out) *missing_out = -1;
  if (n < 1 || (unsigned)n > STORE_GATHER_MAX)
    return td_error(TD_ERR_INVALID_ARGUMENT, "store_gather on prefix '%s': count %d is outside 1..%u",
                    prefix ? prefix : "", n, (unsigned)STORE_GATHER_MAX);
  unsigned char count[STORE_GATHER_COUNT_LEN];
  td_put_le64(count, (uint64_t)n);
  int64_t ms = timeout_s < 0 ? -1 : (int64_t)(timeout_s * 1000.0 + 0.5);
  store_resp_header r;
  void *blob = NULL;
  TD_CHECK(exchange(store, "store_gather", STORE_GATHER, prefix, 0, count, sizeof count, NULL, 0, ms, timeout_s, &r,
                    &blob));
  if (r.status == STORE_RESP_TIMEOUT) {
    free(blob);
    int missing = r.num >= 0 && r.num < n ? (int)r.num : 0;
    if (missing_out) *missing_out = missing;
    return td_error(TD_ERR_TIMEOUT,
                    "timed out after %.1f s waiting for keys '%s0'..'%s%d' in the rendezvous store at %s: '%s%d' "
                    "(at least) is missing (did every rank start? a rank that failed before publishing its key "
                    "leaves the others waiting)",
                    timeout_s, prefix, prefix, n - 1, store->addr, prefix, missing);
  }
  /* n records "len u64 | bytes": check every length against the blob before
   * trusting it, then lay out n pointers and NUL-terminated copies in one
   * allocation. */
  size_t total = (size_t)r.len, off = 0, need = (size_t)n * sizeof(char *);
  for (int i = 0; i < n; i++) {
    if (off + 8 > total || td_get_le64((unsigned char *)blob + off) > total - off - 8) {
      free(blob);
      return td_error(TD_ERR_REMOTE, "rendezvous store at %s: malformed store_gather answer for prefix '%s' "
                                     "(record %d of %d overruns the %zu-byte reply)",
                      store->addr, prefix, i, n, total);
    }
    size_t len = (size_t)td_get_le64((unsigned char *)blob + off);
    off += 8 + len;
    need += len + 1;
  }
  char **values = malloc(need);
  if (!values) {
    free(blob);
    return td_error(TD_ERR_SYSTEM, "store_gather on prefix '%s': out of memory for %zu bytes", prefix, need);
  }
  char *dst = (char *)(values + n);
  off = 0;
  for (int i = 0; i < n; i++) {
    size_t len = (size_t)td_get_le64((unsigned char *)blob + off);
    off += 8;
    values[i] = dst;
    memcpy(dst, (unsigned char *)blob + off, len);
    dst[len] = '\0';
    if (lens_out) lens_out[i] = len;
    dst += len + 1;
    off += len;
  }
  free(blob);
  *values_out = values;
  return TD_OK;
}

td_status store_allgather(td_store *store, const char *prefix, int rank, int n, const void *value, size_t len,
                          double timeout_s, char ***values_out, size_t *lens_out, int *missing_out) {
  *values_out = NULL;
  if (missing_out) *missing_out = -1;
  char key[600];
  int w = snprintf(key, sizeof key, "%s%d", prefix ? prefix : "", rank);
  if (w < 0 || (size_t)w >= sizeof key)
    return td_error(TD_ERR_INVALID_ARGUMENT, "store_allgather: prefix '%.60s...' is too long", prefix);
  TD_CHECK(store_set(store, key, value, len));
  return store_gather(store, prefix, n, timeout_s, values_out, lens_out, missing_out);
}
