/* The store's GATHER request (store_gather, store_allgather): one request
 * that waits until the n keys "<prefix>0".."<prefix><n-1>" exist and returns
 * their values in index order. Checks waiting while keys arrive in reverse
 * order, exact bytes (NUL inside, empty values), answering at once, timeouts
 * naming the first missing key, a key deleted after it was counted, bad
 * counts, and many participants exchanging values with store_allgather. */
#include "../common/check.h"
#include "net/net.h"

#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

static char g_addr[64];

static td_store *connect_or_die(void) {
  td_store *s = NULL;
  CHECK_OK(store_connect(g_addr, 5.0, &s));
  return s;
}

/* Value i: i bytes of (i + 1) with a NUL in the middle when i > 2; empty for 0. */
static size_t value_of(int i, unsigned char *buf) {
  for (int k = 0; k < i; k++) buf[k] = (unsigned char)(i + 1);
  if (i > 2) buf[i / 2] = 0;
  return (size_t)i;
}

enum { N_KEYS = 7, N_GATHERERS = 3 };

static void *gatherer(void *arg) {
  (void)arg;
  td_store *s = connect_or_die();
  char **values = NULL;
  size_t lens[N_KEYS];
  CHECK_OK(store_gather(s, "g/", N_KEYS, 10.0, &values, lens, NULL));
  for (int i = 0; i < N_KEYS; i++) {
    unsigned char want[N_KEYS];
    size_t len = value_of(i, want);
    CHECK_EQ_INT(lens[i], len);
    CHECK(memcmp(values[i], want, len) == 0);
    CHECK_EQ_INT(values[i][len], 0); /* NUL-terminated copy */
  }
  free(values);
  store_close(s);
  return NULL;
}

static void test_gather_waits(void) {
  pthread_t t[N_GATHERERS];
  for (int i = 0; i < N_GATHERERS; i++) CHECK(pthread_create(&t[i], NULL, gatherer, NULL) == 0);
  td_store *s = connect_or_die();
  /* A key that only shares the prefix must not count ("g/10" is not "g/1"). */
  CHECK_OK(store_set_str(s, "g/10", "decoy"));
  for (int i = N_KEYS - 1; i >= 0; i--) {
    unsigned char v[N_KEYS];
    size_t len = value_of(i, v);
    char key[32];
    snprintf(key, sizeof key, "g/%d", i);
    usleep(10 * 1000); /* let the gatherers park between keys */
    CHECK_OK(store_set(s, key, v, len));
  }
  for (int i = 0; i < N_GATHERERS; i++) pthread_join(t[i], NULL);
  /* All there now: answered at once. */
  double t0 = td_now();
  char **values = NULL;
  CHECK_OK(store_gather(s, "g/", N_KEYS, 5.0, &values, NULL, NULL));
  CHECK(td_now() - t0 < 1.0);
  CHECK_EQ_INT(values[1][0], 2);
  free(values);
  /* n = 1 is a plain wait. */
  CHECK_OK(store_gather(s, "g/", 1, 5.0, &values, NULL, NULL));
  CHECK_EQ_INT(values[0][0], 0);
  free(values);
  store_close(s);
}

static void test_gather_timeout(void) {
  td_store *s = connect_or_die();
  CHECK_OK(store_set_str(s, "h/0", "a"));
  CHECK_OK(store_set_str(s, "h/1", "b"));
  CHECK_OK(store_set_str(s, "h/3", "d"));
  char **values = (char **)&values;
  int missing = -1;
  double t0 = td_now();
  CHECK_STATUS(store_gather(s, "h/", 4, 0.3, &values, NULL, &missing), TD_ERR_TIMEOUT);
  double waited = td_now() - t0;
  CHECK(values == NULL);
  CHECK_EQ_INT(missing, 2);
  CHECK(waited >= 0.25 && waited < 3.0);
  CHECK(strstr(td_last_error(), "'h/2'") != NULL);
  CHECK(strstr(td_last_error(), g_addr) != NULL);
  /* zero timeout polls */
  missing = -1;
  CHECK_STATUS(store_gather(s, "h/", 4, 0, &values, NULL, &missing), TD_ERR_TIMEOUT);
  CHECK_EQ_INT(missing, 2);
  /* the connection is still good, and a count within reach succeeds */
  CHECK_OK(store_gather(s, "h/", 2, 1.0, &values, NULL, NULL));
  CHECK(!strcmp(values[0], "a") && !strcmp(values[1], "b"));
  free(values);
  /* bad counts are refused without a request */
  CHECK_STATUS(store_gather(s, "h/", 0, 1.0, &values, NULL, NULL), TD_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(store_gather(s, "h/", -3, 1.0, &values, NULL, NULL), TD_ERR_INVALID_ARGUMENT);
  CHECK_OK(store_gather(s, "h/", 1, 1.0, &values, NULL, NULL));
  free(values);
  store_close(s);
}

static atomic_int deleted_done;

static void *gather_p(void *arg) {
  (void)arg;
  td_store *s = connect_or_die();
  char **values = NULL;
  CHECK_OK(store_gather(s, "p/", 3, 10.0, &values, NULL, NULL));
  /* Only the value set after the deletion may come back for p/0. */
  CHECK(!strcmp(values[0], "second"));
  CHECK(!strcmp(values[2], "two"));
  free(values);
  atomic_store(&deleted_done, 1);
  store_close(s);
  return NULL;
}

static void test_gather_deleted_key(void) {
  td_store *s = connect_or_die();
  CHECK_OK(store_set_str(s, "p/0", "first"));
  CHECK_OK(store_set_str(s, "p/1", "one"));
  pthread_t t;
  CHECK(pthread_create(&t, NULL, gather_p, NULL) == 0);
  usleep(100 * 1000); /* parked, having counted p/0 and p/1 */
  int existed = 0;
  CHECK_OK(store_delete(s, "p/0", &existed));
  CHECK_EQ_INT(existed, 1);
  CHECK_OK(store_set_str(s, "p/2", "two"));
  usleep(200 * 1000);
  CHECK_EQ_INT(atomic_load(&deleted_done), 0); /* p/0 is missing again */
  CHECK_OK(store_set_str(s, "p/0", "second"));
  pthread_join(t, NULL);
  CHECK_EQ_INT(atomic_load(&deleted_done), 1);
  store_close(s);
}

enum { N_PARTICIPANTS = 24 };

static void *participant(void *arg) {
  int rank = (int)(intptr_t)arg;
  td_store *s = connect_or_die();
  char mine[32];
  snprintf(mine, sizeof mine, "addr-%d:%d", rank, 1000 + rank * 7);
  char **values = NULL;
  size_t lens[N_PARTICIPANTS];
  int missing = -1;
  CHECK_OK(store_allgather(s, "ag/peer/", rank, N_PARTICIPANTS, mine, strlen(mine), 10.0, &values, lens, &missing));
  for (int r = 0; r < N_PARTICIPANTS; r++) {
    char want[32];
    snprintf(want, sizeof want, "addr-%d:%d", r, 1000 + r * 7);
    CHECK(!strcmp(values[r], want));
    CHECK_EQ_INT(lens[r], strlen(want));
  }
  free(values);
  store_close(s);
  return NULL;
}

static void test_allgather(void) {
  pthread_t t[N_PARTICIPANTS];
  /* Started in reverse rank order: the last to publish completes everyone. */
  for (int r = N_PARTICIPANTS - 1; r >= 0; r--)
    CHECK(pthread_create(&t[r], NULL, participant, (void *)(intptr_t)r) == 0);
  for (int r = 0; r < N_PARTICIPANTS; r++) pthread_join(t[r], NULL);
}

int main(void) {
  td_store_server *srv = NULL;
  CHECK_OK(store_server_start("127.0.0.1", 0, &srv));
  snprintf(g_addr, sizeof g_addr, "127.0.0.1:%d", store_server_port(srv));
  test_gather_waits();
  test_gather_timeout();
  test_gather_deleted_key();
  test_allgather();
  store_server_stop(srv);
  printf("test_store_gather: all checks passed\n");
  return 0;
}
