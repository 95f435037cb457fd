"""torch.distributed subgroups on the tandem backend, 2-4 real ranks.

torch calls a backend only on a group's members, so each rank sees its own
sequence of groups: after new_group([n-1]), new_group(all) is rank 0's first
Tandem group and rank n-1's second. Each group here is checked against
closed forms over its members' global ranks (sum, broadcast from its last
member, gather in group-rank order): groups that leave ranks out, that
overlap, that repeat a membership, used interleaved. Then the group timeout:
a collective whose peer never comes fails within the group's timeout=, not
Tandem's default 300 s.

Before the fix (3eede20) the second group's members joined different
communicators and waited 60 s; the watchdog below turns that into a failure
after 50 s, inside the suite line's timeout."""
import datetime
import faulthandler
import sys
import time

import torch
import torch.distributed as dist

import tandem.torch  # noqa: F401  (registers the backend)

faulthandler.dump_traceback_later(50, exit=True)  # a hang is a failure, with the stacks shown
SHORT = datetime.timedelta(seconds=6)

dist.init_process_group("tandem", timeout=datetime.timedelta(seconds=20))  # outlasts the late rank below
me, n = dist.get_rank(), dist.get_world_size()
assert n >= 2, "run with at least 2 ranks"


def check(group, members):
    """The group's collectives against closed forms over `members` (global ranks)."""
    if me not in members:
        assert group == dist.GroupMember.NON_GROUP_MEMBER
        return
    assert dist.get_world_size(group) == len(members)
    assert dist.get_rank(group) == members.index(me)  # group ranks follow the order of the ranks given
    t = torch.tensor([me + 1.0, 10.0 * (me + 1), 1.0])
    dist.all_reduce(t, group=group)
    want = [sum(m + 1.0 for m in members), sum(10.0 * (m + 1) for m in members), float(len(members))]
    assert t.tolist() == want, (members, t.tolist(), want)
    b = torch.full((3,), float(me))
    dist.broadcast(b, src=members[-1], group=group)  # src is a global rank
    assert b.tolist() == [float(members[-1])] * 3, (members, b.tolist())
    outs = [torch.empty(2, dtype=torch.int64) for _ in members]
    dist.all_gather(outs, torch.tensor([me, 7 * me]), group=group)
    assert [o.tolist() for o in outs] == [[m, 7 * m] for m in members], (members, outs)


everyone = list(range(n))
# The case: a group of the last rank alone, then one of everyone.
alone = dist.new_group([n - 1], timeout=SHORT)
world2 = dist.new_group(everyone, timeout=SHORT)
check(alone, [n - 1])
check(world2, everyone)

# Groups that leave ranks out and overlap, created in an order in which every
# rank has joined a different number of groups before each.
specs = [[0, 1], [n - 1, 0] if n > 2 else [1, 0], [1, n - 1] if n > 2 else [1], [0, 1]]
if n >= 3:
    specs += [[1, 2], [0, 2], [2]]
if n >= 4:
    specs += [[3, 1, 2], [0, 3], [1, 2, 3]]
groups = [(dist.new_group(m, timeout=SHORT), sorted(m)) for m in specs]
# torch orders a group's ranks by global rank whatever order they were given in
for g, members in groups:  # interleaved: one collective in each in turn, twice
    check(g, members)
for g, members in reversed(groups):
    check(g, members)
check(alone, [n - 1])
check(world2, everyone)

# The group's timeout= bounds its collectives: rank 1 never joins this
# all_reduce, and rank 0 must learn so within the 3 s asked for.
pair = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=3))
if me == 0:
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4), group=pair)
        raise AssertionError("an all_reduce that rank 1 never joined succeeded")
    except RuntimeError as e:
        dt = time.monotonic() - t0
        assert "timeout" in str(e).lower() or "did not finish" in str(e), e
        assert 2.5 <= dt <= 15, f"the 3 s group timeout ended the wait after {dt:.1f} s: {e}"
        print(f"rank 0: abandoned all_reduce failed after {dt:.1f} s: {str(e)[:160]}", flush=True)
dist.barrier()  # the world group is unaffected

# ... and its creation: rank 1 comes 8 s late to a group created with a 3 s
# timeout. Rank 0 gives up after 3 s naming the missing member; rank 1 then
# finds rank 0 gone and gives up within 3 s too (Tandem's start-up wait is
# capped by the timeout, not its default 60 s).
if me in (0, 1):
    if me == 1:
        time.sleep(8)
    t0 = time.monotonic()
    try:
        dist.new_group([0, 1], timeout=datetime.timedelta(seconds=3))
        raise AssertionError(f"rank {me}: a group whose other member came 8 s late was created")
    except RuntimeError as e:
        dt = time.monotonic() - t0
        assert 2.5 <= dt <= 12, f"rank {me}: the 3 s timeout ended group creation after {dt:.1f} s: {e}"
        if me == 0:
            assert "group rank(s) [1] did not join within 3 s" in str(e), e
        print(f"rank {me}: late group failed after {dt:.1f} s: {str(e)[:200]}", flush=True)
# The other ranks do not call this new_group: torch's store barrier at its end
# would wait for the members, who left it by the exception. It is the last
# group created, so no later group's name depends on it.
dist.barrier()

t = torch.ones(1)
dist.all_reduce(t)
assert t.item() == n
dist.destroy_process_group()
faulthandler.cancel_dump_traceback_later()
print(f"rank {me}: subgroups ok ({len(groups) + 3} groups of {n} ranks)", flush=True)
sys.exit(0)
