/* read.c: get, borrow, contains and foreach, in read transactions
 * (kw_cache.h).
 *
 * A get copies the blob out of the map, ends its transaction, and only then
 * hashes the copy: what is verified is exactly what the caller receives,
 * and the reader slot is held for one memcpy.  A borrow hashes the map's
 * own bytes, which cannot change while its transaction is held.  A checksum failure removes
 * the entry in a write transaction that checks it again first, so an entry
 * another process has meanwhile replaced with a good one is left alone.
 */
#include "kw_cache.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xxh_x86dispatch.h> /* XXH3 with AVX2/AVX-512 where the CPU has them */
#endif

#include "internal.h"
#include "kw_err.h"

/* True when len bytes at data hash to sum (canonical XXH3-128). */
static bool sum_ok(const uint8_t sum[16], const void *data, size_t len)
{
    XXH128_canonical_t got;
    XXH128_canonicalFromHash(&got, XXH3_128bits(data, len));
    return memcmp(got.digest, sum, 16) == 0;
}

/* Removes digest's entry if it is still corrupt: metadata that does not
 * decode, a missing blob, or a blob whose size or checksum is wrong. */
int kw__cache_purge_fn(kw_cache *c, MDB_txn *txn, void *arg)
{
    const uint8_t *digest = arg;
    kw__cache_meta m;
    int rc = kw__cache_meta_get(c, txn, digest, &m);
    if (rc == KW_ENOTFOUND)
        return 0; /* someone else removed it */
    if (rc == 0) {
        MDB_val k = {KW_CACHE_DIGEST_LEN, (void *)digest}, d;
        rc = kw__cache_mdb(c, "mdb_get(blob)",
                           mdb_get(txn, c->blob, &k, &d));
        if (rc < 0 && rc != KW_ENOTFOUND)
            return rc;
        if (rc == 0 && d.mv_size == m.info.size &&
            sum_ok(m.sum, d.mv_data, d.mv_size))
            return 0; /* replaced by a good copy meanwhile */
    }
    rc = kw__cache_drop_txn(c, txn, digest, rc == KW_ECORRUPT ? NULL : &m,
                            NULL);
    if (rc == 0)
        rc = kw__cache_stat_add(c, txn, "corrupt", 1);
    return rc;
}

/* Reports a corrupt entry: removes it (a writable handle), queues it for
 * the next flush (defer_writes) or leaves it (read-only), and returns
 * KW_ECORRUPT, or the failure of the removal. */
static int corrupt(kw_cache *c, const uint8_t *digest)
{
    if (c->read_only)
        return KW_ECORRUPT;
    if (c->defer_writes) {
        kw__cache_queue_corrupt(c, digest);
        kw__cache_set_error(c, "get: entry failed its integrity check");
        return KW_ECORRUPT;
    }
    int rc = kw__cache_write(c, kw__cache_purge_fn, (void *)digest, 0);
    kw__cache_set_error(c, "get: entry failed its integrity check");
    return rc < 0 ? rc : KW_ECORRUPT;
}

/* Completes a hit's metadata: pin sets and hits counted in memory. */
static int finish_info(kw_cache *c, MDB_txn *txn, const uint8_t *digest,
                       kw_cache_info *info)
{
    bool in_set;
    int rc = kw__cache_in_sets(c, txn, digest, &in_set, &info->pin_sets);
    info->pinned = info->pinned || in_set;
    kw__cache_overlay_hits(c, digest, info);
    return rc;
}

/* Finds digest's metadata (*m) and blob (*d, valid for txn's life).
 * KW_ENOTFOUND; KW_ECORRUPT for metadata that does not decode or has no
 * blob of its size; KW_ECACHE. */
static int lookup(kw_cache *c, MDB_txn *txn, const uint8_t *digest,
                  kw__cache_meta *m, MDB_val *d)
{
    int rc = kw__cache_meta_get(c, txn, digest, m);
    if (rc < 0)
        return rc;
    MDB_val k = {KW_CACHE_DIGEST_LEN, (void *)digest};
    rc = kw__cache_mdb(c, "mdb_get(blob)", mdb_get(txn, c->blob, &k, d));
    if (rc == KW_ENOTFOUND || (rc == 0 && d->mv_size != m->info.size))
        return KW_ECORRUPT; /* metadata without its blob, or a torn size */
    return rc;
}

/* Finds digest in txn: from its hint when the hint is of txn's snapshot
 * (only size and sum in *m unless with_meta), else by lookup, which then
 * refreshes the hint.  m->info includes the pin sets; *d is the blob in
 * the map, valid for txn's life.  Codes as lookup(). */
static int find(kw_cache *c, MDB_txn *txn, const uint8_t *digest,
                kw__cache_meta *m, MDB_val *d, bool with_meta)
{
    uint64_t id = (uint64_t)mdb_txn_id(txn);
    kw__cache_hint h;
    if (kw__cache_hint_get(c, digest, id, &h, with_meta)) {
        *m = h.m;
        *d = (MDB_val){h.m.info.size, (void *)h.data};
        return 0;
    }
    bool in_set;
    int rc = lookup(c, txn, digest, m, d);
    if (rc == 0)
        rc = kw__cache_in_sets(c, txn, digest, &in_set, &m->info.pin_sets);
    if (rc == 0) {
        m->info.pinned = m->info.pinned || in_set;
        kw__cache_hint_put(c, digest, id, d->mv_data, m);
    }
    return rc;
}

/* Where a fetch puts the blob: into buf (cap bytes), or, when buf is NULL,
 * into a new allocation stored in *out. */
typedef struct fetch_dst {
    void *buf;
    size_t cap;
    void **out;
} fetch_dst;

/* Copies len bytes from src to dst's place.  0 or KW_ENOSPC, KW_ENOMEM. */
static int copy_out(const fetch_dst *dst, const void *src, size_t len)
{
    if (dst->buf && len > dst->cap)
        return KW_ENOSPC;
    void *to = dst->buf ? dst->buf : malloc(len);
    if (!to)
        return KW_ENOMEM;
    memcpy(to, src, len);
    if (!dst->buf)
        *dst->out = to;
    return 0;
}

/* Frees a failed fetch's allocation. */
static void drop_copy(const fetch_dst *dst)
{
    if (!dst->buf) {
        free(*dst->out);
        *dst->out = NULL;
    }
}

/* The fast path of a get: from the hint of the last commit, copied and
 * checked with no transaction (hint.c says why that is safe).  0 with the
 * copy in dst, 1 when the caller must take the lookup path, or
 * KW_ENOMEM. */
static int fetch_hinted(kw_cache *c, const uint8_t *digest,
                        const fetch_dst *dst, size_t *len, kw__cache_meta *m,
                        bool with_meta)
{
    uint64_t id = kw__cache_last_txnid(c);
    kw__cache_hint h;
    if (!kw__cache_hint_get(c, digest, id, &h, with_meta) ||
        (dst->buf && h.m.info.size > dst->cap))
        return 1; /* the lookup path reports KW_ENOSPC */
    int rc = copy_out(dst, h.data, h.m.info.size);
    if (rc < 0)
        return rc;
    /* no commit around the copy: the entry was there, its pages intact */
    if (kw__cache_last_txnid(c) != id ||
        !sum_ok(h.m.sum, dst->buf ? dst->buf : *dst->out, h.m.info.size)) {
        drop_copy(dst);
        return 1;
    }
    *len = h.m.info.size;
    *m = h.m;
    return 0;
}

/* The lookup path of a get: a pooled read transaction, find, copy; the
 * copy is checked after the transaction ends.  Codes as kw_cache_get. */
static int fetch_txn(kw_cache *c, const uint8_t *digest, const fetch_dst *dst,
                     size_t *len, kw__cache_meta *m, bool with_meta)
{
    MDB_txn *txn;
    MDB_val d;
    int rc = kw__cache_read_begin(c, &txn);
    if (rc < 0)
        return rc;
    rc = find(c, txn, digest, m, &d, with_meta);
    if (rc == 0) {
        *len = d.mv_size;
        rc = copy_out(dst, d.mv_data, d.mv_size); /* d dies with txn */
    }
    kw__cache_read_end(c, txn);
    if (rc == 0 && !sum_ok(m->sum, dst->buf ? dst->buf : *dst->out, *len)) {
        drop_copy(dst);
        rc = KW_ECORRUPT;
    }
    return rc;
}

/* kw_cache_get and kw_cache_get_into: fetch, verify, record. */
static int get(kw_cache *c, const uint8_t *digest, const fetch_dst *dst,
               size_t *len, kw_cache_info *info)
{
    kw__cache_meta m;
    int rc = fetch_hinted(c, digest, dst, len, &m, info != NULL);
    if (rc == 1)
        rc = fetch_txn(c, digest, dst, len, &m, info != NULL);
    if (rc == KW_ECORRUPT)
        return corrupt(c, digest);
    if (rc == KW_ENOTFOUND)
        kw__cache_record_miss(c);
    if (rc < 0)
        return rc;
    if (info) { /* the hits before this one, as the flushed count is */
        kw__cache_overlay_hits(c, digest, &m.info);
        *info = m.info;
    }
    kw__cache_record_hit(c, digest);
    return 0;
}

int kw_cache_get(kw_cache *c, const uint8_t digest[KW_CACHE_DIGEST_LEN],
                 void **blob, size_t *len, kw_cache_info *info)
{
    if (blob)
        *blob = NULL;
    if (!c || !digest || !blob || !len)
        return KW_EINVAL;
    fetch_dst dst = {NULL, 0, blob};
    return get(c, digest, &dst, len, info);
}

int kw_cache_get_into(kw_cache *c, const uint8_t digest[KW_CACHE_DIGEST_LEN],
                      void *buf, size_t cap, size_t *len, kw_cache_info *info)
{
    if (!c || !digest || !buf || !len)
        return KW_EINVAL;
    fetch_dst dst = {buf, cap, NULL};
    return get(c, digest, &dst, len, info);
}

bool kw_cache_contains(kw_cache *c, const uint8_t digest[KW_CACHE_DIGEST_LEN])
{
    MDB_txn *txn;
    if (!c || !digest || kw__cache_read_begin(c, &txn) < 0)
        return false;
    MDB_val k = {KW_CACHE_DIGEST_LEN, (void *)digest}, d;
    int rc = kw__cache_mdb(c, "mdb_get(meta)", mdb_get(txn, c->meta, &k, &d));
    kw__cache_read_end(c, txn);
    return rc == 0;
}

/* What kw_cache_foreach_from's walk takes. */
typedef struct each_args {
    const uint8_t *from;
    kw_cache_each_fn fn;
    void *arg;
} each_args;

/* Walks "meta" with cur (from a->from, or the first), calling a->fn for
 * each entry that decodes (a kw__cache_walk_fn). */
static int each(kw_cache *c, MDB_txn *txn, MDB_cursor *cur, void *args)
{
    const each_args *a = args;
    const uint8_t *from = a->from;
    kw_cache_each_fn fn = a->fn;
    void *arg = a->arg;
    MDB_val k = {KW_CACHE_DIGEST_LEN, (void *)from}, d;
    MDB_cursor_op op = from != NULL ? MDB_SET_RANGE : MDB_FIRST;
    int rc;
    while ((rc = mdb_cursor_get(cur, &k, &d, op)) == 0) {
        op = MDB_NEXT;
        kw__cache_meta m;
        if (k.mv_size != KW_CACHE_DIGEST_LEN ||
            !kw__cache_meta_decode(d.mv_data, d.mv_size, &m))
            continue;
        uint8_t digest[KW_CACHE_DIGEST_LEN];
        memcpy(digest, k.mv_data, sizeof digest);
        if ((rc = finish_info(c, txn, digest, &m.info)) < 0)
            return rc;
        int stop = fn(digest, &m.info, arg);
        if (stop)
            return stop;
    }
    rc = kw__cache_mdb(c, "mdb_cursor_get(meta)", rc);
    return rc == KW_ENOTFOUND ? 0 : rc;
}

int kw_cache_foreach(kw_cache *c, kw_cache_each_fn fn, void *arg)
{
    return kw_cache_foreach_from(c, NULL, fn, arg);
}

int kw_cache_foreach_from(kw_cache *c, const uint8_t *from,
                          kw_cache_each_fn fn, void *arg)
{
    if (!c || !fn)
        return KW_EINVAL;
    each_args a = {from, fn, arg};
    return kw__cache_read_walk(c, c->meta, "meta", each, &a);
}

int kw_cache_borrow(kw_cache *c, const uint8_t digest[KW_CACHE_DIGEST_LEN],
                    kw_cache_view *v, kw_cache_info *info)
{
    if (v)
        memset(v, 0, sizeof *v);
    if (!c || !digest || !v)
        return KW_EINVAL;
    if (c->nolock) { /* copied, then verified: the map may change under us */
        void *blob = NULL;
        size_t len = 0;
        int rc = kw_cache_get(c, digest, &blob, &len, info);
        if (rc == 0)
            *v = (kw_cache_view){blob, len, c, NULL, blob};
        return rc;
    }
    MDB_txn *txn;
    kw__cache_meta m;
    MDB_val d;
    int rc = kw__cache_read_begin(c, &txn);
    if (rc < 0)
        return rc;
    rc = find(c, txn, digest, &m, &d, info != NULL);
    /* verified in place: these are the bytes the caller will read, and
     * committed pages never change while the transaction lives */
    if (rc == 0 && !sum_ok(m.sum, d.mv_data, d.mv_size))
        rc = KW_ECORRUPT;
    if (rc < 0) {
        kw__cache_read_end(c, txn);
        if (rc == KW_ENOTFOUND)
            kw__cache_record_miss(c);
        return rc == KW_ECORRUPT ? corrupt(c, digest) : rc;
    }
    if (info) {
        kw__cache_overlay_hits(c, digest, &m.info);
        *info = m.info;
    }
    kw__cache_record_hit(c, digest);
    *v = (kw_cache_view){d.mv_data, d.mv_size, c, txn, NULL};
    return 0;
}

void kw_cache_release(kw_cache_view *v)
{
    if (!v || (!v->_txn && !v->_own))
        return;
    if (v->_txn)
        kw__cache_read_end(v->_c, v->_txn);
    free(v->_own);
    memset(v, 0, sizeof *v);
}
