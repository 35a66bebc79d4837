/* protect.c: the plan a warm checks before it writes, and the totals of
 * pinned entries (kw_cache.h), over entries pinned by a flag, a set or a
 * guard (held.c).
 */
#include "kw_cache.h"

#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "kw_err.h"

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

/* The plan being built, beside the set it is for, held as the sorted
 * 64-bit hashes of its digests (kw__cache_hash_set): 8 bytes a digest,
 * where a sorted copy of the digests took 32 (3.8 MB, not 15.4, for a
 * 480,000-key warmup) beside the caller's array, which plan_each makes
 * unneeded. */
typedef struct plan_walk {
    const uint64_t *h;
    size_t nh;
    kw_cache_plan *plan;
} plan_walk;

static int plan_entry(kw_cache *c, const uint8_t *digest,
                      const kw__cache_meta *m, bool pinned, void *arg)
{
    plan_walk *w = arg;
    if (kw__cache_hash_set_has(w->h, w->nh, digest)) {
        w->plan->present++;
        w->plan->present_bytes += m->info.size;
    } else if (pinned || kw__cache_protected(c, digest)) {
        w->plan->held_bytes += m->info.size;
    }
    return 0;
}

int kw_cache_plan_each(kw_cache *c, size_t n, kw_cache_digest_fn next,
                       void *arg, kw_cache_plan *plan)
{
    if (!c || !plan || (!next && n > 0))
        return KW_EINVAL;
    memset(plan, 0, sizeof *plan);
    uint64_t *h;
    plan_walk w = {.plan = plan};
    if (kw__cache_hash_set(n, next, arg, &h, &w.nh) < 0)
        return KW_ENOMEM;
    w.h = h;
    MDB_txn *txn;
    int rc = kw__cache_read_begin(c, &txn);
    if (rc == 0) {
        rc = kw__cache_max_get(c, txn, &plan->max_size);
        if (rc == 0)
            rc = walk_entries(c, txn, plan_entry, &w);
        kw__cache_read_end(c, txn);
    }
    free(h);
    uint64_t used = plan->held_bytes + plan->present_bytes;
    plan->available = used < plan->max_size ? plan->max_size - used : 0;
    return rc;
}

int kw_cache_plan_get(kw_cache *c,
                      const uint8_t (*digests)[KW_CACHE_DIGEST_LEN], size_t n,
                      kw_cache_plan *plan)
{
    if (!digests && n > 0)
        return KW_EINVAL;
    const uint8_t (*cur)[KW_CACHE_DIGEST_LEN] = digests;
    return kw_cache_plan_each(c, n, kw__cache_next_of_array, &cur, plan);
}
