/* Asynchronous file I/O for NVMe offload (ZeRO-Infinity's aio, DeepSpeed's
 * `aio` config block): reads and writes of large buffers at file offsets,
 * submitted without blocking and waited for later, so that the optimizer's
 * tiles and the parameters of the next layer travel while the current one
 * computes.
 *
 * Two engines behind one interface:
 *   uring    io_uring (Debian's liburing): one ring per context with
 *            queue_depth entries; a driver thread reaps completions and
 *            refills the ring, so requests progress while the caller
 *            computes;
 *   threads  thread_count threads doing pread/pwrite, used where io_uring
 *            is refused (io_uring_queue_init fails: seccomp, an old kernel,
 *            io_uring_disabled) or forced with TANDEM_AIO=threads.
 * TANDEM_AIO=uring|threads picks one (uring refused is then an error);
 * unset, io_uring is tried first. td_aio_engine_name says which runs.
 *
 * Files are opened with O_DIRECT (no page cache: the data is streamed once
 * per step and would only evict everything else) and a second, buffered
 * descriptor. A request is cut into pieces of at most block_size bytes; a
 * piece whose memory address, file offset and length are all multiples of
 * 4096 goes through O_DIRECT, any other (a head or tail not on a block
 * boundary) through the buffered descriptor. Linux keeps the two coherent
 * (a direct read writes back dirty cached pages of its range first; a
 * direct write invalidates them). A filesystem refusing O_DIRECT (tmpfs:
 * EINVAL) gets buffered I/O for everything, said once in the log.
 *
 * Errors (a short read past the end of a file, EIO, ENOSPC) are kept per
 * request and returned by td_aio_wait with the file, the offset and what to
 * do. Internal to src/train. */
#ifndef TD_TRAIN_OFFLOAD_AIO_H
#define TD_TRAIN_OFFLOAD_AIO_H

#include "base/base.h"

#define TD_AIO_ALIGN 4096 /* O_DIRECT alignment of memory, offsets and lengths */

typedef struct td_aio_config {
  size_t block_size; /* bytes per submitted piece (DeepSpeed's aio.block_size, default 1 MiB) */
  int queue_depth;   /* pieces in flight at most (default 8) */
  int thread_count;  /* threads of the pread/pwrite engine (default 1) */
} td_aio_config;

typedef struct td_aio td_aio;           /* an engine with its queue */
typedef struct td_aio_file td_aio_file; /* an open file */
typedef struct td_aio_req td_aio_req;   /* one submitted read or write */

/* I/O counters of a context, for the step summary. Seconds are wall time
 * measured by the caller's thread: wait_s is time blocked in td_aio_wait. */
typedef struct td_aio_stats {
  uint64_t bytes_read, bytes_written;
  uint64_t n_reads, n_writes;       /* requests */
  uint64_t direct_bytes;            /* of both, through O_DIRECT */
  double wait_s;                    /* callers blocked in td_aio_wait */
  double busy_s;                    /* time with at least one request outstanding (the disk's busy time) */
} td_aio_stats;

/* Start an engine (TANDEM_AIO decides which; see above). `who` names the
 * owner in messages and the one log line ("rank 1 offload"). */
td_status td_aio_create(const td_aio_config *cfg, const char *who, td_aio **out);
/* Waits for every request still in flight, stops the threads. NULL-safe. */
void td_aio_destroy(td_aio *aio);
const char *td_aio_engine_name(const td_aio *aio); /* "io_uring" or "threads" */
void td_aio_get_stats(const td_aio *aio, td_aio_stats *out);

/* Open (create: truncate to zero first) a file for both directions. */
td_status td_aio_open(td_aio *aio, const char *path, bool create, td_aio_file **out);
void td_aio_close(td_aio_file *f); /* NULL-safe; requests on it must be waited for */
bool td_aio_file_direct(const td_aio_file *f); /* O_DIRECT accepted for this file */
const char *td_aio_file_path(const td_aio_file *f);

/* Submit a read of len bytes at file offset `offset` into buf (a write of
 * buf). Non-blocking (it may wait for room in the engine's queue); buf must
 * stay valid until td_aio_wait. Any alignment works; aligned buffers,
 * offsets and lengths go through O_DIRECT. *req_out is owned by the caller
 * until it passes it to td_aio_wait. */
td_status td_aio_read(td_aio *aio, td_aio_file *f, void *buf, size_t len, uint64_t offset, td_aio_req **req_out);
td_status td_aio_write(td_aio *aio, td_aio_file *f, const void *buf, size_t len, uint64_t offset,
                       td_aio_req **req_out);
/* Block until the request is done; frees it. NULL is a no-op (TD_OK). */
td_status td_aio_wait(td_aio *aio, td_aio_req *req);

/* Aligned allocation for O_DIRECT buffers (rounded up to TD_AIO_ALIGN). */
void *td_aio_alloc(size_t bytes);
void td_aio_free(void *p);

#endif
