/* The TCP transport (tcp.c), for the communicator's lifecycle: its
 * constructor. Everything else reaches it through the transport vtable
 * (core/core.h). */
#ifndef TD_TCP_TRANSPORT_H
#define TD_TCP_TRANSPORT_H

#include "comm/core/core.h"

/* Listen, publish this rank's address under comm->prefix in comm->store,
 * and connect to every peer with authentication; returns when connected to
 * all of them (the wiring is described in tcp.c). */
td_status tcp_transport_create(td_comm *comm, transport **out);

#endif
