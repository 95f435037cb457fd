/* The whole buffers' commits in files (src/elastic/state.c, commit_file.c)
 * on real processes, under the public API:
 *
 *   tandemrun --min-np 1 --max-np N -np N --max-restarts 0 test_el_whole FLOATS
 *
 * Every rank registers a float buffer of FLOATS elements and a step
 * counter (td_elastic_register: whole buffers, as ZeRO stage 0's
 * parameters and Adam state). Step s writes value(x, s), a closed form,
 * into every element and commits. The highest rank of epoch 1 kills itself
 * (SIGKILL) right after commit KILL_AT; the survivors notice at their next
 * commit, whose step they completed. Before leaving an epoch that failed,
 * train_fn scribbles over the buffer, so that only a commit file can give
 * the values back. Checked against the closed form, never the library's
 * own copies:
 *  - after every membership change (reset_fn) the buffer holds
 *    value(x, step) for the restored step, which is KILL_AT or one more
 *    (the survivors' own newer commit), never a scribbled element;
 *  - the copies take no memory (td_elastic_copy_bytes 0: nothing sharded)
 *    and their files hold two commits of every byte registered
 *    (td_elastic_copy_disk_bytes = 2 x (4 FLOATS + 8));
 *  - the job ends at STEPS on the survivors with the last step's values;
 *  - a new buffer registered after the first commit is refused, naming
 *    td_elastic_run. */
#include <tandem/elastic.h>

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/check.h"

enum { KILL_AT = 3, STEPS = 6 };

typedef struct {
  float *buf;
  size_t n;
  int64_t step;
  int resets_checked;
} job;

static float value(size_t x, int64_t s) { return (float)(x % 65521) * 0.5f + (float)s * 1024.0f; }

static size_t bad_elements(const job *j) {
  size_t bad = 0;
  for (size_t x = 0; x < j->n; x++) bad += j->buf[x] != value(x, j->step);
  return bad;
}

static td_status train(void *ctx, td_elastic *e) {
  job *j = ctx;
  while (j->step < STEPS) {
    j->step++;
    for (size_t x = 0; x < j->n; x++) j->buf[x] = value(x, j->step);
    td_status st = td_elastic_commit(e);
    if (td_elastic_epoch(e) == 1 && j->step == KILL_AT && td_elastic_rank(e) == td_elastic_size(e) - 1 &&
        td_elastic_size(e) > 1)
      raise(SIGKILL); /* right after the commit: its peers hold it */
    if (st != TD_OK) {
      for (size_t x = 0; x < j->n; x++) j->buf[x] = -1.0f; /* only a commit file can undo this */
      j->step = -7;
      return st;
    }
  }
  return TD_OK;
}

static td_status reset(void *ctx, td_comm *comm, int world) {
  job *j = ctx;
  if (j->step == 0) return TD_OK; /* the start: nothing committed but the initial state */
  CHECK(j->step == KILL_AT || j->step == KILL_AT + 1);
  CHECK(bad_elements(j) == 0);
  j->resets_checked++;
  return TD_OK;
}

int main(int argc, char **argv) {
  size_t n = argc > 1 ? strtoul(argv[1], NULL, 10) : 1000;
  job j = {.n = n};
  j.buf = calloc(n ? n : 1, sizeof *j.buf);
  CHECK(j.buf != NULL);
  for (size_t x = 0; x < n; x++) j.buf[x] = value(x, 0);
  td_elastic *e = NULL;
  CHECK_OK(td_elastic_create(NULL, &e));
  int start_world = td_elastic_size(e);
  CHECK_OK(td_elastic_register(e, "buf", j.buf, n * sizeof *j.buf));
  CHECK_OK(td_elastic_register(e, "step", &j.step, sizeof j.step));
  CHECK_OK(td_elastic_run(e, train, reset, &j));
  CHECK(j.step == STEPS);
  CHECK(bad_elements(&j) == 0);
  CHECK(td_elastic_copy_bytes(e) == 0);
  CHECK(td_elastic_copy_disk_bytes(e) == 2 * (n * sizeof(float) + sizeof(int64_t)));
  if (start_world > 1) {
    CHECK(td_elastic_faults(e) == 1);
    CHECK(j.resets_checked == 1);
  }
  int64_t late = 0;
  CHECK_MSG(td_elastic_register(e, "late", &late, sizeof late), TD_ERR_INVALID_USAGE, "td_elastic_run");
  printf("el whole: rank %d of %d ok (%zu floats, started at %d ranks, %d membership changes)\n", td_elastic_rank(e),
         td_elastic_size(e), n, start_world, td_elastic_resets(e));
  td_comm_finalize(td_elastic_comm(e));
  td_elastic_destroy(e);
  free(j.buf);
  return 0;
}
