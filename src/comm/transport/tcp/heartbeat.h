/* Heartbeats between the ranks of a TCP communicator (heartbeat.c), used by
 * the transport's watcher thread (tcp.c) to tell a silent host from a busy
 * one. Internal to src/comm/transport/tcp.
 *
 * Each rank owns one UDP socket bound beside its TCP listener (same address,
 * same port number), so a peer's heartbeat address is the TCP address it
 * already published: no extra store keys. Every tick the watcher sends one
 * 80-byte authenticated beat (heartbeat.c) to every peer and drains the beats that arrived since the
 * last tick without waking in between, so a rank wakes once per interval
 * whatever the world size. None of these functions blocks; all are called
 * by the watcher thread only, except heartbeat_open/set_peer/close, which
 * run while no watcher uses the object, and heartbeat_stats (any thread). */
#ifndef TD_TCP_HEARTBEAT_H
#define TD_TCP_HEARTBEAT_H

#include <stdbool.h>
#include <stdint.h>

#include "base/base.h"
#include "tandem/comm.h"

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
/* Adaptive timeouts (TANDEM_HEARTBEAT_MIN_TIMEOUT below the timeout): each
 * peer's timeout follows the gaps between the kernel arrival times of its
 * last HB_WINDOW beats (heartbeat_adaptive_timeout), between floor_s and
 * the timeout_s given to heartbeat_lost. Off (one fixed timeout) until
 * called. Call before heartbeat_set_peer and the watcher. A peer whose host
 * an earlier heartbeat object of this process watched (closed since) starts
 * from the window that one ended with (process-wide memory, thread-safe). */
void heartbeat_set_adaptive(tcp_heartbeat *hb, double interval_s, double floor_s);
/* Beats whose arrival gaps an adaptive timeout is computed from (the last
 * 64 s at a 0.25 s interval), and how many gaps it needs before it adapts
 * (the fixed timeout applies until then). */
#define HB_WINDOW 256
#define HB_MIN_GAPS 8
/* The timeout of a peer whose last n beats (n <= HB_WINDOW) arrived gaps[]
 * seconds apart: phi accrual (Hayashibara et al., as Akka's failure
 * detector) with a normal model of the gaps: the silence whose probability
 * under that model is 1e-8 (phi = 8), mean + 5.61 standard deviations, the
 * deviation at least interval_s / 4 (a steady sender is not held to its
 * clock's exactness); and at least HB_STALL_FACTOR times the longest gap,
 * the window's or stall_s (a longer one seen before it, see
 * HB_STALL_HALF_LIFE_S), since a loaded machine's stalls are
 * heavier-tailed than a normal law. Clamped to [floor_s, cap_s]; cap_s
 * when n < HB_MIN_GAPS. Pure. */
double heartbeat_adaptive_timeout(const float *gaps, int n, double stall_s, double interval_s, double floor_s,
                                  double cap_s);
/* A 30-minute run at load 45 with 1.5 times the window's longest gap
 * declared a starved process lost once (silent 1.1 s, window's longest
 * 0.61 s): the factor is 2.5, and the longest gap is remembered beyond the
 * window, its memory halving every HB_STALL_HALF_LIFE_S seconds of beats
 * (short enough that a link's packet loss a few minutes ago does not keep
 * it at the fixed timeout). */
#define HB_STALL_FACTOR 2.5
#define HB_STALL_HALF_LIFE_S 120.0
/* The timeout that applies to peer now (cap_s when not adaptive), and its
 * window's statistics for messages (any of the outputs may be NULL;
 * longest_gap includes the remembered stall). */
double heartbeat_peer_timeout(const tcp_heartbeat *hb, int peer, double cap_s, int *n_gaps, double *mean_gap,
                              double *longest_gap);
/* The first peer above `after` (-1: from the start) not heard from for more
 * than its timeout (timeout_s, or its adaptive one, at most timeout_s), or -1. Only peers whose beats came at least once count:
 * one whose never did may sit behind a firewall that passes only TCP, and
 * must not be declared lost for that (see heartbeat_never_beat). */
int heartbeat_lost(const tcp_heartbeat *hb, int after, double now, double timeout_s);
/* The first peer above `after` from which no beat ever came, or -1. */
int heartbeat_never_beat(const tcp_heartbeat *hb, int after);
/* Seconds since peer was last heard from, less the watcher's own stalls
 * since then (heartbeat_note_stall): what heartbeat_lost compares. */
double heartbeat_silence(const tcp_heartbeat *hb, int peer, double now);
/* The watcher was not running for stall_s seconds when it was due (its
 * tick came that much later than the interval; <= 0: ignored). Those
 * seconds do not count in any peer's silence: on a starved machine (a CPU
 * quota, a VM's stolen time, a load far above the cores) the peers' beat
 * threads starve with this one, and a beat that a peer could not send while
 * this thread could not run either is no evidence that the peer is gone. A
 * peer that is gone stays silent, and is found that much later. */
void heartbeat_note_stall(tcp_heartbeat *hb, double stall_s);
/* The seconds of the watcher's stalls left out of peer's silence so far. */
double heartbeat_own_stall(const tcp_heartbeat *hb, int peer);
/* What the beats measured of each peer set with heartbeat_set_peer (round
 * trips from the echoes, beats taken and missed; td_comm_heartbeat_stats
 * says what each field means): up to max rows, returns how many there are.
 * Any thread (the one function here that is not the watcher's alone). */
int heartbeat_stats(tcp_heartbeat *hb, td_heartbeat_stats *rows, int max);

#endif
