/* CUDA emulator (tests/cudaemu): the subset of the warp matrix API
 * (nvcuda::wmma, mma.h) Tandem's kernels use: 16x16x16 fragments of bf16
 * (matrix_a, matrix_b) and f32 (accumulator); fill, load, store, mma.
 * A real fragment spreads its matrix over the 32 lanes in an unspecified
 * order; here every lane holds the whole matrix (as f32, the values of the
 * bf16 operands exactly), so kernels that treat fragments as opaque and
 * apply only uniform elementwise operations to x[0..num_elements) behave as
 * on a GPU; a kernel that assumed a particular element-to-lane mapping would
 * not, and must not be written. load/store/mma wait for the warp first
 * (they are warp-collective: every lane must call them). Since each lane
 * stores the whole matrix, a missing __syncwarp between a store and other
 * lanes' reads cannot show here (the GPU run covers it). Products
 * accumulate in f32 in k order, like the tensor cores up to their
 * internal order. */
#ifndef TD_CUDAEMU_MMA_H
#define TD_CUDAEMU_MMA_H

#include <cuda_emu.h>

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K> struct frag_shape;
template <int M, int N, int K> struct frag_shape<matrix_a, M, N, K> { static const int rows = M, cols = K; };
template <int M, int N, int K> struct frag_shape<matrix_b, M, N, K> { static const int rows = K, cols = N; };
template <int M, int N, int K> struct frag_shape<accumulator, M, N, K> { static const int rows = M, cols = N; };

template <class Use, int M, int N, int K, class T, class Layout = void> class fragment {
public:
  static const int rows = frag_shape<Use, M, N, K>::rows, cols = frag_shape<Use, M, N, K>::cols;
  static const int num_elements = rows * cols;
  float x[rows * cols]; /* row-major (r, c) */
};

template <class Use, int M, int N, int K, class T, class Layout>
inline void fill_fragment(fragment<Use, M, N, K, T, Layout> &f, float v) {
  for (int i = 0; i < f.num_elements; i++) f.x[i] = v;
}

template <class L> struct Layout_is_col { static const bool value = false; };
template <> struct Layout_is_col<col_major> { static const bool value = true; };

/* operands: the fragment's Layout says how memory holds the matrix */
template <class Use, int M, int N, int K, class T, class Layout, class P>
inline void load_matrix_sync(fragment<Use, M, N, K, T, Layout> &f, const P *p, unsigned ldm) {
  td_emu::sync_warp();
  typedef fragment<Use, M, N, K, T, Layout> F;
  for (int r = 0; r < F::rows; r++)
    for (int c = 0; c < F::cols; c++)
      f.x[r * F::cols + c] =
          (float)(Layout_is_col<Layout>::value ? p[(size_t)c * ldm + r] : p[(size_t)r * ldm + c]);
}

/* accumulators: the layout is an argument */
template <int M, int N, int K, class T>
inline void load_matrix_sync(fragment<accumulator, M, N, K, T> &f, const float *p, unsigned ldm, layout_t layout) {
  td_emu::sync_warp();
  for (int r = 0; r < M; r++)
    for (int c = 0; c < N; c++) f.x[r * N + c] = layout == mem_col_major ? p[(size_t)c * ldm + r] : p[(size_t)r * ldm + c];
}
template <int M, int N, int K, class T>
inline void store_matrix_sync(float *p, const fragment<accumulator, M, N, K, T> &f, unsigned ldm, layout_t layout) {
  td_emu::sync_warp();
  for (int r = 0; r < M; r++)
    for (int c = 0; c < N; c++) {
      float *dst = layout == mem_col_major ? &p[(size_t)c * ldm + r] : &p[(size_t)r * ldm + c];
      *dst = f.x[r * N + c];
    }
}

/* The product itself touches only fragments (the emulator's own arrays of
 * fixed size, never a kernel's memory: load/store_matrix_sync read and write
 * that, instrumented), so it is compiled without the sanitizers and
 * optimized even in the sanitizer trees: instrumented at -O1, every lane's
 * 16x16x16 product was about half of a bf16 training step on the emulator
 * (perf on build/cudaemu's train-gpt --bf16). The same operations in the
 * same order (no FMA at the baseline -march, no reassociation without
 * -ffast-math): the same f32 results. */
template <int M, int N, int K>
__attribute__((noinline, no_sanitize("address", "undefined"), optimize("O2"))) void
mma_product(float *__restrict d, const float *__restrict a, const float *__restrict b, const float *__restrict c) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      float s = c[i * N + j];
      for (int k = 0; k < K; k++) s += a[i * K + k] * b[k * N + j];
      d[i * N + j] = s;
    }
}

template <int M, int N, int K, class TA, class LA, class TB, class LB, class TC>
inline void mma_sync(fragment<accumulator, M, N, K, TC> &d, const fragment<matrix_a, M, N, K, TA, LA> &a,
                     const fragment<matrix_b, M, N, K, TB, LB> &b, const fragment<accumulator, M, N, K, TC> &c) {
  td_emu::sync_warp();
  float out[M * N]; /* (d may be c) */
  mma_product<M, N, K>(out, a.x, b.x, c.x);
  for (int i = 0; i < M * N; i++) d.x[i] = out[i];
}
} // namespace wmma
} // namespace nvcuda
#endif
