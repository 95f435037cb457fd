/* Protected streams: per-record integrity (and, as an option, encryption)
 * of a connection's bytes after the handshake (auth.c), with libsodium's
 * AEADs: AES-256-GCM where the CPU has AES-NI and PCLMUL
 * (crypto_aead_aes256gcm_is_available), else ChaCha20-Poly1305 (IETF).
 *
 * Keys: each connection and each direction has its own key,
 * BLAKE2b-256(job key; label, mode, context, connecting rank, both
 * handshake nonces), so a record sealed for one connection, direction or
 * mode opens nowhere else. The nonce is the direction's record counter
 * (96 bits: 64-bit counter, zero padded), which the sealer and the opener
 * both advance by one per record: a key never sees a nonce twice, and a
 * replayed, reordered or dropped record is opened with the wrong nonce and
 * fails like an altered one. A failure leaves the counter where it was;
 * the caller closes the connection (the stream is out of step from then).
 *
 * Integrity only: the record's bytes are the AEAD's additional data (the
 * message itself is empty), so they travel as they are and the sealer
 * reads them in place (no copy); GCM's and Poly1305's final block covers
 * the data's length, so the record length needs no separate MAC.
 * Encryption: the bytes are encrypted in place. Either way a record is
 *
 *     | length (u32 LE) | magic (u32) | payload (length bytes) | tag (16) |
 *
 * The header is not secret; a changed length makes the opener read other
 * bytes as the payload and the tag, which then fails. */
#include "net/net.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#define PROTECT_MAGIC 0x52504454u /* "TDPR" */

_Static_assert(NET_PROTECT_TAG_BYTES == crypto_aead_aes256gcm_ABYTES, "GCM tag size");
_Static_assert(NET_PROTECT_TAG_BYTES == crypto_aead_chacha20poly1305_ietf_ABYTES, "Poly1305 tag size");
_Static_assert(crypto_aead_aes256gcm_NPUBBYTES == crypto_aead_chacha20poly1305_ietf_NPUBBYTES, "nonce sizes");

const char *net_protect_mode_name(net_protect_mode mode) {
  return mode == NET_PROTECT_INTEGRITY ? "integrity" : mode == NET_PROTECT_ENCRYPT ? "encrypt" : "off";
}

int net_protect_parse_mode(const char *text, net_protect_mode *out) {
  if (!text) return -1;
  if (!strcmp(text, "off")) *out = NET_PROTECT_OFF;
  else if (!strcmp(text, "integrity")) *out = NET_PROTECT_INTEGRITY;
  else if (!strcmp(text, "encrypt")) *out = NET_PROTECT_ENCRYPT;
  else return -1;
  return 0;
}

bool net_protect_aes_available(void) {
  if (net_auth_init() != TD_OK) return false; /* sodium_init runs there */
  return crypto_aead_aes256gcm_is_available() != 0;
}

void net_protect_key_clear(net_protect_key *k) {
  if (!k) return;
  if (k->aes_state) {
    sodium_memzero(k->aes_state, sizeof *k->aes_state);
    free(k->aes_state);
  }
  sodium_memzero(k, sizeof *k);
}

static td_status key_init(net_protect_key *k, net_protect_mode mode, bool aes, const unsigned char key[32]) {
  memset(k, 0, sizeof *k);
  k->mode = mode;
  k->aes = aes;
  memcpy(k->key, key, sizeof k->key);
  if (aes) {
    /* The expanded key schedule once per connection, not per record; the
     * state must be 16-byte aligned. */
    k->aes_state = aligned_alloc(16, (sizeof(crypto_aead_aes256gcm_state) + 15) & ~(size_t)15);
    if (!k->aes_state) return td_error(TD_ERR_SYSTEM, "out of memory for a stream key");
    crypto_aead_aes256gcm_beforenm(k->aes_state, key);
  }
  return TD_OK;
}

td_status net_protect_derive(net_protect_mode mode, bool aes, const char *ctx, const net_auth_session *session,
                             bool connector, net_protect_key *send_out, net_protect_key *recv_out) {
  memset(send_out, 0, sizeof *send_out);
  memset(recv_out, 0, sizeof *recv_out);
  if (mode == NET_PROTECT_OFF) return TD_OK;
  TD_CHECK(net_auth_init());
  if (aes && !crypto_aead_aes256gcm_is_available())
    return td_error(TD_ERR_INVALID_USAGE, "AES-256-GCM asked for, but this CPU has no AES-NI/PCLMUL");
  unsigned char keys[2][32];
  for (int dir = 0; dir < 2; dir++) {
    /* dir 0: connector to acceptor, 1: acceptor to connector. Every field
     * is fixed-size or length-prefixed. */
    static const char label[] = "tandem stream v1";
    unsigned char fields[16];
    size_t ctx_len = ctx ? strlen(ctx) : 0;
    td_put_le32(fields, (uint32_t)dir);
    td_put_le32(fields + 4, (uint32_t)mode | (aes ? 0x100u : 0u));
    td_put_le32(fields + 8, (uint32_t)session->hello.rank);
    td_put_le32(fields + 12, (uint32_t)ctx_len);
    net_auth_derive(label, fields, sizeof fields, (const unsigned char *)ctx, ctx_len, session, keys[dir]);
  }
  int mine = connector ? 0 : 1;
  td_status st = key_init(send_out, mode, aes, keys[mine]);
  if (st == TD_OK) st = key_init(recv_out, mode, aes, keys[1 - mine]);
  sodium_memzero(keys, sizeof keys);
  if (st != TD_OK) {
    net_protect_key_clear(send_out);
    net_protect_key_clear(recv_out);
  }
  return st;
}

static void nonce_of(uint64_t counter, unsigned char nonce[crypto_aead_aes256gcm_NPUBBYTES]) {
  memset(nonce, 0, crypto_aead_aes256gcm_NPUBBYTES);
  td_put_le64(nonce, counter);
}

void net_protect_seal(net_protect_key *k, unsigned char hdr[NET_PROTECT_HDR_BYTES], unsigned char *data, size_t len,
                      unsigned char tag[NET_PROTECT_TAG_BYTES]) {
  unsigned char nonce[crypto_aead_aes256gcm_NPUBBYTES];
  nonce_of(k->counter++, nonce);
  td_put_le32(hdr, (uint32_t)len);
  td_put_le32(hdr + 4, PROTECT_MAGIC);
  unsigned long long tag_len = 0;
  bool enc = k->mode == NET_PROTECT_ENCRYPT;
  /* integrity: the data is the additional data of an empty message (whose
   * output pointer must still be valid) */
  unsigned char empty[1];
  unsigned char *out = enc ? data : empty;
  const unsigned char *m = enc ? data : empty, *ad = enc ? NULL : data;
  unsigned long long mlen = enc ? len : 0, adlen = enc ? 0 : len;
  if (k->aes)
    crypto_aead_aes256gcm_encrypt_detached_afternm(out, tag, &tag_len, m, mlen, ad, adlen, NULL, nonce, k->aes_state);
  else
    crypto_aead_chacha20poly1305_ietf_encrypt_detached(out, tag, &tag_len, m, mlen, ad, adlen, NULL, nonce, k->key);
}

int net_protect_parse_hdr(const unsigned char hdr[NET_PROTECT_HDR_BYTES], size_t *len_out) {
  if (td_get_le32(hdr + 4) != PROTECT_MAGIC) return -1;
  size_t len = td_get_le32(hdr);
  if (len > NET_PROTECT_RECORD_MAX) return -1;
  *len_out = len;
  return 0;
}

bool net_protect_open(net_protect_key *k, const unsigned char hdr[NET_PROTECT_HDR_BYTES], unsigned char *data,
                      size_t len, const unsigned char tag[NET_PROTECT_TAG_BYTES]) {
  size_t hdr_len;
  if (net_protect_parse_hdr(hdr, &hdr_len) != 0 || hdr_len != len) return false;
  unsigned char nonce[crypto_aead_aes256gcm_NPUBBYTES];
  nonce_of(k->counter, nonce);
  bool enc = k->mode == NET_PROTECT_ENCRYPT;
  unsigned char empty[1];
  unsigned char *out = enc ? data : empty;
  const unsigned char *c = enc ? data : empty, *ad = enc ? NULL : data;
  unsigned long long clen = enc ? len : 0, adlen = enc ? 0 : len;
  int r;
  if (k->aes)
    r = crypto_aead_aes256gcm_decrypt_detached_afternm(out, NULL, c, clen, tag, ad, adlen, nonce, k->aes_state);
  else
    r = crypto_aead_chacha20poly1305_ietf_decrypt_detached(out, NULL, c, clen, tag, ad, adlen, nonce, k->key);
  if (r != 0) return false;
  k->counter++;
  return true;
}
