/* td_trainer_agree: the ranks' verdict on a step of work that each did
 * alone (an allocation, a file written, a shard read). Below every part of
 * the engine (zero/, deterministic/, checkpoint/, offload), which agree
 * through it, and below the trainer that drives them. */
#include "train/core/core.h"

#include <stdio.h>
#include <string.h>

td_status td_trainer_agree(td_trainer *t, td_status local) {
  return td_agree_over(t->comm, t->rank, t->world, t->agree_flags, local);
}

td_status td_agree_over(td_comm *comm, int rank, int world, int32_t *flags, td_status local) {
  if (!comm || world == 1) return local;
  /* Each rank reports its status in its own slot; a MAX-reduce tells every
   * rank which ranks failed (cheap: one small allreduce). Only when one did,
   * the first failed rank broadcasts its message, so that every rank's error
   * carries the reason and not only the rank (all ranks see the same table,
   * so they all take that branch together). */
  /* The table was allocated with the trainer: a failed allocation here
   * would leave this rank out of a collective its peers wait in. */
  memset(flags, 0, sizeof(int32_t) * (size_t)world);
  flags[rank] = (int32_t)local;
  char saved[1024];
  td_error_copy(saved, sizeof saved);
  td_status st = td_allreduce(flags, flags, (size_t)world, TD_I32, TD_MAX, comm);
  if (st != TD_OK) {
    if (local != TD_OK) return td_error(local, "%s", saved);
    return td_error(st, "rank %d: %s", rank, td_comm_last_error(comm));
  }
  int first = -1, n_failed = 0;
  for (int r = 0; r < world; r++)
    if (flags[r] != TD_OK) {
      if (first < 0) first = r;
      n_failed++;
    }
  td_status result = local;
  if (first >= 0) {
    td_status first_status = (td_status)flags[first];
    char reason[768];
    memset(reason, 0, sizeof reason);
    if (rank == first) td_strlcpy(reason, saved, sizeof reason);
    td_status bst = td_broadcast(reason, sizeof reason, TD_U8, first, comm);
    reason[sizeof reason - 1] = '\0';
    if (local != TD_OK) {
      result = td_error(local, "%s", saved);
    } else if (bst != TD_OK || !reason[0]) {
      result = td_error(first_status, "rank %d%s failed (%s); see %s log for the reason", first,
                        n_failed > 1 ? " and others" : "", td_status_str(first_status),
                        n_failed > 1 ? "their" : "its");
    } else {
      char others[64] = "";
      if (n_failed > 1) snprintf(others, sizeof others, " (and %d other rank%s)", n_failed - 1, n_failed > 2 ? "s" : "");
      /* "rank 3: ..." from the failed rank itself reads "rank 3 failed (...): ..." */
      char prefix[32];
      int n_prefix = snprintf(prefix, sizeof prefix, "rank %d: ", first);
      const char *why = strncmp(reason, prefix, (size_t)n_prefix) == 0 ? reason + n_prefix : reason;
      result = td_error(first_status, "rank %d failed%s (%s): %s", first, others, td_status_str(first_status), why);
    }
  }
  return result;
}
