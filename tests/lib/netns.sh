# Hosts as network namespaces, for multi-host fault tests (sourced, not run).
# Needs root and iproute2 (scripts/install-deps installs it). Only private
# addresses inside namespaces this library creates are used: nothing is
# added to, or reachable from, the machine's own network.
#
#   . tests/lib/netns.sh
#   netns_init                  # or fail loudly: not root, no ip, no namespaces
#   netns_add_host a 10.77.5.1  # namespace + UTS hostname + eth0 on the switch
#   netns_add_host b 10.77.5.2
#   netns_run a CMD...          # run CMD on host a (foreground)
#   netns_spawn a CMD...        # in the background; its pid is in $NETNS_PID
#   netns_cut b down|drop       # pull b's cable (link down) or drop all its
#                               # traffic with the carrier up (100% loss both ways)
#   netns_restore b
#   (everything is removed on exit, also after a failure or a signal; a
#   caller with its own clean-up sets NETNS_ON_EXIT to a command to run too)
#
# Topology: one "switch" namespace holding a bridge, and per host a veth
# pair, eth0 in the host's namespace and pN on the bridge; every host sits
# in one /24 (give addresses in it). Names contain the caller's pid, so
# concurrent runs do not collide. Each host also gets its own UTS namespace
# (hostname "<name>-<pid>") whenever a command runs on it, so programs that
# tell hosts apart by hostname see different hosts; mount, pid and IPC
# namespaces are shared with the caller (files and /dev/shm are common).
#
# "drop" uses a token-bucket qdisc whose bucket is smaller than any packet,
# so every packet is dropped at the egress of both ends of the link: the
# kernels on both sides see no error, exactly as on a lossy wire. (netem
# would do the same where the kernel has it; this one does not everywhere.)

NETNS_TAG=""
NETNS_SWITCH=""
NETNS_HOSTS=()      # host names, in creation order
NETNS_SPAWNED=()    # pids started with netns_spawn
NETNS_PID=""

_netns_fail() { echo "FAIL: netns: $*" >&2; exit 1; }

netns_init() {
  [ "$(id -u)" = 0 ] || _netns_fail "this test needs root to create network namespaces (run as root; it cannot be skipped)"
  command -v ip >/dev/null || _netns_fail "'ip' not found: install iproute2 (scripts/install-deps does)"
  command -v tc >/dev/null || _netns_fail "'tc' not found: install iproute2 (scripts/install-deps does)"
  command -v unshare >/dev/null || _netns_fail "'unshare' not found: install util-linux"
  NETNS_TAG="${NETNS_TAG_PREFIX:-td}$$" # a test may name its own (NETNS_TAG_PREFIX=el2)
  NETNS_SWITCH="$NETNS_TAG-sw"
  trap 'netns_cleanup; eval "${NETNS_ON_EXIT:-:}"' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  ip netns add "$NETNS_SWITCH" || _netns_fail "cannot create a network namespace (ip netns add $NETNS_SWITCH)"
  ip -n "$NETNS_SWITCH" link add name br0 type bridge || _netns_fail "cannot create a bridge in $NETNS_SWITCH"
  ip -n "$NETNS_SWITCH" link set br0 up || _netns_fail "cannot bring up the bridge in $NETNS_SWITCH"
}

_netns_index() { # name -> index in NETNS_HOSTS
  local i
  for i in "${!NETNS_HOSTS[@]}"; do [ "${NETNS_HOSTS[$i]}" = "$1" ] && { echo "$i"; return 0; }; done
  _netns_fail "no host named '$1'"
}
netns_name() { echo "$NETNS_TAG-$1"; }        # the namespace of a host
netns_hostname() { echo "$1-$$"; }            # its UTS hostname

netns_add_host() { # NAME ADDRESS (in a /24)
  local name=$1 addr=$2 ns port
  ns=$(netns_name "$name")
  port="p${#NETNS_HOSTS[@]}"
  NETNS_HOSTS+=("$name")
  ip netns add "$ns" || _netns_fail "cannot create namespace $ns"
  ip -n "$ns" link set lo up || _netns_fail "cannot bring up lo in $ns"
  ip -n "$NETNS_SWITCH" link add name "$port" type veth peer name eth0 netns "$ns" ||
    _netns_fail "cannot create the veth pair $port/eth0 for $ns"
  ip -n "$NETNS_SWITCH" link set "$port" master br0 up || _netns_fail "cannot attach $port to the bridge"
  ip -n "$ns" addr add "$addr/24" dev eth0 || _netns_fail "cannot give $addr to eth0 in $ns"
  ip -n "$ns" link set eth0 up || _netns_fail "cannot bring up eth0 in $ns"
}

netns_run() { # HOST CMD...: in the host's network namespace and a fresh UTS namespace named after it
  local ns hn
  ns=$(netns_name "$1")
  hn=$(netns_hostname "$1")
  shift
  ip netns exec "$ns" unshare --uts -- sh -c 'hostname "$0" && exec "$@"' "$hn" "$@"
}

netns_spawn() { # HOST CMD...: as netns_run, in the background; pid in NETNS_PID
  # ip, unshare and sh each exec the next, so the pid is CMD's own.
  local ns hn
  ns=$(netns_name "$1")
  hn=$(netns_hostname "$1")
  shift
  ip netns exec "$ns" unshare --uts -- sh -c 'hostname "$0" && exec "$@"' "$hn" "$@" &
  NETNS_PID=$!
  NETNS_SPAWNED+=("$NETNS_PID")
}

netns_cut() { # HOST down|drop
  local ns port
  ns=$(netns_name "$1")
  port="p$(_netns_index "$1")"
  case $2 in
  down) ip -n "$ns" link set eth0 down || _netns_fail "cannot take eth0 down in $ns" ;;
  drop)
    tc -n "$ns" qdisc add dev eth0 root tbf rate 1kbit burst 1 latency 1ms || _netns_fail "cannot drop traffic on eth0 in $ns"
    tc -n "$NETNS_SWITCH" qdisc add dev "$port" root tbf rate 1kbit burst 1 latency 1ms ||
      _netns_fail "cannot drop traffic on $port in $NETNS_SWITCH" ;;
  *) _netns_fail "netns_cut: say down or drop, not '$2'" ;;
  esac
}

netns_restore() { # HOST
  local ns port
  ns=$(netns_name "$1")
  port="p$(_netns_index "$1")"
  tc -n "$ns" qdisc del dev eth0 root 2>/dev/null
  tc -n "$NETNS_SWITCH" qdisc del dev "$port" root 2>/dev/null
  ip -n "$ns" link set eth0 up || _netns_fail "cannot bring eth0 up again in $ns"
}

# Stops what netns_spawn started (by pid: only those), then deletes every
# namespace (their veth pairs and the bridge go with them).
netns_cleanup() {
  local pid name
  for pid in "${NETNS_SPAWNED[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  for pid in "${NETNS_SPAWNED[@]}"; do wait "$pid" 2>/dev/null; done
  for name in "${NETNS_HOSTS[@]}"; do ip netns del "$(netns_name "$name")" 2>/dev/null; done
  [ -n "$NETNS_SWITCH" ] && ip netns del "$NETNS_SWITCH" 2>/dev/null
  NETNS_SPAWNED=()
  NETNS_HOSTS=()
  NETNS_SWITCH=""
}
