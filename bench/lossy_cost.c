/* The CPU cost of tandemrun's lossy-host watch (docs/elastic.md "Lossy
 * hosts are evicted"), per hour of a job: every 0.1 s one sock_diag dump of
 * the namespace's TCP connections (el_lossy_sample) and one store request
 * (the commit count, a store_add answered by tandemrun's own store thread),
 * and every 0.1 s a 13-byte ping per host written to its agent's ssh.
 *
 *   lossy_cost CONNS SAMPLES HOSTS
 *
 * CONNS loopback connections are open while it samples (tandemrun sees its
 * agents' ssh connections and the ranks' store connections: 2 hosts with 2
 * ranks each hold about 14). The pings are written to a pipe that a thread
 * drains (the ssh client, sshd and the agent that forward them on the
 * hosts are other processes: not measured here). CPU is this process's
 * user+sys (getrusage, all threads: the store server thread included). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "elastic/lossy.h"
#include "net/net.h"

static double cpu_s(void) {
  struct rusage r;
  getrusage(RUSAGE_SELF, &r);
  return (double)r.ru_utime.tv_sec + r.ru_utime.tv_usec * 1e-6 + (double)r.ru_stime.tv_sec + r.ru_stime.tv_usec * 1e-6;
}

static void *drain(void *arg) {
  int fd = *(int *)arg;
  char buf[4096];
  while (read(fd, buf, sizeof buf) > 0) {
  }
  return NULL;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: lossy_cost CONNS SAMPLES HOSTS\n");
    return 2;
  }
  int conns = atoi(argv[1]), samples = atoi(argv[2]), hosts = atoi(argv[3]);
  if (conns < 0 || conns > 1000 || samples < 1 || hosts < 1 || hosts > 64) {
    fprintf(stderr, "lossy_cost: CONNS in 0..1000, SAMPLES >= 1, HOSTS in 1..64\n");
    return 2;
  }
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 1024) ||
      getsockname(ls, (struct sockaddr *)&a, &len)) {
    perror("lossy_cost: listen");
    return 1;
  }
  int *fds = calloc((size_t)conns * 2 + 1, sizeof *fds);
  for (int i = 0; i < conns; i++) {
    fds[2 * i] = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fds[2 * i], (struct sockaddr *)&a, sizeof a) || (fds[2 * i + 1] = accept(ls, NULL, NULL)) < 0) {
      perror("lossy_cost: connect");
      return 1;
    }
  }
  /* (a) the sock_diag sample */
  el_lossy l;
  el_lossy_init(&l);
  el_lossy_set_host(&l, 0, "127.0.0.1");
  el_lossy_set_host(&l, 1, "10.255.255.254");
  double c0 = cpu_s(), t0 = td_now();
  for (int i = 0; i < samples; i++)
    if (!el_lossy_sample(&l, t0 + 0.1 * i)) {
      perror("lossy_cost: sock_diag");
      return 1;
    }
  double sample_cpu = (cpu_s() - c0) / samples;
  int seen = l.hosts[0].conns;
  el_lossy_free(&l);
  /* (b) the commit count: a store_add to a store server in this process */
  td_store_server *server;
  td_store *client;
  char addr[64];
  if (store_server_start("127.0.0.1", 0, &server) != TD_OK) return 1;
  snprintf(addr, sizeof addr, "127.0.0.1:%d", store_server_port(server));
  if (store_connect(addr, 10, &client) != TD_OK) return 1;
  int64_t n = 0;
  c0 = cpu_s();
  for (int i = 0; i < samples; i++)
    if (store_add(client, "job/el/commits", 0, &n) != TD_OK) return 1;
  double add_cpu = (cpu_s() - c0) / samples;
  store_close(client);
  store_server_stop(server);
  /* (c) the pings: HOSTS writes of 13 bytes per round */
  int p[2];
  if (pipe(p)) return 1;
  pthread_t th;
  pthread_create(&th, NULL, drain, &p[0]);
  unsigned char frame[13] = {9, 0, 0, 0, 14};
  c0 = cpu_s();
  for (int i = 0; i < samples; i++)
    for (int h = 0; h < hosts; h++)
      if (write(p[1], frame, sizeof frame) != (ssize_t)sizeof frame) return 1;
  double ping_cpu = (cpu_s() - c0) / samples; /* the reader thread's reads included */
  close(p[1]);
  pthread_join(th, NULL);
  double per_round = sample_cpu + add_cpu + ping_cpu;
  printf("connections seen by the sampler: %d (of %d loopback pairs, both ends)\n", seen, conns);
  printf("per 0.1 s round: sock_diag sample %.1f us, store_add %.1f us, %d pings %.1f us: %.1f us of CPU\n",
         sample_cpu * 1e6, add_cpu * 1e6, hosts, ping_cpu * 1e6, per_round * 1e6);
  printf("per hour of tandemrun (36000 rounds): %.2f CPU-s (sample %.2f, store_add %.2f, pings %.2f)\n",
         per_round * 36000, sample_cpu * 36000, add_cpu * 36000, ping_cpu * 36000);
  return 0;
}
