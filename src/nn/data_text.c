/* Byte-level text dataset: one file, or every regular file of a directory
 * in sorted name order (skipping fortune's index files *.dat and its *.u8
 * links), concatenated in memory. Sample i is the window of seq+1 bytes at
 * i*seq: inputs are its first seq bytes, targets the seq bytes after each. */
#include "nn_internal.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct text_impl {
  uint8_t *bytes;
  size_t n_bytes;
  int seq;
} text_impl;

static td_status text_get(const td_dataset *ds, size_t index, void *input, int32_t *targets) {
  const text_impl *t = ds->impl;
  if (index >= ds->n_samples)
    return td_error(TD_ERR_INVALID_ARGUMENT, "text dataset: sample %zu requested, the corpus has %zu samples", index,
                    ds->n_samples);
  const uint8_t *w = t->bytes + index * (size_t)t->seq;
  int32_t *in = input;
  for (int i = 0; i < t->seq; i++) {
    in[i] = w[i];
    targets[i] = w[i + 1];
  }
  return TD_OK;
}

static void text_destroy(td_dataset *ds) {
  if (!ds) return;
  text_impl *t = ds->impl;
  if (t) free(t->bytes);
  free(t);
  free(ds);
}

/* Append the whole file at path to text. */
static td_status append_file(const char *path, td_buf *text) {
  FILE *f = fopen(path, "rb");
  if (!f) return td_error(TD_ERR_IO, "text dataset: cannot open %s: %s", path, strerror(errno));
  int failed = td_buf_append_file(text, f, SIZE_MAX);
  fclose(f);
  if (text->failed) return td_error(TD_ERR_SYSTEM, "text dataset: out of memory reading %s", path);
  if (failed) return td_error(TD_ERR_IO, "text dataset: read error on %s", path);
  return TD_OK;
}

static int ends_with(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && strcmp(s + a - b, suffix) == 0;
}

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static td_status read_dir(const char *dir, td_buf *text, int *n_files) {
  DIR *d = opendir(dir);
  if (!d) return td_error(TD_ERR_IO, "text dataset: cannot open directory %s: %s", dir, strerror(errno));
  char **names = NULL;
  size_t n = 0, ncap = 0;
  td_status st = TD_OK;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.' || ends_with(e->d_name, ".dat") || ends_with(e->d_name, ".u8")) continue;
    if (n == ncap) {
      ncap = ncap ? 2 * ncap : 64;
      char **nn = realloc(names, ncap * sizeof *names);
      if (!nn) {
        st = td_error(TD_ERR_SYSTEM, "text dataset: out of memory listing %s", dir);
        goto done;
      }
      names = nn;
    }
    names[n] = strdup(e->d_name);
    if (!names[n]) {
      st = td_error(TD_ERR_SYSTEM, "text dataset: out of memory listing %s", dir);
      goto done;
    }
    n++;
  }
  if (n > 1) qsort(names, n, sizeof *names, cmp_names);
  for (size_t i = 0; i < n; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    struct stat sb;
    /* regular files only (following links): skips subdirectories and sockets */
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
    TD_CHECK_GOTO(append_file(path, text), st, done);
    (*n_files)++;
  }
done:
  for (size_t i = 0; i < n; i++) free(names[i]);
  free(names);
  closedir(d);
  return st;
}

td_status td_text_dataset_open(const char *path, int seq, td_dataset **out) {
  if (!out) return td_error(TD_ERR_INVALID_ARGUMENT, "td_text_dataset_open: out must not be NULL");
  *out = NULL;
  if (seq <= 0) return td_error(TD_ERR_INVALID_ARGUMENT, "text dataset: sequence length must be positive, got %d", seq);
  if (!path || !*path)
    return td_error(TD_ERR_IO,
                    "text dataset: no path given: pass a text file or a directory of text files with --data "
                    "(default %s, from Debian's fortunes package)",
                    TD_DEFAULT_TEXT_PATH);
  struct stat sb;
  if (stat(path, &sb) != 0)
    return td_error(TD_ERR_IO,
                    "text dataset: %s: %s; pass a text file or a directory of text files with --data "
                    "(apt-get install fortunes provides %s)",
                    path, strerror(errno), TD_DEFAULT_TEXT_PATH);
  td_buf text = {0};
  int n_files = 0;
  td_status st;
  if (S_ISDIR(sb.st_mode)) {
    st = read_dir(path, &text, &n_files);
  } else {
    st = append_file(path, &text);
    n_files = 1;
  }
  size_t len = text.len;
  uint8_t *buf = (uint8_t *)td_buf_take(&text, NULL);
  if (st != TD_OK) {
    free(buf);
    return st;
  }
  if (len < (size_t)seq + 1) {
    free(buf);
    return td_error(TD_ERR_IO,
                    "text dataset: %s holds %zu bytes in %d file(s), fewer than one sample of %d+1 bytes; pass a "
                    "larger text file or directory with --data",
                    path, len, n_files, seq);
  }
  td_dataset *ds = calloc(1, sizeof *ds);
  text_impl *t = calloc(1, sizeof *t);
  if (!ds || !t) {
    free(ds);
    free(t);
    free(buf);
    return td_error(TD_ERR_SYSTEM, "text dataset: out of memory");
  }
  t->bytes = buf;
  t->n_bytes = len;
  t->seq = seq;
  ds->n_samples = (len - 1) / (size_t)seq;
  ds->input_bytes = (size_t)seq * sizeof(int32_t);
  ds->targets_per_sample = (size_t)seq;
  ds->get = text_get;
  ds->destroy = text_destroy;
  ds->impl = t;
  *out = ds;
  return TD_OK;
}
