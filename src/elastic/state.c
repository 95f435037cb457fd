/* The elastic state (tandem/elastic.h): registered buffers, their commits,
 * the run helper that turns a lost peer into a membership change.
 *
 * Commit: the whole buffers (td_elastic_register) are written, packed, into
 * one of two commit files (commit_file.c: unnamed files on a disk, not this
 * process's memory; in memory, ZeRO stage 0's two copies of the parameters
 * and Adam state made its peak RSS 2.1 times that without elastic
 * training, 1.04 times in files: tests/zero/zmem_elastic.sh). At stage 0
 * every rank holds the whole state, so every survivor holds a commit.
 * Sharded buffers (td_elastic_register_shard: ZeRO stages 1-3) are copied
 * too and replicated on a buddy rank (replica.c). The two newest commits
 * are kept (whole[0], whole[1]), so that the survivors can fall back to the
 * newer commit every shard survived in.
 *
 * Which commit wins after a failure: a rank may have completed step s+1
 * (its gradient allreduce finished before a peer died) and committed it
 * while another failed inside that allreduce. Every survivor describes what
 * it holds; the newest commit that some rank holds whole and whose shards
 * all survived (on their owner or its buddy) wins, and is broadcast from
 * the lowest rank holding it. That state is exactly the fault-free run's
 * (the step completed with every contribution in), so no completed step is
 * applied twice; a joining process receives everything the same way. When
 * no commit survived whole (a rank and its buddy lost together), the
 * fallback (td_elastic_set_fallback: the last disk checkpoint) is used and
 * the log says so. */
#include "elastic/elastic.h"

#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct el_buffer {
  char name[64];
  void *ptr;
  size_t bytes;
  size_t off; /* where it starts in the commit files */
} el_buffer;

struct td_elastic {
  el_membership m;
  td_comm *comm;
  el_buffer *bufs;
  int n_bufs, cap_bufs;
  int64_t commits; /* commits taken (or received): 0 = none */
  size_t whole_bytes; /* the whole buffers' bytes in all (each commit file's size) */
  el_piece whole[2];  /* the whole buffers' last two commits: [0] the newest (.commit -1: none) */
  el_replicas rep;         /* sharded buffers and their buddy replicas */
  td_elastic_fallback_fn fallback;
  void *fallback_ctx;
  bool resize_requested;
  bool from_fallback; /* td_elastic_start_from_fallback: the state registered at start is not the job's */
  int resets;
  int faults; /* epochs ended by a broken communicator (not by admitting joiners) */
  int fallbacks;
  int64_t commits_here; /* commits this process took (td_elastic_commit) */
  double commit_s;      /* time in their copies (and in waits for the previous commit's replicas) */
  double fence_s;       /* time in td_elastic_commit_wait: the replicas' exchange not done when the shards change */
  double check_s;       /* time in their join check (its allreduce waits for the slowest rank) */
  double commit_cpu_s;  /* CPU time of this thread in the copies and waits (wall time inflates under load) */
  /* The eviction watch (evict_watch): a thread parked in a store WAIT. */
  pthread_mutex_t watch_lock; /* e->comm's swap against the watch's abort; watch_members */
  pthread_t watch_thread;
  bool watch_started;
  int watch_stop;             /* __atomic */
  td_store *watch_store;
  long *watch_members;        /* uids of the epoch whose communicator e->comm is */
  int watch_n;
};

static bool abandoned(void *ctx, char *why, size_t why_size) {
  td_elastic *e = ctx;
  return el_membership_abandoned(&e->m, why, why_size);
}

static td_status build_comm(td_elastic *e) {
  pthread_mutex_lock(&e->watch_lock);
  td_comm_destroy(e->comm);
  e->comm = NULL;
  e->watch_n = 0;
  pthread_mutex_unlock(&e->watch_lock);
  char job[160];
  /* A job id per epoch: its communicator's store keys start afresh. */
  snprintf(job, sizeof job, "%s.e%d", e->m.job, e->m.epoch);
  td_comm_config cfg = {0};
  cfg.rank = e->m.rank;
  cfg.world_size = e->m.n_members;
  cfg.store = e->m.store_addr;
  cfg.job_id = job;
  cfg.abandon = abandoned;
  cfg.abandon_ctx = e;
  td_comm *comm = NULL;
  td_status st = td_comm_init_config(&cfg, &comm);
  pthread_mutex_lock(&e->watch_lock);
  e->comm = comm;
  long *mm = realloc(e->watch_members, sizeof *mm * (size_t)TD_MAX(e->m.n_members, 1));
  if (mm) {
    e->watch_members = mm;
    memcpy(mm, e->m.members, sizeof *mm * (size_t)e->m.n_members);
    e->watch_n = e->m.n_members;
  }
  pthread_mutex_unlock(&e->watch_lock);
  if (st != TD_OK) {
    char why[768];
    td_error_copy(why, sizeof why);
    return td_error(st, "elastic: building the communicator of epoch %d (%d ranks) failed: %s", e->m.epoch,
                    e->m.n_members, why);
  }
  return TD_OK;
}

/* tandemrun evicts a host whose link is lossy (docs/elastic.md, "Lossy
 * links"): it reports the host's processes dead and sets
 * <job>/el/evict/<n> to their uids. The survivors are then stuck in a step
 * with those processes, which neither heartbeats nor TCP end while half the
 * packets still get through; this thread, parked in a store WAIT for the
 * next eviction (no traffic meanwhile), breaks the epoch's communicator
 * when an evicted process is a member, and the job forms the next epoch
 * without them at once. */
static void *evict_watch(void *arg) {
  td_elastic *e = arg;
  for (int n = 1; !__atomic_load_n(&e->watch_stop, __ATOMIC_ACQUIRE);) {
    char key[200], *v = NULL;
    snprintf(key, sizeof key, "%s/el/evict/%d", e->m.job, n);
    td_status st = store_wait_str(e->watch_store, key, 3600, &v);
    if (__atomic_load_n(&e->watch_stop, __ATOMIC_ACQUIRE)) {
      free(v);
      break;
    }
    if (st == TD_ERR_TIMEOUT) continue;
    if (st != TD_OK) break; /* the store is gone: the job is ending */
    n++;
    pthread_mutex_lock(&e->watch_lock);
    bool member = false;
    for (const char *p = v; p && *p && !member;) {
      char *end;
      long uid = strtol(p, &end, 10);
      if (end == p) break;
      for (int i = 0; i < e->watch_n; i++) member |= e->watch_members[i] == uid;
      p = end;
    }
    if (member && e->comm) {
      char why[300];
      snprintf(why, sizeof why, "tandemrun evicted process%s %s: %s host's link is lossy",
               strchr(v, ' ') ? "es" : "", v, strchr(v, ' ') ? "their" : "its");
      td_log(TD_LOG_INFO, "elastic: %s: breaking off epoch %d", why, e->m.epoch);
      td_comm_abort(e->comm, why);
    }
    pthread_mutex_unlock(&e->watch_lock);
    free(v);
  }
  return NULL;
}

static void evict_watch_start(td_elastic *e) {
  if (store_connect(e->m.store_addr, 10, &e->watch_store) != TD_OK) {
    td_log(TD_LOG_WARN, "elastic: no eviction watch (%s): a host tandemrun evicts is waited for as a silent one",
           td_last_error());
    return;
  }
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  e->watch_started = pthread_create(&e->watch_thread, NULL, evict_watch, e) == 0;
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (!e->watch_started) {
    store_close(e->watch_store);
    e->watch_store = NULL;
  }
}

static void evict_watch_stop(td_elastic *e) {
  if (e->watch_started) {
    __atomic_store_n(&e->watch_stop, 1, __ATOMIC_RELEASE);
    store_interrupt(e->watch_store);
    pthread_join(e->watch_thread, NULL);
    e->watch_started = false;
  }
  store_close(e->watch_store);
  e->watch_store = NULL;
}

/* Test hook TANDEM_TEST_ELASTIC_STOP_AFTER_ROUND=UID: process UID stops
 * itself (SIGSTOP) as soon as a round it is in closes, before the epoch's
 * communicator, so that a test can kill it exactly there: the others are
 * then in a rendezvous that can never complete (tests/elastic/elastic.sh
 * abandon). */
static void test_stop_after_round(const el_membership *m) {
  if (td_env_long("TANDEM_TEST_ELASTIC_STOP_AFTER_ROUND", -1) == m->uid) raise(SIGSTOP);
}

/* The members whose silence broke this rank's communicator (heartbeats)
 * are reported, so that the round that follows closes without waiting
 * TANDEM_ELASTIC_SETTLE for them (membership.h: silent/). Best effort: an
 * unreported one costs the settle time, nothing else. */
static void report_silent(td_elastic *e) {
  int ranks[64];
  int n = td_comm_silent_ranks(e->comm, ranks, 64);
  for (int i = 0; i < n && i < 64; i++) {
    if (ranks[i] < 0 || ranks[i] >= e->m.n_members) continue;
    long uid = e->m.members[ranks[i]];
    if (el_report_silent(&e->m, uid) == TD_OK)
      td_log(TD_LOG_INFO, "elastic: epoch %d: rank %d (process %ld) fell silent: the next round goes on without "
             "waiting for it", e->m.epoch, ranks[i], uid);
  }
}

/* Membership rounds until one yields a communicator (a member may die
 * between a round's close and the communicator's rendezvous: the others
 * then abandon that rendezvous as soon as the launcher reports the death,
 * el_membership_abandoned). */
static td_status next_epoch(td_elastic *e) {
  for (int tries = 0;; tries++) {
    TD_CHECK(el_membership_next(&e->m));
    test_stop_after_round(&e->m);
    td_status st = build_comm(e);
    if (st == TD_OK) {
      td_log(TD_LOG_INFO, "elastic: process %ld is rank %d of %d in epoch %d", e->m.uid, e->m.rank, e->m.n_members,
             e->m.epoch);
      return TD_OK;
    }
    if ((st != TD_ERR_REMOTE && st != TD_ERR_TIMEOUT) || tries >= 16) return st;
    td_log(TD_LOG_WARN, "%s; trying the next epoch", td_last_error());
  }
}

td_status td_elastic_create(const void *reserved, td_elastic **out) {
  if (!out) return td_error(TD_ERR_INVALID_ARGUMENT, "td_elastic_create: out is NULL");
  *out = NULL;
  if (reserved) return td_error(TD_ERR_INVALID_ARGUMENT, "td_elastic_create: the first argument must be NULL");
  td_elastic *e = calloc(1, sizeof *e);
  if (!e) return td_error(TD_ERR_SYSTEM, "out of memory for the elastic state");
  el_piece_init(&e->whole[0]);
  el_piece_init(&e->whole[1]);
  pthread_mutex_init(&e->watch_lock, NULL);
  td_status st = el_membership_open(&e->m);
  if (st == TD_OK) st = next_epoch(e);
  if (st == TD_OK) evict_watch_start(e);
  if (st != TD_OK) {
    char why[1024];
    td_error_copy(why, sizeof why);
    td_elastic_destroy(e);
    return td_error(st, "%s", why);
  }
  *out = e;
  return TD_OK;
}

void td_elastic_destroy(td_elastic *e) {
  if (!e) return;
  int64_t threads_run = 0;
  double thread_cpu = el_rep_thread_cpu_s(&e->rep, &threads_run);
  if (e->commits_here)
    td_log(TD_LOG_INFO, "elastic: process %ld: %lld commits: %.2f ms each in copies (%.2f ms of CPU), %.2f ms "
           "waiting before the optimizer for the buddy replicas' exchange to finish, %.2f ms in the join check "
           "(waiting there for the slowest rank); %lld commit threads: %.2f ms of CPU each in the replicas' "
           "copies", e->m.uid,
           (long long)e->commits_here, 1e3 * e->commit_s / (double)e->commits_here,
           1e3 * e->commit_cpu_s / (double)e->commits_here, 1e3 * e->fence_s / (double)e->commits_here,
           1e3 * e->check_s / (double)e->commits_here, (long long)threads_run,
           threads_run ? 1e3 * thread_cpu / (double)threads_run : 0.0);
  evict_watch_stop(e);
  el_rep_free(&e->rep); /* first: a commit in flight uses the shards */
  td_comm_destroy(e->comm);
  free(e->watch_members);
  pthread_mutex_destroy(&e->watch_lock);
  el_piece_free(&e->whole[0]);
  el_piece_free(&e->whole[1]);
  free(e->bufs);
  el_membership_close(&e->m);
  free(e);
}

td_comm *td_elastic_comm(const td_elastic *e) { return e ? e->comm : NULL; }
int td_elastic_epoch(const td_elastic *e) { return e ? e->m.epoch : 0; }
int td_elastic_rank(const td_elastic *e) { return e ? e->m.rank : -1; }
int td_elastic_size(const td_elastic *e) { return e ? e->m.n_members : 0; }
long td_elastic_id(const td_elastic *e) { return e ? e->m.uid : -1; }
int td_elastic_resets(const td_elastic *e) { return e ? e->resets : 0; }

/* Every copy is in a file: what stays in memory is the shards' staging
 * chunk (the whole buffers' files are written and read in place). */
size_t td_elastic_copy_bytes(const td_elastic *e) { return e ? el_rep_staging_bytes(&e->rep) : 0; }

size_t td_elastic_copy_disk_bytes(const td_elastic *e) {
  return e ? e->whole[0].cap + e->whole[1].cap + el_rep_disk_bytes(&e->rep) : 0;
}

td_status td_elastic_register(td_elastic *e, const char *name, void *ptr, size_t bytes) {
  if (!e || !name || !*name || (!ptr && bytes))
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_elastic_register: state, a name and a buffer are required");
  if (strlen(name) >= sizeof e->bufs[0].name)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_elastic_register: name \"%.40s...\" is longer than %zu characters",
                    name, sizeof e->bufs[0].name - 1);
  for (int i = 0; i < e->n_bufs; i++) {
    if (strcmp(e->bufs[i].name, name)) continue;
    if (e->bufs[i].bytes != bytes)
      return td_error(TD_ERR_INVALID_ARGUMENT, "td_elastic_register: \"%s\" was registered with %zu bytes, now %zu",
                      name, e->bufs[i].bytes, bytes);
    e->bufs[i].ptr = ptr;
    return TD_OK;
  }
  /* the commits held cover the buffers registered when they were taken */
  if (e->commits)
    return td_error(TD_ERR_INVALID_USAGE, "td_elastic_register(\"%s\"): a new buffer after the first commit: "
                                          "register every buffer before td_elastic_run",
                    name);
  if (e->n_bufs == e->cap_bufs) {
    int cap = e->cap_bufs ? 2 * e->cap_bufs : 8;
    el_buffer *nb = realloc(e->bufs, sizeof *nb * (size_t)cap);
    if (!nb) return td_error(TD_ERR_SYSTEM, "td_elastic_register: out of memory");
    e->bufs = nb;
    e->cap_bufs = cap;
  }
  el_buffer *b = &e->bufs[e->n_bufs++];
  memset(b, 0, sizeof *b);
  td_strlcpy(b->name, name, sizeof b->name);
  b->ptr = ptr;
  b->bytes = bytes;
  b->off = e->whole_bytes;
  e->whole_bytes += bytes;
  return TD_OK;
}

td_status td_elastic_register_shard(td_elastic *e, const char *name, void *ptr, size_t elem_bytes, size_t total,
                                   size_t lo, size_t hi) {
  if (!e || !name || !*name)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_elastic_register_shard: state and a name are required");
  if (strlen(name) >= sizeof e->rep.bufs[0].name)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_elastic_register_shard: name \"%.40s...\" is too long", name);
  return el_rep_register(&e->rep, name, ptr, NULL, elem_bytes, total, lo, hi);
}

td_status td_elastic_register_shard_whole(td_elastic *e, const char *name, void *whole, size_t elem_bytes,
                                          size_t total, size_t lo, size_t hi) {
  if (!e || !name || !*name)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_elastic_register_shard_whole: state and a name are required");
  if (strlen(name) >= sizeof e->rep.bufs[0].name)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_elastic_register_shard_whole: name \"%.40s...\" is too long", name);
  if (!whole && total)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_elastic_register_shard_whole(\"%s\"): the whole array is NULL",
                    name);
  return el_rep_register(&e->rep, name, NULL, whole, elem_bytes, total, lo, hi);
}

td_status td_elastic_set_fallback(td_elastic *e, td_elastic_fallback_fn fn, void *ctx) {
  if (!e) return td_error(TD_ERR_INVALID_ARGUMENT, "td_elastic_set_fallback: state is NULL");
  e->fallback = fn;
  e->fallback_ctx = ctx;
  return TD_OK;
}

int td_elastic_fallbacks(const td_elastic *e) { return e ? e->fallbacks : 0; }
int td_elastic_faults(const td_elastic *e) { return e ? e->faults : 0; }

td_status td_elastic_start_from_fallback(td_elastic *e) {
  if (!e) return td_error(TD_ERR_INVALID_ARGUMENT, "td_elastic_start_from_fallback: state is NULL");
  if (!e->fallback)
    return td_error(TD_ERR_INVALID_USAGE, "td_elastic_start_from_fallback: no fallback to start from: call "
                                          "td_elastic_set_fallback first");
  if (e->commits)
    return td_error(TD_ERR_INVALID_USAGE, "td_elastic_start_from_fallback: the job already runs (called after "
                                          "td_elastic_run)");
  e->from_fallback = !e->m.joiner; /* a joiner receives the members' state */
  return TD_OK;
}

/* Write the registered whole buffers into commit file `slot` as commit
 * `commit`; the slot holds nothing valid until every byte is written. */
static td_status write_whole(td_elastic *e, int slot, int64_t commit) {
  el_piece *p = &e->whole[slot];
  TD_CHECK(el_piece_begin(p, 0, 0, e->whole_bytes));
  for (int i = 0; i < e->n_bufs; i++)
    if (e->bufs[i].bytes) TD_CHECK(el_piece_write(p, e->bufs[i].off, e->bufs[i].ptr, e->bufs[i].bytes));
  p->commit = commit;
  return TD_OK;
}

/* The registered whole buffers as commit `commit` into whole[0], the
 * previous whole[0] kept as whole[1] (the older file is overwritten). */
static td_status snapshot_whole(td_elastic *e, int64_t commit) {
  el_piece t = e->whole[1];
  e->whole[1] = e->whole[0];
  e->whole[0] = t;
  return write_whole(e, 0, commit);
}

/* Commit file `slot` into the registered whole buffers. */
static td_status read_whole(td_elastic *e, int slot) {
  for (int i = 0; i < e->n_bufs; i++)
    if (e->bufs[i].bytes) TD_CHECK(el_piece_read(&e->whole[slot], e->bufs[i].off, e->bufs[i].ptr, e->bufs[i].bytes));
  return TD_OK;
}

/* After the whole buffers were restored to commit `want`: this rank keeps
 * it in whole[0], so that the next commit overwrites the other file.
 * Commits newer than `want` held here are void (the numbers are taken
 * again from want + 1); `write`: the buffers came from another rank and
 * are written to the file that held `want` here, else to the older one. */
static td_status hold_whole(td_elastic *e, int64_t want, bool write) {
  for (int g = 0; g < 2; g++)
    if (e->whole[g].commit > want) e->whole[g].commit = -1;
  if (write) {
    int slot = e->whole[0].commit == want       ? 0
               : e->whole[1].commit == want     ? 1
               : e->whole[0].commit < e->whole[1].commit ? 0
                                                 : 1;
    TD_CHECK(write_whole(e, slot, want));
    /* the other file may hold `want` too, but this rank's own initial state (the first epoch), not the holder's */
    if (e->whole[1 - slot].commit == want) e->whole[1 - slot].commit = -1;
  }
  if (e->whole[0].commit != want) {
    el_piece t = e->whole[0];
    e->whole[0] = e->whole[1];
    e->whole[1] = t;
  }
  return TD_OK;
}

static void el_forget_holdings(td_elastic *e) {
  e->whole[0].commit = e->whole[1].commit = -1;
  e->rep.own[0].commit = e->rep.own[1].commit = -1;
}

static double thread_cpu_s(void) {
  struct timespec ts;
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static td_status commit_local(td_elastic *e) {
  e->commits++;
  TD_CHECK(snapshot_whole(e, e->commits));
  return el_rep_commit(&e->rep, e->comm, e->commits);
}

td_status td_elastic_commit_wait(td_elastic *e) {
  if (!e) return td_error(TD_ERR_INVALID_ARGUMENT, "td_elastic_commit_wait: state is NULL");
  double t0 = td_now();
  td_status st = el_rep_commit_wait(&e->rep, e->comm);
  e->fence_s += td_now() - t0;
  return st;
}

td_status td_elastic_commit(td_elastic *e) {
  if (!e) return td_error(TD_ERR_INVALID_ARGUMENT, "td_elastic_commit: state is NULL");
  double t0 = td_now(), c0 = thread_cpu_s();
  td_status cst = commit_local(e);
  double t1 = td_now();
  e->commit_s += t1 - t0;
  e->commit_cpu_s += thread_cpu_s() - c0;
  if (cst != TD_OK) return cst;
  /* Rank 0 alone asks the store, and everybody follows its answer, so the
   * ranks leave this epoch together or not at all. */
  int32_t pending = 0;
  if (e->m.rank == 0) {
    int p = 0;
    td_status st = el_membership_pending(&e->m, &p);
    if (st == TD_OK) st = el_report_commit(&e->m);
    if (st != TD_OK) {
      char why[768];
      td_error_copy(why, sizeof why);
      td_comm_abort(e->comm, "rank 0 lost the rendezvous store");
      return td_error(st, "elastic: rank 0 could not ask the store for joining processes: %s", why);
    }
    pending = p;
  }
  if (e->m.n_members > 1) {
    td_status st = td_allreduce(&pending, &pending, 1, TD_I32, TD_MAX, e->comm);
    if (st != TD_OK)
      return td_error(st, "elastic: rank %d: the commit of epoch %d could not reach the other ranks: %s", e->m.rank,
                      e->m.epoch, td_comm_last_error(e->comm));
  }
  e->check_s += td_now() - t1;
  e->commits_here++;
  if (pending) {
    e->resize_requested = true;
    return td_error(TD_ERR_REMOTE, "elastic: processes wait to join: epoch %d ends at commit %lld", e->m.epoch,
                    (long long)e->commits);
  }
  return TD_OK;
}

/* After a membership change: every rank describes what it holds, the
 * newest commit the survivors can rebuild is chosen (el_rep_choose), its
 * whole buffers are broadcast from the lowest rank holding them, the
 * user's reset callback re-shards (re-registering the sharded buffers),
 * the shards are moved to their new owners, and the new holdings are
 * replicated. Without a complete commit, the fallback loads the disk
 * checkpoint. See the file header. */
static td_status restore_state(td_elastic *e, td_elastic_reset_fn reset_fn, void *ctx, bool *user_failed) {
  *user_failed = false;
  TD_CHECK(el_rep_commit_wait(&e->rep, e->comm)); /* none in flight (the previous epoch's end waited for it) */
  int world = e->m.n_members, me = e->m.rank;
  size_t total = 0;
  for (int i = 0; i < e->n_bufs; i++) total += e->bufs[i].bytes;
  /* The descriptors are as long as the most pieces any rank holds (a rank
   * keeps a copy for each of its wards: el_rep_buddies). */
  int64_t v[5] = {(int64_t)total, -(int64_t)total, e->n_bufs, -(int64_t)e->n_bufs, el_rep_n_pieces(&e->rep)};
  td_status st = TD_OK;
  if (world > 1 && (st = td_allreduce(v, v, 5, TD_I64, TD_MAX, e->comm)) != TD_OK) return st;
  const int n_pieces = (int)v[4];
  const size_t stride = EL_DESC_LEN(n_pieces);
  int64_t *desc = calloc((size_t)world * stride, sizeof *desc);
  int64_t *targets = calloc((size_t)world * 2, sizeof *targets);
  if (!desc || !targets) {
    free(desc);
    free(targets);
    return td_error(TD_ERR_SYSTEM, "elastic: out of memory for the state descriptors of %d ranks", world);
  }
  int64_t *mine = desc + (size_t)me * stride;
  mine[EL_D_WHOLE0] = e->whole[0].commit;
  mine[EL_D_WHOLE1] = e->whole[1].commit;
  el_rep_describe(&e->rep, mine, n_pieces);
  if (world > 1 && (st = td_allgather(mine, desc, (size_t)world * stride, TD_I64, e->comm)) != TD_OK) goto done;
  if (v[0] != -v[1] || v[2] != -v[3]) {
    st = td_error(TD_ERR_MISMATCH, "elastic: rank %d registered %d buffers of %zu bytes in all, but another rank "
                                   "registered a different state (%lld..%lld buffers, %lld..%lld bytes): every rank "
                                   "must register the same buffers",
                  me, e->n_bufs, total, (long long)-v[3], (long long)v[2], (long long)-v[1], (long long)v[0]);
    goto done;
  }
  for (int r = 0; r < world; r++)
    if (desc[(size_t)r * stride + EL_D_ROW] != mine[EL_D_ROW] || desc[(size_t)r * stride + EL_D_TOTAL] != mine[EL_D_TOTAL]) {
      st = td_error(TD_ERR_MISMATCH, "elastic: rank %d registered sharded buffers of %lld elements (%lld bytes "
                                     "each), rank %d of %lld (%lld): every rank must register the same",
                    me, (long long)mine[EL_D_TOTAL], (long long)mine[EL_D_ROW], r,
                    (long long)desc[(size_t)r * stride + EL_D_TOTAL], (long long)desc[(size_t)r * stride + EL_D_ROW]);
      goto done;
    }
  int64_t gap_lo, gap_hi;
  int64_t chosen = el_rep_choose(desc, world, n_pieces, &gap_lo, &gap_hi);
  bool fallback = chosen < 0;
  /* The whole buffers: commit `chosen` from the lowest rank holding it;
   * on a fallback the newest one (the joiners need the global batch before
   * the reset; the disk then overwrites the rest). */
  int64_t want = chosen;
  if (fallback)
    for (int r = 0; r < world; r++)
      for (int g = 0; g < 2; g++)
        if (desc[(size_t)r * stride + g] > want) want = desc[(size_t)r * stride + g];
  int holder = -1, holder_gen = 0;
  for (int r = 0; r < world && holder < 0 && want >= 0; r++)
    for (int g = 0; g < 2 && holder < 0; g++)
      if (desc[(size_t)r * stride + g] == want) {
        holder = r;
        holder_gen = g;
      }
  /* No rank holds any commit: a job started from its disk checkpoint
   * (td_elastic_start_from_fallback) before its first commit. Every rank
   * keeps what it registered (the same configuration everywhere) and the
   * fallback below loads the rest. */
  bool none_held = fallback && holder < 0 && e->fallback;
  if (holder < 0 && !none_held) {
    st = td_error(TD_ERR_INTERNAL, "elastic: rank %d: no rank holds commit %lld", me, (long long)want);
    goto done;
  }
  if (!none_held) {
    /* The holder reads its file into the live buffers and broadcasts from
     * there; the others receive into theirs and write them to a file of
     * theirs (commit files are written whole before they count: one that
     * fails half-way holds nothing valid). */
    if (me == holder && (st = read_whole(e, holder_gen)) != TD_OK) {
      td_comm_abort(e->comm, "the holder of the elastic state could not read its commit file");
      goto done;
    }
    for (int i = 0; i < e->n_bufs && world > 1 && st == TD_OK; i++)
      if (e->bufs[i].bytes) st = td_broadcast(e->bufs[i].ptr, e->bufs[i].bytes, TD_U8, holder, e->comm);
    if (st != TD_OK) goto done;
    if ((st = hold_whole(e, want, me != holder)) != TD_OK) goto done;
    if (e->commits != want || me == 0)
      td_log(TD_LOG_INFO, "elastic: epoch %d: state of commit %lld from rank %d%s", e->m.epoch, (long long)want,
             holder, e->commits != want ? " (this rank held another)" : "");
  }
  if (reset_fn) {
    st = reset_fn(ctx, e->comm, world);
    if (st != TD_OK) {
      *user_failed = td_comm_status(e->comm) == TD_OK;
      goto done;
    }
  }
  int64_t commit = want;
  if (!fallback) {
    if (e->rep.n_bufs) {
      int64_t t2[2] = {(int64_t)e->rep.bufs[0].lo, (int64_t)e->rep.bufs[0].hi};
      memcpy(targets + 2 * me, t2, sizeof t2);
      if (world > 1 && (st = td_allgather(t2, targets, (size_t)world * 2, TD_I64, e->comm)) != TD_OK) goto done;
      size_t from_others = 0;
      double t0 = td_now();
      st = el_rep_restore(&e->rep, e->comm, desc, n_pieces, targets, chosen, &from_others);
      if (st != TD_OK) goto done;
      if (me == 0 || from_others)
        td_log(TD_LOG_INFO, "elastic: epoch %d: rank %d: sharded state of commit %lld rebuilt from the replica files "
                            "in %.1f ms (%zu of its %lld elements from other ranks' shards and buddy replicas)",
               e->m.epoch, me, (long long)chosen, 1e3 * (td_now() - t0), from_others, (long long)(t2[1] - t2[0]));
    }
  } else {
    if (!e->fallback) {
      st = td_error(TD_ERR_REMOTE, "elastic: epoch %d: elements [%lld, %lld) of the sharded state are held by no "
                                   "survivor (a rank and its buddy were both lost) and no disk checkpoint to fall "
                                   "back on was given (train-gpt: --save DIR --save-every N)",
                    e->m.epoch, (long long)gap_lo, (long long)gap_hi);
      goto done;
    }
    if (none_held)
      td_log(TD_LOG_INFO, "elastic: epoch %d: no rank holds a commit yet: the state comes from the disk checkpoint",
             e->m.epoch);
    else
      td_log(me == 0 ? TD_LOG_WARN : TD_LOG_INFO, "elastic: epoch %d: elements [%lld, %lld) of the sharded state "
             "are held by no survivor (a rank and its buddy were both lost): falling back to the disk checkpoint",
             e->m.epoch, (long long)gap_lo, (long long)gap_hi);
    st = e->fallback(e->fallback_ctx, e->comm, world);
    if (st != TD_OK) {
      char why[768];
      td_error_copy(why, sizeof why);
      st = td_error(st, "elastic: epoch %d: the disk fallback failed: %s", e->m.epoch, why);
      goto done;
    }
    /* A new commit number newer than anything held: what the disk gave. */
    commit = want < 0 ? 1 : want + 1;
    for (int r = 0; r < world; r++)
      for (int g = 0; g < 2; g++)
        if (desc[(size_t)r * stride + g] >= commit) commit = desc[(size_t)r * stride + g] + 1;
    st = snapshot_whole(e, commit);
    if (st != TD_OK) goto done;
    e->whole[1].commit = -1;
    e->fallbacks++;
  }
  e->commits = commit;
  st = el_rep_reset_holdings(&e->rep, e->comm, commit);
done:
  free(desc);
  free(targets);
  return st;
}

td_status td_elastic_run(td_elastic *e, td_elastic_train_fn train_fn, td_elastic_reset_fn reset_fn, void *ctx) {
  if (!e || !train_fn) return td_error(TD_ERR_INVALID_ARGUMENT, "td_elastic_run: state and train_fn are required");
  /* What this process holds now is its commit until the first real one:
   * every starting rank holds the same initial state; a joiner's is
   * replaced by its peers' newer commit in the sync below. */
  if (e->commits == 0) {
    TD_CHECK(commit_local(e)); /* one rank: nothing is sent yet (no buddy before the first epoch's pairing) */
    TD_CHECK(el_rep_commit_wait(&e->rep, e->comm));
    /* A process joining a running job holds only its fresh initial state:
     * it must not be taken for a commit of the job's (it would rewind the
     * job to step 0 when the survivors' own commits are incomplete). */
    if (e->m.joiner || e->from_fallback) el_forget_holdings(e);
  }
  bool fresh = true;
  for (;;) {
    if (!fresh) {
      /* Survivors (and joiners admitted now) agree on the next epoch. A
       * healthy communicator left on a resize is finalized first, so that
       * no peer sees our leaving as a failure. */
      if (e->resize_requested && td_comm_status(e->comm) == TD_OK) td_comm_finalize(e->comm);
      e->resize_requested = false;
      td_status st = next_epoch(e);
      if (st != TD_OK) return st;
      e->resets++;
    }
    fresh = false;
    bool user_failed = false;
    td_status st = restore_state(e, reset_fn, ctx, &user_failed);
    if (st == TD_OK) st = train_fn(ctx, e);
    /* The last commit's replicas complete (or, on a broken communicator,
     * stopped) before the epoch ends or the caller may free the shards. */
    if (st == TD_OK) {
      st = el_rep_end_epoch(&e->rep, e->comm, true);
    } else {
      char why[768];
      td_error_copy(why, sizeof why);
      el_rep_end_epoch(&e->rep, e->comm, e->resize_requested);
      td_error(st, "%s", why);
    }
    if (user_failed) return st; /* the reset callback's own failure */
    if (st == TD_OK) return TD_OK;
    if (!e->resize_requested && td_comm_status(e->comm) == TD_OK) return st;
    if (!e->resize_requested) {
      e->faults++;
      report_silent(e);
    }
    char why[768];
    td_error_copy(why, sizeof why);
    td_log(e->resize_requested ? TD_LOG_INFO : TD_LOG_WARN, "elastic: epoch %d (rank %d of %d) ends: %s", e->m.epoch,
           e->m.rank, e->m.n_members, why);
  }
}

/* ---- the batch split ---- */

td_status td_elastic_batch_split(long global_batch, int world, int micro_hint, int max_world, int *micro_out,
                                 int *accum_out) {
  if (global_batch < 1 || world < 1 || micro_hint < 1)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_elastic_batch_split: global batch %ld, world %d and micro-batch %d "
                                             "must be positive",
                    global_batch, world, micro_hint);
  if (global_batch % world) {
    char sizes[256] = "";
    size_t len = 0;
    int limit = max_world > 0 ? max_world : (int)TD_MIN(global_batch, 4096);
    for (int w = 1; w <= limit && len + 16 < sizeof sizes; w++)
      if (global_batch % w == 0) len += (size_t)snprintf(sizes + len, sizeof sizes - len, len ? ", %d" : "%d", w);
    return td_error(TD_ERR_INVALID_ARGUMENT, "elastic: the global batch %ld cannot be split over %d ranks; world "
                                             "sizes that keep it: %s (change --min-np/--max-np or the batch size)",
                    global_batch, world, sizes);
  }
  long per_rank = global_batch / world;
  long micro = TD_MIN((long)micro_hint, per_rank);
  while (per_rank % micro) micro--;
  if (per_rank / micro > INT_MAX)
    return td_error(TD_ERR_INVALID_ARGUMENT, "elastic: %ld micro-steps per step is too many", per_rank / micro);
  *micro_out = (int)micro;
  *accum_out = (int)(per_rank / micro);
  return TD_OK;
}
