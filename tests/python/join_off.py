"""TANDEM_JOIN=0: tandem.torch issues no join descriptor (rank 0's
hvd.allreduce_ matches rank 1's bare communicator allreduce, which a
descriptor would turn into a MismatchError), results are unchanged,
hvd.join() raises InvalidUsageError on every rank, and a value other than
0/1 is a ValueError naming the variable.
    TANDEM_JOIN=0 tandemrun -np 2 python3 join_off.py"""
import os
import sys

import torch

import tandem
import tandem.torch as hvd

assert os.environ.get("TANDEM_JOIN") == "0", "run with TANDEM_JOIN=0"
hvd.init()
n, me = hvd.size(), hvd.rank()
t = torch.full((5,), float(me + 1))
if me == 0:
    hvd.allreduce_(t, op=hvd.Sum)
else:
    tandem.world().allreduce(t.data_ptr(), t.data_ptr(), 5, tandem.F32, tandem.SUM)
assert torch.equal(t, torch.full((5,), n * (n + 1) / 2)), t
got = hvd.allgather(torch.full((me + 1,), me, dtype=torch.int64))
assert got.tolist() == [q for q in range(n) for _ in range(q + 1)], got
try:
    hvd.join()
    sys.exit(f"rank {me}: join() returned under TANDEM_JOIN=0")
except tandem.InvalidUsageError as e:
    assert "TANDEM_JOIN=0" in str(e), e
os.environ["TANDEM_JOIN"] = "yes"
try:
    hvd.allreduce(torch.ones(2))
    sys.exit(f"rank {me}: TANDEM_JOIN=yes was accepted")
except ValueError as e:
    assert "TANDEM_JOIN='yes'" in str(e), e
os.environ["TANDEM_JOIN"] = "0"
hvd.barrier()
print(f"join_off ok rank {me}", flush=True)
hvd.shutdown()
