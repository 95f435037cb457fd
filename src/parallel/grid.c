/* The process grid: the world as data x pipeline x tensor ranks (Megatron-LM's
 * order, tensor fastest), and one communicator per axis.
 *
 * Why tensor fastest: a tensor-parallel group runs two allreduces per
 * transformer block in forward and two in backward, on the critical path;
 * launchers number the ranks of a host consecutively, so consecutive tensor
 * ranks keep those collectives in shared memory. Pipeline neighbours come
 * next (one point-to-point message per micro-batch and stage), data-parallel
 * replicas last (one gradient reduction per step, overlapped with backward).
 *
 * The layout is pure arithmetic (td_grid_check, td_grid_coords_of,
 * td_grid_rank_of), so tests and memory estimates use it without ranks;
 * td_grid_create adds the communicators, made by three td_comm_split calls
 * over the world (colour: the other two coordinates; key: the coordinate on
 * the axis, so that a group's rank is the rank's coordinate). */
#include "tandem/parallel.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/base.h"

struct td_grid {
  td_comm *world;
  int size[3];  /* by td_grid_axis */
  int coord[3]; /* this rank's */
  td_comm *comm[3];
  int tensor_hosts;
};

/* The divisors d of n for which d * other divides n, as "1, 2 or 4". */
static void list_divisors(int n, int other, char *buf, size_t size) {
  int found[64], count = 0;
  for (int d = 1; d <= n && count < 64; d++)
    if (n % ((long)d * other) == 0) found[count++] = d;
  size_t used = 0;
  buf[0] = '\0';
  for (int i = 0; i < count && used < size; i++)
    used += (size_t)snprintf(buf + used, size - used, "%s%d", i == 0 ? "" : i + 1 == count ? " or " : ", ",
                             found[i]);
}

td_status td_grid_check(int world, int tensor, int pipeline) {
  if (world < 1) return td_error(TD_ERR_INVALID_ARGUMENT, "grid: the world must have at least one rank, got %d", world);
  if (tensor < 1 || pipeline < 1)
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "grid: tensor-parallel size %d and pipeline-parallel size %d must both be at least 1 "
                    "(1: not split along that axis)", tensor, pipeline);
  if (world % ((long)tensor * pipeline) != 0) {
    char tensors[256], pipelines[256];
    list_divisors(world, pipeline, tensors, sizeof tensors);
    list_divisors(world, tensor, pipelines, sizeof pipelines);
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "grid: tensor-parallel %d x pipeline-parallel %d = %ld ranks per replica does not divide the "
                    "world of %d ranks; with pipeline-parallel %d use tensor-parallel %s; with tensor-parallel %d "
                    "use pipeline-parallel %s; or run a multiple of %ld ranks",
                    tensor, pipeline, (long)tensor * pipeline, world, pipeline, tensors[0] ? tensors : "(none)",
                    tensor, pipelines[0] ? pipelines : "(none)", (long)tensor * pipeline);
  }
  return TD_OK;
}

td_grid_coords td_grid_coords_of(int world, int tensor, int pipeline, int rank) {
  (void)world;
  td_grid_coords c;
  c.tensor = rank % tensor;
  c.pipeline = (rank / tensor) % pipeline;
  c.data = rank / (tensor * pipeline);
  return c;
}

int td_grid_rank_of(int world, int tensor, int pipeline, td_grid_coords coords) {
  (void)world;
  return (coords.data * pipeline + coords.pipeline) * tensor + coords.tensor;
}

td_status td_grid_check_gpt(const td_gpt_config *config, int tensor, int pipeline) {
  if (!config) return td_error(TD_ERR_INVALID_ARGUMENT, "td_grid_check_gpt: config must not be NULL");
  if (tensor < 1 || pipeline < 1)
    return td_error(TD_ERR_INVALID_ARGUMENT, "grid: tensor-parallel %d and pipeline-parallel %d must be at least 1",
                    tensor, pipeline);
  char ok[256];
  if (config->heads % tensor != 0) {
    list_divisors(config->heads, 1, ok, sizeof ok);
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "grid: tensor-parallel %d does not divide the %d attention heads (each rank holds whole heads); "
                    "use tensor-parallel %s, or a head count divisible by %d",
                    tensor, config->heads, ok, tensor);
  }
  if (config->layers % pipeline != 0) {
    list_divisors(config->layers, 1, ok, sizeof ok);
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "grid: pipeline-parallel %d does not divide the %d layers into equal stages; use "
                    "pipeline-parallel %s, or a layer count divisible by %d",
                    pipeline, config->layers, ok[0] ? ok : "1", pipeline);
  }
  if (config->vocab < tensor)
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "grid: a vocabulary of %d tokens cannot give each of %d tensor-parallel ranks a shard; use "
                    "tensor-parallel at most %d", config->vocab, tensor, config->vocab);
  return TD_OK;
}

void td_grid_destroy(td_grid *grid) {
  if (!grid) return;
  for (int a = 0; a < 3; a++) td_comm_destroy(grid->comm[a]);
  free(grid);
}

td_status td_grid_create(td_comm *world, int tensor, int pipeline, td_grid **out) {
  if (!out) return td_error(TD_ERR_INVALID_ARGUMENT, "td_grid_create: out must not be NULL");
  *out = NULL;
  if (!world) return td_error(TD_ERR_INVALID_ARGUMENT, "td_grid_create: world must not be NULL");
  const int n = td_comm_size(world), rank = td_comm_rank(world);
  /* the same arguments on every rank give the same answer: no rank splits
   * while another has refused */
  TD_CHECK(td_grid_check(n, tensor, pipeline));
  td_grid *g = calloc(1, sizeof *g);
  if (!g) return td_error(TD_ERR_SYSTEM, "td_grid_create: out of memory");
  g->world = world;
  g->size[TD_GRID_TENSOR] = tensor;
  g->size[TD_GRID_PIPELINE] = pipeline;
  g->size[TD_GRID_DATA] = n / (tensor * pipeline);
  td_grid_coords c = td_grid_coords_of(n, tensor, pipeline, rank);
  g->coord[TD_GRID_TENSOR] = c.tensor;
  g->coord[TD_GRID_PIPELINE] = c.pipeline;
  g->coord[TD_GRID_DATA] = c.data;
  /* colour: the rank's position on the other two axes */
  const int colour[3] = {
      [TD_GRID_DATA] = c.pipeline * tensor + c.tensor,
      [TD_GRID_PIPELINE] = c.data * tensor + c.tensor,
      [TD_GRID_TENSOR] = c.data * pipeline + c.pipeline,
  };
  td_status st = TD_OK;
  for (int a = 0; a < 3 && st == TD_OK; a++) {
    st = td_comm_split(world, colour[a], g->coord[a], &g->comm[a]);
    if (st == TD_OK && (!g->comm[a] || td_comm_size(g->comm[a]) != g->size[a] ||
                        td_comm_rank(g->comm[a]) != g->coord[a]))
      st = td_error(TD_ERR_INTERNAL, "grid: the %s group of rank %d has %d ranks (rank %d), expected %d (rank %d)",
                    a == TD_GRID_DATA ? "data" : a == TD_GRID_PIPELINE ? "pipeline" : "tensor", rank,
                    g->comm[a] ? td_comm_size(g->comm[a]) : 0, g->comm[a] ? td_comm_rank(g->comm[a]) : -1, g->size[a],
                    g->coord[a]);
  }
  if (st != TD_OK) {
    td_grid_destroy(g);
    return st;
  }
  /* host placement: count the distinct hosts of this rank's tensor group */
  g->tensor_hosts = 0;
  for (int t = 0; t < tensor; t++) {
    td_grid_coords peer = c;
    peer.tensor = t;
    const char *host = td_comm_host(world, td_grid_rank_of(n, tensor, pipeline, peer));
    int seen = 0;
    for (int u = 0; u < t && !seen; u++) {
      td_grid_coords other = c;
      other.tensor = u;
      seen = strcmp(host, td_comm_host(world, td_grid_rank_of(n, tensor, pipeline, other))) == 0;
    }
    g->tensor_hosts += !seen;
  }
  if (g->tensor_hosts > 1 && c.tensor == 0)
    TD_WARN("grid: the tensor-parallel group of world ranks %d..%d spans %d hosts: its per-block allreduces cross "
            "the network; give each host a multiple of %d consecutive ranks", rank, rank + tensor - 1,
            g->tensor_hosts, tensor);
  *out = g;
  return TD_OK;
}

int td_grid_size(const td_grid *grid, td_grid_axis axis) {
  return grid && (unsigned)axis < 3 ? grid->size[axis] : 0;
}
int td_grid_rank(const td_grid *grid, td_grid_axis axis) {
  return grid && (unsigned)axis < 3 ? grid->coord[axis] : -1;
}
td_comm *td_grid_comm(const td_grid *grid, td_grid_axis axis) {
  return grid && (unsigned)axis < 3 ? grid->comm[axis] : NULL;
}
td_comm *td_grid_world(const td_grid *grid) { return grid ? grid->world : NULL; }
int td_grid_pipeline_prev(const td_grid *grid) {
  return grid && grid->coord[TD_GRID_PIPELINE] > 0 ? grid->coord[TD_GRID_PIPELINE] - 1 : -1;
}
int td_grid_pipeline_next(const td_grid *grid) {
  return grid && grid->coord[TD_GRID_PIPELINE] + 1 < grid->size[TD_GRID_PIPELINE]
             ? grid->coord[TD_GRID_PIPELINE] + 1
             : -1;
}
int td_grid_tensor_hosts(const td_grid *grid) { return grid ? grid->tensor_hosts : 0; }
