/* Between the Prometheus server (prometheus.c) and the job's endpoint
 * (prometheus_job.c): the server with another source of the exposition text
 * than its table. Internal to src/obs. */
#ifndef TD_OBS_PROMETHEUS_SERVER_H
#define TD_OBS_PROMETHEUS_SERVER_H

#include "tandem/obs.h"

/* The text a scrape gets, malloc'd (length in *len_out), NULL when out of
 * memory. Called on the server thread, one scrape at a time. */
typedef char *(*prom_render_fn)(void *ctx, size_t *len_out);

/* td_prom_start with render as the source. On success the server owns ctx
 * and frees it with ctx_free (may be NULL) in td_prom_stop, after the
 * thread ended; on failure the caller keeps it. */
td_status prom_start_with(const char *bind_addr, int port, prom_render_fn render, void *ctx,
                          void (*ctx_free)(void *ctx), td_prom **out);

#endif
