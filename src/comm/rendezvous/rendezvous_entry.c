/* The rendezvous entry each rank publishes (rendezvous.c): "<world size>\n<host
 * identity>\n<pid>\n<address>". Parsed here with every field checked, so
 * that an entry from another build, another job sharing the job id, or a
 * corrupted store is an error naming the field instead of a number atoi
 * made up (atoi("12x") is 12, atoi("") is 0: a pid 0 would make the
 * liveness checks kill(0, 0) the whole process group). */
#include "comm/rendezvous/rendezvous.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A decimal integer in [lo, hi], the whole field. */
static bool parse_long(const char *text, long lo, long hi, long *out) {
  if (!text || !*text || *text == '+' || *text == ' ') return false;
  char *end;
  errno = 0;
  long v = strtol(text, &end, 10);
  if (errno || *end || v < lo || v > hi) return false;
  *out = v;
  return true;
}

td_status comm_rdv_entry_parse(char *entry, int rank, comm_rdv_entry *out) {
  char *save = NULL;
  char *f_size = strtok_r(entry, "\n", &save);
  char *f_host = strtok_r(NULL, "\n", &save);
  char *f_pid = strtok_r(NULL, "\n", &save);
  char *f_addr = strtok_r(NULL, "\n", &save);
  char *extra = strtok_r(NULL, "\n", &save);
  const char *bad = NULL, *value = "";
  long size = 0, pid = 0;
  if (!f_size || !f_host || !f_pid || !f_addr || extra)
    bad = "not 4 lines (world size, host, pid, address)";
  else if (!parse_long(f_size, 1, 1L << 24, &size))
    bad = "the world size is not an integer from 1 to 2^24", value = f_size;
  else if (!parse_long(f_pid, 1, 0x7fffffffL, &pid))
    bad = "the process id is not a positive integer", value = f_pid;
  if (bad)
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "malformed rendezvous entry of rank %d: %s%s%s%s (does every rank run the same Tandem build, and "
                    "does no other job use this job id and store?)",
                    rank, bad, *value ? " ('" : "", value, *value ? "')" : "");
  out->size = (int)size;
  out->pid = (pid_t)pid;
  out->host = f_host;
  out->addr = f_addr;
  return TD_OK;
}
