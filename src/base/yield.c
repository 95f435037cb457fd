/* Yielding the CPU inside a busy-wait, and noticing a loaded machine.
 *
 * A transport that spins for a peer (shm's doorbells, TCP's poll(0) loop)
 * calls sched_yield every few microseconds, so that a process holding the
 * core the peer wants runs at once (quiet, a yield costs ~0.2 us). On a
 * loaded machine the same yield puts the rank behind every runnable process
 * (the scheduler pushes its deadline a whole slice back), where a sleep in
 * futex or poll is woken at once by the peer's data. Measured on the 2-core
 * VM: coll_np3_shm_small_chunks (about 50,000 waits) took 40 s at load 40
 * instead of 0.8 s; TCP at 2 ranks pinned to one core beside 2 CPU hogs did
 * not finish in 90 s with the spin, 39 s without it. So a yield that kept
 * the caller off its core for TD_YIELD_SLOW_NS turns yields (and the spin
 * around them) off for TD_YIELD_OFF_NS: the waits sleep at once, then try
 * again. */
#include <sched.h>

#include "base/base.h"

#define TD_YIELD_SLOW_NS 200000ull   /* 0.2 ms: a few context switches */
#define TD_YIELD_OFF_NS 500000000ull /* 0.5 s without yields after a slow one */

bool td_yield_allowed(const _Atomic uint64_t *off_until) {
  return td_now_ns() >= atomic_load_explicit(off_until, memory_order_relaxed);
}

bool td_yield_timed(_Atomic uint64_t *off_until) {
  uint64_t before = td_now_ns();
  sched_yield();
  uint64_t after = td_now_ns();
  if (after - before < TD_YIELD_SLOW_NS) return true;
  atomic_store_explicit(off_until, after + TD_YIELD_OFF_NS, memory_order_relaxed);
  return false;
}
