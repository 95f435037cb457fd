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
/* Do processes wait to join the next epoch? (one store request) */
td_status el_membership_pending(el_membership *m, int *pending);
/* The launcher reports a reaped worker and its replacement (-1: none). */
td_status el_report_dead(td_store *store, const char *job, long uid, const char *why, long replacement);

#endif
