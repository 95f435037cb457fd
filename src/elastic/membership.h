/* The elastic membership protocol between the launcher and the ranks
 * (membership.c): epochs agreed through the rendezvous store. Below both
 * the elastic state (state.c) and tandemrun, which reports the workers it
 * reaps (el_report_dead); it needs only the store (src/net).
 *
 * Store keys, all under "<job id>/el/":
 *   cur            the newest closed epoch (decimal)
 *   e<k>/n         join slots taken in the round that forms epoch k
 *   e<k>/j<slot>   "<uid>": the process that took that slot
 *   e<k>/m         the membership of epoch k, "<uid> <uid> ...", rank order
 *                  (written once, by compare-and-set: whoever closes the
 *                  round first wins, and everybody reads that list)
 *   dead/<uid>     "<why>\n<replacement uid or -1>": the process <uid> is
 *                  gone (the launcher writes it when it reaps a worker, or
 *                  when it evicts it with its host before the kill arrives;
 *                  it lets survivors close a round without waiting
 *                  TANDEM_ELASTIC_SETTLE for it). Such a process is never
 *                  admitted again: one that still runs refuses itself
 *                  before taking a slot, and a round leaves it out even if
 *                  it took one. When the launcher started
 *                  a replacement first, the round waits (at most
 *                  TANDEM_ELASTIC_REPLACE_WAIT) for that one to join, so that
 *                  a fast start brings the world size back at once; a slow
 *                  one joins at the next commit.
 *   starts         joiners the launcher started (ADD): replacements and
 *                  processes that grow the job
 *   came           of those, how many took a join slot or ended before
 *                  (ADD, once per uid: came/<uid> decides who counts it).
 *                  starts - came joiners are on their way (an ssh start on
 *                  a loaded host takes seconds); rank 0 lets a waiting
 *                  joiner wait for them, at most TANDEM_ELASTIC_JOIN_WAIT,
 *                  so that processes started together join in one
 *                  membership change, not one each (el_membership_pending)
 *   silent/<uid>   "<epoch>": a member of that epoch found <uid> silent (its
 *                  heartbeats stopped: a stopped process, a cut link, a dead
 *                  host the launcher cannot reap). Like dead/ for closing a
 *                  round, without waiting for a replacement: the heartbeat
 *                  timeout already was the wait, so the settle time is not
 *                  spent again. A silent process that comes back in time
 *                  simply joins; later it is stale. */
#ifndef TD_ELASTIC_MEMBERSHIP_H
#define TD_ELASTIC_MEMBERSHIP_H

#include <stdbool.h>

#include "base/base.h"
#include "net/net.h"

typedef struct el_membership {
  td_store *store;
  char store_addr[300];
  char job[100];
  long uid;          /* launch number: smaller = longer-lived */
  bool joiner;       /* started after the job began */
  int initial_world; /* TANDEM_WORLD_SIZE: the ranks that form epoch 1 */
  int min_np, max_np;
  double timeout_s, settle_s;
  double replace_wait_s; /* TANDEM_ELASTIC_REPLACE_WAIT (see try_close) */
  double join_wait_s;    /* TANDEM_ELASTIC_JOIN_WAIT (see el_membership_pending) */
  double join_seen_at;   /* when joiners were first seen waiting while others were on their way (0: not) */
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
 * then fails at once (td_comm_config.abandon) and the next round starts,
 * instead of waiting TANDEM_CONNECT_TIMEOUT for a process that is gone.
 * why says which. One store request per member. */
bool el_membership_abandoned(el_membership *m, char *why, size_t why_size);
/* Should the members admit the processes that wait to join the next epoch
 * now? (one store request; three when some wait.) Not while other joiners
 * the launcher started are still on their way (starts - came > 0), for at
 * most TANDEM_ELASTIC_JOIN_WAIT seconds from the first look that saw them
 * wait, so that processes started together (a host's slots, grown back)
 * come in one membership change. Called by rank 0 at each commit. */
td_status el_membership_pending(el_membership *m, int *pending);
/* The launcher reports a joiner it starts (before starting it). */
td_status el_report_started(td_store *store, const char *job);
/* A joiner is no longer on its way: it took a join slot (the joiner says
 * so) or it ended (the launcher says so on reaping it); counted once. */
td_status el_report_came(td_store *store, const char *job, long uid);
/* A member reports that its communicator of the current epoch failed
 * because process uid fell silent (td_comm_silent_ranks). */
td_status el_report_silent(el_membership *m, long uid);
/* Rank 0 counts each commit under <job>/el/commits: tandemrun's sign that
 * the job makes progress (a lossy host is evicted only from a stalled job). */
td_status el_report_commit(el_membership *m);
/* The launcher reports a reaped worker and its replacement (-1: none). */
td_status el_report_dead(td_store *store, const char *job, long uid, const char *why, long replacement);

#endif
