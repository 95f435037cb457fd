/* td_ckpt_consolidate: every parameter of a checkpoint, whatever world size
 * and stage wrote it, into one fp32 safetensors file (what DeepSpeed's
 * zero_to_fp32.py does for ZeRO checkpoints).
 *
 * safetensors: an 8-byte little-endian header length, a JSON header
 * {"__metadata__": {...}, "NAME": {"dtype": "F32", "shape": [COUNT],
 * "data_offsets": [BEGIN, END]}, ...} padded with spaces so that the data
 * starts 8-byte aligned, then the tensors back to back. One tensor per
 * entry of the model's tensor table (shape [count]: the manifest records
 * counts, not shapes), or one "params" tensor when the table is empty. The
 * parameters are read through td_ckpt_read (CRC-checked) in slices of 16
 * MiB, so memory stays bounded; the file is written to OUT.tmp, fsync'd and
 * renamed, so OUT is never half-written. */
#include "train/checkpoint/ckpt.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "train/checkpoint/io.h"

/* Append s to the JSON header as a string body (quotes, backslashes and
 * control characters escaped). */
static void json_append_string(td_buf *h, const char *s) {
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') td_buf_printf(h, "\\%c", c);
    else if (c < 0x20) td_buf_printf(h, "\\u%04x", c);
    else td_buf_append(h, s, 1);
  }
}

td_status td_ckpt_consolidate(td_ckpt_dir *d, const char *out_path) {
  const td_ckpt_manifest *m = &d->m;
  /* One entry per tensor of the table; without a table, the whole arena. */
  td_ckpt_tensor whole = {0, m->n_params, (char *)"params"};
  const td_ckpt_tensor *tensors = m->n_tensors > 0 ? m->tensors : &whole;
  int n_tensors = m->n_tensors > 0 ? m->n_tensors : 1;
  for (int i = 0; i < n_tensors; i++)
    for (int j = 0; j < i; j++)
      if (strcmp(tensors[i].name, tensors[j].name) == 0)
        return td_error(TD_ERR_IO, "%s: two tensors are named \"%s\": a safetensors file needs unique names", d->dir,
                        tensors[i].name);
  td_buf h = {0};
  td_buf_printf(&h, "{\"__metadata__\":{\"format\":\"pt\",\"source\":\"tandem-checkpoint\",\"step\":\"%ld\","
                    "\"model_kind\":\"", m->step);
  json_append_string(&h, m->kind);
  td_buf_printf(&h, "\",\"model_config\":\"");
  json_append_string(&h, m->model_config);
  td_buf_printf(&h, "\"}");
  uint64_t data_off = 0;
  for (int i = 0; i < n_tensors; i++) {
    td_buf_printf(&h, ",\"");
    json_append_string(&h, tensors[i].name);
    td_buf_printf(&h, "\":{\"dtype\":\"F32\",\"shape\":[%zu],\"data_offsets\":[%llu,%llu]}", tensors[i].count,
                  (unsigned long long)data_off, (unsigned long long)(data_off + tensors[i].count * 4));
    data_off += tensors[i].count * 4;
  }
  td_buf_printf(&h, "}");
  /* The data starts 8-byte aligned: pad the header with spaces. */
  while (!h.failed && (8 + h.len) % 8 != 0) td_buf_append(&h, " ", 1);
  size_t n = 0;
  char *header = td_buf_take(&h, &n);
  if (!header) return td_error(TD_ERR_SYSTEM, "out of memory for the safetensors header");
  char tmp[1100];
  if (ckpt_path_fmt(tmp, sizeof tmp, "%s.tmp", out_path) != 0) {
    free(header);
    return td_error(TD_ERR_INVALID_ARGUMENT, "output path too long: %s", out_path);
  }
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    free(header);
    return td_error_errno("cannot create %s", tmp);
  }
  unsigned char len_le[8];
  td_put_le64(len_le, n);
  td_status st = TD_OK;
  if (ckpt_write_full(fd, len_le, 8) != 0 || ckpt_write_full(fd, header, n) != 0) st = td_error_errno("cannot write %s", tmp);
  free(header);
  const size_t slice = (size_t)1 << 22; /* floats per read */
  float *buf = st == TD_OK ? td_alloc(slice * sizeof(float)) : NULL;
  if (st == TD_OK && !buf) st = td_error(TD_ERR_SYSTEM, "out of memory consolidating %s", d->dir);
  for (int i = 0; i < n_tensors && st == TD_OK; i++)
    for (size_t k = 0; k < tensors[i].count && st == TD_OK; k += slice) {
      size_t len = TD_MIN(slice, tensors[i].count - k);
      uint64_t lo = tensors[i].offset + k;
      st = td_ckpt_read(d, TD_CKPT_ARENA_PARAMS, lo, lo + len, buf);
      if (st == TD_OK && ckpt_write_full(fd, buf, len * sizeof(float)) != 0) st = td_error_errno("cannot write %s", tmp);
    }
  td_free(buf);
  if (st == TD_OK && fsync(fd) != 0) st = td_error_errno("cannot fsync %s", tmp);
  if (close(fd) != 0 && st == TD_OK) st = td_error_errno("cannot close %s", tmp);
  if (st == TD_OK && rename(tmp, out_path) != 0) st = td_error_errno("cannot rename %s to %s", tmp, out_path);
  if (st != TD_OK) unlink(tmp);
  return st;
}
