/* The elastic state (tandem/elastic.h): registered buffers, the in-memory
 * commit, the run helper that turns a lost peer into a membership change.
 *
 * Commit: one memcpy per buffer into this process's shadow copy. At ZeRO
 * stage 0 every rank holds the whole state, so every survivor holds a
 * commit; replicas of shards on buddy ranks (stages 1-3) are not built yet.
 *
 * Which commit wins after a failure: a rank may have completed step s+1
 * (its gradient allreduce finished before a peer died) and committed it
 * while another failed inside that allreduce. Every survivor reports its
 * commit count; the newest wins and is broadcast from the lowest rank
 * holding it. That state is exactly the fault-free run's (the step
 * completed with every contribution in), so no completed step is ever lost
 * or applied twice; a joining process receives everything the same way. */
#include "train/elastic/elastic_impl.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct el_buffer {
  char name[64];
  void *ptr;
  size_t bytes;
  unsigned char *shadow; /* the last commit */
} el_buffer;

struct td_elastic {
  el_membership m;
  td_comm *comm;
  el_buffer *bufs;
  int n_bufs, cap_bufs;
  int64_t commits; /* commits taken (or received): 0 = none */
  bool resize_requested;
  int resets;
};

static td_status build_comm(td_elastic *e) {
  td_comm_destroy(e->comm);
  e->comm = NULL;
  char job[160];
  /* A job id per epoch: its communicator's store keys start afresh. */
  snprintf(job, sizeof job, "%s.e%d", e->m.job, e->m.epoch);
  td_comm_config cfg = {0};
  cfg.rank = e->m.rank;
  cfg.world_size = e->m.n_members;
  cfg.store = e->m.store_addr;
  cfg.job_id = job;
  td_status st = td_comm_init_config(&cfg, &e->comm);
  if (st != TD_OK) {
    char why[768];
    td_error_copy(why, sizeof why);
    return td_error(st, "elastic: building the communicator of epoch %d (%d ranks) failed: %s", e->m.epoch,
                    e->m.n_members, why);
  }
  return TD_OK;
}

/* Membership rounds until one yields a communicator (a member may die
 * between a round's close and the communicator's rendezvous). */
static td_status next_epoch(td_elastic *e) {
  for (int tries = 0;; tries++) {
    TD_CHECK(el_membership_next(&e->m));
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
  td_status st = el_membership_open(&e->m);
  if (st == TD_OK) st = next_epoch(e);
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
  td_comm_destroy(e->comm);
  for (int i = 0; i < e->n_bufs; i++) free(e->bufs[i].shadow);
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
  if (e->n_bufs == e->cap_bufs) {
    int cap = e->cap_bufs ? 2 * e->cap_bufs : 8;
    el_buffer *nb = realloc(e->bufs, sizeof *nb * (size_t)cap);
    if (!nb) return td_error(TD_ERR_SYSTEM, "td_elastic_register: out of memory");
    e->bufs = nb;
    e->cap_bufs = cap;
  }
  el_buffer *b = &e->bufs[e->n_bufs];
  memset(b, 0, sizeof *b);
  td_strlcpy(b->name, name, sizeof b->name);
  b->ptr = ptr;
  b->bytes = bytes;
  b->shadow = malloc(bytes ? bytes : 1);
  if (!b->shadow)
    return td_error(TD_ERR_SYSTEM, "td_elastic_register: out of memory for the commit of \"%s\" (%zu bytes)", name,
                    bytes);
  e->n_bufs++;
  return TD_OK;
}

static void commit_local(td_elastic *e) {
  for (int i = 0; i < e->n_bufs; i++)
    if (e->bufs[i].bytes) memcpy(e->bufs[i].shadow, e->bufs[i].ptr, e->bufs[i].bytes);
  e->commits++;
}

td_status td_elastic_commit(td_elastic *e) {
  if (!e) return td_error(TD_ERR_INVALID_ARGUMENT, "td_elastic_commit: state is NULL");
  commit_local(e);
  /* Rank 0 alone asks the store, and everybody follows its answer, so the
   * ranks leave this epoch together or not at all. */
  int32_t pending = 0;
  if (e->m.rank == 0) {
    int p = 0;
    td_status st = el_membership_pending(&e->m, &p);
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
  if (pending) {
    e->resize_requested = true;
    return td_error(TD_ERR_REMOTE, "elastic: processes wait to join: epoch %d ends at commit %lld", e->m.epoch,
                    (long long)e->commits);
  }
  return TD_OK;
}

/* Bring every rank to the newest commit any of them holds (see the file
 * header), into both the shadow and the registered buffers. */
static td_status sync_state(td_elastic *e) {
  size_t total = 0;
  for (int i = 0; i < e->n_bufs; i++) total += e->bufs[i].bytes;
  if (e->m.n_members > 1) {
    int64_t v[4] = {e->commits, (int64_t)total, -(int64_t)total, e->n_bufs};
    TD_CHECK(td_allreduce(v, v, 4, TD_I64, TD_MAX, e->comm));
    if (v[1] != -v[2] || v[3] != e->n_bufs)
      return td_error(TD_ERR_MISMATCH, "elastic: rank %d registered %d buffers of %zu bytes in all, but another rank "
                                       "registered a different state (up to %lld buffers, %lld..%lld bytes): every "
                                       "rank must register the same buffers",
                      e->m.rank, e->n_bufs, total, (long long)v[3], (long long)-v[2], (long long)v[1]);
    int32_t holder = e->commits == v[0] ? e->m.rank : INT32_MAX;
    TD_CHECK(td_allreduce(&holder, &holder, 1, TD_I32, TD_MIN, e->comm));
    if (e->commits != v[0] || e->m.rank == 0)
      td_log(TD_LOG_INFO, "elastic: epoch %d: state of commit %lld from rank %d%s", e->m.epoch, (long long)v[0],
             holder, e->commits != v[0] ? " (this rank was behind)" : "");
    for (int i = 0; i < e->n_bufs; i++)
      if (e->bufs[i].bytes) TD_CHECK(td_broadcast(e->bufs[i].shadow, e->bufs[i].bytes, TD_U8, holder, e->comm));
    e->commits = v[0];
  }
  for (int i = 0; i < e->n_bufs; i++)
    if (e->bufs[i].bytes) memcpy(e->bufs[i].ptr, e->bufs[i].shadow, e->bufs[i].bytes);
  return TD_OK;
}

td_status td_elastic_run(td_elastic *e, td_elastic_train_fn train_fn, td_elastic_reset_fn reset_fn, void *ctx) {
  if (!e || !train_fn) return td_error(TD_ERR_INVALID_ARGUMENT, "td_elastic_run: state and train_fn are required");
  /* What this process holds now is its commit until the first real one:
   * every starting rank holds the same initial state; a joiner's is
   * replaced by its peers' newer commit in the sync below. */
  if (e->commits == 0) commit_local(e);
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
    td_status st = sync_state(e);
    if (st == TD_OK && reset_fn) {
      st = reset_fn(ctx, e->comm, e->m.n_members);
      if (st != TD_OK && td_comm_status(e->comm) == TD_OK) return st; /* the user's own failure */
    }
    if (st == TD_OK) st = train_fn(ctx, e);
    if (st == TD_OK) return TD_OK;
    if (!e->resize_requested && td_comm_status(e->comm) == TD_OK) return st;
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
