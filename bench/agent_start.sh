#!/usr/bin/env bash
# What one rank's start costs on a remote host that is already in the job
# (issue 22): an elastic tandemrun with 1 process on a namespace host with its
# own sshd (tests/lib/sshhosts.sh) grows to 3 there (the discovery script
# offers 2 more slots); timed per new process, from tandemrun's "starting
# process K" line to the process's first line of output
# (tests/net/test_launch_child --print-env), N jobs per mode:
#   agent     the host's tandem-agent forks it (the default)
#   shared    TANDEM_AGENT=0: a session of the host's shared ssh connection,
#             which runs the user's login shell first (TANDEM_SSH_SHARE)
#
#   bench/agent_start.sh [N] [BUILD]  (default 5, build) -> bench/results/agent-start-DATE.md
set -u
cd "$(dirname "$0")/.."
N=${1:-5}
B=${2:-build}
RUN=$(cd "$B/bin" && pwd)/tandemrun
CHILD=$(cd "$B/tests" && pwd)/test_launch_child
[ -x "$CHILD" ] || { echo "agent_start.sh: build $CHILD first" >&2; exit 1; }
. tests/lib/sshhosts.sh
work=$(mktemp -d /tmp/tandem-agentstart-XXXXXX)
NETNS_TAG_PREFIX=as
NETNS_ON_EXIT='rm -rf "$work"'
sshhosts_init "$work/ssh"
sshhosts_add a 10.77.21.1
netns_add_host l 10.77.21.9
cd "$work"
printf '#!/bin/sh\ncat %s\n' "$work/hosts" >"$work/discover"
chmod +x "$work/discover"
# Each line of tandemrun's output and errors, stamped with the time it came.
cat >"$work/stamp.py" <<'EOF'
import sys, time
for line in sys.stdin:
    sys.stdout.write("%.4f %s" % (time.time(), line))
    sys.stdout.flush()
EOF
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
one_job() { # MODE: prints the start latency of each of the 2 grown processes
  echo "10.77.21.1:1" >"$work/hosts"
  rm -f "$work/out" # the last job's lines must not count as this one's
  if [ "$1" = shared ]; then export TANDEM_AGENT=0; else unset TANDEM_AGENT; fi
  TANDEM_DISCOVERY_INTERVAL=0.1 netns_spawn l sh -c "'$RUN' -np 1 --min-np 1 --max-np 3 --max-restarts 5 \
    --host-discovery-script '$work/discover' '$CHILD' --print-env --sleep 60 2>&1 | python3 '$work/stamp.py' >'$work/out'"
  local job=$NETNS_PID _
  for _ in $(seq 1 400); do grep -q '\[0\] rank=' "$work/out" 2>/dev/null && break; sleep 0.05; done
  sleep 0.5
  echo "10.77.21.1:3" >"$work/hosts"
  for _ in $(seq 1 400); do [ "$(grep -c '\] rank=' "$work/out")" = 3 ] && break; sleep 0.05; done
  awk '/tandemrun: starting process [12] / { for (i = 1; i <= NF; i++) if ($i == "process") s[$(i + 1)] = $1 }
       /^[0-9.]+ \[[12]\] rank=/ { k = substr($2, 2, 1); r[k] = $1 }
       END { for (k = 1; k <= 2; k++) if ((k in s) && (k in r)) printf "%.3f\n", r[k] - s[k]; else print "missing" }' "$work/out"
  [ -n "${KEEP:-}" ] && cp "$work/out" "$KEEP.$1.$(date +%s%N)"
  pkill -TERM -P "$job" 2>/dev/null
  kill -TERM "$job" 2>/dev/null
  pkill -TERM -f "^$RUN -np 1 --min-np 1 --max-np 3 .*$work/discover" 2>/dev/null
  wait "$job" 2>/dev/null
  sleep 0.5
}
row() { # MODE
  local i
  for i in $(seq 1 "$N"); do one_job "$1"; done | sort -n | awk -v l="$1" '
    /missing/ { miss++; next } { d[++n] = $1 }
    END { m = n % 2 ? d[(n + 1) / 2] : (d[n / 2] + d[n / 2 + 1]) / 2;
          printf "| %s | %d | %.3f | %.3f | %.3f | %d |\n", l, n, m, d[1], d[n], miss }'
}
rows=$(for mode in ${MODES:-agent shared agent shared}; do row $mode; done)
res=bench/results/agent-start-$(date -u +%Y-%m-%d).md
cd - >/dev/null
{
  echo "# One rank's start on a remote host already in the job, $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  echo "Command: \`bench/agent_start.sh $N $B\`; machine: $(nproc) cores, load before: $load_before, after: $(cut -d' ' -f1-3 /proc/loadavg); commit $(git rev-parse --short HEAD)."
  echo "An elastic tandemrun with 1 process on a namespace host (own sshd) grows to 3 there; per new process, seconds from"
  echo "tandemrun's \"starting process K\" to its first output line. agent: forked by the host's tandem-agent (default);"
  echo "shared: TANDEM_AGENT=0, a session of the host's shared ssh connection (runs the login shell: $HOME/.bashrc has"
  echo "$(grep -c . "$HOME/.bashrc" 2>/dev/null) non-empty lines$(grep -q pyenv "$HOME/.bashrc" 2>/dev/null && echo ", among them \`pyenv init\`")). Two rounds of each, alternating."
  echo
  echo "| start | processes | median | min | max | missing |"
  echo "|---|---|---|---|---|---|"
  echo "$rows"
} >"$res"
cat "$res"
