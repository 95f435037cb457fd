/* The rendezvous store's wire protocol, shared by store_client.c and
 * store_server.c (private to src/net).
 *
 * Every request is a fixed header followed by key bytes, then value A, then
 * value B; every response is a fixed header followed by one value. Integers
 * are little-endian. A client has at most one request in flight (its mutex),
 * and the server answers each request exactly once, in order.
 *
 *   request:  magic u32 | op u32 | key_len u32 | flags u32 | a_len u64 | b_len u64 | arg i64
 *             key[key_len] a[a_len] b[b_len]
 *   response: magic u32 | status u32 | flags u32 | reserved u32 | len u64 | num i64
 *             value[len]
 *
 *   op      a         b         arg                flags (request)      response
 *   SET     value     -         -                  -                    OK
 *   GET     -         -         -                  -                    OK + FOUND + value, or OK
 *   WAIT    -         -         timeout ms (<0 ∞)  -                    OK + value, or TIMEOUT
 *   ADD     -         -         delta              -                    OK, num = new value
 *   CAS     expected  desired   -                  EXPECT_MISSING       OK + FOUND? + SWAPPED? + value
 *   DELETE  -         -         -                  -                    OK + EXISTED?
 *   GATHER  count n   -         timeout ms (<0 ∞)  -                    OK + records, or TIMEOUT
 *
 * GATHER's key is a prefix P and value A the count n (u64). The server
 * answers once the n keys P0, P1, ..., P<n-1> (decimal suffixes) all exist,
 * with their values as n records "len u64 | bytes" in index order (the
 * response's num is n); on timeout, num is the first index still missing.
 * It lets N ranks exchange one value each with 2N requests in all (one SET
 * and one GATHER per rank) instead of the N^2 WAITs of reading the keys one
 * by one.
 * An ERROR response carries a message as its value.
 *
 * Before the first request, client and server authenticate each other
 * (net_auth_connect / the server's poll-loop acceptor, role
 * NET_AUTH_ROLE_STORE, context "store"; see net.h); the server reads no
 * request bytes from a connection that has not proved the job's secret. */
#ifndef TD_NET_STORE_PROTO_H
#define TD_NET_STORE_PROTO_H

#include <stdint.h>
#include <string.h>

#include "base/base.h" /* td_put_le32 and the rest: the protocol is little-endian */

#define STORE_MAGIC 0x31534454u /* "TDS1" */
#define STORE_REQ_HEADER 40
#define STORE_RESP_HEADER 32
#define STORE_MAX_KEY 4096
#define STORE_MAX_VALUE (64u * 1024 * 1024)

enum store_op { STORE_SET = 1, STORE_GET, STORE_WAIT, STORE_ADD, STORE_CAS, STORE_DELETE, STORE_GATHER };
#define STORE_GATHER_COUNT_LEN 8 /* value A of a GATHER: the count, u64 */
#define STORE_GATHER_MAX (1u << 24) /* most keys one GATHER may wait for */
enum store_resp_status { STORE_RESP_OK = 0, STORE_RESP_TIMEOUT = 1, STORE_RESP_ERROR = 2 };
#define STORE_FLAG_EXPECT_MISSING 1u /* request, CAS */
#define STORE_FLAG_FOUND 1u          /* response */
#define STORE_FLAG_SWAPPED 2u        /* response, CAS; "existed" for DELETE */

typedef struct {
  uint32_t op, key_len, flags;
  uint64_t a_len, b_len;
  int64_t arg;
} store_req_header;

typedef struct {
  uint32_t status, flags;
  uint64_t len;
  int64_t num;
} store_resp_header;

static inline void store_encode_req(unsigned char *p, const store_req_header *h) {
  td_put_le32(p, STORE_MAGIC);
  td_put_le32(p + 4, h->op);
  td_put_le32(p + 8, h->key_len);
  td_put_le32(p + 12, h->flags);
  td_put_le64(p + 16, h->a_len);
  td_put_le64(p + 24, h->b_len);
  td_put_le64(p + 32, (uint64_t)h->arg);
}
/* Returns 0, or -1 if the magic is wrong (not a Tandem store peer). */
static inline int store_decode_req(const unsigned char *p, store_req_header *h) {
  if (td_get_le32(p) != STORE_MAGIC) return -1;
  h->op = td_get_le32(p + 4);
  h->key_len = td_get_le32(p + 8);
  h->flags = td_get_le32(p + 12);
  h->a_len = td_get_le64(p + 16);
  h->b_len = td_get_le64(p + 24);
  h->arg = (int64_t)td_get_le64(p + 32);
  return 0;
}
static inline void store_encode_resp(unsigned char *p, const store_resp_header *h) {
  td_put_le32(p, STORE_MAGIC);
  td_put_le32(p + 4, h->status);
  td_put_le32(p + 8, h->flags);
  td_put_le32(p + 12, 0);
  td_put_le64(p + 16, h->len);
  td_put_le64(p + 24, (uint64_t)h->num);
}
static inline int store_decode_resp(const unsigned char *p, store_resp_header *h) {
  if (td_get_le32(p) != STORE_MAGIC) return -1;
  h->status = td_get_le32(p + 4);
  h->flags = td_get_le32(p + 8);
  h->len = td_get_le64(p + 16);
  h->num = (int64_t)td_get_le64(p + 24);
  return 0;
}

/* Check a request header (buf, len bytes, as read from the wire) against the
 * server's bound on one request's body (key + a + b). Returns 0 and fills
 * *out, or -1 with *why naming the problem. Pure: the fuzz harness calls it. */
int store_parse_req_header(const unsigned char *buf, size_t len, uint64_t max_request, store_req_header *out,
                           const char **why);

#endif
