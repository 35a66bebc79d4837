/* keypack.c: a derived key set packed in place, for streaming.
 *
 * A keys request holds its key set while its client reads: that set is
 * what a slow reader costs once the stream's budget is full.  jit/'s
 * kw_keys_key is 152 bytes (13 int64 fields, most unused); packed, a key
 * is its family, the index of its arch, its digest and each field its
 * family uses as an int32 (every key field is within int32, as get's
 * rule says), about 66 bytes.  The packing reuses the set's own buffer
 * (key i's packed bytes end before key i + 1 starts), which is then
 * shrunk, so it needs no second copy at any time.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

#include "kw_alloc.h"

#define FIXED (2 + KW_KEYS_DIGEST_LEN) /* family, arch, digest */

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
        for (size_t f = 0; f < kw_keys_nfields(k->family); f++)
            if (k->fields[f] < INT32_MIN || k->fields[f] > INT32_MAX)
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
        memcpy(out + off + 2, k.digest, KW_KEYS_DIGEST_LEN);
        for (size_t f = 0; f < nf; f++) {
            int32_t v = (int32_t)k.fields[f];
            memcpy(out + off + FIXED + 4 * f, &v, 4);
        }
        off += FIXED + 4 * nf;
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
    memcpy(k->digest, p->buf + off + 2, KW_KEYS_DIGEST_LEN);
    size_t nf = kw_keys_nfields(k->family);
    for (size_t f = 0; f < nf; f++) {
        int32_t v;
        memcpy(&v, p->buf + off + FIXED + 4 * f, 4);
        k->fields[f] = v;
    }
    return off + FIXED + 4 * nf;
}

void kw__keypack_free(kw__keypack *p)
{
    free(p->buf);
    free(p->keys);
    memset(p, 0, sizeof *p);
}
