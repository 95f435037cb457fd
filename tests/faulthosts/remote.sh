#!/usr/bin/env bash
# tandemrun's remote workers over real ssh (namespace hosts with their own
# sshd, tests/lib/sshhosts.sh), the cases a fake ssh cannot show:
#
#   remote.sh B status   a remote rank killed by a signal is reported as
#                        128 + N and named ("exited with code 137: killed by
#                        signal 9 (SIGKILL) on its host"); ssh alone would
#                        say 255, the code of its own failures
#   remote.sh B orphan   no remote worker outlives its launcher: after
#                        tandemrun is killed with -9, and after tandemrun
#                        stops the other ranks of a failed job, no process
#                        of the job is left on the remote host
#   remote.sh B share    one ssh connection per host (ssh connection
#                        sharing): 4 ranks on host a cost sshd one accepted
#                        connection (4 with TANDEM_SSH_SHARE=0); a rank
#                        killed on the shared connection is reported as
#                        before while the others run on; the master goes
#                        with the job (no ssh left, its directory removed)
#                        (TANDEM_AGENT=0: sharing is the path without agents)
#   remote.sh B agent    one tandem-agent per host: an elastic job that grows
#                        from 1 to 3 processes on host a costs sshd one
#                        connection and one session (the agent's), and the
#                        new ranks are the agent's children; the agent
#                        killed with -9 -> its ranks are gone from host a
#                        and reported lost (exit 255, named), no hang;
#                        after tandemrun is killed with -9, neither ranks
#                        nor agent are left on host a
#   remote.sh B unlisted a host taken out of the discovery script and then
#                        down (its sshd killed) gets a few background agent
#                        starts (TANDEM_AGENT_PROBE=1: 2), then none while
#                        it stays out; listed again (sshd up), a process
#                        starts there
#
# Needs root (namespaces, sshd); everything is removed on exit, also after a
# failure.
set -u
B=$1
case_name=$2
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib/sshhosts.sh"
RUN=$(cd "$B/bin" && pwd)/tandemrun
CHILD=$(cd "$B/tests" && pwd)/test_launch_child
[ -x "$CHILD" ] || { echo "FAIL(remote $case_name): $CHILD not built"; exit 1; }
fail() {
  echo "FAIL(remote $case_name): $*"
  [ -f "${tmp:-}/err" ] && { echo "---- tandemrun's stderr:"; tail -20 "$tmp/err"; }
  exit 1
}
tmp=$(mktemp -d "/tmp/td-faulthosts-$$.XXXXXX")
NETNS_TAG_PREFIX=fr
NETNS_ON_EXIT='rm -rf "$tmp"'
sshhosts_init "$tmp/ssh"
sshhosts_add a 10.77.16.1
netns_add_host l 10.77.16.9 # the launcher's host
cd "$tmp" # tandemrun runs the remote command in its own working directory

children_on_a() { # pids of test_launch_child on host a
  local pid
  for pid in $(sshhosts_pids a); do
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = test_launch_chi ] && echo "$pid"
  done
}
agents_on_a() { # pids of tandem-agent on host a
  local pid
  for pid in $(sshhosts_pids a); do
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = tandem-agent ] && echo "$pid"
  done
}
wait_count() { # LISTER N SECONDS: until LISTER prints exactly N pids
  local _
  for _ in $(seq 1 $(( $3 * 20 ))); do
    [ "$($1 | wc -l)" = "$2" ] && return 0
    sleep 0.05
  done
  return 1
}
wait_agents() { wait_count agents_on_a "$@"; }     # N SECONDS: agents on host a
wait_children() { wait_count children_on_a "$@"; } # N SECONDS: children on host a
# SIGTERM to the elastic tandemrun in $launcher: it ends within 15 s and
# leaves no process and no agent on host a
stop_launcher() {
  kill -TERM "$launcher"
  for _ in $(seq 1 300); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.05; done
  kill -0 "$launcher" 2>/dev/null && fail "tandemrun still runs 15 s after SIGTERM"
  wait "$launcher"
  wait_children 0 10 || fail "processes left on host a: $(children_on_a)"
  wait_agents 0 10 || fail "agents left on host a: $(agents_on_a)"
}

case $case_name in
status)
  # Rank 1 kills itself with SIGKILL after 0.5 s; rank 0 sleeps.
  netns_run l "$RUN" -np 2 -H 10.77.16.1:2 "$CHILD" --fail 1:signal:9:0.5 --sleep 20 >"$tmp/out" 2>"$tmp/err"
  rc=$?
  [ $rc = 137 ] || fail "tandemrun exited $rc, expected 137 (128 + SIGKILL)"
  grep -Eq '^tandemrun: rank 1 \(pid [0-9]+, host 10\.77\.16\.1\) exited with code 137: killed by signal 9 \(SIGKILL\) on its host; stopped the other 1 rank$' "$tmp/err" ||
    fail "no line naming SIGKILL on the remote host"
  grep -q "ssh could not reach" "$tmp/err" && fail "a signal death was blamed on ssh"
  # A signal that the program does not die of by default exit code: SIGTERM (15).
  netns_run l "$RUN" -np 1 -H 10.77.16.1:1 "$CHILD" --fail 0:signal:15:0.2 --sleep 20 >"$tmp/out" 2>"$tmp/err"
  rc=$?
  [ $rc = 143 ] || fail "tandemrun exited $rc, expected 143 (128 + SIGTERM)"
  grep -Eq 'exited with code 143: killed by signal 15 \(SIGTERM\) on its host' "$tmp/err" || fail "SIGTERM not named"
  # An ordinary exit code stays what it is.
  netns_run l "$RUN" -np 1 -H 10.77.16.1:1 "$CHILD" --exit 7 >"$tmp/out" 2>"$tmp/err"
  rc=$?
  [ $rc = 7 ] || fail "tandemrun exited $rc, expected the rank's 7"
  grep -Eq 'host 10\.77\.16\.1\) exited with code 7$' "$tmp/err" || fail "exit code 7 not reported plainly"
  wait_children 0 10 || fail "children left on host a: $(children_on_a)"
  echo "PASS(remote status): SIGKILL -> 137, SIGTERM -> 143, named; exit 7 -> 7"
  ;;
orphan)
  # 1. The launcher is killed with -9: its ssh sessions die with it
  # (parent-death signal), sshd closes the remote shells' stdin, and the
  # remote shells stop their programs.
  netns_spawn l "$RUN" -np 2 -H 10.77.16.1:2 "$CHILD" --sleep 60 >"$tmp/out" 2>"$tmp/err"
  launcher=$NETNS_PID
  wait_children 2 20 || fail "the 2 remote ranks did not start on host a"
  # A tandemrun killed with -9 cannot remove its ssh control directory
  # (launcher.md): this one's is removed below.
  control_dir=$(pgrep -P "$launcher" -af "ControlPath=/tmp/tandemrun-ssh-" |
    sed -n 's|.*ControlPath=\(/tmp/tandemrun-ssh-[A-Za-z0-9]*\)/.*|\1|p' | head -1)
  t0=$(date +%s.%N)
  kill -9 "$launcher"
  wait "$launcher" 2>/dev/null
  wait_children 0 10 || fail "remote ranks still run 10 s after tandemrun was killed: $(children_on_a)"
  t1=$(date +%s.%N)
  wait_agents 0 10 || fail "a tandem-agent still runs on host a 10 s after tandemrun was killed: $(agents_on_a)"
  [ -n "$control_dir" ] && rm -rf "$control_dir"
  # 2. A rank fails: tandemrun stops the other (SIGTERM to its ssh) and
  # that rank must stop on the remote host too, not sleep on.
  netns_run l "$RUN" -np 2 --grace 0.5 -H 10.77.16.1:2 "$CHILD" --fail 0:exit:3:0.5 --sleep 60 >"$tmp/out" 2>"$tmp/err"
  rc=$?
  [ $rc = 3 ] || fail "tandemrun exited $rc, expected rank 0's 3"
  wait_children 0 10 || fail "rank 1 still runs on host a 10 s after tandemrun stopped it: $(children_on_a)"
  wait_agents 0 10 || fail "a tandem-agent still runs on host a after its job ended: $(agents_on_a)"
  echo "PASS(remote orphan): remote ranks gone $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }') s after kill -9 of tandemrun, and after tandemrun stopped them"
  ;;
share)
  export TANDEM_AGENT=0 # with agents, a host's ranks need no ssh sessions at all (case agent)
  accepted() { grep -c "Accepted publickey" "$SSHHOSTS_DIR/sshd_a.log"; }
  masters() { pgrep -f "ssh .*-M -N -o ControlPersist=no -o ControlPath=$1" | wc -l; }
  # 1. Shared: 4 ranks, one connection. Rank 3 exits 5 after 1 s: the job
  # ends with its code, the others stopped through their sessions.
  n0=$(accepted)
  netns_run l "$RUN" -np 4 --grace 0.5 -H 10.77.16.1:4 "$CHILD" --fail 3:exit:5:1 --sleep 60 >"$tmp/out" 2>"$tmp/err"
  rc=$?
  [ $rc = 5 ] || fail "tandemrun exited $rc, expected rank 3's 5"
  grep -Eq 'rank 3 \(pid [0-9]+, host 10\.77\.16\.1\) exited with code 5; stopped the other 3 ranks$' "$tmp/err" ||
    fail "no line naming rank 3's exit 5"
  shared=$(( $(accepted) - n0 ))
  [ "$shared" = 1 ] || fail "4 ranks on one host took $shared ssh connections, expected 1 (shared)"
  wait_children 0 10 || fail "ranks left on host a after the job: $(children_on_a)"
  # 2. Off: one connection per rank, as before.
  n0=$(accepted)
  TANDEM_SSH_SHARE=0 netns_run l "$RUN" -np 4 -H 10.77.16.1:4 "$CHILD" --exit 0 >"$tmp/out" 2>"$tmp/err"
  rc=$?
  [ $rc = 0 ] || fail "TANDEM_SSH_SHARE=0: tandemrun exited $rc"
  own=$(( $(accepted) - n0 ))
  [ "$own" = 4 ] || fail "TANDEM_SSH_SHARE=0: 4 ranks took $own ssh connections, expected 4"
  # 3. The master is killed under a running job (its connection lost): the
  # ranks' sessions end with ssh's 255 and the job names the lost rank.
  netns_spawn l "$RUN" -np 2 -H 10.77.16.1:2 "$CHILD" --sleep 60 >"$tmp/out" 2>"$tmp/err"
  launcher=$NETNS_PID
  wait_children 2 20 || fail "the 2 shared ranks did not start on host a"
  # This job's master only: other jobs on the machine may hold masters too.
  master=$(pgrep -P "$launcher" -f "ssh .*-M -N -o ControlPersist=no -o ControlPath=/tmp/tandemrun-ssh-" | head -1)
  control_dir=$(tr '\0' ' ' <"/proc/$master/cmdline" 2>/dev/null | sed -n 's|.*ControlPath=\(/tmp/tandemrun-ssh-[A-Za-z0-9]*\)/.*|\1|p')
  [ -n "$master" ] || fail "no ssh master connection runs while 2 ranks run on host a"
  kill -9 "$master"
  for _ in $(seq 1 200); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.05; done
  kill -0 "$launcher" 2>/dev/null && fail "tandemrun still runs 10 s after its ssh master connection was killed"
  wait "$launcher"
  rc=$?
  [ $rc = 255 ] || fail "tandemrun exited $rc after its master connection was lost, expected ssh's 255"
  grep -q "ssh could not reach the host or lost the connection to it" "$tmp/err" || fail "the lost connection is not named"
  wait_children 0 10 || fail "ranks left on host a after the connection was lost: $(children_on_a)"
  [ -n "$control_dir" ] && [ "$(masters "$control_dir")" = 0 ] || fail "ssh master connections left after the job ($control_dir)"
  [ ! -e "$control_dir" ] || fail "tandemrun left its ssh control directory $control_dir"
  echo "PASS(remote share): 4 ranks on one host: $shared ssh connection shared, $own without sharing; a lost master ends the job with 255, nothing left"
  ;;
agent)
  accepted() { grep -c "Accepted publickey" "$SSHHOSTS_DIR/sshd_a.log"; }
  sessions() { # sshd's session processes for host a's connections ("sshd: root@notty")
    local pid n=0
    for pid in $(sshhosts_pids a); do
      tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q '^sshd.*@notty' && n=$((n + 1))
    done
    echo $n
  }
  # 1. An elastic job on host a grows from 1 process to 3 (the discovery
  # script offers more slots): the two new ones are forked by the agent,
  # over no new ssh connection or session.
  echo "10.77.16.1:1" >"$tmp/hosts"
  printf '#!/bin/sh\ncat %s\n' "$tmp/hosts" >"$tmp/discover"
  chmod +x "$tmp/discover"
  n0=$(accepted)
  TANDEM_DISCOVERY_INTERVAL=0.2 netns_spawn l "$RUN" -np 1 --min-np 1 --max-np 3 --max-restarts 5 \
    --host-discovery-script "$tmp/discover" "$CHILD" --sleep 60 >"$tmp/out" 2>"$tmp/err"
  launcher=$NETNS_PID
  wait_children 1 20 || fail "the first process did not start on host a"
  wait_agents 1 5 || fail "no tandem-agent runs on host a with the first process: $(agents_on_a)"
  agent=$(agents_on_a)
  before_grow=$(( $(accepted) - n0 ))
  sessions_before=$(sessions)
  echo "10.77.16.1:3" >"$tmp/hosts"
  wait_children 3 20 || fail "the job did not grow to 3 processes on host a: $(children_on_a)"
  after_grow=$(( $(accepted) - n0 ))
  sessions_after=$(sessions)
  [ "$before_grow" = 1 ] || fail "the first process on host a took $before_grow ssh connections, expected 1 (its agent's)"
  [ "$after_grow" = 1 ] || fail "growing by 2 processes took $(( after_grow - 1 )) new ssh connections, expected none"
  [ "$sessions_after" = "$sessions_before" ] || fail "growing opened ssh sessions: $sessions_before before, $sessions_after after"
  for c in $(children_on_a); do
    [ "$(awk '{ print $4 }' "/proc/$c/stat")" = "$agent" ] || fail "process $c on host a is not the agent's child"
  done
  # 2. Host a is taken out of the discovery script (one slot here instead)
  # and its agent killed: its processes go with it (parent-death signal),
  # tandemrun names the lost agent and reports each process lost; one
  # replacement starts here. tandemrun then starts a new agent on host a in
  # the background, although no process is placed there; when the host is
  # listed again, its 2 processes are that agent's children, over no new ssh
  # connection (TANDEM_AGENT_PROBE).
  printf '127.0.0.1:1\n' >"$tmp/hosts"
  for _ in $(seq 1 200); do grep -q "discovered hosts now: 127.0.0.1:1$" "$tmp/err" && break; sleep 0.05; done
  grep -q "discovered hosts now: 127.0.0.1:1$" "$tmp/err" || fail "tandemrun did not read the discovery script's new hosts"
  t0=$(date +%s.%N)
  kill -9 "$agent"
  lost3() { [ "$(grep -Ec '^tandemrun: process [0-2] \(pid [0-9]+, host 10\.77\.16\.1\) exited with code 255' "$tmp/err")" = 3 ]; }
  for _ in $(seq 1 200); do lost3 && break; sleep 0.05; done
  t1=$(date +%s.%N)
  grep -Eq "^tandemrun: the agent on host 10\.77\.16\.1 ended \(.*\): 3 ranks there are lost$" "$tmp/err" ||
    fail "tandemrun did not name the lost agent"
  lost3 || fail "the agent's 3 processes were not each reported lost with code 255 within 10 s"
  wait_children 0 10 || fail "processes left on host a after its agent was killed: $(children_on_a)"
  wait_agents 1 20 || fail "no new agent started on host a in the background within 20 s of the old one's end"
  probe=$(agents_on_a)
  [ "$probe" != "$agent" ] || fail "the killed agent $agent still runs"
  n1=$(accepted)
  printf '127.0.0.1:1\n10.77.16.1:2\n' >"$tmp/hosts"
  wait_children 2 20 || fail "the job did not grow onto host a again: $(children_on_a)"
  [ "$(accepted)" = "$n1" ] || fail "growing onto host a again took $(( $(accepted) - n1 )) ssh connections, expected none (its agent was up)"
  for c in $(children_on_a); do
    [ "$(awk '{ print $4 }' "/proc/$c/stat")" = "$probe" ] || fail "process $c on host a is not the new agent's child"
  done
  grep -Eq "^tandemrun: no agent started|cannot" "$tmp/err" && fail "tandemrun reported a failed background start: $(grep -E "^tandemrun: no agent started|cannot" "$tmp/err" | head -1)"
  stop_launcher
  # 3. Not elastic: the agent killed under 2 ranks ends the job with ssh's
  # 255, naming the agent, and nothing is left.
  netns_spawn l "$RUN" -np 2 -H 10.77.16.1:2 "$CHILD" --sleep 60 >"$tmp/out" 2>"$tmp/err"
  launcher=$NETNS_PID
  wait_children 2 20 || fail "the 2 ranks did not start on host a"
  kill -9 "$(agents_on_a)"
  for _ in $(seq 1 200); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.05; done
  kill -0 "$launcher" 2>/dev/null && fail "tandemrun still runs 10 s after its agent was killed"
  wait "$launcher"
  rc=$?
  [ $rc = 255 ] || fail "tandemrun exited $rc after its agent was killed, expected 255"
  grep -Eq "^tandemrun: the agent on host 10\.77\.16\.1 ended \(.*\): 2 ranks there are lost$" "$tmp/err" ||
    fail "the lost agent is not named"
  wait_children 0 10 || fail "ranks left on host a after their agent was killed: $(children_on_a)"
  wait_agents 0 10 || fail "agents left on host a: $(agents_on_a)"
  echo "PASS(remote agent): grow 1 -> 3 on host a over $after_grow ssh connection and no new session; agent killed -> 3 processes reported lost in $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }') s, a new agent started in the background and the regrow used it; not elastic: exit 255; nothing left"
  ;;
unlisted)
  # One process here, one on host a (room for 3); TANDEM_AGENT_PROBE=1 so that the
  # background starts reach their longest interval (1 s) within 2 tries.
  printf '127.0.0.1:1\n10.77.16.1:1\n' >"$tmp/hosts"
  printf '#!/bin/sh\ncat %s\n' "$tmp/hosts" >"$tmp/discover"
  chmod +x "$tmp/discover"
  TANDEM_LOG=info TANDEM_AGENT_PROBE=1 TANDEM_DISCOVERY_INTERVAL=0.2 netns_spawn l "$RUN" -np 2 --min-np 1 \
    --max-np 3 --max-restarts 5 --host-discovery-script "$tmp/discover" "$CHILD" --sleep 60 >"$tmp/out" 2>"$tmp/err"
  launcher=$NETNS_PID
  wait_children 1 20 || fail "the process did not start on host a"
  wait_agents 1 5 || fail "no tandem-agent runs on host a: $(agents_on_a)"
  # Host a leaves the discovery script, then goes down for good (every
  # process on it killed, its sshd too: an ssh start fails at once).
  printf '127.0.0.1:2\n' >"$tmp/hosts"
  for _ in $(seq 1 200); do grep -q "discovered hosts now: 127.0.0.1:2$" "$tmp/err" && break; sleep 0.05; done
  grep -q "discovered hosts now: 127.0.0.1:2$" "$tmp/err" || fail "tandemrun did not read the discovery script's new hosts"
  sshhosts_kill a
  starts() { grep -c "starting the agent on host 10\.77\.16\.1 again in the background" "$tmp/err"; }
  # Without the limit: a start every second, never given up. With it: 2
  # (at 0.25 and 0.75 s), then tandemrun says it gives the host up (waited
  # for, up to 8 s: a fixed 8 s sleep here cost the suite 8 s per tree),
  # and no start follows in the 3 s after that.
  gaveup=0
  for _ in $(seq 1 160); do
    grep -q "no more background agent starts on host 10\.77\.16\.1" "$tmp/err" && { gaveup=1; break; }
    sleep 0.05
  done
  n8=$(starts)
  [ "$n8" -ge 1 ] || fail "no background agent start on host a after its agent ended (the quick tries must stay)"
  [ "$n8" -le 3 ] || fail "host a, out of the discovery script and down, got $n8 background agent starts before it was given up, expected at most 3"
  [ $gaveup = 1 ] || fail "tandemrun did not say within 8 s that it gave up host a ($n8 background agent starts)"
  sleep 3
  [ "$(starts)" = "$n8" ] || fail "background agent starts on host a went on after they were given up: $n8 -> $(starts)"
  # Host a up again and listed: the job grows onto it (through an agent).
  sshhosts_start a
  printf '127.0.0.1:2\n10.77.16.1:1\n' >"$tmp/hosts"
  wait_children 1 30 || fail "no process started on host a after it was listed again: $(children_on_a)"
  stop_launcher
  echo "PASS(remote unlisted): host a out of the discovery script and down: $n8 background agent starts, then none for 3 s more; listed again: a process started there"
  ;;
*) fail "unknown case (status, orphan, share, agent, unlisted)" ;;
esac
