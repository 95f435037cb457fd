/* Logging to stderr with a level from TANDEM_LOG and a per-process prefix
 * ("rank 3"). One write() per line so that lines of ranks do not interleave. */
#include "base.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

static char log_prefix[64] = "tandem";
static int threshold = -1;

td_log_level td_log_threshold(void) {
  int t = __atomic_load_n(&threshold, __ATOMIC_RELAXED);
  if (t >= 0) return (td_log_level)t;
  /* getenv, not td_env_str: env.c reports malformed values through this log */
  const char *v = getenv("TANDEM_LOG");
  if (!v || !*v) v = "warn";
  t = TD_LOG_WARN;
  if (!strcasecmp(v, "error")) t = TD_LOG_ERROR;
  else if (!strcasecmp(v, "info")) t = TD_LOG_INFO;
  else if (!strcasecmp(v, "debug")) t = TD_LOG_DEBUG;
  __atomic_store_n(&threshold, t, __ATOMIC_RELAXED);
  return (td_log_level)t;
}

void td_log_set_prefix(const char *prefix) { td_strlcpy(log_prefix, prefix, sizeof log_prefix); }

void td_log(td_log_level level, const char *fmt, ...) {
  if (level > td_log_threshold()) return;
  static const char *names[] = {"error", "warn", "info", "debug"};
  char line[2048];
  int n = snprintf(line, sizeof line, "tandem[%s] %s: ", log_prefix, names[level]);
  if (n < 0) return;
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
  va_end(ap);
  size_t len = (size_t)n + (m > 0 ? (size_t)m : 0);
  if (len > sizeof line - 2) len = sizeof line - 2;
  line[len++] = '\n';
  ssize_t w = write(STDERR_FILENO, line, len);
  (void)w;
}
