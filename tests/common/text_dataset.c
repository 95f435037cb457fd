/* A synthetic next-byte dataset for the training tests: sample i is the
 * seq + 1 bytes of `text` at positions ((i*seq + j) * mul) mod strlen(text),
 * inputs the first seq, targets the last seq. Deterministic and independent
 * of the library, so that runs at different world sizes, stages or
 * precisions see the same samples. While *fault is non-zero every delivery
 * fails (the tests' injected data error). */
#include "check.h"

#include "base/base.h"
#include "tandem/nn.h"

typedef struct {
  const char *text;
  size_t len, mul, seq;
  const int *fault;
} text_impl;

static td_status text_get(const td_dataset *ds, size_t index, void *input, int32_t *targets) {
  const text_impl *t = ds->impl;
  if (t->fault && *t->fault) return td_error(TD_ERR_IO, "injected failure delivering sample %zu", index);
  int32_t *tok = input;
  for (size_t j = 0; j <= t->seq; j++) {
    size_t p = index * t->seq + j;
    int32_t v = (int32_t)t->text[(p * t->mul) % t->len];
    if (j < t->seq) tok[j] = v;
    if (j > 0) targets[j - 1] = v;
  }
  return TD_OK;
}

static void text_destroy(td_dataset *ds) {
  free(ds->impl);
  free(ds);
}

td_dataset *td_test_text_dataset(const char *text, size_t mul, size_t seq, size_t n_samples, const int *fault) {
  td_dataset *ds = calloc(1, sizeof *ds);
  text_impl *t = calloc(1, sizeof *t);
  if (!ds || !t) td_test_fail(__FILE__, __LINE__, "out of memory for the text dataset");
  *t = (text_impl){.text = text, .len = strlen(text), .mul = mul, .seq = seq, .fault = fault};
  *ds = (td_dataset){.n_samples = n_samples, .input_bytes = seq * sizeof(int32_t), .targets_per_sample = seq,
                     .get = text_get, .destroy = text_destroy, .impl = t};
  return ds;
}

td_model *td_test_byte_gpt(int layers, int channels, int heads, int seq) {
  td_gpt_config c = {.vocab = 256, .layers = layers, .channels = channels, .heads = heads, .seq = seq, .tied = 1};
  td_model *m = NULL;
  CHECK_OK(td_gpt_create(&c, &m));
  return m;
}
