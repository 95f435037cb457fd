/* Mixed precision and activation checkpointing (src/train/precision/): the
 * config's keys (precision_config.c), the loss scaler and the trainer's
 * hooks (precision.c). Internal to src/train. */
#ifndef TD_TRAIN_PRECISION_H
#define TD_TRAIN_PRECISION_H

#include "train/core/core.h"

void td_loss_scaler_init(td_loss_scaler *s, const td_precision_config *p);
/* Record one step's agreed outcome; returns the scale before the update. */
double td_loss_scaler_update(td_loss_scaler *s, const td_precision_config *p, int overflow);

void td_precision_config_defaults(td_precision_config *p);
/* One of the config's "fp16", "bf16", "communication_data_type" or
 * "activation_checkpointing" items (a cJSON *) into cfg. */
td_status td_precision_parse_json(const void *item, const char *source, td_train_config *cfg);
/* Checks of td_train_config_resolve: types, ranges, fp16 and bf16 not both. */
td_status td_precision_config_check(const td_train_config *cfg);

/* The trainer's hooks (precision.c). init: scaler, checkpointing switch on
 * the model, the half-precision gradient buffer (before the model's
 * prepare). bucket_buffer: what a gradient bucket [lo, hi) is reduced in
 * (the f32 arena, averaged, or its rounded half shadow, summed) and its
 * dtype and op; after_sync
 * widens the shadow back once every bucket is waited for. check_overflow:
 * fp16 only, collective: 1 when any rank's gradients hold an inf or NaN. */
td_status td_precision_trainer_init(td_trainer *t);
void td_precision_trainer_free(td_trainer *t);
void *td_precision_bucket_buffer(td_trainer *t, size_t lo, size_t hi, td_dtype *dtype_out, td_op *op_out);
void td_precision_after_sync(td_trainer *t);
td_status td_precision_check_overflow(td_trainer *t, int *overflow_out);
void td_precision_on_overflow(td_trainer *t);   /* the scaler's update and the one log line (rank 0) */
void td_precision_on_clean_step(td_trainer *t); /* the scaler's update */

#endif
