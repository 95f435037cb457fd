/* Throughput of the primitives a protected TCP stream can use, on this CPU
 * (bench/protect.sh builds and runs it): seal + open of one record of
 * TCP_STREAM_RECORD_BYTES through src/net's net_protect_* (integrity only
 * and encrypted, AES-256-GCM and ChaCha20-Poly1305), and, for the choice
 * of the integrity MAC, libsodium's crypto_auth (HMAC-SHA-512-256) and a
 * plain memcpy as the floor. One thread; GB/s of payload; the median of
 * the rounds. Usage: protect_bench [ROUNDS] */
#include "net/net.h"

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RECORD ((size_t)256 << 10)

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

typedef enum { K_MEMCPY, K_PROTECT, K_HMAC } kind;

static double run(kind k, net_protect_mode mode, bool aes, unsigned char *buf, unsigned char *dst, int rounds) {
  net_auth_session session;
  memset(&session, 7, sizeof session);
  net_protect_key send_key, recv_key, send_b, recv_b;
  if (k == K_PROTECT) {
    if (net_protect_derive(mode, aes, "bench", &session, true, &send_key, &recv_key) != TD_OK ||
        net_protect_derive(mode, aes, "bench", &session, false, &send_b, &recv_b) != TD_OK) {
      fprintf(stderr, "derive failed: %s\n", td_last_error());
      exit(1);
    }
  }
  unsigned char hmac_key[crypto_auth_KEYBYTES] = {1}, mac[crypto_auth_BYTES];
  double *gbs = malloc(sizeof(double) * (size_t)rounds);
  const int per_round = 64; /* 16 MiB per round */
  for (int r = 0; r < rounds; r++) {
    double t0 = td_now();
    for (int i = 0; i < per_round; i++) {
      if (k == K_MEMCPY) {
        memcpy(dst, buf, RECORD);
      } else if (k == K_HMAC) {
        crypto_auth(mac, buf, RECORD, hmac_key);
        if (crypto_auth_verify(mac, buf, RECORD, hmac_key) != 0) exit(2);
      } else {
        unsigned char hdr[NET_PROTECT_HDR_BYTES], tag[NET_PROTECT_TAG_BYTES];
        net_protect_seal(&send_key, hdr, buf, RECORD, tag);
        if (!net_protect_open(&recv_b, hdr, buf, RECORD, tag)) exit(3);
      }
    }
    double dt = td_now() - t0;
    gbs[r] = (double)RECORD * per_round / dt / 1e9;
  }
  qsort(gbs, (size_t)rounds, sizeof *gbs, cmp_double);
  double median = gbs[rounds / 2];
  free(gbs);
  if (k == K_PROTECT) {
    net_protect_key_clear(&send_key);
    net_protect_key_clear(&recv_key);
    net_protect_key_clear(&send_b);
    net_protect_key_clear(&recv_b);
  }
  return median;
}

int main(int argc, char **argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 15;
  if (rounds < 1) rounds = 1;
  if (net_auth_init() != TD_OK) {
    fprintf(stderr, "protect_bench: %s\n", td_last_error());
    return 1;
  }
  unsigned char *buf = malloc(RECORD), *dst = malloc(RECORD);
  for (size_t i = 0; i < RECORD; i++) buf[i] = (unsigned char)(i * 131);
  bool aes = net_protect_aes_available();
  printf("# seal+open of %zu-byte records, one thread, median of %d rounds of 16 MiB; AES-NI: %s\n", RECORD, rounds,
         aes ? "yes" : "no");
  printf("%-34s %8s\n", "what", "GB/s");
  printf("%-34s %8.2f\n", "memcpy (floor)", run(K_MEMCPY, NET_PROTECT_OFF, false, buf, dst, rounds));
  if (aes) {
    printf("%-34s %8.2f\n", "integrity AES-256-GCM (AD)", run(K_PROTECT, NET_PROTECT_INTEGRITY, true, buf, dst, rounds));
    printf("%-34s %8.2f\n", "encrypt AES-256-GCM", run(K_PROTECT, NET_PROTECT_ENCRYPT, true, buf, dst, rounds));
  }
  printf("%-34s %8.2f\n", "integrity ChaCha20-Poly1305 (AD)",
         run(K_PROTECT, NET_PROTECT_INTEGRITY, false, buf, dst, rounds));
  printf("%-34s %8.2f\n", "encrypt ChaCha20-Poly1305", run(K_PROTECT, NET_PROTECT_ENCRYPT, false, buf, dst, rounds));
  printf("%-34s %8.2f\n", "crypto_auth HMAC-SHA-512-256", run(K_HMAC, NET_PROTECT_OFF, false, buf, dst, rounds));
  free(buf);
  free(dst);
  return 0;
}
