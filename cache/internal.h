/* internal.h: what cache/'s own files share (kw__cache_*).  Not API:
 * nothing outside cache/ includes this header.
 *
 * Files, each calling only files listed after it (no cycle): open.c
 * (open: environment, read-only fallback, stored limit), cache.c (close,
 * stats), read.c (get, borrow, contains, foreach, corrupt entries),
 * write.c (put, remove, pin, resize), pins.c (named pin sets), protect.c
 * (plans, pinned totals), prefix.c (digest prefixes), flush.c (hits
 * recorded in memory and their flush, the counted write of a put),
 * commit.c (the write loop: MDB_MAP_FULL and a full disk turned into
 * eviction and a retry), record.c (the on-disk records and the
 * entry/eviction primitives inside a write transaction), hint.c (hits
 * without B-tree lookups), held.c (guards, digest hash sets, and whether
 * a pin set holds a digest), txn.c (errors, ticks, the read-transaction
 * pool); claim.c (claims on digests across processes: byte-range locks
 * on DIR/claims, beside LMDB's files).
 *
 * On-disk layout: one LMDB environment, six named databases.
 *   "meta"  digest (32 bytes) -> metadata record (record.c, versioned,
 *           XXH3-64 of itself; holds the XXH3-128 of the blob)
 *   "blob"  digest -> cubin bytes
 *   "lru"   u64 big-endian tick || digest -> empty.  Only unpinned entries
 *           are here, oldest first, so eviction deletes from the front.
 *   "stats" counter name -> u64 little-endian ("bytes", "hits", ...,
 *           "max_size": the limit, stored at creation)
 *   "pins"  set name -> pin record (pins.c: version, created, the sorted
 *           digests of the set)
 *   "pinidx" digest || set name -> empty: which sets hold a digest, so
 *           eviction and `ls` need one lookup.  Entries of a set stay in
 *           "lru"; eviction walks past them.
 * Caches made before "pins" existed get the two databases from their first
 * writer; a read-only handle on such a cache sees no pin sets.
 * A tick is CLOCK_REALTIME in nanoseconds, made strictly increasing per
 * handle; the metadata keeps the entry's tick, so its "lru" key can be found.
 */
#ifndef KW_CACHE_INTERNAL_H
#define KW_CACHE_INTERNAL_H

#include <lmdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kw_cache.h"

/* Returned by internal helpers when LMDB reported MDB_MAP_FULL; the write
 * loop turns it into eviction and a retry, or into KW_ECACHE.  Never
 * returned through kw_cache.h. */
#define KW__CACHE_EMAPFULL (-1999)

/* Returned by write_once (commit.c) when a commit could not write its
 * pages: ENOSPC, EDQUOT, or EIO, which LMDB reports for a short write to
 * a full filesystem.  The write loop evicts and retries as for
 * MDB_MAP_FULL, then reports KW_EDISKFULL.  Never returned through
 * kw_cache.h. */
#define KW__CACHE_EDISK (-1998)

#define KW__CACHE_FORMAT 1         /* "format" in "stats"; record version */
#define KW__CACHE_PENDING_MAX 4096 /* digests waiting before get flushes */
#define KW__CACHE_PENDING_CAP 8192 /* table slots: a power of two, 2 x MAX */
#define KW__CACHE_FLUSH_HITS 256   /* hits per flush transaction (flush.c) */
#define KW__CACHE_LRU_KEY 40       /* 8-byte tick + digest */
#define KW__CACHE_POOL 16          /* idle read transactions kept */
#define KW__CACHE_CORRUPT_MAX 64   /* corrupt digests queued (defer_writes) */
#define KW__CACHE_HINTS 2048       /* hint slots (hint.c) */
#define KW__CACHE_HINT_LOCKS 16    /* mutexes striped over them */

/* One digest's hits since the last flush. */
typedef struct kw__cache_hit {
    uint8_t digest[KW_CACHE_DIGEST_LEN];
    uint64_t tick; /* of the latest hit */
    uint32_t hits;
    bool used;
} kw__cache_hit;

/* The counters of "stats" that are recorded in memory first. */
typedef struct kw__cache_counts {
    uint64_t hits, misses, compiles, compile_failures;
} kw__cache_counts;

/* Hits and counters not yet written: an open-addressing table of
 * KW__CACHE_PENDING_CAP slots (NULL on a read-only handle). */
typedef struct kw__cache_pending {
    kw__cache_hit *slots;
    size_t n; /* used slots */
    kw__cache_counts cnt;
} kw__cache_pending;

/* The decoded "meta" record. */
typedef struct kw__cache_meta {
    kw_cache_info info; /* with size, pinned, hits; times in seconds */
    uint8_t sum[16];    /* XXH3-128 of the blob, canonical (big-endian) */
    uint64_t created_ns, tick; /* tick: last use, and the "lru" key */
} kw__cache_meta;

/* What one read found for a digest (hint.c): its metadata (info.pinned
 * and pin_sets include the pin sets) and the blob's address in the map,
 * both as of snapshot txnid (0: an empty slot). */
typedef struct kw__cache_hint {
    uint8_t digest[KW_CACHE_DIGEST_LEN];
    uint64_t txnid;
    const void *data;
    kw__cache_meta m;
} kw__cache_hint;

struct kw_cache {
    char *dir;   /* opts.dir, copied: named in failures of the disk */
    MDB_env *env;
    MDB_dbi meta, blob, lru, stats; /* valid for the env's lifetime */
    MDB_dbi pins, pinidx;           /* valid when has_pins */
    bool has_pins;        /* false: a read-only handle on an old cache */
    uint64_t psize;       /* LMDB page size */
    uint64_t mapsize;     /* bytes this handle mapped */
    bool read_only;
    bool nolock;          /* opened MDB_NOLOCK: no reader slot protects a
                             snapshot, so reads copy, then verify */
    bool defer_writes;
    _Atomic uint64_t last_tick; /* the last tick handed out */

    /* Reset read transactions ready to renew (NULL: empty slot).  Taken
     * and given back with atomic exchanges, so a hit takes no lock. */
    _Atomic(MDB_txn *) pool[KW__CACHE_POOL];

    /* prot_mu guards `guards`, the list of live kw_cache_guard.  Held
     * for a membership test or a list change, never across an LMDB
     * call. */
    pthread_mutex_t prot_mu;
    struct kw_cache_guard *guards;

    /* flush_mu serializes flushes and guards `spare`, the table a flush is
     * writing while gets record into `pend`.  Taken before pend_mu. */
    pthread_mutex_t flush_mu;
    kw__cache_pending spare;
    /* pend_mu guards `pend`: the table hits are recorded into and the
     * counters not yet flushed.  Never held across an LMDB call. */
    pthread_mutex_t pend_mu;
    kw__cache_pending pend;
    /* Also under pend_mu: corrupt digests a defer_writes get queued for
     * the next flush to purge. */
    uint8_t corrupt_q[KW__CACHE_CORRUPT_MAX][KW_CACHE_DIGEST_LEN];
    size_t ncorrupt;

    /* hints[i] is guarded by hint_mu[i % KW__CACHE_HINT_LOCKS]. */
    kw__cache_hint *hints;
    pthread_mutex_t hint_mu[KW__CACHE_HINT_LOCKS];

    /* Set at open, read-only after (claim.c): DIR/claims, or NULL when
     * claims are off, and then why ("" when on, or read-only). */
    char *claims_path;
    char claims_note[320];
};

#define KW__CACHE_ERRLEN 192 /* kw_cache_last_error() text, NUL included */

/* --- txn.c --- */

/* Translates an LMDB return code at the module boundary: 0 stays 0,
 * MDB_NOTFOUND becomes KW_ENOTFOUND, MDB_MAP_FULL KW__CACHE_EMAPFULL,
 * ENOMEM KW_ENOMEM, anything else KW_ECACHE.  Failures other than
 * MDB_NOTFOUND are recorded as "op: mdb_strerror(rc)" for
 * kw_cache_last_error(). */
int kw__cache_mdb(kw_cache *c, const char *op, int rc);

/* Records a failure text of our own for kw_cache_last_error() in the
 * calling thread ("put: 300 bytes do not fit: ... are pinned"). */
void kw__cache_set_error(kw_cache *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Refuses a write on a read-only handle: records "DIR is read-only" for
 * kw_cache_last_error(), so that a refusal passed on (kwarmd's replies to
 * resize and evict) has a reason, and returns KW_EROFS. */
int kw__cache_refuse_ro(kw_cache *c);

/* A fresh tick: CLOCK_REALTIME ns, above every tick handed out before.
 * The coarse one reads CLOCK_REALTIME_COARSE (a few ms of resolution, a
 * tenth of the cost): enough to order hits for LRU. */
uint64_t kw__cache_tick(kw_cache *c);
uint64_t kw__cache_tick_coarse(kw_cache *c);

/* Begins a read transaction: renews one from the pool, or begins a new
 * one.  End it with kw__cache_read_end().  0 or a translated code. */
int kw__cache_read_begin(kw_cache *c, MDB_txn **txn);

/* Ends a read transaction: resets it into the pool, or aborts it when
 * the pool is full.  Thread-safe; txn may come from another thread. */
void kw__cache_read_end(kw_cache *c, MDB_txn *txn);

/* A walk over a cursor of a read transaction (kw__cache_read_walk). */
typedef int (*kw__cache_walk_fn)(kw_cache *c, MDB_txn *txn, MDB_cursor *cur,
                                 void *arg);

/* The one read walk of cache/: begins a pooled read transaction, opens a
 * cursor on dbi (name says which in errors) and runs walk(c, txn, cur,
 * arg), then closes both.  walk's code, or the transaction's or
 * cursor's, translated.  Every value walk sees lives until it returns:
 * copy what must outlive it. */
int kw__cache_read_walk(kw_cache *c, MDB_dbi dbi, const char *name,
                        kw__cache_walk_fn walk, void *arg);

/* The map size for a limit of max_size bytes. */
uint64_t kw__cache_map_size(uint64_t max_size);

/* Forgets the calling thread's failure text if it is c's (c is being
 * freed, and another handle may get its address). */
void kw__cache_error_forget(const kw_cache *c);

/* --- cache.c --- */

/* Frees c and whatever part of it was set up; no flush. */
void kw__cache_destroy(kw_cache *c);

/* --- record.c --- */

/* Largest encoded "meta" record. */
#define KW__CACHE_META_MAX                                                 \
    (60 + 8 * KW_CACHE_MAX_FIELDS + 4 + 48 + 16 + 256 + 16 + 8)

/* Encodes m into buf (KW__CACHE_META_MAX bytes) and returns its length.
 * m->info must have passed kw__cache_info_ok(). */
size_t kw__cache_meta_encode(const kw__cache_meta *m, uint8_t *buf);

/* Decodes a record; false when its length, version, bounds or checksum are
 * wrong (the record is then corrupt). */
bool kw__cache_meta_decode(const void *buf, size_t len, kw__cache_meta *m);

/* True when info's strings are NUL-terminated inside their arrays and
 * nfields fits. */
bool kw__cache_info_ok(const kw_cache_info *info);

/* Builds the "lru" key of (tick, digest) in key (KW__CACHE_LRU_KEY). */
void kw__cache_lru_key(uint64_t tick, const uint8_t *digest, uint8_t *key);

/* Reads counter name from "stats" (0 when absent). */
int kw__cache_stat_get(kw_cache *c, MDB_txn *txn, const char *name,
                       uint64_t *v);

/* Adds delta to counter name (saturating at 0 and at UINT64_MAX). */
int kw__cache_stat_add(kw_cache *c, MDB_txn *txn, const char *name,
                       int64_t delta);

/* Reads and decodes digest's metadata.  KW_ENOTFOUND when absent,
 * KW_ECORRUPT when the record does not decode. */
int kw__cache_meta_get(kw_cache *c, MDB_txn *txn, const uint8_t *digest,
                       kw__cache_meta *m);

/* Writes m as digest's metadata. */
int kw__cache_meta_put(kw_cache *c, MDB_txn *txn, const uint8_t *digest,
                       const kw__cache_meta *m);

/* Deletes digest's blob, metadata and (when m says unpinned) "lru" key in
 * txn, and takes the blob's size off "bytes".  m is
 * NULL when the metadata did not decode: a stale "lru" key may then be
 * left, which eviction skips.  *freed (may be NULL) gets the blob's size. */
int kw__cache_drop_txn(kw_cache *c, MDB_txn *txn, const uint8_t *digest,
                       const kw__cache_meta *m, uint64_t *freed);

/* Evicts from the oldest end of "lru" until at least `count` entries and
 * `bytes` cubin bytes are gone, or no evictable entry is left; adds them
 * to "evictions".  Entries of a pin set or protected by a guard are
 * walked past, never evicted.  *evicted (may be NULL) gets the number
 * evicted. */
int kw__cache_evict_txn(kw_cache *c, MDB_txn *txn, uint64_t count,
                        uint64_t bytes, uint64_t *evicted);

/* The stored limit ("max_size" in "stats"). */
int kw__cache_max_get(kw_cache *c, MDB_txn *txn, uint64_t *max);

/* --- held.c --- */

/* True (*held) when digest is in a pin set (*nsets: how many, may be
 * NULL); false on a cache without pin sets. */
int kw__cache_in_sets(kw_cache *c, MDB_txn *txn, const uint8_t *digest,
                      bool *held, uint32_t *nsets);

/* The same with a cursor on "pinidx" the caller keeps (a walk). */
int kw__cache_in_sets_cur(kw_cache *c, MDB_cursor *cur, const uint8_t *digest,
                          bool *held, uint32_t *nsets);

/* A set of n digests, which next(arg, out) gives one at a time, as the
 * sorted array of their distinct 64-bit hashes (XXH3): *h (malloc'd, the
 * caller frees it; 8 bytes a digest, where a copy of the digests would
 * take 32) and *nh (<= n) its length.  Two digests of one hash are one
 * element.  0, or KW_ENOMEM (*h and *nh untouched). */
int kw__cache_hash_set(size_t n, kw_cache_digest_fn next, void *arg,
                       uint64_t **h, size_t *nh);

/* True when digest's hash is in the set h of nh hashes (a digest of the
 * same hash as one of the set's is in it too). */
bool kw__cache_hash_set_has(const uint64_t *h, size_t nh,
                            const uint8_t *digest);

/* A kw_cache_digest_fn over a plain array of digests, for the APIs that
 * take one: arg is a `const uint8_t (**)[KW_CACHE_DIGEST_LEN]`, a cursor
 * that starts at the array and moves one digest each call. */
void kw__cache_next_of_array(void *arg, uint8_t out[KW_CACHE_DIGEST_LEN]);

/* True when a guard of this handle protects digest.  Takes prot_mu. */
bool kw__cache_protected(kw_cache *c, const uint8_t *digest);

/* True when eviction must leave digest alone: in a pin set or
 * protected. */
int kw__cache_held(kw_cache *c, MDB_txn *txn, const uint8_t *digest,
                   bool *held);

/* --- protect.c --- */

/* Sums present entries that are pinned (flag or set) into *entries and
 * *bytes.  For kw_cache_stats_get. */
int kw__cache_pinned_totals(kw_cache *c, MDB_txn *txn, uint64_t *entries,
                            uint64_t *bytes);

/* --- commit.c --- */

/* Entries evicted in the first round of making room (commit.c doubles it
 * each round; write.c's fit_map takes batches of it). */
#define KW__CACHE_EVICT_BATCH 16

/* One step of a write transaction: 0 to commit, or a code to abort with. */
typedef int (*kw__cache_txn_fn)(kw_cache *c, MDB_txn *txn, void *arg);

/* Runs fn in a write transaction and commits it.  On MDB_MAP_FULL (in fn
 * or at commit) it aborts, evicts a batch of LRU entries (at least `need`
 * bytes) in a transaction of its own and runs fn again, a bounded number
 * of times.  Returns fn's code, KW_ENOSPC when nothing is left to evict,
 * or a translated LMDB code. */
int kw__cache_write(kw_cache *c, kw__cache_txn_fn fn, void *arg,
                    uint64_t need);

/* --- flush.c --- */

/* Allocates the pending tables of a writable handle.  0 or KW_ENOMEM. */
int kw__cache_pending_init(kw_cache *c);

/* Frees them (NULL-safe on a handle whose init failed). */
void kw__cache_pending_destroy(kw_cache *c);

/* Records a hit on digest (or a miss) for the next flush.  A hit may flush
 * when the table is past KW__CACHE_PENDING_MAX. */
void kw__cache_record_hit(kw_cache *c, const uint8_t *digest);
void kw__cache_record_miss(kw_cache *c);

/* On a read-only handle: adds the hits counted in memory for digest to
 * info (hits, last_used).  No-op on a writable handle. */
void kw__cache_overlay_hits(kw_cache *c, const uint8_t *digest,
                            kw_cache_info *info);

/* Queues a corrupt digest for the next flush (defer_writes).  Dropped
 * when the queue is full: the next get queues it again. */
void kw__cache_queue_corrupt(kw_cache *c, const uint8_t *digest);

/* Runs fn as kw__cache_write() does, and adds the counters recorded in
 * memory so far (hits, misses, compiles, compile failures) to "stats" in
 * the same transaction, so a put commits them with its entry and a
 * writer killed later loses only what it counted after its last put.
 * Holds flush_mu throughout, as a flush does, so kw_cache_stats_get()
 * never sees a counter both in memory and on disk, or in neither; when
 * the write fails the counters go back to memory. */
int kw__cache_write_counted(kw_cache *c, kw__cache_txn_fn fn, void *arg,
                            uint64_t need);

/* --- hint.c --- */

/* Allocates and frees the hint table.  0 or KW_ENOMEM. */
int kw__cache_hints_init(kw_cache *c);
void kw__cache_hints_destroy(kw_cache *c);

/* The id of the last committed transaction (0 when LMDB cannot say),
 * with an acquire fence after the read. */
uint64_t kw__cache_last_txnid(kw_cache *c);

/* Copies digest's hint into *out when it is of snapshot txnid: all of it
 * with with_meta, else txnid, data, m.info.size and m.sum.  False when
 * there is none for that snapshot. */
bool kw__cache_hint_get(kw_cache *c, const uint8_t *digest, uint64_t txnid,
                        kw__cache_hint *out, bool with_meta);

/* Records what snapshot txnid holds for digest (m as the hint keeps it),
 * unless the slot holds a newer hint of the same digest. */
void kw__cache_hint_put(kw_cache *c, const uint8_t *digest, uint64_t txnid,
                        const void *data, const kw__cache_meta *m);

/* --- claim.c --- */

/* Creates DIR/claims for a writable handle and records its path, or why
 * claims are off (never fails: a cache works without claims). */
void kw__cache_claims_init(kw_cache *c, const char *dir);
void kw__cache_claims_destroy(kw_cache *c);

/* --- read.c --- */

/* Write step removing the entry of digest (arg) if it is still corrupt. */
int kw__cache_purge_fn(kw_cache *c, MDB_txn *txn, void *arg);

#endif /* KW_CACHE_INTERNAL_H */
