/* Blocking waits on 32-bit words, within a process or across processes
 * sharing a memory segment. This is how every Tandem wait sleeps instead of
 * spinning: 8 ranks share 2 cores in the test suite. */
#include "base.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int td_futex_wait(_Atomic uint32_t *word, uint32_t expected, double timeout_s, bool shared) {
  struct timespec ts, *tsp = NULL;
  if (timeout_s >= 0) {
    ts.tv_sec = (time_t)timeout_s;
    ts.tv_nsec = (long)((timeout_s - (double)ts.tv_sec) * 1e9);
    tsp = &ts;
  }
  int op = shared ? FUTEX_WAIT : FUTEX_WAIT_PRIVATE;
  long r = syscall(SYS_futex, (uint32_t *)word, op, expected, tsp, NULL, 0);
  if (r == 0) return 0;
  if (errno == EAGAIN) return 0; /* value already changed */
  return errno;
}

void td_futex_wake(_Atomic uint32_t *word, int n_waiters, bool shared) {
  int op = shared ? FUTEX_WAKE : FUTEX_WAKE_PRIVATE;
  syscall(SYS_futex, (uint32_t *)word, op, n_waiters, NULL, NULL, 0);
}
