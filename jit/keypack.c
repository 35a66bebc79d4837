/* keypack.c: a key set packed (kw_keys_packed, kw_keys.h).
 *
 * jit/'s kw_keys_key is 152 bytes (13 int64 fields, most unused, an arch
 * string and a digest).  Packed, the set is a run of entries, each one
 * family byte, one arch byte, a varint mask of the fields that differ
 * from the previous entry's, and for each of those the zigzag varint
 * (LEB128) of the difference.  A derivation makes keys a family at a time,
 * one field stepping at a time, and crosses every row with every arch, so
 * most entries change one or two small fields, and one entry whose arch
 * byte is KW__KEYS_ARCH_ALL stands for the row on every arch of the table.
 * A key's digest is not kept but computed again as the key is read back
 * (one BLAKE2b of about 100 bytes, under a microsecond).  At dcp_world
 * 40000 on two archs a DeepSeek-V4-Flash key takes 2.75 bytes (1.3 MB for
 * 480,348 keys; 16.6 bytes a key as fields alone), a V3.2 key 2.50.
 *
 * The price is that a set reads only forwards, from its first key: each
 * entry means something only against the one before it (nobody seeks).
 * A set whose keys do not pack (more archs than the table holds, which no
 * derivation makes, or keys whose digests cannot be computed again) is
 * kept as it is: correct, only bigger.
 */
#include "kw_keys.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "kw_err.h"

/* Zigzag maps small magnitudes of either sign to small unsigned values;
 * done on uint64 so that every int64, and every wrapped difference of
 * two, round-trips without signed overflow. */
static uint64_t zigzag(uint64_t v)
{
    return (v << 1) ^ (0 - (v >> 63));
}

static uint64_t unzigzag(uint64_t z)
{
    return (z >> 1) ^ (0 - (z & 1));
}

/* Appends z as a LEB128 varint at out; the bytes written (at most 10). */
static size_t put_uvarint(uint8_t *out, uint64_t z)
{
    size_t n = 0;
    do {
        uint8_t b = z & 0x7f;
        z >>= 7;
        out[n++] = b | (z ? 0x80 : 0);
    } while (z);
    return n;
}

/* Reads a varint of put_uvarint at in into *z; the bytes read.  The
 * bytes are ours (written by put_uvarint), so they are not checked. */
static size_t get_uvarint(const uint8_t *in, uint64_t *z)
{
    size_t n = 0;
    unsigned shift = 0;
    *z = 0;
    do {
        *z |= (uint64_t)(in[n] & 0x7f) << shift;
        shift += 7;
    } while (in[n++] & 0x80);
    return n;
}

size_t kw__keys_put_fields(uint8_t *out, const int64_t *fields, size_t nf)
{
    size_t n = 0;
    for (size_t f = 0; f < nf; f++)
        n += put_uvarint(out + n, zigzag((uint64_t)fields[f]));
    return n;
}

size_t kw__keys_get_fields(const uint8_t *in, int64_t *fields, size_t nf)
{
    size_t n = 0;
    for (size_t f = 0; f < nf; f++) {
        uint64_t z;
        n += get_uvarint(in + n, &z);
        fields[f] = (int64_t)unzigzag(z);
    }
    return n;
}

/* Makes st the base of an entry of family: the previous entry's fields
 * when it was of that family, else all zeros (what {0} also means, so
 * the first entry needs no case of its own). */
static void delta_enter(kw_keys_delta *st, kw_k_family family)
{
    if (st->family == (uint8_t)family)
        return;
    st->family = (uint8_t)family;
    memset(st->fields, 0, sizeof st->fields);
}

size_t kw__keys_entry_put(uint8_t *out, kw_keys_delta *st, kw_k_family family,
                          uint8_t arch, const int64_t *fields)
{
    size_t nf = kw_keys_nfields(family);
    uint64_t mask = 0;
    delta_enter(st, family);
    for (size_t f = 0; f < nf; f++)
        if (fields[f] != st->fields[f])
            mask |= UINT64_C(1) << f;
    out[0] = (uint8_t)family;
    out[1] = arch;
    size_t n = 2 + put_uvarint(out + 2, mask);
    for (size_t f = 0; f < nf; f++) {
        if (!(mask >> f & 1))
            continue;
        n += put_uvarint(out + n, zigzag((uint64_t)fields[f] -
                                         (uint64_t)st->fields[f]));
        st->fields[f] = fields[f];
    }
    return n;
}

size_t kw__keys_entry_get(const uint8_t *in, kw_keys_delta *st, uint8_t *arch)
{
    uint64_t mask;
    delta_enter(st, (kw_k_family)in[0]);
    *arch = in[1];
    size_t n = 2 + get_uvarint(in + 2, &mask);
    for (size_t f = 0; mask != 0; f++, mask >>= 1) {
        if (!(mask & 1))
            continue;
        uint64_t z;
        n += get_uvarint(in + n, &z);
        st->fields[f] = (int64_t)((uint64_t)st->fields[f] + unzigzag(z));
    }
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
    size_t keys = arch == KW__KEYS_ARCH_ALL ? p->narchs : 1;
    if (keys == 0) /* every arch of none: no key, and no entry to read */
        return 0;
    if (p->len + KW__KEYS_ENTRY_MAX > p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 4096;
        uint8_t *buf = realloc(p->buf, cap);
        if (buf == NULL)
            return KW_ENOMEM;
        p->buf = buf;
        p->cap = cap;
    }
    p->len += kw__keys_entry_put(p->buf + p->len, &p->last, family,
                                 (uint8_t)arch, fields);
    p->n += keys;
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

/* True when keys[i..] starts with one family and fields on every arch of
 * p's table in table order: what a derivation makes of each row, packed
 * as one KW__KEYS_ARCH_ALL entry (so a set packed here takes the bytes
 * kw_keys_derive_packed() gives it). */
static bool is_arch_run(kw_keys_packed *p, const kw_keys_key *keys, size_t i,
                        size_t n)
{
    const kw_keys_key *k0 = &keys[i];
    size_t bytes = kw_keys_nfields(k0->family) * sizeof k0->fields[0];
    if (p->narchs == 0 || n - i < p->narchs)
        return false;
    for (size_t a = 0; a < p->narchs; a++) {
        const kw_keys_key *k = &keys[i + a];
        if (k->family != k0->family || arch_index(p, k->arch) != (int)a ||
            memcmp(k->fields, k0->fields, bytes) != 0)
            return false;
    }
    return true;
}

/* Keeps a copy of keys[0..n) whole in p (a set that does not pack). */
static int keep_whole(kw_keys_packed *p, const kw_keys_key *keys, size_t n)
{
    kw_keys_pack_init(p);
    if (n > 0 && (p->keys = malloc(n * sizeof *keys)) == NULL)
        return KW_ENOMEM;
    if (n > 0)
        memcpy(p->keys, keys, n * sizeof *keys);
    p->n = n;
    return 0;
}

int kw_keys_pack(kw_keys_packed *p, const kw_keys_key *keys, size_t n)
{
    kw__keys_digest_ctx ctx; /* a packed key's digest is computed again */
    kw_keys_pack_init(p);
    if (kw__keys_digest_init(&ctx) < 0 || !packable(p, keys, n))
        return keep_whole(p, keys, n);
    for (size_t i = 0; i < n;) {
        const kw_keys_key *k = &keys[i];
        bool all = is_arch_run(p, keys, i, n);
        int arch = all ? KW__KEYS_ARCH_ALL : arch_index(p, k->arch);
        if (kw__keys_pack_add(p, k->family, arch, k->fields) < 0) {
            kw_keys_pack_destroy(p);
            return KW_ENOMEM;
        }
        i += all ? p->narchs : 1;
    }
    kw__keys_pack_shrink(p);
    return 0;
}

bool kw_keys_pack_next(const kw_keys_packed *p, kw_keys_cursor *cur,
                       kw_keys_key *k)
{
    return kw_keys_pack_read(p, cur, k, true);
}

/* Steps cur to its next key, whose family and fields are then cur->last's,
 * and returns its arch index: the next arch of an open ALL entry, else
 * the arch of the entry at cur->off, which is read. */
static uint8_t cursor_step(const kw_keys_packed *p, kw_keys_cursor *cur)
{
    uint8_t arch = cur->arch;
    if (!cur->open) {
        cur->off += kw__keys_entry_get(p->buf + cur->off, &cur->last, &arch);
        cur->open = arch == KW__KEYS_ARCH_ALL;
        if (cur->open)
            arch = 0;
    }
    if (cur->open) {
        cur->arch = (uint8_t)(arch + 1);
        cur->open = cur->arch < p->narchs;
    }
    return arch;
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
    uint8_t arch = cursor_step(p, cur);
    memset(k, 0, sizeof *k);
    k->family = (kw_k_family)cur->last.family;
    memcpy(k->fields, cur->last.fields, sizeof k->fields);
    memcpy(k->arch, p->archs[arch], sizeof k->arch);
    /* The family was valid when packed, and the toolchain query behind
     * the digest answered when the set was made. */
    if (digest)
        (void)kw_keys_digest(k, k->digest);
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
