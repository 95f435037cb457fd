/* Buddy replicas of sharded state (ZeRO stages 1-3 under elastic training).
 *
 * At stage >= 1 no rank holds the whole state: rank r keeps the optimizer
 * state (and at stage 3 the parameters) of its shard only. So that a lost
 * rank's shard survives it, every commit sends a copy of this rank's range
 * to its buddy, which keeps it next to its own; the ranks a rank is buddy
 * of are its wards. The buddy is on another host whenever there is one
 * (el_rep_buddies): the ranks are listed host by host and, when no host
 * holds more than half of them, each one's buddy is the rank one
 * largest-host-size further in that list (a shift: one buddy and one ward
 * each, never on the same host). When one host holds more than half (3+1,
 * 2+1: what a 2x2 job becomes after its first loss), a shift cannot avoid
 * that host, so its ranks spread their copies round robin over the other
 * hosts' ranks, which then keep several wards each, and theirs go to it:
 * losing any one host still loses no shard. The map is recomputed from the
 * communicator's hosts at every membership change. What the copies cover is
 * therefore the loss of any one process or of any one host (every rank of
 * it), the failure unit TorchElastic and DeepSpeed's elastic agent restart
 * from; a rank and its buddy lost together (two hosts at once) fall back to
 * the disk checkpoint (state.c).
 *
 * Two commits of everything are kept (own[0..1], each ward's rep[0..1], and
 * in state.c the whole buffers): a failure can leave some ranks one commit
 * ahead of others (a rank completes step c while a peer fails inside it),
 * and the survivors must then roll back to the commit every shard reached.
 * After a failure the survivors describe what they hold (range and commit
 * of each piece); the newest commit whose pieces cover every element wins
 * (el_rep_choose), and every rank of the new epoch receives its new range
 * from whoever holds it (el_rep_restore). The pieces are ranges, not ranks:
 * the rebuild does not care which layout (world size) they were cut for,
 * so it also works when a second failure hits while the first one is being
 * repaired.
 *
 * Where the copies live: in files, not in this process's memory. Those four
 * copies are four times the parameter and Adam shard (12 bytes a parameter
 * each): in memory they made stage 3 under elastic training 2.4 times the
 * peak RSS of stage 3 without it, and even one in-memory copy is more than
 * a third of it. Each piece is an unnamed file (commit_file.c: O_TMPFILE,
 * nothing is left behind however the process ends) in
 * TANDEM_ELASTIC_REPLICA_DIR (default /var/tmp, a disk); commits write them
 * with pwrite straight from the live shard or from a bounded staging
 * chunk, so they sit in the page cache, which the kernel writes back and
 * may reclaim under pressure instead of counting them in the process's
 * RSS. The files live as long as
 * the process, like the in-memory copies did: a process that dies loses
 * them, so the failure model above is unchanged. The cost is in a
 * rebuild, which reads the pieces back (from the page cache while it still
 * holds them, else at disk speed), and in the commit's writes.
 *
 * The commit overlaps the next step: it starts a thread of its own (one a
 * commit, joined by the next fence) that writes this rank's piece and runs
 * the exchange, from the live shard, while the next forward and backward
 * run. The fence is el_rep_commit_wait, which the trainer calls right
 * before its optimizer writes the shard (td_elastic_commit_wait): the copy
 * must not see the next step's values, and there is no room for a copy of
 * the shard to send from later (that would undo what the files saved).
 * A communicator serves one thread at a time and runs its operations in
 * issue order, so the exchange has one of its own, rcomm, split from the
 * epoch's at every membership change: its transfers never queue behind
 * the next step's gradient reductions, nor those behind them. A lost peer
 * breaks both (each has its own failure detection); el_rep_commit_wait
 * carries a failure seen on one over to the other, so that every failure
 * ends the epoch the same way.
 *
 * A buffer registered whole (td_elastic_register_shard_whole: ZeRO stages
 * 1-2's parameters, which every rank holds equal after the update's
 * allgather) is kept like the others, but a commit does not send it: the
 * buddy writes its ward's range of it from its own whole array, as equal
 * as the sender's at that commit. Only the copy made right after a rebuild
 * (el_rep_reset_holdings) sends it, since the rebuild fills the shards
 * alone and the whole arrays are gathered by the next step.
 *
 * The exchange moves chunks of half of TD_ELASTIC_STAGING_BYTES: the
 * sender hands all of its chunks to the progress thread at once, straight
 * from the live shard, and writes its own piece meanwhile; the receiver
 * keeps two in flight, writing one to the file while the next arrives. The
 * rebuild moves whole staging chunks. Both ends cut the chunks alike, and
 * every rank walks the senders in one global order, that of the sending
 * rank (rank j's copy to buddy[j] before rank j+1's): the progress thread
 * runs operations in issue order and a large send completes only once its
 * receiver takes it, so the earliest unfinished transfer always has both
 * of its ends waiting for it and the exchange cannot deadlock, whatever
 * the map's shape. */
#include "elastic/elastic.h"

#include <errno.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

static void swap_pieces(el_piece *a, el_piece *b) {
  el_piece t = *a;
  *a = *b;
  *b = t;
}

td_status el_rep_register(el_replicas *r, const char *name, void *ptr, void *whole, size_t elem_bytes,
                          size_t total, size_t lo, size_t hi) {
  if (!elem_bytes || lo > hi || hi > total || (!(whole ? whole : ptr) && hi > lo))
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_elastic_register_shard(\"%s\"): elements [%zu, %zu) of %zu of %zu "
                                             "bytes each do not describe a shard",
                    name, lo, hi, total, elem_bytes);
  if (whole) ptr = (unsigned char *)whole + lo * elem_bytes; /* its shard: what a rebuild fills */
  if (r->n_bufs && total != r->total)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_elastic_register_shard(\"%s\"): %zu elements in all, but the "
                                             "sharded buffers registered before have %zu: every sharded buffer "
                                             "of a state is split alike",
                    name, total, r->total);
  for (int i = 0; i < r->n_bufs; i++) {
    el_shard_buf *b = &r->bufs[i];
    if (strcmp(b->name, name)) continue;
    if (b->elem_bytes != elem_bytes)
      return td_error(TD_ERR_INVALID_ARGUMENT, "td_elastic_register_shard(\"%s\"): elements of %zu bytes, "
                                               "registered before with %zu",
                      name, elem_bytes, b->elem_bytes);
    b->ptr = ptr;
    b->whole = whole;
    b->lo = lo;
    b->hi = hi;
    return TD_OK;
  }
  if (r->n_bufs == r->cap_bufs) {
    int cap = r->cap_bufs ? 2 * r->cap_bufs : 4;
    el_shard_buf *nb = realloc(r->bufs, sizeof *nb * (size_t)cap);
    if (!nb) return td_error(TD_ERR_SYSTEM, "td_elastic_register_shard: out of memory");
    r->bufs = nb;
    r->cap_bufs = cap;
  }
  el_shard_buf *b = &r->bufs[r->n_bufs++];
  memset(b, 0, sizeof *b);
  td_strlcpy(b->name, name, sizeof b->name);
  b->ptr = ptr;
  b->whole = whole;
  b->elem_bytes = elem_bytes;
  b->lo = lo;
  b->hi = hi;
  r->total = total;
  r->row_bytes += elem_bytes;
  if (r->n_bufs == 1) {
    el_piece_init(&r->own[0]);
    el_piece_init(&r->own[1]);
    r->buddy = -1;
    r->staging = malloc(TD_ELASTIC_STAGING_BYTES);
    if (!r->staging)
      return td_error(TD_ERR_SYSTEM, "elastic: out of memory for the replica staging chunk (%d bytes)",
                      TD_ELASTIC_STAGING_BYTES);
    pthread_condattr_t ca;
    bool ok = pthread_condattr_init(&ca) == 0;
    ok = ok && pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 && pthread_cond_init(&r->done_cv, &ca) == 0;
    if (ok && pthread_mutex_init(&r->mu, NULL) != 0) {
      pthread_cond_destroy(&r->done_cv);
      ok = false;
    }
    pthread_condattr_destroy(&ca);
    if (!ok) return td_error(TD_ERR_SYSTEM, "elastic: cannot initialize the replica commit's lock");
    r->sync_ready = true;
  }
  return TD_OK;
}

static void wards_free(el_ward *wards, int n) {
  for (int k = 0; k < n; k++) {
    el_piece_free(&wards[k].rep[0]);
    el_piece_free(&wards[k].rep[1]);
  }
  free(wards);
}

static void join_commit(el_replicas *r, td_comm *comm, bool abort_now);

void el_rep_free(el_replicas *r) {
  /* leaving with a commit in flight (an error path): its peers may be
   * gone, so it is stopped rather than waited for */
  if (r->in_flight) join_commit(r, NULL, true);
  td_comm_destroy(r->rcomm);
  if (r->n_bufs) { /* the pieces exist once a buffer was registered */
    el_piece_free(&r->own[0]);
    el_piece_free(&r->own[1]);
    wards_free(r->wards, r->n_wards);
  }
  if (r->sync_ready) {
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->done_cv);
  }
  free(r->staging);
  free(r->bufs);
  memset(r, 0, sizeof *r);
}

/* The files' bytes; only while no commit runs (it writes the pieces). */
static size_t disk_bytes_now(const el_replicas *r) {
  if (!r->n_bufs) return 0;
  size_t bytes = r->own[0].cap + r->own[1].cap;
  for (int w = 0; w < r->n_wards; w++) bytes += r->wards[w].rep[0].cap + r->wards[w].rep[1].cap;
  return bytes;
}

/* What the accessors read while a commit may run: set between commits. */
static void publish(el_replicas *r) {
  r->disk_bytes_pub = disk_bytes_now(r);
  r->staging_pub = r->staging_used;
}

size_t el_rep_disk_bytes(const el_replicas *r) { return r->disk_bytes_pub; }

size_t el_rep_staging_bytes(const el_replicas *r) { return r->staging_pub; }

double el_rep_thread_cpu_s(el_replicas *r, int64_t *threads_run) {
  *threads_run = 0;
  if (!r->sync_ready) return 0;
  pthread_mutex_lock(&r->mu);
  double s = r->thread_cpu_s;
  *threads_run = r->threads_run;
  pthread_mutex_unlock(&r->mu);
  return s;
}

/* The registered range, checked to be the same for every buffer. */
static td_status registered_range(const el_replicas *r, size_t *lo, size_t *hi) {
  *lo = r->bufs[0].lo;
  *hi = r->bufs[0].hi;
  for (int i = 1; i < r->n_bufs; i++)
    if (r->bufs[i].lo != *lo || r->bufs[i].hi != *hi)
      return td_error(TD_ERR_INVALID_USAGE, "elastic: sharded buffer \"%s\" holds elements [%zu, %zu) but \"%s\" "
                                            "[%zu, %zu): re-register every sharded buffer after re-sharding",
                      r->bufs[i].name, r->bufs[i].lo, r->bufs[i].hi, r->bufs[0].name, *lo, *hi);
  return TD_OK;
}

/* Write the registered buffers into p's file as a piece of `commit`. */
static td_status snapshot(const el_replicas *r, el_piece *p, int64_t commit) {
  size_t lo, hi;
  TD_CHECK(registered_range(r, &lo, &hi));
  size_t n = hi - lo;
  TD_CHECK(el_piece_begin(p, (int64_t)lo, (int64_t)hi, n * r->row_bytes));
  size_t off = 0;
  for (int i = 0; i < r->n_bufs; i++) {
    TD_CHECK(el_piece_write(p, off, r->bufs[i].ptr, n * r->bufs[i].elem_bytes));
    off += n * r->bufs[i].elem_bytes;
  }
  p->commit = commit;
  return TD_OK;
}

void el_rep_buddies(const int *host_of, int world, int *buddy) {
  if (world < 2) {
    if (world == 1) buddy[0] = -1;
    return;
  }
  /* Ranks host by host, hosts in order of their lowest rank: order[], and
   * each host's block [start, start + size) in it. */
  int *order = malloc(sizeof(int) * (size_t)world * 3);
  if (!order) { /* no room to plan: the next rank (still a valid map) */
    for (int i = 0; i < world; i++) buddy[i] = (i + 1) % world;
    return;
  }
  int *block_of = order + world, *placed = order + 2 * world;
  for (int i = 0; i < world; i++) placed[i] = 0;
  int n = 0, n_hosts = 0, largest = 0, largest_start = 0;
  for (int a = 0; a < world; a++) {
    if (placed[a]) continue;
    int start = n;
    for (int b = a; b < world; b++)
      if (!placed[b] && host_of[b] == host_of[a]) {
        placed[b] = 1;
        block_of[n] = n_hosts;
        order[n++] = b;
      }
    if (n - start > largest) {
      largest = n - start;
      largest_start = start;
    }
    n_hosts++;
  }
  if (n_hosts == 1) {
    for (int i = 0; i < world; i++) buddy[order[i]] = order[(i + 1) % world];
  } else if (2 * largest <= world) {
    /* A shift by the largest host's size leaves every block (no block is
     * longer than the shift) and does not wrap back into it (the shift is
     * at most half of the list). */
    for (int i = 0; i < world; i++) buddy[order[i]] = order[(i + largest) % world];
  } else {
    /* One host H holds more than half: its k-th rank goes to the k-th rank
     * outside it (round robin), the k-th rank outside goes to H's k-th. */
    int n_out = world - largest;
    int *outside = placed; /* reused: the ranks outside H in list order */
    int m = 0;
    for (int i = 0; i < world; i++)
      if (i < largest_start || i >= largest_start + largest) outside[m++] = order[i];
    for (int k = 0; k < largest; k++) buddy[order[largest_start + k]] = outside[k % n_out];
    for (int k = 0; k < n_out; k++) buddy[outside[k]] = order[largest_start + k];
  }
  free(order);
}

/* This rank's buddy and wards for the communicator's epoch (every rank
 * computes the same map from the communicator's host table). */
static td_status pair(const el_replicas *r, td_comm *comm, int *buddy_out, el_ward **wards_out, int *n_wards_out) {
  int world = comm ? td_comm_size(comm) : 1, me = comm ? td_comm_rank(comm) : 0;
  *buddy_out = -1;
  *wards_out = NULL;
  *n_wards_out = 0;
  if (world < 2 || !r->n_bufs) return TD_OK;
  int *host_of = malloc(sizeof(int) * (size_t)world * 2);
  if (!host_of) return td_error(TD_ERR_SYSTEM, "elastic: out of memory pairing %d ranks with buddies", world);
  int *buddy = host_of + world;
  for (int a = 0; a < world; a++) {
    host_of[a] = a;
    for (int b = 0; b < a; b++)
      if (!strcmp(td_comm_host(comm, a), td_comm_host(comm, b))) {
        host_of[a] = host_of[b];
        break;
      }
  }
  el_rep_buddies(host_of, world, buddy);
  int n = 0;
  for (int j = 0; j < world; j++) n += buddy[j] == me;
  el_ward *wards = n ? calloc((size_t)n, sizeof *wards) : NULL;
  if (n && !wards) {
    free(host_of);
    return td_error(TD_ERR_SYSTEM, "elastic: out of memory for %d wards", n);
  }
  n = 0;
  for (int j = 0; j < world; j++)
    if (buddy[j] == me) {
      wards[n].rank = j;
      el_piece_init(&wards[n].rep[0]);
      el_piece_init(&wards[n].rep[1]);
      n++;
    }
  *buddy_out = buddy[me];
  *wards_out = wards;
  *n_wards_out = n;
  free(host_of);
  return TD_OK;
}

/* Whether a commit's exchange sends buffer b: not a whole array's (every
 * rank holds the ward's range of it already) unless send_whole (the first
 * copy after a rebuild, when only the shards are filled). */
static bool shipped(const el_replicas *r, int b, bool send_whole) { return send_whole || !r->bufs[b].whole; }

/* Receive ward w's range into its rep[slot]: chunks of half the staging
 * buffer, two in flight, so that one is written to the file while the next
 * arrives; the buffers not shipped are written from this rank's own whole
 * array. Returns the communication's status; a file that cannot be
 * written (a full disk) does not stop the receiving, so that the exchange
 * stays in step on every rank: its error goes to *file_st_out. */
static td_status receive_ward(el_replicas *r, el_ward *w, int slot, td_comm *comm, int64_t commit, bool send_whole,
                              td_status *file_st_out) {
  const size_t half = TD_ELASTIC_STAGING_BYTES / 2;
  el_piece *p = &w->rep[slot];
  size_t n = (size_t)(w->hi - w->lo);
  td_status file_st = el_piece_begin(p, w->lo, w->hi, n * r->row_bytes);
  /* the chunks in order: the shipped buffers one by one, each cut from its
   * start; the file holds every buffer, one after the other */
  size_t n_chunks = 0;
  for (int b = 0; b < r->n_bufs; b++)
    if (shipped(r, b, send_whole)) n_chunks += (n * r->bufs[b].elem_bytes + half - 1) / half;
  td_request *req[2] = {NULL, NULL};
  size_t len[2] = {0, 0}, at[2] = {0, 0}, posted = 0, base = 0;
  int b = 0;
  size_t c = 0; /* the next chunk to post: buffer b (at file offset base) from byte c */
  td_status st = TD_OK;
  for (size_t i = 0; i < n_chunks && st == TD_OK; i++) {
    while (posted < n_chunks && posted < i + 2 && st == TD_OK) {
      while (!shipped(r, b, send_whole) || c >= n * r->bufs[b].elem_bytes) { /* on to the next shipped buffer */
        base += n * r->bufs[b++].elem_bytes;
        c = 0;
      }
      int h = (int)(posted % 2);
      len[h] = TD_MIN(half, n * r->bufs[b].elem_bytes - c);
      at[h] = base + c;
      r->staging_used = TD_MAX(r->staging_used, (size_t)h * half + len[h]);
      st = td_irecv(r->staging + (size_t)h * half, len[h], TD_U8, w->rank, comm, &req[h]);
      c += len[h];
      posted++;
    }
    if (st != TD_OK) break;
    int h = (int)(i % 2);
    st = td_wait(req[h]);
    req[h] = NULL;
    if (st == TD_OK && file_st == TD_OK) file_st = el_piece_write(p, at[h], r->staging + (size_t)h * half, len[h]);
  }
  for (int h = 0; h < 2; h++) td_wait(req[h]); /* after a failure: none left writing into staging */
  /* the ward's range of the whole arrays, from this rank's own (equal on every rank at this commit) */
  base = 0;
  for (int k = 0; k < r->n_bufs; k++) {
    size_t bytes = n * r->bufs[k].elem_bytes;
    if (!shipped(r, k, send_whole) && st == TD_OK && file_st == TD_OK)
      file_st = el_piece_write(p, base, r->bufs[k].whole + (size_t)w->lo * r->bufs[k].elem_bytes, bytes);
    base += bytes;
  }
  if (st == TD_OK && file_st == TD_OK) p->commit = commit;
  *file_st_out = file_st;
  return st;
}

/* The exchange: this rank's live range to the buddy, each ward's range
 * into its rep[slot], in the global order of the senders (see the file
 * header); the whole arrays' ranges only when send_whole. This rank's
 * chunks are all handed to the progress thread at once, from the live
 * buffers (unchanged until the next step's update, and waited for
 * before returning); own, if not NULL, is written meanwhile
 * as this rank's piece of `commit`. A ward's rep[slot] becomes a piece of
 * `commit` once it is whole (after a failure, those received whole still
 * are). */
static td_status exchange(el_replicas *r, td_comm *comm, int slot, int64_t commit, el_piece *own, bool send_whole) {
  size_t lo, hi;
  TD_CHECK(registered_range(r, &lo, &hi));
  const size_t chunk = TD_ELASTIC_STAGING_BYTES / 2;
  size_t n_send = 0;
  for (int b = 0; b < r->n_bufs && r->buddy >= 0; b++)
    if (shipped(r, b, send_whole)) n_send += ((hi - lo) * r->bufs[b].elem_bytes + chunk - 1) / chunk;
  td_request **sends = n_send ? calloc(n_send, sizeof *sends) : NULL;
  if (n_send && !sends) return td_error(TD_ERR_SYSTEM, "elastic: out of memory for %zu replica sends", n_send);
  int me = td_comm_rank(comm), k = 0, peer = -1;
  size_t issued = 0;
  td_status st = TD_OK, own_st = TD_OK, file_st = TD_OK;
  for (int j = 0; j < td_comm_size(comm) && st == TD_OK; j++) {
    if (j == me && r->buddy >= 0) {
      peer = r->buddy;
      for (int b = 0; b < r->n_bufs && st == TD_OK; b++) {
        if (!shipped(r, b, send_whole)) continue;
        size_t bytes = (hi - lo) * r->bufs[b].elem_bytes;
        for (size_t c = 0; c < bytes && st == TD_OK; c += chunk)
          st = td_isend(r->bufs[b].ptr + c, TD_MIN(chunk, bytes - c), TD_U8, peer, comm, &sends[issued++]);
      }
      if (own) own_st = snapshot(r, own, commit); /* while the progress thread sends */
      own = NULL;
    } else if (k < r->n_wards && r->wards[k].rank == j) {
      peer = j;
      td_status ward_file_st = TD_OK;
      st = receive_ward(r, &r->wards[k++], slot, comm, commit, send_whole, &ward_file_st);
      if (file_st == TD_OK) file_st = ward_file_st;
    }
  }
  if (own) own_st = snapshot(r, own, commit);
  for (size_t i = 0; i < issued; i++) {
    td_status ws = td_wait(sends[i]);
    if (st == TD_OK && ws != TD_OK) {
      st = ws;
      peer = r->buddy;
    }
  }
  free(sends);
  if (st != TD_OK)
    return td_error(st, "elastic: rank %d: replicating its shard to buddy rank %d (and receiving its %d wards') "
                        "failed at rank %d: %s",
                    me, r->buddy, r->n_wards, peer, td_comm_last_error(comm));
  return own_st != TD_OK ? own_st : file_st;
}

/* Test hook TANDEM_TEST_ELASTIC_SLOW_COMMITS=A:B: the commit threads of
 * commits A..B wait 2 s before copying anything, longer than a test
 * model's step, so that the next step's optimizer would have changed the
 * shards under the copy were it not for the fence, and a process stopped
 * right after such a commit has sent nothing of it (tests/elastic2/zero.sh
 * fence, test_el2_replica). */
static void test_slow_commit(int64_t commit) {
  const char *v = getenv("TANDEM_TEST_ELASTIC_SLOW_COMMITS");
  long long a, b;
  if (v && sscanf(v, "%lld:%lld", &a, &b) == 2 && commit >= a && commit <= b) {
    struct timespec ts = {2, 0};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
  }
}

/* The commit proper: this rank's piece and, with a buddy or wards, the
 * exchange (the wards' rep[1], the commit before the previous one, are
 * overwritten and become rep[0] once whole). On the commit thread, or on
 * the caller's when there is none. */
static td_status replicate(el_replicas *r, td_comm *comm, int64_t commit) {
  if (r->buddy < 0 && !r->n_wards) return snapshot(r, &r->own[0], commit);
  td_status st = exchange(r, comm, 1, commit, &r->own[0], false);
  for (int k = 0; k < r->n_wards; k++)
    if (r->wards[k].rep[1].commit == commit) swap_pieces(&r->wards[k].rep[0], &r->wards[k].rep[1]);
  return st;
}

static double thread_cpu_now(void) {
  struct timespec ts;
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *commit_thread(void *arg) {
  el_replicas *r = arg;
  test_slow_commit(r->job_commit);
  double c0 = thread_cpu_now();
  td_status st = replicate(r, r->rcomm, r->job_commit);
  double cpu = thread_cpu_now() - c0;
  pthread_mutex_lock(&r->mu);
  r->thread_cpu_s += cpu;
  r->threads_run++;
  r->job_st = st;
  if (st != TD_OK) td_error_copy(r->job_msg, sizeof r->job_msg); /* td_last_error is per thread */
  r->done = true;
  pthread_cond_signal(&r->done_cv);
  pthread_mutex_unlock(&r->mu);
  return NULL;
}

/* Join the commit thread. Waits in slices, without spinning: a broken
 * `comm` (a lost peer seen by the main thread first), or abort_now,
 * aborts rcomm so that an exchange waiting for a lost peer returns. */
static void join_commit(el_replicas *r, td_comm *comm, bool abort_now) {
  bool aborted = false;
  pthread_mutex_lock(&r->mu);
  while (!r->done) {
    if (!aborted && r->rcomm && (abort_now || (comm && td_comm_status(comm) != TD_OK))) {
      aborted = true;
      pthread_mutex_unlock(&r->mu);
      td_comm_abort(r->rcomm, abort_now ? "the elastic state is destroyed" : "the epoch's communicator failed");
      pthread_mutex_lock(&r->mu);
      continue;
    }
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_nsec += 250 * 1000 * 1000;
    if (until.tv_nsec >= 1000000000L) {
      until.tv_sec++;
      until.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&r->done_cv, &r->mu, &until);
  }
  pthread_mutex_unlock(&r->mu);
  pthread_join(r->thread, NULL);
  r->in_flight = false;
  publish(r);
}

td_status el_rep_commit_wait(el_replicas *r, td_comm *comm) {
  if (!r->in_flight) return TD_OK;
  join_commit(r, comm, false);
  if (r->job_st == TD_OK) return TD_OK;
  /* A peer lost during the exchange, seen on rcomm first: the epoch's
   * communicator fails too, so that every rank ends the epoch (a file
   * that cannot be written is this rank's own error: returned as is). */
  if (r->rcomm && td_comm_status(r->rcomm) != TD_OK && comm && td_comm_status(comm) == TD_OK)
    td_comm_abort(comm, r->job_msg);
  return td_error(r->job_st, "%s", r->job_msg);
}

td_status el_rep_commit(el_replicas *r, td_comm *comm, int64_t commit) {
  if (!r->n_bufs) return TD_OK;
  TD_CHECK(el_rep_commit_wait(r, comm)); /* one commit in flight at a time */
  swap_pieces(&r->own[0], &r->own[1]);
  bool alone = r->buddy < 0 && !r->n_wards;
  /* without rcomm (its split failed: reset_holdings returned that) the exchange runs here, on comm */
  if (!alone && !r->rcomm) {
    td_status st = replicate(r, comm, commit);
    publish(r);
    return st;
  }
  pthread_mutex_lock(&r->mu);
  r->done = false;
  r->job_commit = commit;
  r->job_st = TD_OK;
  r->job_msg[0] = 0;
  pthread_mutex_unlock(&r->mu);
  int rc = pthread_create(&r->thread, NULL, commit_thread, r);
  if (rc != 0) { /* no thread to be had: the commit runs here, as a blocking one */
    td_status st = replicate(r, alone ? comm : r->rcomm, commit);
    publish(r);
    return st;
  }
  r->in_flight = true;
  return TD_OK;
}

td_status el_rep_end_epoch(el_replicas *r, td_comm *comm, bool together) {
  td_status st = el_rep_commit_wait(r, comm);
  char why[768] = "";
  if (st != TD_OK) td_error_copy(why, sizeof why);
  if (together && r->rcomm && st == TD_OK && comm && td_comm_status(comm) == TD_OK &&
      td_comm_status(r->rcomm) == TD_OK)
    td_comm_finalize(r->rcomm); /* no peer sees our leaving it as a failure */
  td_comm_destroy(r->rcomm);
  r->rcomm = NULL;
  return st == TD_OK ? TD_OK : td_error(st, "%s", why);
}

static const el_piece *held_piece(const el_replicas *r, int i) {
  return i < 2 ? &r->own[i] : &r->wards[(i - 2) / 2].rep[(i - 2) % 2];
}

int el_rep_n_pieces(const el_replicas *r) { return 2 + 2 * r->n_wards; }

void el_rep_describe(const el_replicas *r, int64_t *d, int n_pieces) {
  d[EL_D_TOTAL] = (int64_t)r->total;
  d[EL_D_ROW] = (int64_t)r->row_bytes;
  int held = el_rep_n_pieces(r);
  for (int i = 0; i < n_pieces; i++) {
    const el_piece *p = i < held ? held_piece(r, i) : NULL;
    bool valid = p && r->n_bufs && p->commit >= 0;
    d[EL_D_PIECES + 3 * i] = valid ? p->lo : 0;
    d[EL_D_PIECES + 3 * i + 1] = valid ? p->hi : 0;
    d[EL_D_PIECES + 3 * i + 2] = valid ? p->commit : -1;
  }
}

static int cmp_i64_desc(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? 1 : x > y ? -1 : 0;
}

/* The first element >= x not covered by a piece of `commit` (or total). */
static int64_t first_gap(const int64_t *desc, int world, int n_pieces, int64_t commit, int64_t x, int64_t total) {
  bool moved = true;
  while (x < total && moved) {
    moved = false;
    for (int r = 0; r < world; r++)
      for (int i = 0; i < n_pieces; i++) {
        const int64_t *p = desc + (size_t)r * EL_DESC_LEN(n_pieces) + EL_D_PIECES + 3 * i;
        if (p[2] == commit && p[0] <= x && x < p[1]) {
          x = p[1];
          moved = true;
        }
      }
  }
  return x;
}

int64_t el_rep_choose(const int64_t *desc, int world, int n_pieces, int64_t *gap_lo, int64_t *gap_hi) {
  const size_t stride = EL_DESC_LEN(n_pieces);
  int64_t total = 0;
  for (int r = 0; r < world; r++) total = desc[(size_t)r * stride + EL_D_TOTAL] > total ? desc[(size_t)r * stride + EL_D_TOTAL] : total;
  int n = 0;
  int64_t *cands = malloc(sizeof(int64_t) * (size_t)world * 2);
  if (!cands) return -1;
  for (int r = 0; r < world; r++)
    for (int g = 0; g < 2; g++)
      if (desc[(size_t)r * stride + g] >= 0) cands[n++] = desc[(size_t)r * stride + g];
  qsort(cands, (size_t)n, sizeof *cands, cmp_i64_desc);
  *gap_lo = *gap_hi = -1;
  int64_t chosen = -1;
  for (int i = 0; i < n && chosen < 0; i++) {
    if (i > 0 && cands[i] == cands[i - 1]) continue;
    int64_t c = cands[i], gap = first_gap(desc, world, n_pieces, c, 0, total);
    if (gap >= total) {
      chosen = c;
    } else if (*gap_lo < 0) { /* the newest commit's hole, for the message */
      *gap_lo = gap;
      int64_t end = total;
      for (int r = 0; r < world; r++)
        for (int k = 0; k < n_pieces; k++) {
          const int64_t *p = desc + (size_t)r * stride + EL_D_PIECES + 3 * k;
          if (p[2] == c && p[0] > gap && p[0] < end) end = p[0];
        }
      *gap_hi = end;
    }
  }
  free(cands);
  return chosen;
}

/* Where rank j's element x comes from at `commit`: the piece of commit
 * covering x that j itself holds if any (no traffic), else the one that
 * reaches furthest (fewest messages), the lowest rank first. */
static bool pick_source(const int64_t *desc, int world, int n_pieces, int j, int64_t commit, int64_t x,
                        int *rank_out, int *piece_out) {
  int best_r = -1, best_i = -1;
  int64_t best_hi = -1;
  for (int r = 0; r < world; r++)
    for (int i = 0; i < n_pieces; i++) {
      const int64_t *p = desc + (size_t)r * EL_DESC_LEN(n_pieces) + EL_D_PIECES + 3 * i;
      if (p[2] != commit || x < p[0] || x >= p[1]) continue;
      bool better = best_r < 0 || (r == j && best_r != j) || (best_r != j && p[1] > best_hi);
      if (better) {
        best_r = r;
        best_i = i;
        best_hi = p[1];
      }
    }
  *rank_out = best_r;
  *piece_out = best_i;
  return best_r >= 0;
}

td_status el_rep_restore(el_replicas *r, td_comm *comm, const int64_t *desc, int n_pieces, const int64_t *targets,
                         int64_t commit, size_t *from_others) {
  *from_others = 0;
  if (!r->n_bufs) return TD_OK;
  int world = comm ? td_comm_size(comm) : 1, me = comm ? td_comm_rank(comm) : 0;
  size_t my_lo, my_hi;
  TD_CHECK(registered_range(r, &my_lo, &my_hi));
  /* Every rank walks the same plan: receivers in rank order, each one's
   * range left to right. A transfer completes once both of its ends reach
   * it, and every earlier transfer of both ends completed before (by
   * induction on the plan order), so blocking calls cannot deadlock. */
  for (int j = 0; j < world; j++) {
    int64_t x = targets[2 * j], end = targets[2 * j + 1];
    while (x < end) {
      int src, pi;
      if (!pick_source(desc, world, n_pieces, j, commit, x, &src, &pi))
        return td_error(TD_ERR_INTERNAL, "elastic: no holder of element %lld at commit %lld for rank %d",
                        (long long)x, (long long)commit, j);
      const int64_t *p = desc + (size_t)src * EL_DESC_LEN(n_pieces) + EL_D_PIECES + 3 * pi;
      int64_t seg_end = p[1] < end ? p[1] : end;
      if (src == me || j == me) {
        const el_piece *hp = src == me ? held_piece(r, pi) : NULL;
        size_t n = (size_t)(seg_end - x), pre = 0;
        for (int k = 0; k < r->n_bufs; k++) {
          size_t eb = r->bufs[k].elem_bytes, bytes = n * eb;
          /* where the segment starts in the held piece's file (-1: not held here) */
          long long from = hp ? (long long)((size_t)(hp->hi - hp->lo) * pre + (size_t)(x - hp->lo) * eb) : -1;
          unsigned char *to = j == me ? r->bufs[k].ptr + ((size_t)x - my_lo) * eb : NULL;
          td_status st = TD_OK;
          if (from >= 0 && to) {
            st = el_piece_read(hp, (size_t)from, to, bytes);
            if (st != TD_OK) return st;
          }
          /* across ranks in chunks, both ends cutting them alike */
          for (size_t c = 0; c < bytes && st == TD_OK && !(from >= 0 && to); c += TD_ELASTIC_STAGING_BYTES) {
            size_t len = TD_MIN((size_t)TD_ELASTIC_STAGING_BYTES, bytes - c);
            if (from >= 0) {
              r->staging_used = TD_MAX(r->staging_used, len);
              st = el_piece_read(hp, (size_t)from + c, r->staging, len);
              if (st != TD_OK) return st;
              st = td_send(r->staging, len, TD_U8, j, comm);
            } else {
              st = td_recv(to + c, len, TD_U8, src, comm);
            }
          }
          if (st != TD_OK)
            return td_error(st, "elastic: rank %d: moving elements [%lld, %lld) of \"%s\" from rank %d to rank %d "
                                "failed: %s",
                            me, (long long)x, (long long)seg_end, r->bufs[k].name, src, j, td_comm_last_error(comm));
          pre += eb;
        }
        if (j == me && src != me) *from_others += n;
      }
      x = seg_end;
    }
  }
  return TD_OK;
}

td_status el_rep_reset_holdings(el_replicas *r, td_comm *comm, int64_t commit) {
  if (!r->n_bufs) return TD_OK;
  TD_CHECK(el_rep_commit_wait(r, comm));
  /* The new holdings are built beside the old ones, which stay (for the
   * next round's descriptors) until the new ones are complete. */
  el_replicas next = *r; /* the registration (bufs, sizes); none of r's holdings */
  el_piece_init(&next.own[0]);
  el_piece_init(&next.own[1]);
  next.wards = NULL;
  next.n_wards = 0;
  next.buddy = -1;
  td_status st = snapshot(r, &next.own[0], commit);
  if (st == TD_OK) st = pair(r, comm, &next.buddy, &next.wards, &next.n_wards);
  if (st == TD_OK && (next.buddy >= 0 || next.n_wards)) {
    /* Every rank knows only its own range: tell the buddy, learn each
     * ward's, in the senders' order (see the file header). */
    int me = td_comm_rank(comm), k = 0;
    int64_t mine[2] = {next.own[0].lo, next.own[0].hi};
    for (int j = 0; j < td_comm_size(comm) && st == TD_OK; j++) {
      if (j == me && next.buddy >= 0) {
        st = td_send(mine, 2, TD_I64, next.buddy, comm);
      } else if (k < next.n_wards && next.wards[k].rank == j) {
        int64_t theirs[2] = {0, 0};
        st = td_recv(theirs, 2, TD_I64, j, comm);
        next.wards[k].lo = theirs[0];
        next.wards[k++].hi = theirs[1];
      }
    }
    if (st != TD_OK)
      st = td_error(st, "elastic: rank %d: telling buddy rank %d its range failed: %s", me, next.buddy,
                    td_comm_last_error(comm));
    else
      st = exchange(&next, comm, 0, commit, NULL, true);
  }
  r->staging_used = next.staging_used;
  if (st != TD_OK) { /* the old holdings stay for the next round */
    el_piece_free(&next.own[0]);
    wards_free(next.wards, next.n_wards);
    return st;
  }
  el_piece_free(&r->own[0]);
  el_piece_free(&r->own[1]);
  wards_free(r->wards, r->n_wards);
  r->own[0] = next.own[0];
  r->own[1] = next.own[1];
  r->wards = next.wards;
  r->n_wards = next.n_wards;
  r->buddy = next.buddy;
  publish(r);
  /* the epoch's communicator for the commits' exchanges (file header) */
  td_comm_destroy(r->rcomm);
  r->rcomm = NULL;
  if (r->buddy < 0 && !r->n_wards) return TD_OK;
  st = td_comm_split(comm, 0, td_comm_rank(comm), &r->rcomm);
  if (st != TD_OK) {
    /* a peer lost in its rendezvous: the epoch fails on every rank (its
     * communicator broken), so that the survivors form the next one */
    char why[768];
    td_error_copy(why, sizeof why);
    td_comm_abort(comm, "creating the buddy replicas' communicator failed");
    return td_error(st, "elastic: rank %d: creating the communicator of the buddy replicas' exchange failed: %s",
                    td_comm_rank(comm), why);
  }
  return TD_OK;
}
