/* Test assertions that print both sides and never compile out (libuv's
 * test/task.h is the model). A failed check prints file:line, the expression
 * and the values, then exits 1 so that the runner marks the test failed. */
#ifndef TD_TEST_CHECK_H
#define TD_TEST_CHECK_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tandem/tandem.h"

/* The tests' deterministic data: a 64-bit LCG (Knuth's MMIX constants) with
 * the caller's state, so that each test keeps its own seed and stream. */
static inline float td_test_urand(uint64_t *state) { /* uniform in [-1, 1) */
  *state = *state * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((*state >> 40) * (1.0 / 8388608.0)) - 1.0f;
}
/* n values scale * td_test_urand (malloc'd, at least one element). */
static inline float *td_test_rand_buf(uint64_t *state, size_t n, float scale) {
  float *p = malloc((n ? n : 1) * sizeof(float));
  if (!p) return NULL;
  for (size_t i = 0; i < n; i++) p[i] = scale * td_test_urand(state);
  return p;
}

/* The training tests' synthetic next-byte dataset (text_dataset.c): sample i
 * is seq + 1 bytes of text at ((i*seq + j) * mul) mod strlen(text); every
 * delivery fails while *fault (may be NULL) is non-zero. */
struct td_dataset;
struct td_dataset *td_test_text_dataset(const char *text, size_t mul, size_t seq, size_t n_samples,
                                        const int *fault);
/* A byte-vocabulary GPT with tied embeddings for those samples (exits on error). */
struct td_model;
struct td_model *td_test_byte_gpt(int layers, int channels, int heads, int seq);

/* Whether the kernel gives transparent huge pages to madvise'd or all
 * mappings, read from /sys independently of the library's pages.c. */
/* n floats at src on device dev, copied to a new host buffer (free with free) */
float *td_test_host_copy(const float *src, td_device dev, size_t n);
int td_test_thp_on(void);
/* This process's minor page faults so far (getrusage). */
long td_test_minor_faults(void);

/* Print a failure with context and exit the test process. */

void td_test_fail(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4), noreturn));

#define CHECK(cond)                                                             \
  do {                                                                          \
    if (!(cond)) td_test_fail(__FILE__, __LINE__, "CHECK(%s) failed", #cond);   \
  } while (0)

#define CHECK_EQ_INT(a, b)                                                      \
  do {                                                                          \
    long long a_ = (long long)(a), b_ = (long long)(b);                         \
    if (a_ != b_)                                                               \
      td_test_fail(__FILE__, __LINE__, "%s == %s: %lld != %lld", #a, #b, a_, b_); \
  } while (0)

/* |a - b| <= atol + rtol * |b| */
#define CHECK_CLOSE(a, b, rtol, atol)                                           \
  do {                                                                          \
    double a_ = (double)(a), b_ = (double)(b);                                  \
    if (!(fabs(a_ - b_) <= (atol) + (rtol) * fabs(b_)))                         \
      td_test_fail(__FILE__, __LINE__, "%s ~= %s: %.9g vs %.9g (rtol %g, atol %g)", #a, #b, a_, b_, \
                   (double)(rtol), (double)(atol));                             \
  } while (0)

/* A td_status call that must succeed; prints the status and last error. */
#define CHECK_OK(expr)                                                          \
  do {                                                                          \
    td_status s_ = (expr);                                                      \
    if (s_ != TD_OK)                                                            \
      td_test_fail(__FILE__, __LINE__, "%s returned %s: %s", #expr, td_status_str(s_), td_last_error()); \
  } while (0)

#define CHECK_STATUS(expr, expected)                                            \
  do {                                                                          \
    td_status s_ = (expr);                                                      \
    if (s_ != (expected))                                                       \
      td_test_fail(__FILE__, __LINE__, "%s returned %s, expected %s (%s)", #expr, td_status_str(s_), \
                   td_status_str(expected), td_last_error());                   \
  } while (0)

/* Like CHECK_STATUS, and td_last_error() must contain `fragment`: the
 * message a user reads names what went wrong. */
#define CHECK_MSG(expr, expected_status, fragment)                                                  \
  do {                                                                                              \
    td_status s2_ = (expr);                                                                         \
    if (s2_ != (expected_status))                                                                   \
      td_test_fail(__FILE__, __LINE__, "%s returned %s, expected %s (%s)", #expr, td_status_str(s2_), \
                   td_status_str(expected_status), td_last_error());                                \
    if (!strstr(td_last_error(), (fragment)))                                                       \
      td_test_fail(__FILE__, __LINE__, "message of %s lacks \"%s\": %s", #expr, (fragment), td_last_error()); \
  } while (0)

#endif
