/* Checkpoints that reshard: the internal API of src/train/checkpoint/.
 *
 * ---- The model ----
 * The training state is a few flat ARENAS of f32 elements, each with an id
 * (TD_CKPT_ARENA_*): the parameters, then the optimizer states (SGD's
 * momentum; AdamW's m and v). A checkpoint stores every element of every
 * arena exactly once, cut into PIECES: a piece is the element range
 * [lo, hi) of one arena, stored at some byte offset of one data file, with a
 * CRC-32 per chunk of `chunk_bytes` bytes. Nothing in the format depends on
 * the world size or the ZeRO stage that wrote it: those are recorded (for
 * `tandem-ckpt info`) but a loader only asks "give me elements [lo, hi) of
 * arena a" and gets them from whichever pieces overlap the range.
 *
 * ---- The API the trainer calls (one call per save / load) ----
 *
 *   td_ckpt_region r = {arena, data, lo, hi};   element lo of the arena is data[0]
 *
 *   td_ckpt_save_regions(t, root, regions, n)    collective. Each rank passes
 *       the ranges IT WRITES; together the ranks' ranges must tile every
 *       arena (the save checks that and fails on every rank otherwise).
 *       Rank r writes its regions into ROOT/step-N/rank-r.bin, in parallel
 *       with the others; rank 0 gathers the piece tables and publishes the
 *       manifest. Crash-safe (see save.c).
 *   td_ckpt_load_regions(t, path, regions, n, &manifest)   collective. Each
 *       rank passes the ranges IT NEEDS (any ranges, any number); they are
 *       filled from the overlapping pieces, reading only the chunks that
 *       overlap them and verifying each chunk's CRC. All ranks succeed or all
 *       fail; the manifest (step, sampler position, seed ...) comes back.
 *
 * What the trainer passes (checkpoint.c, the one place that knows the
 * trainer's memory): with `held` = the range of an arena this rank keeps in
 * memory (the whole arena at ZeRO stage 0; td_shard_range(count, world,
 * rank) for the sharded arenas at stages >= 1),
 *     save:  held ∩ td_shard_range(count, world, rank)   (each element once,
 *            every rank writes 1/world of the checkpoint: parallel saves)
 *     load:  held                                         (whole arena at
 *            stage 0, the shard at stages >= 1)
 * Any stage's buffers plug in as (arena id, pointer, [lo, hi)) with no
 * format change.
 *
 * ---- Layout of ROOT ----
 *   step-N/ (or step-N.G for a re-save of step N)
 *     rank-R.bin   raw little-endian f32 pieces, back to back
 *     manifest     text, one "key value" per line (format_manifest below),
 *                  sealed by a CRC-32 of everything before its last line
 *     visible      the save's random token (the shared-directory check)
 *   latest         the name of the checkpoint to resume from
 *
 * Lower layers, for the tool and tests: td_ckpt_open (find + parse the
 * manifest of ROOT or of one step directory), td_ckpt_read (one range of an
 * arena, CRC-checked), td_ckpt_verify (every byte of every file),
 * td_ckpt_consolidate (all parameters into one safetensors file). */
#ifndef TD_TRAIN_CKPT_H
#define TD_TRAIN_CKPT_H

#include <stdint.h>

#include "base/base.h"
#include "tandem/train.h"

#define TD_CKPT_FORMAT 2
#define TD_CKPT_MAGIC "tandem-checkpoint"
#define TD_CKPT_MAX_ARENAS 8
#define TD_CKPT_CHUNK_BYTES ((uint64_t)1 << 20) /* CRC granularity of the files this Tandem writes */

/* Arena ids used by the trainer: parameters, then optimizer state s at
 * TD_CKPT_ARENA_STATE0 + s. */
enum { TD_CKPT_ARENA_PARAMS = 0, TD_CKPT_ARENA_STATE0 = 1 };

typedef struct td_ckpt_region {
  int arena;      /* arena id */
  float *data;    /* element `lo` of the arena is data[0]; (hi - lo) elements */
  uint64_t lo, hi;
} td_ckpt_region;

/* ---- the manifest ---- */
typedef struct td_ckpt_tensor {
  size_t offset, count; /* floats; offset + count <= n_params */
  char *name;
} td_ckpt_tensor;

typedef struct td_ckpt_arena {
  char name[32];  /* "params", "adamw.m", "adamw.v", "sgd.momentum" */
  uint64_t count; /* elements (f32) */
} td_ckpt_arena;

typedef struct td_ckpt_file {
  char name[64]; /* a plain file name in the step directory */
  uint64_t bytes;
} td_ckpt_file;

typedef struct td_ckpt_piece {
  int file, arena;
  uint64_t lo, hi;  /* elements of the arena */
  uint64_t offset;  /* byte offset in the file */
  uint32_t *crc;    /* (n_crc) one per chunk_bytes of the piece's bytes */
  uint64_t n_crc;
} td_ckpt_piece;

typedef struct td_ckpt_manifest {
  int format, world, zero_stage;
  long step;
  unsigned long long consumed, seed, dataset_samples, train_batch_size;
  char kind[64], optimizer[16];
  char model_config[512]; /* "" for models that do not describe their shape */
  size_t n_params;        /* 1 .. 2^40 */
  int n_states;           /* optimizer state arenas, 1 .. 2 */
  int n_tensors, n_tensor_lines;
  td_ckpt_tensor *tensors; /* (n_tensors) */
  uint64_t chunk_bytes;    /* a multiple of 4 */
  int n_arenas;
  td_ckpt_arena arenas[TD_CKPT_MAX_ARENAS];
  int n_files, n_file_lines;
  td_ckpt_file *files; /* (n_files) */
  int n_pieces;
  td_ckpt_piece *pieces; /* (n_pieces) sorted by (arena, lo) after parsing */
  /* fp16's loss scaler (src/train/precision/; optional line "loss_scaler
   * SCALE ITER LAST_OVERFLOW HYSTERESIS_LEFT SKIPPED") */
  int has_scaler;
  double scaler_scale;
  long scaler_iter, scaler_last_overflow, scaler_skipped;
  int scaler_hysteresis_left;
} td_ckpt_manifest;

/* Parse a manifest from `len` bytes at `data` (need not be NUL-terminated;
 * no file I/O: a fuzzer calls it directly). Checks the closing CRC, every
 * number's range, duplicate keys, required lines, file names, and that the
 * pieces of each arena tile it exactly (no gap, no overlap), lie inside
 * their files without overlapping, and carry one CRC per chunk. A format-1
 * manifest (Tandem before resharding checkpoints) is refused saying so.
 * `source` names the file in messages. On success *m owns memory
 * (td_ckpt_manifest_free); on failure TD_ERR_IO (or TD_ERR_SYSTEM) and *m
 * holds nothing. */
td_status td_ckpt_manifest_parse(const char *data, size_t len, const char *source, td_ckpt_manifest *m);
/* The text of a manifest (malloc'd, NUL-terminated, sealed), or NULL when
 * out of memory. Pieces are written in their array order. */
char *td_ckpt_manifest_format(const td_ckpt_manifest *m);
void td_ckpt_manifest_free(td_ckpt_manifest *m); /* accepts NULL and a zeroed manifest */
/* Pieces of `arena` overlapping [lo, hi): their index range [*first, *end)
 * in m->pieces (sorted). */
void td_ckpt_pieces_overlapping(const td_ckpt_manifest *m, int arena, uint64_t lo, uint64_t hi, int *first, int *end);

/* ---- reading a checkpoint directory (local, not collective) ---- */
typedef struct td_ckpt_dir {
  char dir[1280]; /* the step directory */
  td_ckpt_manifest m;
  uint64_t bytes_read; /* data bytes read by td_ckpt_read (for tests and benchmarks) */
  int *fds;            /* (m.n_files) opened on first use, size-checked; -1 before */
  unsigned char *bounce; /* (m.chunk_bytes) for chunks only partly inside a range */
  int bounce_piece;      /* the verified chunk bounce holds: piece index (-1: none) and chunk */
  uint64_t bounce_chunk;
} td_ckpt_dir;

/* `path` is ROOT (its `latest` is followed) or a step directory. Reads and
 * parses the manifest. On failure *d holds nothing. */
td_status td_ckpt_open(const char *path, td_ckpt_dir *d);
void td_ckpt_close(td_ckpt_dir *d); /* accepts a zeroed one */
/* Elements [lo, hi) of `arena` into dst, reading only the chunks that
 * overlap the range and checking their CRCs; a short or corrupt file is
 * TD_ERR_IO naming it. */
td_status td_ckpt_read(td_ckpt_dir *d, int arena, uint64_t lo, uint64_t hi, float *dst);
/* Every file: its size, and every chunk's CRC. bytes_checked may be NULL. */
td_status td_ckpt_verify(td_ckpt_dir *d, uint64_t *bytes_checked);
/* All parameters as one fp32 safetensors file at out_path (one tensor per
 * entry of the tensor table, shape [count], or "params" when the table is
 * empty), written to out_path.tmp and renamed. */
td_status td_ckpt_consolidate(td_ckpt_dir *d, const char *out_path);
/* Arena id by name ("params", "adamw.m", ...), or -1. */
int td_ckpt_arena_id(const td_ckpt_manifest *m, const char *name);

/* The arena table of this trainer's state (names, element counts: whole
 * arenas, whatever this rank holds); returns the number of arenas
 * (manifest.c). */
int td_ckpt_trainer_arenas(const td_trainer *t, td_ckpt_arena *out);

/* Who saves and loads together, and which model the checkpoint records:
 * the trainer's ranks and model, or under model parallelism
 * (td_trainer_set_grid) the grid's whole world and the unsplit model, whose
 * coordinates every region is in. Filled by checkpoint.c. */
typedef struct td_ckpt_group {
  td_comm *comm; /* NULL on one rank */
  int rank, world;
  int32_t *agree_flags; /* (world) td_agree_over's table */
  const td_model *model; /* kind, config, tensor table as recorded */
  size_t n_params;       /* elements of each arena */
} td_ckpt_group;
td_ckpt_group td_ckpt_group_of(const td_trainer *t);
/* td_agree_over the group's ranks. Collective over the group. */
td_status td_ckpt_agree(const td_trainer *t, td_status local);

/* ---- the collective entry points the trainer uses ---- */
td_status td_ckpt_save_regions(td_trainer *t, const char *root, const td_ckpt_region *regions, int n_regions);
/* On success *m is the checkpoint's manifest (td_ckpt_manifest_free). The
 * regions' memory is written only by this call, and may hold partial data on
 * failure: pass staging buffers if the caller must stay unchanged. */
td_status td_ckpt_load_regions(td_trainer *t, const char *path, const td_ckpt_region *regions, int n_regions,
                               td_ckpt_manifest *m);

#endif
