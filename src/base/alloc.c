/* Aligned allocation (64 bytes: a cache line and an AVX-512 vector) and
 * OS randomness for unique names. */
#include "base.h"

#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

void *td_alloc(size_t bytes) {
  void *p = NULL;
  if (posix_memalign(&p, TD_ALIGN, bytes ? bytes : TD_ALIGN) != 0) {
    td_error(TD_ERR_SYSTEM, "out of memory allocating %zu bytes", bytes);
    return NULL;
  }
  return p;
}

void *td_calloc(size_t bytes) {
  void *p = td_alloc(bytes);
  if (p) memset(p, 0, bytes);
  return p;
}

void td_free(void *p) { free(p); }

uint64_t td_random_u64(void) {
  uint64_t x = 0;
  if (getrandom(&x, sizeof x, 0) != (ssize_t)sizeof x) {
    /* getrandom cannot fail for 8 bytes once the pool is ready; fall back to
     * time and pid so that names stay distinct anyway. */
    x = td_now_ns() ^ ((uint64_t)getpid() << 32);
  }
  return x;
}
