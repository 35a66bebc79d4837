/* cache.c: close and statistics of the LMDB cache (kw_cache.h); open.c
 * opens it, txn.c holds what every file below uses.  The layout of the
 * environment is described in internal.h.
 */
#include "kw_cache.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "internal.h"
#include "kw_err.h"

void kw__cache_destroy(kw_cache *c)
{
    for (size_t i = 0; i < KW__CACHE_POOL; i++) {
        MDB_txn *t = atomic_exchange(&c->pool[i], NULL);
        if (t)
            mdb_txn_abort(t);
    }
    if (c->env)
        mdb_env_close(c->env);
    kw__cache_error_forget(c); /* another handle may get this address */
    kw__cache_pending_destroy(c);
    kw__cache_hints_destroy(c);
    kw__cache_claims_destroy(c);
    free(c->dir);
    for (int i = 0; i < KW__CACHE_HINT_LOCKS; i++)
        pthread_mutex_destroy(&c->hint_mu[i]);
    pthread_mutex_destroy(&c->prot_mu);
    pthread_mutex_destroy(&c->pend_mu);
    pthread_mutex_destroy(&c->flush_mu);
    free(c);
}

void kw_cache_close(kw_cache *c)
{
    if (!c)
        return;
    /* A failed flush loses hit counts and recency only: entries stay
     * whole and the next open works, so close has nothing to report. */
    kw_cache_flush(c);
    kw__cache_destroy(c);
}

void kw_cache_count(kw_cache *c, kw_cache_counter which, uint64_t n)
{
    if (!c || c->read_only) /* a read-only cache compiles nothing */
        return;
    pthread_mutex_lock(&c->pend_mu);
    if (which == KW_CACHE_COMPILES)
        c->pend.cnt.compiles += n;
    else if (which == KW_CACHE_COMPILE_FAILURES)
        c->pend.cnt.compile_failures += n;
    pthread_mutex_unlock(&c->pend_mu);
}

/* Reads the persisted part of the statistics in txn. */
static int stats_txn(kw_cache *c, MDB_txn *txn, kw_cache_stats *s)
{
    static const char *const names[] = {
        "bytes",    "max_size",         "hits",      "misses",
        "compiles", "compile_failures", "evictions", "corrupt",
    };
    uint64_t *dst[] = {&s->bytes,    &s->max_size,         &s->hits,
                       &s->misses,   &s->compiles,         &s->compile_failures,
                       &s->evictions, &s->corrupt};
    MDB_stat st;
    int rc = kw__cache_mdb(c, "mdb_stat", mdb_stat(txn, c->meta, &st));
    s->entries = st.ms_entries;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && rc == 0; i++)
        rc = kw__cache_stat_get(c, txn, names[i], dst[i]);
    if (rc == 0)
        rc = kw__cache_pinned_totals(c, txn, &s->pinned_entries,
                                     &s->pinned_bytes);
    return rc;
}

int kw_cache_stats_get(kw_cache *c, kw_cache_stats *out)
{
    if (!c || !out)
        return KW_EINVAL;
    kw_cache_stats s = {0};
    MDB_txn *txn;
    /* flush_mu keeps a flush from moving counters from memory to disk
     * between our read of the one and of the other. */
    pthread_mutex_lock(&c->flush_mu);
    int rc = kw__cache_read_begin(c, &txn);
    if (rc == 0) {
        rc = stats_txn(c, txn, &s);
        kw__cache_read_end(c, txn);
    }
    if (rc == 0) {
        pthread_mutex_lock(&c->pend_mu);
        s.hits += c->pend.cnt.hits;
        s.misses += c->pend.cnt.misses;
        s.compiles += c->pend.cnt.compiles;
        s.compile_failures += c->pend.cnt.compile_failures;
        pthread_mutex_unlock(&c->pend_mu);
        s.read_only = c->read_only;
        *out = s;
    }
    pthread_mutex_unlock(&c->flush_mu);
    return rc;
}
