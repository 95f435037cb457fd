/* The config's "elasticity" block (DeepSpeed's; elastic_config.c).
 * Internal to src/train. */
#ifndef TD_TRAIN_ELASTIC_CONFIG_H
#define TD_TRAIN_ELASTIC_CONFIG_H

#include "train/core/core.h"

/* Parse the block (a cJSON *) into cfg->elasticity. */
td_status td_elasticity_parse_json(const void *item, const char *source, td_train_config *cfg);
/* After the whole config is read (root: the cJSON * object): refuse batch
 * keys beside an enabled block unless ignore_non_elastic_batch_info, then
 * set train_batch_size to DeepSpeed's choice (micro-batch and accumulation
 * derived per world size). */
td_status td_elasticity_apply(const void *root, const char *source, td_train_config *cfg);
/* In td_train_config_resolve: when the block chose the batch and no
 * micro-batch was given, the largest of micro_batch_sizes that splits it
 * over `world`; an error listing the valid world sizes when none does. */
td_status td_elasticity_resolve(td_train_config *cfg, int world);

#endif
