/* The checkpoint manifest (format 2): the text file that says what a
 * checkpoint holds and where. One "key value" per line:
 *
 *   tandem-checkpoint 2
 *   world_size W / zero_stage S        how it was saved (informational)
 *   step, samples_consumed, seed, dataset_samples, train_batch_size
 *   model_kind, model_config, n_params, optimizer, n_state_arenas
 *   chunk_bytes B                      CRC granularity of the pieces
 *   n_tensors K, then K x "tensor OFFSET COUNT NAME"
 *   n_arenas A,  then A x "arena ID NAME f32 COUNT"
 *   n_files F,   then F x "file NAME BYTES"
 *   piece FILE ARENA LO HI OFFSET CRC[,CRC...]    any number
 *   manifest_crc X                     CRC-32 of every byte before this line
 *
 * A piece is elements [LO, HI) of arena ARENA at byte OFFSET of file number
 * FILE (0-based, in the order of the file lines), with one CRC-32 per
 * chunk_bytes of its (HI-LO)*4 bytes. The parser accepts a manifest only if
 * the pieces of every arena tile [0, count) exactly and the pieces of every
 * file tile [0, bytes) exactly, so that a reader can trust it to size and
 * place every read. */
#include "train/checkpoint/ckpt.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/checkpoint/io.h"
#include "train/core/core.h"

#define MAX_ELEMENTS ((unsigned long long)1 << 40)

/* ---- writing ---- */

char *td_ckpt_manifest_format(const td_ckpt_manifest *m) {
  td_buf b = {0};
  td_buf_printf(&b, "%s %d\n", TD_CKPT_MAGIC, TD_CKPT_FORMAT);
  td_buf_printf(&b, "world_size %d\n", m->world);
  td_buf_printf(&b, "zero_stage %d\n", m->zero_stage);
  td_buf_printf(&b, "step %ld\n", m->step);
  td_buf_printf(&b, "samples_consumed %llu\n", m->consumed);
  td_buf_printf(&b, "seed %llu\n", m->seed);
  td_buf_printf(&b, "dataset_samples %llu\n", m->dataset_samples);
  td_buf_printf(&b, "train_batch_size %llu\n", m->train_batch_size);
  td_buf_printf(&b, "model_kind %s\n", m->kind);
  if (m->model_config[0]) td_buf_printf(&b, "model_config %s\n", m->model_config);
  td_buf_printf(&b, "n_params %zu\n", m->n_params);
  td_buf_printf(&b, "optimizer %s\n", m->optimizer);
  td_buf_printf(&b, "n_state_arenas %d\n", m->n_states);
  td_buf_printf(&b, "chunk_bytes %llu\n", (unsigned long long)m->chunk_bytes);
  if (m->has_scaler)
    td_buf_printf(&b, "loss_scaler %.17g %ld %ld %d %ld\n", m->scaler_scale, m->scaler_iter, m->scaler_last_overflow,
                  m->scaler_hysteresis_left, m->scaler_skipped);
  td_buf_printf(&b, "n_tensors %d\n", m->n_tensors);
  for (int i = 0; i < m->n_tensors; i++)
    td_buf_printf(&b, "tensor %zu %zu %s\n", m->tensors[i].offset, m->tensors[i].count, m->tensors[i].name);
  td_buf_printf(&b, "n_arenas %d\n", m->n_arenas);
  for (int a = 0; a < m->n_arenas; a++)
    td_buf_printf(&b, "arena %d %s f32 %llu\n", a, m->arenas[a].name, (unsigned long long)m->arenas[a].count);
  td_buf_printf(&b, "n_files %d\n", m->n_files);
  for (int f = 0; f < m->n_files; f++)
    td_buf_printf(&b, "file %s %llu\n", m->files[f].name, (unsigned long long)m->files[f].bytes);
  for (int i = 0; i < m->n_pieces; i++) {
    const td_ckpt_piece *p = &m->pieces[i];
    td_buf_printf(&b, "piece %d %d %llu %llu %llu ", p->file, p->arena, (unsigned long long)p->lo,
                  (unsigned long long)p->hi, (unsigned long long)p->offset);
    for (uint64_t c = 0; c < p->n_crc; c++) td_buf_printf(&b, c ? ",%08x" : "%08x", (unsigned)p->crc[c]);
    td_buf_printf(&b, "\n");
  }
  if (!b.failed) {
    uint32_t crc = td_crc32(0, b.data, b.len);
    td_buf_printf(&b, "manifest_crc %08x\n", (unsigned)crc);
  }
  return td_buf_take(&b, NULL);
}

/* ---- reading ---- */

/* Strict decimal parse of the whole of `text` into [0, max]. */
static int parse_u64(const char *text, unsigned long long max, unsigned long long *out) {
  if (!text || *text < '0' || *text > '9') return 0;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(text, &end, 10);
  if (errno || *end || v > max) return 0;
  *out = v;
  return 1;
}

/* 1-8 hex digits ending at *end (',' or NUL), into *out; advances *text. */
static int parse_hex32(const char **text, uint32_t *out) {
  const char *s = *text;
  uint32_t v = 0;
  size_t n = 0;
  for (; s[n] && s[n] != ','; n++) {
    char c = s[n];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0 || n >= 8) return 0;
    v = v << 4 | (uint32_t)d;
  }
  if (n == 0) return 0;
  *out = v;
  *text = s + n;
  return 1;
}

void td_ckpt_manifest_free(td_ckpt_manifest *m) {
  if (!m) return;
  if (m->tensors)
    for (int i = 0; i < m->n_tensor_lines; i++) free(m->tensors[i].name);
  free(m->tensors);
  free(m->files);
  if (m->pieces)
    for (int i = 0; i < m->n_pieces; i++) free(m->pieces[i].crc);
  free(m->pieces);
  memset(m, 0, sizeof *m);
}

/* The next space-separated field of *p (NUL-terminated in place). */
static char *next_field(char **p) {
  char *s = *p;
  while (*s == ' ') s++;
  if (!*s) return NULL;
  char *e = s;
  while (*e && *e != ' ') e++;
  if (*e) *e++ = '\0';
  *p = e;
  return s;
}

/* A name safe to join to the step directory: [A-Za-z0-9._-], not "." or "..". */
static int plain_file_name(const char *s) {
  size_t n = strlen(s);
  if (n == 0 || n >= sizeof(((td_ckpt_file *)0)->name) || strcmp(s, ".") == 0 || strcmp(s, "..") == 0) return 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
          c == '-'))
      return 0;
  }
  return 1;
}

static int cmp_piece_arena(const void *a, const void *b) {
  const td_ckpt_piece *x = a, *y = b;
  if (x->arena != y->arena) return x->arena < y->arena ? -1 : 1;
  return x->lo < y->lo ? -1 : x->lo > y->lo;
}

typedef struct file_span {
  int file;
  uint64_t offset, bytes;
} file_span;

static int cmp_file_span(const void *a, const void *b) {
  const file_span *x = a, *y = b;
  if (x->file != y->file) return x->file < y->file ? -1 : 1;
  return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* The whole-manifest checks: each arena and each file tiled exactly. */
static td_status check_tiling(td_ckpt_manifest *m, const char *source) {
  if (m->n_pieces > 1) qsort(m->pieces, (size_t)m->n_pieces, sizeof *m->pieces, cmp_piece_arena);
  int i = 0;
  for (int a = 0; a < m->n_arenas; a++) {
    uint64_t next = 0;
    for (; i < m->n_pieces && m->pieces[i].arena == a; i++) {
      if (m->pieces[i].lo != next)
        return td_error(TD_ERR_IO, "%s is corrupt: arena %d (%s) has %s at element %llu", source, a, m->arenas[a].name,
                        m->pieces[i].lo > next ? "a gap" : "overlapping pieces", (unsigned long long)next);
      next = m->pieces[i].hi;
    }
    if (next != m->arenas[a].count)
      return td_error(TD_ERR_IO, "%s is corrupt: the pieces of arena %d (%s) end at element %llu of %llu", source, a,
                      m->arenas[a].name, (unsigned long long)next, (unsigned long long)m->arenas[a].count);
  }
  file_span *spans = malloc((size_t)(m->n_pieces ? m->n_pieces : 1) * sizeof *spans);
  if (!spans) return td_error(TD_ERR_SYSTEM, "out of memory reading %s", source);
  for (int k = 0; k < m->n_pieces; k++)
    spans[k] = (file_span){m->pieces[k].file, m->pieces[k].offset, (m->pieces[k].hi - m->pieces[k].lo) * 4};
  if (m->n_pieces > 1) qsort(spans, (size_t)m->n_pieces, sizeof *spans, cmp_file_span);
  td_status st = TD_OK;
  int k = 0;
  for (int f = 0; f < m->n_files && st == TD_OK; f++) {
    uint64_t next = 0;
    for (; k < m->n_pieces && spans[k].file == f && st == TD_OK; k++) {
      if (spans[k].offset != next)
        st = td_error(TD_ERR_IO, "%s is corrupt: the pieces of file %s %s at byte %llu", source, m->files[f].name,
                      spans[k].offset > next ? "leave a gap" : "overlap", (unsigned long long)next);
      next = spans[k].offset + spans[k].bytes;
    }
    if (st == TD_OK && next != m->files[f].bytes)
      st = td_error(TD_ERR_IO, "%s is corrupt: file %s is listed with %llu bytes but its pieces fill %llu", source,
                    m->files[f].name, (unsigned long long)m->files[f].bytes, (unsigned long long)next);
  }
  free(spans);
  return st;
}

td_status td_ckpt_manifest_parse(const char *data, size_t len, const char *source, td_ckpt_manifest *m) {
  memset(m, 0, sizeof *m);
  m->format = -1;
  m->world = -1;
  m->n_tensors = -1;
  m->n_arenas = -1;
  m->n_files = -1;
  if (!source) source = "manifest";
  if (!data && len) return td_error(TD_ERR_INVALID_ARGUMENT, "td_ckpt_manifest_parse: null data");
  if (len > CKPT_MAX_MANIFEST)
    return td_error(TD_ERR_IO, "%s is %zu bytes, more than any manifest: the checkpoint is corrupt", source, len);
  if (len && memchr(data, '\0', len)) return td_error(TD_ERR_IO, "%s is corrupt: it holds a NUL byte", source);
  /* The last line is "manifest_crc X", a checksum of everything before it. */
  size_t crc_at = SIZE_MAX;
  for (size_t i = 0; i + 13 <= len; i++)
    if ((i == 0 || data[i - 1] == '\n') && memcmp(data + i, "manifest_crc ", 13) == 0) crc_at = i;
  if (crc_at == SIZE_MAX)
    return td_error(TD_ERR_IO, "%s is truncated or corrupt: its closing manifest_crc line is missing", source);
  char crc_text[16];
  size_t crc_len = 0, i = crc_at + 13;
  for (; i < len && data[i] != '\n' && crc_len < sizeof crc_text - 1; i++) crc_text[crc_len++] = data[i];
  crc_text[crc_len] = '\0';
  if (i != len - 1 || data[i] != '\n')
    return td_error(TD_ERR_IO, "%s is truncated or corrupt: its manifest_crc line is not the complete last line",
                    source);
  uint32_t crc_want = 0;
  const char *crc_p = crc_text;
  if (!parse_hex32(&crc_p, &crc_want) || *crc_p || td_crc32(0, data, crc_at) != crc_want)
    return td_error(TD_ERR_IO, "%s is corrupt: its checksum does not match its contents", source);

  char *text = malloc(crc_at + 1);
  if (!text) return td_error(TD_ERR_SYSTEM, "out of memory reading %s", source);
  memcpy(text, data, crc_at);
  text[crc_at] = '\0';
  td_status st = TD_OK;
  unsigned seen_keys = 0;
  static const char *const once[] = {TD_CKPT_MAGIC, "world_size", "step", "samples_consumed", "seed",
                                     "dataset_samples", "model_kind", "model_config", "n_params", "optimizer",
                                     "n_state_arenas", "n_tensors", "chunk_bytes", "n_arenas", "n_files",
                                     "zero_stage", "train_batch_size"};
  int cap_pieces = 0, n_arena_lines = 0;
  unsigned char arena_seen[TD_CKPT_MAX_ARENAS] = {0};
  char *save = NULL;
  for (char *line = strtok_r(text, "\n", &save); line && st == TD_OK; line = strtok_r(NULL, "\n", &save)) {
    char shown[81]; /* the line as it was, for the message (fields get cut in place) */
    td_strlcpy(shown, line, sizeof shown);
    char *rest = line;
    char *key = next_field(&rest);
    if (!key) continue;
    while (*rest == ' ') rest++;
    char *v = rest;
    int ok = 1;
    for (unsigned k = 0; k < TD_ARRAY_SIZE(once); k++)
      if (strcmp(key, once[k]) == 0) {
        if (seen_keys & (1u << k)) ok = 0;
        seen_keys |= 1u << k;
      }
    unsigned long long u = 0;
    if (!ok) {
      st = td_error(TD_ERR_IO, "%s is corrupt: the key \"%.40s\" appears twice", source, key);
      break;
    } else if (strcmp(key, TD_CKPT_MAGIC) == 0) {
      ok = parse_u64(v, 1000, &u);
      m->format = (int)u;
      if (ok && m->format != TD_CKPT_FORMAT) break; /* reported below, with what to do */
    } else if (strcmp(key, "world_size") == 0) {
      ok = parse_u64(v, 1u << 20, &u) && u >= 1;
      m->world = (int)u;
    } else if (strcmp(key, "loss_scaler") == 0) {
      /* fp16's loss scaler (optional): scale, iteration, last overflow, hysteresis left, skipped steps */
      double scale = 0;
      long iter = 0, last = 0, skipped = 0;
      int hyst = 0, used = 0;
      ok = !m->has_scaler && sscanf(v, "%lg %ld %ld %d %ld%n", &scale, &iter, &last, &hyst, &skipped, &used) == 5 &&
           v[used] == '\0' && isfinite(scale) && scale > 0 && iter >= 0 && last >= -1 && last <= iter && hyst >= 0 &&
           skipped >= 0 && skipped <= iter;
      if (ok) {
        m->has_scaler = 1;
        m->scaler_scale = scale;
        m->scaler_iter = iter;
        m->scaler_last_overflow = last;
        m->scaler_hysteresis_left = hyst;
        m->scaler_skipped = skipped;
      }
    } else if (strcmp(key, "zero_stage") == 0) {
      ok = parse_u64(v, 3, &u);
      m->zero_stage = (int)u;
    } else if (strcmp(key, "step") == 0) {
      ok = parse_u64(v, LONG_MAX, &u);
      m->step = (long)u;
    } else if (strcmp(key, "samples_consumed") == 0) {
      ok = parse_u64(v, ULLONG_MAX, &m->consumed);
    } else if (strcmp(key, "seed") == 0) {
      ok = parse_u64(v, ULLONG_MAX, &m->seed);
    } else if (strcmp(key, "dataset_samples") == 0) {
      ok = parse_u64(v, ULLONG_MAX, &m->dataset_samples);
    } else if (strcmp(key, "train_batch_size") == 0) {
      ok = parse_u64(v, ULLONG_MAX, &m->train_batch_size);
    } else if (strcmp(key, "model_kind") == 0) {
      ok = *v && strlen(v) < sizeof m->kind && !strchr(v, ' ');
      if (ok) td_strlcpy(m->kind, v, sizeof m->kind);
    } else if (strcmp(key, "model_config") == 0) {
      ok = strlen(v) < sizeof m->model_config;
      if (ok) td_strlcpy(m->model_config, v, sizeof m->model_config);
    } else if (strcmp(key, "n_params") == 0) {
      ok = parse_u64(v, MAX_ELEMENTS, &u) && u >= 1;
      m->n_params = (size_t)u;
    } else if (strcmp(key, "optimizer") == 0) {
      ok = *v && strlen(v) < sizeof m->optimizer && !strchr(v, ' ');
      if (ok) td_strlcpy(m->optimizer, v, sizeof m->optimizer);
    } else if (strcmp(key, "n_state_arenas") == 0) {
      ok = parse_u64(v, 2, &u) && u >= 1;
      m->n_states = (int)u;
    } else if (strcmp(key, "chunk_bytes") == 0) {
      ok = parse_u64(v, (unsigned long long)1 << 26, &u) && u >= 4 && u % 4 == 0;
      m->chunk_bytes = u;
    } else if (strcmp(key, "n_tensors") == 0) {
      ok = parse_u64(v, 1u << 24, &u);
      if (ok) {
        m->n_tensors = (int)u;
        m->tensors = calloc(u ? u : 1, sizeof *m->tensors);
        if (!m->tensors) st = td_error(TD_ERR_SYSTEM, "out of memory reading %s", source);
      }
    } else if (strcmp(key, "tensor") == 0) {
      /* "tensor OFFSET COUNT NAME", after n_params and n_tensors. */
      unsigned long long off = 0, cnt = 0;
      char *a = next_field(&rest), *b = next_field(&rest);
      while (*rest == ' ') rest++;
      ok = m->tensors && m->n_params > 0 && m->n_tensor_lines < m->n_tensors && a && b && *rest &&
           strlen(rest) < 256 && parse_u64(a, m->n_params, &off) && parse_u64(b, m->n_params - off, &cnt);
      if (ok) {
        td_ckpt_tensor *x = &m->tensors[m->n_tensor_lines];
        x->offset = (size_t)off;
        x->count = (size_t)cnt;
        x->name = strdup(rest);
        if (!x->name) st = td_error(TD_ERR_SYSTEM, "out of memory reading %s", source);
        else m->n_tensor_lines++;
      }
    } else if (strcmp(key, "n_arenas") == 0) {
      ok = parse_u64(v, TD_CKPT_MAX_ARENAS, &u) && u >= 1;
      m->n_arenas = (int)u;
    } else if (strcmp(key, "arena") == 0) {
      /* "arena ID NAME f32 COUNT", after n_arenas; each id once. */
      unsigned long long id = 0, cnt = 0;
      char *a = next_field(&rest), *name = next_field(&rest), *dtype = next_field(&rest), *c = next_field(&rest);
      ok = m->n_arenas > 0 && a && name && dtype && c && !next_field(&rest) &&
           parse_u64(a, (unsigned long long)m->n_arenas - 1, &id) && !arena_seen[id] &&
           strlen(name) < sizeof m->arenas[0].name && strcmp(dtype, "f32") == 0 && parse_u64(c, MAX_ELEMENTS, &cnt);
      if (ok) {
        arena_seen[id] = 1;
        n_arena_lines++;
        td_strlcpy(m->arenas[id].name, name, sizeof m->arenas[id].name);
        m->arenas[id].count = cnt;
      }
    } else if (strcmp(key, "n_files") == 0) {
      ok = parse_u64(v, 1u << 20, &u);
      if (ok) {
        m->n_files = (int)u;
        m->files = calloc(u ? u : 1, sizeof *m->files);
        if (!m->files) st = td_error(TD_ERR_SYSTEM, "out of memory reading %s", source);
      }
    } else if (strcmp(key, "file") == 0) {
      /* "file NAME BYTES", after n_files. */
      char *name = next_field(&rest), *b = next_field(&rest);
      unsigned long long bytes = 0;
      ok = m->files && m->n_file_lines < m->n_files && name && b && !next_field(&rest) && plain_file_name(name) &&
           parse_u64(b, MAX_ELEMENTS * 4 * TD_CKPT_MAX_ARENAS, &bytes);
      for (int f = 0; ok && f < m->n_file_lines; f++)
        if (strcmp(m->files[f].name, name) == 0) ok = 0;
      if (ok) {
        td_strlcpy(m->files[m->n_file_lines].name, name, sizeof m->files[0].name);
        m->files[m->n_file_lines++].bytes = bytes;
      }
    } else if (strcmp(key, "piece") == 0) {
      /* "piece FILE ARENA LO HI OFFSET CRCS", after chunk_bytes, its arena
       * line and n_files. */
      char *f_text = next_field(&rest), *a_text = next_field(&rest), *lo_text = next_field(&rest),
           *hi_text = next_field(&rest), *off_text = next_field(&rest), *crcs = next_field(&rest);
      unsigned long long f = 0, a = 0, lo = 0, hi = 0, off = 0;
      ok = m->n_files > 0 && m->n_arenas > 0 && m->chunk_bytes > 0 && crcs && !next_field(&rest) &&
           parse_u64(f_text, (unsigned long long)m->n_files - 1, &f) &&
           parse_u64(a_text, (unsigned long long)m->n_arenas - 1, &a) && arena_seen[a] &&
           parse_u64(hi_text, m->arenas[a].count, &hi) && parse_u64(lo_text, hi, &lo) && lo < hi &&
           parse_u64(off_text, MAX_ELEMENTS * 4 * TD_CKPT_MAX_ARENAS, &off);
      uint64_t n_crc = ok ? ((hi - lo) * 4 + m->chunk_bytes - 1) / m->chunk_bytes : 0;
      uint32_t *crc = ok ? malloc(n_crc * sizeof *crc) : NULL;
      if (ok && !crc) st = td_error(TD_ERR_SYSTEM, "out of memory reading %s", source);
      const char *c = crcs;
      for (uint64_t k = 0; ok && crc && k < n_crc; k++) {
        if (k > 0 && *c++ != ',') ok = 0;
        else ok = parse_hex32(&c, &crc[k]);
      }
      if (ok && crc && *c) ok = 0; /* more CRCs than chunks */
      if (ok && crc && m->n_pieces == cap_pieces) {
        int ncap = cap_pieces ? 2 * cap_pieces : 16;
        td_ckpt_piece *grown = ncap > (1 << 26) ? NULL : realloc(m->pieces, (size_t)ncap * sizeof *grown);
        if (!grown) st = td_error(TD_ERR_SYSTEM, "out of memory reading %s", source);
        else m->pieces = grown, cap_pieces = ncap;
      }
      if (ok && crc && st == TD_OK) {
        m->pieces[m->n_pieces++] = (td_ckpt_piece){(int)f, (int)a, lo, hi, off, crc, n_crc};
        crc = NULL;
      }
      free(crc);
    }
    /* Other keys are informational (a later Tandem may add some). */
    if (!ok && st == TD_OK) st = td_error(TD_ERR_IO, "%s is corrupt: cannot parse the line \"%s\"", source, shown);
  }
  free(text);
  if (st == TD_OK && m->format == 1)
    st = td_error(TD_ERR_IO,
                  "%s: this checkpoint has format 1 (written by a Tandem before checkpoints could reshard); this "
                  "Tandem reads format %d only. Resume it with the Tandem that wrote it and train on, or start afresh",
                  source, TD_CKPT_FORMAT);
  else if (st == TD_OK && m->format == -1)
    st = td_error(TD_ERR_IO, "%s is not a Tandem checkpoint manifest: it has no \"%s\" line", source, TD_CKPT_MAGIC);
  else if (st == TD_OK && m->format != TD_CKPT_FORMAT)
    st = td_error(TD_ERR_IO, "%s: checkpoint format %d, this Tandem reads format %d", source, m->format,
                  TD_CKPT_FORMAT);
  if (st == TD_OK && (m->world < 1 || m->n_params == 0 || m->n_states < 1 || !m->kind[0] || !m->optimizer[0] ||
                      m->n_tensors < 0 || m->n_tensor_lines != m->n_tensors || m->chunk_bytes == 0 ||
                      m->n_arenas < 1 || n_arena_lines != m->n_arenas || m->n_files < 0 ||
                      m->n_file_lines != m->n_files))
    st = td_error(TD_ERR_IO,
                  "%s is corrupt: a required line (world_size, n_params, n_state_arenas, model_kind, optimizer, "
                  "chunk_bytes, n_tensors, n_arenas, n_files and their tensor, arena and file lines) is missing",
                  source);
  if (st == TD_OK && (m->n_arenas != 1 + m->n_states || m->arenas[TD_CKPT_ARENA_PARAMS].count != m->n_params))
    st = td_error(TD_ERR_IO, "%s is corrupt: %d arenas for %d optimizer states, parameter arena of %llu for %zu "
                             "parameters",
                  source, m->n_arenas, m->n_states, (unsigned long long)m->arenas[0].count, m->n_params);
  if (st == TD_OK) st = check_tiling(m, source);
  if (st != TD_OK) td_ckpt_manifest_free(m);
  return st;
}

void td_ckpt_pieces_overlapping(const td_ckpt_manifest *m, int arena, uint64_t lo, uint64_t hi, int *first, int *end) {
  /* Pieces are sorted by (arena, lo): the first whose (arena, hi) > (arena, lo). */
  int a = 0, b = m->n_pieces;
  while (a < b) {
    int mid = a + (b - a) / 2;
    const td_ckpt_piece *p = &m->pieces[mid];
    if (p->arena < arena || (p->arena == arena && p->hi <= lo)) a = mid + 1;
    else b = mid;
  }
  *first = a;
  int e = a;
  while (e < m->n_pieces && m->pieces[e].arena == arena && m->pieces[e].lo < hi) e++;
  *end = e;
}

int td_ckpt_arena_id(const td_ckpt_manifest *m, const char *name) {
  for (int a = 0; a < m->n_arenas; a++)
    if (strcmp(m->arenas[a].name, name) == 0) return a;
  return -1;
}

/* The arenas a trainer's checkpoint holds, named as the manifest names them
 * (save.c writes this table, load.c checks a checkpoint against it). */
int td_ckpt_trainer_arenas(const td_trainer *t, td_ckpt_arena *out) {
  const td_ckpt_group grp = td_ckpt_group_of(t);
  static const char *const adamw[] = {"adamw.m", "adamw.v"};
  int n = 0;
  out[n++] = (td_ckpt_arena){"params", grp.n_params};
  for (int s = 0; s < t->n_states; s++) {
    td_ckpt_arena a = {"", grp.n_params};
    if (t->cfg.optimizer.kind == TD_OPTIMIZER_ADAMW && s < 2) td_strlcpy(a.name, adamw[s], sizeof a.name);
    else snprintf(a.name, sizeof a.name, "%s.state%d", td_optimizer_name(t->cfg.optimizer.kind), s);
    out[n++] = a;
  }
  return n;
}
