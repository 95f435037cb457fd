/* Checkpoints: sharded save and exact resume.
 *
 * Layout of ROOT/step-N/:
 *   rank-R.bin     rank R's shard: for each arena (parameters, then each
 *                  optimizer state) the floats td_shard_range(n_params, W, R),
 *                  back to back, native little-endian f32.
 *   manifest       text, one "key value" per line: format version, world
 *                  size, step, sampler position, seed, model kind and size,
 *                  the tensor table, optimizer, config essentials, each
 *                  shard's bytes and CRC-32, and last a CRC of the lines
 *                  above it (so a truncated manifest is detected too).
 * ROOT/latest holds "step-N".
 *
 * Crash safety: everything is written into step-N.tmp and fsync'd; after a
 * barrier (all shards durable) rank 0 writes the manifest, renames the
 * directory to step-N, and replaces `latest` by writing latest.tmp and
 * renaming it (atomic on POSIX), fsyncing the directory after each rename.
 * A crash at any point leaves `latest` naming a complete checkpoint; a
 * leftover step-N.tmp is ignored by resume and removed by the next save.
 *
 * Resume reads the manifest and every shard on every rank (so a different
 * world size just reassembles the shards), checks sizes and checksums before
 * touching the trainer, and agrees across ranks so that all succeed or all
 * fail. */
#include "train/train_impl.h"

#include <dirent.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CKPT_FORMAT 1
#define CKPT_MAGIC "tandem-checkpoint"

/* snprintf for paths: a too-long path is reported rather than silently cut
 * (the caller checks the status where it matters; buffers are sized for a
 * 1000-character root). */
static int path_fmt(char *out, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int path_fmt(char *out, size_t size, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(out, size, fmt, ap);
  va_end(ap);
  return n >= 0 && (size_t)n < size ? 0 : -1;
}

/* ---- small file helpers ---- */

static td_status fsync_path(const char *path, int directory) {
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

static td_status write_file(const char *path, const void *data, size_t n) {
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
  if (fsync(fd) != 0) {
    td_status st = td_error_errno("cannot fsync %s", path);
    close(fd);
    return st;
  }
  if (close(fd) != 0) return td_error_errno("cannot close %s", path);
  return TD_OK;
}

/* Read a whole file; *data is malloc'd (NUL-terminated for text). */
static td_status read_file(const char *path, char **data, size_t *n) {
  *data = NULL;
  *n = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return td_error(TD_ERR_IO, "cannot open %s: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    close(fd);
    return td_error(TD_ERR_IO, "cannot stat %s: %s", path, strerror(errno));
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

static td_status mkdir_p(const char *path) {
  char buf[1024];
  if (td_strlcpy(buf, path, sizeof buf) >= sizeof buf - 1)
    return td_error(TD_ERR_INVALID_ARGUMENT, "checkpoint path too long: %s", path);
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) return td_error_errno("cannot create directory %s", buf);
    *p = '/';
  }
  if (mkdir(buf, 0755) != 0 && errno != EEXIST) return td_error_errno("cannot create directory %s", buf);
  return TD_OK;
}

/* Remove a checkpoint directory (flat: files only). */
static td_status remove_flat_dir(const char *path) {
  DIR *d = opendir(path);
  if (!d) return errno == ENOENT ? TD_OK : td_error_errno("cannot open directory %s to remove it", path);
  struct dirent *e;
  char file[1280];
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    path_fmt(file, sizeof file, "%s/%s", path, e->d_name);
    if (unlink(file) != 0 && errno != ENOENT) {
      td_status st = td_error_errno("cannot remove %s", file);
      closedir(d);
      return st;
    }
  }
  closedir(d);
  if (rmdir(path) != 0 && errno != ENOENT) return td_error_errno("cannot remove directory %s", path);
  return TD_OK;
}

/* ---- save ---- */

static size_t shard_floats(size_t n_params, int world, int rank, size_t *offset) {
  size_t len;
  td_shard_range(n_params, world, rank, offset, &len);
  return len;
}

static td_status write_shard(td_trainer *t, const char *dir, uint64_t *bytes_out, uint32_t *crc_out) {
  size_t off, len = shard_floats(t->n_params, t->world, t->rank, &off);
  int n_arenas = 1 + t->n_states;
  size_t bytes = (size_t)n_arenas * len * sizeof(float);
  float *buf = td_alloc(bytes);
  if (!buf) return td_error(TD_ERR_SYSTEM, "out of memory for a %zu-byte checkpoint shard", bytes);
  memcpy(buf, t->params + off, len * sizeof(float));
  for (int s = 0; s < t->n_states; s++) memcpy(buf + (size_t)(s + 1) * len, t->states[s] + off, len * sizeof(float));
  char path[1280];
  path_fmt(path, sizeof path, "%s/rank-%d.bin", dir, t->rank);
  td_status st = write_file(path, buf, bytes);
  *bytes_out = bytes;
  *crc_out = td_crc32(0, buf, bytes);
  td_free(buf);
  return st;
}

static char *manifest_text(const td_trainer *t, const uint64_t *shard_bytes, const uint32_t *shard_crc) {
  size_t cap = 4096 + (size_t)t->model->n_tensors * 160 + (size_t)t->world * 64;
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

/* Rank 0's part after every shard is durable: manifest, rename, latest. */
static td_status publish(td_trainer *t, const char *root, const char *tmp_dir, const char *final_dir,
                         const char *final_name, const uint64_t *bytes, const uint32_t *crcs) {
  char path[1280], path2[1280];
  char *text = manifest_text(t, bytes, crcs);
  if (!text) return td_error(TD_ERR_SYSTEM, "out of memory writing the checkpoint manifest");
  path_fmt(path, sizeof path, "%s/manifest", tmp_dir);
  td_status st = write_file(path, text, strlen(text));
  free(text);
  TD_CHECK(st);
  TD_CHECK(fsync_path(tmp_dir, 1));
  /* Saving the same step twice (after a resume): move the old one aside
   * first, since rename() cannot replace a non-empty directory. */
  path_fmt(path2, sizeof path2, "%s.old", final_dir);
  int had_old = 0;
  if (path_exists(final_dir)) {
    TD_CHECK(remove_flat_dir(path2));
    if (rename(final_dir, path2) != 0) return td_error_errno("cannot move %s aside to %s", final_dir, path2);
    had_old = 1;
  }
  if (rename(tmp_dir, final_dir) != 0) return td_error_errno("cannot rename %s to %s", tmp_dir, final_dir);
  TD_CHECK(fsync_path(root, 1));
  path_fmt(path, sizeof path, "%s/latest.tmp", root);
  snprintf(path2, sizeof path2, "%s\n", final_name);
  TD_CHECK(write_file(path, path2, strlen(path2)));
  char latest[1280];
  path_fmt(latest, sizeof latest, "%s/latest", root);
  if (rename(path, latest) != 0) return td_error_errno("cannot rename %s to %s", path, latest);
  TD_CHECK(fsync_path(root, 1));
  if (had_old) {
    path_fmt(path2, sizeof path2, "%s.old", final_dir);
    TD_CHECK(remove_flat_dir(path2));
  }
  return TD_OK;
}

td_status td_trainer_save(td_trainer *t, const char *root) {
  if (!t || !root || !*root) return td_error(TD_ERR_INVALID_ARGUMENT, "td_trainer_save: null trainer or empty directory");
  if (strlen(root) > 1000) return td_error(TD_ERR_INVALID_ARGUMENT, "checkpoint directory name too long: %s", root);
  char final_name[64], tmp_dir[1280], final_dir[1280];
  snprintf(final_name, sizeof final_name, "step-%ld", t->step);
  path_fmt(final_dir, sizeof final_dir, "%s/%s", root, final_name);
  path_fmt(tmp_dir, sizeof tmp_dir, "%s.tmp", final_dir);

  /* Phase 1: rank 0 makes a clean step-N.tmp (a crashed save may have left one). */
  td_status st = TD_OK;
  if (t->rank == 0) {
    st = mkdir_p(root);
    if (st == TD_OK) st = remove_flat_dir(tmp_dir);
    if (st == TD_OK && mkdir(tmp_dir, 0755) != 0) st = td_error_errno("cannot create directory %s", tmp_dir);
  }
  TD_CHECK(td_trainer_agree(t, st));

  /* Phase 2: every rank writes and syncs its shard; the sizes and checksums
   * travel to rank 0 in one allreduce (each rank fills its own slots). */
  uint64_t my_bytes = 0;
  uint32_t my_crc = 0;
  st = write_shard(t, tmp_dir, &my_bytes, &my_crc);
  TD_CHECK(td_trainer_agree(t, st));
  uint64_t *info = calloc((size_t)t->world * 2, sizeof *info);
  uint32_t *crcs = calloc((size_t)t->world, sizeof *crcs);
  if (!info || !crcs) {
    free(info);
    free(crcs);
    st = td_error(TD_ERR_SYSTEM, "out of memory for checkpoint shard table");
  } else {
    info[2 * t->rank] = my_bytes;
    info[2 * t->rank + 1] = my_crc;
    if (t->comm && t->world > 1) {
      st = td_allreduce(info, info, (size_t)t->world * 2, TD_I64, TD_SUM, t->comm);
      if (st != TD_OK) td_error(st, "rank %d: gathering checkpoint checksums failed: %s", t->rank, td_comm_last_error(t->comm));
    }
  }
  if (st != TD_OK) {
    free(info);
    free(crcs);
    return st;
  }
  uint64_t *bytes = calloc((size_t)t->world, sizeof *bytes);
  if (!bytes) st = td_error(TD_ERR_SYSTEM, "out of memory for checkpoint shard table");
  for (int r = 0; bytes && r < t->world; r++) {
    bytes[r] = info[2 * r];
    crcs[r] = (uint32_t)info[2 * r + 1];
  }
  free(info);

  /* Phase 3: rank 0 publishes; the others wait for its verdict, so that no
   * rank returns before the checkpoint is complete. */
  if (st == TD_OK && t->rank == 0) st = publish(t, root, tmp_dir, final_dir, final_name, bytes, crcs);
  free(bytes);
  free(crcs);
  return td_trainer_agree(t, st);
}

/* ---- resume ---- */

typedef struct manifest {
  int format, world;
  long step;
  unsigned long long consumed, seed, dataset_samples;
  char kind[64], optimizer[16];
  size_t n_params;
  int n_states, n_tensors, n_tensor_lines, n_shards;
  uint64_t *shard_bytes;
  uint32_t *shard_crc;
} manifest;

static td_status parse_manifest(const char *path, char *text, size_t len, const td_model *model, manifest *m) {
  memset(m, 0, sizeof *m);
  m->world = -1;
  /* The last line is "manifest_crc X", a checksum of everything before it. */
  char *crc_line = NULL;
  for (char *p = text; (p = strstr(p, "manifest_crc ")) != NULL; p++)
    if (p == text || p[-1] == '\n') crc_line = p;
  if (!crc_line)
    return td_error(TD_ERR_IO, "%s is truncated or corrupt: its closing manifest_crc line is missing", path);
  unsigned crc_want = 0;
  if (sscanf(crc_line, "manifest_crc %x", &crc_want) != 1 ||
      td_crc32(0, text, (size_t)(crc_line - text)) != crc_want)
    return td_error(TD_ERR_IO, "%s is corrupt: its checksum does not match its contents", path);
  (void)len;
  int tensor_i = 0;
  char *save = NULL;
  *crc_line = '\0';
  for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    char key[64];
    int used = 0;
    if (sscanf(line, "%63s %n", key, &used) < 1) continue;
    const char *v = line + used;
    int ok = 1;
    if (strcmp(key, CKPT_MAGIC) == 0) ok = sscanf(v, "%d", &m->format) == 1;
    else if (strcmp(key, "world_size") == 0) {
      ok = sscanf(v, "%d", &m->world) == 1 && m->world >= 1 && m->world <= (1 << 20);
      if (ok) {
        m->shard_bytes = calloc((size_t)m->world, sizeof *m->shard_bytes);
        m->shard_crc = calloc((size_t)m->world, sizeof *m->shard_crc);
        if (!m->shard_bytes || !m->shard_crc) return td_error(TD_ERR_SYSTEM, "out of memory reading %s", path);
      }
    } else if (strcmp(key, "step") == 0) ok = sscanf(v, "%ld", &m->step) == 1;
    else if (strcmp(key, "samples_consumed") == 0) ok = sscanf(v, "%llu", &m->consumed) == 1;
    else if (strcmp(key, "seed") == 0) ok = sscanf(v, "%llu", &m->seed) == 1;
    else if (strcmp(key, "dataset_samples") == 0) ok = sscanf(v, "%llu", &m->dataset_samples) == 1;
    else if (strcmp(key, "model_kind") == 0) ok = sscanf(v, "%63s", m->kind) == 1;
    else if (strcmp(key, "n_params") == 0) ok = sscanf(v, "%zu", &m->n_params) == 1;
    else if (strcmp(key, "optimizer") == 0) ok = sscanf(v, "%15s", m->optimizer) == 1;
    else if (strcmp(key, "n_state_arenas") == 0) ok = sscanf(v, "%d", &m->n_states) == 1;
    else if (strcmp(key, "n_tensors") == 0) ok = sscanf(v, "%d", &m->n_tensors) == 1;
    else if (strcmp(key, "tensor") == 0) {
      size_t off, cnt;
      int name_at = 0;
      ok = sscanf(v, "%zu %zu %n", &off, &cnt, &name_at) == 2;
      if (ok && tensor_i < model->n_tensors) {
        const td_param_tensor *p = &model->tensors[tensor_i];
        if (p->offset != off || p->count != cnt || (p->name && strcmp(p->name, v + name_at) != 0))
          return td_error(TD_ERR_INVALID_ARGUMENT,
                          "%s: tensor %d is \"%s\" (offset %zu, %zu floats) but this model has \"%s\" (offset %zu, "
                          "%zu floats): the checkpoint is from a different model configuration",
                          path, tensor_i, v + name_at, off, cnt, p->name ? p->name : "?", p->offset, p->count);
      }
      tensor_i++;
    } else if (strcmp(key, "shard") == 0) {
      int r;
      unsigned long long b;
      unsigned c;
      ok = sscanf(v, "%d %llu %x", &r, &b, &c) == 3 && m->world > 0 && r >= 0 && r < m->world;
      if (ok) {
        m->shard_bytes[r] = b;
        m->shard_crc[r] = c;
        m->n_shards++;
      }
    }
    /* Other keys (config essentials) are informational. */
    if (!ok) return td_error(TD_ERR_IO, "%s is corrupt: cannot parse the line \"%.80s\"", path, line);
  }
  m->n_tensor_lines = tensor_i;
  if (m->format != CKPT_FORMAT)
    return td_error(TD_ERR_IO, "%s: checkpoint format %d, this Tandem reads format %d", path, m->format, CKPT_FORMAT);
  if (m->world < 1 || m->n_shards != m->world)
    return td_error(TD_ERR_IO, "%s is corrupt: it lists %d shards for world size %d", path, m->n_shards, m->world);
  return TD_OK;
}

static void manifest_free(manifest *m) {
  free(m->shard_bytes);
  free(m->shard_crc);
}

/* Resolve `path` to a step directory: ROOT (follow ROOT/latest) or step-N. */
static td_status find_step_dir(const char *path, char *dir, size_t size) {
  char file[1280];
  path_fmt(file, sizeof file, "%s/manifest", path);
  if (path_exists(file)) {
    td_strlcpy(dir, path, size);
    return TD_OK;
  }
  path_fmt(file, sizeof file, "%s/latest", path);
  char *text;
  size_t n;
  if (!path_exists(file))
    return td_error(TD_ERR_IO,
                    "no checkpoint in %s: neither %s/latest nor %s/manifest exists (give the --save directory of an "
                    "earlier run, or one of its step-N directories)",
                    path, path, path);
  TD_CHECK(read_file(file, &text, &n));
  while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == ' ')) text[--n] = '\0';
  if (n == 0 || strchr(text, '/')) {
    td_status st = td_error(TD_ERR_IO, "%s is corrupt: it should hold a name like \"step-100\"", file);
    free(text);
    return st;
  }
  path_fmt(dir, size, "%s/%s", path, text);
  free(text);
  return TD_OK;
}

/* Read every shard into the staging arenas (1 + n_states arenas of n_params). */
static td_status load_shards(const char *dir, const manifest *m, int n_arenas, size_t n_params, float *stage) {
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
    TD_CHECK(read_file(path, &data, &n));
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

static td_status resume_local(td_trainer *t, const char *path, float **stage_out, manifest *m) {
  char dir[1280], file[1300];
  TD_CHECK(find_step_dir(path, dir, sizeof dir));
  path_fmt(file, sizeof file, "%s/manifest", dir);
  char *text;
  size_t n;
  TD_CHECK(read_file(file, &text, &n));
  td_status st = parse_manifest(file, text, n, t->model, m);
  free(text);
  TD_CHECK(st);
  const char *kind = t->model->kind ? t->model->kind : "?";
  if (strcmp(m->kind, kind) != 0)
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: the checkpoint is of a \"%s\" model, this run trains a \"%s\"", file,
                    m->kind, kind);
  if (m->n_params != t->n_params || m->n_tensor_lines != t->model->n_tensors)
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "%s: the checkpoint's model has %zu parameters in %d tensors, this one %zu in %d: use the same "
                    "model configuration (layers, channels, ...) as the saved run",
                    file, m->n_params, m->n_tensor_lines, t->n_params, t->model->n_tensors);
  if (strcmp(m->optimizer, td_optimizer_name(t->cfg.optimizer.kind)) != 0 || m->n_states != t->n_states)
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "%s: the checkpoint was trained with optimizer %s, this run uses %s: use the same optimizer type",
                    file, m->optimizer, td_optimizer_name(t->cfg.optimizer.kind));
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
  float *stage = NULL;
  manifest m;
  memset(&m, 0, sizeof m);
  td_status st = resume_local(t, path, &stage, &m);
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
  manifest_free(&m);
  return st;
}
