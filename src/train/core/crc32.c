/* CRC-32 (IEEE 802.3, zlib's polynomial) for checkpoint shards: zlib's fast
 * version when built with it, a table-driven one otherwise. Both compute the
 * same value, so checkpoints move freely between the two builds. */
#include "train/core/core.h"

#ifdef TD_HAVE_ZLIB
#include <zlib.h>

uint32_t td_crc32(uint32_t crc, const void *data, size_t n) {
  const unsigned char *p = data;
  /* zlib's length is a uInt: feed large buffers in pieces. */
  while (n > 0) {
    uInt chunk = n > (1u << 30) ? (1u << 30) : (uInt)n;
    crc = (uint32_t)crc32(crc, p, chunk);
    p += chunk;
    n -= chunk;
  }
  return crc;
}

#else

#include <pthread.h>

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    crc_table[i] = c;
  }
}

uint32_t td_crc32(uint32_t crc, const void *data, size_t n) {
  pthread_once(&crc_once, crc_init);
  const unsigned char *p = data;
  crc = ~crc;
  for (size_t i = 0; i < n; i++) crc = crc_table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

#endif
