#!/usr/bin/env python3
"""Where each grow of bench/faults_hosts.sh spent its time (issue 22).

    TANDEM_LOG=info KEEP=1 bench/faults_hosts.sh ...      (keeps its work dir)
    bench/grow_breakdown.py WORKDIR/faulty.out RESULTS.tsv [LABEL]

faulty.out is the job's output as tandemrun printed it, each line stamped
with the wall-clock time it arrived (the bench's stamp.py); the .tsv has the
bench's rows (kind, process, host, fault time, next step time, ...). For
every grow row, the phases from the line that puts the host back into the
discovery script to the first step at 4 ranks, taken from tandemrun's and
the ranks' TANDEM_LOG=info lines (docs/launcher.md, "Where a grow's time
goes"):

  discover   fault -> tandemrun's "discovered hosts now" line
  agent      that line -> the host's agent answered (0 when it already had:
             a background start); 'ssh' is how long the agent's ssh start
             took, wherever it fell
  fork       agent ready (or the discovery) -> the last of the host's new
             processes runs (tandemrun got the agent's STARTED)
  start      that -> the last joiner's "waits to join" line (the joiner's
             own age there is 'age': exec, loader, set-up)
  commit     that -> the members' "epoch E ends at commit" (the join waits
             for a commit, and for every joiner on its way)
  epoch      that -> the new epoch's first line (rendezvous, communicator,
             state from the newest commit)
  step       that -> the first step at 4 ranks
Prints a markdown table, one row per grow, then the medians and p95s.
"""
import re
import sys


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: grow_breakdown.py FAULTY.OUT RESULTS.tsv [LABEL]")
    lines = []
    with open(sys.argv[1], errors="replace") as f:
        for raw in f:
            t, _, text = raw.rstrip("\n").partition(" ")
            try:
                lines.append((float(t), text))
            except ValueError:
                continue
    rows = []
    with open(sys.argv[2]) as f:
        for raw in f:
            cols = raw.rstrip("\n").split("\t")
            if len(cols) >= 5 and cols[0] == "grow":
                rows.append((float(cols[3]), float(cols[4]), cols[2]))
    label = sys.argv[3] if len(sys.argv) > 3 else ""
    addr = {"a": "10.77.15.1", "b": "10.77.15.2"}
    table = []
    for t_fault, t_next, host in rows:
        h = addr.get(host, host)

        def first(pattern, after, before=None):
            rx = re.compile(pattern)
            for t, text in lines:
                if t >= after and (before is None or t <= before) and rx.search(text):
                    return t, text
            return None, None

        t_disc, _ = first(r"tandemrun: discovered hosts now: .*" + re.escape(h) + ":", t_fault)
        if t_disc is None:
            continue
        # The agent's answer: the last one for this host before the first
        # step at 4 ranks (a background start answers before the discovery).
        t_agent, ssh_s = None, None
        rx = re.compile(r"the agent on host " + re.escape(h) + r" answered ([0-9.]+) s after its ssh started")
        for t, text in lines:
            if t > t_next:
                break
            m = rx.search(text)
            if m and t >= t_fault - 60:
                t_agent, ssh_s = t, float(m.group(1))
        runs = [t for t, text in lines if t_disc <= t <= t_next and re.search(r"process \d+ runs on host " + re.escape(h) + " ", text)]
        waits = [(t, text) for t, text in lines if t_disc <= t <= t_next and "waits to join epoch" in text]
        t_commit, commit_text = first(r"ends at commit", t_disc, t_next)
        m = re.search(r"epoch (\d+) \(rank", commit_text or "")
        t_epoch = None
        if m:
            t_epoch, _ = first(r"train-gpt: elastic epoch %d:" % (int(m.group(1)) + 1), t_disc, t_next)
        if not runs or not waits or t_commit is None or t_epoch is None:
            table.append((t_next - t_fault, None))
            continue
        t_agent_eff = t_disc if t_agent is None or t_agent <= t_disc else t_agent
        t_run = max(runs)
        t_wait = max(t for t, _ in waits)
        age = max(float(re.search(r"\(([0-9.]+) s after the process started", text).group(1)) for _, text in waits)
        ph = {
            "discover": t_disc - t_fault,
            "agent": t_agent_eff - t_disc,
            "ssh": ssh_s if ssh_s is not None else float("nan"),
            "fork": t_run - t_agent_eff,
            "start": t_wait - t_run,
            "age": age,
            "commit": max(0.0, t_commit - t_wait),
            "epoch": t_epoch - max(t_commit, t_wait),
            "step": t_next - t_epoch,
        }
        table.append((t_next - t_fault, ph))
    keys = ["discover", "agent", "fork", "start", "commit", "epoch", "step"]
    print("| %sgrow | total (s) | %s | ssh start of its agent | joiner's age at its join |" % (label + " " if label else "", " | ".join(keys)))
    print("|---|---|" + "---|" * (len(keys) + 2))
    for i, (total, ph) in enumerate(table):
        if ph is None:
            print("| %d | %.2f | (lines missing) |" % (i + 1, total))
            continue
        print("| %d | %.2f | %s | %.2f | %.3f |" % (i + 1, total, " | ".join("%.2f" % ph[k] for k in keys), ph["ssh"], ph["age"]))
    full = [ph for _, ph in table if ph]

    def q(vals, p):
        vals = sorted(vals)
        if not vals:
            return float("nan")
        r = p * (len(vals) - 1)
        lo = int(r)
        hi = min(lo + 1, len(vals) - 1)
        return vals[lo] + (vals[hi] - vals[lo]) * (r - lo)

    for name, p in (("median", 0.5), ("p95", 0.95)):
        print("| %s | %.2f | %s | %.2f | %.3f |" % (name, q([t for t, _ in table], p),
              " | ".join("%.2f" % q([ph[k] for ph in full], p) for k in keys),
              q([ph["ssh"] for ph in full if ph["ssh"] == ph["ssh"]], p), q([ph["age"] for ph in full], p)))


if __name__ == "__main__":
    main()
