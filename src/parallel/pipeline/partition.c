/* Which layers each pipeline stage holds (DeepSpeed's PipelineModule
 * partition_method): "uniform" gives every part the same number of layers,
 * the first n_layers mod n_parts parts one more (DeepSpeed's
 * partition_uniform); "parameters" balances the parts' parameter counts,
 * minimizing the heaviest part exactly; "compute" does the same with each
 * layer's arithmetic (the caller's model of it: engine.c counts a GPT's
 * multiply-adds per token), so that the stage holding the output head,
 * the largest single product, gets fewer blocks.
 *
 * Balanced cut: dynamic programming over prefix sums, best[k][i] = the
 * smallest possible heaviest part when the first i layers form k parts,
 * O(n_parts * n_layers^2) additions: a GPT has tens of layers, so this is
 * microseconds, and exact where DeepSpeed's binary search over the
 * bottleneck is approximate. Ties keep the earliest cut, so the result
 * depends only on the weights. */
#include "parallel/pipeline/pipeline.h"

#include "tandem/nn.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

td_status td_pp_partition_method_parse(const char *name, td_pp_partition_method *out) {
  if (name && strcmp(name, "uniform") == 0) {
    *out = TD_PP_PARTITION_UNIFORM;
    return TD_OK;
  }
  if (name && strcmp(name, "parameters") == 0) {
    *out = TD_PP_PARTITION_PARAMETERS;
    return TD_OK;
  }
  if (name && strcmp(name, "compute") == 0) {
    *out = TD_PP_PARTITION_COMPUTE;
    return TD_OK;
  }
  return td_error(TD_ERR_INVALID_ARGUMENT,
                  "pipeline: partition_method \"%s\" is not built: use \"uniform\" (the same number of layers per "
                  "stage), \"parameters\" (balanced by parameter count) or \"compute\" (balanced by arithmetic)",
                  name ? name : "(null)");
}

/* What each block of a GPT weighs for a balanced cut.
 *
 * parameters: a block's 12C^2 + 13C, the embeddings (VC + TC) added to the
 * first block and ln_f and the head (2C + VC; a tied head keeps a copy of
 * wte) to the last, as DeepSpeed counts a PipelineModule's layers.
 *
 * compute: multiply-adds x 2 per token, forward and backward (backward =
 * twice the forward: each product's input and weight gradients), of what
 * dominates on every stage, the products:
 *   block  QKV 6C^2 + projection 2C^2 + MLP 16C^2 = 24C^2, and causal
 *          attention: query i meets i+1 keys in Q K^T and in P V, 4C(T+1)/2
 *          on average over the T positions -> forward 24C^2 + 2C(T+1)
 *   head   the (V, C) product, forward 2CV, on the last block
 *   embeddings  a lookup and an add, no product: 0
 * times 3 (forward + backward). LayerNorms, GELU, softmax, residuals and
 * the cross-entropy's softmax over V are O(C) and O(V) per token, a few
 * per cent of a block at C = 256, and left out. Tensor parallelism divides
 * every product by the same tp, so the cut does not depend on it. */
void td_pp_gpt_layer_weights(const td_gpt_config *c, td_pp_partition_method method, size_t *w) {
  const size_t C = (size_t)c->channels, V = (size_t)c->vocab, T = (size_t)c->seq;
  for (int l = 0; l < c->layers; l++)
    w[l] = method == TD_PP_PARTITION_COMPUTE ? 3 * (24 * C * C + 2 * C * (T + 1)) : 12 * C * C + 13 * C;
  if (c->layers <= 0) return;
  if (method == TD_PP_PARTITION_COMPUTE) {
    w[c->layers - 1] += 3 * 2 * C * V;
    return;
  }
  w[0] += V * C + T * C;
  w[c->layers - 1] += 2 * C + V * C;
}

static void partition_uniform(int n_layers, int n_parts, int *first) {
  int base = n_layers / n_parts, extra = n_layers % n_parts;
  first[0] = 0;
  for (int k = 0; k < n_parts; k++) first[k + 1] = first[k] + base + (k < extra ? 1 : 0);
}

static td_status partition_balanced(const size_t *w, int n, int parts, int *first) {
  size_t *prefix = malloc((size_t)(n + 1) * sizeof *prefix);
  size_t *best = malloc((size_t)(parts + 1) * (size_t)(n + 1) * sizeof *best);
  int *cut = malloc((size_t)(parts + 1) * (size_t)(n + 1) * sizeof *cut);
  if (!prefix || !best || !cut) {
    free(prefix), free(best), free(cut);
    return td_error(TD_ERR_SYSTEM, "pipeline: out of memory partitioning %d layers", n);
  }
  prefix[0] = 0;
  for (int i = 0; i < n; i++) prefix[i + 1] = prefix[i] + w[i];
#define AT(a, k, i) a[(size_t)(k) * (size_t)(n + 1) + (size_t)(i)]
  for (int i = 0; i <= n; i++) AT(best, 1, i) = prefix[i], AT(cut, 1, i) = 0;
  for (int k = 2; k <= parts; k++)
    for (int i = k; i <= n; i++) {
      size_t b = SIZE_MAX;
      int at = k - 1;
      /* the last part is layers [j, i), j >= k-1 leaves a layer for each earlier part */
      for (int j = k - 1; j < i; j++) {
        size_t last = prefix[i] - prefix[j], before = AT(best, k - 1, j);
        size_t worst = last > before ? last : before;
        if (worst < b) b = worst, at = j;
      }
      AT(best, k, i) = b;
      AT(cut, k, i) = at;
    }
  first[parts] = n;
  for (int k = parts, i = n; k >= 1; k--) {
    i = AT(cut, k, i);
    first[k - 1] = i;
  }
#undef AT
  free(prefix), free(best), free(cut);
  return TD_OK;
}

td_status td_pp_partition(td_pp_partition_method method, const size_t *weights, int n_layers, int n_parts,
                          int *first) {
  if (n_parts < 1 || !first)
    return td_error(TD_ERR_INVALID_ARGUMENT, "pipeline: cannot cut into %d parts", n_parts);
  if (n_layers < n_parts)
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "pipeline: %d layers cannot be cut into %d stages of at least one layer each: use at most %d "
                    "pipeline stages (x chunks), or a model with at least %d layers",
                    n_layers, n_parts, n_layers > 0 ? n_layers : 1, n_parts);
  if (method == TD_PP_PARTITION_UNIFORM) {
    partition_uniform(n_layers, n_parts, first);
    return TD_OK;
  }
  if ((method != TD_PP_PARTITION_PARAMETERS && method != TD_PP_PARTITION_COMPUTE) || !weights)
    return td_error(TD_ERR_INVALID_ARGUMENT, "pipeline: a balanced partition needs the layers' weights");
  return partition_balanced(weights, n_layers, n_parts, first);
}
