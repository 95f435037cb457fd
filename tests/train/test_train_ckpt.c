/* Checkpoint durability and refusal tests on a world of one:
 *
 *   crash sweep   A child process saves with TANDEM_CKPT_FAULT_AT=N and is
 *                 killed (SIGKILL) just before its Nth file operation, for
 *                 N = 1, 2, ... until a save completes. After each death the
 *                 parent resumes from the directory: it must succeed and give
 *                 exactly the old checkpoint or exactly the new one (the next
 *                 step's loss and parameters bit for bit), for a fresh save
 *                 (step 6 beside step 4) and for a re-save of an existing
 *                 step (step 6 again, with different contents).
 *   keep_last     only the newest checkpoints stay, never the one `latest`
 *                 names.
 *   model shape   resuming onto a GPT with other heads (same tensor shapes)
 *                 or a CNN with other channels is refused naming the keys.
 *   manifest      td_ckpt_manifest_parse on truncations, out-of-range
 *                 numbers, duplicates and NUL bytes: errors, never a crash.
 *   JSON buffer   td_train_config_parse_json_buffer reads exactly len bytes.
 */
#include "train/checkpoint/ckpt.h"
#include "train/core/core.h"

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../common/check.h"
#include "tiny_model.h"

static td_trainer *make(td_model *m, td_dataset *ds, float lr, int keep_last) {
  td_train_config c;
  td_train_config_defaults(&c);
  c.micro_batch = 4;
  c.grad_accum = 1;
  c.seed = 11;
  c.optimizer.lr = lr;
  c.threads = 1;
  c.keep_last = keep_last;
  td_trainer *t = NULL;
  CHECK_OK(td_trainer_create(&c, m, ds, NULL, &t));
  tiny_init_params(td_trainer_params_mut(t), 5);
  return t;
}

static void rm_rf(const char *dir) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
}

/* The state a resume leads to, seen through the next step. */
typedef struct outcome {
  long step;
  double next_loss;
  float params[TINY_N];
} outcome;

static void outcome_of(td_model *m, td_dataset *ds, const char *path, outcome *o) {
  td_trainer *t = make(m, ds, 0.01f, 0);
  CHECK_OK(td_trainer_resume(t, path));
  o->step = td_trainer_step_count(t);
  td_step_stats st;
  CHECK_OK(td_trainer_step(t, &st));
  o->next_loss = st.loss;
  memcpy(o->params, td_trainer_params(t), sizeof o->params);
  td_trainer_destroy(t);
}

static int same_outcome(const outcome *a, const outcome *b) {
  return a->step == b->step && a->next_loss == b->next_loss && memcmp(a->params, b->params, sizeof a->params) == 0;
}

/* Baseline in root: steps 1-4 saved (step-4), and with `resave`, steps 5-6
 * with lr 0.01 saved too (step-6, latest). */
static void baseline(td_model *m, td_dataset *ds, const char *root, int resave) {
  rm_rf(root);
  td_trainer *t = make(m, ds, 0.01f, 0);
  for (int s = 0; s < 4; s++) CHECK_OK(td_trainer_step(t, NULL));
  CHECK_OK(td_trainer_save(t, root));
  if (resave) {
    for (int s = 0; s < 2; s++) CHECK_OK(td_trainer_step(t, NULL));
    CHECK_OK(td_trainer_save(t, root));
  }
  td_trainer_destroy(t);
}

/* The save under test: from step-4, two steps with lr 0.02 (so that a
 * re-saved step 6 differs from the baseline's), then save into root. */
static void the_save(td_model *m, td_dataset *ds, const char *root) {
  char path[600];
  snprintf(path, sizeof path, "%s/step-4", root);
  td_trainer *t = make(m, ds, 0.02f, 0);
  CHECK_OK(td_trainer_resume(t, path));
  for (int s = 0; s < 2; s++) CHECK_OK(td_trainer_step(t, NULL));
  CHECK_OK(td_trainer_save(t, root));
  td_trainer_destroy(t);
}

static void crash_sweep(td_model *m, td_dataset *ds, int resave) {
  char root[] = "/tmp/td-h7train-crash-XXXXXX";
  CHECK(mkdtemp(root) != NULL);
  /* The two acceptable outcomes. */
  outcome old_state, new_state;
  baseline(m, ds, root, resave);
  outcome_of(m, ds, root, &old_state);
  the_save(m, ds, root);
  outcome_of(m, ds, root, &new_state);
  CHECK_EQ_INT(old_state.step, resave ? 6 : 4);
  CHECK_EQ_INT(new_state.step, 6);
  CHECK(!same_outcome(&old_state, &new_state));

  int n_old = 0, n_new = 0, completed_at = 0;
  for (int n = 1; n <= 500 && !completed_at; n++) {
    baseline(m, ds, root, resave);
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
      char value[16];
      snprintf(value, sizeof value, "%d", n);
      setenv("TANDEM_CKPT_FAULT_AT", value, 1); /* read when the trainer is created */
      the_save(m, ds, root);
      _exit(0);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      completed_at = n; /* the save has fewer than n file operations */
    } else if (!(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)) {
      td_test_fail(__FILE__, __LINE__, "fault at %d: the child ended with status 0x%x, not by SIGKILL", n, status);
    }
    outcome got;
    outcome_of(m, ds, root, &got);
    if (same_outcome(&got, &old_state)) n_old++;
    else if (same_outcome(&got, &new_state)) n_new++;
    else td_test_fail(__FILE__, __LINE__, "fault at %d: resumed step %ld is neither the old nor the new checkpoint", n,
                      got.step);
    /* A leftover never confuses the next save: it completes and is exact. */
    if (n % 7 == 0) {
      the_save(m, ds, root);
      outcome_of(m, ds, root, &got);
      CHECK(same_outcome(&got, &new_state));
    }
  }
  CHECK(completed_at > 10);
  CHECK(n_old > 0 && n_new > 0);
  printf("crash sweep (%s): killed at each of %d file operations: %d resumed the old checkpoint, %d the new one\n",
         resave ? "re-save of step 6" : "fresh save of step 6", completed_at - 1, n_old, n_new - 1);
  rm_rf(root);
}

/* ---- keep_last ---- */

static int count_dirs(const char *root, const char *must_have) {
  DIR *d = opendir(root);
  CHECK(d != NULL);
  int n = 0, found = must_have == NULL;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (strncmp(e->d_name, "step-", 5) != 0) continue;
    n++;
    if (must_have && strcmp(e->d_name, must_have) == 0) found = 1;
  }
  closedir(d);
  if (!found) td_test_fail(__FILE__, __LINE__, "%s lacks %s", root, must_have);
  return n;
}

static void read_latest_name(const char *root, char *out, size_t size) {
  char path[600];
  snprintf(path, sizeof path, "%s/latest", root);
  FILE *f = fopen(path, "r");
  CHECK(f != NULL);
  CHECK(fgets(out, (int)size, f) != NULL);
  fclose(f);
  out[strcspn(out, "\n")] = '\0';
}

static void test_keep_last(td_model *m, td_dataset *ds) {
  char root[] = "/tmp/td-h7train-keep-XXXXXX";
  CHECK(mkdtemp(root) != NULL);
  td_trainer *t = make(m, ds, 0.01f, 2);
  for (int s = 0; s < 5; s++) {
    CHECK_OK(td_trainer_save(t, root));
    CHECK_OK(td_trainer_step(t, NULL));
  }
  CHECK_OK(td_trainer_save(t, root)); /* steps 0..5 saved, 2 kept */
  CHECK_EQ_INT(count_dirs(root, "step-5"), 2);
  CHECK_EQ_INT(count_dirs(root, "step-4"), 2);
  td_trainer_destroy(t);
  /* Back to step 4 and save it again: the re-saved step-4.1 is what latest
   * names and stays; of the others only the newest (step-5) is kept. */
  char path[600], name[64];
  snprintf(path, sizeof path, "%s/step-4", root);
  t = make(m, ds, 0.01f, 2);
  CHECK_OK(td_trainer_resume(t, path));
  CHECK_OK(td_trainer_save(t, root));
  read_latest_name(root, name, sizeof name);
  CHECK(strcmp(name, "step-4.1") == 0);
  CHECK_EQ_INT(count_dirs(root, "step-5"), 2);
  CHECK_EQ_INT(count_dirs(root, "step-4.1"), 2);
  td_trainer_destroy(t);
  /* keep_last 1: only what latest names. */
  t = make(m, ds, 0.01f, 1);
  CHECK_OK(td_trainer_resume(t, root));
  CHECK_EQ_INT(td_trainer_step_count(t), 4);
  CHECK_OK(td_trainer_step(t, NULL));
  CHECK_OK(td_trainer_save(t, root));
  CHECK_EQ_INT(count_dirs(root, "step-5.1"), 1);
  td_trainer_destroy(t);
  /* keep_last 0 keeps everything. */
  t = make(m, ds, 0.01f, 0);
  CHECK_OK(td_trainer_resume(t, root));
  for (int s = 0; s < 3; s++) {
    CHECK_OK(td_trainer_step(t, NULL));
    CHECK_OK(td_trainer_save(t, root));
  }
  CHECK_EQ_INT(count_dirs(root, "step-6"), 4);
  td_trainer_destroy(t);
  /* The config key and its check. */
  td_train_config c;
  td_train_config_defaults(&c);
  CHECK_OK(td_train_config_parse_json("{\"checkpoint\": {\"save_dir\": \"x\", \"keep_last\": 3}}", "t.json", &c));
  CHECK_EQ_INT(c.keep_last, 3);
  CHECK_MSG(td_train_config_parse_json("{\"checkpoint\": {\"keep_last\": -1}}", "t.json", &c), TD_ERR_INVALID_ARGUMENT,
            "checkpoint.keep_last");
  printf("keep_last: newest kept, latest's never removed\n");
  rm_rf(root);
}

/* ---- model shape ---- */

enum { SHAPE_T = 8 };
static td_status text_get(const td_dataset *ds, size_t index, void *input, int32_t *targets) {
  (void)ds;
  int32_t *tok = input;
  for (int j = 0; j <= SHAPE_T; j++) {
    int32_t v = (int32_t)('a' + (index * 3 + (size_t)j) % 26);
    if (j < SHAPE_T) tok[j] = v;
    if (j > 0) targets[j - 1] = v;
  }
  return TD_OK;
}
static td_status image_get(const td_dataset *ds, size_t index, void *input, int32_t *targets) {
  (void)ds;
  float *x = input;
  for (int i = 0; i < 784; i++) x[i] = (float)((index * 31 + (size_t)i) % 17) / 17.0f;
  targets[0] = (int32_t)(index % 10);
  return TD_OK;
}
static void plain_destroy(td_dataset *ds) { free(ds); }

static td_trainer *make_plain(td_model *m, td_dataset *ds) {
  td_train_config c;
  td_train_config_defaults(&c);
  c.micro_batch = 2;
  c.threads = 1;
  td_trainer *t = NULL;
  CHECK_OK(td_trainer_create(&c, m, ds, NULL, &t));
  return t;
}

static void test_model_shape(void) {
  char root[] = "/tmp/td-h7train-shape-XXXXXX";
  CHECK(mkdtemp(root) != NULL);
  td_dataset *text = calloc(1, sizeof *text);
  *text = (td_dataset){.n_samples = 40, .input_bytes = SHAPE_T * 4, .targets_per_sample = SHAPE_T, .get = text_get,
                       .destroy = plain_destroy};
  td_gpt_config g2 = {.vocab = 128, .layers = 1, .channels = 16, .heads = 2, .seq = SHAPE_T};
  td_gpt_config g4 = g2, g_wide = g2;
  g4.heads = 4; /* the same tensors, another model */
  g_wide.channels = 32;
  g_wide.layers = 2;
  td_model *m2, *m4, *mw;
  CHECK_OK(td_gpt_create(&g2, &m2));
  CHECK_OK(td_gpt_create(&g4, &m4));
  CHECK_OK(td_gpt_create(&g_wide, &mw));
  CHECK(m2->n_params == m4->n_params);
  td_trainer *a = make_plain(m2, text);
  CHECK_OK(td_trainer_step(a, NULL));
  CHECK_OK(td_trainer_save(a, root));
  td_trainer *b = make_plain(m4, text);
  CHECK_MSG(td_trainer_resume(b, root), TD_ERR_INVALID_ARGUMENT, "heads: 2 in the checkpoint, 4 in this run");
  CHECK_EQ_INT(td_trainer_step_count(b), 0);
  td_trainer *c = make_plain(mw, text);
  CHECK_MSG(td_trainer_resume(c, root), TD_ERR_INVALID_ARGUMENT,
            "layers: 1 in the checkpoint, 2 in this run; channels: 16 in the checkpoint, 32 in this run");
  td_trainer *same = make_plain(m2, text);
  CHECK_OK(td_trainer_resume(same, root));
  td_trainer_destroy(a), td_trainer_destroy(b), td_trainer_destroy(c), td_trainer_destroy(same);
  td_model_destroy(m2), td_model_destroy(m4), td_model_destroy(mw);
  td_dataset_destroy(text);
  rm_rf(root);

  strcpy(root, "/tmp/td-h7train-shape-XXXXXX");
  CHECK(mkdtemp(root) != NULL);
  td_dataset *images = calloc(1, sizeof *images);
  *images = (td_dataset){.n_samples = 20, .input_bytes = 784 * 4, .targets_per_sample = 1, .get = image_get,
                         .destroy = plain_destroy};
  td_cnn_config k1 = {.channels1 = 2, .channels2 = 4, .hidden = 8, .classes = 10}, k2 = k1;
  k2.channels2 = 3;
  td_model *c1, *c2;
  CHECK_OK(td_cnn_create(&k1, &c1));
  CHECK_OK(td_cnn_create(&k2, &c2));
  a = make_plain(c1, images);
  CHECK_OK(td_trainer_save(a, root));
  b = make_plain(c2, images);
  CHECK_MSG(td_trainer_resume(b, root), TD_ERR_INVALID_ARGUMENT, "channels2: 4 in the checkpoint, 3 in this run");
  td_trainer_destroy(a), td_trainer_destroy(b);
  td_model_destroy(c1), td_model_destroy(c2);
  td_dataset_destroy(images);
  rm_rf(root);
  printf("model shape: other heads / layers+channels / CNN channels refused, naming each\n");
}

/* ---- the manifest parser on hostile input ---- */

static char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  CHECK(f != NULL);
  fseek(f, 0, SEEK_END);
  *n = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc(*n + 1);
  CHECK(fread(b, 1, *n, f) == *n);
  fclose(f);
  return b;
}

/* Re-seal a manifest body with a correct closing CRC (so that the parser
 * reaches the line checks), into out. */
static size_t seal(const char *body, char *out, size_t cap) {
  size_t n = strlen(body);
  CHECK(n + 32 < cap);
  memcpy(out, body, n);
  return n + (size_t)snprintf(out + n, cap - n, "manifest_crc %08x\n", (unsigned)td_crc32(0, body, n));
}

static void expect_parse_error(const char *body, const char *fragment) {
  char buf[8192];
  size_t n = seal(body, buf, sizeof buf);
  td_ckpt_manifest m;
  CHECK_MSG(td_ckpt_manifest_parse(buf, n, "test-manifest", &m), TD_ERR_IO, fragment);
  td_ckpt_manifest_free(&m);
}

static void test_manifest_parser(td_model *m, td_dataset *ds) {
  char root[] = "/tmp/td-h7train-manifest-XXXXXX";
  CHECK(mkdtemp(root) != NULL);
  td_trainer *t = make(m, ds, 0.01f, 0);
  CHECK_OK(td_trainer_save(t, root));
  td_trainer_destroy(t);
  char path[600];
  snprintf(path, sizeof path, "%s/step-0/manifest", root);
  size_t n;
  char *text = slurp(path, &n);
  td_ckpt_manifest man;
  CHECK_OK(td_ckpt_manifest_parse(text, n, path, &man));
  CHECK_EQ_INT(man.world, 1);
  CHECK_EQ_INT(man.n_params, TINY_N);
  CHECK_EQ_INT(man.n_tensors, 4);
  CHECK(strcmp(man.tensors[3].name, "fc2.bias") == 0);
  CHECK(strcmp(man.model_config, "inputs=16 hidden=32 classes=5") == 0);
  td_ckpt_manifest_free(&man);
  /* Every truncation is refused (not read past the buffer: ASan watches). */
  for (size_t len = 0; len < n; len++) {
    char *cut = malloc(len ? len : 1);
    memcpy(cut, text, len);
    td_status st = td_ckpt_manifest_parse(cut, len, path, &man);
    if (st == TD_OK) td_test_fail(__FILE__, __LINE__, "a manifest cut to %zu of %zu bytes was accepted", len, n);
    free(cut);
  }
  /* A NUL byte. */
  text[10] = '\0';
  CHECK_MSG(td_ckpt_manifest_parse(text, n, path, &man), TD_ERR_IO, "NUL byte");
  free(text);
  rm_rf(root);

  /* Hand-made format-2 manifests: 100 elements in 3 arenas, two files of
   * 50 elements of each arena, 64-byte chunks (4 CRCs per 200-byte piece). */
  const char *head = "tandem-checkpoint 2\nworld_size 2\nstep 3\nmodel_kind tiny\nn_params 100\noptimizer adamw\n"
                     "n_state_arenas 2\nchunk_bytes 64\nn_tensors 1\ntensor 0 100 w\nn_arenas 3\n"
                     "arena 0 params f32 100\narena 1 adamw.m f32 100\narena 2 adamw.v f32 100\n";
  const char *crc4 = "0,0,0,0";
  char body[4096], pieces[2048];
  int np = 0;
  for (int f = 0; f < 2; f++)
    for (int a = 0; a < 3; a++)
      np += snprintf(pieces + np, sizeof pieces - (size_t)np, "piece %d %d %d %d %d %s\n", f, a, 50 * f, 50 * f + 50,
                     200 * a, crc4);
  snprintf(body, sizeof body, "%sn_files 2\nfile a 600\nfile b 600\n%s", head, pieces);
  {
    char buf[8192];
    size_t len = seal(body, buf, sizeof buf);
    CHECK_OK(td_ckpt_manifest_parse(buf, len, "ok", &man));
    CHECK_EQ_INT(man.n_pieces, 6);
    /* Sorted by (arena, lo), and a range lookup finds the overlapping ones. */
    CHECK(man.pieces[0].arena == 0 && man.pieces[0].lo == 0 && man.pieces[1].lo == 50 && man.pieces[5].arena == 2);
    int first, end;
    td_ckpt_pieces_overlapping(&man, 1, 49, 51, &first, &end);
    CHECK(first == 2 && end == 4);
    td_ckpt_pieces_overlapping(&man, 2, 50, 51, &first, &end);
    CHECK(first == 5 && end == 6);
    td_ckpt_pieces_overlapping(&man, 0, 10, 10, &first, &end);
    CHECK(end - first <= 1);
    /* format -> parse gives the same manifest back. */
    char *again = td_ckpt_manifest_format(&man);
    CHECK(again != NULL);
    td_ckpt_manifest m2;
    CHECK_OK(td_ckpt_manifest_parse(again, strlen(again), "again", &m2));
    CHECK(m2.n_pieces == 6 && m2.pieces[3].lo == man.pieces[3].lo && m2.pieces[3].offset == man.pieces[3].offset);
    free(again);
    td_ckpt_manifest_free(&m2);
    td_ckpt_manifest_free(&man);
  }
  /* A gap in an arena: elements [50, 60) of arena 0 nowhere. */
  snprintf(body, sizeof body, "%sn_files 2\nfile a 600\nfile b 560\n%s", head, pieces);
  char *p = strstr(body, "piece 1 0 50 100 0 0,0,0,0");
  CHECK(p != NULL);
  memcpy(p, "piece 1 0 60 100 0 0,0,0  ", 26); /* 40 elements: 160 bytes, 3 chunks */
  expect_parse_error(body, "arena 0 (params) has a gap at element 50");
  /* Overlapping pieces of an arena (both files hold [0, 50) of arena 1). */
  snprintf(body, sizeof body, "%sn_files 2\nfile a 600\nfile b 600\n%s", head, pieces);
  p = strstr(body, "piece 1 1 50 100");
  memcpy(p, "piece 1 1 0  50 ", 16);
  expect_parse_error(body, "overlapping pieces");
  /* A file whose size disagrees with its pieces; pieces overlapping in a file. */
  snprintf(body, sizeof body, "%sn_files 2\nfile a 600\nfile b 604\n%s", head, pieces);
  expect_parse_error(body, "file b is listed with 604 bytes but its pieces fill 600");
  snprintf(body, sizeof body, "%sn_files 2\nfile a 600\nfile b 600\n%s", head, pieces);
  p = strstr(body, "piece 1 2 50 100 400");
  memcpy(p, "piece 1 2 50 100 200", 20);
  expect_parse_error(body, "the pieces of file b overlap");
  /* Wrong CRC counts, names that leave the directory, unknown arena, a piece past its arena. */
  snprintf(body, sizeof body, "%sn_files 1\nfile a 200\npiece 0 0 0 50 0 0,0,0\n", head);
  expect_parse_error(body, "cannot parse the line \"piece 0 0 0 50 0 0,0,0\"");
  snprintf(body, sizeof body, "%sn_files 1\nfile a 200\npiece 0 0 0 50 0 0,0,0,0,0\n", head);
  expect_parse_error(body, "cannot parse the line \"piece 0 0 0 50 0 0,0,0,0,0\"");
  snprintf(body, sizeof body, "%sn_files 1\nfile ../etc/passwd 200\n", head);
  expect_parse_error(body, "cannot parse the line \"file ../etc/passwd");
  snprintf(body, sizeof body, "%sn_files 2\nfile a 200\nfile a 200\n", head);
  expect_parse_error(body, "cannot parse the line \"file a 200\""); /* a name twice */
  snprintf(body, sizeof body, "%sn_files 1\nfile a 200\npiece 0 3 0 50 0 0,0,0,0\n", head);
  expect_parse_error(body, "cannot parse the line \"piece 0 3");
  snprintf(body, sizeof body, "%sn_files 1\nfile a 200\npiece 0 0 60 110 0 0,0,0,0\n", head);
  expect_parse_error(body, "cannot parse the line \"piece 0 0 60 110");
  snprintf(body, sizeof body, "%sn_files 1\nfile a 200\npiece 0 0 50 50 0 0\n", head);
  expect_parse_error(body, "cannot parse the line \"piece 0 0 50 50"); /* empty */
  snprintf(body, sizeof body, "%sn_files 1\nfile a 4\n", head);
  expect_parse_error(body, "the pieces of arena 0 (params) end at element 0 of 100");
  /* The tensor table, sizes, duplicates and format lines. */
  snprintf(body, sizeof body, "tandem-checkpoint 2\nn_params 100\nn_tensors 1\ntensor 60 50 w\n");
  expect_parse_error(body, "cannot parse the line \"tensor 60 50"); /* past n_params */
  snprintf(body, sizeof body, "tandem-checkpoint 2\nn_params 100\nn_tensors 1\ntensor 18446744073709551615 2 w\n");
  expect_parse_error(body, "cannot parse the line \"tensor 1844"); /* offset + count would wrap */
  snprintf(body, sizeof body, "%sn_files 0\n", head);
  expect_parse_error(body, "end at element 0"); /* nothing stored */
  expect_parse_error("tandem-checkpoint 2\nworld_size 4294967297\n", "cannot parse the line \"world_size");
  expect_parse_error("tandem-checkpoint 2\nworld_size -1\n", "cannot parse the line \"world_size");
  expect_parse_error("tandem-checkpoint 2\nworld_size 2\nworld_size 3\n", "appears twice");
  expect_parse_error("tandem-checkpoint 2\nzero_stage 4\n", "cannot parse the line \"zero_stage");
  expect_parse_error("tandem-checkpoint 2\nchunk_bytes 6\n", "cannot parse the line \"chunk_bytes");
  expect_parse_error("tandem-checkpoint 2\nn_params 99999999999999999999\n", "cannot parse the line \"n_params");
  expect_parse_error("tandem-checkpoint 2\nn_params 2000000000000\n", "cannot parse the line \"n_params");
  expect_parse_error("tandem-checkpoint 2\npiece 0 0 0 1 0 0\n", "cannot parse the line \"piece"); /* before the tables */
  expect_parse_error("tandem-checkpoint 2\nn_tensors 1\ntensor 0 1 w\n", "cannot parse the line \"tensor"); /* no n_params */
  expect_parse_error("tandem-checkpoint 7\n", "format 7");
  expect_parse_error("world_size 2\n", "not a Tandem checkpoint manifest");
  /* A manifest of the previous format is refused saying the format changed. */
  expect_parse_error("tandem-checkpoint 1\nworld_size 2\nshard 0 1200 0 rank-0.bin\n",
                     "checkpoint has format 1 (written by a Tandem before checkpoints could reshard)");
  printf("manifest parser: truncations, overflows, duplicates and NUL bytes refused\n");
}

static void test_json_buffer(void) {
  td_train_config c;
  td_train_config_defaults(&c);
  const char text[] = "{\"seed\": 5}{\"seed\": 6}";
  CHECK_OK(td_train_config_parse_json_buffer(text, 11, "buffer", &c)); /* only the first object */
  CHECK_EQ_INT(c.seed, 5);
  CHECK_MSG(td_train_config_parse_json_buffer(text, 8, "buffer", &c), TD_ERR_INVALID_ARGUMENT, "buffer:1:");
  CHECK_MSG(td_train_config_parse_json_buffer("{\"seed\": 1\0}", 12, "nul", &c), TD_ERR_INVALID_ARGUMENT, "NUL byte");
  CHECK_MSG(td_train_config_parse_json_buffer("", 0, "empty", &c), TD_ERR_INVALID_ARGUMENT, "not valid JSON");
  CHECK_EQ_INT(c.seed, 5);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  td_dataset *ds = tiny_dataset_create(64);
  td_model *m = tiny_model_create();
  const char *only = argc > 1 ? argv[1] : NULL;
  if (!only || !strcmp(only, "crash")) {
    crash_sweep(m, ds, 0);
    crash_sweep(m, ds, 1);
  }
  if (!only || !strcmp(only, "other")) {
    test_keep_last(m, ds);
    test_model_shape();
    test_manifest_parser(m, ds);
    test_json_buffer();
  }
  td_model_destroy(m);
  td_dataset_destroy(ds);
  printf("train checkpoints: ok\n");
  return 0;
}
