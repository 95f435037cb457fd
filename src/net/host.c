/* Host facts: the address peers should dial, an identity string that tells
 * which ranks can share memory, and whether a local pid is still alive. */
#include "net/net.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

td_status net_iface_address(const char *name, char *buf, size_t size) {
  struct ifaddrs *list = NULL;
  if (getifaddrs(&list) != 0) return td_error_errno("cannot list the network interfaces (TANDEM_IFACE=%s)", name);
  bool exists = false;
  for (struct ifaddrs *ifa = list; ifa; ifa = ifa->ifa_next) {
    if (strcmp(ifa->ifa_name, name) != 0) continue;
    exists = true;
    if (!ifa->ifa_addr || ifa->ifa_addr->sa_family != AF_INET || !(ifa->ifa_flags & IFF_UP)) continue;
    char text[INET_ADDRSTRLEN];
    if (!inet_ntop(AF_INET, &((struct sockaddr_in *)ifa->ifa_addr)->sin_addr, text, sizeof text)) continue;
    td_strlcpy(buf, text, size);
    freeifaddrs(list);
    return TD_OK;
  }
  freeifaddrs(list);
  return td_error(TD_ERR_INVALID_ARGUMENT, "TANDEM_IFACE=%s: %s", name,
                  exists ? "the interface is down or has no IPv4 address" : "no such network interface");
}

td_status net_local_address(const char *host_addr, const char *iface, char *buf, size_t size) {
  if (host_addr && *host_addr) {
    td_strlcpy(buf, host_addr, size);
    return TD_OK;
  }
  if (iface && *iface) return net_iface_address(iface, buf, size);
  struct ifaddrs *list = NULL;
  if (getifaddrs(&list) == 0) {
    for (struct ifaddrs *ifa = list; ifa; ifa = ifa->ifa_next) {
      if (!ifa->ifa_addr || ifa->ifa_addr->sa_family != AF_INET) continue;
      if (!(ifa->ifa_flags & IFF_UP) || (ifa->ifa_flags & IFF_LOOPBACK)) continue;
      char text[INET_ADDRSTRLEN];
      if (!inet_ntop(AF_INET, &((struct sockaddr_in *)ifa->ifa_addr)->sin_addr, text, sizeof text)) continue;
      td_strlcpy(buf, text, size);
      freeifaddrs(list);
      return TD_OK;
    }
    freeifaddrs(list);
  }
  td_strlcpy(buf, "127.0.0.1", size);
  return TD_OK;
}

/* First line of a small file, without the newline; "" if unreadable. */
static void read_first_line(const char *path, char *buf, size_t size) {
  buf[0] = '\0';
  FILE *f = fopen(path, "re");
  if (!f) return;
  if (fgets(buf, (int)size, f)) buf[strcspn(buf, "\n")] = '\0';
  fclose(f);
}

td_status net_host_identity(char *buf, size_t size) {
  char hostname[256] = "";
  if (gethostname(hostname, sizeof hostname) != 0) td_strlcpy(hostname, "unknown-host", sizeof hostname);
  hostname[sizeof hostname - 1] = '\0';
  /* The boot id tells apart two machines (or containers) with the same
   * hostname; the namespaces tell apart containers on one machine that cannot
   * see each other's shared memory or pids. */
  char boot_id[64];
  read_first_line("/proc/sys/kernel/random/boot_id", boot_id, sizeof boot_id);
  char ipc_ns[128] = "", pid_ns[128] = "";
  ssize_t n = readlink("/proc/self/ns/ipc", ipc_ns, sizeof ipc_ns - 1);
  ipc_ns[n > 0 ? n : 0] = '\0';
  n = readlink("/proc/self/ns/pid", pid_ns, sizeof pid_ns - 1);
  pid_ns[n > 0 ? n : 0] = '\0';
  int len = snprintf(buf, size, "%s|%s|%s|%s", hostname, boot_id, ipc_ns, pid_ns);
  if (len < 0 || (size_t)len >= size)
    return td_error(TD_ERR_INVALID_ARGUMENT, "host identity needs %d bytes, buffer has %zu", len + 1, size);
  return TD_OK;
}

bool net_pid_alive(pid_t pid) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0 && errno != EPERM) return false;
  /* A zombie still answers kill(0) but will never run again. */
  char path[64], stat[512];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  read_first_line(path, stat, sizeof stat);
  if (!stat[0]) return true; /* no /proc: trust kill() */
  const char *close_paren = strrchr(stat, ')');
  if (!close_paren || close_paren[1] != ' ') return true;
  char state = close_paren[2];
  return state != 'Z' && state != 'X' && state != 'x';
}
