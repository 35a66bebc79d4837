/* write.c: put, remove, pin and resize, each through the write loop of
 * commit.c (kw__cache_write), which turns MDB_MAP_FULL into eviction and
 * a retry (kw_cache.h, internal.h).
 *
 * Each operation is one write transaction, so a crash (SIGKILL included)
 * leaves an entry's blob, metadata, "lru" key and byte count all written or
 * none.  LMDB serializes write transactions across threads and processes,
 * which is what makes "stored once" hold when two writers race.
 */
#include "kw_cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xxh_x86dispatch.h> /* XXH3 with AVX2/AVX-512 where the CPU has them */
#endif

#include "internal.h"

#include <errno.h>
#include "kw_err.h"

/* One put, as its write transaction sees it. */
typedef struct put_req {
    const uint8_t *digest;
    const void *blob;
    size_t len;
    kw__cache_meta m;
    bool compiled; /* count a compile with it (kw_cache_item.compiled) */
    bool stored;
} put_req;

/* Records why a put (or resize) cannot fit: `held` bytes that eviction may
 * not touch (pinned or protected) beside `len` new ones, over `max`. */
static void no_room(kw_cache *c, const char *what, uint64_t len,
                    uint64_t held, uint64_t max)
{
    kw__cache_set_error(c, "%s: needs %llu bytes (%llu new beside %llu "
                           "pinned or protected), over the limit of %llu; "
                           "raise it with `kwarm resize`",
                        what, (unsigned long long)(held + len),
                        (unsigned long long)len, (unsigned long long)held,
                        (unsigned long long)max);
}

/* Makes room for len bytes under the stored limit, evicting from the LRU
 * end.  KW_ENOSPC when only pinned or protected entries are left and it
 * still does not fit; the caller then aborts, which undoes the evictions
 * too. */
static int make_room(kw_cache *c, MDB_txn *txn, uint64_t len)
{
    uint64_t bytes, max;
    int rc = kw__cache_stat_get(c, txn, "bytes", &bytes);
    if (rc == 0)
        rc = kw__cache_max_get(c, txn, &max);
    if (rc < 0 || (bytes <= max && len <= max - bytes))
        return rc;
    rc = kw__cache_evict_txn(c, txn, 0, bytes + len - max, NULL);
    if (rc == 0)
        rc = kw__cache_stat_get(c, txn, "bytes", &bytes);
    if (rc == 0 && (bytes > max || len > max - bytes)) {
        no_room(c, "put", len, bytes, max);
        rc = KW_ENOSPC;
    }
    return rc;
}

/* Pages our B-trees hold now in txn (LMDB's main tree, one page naming
 * them, and its free list are part of the reserve). */
static int live_pages(kw_cache *c, MDB_txn *txn, uint64_t *pages)
{
    const MDB_dbi dbis[6] = {c->meta,  c->blob, c->lru,
                             c->stats, c->pins, c->pinidx};
    *pages = 0;
    for (int i = 0; i < (c->has_pins ? 6 : 4); i++) {
        MDB_stat st;
        int rc = kw__cache_mdb(c, "mdb_stat", mdb_stat(txn, dbis[i], &st));
        if (rc < 0)
            return rc;
        *pages += st.ms_branch_pages + st.ms_leaf_pages + st.ms_overflow_pages;
    }
    return 0;
}

/* Keeps the B-trees inside the page budget with room for a blob of len
 * bytes, evicting from the LRU end in batches.  The budget is three
 * quarters of the map that the stored limit calls for (no more than this
 * handle mapped): the rest stays free for the pages that commits free but
 * LMDB can reuse only two commits later, for the free list itself, and so
 * that deleting always finds a page.  The byte limit alone does
 * not: many tiny entries fill the map with B-tree pages long before their
 * cubins reach max_size.  Evicting before LMDB reports MDB_MAP_FULL matters,
 * because a completely full map cannot even delete. */
static int fit_map(kw_cache *c, MDB_txn *txn, uint64_t len)
{
    /* the blob's overflow pages, plus the pages a put copies on write */
    uint64_t need = (len + c->psize - 1) / c->psize + 32, max;
    int rc = kw__cache_max_get(c, txn, &max);
    if (rc < 0)
        return rc;
    uint64_t map = kw__cache_map_size(max);
    uint64_t budget = (map < c->mapsize ? map : c->mapsize) / c->psize / 4 * 3;
    for (;;) {
        uint64_t live, evicted;
        rc = live_pages(c, txn, &live);
        if (rc < 0 || live + need <= budget)
            return rc;
        if ((rc = kw__cache_evict_txn(c, txn, KW__CACHE_EVICT_BATCH, 0, &evicted)) < 0)
            return rc;
        if (evicted == 0) {
            kw__cache_set_error(c, "put: map full of pinned entries");
            return KW_ENOSPC;
        }
    }
}

static int put_fn(kw_cache *c, MDB_txn *txn, void *arg)
{
    put_req *r = arg;
    MDB_val k = {KW_CACHE_DIGEST_LEN, (void *)r->digest}, d;
    int rc = kw__cache_mdb(c, "mdb_get(meta)", mdb_get(txn, c->meta, &k, &d));
    r->stored = false;
    if (rc == 0) /* already there: leave it, as MDB_NOOVERWRITE would */
        return r->compiled ? kw__cache_stat_add(c, txn, "compiles", 1) : 0;
    if (rc != KW_ENOTFOUND || (rc = make_room(c, txn, r->len)) < 0 ||
        (rc = fit_map(c, txn, r->len)) < 0)
        return rc;
    d = (MDB_val){r->len, (void *)r->blob};
    rc = kw__cache_mdb(c, "mdb_put(blob)", mdb_put(txn, c->blob, &k, &d, 0));
    if (rc == 0)
        rc = kw__cache_meta_put(c, txn, r->digest, &r->m);
    if (rc == 0 && !r->m.info.pinned) {
        uint8_t key[KW__CACHE_LRU_KEY];
        kw__cache_lru_key(r->m.tick, r->digest, key);
        MDB_val lk = {sizeof key, key}, empty = {0, NULL};
        rc = kw__cache_mdb(c, "mdb_put(lru)",
                           mdb_put(txn, c->lru, &lk, &empty, 0));
    }
    if (rc == 0)
        rc = kw__cache_stat_add(c, txn, "bytes", (int64_t)r->len);
    /* The compile is counted by the transaction that stores its entry, so
     * no crash can leave the one without the other. */
    if (rc == 0 && r->compiled)
        rc = kw__cache_stat_add(c, txn, "compiles", 1);
    r->stored = rc == 0;
    return rc;
}

/* Checks one put's arguments and fills its request (the checksum is
 * computed here, before any transaction: the write lock is held for LMDB
 * only).  0, KW_EINVAL or KW_EROFS. */
static int put_prepare(kw_cache *c, put_req *r, const uint8_t *digest,
                       const kw_cache_info *info, const void *blob, size_t len,
                       bool pin)
{
    if (!c || !digest || !blob || len == 0 || len > KW_CACHE_MAX_BLOB ||
        (info && !kw__cache_info_ok(info)))
        return KW_EINVAL;
    if (c->read_only)
        return kw__cache_refuse_ro(c);
    *r = (put_req){.digest = digest, .blob = blob, .len = len};
    if (info)
        r->m.info = *info;
    r->m.info.size = len;
    r->m.info.hits = 0;
    r->m.info.pinned = pin;
    r->m.tick = r->m.created_ns = kw__cache_tick(c);
    XXH128_canonical_t sum;
    XXH128_canonicalFromHash(&sum, XXH3_128bits(blob, len));
    memcpy(r->m.sum, sum.digest, sizeof r->m.sum);
    return 0;
}

int kw_cache_put(kw_cache *c, const uint8_t digest[KW_CACHE_DIGEST_LEN],
                 const kw_cache_info *info, const void *blob, size_t len,
                 bool pin, bool *stored)
{
    put_req r;
    if (stored)
        *stored = false;
    int rc = put_prepare(c, &r, digest, info, blob, len, pin);
    if (rc == 0)
        rc = kw__cache_write_counted(c, put_fn, &r, len);
    if (rc == 0 && stored)
        *stored = r.stored;
    return rc;
}

/* A batch of puts in one transaction. */
typedef struct batch_req {
    put_req *r;
    size_t n;
} batch_req;

static int batch_fn(kw_cache *c, MDB_txn *txn, void *arg)
{
    batch_req *b = arg;
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < b->n; i++)
        rc = put_fn(c, txn, &b->r[i]);
    return rc;
}

int kw_cache_put_many(kw_cache *c, const kw_cache_item *items, size_t n,
                      int *rcs)
{
    put_req *r = calloc(n ? n : 1, sizeof *r);
    if (r == NULL)
        return KW_ENOMEM;
    size_t ok = 0;
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
        const kw_cache_item *it = &items[i];
        rcs[i] = put_prepare(c, &r[ok], it->digest, it->info, it->blob, it->len,
                             it->pin);
        if (rcs[i] == 0) {
            r[ok].compiled = it->compiled;
            bytes += r[ok++].len;
        }
    }
    batch_req b = {r, ok};
    int rc = ok > 0 ? kw__cache_write_counted(c, batch_fn, &b, bytes) : 0;
    /* The whole batch failed (one put could not fit, say): each alone, so
     * every item gets its own answer and one item's failure is its own. */
    for (size_t i = 0, j = 0; rc < 0 && i < n; i++)
        if (rcs[i] == 0) {
            rcs[i] = kw__cache_write_counted(c, put_fn, &r[j], r[j].len);
            j++;
        }
    free(r);
    return 0;
}

static int remove_fn(kw_cache *c, MDB_txn *txn, void *arg)
{
    const uint8_t *digest = arg;
    kw__cache_meta m;
    int rc = kw__cache_meta_get(c, txn, digest, &m);
    if (rc == 0 || rc == KW_ECORRUPT)
        rc = kw__cache_drop_txn(c, txn, digest, rc == 0 ? &m : NULL, NULL);
    return rc;
}

int kw_cache_remove(kw_cache *c, const uint8_t digest[KW_CACHE_DIGEST_LEN])
{
    if (!c || !digest)
        return KW_EINVAL;
    if (c->read_only)
        return kw__cache_refuse_ro(c);
    return kw__cache_write(c, remove_fn, (void *)digest, 0);
}

typedef struct pin_req {
    const uint8_t *digest;
    bool pinned;
} pin_req;

/* Moves the entry out of "lru" (pin) or back in at its tick (unpin). */
static int pin_fn(kw_cache *c, MDB_txn *txn, void *arg)
{
    pin_req *r = arg;
    kw__cache_meta m;
    int rc = kw__cache_meta_get(c, txn, r->digest, &m);
    if (rc < 0 || m.info.pinned == r->pinned)
        return rc == KW_ECORRUPT ? KW_ECACHE : rc;
    uint8_t key[KW__CACHE_LRU_KEY];
    kw__cache_lru_key(m.tick, r->digest, key);
    MDB_val lk = {sizeof key, key}, empty = {0, NULL};
    if (r->pinned) {
        rc = kw__cache_mdb(c, "mdb_del(lru)", mdb_del(txn, c->lru, &lk, NULL));
        rc = rc == KW_ENOTFOUND ? 0 : rc;
    } else {
        rc = kw__cache_mdb(c, "mdb_put(lru)",
                           mdb_put(txn, c->lru, &lk, &empty, 0));
    }
    m.info.pinned = r->pinned;
    if (rc == 0)
        rc = kw__cache_meta_put(c, txn, r->digest, &m);
    return rc;
}

int kw_cache_pin(kw_cache *c, const uint8_t digest[KW_CACHE_DIGEST_LEN],
                 bool pinned)
{
    if (!c || !digest)
        return KW_EINVAL;
    if (c->read_only)
        return kw__cache_refuse_ro(c);
    pin_req r = {digest, pinned};
    return kw__cache_write(c, pin_fn, &r, 0);
}

/* Stores the new limit (arg) after evicting down to it; KW_ENOSPC when
 * what is left (pinned or protected) is still over it. */
static int resize_fn(kw_cache *c, MDB_txn *txn, void *arg)
{
    uint64_t max = *(const uint64_t *)arg, bytes, old;
    int rc = kw__cache_stat_get(c, txn, "bytes", &bytes);
    if (rc == 0 && bytes > max)
        rc = kw__cache_evict_txn(c, txn, 0, bytes - max, NULL);
    if (rc == 0)
        rc = kw__cache_stat_get(c, txn, "bytes", &bytes);
    if (rc == 0 && bytes > max) {
        no_room(c, "resize", 0, bytes, max);
        return KW_ENOSPC;
    }
    if (rc == 0)
        rc = kw__cache_max_get(c, txn, &old);
    if (rc == 0 && old != max)
        rc = kw__cache_stat_add(c, txn, "max_size", (int64_t)(max - old));
    return rc;
}

int kw_cache_resize(kw_cache *c, uint64_t max_size)
{
    if (!c || max_size < KW_CACHE_MIN_SIZE || max_size > KW_CACHE_MAX_SIZE)
        return KW_EINVAL;
    if (c->read_only)
        return kw__cache_refuse_ro(c);
    return kw__cache_write(c, resize_fn, &max_size, 0);
}
