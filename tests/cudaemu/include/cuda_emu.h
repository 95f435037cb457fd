/* CUDA emulator (tests/cudaemu): the header forced into every .cu file of the
 * emulator tree (g++ -x c++ -include cuda_emu.h). It turns CUDA C++ into
 * ordinary C++ that runs on the CPU with the execution model's real
 * semantics where Tandem's kernels depend on them:
 *  - a launch (TD_CUDA_LAUNCH) runs the grid's blocks one after another; the
 *    threads of a block are fibers on the calling OS thread (emu_runtime.cc),
 *    each with its own stack, threadIdx, and a turn until it reaches a
 *    barrier;
 *  - __syncthreads() waits for every live thread of the block, __syncwarp()
 *    and the shuffles for every live thread of the warp (32 consecutive
 *    linear thread ids); threads waiting at different barriers is reported
 *    as a failed launch (cudaErrorLaunchFailure), not a hang;
 *  - between barriers the threads run in turn, forward in even phases and
 *    backward in odd ones, so that a read of shared memory that lacks its
 *    __syncthreads sees the other order at least once;
 *  - __shared__ variables are `static __thread`: one copy per OS thread,
 *    shared by the fibers of the block running on it (blocks run in
 *    sequence, so a block sees the previous block's values, as stale shared
 *    memory would on a GPU); dynamic shared memory through TD_DYNAMIC_SMEM;
 *  - atomics are plain read-modify-writes (fibers never interleave inside
 *    one), __ldg a plain load, math intrinsics their libm functions.
 * cublasLt.h beside it is a reference version with the
 * real semantics; the sm_80 warp-level instructions that
 * src/nn/cuda/mma_sm80.cuh wraps (mma.sync m16n8k16 bf16, ldmatrix .x4 and
 * .x4.trans) are emulated with PTX's documented per-lane fragment layout
 * (emu_mma_sm80.cc), so that a kernel that relies on that layout runs here
 * as on a GPU. It cannot show timing, the memory model's races between
 * blocks or warps (everything here is sequentially consistent), or real
 * tensor cores and cuBLASLt's kernels: those run on a GPU only
 * (scripts/gpu-check). */
#ifndef TD_CUDAEMU_CUDA_EMU_H
#define TD_CUDAEMU_CUDA_EMU_H

#ifndef __cplusplus
#error "cuda_emu.h is for .cu files compiled as C++ (the emulator tree's g++ -x c++)"
#endif

#include <cmath>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __shared__ static __thread
#define __align__(n) __attribute__((aligned(n)))
constexpr int warpSize = 32;

namespace td_emu {
struct launch_cfg {
  dim3 grid, block;
  size_t smem;
  void *stream;
  const void *func;
  const char *name, *file;
  int line;
};
extern __thread uint3 thread_idx, block_idx;
extern __thread dim3 block_dim, grid_dim;
void launch(const launch_cfg &cfg, void (*body)(void *), void *ctx);
void sync_block();
void sync_warp();
unsigned lane();
/* Deposit `mine`, wait for the warp, return lane `src`'s deposit (own value
 * when src is not a lane that took part: one that returned, or is past the
 * block's end). One wait: deposits alternate between two slots, so that a
 * lane running on to its next exchange keeps this one's for the others. */
uint64_t warp_exchange(uint64_t mine, unsigned src);
/* Deposit pred, wait for the warp, return the bit mask of lanes with pred != 0. */
unsigned warp_ballot(int pred);
void *dynamic_smem();
/* Warp-collective instructions (emu_mma_sm80.cc) are: lane_box_mine() (the
 * caller's 64-byte box for its next collective) written, sync_warp(), then
 * lane_box(src) read: lane src's box of that collective (a fault when lane
 * src did not take part). One wait: each lane's boxes alternate between two,
 * so that a lane running on to its next collective keeps this one's for the
 * others (a lane reaches collective n + 2 only after every lane passed n + 1's wait). */
void *lane_box_mine();
void *lane_box(unsigned src);
/* Record what a GPU would stop the kernel for (a misaligned ldmatrix row,
 * a warp-collective instruction missing lanes): the launch fails with
 * cudaErrorLaunchFailure and this message once the block's threads next
 * yield (the first fault of a block is reported). */
void fault(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The sm_80 instructions of src/nn/cuda/mma_sm80.cuh (emu_mma_sm80.cc), with
 * PTX's per-lane fragment layouts: every lane of the warp must call them. */
void mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]);
void ldmatrix_x4(uint32_t r[4], const void *row, bool trans);
/* cp.async (16 bytes, global to shared; src NULL: zeros), commit_group,
 * wait_group: the copies of a thread are queued and done when a wait_group
 * lets their group complete, so that shared memory read before the wait
 * still holds the old bytes, as it may on a GPU (a missing wait shows). */
struct cp_async_queue {
  struct op {
    void *dst;
    const void *src;
  } ops[64];
  int n_ops, n_committed; /* ops [0, n_committed) belong to committed groups */
  int group_end[16], n_groups;
};
cp_async_queue *cp_async_mine();
void cp_async16(void *dst, const void *src);
void cp_async_commit();
void cp_async_wait(int newest_pending);
template <class F> void run_body(void *f) { (*(F *)f)(); }
} // namespace td_emu

#define threadIdx (td_emu::thread_idx)
#define blockIdx (td_emu::block_idx)
#define blockDim (td_emu::block_dim)
#define gridDim (td_emu::grid_dim)
#define __syncthreads() td_emu::sync_block()
#define __syncwarp(...) td_emu::sync_warp()

/* kernel<<<grid, block, smem, stream>>>(args...) for nvcc and the emulator
 * alike (src/nn/cuda/cuda_common.cuh defines the nvcc form). The arguments are
 * captured by value, as a launch copies them. */
#define TD_CUDA_LAUNCH(kernel, grid, block, smem, stream, ...)                                            \
  do {                                                                                                    \
    auto td_emu_fn_ = [=]() { kernel(__VA_ARGS__); };                                                     \
    td_emu::launch(td_emu::launch_cfg{dim3(grid), dim3(block), (size_t)(smem), (void *)(stream),          \
                                      (const void *)(kernel), #kernel, __FILE__, __LINE__},               \
                   td_emu::run_body<decltype(td_emu_fn_)>, &td_emu_fn_);                                  \
  } while (0)
/* extern __shared__ T name[] (dynamic shared memory) in both worlds. */
#define TD_DYNAMIC_SMEM(T, name) T *name = (T *)td_emu::dynamic_smem()

/* ---- warp shuffles and votes (mask ignored: every live lane takes part) ---- */
template <class T> static inline T td_emu_exchange(T v, unsigned src) {
  static_assert(sizeof(T) <= 8, "shuffle of a value wider than 8 bytes");
  uint64_t bits = 0;
  memcpy(&bits, &v, sizeof(T));
  bits = td_emu::warp_exchange(bits, src);
  T out;
  memcpy(&out, &bits, sizeof(T));
  return out;
}
template <class T> static inline T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
  unsigned lane = td_emu::lane();
  return td_emu_exchange(v, (lane & ~(unsigned)(width - 1)) + ((unsigned)src_lane & (unsigned)(width - 1)));
}
template <class T> static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  unsigned lane = td_emu::lane(), src = lane ^ (unsigned)lane_mask;
  /* a later group's lane gives the caller's own value */
  if ((src & ~(unsigned)(width - 1)) > (lane & ~(unsigned)(width - 1))) src = lane;
  return td_emu_exchange(v, src);
}
template <class T> static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  unsigned lane = td_emu::lane();
  unsigned src = (lane % (unsigned)width) + delta < (unsigned)width ? lane + delta : lane;
  return td_emu_exchange(v, src);
}
template <class T> static inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  unsigned lane = td_emu::lane();
  unsigned src = (lane % (unsigned)width) >= delta ? lane - delta : lane;
  return td_emu_exchange(v, src);
}
static inline unsigned __ballot_sync(unsigned mask, int pred) { return td_emu::warp_ballot(pred); }
static inline int __any_sync(unsigned mask, int pred) { return td_emu::warp_ballot(pred) != 0; }
static inline int __all_sync(unsigned mask, int pred) {
  return td_emu::warp_ballot(!pred) == 0;
}

/* memory fences order nothing here: everything is sequentially consistent */
static inline void __threadfence() {}

/* ---- atomics: fibers never interleave inside one, so plain updates are atomic ---- */
template <class T> static inline T atomicAdd(T *p, T v) { T old = *p; *p = old + v; return old; }
template <class T> static inline T atomicMax(T *p, T v) { T old = *p; *p = old > v ? old : v; return old; }
template <class T> static inline T atomicMin(T *p, T v) { T old = *p; *p = old < v ? old : v; return old; }
template <class T> static inline T atomicExch(T *p, T v) { T old = *p; *p = v; return old; }
template <class T> static inline T atomicCAS(T *p, T compare, T v) {
  T old = *p;
  if (old == compare) *p = v;
  return old;
}

/* ---- loads, conversions and math intrinsics ---- */
template <class T> static inline T __ldg(const T *p) { return *p; }
template <class T> static inline T __ldcs(const T *p) { return *p; }
template <class T> static inline void __stcs(T *p, T v) { *p = v; }
/* (glibc declares __expf and __logf itself: macros, not functions) */
#define __expf expf
#define __logf logf
static inline float __fdividef(float a, float b) { return a / b; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
/* CUDA's device min/max overloads */
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }

#endif
