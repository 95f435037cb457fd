/* The process grid (src/parallel/grid.c).
 *
 *   test_grid layout            pure: every layout of worlds 1..24 against
 *                               nested loops in Megatron's order (data
 *                               slowest, tensor fastest), and the refusals of
 *                               layouts and GPT shapes with their advice.
 *   test_grid ranks TP PP       under tandemrun -np N: the grid's sizes,
 *                               coordinates and pipeline neighbours against
 *                               closed forms, and an allreduce along every
 *                               axis whose sum of world ranks is checked
 *                               against the group's members.
 *   test_grid refused TP PP     under tandemrun -np N: a layout that does not
 *                               divide the world fails on every rank with the
 *                               advice, no hang, and the world still works. */
#include <stdlib.h>
#include <string.h>

#include "../common/check.h"

static void expect_refusal(td_status st, const char *needle) {
  CHECK_EQ_INT(st, TD_ERR_INVALID_ARGUMENT);
  if (!strstr(td_last_error(), needle))
    td_test_fail(__FILE__, __LINE__, "message \"%s\" lacks \"%s\"", td_last_error(), needle);
}

static void layout(void) {
  for (int world = 1; world <= 24; world++)
    for (int tp = 1; tp <= world; tp++)
      for (int pp = 1; pp <= world; pp++) {
        if (world % (tp * pp) != 0) {
          CHECK_EQ_INT(td_grid_check(world, tp, pp), TD_ERR_INVALID_ARGUMENT);
          continue;
        }
        CHECK_OK(td_grid_check(world, tp, pp));
        int dp = world / (tp * pp), rank = 0;
        for (int d = 0; d < dp; d++)
          for (int p = 0; p < pp; p++)
            for (int t = 0; t < tp; t++, rank++) {
              td_grid_coords c = td_grid_coords_of(world, tp, pp, rank);
              CHECK_EQ_INT(c.data, d);
              CHECK_EQ_INT(c.pipeline, p);
              CHECK_EQ_INT(c.tensor, t);
              CHECK_EQ_INT(td_grid_rank_of(world, tp, pp, (td_grid_coords){d, p, t}), rank);
            }
        CHECK_EQ_INT(rank, world);
      }
  /* refusals say what would work */
  expect_refusal(td_grid_check(4, 3, 1), "use tensor-parallel 1, 2 or 4");
  expect_refusal(td_grid_check(6, 4, 1), "use tensor-parallel 1, 2, 3 or 6");
  expect_refusal(td_grid_check(8, 2, 3), "with tensor-parallel 2 use pipeline-parallel 1, 2 or 4");
  expect_refusal(td_grid_check(8, 2, 3), "or run a multiple of 6 ranks");
  expect_refusal(td_grid_check(4, 0, 1), "must both be at least 1");
  expect_refusal(td_grid_check(0, 1, 1), "at least one rank");

  td_gpt_config gpt = {.vocab = 257, .layers = 6, .channels = 48, .heads = 6, .seq = 16};
  CHECK_OK(td_grid_check_gpt(&gpt, 1, 1));
  CHECK_OK(td_grid_check_gpt(&gpt, 2, 3));
  CHECK_OK(td_grid_check_gpt(&gpt, 3, 2)); /* an odd vocabulary splits unevenly: allowed */
  CHECK_OK(td_grid_check_gpt(&gpt, 6, 6));
  expect_refusal(td_grid_check_gpt(&gpt, 4, 1), "use tensor-parallel 1, 2, 3 or 6");
  expect_refusal(td_grid_check_gpt(&gpt, 1, 4), "use pipeline-parallel 1, 2, 3 or 6");
  gpt.vocab = 2;
  expect_refusal(td_grid_check_gpt(&gpt, 3, 1), "tensor-parallel at most 2");
  printf("grid layout: ok\n");
}

static void ranks(int tp, int pp) {
  td_comm *world = NULL;
  CHECK_OK(td_comm_init(&world));
  const int n = td_comm_size(world), rank = td_comm_rank(world);
  td_grid *grid = NULL;
  CHECK_OK(td_grid_create(world, tp, pp, &grid));
  const int dp = n / (tp * pp);
  CHECK_EQ_INT(td_grid_size(grid, TD_GRID_TENSOR), tp);
  CHECK_EQ_INT(td_grid_size(grid, TD_GRID_PIPELINE), pp);
  CHECK_EQ_INT(td_grid_size(grid, TD_GRID_DATA), dp);
  /* closed forms of Megatron's order */
  const int t = rank % tp, p = (rank / tp) % pp, d = rank / (tp * pp);
  CHECK_EQ_INT(td_grid_rank(grid, TD_GRID_TENSOR), t);
  CHECK_EQ_INT(td_grid_rank(grid, TD_GRID_PIPELINE), p);
  CHECK_EQ_INT(td_grid_rank(grid, TD_GRID_DATA), d);
  CHECK_EQ_INT(td_grid_pipeline_prev(grid), p > 0 ? p - 1 : -1);
  CHECK_EQ_INT(td_grid_pipeline_next(grid), p + 1 < pp ? p + 1 : -1);
  CHECK(td_grid_world(grid) == world);
  for (int k = 0; k < n; k++) CHECK_EQ_INT(td_comm_world_rank(world, k), k);
  CHECK_EQ_INT(td_grid_tensor_hosts(grid), 1); /* one host here */
  /* each axis: sum of the members' world ranks (and the group's rank order) */
  long expect[3] = {0, 0, 0};
  for (int k = 0; k < dp; k++) expect[TD_GRID_DATA] += (long)k * tp * pp + p * tp + t;
  for (int k = 0; k < pp; k++) expect[TD_GRID_PIPELINE] += (long)d * tp * pp + k * tp + t;
  for (int k = 0; k < tp; k++) expect[TD_GRID_TENSOR] += (long)d * tp * pp + p * tp + k;
  for (int a = 0; a < 3; a++) {
    td_comm *c = td_grid_comm(grid, (td_grid_axis)a);
    CHECK(c != NULL);
    CHECK_EQ_INT(td_comm_size(c), td_grid_size(grid, (td_grid_axis)a));
    CHECK_EQ_INT(td_comm_rank(c), td_grid_rank(grid, (td_grid_axis)a));
    int64_t mine = rank, sum = 0;
    CHECK_OK(td_allreduce(&mine, &sum, 1, TD_I64, TD_SUM, c));
    CHECK_EQ_INT(sum, expect[a]);
    /* member k of the group is the world rank at coordinate k */
    int64_t *members = calloc((size_t)td_comm_size(c), sizeof *members);
    CHECK(members);
    CHECK_OK(td_allgather(&mine, members, (size_t)td_comm_size(c), TD_I64, c));
    for (int k = 0; k < td_comm_size(c); k++) {
      int want = a == TD_GRID_TENSOR ? (d * pp + p) * tp + k : a == TD_GRID_PIPELINE ? (d * pp + k) * tp + t
                                                                                       : (k * pp + p) * tp + t;
      CHECK_EQ_INT(members[k], want);
      CHECK_EQ_INT(td_comm_world_rank(c, k), want); /* what the communicator's messages name */
    }
    CHECK_EQ_INT(td_comm_world_rank(c, td_comm_size(c)), -1);
    free(members);
  }
  /* pipeline neighbours: each stage sends its world rank to the next */
  td_comm *pipe = td_grid_comm(grid, TD_GRID_PIPELINE);
  int32_t mine = rank, got = -1;
  if (td_grid_pipeline_next(grid) >= 0) CHECK_OK(td_send(&mine, 1, TD_I32, td_grid_pipeline_next(grid), pipe));
  if (td_grid_pipeline_prev(grid) >= 0) {
    CHECK_OK(td_recv(&got, 1, TD_I32, td_grid_pipeline_prev(grid), pipe));
    CHECK_EQ_INT(got, rank - tp);
  }
  td_grid_destroy(grid);
  CHECK_OK(td_comm_finalize(world));
  td_comm_destroy(world);
  if (rank == 0) printf("grid ranks: %d ranks as data %d x pipeline %d x tensor %d: ok\n", n, dp, pp, tp);
}

static void refused(int tp, int pp) {
  td_comm *world = NULL;
  CHECK_OK(td_comm_init(&world));
  td_grid *grid = (td_grid *)&grid; /* must be reset to NULL */
  expect_refusal(td_grid_create(world, tp, pp, &grid), "does not divide the world");
  CHECK(grid == NULL);
  CHECK_OK(td_barrier(world)); /* nothing half-split: the world still works */
  CHECK_OK(td_comm_finalize(world));
  if (td_comm_rank(world) == 0) printf("grid refused: %s\n", td_last_error());
  td_comm_destroy(world);
}

int main(int argc, char **argv) {
  if (argc >= 2 && strcmp(argv[1], "layout") == 0) {
    layout();
    return 0;
  }
  if (argc >= 4 && strcmp(argv[1], "ranks") == 0) {
    ranks(atoi(argv[2]), atoi(argv[3]));
    return 0;
  }
  if (argc >= 4 && strcmp(argv[1], "refused") == 0) {
    refused(atoi(argv[2]), atoi(argv[3]));
    return 0;
  }
  fprintf(stderr, "usage: test_grid layout | ranks TP PP | refused TP PP\n");
  return 2;
}
