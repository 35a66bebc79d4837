/* record.c: the on-disk records of the cache and the primitives that keep
 * an entry's four parts consistent inside one write transaction.
 *
 * "meta" record, version KW__CACHE_FORMAT, all integers little-endian so a
 * directory moves between hosts:
 *    0  u8   version
 *    1  u8   flags (bit 0: pinned)
 *    2  u8   nfields (<= KW_CACHE_MAX_FIELDS)
 *    3  u8   0
 *    4  u8   XXH3-128 of the blob, canonical form [16]
 *   20  u64  blob size
 *   28  u64  created, ns since the epoch
 *   36  u64  tick of the last use (the "lru" key), ns since the epoch
 *   44  u64  hits
 *   52  u64  compile seconds (IEEE-754 bits)
 *   60  i64  fields[nfields]
 *       then family, arch, entry, nvrtc: each u8 length + bytes, no NUL
 *       then u64 XXH3-64 of everything before it
 * The trailing checksum makes a damaged record read as corrupt instead of
 * as a wrong size or name.
 */
#include "kw_cache.h"

#include <stddef.h>
#include <string.h>
#include <xxhash.h>

#include "internal.h"
#include "kw_bytes.h"
#include "kw_err.h"

#define META_FIXED 60 /* bytes before fields[] */

/* The four strings of a record, in order: offset and array size. */
#define STR(field)                                                         \
    {offsetof(kw_cache_info, field), sizeof(((kw_cache_info *)0)->field)}
static const struct {
    size_t off, cap;
} strs[4] = {STR(family), STR(arch), STR(entry), STR(nvrtc)};
#undef STR

bool kw__cache_info_ok(const kw_cache_info *info)
{
    for (int i = 0; i < 4; i++) {
        const char *s = (const char *)info + strs[i].off;
        if (strnlen(s, strs[i].cap) == strs[i].cap)
            return false;
    }
    return info->nfields <= KW_CACHE_MAX_FIELDS;
}

size_t kw__cache_meta_encode(const kw__cache_meta *m, uint8_t *buf)
{
    const kw_cache_info *in = &m->info;
    uint64_t secs;
    buf[0] = KW__CACHE_FORMAT;
    buf[1] = in->pinned ? 1 : 0;
    buf[2] = (uint8_t)in->nfields;
    buf[3] = 0;
    memcpy(buf + 4, m->sum, 16);
    kw_le64_put(buf + 20, in->size);
    kw_le64_put(buf + 28, m->created_ns);
    kw_le64_put(buf + 36, m->tick);
    kw_le64_put(buf + 44, in->hits);
    memcpy(&secs, &in->compile_seconds, 8);
    kw_le64_put(buf + 52, secs);
    size_t off = META_FIXED;
    for (uint32_t i = 0; i < in->nfields; i++, off += 8)
        kw_le64_put(buf + off, (uint64_t)in->fields[i]);
    for (int i = 0; i < 4; i++) {
        const char *s = (const char *)in + strs[i].off;
        size_t n = strlen(s); /* < cap <= 256, checked by info_ok */
        buf[off++] = (uint8_t)n;
        memcpy(buf + off, s, n);
        off += n;
    }
    kw_le64_put(buf + off, XXH3_64bits(buf, off));
    return off + 8;
}

/* Decodes the four length-prefixed strings at p (n bytes) into info. */
static bool decode_strings(const uint8_t *p, size_t n, kw_cache_info *info)
{
    size_t off = 0;
    for (int i = 0; i < 4; i++) {
        if (off >= n || p[off] >= strs[i].cap || p[off] > n - off - 1)
            return false;
        size_t len = p[off++];
        char *s = (char *)info + strs[i].off;
        memcpy(s, p + off, len);
        s[len] = '\0';
        off += len;
    }
    return off == n;
}

bool kw__cache_meta_decode(const void *data, size_t len, kw__cache_meta *m)
{
    const uint8_t *buf = data;
    if (len < META_FIXED + 4 + 8 || len > KW__CACHE_META_MAX ||
        kw_le64_get(buf + len - 8) != XXH3_64bits(buf, len - 8) ||
        buf[0] != KW__CACHE_FORMAT || buf[2] > KW_CACHE_MAX_FIELDS)
        return false;
    memset(m, 0, sizeof *m);
    kw_cache_info *in = &m->info;
    in->pinned = buf[1] & 1;
    in->nfields = buf[2];
    memcpy(m->sum, buf + 4, 16);
    in->size = kw_le64_get(buf + 20);
    m->created_ns = kw_le64_get(buf + 28);
    m->tick = kw_le64_get(buf + 36);
    in->hits = kw_le64_get(buf + 44);
    uint64_t secs = kw_le64_get(buf + 52);
    memcpy(&in->compile_seconds, &secs, 8);
    size_t off = META_FIXED + 8 * (size_t)in->nfields;
    if (off > len - 8)
        return false;
    for (uint32_t i = 0; i < in->nfields; i++)
        in->fields[i] = (int64_t)kw_le64_get(buf + META_FIXED + 8 * i);
    in->created = m->created_ns / 1000000000u;
    in->last_used = m->tick / 1000000000u;
    return decode_strings(buf + off, len - 8 - off, in);
}

void kw__cache_lru_key(uint64_t tick, const uint8_t *digest, uint8_t *key)
{
    /* big-endian, so LMDB's bytewise key order is time order */
    for (int i = 0; i < 8; i++)
        key[i] = (uint8_t)(tick >> (56 - 8 * i));
    memcpy(key + 8, digest, KW_CACHE_DIGEST_LEN);
}

int kw__cache_stat_get(kw_cache *c, MDB_txn *txn, const char *name,
                       uint64_t *v)
{
    MDB_val k = {strlen(name), (void *)name}, d;
    int rc = mdb_get(txn, c->stats, &k, &d);
    *v = 0;
    if (rc == MDB_NOTFOUND)
        return 0;
    if (rc == 0 && d.mv_size == 8)
        *v = kw_le64_get(d.mv_data);
    return kw__cache_mdb(c, "mdb_get(stats)", rc);
}

int kw__cache_stat_add(kw_cache *c, MDB_txn *txn, const char *name,
                       int64_t delta)
{
    uint64_t v;
    int rc = kw__cache_stat_get(c, txn, name, &v);
    if (rc < 0 || delta == 0)
        return rc;
    /* the magnitude, well defined even for INT64_MIN */
    uint64_t mag = delta < 0 ? 0 - (uint64_t)delta : (uint64_t)delta;
    if (delta < 0)
        v = mag > v ? 0 : v - mag;
    else
        v = UINT64_MAX - v < mag ? UINT64_MAX : v + mag;
    uint8_t buf[8];
    kw_le64_put(buf, v);
    MDB_val k = {strlen(name), (void *)name}, d = {8, buf};
    return kw__cache_mdb(c, "mdb_put(stats)",
                         mdb_put(txn, c->stats, &k, &d, 0));
}

int kw__cache_meta_get(kw_cache *c, MDB_txn *txn, const uint8_t *digest,
                       kw__cache_meta *m)
{
    MDB_val k = {KW_CACHE_DIGEST_LEN, (void *)digest}, d;
    int rc = kw__cache_mdb(c, "mdb_get(meta)", mdb_get(txn, c->meta, &k, &d));
    if (rc < 0)
        return rc;
    return kw__cache_meta_decode(d.mv_data, d.mv_size, m) ? 0 : KW_ECORRUPT;
}

int kw__cache_meta_put(kw_cache *c, MDB_txn *txn, const uint8_t *digest,
                       const kw__cache_meta *m)
{
    uint8_t buf[KW__CACHE_META_MAX];
    MDB_val k = {KW_CACHE_DIGEST_LEN, (void *)digest};
    MDB_val d = {kw__cache_meta_encode(m, buf), buf};
    return kw__cache_mdb(c, "mdb_put(meta)", mdb_put(txn, c->meta, &k, &d, 0));
}

/* Deletes key from dbi; absence is not an error here. */
static int del_key(kw_cache *c, MDB_txn *txn, MDB_dbi dbi, const void *key,
                   size_t klen, const char *op)
{
    MDB_val k = {klen, (void *)key};
    int rc = kw__cache_mdb(c, op, mdb_del(txn, dbi, &k, NULL));
    return rc == KW_ENOTFOUND ? 0 : rc;
}

int kw__cache_drop_txn(kw_cache *c, MDB_txn *txn, const uint8_t *digest,
                       const kw__cache_meta *m, uint64_t *freed)
{
    MDB_val k = {KW_CACHE_DIGEST_LEN, (void *)digest}, d;
    /* the blob's own size, so "bytes" stays right even when m is NULL */
    int rc = kw__cache_mdb(c, "mdb_get(blob)", mdb_get(txn, c->blob, &k, &d));
    uint64_t size = rc == 0 ? d.mv_size : 0;
    if (rc < 0 && rc != KW_ENOTFOUND)
        return rc;
    rc = del_key(c, txn, c->blob, digest, KW_CACHE_DIGEST_LEN, "mdb_del(blob)");
    if (rc == 0)
        rc = del_key(c, txn, c->meta, digest, KW_CACHE_DIGEST_LEN,
                     "mdb_del(meta)");
    if (rc == 0 && m && !m->info.pinned) {
        uint8_t key[KW__CACHE_LRU_KEY];
        kw__cache_lru_key(m->tick, digest, key);
        rc = del_key(c, txn, c->lru, key, sizeof key, "mdb_del(lru)");
    }
    if (rc == 0)
        rc = kw__cache_stat_add(c, txn, "bytes", -(int64_t)size);
    if (freed)
        *freed = size;
    return rc;
}

int kw__cache_max_get(kw_cache *c, MDB_txn *txn, uint64_t *max)
{
    return kw__cache_stat_get(c, txn, "max_size", max);
}

/* What one step of the eviction walk did. */
typedef enum walk_step { STEP_DROPPED_KEY, STEP_EVICTED, STEP_SKIPPED } walk_step;

/* Handles the "lru" key at cur (copied into key): evicts its entry
 * (STEP_EVICTED, *size its cubin bytes), deletes the key alone when it is
 * stale: its entry gone, pinned, or moved to a newer tick
 * (STEP_DROPPED_KEY), or leaves it when the entry is held by a pin set or
 * a guard (STEP_SKIPPED). */
static int walk_one(kw_cache *c, MDB_txn *txn, MDB_cursor *cur,
                    const uint8_t *key, walk_step *step, uint64_t *size)
{
    const uint8_t *digest = key + 8;
    kw__cache_meta m;
    int rc = kw__cache_meta_get(c, txn, digest, &m);
    uint8_t want[KW__CACHE_LRU_KEY];
    *size = 0;
    *step = STEP_DROPPED_KEY;
    if (rc == 0)
        kw__cache_lru_key(m.tick, digest, want);
    if (rc == KW_ENOTFOUND || (rc == 0 && (m.info.pinned ||
                                memcmp(want, key, KW__CACHE_LRU_KEY) != 0)))
        return kw__cache_mdb(c, "mdb_cursor_del(lru)", mdb_cursor_del(cur, 0));
    if (rc < 0 && rc != KW_ECORRUPT)
        return rc;
    bool held;
    int hr = kw__cache_held(c, txn, digest, &held);
    if (hr < 0)
        return hr;
    if (held) {
        *step = STEP_SKIPPED;
        return 0;
    }
    *step = STEP_EVICTED;
    if (rc == KW_ECORRUPT) { /* undecodable: evict it whole, key too */
        rc = kw__cache_drop_txn(c, txn, digest, NULL, size);
        return rc == 0 ? del_key(c, txn, c->lru, key, KW__CACHE_LRU_KEY,
                                 "mdb_del(lru)")
                       : rc;
    }
    return kw__cache_drop_txn(c, txn, digest, &m, size);
}

/* Positions cur at the first "lru" key after the walk's position: the
 * oldest key at first; then the first key >= pos, past pos itself when
 * it was skipped (and so is still there).  Copies the key into pos. */
static int walk_next(kw_cache *c, MDB_cursor *cur, uint8_t *pos, bool *started)
{
    MDB_val k, d;
    int rc;
    for (;;) {
        k = (MDB_val){KW__CACHE_LRU_KEY, pos};
        rc = mdb_cursor_get(cur, &k, &d, *started ? MDB_SET_RANGE : MDB_FIRST);
        if (rc == 0 && *started && k.mv_size == KW__CACHE_LRU_KEY &&
            memcmp(k.mv_data, pos, KW__CACHE_LRU_KEY) == 0)
            rc = mdb_cursor_get(cur, &k, &d, MDB_NEXT);
        if (rc != 0 || k.mv_size == KW__CACHE_LRU_KEY)
            break;
        if ((rc = mdb_cursor_del(cur, 0)) != 0) /* not ours: drop it */
            break;
    }
    if (rc == 0) {
        memcpy(pos, k.mv_data, KW__CACHE_LRU_KEY); /* k dies with deletes */
        *started = true;
    }
    return kw__cache_mdb(c, "mdb_cursor_get(lru)", rc);
}

int kw__cache_evict_txn(kw_cache *c, MDB_txn *txn, uint64_t count,
                        uint64_t bytes, uint64_t *evicted)
{
    MDB_cursor *cur;
    int rc = kw__cache_mdb(c, "mdb_cursor_open(lru)",
                           mdb_cursor_open(txn, c->lru, &cur));
    if (rc < 0)
        return rc;
    uint64_t n = 0, freed = 0;
    uint8_t pos[KW__CACHE_LRU_KEY];
    bool started = false;
    while (rc == 0 && (n < count || freed < bytes)) {
        walk_step step;
        uint64_t size;
        if ((rc = walk_next(c, cur, pos, &started)) == 0)
            rc = walk_one(c, txn, cur, pos, &step, &size);
        if (rc == 0 && step == STEP_EVICTED) {
            n++;
            freed += size;
        }
    }
    mdb_cursor_close(cur);
    if (rc == KW_ENOTFOUND) /* nothing evictable left: the caller decides */
        rc = 0;
    if (rc == 0 && n > 0)
        rc = kw__cache_stat_add(c, txn, "evictions", (int64_t)n);
    if (evicted)
        *evicted = n;
    return rc;
}
