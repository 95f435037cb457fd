/* Collectives whose buffers are device memory (issue 18), inside src/comm.
 *
 * The public collectives (tandem/comm.h) accept device pointers as they
 * accept host pointers; collectives.c asks device_coll_wants() at issue time
 * and, for a device operation, hands it here instead of to the host
 * algorithms. Two paths, chosen once per communicator by
 * device_coll_setup() (the same choice on every rank):
 *
 *   nccl    every rank has its own GPU and libnccl.so.2 loads on every rank
 *           (nccl.c, dlopen: no NCCL, no failure): the collective runs on the
 *           communicator's NCCL stream.
 *   staged  any other placement, e.g. several ranks sharing one GPU
 *           (staged.c): device -> pinned host chunks, the host algorithms of
 *           select.c on each chunk, host -> device, pipelined so that the
 *           copies of neighbouring chunks overlap the reduction.
 *
 * TANDEM_DEVICE_COLL=auto|nccl|staged forces a path (nccl refuses clearly
 * when it cannot run). TANDEM_DEVICE_CHUNK_BYTES sizes the staged chunks.
 * TANDEM_STAGE_HOST_BUFFERS=1 sends host buffers through the staged path too
 * (tests and benchmarks on machines without a GPU: with the CPU device
 * backend the "copies" are memcpy, and everything else is the real path).
 *
 * Contract for callers (the same as NCCL's host-side view): device buffers
 * must hold their final values when the collective is issued (synchronize
 * the stream that wrote them, or wait on its event), and a blocking
 * collective returns (a request completes) only after the results are in
 * device memory. Every rank passes buffers of the same placement kind
 * (all device or all host) for a given collective; otherwise the ranks'
 * sequence numbers disagree and the next collective fails with
 * TD_ERR_MISMATCH naming them. One device per communicator. */
#ifndef TD_COMM_DEVICE_COLL_H
#define TD_COMM_DEVICE_COLL_H

#include "comm/core/core.h"
#include "comm/rendezvous/rendezvous.h"
#include "comm/select/select.h"
#include "tandem/device.h"

/* staged chunk size when TANDEM_DEVICE_CHUNK_BYTES is unset: see staged.c */
#define DEVICE_CHUNK_BYTES_DEFAULT ((size_t)4 << 20)

typedef struct device_coll device_coll; /* per communicator; comm->dev */

/* Does op go through this file (some buffer is device memory, or
 * TANDEM_STAGE_HOST_BUFFERS=1)? Sets *dev_out to the device of the buffers
 * (TD_DEVICE_CPU for staged host buffers). Issuing thread. */
bool device_coll_wants(const td_comm *comm, const comm_op *op, td_device *dev_out);

/* Prepare comm for device collectives on `dev` on the first device
 * operation (issuing thread, collective: every rank's first device
 * operation is the same one): pick the path with the other ranks through the
 * store, create streams, events and (nccl) the NCCL communicator. Later
 * calls check that dev is the device chosen then. */
td_status device_coll_setup(td_comm *comm, td_device dev);

/* How many collective sequence numbers op takes: one per staged chunk (at
 * least 1), on every path, so that the count never depends on which path
 * a rank took. Depends only on values every rank shares. */
uint64_t device_coll_seq_span(const td_comm *comm, const comm_op *op);

/* Run a device op (executing thread: the caller's or the progress thread).
 * A world of one copies send -> recv through the device layer. */
td_status device_coll_execute(td_comm *comm, const comm_op *op);

/* Free everything (destroy: no communication). Accepts NULL. */
void device_coll_destroy(device_coll *dc);

/* The path comm's device collectives took: "nccl", "staged" (also when
 * NCCL declined some operations), "self" (a world of one), or "none" (no
 * device collective yet). For tests and logs. */
const char *device_coll_path(const td_comm *comm);

/* ---- the two paths (staged.c, nccl.c), for device_coll.c ---- */

typedef struct staged_state staged_state;
td_status staged_create(td_device dev, staged_state **out);
void staged_destroy(staged_state *st);
td_status staged_execute(td_comm *comm, staged_state *st, const comm_op *op);
/* The staged chunking of op: the number of chunks (>= 1). */
uint64_t staged_chunks(const comm_op *op, int size, size_t chunk_bytes);
/* The staged path's sets of host buffers (an in and an out buffer each,
 * one chunk long: while one set's chunk is reduced, the next one's copies run) */
#define STAGED_SETS 2
/* The host buffers staged_execute holds after collectives of up to
 * message_bytes on comm (td_comm_staging_bytes's device traffic). Inline:
 * comm/mem.c counts them, and staged.c allocates through mem.c. */
static inline size_t staged_host_bytes(const td_comm *comm, size_t message_bytes) {
  if (!comm || comm->size < 2) return 0;
  const size_t chunk = comm_tun_bytes(comm->tun.device_chunk_bytes, DEVICE_CHUNK_BYTES_DEFAULT);
  return 2 * STAGED_SETS * (message_bytes < chunk ? message_bytes : chunk);
}

typedef struct nccl_state nccl_state;
/* Load libnccl.so.2 once per process; NULL and a reason in why when it
 * cannot be (not installed, too old, missing symbols). */
bool nccl_loadable(char *why, size_t why_size);
int nccl_version(void);
/* The NCCL unique id to share (rank 0 creates it). */
#define NCCL_ID_BYTES 128
td_status nccl_make_id(unsigned char id[NCCL_ID_BYTES]);
td_status nccl_create(td_comm *comm, td_device dev, const unsigned char id[NCCL_ID_BYTES], nccl_state **out);
void nccl_destroy(nccl_state *ns, bool abort_it);
/* Can NCCL run op with Tandem's semantics (nccl.c says which it declines)? */
bool nccl_supports(const td_comm *comm, const comm_op *op);
td_status nccl_execute(td_comm *comm, nccl_state *ns, const comm_op *op);

#endif
