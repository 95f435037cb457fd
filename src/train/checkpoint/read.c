/* Reading a checkpoint directory, locally: open (find and parse the
 * manifest), read any element range of an arena from the pieces that
 * overlap it, and verify every byte.
 *
 * A range read touches only the CRC chunks that overlap the range: a chunk
 * wholly inside it is read straight into the destination and checked there;
 * a chunk that sticks out at either end goes through a one-chunk bounce
 * buffer. So a ZeRO shard of 1/N of an arena costs 1/N of the arena's bytes
 * plus at most two chunks per piece it crosses. The bounce buffer remembers
 * which verified chunk it holds, so many small ranges inside one chunk (a
 * tensor-parallel rank's rows of a row-parallel weight: one range per row)
 * read and check that chunk once, not once per range. Each file's size is checked
 * against the manifest when it is first opened, so a truncated file is
 * named as such before any read comes up short. */
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

td_status td_ckpt_open(const char *path, td_ckpt_dir *d) {
  memset(d, 0, sizeof *d);
  if (!path || !*path) return td_error(TD_ERR_INVALID_ARGUMENT, "td_ckpt_open: empty checkpoint path");
  if (strlen(path) > 1000) return td_error(TD_ERR_INVALID_ARGUMENT, "checkpoint path too long: %s", path);
  TD_CHECK(ckpt_find_step_dir(path, d->dir, sizeof d->dir));
  char file[1300], *text = NULL;
  size_t n = 0;
  ckpt_path_fmt(file, sizeof file, "%s/manifest", d->dir);
  TD_CHECK(ckpt_read_file(file, CKPT_MAX_MANIFEST, &text, &n));
  td_status st = td_ckpt_manifest_parse(text, n, file, &d->m);
  free(text);
  TD_CHECK(st);
  d->fds = malloc((size_t)(d->m.n_files ? d->m.n_files : 1) * sizeof *d->fds);
  d->bounce = td_alloc((size_t)d->m.chunk_bytes);
  if (!d->fds || !d->bounce) {
    td_ckpt_close(d);
    return td_error(TD_ERR_SYSTEM, "out of memory opening the checkpoint %s", path);
  }
  for (int f = 0; f < d->m.n_files; f++) d->fds[f] = -1;
  d->bounce_piece = -1;
  return TD_OK;
}

void td_ckpt_close(td_ckpt_dir *d) {
  if (!d) return;
  if (d->fds)
    for (int f = 0; f < d->m.n_files; f++)
      if (d->fds[f] >= 0) close(d->fds[f]);
  free(d->fds);
  td_free(d->bounce);
  td_ckpt_manifest_free(&d->m);
  memset(d, 0, sizeof *d);
}

/* The descriptor of file f, opened and size-checked on first use. */
static td_status file_fd(td_ckpt_dir *d, int f, int *fd_out) {
  if (d->fds[f] >= 0) {
    *fd_out = d->fds[f];
    return TD_OK;
  }
  char path[1400];
  ckpt_path_fmt(path, sizeof path, "%s/%s", d->dir, d->m.files[f].name);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return td_error(TD_ERR_IO, "cannot open %s: %s (the manifest lists it: the checkpoint is incomplete)", path,
                    strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    close(fd);
    return td_error(TD_ERR_IO, "cannot stat %s: %s", path, strerror(errno));
  }
  uint64_t want = d->m.files[f].bytes;
  if ((uint64_t)sb.st_size != want) {
    close(fd);
    return td_error(TD_ERR_IO, "%s is %llu bytes but the manifest says %llu: the checkpoint is %s", path,
                    (unsigned long long)sb.st_size, (unsigned long long)want,
                    (uint64_t)sb.st_size < want ? "truncated" : "corrupt (the file is longer than written)");
  }
  d->fds[f] = fd;
  *fd_out = fd;
  return TD_OK;
}

/* Read chunk c of piece p (bytes [c*chunk, ...) of the piece) into buf and
 * check its CRC. */
static td_status read_chunk(td_ckpt_dir *d, const td_ckpt_piece *p, uint64_t c, void *buf) {
  int fd;
  TD_CHECK(file_fd(d, p->file, &fd));
  uint64_t piece_bytes = (p->hi - p->lo) * 4, begin = c * d->m.chunk_bytes;
  size_t n = (size_t)TD_MIN(d->m.chunk_bytes, piece_bytes - begin);
  ssize_t got = ckpt_pread_full(fd, buf, n, p->offset + begin);
  const char *name = d->m.files[p->file].name;
  if (got < 0) return td_error(TD_ERR_IO, "cannot read %s/%s: %s", d->dir, name, strerror(errno));
  if ((size_t)got != n)
    return td_error(TD_ERR_IO, "%s/%s ended at byte %llu, inside a piece the manifest places there: the checkpoint "
                               "is truncated",
                    d->dir, name, (unsigned long long)(p->offset + begin + (uint64_t)got));
  d->bytes_read += n;
  uint32_t crc = td_crc32(0, buf, n);
  if (crc != p->crc[c])
    return td_error(TD_ERR_IO,
                    "%s/%s is corrupt: CRC-32 %08x where the manifest says %08x, in bytes [%llu, %llu) (arena %s, "
                    "elements [%llu, %llu))",
                    d->dir, name, (unsigned)crc, (unsigned)p->crc[c], (unsigned long long)(p->offset + begin),
                    (unsigned long long)(p->offset + begin + n), d->m.arenas[p->arena].name,
                    (unsigned long long)(p->lo + begin / 4), (unsigned long long)(p->lo + (begin + n) / 4));
  return TD_OK;
}

td_status td_ckpt_read(td_ckpt_dir *d, int arena, uint64_t lo, uint64_t hi, float *dst) {
  const td_ckpt_manifest *m = &d->m;
  if (arena < 0 || arena >= m->n_arenas || lo > hi || hi > m->arenas[arena].count)
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: elements [%llu, %llu) of arena %d are not in the checkpoint", d->dir,
                    (unsigned long long)lo, (unsigned long long)hi, arena);
  if (lo == hi) return TD_OK; /* nothing to read (dst may be NULL) */
  int first, end;
  td_ckpt_pieces_overlapping(m, arena, lo, hi, &first, &end);
  for (int i = first; i < end; i++) {
    const td_ckpt_piece *p = &m->pieces[i];
    /* Wanted bytes of the piece: [want_lo, want_hi). */
    uint64_t a = TD_MAX(lo, p->lo), b = TD_MIN(hi, p->hi);
    uint64_t want_lo = (a - p->lo) * 4, want_hi = (b - p->lo) * 4, piece_bytes = (p->hi - p->lo) * 4;
    for (uint64_t c = want_lo / m->chunk_bytes; c * m->chunk_bytes < want_hi; c++) {
      uint64_t cs = c * m->chunk_bytes, ce = TD_MIN(cs + m->chunk_bytes, piece_bytes);
      /* dst holds element lo at byte 0; piece byte x (>= want_lo) is element
       * p->lo + x/4, at dst byte p->lo*4 + x - lo*4 (never negative). */
      char *dst_bytes = (char *)dst;
      if (cs >= want_lo && ce <= want_hi) {
        TD_CHECK(read_chunk(d, p, c, dst_bytes + (p->lo * 4 + cs - lo * 4)));
      } else {
        if (d->bounce_piece != i || d->bounce_chunk != c) {
          d->bounce_piece = -1; /* until verified */
          TD_CHECK(read_chunk(d, p, c, d->bounce));
          d->bounce_piece = i;
          d->bounce_chunk = c;
        }
        uint64_t x = TD_MAX(cs, want_lo), y = TD_MIN(ce, want_hi);
        memcpy(dst_bytes + (p->lo * 4 + x - lo * 4), d->bounce + (x - cs), (size_t)(y - x));
      }
    }
  }
  return TD_OK;
}

td_status td_ckpt_verify(td_ckpt_dir *d, uint64_t *bytes_checked) {
  uint64_t before = d->bytes_read;
  d->bounce_piece = -1; /* the bounce buffer is scratch here */
  for (int f = 0; f < d->m.n_files; f++) {
    int fd;
    TD_CHECK(file_fd(d, f, &fd));
  }
  for (int i = 0; i < d->m.n_pieces; i++) {
    const td_ckpt_piece *p = &d->m.pieces[i];
    for (uint64_t c = 0; c < p->n_crc; c++) TD_CHECK(read_chunk(d, p, c, d->bounce));
  }
  if (bytes_checked) *bytes_checked = d->bytes_read - before;
  return TD_OK;
}
