#!/usr/bin/env bash
# Fault injection across namespace hosts (issue 10): an elastic 4-rank
# train-gpt job on 2 hosts, each a network + UTS + IPC + PID namespace with
# its own sshd (tests/lib/sshhosts.sh), started by tandemrun over ssh from a
# third namespace host that holds the store.
#
#   bench/faults_hosts.sh [FAULTS] [BUILD]   (default 16 faults, build/)
#   ZERO=S ...                the job at ZeRO stage S (1-3)
#   NONELASTIC=1 ...          the same kinds of fault against the non-elastic
#                             job (tandemrun -np 4), one fresh job per kind:
#                             how each ends (exit code, seconds, message)
#   EVERY=N ...               a fault every N steps at the earliest (300: more
#                             than a recovery takes, or the job ends first)
#   STEPS=N ...               the job's steps ((FAULTS + 2) * EVERY)
#   HB=S SETTLE=S ...         TANDEM_HEARTBEAT_TIMEOUT (2) and
#                             TANDEM_ELASTIC_SETTLE (3)
#   MINHB=S ...               TANDEM_HEARTBEAT_MIN_TIMEOUT (0.5: adaptive
#                             timeouts between 0.5 s and HB; "" for HB fixed)
#   SUFFIX=TEXT ...           appended to the results' file names
#   REF_PARALLEL=1 ...        the fault-free reference run at the same time
#                             on two more namespace hosts (c, d) instead of
#                             after the faults: half the wall time, and the
#                             faults measured beside that load
#   KINDS="kill stop ..."     the kinds, in this order, round robin (below;
#                             each grow must follow a hostkill)
#   RESULTS=DIR ...           where the .md and .tsv go (bench/results)
#
# Hosts a (10.77.15.1) and b (10.77.15.2) have 2 slots each, offered by a
# --host-discovery-script; tandemrun --min-np 2 --max-np 4 replaces every
# lost process. FAULTS faults, round robin over these kinds:
#   kill      kill -9 of a process that is not rank 0
#   kill0     kill -9 of rank 0's process
#   stop      SIGSTOP of a process that is not rank 0 (found by heartbeats;
#             killed once the others went on without it)
#   cut       a host's link down (both of its ranks, rank 0 in turn) until
#             the others went on without it, then up again: the cut ranks
#             find themselves stale and exit, and replacements start there
#   loss10    10% / 50% of a host's packets dropped both ways for LOSS_S
#   loss50    seconds (iptables statistic match: this kernel has no netem)
#   hostkill  a whole host at once: taken out of the discovery script, then
#             every process on it killed (kill -9 of its PID namespace's
#             init); the job goes on at 2 ranks; hosts a and b in turn, so
#             rank 0's host too (cut, loss10, loss50 and hostkill each
#             alternate b, a, b, ... by their own count). The host's sshd is started again, empty.
#   grow      that host back into the discovery script: 2 processes start
#             there and the job scales up to 4 again
# A fault is injected at step EVERY*k at the earliest, once the job is at 4
# ranks, so that the step count of the job does not depend on the machine's
# speed. Recorded per fault: kind, seconds from the fault to the next
# completed step (the first step of the new epoch; for loss10/loss50 that
# did not end an epoch, the first step after the fault; for grow, the first
# step at 4 ranks), for loss10/loss50 the longest gap between completed
# steps from the fault to 1 s after the loss ended, steps lost (steps
# completed before the fault that had to be computed again) and hangs (no new epoch, or no step, within HANG_S
# seconds). A fault-free run of the same job on the same hosts gives the
# reference final loss and parameter hash. Results:
# bench/results/faults-hosts-DATE[-zeroS|-nonelastic].md, per-fault rows in
# the .tsv beside it. Everything (namespaces, sshd, iptables rules,
# processes) is removed on exit, also after a failure or Ctrl-C.
set -u
cd "$(dirname "$0")/.."
repo=$(pwd)
FAULTS=${1:-16}
B=${2:-build}
ZERO=${ZERO:-0}
EVERY=${EVERY:-300}
HB=${HB:-2}
SETTLE=${SETTLE:-3}
MINHB=${MINHB-0.5}
SUFFIX=${SUFFIX:-}
# The commit measured, read now (the tree may move on during a long run).
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD 2>/dev/null || echo " with uncommitted changes")}
KINDS=${KINDS:-kill kill0 stop cut loss10 loss50 hostkill grow}
RESULTS=${RESULTS:-bench/results}
LOSS_S=${LOSS_S:-4}
HANG_S=${HANG_S:-60}
RUN=$(cd "$B/bin" && pwd)/tandemrun
GPT=$(cd "$B/bin" && pwd)/train-gpt
. tests/lib/sshhosts.sh

work=$(mktemp -d /tmp/tandem-faulthosts-XXXXXX)
job=
refjob=
NETNS_TAG_PREFIX=fh
NETNS_ON_EXIT='[ -n "$job" ] && kill -9 -- "-$job" 2>/dev/null; [ -n "$refjob" ] && kill -9 -- "-$refjob" 2>/dev/null; [ -n "${KEEP:-}" ] && echo "kept $work" || rm -rf "$work"'
sshhosts_init "$work/ssh"
A=10.77.15.1
Bh=10.77.15.2
sshhosts_add a $A
sshhosts_add b $Bh
netns_add_host l 10.77.15.9 # the launcher's host: it holds the store
C=10.77.15.3
D=10.77.15.4
if [ -n "${REF_PARALLEL:-}" ]; then
  sshhosts_add c $C
  sshhosts_add d $D
fi
addr_of() { [ "$1" = a ] && echo $A || echo $Bh; }

export TANDEM_PROGRESS=plain TANDEM_HEARTBEAT_TIMEOUT=$HB TANDEM_HEARTBEAT_INTERVAL=0.25
export TANDEM_ELASTIC_SETTLE=$SETTLE TANDEM_DISCOVERY_INTERVAL=0.1
[ -n "$MINHB" ] && export TANDEM_HEARTBEAT_MIN_TIMEOUT=$MINHB
# Stage >= 1: the rebuild's log lines ("rebuilt from memory" or the disk).
[ "$ZERO" != 0 ] && export TANDEM_LOG=info
ARGS="--layers 2 --channels 64 --heads 2 --seq 64 --threads 1 --sample 0 --micro-batch 3 --zero-stage $ZERO"
out="$work/out"
cat >"$work/stamp.py" <<'PY'
import sys, time
for line in sys.stdin:
    sys.stdout.write("%.3f %s" % (time.time(), line))
    sys.stdout.flush()
PY
# The job in the launcher's namespace, its own process group (killed on
# exit), every output line time-stamped; tandemrun's exit code in OUTFILE.rc.
start_job() { # OUTFILE TANDEMRUN-ARGS...
  local file=$1
  shift
  rm -f "$file.rc"
  : >"$file" # now: a previous job's output must not be read as this one's
  netns_spawn l setsid bash -c '"$@" 2>&1 | /usr/bin/python3 -u "'"$work/stamp.py"'" >"'"$file"'"; echo "${PIPESTATUS[0]}" >"'"$file.rc"'"' _ "$@"
  job=$NETNS_PID
}
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
# These run several times a second while the job trains: one pgrep per host
# and shell builtins otherwise (on a loaded 2-core machine a loop of small
# processes per call took seconds, and spaced the faults far apart).
gpt_pids() { # HOST: the train-gpt processes on it (in its PID namespace)
  local init
  init=$(_sshhosts_init_pid "$1")
  [ -n "$init" ] && pgrep -x train-gpt --ns "$init" --nslist pid
}
uid_of() {
  local v
  while IFS= read -r -d '' v; do
    [[ $v == TANDEM_ELASTIC_ID=* ]] && echo "${v#*=}" && return
  done 2>/dev/null <"/proc/$1/environ"
}
live() { # "UID PID HOST" of every train-gpt on hosts a and b, oldest first
  local h pid uid
  for h in a b; do
    for pid in $(gpt_pids $h); do
      uid=$(uid_of "$pid")
      [ -n "$uid" ] && echo "$uid $pid $h" # (gone meanwhile otherwise)
    done
  done | sort -n
}
mkdir -p "$RESULTS"
date_tag=$(date -u +%Y-%m-%d)
load_before=$(cut -d' ' -f1-3 /proc/loadavg)

if [ -n "${NONELASTIC:-}" ]; then
  # ---- the non-elastic job: one fresh job per kind, how it ends ----
  res="$RESULTS/faults-hosts-$date_tag-nonelastic.md"
  : >"$work/rows"
  for kind in kill kill0 stop cut loss10 loss50 hostkill; do
    start_job "$out" "$RUN" -np 4 -H $A:2,$Bh:2 "$GPT" $ARGS --steps 1000000
    for _ in $(seq 1 2400); do grep -q "step 25 loss\|step 25/" "$out" 2>/dev/null && break; sleep 0.05; done
    mapfile -t procs < <(for h in a b; do for pid in $(gpt_pids $h); do
      echo "$(tr '\0' '\n' 2>/dev/null <"/proc/$pid/environ" | sed -n 's/^TANDEM_RANK=//p') $pid $h"; done; done | sort -n)
    if [ ${#procs[@]} != 4 ] || ! grep -q "step 25 loss\|step 25/" "$out"; then
      echo "| $kind | (the job did not reach step 25 with 4 ranks within 120 s: not measured) | | | \`$(tail -1 "$out" | cut -c1-200)\` |" | tee -a "$work/rows"
      kill -9 -- "-$job" 2>/dev/null
      wait "$job" 2>/dev/null
      job=
      continue
    fi
    read -r _ pid0 h0 <<<"${procs[0]}"
    read -r _ pid2 h2 <<<"${procs[2]}"
    t0=$(now)
    case $kind in
    kill) kill -9 "$pid2" ;;
    kill0) kill -9 "$pid0" ;;
    stop) kill -STOP "$pid2" ;;
    cut) netns_cut b down ;;
    loss10) sshhosts_loss b 0.1 ;;
    loss50) sshhosts_loss b 0.5 ;;
    hostkill) sshhosts_kill b ;;
    esac
    ended=no
    for i in $(seq 1 $((HANG_S * 20))); do
      kill -0 "$job" 2>/dev/null || { ended=yes; break; }
      # Loss for LOSS_S seconds and a cut for 10 s, as in the elastic run.
      [ $i = $((LOSS_S * 20)) ] && case $kind in loss*) sshhosts_loss b 0 ;; esac
      [ $i = 200 ] && [ $kind = cut ] && netns_restore b
      sleep 0.05
    done
    t1=$(now)
    rc=-
    if [ $ended = yes ]; then wait "$job"; rc=$(cat "$out.rc" 2>/dev/null); fi
    [ $ended = yes ] || { kill -9 -- "-$job" 2>/dev/null; wait "$job" 2>/dev/null; }
    job=
    [ $kind = stop ] && kill -9 "$pid2" 2>/dev/null
    [ $kind = cut ] && netns_restore b 2>/dev/null
    case $kind in loss*) sshhosts_loss b 0 ;; esac
    [ $kind = hostkill ] && sshhosts_start b
    why=$(grep -E "error|tandemrun:" "$out" | grep -v " step " | head -1 | cut -d' ' -f2- | cut -c1-230 | tr '|' '/')
    last=$(grep "tandemrun:" "$out" | tail -1 | cut -d' ' -f2- | cut -c1-230 | tr '|' '/')
    if [ $ended = yes ]; then how="ends, exit $rc"; else how="still running after $HANG_S s (killed)"; fi
    echo "| $kind | $how | $(secs "$t0" "$t1") | \`${why:-none}\` | \`${last:-none}\` |" | tee -a "$work/rows"
  done
  {
    echo "# Faults across namespace hosts against the NON-elastic job, $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "Command: \`NONELASTIC=1 bench/faults_hosts.sh $FAULTS $B\`; machine: $(nproc) cores, load before: $load_before, after: $(cut -d' ' -f1-3 /proc/loadavg)."
    echo "Job: tandemrun -np 4 -H $A:2,$Bh:2 train-gpt $ARGS over ssh into namespace hosts a and b (heartbeat timeout $HB s);"
    echo "a fresh job per fault, the fault after step 25 on host b (kill: rank 2; kill0: rank 0 on host a; stop: rank 2;"
    echo "cut: b's link down for 10 s; loss: for $LOSS_S s; hostkill: every process of b). The job's exit code is tandemrun's"
    echo "last line's; 'first error line' is the first line naming an error."
    echo
    echo "| fault | how the job ends | seconds from fault to the end | first error line | tandemrun's last line |"
    echo "|---|---|---|---|---|"
    cat "$work/rows"
    echo "| grow | does not apply (fixed size: a new host is not used) | | | |"
  } >"$res"
  cat "$res"
  exit 0
fi

# ---- the elastic job ----
STEPS=${STEPS:-$(( (FAULTS + 2) * EVERY ))}
printf '%s:2\n%s:2\n' $A $Bh >"$work/hosts"
printf '#!/bin/sh\ncat %s\n' "$work/hosts" >"$work/discover"
chmod +x "$work/discover"
set_hosts() { # the hosts in the discovery script: "a b", "a", "b"
  local h
  : >"$work/hosts.new"
  for h in $1; do echo "$(addr_of $h):2" >>"$work/hosts.new"; done
  mv "$work/hosts.new" "$work/hosts"
}

ended=0
wait_for() { # wait_for PATTERN SECONDS [AFTER_LINE]: 0 found, 1 not in time (a hang), 2 the job ended
  local n=$(( $2 * 20 )) from=${3:-0}
  for _ in $(seq 1 "$n"); do
    tail -n +$((from + 1)) "$out" 2>/dev/null | grep -q -- "$1" && return 0
    kill -0 "$job" 2>/dev/null || { tail -n +$((from + 1)) "$out" 2>/dev/null | grep -q -- "$1" && return 0; ended=1; return 2; }
    sleep 0.05
  done
  echo "faults_hosts.sh: '$1' did not appear within $2 s (a hang?)" >&2
  return 1
}
last_step() { tail -n 400 "$out" | sed -n 's/.*train-gpt: step \([0-9]*\) loss.*/\1/p' | tail -1; }
# The newest epoch rank 0 announced (a number, not a count of lines: an
# epoch whose communicator failed, e.g. a member reported lost as it
# formed, is skipped without a line).
epochs() { grep -o "elastic epoch [0-9]*:" "$out" | tail -1 | tr -dc 0-9; }
steady() { # at 4 ranks: 4 processes, the last step line at world 4
  [ "$(tail -n 400 "$out" | grep "train-gpt: step " | tail -1 | grep -c "world 4 epoch")" = 1 ] && [ "$(live | wc -l)" = 4 ]
}

echo "elastic job: $FAULTS faults, $STEPS steps, a fault every $EVERY steps at the earliest"
start_job "$out" "$RUN" --min-np 2 --max-np 4 -np 4 --max-restarts $((FAULTS * 4 + 8)) \
  --host-discovery-script "$work/discover" "$GPT" $ARGS --steps $STEPS
if [ -n "${REF_PARALLEL:-}" ]; then
  faulty_job=$job
  start_job "$work/ref" "$RUN" --min-np 2 --max-np 4 -np 4 -H $C:2,$D:2 "$GPT" $ARGS --steps $STEPS
  refjob=$job
  job=$faulty_job
fi
hangs=0
: >"$work/records"
wait_for "train-gpt: step 20 loss" 120 || hangs=$((hangs + 1))
read -r -a kinds <<<"$KINDS"
down_host=
declare -A host_turn=() # kind -> faults of that kind so far (the host alternates)
t_start=$(now)
for ((f = 0; f < FAULTS && hangs == 0 && ended == 0; f++)); do
  kind=${kinds[$((f % ${#kinds[@]}))]}
  # At 4 ranks, at step EVERY*(f+1) at the earliest.
  for _ in $(seq 1 $((HANG_S * 20))); do
    [ "${kind}" = grow ] && break
    s=$(last_step)
    steady && [ "${s:-0}" -ge $((EVERY * (f + 1))) ] && break
    kill -0 "$job" 2>/dev/null || { ended=1; break; }
    sleep 0.05
  done
  [ $ended = 1 ] && break
  steady || [ "$kind" = grow ] || { echo "faults_hosts.sh: not back at 4 ranks within $HANG_S s (a hang?)" >&2; hangs=$((hangs + 1)); break; }
  mapfile -t procs < <(live)
  n_lines=$(wc -l <"$out")
  e0=$(epochs)
  before=$(last_step)
  victim=- vhost=- pid=
  case $kind in
  kill | stop)
    read -r victim pid vhost <<<"${procs[$((1 + RANDOM % 3))]}" ;;
  kill0) read -r victim pid vhost <<<"${procs[0]}" ;;
  cut | loss10 | loss50 | hostkill)
    # Each kind alternates between the hosts by its own count (one shared
    # alternation gave every kind the same host whenever the kinds that
    # use it were even in number: hostkill and grow always on a).
    n=${host_turn[$kind]:-0}
    vhost=$([ $((n % 2)) = 0 ] && echo b || echo a)
    host_turn[$kind]=$((n + 1)) ;;
  grow)
    [ -n "$down_host" ] || { echo "faults_hosts.sh: KINDS: a grow must follow a hostkill (no host is down)" >&2; exit 2; }
    vhost=$down_host ;;
  *) echo "faults_hosts.sh: KINDS: unknown kind '$kind' (kill kill0 stop cut loss10 loss50 hostkill grow)" >&2; exit 2 ;;
  esac
  if [ $kind = hostkill ]; then
    # The cluster takes the host out first (as a scheduler would notice a
    # dead node), so that tandemrun does not try to start its replacements there.
    set_hosts "$([ $vhost = a ] && echo b || echo a)"
    wait_for "discovered hosts now: $(addr_of "$([ $vhost = a ] && echo b || echo a)"):2\$" 30 "$n_lines" ||
      { [ $? = 1 ] && hangs=$((hangs + 1)); break; }
  fi
  t_fault=$(now)
  case $kind in
  kill | kill0) kill -9 "$pid" ;;
  stop) kill -STOP "$pid" ;;
  cut) netns_cut "$vhost" down ;;
  loss10) sshhosts_loss "$vhost" 0.1 ;;
  loss50) sshhosts_loss "$vhost" 0.5 ;;
  hostkill) sshhosts_kill "$vhost"; down_host=$vhost ;;
  grow) set_hosts "a b"; down_host= ;;
  esac
  new_epoch=1
  case $kind in
  loss10 | loss50)
    # An epoch ends only if the loss made heartbeats or the store time out:
    # wait until the job is at 4 ranks again with a step after the loss.
    sleep "$LOSS_S"
    sshhosts_loss "$vhost" 0
    t_clear=$(now)
    ok=0
    for _ in $(seq 1 $((HANG_S * 20))); do
      steady && [ -n "$(awk -v t="$t_clear" '/train-gpt: step [0-9]* loss/ && $1 >= t { print; exit }' "$out")" ] && { ok=1; break; }
      kill -0 "$job" 2>/dev/null || { ended=1; break; }
      sleep 0.05
    done
    [ $ok = 1 ] || { [ $ended = 1 ] || hangs=$((hangs + 1)); break; }
    [ "$(epochs)" -gt "$e0" ] || new_epoch=0 ;;
  cut)
    wait_for "elastic epoch [0-9]*:" "$HANG_S" "$n_lines" || { [ $? = 1 ] && hangs=$((hangs + 1)); netns_restore "$vhost"; break; }
    netns_restore "$vhost" ;;
  *)
    wait_for "elastic epoch [0-9]*:" "$HANG_S" "$n_lines" || { [ $? = 1 ] && hangs=$((hangs + 1)); break; }
    [ $kind = stop ] && kill -9 "$pid"
    [ $kind = hostkill ] && sshhosts_start "$vhost" ;;
  esac
  # The next completed step and the steps lost.
  if [ $new_epoch = 1 ]; then
    # The next step is searched after the new epoch's line: a step line
    # of the lost rank 0, printed before it died, may reach the output
    # after the fault (that step is redone by the new epoch).
    ep_n=$(( n_lines + $(tail -n +$((n_lines + 1)) "$out" | grep -n "elastic epoch [0-9]*:" | head -1 | cut -d: -f1) ))
    line=$(sed -n "${ep_n}p" "$out")
    from=$(echo "$line" | sed -n 's/.* from step \([0-9]*\).*/\1/p')
    want=$([ $kind = grow ] && echo "world 4" || echo "loss")
    wait_for "train-gpt: step $((from + 1)) loss" "$HANG_S" "$ep_n" || { [ $? = 1 ] && hangs=$((hangs + 1)); break; }
    t_next=$(tail -n +$((ep_n + 1)) "$out" | awk -v s=$((from + 1)) -v w="$want" '$0 ~ "train-gpt: step " s " loss" && index($0, w) { print $1; exit }')
    [ -z "$t_next" ] && t_next=$(tail -n +$((ep_n + 1)) "$out" | awk -v s=$((from + 1)) '$0 ~ "train-gpt: step " s " loss" { print $1; exit }')
    lost=$(( before > from ? before - from : 0 ))
  else
    from=$before
    t_next=$(tail -n +$((n_lines + 1)) "$out" | awk -v t="$t_fault" '/train-gpt: step [0-9]* loss/ && $1 >= t { print $1; exit }')
    lost=0
  fi
  if [ -z "$t_next" ]; then
    echo "faults_hosts.sh: no step completed after fault $((f + 1)) ($kind)" >&2
    hangs=$((hangs + 1))
    break
  fi
  stall=- after_clear=-
  case $kind in
  loss*)
    # From the loss's end to the first step after it (the target proposed
    # for lossy links: steps again within 2 s of the link being good).
    after_clear=$(awk -v t="$t_clear" '/train-gpt: step [0-9]* loss/ && $1 >= t { printf "%.2f", $1 - t; exit }' "$out")
    sleep 1
    stall=$(awk -v a="$t_fault" -v b="$(now)" '/train-gpt: step [0-9]* loss/ && $1 >= a && $1 <= b { if ($1 - p > g) g = $1 - p; p = $1 }
      BEGIN { p = a } END { if (b - p > g) g = b - p; printf "%.2f", g }' "$out") ;;
  esac
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$kind" "$victim" "$vhost" "$t_fault" "$t_next" "$lost" "$new_epoch" "$before" "$stall" "${after_clear:--}" >>"$work/records"
  echo "fault $((f + 1))/$FAULTS: $kind ($([ "$victim" != - ] && echo "process $victim on ")host $vhost) at step $before: next step after $(secs "$t_fault" "$t_next") s, steps lost $lost$([ $new_epoch = 0 ] && echo ", no new epoch")$([ "$stall" != - ] && echo ", longest gap between steps $stall s, next step $after_clear s after the loss ended")"
done
t_end=$(now)
# The hosts back and the job at 4 ranks before it ends, whatever stopped the loop.
[ -n "$down_host" ] && set_hosts "a b"
wait "$job"
job=
rc=$(cat "$out.rc" 2>/dev/null)
got=$(sed -n 's/.*final_loss_exact=\([^ ]*\) params_hash=\([^ ]*\).*/\1 \2/p' "$out")
cp "$out" "$work/faulty.out"

if [ -n "${REF_PARALLEL:-}" ]; then
  echo "waiting for the fault-free reference run ($STEPS steps, hosts c and d, started with the faulty one)..."
  wait "$refjob"
  refjob=
else
  echo "fault-free reference run ($STEPS steps, the same hosts)..."
  start_job "$work/ref" "$RUN" --min-np 2 --max-np 4 -np 4 -H $A:2,$Bh:2 "$GPT" $ARGS --steps $STEPS
  wait "$job"
  job=
fi
ref=$(sed -n 's/.*final_loss_exact=\([^ ]*\) params_hash=\([^ ]*\).*/\1 \2/p' "$work/ref")
same=no
[ -n "$ref" ] && [ "$ref" = "$got" ] && same=yes
same_loss=no
[ -n "$ref" ] && [ "${ref% *}" = "${got% *}" ] && same_loss=yes

res="$RESULTS/faults-hosts-$date_tag$([ "$ZERO" != 0 ] && echo "-zero$ZERO")$SUFFIX.md"
cp "$work/records" "${res%.md}.tsv"
{
  echo "# Elastic fault injection across namespace hosts, $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  echo "Command: \`REF_PARALLEL=${REF_PARALLEL:-} STEPS=$STEPS ZERO=$ZERO EVERY=$EVERY LOSS_S=$LOSS_S HB=$HB MINHB=$MINHB SETTLE=$SETTLE KINDS='$KINDS' bench/faults_hosts.sh $FAULTS $B\`; machine: $(nproc) cores, load before: $load_before, after: $(cut -d' ' -f1-3 /proc/loadavg); commit $commit."
  echo "Job: train-gpt $ARGS --steps $STEPS, 4 ranks on 2 namespace hosts (2 each, own net/UTS/IPC/PID namespaces and sshd),"
  echo "tandemrun --min-np 2 --max-np 4 --host-discovery-script on a third; heartbeat timeout $HB s$([ -n "$MINHB" ] && echo " (adaptive, floor $MINHB s)"), settle $SETTLE s. Faults ran"
  echo "for $(secs "$t_start" "$t_end") s. Per-fault rows: \`$(basename "${res%.md}.tsv")\` (kind, process, host, fault time, next step time, steps lost, new epoch, step before, longest gap between steps for loss, seconds from the loss's end to the next step)."
  echo
  echo "| kind | faults | fault -> next step median (s) | p95 (s) | max (s) | steps lost (total) | no new epoch | longest gap between steps, median / max (s) | loss's end -> next step, median / max (s) | hangs |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  for k in $(printf '%s\n' "${kinds[@]}" | awk '!seen[$0]++') all; do
    awk -F'\t' -v k="$k" '($1 == k || k == "all") && $5 != "" { n++; d[n] = $5 - $4; lost += $6; calm += ($7 == 0); if ($9 != "-") { m++; g[m] = $9 }; if ($10 != "" && $10 != "-") { c++; e[c] = $10 } }
      END {
        if (!n) { printf "| %s | 0 | | | | | | | |", k; exit }
        for (i = 1; i <= c; i++) for (j = i + 1; j <= c; j++) if (e[j] < e[i]) { t = e[i]; e[i] = e[j]; e[j] = t }
        clr = c ? sprintf("%.2f / %.2f", c % 2 ? e[(c + 1) / 2] : (e[c / 2] + e[c / 2 + 1]) / 2, e[c]) : "-"
        for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (g[j] < g[i]) { t = g[i]; g[i] = g[j]; g[j] = t }
        gap = m ? sprintf("%.2f / %.2f", m % 2 ? g[(m + 1) / 2] : (g[m / 2] + g[m / 2 + 1]) / 2, g[m]) : "-"
        for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (d[j] < d[i]) { t = d[i]; d[i] = d[j]; d[j] = t }
        r = 0.95 * (n - 1); lo = int(r) + 1; hi = lo + (r > int(r)); p95 = d[lo] + (d[hi] - d[lo]) * (r - int(r))
        med = n % 2 ? d[(n + 1) / 2] : (d[n / 2] + d[n / 2 + 1]) / 2
        printf "| %s | %d | %.2f | %.2f | %.2f | %d | %d | %s | %s |", k, n, med, p95, d[n], lost, calm, gap, clr }' "$work/records"
    [ "$k" = all ] && echo " $hangs |" || echo " |"
  done
  echo
  echo "Faults injected: $f of $FAULTS$([ $ended = 1 ] && echo " (the job finished first)")."
  echo "Hangs (no new epoch, or no step, within $HANG_S s of a fault): $hangs. The job: $([ -n "$got" ] && echo "finished" || echo "did NOT finish"), tandemrun exit code ${rc:-none} ($(grep "tandemrun:" "$out" | tail -1 | cut -d' ' -f2- | cut -c1-160))."
  echo "'no new epoch': packet loss that TCP rode out (the job slowed, no process was lost)."
  echo "Hosts evicted by tandemrun for a lossy link (\`tandemrun: evicting host\`): $(grep -c "tandemrun: evicting host" "$work/faulty.out") ($(grep "tandemrun: evicting host" "$work/faulty.out" | sed -n 's/.*evicting host \([^:]*\):.*/\1/p' | sort | uniq -c | awk '{ printf "%s%s x%s", (NR > 1 ? ", " : ""), $2, $1 }')); in the fault-free run: $(grep -c "tandemrun: evicting host" "$work/ref")."
  echo "Final loss and parameter hash, fault-free: \`$ref\`; with faults: \`$got\`; loss bit-identical: $same_loss; parameters bit-identical: $same."
} >"$res"
cat "$res"
# Non-zero when the benchmark's target was missed: a hang, or no final loss.
[ "$hangs" = 0 ] && [ -n "$got" ] && [ -n "$ref" ]
