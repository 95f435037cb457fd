/* File helpers and the names in a checkpoint ROOT (see io.h): fsync'd
 * writes, bounded reads, flat directory removal, `latest`, the clean-up of
 * crashed saves and keep_last pruning. Every operation of a save passes
 * through ckpt_fault_point, so that TANDEM_CKPT_FAULT_AT can kill the
 * process before any one of them (tests/train sweep it). */
#include "train/checkpoint/io.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int ckpt_path_fmt(char *out, size_t size, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(out, size, fmt, ap);
  va_end(ap);
  return n >= 0 && (size_t)n < size ? 0 : -1;
}

/* Called before each file operation of a save: the test hook simulates the
 * process dying right there (SIGKILL: no cleanup, no atexit). */
void ckpt_fault_point(save_io *io) {
  if (io && io->fault_at > 0 && ++io->ops == io->fault_at) kill(getpid(), SIGKILL);
}

/* ---- small file helpers ---- */

td_status ckpt_fsync_path(save_io *io, const char *path, int directory) {
  ckpt_fault_point(io);
  int fd = open(path, (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) return td_error_errno("cannot open %s to sync it", path);
  int rc = fsync(fd);
  int saved = errno;
  close(fd);
  errno = saved;
  /* Some file systems refuse fsync on directories (EINVAL); the data files
   * themselves were synced, which is what matters most. */
  if (rc != 0 && !(directory && (errno == EINVAL || errno == EBADF)))
    return td_error_errno("cannot fsync %s", path);
  return TD_OK;
}

/* Create path with the data, fsync'd: two file operations (write, sync). */
td_status ckpt_write_file(save_io *io, const char *path, const void *data, size_t n) {
  ckpt_fault_point(io);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return td_error_errno("cannot create %s", path);
  const char *p = data;
  while (n > 0) {
    ssize_t w = write(fd, p, n > (1u << 30) ? (1u << 30) : n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      td_status st = td_error_errno("cannot write %s (disk full?)", path);
      close(fd);
      return st;
    }
    p += w;
    n -= (size_t)w;
  }
  ckpt_fault_point(io);
  if (fsync(fd) != 0) {
    td_status st = td_error_errno("cannot fsync %s", path);
    close(fd);
    return st;
  }
  if (close(fd) != 0) return td_error_errno("cannot close %s", path);
  return TD_OK;
}

/* Read a whole file of at most max_bytes; *data is malloc'd and
 * NUL-terminated (for text). */
td_status ckpt_read_file(const char *path, size_t max_bytes, char **data, size_t *n) {
  *data = NULL;
  *n = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return td_error(TD_ERR_IO, "cannot open %s: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    close(fd);
    return td_error(TD_ERR_IO, "cannot stat %s: %s", path, strerror(errno));
  }
  if (sb.st_size < 0 || (uint64_t)sb.st_size > (uint64_t)max_bytes) {
    close(fd);
    return td_error(TD_ERR_IO, "%s is %lld bytes, more than the %zu expected: the checkpoint is corrupt", path,
                    (long long)sb.st_size, max_bytes);
  }
  size_t size = (size_t)sb.st_size;
  char *buf = malloc(size + 1);
  if (!buf) {
    close(fd);
    return td_error(TD_ERR_SYSTEM, "out of memory reading %s (%zu bytes)", path, size);
  }
  size_t got = 0;
  while (got < size) {
    ssize_t r = read(fd, buf + got, size - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      td_status st = td_error(TD_ERR_IO, "cannot read %s: %s", path, strerror(errno));
      free(buf);
      close(fd);
      return st;
    }
    if (r == 0) break;
    got += (size_t)r;
  }
  close(fd);
  buf[got] = '\0';
  *data = buf;
  *n = got;
  return TD_OK;
}

int ckpt_path_exists(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0;
}

td_status ckpt_mkdir_p(save_io *io, const char *path) {
  char buf[1024];
  if (td_strlcpy(buf, path, sizeof buf) >= sizeof buf - 1)
    return td_error(TD_ERR_INVALID_ARGUMENT, "checkpoint path too long: %s", path);
  ckpt_fault_point(io);
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) return td_error_errno("cannot create directory %s", buf);
    *p = '/';
  }
  if (mkdir(buf, 0755) != 0 && errno != EEXIST) return td_error_errno("cannot create directory %s", buf);
  return TD_OK;
}

/* Remove a checkpoint directory (flat: files only), one file operation per
 * file and one for the directory. */
td_status ckpt_remove_flat_dir(save_io *io, const char *path) {
  DIR *d = opendir(path);
  if (!d) return errno == ENOENT ? TD_OK : td_error_errno("cannot open directory %s to remove it", path);
  struct dirent *e;
  char file[1280];
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    if (ckpt_path_fmt(file, sizeof file, "%s/%s", path, e->d_name) != 0) continue;
    ckpt_fault_point(io);
    if (unlink(file) != 0 && errno != ENOENT) {
      td_status st = td_error_errno("cannot remove %s", file);
      closedir(d);
      return st;
    }
  }
  closedir(d);
  ckpt_fault_point(io);
  if (rmdir(path) != 0 && errno != ENOENT) return td_error_errno("cannot remove directory %s", path);
  return TD_OK;
}

/* ---- names in ROOT ---- */

/* "step-N" or "step-N.G" (N, G decimal, G >= 1): 1 with *step and *gen set;
 * anything else (step-N.tmp-X, latest, user files): 0. */
int ckpt_parse_step_name(const char *name, long *step, long *gen) {
  if (strncmp(name, "step-", 5) != 0) return 0;
  const char *p = name + 5;
  if (*p < '0' || *p > '9') return 0;
  errno = 0;
  char *end;
  long n = strtol(p, &end, 10);
  if (errno || n < 0) return 0;
  long g = 0;
  if (*end == '.') {
    const char *q = end + 1;
    if (*q < '1' || *q > '9') return 0;
    g = strtol(q, &end, 10);
    if (errno || g < 1) return 0;
  }
  if (*end) return 0;
  *step = n;
  *gen = g;
  return 1;
}

/* What ROOT/latest names ("" if none or unreadable). */
void ckpt_read_latest(const char *root, char *name, size_t size) {
  char path[1280], *text = NULL;
  size_t n = 0;
  name[0] = '\0';
  if (ckpt_path_fmt(path, sizeof path, "%s/latest", root) != 0 || !ckpt_path_exists(path)) return;
  if (ckpt_read_file(path, 4096, &text, &n) != TD_OK) return;
  while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == ' ')) text[--n] = '\0';
  td_strlcpy(name, text, size);
  free(text);
}

typedef struct step_entry {
  long step, gen;
  char name[64];
} step_entry;

static int cmp_newest_first(const void *a, const void *b) {
  const step_entry *x = a, *y = b;
  if (x->step != y->step) return x->step > y->step ? -1 : 1;
  return x->gen > y->gen ? -1 : x->gen < y->gen;
}

/* After `latest` names `keep_name`: remove the other copies of the same
 * step, leftovers of crashed saves, and, with keep_last > 0, all but the
 * keep_last newest checkpoints (the one `latest` names always stays). */
td_status ckpt_clean_root(save_io *io, const char *root, const char *keep_name, long step, int keep_last) {
  DIR *d = opendir(root);
  if (!d) return td_error_errno("cannot list the checkpoint directory %s", root);
  step_entry *entries = NULL;
  size_t n = 0, cap = 0;
  td_status st = TD_OK;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    step_entry x;
    if (!ckpt_parse_step_name(e->d_name, &x.step, &x.gen) || strcmp(e->d_name, keep_name) == 0) continue;
    if (strlen(e->d_name) >= sizeof x.name) continue;
    td_strlcpy(x.name, e->d_name, sizeof x.name);
    if (n == cap) {
      size_t ncap = cap ? 2 * cap : 32;
      step_entry *grown = realloc(entries, ncap * sizeof *grown);
      if (!grown) {
        st = td_error(TD_ERR_SYSTEM, "out of memory listing %s", root);
        break;
      }
      entries = grown;
      cap = ncap;
    }
    entries[n++] = x;
  }
  closedir(d);
  if (st == TD_OK && n > 1) qsort(entries, n, sizeof *entries, cmp_newest_first);
  /* keep_name counts as one of the keep_last. */
  long others_kept = 0;
  for (size_t i = 0; st == TD_OK && i < n; i++) {
    int drop = entries[i].step == step || (keep_last > 0 && others_kept >= keep_last - 1);
    if (!drop) {
      others_kept++;
      continue;
    }
    char path[1280];
    if (ckpt_path_fmt(path, sizeof path, "%s/%s", root, entries[i].name) == 0) st = ckpt_remove_flat_dir(io, path);
  }
  free(entries);
  return st;
}

/* Remove leftovers of crashed saves: step-*.tmp-* directories and
 * latest.tmp. Nothing `latest` can name. */
td_status ckpt_remove_leftovers(save_io *io, const char *root) {
  DIR *d = opendir(root);
  if (!d) return td_error_errno("cannot list the checkpoint directory %s", root);
  td_status st = TD_OK;
  struct dirent *e;
  char path[1280];
  /* Collect first: removing while readdir runs may skip entries. */
  char (*names)[256] = NULL;
  size_t n = 0, cap = 0;
  while ((e = readdir(d)) != NULL) {
    size_t len = strlen(e->d_name);
    /* step-N.tmp-TOKEN; step-N.tmp and step-N.old from older versions */
    int stale = strncmp(e->d_name, "step-", 5) == 0 &&
                (strstr(e->d_name, ".tmp-") || (len > 4 && (strcmp(e->d_name + len - 4, ".tmp") == 0 ||
                                                            strcmp(e->d_name + len - 4, ".old") == 0)));
    if (!stale && strcmp(e->d_name, "latest.tmp") != 0) continue;
    if (n == cap) {
      size_t ncap = cap ? 2 * cap : 8;
      char (*grown)[256] = realloc(names, ncap * sizeof *grown);
      if (!grown) {
        st = td_error(TD_ERR_SYSTEM, "out of memory listing %s", root);
        break;
      }
      names = grown;
      cap = ncap;
    }
    td_strlcpy(names[n++], e->d_name, 256);
  }
  closedir(d);
  for (size_t i = 0; st == TD_OK && i < n; i++) {
    if (ckpt_path_fmt(path, sizeof path, "%s/%s", root, names[i]) != 0) continue;
    if (strcmp(names[i], "latest.tmp") == 0) {
      ckpt_fault_point(io);
      if (unlink(path) != 0 && errno != ENOENT) st = td_error_errno("cannot remove %s", path);
    } else {
      st = ckpt_remove_flat_dir(io, path);
    }
  }
  free(names);
  return st;
}

/* Resolve `path` to a step directory: ROOT (follow ROOT/latest) or step-N. */
td_status ckpt_find_step_dir(const char *path, char *dir, size_t size) {
  char file[1280];
  if (ckpt_path_fmt(file, sizeof file, "%s/manifest", path) != 0)
    return td_error(TD_ERR_INVALID_ARGUMENT, "checkpoint path too long: %s", path);
  if (ckpt_path_exists(file)) {
    td_strlcpy(dir, path, size);
    return TD_OK;
  }
  ckpt_path_fmt(file, sizeof file, "%s/latest", path);
  if (!ckpt_path_exists(file))
    return td_error(TD_ERR_IO,
                    "no checkpoint in %s: neither %s/latest nor %s/manifest exists (give the --save directory of an "
                    "earlier run, or one of its step-N directories)",
                    path, path, path);
  char name[256];
  ckpt_read_latest(path, name, sizeof name);
  long step, gen;
  if (!ckpt_parse_step_name(name, &step, &gen))
    return td_error(TD_ERR_IO, "%s is corrupt: it should hold a name like \"step-100\"", file);
  ckpt_path_fmt(dir, size, "%s/%s", path, name);
  return TD_OK;
}


ssize_t ckpt_pread_full(int fd, void *buf, size_t n, uint64_t offset) {
  size_t got = 0;
  while (got < n) {
    size_t want = n - got > (1u << 30) ? (1u << 30) : n - got;
    ssize_t r = pread(fd, (char *)buf + got, want, (off_t)(offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) break;
    got += (size_t)r;
  }
  return (ssize_t)got;
}

int ckpt_write_full(int fd, const void *buf, size_t n) {
  const char *p = buf;
  while (n > 0) {
    ssize_t w = write(fd, p, n > (1u << 30) ? (1u << 30) : n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      if (w == 0) errno = ENOSPC;
      return -1;
    }
    p += w;
    n -= (size_t)w;
  }
  return 0;
}
