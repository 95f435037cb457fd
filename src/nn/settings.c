/* The kernels' settings: threads for matrix products, the compute dtype,
 * the matmul backend's name. Compiled once, for the baseline CPU, because
 * they must exist once per process (or thread), not once per level; below
 * both the per-level kernels, which read them, and the dispatcher
 * (kernels.c). */
#include "nn_internal.h"

#ifdef TD_HAVE_OPENBLAS
#include <cblas.h>
#endif

/* Threads for matrix products (process-wide, as OpenBLAS's setting is).
 * nn_gemm and nn_gemm_tn are single-threaded: with more than one thread
 * they decline and the layers use OpenBLAS's threaded sgemm. */
static int nn_threads = 1;

void td_nn_set_threads(int n_threads) {
  __atomic_store_n(&nn_threads, n_threads < 1 ? 1 : n_threads, __ATOMIC_RELAXED);
#ifdef TD_HAVE_OPENBLAS
  openblas_set_num_threads(n_threads < 1 ? 1 : n_threads);
#endif
}

/* td_nn_set_compute_dtype: per thread, because model replicas run on threads */
static __thread td_dtype nn_compute = TD_F32;

td_status td_nn_set_compute_dtype(td_dtype dtype) {
  if (dtype != TD_F32 && dtype != TD_BF16 && dtype != TD_F16)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_nn_set_compute_dtype(%s): only f32, bf16 and f16 are compute types",
                    td_dtype_name(dtype));
  nn_compute = dtype;
  return TD_OK;
}

td_dtype td_nn_compute_dtype(void) { return nn_compute; }

/* What the single-threaded products (matmul.c) keep per thread once they
 * ran a layer: the packed B block (KC x NC floats, allocated whole) and
 * nn_gemm_tn's packed op(A) for the weight's gradient, `out` rows rounded
 * to whole tiles, as deep as the rows multiplied (at most KC). Measured on
 * train-gpt at one thread (the peak RSS less the rest of the estimate):
 * it is what grew with the channels, 1.1 MiB at 128 channels to 3.4 at
 * 2048, and with a vocabulary of 50304 the head's gradient alone packs
 * 49 MiB. With more threads OpenBLAS's buffers take the place of these
 * (td_trainer_estimate_memory counts them per thread). */
size_t td_linear_scratch_bytes(size_t rows, size_t in, size_t out) {
  (void)in; /* the B block is allocated whole, whatever the layer's width */
  size_t tiles = (out + NN_GEMM_MR - 1) / NN_GEMM_MR, depth = rows < NN_GEMM_KC ? rows : NN_GEMM_KC;
  return ((size_t)NN_GEMM_KC * NN_GEMM_NC + tiles * NN_GEMM_MR * depth) * sizeof(float);
}

int nn_matmul_threads(void) { return __atomic_load_n(&nn_threads, __ATOMIC_RELAXED); }

const char *td_nn_matmul_backend(void) {
#ifdef TD_HAVE_OPENBLAS
  return "openblas";
#else
  return "portable";
#endif
}
