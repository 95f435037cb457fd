/* Heartbeats are authenticated (issue 7, item 6's open gap): only a process
 * holding the job's secret can make a beat, and a recorded beat replayed
 * later is refused. One process, two heartbeat objects (ranks 0 and 1 of a
 * communicator) on loopback, driven through heartbeat.h:
 *   - a genuine beat from rank 1 is taken: rank 0 hears rank 1;
 *   - forged beats claiming to be rank 1 (the old unauthenticated 32-byte
 *     format; the 80-byte format with a wrong MAC; a genuine beat with its
 *     flags changed to "failed") are dropped: rank 0's silence of rank 1
 *     keeps growing and no failure is reported;
 *   - a genuine beat captured on the wire and replayed is taken once only;
 *   - a beat MACed under another job's key is dropped.
 * Run with TANDEM_SECRET set (the suite line does). */
#define _GNU_SOURCE 1
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../common/check.h"
#include "comm/transport/tcp/heartbeat.h"
#include "hb_test_util.h"
#include "net/net.h"

#include <sodium.h>

#define HASH 0x1234567890abcdefull

int main(void) {
  /* Rank 1's beats go to a capture socket, so that the test holds one
   * genuine beat's bytes. */
  hbt_pair t;
  hbt_pair_open(&t, HASH, false);
  tcp_heartbeat *hb0 = t.hb0, *hb1 = t.hb1;
  int p0 = t.p0, cap = t.cap;

  heartbeat_reset(hb0, 0.0);
  heartbeat_send(hb1, false);
  unsigned char beat[128];
  ssize_t got = recv(cap, beat, sizeof beat, 0);
  CHECK_EQ_INT(got, 80);

  /* Genuine: heard at t = 10. */
  hbt_send_to(p0, beat, 80);
  hbt_drain(hb0, 10.0);
  CHECK_CLOSE(heartbeat_silence(hb0, 1, 10.0), 0.0, 0, 1e-9);

  /* Replayed at t = 20: refused, silence counts from 10. */
  hbt_send_to(p0, beat, 80);
  hbt_drain(hb0, 20.0);
  CHECK_CLOSE(heartbeat_silence(hb0, 1, 20.0), 10.0, 0, 1e-9);

  /* The old unauthenticated format: magic, flags, hash, rank 1, seq. */
  unsigned char old[32] = {0};
  uint32_t magic = 0x54444842u, flags = 1;
  uint64_t hash = HASH, seq = 1000;
  int32_t rank = 1;
  memcpy(old, &magic, 4);
  memcpy(old + 4, &flags, 4);
  memcpy(old + 8, &hash, 8);
  memcpy(old + 16, &rank, 4);
  memcpy(old + 24, &seq, 8);
  hbt_send_to(p0, old, sizeof old);
  /* The new format with a made-up MAC, and a genuine beat with a later
   * sequence and the failed flag set but its old MAC. */
  unsigned char forged[80] = {0};
  memcpy(forged, old, 32);
  memset(forged + 48, 0xa5, 32);
  hbt_send_to(p0, forged, sizeof forged);
  unsigned char flipped[80];
  memcpy(flipped, beat, 80);
  memcpy(flipped + 4, &flags, 4);
  memcpy(flipped + 24, &seq, 8);
  hbt_send_to(p0, flipped, sizeof flipped);
  hbt_drain(hb0, 30.0);
  CHECK_CLOSE(heartbeat_silence(hb0, 1, 30.0), 20.0, 0, 1e-9);
  CHECK_EQ_INT(heartbeat_failed_peer(hb0), -1);
  CHECK_EQ_INT(heartbeat_lost(hb0, -1, 30.0, 15.0), 1);

  /* A later genuine beat is taken again. */
  heartbeat_send(hb1, false);
  got = recv(cap, beat, sizeof beat, 0);
  CHECK_EQ_INT(got, 80);
  hbt_send_to(p0, beat, 80);
  hbt_drain(hb0, 40.0);
  CHECK_CLOSE(heartbeat_silence(hb0, 1, 40.0), 0.0, 0, 1e-9);
  CHECK_EQ_INT(heartbeat_lost(hb0, -1, 40.0, 15.0), -1);

  /* Another job's key: the same construction under a different key
   * (HMAC-SHA-256 of the label and the body), far-ahead sequence. */
  unsigned char alien[80] = {0}, other_key[32];
  memcpy(alien, old, 32);
  uint64_t far = 1u << 30;
  memcpy(alien + 24, &far, 8);
  crypto_generichash(other_key, sizeof other_key, (const unsigned char *)"another job's secret", 20, NULL, 0);
  crypto_auth_hmacsha256_state hs;
  crypto_auth_hmacsha256_init(&hs, other_key, sizeof other_key);
  crypto_auth_hmacsha256_update(&hs, (const unsigned char *)"tandem heartbeat v2", 20);
  crypto_auth_hmacsha256_update(&hs, alien, 48);
  crypto_auth_hmacsha256_final(&hs, alien + 48);
  hbt_send_to(p0, alien, 80);
  hbt_drain(hb0, 50.0);
  CHECK_CLOSE(heartbeat_silence(hb0, 1, 50.0), 10.0, 0, 1e-9);
  CHECK_EQ_INT(heartbeat_failed_peer(hb0), -1);

  hbt_pair_close(&t);
  printf("heartbeat auth ok: genuine beats taken, forged, replayed and foreign ones dropped\n");
  return 0;
}
