/* Tandem public API: model parallelism (src/parallel) — the process grid and
 * the tensor-parallel GPT.
 *
 * This layer sits above comm and nn and below train: it splits the model
 * itself across ranks (issue 21), where src/train splits the batch and the
 * model state. src/nn stays free of communication; the parallel layers here
 * call nn's kernels on their local shards and comm's collectives between them.
 *
 * The grid (Megatron-LM's order): the world of W ranks is data x pipeline x
 * tensor, tensor fastest, so
 *
 *   world_rank = (data * pipeline_size + pipeline) * tensor_size + tensor
 *
 * and the ranks of one tensor-parallel group are consecutive (launchers give
 * consecutive ranks to one host: TP's two collectives per block stay in
 * shared memory). E.g. W = 8, tensor 2, pipeline 2 (data 2):
 *
 *   world rank  0 1 | 2 3 | 4 5 | 6 7
 *   tensor      0 1 | 0 1 | 0 1 | 0 1
 *   pipeline    0 0 | 1 1 | 0 0 | 1 1
 *   data        0 0 | 0 0 | 1 1 | 1 1
 *
 * Threading: as td_comm (one application thread at a time per grid). */
#ifndef TANDEM_PARALLEL_H
#define TANDEM_PARALLEL_H

#include <stddef.h>

#include "base.h"
#include "comm.h"
#include "nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the process grid (src/parallel/grid.c) ---- */

typedef enum td_grid_axis {
  TD_GRID_DATA = 0,     /* slowest: replicas that average gradients (and ZeRO shards) */
  TD_GRID_PIPELINE = 1, /* stages of consecutive layers */
  TD_GRID_TENSOR = 2,   /* fastest: shards of every layer */
} td_grid_axis;

/* A rank's coordinates in a layout (pure arithmetic, no communicator). */
typedef struct td_grid_coords {
  int data, pipeline, tensor;
} td_grid_coords;

/* Whether a world of `world` ranks can be laid out with tensor x pipeline
 * ranks per replica: TD_OK, or TD_ERR_INVALID_ARGUMENT with a message that
 * says which layouts would work (e.g. "--tensor-parallel 3 does not divide
 * the world of 4 ranks; use 1, 2 or 4"). Pure; any thread. */
td_status td_grid_check(int world, int tensor, int pipeline);
/* Coordinates of world rank `rank` in a valid layout (td_grid_check). */
td_grid_coords td_grid_coords_of(int world, int tensor, int pipeline, int rank);
/* The world rank at `coords` in a valid layout. */
int td_grid_rank_of(int world, int tensor, int pipeline, td_grid_coords coords);

/* Whether a GPT fits the layout: layers % pipeline, heads % tensor (each
 * rank holds whole heads; the MLP's 4C then splits evenly too), and at most
 * `tensor` ranks for the vocabulary (a vocabulary shard may be uneven, not
 * empty). TD_ERR_INVALID_ARGUMENT with a message naming the values that
 * would work otherwise. Pure; any thread. */
td_status td_grid_check_gpt(const td_gpt_config *config, int tensor, int pipeline);

typedef struct td_grid td_grid;

/* Lay the ranks of `world` out as data x pipeline x tensor and create one
 * communicator per axis with td_comm_split (the tensor group of a rank is
 * the ranks with its data and pipeline coordinates, ordered by tensor
 * coordinate; likewise for the others). Collective over world (every rank
 * calls it with the same tensor and pipeline; a layout refused by
 * td_grid_check is refused on every rank before anything communicates).
 * A tensor group whose ranks are on several hosts (td_comm_host) works but
 * pays the network twice per block: it is logged as a warning and reported
 * by td_grid_tensor_hosts. The grid borrows world (destroy the grid first).
 * *out is NULL on failure. */
td_status td_grid_create(td_comm *world, int tensor, int pipeline, td_grid **out);
/* Release the axis communicators. Accepts NULL. Does not communicate. */
void td_grid_destroy(td_grid *grid);

int td_grid_size(const td_grid *grid, td_grid_axis axis); /* ranks along the axis */
int td_grid_rank(const td_grid *grid, td_grid_axis axis); /* this rank's coordinate on the axis */
/* The communicator of this rank's group along `axis` (its rank there is
 * td_grid_rank(grid, axis)); owned by the grid. Never NULL for a created grid
 * (a group of one is a communicator of one). */
td_comm *td_grid_comm(const td_grid *grid, td_grid_axis axis);
td_comm *td_grid_world(const td_grid *grid);
/* Pipeline neighbours as ranks of td_grid_comm(grid, TD_GRID_PIPELINE):
 * the previous and next stage, -1 at the first/last stage. */
int td_grid_pipeline_prev(const td_grid *grid);
int td_grid_pipeline_next(const td_grid *grid);
/* Number of distinct hosts this rank's tensor group spans (1 is the layout
 * the grid aims for). */
int td_grid_tensor_hosts(const td_grid *grid);

/* ---- the tensor-parallel GPT (src/parallel/tensor/) ---- */

/* This rank's shard of the GPT of `config` under Megatron-LM's tensor
 * parallelism over the grid's tensor group (td_grid_comm(grid,
 * TD_GRID_TENSOR); the model borrows the grid: destroy the model first;
 * pipeline-parallel must be 1): QKV and the MLP's first product column-parallel (whole heads
 * per rank), the attention projection and the MLP's second product
 * row-parallel, the token embedding and the LM head split by vocabulary
 * rows (td_shard_range(vocab, p, r): an odd vocabulary splits unevenly),
 * with a cross-entropy that never gathers the logits. LayerNorms, wpe and
 * the row-parallel products' biases are replicated. The model's arena is
 * the shard (tensor names as td_gpt_create's, counts local), initialized by
 * td_model_init_params to the unsplit GPT's values for its part, so a
 * trainer given the data-parallel communicator trains the same model as one
 * rank. forward, backward, predict and grad_norm_sq are collective over the
 * tensor group (every rank of it calls them with the same tokens); a failed
 * collective (a peer died) makes forward return NaN with the message naming
 * the rank (and which world ranks the group's ranks are), then and on every
 * later call. Refuses (td_grid_check_gpt) heads not
 * divisible by the group size. f32 only; no activation checkpointing,
 * ZeRO-3 parameter access or device yet. */
td_status td_gpt_tp_create(const td_gpt_config *config, const td_grid *grid, td_model **out);
/* Megatron-LM's sequence parallelism on a td_gpt_tp_create model (on = 1;
 * default 0): the LayerNorm and residual regions hold B*T/p rows per rank,
 * and each allreduce becomes an allgather before a column-parallel product
 * and a reduce-scatter after a row-parallel one (the same bytes; less
 * activation memory and LayerNorm work per rank). The same results within
 * float summation noise. Takes effect at the next prepare; every rank of the
 * group must set the same. TD_ERR_INVALID_ARGUMENT when the sequence length
 * is not divisible by the group size, or for another model. */
td_status td_gpt_tp_set_sequence_parallel(td_model *model, int on);

#ifdef __cplusplus
}
#endif
#endif
