/* Asynchronous file I/O: io_uring with a pread/pwrite thread-pool fallback
 * (aio.h says what and why).
 *
 * A request is cut into pieces (at most block_size bytes each; direct or
 * buffered, see aio.h) that go into one FIFO queue:
 *
 *   td_aio_read/write --> [queue of pieces] --> uring: driver thread keeps
 *                                                 <= queue_depth in the ring
 *                                           --> threads: each worker pops one
 *                                                 and preads/pwrites it
 *
 * A piece completes its request's count; the last one wakes td_aio_wait.
 * Only the driver thread touches the ring (submission and completion), so
 * the ring needs no lock of its own; the queue and counts are under one
 * mutex. A piece the kernel completes only partly (a signal, a page-cache
 * short transfer) is requeued for the rest; zero bytes read means the file
 * ends early, which is an error. Waiting blocks on condition variables and
 * in io_uring_wait_cqe, never spins. */

#include "train/offload/aio.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef TD_HAVE_URING
#include <liburing.h>
#endif

typedef struct aio_piece {
  struct aio_piece *next;
  td_aio_req *req;
  int fd;
  bool direct;
  char *buf;
  size_t len, done;
  uint64_t offset;
} aio_piece;

struct td_aio_file {
  int fd_direct; /* -1: O_DIRECT refused, everything buffered */
  int fd_buffered;
  char path[512];
};

struct td_aio_req {
  td_aio_file *file;
  bool write;
  size_t len;
  uint64_t offset;
  int n_pieces, pieces_left;
  td_status status;
  char message[1400];
  aio_piece *pieces;
};

enum { ENGINE_URING, ENGINE_THREADS };

struct td_aio {
  td_aio_config cfg;
  char who[64];
  int engine;
  pthread_mutex_t mu;
  pthread_cond_t work_cv; /* pieces queued (or stop) */
  pthread_cond_t done_cv; /* a request completed */
  aio_piece *head, *tail;
  int inflight;     /* uring: pieces in the ring */
  int outstanding;  /* requests submitted and not completed */
  double busy_since;
  bool stop;
  bool warned_buffered;
  bool warned_ring;
  pthread_t *threads;
  int n_threads;
#ifdef TD_HAVE_URING
  struct io_uring ring;
  bool ring_ok;
#endif
  td_aio_stats stats;
};

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

void *td_aio_alloc(size_t bytes) {
  void *p = NULL;
  if (posix_memalign(&p, TD_AIO_ALIGN, round_up(bytes ? bytes : 1, TD_AIO_ALIGN)) != 0) return NULL;
  return p;
}
void td_aio_free(void *p) { free(p); }

/* ---- completion (under mu) ---- */

static void piece_fail(td_aio *aio, aio_piece *p, int err) {
  td_aio_req *r = p->req;
  if (r->status != TD_OK) return;
  uint64_t at = p->offset + p->done;
  const char *what = r->write ? "writing" : "reading";
  const char *todo = "check the disk (dmesg) and the file system under nvme_path";
  if (err == ENOSPC || err == EDQUOT)
    todo = "the disk is full: free space under nvme_path or point nvme_path at a larger disk "
           "(train-gpt --estimate-memory says how many bytes the offload needs)";
  else if (err == 0)
    todo = r->write ? "the device accepted no bytes: check the file system under nvme_path"
                    : "the file ends early: was it truncated or removed while the job ran?";
  r->status = TD_ERR_IO;
  snprintf(r->message, sizeof r->message, "%s: %s %zu bytes at offset %llu of %s failed: %s; %s", aio->who, what,
           p->len - p->done, (unsigned long long)at, r->file->path, err == 0 ? (r->write ? "short write" : "short read (end of file)") : strerror(err),
           todo);
}

static void piece_done(td_aio *aio, aio_piece *p) {
  td_aio_req *r = p->req;
  if (p->direct) aio->stats.direct_bytes += p->len;
  if (--r->pieces_left == 0) {
    if (--aio->outstanding == 0) aio->stats.busy_s += td_now() - aio->busy_since;
    pthread_cond_broadcast(&aio->done_cv);
  }
}

/* Account `res` (bytes moved, or -errno) for piece p; requeue what is left. */
static void piece_result(td_aio *aio, aio_piece *p, ssize_t res) {
  if (res == -EINTR || res == -EAGAIN) {
    res = 0; /* requeued below, unchanged */
  } else if (res < 0) {
    piece_fail(aio, p, (int)-res);
    piece_done(aio, p);
    return;
  } else if (res == 0) { /* a read past the end of the file (a write never moves 0 bytes without an error) */
    piece_fail(aio, p, 0);
    piece_done(aio, p);
    return;
  }
  p->done += (size_t)res;
  if (p->done >= p->len) {
    piece_done(aio, p);
    return;
  }
  /* the rest may no longer be aligned: finish it buffered */
  if (p->direct && ((p->done % TD_AIO_ALIGN) != 0)) p->fd = p->req->file->fd_buffered;
  p->next = aio->head; /* first in line: it is the oldest */
  aio->head = p;
  if (!aio->tail) aio->tail = p;
  pthread_cond_signal(&aio->work_cv);
}

static aio_piece *pop(td_aio *aio) {
  aio_piece *p = aio->head;
  if (p) {
    aio->head = p->next;
    if (!aio->head) aio->tail = NULL;
    p->next = NULL;
  }
  return p;
}

/* ---- the thread pool ---- */

static void *worker_main(void *arg) {
  td_aio *aio = arg;
  pthread_mutex_lock(&aio->mu);
  for (;;) {
    while (!aio->head && !aio->stop) pthread_cond_wait(&aio->work_cv, &aio->mu);
    aio_piece *p = pop(aio);
    if (!p) break; /* stop and nothing left */
    pthread_mutex_unlock(&aio->mu);
    ssize_t res = p->req->write ? pwrite(p->fd, p->buf + p->done, p->len - p->done, (off_t)(p->offset + p->done))
                                : pread(p->fd, p->buf + p->done, p->len - p->done, (off_t)(p->offset + p->done));
    if (res < 0) res = -errno;
    pthread_mutex_lock(&aio->mu);
    piece_result(aio, p, res);
  }
  pthread_mutex_unlock(&aio->mu);
  return NULL;
}

/* ---- io_uring ---- */

#ifdef TD_HAVE_URING
static void *driver_main(void *arg) {
  td_aio *aio = arg;
  pthread_mutex_lock(&aio->mu);
  for (;;) {

    while (aio->head && aio->inflight < aio->cfg.queue_depth) {
      struct io_uring_sqe *sqe = io_uring_get_sqe(&aio->ring);
      if (!sqe) break;
      aio_piece *p = pop(aio);
      if (p->req->write)
        io_uring_prep_write(sqe, p->fd, p->buf + p->done, (unsigned)(p->len - p->done), p->offset + p->done);
      else
        io_uring_prep_read(sqe, p->fd, p->buf + p->done, (unsigned)(p->len - p->done), p->offset + p->done);
      io_uring_sqe_set_data(sqe, p);
      aio->inflight++;

    }

    if (aio->inflight == 0) {
      if (aio->stop && !aio->head) break;
      pthread_cond_wait(&aio->work_cv, &aio->mu);
      continue;
    }
    pthread_mutex_unlock(&aio->mu);
    /* submits what was prepared (also entries a failed call left in the
     * ring) and blocks for at least one completion */
    int rc = io_uring_submit_and_wait(&aio->ring, 1);
    pthread_mutex_lock(&aio->mu);
    if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY && !aio->warned_ring) {
      aio->warned_ring = true;
      TD_WARN("%s: io_uring_submit_and_wait failed: %s (retrying; TANDEM_AIO=threads avoids io_uring)", aio->who,
              strerror(-rc));
    }
    struct io_uring_cqe *cqe = NULL;
    /* reap everything ready */
    unsigned head, seen = 0;
    io_uring_for_each_cqe(&aio->ring, head, cqe) {
      aio_piece *p = io_uring_cqe_get_data(cqe);
      aio->inflight--;
      piece_result(aio, p, cqe->res);
      seen++;
    }
    io_uring_cq_advance(&aio->ring, seen);
  }
  pthread_mutex_unlock(&aio->mu);
  return NULL;
}
#endif

/* ---- context ---- */

td_status td_aio_create(const td_aio_config *cfg_in, const char *who, td_aio **out) {
  *out = NULL;
  td_aio_config cfg = *cfg_in;
  if (cfg.block_size == 0) cfg.block_size = 1 << 20;
  cfg.block_size = round_up(cfg.block_size, TD_AIO_ALIGN);
  if (cfg.queue_depth <= 0) cfg.queue_depth = 8;
  if (cfg.thread_count <= 0) cfg.thread_count = 1;
  const char *want = td_env_str("TANDEM_AIO", "");
  if (*want && strcmp(want, "uring") != 0 && strcmp(want, "threads") != 0)
    return td_error(TD_ERR_INVALID_ARGUMENT, "TANDEM_AIO=\"%s\": use \"uring\" (io_uring), \"threads\" (pread/pwrite "
                    "thread pool) or leave it unset (io_uring, else threads)", want);
  td_aio *aio = calloc(1, sizeof *aio);
  if (!aio) return td_error(TD_ERR_SYSTEM, "%s: out of memory for the I/O engine", who);
  aio->cfg = cfg;
  td_strlcpy(aio->who, who, sizeof aio->who);
  pthread_mutex_init(&aio->mu, NULL);
  pthread_cond_init(&aio->work_cv, NULL);
  pthread_cond_init(&aio->done_cv, NULL);
  aio->engine = ENGINE_THREADS;
  char why[160] = "";
#ifdef TD_HAVE_URING
  if (strcmp(want, "threads") != 0) {
    int rc = io_uring_queue_init((unsigned)cfg.queue_depth, &aio->ring, 0);
    if (rc == 0) {
      aio->ring_ok = true;
      aio->engine = ENGINE_URING;
    } else {
      snprintf(why, sizeof why, "io_uring_queue_init(%d) refused: %s", cfg.queue_depth, strerror(-rc));
    }
  } else {
    snprintf(why, sizeof why, "TANDEM_AIO=threads");
  }
#else
  snprintf(why, sizeof why, "built without liburing (apt-get install liburing-dev and rebuild)");
#endif
  if (aio->engine != ENGINE_URING && strcmp(want, "uring") == 0) {
    td_status st = td_error(TD_ERR_SYSTEM, "%s: TANDEM_AIO=uring but io_uring is not available (%s); unset "
                            "TANDEM_AIO to fall back to the thread pool", who, why);
    free(aio);
    return st;
  }
  aio->n_threads = aio->engine == ENGINE_URING ? 1 : cfg.thread_count;
  aio->threads = calloc((size_t)aio->n_threads, sizeof *aio->threads);
  if (!aio->threads) {
    td_aio_destroy(aio);
    return td_error(TD_ERR_SYSTEM, "%s: out of memory for the I/O threads", who);
  }
  for (int i = 0; i < aio->n_threads; i++) {
    void *(*fn)(void *) = worker_main;
#ifdef TD_HAVE_URING
    if (aio->engine == ENGINE_URING) fn = driver_main;
#endif
    int rc = pthread_create(&aio->threads[i], NULL, fn, aio);
    if (rc != 0) {
      aio->n_threads = i;
      td_aio_destroy(aio);
      return td_error(TD_ERR_SYSTEM, "%s: starting I/O thread %d failed: %s", who, i, strerror(rc));
    }
  }
  if (aio->engine == ENGINE_URING)
    TD_INFO("%s: asynchronous I/O through io_uring (queue depth %d, blocks of %zu bytes)", who, cfg.queue_depth,
            cfg.block_size);
  else if (*want)
    TD_INFO("%s: asynchronous I/O through %d pread/pwrite threads (%s)", who, aio->n_threads, why);
  else
    TD_WARN("%s: asynchronous I/O through %d pread/pwrite threads (%s)", who, aio->n_threads, why);
  *out = aio;
  return TD_OK;
}

void td_aio_destroy(td_aio *aio) {
  if (!aio) return;
  pthread_mutex_lock(&aio->mu);
  while (aio->outstanding > 0) pthread_cond_wait(&aio->done_cv, &aio->mu);
  aio->stop = true;
  pthread_cond_broadcast(&aio->work_cv);
  pthread_mutex_unlock(&aio->mu);
  for (int i = 0; i < aio->n_threads; i++) pthread_join(aio->threads[i], NULL);
#ifdef TD_HAVE_URING
  if (aio->ring_ok) io_uring_queue_exit(&aio->ring);
#endif
  free(aio->threads);
  pthread_mutex_destroy(&aio->mu);
  pthread_cond_destroy(&aio->work_cv);
  pthread_cond_destroy(&aio->done_cv);
  free(aio);
}

const char *td_aio_engine_name(const td_aio *aio) { return aio->engine == ENGINE_URING ? "io_uring" : "threads"; }

void td_aio_get_stats(const td_aio *aio, td_aio_stats *out) {
  pthread_mutex_lock((pthread_mutex_t *)&aio->mu);
  *out = aio->stats;
  pthread_mutex_unlock((pthread_mutex_t *)&aio->mu);
}

/* ---- files ---- */

td_status td_aio_open(td_aio *aio, const char *path, bool create, td_aio_file **out) {
  *out = NULL;
  td_aio_file *f = calloc(1, sizeof *f);
  if (!f) return td_error(TD_ERR_SYSTEM, "%s: out of memory opening %s", aio->who, path);
  td_strlcpy(f->path, path, sizeof f->path);
  int flags = O_RDWR | O_CLOEXEC | (create ? O_CREAT | O_TRUNC : 0);
  f->fd_buffered = open(path, flags, 0600);
  if (f->fd_buffered < 0) {
    td_status st = td_error(TD_ERR_IO, "%s: cannot open %s: %s; nvme_path must be a writable directory", aio->who,
                            path, strerror(errno));
    free(f);
    return st;
  }
  f->fd_direct = open(path, O_RDWR | O_CLOEXEC | O_DIRECT);
  if (f->fd_direct < 0) {
    int err = errno;
    pthread_mutex_lock(&aio->mu);
    bool warn = !aio->warned_buffered;
    aio->warned_buffered = true;
    pthread_mutex_unlock(&aio->mu);
    if (warn)
      TD_WARN("%s: the file system of %s refuses O_DIRECT (%s; tmpfs does): buffered I/O through the page cache "
              "instead", aio->who, path, strerror(err));
  }
  *out = f;
  return TD_OK;
}

void td_aio_close(td_aio_file *f) {
  if (!f) return;
  if (f->fd_direct >= 0) close(f->fd_direct);
  close(f->fd_buffered);
  free(f);
}

bool td_aio_file_direct(const td_aio_file *f) { return f->fd_direct >= 0; }
const char *td_aio_file_path(const td_aio_file *f) { return f->path; }

/* ---- requests ---- */

static td_status submit(td_aio *aio, td_aio_file *f, char *buf, size_t len, uint64_t offset, bool write,
                        td_aio_req **req_out) {
  *req_out = NULL;
  size_t bs = aio->cfg.block_size;
  td_aio_req *r = calloc(1, sizeof *r);
  int cap = (int)(len / bs) + 3;
  if (r) r->pieces = calloc((size_t)cap, sizeof *r->pieces);
  if (!r || !r->pieces) {
    if (r) free(r);
    return td_error(TD_ERR_SYSTEM, "%s: out of memory submitting %zu bytes of %s", aio->who, len, f->path);
  }
  *r = (td_aio_req){.file = f, .write = write, .len = len, .offset = offset, .status = TD_OK, .pieces = r->pieces};
  /* direct only where memory and file offsets are congruent modulo the
   * alignment: then the middle of the range is aligned in both */
  bool direct = f->fd_direct >= 0 && ((uintptr_t)buf % TD_AIO_ALIGN) == (offset % TD_AIO_ALIGN);
  size_t pos = 0;
  while (pos < len) {
    size_t n;
    bool d = false;
    uint64_t at = offset + pos;
    if (!direct) {
      n = TD_MIN(bs, len - pos);
    } else if (at % TD_AIO_ALIGN != 0) { /* the head up to the first boundary */
      n = TD_MIN(TD_AIO_ALIGN - (size_t)(at % TD_AIO_ALIGN), len - pos);
    } else if (len - pos >= TD_AIO_ALIGN) { /* aligned middle */
      n = TD_MIN(bs, (len - pos) / TD_AIO_ALIGN * TD_AIO_ALIGN);
      d = true;
    } else { /* the tail */
      n = len - pos;
    }
    aio_piece *p = &r->pieces[r->n_pieces++];
    *p = (aio_piece){NULL, r, d ? f->fd_direct : f->fd_buffered, d, buf + pos, n, 0, at};
    pos += n;
  }
  r->pieces_left = r->n_pieces;
  pthread_mutex_lock(&aio->mu);
  if (write) aio->stats.n_writes++, aio->stats.bytes_written += len;
  else aio->stats.n_reads++, aio->stats.bytes_read += len;
  if (r->n_pieces > 0) {
    if (aio->outstanding++ == 0) aio->busy_since = td_now();
    for (int i = 0; i < r->n_pieces; i++) {
      aio_piece *p = &r->pieces[i];
      if (aio->tail) aio->tail->next = p;
      else aio->head = p;
      aio->tail = p;
    }
    pthread_cond_broadcast(&aio->work_cv);
  }
  pthread_mutex_unlock(&aio->mu);
  *req_out = r;
  return TD_OK;
}

td_status td_aio_read(td_aio *aio, td_aio_file *f, void *buf, size_t len, uint64_t offset, td_aio_req **req_out) {
  return submit(aio, f, buf, len, offset, false, req_out);
}

td_status td_aio_write(td_aio *aio, td_aio_file *f, const void *buf, size_t len, uint64_t offset,
                       td_aio_req **req_out) {
  return submit(aio, f, (char *)buf, len, offset, true, req_out);
}

td_status td_aio_wait(td_aio *aio, td_aio_req *r) {
  if (!r) return TD_OK;
  double t0 = td_now();
  pthread_mutex_lock(&aio->mu);
  while (r->pieces_left > 0) pthread_cond_wait(&aio->done_cv, &aio->mu);
  aio->stats.wait_s += td_now() - t0;
  pthread_mutex_unlock(&aio->mu);
  td_status st = r->status;
  if (st != TD_OK) td_error(st, "%s", r->message);
  free(r->pieces);
  free(r);
  return st;
}
