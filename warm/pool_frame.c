/* pool_frame.c: encoding and checking the frames of the pool's pipe
 * protocol (pool.h).  Integers are little-endian whatever the host, so the
 * format is the one pool.h documents, not an accident of the compiler. */
#include "pool_frame.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kw_bytes.h"
#include "kw_err.h"

void kw__pool_hdr_put(uint8_t b[KW__POOL_HDR_LEN], uint16_t type,
                      uint32_t body_len)
{
    kw_le32_put(b, KW__POOL_MAGIC);
    kw_le16_put(b + 4, KW__POOL_VERSION);
    kw_le16_put(b + 6, type);
    kw_le32_put(b + 8, body_len);
}

int kw__pool_hdr_parse(const uint8_t b[KW__POOL_HDR_LEN], uint16_t want,
                       uint32_t *body_len)
{
    if (kw_le32_get(b) != KW__POOL_MAGIC || kw_le16_get(b + 4) != KW__POOL_VERSION ||
        kw_le16_get(b + 6) != want)
        return KW_EPROTO;
    uint32_t len = kw_le32_get(b + 8);
    if (want == KW__POOL_T_HELLO && len != KW__POOL_HELLO_LEN)
        return KW_EPROTO;
    if (want == KW__POOL_T_REQUEST && len != KW__POOL_REQ_LEN)
        return KW_EPROTO;
    if (want == KW__POOL_T_RESPONSE && len < KW__POOL_RESP_FIXED)
        return KW_EPROTO;
    if (want == KW__POOL_T_RESPONSE && len > KW__POOL_MAX_RESP)
        return KW_E2BIG;
    *body_len = len;
    return 0;
}

void kw__pool_req_put(uint8_t b[KW__POOL_REQ_LEN], const kw_keys_key *k)
{
    size_t n = kw_keys_nfields(k->family);
    memset(b, 0, KW__POOL_REQ_LEN);
    kw_le32_put(b, (uint32_t)k->family);
    kw_le32_put(b + 4, (uint32_t)n);
    for (size_t i = 0; i < n && i < KW_KEYS_MAX_FIELDS; i++)
        kw_le64_put(b + 8 + 8 * i, (uint64_t)k->fields[i]);
    uint8_t *p = b + 8 + 8 * KW_KEYS_MAX_FIELDS;
    memcpy(p, k->arch, KW_CONFIG_ARCH_LEN);
    memcpy(p + KW_CONFIG_ARCH_LEN, k->digest, KW_KEYS_DIGEST_LEN);
}

int kw__pool_req_parse(const uint8_t b[KW__POOL_REQ_LEN], kw_keys_key *k)
{
    memset(k, 0, sizeof *k);
    uint32_t fam = kw_le32_get(b), n = kw_le32_get(b + 4);
    if (fam >= KW_K_NFAMILIES)
        return KW_EPROTO;
    k->family = (kw_k_family)fam;
    if (n != kw_keys_nfields(k->family) || n > KW_KEYS_MAX_FIELDS)
        return KW_EPROTO;
    for (uint32_t i = 0; i < n; i++)
        k->fields[i] = (int64_t)kw_le64_get(b + 8 + 8 * i);
    const uint8_t *p = b + 8 + 8 * KW_KEYS_MAX_FIELDS;
    if (memchr(p, '\0', KW_CONFIG_ARCH_LEN) == NULL)
        return KW_EPROTO;
    memcpy(k->arch, p, KW_CONFIG_ARCH_LEN);
    memcpy(k->digest, p + KW_CONFIG_ARCH_LEN, KW_KEYS_DIGEST_LEN);
    return 0;
}

void kw__pool_resp_put(uint8_t b[KW__POOL_RESP_FIXED],
                       const kw__pool_resp_head *h)
{
    uint64_t bits;
    memcpy(&bits, &h->seconds, sizeof bits);
    kw_le32_put(b, (uint32_t)h->rc);
    kw_le64_put(b + 4, bits);
    kw_le32_put(b + 12, h->entry_len);
    kw_le32_put(b + 16, h->log_len);
    kw_le32_put(b + 20, h->cubin_len);
}

int kw__pool_resp_parse(const uint8_t b[KW__POOL_RESP_FIXED],
                        uint32_t body_len, kw__pool_resp_head *h)
{
    uint64_t bits = kw_le64_get(b + 4);
    h->rc = (int32_t)kw_le32_get(b);
    memcpy(&h->seconds, &bits, sizeof bits);
    h->entry_len = kw_le32_get(b + 12);
    h->log_len = kw_le32_get(b + 16);
    h->cubin_len = kw_le32_get(b + 20);
    if (h->entry_len >= KW__POOL_ENTRY_LEN || h->log_len > KW__POOL_MAX_LOG ||
        h->cubin_len > KW__POOL_MAX_CUBIN)
        return KW_E2BIG;
    /* Each length is capped, so the 64-bit sum cannot overflow. */
    uint64_t sum = (uint64_t)KW__POOL_RESP_FIXED + h->entry_len + h->log_len +
                   h->cubin_len;
    if (sum != body_len || (h->rc != 0 && h->cubin_len != 0) ||
        (h->rc == 0 && h->cubin_len == 0))
        return KW_EPROTO;
    return 0;
}

int kw__pool_write_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    bool sock = true;
    while (len > 0) {
        ssize_t n = sock ? send(fd, p, len, MSG_NOSIGNAL) : write(fd, p, len);
        if (n < 0 && errno == ENOTSOCK && sock) {
            sock = false; /* a pipe (the helper run by hand): plain write */
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}
