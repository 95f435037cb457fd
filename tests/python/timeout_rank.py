"""A rank stays alive but stops issuing collectives (busy elsewhere): with
TANDEM_TIMEOUT=2 every other rank's pending tandem.torch operation raises
TandemTimeoutError (also a TimeoutError) that names the rank it waited for,
within seconds, for a blocking and an async call; none hangs.
    TANDEM_TIMEOUT=2 tandemrun -np N python3 timeout_rank.py STALLED"""
import os
import re
import sys
import time

import torch

import tandem
import tandem.torch as hvd

stalled = int(sys.argv[1])
hvd.init()
me, n = hvd.rank(), hvd.size()
hvd.allreduce_(torch.ones(8), op=hvd.Sum)
if me == stalled:
    time.sleep(8)  # alive, silent: the others must time out, not wait for it
    print(f"stalled rank {me} done", flush=True)
    os._exit(0)
t0 = time.monotonic()
try:
    hvd.synchronize(hvd.allreduce_async(torch.ones(1 << 12), op=hvd.Sum))
    sys.exit(f"rank {me}: no error although rank {stalled} issued nothing")
except tandem.TandemTimeoutError as e:
    dt = time.monotonic() - t0
    assert isinstance(e, TimeoutError)
    msg = str(e)
    if not re.search(rf"rank {stalled}\b|rank\(s\) [0-9, ]*\b{stalled}\b", msg):
        sys.exit(f"rank {me}: the timeout does not name rank {stalled}: {msg}")
    if dt > 10:
        sys.exit(f"rank {me}: the timeout came after {dt:.1f} s (TANDEM_TIMEOUT=2)")
    print(f"timeout ok rank {me} after {dt:.2f} s: {msg}", flush=True)
    os._exit(0)
