/* Adaptive heartbeat timeouts (TANDEM_HEARTBEAT_MIN_TIMEOUT; heartbeat.h):
 *   - the estimator against closed forms worked out by hand (mean + 5.612
 *     standard deviations, the deviation at least interval / 4, at least 2.5
 *     times the longest gap or remembered stall, clamped to [floor, cap],
 *     the cap below 8 gaps);
 *   - through the sockets: two heartbeat objects on loopback, rank 0
 *     adaptive, rank 1 beating every 20 ms: rank 0's timeout for rank 1
 *     falls to the floor once 8 gaps came (the cap before), and
 *     heartbeat_lost declares rank 1 lost past the floor although the fixed
 *     timeout it is given is 15 s; a rank 0 that is not adaptive keeps 15 s;
 *     a later adaptive object watching the same host starts from the
 *     window the closed one ended with;
 *   - the watcher's own stalls are left out of a peer's silence, until the
 *     peer is heard again.
 * Run with TANDEM_SECRET set (beats are authenticated). */
#define _GNU_SOURCE 1
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../common/check.h"
#include "comm/transport/tcp/heartbeat.h"
#include "hb_test_util.h"

#define HASH 0xfeedfacecafebeefull

static void fill(float *g, int n, float v) {
  for (int i = 0; i < n; i++) g[i] = v;
}

static void estimator(void) {
  float g[HB_WINDOW];
  /* Fewer than 8 gaps: the cap, whatever they say. */
  fill(g, 7, 0.25f);
  CHECK_CLOSE(heartbeat_adaptive_timeout(g, 7, 0, 0.25, 0.5, 6.0), 6.0, 0, 1e-12);
  CHECK_CLOSE(heartbeat_adaptive_timeout(g, 0, 0, 0.25, 0.5, 6.0), 6.0, 0, 1e-12);
  /* A steady sender: sd 0 -> interval / 4 = 0.0625; 0.25 + 5.612 * 0.0625
   * = 0.60075 is below 2.5 * 0.25 = 0.625. */
  fill(g, 16, 0.25f);
  CHECK_CLOSE(heartbeat_adaptive_timeout(g, 16, 0, 0.25, 0.5, 6.0), 0.625, 0, 1e-6);
  /* Gaps of 0.2 at an interval of 0.4 (the sd floor 0.1): 0.2 + 0.5612 =
   * 0.7612 over 2.5 * 0.2 = 0.5: the normal bound decides. */
  fill(g, 16, 0.2f);
  CHECK_CLOSE(heartbeat_adaptive_timeout(g, 16, 0, 0.4, 0.45, 6.0), 0.2 + 5.612 * 0.1, 0, 1e-6);
  /* 8 gaps of 0.1 and 8 of 0.5: mean 0.3, sd 0.2: 0.3 + 1.1224 = 1.4224
   * (2.5 * 0.5 = 1.25 is below). */
  fill(g, 8, 0.1f);
  fill(g + 8, 8, 0.5f);
  CHECK_CLOSE(heartbeat_adaptive_timeout(g, 16, 0, 0.25, 0.5, 6.0), 1.4224, 0, 1e-6);
  /* 15 gaps of 0.25 and one stall of 1.0: mean 0.296875, sd 0.18155
   * (0.296875 + 5.612 * 0.18155 = 1.3157) is below 2.5 * 1.0 = 2.5. */
  fill(g, 15, 0.25f);
  g[15] = 1.0f;
  CHECK_CLOSE(heartbeat_adaptive_timeout(g, 16, 0, 0.25, 0.5, 6.0), 2.5, 0, 1e-6);
  /* A stall remembered from before the window: 2.5 * 0.8 = 2.0. */
  fill(g, 16, 0.25f);
  CHECK_CLOSE(heartbeat_adaptive_timeout(g, 16, 0.8, 0.25, 0.5, 6.0), 2.0, 0, 1e-6);
  /* The floor: max(0.05 + 5.612 * 0.0125, 2.5 * 0.05) = 0.125 is raised to 0.5. */
  fill(g, 16, 0.05f);
  CHECK_CLOSE(heartbeat_adaptive_timeout(g, 16, 0, 0.05, 0.5, 6.0), 0.5, 0, 1e-12);
  /* The cap: 2.5 * 1.5 = 3.75 (over 1.5 + 0.35), capped at 3. */
  fill(g, 16, 1.5f);
  CHECK_CLOSE(heartbeat_adaptive_timeout(g, 16, 0, 0.25, 0.5, 6.0), 3.75, 0, 1e-6);
  CHECK_CLOSE(heartbeat_adaptive_timeout(g, 16, 0, 0.25, 0.5, 3.0), 3.0, 0, 1e-12);
  /* A full window, odd size edge: 255 gaps of 0.2 and one of 0 (two beats
   * drained together), interval 0.2: mean 0.2 * 255 / 256, sd 0.0125 ->
   * 0.05 floor of sd: 0.19922 + 0.2806 = 0.47982 (2.5 * 0.2 = 0.5 above it):
   * 0.5. And with interval 0.3 (sd floor 0.075): 0.19922 + 0.4209 = 0.62012. */
  fill(g, HB_WINDOW, 0.2f);
  g[HB_WINDOW - 1] = 0.0f;
  CHECK_CLOSE(heartbeat_adaptive_timeout(g, HB_WINDOW, 0, 0.2, 0.4, 6.0), 0.5, 0, 1e-6);
  CHECK_CLOSE(heartbeat_adaptive_timeout(g, HB_WINDOW, 0, 0.3, 0.4, 6.0), 0.2 * 255 / 256 + 5.612 * 0.075, 0, 1e-6);
}

/* Rank 1 sends n beats 20 ms apart; rank 0 drains them (at fake time now). */
static void beats(tcp_heartbeat *from, tcp_heartbeat *to, int n, double now) {
  for (int i = 0; i < n; i++) {
    heartbeat_send(from, false);
    usleep(20000);
  }
  usleep(20000);
  heartbeat_drain(to, now);
}

static void sockets(void) {
  int p0 = 0, p1 = 0, p2 = 0;
  int l0 = hbt_listener(&p0), l1 = hbt_listener(&p1), l2 = hbt_listener(&p2);
  tcp_heartbeat *hb0 = NULL, *hb1 = NULL, *fixed = NULL;
  bool taken = false;
  /* hb0 (adaptive) and fixed are both rank 0 of the communicator; hb1 is rank 1 and beats to both. */
  CHECK_OK(heartbeat_open(l0, 0, 2, HASH, &hb0, &taken));
  CHECK_OK(heartbeat_open(l1, 1, 2, HASH, &hb1, &taken));
  CHECK_OK(heartbeat_open(l2, 0, 2, HASH, &fixed, &taken));
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", p1);
  CHECK_OK(heartbeat_set_peer(hb0, 1, addr));
  CHECK_OK(heartbeat_set_peer(fixed, 1, addr));
  heartbeat_set_adaptive(hb0, 0.01, 0.5);
  heartbeat_reset(hb0, 0.0);
  heartbeat_reset(fixed, 0.0);

  /* Beats to hb0: 8 beats are 7 gaps, still the cap. */
  snprintf(addr, sizeof addr, "127.0.0.1:%d", p0);
  CHECK_OK(heartbeat_set_peer(hb1, 0, addr));
  beats(hb1, hb0, 8, 10.0);
  int n = -1;
  double mean = -1, longest = -1;
  CHECK_CLOSE(heartbeat_peer_timeout(hb0, 1, 15.0, &n, &mean, &longest), 15.0, 0, 1e-12);
  CHECK_EQ_INT(n, 7);
  /* 20 ms apart (and at most some scheduling delay on a loaded machine). */
  if (!(mean >= 0.015 && mean <= 0.25 && longest >= mean && longest <= 1.0))
    td_test_fail(__FILE__, __LINE__, "mean gap %.4f s, longest %.4f s: the kernel arrival times are not 20 ms apart",
                 mean, longest);
  /* One more: 8 gaps, adaptive: about 0.02 + 5.612 * max(sd, 0.0025), under the floor unless the machine stalled. */
  beats(hb1, hb0, 1, 20.0);
  double t = heartbeat_peer_timeout(hb0, 1, 15.0, &n, &mean, &longest);
  CHECK_EQ_INT(n, 8);
  if (!(t >= 0.5 && t <= 0.5 + 2.5 * longest + 5.612 * longest + 1e-9 && t < 15.0))
    td_test_fail(__FILE__, __LINE__, "adaptive timeout %.4f s from gaps of mean %.4f s, longest %.4f s", t, mean,
                 longest);
  /* Silent until just under the timeout: not lost; just past it: lost, though the fixed timeout is 15 s. */
  CHECK_EQ_INT(heartbeat_lost(hb0, -1, 20.0 + t - 0.01, 15.0), -1);
  CHECK_EQ_INT(heartbeat_lost(hb0, -1, 20.0 + t + 0.01, 15.0), 1);
  /* The cap still bounds it. */
  CHECK_EQ_INT(heartbeat_lost(hb0, -1, 20.0 + 0.45, 0.4), 1);

  /* A later adaptive object of this process watching the same host starts
   * from the window hb0 closed with: the same timeout before any beat. */
  heartbeat_close(hb0);
  close(l0);
  int p3 = 0, l3 = hbt_listener(&p3);
  tcp_heartbeat *next = NULL;
  CHECK_OK(heartbeat_open(l3, 0, 2, HASH, &next, &taken));
  heartbeat_set_adaptive(next, 0.01, 0.5);
  snprintf(addr, sizeof addr, "127.0.0.1:%d", p1);
  CHECK_OK(heartbeat_set_peer(next, 1, addr));
  int n_next = -1;
  CHECK_CLOSE(heartbeat_peer_timeout(next, 1, 15.0, &n_next, NULL, NULL), t, 0, 1e-12);
  CHECK_EQ_INT(n_next, 8);
  heartbeat_close(next);
  close(l3);

  /* Not adaptive: the same beats leave the fixed 15 s in force. */
  snprintf(addr, sizeof addr, "127.0.0.1:%d", p2);
  CHECK_OK(heartbeat_set_peer(hb1, 0, addr));
  beats(hb1, fixed, 12, 20.0);
  CHECK_CLOSE(heartbeat_peer_timeout(fixed, 1, 15.0, &n, NULL, NULL), 15.0, 0, 1e-12);
  CHECK_EQ_INT(n, 0);
  CHECK_EQ_INT(heartbeat_lost(fixed, -1, 20.0 + 14.9, 15.0), -1);
  CHECK_EQ_INT(heartbeat_lost(fixed, -1, 20.0 + 15.1, 15.0), 1);

  /* The watcher's own stalls (heartbeat_note_stall) are left out of the
   * silence: heard at 20, then stalls of 3 s and 1.5 s (and ignored ones of
   * 0 and -1 s): at 20 + 19 the silence is 14.5 s, not lost; lost past
   * 20 + 19.5. A beat heard afterwards starts a silence with no stall in it. */
  heartbeat_note_stall(fixed, 3.0);
  heartbeat_note_stall(fixed, 0.0);
  heartbeat_note_stall(fixed, -1.0);
  heartbeat_note_stall(fixed, 1.5);
  CHECK_CLOSE(heartbeat_own_stall(fixed, 1), 4.5, 0, 1e-12);
  CHECK_CLOSE(heartbeat_silence(fixed, 1, 20.0 + 19.0), 14.5, 0, 1e-9);
  CHECK_EQ_INT(heartbeat_lost(fixed, -1, 20.0 + 19.4, 15.0), -1);
  CHECK_EQ_INT(heartbeat_lost(fixed, -1, 20.0 + 19.6, 15.0), 1);
  heartbeat_heard(fixed, 1, 50.0);
  CHECK_CLOSE(heartbeat_own_stall(fixed, 1), 0.0, 0, 1e-12);
  CHECK_EQ_INT(heartbeat_lost(fixed, -1, 50.0 + 15.1, 15.0), 1);

  heartbeat_close(hb1);
  heartbeat_close(fixed);
  close(l1);
  close(l2);
}

int main(void) {
  CHECK(getenv("TANDEM_SECRET") != NULL);
  estimator();
  sockets();
  printf("heartbeat adaptive ok: estimator matches the closed forms; loopback beats set the timeout to the floor\n");
  return 0;
}
