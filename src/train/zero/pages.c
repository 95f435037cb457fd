/* ZeRO's memory: arenas on transparent huge pages (the granule in which
 * stage 2's gradient arena and stage 3's parameter arena give memory back,
 * and the optimizer-state shards of stages 1-3: zero_state_alloc), giving
 * pages back (zero_release) and measuring what a rank holds (zero_measure).
 * Below shard.c, reduce.c and fetch.c, which all release and measure.
 *
 * Why. Stages 2 and 3 give back the pages of what a rank does not keep
 * (gradients of a reduced bucket it does not own, parameters of a released
 * layer) and fault them in again the next step. With 4 KiB pages that is
 * one fault per 4 KiB, and on this class of machine (a VM) a fault costs
 * 15-40 us whatever the page holds: measured, re-faulting 8 MiB costs
 * 36-45 ms of CPU with 4 KiB pages (private or memfd alike) and 0.6 ms on
 * 2 MiB pages, zeroing included. At the reference GPT that was a third of
 * stage 2's CPU time (docs/zero.md, "Huge pages").
 *
 * How. An arena whose shard spans at least two huge pages is reserved
 * 2 MiB-aligned as private anonymous memory with MADV_HUGEPAGE (THP
 * "madvise" mode honours it), and every release is rounded INWARD to whole
 * 2 MiB granules: a granule partly needed stays (splitting it would bring
 * the 4 KiB faults back for all its pages). So a rank holds its shard plus
 * at most one granule on each side of it and of each range in flight,
 * which td_trainer_estimate_memory counts (estimate.c). Shared memory
 * (memfd) cannot have huge pages here (shmem THP is a system setting,
 * "never" on Debian's default), so these arenas leave the host-shared
 * memory: their collectives stage through the shm segment instead of
 * reading the peers' arenas directly, which costs less than the faults it
 * saves (bench/results/, docs/benchmarks.md). Small arenas (a shard under two huge
 * pages, the tests' models) keep 4 KiB granules and the host-shared path.
 *
 * TANDEM_ZERO_HUGE_PAGES=off forces 4 KiB granules and optimizer-state
 * pages (for comparisons);
 * auto (the default) uses huge pages where THP is available. */
#include "train/zero/zero.h"
#include "train/offload/offload.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define ZERO_HUGE_BYTES ((size_t)2 << 20)

size_t zero_page_bytes(void) {
  long page = sysconf(_SC_PAGESIZE);
  return page > 0 ? (size_t)page : 4096;
}

/* THP usable by madvise: "[always]" or "[madvise]" selected. */
static bool thp_available(void) {
#ifdef MADV_HUGEPAGE
  FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  if (!f) return false;
  char line[128] = {0};
  bool ok = fgets(line, sizeof line, f) && (strstr(line, "[always]") || strstr(line, "[madvise]"));
  fclose(f);
  return ok;
#else
  return false;
#endif
}

/* TANDEM_ZERO_HUGE_PAGES allows huge pages (auto, the default) or not (off). */
static td_status huge_allowed(bool *out) {
  *out = false;
  const char *env = getenv("TANDEM_ZERO_HUGE_PAGES");
  if (env && *env && strcmp(env, "auto") != 0) {
    if (strcmp(env, "off") == 0) return TD_OK;
    return td_error(TD_ERR_INVALID_ARGUMENT, "ZeRO stage 1-3: TANDEM_ZERO_HUGE_PAGES=%s: use auto (the default) or off", env);
  }
  *out = thp_available();
  return TD_OK;
}

td_status zero_granule_bytes(size_t n_params, int world, size_t *out) {
  *out = zero_page_bytes();
  bool huge = false;
  TD_CHECK(huge_allowed(&huge));
  size_t off, shard = 0;
  td_shard_range(n_params, world > 0 ? world : 1, 0, &off, &shard); /* rank 0's is the largest */
  if (world > 1 && shard * sizeof(float) >= 2 * ZERO_HUGE_BYTES && huge) *out = ZERO_HUGE_BYTES;
  return TD_OK;
}

td_status zero_vector_granule(size_t bytes, size_t *out) {
  *out = zero_page_bytes();
  bool huge = false;
  TD_CHECK(huge_allowed(&huge));
  if (huge && bytes >= 2 * ZERO_HUGE_BYTES) *out = ZERO_HUGE_BYTES;
  return TD_OK;
}

/* Optimizer-state shards: allocated once and streamed whole by every step's
 * update, so they are never given back; huge pages save their first-touch
 * faults (one per 2 MiB instead of per 4 KiB: 3,300 per rank at the
 * reference GPT on 2 ranks, bench/results/zperf-2026-11-26*.md) and the TLB
 * misses of the update, as stage 0's arenas do (trainer.c). 2 MiB-aligned
 * through the C allocator, so td_free frees it; only the whole huge pages
 * inside are advised, the tail stays on 4 KiB pages and costs no more than
 * the shard. */
td_status zero_state_alloc(size_t n_floats, float **out) {
  size_t bytes = (n_floats ? n_floats : 1) * sizeof(float);
  bool huge = false;
  TD_CHECK(huge_allowed(&huge));
  huge = huge && bytes >= 2 * ZERO_HUGE_BYTES;
  void *p = NULL;
  if (huge) {
    if (posix_memalign(&p, ZERO_HUGE_BYTES, bytes) != 0) p = NULL;
#ifdef MADV_HUGEPAGE
    if (p) (void)madvise(p, bytes / ZERO_HUGE_BYTES * ZERO_HUGE_BYTES, MADV_HUGEPAGE); /* before the first touch */
#endif
  } else {
    p = td_alloc(bytes);
  }
  if (!p) return td_error(TD_ERR_SYSTEM, "out of memory for an optimizer-state shard of %zu floats", n_floats);
  memset(p, 0, bytes);
  *out = p;
  return TD_OK;
}

static size_t round_up(size_t x, size_t g) { return (x + g - 1) / g * g; }

float *zero_reserve(size_t bytes, size_t granule) {
  size_t len = round_up(bytes ? bytes : 1, granule);
  size_t extra = granule > zero_page_bytes() ? granule : 0; /* room to align to the granule */
  char *p = mmap(NULL, len + extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return NULL;
  if (extra) {
    char *a = (char *)(((uintptr_t)p + granule - 1) & ~(uintptr_t)(granule - 1));
    /* keep exactly [a, a + len): the arena's last granule counts as whole */
    if (a > p) munmap(p, (size_t)(a - p));
    if (a + len < p + len + extra) munmap(a + len, (size_t)(p + len + extra - (a + len)));
    p = a;
#ifdef MADV_HUGEPAGE
    (void)madvise(p, len, MADV_HUGEPAGE); /* before the first touch; a hint only */
#endif
  }
  return (float *)p;
}

void zero_unreserve(float *p, size_t bytes, size_t granule) {
  if (p) munmap(p, round_up(bytes ? bytes : 1, granule));
}

/* Release the whole granules (pages, or huge pages: above) inside arena
 * range [lo, hi); the arena's last granule counts as whole (the mapping
 * ends with it). Shared arenas always have 4 KiB granules. */
static void release_pages(const zero_state *z, float *arena, zero_mem_kind kind, size_t n_total, size_t lo,
                          size_t hi) {
  size_t pf = kind == ZERO_MEM_MAPPED ? z->granule_floats : z->page_floats;
  uintptr_t base = (uintptr_t)arena;
  /* arena offsets of page boundaries: the arena itself is page-aligned (mmap) */
  size_t p0 = (lo + pf - 1) / pf * pf, p1 = hi >= n_total ? (hi + pf - 1) / pf * pf : hi / pf * pf;
  if (p1 > p0)
    (void)madvise((void *)(base + p0 * sizeof(float)), (p1 - p0) * sizeof(float),
                  kind == ZERO_MEM_SHARED ? MADV_REMOVE : MADV_DONTNEED);
}

void zero_release(const td_trainer *t, float *arena, size_t lo, size_t hi) {
  const zero_state *z = t->zero;
  if (!z || hi <= lo) return;
  zero_mem_kind kind = arena == t->params ? z->params_kind : z->grads_kind;
  /* pages are given back only where that is the point: stage 2+ gradients, stage 3 parameters */
  if (kind != ZERO_MEM_MAPPED && kind != ZERO_MEM_SHARED) return;
  if (arena == t->params ? z->stage < 3 : z->stage < 2 || z->keep_grads) return;
  /* never the shard: it is this rank's copy (unless its copy is on disk) */
  size_t a = t->shard_lo, b = t->shard_hi;
  if (arena == t->params && offload_params_on_disk(t)) a = b = 0;
  if (b <= lo || a >= hi || a == b) {
    release_pages(z, arena, kind, t->n_params, lo, hi);
    return;
  }
  if (lo < a) release_pages(z, arena, kind, t->n_params, lo, a);
  if (b < hi) release_pages(z, arena, kind, t->n_params, b, hi);
}

/* Resident bytes of the region [p, p + bytes): mincore over the pages it
 * touches, counted only for the part of each page inside the region (a
 * region from the C allocator need not start or end on a page). A region
 * mincore cannot see (not a mapping) counts whole. */
size_t zero_resident_bytes(const void *p, size_t bytes) {
  if (!p || bytes == 0) return 0;
  const size_t page = zero_page_bytes();
  const uintptr_t lo = (uintptr_t)p, hi = lo + bytes, first = lo / page * page;
  size_t n_pages = (hi - first + page - 1) / page, resident = 0;
  unsigned char vec[4096];
  for (size_t k = 0; k < n_pages; k += sizeof vec) {
    size_t m = TD_MIN(sizeof vec, n_pages - k);
    uintptr_t base = first + k * page;
    if (mincore((void *)base, m * page, vec) != 0) return bytes;
    for (size_t i = 0; i < m; i++) {
      if (!(vec[i] & 1)) continue;
      uintptr_t a = TD_MAX(base + i * page, lo), b = TD_MIN(base + (i + 1) * page, hi);
      resident += b - a;
    }
  }
  return resident;
}

size_t zero_model_state_resident(const td_trainer *t) {
  const size_t f = sizeof(float);
  size_t bytes = zero_resident_bytes(t->params, t->n_params * f) + zero_resident_bytes(t->grads, t->n_params * f);
  if (offload_states_on_disk(t)) {
    /* the optimizer state lives in files; RAM holds the tile buffers */
    bytes += zero_resident_bytes(t->offload->buffers, td_offload_buffer_bytes(&t->cfg, t->shard_hi - t->shard_lo));
  } else {
    for (int i = 0; i < t->n_states; i++)
      bytes += zero_resident_bytes(t->states[i], (t->states_hi - t->states_lo) * f);
  }
  return bytes;
}

void zero_measure(td_trainer *t) {
  zero_state *z = t->zero;
  if (!z || !z->measuring) return;
  size_t bytes = zero_model_state_resident(t);
  if (bytes > z->peak_bytes) z->peak_bytes = bytes;
}
