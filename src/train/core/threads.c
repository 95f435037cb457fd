/* The compute threads of a rank when threads_per_rank is automatic (0):
 * the cores this process may run on, shared by the ranks of its host. One
 * place, because the trainer (trainer.c, elastic/trainer_elastic.c on a
 * rebind) runs this many and the memory estimate (memory_fit.c) counts
 * each one's buffers. And the ranks of the host they are shared by. */
#include "train/core/core.h"

#include <sched.h>
#include <unistd.h>

int td_auto_threads(int local_ranks) {
  int cores = 0;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) cores = CPU_COUNT(&set);
  if (cores <= 0) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    cores = n > 0 ? (int)n : 1;
  }
  return TD_MAX(1, cores / TD_MAX(local_ranks, 1));
}

int td_host_ranks(const td_comm *comm) {
  if (comm) return td_comm_host_size(comm); /* a 3D layout's data-parallel group: the whole host */
  long slots = td_env_long("TANDEM_LOCAL_SIZE", 1);
  return slots >= 1 && slots <= (1 << 20) ? (int)slots : 1;
}
