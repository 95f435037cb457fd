"""A rank SIGKILLs itself between collectives; every survivor's pending and
later tandem.torch operations raise RemoteError naming it within seconds.
With "join", the survivors are in hvd.join() (out of data, serving the
victim) when it dies, and join() raises the same way.
    tandemrun --grace 20 -np N python3 kill_rank.py VICTIM [join]"""
import os
import signal
import sys
import time

import torch

import tandem
import tandem.torch as hvd

victim = int(sys.argv[1])
in_join = len(sys.argv) > 2 and sys.argv[2] == "join"
hvd.init()
t = torch.ones(1 << 18)
hvd.allreduce_(t, op=hvd.Sum)
hvd.barrier()
if hvd.rank() == victim:
    if in_join:  # the others are in join(), serving this rank's allreduces
        for _ in range(3):
            hvd.allreduce_(t, op=hvd.Sum)
    os.kill(os.getpid(), signal.SIGKILL)
t0 = time.monotonic()
try:
    if in_join:
        last = hvd.join()
        print(f"rank {hvd.rank()}: join() returned {last} although rank {victim} died", flush=True)
        sys.exit(1)
    while time.monotonic() - t0 < 60:
        h = hvd.allreduce_async(t, op=hvd.Sum)
        hvd.synchronize(h)
    print(f"rank {hvd.rank()}: no error within 60 s", flush=True)
    sys.exit(1)
except tandem.RemoteError as e:
    dt = time.monotonic() - t0
    msg = str(e)
    if f"rank {victim}" not in msg:
        print(f"rank {hvd.rank()}: the message does not name rank {victim}: {msg}", flush=True)
        sys.exit(1)
    if dt > 15:
        print(f"rank {hvd.rank()}: the error came after {dt:.1f} s", flush=True)
        sys.exit(1)
    # later operations fail at once with the same error (sticky)
    try:
        hvd.allreduce(t)
    except tandem.RemoteError:
        pass
    else:
        print(f"rank {hvd.rank()}: a later allreduce succeeded on a broken world", flush=True)
        sys.exit(1)
    print(f"kill ok rank {hvd.rank()} after {dt:.2f} s: {msg}", flush=True)
    os._exit(0)  # no orderly shutdown: the world is broken
