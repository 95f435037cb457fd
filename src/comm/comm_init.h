/* Communicator construction for other layers inside the library (not the
 * public API): td_comm_init_config with a hook that can abandon the
 * rendezvous early. The elastic layer (src/train/elastic/state.c) builds
 * each epoch's communicator with it, so that a member that died between
 * the membership round and the rendezvous makes the others give up at once
 * instead of waiting TANDEM_CONNECT_TIMEOUT for its store keys. */
#ifndef TD_COMM_INIT_H
#define TD_COMM_INIT_H

#include "tandem/comm.h"

#include <stdbool.h>
#include <stddef.h>

/* Polled on the constructing thread between slices (0.25 s) of the
 * rendezvous waits for the other ranks' store keys; true (with the reason
 * in why) makes the construction fail with TD_ERR_REMOTE. */
typedef bool (*comm_abandon_fn)(void *ctx, char *why, size_t why_size);

/* td_comm_init_config, with abandon (may be NULL) polled during the
 * rendezvous; ctx is used only until this returns. */
td_status comm_init_abandonable(const td_comm_config *config, comm_abandon_fn abandon, void *ctx, td_comm **out);

#endif
