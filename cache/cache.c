/* cache.c: open, close, error text and statistics of the LMDB cache
 * (kw_cache.h).  The layout of the environment is described in internal.h.
 *
 * MDB_* codes are translated here, once (kw__cache_mdb), and the native
 * text kept for kw_cache_last_error(); nothing in cache/ prints.
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

/* Reader slots in the lock file.  With MDB_NOTLS a slot is held per live
 * read transaction, not per thread: 256 covers a daemon's workers and
 * connections with room to spare. */
#define MAX_READERS 256

/* The last failure text of this thread: kw_cache_last_error()'s answer.
 * Thread-local on purpose, as errno is, so no lock is needed and another
 * thread's failure cannot rewrite it while the caller reads it; `owner`
 * ties it to the handle it happened on.  Not shared state, so not one of
 * the mutable globals STYLE.md rule 13 forbids. */
static _Thread_local struct {
    const kw_cache *owner;
    char text[KW__CACHE_ERRLEN];
} last_err;

/* The map holds max_size bytes of cubins plus B-tree pages, overflow-page
 * rounding (up to a page per blob), and the copy-on-write pages freed by
 * recent transactions that LMDB cannot reuse yet.  Twice the limit plus
 * 4 MiB covers that for cubin-sized entries; when many tiny entries exceed
 * it anyway, MDB_MAP_FULL makes the write path evict (write.c).  The map is
 * address space only: the file grows with the pages actually written. */
static uint64_t map_size_for(uint64_t max_size)
{
    uint64_t sz = max_size * 2 + (4ull << 20);
    uint64_t mib = 1ull << 20; /* a multiple of every page size */
    return (sz + mib - 1) / mib * mib;
}

int kw__cache_mdb(kw_cache *c, const char *op, int rc)
{
    if (rc == 0)
        return 0;
    if (rc == MDB_NOTFOUND)
        return KW_ENOTFOUND;
    kw__cache_set_error(c, "%s: %s", op, mdb_strerror(rc));
    if (rc == MDB_MAP_FULL)
        return KW__CACHE_EMAPFULL;
    return rc == ENOMEM ? KW_ENOMEM : KW_ECACHE;
}

void kw__cache_set_error(kw_cache *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_err.text, sizeof last_err.text, fmt, ap);
    va_end(ap);
    last_err.owner = c;
}

const char *kw_cache_last_error(const kw_cache *c)
{
    return c && last_err.owner == c ? last_err.text : "";
}

uint64_t kw__cache_tick(kw_cache *c)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    /* Strictly increasing per handle, so two puts in one clock tick (or a
     * clock stepped back) still order by the call order. */
    uint64_t last = atomic_load(&c->last_tick);
    uint64_t t;
    do {
        t = now > last ? now : last + 1;
    } while (!atomic_compare_exchange_weak(&c->last_tick, &last, t));
    return t;
}

int kw__cache_read_begin(kw_cache *c, MDB_txn **txn)
{
    return kw__cache_mdb(c, "mdb_txn_begin",
                         mdb_txn_begin(c->env, NULL, MDB_RDONLY, txn));
}

/* Formats the open error into err (errlen bytes) and returns rc. */
static int open_fail(int rc, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int open_fail(int rc, char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

/* Makes sure opts->dir is a directory: created with mode 0700 when missing
 * (one level only: a missing parent is the caller's mistake to see), never
 * created on a read-only open.  Returns 0 or -errno with err naming dir. */
static int prepare_dir(const kw_cache_opts *opts, char *err, size_t errlen)
{
    struct stat st;
    if (!opts->read_only && mkdir(opts->dir, 0700) < 0 && errno != EEXIST)
        return open_fail(-errno, err, errlen,
                         "cannot create cache directory %s: %s", opts->dir,
                         strerror(errno));
    if (stat(opts->dir, &st) < 0)
        return open_fail(-errno, err, errlen, "cache directory %s: %s",
                         opts->dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return open_fail(-ENOTDIR, err, errlen,
                         "cache directory %s: not a directory", opts->dir);
    return 0;
}

/* Makes the map at least `want` bytes and at least what another process
 * recorded in the file (so handles with different limits never map less
 * than the data).  Must run before the handle's first transaction. */
static int size_map(kw_cache *c, uint64_t want)
{
    MDB_envinfo info;
    /* 0 adopts the size recorded in the file. */
    int rc = mdb_env_set_mapsize(c->env, 0);
    if (rc == 0)
        rc = mdb_env_info(c->env, &info);
    if (rc == 0 && info.me_mapsize < want) {
        rc = mdb_env_set_mapsize(c->env, (size_t)want);
        info.me_mapsize = want;
    }
    MDB_stat st;
    if (rc == 0 && (rc = mdb_env_stat(c->env, &st)) == 0) {
        /* A quarter of the map stays free for the pages that commits free
         * but LMDB can reuse only two commits later, for the free list
         * itself, and so that deleting always finds a page. */
        c->psize = st.ms_psize;
        c->page_budget = info.me_mapsize / st.ms_psize / 4 * 3;
    }
    return rc;
}

/* Creates the environment and opens it in opts->dir.  Writers use
 * MDB_NOMETASYNC: one fsync per commit instead of two; an OS crash may
 * undo the last commit but never breaks the B-tree, which is the right
 * trade for a cache whose entries can be recompiled.  MDB_NOTLS: reader
 * slots belong to transactions, because any thread may read. */
static int open_env(kw_cache *c, const kw_cache_opts *opts, char *err,
                    size_t errlen)
{
    unsigned flags = MDB_NOTLS | (opts->read_only ? MDB_RDONLY
                                                  : MDB_NOMETASYNC);
    uint64_t map = opts->read_only ? 0 : map_size_for(c->max_size);
    const char *op = "mdb_env_create";
    int rc = mdb_env_create(&c->env);
    if (rc == 0) {
        op = "mdb_env_set_maxdbs";
        rc = mdb_env_set_maxdbs(c->env, 4);
    }
    if (rc == 0) {
        op = "mdb_env_set_maxreaders";
        rc = mdb_env_set_maxreaders(c->env, MAX_READERS);
    }
    if (rc == 0 && map) {
        op = "mdb_env_set_mapsize";
        rc = mdb_env_set_mapsize(c->env, (size_t)map);
    }
    if (rc == 0) {
        op = "mdb_env_open";
        rc = mdb_env_open(c->env, opts->dir, flags, 0600);
    }
    if (rc == 0) { /* clear the slots of readers whose process died */
        op = "mdb_reader_check";
        rc = mdb_reader_check(c->env, NULL);
    }
    if (rc == 0) {
        op = "mdb_env_set_mapsize";
        rc = size_map(c, map);
    }
    if (rc == 0)
        return 0;
    if (rc == ENOENT && opts->read_only)
        return open_fail(-ENOENT, err, errlen, "no cache in %s", opts->dir);
    kw__cache_mdb(c, op, rc);
    return open_fail(rc > 0 ? -rc : KW_ECACHE, err, errlen, "cache %s: %s: %s",
                     opts->dir, op, mdb_strerror(rc));
}

/* Opens (writers: creates) the four databases and checks the format; a
 * writer also records its max_size for read-only handles' stats. */
static int open_dbs_txn(kw_cache *c, MDB_txn *txn, const char **op)
{
    unsigned flags = c->read_only ? 0 : MDB_CREATE;
    static const char *const names[4] = {"meta", "blob", "lru", "stats"};
    MDB_dbi *dbis[4] = {&c->meta, &c->blob, &c->lru, &c->stats};
    int rc = 0;
    for (int i = 0; i < 4 && rc == 0; i++)
        rc = mdb_dbi_open(txn, names[i], flags, dbis[i]);
    if (rc != 0)
        return kw__cache_mdb(c, *op = "mdb_dbi_open", rc);
    uint64_t format = 0;
    if ((rc = kw__cache_stat_get(c, txn, "format", &format)) < 0)
        return rc;
    if (format != 0 && format != KW__CACHE_FORMAT) {
        *op = "format";
        return KW_ECACHE;
    }
    if (c->read_only)
        return 0;
    uint64_t old = 0;
    if (format == 0)
        rc = kw__cache_stat_add(c, txn, "format", KW__CACHE_FORMAT);
    if (rc == 0)
        rc = kw__cache_stat_get(c, txn, "max_size", &old);
    if (rc == 0 && old != c->max_size)
        rc = kw__cache_stat_add(c, txn, "max_size",
                                (int64_t)(c->max_size - old));
    return rc;
}

static int open_dbs(kw_cache *c, const kw_cache_opts *opts, char *err,
                    size_t errlen)
{
    MDB_txn *txn;
    const char *op = "mdb_txn_begin";
    int rc = mdb_txn_begin(c->env, NULL, c->read_only ? MDB_RDONLY : 0, &txn);
    if (rc != 0) {
        rc = kw__cache_mdb(c, op, rc);
    } else if ((rc = open_dbs_txn(c, txn, &op)) < 0) {
        mdb_txn_abort(txn);
    } else {
        /* a read-only commit keeps the dbi handles, as a write one does */
        rc = kw__cache_mdb(c, op = "mdb_txn_commit", mdb_txn_commit(txn));
    }
    if (rc == 0)
        return 0;
    if (rc == KW_ENOTFOUND && c->read_only)
        return open_fail(KW_ECACHE, err, errlen,
                         "cache %s: not a kwarm cache (no \"meta\")",
                         opts->dir);
    if (rc == KW_ECACHE && strcmp(op, "format") == 0)
        return open_fail(rc, err, errlen,
                         "cache %s: unknown format (this build reads %d)",
                         opts->dir, KW__CACHE_FORMAT);
    return open_fail(rc, err, errlen, "cache %s: %s", opts->dir,
                     kw_cache_last_error(c));
}

/* Frees c and whatever part of it was set up; no flush. */
static void destroy(kw_cache *c)
{
    if (c->env)
        mdb_env_close(c->env);
    if (last_err.owner == c) /* another handle may get this address */
        last_err.owner = NULL;
    kw__cache_pending_destroy(c);
    pthread_mutex_destroy(&c->pend_mu);
    pthread_mutex_destroy(&c->flush_mu);
    free(c);
}

/* Allocates a handle with its two mutexes initialised. */
static int new_handle(kw_cache **out)
{
    kw_cache *c = calloc(1, sizeof *c);
    if (!c)
        return KW_ENOMEM;
    int rc = pthread_mutex_init(&c->flush_mu, NULL);
    if (rc == 0 && (rc = pthread_mutex_init(&c->pend_mu, NULL)) != 0)
        pthread_mutex_destroy(&c->flush_mu);
    if (rc != 0) {
        free(c);
        return rc == ENOMEM ? KW_ENOMEM : -rc;
    }
    *out = c;
    return 0;
}

int kw_cache_open(kw_cache **out, const kw_cache_opts *opts, char *err,
                  size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    if (!out || !opts || !opts->dir || !opts->dir[0])
        return open_fail(KW_EINVAL, err, errlen, "cache: no directory given");
    uint64_t max = opts->max_size ? opts->max_size : KW_CACHE_DEFAULT_SIZE;
    if (!opts->read_only &&
        (max < KW_CACHE_MIN_SIZE || max > KW_CACHE_MAX_SIZE))
        return open_fail(KW_EINVAL, err, errlen,
                         "cache %s: max_size %llu outside [%llu, %llu]",
                         opts->dir, (unsigned long long)max,
                         (unsigned long long)KW_CACHE_MIN_SIZE,
                         (unsigned long long)KW_CACHE_MAX_SIZE);
    int rc = prepare_dir(opts, err, errlen);
    if (rc < 0)
        return rc;
    kw_cache *c = NULL;
    if ((rc = new_handle(&c)) < 0)
        return open_fail(rc, err, errlen, "cache %s: %s", opts->dir,
                         kw_strerror(rc));
    c->read_only = opts->read_only;
    c->max_size = opts->read_only ? 0 : max;
    if ((rc = open_env(c, opts, err, errlen)) < 0 ||
        (rc = open_dbs(c, opts, err, errlen)) < 0)
        goto fail;
    if (!c->read_only && (rc = kw__cache_pending_init(c)) < 0) {
        open_fail(rc, err, errlen, "cache %s: %s", opts->dir,
                  kw_strerror(rc));
        goto fail;
    }
    *out = c;
    return 0;
fail:
    destroy(c);
    return rc;
}

void kw_cache_close(kw_cache *c)
{
    if (!c)
        return;
    /* A failed flush loses hit counts and recency only: entries stay
     * whole and the next open works, so close has nothing to report. */
    kw_cache_flush(c);
    destroy(c);
}

void kw_cache_count(kw_cache *c, kw_cache_counter which, uint64_t n)
{
    if (!c || c->read_only)
        return;
    pthread_mutex_lock(&c->pend_mu);
    if (which == KW_CACHE_COMPILES)
        c->pend.compiles += n;
    else if (which == KW_CACHE_COMPILE_FAILURES)
        c->pend.compile_failures += n;
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
        mdb_txn_abort(txn);
    }
    if (rc == 0) {
        pthread_mutex_lock(&c->pend_mu);
        s.hits += c->pend.hits;
        s.misses += c->pend.misses;
        s.compiles += c->pend.compiles;
        s.compile_failures += c->pend.compile_failures;
        pthread_mutex_unlock(&c->pend_mu);
        if (!c->read_only)
            s.max_size = c->max_size;
        *out = s;
    }
    pthread_mutex_unlock(&c->flush_mu);
    return rc;
}
