/* Slurm's variables (src/comm/rendezvous/slurm.c, through comm_env_detect):
 * the store is found on the step's first node and every layout variable is
 * checked against the others. The expected values are written out by hand
 * from Slurm's documented formats (hostlist expressions, "2(x3),1" task
 * counts), as srun sets them: the variables of a real `srun -N2
 * --ntasks-per-node=2` (tests/cluster/slurm.sh runs one) are the first case.
 * Malformed or disagreeing variables must be TD_ERR_INVALID_ARGUMENT with a
 * message naming the variable, never a guess (a guess is a hang). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/check.h"
#include "comm/rendezvous/rendezvous.h"

static const char *all_vars[] = {
    "TANDEM_RANK", "TANDEM_WORLD_SIZE", "TANDEM_STORE", "TANDEM_STORE_PORT", "TANDEM_JOB_ID", "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "OMPI_MCA_ess_base_jobid", "TORCHELASTIC_RUN_ID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
    "SLURM_NODEID", "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST",
    "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES",
    "SLURMD_NODENAME"};

/* The environment of task `rank` of `srun -N2 --ntasks-per-node=2` in job
 * 42 on nodes n1, n2 (block distribution: ranks 0, 1 on n1). */
static void srun_env(int rank) {
  char text[16];
  for (size_t i = 0; i < sizeof all_vars / sizeof all_vars[0]; i++) unsetenv(all_vars[i]);
  snprintf(text, sizeof text, "%d", rank);
  setenv("SLURM_PROCID", text, 1);
  snprintf(text, sizeof text, "%d", rank % 2);
  setenv("SLURM_LOCALID", text, 1);
  snprintf(text, sizeof text, "%d", rank / 2);
  setenv("SLURM_NODEID", text, 1);
  setenv("SLURMD_NODENAME", rank / 2 ? "n2" : "n1", 1);
  setenv("SLURM_NTASKS", "4", 1);
  setenv("SLURM_JOB_ID", "42", 1);
  setenv("SLURM_STEP_ID", "0", 1);
  setenv("SLURM_STEP_NODELIST", "n[1-2]", 1);
  setenv("SLURM_JOB_NODELIST", "n[1-3]", 1); /* the allocation may be larger than the step */
  setenv("SLURM_STEP_TASKS_PER_NODE", "2(x2)", 1);
  setenv("SLURM_TASKS_PER_NODE", "2(x3)", 1);
  setenv("SLURM_STEP_NUM_NODES", "2", 1);
  setenv("SLURM_JOB_NUM_NODES", "3", 1);
}

static void expect_list(const char *list, const char *first, int count) {
  char got[64];
  int n = -1;
  CHECK_OK(comm_slurm_nodelist(list, got, sizeof got, &n));
  if (strcmp(got, first) || n != count)
    td_test_fail(__FILE__, __LINE__, "node list \"%s\": got first \"%s\", %d hosts; expected \"%s\", %d", list, got, n,
                 first, count);
}

static void expect_bad_list(const char *list, const char *fragment) {
  char got[64];
  int n;
  CHECK_MSG(comm_slurm_nodelist(list, got, sizeof got, &n), TD_ERR_INVALID_ARGUMENT, fragment);
}

static void expect_env_error(const char *fragment) {
  comm_env env;
  CHECK_MSG(comm_env_detect(NULL, &env), TD_ERR_INVALID_ARGUMENT, fragment);
}

int main(void) {
  /* Host lists: Slurm's hostlist syntax, counted by hand. */
  expect_list("n1", "n1", 1);
  expect_list("n[1-2]", "n1", 2);
  expect_list("node[007-010,3]", "node007", 5);  /* padding kept as written */
  expect_list("gpu7,n[1-4],login", "gpu7", 6);
  expect_list("r[1-2]n[01-03]", "r1n01", 6);       /* two groups multiply */
  expect_list("a-b.c_d[9]x", "a-b.c_d9x", 1);
  expect_list("n[0-0]", "n0", 1);
  expect_list("n[1-100000]", "n1", 100000);
  expect_bad_list("", "empty");
  expect_bad_list(NULL, "empty");
  expect_bad_list("n[1-", "no end number");
  expect_bad_list("n[1-3", "end of the list");
  expect_bad_list("n[3-1]", "runs backwards");
  expect_bad_list("n[a-b]", "where a number");
  expect_bad_list("n[]", "where a number");
  expect_bad_list("n1,,n2", "empty entry");
  expect_bad_list("n1,", "empty entry");
  expect_bad_list(",n1", "empty entry");
  expect_bad_list("n1]", "character ']'");
  expect_bad_list("n 1", "character ' '");
  expect_bad_list("n[1-2][1-99999999]", "more than");
  expect_bad_list("n[1-2[3]]", "inside brackets");

  /* Tasks per node. */
  int total, on_node, nodes;
  CHECK_OK(comm_slurm_tasks_per_node("2(x3),1", 3, &total, &on_node, &nodes));
  CHECK_EQ_INT(total, 7);
  CHECK_EQ_INT(on_node, 1);
  CHECK_EQ_INT(nodes, 4);
  CHECK_OK(comm_slurm_tasks_per_node("2(x3),1", 2, &total, &on_node, &nodes));
  CHECK_EQ_INT(on_node, 2);
  CHECK_OK(comm_slurm_tasks_per_node("5", 0, &total, &on_node, &nodes));
  CHECK_EQ_INT(total, 5);
  CHECK_EQ_INT(on_node, 5);
  CHECK_EQ_INT(nodes, 1);
  CHECK_OK(comm_slurm_tasks_per_node("3,1,2", -1, &total, &on_node, &nodes));
  CHECK_EQ_INT(total, 6);
  CHECK_EQ_INT(on_node, -1);
  const char *bad_tasks[] = {"", "0", "2(x0)", "2(3)", "2(x3", "2,", "x", "2(x3)1", "-1", "2 "};
  for (size_t i = 0; i < sizeof bad_tasks / sizeof bad_tasks[0]; i++)
    CHECK_MSG(comm_slurm_tasks_per_node(bad_tasks[i], 0, &total, &on_node, &nodes), TD_ERR_INVALID_ARGUMENT,
              "tasks per node");

  /* A real srun's variables: every rank dials n1 at one port, rank 0 hosts
   * the store bound to n1, local sizes from the layout. */
  comm_env env;
  char store0[256] = "";
  for (int rank = 0; rank < 4; rank++) {
    srun_env(rank);
    CHECK_OK(comm_env_detect(NULL, &env));
    CHECK(!strcmp(env.launcher, "Slurm"));
    CHECK_EQ_INT(env.rank, rank);
    CHECK_EQ_INT(env.size, 4);
    CHECK_EQ_INT(env.local_rank, rank % 2);
    CHECK_EQ_INT(env.local_size, 2);
    CHECK(!strcmp(env.job_id, "slurm-42.0"));
    CHECK(!strncmp(env.store, "n1:", 3));
    if (rank == 0) {
      snprintf(store0, sizeof store0, "%s", env.store);
      CHECK(env.host_store);
      CHECK(!strcmp(env.host_store_bind, "n1"));
      char expect[256];
      snprintf(expect, sizeof expect, "n1:%d", env.host_store_port);
      CHECK(!strcmp(env.store, expect));
    } else {
      CHECK(!env.host_store);
      CHECK(!strcmp(env.store, store0));
    }
  }
  /* Another step of the job gets another port (steps may run at once). */
  srun_env(1);
  setenv("SLURM_STEP_ID", "1", 1);
  CHECK_OK(comm_env_detect(NULL, &env));
  CHECK(strcmp(env.store, store0));
  /* TANDEM_STORE_PORT fixes it. */
  srun_env(0);
  setenv("TANDEM_STORE_PORT", "29555", 1);
  CHECK_OK(comm_env_detect(NULL, &env));
  CHECK(!strcmp(env.store, "n1:29555"));
  CHECK_EQ_INT(env.host_store_port, 29555);
  /* The batch script itself (its variables as Slurm 22.05 sets them: rank
   * 0 of the job's 4 tasks, no step): refused, or it would host a store and
   * wait for 3 ranks that nobody starts. */
  srun_env(0);
  for (const char *const *v = (const char *const[]){"SLURM_STEP_ID", "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE",
                                                    "SLURM_STEP_NUM_NODES", NULL};
       *v; v++)
    unsetenv(*v);
  setenv("SLURM_TASKS_PER_NODE", "2(x2)", 1);
  setenv("SLURM_JOB_NODELIST", "n[1-2]", 1);
  expect_env_error("no SLURM_STEP_ID: it is the batch script of job 42, not one of 4 tasks");
  /* A one-task batch job running the program directly is a world of one. */
  setenv("SLURM_NTASKS", "1", 1);
  CHECK_OK(comm_env_detect(NULL, &env));
  CHECK_EQ_INT(env.size, 1);

  /* Malformed and disagreeing variables. */
  srun_env(1);
  setenv("SLURM_STEP_NODELIST", "", 1);
  expect_env_error("node list is empty");
  srun_env(1);
  setenv("SLURM_STEP_NODELIST", "n[1-2", 1);
  expect_env_error("\"n[1-2\"");
  srun_env(1);
  unsetenv("SLURM_STEP_NODELIST");
  expect_env_error("no SLURM_STEP_NODELIST");
  srun_env(1);
  setenv("SLURM_NTASKS", "5", 1); /* the step's layout says 4 */
  expect_env_error("SLURM_NTASKS=5 but SLURM_STEP_TASKS_PER_NODE=\"2(x2)\" adds up to 4");
  srun_env(1);
  setenv("SLURM_STEP_TASKS_PER_NODE", "2(x3)", 1); /* 3 nodes' counts for a 2-node list */
  setenv("SLURM_NTASKS", "6", 1);
  expect_env_error("is for 3 nodes");
  srun_env(1);
  setenv("SLURM_STEP_NUM_NODES", "3", 1);
  expect_env_error("SLURM_STEP_NUM_NODES=\"3\"");
  srun_env(3);
  setenv("SLURM_LOCALID", "2", 1);
  expect_env_error("SLURM_LOCALID=2 on node 1, which runs 2 tasks");
  srun_env(3);
  setenv("SLURM_NODEID", "2", 1);
  expect_env_error("SLURM_NODEID=\"2\" is not a node index below 2");
  srun_env(3);
  setenv("SLURM_STEP_TASKS_PER_NODE", "2(x2", 1);
  expect_env_error("garbled");
  srun_env(0);
  setenv("SLURMD_NODENAME", "n2", 1); /* rank 0 away from the first node */
  expect_env_error("rank 0 runs on node n2, not on the step's first node n1");
  srun_env(2);
  setenv("SLURM_PROCID", "4", 1);
  expect_env_error("rank must be below the size");
  printf("slurm_env: node lists, task counts, a real srun's layout and 12 malformed cases checked\n");
  return 0;
}
