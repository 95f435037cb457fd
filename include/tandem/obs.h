/* Tandem public API: observability (src/obs) — the progress display, the
 * per-step metrics file (JSON lines) and the timeline (Chrome trace events).
 *
 * All three are plain writers with no knowledge of training: the programs and
 * the training engine feed them numbers. None of them ever writes to stdout
 * unless the caller hands it stdout; a NULL handle is accepted everywhere and
 * does nothing, so that callers need no "if enabled" around each call. */
#ifndef TANDEM_OBS_H
#define TANDEM_OBS_H

#include <stdio.h>

#include "base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What one optimizer step measured. Fields a caller does not know are left
 * negative and are then omitted (metrics) or not shown (progress). */
typedef struct td_step_metrics {
  long step;          /* 1-based number of the step just completed (continues after a resume) */
  double loss;        /* mean loss over the global batch (all ranks, all micro-steps) */
  double lr;          /* learning rate used by this step */
  double items_per_s; /* tokens (or samples) per second of this step, all ranks together */
  double step_s;      /* wall time of the whole step on this rank */
  double compute_s;   /* time in forward, backward and the optimizer on this rank */
  double comm_wait_s; /* time this rank was blocked waiting for communication */
  double optimizer_s; /* part of compute_s: gradient norm, clipping and the update */
  double data_s;      /* part of compute_s: copying samples into the micro-batch */
  double io_s;        /* writing the checkpoint this step saved (after the step, not part of step_s) */
  double fetch_wait_s; /* part of compute_s: ZeRO stage 3 waiting for parameter fetches */
  long param_fetches;    /* ZeRO stage 3: parameter ranges broadcast this step (td_step_stats) */
  long param_prefetches; /* of those, launched ahead of their fetch */
  double grad_norm;   /* global gradient L2 norm before clipping */
  double memory_mib;       /* this rank's share of physical memory after the step (Pss) */
  double memory_limit_mib; /* the memory available to this rank (-1: unknown) */
  int memory_warning;      /* 1: RSS past 90% of the limit, 2: past 97% (-1: unknown) */
} td_step_metrics;

/* Initialize every field to "unknown" (-1) and step to 0. */
void td_step_metrics_clear(td_step_metrics *m);

/* ---- progress display ----
 * LIVE: one line redrawn in place with '\r' (at most ~10 times a second), for a
 *       terminal; PLAIN: one line every steps_per_print steps plus the first and
 *       the last, for logs and pipes (tandemrun prefixes whole lines, so a
 *       rank's output is a pipe there). */
typedef enum td_progress_mode {
  TD_PROGRESS_AUTO = 0, /* TANDEM_PROGRESS=live|plain|off if set, else LIVE on a terminal, else PLAIN */
  TD_PROGRESS_LIVE = 1,
  TD_PROGRESS_PLAIN = 2,
  TD_PROGRESS_OFF = 3,
} td_progress_mode;

typedef struct td_progress_config {
  long total_steps;      /* last step number of the run (step/total and ETA) */
  int steps_per_print;   /* PLAIN mode period; <= 0 means 10 */
  const char *unit;      /* throughput unit, "tokens" or "samples"; NULL: "items" */
  const char *label;     /* line prefix such as "train-gpt"; NULL: none */
  td_progress_mode mode;
  FILE *stream;          /* NULL: stderr. Progress is diagnostic, so it stays off stdout,
                            which programs keep for their result lines. */
} td_progress_config;

typedef struct td_progress td_progress;
/* Create a display; it prints nothing until the first update. */
td_status td_progress_create(const td_progress_config *config, td_progress **out);
/* Report a completed step. Not thread-safe: call from one thread. */
void td_progress_update(td_progress *progress, const td_step_metrics *m);
/* Print a message line without garbling the live line (which is redrawn at
 * the next update). */
void td_progress_note(td_progress *progress, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* End the display: the live line is completed with a newline. Idempotent. */
void td_progress_finish(td_progress *progress);
void td_progress_destroy(td_progress *progress); /* finishes, then frees; accepts NULL */
/* The mode chosen after resolving AUTO. */
td_progress_mode td_progress_get_mode(const td_progress *progress);
/* "1h02m", "3m07s", "12s" into buf; "?" for a negative or non-finite value. */
void td_format_duration(double seconds, char *buf, size_t size);

/* ---- metrics: one JSON object per line ----
 * Each step line holds: "step", "loss", "lr", "<unit>_per_s", "step_s",
 * "compute_s", "comm_wait_s", "grad_norm" (those known), "time" (seconds since
 * the epoch) and "elapsed_s" (since the writer was opened). Floats are printed
 * with enough digits to round-trip a float exactly, so that two runs' losses
 * can be compared for equality. Lines are flushed as written, so that a
 * crashed run keeps its history and a reader can follow the file. */
typedef struct td_metrics td_metrics;
/* Create (truncate) `path`; `unit` is "tokens" or "samples" (the throughput key).
 * `append` != 0 appends instead (used when resuming into the same file). */
td_status td_metrics_open(const char *path, const char *unit, int append, td_metrics **out);
td_status td_metrics_write_step(td_metrics *metrics, const td_step_metrics *m);
/* Write a non-step record: {"event":EVENT,"step":STEP,KEY:VALUE,...,"time":...}
 * e.g. an evaluation ("eval", step, {"epoch","test_accuracy"}, {3, 0.912}). */
td_status td_metrics_write_values(td_metrics *metrics, const char *event, long step, int n_values,
                                  const char *const *keys, const double *values);
/* Flush and close; returns the first write error seen. Accepts NULL. */
td_status td_metrics_close(td_metrics *metrics);

/* ---- timeline: Chrome trace-event format (chrome://tracing, Perfetto) ----
 * Like Horovod's HOROVOD_TIMELINE: TANDEM_TIMELINE=FILE makes rank r of a
 * world of N write FILE.r (FILE itself for a world of one), a JSON array of
 * complete ("X") events, process = rank, one thread row per lane ("compute",
 * "comm", ...). Timestamps are wall-clock microseconds so that ranks line up.
 * td_timeline_merge() then joins the per-rank files into FILE. */
typedef struct td_timeline td_timeline;
/* Open the timeline for `rank` of `world`. path NULL: TANDEM_TIMELINE; when
 * that is unset too, *out = NULL and TD_OK (timeline off). */
td_status td_timeline_open(const char *path, int rank, int world, td_timeline **out);
/* Record the span [begin_s, end_s) (td_now()-style monotonic seconds, as
 * returned by td_timeline_now()) named `name` on row `lane`. Thread-safe (the
 * engine's communication thread may record while compute records). Names
 * and lanes are copied; at most 16 distinct lanes. */
void td_timeline_span(td_timeline *timeline, const char *lane, const char *name, double begin_s, double end_s);
/* A counter sample (e.g. "loss") shown as a graph row. Thread-safe. */
void td_timeline_counter(td_timeline *timeline, const char *name, double t_s, double value);
/* Monotonic seconds, the clock td_timeline_span expects. */
double td_timeline_now(void);
/* Complete the JSON array and close. Returns the first write error. Accepts NULL. */
td_status td_timeline_close(td_timeline *timeline);
/* Join PATH.0 .. PATH.(world-1) (each a closed timeline) into one array in
 * PATH (path NULL: TANDEM_TIMELINE). Call on one rank after every rank closed
 * its file (e.g. after a barrier). The per-rank files are kept. */
td_status td_timeline_merge(const char *path, int world);
/* The value of TANDEM_TIMELINE, or NULL when unset. */
const char *td_timeline_default_path(void);

/* ---- Prometheus endpoint: text exposition format 0.0.4 on GET /metrics ----
 * A server thread (blocked in poll between scrapes) answers GET /metrics with
 * the values last stored, 404 for other paths, 405 for other methods; each
 * request must arrive within 2 s and fit 4 KiB. It binds to 127.0.0.1 unless
 * bind_addr names another IPv4 address: the endpoint is read-only and
 * unauthenticated (Prometheus scrapes plain HTTP), so reaching it from other
 * hosts is an explicit choice. */
typedef struct td_prom td_prom;
/* Listen on bind_addr:port (bind_addr NULL: 127.0.0.1; port 0: a free port,
 * see td_prom_port) and start the server thread. A port in use is
 * TD_ERR_SYSTEM with a message naming it: callers report it and go on. */
td_status td_prom_start(const char *bind_addr, int port, td_prom **out);
/* Store the value of the series NAME{LABELS} (labels: `key="value",...`
 * without braces, or NULL/""), type "gauge" or "counter", with a HELP text.
 * Thread-safe, no I/O; at most 256 series (more are dropped with one warning).
 * NAME must match [a-zA-Z_:][a-zA-Z0-9_:]* or the call is ignored. */
void td_prom_set(td_prom *prom, const char *name, const char *type, const char *help, const char *labels,
                 double value);
/* Add delta to the counter NAME{LABELS} (created at 0). Thread-safe. */
void td_prom_add(td_prom *prom, const char *name, const char *help, const char *labels, double delta);
/* Remove every series (an elastic process renumbered by a membership
 * change: its series carry new labels from then on). Thread-safe. */
void td_prom_clear(td_prom *prom);
/* Bracket a batch of td_prom_set/td_prom_add calls (from one thread) so that
 * a scrape sees all of them or none: one step's loss with its step number. */
void td_prom_begin(td_prom *prom);
void td_prom_end(td_prom *prom);
/* The exposition text now (what a scrape would get), malloc'd, length in
 * *len_out; NULL when out of memory. */
char *td_prom_render(td_prom *prom, size_t *len_out);
int td_prom_port(const td_prom *prom);       /* the port listened on; -1 for NULL */
unsigned long td_prom_scrapes(td_prom *prom); /* GET /metrics answered so far */
/* CPU seconds the server thread used so far (getrusage RUSAGE_THREAD after
 * each request it answered, bad ones included): what serving costs the
 * process, measured where it is spent. 0 for NULL. */
double td_prom_serve_cpu_seconds(td_prom *prom);
void td_prom_stop(td_prom *prom);             /* stops the thread, closes the socket, frees; accepts NULL */
/* One endpoint for a whole job (tandemrun --prometheus-port): listens like
 * td_prom_start, and each scrape (and td_prom_render) fetches GET /metrics
 * from every targets[r] ("HOST:PORT", rank r's endpoint) at once, within 2 s
 * in all (or Prometheus' announced scrape timeout less a margin, if
 * shorter), and answers with every rank's series merged by family, plus
 * tandem_job_rank_up{rank} (1: answered, 0: not), tandem_job_scrape_seconds
 * and the endpoint's own table (td_prom_set/td_prom_add on it: the
 * launcher's series). */
td_status td_prom_job_start(const char *bind_addr, int port, const char *const *targets, int n_targets,
                            td_prom **out);
/* Replace a job endpoint's targets (an elastic job's processes come and go;
 * 0 targets allowed). labels[i] is what tandem_job_rank_up of target i
 * carries, e.g. `process="3"` (labels NULL: rank="i"). The next scrape uses
 * them. Thread-safe. TD_ERR_INVALID_USAGE on a rank's endpoint. */
td_status td_prom_job_set_targets(td_prom *prom, const char *const *targets, const char *const *labels,
                                  int n_targets);

/* ---- TensorBoard event files ----
 * DIR/events.out.tfevents.<seconds>.<host>.<pid>: TFRecords (length, masked
 * CRC-32C of the length, a serialized tensorflow.Event, masked CRC-32C of
 * it) holding Summary scalars and histograms, as tf.summary writes them.
 * Each call writes one Event and flushes it, so that TensorBoard can follow
 * a running job. Not thread-safe: one writer thread per handle. */
typedef struct td_tensorboard td_tensorboard;
/* Create DIR if missing (its parent must exist) and a new event file in it
 * (whose first record carries file_version "brain.Event:2"). */
td_status td_tensorboard_open(const char *dir, td_tensorboard **out);
/* One Event at `step` with n_values scalars (Summary.Value.simple_value is a
 * float: values are rounded to float). Accepts a NULL handle (no-op). */
td_status td_tensorboard_scalars(td_tensorboard *tb, long step, int n_values, const char *const *tags,
                                 const double *values);
/* One Event at `step` with a histogram of the n values (30 equal-width
 * buckets between their min and max; non-finite values left out). */
td_status td_tensorboard_histogram(td_tensorboard *tb, const char *tag, long step, const double *values, size_t n);
/* An Event at `step` with SessionLog{status: START}: training (re)starts
 * with step number `step` (an elastic job after a membership change, a job
 * resumed from a checkpoint: the restored step + 1). TensorBoard then drops
 * the events at `step` and above that it read before this one, from any
 * file of the run ("orphaned" steps the restart redoes), so the step axis
 * stays continuous. Accepts NULL (no-op). */
td_status td_tensorboard_session_start(td_tensorboard *tb, long step);
const char *td_tensorboard_path(const td_tensorboard *tb); /* the event file; NULL for NULL */
/* Close; returns the first write error seen. Accepts NULL. */
td_status td_tensorboard_close(td_tensorboard *tb);

#ifdef __cplusplus
}
#endif
#endif
