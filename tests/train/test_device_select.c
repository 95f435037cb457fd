/* td_train_device_select (src/train/device_select.c): which device a rank
 * trains on. Checked against the rule written here, not the library's:
 * "cpu" and an empty spec without TANDEM_DEVICE give the CPU; TANDEM_DEVICE
 * fills an empty spec; "cuda" alone gives cuda:(local_rank % visible GPUs);
 * "cuda:N" gives N; a bad spelling, a build or machine without a GPU, and an
 * index past the visible GPUs fail with a message naming where the spec came
 * from. The visible GPUs are 0 in a CPU build, and TANDEM_CUDAEMU_DEVICES in
 * the emulator tree (tests/cudaemu.suite runs this binary with 3). */
#include "../common/check.h"
#include "tandem/tandem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void expect_fail(const char *spec, int local_rank, const char *needle) {
  td_device d = {TD_DEVICE_CPU, 42};
  td_status st = td_train_device_select(spec, local_rank, &d);
  if (st == TD_OK || !strstr(td_last_error(), needle))
    td_test_fail(__FILE__, __LINE__, "select('%s', %d): expected a failure mentioning \"%s\", got %s: %s",
                 spec ? spec : "(null)", local_rank, needle, td_status_str(st), td_last_error());
}

static void expect(const char *spec, int local_rank, td_device_kind kind, int index) {
  td_device d = {TD_DEVICE_CPU, 42};
  td_status st = td_train_device_select(spec, local_rank, &d);
  if (st != TD_OK) td_test_fail(__FILE__, __LINE__, "select('%s', %d): %s", spec ? spec : "(null)", local_rank, td_last_error());
  CHECK_EQ_INT(d.kind, kind);
  CHECK_EQ_INT(d.index, index);
}

int main(void) {
  unsetenv("TANDEM_DEVICE");
  expect(NULL, 0, TD_DEVICE_CPU, 0);
  expect("", 3, TD_DEVICE_CPU, 0);
  expect("cpu", 5, TD_DEVICE_CPU, 0);
  setenv("TANDEM_DEVICE", "cpu", 1);
  expect("", 1, TD_DEVICE_CPU, 0);
  setenv("TANDEM_DEVICE", "tpu", 1);
  expect_fail("", 0, "TANDEM_DEVICE 'tpu'");
  expect("cpu", 0, TD_DEVICE_CPU, 0); /* the spec wins over the environment */
  unsetenv("TANDEM_DEVICE");
  expect_fail("gpu", 0, "the device setting 'gpu'");

  const char *emu = getenv("TANDEM_CUDAEMU_DEVICES");
  int gpus = emu ? atoi(emu) : 0;
  if (gpus == 0) { /* a CPU build: every CUDA request fails, saying which */
    expect_fail("cuda", 0, "the device setting 'cuda'");
    expect_fail("cuda:1", 2, "cuda:1");
    setenv("TANDEM_DEVICE", "cuda", 1);
    expect_fail(NULL, 1, "TANDEM_DEVICE 'cuda'");
    unsetenv("TANDEM_DEVICE");
  } else {
    for (int lr = 0; lr < 2 * gpus + 1; lr++) expect("cuda", lr, TD_DEVICE_CUDA, lr % gpus);
    expect("cuda:0", 7, TD_DEVICE_CUDA, 0);
    expect("cuda:1", 0, TD_DEVICE_CUDA, 1);
    char past[16];
    snprintf(past, sizeof past, "cuda:%d", gpus);
    expect_fail(past, 0, past);
    setenv("TANDEM_DEVICE", "cuda", 1);
    expect(NULL, gpus + 1, TD_DEVICE_CUDA, 1 % gpus);
    unsetenv("TANDEM_DEVICE");
  }
  printf("test_device_select: ok (%d visible GPUs)\n", gpus);
  return 0;
}
