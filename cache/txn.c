/* txn.c: the base of cache/, which every other file uses and which uses
 * none of them: MDB_* codes translated, once (kw__cache_mdb), with the
 * native text kept for kw_cache_last_error() (nothing in cache/ prints);
 * the handle's ticks; the read-transaction pool and its walks.
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
uint64_t kw__cache_map_size(uint64_t max_size)
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

/* The next tick at or after `now` ns: strictly increasing per handle, so
 * two puts in one clock tick (or a clock stepped back) still order by the
 * call order. */
static uint64_t next_tick(kw_cache *c, uint64_t now)
{
    uint64_t last = atomic_load(&c->last_tick);
    uint64_t t;
    do {
        t = now > last ? now : last + 1;
    } while (!atomic_compare_exchange_weak(&c->last_tick, &last, t));
    return t;
}

static uint64_t now_ns(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t kw__cache_tick(kw_cache *c)
{
    return next_tick(c, now_ns(CLOCK_REALTIME));
}

uint64_t kw__cache_tick_coarse(kw_cache *c)
{
    return next_tick(c, now_ns(CLOCK_REALTIME_COARSE));
}

/* A small start index for the pool scan, different between threads, so
 * threads on different cores mostly touch different slots.  The address
 * of a thread-local object is per thread and needs no state. */
static size_t pool_start(void)
{
    static _Thread_local char here;
    uintptr_t a = (uintptr_t)&here;
    return (size_t)(a >> 6 ^ a >> 12) % KW__CACHE_POOL;
}

int kw__cache_read_begin(kw_cache *c, MDB_txn **txn)
{
    size_t s = pool_start();
    for (size_t i = 0; i < KW__CACHE_POOL; i++) {
        _Atomic(MDB_txn *) *slot = &c->pool[(s + i) % KW__CACHE_POOL];
        MDB_txn *t = atomic_load_explicit(slot, memory_order_relaxed);
        if (!t || !(t = atomic_exchange(slot, NULL)))
            continue;
        /* renewing keeps the reader slot: no lock-table mutex taken */
        int rc = mdb_txn_renew(t);
        if (rc == 0) {
            *txn = t;
            return 0;
        }
        mdb_txn_abort(t);
        break; /* begin below reports what is wrong */
    }
    return kw__cache_mdb(c, "mdb_txn_begin",
                         mdb_txn_begin(c->env, NULL, MDB_RDONLY, txn));
}

void kw__cache_read_end(kw_cache *c, MDB_txn *txn)
{
    mdb_txn_reset(txn);
    size_t s = pool_start();
    for (size_t i = 0; i < KW__CACHE_POOL; i++) {
        MDB_txn *none = NULL;
        if (atomic_compare_exchange_strong(&c->pool[(s + i) % KW__CACHE_POOL],
                                           &none, txn))
            return;
    }
    mdb_txn_abort(txn); /* the pool is full: give the reader slot back */
}

int kw__cache_read_walk(kw_cache *c, MDB_dbi dbi, const char *name,
                        kw__cache_walk_fn walk, void *arg)
{
    MDB_txn *txn;
    MDB_cursor *cur;
    char what[48];
    int rc = kw__cache_read_begin(c, &txn);
    if (rc < 0)
        return rc;
    snprintf(what, sizeof what, "mdb_cursor_open(%s)", name);
    rc = kw__cache_mdb(c, what, mdb_cursor_open(txn, dbi, &cur));
    if (rc == 0) {
        rc = walk(c, txn, cur, arg);
        mdb_cursor_close(cur);
    }
    kw__cache_read_end(c, txn);
    return rc;
}

void kw__cache_error_forget(const kw_cache *c)
{
    if (last_err.owner == c)
        last_err.owner = NULL;
}

int kw__cache_refuse_ro(kw_cache *c)
{
    kw__cache_set_error(c, "%s is read-only", c->dir);
    return KW_EROFS;
}
