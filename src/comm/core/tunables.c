/* The TANDEM_* tunables of a communicator, read once when it is created
 * (DESIGN.md §5): every algorithm and transport reads comm->tun, never the
 * environment, so that an operation never calls getenv and every rank's
 * choice is fixed for the communicator's life (td_comm_split copies the
 * parent's).
 *
 * Values are checked here, before any connection is made, and a bad one is
 * TD_ERR_INVALID_ARGUMENT naming the variable and what it accepts: a byte
 * size that does not parse, is not finite or does not fit (sizes are capped
 * at 1 GiB, so that the shared-memory layout and socket buffers that grow
 * from them cannot overflow), a timeout that is not a positive number of
 * seconds below COMM_TUN_MAX_TIMEOUT_S (deadlines become timespecs), a spin
 * time outside 0..1 s, a switch that is not 0 or 1. Unset values keep the
 * sentinel (COMM_TUN_UNSET, or a negative spin) and each user applies its own
 * measured default, next to the measurement that justifies it. */
#include "comm/core/core.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TUNABLE_BYTES ((size_t)1 << 30)
#define MAX_SPIN_US 1e6

static const char *env_value(const char *name) {
  const char *v = getenv(name);
  return v && *v ? v : NULL;
}

/* A byte size in [min, MAX_TUNABLE_BYTES]; unset: COMM_TUN_UNSET. */
static td_status read_bytes(const char *name, size_t min, size_t *out) {
  *out = COMM_TUN_UNSET;
  const char *v = env_value(name);
  if (!v) return TD_OK;
  size_t x;
  if (td_parse_size(v, &x) != 0 || x < min || x > MAX_TUNABLE_BYTES)
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s=%s is not a byte size from %zu to 1G (e.g. 256K, 4M): unset it or "
                                             "fix the value",
                    name, v, min);
  *out = x;
  return TD_OK;
}

/* A finite number in [lo, hi]; unset: dflt. */
static td_status read_number(const char *name, double lo, double hi, bool lo_open, double dflt, const char *unit,
                             double *out) {
  *out = dflt;
  const char *v = env_value(name);
  if (!v) return TD_OK;
  char *end;
  errno = 0;
  double x = strtod(v, &end);
  if (errno || *end || !isfinite(x) || x < lo || (lo_open && x == lo) || x > hi)
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s=%s is not a number of %s %s %g and at most %g: unset it or fix the "
                                             "value",
                    name, v, unit, lo_open ? "above" : "from", lo, hi);
  *out = x;
  return TD_OK;
}

static td_status read_switch(const char *name, bool dflt, bool *out) {
  *out = dflt;
  const char *v = env_value(name);
  if (!v) return TD_OK;
  if (!strcmp(v, "0") || !strcmp(v, "1")) {
    *out = v[0] == '1';
    return TD_OK;
  }
  return td_error(TD_ERR_INVALID_ARGUMENT, "%s=%s: use 0 or 1", name, v);
}

/* A name that goes into a rendezvous entry and a "host:port" address: at
 * most size - 1 printable characters without spaces (the entries are
 * newline-separated, so a newline would forge a field). */
static td_status read_name(const char *name, const char *what, char *out, size_t size) {
  out[0] = '\0';
  const char *v = env_value(name);
  if (!v) return TD_OK;
  size_t len = strlen(v);
  bool ok = len < size;
  for (size_t i = 0; ok && i < len; i++) ok = v[i] > ' ' && v[i] < 127;
  if (!ok)
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s='%s' is not %s (at most %zu printable characters, no spaces): unset it "
                                             "or fix the value",
                    name, v, what, size - 1);
  memcpy(out, v, len + 1);
  return TD_OK;
}

td_status comm_tunables_read(const td_comm_config *config, comm_tunables *t) {
  memset(t, 0, sizeof *t);
  /* TANDEM_CPU picks the reduction kernels' level (src/base/cpu.c): one the
   * CPU lacks, or a typo, is refused here like any other bad tunable */
  TD_CHECK(td_cpu_check());
  /* An explicit config timeout wins over the environment; it gets the same
   * checks (a NaN or a century would break the deadline arithmetic). */
  if (config && config->timeout_s != 0) {
    if (!isfinite(config->timeout_s) || config->timeout_s < 0 || config->timeout_s > COMM_TUN_MAX_TIMEOUT_S)
      return td_error(TD_ERR_INVALID_ARGUMENT, "td_comm_config: timeout_s %g is not a number of seconds above 0 and "
                                               "at most %g (0 means TANDEM_TIMEOUT or 300)",
                      config->timeout_s, COMM_TUN_MAX_TIMEOUT_S);
    t->timeout_s = config->timeout_s;
  } else {
    TD_CHECK(read_number("TANDEM_TIMEOUT", 0, COMM_TUN_MAX_TIMEOUT_S, true, 300.0, "seconds", &t->timeout_s));
  }
  TD_CHECK(read_number("TANDEM_CONNECT_TIMEOUT", 0, COMM_TUN_MAX_TIMEOUT_S, true, 60.0, "seconds",
                       &t->connect_timeout_s));
  /* A communicator given its own deadline waits no longer than that for its
   * peers at start-up either (a torch process group created with
   * timeout=6s must not wait the default 60 s for a member that never
   * comes). */
  if (config && config->timeout_s != 0) t->connect_timeout_s = TD_MIN(t->connect_timeout_s, t->timeout_s);

  const char *algo = env_value("TANDEM_ALLREDUCE_ALGO");
  if (!algo || !strcmp(algo, "auto")) t->allreduce_algo = COMM_ALGO_AUTO;
  else if (!strcmp(algo, "ring")) t->allreduce_algo = COMM_ALGO_RING;
  else if (!strcmp(algo, "rd")) t->allreduce_algo = COMM_ALGO_RD;
  else if (!strcmp(algo, "shm")) t->allreduce_algo = COMM_ALGO_SHM;
  else
    return td_error(TD_ERR_INVALID_ARGUMENT, "TANDEM_ALLREDUCE_ALGO=%s is not an algorithm: use auto, ring, rd or shm",
                    algo);
  TD_CHECK(read_switch("TANDEM_SHM_COLLECTIVES", true, &t->shm_collectives));
  TD_CHECK(read_switch("TANDEM_SHM_XMAP", true, &t->shm_xmap));
  TD_CHECK(read_switch("TANDEM_SHM_CMA", true, &t->shm_cma));
  const char *partials = env_value("TANDEM_HALF_PARTIALS");
  if (partials && strcmp(partials, "f32") && strcmp(partials, "half"))
    return td_error(TD_ERR_INVALID_ARGUMENT, "TANDEM_HALF_PARTIALS=%s: use f32 (the default: f16/bf16 reductions "
                                             "round once) or half (half the bytes, rounded at every hop)",
                    partials);
  t->half_partials = partials && !strcmp(partials, "half");
  /* TANDEM_RD_MAX_BYTES compares with a message size; 0 turns recursive
   * doubling off, and any size up to the cap is meaningful. */
  TD_CHECK(read_bytes("TANDEM_RD_MAX_BYTES", 0, &t->rd_max_bytes));
  TD_CHECK(read_bytes("TANDEM_RING_CHUNK_BYTES", 1, &t->ring_chunk_bytes));
  TD_CHECK(read_bytes("TANDEM_BCAST_CHUNK_BYTES", 1, &t->bcast_chunk_bytes));
  TD_CHECK(read_bytes("TANDEM_SHM_FIFO_BYTES", 1, &t->shm_fifo_bytes));
  TD_CHECK(read_bytes("TANDEM_P2P_UNEXPECTED_BYTES", 0, &t->p2p_unexpected_bytes));
  TD_CHECK(read_bytes("TANDEM_SHM_SLOT_BYTES", 1, &t->shm_slot_bytes));
  TD_CHECK(read_bytes("TANDEM_SHM_CHUNK_BYTES", 1, &t->shm_chunk_bytes));
  TD_CHECK(read_bytes("TANDEM_TCP_BUFFER_BYTES", 0, &t->tcp_buffer_bytes));
  TD_CHECK(read_bytes("TANDEM_DEVICE_CHUNK_BYTES", 1, &t->device_chunk_bytes));
  TD_CHECK(read_switch("TANDEM_STAGE_HOST_BUFFERS", false, &t->stage_host_buffers));
  const char *dcoll = env_value("TANDEM_DEVICE_COLL");
  if (!dcoll || !strcmp(dcoll, "auto")) t->device_coll = COMM_DEVICE_COLL_AUTO;
  else if (!strcmp(dcoll, "nccl")) t->device_coll = COMM_DEVICE_COLL_NCCL;
  else if (!strcmp(dcoll, "staged")) t->device_coll = COMM_DEVICE_COLL_STAGED;
  else
    return td_error(TD_ERR_INVALID_ARGUMENT, "TANDEM_DEVICE_COLL=%s is not a path: use auto, nccl or staged", dcoll);
  TD_CHECK(read_number("TANDEM_SHM_SPIN_US", 0, MAX_SPIN_US, false, -1.0, "microseconds", &t->shm_spin_us));
  TD_CHECK(read_number("TANDEM_TCP_SPIN_US", 0, MAX_SPIN_US, false, -1.0, "microseconds", &t->tcp_spin_us));
  /* Off by default: on this project's machines integrity halves the TCP
   * busbw (docs/security.md, bench/protect.sh), far above the 10% at which
   * it would have been the default between hosts. */
  const char *protect = env_value("TANDEM_TCP_PROTECT");
  net_protect_mode mode = NET_PROTECT_OFF;
  if (protect && net_protect_parse_mode(protect, &mode) != 0)
    return td_error(TD_ERR_INVALID_ARGUMENT, "TANDEM_TCP_PROTECT=%s: use off (the default), integrity (every message "
                                             "authenticated) or encrypt (also encrypted); the same on every rank",
                    protect);
  t->tcp_protect = mode;
  /* The pair (interval at most half the timeout) and the defaults are the
   * TCP transport's (transport/tcp/tcp.c), which alone uses them. */
  TD_CHECK(read_number("TANDEM_HEARTBEAT_TIMEOUT", 0, COMM_TUN_MAX_TIMEOUT_S, false, -1.0, "seconds",
                       &t->heartbeat_timeout_s));
  TD_CHECK(read_number("TANDEM_HEARTBEAT_INTERVAL", 0.01, 3600, false, -1.0, "seconds", &t->heartbeat_interval_s));
  TD_CHECK(read_number("TANDEM_HEARTBEAT_MIN_TIMEOUT", 0.02, COMM_TUN_MAX_TIMEOUT_S, false, -1.0, "seconds",
                       &t->heartbeat_min_timeout_s));
  /* Where this rank listens and what it publishes (rendezvous, transport/tcp/tcp.c). */
  TD_CHECK(read_name("TANDEM_HOST_ADDR", "a host name or IP address", t->host_addr, sizeof t->host_addr));
  TD_CHECK(read_name("TANDEM_IFACE", "a network interface name", t->iface, sizeof t->iface));
  return TD_OK;
}
