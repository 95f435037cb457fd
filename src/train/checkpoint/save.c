/* Saving a checkpoint: every rank writes the element ranges it was given
 * into its own file, in parallel; rank 0 publishes.
 *
 *   phase 1  rank 0: clear leftovers of crashed saves, make
 *            ROOT/step-N.tmp-TOKEN with the random TOKEN in it ("visible")
 *   phase 2  every rank: check it sees TOKEN through its own path (the
 *            shared-directory check), write rank-R.bin straight from its
 *            regions (no staging copy), one CRC-32 per chunk, fsync
 *   phase 3  the piece tables travel to every rank in one allgather; rank 0
 *            builds the manifest, parses it back (which proves that the
 *            ranks' ranges tile every arena), writes it, renames the
 *            directory to a name nothing else uses (step-N, or step-N.G),
 *            replaces `latest` atomically and only then removes what
 *            `latest` no longer names and what keep_last prunes.
 *
 * Killed at any instant, ROOT holds the old `latest` and its complete
 * directory, or the new ones (io.c: every file operation passes the
 * TANDEM_CKPT_FAULT_AT hook). Every phase ends in an agreement, so all ranks
 * succeed or all fail with the failing rank's reason. */
#include "train/checkpoint/ckpt.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "train/checkpoint/io.h"
#include "train/core/core.h"

/* This rank's file: the regions back to back, in the order given (empty ones
 * skipped). Fills pieces[] (file index = rank) and *bytes_out. Two file
 * operations: create+write, sync. */
static td_status write_rank_file(td_trainer *t, save_io *io, const char *path, const td_ckpt_region *regions,
                                 int n_regions, uint64_t chunk, td_ckpt_piece *pieces, int *n_pieces,
                                 uint64_t *bytes_out) {
  const int rank = td_ckpt_group_of(t).rank; /* file index and messages: the saving group's rank */
  *n_pieces = 0;
  *bytes_out = 0;
  ckpt_fault_point(io);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return td_error_errno("rank %d: cannot create its checkpoint file %s", rank, path);
  td_status st = TD_OK;
  uint64_t offset = 0;
  for (int i = 0; i < n_regions && st == TD_OK; i++) {
    const td_ckpt_region *r = &regions[i];
    if (r->hi == r->lo) continue;
    uint64_t bytes = (r->hi - r->lo) * 4, n_crc = (bytes + chunk - 1) / chunk;
    uint32_t *crc = malloc(n_crc * sizeof *crc);
    if (!crc) {
      st = td_error(TD_ERR_SYSTEM, "rank %d: out of memory for %llu checkpoint checksums", rank,
                    (unsigned long long)n_crc);
      break;
    }
    const char *p = (const char *)r->data;
    for (uint64_t c = 0; c < n_crc; c++) {
      size_t len = (size_t)TD_MIN(chunk, bytes - c * chunk);
      crc[c] = td_crc32(0, p + c * chunk, len);
      if (ckpt_write_full(fd, p + c * chunk, len) != 0) {
        st = td_error_errno("rank %d: cannot write its checkpoint file %s (disk full?)", rank, path);
        break;
      }
    }
    pieces[(*n_pieces)++] = (td_ckpt_piece){rank, r->arena, r->lo, r->hi, offset, crc, n_crc};
    offset += bytes;
  }
  if (st == TD_OK) {
    ckpt_fault_point(io);
    if (fsync(fd) != 0) st = td_error_errno("rank %d: cannot fsync %s", rank, path);
  }
  if (close(fd) != 0 && st == TD_OK) st = td_error_errno("rank %d: cannot close %s", rank, path);
  *bytes_out = offset;
  return st;
}

/* A rank's piece table as u64 words, for the allgather:
 *   [file_bytes, n_pieces, {arena, lo, hi, offset, n_crc, crc...} x n_pieces] */
static uint64_t table_words(const td_ckpt_piece *pieces, int n) {
  uint64_t w = 2;
  for (int i = 0; i < n; i++) w += 5 + pieces[i].n_crc;
  return w;
}

static void table_encode(uint64_t *out, uint64_t file_bytes, const td_ckpt_piece *pieces, int n) {
  *out++ = file_bytes;
  *out++ = (uint64_t)n;
  for (int i = 0; i < n; i++) {
    const td_ckpt_piece *p = &pieces[i];
    *out++ = (uint64_t)p->arena, *out++ = p->lo, *out++ = p->hi, *out++ = p->offset, *out++ = p->n_crc;
    for (uint64_t c = 0; c < p->n_crc; c++) *out++ = p->crc[c];
  }
}

/* The manifest of this save from the trainer and every rank's table (in
 * `all`, `words` u64 per rank). Its text, or NULL with the error set. */
static char *build_manifest(td_trainer *t, const uint64_t *all, uint64_t words, uint64_t chunk) {
  const td_ckpt_group grp = td_ckpt_group_of(t);
  td_ckpt_manifest m;
  memset(&m, 0, sizeof m);
  const td_model *model = grp.model;
  const td_train_config *c = &t->cfg;
  m.format = TD_CKPT_FORMAT;
  m.world = grp.world;
  m.zero_stage = t->zero_stage;
  m.step = t->step;
  m.consumed = t->consumed;
  m.has_scaler = 1; /* fp16's loss scaler (src/train/precision/) */
  m.scaler_scale = t->scaler.scale;
  m.scaler_iter = t->scaler.iter;
  m.scaler_last_overflow = t->scaler.last_overflow_iter;
  m.scaler_hysteresis_left = t->scaler.hysteresis_left;
  m.scaler_skipped = t->scaler.skipped;
  m.seed = c->seed;
  m.dataset_samples = t->dataset->n_samples;
  m.train_batch_size = (unsigned long long)c->train_batch_size;
  td_strlcpy(m.kind, model->kind ? model->kind : "?", sizeof m.kind);
  td_strlcpy(m.optimizer, td_optimizer_name(c->optimizer.kind), sizeof m.optimizer);
  if (model->config) td_strlcpy(m.model_config, model->config, sizeof m.model_config);
  m.n_params = grp.n_params;
  m.n_states = t->n_states;
  m.chunk_bytes = chunk;
  m.n_tensors = m.n_tensor_lines = model->n_tensors;
  m.tensors = calloc((size_t)TD_MAX(model->n_tensors, 1), sizeof *m.tensors);
  m.n_arenas = td_ckpt_trainer_arenas(t, m.arenas);
  m.n_files = m.n_file_lines = grp.world;
  m.files = calloc((size_t)grp.world, sizeof *m.files);
  int total = 0;
  for (int r = 0; r < grp.world; r++) total += (int)all[(uint64_t)r * words + 1];
  m.pieces = calloc((size_t)TD_MAX(total, 1), sizeof *m.pieces);
  char *text = NULL;
  int oom = !m.tensors || !m.files || !m.pieces;
  if (!oom) {
    for (int i = 0; i < model->n_tensors; i++) {
      const td_param_tensor *p = &model->tensors[i];
      /* Names go into a space-separated line: a name is never empty. */
      m.tensors[i] = (td_ckpt_tensor){p->offset, p->count, (char *)(p->name && *p->name ? p->name : "?")};
    }
    for (int r = 0; r < grp.world; r++) {
      const uint64_t *w = all + (uint64_t)r * words;
      snprintf(m.files[r].name, sizeof m.files[r].name, "rank-%d.bin", r);
      m.files[r].bytes = w[0];
      uint64_t n = w[1];
      w += 2;
      for (uint64_t i = 0; i < n; i++) {
        /* The crc words are u64 on the wire; the piece points into a copy. */
        td_ckpt_piece *p = &m.pieces[m.n_pieces++];
        *p = (td_ckpt_piece){r, (int)w[0], w[1], w[2], w[3], NULL, w[4]};
        p->crc = malloc((size_t)TD_MAX(p->n_crc, 1) * sizeof *p->crc);
        if (!p->crc) {
          oom = 1;
          break;
        }
        for (uint64_t k = 0; k < p->n_crc; k++) p->crc[k] = (uint32_t)w[5 + k];
        w += 5 + p->n_crc;
      }
    }
    if (!oom) text = td_ckpt_manifest_format(&m);
  }
  if (!text) td_error(TD_ERR_SYSTEM, "rank 0: out of memory building the checkpoint manifest");
  for (int i = 0; i < m.n_pieces; i++) free(m.pieces[i].crc);
  free(m.pieces);
  free(m.files);
  free(m.tensors);
  return text;
}

/* Rank 0 after every rank's file is durable: check and write the manifest,
 * name the directory, move `latest`, clean up. */
static td_status publish(td_trainer *t, save_io *io, const char *root, const char *tmp_dir, const char *text) {
  char path[1400], final_name[64], final_dir[1280], latest[1280], line[80];
  /* The parser is the judge of what a loader will accept: a manifest whose
   * pieces leave a gap or overlap (ranks given ranges that do not tile the
   * arenas) never gets published. */
  td_ckpt_manifest check;
  ckpt_path_fmt(path, sizeof path, "%s/manifest", tmp_dir);
  td_status st = td_ckpt_manifest_parse(text, strlen(text), path, &check);
  td_ckpt_manifest_free(&check);
  if (st != TD_OK) {
    char why[900];
    td_error_copy(why, sizeof why);
    return td_error(TD_ERR_INTERNAL, "the ranks' checkpoint regions do not describe the state exactly once: %s", why);
  }
  TD_CHECK(ckpt_write_file(io, path, text, strlen(text)));
  TD_CHECK(ckpt_fsync_path(io, tmp_dir, 1));
  /* step-N, or step-N.G if step-N exists (saving a step again after a
   * resume): the old copy stays whole until `latest` has moved on. */
  snprintf(final_name, sizeof final_name, "step-%ld", t->step);
  ckpt_path_fmt(final_dir, sizeof final_dir, "%s/%s", root, final_name);
  for (long gen = 1; ckpt_path_exists(final_dir); gen++) {
    if (gen > 1000000) return td_error(TD_ERR_IO, "%s: too many copies of step %ld", root, t->step);
    snprintf(final_name, sizeof final_name, "step-%ld.%ld", t->step, gen);
    ckpt_path_fmt(final_dir, sizeof final_dir, "%s/%s", root, final_name);
  }
  ckpt_fault_point(io);
  if (rename(tmp_dir, final_dir) != 0) return td_error_errno("cannot rename %s to %s", tmp_dir, final_dir);
  TD_CHECK(ckpt_fsync_path(io, root, 1));
  ckpt_path_fmt(path, sizeof path, "%s/latest.tmp", root);
  snprintf(line, sizeof line, "%s\n", final_name);
  TD_CHECK(ckpt_write_file(io, path, line, strlen(line)));
  ckpt_path_fmt(latest, sizeof latest, "%s/latest", root);
  ckpt_fault_point(io);
  if (rename(path, latest) != 0) return td_error_errno("cannot rename %s to %s", path, latest);
  TD_CHECK(ckpt_fsync_path(io, root, 1));
  /* The new checkpoint is published: what follows only frees space. */
  TD_CHECK(ckpt_clean_root(io, root, final_name, t->step, t->cfg.keep_last));
  return ckpt_fsync_path(io, root, 1);
}

/* Every region names a known arena and lies inside it. */
static td_status check_regions(td_trainer *t, const td_ckpt_region *regions, int n_regions) {
  const td_ckpt_group grp = td_ckpt_group_of(t);
  td_ckpt_arena arenas[TD_CKPT_MAX_ARENAS];
  int n_arenas = td_ckpt_trainer_arenas(t, arenas);
  for (int i = 0; i < n_regions; i++) {
    const td_ckpt_region *r = &regions[i];
    if (r->arena < 0 || r->arena >= n_arenas || r->lo > r->hi || r->hi > arenas[r->arena].count ||
        (r->hi > r->lo && !r->data))
      return td_error(TD_ERR_INVALID_ARGUMENT, "rank %d: checkpoint region %d (arena %d, elements [%llu, %llu)) is "
                                               "outside the trainer's arenas",
                      grp.rank, i, r->arena, (unsigned long long)r->lo, (unsigned long long)r->hi);
  }
  return TD_OK;
}

td_status td_ckpt_save_regions(td_trainer *t, const char *root, const td_ckpt_region *regions, int n_regions) {
  const td_ckpt_group grp = td_ckpt_group_of(t);
  if (!t || !root || !*root) return td_error(TD_ERR_INVALID_ARGUMENT, "td_trainer_save: null trainer or empty directory");
  if (strlen(root) > 1000) return td_error(TD_ERR_INVALID_ARGUMENT, "checkpoint directory name too long: %s", root);
  save_io io = {0, grp.rank == t->ckpt_fault_rank ? t->ckpt_fault_at : 0};
  /* TANDEM_CKPT_CHUNK_BYTES: the CRC granularity of this save (a loader
   * reads whole chunks, so smaller chunks read closer to the bytes a shard
   * needs; tests use tiny ones to cross chunk edges with tiny models). */
  long chunk_env = td_env_long("TANDEM_CKPT_CHUNK_BYTES", (long)TD_CKPT_CHUNK_BYTES);
  int chunk_ok = chunk_env >= 4 && chunk_env <= (1L << 26) && chunk_env % 4 == 0;
  const uint64_t chunk = chunk_ok ? (uint64_t)chunk_env : TD_CKPT_CHUNK_BYTES;
  char tmp_dir[1280], path[1400];
  /* The token names the temporary directory (no two saves share one) and
   * proves that every rank sees the directory rank 0 created. */
  char token[40];
  memset(token, 0, sizeof token);
  snprintf(token, sizeof token, "%016llx%016llx", (unsigned long long)td_random_u64(),
           (unsigned long long)td_random_u64());

  /* Phase 1. */
  /* Local checks fail the save on every rank (agreed below), never alone. */
  td_status st = chunk_ok ? check_regions(t, regions, n_regions)
                          : td_error(TD_ERR_INVALID_ARGUMENT,
                                     "rank %d: TANDEM_CKPT_CHUNK_BYTES=%ld: must be a multiple of 4 between 4 and "
                                     "67108864 (default 1048576)",
                                     grp.rank, chunk_env);
  if (st == TD_OK && grp.rank == 0) {
    st = ckpt_mkdir_p(&io, root);
    if (st == TD_OK) st = ckpt_remove_leftovers(&io, root);
    ckpt_path_fmt(tmp_dir, sizeof tmp_dir, "%s/step-%ld.tmp-%s", root, t->step, token);
    if (st == TD_OK) {
      ckpt_fault_point(&io);
      if (mkdir(tmp_dir, 0755) != 0) st = td_error_errno("cannot create directory %s", tmp_dir);
    }
    ckpt_path_fmt(path, sizeof path, "%s/" CKPT_TOKEN_FILE, tmp_dir);
    if (st == TD_OK) st = ckpt_write_file(&io, path, token, strlen(token));
  }
  TD_CHECK(td_ckpt_agree(t, st));
  if (grp.comm && grp.world > 1) {
    st = td_broadcast(token, sizeof token, TD_U8, 0, grp.comm);
    if (st != TD_OK)
      return td_error(st, "rank %d: receiving the checkpoint token failed: %s", grp.rank, td_comm_last_error(grp.comm));
    token[sizeof token - 1] = '\0';
    ckpt_path_fmt(tmp_dir, sizeof tmp_dir, "%s/step-%ld.tmp-%s", root, t->step, token);
    ckpt_path_fmt(path, sizeof path, "%s/" CKPT_TOKEN_FILE, tmp_dir);
  }

  /* Phase 2. */
  if (grp.rank != 0) {
    char *seen = NULL;
    size_t seen_n = 0;
    if (ckpt_read_file(path, 4096, &seen, &seen_n) != TD_OK || seen_n != strlen(token) ||
        memcmp(seen, token, seen_n) != 0)
      st = td_error(TD_ERR_IO,
                    "rank %d cannot see the checkpoint directory that rank 0 created: %s is missing or different "
                    "here. The checkpoint directory (%s) must be one directory that every rank sees, on a file "
                    "system shared by all hosts (NFS, Lustre, CephFS, ...); per-host local directories are not "
                    "supported",
                    grp.rank, path, root);
    free(seen);
  }
  td_ckpt_piece *pieces = calloc((size_t)TD_MAX(n_regions, 1), sizeof *pieces);
  int n_pieces = 0;
  uint64_t file_bytes = 0;
  if (st == TD_OK && !pieces) st = td_error(TD_ERR_SYSTEM, "rank %d: out of memory for its piece table", grp.rank);
  if (st == TD_OK) {
    ckpt_path_fmt(path, sizeof path, "%s/rank-%d.bin", tmp_dir, grp.rank);
    st = write_rank_file(t, &io, path, regions, n_regions, chunk, pieces, &n_pieces, &file_bytes);
  }
  st = td_ckpt_agree(t, st);

  /* Phase 3: the tables, padded to the longest, in one in-place allgather. */
  uint64_t mine = table_words(pieces, n_pieces), words = mine;
  uint64_t *all = NULL;
  if (st == TD_OK && grp.comm && grp.world > 1) {
    st = td_allreduce(&words, &words, 1, TD_I64, TD_MAX, grp.comm);
    if (st != TD_OK)
      td_error(st, "rank %d: agreeing on the checkpoint table size failed: %s", grp.rank, td_comm_last_error(grp.comm));
  }
  if (st == TD_OK) {
    all = calloc((size_t)(words * (uint64_t)grp.world), sizeof *all);
    st = all ? TD_OK : td_error(TD_ERR_SYSTEM, "rank %d: out of memory for the checkpoint tables", grp.rank);
    /* Every rank has its buffer (or all stop) before the allgather. */
    st = td_ckpt_agree(t, st);
  }
  if (st == TD_OK) {
    table_encode(all + (uint64_t)grp.rank * words, file_bytes, pieces, n_pieces);
    if (grp.comm && grp.world > 1) {
      st = td_allgather(all + (uint64_t)grp.rank * words, all, (size_t)(words * (uint64_t)grp.world), TD_I64, grp.comm);
      if (st != TD_OK)
        td_error(st, "rank %d: gathering the checkpoint tables failed: %s", grp.rank, td_comm_last_error(grp.comm));
    }
  }
  for (int i = 0; pieces && i < n_pieces; i++) free(pieces[i].crc);
  free(pieces);
  /* Rank 0 publishes; the others wait for its verdict, so that no rank
   * returns before the checkpoint is complete. */
  if (st == TD_OK && grp.rank == 0) {
    char *text = build_manifest(t, all, words, chunk);
    st = text ? publish(t, &io, root, tmp_dir, text) : TD_ERR_SYSTEM;
    free(text);
  }
  free(all);
  return td_ckpt_agree(t, st);
}
