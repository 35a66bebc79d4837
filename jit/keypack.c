/* keypack.c: a key set packed (kw_keys_packed, kw_keys.h).
 *
 * jit/'s kw_keys_key is 152 bytes (13 int64 fields, most unused, an arch
 * string and a digest).  Packed, a key is its family, the index of its
 * arch in the set's table, and each field its family uses as a zigzag
 * varint (LEB128: most fields are small, one or two bytes); its digest is
 * not kept but computed again as the key is read back (one BLAKE2b of
 * about 100 bytes, under a microsecond).  A DeepSeek-V4 key is 12 to 17
 * bytes (the larger fields of large DCP worlds take three).  A set whose
 * keys do not pack (more archs than the table holds, which no derivation
 * makes, or keys whose digests cannot be computed again) is kept as it
 * is: correct, only bigger.
 */
#include "kw_keys.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "kw_err.h"

#define FIXED 2 /* family, arch index */
#define KEY_MAX (FIXED + 10 * KW_KEYS_MAX_FIELDS) /* a key's bytes at most */

/* Appends v as a zigzag LEB128 varint at out; the bytes written (at most
 * 10). */
static size_t put_varint(uint8_t *out, int64_t v)
{
    uint64_t z = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    size_t n = 0;
    do {
        uint8_t b = z & 0x7f;
        z >>= 7;
        out[n++] = b | (z ? 0x80 : 0);
    } while (z);
    return n;
}

/* Reads a varint of put_varint at in into *v; the bytes read. */
static size_t get_varint(const uint8_t *in, int64_t *v)
{
    uint64_t z = 0;
    size_t n = 0;
    unsigned shift = 0;
    do {
        z |= (uint64_t)(in[n] & 0x7f) << shift;
        shift += 7;
    } while (in[n++] & 0x80);
    *v = (int64_t)(z >> 1) ^ -(int64_t)(z & 1);
    return n;
}

/* The arch index of a (added when new); -1 when the table is full. */
static int arch_index(kw_keys_packed *p, const char *a)
{
    for (size_t i = 0; i < p->narchs; i++)
        if (strncmp(p->archs[i], a, KW_CONFIG_ARCH_LEN) == 0)
            return (int)i;
    if (p->narchs == KW_CONFIG_MAX_ARCH)
        return -1;
    snprintf(p->archs[p->narchs], KW_CONFIG_ARCH_LEN, "%s", a);
    return (int)p->narchs++;
}

void kw_keys_pack_init(kw_keys_packed *p)
{
    memset(p, 0, sizeof *p);
}

int kw__keys_pack_add(kw_keys_packed *p, kw_k_family family, int arch,
                      const int64_t *fields)
{
    if (p->len + KEY_MAX > p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 4096;
        uint8_t *buf = realloc(p->buf, cap);
        if (buf == NULL)
            return KW_ENOMEM;
        p->buf = buf;
        p->cap = cap;
    }
    uint8_t *out = p->buf + p->len;
    size_t off = FIXED, nf = kw_keys_nfields(family);
    out[0] = (uint8_t)family;
    out[1] = (uint8_t)arch;
    for (size_t f = 0; f < nf; f++)
        off += put_varint(out + off, fields[f]);
    p->len += off;
    p->n++;
    return 0;
}

void kw__keys_pack_shrink(kw_keys_packed *p)
{
    if (p->buf == NULL || p->len == p->cap)
        return;
    uint8_t *buf = p->len ? realloc(p->buf, p->len) : NULL;
    if (p->len == 0) {
        free(p->buf);
        p->buf = NULL;
        p->cap = 0;
    } else if (buf != NULL) { /* a failed shrink keeps it all */
        p->buf = buf;
        p->cap = p->len;
    }
}

/* True when every key of keys[0..n) fits the packed form (p's arch table
 * filled on the way). */
static bool packable(kw_keys_packed *p, const kw_keys_key *keys, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned)keys[i].family >= KW_K_NFAMILIES ||
            arch_index(p, keys[i].arch) < 0)
            return false;
    return true;
}

int kw_keys_pack(kw_keys_packed *p, const kw_keys_key *keys, size_t n)
{
    kw__keys_digest_ctx ctx; /* a packed key's digest is computed again */
    kw_keys_pack_init(p);
    if (kw__keys_digest_init(&ctx) < 0 || !packable(p, keys, n)) {
        kw_keys_pack_init(p);
        if (n > 0 && (p->keys = malloc(n * sizeof *keys)) == NULL)
            return KW_ENOMEM;
        if (n > 0)
            memcpy(p->keys, keys, n * sizeof *keys);
        p->n = n;
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        const kw_keys_key *k = &keys[i];
        if (kw__keys_pack_add(p, k->family, arch_index(p, k->arch), k->fields) < 0) {
            kw_keys_pack_destroy(p);
            return KW_ENOMEM;
        }
    }
    kw__keys_pack_shrink(p);
    return 0;
}

bool kw_keys_pack_next(const kw_keys_packed *p, kw_keys_cursor *cur,
                       kw_keys_key *k)
{
    return kw_keys_pack_read(p, cur, k, true);
}

bool kw_keys_pack_read(const kw_keys_packed *p, kw_keys_cursor *cur,
                       kw_keys_key *k, bool digest)
{
    if (cur->i >= p->n)
        return false;
    if (p->keys != NULL) {
        *k = p->keys[cur->i++];
        return true;
    }
    const uint8_t *in = p->buf + cur->off;
    memset(k, 0, sizeof *k);
    k->family = (kw_k_family)in[0];
    memcpy(k->arch, p->archs[in[1]], sizeof k->arch);
    size_t off = FIXED, nf = kw_keys_nfields(k->family);
    for (size_t f = 0; f < nf; f++)
        off += get_varint(in + off, &k->fields[f]);
    /* The family was valid when packed, and the toolchain query behind
     * the digest answered when the set was made. */
    if (digest)
        (void)kw_keys_digest(k, k->digest);
    cur->off += off;
    cur->i++;
    return true;
}

size_t kw_keys_pack_bytes(const kw_keys_packed *p)
{
    return p->keys != NULL ? p->n * sizeof *p->keys : p->cap;
}

void kw_keys_pack_move(kw_keys_packed *dst, kw_keys_packed *src)
{
    *dst = *src;
    kw_keys_pack_init(src);
}

void kw_keys_pack_destroy(kw_keys_packed *p)
{
    if (p == NULL)
        return;
    free(p->buf);
    free(p->keys);
    kw_keys_pack_init(p);
}
