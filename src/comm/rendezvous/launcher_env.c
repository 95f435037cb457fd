/* Where does this rank sit in the job? Reads the variables of the launchers
 * Tandem knows, in the order of DESIGN.md §2: tandemrun's TANDEM_*, Open
 * MPI, PMI, Slurm, torchrun. With none of them the process is a world of one
 * and needs no store. Also decides who hosts the rendezvous store when the
 * launcher does not (tandemrun always does). */
#include "comm/rendezvous/rendezvous.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Parse a non-negative integer variable; *found = false when unset. */
static td_status env_int(const char *name, int *out, bool *found) {
  const char *v = td_env_str(name, NULL);
  *found = false;
  if (!v) return TD_OK;
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || end == v || *end || x < 0 || x > 1 << 24)
    return td_error(TD_ERR_INVALID_ARGUMENT, "environment variable %s=\"%s\" is not a valid rank or size", name, v);
  *out = (int)x;
  *found = true;
  return TD_OK;
}

/* Rank and size from the first launcher whose variables are present. */
static td_status detect_launcher(comm_env *env) {
  static const struct {
    const char *launcher, *rank, *size, *local_rank, *local_size;
  } launchers[] = {
      {"tandemrun", "TANDEM_RANK", "TANDEM_WORLD_SIZE", "TANDEM_LOCAL_RANK", "TANDEM_LOCAL_SIZE"},
      {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
       "OMPI_COMM_WORLD_LOCAL_SIZE"},
      {"PMI", "PMI_RANK", "PMI_SIZE", NULL, NULL},
      {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", NULL},
      {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
  };
  for (size_t i = 0; i < TD_ARRAY_SIZE(launchers); i++) {
    bool have_rank, have_size, found;
    int rank = 0, size = 0;
    TD_CHECK(env_int(launchers[i].rank, &rank, &have_rank));
    TD_CHECK(env_int(launchers[i].size, &size, &have_size));
    if (have_rank != have_size && i == 0)
      return td_error(TD_ERR_INVALID_ARGUMENT, "%s is set but %s is not: set both (tandemrun does) or neither",
                      have_rank ? launchers[i].rank : launchers[i].size, have_rank ? launchers[i].size : launchers[i].rank);
    if (!have_rank || !have_size) continue;
    if (size < 1 || rank >= size)
      return td_error(TD_ERR_INVALID_ARGUMENT, "%s says rank %d of world size %d (%s, %s): the rank must be below the size",
                      launchers[i].launcher, rank, size, launchers[i].rank, launchers[i].size);
    env->launcher = launchers[i].launcher;
    env->rank = rank;
    env->size = size;
    if (launchers[i].local_rank) TD_CHECK(env_int(launchers[i].local_rank, &env->local_rank, &found));
    if (launchers[i].local_size) TD_CHECK(env_int(launchers[i].local_size, &env->local_size, &found));
    return TD_OK;
  }
  env->launcher = "none";
  env->rank = 0;
  env->size = 1;
  env->local_rank = 0;
  env->local_size = 1;
  return TD_OK;
}

/* The launcher's own job id, used to namespace store keys and to derive a
 * store port that concurrent jobs do not share. "" if none. */
static void launcher_job_id(char *buf, size_t size) {
  const char *ompi = td_env_str("OMPI_MCA_ess_base_jobid", NULL);
  const char *slurm_job = td_env_str("SLURM_JOB_ID", NULL);
  const char *torch = td_env_str("TORCHELASTIC_RUN_ID", NULL);
  buf[0] = '\0';
  if (ompi) {
    snprintf(buf, size, "ompi-%s", ompi);
  } else if (slurm_job) {
    snprintf(buf, size, "slurm-%s.%s", slurm_job, td_env_str("SLURM_STEP_ID", "0"));
  } else if (torch) {
    snprintf(buf, size, "torch-%s", torch);
  }
}

/* FNV-1a: a stable hash so that every rank derives the same port. */
static uint64_t hash_str(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

td_status comm_env_detect(const td_comm_config *config, comm_env *env) {
  memset(env, 0, sizeof *env);
  env->local_rank = env->local_size = -1;

  if (config && config->world_size > 0) {
    if (config->rank < 0 || config->rank >= config->world_size)
      return td_error(TD_ERR_INVALID_ARGUMENT, "td_comm_config: rank %d is outside 0..%d (world_size %d)",
                      config->rank, config->world_size - 1, config->world_size);
    env->launcher = "config";
    env->rank = config->rank;
    env->size = config->world_size;
  } else if (config && config->world_size < 0) {
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_comm_config: world_size %d is negative (0 detects it)",
                    config->world_size);
  } else {
    TD_CHECK(detect_launcher(env));
  }

  /* Namespace of the store keys. */
  char launcher_id[96];
  launcher_job_id(launcher_id, sizeof launcher_id);
  const char *job = config && config->job_id && *config->job_id ? config->job_id
                    : td_env_str("TANDEM_JOB_ID", NULL)        ? td_env_str("TANDEM_JOB_ID", NULL)
                    : *launcher_id                             ? launcher_id
                                                               : "default";
  if (strlen(job) >= sizeof env->job_id || strchr(job, '/'))
    return td_error(TD_ERR_INVALID_ARGUMENT, "job id \"%s\" must be shorter than %zu characters and contain no '/'",
                    job, sizeof env->job_id);
  td_strlcpy(env->job_id, job, sizeof env->job_id);

  /* Transport request. */
  const char *tr = config && config->transport && *config->transport ? config->transport
                                                                    : td_env_str("TANDEM_TRANSPORT", "auto");
  if (strcmp(tr, "auto") && strcmp(tr, "shm") && strcmp(tr, "tcp"))
    return td_error(TD_ERR_INVALID_ARGUMENT, "unknown transport \"%s\" (TANDEM_TRANSPORT or config): use auto, shm or tcp",
                    tr);
  td_strlcpy(env->transport, tr, sizeof env->transport);

  /* Store address. A world of one never talks to a store. */
  if (env->size == 1) return TD_OK;
  const char *store = config && config->store && *config->store ? config->store : td_env_str("TANDEM_STORE", NULL);
  const char *master_addr = td_env_str("MASTER_ADDR", NULL), *master_port = td_env_str("MASTER_PORT", NULL);
  char host[256];
  int port;
  if (store) {
    /* tandemrun (or the user) hosts it. */
    TD_CHECK(net_parse_addr(store, host, sizeof host, &port));
    td_strlcpy(env->store, store, sizeof env->store);
    return TD_OK;
  }
  if (master_addr && master_port) {
    /* torchrun convention (TCPStore): rank 0 hosts the store on MASTER_PORT,
     * reachable from other hosts at MASTER_ADDR. Under a real torchrun
     * agent (TORCHELASTIC_RUN_ID) that port is the agent's own store, which
     * speaks torch's protocol: Tandem's goes on TANDEM_STORE_PORT at
     * MASTER_ADDR instead. (Python ranks agree on a port through the
     * agent's store and set TANDEM_STORE: python/tandem/__init__.py.) */
    const char *agent_run = td_env_str("TORCHELASTIC_RUN_ID", NULL);
    long agent_port = td_env_long("TANDEM_STORE_PORT", 0);
    if (agent_run && !(agent_port > 0 && agent_port < 65536))
      return td_error(TD_ERR_INVALID_ARGUMENT,
                      "rank %d of %d was started by a torchrun agent (run %s), whose own store listens on "
                      "MASTER_PORT %s: Tandem's store cannot share it. Set TANDEM_STORE_PORT to a free port of "
                      "MASTER_ADDR (rank 0 hosts Tandem's store there) or TANDEM_STORE to a running store; Python "
                      "programs (tandem.init, init_process_group(\"tandem\")) find one through the agent by themselves",
                      env->rank, env->size, agent_run, master_port);
    char addr[300];
    if (agent_run) snprintf(addr, sizeof addr, "%s:%ld", master_addr, agent_port);
    else snprintf(addr, sizeof addr, "%s:%s", master_addr, master_port);
    TD_CHECK(net_parse_addr(addr, host, sizeof host, &port));
    if (env->rank == 0) {
      env->host_store = true;
      /* Bound to MASTER_ADDR itself, not 0.0.0.0: only that interface is
       * exposed (and without a job secret only loopback is allowed). */
      td_strlcpy(env->host_store_bind, host, sizeof env->host_store_bind);
      env->host_store_port = port;
    }
    /* Rank 0 too dials MASTER_ADDR: the store listens only there, so
     * 127.0.0.1 reaches it only when MASTER_ADDR is loopback. */
    td_strlcpy(env->store, addr, sizeof env->store);
    return TD_OK;
  }
  /* Another launcher without a store: rank 0 hosts one at TANDEM_STORE_PORT
   * or at a port derived from the launcher's job id, so that concurrent jobs
   * do not collide. */
  long fixed_port = td_env_long("TANDEM_STORE_PORT", 0);
  if (fixed_port > 0 && fixed_port < 65536) {
    port = (int)fixed_port;
  } else if (*launcher_id) {
    port = 20000 + (int)(hash_str(launcher_id) % 40000);
  } else {
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "rank %d of %d (from %s) cannot find the rendezvous store: set TANDEM_STORE=host:port to a "
                    "running store, MASTER_ADDR and MASTER_PORT (rank 0 then hosts it), or TANDEM_STORE_PORT "
                    "(rank 0 hosts it on 127.0.0.1), or start the job with tandemrun",
                    env->rank, env->size, env->launcher);
  }
  if (!strcmp(env->launcher, "Slurm")) {
    /* srun knows every node of the step: rank 0 hosts the store on the
     * first one, bound to that node's own address (as for MASTER_ADDR), and
     * every rank dials it by name (slurm.c checks the layout). */
    char node[sizeof env->host_store_bind];
    TD_CHECK(comm_slurm_layout(env, node, sizeof node));
    if (env->rank == 0) {
      env->host_store = true;
      td_strlcpy(env->host_store_bind, node, sizeof env->host_store_bind);
      env->host_store_port = port;
    }
    snprintf(env->store, sizeof env->store, "%s:%d", node, port);
    return TD_OK;
  }
  /* mpirun and the rest: loopback only. This reaches the ranks on rank 0's
   * host; multi-host jobs set TANDEM_STORE. */
  if (env->rank == 0) {
    env->host_store = true;
    td_strlcpy(env->host_store_bind, "127.0.0.1", sizeof env->host_store_bind);
    env->host_store_port = port;
  }
  snprintf(env->store, sizeof env->store, "127.0.0.1:%d", port);
  return TD_OK;
}
