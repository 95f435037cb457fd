/* NVMe offload (src/train/offload/): the I/O layer against plain
 * write()/pread(), the trainer with offload against stage 3 in memory bit
 * for bit, and the safety checks.
 *
 *   test_offload aio DIR
 *       The engine TANDEM_AIO picks (uring / threads) reads a file written
 *       with plain write() at offsets, lengths and buffer alignments of
 *       every kind (0, 1 byte, odd, unaligned tails, whole blocks, buffers
 *       congruent and not with the offset) and must return its bytes; its
 *       writes at such places must leave the bytes a memory image of the
 *       same writes predicts (read back with pread). A read past the end is
 *       TD_ERR_IO naming the file and the offset.
 *   test_offload enospc DIR      (DIR: a tiny tmpfs) a write that does not
 *       fit is TD_ERR_IO saying the disk is full and what to do.
 *   test_offload equal DIR adamw|sgd BF16      (under tandemrun)
 *       Trainers on the same ranks step in lockstep: stage 3 in memory,
 *       stage 3 with offload_optimizer nvme, stage 3 with offload_optimizer
 *       and offload_param nvme (with 1, 2 and 4 buffers and tiles of 1024
 *       elements, so a shard spans many tiles). Losses, gradient norms and
 *       the gathered parameters equal stage 3 in memory BIT FOR BIT; the
 *       files are gone after destroy.
 *   test_offload init_range       td_model_init_params_range equals
 *       td_model_init_params on ranges of every kind.
 *   test_offload estimate DIR     the estimate's disk bytes against the
 *       files the trainer really creates, and its RAM parts.
 *   test_offload refuse DIR space|file|readonly|missing
 *       td_trainer_create refuses with the numbers / the reason.
 *   test_offload leave DIR        offloads, then dies by SIGKILL.
 *   test_offload clean DIR        finds the killed job's directory, and a
 *       new trainer's start removes it; destroy leaves DIR empty.
 *   test_offload readfail DIR    (2 ranks) rank 1's parameter file is cut
 *       short: the next step fails on both ranks naming rank 1, the file
 *       and the offset, and nobody hangs.
 *   test_offload fail DIR         a step fails (a sample cannot be read);
 *       destroy still removes the files.
 *   test_offload peer DIR         two starts on one path at the worst
 *       instant: this binary's flock() (it takes precedence over libc's)
 *       starts a second trainer on DIR right when the first is about to
 *       lock its directory's lock file, so the second start's scan for dead
 *       jobs runs then (what a peer rank does when the ranks start side by
 *       side, once in many runs). Both must start, step and clean up; a
 *       hidden directory of a start killed before its rename goes when old,
 *       a young one (a start in progress) stays. */
#include "train/offload/aio.h"
#include "train/offload/offload.h"
#include "train/core/core.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>

#include "../common/check.h"

enum { T_SEQ = 17, G = 12 };

/* ---- the I/O layer ---- */

static void write_all(int fd, const unsigned char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    CHECK(w > 0);
    p += w, n -= (size_t)w;
  }
}

static void run_aio(const char *dir) {
  uint64_t seed = 42;
  const size_t N = 3 * 65536 + 12345; /* not a multiple of anything */
  unsigned char *ref = malloc(N);
  for (size_t i = 0; i < N; i++) ref[i] = (unsigned char)(td_test_urand(&seed) * 127.0f + 128.0f);
  char path_a[512], path_b[512];
  snprintf(path_a, sizeof path_a, "%s/aio-a", dir);
  snprintf(path_b, sizeof path_b, "%s/aio-b", dir);
  int fd = open(path_a, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  CHECK(fd >= 0);
  write_all(fd, ref, N);
  close(fd);

  td_aio *aio = NULL;
  td_aio_config cfg = {8192, 3, 3}; /* small blocks and queue: many pieces, a full queue */
  CHECK_OK(td_aio_create(&cfg, "test", &aio));
  const char *want = getenv("TANDEM_AIO");
  printf("engine %s\n", td_aio_engine_name(aio));
  if (want && !strcmp(want, "threads")) CHECK(!strcmp(td_aio_engine_name(aio), "threads"));
  if (want && !strcmp(want, "uring")) CHECK(!strcmp(td_aio_engine_name(aio), "io_uring"));
  td_aio_file *fa = NULL, *fb = NULL;
  CHECK_OK(td_aio_open(aio, path_a, false, &fa));
  printf("O_DIRECT %s\n", td_aio_file_direct(fa) ? "yes" : "refused (buffered)");

  /* reads: (offset, length, buffer misalignment) */
  const size_t offs[] = {0, 1, 4095, 4096, 8192, 12289, 65536, N - 1, N - 4097};
  const size_t lens[] = {0, 1, 7, 4096, 4097, 8192 * 3, 65536 + 3, 100000};
  const size_t mis[] = {0, 1, 4095, 4096 - 1, 17};
  unsigned char *buf = td_aio_alloc(200000 + 8192);
  int n_reads = 0;
  for (size_t i = 0; i < TD_ARRAY_SIZE(offs); i++)
    for (size_t j = 0; j < TD_ARRAY_SIZE(lens); j++)
      for (size_t k = 0; k < TD_ARRAY_SIZE(mis) + 1; k++) {
        size_t off = offs[i], len = lens[j];
        if (off + len > N) continue;
        /* k == last: the buffer congruent with the offset (the O_DIRECT path) */
        size_t m = k < TD_ARRAY_SIZE(mis) ? mis[k] : off % 4096;
        unsigned char *dst = buf + m;
        memset(buf, 0xEE, 200000 + 8192);
        td_aio_req *r = NULL;
        CHECK_OK(td_aio_read(aio, fa, dst, len, off, &r));
        CHECK_OK(td_aio_wait(aio, r));
        if (memcmp(dst, ref + off, len) != 0)
          td_test_fail(__FILE__, __LINE__, "read of %zu bytes at %zu (buffer +%zu) differs", len, off, m);
        if (m > 0) CHECK(buf[m - 1] == 0xEE); /* nothing written before the buffer */
        CHECK(dst[len] == 0xEE);              /* nor after it */
        n_reads++;
      }
  /* several requests in flight at once, waited for in reverse order */
  td_aio_req *rs[6];
  unsigned char *bufs[6];
  for (int i = 0; i < 6; i++) {
    bufs[i] = td_aio_alloc(40000);
    CHECK_OK(td_aio_read(aio, fa, bufs[i] + i, 33333, (uint64_t)i * 30001, &rs[i]));
  }
  for (int i = 5; i >= 0; i--) {
    CHECK_OK(td_aio_wait(aio, rs[i]));
    CHECK(memcmp(bufs[i] + i, ref + (size_t)i * 30001, 33333) == 0);
    td_aio_free(bufs[i]);
  }

  /* writes into a fresh file: a memory image predicts the bytes */
  unsigned char *image = calloc(1, N);
  CHECK_OK(td_aio_open(aio, path_b, true, &fb));
  const size_t woffs[] = {0, 4096, 5000, 12288, 70001, 131072};
  const size_t wlens[] = {1, 4096, 12345, 8192, 61439, 65536 + 4096};
  size_t end = 0;
  for (size_t i = 0; i < TD_ARRAY_SIZE(woffs); i++) {
    size_t off = woffs[i], len = wlens[i];
    unsigned char *src = buf + (i % 2 ? off % 4096 : 3); /* congruent, then not */
    for (size_t b = 0; b < len; b++) src[b] = (unsigned char)(i * 37 + b * 11);
    memcpy(image + off, src, len);
    td_aio_req *r = NULL;
    CHECK_OK(td_aio_write(aio, fb, src, len, off, &r));
    CHECK_OK(td_aio_wait(aio, r));
    if (off + len > end) end = off + len;
  }
  fd = open(path_b, O_RDONLY);
  CHECK(fd >= 0);
  unsigned char *back = calloc(1, N);
  CHECK(pread(fd, back, end, 0) == (ssize_t)end);
  close(fd);
  for (size_t b = 0; b < end; b++)
    if (back[b] != image[b]) td_test_fail(__FILE__, __LINE__, "byte %zu of the written file is %d, expected %d", b, back[b], image[b]);

  /* a read past the end of the file */
  td_aio_req *r = NULL;
  CHECK_OK(td_aio_read(aio, fa, buf, 10000, N - 100, &r));
  CHECK_MSG(td_aio_wait(aio, r), TD_ERR_IO, "aio-a");
  CHECK(strstr(td_last_error(), "offset") != NULL);
  CHECK(strstr(td_last_error(), "short read") != NULL);

  td_aio_stats st;
  td_aio_get_stats(aio, &st);
  printf("%d checked reads; read %llu bytes, wrote %llu, %llu through O_DIRECT\n", n_reads,
         (unsigned long long)st.bytes_read, (unsigned long long)st.bytes_written, (unsigned long long)st.direct_bytes);
  if (td_aio_file_direct(fa)) CHECK(st.direct_bytes > 0);
  td_aio_close(fa);
  td_aio_close(fb);
  td_aio_destroy(aio);
  td_aio_free(buf);
  free(ref), free(image), free(back);
  unlink(path_a), unlink(path_b);
  printf("OK aio\n");
}

static void run_enospc(const char *dir) {
  char path[512];
  snprintf(path, sizeof path, "%s/full", dir);
  td_aio *aio = NULL;
  td_aio_config cfg = {1 << 20, 8, 1};
  CHECK_OK(td_aio_create(&cfg, "test", &aio));
  td_aio_file *f = NULL;
  CHECK_OK(td_aio_open(aio, path, true, &f));
  size_t n = 8 << 20; /* the tmpfs holds 1 MiB */
  unsigned char *buf = td_aio_alloc(n);
  memset(buf, 1, n);
  td_aio_req *r = NULL;
  CHECK_OK(td_aio_write(aio, f, buf, n, 0, &r));
  CHECK_MSG(td_aio_wait(aio, r), TD_ERR_IO, "No space left");
  CHECK(strstr(td_last_error(), "nvme_path") && strstr(td_last_error(), path));
  printf("%s\n", td_last_error());
  td_aio_close(f);
  td_aio_destroy(aio);
  td_aio_free(buf);
  unlink(path);
  printf("OK enospc\n");
}

/* ---- the trainer ---- */

static int fault_armed;
static td_dataset *text_dataset(void) {
  return td_test_text_dataset("the quick brown fox jumps over the lazy dog. ", 7, T_SEQ, 240, &fault_armed);
}

static td_model *gpt(int layers, int channels) {
  td_gpt_config c = {.vocab = 256, .layers = layers, .channels = channels, .heads = 5, .seq = T_SEQ, .tied = 1};
  td_model *m = NULL;
  CHECK_OK(td_gpt_create(&c, &m));
  return m;
}

static void base_config(td_train_config *c, int world, td_optimizer_kind opt, int bf16) {
  td_train_config_defaults(c);
  c->train_batch_size = G;
  c->grad_accum = 1;
  c->micro_batch = G / world;
  c->seed = 7;
  c->optimizer.kind = opt;
  c->optimizer.lr = opt == TD_OPTIMIZER_SGD ? 0.05f : 3e-3f;
  c->optimizer.momentum = opt == TD_OPTIMIZER_SGD ? 0.9f : 0.0f;
  c->optimizer.weight_decay = 0.01f;
  c->scheduler = (td_schedule_config){TD_SCHEDULE_WARMUP_COSINE, 2, 10, 0.1f, 0.1f};
  c->grad_clip = 0.5f;
  c->threads = 1;
  c->first_bucket_bytes = 512;
  c->bucket_bytes = 4096;
  c->zero_stage = 3;
  c->stage3_param_persistence_threshold = 2000;
  c->stage3_max_live_parameters = 16000;
  if (bf16) {
    c->precision.compute = TD_BF16;
    c->activation_checkpointing = 1;
  }
}

static void set_offload(td_train_config *c, const char *dir, int params, int buffers) {
  c->offload.optimizer_device = TD_OFFLOAD_NVME;
  td_strlcpy(c->offload.optimizer_nvme_path, dir, sizeof c->offload.optimizer_nvme_path);
  c->offload.optimizer_buffer_count = buffers;
  c->offload.sub_group_size = 1000; /* rounded up to 1024 elements: many tiles */
  if (params) {
    c->offload.param_device = TD_OFFLOAD_NVME;
    td_strlcpy(c->offload.param_nvme_path, dir, sizeof c->offload.param_nvme_path);
  }
}

/* Entries of dir named tandem-offload-* */
static int count_job_dirs(const char *dir) {
  DIR *d = opendir(dir);
  CHECK(d != NULL);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) n += strncmp(e->d_name, "tandem-offload-", 15) == 0;
  closedir(d);
  return n;
}

static void run_equal(td_comm *comm, const char *dir, td_optimizer_kind opt, int bf16) {
  int world = td_comm_size(comm), rank = td_comm_rank(comm);
  enum { N_TR = 5 };
  /* 0: in memory; 1: optimizer (4 buffers); 2-4: optimizer + params with 4, 2, 1 buffers; 5: "cpu" */
  const int params[N_TR] = {0, 0, 1, 1, 1}, buffers[N_TR] = {4, 4, 4, 2, 1};
  td_dataset *ds = text_dataset();
  td_model *models[N_TR + 1];
  td_trainer *tr[N_TR + 1];
  for (int s = 0; s <= N_TR; s++) {
    models[s] = gpt(2, 35);
    td_train_config c;
    base_config(&c, world, opt, bf16);
    if (s > 0 && s < N_TR) set_offload(&c, dir, params[s], buffers[s]);
    if (s == N_TR) c.offload.optimizer_device = c.offload.param_device = TD_OFFLOAD_CPU; /* = in memory */
    CHECK_OK(td_trainer_create(&c, models[s], ds, comm, &tr[s]));
  }
  CHECK_EQ_INT(count_job_dirs(dir) >= 4, 1); /* (other ranks' directories may be there too) */
  size_t n = td_trainer_n_params(tr[0]);
  float *ref = malloc(n * sizeof(float));
  for (int step = 1; step <= 4; step++) {
    td_step_stats st[N_TR + 1];
    for (int s = 0; s <= N_TR; s++) CHECK_OK(td_trainer_step(tr[s], &st[s]));
    CHECK_OK(td_trainer_gather_params(tr[0]));
    memcpy(ref, td_trainer_params(tr[0]), n * sizeof(float));
    if (rank == 0) printf("step %d loss %.9f norm %.9f\n", step, st[0].loss, st[0].grad_norm);
    for (int s = 1; s <= N_TR; s++) {
      if (memcmp(&st[s].loss, &st[0].loss, sizeof(double)) != 0 ||
          memcmp(&st[s].grad_norm, &st[0].grad_norm, sizeof(double)) != 0)
        td_test_fail(__FILE__, __LINE__, "rank %d step %d trainer %d: loss %.17g norm %.17g, in memory %.17g %.17g",
                     rank, step, s, st[s].loss, st[s].grad_norm, st[0].loss, st[0].grad_norm);
      CHECK_OK(td_trainer_gather_params(tr[s]));
      const float *p = td_trainer_params(tr[s]);
      for (size_t i = 0; i < n; i++)
        if (memcmp(&p[i], &ref[i], sizeof(float)) != 0)
          td_test_fail(__FILE__, __LINE__, "rank %d step %d trainer %d: parameter %zu is %.9g, in memory %.9g", rank,
                       step, s, i, p[i], ref[i]);
    }
  }
  td_offload_stats os;
  CHECK_OK(td_trainer_offload_stats(tr[2], &os));
  printf("rank %d: engine %s, O_DIRECT %d, read %llu B, wrote %llu B, optimizer %.3f s (update %.3f s)\n", rank,
         os.engine, os.direct, (unsigned long long)os.bytes_read, (unsigned long long)os.bytes_written, os.opt_s,
         os.opt_compute_s);
  CHECK(os.bytes_read > 0 && os.bytes_written > 0);
  const char *want = getenv("TANDEM_AIO");
  if (want) CHECK(!strcmp(os.engine, !strcmp(want, "uring") ? "io_uring" : "threads"));
  CHECK_OK(td_trainer_offload_stats(tr[N_TR], &os));
  CHECK(os.bytes_read == 0 && os.engine[0] == '\0'); /* "cpu": nothing on disk */
  for (int s = 0; s <= N_TR; s++) {
    td_trainer_destroy(tr[s]);
    td_model_destroy(models[s]);
  }
  CHECK_OK(td_barrier(comm));
  CHECK_EQ_INT(count_job_dirs(dir), 0);
  free(ref);
  td_dataset_destroy(ds);
  if (rank == 0) printf("OK: offloaded stage 3 equals stage 3 in memory bit for bit on %d ranks\n", world);
}

static void run_init_range(void) {
  td_model *m = gpt(2, 35);
  size_t n = m->n_params;
  float *all = calloc(n, sizeof(float)), *part = calloc(n + 1, sizeof(float));
  td_model_init_params(m, all, 99);
  uint64_t s = 5;
  size_t ranges[][2] = {{0, 0}, {0, 1}, {0, n}, {n - 1, n}, {1, 4097}, {4095, 4097}, {17, 9000}};
  for (int i = 0; i < 40; i++) {
    size_t lo, hi;
    if (i < (int)TD_ARRAY_SIZE(ranges)) lo = ranges[i][0], hi = ranges[i][1];
    else {
      lo = (size_t)((td_test_urand(&s) + 1.0f) * 0.5f * (float)n);
      hi = lo + (size_t)((td_test_urand(&s) + 1.0f) * 0.5f * (float)(n - lo));
    }
    part[hi - lo] = 12345.0f;
    CHECK_OK(td_model_init_params_range(m, part, 99, lo, hi));
    if (memcmp(part, all + lo, (hi - lo) * sizeof(float)) != 0)
      td_test_fail(__FILE__, __LINE__, "range [%zu, %zu) differs from the whole init", lo, hi);
    CHECK(part[hi - lo] == 12345.0f);
  }
  CHECK_STATUS(td_model_init_params_range(m, part, 99, 5, 4), TD_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(td_model_init_params_range(m, part, 99, 0, n + 1), TD_ERR_INVALID_ARGUMENT);
  free(all), free(part);
  td_model_destroy(m);
  printf("OK init_range\n");
}

static void run_estimate(const char *dir) {
  td_dataset *ds = text_dataset();
  td_model *m = gpt(2, 35);
  td_train_config c;
  base_config(&c, 1, TD_OPTIMIZER_ADAMW, 0);
  set_offload(&c, dir, 1, 4);
  CHECK_OK(td_train_config_resolve(&c, 1));
  td_memory_estimate e;
  CHECK_OK(td_trainer_estimate_memory(m, &c, 1, 3, &e));
  td_trainer *t = NULL;
  CHECK_OK(td_trainer_create(&c, m, ds, NULL, &t));
  CHECK_OK(td_trainer_step(t, NULL));
  /* the files really there */
  size_t on_disk = 0;
  DIR *d = opendir(dir);
  struct dirent *ent;
  char sub[600] = "";
  while ((ent = readdir(d)) != NULL)
    if (!strncmp(ent->d_name, "tandem-offload-", 15)) snprintf(sub, sizeof sub, "%s/%s", dir, ent->d_name);
  closedir(d);
  CHECK(sub[0]);
  const char *names[] = {"params.f32", "exp_avg.f32", "exp_avg_sq.f32"};
  for (int i = 0; i < 3; i++) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s", sub, names[i]);
    struct stat sb;
    CHECK(stat(p, &sb) == 0);
    on_disk += (size_t)sb.st_size;
  }
  size_t n = m->n_params;
  printf("disk: estimate %zu, files %zu, 12 bytes x %zu parameters = %zu; RAM optimizer buffers %zu (4 x 3 x 1024 x 4 "
         "= %d)\n", e.disk, on_disk, n, 12 * n, e.optimizer, 4 * 3 * 1024 * 4);
  CHECK(on_disk >= 12 * n);
  CHECK_EQ_INT(e.disk, on_disk);
  CHECK_EQ_INT(e.params, 0);
  CHECK_EQ_INT(e.optimizer, 4 * 3 * 1024 * 4);
  CHECK_EQ_INT(e.offload_buffers, e.optimizer);
  CHECK(e.live > 0);
  td_trainer_destroy(t);
  td_model_destroy(m);
  td_dataset_destroy(ds);
  printf("OK estimate\n");
}

static td_status create_offloaded(const char *dir, int layers, int channels, td_trainer **t, td_model **m,
                                  td_dataset **ds) {
  *ds = text_dataset();
  *m = gpt(layers, channels);
  td_train_config c;
  base_config(&c, 1, TD_OPTIMIZER_ADAMW, 0);
  set_offload(&c, dir, 1, 4);
  return td_trainer_create(&c, *m, *ds, NULL, t);
}

static void run_refuse(const char *dir, const char *kind) {
  td_trainer *t = NULL;
  td_model *m = NULL;
  td_dataset *ds = NULL;
  if (!strcmp(kind, "space")) {
    /* 40 layers x 400 channels: ~77M parameters, ~0.9 GB of files, on a 1 MiB tmpfs */
    td_status st = create_offloaded(dir, 40, 400, &t, &m, &ds);
    printf("%s\n", td_last_error());
    CHECK_MSG(st, TD_ERR_INVALID_ARGUMENT, "free");
    CHECK(strstr(td_last_error(), dir) && strstr(td_last_error(), "needs") && strstr(td_last_error(), "bytes"));
  } else if (!strcmp(kind, "file")) {
    char f[600];
    snprintf(f, sizeof f, "%s/a-file", dir);
    int fd = open(f, O_WRONLY | O_CREAT, 0600);
    close(fd);
    td_status st = create_offloaded(f, 2, 35, &t, &m, &ds);
    printf("%s\n", td_last_error());
    CHECK_MSG(st, TD_ERR_INVALID_ARGUMENT, "is not a directory");
    unlink(f);
  } else if (!strcmp(kind, "readonly")) {
    td_status st = create_offloaded(dir, 2, 35, &t, &m, &ds);
    printf("%s\n", td_last_error());
    CHECK_MSG(st, TD_ERR_INVALID_ARGUMENT, "not writable");
    CHECK(strstr(td_last_error(), "Read-only file system") != NULL);
  } else {
    char f[600];
    snprintf(f, sizeof f, "%s/does-not-exist", dir);
    td_status st = create_offloaded(f, 2, 35, &t, &m, &ds);
    printf("%s\n", td_last_error());
    CHECK_MSG(st, TD_ERR_INVALID_ARGUMENT, "No such file");
  }
  CHECK(t == NULL);
  if (strcmp(kind, "readonly") != 0) CHECK_EQ_INT(count_job_dirs(dir), 0);
  td_model_destroy(m);
  td_dataset_destroy(ds);
  printf("OK refuse %s\n", kind);
}

static void run_leave(const char *dir) {
  td_trainer *t = NULL;
  td_model *m = NULL;
  td_dataset *ds = NULL;
  CHECK_OK(create_offloaded(dir, 2, 35, &t, &m, &ds));
  CHECK_OK(td_trainer_step(t, NULL));
  CHECK_EQ_INT(count_job_dirs(dir), 1);
  printf("offloading; now killed by SIGKILL\n");
  fflush(stdout);
  raise(SIGKILL);
}

static void run_clean(const char *dir) {
  CHECK_EQ_INT(count_job_dirs(dir), 1); /* the killed job's */
  td_trainer *t = NULL;
  td_model *m = NULL;
  td_dataset *ds = NULL;
  CHECK_OK(create_offloaded(dir, 2, 35, &t, &m, &ds));
  CHECK_EQ_INT(count_job_dirs(dir), 1); /* ours only: the dead one was removed */
  CHECK_OK(td_trainer_step(t, NULL));
  td_trainer_destroy(t);
  CHECK_EQ_INT(count_job_dirs(dir), 0);
  td_model_destroy(m);
  td_dataset_destroy(ds);
  printf("OK clean\n");
}

static void run_fail(const char *dir) {
  td_trainer *t = NULL;
  td_model *m = NULL;
  td_dataset *ds = NULL;
  CHECK_OK(create_offloaded(dir, 2, 35, &t, &m, &ds));
  CHECK_OK(td_trainer_step(t, NULL));
  fault_armed = 1;
  CHECK_MSG(td_trainer_step(t, NULL), TD_ERR_IO, "injected failure");
  CHECK_EQ_INT(count_job_dirs(dir), 1);
  td_trainer_destroy(t);
  CHECK_EQ_INT(count_job_dirs(dir), 0);
  td_model_destroy(m);
  td_dataset_destroy(ds);
  printf("OK fail\n");
}

/* ---- two starts on one path (test_offload peer) ---- */

static const char *peer_dir; /* armed: the next flock of a lock file under it starts the peer first */
static int peer_started;
static td_trainer *peer_t;
static td_model *peer_m;
static td_dataset *peer_ds;

/* Replaces libc's flock for this binary and libtandem in it. */
int flock(int fd, int operation) {
  const char *dir = peer_dir;
  if (dir) {
    char link[64], target[1024];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    target[n > 0 ? n : 0] = '\0';
    size_t nd = strlen(dir), nt = strlen(target);
    if (nt > nd + 5 && !strncmp(target, dir, nd) && target[nd] == '/' && !strcmp(target + nt - 5, "/lock")) {
      peer_dir = NULL; /* once; the peer's own flock calls go straight through */
      printf("first start locks %s: the peer starts now\n", target);
      peer_started = 1;
      td_status st = create_offloaded(dir, 2, 35, &peer_t, &peer_m, &peer_ds);
      if (st != TD_OK) td_test_fail(__FILE__, __LINE__, "the peer's start failed: %s", td_last_error());
    }
  }
  return (int)syscall(SYS_flock, fd, operation);
}

/* Entries of dir named .tandem-offload-new-* (starts not yet renamed) */
static int count_new_dirs(const char *dir) {
  DIR *d = opendir(dir);
  CHECK(d != NULL);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) n += strncmp(e->d_name, ".tandem-offload-new-", 20) == 0;
  closedir(d);
  return n;
}

static void run_peer(const char *dir) {
  /* leftovers of starts killed before their rename: one old, one young */
  char old_dir[600], young_dir[600];
  snprintf(old_dir, sizeof old_dir, "%s/.tandem-offload-new-killed-r0-p1-1", dir);
  snprintf(young_dir, sizeof young_dir, "%s/.tandem-offload-new-starting-r0-p2-1", dir);
  CHECK(mkdir(old_dir, 0700) == 0 && mkdir(young_dir, 0700) == 0);
  struct timeval two_min_ago[2];
  gettimeofday(&two_min_ago[0], NULL);
  two_min_ago[0].tv_sec -= 120;
  two_min_ago[1] = two_min_ago[0];
  CHECK(utimes(old_dir, two_min_ago) == 0);

  td_trainer *t = NULL;
  td_model *m = NULL;
  td_dataset *ds = NULL;
  peer_dir = dir;
  td_status st = create_offloaded(dir, 2, 35, &t, &m, &ds);
  peer_dir = NULL;
  CHECK_EQ_INT(peer_started, 1); /* the peer really started inside the first start */
  if (st != TD_OK) td_test_fail(__FILE__, __LINE__, "the first start failed beside its peer: %s", td_last_error());
  CHECK(peer_t != NULL);
  CHECK_EQ_INT(count_job_dirs(dir), 2);
  CHECK_EQ_INT(count_new_dirs(dir), 1); /* the young leftover stays, the old one is gone */
  struct stat sb;
  CHECK(stat(young_dir, &sb) == 0 && stat(old_dir, &sb) != 0);
  for (int step = 0; step < 2; step++) {
    CHECK_OK(td_trainer_step(t, NULL));
    CHECK_OK(td_trainer_step(peer_t, NULL));
  }
  /* the same model, data and seed: the same parameters */
  size_t n = td_trainer_n_params(t);
  CHECK_OK(td_trainer_gather_params(t));
  CHECK_OK(td_trainer_gather_params(peer_t));
  CHECK(memcmp(td_trainer_params(t), td_trainer_params(peer_t), n * sizeof(float)) == 0);
  td_trainer_destroy(peer_t);
  CHECK_EQ_INT(count_job_dirs(dir), 1);
  td_trainer_destroy(t);
  CHECK_EQ_INT(count_job_dirs(dir), 0);
  CHECK(rmdir(young_dir) == 0);
  td_model_destroy(m), td_model_destroy(peer_m);
  td_dataset_destroy(ds), td_dataset_destroy(peer_ds);
  printf("OK peer: two starts side by side on one path\n");
}

/* The config keys: DeepSpeed's names into td_offload_config; mistakes refused naming the key. */
static void run_config(void) {
  td_train_config c;
  td_train_config_defaults(&c);
  CHECK_EQ_INT(c.offload.optimizer_device, TD_OFFLOAD_NONE);
  CHECK_EQ_INT(c.offload.sub_group_size, 0); /* unset: chosen from the memory at creation */
  CHECK_EQ_INT(c.offload.aio_block_size, 1048576);
  {
    /* the automatic tile: buffers (4 x 3 arrays of AdamW with the parameters on disk) at most 1/32 of the rank's
     * memory, within [256Ki, 16Mi] parameters, rounded up to 1024; a value the user set is kept */
    td_train_config f = c;
    f.offload.optimizer_device = f.offload.param_device = TD_OFFLOAD_NVME;
    size_t gib10 = (size_t)10 << 30, per = 4 * 3 * 4;
    size_t want = (gib10 / 32 / per + 1023) / 1024 * 1024; /* 6990506 -> 6990848 */
    td_offload_config_fit(&f, gib10);
    CHECK_EQ_INT(f.offload.sub_group_size, want);
    f.offload.sub_group_size = 0;
    td_offload_config_fit(&f, 0); /* memory unknown */
    CHECK_EQ_INT(f.offload.sub_group_size, 16 << 20);
    f.offload.sub_group_size = 0;
    td_offload_config_fit(&f, (size_t)64 << 20); /* 64 MiB: the floor */
    CHECK_EQ_INT(f.offload.sub_group_size, 256 << 10);
    f.offload.sub_group_size = 1000000000; /* set by the user: kept (the start-up check refuses it if it cannot fit) */
    td_offload_config_fit(&f, gib10);
    CHECK_EQ_INT(f.offload.sub_group_size, 1000000000);
    /* buffers: no more than the shard has tiles; resident as the tiles touch them */
    f.offload.sub_group_size = 1 << 20;
    CHECK_EQ_INT(td_offload_buffer_count(&f, 3u << 20), 4);      /* 3Mi + up to 1023 below: 4 tiles */
    CHECK_EQ_INT(td_offload_buffer_count(&f, (1u << 20) - 1024), 1);
    CHECK_EQ_INT(td_offload_buffer_bytes(&f, 100u << 20), (size_t)4 * 3 * (1u << 20) * 4);
    /* lowering a chosen tile (memory_fit.c, when the job would not fit): halves, rounded up to 1024, down to 256Ki */
    f.offload.sub_group_size = 6990848;
    CHECK(td_offload_tile_lower(&f));
    CHECK_EQ_INT(f.offload.sub_group_size, 3495936); /* 6990848 / 2 = 3495424, rounded up to 3414 x 1024 */
    f.offload.sub_group_size = (300 << 10) + 1024;
    CHECK(td_offload_tile_lower(&f));
    CHECK_EQ_INT(f.offload.sub_group_size, 256 << 10); /* 154112 is below the floor */
    CHECK(!td_offload_tile_lower(&f));
    CHECK_EQ_INT(f.offload.sub_group_size, 256 << 10);
    f.offload.optimizer_device = TD_OFFLOAD_NONE; /* nothing offloaded: nothing to lower */
    f.offload.sub_group_size = 1 << 20;
    CHECK(!td_offload_tile_lower(&f));
  }
  /* the knobs a config sets are marked so (kept at start; unset ones may be lowered to fit the memory) */
  CHECK_EQ_INT(c.knobs_set, 0);
  {
    td_train_config k;
    td_train_config_defaults(&k);
    CHECK_OK(td_train_config_parse_json("{\"zero_optimization\": {\"stage3_max_live_parameters\": 0}}", "test", &k));
    CHECK_EQ_INT(k.knobs_set, TD_KNOB_STAGE3_MAX_LIVE);
    CHECK_OK(td_train_config_parse_json("{\"bucket_bytes\": 4096, \"zero_optimization\": {"
                                        "\"stage3_prefetch_bucket_size\": 5}}", "test", &k));
    CHECK_EQ_INT(k.knobs_set, TD_KNOB_STAGE3_MAX_LIVE | TD_KNOB_BUCKET_BYTES | TD_KNOB_STAGE3_PREFETCH);
    td_train_config_defaults(&k);
    CHECK_OK(td_train_config_parse_json("{\"zero_optimization\": {\"offload_param\": {\"max_in_cpu\": 9}}}", "test",
                                        &k));
    CHECK_EQ_INT(k.knobs_set, TD_KNOB_PARAM_BUFFERS);
    td_train_config_defaults(&k);
    CHECK_OK(td_train_config_parse_json("{\"zero_optimization\": {\"offload_optimizer\": {\"buffer_count\": 2}}}",
                                        "test", &k));
    CHECK_EQ_INT(k.knobs_set, 0); /* the optimizer's buffer_count is not a cache knob */
  }
  const char *ok = "{\"zero_optimization\": {\"stage\": 3, \"sub_group_size\": 5000,"
                   " \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"/x\", \"buffer_count\": 3,"
                   " \"pin_memory\": true},"
                   " \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"/x\", \"buffer_count\": 2,"
                   " \"buffer_size\": 7000, \"max_in_cpu\": 10000}},"
                   " \"aio\": {\"block_size\": 65536, \"queue_depth\": 4, \"thread_count\": 3,"
                   " \"single_submit\": false, \"overlap_events\": true}, \"train_batch_size\": 4}";
  CHECK_OK(td_train_config_parse_json(ok, "test", &c));
  CHECK_EQ_INT(c.offload.optimizer_device, TD_OFFLOAD_NVME);
  CHECK_EQ_INT(c.offload.param_device, TD_OFFLOAD_NVME);
  CHECK(!strcmp(c.offload.optimizer_nvme_path, "/x") && !strcmp(c.offload.param_nvme_path, "/x"));
  CHECK_EQ_INT(c.offload.optimizer_buffer_count, 3);
  CHECK_EQ_INT(c.offload.param_buffer_count, 2);
  CHECK_EQ_INT(c.offload.param_buffer_size, 7000);
  CHECK_EQ_INT(c.offload.param_max_in_cpu, 10000);
  CHECK_EQ_INT(c.offload.sub_group_size, 5000);
  CHECK_EQ_INT(c.offload.aio_block_size, 65536);
  CHECK_EQ_INT(c.offload.aio_queue_depth, 4);
  CHECK_EQ_INT(c.offload.aio_thread_count, 3);
  CHECK_OK(td_train_config_resolve(&c, 2));
  /* the parameter buffers bound the stage-3 caps: min(1e9, 2 x 7000, 10000) and min(5e7, 7000) */
  CHECK_EQ_INT(c.stage3_max_live_parameters, 10000);
  CHECK_EQ_INT(c.stage3_prefetch_bucket_size, 7000);
  struct { const char *json, *fragment; } bad[] = {
      {"{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"disk\"}}}", "\"nvme\", \"cpu\" or \"none\""},
      {"{\"zero_optimization\": {\"offload_optimizer\": {\"devise\": \"nvme\"}}}", "unknown key \"devise\""},
      {"{\"zero_optimization\": {\"offload_param\": {\"buffer_count\": 0}}}", "buffer_count"},
      {"{\"aio\": {\"block_size\": 1000}}", "aio.block_size"},
      {"{\"aio\": {\"queue_dept\": 8}}", "unknown key \"queue_dept\""},
      {"{\"zero_optimization\": {\"sub_group_size\": -1}}", "sub_group_size"},
  };
  for (size_t i = 0; i < TD_ARRAY_SIZE(bad); i++) {
    td_train_config d;
    td_train_config_defaults(&d);
    CHECK_MSG(td_train_config_parse_json(bad[i].json, "test", &d), TD_ERR_INVALID_ARGUMENT, bad[i].fragment);
  }
  /* resolve: nvme needs stage 3 and a path; params alone, or two paths, are refused */
  struct { int stage, opt, param; const char *p1, *p2, *fragment; } res[] = {
      {2, 1, 0, "/x", "", "needs ZeRO stage 3"},
      {3, 1, 0, "", "", "needs \"nvme_path\""},
      {3, 0, 1, "", "/x", "without offload_optimizer"},
      {3, 1, 1, "/x", "/y", "differ"},
  };
  for (size_t i = 0; i < TD_ARRAY_SIZE(res); i++) {
    td_train_config d;
    td_train_config_defaults(&d);
    d.train_batch_size = 4;
    d.zero_stage = res[i].stage;
    d.offload.optimizer_device = res[i].opt ? TD_OFFLOAD_NVME : TD_OFFLOAD_NONE;
    d.offload.param_device = res[i].param ? TD_OFFLOAD_NVME : TD_OFFLOAD_NONE;
    td_strlcpy(d.offload.optimizer_nvme_path, res[i].p1, sizeof d.offload.optimizer_nvme_path);
    td_strlcpy(d.offload.param_nvme_path, res[i].p2, sizeof d.offload.param_nvme_path);
    CHECK_MSG(td_train_config_resolve(&d, 2), TD_ERR_INVALID_ARGUMENT, res[i].fragment);
  }
  /* "cpu" is accepted at any stage: the state stays in host memory */
  td_train_config d;
  td_train_config_defaults(&d);
  d.train_batch_size = 4;
  d.offload.optimizer_device = d.offload.param_device = TD_OFFLOAD_CPU;
  CHECK_OK(td_train_config_resolve(&d, 2));
  printf("OK config\n");
}

/* Under tandemrun -np 2: rank 1's parameter file is cut short after a good
 * step; its next step fails naming the file and the offset, and no rank
 * hangs (the suite's timeout would say so): rank 1 still takes part in the
 * broadcasts its peer waits for. */
static void run_readfail(td_comm *comm, const char *dir) {
  int rank = td_comm_rank(comm);
  td_dataset *ds = text_dataset();
  td_model *m = gpt(2, 35);
  td_train_config c;
  base_config(&c, td_comm_size(comm), TD_OPTIMIZER_ADAMW, 0);
  set_offload(&c, dir, 1, 4);
  td_trainer *t = NULL;
  CHECK_OK(td_trainer_create(&c, m, ds, comm, &t));
  CHECK_OK(td_trainer_step(t, NULL));
  if (rank == 1) {
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[700] = "";
    while ((e = readdir(d)) != NULL)
      if (strstr(e->d_name, "-r1-")) snprintf(p, sizeof p, "%s/%s/params.f32", dir, e->d_name);
    closedir(d);
    CHECK(p[0] && truncate(p, 0) == 0);
  }
  CHECK_OK(td_barrier(comm));
  td_status st = td_trainer_step(t, NULL);
  printf("rank %d: second step: %s: %s\n", rank, td_status_str(st), st == TD_OK ? "" : td_last_error());
  CHECK(st != TD_OK); /* on every rank: the step's failure is agreed */
  CHECK(strstr(td_last_error(), "rank 1") && strstr(td_last_error(), "params.f32") && strstr(td_last_error(), "offset"));
  td_trainer_destroy(t);
  td_model_destroy(m);
  td_dataset_destroy(ds);
  CHECK_EQ_INT(count_job_dirs(dir) <= 1, 1);
  printf("OK readfail\n");
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *mode = argc >= 2 ? argv[1] : "";
  const char *dir = argc >= 3 ? argv[2] : "";
  if (!strcmp(mode, "aio") && argc >= 3) run_aio(dir);
  else if (!strcmp(mode, "enospc") && argc >= 3) run_enospc(dir);
  else if (!strcmp(mode, "init_range")) run_init_range();
  else if (!strcmp(mode, "config")) run_config();
  else if (!strcmp(mode, "estimate") && argc >= 3) run_estimate(dir);
  else if (!strcmp(mode, "refuse") && argc >= 4) run_refuse(dir, argv[3]);
  else if (!strcmp(mode, "leave") && argc >= 3) run_leave(dir);
  else if (!strcmp(mode, "clean") && argc >= 3) run_clean(dir);
  else if (!strcmp(mode, "fail") && argc >= 3) run_fail(dir);
  else if (!strcmp(mode, "peer") && argc >= 3) run_peer(dir);
  else if (!strcmp(mode, "equal") && argc >= 5) {
    td_comm *comm = NULL;
    CHECK_OK(td_comm_init(&comm));
    run_equal(comm, dir, strcmp(argv[3], "sgd") == 0 ? TD_OPTIMIZER_SGD : TD_OPTIMIZER_ADAMW, atoi(argv[4]));
    CHECK_OK(td_comm_finalize(comm));
    td_comm_destroy(comm);
  } else if (!strcmp(mode, "readfail") && argc >= 3) {
    td_comm *comm = NULL;
    CHECK_OK(td_comm_init(&comm));
    run_readfail(comm, dir);
    td_comm_destroy(comm); /* the ranks' collectives may no longer match: no finalize */
  } else {
    fprintf(stderr, "usage: %s aio|enospc|estimate|leave|clean|fail DIR | refuse DIR space|file|readonly|missing | "
            "equal DIR adamw|sgd BF16 | init_range | peer DIR\n", argv[0]);
    return 2;
  }
  return 0;
}
