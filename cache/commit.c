/* commit.c: the write loop every cache write goes through
 * (kw__cache_write): one write transaction, and on MDB_MAP_FULL or a
 * full disk, eviction in its own commit and a retry.  Below write.c,
 * flush.c and pins.c, which call it; it calls only record.c (eviction)
 * and txn.c (errors), so no file of cache/ calls in a circle.
 */
#include "kw_cache.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>

#include "internal.h"
#include "kw_err.h"

/* MDB_MAP_FULL retries per operation.  Eviction batches double from
 * KW__CACHE_EVICT_BATCH entries, so the last round may evict 16 << 7 =
 * 2048. */
#define MAPFULL_TRIES 8

/* Runs fn once in a write transaction: commit on 0, abort otherwise. */
static int write_once(kw_cache *c, kw__cache_txn_fn fn, void *arg)
{
    MDB_txn *txn;
    int rc = kw__cache_mdb(c, "mdb_txn_begin",
                           mdb_txn_begin(c->env, NULL, 0, &txn));
    if (rc < 0)
        return rc;
    if ((rc = fn(c, txn, arg)) < 0) {
        mdb_txn_abort(txn);
        return rc;
    }
    rc = mdb_txn_commit(txn);
    if (rc == ENOSPC || rc == EIO || rc == EDQUOT) {
        /* The file could not grow (LMDB reports a short write as EIO):
         * like MDB_MAP_FULL, eviction in its own commit frees pages that
         * later commits reuse without growing the file. */
        kw__cache_set_error(c, "mdb_txn_commit: %s", mdb_strerror(rc));
        return KW__CACHE_EDISK;
    }
    return kw__cache_mdb(c, "mdb_txn_commit", rc);
}

/* Says that c's filesystem is full, naming the directory, what failed
 * (why) and the space left; returns KW_EDISKFULL. */
static int disk_full(kw_cache *c, const char *why)
{
    struct statvfs sv;
    char room[96] = "";
    if (statvfs(c->dir, &sv) == 0)
        snprintf(room, sizeof room, "; %llu of %llu bytes free",
                 (unsigned long long)sv.f_bavail * sv.f_frsize,
                 (unsigned long long)sv.f_blocks * sv.f_frsize);
    kw__cache_set_error(c, "%s is on a full disk (%s%s)", c->dir, why, room);
    return KW_EDISKFULL;
}

/* Arguments of one eviction round. */
typedef struct evict_req {
    uint64_t count, bytes, evicted;
    bool disk;                  /* the failure was the disk's, not the map's */
    char why[KW__CACHE_ERRLEN]; /* the failure that called for it */
} evict_req;

static int evict_fn(kw_cache *c, MDB_txn *txn, void *arg)
{
    evict_req *r = arg;
    int rc = kw__cache_evict_txn(c, txn, r->count, r->bytes, &r->evicted);
    if (rc < 0 || r->evicted > 0)
        return rc;
    if (r->disk) /* nothing to free: no page will come back */
        return disk_full(c, r->why);
    kw__cache_set_error(c, "%s: the cache's map is full and no entry may "
                           "be evicted (the others are pinned or protected)",
                        r->why);
    return KW_ENOSPC;
}

int kw__cache_write(kw_cache *c, kw__cache_txn_fn fn, void *arg,
                    uint64_t need)
{
    for (int round = 0;; round++) {
        int rc = write_once(c, fn, arg);
        if (rc != KW__CACHE_EMAPFULL && rc != KW__CACHE_EDISK)
            return rc;
        evict_req r = {(uint64_t)KW__CACHE_EVICT_BATCH << round, need, 0,
                       rc == KW__CACHE_EDISK, ""};
        snprintf(r.why, sizeof r.why, "%s", kw_cache_last_error(c));
        if (round == MAPFULL_TRIES && r.disk)
            return disk_full(c, r.why);
        if (round == MAPFULL_TRIES) {
            kw__cache_set_error(c, "no room after %d eviction rounds (the "
                                   "cache's map is full)", MAPFULL_TRIES);
            return KW_ECACHE;
        }
        /* A dead process's reader slot pins old pages, so LMDB cannot
         * reuse what eviction frees: clear such slots first.  Its failure
         * is not ours to report; the eviction below runs either way. */
        (void)mdb_reader_check(c->env, NULL);
        /* Pages freed by a commit become reusable two commits later, so a
         * retry may fail once more; the next, larger round then succeeds. */
        rc = write_once(c, evict_fn, &r);
        if (rc == KW__CACHE_EDISK) /* even deleting could not be written */
            return disk_full(c, kw_cache_last_error(c));
        if (rc == KW__CACHE_EMAPFULL) /* even deleting found no page */
            return KW_ECACHE;
        if (rc < 0)
            return rc;
    }
}

