/* Slurm's environment, read strictly. Under srun every task learns its rank
 * (SLURM_PROCID), the step's size (SLURM_NTASKS), its node's index
 * (SLURM_NODEID) and the step's layout: SLURM_STEP_NODELIST, a hostlist
 * expression ("n[01-04],gpu7"), and SLURM_STEP_TASKS_PER_NODE ("2(x3),1").
 * Tandem needs no launcher of its own there: the first node of the step
 * hosts the rendezvous store (rank 0 runs on it under Slurm's block and
 * cyclic distributions, and rank 0 checks that it does), every rank dials
 * that node by name. Variables that disagree with each other are refused
 * with a message naming them, never guessed around: a wrong guess is a job
 * whose ranks wait for each other forever. Called by launcher_env.c. */
#include "comm/rendezvous/rendezvous.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The upper bound on hosts and tasks this parser accepts: far above any
 * cluster, low enough that sums and products cannot overflow an int. */
#define SLURM_MAX_COUNT (1 << 24)

static bool host_char(char c) { return isalnum((unsigned char)c) || c == '-' || c == '_' || c == '.'; }

/* One bracket group "[1-3,07,10-12]" starting at *p (past the '['): the
 * number of values, and the first value formatted as written (zero padding
 * kept). *p ends past the ']'. */
static td_status parse_ranges(const char *list, const char **p, long *count_out, char *first, size_t first_size) {
  long count = 0;
  first[0] = '\0';
  for (;;) {
    const char *lo = *p;
    while (isdigit((unsigned char)**p)) (*p)++;
    size_t lo_len = (size_t)(*p - lo);
    if (lo_len == 0 || lo_len > 9)
      return td_error(TD_ERR_INVALID_ARGUMENT,
                      "Slurm node list \"%s\": a bracket holds \"%.*s\" where a number (1 to 9 digits) belongs", list,
                      (int)strcspn(lo, ",]"), lo);
    long a = strtol(lo, NULL, 10), b = a;
    if (**p == '-') {
      const char *hi = ++(*p);
      while (isdigit((unsigned char)**p)) (*p)++;
      if (*p == hi || *p - hi > 9)
        return td_error(TD_ERR_INVALID_ARGUMENT, "Slurm node list \"%s\": the range starting at %.*s has no end number",
                        list, (int)lo_len, lo);
      b = strtol(hi, NULL, 10);
      if (b < a)
        return td_error(TD_ERR_INVALID_ARGUMENT, "Slurm node list \"%s\": the range %ld-%ld runs backwards", list, a,
                        b);
    }
    if (!first[0]) {
      if (lo_len >= first_size) return td_error(TD_ERR_INVALID_ARGUMENT, "Slurm node list \"%s\": a number is too long", list);
      memcpy(first, lo, lo_len);
      first[lo_len] = '\0';
    }
    count += b - a + 1;
    if (count > SLURM_MAX_COUNT)
      return td_error(TD_ERR_INVALID_ARGUMENT, "Slurm node list \"%s\" names more than %d hosts", list, SLURM_MAX_COUNT);
    if (**p == ',') {
      (*p)++;
      continue;
    }
    if (**p == ']') {
      (*p)++;
      *count_out = count;
      return TD_OK;
    }
    return td_error(TD_ERR_INVALID_ARGUMENT, "Slurm node list \"%s\": unexpected \"%s\" inside brackets (write n[1-3,5])",
                    list, **p ? *p : "end of the list");
  }
}

td_status comm_slurm_nodelist(const char *list, char *first_out, size_t first_size, int *count_out) {
  if (!list || !*list)
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "the Slurm node list is empty: SLURM_STEP_NODELIST or SLURM_JOB_NODELIST must name the step's "
                    "nodes (run the program with srun inside an allocation)");
  long total = 0;
  const char *p = list;
  bool first_item = true;
  while (*p) {
    /* One item: name parts and bracket groups up to a top-level ','; its
     * hosts are the product of its groups. */
    long item = 1;
    size_t len = 0;
    bool any = false;
    while (*p && *p != ',') {
      if (*p == '[') {
        char num[16];
        long n = 0;
        p++;
        TD_CHECK(parse_ranges(list, &p, &n, num, sizeof num));
        item *= n;
        if (item > SLURM_MAX_COUNT)
          return td_error(TD_ERR_INVALID_ARGUMENT, "Slurm node list \"%s\" names more than %d hosts", list,
                          SLURM_MAX_COUNT);
        if (first_item) {
          size_t n_len = strlen(num);
          if (len + n_len >= first_size)
            return td_error(TD_ERR_INVALID_ARGUMENT, "Slurm node list \"%s\": the first host name is longer than %zu",
                            list, first_size - 1);
          memcpy(first_out + len, num, n_len);
          len += n_len;
        }
      } else if (host_char(*p)) {
        if (first_item) {
          if (len + 1 >= first_size)
            return td_error(TD_ERR_INVALID_ARGUMENT, "Slurm node list \"%s\": the first host name is longer than %zu",
                            list, first_size - 1);
          first_out[len++] = *p;
        }
        p++;
      } else {
        return td_error(TD_ERR_INVALID_ARGUMENT,
                        "Slurm node list \"%s\": character '%c' at offset %ld belongs in no host name (a list is "
                        "names and ranges such as n[01-04],gpu7)",
                        list, *p, (long)(p - list));
      }
      any = true;
    }
    if (!any)
      return td_error(TD_ERR_INVALID_ARGUMENT, "Slurm node list \"%s\" has an empty entry (two commas, or one at an end)",
                      list);
    if (first_item) first_out[len] = '\0';
    first_item = false;
    total += item;
    if (total > SLURM_MAX_COUNT)
      return td_error(TD_ERR_INVALID_ARGUMENT, "Slurm node list \"%s\" names more than %d hosts", list, SLURM_MAX_COUNT);
    if (*p == ',') {
      p++;
      if (!*p)
        return td_error(TD_ERR_INVALID_ARGUMENT, "Slurm node list \"%s\" has an empty entry (two commas, or one at an end)",
                        list);
    }
  }
  *count_out = (int)total;
  return TD_OK;
}

td_status comm_slurm_tasks_per_node(const char *spec, int node_id, int *total_out, int *on_node_out, int *nodes_out) {
  if (!spec || !*spec)
    return td_error(TD_ERR_INVALID_ARGUMENT, "Slurm's tasks per node (SLURM_STEP_TASKS_PER_NODE) is empty");
  long total = 0, nodes = 0;
  int on_node = -1;
  const char *p = spec;
  for (;;) {
    char *end;
    if (!isdigit((unsigned char)*p)) goto garbled;
    long tasks = strtol(p, &end, 10), repeat = 1;
    if (tasks < 1 || tasks > SLURM_MAX_COUNT) goto garbled;
    p = end;
    if (*p == '(') {
      if (p[1] != 'x' || !isdigit((unsigned char)p[2])) goto garbled;
      repeat = strtol(p + 2, &end, 10);
      if (repeat < 1 || repeat > SLURM_MAX_COUNT || *end != ')') goto garbled;
      p = end + 1;
    }
    if (node_id >= nodes && node_id < nodes + repeat) on_node = (int)tasks;
    nodes += repeat;
    total += tasks * repeat;
    if (nodes > SLURM_MAX_COUNT || total > SLURM_MAX_COUNT) goto garbled;
    if (!*p) break;
    if (*p++ != ',') goto garbled;
  }
  *total_out = (int)total;
  *nodes_out = (int)nodes;
  *on_node_out = on_node;
  return TD_OK;
garbled:
  return td_error(TD_ERR_INVALID_ARGUMENT,
                  "Slurm's tasks per node \"%s\" is garbled at \"%s\": expected counts such as 2(x3),1", spec, p);
}

td_status comm_slurm_layout(comm_env *env, char *store_host, size_t store_host_size) {
  /* srun sets the step's variables in every task. A batch script has
   * SLURM_PROCID=0 and the job's SLURM_NTASKS too, but no step: a program
   * run there directly would host a store and wait for ranks that no one
   * starts. */
  if (!getenv("SLURM_STEP_ID") && !getenv("SLURM_STEPID"))
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "this process has Slurm's SLURM_PROCID=%d and SLURM_NTASKS=%d but no SLURM_STEP_ID: it is the "
                    "batch script of job %s, not one of %d tasks. Start the program with srun inside the script, so "
                    "that every task runs it",
                    env->rank, env->size, td_env_str("SLURM_JOB_ID", "?"), env->size);
  static const char list_name[] = "SLURM_STEP_NODELIST", tasks_name[] = "SLURM_STEP_TASKS_PER_NODE",
                    nodes_name[] = "SLURM_STEP_NUM_NODES";
  const char *list = getenv(list_name), *tasks = getenv(tasks_name), *nodes_text = getenv(nodes_name);
  if (!list)
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "rank %d of %d (Slurm: SLURM_PROCID/SLURM_NTASKS) has no SLURM_STEP_NODELIST to find the "
                    "rendezvous host in: start it with srun, or set TANDEM_STORE=host:port",
                    env->rank, env->size);
  int n_nodes;
  TD_CHECK(comm_slurm_nodelist(list, store_host, store_host_size, &n_nodes));
  if (nodes_text) {
    char *end;
    long n = strtol(nodes_text, &end, 10);
    if (end == nodes_text || *end || n != n_nodes)
      return td_error(TD_ERR_INVALID_ARGUMENT, "Slurm's variables disagree: %s=\"%s\" names %d node%s but %s=\"%s\"",
                      list_name, list, n_nodes, n_nodes == 1 ? "" : "s", nodes_name, nodes_text);
  }
  if (tasks) {
    const char *node_text = td_env_str("SLURM_NODEID", NULL);
    int node_id = -1, total, on_node, spec_nodes;
    if (node_text) {
      char *end;
      long id = strtol(node_text, &end, 10);
      if (end == node_text || *end || id < 0 || id >= n_nodes)
        return td_error(TD_ERR_INVALID_ARGUMENT, "SLURM_NODEID=\"%s\" is not a node index below %d (%s=\"%s\")",
                        node_text, n_nodes, list_name, list);
      node_id = (int)id;
    }
    TD_CHECK(comm_slurm_tasks_per_node(tasks, node_id, &total, &on_node, &spec_nodes));
    if (total != env->size)
      return td_error(TD_ERR_INVALID_ARGUMENT,
                      "Slurm's task counts disagree: SLURM_NTASKS=%d but %s=\"%s\" adds up to %d tasks (srun sets "
                      "both for the step: was one of them set or exported by hand?)",
                      env->size, tasks_name, tasks, total);
    if (spec_nodes != n_nodes)
      return td_error(TD_ERR_INVALID_ARGUMENT, "Slurm's variables disagree: %s=\"%s\" is for %d nodes but %s=\"%s\" names %d",
                      tasks_name, tasks, spec_nodes, list_name, list, n_nodes);
    if (node_id >= 0) {
      if (env->local_rank >= on_node)
        return td_error(TD_ERR_INVALID_ARGUMENT,
                        "Slurm's variables disagree: SLURM_LOCALID=%d on node %d, which runs %d task%s (%s=\"%s\")",
                        env->local_rank, node_id, on_node, on_node == 1 ? "" : "s", tasks_name, tasks);
      env->local_size = on_node;
    }
  }
  if (env->rank == 0) {
    /* Rank 0 hosts the store on the step's first node, where the other ranks
     * look for it: it must be running there (not so under an arbitrary
     * distribution, srun -m arbitrary or a plane layout). */
    const char *me = td_env_str("SLURMD_NODENAME", NULL);
    if (me && strcmp(me, store_host))
      return td_error(TD_ERR_INVALID_ARGUMENT,
                      "rank 0 runs on node %s, not on the step's first node %s (%s=\"%s\"), where the other ranks look "
                      "for the rendezvous store: use srun's default block distribution (or cyclic), or set "
                      "TANDEM_STORE=host:port to a store every rank reaches",
                      me, store_host, list_name, list);
  }
  return TD_OK;
}
