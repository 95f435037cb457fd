/* Host-shared memory regions (net.h): memfd-backed memory that other
 * processes of the same user on this host map through /proc/<pid>/fd/<fd>.
 *
 * Why memfd and /proc rather than named POSIX segments: a name in /dev/shm
 * outlives a killed process, while a memfd lives exactly as long as some
 * process holds it open or mapped. Opening /proc/<pid>/fd/<fd> needs the same
 * access as reading the process's memory (same user, no ptrace policy against
 * it), which the shm transport probes once per communicator.
 *
 * The memfd name carries the region's serial, and a peer checks it after
 * opening, so that a stale reference (the region freed and its fd number
 * reused) is refused instead of mapping the wrong memory. */
#define _GNU_SOURCE 1 /* memfd_create */
#include "net/net.h"

#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct region {
  char *base;
  size_t bytes;
  uint64_t serial;
  int fd;
} region;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static region *regions; /* unsorted: a process holds a handful */
static size_t n_regions, cap_regions;
static uint64_t next_serial = 1;

static void region_name(char *buf, size_t size, pid_t pid, uint64_t serial) {
  snprintf(buf, size, "tandem-mem-%d-%" PRIu64, (int)pid, serial);
}

td_status net_hostmem_alloc(size_t bytes, void **out) {
  *out = NULL;
  if (bytes == 0) return td_error(TD_ERR_INVALID_ARGUMENT, "host-shared memory: size must be > 0");
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t size = (bytes + page - 1) / page * page;
  pthread_mutex_lock(&lock);
  uint64_t serial = next_serial++;
  pthread_mutex_unlock(&lock);
  char name[64];
  region_name(name, sizeof name, getpid(), serial);
  int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0) return td_error_errno("host-shared memory: memfd_create for %zu bytes failed", bytes);
  if (ftruncate(fd, (off_t)size) != 0) {
    td_status st = td_error_errno("host-shared memory: cannot size a memfd to %zu bytes", size);
    close(fd);
    return st;
  }
  /* Reserve the pages now: a full tmpfs is a clear error here rather than a
   * SIGBUS in the middle of a training step. */
  int err = posix_fallocate(fd, 0, (off_t)size);
  if (err != 0 && err != EOPNOTSUPP && err != EINVAL) {
    close(fd);
    return td_error(TD_ERR_SYSTEM,
                    "host-shared memory: cannot reserve %zu bytes: %s (shared memory counts against the memory "
                    "cgroup and tmpfs limits; free memory or use plain buffers)",
                    size, strerror(err));
  }
  void *addr = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (addr == MAP_FAILED) {
    td_status st = td_error_errno("host-shared memory: cannot map %zu bytes", size);
    close(fd);
    return st;
  }
  pthread_mutex_lock(&lock);
  if (n_regions == cap_regions) {
    size_t cap = cap_regions ? 2 * cap_regions : 16;
    region *r = realloc(regions, cap * sizeof *r);
    if (!r) {
      pthread_mutex_unlock(&lock);
      munmap(addr, size);
      close(fd);
      return td_error(TD_ERR_SYSTEM, "host-shared memory: out of memory for the region table");
    }
    regions = r;
    cap_regions = cap;
  }
  regions[n_regions++] = (region){addr, size, serial, fd};
  pthread_mutex_unlock(&lock);
  *out = addr;
  return TD_OK;
}

bool net_hostmem_free(void *p) {
  if (!p) return false;
  pthread_mutex_lock(&lock);
  for (size_t i = 0; i < n_regions; i++) {
    if (regions[i].base != p) continue;
    region r = regions[i];
    regions[i] = regions[--n_regions];
    pthread_mutex_unlock(&lock);
    munmap(r.base, r.bytes);
    close(r.fd);
    return true;
  }
  pthread_mutex_unlock(&lock);
  return false;
}

bool net_hostmem_find(const void *p, size_t len, net_hostmem_ref *ref) {
  const char *c = p;
  if (!c) return false;
  bool found = false;
  pthread_mutex_lock(&lock);
  for (size_t i = 0; i < n_regions && !found; i++) {
    const region *r = &regions[i];
    if (c < r->base || c > r->base + r->bytes || len > (size_t)(r->base + r->bytes - c)) continue;
    *ref = (net_hostmem_ref){r->serial, (uint64_t)(c - r->base), r->bytes, r->fd};
    found = true;
  }
  pthread_mutex_unlock(&lock);
  return found;
}

td_status net_hostmem_map_peer(pid_t pid, const net_hostmem_ref *ref, void **base_out) {
  *base_out = NULL;
  char path[64], link[160], want[64];
  snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)pid, (int)ref->fd);
  /* The link reads "/memfd:tandem-mem-<pid>-<serial> (deleted)". */
  ssize_t n = readlink(path, link, sizeof link - 1);
  if (n < 0)
    return td_error_errno("cannot inspect %s (process %d's shared buffer; is it another user's, or is /proc "
                          "hidden?)",
                          path, (int)pid);
  link[n] = '\0';
  region_name(want, sizeof want, pid, ref->serial);
  const char *colon = strchr(link, ':');
  size_t wl = strlen(want);
  if (strncmp(link, "/memfd:", 7) != 0 || !colon || strncmp(colon + 1, want, wl) != 0 ||
      (colon[1 + wl] != '\0' && colon[1 + wl] != ' '))
    return td_error(TD_ERR_INTERNAL, "%s is '%s', not the shared buffer %s that process %d published", path, link,
                    want, (int)pid);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return td_error_errno("cannot open %s (process %d's shared buffer)", path, (int)pid);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    td_status s = td_error_errno("fstat on %s failed", path);
    close(fd);
    return s;
  }
  if (st.st_uid != geteuid()) {
    close(fd);
    return td_error(TD_ERR_INVALID_ARGUMENT, "refusing process %d's shared buffer %s: it belongs to uid %u, not %u",
                    (int)pid, want, (unsigned)st.st_uid, (unsigned)geteuid());
  }
  if (ref->bytes == 0 || ref->bytes > (uint64_t)SIZE_MAX / 2 || ref->offset > ref->bytes) {
    close(fd);
    return td_error(TD_ERR_INVALID_ARGUMENT, "refusing process %d's shared buffer %s: published size %" PRIu64
                    " and offset %" PRIu64 " are out of bounds", (int)pid, want, ref->bytes, ref->offset);
  }
  if ((uint64_t)st.st_size != ref->bytes) {
    close(fd);
    return td_error(TD_ERR_INTERNAL, "process %d's shared buffer %s has %lld bytes, expected %" PRIu64, (int)pid,
                    want, (long long)st.st_size, ref->bytes);
  }
  void *addr = mmap(NULL, ref->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd); /* the mapping keeps the pages */
  if (addr == MAP_FAILED)
    return td_error_errno("cannot map process %d's shared buffer (%" PRIu64 " bytes)", (int)pid, ref->bytes);
  *base_out = addr;
  return TD_OK;
}
