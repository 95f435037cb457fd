/* The files a commit's copies live in (el_piece: elastic.h), for both
 * kinds of state: the buddy replicas of sharded buffers (replica.c) and
 * the last two commits of the whole buffers (state.c; ZeRO stage 0's
 * parameters and optimizer state, the step counters).
 *
 * Each is an unnamed file (O_TMPFILE: nothing is left behind however the
 * process ends) in TANDEM_ELASTIC_REPLICA_DIR (default /var/tmp, a disk),
 * written with pwrite straight from the live buffers. The bytes sit in the
 * page cache, which the kernel writes back and may reclaim under pressure,
 * instead of in this process's RSS: in memory, stage 0's two commits of
 * the parameters and Adam state (24 bytes a parameter) were more than the
 * model state itself. The files live as long as the process, as copies in
 * its memory would: a process that dies loses them, so what survives a
 * failure is what the other ranks hold (state.c, replica.c). */
#include "elastic/elastic.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/vfs.h>
#include <unistd.h>

#define TMPFS_MAGIC_NUMBER 0x01021994 /* linux/magic.h's TMPFS_MAGIC */

void el_piece_init(el_piece *p) {
  memset(p, 0, sizeof *p);
  p->fd = -1;
  p->commit = -1;
}

void el_piece_free(el_piece *p) {
  if (p->fd >= 0) close(p->fd);
  el_piece_init(p);
}

/* TANDEM_ELASTIC_REPLICA_DIR, default /var/tmp: where the files are. */
static const char *el_replica_dir(void) { return td_env_str("TANDEM_ELASTIC_REPLICA_DIR", "/var/tmp"); }

/* An unnamed file in the replica directory (a named one unlinked at once
 * where the file system has no O_TMPFILE). */
static td_status piece_open(el_piece *p) {
  const char *dir = el_replica_dir();
  int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0 && (errno == EOPNOTSUPP || errno == EINVAL || errno == EISDIR)) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/tandem-replica-XXXXXX", dir) < (int)sizeof path) {
      fd = mkostemp(path, O_CLOEXEC);
      if (fd >= 0) unlink(path);
    } else {
      errno = ENAMETOOLONG;
    }
  }
  if (fd < 0)
    return td_error(TD_ERR_IO, "elastic: cannot create a commit file (the copies kept for recovery) in %s: %s (set "
                               "TANDEM_ELASTIC_REPLICA_DIR to a writable directory on a local disk)",
                    dir, strerror(errno));
  static int warned; /* once a process */
  struct statfs fs;
  if (!warned && fstatfs(fd, &fs) == 0 && fs.f_type == TMPFS_MAGIC_NUMBER) {
    warned = 1;
    td_log(TD_LOG_WARN, "elastic: the commit files (the copies kept for recovery) are in %s, a tmpfs: they stay in memory (shmem); set "
                        "TANDEM_ELASTIC_REPLICA_DIR to a directory on a disk",
           dir);
  }
  p->fd = fd;
  return TD_OK;
}

/* Make p the (empty) piece [lo, hi) of `bytes` bytes, about to be written:
 * it holds no valid commit until the caller says so (its file is opened
 * on first use). */
td_status el_piece_begin(el_piece *p, int64_t lo, int64_t hi, size_t bytes) {
  p->commit = -1;
  if (p->fd < 0) TD_CHECK(piece_open(p));
  /* a smaller range after a re-shard: the file shrinks with it */
  if (p->cap > bytes && ftruncate(p->fd, (off_t)bytes) != 0)
    return td_error(TD_ERR_IO, "elastic: truncating a commit file in %s: %s", el_replica_dir(), strerror(errno));
  p->lo = lo;
  p->hi = hi;
  p->cap = bytes;
  return TD_OK;
}

td_status el_piece_write(const el_piece *p, size_t off, const void *src, size_t n) {
  const unsigned char *s = src;
  while (n) {
    ssize_t w = pwrite(p->fd, s, n, (off_t)off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0)
      return td_error(TD_ERR_IO, "elastic: writing %zu bytes of a commit file in %s: %s (free space there or "
                                 "set TANDEM_ELASTIC_REPLICA_DIR to another disk)",
                      n, el_replica_dir(), w < 0 ? strerror(errno) : "nothing written");
    s += w;
    off += (size_t)w;
    n -= (size_t)w;
  }
  return TD_OK;
}

td_status el_piece_read(const el_piece *p, size_t off, void *dst, size_t n) {
  unsigned char *d = dst;
  while (n) {
    ssize_t got = pread(p->fd, d, n, (off_t)off);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      return td_error(TD_ERR_IO, "elastic: reading %zu bytes of a commit file in %s: %s", n, el_replica_dir(),
                      got < 0 ? strerror(errno) : "the file is shorter");
    d += got;
    off += (size_t)got;
    n -= (size_t)got;
  }
  return TD_OK;
}
