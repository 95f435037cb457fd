/* The rendezvous of a communicator through the store: each rank publishes
 * "<size>\n<host identity>\n<pid>\n<address>" under "<prefix>/peer/<rank>"
 * and reads everybody's entry back with one store_gather (2N store requests
 * for N ranks, where waiting for the keys one by one cost N^2 through the
 * store's single thread). Ranks with the same host identity share memory,
 * which the lifecycle (comm.c) uses to pick the transport.
 *
 * Every wait here can be abandoned (td_comm_config.abandon): a caller that
 * learns that a rank will never come makes the others give up within one
 * slice instead of waiting TANDEM_CONNECT_TIMEOUT. */
#include "comm/rendezvous/rendezvous.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define COMM_ABANDON_SLICE_S 0.25 /* how often an abandonable rendezvous asks whether to give up */

td_status comm_store_allgather(td_comm *comm, const char *prefix, const void *value, size_t len, double timeout_s,
                               char ***values_out, int *missing_out) {
  if (!comm->abandon_fn)
    return store_allgather(comm->store, prefix, comm->rank, comm->size, value, len, timeout_s, values_out, NULL,
                           missing_out);
  double end = td_now() + timeout_s;
  td_status st = store_allgather(comm->store, prefix, comm->rank, comm->size, value, len,
                                 TD_MIN(COMM_ABANDON_SLICE_S, timeout_s), values_out, NULL, missing_out);
  while (st == TD_ERR_TIMEOUT && td_now() < end) {
    char why[400] = "";
    if (comm->abandon_fn(comm->abandon_ctx, why, sizeof why)) {
      if (missing_out) *missing_out = -1;
      return td_error(TD_ERR_REMOTE, "rank %d: the rendezvous of communicator %s was abandoned: %s", comm->rank,
                      comm->prefix, why);
    }
    st = store_gather(comm->store, prefix, comm->size, TD_MIN(COMM_ABANDON_SLICE_S, TD_MAX(end - td_now(), 0.001)),
                      values_out, NULL, missing_out);
  }
  if (st == TD_ERR_TIMEOUT) /* say the whole wait, not the last slice */
    return td_error(TD_ERR_TIMEOUT, "timed out after %.1f s waiting for keys '%s0'..'%s%d' in the rendezvous store at "
                                    "%s: '%s%d' (at least) is missing",
                    timeout_s, prefix, prefix, comm->size - 1, store_address(comm->store), prefix,
                    missing_out && *missing_out >= 0 ? *missing_out : 0);
  return st;
}

td_status comm_rendezvous(td_comm *comm, double connect_timeout_s) {
  char identity[256], addr[128], value[512], prefix[200];
  TD_CHECK(net_host_identity(identity, sizeof identity));
  TD_CHECK(net_local_address(comm->tun.host_addr, comm->tun.iface, addr, sizeof addr));
  snprintf(value, sizeof value, "%d\n%s\n%ld\n%s", comm->size, identity, (long)getpid(), addr);
  snprintf(prefix, sizeof prefix, "%s/peer/", comm->prefix);

  /* One SET and one GATHER per rank: O(N) store requests for the job. */
  char **entries = NULL;
  int missing = -1;
  td_status st = comm_store_allgather(comm, prefix, value, strlen(value), connect_timeout_s, &entries, &missing);
  if (st != TD_OK) {
    char why[512];
    td_error_copy(why, sizeof why);
    if (st == TD_ERR_TIMEOUT && missing >= 0)
      return td_error(st, "rank %d: rank %d of %d (and maybe others) did not join the rendezvous of communicator %s "
                          "at %s within %g s (TANDEM_CONNECT_TIMEOUT): %s",
                      comm->rank, missing, comm->size, comm->prefix, store_address(comm->store), connect_timeout_s,
                      why);
    return td_error(st, "rank %d: the rendezvous of communicator %s failed: %s", comm->rank, comm->prefix, why);
  }
  for (int r = 0; r < comm->size; r++) {
    comm_rdv_entry e;
    st = comm_rdv_entry_parse(entries[r], r, &e);
    if (st != TD_OK) {
      char why[512];
      td_error_copy(why, sizeof why);
      free(entries);
      return td_error(st, "rank %d: in the rendezvous of communicator %s (key %s%d): %s", comm->rank, comm->prefix,
                      prefix, r, why);
    }
    if (e.size != comm->size) {
      free(entries);
      return td_error(TD_ERR_MISMATCH, "rank %d believes the world has %d ranks but rank %d believes %d: every "
                                       "rank of a job must be started with the same world size",
                      comm->rank, comm->size, r, e.size);
    }
    comm->hosts[r] = strdup(e.host);
    comm->addrs[r] = strdup(e.addr);
    comm->pids[r] = e.pid;
    if (!comm->hosts[r] || !comm->addrs[r]) {
      free(entries);
      return td_error(TD_ERR_SYSTEM, "out of memory in the rendezvous");
    }
  }
  free(entries);

  comm->local_size = 0;
  for (int r = 0; r < comm->size; r++) {
    if (strcmp(comm->hosts[r], comm->hosts[comm->rank])) continue;
    if (r == comm->rank) comm->local_rank = comm->local_size;
    comm->local_ranks[comm->local_size++] = r;
  }
  return TD_OK;
}

