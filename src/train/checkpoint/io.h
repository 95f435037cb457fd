/* File helpers of src/train/checkpoint/ shared by save, load and the
 * directory management: writes that are fsync'd, reads with a size bound,
 * directory removal, the names in ROOT, and the crash-injection hook
 * (TANDEM_CKPT_FAULT_AT) that counts every file operation of a save. */
#ifndef TD_TRAIN_CKPT_IO_H
#define TD_TRAIN_CKPT_IO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/base.h"

#define CKPT_TOKEN_FILE "visible"
#define CKPT_MAX_MANIFEST ((size_t)64 << 20)

/* File operations of one save on this rank, for TANDEM_CKPT_FAULT_AT. */
typedef struct save_io {
  long ops;
  long fault_at; /* 0: off */
} save_io;

/* Called before each file operation of a save: the test hook simulates the
 * process dying right there (SIGKILL: no cleanup, no atexit). io may be NULL. */
void ckpt_fault_point(save_io *io);

/* snprintf for paths: 0, or -1 when the path does not fit. */
int ckpt_path_fmt(char *out, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int ckpt_path_exists(const char *path);
td_status ckpt_fsync_path(save_io *io, const char *path, int directory);
/* Create path with the data, fsync'd: two file operations (write, sync). */
td_status ckpt_write_file(save_io *io, const char *path, const void *data, size_t n);
/* Read a whole file of at most max_bytes; *data is malloc'd and NUL-terminated. */
td_status ckpt_read_file(const char *path, size_t max_bytes, char **data, size_t *n);
td_status ckpt_mkdir_p(save_io *io, const char *path);
/* Remove a flat directory (files only): one operation per file and one for it. */
td_status ckpt_remove_flat_dir(save_io *io, const char *path);
/* pread/pwrite of exactly n bytes (EINTR and short transfers handled);
 * -1 with errno set, or the bytes transferred (< n only at end of file). */
ssize_t ckpt_pread_full(int fd, void *buf, size_t n, uint64_t offset);
int ckpt_write_full(int fd, const void *buf, size_t n);

/* ---- names in ROOT ---- */
/* "step-N" or "step-N.G" (N, G decimal, G >= 1): 1 with *step, *gen set. */
int ckpt_parse_step_name(const char *name, long *step, long *gen);
/* What ROOT/latest names ("" if none or unreadable). */
void ckpt_read_latest(const char *root, char *name, size_t size);
/* Resolve `path` to a step directory: one holding a manifest, or ROOT whose
 * `latest` names one. */
td_status ckpt_find_step_dir(const char *path, char *dir, size_t size);
/* Remove leftovers of crashed saves: step-*.tmp-* and latest.tmp. */
td_status ckpt_remove_leftovers(save_io *io, const char *root);
/* After `latest` names keep_name: remove other copies of the step and all but
 * keep_last newest checkpoints (keep_last 0: keep all). */
td_status ckpt_clean_root(save_io *io, const char *root, const char *keep_name, long step, int keep_last);

#endif
