/* held.c: whether eviction must pass an entry by: protected by a guard
 * of this process (in memory) or in a stored pin set ("pinidx"); and the
 * sets of 64-bit digest hashes that guards and plans (protect.c) are
 * made of.  Below record.c's eviction, pins.c and protect.c; uses only
 * txn.c.  Guards live in c->guards under prot_mu.
 */
#include "kw_cache.h"

#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "internal.h"
#include "kw_err.h"

/* A guard keeps a 64-bit hash of each digest (XXH3 of its 32 bytes),
 * sorted: 8 bytes a digest instead of 32, so a warmup of 480,000 keys
 * protects them in 3.8 MB.  Two digests of one hash are both protected
 * when either is: an entry may be kept that could have gone (one chance
 * in 2^64 / n a lookup), never the reverse. */
struct kw_cache_guard {
    kw_cache *c;
    struct kw_cache_guard *prev, *next; /* c->guards, under prot_mu */
    size_t n;
    uint64_t *h; /* sorted, distinct */
};

static uint64_t digest_hash(const uint8_t *d)
{
    return XXH3_64bits(d, KW_CACHE_DIGEST_LEN);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static bool has_hash(const uint64_t *h, size_t nh, uint64_t x)
{
    return nh && bsearch(&x, h, nh, sizeof x, cmp_u64) != NULL;
}

int kw__cache_hash_set(size_t n, kw_cache_digest_fn next, void *arg,
                       uint64_t **h, size_t *nh)
{
    uint64_t *s = malloc(n ? n * sizeof *s : 1);
    if (!s)
        return KW_ENOMEM;
    uint8_t d[KW_CACHE_DIGEST_LEN];
    for (size_t i = 0; i < n; i++) {
        next(arg, d);
        s[i] = digest_hash(d);
    }
    qsort(s, n, sizeof *s, cmp_u64);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (k == 0 || s[k - 1] != s[i])
            s[k++] = s[i];
    *h = s;
    *nh = k;
    return 0;
}

bool kw__cache_hash_set_has(const uint64_t *h, size_t nh,
                            const uint8_t *digest)
{
    return has_hash(h, nh, digest_hash(digest));
}

bool kw__cache_protected(kw_cache *c, const uint8_t *digest)
{
    bool yes = false;
    uint64_t h = digest_hash(digest);
    pthread_mutex_lock(&c->prot_mu);
    for (const kw_cache_guard *g = c->guards; g && !yes; g = g->next)
        yes = has_hash(g->h, g->n, h);
    pthread_mutex_unlock(&c->prot_mu);
    return yes;
}

int kw_cache_protect_each(kw_cache *c, size_t n, kw_cache_digest_fn next,
                          void *arg, kw_cache_guard **out)
{
    if (!c || !out || (!next && n > 0))
        return KW_EINVAL;
    kw_cache_guard *g = calloc(1, sizeof *g);
    if (!g || kw__cache_hash_set(n, next, arg, &g->h, &g->n) < 0) {
        free(g);
        return KW_ENOMEM;
    }
    g->c = c;
    pthread_mutex_lock(&c->prot_mu);
    g->next = c->guards;
    if (c->guards)
        c->guards->prev = g;
    c->guards = g;
    pthread_mutex_unlock(&c->prot_mu);
    *out = g;
    return 0;
}

void kw__cache_next_of_array(void *arg, uint8_t out[KW_CACHE_DIGEST_LEN])
{
    const uint8_t (**d)[KW_CACHE_DIGEST_LEN] = arg;
    memcpy(out, **d, KW_CACHE_DIGEST_LEN);
    (*d)++;
}

int kw_cache_protect(kw_cache *c,
                     const uint8_t (*digests)[KW_CACHE_DIGEST_LEN], size_t n,
                     kw_cache_guard **out)
{
    if (!digests && n > 0)
        return KW_EINVAL;
    const uint8_t (*cur)[KW_CACHE_DIGEST_LEN] = digests;
    return kw_cache_protect_each(c, n, kw__cache_next_of_array, &cur, out);
}

void kw_cache_unprotect(kw_cache_guard *g)
{
    if (!g)
        return;
    kw_cache *c = g->c;
    pthread_mutex_lock(&c->prot_mu);
    if (g->prev)
        g->prev->next = g->next;
    else
        c->guards = g->next;
    if (g->next)
        g->next->prev = g->prev;
    pthread_mutex_unlock(&c->prot_mu);
    free(g->h);
    free(g);
}

/* --- stored pin sets ---------------------------------------------------- */

int kw__cache_in_sets_cur(kw_cache *c, MDB_cursor *cur, const uint8_t *digest,
                          bool *held, uint32_t *nsets)
{
    *held = false;
    if (nsets)
        *nsets = 0;
    MDB_val k = {KW_CACHE_DIGEST_LEN, (void *)digest}, d;
    MDB_cursor_op op = MDB_SET_RANGE;
    int rc;
    while ((rc = mdb_cursor_get(cur, &k, &d, op)) == 0 &&
           k.mv_size > KW_CACHE_DIGEST_LEN &&
           memcmp(k.mv_data, digest, KW_CACHE_DIGEST_LEN) == 0) {
        *held = true;
        if (!nsets)
            break;
        ++*nsets;
        op = MDB_NEXT;
    }
    return rc == 0 || rc == MDB_NOTFOUND ? 0
                                         : kw__cache_mdb(c, "pinidx", rc);
}

int kw__cache_in_sets(kw_cache *c, MDB_txn *txn, const uint8_t *digest,
                      bool *held, uint32_t *nsets)
{
    *held = false;
    if (nsets)
        *nsets = 0;
    if (!c->has_pins)
        return 0;
    MDB_cursor *cur;
    int rc = mdb_cursor_open(txn, c->pinidx, &cur);
    if (rc != 0)
        return kw__cache_mdb(c, "mdb_cursor_open(pinidx)", rc);
    rc = kw__cache_in_sets_cur(c, cur, digest, held, nsets);
    mdb_cursor_close(cur);
    return rc;
}

int kw__cache_held(kw_cache *c, MDB_txn *txn, const uint8_t *digest,
                   bool *held)
{
    if (kw__cache_protected(c, digest)) {
        *held = true;
        return 0;
    }
    return kw__cache_in_sets(c, txn, digest, held, NULL);
}
