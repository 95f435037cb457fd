/* Membership epochs agreed through the rendezvous store (keys in
 * membership.h).
 *
 * A round forms epoch k. Every process that wants to be in it takes a join
 * slot (store ADD) and writes its uid there. The round may close once every
 * member of epoch k-1 has either joined or been reported dead (by the
 * launcher, which reaps workers), or, for a member that does neither (a
 * stopped process, a host cut off), once TANDEM_ELASTIC_SETTLE seconds have
 * passed; and only with at least min-np processes (else it keeps waiting,
 * up to TANDEM_ELASTIC_TIMEOUT, for new ones). Any participant that sees the
 * round closable writes the membership with a compare-and-set on a missing
 * key: exactly one list wins and everybody adopts it, so the survivors agree
 * even when their views of the joins differ. Ranks follow uid order, so the
 * longest-lived process is rank 0. Processes started after the job began
 * (joiners) close a round only when their own join completes it (a
 * replacement the survivors wait for, joiner_try_close); one that comes to
 * grow the job waits for the members to reach a commit, see it
 * (el_membership_pending) and admit it.
 *
 * A process that finds the round it joins closed without it is stale (it
 * was stopped or cut off past the settle time): refused with TD_ERR_REMOTE,
 * never let into a communicator of the newer epoch. A joiner that merely
 * came too late for one round tries the next. Waiting blocks in store
 * WAITs on the membership key (short slices, so that deaths reported
 * meanwhile are seen), never spins. */
#include "elastic/membership.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EL_SLICE_S 0.2 /* how often a waiting participant re-reads joins and deaths */

static long env_long_in(const char *name, long def, long lo, long hi, td_status *st) {
  const char *s = td_env_str(name, NULL);
  if (!s || !*s) return def;
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) {
    *st = td_error(TD_ERR_INVALID_ARGUMENT, "%s='%s' is not an integer in [%ld, %ld]: fix or unset it", name, s, lo,
                   hi);
    return def;
  }
  return v;
}

/* Seconds from the environment (def when unset): > 0, or >= 0 for the
 * waits where 0 means "do not wait". */
static double env_seconds(const char *name, double def, int zero_ok, td_status *st) {
  const char *s = td_env_str(name, NULL);
  if (!s || !*s) return def;
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !(zero_ok ? v >= 0 : v > 0) || v > 7 * 24 * 3600.0) {
    *st = td_error(TD_ERR_INVALID_ARGUMENT, "%s='%s' is not a number of seconds %s: fix or unset it", name, s,
                   zero_ok ? ">= 0" : "> 0");
    return def;
  }
  return v;
}

td_status el_membership_open(el_membership *m) {
  memset(m, 0, sizeof *m);
  td_status st = TD_OK;
  const char *store = td_env_str("TANDEM_STORE", NULL);
  const char *job = td_env_str("TANDEM_JOB_ID", NULL);
  if (!store || !*store || !job || !*job)
    return td_error(TD_ERR_INVALID_USAGE, "elastic training needs TANDEM_STORE and TANDEM_JOB_ID, which tandemrun "
                                          "sets: start the job with tandemrun --min-np A --max-np B");
  if (strlen(store) >= sizeof m->store_addr || strlen(job) >= sizeof m->job)
    return td_error(TD_ERR_INVALID_ARGUMENT, "TANDEM_STORE or TANDEM_JOB_ID is too long");
  td_strlcpy(m->store_addr, store, sizeof m->store_addr);
  td_strlcpy(m->job, job, sizeof m->job);
  long rank = env_long_in("TANDEM_RANK", 0, 0, 1L << 30, &st);
  m->initial_world = (int)env_long_in("TANDEM_WORLD_SIZE", 1, 1, 1L << 30, &st);
  m->uid = env_long_in("TANDEM_ELASTIC_ID", rank, 0, 1L << 40, &st);
  m->joiner = env_long_in("TANDEM_ELASTIC_JOIN", 0, 0, 1, &st) == 1;
  m->min_np = (int)env_long_in("TANDEM_ELASTIC_MIN_NP", 1, 1, 1L << 30, &st);
  m->max_np = (int)env_long_in("TANDEM_ELASTIC_MAX_NP", 1L << 30, 1, 1L << 30, &st);
  m->timeout_s = env_seconds("TANDEM_ELASTIC_TIMEOUT", 600, 0, &st);
  m->settle_s = env_seconds("TANDEM_ELASTIC_SETTLE", 10, 0, &st);
  m->replace_wait_s = env_seconds("TANDEM_ELASTIC_REPLACE_WAIT", 0.25, 1, &st);
  m->join_wait_s = env_seconds("TANDEM_ELASTIC_JOIN_WAIT", 2.0, 1, &st);
  if (st != TD_OK) return st;
  if (m->min_np > m->max_np)
    return td_error(TD_ERR_INVALID_ARGUMENT, "TANDEM_ELASTIC_MIN_NP %d exceeds TANDEM_ELASTIC_MAX_NP %d", m->min_np,
                    m->max_np);
  double connect = td_env_double("TANDEM_CONNECT_TIMEOUT", 60);
  return store_connect(m->store_addr, connect > 0 ? connect : 60, &m->store);
}

void el_membership_close(el_membership *m) {
  store_close(m->store);
  free(m->members);
  m->store = NULL;
  m->members = NULL;
}

td_status el_report_dead(td_store *store, const char *job, long uid, const char *why, long replacement) {
  char key[200], value[400];
  snprintf(key, sizeof key, "%s/el/dead/%ld", job, uid);
  snprintf(value, sizeof value, "%s\n%ld", why && *why ? why : "gone", replacement);
  return store_set_str(store, key, value);
}

td_status el_report_commit(el_membership *m) {
  char key[200];
  snprintf(key, sizeof key, "%s/el/commits", m->job);
  int64_t n = 0;
  return store_add(m->store, key, 1, &n);
}

td_status el_report_started(td_store *store, const char *job) {
  char key[200];
  snprintf(key, sizeof key, "%s/el/starts", job);
  int64_t n = 0;
  return store_add(store, key, 1, &n);
}

td_status el_report_came(td_store *store, const char *job, long uid) {
  char key[200];
  snprintf(key, sizeof key, "%s/el/came/%ld", job, uid);
  int64_t once = 0;
  TD_CHECK(store_add(store, key, 1, &once));
  if (once != 1) return TD_OK; /* the joiner and the launcher both report a joiner that ended after it came */
  snprintf(key, sizeof key, "%s/el/came", job);
  return store_add(store, key, 1, &once);
}

td_status el_report_silent(el_membership *m, long uid) {
  char key[200], value[32];
  snprintf(key, sizeof key, "%s/el/silent/%ld", m->job, uid);
  snprintf(value, sizeof value, "%d", m->epoch);
  return store_set_str(m->store, key, value);
}

/* The integer under <job>/el/<suffix> in the store (0 and !*found_out: none). */
static td_status read_int_key(el_membership *m, const char *suffix, long *out, bool *found_out) {
  char key[200];
  snprintf(key, sizeof key, "%s/el/%s", m->job, suffix);
  void *v = NULL;
  int found = 0;
  TD_CHECK(store_get(m->store, key, &v, NULL, &found));
  *found_out = found != 0;
  *out = found ? strtol(v, NULL, 10) : 0;
  free(v);
  return TD_OK;
}

/* Was uid reported silent in epoch of_epoch, the one the round replaces
 * (el_report_silent)? A report from an older epoch, after
 * which uid came back in time, does not count. */
static td_status is_silent(el_membership *m, long uid, int of_epoch, bool *silent) {
  char suffix[64];
  snprintf(suffix, sizeof suffix, "silent/%ld", uid);
  long epoch = 0;
  bool found = false;
  TD_CHECK(read_int_key(m, suffix, &epoch, &found));
  *silent = found && epoch == of_epoch;
  return TD_OK;
}

/* "<uid> <uid> ..." into a malloc'd array. */
static td_status parse_members(const char *text, long **out, int *n_out) {
  int cap = 8, n = 0;
  long *v = malloc(sizeof *v * (size_t)cap);
  if (!v) return td_error(TD_ERR_SYSTEM, "out of memory reading a membership list");
  const char *p = text;
  for (;;) {
    while (*p == ' ') p++;
    if (!*p) break;
    char *end;
    errno = 0;
    long u = strtol(p, &end, 10);
    if (errno || end == p || u < 0 || (*end && *end != ' ')) {
      free(v);
      return td_error(TD_ERR_INTERNAL, "malformed membership list \"%.80s\" in the store", text);
    }
    if (n == cap) {
      cap *= 2;
      long *nv = realloc(v, sizeof *v * (size_t)cap);
      if (!nv) {
        free(v);
        return td_error(TD_ERR_SYSTEM, "out of memory reading a membership list");
      }
      v = nv;
    }
    v[n++] = u;
    p = end;
  }
  *out = v;
  *n_out = n;
  return TD_OK;
}

static int cmp_long(const void *a, const void *b) {
  long x = *(const long *)a, y = *(const long *)b;
  return x < y ? -1 : x > y;
}

static bool contains(const long *v, int n, long u) {
  for (int i = 0; i < n; i++)
    if (v[i] == u) return true;
  return false;
}

/* The uids that took slots in round k so far and wrote them (sorted,
 * unique). A slot is written right after it is taken, so a short wait
 * covers the usual gap; a slot still empty after it is skipped: its taker
 * is slow (an old member not seen yet is not accounted for, so the round
 * waits for it anyway; a joiner not seen tries the next round) or died
 * between taking and writing it (a SIGKILL there left every later reader
 * of the round waiting for that key: the s25 eviction hang). */
#define EL_SLOT_WAIT_S 0.25
static td_status read_joins(el_membership *m, int k, long **out, int *n_out) {
  char key[200];
  snprintf(key, sizeof key, "%s/el/e%d/n", m->job, k);
  int64_t n = 0;
  TD_CHECK(store_add(m->store, key, 0, &n));
  *out = NULL;
  *n_out = 0;
  if (n <= 0) return TD_OK;
  long *v = malloc(sizeof *v * (size_t)n);
  if (!v) return td_error(TD_ERR_SYSTEM, "out of memory reading joins");
  snprintf(key, sizeof key, "%s/el/e%d/j", m->job, k);
  char **values = NULL;
  int missing = -1, c = 0;
  td_status st = store_gather(m->store, key, (int)n, EL_SLOT_WAIT_S, &values, NULL, &missing);
  if (st == TD_OK) {
    for (int64_t i = 0; i < n; i++) {
      long u = strtol(values[i], NULL, 10);
      if (!contains(v, c, u)) v[c++] = u;
    }
    free(values);
  } else if (st == TD_ERR_TIMEOUT) {
    /* Some slot is empty: read them one by one, skipping the empty ones. */
    for (int64_t i = 0; i < n; i++) {
      char slot[220];
      snprintf(slot, sizeof slot, "%s%lld", key, (long long)i);
      void *val = NULL;
      int found = 0;
      st = store_get(m->store, slot, &val, NULL, &found);
      if (st != TD_OK) break;
      if (found) {
        long u = strtol(val, NULL, 10);
        if (!contains(v, c, u)) v[c++] = u;
      } else {
        TD_DEBUG("elastic: round %d: join slot %lld was taken but is still empty after %g s: skipped", k,
                 (long long)i, EL_SLOT_WAIT_S);
      }
      free(val);
    }
  }
  if (st != TD_OK) {
    free(v);
    return st;
  }
  qsort(v, (size_t)c, sizeof *v, cmp_long);
  *out = v;
  *n_out = c;
  return TD_OK;
}

/* Is uid reported dead, and by which process was it replaced (-1: none)? */
static td_status is_dead(el_membership *m, long uid, bool *dead, long *replacement) {
  char key[200];
  snprintf(key, sizeof key, "%s/el/dead/%ld", m->job, uid);
  void *v = NULL;
  int found = 0;
  TD_CHECK(store_get(m->store, key, &v, NULL, &found));
  *dead = found != 0;
  *replacement = -1;
  const char *nl = found ? strchr((const char *)v, '\n') : NULL;
  if (nl) *replacement = strtol(nl + 1, NULL, 10);
  free(v);
  return TD_OK;
}


bool el_membership_abandoned(el_membership *m, char *why, size_t why_size) {
  long cur = 0;
  bool found = false;
  if (read_int_key(m, "cur", &cur, &found) == TD_OK && found && cur > m->epoch) {
    snprintf(why, why_size, "epoch %ld formed after epoch %d, whose communicator this was", cur, m->epoch);
    return true;
  }
  for (int i = 0; i < m->n_members; i++) {
    bool dead = false;
    long replacement = -1;
    if (m->members[i] == m->uid || is_dead(m, m->members[i], &dead, &replacement) != TD_OK || !dead) continue;
    snprintf(why, why_size, "process %ld, rank %d of epoch %d, was reported lost before it connected",
             m->members[i], i, m->epoch);
    return true;
  }
  return false;
}

/* Adopt the closed membership `text` of epoch k. */
static td_status adopt(el_membership *m, int k, const char *text, bool *in_it) {
  long *v = NULL;
  int n = 0;
  TD_CHECK(parse_members(text, &v, &n));
  int rank = -1;
  for (int i = 0; i < n; i++)
    if (v[i] == m->uid) rank = i;
  *in_it = rank >= 0;
  if (rank < 0) {
    free(v);
    return TD_OK;
  }
  free(m->members);
  m->members = v;
  m->n_members = n;
  m->rank = rank;
  m->epoch = k;
  return TD_OK;
}

/* Try to close round k with the list computed from what this process sees.
 * settled: the settle time passed (members neither joined nor reported go);
 * replace_waited: the wait for replacements passed (a lost member's
 * replacement that has not joined yet joins a later round). *closed tells
 * whether a list (ours or another's) is now in place; its text goes to
 * *text_out (malloc'd). */
static td_status try_close(el_membership *m, int k, const long *prev, int n_prev, const long *joins, int n_joins,
                           bool settled, bool replace_waited, bool *closed, char **text_out) {
  *closed = false;
  *text_out = NULL;
  /* Who is in: old members first (they hold the state and are the oldest),
   * then joiners, each group by uid; at most max_np. */
  long *in = malloc(sizeof *in * (size_t)(n_joins + 1));
  if (!in) return td_error(TD_ERR_SYSTEM, "out of memory closing a membership round");
  int n_in = 0;
  bool all_accounted = true;
  for (int i = 0; i < n_prev; i++) {
    bool dead = false, silent = false;
    long replacement = -1;
    td_status st = is_dead(m, prev[i], &dead, &replacement);
    if (st != TD_OK) {
      free(in);
      return st;
    }
    /* A process the launcher reported gone is never let in, even when it
     * still runs and took a slot: an evicted one whose kill is still on its
     * way (the round must not wait for it, nor its epoch contain it). */
    if (contains(joins, n_joins, prev[i]) && !dead) {
      if (n_in < m->max_np) in[n_in++] = prev[i];
      continue;
    }
    if (st == TD_OK && !dead) st = is_silent(m, prev[i], k - 1, &silent);
    if (st != TD_OK) {
      free(in);
      return st;
    }
    /* A lost member whose replacement is on its way counts once that one
     * joined, or once TANDEM_ELASTIC_REPLACE_WAIT passed: a replacement
     * that starts within it brings the world size back in this very round;
     * one that takes longer (a start over ssh on a loaded host takes a
     * second) joins at the next commit rather than hold every survivor. */
    if (silent) continue;
    if (!dead || (replacement >= 0 && !replace_waited && !contains(joins, n_joins, replacement)))
      all_accounted = false;
  }
  for (int i = 0; i < n_joins && n_in < m->max_np; i++) {
    if (contains(prev, n_prev, joins[i])) continue;
    bool dead = false;
    long replacement = -1;
    td_status st = is_dead(m, joins[i], &dead, &replacement);
    if (st != TD_OK) {
      free(in);
      return st;
    }
    if (!dead) in[n_in++] = joins[i];
  }
  if ((!all_accounted && !settled) || n_in < m->min_np || n_in == 0) {
    free(in);
    return TD_OK;
  }
  qsort(in, (size_t)n_in, sizeof *in, cmp_long);
  /* Old members keep their age order; uid order is age order. */
  size_t cap = (size_t)n_in * 22 + 1, len = 0;
  char *text = malloc(cap);
  if (!text) {
    free(in);
    return td_error(TD_ERR_SYSTEM, "out of memory closing a membership round");
  }
  text[0] = 0;
  for (int i = 0; i < n_in; i++) len += (size_t)snprintf(text + len, cap - len, i ? " %ld" : "%ld", in[i]);
  free(in);
  char key[200];
  snprintf(key, sizeof key, "%s/el/e%d/m", m->job, k);
  void *current = NULL;
  int swapped = 0;
  td_status st = store_cas(m->store, key, NULL, 0, text, len, &current, NULL, &swapped);
  free(text);
  if (st != TD_OK) return st;
  if (swapped) {
    char cur[32];
    snprintf(key, sizeof key, "%s/el/cur", m->job);
    snprintf(cur, sizeof cur, "%d", k);
    st = store_set_str(m->store, key, cur);
    if (st != TD_OK) {
      free(current);
      return st;
    }
    TD_DEBUG("elastic: uid %ld closed epoch %d: members %s", m->uid, k, (char *)current);
  }
  *closed = true;
  *text_out = current;
  return TD_OK;
}

/* A joiner's one look at round k right after it took its slot: if the
 * members of epoch k-1 are all in the round already (or reported gone), its
 * join may be the one the round waits for (the replacement of a lost
 * member): it closes the round itself, by the members' rule, with no wait
 * for anything it cannot see (settle time, replacements). Members still
 * training in epoch k-1 have not joined, so a joiner that comes to grow the
 * job never closes a round before they reach their commit. */
static td_status joiner_try_close(el_membership *m, int k, bool *decided, bool *in_it) {
  *decided = false;
  if (k < 2) return TD_OK;
  char key[200];
  snprintf(key, sizeof key, "%s/el/e%d/m", m->job, k - 1);
  void *v = NULL;
  int found = 0;
  TD_CHECK(store_get(m->store, key, &v, NULL, &found));
  if (!found) {
    free(v);
    return TD_OK;
  }
  long *prev = NULL;
  int n_prev = 0;
  td_status st = parse_members(v, &prev, &n_prev);
  free(v);
  if (st != TD_OK) return st;
  long *joins = NULL;
  int n_joins = 0;
  st = read_joins(m, k, &joins, &n_joins);
  bool closed = false;
  char *text = NULL;
  if (st == TD_OK) st = try_close(m, k, prev, n_prev, joins, n_joins, false, false, &closed, &text);
  free(prev);
  free(joins);
  if (st == TD_OK && closed) {
    st = adopt(m, k, text, in_it);
    *decided = true;
  }
  free(text);
  return st;
}

td_status el_membership_next(el_membership *m) {
  long cur = 0;
  bool have_cur = false;
  TD_CHECK(read_int_key(m, "cur", &cur, &have_cur));
  int k;
  if (m->joiner && m->epoch == 0)
    k = (int)cur + 1;
  else
    k = m->epoch + 1;
  if (!m->joiner || m->epoch > 0) {
    if (have_cur && cur >= k)
      return td_error(TD_ERR_REMOTE, "elastic: process %ld of epoch %d is stale: the job already formed epoch %ld "
                                     "without it (it was stopped or cut off: found silent by heartbeats, or absent past TANDEM_ELASTIC_SETTLE %g s); "
                                     "this process is refused and should exit: the launcher starts fresh workers",
                      m->uid, m->epoch, cur, m->settle_s);
  }
  /* A process the launcher reported gone (evicted with its host, whose kill
   * has not arrived yet) takes no slot: it is never let in again. */
  {
    bool dead = false;
    long replacement = -1;
    TD_CHECK(is_dead(m, m->uid, &dead, &replacement));
    if (dead) {
      char key[200];
      snprintf(key, sizeof key, "%s/el/dead/%ld", m->job, m->uid);
      char *why = NULL;
      void *v = NULL;
      int found = 0;
      if (store_get(m->store, key, &v, NULL, &found) == TD_OK && found) why = v;
      if (why && strchr(why, '\n')) *strchr(why, '\n') = '\0';
      td_status st = td_error(TD_ERR_REMOTE, "elastic: process %ld was reported gone by the launcher (%s): it is "
                              "not let into epoch %d or any later one and should exit; the launcher starts fresh "
                              "workers", m->uid, why && *why ? why : "lost", k);
      free(v);
      return st;
    }
  }
  /* The members of the epoch being replaced: for epoch 1, the processes the
   * launcher started together (uids 0 .. TANDEM_WORLD_SIZE-1). */
  long *prev = NULL;
  int n_prev = 0;
  bool own_prev = false;
  if (m->epoch > 0) {
    prev = m->members;
    n_prev = m->n_members;
  } else if (!m->joiner) {
    prev = malloc(sizeof *prev * (size_t)m->initial_world);
    if (!prev) return td_error(TD_ERR_SYSTEM, "out of memory joining");
    for (int i = 0; i < m->initial_world; i++) prev[i] = i;
    n_prev = m->initial_world;
    own_prev = true;
  }
  /* Epoch 1 waits for slow starters as long as a rendezvous would; later
   * rounds wait only the settle time for members that do not show up. */
  double settle = m->epoch == 0 ? m->timeout_s : m->settle_s;
  double t0 = td_now();
  td_status st = TD_OK;
  for (int attempt = 0;; attempt++) {
    char key[200];
    snprintf(key, sizeof key, "%s/el/e%d/n", m->job, k);
    int64_t slot = 0;
    st = store_add(m->store, key, 1, &slot);
    if (st != TD_OK) break;
    char val[32];
    snprintf(key, sizeof key, "%s/el/e%d/j%lld", m->job, k, (long long)(slot - 1));
    snprintf(val, sizeof val, "%ld", m->uid);
    st = store_set_str(m->store, key, val);
    if (st != TD_OK) break;
    /* Visible proof that a new process is in line (a test freezes the
     * members until it sees this, so the job cannot end first). */
    if (m->joiner && m->epoch == 0) {
      /* The process's age splits a grow's time into its start (exec,
       * loader, set-up) and the wait for the members (docs/launcher.md). */
      TD_INFO("elastic: process %ld waits to join epoch %d (%.3f s after the process started)", m->uid, k,
              td_process_age());
      /* No longer on its way (el_membership_pending); best effort: a
       * failure only makes the members wait TANDEM_ELASTIC_JOIN_WAIT once. */
      if (attempt == 0) (void)el_report_came(m->store, m->job, m->uid);
    }
    snprintf(key, sizeof key, "%s/el/e%d/m", m->job, k);
    bool in_it = false, decided = false;
    for (bool first = true; !decided; first = false) {
      /* The first look does not wait: the process whose join completes the
       * round (the last survivor, or the replacement the others wait for)
       * closes it at once instead of a slice later. Later slices end early
       * when the wait for a replacement runs out. */
      if (!first) {
        double slice = EL_SLICE_S, to_replace = m->replace_wait_s - (td_now() - t0);
        if (to_replace > 0 && to_replace < slice) slice = TD_MAX(to_replace, 0.01);
        void *v = NULL;
        td_status ws = store_wait(m->store, key, slice, &v, NULL);
        if (ws == TD_OK) {
          st = adopt(m, k, v, &in_it);
          free(v);
          decided = true;
          break;
        }
        if (ws != TD_ERR_TIMEOUT) {
          st = ws;
          break;
        }
      }
      double waited = td_now() - t0;
      if (m->joiner && m->epoch == 0 && first) {
        st = joiner_try_close(m, k, &decided, &in_it);
        if (st != TD_OK || decided) break;
      } else if (!m->joiner || m->epoch > 0) {
        long *joins = NULL;
        int n_joins = 0;
        st = read_joins(m, k, &joins, &n_joins);
        if (st != TD_OK) break;
        bool closed = false;
        char *text = NULL;
        st = try_close(m, k, prev, n_prev, joins, n_joins, waited >= settle, waited >= m->replace_wait_s, &closed,
                       &text);
        int n_alive = n_joins;
        /* Who the round still waits for (named in the timeout's error). */
        char absent[200] = "";
        for (int i = 0, len = 0; i < n_prev && len < (int)sizeof absent - 24; i++)
          if (!contains(joins, n_joins, prev[i]))
            len += snprintf(absent + len, sizeof absent - (size_t)len, "%s%ld", len ? " " : "", prev[i]);
        free(joins);
        if (st != TD_OK) break;
        if (closed) {
          st = adopt(m, k, text, &in_it);
          free(text);
          decided = true;
          break;
        }
        if (waited >= m->timeout_s) {
          st = td_error(TD_ERR_TIMEOUT, "elastic: only %d process%s joined epoch %d within %g s "
                                         "(TANDEM_ELASTIC_TIMEOUT), fewer than the %d that --min-np requires "
                                         "(of epoch %d's members, not joined: %s): the job cannot go on; add hosts "
                                         "or slots, or lower --min-np",
                        n_alive, n_alive == 1 ? "" : "es", k, m->timeout_s, m->min_np, k - 1,
                        *absent ? absent : "none");
          break;
        }
      } else if (waited >= m->timeout_s) {
        st = td_error(TD_ERR_TIMEOUT, "elastic: process %ld waited %g s (TANDEM_ELASTIC_TIMEOUT) to be admitted "
                                      "to epoch %d, but the members never reached a commit that admits it",
                      m->uid, m->timeout_s, k);
        break;
      }
    }
    if (st != TD_OK) break;
    if (in_it) break;
    if (!m->joiner || m->epoch > 0) {
      st = td_error(TD_ERR_REMOTE, "elastic: process %ld of epoch %d is stale: epoch %d was formed without it (it "
                                   "did not join within TANDEM_ELASTIC_SETTLE %g s); this process is refused and "
                                   "should exit",
                    m->uid, m->epoch, k, m->settle_s);
      break;
    }
    /* A joiner that came too late for round k: the next one. */
    k++;
  }
  if (own_prev) free(prev);
  return st;
}

td_status el_membership_pending(el_membership *m, int *pending) {
  char key[200];
  snprintf(key, sizeof key, "%s/el/e%d/n", m->job, m->epoch + 1);
  int64_t n = 0, starts = 0, came = 0;
  TD_CHECK(store_add(m->store, key, 0, &n));
  *pending = n > 0;
  if (!*pending) return TD_OK;
  snprintf(key, sizeof key, "%s/el/starts", m->job);
  TD_CHECK(store_add(m->store, key, 0, &starts));
  snprintf(key, sizeof key, "%s/el/came", m->job);
  TD_CHECK(store_add(m->store, key, 0, &came));
  double now = td_now();
  if (starts > came) {
    if (m->join_seen_at == 0) m->join_seen_at = now;
    if (now - m->join_seen_at < m->join_wait_s) {
      *pending = 0; /* train on: the others on their way come in the same change */
      return TD_OK;
    }
  }
  if (m->join_seen_at > 0)
    TD_DEBUG("elastic: %lld waiting process%s admitted after %.2f s of waiting for the joiners on their way (%lld "
             "still are)", (long long)n, n == 1 ? "" : "es", now - m->join_seen_at,
             (long long)(starts > came ? starts - came : 0));
  m->join_seen_at = 0;
  return TD_OK;
}
