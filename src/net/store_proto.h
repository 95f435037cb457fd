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

#define STORE_MAGIC 0x31534454u /* "TDS1" */
#define STORE_REQ_HEADER 40
#define STORE_RESP_HEADER 32
#define STORE_MAX_KEY 4096
#define STORE_MAX_VALUE (64u * 1024 * 1024)

enum store_op { STORE_SET = 1, STORE_GET, STORE_WAIT, STORE_ADD, STORE_CAS, STORE_DELETE };
enum store_resp_status { STORE_RESP_OK = 0, STORE_RESP_TIMEOUT = 1, STORE_RESP_ERROR = 2 };
#define STORE_FLAG_EXPECT_MISSING 1u /* request, CAS */
#define STORE_FLAG_FOUND 1u          /* response */
#define STORE_FLAG_SWAPPED 2u        /* response, CAS; "existed" for DELETE */

static inline void store_put_u32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static inline void store_put_u64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static inline uint32_t store_get_u32(const unsigned char *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
  return v;
}
static inline uint64_t store_get_u64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

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
  store_put_u32(p, STORE_MAGIC);
  store_put_u32(p + 4, h->op);
  store_put_u32(p + 8, h->key_len);
  store_put_u32(p + 12, h->flags);
  store_put_u64(p + 16, h->a_len);
  store_put_u64(p + 24, h->b_len);
  store_put_u64(p + 32, (uint64_t)h->arg);
}
/* Returns 0, or -1 if the magic is wrong (not a Tandem store peer). */
static inline int store_decode_req(const unsigned char *p, store_req_header *h) {
  if (store_get_u32(p) != STORE_MAGIC) return -1;
  h->op = store_get_u32(p + 4);
  h->key_len = store_get_u32(p + 8);
  h->flags = store_get_u32(p + 12);
  h->a_len = store_get_u64(p + 16);
  h->b_len = store_get_u64(p + 24);
  h->arg = (int64_t)store_get_u64(p + 32);
  return 0;
}
static inline void store_encode_resp(unsigned char *p, const store_resp_header *h) {
  store_put_u32(p, STORE_MAGIC);
  store_put_u32(p + 4, h->status);
  store_put_u32(p + 8, h->flags);
  store_put_u32(p + 12, 0);
  store_put_u64(p + 16, h->len);
  store_put_u64(p + 24, (uint64_t)h->num);
}
static inline int store_decode_resp(const unsigned char *p, store_resp_header *h) {
  if (store_get_u32(p) != STORE_MAGIC) return -1;
  h->status = store_get_u32(p + 4);
  h->flags = store_get_u32(p + 8);
  h->len = store_get_u64(p + 16);
  h->num = (int64_t)store_get_u64(p + 24);
  return 0;
}

/* Check a request header (buf, len bytes, as read from the wire) against the
 * server's bound on one request's body (key + a + b). Returns 0 and fills
 * *out, or -1 with *why naming the problem. Pure: the fuzz harness calls it. */
int store_parse_req_header(const unsigned char *buf, size_t len, uint64_t max_request, store_req_header *out,
                           const char **why);

#endif
