# Shared by tests/train/device_train.sh and device_zero.sh (sourced, with
# B and DEV set): the programs, a scratch directory removed on exit, a
# deterministic corpus, train-gpt's common flags, and the helpers run (a
# train-gpt or tandemrun command that must succeed) and losses (two
# metrics files' losses within a relative tolerance, step by step).
GPT="$B/bin/train-gpt"
RUN="$B/bin/tandemrun"
dir=$(mktemp -d /tmp/td-devtrain-XXXXXX) || exit 1
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAILED: $*"; exit 1; }
# a deterministic corpus of 6,000 bytes with some structure to learn
i=0
while [ $i -lt 120 ]; do
  printf 'the %d quick brown foxes jump over %d lazy dogs; ' $i $((i * 7 % 13))
  i=$((i + 1))
done >"$dir/corpus.txt"
COMMON="--data $dir/corpus.txt --layers 2 --channels 32 --heads 2 --seq 16 --steps 20 --lr 3e-3 --seed 7 --sample 0
        --threads 1"
export TANDEM_PROGRESS=off
# losses A B FIRST LAST WHAT [TOL]: compare the "loss" of steps FIRST..LAST of two metrics files
losses() {
  for f in "$1" "$2"; do
    n=$(sed -n "s/.*\"step\":\([0-9]*\),\"loss\":.*/\1/p" "$f" | awk -v a=$3 -v b=$4 '$1>=a && $1<=b' | wc -l)
    [ "$n" -eq $(($4 - $3 + 1)) ] || fail "$f has $n of the steps $3..$4: $(cat "$f")"
  done
  sed -n "s/.*\"step\":\([0-9]*\),\"loss\":\([^,}]*\).*/\1 \2/p" "$1" >"$dir/a"
  sed -n "s/.*\"step\":\([0-9]*\),\"loss\":\([^,}]*\).*/\1 \2/p" "$2" >"$dir/b"
  awk -v a=$3 -v b=$4 -v what="$5" -v tol="${6:-1e-4}" 'NR==FNR { want[$1] = $2; next }
    $1 >= a && $1 <= b { d = $2 - want[$1]; if (d < 0) d = -d; r = d / (want[$1] < 0 ? -want[$1] : want[$1]);
      if (r > worst) worst = r; if (r > tol || $2 != $2) { printf "%s: step %d loss %s vs %s (%.3g relative)\n", what, $1, $2, want[$1], r; bad = 1 } }
    END { if (bad) exit 1; printf "%s: steps %d-%d within %.3g relative\n", what, a, b, worst }' "$dir/a" "$dir/b" ||
    fail "$5"
}
# fetches FILE STEPS FETCHES AHEAD WHAT: each of the first STEPS steps of a metrics file broadcast FETCHES
# parameter groups (ZeRO stage 3), AHEAD of them prefetched
fetches() {
  n=$(grep -c "\"param_fetches\":$3,\"param_prefetches\":$4," "$1")
  [ "$n" -eq "$2" ] || fail "$5: not $3 groups fetched, $4 ahead, at each of $2 steps: $(cut -c1-400 "$1")"
  echo "$5: $3 groups fetched a step, $4 ahead"
}
run() { # name, then train-gpt's arguments
  name=$1
  shift
  "$@" >"$dir/$name.out" 2>&1 || fail "$name: $(tail -5 "$dir/$name.out")"
}
