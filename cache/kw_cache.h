/* kw_cache.h: the local compile cache in LMDB (prefix kw_cache_).
 *
 * One entry per compile-key digest: the cubin, its metadata and an
 * XXH3-128 checksum of the cubin, stored by one write transaction, so a
 * crash leaves whole entries or none.  Every read verifies the checksum; a
 * corrupt entry is reported, removed and never served.  A size limit is
 * kept by evicting least-recently-used unpinned entries before the map
 * fills; MDB_MAP_FULL is handled by evicting and retrying.
 *
 * cache/ knows digests, blobs and metadata, never keys or kernels: callers
 * (the CLI, the daemon) hold the meaning of family, fields and arch.
 *
 * Hits do not write: kw_cache_get() runs in a read transaction and records
 * the hit (count, last-used time) in memory; kw_cache_flush() writes those
 * in one transaction (kw_cache_close() flushes; the daemon flushes on a
 * timer).  The LRU order is therefore as fresh as the last flush.
 *
 * Thread-safety: one kw_cache may be used from any number of threads at
 * once; write transactions serialize inside LMDB.  Several processes may
 * open one directory (LMDB's lock file); others may open it read-only.
 * Open a directory at most once per process and share that handle between
 * threads: LMDB's locks are per process, so closing a second handle on the
 * same directory would drop the first one's locks.  Do not use a handle in
 * a child after fork(); open a new one there.
 * LMDB lives on local disk only: not on NFS.
 */
#ifndef KW_CACHE_H
#define KW_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KW_CACHE_DIGEST_LEN 32
#define KW_CACHE_MAX_FIELDS 16
#define KW_CACHE_MAX_BLOB (64u << 20)  /* largest cubin stored */
#define KW_CACHE_DEFAULT_SIZE (1ull << 30)
#define KW_CACHE_MIN_SIZE (1ull << 20)
#define KW_CACHE_MAX_SIZE (1ull << 44) /* 16 TiB: keeps the map size sane */

typedef struct kw_cache kw_cache;

typedef struct kw_cache_opts {
    const char *dir;   /* created (mode 0700) if missing, unless read_only */
    uint64_t max_size; /* cubin bytes kept; 0: KW_CACHE_DEFAULT_SIZE;
                          ignored read-only.  Outside [KW_CACHE_MIN_SIZE,
                          KW_CACHE_MAX_SIZE]: KW_EINVAL */
    bool read_only;    /* MDB_RDONLY: no puts, hits are not recorded */
} kw_cache_opts;

/* What is stored beside a cubin.  Strings are NUL-terminated; on read they
 * are copied into the struct (no lifetime to track). */
typedef struct kw_cache_info {
    char family[48];
    int64_t fields[KW_CACHE_MAX_FIELDS];
    uint32_t nfields;
    char arch[16];
    char entry[256]; /* lowered entry name for cuModuleGetFunction */
    char nvrtc[16];  /* "13.0" */
    double compile_seconds;
    /* Set by the cache (ignored on put): */
    uint64_t size;      /* cubin bytes */
    uint64_t created;   /* Unix seconds */
    uint64_t last_used; /* Unix seconds, as of the last flush */
    uint64_t hits;      /* as of the last flush */
    bool pinned;        /* never evicted */
} kw_cache_info;

/* bytes counts cubin bytes (what max_size limits); max_size is the limit of
 * the last writer that opened the directory. */
typedef struct kw_cache_stats {
    uint64_t entries, bytes, max_size;
    uint64_t hits, misses, compiles, compile_failures, evictions, corrupt;
} kw_cache_stats;

/* Opens (creating if needed) the cache in opts->dir, runs mdb_reader_check
 * to clear stale readers of dead processes.  Returns 0 and *out, or a
 * negative code (KW_ECACHE, -errno, KW_EINVAL) with a one-line reason
 * naming the directory in err.  *out is untouched on error. */
int kw_cache_open(kw_cache **out, const kw_cache_opts *opts, char *err,
                  size_t errlen);

/* Flushes recorded hits and closes.  NULL is a no-op. */
void kw_cache_close(kw_cache *c);

/* Stores blob under digest with info, unless an entry is already there
 * (then *stored = false and nothing changes).  pin marks it never evicted.
 * info may be NULL (empty metadata); its strings must be NUL-terminated
 * inside their arrays and nfields <= KW_CACHE_MAX_FIELDS.  stored may be
 * NULL.  Evicts LRU unpinned entries first when the size limit requires,
 * and when LMDB's map fills before it (many small entries).
 * Returns 0; KW_ENOSPC when even evicting every unpinned entry cannot make
 * room (nothing is evicted then); KW_EINVAL (read-only, empty
 * blob, blob over KW_CACHE_MAX_BLOB, bad info); KW_ECACHE. */
int kw_cache_put(kw_cache *c, const uint8_t digest[KW_CACHE_DIGEST_LEN],
                 const kw_cache_info *info, const void *blob, size_t len,
                 bool pin, bool *stored);

/* Fetches the entry: *blob is a new malloc'd copy (the caller frees it),
 * *len its size, *info (may be NULL) its metadata.  The checksum is
 * verified on the copy handed out; the hit is recorded for the next flush.
 * When 4096 distinct digests are waiting, the call flushes them first (one
 * write transaction), unless another thread is flushing.
 * Returns 0; KW_ENOTFOUND (a miss, counted); KW_ECORRUPT (the entry
 * failed its checksum: it has been removed and counted, except on a
 * read-only handle, which cannot write; the caller should recompile);
 * KW_ENOMEM; KW_ECACHE.  On error *blob is NULL. */
int kw_cache_get(kw_cache *c, const uint8_t digest[KW_CACHE_DIGEST_LEN],
                 void **blob, size_t *len, kw_cache_info *info);

/* As kw_cache_get() into a caller buffer of cap bytes (no allocation: the
 * hot path of a daemon).  KW_ENOSPC, with *len the size needed, when it
 * does not fit. */
int kw_cache_get_into(kw_cache *c, const uint8_t digest[KW_CACHE_DIGEST_LEN],
                      void *buf, size_t cap, size_t *len, kw_cache_info *info);

/* True when an entry exists (no checksum, no hit recorded); false on any
 * LMDB failure too. */
bool kw_cache_contains(kw_cache *c, const uint8_t digest[KW_CACHE_DIGEST_LEN]);

/* Removes one entry.  0 or KW_ENOTFOUND, KW_ECACHE. */
int kw_cache_remove(kw_cache *c, const uint8_t digest[KW_CACHE_DIGEST_LEN]);

/* Sets or clears an entry's pin.  0 or KW_ENOTFOUND, KW_ECACHE. */
int kw_cache_pin(kw_cache *c, const uint8_t digest[KW_CACHE_DIGEST_LEN],
                 bool pinned);

/* Counters the cache cannot see by itself (compiles are the caller's). */
typedef enum kw_cache_counter {
    KW_CACHE_COMPILES,
    KW_CACHE_COMPILE_FAILURES,
} kw_cache_counter;

/* Adds n to a counter (recorded with the next flush).  Thread-safe. */
void kw_cache_count(kw_cache *c, kw_cache_counter which, uint64_t n);

/* Writes recorded hits, misses and counters in one transaction.
 * 0 or KW_ECACHE (they are then kept for the next flush); a read-only
 * cache returns 0 (it records nothing). */
int kw_cache_flush(kw_cache *c);

/* Current statistics (persisted counters plus those not yet flushed).
 * Waits for a flush in progress, so nothing is counted twice or missed.
 * 0 or KW_ECACHE. */
int kw_cache_stats_get(kw_cache *c, kw_cache_stats *out);

/* Calls fn for every entry, in digest order, inside one read transaction
 * (fn must not call back into c).  digest and info are valid during the
 * call only.  An entry whose metadata fails its check is skipped (a get
 * reports and removes it).  Stops when fn returns non-zero and returns that
 * value; else 0, or KW_ECACHE.  While fn runs, LMDB cannot reuse pages that
 * writers free, so keep it short: a long one can make puts fail with
 * KW_ECACHE (MDB_MAP_FULL) until it returns. */
typedef int (*kw_cache_each_fn)(const uint8_t digest[KW_CACHE_DIGEST_LEN],
                                const kw_cache_info *info, void *arg);
int kw_cache_foreach(kw_cache *c, kw_cache_each_fn fn, void *arg);

/* The text of the last failure on c in the calling thread, naming the
 * LMDB call ("mdb_put(blob): MDB_MAP_FULL: Environment mapsize limit
 * reached"), or "" when there was none.  Kept per thread, so a failure on
 * another thread never rewrites it; valid until the calling thread's next
 * failing call on a cache. */
const char *kw_cache_last_error(const kw_cache *c);

#endif /* KW_CACHE_H */
