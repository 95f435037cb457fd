/* Between the Prometheus server (prometheus.c) and the job's endpoint
 * (prometheus_job.c): the server with another source of the exposition text
 * in front of its table. Internal to src/obs. */
#ifndef TD_OBS_PROMETHEUS_SERVER_H
#define TD_OBS_PROMETHEUS_SERVER_H

#include "tandem/obs.h"

/* The text a scrape gets, malloc'd (length in *len_out), NULL when out of
 * memory; it should take at most budget_s seconds (Prometheus' scrape
 * timeout, less a margin, when the request said it). Called on the server
 * thread, one scrape at a time. The server's own table (td_prom_set)
 * follows this text. */
typedef char *(*prom_render_fn)(void *ctx, double budget_s, size_t *len_out);

/* td_prom_start with render as the source. On success the server owns ctx
 * and frees it with ctx_free (may be NULL) in td_prom_stop, after the
 * thread ended; on failure the caller keeps it. */
td_status prom_start_with(const char *bind_addr, int port, prom_render_fn render, void *ctx,
                          void (*ctx_free)(void *ctx), td_prom **out);

/* The ctx given to prom_start_with when p renders with `render`, else NULL
 * (so that a caller can tell a job endpoint from a rank's). */
void *prom_render_ctx(td_prom *p, prom_render_fn render);

#endif
