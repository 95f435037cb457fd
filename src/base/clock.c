/* Clocks: monotonic for intervals and deadlines, wall for timestamps. */
#include "base.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

double td_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

uint64_t td_now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

double td_wall_time(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

double td_process_age(void) {
  /* Field 22 of /proc/self/stat, clock ticks since boot; the command name
   * (field 2) may hold spaces and parentheses, so fields count from the
   * last ')'. CLOCK_BOOTTIME is the same clock in seconds. */
  char buf[1024];
  FILE *f = fopen("/proc/self/stat", "re");
  if (!f) return -1;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  char *p = strrchr(buf, ')');
  if (!p) return -1;
  p++;
  for (int field = 3; field <= 22 && p; field++) { /* p before field `field` */
    p += strspn(p, " ");
    if (field == 22) break;
    p = strchr(p, ' ');
  }
  long hz = sysconf(_SC_CLK_TCK);
  if (!p || !*p || hz <= 0) return -1;
  unsigned long long ticks = strtoull(p, NULL, 10);
  struct timespec t;
  if (clock_gettime(CLOCK_BOOTTIME, &t) != 0) return -1;
  double age = (double)t.tv_sec + (double)t.tv_nsec * 1e-9 - (double)ticks / (double)hz;
  return age < 0 ? 0 : age;
}
