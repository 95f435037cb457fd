/* The offload's directory under nvme_path: one per job and rank,
 *
 *     <nvme_path>/tandem-offload-<job>-r<rank>-p<pid>-<n>/
 *         lock             flock'ed (exclusive) while the trainer lives
 *         params.f32, exp_avg.f32, exp_avg_sq.f32 ...
 *
 * Removed by offload_destroy, which the trainer calls on every exit path,
 * failures included. A process killed with SIGKILL cannot clean up; the
 * kernel drops its flock, so the next start that offloads to the same path
 * finds a directory whose lock it can take and removes it (a live job's
 * lock is held, so its directory is left alone).
 *
 * That rule needs a directory to be visible under its name only while its
 * lock is held: the ranks of one job start side by side on the same path,
 * and one that scanned a peer's directory between the creation of its lock
 * file and the flock took it for a dead job's and removed it (the peer's
 * start then failed, "cannot create and lock", or "cannot open params.f32").
 * So the directory is made under a hidden name (.tandem-offload-new-...),
 * its lock is created and taken there, and only then is it renamed to its
 * name (rename is atomic; the flock stays with the open file):
 *
 *     mkdir .tandem-offload-new-X;  open + flock .../lock;  rename -> tandem-offload-X
 *
 * A hidden directory older than a minute whose lock is free (or missing)
 * is a start killed before its rename, and the scan removes it.
 *
 * Before anything is written: the path must be a directory this process
 * can create files in (checked by creating the job directory: root passes
 * access(2) on any mode, so only a real attempt tells, e.g. EROFS on a
 * read-only mount), and statvfs must show the bytes this rank will write
 * times the ranks on this host (which usually share the disk). */

#include "train/offload/offload.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define DIR_PREFIX "tandem-offload-"
#define NEW_PREFIX ".tandem-offload-new-" /* until the lock is held */

/* Remove the regular files of `dir` and the directory itself. */
static void remove_tree(const char *dir) {
  DIR *d = opendir(dir);
  if (d) {
    struct dirent *e;
    char p[1024];
    while ((e = readdir(d)) != NULL) {
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
      snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
      (void)unlink(p);
    }
    closedir(d);
  }
  (void)rmdir(dir);
}

/* Directories of jobs that died without cleaning up: their lock is free. */
static void remove_dead_jobs(const char *path, int rank) {
  DIR *d = opendir(path);
  if (!d) return;
  struct dirent *e;
  char sub[1024], lock[1100];
  while ((e = readdir(d)) != NULL) {
    bool named = strncmp(e->d_name, DIR_PREFIX, strlen(DIR_PREFIX)) == 0;
    bool in_creation = strncmp(e->d_name, NEW_PREFIX, strlen(NEW_PREFIX)) == 0;
    if (!named && !in_creation) continue;
    snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
    snprintf(lock, sizeof lock, "%s/lock", sub);
    struct stat sb;
    bool old = stat(sub, &sb) == 0 && time(NULL) - sb.st_mtime > 60;
    /* a start not yet renamed may not hold its lock yet: only an old one
     * can be a leftover (of a start killed before its rename) */
    if (in_creation && !old) continue;
    int fd = open(lock, O_RDWR | O_CLOEXEC);
    if (fd < 0) { /* a directory its live owner is removing, or a leftover */
      if (old) remove_tree(sub);
      continue;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
      TD_WARN("rank %d: removing %s, left by an offloading job that ended without cleaning up (killed?)", rank, sub);
      remove_tree(sub);
    }
    close(fd); /* drops our lock too */
  }
  closedir(d);
}

static void human(size_t bytes, char *buf, size_t cap) {
  snprintf(buf, cap, "%.2f GiB (%zu bytes)", (double)bytes / (1024.0 * 1024 * 1024), bytes);
}

td_status offload_dir_create(td_trainer *t, const char *path, size_t needed) {
  offload_state *o = t->offload;
  struct stat sb;
  if (stat(path, &sb) != 0)
    return td_error(TD_ERR_INVALID_ARGUMENT, "rank %d: offload nvme_path \"%s\": %s; create the directory (mkdir -p) "
                    "on a local disk with enough free space", t->rank, path, strerror(errno));
  if (!S_ISDIR(sb.st_mode))
    return td_error(TD_ERR_INVALID_ARGUMENT, "rank %d: offload nvme_path \"%s\" is not a directory; give a directory "
                    "on a local disk", t->rank, path);
  remove_dead_jobs(path, t->rank);
  struct statvfs vfs;
  if (statvfs(path, &vfs) != 0)
    return td_error(TD_ERR_IO, "rank %d: offload nvme_path \"%s\": statvfs failed: %s", t->rank, path,
                    strerror(errno));
  int local = t->comm ? td_comm_host_size(t->comm) : 1; /* every rank of the host may swap there */
  if (local < 1) local = 1;
  size_t free_bytes = (size_t)vfs.f_bavail * (size_t)vfs.f_frsize;
  size_t want = needed * (size_t)local;
  if (free_bytes < want) {
    char n[64], f[64], w[64];
    human(needed, n, sizeof n), human(free_bytes, f, sizeof f), human(want, w, sizeof w);
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "rank %d: offload nvme_path \"%s\" has %s free, but the offload needs %s per rank, %s for the %d "
                    "rank(s) on this host: free space there, point nvme_path at a larger disk, or use more ranks "
                    "(smaller shards)", t->rank, path, f, n, w, local);
  }
  static int counter;
  int n_this = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
  const char *job = td_env_str("TANDEM_JOB_ID", "solo");
  char job_safe[48];
  size_t j = 0;
  for (const char *c = job; *c && j + 1 < sizeof job_safe; c++)
    job_safe[j++] = ((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9')) ? *c : '_';
  job_safe[j] = '\0';
  int len = snprintf(o->dir, sizeof o->dir, "%s/" DIR_PREFIX "%s-r%d-p%d-%d", path, job_safe, t->rank, (int)getpid(),
                     n_this);
  char fresh[sizeof o->dir];
  int len_fresh = snprintf(fresh, sizeof fresh, "%s/" NEW_PREFIX "%s-r%d-p%d-%d", path, job_safe, t->rank,
                           (int)getpid(), n_this);
  if (len < 0 || (size_t)len >= sizeof o->dir || len_fresh < 0 || (size_t)len_fresh >= sizeof fresh) {
    o->dir[0] = '\0';
    return td_error(TD_ERR_INVALID_ARGUMENT, "rank %d: offload nvme_path \"%s\" is too long", t->rank, path);
  }
  /* under the hidden name until the lock is held (the file's opening block) */
  if (mkdir(fresh, 0700) != 0) {
    int err = errno;
    o->dir[0] = '\0';
    return td_error(TD_ERR_INVALID_ARGUMENT, "rank %d: offload nvme_path \"%s\" is not writable (creating a directory "
                    "there failed: %s); give a directory on a writable local disk", t->rank, path, strerror(err));
  }
  char lock[600];
  snprintf(lock, sizeof lock, "%s/lock", fresh);
  o->lock_fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (o->lock_fd < 0 || flock(o->lock_fd, LOCK_EX | LOCK_NB) != 0) {
    int err = errno;
    remove_tree(fresh);
    if (o->lock_fd >= 0) close(o->lock_fd);
    o->lock_fd = -1;
    o->dir[0] = '\0';
    return td_error(TD_ERR_IO, "rank %d: cannot create and lock %s: %s", t->rank, lock, strerror(err));
  }
  if (rename(fresh, o->dir) != 0) {
    td_status st = td_error(TD_ERR_IO, "rank %d: renaming %s to %s failed: %s; check the file system under nvme_path",
                            t->rank, fresh, o->dir, strerror(errno));
    remove_tree(fresh);
    close(o->lock_fd);
    o->lock_fd = -1;
    o->dir[0] = '\0';
    return st;
  }
  return TD_OK;
}

void offload_dir_remove(offload_state *o) {
  if (!o || !o->dir[0]) return;
  remove_tree(o->dir);
  if (o->lock_fd > 0) close(o->lock_fd);
  o->lock_fd = -1;
  o->dir[0] = '\0';
}
