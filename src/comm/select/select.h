/* The algorithm table (select.c): which algorithm runs each operation.
 * Above algorithms/, below the progress engine that calls it. */
#ifndef TD_COMM_SELECT_H
#define TD_COMM_SELECT_H

#include "comm/core/core.h"

/* Read the selection settings into comm (after the transport exists); an
 * unusable choice (TANDEM_ALLREDUCE_ALGO=shm without the shm transport) is
 * TD_ERR_INVALID_ARGUMENT. */
td_status comm_select_init(td_comm *comm);
/* Pick and run the algorithm for op on the calling thread, including the
 * finishing steps of TD_AVG and of f16/bf16 reductions on f32 partials;
 * blocks until done. Returns the communicator's status afterwards. */
td_status comm_execute(td_comm *comm, const comm_op *op);

#endif
