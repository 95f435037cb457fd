/* Checkpoints that reshard (src/train/checkpoint/), run under tandemrun:
 *
 *   test_ckpt worlds DIR OPT      (-np 4)
 *       Sub-communicators of 1, 2, 3 and 4 ranks (td_comm_split). For every
 *       save world S and load world L in 1..4, on the test MLP (709
 *       parameters: divides by none of 2, 3, 4):
 *       - the S-rank job trains 2 steps and saves; its state (parameters,
 *         optimizer states, step, sampler position) is the reference;
 *       - for each ZeRO stage's load pattern at L (stage 0: every arena
 *         whole; 1 and 2: parameters whole, optimizer states this rank's
 *         td_shard_range; 3: everything sharded; plus two odd sub-ranges),
 *         td_ckpt_load_regions must return exactly the reference's elements;
 *       - td_trainer_resume at L gives the reference state bit for bit, and
 *         the next 2 steps give bit-identical losses and parameters to an L-
 *         rank trainer handed the reference state in memory, and losses
 *         within summation noise of the S-rank run continuing (the sampler
 *         resumes at the same sample: the global batch is fixed).
 *       Then a chain 1 -> 2 -> 3 -> 4 -> 1 (2 steps per world, a save and a
 *       resume at each change) against the same chain handed over in
 *       memory: every loss bit-identical. Then regions that do not tile the
 *       state (two ranks writing the same range) fail the save on every
 *       rank; an uneven tiling (rank 0 writes nothing) saves and loads.
 *       TANDEM_CKPT_CHUNK_BYTES is set small so that ranges cross CRC
 *       chunk edges everywhere. OPT: adamw (2 state arenas) or sgd (1).
 *
 *   test_ckpt corrupt DIR         (world of one)
 *       A saved checkpoint, then: a truncated data file, one flipped bit, a
 *       missing data file, a manifest edited without its CRC, an old
 *       format-1 manifest, and another model: each refused by
 *       td_trainer_resume and td_ckpt_verify with a message naming the file
 *       and the problem, the trainer unchanged. A shard read touches only
 *       the chunks it needs (bytes counted). td_ckpt_consolidate writes a
 *       safetensors file whose header and data this test parses itself and
 *       compares with the trainer's parameters. */
#include <dirent.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/check.h"
#include "../train/tiny_model.h"
#include "train/checkpoint/ckpt.h"
#include "train/core/core.h"

#define G 12 /* global batch: divides by 1, 2, 3, 4 */
#define MAXW 4

static td_optimizer_kind opt_kind = TD_OPTIMIZER_ADAMW;
static long batch = G;         /* the global batch make() asks for */
static int allow_batch_change; /* its allow_batch_size_change */

static td_trainer *make(td_model *m, td_dataset *ds, td_comm *comm) {
  int world = comm ? td_comm_size(comm) : 1;
  td_train_config c;
  td_train_config_defaults(&c);
  c.train_batch_size = batch;
  c.micro_batch = (int)batch / world;
  c.grad_accum = 1;
  c.allow_batch_size_change = allow_batch_change;
  c.seed = 77;
  c.optimizer.kind = opt_kind;
  c.optimizer.lr = opt_kind == TD_OPTIMIZER_SGD ? 0.05f : 1e-2f;
  c.optimizer.momentum = opt_kind == TD_OPTIMIZER_SGD ? 0.9f : 0.0f;
  c.threads = 1;
  td_trainer *t = NULL;
  CHECK_OK(td_trainer_create(&c, m, ds, comm, &t));
  tiny_init_params(td_trainer_params_mut(t), 9);
  return t;
}

/* A trainer's whole state, as the reference. */
typedef struct state {
  long step;
  uint64_t consumed;
  int n_arenas;
  float arena[3][TINY_N];
} state;

static void state_of(const td_trainer *t, state *s) {
  s->step = t->step;
  s->consumed = t->consumed;
  s->n_arenas = 1 + t->n_states;
  memcpy(s->arena[0], t->params, sizeof s->arena[0]);
  for (int i = 0; i < t->n_states; i++) memcpy(s->arena[1 + i], t->states[i], sizeof s->arena[0]);
}

/* Hand a state to a trainer in memory: what a perfect checkpoint does. */
static void state_into(td_trainer *t, const state *s) {
  t->step = s->step;
  t->consumed = s->consumed;
  memcpy(t->params, s->arena[0], sizeof s->arena[0]);
  for (int i = 0; i < t->n_states; i++) memcpy(t->states[i], s->arena[1 + i], sizeof s->arena[0]);
}

static void same_state(const td_trainer *t, const state *s, const char *what) {
  state got;
  state_of(t, &got);
  if (got.step != s->step || got.consumed != s->consumed)
    td_test_fail(__FILE__, __LINE__, "%s: step %ld consumed %llu, expected %ld %llu", what, got.step,
                 (unsigned long long)got.consumed, s->step, (unsigned long long)s->consumed);
  for (int a = 0; a < s->n_arenas; a++)
    if (memcmp(got.arena[a], s->arena[a], sizeof got.arena[a]) != 0)
      td_test_fail(__FILE__, __LINE__, "%s: arena %d differs from the saved state", what, a);
}

/* Broadcast a state (and n doubles) from world rank 0, which is in every
 * sub-communicator. */
static void share(td_comm *world, state *s, double *extra, int n_extra) {
  CHECK_OK(td_broadcast(s, sizeof *s, TD_U8, 0, world));
  if (n_extra) CHECK_OK(td_broadcast(extra, (size_t)n_extra, TD_F64, 0, world));
}

/* The ranges a rank at ZeRO stage `stage` of an L-rank job needs; pattern 4:
 * two odd sub-ranges of each arena. Fills regions over bufs; returns count. */
static int stage_regions(int stage, int L, int r, int n_arenas, float bufs[][TINY_N], td_ckpt_region *out) {
  int n = 0;
  size_t off, len;
  td_shard_range(TINY_N, L, r, &off, &len);
  for (int a = 0; a < n_arenas; a++) {
    int sharded = stage == 3 || (stage >= 1 && a > 0);
    if (stage == 4) {
      uint64_t lo1 = (uint64_t)(3 * a + r), hi1 = lo1 + 17, lo2 = (uint64_t)(TINY_N / 2 + 5 * r), hi2 = TINY_N - (uint64_t)a;
      out[n++] = (td_ckpt_region){a, bufs[a] + lo1, lo1, hi1};
      out[n++] = (td_ckpt_region){a, bufs[a] + lo2, lo2, hi2};
    } else if (sharded) {
      out[n++] = (td_ckpt_region){a, bufs[a] + off, off, off + len};
    } else {
      out[n++] = (td_ckpt_region){a, bufs[a], 0, TINY_N};
    }
  }
  return n;
}

static void test_worlds(td_comm *world, const char *base) {
  int rank = td_comm_rank(world);
  CHECK_EQ_INT(td_comm_size(world), MAXW);
  td_comm *comms[MAXW + 1] = {NULL};
  for (int w = 1; w <= MAXW; w++) CHECK_OK(td_comm_split(world, rank < w ? 0 : -1, rank, &comms[w]));
  td_dataset *ds = tiny_dataset_create(60);
  td_model *m = tiny_model_create();
  int n_arenas = 1 + td_optimizer_n_states(opt_kind);
  static state ref;
  static float bufs[3][TINY_N];
  char dir[600];
  for (int S = 1; S <= MAXW; S++) {
    snprintf(dir, sizeof dir, "%s/saved-at-%d", base, S);
    double cont[2] = {0, 0}; /* the S-rank run's next two losses */
    if (rank < S) {
      td_trainer *a = make(m, ds, comms[S]);
      for (int s = 0; s < 2 + S; s++) CHECK_OK(td_trainer_step(a, NULL)); /* a different state per S */
      CHECK_OK(td_trainer_save(a, dir));
      state_of(a, &ref);
      for (int s = 0; s < 2; s++) {
        td_step_stats st;
        CHECK_OK(td_trainer_step(a, &st));
        cont[s] = st.loss;
      }
      td_trainer_destroy(a);
    }
    share(world, &ref, cont, 2);
    for (int L = 1; L <= MAXW; L++) {
      if (rank >= L) continue;
      int r = td_comm_rank(comms[L]);
      td_trainer *b = make(m, ds, comms[L]);
      /* Every stage's load pattern, straight through the region API. */
      for (int stage = 0; stage <= 4; stage++) {
        td_ckpt_region regions[8];
        for (int a = 0; a < n_arenas; a++)
          for (int i = 0; i < TINY_N; i++) bufs[a][i] = -12345.0f;
        int n = stage_regions(stage, L, r, n_arenas, bufs, regions);
        td_ckpt_manifest man;
        CHECK_OK(td_ckpt_load_regions(b, dir, regions, n, &man));
        CHECK_EQ_INT(man.world, S);
        CHECK_EQ_INT(man.step, ref.step);
        CHECK_EQ_INT(man.consumed, ref.consumed);
        td_ckpt_manifest_free(&man);
        for (int k = 0; k < n; k++)
          for (uint64_t i = regions[k].lo; i < regions[k].hi; i++)
            if (memcmp(&bufs[regions[k].arena][i], &ref.arena[regions[k].arena][i], sizeof(float)) != 0)
              td_test_fail(__FILE__, __LINE__, "saved at %d, loaded at %d (rank %d), stage pattern %d: arena %d "
                           "element %llu differs", S, L, r, stage, regions[k].arena, (unsigned long long)i);
      }
      CHECK_EQ_INT(td_trainer_step_count(b), 0); /* the region API leaves the trainer alone */
      CHECK_OK(td_trainer_resume(b, dir));
      char what[64];
      snprintf(what, sizeof what, "saved at %d, resumed at %d", S, L);
      same_state(b, &ref, what);
      td_trainer *c = make(m, ds, comms[L]);
      state_into(c, &ref);
      double last[2];
      for (int s = 0; s < 2; s++) {
        td_step_stats x, y;
        CHECK_OK(td_trainer_step(b, &x));
        CHECK_OK(td_trainer_step(c, &y));
        if (x.loss != y.loss)
          td_test_fail(__FILE__, __LINE__, "%s: step %d loss %.9g, handed over in memory %.9g", what, s, x.loss,
                       y.loss);
        if (L == S && x.loss != cont[s])
          td_test_fail(__FILE__, __LINE__, "%s: step %d loss %.9g, uninterrupted %.9g", what, s, x.loss, cont[s]);
        CHECK_CLOSE(x.loss, cont[s], 2e-5, 1e-6);
        last[s] = x.loss;
      }
      CHECK(memcmp(b->params, c->params, sizeof(float) * TINY_N) == 0);
      if (r == 0)
        printf("saved at %d ranks, loaded at %d: every stage's ranges exact; resumed losses %.9f %.9f (the %d-rank run "
               "going on: %.9f %.9f)\n",
               S, L, last[0], last[1], S, cont[0], cont[1]);
      td_trainer_destroy(b);
      td_trainer_destroy(c);
    }
    CHECK_OK(td_barrier(world));
  }

  /* The chain 1 -> 2 -> 3 -> 4 -> 1 through checkpoints, against the same
   * chain handed over in memory. */
  static const int chain[] = {1, 2, 3, 4, 1};
  snprintf(dir, sizeof dir, "%s/chain", base);
  state live;
  memset(&live, 0, sizeof live);
  int n_losses = 0;
  for (size_t k = 0; k < TD_ARRAY_SIZE(chain); k++) {
    int w = chain[k];
    double losses[4] = {0, 0, 0, 0};
    if (rank < w) {
      td_trainer *x = make(m, ds, comms[w]), *y = make(m, ds, comms[w]);
      if (k > 0) {
        CHECK_OK(td_trainer_resume(x, dir));
        state_into(y, &live);
        same_state(x, &live, "chain");
      }
      for (int s = 0; s < 2; s++) {
        td_step_stats a, b;
        CHECK_OK(td_trainer_step(x, &a));
        CHECK_OK(td_trainer_step(y, &b));
        losses[2 * s] = a.loss;
        losses[2 * s + 1] = b.loss;
      }
      CHECK_OK(td_trainer_save(x, dir));
      state_of(y, &live);
      td_trainer_destroy(x);
      td_trainer_destroy(y);
    }
    share(world, &live, losses, 4);
    for (int s = 0; s < 2; s++, n_losses++)
      if (losses[2 * s] != losses[2 * s + 1])
        td_test_fail(__FILE__, __LINE__, "chain at world %d, step %ld: loss %.9g through the checkpoint, %.9g in "
                     "memory", w, live.step - 1 + s, losses[2 * s], losses[2 * s + 1]);
  }
  if (rank == 0) printf("chain 1->2->3->4->1: %d losses bit-identical to the in-memory hand-over\n", n_losses);

  /* Regions chosen by the caller: an uneven tiling saves and loads; an
   * overlap is refused on every rank. */
  if (rank < 2) {
    td_trainer *t = make(m, ds, comms[2]);
    CHECK_OK(td_trainer_step(t, NULL));
    state_of(t, &ref);
    td_ckpt_region uneven[3], overlap[3];
    int n = 0;
    for (int a = 0; a < n_arenas; a++, n++) {
      float *data = a == 0 ? t->params : t->states[a - 1];
      uneven[n] = rank == 0 ? (td_ckpt_region){a, data, 0, 0} : (td_ckpt_region){a, data, 0, TINY_N};
      overlap[n] = (td_ckpt_region){a, data, 0, TINY_N}; /* both ranks write everything */
    }
    snprintf(dir, sizeof dir, "%s/uneven", base);
    CHECK_OK(td_ckpt_save_regions(t, dir, uneven, n));
    snprintf(dir, sizeof dir, "%s/overlap", base);
    CHECK_MSG(td_ckpt_save_regions(t, dir, overlap, n), TD_ERR_INTERNAL,
              "do not describe the state exactly once");
    td_trainer *u = make(m, ds, comms[2]);
    snprintf(dir, sizeof dir, "%s/uneven", base);
    CHECK_OK(td_trainer_resume(u, dir));
    same_state(u, &ref, "uneven tiling");
    snprintf(dir, sizeof dir, "%s/overlap", base);
    CHECK_MSG(td_trainer_resume(u, dir), TD_ERR_IO, "no checkpoint in"); /* nothing was published */
    td_trainer_destroy(t);
    td_trainer_destroy(u);
    if (rank == 0) printf("regions: an uneven tiling saves and loads; overlapping ranges refused on every rank\n");
  }
  CHECK_OK(td_barrier(world));
  for (int w = 1; w <= MAXW; w++) td_comm_destroy(comms[w]);
  td_model_destroy(m);
  td_dataset_destroy(ds);
}

/* ---- corruption, partial reads, consolidation (world of one) ---- */

static void sh(const char *fmt, const char *a, const char *b) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, fmt, a, b);
  if (system(cmd) != 0) td_test_fail(__FILE__, __LINE__, "command failed: %s", cmd);
}

/* copy := a fresh copy of root. */
static void fresh_copy(const char *root, const char *copy) {
  sh("rm -rf '%s'%s", copy, "");
  sh("cp -a '%s' '%s'", root, copy);
}

static void flip_bit(const char *path, long at) {
  FILE *f = fopen(path, "r+b");
  CHECK(f != NULL);
  CHECK(fseek(f, at, SEEK_SET) == 0);
  int c = fgetc(f);
  CHECK(c != EOF);
  CHECK(fseek(f, at, SEEK_SET) == 0);
  fputc(c ^ 0x10, f);
  fclose(f);
}

/* A damaged copy must be refused by verify and by resume (naming the
 * problem), leaving the trainer as it was. */
static void expect_refused(td_model *m, td_dataset *ds, const char *root, const char *fragment) {
  td_ckpt_dir d;
  td_status st = td_ckpt_open(root, &d);
  if (st == TD_OK) {
    st = td_ckpt_verify(&d, NULL);
    td_ckpt_close(&d);
  }
  if (st == TD_OK || !strstr(td_last_error(), fragment))
    td_test_fail(__FILE__, __LINE__, "verify %s: %s: %s (wanted \"%s\")", root, td_status_str(st), td_last_error(),
                 fragment);
  td_trainer *t = make(m, ds, NULL);
  float before[TINY_N];
  memcpy(before, t->params, sizeof before);
  st = td_trainer_resume(t, root);
  if (st == TD_OK || !strstr(td_last_error(), fragment))
    td_test_fail(__FILE__, __LINE__, "resume %s: %s: %s (wanted \"%s\")", root, td_status_str(st), td_last_error(),
                 fragment);
  CHECK_EQ_INT(td_trainer_step_count(t), 0);
  CHECK(memcmp(before, t->params, sizeof before) == 0);
  td_trainer_destroy(t);
  printf("refused (%s): %s\n", fragment, td_last_error());
}

static uint64_t u64_le(const unsigned char *p) {
  uint64_t v = 0;
  for (int k = 7; k >= 0; k--) v = v << 8 | p[k];
  return v;
}

static void check_safetensors(const char *path, const td_model *m, const float *params) {
  FILE *f = fopen(path, "rb");
  CHECK(f != NULL);
  static unsigned char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  CHECK(n >= 8);
  uint64_t hlen = u64_le(buf);
  CHECK((8 + hlen) % 8 == 0);
  CHECK_EQ_INT(n, 8 + hlen + sizeof(float) * TINY_N); /* the tensors cover the parameters once */
  char *header = malloc(hlen + 1);
  memcpy(header, buf + 8, hlen);
  header[hlen] = '\0';
  CHECK(header[0] == '{' && strstr(header, "\"__metadata__\":{\"format\":\"pt\"") != NULL);
  for (int i = 0; i < m->n_tensors; i++) {
    char key[128];
    snprintf(key, sizeof key, "\"%s\":{\"dtype\":\"F32\",\"shape\":[", m->tensors[i].name);
    const char *p = strstr(header, key);
    if (!p) td_test_fail(__FILE__, __LINE__, "tensor %s not in the header: %s", m->tensors[i].name, header);
    unsigned long long count, a, b;
    CHECK(sscanf(p + strlen(key), "%llu],\"data_offsets\":[%llu,%llu]}", &count, &a, &b) == 3);
    CHECK_EQ_INT(count, m->tensors[i].count);
    CHECK_EQ_INT(b - a, 4 * count);
    CHECK(memcmp(buf + 8 + hlen + a, params + m->tensors[i].offset, (size_t)(b - a)) == 0);
  }
  free(header);
}

static void test_corrupt(const char *base) {
  setenv("TANDEM_CKPT_CHUNK_BYTES", "64", 1);
  td_dataset *ds = tiny_dataset_create(60);
  td_model *m = tiny_model_create();
  char root[600], copy[700], path[1000];
  snprintf(root, sizeof root, "%s/good", base);
  snprintf(copy, sizeof copy, "%s/bad", base);
  td_trainer *t = make(m, ds, NULL);
  for (int s = 0; s < 3; s++) CHECK_OK(td_trainer_step(t, NULL));
  CHECK_OK(td_trainer_save(t, root));
  state ref;
  state_of(t, &ref);

  /* A range read touches only the chunks it overlaps: elements [100, 200)
   * of adamw.m are bytes [400, 800) of its piece: 64-byte chunks 6..12. */
  td_ckpt_dir d;
  CHECK_OK(td_ckpt_open(root, &d));
  float part[100];
  CHECK_OK(td_ckpt_read(&d, td_ckpt_arena_id(&d.m, "adamw.m"), 100, 200, part));
  CHECK(memcmp(part, ref.arena[1] + 100, sizeof part) == 0);
  CHECK_EQ_INT(d.bytes_read, 7 * 64);
  uint64_t all = 0;
  CHECK_OK(td_ckpt_verify(&d, &all));
  CHECK_EQ_INT(all, 3 * 4 * TINY_N);
  CHECK_EQ_INT(d.m.chunk_bytes, 64);
  CHECK_MSG(td_ckpt_read(&d, 0, 700, TINY_N + 1, part), TD_ERR_INVALID_ARGUMENT, "are not in the checkpoint");
  uint64_t before_empty = d.bytes_read;
  CHECK_OK(td_ckpt_read(&d, 0, 40, 40, NULL)); /* an empty range reads nothing */
  CHECK_EQ_INT(d.bytes_read, before_empty);
  /* Consolidation: one safetensors file, parsed here. */
  snprintf(path, sizeof path, "%s/params.safetensors", base);
  CHECK_OK(td_ckpt_consolidate(&d, path));
  check_safetensors(path, m, ref.arena[0]);
  td_ckpt_close(&d);
  printf("partial read: 448 bytes for a 400-byte range; consolidate: %d tensors match the trainer's parameters\n",
         m->n_tensors);

  /* The damage, one copy each. rank-0.bin holds params (2836 bytes), then
   * adamw.m, then adamw.v. */
  char step_dir[800];
  snprintf(step_dir, sizeof step_dir, "%s/step-3", copy);
  snprintf(path, sizeof path, "%s/rank-0.bin", step_dir);
  fresh_copy(root, copy);
  CHECK(truncate(path, 3 * 4 * TINY_N - 10) == 0);
  expect_refused(m, ds, copy, "rank-0.bin is 8498 bytes but the manifest says 8508: the checkpoint is truncated");

  fresh_copy(root, copy);
  flip_bit(path, 1000);
  expect_refused(m, ds, copy, "in bytes [960, 1024) (arena params, elements [240, 256))");

  fresh_copy(root, copy);
  flip_bit(path, 3 * 4 * TINY_N - 1); /* the last byte of adamw.v */
  expect_refused(m, ds, copy, "(arena adamw.v, elements [704, 709))");

  fresh_copy(root, copy);
  CHECK(unlink(path) == 0);
  expect_refused(m, ds, copy, "rank-0.bin: No such file or directory (the manifest lists it: the checkpoint is "
                              "incomplete)");

  snprintf(path, sizeof path, "%s/manifest", step_dir);
  fresh_copy(root, copy);
  sh("sed -i 's/^step 3$/step 4/' '%s'%s", path, "");
  expect_refused(m, ds, copy, "manifest is corrupt: its checksum does not match its contents");

  fresh_copy(root, copy);
  sh("printf 'tandem-checkpoint 1\\nworld_size 1\\nmanifest_crc %%s\\n' "
     "$(printf 'tandem-checkpoint 1\\nworld_size 1\\n' | gzip -c | tail -c8 | od -An -tx4 -N4 | tr -d ' ') > '%s'%s",
     path, "");
  expect_refused(m, ds, copy, "this checkpoint has format 1 (written by a Tandem before checkpoints could reshard)");

  /* Another model or optimizer: refused as such (TD_ERR_INVALID_ARGUMENT). */
  td_model *other = tiny_model_create();
  other->kind = "tiny-mlp-v2";
  td_trainer *u = make(other, ds, NULL);
  CHECK_MSG(td_trainer_resume(u, root), TD_ERR_INVALID_ARGUMENT,
            "the checkpoint is of a \"tiny-mlp\" model, this run trains a \"tiny-mlp-v2\"");
  CHECK_EQ_INT(td_trainer_step_count(u), 0);
  td_trainer_destroy(u);
  td_model_destroy(other);
  opt_kind = TD_OPTIMIZER_SGD;
  u = make(m, ds, NULL);
  CHECK_MSG(td_trainer_resume(u, root), TD_ERR_INVALID_ARGUMENT, "trained with optimizer adamw, this run uses sgd");
  td_trainer_destroy(u);
  opt_kind = TD_OPTIMIZER_ADAMW;
  printf("another model kind and another optimizer refused, naming both\n");

  /* Another global batch: refused naming both, the trainer unchanged,
   * unless the run allows it; then the state is the saved one and the run
   * goes on with its own batch. */
  for (long other_batch = 1; other_batch <= 2 * G; other_batch++) {
    if (other_batch == G) continue;
    batch = other_batch;
    u = make(m, ds, NULL);
    float before[TINY_N];
    memcpy(before, u->params, sizeof before);
    char want[160];
    snprintf(want, sizeof want, "trained with a global batch of %d samples, this run's is %ld", G, other_batch);
    CHECK_MSG(td_trainer_resume(u, root), TD_ERR_INVALID_ARGUMENT, want);
    CHECK(strstr(td_last_error(), "checkpoint.allow_batch_size_change") != NULL);
    CHECK_EQ_INT(td_trainer_step_count(u), 0);
    CHECK(memcmp(before, u->params, sizeof before) == 0);
    td_trainer_destroy(u);
    allow_batch_change = 1;
    u = make(m, ds, NULL);
    CHECK_OK(td_trainer_resume(u, root));
    same_state(u, &ref, "a checkpoint of another_batch global batch, allowed");
    td_step_stats ss;
    CHECK_OK(td_trainer_step(u, &ss));
    CHECK_EQ_INT(ss.samples, other_batch);
    td_trainer_destroy(u);
    allow_batch_change = 0;
  }
  batch = G;
  printf("another global batch (1..%d) refused naming both values; loaded when allowed\n", 2 * G);

  /* The undamaged original still resumes exactly. */
  u = make(m, ds, NULL);
  CHECK_OK(td_trainer_resume(u, root));
  same_state(u, &ref, "the good checkpoint");
  td_trainer_destroy(u);
  td_trainer_destroy(t);
  td_model_destroy(m);
  td_dataset_destroy(ds);
}

/* ---- every (world, ZeRO stage) saving x every (world, stage) loading ---- */

enum { ST_T = 17 };
static td_status st_text_get(const td_dataset *ds, size_t index, void *input, int32_t *targets) {
  (void)ds;
  int32_t *tok = input;
  for (int j = 0; j <= ST_T; j++) {
    size_t p = index * ST_T + (size_t)j;
    int32_t v = (int32_t)("the quick brown fox jumps over the lazy dog. "[(p * 7) % 45]);
    if (j < ST_T) tok[j] = v;
    if (j > 0) targets[j - 1] = v;
  }
  return TD_OK;
}
static void st_destroy(td_dataset *ds) { free(ds); }

static td_trainer *make_staged(td_model *m, td_dataset *ds, td_comm *comm, int stage) {
  int world = comm ? td_comm_size(comm) : 1;
  td_train_config c;
  td_train_config_defaults(&c);
  c.train_batch_size = G;
  c.micro_batch = G / world;
  c.grad_accum = 1;
  c.seed = 5;
  c.optimizer.lr = 3e-3f;
  c.threads = 1;
  c.first_bucket_bytes = 512;
  c.bucket_bytes = 4096;
  c.zero_stage = stage;
  td_trainer *t = NULL;
  CHECK_OK(td_trainer_create(&c, m, ds, comm, &t));
  return t;
}

/* A GPT of an odd parameter count (35 channels, 17 positions): saved by S
 * ranks at stage ks after 3 steps, resumed by L ranks at stage kl; the next
 * 2 losses must equal, bit for bit, those of an L-rank stage-0 trainer
 * resumed from the same checkpoint (stage 0's resume is exact: test_worlds),
 * and equal the S-rank run going on (bit for bit when L == S, within
 * summation noise otherwise). */
static void test_stages(td_comm *world, const char *base) {
  int rank = td_comm_rank(world);
  td_comm *comms[MAXW + 1] = {NULL};
  for (int w = 1; w <= MAXW; w++) CHECK_OK(td_comm_split(world, rank < w ? 0 : -1, rank, &comms[w]));
  td_dataset *ds = calloc(1, sizeof *ds);
  *ds = (td_dataset){.n_samples = 240, .input_bytes = ST_T * 4, .targets_per_sample = ST_T, .get = st_text_get,
                     .destroy = st_destroy};
  td_gpt_config g = {.vocab = 256, .layers = 2, .channels = 35, .heads = 5, .seq = ST_T};
  td_model *m[4];
  for (int k = 0; k < 4; k++) CHECK_OK(td_gpt_create(&g, &m[k]));
  int combos = 0;
  char dir[600];
  for (int S = 1; S <= MAXW; S++)
    for (int ks = 0; ks < 4; ks++) {
      snprintf(dir, sizeof dir, "%s/w%d-s%d", base, S, ks);
      double cont[2] = {0, 0};
      if (rank < S) {
        td_trainer *a = make_staged(m[0], ds, comms[S], ks);
        for (int s = 0; s < 3; s++) CHECK_OK(td_trainer_step(a, NULL));
        CHECK_OK(td_trainer_save(a, dir));
        for (int s = 0; s < 2; s++) {
          td_step_stats st;
          CHECK_OK(td_trainer_step(a, &st));
          cont[s] = st.loss;
        }
        td_trainer_destroy(a);
      }
      CHECK_OK(td_broadcast(cont, 2, TD_F64, 0, world));
      for (int L = 1; L <= MAXW; L++) {
        if (rank >= L) continue;
        td_trainer *b[4];
        double loss[4][2];
        for (int kl = 0; kl < 4; kl++) {
          b[kl] = make_staged(m[kl], ds, comms[L], kl);
          CHECK_OK(td_trainer_resume(b[kl], dir));
          CHECK_EQ_INT(td_trainer_step_count(b[kl]), 3);
          for (int s = 0; s < 2; s++) {
            td_step_stats st;
            CHECK_OK(td_trainer_step(b[kl], &st));
            loss[kl][s] = st.loss;
          }
        }
        for (int kl = 0; kl < 4; kl++) {
          for (int s = 0; s < 2; s++) {
            if (loss[kl][s] != loss[0][s])
              td_test_fail(__FILE__, __LINE__, "saved at %d ranks stage %d, resumed at %d ranks stage %d: loss %.9g, "
                           "stage 0 resumed %.9g", S, ks, L, kl, loss[kl][s], loss[0][s]);
            if (L == S && loss[kl][s] != cont[s])
              td_test_fail(__FILE__, __LINE__, "saved at %d ranks stage %d, resumed at stage %d: loss %.9g, the run "
                           "going on %.9g", S, ks, kl, loss[kl][s], cont[s]);
            CHECK_CLOSE(loss[kl][s], cont[s], 2e-5, 1e-6);
          }
          combos++;
          td_trainer_destroy(b[kl]);
        }
      }
      CHECK_OK(td_barrier(world));
    }
  if (rank == 0)
    printf("stages: saved at 1-4 ranks x stages 0-3, resumed at 1-4 ranks x stages 0-3: %d combinations, losses "
           "equal to stage 0's resume bit for bit (and to the uninterrupted run at the same world size)\n",
           combos);
  for (int k = 0; k < 4; k++) td_model_destroy(m[k]);
  td_dataset_destroy(ds);
  for (int w = 1; w <= MAXW; w++) td_comm_destroy(comms[w]);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc < 3) {
    fprintf(stderr, "usage: test_ckpt worlds DIR [adamw|sgd] | corrupt DIR\n");
    return 2;
  }
  if (strcmp(argv[1], "worlds") == 0) {
    if (argc > 3 && strcmp(argv[3], "sgd") == 0) opt_kind = TD_OPTIMIZER_SGD;
    setenv("TANDEM_CKPT_CHUNK_BYTES", "64", 1);
    td_comm *world = NULL;
    CHECK_OK(td_comm_init(&world));
    test_worlds(world, argv[2]);
    CHECK_OK(td_comm_finalize(world));
    td_comm_destroy(world);
  } else if (strcmp(argv[1], "stages") == 0) {
    setenv("TANDEM_CKPT_CHUNK_BYTES", "256", 1);
    td_comm *world = NULL;
    CHECK_OK(td_comm_init(&world));
    test_stages(world, argv[2]);
    CHECK_OK(td_comm_finalize(world));
    td_comm_destroy(world);
  } else if (strcmp(argv[1], "corrupt") == 0) {
    test_corrupt(argv[2]);
  } else {
    fprintf(stderr, "unknown mode %s\n", argv[1]);
    return 2;
  }
  printf("ckpt %s: ok\n", argv[1]);
  return 0;
}
