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
#include <unistd.h>

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
  long prometheus_port;        /* --prometheus-port or TANDEM_PROMETHEUS_PORT; -1: no endpoint */
  const char *prometheus_bind; /* --prometheus-bind or TANDEM_PROMETHEUS_BIND; NULL: 127.0.0.1 */
  const char *tensorboard_dir; /* --tensorboard */
} app_common_options;

static void app_common_init(app_common_options *c) {
  memset(c, 0, sizeof *c);
  c->micro_batch = c->threads = c->keep_last = c->zero_stage = c->prometheus_port = -1;
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
  else if ((v = app_flag_value(argc, argv, i, "--prometheus-port")))
    c->prometheus_port = app_parse_long("--prometheus-port", v, 0, 65535);
  else if ((v = app_flag_value(argc, argv, i, "--prometheus-bind"))) c->prometheus_bind = v;
  else if ((v = app_flag_value(argc, argv, i, "--tensorboard"))) c->tensorboard_dir = v;
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
  traced_ops = *model->ops; /* the optional ops (init_params, ...) pass through untraced */
  traced_ops.prepare = traced_prepare;
  traced_ops.forward = traced_forward;
  traced_ops.backward = traced_backward;
  traced_ops.predict = model->ops->predict ? traced_predict : NULL;
  traced_ops.destroy = traced_destroy;
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
  td_prom *prom; /* every rank, with --prometheus-port */
  double prom_update_cpu_s; /* CPU time the training thread spent in app_prom_step */
  long prom_updates;
  td_tensorboard *tensorboard; /* rank 0, with --tensorboard */
  char prom_labels[64]; /* rank="R" (and process="ID" under --elastic) */
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

/* ---- the Prometheus endpoint (--prometheus-port) ---- */

/* Resident set size of this process in bytes (/proc/self/statm), -1 if unknown. */
static double app_rss_bytes(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  if (!f) return -1;
  long pages_total = 0, pages_resident = 0;
  int n = fscanf(f, "%ld %ld", &pages_total, &pages_resident);
  fclose(f);
  return n == 2 ? (double)pages_resident * (double)sysconf(_SC_PAGESIZE) : -1;
}

/* ---- TensorBoard (--tensorboard DIR, rank 0) ---- */

/* L2 norm of each parameter tensor of `arena` (the model's tensor table) into
 * norms (n_tensors doubles). */
static void app_tensor_norms(const td_model *model, const float *arena, double *norms) {
  for (int i = 0; i < model->n_tensors; i++) {
    const float *x = arena + model->tensors[i].offset;
    double sum = 0;
    for (size_t k = 0; k < model->tensors[i].count; k++) sum += (double)x[k] * x[k];
    norms[i] = sqrt(sum);
  }
}

/* The step's scalars (the metrics file's values, same names), then per
 * tensor ("layer") the parameter and gradient L2 norms, each set as scalars
 * param_norm/NAME, grad_norm/NAME and as one histogram over the tensors. */
static void app_tensorboard_step(app_run *run, const td_step_stats *st, const td_step_metrics *m) {
  if (!run->tensorboard) return;
  const char *tags[] = {"loss", "lr", run->use_tokens ? "tokens_per_s" : "samples_per_s", "step_s", "compute_s",
                        "comm_wait_s", "optimizer_s", "data_s", "io_s", "grad_norm", "loss_scale"};
  double values[] = {st->loss, st->lr, m->items_per_s, st->step_s, st->compute_s, st->comm_wait_s,
                     st->optimizer_s, st->data_s, st->io_s, st->grad_norm, st->loss_scale};
  td_status s = td_tensorboard_scalars(run->tensorboard, st->step, 11, tags, values);
  const td_model *model = td_trainer_model(run->trainer);
  const float *params = td_trainer_params(run->trainer);
  const float *grads = st->loss_scale == 1.0 ? td_trainer_grads(run->trainer) : NULL;
  int zero3 = td_trainer_zero_stage(run->trainer) >= 3; /* parameters sharded: no whole arena on rank 0 */
  int n = model->n_tensors;
  double *norms = n > 0 ? malloc(sizeof(double) * (size_t)n) : NULL;
  char **names = n > 0 ? calloc((size_t)n, sizeof(char *)) : NULL;
  for (int pass = 0; pass < 2 && s == TD_OK && norms && names; pass++) {
    const float *arena = pass == 0 ? (zero3 ? NULL : params) : grads;
    if (!arena) continue;
    const char *kind = pass == 0 ? "param_norm" : "grad_norm";
    app_tensor_norms(model, arena, norms);
    for (int i = 0; i < n; i++) {
      free(names[i]);
      names[i] = malloc(strlen(kind) + strlen(model->tensors[i].name) + 2);
      if (names[i]) sprintf(names[i], "%s/%s", kind, model->tensors[i].name);
    }
    int all_named = 1;
    for (int i = 0; i < n; i++) all_named &= names[i] != NULL;
    if (all_named) s = td_tensorboard_scalars(run->tensorboard, st->step, n, (const char *const *)names, norms);
    char tag[32];
    snprintf(tag, sizeof tag, "layers/%s", kind);
    if (s == TD_OK) s = td_tensorboard_histogram(run->tensorboard, tag, st->step, norms, (size_t)n);
  }
  for (int i = 0; names && i < n; i++) free(names[i]);
  free(names);
  free(norms);
  if (s != TD_OK) app_fail(run, "writing the TensorBoard events", s);
}

static void app_start_tensorboard(app_run *run, const app_common_options *c) {
  if (run->rank != 0 || !c->tensorboard_dir) return;
  td_status s = td_tensorboard_open(c->tensorboard_dir, &run->tensorboard);
  if (s != TD_OK) app_fail(run, "opening the TensorBoard directory", s);
  fprintf(stderr, "%s: TensorBoard events in %s\n", app_name, td_tensorboard_path(run->tensorboard));
}

/* Start this process's endpoint on PORT + slot (PORT 0: a free port each):
 * slot is the rank, or under --elastic the process's launch number, which
 * stays while ranks are renumbered (who: "rank" or "process", for the
 * messages). A failure (the port in use) is reported and training goes on
 * without it. The caller sets the labels (run->prom_labels). */
static void app_start_prometheus_slot(app_run *run, const app_common_options *c, long slot, const char *who) {
  long port = c->prometheus_port;
  const char *env = getenv("TANDEM_PROMETHEUS_PORT");
  if (port < 0 && env && *env) port = app_parse_long("TANDEM_PROMETHEUS_PORT", env, 0, 65535);
  if (port < 0) return;
  const char *bind_addr = c->prometheus_bind ? c->prometheus_bind : getenv("TANDEM_PROMETHEUS_BIND");
  long slot_port = port == 0 ? 0 : port + slot;
  if (slot_port > 65535) {
    fprintf(stderr, "%s: warning: %s %ld: no metrics endpoint: port %ld + %s %ld exceeds 65535\n", app_name, who,
            slot, port, who, slot);
    return;
  }
  td_status s = td_prom_start(bind_addr, (int)slot_port, &run->prom);
  if (s == TD_ERR_INVALID_ARGUMENT) app_usage_error("%s", td_last_error()); /* a bad --prometheus-bind */
  if (s != TD_OK) {
    fprintf(stderr, "%s: warning: %s %ld: no metrics endpoint, training goes on: %s\n", app_name, who, slot,
            td_last_error());
    return;
  }
  fprintf(stderr, "%s: %s %ld serves metrics on http://%s:%d/metrics\n", app_name, who, slot,
          bind_addr && *bind_addr ? bind_addr : "127.0.0.1", td_prom_port(run->prom));
}

/* Start this rank's endpoint on PORT + rank. */
static void app_start_prometheus(app_run *run, const app_common_options *c) {
  app_start_prometheus_slot(run, c, run->rank, "rank");
  snprintf(run->prom_labels, sizeof run->prom_labels, "rank=\"%d\"", run->rank);
  td_prom_set(run->prom, "tandem_world_size", "gauge", "ranks in the job", run->prom_labels, run->world);
}

/* A gauge of this rank, labelled rank="R" plus `extra` (e.g. phase="compute"). */
static void app_prom_set(app_run *run, const char *name, const char *type, const char *help, const char *extra,
                         double value) {
  char labels[160];
  snprintf(labels, sizeof labels, "%s%s%s", run->prom_labels, extra ? "," : "", extra ? extra : "");
  td_prom_set(run->prom, name, type, help, labels, value);
}
static void app_prom_gauge(app_run *run, const char *name, const char *help, const char *extra, double value) {
  app_prom_set(run, name, "gauge", help, extra, value);
}
static void app_prom_counter(app_run *run, const char *name, const char *help, const char *extra, double delta) {
  char labels[160];
  snprintf(labels, sizeof labels, "%s%s%s", run->prom_labels, extra ? "," : "", extra ? extra : "");
  td_prom_add(run->prom, name, help, labels, delta);
}

/* What one step measured, as gauges (the last step) and counters (totals
 * since start, for rate() in PromQL). */
static double app_thread_cpu(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void app_prom_step(app_run *run, const td_step_stats *st, const td_step_metrics *m) {
  if (!run->prom) return;
  double cpu0 = app_thread_cpu(); /* what this costs the training thread (app_prom_cost) */
  static const char phase_help[] = "seconds of the last step by phase (compute includes data, optimizer and "
                                   "fetch_wait)";
  static const char phase_total_help[] = "seconds spent by phase since start";
  const char *phases[] = {"phase=\"step\"", "phase=\"compute\"", "phase=\"comm_wait\"", "phase=\"optimizer\"",
                          "phase=\"data\"", "phase=\"io\"", "phase=\"fetch_wait\""};
  double secs[] = {st->step_s, st->compute_s, st->comm_wait_s, st->optimizer_s, st->data_s, st->io_s,
                   st->fetch_wait_s};
  enum { N_PHASES = sizeof secs / sizeof secs[0] };
  td_coll_stats coll[32]; /* the communicator's rows, copied before the lock that scrapes wait on */
  int n_coll = td_comm_collective_stats(run->comm, coll, 32);
  if (n_coll > 32) n_coll = 32;
  /* the heartbeats' measures of each peer (TCP only), also copied first */
  int n_hb = td_comm_heartbeat_stats(run->comm, NULL, 0);
  td_heartbeat_stats *hb = n_hb > 0 ? malloc(sizeof *hb * (size_t)n_hb) : NULL;
  if (hb) {
    int again = td_comm_heartbeat_stats(run->comm, hb, n_hb); /* the peers are fixed: the same count */
    if (again < n_hb) n_hb = again;
  } else {
    n_hb = 0;
  }
  double rss = app_rss_bytes(); /* file I/O outside the lock that scrapes wait on */
  /* a model on a device: that device's memory (cudaMemGetInfo: the whole
   * device, every process on it), also outside the lock */
  td_device dev = td_trainer_model(run->trainer)->device;
  size_t dev_free = 0, dev_total = 0;
  char dev_labels[64] = "";
  if (dev.kind != TD_DEVICE_CPU && td_device_mem_info(dev, &dev_free, &dev_total) == TD_OK) {
    char name[32];
    snprintf(dev_labels, sizeof dev_labels, "device=\"%s\"", td_device_name(dev, name, sizeof name));
  }
  td_offload_stats os;
  int offload = td_trainer_offload_stats(run->trainer, &os) == TD_OK && os.engine[0];
  td_prom_begin(run->prom); /* a scrape sees the whole step or none of it */
  for (int i = 0; i < N_PHASES; i++) {
    app_prom_gauge(run, "tandem_step_phase_seconds", phase_help, phases[i], secs[i]);
    app_prom_counter(run, "tandem_phase_seconds_total", phase_total_help, phases[i], secs[i]);
  }
  app_prom_gauge(run, "tandem_step", "optimizer steps done", NULL, (double)st->step);
  app_prom_gauge(run, "tandem_loss", "mean loss of the last step over the global batch", NULL, st->loss);
  app_prom_gauge(run, "tandem_learning_rate", "learning rate of the last step", NULL, st->lr);
  app_prom_gauge(run, "tandem_grad_norm", "global gradient L2 norm of the last step, before clipping", NULL,
                 st->grad_norm);
  app_prom_gauge(run, "tandem_loss_scale", "fp16 loss scale after the last step (1 otherwise)", NULL, st->loss_scale);
  app_prom_gauge(run, run->use_tokens ? "tandem_tokens_per_second" : "tandem_samples_per_second",
                 "throughput of the last step, all ranks together", NULL, m->items_per_s);
  app_prom_counter(run, run->use_tokens ? "tandem_tokens_total" : "tandem_samples_total",
                   "items trained on since start, all ranks together", NULL,
                   run->use_tokens ? (double)st->tokens : (double)st->samples);
  app_prom_counter(run, "tandem_comm_bytes_total", "bytes this rank reduced, by collective",
                   "collective=\"allreduce\",purpose=\"gradients\"", (double)st->comm_bytes);
  app_prom_counter(run, "tandem_comm_buckets_total", "gradient buckets this rank reduced", NULL, st->n_buckets);
  for (int i = 0; i < n_coll; i++) { /* every operation on the communicator, by algorithm (cumulative) */
    char op_labels[64];
    snprintf(op_labels, sizeof op_labels, "operation=\"%s\",algorithm=\"%s\"", coll[i].operation, coll[i].algorithm);
    app_prom_set(run, "tandem_collective_calls_total", "counter", "operations this rank ran, by operation and "
                 "algorithm", op_labels, (double)coll[i].calls);
    app_prom_set(run, "tandem_collective_bytes_total", "counter", "data size of those operations (nccl-tests' "
                 "size: the whole buffer)", op_labels, (double)coll[i].bytes);
    app_prom_set(run, "tandem_collective_seconds_total", "counter", "seconds this rank spent executing them",
                 op_labels, coll[i].seconds);
    app_prom_set(run, "tandem_collective_bus_bytes_total", "counter", "bytes times the bus factor: "
                 "rate(bus_bytes) / rate(seconds) is the bus bandwidth", op_labels, coll[i].bus_bytes);
    app_prom_set(run, "tandem_collective_bus_bandwidth_bytes_per_second", "gauge", "nccl-tests' bus bandwidth "
                 "since start (bus bytes / seconds)", op_labels,
                 coll[i].seconds > 0 ? coll[i].bus_bytes / coll[i].seconds : 0);
  }
  for (int i = 0; i < n_hb; i++) { /* per peer; the communicator's counts since it was formed */
    char peer_labels[32];
    snprintf(peer_labels, sizeof peer_labels, "peer=\"%d\"", hb[i].peer);
    if (hb[i].rtt_samples)
      app_prom_set(run, "tandem_heartbeat_rtt_seconds", "gauge", "smoothed round trip of the heartbeats to the peer "
                   "and back (RFC 6298's estimate; the network and both sides' send delays)", peer_labels,
                   hb[i].rtt_smoothed_s);
    app_prom_set(run, "tandem_heartbeats_received_total", "counter", "heartbeats taken from the peer", peer_labels,
                 (double)hb[i].beats);
    app_prom_set(run, "tandem_heartbeats_missed_total", "counter", "heartbeats the peer sent that never arrived "
                 "(gaps in its sequence): the loss of the peer-to-rank direction", peer_labels,
                 (double)hb[i].missed);
  }
  free(hb);
  app_prom_gauge(run, "tandem_comm_bytes_per_step", "gradient bytes this rank reduced in the last step", NULL,
                 (double)st->comm_bytes);
  app_prom_counter(run, "tandem_checkpoints_total", "checkpoints saved by td_trainer_step", NULL, st->saved);
  app_prom_counter(run, "tandem_skipped_steps_total", "steps skipped on fp16 overflow", NULL, st->skipped);
  app_prom_gauge(run, "tandem_resident_memory_bytes", "resident set size of this rank's process", NULL,
                 rss);
  if (dev_labels[0]) {
    app_prom_gauge(run, "tandem_device_memory_used_bytes", "memory in use on the rank's device (all processes on "
                   "it), after the last step", dev_labels, (double)(dev_total - dev_free));
    app_prom_gauge(run, "tandem_device_memory_total_bytes", "memory of the rank's device", dev_labels,
                   (double)dev_total);
  }
  if (st->memory_limit_bytes) { /* the trainer's watch (issue 23): Pss against the memory available to the rank */
    app_prom_gauge(run, "tandem_memory_share_bytes", "this rank's share of physical memory (Pss) after the last step",
                   NULL, (double)st->memory_bytes);
    app_prom_gauge(run, "tandem_memory_limit_bytes", "the memory available to this rank (MemAvailable, cgroup, "
                   "TANDEM_MEMORY_LIMIT)", NULL, (double)st->memory_limit_bytes);
    app_prom_gauge(run, "tandem_memory_warning", "1: past 90% of the limit, 2: past 97%", NULL, st->memory_warning);
  }
  if (offload) {
    app_prom_gauge(run, "tandem_offload_read_bytes", "bytes the NVMe offload read since start", NULL,
                   (double)os.bytes_read);
    app_prom_gauge(run, "tandem_offload_written_bytes", "bytes the NVMe offload wrote since start", NULL,
                   (double)os.bytes_written);
    app_prom_gauge(run, "tandem_offload_io_wait_seconds", "seconds the training thread blocked on offload I/O", NULL,
                   os.io_wait_s);
    app_prom_gauge(run, "tandem_offload_param_wait_seconds", "seconds parameter fetches blocked on reads", NULL,
                   os.param_wait_s);
  }
  /* the endpoint's own cost so far, for a dashboard (and app_prom_cost) */
  static const char cost_help[] = "CPU time the metrics endpoint cost this rank: serving scrapes (server thread) "
                                  "and updating the series after each step (training thread)";
  app_prom_set(run, "tandem_prometheus_cpu_seconds_total", "counter", cost_help, "part=\"serve\"",
               td_prom_serve_cpu_seconds(run->prom));
  run->prom_update_cpu_s += app_thread_cpu() - cpu0;
  run->prom_updates++;
  app_prom_set(run, "tandem_prometheus_cpu_seconds_total", "counter", cost_help, "part=\"update\"",
               run->prom_update_cpu_s);
  td_prom_end(run->prom);
}

/* At the end, with --prometheus-port: what the endpoint cost this rank in
 * CPU time, measured where it was spent (bench/prometheus_cost.sh reads
 * the line and sets it against cpu_ms_per_step). */
static void app_prom_cost(const app_run *run) {
  if (!run->prom) return;
  fprintf(stderr, "%s: rank %d's metrics endpoint: %lu scrapes, %.3f ms CPU serving them, %.3f ms CPU updating the "
          "series over %ld steps (%.4f ms per step)\n", app_name, run->rank, td_prom_scrapes(run->prom),
          td_prom_serve_cpu_seconds(run->prom) * 1e3, run->prom_update_cpu_s * 1e3, run->prom_updates,
          run->prom_updates ? run->prom_update_cpu_s * 1e3 / (double)run->prom_updates : 0.0);
}

/* What the metrics file, the progress display and the exporters show of a
 * step (items: tokens or samples). */
static void app_step_metrics(const td_step_stats *st, int use_tokens, td_step_metrics *m) {
  double items = use_tokens ? (double)st->tokens : (double)st->samples;
  td_step_metrics_clear(m);
  m->step = st->step;
  m->loss = st->loss;
  m->lr = st->lr;
  m->items_per_s = st->step_s > 0 ? items / st->step_s : -1;
  m->step_s = st->step_s;
  m->compute_s = st->compute_s;
  m->comm_wait_s = st->comm_wait_s;
  m->optimizer_s = st->optimizer_s;
  m->data_s = st->data_s;
  m->io_s = st->io_s;
  m->fetch_wait_s = st->fetch_wait_s;
  /* only where something was fetched (ZeRO stage 3 on several ranks) */
  m->param_fetches = st->param_fetches > 0 ? st->param_fetches : -1;
  m->param_prefetches = st->param_fetches > 0 ? st->param_prefetches : -1;
  m->grad_norm = st->grad_norm;
  m->memory_mib = st->memory_bytes / 1048576.0;
  if (st->memory_limit_bytes) {
    m->memory_limit_mib = st->memory_limit_bytes / 1048576.0;
    m->memory_warning = st->memory_warning;
  }
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
  app_step_metrics(st, run->use_tokens, &m);
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
  app_prom_step(run, st, &m);
  app_tensorboard_step(run, st, &m);
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
  app_prom_cost(run);
  td_prom_stop(run->prom);
  run->prom = NULL;
  td_status tb_status = td_tensorboard_close(run->tensorboard);
  run->tensorboard = NULL;
  if (tb_status != TD_OK) app_fail(run, "closing the TensorBoard events", tb_status);
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
