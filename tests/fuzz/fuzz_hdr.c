/* libFuzzer harness for the operation header check: the frames a rank reads
 * from a peer's byte stream (src/comm/p2p/p2p.c: p2p_run, step_recv,
 * check_header; src/comm/core/op.c: the descriptions used in its messages).
 *
 * A fake transport plays the peer: its try_recv hands out the fuzz input's
 * stream in pieces of a fuzz-chosen size, and reports a closed connection
 * (TD_ERR_REMOTE, as the real transports do) when the stream ends. The
 * receiving rank is rank 0 of a communicator built here, with no store and
 * no progress thread: exactly what p2p_run touches.
 *
 * Input: an 80-byte scenario (zero-padded if shorter), then the stream.
 *   [0] kind  [1] dtype (the caller's)  [2] redop  [3] world size  [4] peer  [5] root
 *   [6] frames expected  [7] bytes per try_recv (0: all at once)
 *   [8..13] payload bytes of each frame (u16 LE, mod 1024)
 *   [14..21] seq (u64 LE)  [22..23] count (u16 LE)
 *   [24] has a last collective  [25..73) its header, raw (comm->last_coll)
 *   [73] the dtype the algorithm moves (headers must ignore it)  [74..80) unused
 *   (byte 80 is the first of the stream)
 *
 * Oracle, from a decoding written here (explicit offsets, independent of
 * comm_hdr's definition): p2p_run returns TD_OK exactly when every expected
 * frame is in the stream, complete, with a header that names this
 * operation (magic "TDM1", kind, seq, count, the caller's dtype, op, root, sender, payload
 * size), and then every payload is where it belongs. Otherwise the first bad
 * frame decides: a complete header that is wrong is TD_ERR_MISMATCH (or
 * TD_ERR_INTERNAL for a wrong sender), a stream that ends first is
 * TD_ERR_REMOTE; the message names this rank. Any other outcome traps. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/p2p/p2p.h"

#define SCENARIO_BYTES 80
#define FRAME_HDR_BYTES 48
#define MAX_FRAMES 3

typedef struct fake_transport {
  transport base;
  const uint8_t *stream;
  size_t len, pos, piece;
} fake_transport;

static td_status fake_try_send(transport *t, int peer, const void *buf, size_t len, size_t *moved) {
  *moved = len;
  return TD_OK;
}

static td_status fake_try_recv(transport *t, int peer, void *buf, size_t len, size_t *moved) {
  fake_transport *f = (fake_transport *)t;
  if (f->pos == f->len) {
    *moved = 0;
    return comm_fail(t->comm, TD_ERR_REMOTE, "lost the connection to rank %d (end of the fuzz input)", peer);
  }
  size_t n = f->len - f->pos;
  if (n > len) n = len;
  if (f->piece && n > f->piece) n = f->piece;
  memcpy(buf, f->stream + f->pos, n);
  f->pos += n;
  *moved = n;
  return TD_OK;
}

static td_status fake_wait(transport *t, const int *send_peers, int n_send, const int *recv_peers, int n_recv,
                           double timeout_s) {
  return TD_OK; /* never reached: every try_recv moves bytes or fails */
}

static void fake_abort(transport *t, td_status status, const char *reason) {}
static void fake_destroy(transport *t) {}

static const transport_vtbl fake_vtbl = {
    .name = "fuzz", .try_send = fake_try_send, .try_recv = fake_try_recv, .wait = fake_wait,
    .abort = fake_abort, .destroy = fake_destroy,
};

static uint64_t le(const uint8_t *p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

static void require(int ok, const char *what, const td_comm *comm) {
  if (ok) return;
  fprintf(stderr, "fuzz_hdr: contract broken: %s (status %s, message \"%s\")\n", what,
          td_status_str((td_status)comm->err_status), comm->err_msg);
  __builtin_trap();
}

/* Whether the 48 header bytes at p describe `op` sent by `peer` with `bytes`
 * of payload. The layout is the wire format: magic u32, kind u32, seq u64,
 * count u64, dtype i32, redop i32, root i32, src_rank i32, nbytes u64. */
static int header_matches(const uint8_t *p, const comm_op *op, int peer, size_t bytes) {
  uint32_t kind = op->kind == COMM_RECV ? COMM_SEND : op->kind;
  return le(p, 4) == 0x54444d31u && le(p + 4, 4) == kind && le(p + 8, 8) == op->seq && le(p + 16, 8) == op->count &&
         le(p + 24, 4) == (uint32_t)op->user_dtype && le(p + 28, 4) == (uint32_t)op->redop &&
         le(p + 32, 4) == (uint32_t)op->root && le(p + 36, 4) == (uint32_t)peer && le(p + 40, 8) == bytes;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t sc[SCENARIO_BYTES] = {0};
  memcpy(sc, data, size < SCENARIO_BYTES ? size : SCENARIO_BYTES);
  const uint8_t *stream = size > SCENARIO_BYTES ? data + SCENARIO_BYTES : data;
  size_t stream_len = size > SCENARIO_BYTES ? size - SCENARIO_BYTES : 0;

  int world = 2 + sc[3] % 7;
  int peer = 1 + sc[4] % (world - 1);
  comm_op op = {0};
  op.kind = (comm_kind)(1 + sc[0] % 9);
  /* Frames carry the caller's dtype; the one the algorithm moves (f32
   * partials of an f16 reduction) must not leak into them. */
  op.user_dtype = (td_dtype)(sc[1] % TD_DTYPE_COUNT);
  op.dtype = (td_dtype)(sc[73] % TD_DTYPE_COUNT);
  op.redop = (td_op)(sc[2] % TD_OP_COUNT);
  op.root = op.kind == COMM_REDUCE || op.kind == COMM_BROADCAST ? sc[5] % world : -1;
  op.peer = op.kind == COMM_SEND || op.kind == COMM_RECV ? peer : -1;
  op.seq = le(sc + 14, 8);
  op.count = (size_t)le(sc + 22, 2);
  op.deadline = td_now() + 30;
  int n_frames = 1 + sc[6] % MAX_FRAMES;
  size_t bytes[MAX_FRAMES];
  for (int i = 0; i < MAX_FRAMES; i++) bytes[i] = (size_t)le(sc + 8 + 2 * i, 2) % 1024;

  fake_transport fake = {.base = {.vtbl = &fake_vtbl}, .stream = stream, .len = stream_len, .piece = sc[7]};
  td_comm *comm = calloc(1, sizeof *comm);
  if (!comm) return 0;
  comm->rank = 0;
  comm->size = world;
  comm->timeout_s = 30;
  pthread_mutex_init(&comm->err_mu, NULL);
  atomic_store(&comm->err_status, TD_OK);
  snprintf(comm->prefix, sizeof comm->prefix, "fuzz");
  comm->xport = &fake.base;
  comm->xport_name = "fuzz";
  fake.base.comm = comm;
  if (sc[24] & 1) memcpy(&comm->last_coll, sc + 25, sizeof comm->last_coll);

  uint8_t *bufs[MAX_FRAMES] = {0};
  p2p_xfer recvs[MAX_FRAMES];
  for (int i = 0; i < n_frames; i++) {
    bufs[i] = malloc(bytes[i] ? bytes[i] : 1);
    if (!bufs[i]) goto out;
    recvs[i] = (p2p_xfer){.peer = peer, .buf = bufs[i], .bytes = bytes[i]};
  }
  td_status st = p2p_run(comm, &op, NULL, 0, recvs, n_frames);

  /* What the stream says should have happened. */
  td_status expected = TD_OK;
  int bad_header = 0, bad_sender = 0;
  size_t off = 0;
  for (int i = 0; i < n_frames && expected == TD_OK; i++) {
    if (stream_len - off < FRAME_HDR_BYTES) {
      expected = TD_ERR_REMOTE;
    } else if (!header_matches(stream + off, &op, peer, bytes[i])) {
      expected = TD_ERR_MISMATCH;
      bad_header = 1;
      bad_sender = le(stream + off + 36, 4) != (uint32_t)peer && le(stream + off, 4) == 0x54444d31u;
    } else if (stream_len - off - FRAME_HDR_BYTES < bytes[i]) {
      expected = TD_ERR_REMOTE;
    } else {
      off += FRAME_HDR_BYTES + bytes[i];
    }
  }
  if (expected == TD_OK) {
    require(st == TD_OK, "valid frames were refused", comm);
    off = 0;
    for (int i = 0; i < n_frames; i++) {
      require(memcmp(bufs[i], stream + off + FRAME_HDR_BYTES, bytes[i]) == 0, "a payload was not delivered", comm);
      off += FRAME_HDR_BYTES + bytes[i];
    }
  } else {
    require(st != TD_OK, "a bad or short stream was accepted", comm);
    require(st == comm_status(comm), "the returned status is not the communicator's sticky error", comm);
    if (bad_header)
      require(st == (bad_sender ? TD_ERR_INTERNAL : TD_ERR_MISMATCH), "a wrong header got the wrong status", comm);
    else
      require(st == TD_ERR_REMOTE, "a short stream got the wrong status", comm);
    require(strncmp(comm->err_msg, "rank 0", 6) == 0 && (comm->err_msg[6] == ' ' || comm->err_msg[6] == ':'),
            "the message does not name the receiving rank", comm);
  }

  /* The descriptions used in messages, on the raw bytes and any buffer size. */
  if (stream_len >= FRAME_HDR_BYTES) {
    comm_hdr raw;
    memcpy(&raw, stream, sizeof raw);
    char small[300];
    size_t cap = 1 + sc[7] % sizeof small;
    comm_hdr_describe(&raw, small, cap);
    require(strlen(small) < cap, "a description overran its buffer", comm);
  }

out:
  for (int i = 0; i < n_frames; i++) free(bufs[i]);
  pthread_mutex_destroy(&comm->err_mu);
  free(comm);
  return 0;
}
