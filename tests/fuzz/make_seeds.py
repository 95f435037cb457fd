#!/usr/bin/env python3
"""Writes the binary seed inputs of the fuzz harnesses whose inputs are not
text (tests/fuzz/corpus/<target>/), from the wire formats as documented,
encoded here independently of the C code. The seeds are checked in; rerun
this after a format change:  /usr/bin/python3 tests/fuzz/make_seeds.py
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- hdr: fuzz_hdr.c's scenario (80 bytes) + the peer's byte stream ----
# comm_kind: allreduce 1, reduce 2, broadcast 3, reduce_scatter 4,
# allgather 5, alltoall 6, barrier 7, send 8, recv 9 (scenario byte = kind-1)
# dtype: f32 0 f64 1 f16 2 bf16 3 i32 4 i64 5 u8 6; op: sum 0 avg 1 min 2 max 3 prod 4
HDR_MAGIC = 0x54444D31


def frame_header(kind, seq, count, dtype, redop, root, src, nbytes):
    return struct.pack("<IIQQiiiiQ", HDR_MAGIC, kind, seq, count, dtype, redop, root, src, nbytes)


def hdr_seed(kind, dtype=0, redop=0, world=2, peer=1, root=0, frames=(16,), piece=0, seq=1, count=4,
             last=None, corrupt=None, truncate=0):
    sc = bytearray(80)
    sc[0] = kind - 1
    sc[1] = dtype
    sc[2] = redop
    sc[3] = world - 2
    sc[4] = peer - 1
    sc[5] = root
    sc[6] = len(frames) - 1
    sc[7] = piece
    for i, b in enumerate(frames):
        struct.pack_into("<H", sc, 8 + 2 * i, b)
    struct.pack_into("<Q", sc, 14, seq)
    struct.pack_into("<H", sc, 22, count)
    if last is not None:
        sc[24] = 1
        sc[25:73] = last
    sent_kind = 8 if kind == 9 else kind  # a RECV is checked against the peer's SEND frames
    hroot = root if kind in (2, 3) else -1
    stream = bytearray()
    for i, b in enumerate(frames):
        h = bytearray(frame_header(sent_kind, seq, count, dtype, redop, hroot, peer, b))
        if corrupt and i == 0:
            off, val = corrupt
            h[off] = val
        stream += h + bytes((j * 7 + i) & 0xFF for j in range(b))
    if truncate:
        stream = stream[:-truncate]
    return bytes(sc[:80]) + bytes(stream)


def hdr_seeds():
    write("hdr", "allreduce_f32_sum", hdr_seed(1, 0, 0, frames=(16,)))
    write("hdr", "allreduce_ring_3_chunks", hdr_seed(1, 0, 0, world=4, peer=3, frames=(12, 12, 8), count=8))
    write("hdr", "reduce_bf16_max_root2", hdr_seed(2, 3, 3, world=3, peer=2, root=2, frames=(8,)))
    write("hdr", "broadcast_f64_root0_piece5", hdr_seed(3, 1, 0, world=5, peer=1, root=0, frames=(64,), piece=5))
    write("hdr", "reduce_scatter_i64_prod", hdr_seed(4, 5, 4, world=8, peer=7, frames=(40, 40), count=10))
    write("hdr", "allgather_u8_odd", hdr_seed(5, 6, 0, world=3, peer=1, frames=(7,), count=7))
    write("hdr", "alltoall_f16", hdr_seed(6, 2, 0, world=2, frames=(0,), count=0))
    write("hdr", "barrier", hdr_seed(7, 0, 0, world=6, peer=4, frames=(0,), count=0, seq=12345))
    write("hdr", "recv_i32_piece1", hdr_seed(9, 4, 0, frames=(20,), count=5, piece=1))
    write("hdr", "send_frame_large", hdr_seed(8, 0, 0, frames=(1000,), count=250))
    # The ways a stream goes wrong: a wrong seq, count, kind, sender, magic, a short stream.
    write("hdr", "bad_seq", hdr_seed(1, frames=(16,), corrupt=(8, 9)))
    write("hdr", "bad_count", hdr_seed(1, frames=(16,), corrupt=(16, 5)))
    write("hdr", "bad_kind", hdr_seed(1, frames=(16,), corrupt=(4, 3)))
    write("hdr", "bad_sender", hdr_seed(1, world=4, frames=(16,), corrupt=(36, 2)))
    write("hdr", "bad_magic", hdr_seed(1, frames=(16,), corrupt=(0, 0)))
    write("hdr", "bad_nbytes", hdr_seed(1, frames=(16,), corrupt=(40, 15)))
    write("hdr", "short_payload", hdr_seed(1, frames=(16, 16), truncate=3))
    # A frame of the collective this rank finished last, run differently by the peer.
    last = frame_header(3, 1, 4, 0, 0, 1, 0, 0)
    write("hdr", "stale_frame_of_last_collective", hdr_seed(3, root=0, frames=(16,), last=last))


if __name__ == "__main__":
    hdr_seeds()
