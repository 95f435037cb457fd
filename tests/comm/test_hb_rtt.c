/* Heartbeat round trips and missed beats (td_comm_heartbeat_stats), against
 * what the test itself imposed. One process, two heartbeat objects (ranks 0
 * and 1) on loopback, driven through heartbeat.h. Rank 1's beats to rank 0
 * go to a capture socket, and the test forwards them to rank 0 itself, so
 * the test plays rank 1 -> rank 0's link: it holds a beat for a known time
 * (a slow link), drops some (a lossy one), replays one and delivers one
 * late. The reference is the test's own clock: the kernel's arrival time of
 * each beat at the capture socket and the time the test forwarded it.
 *   - A beat with no echo yet (rank 1 took none of rank 0's) gives no
 *     round trip.
 *   - Rank 0 beats, rank 1 takes it and holds it ~0.1 s before its own beat
 *     echoes it, and the link delays that beat by ~0.2 s: rank 0's round
 *     trip is the link's delay (the forward time less the capture time, plus
 *     loopback's microseconds), not the hold: rank 1's hold is subtracted.
 *   - Ten beats of which the test forwards every second one: 5 missed.
 *   - A replayed beat and one arriving after a later one change no count.
 * Run with TANDEM_SECRET set (the suite line does). */
#define _GNU_SOURCE 1
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../common/check.h"
#include "comm/transport/tcp/heartbeat.h"
#include "hb_test_util.h"

#define HASH 0x0ddba11cafef00dull
#define BEAT_BYTES 80
/* What the round trip may exceed the imposed delay by: the loopback
 * transits and the moments between each side's clock read and its send,
 * microseconds when the machine is idle, more under load. */
#define SLACK_S 0.05

static double real_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One captured beat and the kernel's time of its arrival at the capture socket. */
static double capture(int cap, unsigned char beat[BEAT_BYTES]) {
  union {
    char buf[CMSG_SPACE(sizeof(struct timespec))];
    struct cmsghdr align;
  } control;
  struct iovec iov = {.iov_base = beat, .iov_len = BEAT_BYTES};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
                       .msg_controllen = sizeof control.buf};
  CHECK_EQ_INT(recvmsg(cap, &msg, 0), BEAT_BYTES);
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
      struct timespec ts;
      memcpy(&ts, CMSG_DATA(c), sizeof ts);
      return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
    }
  CHECK(!"the capture socket gave no arrival time");
  return 0;
}

/* Forward a beat to port; returns the test's clock just before the send. */
static double forward(int port, const unsigned char beat[BEAT_BYTES]) {
  double at = real_s(); /* a socket's creation after it only adds to the slack */
  hbt_send_to(port, beat, BEAT_BYTES);
  return at;
}

static td_heartbeat_stats row_of(tcp_heartbeat *hb) {
  td_heartbeat_stats row[2];
  memset(row, 0xff, sizeof row);
  CHECK_EQ_INT(heartbeat_stats(hb, NULL, 0), 1); /* one peer set: the count alone */
  CHECK_EQ_INT(heartbeat_stats(hb, row, 2), 1);
  CHECK_EQ_INT(row[0].peer, 1);
  return row[0];
}

int main(void) {
  hbt_pair t;
  hbt_pair_open(&t, HASH, true);
  tcp_heartbeat *hb0 = t.hb0, *hb1 = t.hb1;
  int p0 = t.p0, cap = t.cap;
  unsigned char beat[BEAT_BYTES];

  /* Nothing measured before any beat. */
  td_heartbeat_stats r = row_of(hb0);
  CHECK(r.beats == 0 && r.missed == 0 && r.rtt_samples == 0 && r.rtt_s == 0 && r.rtt_smoothed_s == 0);

  /* Rank 1's first beat echoes nothing: taken, no round trip. */
  heartbeat_send(hb1, false);
  capture(cap, beat);
  forward(p0, beat);
  hbt_drain(hb0, 1.0);
  r = row_of(hb0);
  CHECK(r.beats == 1 && r.missed == 0 && r.rtt_samples == 0);

  /* A slow link: rank 1 holds rank 0's beat ~0.1 s, the link delays the
   * echoing beat ~0.2 s. */
  heartbeat_send(hb0, false);
  hbt_drain(hb1, 1.0);
  usleep(100000);
  heartbeat_send(hb1, false);
  double captured = capture(cap, beat);
  usleep(200000);
  double sent = forward(p0, beat);
  hbt_drain(hb0, 2.0);
  r = row_of(hb0);
  double delay = sent - captured;
  printf("imposed delay %.6f s, measured round trip %.6f s (hold subtracted: ~0.12 s)\n", delay, r.rtt_s);
  CHECK(r.beats == 2 && r.missed == 0 && r.rtt_samples == 1);
  CHECK(r.rtt_s >= delay - 1e-6 && r.rtt_s <= delay + SLACK_S);
  CHECK(r.rtt_smoothed_s == r.rtt_s && r.rtt_min_s == r.rtt_s);
  double slow = r.rtt_s;

  /* A lossy link: of rank 1's next 10 beats (sequences 3..12) the test
   * forwards 4, 6, ..., 12, each at once: 5 missed, 5 more round trips,
   * each as short as the link now is (the hold of rank 0's beat, which
   * rank 1 still echoes, keeps growing and is subtracted). */
  unsigned char beats[10][BEAT_BYTES];
  double cap_at[10];
  for (int i = 0; i < 10; i++) heartbeat_send(hb1, false);
  for (int i = 0; i < 10; i++) cap_at[i] = capture(cap, beats[i]);
  double fwd_at = 0;
  for (int i = 1; i < 10; i += 2) fwd_at = forward(p0, beats[i]);
  hbt_drain(hb0, 3.0);
  r = row_of(hb0);
  printf("lossy link: %llu beats, %llu missed; last round trip %.6f s (link %.6f s), smoothed %.6f, min %.6f\n",
         (unsigned long long)r.beats, (unsigned long long)r.missed, r.rtt_s, fwd_at - cap_at[9], r.rtt_smoothed_s,
         r.rtt_min_s);
  CHECK(r.beats == 7 && r.missed == 5 && r.rtt_samples == 6);
  CHECK(r.rtt_s >= fwd_at - cap_at[9] - 1e-6 && r.rtt_s <= fwd_at - cap_at[9] + SLACK_S);
  CHECK(r.rtt_min_s <= r.rtt_s && r.rtt_min_s < slow);
  /* RFC 6298: between the first (slow) sample and the short ones, moving
   * an eighth of the way each time: above every short sample, below slow. */
  CHECK(r.rtt_smoothed_s > r.rtt_s && r.rtt_smoothed_s < slow);

  /* A replay of the last beat and the late delivery of sequence 11: no count moves. */
  forward(p0, beats[9]);
  forward(p0, beats[8]);
  hbt_drain(hb0, 4.0);
  td_heartbeat_stats again = row_of(hb0);
  CHECK(again.beats == 7 && again.missed == 5 && again.rtt_samples == 6 && again.rtt_s == r.rtt_s);

  hbt_pair_close(&t);
  printf("heartbeat round trips ok: the link's delay measured, the hold subtracted, gaps counted as missed\n");
  return 0;
}
