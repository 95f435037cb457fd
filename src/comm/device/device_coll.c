/* Which path runs a collective on device buffers, decided once per
 * communicator with every rank (device_coll.h has the whole picture):
 * NCCL when every rank has a GPU of its own and loads libnccl.so.2, the
 * staged path otherwise. The decision and its reason are logged at info
 * level by rank 0 ("device collectives: staged through host memory: ranks
 * 0 and 1 share cuda:0"), so a user sees which path runs. */
#include "comm/device/device_coll.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct device_coll {
  td_device dev;
  bool use_nccl;
  staged_state *staged;
  nccl_state *nccl;
};

static bool is_device(td_device d) { return d.kind != TD_DEVICE_CPU; }

bool device_coll_wants(const td_comm *comm, const comm_op *op, td_device *dev_out) {
  td_device cpu = {TD_DEVICE_CPU, 0};
  *dev_out = cpu;
  if (op->kind == COMM_BARRIER) return false;
  td_device s = op->send ? td_pointer_device(op->send) : cpu;
  td_device r = op->recv ? td_pointer_device(op->recv) : cpu;
  if (is_device(s) || is_device(r)) {
    *dev_out = is_device(s) ? s : r;
    return true;
  }
  return comm->tun.stage_host_buffers && op->kind != COMM_SEND && op->kind != COMM_RECV;
}

uint64_t device_coll_seq_span(const td_comm *comm, const comm_op *op) {
  if (op->count == 0) return 1;
  return staged_chunks(op, comm->size, comm_tun_bytes(comm->tun.device_chunk_bytes, DEVICE_CHUNK_BYTES_DEFAULT));
}

const char *device_coll_path(const td_comm *comm) {
  if (!comm->dev) return "none";
  if (comm->size == 1) return "self";
  return comm->dev->use_nccl ? "nccl" : "staged";
}

void device_coll_destroy(device_coll *dc) {
  if (!dc) return;
  staged_destroy(dc->staged);
  nccl_destroy(dc->nccl, false);
  td_free(dc);
}

/* One rank's entry in the path vote: "<nccl ok> <kind> <index> <hex id>". */
#define VOTE_BYTES (32 + 2 * NCCL_ID_BYTES)

static void hex_encode(const unsigned char *in, size_t n, char *out) {
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = digits[in[i] >> 4];
    out[2 * i + 1] = digits[in[i] & 15];
  }
  out[2 * n] = '\0';
}

static int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

typedef struct vote {
  int nccl_ok, kind, index;
  char id_hex[2 * NCCL_ID_BYTES + 1];
} vote;

static td_status vote_parse(const char *text, int rank, vote *v) {
  memset(v, 0, sizeof *v);
  if (sscanf(text, "%d %d %d %256s", &v->nccl_ok, &v->kind, &v->index, v->id_hex) != 4 ||
      (v->nccl_ok != 0 && v->nccl_ok != 1) || (v->kind != TD_DEVICE_CPU && v->kind != TD_DEVICE_CUDA) ||
      v->index < 0)
    return td_error(TD_ERR_INVALID_ARGUMENT, "device collectives: rank %d's entry '%.80s' in the store is malformed",
                    rank, text);
  return TD_OK;
}

/* Agree on the path with every rank. On return *use_nccl is the same on all
 * ranks and, when true, id holds rank 0's NCCL id. */
static td_status vote_path(td_comm *comm, td_device dev, bool *use_nccl, unsigned char id[NCCL_ID_BYTES]) {
  int mode = comm->tun.device_coll;
  char why_not[256] = "";
  bool nccl_ok = false;
  if (mode == COMM_DEVICE_COLL_STAGED) snprintf(why_not, sizeof why_not, "TANDEM_DEVICE_COLL=staged");
  else if (!is_device(dev)) snprintf(why_not, sizeof why_not, "host buffers (TANDEM_STAGE_HOST_BUFFERS=1)");
  else nccl_ok = nccl_loadable(why_not, sizeof why_not);
  memset(id, 0, NCCL_ID_BYTES);
  if (nccl_ok && comm->rank == 0) TD_CHECK(nccl_make_id(id));
  char mine[VOTE_BYTES], hex[2 * NCCL_ID_BYTES + 1];
  hex_encode(id, NCCL_ID_BYTES, hex);
  snprintf(mine, sizeof mine, "%d %d %d %s", nccl_ok ? 1 : 0, (int)dev.kind, dev.index, hex);
  char prefix[200];
  snprintf(prefix, sizeof prefix, "%s/devcoll/", comm->prefix);
  char **values = NULL;
  int missing = -1;
  td_status st = comm_store_allgather(comm, prefix, mine, strlen(mine), comm->tun.connect_timeout_s, &values, &missing);
  if (st != TD_OK) {
    char why[512];
    td_error_copy(why, sizeof why);
    return td_error(st, "rank %d: agreeing on the device collective path with the other ranks failed: %s", comm->rank,
                    why);
  }
  vote *votes = calloc((size_t)comm->size, sizeof *votes);
  if (!votes) {
    free(values);
    return td_error(TD_ERR_SYSTEM, "device collectives: out of memory");
  }
  for (int r = 0; r < comm->size && st == TD_OK; r++) st = vote_parse(values[r], r, &votes[r]);
  free(values);
  /* NCCL needs every rank on a GPU of its own (one NCCL rank per device). */
  bool all = st == TD_OK;
  for (int r = 0; r < comm->size && all; r++) {
    if (!votes[r].nccl_ok) {
      all = false;
      if (!why_not[0]) snprintf(why_not, sizeof why_not, "rank %d cannot use NCCL", r);
    }
    for (int q = 0; q < r && all; q++)
      if (votes[q].kind == votes[r].kind && votes[q].index == votes[r].index &&
          !strcmp(comm->hosts[q], comm->hosts[r])) {
        all = false;
        snprintf(why_not, sizeof why_not, "ranks %d and %d share cuda:%d", q, r, votes[r].index);
      }
  }
  if (all)
    for (int i = 0; i < NCCL_ID_BYTES; i++) {
      int hi = hex_value(votes[0].id_hex[2 * i]), lo = hex_value(votes[0].id_hex[2 * i + 1]);
      if (hi < 0 || lo < 0) {
        st = td_error(TD_ERR_INVALID_ARGUMENT, "device collectives: rank 0's NCCL id in the store is malformed");
        break;
      }
      id[i] = (unsigned char)(hi * 16 + lo);
    }
  free(votes);
  TD_CHECK(st);
  if (mode == COMM_DEVICE_COLL_NCCL && !all)
    return td_error(TD_ERR_INVALID_ARGUMENT, "rank %d: TANDEM_DEVICE_COLL=nccl, but NCCL cannot run here: %s (unset "
                                             "it to use the staged path)",
                    comm->rank, why_not);
  *use_nccl = all;
  if (comm->rank == 0) {
    if (all) TD_INFO("device collectives: NCCL %d (libnccl.so.2), one GPU per rank", nccl_version());
    else TD_INFO("device collectives: staged through pinned host memory (%s)", why_not);
  }
  return TD_OK;
}

td_status device_coll_setup(td_comm *comm, td_device dev) {
  char want[32], have[32];
  if (comm->dev) {
    if (comm->dev->dev.kind == dev.kind && comm->dev->dev.index == dev.index) return TD_OK;
    return td_error(TD_ERR_INVALID_ARGUMENT, "rank %d: a collective on %s buffers, but this communicator's device "
                                             "collectives run on %s: use one device per communicator "
                                             "(td_comm_split makes another)",
                    comm->rank, td_device_name(dev, want, sizeof want), td_device_name(comm->dev->dev, have, sizeof have));
  }
  if (is_device(dev)) TD_CHECK(td_device_open(dev));
  device_coll *dc = td_alloc(sizeof *dc);
  if (!dc) return td_error(TD_ERR_SYSTEM, "device collectives: out of memory");
  memset(dc, 0, sizeof *dc);
  dc->dev = dev;
  td_status st = TD_OK;
  if (comm->size > 1) {
    unsigned char id[NCCL_ID_BYTES];
    st = vote_path(comm, dev, &dc->use_nccl, id);
    if (st == TD_OK && dc->use_nccl) st = nccl_create(comm, dev, id, &dc->nccl);
    if (st == TD_OK && !dc->use_nccl) st = staged_create(dev, &dc->staged);
  }
  if (st != TD_OK) {
    device_coll_destroy(dc);
    return st;
  }
  comm->dev = dc;
  return TD_OK;
}

/* A world of one: the result is the input. */
static td_status self_copy(td_comm *comm, const comm_op *op) {
  size_t bytes = comm_op_bytes(op);
  if (op->send == op->recv || !bytes || op->kind == COMM_BROADCAST) return TD_OK;
  td_status st = td_device_copy(op->recv, td_pointer_device(op->recv), op->send, td_pointer_device(op->send), bytes);
  if (st != TD_OK)
    return td_error(st, "rank %d: %s on device buffers: copying %zu bytes failed: %s", comm->rank,
                    comm_kind_name(op->kind), bytes, td_last_error());
  return TD_OK;
}

td_status device_coll_execute(td_comm *comm, const comm_op *op) {
  device_coll *dc = comm->dev;
  if (!dc) return comm_fail(comm, TD_ERR_INTERNAL, "rank %d: a device collective ran before its setup", comm->rank);
  /* The executing thread may be the progress thread: make the device
   * current on it (cudaSetDevice is per thread). */
  if (is_device(dc->dev)) {
    td_status st = td_device_open(dc->dev);
    if (st != TD_OK) return comm_fail(comm, st, "rank %d: %s", comm->rank, td_last_error());
  }
  if (comm->size == 1) return self_copy(comm, op);
  if (op->count == 0) return TD_OK;
  if (dc->use_nccl && nccl_supports(comm, op)) return nccl_execute(comm, dc->nccl, op);
  if (!dc->staged) { /* NCCL declined this op: the staged path, created on first need */
    td_status st = staged_create(dc->dev, &dc->staged);
    if (st != TD_OK) return comm_fail(comm, st, "rank %d: %s", comm->rank, td_last_error());
  }
  return staged_execute(comm, dc->staged, op);
}
