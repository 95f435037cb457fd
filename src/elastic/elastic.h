/* Internals of src/elastic, the elastic layer: membership epochs
 * (membership.h, membership.c), the state and the run helper behind
 * tandem/elastic.h (state.c), buddy replicas of sharded state
 * (replica.c), the files both keep their commits in (commit_file.c). Above src/comm (a communicator per epoch), below src/train
 * (whose trainer registers its state: src/train/elastic/). */
#ifndef TD_ELASTIC_H
#define TD_ELASTIC_H

#include "elastic/membership.h"
#include "tandem/elastic.h"

#include <pthread.h>

/* ---- the commit files (commit_file.c) ----
 * A piece is a copy kept for recovery, at one commit, in an unnamed file of
 * its own (O_TMPFILE) in the replica directory, not in this process's
 * memory (see commit_file.c's header). For the sharded state (replica.c)
 * it is a range [lo, hi) of the global sharded arrays: buffer 0's
 * elements, then buffer 1's, ..., packed (buffer k starts at (hi - lo) *
 * (sum of the element sizes of buffers 0..k-1)); for the whole buffers
 * (state.c) every buffer whole, packed in registration order (lo = hi = 0). */
typedef struct el_piece {
  int64_t lo, hi;
  int64_t commit; /* -1: holds nothing valid */
  int fd;         /* its file; -1: none yet */
  size_t cap;     /* bytes written to it so far (its size) */
} el_piece;

void el_piece_init(el_piece *p); /* empty, no file */
void el_piece_free(el_piece *p); /* closes its file: empty again */
/* Make p the piece [lo, hi) of `bytes` bytes about to be written: its
 * commit becomes -1 (nothing valid) until the caller sets it once the
 * writes are done; its file is created on first use and cut to `bytes`. */
td_status el_piece_begin(el_piece *p, int64_t lo, int64_t hi, size_t bytes);
/* n bytes at byte `off` of p's file: written from src, read into dst (all
 * of them, or an error naming the directory). */
td_status el_piece_write(const el_piece *p, size_t off, const void *src, size_t n);
td_status el_piece_read(const el_piece *p, size_t off, void *dst, size_t n);

/* ---- buddy replicas of sharded state (replica.c) ---- */

typedef struct el_shard_buf {
  char name[64];
  unsigned char *ptr; /* this rank's elements [lo, hi) */
  unsigned char *whole; /* all elements, equal on every rank at a commit (register_shard_whole); NULL: none */
  size_t elem_bytes;
  size_t lo, hi;      /* as last registered */
} el_shard_buf;

/* A rank whose range this rank keeps a copy of (this rank is its buddy). */
typedef struct el_ward {
  int rank;
  int64_t lo, hi;        /* its range */
  el_piece rep[2];       /* [0] newest complete, [1] previous (overwritten by the next commit) */
} el_ward;

typedef struct el_replicas {
  el_shard_buf *bufs;
  int n_bufs, cap_bufs;
  size_t total;         /* elements of each global array */
  size_t row_bytes;     /* sum of the element sizes */
  el_piece own[2];      /* this rank's range: [0] the newest commit, [1] the one before */
  el_ward *wards;       /* the ranks whose buddy this rank is, ascending (none, one, or several) */
  int n_wards;
  int buddy;            /* rank of the current epoch holding this rank's copy; -1: none (one rank) */
  unsigned char *staging; /* TD_ELASTIC_STAGING_BYTES between the files and the network */
  size_t staging_used;    /* the most of it used (what is resident of it) */
  /* The commit in flight (replica.c's header): a thread of its own writes
   * the files and runs the exchange on rcomm while the next step computes.
   * While it runs, the main thread touches none of the fields above it but
   * bufs (read by both); what the accessors report is published at its end. */
  td_comm *rcomm;         /* the epoch's communicator for the exchange (a split of the epoch's); NULL: none */
  pthread_t thread;
  bool in_flight;         /* a commit thread was started and not yet joined */
  bool sync_ready;        /* mu and done_cv are initialized */
  pthread_mutex_t mu;
  pthread_cond_t done_cv;
  bool done;              /* under mu: the thread finished */
  int64_t job_commit;     /* the commit it replicates */
  td_status job_st;       /* its outcome, and the message of a failure */
  char job_msg[768];
  size_t disk_bytes_pub;  /* el_rep_disk_bytes as of the last finished commit */
  size_t staging_pub;     /* staging_used as of the last finished commit */
  double thread_cpu_s;    /* CPU time of the commit threads (the copies' cost, off the main thread) */
  int64_t threads_run;    /* commits that ran on a thread of their own */
} el_replicas;

/* Per-rank descriptor exchanged after a failure (allgathered int64s): the
 * whole buffers' commits, the sharded arrays' shape, then n_pieces pieces
 * (lo, hi, commit; commit -1: empty), n_pieces the most any rank holds. */
enum { EL_D_WHOLE0, EL_D_WHOLE1, EL_D_TOTAL, EL_D_ROW, EL_D_PIECES };
#define EL_DESC_LEN(n_pieces) (EL_D_PIECES + 3 * (size_t)(n_pieces))

/* whole: the buffer's whole array, held equal by every rank at each commit
 * (td_elastic_register_shard_whole; ptr is then ignored: the shard is whole
 * + lo elements); NULL: a plain shard at ptr. */
td_status el_rep_register(el_replicas *r, const char *name, void *ptr, void *whole, size_t elem_bytes,
                          size_t total, size_t lo, size_t hi);
void el_rep_free(el_replicas *r);
/* Bytes of the pieces' files (what the copies hold on disk), and the most
 * of the staging buffer used (what is resident of it), as of the last
 * finished commit: callable while one runs. */
size_t el_rep_disk_bytes(const el_replicas *r);
size_t el_rep_staging_bytes(const el_replicas *r);
/* The commit threads' CPU seconds so far and how many ran (callable while one runs). */
double el_rep_thread_cpu_s(el_replicas *r, int64_t *threads_run);
/* The buddy of every rank (pure; every rank computes the same map): rank
 * i keeps its copy on buddy[i], on another host than host_of[i] (equal
 * ints: the same host) whenever there is another host, so that losing one
 * host loses no shard. When no host holds more than half of the ranks,
 * this is a permutation (each rank one ward); when one host does, the
 * ranks of the other hosts keep several wards each (the fewest possible,
 * round robin). All ranks on one host: the next rank. world < 2: -1. */
void el_rep_buddies(const int *host_of, int world, int *buddy);
/* Commit: first waits for the previous one (el_rep_commit_wait), then
 * starts a thread that writes this rank's range into own[0]'s file (the
 * previous one kept as own[1]), sends it to the buddy and writes each
 * ward's into its rep[1], which becomes rep[0] once whole: in chunks
 * through the staging buffer, on rcomm; returns at once. The registered
 * buffers must not change until el_rep_commit_wait returned. Collective in
 * effect (the buddy waits for it). */
td_status el_rep_commit(el_replicas *r, td_comm *comm, int64_t commit);
/* Wait for the commit in flight, if any; its status. While waiting, a
 * broken `comm` (the epoch's communicator: a peer lost) aborts rcomm, so
 * that the exchange stops instead of waiting for the lost peer; a failure
 * of rcomm aborts `comm`, so that every rank sees it as the epoch's
 * failure (a membership change), not as this rank's own. */
td_status el_rep_commit_wait(el_replicas *r, td_comm *comm);
/* The end of an epoch: waits for the commit in flight (aborting it when
 * `comm` is broken) and closes rcomm, finalized first when `together`
 * (every rank ends the epoch at this point: training done, a resize) and
 * both communicators are healthy, so that no peer sees this rank's leaving
 * as a failure. Returns the commit's status. */
td_status el_rep_end_epoch(el_replicas *r, td_comm *comm, bool together);
/* The pieces this rank holds (own and wards' slots, empty ones included). */
int el_rep_n_pieces(const el_replicas *r);
/* Fill d[EL_D_TOTAL..] (the pieces this rank holds, n_pieces slots: at
 * least el_rep_n_pieces; the rest empty). */
void el_rep_describe(const el_replicas *r, int64_t *d, int n_pieces);
/* The newest commit C that the survivors can rebuild: some rank holds the
 * whole buffers at C and the pieces at C cover every shard; -1 when none
 * (a rank and its buddy lost together): *gap_lo/hi then name an uncovered
 * range of the newest commit. */
int64_t el_rep_choose(const int64_t *desc, int world, int n_pieces, int64_t *gap_lo, int64_t *gap_hi);
/* Fill every rank's registered range with commit C from the pieces the
 * ranks hold (targets: 2 int64 per rank, its registered lo, hi). Blocking
 * sends and receives in one global order. Collective. Returns in
 * *from_others the elements this rank received from other ranks. */
td_status el_rep_restore(el_replicas *r, td_comm *comm, const int64_t *desc, int n_pieces, const int64_t *targets,
                         int64_t commit, size_t *from_others);
/* After a restore (or a disk fallback): the ranks pair anew for this
 * communicator (el_rep_buddies over its hosts), the registered ranges
 * become this rank's holdings at `commit` and are replicated to the new
 * buddy before training goes on; the old holdings are dropped only once that worked.
 * Then the epoch's rcomm is split from comm. Collective. */
td_status el_rep_reset_holdings(el_replicas *r, td_comm *comm, int64_t commit);

#endif
