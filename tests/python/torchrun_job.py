"""A worker of a real torchrun job (tests/python/torchrun.sh starts the agent
of torch.distributed.run, which serves torch's TCPStore on MASTER_PORT):
tandem.torch's Horovod API and the c10d backend, each checked against
closed forms, then that the Tandem store rank 0 hosts admits no process
without the job's secret.

Before the fix (3eede20) rank 0 tried to host Tandem's store on MASTER_PORT,
the agent's port: "Address already in use", and the job failed."""
import faulthandler
import os
import socket
import subprocess
import sys

import torch
import torch.distributed as dist

faulthandler.dump_traceback_later(60, exit=True)
env = os.environ
assert "TORCHELASTIC_RUN_ID" in env and "TANDEM_RANK" not in env, "run under torchrun (tests/python/torchrun.sh)"
rank, n = int(env["RANK"]), int(env["WORLD_SIZE"])

# The agent really serves its store on MASTER_PORT: the port is taken.
with socket.socket() as s:
    try:
        s.bind((env["MASTER_ADDR"], int(env["MASTER_PORT"])))
        raise AssertionError(f"nothing listens on MASTER_PORT {env['MASTER_PORT']}: not a real torchrun agent")
    except OSError:
        pass

import tandem.torch as hvd  # noqa: E402

hvd.init()
assert (hvd.rank(), hvd.size(), hvd.local_rank()) == (rank, n, int(env["LOCAL_RANK"]))
store = env["TANDEM_STORE"]
assert not store.endswith(":" + env["MASTER_PORT"]), store  # not the agent's port
t = hvd.allreduce(torch.arange(5, dtype=torch.float32) * (rank + 1), op=hvd.Sum)
assert t.tolist() == [float(i * n * (n + 1) // 2) for i in range(5)], t
b = hvd.broadcast(torch.full((3,), float(rank)), root_rank=n - 1)
assert b.tolist() == [float(n - 1)] * 3

# torch.distributed's default env:// rendezvous goes through the agent's store;
# the tandem backend's communicators through the Tandem store found above.
dist.init_process_group("tandem")
x = torch.full((4,), float(rank + 1))
dist.all_reduce(x)
assert x.tolist() == [float(n * (n + 1) // 2)] * 4, x
last = dist.new_group([n - 1])
everyone = dist.new_group(list(range(n)))
if rank == n - 1:
    y = torch.ones(2)
    dist.all_reduce(y, group=last)
    assert y.tolist() == [1.0, 1.0]
z = torch.tensor([float(rank)])
dist.all_reduce(z, group=everyone, op=dist.ReduceOp.MAX)
assert z.item() == n - 1

# Rank 0's store is authenticated: a process with another secret, posing as a
# rank of this job at its store, is refused by the handshake.
if rank == 0:
    intruder = ("import tandem._tandem as t\n"
                f"t.init(rank=1, world_size=2, store={store!r}, job_id='intruder', timeout=5)\n")
    wrong = dict(env, TANDEM_SECRET="not-this-jobs-secret-" + "x" * 40)
    wrong.pop("TANDEM_SECRET_FILE", None)
    p = subprocess.run([sys.executable, "-c", intruder], env=wrong, capture_output=True, text=True, timeout=40)
    assert p.returncode != 0 and "secret" in p.stderr, (p.returncode, p.stderr[-600:])
    print("rank 0: a process with another secret was refused:", p.stderr.strip().splitlines()[-1][:200], flush=True)

dist.destroy_process_group()
hvd.shutdown()
faulthandler.cancel_dump_traceback_later()
print(f"rank {rank}: torchrun job ok ({n} ranks, Tandem store {store}, agent store on port {env['MASTER_PORT']})",
      flush=True)
