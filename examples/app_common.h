/* Shared by the example programs (train-gpt, train-fmnist): flag parsing,
 * the training loop's bookkeeping (progress, metrics, timeline, throughput),
 * the summary line and an orderly shutdown. Each program is one .c file (the
 * Makefile builds examples/X.c into build/bin/X), so this header holds static
 * functions that each program compiles in; it uses only the public API.
 *
 * Conventions of both programs: stdout carries the results (the summary line
 * and, for train-gpt, the text sample) and is written by rank 0 only; stderr
 * carries progress and diagnostics. Exit status 0 on success, 1 when training
 * fails, 2 for a command-line or config error. */
#ifndef TD_EXAMPLES_APP_COMMON_H
#define TD_EXAMPLES_APP_COMMON_H

#define _GNU_SOURCE 1
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tandem/tandem.h"
#include "tandem/obs.h"
#include "tandem/train.h"

#define APP_EXIT_FAIL 1
#define APP_EXIT_USAGE 2

static const char *app_name = "tandem";

static double app_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* A command-line error: one clear line and a pointer to --help, exit 2. */
static void app_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void app_usage_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s: ", app_name);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\n%s: run '%s --help' for the list of options\n", app_name, app_name);
  exit(APP_EXIT_USAGE);
}

/* The value after a flag; accepts "--flag VALUE" and "--flag=VALUE". Returns
 * NULL if argv[*i] is not `flag`. */
static const char *app_flag_value(int argc, char **argv, int *i, const char *flag) {
  const char *arg = argv[*i];
  size_t n = strlen(flag);
  if (strncmp(arg, flag, n) != 0) return NULL;
  if (arg[n] == '=') return arg + n + 1;
  if (arg[n] != 0) return NULL;
  if (*i + 1 >= argc) app_usage_error("option %s needs a value", flag);
  return argv[++*i];
}

static long app_parse_long(const char *flag, const char *text, long min, long max) {
  char *end;
  errno = 0;
  long v = strtol(text, &end, 10);
  if (errno || end == text || *end)
    app_usage_error("%s expects an integer, got '%s'", flag, text);
  if (v < min || v > max) app_usage_error("%s must be between %ld and %ld, got %ld", flag, min, max, v);
  return v;
}

static double app_parse_double(const char *flag, const char *text, double min, double max) {
  char *end;
  errno = 0;
  double v = strtod(text, &end);
  if (errno || end == text || *end || !isfinite(v))
    app_usage_error("%s expects a number, got '%s'", flag, text);
  if (v < min || v > max) app_usage_error("%s must be between %g and %g, got %g", flag, min, max, v);
  return v;
}

/* ---- the flags both programs take ----
 * --config, --metrics, --save, --resume, --allow-batch-size-change,
 * --keep-last, --micro-batch, --seed, --lr and --threads mean the same in train-gpt and train-fmnist; each program parses
 * its own flags around these. */
typedef struct app_common_options {
  const char *config_path;
  const char *metrics_path;
  const char *save_dir;
  const char *resume_dir;
  long micro_batch; /* -1: not given */
  long threads;     /* -1: not given */
  long keep_last;   /* -1: not given */
  long long seed;   /* -1: not given */
  double lr;        /* < 0: not given */
  int half;         /* --bf16 / --fp16: TD_BF16 / TD_F16 (-1: not given) */
  long zero_stage;  /* -1: not given */
  int allow_batch_size_change; /* --allow-batch-size-change */
} app_common_options;

static void app_common_init(app_common_options *c) {
  memset(c, 0, sizeof *c);
  c->micro_batch = c->threads = c->keep_last = c->zero_stage = -1;
  c->seed = -1;
  c->lr = -1;
  c->half = -1;
}

/* If argv[*i] is one of the common flags, store it (consuming its value)
 * and return 1; otherwise 0. */
static int app_common_flag(int argc, char **argv, int *i, app_common_options *c) {
  const char *v;
  if ((v = app_flag_value(argc, argv, i, "--config"))) c->config_path = v;
  else if ((v = app_flag_value(argc, argv, i, "--metrics"))) c->metrics_path = v;
  else if ((v = app_flag_value(argc, argv, i, "--save"))) c->save_dir = v;
  else if ((v = app_flag_value(argc, argv, i, "--resume"))) c->resume_dir = v;
  else if ((v = app_flag_value(argc, argv, i, "--keep-last"))) c->keep_last = app_parse_long("--keep-last", v, 0, 1 << 30);
  else if ((v = app_flag_value(argc, argv, i, "--micro-batch"))) c->micro_batch = app_parse_long("--micro-batch", v, 1, 1 << 20);
  else if ((v = app_flag_value(argc, argv, i, "--seed"))) c->seed = app_parse_long("--seed", v, 0, 1L << 62);
  else if ((v = app_flag_value(argc, argv, i, "--lr"))) c->lr = app_parse_double("--lr", v, 0, 10);
  else if ((v = app_flag_value(argc, argv, i, "--threads"))) c->threads = app_parse_long("--threads", v, 0, 1024);
  else if (!strcmp(argv[*i], "--bf16")) c->half = TD_BF16;
  else if (!strcmp(argv[*i], "--fp16")) c->half = TD_F16;
  else if (!strcmp(argv[*i], "--allow-batch-size-change")) c->allow_batch_size_change = 1;
  else if ((v = app_flag_value(argc, argv, i, "--zero-stage"))) c->zero_stage = app_parse_long("--zero-stage", v, 0, 3);
  else return 0;
  return 1;
}

/* The config file over the program's defaults already in cfg, then the
 * common flags over both. A config error is a usage error (exit 2) with the
 * engine's message, which names the file and the key. */
static void app_config_apply(const app_common_options *c, td_train_config *cfg) {
  if (c->config_path) {
    td_status s = td_train_config_load_json(c->config_path, cfg);
    if (s != TD_OK) app_usage_error("%s", td_last_error());
  }
  if (c->micro_batch > 0) cfg->micro_batch = (int)c->micro_batch;
  if (c->seed >= 0) cfg->seed = (uint64_t)c->seed;
  if (c->lr >= 0) cfg->optimizer.lr = (float)c->lr;
  if (c->threads >= 0) cfg->threads = (int)c->threads;
  if (c->keep_last >= 0) cfg->keep_last = (int)c->keep_last;
  if (c->half >= 0) cfg->precision.compute = (td_dtype)c->half; /* mixed precision, as "bf16"/"fp16" enabled */
  if (c->zero_stage >= 0) cfg->zero_stage = (int)c->zero_stage;
  if (c->allow_batch_size_change) cfg->allow_batch_size_change = 1;
  if (c->save_dir) snprintf(cfg->checkpoint_dir, sizeof cfg->checkpoint_dir, "%s", c->save_dir);
}

/* ---- timeline spans of forward and backward ----
 * The engine reports per-step totals (compute, communication wait). To show
 * where forward and backward actually ran, the program swaps the model's
 * operation table for one that calls the real operations and records each
 * call as a span. The model object itself stays the same (src/nn and the
 * checkpoint code look at its concrete type), so the state lives here, one
 * traced model per program. Used only when a timeline is being written. */
static const td_model_ops *traced_inner_ops;
static td_timeline *traced_timeline;

static td_status traced_prepare(td_model *m, int batch) { return traced_inner_ops->prepare(m, batch); }
static float traced_forward(td_model *m, const float *params, const void *inputs, const int32_t *targets, int batch) {
  double t0 = td_timeline_now();
  float loss = traced_inner_ops->forward(m, params, inputs, targets, batch);
  td_timeline_span(traced_timeline, "compute", "forward", t0, td_timeline_now());
  return loss;
}
static void traced_backward(td_model *m, const float *params, float *grads, float loss_scale, td_grad_ready_fn ready,
                            void *ctx) {
  double t0 = td_timeline_now();
  traced_inner_ops->backward(m, params, grads, loss_scale, ready, ctx);
  td_timeline_span(traced_timeline, "compute", "backward", t0, td_timeline_now());
}
static void traced_predict(td_model *m, int32_t *out) { traced_inner_ops->predict(m, out); }
static void traced_destroy(td_model *m) {
  m->ops = traced_inner_ops;
  m->ops->destroy(m);
}
static td_model_ops traced_ops;

static void app_trace_model(td_model *model, td_timeline *timeline) {
  traced_inner_ops = model->ops;
  traced_timeline = timeline;
  traced_ops = (td_model_ops){traced_prepare, traced_forward, traced_backward,
                              model->ops->predict ? traced_predict : NULL, traced_destroy,
                              model->ops->set_activation_checkpointing, model->ops->activation_bytes};
  model->ops = &traced_ops;
}

/* ---- the run: one communicator, one trainer, and what watches them ---- */
typedef struct app_run {
  td_comm *comm;
  int rank, world;
  td_trainer *trainer;
  td_progress *progress; /* rank 0 */
  td_metrics *metrics;   /* rank 0, with --metrics */
  td_timeline *timeline; /* every rank, with TANDEM_TIMELINE */
  int use_tokens;        /* throughput in tokens (GPT) or samples (CNN) */
  /* throughput over the steps after the first two of this run */
  long steps_this_run;
  double t_after_warmup;     /* end of this run's second step */
  double items_after_warmup; /* items of the steps after it */
  double t_first_begin;      /* start of this run's first step */
  double t_last_end;         /* end of the latest step */
  double items_total;        /* items of all of this run's steps */
  /* this process's CPU seconds (all threads) at the end of the second step
   * and of the latest: a speed figure that load from other jobs on the
   * machine does not stretch the way it stretches wall time */
  double cpu_after_warmup, cpu_last_end;
  td_step_stats last;
} app_run;

/* A runtime failure: rank-tagged message on stderr, status 1. The
 * communicator is aborted so that the other ranks stop within seconds rather
 * than waiting for this one. */
static void app_fail(app_run *run, const char *what, td_status st) __attribute__((noreturn));
static void app_fail(app_run *run, const char *what, td_status st) {
  const char *msg = td_last_error();
  if (run && run->comm && td_comm_status(run->comm) != TD_OK && !*msg) msg = td_comm_last_error(run->comm);
  fprintf(stderr, "%s: error: %s failed (%s): %s\n", app_name, what, td_status_str(st), *msg ? msg : "no details");
  if (run && run->comm && run->world > 1) td_comm_abort(run->comm, what);
  exit(APP_EXIT_FAIL);
}

/* Record one finished step: throughput bookkeeping, timeline, metrics file
 * and progress display. */
static void app_after_step(app_run *run, const td_step_stats *st, double t_begin, double t_end) {
  run->last = *st;
  if (run->steps_this_run++ == 0) run->t_first_begin = t_begin;
  run->t_last_end = t_end;
  struct timespec cpu;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu);
  run->cpu_last_end = (double)cpu.tv_sec + cpu.tv_nsec * 1e-9;
  if (run->steps_this_run == 2) run->cpu_after_warmup = run->cpu_last_end;
  double items = run->use_tokens ? (double)st->tokens : (double)st->samples;
  run->items_total += items;
  if (run->steps_this_run == 2) {
    run->t_after_warmup = t_end;
    run->items_after_warmup = 0;
  } else if (run->steps_this_run > 2) {
    run->items_after_warmup += items;
  }
  td_step_metrics m;
  td_step_metrics_clear(&m);
  m.step = st->step;
  m.loss = st->loss;
  m.lr = st->lr;
  m.items_per_s = st->step_s > 0 ? items / st->step_s : -1;
  m.step_s = st->step_s;
  m.compute_s = st->compute_s;
  m.comm_wait_s = st->comm_wait_s;
  m.grad_norm = st->grad_norm;
  m.memory_mib = st->memory_bytes / 1048576.0;
  if (st->memory_limit_bytes) {
    m.memory_limit_mib = st->memory_limit_bytes / 1048576.0;
    m.memory_warning = st->memory_warning;
  }
  if (run->timeline) {
    char name[48];
    snprintf(name, sizeof name, "step %ld", st->step);
    td_timeline_span(run->timeline, "step", name, t_begin, t_end);
    td_timeline_counter(run->timeline, "loss", t_end, st->loss);
  }
  if (run->metrics) {
    td_status s = td_metrics_write_step(run->metrics, &m);
    if (s != TD_OK) app_fail(run, "writing the metrics file", s);
  }
  td_progress_update(run->progress, &m);
}

static void app_step(app_run *run) {
  td_step_stats st;
  double t0 = td_timeline_now();
  td_status s = td_trainer_step(run->trainer, &st);
  if (s != TD_OK) {
    char what[64];
    snprintf(what, sizeof what, "training step %ld", td_trainer_step_count(run->trainer) + 1);
    app_fail(run, what, s);
  }
  app_after_step(run, &st, t0, td_timeline_now());
}

/* Items per second of the whole job (all ranks) over this run's steps after
 * the first two, which pay for warm-up (or over all of them when there were
 * no more than two). Measured on this rank's clock: every step ends with a
 * collective, so all ranks see the same step boundaries. */
static double app_throughput(const app_run *run) {
  if (run->steps_this_run > 2) {
    double dt = run->t_last_end - run->t_after_warmup;
    if (dt > 0) return run->items_after_warmup / dt;
  }
  double dt = run->t_last_end - run->t_first_begin;
  return dt > 0 && run->steps_this_run > 0 ? run->items_total / dt : 0;
}

/* This process's CPU milliseconds per step over the steps app_throughput
 * counts (after the first two; 0 when there were no more than two). */
static inline double app_cpu_ms_per_step(const app_run *run) {
  return run->steps_this_run > 2 ? (run->cpu_last_end - run->cpu_after_warmup) * 1e3 / (double)(run->steps_this_run - 2)
                                 : 0.0;
}

/* Start-up shared by the programs: communicator from the environment (a world
 * of one without a launcher), timeline, and rank 0's metrics and progress. */
static void app_begin(app_run *run, const char *metrics_path, int use_tokens) {
  memset(run, 0, sizeof *run);
  run->use_tokens = use_tokens;
  td_status s = td_comm_init(&run->comm);
  if (s != TD_OK) app_fail(NULL, "joining the job (td_comm_init)", s);
  run->rank = td_comm_rank(run->comm);
  run->world = td_comm_size(run->comm);
  s = td_timeline_open(NULL, run->rank, run->world, &run->timeline);
  if (s != TD_OK) app_fail(run, "opening the timeline (TANDEM_TIMELINE)", s);
  if (run->rank == 0 && metrics_path) {
    s = td_metrics_open(metrics_path, use_tokens ? "tokens" : "samples", 0, &run->metrics);
    if (s != TD_OK) app_fail(run, "opening the metrics file", s);
  }
}

/* The engine's own phases (td_trainer_set_trace): waiting for gradient
 * buckets goes on the "comm" row, checkpoint writing on "io", the rest (data,
 * optimizer) beside forward and backward on "compute". */
static void app_trace_phase(void *ctx, const char *name, double begin_s, double end_s) {
  const char *lane = "compute";
  if (!strcmp(name, "comm_wait")) lane = "comm";
  else if (!strcmp(name, "checkpoint")) lane = "io";
  td_timeline_span((td_timeline *)ctx, lane, name, begin_s, end_s);
}

static void app_trace_trainer(app_run *run) {
  if (run->timeline) td_trainer_set_trace(run->trainer, app_trace_phase, run->timeline);
}

/* The model the engine should drive, traced when a timeline is written. */
static td_model *app_engine_model(app_run *run, td_model *model) {
  if (run->timeline) app_trace_model(model, run->timeline);
  return model;
}

static void app_start_progress(app_run *run, long total_steps, int steps_per_print) {
  if (run->rank != 0) return;
  td_progress_config pc = {.total_steps = total_steps, .steps_per_print = steps_per_print,
                           .unit = run->use_tokens ? "tokens" : "samples", .label = app_name,
                           .mode = TD_PROGRESS_AUTO, .stream = stderr};
  td_status s = td_progress_create(&pc, &run->progress);
  if (s != TD_OK) app_fail(run, "starting the progress display", s);
}

/* Close the writers, join the per-rank timelines on rank 0, and leave the
 * job in order. The trainer must already be destroyed (or be destroyed by
 * the caller afterwards; it does not communicate on destroy). */
static void app_end(app_run *run) {
  td_progress_destroy(run->progress);
  run->progress = NULL;
  td_status s = td_metrics_close(run->metrics);
  run->metrics = NULL;
  if (s != TD_OK) app_fail(run, "closing the metrics file", s);
  int had_timeline = run->timeline != NULL;
  s = td_timeline_close(run->timeline);
  run->timeline = NULL;
  if (s != TD_OK) app_fail(run, "closing the timeline", s);
  if (run->world > 1) {
    /* Every rank has closed its file once all passed the barrier. */
    s = td_barrier(run->comm);
    if (s != TD_OK) app_fail(run, "the final barrier", s);
    if (had_timeline && run->rank == 0) {
      const char *path = td_timeline_default_path();
      s = td_timeline_merge(path, run->world);
      if (s != TD_OK) fprintf(stderr, "%s: warning: could not merge the timeline: %s\n", app_name, td_last_error());
      else fprintf(stderr, "%s: timeline written to %s (per rank: %s.0 .. %s.%d)\n", app_name, path, path, path,
                   run->world - 1);
    }
  }
  s = td_comm_finalize(run->comm);
  if (s != TD_OK) app_fail(run, "finalizing the communicator", s);
  td_comm_destroy(run->comm);
  run->comm = NULL;
}

#endif
