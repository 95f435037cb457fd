/* Matrix products of the linear layers on the device (llm.c's
 * llmc/matmul.cuh), the twins of td_linear_forward/backward.
 * Two paths. On a GPU build, cuBLASLt (the forward's bias, GELU and
 * residual folded into its epilogue and C input; FP32 compute for both
 * types: exact f32 products for TD_F32, f32 accumulation of bf16 operands
 * for TD_BF16, never TF32). Row-major matrices are handed to column-major
 * cuBLASLt as their transposes:
 *   out (N, OC) = inp W^T      is  out^T = W inp^T      (m=OC n=N k=IC, A=W op T)
 *   dinp (N, IC) += dout W     is  dinp^T += W^T dout^T (m=IC n=N k=OC)
 *   dW (OC, IC) += dout^T inp  is  dW^T += inp^T dout   (m=IC n=OC k=N, B op T)
 * One handle and a 32 MiB workspace per process, made at the first product
 * on the device current then (Tandem drives one device per process).
 * The other path is Tandem's own tiled kernel, which runs with
 * TANDEM_CUDA_MATMUL=kernel and where cuBLASLt finds no algorithm for a
 * shape (the emulator tree runs both: its cuBLASLt is a reference loop with
 * the library's semantics):
 *   C[m, n] (+)= sum_k op(A)[m, k] op(B)[k, n] (+ bias[n])
 * in 16x16 output tiles, one output per thread, the K dimension walked in
 * 16-wide slices staged in shared memory (as f32, whatever the element
 * type); accumulation in f32 in k order, one rounding per output.
 * Bias gradients. Through cuBLASLt they come out of the products'
 * epilogues: a layer's dbias from its weight-gradient product (BGRADB: dW^T
 * = inp^T dout has B = dout op T, so the sums of op(B)'s columns over k = N
 * are dout's column sums, OC of them), and, when the caller passes
 * dbias_gelu, the bias gradient of the product that made pre_gelu (the
 * GPT's fc) from the input-gradient product with DGELU (DGELU_BGRAD: the
 * row sums of D = dinp^T, i.e. dinp's column sums, IC of them). cuBLASLt
 * writes a bias gradient, in D's type, and never adds to it; our bias
 * gradients accumulate across micro-batches, so the epilogue writes into a
 * scratch vector (the 256 KiB after the cuBLASLt workspace, one allocation)
 * and a small kernel adds it into dbias (OC elements: ~2 us against the
 * column sum's ~0.2 ms at GPT-2 124M). bf16 rounds twice there (the
 * epilogue's sum, then the accumulation), within the layer's bound. Where
 * the heuristic offers no algorithm with the epilogue, the same product
 * without it and the column-sum kernel below; TD_CUDA_DBIAS_COLUMN_SUM
 * forces that (the A/B row of bench/cuda_kernels.sh).
 * The column sum: one block per 32 columns (OC / 32 blocks: 24 for
 * GPT-2's C = 768). The first kernel had 32 x 32 threads load one element
 * each per row step: 2 KB in flight per SM, about 0.2 ms per C-wide
 * dbias at GPT-2 124M's B T = 16384 (the same shape as layer norm's old
 * parameter kernel, 525 us with two inputs), x2 per layer. Where rows are
 * 16-byte aligned (OC a multiple of 8 bf16 / 4 f32, as in the GPT), each
 * thread loads 16 bytes (a group of 8 bf16 or 4 f32 columns) per row, four
 * rows unrolled: 1024 threads = 32 / 8 groups x 256 row lanes (f32: 8 x 128),
 * 64 KB in flight per SM. Lane sums in row order, then a fixed shuffle tree
 * over the warp's row lanes, then the 32 warps in order: the same bits
 * every run. Unaligned rows take the element kernel. */
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"
#include "cuda_layers.h"

/* (the emulator tree has a cuBLASLt of its own: tests/cudaemu/include/cublasLt.h) */
#include <cublasLt.h>
#include <atomic>
#include <mutex>

#define TILE 16

/* pre_gelu (same layout as C, or NULL): C = gelu'(pre_gelu) (product + bias),
 * the product being GELU's output gradient (the GPT's fc2 input gradient);
 * never with accumulate (the launcher refuses it). */
template <class T>
__global__ void gemm_tiled_kernel(T *C, const T *A, const T *B, const T *bias, const T *pre_gelu, int M, int N, int K,
                                  int lda, int ldb, int ldc, int trans_a, int trans_b, int accumulate) {
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
    if (pre_gelu) acc *= td_gelu_grad(td_to_f32(pre_gelu[(size_t)m * ldc + n]));
    T *c = C + (size_t)m * ldc + n;
    if (accumulate) acc += td_to_f32(*c);
    *c = td_from_f32<T>(acc);
  }
}

template <class T> __global__ void column_sum_vec_kernel(T *out, const T *x, int rows, int cols) {
  const int VW = td_vec_width<T>::value, GROUPS = 32 / VW, LANES = 1024 / GROUPS;
  __shared__ float part[32][33];
  const int t = threadIdx.x, lane = t % 32, warp = t / 32, g = t % GROUPS, y = t / GROUPS;
  const int c0 = blockIdx.x * 32 + g * VW;
  float acc[16 / sizeof(T)] = {0}, v[16 / sizeof(T)];
  if (c0 < cols) {
#pragma unroll 4
    for (int r = y; r < rows; r += LANES) {
      td_load_group(v, x + (size_t)r * cols + c0, VW, true);
#pragma unroll
      for (int k = 0; k < VW; k++) acc[k] += v[k];
    }
  }
  /* the warp's row lanes (lane / GROUPS) in a fixed tree: lanes < GROUPS end with the sums */
  for (int o = 16; o >= GROUPS; o /= 2)
#pragma unroll
    for (int k = 0; k < VW; k++) acc[k] += __shfl_xor_sync(0xffffffffu, acc[k], o);
  if (lane < GROUPS)
#pragma unroll
    for (int k = 0; k < VW; k++) part[warp][g * VW + k] = acc[k];
  __syncthreads();
  const int c = blockIdx.x * 32 + t;
  if (t < 32 && c < cols) {
    float s = 0.0f;
    for (int w = 0; w < 32; w++) s += part[w][t];
    out[c] = td_from_f32<T>(td_to_f32(out[c]) + s);
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
static td_status gemm(T *C, const T *A, const T *B, const T *bias, const T *pre_gelu, int M, int N, int K, int lda,
                      int ldb, int ldc, int trans_a, int trans_b, int accumulate, void *stream) {
  if (M == 0 || N == 0) return TD_OK;
  dim3 block(TILE, TILE), grid(td_cuda_blocks((size_t)N, TILE), td_cuda_blocks((size_t)M, TILE));
  if (grid.y > 65535)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_cuda_matmul: %d rows exceed the tiled kernel's grid (%d)", M,
                    65535 * TILE);
  TD_CUDA_LAUNCH(gemm_tiled_kernel<T>, grid, block, 0, stream, C, A, B, bias, pre_gelu, M, N, K, lda, ldb, ldc,
                 trans_a, trans_b, accumulate);
  TD_CUDA_LAUNCH_CHECK("gemm_tiled_kernel");
  return TD_OK;
}

/* TANDEM_CUDA_MATMUL: "kernel" forces the tiled kernel; unset or "cublaslt"
 * uses cuBLASLt. Read once. */
static int use_cublaslt(void) {
  static int use = -1;
  if (use < 0) {
    const char *e = getenv("TANDEM_CUDA_MATMUL");
    use = !(e && strcmp(e, "kernel") == 0);
  }
  return use;
}

extern "C" const char *td_cuda_matmul_backend(void) { return use_cublaslt() ? "cublaslt" : "kernel"; }

static std::atomic<long> lt_fallbacks(0), lt_bgrad_epilogues(0);
extern "C" long td_cuda_matmul_fallbacks(void) { return lt_fallbacks.load(); }
extern "C" long td_cuda_matmul_bgrad_epilogues(void) { return lt_bgrad_epilogues.load(); }

#define LT_CHECK(call)                                                                                        \
  do {                                                                                                        \
    cublasStatus_t lt_s_ = (call);                                                                            \
    if (lt_s_ != CUBLAS_STATUS_SUCCESS)                                                                       \
      return td_error(TD_ERR_SYSTEM, "%s:%d: %s: cuBLASLt status %d", __FILE__, __LINE__, #call, (int)lt_s_); \
  } while (0)

/* cuBLASLt is loaded at the first product (dlopen), not linked: a linked
 * libcublasLt (540 MB in CUDA 13) is mapped and relocated at every
 * process's start, which cost every CPU-only run of a CUDA build about
 * 200 MiB of RSS (train-gpt: 218 MiB against 11 MiB peak, measured), and
 * would make the memory estimate wrong by that much. The emulator tree
 * calls its own cuBLASLt directly. */
#ifdef TD_CUDA_EMU
#define LT(fn) cublasLt##fn
static td_status lt_load(void) { return TD_OK; }
#else
#include <dlfcn.h>
#define LT_STR2(x) #x
#define LT_STR(x) LT_STR2(x)
static struct {
  decltype(&cublasLtCreate) Create;
  decltype(&cublasLtDestroy) Destroy;
  decltype(&cublasLtMatmul) Matmul;
  decltype(&cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic;
  decltype(&cublasLtMatmulDescCreate) MatmulDescCreate;
  decltype(&cublasLtMatmulDescDestroy) MatmulDescDestroy;
  decltype(&cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute;
  decltype(&cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate;
  decltype(&cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute;
  decltype(&cublasLtMatrixLayoutCreate) MatrixLayoutCreate;
  decltype(&cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy;
} lt_api;
#define LT(fn) lt_api.fn

/* Called under lt_mutex, once: the library of the major version the code
 * was compiled against (its ABI), found through the program's run path. */
static td_status lt_load(void) {
  static const char *name = "libcublasLt.so." LT_STR(CUBLAS_VER_MAJOR);
  void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (!lib)
    return td_error(TD_ERR_SYSTEM, "cuBLASLt: dlopen %s: %s (install the CUDA toolkit's cuBLAS libraries or add "
                    "their folder to LD_LIBRARY_PATH; TANDEM_CUDA_MATMUL=kernel runs the products without it)",
                    name, dlerror());
#define LT_SYM(fn)                                                                                     \
  if (!(lt_api.fn = (decltype(lt_api.fn))dlsym(lib, "cublasLt" #fn)))                                 \
    return td_error(TD_ERR_SYSTEM, "cuBLASLt: %s has no symbol cublasLt" #fn " (a different version?)", name);
  LT_SYM(Create) LT_SYM(Destroy) LT_SYM(Matmul) LT_SYM(MatmulAlgoGetHeuristic) LT_SYM(MatmulDescCreate)
  LT_SYM(MatmulDescDestroy) LT_SYM(MatmulDescSetAttribute) LT_SYM(MatmulPreferenceCreate)
  LT_SYM(MatmulPreferenceDestroy) LT_SYM(MatmulPreferenceSetAttribute) LT_SYM(MatrixLayoutCreate)
  LT_SYM(MatrixLayoutDestroy)
#undef LT_SYM
  return TD_OK;
}
#endif

static const size_t kWorkspaceBytes = (size_t)32 << 20;
/* the bias gradient epilogues' output, after the workspace: 64 Ki f32 (a
 * 16K-channel model's 4C), wider layers take the column-sum kernel */
static const size_t kBgradBytes = (size_t)256 << 10;
static cublasLtHandle_t lt_handle;
static void *lt_workspace;
static std::mutex lt_mutex;

static td_status lt_init(void) {
  std::lock_guard<std::mutex> lock(lt_mutex);
  if (lt_handle) return TD_OK;
  TD_CHECK(lt_load());
  LT_CHECK(LT(Create)(&lt_handle));
  cudaError_t e = cudaMalloc(&lt_workspace, kWorkspaceBytes + kBgradBytes);
  if (e != cudaSuccess) {
    LT(Destroy)(lt_handle);
    lt_handle = NULL;
    return td_error(TD_ERR_SYSTEM, "%s:%d: cudaMalloc of the cuBLASLt workspace (%zu bytes): %s", __FILE__, __LINE__,
                    kWorkspaceBytes + kBgradBytes, cudaGetErrorString(e));
  }
  return TD_OK;
}

/* The descriptors of one product, destroyed on every path out. */
struct lt_call {
  cublasLtMatmulDesc_t op = NULL;
  cublasLtMatrixLayout_t a = NULL, b = NULL, c = NULL;
  cublasLtMatmulPreference_t pref = NULL;
  ~lt_call() {
    if (pref) LT(MatmulPreferenceDestroy)(pref);
    if (c) LT(MatrixLayoutDestroy)(c);
    if (b) LT(MatrixLayoutDestroy)(b);
    if (a) LT(MatrixLayoutDestroy)(a);
    if (op) LT(MatmulDescDestroy)(op);
  }
};

/* The largest power of two (up to 256) dividing the address. */
static uint32_t pointer_alignment(const void *p) {
  uintptr_t a = (uintptr_t)p;
  uint32_t align = 256;
  while (align > 1 && a % align) align /= 2;
  return align;
}

/* Column-major D (m, n) = op(A) op(B) (+ bias[m]) (+ Cin, same layout as D;
 * Cin may be D: accumulate; NULL: beta 0, D is written without being read),
 * and with aux (same layout as D):
 *  - dgelu 0: aux = that sum and D = gelu(aux) (cuBLASLt's GELU_AUX
 *    epilogue, the tanh form; aux is written);
 *  - dgelu 1: D = gelu'(aux) op(A) op(B) (the DGELU epilogue, as llm.c's
 *    backward; aux, GELU's forward input, is read; no bias, no Cin).
 * bgrad (not with bias or GELU_AUX): a bias gradient written there, in D's
 * type: with dgelu D's row sums (m; DGELU_BGRAD), without it op(B)'s
 * column sums (n; BGRADB).
 * *done = 0 (and TD_OK) when cuBLASLt has no algorithm: the caller takes
 * another path (the tiled kernel, counted in lt_fallbacks; for DGELU first
 * the plain product and td_cuda_gelu_grad_scale; without the bias gradient
 * epilogue the column-sum kernel). */
static td_status lt_matmul(void *d, const void *A, const void *B, const void *bias, const void *c_in, const void *aux,
                           int dgelu, void *bgrad, int m, int n, int k, int lda, int ldb, int ldd, int trans_a,
                           int trans_b, td_dtype dtype, void *stream, int *done) {
  *done = 0;
  TD_CHECK(lt_init());
  cudaDataType_t t = dtype == TD_BF16 ? CUDA_R_16BF : CUDA_R_32F;
  lt_call call;
  LT_CHECK(LT(MatmulDescCreate)(&call.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  LT_CHECK(LT(MatmulDescSetAttribute)(call.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  LT_CHECK(LT(MatmulDescSetAttribute)(call.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  if (bgrad && (bias || (aux && !dgelu)))
    return td_error(TD_ERR_INTERNAL, "lt_matmul: a bias gradient with a bias or GELU_AUX epilogue");
  if (bias || aux || bgrad) {
    cublasLtEpilogue_t epi = dgelu ? (bgrad ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU)
                             : aux ? (bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
                             : bgrad ? CUBLASLT_EPILOGUE_BGRADB
                                     : CUBLASLT_EPILOGUE_BIAS;
    LT_CHECK(LT(MatmulDescSetAttribute)(call.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    const void *vec = bgrad ? (const void *)bgrad : bias; /* the bias pointer holds either */
    if (vec) LT_CHECK(LT(MatmulDescSetAttribute)(call.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vec, sizeof vec));
    if (aux) {
      int64_t aux_ld = ldd;
      LT_CHECK(LT(MatmulDescSetAttribute)(call.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
      LT_CHECK(LT(MatmulDescSetAttribute)(call.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld));
    }
  }
  /* stored shapes: op N reads (rows, cols) = (m, k) for A and (k, n) for B */
  LT_CHECK(LT(MatrixLayoutCreate)(&call.a, t, trans_a ? k : m, trans_a ? m : k, lda));
  LT_CHECK(LT(MatrixLayoutCreate)(&call.b, t, trans_b ? n : k, trans_b ? k : n, ldb));
  LT_CHECK(LT(MatrixLayoutCreate)(&call.c, t, m, n, ldd));
  LT_CHECK(LT(MatmulPreferenceCreate)(&call.pref));
  uint64_t ws = kWorkspaceBytes;
  LT_CHECK(LT(MatmulPreferenceSetAttribute)(call.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  /* the heuristic assumes 256-byte aligned operands unless told: tensors at
   * arbitrary arena offsets may be less aligned */
  uint32_t align_a = pointer_alignment(A), align_b = pointer_alignment(B), align_d = pointer_alignment(d);
  uint32_t align_c = c_in ? pointer_alignment(c_in) : align_d;
  LT_CHECK(LT(MatmulPreferenceSetAttribute)(call.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                                sizeof align_a));
  LT_CHECK(LT(MatmulPreferenceSetAttribute)(call.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                                sizeof align_b));
  LT_CHECK(LT(MatmulPreferenceSetAttribute)(call.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
                                                sizeof align_c));
  LT_CHECK(LT(MatmulPreferenceSetAttribute)(call.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d,
                                                sizeof align_d));
  cublasLtMatmulHeuristicResult_t heur;
  int n_results = 0;
  cublasStatus_t hs =
      LT(MatmulAlgoGetHeuristic)(lt_handle, call.op, call.a, call.b, call.c, call.c, call.pref, 1, &heur, &n_results);
  if (hs != CUBLAS_STATUS_SUCCESS || n_results == 0) return TD_OK; /* no algorithm: the caller's other path */
  float alpha = 1.0f, beta = c_in ? 1.0f : 0.0f;
  LT_CHECK(LT(Matmul)(lt_handle, call.op, &alpha, A, call.a, B, call.b, &beta, c_in ? c_in : d, call.c, d, call.c,
                          &heur.algo, lt_workspace, kWorkspaceBytes, (cudaStream_t)stream));
  *done = 1;
  return TD_OK;
}

static td_status check_shape(const char *fname, int N, int IC, int OC) {
  if (N < 0 || IC < 0 || OC < 0)
    return td_error(TD_ERR_INVALID_ARGUMENT, "%s: negative shape N=%d IC=%d OC=%d", fname, N, IC, OC);
  return TD_OK;
}

extern "C" td_status td_cuda_matmul_forward_ex(void *out, void *pre_gelu, const void *residual, const void *inp,
                                               const void *weight, const void *bias, int N, int IC, int OC,
                                               td_dtype dtype, void *stream) {
  TD_CHECK(check_shape("td_cuda_matmul_forward", N, IC, OC));
  if (pre_gelu && residual)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_cuda_matmul_forward_ex: GELU and a residual in one call");
  if (dtype != TD_F32 && dtype != TD_BF16)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_cuda_matmul_forward: dtype %s: CUDA layers take f32 or bf16",
                    td_dtype_name(dtype));
  if (N == 0 || OC == 0) return TD_OK;
  if (use_cublaslt() && IC > 0) {
    int done = 0;
    TD_CHECK(lt_matmul(out, weight, inp, bias, residual, pre_gelu, 0, NULL, OC, N, IC, IC, IC, OC, 1, 0, dtype, stream,
                       &done));
    if (done) return TD_OK;
    lt_fallbacks++;
  }
  /* the tiled kernel: the product (+ bias) into pre_gelu, or into out on
   * top of a copy of the residual; then GELU */
  void *dst = pre_gelu ? pre_gelu : out;
  int accumulate = 0;
  if (residual) {
    if (residual != out)
      TD_CUDA_CHECK(cudaMemcpyAsync(out, residual, (size_t)N * OC * (dtype == TD_BF16 ? 2 : 4),
                                    cudaMemcpyDeviceToDevice, (cudaStream_t)stream));
    accumulate = 1;
  }
  TD_CUDA_DISPATCH(dtype, "td_cuda_matmul_forward", {
    /* out (N, OC) = inp (N, IC) @ weight^T: B(k, n) = weight[n, k] */
    TD_CHECK(gemm<td_elem>((td_elem *)dst, (const td_elem *)inp, (const td_elem *)weight, (const td_elem *)bias,
                           (const td_elem *)NULL, N, OC, IC, IC, IC, OC, 0, 1, accumulate, stream));
  });
  if (pre_gelu) TD_CHECK(td_cuda_gelu_forward(out, pre_gelu, (size_t)N * OC, dtype, stream));
  return TD_OK;
}

extern "C" td_status td_cuda_matmul_forward(void *out, const void *inp, const void *weight, const void *bias, int N,
                                            int IC, int OC, td_dtype dtype, void *stream) {
  return td_cuda_matmul_forward_ex(out, NULL, NULL, inp, weight, bias, N, IC, OC, dtype, stream);
}

/* out (cols) += column sums of x (rows, cols): the 16-byte kernel where
 * rows allow, else the element one */
static td_status column_sum(void *out, const void *x, int rows, int cols, td_dtype dtype, void *stream) {
  if (cols <= 0) return TD_OK;
  TD_CUDA_DISPATCH(dtype, "td_cuda_matmul_backward", {
    if (td_aligned16(x, x, x) && ((size_t)cols * sizeof(td_elem)) % 16 == 0) {
      TD_CUDA_LAUNCH(column_sum_vec_kernel<td_elem>, td_cuda_blocks((size_t)cols, 32), 1024, 0, stream,
                     (td_elem *)out, (const td_elem *)x, rows, cols);
      TD_CUDA_LAUNCH_CHECK("column_sum_vec_kernel");
    } else {
      TD_CUDA_LAUNCH(column_sum_kernel<td_elem>, td_cuda_blocks((size_t)cols, 32), dim3(32, 32), 0, stream,
                     (td_elem *)out, (const td_elem *)x, rows, cols);
      TD_CUDA_LAUNCH_CHECK("column_sum_kernel");
    }
  });
  return TD_OK;
}

/* dbias[i] += part[i]: an epilogue's bias gradient into the accumulated one
 * (f32 addition, one rounding) */
template <class T> __global__ void bgrad_add_kernel(T *dbias, const T *part, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dbias[i] = td_from_f32<T>(td_to_f32(dbias[i]) + td_to_f32(part[i]));
}

static td_status bgrad_add(void *dbias, const void *part, int n, td_dtype dtype, void *stream) {
  TD_CUDA_DISPATCH(dtype, "td_cuda_matmul_backward", {
    TD_CUDA_LAUNCH(bgrad_add_kernel<td_elem>, td_cuda_blocks((size_t)n, 256), 256, 0, stream, (td_elem *)dbias,
                   (const td_elem *)part, n);
  });
  TD_CUDA_LAUNCH_CHECK("bgrad_add_kernel");
  return TD_OK;
}

/* The scratch for an epilogue's bias gradient of n entries, or NULL where
 * the epilogue is not wanted (no gradient asked, the column sums forced, a
 * vector wider than the scratch): the caller then sums columns itself. */
static void *bgrad_scratch(const void *dbias, int n, td_dtype dtype, int column_sums) {
  if (!dbias || column_sums || (size_t)n * (dtype == TD_BF16 ? 2 : 4) > kBgradBytes) return NULL;
  return (char *)lt_workspace + kWorkspaceBytes;
}

extern "C" td_status td_cuda_matmul_backward_ex(void *dinp, void *dweight, void *dbias, const void *dout,
                                                const void *inp, const void *weight, const void *pre_gelu,
                                                void *dbias_gelu, int flags, int N, int IC, int OC, td_dtype dtype,
                                                void *stream) {
  TD_CHECK(check_shape("td_cuda_matmul_backward", N, IC, OC));
  void *const dinp_out = dinp; /* (dinp becomes NULL once a path has written it) */
  const int overwrite = (flags & TD_CUDA_DINP_OVERWRITE) != 0, column_sums = (flags & TD_CUDA_DBIAS_COLUMN_SUM) != 0;
  if (flags & ~(TD_CUDA_DINP_OVERWRITE | TD_CUDA_DBIAS_COLUMN_SUM))
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_cuda_matmul_backward_ex: unknown flags 0x%x (TD_CUDA_DINP_OVERWRITE "
                    "and TD_CUDA_DBIAS_COLUMN_SUM are the ones)", (unsigned)flags);
  if (pre_gelu && (!dinp || !overwrite))
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_cuda_matmul_backward_ex: pre_gelu (GELU's backward folded into the "
                    "input gradient) needs dinp and TD_CUDA_DINP_OVERWRITE");
  if (dbias_gelu && !pre_gelu)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_cuda_matmul_backward_ex: dbias_gelu (the bias gradient of the "
                    "product that made pre_gelu) needs pre_gelu, dinp and TD_CUDA_DINP_OVERWRITE");
  if (use_cublaslt() && N > 0 && IC > 0 && OC > 0 && (dtype == TD_F32 || dtype == TD_BF16)) {
    int done = 0;
    TD_CHECK(lt_init()); /* the bias gradient scratch */
    if (dinp) { /* dinp^T (IC, N) (+)= W^T (IC, OC) dout^T (OC, N), times gelu'(pre_gelu^T) */
      void *bg = bgrad_scratch(dbias_gelu, IC, dtype, column_sums);
      TD_CHECK(lt_matmul(dinp, weight, dout, NULL, overwrite ? NULL : dinp, pre_gelu, pre_gelu != NULL, bg, IC, N,
                         OC, IC, OC, IC, 0, 0, dtype, stream, &done));
      if (done && bg) { /* dinp's column sums came with it: dbias_gelu is done */
        TD_CHECK(bgrad_add(dbias_gelu, bg, IC, dtype, stream));
        lt_bgrad_epilogues++;
        dbias_gelu = NULL;
      }
      if (!done && bg) /* no DGELU_BGRAD algorithm: DGELU alone, the column sum below */
        TD_CHECK(lt_matmul(dinp, weight, dout, NULL, NULL, pre_gelu, 1, NULL, IC, N, OC, IC, OC, IC, 0, 0, dtype,
                           stream, &done));
      if (!done && pre_gelu) { /* no DGELU algorithm: the plain product, then gelu' in place (the tiled
                                * kernel would cost ~10x the product at GPT-2's shapes) */
        TD_CHECK(lt_matmul(dinp, weight, dout, NULL, NULL, NULL, 0, NULL, IC, N, OC, IC, OC, IC, 0, 0, dtype, stream,
                           &done));
        if (done) TD_CHECK(td_cuda_gelu_grad_scale(dinp, pre_gelu, (size_t)N * IC, dtype, stream));
      }
      if (done && dbias_gelu) {
        TD_CHECK(column_sum(dbias_gelu, dinp, N, IC, dtype, stream));
        dbias_gelu = NULL;
      }
      if (done) dinp = NULL;
      else lt_fallbacks++;
    }
    if (dweight) { /* dW^T (IC, OC) += inp^T (IC, N) dout (N, OC); dbias = op(B)'s column sums */
      void *bg = bgrad_scratch(dbias, OC, dtype, column_sums);
      TD_CHECK(lt_matmul(dweight, inp, dout, NULL, dweight, NULL, 0, bg, IC, OC, N, IC, OC, IC, 0, 1, dtype, stream,
                         &done));
      if (done && bg) {
        TD_CHECK(bgrad_add(dbias, bg, OC, dtype, stream));
        lt_bgrad_epilogues++;
        dbias = NULL;
      }
      if (!done && bg) /* no BGRADB algorithm: the product alone, the column sum below */
        TD_CHECK(lt_matmul(dweight, inp, dout, NULL, dweight, NULL, 0, NULL, IC, OC, N, IC, OC, IC, 0, 1, dtype,
                           stream, &done));
      if (done) dweight = NULL;
      else lt_fallbacks++;
    }
  }
  TD_CUDA_DISPATCH(dtype, "td_cuda_matmul_backward", {
    /* dinp (N, IC) (+)= dout (N, OC) @ weight (OC, IC) (times gelu'(pre_gelu)); with OC = 0, zeros when overwriting */
    if (dinp)
      TD_CHECK(gemm<td_elem>((td_elem *)dinp, (const td_elem *)dout, (const td_elem *)weight, (const td_elem *)NULL,
                             (const td_elem *)pre_gelu, N, IC, OC, OC, IC, IC, 0, 0, !overwrite, stream));
    /* dweight (OC, IC) += dout^T (OC, N) @ inp (N, IC) */
    if (dweight)
      TD_CHECK(gemm<td_elem>((td_elem *)dweight, (const td_elem *)dout, (const td_elem *)inp, (const td_elem *)NULL,
                             (const td_elem *)NULL, OC, IC, N, OC, IC, IC, 1, 0, 1, stream));
  });
  /* the bias gradients no epilogue gave: dinp's and dout's column sums */
  if (dbias_gelu) TD_CHECK(column_sum(dbias_gelu, dinp_out, N, IC, dtype, stream));
  if (dbias) TD_CHECK(column_sum(dbias, dout, N, OC, dtype, stream));
  return TD_OK;
}

extern "C" td_status td_cuda_matmul_backward(void *dinp, void *dweight, void *dbias, const void *dout,
                                             const void *inp, const void *weight, int N, int IC, int OC,
                                             td_dtype dtype, void *stream) {
  return td_cuda_matmul_backward_ex(dinp, dweight, dbias, dout, inp, weight, NULL, NULL, 0, N, IC, OC, dtype, stream);
}
