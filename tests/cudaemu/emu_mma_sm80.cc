/* CUDA emulator (tests/cudaemu): the sm_80 warp-level matrix instructions
 * that src/nn/cuda/mma_sm80.cuh wraps in inline PTX on a GPU, with the
 * per-lane fragment layouts of the PTX ISA ("Warp-level matrix fragments
 * for mma.m16n8k16", "ldmatrix"), so that kernels which keep scores in
 * registers and rely on the layout (FlashAttention-2's C->A identity, row
 * statistics by quad shuffles) compute here what they compute on a GPU.
 * Notation: lane = 4 g + t (g = lane / 4, "groupID"; t = lane % 4).
 *  - A (16 x 16, bf16, row): a[0] = A[g][2t, 2t+1], a[1] = A[g+8][2t, 2t+1],
 *    a[2] = A[g][2t+8, 2t+9], a[3] = A[g+8][2t+8, 2t+9]; the lower column in
 *    the low 16 bits;
 *  - B (16 x 8, bf16, col): b[0] = B[2t, 2t+1][g], b[1] = B[2t+8, 2t+9][g];
 *  - C, D (16 x 8, f32): c[0], c[1] = C[g][2t, 2t+1], c[2], c[3] = C[g+8][2t, 2t+1];
 *  - ldmatrix .x4: lanes 8i .. 8i+7 give the addresses of the 8 rows (16
 *    bytes each) of matrix i; r[i] = M_i[g][2t, 2t+1], with .trans
 *    r[i] = M_i[2t][g], M_i[2t+1][g].
 * cp.async (16 bytes, zero-fill), commit_group and wait_group queue each
 * thread's copies and do them at the wait that completes their group.
 * Each warp-level instruction deposits the lane's operands in its lane box
 * (lane_box_mine), waits for the warp and reads what it needs from the other
 * lanes' boxes (two boxes a lane, used in turn: the deposit stays until every
 * lane has read it). Products: exact products
 * of bf16 values, summed in f32 in k order (the tensor cores' internal order
 * and rounding differ in the last bits; the kernels' tests bound them). */
#include <cuda_emu.h>

namespace td_emu {

static inline float bf16_lo(uint32_t v) { return td_emu_bf16_bits_to_f32((unsigned short)(v & 0xffffu)); }
static inline float bf16_hi(uint32_t v) { return td_emu_bf16_bits_to_f32((unsigned short)(v >> 16)); }

struct mma_box {
  uint32_t a[4], b[2];
};

void mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
  unsigned me = lane(), g = me / 4, t = me % 4;
  mma_box *mine = (mma_box *)lane_box_mine();
  memcpy(mine->a, a, sizeof mine->a);
  memcpy(mine->b, b, sizeof mine->b);
  float cin[4] = {c[0], c[1], c[2], c[3]}; /* d may alias c */
  sync_warp();
  /* rows g and g + 8 of A: lanes 4g .. 4g+3 hold them (a[0], a[2]: row g;
   * a[1], a[3]: row g + 8), lane 4g + t' the columns 2t', 2t'+1 and 2t'+8, 2t'+9 */
  float arow[2][16];
  for (unsigned tt = 0; tt < 4; tt++) {
    const mma_box *src = (const mma_box *)lane_box(4 * g + tt);
    for (int half = 0; half < 2; half++) {
      arow[half][2 * tt] = bf16_lo(src->a[half]);
      arow[half][2 * tt + 1] = bf16_hi(src->a[half]);
      arow[half][2 * tt + 8] = bf16_lo(src->a[2 + half]);
      arow[half][2 * tt + 9] = bf16_hi(src->a[2 + half]);
    }
  }
  /* columns 2t and 2t + 1 of B: column n is held by lanes 4n .. 4n+3 */
  float bcol[2][16];
  for (int j = 0; j < 2; j++)
    for (unsigned tt = 0; tt < 4; tt++) {
      const mma_box *src = (const mma_box *)lane_box(4 * (2 * t + j) + tt);
      bcol[j][2 * tt] = bf16_lo(src->b[0]);
      bcol[j][2 * tt + 1] = bf16_hi(src->b[0]);
      bcol[j][2 * tt + 8] = bf16_lo(src->b[1]);
      bcol[j][2 * tt + 9] = bf16_hi(src->b[1]);
    }
  for (int half = 0; half < 2; half++)
    for (int j = 0; j < 2; j++) {
      float s = cin[2 * half + j];
      for (int k = 0; k < 16; k++) s += arow[half][k] * bcol[j][k];
      d[2 * half + j] = s;
    }
}

void ldmatrix_x4(uint32_t r[4], const void *row, bool trans) {
  unsigned me = lane(), g = me / 4, t = me % 4;
  if ((uintptr_t)row % 16)
    fault("ldmatrix: lane %u's row address %p is not 16-byte aligned (misaligned address on a GPU)", me, row);
  memcpy(lane_box_mine(), &row, sizeof row);
  sync_warp();
  for (int i = 0; i < 4; i++) {
    unsigned short lo, hi;
    const unsigned short *p;
    if (!trans) {
      memcpy(&p, lane_box(8 * i + g), sizeof p);
      lo = p[2 * t], hi = p[2 * t + 1];
    } else {
      memcpy(&p, lane_box(8 * i + 2 * t), sizeof p);
      lo = p[g];
      memcpy(&p, lane_box(8 * i + 2 * t + 1), sizeof p);
      hi = p[g];
    }
    r[i] = (uint32_t)lo | (uint32_t)hi << 16;
  }
}

void cp_async16(void *dst, const void *src) {
  cp_async_queue *q = cp_async_mine();
  if ((uintptr_t)dst % 16 || (uintptr_t)src % 16) {
    fault("cp.async: 16 bytes from %p to %p, not both 16-byte aligned", src, dst);
    return;
  }
  if (q->n_ops == (int)(sizeof q->ops / sizeof q->ops[0])) {
    fault("cp.async: more than %d copies of one thread pending (the emulator's queue)", q->n_ops);
    return;
  }
  q->ops[q->n_ops].dst = dst;
  q->ops[q->n_ops].src = src;
  q->n_ops++;
}

void cp_async_commit() {
  cp_async_queue *q = cp_async_mine();
  if (q->n_groups == (int)(sizeof q->group_end / sizeof q->group_end[0])) {
    fault("cp.async.commit_group: more than %d groups of one thread pending (the emulator's queue)", q->n_groups);
    return;
  }
  q->group_end[q->n_groups++] = q->n_ops;
  q->n_committed = q->n_ops;
}

/* cp.async.wait_group N: every committed group but the newest N is done */
void cp_async_wait(int newest_pending) {
  cp_async_queue *q = cp_async_mine();
  int done_groups = q->n_groups - newest_pending;
  if (done_groups <= 0) return;
  int done_ops = q->group_end[done_groups - 1];
  for (int i = 0; i < done_ops; i++) {
    if (q->ops[i].src)
      memcpy(q->ops[i].dst, q->ops[i].src, 16);
    else
      memset(q->ops[i].dst, 0, 16);
  }
  memmove(q->ops, q->ops + done_ops, sizeof q->ops[0] * (size_t)(q->n_ops - done_ops));
  q->n_ops -= done_ops;
  q->n_committed -= done_ops;
  for (int g = done_groups; g < q->n_groups; g++) q->group_end[g - done_groups] = q->group_end[g] - done_ops;
  q->n_groups -= done_groups;
}

} // namespace td_emu
