#!/usr/bin/env bash
# ZeRO stages side by side: Tandem's stages 0-3 against PyTorch's DDP,
# ZeroRedundancyOptimizer and FSDP (bench/zero_peer.py, the GPT of
# ../shared/peers/torch_gpt_ddp.py). Writes bench/results/zero-<date>.md.
#
#   bench/zero.sh [--rounds N] [--steps N] [--big-steps N] [--budget-mib M] [--no-search]
#
# 1. Throughput: the GPT reference configuration (4 layers, 256 channels,
#    4 heads, sequence 128, micro-batch 8 per rank, AdamW) on 2 ranks x 1
#    thread at stages 0, 1, 2, 3 and the torch peers, interleaved round by
#    round; medians; ratios to stage 0 (targets: stages 1-2 >= 0.97, stage
#    3 >= 0.85).
# 2. A larger GPT (12 layers, 768 channels, 12 heads; sequence 64,
#    micro-batch 1 so that a step takes seconds on this machine) on 2 and 4
#    ranks at each stage: tokens/s, peak RSS per rank (max over ranks,
#    /usr/bin/time), model_state_bytes_per_rank= (measured by the trainer)
#    and the estimate (--estimate-memory).
# 3. The largest GPT (768 channels, growing layers) that trains 3 steps on 2
#    ranks at stage 0 and at stage 3 within a per-rank RSS budget (default
#    2048 MiB: the machine is shared by several users, so the search must not
#    take all of its memory). The estimate picks the candidate, a run
#    confirms it (measured peak RSS <= budget), else one layer less.
set -u
cd "$(dirname "$0")/.."
rounds=3; steps=20; big_steps=3; budget=2048; search=1
while [ $# -gt 0 ]; do
  case "$1" in
  --rounds) rounds=$2; shift 2 ;;
  --steps) steps=$2; shift 2 ;;
  --big-steps) big_steps=$2; shift 2 ;;
  --budget-mib) budget=$2; shift 2 ;;
  --no-search) search=0; shift ;;
  *) echo "usage: bench/zero.sh [--rounds N] [--steps N] [--big-steps N] [--budget-mib M] [--no-search]" >&2; exit 2 ;;
  esac
done
B=${BUILD:-build}
RUN="$B/bin/tandemrun"
GPT="$B/bin/train-gpt"
PY=/usr/bin/python3
PEER=bench/zero_peer.py
make -j2 --no-print-directory BUILD="$B" all >/dev/null || { echo "bench/zero.sh: build of $B failed" >&2; exit 1; }
export TANDEM_PROGRESS=off
date_tag=$(date +%Y-%m-%d)
out=bench/results/zero-$date_tag.md
mkdir -p bench/results
log=$(mktemp /tmp/tandem-bench-zero-XXXXXX)
trap 'rm -f "$log" /tmp/tandem-bench-zero-rss.*' EXIT

value() { grep -o "$1=[^ ]*" | head -1 | cut -d= -f2; }
median() { sort -g | awk '{ a[NR] = $1 } END { if (NR == 0) { print "nan"; exit } if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
have_torch=1
"$PY" -c 'import torch; from torch.distributed.optim import ZeroRedundancyOptimizer' 2>/dev/null || have_torch=0
fsdp_error=$("$PY" -c 'from torch.distributed.fsdp import FullyShardedDataParallel' 2>&1 | tail -1)
fsdp_ok=0; [ -z "$fsdp_error" ] && fsdp_ok=1
load_before=$(cut -d' ' -f1-3 /proc/loadavg)

# Peak RSS of every rank: each rank runs under /usr/bin/time writing its own file.
rss_run() { # NP ARGS... -> prints the train-gpt summary line plus peak_rss_mib=MAX
  local np=$1; shift
  rm -f /tmp/tandem-bench-zero-rss.*
  local line
  # sh -c gives each rank its own file name ($$: that rank's shell)
  line=$("$RUN" -np "$np" sh -c '/usr/bin/time -o /tmp/tandem-bench-zero-rss.$$ -f %M "$@"' sh "$GPT" "$@" 2>>"$log" |
    grep final_loss)
  local kb
  kb=$(cat /tmp/tandem-bench-zero-rss.* 2>/dev/null | sort -g | tail -1)
  echo "$line peak_rss_mib=$(awk -v k="${kb:-0}" 'BEGIN { printf "%.0f", k / 1024 }')"
}

# ---- 0. losses of stages 1-3 against stage 0, 50 steps, 1-4 ranks ----
# tests/zero/test_zero.c compares every step's loss, gradient norm and all
# parameters bit for bit (memcmp); here for 50 steps instead of the suite's 6.
equal_rows=""
for np in 1 2 3 4; do
  echo "losses: 50 steps on $np ranks" >&2
  if "$RUN" -np "$np" "$B/tests/test_zero" equal 1 adamw 1 50 >>"$log" 2>&1; then r="equal bit for bit"; else r="DIFFERENT (see the log)"; fi
  equal_rows+="| $np | $r |"$'\n'
done

# ---- 1. throughput, reference configuration, 2 ranks ----
declare -A runs
for ((r = 1; r <= rounds; r++)); do
  echo "round $r/$rounds" >&2
  for st in 0 1 2 3; do
    t=$("$RUN" -np 2 "$GPT" --threads 1 --steps "$steps" --sample 0 --zero-stage $st 2>>"$log" | value tokens_per_s)
    runs[s$st]+="$t "
    echo "  tandem stage $st: $t tokens/s" >&2
  done
  if [ $have_torch = 1 ]; then
    for mode in ddp zero; do
      t=$("$PY" "$PEER" $mode 2 1 4 256 4 128 8 10 2>>"$log" | value tokens_per_s)
      runs[$mode]+="$t "
      echo "  torch $mode: $t tokens/s" >&2
    done
  fi
done
med() { echo "${runs[$1]:-}" | tr ' ' '\n' | grep -v '^$' | median; }
s0=$(med s0); s1=$(med s1); s2=$(med s2); s3=$(med s3); pd=$(med ddp); pz=$(med zero)

# ---- 2. larger GPT, 2 and 4 ranks ----
BIG="--layers 12 --channels 768 --heads 12 --seq 64 --micro-batch 1 --threads 1 --sample 0"
big_rows=""
for np in 2 4; do
  est=$("$RUN" -np "$np" "$GPT" $BIG --estimate-memory 2>>"$log" | sed 's/^\[0\] //')
  for st in 0 1 2 3; do
    echo "larger GPT: $np ranks, stage $st" >&2
    line=$(rss_run "$np" $BIG --steps "$big_steps" --zero-stage $st)
    e=$(echo "$est" | grep "^stage=$st " | value model_state_bytes)
    ms=$(echo "$line" | value model_state_bytes_per_rank)
    big_rows+="| $np | $st | $(echo "$line" | value tokens_per_s) | $(echo "$line" | value peak_rss_mib) | $(awk -v b="${ms:-0}" 'BEGIN { printf "%.0f", b / 1048576 }') | $(awk -v b="${e:-0}" 'BEGIN { printf "%.0f", b / 1048576 }') | $(ratio "${ms:-0}" "${e:-0}") |"$'\n'
  done
done
big_params=$(echo "$est" | head -1 | value params)
peer_big=""
if [ $have_torch = 1 ]; then
  for mode in ddp zero; do
    echo "larger GPT: torch $mode, 2 ranks" >&2
    l=$("$PY" "$PEER" $mode 2 1 12 768 12 64 1 "$big_steps" 2>>"$log")
    peer_big+="| torch $mode | 2 | $(echo "$l" | value tokens_per_s) | $(echo "$l" | value peak_rss_mib) |"$'\n'
  done
fi

# ---- 3. largest GPT within the RSS budget, 2 ranks, stage 0 vs 3 ----
search_rows=""
if [ $search = 1 ]; then
  SEARCH="--channels 768 --heads 12 --seq 64 --micro-batch 1 --threads 1 --sample 0"
  for st in 0 3; do
    # the estimate (model states + activations) picks the first candidate
    L=1
    while :; do
      tot=$("$RUN" -np 2 "$GPT" $SEARCH --layers $((L + 1)) --estimate-memory 2>>"$log" | grep "stage=$st " | value total)
      awk -v t="$tot" -v b="$budget" 'BEGIN { exit !(t + 60 <= b) }' || break # + ~60 MiB of program and libraries
      L=$((L + 1))
      [ $L -ge 200 ] && break
    done
    while [ $L -ge 1 ]; do
      echo "search: stage $st, $L layers" >&2
      line=$(rss_run 2 $SEARCH --layers $L --steps 3 --zero-stage $st)
      rss=$(echo "$line" | value peak_rss_mib)
      if [ -n "$(echo "$line" | value final_loss)" ] && [ "${rss:-999999}" -le "$budget" ]; then break; fi
      L=$((L - 1))
    done
    search_rows+="| $st | $L | $(echo "$line" | value params) | $(echo "$line" | value peak_rss_mib) |"$'\n'
    eval "largest_$st=$(echo "$line" | value params)"
  done
fi
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
{
  echo "# ZeRO stages: Tandem vs PyTorch — $date_tag"
  echo
  echo "Machine: $cpu, $(nproc) cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo), kernel $(uname -r)."
  echo "Load average before / after: $load_before / $load_after (the machine is shared; figures move with it)."
  echo "Tandem $(git rev-parse --short HEAD 2>/dev/null); PyTorch $("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null) (python3-torch), gloo."
  echo "Command: bench/zero.sh --rounds $rounds --steps $steps --big-steps $big_steps --budget-mib $budget"
  echo
  echo "## Same losses: stages 1-3 against stage 0, 50 steps"
  echo
  echo "tests/zero/test_zero equal 1 adamw 1 50: GPT with a tied embedding, 35 channels, odd parameter count,"
  echo "gradient clipping active, global batch 12; every step's loss and gradient norm and every parameter after"
  echo "it compared with memcmp (stage 3: gathered)."
  echo
  echo "| ranks | stages 1, 2, 3 vs 0 |"
  echo "|---|---|"
  printf '%s' "$equal_rows"
  echo
  echo "## Reference configuration, 2 ranks x 1 thread"
  echo
  echo "4 layers, 256 channels, 4 heads, sequence 128, micro-batch 8 per rank, AdamW, fp32; $steps steps per"
  echo "Tandem run, 10 per torch run, first 2 left out. Median of $rounds interleaved rounds (tokens/s, all ranks)."
  echo
  echo "| run | tokens/s | / stage 0 | target |"
  echo "|---|---|---|---|"
  echo "| Tandem stage 0 | $s0 | 1.00 | |"
  echo "| Tandem stage 1 | $s1 | $(ratio "$s1" "$s0") | >= 0.97 |"
  echo "| Tandem stage 2 | $s2 | $(ratio "$s2" "$s0") | >= 0.97 |"
  echo "| Tandem stage 3 | $s3 | $(ratio "$s3" "$s0") | >= 0.85 |"
  echo "| torch DDP | $pd | $(ratio "$pd" "$s0") | |"
  echo "| torch DDP + ZeroRedundancyOptimizer | $pz | $(ratio "$pz" "$s0") | |"
  echo
  echo "All rounds: stage 0: ${runs[s0]:-}; 1: ${runs[s1]:-}; 2: ${runs[s2]:-}; 3: ${runs[s3]:-}; torch ddp: ${runs[ddp]:-}; torch zero: ${runs[zero]:-}"
  echo
  if [ $fsdp_ok = 1 ]; then echo "FSDP importable (not run here)."; else
    echo "PyTorch FSDP (FULL_SHARD) cannot run with Debian's torch 1.13 on Python 3.11: importing"
    echo "torch.distributed.fsdp fails with \`$fsdp_error\`."; fi
  echo
  echo "## Larger GPT: 12 layers, 768 channels, 12 heads ($big_params parameters), sequence 64, micro-batch 1"
  echo
  echo "$big_steps steps per run (tokens/s over the steps after the first 2). Peak RSS: max over ranks of"
  echo "/usr/bin/time's maximum resident set. Model states: the trainer's model_state_bytes_per_rank= (measured"
  echo "resident pages of parameters and gradients plus optimizer state) and the --estimate-memory figure."
  echo
  echo "| ranks | stage | tokens/s | peak RSS MiB | model states MiB (measured) | estimate MiB | measured / estimate |"
  echo "|---|---|---|---|---|---|---|"
  printf '%s' "$big_rows"
  echo
  if [ -n "$peer_big" ]; then
    echo "| peer | ranks | tokens/s | peak RSS MiB |"
    echo "|---|---|---|---|"
    printf '%s' "$peer_big"
    echo
  fi
  if [ $search = 1 ]; then
    echo "## Largest GPT (768 channels, L layers) training 3 steps on 2 ranks within $budget MiB RSS per rank"
    echo
    echo "| stage | layers | parameters | peak RSS MiB |"
    echo "|---|---|---|---|"
    printf '%s' "$search_rows"
    echo
    echo "Stage 3 / stage 0 parameters: $(ratio "${largest_3:-0}" "${largest_0:-0}") (target >= 1.8)"
  fi
} >"$out"
cat "$out"
echo "bench/zero.sh: wrote $out" >&2
