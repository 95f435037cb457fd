#!/usr/bin/env python3
"""Writes the binary seed inputs of the fuzz harnesses whose inputs are not
text (tests/fuzz/corpus/<target>/), from the wire formats as documented,
encoded here independently of the C code. The seeds are checked in; rerun
this after a format change:  /usr/bin/python3 tests/fuzz/make_seeds.py
"""
import os
import struct
import zlib

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
             last=None, corrupt=None, truncate=0, moved_dtype=None):
    sc = bytearray(80)
    sc[73] = dtype if moved_dtype is None else moved_dtype
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
    write("hdr", "allreduce_f16_on_f32_partials", hdr_seed(1, 2, 0, world=3, peer=2, frames=(24,), count=6, moved_dtype=0))
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


# ---- store: fuzz_store.c's client count + length prefix + request streams ----
# request: magic u32 | op u32 | key_len u32 | flags u32 | a_len u64 | b_len u64 | arg i64 | key a b
STORE_MAGIC = 0x31534454
SET, GET, WAIT, ADD, CAS, DELETE, GATHER = 1, 2, 3, 4, 5, 6, 7


def req(op, key, a=b"", b=b"", arg=0, flags=0):
    return struct.pack("<IIIIQQq", STORE_MAGIC, op, len(key), flags, len(a), len(b), arg) + key + a + b


def store_input(*streams, lockstep=False):
    out = bytes([len(streams) - 1 | (4 if lockstep else 0)])
    for st in streams[:-1]:
        out += struct.pack("<H", len(st))
    return out + b"".join(streams)


def store_seeds():
    rendezvous = (req(SET, b"job/c0/peer/0", b"2\nhost-a\n4242\n127.0.0.1") +
                  req(ADD, b"job/c0/count", arg=1) + req(ADD, b"job/c0/count", arg=1) +
                  req(GET, b"job/c0/peer/0") + req(GET, b"job/c0/peer/1") +
                  req(WAIT, b"job/c0/peer/0", arg=1000) + req(WAIT, b"job/c0/peer/9", arg=0) +
                  req(CAS, b"job/c0/abort", b"", b"status 6\nrank 1 died", flags=1) +
                  req(CAS, b"job/c0/abort", b"status 6\nrank 1 died", b"x") +
                  req(CAS, b"job/c0/abort", b"wrong", b"y") +
                  req(DELETE, b"job/c0/peer/0") + req(DELETE, b"job/c0/peer/0") + req(GET, b"job/c0/peer/0"))
    write("store", "rendezvous_one_client", store_input(rendezvous))
    write("store", "add_wraps_and_non_integer",
          store_input(req(ADD, b"n", arg=2**63 - 1) + req(ADD, b"n", arg=1) + req(SET, b"s", b"abc") +
                      req(ADD, b"s", arg=1) + req(SET, b"e", b"") + req(ADD, b"e", arg=-5) + req(GET, b"n")))
    write("store", "key_with_nul_and_unknown_op",
          store_input(req(SET, b"a\0b", b"v1") + req(GET, b"a") + req(77, b"k") + req(GET, b"a\0c")))
    write("store", "wait_woken_by_other_client",
          store_input(req(WAIT, b"k", arg=-1), req(SET, b"k", b"value") + req(GET, b"k")))
    write("store", "three_clients",
          store_input(req(WAIT, b"x", arg=500), req(ADD, b"x", arg=3), req(CAS, b"x", b"3", b"4") + req(GET, b"x")))
    write("store", "parked_then_hangup", store_input(req(WAIT, b"never", arg=60000) + req(GET, b"never")))
    write("store", "bad_magic", store_input(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
    write("store", "oversized_value_header", store_input(struct.pack("<IIIIQQq", STORE_MAGIC, SET, 1, 0, 2**40, 0, 0) + b"k"))
    write("store", "rendezvous_lockstep", store_input(rendezvous, lockstep=True))
    write("store", "wait_woken_lockstep",
          store_input(req(WAIT, b"k", arg=-1) + req(GET, b"k"), req(SET, b"k", b"value") + req(GET, b"k"), lockstep=True))
    peers = b"".join(req(SET, b"job/c0/peer/%d" % r, b"rank %d at 127.0.0.1:%d" % (r, 4000 + r)) for r in range(3))
    write("store", "gather_all_present", store_input(peers + req(GATHER, b"job/c0/peer/", struct.pack("<Q", 3), arg=1000)))
    write("store", "gather_timeout_0", store_input(peers + req(GATHER, b"job/c0/peer/", struct.pack("<Q", 5), arg=0)))
    write("store", "gather_bad_count", store_input(req(GATHER, b"p", struct.pack("<Q", 0)) + req(GATHER, b"p", b"\x01")))
    write("store", "gather_parked_then_filled",
          store_input(req(GATHER, b"g/", struct.pack("<Q", 2), arg=-1), req(SET, b"g/0", b"a") + req(SET, b"g/1", b"bb"),
                      lockstep=True))
    write("store", "truncated_body", store_input(req(SET, b"key", b"0123456789")[:-4]))


# ---- hello: fuzz_hello.c's mode byte + role/rank byte + the peer's bytes ----
# HELLO: magic "TDA1" | role u32 | rank i32 | nonce[32]; CHALLENGE/PROOF/ACCEPT: magic | 32 bytes
AUTH_MAGIC = 0x31414454
ROLE_STORE, ROLE_TCP = 1, 2


def hello_msg(role, rank, nonce=bytes(range(32))):
    return struct.pack("<IIi", AUTH_MAGIC, role, rank) + nonce


def auth_msg(payload=bytes(range(100, 132))):
    return struct.pack("<I", AUTH_MAGIC) + payload


def role_rank(role, rank):
    return bytes([(1 if role == ROLE_TCP else 0) | ((rank + 1) << 1)])


def hello_seeds():
    write("hello", "acceptor_tcp_rank3_bad_proof", bytes([0]) + role_rank(ROLE_TCP, 3) + hello_msg(ROLE_TCP, 3) + auth_msg())
    write("hello", "acceptor_store_client", bytes([0]) + role_rank(ROLE_STORE, -1) + hello_msg(ROLE_STORE, -1) + auth_msg())
    write("hello", "acceptor_wrong_role", bytes([0]) + role_rank(ROLE_TCP, 1) + hello_msg(ROLE_STORE, 1) + auth_msg())
    write("hello", "acceptor_old_tcp_hello", bytes([0]) + role_rank(ROLE_TCP, 1) + struct.pack("<IiQ", 0x54444843, 1, 12345))
    write("hello", "acceptor_short_hello", bytes([0]) + role_rank(ROLE_TCP, 2) + hello_msg(ROLE_TCP, 2)[:30])
    write("hello", "connector_bad_accept", bytes([1]) + role_rank(ROLE_TCP, 5) + auth_msg() + auth_msg(bytes(32)))
    write("hello", "connector_no_accept", bytes([1]) + role_rank(ROLE_STORE, -1) + auth_msg())
    write("hello", "connector_garbage", bytes([1]) + role_rank(ROLE_TCP, 0) + b"SSH-2.0-OpenSSH_9.2\r\n")
    write("hello", "honest_match", bytes([2]) + role_rank(ROLE_TCP, 4))
    write("hello", "honest_wrong_role", bytes([2]) + role_rank(ROLE_STORE, 4))
    write("hello", "honest_wrong_context", bytes([2 | 8]) + role_rank(ROLE_TCP, 4))
    # The acceptor's state machine: byte 0 = 4 (fuzzed bytes) or 5 (honest), bits 3-7 = piece size.
    write("hello", "machine_hello_bad_proof", bytes([4]) + role_rank(ROLE_TCP, 0) + hello_msg(ROLE_TCP, 3) + auth_msg())
    write("hello", "machine_bytewise", bytes([4 | (1 << 3)]) + role_rank(ROLE_TCP, 0) + hello_msg(ROLE_TCP, 3) + auth_msg())
    write("hello", "machine_no_magic", bytes([4 | (3 << 3)]) + role_rank(ROLE_TCP, 0) + b"GET / HTTP/1.1\r\n")
    write("hello", "machine_store_role", bytes([4]) + role_rank(ROLE_TCP, 0) + hello_msg(ROLE_STORE, -1))
    write("hello", "machine_honest", bytes([5]) + role_rank(ROLE_TCP, 0) + hello_msg(ROLE_TCP, 9))
    write("hello", "machine_honest_pieces", bytes([5 | (7 << 3)]) + role_rank(ROLE_TCP, 0) + hello_msg(ROLE_TCP, 1))
    write("hello", "parse_hello", bytes([3, 0]) + hello_msg(ROLE_TCP, 7))
    write("hello", "parse_msg", bytes([3, 0]) + auth_msg())


# ---- manifest: fuzz_manifest.c's mode byte + the manifest ----
# Odd mode byte: the harness appends "manifest_crc X"; even: passed as is.
def manifest_body(world=2, n_params=1000, tensors=((0, 600, "wte"), (600, 400, "ln.w")), states=2,
                  kind="gpt", config="layers=2 heads=4 embd=64 ctx=32 vocab=96", optimizer="adamw", step=40,
                  chunk=256, fmt=2):
    """Format 2 (src/train/checkpoint/manifest.c): rank r's file holds its
    shard (base + 1 for the first count % world ranks) of every arena, one
    CRC per `chunk` bytes of each piece."""
    lines = [f"tandem-checkpoint {fmt}", f"world_size {world}", "zero_stage 0", f"step {step}",
             "samples_consumed 1280", "seed 1337", "dataset_samples 5000", "train_batch_size 32", f"model_kind {kind}"]
    if config is not None:
        lines.append(f"model_config {config}")
    lines += [f"n_params {n_params}", f"optimizer {optimizer}", f"n_state_arenas {states}", f"chunk_bytes {chunk}",
              f"n_tensors {len(tensors)}"]
    lines += [f"tensor {o} {c} {name}" for o, c, name in tensors]
    names = ["params"] + (["adamw.m", "adamw.v"] if states == 2 else ["sgd.state0"])
    lines += [f"n_arenas {1 + states}"] + [f"arena {a} {names[a]} f32 {n_params}" for a in range(1 + states)]
    base, extra = divmod(n_params, world)
    shard = [(r * base + min(r, extra), base + (1 if r < extra else 0)) for r in range(world)]
    lines += [f"n_files {world}"] + [f"file rank-{r}.bin {shard[r][1] * 4 * (1 + states)}" for r in range(world)]
    for r, (lo, n) in enumerate(shard):
        for a in range(1 + states):
            if n == 0:
                continue
            crcs = ",".join(f"{0x1234abcd + r + k:08x}" for k in range((4 * n + chunk - 1) // chunk))
            lines.append(f"piece {r} {a} {lo} {lo + n} {a * n * 4} {crcs}")
    return ("\n".join(lines) + "\n").encode()


def with_crc(body):
    return body + b"manifest_crc %08x\n" % zlib.crc32(body)


def manifest_seeds():
    gpt = manifest_body()
    write("manifest", "gpt_np2_body", b"\x01" + gpt)
    write("manifest", "gpt_np2_complete", b"\x00" + with_crc(gpt))
    write("manifest", "cnn_np4_sgd_body", b"\x01" + manifest_body(world=4, n_params=4096, states=1, kind="cnn",
                                                                  config=None, optimizer="sgd",
                                                                  tensors=((0, 4000, "conv1.w"), (4000, 96, "fc.b"))))
    write("manifest", "np1_no_tensors_body", b"\x01" + manifest_body(world=1, tensors=()))
    write("manifest", "bad_crc", b"\x00" + gpt + b"manifest_crc 00000000\n")
    write("manifest", "truncated", b"\x00" + with_crc(gpt)[:-9])
    write("manifest", "duplicate_key_body", b"\x01" + gpt + b"world_size 2\n")
    write("manifest", "odd_np3_body", b"\x01" + manifest_body(world=3, n_params=1001, chunk=64))
    write("manifest", "format1_body", b"\x01" + manifest_body(fmt=1))
    write("manifest", "tensor_beyond_params_body",
          b"\x01" + manifest_body(tensors=((0, 600, "wte"), (600, 401, "ln.w"))))


if __name__ == "__main__":
    hdr_seeds()
    store_seeds()
    hello_seeds()
    manifest_seeds()
