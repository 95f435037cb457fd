/* TANDEM_* environment tunables. A malformed value is reported once as a
 * warning and the default is used, so that a typo never changes behaviour
 * silently. */
#include "base.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *td_env_str(const char *name, const char *default_value) {
  const char *v = getenv(name);
  return (v && *v) ? v : default_value;
}

long td_env_long(const char *name, long default_value) {
  const char *v = getenv(name);
  if (!v || !*v) return default_value;
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || *end) {
    td_log(TD_LOG_WARN, "%s=%s is not an integer; using %ld", name, v, default_value);
    return default_value;
  }
  return x;
}

double td_env_double(const char *name, double default_value) {
  const char *v = getenv(name);
  if (!v || !*v) return default_value;
  char *end;
  errno = 0;
  double x = strtod(v, &end);
  if (errno || *end) {
    td_log(TD_LOG_WARN, "%s=%s is not a number; using %g", name, v, default_value);
    return default_value;
  }
  return x;
}

int td_parse_size(const char *text, size_t *out) {
  char *end;
  errno = 0;
  double x = strtod(text, &end);
  /* !(x >= 0) also refuses "nan"; "inf" and overflow are refused below. */
  if (errno || end == text || !(x >= 0)) return -1;
  double mult = 1;
  switch (*end) {
  case 'k': case 'K': mult = 1024.0; end++; break;
  case 'm': case 'M': mult = 1024.0 * 1024; end++; break;
  case 'g': case 'G': mult = 1024.0 * 1024 * 1024; end++; break;
  default: break;
  }
  if (*end == 'i' || *end == 'B') end++;
  if (*end == 'B') end++;
  if (*end) return -1;
  /* Converting a double at or above 2^64 (or inf) to size_t is undefined:
   * refuse what does not fit. */
  double bytes = x * mult;
  if (!(bytes < 18446744073709551616.0) || bytes > (double)SIZE_MAX) return -1;
  *out = (size_t)bytes;
  return 0;
}

size_t td_env_size(const char *name, size_t default_value) {
  const char *v = getenv(name);
  if (!v || !*v) return default_value;
  size_t x;
  if (td_parse_size(v, &x)) {
    td_log(TD_LOG_WARN, "%s=%s is not a byte size (e.g. 25M); using %zu", name, v, default_value);
    return default_value;
  }
  return x;
}
