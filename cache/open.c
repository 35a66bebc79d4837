/* open.c: opening the LMDB cache (kw_cache.h): the directory, the
 * environment (with the read-only fallbacks), the databases, the stored
 * size limit and the trim of a cache found over it.  The layout is
 * described in internal.h.
 */
#include "kw_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "kw_err.h"

/* Reader slots in the lock file.  With MDB_NOTLS a slot is held per live
 * (or pooled) read transaction, not per thread: 256 covers a daemon's
 * workers, its pool and its borrowed views with room to spare. */
#define MAX_READERS 256
#define NDBS 6

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

/* True when the calling process (its effective ids) may write path, or
 * path does not exist. */
static bool writable(const char *dir, const char *name)
{
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
        return false;
    if (faccessat(AT_FDCWD, path, W_OK, AT_EACCESS) == 0)
        return true;
    return errno == ENOENT;
}

/* Makes sure opts->dir is a directory: created with mode 0700 when missing
 * (one level only: a missing parent is the caller's mistake to see), never
 * created read-only.  Sets *ro when the handle must be read-only: asked
 * for, or (auto_read_only) the directory or its files are not writable.
 * Returns 0 or -errno with err naming dir. */
static int prepare_dir(const kw_cache_opts *opts, bool *ro, char *err,
                       size_t errlen)
{
    struct stat st;
    *ro = opts->read_only;
    int mk = 0;
    if (!*ro && mkdir(opts->dir, 0700) < 0 && errno != EEXIST)
        mk = errno;
    if (stat(opts->dir, &st) < 0)
        return open_fail(-(mk ? mk : errno), err, errlen,
                         mk ? "cannot create cache directory %s: %s"
                            : "cache directory %s: %s",
                         opts->dir, strerror(mk ? mk : errno));
    if (!S_ISDIR(st.st_mode))
        return open_fail(-ENOTDIR, err, errlen,
                         "cache directory %s: not a directory", opts->dir);
    if (!*ro && opts->auto_read_only &&
        (faccessat(AT_FDCWD, opts->dir, W_OK, AT_EACCESS) < 0 ||
         !writable(opts->dir, "data.mdb") || !writable(opts->dir, "lock.mdb")))
        *ro = true;
    return 0;
}

/* Makes the map at least `want` bytes and at least what another process
 * recorded in the file (so handles with different limits never map less
 * than the data).  Only while this handle has no transaction. */
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
        c->psize = st.ms_psize;
        c->mapsize = info.me_mapsize;
    }
    return rc;
}

/* Creates the environment and opens it with flags; *op names the failing
 * call.  The environment is closed again on failure (LMDB's rule). */
static int env_try(kw_cache *c, const char *dir, unsigned flags,
                   uint64_t map, const char **op)
{
    int rc = mdb_env_create(&c->env);
    *op = "mdb_env_create";
    if (rc == 0 && (rc = mdb_env_set_maxdbs(c->env, NDBS)) != 0)
        *op = "mdb_env_set_maxdbs";
    if (rc == 0 && (rc = mdb_env_set_maxreaders(c->env, MAX_READERS)) != 0)
        *op = "mdb_env_set_maxreaders";
    if (rc == 0 && map && (rc = mdb_env_set_mapsize(c->env, map)) != 0)
        *op = "mdb_env_set_mapsize";
    /* 0640: members of the cache directory's group (kwarm, under the
     * systemd unit's UMask=0027) may read the entries, never write them;
     * a reader that cannot write lock.mdb opens read-only (below). */
    if (rc == 0 && (rc = mdb_env_open(c->env, dir, flags, 0640)) != 0)
        *op = "mdb_env_open";
    if (rc != 0 && c->env) {
        mdb_env_close(c->env);
        c->env = NULL;
    }
    return rc;
}

/* Opens the environment.  Writers use MDB_NOMETASYNC: one fsync per commit
 * instead of two; an OS crash may undo the last commit but never breaks
 * the B-tree, the right trade for a cache whose entries can be recompiled.
 * MDB_NOTLS: reader slots belong to transactions, because any thread may
 * read and pooled transactions move between threads.  A read-only open
 * whose lock file cannot be written (another user's cache: EACCES; LMDB
 * already goes lockless by itself on EROFS) retries with MDB_NOLOCK; so
 * does an auto_read_only writer refused write access. */
static int open_env(kw_cache *c, const kw_cache_opts *opts, uint64_t max,
                    char *err, size_t errlen)
{
    const char *op;
    unsigned ro = MDB_NOTLS | MDB_RDONLY;
    uint64_t map = c->read_only ? 0 : kw__cache_map_size(max);
    int rc = env_try(c, opts->dir, c->read_only ? ro : MDB_NOTLS |
                     MDB_NOMETASYNC, map, &op);
    bool denied = rc == EACCES || rc == EROFS || rc == EPERM;
    if (denied && !c->read_only && opts->auto_read_only) {
        c->read_only = true;
        rc = env_try(c, opts->dir, ro, 0, &op);
        denied = rc == EACCES || rc == EPERM;
    }
    if (denied && c->read_only) {
        rc = env_try(c, opts->dir, ro | MDB_NOLOCK, 0, &op);
        c->nolock = rc == 0;
    }
    if (rc == 0 && (rc = mdb_reader_check(c->env, NULL)) != 0)
        op = "mdb_reader_check"; /* slots of readers whose process died */
    if (rc == 0 && (rc = size_map(c, c->read_only ? 0 : map)) != 0)
        op = "mdb_env_set_mapsize";
    if (rc == 0)
        return 0;
    if (rc == ENOENT && c->read_only)
        return open_fail(-ENOENT, err, errlen, "no cache in %s", opts->dir);
    kw__cache_mdb(c, op, rc);
    return open_fail(rc > 0 ? -rc : KW_ECACHE, err, errlen, "cache %s: %s: %s",
                     opts->dir, op, mdb_strerror(rc));
}

/* Opens the databases; a writer creates the missing ones.  The two pin
 * databases may be missing from an old cache opened read-only. */
static int open_dbis(kw_cache *c, MDB_txn *txn, const char **op)
{
    unsigned flags = c->read_only ? 0 : MDB_CREATE;
    static const char *const names[NDBS] = {"meta",  "blob", "lru",
                                            "stats", "pins", "pinidx"};
    MDB_dbi *dbis[NDBS] = {&c->meta,  &c->blob, &c->lru,
                           &c->stats, &c->pins, &c->pinidx};
    int rc = 0;
    for (int i = 0; i < NDBS && rc == 0; i++) {
        rc = mdb_dbi_open(txn, names[i], flags, dbis[i]);
        if (rc == MDB_NOTFOUND && i >= 4)
            return 0; /* has_pins stays false */
        if (rc == 0 && i == NDBS - 1)
            c->has_pins = true;
    }
    return rc != 0 ? kw__cache_mdb(c, *op = "mdb_dbi_open", rc) : 0;
}

/* Opens the databases and checks the format.  A writer stores the limit
 * when the cache has none (new, or made before limits were stored):
 * `max` is then the opener's.  *stored gets the limit in force. */
static int open_dbs_txn(kw_cache *c, MDB_txn *txn, uint64_t max,
                        uint64_t *stored, const char **op)
{
    int rc = open_dbis(c, txn, op);
    if (rc < 0)
        return rc;
    uint64_t format = 0;
    if ((rc = kw__cache_stat_get(c, txn, "format", &format)) < 0)
        return rc;
    if (format != 0 && format != KW__CACHE_FORMAT) {
        *op = "format";
        return KW_ECACHE;
    }
    if ((rc = kw__cache_max_get(c, txn, stored)) < 0 || c->read_only)
        return rc;
    if (format == 0)
        rc = kw__cache_stat_add(c, txn, "format", KW__CACHE_FORMAT);
    if (rc == 0 && *stored == 0) {
        rc = kw__cache_stat_add(c, txn, "max_size", (int64_t)max);
        *stored = max;
    }
    return rc;
}

static int open_dbs(kw_cache *c, const kw_cache_opts *opts, uint64_t max,
                    uint64_t *stored, char *err, size_t errlen)
{
    MDB_txn *txn;
    const char *op = "mdb_txn_begin";
    int rc = mdb_txn_begin(c->env, NULL, c->read_only ? MDB_RDONLY : 0, &txn);
    if (rc != 0) {
        rc = kw__cache_mdb(c, op, rc);
    } else if ((rc = open_dbs_txn(c, txn, max, stored, &op)) < 0) {
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

/* Evicts LRU entries of a cache found over its stored limit. */
static int trim_fn(kw_cache *c, MDB_txn *txn, void *arg)
{
    (void)arg;
    uint64_t bytes, max;
    int rc = kw__cache_stat_get(c, txn, "bytes", &bytes);
    if (rc == 0)
        rc = kw__cache_max_get(c, txn, &max);
    if (rc == 0 && bytes > max)
        rc = kw__cache_evict_txn(c, txn, 0, bytes - max, NULL);
    return rc;
}

/* Allocates a handle with its mutexes initialised (kw__cache_destroy
 * destroys them: all are initialised or the handle is not made). */
static int new_handle(kw_cache **out)
{
    kw_cache *c = calloc(1, sizeof *c);
    if (!c)
        return KW_ENOMEM;
    pthread_mutex_t *mus[3 + KW__CACHE_HINT_LOCKS] = {
        &c->flush_mu, &c->pend_mu, &c->prot_mu};
    for (int i = 0; i < KW__CACHE_HINT_LOCKS; i++)
        mus[3 + i] = &c->hint_mu[i];
    int n = 0, rc = 0;
    while (n < 3 + KW__CACHE_HINT_LOCKS &&
           (rc = pthread_mutex_init(mus[n], NULL)) == 0)
        n++;
    if (rc != 0) {
        while (n-- > 0)
            pthread_mutex_destroy(mus[n]);
        free(c);
        return rc == ENOMEM ? KW_ENOMEM : -rc;
    }
    *out = c;
    return 0;
}

/* Checks the options; returns the opener's limit in *max. */
static int check_opts(kw_cache **out, const kw_cache_opts *opts,
                      uint64_t *max, char *err, size_t errlen)
{
    if (!out || !opts || !opts->dir || !opts->dir[0])
        return open_fail(KW_EINVAL, err, errlen, "cache: no directory given");
    *max = opts->max_size ? opts->max_size : KW_CACHE_DEFAULT_SIZE;
    if (!opts->read_only &&
        (*max < KW_CACHE_MIN_SIZE || *max > KW_CACHE_MAX_SIZE))
        return open_fail(KW_EINVAL, err, errlen,
                         "cache %s: max_size %llu outside [%llu, %llu]",
                         opts->dir, (unsigned long long)*max,
                         (unsigned long long)KW_CACHE_MIN_SIZE,
                         (unsigned long long)KW_CACHE_MAX_SIZE);
    return 0;
}

/* The part of kw_cache_open after the handle exists. */
static int open_handle(kw_cache *c, const kw_cache_opts *opts, uint64_t max,
                       char *err, size_t errlen)
{
    uint64_t stored = 0;
    int rc = open_env(c, opts, max, err, errlen);
    if (rc == 0)
        rc = open_dbs(c, opts, max, &stored, err, errlen);
    /* another opener's stored limit may want a larger map than ours; no
     * transaction is live yet, so the map may still move */
    if (rc == 0 && !c->read_only && stored > max &&
        (rc = size_map(c, kw__cache_map_size(stored))) != 0)
        rc = open_fail(KW_ECACHE, err, errlen, "cache %s: mapsize: %s",
                       opts->dir, mdb_strerror(rc));
    if (rc == 0 && ((rc = kw__cache_pending_init(c)) < 0 ||
                    (rc = kw__cache_hints_init(c)) < 0))
        open_fail(rc, err, errlen, "cache %s: %s", opts->dir, kw_strerror(rc));
    if (rc == 0 && !c->read_only &&
        (rc = kw__cache_write(c, trim_fn, NULL, 0)) < 0)
        open_fail(rc, err, errlen, "cache %s: trim to its limit: %s",
                  opts->dir, kw_cache_last_error(c));
    return rc;
}

int kw_cache_open(kw_cache **out, const kw_cache_opts *opts, char *err,
                  size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    uint64_t max = 0;
    bool ro = false;
    int rc = check_opts(out, opts, &max, err, errlen);
    if (rc == 0)
        rc = prepare_dir(opts, &ro, err, errlen);
    if (rc < 0)
        return rc;
    kw_cache *c = NULL;
    if ((rc = new_handle(&c)) < 0)
        return open_fail(rc, err, errlen, "cache %s: %s", opts->dir,
                         kw_strerror(rc));
    c->read_only = ro;
    c->defer_writes = opts->defer_writes;
    if ((c->dir = strdup(opts->dir)) == NULL)
        rc = open_fail(KW_ENOMEM, err, errlen, "cache %s: %s", opts->dir,
                       kw_strerror(KW_ENOMEM));
    if (rc < 0 || (rc = open_handle(c, opts, max, err, errlen)) < 0) {
        kw__cache_destroy(c);
        return rc;
    }
    kw__cache_claims_init(c, opts->dir);
    *out = c;
    return 0;
}

bool kw_cache_limit_differs(kw_cache *c, uint64_t asked, uint64_t *stored)
{
    kw_cache_stats st;
    if (c == NULL || asked == 0 || kw_cache_stats_get(c, &st) < 0)
        return false;
    if (stored != NULL)
        *stored = st.max_size;
    return st.max_size != asked;
}

bool kw_cache_is_read_only(const kw_cache *c)
{
    return c && c->read_only;
}
