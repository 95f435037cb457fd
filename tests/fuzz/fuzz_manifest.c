/* libFuzzer harness for the checkpoint manifest reader
 * (td_ckpt_manifest_parse, src/train/checkpoint.c): the text file that
 * --resume trusts to size and place every shard.
 *
 * The manifest ends with "manifest_crc X", a CRC-32 of everything before
 * it, which random mutations would almost never keep right. So byte 0
 * chooses: odd, the rest of the input is the manifest body and the harness
 * appends the correct closing line (so the fuzzer explores the line
 * parser); even, the rest is passed as it is (the checksum and framing
 * checks). The parser gets an exact-size copy, not NUL-terminated, so an
 * over-read is an ASan report.
 *
 * Oracle (checkpoint/ckpt.h's contract): an accepted manifest has format
 * 2, a world size >= 1, n_params >= 1, 1-2 state arenas plus the parameter
 * arena of n_params elements, a model kind and optimizer, n_tensors tensor
 * lines within n_params, and pieces that (checked here independently) tile
 * every arena exactly, lie inside their files and carry one CRC per chunk;
 * formatting it and parsing the text again gives the same pieces. A refused
 * one owns no memory (LeakSanitizer checks the rest) and leaves a message
 * naming the file. A violation traps. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/checkpoint/ckpt.h"
#include "train/core/core.h"

#define SOURCE "fuzz/manifest"

static void require(int ok, const char *what) {
  if (ok) return;
  fprintf(stderr, "fuzz_manifest: contract broken: %s (last error: %s)\n", what, td_last_error());
  __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  bool fix_crc = data[0] & 1;
  const uint8_t *body = data + 1;
  size_t body_len = size - 1, len = body_len;
  char *buf = malloc(body_len + 32);
  if (!buf) return 0;
  memcpy(buf, body, body_len);
  if (fix_crc) {
    char line[32];
    int n = snprintf(line, sizeof line, "manifest_crc %08x\n", (unsigned)td_crc32(0, body, body_len));
    memcpy(buf + body_len, line, (size_t)n);
    len += (size_t)n;
  }
  char *exact = malloc(len ? len : 1); /* exactly len bytes: ASan sees any over-read */
  if (!exact) {
    free(buf);
    return 0;
  }
  memcpy(exact, buf, len);
  free(buf);

  td_ckpt_manifest m;
  td_status st = td_ckpt_manifest_parse(exact, len, SOURCE, &m);
  if (st != TD_OK) {
    require(!m.tensors && !m.files && !m.pieces, "a refused manifest still owns memory");
    require(strstr(td_last_error(), SOURCE) != NULL, "the error message does not name the file");
  } else {
    require(m.format == TD_CKPT_FORMAT, "accepted a format other than 2");
    require(m.world >= 1, "world size out of range");
    require(m.n_params >= 1 && m.n_params <= ((size_t)1 << 40), "n_params out of range");
    require(m.n_states >= 1 && m.n_states <= 2 && m.n_arenas == 1 + m.n_states, "arena count out of range");
    require(m.arenas[0].count == m.n_params, "the parameter arena is not n_params long");
    require(m.chunk_bytes >= 4 && m.chunk_bytes % 4 == 0, "chunk_bytes not a multiple of 4");
    require(m.kind[0] && memchr(m.kind, '\0', sizeof m.kind), "model_kind empty or unterminated");
    require(m.optimizer[0] && memchr(m.optimizer, '\0', sizeof m.optimizer), "optimizer empty or unterminated");
    require(memchr(m.model_config, '\0', sizeof m.model_config) != NULL, "model_config unterminated");
    require(m.n_tensors >= 0 && m.n_tensor_lines == m.n_tensors, "tensor lines do not match n_tensors");
    for (int i = 0; i < m.n_tensors; i++) {
      const td_ckpt_tensor *t = &m.tensors[i];
      require(t->name && t->name[0], "a tensor without a name");
      require(t->offset <= m.n_params && t->count <= m.n_params - t->offset, "a tensor beyond n_params");
    }
    require(m.n_file_lines == m.n_files, "file lines do not match n_files");
    uint64_t covered[TD_CKPT_MAX_ARENAS] = {0};
    for (int i = 0; i < m.n_pieces; i++) {
      const td_ckpt_piece *p = &m.pieces[i];
      require(p->arena >= 0 && p->arena < m.n_arenas && p->file >= 0 && p->file < m.n_files, "piece index");
      require(p->lo < p->hi && p->hi <= m.arenas[p->arena].count, "a piece outside its arena");
      require(p->n_crc == ((p->hi - p->lo) * 4 + m.chunk_bytes - 1) / m.chunk_bytes, "CRC count");
      require(p->offset + (p->hi - p->lo) * 4 <= m.files[p->file].bytes, "a piece beyond its file");
      require(i == 0 || m.pieces[i - 1].arena < p->arena || m.pieces[i - 1].hi == p->lo, "arena not tiled in order");
      covered[p->arena] += p->hi - p->lo;
    }
    for (int a = 0; a < m.n_arenas; a++) require(covered[a] == m.arenas[a].count, "an arena not covered once");
    char *again = td_ckpt_manifest_format(&m);
    if (again) {
      td_ckpt_manifest m2;
      require(td_ckpt_manifest_parse(again, strlen(again), SOURCE, &m2) == TD_OK, "its own text does not parse");
      require(m2.n_pieces == m.n_pieces && m2.step == m.step && m2.consumed == m.consumed, "round trip differs");
      for (int i = 0; i < m.n_pieces; i++)
        require(m2.pieces[i].lo == m.pieces[i].lo && m2.pieces[i].offset == m.pieces[i].offset &&
                    memcmp(m2.pieces[i].crc, m.pieces[i].crc, m.pieces[i].n_crc * sizeof(uint32_t)) == 0,
                "round trip changes a piece");
      td_ckpt_manifest_free(&m2);
      free(again);
    }
    td_ckpt_manifest_free(&m);
  }
  free(exact);
  return 0;
}
