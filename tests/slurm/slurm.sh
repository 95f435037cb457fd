#!/usr/bin/env bash
# Tandem under a real Slurm cluster (tests/lib/slurmcluster.sh: munged,
# slurmctld and three slurmd nodes, each in its own network, UTS, IPC, PID
# and mount namespaces), no tandemrun in the job:
#
#   slurm.sh B srun     `srun -N2 --ntasks-per-node=2 train-gpt` gives the
#                       losses, learning rates and gradient norms of the same
#                       4-rank job under tandemrun on the same two nodes (over
#                       ssh), bit for bit, and its final_loss line; so does
#                       an odd layout, srun -N3 -n5 (2, 2, 1 tasks); and a
#                       one-node step runs
#   slurm.sh B sbatch   examples/slurm/train-gpt.sbatch, submitted with
#                       sbatch, completes with the same bits; a batch
#                       script that runs train-gpt without srun is refused
#   slurm.sh B kill     a task killed with SIGKILL on node n2 (rank 2) ends
#                       the job within a bound, the other ranks naming rank 2;
#                       `scancel --signal=KILL` of a running step ends it too;
#                       no process of the job is left on any node
#   slurm.sh B requeue  the sbatch job with --requeue: node n1 (the batch
#                       host, rank 0's) is killed mid-run; Slurm marks it down,
#                       requeues the job onto n2 and n3, the job resumes from
#                       its newest checkpoint and ends with the final loss and
#                       parameters of an uninterrupted run
#
# Prints SKIP (exit 0) with the reason when Slurm or root is missing; every
# daemon, namespace and file is removed on exit, also after a failure.
set -u
B=$1
case_name=$2
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$here/../lib/slurmcluster.sh"
if why=$(slurm_missing); then
  echo "SKIP(slurm $case_name): $why"
  exit 0
fi
GPT=$(cd "$B/bin" && pwd)/train-gpt
RUN=$(cd "$B/bin" && pwd)/tandemrun
tmp=$(mktemp -d "/tmp/td-slurm-$$.XXXXXX")
chmod 711 "$tmp"
fail() {
  echo "FAIL(slurm $case_name): $*"
  for f in "$tmp"/*.out "$tmp"/*.err; do [ -f "$f" ] && { echo "---- $f:"; tail -n 15 "$f"; }; done
  for f in "$tmp"/c/slurmctld.log "$tmp"/c/slurmd.*.log; do [ -f "$f" ] && { echo "---- $f:"; tail -n 8 "$f"; }; done
  exit 1
}
NETNS_TAG_PREFIX=sl
NETNS_ON_EXIT='rm -rf "$tmp"'
slurm_init "$tmp/c" 10.77.17 n1 n2 n3
cd "$tmp" # srun and sbatch run the tasks in the submitter's directory (shared)

# The job's secret: a file only root reads, exported to the job (srun passes
# the environment on). ~/.tandem/secret on a shared home works the same way.
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$tmp/secret"
chmod 600 "$tmp/secret"
export TANDEM_SECRET_FILE=$tmp/secret TANDEM_PROGRESS=plain
ARGS="--layers 2 --channels 64 --heads 2 --seq 64 --threads 1 --sample 0 --micro-batch 3"

# The per-step numbers that must agree bit for bit, as printed (no timings).
numbers() { sed -E 's/.*"step":([0-9]+),"loss":([^,]+),"lr":([^,]+),.*"grad_norm":([^,]+),.*/\1 \2 \3 \4/' "$1"; }
final_line() { # the final line's result fields (not its timings)
  grep -m1 'final_loss=' "$1" | grep -Eo '(final_loss|steps|world|params|global_batch)=[^ ]+' | tr '\n' ' '
}
same_run() { # METRICS-A OUT-A METRICS-B OUT-B WHAT
  [ -s "$1" ] && [ -s "$3" ] || fail "$5: a metrics file is missing or empty"
  [ "$(numbers "$1" | wc -l)" -ge 1 ] || fail "$5: no step lines in $1"
  numbers "$1" >"$tmp/a.num"
  numbers "$3" >"$tmp/b.num"
  cmp -s "$tmp/a.num" "$tmp/b.num" || { diff "$tmp/a.num" "$tmp/b.num" | head; fail "$5: the per-step numbers differ"; }
  [ -n "$(final_line "$2")" ] && [ "$(final_line "$2")" = "$(final_line "$4")" ] ||
    fail "$5: final lines differ: '$(final_line "$2")' vs '$(final_line "$4")'"
}
job_state() { slurm_run scontrol show job "$1" 2>/dev/null | grep -Eo 'JobState=[A-Z_]+' | cut -d= -f2; }
wait_state() { # JOB STATE SECONDS
  local _
  for _ in $(seq 1 $(( $3 * 5 ))); do
    [ "$(job_state "$1")" = "$2" ] && return 0
    sleep 0.2
  done
  return 1
}
gpt_on() { # NODE: pids of train-gpt processes on it
  local pid
  for pid in $(slurm_node_pids "$1"); do [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = train-gpt ] && echo "$pid"; done
}
no_job_left() {
  local n _
  for _ in $(seq 1 50); do
    [ -z "$(gpt_on n1)$(gpt_on n2)$(gpt_on n3)" ] && return 0
    sleep 0.1
  done
  for n in n1 n2 n3; do [ -n "$(gpt_on $n)" ] && fail "train-gpt left on $n: $(gpt_on $n)"; done
}
start_srun() { # FILE-STEM: a 4-rank job of many steps in the background, its srun's pid in srun_pid
  # srun itself (ip netns exec execs it), listed for the clean-up on exit.
  slurm_run srun -N2 --ntasks-per-node=2 "$GPT" $ARGS --steps 100000 --metrics "$tmp/$1.jsonl" >"$tmp/$1.out" 2>&1 &
  srun_pid=$!
  NETNS_SPAWNED+=("$srun_pid")
  for _ in $(seq 1 300); do [ "$(numbers "$tmp/$1.jsonl" 2>/dev/null | wc -l)" -ge 5 ] && return 0; sleep 0.1; done
  fail "the job ($1) did not reach step 5 within 30 s"
}
wait_srun() { # SECONDS: srun's exit code in rc, 124 if it still runs after SECONDS
  local _
  for _ in $(seq 1 $(( $1 * 10 ))); do kill -0 "$srun_pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$srun_pid" 2>/dev/null; then rc=124; else wait "$srun_pid"; rc=$?; fi
}
tandemrun_reference() { # STEPS: the same job under tandemrun over ssh on n1 and n2
  slurm_run timeout 60 "$RUN" -np 4 -H 10.77.17.1:2,10.77.17.2:2 "$GPT" $ARGS --steps "$1" --metrics "$tmp/tr.jsonl" \
    >"$tmp/tr.out" 2>&1 || fail "the tandemrun job failed (exit $?)"
}

case $case_name in
srun)
  t0=$(date +%s.%N)
  slurm_run timeout 60 srun -N2 --ntasks-per-node=2 "$GPT" $ARGS --steps 20 --metrics "$tmp/srun.jsonl" \
    >"$tmp/srun.out" 2>&1 || fail "srun exited $?"
  t1=$(date +%s.%N)
  grep -q 'world=4 ' "$tmp/srun.out" || fail "no 4-rank final line from srun's job"
  tandemrun_reference 20
  t2=$(date +%s.%N)
  same_run "$tmp/srun.jsonl" "$tmp/srun.out" "$tmp/tr.jsonl" "$tmp/tr.out" "srun against tandemrun"
  # An odd layout, 5 ranks on 3 nodes (SLURM_STEP_TASKS_PER_NODE="2(x2),1"),
  # against tandemrun with the same hosts and slots.
  slurm_run timeout 60 srun -N3 -n5 "$GPT" $ARGS --steps 10 --metrics "$tmp/srun5.jsonl" >"$tmp/srun5.out" 2>&1 ||
    fail "srun -N3 -n5 exited $?"
  grep -q 'world=5 ' "$tmp/srun5.out" || fail "no 5-rank final line from srun -N3 -n5"
  slurm_run timeout 60 "$RUN" -np 5 -H 10.77.17.1:2,10.77.17.2:2,10.77.17.3:1 "$GPT" $ARGS --steps 10 \
    --metrics "$tmp/tr5.jsonl" >"$tmp/tr5.out" 2>&1 || fail "the 5-rank tandemrun job failed (exit $?)"
  same_run "$tmp/srun5.jsonl" "$tmp/srun5.out" "$tmp/tr5.jsonl" "$tmp/tr5.out" "srun -N3 -n5 against tandemrun"
  # One node: the store on the rank's own node, reached by its name.
  slurm_run timeout 60 srun -N1 -n2 -w n3 "$GPT" $ARGS --steps 3 >"$tmp/srun1.out" 2>&1 || fail "srun -N1 -n2 exited $?"
  grep -q 'world=2 ' "$tmp/srun1.out" || fail "no 2-rank final line from srun -N1 -n2"
  no_job_left
  echo "PASS(slurm srun): srun -N2 --ntasks-per-node=2: 20 steps bit for bit as tandemrun -np 4 -H n1:2,n2:2" \
    "($(final_line "$tmp/srun.out" | cut -d' ' -f1); also -N3 -n5 against -H n1:2,n2:2,n3:1; -N1 -n2 runs; srun $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f", b-a}') s," \
    "tandemrun $(awk -v a="$t1" -v b="$t2" 'BEGIN{printf "%.2f", b-a}') s)"
  ;;
sbatch)
  job=$(slurm_run sbatch --parsable --output="$tmp/job-%j.out" --export=ALL,BUILD_DIR="$root/$B",SAVE_EVERY=10 \
    "$root/examples/slurm/train-gpt.sbatch" $ARGS --steps 20 --metrics "$tmp/sbatch.jsonl") || fail "sbatch refused the job"
  wait_state "$job" COMPLETED 60 || fail "job $job is $(job_state "$job"), not COMPLETED within 60 s"
  tandemrun_reference 20
  same_run "$tmp/sbatch.jsonl" "$tmp/job-$job.out" "$tmp/tr.jsonl" "$tmp/tr.out" "sbatch against tandemrun"
  [ -d "$tmp/ckpt-$job/step-20" ] || fail "no checkpoint ckpt-$job/step-20 from the job"
  # A batch script that runs the program itself, not through srun: refused
  # at once (it would wait for 3 ranks that nobody starts).
  printf '#!/bin/bash\nexec %s %s --steps 5\n' "$GPT" "$ARGS" >"$tmp/direct.sh"
  job2=$(slurm_run sbatch --parsable -N2 --ntasks-per-node=2 --output="$tmp/direct-%j.out" "$tmp/direct.sh") ||
    fail "sbatch refused the direct job"
  wait_state "$job2" FAILED 30 || fail "the batch script running train-gpt without srun is $(job_state "$job2"), not FAILED within 30 s"
  grep -q "no SLURM_STEP_ID: it is the batch script of job $job2, not one of 4 tasks" "$tmp/direct-$job2.out" ||
    fail "the direct job's output does not say that it is the batch script"
  echo "PASS(slurm sbatch): examples/slurm/train-gpt.sbatch completed, bit for bit as tandemrun ($(final_line "$tmp/job-$job.out" | cut -d' ' -f1)); train-gpt run in a batch script without srun refused naming it"
  ;;
kill)
  # 1. One task, rank 2 on n2, killed with SIGKILL (as the OOM killer or a
  # stray `kill -9` would): the others notice and stop, naming it.
  start_srun kill
  victim=
  for pid in $(gpt_on n2); do tr '\0' '\n' <"/proc/$pid/environ" | grep -qx SLURM_PROCID=2 && victim=$pid; done
  [ -n "$victim" ] || fail "no rank 2 (SLURM_PROCID=2) among n2's train-gpt processes: $(gpt_on n2)"
  t0=$(date +%s.%N)
  kill -KILL "$victim"
  wait_srun 30
  dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
  [ $rc = 124 ] && fail "srun still runs 30 s after rank 2 died: the job hangs"
  [ $rc != 0 ] || fail "srun exited 0 although rank 2 was killed"
  rc1=$rc
  awk -v d="$dt" 'BEGIN{exit !(d < 20)}' || fail "the job took $dt s to end after rank 2 died (bound 20 s)"
  grep -Eq 'rank 2\b' "$tmp/kill.out" || fail "no surviving rank named rank 2"
  no_job_left
  named=$(grep -Em1 'rank 2\b' "$tmp/kill.out")
  # 2. scancel --signal=KILL of the running job's step: every task dies, srun ends.
  start_srun kill2
  job=$(slurm_run squeue -h -o %i | head -1)
  [ -n "$job" ] || fail "squeue lists no running job"
  t0=$(date +%s.%N)
  slurm_run scancel --signal=KILL "$job.0" || fail "scancel --signal=KILL $job.0 failed"
  wait_srun 30
  dt2=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
  [ $rc = 124 ] && fail "srun still runs 30 s after scancel --signal=KILL: the step hangs"
  [ $rc != 0 ] || fail "srun exited 0 after scancel --signal=KILL"
  awk -v d="$dt2" 'BEGIN{exit !(d < 20)}' || fail "the step took $dt2 s to end after scancel (bound 20 s)"
  no_job_left
  echo "PASS(slurm kill): rank 2 killed on n2: srun exited $rc1 after $dt s, named: '$named'; scancel --signal=KILL: ended in $dt2 s; no task left"
  ;;
requeue)
  # The job with --requeue (the example script's), checkpointing every 5
  # steps and keeping 2; node n1, which runs the batch script and ranks 0
  # and 1, dies at once (its PID namespace's init killed) after the first
  # checkpoint at step >= 10 is seen. (Waiting for step-10 itself failed on
  # a quiet machine: 100 steps/s, so --keep-last 2 had removed it before a
  # 0.1 s poll looked, and the whole job took 2 s.)
  steps=400
  job=$(slurm_run sbatch --parsable --output="$tmp/job-%j.out" --export=ALL,BUILD_DIR="$root/$B",SAVE_EVERY=5,CKPT="$tmp/ckpt" \
    "$root/examples/slurm/train-gpt.sbatch" $ARGS --steps $steps --metrics "$tmp/requeue.jsonl") || fail "sbatch refused the job"
  ck=0
  for _ in $(seq 1 1500); do
    ck=$(ls "$tmp/ckpt" 2>/dev/null | sed -n 's/^step-\([0-9]*\)$/\1/p' | sort -n | tail -1)
    [ "${ck:-0}" -ge 10 ] && break
    sleep 0.02
  done
  [ "${ck:-0}" -ge 10 ] || fail "job $job wrote no checkpoint at step >= 10 within 30 s"
  [ "$ck" -lt $steps ] || fail "job $job ended (step-$ck) before node n1 could be killed"
  slurm_node_kill n1
  t0=$(date +%s.%N)
  wait_state "$job" COMPLETED 90 || fail "job $job is $(job_state "$job"), not COMPLETED within 90 s of node n1's death"
  dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
  info=$(slurm_run scontrol show job "$job")
  restarts=$(echo "$info" | grep -Eo 'Restarts=[0-9]+' | cut -d= -f2)
  [ "${restarts:-0}" -ge 1 ] || fail "job $job completed without a restart (Restarts=$restarts)"
  grep -q "resumes from $tmp/ckpt" "$tmp/job-$job.out" || fail "the requeued job did not resume from the checkpoint"
  # The uninterrupted run: the same job on n2 and n3 from the start.
  slurm_run timeout 90 srun -N2 --ntasks-per-node=2 -w n2,n3 "$GPT" $ARGS --steps $steps --metrics "$tmp/ref.jsonl" \
    --save "$tmp/ref" --save-every $steps >"$tmp/ref.out" 2>&1 || fail "the uninterrupted run failed (exit $?)"
  numbers "$tmp/ref.jsonl" >"$tmp/ref.num"
  numbers "$tmp/requeue.jsonl" | sort -u >"$tmp/requeue.num"
  [ "$(wc -l <"$tmp/ref.num")" = $steps ] || fail "the uninterrupted run has $(wc -l <"$tmp/ref.num") step lines, not $steps"
  extra=$(sort "$tmp/ref.num" | comm -13 - "$tmp/requeue.num")
  [ -z "$extra" ] || fail "step lines of the requeued job that the uninterrupted run does not have: $(echo "$extra" | head -3)"
  grep -q "^$steps " "$tmp/requeue.num" || fail "the requeued job has no step $steps line"
  [ "$(final_line "$tmp/ref.out")" = "$(grep 'final_loss=' "$tmp/job-$job.out" | tail -1 | grep -Eo '(final_loss|steps|world|params|global_batch)=[^ ]+' | tr '\n' ' ')" ] ||
    fail "final lines differ: $(final_line "$tmp/ref.out") vs $(grep 'final_loss=' "$tmp/job-$job.out" | tail -1)"
  # Every file but "visible", the random token of each save (checkpoint/save.c).
  diff -r -x visible "$tmp/ref/step-$steps" "$tmp/ckpt/step-$steps" >/dev/null ||
    fail "the final checkpoints differ: $(diff -rq -x visible "$tmp/ref/step-$steps" "$tmp/ckpt/step-$steps" | head -3)"
  echo "PASS(slurm requeue): node n1 killed after the step-$ck checkpoint; job $job requeued (Restarts=$restarts)," \
    "completed $dt s later on $(echo "$info" | grep -Eo ' NodeList=[^ ]+' | cut -d= -f2); steps and final checkpoint bit for bit as the uninterrupted run's"
  ;;
*)
  fail "unknown case '$case_name' (srun, sbatch, kill, requeue)"
  ;;
esac
