/* The timeline: Chrome trace-event JSON (chrome://tracing, ui.perfetto.dev),
 * the format of Horovod's HOROVOD_TIMELINE.
 *
 * Each rank writes its own file as a JSON array: metadata events naming the
 * process ("rank R") and one thread row per lane, then complete events
 *   {"name":"backward","cat":"compute","ph":"X","pid":R,"tid":LANE,"ts":US,"dur":US}
 * and counters ({"ph":"C"}). Writing per rank needs no communication and no
 * locking across processes; td_timeline_merge() joins the closed files into
 * one afterwards. Timestamps are wall-clock microseconds, derived from the
 * monotonic clock plus the wall time at open, so that spans of different
 * ranks line up on one time axis while intervals stay immune to clock steps. */
#include "base/base.h"
#include "tandem/obs.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TIMELINE_MAX_LANES 16

struct td_timeline {
  pthread_mutex_t lock;
  FILE *file;
  char path[512];
  int rank;
  double mono0, wall0; /* the two clocks read together at open */
  int n_lanes;
  char lanes[TIMELINE_MAX_LANES][32];
  td_status error;
};

double td_timeline_now(void) { return td_now(); }

static double to_us(const td_timeline *tl, double mono_s) { return (tl->wall0 + (mono_s - tl->mono0)) * 1e6; }

/* Copy a name into a JSON string body, replacing characters that would need
 * escaping (names are short identifiers chosen by the program). */
static void json_safe(const char *in, char *out, size_t size) {
  size_t i = 0;
  for (; in && in[i] && i + 1 < size; i++) {
    unsigned char c = (unsigned char)in[i];
    out[i] = (c < 0x20 || c == '"' || c == '\\') ? '_' : (char)c;
  }
  out[i] = 0;
}

static void note_error(td_timeline *tl) {
  if (tl->error == TD_OK) tl->error = td_error_errno("timeline: cannot write %s", tl->path);
}

td_status td_timeline_open(const char *path, int rank, int world, td_timeline **out) {
  *out = NULL;
  if (!path) path = td_timeline_default_path();
  if (!path || !*path) return TD_OK;
  td_timeline *tl = calloc(1, sizeof *tl);
  if (!tl) return td_error(TD_ERR_SYSTEM, "timeline: out of memory");
  if (world > 1)
    snprintf(tl->path, sizeof tl->path, "%s.%d", path, rank);
  else
    td_strlcpy(tl->path, path, sizeof tl->path);
  tl->file = fopen(tl->path, "w");
  if (!tl->file) {
    td_status st = td_error_errno("timeline: cannot create %s (TANDEM_TIMELINE names the file; rank r of a world "
                                  "of N writes FILE.r)", tl->path);
    free(tl);
    return st;
  }
  pthread_mutex_init(&tl->lock, NULL);
  tl->rank = rank;
  tl->mono0 = td_now();
  tl->wall0 = td_wall_time();
  if (fprintf(tl->file, "[\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"rank %d\"}}",
              rank, rank) < 0)
    note_error(tl);
  if (fprintf(tl->file, ",\n{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"sort_index\":%d}}",
              rank, rank) < 0)
    note_error(tl);
  *out = tl;
  return TD_OK;
}

/* Row number of a lane, announcing a new lane with a thread_name event.
 * Called with the lock held. */
static int lane_id(td_timeline *tl, const char *lane) {
  char name[32];
  json_safe(lane ? lane : "main", name, sizeof name);
  for (int i = 0; i < tl->n_lanes; i++)
    if (!strcmp(tl->lanes[i], name)) return i + 1;
  if (tl->n_lanes == TIMELINE_MAX_LANES) return TIMELINE_MAX_LANES; /* fold extra lanes into the last row */
  int id = tl->n_lanes + 1;
  td_strlcpy(tl->lanes[tl->n_lanes++], name, sizeof tl->lanes[0]);
  if (fprintf(tl->file, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s\"}}",
              tl->rank, id, name) < 0)
    note_error(tl);
  return id;
}

void td_timeline_span(td_timeline *tl, const char *lane, const char *name, double begin_s, double end_s) {
  if (!tl) return;
  char safe_name[64], cat[32];
  json_safe(name ? name : "span", safe_name, sizeof safe_name);
  json_safe(lane ? lane : "main", cat, sizeof cat);
  double dur = end_s > begin_s ? (end_s - begin_s) * 1e6 : 0;
  pthread_mutex_lock(&tl->lock);
  int tid = lane_id(tl, lane);
  if (fprintf(tl->file, ",\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f}",
              safe_name, cat, tl->rank, tid, to_us(tl, begin_s), dur) < 0)
    note_error(tl);
  pthread_mutex_unlock(&tl->lock);
}

void td_timeline_counter(td_timeline *tl, const char *name, double t_s, double value) {
  if (!tl || !(value == value)) return; /* JSON has no NaN */
  char safe_name[64];
  json_safe(name ? name : "counter", safe_name, sizeof safe_name);
  pthread_mutex_lock(&tl->lock);
  if (fprintf(tl->file, ",\n{\"name\":\"%s\",\"ph\":\"C\",\"pid\":%d,\"tid\":0,\"ts\":%.3f,\"args\":{\"value\":%.9g}}",
              safe_name, tl->rank, to_us(tl, t_s), value) < 0)
    note_error(tl);
  pthread_mutex_unlock(&tl->lock);
}

td_status td_timeline_close(td_timeline *tl) {
  if (!tl) return TD_OK;
  pthread_mutex_lock(&tl->lock);
  if (fputs("\n]\n", tl->file) < 0) note_error(tl);
  if (fclose(tl->file) != 0 && tl->error == TD_OK) tl->error = td_error_errno("timeline: cannot close %s", tl->path);
  pthread_mutex_unlock(&tl->lock);
  td_status st = tl->error;
  pthread_mutex_destroy(&tl->lock);
  free(tl);
  return st;
}

/* Read a whole closed per-rank file and return the text between its outer
 * brackets (the events), trimmed; NULL with td_last_error set on failure. */
static char *read_events(const char *path, size_t *len_out) {
  FILE *f = fopen(path, "r");
  if (!f) {
    td_error_errno("timeline merge: cannot open %s (did every rank finish and close its timeline?)", path);
    return NULL;
  }
  td_buf text = {0};
  int failed = td_buf_append_file(&text, f, SIZE_MAX);
  fclose(f);
  if (failed) {
    td_error(text.failed ? TD_ERR_SYSTEM : TD_ERR_IO, "timeline merge: %s reading %s",
             text.failed ? "out of memory" : "read error", path);
    td_buf_free(&text);
    return NULL;
  }
  char *buf = text.data;
  size_t len = text.len;
  size_t b = 0, e = len;
  while (b < e && (buf[b] == ' ' || buf[b] == '\n' || buf[b] == '\r' || buf[b] == '\t')) b++;
  while (e > b && (buf[e - 1] == ' ' || buf[e - 1] == '\n' || buf[e - 1] == '\r' || buf[e - 1] == '\t')) e--;
  if (e - b < 2 || buf[b] != '[' || buf[e - 1] != ']') {
    free(buf);
    td_error(TD_ERR_IO, "timeline merge: %s is not a closed JSON array (a rank may have died before closing it)", path);
    return NULL;
  }
  memmove(buf, buf + b + 1, e - b - 2);
  *len_out = e - b - 2;
  return buf;
}

const char *td_timeline_default_path(void) { return td_env_str("TANDEM_TIMELINE", NULL); }

td_status td_timeline_merge(const char *path, int world) {
  if (!path) path = td_timeline_default_path();
  if (!path || world < 1) return td_error(TD_ERR_INVALID_ARGUMENT, "timeline merge: bad path or world size %d", world);
  char tmp[600];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *out = fopen(tmp, "w");
  if (!out) return td_error_errno("timeline merge: cannot create %s", tmp);
  td_status st = TD_OK;
  int wrote_any = 0;
  fputs("[", out);
  for (int r = 0; r < world && st == TD_OK; r++) {
    char part[600];
    snprintf(part, sizeof part, "%s.%d", path, r);
    size_t len = 0;
    char *events = read_events(part, &len);
    if (!events) {
      st = TD_ERR_IO;
      break;
    }
    /* Trim the events' own leading/trailing blanks before joining with a comma. */
    size_t b = 0;
    while (b < len && (events[b] == '\n' || events[b] == ' ')) b++;
    while (len > b && (events[len - 1] == '\n' || events[len - 1] == ' ')) len--;
    if (len > b) {
      if (wrote_any) fputs(",", out);
      fputs("\n", out);
      fwrite(events + b, 1, len - b, out);
      wrote_any = 1;
    }
    free(events);
  }
  fputs("\n]\n", out);
  if (fclose(out) != 0 && st == TD_OK) st = td_error_errno("timeline merge: cannot write %s", tmp);
  if (st == TD_OK && rename(tmp, path) != 0) st = td_error_errno("timeline merge: cannot rename %s to %s", tmp, path);
  if (st != TD_OK) remove(tmp);
  return st;
}
