/* Tandem public API: elastic, fault-tolerant training (src/elastic; the
 * trainer's side, td_trainer_elastic_*, is in tandem/train.h).
 *
 * In the spirit of hvd.elastic.State: the processes of a job survive the
 * loss of a peer. When a rank dies, stops answering heartbeats, or new
 * workers ask to join, the surviving processes keep their memory, agree
 * through the rendezvous store on a new membership "epoch" (a number that
 * only grows; a process of an older epoch is refused), build a fresh
 * communicator at the new world size (ranks renumbered by age: the
 * longest-lived process becomes rank 0), restore the state of the last
 * commit and carry on. No checkpoint is read: at ZeRO stage 0 every rank
 * holds the whole state; at stages 1-3 each rank's shard is also held by a
 * buddy rank on another host (td_elastic_register_shard). Every copy (the
 * last two commits of the whole buffers, of a rank's shard and of its
 * buddy's copy) is in a file of its process under
 * TANDEM_ELASTIC_REPLICA_DIR, so that it costs no resident memory, and
 * only when a rank and its buddy are lost together is the disk checkpoint
 * read (td_elastic_set_fallback). A joining process receives everything
 * from its peers.
 *
 * Usage (the training loop is the user's):
 *
 *   td_elastic *e;  td_elastic_create(NULL, &e);      // joins epoch 1 (or the running job)
 *   td_elastic_register(e, "params", params, bytes);  // what makes up the state
 *   td_elastic_register(e, "step", &step, sizeof step);
 *   td_elastic_run(e, train_fn, reset_fn, ctx);       // see below
 *
 *   train_fn(ctx, e): loops over steps on td_elastic_comm(e); after each
 *       completed step calls td_elastic_commit(e) and returns its status if
 *       not TD_OK; returns TD_OK when training is done.
 *   reset_fn(ctx, comm, world_size): called after every membership change,
 *       with the state already restored to the last commit (the newest one
 *       any survivor holds), before train_fn runs again: rebind what uses the
 *       communicator (the trainer's batch split, buffers sized per rank).
 *
 * Started by `tandemrun --min-np A --max-np B` (which sets TANDEM_ELASTIC=1,
 * TANDEM_ELASTIC_ID and the bounds below); other launchers may set the same
 * variables, but the store must outlive every rank (tandemrun hosts it).
 *
 * Environment (read once by td_elastic_create):
 *   TANDEM_ELASTIC_ID       this process's launch number: smaller = older
 *                           (default TANDEM_RANK)
 *   TANDEM_ELASTIC_JOIN     1: a process started after the job began; it
 *                           joins at the members' next commit
 *   TANDEM_ELASTIC_MIN_NP   fewest ranks to train with (default 1)
 *   TANDEM_ELASTIC_MAX_NP   most ranks admitted (default: no limit)
 *   TANDEM_ELASTIC_TIMEOUT  seconds a membership round may wait for
 *                           min-np ranks before failing (default 600)
 *   TANDEM_ELASTIC_SETTLE   seconds survivors wait for a member of the old
 *                           epoch that neither joins nor is reported dead
 *                           (a stopped or cut-off host) before going on
 *                           without it (default 10; should exceed
 *                           TANDEM_HEARTBEAT_TIMEOUT)
 *   TANDEM_ELASTIC_REPLACE_WAIT  seconds survivors wait for the replacement
 *                           of a lost member before going on without it
 *                           (it joins at the next commit; default 0.25)
 *   TANDEM_ELASTIC_REPLICA_DIR  directory of the commit files (the copies
 *                           kept for recovery: unnamed, gone with the process; default
 *                           /var/tmp: a local disk, not a tmpfs)
 *
 * Threading: one td_elastic is used from one thread. Errors follow
 * tandem/base.h. */
#ifndef TANDEM_ELASTIC_H
#define TANDEM_ELASTIC_H

#include <stddef.h>
#include <stdint.h>

#include "base.h"
#include "comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct td_elastic td_elastic;

/* Join the job: agree on a membership epoch with the other processes through
 * the store and build its communicator. A process started with the job joins
 * epoch 1 with the others; a process started later (TANDEM_ELASTIC_JOIN=1)
 * waits until the members reach a commit and admit it. Blocks up to
 * TANDEM_ELASTIC_TIMEOUT. `reserved` must be NULL (room for a config).
 * *out is NULL on failure. */
td_status td_elastic_create(const void *reserved, td_elastic **out);
/* Leave (destroys the communicator, does not communicate). Accepts NULL. */
void td_elastic_destroy(td_elastic *e);

/* The communicator of the current epoch: valid until the next membership
 * change (td_elastic_run replaces it; do not destroy it yourself). */
td_comm *td_elastic_comm(const td_elastic *e);
int td_elastic_epoch(const td_elastic *e);    /* 1, 2, ... */
int td_elastic_rank(const td_elastic *e);     /* rank in the current epoch */
int td_elastic_size(const td_elastic *e);     /* world size of the current epoch */
long td_elastic_id(const td_elastic *e);      /* this process's launch number (TANDEM_ELASTIC_ID) */
/* Membership changes this process went through since td_elastic_create. */
int td_elastic_resets(const td_elastic *e);
/* Of those, the ones forced by a failure (a peer lost or silent: the
 * communicator broke), not by admitting joiners. */
int td_elastic_faults(const td_elastic *e);
/* Bytes of memory the copies this process keeps for recovery take: every
 * copy is in a file (td_elastic_copy_disk_bytes), so this is the staging
 * chunk (TD_ELASTIC_STAGING_BYTES) through which the buddy replicas of
 * sharded buffers move, as much of it as was used; 0 without sharded
 * buffers. Local. */
size_t td_elastic_copy_bytes(const td_elastic *e);
/* Bytes of the commit files, on disk in TANDEM_ELASTIC_REPLICA_DIR
 * (default /var/tmp) rather than in memory: the last two commits of every
 * whole buffer (td_elastic_register), and of this rank's shard and each
 * ward's (td_elastic_register_shard). Local. */
size_t td_elastic_copy_disk_bytes(const td_elastic *e);
/* The buffer through which the buddy replicas move between their files
 * and the network: the only memory they hold (the exchange keeps two
 * chunks of half of it in flight). */
#define TD_ELASTIC_STAGING_BYTES (4 << 20)

/* Register `bytes` bytes at `ptr` as part of the state (parameters,
 * optimizer state, a step counter, a sampler position...). Each commit
 * writes it into a commit file (the last two are kept). Registering a
 * name again replaces its pointer (same size required); a new name is
 * refused once td_elastic_run took its first commit. Every rank must
 * register the same names and sizes, in the same order. Local. */
td_status td_elastic_register(td_elastic *e, const char *name, void *ptr, size_t bytes);

/* Register a sharded buffer (ZeRO stages 1-3): this rank holds elements
 * [lo, hi) of a global array of `total` elements of `elem_bytes` bytes each,
 * at ptr. Every sharded buffer of a state is split alike (same total; lo
 * and hi equal across the buffers of one rank). Each commit also copies
 * this rank's elements and sends the copy to a buddy rank (on another host
 * when there is one) while the next step computes, until
 * td_elastic_commit_wait, which must come before the buffer changes. After a membership
 * change the reset callback re-shards and registers every sharded buffer
 * again (same names) with the new ptr, lo and hi; td_elastic_run then fills
 * them from the survivors' shards and their buddies' copies. Local. */
td_status td_elastic_register_shard(td_elastic *e, const char *name, void *ptr, size_t elem_bytes, size_t total,
                                    size_t lo, size_t hi);
/* The same for an array every rank holds whole, at `whole` (all `total`
 * elements), with values equal on every rank at each td_elastic_commit
 * (ZeRO stages 1-2's parameters after their allgather), of which this rank
 * owns [lo, hi): its copies are kept like a sharded buffer's, but a commit
 * sends none of it to the buddy, which writes the copy of its wards' ranges
 * from its own whole array. After a membership change only [lo, hi) is
 * filled (the caller gathers the rest). Local. */
td_status td_elastic_register_shard_whole(td_elastic *e, const char *name, void *whole, size_t elem_bytes,
                                          size_t total, size_t lo, size_t hi);

/* When a rank and its buddy are lost together, some shard survives in no
 * memory: td_elastic_run then calls fn(ctx, comm, world_size) after the
 * reset callback, which must fill every registered buffer (whole and
 * sharded) from a disk checkpoint, collectively (the trainer:
 * td_trainer_resume). Steps after that checkpoint are redone. Without a
 * fallback such a loss fails the job with a message saying so. Local. */
typedef td_status (*td_elastic_fallback_fn)(void *ctx, td_comm *comm, int world_size);
td_status td_elastic_set_fallback(td_elastic *e, td_elastic_fallback_fn fn, void *ctx);
/* Disk fallbacks this process went through. */
int td_elastic_fallbacks(const td_elastic *e);

/* A job restarted from its disk checkpoint: what this process registered
 * is not the job's state, so the first epoch (and any epoch formed before
 * the first commit) fills every registered buffer through the fallback
 * instead of taking this process's buffers as commit 1. Call it on every
 * process that starts the job, after td_elastic_set_fallback and before
 * td_elastic_run; joiners need not (they receive the members' state).
 * TD_ERR_INVALID_USAGE without a fallback or after td_elastic_run. Local. */
td_status td_elastic_start_from_fallback(td_elastic *e);

/* Copy every registered buffer into this process's in-memory commit (a
 * memcpy per buffer; no disk, no network). At stage 0 every rank holds the
 * whole state, so every survivor has the commit. Sharded buffers are
 * copied by a thread of the commit's own, into the replica files and to
 * the buddy, while the caller goes on with the next step: see
 * td_elastic_commit_wait. Then, collectively, check whether new workers
 * wait to join (rank 0 asks the store; one 4-byte allreduce tells the
 * others): if so, returns TD_ERR_REMOTE with a message saying so, which
 * td_elastic_run answers with a membership change that admits them (no
 * step is lost: the commit is already taken). */
td_status td_elastic_commit(td_elastic *e);

/* The fence of the sharded buffers' copies: blocks until the last
 * commit's copy of them is written and exchanged with the buddy, and
 * returns its status. A sharded buffer must not change between
 * td_elastic_commit and this call: call it right before the step writes
 * them (the optimizer's update; td_trainer_step does), so that the copy
 * overlaps the forward and backward passes. TD_OK at once when no copy is
 * in flight (no sharded buffers, or already done). When a peer was lost
 * during the exchange, the epoch's communicator is broken too, so that
 * td_elastic_run answers with a membership change. Local. */
td_status td_elastic_commit_wait(td_elastic *e);

typedef td_status (*td_elastic_train_fn)(void *ctx, td_elastic *e);
typedef td_status (*td_elastic_reset_fn)(void *ctx, td_comm *comm, int world_size);

/* Run train_fn until it returns TD_OK. First synchronizes the state (the
 * newest commit any rank holds, from the lowest rank holding it; a joining
 * process receives everything). When train_fn fails because the
 * communicator broke (a peer lost: td_comm_status() != TD_OK) or
 * td_elastic_commit asked for a resize, the survivors agree on the next
 * epoch, build its communicator, restore the newest commit into the
 * registered buffers, call reset_fn(ctx, comm, world_size) and call
 * train_fn again: the interrupted step is redone. Any other failure of
 * train_fn (bad data, a NaN) is returned as is. Fails when fewer than
 * TANDEM_ELASTIC_MIN_NP ranks remain past TANDEM_ELASTIC_TIMEOUT, or when
 * this process is stale (the others formed a newer epoch without it: it was
 * stopped or cut off too long), with a message saying which. */
td_status td_elastic_run(td_elastic *e, td_elastic_train_fn train_fn, td_elastic_reset_fn reset_fn, void *ctx);

/* ---- batch sizes under elastic training ---- */

/* Batch split for an elastic world: keep the global batch G and give each
 * of `world` ranks G/world samples per step as micro x accum, with the
 * largest micro-batch not above micro_hint (memory stays bounded).
 * TD_ERR_INVALID_ARGUMENT when world does not divide G, with a message
 * listing the world sizes in [1, max_world] that would keep G. Pure. */
td_status td_elastic_batch_split(long global_batch, int world, int micro_hint, int max_world, int *micro_out,
                                 int *accum_out);

#ifdef __cplusplus
}
#endif
#endif
