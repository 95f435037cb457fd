/* Heartbeats between the ranks of a TCP communicator (heartbeat.c), used by
 * the transport's watcher thread (tcp.c) to tell a silent host from a busy
 * one. Internal to src/comm/transport/tcp.
 *
 * Each rank owns one UDP socket bound beside its TCP listener (same address,
 * same port number), so a peer's heartbeat address is the TCP address it
 * already published: no extra store keys. Every tick the watcher sends one
 * 64-byte authenticated beat (heartbeat.c) to every peer and drains the beats that arrived since the
 * last tick without waking in between, so a rank wakes once per interval
 * whatever the world size. None of these functions blocks; all are called
 * by the watcher thread only, except heartbeat_open/set_peer/close, which
 * run while no watcher uses the object. */
#ifndef TD_TCP_HEARTBEAT_H
#define TD_TCP_HEARTBEAT_H

#include <stdbool.h>
#include <stdint.h>

#include "base/base.h"

typedef struct tcp_heartbeat tcp_heartbeat;

/* A UDP socket bound to the address and port listen_fd is bound to. When
 * the port is taken for UDP (rare: the TCP and UDP port spaces are
 * separate), returns TD_ERR_SYSTEM with *port_taken = true so that the caller
 * can listen again on another port. comm_hash tells this communicator's beats
 * from any other's that reach the port. */
td_status heartbeat_open(int listen_fd, int rank, int size, uint64_t comm_hash, tcp_heartbeat **out,
                         bool *port_taken);
/* Where peer's beats go: its published TCP address "host:port". */
td_status heartbeat_set_peer(tcp_heartbeat *hb, int peer, const char *addr);
void heartbeat_close(tcp_heartbeat *hb); /* NULL is fine */

/* Send one beat to every peer not forgotten; failed says that this rank's
 * communicator has failed (peers then look for the published reason). */
void heartbeat_send(tcp_heartbeat *hb, bool failed);
/* Read every beat that arrived: a peer heard from counts as alive at now. */
void heartbeat_drain(tcp_heartbeat *hb, double now);
/* Count peer as heard at now (data arrived from it). */
void heartbeat_heard(tcp_heartbeat *hb, int peer, double now);
/* Count every peer as heard at now (start of monitoring, or after this
 * process itself was not running and so could not listen). */
void heartbeat_reset(tcp_heartbeat *hb, double now);
/* Stop expecting beats from peer (its connection hung up: the transport
 * reports that path itself). */
void heartbeat_forget(tcp_heartbeat *hb, int peer);
/* A peer whose beats said its communicator failed, or -1. */
int heartbeat_failed_peer(const tcp_heartbeat *hb);
/* The first peer above `after` (-1: from the start) not heard from for more
 * than timeout_s, or -1. Only peers whose beats came at least once count:
 * one whose never did may sit behind a firewall that passes only TCP, and
 * must not be declared lost for that (see heartbeat_never_beat). */
int heartbeat_lost(const tcp_heartbeat *hb, int after, double now, double timeout_s);
/* The first peer above `after` from which no beat ever came, or -1. */
int heartbeat_never_beat(const tcp_heartbeat *hb, int after);
/* Seconds since peer was last heard from. */
double heartbeat_silence(const tcp_heartbeat *hb, int peer, double now);

#endif
