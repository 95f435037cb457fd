/* Rendezvous entries ("<size>\n<host>\n<pid>\n<address>", published by
 * src/comm/rendezvous/rendezvous.c) are parsed with every field checked
 * (rendezvous_entry.c there): a well-formed one
 * gives its fields; a world size or pid that is not a whole decimal number
 * in range, a missing or extra line, is TD_ERR_INVALID_ARGUMENT naming the
 * rank and the field. (atoi read "12x" as 12, "" and "abc" as 0, and a pid
 * of 0 would make the liveness checks signal the whole process group.) */
#include <stdio.h>
#include <string.h>

#include "../common/check.h"
#include "comm/rendezvous/rendezvous.h"

static void expect_bad(const char *text, const char *needle) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", text);
  comm_rdv_entry e;
  td_status st = comm_rdv_entry_parse(buf, 7, &e);
  if (st != TD_ERR_INVALID_ARGUMENT)
    td_test_fail(__FILE__, __LINE__, "entry '%s' was accepted (status %s)", text, td_status_str(st));
  if (!strstr(td_last_error(), "rank 7") || !strstr(td_last_error(), needle))
    td_test_fail(__FILE__, __LINE__, "entry '%s': the error '%s' does not name rank 7 and '%s'", text,
                 td_last_error(), needle);
}

int main(void) {
  char ok[] = "16\nhost-a boot 42\n12345\n10.0.0.7:4100";
  comm_rdv_entry e;
  CHECK_OK(comm_rdv_entry_parse(ok, 3, &e));
  CHECK_EQ_INT(e.size, 16);
  CHECK_EQ_INT(e.pid, 12345);
  CHECK(!strcmp(e.host, "host-a boot 42"));
  CHECK(!strcmp(e.addr, "10.0.0.7:4100"));
  char big[] = "16777216\nh\n2147483647\na:1";
  CHECK_OK(comm_rdv_entry_parse(big, 0, &e));
  CHECK_EQ_INT(e.size, 1 << 24);

  expect_bad("12x\nh\n100\na:1", "world size");
  expect_bad("\nh\n100\na:1", "not 4 lines"); /* strtok skips the empty line: 3 fields */
  expect_bad("abc\nh\n100\na:1", "world size");
  expect_bad("0\nh\n100\na:1", "world size");
  expect_bad("-4\nh\n100\na:1", "world size");
  expect_bad("+4\nh\n100\na:1", "world size");
  expect_bad("16777217\nh\n100\na:1", "world size");
  expect_bad("99999999999999999999999\nh\n100\na:1", "world size");
  expect_bad("4\nh\n0\na:1", "process id");
  expect_bad("4\nh\n-1\na:1", "process id");
  expect_bad("4\nh\n12 \na:1", "process id");
  expect_bad("4\nh\n2147483648\na:1", "process id");
  expect_bad("4\nh\n100", "not 4 lines");
  expect_bad("4\nh\n100\na:1\nextra", "not 4 lines");
  printf("rendezvous entries ok: well-formed parsed, 14 malformed refused naming the field\n");
  return 0;
}
