/* Buddy replicas in files (src/elastic/replica.c) on real ranks:
 *
 *   tandemrun -np N test_el2_replica TOTAL
 *
 * Two sharded buffers (a float and a double per element, TOTAL elements
 * cut unevenly: rank r holds [r*TOTAL/N, (r+1)*TOTAL/N)) and a whole one
 * (a float array every rank holds whole, equal on every rank at a commit:
 * el_rep_register's `whole`, as ZeRO stages 1-2's parameters; a commit
 * does not send it, the buddy writes its ward's range from its own) are
 * paired and committed three times, element x holding value(x, c) at
 * commit c (a closed form, exact in both types). Checked against that
 * closed form, never against the library's own copies:
 *  - the holdings: own pieces at commits 3 and 2, each ward's at 3 and 2,
 *    of the expected ranges; the files' bytes (two commits of the own
 *    range and of each ward's, 16 bytes an element); the replica
 *    directory empty all along (unnamed files: nothing left however a
 *    process ends);
 *  - memory: only the staging buffer (TD_ELASTIC_STAGING_BYTES) is used
 *    between the files and the network, however large the shard: with
 *    TOTAL above a chunk per rank the exchange and the rebuild cross
 *    several chunks;
 *  - right after the pairing (commit 1), whose copy must send the whole
 *    buffer too (after a rebuild only the shards are filled: here the
 *    rest of the whole array holds junk), the last rank lost: commit 1
 *    rebuilt, the whole buffer's range included;
 *  - the last rank lost (N > 1): its pieces are left out of the
 *    descriptors, el_rep_choose picks commit 3 (its buddy's copy covers
 *    it), the survivors' ranges are cut anew for N - 1 ranks and rebuilt
 *    from the files (el_rep_restore): every element equals value(x, 3);
 *    then the same for the older commit 2;
 *  - the fence: commit 3's copy is held back (a test hook), the shards
 *    take commit 4's values as soon as el_rep_commit_wait returns, and
 *    the copies rebuilt above must still be commit 3's;
 *  - a replica directory that does not exist: the commit's wait fails
 *    with TD_ERR_IO and a message naming the directory and
 *    TANDEM_ELASTIC_REPLICA_DIR. */
#include "elastic/elastic.h"

#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/check.h"

static double value(size_t x, int64_t c) { return (double)(x % 100003) * 4.0 + (double)c * 0.25; }

static void fill(float *f, double *d, size_t lo, size_t hi, int64_t c) {
  for (size_t x = lo; x < hi; x++) {
    f[x - lo] = (float)value(x, c);
    d[x - lo] = -value(x, c);
  }
}

/* The whole buffer: every element of g (total of them) at commit c, or
 * only [lo, hi) with junk elsewhere (what a rebuild leaves). */
static void fill_whole(float *g, size_t total, size_t lo, size_t hi, int64_t c, bool only_range) {
  for (size_t x = 0; x < total; x++) g[x] = x >= lo && x < hi ? (float)(0.5 * value(x, c)) : only_range ? -1e30f : (float)(0.5 * value(x, c));
}

static size_t bad_elements(const float *f, const double *d, const float *g, size_t lo, size_t hi, int64_t c) {
  size_t bad = 0;
  for (size_t x = lo; x < hi; x++)
    bad += f[x - lo] != (float)value(x, c) || d[x - lo] != -value(x, c) || g[x] != (float)(0.5 * value(x, c));
  return bad;
}

static int dir_entries(const char *dir) {
  DIR *dp = opendir(dir);
  CHECK(dp != NULL);
  int n = 0;
  for (struct dirent *de; (de = readdir(dp));) n += strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
  closedir(dp);
  return n;
}

static void register_range(el_replicas *r, float *f, double *d, float *g, size_t total, size_t lo, size_t hi) {
  CHECK_OK(el_rep_register(r, "f32", f, NULL, sizeof(float), total, lo, hi));
  CHECK_OK(el_rep_register(r, "f64", d, NULL, sizeof(double), total, lo, hi));
  CHECK_OK(el_rep_register(r, "whole", NULL, g, sizeof(float), total, lo, hi));
}

/* The last rank lost (none at N = 1): every rank describes its holdings
 * (whole buffers at commits c_hi and c_hi - 1), the lost one's left out;
 * el_rep_choose must pick c_hi; the survivors' ranges cut anew and rebuilt
 * from the files at each of `commits` (newest first), checked against the
 * closed form; then f, d, g registered back at [lo, hi). */
static void lose_last_and_rebuild(el_replicas *r, td_comm *comm, size_t total, int64_t c_hi, int n_commits,
                                  float *f, double *d, float *g, size_t lo, size_t hi) {
  int world = td_comm_size(comm), me = td_comm_rank(comm);
  int lost = world > 1 ? world - 1 : -1;
  int n_pieces = el_rep_n_pieces(r);
  CHECK_OK(td_allreduce(&n_pieces, &n_pieces, 1, TD_I32, TD_MAX, comm));
  size_t stride = EL_DESC_LEN(n_pieces);
  int64_t *desc = calloc((size_t)world * stride, sizeof *desc);
  int64_t *targets = calloc((size_t)world * 2, sizeof *targets);
  CHECK(desc && targets);
  int64_t *mine = desc + (size_t)me * stride;
  mine[EL_D_WHOLE0] = c_hi;
  mine[EL_D_WHOLE1] = c_hi - 1;
  el_rep_describe(r, mine, n_pieces);
  CHECK_OK(td_allgather(mine, desc, (size_t)world * stride, TD_I64, comm));
  if (lost >= 0)
    for (int i = 0; i < n_pieces; i++) desc[(size_t)lost * stride + EL_D_PIECES + 3 * i + 2] = -1;
  int64_t gap_lo, gap_hi;
  CHECK_EQ_INT(el_rep_choose(desc, world, n_pieces, &gap_lo, &gap_hi), c_hi);
  int survivors = lost >= 0 ? world - 1 : 1;
  for (int j = 0; j < world; j++) {
    bool alive = j != lost;
    targets[2 * j] = alive ? (int64_t)(total * (size_t)j / (size_t)survivors) : 0;
    targets[2 * j + 1] = alive ? (int64_t)(total * (size_t)(j + 1) / (size_t)survivors) : 0;
  }
  size_t nlo = (size_t)targets[2 * me], nhi = (size_t)targets[2 * me + 1], nn = nhi - nlo;
  float *nf = malloc((nn ? nn : 1) * sizeof *nf);
  double *nd = malloc((nn ? nn : 1) * sizeof *nd);
  float *ng = malloc((total ? total : 1) * sizeof *ng);
  CHECK(nf && nd && ng);
  register_range(r, nf, nd, ng, total, nlo, nhi);
  for (int64_t c = c_hi; c > c_hi - n_commits; c--) {
    memset(nf, 0xff, (nn ? nn : 1) * sizeof *nf);
    memset(nd, 0xff, (nn ? nn : 1) * sizeof *nd);
    memset(ng, 0xff, (total ? total : 1) * sizeof *ng);
    size_t from_others = 0;
    CHECK_OK(el_rep_restore(r, comm, desc, n_pieces, targets, c, &from_others));
    CHECK_EQ_INT(bad_elements(nf, nd, ng, nlo, nhi, c), 0);
    if (me == 0) printf("rebuilt commit %lld for %d of %d ranks\n", (long long)c, survivors, world);
  }
  register_range(r, f, d, g, total, lo, hi);
  free(desc);
  free(targets);
  free(nf);
  free(nd);
  free(ng);
}

/* A directory that is not there: a clear error, not a crash or a silent copy in memory. */
static void missing_dir_case(void) {
  setenv("TANDEM_ELASTIC_REPLICA_DIR", "/nonexistent/tandem-replicas", 1);
  el_replicas r;
  memset(&r, 0, sizeof r);
  float f[4] = {1, 2, 3, 4}, g[4] = {1, 2, 3, 4};
  double d[4] = {1, 2, 3, 4};
  register_range(&r, f, d, g, 4, 0, 4);
  CHECK_OK(el_rep_commit(&r, NULL, 1)); /* started: its thread meets the error */
  CHECK_STATUS(el_rep_commit_wait(&r, NULL), TD_ERR_IO);
  CHECK(strstr(td_last_error(), "/nonexistent/tandem-replicas") != NULL);
  CHECK(strstr(td_last_error(), "TANDEM_ELASTIC_REPLICA_DIR") != NULL);
  el_rep_free(&r);
}

int main(int argc, char **argv) {
  CHECK(argc == 2);
  size_t total = (size_t)strtoull(argv[1], NULL, 10);
  td_comm *comm = NULL;
  CHECK_OK(td_comm_init(&comm));
  int world = td_comm_size(comm), me = td_comm_rank(comm);
  missing_dir_case();

  char dir[] = "/var/tmp/tandem-replica-test-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  setenv("TANDEM_ELASTIC_REPLICA_DIR", dir, 1);
  size_t lo = total * (size_t)me / (size_t)world, hi = total * (size_t)(me + 1) / (size_t)world, n = hi - lo;
  float *f = malloc((n ? n : 1) * sizeof *f);
  double *d = malloc((n ? n : 1) * sizeof *d);
  float *g = malloc((total ? total : 1) * sizeof *g);
  CHECK(f && d && g);
  el_replicas r;
  memset(&r, 0, sizeof r);
  register_range(&r, f, d, g, total, lo, hi);
  fill(f, d, lo, hi, 1);
  fill_whole(g, total, lo, hi, 1, true); /* as after a rebuild: the whole buffer's own range alone */
  CHECK_OK(el_rep_reset_holdings(&r, comm, 1)); /* pairs the ranks, replicates commit 1 */
  lose_last_and_rebuild(&r, comm, total, 1, 1, f, d, g, lo, hi);
  /* Commit 3's copy is held back 2 s (the test hook): the fence must
   * wait for it, and once it returned the next step's values (commit 4's)
   * go into the live shards at once, as an optimizer's update would: the
   * copies must still hold commit 3 (checked by the rebuild below). A
   * fence that did not wait would let the copy see commit 4. */
  setenv("TANDEM_TEST_ELASTIC_SLOW_COMMITS", "3:3", 1);
  for (int64_t c = 2; c <= 3; c++) {
    fill(f, d, lo, hi, c);
    fill_whole(g, total, lo, hi, c, false);
    CHECK_OK(el_rep_commit(&r, comm, c));
    double t0 = td_now();
    CHECK_OK(el_rep_commit_wait(&r, comm));
    if (c == 3) CHECK(td_now() - t0 >= 1.5); /* it did wait for the held-back copy */
    CHECK_EQ_INT(dir_entries(dir), 0);
  }
  unsetenv("TANDEM_TEST_ELASTIC_SLOW_COMMITS");
  fill(f, d, lo, hi, 4); /* the next step's update, after the fence */
  fill_whole(g, total, lo, hi, 4, false);

  /* the holdings: one host, so rank i's buddy is i + 1 and its ward i - 1 */
  CHECK_EQ_INT(r.buddy, world > 1 ? (me + 1) % world : -1);
  CHECK_EQ_INT(r.n_wards, world > 1 ? 1 : 0);
  CHECK_EQ_INT(r.own[0].commit, 3);
  CHECK_EQ_INT(r.own[1].commit, 2);
  size_t disk = 2 * n * 16, ward_f64 = 0;
  if (world > 1) {
    int w = (me + world - 1) % world;
    size_t wlo = total * (size_t)w / (size_t)world, whi = total * (size_t)(w + 1) / (size_t)world;
    CHECK_EQ_INT(r.wards[0].rank, w);
    for (int k = 0; k < 2; k++) {
      CHECK_EQ_INT(r.wards[0].rep[k].commit, 3 - k);
      CHECK_EQ_INT(r.wards[0].rep[k].lo, (int64_t)wlo);
      CHECK_EQ_INT(r.wards[0].rep[k].hi, (int64_t)whi);
    }
    disk += 2 * (whi - wlo) * 16;
    ward_f64 = (whi - wlo) * sizeof(double);
  }
  CHECK_EQ_INT(el_rep_disk_bytes(&r), disk);
  /* the staging buffer bounds the memory used, and is used whole once a
   * ward's buffer spans it (two half chunks in flight) */
  CHECK(r.staging_used <= (size_t)TD_ELASTIC_STAGING_BYTES);
  CHECK(world == 1 ? r.staging_used == 0 : r.staging_used > 0);
  if (ward_f64 >= (size_t)TD_ELASTIC_STAGING_BYTES) CHECK_EQ_INT(r.staging_used, TD_ELASTIC_STAGING_BYTES);

  /* the last rank lost: commits 3 and 2 rebuilt */
  lose_last_and_rebuild(&r, comm, total, 3, 2, f, d, g, lo, hi);
  CHECK_EQ_INT(dir_entries(dir), 0);
  el_rep_free(&r);
  CHECK_EQ_INT(rmdir(dir), 0);
  free(f);
  free(d);
  free(g);
  CHECK_OK(td_comm_finalize(comm));
  td_comm_destroy(comm);
  printf("el2 replica: rank %d of %d ok (%zu elements)\n", me, world, total);
  return 0;
}
