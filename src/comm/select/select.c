/* Algorithm selection: one table row per kind of operation, picking an
 * algorithm from values every rank shares (transport, byte size, TANDEM_*
 * settings read once per communicator), so that all ranks always run the
 * same algorithm. Also applies the finishing step of TD_AVG: most algorithms
 * compute the sum, and the result is divided by the world size exactly once
 * here (the ring and shm allreduces divide each slice at its owner
 * themselves: finish_avg).
 *
 *   kind            shm transport (default)   p2p (tcp, or TANDEM_SHM_COLLECTIVES=0)
 *   allreduce       allreduce_shm             rd if bytes <= TANDEM_RD_MAX_BYTES, else ring
 *   reduce_scatter  reduce_scatter_shm        reduce_scatter_ring
 *   allgather       allgather_shm             allgather_ring
 *   broadcast       broadcast_shm             broadcast_tree
 *   reduce          reduce_shm                reduce_tree
 *   alltoall        alltoall_shm              alltoall_pairwise
 *   barrier         barrier_shm               barrier_dissemination
 *   send/recv       p2p_send_recv             p2p_send_recv
 * TANDEM_ALLREDUCE_ALGO=ring|rd|shm forces the allreduce algorithm.
 *
 * Every operation executed here is also counted per (kind, algorithm) for
 * td_comm_collective_stats: calls, bytes and seconds on this rank. */
#include "comm/algorithms/algorithms.h"
#include "comm/select/select.h"

#include <string.h>

#define ALGO_AUTO COMM_ALGO_AUTO
#define ALGO_RING COMM_ALGO_RING
#define ALGO_RD COMM_ALGO_RD
#define ALGO_SHM COMM_ALGO_SHM

/* Below this many bytes, recursive doubling's log2(n) steps beat the ring's
 * 2(n-1) (TANDEM_RD_MAX_BYTES). */
#define RD_DEFAULT_MAX_BYTES ((size_t)64 << 10)

td_status comm_select_init(td_comm *comm) {
  bool on_shm = comm->xport_name && !strcmp(comm->xport_name, "shm");
  comm->sel_shm_collectives = on_shm && comm->tun.shm_collectives;
  comm->sel_rd_max_bytes = comm_tun_bytes(comm->tun.rd_max_bytes, RD_DEFAULT_MAX_BYTES);
  comm->sel_allreduce = comm->tun.allreduce_algo;
  /* A world of one runs no algorithm at all, so any choice is fine there. */
  if (comm->sel_allreduce == ALGO_SHM && !on_shm && comm->size > 1)
    return td_error(TD_ERR_INVALID_ARGUMENT, "TANDEM_ALLREDUCE_ALGO=shm needs the shm transport, but rank %d uses "
                                             "%s: use ring, rd or auto",
                    comm->rank, comm->xport_name);
  return TD_OK;
}

static comm_algo_fn pick_allreduce(const td_comm *comm, const comm_op *op) {
  switch (comm->sel_allreduce) {
  case ALGO_RING: return allreduce_ring;
  case ALGO_RD: return allreduce_rd;
  case ALGO_SHM: return allreduce_shm;
  default: break;
  }
  if (comm->sel_shm_collectives) return allreduce_shm;
  return comm_op_bytes(op) <= comm->sel_rd_max_bytes ? allreduce_rd : allreduce_ring;
}

static comm_algo_fn pick(const td_comm *comm, const comm_op *op) {
  bool shm = comm->sel_shm_collectives;
  switch (op->kind) {
  case COMM_ALLREDUCE: return pick_allreduce(comm, op);
  case COMM_REDUCE_SCATTER: return shm ? reduce_scatter_shm : reduce_scatter_ring;
  case COMM_ALLGATHER: return shm ? allgather_shm : allgather_ring;
  case COMM_BROADCAST: return shm ? broadcast_shm : broadcast_tree;
  case COMM_REDUCE: return shm ? reduce_shm : reduce_tree;
  case COMM_ALLTOALL: return shm ? alltoall_shm : alltoall_pairwise;
  case COMM_BARRIER: return shm ? barrier_shm : barrier_dissemination;
  case COMM_SEND:
  case COMM_RECV: return p2p_send_recv;
  }
  return NULL;
}

/* TD_AVG: divide this rank's part of the result by the world size, unless
 * the algorithm divided it itself (the ring allreduce divides each segment
 * once, at its owner, before the allgather: allreduce_ring.c; the shm
 * allreduce each slice at its owner, before sharing it: allreduce_shm.c). */
static bool divides_avg_itself(comm_algo_fn algo) { return algo == allreduce_ring || algo == allreduce_shm; }

static void finish_avg(const td_comm *comm, const comm_op *op, comm_algo_fn algo) {
  size_t offset, len;
  switch (op->kind) {
  case COMM_ALLREDUCE:
    if (divides_avg_itself(algo)) break;
    td_reduce_scale(op->recv, op->count, op->dtype, comm->size);
    break;
  case COMM_REDUCE:
    if (comm->rank == op->root) td_reduce_scale(op->recv, op->count, op->dtype, comm->size);
    break;
  case COMM_REDUCE_SCATTER:
    td_shard_range(op->count, comm->size, comm->rank, &offset, &len);
    td_reduce_scale(op->recv, len, op->dtype, comm->size);
    break;
  default:
    break;
  }
}

/* f16/bf16 reductions whose algorithm would round a partial result to the
 * half type at every hop (ring, recursive doubling, tree, ring
 * reduce-scatter) run on f32 partials instead: the input is widened into an
 * f32 work buffer, the algorithm runs on f32, and the result is rounded to
 * the half type once (TD_AVG divides in f32 first), so that "f16 and bf16 are
 * accumulated in f32" holds on every path. The shm algorithms combine every
 * rank's input in one pass (td_reduce_multi accumulates in f32 and rounds
 * once), so only their TD_AVG comes here, to divide before the one rounding.
 * MIN and MAX are exact in the half type and never come here. Cost: the
 * f32 partials are twice the bytes of the half type on the wire (1.5x for
 * the ring allreduce, below; docs/collectives.md), so
 * TANDEM_HALF_PARTIALS=half opts out: partials then travel in the half type,
 * rounded at every hop (at most n-1 roundings on any element's path; docs/collectives.md
 * states the bound), and TD_AVG divides the rounded sum. */
static bool rounds_per_hop(comm_algo_fn algo) {
  return algo == allreduce_ring || algo == allreduce_rd || algo == reduce_tree || algo == reduce_scatter_ring;
}

static bool needs_f32_partials(const td_comm *comm, const comm_op *op, comm_algo_fn algo) {
  if (op->dtype != TD_F16 && op->dtype != TD_BF16) return false;
  if (comm->tun.half_partials) return false;
  if (op->kind != COMM_ALLREDUCE && op->kind != COMM_REDUCE && op->kind != COMM_REDUCE_SCATTER) return false;
  if (op->redop == TD_AVG) return true;
  return (op->redop == TD_SUM || op->redop == TD_PROD) && rounds_per_hop(algo);
}

static td_status execute_f32_partials(td_comm *comm, const comm_op *op, comm_algo_fn algo) {
  if (op->count > SIZE_MAX / sizeof(float))
    return comm_fail(comm, TD_ERR_INVALID_ARGUMENT, "rank %d: count %zu of %s is too large for f32 partial results",
                     comm->rank, op->count, td_dtype_name(op->dtype));
  if (comm->half_work_count < op->count) {
    td_free(comm->half_work);
    comm->half_work_count = 0;
    comm->half_work = td_alloc(op->count * sizeof(float));
    if (!comm->half_work)
      return comm_fail(comm, TD_ERR_SYSTEM, "rank %d: out of memory for %zu bytes of f32 partial results (%s %s)",
                       comm->rank, op->count * sizeof(float), td_dtype_name(op->dtype), comm_kind_name(op->kind));
    comm->half_work_count = op->count;
  }
  float *work = comm->half_work;
  td_reduce_half_to_f32(work, op->send, op->count, op->dtype);
  comm_op wide = *op;
  wide.dtype = TD_F32;
  wide.send = work;
  /* The one rounding below divides an average: the algorithm sums (one that
   * divides TD_AVG itself would divide twice). */
  if (wide.redop == TD_AVG) wide.redop = TD_SUM;
  size_t offset = 0, len = op->count;
  int divisor = op->redop == TD_AVG ? comm->size : 1;
  if (op->kind == COMM_ALLREDUCE && algo == allreduce_ring) {
    /* The ring's allgather half moves finished results: each shard is
     * complete after the reduce-scatter half, so its owner rounds it once
     * and only the reduce-scatter moves f32 (1.5x the half type's bytes on
     * the wire instead of 2x). Both halves are frames of this allreduce. */
    td_shard_range(op->count, comm->size, comm->rank, &offset, &len);
    wide.recv = work + offset;
    td_status st = reduce_scatter_ring(comm, &wide);
    if (st != TD_OK) return st;
    char *recv = op->recv;
    size_t es = td_dtype_size(op->dtype);
    td_reduce_f32_to_half(recv + offset * es, work + offset, len, op->dtype, divisor);
    comm_op gather = *op;
    gather.send = recv + offset * es; /* in place: this rank's shard of recv */
    return allgather_ring(comm, &gather);
  }
  if (op->kind == COMM_REDUCE_SCATTER) td_shard_range(op->count, comm->size, comm->rank, &offset, &len);
  wide.recv = work + offset; /* in place (reduce-scatter: this rank's shard of send) */
  td_status st = algo(comm, &wide);
  if (st == TD_OK && (op->kind != COMM_REDUCE || comm->rank == op->root))
    td_reduce_f32_to_half(op->recv, work + offset, len, op->dtype, divisor);
  return st;
}

/* The names td_comm_collective_stats reports for the algorithms above. */
static const char *algorithm_name(comm_algo_fn algo) {
  static const struct {
    comm_algo_fn fn;
    const char *name;
  } names[] = {
      {allreduce_ring, "ring"},           {allreduce_rd, "rd"},       {allreduce_shm, "shm"},
      {reduce_scatter_ring, "ring"},      {reduce_scatter_shm, "shm"}, {allgather_ring, "ring"},
      {allgather_shm, "shm"},             {broadcast_tree, "tree"},   {broadcast_shm, "shm"},
      {reduce_tree, "tree"},              {reduce_shm, "shm"},        {alltoall_pairwise, "pairwise"},
      {alltoall_shm, "shm"},              {barrier_dissemination, "dissemination"},
      {barrier_shm, "shm"},               {p2p_send_recv, "p2p"},
  };
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (names[i].fn == algo) return names[i].name;
  return "other";
}

/* nccl-tests' data size of an operation: the whole buffer. */
static uint64_t stat_bytes(const td_comm *comm, const comm_op *op) {
  uint64_t bytes = comm_op_bytes(op);
  return op->kind == COMM_ALLTOALL ? bytes * (uint64_t)comm->size : op->kind == COMM_BARRIER ? 0 : bytes;
}

static void record(td_comm *comm, const comm_op *op, comm_algo_fn algo, double seconds) {
  const char *name = algorithm_name(algo);
  pthread_mutex_lock(&comm->stats_mu);
  int i = 0;
  while (i < comm->n_stats && (comm->stats[i].kind != op->kind || comm->stats[i].algorithm != name)) i++;
  if (i == comm->n_stats && i < COMM_MAX_STAT_ROWS) /* a new pair (a full table drops it: cannot happen) */
    comm->stats[comm->n_stats++] = (struct comm_stat_row){.kind = op->kind, .algorithm = name};
  if (i < comm->n_stats) {
    comm->stats[i].calls++;
    comm->stats[i].bytes += stat_bytes(comm, op);
    comm->stats[i].seconds += seconds;
  }
  pthread_mutex_unlock(&comm->stats_mu);
}

/* nccl-tests' bus factor: how many times the data size each rank's links
 * carry in the bandwidth-optimal algorithm. */
static double bus_factor(comm_kind kind, int n) {
  switch (kind) {
  case COMM_ALLREDUCE: return 2.0 * (n - 1) / n;
  case COMM_REDUCE_SCATTER:
  case COMM_ALLGATHER:
  case COMM_ALLTOALL: return (double)(n - 1) / n;
  case COMM_BARRIER: return 0;
  default: return 1;
  }
}

int td_comm_collective_stats(const td_comm *comm, td_coll_stats *rows, int max_rows) {
  if (!comm) return 0;
  td_comm *c = (td_comm *)comm; /* the lock only: the rows are not changed here */
  pthread_mutex_lock(&c->stats_mu);
  int n = c->n_stats;
  for (int i = 0; i < n && i < max_rows && rows; i++) {
    const struct comm_stat_row *r = &c->stats[i];
    rows[i] = (td_coll_stats){.operation = comm_kind_name(r->kind), .algorithm = r->algorithm, .calls = r->calls,
                              .bytes = r->bytes, .seconds = r->seconds,
                              .bus_bytes = (double)r->bytes * bus_factor(r->kind, c->size)};
  }
  pthread_mutex_unlock(&c->stats_mu);
  return n;
}

td_status comm_execute(td_comm *comm, const comm_op *op) {
  td_status st = comm_status(comm);
  if (st != TD_OK) return st;
  /* Nothing to move: every rank skips the same collective (its sequence
   * number was consumed at issue on every rank alike). A send or receive
   * of 0 elements still exchanges its header, so that a count disagreement
   * between the two sides is reported rather than waited out. */
  if (op->count == 0 && op->kind != COMM_BARRIER && op->kind != COMM_SEND && op->kind != COMM_RECV) return TD_OK;
  comm_algo_fn algo = pick(comm, op);
  if (!algo) return comm_fail(comm, TD_ERR_INTERNAL, "no algorithm for operation kind %d", (int)op->kind);
  double t0 = td_now();
  if (needs_f32_partials(comm, op, algo)) {
    TD_CHECK(execute_f32_partials(comm, op, algo));
  } else {
    TD_CHECK(algo(comm, op));
    if (op->redop == TD_AVG && (op->kind == COMM_ALLREDUCE || op->kind == COMM_REDUCE ||
                                op->kind == COMM_REDUCE_SCATTER))
      finish_avg(comm, op, algo);
  }
  st = comm_status(comm);
  if (st == TD_OK) record(comm, op, algo, td_now() - t0);
  return st;
}
