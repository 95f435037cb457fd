#!/usr/bin/env bash
# Pipeline and tensor parallelism against data parallelism (issue 21):
# tokens/s of every layout at one global batch, and each pipeline stage's
# measured idle fraction against the 1F1B bubble (p-1)/(m+p-1). Writes
# bench/results/pipeline-<date>[-TAG].md.
#
#   bench/pipeline.sh [--rounds N] [--steps N] [--idle-steps N] [--tag TAG]
#                     [--part all|throughput2|throughput4|idle|partition] [--ab VAR=VALUE]
#                     [--stages "2 4"]   (partition: the pipeline sizes to run)
#
# --ab VAR=VALUE: every pipeline run is made twice in each round, as the
# environment is and then with VAR=VALUE (e.g. TANDEM_P2P_UNEXPECTED_BYTES=0,
# no unexpected frames held), the two alternating under the same load; the
# tables have a row for each.
#
# The GPT reference configuration (4 layers, 256 channels, 4 heads, sequence
# 128; AdamW), one thread per rank, micro-batches of 4 sequences everywhere.
# 1. throughput2: 2 ranks at a global batch of 32 sequences: DP=2 (accum 4),
#    TP=2 (accum 8), PP=2 1F1B and interleaved x2 (m = 8). Targets: TP=2 >=
#    0.85x DP=2, PP=2 >= 0.8x.
#    throughput4: 4 ranks (twice the processes of the cores here) at the same
#    global batch: DP=4, TP=2 x DP=2, PP=2 x DP=2 (m=4), TP=2 x PP=2 (m=8),
#    TP=4, PP=4 (m=8), pipelines 1F1B.
#    Rounds interleave the layouts (A B C A B C ...); the table gives each
#    layout's median of train-gpt's tokens_per_s (steps after the first two)
#    and the per-round ratios to the round's data-parallel run.
# 2. idle: PP=2 1F1B, PP=2 interleaved (2 chunks) and PP=4 1F1B (the 4 layers
#    do not cut into 4 x 2 chunks) at m = 4, 8, 16, rounds interleaved; each
#    rank's `pipeline ... idle_fraction=` (1 - (forward + backward) / step
#    time, over the steps after the first), median over the rounds, against
#    (p-1)/(m+p-1) and, for the interleaved schedule, (p-1)/(v m+p-1), and
#    against the same closed form with the run's measured stage imbalance:
#    with C_s a stage's forward + backward seconds and C_max the slowest
#    stage's, the schedule at best takes (m + (p-1)/v) micro-batch slots of
#    the slowest stage, so stage s idles 1 - m C_s / ((m + (p-1)/v) C_max)
#    (equal stages: the closed forms; an upper bound, pipeline_schedule
#    checks it), and against the engine's own schedule replayed on the
#    test's simulator with the run's measured forward and backward times
#    per stage and free transfers (test_pipeline_schedule's `sim` mode):
#    what these stage times allow at best. What is above that is transfers,
#    the engine's own time and waiting for a core.
# 3. partition (not in `all`): a GPT whose head outweighs a block (8 layers,
#    vocab 8192, otherwise the reference: the head's V x C product is 2.56
#    blocks in partition.c's model), PP=2 and PP=4 1F1B at m = 8, cut by
#    partition_method uniform, parameters and compute; rounds alternate the
#    order (A B C, C B A, ...). Per stage: its layers, forward + backward
#    seconds per step (C_s) against the model's share (its blocks' and
#    head's flops), idle; per layout: the step's seconds (the slowest
#    rank's step_s per step, the pipeline's wall time), tokens/s and rank
#    0's CPU ms per step. --rounds 3 at --idle-steps 3 is ~4 minutes quiet.
#
# The load of other users on the machine stretches every figure; the load
# average is recorded per round. With more ranks than cores (4 ranks on 2
# cores) a stage also waits for a core, which counts as idle here. Each part
# alone keeps a bench-lane use under about 10 minutes at --steps 4 on a quiet
# 2-core machine.
set -u
cd "$(dirname "$0")/.."
rounds=3; steps=4; idle_steps=3; tag=""; part=all; ab=""; stages="2 4"
usage() { echo "usage: bench/pipeline.sh [--rounds N] [--steps N] [--idle-steps N] [--tag TAG] [--part all|throughput2|throughput4|idle|partition] [--ab VAR=VALUE] [--stages \"2 4\"]" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
  --rounds) rounds=$2; shift 2 ;;
  --steps) steps=$2; shift 2 ;;
  --idle-steps) idle_steps=$2; shift 2 ;;
  --stages) stages=$2; shift 2 ;;
  --tag) tag="-$2"; shift 2 ;;
  --part) part=$2; shift 2 ;;
  --ab) ab=$2; shift 2 ;;
  *) usage ;;
  esac
done
case "$part" in all|throughput2|throughput4|idle|partition) ;; *) usage ;; esac
[ -z "$ab" ] || [[ "$ab" == [A-Z_]*=* ]] || { echo "bench/pipeline.sh: --ab takes VAR=VALUE, not $ab" >&2; exit 2; }
[ "$steps" -ge 3 ] || { echo "bench/pipeline.sh: --steps must be at least 3 (tokens/s leaves out the first 2)" >&2; exit 2; }
[ "$idle_steps" -ge 2 ] || { echo "bench/pipeline.sh: --idle-steps must be at least 2 (idle leaves out the first)" >&2; exit 2; }
B=${BUILD:-build}
RUN="$B/bin/tandemrun"
GPT="$B/bin/train-gpt"
SIM="$B/tests/test_pipeline_schedule" # its `sim` mode: the schedule with measured stage times (idle)
make -j2 --no-print-directory BUILD="$B" "$RUN" "$GPT" "$SIM" >/dev/null || { echo "bench/pipeline.sh: build of $B failed" >&2; exit 1; }
export TANDEM_PROGRESS=off
out=bench/results/pipeline-$(date +%Y-%m-%d)$tag.md
mkdir -p bench/results
log=$(mktemp /tmp/tandem-bench-pipeline-XXXXXX)
trap 'rm -f "$log" "$log.cpu"' EXIT

value() { grep -o "$1=[^ ]*" | head -1 | cut -d= -f2; }
median() { sort -g | awk '{ a[NR] = $1 } END { if (NR == 0) { print "nan"; exit } if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
load() { cut -d' ' -f1 /proc/loadavg; }
# sim_of P V M FORWARD_FIELD BACKWARD_FIELD: the engine's schedule on the simulator with the stage
# times of $log's pipeline lines (per chunk and micro-batch, microseconds), transfers free
sim_of() {
  local args
  args=$(grep "pipeline rank=" "$log" | while read -r line; do
    echo "$(value stage <<<"$line") $(value "$4" <<<"$line") $(value "$5" <<<"$line") $(value steps <<<"$line")"
  done | sort -n | awk -v m="$3" -v v="$2" '{ d = $4 * m * v; printf " %d %d", $2 / d * 1e6, $3 / d * 1e6 }')
  # shellcheck disable=SC2086
  "$SIM" sim "$1" "$2" "$3" $args || { echo "bench/pipeline.sh: $SIM sim $1 $2 $3$args failed" >&2; return 1; }
}
ref="--layers 4 --channels 256 --heads 4 --seq 128 --threads 1 --sample 0 --micro-batch 4"

{
  echo "# Pipeline and tensor parallelism — $(date +%Y-%m-%d) ($part)"
  echo
  echo "Machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), shared; load average $(cut -d' ' -f1-3 /proc/loadavg) at the start ($(date -u +%H:%MZ))."
  echo "Command: \`bench/pipeline.sh --part $part --rounds $rounds --steps $steps --idle-steps $idle_steps${ab:+ --ab $ab}$([ "$part" = partition ] && echo " --stages \"$stages\"")\` (build: $B, git $(git rev-parse --short HEAD 2>/dev/null))."
  [ -z "$ab" ] || echo "Each pipeline run twice per round, alternating: as the environment is, then with $ab (rows marked so)."
  if [ "$part" = partition ]; then
    echo "The reference GPT with 8 layers and a vocabulary of 8192 (256 channels, 4 heads, sequence 128, AdamW), 1 thread per rank, micro-batches of 4 sequences."
  else
    echo "Reference GPT (4 layers, 256 channels, 4 heads, sequence 128, AdamW), 1 thread per rank, micro-batches of 4 sequences."
  fi
} >"$out"

# throughput SET_NAME LAYOUTS...: LAYOUTS are "name|ranks|flags", the first the baseline
throughput() {
  local title=$1; shift
  local -a layouts=("$@")
  local -A tps=()
  local loads="" per_round=""
  for r in $(seq 1 "$rounds"); do
    loads+=" $(load)"
    local base="" line="| $r | $(load) |"
    for l in "${layouts[@]}"; do
      IFS='|' read -r name np flags envs <<<"$l"
      # shellcheck disable=SC2086
      if ! env ${envs:+"$envs"} timeout 900 "$RUN" -np "$np" "$GPT" $ref --steps "$steps" $flags >"$log" 2>&1; then
        echo "bench/pipeline.sh: $name failed:" >&2; tail -5 "$log" >&2; exit 1
      fi
      local t
      t=$(grep "final_loss=" "$log" | value tokens_per_s)
      tps[$name]="${tps[$name]:-} $t"
      [ -n "$base" ] || base=$t
      line+=" $t ($(ratio "$t" "$base")) |"
      echo "round $r: $name: $t tokens/s" >&2
    done
    per_round+="$line"$'\n'
  done
  local base_m=""
  {
    echo
    echo "## $title"
    echo
    echo "| layout | ranks | flags | tokens/s (median of $rounds) | runs | median / ${layouts[0]%%|*} median |"
    echo "|---|---|---|---|---|---|"
    for l in "${layouts[@]}"; do
      IFS='|' read -r name np flags envs <<<"$l"
      local m
      m=$(tr ' ' '\n' <<<"${tps[$name]}" | grep . | median)
      [ -n "$base_m" ] || base_m=$m
      echo "| $name | $np | \`${envs:+$envs }$flags\` | $m | ${tps[$name]} | $(ratio "$m" "$base_m") |"
    done
    echo
    echo "Per round (tokens/s, and the ratio to the same round's ${layouts[0]%%|*}); load average (1 min) at each round's start:"
    echo
    printf '| round | load |'; for l in "${layouts[@]}"; do printf ' %s |' "${l%%|*}"; done; echo
    printf '|---|---|'; for l in "${layouts[@]}"; do printf -- '---|'; done; echo
    printf '%s' "$per_round"
  } >>"$out"
}

# with_ab LAYOUT...: each pipeline layout, then (--ab) the same with the variable set
with_ab() {
  for l in "$@"; do
    echo "$l"
    if [ -n "$ab" ] && [[ "$l" == *pipeline-parallel* ]]; then
      IFS='|' read -r name np flags <<<"$l"
      echo "$name ${ab}|$np|$flags|$ab"
    fi
  done
}
if [ "$part" = all ] || [ "$part" = throughput2 ]; then
  mapfile -t t2 < <(with_ab "DP=2|2|--grad-accum 4" \
    "TP=2|2|--grad-accum 8 --tensor-parallel 2" \
    "PP=2 1f1b m=8|2|--grad-accum 8 --pipeline-parallel 2" \
    "PP=2 interleaved x2 m=8|2|--grad-accum 8 --pipeline-parallel 2 --pipeline-schedule interleaved --pipeline-chunks 2")
  throughput "Tokens/s on 2 ranks at a global batch of 32 sequences" "${t2[@]}"
fi
if [ "$part" = all ] || [ "$part" = throughput4 ]; then
  mapfile -t t4 < <(with_ab "DP=4|4|--grad-accum 2" \
    "TP=2 x DP=2|4|--grad-accum 4 --tensor-parallel 2" \
    "PP=2 x DP=2 m=4|4|--grad-accum 4 --pipeline-parallel 2" \
    "TP=2 x PP=2 m=8|4|--grad-accum 8 --tensor-parallel 2 --pipeline-parallel 2" \
    "TP=4|4|--grad-accum 8 --tensor-parallel 4" \
    "PP=4 m=8|4|--grad-accum 8 --pipeline-parallel 4")
  throughput "Tokens/s on 4 ranks at a global batch of 32 sequences (4 processes on the cores)" "${t4[@]}"
fi

if [ "$part" = all ] || [ "$part" = idle ]; then
  specs=("2|1f1b|1|" "2|interleaved|2|" "4|1f1b|1|") # 4 stages x 2 chunks needs 8 layers
  if [ -n "$ab" ]; then
    specs=("2|1f1b|1|" "2|1f1b|1|$ab" "2|interleaved|2|" "2|interleaved|2|$ab" "4|1f1b|1|" "4|1f1b|1|$ab")
  fi
  declare -A idle=() layers=() adjusted=() simulated=() simcpu=()
  loads=""
  for r in $(seq 1 "$rounds"); do
    loads+=" $(load)"
    for spec in "${specs[@]}"; do
      IFS='|' read -r p sched v envs <<<"$spec"
      for m in 4 8 16; do
        # shellcheck disable=SC2086
        if ! env ${envs:+"$envs"} TANDEM_TIMEOUT=${TANDEM_TIMEOUT:-120} timeout 900 "$RUN" -np "$p" "$GPT" $ref --steps "$idle_steps" \
            --grad-accum "$m" --pipeline-parallel "$p" --pipeline-schedule "$sched" --pipeline-chunks "$v" >"$log" 2>&1; then
          echo "bench/pipeline.sh: p=$p $sched m=$m $envs failed:" >&2; tail -3 "$log" >&2; exit 1
        fi
        cmax=$(grep "pipeline rank=" "$log" | while read -r line; do
          awk -v f="$(value forward_s <<<"$line")" -v b="$(value backward_s <<<"$line")" 'BEGIN { print f + b }'
        done | sort -g | tail -1)
        # the engine's schedule on the simulator with this run's stage times, transfers free: what the
        # stages allow at best, from their wall seconds and from their CPU seconds (which load stretches less)
        sim=$(sim_of "$p" "$v" "$m" forward_s backward_s) || exit 1
        simc=$(sim_of "$p" "$v" "$m" forward_cpu_s backward_cpu_s) || exit 1
        while read -r line; do
          s=$(value stage <<<"$line")
          simulated[$spec|$m|$s]="${simulated[$spec|$m|$s]:-} $(grep "^stage $s idle" <<<"$sim" | cut -d' ' -f4)"
          simcpu[$spec|$m|$s]="${simcpu[$spec|$m|$s]:-} $(grep "^stage $s idle" <<<"$simc" | cut -d' ' -f4)"
          idle[$spec|$m|$s]="${idle[$spec|$m|$s]:-} $(value idle_fraction <<<"$line")"
          layers[$spec|$m|$s]=$(value layers <<<"$line")
          adj=$(awk -v f="$(value forward_s <<<"$line")" -v b="$(value backward_s <<<"$line")" -v c="$cmax" \
            -v m="$m" -v p="$p" -v v="$v" 'BEGIN { printf "%.4f", (c > 0 ? 1 - m * (f + b) / ((m + (p - 1) / v) * c) : 0) }')
          adjusted[$spec|$m|$s]="${adjusted[$spec|$m|$s]:-} $adj"
        done < <(grep "pipeline rank=" "$log")
        echo "round $r: idle p=$p $sched m=$m $envs done" >&2
      done
    done
  done
  {
    echo
    echo "## Idle fraction per stage (median of $rounds interleaved rounds, $idle_steps steps each)"
    echo
    echo "idle = 1 - (forward + backward) / step time, per rank, over the steps after the first; load average (1 min) at the rounds' starts:$loads."
    echo
    echo "The schedule with the measured stage times: \`$SIM sim P V M\` with each run's forward and backward per chunk and micro-batch on every stage, transfers free (the engine's action lists on the test's simulator), median over the runs; \"CPU\": the same with the stages' CPU seconds (forward_cpu_s, backward_cpu_s), which the load stretches less."
    echo
    echo "| layout | m | stage | layers | idle (median) | runs | closed form | median / closed form | closed form with the measured imbalance (median) | median / that | the schedule with the measured stage times (median) | median / that | the same with CPU stage times (median) |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    for spec in "${specs[@]}"; do
      IFS='|' read -r p sched v envs <<<"$spec"
      for m in 4 8 16; do
        closed=$(awk -v p="$p" -v m="$m" -v v="$v" 'BEGIN { printf "%.4f", (p - 1) / (v * m + p - 1) }')
        for s in $(seq 0 $((p - 1))); do
          med=$(tr ' ' '\n' <<<"${idle[$spec|$m|$s]:-}" | grep . | median)
          adj=$(tr ' ' '\n' <<<"${adjusted[$spec|$m|$s]:-}" | grep . | median)
          simm=$(tr ' ' '\n' <<<"${simulated[$spec|$m|$s]:-}" | grep . | median)
          simcm=$(tr ' ' '\n' <<<"${simcpu[$spec|$m|$s]:-}" | grep . | median)
          echo "| PP=$p $sched$([ "$v" -gt 1 ] && echo " x$v")${envs:+ $envs} | $m | $s | ${layers[$spec|$m|$s]:-} | $med | ${idle[$spec|$m|$s]:-} | $closed | $(ratio "$med" "$closed") | $adj | $(ratio "$med" "$adj") | $simm | $(ratio "$med" "$simm") | $simcm |"
        done
      done
    done
  } >>"$out"
fi
if [ "$part" = partition ]; then
  heavy="--layers 8 --vocab 8192 --channels 256 --heads 4 --seq 128 --threads 1 --sample 0 --micro-batch 4"
  methods=(uniform parameters compute)
  declare -A st=() tp=() cpu=() lay=() cs=() ccs=() idl=() cst=()
  loads=""
  for r in $(seq 1 "$rounds"); do
    loads+=" $(load)"
    order=("${methods[@]}")
    [ $((r % 2)) -eq 0 ] && order=(compute parameters uniform)
    for p in $stages; do
      for meth in "${order[@]}"; do
        # shellcheck disable=SC2086
        if ! TANDEM_TIMEOUT=${TANDEM_TIMEOUT:-120} /usr/bin/time -f "job_cpu_s=%U+%S" -o "$log.cpu" timeout 900 "$RUN" -np "$p" \
            "$GPT" $heavy --steps "$idle_steps" --grad-accum 8 --pipeline-parallel "$p" --pipeline-partition "$meth" >"$log" 2>&1; then
          echo "bench/pipeline.sh: partition p=$p $meth failed:" >&2; tail -3 "$log" >&2; exit 1
        fi
        k="$p|$meth"
        worst=0
        while read -r line; do
          s=$(value stage <<<"$line"); n=$(value steps <<<"$line")
          lay[$k|$s]=$(value layers <<<"$line")
          cs[$k|$s]="${cs[$k|$s]:-} $(awk -v f="$(value forward_s <<<"$line")" -v b="$(value backward_s <<<"$line")" -v n="$n" 'BEGIN { printf "%.4f", (f + b) / n }')"
          ccs[$k|$s]="${ccs[$k|$s]:-} $(awk -v f="$(value forward_cpu_s <<<"$line")" -v b="$(value backward_cpu_s <<<"$line")" -v n="$n" 'BEGIN { printf "%.4f", (f + b) / n }')"
          idl[$k|$s]="${idl[$k|$s]:-} $(value idle_fraction <<<"$line")"
          worst=$(awk -v a="$worst" -v b="$(value step_s <<<"$line")" -v n="$n" 'BEGIN { x = b / n; printf "%.4f", (x > a ? x : a) }')
        done < <(grep "pipeline rank=" "$log")
        st[$k]="${st[$k]:-} $worst"
        # the step the stages' CPU seconds give on the schedule, transfers free (load stretches it less)
        simc=$(sim_of "$p" 1 8 forward_cpu_s backward_cpu_s) || exit 1
        cst[$k]="${cst[$k]:-} $(awk '/^stage 0 idle/ { gsub(/\)/, "", $NF); printf "%.4f", $NF / 1e6 }' <<<"$simc")"
        tp[$k]="${tp[$k]:-} $(grep "final_loss=" "$log" | value tokens_per_s)"
        cpu[$k]="${cpu[$k]:-} $(value job_cpu_s <"$log.cpu" | awk -F+ '{ printf "%.2f", $1 + $2 }')"
        echo "round $r: partition p=$p $meth: step ${worst}s" >&2
      done
    done
  done
  {
    echo
    echo "## Partition methods on a GPT whose head outweighs a block (median of $rounds rounds, $idle_steps steps each, the first left out)"
    echo
    echo "Flags: \`$heavy --grad-accum 8 --pipeline-parallel P --pipeline-partition METHOD\`; load average (1 min) at the rounds' starts:$loads."
    echo "The model's share: each stage's flops (partition.c: a block 3(24C^2 + 2C(T+1)), the head 3 x 2CV per token) over the heaviest stage's; measured: C_s (forward + backward seconds per step) over the largest C_s."
    echo
    echo "CPU step: the engine's schedule on the simulator (\`$SIM sim\`) with each stage's CPU seconds in forward and backward (forward_cpu_s, backward_cpu_s: the stages' own work, which the load stretches far less than their wall time), transfers free: the step those stages give on an idle machine. Measured share: C_s from CPU seconds over the largest."
    echo
    echo "| P | method | step s (median) | runs | step / uniform's | CPU step s (median) | runs | CPU step / uniform's | tokens/s (median) | the job's CPU s, all steps and start-up (median) | per stage: layers, C_s s wall (median), measured share, model's share, idle (median) |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|"
    for p in $stages; do
      base=$(tr ' ' '\n' <<<"${st[$p|uniform]}" | grep . | median)
      cbase=$(tr ' ' '\n' <<<"${cst[$p|uniform]}" | grep . | median)
      for meth in "${methods[@]}"; do
        k="$p|$meth"
        med=$(tr ' ' '\n' <<<"${st[$k]}" | grep . | median)
        cmed=$(tr ' ' '\n' <<<"${cst[$k]}" | grep . | median)
        cmax=0
        for s in $(seq 0 $((p - 1))); do
          c=$(tr ' ' '\n' <<<"${ccs[$k|$s]}" | grep . | median)
          cmax=$(awk -v a="$cmax" -v b="$c" 'BEGIN { print (b > a ? b : a) }')
        done
        # the model: blocks of the stage, and the head on the last
        wmax=0
        for s in $(seq 0 $((p - 1))); do
          w=$(awk -v r="${lay[$k|$s]}" -v last=$((s == p - 1)) 'BEGIN { split(r, a, "-"); C = 256; T = 128; V = 8192;
            printf "%.0f", (a[2] - a[1]) * 3 * (24 * C * C + 2 * C * (T + 1)) + (last ? 6 * C * V : 0) }')
          wmax=$(awk -v a="$wmax" -v b="$w" 'BEGIN { print (b > a ? b : a) }')
        done
        per_stage=""
        for s in $(seq 0 $((p - 1))); do
          c=$(tr ' ' '\n' <<<"${cs[$k|$s]}" | grep . | median)
          cc=$(tr ' ' '\n' <<<"${ccs[$k|$s]}" | grep . | median)
          w=$(awk -v r="${lay[$k|$s]}" -v last=$((s == p - 1)) 'BEGIN { split(r, a, "-"); C = 256; T = 128; V = 8192;
            printf "%.0f", (a[2] - a[1]) * 3 * (24 * C * C + 2 * C * (T + 1)) + (last ? 6 * C * V : 0) }')
          i=$(tr ' ' '\n' <<<"${idl[$k|$s]}" | grep . | median)
          per_stage+="$s: ${lay[$k|$s]}, $c, $(ratio "$cc" "$cmax"), $(ratio "$w" "$wmax"), $i; "
        done
        echo "| $p | $meth | $med | ${st[$k]} | $(ratio "$med" "$base") | $cmed | ${cst[$k]} | $(ratio "$cmed" "$cbase") | $(tr ' ' '\n' <<<"${tp[$k]}" | grep . | median) | $(tr ' ' '\n' <<<"${cpu[$k]}" | grep . | median) | ${per_stage%; } |"
      done
    done
  } >>"$out"
fi
echo >>"$out"
echo "Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg) ($(date -u +%H:%MZ))." >>"$out"
cat "$out"
