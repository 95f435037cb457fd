/* TensorBoard event files: what tf.summary writers produce, readable by
 * TensorBoard (and tf.compat.v1.train.summary_iterator) without TensorFlow
 * on our side.
 *
 * File: DIR/events.out.tfevents.<unix seconds>.<host>.<pid>, a sequence of
 * TFRecords, each
 *     uint64 length (little-endian)
 *     uint32 masked CRC-32C of those 8 length bytes
 *     byte   data[length]            (one serialized tensorflow.Event)
 *     uint32 masked CRC-32C of data
 * where mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8 (tensorflow's
 * core/lib/hash/crc32c.h). The first record is an Event with file_version
 * "brain.Event:2"; then one Event per call, whose Summary holds the values.
 *
 * The protobuf subset is encoded by hand (field numbers from tensorflow's
 * core/util/event.proto and core/framework/summary.proto):
 *   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5;
 *             SessionLog session_log = 7; }
 *   SessionLog { SessionStatus status = 1; }   (START = 1)
 *   Summary { repeated Value value = 1; }
 *   Value   { string tag = 1; float simple_value = 2; HistogramProto histo = 5; }
 *   HistogramProto { double min = 1; double max = 2; double num = 3; double sum = 4;
 *                    double sum_squares = 5; repeated double bucket_limit = 6 [packed];
 *                    repeated double bucket = 7 [packed]; }
 * Singular fields at their default value are left out, as proto3 does.
 * Wire format: a key is varint(field << 3 | type) with type 0 varint, 1 64-bit,
 * 2 length-delimited, 5 32-bit; fixed-width values are little-endian (x86
 * and arm64 are, so plain memcpy). */
#define _GNU_SOURCE 1
#include "base/base.h"
#include "tandem/obs.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define TB_HISTOGRAM_BUCKETS 30

struct td_tensorboard {
  FILE *file;
  char path[768];
  td_status error; /* first write error, returned by close */
};

/* ---- CRC-32C (Castagnoli, reflected polynomial 0x82f63b78), bytewise table ---- */

static uint32_t crc32c_table[256];
static pthread_once_t crc32c_once = PTHREAD_ONCE_INIT;

static void crc32c_init(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1u)));
    crc32c_table[i] = c;
  }
}

static uint32_t masked_crc32c(const uint8_t *data, size_t n) {
  pthread_once(&crc32c_once, crc32c_init);
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; i++) c = crc32c_table[(c ^ data[i]) & 0xff] ^ (c >> 8);
  c ^= 0xffffffffu;
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* ---- the protobuf wire format (into a td_buf: base.h) ---- */

static void pb_varint(td_buf *b, uint64_t v) {
  uint8_t out[10];
  size_t n = 0;
  while (v >= 0x80) {
    out[n++] = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  out[n++] = (uint8_t)v;
  td_buf_append(b, out, n);
}

static void pb_key(td_buf *b, unsigned field, unsigned type) { pb_varint(b, (uint64_t)field << 3 | type); }
/* proto3 leaves out a singular field that holds its default (0, +0.0):
 * doing the same keeps our bytes those of any proto3 serializer. */
static void pb_double(td_buf *b, unsigned field, double v) {
  uint64_t bits;
  memcpy(&bits, &v, 8);
  if (bits == 0) return;
  pb_key(b, field, 1);
  td_buf_append(b, &v, 8);
}
static void pb_float(td_buf *b, unsigned field, float v) {
  pb_key(b, field, 5);
  td_buf_append(b, &v, 4);
}
static void pb_bytes(td_buf *b, unsigned field, const void *data, size_t n) {
  pb_key(b, field, 2);
  pb_varint(b, n);
  td_buf_append(b, data, n);
}

/* Event{wall_time, step, <what_field> = what (what_len bytes)}: field 3 the
 * file_version string, 5 a Summary, 7 a SessionLog; framed as a TFRecord
 * and written. */
static td_status write_event(td_tensorboard *tb, long step, unsigned what_field, const void *what, size_t what_len) {
  td_buf ev = {0};
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  pb_double(&ev, 1, (double)now.tv_sec + now.tv_nsec * 1e-9);
  if (step != 0) {
    pb_key(&ev, 2, 0);
    pb_varint(&ev, (uint64_t)(int64_t)step); /* int64: negative numbers take 10 bytes */
  }
  pb_bytes(&ev, what_field, what, what_len);
  td_status st = TD_OK;
  if (ev.failed) {
    st = td_error(TD_ERR_SYSTEM, "tensorboard: out of memory");
  } else {
    uint8_t head[12];
    uint64_t len = ev.len;
    memcpy(head, &len, 8);
    uint32_t crc = masked_crc32c(head, 8);
    memcpy(head + 8, &crc, 4);
    uint32_t data_crc = masked_crc32c((const uint8_t *)ev.data, ev.len);
    if (fwrite(head, 1, 12, tb->file) != 12 || fwrite(ev.data, 1, ev.len, tb->file) != ev.len ||
        fwrite(&data_crc, 1, 4, tb->file) != 4 || fflush(tb->file) != 0)
      st = td_error_errno("tensorboard: cannot write %s", tb->path);
  }
  td_buf_free(&ev);
  if (st != TD_OK && tb->error == TD_OK) tb->error = st;
  return st;
}

td_status td_tensorboard_open(const char *dir, td_tensorboard **out) {
  *out = NULL;
  if (!dir || !*dir) return td_error(TD_ERR_INVALID_ARGUMENT, "tensorboard: empty directory name");
  if (mkdir(dir, 0777) != 0 && errno != EEXIST)
    return td_error_errno("tensorboard: cannot create the directory %s (its parent must exist)", dir);
  td_tensorboard *tb = calloc(1, sizeof *tb);
  if (!tb) return td_error(TD_ERR_SYSTEM, "tensorboard: out of memory");
  char host[128] = "localhost";
  gethostname(host, sizeof host - 1);
  snprintf(tb->path, sizeof tb->path, "%s/events.out.tfevents.%ld.%s.%d", dir, (long)time(NULL), host, (int)getpid());
  tb->file = fopen(tb->path, "wb");
  if (!tb->file) {
    td_status st = td_error_errno("tensorboard: cannot create %s (check that the directory is writable)", tb->path);
    free(tb);
    return st;
  }
  static const char version[] = "brain.Event:2";
  td_status st = write_event(tb, 0, 3, version, sizeof version - 1);
  if (st != TD_OK) {
    fclose(tb->file);
    free(tb);
    return st;
  }
  *out = tb;
  return TD_OK;
}

const char *td_tensorboard_path(const td_tensorboard *tb) { return tb ? tb->path : NULL; }

/* Summary.Value{tag, simple_value} appended to a Summary under construction. */
static void summary_scalar(td_buf *summary, const char *tag, double value) {
  td_buf v = {0};
  pb_bytes(&v, 1, tag, strlen(tag));
  pb_float(&v, 2, (float)value); /* simple_value is a float in summary.proto */
  if (v.failed) summary->failed = 1;
  else pb_bytes(summary, 1, v.data, v.len);
  td_buf_free(&v);
}

td_status td_tensorboard_scalars(td_tensorboard *tb, long step, int n_values, const char *const *tags,
                                 const double *values) {
  if (!tb) return TD_OK;
  td_buf summary = {0};
  for (int i = 0; i < n_values; i++) summary_scalar(&summary, tags[i], values[i]);
  td_status st = summary.failed ? td_error(TD_ERR_SYSTEM, "tensorboard: out of memory")
                                : write_event(tb, step, 5, summary.data, summary.len);
  td_buf_free(&summary);
  return st;
}

td_status td_tensorboard_session_start(td_tensorboard *tb, long step) {
  if (!tb) return TD_OK;
  static const uint8_t start[] = {1 << 3 | 0, 1}; /* SessionLog{status = START} */
  return write_event(tb, step, 7, start, sizeof start);
}

/* TB_HISTOGRAM_BUCKETS equal buckets over [min, max]; bucket i counts the
 * values v with limit[i-1] < v <= limit[i] (TensorBoard's convention: each
 * limit is a bucket's right edge), the first bucket also holds min. All
 * values equal (or one value): a single bucket. Non-finite values are left
 * out (and not counted in num). */
td_status td_tensorboard_histogram(td_tensorboard *tb, const char *tag, long step, const double *values, size_t n) {
  if (!tb) return TD_OK;
  double lo = INFINITY, hi = -INFINITY, sum = 0, sum_sq = 0, num = 0;
  for (size_t i = 0; i < n; i++) {
    double v = values[i];
    if (!isfinite(v)) continue;
    lo = fmin(lo, v);
    hi = fmax(hi, v);
    sum += v;
    sum_sq += v * v;
    num++;
  }
  if (num == 0) lo = hi = 0;
  int n_buckets = hi > lo ? TB_HISTOGRAM_BUCKETS : 1;
  double limits[TB_HISTOGRAM_BUCKETS], counts[TB_HISTOGRAM_BUCKETS] = {0};
  double width = (hi - lo) / n_buckets;
  for (int b = 0; b < n_buckets; b++) limits[b] = b == n_buckets - 1 ? hi : lo + width * (b + 1);
  for (size_t i = 0; i < n; i++) {
    double v = values[i];
    if (!isfinite(v)) continue;
    int b = width > 0 ? (int)ceil((v - lo) / width) - 1 : 0;
    if (b < 0) b = 0;
    if (b >= n_buckets) b = n_buckets - 1;
    /* rounding in (v - lo) / width may land one off the edges' own test */
    while (b > 0 && v <= limits[b - 1]) b--;
    while (b < n_buckets - 1 && v > limits[b]) b++;
    counts[b]++;
  }
  td_buf histo = {0}, value = {0}, summary = {0};
  pb_double(&histo, 1, lo);
  pb_double(&histo, 2, hi);
  pb_double(&histo, 3, num);
  pb_double(&histo, 4, sum);
  pb_double(&histo, 5, sum_sq);
  pb_key(&histo, 6, 2);
  pb_varint(&histo, (uint64_t)n_buckets * 8);
  td_buf_append(&histo, limits, (size_t)n_buckets * 8);
  pb_key(&histo, 7, 2);
  pb_varint(&histo, (uint64_t)n_buckets * 8);
  td_buf_append(&histo, counts, (size_t)n_buckets * 8);
  pb_bytes(&value, 1, tag, strlen(tag));
  pb_bytes(&value, 5, histo.data, histo.len);
  pb_bytes(&summary, 1, value.data, value.len);
  td_status st = histo.failed || value.failed || summary.failed
                     ? td_error(TD_ERR_SYSTEM, "tensorboard: out of memory")
                     : write_event(tb, step, 5, summary.data, summary.len);
  td_buf_free(&histo);
  td_buf_free(&value);
  td_buf_free(&summary);
  return st;
}

td_status td_tensorboard_close(td_tensorboard *tb) {
  if (!tb) return TD_OK;
  td_status st = tb->error;
  if (fclose(tb->file) != 0 && st == TD_OK) st = td_error_errno("tensorboard: cannot close %s", tb->path);
  free(tb);
  return st;
}
