/* Checkpoint cost of tensor parallelism's many pieces (bench/ckpt_tp.sh):
 * a GPT-2 124M-shaped model (vocab 50257, 12 layers, 768 channels, 12
 * heads, seq 1024; AdamW: parameters, m and v) saved and loaded, timed.
 *
 *   ckpt_tp_bench save DIR TP   (TP ranks) td_trainer_save of the initial state
 *   ckpt_tp_bench load DIR TP   (TP ranks) td_trainer_resume of DIR
 * TP 1 is the unsplit td_gpt_create model. Prints one line per operation:
 *   OP tp=TP seconds=S
 * Public API only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tandem/tandem.h"

static td_status zero_get(const td_dataset *ds, size_t index, void *input, int32_t *targets) {
  (void)ds, (void)index;
  memset(input, 0, 1024 * sizeof(int32_t));
  memset(targets, 0, 1024 * sizeof(int32_t));
  return TD_OK;
}
static void plain_destroy(td_dataset *ds) { free(ds); }

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define DIE(what, st)                                                                   \
  do {                                                                                  \
    fprintf(stderr, "ckpt_tp_bench: %s: %s: %s\n", what, td_status_str(st), td_last_error()); \
    return 1;                                                                           \
  } while (0)

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: ckpt_tp_bench save|load DIR TP\n");
    return 2;
  }
  const int save = strcmp(argv[1], "save") == 0, tp = atoi(argv[3]);
  td_comm *world = NULL;
  td_status st = td_comm_init(&world);
  if (st != TD_OK) DIE("td_comm_init", st);
  td_gpt_config cfg = {.vocab = 50257, .layers = 12, .channels = 768, .heads = 12, .seq = 1024, .tied = 1};
  td_grid *grid = NULL;
  td_model *model = NULL;
  td_comm *train_comm = world;
  if (tp > 1) {
    if ((st = td_grid_create(world, tp, 1, &grid)) != TD_OK) DIE("td_grid_create", st);
    if ((st = td_gpt_tp_create(&cfg, grid, &model)) != TD_OK) DIE("td_gpt_tp_create", st);
    train_comm = td_grid_comm(grid, TD_GRID_DATA);
  } else if ((st = td_gpt_create(&cfg, &model)) != TD_OK) {
    DIE("td_gpt_create", st);
  }
  td_dataset *ds = calloc(1, sizeof *ds);
  ds->n_samples = 64;
  ds->input_bytes = 1024 * sizeof(int32_t);
  ds->targets_per_sample = 1024;
  ds->get = zero_get;
  ds->destroy = plain_destroy;
  td_train_config c;
  td_train_config_defaults(&c);
  c.micro_batch = 1;
  c.grad_accum = 1;
  c.optimizer.kind = TD_OPTIMIZER_ADAMW;
  c.threads = 1;
  c.tensor_parallel = tp;
  td_trainer *t = NULL;
  if ((st = td_trainer_create(&c, model, ds, train_comm, &t)) != TD_OK) DIE("td_trainer_create", st);
  if (grid && (st = td_trainer_set_grid(t, grid)) != TD_OK) DIE("td_trainer_set_grid", st);
  if ((st = td_barrier(world)) != TD_OK) DIE("td_barrier", st);
  double t0 = now();
  st = save ? td_trainer_save(t, argv[2]) : td_trainer_resume(t, argv[2]);
  if (st != TD_OK) DIE(argv[1], st);
  double t1 = now();
  if (td_comm_rank(world) == 0) printf("%s tp=%d seconds=%.3f\n", argv[1], tp, t1 - t0);
  td_trainer_destroy(t);
  td_model_destroy(model);
  td_dataset_destroy(ds);
  td_grid_destroy(grid);
  td_comm_finalize(world);
  td_comm_destroy(world);
  return 0;
}
