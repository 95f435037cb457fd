"""Ranks disagree on a collective (rank r allreduces 10 + r elements): every
rank raises MismatchError, whose message names the ranks, instead of hanging.
    tandemrun -np N python3 mismatch.py"""
import sys

import torch

import tandem
import tandem.torch as hvd

hvd.init()
r = hvd.rank()
try:
    hvd.allreduce(torch.ones(10 + r))
except tandem.MismatchError as e:
    msg = str(e)
    if "rank" not in msg or e.status != tandem._tandem.ERR_MISMATCH:
        print(f"rank {r}: unhelpful mismatch error: {msg}", flush=True)
        sys.exit(1)
    print(f"mismatch ok rank {r}: {msg}", flush=True)
    import os
    os._exit(0)  # the world is broken: no orderly shutdown
print(f"rank {r}: no MismatchError", flush=True)
sys.exit(1)
