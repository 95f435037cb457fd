# A real Slurm cluster on namespace hosts, for tests and benchmarks (sourced,
# not run): Debian's slurm-wlm and munge, slurmctld on host "ctl" and one
# slurmd on each compute host, every daemon the init of its own network, UTS,
# IPC, PID and mount namespaces (tests/lib/netns.sh's bridge), so that a node
# is a machine of its own as far as processes go and killing its init is
# pulling its power cord.
#
#   . tests/lib/slurmcluster.sh
#   slurm_init DIR 10.77.17 n1 n2 n3  # munged, slurm.conf, slurmctld on .10,
#                                     # slurmd nI on .I; waits until all idle
#   slurm_run CMD...                  # CMD on the login host (srun, sbatch,
#                                     # squeue...), SLURM_CONF set
#   slurm_node_kill n2                # every process of node n2 at once
#   slurm_node_start n2               # a fresh slurmd on n2 (after a kill)
#   slurm_node_pids n2                # pids (as seen here) of n2's processes
#                                     # but its init
#   $TANDEM_SSH                       # ssh into a node (each runs an sshd too,
#                                     # so tandemrun can run on the same nodes)
#
# What a site configures by hand is generated here (docs/slurm.md): one
# munge key (a single munged serves every host: they share the file system,
# and munge's socket is a path), a slurm.conf whose NodeAddr are the
# namespace addresses, and /etc/hosts naming the nodes (bind-mounted over
# /etc/hosts inside each host's own mount namespace: the machine's file is
# untouched). No cgroups: proctrack/linuxproc, task/none, no accounting
# (slurmd 22.05 still initializes a cgroup plugin: an empty tmpfs at
# /sys/fs/cgroup in each host's mount namespace satisfies cgroup/v1).
# Everything (daemons, namespaces, files) is removed on exit, also after a
# failure or a signal (netns.sh's trap). Needs root, slurm-wlm, munge,
# iproute2 (scripts/install-deps).

here_slurmcluster=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here_slurmcluster/sshhosts.sh"

SLURM_DIR=""
SLURM_NET=""
SLURM_NODES=()
declare -A SLURM_OUTER=() # node -> pid of its `unshare` (the init is its only child)

# Why Slurm cannot run here, or nothing: for a test's SKIP line.
slurm_missing() {
  local p
  for p in slurmctld slurmd srun sbatch munged; do
    command -v "$p" >/dev/null || command -v "/usr/sbin/$p" >/dev/null ||
      { echo "$p is not installed (apt-get install slurm-wlm munge; scripts/install-deps does)"; return 0; }
  done
  [ "$(id -u)" = 0 ] || { echo "the Slurm cluster needs root (namespaces, daemons as SlurmUser root)"; return 0; }
  return 1
}

_slurm_host() { # NAME CMD (a shell line, run by the init of the host's namespaces)
  local ns
  ns=$(netns_name "$1")
  # --kill-child: if unshare is killed, so is the init, so is the host. The
  # init is bash, which reaps every orphan (slurmstepd double-forks).
  ip netns exec "$ns" unshare --uts --ipc --pid --mount --mount-proc --fork --kill-child -- \
    bash -c 'hostname "$0" && mount --bind "$1" /etc/hosts && mount -t tmpfs cgroup /sys/fs/cgroup &&
      { eval "$2" & wait $!; }' \
    "$1" "$SLURM_DIR/hosts" "$2" >>"$SLURM_DIR/$1.out" 2>&1 &
  SLURM_OUTER[$1]=$!
  NETNS_SPAWNED+=("$!")
}

slurm_init() { # DIR NET(a.b.c) NODE...
  SLURM_DIR=$1
  SLURM_NET=$2
  shift 2
  SLURM_NODES=("$@")
  local why i n nodes
  why=$(slurm_missing) && _netns_fail "$why"
  sshhosts_init "$SLURM_DIR/ssh" # also netns_init; TANDEM_SSH reaches every node's sshd
  mkdir -p "$SLURM_DIR/state" && chmod 711 "$SLURM_DIR" || _netns_fail "cannot create $SLURM_DIR"
  # munge: a fresh key for this cluster, its own socket (not the system's).
  dd if=/dev/urandom of="$SLURM_DIR/munge.key" bs=1024 count=1 status=none && chmod 400 "$SLURM_DIR/munge.key" ||
    _netns_fail "cannot write the munge key"
  /usr/sbin/munged -F --force --key-file "$SLURM_DIR/munge.key" --socket "$SLURM_DIR/munge.sock" \
    --pid-file "$SLURM_DIR/munged.pid" --log-file "$SLURM_DIR/munged.log" --seed-file "$SLURM_DIR/munge.seed" \
    >>"$SLURM_DIR/munged.out" 2>&1 &
  NETNS_SPAWNED+=("$!")
  for i in $(seq 1 50); do [ -S "$SLURM_DIR/munge.sock" ] && break; sleep 0.1; done
  [ -S "$SLURM_DIR/munge.sock" ] || { cat "$SLURM_DIR/munged.out" "$SLURM_DIR/munged.log" >&2; _netns_fail "munged did not start"; }

  echo "127.0.0.1 localhost" >"$SLURM_DIR/hosts"
  echo "$SLURM_NET.10 ctl" >>"$SLURM_DIR/hosts"
  i=1
  for n in "${SLURM_NODES[@]}"; do echo "$SLURM_NET.$i $n" >>"$SLURM_DIR/hosts"; i=$((i + 1)); done
  nodes=$(IFS=,; echo "${SLURM_NODES[*]}")
  {
    cat <<EOC
ClusterName=tandem
SlurmctldHost=ctl($SLURM_NET.10)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SLURM_DIR/munge.sock,cred_expire=10
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$SLURM_DIR/state
SlurmdSpoolDir=$SLURM_DIR/spool.%n
SlurmctldPidFile=$SLURM_DIR/slurmctld.pid
SlurmdPidFile=$SLURM_DIR/slurmd.%n.pid
SlurmctldLogFile=$SLURM_DIR/slurmctld.log
SlurmdLogFile=$SLURM_DIR/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
PlugStackConfig=$SLURM_DIR/plugstack.conf
ReturnToService=2
SlurmctldTimeout=10
SlurmdTimeout=5
MessageTimeout=5
KillWait=1
MinJobAge=30
InactiveLimit=0
SchedulerParameters=sched_interval=1
EOC
    i=1
    for n in "${SLURM_NODES[@]}"; do
      echo "NodeName=$n NodeAddr=$SLURM_NET.$i NodeHostname=$n CPUs=2 RealMemory=1000 State=UNKNOWN"
      i=$((i + 1))
    done
    echo "PartitionName=td Nodes=$nodes Default=YES MaxTime=INFINITE State=UP"
  } >"$SLURM_DIR/slurm.conf"
  : >"$SLURM_DIR/plugstack.conf"
  # slurmd initializes a cgroup plugin even when no plugin uses cgroups; v1
  # on an empty tmpfs (mounted in each host's namespace: `ip netns exec`
  # gives it a fresh /sys without the machine's cgroup mounts) satisfies it.
  echo "CgroupPlugin=cgroup/v1" >"$SLURM_DIR/cgroup.conf"
  export SLURM_CONF=$SLURM_DIR/slurm.conf

  netns_add_host ctl "$SLURM_NET.10"
  _slurm_host ctl "exec /usr/sbin/slurmctld -D -i -f '$SLURM_CONF'"
  i=1
  for n in "${SLURM_NODES[@]}"; do
    netns_add_host "$n" "$SLURM_NET.$i"
    sshhosts_config "$n" "$SLURM_NET.$i"
    slurm_node_start "$n"
    i=$((i + 1))
  done
  slurm_wait_idle "${#SLURM_NODES[@]}" 30 || {
    for f in "$SLURM_DIR"/*.log "$SLURM_DIR"/*.out; do echo "== $f"; tail -n 15 "$f"; done >&2
    _netns_fail "the Slurm cluster did not come up within 30 s (sinfo: $(slurm_run sinfo -h -N -o '%N %T' | tr '\n' ' '))"
  }
}

slurm_node_start() { # NODE: slurmd, and an sshd for tandemrun's runs on the same nodes
  local ok _
  mkdir -p "$SLURM_DIR/spool.$1" || _netns_fail "cannot create $SLURM_DIR/spool.$1"
  _slurm_host "$1" "/usr/sbin/sshd -e -f '$SSHHOSTS_DIR/sshd_$1' && exec /usr/sbin/slurmd -D -f '$SLURM_CONF' -N '$1'"
  ok=0
  for _ in $(seq 1 100); do
    ip netns exec "$(netns_name "$1")" $TANDEM_SSH "${SSHHOSTS_ADDR[$1]}" true 2>/dev/null && { ok=1; break; }
    sleep 0.1
  done
  [ $ok = 1 ] || { cat "$SLURM_DIR/$1.out" >&2; _netns_fail "sshd on node $1 (${SSHHOSTS_ADDR[$1]}) does not answer"; }
}

slurm_run() { # CMD...: on the login host (the controller's network, this machine's processes)
  ip netns exec "$(netns_name ctl)" "$@"
}

slurm_wait_idle() { # N SECONDS: until N nodes are idle
  local _
  for _ in $(seq 1 $(( $2 * 5 ))); do
    [ "$(slurm_run sinfo -h -N -t idle -o '%N' 2>/dev/null | sort -u | wc -l)" = "$1" ] && return 0
    sleep 0.2
  done
  return 1
}

_slurm_init_pid() { pgrep -P "${SLURM_OUTER[$1]}" | head -1; }

slurm_node_pids() { # NODE
  local init pid
  init=$(_slurm_init_pid "$1")
  [ -n "$init" ] || return 0
  for pid in $(ip netns pids "$(netns_name "$1")"); do
    [ "$pid" = "$init" ] && continue
    [ "$(readlink "/proc/$pid/ns/pid" 2>/dev/null)" = "$(readlink "/proc/$init/ns/pid" 2>/dev/null)" ] && echo "$pid"
  done
}

slurm_node_kill() { # NODE
  local init
  init=$(_slurm_init_pid "$1")
  [ -n "$init" ] && kill -KILL "$init"
  wait "${SLURM_OUTER[$1]}" 2>/dev/null
  return 0
}
