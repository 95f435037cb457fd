/* POSIX shared-memory segments for ranks on one host. Names carry 64 random
 * bits so that concurrent jobs never collide; the memory is reserved up front
 * (posix_fallocate) so that a full /dev/shm is a clear error at creation
 * instead of a SIGBUS in the middle of a collective. */
#include "net/net.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; older kernels answer EINVAL */
#endif

static td_status reserve_error(const char *name, size_t size, int err) {
  return td_error(TD_ERR_SYSTEM,
                  "cannot reserve %zu bytes for shared-memory segment %s: %s (is /dev/shm full or too small? "
                  "check `df -h /dev/shm`; in Docker raise --shm-size)",
                  size, name, strerror(err));
}

td_status net_shm_populate(void *addr, size_t bytes) {
  uintptr_t lo = (uintptr_t)addr & ~(uintptr_t)4095, hi = ((uintptr_t)addr + bytes + 4095) & ~(uintptr_t)4095;
  if (bytes == 0 || madvise((void *)lo, hi - lo, MADV_POPULATE_WRITE) == 0) return TD_OK;
  return reserve_error("(mapped)", hi - lo, errno);
}

td_status net_shm_create(const char *tag, size_t size, char *name_out, size_t name_size, void **addr_out) {
  bool lazy;
  return net_shm_create_partial(tag, size, size, name_out, name_size, addr_out, &lazy);
}

td_status net_shm_create_partial(const char *tag, size_t size, size_t reserve, char *name_out, size_t name_size,
                                 void **addr_out, bool *lazy) {
  *lazy = false;
  if (size == 0) return td_error(TD_ERR_INVALID_ARGUMENT, "shared-memory segment size must be > 0");
  if (reserve == 0 || reserve > size) reserve = size;
  /* Keep the tag to characters that are safe in a file name under /dev/shm. */
  char clean_tag[48];
  size_t j = 0;
  for (const char *p = tag ? tag : "seg"; *p && j + 1 < sizeof clean_tag; p++) {
    char c = *p;
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
              c == '.';
    clean_tag[j++] = ok ? c : '_';
  }
  clean_tag[j] = '\0';
  char name[128];
  int fd = -1;
  for (int attempt = 0; attempt < 8 && fd < 0; attempt++) {
    snprintf(name, sizeof name, "/tandem-%s-%016llx", clean_tag, (unsigned long long)td_random_u64());
    fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0 && errno != EEXIST) return td_error_errno("shm_open(%s) failed", name);
  }
  if (fd < 0) return td_error(TD_ERR_SYSTEM, "could not find a free shared-memory name for tag '%s'", clean_tag);
  if (strlen(name) >= name_size) {
    close(fd);
    shm_unlink(name);
    return td_error(TD_ERR_INVALID_ARGUMENT, "shared-memory name %s does not fit in %zu bytes", name, name_size);
  }
  if (ftruncate(fd, (off_t)size) != 0) {
    td_status st = td_error_errno("cannot size shared-memory segment %s to %zu bytes", name, size);
    close(fd);
    shm_unlink(name);
    return st;
  }
  int err = posix_fallocate(fd, 0, (off_t)reserve);
  if (err != 0 && err != EOPNOTSUPP && err != EINVAL) {
    close(fd);
    shm_unlink(name);
    return reserve_error(name, reserve, err);
  }
  void *addr = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (addr == MAP_FAILED) {
    td_status st = td_error_errno("cannot map shared-memory segment %s (%zu bytes)", name, size);
    close(fd);
    shm_unlink(name);
    return st;
  }
  if (reserve < size) {
    /* The rest is reserved piece by piece through net_shm_populate, if this
     * kernel has it (tried on the first page, already allocated). */
    *lazy = madvise(addr, 4096, MADV_POPULATE_WRITE) == 0;
    err = *lazy ? 0 : posix_fallocate(fd, (off_t)reserve, (off_t)(size - reserve));
    if (err != 0 && err != EOPNOTSUPP && err != EINVAL) {
      munmap(addr, size);
      close(fd);
      shm_unlink(name);
      return reserve_error(name, size, err);
    }
  }
  close(fd); /* the mapping keeps the memory */
  td_strlcpy(name_out, name, name_size);
  *addr_out = addr;
  return TD_OK;
}

td_status net_shm_open(const char *name, size_t size, void **addr_out) {
  /* The name comes through the store: only a segment net_shm_create could
   * have made ("/tandem-...", no further '/') is ever opened. */
  if (!name || strncmp(name, "/tandem-", 8) != 0 || strchr(name + 1, '/') || strlen(name) > 120 || size == 0)
    return td_error(TD_ERR_INVALID_ARGUMENT, "refusing shared-memory segment '%s' (%zu bytes): not a Tandem "
                    "segment name", name ? name : "(null)", size);
  int fd = shm_open(name, O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0);
  if (fd < 0)
    return td_error_errno("cannot open shared-memory segment %s (was its creator killed before everyone mapped it?)",
                          name);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    td_status s = td_error_errno("fstat on shared-memory segment %s failed", name);
    close(fd);
    return s;
  }
  /* Made by this user with mode 0600 (net_shm_create) and exactly the size
   * announced: anything else is another user's, or was tampered with. */
  if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077) || (uint64_t)st.st_size != size) {
    close(fd);
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "refusing shared-memory segment %s: owner uid %u, mode %04o, %lld bytes; expected a regular "
                    "segment of uid %u, mode 0600, %zu bytes (another user's segment, or tampered with)",
                    name, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777), (long long)st.st_size,
                    (unsigned)geteuid(), size);
  }
  void *addr = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (addr == MAP_FAILED) {
    td_status s = td_error_errno("cannot map shared-memory segment %s (%zu bytes)", name, size);
    close(fd);
    return s;
  }
  close(fd);
  *addr_out = addr;
  return TD_OK;
}

void net_shm_unlink(const char *name) {
  if (name && *name) (void)shm_unlink(name);
}

void net_shm_unmap(void *addr, size_t size) {
  if (addr && size) (void)munmap(addr, size);
}
