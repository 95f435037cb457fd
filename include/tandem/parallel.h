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
 * divisible by the group size. Activation checkpointing
 * (set_activation_checkpointing) recomputes each block, its collectives
 * included, in backward: the same bits. Mixed precision follows the
 * calling thread's td_nn_set_compute_dtype as the unsplit GPT does (the
 * products' operands rounded; activations and collectives f32). ZeRO
 * stage 3's td_param_access (set by the trainer) is honoured: each group
 * (the embeddings, a block, ln_f with the head) is fetched from this
 * shard's arena just before use, on the training thread, in the same order
 * on every rank of the data-parallel group. */
td_status td_gpt_tp_create(const td_gpt_config *config, const td_grid *grid, td_model **out);
/* The same model computing on `device` (CPU: exactly td_gpt_tp_create). On
 * a CUDA device the device GPT computes this rank's shard
 * (td_gpt_set_tensor_split): the blocks split as above, their allreduces on
 * device buffers through Tandem's device collectives (staged through
 * pinned host memory when ranks share a GPU, NCCL when each has its own);
 * the token embedding and the head vocabulary-parallel as on the CPU
 * (the same shards; the device's parallel cross-entropy never forms the
 * whole logits), f32 or bf16 arenas (td_gpt_set_device_dtype; the
 * allreduces then sum bf16 partial products). Sequence parallelism is
 * refused there. */
td_status td_gpt_tp_create_on(const td_gpt_config *config, const td_grid *grid, td_device device, td_model **out);
/* Megatron-LM's sequence parallelism on a td_gpt_tp_create model (on = 1;
 * default 0): the LayerNorm and residual regions hold B*T/p rows per rank,
 * and each allreduce becomes an allgather before a column-parallel product
 * and a reduce-scatter after a row-parallel one (the same bytes; less
 * activation memory and LayerNorm work per rank). The same results within
 * float summation noise. Takes effect at the next prepare; every rank of the
 * group must set the same. TD_ERR_INVALID_ARGUMENT when the sequence length
 * is not divisible by the group size, or for another model. */
td_status td_gpt_tp_set_sequence_parallel(td_model *model, int on);

/* ---- a shard's place in the unsplit model (src/parallel/tensor/ckpt_map.c) ---- */

/* Checkpoints record the UNSPLIT model's arenas (the element order of
 * td_gpt_create's arena), so that any layout loads what any layout saved.
 * A shard map says where each element of this rank's arena lives there: a
 * list of runs, `count` elements at local offset `local` being elements
 * [unsplit, unsplit + count) of the unsplit arena (the optimizer states
 * share the parameters' layout, so one map serves every arena).
 *
 *   column-parallel weight (rows split)   one run per row block (qkv: 3)
 *   row-parallel weight (columns split)   one run per row (strided)
 *   vocabulary-split wte / lm_head        one run
 *   replicated (LayerNorms, wpe, the row-parallel biases)   one run, with
 *                                          writer = 1 on tensor rank 0 only
 *
 * `writer` is 1 where this rank writes the run into a checkpoint: every
 * element of the unsplit model has exactly one writer per model replica.
 * A pipeline stage (a contiguous range of layers) plugs in as the runs of
 * the tensors it holds: its local offsets restart at 0, its unsplit offsets
 * are those tensors' in the whole model, and the tied embedding held by the
 * first and the last stage is written by one of them. */
typedef struct td_shard_run {
  size_t local, unsplit, count;
  int writer;
} td_shard_run;

typedef struct td_shard_map {
  td_model *unsplit; /* the whole model's description (kind, config, n_params, tensors); no arena, never prepared */
  size_t n_local;    /* floats in this rank's arena */
  int n_runs;
  td_shard_run *runs; /* (n_runs) by local offset, tiling [0, n_local); adjacent runs merged */
} td_shard_map;

/* The map of a td_gpt_tp_create model's arena (any tensor rank, any vocab
 * split). TD_ERR_INVALID_ARGUMENT for a model that is not split (nothing to
 * map). Local; any thread. */
td_status td_shard_map_create(const td_model *model, td_shard_map **out);
void td_shard_map_destroy(td_shard_map *map); /* accepts NULL */

/* ---- pipeline parallelism (src/parallel/pipeline/) ---- */

/* How the pipeline runs (train-gpt --pipeline-schedule/--pipeline-chunks,
 * config "pipeline": {"schedule", "chunks", "partition_method"}). Zero it
 * for the defaults. */
typedef struct td_pipeline_config {
  const char *schedule;  /* "1f1b" (NULL: the default; PipeDream-Flush) or "interleaved" (Megatron-LM's) */
  int chunks;            /* model chunks per rank: 1 for 1f1b; interleaved: at least 2 (0: 1, or 2 interleaved) */
  const char *partition; /* "uniform" (NULL: the default) or "parameters" (DeepSpeed's partition_method) */
  int sequence_parallel; /* tensor-parallel stages only (td_gpt_pipeline_create_grid): Megatron's sequence
                            parallelism inside each stage, whose activation messages then carry B*T/tp rows */
  td_device device;      /* where the stages compute ({0}: the CPU); a CUDA device: td_gpt_stage_create_on's
                            stages (tensor-parallel ones: td_gpt_tp_create_on's), f32 or bf16 (the model's
                            set_device_dtype; an untied GPT's only in bf16), activations exchanged in that
                            type through pinned host memory */
} td_pipeline_config;

/* Whether a GPT trains on `stages` pipeline stages with `micro_batches`
 * micro-batches per step (the gradient accumulation steps): the names, at
 * least one block per model stage (layers >= stages x chunks), the
 * interleaved schedule's micro-batches a multiple of the stages.
 * TD_ERR_INVALID_ARGUMENT with a message naming what would work. Pure. */
td_status td_pipeline_check(const td_gpt_config *config, const td_pipeline_config *pp, int stages,
                            int micro_batches);

/* This rank's part of the GPT of `config` cut into pipeline stages over the
 * communicator `pipeline` (td_grid_comm(grid, TD_GRID_PIPELINE); the model
 * borrows it): its chunks' blocks (td_gpt_stage_create; the first stage
 * with the embeddings, the last with the final layernorm, the head and the
 * loss; a tied head keeps a copy of wte whose gradient is summed with the
 * first stage's after every step), their arenas back to back in chunk
 * order, tensor names as td_gpt_create's, initialized by
 * td_model_init_params to the whole model's values. The model's
 * run_micro_batches op runs one step's schedule (td_trainer_step uses it;
 * forward alone is refused): activations and their gradients travel by
 * td_isend/td_irecv, sends posted without waiting. Every rank's inputs are
 * the step's tokens (the first stage reads them, the last its targets).
 * The loss is the last stage's, broadcast to the group. A failure on one
 * stage (a bad token, a dead peer) aborts the group's communicator, so that
 * the others fail naming it instead of waiting. Local (nothing
 * communicates until the first step). CPU, f32 or bf16 products; or on
 * pp->device, f32 (td_gpt_stage_create_on: what crosses is staged through
 * pinned host memory, the transfers are the same). */
td_status td_gpt_pipeline_create(const td_gpt_config *config, const td_pipeline_config *pp, td_comm *pipeline,
                                 td_model **out);

/* 3D parallelism (TP x PP, with data parallelism over the grid's data
 * group): as td_gpt_pipeline_create over td_grid_comm(grid,
 * TD_GRID_PIPELINE), each stage's chunks built of tensor-parallel layers
 * over td_grid_comm(grid, TD_GRID_TENSOR) (Megatron-LM's layout, tensor
 * fastest; each tensor shard cut as td_gpt_tp_create's). Tensor rank t of
 * stage s sends its activations to tensor rank t of stage s + 1 (the
 * pipeline group joins the ranks of one tensor coordinate): the whole
 * (B*T, C) rows, which every rank of a tensor group holds equal, or with
 * pp->sequence_parallel its B*T/tp rows. A tied wte's gradient is summed
 * between the first and last stage per tensor rank (the same vocabulary
 * rows); the loss is the last stage's, over its tensor group. With a grid
 * of tensor size 1 it is td_gpt_pipeline_create. Refuses heads not
 * divisible by the tensor size (td_grid_check_gpt), sequence parallelism
 * without a tensor group or with a sequence length it does not divide.
 * The model borrows the grid. Local. */
td_status td_gpt_pipeline_create_grid(const td_gpt_config *config, const td_pipeline_config *pp, const td_grid *grid,
                                      td_model **out);
/* Where a pipeline rank's time went, summed over the steps run so far
 * but the first (which allocates the activations; steps counts the rest)
 * (seconds): compute (forward, backward), blocked on receives (recv_wait:
 * the bubble plus transfer time), blocked on sends before reusing a buffer
 * or at the end of the step (send_wait), and the steps' wall time (step_s,
 * the whole run_micro_batches). idle = step_s - forward_s - backward_s. */
typedef struct td_pipeline_stats {
  long steps;
  double forward_s, backward_s, recv_wait_s, send_wait_s, step_s;
  double bytes_sent;
  int stage, stages, chunks;
  int first_layer[8], n_layers[8]; /* per chunk (the first 8) */
  int tensor;                      /* the stages' tensor-parallel size (1: whole-width stages) */
  /* the training thread's CPU seconds in forward and backward (CLOCK_THREAD_CPUTIME_ID): beside
   * forward_s/backward_s, what a loaded machine does not stretch; the stages' own work only with
   * one compute thread (--threads 1) on the CPU (a device's kernels, or other threads', not counted) */
  double forward_cpu_s, backward_cpu_s;
} td_pipeline_stats;
td_status td_gpt_pipeline_stats(const td_model *model, td_pipeline_stats *out);

/* Spans of the pipeline's phases for a timeline: fn(ctx, name, begin_s,
 * end_s), td_now() seconds, names "forward", "backward", "send" (posting a
 * transfer), "recv_wait" (blocked on a neighbour: with "send_wait", the
 * stage's idle time), "send_wait", called on the training thread. fn
 * NULL: off. */
void td_gpt_pipeline_set_trace(td_model *model, void (*fn)(void *ctx, const char *name, double begin_s, double end_s),
                               void *ctx);

#ifdef __cplusplus
}
#endif
#endif
