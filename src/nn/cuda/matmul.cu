/* Matrix products of the linear layers on the device (llm.c's
 * llmc/matmul.cuh), the twins of td_linear_forward/backward.
 * Two paths: cuBLASLt on a GPU build (not written yet: see below), and
 * Tandem's own tiled kernel, which is what runs under the emulator and
 * with TANDEM_CUDA_MATMUL=kernel:
 *   C[m, n] (+)= sum_k op(A)[m, k] op(B)[k, n] (+ bias[n])
 * in 16x16 output tiles, one output per thread, the K dimension walked in
 * 16-wide slices staged in shared memory (as f32, whatever the element
 * type); accumulation in f32 in k order, one rounding per output.
 * dbias is a column sum done as layer norm's parameter gradients: 32
 * channels x 32 row lanes per block, partial sums added in a fixed order. */
#include "cuda_common.cuh"
#include "cuda_layers.h"

#define TILE 16

template <class T>
__global__ void gemm_tiled_kernel(T *C, const T *A, const T *B, const T *bias, int M, int N, int K, int lda, int ldb,
                                  int ldc, int trans_a, int trans_b, int accumulate) {
  __shared__ float As[TILE][TILE + 1], Bs[TILE][TILE + 1];
  int tx = threadIdx.x, ty = threadIdx.y;
  int m = blockIdx.y * TILE + ty, n = blockIdx.x * TILE + tx;
  float acc = 0.0f;
  for (int k0 = 0; k0 < K; k0 += TILE) {
    int am = blockIdx.y * TILE + ty, ak = k0 + tx; /* A tile element (am, ak) */
    float a = 0.0f;
    if (am < M && ak < K) a = td_to_f32(trans_a ? A[(size_t)ak * lda + am] : A[(size_t)am * lda + ak]);
    As[ty][tx] = a;
    int bk = k0 + ty, bn = blockIdx.x * TILE + tx; /* B tile element (bk, bn) */
    float b = 0.0f;
    if (bk < K && bn < N) b = td_to_f32(trans_b ? B[(size_t)bn * ldb + bk] : B[(size_t)bk * ldb + bn]);
    Bs[ty][tx] = b;
    __syncthreads();
    for (int kk = 0; kk < TILE; kk++) acc += As[ty][kk] * Bs[kk][tx];
    __syncthreads();
  }
  if (m < M && n < N) {
    if (bias) acc += td_to_f32(bias[n]);
    T *c = C + (size_t)m * ldc + n;
    if (accumulate) acc += td_to_f32(*c);
    *c = td_from_f32<T>(acc);
  }
}

template <class T> __global__ void column_sum_kernel(T *out, const T *x, int rows, int cols) {
  __shared__ float part[32][33];
  int c = blockIdx.x * 32 + threadIdx.x, y = threadIdx.y;
  float s = 0.0f;
  if (c < cols)
    for (int r = y; r < rows; r += 32) s += td_to_f32(x[(size_t)r * cols + c]);
  part[y][threadIdx.x] = s;
  __syncthreads();
  if (y == 0 && c < cols) {
    float t = 0.0f;
    for (int k = 0; k < 32; k++) t += part[k][threadIdx.x];
    out[c] = td_from_f32<T>(td_to_f32(out[c]) + t);
  }
}

template <class T>
static td_status gemm(T *C, const T *A, const T *B, const T *bias, int M, int N, int K, int lda, int ldb, int ldc,
                      int trans_a, int trans_b, int accumulate, void *stream) {
  if (M == 0 || N == 0) return TD_OK;
  dim3 block(TILE, TILE), grid(td_cuda_blocks((size_t)N, TILE), td_cuda_blocks((size_t)M, TILE));
  if (grid.y > 65535)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_cuda_matmul: %d rows exceed the tiled kernel's grid (%d)", M,
                    65535 * TILE);
  TD_CUDA_LAUNCH(gemm_tiled_kernel<T>, grid, block, 0, stream, C, A, B, bias, M, N, K, lda, ldb, ldc, trans_a,
                 trans_b, accumulate);
  TD_CUDA_LAUNCH_CHECK("gemm_tiled_kernel");
  return TD_OK;
}

extern "C" const char *td_cuda_matmul_backend(void) {
  /* cuBLASLt is not wired in yet: every build runs the tiled kernel (the
   * TANDEM_CUDA_MATMUL=kernel path of the plan). */
  return "kernel";
}

static td_status check_shape(const char *fname, int N, int IC, int OC) {
  if (N < 0 || IC < 0 || OC < 0)
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: negative shape N=%d IC=%d OC=%d", fname, N, IC, OC);
  return TD_OK;
}

extern "C" td_status td_cuda_matmul_forward(void *out, const void *inp, const void *weight, const void *bias, int N,
                                            int IC, int OC, td_dtype dtype, void *stream) {
  TD_CHECK(check_shape("td_cuda_matmul_forward", N, IC, OC));
  TD_CUDA_DISPATCH(dtype, "td_cuda_matmul_forward", {
    /* out (N, OC) = inp (N, IC) @ weight^T: B(k, n) = weight[n, k] */
    return gemm<td_elem>((td_elem *)out, (const td_elem *)inp, (const td_elem *)weight, (const td_elem *)bias, N, OC, IC, IC, IC, OC, 0, 1, 0,
                   stream);
  });
  return TD_OK;
}

extern "C" td_status td_cuda_matmul_backward(void *dinp, void *dweight, void *dbias, const void *dout,
                                             const void *inp, const void *weight, int N, int IC, int OC,
                                             td_dtype dtype, void *stream) {
  TD_CHECK(check_shape("td_cuda_matmul_backward", N, IC, OC));
  TD_CUDA_DISPATCH(dtype, "td_cuda_matmul_backward", {
    /* dinp (N, IC) += dout (N, OC) @ weight (OC, IC) */
    if (dinp)
      TD_CHECK(gemm<td_elem>((td_elem *)dinp, (const td_elem *)dout, (const td_elem *)weight, (const td_elem *)NULL, N, IC, OC, OC, IC, IC, 0, 0,
                       1, stream));
    /* dweight (OC, IC) += dout^T (OC, N) @ inp (N, IC) */
    if (dweight)
      TD_CHECK(gemm<td_elem>((td_elem *)dweight, (const td_elem *)dout, (const td_elem *)inp, (const td_elem *)NULL, OC, IC, N, OC, IC, IC, 1, 0,
                       1, stream));
    if (dbias && OC > 0) {
      TD_CUDA_LAUNCH(column_sum_kernel<td_elem>, td_cuda_blocks((size_t)OC, 32), dim3(32, 32), 0, stream, (td_elem *)dbias,
                     (const td_elem *)dout, N, OC);
      TD_CUDA_LAUNCH_CHECK("column_sum_kernel");
    }
  });
  return TD_OK;
}
