/* The sm_80+ warp-level tensor-core instructions Tandem's kernels use, as
 * inline PTX under nvcc and as the CUDA emulator's implementation of the
 * same instructions otherwise (tests/cudaemu/emu_mma_sm80.cc), which follows
 * the same per-lane fragment layouts, so that one kernel source runs in
 * both. Unlike wmma (mma.h), whose fragment-to-lane mapping is unspecified,
 * these layouts are documented (PTX ISA, "Matrix fragments for
 * mma.m16n8k16"), which lets a kernel keep a product's result in registers
 * and use it as the next product's operand. With lane = 4 g + t:
 *  - A (16 x 16 bf16, row-major): a[0] = A[g][2t..2t+1], a[1] = A[g+8][2t..2t+1],
 *    a[2] = A[g][2t+8..2t+9], a[3] = A[g+8][2t+8..2t+9] (lower column in the
 *    low half of the 32-bit register);
 *  - B (16 x 8 bf16, "col"): b[0] = B[2t..2t+1][g], b[1] = B[2t+8..2t+9][g];
 *  - C, D (16 x 8 f32): c[0..1] = C[g][2t..2t+1], c[2..3] = C[g+8][2t..2t+1].
 * So two adjacent C tiles (columns 0-7 and 8-15) of one 16-row strip are,
 * element for element, the A fragment of that 16 x 16 strip:
 * a = {pack(c0[0], c0[1]), pack(c0[2], c0[3]), pack(c1[0], c1[1]), pack(c1[2], c1[3])}.
 * ldmatrix .x4: lanes 8i .. 8i+7 give the shared-memory addresses of the 8
 * rows (16 bytes, 16-byte aligned) of 8 x 8 matrix i; lane 4g + t receives
 * r[i] = M_i[g][2t..2t+1], or with .trans M_i[2t][g], M_i[2t+1][g].
 * All are warp-collective: every lane of the warp calls them together. */
#ifndef TD_NN_CUDA_MMA_SM80_CUH
#define TD_NN_CUDA_MMA_SM80_CUH

#include <stdint.h>
#include <string.h>

#include <cuda_bf16.h>

/* d = a b + c (m16n8k16, bf16 operands, f32 accumulation); d may be c */
__device__ __forceinline__ void td_mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2],
                                                  const float c[4]) {
#ifdef TD_CUDA_EMU
  td_emu::mma_m16n8k16_bf16(d, a, b, c);
#else
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
               "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
               : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
                 "f"(c[2]), "f"(c[3]));
#endif
}

/* four 8 x 8 bf16 matrices from shared memory, each transposed when TRANS;
 * `row`: this lane's row address. The instruction string is spelled out per
 * form: asm takes no run-time text. */
template <bool TRANS> __device__ __forceinline__ void td_ldmatrix_x4_t(uint32_t r[4], const void *row) {
#ifdef TD_CUDA_EMU
  td_emu::ldmatrix_x4(r, row, TRANS);
#else
  unsigned addr = (unsigned)__cvta_generic_to_shared(row);
  if (TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
#endif
}
__device__ __forceinline__ void td_ldmatrix_x4(uint32_t r[4], const void *row) { td_ldmatrix_x4_t<false>(r, row); }
__device__ __forceinline__ void td_ldmatrix_x4_trans(uint32_t r[4], const void *row) { td_ldmatrix_x4_t<true>(r, row); }

/* Asynchronous 16-byte copy from global to shared memory (cp.async.cg:
 * through L2 only), zeros instead when !valid (src is not read then); both
 * addresses 16-byte aligned. Per thread, copies issued before a
 * td_cp_async_commit form a group; td_cp_async_wait<0> waits for every
 * group of this thread (a __syncthreads after it makes all threads' copies
 * visible to the block). */
__device__ __forceinline__ void td_cp_async16(void *dst, const void *src, bool valid) {
#ifdef TD_CUDA_EMU
  td_emu::cp_async16(dst, valid ? src : NULL);
#else
  unsigned addr = (unsigned)__cvta_generic_to_shared(dst);
  int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(src), "r"(src_bytes));
#endif
}
__device__ __forceinline__ void td_cp_async_commit() {
#ifdef TD_CUDA_EMU
  td_emu::cp_async_commit();
#else
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
/* cp.async.wait_group N: every group of this thread but the newest N is
 * done (N = 0: all of them; N = 1: all but a prefetch still landing) */
template <int N> __device__ __forceinline__ void td_cp_async_wait() {
#ifdef TD_CUDA_EMU
  td_emu::cp_async_wait(N);
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

/* two floats rounded to bf16 (nearest even) in one register, lo in the low half */
__device__ __forceinline__ uint32_t td_pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &v, 4);
  return u;
}

#endif
