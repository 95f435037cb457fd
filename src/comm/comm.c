/* The communicator's lifecycle, the top of src/comm: creation from the
 * environment or a config (launcher variables, store, rendezvous,
 * transport, algorithm table, progress thread), split, finalize, destroy,
 * and the accessors. Calls down into every folder below (core/core.h has
 * the map); nothing below calls it.
 *
 * The transport is picked from the rendezvous' host identities: shm when
 * all ranks share one host, tcp otherwise (or when forced). A job spanning
 * hosts uses tcp between all pairs, including ranks on the same host: a
 * hierarchical shm-inside/tcp-across transport is out of scope for now. */
#include "comm/core/core.h"
#include "comm/device/device_coll.h"
#include "comm/progress/progress.h"
#include "comm/rendezvous/rendezvous.h"
#include "comm/select/select.h"
#include "comm/transport/shm/shm.h"
#include "comm/transport/tcp/tcp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* What names a communicator in the store. Its keys live under
 * "<job id>/c<k>", where k counts the communicators this process created
 * before with the same job id. Communicators with distinct job ids are
 * therefore independent of each other: threads may create them in any
 * order, at the same time, and each rank in its own order. Creating several
 * with one job id (td_comm_init twice from the environment: init, destroy,
 * init again) pairs the k-th of every rank with the k-th of the others, so
 * every rank must create those in the same order, as MPI_Comm_dup demands;
 * concurrent creation with one job id from several threads has no such
 * order and needs distinct job ids (td_comm_config.job_id).
 *
 * A short list, not a hash: a process creates a handful of job ids. */
typedef struct job_count {
  struct job_count *next;
  unsigned long created;
  char job_id[];
} job_count;

static pthread_mutex_t job_counts_mu = PTHREAD_MUTEX_INITIALIZER;
static job_count *job_counts;

/* The next index for job_id, or -1 when out of memory. */
static long next_comm_index(const char *job_id) {
  pthread_mutex_lock(&job_counts_mu);
  job_count *j = job_counts;
  while (j && strcmp(j->job_id, job_id)) j = j->next;
  if (!j) {
    size_t len = strlen(job_id);
    j = malloc(sizeof *j + len + 1);
    if (j) {
      j->created = 0;
      memcpy(j->job_id, job_id, len + 1);
      j->next = job_counts;
      job_counts = j;
    }
  }
  long index = j ? (long)j->created++ : -1;
  pthread_mutex_unlock(&job_counts_mu);
  return index;
}

static td_comm *comm_alloc(int rank, int size) {
  td_comm *comm = calloc(1, sizeof *comm);
  if (!comm) return NULL;
  comm->rank = rank;
  comm->size = size;
  pthread_mutex_init(&comm->err_mu, NULL);
  pthread_mutex_init(&comm->stats_mu, NULL);
  atomic_store(&comm->err_status, TD_OK);
  comm->xport_name = "self";
  comm->local_ranks = calloc((size_t)size, sizeof *comm->local_ranks);
  comm->pids = calloc((size_t)size, sizeof *comm->pids);
  comm->hosts = calloc((size_t)size, sizeof *comm->hosts);
  comm->addrs = calloc((size_t)size, sizeof *comm->addrs);
  comm->send_seq = calloc((size_t)size, sizeof *comm->send_seq);
  comm->recv_seq = calloc((size_t)size, sizeof *comm->recv_seq);
  comm->world_ranks = calloc((size_t)size, sizeof *comm->world_ranks);
  if (!comm->local_ranks || !comm->pids || !comm->hosts || !comm->addrs || !comm->send_seq || !comm->recv_seq ||
      !comm->world_ranks) {
    td_comm_destroy(comm);
    return NULL;
  }
  for (int r = 0; r < size; r++) comm->world_ranks[r] = r; /* td_comm_split sets a child's */
  return comm;
}

static td_status create_transport(td_comm *comm) {
  int other_host = -1;
  for (int r = 0; r < comm->size && other_host < 0; r++)
    if (strcmp(comm->hosts[r], comm->hosts[0])) other_host = r;
  bool one_host = other_host < 0;

  transport *x = NULL;
  td_status st;
  if (!strcmp(comm->transport_req, "tcp")) {
    st = tcp_transport_create(comm, &x);
  } else if (!strcmp(comm->transport_req, "shm")) {
    if (!one_host)
      return td_error(TD_ERR_INVALID_ARGUMENT, "rank %d: the shm transport was requested, but rank 0 runs on "
                                               "%s and rank %d on %s: use TANDEM_TRANSPORT=tcp or auto",
                      comm->rank, comm->addrs[0], other_host, comm->addrs[other_host]);
    st = shm_transport_create(comm, &x);
  } else {
    st = one_host ? shm_transport_create(comm, &x) : tcp_transport_create(comm, &x);
  }
  if (st != TD_OK) return st;
  comm->xport = x;
  comm->xport_name = x->vtbl->name;
  return TD_OK;
}

/* Everything after rank, size, prefix, store and transport request are set:
 * rendezvous, transport, algorithm selection, progress thread. */
static td_status comm_setup(td_comm *comm, double connect_timeout_s) {
  if (comm->size == 1) {
    comm->local_rank = 0;
    comm->local_size = 1;
    comm->local_ranks[0] = 0;
    comm->pids[0] = getpid();
    comm->hosts[0] = strdup("self");
    comm->addrs[0] = strdup("self");
    if (!comm->hosts[0] || !comm->addrs[0]) return td_error(TD_ERR_SYSTEM, "out of memory creating a communicator");
  }
  double t0 = td_now(), t1 = t0, t2 = t0;
  if (comm->size > 1) {
    TD_CHECK(comm_rendezvous(comm, connect_timeout_s));
    t1 = td_now();
    TD_CHECK(create_transport(comm));
    t2 = td_now();
  }
  /* A communicator made by td_comm_split inherits the job's count; the
   * first one of a job is the job. */
  if (comm->host_size < comm->local_size) comm->host_size = comm->local_size;
  TD_CHECK(comm_select_init(comm));
  TD_CHECK(progress_start(comm));
  /* The phase times show where start-up goes at scale (bench/init.sh). */
  TD_DEBUG("communicator %s: rank %d of %d, local %d of %d, transport %s; rendezvous %.3f s, transport setup %.3f s",
           comm->prefix, comm->rank, comm->size, comm->local_rank, comm->local_size, comm->xport_name, t1 - t0,
           t2 - t1);
  return TD_OK;
}

/* Destroy a half-built communicator without losing the message of the error
 * that stopped its construction. */
static td_status destroy_half_built(td_comm *comm, td_status st) {
  char why[1024];
  td_error_copy(why, sizeof why);
  td_comm_destroy(comm);
  return td_error(st, "%s", why);
}

td_status td_comm_init_config(const td_comm_config *config, td_comm **out) {
  if (!out) return td_error(TD_ERR_INVALID_ARGUMENT, "td_comm_init: out is NULL");
  *out = NULL;
  comm_env env;
  TD_CHECK(comm_env_detect(config, &env));
  comm_tunables tun;
  TD_CHECK(comm_tunables_read(config, &tun));
  /* Ask once, here, whether the process sees a CUDA device, so that the
   * first collective's buffer check does not start the CUDA runtime. */
  (void)td_pointer_device(NULL);

  td_comm *comm = comm_alloc(env.rank, env.size);
  if (!comm) return td_error(TD_ERR_SYSTEM, "out of memory creating a communicator of %d ranks", env.size);
  long index = next_comm_index(env.job_id);
  if (index < 0) {
    td_error(TD_ERR_SYSTEM, "out of memory creating a communicator of %d ranks", env.size);
    return destroy_half_built(comm, TD_ERR_SYSTEM);
  }
  snprintf(comm->prefix, sizeof comm->prefix, "%s/c%ld", env.job_id, index);
  comm->tun = tun;
  comm->timeout_s = tun.timeout_s;
  comm->abandon_fn = config ? config->abandon : NULL;
  comm->abandon_ctx = config ? config->abandon_ctx : NULL;
  td_strlcpy(comm->transport_req, env.transport, sizeof comm->transport_req);

  td_status st;
  if (env.size > 1) {
    char prefix[32];
    snprintf(prefix, sizeof prefix, "rank %d", env.rank);
    td_log_set_prefix(prefix);
    if (env.host_store) {
      st = store_server_start(env.host_store_bind, env.host_store_port, &comm->store_server);
      if (st != TD_OK) {
        char why[512];
        td_error_copy(why, sizeof why);
        td_error(st, "rank 0 (started by %s) could not host the rendezvous store on %s:%d: %s. Set TANDEM_STORE "
                     "to a running store, or TANDEM_STORE_PORT/MASTER_PORT to a free port",
                 env.launcher, env.host_store_bind, env.host_store_port, why);
        return destroy_half_built(comm, st);
      }
    }
    st = store_connect(env.store, tun.connect_timeout_s, &comm->store);
    if (st != TD_OK) {
      char why[512];
      td_error_copy(why, sizeof why);
      td_error(st, "rank %d of %d (started by %s): %s. %s", env.rank, env.size, env.launcher, why,
               td_env_str("TANDEM_STORE", NULL) ? "Check that TANDEM_STORE names a running store"
                                                : "Set TANDEM_STORE=host:port to a store every rank can reach");
      return destroy_half_built(comm, st);
    }
  }
  st = comm_setup(comm, tun.connect_timeout_s);
  if (st != TD_OK) return destroy_half_built(comm, st);
  comm->abandon_fn = NULL; /* its context lives only as long as the construction */
  comm->abandon_ctx = NULL;
  *out = comm;
  return TD_OK;
}

td_status td_comm_init(td_comm **out) { return td_comm_init_config(NULL, out); }

/* ---- split ---- */

typedef struct split_entry {
  int64_t color, key, rank;
} split_entry;

static int split_cmp(const void *a, const void *b) {
  const split_entry *x = a, *y = b;
  if (x->key != y->key) return x->key < y->key ? -1 : 1;
  return x->rank < y->rank ? -1 : x->rank > y->rank;
}

static td_status comm_split(td_comm *comm, int color, int key, td_comm **out) {
  if (!out) return td_error(TD_ERR_INVALID_ARGUMENT, "td_comm_split: out is NULL");
  *out = NULL;
  if (!comm) return td_error(TD_ERR_INVALID_ARGUMENT, "td_comm_split: communicator is NULL");

  /* Everybody learns everybody's (color, key, rank) with one allgather: rank
   * r owns the 3 elements at offset 3r, exactly its td_shard_range. */
  size_t n = (size_t)comm->size;
  split_entry *all = calloc(n, sizeof *all);
  if (!all) return td_error(TD_ERR_SYSTEM, "td_comm_split: out of memory");
  all[comm->rank] = (split_entry){color, key, comm->rank};
  td_status st = td_allgather(&all[comm->rank], all, 3 * n, TD_I64, comm);
  if (st != TD_OK) {
    free(all);
    return st;
  }
  uint64_t split_index = comm->split_count++;
  if (color < 0) {
    free(all);
    return TD_OK;
  }

  /* Members of my color, ordered by (key, old rank). */
  size_t n_members = 0;
  for (size_t i = 0; i < n; i++)
    if (all[i].color == color) all[n_members++] = all[i];
  qsort(all, n_members, sizeof *all, split_cmp);
  int new_rank = -1;
  for (size_t i = 0; i < n_members; i++)
    if (all[i].rank == comm->rank) new_rank = (int)i;
  if (new_rank < 0) {
    free(all);
    return td_error(TD_ERR_INTERNAL, "td_comm_split: rank %d is missing from its own group", comm->rank);
  }

  td_comm *child = comm_alloc(new_rank, (int)n_members);
  if (!child) {
    free(all);
    return td_error(TD_ERR_SYSTEM, "td_comm_split: out of memory");
  }
  /* each member's world rank: its parent's, through the parent's table */
  for (size_t i = 0; i < n_members; i++) child->world_ranks[i] = comm->world_ranks[all[i].rank];
  child->split = true;
  free(all);
  int w = snprintf(child->prefix, sizeof child->prefix, "%s.s%llu.c%d", comm->prefix, (unsigned long long)split_index,
                   color);
  if (w < 0 || (size_t)w >= sizeof child->prefix) {
    td_comm_destroy(child);
    return td_error(TD_ERR_INVALID_USAGE, "td_comm_split: communicators nested too deeply (store prefix \"%s\" too long)",
                    comm->prefix);
  }
  child->tun = comm->tun;
  child->timeout_s = comm->timeout_s;
  child->host_size = comm->host_size;
  memcpy(child->transport_req, comm->transport_req, sizeof child->transport_req);
  double connect_timeout_s = comm->tun.connect_timeout_s;
  if (child->size > 1) {
    st = store_connect(store_address(comm->store), connect_timeout_s, &child->store);
    if (st != TD_OK) return destroy_half_built(child, st);
  }
  st = comm_setup(child, connect_timeout_s);
  if (st != TD_OK) return destroy_half_built(child, st);
  *out = child;
  return TD_OK;
}

td_status td_comm_split(td_comm *comm, int color, int key, td_comm **out) {
  return comm_note_failure(comm, comm_split(comm, color, key, out));
}

/* ---- finalize, destroy ---- */

static td_status comm_finalize(td_comm *comm) {
  if (!comm) return td_error(TD_ERR_INVALID_ARGUMENT, "td_comm_finalize: communicator is NULL");
  if (comm->finalized) return comm_status(comm);
  td_status st = progress_drain(comm);
  if (st == TD_OK && comm_status(comm) == TD_OK && comm->size > 1) st = td_barrier(comm);
  comm->finalized = true;
  td_status sticky = comm_status(comm);
  if (sticky != TD_OK) return td_error(sticky, "%s", comm->err_msg);
  return st;
}

td_status td_comm_finalize(td_comm *comm) { return comm_note_failure(comm, comm_finalize(comm)); }

void td_comm_destroy(td_comm *comm) {
  if (!comm) return;
  /* Leaving with work in flight: peers must not wait for us until their
   * timeout, and our own blocked operation must return so the thread can be
   * joined. */
  if (comm->queue && progress_busy(comm) && comm_status(comm) == TD_OK)
    comm_fail(comm, TD_ERR_INVALID_USAGE, "communicator destroyed while operations were still pending");
  if (comm->queue) progress_stop(comm);
  /* after the progress thread: nothing runs on the device streams now */
  device_coll_destroy(comm->dev);
  comm->dev = NULL;
  if (comm->xport) {
    transport *x = comm->xport;
    comm->xport = NULL;
    x->vtbl->destroy(x);
  }
  store_close(comm->store);
  store_server_stop(comm->store_server);
  for (int r = 0; r < comm->size && comm->hosts; r++) free(comm->hosts[r]);
  for (int r = 0; r < comm->size && comm->addrs; r++) free(comm->addrs[r]);
  free(comm->hosts);
  free(comm->addrs);
  free(comm->pids);
  free(comm->local_ranks);
  free(comm->world_ranks);
  free(comm->send_seq);
  free(comm->recv_seq);
  td_free(comm->half_work);
  pthread_mutex_destroy(&comm->err_mu);
  pthread_mutex_destroy(&comm->stats_mu);
  free(comm);
}

/* ---- accessors ---- */

int td_comm_rank(const td_comm *comm) { return comm ? comm->rank : -1; }
int td_comm_size(const td_comm *comm) { return comm ? comm->size : 0; }
int td_comm_world_rank(const td_comm *comm, int rank) {
  return comm && rank >= 0 && rank < comm->size ? comm->world_ranks[rank] : -1;
}
int td_comm_local_rank(const td_comm *comm) { return comm ? comm->local_rank : -1; }
int td_comm_local_size(const td_comm *comm) { return comm ? comm->local_size : 0; }
int td_comm_host_size(const td_comm *comm) { return comm ? comm->host_size : 0; }
const char *td_comm_transport(const td_comm *comm) { return comm ? comm->xport_name : ""; }
size_t td_comm_unexpected_limit(const td_comm *comm, size_t max_bytes) {
  /* p2p_stream_take_unexpected's conditions: a transport a stalled sender rings */
  if (!comm || comm->size < 2 || !comm->xport || !comm->xport->vtbl->take_stalled || !comm->xport->vtbl->try_peek)
    return 0;
  return comm->tun.p2p_unexpected_bytes != COMM_TUN_UNSET ? comm->tun.p2p_unexpected_bytes : max_bytes;
}
void td_comm_hold_unexpected(td_comm *comm, size_t max_bytes, size_t max_frame_bytes) {
  if (!comm) return;
  atomic_store_explicit(&comm->unx_frame_bytes, TD_MIN(max_frame_bytes, max_bytes), memory_order_relaxed);
  atomic_store_explicit(&comm->unx_cap_bytes, max_bytes, memory_order_relaxed);
}
int td_comm_silent_ranks(const td_comm *comm, int *ranks, int max) {
  if (!comm || !comm->xport || !comm->xport->vtbl->silent_peers || (max > 0 && !ranks)) return 0;
  return comm->xport->vtbl->silent_peers(comm->xport, ranks, max);
}
int td_comm_heartbeat_stats(const td_comm *comm, td_heartbeat_stats *rows, int max_rows) {
  if (!comm || !comm->xport || !comm->xport->vtbl->heartbeat_stats || (max_rows > 0 && !rows)) return 0;
  return comm->xport->vtbl->heartbeat_stats(comm->xport, rows, max_rows);
}
const char *td_comm_host(const td_comm *comm, int rank) {
  return comm && comm->hosts && rank >= 0 && rank < comm->size && comm->hosts[rank] ? comm->hosts[rank] : "";
}
