/* tandem-bench: collective benchmarks reported the way nccl-tests does.
 *
 *   tandemrun -np N tandem-bench {allreduce|reduce_scatter|allgather|broadcast|alltoall}
 *       [-b MINBYTES] [-e MAXBYTES] [-f FACTOR] [-n ITERS] [-w WARMUP] [-c 0|1]
 *       [-d DTYPE] [-o OP] [-i 0|1] [-r ROOT] [-T MAXBYTES_PER_SIZE] [-D DEVICE]
 *
 * -D cuda[:N] puts the buffers in device memory (td_device_alloc): the
 * collective then runs on Tandem's device path (NCCL, or staged through
 * pinned host memory: src/comm/device); inputs are filled and results
 * checked in host mirrors copied to and from the device outside the timing.
 * Compare its busbw with the same command without -D (host buffers).
 *
 * Rank 0 prints '#' comment lines (world, transport, TANDEM_* settings, the
 * command, the time td_comm_init took on the slowest rank), a '#' header
 * naming the columns, then one row per size:
 *
 *   size_bytes count dtype redop time_us algbw_GBs busbw_GBs wrong
 *
 * size_bytes is the whole buffer (for alltoall: all blocks of one rank, as
 * nccl-tests does) and count its elements. time_us is the mean time of one
 * call on the slowest rank (a max-reduction over ranks). algbw = size/time;
 * busbw applies nccl-tests' factors: allreduce 2(n-1)/n, reduce_scatter,
 * allgather and alltoall (n-1)/n, broadcast 1. With -c 1 each size first runs
 * one call on deterministic inputs and counts, over all ranks, the elements
 * that differ from the closed-form result ("wrong"); inputs are small
 * integers so that every dtype represents sums and products exactly (for up
 * to 16 ranks), and only avg on floating types may differ by one rounding.
 *
 * Large sizes run fewer iterations (at most -T bytes moved per rank per size,
 * default 2 GiB, but never fewer than 5) so that every size takes bounded
 * time. Exits non-zero if any element was wrong or any call failed (the
 * failing rank prints td_comm_last_error to stderr). */
#include "base/base.h"
#include "tandem/tandem.h"
#include "tandem/device.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern char **environ;

typedef enum bench_kind { B_ALLREDUCE, B_REDUCE_SCATTER, B_ALLGATHER, B_BROADCAST, B_ALLTOALL } bench_kind;

static const struct {
  const char *name;
  bench_kind kind;
} kinds[] = {
    {"allreduce", B_ALLREDUCE}, {"reduce_scatter", B_REDUCE_SCATTER}, {"allgather", B_ALLGATHER},
    {"broadcast", B_BROADCAST}, {"alltoall", B_ALLTOALL},
};

typedef struct bench_opts {
  bench_kind kind;
  const char *kind_name;
  size_t min_bytes, max_bytes, max_total_bytes;
  double factor;
  int iters, warmup, check, in_place, root, shared;
  td_dtype dtype;
  td_op op;
  const char *device_spec; /* -D: NULL for host buffers */
  td_device device;
} bench_opts;

static void usage(FILE *f) {
  fprintf(f,
          "usage: tandem-bench {allreduce|reduce_scatter|allgather|broadcast|alltoall}\n"
          "         [-b MINBYTES] [-e MAXBYTES] [-f FACTOR] [-n ITERS] [-w WARMUP] [-c 0|1]\n"
          "         [-d DTYPE] [-o OP] [-i 0|1] [-r ROOT] [-T MAXBYTES_PER_SIZE] [-R 0|1]\n"
          "  sizes take K/M/G suffixes (powers of 1024); defaults: -b 8 -e 64M -f 2 -n 20 -w 5 -c 1\n"
          "  -d f32|f64|f16|bf16|i32|i64|u8 (f32), -o sum|avg|min|max|prod (sum), -i 1: in place,\n"
          "  -r broadcast root (0), -T cap on bytes per rank per size, which lowers -n for large sizes (2G)\n"
          "  -R 1: buffers from td_mem_alloc (host-shared, as a training job's gradients; default),\n"
          "     -R 0: from malloc (what a caller with its own buffers gets)\n"
          "  -D cuda[:N]: buffers in device memory (the device collective path); default: host\n"
          "  run it under tandemrun, e.g. tandemrun -np 2 tandem-bench allreduce -b 4K -e 256M -f 4\n");
}

static int parse_int_arg(const char *flag, const char *text, int lo, int *out) {
  char *end;
  long v = strtol(text, &end, 10);
  if (*text == '\0' || *end || v < lo || v > 1000000000) {
    fprintf(stderr, "tandem-bench: %s %s: expected an integer >= %d\n", flag, text, lo);
    return -1;
  }
  *out = (int)v;
  return 0;
}

static int parse_args(int argc, char **argv, bench_opts *o) {
  memset(o, 0, sizeof *o);
  o->min_bytes = 8;
  o->max_bytes = 64u << 20;
  o->max_total_bytes = (size_t)2 << 30;
  o->factor = 2;
  o->iters = 20;
  o->warmup = 5;
  o->check = 1;
  o->shared = 1;
  o->dtype = TD_F32;
  o->op = TD_SUM;
  if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? -1 : 1;
  }
  o->kind_name = NULL;
  for (size_t k = 0; k < TD_ARRAY_SIZE(kinds); k++)
    if (!strcmp(argv[1], kinds[k].name)) {
      o->kind = kinds[k].kind;
      o->kind_name = kinds[k].name;
    }
  if (!o->kind_name) {
    fprintf(stderr, "tandem-bench: unknown collective '%s'\n", argv[1]);
    usage(stderr);
    return -1;
  }
  for (int a = 2; a < argc; a++) {
    const char *flag = argv[a];
    if (flag[0] != '-' || flag[1] == '\0' || flag[2] != '\0' || a + 1 >= argc) {
      fprintf(stderr, "tandem-bench: unexpected argument '%s'\n", flag);
      usage(stderr);
      return -1;
    }
    const char *val = argv[++a];
    switch (flag[1]) {
    case 'b': case 'e': case 'T': {
      size_t v;
      if (td_parse_size(val, &v)) {
        fprintf(stderr, "tandem-bench: %s %s: expected a byte size such as 4096, 64K, 256M\n", flag, val);
        return -1;
      }
      if (flag[1] == 'b') o->min_bytes = v;
      else if (flag[1] == 'e') o->max_bytes = v;
      else o->max_total_bytes = v;
      break;
    }
    case 'f': {
      char *end;
      o->factor = strtod(val, &end);
      if (*end || !(o->factor > 1.0)) {
        fprintf(stderr, "tandem-bench: -f %s: expected a factor > 1\n", val);
        return -1;
      }
      break;
    }
    case 'n': if (parse_int_arg(flag, val, 1, &o->iters)) return -1; break;
    case 'w': if (parse_int_arg(flag, val, 0, &o->warmup)) return -1; break;
    case 'c': if (parse_int_arg(flag, val, 0, &o->check)) return -1; break;
    case 'i': if (parse_int_arg(flag, val, 0, &o->in_place)) return -1; break;
    case 'R': if (parse_int_arg(flag, val, 0, &o->shared)) return -1; break;
    case 'r': if (parse_int_arg(flag, val, 0, &o->root)) return -1; break;
    case 'D':
      if (td_device_parse(val, &o->device) != TD_OK) {
        fprintf(stderr, "tandem-bench: -D %s: %s\n", val, td_last_error());
        return -1;
      }
      o->device_spec = val;
      break;
    case 'd':
      if (td_dtype_parse(val, &o->dtype)) {
        fprintf(stderr, "tandem-bench: -d %s: expected f32, f64, f16, bf16, i32, i64 or u8\n", val);
        return -1;
      }
      break;
    case 'o':
      if (td_op_parse(val, &o->op)) {
        fprintf(stderr, "tandem-bench: -o %s: expected sum, avg, min, max or prod\n", val);
        return -1;
      }
      break;
    default:
      fprintf(stderr, "tandem-bench: unknown option '%s'\n", flag);
      usage(stderr);
      return -1;
    }
  }
  if (o->min_bytes == 0) {
    fprintf(stderr, "tandem-bench: -b 0: sizes start at 1 byte or more (the smallest row holds one element)\n");
    return -1;
  }
  if (o->min_bytes > o->max_bytes) {
    fprintf(stderr, "tandem-bench: -b %zu is larger than -e %zu\n", o->min_bytes, o->max_bytes);
    return -1;
  }
  if (o->kind == B_ALLTOALL && o->in_place) {
    fprintf(stderr, "tandem-bench: alltoall has no in-place form; drop -i 1\n");
    return -1;
  }
  return 0;
}

/* ---- element values: every value used here is a small integer, exact in
 * every dtype (buffers are read and written with td_dtype_get/set) ---- */

static bool dtype_is_float(td_dtype d) { return d == TD_F32 || d == TD_F64 || d == TD_F16 || d == TD_BF16; }

/* Input of a reduction on `rank` at element i: 1..11 (sum/avg/min/max) or
 * 1/2 (prod, at most one rank in three holds a 2 at any index). */
static double red_input(int rank, size_t i, td_op op) {
  if (op == TD_PROD) return ((i + (size_t)rank) % 3 == 0) ? 2 : 1;
  return (double)(1 + (i * 7 + (size_t)rank * 3) % 11);
}

/* The reduction over all ranks at element i, rounded as the library must. */
static double red_expected(int n, size_t i, td_op op, td_dtype dtype) {
  double acc = red_input(0, i, op);
  for (int r = 1; r < n; r++) {
    double v = red_input(r, i, op);
    acc = td_op_apply((td_op)op, acc, v);
  }
  if (dtype == TD_U8) acc = (double)((uint64_t)acc & 0xff); /* u8 arithmetic wraps */
  if (op == TD_AVG) {
    if (dtype == TD_F64) acc = acc / n;
    else if (dtype_is_float(dtype)) acc = (double)((float)acc / (float)n); /* f16/bf16 divide in f32 */
    else acc = (double)((int64_t)acc / n);
  }
  /* Round to the dtype as storing would. */
  uint8_t tmp[8];
  td_dtype_set(tmp, 0, dtype, acc);
  return td_dtype_get(tmp, 0, dtype);
}

/* Non-reduction payloads: values 0..250, exact in every dtype. */
static double gather_value(size_t i) { return (double)((i * 13 + 5) % 251); }
static double a2a_value(int src, int dst, size_t i) {
  return (double)(((size_t)src * 31 + (size_t)dst * 17 + i * 3) % 251);
}

static bool elem_ok(double got, double want, td_dtype dtype, td_op op, bool reduction) {
  if (got == want) return true;
  if (!reduction || op != TD_AVG || !dtype_is_float(dtype)) return false;
  /* avg on floats: the library may scale by a reciprocal (one extra rounding). */
  double eps = dtype == TD_F64 ? 0x1p-52 : dtype == TD_F32 ? 0x1p-23 : dtype == TD_F16 ? 0x1p-10 : 0x1p-7;
  return fabs(got - want) <= 2 * eps * fabs(want);
}

/* Buffers of one size: `send` and `recv` hold elements as documented in
 * tandem/comm.h; with in_place, the op reads and writes `recv`. */
typedef struct bench_bufs {
  void *send, *recv;
  void *dev_send, *dev_recv; /* -D: the device buffers the collective runs on; send/recv mirror them */
  size_t count;      /* the count argument of the call */
  size_t elems;      /* elements of the whole buffer reported (alltoall: count * n) */
  size_t send_elems, recv_elems;
} bench_bufs;

static void fill_inputs(const bench_opts *o, bench_bufs *b, int rank, int n) {
  size_t off = 0, len = 0;
  switch (o->kind) {
  case B_ALLREDUCE:
    for (size_t i = 0; i < b->count; i++) td_dtype_set(o->in_place ? b->recv : b->send, i, o->dtype, red_input(rank, i, o->op));
    if (!o->in_place) memset(b->recv, 0xff, b->recv_elems * td_dtype_size(o->dtype));
    break;
  case B_REDUCE_SCATTER: {
    void *in = o->in_place ? b->recv : b->send; /* in place: the full buffer is recv */
    for (size_t i = 0; i < b->count; i++) td_dtype_set(in, i, o->dtype, red_input(rank, i, o->op));
    if (!o->in_place) memset(b->recv, 0xff, b->recv_elems * td_dtype_size(o->dtype));
    break;
  }
  case B_ALLGATHER:
    memset(b->recv, 0xff, b->recv_elems * td_dtype_size(o->dtype));
    td_shard_range(b->count, n, rank, &off, &len);
    if (o->in_place) {
      for (size_t i = 0; i < len; i++) td_dtype_set(b->recv, off + i, o->dtype, gather_value(off + i));
    } else {
      for (size_t i = 0; i < len; i++) td_dtype_set(b->send, i, o->dtype, gather_value(off + i));
    }
    break;
  case B_BROADCAST:
    if (rank == o->root) {
      for (size_t i = 0; i < b->count; i++) td_dtype_set(b->recv, i, o->dtype, gather_value(i));
    } else {
      memset(b->recv, 0xff, b->count * td_dtype_size(o->dtype));
    }
    break;
  case B_ALLTOALL:
    for (int dst = 0; dst < n; dst++)
      for (size_t i = 0; i < b->count; i++)
        td_dtype_set(b->send, (size_t)dst * b->count + i, o->dtype, a2a_value(rank, dst, i));
    memset(b->recv, 0xff, b->recv_elems * td_dtype_size(o->dtype));
    break;
  }
}

/* red_input depends on i only through i % 11 and i % 3, so the expected
 * value of element i is that of i % RED_PERIOD: computing it once per
 * residue keeps the check O(count) per rank instead of O(count x n), which
 * at 256 ranks was seconds of the job. */
#define RED_PERIOD 33

static int64_t count_wrong(const bench_opts *o, const bench_bufs *b, int rank, int n) {
  int64_t wrong = 0;
  size_t off = 0, len = 0;
  double want[RED_PERIOD];
  if (o->kind == B_ALLREDUCE || o->kind == B_REDUCE_SCATTER)
    for (size_t i = 0; i < RED_PERIOD; i++) want[i] = red_expected(n, i, o->op, o->dtype);
  switch (o->kind) {
  case B_ALLREDUCE:
    for (size_t i = 0; i < b->count; i++)
      if (!elem_ok(td_dtype_get(b->recv, i, o->dtype), want[i % RED_PERIOD], o->dtype, o->op, true)) wrong++;
    break;
  case B_REDUCE_SCATTER:
    td_shard_range(b->count, n, rank, &off, &len);
    for (size_t i = 0; i < len; i++) {
      size_t at = o->in_place ? off + i : i; /* in place: the shard stays at its offset in the full buffer */
      if (!elem_ok(td_dtype_get(b->recv, at, o->dtype), want[(off + i) % RED_PERIOD], o->dtype, o->op, true))
        wrong++;
    }
    break;
  case B_ALLGATHER:
  case B_BROADCAST:
    for (size_t i = 0; i < b->count; i++)
      if (td_dtype_get(b->recv, i, o->dtype) != gather_value(i)) wrong++;
    break;
  case B_ALLTOALL:
    for (int src = 0; src < n; src++)
      for (size_t i = 0; i < b->count; i++)
        if (td_dtype_get(b->recv, (size_t)src * b->count + i, o->dtype) != a2a_value(src, rank, i)) wrong++;
    break;
  }
  return wrong;
}

/* One call of the benchmarked collective on the prepared buffers. */
static td_status run_once(const bench_opts *o, bench_bufs *b, td_comm *comm, int rank, int n) {
  switch (o->kind) {
  case B_ALLREDUCE:
    return td_allreduce(o->in_place ? b->recv : b->send, b->recv, b->count, o->dtype, o->op, comm);
  case B_REDUCE_SCATTER: {
    if (!o->in_place) return td_reduce_scatter(b->send, b->recv, b->count, o->dtype, o->op, comm);
    size_t off, len;
    td_shard_range(b->count, n, rank, &off, &len);
    return td_reduce_scatter(b->recv, (char *)b->recv + off * td_dtype_size(o->dtype), b->count, o->dtype, o->op,
                             comm);
  }
  case B_ALLGATHER: {
    if (!o->in_place) return td_allgather(b->send, b->recv, b->count, o->dtype, comm);
    size_t off, len;
    td_shard_range(b->count, n, rank, &off, &len);
    return td_allgather((char *)b->recv + off * td_dtype_size(o->dtype), b->recv, b->count, o->dtype, comm);
  }
  case B_BROADCAST:
    return td_broadcast(b->recv, b->count, o->dtype, o->root, comm);
  case B_ALLTOALL:
    return td_alltoall(b->send, b->recv, b->count, o->dtype, comm);
  }
  return TD_ERR_INVALID_ARGUMENT;
}

static double busbw_factor(bench_kind kind, int n) {
  switch (kind) {
  case B_ALLREDUCE: return 2.0 * (n - 1) / n;
  case B_REDUCE_SCATTER: case B_ALLGATHER: case B_ALLTOALL: return (double)(n - 1) / n;
  case B_BROADCAST: return 1.0;
  }
  return 1.0;
}

/* Buffer layout for `bytes` requested bytes; sizes round down to whole
 * elements (and whole blocks for alltoall), never below one element. */
static void plan_size(const bench_opts *o, size_t bytes, int n, bench_bufs *b) {
  size_t es = td_dtype_size(o->dtype);
  memset(b, 0, sizeof *b);
  if (o->kind == B_ALLTOALL) {
    b->count = bytes / (es * (size_t)n);
    if (b->count == 0) b->count = 1;
    b->elems = b->count * (size_t)n;
    b->send_elems = b->recv_elems = b->elems;
    return;
  }
  b->count = bytes / es;
  if (b->count == 0) b->count = 1;
  b->elems = b->count;
  switch (o->kind) {
  case B_ALLREDUCE: b->send_elems = b->recv_elems = b->count; break;
  case B_REDUCE_SCATTER:
    b->send_elems = b->count;
    b->recv_elems = o->in_place ? b->count : b->count / (size_t)n + 1;
    break;
  case B_ALLGATHER:
    b->send_elems = b->count / (size_t)n + 1;
    b->recv_elems = b->count;
    break;
  case B_BROADCAST: b->send_elems = 0; b->recv_elems = b->count; break;
  default: break;
  }
  if (o->in_place) b->send_elems = 0;
}

static void *bench_alloc(const bench_opts *o, size_t bytes) {
  if (!o->shared) return td_alloc(bytes);
  void *p = NULL;
  return td_mem_alloc(bytes ? bytes : 1, &p) == TD_OK ? p : NULL;
}

static void bench_free(const bench_opts *o, void *p) {
  if (o->shared)
    td_mem_free(p);
  else
    td_free(p);
}

/* -D: the buffers the collective runs on (device), and copies between them
 * and the host mirrors that fill_inputs/count_wrong use. */
static bench_bufs on_device(const bench_bufs *b) {
  bench_bufs d = *b;
  d.send = b->dev_send;
  d.recv = b->dev_recv;
  return d;
}

static td_status mirror(const bench_opts *o, bench_bufs *b, bool to_device) {
  td_device host = {TD_DEVICE_CPU, 0};
  size_t es = td_dtype_size(o->dtype);
  if (to_device) {
    if (b->send_elems) TD_CHECK(td_device_copy(b->dev_send, o->device, b->send, host, b->send_elems * es));
    return td_device_copy(b->dev_recv, o->device, b->recv, host, b->recv_elems * es);
  }
  return td_device_copy(b->recv, host, b->dev_recv, o->device, b->recv_elems * es);
}

static int fail_call(td_comm *comm, int rank, const char *what, td_status st) {
  fprintf(stderr, "tandem-bench: rank %d: %s failed: %s: %s\n", rank, what, td_status_str(st),
          comm ? td_comm_last_error(comm) : td_last_error());
  return 1;
}

static void print_preamble(const bench_opts *o, td_comm *comm, int argc, char **argv, double init_s) {
  int n = td_comm_size(comm);
  printf("# tandem-bench %s: world %d ranks (%d on this host), transport %s\n", o->kind_name, n,
         td_comm_local_size(comm), td_comm_transport(comm));
  printf("# dtype %s, op %s, %s, check %s, iters %d (at most %zu bytes per rank per size), warmup %d\n",
         td_dtype_name(o->dtype), td_op_name(o->op), o->in_place ? "in place" : "out of place",
         o->check ? "on" : "off", o->iters, o->max_total_bytes, o->warmup);
  if (o->device_spec)
    printf("# buffers: device %s (td_device_alloc, -D); inputs and checks through host copies\n", o->device_spec);
  else
    printf("# buffers: %s\n", o->shared ? "host-shared (td_mem_alloc, -R 1)" : "malloc (-R 0)");
  /* Settings that choose transports and algorithms, so that a row can be
   * reproduced; per-rank identity variables are left out. */
  printf("# env:");
  int any = 0;
  for (char **e = environ; *e; e++) {
    if (strncmp(*e, "TANDEM_", 7)) continue;
    static const char *skip[] = {"TANDEM_RANK=", "TANDEM_LOCAL_RANK=", "TANDEM_WORLD_SIZE=", "TANDEM_LOCAL_SIZE=",
                                 "TANDEM_STORE=", "TANDEM_JOB_ID=",
                                 /* never into a log: the job's secret */
                                 "TANDEM_SECRET=", "TANDEM_SECRET_FILE="};
    int skipped = 0;
    for (size_t k = 0; k < TD_ARRAY_SIZE(skip); k++)
      if (!strncmp(*e, skip[k], strlen(skip[k]))) skipped = 1;
    if (skipped) continue;
    printf(" %s", *e);
    any = 1;
  }
  printf("%s\n", any ? "" : " (no TANDEM_* settings: defaults)");
  printf("# init: td_comm_init took %.3f s on the slowest rank\n", init_s);
  printf("# command:");
  for (int a = 0; a < argc; a++) printf(" %s", argv[a]);
  printf("\n# busbw = algbw * %s; time_us: mean per call on the slowest rank\n",
         o->kind == B_ALLREDUCE ? "2(n-1)/n" : o->kind == B_BROADCAST ? "1" : "(n-1)/n");
  printf("# %10s %12s %5s %5s %12s %10s %10s %6s\n", "size_bytes", "count", "dtype", "redop", "time_us",
         "algbw_GBs", "busbw_GBs", "wrong");
  fflush(stdout);
}

int main(int argc, char **argv) {
  bench_opts o;
  int pr = parse_args(argc, argv, &o);
  if (pr) return pr > 0 ? 0 : 2;

  td_comm *comm = NULL;
  double init_start = td_now();
  td_status st = td_comm_init(&comm);
  double init_s = td_now() - init_start;
  if (st != TD_OK) {
    fprintf(stderr, "tandem-bench: td_comm_init failed: %s: %s\n", td_status_str(st), td_last_error());
    return 1;
  }
  int rank = td_comm_rank(comm), n = td_comm_size(comm);
  if (o.device_spec && (st = td_device_open(o.device)) != TD_OK) {
    fprintf(stderr, "tandem-bench: rank %d: -D %s: %s\n", rank, o.device_spec, td_last_error());
    td_comm_destroy(comm);
    return 2;
  }
  if (o.kind == B_BROADCAST && o.root >= n) {
    if (rank == 0) fprintf(stderr, "tandem-bench: -r %d: root must be below the world size %d\n", o.root, n);
    td_comm_destroy(comm);
    return 2;
  }
  /* Start-up cost: td_comm_init on the slowest rank (which includes waiting
   * for the last rank to be started). */
  if ((st = td_allreduce(&init_s, &init_s, 1, TD_F64, TD_MAX, comm)) != TD_OK) {
    int rc = fail_call(comm, rank, "allreduce of the init time", st);
    td_comm_destroy(comm);
    return rc;
  }
  if (rank == 0) print_preamble(&o, comm, argc, argv, init_s);

  int rc = 0;
  int64_t total_wrong = 0;
  size_t es = td_dtype_size(o.dtype);
  for (double want = (double)o.min_bytes; want <= (double)o.max_bytes * (1 + 1e-9); want *= o.factor) {
    size_t bytes = (size_t)want;
    bench_bufs b;
    plan_size(&o, bytes, n, &b);
    b.send = b.send_elems ? bench_alloc(&o, b.send_elems * es) : NULL;
    b.recv = bench_alloc(&o, b.recv_elems * es);
    if ((b.send_elems && !b.send) || !b.recv) {
      fprintf(stderr, "tandem-bench: rank %d: cannot allocate %zu bytes: %s\n", rank, (b.send_elems + b.recv_elems) * es,
              td_last_error());
      rc = 1;
      bench_free(&o, b.send);
      bench_free(&o, b.recv);
      break;
    }
    if (o.device_spec &&
        ((b.send_elems && td_device_alloc(o.device, b.send_elems * es, &b.dev_send) != TD_OK) ||
         td_device_alloc(o.device, b.recv_elems * es, &b.dev_recv) != TD_OK)) {
      fprintf(stderr, "tandem-bench: rank %d: -D %s: %s\n", rank, o.device_spec, td_last_error());
      rc = 1;
      goto size_done;
    }
    fill_inputs(&o, &b, rank, n);
    if (o.device_spec && (st = mirror(&o, &b, true)) != TD_OK) { rc = fail_call(NULL, rank, "copy to the device", st); goto size_done; }
    bench_bufs run = o.device_spec ? on_device(&b) : b;

    int64_t wrong = 0;
    if (o.check) {
      if ((st = run_once(&o, &run, comm, rank, n)) != TD_OK) { rc = fail_call(comm, rank, o.kind_name, st); goto size_done; }
      if (o.device_spec && (st = mirror(&o, &b, false)) != TD_OK) { rc = fail_call(NULL, rank, "copy from the device", st); goto size_done; }
      wrong = count_wrong(&o, &b, rank, n);
      if ((st = td_allreduce(&wrong, &wrong, 1, TD_I64, TD_SUM, comm)) != TD_OK) {
        rc = fail_call(comm, rank, "allreduce of the error count", st);
        goto size_done;
      }
    }

    size_t moved = b.elems * es;
    int iters = o.iters, warmup = o.warmup;
    if (moved > 0 && (double)moved * iters > (double)o.max_total_bytes) {
      iters = (int)(o.max_total_bytes / moved);
      if (iters < 5) iters = 5;
      if (iters > o.iters) iters = o.iters;
    }
    if (warmup > iters) warmup = iters;
    for (int w = 0; w < warmup; w++)
      if ((st = run_once(&o, &run, comm, rank, n)) != TD_OK) { rc = fail_call(comm, rank, o.kind_name, st); goto size_done; }
    if ((st = td_barrier(comm)) != TD_OK) { rc = fail_call(comm, rank, "barrier", st); goto size_done; }
    double t0 = td_now();
    for (int it = 0; it < iters; it++)
      if ((st = run_once(&o, &run, comm, rank, n)) != TD_OK) { rc = fail_call(comm, rank, o.kind_name, st); goto size_done; }
    double per_call = (td_now() - t0) / iters;
    if ((st = td_allreduce(&per_call, &per_call, 1, TD_F64, TD_MAX, comm)) != TD_OK) {
      rc = fail_call(comm, rank, "allreduce of the timings", st);
      goto size_done;
    }
    total_wrong += wrong;
    if (rank == 0) {
      double algbw = (double)moved / per_call / 1e9;
      printf("  %10zu %12zu %5s %5s %12.2f %10.3f %10.3f %6lld\n", moved, b.elems, td_dtype_name(o.dtype),
             (o.kind == B_ALLREDUCE || o.kind == B_REDUCE_SCATTER) ? td_op_name(o.op) : "none", per_call * 1e6, algbw,
             algbw * busbw_factor(o.kind, n), (long long)wrong);
      fflush(stdout);
    }
  size_done:
    bench_free(&o, b.send);
    bench_free(&o, b.recv);
    if (o.device_spec) {
      td_device_free(o.device, b.dev_send);
      td_device_free(o.device, b.dev_recv);
    }
    if (rc) break;
  }

  if (rc == 0) {
    st = td_comm_finalize(comm);
    if (st != TD_OK) rc = fail_call(comm, rank, "td_comm_finalize", st);
  }
  if (rank == 0 && rc == 0) {
    printf("# %s: %lld wrong elements in all\n", total_wrong ? "FAILED" : "ok", (long long)total_wrong);
    fflush(stdout);
  }
  td_comm_destroy(comm);
  if (total_wrong) rc = 1;
  return rc;
}
