/* The progress display of rank 0: a live line redrawn in place on a
 * terminal, plain periodic lines elsewhere (logs, pipes, tandemrun).
 *
 * It writes to the stream it was given (stderr by default), never to stdout
 * on its own, so that a program's stdout holds only its results. The ETA is
 * the mean step time of this run so far times the steps left; the first
 * step, which pays for warm-up, is left out of that mean once there are
 * others. */
#include "base/base.h"
#include "tandem/obs.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

struct td_progress {
  td_progress_config config;
  char unit[16];
  char label[64];
  td_progress_mode mode;
  FILE *stream;
  double t_first;      /* when the first reported step ended */
  long n_updates;      /* steps reported so far */
  long step_first;     /* number of the first reported step */
  double last_draw;    /* live mode: time of the last redraw */
  int live_len;        /* live mode: characters on the current line */
  int line_open;       /* live mode: a line without newline is on screen */
};

void td_step_metrics_clear(td_step_metrics *m) {
  m->step = 0;
  m->loss = m->lr = m->items_per_s = m->step_s = m->compute_s = m->comm_wait_s = m->grad_norm = -1;
  m->optimizer_s = m->data_s = m->io_s = m->fetch_wait_s = -1;
  m->memory_mib = m->memory_limit_mib = -1;
  m->memory_warning = -1;
  m->param_fetches = m->param_prefetches = -1;
}

void td_format_duration(double seconds, char *buf, size_t size) {
  if (!(seconds >= 0) || !isfinite(seconds)) {
    snprintf(buf, size, "?");
    return;
  }
  long s = (long)(seconds + 0.5);
  if (s >= 3600)
    snprintf(buf, size, "%ldh%02ldm", s / 3600, (s / 60) % 60);
  else if (s >= 60)
    snprintf(buf, size, "%ldm%02lds", s / 60, s % 60);
  else
    snprintf(buf, size, "%lds", s);
}

static td_progress_mode resolve_mode(td_progress_mode mode, FILE *stream) {
  if (mode != TD_PROGRESS_AUTO) return mode;
  const char *env = td_env_str("TANDEM_PROGRESS", NULL);
  if (env) {
    if (!strcasecmp(env, "live")) return TD_PROGRESS_LIVE;
    if (!strcasecmp(env, "plain")) return TD_PROGRESS_PLAIN;
    if (!strcasecmp(env, "off")) return TD_PROGRESS_OFF;
    if (strcasecmp(env, "auto"))
      td_log(TD_LOG_WARN, "TANDEM_PROGRESS=%s is not one of auto, live, plain, off; using auto", env);
  }
  return isatty(fileno(stream)) ? TD_PROGRESS_LIVE : TD_PROGRESS_PLAIN;
}

td_status td_progress_create(const td_progress_config *config, td_progress **out) {
  *out = NULL;
  if (!config) return td_error(TD_ERR_INVALID_ARGUMENT, "td_progress_create: config is NULL");
  td_progress *p = calloc(1, sizeof *p);
  if (!p) return td_error(TD_ERR_SYSTEM, "td_progress_create: out of memory");
  p->config = *config;
  if (p->config.steps_per_print <= 0) p->config.steps_per_print = 10;
  td_strlcpy(p->unit, config->unit ? config->unit : "items", sizeof p->unit);
  td_strlcpy(p->label, config->label ? config->label : "", sizeof p->label);
  p->stream = config->stream ? config->stream : stderr;
  p->mode = resolve_mode(config->mode, p->stream);
  *out = p;
  return TD_OK;
}

td_progress_mode td_progress_get_mode(const td_progress *progress) {
  return progress ? progress->mode : TD_PROGRESS_OFF;
}

/* "12.3k" style throughput, short enough for one terminal line. */
static void format_rate(double rate, char *buf, size_t size) {
  if (!(rate >= 0)) snprintf(buf, size, "?");
  else if (rate >= 1e6) snprintf(buf, size, "%.2fM", rate / 1e6);
  else if (rate >= 1e4) snprintf(buf, size, "%.1fk", rate / 1e3);
  else snprintf(buf, size, "%.0f", rate);
}

static double eta_seconds(const td_progress *p, long step, double now) {
  long total = p->config.total_steps;
  if (total <= 0 || step >= total) return step >= total && total > 0 ? 0 : -1;
  /* Mean over steps after the first one reported: the first pays warm-up. */
  long n_timed = step - p->step_first;
  if (n_timed <= 0) return -1;
  double per_step = (now - p->t_first) / (double)n_timed;
  return per_step * (double)(total - step);
}

void td_progress_update(td_progress *p, const td_step_metrics *m) {
  if (!p || !m || p->mode == TD_PROGRESS_OFF) return;
  double now = td_now();
  if (p->n_updates == 0) {
    p->t_first = now;
    p->step_first = m->step;
  }
  p->n_updates++;
  long total = p->config.total_steps;
  int last = total > 0 && m->step >= total;

  char rate[32], eta[32], elapsed[32];
  format_rate(m->items_per_s, rate, sizeof rate);
  td_format_duration(eta_seconds(p, m->step, now), eta, sizeof eta);
  td_format_duration(now - p->t_first, elapsed, sizeof elapsed);
  const char *sep = p->label[0] ? " " : "";

  if (p->mode == TD_PROGRESS_LIVE) {
    if (!last && p->n_updates > 1 && now - p->last_draw < 0.1) return;
    p->last_draw = now;
    char line[256];
    int n = snprintf(line, sizeof line, "%s%sstep %ld/%ld | loss %.4f | %s %s/s | ETA %s", p->label, sep, m->step,
                     total, m->loss, rate, p->unit, eta);
    if (n < 0) return;
    if (n >= (int)sizeof line) n = (int)sizeof line - 1;
    /* Pad with blanks to wipe what is left of a longer previous line. */
    int pad = p->live_len > n ? p->live_len - n : 0;
    fprintf(p->stream, "\r%s%*s", line, pad, "");
    p->live_len = n;
    p->line_open = 1;
    if (last) {
      fputc('\n', p->stream);
      p->line_open = 0;
      p->live_len = 0;
    }
    fflush(p->stream);
    return;
  }

  if (!(p->n_updates == 1 || last || m->step % p->config.steps_per_print == 0)) return;
  char extra[160] = "";
  size_t off = 0;
  if (m->lr >= 0) off += (size_t)snprintf(extra + off, sizeof extra - off, " lr %.3g", m->lr);
  if (m->grad_norm >= 0 && off < sizeof extra)
    off += (size_t)snprintf(extra + off, sizeof extra - off, " gnorm %.3f", m->grad_norm);
  if (m->compute_s >= 0 && off < sizeof extra)
    off += (size_t)snprintf(extra + off, sizeof extra - off, " compute %.3fs", m->compute_s);
  if (m->comm_wait_s >= 0 && off < sizeof extra)
    snprintf(extra + off, sizeof extra - off, " comm_wait %.3fs", m->comm_wait_s);
  fprintf(p->stream, "%s%sstep %ld/%ld loss %.4f %s %s/s%s elapsed %s eta %s\n", p->label, sep, m->step, total,
          m->loss, rate, p->unit, extra, elapsed, eta);
  fflush(p->stream);
}

void td_progress_note(td_progress *p, const char *fmt, ...) {
  if (!p || p->mode == TD_PROGRESS_OFF) return;
  if (p->line_open) {
    fputc('\n', p->stream);
    p->line_open = 0;
    p->live_len = 0;
  }
  va_list ap;
  va_start(ap, fmt);
  vfprintf(p->stream, fmt, ap);
  va_end(ap);
  fputc('\n', p->stream);
  fflush(p->stream);
}

void td_progress_finish(td_progress *p) {
  if (!p) return;
  if (p->line_open) {
    fputc('\n', p->stream);
    fflush(p->stream);
    p->line_open = 0;
    p->live_len = 0;
  }
}

void td_progress_destroy(td_progress *p) {
  if (!p) return;
  td_progress_finish(p);
  free(p);
}
