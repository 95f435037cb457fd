/* Memory per rank at each ZeRO stage, before anything is allocated
 * (td_trainer_estimate_memory; train-gpt --estimate-memory).
 *
 * The ZeRO paper's model-state formulas for fp32 training with Adam (4
 * bytes per parameter per arena, Ψ parameters, N ranks, 2 optimizer
 * states; SGD has one):
 *     stage 0: 16Ψ   stage 1: 8Ψ + 8Ψ/N   stage 2: 4Ψ + 12Ψ/N   stage 3: 16Ψ/N
 * plus what the engine keeps beyond the shards (zero/reduce.c, fetch.c):
 *     stage 2+: gradients of the buckets in flight (none under
 *               deterministic reduction: `buckets` false): after a launch
 *               backward waits for the bucket before (reduce.c), so at the
 *               next launch one is in flight and one just launched, each up
 *               to a bucket plus the tensor that completed it: 2 x (bucket
 *               + the largest tensor); stage 2 keeps its
 *               whole gradient arena where 2 buckets hold it anyway
 *               (zero_keeps_grads: small models);
 *     stage 3:  the fetched parameter groups kept resident: up to
 *               stage3_max_live_parameters (at least the group in use),
 *               plus the groups under
 *               stage3_param_persistence_threshold.
 * The engine's fetch groups are the model's (a transformer block, the
 * embeddings, the head); here they are estimated from the tensor table: a
 * numbered block is the run of tensors whose names share the prefix before
 * the first '.' when it ends in a digit ("h3.attn.qkv.weight" -> "h3"), and
 * each run of other tensors between blocks is one group ("wte" and "wpe":
 * the embeddings; "ln_f.*" and "lm_head.weight": the head), as the GPT
 * fetches them. Pure: no allocation, no communication. */
#include "train/zero/zero.h"
#include "train/offload/offload.h"

#include <string.h>

/* The length of a numbered block's prefix ("h3" of "h3.attn.qkv.weight"),
 * 0 for a tensor outside the blocks. */
static size_t block_len(const char *name) {
  const char *dot = name ? strchr(name, '.') : NULL;
  return dot && dot > name && dot[-1] >= '0' && dot[-1] <= '9' ? (size_t)(dot - name) : 0;
}

/* The model's fetch groups (see the top of this file): the largest tensor,
 * the largest group above the persistence threshold, and the groups under
 * it, which stay resident. */
typedef struct fetch_groups {
  size_t largest_tensor, group1, persistent, n_groups, n_persistent;
} fetch_groups;

/* The group starting at tensor i: its arena span [*lo, *lo + *count);
 * returns the index of the next group's first tensor. */
static int group_at(const td_model *model, int i, size_t *lo, size_t *count) {
  const td_param_tensor *first = &model->tensors[i];
  size_t plen = block_len(first->name);
  *lo = first->offset;
  *count = 0;
  int j = i;
  while (j < model->n_tensors && block_len(model->tensors[j].name) == plen &&
         (plen == 0 || strncmp(model->tensors[j].name, first->name, plen) == 0))
    *count += model->tensors[j++].count;
  return j;
}

static void groups_of(const td_model *model, long persistence_threshold, fetch_groups *g) {
  memset(g, 0, sizeof *g);
  for (int i = 0; i < model->n_tensors;) {
    size_t lo, count;
    int j = group_at(model, i, &lo, &count);
    for (int k = i; k < j; k++) g->largest_tensor = TD_MAX(g->largest_tensor, model->tensors[k].count);
    g->n_groups++;
    if (count <= (size_t)persistence_threshold) g->persistent += count, g->n_persistent++;
    else g->group1 = TD_MAX(g->group1, count);
    i = j;
  }
}

/* Floats of the granules (gf floats) a fetched span touches beyond the span
 * itself: the parts of its first and last granule outside it. */
static size_t span_pad(size_t lo, size_t count, size_t gf) {
  return (lo + count + gf - 1) / gf * gf - lo / gf * gf - count;
}

/* Stage 3 with the parameters on disk: the floats of the granules the live
 * groups touch beyond the groups themselves. A fetch faults in whole
 * granules (2 MiB huge pages: pages.c) and a released group gives back
 * only granules no live group touches (fetch.c), so what is resident is
 * the union of the live groups' spans rounded out to granules: at most
 * each live group's own pad (span_pad). Which groups are live: the
 * persistent ones, and non-persistent ones whose sizes add up to at most
 * `cached` (stage3_max_live_parameters, or the group in use alone when that
 * is larger): at most k of them, k the most that fit taking the smallest
 * first, so the pads are at most the k largest. (Charging two granules for
 * every group of the model instead overestimated a lowered cache by 20%
 * at 6 blocks of 512 channels: memory_defaults_fit.) Pure: ordered
 * selections over the tensor table, no allocation. */
static size_t live_group_pads(const td_model *model, long persistence_threshold, size_t cached, size_t gf) {
  size_t pads = 0, used = 0;
  int k = 0;
  /* k: walk the non-persistent groups by (size, first tensor) ascending */
  for (size_t prev_n = 0, prev_i = 0, started = 0;;) {
    size_t best_n = SIZE_MAX, best_i = 0;
    for (int i = 0; i < model->n_tensors;) {
      size_t lo, n;
      int j = group_at(model, i, &lo, &n);
      bool after = !started || n > prev_n || (n == prev_n && (size_t)i > prev_i);
      if (n > (size_t)persistence_threshold && after && (n < best_n || (n == best_n && (size_t)i < best_i)))
        best_n = n, best_i = (size_t)i;
      i = j;
    }
    if (best_n == SIZE_MAX || (k > 0 && used + best_n > cached)) break;
    used += best_n, k++;
    prev_n = best_n, prev_i = best_i, started = 1;
  }
  /* the k largest pads of the non-persistent groups, by (pad, first tensor) descending; every persistent one's */
  for (int i = 0; i < model->n_tensors;) {
    size_t lo, n;
    int j = group_at(model, i, &lo, &n);
    if (n <= (size_t)persistence_threshold) pads += span_pad(lo, n, gf);
    i = j;
  }
  for (size_t prev_p = 0, prev_i = 0, started = 0; k > 0; k--) {
    size_t best_p = 0, best_i = SIZE_MAX;
    for (int i = 0; i < model->n_tensors;) {
      size_t lo, n;
      int j = group_at(model, i, &lo, &n);
      size_t p = span_pad(lo, n, gf);
      bool after = !started || p < prev_p || (p == prev_p && (size_t)i > prev_i);
      if (n > (size_t)persistence_threshold && after && (best_i == SIZE_MAX || p > best_p)) best_p = p, best_i = (size_t)i;
      i = j;
    }
    if (best_i == SIZE_MAX) break;
    pads += best_p;
    prev_p = best_p, prev_i = best_i, started = 1;
  }
  return pads;
}

size_t zero_largest_group(const td_model *model, long persistence_threshold, size_t *persistent) {
  fetch_groups g;
  groups_of(model, persistence_threshold, &g);
  if (persistent) *persistent = g.persistent;
  return g.group1;
}

/* td_trainer_gather_params at stage 3 (train-gpt's sample and exact
 * summary): the whole parameter arena becomes resident on every rank, on
 * top of what the rank holds: 9.4 GiB per rank more than the steps'
 * estimate for the 2.52B-parameter run of issue 23, which the OOM killer
 * ended (the sample's gather, by all signs: reproduced small, the gather
 * alone takes the peak from 177 to 277 MiB). */
static size_t estimate_gather(size_t n, size_t shard, int stage, bool params_on_disk) {
  if (stage < 3) return 0;
  size_t whole = n * sizeof(float), held = params_on_disk ? 0 : shard * sizeof(float);
  return whole - held;
}

/* What a rank's process adds during the steps beyond the arenas and the
 * activations, in three parts (measured as the peak RSS less the rest of
 * the estimate, train-gpt at 128-2048 channels, 1-8 ranks, shm and TCP,
 * DP, TP, PP and TP x PP: bench/results/memedge-2026-11-27.md):
 *   - the products' panels a compute thread keeps (the model's
 *     thread_scratch_bytes: td_linear_scratch_bytes of its largest layer),
 *     which is what grew with the model: 1.1 MiB at 128 channels, 3.4 at
 *     2048, 5.5 at 1024 channels on 1024 rows, one thread;
 *   - per compute thread beyond the first, OpenBLAS's packing buffers (the
 *     products go multithreaded through it): 1.0-2.6 MiB each, measured at
 *     2 threads against 1 (2 MiB);
 *   - the rest, the same for every model: the threads' stacks, the
 *     progress thread, the transport's and the pipeline's point-to-point
 *     buffers, the attention tiles, the allocator's slack: 1-3 MiB above
 *     the panels over 1-8 ranks, shm or TCP, DP, TP and PP (5 MiB: at 4
 *     the 6 x 512 GPT's DP ranks over TCP came within 1.6 MiB of it).
 * cfg->threads is the trainer's thread count (td_trainer_estimate_memory
 * resolves automatic). A fixed 7 MiB + 1 MiB per core of the host before
 * had put the pipeline ranks of a 4 x 256 GPT at 0.88x. */
#define ESTIMATE_RUNTIME_BYTES ((size_t)5 << 20)
#define ESTIMATE_THREAD_BYTES ((size_t)2 << 20)

static size_t runtime_bytes(const td_model *model, const td_train_config *cfg, int batch) {
  size_t threads = (size_t)TD_MAX(1, TD_MIN(cfg->threads, 4096));
  size_t panels = model->ops && model->ops->thread_scratch_bytes ? model->ops->thread_scratch_bytes(model, batch) : 0;
  return ESTIMATE_RUNTIME_BYTES + panels + (threads - 1) * ESTIMATE_THREAD_BYTES;
}

/* Bytes of the peers' arenas that rank `rank`'s RSS counts over the shm
 * transport's direct collectives (direct_min: td_comm_direct_min_bytes of
 * the trainer's communicator; 0: none). The arenas that are host-shared
 * (shard.c zero_arena_shareable, trainer.c's gradients at stages 0-1) are
 * read and written in place in the peers' memory, and every page of a
 * peer's arena that a rank touches is in its RSS until the peer gives it
 * back (MADV_REMOVE punches it out of every mapping). Physically these are
 * the peers' own pages, in their estimates: a host's sum must not count
 * them twice. What is touched, with B_k rank k's shard and P the arena:
 *   - the parameters at stages 1-2: each step's allgather (reduce.c) reads
 *     every peer's shard, P - B_r; with the initial broadcast (broadcast:
 *     td_trainer_create on a communicator; an elastic trainer is created
 *     without one and restores its shards instead) every rank but 0 reads
 *     all of rank 0's arena too: P + (P - B_0 - B_r); at stage 3 the fetches read every peer's shard of
 *     every group (no broadcast: each rank initializes its shard): P - B_r;
 *   - the gradients kept whole (stages 0-1, stage 2's small models): each
 *     bucket's direct allreduce reads and writes this rank's 1/n slice of
 *     it in every peer: (n - 1) ceil(P / n) over the buckets (buckets
 *     below direct_min are staged and touch nothing: counted anyway, a few
 *     first-bucket pages at most). At stages 2-3 a peer gives back what it
 *     does not own once reduced: what stays is this rank's slices of the
 *     peers' shards, (P - B_r) / n, plus its slices of the two buckets in
 *     flight in every peer. Deterministic reduction (no buckets) instead
 *     allgathers stage 0's reduced gradients: every peer's shard, P - B_r.
 * Rounded up to pages per peer. None when the arenas are private (shared
 * false): an elastic trainer is created unbound (td_trainer_create_unbound,
 * no communicator to share memory with) and its arenas stay private at
 * every epoch: its collectives go through the segment's staging instead.
 * Pure. */
size_t zero_peer_mapped_bytes(const td_model *model, const td_train_config *cfg, int world, int stage, int rank,
                              bool shared, bool buckets, bool broadcast, size_t direct_min) {
  if (!shared || !model || !cfg || world < 2 || rank < 0 || rank >= world || stage < 0 || stage > 3 || direct_min == 0) return 0;
  const size_t n = model->n_params, f = sizeof(float), whole = n * f, page = zero_page_bytes();
  if (whole < direct_min) return 0;
  size_t off, shard0, shard_r;
  td_shard_range(n, world, 0, &off, &shard0);
  td_shard_range(n, world, rank, &off, &shard_r);
  size_t peers_shards = whole - shard_r * f; /* every other rank's shard */
  size_t granule = page;
  if (stage >= 2 && zero_granule_bytes(n, world, &granule) != TD_OK) granule = page;
  bool huge = granule > page;
  bool keep = zero_keeps_grads(n, world, stage, cfg->bucket_bytes);
  size_t bytes = 0;
  if (stage >= 1 && zero_arena_shareable(cfg, huge, stage >= 3)) {
    if (stage == 3) bytes += peers_shards;
    else bytes += broadcast && rank != 0 ? whole + (whole - shard0 * f - shard_r * f) : peers_shards;
  }
  if (stage <= 1 || zero_arena_shareable(cfg, huge, !keep)) {
    size_t slice = (n + (size_t)world - 1) / (size_t)world * f;
    if (!buckets) {
      if (stage == 0) bytes += peers_shards;
    } else if (stage <= 1 || keep) {
      bytes += (size_t)(world - 1) * slice;
    } else {
      fetch_groups g;
      groups_of(model, cfg->stage3_param_persistence_threshold, &g);
      size_t in_flight = TD_MIN(2 * (cfg->bucket_bytes / f + g.largest_tensor), n) * f;
      bytes += peers_shards / (size_t)world + (size_t)(world - 1) * (in_flight / (size_t)world);
    }
  }
  return bytes ? (bytes + (size_t)(world - 1) * page + page - 1) / page * page : 0;
}

td_status zero_estimate_memory(const td_model *model, const td_train_config *cfg, int world, int stage, bool buckets,
                               td_memory_estimate *out) {
  if (!model || !cfg || !out || world < 1 || stage < 0 || stage > 3)
    return td_error(TD_ERR_INVALID_ARGUMENT,
                    "td_trainer_estimate_memory: model, cfg and out are required, world >= 1, stage 0-3 (got world "
                    "%d, stage %d)", world, stage);
  memset(out, 0, sizeof *out);
  const size_t n = model->n_params, f = sizeof(float);
  size_t shard_off, shard = 0;
  td_shard_range(n, world, 0, &shard_off, &shard); /* rank 0's shard is the largest */
  int n_states = td_optimizer_n_states(cfg->optimizer.kind);
  out->stage = stage;
  out->world = world;
  out->n_params = n;
  out->shard_params = shard;
  out->params = (stage >= 3 ? shard : n) * f;
  out->grads = (stage >= 2 ? shard : n) * f;
  out->optimizer = (size_t)n_states * (stage >= 1 ? shard : n) * f;
  /* NVMe offload (stage 3): the shard's parameters and optimizer state in
   * files; RAM keeps the optimizer's tile buffers and the fetched groups */
  bool params_on_disk = stage >= 3 && cfg->offload.param_device == TD_OFFLOAD_NVME;
  if (stage >= 3 && cfg->offload.optimizer_device == TD_OFFLOAD_NVME) {
    out->offload_buffers = td_offload_buffer_bytes(cfg, shard);
    out->optimizer = out->offload_buffers;
    out->disk = td_offload_disk_bytes(cfg, shard, 0); /* rank 0's shard starts at 0 */
  }
  if (params_on_disk) out->params = 0;
  size_t fetchable = params_on_disk ? n : n - shard; /* what a rank may fetch into its arena */

  fetch_groups g;
  groups_of(model, cfg->stage3_param_persistence_threshold, &g);
  size_t largest_tensor = g.largest_tensor, group1 = g.group1, persistent = g.persistent, n_groups = g.n_groups,
         n_persistent = g.n_persistent;
  /* Pages are given back whole: a page straddling two released pieces
   * stays (one per piece edge: at most a bucket piece per tensor and owner).
   * Large arenas give memory back in 2 MiB granules instead (pages.c), each
   * kept while partly needed. Gradients: backward writes from the top of
   * the arena down and reduce.c gives back everything reduced above the
   * buckets in flight, so what is resident outside the shard is one run
   * (pending and in-flight buckets), plus the tied head's embedding,
   * written early and reported last: two edge granules each and the two
   * around the shard. Parameters: the model fetches its groups in order
   * and the cache keeps the most recent, so the live groups form one run,
   * plus the tied head's embedding and each persistent group apart: two
   * edge granules per run, two around the shard (measured at 12 blocks of
   * 512 channels on 2 and 4 ranks, bench/results/zperf-2026-11-26*.md:
   * one granule per group edge overestimated stage 3 by 13-27%). */
  size_t page = zero_page_bytes(), granule = page;
  if (stage >= 2) TD_CHECK(zero_granule_bytes(n, world, &granule));
  size_t edges2 = (size_t)(model->n_tensors + 2 + world) * page, edges3 = edges2;
  if (granule > page) {
    /* the rest of the granules a shard's two ends lie in (resident with
     * the shard; the arena is granule-aligned), the most of any rank's */
    size_t shard_edge = 0, gf = granule / f;
    for (int r = 0; r < world; r++) {
      size_t off, len;
      td_shard_range(n, world, r, &off, &len);
      size_t lo = off / gf * gf, hi = TD_MIN((off + len + gf - 1) / gf * gf, (n + gf - 1) / gf * gf);
      shard_edge = TD_MAX(shard_edge, (hi - lo - len) * f);
    }
    edges2 = shard_edge + granule;
    edges3 = shard_edge + TD_MIN(1 + n_persistent, n_groups) * granule;
  }
  /* nothing beyond the whole arena, rounded to granules, can be resident */
  size_t room = (n * f + granule - 1) / granule * granule - shard * f;
  size_t live = 0;
  if (zero_keeps_grads(n, world, stage, cfg->bucket_bytes)) {
    live += (n - shard) * f; /* the whole gradient arena stays (shard.c), in plain or shared memory */
  } else if (stage >= 2 && world > 1 && model->ops && model->ops->run_micro_batches) {
    /* a pipeline stage accumulates its micro-batches in the whole arena
     * (the first backward writes all of it, the last makes it final):
     * stages 2 and 3 give the pages back after the reduction, but their
     * peak is stage 1's (shard.c: no accumulation into shards for it) */
    live += (n - shard) * f;
  } else if (stage >= 2 && world > 1 && buckets) {
    size_t bucket = cfg->bucket_bytes / f;
    live += TD_MIN(TD_MIN(2 * (bucket + largest_tensor), n - shard) * f + edges2, room);
  }
  if (stage >= 3 && (world > 1 || params_on_disk)) {
    /* released and prefetched groups stay within stage3_max_live_parameters;
     * only the group in use may go over it */
    size_t cached = TD_MAX((size_t)cfg->stage3_max_live_parameters, group1);
    if (params_on_disk) /* nothing resident but the live groups (no shard): their own granules */
      edges3 = live_group_pads(model, cfg->stage3_param_persistence_threshold, cached, granule / f) * f;
    /* with the parameters on disk the whole arena is fetched, the shard too */
    size_t room3 = params_on_disk ? (n * f + granule - 1) / granule * granule : room;
    live += TD_MIN(TD_MIN(cached + persistent, fetchable) * f + edges3, room3);
  }
  out->live = live;
  out->model_states = out->params + out->grads + out->optimizer + out->live;
  int batch = cfg->micro_batch > 0 ? cfg->micro_batch : 1;
  out->activations = model->ops && model->ops->activation_bytes
                         ? model->ops->activation_bytes(model, batch, cfg->activation_checkpointing,
                                                        cfg->precision.compute)
                         : 0;
  out->gather = estimate_gather(n, shard, stage, params_on_disk);
  out->runtime = runtime_bytes(model, cfg, batch);
  /* the tensor group's activation collectives and the pipeline's transfers
   * staged through a shm segment: pages the RSS counts, from the message
   * sizes (the model's) and the comm's own staging rules (issue 23: TP=2 x
   * PP=2 at 6 x 512 over shm was 1.008-1.028 of the estimate without them) */
  if (model->ops && model->ops->comm_staging_bytes) {
    size_t theirs = 0, all = model->ops->comm_staging_bytes(model, batch, &theirs);
    out->comm_staging = all - TD_MIN(theirs, all);
    out->comm_staging_shared = TD_MIN(theirs, all);
    out->runtime += out->comm_staging;
  }
  return TD_OK;
}
