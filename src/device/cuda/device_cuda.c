/* src/device/cuda/device_cuda.c: the CUDA backend of src/device, a thin layer
 * of CUDA runtime calls that turns each failure into a td_status with the
 * call, the device and the runtime's own words (cudaGetErrorName and
 * cudaGetErrorString). device.c has already checked the arguments.
 *
 * Only the runtime subset that the CPU emulator implements is used
 * (tests/cudaemu/include/cuda_runtime.h), so that this file runs in CI under
 * the emulator tree exactly as it is compiled for a GPU.
 *
 * Blocking waits use events created with cudaEventBlockingSync: the host
 * thread sleeps until the GPU is done instead of spinning, which matters when
 * several ranks share one GPU and a few cores. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "device/device_cuda.h"

/* Turn a failed runtime call into a td_error naming it. The runtime's sticky
 * "last error" is cleared so that it does not surface in a later, unrelated
 * call. */
static td_status cuda_fail(cudaError_t err, const char *call, int index) {
  (void)cudaGetLastError();
  return td_error(TD_ERR_SYSTEM, "%s on cuda:%d: %s (%s)", call, index, cudaGetErrorString(err), cudaGetErrorName(err));
}

#define CUDA_TRY(call, what, index)                                  \
  do {                                                               \
    cudaError_t cuda_try_err_ = (call);                              \
    if (cuda_try_err_ != cudaSuccess) return cuda_fail(cuda_try_err_, what, index); \
  } while (0)

int td_cudadev_count(char *why, size_t why_size) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    if (why && why_size)
      snprintf(why, why_size, "cudaGetDeviceCount: %s (%s)%s", cudaGetErrorString(err), cudaGetErrorName(err),
               /* what a machine without the driver's libcuda.so.1 gets (by name: the emulator has no such code) */
               strcmp(cudaGetErrorName(err), "cudaErrorInsufficientDriver") == 0
                   ? " - the NVIDIA driver is missing here, or older than this CUDA runtime"
                   : "");
    return 0;
  }
  if (count == 0 && why && why_size) snprintf(why, why_size, "cudaGetDeviceCount found 0 devices");
  return count;
}

td_status td_cudadev_open(int index) {
  CUDA_TRY(cudaSetDevice(index), "cudaSetDevice", index);
  return TD_OK;
}

td_status td_cudadev_alloc(int index, size_t bytes, void **out) {
  CUDA_TRY(cudaSetDevice(index), "cudaSetDevice", index);
  cudaError_t err = cudaMalloc(out, bytes);
  if (err != cudaSuccess) {
    *out = NULL;
    (void)cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) (void)cudaGetLastError();
    return td_error(TD_ERR_SYSTEM, "cudaMalloc(%zu bytes) on cuda:%d: %s (%s); the device has %zu of %zu MiB free",
                    bytes, index, cudaGetErrorString(err), cudaGetErrorName(err), free_bytes >> 20,
                    total_bytes >> 20);
  }
  return TD_OK;
}

void td_cudadev_free(int index, void *ptr) {
  /* cudaFree waits for the device; an error here (a context already torn
   * down at exit) leaves nothing to do but to clear it. */
  if (cudaSetDevice(index) != cudaSuccess || cudaFree(ptr) != cudaSuccess) (void)cudaGetLastError();
}

td_status td_cudadev_memset0(int index, void *ptr, size_t bytes) {
  CUDA_TRY(cudaSetDevice(index), "cudaSetDevice", index);
  CUDA_TRY(cudaMemset(ptr, 0, bytes), "cudaMemset", index);
  return TD_OK;
}

td_status td_cudadev_copy(void *dst, int dst_index, const void *src, int src_index, size_t bytes) {
  enum cudaMemcpyKind kind;
  if (dst_index < 0)
    kind = cudaMemcpyDeviceToHost; /* src is on a device: device.c sent host-to-host to memmove */
  else if (src_index < 0)
    kind = cudaMemcpyHostToDevice;
  else if (src_index == dst_index)
    kind = cudaMemcpyDeviceToDevice;
  else
    kind = cudaMemcpyDefault; /* between two GPUs: unified addressing finds both */
  int index = dst_index >= 0 ? dst_index : src_index;
  CUDA_TRY(cudaSetDevice(index), "cudaSetDevice", index);
  cudaError_t err = cudaMemcpy(dst, src, bytes, kind);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    static const char *const names[] = {"host to host", "host to device", "device to host", "device to device",
                                        "between devices"};
    return td_error(TD_ERR_SYSTEM, "cudaMemcpy(%zu bytes, %s) on cuda:%d: %s (%s): is each pointer on the device "
                    "given for it?", bytes, names[kind], index, cudaGetErrorString(err), cudaGetErrorName(err));
  }
  return TD_OK;
}

td_status td_cudadev_mem_info(int index, size_t *free_out, size_t *total_out) {
  CUDA_TRY(cudaSetDevice(index), "cudaSetDevice", index);
  CUDA_TRY(cudaMemGetInfo(free_out, total_out), "cudaMemGetInfo", index);
  return TD_OK;
}

td_status td_cudadev_sync(int index) {
  CUDA_TRY(cudaSetDevice(index), "cudaSetDevice", index);
  CUDA_TRY(cudaDeviceSynchronize(), "cudaDeviceSynchronize", index);
  return TD_OK;
}

int td_cudadev_pointer_index(const void *ptr) {
  struct cudaPointerAttributes attr;
  cudaError_t err = cudaPointerGetAttributes(&attr, ptr);
  if (err != cudaSuccess) {
    /* no driver, or (CUDA < 11) a host pointer the runtime never saw */
    (void)cudaGetLastError();
    return -1;
  }
  /* managed memory counts as the device's: kernels may use it directly */
  if (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged) return attr.device;
  return -1;
}

void *td_cudadev_host_alloc(size_t bytes) {
  void *ptr = NULL;
  if (cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable) != cudaSuccess) {
    (void)cudaGetLastError();
    return NULL;
  }
  return ptr;
}

void td_cudadev_host_free(void *ptr) {
  if (cudaFreeHost(ptr) != cudaSuccess) (void)cudaGetLastError();
}

td_status td_cudadev_host_register(void *ptr, size_t bytes) {
  cudaError_t err = cudaHostRegister(ptr, bytes, cudaHostRegisterPortable);
  if (err == cudaSuccess) return TD_OK;
  (void)cudaGetLastError();
  return td_error(TD_ERR_SYSTEM, "cudaHostRegister(%zu bytes): %s (%s)", bytes, cudaGetErrorString(err),
                  cudaGetErrorName(err));
}

void td_cudadev_host_unregister(void *ptr) {
  if (cudaHostUnregister(ptr) != cudaSuccess) (void)cudaGetLastError();
}

td_status td_cudadev_stream_create(int index, void **native, void **blocker) {
  cudaStream_t stream = NULL;
  cudaEvent_t event = NULL;
  CUDA_TRY(cudaSetDevice(index), "cudaSetDevice", index);
  CUDA_TRY(cudaStreamCreate(&stream), "cudaStreamCreate", index);
  cudaError_t err = cudaEventCreateWithFlags(&event, cudaEventBlockingSync | cudaEventDisableTiming);
  if (err != cudaSuccess) {
    (void)cudaStreamDestroy(stream);
    return cuda_fail(err, "cudaEventCreateWithFlags", index);
  }
  *native = stream;
  *blocker = event;
  return TD_OK;
}

void td_cudadev_stream_destroy(int index, void *native, void *blocker) {
  /* A stream is destroyed only once its work is done, so that buffers freed
   * right after are not still being read. */
  if (td_cudadev_stream_sync(index, native, blocker) != TD_OK)
    TD_WARN("td_stream_destroy on cuda:%d: %s", index, td_last_error());
  if (blocker && cudaEventDestroy((cudaEvent_t)blocker) != cudaSuccess) (void)cudaGetLastError();
  if (native && cudaStreamDestroy((cudaStream_t)native) != cudaSuccess) (void)cudaGetLastError();
}

td_status td_cudadev_copy_async(void *dst, const void *src, size_t bytes, int index, void *native) {
  CUDA_TRY(cudaSetDevice(index), "cudaSetDevice", index);
  /* cudaMemcpyDefault: unified addressing tells host from device memory */
  CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)native), "cudaMemcpyAsync", index);
  return TD_OK;
}

td_status td_cudadev_memset0_async(void *ptr, size_t bytes, int index, void *native) {
  CUDA_TRY(cudaSetDevice(index), "cudaSetDevice", index);
  CUDA_TRY(cudaMemsetAsync(ptr, 0, bytes, (cudaStream_t)native), "cudaMemsetAsync", index);
  return TD_OK;
}

td_status td_cudadev_stream_sync(int index, void *native, void *blocker) {
  CUDA_TRY(cudaSetDevice(index), "cudaSetDevice", index);
  CUDA_TRY(cudaEventRecord((cudaEvent_t)blocker, (cudaStream_t)native), "cudaEventRecord", index);
  CUDA_TRY(cudaEventSynchronize((cudaEvent_t)blocker), "td_stream_sync: cudaEventSynchronize", index);
  return TD_OK;
}

td_status td_cudadev_event_create(int index, void **native) {
  cudaEvent_t event = NULL;
  CUDA_TRY(cudaSetDevice(index), "cudaSetDevice", index);
  CUDA_TRY(cudaEventCreateWithFlags(&event, cudaEventBlockingSync | cudaEventDisableTiming),
           "cudaEventCreateWithFlags", index);
  *native = event;
  return TD_OK;
}

void td_cudadev_event_destroy(int index, void *native) {
  (void)index;
  if (native && cudaEventDestroy((cudaEvent_t)native) != cudaSuccess) (void)cudaGetLastError();
}

td_status td_cudadev_event_record(int index, void *event, void *stream) {
  CUDA_TRY(cudaSetDevice(index), "cudaSetDevice", index);
  CUDA_TRY(cudaEventRecord((cudaEvent_t)event, (cudaStream_t)stream), "cudaEventRecord", index);
  return TD_OK;
}

td_status td_cudadev_event_sync(int index, void *event) {
  CUDA_TRY(cudaEventSynchronize((cudaEvent_t)event), "cudaEventSynchronize", index);
  return TD_OK;
}

td_status td_cudadev_event_query(int index, void *event, bool *done) {
  cudaError_t err = cudaEventQuery((cudaEvent_t)event);
  if (err == cudaSuccess || err == cudaErrorNotReady) {
    if (err == cudaErrorNotReady) (void)cudaGetLastError();
    *done = err == cudaSuccess;
    return TD_OK;
  }
  return cuda_fail(err, "cudaEventQuery", index);
}

td_status td_cudadev_stream_wait_event(int index, void *stream, void *event) {
  CUDA_TRY(cudaSetDevice(index), "cudaSetDevice", index);
  CUDA_TRY(cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event, 0), "cudaStreamWaitEvent", index);
  return TD_OK;
}
