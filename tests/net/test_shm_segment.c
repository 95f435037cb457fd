/* Shared-memory segments, host identity and pid liveness: a segment created
 * here is zero-filled, visible under its name to another process until
 * unlinked, and names never repeat; the host identity is stable and a child
 * shares it; a zombie child is not alive. */
#include "../common/check.h"
#include "net/net.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static void test_create_open_unlink(void) {
  size_t size = (3u << 20) + 123; /* not a page multiple */
  char name[128];
  unsigned char *a = NULL;
  CHECK_OK(net_shm_create("test/seg", size, name, sizeof name, (void **)&a));
  CHECK(strncmp(name, "/tandem-test_seg-", 17) == 0);
  CHECK_EQ_INT(strlen(name), 17 + 16);
  for (size_t i = 0; i < size; i += 4093) CHECK_EQ_INT(a[i], 0);
  CHECK_EQ_INT(a[size - 1], 0);

  /* A child process maps it by name and writes; the parent sees the writes. */
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    unsigned char *b = NULL;
    if (net_shm_open(name, size, (void **)&b) != TD_OK) _exit(3);
    for (size_t i = 0; i < size; i++) b[i] = (unsigned char)(i % 251);
    net_shm_unmap(b, size);
    _exit(0);
  }
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  for (size_t i = 0; i < size; i += 997) CHECK_EQ_INT(a[i], i % 251);

  /* Asking for more than exists is refused with the name in the message. */
  void *c = NULL;
  CHECK_STATUS(net_shm_open(name, size * 2, &c), TD_ERR_INVALID_ARGUMENT);
  CHECK(strstr(td_last_error(), name) != NULL);

  /* After unlink the name is gone but the mapping still works. */
  net_shm_unlink(name);
  CHECK(net_shm_open(name, size, &c) == TD_ERR_SYSTEM);
  CHECK(strstr(td_last_error(), name) != NULL);
  a[0] = 42;
  CHECK_EQ_INT(a[0], 42);
  net_shm_unmap(a, size);
  net_shm_unlink(NULL);
  net_shm_unmap(NULL, 0);
  CHECK_STATUS(net_shm_create("x", 0, name, sizeof name, &c), TD_ERR_INVALID_ARGUMENT);
}

static void test_unique_names(void) {
  enum { N = 64 };
  char names[N][128];
  void *addrs[N];
  for (int i = 0; i < N; i++) CHECK_OK(net_shm_create("uniq", 4096, names[i], sizeof names[i], &addrs[i]));
  for (int i = 0; i < N; i++)
    for (int j = i + 1; j < N; j++) CHECK(strcmp(names[i], names[j]) != 0);
  for (int i = 0; i < N; i++) {
    net_shm_unlink(names[i]);
    net_shm_unmap(addrs[i], 4096);
  }
}

static void test_host_identity_and_pids(void) {
  char id1[512], id2[512];
  CHECK_OK(net_host_identity(id1, sizeof id1));
  CHECK_OK(net_host_identity(id2, sizeof id2));
  CHECK(strcmp(id1, id2) == 0);
  CHECK(strstr(id1, "ipc:[") != NULL);
  CHECK(strstr(id1, "pid:[") != NULL);
  char host[256];
  gethostname(host, sizeof host);
  CHECK(strncmp(id1, host, strlen(host)) == 0);
  char small[8];
  CHECK_STATUS(net_host_identity(small, sizeof small), TD_ERR_INVALID_ARGUMENT);

  /* A child on this host has the same identity. */
  int pipefd[2];
  CHECK(pipe(pipefd) == 0);
  pid_t pid = fork();
  if (pid == 0) {
    char id[512];
    net_host_identity(id, sizeof id);
    ssize_t w = write(pipefd[1], id, strlen(id) + 1);
    _exit(w > 0 ? 0 : 1);
  }
  char child_id[512] = "";
  ssize_t got = 0, n;
  while ((n = read(pipefd[0], child_id + got, sizeof child_id - 1 - (size_t)got)) > 0) {
    got += n;
    if (child_id[got - 1] == '\0') break;
  }
  CHECK(strcmp(child_id, id1) == 0);
  int status;
  waitpid(pid, &status, 0);
  close(pipefd[0]);
  close(pipefd[1]);

  char addr[64];
  CHECK_OK(net_local_address(NULL, NULL, addr, sizeof addr));
  char parsed_host[64];
  int port;
  char with_port[80];
  snprintf(with_port, sizeof with_port, "%s:1", addr);
  CHECK_OK(net_parse_addr(with_port, parsed_host, sizeof parsed_host, &port));

  CHECK(net_pid_alive(getpid()));
  CHECK(!net_pid_alive(0));
  /* A child that exited but was not reaped is a zombie: not alive. */
  pid = fork();
  if (pid == 0) _exit(0);
  double deadline = td_now() + 5;
  while (net_pid_alive(pid) && td_now() < deadline) usleep(2000);
  CHECK(!net_pid_alive(pid));
  CHECK(kill(pid, 0) == 0); /* still a zombie, so the check above was the /proc path */
  waitpid(pid, &status, 0);
  CHECK(!net_pid_alive(pid));
  /* A sleeping child is alive until killed. */
  pid = fork();
  if (pid == 0) {
    pause();
    _exit(0);
  }
  CHECK(net_pid_alive(pid));
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  CHECK(!net_pid_alive(pid));
}

int main(void) {
  test_create_open_unlink();
  test_unique_names();
  test_host_identity_and_pids();
  printf("test_shm_segment: all checks passed\n");
  return 0;
}
