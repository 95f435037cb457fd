/* Buddy replicas of sharded state (ZeRO stages 1-3 under elastic training).
 *
 * At stage >= 1 no rank holds the whole state: rank r keeps the optimizer
 * state (and at stage 3 the parameters) of its shard only. So that a lost
 * rank's shard survives it, every commit sends a copy of this rank's range
 * to its buddy, which keeps it in memory next to its own; the ranks a rank
 * is buddy of are its wards. The buddy is on another host whenever there
 * is one (el_rep_buddies): the ranks are listed host by host and, when no
 * host holds more than half of them, each one's buddy is the rank one
 * largest-host-size further in that list (a shift: one buddy and one ward
 * each, never on the same host). When one host holds more than half (3+1,
 * 2+1: what a 2x2 job becomes after its first loss), a shift cannot avoid
 * that host, so its ranks spread their copies round robin over the other
 * hosts' ranks, which then keep several wards each, and theirs go to it:
 * losing any one host still loses no shard. The map is recomputed from the
 * communicator's hosts at every membership change.
 *
 * Two commits of everything are kept (own[0..1], each ward's rep[0..1], and
 * in state.c the whole buffers): a failure can leave some ranks one commit
 * ahead of others (a rank completes step c while a peer fails inside it),
 * and a replica may still have been in flight. After a failure the
 * survivors describe what they hold (range and commit of each piece); the
 * newest commit whose pieces cover every element wins (el_rep_choose), and
 * every rank of the new epoch receives its new range from whoever holds it
 * (el_rep_restore). The pieces are ranges, not ranks: the rebuild does not
 * care which layout (world size) they were cut for, so it also works when
 * a second failure hits while the first one is being repaired.
 *
 * Replication overlaps the next step: the commit starts a send of own[0]
 * and the receives into the wards' rep[1] on the communicator's progress
 * thread and returns; the next commit completes them first. The progress
 * thread runs operations one at a time in issue order, and a large send
 * completes only once its receiver takes it, so every rank issues its
 * transfers in one global order, that of the sending rank (rank j's copy
 * to buddy[j] before rank j+1's): the earliest unfinished transfer always
 * has both of its ends waiting for it, so the exchange cannot deadlock,
 * whatever the map's shape. */
#include "elastic/elastic.h"

#include <stdlib.h>
#include <string.h>

static void piece_free(el_piece *p) {
  free(p->data);
  memset(p, 0, sizeof *p);
  p->commit = -1;
}

static td_status piece_reserve(el_piece *p, size_t bytes) {
  if (bytes <= p->cap) return TD_OK;
  unsigned char *d = malloc(bytes);
  if (!d) return td_error(TD_ERR_SYSTEM, "elastic: out of memory for a replica of %zu bytes", bytes);
  free(p->data);
  p->data = d;
  p->cap = bytes;
  return TD_OK;
}

static void swap_pieces(el_piece *a, el_piece *b) {
  el_piece t = *a;
  *a = *b;
  *b = t;
}

td_status el_rep_register(el_replicas *r, const char *name, void *ptr, size_t elem_bytes, size_t total, size_t lo,
                          size_t hi) {
  if (!elem_bytes || lo > hi || hi > total || (!ptr && hi > lo))
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_elastic_register_shard(\"%s\"): elements [%zu, %zu) of %zu of %zu "
                                             "bytes each do not describe a shard",
                    name, lo, hi, total, elem_bytes);
  if (r->n_bufs && total != r->total)
    return td_error(TD_ERR_INVALID_ARGUMENT, "td_elastic_register_shard(\"%s\"): %zu elements in all, but the "
                                             "sharded buffers registered before have %zu: every sharded buffer "
                                             "of a state is split alike",
                    name, total, r->total);
  for (int i = 0; i < r->n_bufs; i++) {
    el_shard_buf *b = &r->bufs[i];
    if (strcmp(b->name, name)) continue;
    if (b->elem_bytes != elem_bytes)
      return td_error(TD_ERR_INVALID_ARGUMENT, "td_elastic_register_shard(\"%s\"): elements of %zu bytes, "
                                               "registered before with %zu",
                      name, elem_bytes, b->elem_bytes);
    b->ptr = ptr;
    b->lo = lo;
    b->hi = hi;
    return TD_OK;
  }
  if (r->n_bufs == r->cap_bufs) {
    int cap = r->cap_bufs ? 2 * r->cap_bufs : 4;
    el_shard_buf *nb = realloc(r->bufs, sizeof *nb * (size_t)cap);
    if (!nb) return td_error(TD_ERR_SYSTEM, "td_elastic_register_shard: out of memory");
    r->bufs = nb;
    r->cap_bufs = cap;
  }
  el_shard_buf *b = &r->bufs[r->n_bufs++];
  memset(b, 0, sizeof *b);
  td_strlcpy(b->name, name, sizeof b->name);
  b->ptr = ptr;
  b->elem_bytes = elem_bytes;
  b->lo = lo;
  b->hi = hi;
  r->total = total;
  r->row_bytes += elem_bytes;
  if (r->n_bufs == 1) {
    r->own[0].commit = r->own[1].commit = -1;
    r->rep_in_commit = -1;
    r->buddy = -1;
  }
  return TD_OK;
}

static void wards_free(el_ward *wards, int n) {
  for (int k = 0; k < n; k++) {
    piece_free(&wards[k].rep[0]);
    piece_free(&wards[k].rep[1]);
  }
  free(wards);
}

void el_rep_free(el_replicas *r) {
  el_rep_settle(r);
  piece_free(&r->own[0]);
  piece_free(&r->own[1]);
  wards_free(r->wards, r->n_wards);
  free(r->bufs);
  memset(r, 0, sizeof *r);
}

/* The registered range, checked to be the same for every buffer. */
static td_status registered_range(const el_replicas *r, size_t *lo, size_t *hi) {
  *lo = r->bufs[0].lo;
  *hi = r->bufs[0].hi;
  for (int i = 1; i < r->n_bufs; i++)
    if (r->bufs[i].lo != *lo || r->bufs[i].hi != *hi)
      return td_error(TD_ERR_INVALID_USAGE, "elastic: sharded buffer \"%s\" holds elements [%zu, %zu) but \"%s\" "
                                            "[%zu, %zu): re-register every sharded buffer after re-sharding",
                      r->bufs[i].name, r->bufs[i].lo, r->bufs[i].hi, r->bufs[0].name, *lo, *hi);
  return TD_OK;
}

/* Copy the registered buffers into p as a piece of `commit`. */
static td_status snapshot(const el_replicas *r, el_piece *p, int64_t commit) {
  size_t lo, hi;
  TD_CHECK(registered_range(r, &lo, &hi));
  size_t n = hi - lo;
  TD_CHECK(piece_reserve(p, n * r->row_bytes));
  size_t off = 0;
  for (int i = 0; i < r->n_bufs; i++) {
    if (n) memcpy(p->data + off, r->bufs[i].ptr, n * r->bufs[i].elem_bytes);
    off += n * r->bufs[i].elem_bytes;
  }
  p->lo = (int64_t)lo;
  p->hi = (int64_t)hi;
  p->commit = commit;
  return TD_OK;
}

/* Complete the exchange in flight: a ward's replica received whole becomes
 * its newest; returns the first failure (the send's, else a receive's). */
static td_status complete_exchange(el_replicas *r) {
  td_status st = TD_OK;
  if (r->send_req) st = td_wait(r->send_req);
  r->send_req = NULL;
  for (int k = 0; k < r->n_wards; k++) {
    el_ward *w = &r->wards[k];
    if (!w->recv_req) continue;
    td_status rs = td_wait(w->recv_req);
    w->recv_req = NULL;
    if (rs == TD_OK) {
      w->rep[1].commit = r->rep_in_commit;
      swap_pieces(&w->rep[0], &w->rep[1]);
    } else if (st == TD_OK) {
      st = rs;
    }
  }
  r->rep_in_commit = -1;
  return st;
}

void el_rep_settle(el_replicas *r) { (void)complete_exchange(r); }

void el_rep_buddies(const int *host_of, int world, int *buddy) {
  if (world < 2) {
    if (world == 1) buddy[0] = -1;
    return;
  }
  /* Ranks host by host, hosts in order of their lowest rank: order[], and
   * each host's block [start, start + size) in it. */
  int *order = malloc(sizeof(int) * (size_t)world * 3);
  if (!order) { /* no room to plan: the next rank (still a valid map) */
    for (int i = 0; i < world; i++) buddy[i] = (i + 1) % world;
    return;
  }
  int *block_of = order + world, *placed = order + 2 * world;
  for (int i = 0; i < world; i++) placed[i] = 0;
  int n = 0, n_hosts = 0, largest = 0, largest_start = 0;
  for (int a = 0; a < world; a++) {
    if (placed[a]) continue;
    int start = n;
    for (int b = a; b < world; b++)
      if (!placed[b] && host_of[b] == host_of[a]) {
        placed[b] = 1;
        block_of[n] = n_hosts;
        order[n++] = b;
      }
    if (n - start > largest) {
      largest = n - start;
      largest_start = start;
    }
    n_hosts++;
  }
  if (n_hosts == 1) {
    for (int i = 0; i < world; i++) buddy[order[i]] = order[(i + 1) % world];
  } else if (2 * largest <= world) {
    /* A shift by the largest host's size leaves every block (no block is
     * longer than the shift) and does not wrap back into it (the shift is
     * at most half of the list). */
    for (int i = 0; i < world; i++) buddy[order[i]] = order[(i + largest) % world];
  } else {
    /* One host H holds more than half: its k-th rank goes to the k-th rank
     * outside it (round robin), the k-th rank outside goes to H's k-th. */
    int n_out = world - largest;
    int *outside = placed; /* reused: the ranks outside H in list order */
    int m = 0;
    for (int i = 0; i < world; i++)
      if (i < largest_start || i >= largest_start + largest) outside[m++] = order[i];
    for (int k = 0; k < largest; k++) buddy[order[largest_start + k]] = outside[k % n_out];
    for (int k = 0; k < n_out; k++) buddy[outside[k]] = order[largest_start + k];
  }
  free(order);
}

/* This rank's buddy and wards for the communicator's epoch (every rank
 * computes the same map from the communicator's host table). */
static td_status pair(const el_replicas *r, td_comm *comm, int *buddy_out, el_ward **wards_out, int *n_wards_out) {
  int world = comm ? td_comm_size(comm) : 1, me = comm ? td_comm_rank(comm) : 0;
  *buddy_out = -1;
  *wards_out = NULL;
  *n_wards_out = 0;
  if (world < 2 || !r->n_bufs) return TD_OK;
  int *host_of = malloc(sizeof(int) * (size_t)world * 2);
  if (!host_of) return td_error(TD_ERR_SYSTEM, "elastic: out of memory pairing %d ranks with buddies", world);
  int *buddy = host_of + world;
  for (int a = 0; a < world; a++) {
    host_of[a] = a;
    for (int b = 0; b < a; b++)
      if (!strcmp(td_comm_host(comm, a), td_comm_host(comm, b))) {
        host_of[a] = host_of[b];
        break;
      }
  }
  el_rep_buddies(host_of, world, buddy);
  int n = 0;
  for (int j = 0; j < world; j++) n += buddy[j] == me;
  el_ward *wards = n ? calloc((size_t)n, sizeof *wards) : NULL;
  if (n && !wards) {
    free(host_of);
    return td_error(TD_ERR_SYSTEM, "elastic: out of memory for %d wards", n);
  }
  n = 0;
  for (int j = 0; j < world; j++)
    if (buddy[j] == me) {
      wards[n].rank = j;
      wards[n].rep[0].commit = wards[n].rep[1].commit = -1;
      n++;
    }
  *buddy_out = buddy[me];
  *wards_out = wards;
  *n_wards_out = n;
  free(host_of);
  return TD_OK;
}

/* Start (or with blocking, do) the exchange: own[0] to the buddy, each
 * ward's range into its rep[slot], in the global order of the senders
 * (see the file header). */
static td_status exchange(el_replicas *r, td_comm *comm, int slot, bool blocking) {
  size_t send_bytes = (size_t)(r->own[0].hi - r->own[0].lo) * r->row_bytes;
  for (int k = 0; k < r->n_wards; k++) {
    el_ward *w = &r->wards[k];
    TD_CHECK(piece_reserve(&w->rep[slot], (size_t)(w->hi - w->lo) * r->row_bytes));
    w->rep[slot].lo = w->lo;
    w->rep[slot].hi = w->hi;
  }
  int me = td_comm_rank(comm), k = 0;
  td_status st = TD_OK;
  for (int j = 0; j < td_comm_size(comm) && st == TD_OK; j++) {
    if (j == me && r->buddy >= 0) {
      st = blocking ? td_send(r->own[0].data, send_bytes, TD_U8, r->buddy, comm)
                    : td_isend(r->own[0].data, send_bytes, TD_U8, r->buddy, comm, &r->send_req);
    } else if (k < r->n_wards && r->wards[k].rank == j) {
      el_ward *w = &r->wards[k++];
      size_t bytes = (size_t)(w->hi - w->lo) * r->row_bytes;
      st = blocking ? td_recv(w->rep[slot].data, bytes, TD_U8, j, comm)
                    : td_irecv(w->rep[slot].data, bytes, TD_U8, j, comm, &w->recv_req);
    }
  }
  if (st != TD_OK)
    return td_error(st, "elastic: rank %d: replicating its shard to buddy rank %d (and receiving its %d wards') "
                        "failed: %s",
                    me, r->buddy, r->n_wards, td_comm_last_error(comm));
  return TD_OK;
}

td_status el_rep_commit(el_replicas *r, td_comm *comm, int64_t commit) {
  if (!r->n_bufs) return TD_OK;
  double t0 = td_now();
  td_status st = complete_exchange(r);
  if (st != TD_OK)
    return td_error(st, "elastic: rank %d: the replica exchange with buddy rank %d and its %d wards failed: %s",
                    td_comm_rank(comm), r->buddy, r->n_wards, td_comm_last_error(comm));
  swap_pieces(&r->own[0], &r->own[1]);
  TD_CHECK(snapshot(r, &r->own[0], commit));
  if (r->buddy >= 0 || r->n_wards) {
    for (int k = 0; k < r->n_wards; k++) r->wards[k].rep[1].commit = -1; /* being overwritten */
    r->rep_in_commit = commit;
    st = exchange(r, comm, 1, false);
  }
  r->replicate_s += td_now() - t0;
  return st;
}

static const el_piece *held_piece(const el_replicas *r, int i) {
  return i < 2 ? &r->own[i] : &r->wards[(i - 2) / 2].rep[(i - 2) % 2];
}

int el_rep_n_pieces(const el_replicas *r) { return 2 + 2 * r->n_wards; }

void el_rep_describe(const el_replicas *r, int64_t *d, int n_pieces) {
  d[EL_D_TOTAL] = (int64_t)r->total;
  d[EL_D_ROW] = (int64_t)r->row_bytes;
  int held = el_rep_n_pieces(r);
  for (int i = 0; i < n_pieces; i++) {
    const el_piece *p = i < held ? held_piece(r, i) : NULL;
    bool valid = p && r->n_bufs && p->commit >= 0;
    d[EL_D_PIECES + 3 * i] = valid ? p->lo : 0;
    d[EL_D_PIECES + 3 * i + 1] = valid ? p->hi : 0;
    d[EL_D_PIECES + 3 * i + 2] = valid ? p->commit : -1;
  }
}

static int cmp_i64_desc(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? 1 : x > y ? -1 : 0;
}

/* The first element >= x not covered by a piece of `commit` (or total). */
static int64_t first_gap(const int64_t *desc, int world, int n_pieces, int64_t commit, int64_t x, int64_t total) {
  bool moved = true;
  while (x < total && moved) {
    moved = false;
    for (int r = 0; r < world; r++)
      for (int i = 0; i < n_pieces; i++) {
        const int64_t *p = desc + (size_t)r * EL_DESC_LEN(n_pieces) + EL_D_PIECES + 3 * i;
        if (p[2] == commit && p[0] <= x && x < p[1]) {
          x = p[1];
          moved = true;
        }
      }
  }
  return x;
}

int64_t el_rep_choose(const int64_t *desc, int world, int n_pieces, int64_t *gap_lo, int64_t *gap_hi) {
  const size_t stride = EL_DESC_LEN(n_pieces);
  int64_t total = 0;
  for (int r = 0; r < world; r++) total = desc[(size_t)r * stride + EL_D_TOTAL] > total ? desc[(size_t)r * stride + EL_D_TOTAL] : total;
  int n = 0;
  int64_t *cands = malloc(sizeof(int64_t) * (size_t)world * 2);
  if (!cands) return -1;
  for (int r = 0; r < world; r++)
    for (int g = 0; g < 2; g++)
      if (desc[(size_t)r * stride + g] >= 0) cands[n++] = desc[(size_t)r * stride + g];
  qsort(cands, (size_t)n, sizeof *cands, cmp_i64_desc);
  *gap_lo = *gap_hi = -1;
  int64_t chosen = -1;
  for (int i = 0; i < n && chosen < 0; i++) {
    if (i > 0 && cands[i] == cands[i - 1]) continue;
    int64_t c = cands[i], gap = first_gap(desc, world, n_pieces, c, 0, total);
    if (gap >= total) {
      chosen = c;
    } else if (*gap_lo < 0) { /* the newest commit's hole, for the message */
      *gap_lo = gap;
      int64_t end = total;
      for (int r = 0; r < world; r++)
        for (int k = 0; k < n_pieces; k++) {
          const int64_t *p = desc + (size_t)r * stride + EL_D_PIECES + 3 * k;
          if (p[2] == c && p[0] > gap && p[0] < end) end = p[0];
        }
      *gap_hi = end;
    }
  }
  free(cands);
  return chosen;
}

/* Where rank j's element x comes from at `commit`: the piece of commit
 * covering x that j itself holds if any (no traffic), else the one that
 * reaches furthest (fewest messages), the lowest rank first. */
static bool pick_source(const int64_t *desc, int world, int n_pieces, int j, int64_t commit, int64_t x,
                        int *rank_out, int *piece_out) {
  int best_r = -1, best_i = -1;
  int64_t best_hi = -1;
  for (int r = 0; r < world; r++)
    for (int i = 0; i < n_pieces; i++) {
      const int64_t *p = desc + (size_t)r * EL_DESC_LEN(n_pieces) + EL_D_PIECES + 3 * i;
      if (p[2] != commit || x < p[0] || x >= p[1]) continue;
      bool better = best_r < 0 || (r == j && best_r != j) || (best_r != j && p[1] > best_hi);
      if (better) {
        best_r = r;
        best_i = i;
        best_hi = p[1];
      }
    }
  *rank_out = best_r;
  *piece_out = best_i;
  return best_r >= 0;
}

td_status el_rep_restore(el_replicas *r, td_comm *comm, const int64_t *desc, int n_pieces, const int64_t *targets,
                         int64_t commit, size_t *from_others) {
  *from_others = 0;
  if (!r->n_bufs) return TD_OK;
  int world = comm ? td_comm_size(comm) : 1, me = comm ? td_comm_rank(comm) : 0;
  size_t my_lo, my_hi;
  TD_CHECK(registered_range(r, &my_lo, &my_hi));
  /* Every rank walks the same plan: receivers in rank order, each one's
   * range left to right. A transfer completes once both of its ends reach
   * it, and every earlier transfer of both ends completed before (by
   * induction on the plan order), so blocking calls cannot deadlock. */
  for (int j = 0; j < world; j++) {
    int64_t x = targets[2 * j], end = targets[2 * j + 1];
    while (x < end) {
      int src, pi;
      if (!pick_source(desc, world, n_pieces, j, commit, x, &src, &pi))
        return td_error(TD_ERR_INTERNAL, "elastic: no holder of element %lld at commit %lld for rank %d",
                        (long long)x, (long long)commit, j);
      const int64_t *p = desc + (size_t)src * EL_DESC_LEN(n_pieces) + EL_D_PIECES + 3 * pi;
      int64_t seg_end = p[1] < end ? p[1] : end;
      if (src == me || j == me) {
        const el_piece *hp = src == me ? held_piece(r, pi) : NULL;
        size_t n = (size_t)(seg_end - x), pre = 0;
        for (int k = 0; k < r->n_bufs; k++) {
          size_t eb = r->bufs[k].elem_bytes;
          const unsigned char *from =
              hp ? hp->data + (size_t)(hp->hi - hp->lo) * pre + (size_t)(x - hp->lo) * eb : NULL;
          unsigned char *to = j == me ? r->bufs[k].ptr + ((size_t)x - my_lo) * eb : NULL;
          td_status st = TD_OK;
          if (from && to)
            memcpy(to, from, n * eb);
          else if (from)
            st = td_send(from, n * eb, TD_U8, j, comm);
          else
            st = td_recv(to, n * eb, TD_U8, src, comm);
          if (st != TD_OK)
            return td_error(st, "elastic: rank %d: moving elements [%lld, %lld) of \"%s\" from rank %d to rank %d "
                                "failed: %s",
                            me, (long long)x, (long long)seg_end, r->bufs[k].name, src, j, td_comm_last_error(comm));
          pre += eb;
        }
        if (j == me && src != me) *from_others += n;
      }
      x = seg_end;
    }
  }
  return TD_OK;
}

td_status el_rep_reset_holdings(el_replicas *r, td_comm *comm, int64_t commit) {
  if (!r->n_bufs) return TD_OK;
  el_rep_settle(r);
  /* The new holdings are built beside the old ones, which stay (for the
   * next round's descriptors) until the new ones are complete. */
  el_replicas next = *r; /* the registration (bufs, sizes); none of r's holdings */
  memset(next.own, 0, sizeof next.own);
  next.own[0].commit = next.own[1].commit = -1;
  next.wards = NULL;
  next.n_wards = 0;
  next.buddy = -1;
  next.send_req = NULL;
  next.rep_in_commit = -1;
  td_status st = snapshot(r, &next.own[0], commit);
  if (st == TD_OK) st = pair(r, comm, &next.buddy, &next.wards, &next.n_wards);
  if (st == TD_OK && (next.buddy >= 0 || next.n_wards)) {
    /* Every rank knows only its own range: tell the buddy, learn each
     * ward's, in the senders' order (see the file header). */
    int me = td_comm_rank(comm), k = 0;
    int64_t mine[2] = {next.own[0].lo, next.own[0].hi};
    for (int j = 0; j < td_comm_size(comm) && st == TD_OK; j++) {
      if (j == me && next.buddy >= 0) {
        st = td_send(mine, 2, TD_I64, next.buddy, comm);
      } else if (k < next.n_wards && next.wards[k].rank == j) {
        int64_t theirs[2] = {0, 0};
        st = td_recv(theirs, 2, TD_I64, j, comm);
        next.wards[k].lo = theirs[0];
        next.wards[k++].hi = theirs[1];
      }
    }
    if (st != TD_OK)
      st = td_error(st, "elastic: rank %d: telling buddy rank %d its range failed: %s", me, next.buddy,
                    td_comm_last_error(comm));
    else
      st = exchange(&next, comm, 0, true);
    for (int w = 0; w < next.n_wards && st == TD_OK; w++) next.wards[w].rep[0].commit = commit;
  }
  if (st != TD_OK) { /* the old holdings stay for the next round */
    piece_free(&next.own[0]);
    wards_free(next.wards, next.n_wards);
    return st;
  }
  piece_free(&r->own[0]);
  piece_free(&r->own[1]);
  wards_free(r->wards, r->n_wards);
  r->own[0] = next.own[0];
  r->own[1] = next.own[1];
  r->wards = next.wards;
  r->n_wards = next.n_wards;
  r->buddy = next.buddy;
  r->rep_in_commit = -1;
  return TD_OK;
}
