/* Internals of elastic training (src/train/elastic): membership epochs
 * agreed through the rendezvous store (membership.c), the in-memory state
 * and the run helper (state.c), and the trainer's rebinding to a new world
 * (trainer_elastic.c). Not part of the public API; tandemrun uses
 * el_report_dead.
 *
 * Store keys, all under "<job id>/el/":
 *   cur            the newest closed epoch (decimal)
 *   e<k>/n         join slots taken in the round that forms epoch k
 *   e<k>/j<slot>   "<uid>": the process that took that slot
 *   e<k>/m         the membership of epoch k, "<uid> <uid> ...", rank order
 *                  (written once, by compare-and-set: whoever closes the
 *                  round first wins, and everybody reads that list)
 *   dead/<uid>     "<why>\n<replacement uid or -1>": the process <uid> is
 *                  gone (the launcher writes it when it reaps a worker; it
 *                  lets survivors close a round without waiting
 *                  TANDEM_ELASTIC_SETTLE for it). When the launcher started
 *                  a replacement first, the round waits (at most the settle
 *                  time) for that one to join, so that the world size comes
 *                  back at once and no step runs at a smaller size. */
#ifndef TD_TRAIN_ELASTIC_IMPL_H
#define TD_TRAIN_ELASTIC_IMPL_H

#include "base/base.h"
#include "net/net.h"
#include "tandem/elastic.h"
#include "tandem/train.h"

typedef struct el_membership {
  td_store *store;
  char store_addr[300];
  char job[100];
  long uid;          /* launch number: smaller = longer-lived */
  bool joiner;       /* started after the job began */
  int initial_world; /* TANDEM_WORLD_SIZE: the ranks that form epoch 1 */
  int min_np, max_np;
  double timeout_s, settle_s;
  int epoch;       /* 0 before the first round */
  long *members;   /* uids of the current epoch, in rank order */
  int n_members;
  int rank;        /* index of uid in members */
} el_membership;

/* Read the environment (see tandem/elastic.h) and connect to the store. */
td_status el_membership_open(el_membership *m);
void el_membership_close(el_membership *m);
/* Take part in the round that forms the next epoch and wait until it is
 * closed; on success m->epoch, members, n_members and rank describe it.
 * TD_ERR_REMOTE when this process is stale (a newer epoch formed without
 * it), TD_ERR_TIMEOUT below min-np past the timeout. */
td_status el_membership_next(el_membership *m);
/* Will the communicator of the current epoch never form? True when one of
 * its members was reported dead or a newer epoch closed: its rendezvous
 * then fails at once (comm_init_abandonable) and the next round starts,
 * instead of waiting TANDEM_CONNECT_TIMEOUT for a process that is gone.
 * why says which. One store request per member. */
bool el_membership_abandoned(el_membership *m, char *why, size_t why_size);
/* Do processes wait to join the next epoch? (one store request) */
td_status el_membership_pending(el_membership *m, int *pending);
/* The launcher reports a reaped worker and its replacement (-1: none). */
td_status el_report_dead(td_store *store, const char *job, long uid, const char *why, long replacement);

/* ---- buddy replicas of sharded state (replica.c) ----
 * A piece is a range [lo, hi) of the global sharded arrays at one commit:
 * buffer 0's elements, then buffer 1's, ..., packed (buffer k starts at
 * (hi - lo) * (sum of the element sizes of buffers 0..k-1)). */
typedef struct el_piece {
  int64_t lo, hi;
  int64_t commit; /* -1: holds nothing valid */
  unsigned char *data;
  size_t cap; /* bytes allocated */
} el_piece;

typedef struct el_shard_buf {
  char name[64];
  unsigned char *ptr; /* this rank's elements [lo, hi) */
  size_t elem_bytes;
  size_t lo, hi;      /* as last registered */
} el_shard_buf;

/* A rank whose range this rank keeps a copy of (this rank is its buddy). */
typedef struct el_ward {
  int rank;
  int64_t lo, hi;        /* its range */
  el_piece rep[2];       /* [0] newest complete, [1] previous or receiving */
  td_request *recv_req;  /* the receive into rep[1] in flight */
} el_ward;

typedef struct el_replicas {
  el_shard_buf *bufs;
  int n_bufs, cap_bufs;
  size_t total;         /* elements of each global array */
  size_t row_bytes;     /* sum of the element sizes */
  el_piece own[2];      /* this rank's range: [0] the newest commit, [1] the one before */
  el_ward *wards;       /* the ranks whose buddy this rank is, ascending (none, one, or several) */
  int n_wards;
  int64_t rep_in_commit; /* commit the wards' rep[1] are receiving (-1: none) */
  td_request *send_req;
  int buddy;            /* rank of the current epoch holding this rank's copy; -1: none (one rank) */
  double replicate_s;   /* time spent in the commit path (copy + waits), for the log */
} el_replicas;

/* Per-rank descriptor exchanged after a failure (allgathered int64s): the
 * whole buffers' commits, the sharded arrays' shape, then n_pieces pieces
 * (lo, hi, commit; commit -1: empty), n_pieces the most any rank holds. */
enum { EL_D_WHOLE0, EL_D_WHOLE1, EL_D_TOTAL, EL_D_ROW, EL_D_PIECES };
#define EL_DESC_LEN(n_pieces) (EL_D_PIECES + 3 * (size_t)(n_pieces))

td_status el_rep_register(el_replicas *r, const char *name, void *ptr, size_t elem_bytes, size_t total, size_t lo,
                          size_t hi);
void el_rep_free(el_replicas *r);
/* Wait for a replication in flight (after a failure: the broken
 * communicator completes it with an error); a replica received whole is
 * kept. */
void el_rep_settle(el_replicas *r);
/* The buddy of every rank (pure; every rank computes the same map): rank
 * i keeps its copy on buddy[i], on another host than host_of[i] (equal
 * ints: the same host) whenever there is another host, so that losing one
 * host loses no shard. When no host holds more than half of the ranks,
 * this is a permutation (each rank one ward); when one host does, the
 * ranks of the other hosts keep several wards each (the fewest possible,
 * round robin). All ranks on one host: the next rank. world < 2: -1. */
void el_rep_buddies(const int *host_of, int world, int *buddy);
/* Commit: copy this rank's range into own[0] (the previous one kept as
 * own[1]) and start sending it to the buddy while receiving the ward's;
 * the previous exchange is completed first. Collective in effect (the
 * buddy waits for it). */
td_status el_rep_commit(el_replicas *r, td_comm *comm, int64_t commit);
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
 * Collective. */
td_status el_rep_reset_holdings(el_replicas *r, td_comm *comm, int64_t commit);

#endif
