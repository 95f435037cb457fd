/* The metrics file: one JSON object per line (JSON Lines), one line per
 * optimizer step plus occasional event lines (evaluations), for plots and
 * scripts. Each line is complete before it is flushed, so that a reader that
 * follows the file never sees half an object and a crash loses at most the
 * step in flight. Losses are printed with %.9g, which round-trips a float:
 * the exact-resume test compares them for equality. */
#include "base/base.h"
#include "tandem/obs.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct td_metrics {
  FILE *file;
  char path[512];
  char unit[16];
  double t_open;
  td_status error; /* first write error, reported by close */
};

td_status td_metrics_open(const char *path, const char *unit, int append, td_metrics **out) {
  *out = NULL;
  if (!path || !*path) return td_error(TD_ERR_INVALID_ARGUMENT, "metrics: empty file name");
  td_metrics *m = calloc(1, sizeof *m);
  if (!m) return td_error(TD_ERR_SYSTEM, "metrics: out of memory");
  m->file = fopen(path, append ? "a" : "w");
  if (!m->file) {
    free(m);
    return td_error_errno("metrics: cannot open %s for writing (check that its directory exists and is writable)",
                          path);
  }
  td_strlcpy(m->path, path, sizeof m->path);
  td_strlcpy(m->unit, unit ? unit : "items", sizeof m->unit);
  m->t_open = td_now();
  *out = m;
  return TD_OK;
}

/* Append `"key":value` with a comma if the line already has fields. JSON has
 * no NaN or infinity: those become null, so that the line stays valid. */
static size_t put_number(char *buf, size_t off, size_t size, const char *key, double value, const char *fmt) {
  if (off >= size) return off;
  int n;
  if (isfinite(value)) {
    char num[64];
    snprintf(num, sizeof num, fmt, value);
    n = snprintf(buf + off, size - off, "%s\"%s\":%s", off > 1 ? "," : "", key, num);
  } else {
    n = snprintf(buf + off, size - off, "%s\"%s\":null", off > 1 ? "," : "", key);
  }
  return n > 0 ? off + (size_t)n : off;
}

static td_status finish_line(td_metrics *m, char *buf, size_t off, size_t size) {
  off = put_number(buf, off, size, "time", td_wall_time(), "%.3f");
  off = put_number(buf, off, size, "elapsed_s", td_now() - m->t_open, "%.3f");
  if (off + 3 > size) return td_error(TD_ERR_INTERNAL, "metrics: line too long for %s", m->path);
  buf[off++] = '}';
  buf[off++] = '\n';
  if (fwrite(buf, 1, off, m->file) != off || fflush(m->file) != 0) {
    td_status st = td_error_errno("metrics: cannot write %s", m->path);
    if (m->error == TD_OK) m->error = st;
    return st;
  }
  return TD_OK;
}

td_status td_metrics_write_step(td_metrics *m, const td_step_metrics *s) {
  if (!m) return TD_OK;
  char buf[1024];
  size_t off = 0;
  buf[off++] = '{';
  int n = snprintf(buf + off, sizeof buf - off, "\"step\":%ld", s->step);
  off += (size_t)n;
  off = put_number(buf, off, sizeof buf, "loss", s->loss, "%.9g");
  if (s->lr >= 0) off = put_number(buf, off, sizeof buf, "lr", s->lr, "%.9g");
  if (s->items_per_s >= 0) {
    char key[32];
    snprintf(key, sizeof key, "%s_per_s", m->unit);
    off = put_number(buf, off, sizeof buf, key, s->items_per_s, "%.1f");
  }
  if (s->step_s >= 0) off = put_number(buf, off, sizeof buf, "step_s", s->step_s, "%.6f");
  if (s->compute_s >= 0) off = put_number(buf, off, sizeof buf, "compute_s", s->compute_s, "%.6f");
  if (s->comm_wait_s >= 0) off = put_number(buf, off, sizeof buf, "comm_wait_s", s->comm_wait_s, "%.6f");
  if (s->optimizer_s >= 0) off = put_number(buf, off, sizeof buf, "optimizer_s", s->optimizer_s, "%.6f");
  if (s->data_s >= 0) off = put_number(buf, off, sizeof buf, "data_s", s->data_s, "%.6f");
  if (s->io_s >= 0) off = put_number(buf, off, sizeof buf, "io_s", s->io_s, "%.6f");
  if (s->fetch_wait_s >= 0) off = put_number(buf, off, sizeof buf, "fetch_wait_s", s->fetch_wait_s, "%.6f");
  if (s->param_fetches >= 0) off = put_number(buf, off, sizeof buf, "param_fetches", (double)s->param_fetches, "%.0f");
  if (s->param_prefetches >= 0)
    off = put_number(buf, off, sizeof buf, "param_prefetches", (double)s->param_prefetches, "%.0f");
  if (s->grad_norm >= 0 || !isfinite(s->grad_norm))
    off = put_number(buf, off, sizeof buf, "grad_norm", s->grad_norm, "%.9g");
  if (s->memory_mib >= 0) off = put_number(buf, off, sizeof buf, "memory_mib", s->memory_mib, "%.1f");
  if (s->memory_limit_mib >= 0) off = put_number(buf, off, sizeof buf, "memory_limit_mib", s->memory_limit_mib, "%.1f");
  if (s->memory_warning >= 0) off = put_number(buf, off, sizeof buf, "memory_warning", s->memory_warning, "%.0f");
  return finish_line(m, buf, off, sizeof buf);
}

/* Keys are program-chosen identifiers; anything JSON would need escaped is
 * replaced so that the line stays valid whatever a caller passes. */
static void safe_key(const char *key, char *out, size_t size) {
  size_t i = 0;
  for (; key[i] && i + 1 < size; i++) {
    unsigned char c = (unsigned char)key[i];
    out[i] = (c < 0x20 || c == '"' || c == '\\' || c >= 0x7f) ? '_' : (char)c;
  }
  out[i] = 0;
}

td_status td_metrics_write_values(td_metrics *m, const char *event, long step, int n_values,
                                  const char *const *keys, const double *values) {
  if (!m) return TD_OK;
  char buf[2048], name[64];
  size_t off = 0;
  buf[off++] = '{';
  safe_key(event ? event : "event", name, sizeof name);
  off += (size_t)snprintf(buf + off, sizeof buf - off, "\"event\":\"%s\",\"step\":%ld", name, step);
  for (int i = 0; i < n_values && off < sizeof buf; i++) {
    safe_key(keys[i], name, sizeof name);
    off = put_number(buf, off, sizeof buf, name, values[i], "%.9g");
  }
  return finish_line(m, buf, off, sizeof buf);
}

td_status td_metrics_close(td_metrics *m) {
  if (!m) return TD_OK;
  td_status st = m->error;
  if (fclose(m->file) != 0 && st == TD_OK) st = td_error_errno("metrics: cannot close %s", m->path);
  free(m);
  return st;
}
