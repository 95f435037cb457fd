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
 *                  gone (the launcher writes it when it reaps a worker; it
 *                  lets survivors close a round without waiting
 *                  TANDEM_ELASTIC_SETTLE for it). When the launcher started
 *                  a replacement first, the round waits (at most
 *                  TANDEM_ELASTIC_REPLACE_WAIT) for that one to join, so that
 *                  a fast start brings the world size back at once; a slow
 *                  one joins at the next commit.
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
/* Do processes wait to join the next epoch? (one store request) */
td_status el_membership_pending(el_membership *m, int *pending);
/* A member reports that its communicator of the current epoch failed
 * because process uid fell silent (td_comm_silent_ranks). */
td_status el_report_silent(el_membership *m, long uid);
/* The launcher reports a reaped worker and its replacement (-1: none). */
td_status el_report_dead(td_store *store, const char *job, long uid, const char *why, long replacement);

#endif
