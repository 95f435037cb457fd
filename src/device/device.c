/* src/device/device.c: device names, argument checks, the CPU backend, and
 * the dispatch to the CUDA backend (src/device/cuda/device_cuda.c) when the
 * build has one (TD_HAVE_CUDA). Everything the public header promises about
 * sizes of 0, NULL and error messages is decided here, once for both
 * backends; the CUDA file only wraps runtime calls.
 *
 * Pinned host memory carries a 64-byte header in front of the pointer it
 * returns, saying which allocator gave it (cudaHostAlloc or td_alloc), so
 * that td_host_free_pinned frees it the right way without a table. */
#include "base/base.h"
#include "tandem/device.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TD_HAVE_CUDA
#include "device/device_cuda.h"
#endif

struct td_stream {
  td_device dev;
  void *native;  /* cudaStream_t; NULL on the CPU */
  void *blocker; /* blocking-sync event for td_stream_sync; NULL on the CPU */
};

struct td_event {
  td_device dev;
  void *native; /* cudaEvent_t; NULL on the CPU */
};

#define DEVICE_INDEX_MAX 1024

#ifndef TD_HAVE_CUDA
/* Reached only for a CUDA device that check_device would have refused (a
 * stream or event cannot be made on one in this build): a bug if it is. */
#define NO_CUDA_BACKEND() td_error(TD_ERR_INTERNAL, "%s: a CUDA device in a build without CUDA", __func__)
#endif

td_status td_device_parse(const char *spec, td_device *out) {
  if (!out) return td_error(TD_ERR_INVALID_ARGUMENT, "td_device_parse: out is NULL");
  if (!spec) return td_error(TD_ERR_INVALID_ARGUMENT, "td_device_parse: no device given: use cpu, cuda or cuda:N");
  if (strcmp(spec, "cpu") == 0) {
    *out = (td_device){TD_DEVICE_CPU, 0};
    return TD_OK;
  }
  if (strcmp(spec, "cuda") == 0) {
    *out = (td_device){TD_DEVICE_CUDA, 0};
    return TD_OK;
  }
  if (strncmp(spec, "cuda:", 5) == 0) {
    /* digits only: strtol would accept " 1", "+1" and "0x1" */
    const char *p = spec + 5;
    long index = 0;
    if (*p == '\0') goto bad;
    for (; *p; p++) {
      if (*p < '0' || *p > '9') goto bad;
      index = index * 10 + (*p - '0');
      if (index >= DEVICE_INDEX_MAX) goto bad;
    }
    *out = (td_device){TD_DEVICE_CUDA, (int)index};
    return TD_OK;
  }
bad:
  return td_error(TD_ERR_INVALID_ARGUMENT, "device \"%s\" not understood: use cpu, cuda or cuda:N (N from 0 to %d)",
                  spec, DEVICE_INDEX_MAX - 1);
}

const char *td_device_name(td_device dev, char *buf, size_t size) {
  if (!buf || size == 0) return "";
  if (dev.kind == TD_DEVICE_CPU)
    snprintf(buf, size, "cpu");
  else if (dev.kind == TD_DEVICE_CUDA)
    snprintf(buf, size, "cuda:%d", dev.index);
  else
    snprintf(buf, size, "device-kind-%d", (int)dev.kind);
  return buf;
}

bool td_device_cuda_built(void) {
#ifdef TD_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

/* The kind and index are ones this library can address (not whether the
 * device exists: td_device_open checks that). */
static td_status check_device(td_device dev, const char *what) {
  if (dev.kind == TD_DEVICE_CPU) return TD_OK;
  if (dev.kind == TD_DEVICE_CUDA && dev.index >= 0 && dev.index < DEVICE_INDEX_MAX) {
#ifdef TD_HAVE_CUDA
    return TD_OK;
#else
    return td_error(TD_ERR_INVALID_USAGE,
                    "%s on cuda:%d: this Tandem was built without CUDA (no CUDA toolkit was found when it was "
                    "compiled): use the cpu device, or rebuild where nvcc is found (scripts/install-cuda, "
                    "or CUDA_HOME=<toolkit>; make prints \"tandem config: cuda=1\")",
                    what, dev.index);
#endif
  }
  return td_error(TD_ERR_INVALID_ARGUMENT, "%s: no such device (kind %d, index %d)", what, (int)dev.kind, dev.index);
}

int td_device_count(td_device_kind kind) {
  if (kind == TD_DEVICE_CPU) return 1;
#ifdef TD_HAVE_CUDA
  if (kind == TD_DEVICE_CUDA) return td_cudadev_count(NULL, 0);
#endif
  return 0;
}

td_status td_device_open(td_device dev) {
  TD_CHECK(check_device(dev, "td_device_open"));
  if (dev.kind == TD_DEVICE_CPU) return TD_OK;
#ifdef TD_HAVE_CUDA
  char why[256] = "";
  int count = td_cudadev_count(why, sizeof why);
  const char *visible = getenv("CUDA_VISIBLE_DEVICES");
  if (count <= 0)
    return td_error(TD_ERR_INVALID_USAGE,
                    "cuda:%d asked, but there is no CUDA device: %s%s%s: run on a machine with an NVIDIA GPU and "
                    "its driver, or use the cpu device",
                    dev.index, why[0] ? why : "cudaGetDeviceCount found none",
                    visible ? "; CUDA_VISIBLE_DEVICES=" : "", visible ? visible : "");
  if (dev.index >= count)
    return td_error(TD_ERR_INVALID_USAGE, "cuda:%d asked, %d visible (cuda:0 to cuda:%d)%s%s", dev.index, count,
                    count - 1, visible ? "; CUDA_VISIBLE_DEVICES=" : "", visible ? visible : "");
  return td_cudadev_open(dev.index);
#else
  return NO_CUDA_BACKEND();
#endif
}

td_status td_device_alloc(td_device dev, size_t bytes, void **out) {
  if (!out) return td_error(TD_ERR_INVALID_ARGUMENT, "td_device_alloc: out is NULL");
  *out = NULL;
  TD_CHECK(check_device(dev, "td_device_alloc"));
  if (bytes == 0) bytes = 1;
  if (dev.kind == TD_DEVICE_CPU) {
    *out = td_alloc(bytes);
    return *out ? TD_OK : td_error(TD_ERR_SYSTEM, "td_device_alloc: out of host memory (%zu bytes)", bytes);
  }
#ifdef TD_HAVE_CUDA
  return td_cudadev_alloc(dev.index, bytes, out);
#else
  return NO_CUDA_BACKEND();
#endif
}

void td_device_free(td_device dev, void *ptr) {
  if (!ptr) return;
  if (dev.kind == TD_DEVICE_CPU) {
    td_free(ptr);
    return;
  }
#ifdef TD_HAVE_CUDA
  if (dev.kind == TD_DEVICE_CUDA) td_cudadev_free(dev.index, ptr);
#endif
}

td_status td_device_memset0(td_device dev, void *ptr, size_t bytes) {
  TD_CHECK(check_device(dev, "td_device_memset0"));
  if (bytes == 0) return TD_OK;
  if (!ptr) return td_error(TD_ERR_INVALID_ARGUMENT, "td_device_memset0: ptr is NULL (%zu bytes)", bytes);
  if (dev.kind == TD_DEVICE_CPU) {
    memset(ptr, 0, bytes);
    return TD_OK;
  }
#ifdef TD_HAVE_CUDA
  return td_cudadev_memset0(dev.index, ptr, bytes);
#else
  return NO_CUDA_BACKEND();
#endif
}

td_status td_device_copy(void *dst, td_device dst_dev, const void *src, td_device src_dev, size_t bytes) {
  TD_CHECK(check_device(dst_dev, "td_device_copy (destination)"));
  TD_CHECK(check_device(src_dev, "td_device_copy (source)"));
  if (bytes == 0) return TD_OK;
  if (!dst || !src)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_device_copy: %s is NULL (%zu bytes)", dst ? "src" : "dst", bytes);
  if (dst_dev.kind == TD_DEVICE_CPU && src_dev.kind == TD_DEVICE_CPU) {
    memmove(dst, src, bytes);
    return TD_OK;
  }
#ifdef TD_HAVE_CUDA
  return td_cudadev_copy(dst, dst_dev.kind == TD_DEVICE_CUDA ? dst_dev.index : -1, src,
                         src_dev.kind == TD_DEVICE_CUDA ? src_dev.index : -1, bytes);
#else
  return NO_CUDA_BACKEND();
#endif
}

td_status td_device_mem_info(td_device dev, size_t *free_out, size_t *total_out) {
  if (!free_out || !total_out) return td_error(TD_ERR_INVALID_ARGUMENT, "td_device_mem_info: NULL output");
  *free_out = *total_out = 0;
  TD_CHECK(check_device(dev, "td_device_mem_info"));
  if (dev.kind == TD_DEVICE_CPU)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_device_mem_info: the CPU has no device memory of its own");
#ifdef TD_HAVE_CUDA
  return td_cudadev_mem_info(dev.index, free_out, total_out);
#else
  return NO_CUDA_BACKEND();
#endif
}

td_status td_device_sync(td_device dev) {
  TD_CHECK(check_device(dev, "td_device_sync"));
  if (dev.kind == TD_DEVICE_CPU) return TD_OK;
#ifdef TD_HAVE_CUDA
  return td_cudadev_sync(dev.index);
#else
  return NO_CUDA_BACKEND();
#endif
}

#if defined(TD_HAVE_CUDA) && !defined(TD_CUDA_EMU)
/* Whether this process sees a CUDA device, asked once. Without one (CI, a
 * CPU host running a CUDA build) every pointer is host memory, and the
 * check that every collective makes on its buffers must cost nothing:
 * cudaPointerGetAttributes took 0.55 us a call without a driver, against a
 * 1.3 us 4 KiB shm allreduce, and its first call starts the runtime (page
 * faults that test_shm_scale's first-touch bound counts). The emulator
 * tree asks every time: its tests change the number of devices it shows. */
static int cuda_present(void) {
  static _Atomic int present = -1;
  int p = atomic_load_explicit(&present, memory_order_acquire);
  if (p < 0) {
    p = td_cudadev_count(NULL, 0) > 0;
    atomic_store_explicit(&present, p, memory_order_release);
  }
  return p;
}
#else
static int cuda_present(void) { return 1; }
#endif

td_device td_pointer_device(const void *ptr) {
  td_device cpu = {TD_DEVICE_CPU, 0};
#ifdef TD_HAVE_CUDA
  /* (called with NULL by td_comm_init: the probe happens there, not in
   * the first collective) */
  if (cuda_present() && ptr) {
    int index = td_cudadev_pointer_index(ptr);
    if (index >= 0) return (td_device){TD_DEVICE_CUDA, index};
  }
#else
  (void)ptr;
#endif
  return cpu;
}

/* ---- pinned host memory ---- */

#define PINNED_HEADER 64 /* keeps the 64-byte alignment of both allocators */
#define PINNED_MAGIC_CUDA 0x54444350494e4e31ull /* "TDCPINN1" */
#define PINNED_MAGIC_HOST 0x54444850494e4e31ull /* "TDHPINN1" */

td_status td_host_alloc_pinned(size_t bytes, void **out) {
  if (!out) return td_error(TD_ERR_INVALID_ARGUMENT, "td_host_alloc_pinned: out is NULL");
  *out = NULL;
  if (bytes > SIZE_MAX - PINNED_HEADER)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_host_alloc_pinned: %zu bytes is too large", bytes);
  size_t total = PINNED_HEADER + (bytes ? bytes : 1);
  uint64_t magic = PINNED_MAGIC_HOST;
  char *base = NULL;
#ifdef TD_HAVE_CUDA
  if (td_cudadev_count(NULL, 0) > 0) {
    base = td_cudadev_host_alloc(total);
    if (base) {
      magic = PINNED_MAGIC_CUDA;
    } else {
      static atomic_int warned;
      if (atomic_exchange(&warned, 1) == 0)
        TD_WARN("td_host_alloc_pinned: cudaHostAlloc(%zu bytes) failed; using pageable memory (copies to and "
                "from the GPU will not overlap). Raise the locked-memory limit (ulimit -l) or use smaller buffers",
                total);
    }
  }
#endif
  if (!base) {
    base = td_alloc(total);
    if (!base) return td_error(TD_ERR_SYSTEM, "td_host_alloc_pinned: out of host memory (%zu bytes)", bytes);
  }
  memcpy(base, &magic, sizeof magic);
  *out = base + PINNED_HEADER;
  return TD_OK;
}

void td_host_free_pinned(void *ptr) {
  if (!ptr) return;
  char *base = (char *)ptr - PINNED_HEADER;
  uint64_t magic;
  memcpy(&magic, base, sizeof magic);
  if (magic == PINNED_MAGIC_HOST) {
    td_free(base);
    return;
  }
#ifdef TD_HAVE_CUDA
  if (magic == PINNED_MAGIC_CUDA) {
    td_cudadev_host_free(base);
    return;
  }
#endif
  /* Not ours: leaking is safer than freeing with the wrong allocator. */
  TD_WARN("td_host_free_pinned(%p): not memory from td_host_alloc_pinned; not freed", ptr);
}

td_status td_host_register(void *ptr, size_t bytes) {
  if (!ptr || !bytes) return TD_OK;
#ifdef TD_HAVE_CUDA
  if (td_cudadev_count(NULL, 0) > 0) return td_cudadev_host_register(ptr, bytes);
#endif
  return TD_OK;
}

void td_host_unregister(void *ptr) {
#ifdef TD_HAVE_CUDA
  if (ptr && td_cudadev_count(NULL, 0) > 0) td_cudadev_host_unregister(ptr);
#else
  (void)ptr;
#endif
}

/* ---- streams and events ---- */

td_status td_stream_create(td_device dev, td_stream **out) {
  if (!out) return td_error(TD_ERR_INVALID_ARGUMENT, "td_stream_create: out is NULL");
  *out = NULL;
  TD_CHECK(check_device(dev, "td_stream_create"));
  td_stream *s = calloc(1, sizeof *s);
  if (!s) return td_error(TD_ERR_SYSTEM, "td_stream_create: out of memory");
  s->dev = dev;
#ifdef TD_HAVE_CUDA
  if (dev.kind == TD_DEVICE_CUDA) {
    td_status st = td_cudadev_stream_create(dev.index, &s->native, &s->blocker);
    if (st != TD_OK) {
      free(s);
      return st;
    }
  }
#endif
  *out = s;
  return TD_OK;
}

void td_stream_destroy(td_stream *s) {
  if (!s) return;
#ifdef TD_HAVE_CUDA
  if (s->dev.kind == TD_DEVICE_CUDA) td_cudadev_stream_destroy(s->dev.index, s->native, s->blocker);
#endif
  free(s);
}

td_device td_stream_device(const td_stream *s) {
  return s ? s->dev : (td_device){TD_DEVICE_CPU, 0};
}

void *td_stream_native(td_stream *s) { return s ? s->native : NULL; }

/* A CPU stream can only move host memory. */
static td_status check_host_pointer(const void *ptr, const char *what, const char *role) {
  td_device d = td_pointer_device(ptr);
  if (d.kind == TD_DEVICE_CPU) return TD_OK;
  return td_error(TD_ERR_INVALID_ARGUMENT, "%s: %s %p is memory of cuda:%d, but the stream is a cpu stream: "
                  "create the stream on that device", what, role, ptr, d.index);
}

td_status td_copy_async(void *dst, const void *src, size_t bytes, td_stream *s) {
  if (!s) return td_error(TD_ERR_INVALID_ARGUMENT, "td_copy_async: stream is NULL");
  if (bytes == 0) return TD_OK;
  if (!dst || !src)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_copy_async: %s is NULL (%zu bytes)", dst ? "src" : "dst", bytes);
  if (s->dev.kind == TD_DEVICE_CPU) {
    TD_CHECK(check_host_pointer(dst, "td_copy_async", "dst"));
    TD_CHECK(check_host_pointer(src, "td_copy_async", "src"));
    memmove(dst, src, bytes);
    return TD_OK;
  }
#ifdef TD_HAVE_CUDA
  return td_cudadev_copy_async(dst, src, bytes, s->dev.index, s->native);
#else
  return NO_CUDA_BACKEND();
#endif
}

td_status td_memset0_async(void *ptr, size_t bytes, td_stream *s) {
  if (!s) return td_error(TD_ERR_INVALID_ARGUMENT, "td_memset0_async: stream is NULL");
  if (bytes == 0) return TD_OK;
  if (!ptr) return td_error(TD_ERR_INVALID_ARGUMENT, "td_memset0_async: ptr is NULL (%zu bytes)", bytes);
  if (s->dev.kind == TD_DEVICE_CPU) {
    TD_CHECK(check_host_pointer(ptr, "td_memset0_async", "ptr"));
    memset(ptr, 0, bytes);
    return TD_OK;
  }
#ifdef TD_HAVE_CUDA
  return td_cudadev_memset0_async(ptr, bytes, s->dev.index, s->native);
#else
  return NO_CUDA_BACKEND();
#endif
}

td_status td_stream_sync(td_stream *s) {
  if (!s) return td_error(TD_ERR_INVALID_ARGUMENT, "td_stream_sync: stream is NULL");
  if (s->dev.kind == TD_DEVICE_CPU) return TD_OK;
#ifdef TD_HAVE_CUDA
  return td_cudadev_stream_sync(s->dev.index, s->native, s->blocker);
#else
  return NO_CUDA_BACKEND();
#endif
}

td_status td_event_create(td_device dev, td_event **out) {
  if (!out) return td_error(TD_ERR_INVALID_ARGUMENT, "td_event_create: out is NULL");
  *out = NULL;
  TD_CHECK(check_device(dev, "td_event_create"));
  td_event *ev = calloc(1, sizeof *ev);
  if (!ev) return td_error(TD_ERR_SYSTEM, "td_event_create: out of memory");
  ev->dev = dev;
#ifdef TD_HAVE_CUDA
  if (dev.kind == TD_DEVICE_CUDA) {
    td_status st = td_cudadev_event_create(dev.index, &ev->native);
    if (st != TD_OK) {
      free(ev);
      return st;
    }
  }
#endif
  *out = ev;
  return TD_OK;
}

void td_event_destroy(td_event *ev) {
  if (!ev) return;
#ifdef TD_HAVE_CUDA
  if (ev->dev.kind == TD_DEVICE_CUDA) td_cudadev_event_destroy(ev->dev.index, ev->native);
#endif
  free(ev);
}

/* An event and a stream must be on the same device. */
static td_status check_same_device(const td_event *ev, const td_stream *s, const char *what) {
  if (!ev || !s) return td_error(TD_ERR_INVALID_ARGUMENT, "%s: %s is NULL", what, ev ? "stream" : "event");
  if (ev->dev.kind == s->dev.kind && ev->dev.index == s->dev.index) return TD_OK;
  char a[16], b[16];
  return td_error(TD_ERR_INVALID_ARGUMENT, "%s: the event is on %s, the stream on %s", what,
                  td_device_name(ev->dev, a, sizeof a), td_device_name(s->dev, b, sizeof b));
}

td_status td_event_record(td_event *ev, td_stream *s) {
  TD_CHECK(check_same_device(ev, s, "td_event_record"));
  if (ev->dev.kind == TD_DEVICE_CPU) return TD_OK;
#ifdef TD_HAVE_CUDA
  return td_cudadev_event_record(ev->dev.index, ev->native, s->native);
#else
  return NO_CUDA_BACKEND();
#endif
}

td_status td_event_sync(td_event *ev) {
  if (!ev) return td_error(TD_ERR_INVALID_ARGUMENT, "td_event_sync: event is NULL");
  if (ev->dev.kind == TD_DEVICE_CPU) return TD_OK;
#ifdef TD_HAVE_CUDA
  return td_cudadev_event_sync(ev->dev.index, ev->native);
#else
  return NO_CUDA_BACKEND();
#endif
}

td_status td_event_query(td_event *ev, bool *done) {
  if (!ev || !done) return td_error(TD_ERR_INVALID_ARGUMENT, "td_event_query: %s is NULL", ev ? "done" : "event");
  if (ev->dev.kind == TD_DEVICE_CPU) {
    *done = true;
    return TD_OK;
  }
#ifdef TD_HAVE_CUDA
  return td_cudadev_event_query(ev->dev.index, ev->native, done);
#else
  return NO_CUDA_BACKEND();
#endif
}

td_status td_stream_wait_event(td_stream *s, td_event *ev) {
  TD_CHECK(check_same_device(ev, s, "td_stream_wait_event"));
  if (s->dev.kind == TD_DEVICE_CPU) return TD_OK;
#ifdef TD_HAVE_CUDA
  return td_cudadev_stream_wait_event(s->dev.index, s->native, ev->native);
#else
  return NO_CUDA_BACKEND();
#endif
}
