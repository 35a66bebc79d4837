/* keypack.c: a derived key set packed in place, for streaming.
 *
 * A keys request holds its key set while its client reads: that set is
 * what a slow reader costs once the stream's budget is full.  jit/'s
 * kw_keys_key is 152 bytes (13 int64 fields, most unused).  Packed, a key
 * is its family, the index of its arch, and each field its family uses as
 * a zigzag varint (LEB128: most fields are small, one or two bytes); its
 * digest is not kept but computed again as the key is read back
 * (kw_keys_digest: one BLAKE2b of about 100 bytes, under a microsecond).
 * A V4 key is about 12 bytes instead of 152.  The packing reuses the
 * set's own buffer (key i's packed bytes end before key i + 1 starts),
 * which is then shrunk, so it needs no second copy at any time.
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kw_alloc.h"

#define FIXED 2 /* family, arch index */

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
static int arch_index(kw__keypack *p, const char *a)
{
    for (size_t i = 0; i < p->narchs; i++)
        if (strcmp(p->archs[i], a) == 0)
            return (int)i;
    if (p->narchs == KW_CONFIG_MAX_ARCH)
        return -1;
    snprintf(p->archs[p->narchs], KW_CONFIG_ARCH_LEN, "%s", a);
    return (int)p->narchs++;
}

/* True when every key of set fits the packed form. */
static bool packable(kw__keypack *p, const kw_keys_set *set)
{
    for (size_t i = 0; i < set->nkeys; i++) {
        const kw_keys_key *k = &set->keys[i];
        if (arch_index(p, k->arch) < 0 || (unsigned)k->family > 255)
            return false;
    }
    return true;
}

void kw__keypack_take(kw__keypack *p, kw_keys_set *set)
{
    memset(p, 0, sizeof *p);
    p->n = set->nkeys;
    if (!packable(p, set)) { /* kept as it is: correct, only bigger */
        p->keys = set->keys;
        set->keys = NULL;
        return;
    }
    uint8_t *out = (uint8_t *)set->keys;
    size_t off = 0;
    for (size_t i = 0; i < set->nkeys; i++) {
        kw_keys_key k = set->keys[i]; /* copied: the bytes below overlap it */
        size_t nf = kw_keys_nfields(k.family);
        out[off] = (uint8_t)k.family;
        out[off + 1] = (uint8_t)arch_index(p, k.arch);
        off += FIXED;
        for (size_t f = 0; f < nf; f++) /* at most 10 bytes: < 152 a key */
            off += put_varint(out + off, k.fields[f]);
    }
    set->keys = NULL;
    uint8_t *shrunk = off > 0 ? kw_realloc(out, off) : NULL;
    p->buf = shrunk != NULL ? shrunk : out; /* a failed shrink keeps it all */
    if (off == 0)
        free(out), p->buf = NULL;
}

size_t kw__keypack_next(const kw__keypack *p, size_t i, size_t off,
                        kw_keys_key *k)
{
    if (p->keys != NULL) {
        *k = p->keys[i];
        return off;
    }
    memset(k, 0, sizeof *k);
    k->family = (kw_k_family)p->buf[off];
    snprintf(k->arch, sizeof k->arch, "%s", p->archs[p->buf[off + 1]]);
    off += FIXED;
    size_t nf = kw_keys_nfields(k->family);
    for (size_t f = 0; f < nf; f++)
        off += get_varint(p->buf + off, &k->fields[f]);
    (void)kw_keys_digest(k, k->digest); /* the family packed was valid */
    return off;
}

void kw__keypack_free(kw__keypack *p)
{
    free(p->buf);
    free(p->keys);
    memset(p, 0, sizeof *p);
}
