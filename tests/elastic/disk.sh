#!/usr/bin/env bash
# Elastic jobs on disk: a whole job (every rank and tandemrun, SIGKILL)
# killed at random steps and restarted from its last checkpoint, each time
# at another world size inside --min-np..--max-np, ends with the bits of a
# run that was never interrupted.
#
#   disk.sh B [KILLS] [SEED] [REPORT]
#
# Reference: one uninterrupted 4-rank elastic run (global batch 12). Then a
# chain: start the job (--save DIR --save-every 7 --keep-last 2 --metrics
# M, and --resume DIR once DIR holds a checkpoint), kill all of it at a
# random step, restart at the next world size of 4 3 2 1 ... KILLS times,
# then let it finish. Kill 2 (when KILLS >= 2) lands inside a save: rank
# 0's process dies at a random file operation of its first save
# (TANDEM_CKPT_FAULT_AT) and the rest of the job is killed right after.
# Checked after every kill: `latest` names a checkpoint that a restart at
# another world size loads (the one `latest` named before the kill or a
# newer one: never an older one), and a completion from a copy of it ends
# with the reference's final loss and parameter hash; the chain's final
# run too; the step losses the runs print equal the reference's; the
# metrics file holds every step with the reference's loss (last record of
# each step) and one elastic_epoch record per start, those after the first
# saying disk_restores 1. REPORT (optional): one line per kill appended
# there (bench/elastic_disk.sh).
set -u
B=$1
KILLS=${2:-3}
SEED=${3:-$$}
REPORT=${4:-}
RUN="$B/bin/tandemrun"
GPT="$B/bin/train-gpt"
RANDOM=$SEED
work=$(mktemp -d /tmp/tandem-elastic-disk-XXXXXX)
tr_pid=
kill_job() { # every process of the job at once: tandemrun frozen first, so that it starts nothing new
  [ -n "$tr_pid" ] || return 0
  kill -STOP "$tr_pid" 2>/dev/null
  local kids
  kids=$(pgrep -P "$tr_pid")
  kill -9 "$tr_pid" $kids 2>/dev/null
  wait "$tr_pid" 2>/dev/null
  tr_pid=
}
cleanup() {
  kill_job
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
export TANDEM_PROGRESS=plain
ARGS="--layers 1 --channels 32 --heads 2 --seq 32 --threads 1 --sample 0 --micro-batch 3"
STEPS=$(( (KILLS + 2) * 30 > 150 ? (KILLS + 2) * 30 : 150 )) # room for every kill before the end
SIZES=(4 3 2 1 4 2 3)

fail() {
  echo "FAIL(elastic_disk, seed $SEED): $*"
  [ -f "$work/out" ] && { echo "---- last run (without step lines):"; grep -v "step [0-9]* loss" "$work/out" | tail -30; }
  exit 1
}
wait_for() { # FILE PATTERN SECONDS
  local n=$(( ${3:-60} * 20 ))
  for _ in $(seq 1 "$n"); do
    grep -Eq -- "$2" "$1" && return 0
    sleep 0.05
  done
  fail "'$2' did not appear in $1 within ${3:-60} s"
}
losses() { sed -n 's/.*train-gpt: step \([0-9]*\) loss \([^ ]*\) .*/\1 \2/p' "$1" | awk '{l[$1]=$2} END {for (s in l) print s, l[s]}' | sort -k1,1; }
exact() { sed -n 's/.*elastic final_loss_exact=\([^ ]*\) params_hash=\([^ ]*\).*/\1 \2/p' "$1"; }
latest_step() { [ -f "$1/latest" ] && sed -n 's/^step-\([0-9]*\).*/\1/p' "$1/latest" || echo 0; }
# every reported step's loss must be the reference's (a job restarted from disk redoes steps: equally)
same_losses() {
  join <(losses "$1") <(losses "$work/ref") | awk '$2 != $3 { print; bad = 1 } END { exit bad }' >"$work/diff" ||
    { head -5 "$work/diff"; fail "$2: step losses differ from the uninterrupted run's (step, here, reference)"; }
}

timeout 120 "$RUN" --min-np 1 --max-np 4 -np 4 "$GPT" $ARGS --steps $STEPS >"$work/ref" 2>&1 ||
  { cat "$work/ref"; fail "the uninterrupted run failed"; }
want=$(exact "$work/ref")
[ -n "$want" ] && [ "$(losses "$work/ref" | wc -l)" = $STEPS ] || fail "the uninterrupted run reported no final hash or not $STEPS steps"
echo "uninterrupted: $want"

ck="$work/ck"
np=4
starts=0
for kill in $(seq 1 "$KILLS") final; do
  resume=
  [ -f "$ck/latest" ] && resume="--resume $ck"
  before=$(latest_step "$ck")
  fault_env=
  [ "$kill" = 2 ] && fault_env="TANDEM_CKPT_FAULT_AT=$((RANDOM % 9 + 1))"
  env $fault_env setsid "$RUN" --min-np 1 --max-np 4 -np "$np" --max-restarts 0 "$GPT" $ARGS --steps $STEPS \
    --save "$ck" --save-every 7 --keep-last 2 --metrics "$work/metrics" $resume >"$work/out" 2>&1 &
  tr_pid=$!
  starts=$((starts + 1))
  if [ -n "$resume" ]; then
    wait_for "$work/out" "resumed from the disk checkpoint in $ck at step [0-9]+ \(world $np\)" 60
    got=$(sed -n 's/.*resumed from the disk checkpoint in .* at step \([0-9]*\) (world.*/\1/p' "$work/out" | head -1)
    [ "$got" -ge "$before" ] || fail "restart $starts loaded step $got, but latest named step $before before it"
  fi
  if [ "$kill" = final ]; then
    timeout 120 tail --pid="$tr_pid" -f /dev/null
    wait "$tr_pid"
    rc=$?
    tr_pid=
    [ "$rc" = 0 ] || { cat "$work/out"; fail "the final run exited $rc"; }
    [ "$(exact "$work/out")" = "$want" ] || fail "the final run ended with $(exact "$work/out"), the uninterrupted run with $want"
    same_losses "$work/out" "final run"
    echo "final run (world $np, from step ${got:-0}): $want"
    break
  fi
  if [ -n "$fault_env" ]; then
    wait_for "$work/out" "process 0 .*killed by signal 9" 60
    at="inside its first save ($fault_env)"
  else
    # a random step 2..30 steps past the checkpoint it started from
    target=$(( $(latest_step "$ck") + 2 + RANDOM % 29 ))
    [ $target -lt $((STEPS - 7)) ] || target=$((STEPS - 8)) # a step left to train after the checkpoint
    wait_for "$work/out" "step $target loss" 60
    at="at step $target"
  fi
  kill_job
  same_losses "$work/out" "run $starts"
  last=$(latest_step "$ck")
  [ "$last" -ge "$before" ] || fail "after kill $kill, latest names step $last; it named step $before before"
  # A completion from a copy of what the kill left, at the next world size.
  np=${SIZES[$((kill % ${#SIZES[@]}))]}
  cp -a "$ck" "$work/copy"
  timeout 120 "$RUN" --min-np 1 --max-np 4 -np "$np" "$GPT" $ARGS --steps $STEPS --resume "$work/copy" \
    >"$work/done" 2>&1 || { cat "$work/done"; fail "completing from the checkpoint of kill $kill failed"; }
  rm -rf "$work/copy"
  got_done=$(exact "$work/done")
  # the job may have run to its end before the kill: nothing left to train, the hash alone tells
  [ "$last" = $STEPS ] && got_done="${want% *} ${got_done#* }"
  [ "$got_done" = "$want" ] ||
    fail "completing from kill $kill's checkpoint (step $last, world $np) ended with $(exact "$work/done"), not $want"
  same_losses "$work/done" "completion $kill"
  line="kill $kill $at: latest step $last (was $before); completed at world $np: $got_done equal"
  echo "$line"
  [ -n "$REPORT" ] && echo "$line" >>"$REPORT"
done

# The metrics file: every step's last record has the reference's loss; one
# elastic_epoch record per start, the resumed ones from disk.
python3 - "$work/metrics" "$work/ref" "$starts" <<'EOF' || fail "metrics file check"
import json, re, sys
path, ref_path, starts = sys.argv[1], sys.argv[2], int(sys.argv[3])
ref = {}
for line in open(ref_path):
    m = re.search(r"train-gpt: step (\d+) loss (\S+) ", line)
    if m: ref[int(m.group(1))] = float(m.group(2))
steps, epochs = {}, []
for n, line in enumerate(open(path), 1):
    r = json.loads(line)  # a line cut by a kill would fail here
    if r.get("event") == "elastic_epoch": epochs.append(r)
    elif "event" not in r: steps[r["step"]] = r["loss"]
missing = sorted(set(ref) - set(steps))
assert not missing, f"steps missing from the metrics file: {missing[:10]}"
bad = [(s, steps[s], ref[s]) for s in ref if abs(steps[s] - ref[s]) > 1e-7 * abs(ref[s])]
assert not bad, f"losses differ from the reference (step, metrics, reference): {bad[:5]}"
assert len(epochs) >= starts, f"{len(epochs)} elastic_epoch records for {starts} starts"
resumed = sum(1 for e in epochs if e["disk_restores"] == 1)
assert resumed >= 1 and epochs[0]["disk_restores"] == 0, f"disk_restores of the epochs: {[e['disk_restores'] for e in epochs]}"
print(f"metrics: {len(steps)} steps equal to the reference's, {len(epochs)} elastic_epoch records ({resumed} from disk)")
EOF
echo "PASS(elastic_disk): $KILLS whole-job kills (seed $SEED), every restart ends with $want"
