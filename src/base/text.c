/* A growing byte buffer for text built piece by piece: the Prometheus pages,
 * the checkpoint manifest, the safetensors header and the TensorBoard event
 * records were each written with their own copy of this loop, and so were
 * the readers of whole files (the config, the text dataset, the timeline
 * merge).
 *
 * Out of memory is sticky (b->failed): callers append without checking each
 * call and look once at the end, as a render either succeeds whole or not at
 * all. The contents stay NUL-terminated, so text can be handed on as a C
 * string; binary users (protobuf records) just ignore the extra byte. */
#include "base.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Room for `extra` more bytes and the terminating NUL. */
static int buf_reserve(td_buf *b, size_t extra) {
  if (b->failed) return 0;
  if (extra > SIZE_MAX / 2 - b->len) goto oom;
  size_t need = b->len + extra + 1;
  if (need <= b->cap) return 1;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < need) cap *= 2;
  char *grown = realloc(b->data, cap);
  if (!grown) goto oom;
  b->data = grown;
  b->cap = cap;
  return 1;
oom:
  b->failed = 1;
  return 0;
}

void td_buf_append(td_buf *b, const void *bytes, size_t n) {
  if (!buf_reserve(b, n)) return;
  if (n) memcpy(b->data + b->len, bytes, n);
  b->len += n;
  b->data[b->len] = 0;
}

void td_buf_printf(td_buf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  td_buf_vprintf(b, fmt, ap);
  va_end(ap);
}

void td_buf_vprintf(td_buf *b, const char *fmt, va_list ap) {
  if (!buf_reserve(b, 0)) return;
  va_list again;
  va_copy(again, ap);
  /* First try into the room there is; only a longer line formats twice. */
  int n = vsnprintf(b->data + b->len, b->cap - b->len, fmt, ap);
  if (n < 0) {
    b->failed = 1;
  } else if ((size_t)n < b->cap - b->len) {
    b->len += (size_t)n;
  } else if (buf_reserve(b, (size_t)n)) {
    vsnprintf(b->data + b->len, b->cap - b->len, fmt, again);
    b->len += (size_t)n;
  }
  va_end(again);
}

char *td_buf_take(td_buf *b, size_t *len_out) {
  char *data = NULL;
  if (buf_reserve(b, 0)) {
    b->data[b->len] = 0; /* an empty buffer still gives "" */
    data = b->data;
    if (len_out) *len_out = b->len;
  } else {
    free(b->data);
  }
  *b = (td_buf){0};
  return data;
}

int td_buf_append_file(td_buf *b, FILE *f, size_t max_bytes) {
  while (b->len <= max_bytes) {
    if (!buf_reserve(b, 65536)) return -1;
    size_t got = fread(b->data + b->len, 1, b->cap - b->len - 1, f);
    b->len += got;
    b->data[b->len] = 0;
    if (got == 0) break;
  }
  return ferror(f) ? -1 : 0;
}

void td_buf_free(td_buf *b) {
  if (!b) return;
  free(b->data);
  *b = (td_buf){0};
}
