/* Mixed precision in the training engine (DESIGN.md §4): what the trainer
 * calls around its step when cfg.precision asks for bf16 or fp16, and the
 * fp16 loss scaler.
 *
 * Master weights and optimizer state stay f32 in the trainer's arenas. The
 * step runs forward and backward with the thread's compute type set
 * (td_nn_set_compute_dtype), so that every product of the linear layers
 * rounds its operands (weights, activations, output gradients) to bf16 or
 * f16 and accumulates in f32; the weights' half-precision copy is the
 * packed panel each product builds from the f32 masters, so it is always
 * the current weights, rounded. Gradients accumulate in f32.
 *
 * communication_data_type bf16/fp16: each gradient bucket is rounded into a
 * half-precision shadow of the gradient arena, summed there (the
 * collectives add halves in f32 and round once) and widened back and
 * divided by the world size after the wait: half the bytes of the f32
 * exchange, one extra rounding of each gradient. (A sum, not TD_AVG: the
 * shared-memory collectives move only half-type bytes for a sum, while
 * their half-type average goes through f32.)
 *
 * fp16: backward runs with the loss multiplied by the scale, so that small
 * gradients survive f16's range (the products round dout to f16); the
 * optimizer divides it out (folded into the clip factor). A step whose
 * gradients hold an inf or NaN on any rank is skipped on every rank: each
 * rank tests its own gradients and one MAX-allreduce of a flag makes the
 * decision the same everywhere (with ZeRO's sharded gradients no rank sees
 * them all); a model split across ranks (TP, PP) adds a MAX over its own
 * group (the model's group_max), so the whole grid skips together. The
 * scaler then follows DeepSpeed's DynamicLossScaler:
 * `hysteresis` overflows are tolerated before the scale halves (never below
 * min_loss_scale), and after `loss_scale_window` clean steps it doubles. */
#include "train/precision/precision.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

void td_loss_scaler_init(td_loss_scaler *s, const td_precision_config *p) {
  memset(s, 0, sizeof *s);
  s->last_overflow_iter = -1;
  s->hysteresis_left = p->hysteresis;
  if (p->compute != TD_F16) {
    s->scale = 1.0;
    s->dynamic = 0;
  } else if (p->loss_scale > 0.0f) {
    s->scale = p->loss_scale;
    s->dynamic = 0;
  } else {
    s->scale = ldexp(1.0, p->initial_scale_power);
    s->dynamic = 1;
  }
}

double td_loss_scaler_update(td_loss_scaler *s, const td_precision_config *p, int overflow) {
  double before = s->scale;
  if (overflow) s->skipped++;
  if (s->dynamic) {
    if (overflow) {
      if (s->hysteresis_left <= 1) {
        /* the count stays at 1: further overflows halve at once until a
         * clean window restores it (DeepSpeed does the same) */
        s->scale = fmax(s->scale / 2.0, (double)p->min_loss_scale);
      } else {
        s->hysteresis_left--;
      }
      s->last_overflow_iter = s->iter;
    } else if ((s->iter - s->last_overflow_iter) % p->loss_scale_window == 0) {
      /* a clean window since the last overflow (or since the start) */
      s->scale *= 2.0;
      s->hysteresis_left = p->hysteresis;
    }
  }
  s->iter++;
  return before;
}

td_status td_precision_trainer_init(td_trainer *t) {
  const td_precision_config *p = &t->cfg.precision;
  td_loss_scaler_init(&t->scaler, p);
  if (t->cfg.activation_checkpointing) {
    if (!t->model->ops->set_activation_checkpointing)
      return td_error(TD_ERR_INVALID_ARGUMENT,
                      "activation checkpointing: the %s model does not support it (the GPT does); remove "
                      "activation_checkpointing from the config",
                      t->model->kind ? t->model->kind : "?");
    TD_CHECK(t->model->ops->set_activation_checkpointing(t->model, 1));
  }
  if (p->comm_dtype != TD_F32 && t->comm && t->world > 1) {
    t->grads_half = td_alloc(t->n_params * sizeof(uint16_t));
    if (!t->grads_half)
      return td_error(TD_ERR_SYSTEM, "rank %d: out of memory for the %s gradient buffer (%zu parameters)", t->rank,
                      td_dtype_name(p->comm_dtype), t->n_params);
  }
  /* test hook: TANDEM_FP16_INJECT_INF=STEP:RANK puts an inf into that
   * rank's averaged gradients at that (1-based) step, after the reduction,
   * so that only that rank sees the overflow */
  const char *inject = td_env_str("TANDEM_FP16_INJECT_INF", NULL);
  t->inject_inf_step = -1;
  if (inject && *inject) {
    long step;
    int rank;
    if (sscanf(inject, "%ld:%d", &step, &rank) != 2 || step < 1 || rank < 0)
      return td_error(TD_ERR_INVALID_ARGUMENT, "TANDEM_FP16_INJECT_INF=%s: expected STEP:RANK, e.g. 3:1", inject);
    if (rank == t->rank) t->inject_inf_step = step;
  }
  return TD_OK;
}

void td_precision_trainer_free(td_trainer *t) {
  td_free(t->grads_half);
  t->grads_half = NULL;
}

/* f32 -> half for [lo, hi) of the gradients (td_f32_to_bf16 / td_f32_to_f16: nearest even) */
static void narrow(uint16_t *restrict dst, const float *restrict src, size_t n, td_dtype dtype) {
  if (dtype == TD_BF16)
    for (size_t i = 0; i < n; i++) dst[i] = td_f32_to_bf16(src[i]);
  else
    for (size_t i = 0; i < n; i++) dst[i] = td_f32_to_f16(src[i]);
}

static void widen(float *restrict dst, const uint16_t *restrict src, size_t n, td_dtype dtype, float scale) {
  if (dtype == TD_BF16)
    for (size_t i = 0; i < n; i++) dst[i] = td_bf16_to_f32(src[i]) * scale;
  else
    for (size_t i = 0; i < n; i++) dst[i] = td_f16_to_f32(src[i]) * scale;
}

void *td_precision_bucket_buffer(td_trainer *t, size_t lo, size_t hi, td_dtype *dtype_out, td_op *op_out) {
  if (t->model_grads) { /* bf16 on a device: the model's bf16 gradients, averaged as they are (core.h) */
    *dtype_out = t->model_dtype;
    *op_out = TD_AVG;
    return (char *)t->model_grads + lo * td_dtype_size(t->model_dtype);
  }
  if (!t->grads_half) {
    *dtype_out = TD_F32;
    *op_out = TD_AVG;
    return t->grads + lo;
  }
  *dtype_out = t->cfg.precision.comm_dtype;
  *op_out = TD_SUM;
  narrow(t->grads_half + lo, t->grads + lo, hi - lo, *dtype_out);
  return t->grads_half + lo;
}

void td_precision_after_sync(td_trainer *t) {
  if (t->grads_half) widen(t->grads, t->grads_half, t->n_params, t->cfg.precision.comm_dtype, 1.0f / (float)t->world);
}

td_status td_precision_check_overflow(td_trainer *t, int *overflow_out) {
  *overflow_out = 0;
  if (t->cfg.precision.compute != TD_F16) return TD_OK;
  /* At ZeRO stage >= 2 a rank holds only its shard of the reduced
   * gradients (the rest is not resident); the flag agreed below covers the
   * whole arena all the same, since the shards tile it. */
  size_t lo = 0, hi = t->n_params;
  /* (deterministic reduction reduces only the shard at stage 1 too) */
  if (t->zero_stage >= 2 || (t->det && t->zero_stage >= 1 && t->world > 1)) lo = t->shard_lo, hi = t->shard_hi;
  if (t->step + 1 == t->inject_inf_step && hi > lo) t->grads[lo + (hi - lo) / 2] = INFINITY;
  int32_t flag = 0;
  const float *g = t->grads;
  /* x - x is 0 for finite x and NaN for inf and NaN: one pass, no branch per element */
  float acc = 0.0f;
  for (size_t i = lo; i < hi; i++) acc += g[i] - g[i];
  flag = acc != 0.0f || isnan(acc);
  if (t->comm && t->world > 1) {
    td_status st = td_allreduce(&flag, &flag, 1, TD_I32, TD_MAX, t->comm);
    if (st != TD_OK)
      return td_error(st, "rank %d: agreeing on fp16 gradient overflow failed: %s", t->rank,
                      td_comm_last_error(t->comm));
  }
  /* A model split across ranks (tensor or pipeline parallelism): the
   * replicas agreed per model rank above; the model's own group now takes
   * the decision of any of its ranks, so the whole grid skips together (a
   * stage that stepped while its neighbour skipped would train two
   * different models from then on). */
  if (t->model->ops->group_max) {
    td_status st = t->model->ops->group_max(t->model, &flag);
    if (st != TD_OK) {
      char why[768];
      td_error_copy(why, sizeof why);
      return td_error(st, "rank %d: agreeing on fp16 gradient overflow within the model's group failed: %s", t->rank,
                      why);
    }
  }
  *overflow_out = flag != 0;
  return TD_OK;
}

void td_precision_on_overflow(td_trainer *t) {
  double before = td_loss_scaler_update(&t->scaler, &t->cfg.precision, 1);
  if (t->rank == 0)
    TD_WARN("OVERFLOW! Skipping step %ld: inf/NaN in the fp16 gradients; loss scale %g -> %g", t->step + 1, before,
            t->scaler.scale);
}

void td_precision_on_clean_step(td_trainer *t) { td_loss_scaler_update(&t->scaler, &t->cfg.precision, 0); }
