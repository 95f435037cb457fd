/* src/obs: the metrics file is valid JSON lines whose losses round-trip
 * exactly, the timeline files (per rank and merged) are valid Chrome trace
 * JSON with the spans recorded, and the progress display prints the lines
 * its mode promises. */
#include "base/base.h"
#include "../common/check.h"
#include "tandem/obs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef TD_HAVE_CJSON
#include <cjson/cJSON.h>
#endif

static char *slurp(const char *path) {
  FILE *f = fopen(path, "r");
  CHECK(f != NULL);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  CHECK(fread(buf, 1, (size_t)n, f) == (size_t)n);
  buf[n] = 0;
  fclose(f);
  return buf;
}

static void test_metrics(const char *dir) {
  char path[512];
  snprintf(path, sizeof path, "%s/m.jsonl", dir);
  td_metrics *m;
  CHECK_OK(td_metrics_open(path, "tokens", 0, &m));
  const float losses[3] = {5.54517746f, 3.14159274f, 1.0e-7f};
  for (int i = 0; i < 3; i++) {
    td_step_metrics s;
    td_step_metrics_clear(&s);
    s.step = i + 1;
    s.loss = losses[i];
    s.lr = 3e-4;
    s.items_per_s = 12345.6;
    s.compute_s = 0.25;
    s.comm_wait_s = 0.01;
    if (i == 1) s.grad_norm = 1.5;
    CHECK_OK(td_metrics_write_step(m, &s));
  }
  const char *keys[2] = {"epoch", "test_accuracy"};
  const double vals[2] = {1, 0.9125};
  CHECK_OK(td_metrics_write_values(m, "eval", 3, 2, keys, vals));
  CHECK_OK(td_metrics_close(m));

  FILE *f = fopen(path, "r");
  CHECK(f != NULL);
  char line[2048];
  int n_lines = 0;
  while (fgets(line, sizeof line, f)) {
    CHECK(line[strlen(line) - 1] == '\n');
#ifdef TD_HAVE_CJSON
    cJSON *o = cJSON_Parse(line);
    CHECK(o != NULL);
    if (n_lines < 3) {
      CHECK_EQ_INT(cJSON_GetObjectItem(o, "step")->valuedouble, n_lines + 1);
      float back = (float)cJSON_GetObjectItem(o, "loss")->valuedouble;
      CHECK(back == losses[n_lines]); /* exact round trip */
      CHECK_CLOSE(cJSON_GetObjectItem(o, "tokens_per_s")->valuedouble, 12345.6, 1e-9, 0.05);
      CHECK_CLOSE(cJSON_GetObjectItem(o, "compute_s")->valuedouble, 0.25, 0, 1e-9);
      CHECK(cJSON_GetObjectItem(o, "time") != NULL);
      CHECK((cJSON_GetObjectItem(o, "grad_norm") != NULL) == (n_lines == 1));
    } else {
      CHECK(!strcmp(cJSON_GetObjectItem(o, "event")->valuestring, "eval"));
      CHECK_CLOSE(cJSON_GetObjectItem(o, "test_accuracy")->valuedouble, 0.9125, 0, 1e-12);
    }
    cJSON_Delete(o);
#else
    CHECK(line[0] == '{' && strstr(line, "\"step\":") != NULL);
#endif
    n_lines++;
  }
  fclose(f);
  CHECK_EQ_INT(n_lines, 4);

  /* An unwritable path is refused with a message naming it. */
  CHECK_STATUS(td_metrics_open("/nonexistent-dir/x.jsonl", "tokens", 0, &m), TD_ERR_SYSTEM);
  CHECK(strstr(td_last_error(), "/nonexistent-dir/x.jsonl") != NULL);
}

static void check_trace(const char *path, int expect_ranks, int expect_spans) {
  char *text = slurp(path);
#ifdef TD_HAVE_CJSON
  cJSON *arr = cJSON_Parse(text);
  CHECK(arr != NULL);
  CHECK(cJSON_IsArray(arr));
  int spans = 0, ranks_seen = 0;
  cJSON *ev;
  cJSON_ArrayForEach(ev, arr) {
    const char *ph = cJSON_GetObjectItem(ev, "ph")->valuestring;
    if (!strcmp(ph, "X")) {
      spans++;
      CHECK(cJSON_GetObjectItem(ev, "dur")->valuedouble >= 0);
    }
    if (!strcmp(ph, "M") && !strcmp(cJSON_GetObjectItem(ev, "name")->valuestring, "process_name")) ranks_seen++;
  }
  CHECK_EQ_INT(spans, expect_spans);
  CHECK_EQ_INT(ranks_seen, expect_ranks);
  cJSON_Delete(arr);
#else
  (void)expect_ranks;
  (void)expect_spans;
  CHECK(text[0] == '[');
#endif
  free(text);
}

static void test_timeline(const char *dir) {
  char path[512];
  snprintf(path, sizeof path, "%s/tl.json", dir);
  /* Off when neither a path nor TANDEM_TIMELINE is given. */
  unsetenv("TANDEM_TIMELINE");
  td_timeline *tl;
  CHECK_OK(td_timeline_open(NULL, 0, 1, &tl));
  CHECK(tl == NULL);
  td_timeline_span(NULL, "compute", "x", 0, 1); /* NULL handle: no-op */

  for (int r = 0; r < 2; r++) {
    CHECK_OK(td_timeline_open(path, r, 2, &tl));
    double t0 = td_timeline_now();
    td_timeline_span(tl, "compute", "forward", t0, t0 + 0.001);
    td_timeline_span(tl, "compute", "backward", t0 + 0.001, t0 + 0.003);
    td_timeline_span(tl, "comm", "allreduce \"bucket\" 0", t0 + 0.002, t0 + 0.004); /* quote gets replaced */
    td_timeline_counter(tl, "loss", t0 + 0.004, 2.5);
    CHECK_OK(td_timeline_close(tl));
    char part[600];
    snprintf(part, sizeof part, "%s.%d", path, r);
    check_trace(part, 1, 3);
  }
  CHECK_OK(td_timeline_merge(path, 2));
  check_trace(path, 2, 6);

  /* A missing rank file is reported, naming it. */
  CHECK(td_timeline_merge(path, 3) != TD_OK);
  CHECK(strstr(td_last_error(), ".2") != NULL);

  /* TANDEM_TIMELINE picks the file for a world of one. */
  setenv("TANDEM_TIMELINE", path, 1);
  CHECK_OK(td_timeline_open(NULL, 0, 1, &tl));
  CHECK(tl != NULL);
  td_timeline_span(tl, "compute", "step", td_timeline_now(), td_timeline_now());
  CHECK_OK(td_timeline_close(tl));
  check_trace(path, 1, 1);
  unsetenv("TANDEM_TIMELINE");
}

static void test_progress(const char *dir) {
  char path[512];
  snprintf(path, sizeof path, "%s/progress.txt", dir);
  for (int mode = TD_PROGRESS_LIVE; mode <= TD_PROGRESS_OFF; mode++) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    td_progress_config cfg = {.total_steps = 25, .steps_per_print = 10, .unit = "tokens",
                              .label = "test", .mode = (td_progress_mode)mode, .stream = f};
    td_progress *p;
    CHECK_OK(td_progress_create(&cfg, &p));
    CHECK_EQ_INT(td_progress_get_mode(p), mode);
    for (long s = 1; s <= 25; s++) {
      td_step_metrics m;
      td_step_metrics_clear(&m);
      m.step = s;
      m.loss = 5.0 / (double)s;
      m.items_per_s = 20000;
      td_progress_update(p, &m);
    }
    td_progress_destroy(p);
    fclose(f);
    char *text = slurp(path);
    int newlines = 0, returns = 0;
    for (char *c = text; *c; c++) {
      newlines += *c == '\n';
      returns += *c == '\r';
    }
    if (mode == TD_PROGRESS_PLAIN) {
      /* steps 1, 10, 20 and the last one, 25 */
      CHECK_EQ_INT(newlines, 4);
      CHECK_EQ_INT(returns, 0);
      CHECK(strstr(text, "test step 1/25 loss 5.0000") != NULL);
      CHECK(strstr(text, "step 25/25 loss 0.2000 20.0k tokens/s") != NULL);
      CHECK(strstr(text, "eta 0s") != NULL);
    } else if (mode == TD_PROGRESS_LIVE) {
      /* one line, redrawn: the last draw is the final step, ended by a newline */
      CHECK_EQ_INT(newlines, 1);
      CHECK(returns >= 2);
      CHECK(strstr(text, "step 25/25 | loss 0.2000") != NULL);
    } else {
      CHECK_EQ_INT((int)strlen(text), 0);
    }
    free(text);
  }
  char buf[32];
  td_format_duration(3725, buf, sizeof buf);
  CHECK(!strcmp(buf, "1h02m"));
  td_format_duration(187, buf, sizeof buf);
  CHECK(!strcmp(buf, "3m07s"));
  td_format_duration(-1, buf, sizeof buf);
  CHECK(!strcmp(buf, "?"));
}

int main(void) {
  char dir[] = "/tmp/tandem-test-obs-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  test_metrics(dir);
  test_timeline(dir);
  test_progress(dir);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
  printf("test_obs: ok\n");
  return 0;
}
