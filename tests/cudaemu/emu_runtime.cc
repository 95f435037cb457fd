/* CUDA emulator (tests/cudaemu): the runtime behind cuda_runtime.h and the
 * block scheduler behind cuda_emu.h, for the emulator tree only.
 *
 * Launch: blocks run one after another on the calling thread. A block's
 * threads are fibers (own 256 KiB stack with a guard page, switched by a
 * few instructions of assembly: no system call per switch, unlike
 * swapcontext). Each phase runs every runnable fiber until it yields at
 * a barrier or returns (a yielding fiber switches straight to the next
 * runnable one of the phase, the last back to the scheduler: one switch per
 * yield, not two), then the scheduler releases a warp whose live threads all
 * wait at a warp barrier, else the block if all its live threads wait at
 * __syncthreads, else reports a deadlock (threads at different barriers).
 * Threads that returned do not hold barriers up (as on Volta and later).
 * ASan is told about each switch (__sanitizer_*_switch_fiber), so the
 * sanitizer trees check kernels' memory accesses too.
 *
 * Memory: cudaMalloc is aligned heap memory, filled with 0xff bytes (NaN as
 * f32 and bf16) so that reading what was never written shows; a table of
 * device and pinned allocations answers cudaPointerGetAttributes and lets
 * copies check that a range lies inside one allocation. Streams and events
 * complete at once (events keep the time of their record). */
#include <cuda_emu.h>

#include <errno.h>
#include <stdarg.h>
#include <map>
#include <pthread.h>
#include <mutex>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#else
#define EMU_ASAN 0
#endif

#if !defined(__x86_64__)
#error "the CUDA emulator's fiber switch is written for x86-64 (tests/cudaemu/emu_runtime.cc)"
#endif

/* emu_switch(save, to): push the callee-saved registers, store the stack
 * pointer into *save, load `to` and pop the registers saved there. A new
 * fiber's stack is prepared to "return" into fiber_entry. */
extern "C" void td_emu_switch(void **save_sp, void *to_sp);
asm(".text\n"
    ".globl td_emu_switch\n"
    ".type td_emu_switch,@function\n"
    "td_emu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size td_emu_switch, .-td_emu_switch\n");

namespace td_emu {

__thread uint3 thread_idx, block_idx;
__thread dim3 block_dim, grid_dim;

namespace {

enum fiber_state { RUNNABLE, AT_BLOCK_BARRIER, AT_WARP_BARRIER, DONE };

const size_t kStackBytes = 256 * 1024;

struct fiber {
  void *sp = nullptr;
  char *stack = nullptr; /* mapping: guard page, then kStackBytes */
  fiber_state state = DONE;
  uint3 tid{};
  unsigned linear = 0;
  /* shuffle and ballot deposits: exchange number n (n_exchanges counts
   * them) writes slot[n % 2], so that a lane that has read exchange n and
   * runs on to n + 1 leaves n's deposit to the lanes that still read it
   * (a lane reaches n + 2 only after every lane has passed n + 1's barrier) */
  uint64_t slot[2] = {0, 0};
  unsigned n_exchanges = 0;
  /* lane_box: warp-collective instructions' deposits, alternating as the
   * slots above do (collective n uses box[n % 2]) */
  alignas(16) unsigned char box[2][64];
  unsigned n_collectives = 0;
  cp_async_queue cp{};                /* this thread's cp.async copies not yet done */
  void *fake_stack = nullptr;
};

struct sched {
  std::vector<fiber> fibers;
  fiber *current = nullptr;
  void *sched_sp = nullptr;
  void *sched_fake = nullptr;
  const void *sched_stack_bottom = nullptr;
  size_t sched_stack_size = 0;
  const void *from_bottom = nullptr; /* td_emu_fiber_entry: the stack it was entered from */
  size_t from_size = 0;
  void (*body)(void *) = nullptr;
  void *ctx = nullptr;
  unsigned n_threads = 0, phase = 0; /* the block being run and its phase (runnable_from) */
  bool from_sched = false;           /* the fiber being entered is entered from the scheduler */
  std::vector<char> smem;
  bool in_launch = false;
  char fault[200] = ""; /* fault(): what a GPU would stop the kernel for */
};
__thread sched *tls_sched;

/* A thread's scheduler and its fiber stacks (256 KiB of address space per
 * thread of the largest block) go when the thread ends. */
pthread_key_t sched_key;
pthread_once_t sched_key_once = PTHREAD_ONCE_INIT;
void sched_free(void *p) {
  sched *s = (sched *)p;
  size_t bytes = (size_t)sysconf(_SC_PAGESIZE) + kStackBytes;
  for (fiber &f : s->fibers)
    if (f.stack) munmap(f.stack, bytes);
  delete s;
}
void sched_key_make() { pthread_key_create(&sched_key, sched_free); }
sched *sched_get() {
  if (!tls_sched) {
    pthread_once(&sched_key_once, sched_key_make);
    tls_sched = new sched();
    pthread_setspecific(sched_key, tls_sched);
  }
  return tls_sched;
}

__thread cudaError_t last_error = cudaSuccess; /* per host thread, as the runtime's */
std::mutex table_mutex;
__thread int current_device = 0;
struct alloc_info {
  size_t bytes;
  bool device;
  int index; /* the current device when it was allocated (cudaPointerGetAttributes) */
};
std::map<uintptr_t, alloc_info> allocs;          /* device and pinned host */
std::map<const void *, int> smem_limits;        /* cudaFuncSetAttribute */

cudaError_t set_error(cudaError_t e) {
  if (e != cudaSuccess) last_error = e;
  return e;
}

size_t page_size() {
  static size_t p = (size_t)sysconf(_SC_PAGESIZE);
  return p;
}

/* The first runnable fiber at position k or later of this phase's order:
 * by thread index on even phases, backwards on odd ones (a thread that runs
 * ahead of the others in one order lags in the next). nullptr: none left. */
fiber *runnable_from(sched *s, unsigned k) {
  for (; k < s->n_threads; k++) {
    fiber *f = &s->fibers[(s->phase & 1) ? s->n_threads - 1 - k : k];
    if (f->state == RUNNABLE) return f;
  }
  return nullptr;
}

/* From the scheduler into the phase's first runnable fiber; returns when
 * the phase's last one yields. */
void switch_into(sched *s, fiber *f) {
  s->current = f;
  s->from_sched = true;
  thread_idx = f->tid;
#if EMU_ASAN
  __sanitizer_start_switch_fiber(&s->sched_fake, f->stack + page_size(), kStackBytes);
#endif
  td_emu_switch(&s->sched_sp, f->sp);
#if EMU_ASAN
  __sanitizer_finish_switch_fiber(s->sched_fake, nullptr, nullptr);
#endif
  s->current = nullptr;
}

/* From a fiber to the next runnable fiber of the phase, or back to the
 * scheduler after the last; returns when the fiber is resumed. */
void yield(fiber_state why) {
  sched *s = tls_sched;
  fiber *f = s->current;
  f->state = why;
  fiber *next = runnable_from(s, ((s->phase & 1) ? s->n_threads - 1 - f->linear : f->linear) + 1);
  if (next) {
    s->current = next;
    s->from_sched = false;
    thread_idx = next->tid;
#if EMU_ASAN
    __sanitizer_start_switch_fiber(why == DONE ? nullptr : &f->fake_stack, next->stack + page_size(), kStackBytes);
#endif
    td_emu_switch(&f->sp, next->sp);
  } else {
#if EMU_ASAN
    __sanitizer_start_switch_fiber(why == DONE ? nullptr : &f->fake_stack, s->sched_stack_bottom,
                                   s->sched_stack_size);
#endif
    td_emu_switch(&f->sp, s->sched_sp);
  }
#if EMU_ASAN
  __sanitizer_finish_switch_fiber(f->fake_stack, nullptr, nullptr);
#endif
}

extern "C" void td_emu_fiber_entry() {
  sched *s = tls_sched;
#if EMU_ASAN
  /* the stack switched from: the scheduler's (kept: the last fiber of a
   * phase switches back to it), or another fiber's. (Into the scheduler's
   * fields, not locals: this frame never returns, and a local whose
   * address ASan saw would leave its redzones poisoned on the stack.) */
  __sanitizer_finish_switch_fiber(nullptr, &s->from_bottom, &s->from_size);
  if (s->from_sched) {
    s->sched_stack_bottom = s->from_bottom;
    s->sched_stack_size = s->from_size;
  }
#endif
  s->body(s->ctx);
  yield(DONE);
  __builtin_unreachable();
}

void fiber_prepare(fiber *f) {
  size_t guard = page_size();
  const bool fresh = !f->stack;
  if (fresh) {
    void *m = mmap(nullptr, guard + kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (m == MAP_FAILED) {
      f->stack = nullptr;
      return;
    }
    mprotect(m, guard, PROT_NONE); /* overflow faults instead of corrupting */
    f->stack = (char *)m;
  }
#if EMU_ASAN
  /* An abandoned fiber (failed launch) may have left poisoned frames; one
   * that ran to its end returned from every instrumented frame, which
   * unpoisoned them. Unpoisoning the whole stack for every thread of every
   * block was a third of the emulator's time (1 GB of shadow written per
   * launch of 40k threads). */
  if (fresh || f->state != DONE) __asan_unpoison_memory_region(f->stack + guard, kStackBytes);
#endif
  uintptr_t top = ((uintptr_t)(f->stack + guard + kStackBytes)) & ~(uintptr_t)15;
  void **sp = (void **)top;
  *--sp = nullptr;                              /* fiber_entry's "return address": never used */
  *--sp = (void *)&td_emu_fiber_entry;          /* popped by td_emu_switch's ret */
  for (int i = 0; i < 6; i++) *--sp = nullptr;  /* rbp rbx r12 r13 r14 r15 */
  f->sp = sp;
  f->cp.n_ops = f->cp.n_committed = f->cp.n_groups = 0; /* a block's copies end with it */
  f->n_exchanges = f->n_collectives = 0;
  f->state = RUNNABLE;
  f->fake_stack = nullptr;
}

/* Run one block to completion; false on a deadlock (message printed). */
bool run_block(sched *s, unsigned n_threads, const launch_cfg &cfg) {
  for (unsigned i = 0; i < n_threads; i++) {
    fiber *f = &s->fibers[i];
    fiber_prepare(f);
    if (!f->stack) {
      fprintf(stderr, "cudaemu: %s:%d: %s: cannot map a fiber stack: %s\n", cfg.file, cfg.line, cfg.name,
              strerror(errno));
      return false;
    }
    f->linear = i;
    f->tid.x = i % cfg.block.x;
    f->tid.y = (i / cfg.block.x) % cfg.block.y;
    f->tid.z = i / (cfg.block.x * cfg.block.y);
  }
  s->n_threads = n_threads;
  for (unsigned phase = 0;; phase++) {
    s->phase = phase;
    if (fiber *first = runnable_from(s, 0)) switch_into(s, first);
    if (s->fault[0]) {
      fprintf(stderr, "cudaemu: %s:%d: kernel %s, block (%u,%u,%u): %s\n", cfg.file, cfg.line, cfg.name, block_idx.x,
              block_idx.y, block_idx.z, s->fault);
      s->fault[0] = 0;
      return false;
    }
    unsigned live = 0, at_block = 0;
    bool released = false;
    for (unsigned w = 0; w * 32 < n_threads; w++) {
      unsigned end = (w + 1) * 32 < n_threads ? (w + 1) * 32 : n_threads;
      unsigned wlive = 0, wat = 0;
      for (unsigned i = w * 32; i < end; i++) {
        fiber_state st = s->fibers[i].state;
        wlive += st != DONE;
        wat += st == AT_WARP_BARRIER;
        at_block += st == AT_BLOCK_BARRIER;
      }
      live += wlive;
      if (wlive && wat == wlive) {
        for (unsigned i = w * 32; i < end; i++)
          if (s->fibers[i].state == AT_WARP_BARRIER) s->fibers[i].state = RUNNABLE;
        released = true;
      }
    }
    if (live == 0) return true;
    if (released) continue;
    if (at_block == live) {
      for (unsigned i = 0; i < n_threads; i++)
        if (s->fibers[i].state == AT_BLOCK_BARRIER) s->fibers[i].state = RUNNABLE;
      continue;
    }
    fprintf(stderr,
            "cudaemu: %s:%d: kernel %s, block (%u,%u,%u): threads wait at different barriers "
            "(%u of %u live threads at __syncthreads, the others at a warp barrier or shuffle): "
            "on a GPU this hangs or is undefined\n",
            cfg.file, cfg.line, cfg.name, block_idx.x, block_idx.y, block_idx.z, at_block, live);
    return false;
  }
}

bool range_in_alloc(const void *p, size_t bytes, bool *device_out, int *index_out = nullptr) {
  std::lock_guard<std::mutex> lock(table_mutex);
  auto it = allocs.upper_bound((uintptr_t)p);
  if (it == allocs.begin()) return false;
  --it;
  uintptr_t base = it->first, q = (uintptr_t)p;
  if (q < base || q - base >= (it->second.bytes ? it->second.bytes : 1)) return false;
  if (q - base + bytes > it->second.bytes) return false; /* straddles the end */
  *device_out = it->second.device;
  if (index_out) *index_out = it->second.index;
  return true;
}

/* Which side a range is on: 1 device, 0 host; -1 when it starts inside an
 * allocation and runs past its end. */
int side_of(const void *p, size_t bytes) {
  bool device = false;
  if (range_in_alloc(p, bytes, &device)) return device ? 1 : 0;
  bool dummy;
  if (bytes && range_in_alloc(p, 1, &dummy)) return -1;
  return 0;
}

bool valid_stream(cudaStream_t stream);

} // namespace

void launch(const launch_cfg &cfg, void (*body)(void *), void *ctx) {
  unsigned n_threads = cfg.block.x * cfg.block.y * cfg.block.z;
  unsigned long long n_blocks = (unsigned long long)cfg.grid.x * cfg.grid.y * cfg.grid.z;
  if (n_threads == 0 || n_threads > 1024 || cfg.block.z > 64 || n_blocks == 0 || cfg.grid.y > 65535 ||
      cfg.grid.z > 65535) {
    fprintf(stderr, "cudaemu: %s:%d: kernel %s: invalid launch configuration grid (%u,%u,%u) block (%u,%u,%u)\n",
            cfg.file, cfg.line, cfg.name, cfg.grid.x, cfg.grid.y, cfg.grid.z, cfg.block.x, cfg.block.y,
            cfg.block.z);
    set_error(cudaErrorInvalidConfiguration);
    return;
  }
  if (!valid_stream((cudaStream_t)cfg.stream)) {
    set_error(cudaErrorInvalidResourceHandle);
    return;
  }
  int smem_limit = 48 * 1024;
  {
    std::lock_guard<std::mutex> lock(table_mutex);
    auto it = smem_limits.find(cfg.func);
    if (it != smem_limits.end()) smem_limit = it->second;
  }
  if (cfg.smem > (size_t)smem_limit) {
    fprintf(stderr,
            "cudaemu: %s:%d: kernel %s: %zu bytes of dynamic shared memory, the limit is %d "
            "(cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize) raises it)\n",
            cfg.file, cfg.line, cfg.name, cfg.smem, smem_limit);
    set_error(cudaErrorInvalidValue);
    return;
  }
  sched *s = sched_get();
  if (s->in_launch) {
    fprintf(stderr, "cudaemu: %s:%d: kernel %s launched from inside a kernel\n", cfg.file, cfg.line, cfg.name);
    set_error(cudaErrorLaunchFailure);
    return;
  }
  if (s->fibers.size() < n_threads) s->fibers.resize(n_threads);
  s->smem.assign(cfg.smem ? cfg.smem : 1, (char)0xff);
  s->body = body;
  s->ctx = ctx;
  s->in_launch = true;
  block_dim = cfg.block;
  grid_dim = cfg.grid;
  for (unsigned z = 0; z < cfg.grid.z; z++)
    for (unsigned y = 0; y < cfg.grid.y; y++)
      for (unsigned x = 0; x < cfg.grid.x; x++) {
        block_idx = uint3{x, y, z};
        if (!run_block(s, n_threads, cfg)) {
          s->in_launch = false;
          set_error(cudaErrorLaunchFailure);
          return;
        }
      }
  s->in_launch = false;
}

bool inside_allocation(const void *p, size_t bytes) {
  bool device;
  return range_in_alloc(p, bytes, &device);
}

void sync_block() { yield(AT_BLOCK_BARRIER); }
void sync_warp() { yield(AT_WARP_BARRIER); }
unsigned lane() { return tls_sched->current->linear % 32; }

/* Lane idx's deposit for exchange n, when that lane took part in it (it
 * made n + 1 exchanges or more: a lane that returned before, or waits at
 * another warp barrier, did not). */
const uint64_t *deposit(sched *s, unsigned idx, unsigned n) {
  if (idx >= s->n_threads) return nullptr;
  const fiber &g = s->fibers[idx];
  return g.n_exchanges > n ? &g.slot[n % 2] : nullptr;
}

uint64_t warp_exchange(uint64_t mine, unsigned src) {
  sched *s = tls_sched;
  fiber *f = s->current;
  unsigned n = f->n_exchanges++;
  f->slot[n % 2] = mine;
  yield(AT_WARP_BARRIER);
  const uint64_t *v = deposit(s, (f->linear & ~31u) + (src & 31u), n);
  return v ? *v : mine;
}

unsigned warp_ballot(int pred) {
  sched *s = tls_sched;
  fiber *f = s->current;
  unsigned n = f->n_exchanges++, base = f->linear & ~31u, bits = 0;
  f->slot[n % 2] = pred != 0;
  yield(AT_WARP_BARRIER);
  for (unsigned i = 0; i < 32; i++) {
    const uint64_t *v = deposit(s, base + i, n);
    if (v && *v) bits |= 1u << i;
  }
  return bits;
}

void *dynamic_smem() { return tls_sched->smem.data(); }

void *lane_box_mine() {
  fiber *f = tls_sched->current;
  return f->box[f->n_collectives++ % 2];
}

void *lane_box(unsigned src) {
  sched *s = tls_sched;
  fiber *f = s->current;
  unsigned idx = (f->linear & ~31u) + (src & 31u), n = f->n_collectives - 1;
  if (idx >= s->n_threads || s->fibers[idx].n_collectives <= n) {
    fault("a warp-collective instruction (mma.sync, ldmatrix) without lane %u of the warp: every lane must take part",
          src & 31u);
    return f->box[n % 2];
  }
  return s->fibers[idx].box[n % 2];
}

cp_async_queue *cp_async_mine() { return &tls_sched->current->cp; }

void fault(const char *fmt, ...) {
  sched *s = tls_sched;
  if (s->fault[0]) return; /* the first one is the cause */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(s->fault, sizeof s->fault, fmt, ap);
  va_end(ap);
}

namespace {
struct stream_table {
  std::mutex m;
  std::map<void *, int> live;
};
stream_table streams, events;
struct event_rec {
  double t_ms;
  bool recorded;
};
bool valid_stream(cudaStream_t stream) {
  if (!stream) return true;
  std::lock_guard<std::mutex> lock(streams.m);
  return streams.live.count((void *)stream) != 0;
}
bool valid_event(cudaEvent_t ev) {
  if (!ev) return false;
  std::lock_guard<std::mutex> lock(events.m);
  return events.live.count((void *)ev) != 0;
}
double now_ms() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}
int n_devices() {
  const char *e = getenv("TANDEM_CUDAEMU_DEVICES");
  if (!e || !*e) return 1;
  int n = atoi(e);
  return n < 0 ? 0 : n;
}
cudaError_t copy_checked(void *dst, const void *src, size_t count, cudaMemcpyKind kind) {
  if (count == 0) return cudaSuccess;
  if (!dst || !src) return set_error(cudaErrorInvalidValue);
  int dside = side_of(dst, count), sside = side_of(src, count);
  if (dside < 0 || sside < 0) {
    fprintf(stderr, "cudaemu: cudaMemcpy of %zu bytes runs past the end of an allocation (%s)\n", count,
            dside < 0 ? "destination" : "source");
    return set_error(cudaErrorInvalidValue);
  }
  bool ok = true;
  switch (kind) {
  case cudaMemcpyHostToHost: ok = dside == 0 && sside == 0; break;
  case cudaMemcpyHostToDevice: ok = dside == 1 && sside == 0; break;
  case cudaMemcpyDeviceToHost: ok = dside == 0 && sside == 1; break;
  case cudaMemcpyDeviceToDevice: ok = dside == 1 && sside == 1; break;
  case cudaMemcpyDefault: ok = true; break;
  default: return set_error(cudaErrorInvalidMemcpyDirection);
  }
  if (!ok) {
    fprintf(stderr, "cudaemu: cudaMemcpy kind %d does not match the pointers (dst on %s, src on %s)\n", (int)kind,
            dside ? "device" : "host", sside ? "device" : "host");
    return set_error(cudaErrorInvalidValue);
  }
  memmove(dst, src, count);
  return cudaSuccess;
}
} // namespace
} // namespace td_emu

using namespace td_emu;

extern "C" {

const char *cudaGetErrorName(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "cudaSuccess";
  case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
  case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
  case cudaErrorInitializationError: return "cudaErrorInitializationError";
  case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
  case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
  case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
  case cudaErrorNoDevice: return "cudaErrorNoDevice";
  case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
  case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
  case cudaErrorNotReady: return "cudaErrorNotReady";
  case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
  case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
  }
  return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "no error";
  case cudaErrorInvalidValue: return "invalid argument";
  case cudaErrorMemoryAllocation: return "out of memory";
  case cudaErrorInitializationError: return "initialization error";
  case cudaErrorInvalidConfiguration: return "invalid configuration argument";
  case cudaErrorInvalidDevicePointer: return "invalid device pointer";
  case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
  case cudaErrorNoDevice: return "no CUDA-capable device is detected";
  case cudaErrorInvalidDevice: return "invalid device ordinal";
  case cudaErrorInvalidResourceHandle: return "invalid resource handle";
  case cudaErrorNotReady: return "device not ready";
  case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
  case cudaErrorLaunchFailure: return "unspecified launch failure";
  }
  return "unknown error";
}

cudaError_t cudaGetLastError(void) {
  cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError(void) { return last_error; }

cudaError_t cudaGetDeviceCount(int *count) {
  if (!count) return set_error(cudaErrorInvalidValue);
  *count = n_devices();
  return *count ? cudaSuccess : set_error(cudaErrorNoDevice);
}
cudaError_t cudaSetDevice(int device) {
  int n = n_devices();
  if (n == 0) return set_error(cudaErrorNoDevice);
  if (device < 0 || device >= n) return set_error(cudaErrorInvalidDevice);
  current_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int *device) {
  if (!device) return set_error(cudaErrorInvalidValue);
  if (n_devices() == 0) return set_error(cudaErrorNoDevice);
  *device = current_device;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
  if (!prop) return set_error(cudaErrorInvalidValue);
  if (device < 0 || device >= n_devices()) return set_error(cudaErrorInvalidDevice);
  memset(prop, 0, sizeof *prop);
  snprintf(prop->name, sizeof prop->name, "Tandem CUDA emulator (CPU)");
  prop->totalGlobalMem = (size_t)8 << 30;
  prop->sharedMemPerBlock = 48 * 1024;
  prop->sharedMemPerBlockOptin = 227 * 1024;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->multiProcessorCount = 4;
  prop->major = 9;
  prop->minor = 0;
  prop->l2CacheSize = 4 << 20;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
  struct cudaDeviceProp p;
  if (!value) return set_error(cudaErrorInvalidValue);
  cudaError_t e = cudaGetDeviceProperties(&p, device);
  if (e) return e;
  switch (attr) {
  case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; break;
  case cudaDevAttrMaxSharedMemoryPerBlock: *value = (int)p.sharedMemPerBlock; break;
  case cudaDevAttrWarpSize: *value = 32; break;
  case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
  case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
  case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
  case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = (int)p.sharedMemPerBlockOptin; break;
  default: return set_error(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) { return n_devices() ? cudaSuccess : set_error(cudaErrorNoDevice); }
cudaError_t cudaRuntimeGetVersion(int *version) {
  if (!version) return set_error(cudaErrorInvalidValue);
  *version = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int *version) { return cudaRuntimeGetVersion(version); }
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
  if (!free_bytes || !total_bytes) return set_error(cudaErrorInvalidValue);
  *total_bytes = (size_t)8 << 30;
  size_t used = 0;
  {
    std::lock_guard<std::mutex> lock(table_mutex);
    for (auto &a : allocs)
      if (a.second.device) used += a.second.bytes;
  }
  *free_bytes = used < *total_bytes ? *total_bytes - used : 0;
  return cudaSuccess;
}

static cudaError_t emu_alloc(void **ptr, size_t size, bool device) {
  if (!ptr) return set_error(cudaErrorInvalidValue);
  if (device && n_devices() == 0) return set_error(cudaErrorNoDevice);
  size_t rounded = (size + 255) & ~(size_t)255;
  void *p = aligned_alloc(256, rounded ? rounded : 256);
  if (!p) return set_error(cudaErrorMemoryAllocation);
  if (device) memset(p, 0xff, rounded); /* "uninitialized": NaN as f32 and bf16 */
  {
    std::lock_guard<std::mutex> lock(table_mutex);
    allocs[(uintptr_t)p] = alloc_info{size, device, current_device};
  }
  *ptr = p;
  return cudaSuccess;
}
static cudaError_t emu_free(void *ptr, bool device) {
  if (!ptr) return cudaSuccess;
  {
    std::lock_guard<std::mutex> lock(table_mutex);
    auto it = allocs.find((uintptr_t)ptr);
    if (it == allocs.end() || it->second.device != device) {
      fprintf(stderr, "cudaemu: %s(%p): not a pointer from %s\n", device ? "cudaFree" : "cudaFreeHost", ptr,
              device ? "cudaMalloc" : "cudaMallocHost");
      return set_error(cudaErrorInvalidValue);
    }
    allocs.erase(it);
  }
  free(ptr);
  return cudaSuccess;
}
cudaError_t cudaMalloc(void **ptr, size_t size) { return emu_alloc(ptr, size, true); }
cudaError_t cudaFree(void *ptr) { return emu_free(ptr, true); }
cudaError_t cudaMallocHost(void **ptr, size_t size) { return emu_alloc(ptr, size, false); }
cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned int flags) { return emu_alloc(ptr, size, false); }
cudaError_t cudaFreeHost(void *ptr) { return emu_free(ptr, false); }
cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags) {
  if (!ptr || size == 0) return set_error(cudaErrorInvalidValue);
  if (side_of(ptr, size) != 0) { /* device memory, or a range across an allocation's end */
    fprintf(stderr, "cudaemu: cudaHostRegister(%p, %zu bytes): not host memory\n", ptr, size);
    return set_error(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}
cudaError_t cudaHostUnregister(void *ptr) { return ptr ? cudaSuccess : set_error(cudaErrorInvalidValue); }

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
  return copy_checked(dst, src, count, kind);
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream) {
  if (!valid_stream(stream)) return set_error(cudaErrorInvalidResourceHandle);
  return copy_checked(dst, src, count, kind);
}
cudaError_t cudaMemset(void *ptr, int value, size_t count) {
  if (count == 0) return cudaSuccess;
  if (side_of(ptr, count) != 1) {
    fprintf(stderr, "cudaemu: cudaMemset(%p, %zu bytes): not inside one device allocation\n", ptr, count);
    return set_error(cudaErrorInvalidValue);
  }
  memset(ptr, value, count);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *ptr, int value, size_t count, cudaStream_t stream) {
  if (!valid_stream(stream)) return set_error(cudaErrorInvalidResourceHandle);
  return cudaMemset(ptr, value, count);
}
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes, const void *ptr) {
  if (!attributes) return set_error(cudaErrorInvalidValue);
  memset(attributes, 0, sizeof *attributes);
  bool device = false;
  int index = 0;
  if (ptr && range_in_alloc(ptr, 1, &device, &index)) {
    attributes->type = device ? cudaMemoryTypeDevice : cudaMemoryTypeHost;
    attributes->device = index;
    attributes->devicePointer = (void *)ptr;
    attributes->hostPointer = device ? nullptr : (void *)ptr;
  } else {
    attributes->type = cudaMemoryTypeUnregistered;
    attributes->device = -2;
    attributes->hostPointer = (void *)ptr;
  }
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags) {
  if (!stream) return set_error(cudaErrorInvalidValue);
  if (n_devices() == 0) return set_error(cudaErrorNoDevice);
  void *s = malloc(1);
  if (!s) return set_error(cudaErrorMemoryAllocation);
  std::lock_guard<std::mutex> lock(streams.m);
  streams.live[s] = 1;
  *stream = (cudaStream_t)s;
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *stream) { return cudaStreamCreateWithFlags(stream, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (!stream) return set_error(cudaErrorInvalidResourceHandle);
  {
    std::lock_guard<std::mutex> lock(streams.m);
    if (!streams.live.erase((void *)stream)) return set_error(cudaErrorInvalidResourceHandle);
  }
  free(stream);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  return valid_stream(stream) ? cudaSuccess : set_error(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaStreamQuery(cudaStream_t stream) { return cudaStreamSynchronize(stream); }
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  if (!valid_stream(stream) || !valid_event(event)) return set_error(cudaErrorInvalidResourceHandle);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
  if (!event) return set_error(cudaErrorInvalidValue);
  event_rec *e = (event_rec *)calloc(1, sizeof(event_rec));
  if (!e) return set_error(cudaErrorMemoryAllocation);
  std::lock_guard<std::mutex> lock(events.m);
  events.live[e] = 1;
  *event = (cudaEvent_t)e;
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *event) { return cudaEventCreateWithFlags(event, 0); }
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (!event) return set_error(cudaErrorInvalidResourceHandle);
  {
    std::lock_guard<std::mutex> lock(events.m);
    if (!events.live.erase((void *)event)) return set_error(cudaErrorInvalidResourceHandle);
  }
  free(event);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (!valid_event(event) || !valid_stream(stream)) return set_error(cudaErrorInvalidResourceHandle);
  event_rec *e = (event_rec *)event;
  e->t_ms = now_ms();
  e->recorded = true;
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  return valid_event(event) ? cudaSuccess : set_error(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaEventQuery(cudaEvent_t event) { return cudaEventSynchronize(event); }
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
  if (!ms) return set_error(cudaErrorInvalidValue);
  if (!valid_event(start) || !valid_event(end)) return set_error(cudaErrorInvalidResourceHandle);
  event_rec *a = (event_rec *)start, *b = (event_rec *)end;
  if (!a->recorded || !b->recorded) return set_error(cudaErrorInvalidResourceHandle);
  *ms = (float)(b->t_ms - a->t_ms);
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value) {
  if (!func || attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || value > 227 * 1024)
    return set_error(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(table_mutex);
  smem_limits[func] = value;
  return cudaSuccess;
}

} // extern "C"
