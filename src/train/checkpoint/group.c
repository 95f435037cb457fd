/* Who saves and loads a checkpoint together (td_ckpt_group, ckpt.h): the
 * trainer's data-parallel ranks, or under model parallelism the grid's
 * whole world with the unsplit model (td_trainer_set_grid). Below
 * checkpoint.c, save.c and load.c, which all ask it. */
#include "train/checkpoint/ckpt.h"

#include <stdlib.h>

#include "train/core/core.h"

td_ckpt_group td_ckpt_group_of(const td_trainer *t) {
  if (t->shard_map) {
    td_comm *world = td_grid_world(t->grid);
    return (td_ckpt_group){world, td_comm_rank(world), td_comm_size(world), t->grid_agree_flags,
                           t->shard_map->unsplit, t->shard_map->unsplit->n_params};
  }
  return (td_ckpt_group){t->comm, t->rank, t->world, t->agree_flags, t->model, t->n_params};
}

td_status td_ckpt_agree(const td_trainer *t, td_status local) {
  td_ckpt_group g = td_ckpt_group_of(t);
  return td_agree_over(g.comm, g.rank, g.world, g.agree_flags, local);
}

td_status td_trainer_set_grid(td_trainer *t, const td_grid *grid) {
  if (!t || !grid) return td_error(TD_ERR_INVALID_ARGUMENT, "td_trainer_set_grid: trainer and grid must be given");
  td_comm *data = td_grid_comm(grid, TD_GRID_DATA);
  if (td_comm_size(data) != t->world || td_comm_rank(data) != t->rank)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_trainer_set_grid: the trainer runs on %d ranks (this one %d), the "
                    "grid's data-parallel group has %d (this one %d): create the trainer on td_grid_comm(grid, "
                    "TD_GRID_DATA)", t->world, t->rank, td_comm_size(data), td_comm_rank(data));
  td_shard_map *map = NULL;
  TD_CHECK(td_shard_map_create(t->model, &map));
  int32_t *flags = calloc((size_t)td_comm_size(td_grid_world(grid)), sizeof *flags);
  if (!flags) {
    td_shard_map_destroy(map);
    return td_error(TD_ERR_SYSTEM, "td_trainer_set_grid: out of memory");
  }
  td_shard_map_destroy(t->shard_map);
  free(t->grid_agree_flags);
  t->grid = grid;
  t->shard_map = map;
  t->grid_agree_flags = flags;
  return TD_OK;
}
