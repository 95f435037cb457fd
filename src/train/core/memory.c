/* The memory a rank may use, and what it holds now: what the trainer
 * compares its estimate with before allocating (trainer.c refuses a job
 * that cannot fit, offload_config.c sizes the knobs the user left unset)
 * and watches during the run (a rank nearing its limit says so before the
 * kernel's OOM killer acts, which gives no message and saves nothing).
 *
 * The job's memory on this host is the least of:
 *   MemAvailable (/proc/meminfo)  what the kernel can give without swapping;
 *   the cgroup's limit            memory.max (v2; the least over the cgroup's
 *                                 ancestors) or memory.limit_in_bytes (v1),
 *                                 less what the cgroup already holds;
 *   TANDEM_MEMORY_LIMIT=SIZE      the job's memory on this host, set by the
 *                                 user or a test ("off": no limit at all).
 * The ranks of the host are measured at the same point of their start (a
 * collective follows before anyone allocates), each holding about what this
 * process holds now, so what they already hold is added back and the total
 * divided among them. Linux only; elsewhere nothing is known (no check). */
#include "train/core/core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "Key:   123 kB" of a /proc file, in bytes; 0 when absent. */
static size_t proc_kb(const char *path, const char *key) {
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  char line[256];
  size_t klen = strlen(key), value = 0;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, key, klen) == 0 && line[klen] == ':') {
      value = (size_t)strtoull(line + klen + 1, NULL, 10) * 1024;
      break;
    }
  fclose(f);
  return value;
}

size_t td_mem_pss(void) {
  size_t pss = proc_kb("/proc/self/smaps_rollup", "Pss");
  return pss ? pss : proc_kb("/proc/self/status", "VmRSS"); /* kernels before 4.14: the RSS, an upper bound */
}

size_t td_mem_rss(size_t *peak_out) {
  if (peak_out) *peak_out = proc_kb("/proc/self/status", "VmHWM");
  return proc_kb("/proc/self/status", "VmRSS");
}

/* A number in a cgroup file; 0 for "max", absent or unreadable. */
static size_t read_number(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  char buf[64] = {0};
  size_t value = 0;
  if (fgets(buf, sizeof buf, f) && buf[0] >= '0' && buf[0] <= '9') value = (size_t)strtoull(buf, NULL, 10);
  fclose(f);
  return value;
}

/* The tightest limit over cgroup `path` (under `mount`) and its ancestors
 * (a parent's limit binds its children), with the usage of the cgroup that
 * sets it; false when none is set. */
static bool cgroup_walk(const char *mount, char *path, const char *limit_file, const char *usage_file, size_t *limit,
                        size_t *usage, char *where, size_t cap) {
  char dir[1024], file[1100];
  bool found = false;
  for (;;) {
    snprintf(dir, sizeof dir, "%s%s", mount, strcmp(path, "/") == 0 ? "" : path);
    snprintf(file, sizeof file, "%s/%s", dir, limit_file);
    size_t l = read_number(file);
    if (l && l < ((size_t)1 << 60) && (!found || l < *limit)) { /* v1 says "no limit" with a huge number */
      found = true;
      *limit = l;
      snprintf(file, sizeof file, "%s/%s", dir, usage_file);
      *usage = read_number(file);
      snprintf(where, cap, "cgroup %s/%s", dir, limit_file);
    }
    char *slash = strrchr(path, '/');
    if (!slash || slash == path) break;
    *slash = 0;
  }
  return found;
}

/* This process's cgroup limit: v2 (the unified hierarchy, mounted at
 * /sys/fs/cgroup or, on hybrid systems, /sys/fs/cgroup/unified) or v1's
 * memory controller; the tighter when both are set. */
static bool cgroup_limit(size_t *limit, size_t *usage, char *where, size_t cap) {
  FILE *f = fopen("/proc/self/cgroup", "r");
  if (!f) return false;
  char line[1024], v2[768] = "", v1[768] = "";
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = 0;
    char *first = strchr(line, ':'), *path = first ? strchr(first + 1, ':') : NULL;
    if (!path) continue;
    path++;
    if (strncmp(line, "0::", 3) == 0) td_strlcpy(v2, path, sizeof v2);
    else if (strstr(line, ":memory:")) td_strlcpy(v1, path, sizeof v1);
  }
  fclose(f);
  size_t l = 0, u = 0;
  char w[1200], p[768];
  bool found = false;
  static const char *const v2_mounts[] = {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"};
  for (int i = 0; i < 2 && v2[0]; i++) {
    td_strlcpy(p, v2, sizeof p);
    if (cgroup_walk(v2_mounts[i], p, "memory.max", "memory.current", &l, &u, w, sizeof w) && (!found || l < *limit)) {
      found = true, *limit = l, *usage = u;
      td_strlcpy(where, w, cap);
    }
  }
  td_strlcpy(p, v1, sizeof p);
  if (v1[0] && cgroup_walk("/sys/fs/cgroup/memory", p, "memory.limit_in_bytes", "memory.usage_in_bytes", &l, &u, w,
                           sizeof w) && (!found || l < *limit)) {
    found = true, *limit = l, *usage = u;
    td_strlcpy(where, w, cap);
  }
  return found;
}

td_status td_mem_room_get(int local_ranks, td_mem_room *out) {
  memset(out, 0, sizeof *out);
  out->local_ranks = local_ranks < 1 ? 1 : local_ranks;
  const char *env = td_env_str("TANDEM_MEMORY_LIMIT", NULL);
  if (env && strcmp(env, "off") == 0) return TD_OK; /* host_bytes 0: no limit */
  size_t own = td_mem_rss(NULL), held = own * (size_t)out->local_ranks;
  size_t best = 0;
  char where[1200];
  size_t avail = proc_kb("/proc/meminfo", "MemAvailable");
  if (avail) {
    best = avail + held;
    snprintf(out->source, sizeof out->source, "MemAvailable %zu MiB", avail >> 20);
  }
  size_t limit = 0, usage = 0;
  if (cgroup_limit(&limit, &usage, where, sizeof where)) {
    /* what the cgroup holds beyond this job's ranks is not ours */
    size_t others = usage > held ? usage - held : 0, room = limit > others ? limit - others : 0;
    if (!best || room < best) {
      best = room;
      snprintf(out->source, sizeof out->source, "%.300s %zu MiB (%zu MiB in use)", where, limit >> 20, usage >> 20);
    }
  }
  if (env && *env) {
    size_t l = 0;
    if (td_parse_size(env, &l) != 0 || l == 0)
      return td_error(TD_ERR_INVALID_ARGUMENT, "TANDEM_MEMORY_LIMIT=%s: expected a byte size such as 8G or 512M (the "
                      "job's memory on each host), or \"off\"", env);
    if (!best || l < best) {
      best = l;
      snprintf(out->source, sizeof out->source, "TANDEM_MEMORY_LIMIT %zu MiB", l >> 20);
    }
  }
  out->host_bytes = best;
  out->rank_bytes = best / (size_t)out->local_ranks;
  return TD_OK;
}
