/* The CUDA emulator's own tests (tests/cudaemu): each feature Tandem's
 * kernels rely on, against closed-form values, so that a kernel test passing
 * under the emulator means something. Built only in the emulator tree. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/cuda/mma_sm80.cuh"

static int failures = 0;
#define EXPECT(cond, ...)                                                    \
  do {                                                                       \
    if (!(cond)) {                                                           \
      fprintf(stderr, "%s:%d: EXPECT(%s) failed: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                          \
      fprintf(stderr, "\n");                                                 \
      failures++;                                                            \
    }                                                                        \
  } while (0)
#define CUDA_OK(expr)                                                        \
  do {                                                                       \
    cudaError_t e_ = (expr);                                                 \
    if (e_ != cudaSuccess) {                                                 \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      exit(1);                                                               \
    }                                                                        \
  } while (0)

/* ---- block reduction through shared memory and __syncthreads ---- */
__global__ void block_sum_kernel(long long *out, int n) {
  __shared__ long long partial[1024];
  long long acc = 0;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) acc += i;
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(out, partial[0]);
}

static void test_block_sum(void) {
  long long *d;
  CUDA_OK(cudaMalloc((void **)&d, sizeof *d));
  const int sizes[] = {0, 1, 31, 1000, 77777};
  const int blocks[] = {1, 32, 256, 1024};
  for (int b : blocks)
    for (int n : sizes) {
      CUDA_OK(cudaMemset(d, 0, sizeof *d));
      TD_CUDA_LAUNCH(block_sum_kernel, 3, b, 0, 0, d, n);
      CUDA_OK(cudaGetLastError());
      long long got;
      CUDA_OK(cudaMemcpy(&got, d, sizeof got, cudaMemcpyDeviceToHost));
      long long want = (long long)n * (n - 1) / 2;
      EXPECT(got == want, "block %d n %d: %lld != %lld", b, n, got, want);
    }
  CUDA_OK(cudaFree(d));
}

/* ---- a missing __syncthreads shows: thread i reads what thread i+1 wrote ---- */
__global__ void neighbour_kernel(int *out, int with_sync) {
  __shared__ int s[64];
  s[threadIdx.x] = (int)threadIdx.x + 1000 * (int)blockIdx.x;
  if (with_sync) __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}

static void test_missing_sync_shows(void) {
  int *d, h[128];
  CUDA_OK(cudaMalloc((void **)&d, sizeof h));
  TD_CUDA_LAUNCH(neighbour_kernel, 2, 64, 0, 0, d, 1);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
  for (int i = 0; i < 128; i++) {
    int want = (i % 64 + 1) % 64 + 1000 * (i / 64);
    EXPECT(h[i] == want, "with sync, thread %d read %d, want %d", i, h[i], want);
  }
  TD_CUDA_LAUNCH(neighbour_kernel, 2, 64, 0, 0, d, 0);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
  int stale = 0;
  for (int i = 0; i < 128; i++) stale += h[i] != (i % 64 + 1) % 64 + 1000 * (i / 64);
  EXPECT(stale > 0, "without __syncthreads every thread still saw its neighbour's write");
  CUDA_OK(cudaFree(d));
}

/* ---- warp shuffles, ballot; blocks not a multiple of 32 ---- */
__global__ void shuffle_kernel(int *xor_sum, int *down_sum, int *bcast, int *scan, int *xor16, unsigned *ballot) {
  int lane = threadIdx.x % 32, t = threadIdx.x;
  int v = t + 1;
  int s = v;
  for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
  xor_sum[t] = s;
  int d = v;
  for (int o = 16; o > 0; o /= 2) d += __shfl_down_sync(0xffffffffu, d, o);
  down_sum[t] = d;
  bcast[t] = __shfl_sync(0xffffffffu, v * 10, 5);
  int x = v;
  for (int o = 1; o < 32; o *= 2) {
    int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  scan[t] = x;
  int h = v;
  for (int o = 8; o > 0; o /= 2) h += __shfl_xor_sync(0xffffffffu, h, o, 16);
  xor16[t] = h;
  ballot[t] = __ballot_sync(0xffffffffu, (t % 3) == 0);
}

static void test_shuffles(void) {
  const int n = 64;
  int *d;
  unsigned *db;
  CUDA_OK(cudaMalloc((void **)&d, 5 * n * sizeof(int)));
  CUDA_OK(cudaMalloc((void **)&db, n * sizeof(unsigned)));
  TD_CUDA_LAUNCH(shuffle_kernel, 1, n, 0, 0, d, d + n, d + 2 * n, d + 3 * n, d + 4 * n, db);
  CUDA_OK(cudaGetLastError());
  int h[5 * 64];
  unsigned hb[64];
  CUDA_OK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(hb, db, sizeof hb, cudaMemcpyDeviceToHost));
  for (int t = 0; t < n; t++) {
    int w = t / 32, lane = t % 32;
    int warp_sum = 32 * 32 * w + 32 * 33 / 2; /* sum of t+1 over the warp */
    EXPECT(h[t] == warp_sum, "xor sum lane %d: %d != %d", t, h[t], warp_sum);
    if (lane == 0) EXPECT(h[n + t] == warp_sum, "down sum at lane 0 of warp %d: %d != %d", w, h[n + t], warp_sum);
    EXPECT(h[2 * n + t] == (32 * w + 6) * 10, "broadcast lane %d: %d", t, h[2 * n + t]);
    int scan_want = 0;
    for (int i = 32 * w; i <= t; i++) scan_want += i + 1;
    EXPECT(h[3 * n + t] == scan_want, "inclusive scan lane %d: %d != %d", t, h[3 * n + t], scan_want);
    int g = t / 16, sum16 = 16 * 16 * g + 16 * 17 / 2;
    EXPECT(h[4 * n + t] == sum16, "xor sum within 16 lanes, lane %d: %d != %d", t, h[4 * n + t], sum16);
    unsigned want_bits = 0;
    for (int i = 0; i < 32; i++)
      if ((32 * w + i) % 3 == 0) want_bits |= 1u << i;
    EXPECT(hb[t] == want_bits, "ballot lane %d: %08x != %08x", t, hb[t], want_bits);
  }
  CUDA_OK(cudaFree(d));
  CUDA_OK(cudaFree(db));
}

/* partial last warp: 40 threads, the second warp has 8 live lanes; a
 * reduction within groups of 8 (width 8) is defined there as on a GPU */
__global__ void partial_warp_kernel(int *out) {
  int s = (int)threadIdx.x;
  for (int o = 4; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o, 8);
  out[threadIdx.x] = s;
}

static void test_partial_warp(void) {
  int *d, h[40];
  CUDA_OK(cudaMalloc((void **)&d, sizeof h));
  TD_CUDA_LAUNCH(partial_warp_kernel, 1, 40, 0, 0, d);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
  for (int t = 0; t < 40; t++) {
    int g = t / 8, want = 8 * 8 * g + 28; /* sum of 8g .. 8g+7 */
    EXPECT(h[t] == want, "group-of-8 sum at thread %d: %d != %d", t, h[t], want);
  }
  CUDA_OK(cudaFree(d));
}

/* ---- atomics across blocks, 2-D blocks and a 3-D grid ---- */
__global__ void atomic_kernel(int *counter, float *hist, unsigned *ids) {
  atomicAdd(counter, 1);
  atomicAdd(&hist[threadIdx.y], 0.5f);
  unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  unsigned t = threadIdx.x + blockDim.x * threadIdx.y;
  ids[block * blockDim.x * blockDim.y + t] = block * 1000 + t;
}

static void test_atomics_and_indices(void) {
  int *counter;
  float *hist;
  unsigned *ids;
  dim3 grid(2, 3, 2), block(5, 7);
  const int n_blocks = 12, n_threads = 35;
  CUDA_OK(cudaMalloc((void **)&counter, sizeof(int)));
  CUDA_OK(cudaMalloc((void **)&hist, 7 * sizeof(float)));
  CUDA_OK(cudaMalloc((void **)&ids, n_blocks * n_threads * sizeof(unsigned)));
  CUDA_OK(cudaMemset(counter, 0, sizeof(int)));
  CUDA_OK(cudaMemset(hist, 0, 7 * sizeof(float)));
  TD_CUDA_LAUNCH(atomic_kernel, grid, block, 0, 0, counter, hist, ids);
  CUDA_OK(cudaGetLastError());
  int c;
  float hh[7];
  unsigned hid[12 * 35];
  CUDA_OK(cudaMemcpy(&c, counter, sizeof c, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(hh, hist, sizeof hh, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(hid, ids, sizeof hid, cudaMemcpyDeviceToHost));
  EXPECT(c == n_blocks * n_threads, "counter %d", c);
  for (int y = 0; y < 7; y++) EXPECT(hh[y] == 0.5f * 5 * n_blocks, "hist[%d] = %g", y, hh[y]);
  for (int b = 0; b < n_blocks; b++)
    for (int t = 0; t < n_threads; t++)
      EXPECT(hid[b * n_threads + t] == (unsigned)(b * 1000 + t), "id %d/%d: %u", b, t, hid[b * n_threads + t]);
  CUDA_OK(cudaFree(counter));
  CUDA_OK(cudaFree(hist));
  CUDA_OK(cudaFree(ids));
}

/* ---- bf16: round to nearest, ties to even, on the device and the host ---- */
__global__ void bf16_kernel(unsigned short *out, const float *in, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __bfloat16_as_ushort(__float2bfloat16(in[i]));
}

static float from_bits(unsigned u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static void test_bf16(void) {
  /* f32 bit patterns and the bf16 they must become: the low 16 bits decide */
  const unsigned in[] = {
      0x3f800000u, /* 1.0 exactly */
      0x3f808000u, /* 1 + 2^-8: halfway between 1 (even) and 1 + 2^-7 -> 1 */
      0x3f818000u, /* 1 + 3*2^-8: halfway between 1 + 2^-7 (odd) and 1 + 2^-6 -> 1 + 2^-6 */
      0x3f808001u, /* just above the first tie -> up */
      0x3f817fffu, /* just below the second tie -> down */
      0xbf808000u, /* -(1 + 2^-8) -> -1 */
      0x7f7fffffu, /* largest f32 rounds up past bf16's largest -> inf */
      0x7f800000u, /* inf */
      0x7fc00000u, /* NaN -> canonical 0x7fff */
      0x00000001u, /* smallest subnormal -> +0 */
      0x80000000u, /* -0 */
  };
  const unsigned short want[] = {0x3f80, 0x3f80, 0x3f82, 0x3f81, 0x3f81, 0xbf80, 0x7f80, 0x7f80, 0x7fff, 0x0000, 0x8000};
  const int n = (int)(sizeof in / sizeof in[0]);
  float hin[16];
  for (int i = 0; i < n; i++) hin[i] = from_bits(in[i]);
  float *din;
  unsigned short *dout, hout[16];
  CUDA_OK(cudaMalloc((void **)&din, n * sizeof(float)));
  CUDA_OK(cudaMalloc((void **)&dout, n * sizeof(unsigned short)));
  CUDA_OK(cudaMemcpy(din, hin, n * sizeof(float), cudaMemcpyHostToDevice));
  TD_CUDA_LAUNCH(bf16_kernel, 1, 32, 0, 0, dout, din, n);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaMemcpy(hout, dout, n * sizeof(unsigned short), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; i++) {
    EXPECT(hout[i] == want[i], "bf16(0x%08x) = 0x%04x, want 0x%04x", in[i], hout[i], want[i]);
    if (want[i] != 0x7fff) {
      float back = (float)__ushort_as_bfloat16(want[i]);
      unsigned back_bits;
      memcpy(&back_bits, &back, 4);
      EXPECT(back_bits == (unsigned)want[i] << 16, "bf16 0x%04x to float: 0x%08x", want[i], back_bits);
    }
  }
  CUDA_OK(cudaFree(din));
  CUDA_OK(cudaFree(dout));
}

/* ---- dynamic shared memory and its 48 KiB default limit ---- */
__global__ void dyn_smem_kernel(long long *out, int n) {
  TD_DYNAMIC_SMEM(int, buf);
  for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = i;
  __syncthreads();
  if (threadIdx.x == 0) {
    long long s = 0;
    for (int i = 0; i < n; i++) s += buf[n - 1 - i];
    out[blockIdx.x] = s;
  }
}

static void test_dynamic_smem(void) {
  long long *d, h[2];
  CUDA_OK(cudaMalloc((void **)&d, sizeof h));
  int n = 16384; /* 64 KiB */
  TD_CUDA_LAUNCH(dyn_smem_kernel, 2, 128, n * sizeof(int), 0, d, n);
  EXPECT(cudaGetLastError() == cudaErrorInvalidValue, "64 KiB of dynamic shared memory without the attribute");
  CUDA_OK(cudaFuncSetAttribute((const void *)dyn_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               (int)(n * sizeof(int))));
  TD_CUDA_LAUNCH(dyn_smem_kernel, 2, 128, n * sizeof(int), 0, d, n);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
  long long want = (long long)n * (n - 1) / 2;
  EXPECT(h[0] == want && h[1] == want, "sums %lld %lld, want %lld", h[0], h[1], want);
  CUDA_OK(cudaFree(d));
}

/* ---- errors: bad configurations and mismatched barriers end, not hang ---- */
__global__ void mismatched_barrier_kernel(int *out) {
  if (threadIdx.x == 0)
    __syncthreads();
  else
    __syncwarp();
  out[threadIdx.x] = 1;
}
__global__ void noop_kernel(int *out) {}

static void test_errors(void) {
  int *d;
  CUDA_OK(cudaMalloc((void **)&d, 64 * sizeof(int)));
  TD_CUDA_LAUNCH(noop_kernel, 1, 2048, 0, 0, d);
  EXPECT(cudaGetLastError() == cudaErrorInvalidConfiguration, "block of 2048 threads");
  EXPECT(cudaGetLastError() == cudaSuccess, "cudaGetLastError clears");
  TD_CUDA_LAUNCH(noop_kernel, 0, 32, 0, 0, d);
  EXPECT(cudaGetLastError() == cudaErrorInvalidConfiguration, "empty grid");
  fprintf(stderr, "(a deadlock report follows: expected)\n");
  TD_CUDA_LAUNCH(mismatched_barrier_kernel, 1, 64, 0, 0, d);
  EXPECT(cudaGetLastError() == cudaErrorLaunchFailure, "threads at different barriers");
  /* the scheduler is usable after an abandoned block */
  long long *s;
  CUDA_OK(cudaMalloc((void **)&s, sizeof *s));
  CUDA_OK(cudaMemset(s, 0, sizeof *s));
  TD_CUDA_LAUNCH(block_sum_kernel, 2, 128, 0, 0, s, 100);
  CUDA_OK(cudaGetLastError());
  long long got;
  CUDA_OK(cudaMemcpy(&got, s, sizeof got, cudaMemcpyDeviceToHost));
  EXPECT(got == 4950, "after a failed launch: %lld", got);
  CUDA_OK(cudaFree(s));
  CUDA_OK(cudaFree(d));
}

/* ---- memory: fill, directions, ranges, attributes, streams, events ---- */
static void test_memory(void) {
  float *d, h[8];
  CUDA_OK(cudaMalloc((void **)&d, 8 * sizeof(float)));
  CUDA_OK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
  for (int i = 0; i < 8; i++) EXPECT(isnan(h[i]), "fresh device memory reads %g, not NaN", h[i]);
  EXPECT(cudaMemcpy(d, h, sizeof h, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue, "wrong direction");
  EXPECT(cudaMemcpy(d + 4, h, sizeof h, cudaMemcpyHostToDevice) == cudaErrorInvalidValue, "past the end");
  EXPECT(cudaMemset(h, 0, sizeof h) == cudaErrorInvalidValue, "memset of host memory");
  (void)cudaGetLastError();
  for (int i = 0; i < 8; i++) h[i] = (float)i;
  CUDA_OK(cudaMemcpy(d, h, sizeof h, cudaMemcpyDefault));
  float back[8];
  cudaStream_t st;
  CUDA_OK(cudaStreamCreate(&st));
  CUDA_OK(cudaMemcpyAsync(back, d, sizeof back, cudaMemcpyDeviceToHost, st));
  CUDA_OK(cudaStreamSynchronize(st));
  EXPECT(memcmp(back, h, sizeof h) == 0, "round trip");
  struct cudaPointerAttributes a;
  CUDA_OK(cudaPointerGetAttributes(&a, d + 3));
  EXPECT(a.type == cudaMemoryTypeDevice, "device pointer type %d", (int)a.type);
  CUDA_OK(cudaPointerGetAttributes(&a, h));
  EXPECT(a.type == cudaMemoryTypeUnregistered, "host pointer type %d", (int)a.type);
  void *pinned;
  CUDA_OK(cudaMallocHost(&pinned, 100));
  CUDA_OK(cudaPointerGetAttributes(&a, pinned));
  EXPECT(a.type == cudaMemoryTypeHost, "pinned pointer type %d", (int)a.type);
  EXPECT(cudaFree(pinned) == cudaErrorInvalidValue, "cudaFree of pinned memory");
  (void)cudaGetLastError();
  CUDA_OK(cudaFreeHost(pinned));
  cudaEvent_t e0, e1;
  CUDA_OK(cudaEventCreate(&e0));
  CUDA_OK(cudaEventCreate(&e1));
  CUDA_OK(cudaEventRecord(e0, st));
  CUDA_OK(cudaEventRecord(e1, st));
  float ms = -1;
  CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
  EXPECT(ms >= 0, "elapsed %g ms", ms);
  CUDA_OK(cudaStreamWaitEvent(st, e1, 0));
  CUDA_OK(cudaEventDestroy(e0));
  CUDA_OK(cudaEventDestroy(e1));
  CUDA_OK(cudaStreamDestroy(st));
  EXPECT(cudaStreamSynchronize(st) == cudaErrorInvalidResourceHandle, "destroyed stream");
  (void)cudaGetLastError();
  CUDA_OK(cudaFree(d));
  int n = -1;
  CUDA_OK(cudaGetDeviceCount(&n));
  EXPECT(n == 1, "device count %d", n);
  EXPECT(cudaSetDevice(1) == cudaErrorInvalidDevice, "cudaSetDevice(1) of 1");
  setenv("TANDEM_CUDAEMU_DEVICES", "0", 1);
  EXPECT(cudaGetDeviceCount(&n) == cudaErrorNoDevice && n == 0, "no device: count %d", n);
  unsetenv("TANDEM_CUDAEMU_DEVICES");
  (void)cudaGetLastError();
}

/* ---- a launch from another thread: it gets its own scheduler ---- */
#include <pthread.h>
static void *thread_launch(void *arg) {
  long long *d = (long long *)arg;
  TD_CUDA_LAUNCH(block_sum_kernel, 2, 64, 0, 0, d, 1000);
  return (void *)(long)cudaGetLastError();
}

static void test_other_thread(void) {
  long long *d, got = 0;
  CUDA_OK(cudaMalloc((void **)&d, sizeof *d));
  CUDA_OK(cudaMemset(d, 0, sizeof *d));
  pthread_t th;
  void *rc = NULL;
  EXPECT(pthread_create(&th, NULL, thread_launch, d) == 0, "pthread_create");
  pthread_join(th, &rc);
  EXPECT(rc == NULL, "launch from a second thread: error %ld", (long)rc);
  CUDA_OK(cudaMemcpy(&got, d, sizeof got, cudaMemcpyDeviceToHost));
  EXPECT(got == 499500, "sum from a second thread: %lld", got);
  CUDA_OK(cudaFree(d));
}


/* ---- sm_80 warp matrix instructions (src/nn/cuda/mma_sm80.cuh) against the
 * PTX ISA's fragment tables, written out here element by element (the
 * emulator gathers them by lane instead), and against a plain matrix
 * product. Values are small integers: every product and sum is exact, so
 * any wrong lane mapping shows as a mismatch, not as a rounding. ---- */
/* PTX ISA, mma.m16n8k16 .bf16, element i (0..7) of A held by a lane with
 * groupID g, threadID_in_group t: row g (+8 for i = 2, 3, 6, 7), column
 * 2t + (i & 1) (+8 for i >= 4); B element i (0..3): row 2t + (i & 1)
 * (+8 for i >= 2), column g; C element i (0..3): row g (+8 for i >= 2),
 * column 2t + (i & 1). Registers hold elements 2r (low half), 2r + 1. */
static __device__ int ptx_a_row(int g, int i) { return g + ((i == 2 || i == 3 || i == 6 || i == 7) ? 8 : 0); }
static __device__ int ptx_a_col(int t, int i) { return 2 * t + (i & 1) + (i >= 4 ? 8 : 0); }
static __device__ int ptx_b_row(int t, int i) { return 2 * t + (i & 1) + (i >= 2 ? 8 : 0); }
static __device__ int ptx_c_row(int g, int i) { return g + (i >= 2 ? 8 : 0); }

static __device__ uint32_t bf16_pair(float lo, float hi) { return td_pack_bf16x2(lo, hi); }

__global__ void mma_table_kernel(float *D, const float *A /* 16x16 */, const float *B /* 16x8 (k, n) */,
                                 const float *Cm /* 16x8 */, int in_place) {
  int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  uint32_t a[4], b[2];
  float c[4], d[4];
  for (int r = 0; r < 4; r++)
    a[r] = bf16_pair(A[ptx_a_row(g, 2 * r) * 16 + ptx_a_col(t, 2 * r)],
                     A[ptx_a_row(g, 2 * r + 1) * 16 + ptx_a_col(t, 2 * r + 1)]);
  for (int r = 0; r < 2; r++) b[r] = bf16_pair(B[ptx_b_row(t, 2 * r) * 8 + g], B[ptx_b_row(t, 2 * r + 1) * 8 + g]);
  for (int i = 0; i < 4; i++) c[i] = Cm[ptx_c_row(g, i) * 8 + 2 * t + (i & 1)];
  if (in_place) {
    td_mma_bf16_16816(c, a, b, c);
    for (int i = 0; i < 4; i++) d[i] = c[i];
  } else {
    td_mma_bf16_16816(d, a, b, c);
  }
  for (int i = 0; i < 4; i++) D[ptx_c_row(g, i) * 8 + 2 * t + (i & 1)] = d[i];
}

/* ldmatrix: lane L gives the address of row rows[L] of a 40 x 24 shared
 * matrix (any 16-byte aligned rows, here a scrambled order and column
 * offsets 0, 8, 16); out[L][i] = the register i of lane L */
__global__ void ldmatrix_kernel(uint32_t *out, const int *rows, const int *cols, int trans) {
  __shared__ __align__(16) __nv_bfloat16 M[40 * 24];
  for (int e = threadIdx.x; e < 40 * 24; e += 32) M[e] = __float2bfloat16((float)(e % 251));
  __syncwarp();
  int lane = threadIdx.x % 32;
  uint32_t r[4];
  const __nv_bfloat16 *row = M + rows[lane] * 24 + cols[lane];
  if (trans)
    td_ldmatrix_x4_trans(r, row);
  else
    td_ldmatrix_x4(r, row);
  for (int i = 0; i < 4; i++) out[lane * 4 + i] = r[i];
}

/* the chain the attention kernels use: O = (Q K^T) V for a 16 x 16 Q, 16
 * keys and an 8-column V, with Q as A by ldmatrix, K^T as B by ldmatrix,
 * the two 16 x 8 score tiles turned into one A fragment in registers, V as
 * B by ldmatrix .trans */
__global__ void mma_chain_kernel(float *O, const float *Q, const float *K, const float *V) {
  __shared__ __align__(16) __nv_bfloat16 Qs[16 * 24], Ks[16 * 24], Vs[16 * 24];
  for (int e = threadIdx.x; e < 16 * 16; e += 32) {
    Qs[(e / 16) * 24 + e % 16] = __float2bfloat16(Q[e]);
    Ks[(e / 16) * 24 + e % 16] = __float2bfloat16(K[e]);
    Vs[(e / 16) * 24 + e % 16] = __float2bfloat16(V[e]);
  }
  __syncwarp();
  int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  uint32_t qa[4], kb[4], vb[4];
  td_ldmatrix_x4(qa, Qs + (lane % 16) * 24 + (lane / 16) * 8);
  td_ldmatrix_x4(kb, Ks + (lane % 8 + (lane / 16) * 8) * 24 + ((lane / 8) % 2) * 8);
  float s[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
  td_mma_bf16_16816(s[0], qa, kb, s[0]);
  td_mma_bf16_16816(s[1], qa, kb + 2, s[1]);
  uint32_t pa[4] = {bf16_pair(s[0][0], s[0][1]), bf16_pair(s[0][2], s[0][3]), bf16_pair(s[1][0], s[1][1]),
                    bf16_pair(s[1][2], s[1][3])};
  td_ldmatrix_x4_trans(vb, Vs + (lane % 16) * 24 + (lane / 16) * 8);
  float o[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
  td_mma_bf16_16816(o[0], pa, vb, o[0]);
  td_mma_bf16_16816(o[1], pa, vb + 2, o[1]);
  for (int n = 0; n < 2; n++)
    for (int i = 0; i < 4; i++) O[ptx_c_row(g, i) * 16 + n * 8 + 2 * t + (i & 1)] = o[n][i];
}

static void test_mma_sm80(void) {
  float hA[256], hB[128], hC[128], hD[128];
  unsigned seed = 12345;
  auto rnd = [&](int lo, int hi) {
    seed = seed * 1103515245u + 12345u;
    return (float)(lo + (int)((seed >> 16) % (unsigned)(hi - lo + 1)));
  };
  for (int i = 0; i < 256; i++) hA[i] = rnd(-8, 8);
  for (int i = 0; i < 128; i++) hB[i] = rnd(-8, 8), hC[i] = rnd(-100, 100);
  float *dA, *dB, *dC, *dD;
  CUDA_OK(cudaMalloc((void **)&dA, sizeof hA));
  CUDA_OK(cudaMalloc((void **)&dB, sizeof hB));
  CUDA_OK(cudaMalloc((void **)&dC, sizeof hC));
  CUDA_OK(cudaMalloc((void **)&dD, sizeof hD));
  CUDA_OK(cudaMemcpy(dA, hA, sizeof hA, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dB, hB, sizeof hB, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dC, hC, sizeof hC, cudaMemcpyHostToDevice));
  for (int in_place = 0; in_place < 2; in_place++) {
    TD_CUDA_LAUNCH(mma_table_kernel, 1, 32, 0, 0, dD, dA, dB, dC, in_place);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaMemcpy(hD, dD, sizeof hD, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 16; i++)
      for (int j = 0; j < 8; j++) {
        float want = hC[i * 8 + j];
        for (int k = 0; k < 16; k++) want += hA[i * 16 + k] * hB[k * 8 + j];
        EXPECT(hD[i * 8 + j] == want, "mma (in place %d) D[%d][%d] = %g, want %g", in_place, i, j, hD[i * 8 + j],
               want);
      }
  }
  /* ldmatrix: scrambled rows (each lane its own), column offsets 0/8/16 */
  int hrows[32], hcols[32];
  for (int l = 0; l < 32; l++) hrows[l] = (l * 13 + 5) % 40, hcols[l] = 8 * (l % 3);
  int *drows, *dcols;
  uint32_t *dout, hout[128];
  CUDA_OK(cudaMalloc((void **)&drows, sizeof hrows));
  CUDA_OK(cudaMalloc((void **)&dcols, sizeof hcols));
  CUDA_OK(cudaMalloc((void **)&dout, sizeof hout));
  CUDA_OK(cudaMemcpy(drows, hrows, sizeof hrows, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dcols, hcols, sizeof hcols, cudaMemcpyHostToDevice));
  for (int trans = 0; trans < 2; trans++) {
    TD_CUDA_LAUNCH(ldmatrix_kernel, 1, 32, 0, 0, dout, drows, dcols, trans);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaMemcpy(hout, dout, sizeof hout, cudaMemcpyDeviceToHost));
    /* PTX: matrix i's row r is at the address of lane 8i + r; lane L gets
     * row L/4, columns 2(L%4) and 2(L%4)+1 of matrix i (of its transpose
     * with .trans: column L/4, rows 2(L%4) and 2(L%4)+1) */
    for (int L = 0; L < 32; L++)
      for (int i = 0; i < 4; i++) {
        int want[2];
        for (int e = 0; e < 2; e++) {
          int r = trans ? 2 * (L % 4) + e : L / 4, c = trans ? L / 4 : 2 * (L % 4) + e;
          int src = 8 * i + r;
          want[e] = (hrows[src] * 24 + hcols[src] + c) % 251;
        }
        uint32_t got = hout[L * 4 + i];
        float lo = td_emu_bf16_bits_to_f32((unsigned short)(got & 0xffff)), hi = td_emu_bf16_bits_to_f32((unsigned short)(got >> 16));
        EXPECT(lo == (float)want[0] && hi == (float)want[1], "ldmatrix%s lane %d reg %d: (%g, %g), want (%d, %d)",
               trans ? ".trans" : "", L, i, lo, hi, want[0], want[1]);
      }
  }
  /* what a GPU stops a kernel for fails the launch here too: a row address
   * that is not 16-byte aligned, a warp-collective instruction with half a warp */
  hcols[5] = 4;
  CUDA_OK(cudaMemcpy(dcols, hcols, sizeof hcols, cudaMemcpyHostToDevice));
  fprintf(stderr, "(two fault reports follow: expected)\n");
  TD_CUDA_LAUNCH(ldmatrix_kernel, 1, 32, 0, 0, dout, drows, dcols, 0);
  EXPECT(cudaGetLastError() == cudaErrorLaunchFailure, "a misaligned ldmatrix row did not fail the launch");
  TD_CUDA_LAUNCH(mma_table_kernel, 1, 16, 0, 0, dD, dA, dB, dC, 0);
  EXPECT(cudaGetLastError() == cudaErrorLaunchFailure, "mma.sync with 16 of 32 lanes did not fail the launch");
  /* the chain: O = (Q K^T) V; Q, K in [-2, 2], V in [-3, 3]: S within +-64, exact in bf16 */
  float hQ[256], hK[256], hV[256], hO[256];
  for (int i = 0; i < 256; i++) hQ[i] = rnd(-2, 2), hK[i] = rnd(-2, 2), hV[i] = rnd(-3, 3);
  float *dQ, *dK, *dV, *dO;
  CUDA_OK(cudaMalloc((void **)&dQ, sizeof hQ));
  CUDA_OK(cudaMalloc((void **)&dK, sizeof hK));
  CUDA_OK(cudaMalloc((void **)&dV, sizeof hV));
  CUDA_OK(cudaMalloc((void **)&dO, sizeof hO));
  CUDA_OK(cudaMemcpy(dQ, hQ, sizeof hQ, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dK, hK, sizeof hK, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dV, hV, sizeof hV, cudaMemcpyHostToDevice));
  TD_CUDA_LAUNCH(mma_chain_kernel, 1, 32, 0, 0, dO, dQ, dK, dV);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaMemcpy(hO, dO, sizeof hO, cudaMemcpyDeviceToHost));
  for (int i = 0; i < 16; i++)
    for (int d = 0; d < 16; d++) {
      float want = 0;
      for (int j = 0; j < 16; j++) {
        float sc = 0;
        for (int k = 0; k < 16; k++) sc += hQ[i * 16 + k] * hK[j * 16 + k];
        want += sc * hV[j * 16 + d];
      }
      EXPECT(hO[i * 16 + d] == want, "chain O[%d][%d] = %g, want %g", i, d, hO[i * 16 + d], want);
    }
  cudaFree(dA), cudaFree(dB), cudaFree(dC), cudaFree(dD), cudaFree(drows), cudaFree(dcols), cudaFree(dout);
  cudaFree(dQ), cudaFree(dK), cudaFree(dV), cudaFree(dO);
}

/* cp.async: a copy is done when a wait_group lets its group complete; read
 * before that, shared memory holds the old bytes (as it may on a GPU) */
__global__ void cp_async_kernel(int *out, const int *src) {
  __shared__ __align__(16) int buf[3][4];
  int t = threadIdx.x;
  for (int i = 0; i < 12; i++) (&buf[0][0])[i] = -1;
  __syncthreads();
  if (t == 0) {
    td_cp_async16(buf[0], src, true);
    td_cp_async_commit();
    td_cp_async16(buf[1], src + 4, true);
    td_cp_async16(buf[2], src, false); /* zero-fill */
    td_cp_async_commit();
    out[0] = buf[0][0]; /* before any wait: -1 */
    td_emu::cp_async_wait(1); /* the first group */
    out[1] = buf[0][1], out[2] = buf[1][0];
    td_cp_async_wait<0>();
    out[3] = buf[1][3], out[4] = buf[2][2];
  }
}

static void test_cp_async(void) {
  int h[8] = {10, 11, 12, 13, 14, 15, 16, 17}, got[5];
  int *dsrc, *dout;
  CUDA_OK(cudaMalloc((void **)&dsrc, sizeof h));
  CUDA_OK(cudaMalloc((void **)&dout, sizeof got));
  CUDA_OK(cudaMemcpy(dsrc, h, sizeof h, cudaMemcpyHostToDevice));
  TD_CUDA_LAUNCH(cp_async_kernel, 1, 32, 0, 0, dout, dsrc);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaMemcpy(got, dout, sizeof got, cudaMemcpyDeviceToHost));
  const int want[5] = {-1, 11, -1, 17, 0};
  for (int i = 0; i < 5; i++) EXPECT(got[i] == want[i], "cp.async read %d: %d, want %d", i, got[i], want[i]);
  cudaFree(dsrc), cudaFree(dout);
}

int main(void) {
  test_mma_sm80();
  test_cp_async();
  test_block_sum();
  test_missing_sync_shows();
  test_shuffles();
  test_partial_warp();
  test_atomics_and_indices();
  test_bf16();
  test_dynamic_smem();
  test_errors();
  test_memory();
  test_other_thread();
  if (failures) {
    fprintf(stderr, "%d failure(s)\n", failures);
    return 1;
  }
  printf("cudaemu: all emulator checks passed\n");
  return 0;
}
