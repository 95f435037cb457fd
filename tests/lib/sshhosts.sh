# Hosts with their own sshd, for multi-host tests and benchmarks (sourced,
# not run). Builds on tests/lib/netns.sh (one bridge, one network namespace
# per host); each ssh host also gets its own UTS, IPC and PID namespaces
# (and a mount namespace for its own /proc; the files are shared), so
# that it is a machine of its own as far as processes go: its sshd is the
# PID namespace's init, every rank started over ssh lives in that namespace,
# and killing the init kills every process of the host at once (the kernel
# does it), which is the closest thing to pulling a machine's power cord.
#
#   . tests/lib/sshhosts.sh
#   sshhosts_init DIR              # netns_init + keys and sshd configs in DIR;
#                                  # exports TANDEM_SSH (the key, no host checks)
#   sshhosts_add a 10.77.15.1      # namespace host a with sshd, answering ssh
#   netns_add_host l 10.77.15.9    # a plain namespace host (no sshd), e.g. the
#                                  # launcher's: netns_run / netns_spawn l CMD
#   sshhosts_pids a                # pids (as this host sees them) of every
#                                  # process of a except its init
#   sshhosts_kill a                # every process of a at once (kill -9 of its init)
#   sshhosts_start a               # a fresh sshd (new PID namespace) after a kill
#   sshhosts_loss a 0.1            # drop 10% of a's packets, both ways (iptables
#                                  # statistic match: this kernel has no netem)
#   sshhosts_loss a 0              # no loss again
#   sshhosts_outer_pid a PID       # the pid this host sees for a pid that a
#                                  # process of a printed (its namespace's pid)
#
# Clean-up is netns.sh's: on exit, also after a failure or a signal, every
# namespace goes (its iptables rules with it) and every init started here is
# killed, which takes its namespace's processes with it. Needs root, sshd
# (openssh-server), iptables and iproute2; scripts/install-deps has them.

here_sshhosts=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here_sshhosts/netns.sh"

SSHHOSTS_DIR=""
declare -A SSHHOSTS_ADDR=()  # host -> address
declare -A SSHHOSTS_OUTER=() # host -> pid of its `unshare` (the init is its only child)

sshhosts_init() { # DIR (private, removed by the caller)
  command -v /usr/sbin/sshd >/dev/null || _netns_fail "/usr/sbin/sshd not found: install openssh-server (scripts/install-deps does)"
  command -v ssh-keygen >/dev/null || _netns_fail "ssh-keygen not found: install openssh-client (scripts/install-deps does)"
  command -v iptables >/dev/null || _netns_fail "iptables not found: install iptables (scripts/install-deps does)"
  netns_init
  SSHHOSTS_DIR=$1
  mkdir -p /run/sshd "$SSHHOSTS_DIR" || _netns_fail "cannot create /run/sshd or $SSHHOSTS_DIR"
  ssh-keygen -q -t ed25519 -N '' -f "$SSHHOSTS_DIR/hostkey" || _netns_fail "ssh-keygen (host key)"
  ssh-keygen -q -t ed25519 -N '' -f "$SSHHOSTS_DIR/id" || _netns_fail "ssh-keygen (user key)"
  cp "$SSHHOSTS_DIR/id.pub" "$SSHHOSTS_DIR/authorized_keys"
  chmod 600 "$SSHHOSTS_DIR/authorized_keys"
  export TANDEM_SSH="ssh -i $SSHHOSTS_DIR/id -F /dev/null -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o ConnectTimeout=5"
}

sshhosts_add() { # NAME ADDRESS
  netns_add_host "$1" "$2"
  sshhosts_config "$1" "$2"
  sshhosts_start "$1"
}

sshhosts_config() { # NAME ADDRESS: the sshd config $SSHHOSTS_DIR/sshd_NAME (also for hosts whose init is another daemon)
  SSHHOSTS_ADDR[$1]=$2
  cat >"$SSHHOSTS_DIR/sshd_$1" <<EOF
ListenAddress $2
Port 22
HostKey $SSHHOSTS_DIR/hostkey
AuthorizedKeysFile $SSHHOSTS_DIR/authorized_keys
StrictModes no
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PidFile none
AcceptEnv none
MaxStartups 100
EOF
}

sshhosts_start() { # NAME: sshd as the init of fresh UTS, IPC and PID namespaces
  local ns hn ok _
  ns=$(netns_name "$1")
  hn=$(netns_hostname "$1")
  # unshare forks (--fork) so that sshd is pid 1 of the new PID namespace;
  # --kill-child: if unshare is killed, so is the init, so is the host. The
  # host's own /proc (a mount namespace for it; files are shared all the
  # same): what its programs read there (LeakSanitizer reads
  # /proc/self/task) must match their own pids.
  ip netns exec "$ns" unshare --uts --ipc --pid --mount --mount-proc --fork --kill-child -- \
    sh -c 'hostname "$0" && exec /usr/sbin/sshd -D -e -f "$1"' "$hn" "$SSHHOSTS_DIR/sshd_$1" \
    2>>"$SSHHOSTS_DIR/sshd_$1.log" &
  SSHHOSTS_OUTER[$1]=$!
  NETNS_SPAWNED+=("$!")
  ok=0
  for _ in $(seq 1 100); do
    ip netns exec "$ns" $TANDEM_SSH "${SSHHOSTS_ADDR[$1]}" true 2>/dev/null && { ok=1; break; }
    sleep 0.1
  done
  [ $ok = 1 ] || { cat "$SSHHOSTS_DIR/sshd_$1.log" >&2; _netns_fail "sshd on host $1 (${SSHHOSTS_ADDR[$1]}) does not answer"; }
}

_sshhosts_init_pid() { # NAME -> pid of the host's init, as seen here
  pgrep -P "${SSHHOSTS_OUTER[$1]}" | head -1
}

sshhosts_pids() { # NAME: every process of the host but its init
  local init pid
  init=$(_sshhosts_init_pid "$1")
  [ -n "$init" ] || return 0
  for pid in $(ip netns pids "$(netns_name "$1")"); do
    [ "$pid" = "$init" ] && continue
    # Only those in the host's PID namespace (ip netns pids also lists
    # `unshare` itself and anything the caller ran there with netns_run).
    [ "$(readlink "/proc/$pid/ns/pid" 2>/dev/null)" = "$(readlink "/proc/$init/ns/pid" 2>/dev/null)" ] && echo "$pid"
  done
}

sshhosts_outer_pid() { # NAME INNER_PID
  local init pid
  init=$(_sshhosts_init_pid "$1")
  [ -n "$init" ] || return 1
  for pid in $(sshhosts_pids "$1"); do
    # NSpid: the pid in every namespace from here down; the last is the host's own.
    [ "$(awk '/^NSpid:/ { print $NF }' "/proc/$pid/status" 2>/dev/null)" = "$2" ] && { echo "$pid"; return 0; }
  done
  return 1
}

sshhosts_kill() { # NAME: the kernel kills every process of a PID namespace whose init dies
  local init
  init=$(_sshhosts_init_pid "$1")
  [ -n "$init" ] && kill -KILL "$init"
  wait "${SSHHOSTS_OUTER[$1]}" 2>/dev/null
  return 0
}

sshhosts_loss() { # NAME PROBABILITY (0: none)
  local ns chain
  ns=$(netns_name "$1")
  for chain in INPUT OUTPUT; do
    ip netns exec "$ns" iptables -F "$chain" || _netns_fail "cannot flush iptables $chain in $ns"
    if [ "$2" != 0 ]; then
      # Loopback inside the host stays lossless: only its wire is bad.
      ip netns exec "$ns" iptables -A "$chain" "$([ $chain = INPUT ] && echo -i || echo -o)" lo -j ACCEPT ||
        _netns_fail "cannot add an iptables rule to $chain in $ns"
      ip netns exec "$ns" iptables -A "$chain" -m statistic --mode random --probability "$2" -j DROP ||
        _netns_fail "cannot add a $2 random drop rule to $chain in $ns (iptables statistic match)"
    fi
  done
}
