/* remote_entry.c: the signed value format of the fleet tier.
 *
 * A value is, little-endian, with fixed-size string fields (NUL-padded):
 *   "KWR1" | u16 version | u16 0 | digest[32] | family[48] | arch[16] |
 *   entry[256] | nvrtc[16] | u32 nfields | i64 fields[16] |
 *   u64 compile_seconds (IEEE-754 bits) | u64 cubin_len | cubin |
 *   XXH3-128 of the cubin (canonical, 16) | HMAC (crypto_auth, 32)
 * The HMAC covers every byte before it, so the digest (which key the value
 * belongs to), the metadata and the checksum are all signed: a value copied
 * to another key, edited, or signed with another key fails verification.
 */
#include "kw_remote.h"

#include <stdlib.h>
#include <string.h>

#include <sodium.h>
#include <xxhash.h>

#include "kw_bytes.h"
#include "kw_err.h"

#define MAGIC "KWR1"
#define VERSION 1
#define OFF_DIGEST 8
#define OFF_FAMILY (OFF_DIGEST + KW_CACHE_DIGEST_LEN)
#define OFF_ARCH (OFF_FAMILY + 48)
#define OFF_ENTRY (OFF_ARCH + 16)
#define OFF_NVRTC (OFF_ENTRY + 256)
#define OFF_NFIELDS (OFF_NVRTC + 16)
#define OFF_FIELDS (OFF_NFIELDS + 4)
#define OFF_SECONDS (OFF_FIELDS + 8 * KW_CACHE_MAX_FIELDS)
#define OFF_LEN (OFF_SECONDS + 8)
#define OFF_BLOB (OFF_LEN + 8)
#define SUM_LEN 16
#define MAC_LEN crypto_auth_BYTES
#define FIXED (OFF_BLOB + SUM_LEN + MAC_LEN) /* a value without its cubin */

_Static_assert(crypto_auth_BYTES == 32, "HMAC-SHA512-256 tag");
_Static_assert(crypto_auth_KEYBYTES == KW_REMOTE_KEY_LEN, "fleet key size");

/* True when the string field s (cap bytes) is NUL-terminated inside. */
static bool str_ok(const char *s, size_t cap)
{
    return memchr(s, '\0', cap) != NULL;
}

static bool info_ok(const kw_cache_info *i)
{
    return str_ok(i->family, sizeof i->family) &&
           str_ok(i->arch, sizeof i->arch) &&
           str_ok(i->entry, sizeof i->entry) &&
           str_ok(i->nvrtc, sizeof i->nvrtc) &&
           i->nfields <= KW_CACHE_MAX_FIELDS;
}

/* Writes the metadata of info at v (the fixed fields, zero-padded). */
static void encode_info(uint8_t *v, const kw_cache_info *info)
{
    memcpy(v + OFF_FAMILY, info->family, strlen(info->family));
    memcpy(v + OFF_ARCH, info->arch, strlen(info->arch));
    memcpy(v + OFF_ENTRY, info->entry, strlen(info->entry));
    memcpy(v + OFF_NVRTC, info->nvrtc, strlen(info->nvrtc));
    kw_le32_put(v + OFF_NFIELDS, info->nfields);
    for (size_t i = 0; i < KW_CACHE_MAX_FIELDS; i++)
        kw_le64_put(v + OFF_FIELDS + 8 * i, (uint64_t)info->fields[i]);
    uint64_t bits;
    memcpy(&bits, &info->compile_seconds, sizeof bits);
    kw_le64_put(v + OFF_SECONDS, bits);
}

int kw_remote_encode(const uint8_t key[KW_REMOTE_KEY_LEN],
                     const uint8_t digest[KW_CACHE_DIGEST_LEN],
                     const kw_cache_info *info, const void *blob, size_t len,
                     uint8_t **out, size_t *outlen)
{
    kw_cache_info empty;
    if (info == NULL) {
        memset(&empty, 0, sizeof empty);
        info = &empty;
    }
    if (blob == NULL || len == 0 || len > KW_CACHE_MAX_BLOB || !info_ok(info))
        return KW_EINVAL;
    size_t n = FIXED + len;
    uint8_t *v = calloc(1, n);
    if (v == NULL)
        return KW_ENOMEM;
    memcpy(v, MAGIC, 4);
    v[4] = VERSION;
    memcpy(v + OFF_DIGEST, digest, KW_CACHE_DIGEST_LEN);
    encode_info(v, info);
    kw_le64_put(v + OFF_LEN, len);
    memcpy(v + OFF_BLOB, blob, len);
    XXH128_canonical_t sum;
    XXH128_canonicalFromHash(&sum, XXH3_128bits(blob, len));
    memcpy(v + OFF_BLOB + len, &sum, SUM_LEN);
    crypto_auth(v + n - MAC_LEN, v, n - MAC_LEN, key);
    *out = v;
    *outlen = n;
    return 0;
}

/* Reads the metadata fields of a verified value into info. */
static void decode_info(const uint8_t *v, kw_cache_info *info)
{
    memset(info, 0, sizeof *info);
    memcpy(info->family, v + OFF_FAMILY, sizeof info->family);
    memcpy(info->arch, v + OFF_ARCH, sizeof info->arch);
    memcpy(info->entry, v + OFF_ENTRY, sizeof info->entry);
    memcpy(info->nvrtc, v + OFF_NVRTC, sizeof info->nvrtc);
    info->nfields = kw_le32_get(v + OFF_NFIELDS);
    for (size_t i = 0; i < KW_CACHE_MAX_FIELDS; i++)
        info->fields[i] = (int64_t)kw_le64_get(v + OFF_FIELDS + 8 * i);
    uint64_t bits = kw_le64_get(v + OFF_SECONDS);
    memcpy(&info->compile_seconds, &bits, sizeof bits);
}

/* Checks, in order: size and header (cheap), the HMAC (before trusting
 * any field), the digest it was signed for, the metadata, the checksum. */
int kw_remote_decode(const uint8_t key[KW_REMOTE_KEY_LEN],
                     const uint8_t digest[KW_CACHE_DIGEST_LEN],
                     const uint8_t *v, size_t n, const void **blob,
                     size_t *len, kw_cache_info *info)
{
    if (n <= FIXED || memcmp(v, MAGIC, 4) != 0 || v[4] != VERSION || v[5] != 0)
        return KW_ECORRUPT;
    uint64_t blen = kw_le64_get(v + OFF_LEN);
    if (blen != n - FIXED || blen > KW_CACHE_MAX_BLOB)
        return KW_ECORRUPT;
    if (crypto_auth_verify(v + n - MAC_LEN, v, n - MAC_LEN, key) != 0)
        return KW_ECORRUPT;
    if (memcmp(v + OFF_DIGEST, digest, KW_CACHE_DIGEST_LEN) != 0)
        return KW_ECORRUPT;
    kw_cache_info tmp;
    decode_info(v, &tmp);
    if (!info_ok(&tmp))
        return KW_ECORRUPT;
    XXH128_canonical_t sum;
    XXH128_canonicalFromHash(&sum, XXH3_128bits(v + OFF_BLOB, blen));
    if (memcmp(&sum, v + OFF_BLOB + blen, SUM_LEN) != 0)
        return KW_ECORRUPT;
    if (info != NULL)
        *info = tmp;
    *blob = v + OFF_BLOB;
    *len = blen;
    return 0;
}
