/* Failure reporting for tests/common/check.h. */
#include "check.h"

#include <stdarg.h>
#include <sys/resource.h>

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

int td_test_thp_on(void) {
  FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  if (!f) return 0;
  char line[128] = {0};
  int on = fgets(line, sizeof line, f) && (strstr(line, "[always]") || strstr(line, "[madvise]"));
  fclose(f);
  return on;
}

long td_test_minor_faults(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}

float *td_test_host_copy(const float *src, td_device dev, size_t n) {
  float *h = malloc((n ? n : 1) * sizeof(float));
  CHECK(h != NULL);
  CHECK_OK(td_device_copy(h, (td_device){TD_DEVICE_CPU, 0}, src, dev, n * sizeof(float)));
  return h;
}
