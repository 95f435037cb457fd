/* Which host's link loses packets, judged from the launcher's vantage
 * point (lossy.c; docs/elastic.md "Lossy links"). Private to tandemrun and
 * the tests. */
#ifndef TANDEM_ELASTIC_LOSSY_H
#define TANDEM_ELASTIC_LOSSY_H

#include "net/net.h"

#define EL_LOSSY_MAX_HOSTS 64
#define EL_LOSSY_MAX_CONNS 4096
#define EL_LOSSY_SAMPLES 64 /* per host: the window's samples (at 0.1 s, 6.4 s) */

typedef struct {
  double window_s;   /* TANDEM_EVICT_WINDOW: the window retransmissions are counted over (1 s) */
  long min_retrans;  /* TANDEM_EVICT_RETRANS: segments retransmitted to one host in the window (3) */
  double stall_s;    /* TANDEM_EVICT_STALL: the job made no store request for this long (1 s) */
  double clean_s;    /* TANDEM_EVICT_CLEAN: an evicted host's link clean this long before it may be used (3 s) */
  bool on;           /* TANDEM_EVICT (1; 0: never evict) */
} el_lossy_cfg;

/* What the rule sees of one host. */
typedef struct {
  long retrans;     /* segments retransmitted on the launcher's connections to it within the window */
  int conns;        /* connections to it seen in the window's last sample */
  int ranks;        /* processes of the job running there */
  bool remote;      /* not the launcher's own host (loopback tells nothing of a link) */
} el_lossy_view;

/* Reads the TANDEM_EVICT* variables; a bad value is an error naming it. */
td_status el_lossy_config(el_lossy_cfg *cfg);

/* The rule: the host to evict, or -1. A host is evicted when, over the
 * window, the launcher's connections to it retransmitted at least
 * min_retrans segments while those to every other remote host with ranks
 * retransmitted none (at least one such host: with one remote host there
 * is no second vantage point, and loss on every link is the launcher's own
 * link), and the job has been stalled for stall_s (stalled_s: seconds
 * since its last store request). why gets the reason. */
int el_lossy_pick(const el_lossy_cfg *cfg, const el_lossy_view *hosts, int n, double stalled_s, char *why,
                  size_t why_size);

/* The sampler: the launcher's connections, attributed to hosts by their
 * address, as retransmission counts per sample. */
typedef struct {
  int family;
  unsigned char addr[16];
  bool resolved;
  double t[EL_LOSSY_SAMPLES];
  long retrans[EL_LOSSY_SAMPLES];
  int head, n_samples;
  int conns;
} el_lossy_host;

typedef struct {
  el_lossy_host hosts[EL_LOSSY_MAX_HOSTS];
  int n_hosts;
  net_tcp_conn *prev, *cur; /* the previous sample's connections (sorted by cookie) */
  int n_prev;
  int *prev_host, *cur_host;   /* each connection's host index (-1: none) */
  bool *prev_old, *cur_old;    /* a fault's leftover (el_lossy_forget_backlog): its retransmissions do not count */
  bool sampled;
  bool broken; /* sock_diag cannot be used here: no eviction (said once) */
} el_lossy;

void el_lossy_init(el_lossy *l);
void el_lossy_free(el_lossy *l);
/* Host index i is `name` (an address or a name, resolved once). */
void el_lossy_set_host(el_lossy *l, int i, const char *name);
/* One sample at time now: false if the kernel's interface failed. */
bool el_lossy_sample(el_lossy *l, double now);
/* Host i's link was judged clean (an evicted host let back): its
 * connections that still hold segments from the fault (timed out, not yet
 * acknowledged: e.g. a killed process's store connection in back-off) are
 * leftovers; their retransmissions, which come only once the link is back,
 * never count for host i again. Returns how many were set aside. */
int el_lossy_forget_backlog(el_lossy *l, int i);
/* Host i's retransmissions in (now - window_s, now]. */
long el_lossy_window(const el_lossy *l, int i, double now, double window_s);

#endif
