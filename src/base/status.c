/* Status names and the thread-local "last error" message. */
#include "base.h"

#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[1024];

const char *td_status_str(td_status status) {
  switch (status) {
  case TD_OK: return "ok";
  case TD_ERR_INVALID_ARGUMENT: return "invalid argument";
  case TD_ERR_INVALID_USAGE: return "invalid usage";
  case TD_ERR_SYSTEM: return "system error";
  case TD_ERR_REMOTE: return "remote error";
  case TD_ERR_MISMATCH: return "collective mismatch";
  case TD_ERR_TIMEOUT: return "timeout";
  case TD_ERR_IN_PROGRESS: return "in progress";
  case TD_ERR_INTERNAL: return "internal error";
  case TD_ERR_IO: return "I/O error";
  }
  return "unknown status";
}

const char *td_last_error(void) { return last_error; }

td_status td_error(td_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return status;
}

td_status td_error_errno(const char *fmt, ...) {
  int saved = errno;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  if (n >= 0 && (size_t)n < sizeof last_error)
    snprintf(last_error + n, sizeof last_error - (size_t)n, ": %s", strerror(saved));
  errno = saved;
  return TD_ERR_SYSTEM;
}

void td_error_copy(char *buf, size_t size) { td_strlcpy(buf, last_error, size); }

size_t td_strlcpy(char *dst, const char *src, size_t size) {
  if (size == 0) return 0;
  size_t n = strlen(src);
  if (n >= size) n = size - 1;
  memcpy(dst, src, n);
  dst[n] = '\0';
  return n;
}
