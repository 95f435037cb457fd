/* src/device: the CUDA backend's entry points, called by device.c only when
 * built with CUDA (TD_HAVE_CUDA; src/device/cuda/device_cuda.c, the one file
 * of this layer that includes cuda_runtime.h). Each takes and returns plain C
 * types, so that device.c compiles without the toolkit. Preconditions (dev is
 * a CUDA device with index >= 0, sizes non-zero where it matters, non-NULL
 * pointers) are checked by device.c; errors go to td_last_error. */
#ifndef TD_DEVICE_CUDA_H
#define TD_DEVICE_CUDA_H

#include <stdbool.h>
#include <stddef.h>

#include "tandem/device.h"

/* Visible GPUs; on failure 0, with the runtime's reason in why (if given). */
int td_cudadev_count(char *why, size_t why_size);
td_status td_cudadev_open(int index);
td_status td_cudadev_alloc(int index, size_t bytes, void **out);
void td_cudadev_free(int index, void *ptr);
td_status td_cudadev_memset0(int index, void *ptr, size_t bytes);
/* dst_index/src_index: -1 for host memory */
td_status td_cudadev_copy(void *dst, int dst_index, const void *src, int src_index, size_t bytes);
td_status td_cudadev_sync(int index);
td_status td_cudadev_mem_info(int index, size_t *free_out, size_t *total_out);
/* the CUDA device holding ptr, or -1 for host memory (pinned or not) */
int td_cudadev_pointer_index(const void *ptr);
/* cudaHostAlloc, or NULL without a message when it fails */
void *td_cudadev_host_alloc(size_t bytes);
void td_cudadev_host_free(void *ptr);
/* cudaHostRegister / cudaHostUnregister (errors of the latter are dropped) */
td_status td_cudadev_host_register(void *ptr, size_t bytes);
void td_cudadev_host_unregister(void *ptr);

/* Streams: *native receives the cudaStream_t, *blocker an event with
 * cudaEventBlockingSync that td_cudadev_stream_sync records and waits on. */
td_status td_cudadev_stream_create(int index, void **native, void **blocker);
void td_cudadev_stream_destroy(int index, void *native, void *blocker);
td_status td_cudadev_copy_async(void *dst, const void *src, size_t bytes, int index, void *native);
td_status td_cudadev_memset0_async(void *ptr, size_t bytes, int index, void *native);
td_status td_cudadev_stream_sync(int index, void *native, void *blocker);

td_status td_cudadev_event_create(int index, void **native);
void td_cudadev_event_destroy(int index, void *native);
td_status td_cudadev_event_record(int index, void *event, void *stream);
td_status td_cudadev_event_sync(int index, void *event);
td_status td_cudadev_event_query(int index, void *event, bool *done);
td_status td_cudadev_stream_wait_event(int index, void *stream, void *event);

#endif
