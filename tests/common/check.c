/* Failure reporting for tests/common/check.h. */
#include "check.h"

#include <stdarg.h>

void td_test_fail(const char *file, int line, const char *fmt, ...) {
  const char *rank = getenv("TANDEM_RANK");
  fprintf(stderr, "FAILED %s:%d%s%s: ", file, line, rank ? " rank " : "", rank ? rank : "");
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  fflush(stderr);
  exit(1);
}
