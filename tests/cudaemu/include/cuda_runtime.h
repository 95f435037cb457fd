/* CUDA emulator (tests/cudaemu): the subset of the CUDA runtime API that
 * Tandem's CUDA code may use, implemented on the CPU by emu_runtime.cc.
 *
 * Why: CI has no GPU. The emulator tree (make cuda-emu -> build/cudaemu)
 * compiles the same src/{device,nn,train}/cuda sources against this header
 * (C files with the C compiler, .cu files with g++ and cuda_emu.h forced in),
 * so that their logic runs and is tested on every CI pass.
 * Keep Tandem's CUDA code to what is declared here: anything else compiles
 * under nvcc only and would go untested. Names, values and signatures follow
 * the real runtime (cuda_runtime_api.h, driver_types.h) so that the same
 * source compiles on both.
 * Device memory is ordinary heap memory recorded in an allocation table (so
 * ASan sees kernels' out-of-bounds accesses, and cudaPointerGetAttributes and
 * copies can check which side a pointer is on); streams run everything at
 * once, in call order; there is one device (TANDEM_CUDAEMU_DEVICES=N
 * pretends N, 0 none, to exercise device-selection errors). */
#ifndef TD_CUDAEMU_CUDA_RUNTIME_H
#define TD_CUDAEMU_CUDA_RUNTIME_H

#include <stddef.h>

#ifndef TD_CUDA_EMU
#define TD_CUDA_EMU 1
#endif
#define CUDART_VERSION 12000

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchFailure = 719,
} cudaError_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

enum cudaMemoryType {
  cudaMemoryTypeUnregistered = 0,
  cudaMemoryTypeHost = 1,
  cudaMemoryTypeDevice = 2,
  cudaMemoryTypeManaged = 3,
};

struct cudaPointerAttributes {
  enum cudaMemoryType type;
  int device;
  void *devicePointer;
  void *hostPointer;
};

/* The fields the emulator fills (a subset of the real struct's). */
struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  size_t sharedMemPerBlock;
  size_t sharedMemPerBlockOptin;
  int warpSize;
  int maxThreadsPerBlock;
  int multiProcessorCount;
  int major;
  int minor;
  int l2CacheSize;
};

enum cudaDeviceAttr {
  cudaDevAttrMaxThreadsPerBlock = 1,
  cudaDevAttrMaxSharedMemoryPerBlock = 8,
  cudaDevAttrWarpSize = 10,
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};

enum cudaFuncAttribute {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
};

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;

#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02
#define cudaHostAllocDefault 0x00
#define cudaHostAllocPortable 0x01

/* C has no dim3 constructors: a plain struct there; C++ gets cuda_emu.h's. */
#ifdef __cplusplus
struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
};
#else
typedef struct dim3 {
  unsigned int x, y, z;
} dim3;
#endif
typedef struct uint3 {
  unsigned int x, y, z;
} uint3;

/* vector types (vector_types.h), with the real alignments */
typedef struct __attribute__((aligned(8))) float2 { float x, y; } float2;
typedef struct __attribute__((aligned(16))) float4 { float x, y, z, w; } float4;
typedef struct __attribute__((aligned(16))) int4 { int x, y, z, w; } int4;
typedef struct __attribute__((aligned(16))) uint4 { unsigned int x, y, z, w; } uint4;
static inline float2 make_float2(float x, float y) { float2 v = {x, y}; return v; }
static inline float4 make_float4(float x, float y, float z, float w) { float4 v = {x, y, z, w}; return v; }
static inline int4 make_int4(int x, int y, int z, int w) { int4 v = {x, y, z, w}; return v; }

const char *cudaGetErrorString(cudaError_t error);
const char *cudaGetErrorName(cudaError_t error);
cudaError_t cudaGetLastError(void);  /* returns and clears */
cudaError_t cudaPeekAtLastError(void);

cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device);
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaRuntimeGetVersion(int *version);
cudaError_t cudaDriverGetVersion(int *version);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);

cudaError_t cudaMalloc(void **ptr, size_t size);
cudaError_t cudaFree(void *ptr);
cudaError_t cudaMallocHost(void **ptr, size_t size);
cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned int flags);
cudaError_t cudaFreeHost(void *ptr);
#define cudaHostRegisterDefault 0x00
#define cudaHostRegisterPortable 0x01
/* The emulator's host memory is all alike: registering checks the
 * arguments and changes nothing (pinned or not, copies are memmove). */
cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags);
cudaError_t cudaHostUnregister(void *ptr);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream);
cudaError_t cudaMemset(void *ptr, int value, size_t count);
cudaError_t cudaMemsetAsync(void *ptr, int value, size_t count, cudaStream_t stream);
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes, const void *ptr);

cudaError_t cudaStreamCreate(cudaStream_t *stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags);

cudaError_t cudaEventCreate(cudaEvent_t *event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);

/* func: the kernel's address ((const void *)kernel). Only
 * cudaFuncAttributeMaxDynamicSharedMemorySize: a launch asking for more than
 * 48 KiB of dynamic shared memory fails unless this raised the kernel's limit. */
cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value);

#ifdef __cplusplus
}
#endif
#endif
