/* A host whose link loses packets, judged by the launcher (issue 22).
 *
 * Why the launcher: the loss hits both directions, so each rank sees its
 * peers across the bad link stall and cannot tell whose link it is; a
 * per-rank rule could evict the healthy host. The launcher holds
 * connections to every host (the agents' ssh, the ranks' store
 * connections) and pings each agent every TANDEM_EVICT_PING seconds, so
 * each of those links carries traffic; the kernel counts the segments it
 * had to send again on each connection (tcpi_total_retrans, read for every
 * connection of the namespace through sock_diag, net/tcp_diag.c). A lossy
 * host's connections retransmit, a healthy host's do not, and a merely
 * loaded or slow host does not make the launcher's kernel retransmit
 * anything (its kernel still acknowledges what arrives). The rule is in
 * el_lossy_pick; thresholds are environment variables (docs/elastic.md). */
#include "elastic/lossy.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

static td_status env_seconds(const char *name, double def, bool allow_zero, double *out) {
  const char *s = td_env_str(name, NULL);
  *out = def;
  if (!s || !*s) return TD_OK;
  char *end;
  double v = strtod(s, &end);
  if (end == s || *end || !(v > 0 || (allow_zero && v == 0)) || v > 3600)
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s='%s' is not a number of seconds in (0, 3600]: fix or unset it", name,
                    s);
  *out = v;
  return TD_OK;
}

td_status el_lossy_config(el_lossy_cfg *cfg) {
  memset(cfg, 0, sizeof *cfg);
  const char *on = td_env_str("TANDEM_EVICT", NULL);
  if (on && *on && strcmp(on, "0") && strcmp(on, "1"))
    return td_error(TD_ERR_INVALID_ARGUMENT, "TANDEM_EVICT='%s' must be 1 (evict a host whose link is lossy) or 0",
                    on);
  /* Off unless asked: a 200-fault run (kinds cut, loss, kill, grow)
   * found an eviction that left the next epoch waiting for the evicted
   * processes (docs/elastic.md, "Lossy hosts are evicted"). */
  cfg->on = on && !strcmp(on, "1");
  TD_CHECK(env_seconds("TANDEM_EVICT_WINDOW", 1.0, false, &cfg->window_s));
  TD_CHECK(env_seconds("TANDEM_EVICT_STALL", 1.0, true, &cfg->stall_s));
  TD_CHECK(env_seconds("TANDEM_EVICT_CLEAN", 3.0, true, &cfg->clean_s));
  if (cfg->window_s > (EL_LOSSY_SAMPLES - 4) * 0.1)
    return td_error(TD_ERR_INVALID_ARGUMENT, "TANDEM_EVICT_WINDOW=%g is longer than the %g s of samples kept: use "
                    "at most that", cfg->window_s, (EL_LOSSY_SAMPLES - 4) * 0.1);
  const char *r = td_env_str("TANDEM_EVICT_RETRANS", NULL);
  cfg->min_retrans = 3;
  if (r && *r) {
    char *end;
    long v = strtol(r, &end, 10);
    if (end == r || *end || v < 1 || v > 1000000)
      return td_error(TD_ERR_INVALID_ARGUMENT, "TANDEM_EVICT_RETRANS='%s' must be a count of segments >= 1", r);
    cfg->min_retrans = v;
  }
  return TD_OK;
}

int el_lossy_pick(const el_lossy_cfg *cfg, const el_lossy_view *hosts, int n, double stalled_s, char *why,
                  size_t why_size) {
  if (why_size) why[0] = '\0';
  if (!cfg->on || stalled_s < cfg->stall_s) return -1;
  int lossy = -1, n_lossy = 0, n_clean = 0;
  for (int i = 0; i < n; i++) {
    if (!hosts[i].remote || hosts[i].ranks <= 0) continue;
    if (hosts[i].retrans >= cfg->min_retrans) {
      lossy = i;
      n_lossy++;
    } else if (hosts[i].retrans == 0 && hosts[i].conns > 0) {
      n_clean++;
    }
  }
  /* One lossy host, every other host with ranks clean (a host with a few
   * retransmissions below the threshold is neither: no verdict). */
  int n_with_ranks = 0;
  for (int i = 0; i < n; i++) n_with_ranks += hosts[i].remote && hosts[i].ranks > 0;
  if (n_lossy != 1 || n_clean == 0 || n_clean != n_with_ranks - 1) return -1;
  if (why_size)
    snprintf(why, why_size, "%ld segments retransmitted to it in %g s while the links to the %d other host%s "
             "retransmitted none, and the job made no progress for %.1f s", hosts[lossy].retrans, cfg->window_s,
             n_clean, n_clean == 1 ? "" : "s", stalled_s);
  return lossy;
}

void el_lossy_init(el_lossy *l) { memset(l, 0, sizeof *l); }

void el_lossy_free(el_lossy *l) {
  free(l->prev);
  free(l->cur);
  free(l->prev_host);
  free(l->cur_host);
  free(l->prev_old);
  free(l->cur_old);
  l->prev = l->cur = NULL;
  l->prev_host = l->cur_host = NULL;
  l->prev_old = l->cur_old = NULL;
}

int el_lossy_forget_backlog(el_lossy *l, int i) {
  int n = 0;
  for (int p = 0; p < l->n_prev; p++)
    if (l->prev_host[p] == i && l->prev[p].timed_out && !l->prev_old[p]) {
      l->prev_old[p] = true;
      n++;
    }
  return n;
}

void el_lossy_set_host(el_lossy *l, int i, const char *name) {
  if (i < 0 || i >= EL_LOSSY_MAX_HOSTS) return;
  el_lossy_host *h = &l->hosts[i];
  memset(h, 0, sizeof *h);
  if (i >= l->n_hosts) l->n_hosts = i + 1;
  char host[256];
  snprintf(host, sizeof host, "%s", name);
  char *at = strrchr(host, '@'); /* user@host */
  const char *hn = at ? at + 1 : host;
  if (inet_pton(AF_INET, hn, h->addr) == 1) {
    h->family = AF_INET;
    h->resolved = true;
    return;
  }
  if (inet_pton(AF_INET6, hn, h->addr) == 1) {
    h->family = AF_INET6;
    h->resolved = true;
    return;
  }
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
  if (getaddrinfo(hn, NULL, &hints, &res) != 0 || !res) return;
  if (res->ai_family == AF_INET) {
    memcpy(h->addr, &((struct sockaddr_in *)res->ai_addr)->sin_addr, 4);
    h->family = AF_INET;
    h->resolved = true;
  } else if (res->ai_family == AF_INET6) {
    memcpy(h->addr, &((struct sockaddr_in6 *)res->ai_addr)->sin6_addr, 16);
    h->family = AF_INET6;
    h->resolved = true;
  }
  freeaddrinfo(res);
}

static int by_cookie(const void *a, const void *b) {
  uint64_t x = ((const net_tcp_conn *)a)->cookie, y = ((const net_tcp_conn *)b)->cookie;
  return x < y ? -1 : x > y;
}

bool el_lossy_sample(el_lossy *l, double now) {
  if (l->broken) return false;
  if (!l->cur) l->cur = malloc(sizeof *l->cur * EL_LOSSY_MAX_CONNS);
  if (!l->prev) l->prev = malloc(sizeof *l->prev * EL_LOSSY_MAX_CONNS);
  if (!l->cur_host) l->cur_host = malloc(sizeof *l->cur_host * EL_LOSSY_MAX_CONNS);
  if (!l->prev_host) l->prev_host = malloc(sizeof *l->prev_host * EL_LOSSY_MAX_CONNS);
  if (!l->cur_old) l->cur_old = malloc(sizeof *l->cur_old * EL_LOSSY_MAX_CONNS);
  if (!l->prev_old) l->prev_old = malloc(sizeof *l->prev_old * EL_LOSSY_MAX_CONNS);
  if (!l->cur || !l->prev || !l->cur_host || !l->prev_host || !l->cur_old || !l->prev_old) return false;
  int n = net_tcp_conns(l->cur, EL_LOSSY_MAX_CONNS);
  if (n < 0) {
    l->broken = true;
    return false;
  }
  qsort(l->cur, (size_t)n, sizeof *l->cur, by_cookie);
  long delta[EL_LOSSY_MAX_HOSTS] = {0};
  int conns[EL_LOSSY_MAX_HOSTS] = {0};
  for (int c = 0, p = 0; c < n; c++) {
    const net_tcp_conn *cc = &l->cur[c];
    int h = -1;
    for (int i = 0; i < l->n_hosts && h < 0; i++)
      if (l->hosts[i].resolved && l->hosts[i].family == cc->family &&
          !memcmp(l->hosts[i].addr, cc->peer, cc->family == AF_INET ? 4 : 16))
        h = i;
    while (p < l->n_prev && l->prev[p].cookie < cc->cookie) p++;
    bool seen = p < l->n_prev && l->prev[p].cookie == cc->cookie;
    l->cur_host[c] = h;
    l->cur_old[c] = seen && l->prev_old[p];
    if (h < 0 || l->cur_old[c]) continue;
    conns[h]++;
    if (seen)
      delta[h] += (long)(cc->total_retrans - l->prev[p].total_retrans);
    else if (l->sampled)
      delta[h] += (long)cc->total_retrans; /* a connection opened since the last sample */
  }
  net_tcp_conn *t = l->prev;
  l->prev = l->cur;
  l->cur = t;
  int *th = l->prev_host;
  l->prev_host = l->cur_host;
  l->cur_host = th;
  bool *to = l->prev_old;
  l->prev_old = l->cur_old;
  l->cur_old = to;
  l->n_prev = n;
  l->sampled = true;
  for (int i = 0; i < l->n_hosts; i++) {
    el_lossy_host *h = &l->hosts[i];
    h->head = (h->head + 1) % EL_LOSSY_SAMPLES;
    h->t[h->head] = now;
    h->retrans[h->head] = delta[i] > 0 ? delta[i] : 0;
    if (h->n_samples < EL_LOSSY_SAMPLES) h->n_samples++;
    h->conns = conns[i];
  }
  return true;
}

long el_lossy_window(const el_lossy *l, int i, double now, double window_s) {
  if (i < 0 || i >= l->n_hosts) return 0;
  const el_lossy_host *h = &l->hosts[i];
  long sum = 0;
  for (int k = 0, at = h->head; k < h->n_samples; k++, at = (at + EL_LOSSY_SAMPLES - 1) % EL_LOSSY_SAMPLES) {
    if (h->t[at] <= now - window_s) break;
    sum += h->retrans[at];
  }
  return sum;
}
