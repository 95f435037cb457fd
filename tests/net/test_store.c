/* The rendezvous store: a server on loopback and several client threads.
 * Checks each operation's semantics, that waits park and wake, that counters
 * are exact under contention, that large values survive, that broken and
 * hostile clients do not disturb the others, and that unreachable or malformed
 * addresses fail fast with a message naming the address. */
#include "../common/check.h"
#include "net/net.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

static char g_addr[64];

static td_store *connect_or_die(void) {
  td_store *s = NULL;
  CHECK_OK(store_connect(g_addr, 5.0, &s));
  return s;
}

static void test_set_get_missing(void) {
  td_store *s = connect_or_die();
  CHECK(strcmp(store_address(s), g_addr) == 0);
  CHECK_OK(store_set_str(s, "alpha", "one"));
  void *v = NULL;
  size_t len = 0;
  int found = -1;
  CHECK_OK(store_get(s, "alpha", &v, &len, &found));
  CHECK_EQ_INT(found, 1);
  CHECK_EQ_INT(len, 3);
  CHECK(strcmp(v, "one") == 0);
  free(v);
  /* overwrite, including with an empty value */
  CHECK_OK(store_set(s, "alpha", "", 0));
  CHECK_OK(store_get(s, "alpha", &v, &len, &found));
  CHECK_EQ_INT(found, 1);
  CHECK_EQ_INT(len, 0);
  CHECK(v != NULL && ((char *)v)[0] == '\0');
  free(v);
  CHECK_OK(store_get(s, "no-such-key", &v, &len, &found));
  CHECK_EQ_INT(found, 0);
  CHECK(v == NULL);
  CHECK_EQ_INT(len, 0);
  /* bad arguments are refused client-side, without breaking the connection */
  CHECK_STATUS(store_set_str(s, "", "x"), TD_ERR_INVALID_ARGUMENT);
  char long_key[600];
  memset(long_key, 'k', sizeof long_key - 1);
  long_key[sizeof long_key - 1] = '\0';
  CHECK_STATUS(store_set_str(s, long_key, "x"), TD_ERR_INVALID_ARGUMENT);
  CHECK_OK(store_get(s, "alpha", &v, &len, &found));
  CHECK_EQ_INT(found, 1);
  free(v);
  store_close(s);
}

static void *delayed_setter(void *arg) {
  const char *key = arg;
  td_store *s = connect_or_die();
  usleep(150 * 1000);
  CHECK_OK(store_set_str(s, key, "arrived"));
  store_close(s);
  return NULL;
}

static void *delayed_adder(void *arg) {
  const char *key = arg;
  td_store *s = connect_or_die();
  usleep(100 * 1000);
  int64_t r;
  CHECK_OK(store_add(s, key, 41, &r));
  CHECK_EQ_INT(r, 41);
  store_close(s);
  return NULL;
}

static void test_wait(void) {
  td_store *s = connect_or_die();
  pthread_t t;
  pthread_create(&t, NULL, delayed_setter, "late-key");
  double t0 = td_now();
  char *v = NULL;
  CHECK_OK(store_wait_str(s, "late-key", 5.0, &v));
  double waited = td_now() - t0;
  CHECK(strcmp(v, "arrived") == 0);
  CHECK(waited >= 0.1 && waited < 3.0);
  free(v);
  pthread_join(t, NULL);
  /* a key that exists already returns at once */
  t0 = td_now();
  CHECK_OK(store_wait_str(s, "late-key", 5.0, &v));
  CHECK(td_now() - t0 < 1.0);
  free(v);
  /* an add wakes a waiter too */
  pthread_create(&t, NULL, delayed_adder, "counter-wake");
  CHECK_OK(store_wait_str(s, "counter-wake", 5.0, &v));
  CHECK(strcmp(v, "41") == 0);
  free(v);
  pthread_join(t, NULL);
  /* timeout: TD_ERR_TIMEOUT naming the key, after about the timeout */
  t0 = td_now();
  void *raw = NULL;
  CHECK_STATUS(store_wait(s, "never-set-key", 0.3, &raw, NULL), TD_ERR_TIMEOUT);
  waited = td_now() - t0;
  CHECK(raw == NULL);
  CHECK(waited >= 0.25 && waited < 3.0);
  CHECK(strstr(td_last_error(), "never-set-key") != NULL);
  CHECK(strstr(td_last_error(), g_addr) != NULL);
  /* zero timeout polls */
  CHECK_STATUS(store_wait(s, "never-set-key", 0, &raw, NULL), TD_ERR_TIMEOUT);
  /* the connection is still good after timeouts */
  CHECK_OK(store_wait_str(s, "late-key", 1.0, &v));
  free(v);
  store_close(s);
}

enum { N_ADD_THREADS = 8, N_ADDS = 1000, N_SHARED_THREADS = 4, N_SHARED_ADDS = 250 };

static void *adder_own_client(void *arg) {
  (void)arg;
  td_store *s = connect_or_die();
  for (int i = 0; i < N_ADDS; i++) CHECK_OK(store_add(s, "total", 1, NULL));
  store_close(s);
  return NULL;
}

static void *adder_shared_client(void *arg) {
  td_store *s = arg;
  for (int i = 0; i < N_SHARED_ADDS; i++) {
    int64_t r;
    CHECK_OK(store_add(s, "shared-total", 2, &r));
    CHECK(r > 0 && r % 2 == 0);
  }
  return NULL;
}

static void test_add(void) {
  pthread_t t[N_ADD_THREADS];
  for (int i = 0; i < N_ADD_THREADS; i++) pthread_create(&t[i], NULL, adder_own_client, NULL);
  for (int i = 0; i < N_ADD_THREADS; i++) pthread_join(t[i], NULL);
  td_store *s = connect_or_die();
  int64_t total = -1;
  CHECK_OK(store_add(s, "total", 0, &total));
  CHECK_EQ_INT(total, N_ADD_THREADS * N_ADDS);
  /* one client shared by several threads (its mutex) */
  pthread_t u[N_SHARED_THREADS];
  for (int i = 0; i < N_SHARED_THREADS; i++) pthread_create(&u[i], NULL, adder_shared_client, s);
  for (int i = 0; i < N_SHARED_THREADS; i++) pthread_join(u[i], NULL);
  CHECK_OK(store_add(s, "shared-total", 0, &total));
  CHECK_EQ_INT(total, 2 * N_SHARED_THREADS * N_SHARED_ADDS);
  /* negative deltas and the decimal form visible to get */
  CHECK_OK(store_add(s, "neg", -5, &total));
  CHECK_EQ_INT(total, -5);
  char *v = NULL;
  CHECK_OK(store_wait_str(s, "neg", 1.0, &v));
  CHECK(strcmp(v, "-5") == 0);
  free(v);
  /* adding to a non-integer value is an error that names the key */
  CHECK_OK(store_set_str(s, "text", "hello"));
  CHECK_STATUS(store_add(s, "text", 1, &total), TD_ERR_INVALID_USAGE);
  CHECK(strstr(td_last_error(), "text") != NULL);
  CHECK_OK(store_add(s, "neg", 5, &total)); /* connection still usable */
  CHECK_EQ_INT(total, 0);
  store_close(s);
}

static void test_cas(void) {
  td_store *s = connect_or_die();
  void *cur = NULL;
  size_t len = 0;
  int swapped = -1;
  /* expected "missing" on a missing key: swaps */
  CHECK_OK(store_cas(s, "leader", NULL, 0, "r0", 2, &cur, &len, &swapped));
  CHECK_EQ_INT(swapped, 1);
  CHECK(cur && len == 2 && memcmp(cur, "r0", 2) == 0);
  free(cur);
  /* again: the key exists now, so no swap; current value returned */
  CHECK_OK(store_cas(s, "leader", NULL, 0, "r1", 2, &cur, &len, &swapped));
  CHECK_EQ_INT(swapped, 0);
  CHECK(cur && len == 2 && memcmp(cur, "r0", 2) == 0);
  free(cur);
  /* wrong expected value: no swap */
  CHECK_OK(store_cas(s, "leader", "r9", 2, "r1", 2, &cur, &len, &swapped));
  CHECK_EQ_INT(swapped, 0);
  CHECK(memcmp(cur, "r0", 2) == 0);
  free(cur);
  /* a prefix is not equal */
  CHECK_OK(store_cas(s, "leader", "r", 1, "r1", 2, &cur, &len, &swapped));
  CHECK_EQ_INT(swapped, 0);
  free(cur);
  /* right expected value: swaps */
  CHECK_OK(store_cas(s, "leader", "r0", 2, "r1", 2, &cur, &len, &swapped));
  CHECK_EQ_INT(swapped, 1);
  CHECK(len == 2 && memcmp(cur, "r1", 2) == 0);
  free(cur);
  /* expected a value on a missing key: no swap, nothing current */
  CHECK_OK(store_cas(s, "absent", "x", 1, "y", 1, &cur, &len, &swapped));
  CHECK_EQ_INT(swapped, 0);
  CHECK(cur == NULL);
  CHECK_EQ_INT(len, 0);
  store_close(s);
}

static void test_delete(void) {
  td_store *s = connect_or_die();
  int existed = -1;
  CHECK_OK(store_set_str(s, "doomed", "x"));
  CHECK_OK(store_delete(s, "doomed", &existed));
  CHECK_EQ_INT(existed, 1);
  CHECK_OK(store_delete(s, "doomed", &existed));
  CHECK_EQ_INT(existed, 0);
  void *v;
  size_t len;
  int found;
  CHECK_OK(store_get(s, "doomed", &v, &len, &found));
  CHECK_EQ_INT(found, 0);
  int64_t r;
  CHECK_OK(store_add(s, "doomed", 3, &r)); /* a deleted counter restarts from 0 */
  CHECK_EQ_INT(r, 3);
  store_close(s);
}

static void test_large_value(void) {
  td_store *s = connect_or_die();
  size_t n = 8u << 20;
  unsigned char *big = malloc(n);
  for (size_t i = 0; i < n; i++) big[i] = (unsigned char)(i * 2654435761u >> 13);
  CHECK_OK(store_set(s, "big", big, n));
  void *v = NULL;
  size_t len = 0;
  CHECK_OK(store_wait(s, "big", 5.0, &v, &len));
  CHECK_EQ_INT(len, n);
  CHECK(memcmp(v, big, n) == 0);
  free(v);
  int found;
  CHECK_OK(store_get(s, "big", &v, &len, &found));
  CHECK(found == 1 && len == n && memcmp(v, big, n) == 0);
  free(v);
  /* over the limit: refused before sending, connection still fine */
  CHECK_STATUS(store_set(s, "huge", big, (64u << 20) + 1), TD_ERR_INVALID_ARGUMENT);
  CHECK_OK(store_delete(s, "big", NULL));
  free(big);
  store_close(s);
}

/* Clients that die mid-message, send garbage, or just sit there must not
 * disturb the server. */
static void test_hostile_clients(void) {
  char host[64];
  int port;
  CHECK_OK(net_parse_addr(g_addr, host, sizeof host, &port));
  enum { N_IDLE = 200 };
  int idle[N_IDLE];
  for (int i = 0; i < N_IDLE; i++) CHECK_OK(net_connect(host, port, 5.0, &idle[i]));
  /* half a header, then gone */
  int fd;
  CHECK_OK(net_connect(host, port, 5.0, &fd));
  unsigned char junk[64];
  memset(junk, 0x54, sizeof junk);
  memcpy(junk, "TDS1", 4);
  CHECK_OK(net_send_all(fd, junk, 17, td_now() + 2));
  close(fd);
  /* garbage header: the server hangs up on it */
  CHECK_OK(net_connect(host, port, 5.0, &fd));
  memset(junk, 0xEE, sizeof junk);
  CHECK_OK(net_send_all(fd, junk, sizeof junk, td_now() + 2));
  char byte;
  CHECK_STATUS(net_recv_all(fd, &byte, 1, td_now() + 5), TD_ERR_REMOTE);
  close(fd);
  /* everybody else still gets served */
  td_store *s = connect_or_die();
  int64_t r;
  CHECK_OK(store_add(s, "after-hostile", 1, &r));
  CHECK_EQ_INT(r, 1);
  for (int i = 0; i < N_IDLE; i++) close(idle[i]);
  store_close(s);
}

static void *parked_then_abandoned(void *arg) {
  td_store *s = arg;
  void *v;
  /* The main thread shuts this client's socket down while parked. */
  td_status st = store_wait(s, "abandoned-key", 10.0, &v, NULL);
  CHECK(st != TD_OK);
  return NULL;
}

static void test_abandoned_waiter(void) {
  td_store *s = connect_or_die();
  pthread_t t;
  pthread_create(&t, NULL, parked_then_abandoned, s);
  usleep(100 * 1000);
  /* Cut the parked client's connection as a dying process would: it is the
   * only socket of this process connected to the store's port right now. */
  for (int fd = 3; fd < 1024; fd++) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) != 0) continue;
    int p = ntohs(((struct sockaddr_in *)&ss)->sin_port);
    char host[64];
    int port;
    net_parse_addr(g_addr, host, sizeof host, &port);
    if (p == port) shutdown(fd, SHUT_RDWR);
  }
  pthread_join(t, NULL);
  store_close(s);
  td_store *s2 = connect_or_die();
  CHECK_OK(store_set_str(s2, "abandoned-key", "late"));
  char *v;
  CHECK_OK(store_wait_str(s2, "abandoned-key", 1.0, &v));
  CHECK(strcmp(v, "late") == 0);
  free(v);
  store_close(s2);
}

/* Running out of file descriptors: the server stops accepting for a moment
 * (instead of spinning) and serves again once descriptors are free. */
static void test_out_of_fds(void) {
  char host[64];
  int port;
  CHECK_OK(net_parse_addr(g_addr, host, sizeof host, &port));
  struct rlimit old;
  CHECK(getrlimit(RLIMIT_NOFILE, &old) == 0);
  int probe = dup(0);
  CHECK(probe >= 0);
  close(probe);
  struct rlimit low = old;
  low.rlim_cur = (rlim_t)probe + 40;
  CHECK(setrlimit(RLIMIT_NOFILE, &low) == 0);
  enum { MAX_FDS = 200 };
  int fds[MAX_FDS], n_fds = 0;
  /* Client and server share this process's limit, so the server's accept
   * hits EMFILE as soon as the clients have taken every descriptor. */
  while (n_fds < MAX_FDS && net_connect(host, port, 0, &fds[n_fds]) == TD_OK) n_fds++;
  CHECK(n_fds > 0 && n_fds < MAX_FDS);
  usleep(300 * 1000); /* the server meets EMFILE and pauses accepting */
  for (int i = 0; i < n_fds; i++) close(fds[i]);
  CHECK(setrlimit(RLIMIT_NOFILE, &old) == 0);
  td_store *s = NULL;
  double t0 = td_now();
  CHECK_OK(store_connect(g_addr, 5.0, &s));
  int64_t r;
  CHECK_OK(store_add(s, "after-emfile", 1, &r));
  CHECK_EQ_INT(r, 1);
  CHECK(td_now() - t0 < 3.0);
  store_close(s);
}

static void test_bad_addresses(void) {
  const char *bad[] = {"", "nohost", "host:", "host:99999", "host:12ab", "[::1", "[::1]", "[::1]80", "::1:80",
                       ":80", "a b:1", "[]:80"};
  char host[64];
  int port;
  for (size_t i = 0; i < TD_ARRAY_SIZE(bad); i++) {
    CHECK_STATUS(net_parse_addr(bad[i], host, sizeof host, &port), TD_ERR_INVALID_ARGUMENT);
    double t0 = td_now();
    td_store *s = NULL;
    CHECK_STATUS(store_connect(bad[i], 5.0, &s), TD_ERR_INVALID_ARGUMENT);
    CHECK(s == NULL);
    CHECK(td_now() - t0 < 1.0);
    CHECK(strstr(td_last_error(), "TANDEM_STORE") != NULL);
    if (bad[i][0]) CHECK(strstr(td_last_error(), bad[i]) != NULL);
  }
  CHECK_OK(net_parse_addr("[::1]:29500", host, sizeof host, &port));
  CHECK(strcmp(host, "::1") == 0);
  CHECK_EQ_INT(port, 29500);
  CHECK_OK(net_parse_addr("node-7.example.org:1", host, sizeof host, &port));
  CHECK(strcmp(host, "node-7.example.org") == 0);
  CHECK_EQ_INT(port, 1);
  char tiny[4];
  CHECK_STATUS(net_parse_addr("longhost:1", tiny, sizeof tiny, &port), TD_ERR_INVALID_ARGUMENT);
  /* a name that does not resolve fails at once */
  td_store *s = NULL;
  double t0 = td_now();
  CHECK(store_connect("no-such-host.invalid:29500", 5.0, &s) != TD_OK);
  CHECK(td_now() - t0 < 4.0);
  CHECK(strstr(td_last_error(), "no-such-host.invalid") != NULL);
}

static void test_unreachable(void) {
  td_store *s = NULL;
  double t0 = td_now();
  CHECK_STATUS(store_connect("127.0.0.1:1", 1.0, &s), TD_ERR_REMOTE);
  double took = td_now() - t0;
  CHECK(s == NULL);
  CHECK(took >= 0.9 && took < 3.0);
  const char *msg = td_last_error();
  CHECK(strstr(msg, "127.0.0.1:1") != NULL);
  CHECK(strstr(msg, "refused") != NULL);
  CHECK(strstr(msg, "TANDEM_STORE") != NULL);
}

static void *start_server_later(void *arg) {
  int port = *(int *)arg;
  usleep(300 * 1000);
  td_store_server *srv = NULL;
  CHECK_OK(store_server_start("127.0.0.1", port, &srv));
  return srv;
}

/* A client started before its server connects once the server appears. */
static void test_connect_retries(void) {
  int fd, port;
  CHECK_OK(net_listen("127.0.0.1", 0, 1, &fd, &port));
  close(fd); /* a port that was free a moment ago */
  pthread_t t;
  pthread_create(&t, NULL, start_server_later, &port);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  td_store *s = NULL;
  CHECK_OK(store_connect(addr, 5.0, &s));
  CHECK_OK(store_set_str(s, "k", "v"));
  void *srv;
  pthread_join(t, &srv);
  /* the server going away: later calls fail with TD_ERR_REMOTE, then stay failed */
  store_server_stop(srv);
  int found;
  void *v;
  size_t len;
  CHECK_STATUS(store_get(s, "k", &v, &len, &found), TD_ERR_REMOTE);
  CHECK(strstr(td_last_error(), addr) != NULL);
  CHECK_STATUS(store_get(s, "k", &v, &len, &found), TD_ERR_REMOTE);
  store_close(s);
}

static void test_ipv6(void) {
  td_store_server *srv = NULL;
  if (store_server_start("::1", 0, &srv) != TD_OK) {
    fprintf(stderr, "note: no IPv6 loopback here, skipping the [::1] check (%s)\n", td_last_error());
    return;
  }
  char addr[64];
  snprintf(addr, sizeof addr, "[::1]:%d", store_server_port(srv));
  td_store *s = NULL;
  CHECK_OK(store_connect(addr, 5.0, &s));
  int64_t r;
  CHECK_OK(store_add(s, "v6", 7, &r));
  CHECK_EQ_INT(r, 7);
  store_close(s);
  store_server_stop(srv);
}

int main(void) {
  td_store_server *srv = NULL;
  CHECK_OK(store_server_start("127.0.0.1", 0, &srv));
  CHECK(store_server_port(srv) > 0);
  snprintf(g_addr, sizeof g_addr, "127.0.0.1:%d", store_server_port(srv));
  test_set_get_missing();
  test_wait();
  test_add();
  test_cas();
  test_delete();
  test_large_value();
  test_hostile_clients();
  test_abandoned_waiter();
  test_out_of_fds();
  test_bad_addresses();
  test_unreachable();
  test_connect_retries();
  test_ipv6();
  store_server_stop(srv);
  store_server_stop(NULL);
  store_close(NULL);
  printf("test_store: all checks passed\n");
  return 0;
}
