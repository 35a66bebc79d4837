/* protect.c: in-memory protection of a warm's own digests (guards), the
 * plan a warm checks before it writes, and the totals of pinned entries
 * (kw_cache.h).  Guards live in c->guards under prot_mu; eviction asks
 * kw__cache_protected() about each entry it would remove.
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

static bool guard_has(const kw_cache_guard *g, uint64_t h)
{
    return g->n && bsearch(&h, g->h, g->n, sizeof h, cmp_u64) != NULL;
}

static int cmp_digest(const void *a, const void *b)
{
    return memcmp(a, b, KW_CACHE_DIGEST_LEN);
}

/* Sorts n digests in place and drops duplicates; returns the new count. */
static size_t sort_unique(uint8_t (*s)[KW_CACHE_DIGEST_LEN], size_t n)
{
    qsort(s, n, sizeof *s, cmp_digest);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (k == 0 || memcmp(s[k - 1], s[i], sizeof *s) != 0)
            memmove(s[k++], s[i], sizeof *s);
    return k;
}

/* A sorted, distinct copy of n digests (free it), or NULL (KW_ENOMEM). */
static uint8_t (*sorted_copy(const uint8_t (*d)[KW_CACHE_DIGEST_LEN], size_t n,
                             size_t *nout))[KW_CACHE_DIGEST_LEN]
{
    uint8_t(*s)[KW_CACHE_DIGEST_LEN] = malloc(n ? n * sizeof *s : 1);
    if (!s)
        return NULL;
    if (n)
        memcpy(s, d, n * sizeof *s);
    *nout = sort_unique(s, n);
    return s;
}

static bool has_digest(const uint8_t (*s)[KW_CACHE_DIGEST_LEN], size_t n,
                       const uint8_t *d)
{
    return n && bsearch(d, s, n, sizeof *s, cmp_digest) != NULL;
}

bool kw__cache_protected(kw_cache *c, const uint8_t *digest)
{
    bool yes = false;
    uint64_t h = digest_hash(digest);
    pthread_mutex_lock(&c->prot_mu);
    for (const kw_cache_guard *g = c->guards; g && !yes; g = g->next)
        yes = guard_has(g, h);
    pthread_mutex_unlock(&c->prot_mu);
    return yes;
}

int kw_cache_protect_each(kw_cache *c, size_t n, kw_cache_digest_fn next,
                          void *arg, kw_cache_guard **out)
{
    if (!c || !out || (!next && n > 0))
        return KW_EINVAL;
    kw_cache_guard *g = calloc(1, sizeof *g);
    if (!g || !(g->h = malloc(n ? n * sizeof *g->h : 1))) {
        free(g);
        return KW_ENOMEM;
    }
    uint8_t d[KW_CACHE_DIGEST_LEN];
    for (size_t i = 0; i < n; i++) {
        next(arg, d);
        g->h[i] = digest_hash(d);
    }
    qsort(g->h, n, sizeof *g->h, cmp_u64);
    for (size_t i = 0; i < n; i++)
        if (g->n == 0 || g->h[g->n - 1] != g->h[i])
            g->h[g->n++] = g->h[i];
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

/* kw_cache_digest_fn over an array: arg is a cursor into it. */
static void next_of_array(void *arg, uint8_t out[KW_CACHE_DIGEST_LEN])
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
    return kw_cache_protect_each(c, n, next_of_array, &cur, out);
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

/* Walks "meta", calling fn(c, txn, digest, meta, pinned, arg) for each
 * entry that decodes; pinned: by its flag or by a set. */
typedef int (*walk_fn)(kw_cache *c, const uint8_t *digest,
                       const kw__cache_meta *m, bool pinned, void *arg);

/* Walks cur over "meta" with pin, when not NULL, a cursor on "pinidx". */
static int walk_cursor(kw_cache *c, MDB_cursor *cur, MDB_cursor *pin,
                       walk_fn fn, void *arg)
{
    MDB_val k, d;
    MDB_cursor_op op = MDB_FIRST;
    int rc = 0, mrc = MDB_NOTFOUND;
    while (rc == 0 && (mrc = mdb_cursor_get(cur, &k, &d, op)) == 0) {
        op = MDB_NEXT;
        kw__cache_meta m;
        bool in_set = false;
        if (k.mv_size != KW_CACHE_DIGEST_LEN ||
            !kw__cache_meta_decode(d.mv_data, d.mv_size, &m))
            continue;
        if (pin)
            rc = kw__cache_in_sets_cur(c, pin, k.mv_data, &in_set, NULL);
        if (rc == 0)
            rc = fn(c, k.mv_data, &m, m.info.pinned || in_set, arg);
    }
    if (rc == 0 && mrc != MDB_NOTFOUND)
        rc = kw__cache_mdb(c, "mdb_cursor_get(meta)", mrc);
    return rc;
}

static int walk_entries(kw_cache *c, MDB_txn *txn, walk_fn fn, void *arg)
{
    MDB_cursor *cur = NULL, *pin = NULL;
    int rc = kw__cache_mdb(c, "mdb_cursor_open(meta)",
                           mdb_cursor_open(txn, c->meta, &cur));
    if (rc == 0 && c->has_pins)
        rc = kw__cache_mdb(c, "mdb_cursor_open(pinidx)",
                           mdb_cursor_open(txn, c->pinidx, &pin));
    if (rc == 0)
        rc = walk_cursor(c, cur, pin, fn, arg);
    if (pin)
        mdb_cursor_close(pin);
    if (cur) /* NULL when its open failed */
        mdb_cursor_close(cur);
    return rc;
}

typedef struct totals {
    uint64_t entries, bytes;
} totals;

static int count_pinned(kw_cache *c, const uint8_t *digest,
                        const kw__cache_meta *m, bool pinned, void *arg)
{
    (void)c;
    (void)digest;
    totals *t = arg;
    if (pinned) {
        t->entries++;
        t->bytes += m->info.size;
    }
    return 0;
}

int kw__cache_pinned_totals(kw_cache *c, MDB_txn *txn, uint64_t *entries,
                            uint64_t *bytes)
{
    totals t = {0, 0};
    int rc = walk_entries(c, txn, count_pinned, &t);
    *entries = t.entries;
    *bytes = t.bytes;
    return rc;
}

/* The plan being built, beside the sorted set it is for. */
typedef struct plan_walk {
    const uint8_t (*set)[KW_CACHE_DIGEST_LEN];
    size_t n;
    kw_cache_plan *plan;
} plan_walk;

static int plan_entry(kw_cache *c, const uint8_t *digest,
                      const kw__cache_meta *m, bool pinned, void *arg)
{
    plan_walk *w = arg;
    if (has_digest(w->set, w->n, digest)) {
        w->plan->present++;
        w->plan->present_bytes += m->info.size;
    } else if (pinned || kw__cache_protected(c, digest)) {
        w->plan->held_bytes += m->info.size;
    }
    return 0;
}

int kw_cache_plan_get(kw_cache *c,
                      const uint8_t (*digests)[KW_CACHE_DIGEST_LEN], size_t n,
                      kw_cache_plan *plan)
{
    if (!c || !plan || (!digests && n > 0))
        return KW_EINVAL;
    memset(plan, 0, sizeof *plan);
    plan_walk w = {.plan = plan};
    uint8_t(*s)[KW_CACHE_DIGEST_LEN] = sorted_copy(digests, n, &w.n);
    if (!s)
        return KW_ENOMEM;
    w.set = (const uint8_t(*)[KW_CACHE_DIGEST_LEN])s;
    MDB_txn *txn;
    int rc = kw__cache_read_begin(c, &txn);
    if (rc == 0) {
        rc = kw__cache_max_get(c, txn, &plan->max_size);
        if (rc == 0)
            rc = walk_entries(c, txn, plan_entry, &w);
        kw__cache_read_end(c, txn);
    }
    free(s);
    uint64_t used = plan->held_bytes + plan->present_bytes;
    plan->available = used < plan->max_size ? plan->max_size - used : 0;
    return rc;
}
