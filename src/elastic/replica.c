/* Buddy replicas of sharded state (ZeRO stages 1-3 under elastic training).
 *
 * At stage >= 1 no rank holds the whole state: rank r keeps the optimizer
 * state (and at stage 3 the parameters) of its shard only. So that a lost
 * rank's shard survives it, every commit sends a copy of this rank's range
 * to its buddy, which keeps it in memory next to its own. The buddy is on
 * another host when there is one: the ranks are listed host by host (host
 * identities from the communicator) and each one's buddy is the rank one
 * largest-host-size further in that list, a shift, so that every rank has
 * exactly one buddy and one ward, and losing one host loses no shard.
 *
 * Two commits of everything are kept (own[0..1], rep[0..1], and in state.c
 * the whole buffers): a failure can leave some ranks one commit ahead of
 * others (a rank completes step c while a peer fails inside it), and a
 * replica may still have been in flight. After a failure the survivors
 * describe what they hold (range and commit of each piece); the newest
 * commit whose pieces cover every element wins (el_rep_choose), and every
 * rank of the new epoch receives its new range from whoever holds it
 * (el_rep_restore). The pieces are ranges, not ranks: the rebuild does not
 * care which layout (world size) they were cut for, so it also works when
 * a second failure hits while the first one is being repaired.
 *
 * Replication overlaps the next step: the commit starts a send of own[0]
 * and a receive into rep[1] on the communicator's progress thread and
 * returns; the next commit completes them first. The progress thread runs
 * operations one at a time in issue order, and a large send completes only
 * once its receiver takes it, so the buddy pairs form cycles in which one
 * rank (send_first) sends then receives and every other rank receives then
 * sends: the cycle unwinds from that rank, never deadlocks. */
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
    r->own[0].commit = r->own[1].commit = r->rep[0].commit = r->rep[1].commit = -1;
    r->rep_in_commit = -1;
    r->buddy = r->ward = -1;
  }
  return TD_OK;
}

void el_rep_free(el_replicas *r) {
  el_rep_settle(r);
  for (int i = 0; i < 2; i++) {
    piece_free(&r->own[i]);
    piece_free(&r->rep[i]);
  }
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

void el_rep_settle(el_replicas *r) {
  if (r->send_req) (void)td_wait(r->send_req);
  r->send_req = NULL;
  if (r->recv_req) {
    td_status st = td_wait(r->recv_req);
    r->recv_req = NULL;
    if (st == TD_OK) {
      r->rep[1].commit = r->rep_in_commit;
      swap_pieces(&r->rep[0], &r->rep[1]);
    }
  }
  r->rep_in_commit = -1;
}

void el_rep_pair(el_replicas *r, td_comm *comm) {
  int world = comm ? td_comm_size(comm) : 1;
  r->buddy = r->ward = -1;
  r->send_first = false;
  if (world < 2 || !r->n_bufs) return;
  /* Ranks host by host, hosts in order of their lowest rank. */
  int *order = malloc(sizeof(int) * (size_t)world), *pos = malloc(sizeof(int) * (size_t)world);
  bool *placed = calloc((size_t)world, sizeof(bool));
  if (!order || !pos || !placed) { /* no host knowledge: the next rank */
    free(order);
    free(pos);
    free(placed);
    int me = td_comm_rank(comm);
    r->buddy = (me + 1) % world;
    r->ward = (me + world - 1) % world;
    r->send_first = me == 0;
    return;
  }
  int n = 0, largest = 0;
  for (int a = 0; a < world; a++) {
    if (placed[a]) continue;
    const char *host = td_comm_host(comm, a);
    int size = 0;
    for (int b = a; b < world; b++)
      if (!placed[b] && !strcmp(td_comm_host(comm, b), host)) {
        placed[b] = true;
        order[n++] = b;
        size++;
      }
    if (size > largest) largest = size;
  }
  for (int i = 0; i < world; i++) pos[order[i]] = i;
  int shift = largest < world ? largest : 1;
  int me = td_comm_rank(comm), i = pos[me];
  r->buddy = order[(i + shift) % world];
  r->ward = order[(i + world - shift) % world];
  /* The cycles of a shift by s are the positions congruent modulo
   * gcd(world, s); the lowest position of each opens it. */
  int g = world, s = shift;
  while (s) {
    int t = g % s;
    g = s;
    s = t;
  }
  r->send_first = i < g;
  free(order);
  free(pos);
  free(placed);
}

/* Start (or with blocking, do) the exchange: own[0] to the buddy, the
 * ward's range into `into`. */
static td_status exchange(el_replicas *r, td_comm *comm, el_piece *into, bool blocking) {
  size_t send_bytes = (size_t)(r->own[0].hi - r->own[0].lo) * r->row_bytes;
  size_t recv_bytes = (size_t)(r->ward_hi - r->ward_lo) * r->row_bytes;
  TD_CHECK(piece_reserve(into, recv_bytes));
  into->lo = r->ward_lo;
  into->hi = r->ward_hi;
  td_status st = TD_OK;
  for (int k = 0; k < 2 && st == TD_OK; k++) {
    bool send_now = (k == 0) == r->send_first;
    if (send_now) {
      st = blocking ? td_send(r->own[0].data, send_bytes, TD_U8, r->buddy, comm)
                    : td_isend(r->own[0].data, send_bytes, TD_U8, r->buddy, comm, &r->send_req);
    } else {
      st = blocking ? td_recv(into->data, recv_bytes, TD_U8, r->ward, comm)
                    : td_irecv(into->data, recv_bytes, TD_U8, r->ward, comm, &r->recv_req);
    }
  }
  if (st != TD_OK)
    return td_error(st, "elastic: rank %d: replicating its shard to buddy rank %d (and receiving rank %d's) failed: "
                        "%s",
                    td_comm_rank(comm), r->buddy, r->ward, td_comm_last_error(comm));
  return TD_OK;
}

td_status el_rep_commit(el_replicas *r, td_comm *comm, int64_t commit) {
  if (!r->n_bufs) return TD_OK;
  double t0 = td_now();
  td_status st = TD_OK;
  if (r->send_req) st = td_wait(r->send_req);
  r->send_req = NULL;
  if (r->recv_req) {
    td_status rs = td_wait(r->recv_req);
    r->recv_req = NULL;
    if (rs == TD_OK) {
      r->rep[1].commit = r->rep_in_commit;
      swap_pieces(&r->rep[0], &r->rep[1]);
    } else if (st == TD_OK) {
      st = rs;
    }
  }
  r->rep_in_commit = -1;
  if (st != TD_OK)
    return td_error(st, "elastic: rank %d: the replica exchange with buddy rank %d / ward rank %d failed: %s",
                    td_comm_rank(comm), r->buddy, r->ward, td_comm_last_error(comm));
  swap_pieces(&r->own[0], &r->own[1]);
  TD_CHECK(snapshot(r, &r->own[0], commit));
  if (r->buddy >= 0) {
    r->rep[1].commit = -1; /* being overwritten */
    r->rep_in_commit = commit;
    st = exchange(r, comm, &r->rep[1], false);
  }
  r->replicate_s += td_now() - t0;
  return st;
}

void el_rep_describe(const el_replicas *r, int64_t *d) {
  d[EL_D_TOTAL] = (int64_t)r->total;
  d[EL_D_ROW] = (int64_t)r->row_bytes;
  const el_piece *p[4] = {&r->own[0], &r->own[1], &r->rep[0], &r->rep[1]};
  for (int i = 0; i < 4; i++) {
    bool valid = r->n_bufs && p[i]->commit >= 0;
    d[EL_D_PIECES + 3 * i] = valid ? p[i]->lo : 0;
    d[EL_D_PIECES + 3 * i + 1] = valid ? p[i]->hi : 0;
    d[EL_D_PIECES + 3 * i + 2] = valid ? p[i]->commit : -1;
  }
}

static int cmp_i64_desc(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? 1 : x > y ? -1 : 0;
}

/* The first element >= x not covered by a piece of `commit` (or total). */
static int64_t first_gap(const int64_t *desc, int world, int64_t commit, int64_t x, int64_t total) {
  bool moved = true;
  while (x < total && moved) {
    moved = false;
    for (int r = 0; r < world; r++)
      for (int i = 0; i < 4; i++) {
        const int64_t *p = desc + (size_t)r * EL_DESC + EL_D_PIECES + 3 * i;
        if (p[2] == commit && p[0] <= x && x < p[1]) {
          x = p[1];
          moved = true;
        }
      }
  }
  return x;
}

int64_t el_rep_choose(const int64_t *desc, int world, int64_t *gap_lo, int64_t *gap_hi) {
  int64_t total = 0;
  for (int r = 0; r < world; r++) total = desc[(size_t)r * EL_DESC + EL_D_TOTAL] > total ? desc[(size_t)r * EL_DESC + EL_D_TOTAL] : total;
  int n = 0;
  int64_t *cands = malloc(sizeof(int64_t) * (size_t)world * 2);
  if (!cands) return -1;
  for (int r = 0; r < world; r++)
    for (int g = 0; g < 2; g++)
      if (desc[(size_t)r * EL_DESC + g] >= 0) cands[n++] = desc[(size_t)r * EL_DESC + g];
  qsort(cands, (size_t)n, sizeof *cands, cmp_i64_desc);
  *gap_lo = *gap_hi = -1;
  int64_t chosen = -1;
  for (int i = 0; i < n && chosen < 0; i++) {
    if (i > 0 && cands[i] == cands[i - 1]) continue;
    int64_t c = cands[i], gap = first_gap(desc, world, c, 0, total);
    if (gap >= total) {
      chosen = c;
    } else if (*gap_lo < 0) { /* the newest commit's hole, for the message */
      *gap_lo = gap;
      int64_t end = total;
      for (int r = 0; r < world; r++)
        for (int k = 0; k < 4; k++) {
          const int64_t *p = desc + (size_t)r * EL_DESC + EL_D_PIECES + 3 * k;
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
static bool pick_source(const int64_t *desc, int world, int j, int64_t commit, int64_t x, int *rank_out,
                        int *piece_out) {
  int best_r = -1, best_i = -1;
  int64_t best_hi = -1;
  for (int r = 0; r < world; r++)
    for (int i = 0; i < 4; i++) {
      const int64_t *p = desc + (size_t)r * EL_DESC + EL_D_PIECES + 3 * i;
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

static const el_piece *held_piece(const el_replicas *r, int i) {
  return i == 0 ? &r->own[0] : i == 1 ? &r->own[1] : i == 2 ? &r->rep[0] : &r->rep[1];
}

td_status el_rep_restore(el_replicas *r, td_comm *comm, const int64_t *desc, const int64_t *targets, int64_t commit,
                         size_t *from_others) {
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
      if (!pick_source(desc, world, j, commit, x, &src, &pi))
        return td_error(TD_ERR_INTERNAL, "elastic: no holder of element %lld at commit %lld for rank %d",
                        (long long)x, (long long)commit, j);
      const int64_t *p = desc + (size_t)src * EL_DESC + EL_D_PIECES + 3 * pi;
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
  el_piece own = {.commit = -1}, rep = {.commit = -1};
  td_status st = snapshot(r, &own, commit);
  el_rep_pair(r, comm);
  if (st == TD_OK && r->buddy >= 0) {
    /* the ward's range, from its registration (every rank knows every
     * rank's range only through the exchange: ask it) */
    int64_t mine[2] = {own.lo, own.hi}, theirs[2] = {0, 0};
    int me = td_comm_rank(comm);
    td_status s1 = TD_OK;
    for (int k = 0; k < 2 && s1 == TD_OK; k++) {
      bool send_now = (k == 0) == r->send_first;
      s1 = send_now ? td_send(mine, 2, TD_I64, r->buddy, comm) : td_recv(theirs, 2, TD_I64, r->ward, comm);
    }
    if (s1 != TD_OK) {
      st = td_error(s1, "elastic: rank %d: telling buddy rank %d its range failed: %s", me, r->buddy,
                    td_comm_last_error(comm));
    } else {
      r->ward_lo = theirs[0];
      r->ward_hi = theirs[1];
      /* exchange() sends own[0]: put the new piece there for the call */
      swap_pieces(&r->own[0], &own);
      st = exchange(r, comm, &rep, true);
      swap_pieces(&r->own[0], &own);
      rep.commit = commit;
    }
  }
  if (st != TD_OK) { /* the old holdings stay for the next round */
    piece_free(&own);
    piece_free(&rep);
    return st;
  }
  piece_free(&r->own[0]);
  piece_free(&r->own[1]);
  piece_free(&r->rep[0]);
  piece_free(&r->rep[1]);
  r->own[0] = own;
  r->rep[0] = rep;
  return TD_OK;
}
