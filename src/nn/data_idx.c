/* IDX files (MNIST, Fashion-MNIST): dir/{train,t10k}-{images-idx3,labels-idx1}-ubyte,
 * gzip'd (".gz", read through zlib when the build has it) or plain.
 * Format: big-endian magic 0x00000803 (u8 images, 3 dims) or 0x00000801
 * (u8 labels, 1 dim), then the dimensions as big-endian u32, then the data.
 * Headers, counts and the data length are validated; a truncated or corrupt
 * file is refused, naming the file and what was expected. Images stay bytes
 * in memory (47 MB for the training set) and are normalized on copy:
 * (x/255 - 0.2860) / 0.3530, Fashion-MNIST's training-set mean and std. */
#include "nn_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#ifdef TD_HAVE_ZLIB
#include <zlib.h>
#endif

#define FMNIST_MEAN 0.2860f
#define FMNIST_STD 0.3530f

typedef struct idx_impl {
  uint8_t *images; /* (n, rows*cols) */
  uint8_t *labels; /* (n) */
  size_t pixels;   /* rows * cols */
  float lut[256];  /* byte -> normalized float */
} idx_impl;

/* A reader over a plain or gzip'd file. */
typedef struct idx_reader {
  const char *path;
#ifdef TD_HAVE_ZLIB
  gzFile gz;
#else
  FILE *f;
#endif
} idx_reader;

static td_status reader_open(idx_reader *r, const char *path) {
  r->path = path;
#ifdef TD_HAVE_ZLIB
  r->gz = gzopen(path, "rb"); /* reads plain files transparently too */
  if (!r->gz) return td_error(TD_ERR_IO, "idx dataset: cannot open %s: %s", path, strerror(errno));
#else
  size_t n = strlen(path);
  if (n > 3 && strcmp(path + n - 3, ".gz") == 0)
    return td_error(TD_ERR_IO,
                    "idx dataset: %s is gzip'd but this build has no zlib: apt-get install zlib1g-dev and rebuild, "
                    "or gunzip the file",
                    path);
  r->f = fopen(path, "rb");
  if (!r->f) return td_error(TD_ERR_IO, "idx dataset: cannot open %s: %s", path, strerror(errno));
#endif
  return TD_OK;
}

/* Read exactly n bytes; what = what they are, for the message. */
static td_status reader_read(idx_reader *r, void *buf, size_t n, const char *what) {
  size_t done = 0;
  while (done < n) {
#ifdef TD_HAVE_ZLIB
    unsigned chunk = (unsigned)TD_MIN(n - done, (size_t)1 << 30);
    int got = gzread(r->gz, (char *)buf + done, chunk);
    if (got < 0) {
      int errnum = 0;
      const char *msg = gzerror(r->gz, &errnum);
      return td_error(TD_ERR_IO, "idx dataset: %s is corrupt (%s) while reading %s; re-download or reinstall it",
                      r->path, msg, what);
    }
#else
    size_t got = fread((char *)buf + done, 1, n - done, r->f);
    if (got == 0 && ferror(r->f)) return td_error(TD_ERR_IO, "idx dataset: read error on %s", r->path);
#endif
    if (got == 0)
      return td_error(TD_ERR_IO,
                      "idx dataset: %s is truncated: it ends after %zu of the %zu bytes of %s; re-download or "
                      "reinstall it (apt-get install --reinstall dataset-fashion-mnist)",
                      r->path, done, n, what);
    done += (size_t)got;
  }
  return TD_OK;
}

/* 1 if bytes remain after the expected data. */
static int reader_has_more(idx_reader *r) {
  char c;
#ifdef TD_HAVE_ZLIB
  return gzread(r->gz, &c, 1) > 0;
#else
  return fread(&c, 1, 1, r->f) == 1;
#endif
}

static void reader_close(idx_reader *r) {
#ifdef TD_HAVE_ZLIB
  if (r->gz) gzclose(r->gz);
  r->gz = NULL;
#else
  if (r->f) fclose(r->f);
  r->f = NULL;
#endif
}

static uint32_t be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* Read one IDX file with the given magic and number of dims; dims_out gets
 * the dimensions, *data_out the payload (malloc'd). */
static td_status read_idx(const char *path, uint32_t magic, int n_dims, uint32_t *dims_out, uint8_t **data_out) {
  *data_out = NULL;
  idx_reader r = {0};
  TD_CHECK(reader_open(&r, path));
  td_status st;
  uint8_t head[16];
  TD_CHECK_GOTO(reader_read(&r, head, 4 + 4 * (size_t)n_dims, "the header"), st, fail);
  uint32_t got_magic = be32(head);
  if (got_magic != magic) {
    st = td_error(TD_ERR_IO,
                  "idx dataset: %s has magic number 0x%08x, expected 0x%08x (%s); is it an IDX %s file?", path,
                  got_magic, magic, n_dims == 3 ? "u8 images, 3 dims" : "u8 labels, 1 dim",
                  n_dims == 3 ? "images" : "labels");
    goto fail;
  }
  size_t total = 1;
  for (int i = 0; i < n_dims; i++) {
    dims_out[i] = be32(head + 4 + 4 * i);
    if (dims_out[i] == 0 || dims_out[i] > (1u << 26)) {
      st = td_error(TD_ERR_IO, "idx dataset: %s declares dimension %d = %u, which is not plausible; the file is corrupt",
                    path, i, dims_out[i]);
      goto fail;
    }
    total *= dims_out[i];
  }
  if (total > ((size_t)1 << 33)) {
    st = td_error(TD_ERR_IO, "idx dataset: %s declares %zu bytes of data; the file is corrupt", path, total);
    goto fail;
  }
  *data_out = malloc(total);
  if (!*data_out) {
    st = td_error(TD_ERR_SYSTEM, "idx dataset: out of memory for %zu bytes of %s", total, path);
    goto fail;
  }
  char what[64];
  snprintf(what, sizeof what, "the data (%u %s)", dims_out[0], n_dims == 3 ? "images" : "labels");
  TD_CHECK_GOTO(reader_read(&r, *data_out, total, what), st, fail);
  if (reader_has_more(&r)) {
    st = td_error(TD_ERR_IO, "idx dataset: %s has bytes after the %zu its header declares; the file is corrupt", path,
                  total + 4 + 4 * (size_t)n_dims);
    goto fail;
  }
  reader_close(&r);
  return TD_OK;
fail:
  reader_close(&r);
  free(*data_out);
  *data_out = NULL;
  return st;
}

/* dir/name.gz if it exists, else dir/name. */
static void pick_path(char *out, size_t size, const char *dir, const char *name) {
  struct stat sb;
  snprintf(out, size, "%s/%s.gz", dir, name);
  if (stat(out, &sb) == 0) return;
  snprintf(out, size, "%s/%s", dir, name);
}

static td_status idx_get(const td_dataset *ds, size_t index, void *input, int32_t *targets) {
  const idx_impl *m = ds->impl;
  if (index >= ds->n_samples)
    return td_error(TD_ERR_INVALID_ARGUMENT, "idx dataset: sample %zu requested, the split has %zu images", index,
                    ds->n_samples);
  const uint8_t *img = m->images + index * m->pixels;
  float *x = input;
  for (size_t i = 0; i < m->pixels; i++) x[i] = m->lut[img[i]];
  targets[0] = m->labels[index];
  return TD_OK;
}

static void idx_destroy(td_dataset *ds) {
  if (!ds) return;
  idx_impl *m = ds->impl;
  if (m) {
    free(m->images);
    free(m->labels);
  }
  free(m);
  free(ds);
}

td_status td_idx_dataset_open(const char *dir, const char *split, td_dataset **out) {
  if (!out) return td_error(TD_ERR_INVALID_ARGUMENT, "td_idx_dataset_open: out must not be NULL");
  *out = NULL;
  if (!dir || !*dir)
    return td_error(TD_ERR_IO, "idx dataset: no directory given: pass --data DIR (default %s, apt-get install "
                               "dataset-fashion-mnist)",
                    TD_DEFAULT_FMNIST_DIR);
  const char *prefix;
  if (split && strcmp(split, "train") == 0)
    prefix = "train";
  else if (split && strcmp(split, "test") == 0)
    prefix = "t10k";
  else
    return td_error(TD_ERR_INVALID_ARGUMENT, "idx dataset: split must be \"train\" or \"test\", got \"%s\"",
                    split ? split : "(null)");
  struct stat sb;
  if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
    return td_error(TD_ERR_IO,
                    "idx dataset: %s is not a directory; pass the folder holding %s-images-idx3-ubyte[.gz] with "
                    "--data (apt-get install dataset-fashion-mnist installs %s)",
                    dir, prefix, TD_DEFAULT_FMNIST_DIR);
  char img_path[4096], lbl_path[4096], name[64];
  snprintf(name, sizeof name, "%s-images-idx3-ubyte", prefix);
  pick_path(img_path, sizeof img_path, dir, name);
  snprintf(name, sizeof name, "%s-labels-idx1-ubyte", prefix);
  pick_path(lbl_path, sizeof lbl_path, dir, name);

  uint32_t idims[3] = {0}, ldims[1] = {0};
  uint8_t *images = NULL, *labels = NULL;
  TD_CHECK(read_idx(img_path, 0x00000803u, 3, idims, &images));
  td_status st = read_idx(lbl_path, 0x00000801u, 1, ldims, &labels);
  if (st != TD_OK) {
    free(images);
    return st;
  }
  if (idims[0] != ldims[0]) {
    free(images);
    free(labels);
    return td_error(TD_ERR_IO, "idx dataset: %s holds %u images but %s holds %u labels; the files do not match",
                    img_path, idims[0], lbl_path, ldims[0]);
  }
  if (idims[1] != 28 || idims[2] != 28) {
    free(images);
    free(labels);
    return td_error(TD_ERR_IO, "idx dataset: %s holds %ux%u images; the models here expect 28x28", img_path, idims[1],
                    idims[2]);
  }
  for (uint32_t i = 0; i < ldims[0]; i++)
    if (labels[i] > 9) {
      uint32_t bad = labels[i];
      free(images);
      free(labels);
      return td_error(TD_ERR_IO, "idx dataset: %s: label %u of sample %u is outside 0..9; the file is corrupt",
                      lbl_path, bad, i);
    }
  td_dataset *ds = calloc(1, sizeof *ds);
  idx_impl *m = calloc(1, sizeof *m);
  if (!ds || !m) {
    free(ds);
    free(m);
    free(images);
    free(labels);
    return td_error(TD_ERR_SYSTEM, "idx dataset: out of memory");
  }
  m->images = images;
  m->labels = labels;
  m->pixels = (size_t)idims[1] * idims[2];
  for (int v = 0; v < 256; v++) m->lut[v] = ((float)v / 255.0f - FMNIST_MEAN) / FMNIST_STD;
  ds->n_samples = idims[0];
  ds->input_bytes = m->pixels * sizeof(float);
  ds->targets_per_sample = 1;
  ds->get = idx_get;
  ds->destroy = idx_destroy;
  ds->impl = m;
  *out = ds;
  return TD_OK;
}
