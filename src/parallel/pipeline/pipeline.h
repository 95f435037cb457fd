/* Pipeline parallelism (src/parallel/pipeline/): the model's layers cut
 * into stages, one per rank of a pipeline group, and a global batch's
 * micro-batches streamed through them (GPipe, PipeDream-Flush/1F1B,
 * Megatron-LM's interleaved schedule).
 *
 *   schedule.c   which forward/backward/send/recv each stage runs, in order
 *                (pure functions; the engine and the tests read the lists)
 *   partition.c  which layers each stage holds (uniform, or balanced by
 *                parameter count as DeepSpeed's partition_method, or by
 *                arithmetic)
 *   engine.c     runs one stage's action list on a GPT stage model with
 *                nonblocking point-to-point transfers
 *
 * Terms: p stages (ranks of the pipeline group), m micro-batches per
 * optimizer step, v chunks per rank (the interleaved schedule; 1 for 1F1B).
 * The model is cut into p*v "model stages"; model stage k = c*p + s is held
 * by rank s as its chunk c (Megatron's virtual pipeline stages). */
#ifndef TD_PARALLEL_PIPELINE_H
#define TD_PARALLEL_PIPELINE_H

#include <stddef.h>

#include "base/base.h"

/* ---- schedule.c ---- */

typedef enum td_pp_schedule_kind {
  TD_PP_1F1B = 0,        /* PipeDream-Flush: p-s-1 warm-up forwards, then one forward one backward */
  TD_PP_INTERLEAVED = 1, /* Megatron-LM's interleaved 1F1B over v chunks per rank */
} td_pp_schedule_kind;

typedef enum td_pp_action_kind {
  TD_PP_RECV_ACT = 0,  /* receive the input activation of (micro, chunk) from the previous model stage */
  TD_PP_FORWARD = 1,   /* forward of (micro, chunk) */
  TD_PP_SEND_ACT = 2,  /* send its output activation to the next model stage (nonblocking) */
  TD_PP_RECV_GRAD = 3, /* receive the gradient of its output from the next model stage */
  TD_PP_BACKWARD = 4,  /* backward of (micro, chunk) */
  TD_PP_SEND_GRAD = 5, /* send the gradient of its input to the previous model stage (nonblocking) */
} td_pp_action_kind;

typedef struct td_pp_action {
  td_pp_action_kind kind;
  int micro; /* micro-batch, 0 .. m-1 */
  int chunk; /* this rank's chunk, 0 .. v-1 */
  int peer;  /* receives and sends: the stage (rank in the pipeline group) on the other side; -1 otherwise */
} td_pp_action;

/* Check a layout for a schedule: p >= 1, m >= 1, v >= 1; v == 1 for 1F1B;
 * the interleaved schedule needs v >= 2, p >= 2 and m a multiple of p
 * (Megatron-LM's condition: its micro-batches go round in groups of p).
 * TD_ERR_INVALID_ARGUMENT with a message saying what would work. Pure. */
td_status td_pp_schedule_check(td_pp_schedule_kind kind, int stages, int micro_batches, int chunks);

/* The number of actions stage `stage` runs in one step (the size to give
 * td_pp_schedule). Pure; 0 for a layout td_pp_schedule_check refuses. */
int td_pp_schedule_length(td_pp_schedule_kind kind, int stages, int micro_batches, int chunks, int stage);

/* Stage `stage`'s ordered action list for one optimizer step into out
 * (capacity max; *n_out: the number written). Every forward is preceded by
 * the receive of its input and followed by the send of its output (except at
 * the first and last model stage), every backward likewise with gradients.
 * Running every stage's list in order, with sends that do not block and
 * receives that wait, completes (tests/pipeline: the simulator), and each
 * pair of stages issues its sends and receives to each other in the same
 * order (point-to-point messages match in issue order). Pure. */
td_status td_pp_schedule(td_pp_schedule_kind kind, int stages, int micro_batches, int chunks, int stage,
                         td_pp_action *out, int max, int *n_out);

/* The most micro-batches whose activations a chunk of `stage` holds at once
 * under that schedule (forwards done, backwards not yet): how many
 * activation slots the engine needs per chunk. Pure. */
int td_pp_max_in_flight(const td_pp_action *actions, int n_actions, int chunks);

/* The most point-to-point messages (activations in, gradients in) that can
 * have reached stage `stage` before it posts their receives, in any timing
 * of the stages' lists, across steps too: what its communicator may hold
 * as unexpected frames (td_comm_hold_unexpected), one activation message
 * each. A closed form in (p, m, v, stage); 0 for p == 1 or a layout
 * td_pp_schedule_check refuses. Pure. */
int td_pp_max_unexpected(td_pp_schedule_kind kind, int stages, int micro_batches, int chunks, int stage);

/* "recv_act", "forward", ... */
const char *td_pp_action_name(td_pp_action_kind kind);

/* ---- partition.c ---- */

typedef enum td_pp_partition_method {
  TD_PP_PARTITION_UNIFORM = 0,    /* the same number of layers per part (the first parts one more) */
  TD_PP_PARTITION_PARAMETERS = 1, /* the largest part's parameter count as small as possible */
  TD_PP_PARTITION_COMPUTE = 2,    /* the largest part's arithmetic as small as possible */
} td_pp_partition_method;

/* Cut n_layers layers, layer i weighing weights[i] (its parameters, or its
 * arithmetic for COMPUTE: the cut is the same, the weights differ), into
 * n_parts contiguous parts of at least one layer each: part k holds layers
 * [first[k], first[k+1]) (first has n_parts + 1 entries; first[0] = 0,
 * first[n_parts] = n_layers). UNIFORM is DeepSpeed's partition_uniform
 * (weights may be NULL); PARAMETERS and COMPUTE minimize the heaviest part exactly
 * (ties: the earliest cut). TD_ERR_INVALID_ARGUMENT when n_layers <
 * n_parts, naming both. Pure. */
td_status td_pp_partition(td_pp_partition_method method, const size_t *weights, int n_layers, int n_parts,
                          int *first);

/* A GPT's blocks' weights for td_pp_partition (n = config->layers): the
 * parameters of each block, with the embeddings on the first and ln_f and
 * the head on the last (PARAMETERS); or each block's forward + backward
 * products in flops per token, the head's on the last (COMPUTE; the model
 * is in partition.c). UNIFORM is given the parameters. Pure. */
struct td_gpt_config;
void td_pp_gpt_layer_weights(const struct td_gpt_config *config, td_pp_partition_method method, size_t *w);

/* "uniform" / "parameters" (DeepSpeed's names; "type:..." is not built) / "compute".
 * TD_ERR_INVALID_ARGUMENT naming the accepted names otherwise. */
td_status td_pp_partition_method_parse(const char *name, td_pp_partition_method *out);

#endif
