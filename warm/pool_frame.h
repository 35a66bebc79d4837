/* pool_frame.h: the pipe protocol of pool.h, encoded and parsed (internal).
 *
 * Shared by the pool (warm/pool.c) and the helper (warm/kwarm_compile.c),
 * which compiles pool_frame.c into itself so that it links nothing of
 * warm/ but this.  The parsers are pure: no I/O, no allocation; they check
 * every length against its cap so that a caller allocates only what a
 * checked frame declares.  The format is documented in pool.h.
 *
 * Thread-safety: no state; call from any thread.
 */
#ifndef KW_WARM_POOL_FRAME_H
#define KW_WARM_POOL_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "kw_keys.h"
#include "pool.h"

/* The fixed part of a RESPONSE body. */
typedef struct kw__pool_resp_head {
    int32_t rc;
    double seconds;
    uint32_t entry_len, log_len, cubin_len;
} kw__pool_resp_head;

/* Writes a frame header of type and body_len into b. */
void kw__pool_hdr_put(uint8_t b[KW__POOL_HDR_LEN], uint16_t type,
                      uint32_t body_len);

/* Checks header b: magic, version, type == want and body_len (exact for
 * HELLO and REQUEST, at most KW__POOL_MAX_RESP for RESPONSE), stored in
 * *body_len.  Returns 0, KW_EPROTO (wrong magic, version, type or exact
 * length) or KW_E2BIG (a RESPONSE over its cap). */
int kw__pool_hdr_parse(const uint8_t b[KW__POOL_HDR_LEN], uint16_t want,
                       uint32_t *body_len);

/* Encodes key k into a REQUEST body (KW__POOL_REQ_LEN bytes). */
void kw__pool_req_put(uint8_t b[KW__POOL_REQ_LEN], const kw_keys_key *k);

/* Decodes a REQUEST body into *k (digest included).  Returns 0, or
 * KW_EPROTO when the family is unknown, nfields is not that family's, or
 * the arch is not NUL-terminated. */
int kw__pool_req_parse(const uint8_t b[KW__POOL_REQ_LEN], kw_keys_key *k);

/* Encodes the fixed part of a RESPONSE body (KW__POOL_RESP_FIXED bytes). */
void kw__pool_resp_put(uint8_t b[KW__POOL_RESP_FIXED],
                       const kw__pool_resp_head *h);

/* Decodes the fixed part of a RESPONSE of body_len bytes.  Returns 0,
 * KW_E2BIG (entry, log or cubin over its cap) or KW_EPROTO (the lengths do
 * not add up to body_len, or a cubin with rc != 0). */
int kw__pool_resp_parse(const uint8_t b[KW__POOL_RESP_FIXED],
                        uint32_t body_len, kw__pool_resp_head *h);

/* write(2) all of buf to fd, retrying EINTR and short writes.  Sockets are
 * written with MSG_NOSIGNAL, so a dead peer gives -EPIPE, not SIGPIPE.
 * Returns 0 or -errno. */
int kw__pool_write_all(int fd, const void *buf, size_t len);

#endif /* KW_WARM_POOL_FRAME_H */
