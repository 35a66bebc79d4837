/* flush.c: hits and counters recorded in memory, and their flush
 * (kw_cache.h, internal.h).
 *
 * A get must not write: a write transaction costs an fsync and serializes
 * with every put.  So a hit goes into `pend`, a small open-addressing
 * table keyed by digest (the digest is a BLAKE2b output, so its first bytes
 * are already a good hash), and a flush applies the whole table in one
 * write transaction: hits and last use in "meta", the entry's key moved to
 * its new tick in "lru", counters added to "stats".
 *
 * The counters (hits, misses, compiles, compile failures) are also
 * written by every put (kw__cache_write_counted), in the put's own
 * transaction, so they are as old as the last commit, not the last flush.
 *
 * A flush swaps `pend` with the empty `spare` under pend_mu and then writes
 * `spare` with no lock but flush_mu held, so gets keep recording while the
 * transaction commits.  If it fails, what it had not written of `spare` is
 * merged back into `pend`.
 *
 * The table is written in slices of at most KW__CACHE_FLUSH_HITS hits, one
 * transaction each.  LMDB keeps every page a write transaction dirtied on
 * its own free list (malloc'd, never returned before the environment
 * closes), so the largest transaction sets the memory it keeps, and with
 * the whole table in one it grew with the cache: an idle kwarmd's heap
 * went from 6.7 to 19.9 MB over six 5,000-key warmups (3.3 MB of LMDB
 * pages after the first), and levels at 12.5 MB in slices of 256.  The
 * slots are in digest order to the table's first bits, so a slice
 * touches a slice of "meta".
 */
#include "kw_cache.h"

#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "kw_err.h"

int kw__cache_pending_init(kw_cache *c)
{
    c->pend.slots = calloc(KW__CACHE_PENDING_CAP, sizeof *c->pend.slots);
    c->spare.slots = calloc(KW__CACHE_PENDING_CAP, sizeof *c->spare.slots);
    return c->pend.slots && c->spare.slots ? 0 : KW_ENOMEM;
}

void kw__cache_pending_destroy(kw_cache *c)
{
    free(c->pend.slots);
    free(c->spare.slots);
    c->pend.slots = c->spare.slots = NULL;
}

/* The slot of digest in p: its own, or the empty one where it goes; NULL
 * when the table is full.  Linear probing from the digest's first bytes. */
static kw__cache_hit *slot_of(kw__cache_pending *p, const uint8_t *digest)
{
    size_t h;
    memcpy(&h, digest, sizeof h);
    for (size_t i = 0; i < KW__CACHE_PENDING_CAP; i++) {
        kw__cache_hit *s = &p->slots[(h + i) & (KW__CACHE_PENDING_CAP - 1)];
        if (!s->used || memcmp(s->digest, digest, KW_CACHE_DIGEST_LEN) == 0)
            return s;
    }
    return NULL;
}

/* Adds `hits` hits at `tick` on digest to p.  Caller holds pend_mu (or
 * owns p).  False when the table is too full to take a new digest: the
 * recency of that hit is then lost, its count is not. */
static bool add_hit_locked(kw__cache_pending *p, const uint8_t *digest,
                           uint32_t hits, uint64_t tick)
{
    /* keep the table at most 3/4 full so probes stay short */
    kw__cache_hit *s = slot_of(p, digest);
    if (!s || (!s->used && p->n >= KW__CACHE_PENDING_CAP * 3 / 4))
        return false;
    if (!s->used) {
        memcpy(s->digest, digest, KW_CACHE_DIGEST_LEN);
        s->used = true;
        s->hits = 0;
        s->tick = 0;
        p->n++;
    }
    s->hits = UINT32_MAX - s->hits < hits ? UINT32_MAX : s->hits + hits;
    if (tick > s->tick)
        s->tick = tick;
    return true;
}

static int flush_locked(kw_cache *c);

void kw__cache_record_hit(kw_cache *c, const uint8_t *digest)
{
    uint64_t tick = kw__cache_tick_coarse(c);
    pthread_mutex_lock(&c->pend_mu);
    c->pend.cnt.hits++;
    add_hit_locked(&c->pend, digest, 1, tick);
    bool full = c->pend.n >= KW__CACHE_PENDING_MAX;
    pthread_mutex_unlock(&c->pend_mu);
    /* A read-only handle keeps its hits in memory; a defer_writes one
     * leaves writing to its flushing thread.
     * If another thread is flushing, it will empty the table: do not wait
     * for it.  A failed flush keeps the hits for the next one, and the
     * error text for kw_cache_last_error(); the get itself succeeded. */
    if (full && !c->read_only && !c->defer_writes &&
        pthread_mutex_trylock(&c->flush_mu) == 0) {
        flush_locked(c);
        pthread_mutex_unlock(&c->flush_mu);
    }
}

void kw__cache_record_miss(kw_cache *c)
{
    pthread_mutex_lock(&c->pend_mu);
    c->pend.cnt.misses++;
    pthread_mutex_unlock(&c->pend_mu);
}

/* Applies one recorded hit to its entry, if the entry is still there. */
static int apply_hit(kw_cache *c, MDB_txn *txn, const kw__cache_hit *h)
{
    kw__cache_meta m;
    int rc = kw__cache_meta_get(c, txn, h->digest, &m);
    if (rc == KW_ENOTFOUND || rc == KW_ECORRUPT)
        return 0; /* evicted or removed since; a get reports corruption */
    if (rc < 0)
        return rc;
    m.info.hits += h->hits;
    if (h->tick > m.tick) {
        uint8_t key[KW__CACHE_LRU_KEY];
        if (!m.info.pinned) { /* pinned entries are not in "lru" */
            kw__cache_lru_key(m.tick, h->digest, key);
            MDB_val k = {sizeof key, key}, empty = {0, NULL};
            rc = kw__cache_mdb(c, "mdb_del(lru)",
                               mdb_del(txn, c->lru, &k, NULL));
            kw__cache_lru_key(h->tick, h->digest, key);
            if (rc == 0 || rc == KW_ENOTFOUND)
                rc = kw__cache_mdb(c, "mdb_put(lru)",
                                   mdb_put(txn, c->lru, &k, &empty, 0));
        }
        m.tick = h->tick;
    }
    if (rc == 0)
        rc = kw__cache_meta_put(c, txn, h->digest, &m);
    return rc;
}

/* One transaction's slice of c->spare: slots [from, to), and the
 * counters when it is the last slice. */
typedef struct flush_slice {
    size_t from, to;
} flush_slice;

/* Adds n to the counters of "stats" in txn. */
static int counts_write(kw_cache *c, MDB_txn *txn, const kw__cache_counts *n)
{
    static const char *const names[4] = {"hits", "misses", "compiles",
                                         "compile_failures"};
    const uint64_t add[4] = {n->hits, n->misses, n->compiles,
                             n->compile_failures};
    int rc = 0;
    for (int i = 0; i < 4 && rc == 0; i++) {
        /* a counter past INT64_MAX between two writes cannot happen */
        rc = kw__cache_stat_add(c, txn, names[i], (int64_t)add[i]);
    }
    return rc;
}

static void counts_merge(kw__cache_counts *to, const kw__cache_counts *from)
{
    to->hits += from->hits;
    to->misses += from->misses;
    to->compiles += from->compiles;
    to->compile_failures += from->compile_failures;
}

static bool counts_zero(const kw__cache_counts *n)
{
    return !n->hits && !n->misses && !n->compiles && !n->compile_failures;
}

/* Writes a slice of c->spare (hits, and counters with the last) in txn. */
static int flush_fn(kw_cache *c, MDB_txn *txn, void *arg)
{
    const flush_slice *sl = arg;
    kw__cache_pending *p = &c->spare;
    int rc = 0;
    for (size_t i = sl->from; i < sl->to && rc == 0; i++) {
        if (p->slots[i].used)
            rc = apply_hit(c, txn, &p->slots[i]);
    }
    if (sl->to < KW__CACHE_PENDING_CAP || rc < 0)
        return rc;
    return counts_write(c, txn, &p->cnt);
}

/* The end of the slice from `from`: past KW__CACHE_FLUSH_HITS used slots,
 * or the table's end. */
static size_t slice_end(const kw__cache_pending *p, size_t from)
{
    size_t n = 0, i = from;
    for (; i < KW__CACHE_PENDING_CAP && n < KW__CACHE_FLUSH_HITS; i++)
        n += p->slots[i].used;
    return i;
}

/* Empties p, keeping its slot array. */
static void clear(kw__cache_pending *p)
{
    memset(p->slots, 0, KW__CACHE_PENDING_CAP * sizeof *p->slots);
    p->n = 0;
    p->cnt = (kw__cache_counts){0};
}

/* Puts what a failed flush took (c->spare) and did not write, slots from
 * `from` and the counters, back into c->pend. */
static void merge_back(kw_cache *c, size_t from)
{
    kw__cache_pending *s = &c->spare;
    pthread_mutex_lock(&c->pend_mu);
    for (size_t i = from; i < KW__CACHE_PENDING_CAP; i++) {
        if (s->slots[i].used)
            add_hit_locked(&c->pend, s->slots[i].digest, s->slots[i].hits,
                           s->slots[i].tick);
    }
    counts_merge(&c->pend.cnt, &s->cnt);
    pthread_mutex_unlock(&c->pend_mu);
}

/* The flush proper.  Caller holds flush_mu, so c->spare is empty and ours. */
static int flush_locked(kw_cache *c)
{
    pthread_mutex_lock(&c->pend_mu);
    kw__cache_pending taken = c->pend;
    c->pend = c->spare;
    c->spare = taken;
    pthread_mutex_unlock(&c->pend_mu);
    kw__cache_pending *p = &c->spare;
    if (p->n == 0 && counts_zero(&p->cnt))
        return 0;
    flush_slice sl = {0, 0};
    int rc = 0;
    while (rc == 0 && sl.to < KW__CACHE_PENDING_CAP) {
        sl.to = slice_end(p, sl.from);
        if ((rc = kw__cache_write(c, flush_fn, &sl, 0)) == 0)
            sl.from = sl.to;
    }
    if (rc < 0)
        merge_back(c, sl.from);
    clear(p);
    return rc == KW_ENOSPC ? KW_ECACHE : rc;
}

void kw__cache_overlay_hits(kw_cache *c, const uint8_t *digest,
                            kw_cache_info *info)
{
    if (!c->read_only)
        return;
    pthread_mutex_lock(&c->pend_mu);
    const kw__cache_hit *s = slot_of(&c->pend, digest);
    if (s && s->used) {
        info->hits += s->hits;
        uint64_t secs = s->tick / 1000000000u;
        if (secs > info->last_used)
            info->last_used = secs;
    }
    pthread_mutex_unlock(&c->pend_mu);
}

void kw__cache_queue_corrupt(kw_cache *c, const uint8_t *digest)
{
    pthread_mutex_lock(&c->pend_mu);
    bool there = false;
    for (size_t i = 0; i < c->ncorrupt && !there; i++)
        there = memcmp(c->corrupt_q[i], digest, KW_CACHE_DIGEST_LEN) == 0;
    if (!there && c->ncorrupt < KW__CACHE_CORRUPT_MAX)
        memcpy(c->corrupt_q[c->ncorrupt++], digest, KW_CACHE_DIGEST_LEN);
    pthread_mutex_unlock(&c->pend_mu);
}

/* Purges the corrupt digests queued by defer_writes gets, each in a
 * transaction of its own (kw__cache_purge_fn checks it again).  Caller
 * holds flush_mu.  A failed purge is queued again. */
static int purge_queued_locked(kw_cache *c)
{
    uint8_t q[KW__CACHE_CORRUPT_MAX][KW_CACHE_DIGEST_LEN];
    pthread_mutex_lock(&c->pend_mu);
    size_t n = c->ncorrupt;
    memcpy(q, c->corrupt_q, n * KW_CACHE_DIGEST_LEN);
    c->ncorrupt = 0;
    pthread_mutex_unlock(&c->pend_mu);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        int r = kw__cache_write(c, kw__cache_purge_fn, q[i], 0);
        if (r < 0) {
            kw__cache_queue_corrupt(c, q[i]);
            rc = KW_ECACHE;
        }
    }
    return rc;
}

int kw_cache_flush(kw_cache *c)
{
    if (!c)
        return KW_EINVAL;
    if (c->read_only) /* its counts stay in memory, never written */
        return 0;
    pthread_mutex_lock(&c->flush_mu);
    int rc = flush_locked(c);
    int prc = purge_queued_locked(c);
    pthread_mutex_unlock(&c->flush_mu);
    return rc < 0 ? rc : prc;
}

/* One write of kw__cache_write_counted(): the caller's step, then the
 * counters it carries. */
typedef struct counted_req {
    kw__cache_txn_fn fn;
    void *arg;
    kw__cache_counts cnt;
} counted_req;

static int counted_fn(kw_cache *c, MDB_txn *txn, void *arg)
{
    counted_req *r = arg;
    int rc = r->fn(c, txn, r->arg);
    return rc < 0 ? rc : counts_write(c, txn, &r->cnt);
}

int kw__cache_write_counted(kw_cache *c, kw__cache_txn_fn fn, void *arg,
                            uint64_t need)
{
    counted_req r = {fn, arg, {0}};
    pthread_mutex_lock(&c->flush_mu);
    pthread_mutex_lock(&c->pend_mu);
    r.cnt = c->pend.cnt;
    c->pend.cnt = (kw__cache_counts){0};
    pthread_mutex_unlock(&c->pend_mu);
    int rc = kw__cache_write(c, counted_fn, &r, need);
    if (rc < 0) {
        pthread_mutex_lock(&c->pend_mu);
        counts_merge(&c->pend.cnt, &r.cnt);
        pthread_mutex_unlock(&c->pend_mu);
    }
    pthread_mutex_unlock(&c->flush_mu);
    return rc;
}
