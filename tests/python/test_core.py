"""tandem and tandem._tandem: collectives on NumPy arrays and buffer-protocol
objects, requests, argument errors, the exception family."""
import gc
import os
import shutil
import tempfile
import threading
import time

import numpy as np
import pytest

import tandem
from tandem import _tandem

DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8]
COUNTS = [0, 1, 7, 1000]


def contribution(rank, count, dtype):
    """Rank r's values: r + 1 + (i % 5), small integers exact in every dtype."""
    return (rank + 1 + np.arange(count) % 5).astype(dtype)


def expected(op, n, count, dtype):
    i = np.arange(count) % 5
    vals = [(r + 1 + i) for r in range(n)]
    if op == tandem.SUM:
        e = sum(vals)
    elif op == tandem.AVG:
        e = sum(vals) // n if np.issubdtype(dtype, np.integer) else sum(vals) / n
    elif op == tandem.MIN:
        e = vals[0]
    elif op == tandem.MAX:
        e = vals[-1]
    else:
        e = np.prod(vals, axis=0)
    return np.asarray(e).astype(np.float64)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", [tandem.SUM, tandem.AVG, tandem.MIN, tandem.MAX, tandem.PROD])
def test_allreduce_closed_form(dtype, op):
    n, r = tandem.size(), tandem.rank()
    for count in COUNTS:
        x = contribution(r, count, dtype)
        keep = x.copy()
        y = tandem.allreduce(x, op=op)
        np.testing.assert_array_equal(x, keep)  # out of place leaves the input alone
        np.testing.assert_array_equal(y.astype(np.float64), expected(op, n, count, dtype))
        tandem.allreduce(x, op=op, inplace=True)
        np.testing.assert_array_equal(x.astype(np.float64), expected(op, n, count, dtype))


def test_allreduce_large():
    n, r = tandem.size(), tandem.rank()
    for count in (100003, 1 << 20):
        x = contribution(r, count, np.float32)
        np.testing.assert_array_equal(tandem.allreduce(x), expected(tandem.SUM, n, count, np.float32))


def test_allreduce_async_result_and_lifetime():
    n, r = tandem.size(), tandem.rank()
    reqs = []
    for k in range(8):
        reqs.append(tandem.allreduce_async(contribution(r, 513 + k, np.float32)))  # the array is only owned by the request
    gc.collect()
    for k, req in reversed(list(enumerate(reqs))):  # any order
        y = req.wait()
        np.testing.assert_array_equal(y, expected(tandem.SUM, n, 513 + k, np.float32))
        assert req.done and req.test()
        np.testing.assert_array_equal(req.wait(), y)  # waiting again returns the same result


def test_request_test_polls_to_completion():
    x = np.ones(4096, np.float64)
    req = tandem.allreduce_async(x, inplace=True)
    deadline = time.monotonic() + 30
    while not req.test():
        assert time.monotonic() < deadline
        time.sleep(0.0005)
    assert (x == tandem.size()).all()


def test_wait_releases_the_gil():
    # A Python thread keeps running while the main thread waits on a request
    # that cannot complete until every rank issued it: rank 0 joins the
    # barrier only once every other rank's thread has ticked 20 times inside
    # it. With the GIL held in barrier() those ticks never come and rank 0
    # gives up after a minute; no fixed wait, so a loaded machine only makes
    # the test slower, never wrong.
    n, rank = tandem.size(), tandem.rank()
    path = bytearray(256)
    if rank == 0:
        tmp = tempfile.mkdtemp(prefix="tandem-gil-").encode()
        path[: len(tmp)] = tmp
    tandem.world().broadcast(path, len(path), tandem.U8, 0)
    where = path.rstrip(b"\0").decode()
    ticks = []
    waiting = threading.Event()
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            if waiting.is_set():
                ticks.append(1)
                if len(ticks) == 20:
                    open(os.path.join(where, f"rank{rank}"), "w").close()
            time.sleep(0.001)

    t = threading.Thread(target=ticker)
    t.start()
    if rank == 0:
        deadline = time.monotonic() + 60
        want = {f"rank{r}" for r in range(1, n)}
        while not want <= set(os.listdir(where)):
            assert time.monotonic() < deadline, f"ranks' threads did not run while they waited in barrier(): {sorted(want - set(os.listdir(where)))} never ticked 20 times"
            time.sleep(0.01)
    waiting.set()
    tandem.world().barrier()
    stop.set()
    t.join()
    if rank != 0:
        assert len(ticks) >= 20
    tandem.world().barrier()
    if rank == 0:
        shutil.rmtree(where)


def test_buffer_protocol_objects():
    n = tandem.size()
    w = tandem.world()
    b = bytearray([1, 2, 3])
    w.allreduce(b, b, 3, tandem.U8, tandem.SUM)
    assert list(b) == [n, 2 * n, 3 * n]
    m = memoryview(bytearray(8))
    np.frombuffer(m, np.int64)[0] = 5
    w.broadcast(m, 1, tandem.I64, 0)
    assert np.frombuffer(m, np.int64)[0] == 5


@pytest.mark.parametrize("root", [0, -1])
def test_broadcast(root):
    n, r = tandem.size(), tandem.rank()
    root = root % n
    for dtype in DTYPES:
        x = contribution(r, 1001, dtype)
        tandem.broadcast(x, root)
        np.testing.assert_array_equal(x, contribution(root, 1001, dtype))


def test_allgather_variable_rows():
    n, r = tandem.size(), tandem.rank()
    for dtype in DTYPES:
        x = np.full((r + 1, 3), r, dtype)
        g = tandem.allgather(x)
        want = np.concatenate([np.full((q + 1, 3), q, dtype) for q in range(n)])
        np.testing.assert_array_equal(g, want)


def test_reduce_scatter_alltoall_raw():
    n, r = tandem.size(), tandem.rank()
    w = tandem.world()
    count = 3 * n + 1
    send = np.arange(count, dtype=np.float64) + r
    recv = np.empty(count // n + 1, np.float64)
    w.reduce_scatter(send, recv, count, tandem.F64, tandem.SUM)
    base, extra = divmod(count, n)
    off = r * base + min(r, extra)
    ln = base + (1 if r < extra else 0)
    np.testing.assert_array_equal(recv[:ln], n * np.arange(off, off + ln) + n * (n - 1) / 2)
    a2a_send = np.array([100 * r + j for j in range(n) for _ in range(2)], np.int32)
    a2a_recv = np.empty(2 * n, np.int32)
    w.alltoall(a2a_send, a2a_recv, 2, tandem.I32)
    np.testing.assert_array_equal(a2a_recv, [100 * j + r for j in range(n) for _ in range(2)])


def test_argument_errors():
    w = tandem.world()
    x = np.zeros(10, np.float32)
    with pytest.raises(TypeError, match="numpy.ndarray"):
        tandem.allreduce([1.0, 2.0])
    with pytest.raises(TypeError, match="complex64"):
        tandem.allreduce(np.zeros(3, np.complex64))
    with pytest.raises(ValueError, match="C-contiguous"):
        tandem.allreduce(np.zeros((4, 4), np.float32)[:, ::2])
    with pytest.raises(ValueError, match="unknown reduction op"):
        tandem.allreduce(x, op="median")
    with pytest.raises(ValueError, match="holds 40 bytes but 11 elements"):
        w.allreduce(x, x, 11, tandem.F32, tandem.SUM)
    with pytest.raises(ValueError, match="unknown dtype code"):
        w.allreduce(x, x, 10, 99, tandem.SUM)
    with pytest.raises(ValueError, match="unknown op code"):
        w.allreduce(x, x, 10, tandem.F32, 17)
    with pytest.raises(ValueError, match="count must be >= 0"):
        w.allreduce(x, x, -1, tandem.F32, tandem.SUM)
    with pytest.raises(ValueError, match=f"root {7 + tandem.size()} is out of range"):
        w.broadcast(x, 10, tandem.F32, 7 + tandem.size())
    ro = np.zeros(4, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        w.allreduce(ro, ro, 4, tandem.F32, tandem.SUM)
    with pytest.raises(TypeError, match="buffer protocol"):
        w.allreduce("abc", x, 1, tandem.F32, tandem.SUM)
    with pytest.raises(ValueError, match="None but count"):
        w.allreduce(None, None, 3, tandem.F32, tandem.SUM)
    # nothing was issued by the failed calls: the world still works
    assert tandem.allreduce(np.ones(3, np.float32))[0] == tandem.size()


def test_exception_family():
    assert issubclass(tandem.RemoteError, tandem.TandemError)
    assert issubclass(tandem.TandemTimeoutError, TimeoutError)
    assert issubclass(tandem.InvalidArgumentError, ValueError)
    with pytest.raises(tandem.MismatchError) as e:
        _tandem.raise_status(_tandem.ERR_MISMATCH, "ranks 0 and 1 disagree")
    assert e.value.status == _tandem.ERR_MISMATCH and e.value.status_name
    assert "ranks 0 and 1" in str(e.value)
