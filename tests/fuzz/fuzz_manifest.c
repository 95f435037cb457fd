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
 * Oracle (train_impl.h's contract): an accepted manifest has format 1, a
 * world size >= 1 with exactly one shard line per rank, n_params >= 1, 1-2
 * state arenas, a model kind and optimizer, and n_tensors tensor lines
 * that each lie within n_params; a refused one owns no memory (LeakSanitizer
 * checks the rest) and leaves a message naming the file. A violation traps. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/train_impl.h"

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
    require(!m.tensors && !m.shard_bytes && !m.shard_crc && !m.shard_seen, "a refused manifest still owns memory");
    require(strstr(td_last_error(), SOURCE) != NULL, "the error message does not name the file");
  } else {
    require(m.format == 1, "accepted a format other than 1");
    require(m.world >= 1 && m.n_shards == m.world, "shard lines do not match the world size");
    for (int r = 0; r < m.world; r++) require(m.shard_seen[r], "a rank's shard line is missing");
    require(m.n_params >= 1 && m.n_params <= ((size_t)1 << 40), "n_params out of range");
    require(m.n_states >= 1 && m.n_states <= 2, "n_state_arenas out of range");
    require(m.kind[0] && memchr(m.kind, '\0', sizeof m.kind), "model_kind empty or unterminated");
    require(m.optimizer[0] && memchr(m.optimizer, '\0', sizeof m.optimizer), "optimizer empty or unterminated");
    require(memchr(m.model_config, '\0', sizeof m.model_config) != NULL, "model_config unterminated");
    require(m.n_tensors >= 0 && m.n_tensor_lines == m.n_tensors, "tensor lines do not match n_tensors");
    for (int i = 0; i < m.n_tensors; i++) {
      const td_ckpt_tensor *t = &m.tensors[i];
      require(t->name && t->name[0], "a tensor without a name");
      require(t->offset <= m.n_params && t->count <= m.n_params - t->offset, "a tensor beyond n_params");
    }
    td_ckpt_manifest_free(&m);
  }
  free(exact);
  return 0;
}
