/* prefix.c: resolving a hex digest prefix to the one stored digest it
 * starts, as git resolves abbreviated object names (kw_cache.h).
 *
 * The prefix becomes a lower bound (its nibbles, then zeros) for a cursor
 * seek in "meta", whose keys are the digests in byte order; the matches
 * are the keys from there on that still start with the prefix.
 */
#include "kw_cache.h"

#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "kw_err.h"

/* The value of hex digit ch, or -1. */
static int nibble(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

/* Parses hex into the lower bound lo; *nib gets the number of digits.
 * False when it is not KW_CACHE_PREFIX_MIN..64 hex digits. */
static bool parse_prefix(const char *hex, uint8_t lo[KW_CACHE_DIGEST_LEN],
                         size_t *nib)
{
    size_t n = strnlen(hex, 2 * KW_CACHE_DIGEST_LEN + 1);
    if (n < KW_CACHE_PREFIX_MIN || n > 2 * KW_CACHE_DIGEST_LEN)
        return false;
    memset(lo, 0, KW_CACHE_DIGEST_LEN);
    for (size_t i = 0; i < n; i++) {
        int v = nibble(hex[i]);
        if (v < 0)
            return false;
        lo[i / 2] |= (uint8_t)(i % 2 ? v : v << 4);
    }
    *nib = n;
    return true;
}

/* True when digest k starts with the nib digits of lo. */
static bool starts_with(const uint8_t *k, const uint8_t *lo, size_t nib)
{
    if (memcmp(k, lo, nib / 2) != 0)
        return false;
    return nib % 2 == 0 || (k[nib / 2] & 0xf0) == lo[nib / 2];
}

/* Appends the hex of digest d to list (cap bytes), newline-separated,
 * when it fits whole. */
static void append_hex(char *list, size_t cap, const uint8_t *d)
{
    if (!list || cap == 0)
        return;
    size_t used = strlen(list), sep = used ? 1 : 0;
    if (used + sep + 2 * KW_CACHE_DIGEST_LEN + 1 > cap)
        return;
    if (sep)
        list[used++] = '\n';
    for (int i = 0; i < KW_CACHE_DIGEST_LEN; i++)
        snprintf(list + used + 2 * i, 3, "%02x", d[i]);
}

/* Walks the matches of the prefix from cur: *found counts them (up to
 * cap's worth listed), the first goes into out. */
static int matches(kw_cache *c, MDB_cursor *cur, const uint8_t *lo,
                   size_t nib, uint8_t *out, char *list, size_t cap,
                   size_t *found)
{
    MDB_val k = {KW_CACHE_DIGEST_LEN, (void *)lo}, d;
    MDB_cursor_op op = MDB_SET_RANGE;
    int rc;
    while ((rc = mdb_cursor_get(cur, &k, &d, op)) == 0 &&
           k.mv_size == KW_CACHE_DIGEST_LEN && starts_with(k.mv_data, lo, nib)) {
        op = MDB_NEXT;
        if (++*found == 1)
            memcpy(out, k.mv_data, KW_CACHE_DIGEST_LEN);
        append_hex(list, cap, k.mv_data);
        /* past what the list can show, more matches change nothing */
        if (*found > 1 && (!list || strlen(list) + 2 * KW_CACHE_DIGEST_LEN +
                                            2 > cap))
            break;
    }
    return rc == 0 || rc == MDB_NOTFOUND ? 0
                                         : kw__cache_mdb(c, "meta", rc);
}

/* What find_prefix's walk takes: matches()'s arguments. */
typedef struct match_args {
    const uint8_t *lo;
    size_t nib;
    uint8_t *out;
    char *list;
    size_t cap;
    size_t *found;
} match_args;

/* matches() as a kw__cache_walk_fn. */
static int matches_walk(kw_cache *c, MDB_txn *txn, MDB_cursor *cur, void *arg)
{
    const match_args *a = arg;
    (void)txn;
    return matches(c, cur, a->lo, a->nib, a->out, a->list, a->cap, a->found);
}

int kw_cache_find_prefix(kw_cache *c, const char *hex,
                         uint8_t out[KW_CACHE_DIGEST_LEN], char *candidates,
                         size_t cap)
{
    uint8_t lo[KW_CACHE_DIGEST_LEN], first[KW_CACHE_DIGEST_LEN];
    size_t nib, found = 0;
    if (candidates && cap)
        candidates[0] = '\0';
    if (!c || !hex || !out || !parse_prefix(hex, lo, &nib))
        return KW_EINVAL;
    match_args a = {lo, nib, first, candidates, cap, &found};
    int rc = kw__cache_read_walk(c, c->meta, "meta", matches_walk, &a);
    if (rc < 0)
        return rc;
    if (found == 0)
        return KW_ENOTFOUND;
    if (found > 1)
        return KW_EAMBIGUOUS;
    memcpy(out, first, KW_CACHE_DIGEST_LEN);
    return 0;
}
