/* Dataset readers on real files (Debian's fortunes corpus and
 * dataset-fashion-mnist) and on broken files made in /tmp: missing paths,
 * empty inputs, bad magic numbers, truncated plain and gzip'd files,
 * mismatched counts, out-of-range labels, trailing bytes. Each broken case
 * must fail with TD_ERR_IO and a message naming the file. */
#include <dirent.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef TD_HAVE_ZLIB
#include <zlib.h>
#endif

#include "../common/check.h"
#include "base/base.h"

static char tmpdir[256];

static void expect_io_error(td_status st, const char *must_mention) {
  CHECK_EQ_INT(st, TD_ERR_IO);
  const char *msg = td_last_error();
  if (!strstr(msg, must_mention))
    td_test_fail(__FILE__, __LINE__, "error message \"%s\" does not mention \"%s\"", msg, must_mention);
  printf("  refused as expected: %s\n", msg);
}

static void write_file(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  CHECK(f != NULL);
  CHECK(fwrite(data, 1, n, f) == n);
  fclose(f);
}

static void test_text(void) {
  printf("text: %s\n", TD_DEFAULT_TEXT_PATH);
  /* expected size: regular files, not *.dat / *.u8, following links */
  DIR *d = opendir(TD_DEFAULT_TEXT_PATH);
  CHECK(d != NULL);
  size_t total = 0;
  char first[256] = "";
  struct dirent *e;
  while ((e = readdir(d))) {
    size_t n = strlen(e->d_name);
    if (e->d_name[0] == '.' || (n > 4 && !strcmp(e->d_name + n - 4, ".dat")) || (n > 3 && !strcmp(e->d_name + n - 3, ".u8")))
      continue;
    char p[512];
    snprintf(p, sizeof p, "%s/%s", TD_DEFAULT_TEXT_PATH, e->d_name);
    struct stat sb;
    if (stat(p, &sb) || !S_ISREG(sb.st_mode)) continue;
    total += sb.st_size;
    if (!first[0] || strcmp(e->d_name, first) < 0) snprintf(first, sizeof first, "%s", e->d_name);
  }
  closedir(d);
  const int seq = 64;
  td_dataset *ds;
  CHECK_OK(td_text_dataset_open(TD_DEFAULT_TEXT_PATH, seq, &ds));
  printf("  %zu bytes -> %zu samples of %d (first file %s)\n", total, ds->n_samples, seq, first);
  CHECK(total > 1000000); /* the corpus is ~2.5 MB of English */
  CHECK_EQ_INT(ds->n_samples, (total - 1) / seq);
  CHECK_EQ_INT(ds->input_bytes, seq * 4);
  CHECK_EQ_INT(ds->targets_per_sample, seq);
  /* sample 0 is the first bytes of the first file in name order */
  char p[512];
  snprintf(p, sizeof p, "%s/%s", TD_DEFAULT_TEXT_PATH, first);
  FILE *f = fopen(p, "rb");
  unsigned char head[65];
  CHECK(fread(head, 1, 65, f) == 65);
  fclose(f);
  int32_t in[64], tg[64];
  CHECK_OK(ds->get(ds, 0, in, tg));
  for (int i = 0; i < seq; i++) {
    CHECK_EQ_INT(in[i], head[i]);
    CHECK_EQ_INT(tg[i], head[i + 1]);
  }
  /* the last sample: targets shifted by one, all bytes */
  CHECK_OK(ds->get(ds, ds->n_samples - 1, in, tg));
  for (int i = 0; i + 1 < seq; i++) CHECK_EQ_INT(tg[i], in[i + 1]);
  for (int i = 0; i < seq; i++) CHECK(in[i] >= 0 && in[i] < 256);
  td_dataset_destroy(ds);

  /* one file */
  char path[512];
  snprintf(path, sizeof path, "%s/one.txt", tmpdir);
  const char *text = "hello, tandem!\n";
  write_file(path, text, strlen(text));
  CHECK_OK(td_text_dataset_open(path, 4, &ds));
  CHECK_EQ_INT(ds->n_samples, (strlen(text) - 1) / 4);
  CHECK_OK(ds->get(ds, 1, in, tg));
  CHECK_EQ_INT(in[0], 'o');
  CHECK_EQ_INT(in[2], ' ');
  CHECK_EQ_INT(tg[3], 'a');
  /* a sample past the end is an error naming it, not a read out of bounds */
  CHECK(ds->get(ds, ds->n_samples, in, tg) == TD_ERR_INVALID_ARGUMENT);
  CHECK(strstr(td_last_error(), "sample 3 requested") != NULL);
  td_dataset_destroy(ds);

  /* errors */
  expect_io_error(td_text_dataset_open("/nonexistent/corpus", 8, &ds), "/nonexistent/corpus");
  CHECK(ds == NULL);
  CHECK(strstr(td_last_error(), "--data") != NULL);
  expect_io_error(td_text_dataset_open("", 8, &ds), "--data");
  snprintf(path, sizeof path, "%s/empty.txt", tmpdir);
  write_file(path, "", 0);
  expect_io_error(td_text_dataset_open(path, 8, &ds), "empty.txt");
  snprintf(path, sizeof path, "%s/emptydir", tmpdir);
  CHECK(mkdir(path, 0755) == 0);
  expect_io_error(td_text_dataset_open(path, 8, &ds), "emptydir");
  CHECK_STATUS(td_text_dataset_open(TD_DEFAULT_TEXT_PATH, 0, &ds), TD_ERR_INVALID_ARGUMENT);
}

static void test_fmnist(void) {
  printf("idx: %s\n", TD_DEFAULT_FMNIST_DIR);
  td_dataset *train, *test;
  double t0 = td_now();
  CHECK_OK(td_idx_dataset_open(TD_DEFAULT_FMNIST_DIR, "train", &train));
  CHECK_OK(td_idx_dataset_open(TD_DEFAULT_FMNIST_DIR, "test", &test));
  printf("  train %zu, test %zu samples (read in %.2f s)\n", train->n_samples, test->n_samples, td_now() - t0);
  CHECK_EQ_INT(train->n_samples, 60000);
  CHECK_EQ_INT(test->n_samples, 10000);
  CHECK_EQ_INT(train->input_bytes, 784 * 4);
  CHECK_EQ_INT(train->targets_per_sample, 1);
  float *img = malloc(784 * sizeof(float));
  int32_t label;
  /* Fashion-MNIST is balanced: 6000 / 1000 of each of the 10 classes */
  td_dataset *sets[2] = {train, test};
  int per_class[2] = {6000, 1000};
  double sum = 0, sum2 = 0;
  for (int s = 0; s < 2; s++) {
    int count[10] = {0};
    for (size_t i = 0; i < sets[s]->n_samples; i++) {
      CHECK_OK(sets[s]->get(sets[s], i, img, &label));
      CHECK(label >= 0 && label <= 9);
      count[label]++;
      if (s == 0)
        for (int p = 0; p < 784; p++) sum += img[p], sum2 += (double)img[p] * img[p];
    }
    for (int c = 0; c < 10; c++) CHECK_EQ_INT(count[c], per_class[s]);
  }
  /* normalized with the training set's mean and std: ~0 and ~1 */
  double n = 60000.0 * 784, mean = sum / n, sd = sqrt(sum2 / n - mean * mean);
  printf("  normalized training pixels: mean %.4f, std %.4f\n", mean, sd);
  CHECK_CLOSE(mean, 0.0, 0, 0.01);
  CHECK_CLOSE(sd, 1.0, 0.01, 0);
  /* the first training sample is an ankle boot (label 9); its corner pixel is background */
  CHECK_OK(train->get(train, 0, img, &label));
  CHECK_EQ_INT(label, 9);
  CHECK_CLOSE(img[0], (0.0 - 0.2860) / 0.3530, 1e-5, 0);
  CHECK_OK(test->get(test, 0, img, &label));
  CHECK_EQ_INT(label, 9);
  CHECK(test->get(test, 10000, img, &label) == TD_ERR_INVALID_ARGUMENT);
  CHECK(strstr(td_last_error(), "sample 10000 requested") != NULL);
  free(img);
  td_dataset_destroy(train);
  td_dataset_destroy(test);
}

/* A small IDX pair in dir: n images of 28x28 (pixel = (i + p) % 256), labels i % 10. */
static void put_be32(unsigned char *p, uint32_t v) {
  p[0] = v >> 24, p[1] = v >> 16, p[2] = v >> 8, p[3] = v;
}
static size_t make_images(unsigned char *buf, uint32_t magic, uint32_t n) {
  put_be32(buf, magic), put_be32(buf + 4, n), put_be32(buf + 8, 28), put_be32(buf + 12, 28);
  for (uint32_t i = 0; i < n; i++)
    for (int p = 0; p < 784; p++) buf[16 + i * 784 + p] = (unsigned char)((i + p) % 256);
  return 16 + (size_t)n * 784;
}
static size_t make_labels(unsigned char *buf, uint32_t n, int bad_label) {
  put_be32(buf, 0x801), put_be32(buf + 4, n);
  for (uint32_t i = 0; i < n; i++) buf[8 + i] = (unsigned char)(i % 10);
  if (bad_label) buf[8 + n - 1] = 42;
  return 8 + n;
}

static void idx_case(const char *name, unsigned char *img, size_t img_len, unsigned char *lbl, size_t lbl_len,
                     const char *expect_in_msg) {
  char dir[512], p[600];
  snprintf(dir, sizeof dir, "%s/%s", tmpdir, name);
  CHECK(mkdir(dir, 0755) == 0);
  snprintf(p, sizeof p, "%s/train-images-idx3-ubyte", dir);
  write_file(p, img, img_len);
  snprintf(p, sizeof p, "%s/train-labels-idx1-ubyte", dir);
  write_file(p, lbl, lbl_len);
  td_dataset *ds = NULL;
  td_status st = td_idx_dataset_open(dir, "train", &ds);
  if (!expect_in_msg) {
    CHECK_OK(st);
    CHECK_EQ_INT(ds->n_samples, 5);
    float x[784];
    int32_t y;
    CHECK_OK(ds->get(ds, 3, x, &y));
    CHECK_EQ_INT(y, 3);
    CHECK_CLOSE(x[10], ((13 % 256) / 255.0 - 0.2860) / 0.3530, 1e-5, 1e-6);
    td_dataset_destroy(ds);
    printf("  %s: plain IDX files read\n", name);
  } else {
    expect_io_error(st, expect_in_msg);
    CHECK(ds == NULL);
  }
}

static void test_idx_errors(void) {
  printf("idx: broken files in %s\n", tmpdir);
  size_t cap = 16 + 6 * 784;
  unsigned char *img = malloc(cap), *lbl = malloc(64);
  size_t ni = make_images(img, 0x803, 5), nl = make_labels(lbl, 5, 0);
  idx_case("good", img, ni, lbl, nl, NULL);
  idx_case("truncated", img, ni - 100, lbl, nl, "truncated");
  idx_case("shortheader", img, 10, lbl, nl, "truncated");
  size_t nbad = make_images(img, 0x801, 5);
  idx_case("badmagic", img, nbad, lbl, nl, "magic");
  ni = make_images(img, 0x803, 5);
  nl = make_labels(lbl, 4, 0);
  idx_case("count", img, ni, lbl, nl, "4 labels");
  nl = make_labels(lbl, 5, 1);
  idx_case("badlabel", img, ni, lbl, nl, "label 42");
  nl = make_labels(lbl, 5, 0);
  img[ni] = 7;
  idx_case("trailing", img, ni + 1, lbl, nl, "bytes after");
  td_dataset *ds;
  expect_io_error(td_idx_dataset_open("/nonexistent/fmnist", "train", &ds), "/nonexistent/fmnist");
  CHECK_STATUS(td_idx_dataset_open(TD_DEFAULT_FMNIST_DIR, "validation", &ds), TD_ERR_INVALID_ARGUMENT);
#ifdef TD_HAVE_ZLIB
  /* gzip'd: a good pair, then the image file with its compressed tail cut off */
  char dir[512], p[600];
  snprintf(dir, sizeof dir, "%s/gz", tmpdir);
  CHECK(mkdir(dir, 0755) == 0);
  snprintf(p, sizeof p, "%s/train-images-idx3-ubyte.gz", dir);
  gzFile gz = gzopen(p, "wb");
  CHECK(gz != NULL);
  CHECK(gzwrite(gz, img, (unsigned)ni) == (int)ni);
  gzclose(gz);
  snprintf(p, sizeof p, "%s/train-labels-idx1-ubyte.gz", dir);
  gz = gzopen(p, "wb");
  CHECK(gzwrite(gz, lbl, (unsigned)nl) == (int)nl);
  gzclose(gz);
  CHECK_OK(td_idx_dataset_open(dir, "train", &ds));
  CHECK_EQ_INT(ds->n_samples, 5);
  td_dataset_destroy(ds);
  printf("  gz: gzip'd IDX files read\n");
  snprintf(p, sizeof p, "%s/train-images-idx3-ubyte.gz", dir);
  struct stat sb;
  CHECK(stat(p, &sb) == 0);
  CHECK(truncate(p, sb.st_size / 2) == 0);
  td_status st = td_idx_dataset_open(dir, "train", &ds);
  expect_io_error(st, "train-images-idx3-ubyte.gz");
#endif
  free(img), free(lbl);
}

int main(void) {
  setvbuf(stdout, NULL, _IONBF, 0);
  snprintf(tmpdir, sizeof tmpdir, "/tmp/tandem-nn-data-%d", (int)getpid());
  CHECK(mkdir(tmpdir, 0755) == 0);
  test_text();
  test_idx_errors();
  test_fmnist();
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
  CHECK(system(cmd) == 0);
  printf("dataset checks passed\n");
  return 0;
}
