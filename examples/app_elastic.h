/* The elastic training loop of the example programs (--elastic, or started
 * by tandemrun --min-np/--max-np), on the public API of tandem/elastic.h.
 *
 * The trainer is created locally (td_trainer_create_unbound) so that a
 * process joining a running job can build it while the others train, with
 * its shards cut for the world it joins; td_elastic_run then
 * gives every process the newest committed state and calls the reset
 * callback, which moves the trainer onto the epoch's communicator with the
 * global batch kept (micro-batch and accumulation re-derived). Each
 * completed step is committed in memory. Output: rank 0 of each epoch
 * prints one line per step to stderr ("step N loss L" with L exact, %.17g),
 * and at the end the summary line plus an "elastic:" line with the exact
 * final loss and a hash of the parameters, which tests compare bit for bit
 * with a run that never failed.
 *
 * The exporters follow the membership: each process serves Prometheus on
 * PORT + its launch number (TANDEM_ELASTIC_ID), which outlives renumbering,
 * its series labelled with the rank of the current epoch and the launch
 * number (rank="R",process="ID"; relabelled at each epoch), plus the
 * epoch's membership events. TensorBoard is written by rank 0 of each
 * epoch, in a file of its own; each epoch's rank 0 first writes a
 * SessionLog START at the step it trains next, so that TensorBoard drops
 * the steps the lost rank 0 wrote past the restored commit. */
#ifndef TD_EXAMPLES_APP_ELASTIC_H
#define TD_EXAMPLES_APP_ELASTIC_H

#include <signal.h>
#include <unistd.h>

#include "app_common.h"
#include "tandem/elastic.h"

typedef struct app_elastic {
  td_elastic *e;
  td_trainer *trainer;
  int micro_hint; /* the micro-batch asked for: the largest one used at any world size */
  int max_world;
  long steps;
  int rank, world;
  td_step_stats last;
  long steps_done_here; /* steps this process completed */
  double t_begin;
  double t_warm;        /* when this process completed its second step (throughput leaves the first two out) */
  double t_last;        /* when it completed its last one */
  const char *resume_dir;   /* --resume: the job starts from this checkpoint */
  const char *metrics_path; /* --metrics: rank 0 of each epoch appends its steps and the epoch's events */
  td_metrics *metrics;      /* open while this process is rank 0 */
  int metrics_opened;       /* this process opened the file before (append from then on) */
  int epoch_reported;       /* the epoch whose start was reported (train callback) */
  long saved_step;          /* the step of the last checkpoint this process took part in (--save) */
  long save_every;          /* --save-every: saved here, after the step's metrics record, not by the trainer */
  int use_tokens;           /* throughput in tokens (GPT) or samples (CNN) */
  const char *tensorboard_dir;  /* --tensorboard */
  td_tensorboard *tensorboard;  /* opened by the first epoch this process is rank 0 in */
  app_run run; /* what the exporters (app_prom_step, app_tensorboard_step) read: this epoch's comm, rank, world */
} app_elastic;

/* Does --config enable the "elasticity" block? (train elastically then) */
static int app_config_elastic(const app_common_options *c) {
  if (!c->config_path) return 0;
  td_train_config cfg;
  td_train_config_defaults(&cfg);
  if (td_train_config_load_json(c->config_path, &cfg) != TD_OK) return 0; /* reported by build_config */
  return cfg.elasticity.enabled;
}

/* The config's elasticity.min_gpus/max_gpus bound the world size: they
 * become the elastic bounds when the launcher gave none, and must agree
 * with the launcher's otherwise. */
static void app_elastic_bounds(const td_elasticity_config *el) {
  const char *names[2] = {"TANDEM_ELASTIC_MIN_NP", "TANDEM_ELASTIC_MAX_NP"};
  const char *flags[2] = {"--min-np", "--max-np"};
  int want[2] = {el->min_gpus, el->max_gpus};
  for (int i = 0; i < 2; i++) {
    const char *v = getenv(names[i]);
    if (!v || !*v) {
      char buf[32];
      snprintf(buf, sizeof buf, "%d", want[i]);
      setenv(names[i], buf, 1);
      continue;
    }
    long have = atol(v);
    if (i == 0 ? have < want[0] : have > want[1])
      app_usage_error("tandemrun %s %ld is outside the config's elasticity.min_gpus %d .. max_gpus %d: make them "
                      "agree", flags[i], have, want[0], want[1]);
  }
}

/* Is this process started elastically (tandemrun --min-np/--max-np)? */
static int app_elastic_env(void) {
  const char *v = getenv("TANDEM_ELASTIC");
  return v && !strcmp(v, "1");
}

static td_status app_elastic_reset(void *ctx, td_comm *comm, int world_size) {
  app_elastic *a = ctx;
  td_status s = td_trainer_elastic_rebind(a->trainer, comm, a->micro_hint, a->max_world);
  if (s != TD_OK) return s;
  a->rank = td_comm_rank(comm);
  a->world = world_size;
  /* the estimate redone for this world (the shards grow as it shrinks)
   * against the peak so far, every rank, every epoch (issue 23) */
  td_trainer_memory_info mem;
  if (td_trainer_memory(a->trainer, &mem) == TD_OK) {
    printf("%s: memory epoch=%d rank=%d world=%d estimate_mib=%.1f shared_mib=%.1f peak_rss_mib=%.1f "
           "limit_mib=%.1f limit=\"%s\"\n",
           app_name, td_elastic_epoch(a->e), a->rank, world_size, mem.estimate_bytes / 1048576.0,
           mem.shared_bytes / 1048576.0, mem.peak_rss_bytes / 1048576.0, mem.limit_bytes / 1048576.0,
           mem.limit_source);
    fflush(stdout);
  }
  return TD_OK;
}

/* --metrics: the file follows rank 0. The first rank 0 of a fresh job
 * creates it; a later one (the old rank 0 was lost) or a resumed job
 * appends, so the file holds the whole job's history: a step redone after a
 * fault appears again, after the "elastic_epoch" record that explains it. */
static td_status app_elastic_metrics_follow(app_elastic *a) {
  if (!a->metrics_path) return TD_OK;
  if (a->rank != 0) {
    td_status s = td_metrics_close(a->metrics);
    a->metrics = NULL;
    return s;
  }
  if (a->metrics) return TD_OK;
  int append = a->metrics_opened || a->resume_dir || td_elastic_epoch(a->e) > 1;
  td_status s = td_metrics_open(a->metrics_path, a->use_tokens ? "tokens" : "samples", append, &a->metrics);
  if (s == TD_OK) a->metrics_opened = 1;
  return s;
}

/* The exporters at the start of an epoch: the Prometheus series relabelled
 * with this epoch's rank (the old labels' series end) and the membership
 * events; rank 0's TensorBoard writer (opened the first time this process
 * is rank 0) marks where training goes on. */
static td_status app_elastic_exporters_epoch(app_elastic *a, td_elastic *e) {
  app_run *run = &a->run;
  run->comm = td_elastic_comm(e);
  run->rank = a->rank;
  run->world = a->world;
  run->trainer = a->trainer;
  long step = td_trainer_step_count(a->trainer);
  if (run->prom) {
    int faults = td_elastic_faults(e);
    td_prom_begin(run->prom); /* a scrape sees the old labels or the new ones, never a mix */
    td_prom_clear(run->prom);
    snprintf(run->prom_labels, sizeof run->prom_labels, "rank=\"%d\",process=\"%ld\"", a->rank, td_elastic_id(e));
    app_prom_gauge(run, "tandem_world_size", "ranks in the job", NULL, a->world);
    app_prom_gauge(run, "tandem_step", "optimizer steps done", NULL, (double)step);
    app_prom_gauge(run, "tandem_elastic_epoch", "membership epoch this process trains in", NULL,
                   td_elastic_epoch(e));
    static const char changes_help[] = "membership changes this process went through, by cause: fault (a peer "
                                       "lost or silent) or join (new processes admitted)";
    app_prom_set(run, "tandem_elastic_membership_changes_total", "counter", changes_help, "cause=\"fault\"", faults);
    app_prom_set(run, "tandem_elastic_membership_changes_total", "counter", changes_help, "cause=\"join\"",
                 td_elastic_resets(e) - faults);
    app_prom_set(run, "tandem_elastic_disk_restores_total", "counter", "state restored from the disk checkpoint "
                 "(a rank and its buddy lost together, or a job resumed)", NULL, td_elastic_fallbacks(e));
    td_prom_end(run->prom);
  }
  if (a->rank == 0 && a->tensorboard_dir && !a->tensorboard) {
    td_status s = td_tensorboard_open(a->tensorboard_dir, &a->tensorboard);
    if (s != TD_OK) return s;
    fprintf(stderr, "%s: TensorBoard events in %s\n", app_name, td_tensorboard_path(a->tensorboard));
  }
  run->tensorboard = a->rank == 0 ? a->tensorboard : NULL;
  return td_tensorboard_session_start(run->tensorboard, step + 1);
}

/* The start of an epoch, once its state is final (after a disk fallback
 * too): the exporters, rank 0's "elastic epoch" line and the metrics record
 * of the membership change. */
static td_status app_elastic_epoch_begin(app_elastic *a, td_elastic *e) {
  a->epoch_reported = td_elastic_epoch(e);
  td_status s = app_elastic_exporters_epoch(a, e);
  if (s == TD_OK) s = app_elastic_metrics_follow(a);
  if (s != TD_OK || a->rank != 0) return s;
  const td_train_config *c = td_trainer_config(a->trainer);
  long step = td_trainer_step_count(a->trainer);
  fprintf(stderr, "%s: elastic epoch %d: world=%d global_batch=%ld (micro %d x accum %d x %d ranks) from step %ld\n",
          app_name, td_elastic_epoch(e), a->world, c->train_batch_size, c->micro_batch, c->grad_accum, a->world, step);
  /* The step of the commit may have been completed, but not reported, by
   * the rank 0 that was lost: every survivor completed it, so say it
   * again (the same value when it was reported). */
  if (step > 0 && a->last.step == step)
    fprintf(stderr, "%s: step %ld loss %.17g world %d epoch %d\n", app_name, a->last.step, a->last.loss, a->world,
            td_elastic_epoch(e) - 1);
  if (!a->metrics) return TD_OK;
  static const char *const keys[] = {"epoch", "world", "global_batch", "membership_changes", "faults",
                                     "disk_restores"};
  double values[] = {td_elastic_epoch(e), a->world, (double)c->train_batch_size, td_elastic_resets(e),
                     td_elastic_faults(e), td_elastic_fallbacks(e)};
  return td_metrics_write_values(a->metrics, "elastic_epoch", step, 6, keys, values);
}

/* One step's record in the metrics file (the non-elastic file's keys),
 * on Prometheus and in TensorBoard. */
static td_status app_elastic_record_step(app_elastic *a, const td_step_stats *st) {
  td_step_metrics m;
  app_step_metrics(st, a->use_tokens, &m);
  app_prom_step(&a->run, st, &m);
  app_tensorboard_step(&a->run, st, &m);
  return a->metrics ? td_metrics_write_step(a->metrics, &m) : TD_OK;
}

/* Test hook TANDEM_TEST_STOP_AT="E1:S1,E2:S2,...": this process stops
 * itself (SIGSTOP) right after committing step Si in membership epoch Ei
 * (once per pair), so that a fault script acts at a known step however
 * fast the steps run on a loaded machine: it waits until every process is
 * stopped, injects the fault, and continues the others. Keyed by epoch so
 * that steps redone after a fault do not stop anybody again. */
static void app_elastic_test_stop(int epoch, long step) {
  static unsigned done = 0; /* pairs already stopped at */
  const char *v = getenv("TANDEM_TEST_STOP_AT");
  if (!v) return;
  int i = 0;
  for (const char *p = v; *p && i < 32; i++) {
    char *end;
    long e = strtol(p, &end, 10), s = -1;
    if (*end == ':') s = strtol(end + 1, &end, 10);
    if (e == epoch && s == step && !(done & (1u << i))) {
      done |= 1u << i;
      raise(SIGSTOP);
      return;
    }
    if (*end != ',') break;
    p = end + 1;
  }
}

static td_status app_elastic_train(void *ctx, td_elastic *e) {
  app_elastic *a = ctx;
  if (a->epoch_reported != td_elastic_epoch(e)) {
    td_status s = app_elastic_epoch_begin(a, e);
    if (s != TD_OK) return s;
  }
  while (td_trainer_step_count(a->trainer) < a->steps) {
    td_step_stats st;
    td_status s = td_trainer_step(a->trainer, &st);
    if (s != TD_OK) return s;
    a->last = st;
    a->steps_done_here++;
    if (a->rank == 0)
      fprintf(stderr, "%s: step %ld loss %.17g world %d epoch %d\n", app_name, st.step, st.loss, a->world,
              td_elastic_epoch(e));
    s = app_elastic_record_step(a, &st);
    if (s != TD_OK) return s;
    /* The checkpoint after the step's record: a job killed in between
     * redoes the step from the previous checkpoint and records it then. */
    if (a->save_every > 0 && st.step % a->save_every == 0) {
      s = td_trainer_save(a->trainer, td_trainer_config(a->trainer)->checkpoint_dir);
      if (s != TD_OK) return s;
      a->saved_step = st.step;
    }
    s = td_elastic_commit(e);
    if (s != TD_OK) return s;
    a->t_last = app_now();
    if (a->steps_done_here == 2) a->t_warm = a->t_last;
    app_elastic_test_stop(td_elastic_epoch(e), st.step);
  }
  /* --save: the final state too, as without --elastic (here, so that a
   * fault during this save is survived like one during a step) */
  const td_train_config *c = td_trainer_config(a->trainer);
  long step = td_trainer_step_count(a->trainer);
  if (c->checkpoint_dir[0] && step > 0 && a->saved_step != step) {
    td_status s = td_trainer_save(a->trainer, c->checkpoint_dir);
    if (s != TD_OK) return s;
    a->saved_step = step;
  }
  return TD_OK;
}

/* The state from disk, re-sharded for this world by the loader: at the
 * start of a job given --resume (td_elastic_start_from_fallback), or when a
 * rank and its buddy are lost together (ZeRO stage >= 1). The newest
 * checkpoint: --save DIR's once it holds one, else --resume's. */
static td_status app_elastic_fallback(void *ctx, td_comm *comm, int world_size) {
  (void)comm;
  app_elastic *a = ctx;
  const td_train_config *c = td_trainer_config(a->trainer);
  td_checkpoint_info info;
  const char *dir = c->checkpoint_dir;
  if (a->resume_dir && (!dir[0] || td_checkpoint_info_read(dir, &info) != TD_OK)) dir = a->resume_dir;
  td_status s = td_trainer_resume(a->trainer, dir);
  if (s == TD_OK && td_comm_rank(comm) == 0)
    fprintf(stderr, "%s: elastic: resumed from the disk checkpoint in %s at step %ld (world %d)\n", app_name, dir,
            td_trainer_step_count(a->trainer), world_size);
  return s;
}

/* FNV-1a over the parameter bytes: equal hashes = equal parameters. A
 * model on a device: over a host copy (0 when that copy fails). */
static unsigned long long app_params_hash(const td_trainer *t) {
  const unsigned char *p = (const unsigned char *)td_trainer_params(t);
  size_t n = td_trainer_n_params(t) * sizeof(float);
  td_device dev = td_trainer_model(t)->device;
  unsigned char *host = NULL;
  if (dev.kind != TD_DEVICE_CPU) {
    host = malloc(n ? n : 1);
    if (!host || td_device_copy(host, (td_device){TD_DEVICE_CPU, 0}, p, dev, n) != TD_OK) {
      free(host);
      return 0;
    }
    p = host;
  }
  unsigned long long h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
  free(host);
  return h;
}

/* Stop the exporters; the first error closing the TensorBoard file (its
 * message is then the last error), or TD_OK. */
static td_status app_elastic_exporters_end(app_elastic *a) {
  app_prom_cost(&a->run);
  td_prom_stop(a->run.prom);
  a->run.prom = NULL;
  td_status s = td_tensorboard_close(a->tensorboard);
  a->tensorboard = a->run.tensorboard = NULL;
  return s;
}

/* Train cfg (resolved for the initial world) elastically; returns the exit
 * status. The model and dataset are the caller's. Of the common options:
 * --resume (the job starts from that checkpoint, at whatever world size,
 * with the checkpoint's global batch), --metrics, --prometheus-port and
 * --tensorboard (--save is in cfg). use_tokens: throughput in tokens (GPT)
 * or samples (CNN). */
static int app_elastic_main(td_train_config *cfg, td_model *model, td_dataset *data, const app_common_options *c,
                            int use_tokens) {
  app_elastic a;
  memset(&a, 0, sizeof a);
  const char *resume_dir = c->resume_dir;
  a.resume_dir = resume_dir;
  a.metrics_path = c->metrics_path;
  a.use_tokens = use_tokens;
  a.run.use_tokens = use_tokens;
  a.tensorboard_dir = c->tensorboard_dir;
  if (resume_dir) {
    /* The job's global batch is the checkpoint's whatever the world size
     * now (a restart at another size keeps it); every process reads it, so
     * the first epoch's split needs no communication. */
    td_checkpoint_info info;
    td_status s = td_checkpoint_info_read(resume_dir, &info);
    if (s != TD_OK) app_fail(NULL, "reading the checkpoint to resume from (--resume)", s);
    if (info.train_batch_size > 0) cfg->train_batch_size = info.train_batch_size;
  }
  if (cfg->elasticity.enabled) app_elastic_bounds(&cfg->elasticity);
  td_status s = td_elastic_create(NULL, &a.e);
  if (s != TD_OK) app_fail(NULL, "joining the elastic job (td_elastic_create)", s);
  fprintf(stderr, "%s: elastic process %ld (pid %d) is rank %d of %d in epoch %d\n", app_name, td_elastic_id(a.e),
          (int)getpid(), td_elastic_rank(a.e), td_elastic_size(a.e), td_elastic_epoch(a.e));
  app_start_prometheus_slot(&a.run, c, td_elastic_id(a.e), "process");
  const char *max_np = getenv("TANDEM_ELASTIC_MAX_NP");
  a.max_world = max_np ? atoi(max_np) : 0;
  a.micro_hint = cfg->micro_batch;
  a.steps = cfg->steps;
  /* The trainer is created locally, for the same global batch, with its
   * shards cut for this process's rank and world in the epoch it joined
   * (the first rebind cuts them again if the world changed meanwhile): a
   * trainer of one rank would first hold the whole model state. */
  td_train_config local = *cfg;
  local.checkpoint_every = 0;
  /* elastic whether or not the config said so (--elastic, tandemrun
   * --min-np): the trainer's estimate and its memory check at creation then
   * count the buddy copies and deterministic reduction's buffers */
  local.elasticity.enabled = 1;
  a.save_every = cfg->checkpoint_every;
  int world0 = td_elastic_size(a.e), rank0 = td_elastic_rank(a.e);
  if (world0 < 1 || rank0 < 0 || rank0 >= world0) world0 = 1, rank0 = 0;
  s = td_elastic_batch_split(cfg->train_batch_size, world0, a.micro_hint, a.max_world, &local.micro_batch,
                             &local.grad_accum);
  if (s == TD_OK) s = td_trainer_create_unbound(&local, model, data, world0, rank0, &a.trainer);
  if (s == TD_OK) s = td_trainer_elastic_register(a.trainer, a.e);
  if (s == TD_OK && (cfg->checkpoint_dir[0] || resume_dir)) s = td_elastic_set_fallback(a.e, app_elastic_fallback, &a);
  if (s == TD_OK && resume_dir) s = td_elastic_start_from_fallback(a.e);
  if (s != TD_OK) {
    fprintf(stderr, "%s: error: setting up elastic training failed (%s): %s\n", app_name, td_status_str(s),
            td_last_error());
    app_elastic_exporters_end(&a);
    td_elastic_destroy(a.e);
    return APP_EXIT_FAIL;
  }
  a.t_begin = app_now();
  s = td_elastic_run(a.e, app_elastic_train, app_elastic_reset, &a);
  double train_s = app_now() - a.t_begin;
  if (td_metrics_close(a.metrics) != TD_OK && s == TD_OK) s = TD_ERR_IO; /* (its message stays the last error) */
  a.metrics = NULL;
  if (app_elastic_exporters_end(&a) != TD_OK && s == TD_OK) s = TD_ERR_IO;
  if (s != TD_OK) {
    fprintf(stderr, "%s: error: elastic training failed (%s): %s\n", app_name, td_status_str(s), td_last_error());
    td_trainer_destroy(a.trainer);
    td_elastic_destroy(a.e);
    return APP_EXIT_FAIL;
  }
  /* Every rank: the memory estimate against the peak so far, before the
   * gather below, as the non-elastic summary prints it (tests/offload,
   * issue 23) */
  td_trainer_memory_info mem;
  if (td_trainer_memory(a.trainer, &mem) == TD_OK) {
    printf("%s: memory rank=%d estimate_mib=%.1f shared_mib=%.1f baseline_mib=%.1f peak_rss_mib=%.1f "
           "limit_mib=%.1f limit=\"%s\"\n",
           app_name, a.rank, mem.estimate_bytes / 1048576.0, mem.shared_bytes / 1048576.0,
           mem.baseline_bytes / 1048576.0,
           mem.peak_rss_bytes / 1048576.0, mem.limit_bytes / 1048576.0, mem.limit_source);
    fflush(stdout);
  }
  /* stage 3: the whole parameter arena for the hash (collective) */
  s = td_trainer_gather_params(a.trainer);
  if (s != TD_OK) {
    fprintf(stderr, "%s: error: gathering the parameters failed (%s): %s\n", app_name, td_status_str(s),
            td_last_error());
    td_trainer_destroy(a.trainer);
    td_elastic_destroy(a.e);
    return APP_EXIT_FAIL;
  }
  const td_train_config *rc = td_trainer_config(a.trainer);
  if (a.rank == 0) {
    /* items (tokens for the GPT, samples for the CNN) per second over
     * this process's steps after its first two, commits included, as the
     * non-elastic summary's tokens_per_s= */
    double dt = a.t_last - a.t_warm;
    double items = (double)(a.steps_done_here - 2) * (double)rc->train_batch_size * (double)data->targets_per_sample;
    printf("%s: final_loss=%.6f tokens_per_s=%.0f steps=%ld world=%d params=%zu global_batch=%ld micro_batch=%d "
           "grad_accum=%d train_s=%.1f zero_stage=%d model_state_bytes_per_rank=%zu\n",
           app_name, a.last.loss, a.steps_done_here > 2 && dt > 0 ? items / dt : 0.0, td_trainer_step_count(a.trainer),
           a.world, td_trainer_n_params(a.trainer), rc->train_batch_size, rc->micro_batch, rc->grad_accum, train_s,
           td_trainer_zero_stage(a.trainer), td_trainer_model_state_bytes(a.trainer));
    printf("%s: elastic final_loss_exact=%.17g params_hash=%016llx epochs=%d resets=%d replica_disk_bytes=%zu\n",
           app_name, a.last.loss, app_params_hash(a.trainer), td_elastic_epoch(a.e), td_elastic_resets(a.e),
           td_elastic_copy_disk_bytes(a.e));
    fflush(stdout);
  }
  td_comm *comm = td_elastic_comm(a.e);
  s = td_comm_finalize(comm);
  td_trainer_destroy(a.trainer);
  td_elastic_destroy(a.e);
  if (s != TD_OK) {
    fprintf(stderr, "%s: error: finalizing failed (%s): %s\n", app_name, td_status_str(s), td_last_error());
    return APP_EXIT_FAIL;
  }
  return 0;
}

#endif
