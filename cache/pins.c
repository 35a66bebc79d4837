/* pins.c: named pin sets stored in the cache (kw_cache.h); held.c
 * answers whether an entry is in one.
 *
 * "pins" record of a set, little-endian:
 *    0  u8   version (1)
 *    1  u8   0 [7]
 *    8  u64  created, ns since the epoch
 *   16  u64  n
 *   24  u8   digests[n][32], sorted, distinct
 * "pinidx" holds digest || name for each digest of each set, so "is this
 * digest in a set" is one cursor seek, done by eviction for every entry
 * it considers.
 */
#include "kw_cache.h"

#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "kw_bytes.h"
#include "kw_err.h"

#define PIN_VERSION 1
#define PIN_HEAD 24
#define IDX_KEY_MAX (KW_CACHE_DIGEST_LEN + KW_CACHE_MAX_PIN_NAME)

static int cmp_digest(const void *a, const void *b)
{
    return memcmp(a, b, KW_CACHE_DIGEST_LEN);
}

/* A sorted, duplicate-free copy of n digests in *out (free it); *nout its
 * length.  0 or KW_ENOMEM. */
static int sorted_copy(const uint8_t (*d)[KW_CACHE_DIGEST_LEN], size_t n,
                       uint8_t (**out)[KW_CACHE_DIGEST_LEN], size_t *nout)
{
    uint8_t(*s)[KW_CACHE_DIGEST_LEN] = malloc(n ? n * sizeof *s : 1);
    if (!s)
        return KW_ENOMEM;
    if (n)
        memcpy(s, d, n * sizeof *s);
    qsort(s, n, sizeof *s, cmp_digest);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (k == 0 || memcmp(s[k - 1], s[i], sizeof *s) != 0)
            memmove(s[k++], s[i], sizeof *s);
    *out = s;
    *nout = k;
    return 0;
}

bool kw_cache_pin_name_valid(const char *name)
{
    if (!name)
        return false;
    size_t n = strnlen(name, KW_CACHE_MAX_PIN_NAME + 1);
    if (n == 0 || n > KW_CACHE_MAX_PIN_NAME)
        return false;
    for (size_t i = 0; i < n; i++) {
        char ch = name[i];
        bool alnum = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                     (ch >= '0' && ch <= '9');
        if (!alnum && !strchr("._:@+-", ch))
            return false;
    }
    return true;
}

/* Checks a "pins" record: *n its digests, *created its time in ns. */
static bool pin_decode(const MDB_val *d, uint64_t *n, uint64_t *created)
{
    const uint8_t *p = d->mv_data;
    if (d->mv_size < PIN_HEAD || p[0] != PIN_VERSION)
        return false;
    *created = kw_le64_get(p + 8);
    *n = kw_le64_get(p + 16);
    return *n <= KW_CACHE_MAX_PIN_DIGESTS &&
           d->mv_size == PIN_HEAD + *n * KW_CACHE_DIGEST_LEN;
}

/* --- writing sets --- */

/* One pin_set or unpin_set, as its write transaction sees it. */
typedef struct pin_req {
    const char *name;
    const uint8_t (*d)[KW_CACHE_DIGEST_LEN]; /* NULL: unpin */
    size_t n;
    uint64_t created_ns;
} pin_req;

/* Puts (or deletes) the "pinidx" keys of name for n digests. */
static int index_keys(kw_cache *c, MDB_txn *txn, const char *name,
                      const uint8_t *d, size_t n, bool add)
{
    size_t nl = strlen(name);
    uint8_t key[IDX_KEY_MAX];
    memcpy(key + KW_CACHE_DIGEST_LEN, name, nl);
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        memcpy(key, d + i * KW_CACHE_DIGEST_LEN, KW_CACHE_DIGEST_LEN);
        MDB_val k = {KW_CACHE_DIGEST_LEN + nl, key}, empty = {0, NULL};
        rc = add ? mdb_put(txn, c->pinidx, &k, &empty, 0)
                 : mdb_del(txn, c->pinidx, &k, NULL);
        if (rc == MDB_NOTFOUND)
            rc = 0;
    }
    return kw__cache_mdb(c, add ? "mdb_put(pinidx)" : "mdb_del(pinidx)", rc);
}

/* Removes the set r->name, if any (KW_ENOTFOUND when none), then stores
 * the new one when r->d is set. */
static int pin_fn(kw_cache *c, MDB_txn *txn, void *arg)
{
    const pin_req *r = arg;
    MDB_val k = {strlen(r->name), (void *)r->name}, d;
    int rc = kw__cache_mdb(c, "mdb_get(pins)", mdb_get(txn, c->pins, &k, &d));
    uint64_t n = 0, created;
    uint8_t *old = NULL;
    /* a damaged record is replaced; its index keys may then linger */
    if (rc == 0 && pin_decode(&d, &n, &created) && n > 0) {
        /* copied: d dies with the first update of this transaction */
        if (!(old = malloc(n * KW_CACHE_DIGEST_LEN)))
            return KW_ENOMEM;
        memcpy(old, (const uint8_t *)d.mv_data + PIN_HEAD,
               n * KW_CACHE_DIGEST_LEN);
    }
    if (rc == 0)
        rc = kw__cache_mdb(c, "mdb_del(pins)", mdb_del(txn, c->pins, &k, NULL));
    if (rc == 0)
        rc = index_keys(c, txn, r->name, old, old ? n : 0, false);
    free(old);
    if (!r->d || (rc < 0 && rc != KW_ENOTFOUND))
        return rc;
    d.mv_size = PIN_HEAD + r->n * KW_CACHE_DIGEST_LEN;
    rc = kw__cache_mdb(c, "mdb_put(pins)",
                       mdb_put(txn, c->pins, &k, &d, MDB_RESERVE));
    if (rc < 0)
        return rc;
    uint8_t *p = d.mv_data;
    memset(p, 0, PIN_HEAD);
    p[0] = PIN_VERSION;
    kw_le64_put(p + 8, r->created_ns);
    kw_le64_put(p + 16, r->n);
    memcpy(p + PIN_HEAD, r->d, r->n * KW_CACHE_DIGEST_LEN);
    return index_keys(c, txn, r->name, (const uint8_t *)r->d, r->n, true);
}

int kw_cache_pin_set(kw_cache *c, const char *name,
                     const uint8_t (*digests)[KW_CACHE_DIGEST_LEN], size_t n)
{
    if (!c || !kw_cache_pin_name_valid(name) || !digests || n == 0 ||
        n > KW_CACHE_MAX_PIN_DIGESTS)
        return KW_EINVAL;
    if (c->read_only)
        return kw__cache_refuse_ro(c);
    pin_req r = {.name = name, .created_ns = kw__cache_tick(c)};
    uint8_t(*s)[KW_CACHE_DIGEST_LEN];
    int rc = sorted_copy(digests, n, &s, &r.n);
    if (rc < 0)
        return rc;
    r.d = (const uint8_t(*)[KW_CACHE_DIGEST_LEN])s;
    rc = kw__cache_write(c, pin_fn, &r, 0);
    free(s);
    return rc;
}

int kw_cache_unpin_set(kw_cache *c, const char *name)
{
    if (!c || !kw_cache_pin_name_valid(name))
        return KW_EINVAL;
    if (c->read_only)
        return kw__cache_refuse_ro(c);
    pin_req r = {.name = name};
    return kw__cache_write(c, pin_fn, &r, 0);
}

/* --- reading sets --- */

/* Fills p from the record of set name (k) and calls fn. */
static int report_set(kw_cache *c, MDB_txn *txn, const MDB_val *k,
                      const MDB_val *d, kw_cache_pin_fn fn, void *arg)
{
    kw_cache_pin_info p;
    memset(&p, 0, sizeof p);
    uint64_t n, created;
    if (k->mv_size > KW_CACHE_MAX_PIN_NAME || !pin_decode(d, &n, &created))
        return 0; /* not a record this build wrote: skipped */
    memcpy(p.name, k->mv_data, k->mv_size);
    p.digests = n;
    p.created = created / 1000000000u;
    const uint8_t *dig = (const uint8_t *)d->mv_data + PIN_HEAD;
    for (uint64_t i = 0; i < n; i++) {
        kw__cache_meta m;
        int rc = kw__cache_meta_get(c, txn, dig + i * KW_CACHE_DIGEST_LEN, &m);
        if (rc == 0) {
            p.entries++;
            p.bytes += m.info.size;
        } else if (rc != KW_ENOTFOUND && rc != KW_ECORRUPT) {
            return rc;
        }
    }
    return fn(&p, arg);
}

/* What pins_foreach's walk takes. */
typedef struct sets_args {
    kw_cache_pin_fn fn;
    void *arg;
} sets_args;

/* Reports every set of "pins" with cur, in name order (a
 * kw__cache_walk_fn). */
static int report_sets(kw_cache *c, MDB_txn *txn, MDB_cursor *cur, void *arg)
{
    const sets_args *a = arg;
    MDB_val k, d;
    MDB_cursor_op op = MDB_FIRST;
    int rc = 0, mrc;
    while (rc == 0 && (mrc = mdb_cursor_get(cur, &k, &d, op)) == 0) {
        op = MDB_NEXT;
        rc = report_set(c, txn, &k, &d, a->fn, a->arg);
    }
    if (rc == 0 && mrc != MDB_NOTFOUND)
        rc = kw__cache_mdb(c, "mdb_cursor_get(pins)", mrc);
    return rc;
}

int kw_cache_pins_foreach(kw_cache *c, kw_cache_pin_fn fn, void *arg)
{
    if (!c || !fn)
        return KW_EINVAL;
    if (!c->has_pins)
        return 0;
    sets_args a = {fn, arg};
    return kw__cache_read_walk(c, c->pins, "pins", report_sets, &a);
}

/* Appends the names of digest's sets to buf, from cur. */
static int names_of(kw_cache *c, MDB_cursor *cur, const uint8_t *digest,
                    char *buf, size_t cap, size_t *count)
{
    MDB_val k = {KW_CACHE_DIGEST_LEN, (void *)digest}, d;
    MDB_cursor_op op = MDB_SET_RANGE;
    size_t used = 0;
    int rc, out = 0;
    buf[0] = '\0';
    while ((rc = mdb_cursor_get(cur, &k, &d, op)) == 0 &&
           k.mv_size > KW_CACHE_DIGEST_LEN &&
           memcmp(k.mv_data, digest, KW_CACHE_DIGEST_LEN) == 0) {
        op = MDB_NEXT;
        size_t nl = k.mv_size - KW_CACHE_DIGEST_LEN, sep = used ? 1 : 0;
        ++*count;
        if (out < 0 || used + sep + nl + 1 > cap) {
            out = KW_ENOSPC; /* keep counting, stop writing */
            continue;
        }
        if (sep)
            buf[used++] = ',';
        memcpy(buf + used, (const uint8_t *)k.mv_data + KW_CACHE_DIGEST_LEN,
               nl);
        used += nl;
        buf[used] = '\0';
    }
    if (rc != 0 && rc != MDB_NOTFOUND)
        return kw__cache_mdb(c, "mdb_cursor_get(pinidx)", rc);
    return out;
}

/* What pin_names's walk takes: names_of()'s arguments. */
typedef struct names_args {
    const uint8_t *digest;
    char *buf;
    size_t cap;
    size_t *count;
} names_args;

/* names_of() as a kw__cache_walk_fn. */
static int names_walk(kw_cache *c, MDB_txn *txn, MDB_cursor *cur, void *arg)
{
    const names_args *a = arg;
    (void)txn;
    return names_of(c, cur, a->digest, a->buf, a->cap, a->count);
}

int kw_cache_pin_names(kw_cache *c, const uint8_t digest[KW_CACHE_DIGEST_LEN],
                       char *buf, size_t cap, size_t *count)
{
    size_t n = 0;
    if (count)
        *count = 0;
    if (!c || !digest || !buf || cap == 0)
        return KW_EINVAL;
    buf[0] = '\0';
    if (!c->has_pins)
        return 0;
    names_args a = {digest, buf, cap, &n};
    int rc = kw__cache_read_walk(c, c->pinidx, "pinidx", names_walk, &a);
    if (count)
        *count = n;
    return rc;
}
