/* Tandem public API: status codes, element types and reduction operators.
 *
 * Every Tandem function that can fail returns a td_status. Where its message
 * goes (the one rule, for every function):
 *
 *  1. td_last_error(): every call that fails leaves its message in a buffer
 *     of the calling thread, whatever the cause (bad argument, misuse,
 *     system, store, a peer's failure, a file). This is always the place to
 *     look right after a failed call, as ncclGetLastError() in NCCL. It is
 *     overwritten only by this thread's next failing call. td_test()'s
 *     TD_ERR_IN_PROGRESS is not a failure and leaves it alone.
 *  2. td_comm_last_error(comm): a call that was given a communicator (a
 *     collective, td_send/td_recv, their td_i* forms and td_wait/td_test on
 *     their requests, td_comm_split, td_comm_finalize) and failed also leaves
 *     the same message on the communicator, readable from any thread:
 *     - once the communicator is broken (td_comm_status() != TD_OK: a peer
 *       died, ranks disagreed, a timeout, td_comm_abort), the message of that
 *       first, sticky failure, never replaced afterwards;
 *     - before that, the latest failure of a call on it that did not break it
 *       (a bad argument, a call after finalize), like errno: meaningful after
 *       a failed call, not cleared by later successful ones;
 *     - "" if no call on it has failed.
 *     A call that creates a communicator (td_comm_init*) and fails has no
 *     communicator to record it on: its message is only in td_last_error(). */
#ifndef TANDEM_BASE_H
#define TANDEM_BASE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum td_status {
  TD_OK = 0,
  TD_ERR_INVALID_ARGUMENT = 1, /* a bad value was passed: null buffer, unknown dtype, root out of range */
  TD_ERR_INVALID_USAGE = 2,    /* a call in the wrong state: communicator finalized, request reused */
  TD_ERR_SYSTEM = 3,           /* an OS call failed (errno is in the message) */
  TD_ERR_REMOTE = 4,           /* another rank died, closed its connection, or aborted */
  TD_ERR_MISMATCH = 5,         /* ranks disagree on a collective (op, dtype, count, root or order) */
  TD_ERR_TIMEOUT = 6,          /* an operation did not finish within TANDEM_TIMEOUT seconds */
  TD_ERR_IN_PROGRESS = 7,      /* td_test: the request has not completed yet */
  TD_ERR_INTERNAL = 8,         /* a bug in Tandem: please report with the message */
  TD_ERR_IO = 9,               /* a file could not be read or written, or is corrupt */
} td_status;

/* A short constant name for a status ("invalid argument", "remote error", ...). */
const char *td_status_str(td_status status);

/* The CPU level the library's SIMD kernels run at in this process:
 * "generic" (any x86-64), "avx2" (AVX2, FMA, F16C) or "avx512" (AVX-512
 * F/BW/DQ/VL). The highest this CPU supports unless TANDEM_CPU says
 * otherwise; "generic" when TANDEM_CPU was refused (docs/environment.md). */
const char *td_cpu_kernel_level(void);

/* The message of the latest failed call made by this thread (rule 1 above).
 * Never NULL; "" if none. */
const char *td_last_error(void);

typedef enum td_dtype {
  TD_F32 = 0,
  TD_F64 = 1,
  TD_F16 = 2,  /* IEEE half; reductions accumulate in f32 */
  TD_BF16 = 3, /* bfloat16; reductions accumulate in f32 */
  TD_I32 = 4,
  TD_I64 = 5,
  TD_U8 = 6,
  TD_DTYPE_COUNT
} td_dtype;

/* Reduction semantics, the same on every algorithm and transport, and every
 * rank gets the same bits (docs/collectives.md, "Reductions"):
 * - Integer SUM and PROD wrap around modulo 2^bits (two's complement), never
 *   undefined; TD_AVG on integers is that wrapped sum divided by the number
 *   of ranks, truncated toward zero (C's integer division).
 * - Floating MIN and MAX: if any rank's element is a NaN the result is NaN
 *   (the canonical quiet NaN: f32 0x7fc00000, f64 0x7ff8000000000000, f16
 *   0x7e00, bf16 0x7fc0; with one rank the input comes back unchanged), and
 *   -0 counts as smaller than +0.
 * - Floating SUM and PROD follow IEEE 754 (a NaN input gives a NaN).
 * - f16 and bf16 are accumulated in f32 and rounded to the half type once
 *   (TD_AVG divides in f32 first); TANDEM_HALF_PARTIALS=half trades that for
 *   half the bytes on the wire, rounding at every hop. */
typedef enum td_op {
  TD_SUM = 0,
  TD_AVG = 1, /* sum divided by the number of ranks (integers: wrapped sum, truncated division) */
  TD_MIN = 2,
  TD_MAX = 3,
  TD_PROD = 4,
  TD_OP_COUNT
} td_op;

/* Size in bytes of one element, or 0 for an unknown dtype. */
size_t td_dtype_size(td_dtype dtype);
/* "f32", "bf16", ...; "?" for an unknown value. */
const char *td_dtype_name(td_dtype dtype);
const char *td_op_name(td_op op);
/* Parse "f32", "float32", "bf16", ... / "sum", "avg", ...; return 0 on success, -1 if unknown. */
int td_dtype_parse(const char *name, td_dtype *out);
int td_op_parse(const char *name, td_op *out);

/* Half-precision conversions (round to nearest even), usable by any layer. */
float td_f16_to_f32(uint16_t h);
uint16_t td_f32_to_f16(float f);
float td_bf16_to_f32(uint16_t h);
uint16_t td_f32_to_bf16(float f);

/* Element i of a buffer of `dtype`, widened to double (NaN for an unknown
 * dtype), and the reverse, rounding or wrapping as a store of that type does.
 * For checks and tools, not hot loops. */
double td_dtype_get(const void *buf, size_t i, td_dtype dtype);
void td_dtype_set(void *buf, size_t i, td_dtype dtype, double value);

/* a op b for one pair of values, as the reduction combines them (TD_AVG
 * combines as TD_SUM; the division comes once at the end). For reference
 * results in checks and tools. */
double td_op_apply(td_op op, double a, double b);

/* The shard of `count` elements owned by `rank` of `n`: the first (count % n)
 * ranks own one extra element. Used by reduce-scatter, allgather and ZeRO. */
void td_shard_range(size_t count, int n, int rank, size_t *offset_out, size_t *len_out);

#ifdef __cplusplus
}
#endif
#endif
