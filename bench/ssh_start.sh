#!/usr/bin/env bash
# What one ssh start of a remote rank costs, and where it goes (issue 22):
# a namespace host with its own sshd (tests/lib/sshhosts.sh), `ssh HOST
# true` timed from a launcher's namespace host, N times each:
#   full          a connection of its own (tandemrun with TANDEM_SSH_SHARE=0)
#   shared        a session of an open master connection (tandemrun's
#                 default: ssh -o ControlMaster=no -o ControlPath=SOCKET)
#   full, lean rc / shared, lean rc
#                 the same with an empty ~/.bashrc on the host (bind-mounted
#                 in the host's own mount namespace): what the user's shell
#                 start-up costs (sshd runs the command through the login
#                 shell; Debian's bash reads ~/.bashrc for ssh commands)
#
#   bench/ssh_start.sh [N]   (default 10)   -> bench/results/ssh-start-DATE.md
set -u
cd "$(dirname "$0")/.."
N=${1:-10}
. tests/lib/sshhosts.sh
work=$(mktemp -d /tmp/tandem-sshstart-XXXXXX)
NETNS_TAG_PREFIX=ss
NETNS_ON_EXIT='rm -rf "$work"'
sshhosts_init "$work/ssh"
sshhosts_add a 10.77.19.1
netns_add_host l 10.77.19.9
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
times() { # LABEL SSH-ARGS...: N timings, then "LABEL median min max"
  local label=$1 i a b
  shift
  for i in $(seq 1 "$N"); do
    a=$(date +%s.%N)
    netns_run l "$@" 10.77.19.1 true >/dev/null 2>&1 || echo "ssh_start.sh: $label: ssh failed" >&2
    b=$(date +%s.%N)
    awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f\n", b - a }'
  done | sort -n | awk -v l="$label" '{ d[NR] = $1 } END { m = NR % 2 ? d[(NR + 1) / 2] : (d[NR / 2] + d[NR / 2 + 1]) / 2;
    printf "| %s | %d | %.3f | %.3f | %.3f |\n", l, NR, m, d[1], d[NR] }'
}
master() { netns_spawn l $TANDEM_SSH -M -N -o ControlPersist=no -o ControlPath="$work/master" 10.77.19.1; for _ in $(seq 1 100); do [ -S "$work/master" ] && return; sleep 0.05; done; echo "ssh_start.sh: no master" >&2; exit 1; }
shared=(-o ControlMaster=no -o ControlPath="$work/master")
rows=$(
  times "full" $TANDEM_SSH
  master
  times "shared" $TANDEM_SSH "${shared[@]}"
  : >"$work/empty"
  nsenter -t "$(_sshhosts_init_pid a)" -m mount --bind "$work/empty" "$HOME/.bashrc" || echo "ssh_start.sh: cannot bind an empty ~/.bashrc" >&2
  times "full, lean rc" $TANDEM_SSH
  times "shared, lean rc" $TANDEM_SSH "${shared[@]}"
)
res=bench/results/ssh-start-$(date -u +%Y-%m-%d).md
{
  echo "# One ssh start of a remote command, $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  echo "Command: \`bench/ssh_start.sh $N\`; machine: $(nproc) cores, load before: $load_before, after: $(cut -d' ' -f1-3 /proc/loadavg); $(ssh -V 2>&1)."
  echo "\`ssh HOST true\` from one namespace host to another (own sshd, ed25519 keys, UsePAM no), seconds; 'lean rc': $HOME/.bashrc"
  echo "empty on the host ($(grep -c . "$HOME/.bashrc" 2>/dev/null) non-empty lines otherwise$(grep -q pyenv "$HOME/.bashrc" 2>/dev/null && echo ", among them \`pyenv init\`"))."
  echo
  echo "| start | runs | median | min | max |"
  echo "|---|---|---|---|---|"
  echo "$rows"
} >"$res"
cat "$res"
