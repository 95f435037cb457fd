"""The event files of an elastic run that lost its rank 0 and was then killed whole and resumed
(tests/apps/tensorboard.sh elastic).

Usage: elastic.py TB_DIR PROTO_MODULE_DIR METRICS_JSONL RESTART_STEPS
Reads every event file of the run in the order TensorBoard loads them (by
name), with decode.py's independent CRC check and protoc's decoder, and
replays them the way TensorBoard's event accumulator does with its default
purge_orphaned_data: a SessionLog START at step S drops the events at S and
above read before it. RESTART_STEPS "S2,S3,...": file k (k >= 2) is the
next rank 0's and begins with START at Sk (the step it trains first).
Checked: one file more than restarts; the STARTs; some orphaned values
purged (the steps a killed job did past its last checkpoint); after the
purge every step 1..N has exactly one loss, equal to the metrics file's
last record of that step, and no tag's steps go backwards (nothing left
for TensorBoard's out-of-order fallback)."""
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode import f32, pb, records  # noqa: E402  (decode.py imports protoc's module from argv[2])

tb_dir, _, metrics_path = sys.argv[1:4]
restarts = [int(x) for x in sys.argv[4].split(",")]
files = sorted(glob.glob(os.path.join(tb_dir, "events.out.tfevents.*")))
assert len(files) == 1 + len(restarts), f"expected {1 + len(restarts)} event files (one per rank 0), found {files}"
kept = []  # (step, tag, value) in load order, after purges
n_events, n_purged = 0, 0
for i, path in enumerate(files):
    events = []
    for body in records(path):
        ev = pb.Event()
        ev.ParseFromString(body)
        assert ev.SerializeToString() == body, "unknown or misordered fields in an Event"
        events.append(ev)
    assert events[0].file_version == "brain.Event:2", events[0]
    first = events[1]
    assert first.HasField("session_log") and first.session_log.status == pb.SessionLog.START, first
    if i >= 1:
        assert first.step == restarts[i - 1], f"file {i + 1}'s START at step {first.step}, not {restarts[i - 1]}"
    for ev in events[1:]:
        n_events += 1
        if ev.HasField("session_log"):
            assert ev.session_log.status == pb.SessionLog.START
            before = len(kept)
            kept = [k for k in kept if k[0] < ev.step]
            n_purged += before - len(kept)
            continue
        for v in ev.summary.value:
            if not v.HasField("histo"):
                kept.append((ev.step, v.tag, v.simple_value))
last = {}
losses = {}
for step, tag, value in kept:
    assert step > last.get(tag, 0), f"tag {tag}: step {step} after {last.get(tag)} (out of order)"
    last[tag] = step
    if tag == "loss":
        losses[step] = value
want = {}
for line in open(metrics_path):
    rec = json.loads(line)
    if "loss" in rec and "event" not in rec:
        want[rec["step"]] = rec["loss"]  # the last record of a step (a redone step is written again)
n = max(want)
assert n_purged > 0, "nothing purged: the test did not make orphaned steps"
assert sorted(losses) == list(range(1, n + 1)), f"steps after the purge: {sorted(losses)[:5]}..{len(losses)} of {n}"
for step, value in losses.items():
    assert value == f32(want[step]), f"step {step}: event {value!r}, metrics {want[step]!r}"
print(f"elastic.py: {len(files)} files, {n_events} events, {n_purged} orphaned values purged by the STARTs at "
      f"steps {restarts}, steps 1..{n} each once with the metrics file's loss")
