/* Pipeline schedules and partitions (src/parallel/pipeline/), checked
 * against references written here, independently of the library:
 *
 *  - a simulator that runs every stage's action list the way the engine
 *    does (sends never block, receives wait for their message) on a clock
 *    where a forward takes tf and a backward tb: every list must finish (no
 *    deadlock), every receive must get the message it expects (the pair's
 *    sends and receives match in issue order), each micro-batch must go
 *    forward then backward through every model stage once;
 *  - for 1F1B, a greedy policy simulation (a stage runs a forward when its
 *    input is there and fewer than p-s micro-batches are alive on it,
 *    otherwise the backward whose gradient is there): its per-stage order
 *    must equal the schedule's, and the simulated step time must equal the
 *    closed form (m+p-1)(tf+tb), i.e. idle fraction (p-1)/(m+p-1);
 *  - for the interleaved schedule, the simulated idle fraction must equal
 *    (p-1)/(vm+p-1) (Megatron-LM's bubble) and so be below 1F1B's;
 *  - partitions against DeepSpeed's partition_uniform rule and, for the
 *    balanced one, an exhaustive search over every cut; a GPT's layer
 *    weights (parameters, compute) and cuts against numbers worked out by
 *    hand below. */
#include "../common/check.h"
#include "parallel/pipeline/pipeline.h"
#include "tandem/nn.h"

enum { MAXP = 8, MAXA = 4096 };

typedef struct msg {
  int is_grad, micro, model_stage;
  long ready; /* time the send was issued */
} msg;

typedef struct sim_result {
  long makespan;
  long busy[MAXP];
  long end[MAXP];
} sim_result;

/* Runs p stages' lists, a forward on stage s taking tf[s] and a backward
 * tb[s]; fails the test on a deadlock or a mismatched message. */
static void simulate_stages(td_pp_schedule_kind kind, int p, int m, int v, const long *tf, const long *tb,
                            sim_result *res, td_pp_action (*acts)[MAXA], int *n_acts) {
  static msg chan[MAXP][MAXP][MAXA];
  int n_sent[MAXP][MAXP] = {{0}}, n_recv[MAXP][MAXP] = {{0}};
  int pc[MAXP] = {0};
  long clock[MAXP] = {0};
  /* per (stage, chunk, micro): forward done, backward done */
  static char fwd_done[MAXP][8][64], bwd_done[MAXP][8][64];
  memset(fwd_done, 0, sizeof fwd_done);
  memset(bwd_done, 0, sizeof bwd_done);
  memset(res, 0, sizeof *res);
  int progressed = 1;
  while (progressed) {
    progressed = 0;
    for (int s = 0; s < p; s++) {
      while (pc[s] < n_acts[s]) {
        td_pp_action a = acts[s][pc[s]];
        int k = a.chunk * p + s; /* model stage */
        if (a.kind == TD_PP_RECV_ACT || a.kind == TD_PP_RECV_GRAD) {
          int from = a.peer;
          CHECK(from >= 0 && from < p);
          if (n_recv[from][s] >= n_sent[from][s]) break; /* blocked */
          msg *g = &chan[from][s][n_recv[from][s]++];
          int want_grad = a.kind == TD_PP_RECV_GRAD;
          if (g->is_grad != want_grad || g->micro != a.micro ||
              g->model_stage != (want_grad ? k + 1 : k - 1))
            td_test_fail(__FILE__, __LINE__,
                         "p=%d m=%d v=%d: stage %d expected %s of micro %d from model stage %d, got %s of micro %d "
                         "from model stage %d",
                         p, m, v, s, want_grad ? "grad" : "act", a.micro, want_grad ? k + 1 : k - 1,
                         g->is_grad ? "grad" : "act", g->micro, g->model_stage);
          if (g->ready > clock[s]) clock[s] = g->ready;
        } else if (a.kind == TD_PP_SEND_ACT || a.kind == TD_PP_SEND_GRAD) {
          int to = a.peer;
          CHECK(to >= 0 && to < p && n_sent[s][to] < MAXA);
          chan[s][to][n_sent[s][to]++] = (msg){a.kind == TD_PP_SEND_GRAD, a.micro, k, clock[s]};
        } else if (a.kind == TD_PP_FORWARD) {
          CHECK(!fwd_done[s][a.chunk][a.micro]);
          fwd_done[s][a.chunk][a.micro] = 1;
          clock[s] += tf[s];
          res->busy[s] += tf[s];
        } else {
          CHECK(fwd_done[s][a.chunk][a.micro] && !bwd_done[s][a.chunk][a.micro]);
          bwd_done[s][a.chunk][a.micro] = 1;
          clock[s] += tb[s];
          res->busy[s] += tb[s];
        }
        pc[s]++;
        progressed = 1;
      }
    }
  }
  for (int s = 0; s < p; s++) {
    if (pc[s] != n_acts[s])
      td_test_fail(__FILE__, __LINE__, "p=%d m=%d v=%d: deadlock: stage %d stuck at action %d of %d (%s micro %d)", p,
                   m, v, s, pc[s], n_acts[s], td_pp_action_name(acts[s][pc[s]].kind), acts[s][pc[s]].micro);
    for (int c = 0; c < v; c++)
      for (int i = 0; i < m; i++) CHECK(fwd_done[s][c][i] && bwd_done[s][c][i]);
    for (int t = 0; t < p; t++) CHECK_EQ_INT(n_sent[s][t], n_recv[s][t]); /* nothing left unread */
    res->end[s] = clock[s];
    if (clock[s] > res->makespan) res->makespan = clock[s];
  }
}

static void simulate(td_pp_schedule_kind kind, int p, int m, int v, long tf, long tb, sim_result *res,
                     td_pp_action (*acts)[MAXA], int *n_acts) {
  long tfs[MAXP], tbs[MAXP];
  for (int s = 0; s < p; s++) tfs[s] = tf, tbs[s] = tb;
  simulate_stages(kind, p, m, v, tfs, tbs, res, acts, n_acts);
}

static void build(td_pp_schedule_kind kind, int p, int m, int v, td_pp_action (*acts)[MAXA], int *n_acts) {
  for (int s = 0; s < p; s++) {
    int len = td_pp_schedule_length(kind, p, m, v, s);
    CHECK(len > 0 && len <= MAXA);
    CHECK_OK(td_pp_schedule(kind, p, m, v, s, acts[s], MAXA, &n_acts[s]));
    CHECK_EQ_INT(n_acts[s], len);
    /* 2 compute actions per (micro, chunk) and one transfer on each side but the ends */
    int ends = (s == 0 ? 1 : 0) + (s == p - 1 ? 1 : 0);
    CHECK_EQ_INT(len, m * v * 6 - 2 * m * ends);
  }
}

/* The greedy reference of 1F1B: unit-time ticks, each stage picks a
 * forward when its input has arrived and fewer than p-s micro-batches are
 * alive on it, else the oldest backward whose gradient has arrived. The
 * compute order it produces for stage s goes into order[s] (+micro+1 for a
 * forward, -(micro+1) for a backward). */
static void greedy_1f1b(int p, int m, long tf, long tb, int order[MAXP][128]) {
  long act_at[MAXP][64], grad_at[MAXP][64]; /* when stage s may start F(i) / B(i); -1: not yet */
  int nf[MAXP] = {0}, nb[MAXP] = {0}, no[MAXP] = {0};
  long free_at[MAXP] = {0};
  for (int s = 0; s < p; s++)
    for (int i = 0; i < m; i++) act_at[s][i] = s == 0 ? 0 : -1, grad_at[s][i] = -1;
  for (long t = 0; t < 100000; t++) {
    int done = 1;
    for (int s = 0; s < p; s++) {
      if (nb[s] < m) done = 0;
      if (free_at[s] > t) continue;
      int alive = nf[s] - nb[s];
      if (nf[s] < m && alive < p - s && act_at[s][nf[s]] >= 0 && act_at[s][nf[s]] <= t) {
        int i = nf[s]++;
        order[s][no[s]++] = i + 1;
        free_at[s] = t + tf;
        if (s + 1 < p) act_at[s + 1][i] = t + tf;
        else grad_at[s][i] = t + tf; /* the last stage's backward follows its own forward */
      } else if (nb[s] < nf[s] && grad_at[s][nb[s]] >= 0 && grad_at[s][nb[s]] <= t) {
        int i = nb[s]++;
        order[s][no[s]++] = -(i + 1);
        free_at[s] = t + tb;
        if (s > 0) grad_at[s - 1][i] = t + tb;
      }
    }
    if (done) return;
  }
  td_test_fail(__FILE__, __LINE__, "greedy reference did not finish (p=%d m=%d)", p, m);
}

static td_pp_action acts[MAXP][MAXA];
static int n_acts[MAXP];

static void test_1f1b(void) {
  int cases = 0;
  for (int p = 1; p <= MAXP; p++)
    for (int m = 1; m <= 20; m++) {
      build(TD_PP_1F1B, p, m, 1, acts, n_acts);
      static int order[MAXP][128];
      const long costs[][2] = {{1, 1}, {1, 2}, {2, 3}};
      for (size_t c = 0; c < TD_ARRAY_SIZE(costs); c++) {
        long tf = costs[c][0], tb = costs[c][1];
        greedy_1f1b(p, m, tf, tb, order);
        for (int s = 0; s < p; s++) {
          int j = 0;
          for (int i = 0; i < n_acts[s]; i++) {
            td_pp_action a = acts[s][i];
            if (a.kind != TD_PP_FORWARD && a.kind != TD_PP_BACKWARD) continue;
            int want = a.kind == TD_PP_FORWARD ? a.micro + 1 : -(a.micro + 1);
            if (order[s][j] != want)
              td_test_fail(__FILE__, __LINE__, "p=%d m=%d tf=%ld tb=%ld stage %d compute step %d: schedule %c%d, "
                           "reference %c%d", p, m, tf, tb, s, j, want > 0 ? 'F' : 'B', abs(want) - 1,
                           order[s][j] > 0 ? 'F' : 'B', abs(order[s][j]) - 1);
            j++;
          }
          CHECK_EQ_INT(j, 2 * m);
        }
        sim_result r;
        simulate(TD_PP_1F1B, p, m, 1, tf, tb, &r, acts, n_acts);
        if (r.makespan != (m + p - 1) * (tf + tb))
          td_test_fail(__FILE__, __LINE__, "p=%d m=%d tf=%ld tb=%ld: step takes %ld, closed form %ld", p, m, tf, tb,
                       r.makespan, (m + p - 1) * (tf + tb));
        for (int s = 0; s < p; s++) {
          double idle = 1.0 - (double)r.busy[s] / (double)r.makespan;
          CHECK_CLOSE(idle, (double)(p - 1) / (m + p - 1), 1e-12, 1e-12);
        }
      }
      /* at most p-s micro-batches alive on stage s */
      for (int s = 0; s < p; s++) CHECK_EQ_INT(td_pp_max_in_flight(acts[s], n_acts[s], 1), m < p - s ? m : p - s);
      cases++;
    }
  printf("1f1b: %d (p, m) layouts match the greedy reference and (m+p-1)(tf+tb)\n", cases);
}

static void test_interleaved(void) {
  int cases = 0;
  for (int p = 2; p <= 6; p++)
    for (int v = 2; v <= 4; v++)
      for (int m = p; m <= 4 * p; m += p) {
        build(TD_PP_INTERLEAVED, p, m, v, acts, n_acts);
        sim_result ri, r1;
        /* a chunk is 1/v of a stage: forward 1 tick, backward 2 per chunk */
        simulate(TD_PP_INTERLEAVED, p, m, v, 1, 2, &ri, acts, n_acts);
        static td_pp_action a1[MAXP][MAXA];
        static int n1[MAXP];
        build(TD_PP_1F1B, p, m, 1, a1, n1);
        simulate(TD_PP_1F1B, p, m, 1, v, 2 * v, &r1, a1, n1);
        CHECK_EQ_INT(ri.busy[0], r1.busy[0]);
        double idle_i = 1.0 - (double)ri.busy[0] / ri.makespan, idle_1 = 1.0 - (double)r1.busy[0] / r1.makespan;
        if (!(idle_i < idle_1))
          td_test_fail(__FILE__, __LINE__, "p=%d v=%d m=%d: interleaved idle %.4f not below 1f1b's %.4f", p, v, m,
                       idle_i, idle_1);
        /* Megatron-LM's bubble: (p-1)/v of a stage's forward+backward, i.e. (p-1) of (vm+p-1) chunk-slots */
        CHECK_CLOSE(idle_i, (double)(p - 1) / (v * m + p - 1), 1e-12, 1e-12);
        if (p == 4 && m == 8)
          printf("interleaved p=%d v=%d m=%d: idle %.4f (1f1b %.4f, (p-1)/(vm+p-1) = %.4f)\n", p, v, m, idle_i,
                 idle_1, (double)(p - 1) / (v * m + p - 1));
        cases++;
      }
  printf("interleaved: %d (p, v, m) layouts deadlock-free, matched, idle (p-1)/(vm+p-1) < 1f1b's\n", cases);
}

/* The messages that can wait at a stage before it receives them
 * (td_pp_max_unexpected: what its communicator may hold as unexpected
 * frames) against a random-timing simulation: each run gives every stage a
 * random speed and, tick by tick, runs the next action of a stage drawn by
 * speed among those that can go (a receive needs its message sent); two
 * steps back to back, with nothing between them, as the fastest ranks
 * would run them. The most messages sent to a stage and not yet received
 * there, in any run, must stay within the bound. */
static unsigned rng_state = 12345;
static unsigned rnd(void) {
  rng_state = rng_state * 1103515245u + 12345u;
  return (rng_state >> 8) & 0xffffff;
}

static void unexpected_runs(td_pp_schedule_kind kind, int p, int m, int v, int runs, int *worst) {
  static td_pp_action two[MAXP][2 * MAXA];
  int n_two[MAXP];
  build(kind, p, m, v, acts, n_acts);
  for (int s = 0; s < p; s++) {
    CHECK(2 * n_acts[s] <= 2 * MAXA);
    memcpy(two[s], acts[s], (size_t)n_acts[s] * sizeof **acts);
    memcpy(two[s] + n_acts[s], acts[s], (size_t)n_acts[s] * sizeof **acts);
    n_two[s] = 2 * n_acts[s];
    worst[s] = 0;
  }
  for (int run = 0; run < runs; run++) {
    int sent[MAXP][MAXP] = {{0}}, got[MAXP][MAXP] = {{0}}, pc[MAXP] = {0};
    unsigned speed[MAXP] = {0};
    for (int s = 0; s < p; s++) speed[s] = 1 + rnd() % 100; /* 1 to 100: some stages far slower */
    for (;;) {
      unsigned total = 0;
      int can[MAXP];
      for (int s = 0; s < p; s++) {
        can[s] = 0;
        if (pc[s] == n_two[s]) continue;
        const td_pp_action *a = &two[s][pc[s]];
        can[s] = !(a->kind == TD_PP_RECV_ACT || a->kind == TD_PP_RECV_GRAD) || got[a->peer][s] < sent[a->peer][s];
        if (can[s]) total += speed[s];
      }
      if (!total) break;
      unsigned pick = rnd() % total;
      int s = 0;
      while (!can[s] || pick >= speed[s]) pick -= can[s] ? speed[s] : 0, s++;
      const td_pp_action *a = &two[s][pc[s]++];
      if (a->kind == TD_PP_SEND_ACT || a->kind == TD_PP_SEND_GRAD) {
        sent[s][a->peer]++;
        int waiting = 0;
        for (int f = 0; f < p; f++) waiting += sent[f][a->peer] - got[f][a->peer];
        if (waiting > worst[a->peer]) worst[a->peer] = waiting;
      } else if (a->kind == TD_PP_RECV_ACT || a->kind == TD_PP_RECV_GRAD) {
        got[a->peer][s]++;
      }
    }
    for (int s = 0; s < p; s++)
      if (pc[s] != n_two[s])
        td_test_fail(__FILE__, __LINE__, "p=%d m=%d v=%d: stage %d stuck at action %d of %d", p, m, v, s, pc[s],
                     n_two[s]);
  }
  for (int s = 0; s < p; s++) {
    int bound = td_pp_max_unexpected(kind, p, m, v, s);
    if (worst[s] > bound)
      td_test_fail(__FILE__, __LINE__, "%s p=%d m=%d v=%d: %d messages waited at stage %d, bound %d",
                   kind == TD_PP_1F1B ? "1f1b" : "interleaved", p, m, v, worst[s], s, bound);
  }
}

static void test_unexpected_bound(void) {
  int cases = 0, reached = 0, slots = 0, worst[MAXP];
  for (int p = 1; p <= MAXP; p++)
    for (int m = 1; m <= 24; m += (m < 8 ? 1 : 5)) {
      unexpected_runs(TD_PP_1F1B, p, m, 1, 60, worst);
      for (int s = 0; s < p; s++) reached += worst[s] == td_pp_max_unexpected(TD_PP_1F1B, p, m, 1, s), slots++;
      if (p == 4 && m == 8)
        printf("1f1b p=4 m=8: most messages waiting per stage %d %d %d %d, bound %d %d %d %d\n", worst[0], worst[1],
               worst[2], worst[3], td_pp_max_unexpected(TD_PP_1F1B, 4, 8, 1, 0),
               td_pp_max_unexpected(TD_PP_1F1B, 4, 8, 1, 1), td_pp_max_unexpected(TD_PP_1F1B, 4, 8, 1, 2),
               td_pp_max_unexpected(TD_PP_1F1B, 4, 8, 1, 3));
      cases++;
    }
  for (int p = 2; p <= 6; p++)
    for (int v = 2; v <= 4; v++)
      for (int m = p; m <= 4 * p; m += p) {
        unexpected_runs(TD_PP_INTERLEAVED, p, m, v, 30, worst);
        for (int s = 0; s < p; s++)
          reached += worst[s] == td_pp_max_unexpected(TD_PP_INTERLEAVED, p, m, v, s), slots++;
        if (p == 2 && v == 2 && m == 8)
          printf("interleaved p=2 v=2 m=8: most messages waiting per stage %d %d, bound %d %d\n", worst[0],
                 worst[1], td_pp_max_unexpected(TD_PP_INTERLEAVED, 2, 8, 2, 0),
                 td_pp_max_unexpected(TD_PP_INTERLEAVED, 2, 8, 2, 1));
        cases++;
      }
  CHECK_EQ_INT(td_pp_max_unexpected(TD_PP_1F1B, 1, 4, 1, 0), 0);
  CHECK_EQ_INT(td_pp_max_unexpected(TD_PP_INTERLEAVED, 2, 3, 2, 0), 0); /* refused layout */
  printf("unexpected messages: %d layouts within td_pp_max_unexpected; the bound reached at %d of %d stages\n", cases,
         reached, slots);
}

static void test_refusals(void) {
  td_pp_action a[64];
  int n = -1;
  CHECK_STATUS(td_pp_schedule(TD_PP_1F1B, 0, 4, 1, 0, a, 64, &n), TD_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(n, 0);
  CHECK_STATUS(td_pp_schedule(TD_PP_1F1B, 2, 0, 1, 0, a, 64, &n), TD_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(td_pp_schedule(TD_PP_1F1B, 2, 4, 2, 0, a, 64, &n), TD_ERR_INVALID_ARGUMENT);
  CHECK(strstr(td_last_error(), "interleaved"));
  CHECK_STATUS(td_pp_schedule(TD_PP_INTERLEAVED, 2, 3, 2, 0, a, 64, &n), TD_ERR_INVALID_ARGUMENT);
  CHECK(strstr(td_last_error(), "multiple of 2"));
  CHECK_STATUS(td_pp_schedule(TD_PP_INTERLEAVED, 1, 4, 2, 0, a, 64, &n), TD_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(td_pp_schedule(TD_PP_INTERLEAVED, 2, 4, 1, 0, a, 64, &n), TD_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(td_pp_schedule(TD_PP_1F1B, 2, 4, 1, 2, a, 64, &n), TD_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(td_pp_schedule(TD_PP_1F1B, 4, 8, 1, 0, a, 4, &n), TD_ERR_INVALID_ARGUMENT); /* no room */
  CHECK_EQ_INT(td_pp_schedule_length(TD_PP_INTERLEAVED, 2, 3, 2, 0), 0);
  /* one stage: no communication at all, forward and backward in turn */
  CHECK_OK(td_pp_schedule(TD_PP_1F1B, 1, 3, 1, 0, a, 64, &n));
  CHECK_EQ_INT(n, 6);
  for (int i = 0; i < n; i++) CHECK_EQ_INT(a[i].kind, i % 2 ? TD_PP_BACKWARD : TD_PP_FORWARD);
  printf("refusals: ok\n");
}

/* ---- partitions ---- */

static size_t heaviest(const size_t *w, const int *first, int parts) {
  size_t most = 0;
  for (int k = 0; k < parts; k++) {
    size_t sum = 0;
    for (int i = first[k]; i < first[k + 1]; i++) sum += w[i];
    if (sum > most) most = sum;
  }
  return most;
}

/* Every way to cut n layers into `parts` non-empty runs: the least heaviest part. */
static size_t brute_best(const size_t *w, int n, int parts, int start) {
  if (parts == 1) {
    size_t sum = 0;
    for (int i = start; i < n; i++) sum += w[i];
    return sum;
  }
  size_t best = SIZE_MAX, head = 0;
  for (int end = start + 1; end <= n - (parts - 1); end++) {
    head += w[end - 1];
    size_t rest = brute_best(w, n, parts - 1, end);
    size_t worst = head > rest ? head : rest;
    if (worst < best) best = worst;
  }
  return best;
}

static void test_partition(void) {
  int first[17];
  /* uniform: DeepSpeed's partition_uniform (first parts one more) */
  CHECK_OK(td_pp_partition(TD_PP_PARTITION_UNIFORM, NULL, 7, 3, first));
  CHECK(first[0] == 0 && first[1] == 3 && first[2] == 5 && first[3] == 7);
  CHECK_OK(td_pp_partition(TD_PP_PARTITION_UNIFORM, NULL, 4, 4, first));
  for (int k = 0; k <= 4; k++) CHECK_EQ_INT(first[k], k);
  CHECK_OK(td_pp_partition(TD_PP_PARTITION_UNIFORM, NULL, 1, 1, first));
  CHECK(first[0] == 0 && first[1] == 1);
  CHECK_STATUS(td_pp_partition(TD_PP_PARTITION_UNIFORM, NULL, 3, 4, first), TD_ERR_INVALID_ARGUMENT);
  CHECK(strstr(td_last_error(), "at most 3"));
  CHECK_STATUS(td_pp_partition(TD_PP_PARTITION_UNIFORM, NULL, 0, 1, first), TD_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(td_pp_partition(TD_PP_PARTITION_UNIFORM, NULL, 4, 0, first), TD_ERR_INVALID_ARGUMENT);
  td_pp_partition_method meth;
  CHECK_OK(td_pp_partition_method_parse("parameters", &meth));
  CHECK_EQ_INT(meth, TD_PP_PARTITION_PARAMETERS);
  CHECK_STATUS(td_pp_partition_method_parse("type:transformer", &meth), TD_ERR_INVALID_ARGUMENT);
  CHECK(strstr(td_last_error(), "uniform"));
  /* balanced: a heavy first and last layer (embedding, head) move cuts inward */
  size_t gpt[8] = {9, 4, 4, 4, 4, 4, 4, 9};
  CHECK_OK(td_pp_partition(TD_PP_PARTITION_PARAMETERS, gpt, 8, 2, first));
  CHECK(first[1] == 4);
  CHECK_OK(td_pp_partition(TD_PP_PARTITION_PARAMETERS, gpt, 8, 4, first));
  CHECK_EQ_INT(heaviest(gpt, first, 4), 12); /* [9] [4 4 4] [4 4 4] [9] */
  CHECK(first[1] == 1 && first[2] == 4 && first[3] == 7);
  size_t zeros[5] = {0, 0, 0, 0, 0};
  CHECK_OK(td_pp_partition(TD_PP_PARTITION_PARAMETERS, zeros, 5, 5, first));
  for (int k = 0; k <= 5; k++) CHECK_EQ_INT(first[k], k);
  /* random weights against every cut */
  uint64_t rng = 12345;
  int cases = 0;
  for (int n = 1; n <= 10; n++)
    for (int parts = 1; parts <= n && parts <= 5; parts++)
      for (int trial = 0; trial < 6; trial++) {
        size_t w[16];
        for (int i = 0; i < n; i++) w[i] = (size_t)((td_test_urand(&rng) + 1.0f) * 50.0f) * (trial == 5 ? 1000 : 1);
        CHECK_OK(td_pp_partition(TD_PP_PARTITION_PARAMETERS, w, n, parts, first));
        CHECK_EQ_INT(first[0], 0);
        CHECK_EQ_INT(first[parts], n);
        for (int k = 0; k < parts; k++) CHECK(first[k + 1] > first[k]);
        CHECK_EQ_INT(heaviest(w, first, parts), brute_best(w, n, parts, 0));
        cases++;
      }
  printf("partition: uniform edges, %d balanced cuts equal to the exhaustive optimum\n", cases);
}

/* A GPT's layer weights and cuts, worked out by hand.
 * V = 8192, 8 layers, C = 256, T = 128:
 *   compute, per token, forward + backward = 3 x forward:
 *     block  3 (24 C^2 + 2 C (T + 1)) = 3 (1572864 + 66048) = 4916736
 *     head   3 x 2 C V = 12582912 (2.56 blocks), on the last block
 *   PP=2: the last stage with k blocks and the head, the first with 8 - k:
 *     k=4: 4 b + h = 32249856 (uniform's cut)
 *     k=3: max(5 b, 3 b + h) = max(24583680, 27333120) = 27333120  <- least
 *     k=2: max(6 b, 2 b + h) = max(29500416, 22416384) = 29500416
 *   so first = {0, 5, 8}.
 *   PP=4: the head alone with one block, 17499648, beats any other last
 *   part (2 b + h = 22416384); the 7 blocks before it go in 3 parts of at
 *   most 3 (3 b = 14750208 < 17499648 < 4 b), cut as the dynamic program
 *   does: at each prefix the least heaviest part, ties to the earliest cut
 *   (7 blocks: [4, 7) after 4 blocks in 2 parts, whose best is 2|2):
 *   {0, 2, 4, 7, 8} (brute force over cuts finds {0, 1, 4, 7, 8} too, with
 *   the same heaviest part).
 *   parameters: block 12 C^2 + 13 C = 789760; first + V C + T C = 2919680;
 *   last + 2 C + V C = 2887424; PP=2: 4|4 gives max(2919680 + 3 b,
 *   3 b + 2887424) = 5288960, 3|5 6046464, 5|3 6078720: {0, 4, 8}.
 * The reference GPT (V = 256, 4 layers, C = 256, T = 128): block 4916736,
 * head 393216 (8% of a block); PP=2: 2|2 (2 b + h = 10226688) against 3|1
 * (3 b = 14750208): the uniform cut, the head's stage 4% heavier. */
static void test_gpt_partition(void) {
  td_gpt_config c = {.vocab = 8192, .layers = 8, .channels = 256, .heads = 4, .seq = 128};
  size_t w[8];
  int first[9];
  td_pp_gpt_layer_weights(&c, TD_PP_PARTITION_COMPUTE, w);
  for (int l = 0; l < 7; l++) CHECK_EQ_INT((long long)w[l], 4916736);
  CHECK_EQ_INT((long long)w[7], 4916736 + 12582912);
  CHECK_OK(td_pp_partition(TD_PP_PARTITION_COMPUTE, w, 8, 2, first));
  CHECK(first[0] == 0 && first[1] == 5 && first[2] == 8);
  CHECK_OK(td_pp_partition(TD_PP_PARTITION_COMPUTE, w, 8, 4, first));
  CHECK(first[0] == 0 && first[1] == 2 && first[2] == 4 && first[3] == 7 && first[4] == 8);
  CHECK_EQ_INT((long long)heaviest(w, first, 4), 17499648);
  td_pp_gpt_layer_weights(&c, TD_PP_PARTITION_PARAMETERS, w);
  CHECK_EQ_INT((long long)w[0], 2919680);
  for (int l = 1; l < 7; l++) CHECK_EQ_INT((long long)w[l], 789760);
  CHECK_EQ_INT((long long)w[7], 2887424);
  CHECK_OK(td_pp_partition(TD_PP_PARTITION_PARAMETERS, w, 8, 2, first));
  CHECK(first[0] == 0 && first[1] == 4 && first[2] == 8);
  c = (td_gpt_config){.vocab = 256, .layers = 4, .channels = 256, .heads = 4, .seq = 128};
  td_pp_gpt_layer_weights(&c, TD_PP_PARTITION_COMPUTE, w);
  CHECK_EQ_INT((long long)w[0], 4916736);
  CHECK_EQ_INT((long long)w[3], 4916736 + 393216);
  CHECK_OK(td_pp_partition(TD_PP_PARTITION_COMPUTE, w, 4, 2, first));
  CHECK(first[0] == 0 && first[1] == 2 && first[2] == 4);
  td_pp_partition_method meth;
  CHECK_OK(td_pp_partition_method_parse("compute", &meth));
  CHECK_EQ_INT(meth, TD_PP_PARTITION_COMPUTE);
  CHECK_STATUS(td_pp_partition_method_parse("flops", &meth), TD_ERR_INVALID_ARGUMENT);
  CHECK(strstr(td_last_error(), "\"compute\""));
  printf("partition: a GPT's compute and parameter weights and cuts as worked out by hand\n");
}

/* Unequal stages (bench/pipeline.sh's "closed form with the measured
 * imbalance", the idle target proposed in
 * bench/results/pipeline-2026-11-28-s26-balance.md): with C_s a stage's
 * forward + backward per micro-batch and C_max the slowest's, the schedule
 * takes at most (m + (p-1)/v) C_max, so stage s idles at most
 * 1 - m C_s / ((m + (p-1)/v) C_max), with equality for equal stages. Random
 * per-stage speeds (trials 1-2 within 1.1x, 3-4 within 1.5x), 1F1B and
 * interleaved, against the simulator; how far below the bound the stages
 * stay is printed (how loose the target is). */
static void test_unequal_stages(void) {
  int cases = 0;
  double worst_gap = 0, worst_gap_near = 0;
  for (int p = 2; p <= 6; p++)
    for (int v = 1; v <= 3; v++)
      for (int m = p; m <= 4 * p; m += p)
        for (int trial = 0; trial < 4; trial++) {
          td_pp_schedule_kind kind = v == 1 ? TD_PP_1F1B : TD_PP_INTERLEAVED;
          long slow[MAXP], most = 0;
          for (int s = 0; s < p; s++) {
            slow[s] = trial == 0 ? 20 : 20 + (long)(rnd() % (trial <= 2 ? 3 : 11)); /* 20..22 or 20..30 */
            if (slow[s] > most) most = slow[s];
          }
          build(kind, p, m, v, acts, n_acts);
          sim_result r;
          long tf[MAXP], tb[MAXP]; /* per chunk: forward 1, backward 2, times the stage's slowness */
          for (int s = 0; s < p; s++) tf[s] = slow[s], tb[s] = 2 * slow[s];
          simulate_stages(kind, p, m, v, tf, tb, &r, acts, n_acts);
          /* per micro-batch: C_s = v x 3 x slow[s] */
          double bound_span = ((double)m + (double)(p - 1) / v) * (double)(3 * v * most);
          if (!((double)r.makespan <= bound_span + 1e-9))
            td_test_fail(__FILE__, __LINE__, "p=%d v=%d m=%d trial %d: step %ld above (m + (p-1)/v) C_max = %.1f", p,
                         v, m, trial, r.makespan, bound_span);
          for (int s = 0; s < p; s++) {
            double idle = 1.0 - (double)r.busy[s] / (double)r.makespan;
            double closed = 1.0 - (double)m * (double)(3 * v * slow[s]) / bound_span;
            CHECK(idle <= closed + 1e-12);
            if (trial == 0) CHECK_CLOSE(idle, (double)(p - 1) / (v * m + p - 1), 1e-12, 1e-12);
            if (closed - idle > worst_gap) worst_gap = closed - idle;
            if (trial <= 2 && closed - idle > worst_gap_near) worst_gap_near = closed - idle;
          }
          cases++;
        }
  printf("unequal stages: %d layouts x speeds within 1 - m C_s / ((m + (p-1)/v) C_max); the most a stage stays "
         "below it: %.4f with speeds within 1.1x, %.4f within 1.5x\n",
         cases, worst_gap_near, worst_gap);
}

/* `test_pipeline_schedule sim P V M TF_0 TB_0 .. TF_{P-1} TB_{P-1}`: one
 * step of the schedule (1F1B for V = 1, else interleaved with V chunks) on
 * the simulator, a forward of one chunk on stage s taking TF_s and a
 * backward TB_s (any integer unit), transfers free; prints each stage's
 * idle fraction: what the schedule gives at best with those stage times
 * (bench/pipeline.sh --part idle feeds it each run's measured ones). */
static int sim_main(int argc, char **argv) {
  int p = argc > 4 ? atoi(argv[2]) : 0, v = argc > 4 ? atoi(argv[3]) : 0, m = argc > 4 ? atoi(argv[4]) : 0;
  if (p < 1 || p > MAXP || v < 1 || v > 8 || m < 1 || m > 64 || argc != 5 + 2 * p) {
    fprintf(stderr, "usage: test_pipeline_schedule sim P(1-%d) V(1-8) M(1-64) TF_0 TB_0 .. TF_{P-1} TB_{P-1}\n", MAXP);
    return 2;
  }
  long tf[MAXP], tb[MAXP];
  for (int s = 0; s < p; s++) {
    tf[s] = atol(argv[5 + 2 * s]), tb[s] = atol(argv[6 + 2 * s]);
    if (tf[s] < 0 || tb[s] < 0) {
      fprintf(stderr, "test_pipeline_schedule sim: stage %d's times must be >= 0\n", s);
      return 2;
    }
  }
  td_pp_schedule_kind kind = v == 1 ? TD_PP_1F1B : TD_PP_INTERLEAVED;
  if (td_pp_schedule_check(kind, p, m, v) != TD_OK) {
    fprintf(stderr, "test_pipeline_schedule sim: %s\n", td_last_error());
    return 2;
  }
  build(kind, p, m, v, acts, n_acts);
  sim_result r;
  simulate_stages(kind, p, m, v, tf, tb, &r, acts, n_acts);
  for (int s = 0; s < p; s++)
    printf("stage %d idle %.4f (busy %ld of %ld)\n", s, r.makespan ? 1.0 - (double)r.busy[s] / (double)r.makespan : 0.0,
           r.busy[s], r.makespan);
  return 0;
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "sim")) return sim_main(argc, argv);
  test_refusals();
  test_partition();
  test_gpt_partition();
  test_1f1b();
  test_interleaved();
  test_unexpected_bound();
  test_unequal_stages();
  printf("ok\n");
  return 0;
}
