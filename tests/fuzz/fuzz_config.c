/* libFuzzer harness for the JSON training config reader
 * (td_train_config_parse_json_buffer, src/train/config.c), followed by what a
 * trainer does with a config it accepted: td_train_config_resolve for a few
 * world sizes and the learning-rate schedule at a few steps.
 *
 * Besides the sanitizers, it checks the contracts train.h states:
 * - a refused config leaves the caller's struct untouched and leaves a
 *   message naming the source in td_last_error();
 * - a resolved config has train_batch_size == micro x accum x world;
 * - the learning rate of a resolved schedule is finite and within
 *   [0, peak lr] at every step.
 * A violation traps, so libFuzzer saves the input like any crash. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tandem/tandem.h"

#define SOURCE "fuzz.json"

static void require(int ok, const char *what, const char *text) {
  if (ok) return;
  fprintf(stderr, "fuzz_config: contract broken: %s\nconfig:\n%s\nlast error: %s\n", what, text, td_last_error());
  __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* An exact-size copy, not NUL-terminated (the buffer entry point's
   * promise): ASan reports any read past it. The C-string copy is only for
   * messages. */
  char *exact = malloc(size ? size : 1), *text = malloc(size + 1);
  if (!exact || !text) {
    free(exact);
    free(text);
    return 0;
  }
  memcpy(exact, data, size);
  memcpy(text, data, size);
  text[size] = '\0';

  td_train_config cfg, before;
  td_train_config_defaults(&cfg);
  before = cfg;
  td_status st = td_train_config_parse_json_buffer(exact, size, SOURCE, &cfg);
  free(exact);
  if (st != TD_OK) {
    require(memcmp(&cfg, &before, sizeof cfg) == 0, "a refused config changed the caller's struct", text);
    require(strstr(td_last_error(), SOURCE) != NULL, "the error message does not name the source", text);
    free(text);
    return 0;
  }

  static const int worlds[] = {1, 2, 3, 8, 1000};
  for (size_t w = 0; w < sizeof worlds / sizeof worlds[0]; w++) {
    td_train_config r = cfg;
    if (td_train_config_resolve(&r, worlds[w]) != TD_OK) continue;
    require(r.micro_batch > 0 && r.grad_accum > 0, "resolved batch sizes are not positive", text);
    require((__int128)r.train_batch_size == (__int128)r.micro_batch * r.grad_accum * worlds[w],
            "resolved train_batch_size != micro x accum x world", text);
    double peak = r.optimizer.lr;
    long total = r.scheduler.total_steps ? r.scheduler.total_steps : r.steps;
    const long steps[] = {0, 1, r.scheduler.warmup_steps - 1, r.scheduler.warmup_steps, total / 2, total - 1, total,
                          total + 1, 1L << 40};
    for (size_t s = 0; s < sizeof steps / sizeof steps[0]; s++) {
      if (steps[s] < 0) continue;
      float lr = td_train_lr_at(&r, steps[s]);
      require(isfinite(lr) && lr >= 0 && lr <= peak * (1 + 1e-6), "learning rate outside [0, peak]", text);
    }
  }
  free(text);
  return 0;
}
