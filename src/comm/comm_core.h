/* Internals shared by the communicator core files (comm.c, env.c,
 * progress.c, collectives.c), and nothing else: how a rank finds its place
 * in the job, and the progress engine's request helpers. Algorithms and
 * transports use comm_impl.h only. */
#ifndef TD_COMM_CORE_H
#define TD_COMM_CORE_H

#include "comm/comm_impl.h"

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

/* p2p.c: run queued send/recv operations as one set that progresses
 * concurrently and grows while it runs. pull() hands over up to max more
 * operations (deadlines set) with a tag each, returning how many (0: none
 * now); done() reports each operation's completion, in any order. Returns
 * when pull() has nothing more and the set is empty; on a failure every
 * operation in the set and every one pulled afterwards is completed with
 * the error. */
typedef int (*p2p_stream_pull_fn)(void *ctx, comm_op *ops_out, void **tags_out, int max);
typedef void (*p2p_stream_done_fn)(void *ctx, void *tag, td_status status);
td_status p2p_stream(td_comm *comm, p2p_stream_pull_fn pull, p2p_stream_done_fn done, void *ctx);

/* A request that is already complete with `status` (world-of-one operations
 * and failures detected at issue time). NULL on allocation failure. */
td_request *progress_request_done(td_status status);
/* True while operations are queued or executing. */
bool progress_busy(td_comm *comm);

#endif
