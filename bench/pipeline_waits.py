#!/usr/bin/env python3
# Where each pipeline stage's step time goes, from a TANDEM_TIMELINE file of a PP=2 run
# (issue 21). Usage: bench/pipeline_waits.py TIMELINE.json
#
#   TANDEM_TIMELINE=tl.json build/bin/tandemrun -np 2 build/bin/train-gpt ... --pipeline-parallel 2
#   bench/pipeline_waits.py tl.json
"""Where each stage's step time goes, over the steps after the first, from a
TANDEM_TIMELINE file of a PP=2 run: forward + backward; receive waits split
into the part before the peer posted the matching send (the schedule's
dependency: bubble) and after it (transfer and hand-off); the engine's other
spans (data, send = copy + post, send_wait, optimizer); and the rest."""
import json, sys
ev = json.load(open(sys.argv[1]))
X = [e for e in ev if e.get('ph') == 'X']
ranks = sorted({e['pid'] for e in X})
by = {r: sorted([e for e in X if e['pid'] == r], key=lambda e: e['ts']) for r in ranks}
for r in ranks:
    peer = 1 - r
    st = sorted([e for e in by[r] if e['name'].startswith('step ')], key=lambda e: e['ts'])
    if len(st) < 2: continue
    t0 = st[1]['ts']; t1 = st[-1]['ts'] + st[-1]['dur']; span = t1 - t0
    rw = [e for e in by[r] if e['name'] == 'recv_wait']
    sd = [e for e in by[peer] if e['name'] == 'send']
    dep = xfer = 0.0; xs = []
    for i, w in enumerate(rw):
        if not (t0 <= w['ts'] <= t1) or i >= len(sd): continue
        ready = sd[i]['ts'] + sd[i]['dur']; ws, we = w['ts'], w['ts'] + w['dur']
        dep += max(0.0, min(we, ready) - ws); x = max(0.0, we - max(ws, ready)); xfer += x; xs.append(x)
    tot = lambda names: sum(e['dur'] for e in by[r] if e['name'] in names and t0 <= e['ts'] <= t1)
    comp = tot(('forward', 'backward')); other = {k: tot((k,)) for k in ('data', 'send', 'send_wait', 'optimizer')}
    rest = span - comp - dep - xfer - sum(other.values())
    xs.sort()
    f = lambda v: f"{v / span:.4f}"
    print(f"rank {r}: {span/1e6:.2f} s; fractions: compute {f(comp)} idle {f(span-comp)} = recv before send {f(dep)}"
          f" + recv after send {f(xfer)} + " + " + ".join(f"{k} {f(v)}" for k, v in other.items()) + f" + rest {f(rest)}"
          f"; per recv after the send: median {xs[len(xs)//2]/1e3 if xs else 0:.2f} ms max {max(xs or [0])/1e3:.2f} ms")
