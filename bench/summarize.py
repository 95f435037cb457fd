#!/usr/bin/python3
"""Turn the raw outputs of bench/run.sh into bench/results/allreduce-<date>.md.

Each program printed one row per size: tandem-bench rows are
`size_bytes count dtype redop time_us algbw_GBs busbw_GBs wrong` (lines may
carry tandemrun's "[0] " prefix), the peers' rows `size_bytes time_us
algbw_GBs busbw_GBs`. For every program and size the median time over the
rounds is taken, and busbw is recomputed from it with nccl-tests' allreduce
factor 2(n-1)/n, so that every column uses one definition."""
import argparse
import datetime
import os
import re
import statistics
import sys


def parse_rows(path, is_tandem):
    rows = {}
    with open(path) as f:
        for line in f:
            line = re.sub(r"^\[\d+\] ", "", line.strip()).strip()
            if not line or line.startswith("#") or not line[0].isdigit():
                continue
            cols = line.split()
            try:
                if is_tandem and len(cols) == 8:
                    size, time_us, wrong = int(cols[0]), float(cols[4]), int(cols[7])
                    if wrong:
                        sys.exit(f"summarize: {path}: {wrong} wrong elements at {size} bytes")
                elif not is_tandem and len(cols) == 4:
                    size, time_us = int(cols[0]), float(cols[1])
                else:
                    continue
            except ValueError:
                continue
            rows[size] = time_us
    return rows


def human(size):
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= div and size % div == 0:
            return f"{size // div} {unit}"
    return f"{size} B"


def fmt_time(us):
    return f"{us:,.1f}" if us < 1000 else f"{us:,.0f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--np", type=int, required=True)
    ap.add_argument("--rounds", type=int, required=True)
    ap.add_argument("--logdir", required=True)
    ap.add_argument("--machine", required=True)
    ap.add_argument("--versions", required=True)
    ap.add_argument("--membw", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--load", default="", help="load averages (1, 5, 15 min) around the run")
    ap.add_argument("--program", action="append", required=True, help="NAME=COMMAND")
    a = ap.parse_args()

    programs = [p.split("=", 1) for p in a.program]
    factor = 2.0 * (a.np - 1) / a.np
    med = {}  # name -> size -> median time_us
    spread = {}  # name -> size -> (min, max) over rounds
    for name, _ in programs:
        per_size = {}
        for r in range(1, a.rounds + 1):
            rows = parse_rows(os.path.join(a.logdir, f"{name}.{r}.log"), name.startswith("tandem"))
            for size, t in rows.items():
                per_size.setdefault(size, []).append(t)
        med[name] = {s: statistics.median(ts) for s, ts in per_size.items()}
        spread[name] = {s: (min(ts), max(ts)) for s, ts in per_size.items()}
    sizes = sorted(set().union(*[set(m) for m in med.values()]))

    def to_busbw(size, t):
        return size * factor / (t * 1e-6) / 1e9 if t else None

    def busbw(name, size):
        return to_busbw(size, med[name].get(size))

    # The machine is shared: other jobs steal a core now and then, which
    # hurts whichever program runs at that moment. The best round of each
    # program shows what it does undisturbed.
    def best_busbw(name, size):
        mm = spread[name].get(size)
        return to_busbw(size, mm[0] if mm else None)

    def bw_ratio(a_name, b_name, s, fn):
        x, y = fn(a_name, s), fn(b_name, s)
        return x / y if x and y else None

    def ratio_cell(a_name, b_name, s, fn):
        r = bw_ratio(a_name, b_name, s, fn)
        return f"{r:.2f}x" if r else "-"

    def table(head, rows):
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|")
        lines.extend("| " + " | ".join(row) + " |" for row in rows)

    names = [n for n, _ in programs]
    lines = []
    lines.append(f"# Allreduce, {a.np} ranks, f32 sum: Tandem vs Open MPI vs PyTorch gloo")
    lines.append("")
    lines.append(f"Measured {datetime.date.today().isoformat()} by `bench/run.sh`, all programs in one run, "
                 f"{a.rounds} interleaved rounds, median time per size. busbw = size x 2(n-1)/n / time "
                 "(nccl-tests' allreduce definition), in GB/s; time in microseconds per call on the slowest "
                 "rank. All programs reduce in place; Tandem also checked every size's result "
                 "(0 wrong elements). tandem-shm allocates its buffers with td_mem_alloc (host-shared, "
                 "as the training engine's gradient arena; tandem-bench's default -R 1), tandem-shm-malloc "
                 "with malloc (-R 0), as the peers do.")
    lines.append("")
    lines.append(f"Machine: {a.machine}.  ")
    lines.append(f"Versions: {a.versions}.  ")
    lines.append(f"Load average (1/5/15 min) {a.load}: the machine is shared with other work, which "
                 "shows as spread between rounds (below).")
    lines.append("")
    pairs = [(a_, b_) for a_, b_ in (("tandem-shm", "mpi-shm"), ("tandem-shm-malloc", "mpi-shm"),
                                       ("tandem-tcp", "gloo"), ("tandem-tcp", "mpi-tcp")) if a_ in med and b_ in med]
    pair_heads = [f"{a_} / {b_}" for a_, b_ in pairs]
    rows = []
    for s in sizes:
        row = [human(s)]
        for n in names:
            b, t = busbw(n, s), med[n].get(s)
            row += [f"{b:.2f}" if b else "-", fmt_time(t) if t else "-"]
        rows.append(row + [ratio_cell(a_, b_, s, busbw) for a_, b_ in pairs])
    table(["size"] + [f"{n} {what}" for n in names for what in ("busbw", "us")] + pair_heads, rows)
    lines.append("")
    lines.append("Ratios are of busbw (higher is better for Tandem).")
    lines.append("")

    lines.append("### Best round of each program (busbw from the fastest of the rounds)")
    lines.append("")
    rows = []
    for s in sizes:
        row = [human(s)] + [f"{b:.2f}" if (b := best_busbw(n, s)) else "-" for n in names]
        rows.append(row + [ratio_cell(a_, b_, s, best_busbw) for a_, b_ in pairs])
    table(["size"] + [f"{n} busbw" for n in names] + pair_heads, rows)
    lines.append("")

    small = sizes[0] if sizes else None
    big = 64 << 20
    lines.append("## Against the targets (issue 2)")
    lines.append("")
    lines.append("| target | median rounds | met | best rounds | met |")
    lines.append("|---|---|---|---|---|")

    def target(desc, value, best, goal, fmt, higher_is_better=True):
        cells = []
        for v in (value, best):
            if v is None:
                cells += ["-", "-"]
            else:
                ok = v >= goal if higher_is_better else v <= goal
                cells += [fmt.format(v), "yes" if ok else "no"]
        lines.append(f"| {desc} | " + " | ".join(cells) + " |")

    target("64 MiB over shared memory: busbw >= 3x Open MPI (buffers from td_mem_alloc)",
           bw_ratio("tandem-shm", "mpi-shm", big, busbw), bw_ratio("tandem-shm", "mpi-shm", big, best_busbw), 3.0,
           "{:.2f}x")
    if "tandem-shm-malloc" in med:
        target("... the same with malloc'd buffers (tandem-bench -R 0)",
               bw_ratio("tandem-shm-malloc", "mpi-shm", big, busbw),
               bw_ratio("tandem-shm-malloc", "mpi-shm", big, best_busbw), 3.0, "{:.2f}x")
    target("64 MiB over TCP: busbw >= 1.5x gloo", bw_ratio("tandem-tcp", "gloo", big, busbw),
           bw_ratio("tandem-tcp", "gloo", big, best_busbw), 1.5, "{:.2f}x")
    if small is not None and med["tandem-shm"].get(small) and med["mpi-shm"].get(small):
        lat = med["tandem-shm"][small] / med["mpi-shm"][small]
        lat_best = spread["tandem-shm"][small][0] / spread["mpi-shm"][small][0]
        target(f"{human(small)} over shared memory: latency <= 1.5x Open MPI's (median "
               f"{fmt_time(med['tandem-shm'][small])} us vs {fmt_time(med['mpi-shm'][small])} us; best "
               f"{fmt_time(spread['tandem-shm'][small][0])} us vs {fmt_time(spread['mpi-shm'][small][0])} us)",
               lat, lat_best, 1.5, "{:.2f}x", higher_is_better=False)
    lines.append("")

    if small is not None:
        lines.append(f"## Latency at {human(small)} (time ratio, lower is better for Tandem)")
        lines.append("")
        lines.append("| pair | Tandem us | peer us | ratio |")
        lines.append("|---|---:|---:|---:|")
        for a_name, b_name in (("tandem-shm", "mpi-shm"), ("tandem-tcp", "mpi-tcp"), ("tandem-tcp", "gloo")):
            x, y = med[a_name].get(small), med[b_name].get(small)
            if x and y:
                lines.append(f"| {a_name} / {b_name} | {fmt_time(x)} | {fmt_time(y)} | {x / y:.2f}x |")
        lines.append("")

    lines.append("## Spread over the rounds (min .. max time in us)")
    lines.append("")
    lines.append("| size | " + " | ".join(names) + " |")
    lines.append("|---|" + "|".join(["---:"] * len(names)) + "|")
    for s in sizes:
        cells = []
        for n in names:
            mm = spread[n].get(s)
            cells.append(f"{fmt_time(mm[0])} .. {fmt_time(mm[1])}" if mm else "-")
        lines.append(f"| {human(s)} | " + " | ".join(cells) + " |")
    lines.append("")

    lines.append("## Memory bandwidth on this machine (shared/peers/membw.c, for context)")
    lines.append("")
    lines.append("```")
    with open(a.membw) as f:
        lines.append(f.read().rstrip())
    lines.append("```")
    lines.append("")
    lines.append("## Commands")
    lines.append("")
    lines.append("```")
    for n, c in programs:
        lines.append(f"{n}: {c}")
    lines.append("```")
    lines.append("")
    with open(a.out, "w") as f:
        f.write("\n".join(lines))


if __name__ == "__main__":
    main()
