/* The progress engine (progress.c): per-communicator request queue and
 * progress thread, td_wait/td_test. Called by the public collectives and
 * the lifecycle; it calls down into select/ (collectives) and p2p/
 * (send/recv streams). */
#ifndef TD_COMM_PROGRESS_H
#define TD_COMM_PROGRESS_H

#include "comm/core/core.h"

td_status progress_start(td_comm *comm);
void progress_stop(td_comm *comm); /* after draining; called by destroy */
/* Run op now if nothing is queued (blocking form), else queue it and wait. */
td_status progress_run_blocking(td_comm *comm, const comm_op *op);
/* Queue op for the progress thread; *req_out completes when it has run. */
td_status progress_submit(td_comm *comm, const comm_op *op, td_request **req_out);
/* Wait until every queued op has run. */
td_status progress_drain(td_comm *comm);
/* A request that is already complete with `status` (world-of-one operations
 * and failures detected at issue time). NULL on allocation failure. */
td_request *progress_request_done(td_status status);
/* True while operations are queued or executing, not counting one whose
 * request already completed (its thread may still be finishing up). */
bool progress_busy(td_comm *comm);

#endif
