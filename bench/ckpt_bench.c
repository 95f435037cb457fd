/* Checkpoint save and load time of the GPT reference configuration (4
 * layers, 256 channels, 4 heads, sequence 128, AdamW: parameters and two
 * moments), through the public API only (td_trainer_save, td_trainer_resume),
 * so that bench/ckpt.sh can build it against two versions of the library and
 * compare them in one run.
 *
 *   tandemrun -np N ckpt_bench DIR ROUNDS LABEL
 *
 * Each round: barrier, save (timed on rank 0; a save returns on every rank
 * only once the checkpoint is published), then every data file and the
 * manifest of the new checkpoint are dropped from the page cache
 * (fsync'd files: posix_fadvise DONTNEED drops them, for these files only),
 * barrier, resume (timed: a cold read from the disk). Rank 0 prints one
 * line: LABEL, world, checkpoint bytes, the median save and load seconds and
 * the corresponding MB/s of the whole checkpoint. */
#define _GNU_SOURCE 1
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tandem/tandem.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

enum { T = 128 };
static td_status text_get(const td_dataset *ds, size_t index, void *input, int32_t *targets) {
  (void)ds;
  int32_t *tok = input;
  for (int j = 0; j <= T; j++) {
    int32_t v = (int32_t)((index * 31 + (size_t)j * 7) % 251);
    if (j < T) tok[j] = v;
    if (j > 0) targets[j - 1] = v;
  }
  return TD_OK;
}
static void ds_destroy(td_dataset *ds) { free(ds); }

/* Drop DIR/<latest>/* from the page cache; returns their total size. */
static long long evict(const char *root) {
  char path[1200], name[256] = "";
  snprintf(path, sizeof path, "%s/latest", root);
  FILE *f = fopen(path, "r");
  if (!f || !fgets(name, sizeof name, f)) {
    if (f) fclose(f);
    return -1;
  }
  fclose(f);
  name[strcspn(name, "\n")] = '\0';
  snprintf(path, sizeof path, "%s/%s", root, name);
  DIR *d = opendir(path);
  if (!d) return -1;
  long long total = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char file[1500];
    snprintf(file, sizeof file, "%s/%s", path, e->d_name);
    int fd = open(file, O_RDONLY);
    if (fd < 0) continue;
    struct stat sb;
    if (fstat(fd, &sb) == 0) total += sb.st_size;
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
  }
  closedir(d);
  return total;
}

static void die(const char *what, td_status st) {
  fprintf(stderr, "ckpt_bench: %s: %s: %s\n", what, td_status_str(st), td_last_error());
  exit(1);
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: ckpt_bench DIR ROUNDS LABEL\n");
    return 2;
  }
  const char *dir = argv[1], *label = argv[3];
  int rounds = atoi(argv[2]);
  if (rounds < 1 || rounds > 100) rounds = 5;
  td_comm *comm = NULL;
  td_status st = td_comm_init(&comm);
  if (st != TD_OK) die("td_comm_init", st);
  int rank = td_comm_rank(comm), world = td_comm_size(comm);
  td_gpt_config g = {.vocab = 256, .layers = 4, .channels = 256, .heads = 4, .seq = T};
  td_model *model = NULL;
  if ((st = td_gpt_create(&g, &model)) != TD_OK) die("td_gpt_create", st);
  td_dataset *ds = calloc(1, sizeof *ds);
  *ds = (td_dataset){.n_samples = 64, .input_bytes = T * 4, .targets_per_sample = T, .get = text_get,
                     .destroy = ds_destroy};
  td_train_config c;
  td_train_config_defaults(&c);
  c.micro_batch = 1;
  c.grad_accum = 1;
  c.threads = 1;
  c.keep_last = 2;
  td_trainer *t = NULL;
  if ((st = td_trainer_create(&c, model, ds, comm, &t)) != TD_OK) die("td_trainer_create", st);
  if ((st = td_trainer_step(t, NULL)) != TD_OK) die("td_trainer_step", st); /* non-zero optimizer state */
  double *save_s = calloc((size_t)rounds, sizeof(double)), *load_s = calloc((size_t)rounds, sizeof(double));
  long long bytes = 0;
  for (int r = 0; r < rounds; r++) {
    td_barrier(comm);
    double t0 = now();
    if ((st = td_trainer_save(t, dir)) != TD_OK) die("td_trainer_save", st);
    save_s[r] = now() - t0;
    if (rank == 0) bytes = evict(dir);
    td_barrier(comm);
    t0 = now();
    if ((st = td_trainer_resume(t, dir)) != TD_OK) die("td_trainer_resume", st);
    td_barrier(comm);
    load_s[r] = now() - t0;
  }
  if (rank == 0) {
    double s = median(save_s, rounds), l = median(load_s, rounds);
    printf("%s world=%d params=%zu checkpoint_bytes=%lld save_s=%.4f load_s=%.4f save_MBps=%.0f load_MBps=%.0f\n",
           label, world, td_trainer_n_params(t), bytes, s, l, (double)bytes / s / 1e6, (double)bytes / l / 1e6);
  }
  free(save_s);
  free(load_s);
  td_trainer_destroy(t);
  td_model_destroy(model);
  td_dataset_destroy(ds);
  td_comm_finalize(comm);
  td_comm_destroy(comm);
  return 0;
}
