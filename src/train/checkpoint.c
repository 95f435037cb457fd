/* Checkpoints: sharded save and exact resume.
 *
 * Layout of ROOT:
 *   step-N/ (or step-N.G, G = 1, 2, ... for a re-save of step N)
 *     rank-R.bin   rank R's shard: for each arena (parameters, then each
 *                  optimizer state) the floats td_shard_range(n_params, W, R),
 *                  back to back, native little-endian f32.
 *     manifest     text, one "key value" per line: format version, world
 *                  size, step, sampler position, seed, model kind, shape
 *                  (model_config) and size, the tensor table, optimizer,
 *                  config essentials, each shard's bytes and CRC-32, and last
 *                  a CRC of the lines above it (a truncated manifest is
 *                  detected too).
 *     visible      the save's random token (see "shared directory" below).
 *   latest         "step-N" or "step-N.G": the checkpoint to resume from.
 *
 * Crash safety: at every instant the directory `latest` names is complete.
 * A save writes into a fresh step-N.tmp-TOKEN, fsyncs every file and the
 * directory, renames it to a name nothing else uses (step-N, or step-N.G
 * when step-N exists: a re-save after a resume), fsyncs ROOT, writes
 * latest.tmp, fsyncs it and renames it over `latest` (atomic), fsyncs ROOT,
 * and only then removes the copies `latest` no longer names (the older
 * step-N[.G]) and what keep_last prunes. Killed at any point, ROOT holds
 * either the old `latest` and its complete directory, or the new ones;
 * leftovers (*.tmp-*, latest.tmp, an older copy of the step) are ignored by
 * resume and removed by the next save. TANDEM_CKPT_FAULT_AT=N (a test hook)
 * kills the process with SIGKILL just before the Nth file operation of a
 * save on rank TANDEM_CKPT_FAULT_RANK (default 0): tests/train sweep N.
 *
 * Shared directory: ROOT must be one directory every rank sees (a shared
 * file system when ranks are on several hosts). Rank 0 creates the
 * temporary directory and writes a random token into it; every rank reads
 * it back through its own path before writing its shard, and a rank that
 * cannot fails the save on every rank with a message saying so.
 *
 * Resume reads the manifest and every shard on every rank (so a different
 * world size just reassembles the shards), checks sizes and checksums and
 * that the model and optimizer match before touching the trainer, and
 * agrees across ranks so that all succeed or all fail. The manifest parser
 * (td_ckpt_manifest_parse) works on a byte buffer, for fuzzing. */
#include "train/train_impl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CKPT_FORMAT 1
#define CKPT_MAGIC "tandem-checkpoint"
#define CKPT_TOKEN_FILE "visible"
#define CKPT_MAX_MANIFEST ((size_t)64 << 20)

/* snprintf for paths: a too-long path is reported rather than silently cut
 * (buffers are sized for a 1000-character root, which save/resume check). */
static int path_fmt(char *out, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int path_fmt(char *out, size_t size, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(out, size, fmt, ap);
  va_end(ap);
  return n >= 0 && (size_t)n < size ? 0 : -1;
}

/* ---- the crash-injection hook (tests only) ---- */

/* File operations of one save on this rank, for TANDEM_CKPT_FAULT_AT. */
typedef struct save_io {
  long ops;
  long fault_at; /* 0: off */
} save_io;

/* Called before each file operation of a save: the test hook simulates the
 * process dying right there (SIGKILL: no cleanup, no atexit). */
static void fault_point(save_io *io) {
  if (io && io->fault_at > 0 && ++io->ops == io->fault_at) kill(getpid(), SIGKILL);
}

/* ---- small file helpers ---- */

static td_status fsync_path(save_io *io, const char *path, int directory) {
  fault_point(io);
  int fd = open(path, (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) return td_error_errno("cannot open %s to sync it", path);
  int rc = fsync(fd);
  int saved = errno;
  close(fd);
  errno = saved;
  /* Some file systems refuse fsync on directories (EINVAL); the data files
   * themselves were synced, which is what matters most. */
  if (rc != 0 && !(directory && (errno == EINVAL || errno == EBADF)))
    return td_error_errno("cannot fsync %s", path);
  return TD_OK;
}

/* Create path with the data, fsync'd: two file operations (write, sync). */
static td_status write_file(save_io *io, const char *path, const void *data, size_t n) {
  fault_point(io);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return td_error_errno("cannot create %s", path);
  const char *p = data;
  while (n > 0) {
    ssize_t w = write(fd, p, n > (1u << 30) ? (1u << 30) : n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      td_status st = td_error_errno("cannot write %s (disk full?)", path);
      close(fd);
      return st;
    }
    p += w;
    n -= (size_t)w;
  }
  fault_point(io);
  if (fsync(fd) != 0) {
    td_status st = td_error_errno("cannot fsync %s", path);
    close(fd);
    return st;
  }
  if (close(fd) != 0) return td_error_errno("cannot close %s", path);
  return TD_OK;
}

/* Read a whole file of at most max_bytes; *data is malloc'd and
 * NUL-terminated (for text). */
static td_status read_file(const char *path, size_t max_bytes, char **data, size_t *n) {
  *data = NULL;
  *n = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return td_error(TD_ERR_IO, "cannot open %s: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    close(fd);
    return td_error(TD_ERR_IO, "cannot stat %s: %s", path, strerror(errno));
  }
  if (sb.st_size < 0 || (uint64_t)sb.st_size > (uint64_t)max_bytes) {
    close(fd);
    return td_error(TD_ERR_IO, "%s is %lld bytes, more than the %zu expected: the checkpoint is corrupt", path,
                    (long long)sb.st_size, max_bytes);
  }
  size_t size = (size_t)sb.st_size;
  char *buf = malloc(size + 1);
  if (!buf) {
    close(fd);
    return td_error(TD_ERR_SYSTEM, "out of memory reading %s (%zu bytes)", path, size);
  }
  size_t got = 0;
  while (got < size) {
    ssize_t r = read(fd, buf + got, size - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      td_status st = td_error(TD_ERR_IO, "cannot read %s: %s", path, strerror(errno));
      free(buf);
      close(fd);
      return st;
    }
    if (r == 0) break;
    got += (size_t)r;
  }
  close(fd);
  buf[got] = '\0';
  *data = buf;
  *n = got;
  return TD_OK;
}

static int path_exists(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0;
}

static td_status mkdir_p(save_io *io, const char *path) {
  char buf[1024];
  if (td_strlcpy(buf, path, sizeof buf) >= sizeof buf - 1)
    return td_error(TD_ERR_INVALID_ARGUMENT, "checkpoint path too long: %s", path);
  fault_point(io);
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) return td_error_errno("cannot create directory %s", buf);
    *p = '/';
  }
  if (mkdir(buf, 0755) != 0 && errno != EEXIST) return td_error_errno("cannot create directory %s", buf);
  return TD_OK;
}

/* Remove a checkpoint directory (flat: files only), one file operation per
 * file and one for the directory. */
static td_status remove_flat_dir(save_io *io, const char *path) {
  DIR *d = opendir(path);
  if (!d) return errno == ENOENT ? TD_OK : td_error_errno("cannot open directory %s to remove it", path);
  struct dirent *e;
  char file[1280];
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    if (path_fmt(file, sizeof file, "%s/%s", path, e->d_name) != 0) continue;
    fault_point(io);
    if (unlink(file) != 0 && errno != ENOENT) {
      td_status st = td_error_errno("cannot remove %s", file);
      closedir(d);
      return st;
    }
  }
  closedir(d);
  fault_point(io);
  if (rmdir(path) != 0 && errno != ENOENT) return td_error_errno("cannot remove directory %s", path);
  return TD_OK;
}

/* ---- names in ROOT ---- */

/* "step-N" or "step-N.G" (N, G decimal, G >= 1): 1 with *step and *gen set;
 * anything else (step-N.tmp-X, latest, user files): 0. */
static int parse_step_name(const char *name, long *step, long *gen) {
  if (strncmp(name, "step-", 5) != 0) return 0;
  const char *p = name + 5;
  if (*p < '0' || *p > '9') return 0;
  errno = 0;
  char *end;
  long n = strtol(p, &end, 10);
  if (errno || n < 0) return 0;
  long g = 0;
  if (*end == '.') {
    const char *q = end + 1;
    if (*q < '1' || *q > '9') return 0;
    g = strtol(q, &end, 10);
    if (errno || g < 1) return 0;
  }
  if (*end) return 0;
  *step = n;
  *gen = g;
  return 1;
}

/* What ROOT/latest names ("" if none or unreadable). */
static void read_latest(const char *root, char *name, size_t size) {
  char path[1280], *text = NULL;
  size_t n = 0;
  name[0] = '\0';
  if (path_fmt(path, sizeof path, "%s/latest", root) != 0 || !path_exists(path)) return;
  if (read_file(path, 4096, &text, &n) != TD_OK) return;
  while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == ' ')) text[--n] = '\0';
  td_strlcpy(name, text, size);
  free(text);
}

typedef struct step_entry {
  long step, gen;
  char name[64];
} step_entry;

static int cmp_newest_first(const void *a, const void *b) {
  const step_entry *x = a, *y = b;
  if (x->step != y->step) return x->step > y->step ? -1 : 1;
  return x->gen > y->gen ? -1 : x->gen < y->gen;
}

/* After `latest` names `keep_name`: remove the other copies of the same
 * step, leftovers of crashed saves, and, with keep_last > 0, all but the
 * keep_last newest checkpoints (the one `latest` names always stays). */
static td_status clean_root(save_io *io, const char *root, const char *keep_name, long step, int keep_last) {
  DIR *d = opendir(root);
  if (!d) return td_error_errno("cannot list the checkpoint directory %s", root);
  step_entry *entries = NULL;
  size_t n = 0, cap = 0;
  td_status st = TD_OK;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    step_entry x;
    if (!parse_step_name(e->d_name, &x.step, &x.gen) || strcmp(e->d_name, keep_name) == 0) continue;
    if (strlen(e->d_name) >= sizeof x.name) continue;
    td_strlcpy(x.name, e->d_name, sizeof x.name);
    if (n == cap) {
      size_t ncap = cap ? 2 * cap : 32;
      step_entry *grown = realloc(entries, ncap * sizeof *grown);
      if (!grown) {
        st = td_error(TD_ERR_SYSTEM, "out of memory listing %s", root);
        break;
      }
      entries = grown;
      cap = ncap;
    }
    entries[n++] = x;
  }
  closedir(d);
  if (st == TD_OK && n > 1) qsort(entries, n, sizeof *entries, cmp_newest_first);
  /* keep_name counts as one of the keep_last. */
  long others_kept = 0;
  for (size_t i = 0; st == TD_OK && i < n; i++) {
    int drop = entries[i].step == step || (keep_last > 0 && others_kept >= keep_last - 1);
    if (!drop) {
      others_kept++;
      continue;
    }
    char path[1280];
    if (path_fmt(path, sizeof path, "%s/%s", root, entries[i].name) == 0) st = remove_flat_dir(io, path);
  }
  free(entries);
  return st;
}

/* Remove leftovers of crashed saves: step-*.tmp-* directories and
 * latest.tmp. Nothing `latest` can name. */
static td_status remove_leftovers(save_io *io, const char *root) {
  DIR *d = opendir(root);
  if (!d) return td_error_errno("cannot list the checkpoint directory %s", root);
  td_status st = TD_OK;
  struct dirent *e;
  char path[1280];
  /* Collect first: removing while readdir runs may skip entries. */
  char (*names)[256] = NULL;
  size_t n = 0, cap = 0;
  while ((e = readdir(d)) != NULL) {
    size_t len = strlen(e->d_name);
    /* step-N.tmp-TOKEN; step-N.tmp and step-N.old from older versions */
    int stale = strncmp(e->d_name, "step-", 5) == 0 &&
                (strstr(e->d_name, ".tmp-") || (len > 4 && (strcmp(e->d_name + len - 4, ".tmp") == 0 ||
                                                            strcmp(e->d_name + len - 4, ".old") == 0)));
    if (!stale && strcmp(e->d_name, "latest.tmp") != 0) continue;
    if (n == cap) {
      size_t ncap = cap ? 2 * cap : 8;
      char (*grown)[256] = realloc(names, ncap * sizeof *grown);
      if (!grown) {
        st = td_error(TD_ERR_SYSTEM, "out of memory listing %s", root);
        break;
      }
      names = grown;
      cap = ncap;
    }
    td_strlcpy(names[n++], e->d_name, 256);
  }
  closedir(d);
  for (size_t i = 0; st == TD_OK && i < n; i++) {
    if (path_fmt(path, sizeof path, "%s/%s", root, names[i]) != 0) continue;
    if (strcmp(names[i], "latest.tmp") == 0) {
      fault_point(io);
      if (unlink(path) != 0 && errno != ENOENT) st = td_error_errno("cannot remove %s", path);
    } else {
      st = remove_flat_dir(io, path);
    }
  }
  free(names);
  return st;
}

/* ---- save ---- */

static size_t shard_floats(size_t n_params, int world, int rank, size_t *offset) {
  size_t len;
  td_shard_range(n_params, world, rank, offset, &len);
  return len;
}

static td_status write_shard(td_trainer *t, save_io *io, const char *dir, uint64_t *bytes_out, uint32_t *crc_out) {
  size_t off, len = shard_floats(t->n_params, t->world, t->rank, &off);
  int n_arenas = 1 + t->n_states;
  size_t bytes = (size_t)n_arenas * len * sizeof(float);
  float *buf = td_alloc(bytes ? bytes : sizeof(float));
  if (!buf) return td_error(TD_ERR_SYSTEM, "rank %d: out of memory for a %zu-byte checkpoint shard", t->rank, bytes);
  memcpy(buf, t->params + off, len * sizeof(float));
  for (int s = 0; s < t->n_states; s++) memcpy(buf + (size_t)(s + 1) * len, t->states[s] + off, len * sizeof(float));
  char path[1280];
  path_fmt(path, sizeof path, "%s/rank-%d.bin", dir, t->rank);
  td_status st = write_file(io, path, buf, bytes);
  *bytes_out = bytes;
  *crc_out = td_crc32(0, buf, bytes);
  td_free(buf);
  if (st != TD_OK) {
    char why[768];
    td_error_copy(why, sizeof why);
    st = td_error(st, "rank %d: writing its checkpoint shard failed: %s", t->rank, why);
  }
  return st;
}

static char *manifest_text(const td_trainer *t, const uint64_t *shard_bytes, const uint32_t *shard_crc) {
  size_t cap = 4096 + (size_t)t->model->n_tensors * 160 + (size_t)t->world * 64;
  for (int i = 0; i < t->model->n_tensors; i++)
    if (t->model->tensors[i].name) cap += strlen(t->model->tensors[i].name);
  char *buf = malloc(cap);
  if (!buf) return NULL;
  size_t n = 0;
#define EMIT(...) n += (size_t)snprintf(n < cap ? buf + n : NULL, n < cap ? cap - n : 0, __VA_ARGS__)
  const td_train_config *c = &t->cfg;
  EMIT("%s %d\n", CKPT_MAGIC, CKPT_FORMAT);
  EMIT("world_size %d\n", t->world);
  EMIT("step %ld\n", t->step);
  EMIT("samples_consumed %llu\n", (unsigned long long)t->consumed);
  EMIT("seed %llu\n", (unsigned long long)c->seed);
  EMIT("dataset_samples %zu\n", t->dataset->n_samples);
  EMIT("model_kind %s\n", t->model->kind ? t->model->kind : "?");
  if (t->model->config) EMIT("model_config %s\n", t->model->config);
  EMIT("n_params %zu\n", t->n_params);
  EMIT("optimizer %s\n", td_optimizer_name(c->optimizer.kind));
  EMIT("n_state_arenas %d\n", t->n_states);
  EMIT("train_batch_size %ld\n", c->train_batch_size);
  EMIT("micro_batch %d\n", c->micro_batch);
  EMIT("grad_accum %d\n", c->grad_accum);
  EMIT("lr %.9g\n", (double)c->optimizer.lr);
  EMIT("n_tensors %d\n", t->model->n_tensors);
  for (int i = 0; i < t->model->n_tensors; i++) {
    const td_param_tensor *p = &t->model->tensors[i];
    EMIT("tensor %zu %zu %s\n", p->offset, p->count, p->name ? p->name : "?");
  }
  for (int r = 0; r < t->world; r++)
    EMIT("shard %d %llu %08x rank-%d.bin\n", r, (unsigned long long)shard_bytes[r], (unsigned)shard_crc[r], r);
  uint32_t crc = td_crc32(0, buf, n < cap ? n : cap);
  EMIT("manifest_crc %08x\n", (unsigned)crc);
#undef EMIT
  if (n >= cap) {
    free(buf);
    return NULL;
  }
  return buf;
}

/* Rank 0's part after every shard is durable: the manifest, the directory
 * under a name nothing uses, `latest`, then the clean-up. */
static td_status publish(td_trainer *t, save_io *io, const char *root, const char *tmp_dir, const uint64_t *bytes,
                         const uint32_t *crcs) {
  char path[1280], path2[1280], final_name[64], final_dir[1280];
  char *text = manifest_text(t, bytes, crcs);
  if (!text) return td_error(TD_ERR_SYSTEM, "out of memory writing the checkpoint manifest");
  path_fmt(path, sizeof path, "%s/manifest", tmp_dir);
  td_status st = write_file(io, path, text, strlen(text));
  free(text);
  TD_CHECK(st);
  TD_CHECK(fsync_path(io, tmp_dir, 1));
  /* step-N, or step-N.G if step-N exists (saving a step again after a
   * resume): the old copy stays whole until `latest` has moved on. */
  snprintf(final_name, sizeof final_name, "step-%ld", t->step);
  path_fmt(final_dir, sizeof final_dir, "%s/%s", root, final_name);
  for (long gen = 1; path_exists(final_dir); gen++) {
    if (gen > 1000000) return td_error(TD_ERR_IO, "%s: too many copies of step %ld", root, t->step);
    snprintf(final_name, sizeof final_name, "step-%ld.%ld", t->step, gen);
    path_fmt(final_dir, sizeof final_dir, "%s/%s", root, final_name);
  }
  fault_point(io);
  if (rename(tmp_dir, final_dir) != 0) return td_error_errno("cannot rename %s to %s", tmp_dir, final_dir);
  TD_CHECK(fsync_path(io, root, 1));
  path_fmt(path, sizeof path, "%s/latest.tmp", root);
  snprintf(path2, sizeof path2, "%s\n", final_name);
  TD_CHECK(write_file(io, path, path2, strlen(path2)));
  char latest[1280];
  path_fmt(latest, sizeof latest, "%s/latest", root);
  fault_point(io);
  if (rename(path, latest) != 0) return td_error_errno("cannot rename %s to %s", path, latest);
  TD_CHECK(fsync_path(io, root, 1));
  /* The new checkpoint is published: what follows only frees space. */
  TD_CHECK(clean_root(io, root, final_name, t->step, t->cfg.keep_last));
  return fsync_path(io, root, 1);
}

td_status td_trainer_save(td_trainer *t, const char *root) {
  if (!t || !root || !*root) return td_error(TD_ERR_INVALID_ARGUMENT, "td_trainer_save: null trainer or empty directory");
  if (strlen(root) > 1000) return td_error(TD_ERR_INVALID_ARGUMENT, "checkpoint directory name too long: %s", root);
  /* ZeRO stage >= 1 keeps only shards of the optimizer state (zero/zero.h):
   * refused until checkpoints save by those ranges, rather than written wrong. */
  if (t->zero_stage >= 1)
    return td_error(TD_ERR_INVALID_USAGE, "rank %d: checkpoints are not supported at ZeRO stage %d yet; use stage 0",
                    t->rank, t->zero_stage);
  save_io io = {0, t->rank == t->ckpt_fault_rank ? t->ckpt_fault_at : 0};
  char tmp_dir[1280], path[1300];
  /* The token names the temporary directory (no two saves share one) and
   * proves that every rank sees the directory rank 0 created. */
  char token[40];
  memset(token, 0, sizeof token);
  snprintf(token, sizeof token, "%016llx%016llx", (unsigned long long)td_random_u64(),
           (unsigned long long)td_random_u64());

  /* Phase 1: rank 0 clears leftovers of crashed saves and makes the
   * temporary directory with the token in it. */
  td_status st = TD_OK;
  if (t->rank == 0) {
    st = mkdir_p(&io, root);
    if (st == TD_OK) st = remove_leftovers(&io, root);
    path_fmt(tmp_dir, sizeof tmp_dir, "%s/step-%ld.tmp-%s", root, t->step, token);
    if (st == TD_OK) {
      fault_point(&io);
      if (mkdir(tmp_dir, 0755) != 0) st = td_error_errno("cannot create directory %s", tmp_dir);
    }
    path_fmt(path, sizeof path, "%s/" CKPT_TOKEN_FILE, tmp_dir);
    if (st == TD_OK) st = write_file(&io, path, token, strlen(token));
  }
  TD_CHECK(td_trainer_agree(t, st));
  if (t->comm && t->world > 1) {
    st = td_broadcast(token, sizeof token, TD_U8, 0, t->comm);
    if (st != TD_OK)
      return td_error(st, "rank %d: receiving the checkpoint token failed: %s", t->rank, td_comm_last_error(t->comm));
    token[sizeof token - 1] = '\0';
    path_fmt(tmp_dir, sizeof tmp_dir, "%s/step-%ld.tmp-%s", root, t->step, token);
    path_fmt(path, sizeof path, "%s/" CKPT_TOKEN_FILE, tmp_dir);
  }

  /* Phase 2: every rank checks it sees rank 0's directory, then writes and
   * syncs its shard; the sizes and checksums travel to rank 0 in one
   * allreduce (each rank fills its own slots). */
  char *seen = NULL;
  size_t seen_n = 0;
  st = TD_OK;
  if (t->rank != 0) {
    if (read_file(path, 4096, &seen, &seen_n) != TD_OK || seen_n != strlen(token) || memcmp(seen, token, seen_n) != 0)
      st = td_error(TD_ERR_IO,
                    "rank %d cannot see the checkpoint directory that rank 0 created: %s is missing or different "
                    "here. The checkpoint directory (%s) must be one directory that every rank sees, on a file "
                    "system shared by all hosts (NFS, Lustre, CephFS, ...); per-host local directories are not "
                    "supported",
                    t->rank, path, root);
    free(seen);
  }
  uint64_t my_bytes = 0;
  uint32_t my_crc = 0;
  if (st == TD_OK) st = write_shard(t, &io, tmp_dir, &my_bytes, &my_crc);
  TD_CHECK(td_trainer_agree(t, st));
  uint64_t *info = calloc((size_t)t->world * 2, sizeof *info);
  uint64_t *bytes = calloc((size_t)t->world, sizeof *bytes);
  uint32_t *crcs = calloc((size_t)t->world, sizeof *crcs);
  st = info && bytes && crcs ? TD_OK : td_error(TD_ERR_SYSTEM, "rank %d: out of memory for the checkpoint shard table",
                                                t->rank);
  /* Every rank has its table (or all stop) before the allreduce that fills it. */
  st = td_trainer_agree(t, st);
  if (st == TD_OK) {
    info[2 * t->rank] = my_bytes;
    info[2 * t->rank + 1] = my_crc;
    if (t->comm && t->world > 1) {
      st = td_allreduce(info, info, (size_t)t->world * 2, TD_I64, TD_SUM, t->comm);
      if (st != TD_OK)
        td_error(st, "rank %d: gathering checkpoint checksums failed: %s", t->rank, td_comm_last_error(t->comm));
    }
    for (int r = 0; r < t->world; r++) {
      bytes[r] = info[2 * r];
      crcs[r] = (uint32_t)info[2 * r + 1];
    }
  }
  free(info);

  /* Phase 3: rank 0 publishes; the others wait for its verdict, so that no
   * rank returns before the checkpoint is complete. */
  if (st == TD_OK && t->rank == 0) st = publish(t, &io, root, tmp_dir, bytes, crcs);
  free(bytes);
  free(crcs);
  return td_trainer_agree(t, st);
}

/* ---- the manifest ---- */

/* Strict decimal parse of the whole of `text` into [0, max]. */
static int parse_u64(const char *text, unsigned long long max, unsigned long long *out) {
  if (*text < '0' || *text > '9') return 0;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(text, &end, 10);
  if (errno || *end || v > max) return 0;
  *out = v;
  return 1;
}

static int parse_hex32(const char *text, uint32_t *out) {
  size_t n = strlen(text);
  if (n == 0 || n > 8) return 0;
  for (size_t i = 0; i < n; i++)
    if (!((text[i] >= '0' && text[i] <= '9') || (text[i] >= 'a' && text[i] <= 'f') || (text[i] >= 'A' && text[i] <= 'F')))
      return 0;
  *out = (uint32_t)strtoul(text, NULL, 16);
  return 1;
}

void td_ckpt_manifest_free(td_ckpt_manifest *m) {
  if (!m) return;
  free(m->shard_bytes);
  free(m->shard_crc);
  free(m->shard_seen);
  if (m->tensors)
    for (int i = 0; i < m->n_tensor_lines; i++) free(m->tensors[i].name);
  free(m->tensors);
  memset(m, 0, sizeof *m);
}

/* The next whitespace-separated field of *p (NUL-terminated in place). */
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

td_status td_ckpt_manifest_parse(const char *data, size_t len, const char *source, td_ckpt_manifest *m) {
  memset(m, 0, sizeof *m);
  m->format = -1;
  m->world = -1;
  m->n_tensors = -1;
  if (!source) source = "manifest";
  if (!data && len) return td_error(TD_ERR_INVALID_ARGUMENT, "td_ckpt_manifest_parse: null data");
  if (len > CKPT_MAX_MANIFEST)
    return td_error(TD_ERR_IO, "%s is %zu bytes, more than any manifest: the checkpoint is corrupt", source, len);
  if (len && memchr(data, '\0', len))
    return td_error(TD_ERR_IO, "%s is corrupt: it holds a NUL byte", source);
  /* The last line is "manifest_crc X", a checksum of everything before it. */
  size_t crc_at = SIZE_MAX;
  for (size_t i = 0; i + 13 <= len; i++)
    if ((i == 0 || data[i - 1] == '\n') && memcmp(data + i, "manifest_crc ", 13) == 0) crc_at = i;
  if (crc_at == SIZE_MAX)
    return td_error(TD_ERR_IO, "%s is truncated or corrupt: its closing manifest_crc line is missing", source);
  /* ... ending the file with its newline: a manifest cut anywhere is refused. */
  char crc_text[16];
  size_t crc_len = 0, i = crc_at + 13;
  for (; i < len && data[i] != '\n' && crc_len < sizeof crc_text - 1; i++) crc_text[crc_len++] = data[i];
  crc_text[crc_len] = '\0';
  if (i != len - 1 || data[i] != '\n')
    return td_error(TD_ERR_IO, "%s is truncated or corrupt: its manifest_crc line is not the complete last line",
                    source);
  uint32_t crc_want = 0;
  if (!parse_hex32(crc_text, &crc_want) || td_crc32(0, data, crc_at) != crc_want)
    return td_error(TD_ERR_IO, "%s is corrupt: its checksum does not match its contents", source);

  char *text = malloc(crc_at + 1);
  if (!text) return td_error(TD_ERR_SYSTEM, "out of memory reading %s", source);
  memcpy(text, data, crc_at);
  text[crc_at] = '\0';
  td_status st = TD_OK;
  unsigned seen_keys = 0;
  static const char *const once[] = {CKPT_MAGIC, "world_size", "step", "samples_consumed", "seed", "dataset_samples",
                                     "model_kind", "model_config", "n_params", "optimizer", "n_state_arenas",
                                     "n_tensors"};
  char *save = NULL;
  for (char *line = strtok_r(text, "\n", &save); line && st == TD_OK; line = strtok_r(NULL, "\n", &save)) {
    char shown[81]; /* the line as it was, for the message (fields get cut in place) */
    td_strlcpy(shown, line, sizeof shown);
    char *rest = line;
    char *key = next_field(&rest);
    if (!key) continue;
    while (*rest == ' ') rest++;
    char *v = rest; /* the rest of the line */
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
    } else if (strcmp(key, CKPT_MAGIC) == 0) {
      ok = parse_u64(v, 1000, &u);
      m->format = (int)u;
    } else if (strcmp(key, "world_size") == 0) {
      ok = parse_u64(v, 1u << 20, &u) && u >= 1;
      if (ok) {
        m->world = (int)u;
        m->shard_bytes = calloc(u, sizeof *m->shard_bytes);
        m->shard_crc = calloc(u, sizeof *m->shard_crc);
        m->shard_seen = calloc(u, 1);
        if (!m->shard_bytes || !m->shard_crc || !m->shard_seen)
          st = td_error(TD_ERR_SYSTEM, "out of memory reading %s", source);
      }
    } else if (strcmp(key, "step") == 0) {
      ok = parse_u64(v, LONG_MAX, &u);
      m->step = (long)u;
    } else if (strcmp(key, "samples_consumed") == 0) {
      ok = parse_u64(v, ULLONG_MAX, &m->consumed);
    } else if (strcmp(key, "seed") == 0) {
      ok = parse_u64(v, ULLONG_MAX, &m->seed);
    } else if (strcmp(key, "dataset_samples") == 0) {
      ok = parse_u64(v, ULLONG_MAX, &m->dataset_samples);
    } else if (strcmp(key, "model_kind") == 0) {
      ok = *v && strlen(v) < sizeof m->kind && !strchr(v, ' ');
      if (ok) td_strlcpy(m->kind, v, sizeof m->kind);
    } else if (strcmp(key, "model_config") == 0) {
      ok = strlen(v) < sizeof m->model_config;
      if (ok) td_strlcpy(m->model_config, v, sizeof m->model_config);
    } else if (strcmp(key, "n_params") == 0) {
      /* Bounded so that (1 + states) x n_params x 4 bytes cannot overflow. */
      ok = parse_u64(v, (unsigned long long)1 << 40, &u) && u >= 1;
      m->n_params = (size_t)u;
    } else if (strcmp(key, "optimizer") == 0) {
      ok = *v && strlen(v) < sizeof m->optimizer && !strchr(v, ' ');
      if (ok) td_strlcpy(m->optimizer, v, sizeof m->optimizer);
    } else if (strcmp(key, "n_state_arenas") == 0) {
      ok = parse_u64(v, 2, &u) && u >= 1;
      m->n_states = (int)u;
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
    } else if (strcmp(key, "shard") == 0) {
      /* "shard RANK BYTES CRC FILE", after world_size; once per rank. */
      char *r_text = next_field(&rest), *b_text = next_field(&rest), *c_text = next_field(&rest);
      unsigned long long r = 0, b = 0;
      uint32_t c = 0;
      ok = m->world > 0 && r_text && b_text && c_text && parse_u64(r_text, (unsigned long long)m->world - 1, &r) &&
           parse_u64(b_text, (unsigned long long)1 << 62, &b) && parse_hex32(c_text, &c) && !m->shard_seen[r];
      if (ok) {
        m->shard_bytes[r] = b;
        m->shard_crc[r] = c;
        m->shard_seen[r] = 1;
        m->n_shards++;
      }
    }
    /* Other keys (config essentials) are informational. */
    if (!ok && st == TD_OK) st = td_error(TD_ERR_IO, "%s is corrupt: cannot parse the line \"%s\"", source, shown);
  }
  free(text);
  if (st == TD_OK && m->format != CKPT_FORMAT)
    st = td_error(TD_ERR_IO, "%s: checkpoint format %d, this Tandem reads format %d", source, m->format, CKPT_FORMAT);
  if (st == TD_OK && (m->world < 1 || m->n_shards != m->world))
    st = td_error(TD_ERR_IO, "%s is corrupt: it lists %d shards for world size %d", source, m->n_shards, m->world);
  if (st == TD_OK && (m->n_params == 0 || m->n_states < 1 || !m->kind[0] || !m->optimizer[0] || m->n_tensors < 0 ||
                      m->n_tensor_lines != m->n_tensors))
    st = td_error(TD_ERR_IO, "%s is corrupt: a required line (n_params, n_state_arenas, model_kind, optimizer, "
                             "n_tensors and its %d tensor lines) is missing",
                  source, m->n_tensors);
  if (st != TD_OK) td_ckpt_manifest_free(m);
  return st;
}

/* ---- resume ---- */

/* The value of `key` in a "k=v k=v" string, copied into out; 0 if absent. */
static int config_value(const char *config, const char *key, char *out, size_t size) {
  size_t klen = strlen(key);
  for (const char *p = config; p && *p;) {
    while (*p == ' ') p++;
    const char *end = strchr(p, ' ');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    if (n > klen && strncmp(p, key, klen) == 0 && p[klen] == '=') {
      size_t vlen = TD_MIN(n - klen - 1, size - 1);
      memcpy(out, p + klen + 1, vlen);
      out[vlen] = '\0';
      return 1;
    }
    p = end;
  }
  return 0;
}

/* Every key=value that differs between the checkpoint's model shape and
 * this model's, into msg ("layers: 4 in the checkpoint, 2 here; ..."). */
static int config_differences(const char *saved, const char *mine, char *msg, size_t size) {
  int n_diff = 0;
  size_t used = 0;
  msg[0] = '\0';
  const char *sources[2] = {saved, mine};
  for (int side = 0; side < 2; side++)
    for (const char *p = sources[side]; p && *p;) {
      while (*p == ' ') p++;
      const char *end = strchr(p, ' ');
      size_t n = end ? (size_t)(end - p) : strlen(p);
      const char *eq = memchr(p, '=', n);
      if (eq && eq > p && (size_t)(eq - p) < 64) {
        char key[64], a[64] = "(absent)", b[64] = "(absent)";
        memcpy(key, p, (size_t)(eq - p));
        key[eq - p] = '\0';
        int in_saved = config_value(saved, key, a, sizeof a), in_mine = config_value(mine, key, b, sizeof b);
        /* A key in both is reported once, from the checkpoint's side. */
        if ((side == 0 || !in_saved) && (!in_saved || !in_mine || strcmp(a, b) != 0)) {
          if (used < size) {
            int w = snprintf(msg + used, size - used, "%s%s: %s in the checkpoint, %s in this run", n_diff ? "; " : "",
                             key, a, b);
            if (w > 0) used += (size_t)w;
          }
          n_diff++;
        }
      }
      p = end;
    }
  return n_diff;
}

/* Resolve `path` to a step directory: ROOT (follow ROOT/latest) or step-N. */
static td_status find_step_dir(const char *path, char *dir, size_t size) {
  char file[1280];
  if (path_fmt(file, sizeof file, "%s/manifest", path) != 0)
    return td_error(TD_ERR_INVALID_ARGUMENT, "checkpoint path too long: %s", path);
  if (path_exists(file)) {
    td_strlcpy(dir, path, size);
    return TD_OK;
  }
  path_fmt(file, sizeof file, "%s/latest", path);
  if (!path_exists(file))
    return td_error(TD_ERR_IO,
                    "no checkpoint in %s: neither %s/latest nor %s/manifest exists (give the --save directory of an "
                    "earlier run, or one of its step-N directories)",
                    path, path, path);
  char name[256];
  read_latest(path, name, sizeof name);
  long step, gen;
  if (!parse_step_name(name, &step, &gen))
    return td_error(TD_ERR_IO, "%s is corrupt: it should hold a name like \"step-100\"", file);
  path_fmt(dir, size, "%s/%s", path, name);
  return TD_OK;
}

/* Read every shard into the staging arenas (1 + n_states arenas of n_params). */
static td_status load_shards(const char *dir, const td_ckpt_manifest *m, int n_arenas, size_t n_params, float *stage) {
  for (int r = 0; r < m->world; r++) {
    char path[1280];
    path_fmt(path, sizeof path, "%s/rank-%d.bin", dir, r);
    size_t off, len = shard_floats(n_params, m->world, r, &off);
    uint64_t expect = (uint64_t)n_arenas * len * sizeof(float);
    if (m->shard_bytes[r] != expect)
      return td_error(TD_ERR_IO, "%s/manifest is inconsistent: shard %d should hold %llu bytes, it says %llu", dir, r,
                      (unsigned long long)expect, (unsigned long long)m->shard_bytes[r]);
    char *data;
    size_t n;
    TD_CHECK(read_file(path, (size_t)expect, &data, &n));
    if (n != expect) {
      free(data);
      return td_error(TD_ERR_IO, "%s is %zu bytes but the manifest says %llu: the checkpoint is %s", path, n,
                      (unsigned long long)expect, n < expect ? "truncated" : "corrupt");
    }
    uint32_t crc = td_crc32(0, data, n);
    if (crc != m->shard_crc[r]) {
      free(data);
      return td_error(TD_ERR_IO, "%s is corrupt: CRC-32 %08x, the manifest says %08x", path, (unsigned)crc,
                      (unsigned)m->shard_crc[r]);
    }
    for (int a = 0; a < n_arenas; a++)
      memcpy(stage + (size_t)a * n_params + off, data + (size_t)a * len * sizeof(float), len * sizeof(float));
    free(data);
  }
  return TD_OK;
}

/* The checkpoint's model and optimizer against this trainer's. */
static td_status check_model(const td_trainer *t, const char *file, const td_ckpt_manifest *m) {
  const td_model *model = t->model;
  const char *kind = model->kind ? model->kind : "?";
  if (strcmp(m->kind, kind) != 0)
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: the checkpoint is of a \"%s\" model, this run trains a \"%s\"", file,
                    m->kind, kind);
  if (m->model_config[0] && model->config) {
    char diff[768];
    if (config_differences(m->model_config, model->config, diff, sizeof diff) > 0)
      return td_error(TD_ERR_INVALID_ARGUMENT,
                      "%s: the checkpoint is of a different %s model configuration (%s): resume with the saved run's "
                      "model flags",
                      file, kind, diff);
  }
  if (m->n_params != t->n_params || m->n_tensor_lines != model->n_tensors)
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "%s: the checkpoint's model has %zu parameters in %d tensors, this one %zu in %d: use the same "
                    "model configuration (layers, channels, ...) as the saved run",
                    file, m->n_params, m->n_tensor_lines, t->n_params, model->n_tensors);
  for (int i = 0; i < model->n_tensors; i++) {
    const td_param_tensor *p = &model->tensors[i];
    const td_ckpt_tensor *q = &m->tensors[i];
    if (p->offset != q->offset || p->count != q->count || (p->name && strcmp(p->name, q->name) != 0))
      return td_error(TD_ERR_INVALID_ARGUMENT,
                      "%s: tensor %d is \"%s\" (offset %zu, %zu floats) but this model has \"%s\" (offset %zu, "
                      "%zu floats): the checkpoint is from a different model configuration",
                      file, i, q->name, q->offset, q->count, p->name ? p->name : "?", p->offset, p->count);
  }
  if (strcmp(m->optimizer, td_optimizer_name(t->cfg.optimizer.kind)) != 0 || m->n_states != t->n_states)
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "%s: the checkpoint was trained with optimizer %s, this run uses %s: use the same optimizer type",
                    file, m->optimizer, td_optimizer_name(t->cfg.optimizer.kind));
  return TD_OK;
}

static td_status resume_local(td_trainer *t, const char *path, float **stage_out, td_ckpt_manifest *m) {
  char dir[1280], file[1300];
  TD_CHECK(find_step_dir(path, dir, sizeof dir));
  path_fmt(file, sizeof file, "%s/manifest", dir);
  char *text;
  size_t n;
  TD_CHECK(read_file(file, CKPT_MAX_MANIFEST, &text, &n));
  td_status st = td_ckpt_manifest_parse(text, n, file, m);
  free(text);
  TD_CHECK(st);
  TD_CHECK(check_model(t, file, m));
  int n_arenas = 1 + t->n_states;
  float *stage = td_alloc((size_t)n_arenas * t->n_params * sizeof(float));
  if (!stage) return td_error(TD_ERR_SYSTEM, "out of memory staging the checkpoint");
  st = load_shards(dir, m, n_arenas, t->n_params, stage);
  if (st != TD_OK) {
    td_free(stage);
    return st;
  }
  *stage_out = stage;
  return TD_OK;
}

td_status td_trainer_resume(td_trainer *t, const char *path) {
  if (!t || !path || !*path) return td_error(TD_ERR_INVALID_ARGUMENT, "td_trainer_resume: null trainer or empty path");
  if (strlen(path) > 1000) return td_error(TD_ERR_INVALID_ARGUMENT, "checkpoint path too long: %s", path);
  if (t->zero_stage >= 1)
    return td_error(TD_ERR_INVALID_USAGE, "rank %d: resuming is not supported at ZeRO stage %d yet; use stage 0",
                    t->rank, t->zero_stage);
  float *stage = NULL;
  td_ckpt_manifest m;
  memset(&m, 0, sizeof m);
  td_status st = resume_local(t, path, &stage, &m);
  if (st != TD_OK) {
    char why[900];
    td_error_copy(why, sizeof why);
    st = td_error(st, "rank %d: %s", t->rank, why);
  }
  st = td_trainer_agree(t, st);
  if (st == TD_OK) {
    /* All ranks verified the same files: commit. */
    memcpy(t->params, stage, t->n_params * sizeof(float));
    for (int s = 0; s < t->n_states; s++)
      memcpy(t->states[s], stage + (size_t)(s + 1) * t->n_params, t->n_params * sizeof(float));
    t->step = m.step;
    t->consumed = m.consumed;
    if (t->rank == 0 && m.dataset_samples != (unsigned long long)t->dataset->n_samples)
      TD_WARN("the checkpoint was trained on a dataset of %llu samples, this one has %zu: training continues, but "
              "not on the data order the saved run would have seen",
              m.dataset_samples, t->dataset->n_samples);
    if (m.seed != t->cfg.seed) {
      /* The data order is part of the run being continued: keep its seed. */
      TD_INFO("resuming a run saved with seed %llu (this run's seed %llu is ignored for the data order)", m.seed,
              (unsigned long long)t->cfg.seed);
      t->cfg.seed = m.seed;
      t->sampler.seed = m.seed;
      t->sampler.epoch = UINT64_MAX;
    }
  }
  td_free(stage);
  td_ckpt_manifest_free(&m);
  return st;
}
