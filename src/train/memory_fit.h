/* Memory at the edge (issue 23): a trainer that cannot fit the memory
 * available to its ranks is refused before it allocates, the knobs the
 * user left unset are sized from that memory, and a rank nearing its limit
 * says so during the run. Internal to src/train; above zero/ and offload/
 * (it asks their estimate), called by trainer.c and
 * elastic/trainer_elastic.c only. It also holds the
 * public td_trainer_estimate_memory (train.h). */
#ifndef TD_TRAIN_MEMORY_FIT_H
#define TD_TRAIN_MEMORY_FIT_H

#include "train/core/core.h"

/* At creation, after the configuration is resolved and before the arenas:
 * measure the memory each rank may use (core/memory.c), size the unset
 * offload knobs from it, estimate this configuration and refuse it on
 * every rank (td_trainer_agree) when some rank cannot hold it, with the
 * estimate, the memory available and what would fit. Collective. */
td_status trainer_memory_fit(td_trainer *t);

/* At an elastic membership change (td_trainer_elastic_rebind), the new
 * world set in t and before its shards are cut: redo the estimate at the
 * new world and the fit against the memory measured now, and refuse on
 * every rank, before allocating, when some rank no longer fits (naming
 * what would). old_world: the world before, for the message. Collective
 * over t->comm. */
td_status trainer_memory_rebind(td_trainer *t, int old_world);

/* Before td_trainer_gather_params at stage 3: refuse on every rank when
 * some rank cannot hold the whole parameter arena on top of what it holds.
 * Collective. */
td_status trainer_gather_fits(td_trainer *t);

/* After a step: this rank's RSS into the stats; a warning in the log the
 * first time it passes 90% of the rank's memory (and again past 97%).
 * Local. */
void trainer_memory_watch(td_trainer *t, td_step_stats *stats);

#endif
