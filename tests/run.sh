#!/usr/bin/env bash
# Runs the test suite: every line of tests/*.suite against build/ and
# against the ASan+UBSan tree build/asan/, each under a timeout.
#
# Suite line format (one test per line, '#' starts a comment):
#   TIMEOUT_S NAME COMMAND...
# In COMMAND, $B is the build tree (build or build/asan) and $RUN is
# "$B/bin/tandemrun". A line whose NAME ends in "!noasan" runs only in the
# normal tree (for tests whose point is speed or which spawn too much to
# run under ASan in the time budget).
#
# Environment: TESTS=REGEX runs only tests whose name matches;
#              SUITES="tests/a.suite ..." runs only those suite files
#              (default: every tests/*.suite but tests/gpu.suite, whose
#              lines need a GPU: scripts/gpu-check runs them there);
#              TREES="build" skips the sanitizer pass;
#              JOBS=N runs up to N lines at once (default 3; 1: one by one,
#              in suite order); JOBS_IDLE=M: up to M (default N+2) while
#              more than a third of the CPUs stay idle (see "the pool" below).
#              TESTS_DEADLINE=EPOCH_S: no line runs past this time (date
#              +%s): each line's timeout is cut to what is left, and a line
#              with nothing left prints "SKIP NAME" and counts as skipped
#              (scripts/gpu-check: a budget for the whole suite, so that
#              every line is accounted for in its table).
#              SERIAL=REGEX names the lines that run alone, no pool line
#              beside them (default: those whose point is a time bound, that
#              create network namespaces, that move data through tiny
#              buffers, or that inject faults into elastic jobs; and
#              py_install, whose `make install` may relink build/bin
#              programs that the lines beside it run).
#              TREES_READY=DIR: the trees are still being built (make test
#              builds them beside the suite): a line starts once every tree
#              it uses has left DIR/<tree> holding 0 (tree: build, asan,
#              cudaemu, fuzz: build/'s name below it; c10d: build/python's
#              c10d extension, for the lines that use build/python); DIR/done
#              marks the end of the builds (a tree missing then did not
#              build: its lines fail). The lone lines run first, beside
#              the builds: build/'s once build/ is there, then the other
#              trees' lines, each once its tree is; the pool follows.
#              HOSTLANE=REGEX: of those, the lines that build hosts (network
#              namespaces, a Slurm cluster) and mostly wait on heartbeat and
#              node timeouts; they run one by one in a second lane beside the
#              other lone lines (one by one too), so that each lone line has
#              at most one other beside it (see "The lone lines" below).
# Why lines run in parallel: most lines spend their time waiting (timeouts,
# heartbeats, process start-up), not computing, and every test must pass on
# a loaded machine anyway (rule of the house).
# Ends with the summary line "N passed, N failed" and exits non-zero on any failure.
set -u
cd "$(dirname "$0")/.."
trees=${TREES:-"build build/asan"}
filter=${TESTS:-.}
suites=${SUITES:-$(ls tests/*.suite | grep -v '^tests/gpu\.suite$')}
logdir=build/test-logs
mkdir -p "$logdir"
passed=0
failed=0
skipped=0
failed_names=()
start_all=$(date +%s)

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:halt_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

jobs_max=${JOBS:-3}
jobs_idle=${JOBS_IDLE:-$((jobs_max + 2))}
serial=${SERIAL:-'^(deadhost_|elastic_|slurm_cluster_|py_install$|.*(small_chunks|small_sockets|huge)$|tcp_heartbeat_(stop|busy)|fail_timeout_|core_timeout_|launcher_timeout|comm_two_jobs|launcher_concurrent)'}
hostlane=${HOSTLANE:-'^(deadhost_|elastic_host_cut|elastic_el2_.*host_kill|elastic_faulthosts_|elastic_remote_|slurm_cluster_)'}
for re in "TESTS=$filter" "SERIAL=$serial" "HOSTLANE=$hostlane"; do
  [[ "" =~ ${re#*=} ]]
  [ $? = 2 ] && { echo "tests/run.sh: ${re%%=*} is not an extended regular expression: '${re#*=}'"; exit 2; }
done
resdir=$(mktemp -d /tmp/tandem-tests.XXXXXX)
trap 'rm -rf "$resdir"' EXIT

# One line: run it under its timeout, print PASS/FAIL (one write, so that
# lines of parallel tests do not interleave) and leave the verdict in $resdir.
# The CPU time a line used (its processes' user + system time, those the
# shell reaped) is printed beside its wall time: a line with much less CPU
# than wall time waits (timeouts, heartbeats, start-up) and leaves the cores
# to the lines beside it; one with as much CPU as wall time or more computes.
clk_tck=$(getconf CLK_TCK 2>/dev/null || echo 100)
# (fields 16 and 17 of /proc/PID/stat: cutime, cstime; read in this shell, as
# a $(...) would read its own subshell's)
children_ticks() { local s; read -r s </proc/$BASHPID/stat; s=${s##*) }; set -- $s; ticks=$(( ${14} + ${15} )); }
run_one() {
  local tag=$1 tmo=$2 cmd=$3 log=$4 t0 c0 rc dt_ds dt cpu_ds cpu out left
  if [ -n "${TESTS_DEADLINE:-}" ]; then
    left=$((TESTS_DEADLINE - $(date +%s)))
    if [ "$left" -le 0 ]; then
      printf 'SKIP %-50s %6ss (no time left before TESTS_DEADLINE)\n' "$tag" 0
      echo "skip $tag" >"$resdir/${tag//\//_}"
      return
    fi
    [ "$left" -lt "$tmo" ] && tmo=$left
  fi
  t0=$(date +%s%N)
  children_ticks
  c0=$ticks
  # TD_LINE_TIMEOUT: a line's script can end its own run a little earlier,
  # so that what it captured reaches the log instead of being cut with it
  TD_LINE_TIMEOUT=$tmo timeout -k 5 "$tmo" bash -c "$cmd" >"$log" 2>&1
  rc=$?
  dt_ds=$(( ($(date +%s%N) - t0) / 100000000 ))
  dt="$((dt_ds / 10)).$((dt_ds % 10))"
  children_ticks
  cpu_ds=$(( (ticks - c0) * 10 / clk_tck ))
  cpu="$((cpu_ds / 10)).$((cpu_ds % 10))"
  if [ $rc -eq 0 ]; then
    printf 'PASS %-50s %6ss  cpu %6ss\n' "$tag" "$dt" "$cpu"
    echo pass >"$resdir/${tag//\//_}"
  else
    local why="exit $rc"
    [ $rc -eq 124 ] && why="timed out after ${tmo}s"
    out=$(printf 'FAIL %-50s %6ss (%s)\n---- last lines of %s:\n%s\n----' "$tag" "$dt" "$why" "$log" \
      "$(tail -n 25 "$log" | sed 's/^/    /')")
    echo "$out"
    echo "fail $tag" >"$resdir/${tag//\//_}"
  fi
}

# Every line is read first. The lines that may share the machine run as one
# pool across both trees, longest first (by timeout, the only duration a
# suite line states), so that no long line starts last and runs on while the
# other slots stay idle; the lines that run alone follow the pool, one by one.
# (Run in suite order, each tree after the other, every lone line had first
# waited for the lines beside it to end, and each tree for its slowest line.)
ready_dir=${TREES_READY:-}
[ -z "$ready_dir" ] || [ -d "$ready_dir" ] ||
  { echo "tests/run.sh: TREES_READY=$ready_dir is not a directory (make test creates it)"; exit 2; }
pool=() alone=() hosts=()
for B in $trees; do
  [ -n "$ready_dir" ] || [ -d "$B/tests" ] ||
    { echo "missing $B/tests: build it first (make all BUILD=$B)"; failed=$((failed+1)); continue; }
  RUN="$B/bin/tandemrun"
  for suite in $suites; do
    while IFS= read -r line || [ -n "$line" ]; do
      line="${line%%#*}"
      [ -z "${line// }" ] && continue
      read -r tmo name cmd <<<"$line"
      if [[ "$name" == *'!noasan' ]]; then
        [ "$B" != build ] && continue
        name="${name%!noasan}"
      fi
      [[ $name =~ $filter ]] || continue # (bash's own ERE: no grep per line, ~2000 lines)
      tag="${B##*/}/$name"
      log="$logdir/${tag//\//_}.log"
      cmd="${cmd//\$RUN/$RUN}"
      cmd="${cmd//\$B/$B}"
      # the trees the line uses (TREES_READY): build/ (its tools serve
      # every tree), its own, and the emulator's or the fuzzers' it names
      needs=build
      [ "$B" != build ] && needs+=" ${B##*/}"
      [[ $cmd == *build/cudaemu* ]] && needs+=" cudaemu"
      [[ $cmd == *build/fuzz* || $cmd == *tests/fuzz/* ]] && needs+=" fuzz"
      # build/python's c10d extension is built beside the suite (make test)
      [[ $B == build && ( $cmd == *build/python* || $cmd == *tests/python/* ) ]] && needs+=" c10d"
      entry="$tmo"$'\t'"$tag"$'\t'"$needs"$'\t'"$log"$'\t'"$cmd"
      if [ "$jobs_max" -gt 1 ] && [[ $name =~ $hostlane ]]; then
        hosts+=("$entry")
      elif [ "$jobs_max" -le 1 ] || [[ $name =~ $serial ]]; then
        alone+=("$entry")
      else
        pool+=("$entry")
      fi
    done < "$suite"
  done
done
# The pool runs JOBS lines at once, and one more (up to JOBS_IDLE) after each
# second in which more than a third of the CPUs were idle: when the lines that
# hold the slots all wait (in the clean-clone CI at 9bb4e0b three of them
# waited on I/O and sub-processes from 270 s to 305 s, 0.5 of 2 cores busy),
# the next lines start instead of waiting for them. (More than half until
# ci33, whose pool ended with 366 short lines in 78 s, three at a time, with
# about one of the two cores busy: just short of the rule.) A ticker (sleep 1) wakes
# the loop each second; /proc/stat's idle and iowait ticks say how idle the
# machine was over it (other work on the machine counts as busy, so a loaded
# machine gets no extra lines).
cpu_idle() { # sets idle, total: /proc/stat's first line, in ticks
  local line
  read -r line </proc/stat
  set -- $line
  shift
  idle=$(($4 + $5)) total=0
  for v; do total=$((total + v)); done
}
running_lines() { # sets n (running lines) and ticking (1 while the ticker runs)
  local p
  n=0 ticking=0
  for p in $(jobs -rp); do
    if [ "$p" = "$tick" ]; then ticking=1; else n=$((n + 1)); fi
  done
}
# With TREES_READY, a line whose trees are not built yet waits, and the
# pool takes the next line (in the same order) whose trees are: build/'s
# lines run while the ASan, emulator and fuzz trees build beside them.
# tree_state NEEDS: sets state to ready, wait, or the name of a tree that
# did not build.
tree_state() {
  local t v
  state=ready
  [ -z "$ready_dir" ] && return
  for t in $1; do
    v=
    if [ -e "$ready_dir/$t" ]; then
      read -r v <"$ready_dir/$t"
    elif [ ! -e "$ready_dir/done" ]; then
      state=wait
      continue
    fi
    [ "$v" = 0 ] || { state=$t; return; }
  done
}
# start_line TMO TAG NEEDS LOG CMD: runs it (in the background with "&" at
# the call), or fails it at once when one of its trees did not build.
start_line() {
  tree_state "$3"
  if [ "$state" = ready ]; then
    run_one "$2" "$1" "$5" "$4" </dev/null
  else
    printf 'FAIL %-50s (its tree %s did not build: see the make output above)\n' "$2" "$state"
    echo "fail $2" >"$resdir/${2//\//_}"
  fi
}
# The lone lines: two lanes at once, each one line at a time. The host lane
# (HOSTLANE: namespace hosts, the Slurm cluster) used about a tenth of a core
# over its 176 s in the clean-clone CI at 9bb4e0b (slurm_cluster_requeue
# 3.2 s of CPU in 41 s, elastic_faulthosts_short 6.3 in 40, deadhost_* 1.4 in
# 8), so a lone line of the other lane still has the machine nearly to
# itself, and no lone line has more than one line beside it, never the pool.
# Each host-lane line builds its own namespaces, switch and Slurm cluster,
# named after its pid (tests/lib/netns.sh); they run one by one so that their
# time bounds see only one neighbour. The other lone lines are claimed one at
# a time by whichever lane is free (mkdir is atomic), so the host lane takes
# its share of them once its own are done and neither lane idles while the
# other has a queue. Run one after the other, the lone lines took 362 s of
# that CI's 842 s suite.
claims=$resdir/.claims
mkdir "$claims"
run_lane() { # PHASE: lane_hosts, then every line of lane_alone no other lane claimed
  local entry tmo tag needs log cmd i
  for entry in ${lane_hosts[@]+"${lane_hosts[@]}"}; do
    IFS=$'\t' read -r tmo tag needs log cmd <<<"$entry"
    lane_line "$tmo" "$tag" "$needs" "$log" "$cmd"
  done
  for i in "${!lane_alone[@]}"; do
    mkdir "$claims/$1-$i" 2>/dev/null || continue
    IFS=$'\t' read -r tmo tag needs log cmd <<<"${lane_alone[$i]}"
    lane_line "$tmo" "$tag" "$needs" "$log" "$cmd"
  done
}
# lane_line TMO TAG NEEDS LOG CMD: start_line once the line's trees are built
# (TREES_READY: the lanes run beside the builds; a lane that reaches a line
# of a tree still building waits for it, in suite order)
lane_line() {
  while tree_state "$3"; [ "$state" = wait ]; do sleep 1; done
  start_line "$@"
}
run_lanes() { # PHASE: lane_hosts in one lane (one line at a time), lane_alone shared by both
  if [ "$jobs_max" -gt 1 ]; then
    run_lane "$1" &
    lane_hosts=()
  fi
  run_lane "$1"
  wait
}
# With TREES_READY, every lone line runs first, beside the other trees'
# builds (nice 10) and before the pool: build/'s lines once build/ is built,
# then the other trees' lines (the ASan tree's), each once its tree is. In the
# clean-clone CI at dd32cde the lone lines ran after the last build (721 s)
# and the pool, 259 s in which their two lanes kept about one of the two
# cores busy and the other idle; beside them, the builds take that core. A
# nice-10 compiler yields the CPU to a line at once (CFS weights 110 to
# 1024), so a lone line still has no test line but its lane's neighbour
# beside it. (Until ci33 the ASan tree's lone lines ran last, after the pool
# and the last build: their 77 s kept 0.4 to 0.9 of the two cores busy,
# while the builds they now run beside needed the other.)
lane_hosts=() lane_alone=()
if [ -n "$ready_dir" ]; then
  lane_hosts=(${hosts[@]+"${hosts[@]}"}) lane_alone=(${alone[@]+"${alone[@]}"})
  hosts=() alone=()
  if [ ${#lane_hosts[@]} -gt 0 ] || [ ${#lane_alone[@]} -gt 0 ]; then
    while tree_state build; [ "$state" = wait ]; do sleep 1; done
    run_lanes first
  fi
fi
if [ ${#pool[@]} -gt 0 ]; then
  tick=""
  if [ "$jobs_idle" -gt "$jobs_max" ] && [ -r /proc/stat ]; then
    cpu_idle; idle0=$idle total0=$total
    sleep 1 & tick=$!
  fi
  mapfile -t pending < <(printf '%s\n' "${pool[@]}" | sort -t$'\t' -s -k1,1nr)
  while [ ${#pending[@]} -gt 0 ]; do
    while :; do
      running_lines
      [ "$n" -lt "$jobs_max" ] && break
      if [ -n "$tick" ] && [ "$n" -lt "$jobs_idle" ] && [ "$ticking" = 0 ]; then
        cpu_idle
        more=$(( (idle - idle0) * 3 > total - total0 ))
        idle0=$idle total0=$total
        sleep 1 & tick=$!
        [ "$more" = 1 ] && break
      fi
      wait -n
    done
    # the first line whose trees are built (or whose tree failed: it fails
    # at once); each distinct set of trees is looked at once per pass
    pick=
    declare -A seen=()
    for i in "${!pending[@]}"; do
      needs=${pending[$i]#*$'\t'}
      needs=${needs#*$'\t'}
      needs=${needs%%$'\t'*}
      [ -n "${seen[$needs]:-}" ] && continue
      tree_state "$needs"
      [ "$state" = wait ] && { seen[$needs]=1; continue; }
      pick=$i
      break
    done
    unset seen
    if [ -z "$pick" ]; then
      sleep 1 # (no line can start before a tree is built)
      continue
    fi
    IFS=$'\t' read -r tmo tag needs log cmd <<<"${pending[$pick]}"
    unset "pending[$pick]"
    start_line "$tmo" "$tag" "$needs" "$log" "$cmd" &
  done
  [ -n "$tick" ] && kill "$tick" 2>/dev/null
fi
wait
# Without TREES_READY, the lone lines follow the pool, as above.
lane_hosts=(${hosts[@]+"${hosts[@]}"}) lane_alone=(${alone[@]+"${alone[@]}"})
run_lanes last
for f in "$resdir"/*; do
  [ -e "$f" ] || continue
  read -r verdict tag <"$f"
  if [ "$verdict" = pass ]; then
    passed=$((passed+1))
  elif [ "$verdict" = skip ]; then
    skipped=$((skipped+1))
  else
    failed=$((failed+1))
    failed_names+=("$tag")
  fi
done

echo
echo "suite time: $(( $(date +%s) - start_all ))s"
if [ $failed -gt 0 ]; then
  echo "failed: ${failed_names[*]}"
fi
if [ $skipped -gt 0 ]; then
  echo "$passed passed, $failed failed, $skipped skipped (TESTS_DEADLINE)"
else
  echo "$passed passed, $failed failed"
fi
[ $failed -eq 0 ] && [ $skipped -eq 0 ]
