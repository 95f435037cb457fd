/* Pipeline schedules as pure functions: each stage's ordered list of
 * receives, forwards, sends and backwards for one optimizer step.
 *
 * 1F1B (PipeDream-Flush, Narayanan et al. 2021; DeepSpeed's TrainSchedule,
 * Megatron-LM's forward_backward_pipelining_without_interleaving). Stage s
 * of p runs w = min(p-s-1, m) warm-up forwards, then alternates one forward
 * and one backward, then drains the last w backwards. At most p-s
 * micro-batches are alive on stage s (GPipe keeps all m), and the bubble is
 * the fill and drain of the pipe: (p-1) of (m+p-1) time slots per stage when
 * a forward and a backward take the same time on every stage.
 *
 *   p=3, m=4     time ->
 *   stage 0  F0 F1 F2 .  .  B0 F3 B1 .  B2 .  B3
 *   stage 1     F0 F1 .  B0 F2 B1 F3 B2 .  B3
 *   stage 2        F0 B0 F1 B1 F2 B2 F3 B3
 *   (a backward drawn as one slot; the order, not the timing, is what the
 *   list fixes)
 *
 * Interleaved (Megatron-LM, Narayanan et al. 2021 §2.2): rank s holds v
 * chunks, model stages s, p+s, 2p+s, ...; micro-batches go round in groups
 * of p, chunk by chunk: forward k of a rank is chunk (k mod pv) / p of
 * micro-batch (k / pv) p + k mod p, backwards the same with the chunks in
 * reverse. Warm-up: (p-s-1)*2 + (v-1)*p forwards (all of them when m == p).
 * The bubble shrinks by v: (p-1) of (vm+p-1) chunk-slots, for v times the
 * messages. Needs m a multiple of p.
 *
 * Communication: each forward is preceded by the receive of its input and
 * followed by the send of its output, each backward likewise with the
 * gradient flowing the other way. The engine posts sends without waiting
 * (src/comm's td_isend progresses on the communicator's thread) and waits
 * on receives; the tests' simulator runs every stage's list under exactly
 * those rules and checks that all of them finish and that each pair's
 * sends and receives match in order. */
#include "parallel/pipeline/pipeline.h"

#include <stdio.h>

td_status td_pp_schedule_check(td_pp_schedule_kind kind, int stages, int micro_batches, int chunks) {
  if (stages < 1 || micro_batches < 1 || chunks < 1)
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "pipeline: %d stages, %d micro-batches, %d chunks per stage: each must be at least 1", stages,
                    micro_batches, chunks);
  if (kind == TD_PP_1F1B) {
    if (chunks != 1)
      return td_error(TD_ERR_INVALID_ARGUMENT,
                      "pipeline: the 1f1b schedule runs one chunk per stage, not %d: use --pipeline-schedule "
                      "interleaved for several chunks, or --pipeline-chunks 1",
                      chunks);
    return TD_OK;
  }
  if (kind != TD_PP_INTERLEAVED) return td_error(TD_ERR_INVALID_ARGUMENT, "pipeline: unknown schedule %d", (int)kind);
  if (stages < 2 || chunks < 2)
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "pipeline: the interleaved schedule needs at least 2 stages and 2 chunks per stage (got %d "
                    "stages, %d chunks): use --pipeline-chunks 2 or more, or --pipeline-schedule 1f1b",
                    stages, chunks);
  if (micro_batches % stages != 0)
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "pipeline: the interleaved schedule sends micro-batches round in groups of the %d stages, so "
                    "their number (%d, the gradient accumulation steps) must be a multiple of %d: use %d or %d",
                    stages, micro_batches, stages, micro_batches / stages * stages > 0 ? micro_batches / stages * stages : stages,
                    (micro_batches / stages + 1) * stages);
  return TD_OK;
}

/* The k-th compute step (forward when fwd) of a rank under the schedule:
 * its micro-batch and chunk. */
static void step_of(td_pp_schedule_kind kind, int p, int v, int k, int fwd, int *micro, int *chunk) {
  if (kind == TD_PP_1F1B) {
    *micro = k;
    *chunk = 0;
    return;
  }
  int in_group = k % (p * v);
  int c = in_group / p;
  *chunk = fwd ? c : v - 1 - c;
  *micro = k / (p * v) * p + k % p;
}

static int warmup_count(td_pp_schedule_kind kind, int p, int m, int v, int s) {
  int total = m * v;
  if (kind == TD_PP_1F1B) return p - s - 1 < m ? p - s - 1 : m;
  if (m == p) return total;
  int w = (p - s - 1) * 2 + (v - 1) * p;
  return w < total ? w : total;
}

/* Appends actions while there is room; counts them always. */
typedef struct emit {
  td_pp_action *out;
  int max, n;
} emit;

static void put(emit *e, td_pp_action_kind kind, int micro, int chunk, int peer) {
  if (e->out && e->n < e->max) e->out[e->n] = (td_pp_action){kind, micro, chunk, peer};
  e->n++;
}

static void put_forward(emit *e, int p, int v, int s, int micro, int chunk) {
  int k = chunk * p + s, last = p * v - 1;
  if (k > 0) put(e, TD_PP_RECV_ACT, micro, chunk, (s + p - 1) % p);
  put(e, TD_PP_FORWARD, micro, chunk, -1);
  if (k < last) put(e, TD_PP_SEND_ACT, micro, chunk, (s + 1) % p);
}

static void put_backward(emit *e, int p, int v, int s, int micro, int chunk) {
  int k = chunk * p + s, last = p * v - 1;
  if (k < last) put(e, TD_PP_RECV_GRAD, micro, chunk, (s + 1) % p);
  put(e, TD_PP_BACKWARD, micro, chunk, -1);
  if (k > 0) put(e, TD_PP_SEND_GRAD, micro, chunk, (s + p - 1) % p);
}

static void generate(td_pp_schedule_kind kind, int p, int m, int v, int s, emit *e) {
  int total = m * v, warm = warmup_count(kind, p, m, v, s), rest = total - warm;
  int micro, chunk;
  for (int k = 0; k < warm; k++) {
    step_of(kind, p, v, k, 1, &micro, &chunk);
    put_forward(e, p, v, s, micro, chunk);
  }
  for (int k = 0; k < rest; k++) {
    step_of(kind, p, v, warm + k, 1, &micro, &chunk);
    put_forward(e, p, v, s, micro, chunk);
    step_of(kind, p, v, k, 0, &micro, &chunk);
    put_backward(e, p, v, s, micro, chunk);
  }
  for (int k = rest; k < total; k++) {
    step_of(kind, p, v, k, 0, &micro, &chunk);
    put_backward(e, p, v, s, micro, chunk);
  }
}

int td_pp_schedule_length(td_pp_schedule_kind kind, int stages, int micro_batches, int chunks, int stage) {
  if (td_pp_schedule_check(kind, stages, micro_batches, chunks) != TD_OK || stage < 0 || stage >= stages) return 0;
  emit e = {NULL, 0, 0};
  generate(kind, stages, micro_batches, chunks, stage, &e);
  return e.n;
}

td_status td_pp_schedule(td_pp_schedule_kind kind, int stages, int micro_batches, int chunks, int stage,
                         td_pp_action *out, int max, int *n_out) {
  if (n_out) *n_out = 0;
  TD_CHECK(td_pp_schedule_check(kind, stages, micro_batches, chunks));
  if (stage < 0 || stage >= stages)
    return td_error(TD_ERR_INVALID_ARGUMENT, "pipeline: stage %d outside [0, %d)", stage, stages);
  emit e = {out, max, 0};
  generate(kind, stages, micro_batches, chunks, stage, &e);
  if (e.n > max)
    return td_error(TD_ERR_INVALID_ARGUMENT, "pipeline: stage %d's schedule has %d actions, room for %d", stage, e.n,
                    max);
  if (n_out) *n_out = e.n;
  return TD_OK;
}

int td_pp_max_in_flight(const td_pp_action *actions, int n_actions, int chunks) {
  int most = 0;
  for (int c = 0; c < chunks; c++) {
    int alive = 0;
    for (int i = 0; i < n_actions; i++) {
      if (actions[i].chunk != c) continue;
      if (actions[i].kind == TD_PP_FORWARD) alive++;
      if (actions[i].kind == TD_PP_BACKWARD) alive--;
      if (alive > most) most = alive;
    }
  }
  return most;
}

/* Micro-batches alive on a rank (all its chunks; forward done, backward
 * not) at most: its warm-up forwards, then one more before the first
 * backward, all m*v of them at most. */
static int alive_on_rank(td_pp_schedule_kind kind, int p, int m, int v, int r) {
  int alive = warmup_count(kind, p, m, v, r) + 1;
  return alive < m * v ? alive : m * v;
}

int td_pp_max_unexpected(td_pp_schedule_kind kind, int stages, int micro_batches, int chunks, int stage) {
  const int p = stages, m = micro_batches, v = chunks, s = stage;
  if (td_pp_schedule_check(kind, p, m, v) != TD_OK || s < 0 || s >= p || p < 2) return 0;
  /* At model stage k, an activation of micro-batch i from k-1 waits until
   * F(i) at k, and a gradient from k+1 (sent after B(i) there) until B(i)
   * at k; B(i) at k-1 waits for that gradient. So both are of micro-batches
   * alive on model stage k-1 (forward done there, backward not): on the
   * previous rank. A rank's chunk 0 (model stage 0) receives gradients
   * only, of micro-batches alive on it: under 1F1B rank 0 receives only
   * those, under the interleaved schedule rank p-1's activations too. A
   * rank takes its last message of a step in its last backward, before
   * its neighbours can start the next step's sends to it, so steps add
   * nothing. */
  if (s > 0) return alive_on_rank(kind, p, m, v, s - 1);
  int own = alive_on_rank(kind, p, m, v, 0);
  return kind == TD_PP_1F1B ? own : own + alive_on_rank(kind, p, m, v, p - 1);
}

const char *td_pp_action_name(td_pp_action_kind kind) {
  static const char *names[] = {"recv_act", "forward", "send_act", "recv_grad", "backward", "send_grad"};
  return (unsigned)kind < TD_ARRAY_SIZE(names) ? names[kind] : "?";
}
