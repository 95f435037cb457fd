/* The lossy-host rule and its sampler (src/elastic/lossy.c, net/tcp_diag.c),
 * without a lossy link (tests/faulthosts/lossy.sh has one):
 *
 *  - el_lossy_pick on every edge of the rule: the retransmission threshold
 *    (min - 1 no, min yes), the stall (stall_s - eps no, stall_s yes), a
 *    second host with retransmissions below the threshold (no verdict),
 *    two lossy hosts (the launcher's own link: none), one remote host only
 *    (no second vantage point), a clean host with no connection (no
 *    evidence), hosts with no ranks and the launcher's own host ignored,
 *    TANDEM_EVICT=0;
 *  - el_lossy_config: defaults and bad values named;
 *  - the sampler on real loopback connections: net_tcp_conns finds both
 *    ends of a connection with their peer address and a stable cookie,
 *    el_lossy_sample attributes them to the host 127.0.0.2 with no
 *    retransmission, and el_lossy_window sums exactly the samples inside
 *    (now - window, now] (synthetic samples, closed form). */
#include "elastic/lossy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../common/check.h"

static el_lossy_cfg cfg_default(void) {
  el_lossy_cfg c = {.window_s = 1.0, .min_retrans = 3, .stall_s = 1.0, .clean_s = 3.0, .on = true};
  return c;
}

static void rule_cases(void) {
  el_lossy_cfg c = cfg_default();
  char why[300];
  /* hosts: 0 launcher's own (local), 1 a, 2 b */
  for (long r = 0; r <= 6; r++) {
    el_lossy_view v[3] = {{.retrans = 50, .conns = 3, .ranks = 1, .remote = false},
                          {.retrans = 0, .conns = 2, .ranks = 2, .remote = true},
                          {.retrans = r, .conns = 2, .ranks = 2, .remote = true}};
    int got = el_lossy_pick(&c, v, 3, 5.0, why, sizeof why);
    CHECK_EQ_INT(got, r >= c.min_retrans ? 2 : -1);
    if (got == 2) CHECK(strstr(why, "retransmitted to it") != NULL);
  }
  /* The stall's edge. */
  el_lossy_view v[3] = {{.retrans = 0, .conns = 0, .ranks = 0, .remote = false},
                        {.retrans = 0, .conns = 2, .ranks = 2, .remote = true},
                        {.retrans = 9, .conns = 2, .ranks = 2, .remote = true}};
  CHECK_EQ_INT(el_lossy_pick(&c, v, 3, c.stall_s - 1e-6, why, sizeof why), -1);
  CHECK_EQ_INT(el_lossy_pick(&c, v, 3, c.stall_s, why, sizeof why), 2);
  /* The other host not clean (1 retransmission): no verdict. */
  v[1].retrans = 1;
  CHECK_EQ_INT(el_lossy_pick(&c, v, 3, 5.0, why, sizeof why), -1);
  /* Both lossy: the launcher's own link, or the whole network: none. */
  v[1].retrans = 9;
  CHECK_EQ_INT(el_lossy_pick(&c, v, 3, 5.0, why, sizeof why), -1);
  /* The clean host shows no connection: no evidence that it is clean. */
  v[1].retrans = 0;
  v[1].conns = 0;
  CHECK_EQ_INT(el_lossy_pick(&c, v, 3, 5.0, why, sizeof why), -1);
  v[1].conns = 2;
  /* Only one remote host with ranks (the other has none now). */
  v[1].ranks = 0;
  CHECK_EQ_INT(el_lossy_pick(&c, v, 3, 5.0, why, sizeof why), -1);
  v[1].ranks = 2;
  /* A lossy host with no ranks is nobody's problem; a third clean host
   * with ranks joins the clean ones. */
  el_lossy_view w[4] = {v[0], v[1], v[2], {.retrans = 0, .conns = 1, .ranks = 1, .remote = true}};
  CHECK_EQ_INT(el_lossy_pick(&c, w, 4, 5.0, why, sizeof why), 2);
  CHECK(strstr(why, "the 2 other hosts") != NULL);
  w[2].ranks = 0;
  CHECK_EQ_INT(el_lossy_pick(&c, w, 4, 5.0, why, sizeof why), -1);
  /* Off. */
  c.on = false;
  CHECK_EQ_INT(el_lossy_pick(&c, v, 3, 5.0, why, sizeof why), -1);
  /* A loaded host: no retransmissions anywhere, stalled: nobody. */
  c = cfg_default();
  el_lossy_view quiet[3] = {{0}, {.conns = 2, .ranks = 2, .remote = true}, {.conns = 2, .ranks = 2, .remote = true}};
  CHECK_EQ_INT(el_lossy_pick(&c, quiet, 3, 60.0, why, sizeof why), -1);
}

static void config_cases(void) {
  el_lossy_cfg c;
  unsetenv("TANDEM_EVICT");
  unsetenv("TANDEM_EVICT_WINDOW");
  unsetenv("TANDEM_EVICT_RETRANS");
  unsetenv("TANDEM_EVICT_STALL");
  unsetenv("TANDEM_EVICT_CLEAN");
  CHECK_OK(el_lossy_config(&c));
  CHECK(!c.on && c.window_s == 1.0 && c.min_retrans == 3 && c.stall_s == 1.0 && c.clean_s == 3.0);
  setenv("TANDEM_EVICT", "1", 1);
  CHECK_OK(el_lossy_config(&c));
  CHECK(c.on);
  setenv("TANDEM_EVICT", "0", 1);
  CHECK_OK(el_lossy_config(&c));
  CHECK(!c.on);
  setenv("TANDEM_EVICT", "yes", 1);
  CHECK_EQ_INT(el_lossy_config(&c), TD_ERR_INVALID_ARGUMENT);
  CHECK(strstr(td_last_error(), "TANDEM_EVICT='yes'") != NULL);
  unsetenv("TANDEM_EVICT");
  setenv("TANDEM_EVICT_WINDOW", "abc", 1);
  CHECK_EQ_INT(el_lossy_config(&c), TD_ERR_INVALID_ARGUMENT);
  CHECK(strstr(td_last_error(), "TANDEM_EVICT_WINDOW='abc'") != NULL);
  setenv("TANDEM_EVICT_WINDOW", "100", 1); /* longer than the samples kept */
  CHECK_EQ_INT(el_lossy_config(&c), TD_ERR_INVALID_ARGUMENT);
  setenv("TANDEM_EVICT_WINDOW", "0.5", 1);
  setenv("TANDEM_EVICT_RETRANS", "0", 1);
  CHECK_EQ_INT(el_lossy_config(&c), TD_ERR_INVALID_ARGUMENT);
  CHECK(strstr(td_last_error(), "TANDEM_EVICT_RETRANS") != NULL);
  setenv("TANDEM_EVICT_RETRANS", "7", 1);
  setenv("TANDEM_EVICT_STALL", "0", 1);
  CHECK_OK(el_lossy_config(&c));
  CHECK(c.window_s == 0.5 && c.min_retrans == 7 && c.stall_s == 0);
  unsetenv("TANDEM_EVICT_WINDOW");
  unsetenv("TANDEM_EVICT_RETRANS");
  unsetenv("TANDEM_EVICT_STALL");
}

static void sampler_cases(void) {
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  CHECK(ls >= 0);
  /* 127.0.0.2 on both ends (any 127/8 address is loopback): the host's
   * connections are this test's two alone, not whatever else on this
   * machine talks over 127.0.0.1 (one of those with 2 retransmissions
   * failed the check below once at load 8). */
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000002)};
  CHECK(bind(ls, (struct sockaddr *)&a, sizeof a) == 0);
  CHECK(listen(ls, 4) == 0);
  socklen_t len = sizeof a;
  CHECK(getsockname(ls, (struct sockaddr *)&a, &len) == 0);
  int cs = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in me = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000002)};
  CHECK(bind(cs, (struct sockaddr *)&me, sizeof me) == 0);
  CHECK(connect(cs, (struct sockaddr *)&a, sizeof a) == 0);
  int ss = accept(ls, NULL, NULL);
  CHECK(ss >= 0);
  CHECK(write(cs, "ping", 4) == 4);
  char buf[4];
  CHECK(read(ss, buf, 4) == 4);
  static net_tcp_conn c1[EL_LOSSY_MAX_CONNS], c2[EL_LOSSY_MAX_CONNS];
  int n1 = net_tcp_conns(c1, EL_LOSSY_MAX_CONNS), n2 = net_tcp_conns(c2, EL_LOSSY_MAX_CONNS);
  CHECK(n1 >= 2 && n2 >= 2);
  int local = 0, stable = 0;
  for (int i = 0; i < n1; i++) {
    if (c1[i].family != AF_INET || memcmp(c1[i].peer, &a.sin_addr, 4)) continue;
    local++;
    CHECK_EQ_INT(c1[i].total_retrans, 0);
    for (int k = 0; k < n2; k++) stable += c2[k].cookie == c1[i].cookie;
  }
  CHECK_EQ_INT(local, 2); /* both ends */
  CHECK_EQ_INT(stable, local);

  el_lossy l;
  el_lossy_init(&l);
  el_lossy_set_host(&l, 0, "127.0.0.2");
  el_lossy_set_host(&l, 1, "user@10.255.255.254");
  CHECK(l.hosts[0].resolved && l.hosts[1].resolved && l.n_hosts == 2);
  CHECK(el_lossy_sample(&l, 100.0));
  CHECK(el_lossy_sample(&l, 100.1));
  CHECK_EQ_INT(l.hosts[0].conns, 2);
  CHECK_EQ_INT(l.hosts[1].conns, 0);
  CHECK_EQ_INT(el_lossy_window(&l, 0, 100.1, 1.0), 0);
  /* A let-back's leftovers (el_lossy_forget_backlog): of host 0's
   * connections, p1 holds a timed-out segment (synthetic: no loopback
   * segment times out), p2 does not. Both "retransmit" before the next
   * sample (their previous counts lowered: the delta is what the sampler
   * adds): only p2's 7 count, and p1 is no connection of the host any more;
   * it stays set aside in every later sample (carried by its cookie). */
  int p1 = -1, p2 = -1, conns0 = l.hosts[0].conns;
  for (int p = 0; p < l.n_prev; p++)
    if (l.prev_host[p] == 0) {
      if (p1 < 0) p1 = p;
      else if (p2 < 0) p2 = p;
    }
  CHECK(p1 >= 0 && p2 >= 0);
  for (int p = 0; p < l.n_prev; p++) l.prev[p].timed_out = p == p1;
  CHECK_EQ_INT(el_lossy_forget_backlog(&l, 1), 0); /* another host's: none */
  CHECK_EQ_INT(el_lossy_forget_backlog(&l, 0), 1);
  CHECK_EQ_INT(el_lossy_forget_backlog(&l, 0), 0); /* once */
  uint64_t cookie1 = l.prev[p1].cookie;
  l.prev[p1].total_retrans -= 5;
  l.prev[p2].total_retrans -= 7;
  CHECK(el_lossy_sample(&l, 100.2));
  CHECK_EQ_INT(el_lossy_window(&l, 0, 100.2, 0.05), 7);
  CHECK_EQ_INT(l.hosts[0].conns, conns0 - 1);
  int q1 = -1;
  for (int p = 0; p < l.n_prev; p++)
    if (l.prev[p].cookie == cookie1) q1 = p;
  CHECK(q1 >= 0 && l.prev_old[q1]);
  l.prev[q1].total_retrans -= 3;
  CHECK(el_lossy_sample(&l, 100.3));
  CHECK_EQ_INT(el_lossy_window(&l, 0, 100.3, 0.05), 0);
  /* The window: synthetic samples r_k = k at t_k = 100 + 0.1 k, k = 1..30.
   * (now - w, now] with now = t_30 = 103.0 and w = 1.0 holds k = 21..30
   * (t_20 = 102.0 is on the open edge): sum 255. */
  el_lossy_host *h = &l.hosts[1];
  h->head = 0;
  h->n_samples = 0;
  for (int k = 1; k <= 30; k++) {
    h->head = (h->head + 1) % EL_LOSSY_SAMPLES;
    h->t[h->head] = 100.0 + 0.1 * k;
    h->retrans[h->head] = k;
    h->n_samples++;
  }
  CHECK_EQ_INT(el_lossy_window(&l, 1, 100.0 + 0.1 * 30, 1.0 - 1e-9), 255);
  CHECK_EQ_INT(el_lossy_window(&l, 1, 100.0 + 0.1 * 30, 0.05), 30);
  CHECK_EQ_INT(el_lossy_window(&l, 1, 100.0 + 0.1 * 30, 10.0), 465);
  el_lossy_free(&l);
  close(cs);
  close(ss);
  close(ls);
}

int main(void) {
  rule_cases();
  config_cases();
  sampler_cases();
  printf("test_lossy: the rule's edges, the config, and the sampler on loopback: ok\n");
  return 0;
}
