/* Tandem devices: where tensors live (the CPU or a CUDA GPU), and the memory,
 * copies, streams and events that the engine, the collectives and the CUDA
 * kernels' launchers use, so that nothing above this layer calls the CUDA
 * runtime itself (src/device/; DESIGN.md §1: just above src/base).
 *
 * Two backends. The CPU backend is always built: its "device memory" is
 * ordinary 64-byte aligned host memory and its streams run every operation
 * at once, in call order, so code written against streams works unchanged on
 * the CPU. The CUDA backend (src/device/cuda/) is built when the Makefile
 * finds a CUDA toolkit ("tandem config: cuda=1"); without one, asking for a
 * CUDA device fails with a message saying so.
 *
 * Threads: every call may come from any thread. Calls that take a CUDA device
 * or a stream/event on one make that device current on the calling thread
 * (cudaSetDevice), as td_device_open does.
 *
 * Errors: every function returning td_status leaves its message in
 * td_last_error(): which device, which call, and what the CUDA runtime said.
 * Allocation sizes of 0 are allowed everywhere (a 1-byte allocation, so the
 * pointer is unique and non-NULL); copies of 0 bytes do nothing. */
#ifndef TANDEM_DEVICE_H
#define TANDEM_DEVICE_H

#include <stdbool.h>
#include <stddef.h>

#include "base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum td_device_kind { TD_DEVICE_CPU = 0, TD_DEVICE_CUDA = 1 } td_device_kind;

/* A device: its kind and, for CUDA, the index among the visible GPUs
 * (CUDA_VISIBLE_DEVICES applies). The CPU is {TD_DEVICE_CPU, 0}. */
typedef struct td_device {
  td_device_kind kind;
  int index;
} td_device;

/* "cpu", "cuda" (= "cuda:0") or "cuda:N" (N decimal, 0 <= N < 1024). Only
 * the spelling is checked; td_device_open says whether the device exists.
 * TD_ERR_INVALID_ARGUMENT, naming the accepted forms, for anything else. */
td_status td_device_parse(const char *spec, td_device *out);

/* "cpu" or "cuda:N" into buf (size >= 16 holds any device); returns buf. */
const char *td_device_name(td_device dev, char *buf, size_t size);

/* Whether this build has the CUDA backend (the toolkit was found at build
 * time, or this is the emulator tree). */
bool td_device_cuda_built(void);

/* Check that dev exists and make it current on this thread. The CPU always
 * exists. For CUDA, fails (TD_ERR_INVALID_USAGE) with a message that says
 * what to do: built without CUDA; no CUDA device (with the runtime's reason,
 * e.g. no driver); or "cuda:3 asked, 1 visible". */
td_status td_device_open(td_device dev);

/* How many devices of this kind can be opened: 1 for the CPU; the visible
 * GPUs for CUDA (0 when built without CUDA or when the runtime finds none). */
int td_device_count(td_device_kind kind);

/* Device memory, uninitialized. Free with td_device_free (accepts NULL). */
td_status td_device_alloc(td_device dev, size_t bytes, void **out);
void td_device_free(td_device dev, void *ptr);

/* Zero bytes of dev's memory. CUDA: enqueued on the device's legacy default
 * stream, so it is ordered before later work on every stream that
 * td_stream_create made (those are blocking streams); td_device_sync or a
 * blocking copy waits for it. */
td_status td_device_memset0(td_device dev, void *ptr, size_t bytes);

/* Copy bytes from src (on src_dev) to dst (on dst_dev); returns once dst
 * holds the data. Host to host is a memmove; anything touching a CUDA device
 * goes through cudaMemcpy, which also waits for the work the legacy default
 * stream orders before it. */
td_status td_device_copy(void *dst, td_device dst_dev, const void *src, td_device src_dev, size_t bytes);

/* Free and total bytes of a CUDA device's memory now (cudaMemGetInfo; free
 * excludes what any process holds on it, contexts included). The CPU is
 * TD_ERR_INVALID_ARGUMENT: host memory is td_mem_room_get's business. */
td_status td_device_mem_info(td_device dev, size_t *free_out, size_t *total_out);

/* Wait until all work queued on dev is done (cudaDeviceSynchronize). */
td_status td_device_sync(td_device dev);

/* Which device holds ptr: CUDA device memory (td_device_alloc's, or another
 * library's cudaMalloc, e.g. PyTorch's) gives that GPU; anything else, pinned
 * host memory included, gives the CPU. Never fails. In a CUDA build on a
 * machine with a GPU the first call creates the CUDA context of the current
 * device if none exists yet. */
td_device td_pointer_device(const void *ptr);

/* Page-locked host memory for fast, asynchronous copies to and from GPUs
 * (cudaHostAlloc). Where there is no GPU (or no CUDA backend) it is ordinary
 * aligned host memory, so staged code paths run everywhere; a GPU machine that
 * refuses to pin logs one warning and falls back the same way. Free with
 * td_host_free_pinned (accepts NULL). */
td_status td_host_alloc_pinned(size_t bytes, void **out);
void td_host_free_pinned(void *ptr);

/* Page-lock host memory allocated elsewhere (cudaHostRegister), e.g. a
 * td_mem_alloc buffer that other ranks also map (the staged device
 * collectives' chunks), so that copies between it and a GPU are
 * asynchronous DMA. Without a GPU (or a CUDA backend) there is nothing to
 * do: TD_OK. td_host_unregister undoes it before the memory is freed
 * (accepts NULL). */
td_status td_host_register(void *ptr, size_t bytes);
void td_host_unregister(void *ptr);

/* A queue of work on one device, executed in order. CUDA: a cudaStream_t
 * (blocking with respect to the legacy default stream). CPU: every operation
 * runs at once in the calling thread, so a CPU stream is always idle. */
typedef struct td_stream td_stream;
td_status td_stream_create(td_device dev, td_stream **out);
void td_stream_destroy(td_stream *s); /* waits for its work; accepts NULL */
td_device td_stream_device(const td_stream *s);

/* Queue a copy of bytes from src to dst on s; the direction comes from the
 * pointers (td_pointer_device). Host memory should be pinned for the copy to
 * be asynchronous; with pageable memory CUDA copies synchronously. A CPU
 * stream copies at once and refuses device memory. */
td_status td_copy_async(void *dst, const void *src, size_t bytes, td_stream *s);
/* Zero bytes of device memory on s (cudaMemsetAsync; CPU: memset). */
td_status td_memset0_async(void *ptr, size_t bytes, td_stream *s);

/* Wait for everything queued on s. Blocks the thread (no spinning: a
 * blocking-sync event), so that ranks sharing a core do not starve. */
td_status td_stream_sync(td_stream *s);

/* The backend's handle, for kernel launchers: the cudaStream_t (as void *)
 * for a CUDA stream, NULL for a CPU stream. */
void *td_stream_native(td_stream *s);

/* A marker in a stream: record it after some work, then wait for it from
 * the host (sync, query) or from another stream (td_stream_wait_event), as a
 * collective stream waits on the compute stream. Waits block, never spin.
 * CPU: recorded work is already done, so an event is always complete. */
typedef struct td_event td_event;
td_status td_event_create(td_device dev, td_event **out);
void td_event_destroy(td_event *ev); /* accepts NULL */
td_status td_event_record(td_event *ev, td_stream *s);
td_status td_event_sync(td_event *ev);
/* *done: whether the work before the last record has finished (true for an
 * event never recorded). */
td_status td_event_query(td_event *ev, bool *done);
/* Work queued on s after this call waits for ev's recorded work. */
td_status td_stream_wait_event(td_stream *s, td_event *ev);

#ifdef __cplusplus
}
#endif
#endif
