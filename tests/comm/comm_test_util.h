/* Helpers shared by the multi-rank communication tests (test_collectives,
 * test_failures): typed element access through doubles (every test value is
 * a small integer, exact in every dtype) and list parsing for options. */
#ifndef TD_COMM_TEST_UTIL_H
#define TD_COMM_TEST_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <time.h>

#include "tandem/tandem.h"

#define CT_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* CLOCK_MONOTONIC seconds: one clock for all processes of a host, so ranks
 * can compare their timestamps (barrier semantics, failure latency). */
static inline double ct_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline int ct_is_float(td_dtype d) { return d == TD_F32 || d == TD_F64 || d == TD_F16 || d == TD_BF16; }

/* The value v as stored in dtype and read back (rounding/wrapping applied). */
static inline double ct_round(double v, td_dtype dtype) {
  uint8_t tmp[8];
  td_dtype_set(tmp, 0, dtype, v);
  return td_dtype_get(tmp, 0, dtype);
}

/* Split "a,b,c" into at most max tokens in place; returns the count. */
static inline int ct_split_list(char *text, char **out, int max) {
  int n = 0;
  for (char *tok = strtok(text, ","); tok && n < max; tok = strtok(NULL, ",")) out[n++] = tok;
  return n;
}

#endif
