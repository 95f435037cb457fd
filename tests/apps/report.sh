#!/usr/bin/env bash
# tools/tandem-report against a real run. Usage:
#   tests/apps/report.sh CASE BUILD_TREE
# page:   3 ranks (odd) under tandemrun at ZeRO stage 3 (parameter fetch
#         waits) with a timeline and checkpoints every
#         4 steps; the report's numbers checked against the metrics file and
#         the timeline read here independently (final and lowest loss, median
#         throughput, breakdown totals, per-rank communication wait = the sum
#         of that rank's comm spans, rank 0's = the metrics file's
#         comm_wait_s); the page self-contained (no external reference, four
#         inline SVGs), every PNG a PNG; then headless Chromium renders the
#         page and the screenshot must not be blank (skipped with the reason
#         when chromium is missing). The screenshot is kept as $SHOT if set.
# single: a world of one without a timeline: the page says so, 3 plots.
# errors: a missing, empty, garbled or truncated metrics file, steps out of
#         order and a timeline a rank never closed each exit 2 with a
#         message naming the problem, and leave no page behind.
set -u
case_name=$1
B=$2
RUN="$B/bin/tandemrun"
GPT="$B/bin/train-gpt"
REPORT=tools/tandem-report
TINY="--layers 2 --channels 32 --heads 2 --seq 32 --threads 1 --micro-batch 2 --sample 0"
work=$(mktemp -d /tmp/tandem-report-XXXXXX)
trap 'rm -rf "$work"' EXIT
export TANDEM_PROGRESS=off
fail() { echo "FAIL($case_name): $*"; exit 1; }
# Debian's interpreter: python3-matplotlib is installed for it (a pyenv
# python on PATH may lack it).
PY=/usr/bin/python3
$PY -c 'import matplotlib' 2>/dev/null || { echo "SKIP: python3-matplotlib missing (scripts/install-deps)"; exit 0; }

case "$case_name" in
page)
  mkdir "$work/run"
  TANDEM_TIMELINE="$work/run/timeline.json" "$RUN" -np 3 "$GPT" $TINY --steps 13 --metrics "$work/run/metrics.jsonl" \
    --zero-stage 3 --save "$work/ckpt" --save-every 4 >"$work/train.out" 2>&1 ||
    { cat "$work/train.out"; fail "training failed"; }
  $REPORT "$work/run" >"$work/report.out" 2>"$work/report.err" || { cat "$work/report.err"; fail "tandem-report failed"; }
  [ "$(cat "$work/report.out")" = "$work/run/report/report.html" ] || fail "stdout should name the page"
  $PY - "$work/run" <<'EOF' || fail "the report's numbers or page are wrong"
import json, os, re, statistics, sys
run = sys.argv[1]
rep = os.path.join(run, "report")
s = json.load(open(os.path.join(rep, "summary.json")))
lines = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
assert len(lines) == 13 and s["steps"] == 13 and s["first_step"] == 1 and s["last_step"] == 13, s
assert s["final_loss"] == lines[-1]["loss"] and s["min_loss"] == min(l["loss"] for l in lines), s
assert s["median_items_per_s"] == statistics.median(l["tokens_per_s"] for l in lines[2:]), s
io = sum(l["data_s"] + l["io_s"] for l in lines)
opt = sum(l["optimizer_s"] for l in lines)
comm = sum(l["comm_wait_s"] for l in lines)
fetch = sum(l["fetch_wait_s"] for l in lines)
fb = sum(l["compute_s"] - l["optimizer_s"] - l["data_s"] - l["fetch_wait_s"] for l in lines)
assert fetch > 0, "ZeRO stage 3 fetches parameters: some wait expected"
b = s["breakdown_s"]
for key, want in (("I/O", io), ("optimizer", opt), ("comm wait", comm + fetch), ("compute", fb)):
    assert abs(b[key] - want) <= 1e-9 + 1e-9 * want, (key, b[key], want)
assert sum(1 for l in lines if l["io_s"] > 0) == 3, "checkpoints at steps 4, 8, 12 should show as io_s"
# the timeline, read here: every comm span of a rank, summed
events = json.load(open(os.path.join(run, "timeline.json")))
waits, steps = {}, {}
for e in events:
    if e.get("ph") == "X" and e["cat"] == "comm":
        waits[e["pid"]] = waits.get(e["pid"], 0) + e["dur"] / 1e6
    if e.get("ph") == "X" and e["cat"] == "step":
        steps[e["pid"]] = steps.get(e["pid"], 0) + 1
assert sorted(waits) == [0, 1, 2] and steps == {0: 13, 1: 13, 2: 13}, (waits, steps)
got = {int(r): v for r, v in s["comm_wait_per_rank_s"].items()}
for r in waits:
    assert abs(got[r] - waits[r]) <= 1e-9, (r, got[r], waits[r])
# rank 0's timeline and its metrics file measure the same waits (separate
# clock reads: a few microseconds per span apart)
assert abs(waits[0] - comm) <= 13 * 4 * 20e-6 + 0.01 * comm, (waits[0], comm)
page = open(os.path.join(rep, "report.html")).read()
assert page.count("<svg") == 4, page.count("<svg")
refs = re.findall(r'(?:src|href)\s*=\s*"([^"#][^"]*)"', page) + re.findall(r"url\((?!#)[^)]*\)", page)
assert not refs, f"external references: {refs[:5]}"
for name in ("loss", "throughput", "step_time", "comm_wait"):
    assert open(os.path.join(rep, name + ".png"), "rb").read(8) == b"\x89PNG\r\n\x1a\n", name
    assert "<svg" in open(os.path.join(rep, name + ".svg")).read(), name
print(f"report numbers agree: 13 steps, per-rank waits {[round(waits[r], 4) for r in sorted(waits)]} s")
EOF
  chrome=$(command -v chromium || command -v chromium-browser)
  if [ -z "$chrome" ]; then
    echo "SKIP(page screenshot): chromium missing (apt-get install chromium)"
    exit 0
  fi
  # --no-sandbox: the suite may run as root, where Chromium's sandbox refuses to start.
  timeout 60 "$chrome" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=900,2100 \
    --screenshot="$work/shot.png" "file://$work/run/report/report.html" >"$work/chrome.out" 2>&1 ||
    { tail -5 "$work/chrome.out"; fail "chromium could not render the page"; }
  $PY - "$work/shot.png" <<'EOF' || fail "the screenshot looks blank"
import sys
import matplotlib.image as mpimg
img = mpimg.imread(sys.argv[1])[:, :, :3]
h, w = img.shape[:2]
assert (w, h) == (900, 2100), (w, h)
ink = (img.sum(axis=2) < 2.4)  # not white
colored = (img.max(axis=2) - img.min(axis=2) > 0.25)  # plot lines and areas
rows = ink.any(axis=1)
print(f"screenshot {w}x{h}: {100 * ink.mean():.1f}% ink, {100 * colored.mean():.2f}% colour, "
      f"ink down to row {rows.nonzero()[0].max()}")
assert ink.mean() > 0.02 and colored.mean() > 0.005, "too little drawn"
assert rows.nonzero()[0].max() > 1500, "the page ends early: plots missing?"
EOF
  [ -n "${SHOT:-}" ] && cp "$work/shot.png" "$SHOT"
  echo "page rendered by $("$chrome" --version 2>/dev/null | head -1)"
  ;;
single)
  "$GPT" $TINY --steps 5 --metrics "$work/m.jsonl" >"$work/train.out" 2>&1 || { cat "$work/train.out"; fail "training failed"; }
  $REPORT "$work/m.jsonl" -o "$work/out" >/dev/null 2>"$work/err" || { cat "$work/err"; fail "tandem-report failed"; }
  grep -q "no timeline given" "$work/out/report.html" || fail "the page should say that per-rank waits need a timeline"
  [ "$(grep -o '<svg' "$work/out/report.html" | wc -l)" = 3 ] || fail "expected 3 plots without a timeline"
  [ ! -e "$work/out/comm_wait.svg" ] || fail "no per-rank plot without a timeline"
  echo "world of one, no timeline: 3 plots and a note"
  ;;
errors)
  "$GPT" $TINY --steps 3 --metrics "$work/good.jsonl" >/dev/null 2>&1 || fail "training failed"
  expect() { # NAME PATTERN ARGS...: exit 2, PATTERN on stderr, no page
    local name=$1 pattern=$2
    shift 2
    rm -rf "$work/out"
    $REPORT "$@" -o "$work/out" >/dev/null 2>"$work/err"
    local rc=$?
    [ $rc = 2 ] || { cat "$work/err"; fail "$name: expected exit 2, got $rc"; }
    grep -q "$pattern" "$work/err" || { cat "$work/err"; fail "$name: no message matching '$pattern'"; }
    [ ! -e "$work/out/report.html" ] || fail "$name: a page was written from bad input"
    echo "$name: $(cat "$work/err")"
  }
  expect missing "metrics file $work/nope.jsonl does not exist" "$work/nope.jsonl"
  : >"$work/empty.jsonl"
  expect empty "is empty: did the run reach its first step" "$work/empty.jsonl"
  head -c -20 "$work/good.jsonl" >"$work/cut.jsonl"
  expect truncated "cut.jsonl:3: the last line is incomplete" "$work/cut.jsonl"
  { head -1 "$work/good.jsonl"; echo '{"step":2,"loss":4.1,,}'; tail -1 "$work/good.jsonl"; } >"$work/garbled.jsonl"
  expect garbled "garbled.jsonl:2: not valid JSON" "$work/garbled.jsonl"
  { head -1 "$work/good.jsonl"; echo '{"step":2,"loss":"high"}'; } >"$work/badloss.jsonl"
  expect non-number 'badloss.jsonl:2: "loss" is "high", not a number' "$work/badloss.jsonl"
  printf 'hello\n' >"$work/text.jsonl"
  expect not-metrics "text.jsonl:1: not valid JSON" "$work/text.jsonl"
  cat "$work/good.jsonl" "$work/good.jsonl" >"$work/twice.jsonl"
  expect out-of-order "twice.jsonl:4: step 1 follows step 3" "$work/twice.jsonl"
  printf '\xff\xfe\n' >"$work/binary.jsonl"
  expect binary "is not UTF-8 text" "$work/binary.jsonl"
  printf '[\n{"name":"step 1","cat":"step","ph":"X","pid":0,"tid":1,"ts":1,"dur":2}' >"$work/tl.json"
  expect open-timeline "a rank died before closing it" "$work/good.jsonl" --timeline "$work/tl.json"
  expect missing-timeline "timeline $work/none.json does not exist" "$work/good.jsonl" --timeline "$work/none.json"
  ;;
*) fail "unknown case" ;;
esac
