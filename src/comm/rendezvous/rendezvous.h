/* How ranks find each other: where this rank sits in the job (the
 * launcher's variables, launcher_env.c), and the rendezvous through the
 * store that tells every rank every other's host, pid and address
 * (rendezvous.c, rendezvous_entry.c). Called by the lifecycle (comm.c) and
 * the TCP transport's wiring; calls only core/ and src/net. */
#ifndef TD_COMM_RENDEZVOUS_H
#define TD_COMM_RENDEZVOUS_H

#include "comm/core/core.h"

/* What the environment (or an explicit config) says about this process. */
typedef struct comm_env {
  int rank, size;
  int local_rank, local_size; /* as the launcher says; -1 if unknown (we compute our own) */
  const char *launcher;       /* "tandemrun", "Open MPI", "PMI", "Slurm", "torchrun", "config", "none" */
  char store[256];            /* "host:port" to connect to; "" for a world of one */
  bool host_store;            /* this rank starts the store server */
  char host_store_bind[64];   /* address the server binds ("127.0.0.1", "0.0.0.0") */
  int host_store_port;
  char job_id[128];           /* store namespace */
  char transport[8];          /* "auto", "shm", "tcp" */
} comm_env;

/* Fill *env from config (may be NULL) and the environment. Bad values (a
 * rank out of range, a store address that does not parse, an unknown
 * transport) are TD_ERR_INVALID_ARGUMENT with a message naming the variable. */
td_status comm_env_detect(const td_comm_config *config, comm_env *env);

/* Publish this rank's entry under "<comm->prefix>/peer/" and read every
 * rank's back within connect_timeout_s: fills comm->hosts, addrs, pids and
 * the local rank/size/ranks. A rank that never comes is TD_ERR_TIMEOUT
 * naming it; entries that disagree on the world size are TD_ERR_MISMATCH. */
td_status comm_rendezvous(td_comm *comm, double connect_timeout_s);

/* Gather one value per rank under prefix (store_allgather) within
 * timeout_s, in slices that poll comm->abandon_fn when it is set: an
 * abandoned rendezvous fails with TD_ERR_REMOTE at once instead of waiting
 * for the whole timeout. */
td_status comm_store_allgather(td_comm *comm, const char *prefix, const void *value, size_t len, double timeout_s,
                               char ***values_out, int *missing_out);

/* One rank's rendezvous entry, "<size>\n<host identity>\n<pid>\n<address>"
 * (rendezvous_entry.c): split in place (host and addr point into entry),
 * every field checked; a malformed one is TD_ERR_INVALID_ARGUMENT naming
 * rank and field. */
typedef struct comm_rdv_entry {
  int size;
  pid_t pid;
  const char *host, *addr;
} comm_rdv_entry;
td_status comm_rdv_entry_parse(char *entry, int rank, comm_rdv_entry *out);

/* Slurm (slurm.c). comm_slurm_nodelist: a hostlist expression
 * ("n[01-04],gpu7", groups multiply: "r[1-2]n[1-3]" is 6 hosts) gives its
 * first host and its host count; empty or garbled lists (an open bracket, a
 * backward range, an empty entry) are TD_ERR_INVALID_ARGUMENT quoting it.
 * comm_slurm_tasks_per_node: "2(x3),1" gives the total tasks, the node count,
 * and the tasks on node node_id (-1 if node_id is outside or negative).
 * comm_slurm_layout: for env->launcher "Slurm", the store host (the step's
 * first node) into store_host, and env->local_size from the step's layout;
 * counts that disagree (SLURM_NTASKS against the tasks per node, the node
 * list against the node count, SLURM_LOCALID against its node's tasks), or
 * rank 0 away from the first node, are TD_ERR_INVALID_ARGUMENT naming the
 * variables, and so is a batch script (SLURM_PROCID without a step id).
 * Reads the environment only. */
td_status comm_slurm_nodelist(const char *list, char *first_out, size_t first_size, int *count_out);
td_status comm_slurm_tasks_per_node(const char *spec, int node_id, int *total_out, int *on_node_out, int *nodes_out);
td_status comm_slurm_layout(comm_env *env, char *store_host, size_t store_host_size);

#endif
