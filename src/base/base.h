/* src/base: the layer every other layer stands on. Status helpers and check
 * macros, logging to stderr, TANDEM_* environment tunables, clocks, aligned
 * allocation, growing text buffers, futex waits, and the reduction kernels
 * used by collectives.
 * Needs nothing beyond libc and pthreads. */
#ifndef TD_BASE_INTERNAL_H
#define TD_BASE_INTERNAL_H

#define _GNU_SOURCE 1
#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "tandem/base.h"

/* ---- errors ---- */

/* Format a message into the thread-local buffer read by td_last_error(), and
 * return `status` so that callers can write `return td_error(...)`. */
td_status td_error(td_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* As td_error, appending ": strerror(errno)" and returning TD_ERR_SYSTEM. */
td_status td_error_errno(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Copy the thread-local message into buf (always NUL-terminated). */
void td_error_copy(char *buf, size_t size);

/* Evaluate a td_status expression; return it from the caller on failure. */
#define TD_CHECK(expr)                 \
  do {                                 \
    td_status td_check_s_ = (expr);    \
    if (td_check_s_ != TD_OK)          \
      return td_check_s_;              \
  } while (0)

/* Evaluate a td_status expression into `st`; jump to `label` on failure. */
#define TD_CHECK_GOTO(expr, st, label) \
  do {                                 \
    (st) = (expr);                     \
    if ((st) != TD_OK)                 \
      goto label;                      \
  } while (0)

/* Run a system call that returns -1 on error, retrying on EINTR. */
#define TD_SYSCALL_RETRY(result, call) \
  do {                                 \
    (result) = (call);                 \
  } while ((result) == -1 && errno == EINTR)

/* ---- logging (stderr; never stdout) ---- */
typedef enum { TD_LOG_ERROR = 0, TD_LOG_WARN = 1, TD_LOG_INFO = 2, TD_LOG_DEBUG = 3 } td_log_level;
/* Level from TANDEM_LOG (error|warn|info|debug), default warn. */
td_log_level td_log_threshold(void);
void td_log(td_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define TD_LOG_ENABLED(level) ((level) <= td_log_threshold())
#define TD_WARN(...) td_log(TD_LOG_WARN, __VA_ARGS__)
#define TD_INFO(...) \
  do { if (TD_LOG_ENABLED(TD_LOG_INFO)) td_log(TD_LOG_INFO, __VA_ARGS__); } while (0)
#define TD_DEBUG(...) \
  do { if (TD_LOG_ENABLED(TD_LOG_DEBUG)) td_log(TD_LOG_DEBUG, __VA_ARGS__); } while (0)
/* Prefix for log lines, e.g. "rank 3"; set once by the communicator. */
void td_log_set_prefix(const char *prefix);

/* ---- environment tunables ----
 * Readers of TANDEM_* variables outside the communicator (whose settings
 * src/comm/core/tunables.c reads once and refuses when malformed). Here a
 * malformed value is reported once as a warning and the default is used.
 * docs/environment.md lists every TANDEM_* variable; tests/docs/check_docs.py
 * finds them in the code by their string literals and fails when one is
 * missing there. */
long td_env_long(const char *name, long default_value);
double td_env_double(const char *name, double default_value);
const char *td_env_str(const char *name, const char *default_value);
/* Byte sizes accept suffixes: 64K, 25M, 1G (powers of 1024). */
size_t td_env_size(const char *name, size_t default_value);
/* Parse a byte size string like "25M"; returns 0 on success, -1 for text
 * that is not a size or a size that does not fit size_t. */
int td_parse_size(const char *text, size_t *out);

/* ---- clocks ---- */
double td_now(void);       /* monotonic seconds */
uint64_t td_now_ns(void);  /* monotonic nanoseconds */
double td_wall_time(void); /* seconds since the epoch */
/* Seconds since this process started (the kernel's start time in
 * /proc/self/stat, so it counts the exec and the dynamic loader too);
 * -1 if that cannot be read. For log lines that break a start down. */
double td_process_age(void);

/* ---- memory ---- */
#define TD_ALIGN 64
/* Aligned (64 B) allocation; returns NULL on failure (and sets td_last_error). */
void *td_alloc(size_t bytes);
void *td_calloc(size_t bytes);
void td_free(void *p);

/* ---- growing text buffers (text.c) ----
 * Start from td_buf b = {0}; append and print into it without checking each
 * call: out of memory sets b->failed and every later call does nothing.
 * data is NUL-terminated whenever it is not NULL. td_buf_take hands the
 * contents to the caller (free() them; NULL if anything failed, after
 * freeing them) and empties the buffer; td_buf_free drops them. */
typedef struct td_buf {
  char *data;
  size_t len, cap;
  int failed;
} td_buf;
void td_buf_append(td_buf *b, const void *bytes, size_t n);
void td_buf_printf(td_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void td_buf_vprintf(td_buf *b, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));
char *td_buf_take(td_buf *b, size_t *len_out);
void td_buf_free(td_buf *b);
/* Append what is left of f, up to EOF or until b->len passes max_bytes
 * (then the caller refuses the file: a config read that never ends is not a
 * config). Returns 0, or -1 on a read error (ferror) or out of memory
 * (b->failed); the caller opens and closes f and words the error. */
int td_buf_append_file(td_buf *b, FILE *f, size_t max_bytes);

/* ---- blocking waits on shared words (futex) ----
 * Wait while *word == expected, at most timeout_s seconds (negative: forever).
 * `shared`: the word lives in memory shared between processes. Returns 0 when
 * woken or the value changed, ETIMEDOUT on timeout, EINTR on a signal. */
int td_futex_wait(_Atomic uint32_t *word, uint32_t expected, double timeout_s, bool shared);
void td_futex_wake(_Atomic uint32_t *word, int n_waiters, bool shared);

/* ---- yielding the CPU in a busy-wait (yield.c) ----
 * td_yield_timed: sched_yield, timed; false when the yield kept the caller
 * off its core long enough to show a loaded machine, and then no yields
 * (td_yield_allowed false) for half a second: a spinning wait should sleep
 * at once instead. *off_until belongs to the caller (one per transport),
 * starts at 0, and may be shared by its threads. */
bool td_yield_allowed(const _Atomic uint64_t *off_until);
bool td_yield_timed(_Atomic uint64_t *off_until);

/* ---- CPU level of the SIMD kernels (cpu.c) ----
 * The library is compiled for baseline x86-64; the kernels in the Makefile's
 * KERNEL_SRCS are compiled once per level and chosen at run time. The level
 * is decided once per process, on first use: the highest the CPU and its OS
 * support (cpuid and XCR0), or TANDEM_CPU=generic|avx2|avx512|avx512bf16|auto. A
 * TANDEM_CPU naming an unknown level or one this CPU lacks is refused:
 * td_cpu_check returns TD_ERR_INVALID_ARGUMENT with the reason (the calls
 * that create models and communicators return it), and td_cpu_active is
 * then generic, so that no kernel ever runs an instruction the CPU lacks. */
/* avx512bf16: avx512 plus AVX512-BF16 (vdpbf16ps), which only the bf16
 * matrix products use (src/nn/matmul_bf16.c); below it they round to bf16
 * and multiply in f32 (the same products, slower). */
typedef enum td_cpu_level {
  TD_CPU_GENERIC = 0,
  TD_CPU_AVX2 = 1,
  TD_CPU_AVX512 = 2,
  TD_CPU_AVX512BF16 = 3,
  TD_CPU_LEVELS = 4
} td_cpu_level;
td_cpu_level td_cpu_supported(void); /* the highest level this CPU and OS run */
td_cpu_level td_cpu_active(void);    /* the level the kernels use; never above td_cpu_supported */
td_status td_cpu_check(void);        /* TD_OK, or the error refusing TANDEM_CPU (td_last_error) */
const char *td_cpu_level_name(td_cpu_level level); /* "generic", "avx2", "avx512", "avx512bf16" */
/* TANDEM_CPU's parser, separate for the tests: text NULL, empty or "auto"
 * gives `supported`; a level name gives that level unless it is above
 * `supported`; anything else is TD_ERR_INVALID_ARGUMENT with a message in err. */
td_status td_cpu_parse(const char *text, td_cpu_level supported, td_cpu_level *out, char *err, size_t err_size);

/* ---- reduction kernels ----
 * dst[i] = op(dst[i], src[i]) for i < count. For f16/bf16 the arithmetic is in
 * f32 and rounded once per call. TD_AVG reduces as TD_SUM: callers divide once
 * at the end with td_reduce_scale. Integer SUM/PROD wrap modulo 2^bits;
 * floating MIN/MAX return the canonical quiet NaN if either operand is NaN
 * and order -0 below +0, so they are commutative bit for bit (reduce.c). */
void td_reduce_inplace(void *dst, const void *src, size_t count, td_dtype dtype, td_op op);
/* dst[i] = op over k of srcs[k][i], k < n_srcs (n_srcs >= 1), combined in
 * the order srcs[0], srcs[1], ... dst may be the same memory as srcs[0] or
 * srcs[1], not a later source (dst holds the first partial result before
 * sources 2.. are folded in); no partial overlap. f16/bf16 accumulate all
 * inputs in f32 and round once. */
void td_reduce_multi(void *dst, const void *const *srcs, int n_srcs, size_t count, td_dtype dtype, td_op op);
/* The same reduction written to every dsts[j] (j < n_dsts) in one pass, as
 * the direct shm allreduce writes every rank's buffer. A dst may be the same
 * memory as a src (in place); partial overlaps are not allowed. */
void td_reduce_fanout(void *const *dsts, int n_dsts, const void *const *srcs, int n_srcs, size_t count,
                      td_dtype dtype, td_op op);
/* f16/bf16 <-> f32 for the collectives that carry half-precision partial
 * results in f32 (src/comm/select/select.c): dst[i] = (float)src[i], and dst[i] =
 * round(src[i] / divisor) with one rounding to the half type (divisor <= 1:
 * no division). Same conversions, NaNs included, as td_f16_to_f32 etc. */
void td_reduce_half_to_f32(float *dst, const void *src, size_t count, td_dtype dtype);
void td_reduce_f32_to_half(void *dst, const float *src, size_t count, td_dtype dtype, int divisor);
/* buf[i] /= divisor, the finishing step of TD_AVG (integers: the wrapped sum
 * divided with C's truncation toward zero). */
void td_reduce_scale(void *buf, size_t count, td_dtype dtype, int divisor);

/* ---- little-endian integers in byte buffers ----
 * The wire formats (the store protocol, authentication, sealed records) and
 * file headers (safetensors) are little-endian whatever the host's order. */
static inline void td_put_le32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static inline void td_put_le64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static inline uint32_t td_get_le32(const unsigned char *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
  return v;
}
static inline uint64_t td_get_le64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

/* ---- misc ---- */
#define TD_MIN(a, b) ((a) < (b) ? (a) : (b))
#define TD_MAX(a, b) ((a) > (b) ? (a) : (b))
#define TD_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
/* snprintf that never overflows and always terminates; returns bytes written. */
size_t td_strlcpy(char *dst, const char *src, size_t size);
/* A random 64-bit value from the OS (getrandom), for unique names. */
uint64_t td_random_u64(void);

#endif
