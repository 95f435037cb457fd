/* src/device: device names, the CPU backend, and the CUDA backend wherever
 * one is built, through the public API only (include/tandem/device.h).
 *
 * Runs in every tree. What it checks depends on the build, which the test
 * knows from the same -DTD_HAVE_CUDA the library was compiled with:
 *   - built without CUDA: asking for cuda fails, saying the build lacks it;
 *   - built with CUDA, no usable GPU (CI with the toolkit: no driver, so
 *     cudaGetDeviceCount fails): the message says there is no device and
 *     gives the runtime's reason;
 *   - a GPU (the GPU machine) or the emulator's pretend GPUs
 *     (TANDEM_CUDAEMU_DEVICES=N): memory, copies, streams and events on
 *     cuda:0, and "cuda:N asked, M visible".
 * TD_TEST_EXPECT_CUDA=N makes the visible count part of the test (a suite
 * line that must exercise the CUDA path cannot pass by finding none).
 * Data is checked byte for byte against patterns computed here. */
#include "../common/check.h"
#include "tandem/device.h"

#include <stdbool.h>
#include <stdint.h>

static const td_device CPU = {TD_DEVICE_CPU, 0};

/* byte i of pattern `seed` */
static unsigned char pattern(size_t i, unsigned seed) { return (unsigned char)((i * 131u + seed * 7u + 1u) & 0xff); }

static void fill(unsigned char *p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) p[i] = pattern(i, seed);
}

static void check_pattern(const unsigned char *p, size_t n, unsigned seed, const char *what) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != pattern(i, seed)) td_test_fail(__FILE__, __LINE__, "%s: byte %zu of %zu is %u, expected %u", what, i,
                                               n, p[i], pattern(i, seed));
}

static void check_zero(const unsigned char *p, size_t n, const char *what) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != 0) td_test_fail(__FILE__, __LINE__, "%s: byte %zu of %zu is %u, expected 0", what, i, n, p[i]);
}

static const size_t SIZES[] = {0, 1, 3, 63, 64, 65, 4097, (1u << 20) + 5};
#define N_SIZES (sizeof SIZES / sizeof SIZES[0])

static void test_parse(void) {
  td_device d;
  CHECK_OK(td_device_parse("cpu", &d));
  CHECK_EQ_INT(d.kind, TD_DEVICE_CPU);
  CHECK_EQ_INT(d.index, 0);
  CHECK_OK(td_device_parse("cuda", &d));
  CHECK_EQ_INT(d.kind, TD_DEVICE_CUDA);
  CHECK_EQ_INT(d.index, 0);
  CHECK_OK(td_device_parse("cuda:0", &d));
  CHECK_EQ_INT(d.index, 0);
  CHECK_OK(td_device_parse("cuda:7", &d));
  CHECK_EQ_INT(d.kind, TD_DEVICE_CUDA);
  CHECK_EQ_INT(d.index, 7);
  CHECK_OK(td_device_parse("cuda:1023", &d));
  CHECK_EQ_INT(d.index, 1023);
  CHECK_OK(td_device_parse("cuda:007", &d));
  CHECK_EQ_INT(d.index, 7);

  static const char *const bad[] = {"", "gpu", "CUDA", "Cpu", "cpu:0", "cuda:", "cuda:-1", "cuda:+1", "cuda: 1",
                                    "cuda:1x", "cuda:0x1", "cuda:1024", "cuda:99999999999999999999", "cuda0",
                                    " cuda", "cuda "};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    d = (td_device){TD_DEVICE_CUDA, 42};
    CHECK_MSG(td_device_parse(bad[i], &d), TD_ERR_INVALID_ARGUMENT, "use cpu, cuda or cuda:N");
    char quoted[64];
    snprintf(quoted, sizeof quoted, "\"%s\"", bad[i]);
    CHECK_MSG(td_device_parse(bad[i], &d), TD_ERR_INVALID_ARGUMENT, quoted);
  }
  CHECK_MSG(td_device_parse(NULL, &d), TD_ERR_INVALID_ARGUMENT, "use cpu, cuda or cuda:N");
  CHECK_STATUS(td_device_parse("cpu", NULL), TD_ERR_INVALID_ARGUMENT);

  char buf[16];
  CHECK(strcmp(td_device_name(CPU, buf, sizeof buf), "cpu") == 0);
  CHECK(strcmp(td_device_name((td_device){TD_DEVICE_CUDA, 12}, buf, sizeof buf), "cuda:12") == 0);
  char tiny[4];
  CHECK(strcmp(td_device_name((td_device){TD_DEVICE_CUDA, 12}, tiny, sizeof tiny), "cud") == 0);
}

/* Memory, copies and memset on one device (the CPU, or a GPU), through host
 * buffers that this test fills and reads itself. */
static void test_memory(td_device dev) {
  char name[16];
  td_device_name(dev, name, sizeof name);
  for (size_t k = 0; k < N_SIZES; k++) {
    size_t n = SIZES[k];
    void *a = NULL, *b = NULL;
    CHECK_OK(td_device_alloc(dev, n, &a));
    CHECK_OK(td_device_alloc(dev, n, &b));
    CHECK(a != NULL && b != NULL && a != b);
    if (dev.kind == TD_DEVICE_CPU) CHECK_EQ_INT((uintptr_t)a % 64, 0);
    td_device where = td_pointer_device(a);
    CHECK_EQ_INT(where.kind, dev.kind);
    CHECK_EQ_INT(where.index, dev.index);

    unsigned char *host = malloc(n + 1), *back = malloc(n + 1);
    CHECK(host && back);
    fill(host, n, (unsigned)k);
    CHECK_OK(td_device_copy(a, dev, host, CPU, n));   /* host -> dev */
    CHECK_OK(td_device_copy(b, dev, a, dev, n));      /* dev -> dev */
    memset(back, 0xAB, n + 1);
    CHECK_OK(td_device_copy(back, CPU, b, dev, n));   /* dev -> host */
    check_pattern(back, n, (unsigned)k, name);
    CHECK_EQ_INT(back[n], 0xAB); /* nothing written past n */

    /* zero the middle third of b and read all of it back */
    size_t lo = n / 3, len = n - 2 * (n / 3);
    CHECK_OK(td_device_memset0(dev, (char *)b + lo, len));
    CHECK_OK(td_device_sync(dev));
    CHECK_OK(td_device_copy(back, CPU, b, dev, n));
    check_pattern(back, lo, (unsigned)k, "before the zeroed range");
    check_zero(back + lo, len, "zeroed range");
    for (size_t i = lo + len; i < n; i++) CHECK_EQ_INT(back[i], pattern(i, (unsigned)k));

    free(host);
    free(back);
    td_device_free(dev, a);
    td_device_free(dev, b);
  }
  td_device_free(dev, NULL);
  /* 0 bytes: nothing to do, even with NULL pointers */
  CHECK_OK(td_device_copy(NULL, dev, NULL, CPU, 0));
  CHECK_OK(td_device_memset0(dev, NULL, 0));
  CHECK_MSG(td_device_copy(NULL, dev, "x", CPU, 1), TD_ERR_INVALID_ARGUMENT, "dst is NULL");
  CHECK_MSG(td_device_copy(name, CPU, NULL, dev, 1), TD_ERR_INVALID_ARGUMENT, "src is NULL");
  CHECK_MSG(td_device_memset0(dev, NULL, 1), TD_ERR_INVALID_ARGUMENT, "ptr is NULL");
  CHECK_STATUS(td_device_alloc(dev, 1, NULL), TD_ERR_INVALID_ARGUMENT);
}

/* Pinned host memory: host memory wherever it comes from. */
static void test_pinned(void) {
  for (size_t k = 0; k < N_SIZES; k++) {
    size_t n = SIZES[k];
    unsigned char *p = NULL;
    CHECK_OK(td_host_alloc_pinned(n, (void **)&p));
    CHECK(p != NULL);
    CHECK_EQ_INT((uintptr_t)p % 64, 0);
    CHECK_EQ_INT(td_pointer_device(p).kind, TD_DEVICE_CPU);
    fill(p, n, 99);
    check_pattern(p, n, 99, "pinned");
    td_host_free_pinned(p);
  }
  td_host_free_pinned(NULL);
  CHECK_STATUS(td_host_alloc_pinned(SIZE_MAX, &(void *){NULL}), TD_ERR_INVALID_ARGUMENT);
}

/* A stream on dev: host (pinned) -> dev -> dev -> host through copy_async,
 * events between two streams, sizes 0, 1 and odd. */
static void test_streams(td_device dev) {
  char name[16];
  td_device_name(dev, name, sizeof name);
  td_stream *s1 = NULL, *s2 = NULL;
  td_event *ev = NULL;
  CHECK_OK(td_stream_create(dev, &s1));
  CHECK_OK(td_stream_create(dev, &s2));
  CHECK_OK(td_event_create(dev, &ev));
  CHECK_EQ_INT(td_stream_device(s1).kind, dev.kind);
  CHECK_EQ_INT(td_stream_device(s1).index, dev.index);
  CHECK((td_stream_native(s1) != NULL) == (dev.kind == TD_DEVICE_CUDA));
  bool done = false;
  CHECK_OK(td_event_query(ev, &done)); /* never recorded: complete */
  CHECK(done);

  for (size_t k = 0; k < N_SIZES; k++) {
    size_t n = SIZES[k];
    unsigned char *in = NULL, *out = NULL;
    void *a = NULL, *b = NULL;
    CHECK_OK(td_host_alloc_pinned(n, (void **)&in));
    CHECK_OK(td_host_alloc_pinned(n + 1, (void **)&out));
    CHECK_OK(td_device_alloc(dev, n, &a));
    CHECK_OK(td_device_alloc(dev, n, &b));
    fill(in, n, (unsigned)(k + 11));
    memset(out, 0xCD, n + 1);

    /* s1: in -> a, zero b; s2 waits for s1, then a -> b (overwriting the
     * zeros), b -> out; the host waits on s2 only. */
    CHECK_OK(td_copy_async(a, in, n, s1));
    CHECK_OK(td_memset0_async(b, n, s1));
    CHECK_OK(td_event_record(ev, s1));
    CHECK_OK(td_stream_wait_event(s2, ev));
    CHECK_OK(td_copy_async(b, a, n, s2));
    CHECK_OK(td_copy_async(out, b, n, s2));
    CHECK_OK(td_stream_sync(s2));
    check_pattern(out, n, (unsigned)(k + 11), name);
    CHECK_EQ_INT(out[n], 0xCD);
    CHECK_OK(td_event_sync(ev));
    CHECK_OK(td_event_query(ev, &done));
    CHECK(done);

    /* memset0_async alone, read back on the same stream */
    if (n) {
      CHECK_OK(td_memset0_async(a, n, s1));
      CHECK_OK(td_copy_async(out, a, n, s1));
      CHECK_OK(td_stream_sync(s1));
      check_zero(out, n, "memset0_async");
    }
    td_device_free(dev, a);
    td_device_free(dev, b);
    td_host_free_pinned(in);
    td_host_free_pinned(out);
  }
  CHECK_OK(td_copy_async(NULL, NULL, 0, s1));
  CHECK_MSG(td_copy_async(NULL, name, 1, s1), TD_ERR_INVALID_ARGUMENT, "dst is NULL");
  CHECK_MSG(td_memset0_async(NULL, 1, s1), TD_ERR_INVALID_ARGUMENT, "ptr is NULL");
  CHECK_MSG(td_copy_async(name, name, 1, NULL), TD_ERR_INVALID_ARGUMENT, "stream is NULL");
  CHECK_STATUS(td_event_record(NULL, s1), TD_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(td_stream_sync(NULL), TD_ERR_INVALID_ARGUMENT);
  td_event_destroy(ev);
  td_stream_destroy(s1);
  td_stream_destroy(s2);
  td_stream_destroy(NULL);
  td_event_destroy(NULL);
}

#ifdef TD_HAVE_CUDA
/* A CUDA device exists: the checks that need two kinds of device. */
static void test_cuda_present(int count) {
  td_device gpu = {TD_DEVICE_CUDA, 0};
  CHECK_OK(td_device_open(gpu));
  for (int i = 1; i < count; i++) CHECK_OK(td_device_open((td_device){TD_DEVICE_CUDA, i}));
  char want[64];
  snprintf(want, sizeof want, "cuda:%d asked, %d visible", count, count);
  CHECK_MSG(td_device_open((td_device){TD_DEVICE_CUDA, count}), TD_ERR_INVALID_USAGE, want);
  CHECK_MSG(td_device_open((td_device){TD_DEVICE_CUDA, -1}), TD_ERR_INVALID_ARGUMENT, "no such device");

  test_memory(gpu);
  test_streams(gpu);

  /* a CPU stream refuses device memory; an event and a stream must share a device */
  td_stream *cpu_stream = NULL, *gpu_stream = NULL;
  td_event *gpu_event = NULL;
  void *d = NULL;
  char host[8] = "abcdefg";
  CHECK_OK(td_stream_create(CPU, &cpu_stream));
  CHECK_OK(td_stream_create(gpu, &gpu_stream));
  CHECK_OK(td_event_create(gpu, &gpu_event));
  CHECK_OK(td_device_alloc(gpu, 8, &d));
  CHECK_MSG(td_copy_async(d, host, 8, cpu_stream), TD_ERR_INVALID_ARGUMENT, "is memory of cuda:0");
  CHECK_MSG(td_copy_async(host, d, 8, cpu_stream), TD_ERR_INVALID_ARGUMENT, "create the stream on that device");
  CHECK_MSG(td_event_record(gpu_event, cpu_stream), TD_ERR_INVALID_ARGUMENT, "the event is on cuda:0, the stream on cpu");
  CHECK_MSG(td_stream_wait_event(cpu_stream, gpu_event), TD_ERR_INVALID_ARGUMENT, "the stream on cpu");
  /* pageable host memory on a CUDA stream works too (synchronously) */
  char back[8] = {0};
  CHECK_OK(td_copy_async(d, host, 8, gpu_stream));
  CHECK_OK(td_copy_async(back, d, 8, gpu_stream));
  CHECK_OK(td_stream_sync(gpu_stream));
  CHECK(memcmp(back, host, 8) == 0);
  /* far more than any GPU holds: a clear failure naming cudaMalloc */
  void *huge = NULL;
  CHECK_MSG(td_device_alloc(gpu, (size_t)1 << 50, &huge), TD_ERR_SYSTEM, "cudaMalloc(");
  CHECK(huge == NULL);
  td_device_free(gpu, d);
  td_event_destroy(gpu_event);
  td_stream_destroy(gpu_stream);
  td_stream_destroy(cpu_stream);
}
#endif

static void test_cuda(void) {
  td_device gpu = {TD_DEVICE_CUDA, 0};
  const char *expect = getenv("TD_TEST_EXPECT_CUDA");
  int count = td_device_count(TD_DEVICE_CUDA);
  if (expect) CHECK_EQ_INT(count, atoi(expect));
#ifdef TD_HAVE_CUDA
  CHECK(td_device_cuda_built());
  if (count == 0) {
    /* CI with the toolkit: no driver, so the runtime finds no device; the
     * message says so, gives its reason and what to do. */
    CHECK_MSG(td_device_open(gpu), TD_ERR_INVALID_USAGE, "cuda:0 asked, but there is no CUDA device");
    CHECK_MSG(td_device_open(gpu), TD_ERR_INVALID_USAGE, "cudaGetDeviceCount");
    CHECK_MSG(td_device_open(gpu), TD_ERR_INVALID_USAGE, "or use the cpu device");
    char why[512];
    snprintf(why, sizeof why, "%s", td_last_error());
    void *p = (void *)1;
    CHECK_MSG(td_device_alloc(gpu, 8, &p), TD_ERR_SYSTEM, "on cuda:0");
    CHECK(p == NULL);
    /* pinned memory falls back to host memory, so staged paths still run */
    test_pinned();
    printf("test_device: CUDA part skipped: built with CUDA, but no device here: %s\n", why);
    return;
  }
  test_cuda_present(count);
  test_pinned(); /* now with cudaHostAlloc */
  printf("test_device: CUDA part ran on %d device(s)\n", count);
#else
  CHECK(!td_device_cuda_built());
  CHECK_EQ_INT(count, 0);
  CHECK_MSG(td_device_open(gpu), TD_ERR_INVALID_USAGE, "built without CUDA");
  CHECK_MSG(td_device_open(gpu), TD_ERR_INVALID_USAGE, "scripts/install-cuda");
  void *p = (void *)1;
  CHECK_MSG(td_device_alloc(gpu, 8, &p), TD_ERR_INVALID_USAGE, "td_device_alloc on cuda:0: this Tandem was built "
                                                                  "without CUDA");
  CHECK(p == NULL);
  td_stream *s = (td_stream *)1;
  CHECK_MSG(td_stream_create(gpu, &s), TD_ERR_INVALID_USAGE, "built without CUDA");
  CHECK(s == NULL);
  CHECK_MSG(td_device_copy(&p, CPU, &p, gpu, sizeof p), TD_ERR_INVALID_USAGE, "built without CUDA");
  printf("test_device: CUDA part skipped: this build has no CUDA backend (checked that it says so)\n");
#endif
}

int main(void) {
  test_parse();
  CHECK_OK(td_device_open(CPU));
  CHECK_EQ_INT(td_device_count(TD_DEVICE_CPU), 1);
  CHECK_EQ_INT(td_pointer_device(NULL).kind, TD_DEVICE_CPU);
  int on_stack = 0;
  CHECK_EQ_INT(td_pointer_device(&on_stack).kind, TD_DEVICE_CPU);
  test_memory(CPU);
  test_pinned();
  test_streams(CPU);
  test_cuda();
  printf("test_device: ok\n");
  return 0;
}
