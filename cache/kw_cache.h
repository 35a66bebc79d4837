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
 * Counters after a crash: entries, bytes and evictions change in the
 * transaction that changes the entries, and "compiles" is counted in the
 * transaction that stores the compiled entry (kw_cache_item.compiled).
 * Hits, misses and compile failures are counted in memory and written
 * by the next write transaction of the handle (a put carries them, or a
 * flush); a writer killed (SIGKILL, a crash, an unhandled Ctrl-C) loses
 * those it counted after its last commit, and per-entry hit counts and
 * last-used times since its last flush.  So on a cache that only
 * compiles (no fleet tier, no evictions), entries == compiles however
 * its writers ended.
 *
 * The size limit (max_size) is stored in the cache when it is created and
 * every opener uses the stored value; only kw_cache_resize() changes it.
 * Nothing is evicted for size while it is pinned (per entry, or in a named
 * pin set stored in the cache) or protected (in memory, by this process:
 * kw_cache_protect()).
 *
 * Read-only caches serve: a directory the process cannot write, a
 * read-only mount, or opts.read_only.  Such a handle never writes; hits,
 * hit counts and last-used times are kept in memory only.
 *
 * Read transactions are pooled per handle (reset, then renewed), so a hit
 * costs no reader-slot lock, and while nothing is committed a hit reuses
 * what the last read of its digest found instead of searching the
 * B-trees (always checking the blob's XXH3-128); kw_cache_borrow() hands
 * out a pointer into the map itself.
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
#define KW_CACHE_MAX_PIN_NAME 64        /* bytes of a pin set's name, no NUL */
#define KW_CACHE_MAX_PIN_DIGESTS 16384  /* digests in one pin set */
#define KW_CACHE_PREFIX_MIN 8           /* hex digits of a digest prefix */
#define KW_CACHE_HEX_LEN 65             /* 64 hex digits and a NUL */

typedef struct kw_cache kw_cache;

typedef struct kw_cache_opts {
    const char *dir;   /* created (mode 0700) if missing, unless read_only */
    uint64_t max_size; /* cubin bytes kept, used only when this open creates
                          the cache (or finds an old one with no stored
                          limit); every other open uses the stored limit.
                          0: KW_CACHE_DEFAULT_SIZE.  Outside
                          [KW_CACHE_MIN_SIZE, KW_CACHE_MAX_SIZE]: KW_EINVAL
                          (checked unless read_only) */
    bool read_only;    /* never write: puts fail with KW_EROFS, hits are
                          counted in memory only */
    bool auto_read_only; /* when the directory or its files are not
                          writable (another user's cache, a read-only
                          mount), open read-only instead of failing;
                          kw_cache_is_read_only() tells which happened */
    bool defer_writes; /* gets never run a write transaction (a daemon's
                          loop thread): no inline flush when many hits are
                          pending, and a corrupt entry is reported
                          (KW_ECORRUPT) and queued; the next
                          kw_cache_flush() removes it */
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
    uint64_t hits;      /* as of the last flush (read-only handles add the
                           hits they counted in memory) */
    bool pinned;        /* never evicted for size: pinned by kw_cache_pin()
                           or held by a named pin set */
    uint32_t pin_sets;  /* named pin sets holding it (kw_cache_pin_names) */
} kw_cache_info;

/* bytes counts cubin bytes (what max_size limits); max_size is the limit
 * stored in the cache.  pinned_* count present entries pinned either way
 * (each once).  A read-only handle's hits and misses include what it
 * counted in memory. */
typedef struct kw_cache_stats {
    uint64_t entries, bytes, max_size;
    uint64_t hits, misses, compiles, compile_failures, evictions, corrupt;
    uint64_t pinned_entries, pinned_bytes;
    bool read_only; /* this handle is read-only */
} kw_cache_stats;

/* Opens (creating if needed) the cache in opts->dir, runs mdb_reader_check
 * to clear stale readers of dead processes.  A writer that finds the cache
 * over its stored limit trims it (LRU, unpinned entries) before returning.
 * Read-only opens work without write access: when LMDB's lock file cannot
 * be opened for writing (a read-only mount, another user's directory) the
 * environment is opened MDB_RDONLY|MDB_NOLOCK.  The risk of NOLOCK: this
 * process takes no reader slot, so a writer elsewhere may reuse the pages
 * it is reading; every read therefore copies the bytes out first and
 * verifies the copy (kw_cache_borrow included), so the checksums report
 * KW_ECORRUPT rather than serve bad bytes, but read-only handles do not
 * remove entries.  Such a cache is
 * meant to have no writer (an image layer, a shipped directory).
 * Returns 0 and *out, or a negative code (KW_ECACHE, -errno, KW_EINVAL)
 * with a one-line reason naming the directory in err.  *out is untouched
 * on error. */
int kw_cache_open(kw_cache **out, const kw_cache_opts *opts, char *err,
                  size_t errlen);

/* Flushes recorded hits and closes.  NULL is a no-op.  No other call on c
 * may be in flight, every view (kw_cache_borrow) must be released and
 * every guard (kw_cache_protect) given back first. */
void kw_cache_close(kw_cache *c);

/* True when c never writes (opts.read_only, or auto_read_only fell back). */
bool kw_cache_is_read_only(const kw_cache *c);

/* True when asked (a limit given to this open; 0: none given) is not the
 * limit in force: the one stored in the cache, which every opener uses and
 * only kw_cache_resize() changes.  *stored (may be NULL) gets that limit.
 * For the one warning a command prints ("--max-size X not applied"); false
 * when the limit cannot be read. */
bool kw_cache_limit_differs(kw_cache *c, uint64_t asked, uint64_t *stored);

/* Stores a new size limit in the cache (every handle, in every process,
 * uses it from its next write) and, when the cache is now over it, evicts
 * LRU entries that are neither pinned nor protected.  Lowering takes
 * effect at once everywhere.  Raising it past what a handle mapped at open
 * (about twice its limit then) is fully used by that handle only after it
 * is reopened: until then it evicts when its map fills, before the new
 * limit is reached.  (Moving a live map would need every reader stopped.)
 * Returns 0; KW_EINVAL (outside [KW_CACHE_MIN_SIZE, KW_CACHE_MAX_SIZE]);
 * KW_ENOSPC when pinned and protected entries alone exceed max_size
 * (nothing changes; kw_cache_last_error() says how many bytes they hold);
 * KW_EROFS; KW_ECACHE. */
int kw_cache_resize(kw_cache *c, uint64_t max_size);

/* Stores blob under digest with info, unless an entry is already there
 * (then *stored = false and nothing changes).  pin marks it never evicted.
 * info may be NULL (empty metadata); its strings must be NUL-terminated
 * inside their arrays and nfields <= KW_CACHE_MAX_FIELDS.  stored may be
 * NULL.  Evicts LRU unpinned entries first when the size limit requires,
 * and when LMDB's map fills before it (many small entries).
 * Never evicts an entry that is pinned (either way) or protected by a
 * guard of this process.
 * Returns 0; KW_ENOSPC when even evicting every other entry cannot make
 * room (nothing is evicted then; kw_cache_last_error() names the bytes
 * needed beside the pinned and protected ones and says to raise the limit
 * with `kwarm resize`); KW_EROFS (read-only handle); KW_EINVAL (empty
 * blob, blob over KW_CACHE_MAX_BLOB, bad info); KW_ECACHE. */
int kw_cache_put(kw_cache *c, const uint8_t digest[KW_CACHE_DIGEST_LEN],
                 const kw_cache_info *info, const void *blob, size_t len,
                 bool pin, bool *stored);

/* One put of kw_cache_put_many(); every pointer borrowed for the call. */
typedef struct kw_cache_item {
    const uint8_t *digest;      /* KW_CACHE_DIGEST_LEN bytes */
    const kw_cache_info *info;  /* may be NULL */
    const void *blob;
    size_t len;
    bool pin;
    bool compiled; /* blob was compiled for this put: "compiles" counts it
                      in the write transaction that stores the entry (or
                      finds it already stored by a racing writer), so a
                      crash never leaves entries without their compiles;
                      a put that fails counts nothing */
} kw_cache_item;

/* Stores n entries in one write transaction (one commit, one fsync: a
 * group commit), each as kw_cache_put() would, an entry already there
 * left alone.  rcs[i] gets item i's code.  When the transaction as a whole
 * fails (an item that cannot fit, say), each item is retried alone, so
 * every item gets its own answer.  Returns 0, or KW_ENOMEM with nothing
 * tried (rcs untouched). */
int kw_cache_put_many(kw_cache *c, const kw_cache_item *items, size_t n,
                      int *rcs);

/* Fetches the entry: *blob is a new malloc'd copy (the caller frees it),
 * *len its size, *info (may be NULL) its metadata.  The checksum is
 * verified on the copy handed out; the hit is recorded for the next flush.
 * When 4096 distinct digests are waiting, the call flushes them first (one
 * write transaction), unless another thread is flushing or the handle has
 * defer_writes or is read-only.
 * Returns 0; KW_ENOTFOUND (a miss, counted); KW_ECORRUPT (the entry
 * failed its checksum: it has been removed and counted; with defer_writes
 * it is queued for the next kw_cache_flush(); a read-only handle leaves
 * it; the caller should recompile); KW_ENOMEM; KW_ECACHE.  On error *blob
 * is NULL. */
int kw_cache_get(kw_cache *c, const uint8_t digest[KW_CACHE_DIGEST_LEN],
                 void **blob, size_t *len, kw_cache_info *info);

/* As kw_cache_get() into a caller buffer of cap bytes (no allocation: the
 * hot path of a daemon).  KW_ENOSPC, with *len the size needed, when it
 * does not fit. */
int kw_cache_get_into(kw_cache *c, const uint8_t digest[KW_CACHE_DIGEST_LEN],
                      void *buf, size_t cap, size_t *len, kw_cache_info *info);

/* A borrowed, zero-copy view of one entry (kw_cache_borrow).  data points
 * into LMDB's map and holds len bytes; the _-prefixed fields are private. */
typedef struct kw_cache_view {
    const void *data;
    size_t len;
    kw_cache *_c;
    void *_txn;
    void *_own; /* a lockless handle's copy (see kw_cache_borrow) */
} kw_cache_view;

/* Looks the entry up and verifies its checksum on the map's bytes, without
 * copying; records the hit as kw_cache_get() does.  On 0, v->data is valid
 * until kw_cache_release(v): the view holds a read transaction (one
 * reader slot).  Writers, puts and the map's growth are not blocked while
 * it is held, but pages freed meanwhile are not reused until it is
 * released, so hold views briefly (a long-held one can make puts evict
 * more or fail with KW_ECACHE).  A view may be released from another
 * thread than the one that borrowed it, if the two synchronize.  The map
 * is mapped read-only: writing through data faults.
 * info (may be NULL) gets the metadata.  Returns as kw_cache_get(); on
 * error v holds nothing and needs no release (releasing is harmless).
 * A handle opened MDB_NOLOCK (kw_cache_open) has no reader slot to keep
 * a writer elsewhere from reusing the pages: there the view is a copy,
 * made first, then verified (kw_cache_get), and holds no transaction, so
 * no byte that reaches the caller went unchecked. */
int kw_cache_borrow(kw_cache *c, const uint8_t digest[KW_CACHE_DIGEST_LEN],
                    kw_cache_view *v, kw_cache_info *info);

/* Ends a view (its data is then invalid) and zeroes *v.  NULL, or a view
 * that holds nothing, is a no-op. */
void kw_cache_release(kw_cache_view *v);

/* True when an entry exists (no checksum, no hit recorded); false on any
 * LMDB failure too. */
bool kw_cache_contains(kw_cache *c, const uint8_t digest[KW_CACHE_DIGEST_LEN]);

/* Removes one entry, pinned or not (pin sets keep naming its digest, so a
 * later put of it is pinned again).  0 or KW_ENOTFOUND, KW_EROFS,
 * KW_ECACHE. */
int kw_cache_remove(kw_cache *c, const uint8_t digest[KW_CACHE_DIGEST_LEN]);

/* Sets or clears an entry's own pin flag (pin sets are apart: an entry in a
 * set stays pinned).  0 or KW_ENOTFOUND, KW_EROFS, KW_ECACHE. */
int kw_cache_pin(kw_cache *c, const uint8_t digest[KW_CACHE_DIGEST_LEN],
                 bool pinned);

/* --- Named pin sets (stored in the cache) --- */

/* True when name may name a pin set: 1..KW_CACHE_MAX_PIN_NAME bytes of
 * [A-Za-z0-9._:@+-].  Pure (no cache needed), so a command can refuse a
 * bad name before it does any work. */
bool kw_cache_pin_name_valid(const char *name);

/* Records the set of n digests under name, replacing a set of that name,
 * in one write transaction.  Digests need not be present: one stored later
 * is pinned from then on.  Duplicates count once.  Entries of any set are
 * never evicted for size.  name: 1..KW_CACHE_MAX_PIN_NAME bytes of
 * [A-Za-z0-9._:@+-].  Returns 0; KW_EINVAL (bad name, n == 0 or over
 * KW_CACHE_MAX_PIN_DIGESTS, digests NULL); KW_EROFS; KW_ECACHE. */
int kw_cache_pin_set(kw_cache *c, const char *name,
                     const uint8_t (*digests)[KW_CACHE_DIGEST_LEN], size_t n);

/* Deletes the set name (its entries stay, evictable unless pinned
 * otherwise).  0; KW_ENOTFOUND (no such set); KW_EINVAL; KW_EROFS;
 * KW_ECACHE. */
int kw_cache_unpin_set(kw_cache *c, const char *name);

/* One pin set as kw_cache_pins_foreach() reports it. */
typedef struct kw_cache_pin_info {
    char name[KW_CACHE_MAX_PIN_NAME + 1];
    uint64_t digests; /* digests recorded in the set */
    uint64_t entries; /* of those, entries present now */
    uint64_t bytes;   /* cubin bytes of the present ones */
    uint64_t created; /* Unix seconds of the kw_cache_pin_set() */
} kw_cache_pin_info;

/* Calls fn for every pin set, in name order, in one read transaction (fn
 * must not call back into c; p is valid during the call only).  Stops
 * when fn returns non-zero and returns that value; else 0, or
 * KW_ECACHE. */
typedef int (*kw_cache_pin_fn)(const kw_cache_pin_info *p, void *arg);
int kw_cache_pins_foreach(kw_cache *c, kw_cache_pin_fn fn, void *arg);

/* Writes the names of the pin sets holding digest into buf (cap bytes),
 * comma-separated, in name order, NUL-terminated ("" when none), and their
 * number into *count (may be NULL).  May be called from a
 * kw_cache_foreach() callback.  0; KW_ENOSPC when buf is too small (buf
 * then holds the names that fit, whole); KW_EINVAL; KW_ECACHE. */
int kw_cache_pin_names(kw_cache *c, const uint8_t digest[KW_CACHE_DIGEST_LEN],
                       char *buf, size_t cap, size_t *count);

/* --- In-memory protection (a warm never evicts its own deployment) --- */

/* Writes the next digest of a set into out (kw_cache_protect_each,
 * kw_cache_plan_each): called exactly n times for a set of n digests, on
 * the caller's thread, before the call that takes it returns. */
typedef void (*kw_cache_digest_fn)(void *arg, uint8_t out[KW_CACHE_DIGEST_LEN]);

typedef struct kw_cache_guard kw_cache_guard;

/* Protects n digests (copied; present or not) from eviction by this
 * handle until kw_cache_unprotect(*out): puts that would need to evict
 * them fail with KW_ENOSPC instead.  Not stored, and not seen by other
 * processes.  Guards may overlap.  Thread-safe.  Returns 0 and *out;
 * KW_EINVAL (digests NULL with n > 0); KW_ENOMEM. */
int kw_cache_protect(kw_cache *c,
                     const uint8_t (*digests)[KW_CACHE_DIGEST_LEN], size_t n,
                     kw_cache_guard **out);

/* kw_cache_protect() of n digests that next(arg, out) gives one at a
 * time: a caller whose set is not an array of digests (a packed key set)
 * makes none.  A guard holds 8 bytes a digest (a hash of each: a digest
 * of the same hash as a protected one is protected too, never the
 * reverse).  Returns as kw_cache_protect() (KW_EINVAL: next NULL with
 * n > 0). */
int kw_cache_protect_each(kw_cache *c, size_t n, kw_cache_digest_fn next,
                          void *arg, kw_cache_guard **out);

/* Drops the protection and frees g.  NULL is a no-op.  Every guard must be
 * given back before kw_cache_close(). */
void kw_cache_unprotect(kw_cache_guard *g);

/* What storing a set of digests needs, for a caller to fail early, before
 * writing anything ("needs N bytes, the limit is M"). */
typedef struct kw_cache_plan {
    uint64_t present;      /* distinct digests of the set already stored */
    uint64_t present_bytes;/* their cubin bytes */
    uint64_t held_bytes;   /* bytes of other entries that are pinned (either
                              way) or protected by this process: never
                              evicted to make room for the set */
    uint64_t max_size;     /* the stored limit */
    uint64_t available;    /* max_size - held_bytes - present_bytes (0 when
                              negative): room for the digests not stored */
} kw_cache_plan;

/* Fills *plan for the n digests that next(arg, out) gives one at a time
 * (duplicates count once), in one read transaction.  Works read-only.
 * The set is held as a 64-bit hash of each digest (8 bytes a digest, no
 * copy of the digests), and an entry counts as the set's when its hash
 * is one of the set's: two digests of one hash count once, so with
 * probability about N^2 / 2^65 (N digests between the set and the
 * cache) an entry not in the set counts as present, which makes the
 * estimate off by that one entry.  0; KW_EINVAL (next NULL with n > 0);
 * KW_ENOMEM; KW_ECACHE. */
int kw_cache_plan_each(kw_cache *c, size_t n, kw_cache_digest_fn next,
                       void *arg, kw_cache_plan *plan);

/* kw_cache_plan_each() of an array of n digests (KW_EINVAL: digests NULL
 * with n > 0). */
int kw_cache_plan_get(kw_cache *c,
                      const uint8_t (*digests)[KW_CACHE_DIGEST_LEN], size_t n,
                      kw_cache_plan *plan);

/* --- Claims across processes (a compile per key between writers) --- */

typedef struct kw_cache_claim kw_cache_claim;

/* Asked while a claim waits: true stops the wait. */
typedef bool (*kw_cache_stop_fn)(void *arg);

/* Claims digest for the caller against every other claim of it on this
 * cache directory, in any process (this one included): a byte-range lock
 * on DIR/claims (an open file description's, F_OFD_SETLK) that the
 * kernel releases when the holder dies, SIGKILL included.  A writer
 * claims a missing key before compiling it, checks the cache again once
 * it holds the claim (another holder may have stored it meanwhile), and
 * keeps the claim until the entry is committed.  wait: poll until the
 * claim is free, asking stop(arg) (may be NULL) between tries.
 * Returns 0 with *out the claim, or with *out NULL when this handle has
 * no claims (read-only, or DIR/claims could not be made:
 * kw_cache_claims_note()) or the claim could not be taken for a reason
 * other than a holder (EMFILE, ENOLCK): the caller then goes on
 * unclaimed; -EAGAIN when another holds it and wait is false;
 * -ECANCELED when stop said so; KW_ENOMEM; KW_EINVAL.  Thread-safe. */
int kw_cache_claim_take(kw_cache *c,
                        const uint8_t digest[KW_CACHE_DIGEST_LEN], bool wait,
                        kw_cache_stop_fn stop, void *arg,
                        kw_cache_claim **out);

/* Releases and frees a claim (NULL is a no-op).  May be called from any
 * thread, and after kw_cache_close() of its handle. */
void kw_cache_claim_drop(kw_cache_claim *cl);

/* Why a writable handle takes no claims (DIR/claims could not be
 * created: "DIR/claims: Permission denied: ..."), for a one-line note;
 * NULL when it takes them, or when the handle is read-only.  Valid until
 * kw_cache_close(). */
const char *kw_cache_claims_note(const kw_cache *c);

/* --- Digest prefixes --- */

/* Resolves a hex prefix (upper or lower case) of KW_CACHE_PREFIX_MIN..64
 * digits to the one stored digest it starts, into out.  Returns 0;
 * KW_EAMBIGUOUS when several match (candidates, cap bytes, may be NULL,
 * gets their full hex digits, newline-separated, NUL-terminated, as many
 * as fit); KW_ENOTFOUND when none; KW_EINVAL when shorter than
 * KW_CACHE_PREFIX_MIN, longer than 64 or not hex; KW_ECACHE. */
int kw_cache_find_prefix(kw_cache *c, const char *hex,
                         uint8_t out[KW_CACHE_DIGEST_LEN], char *candidates,
                         size_t cap);

/* Counters the cache cannot see by itself (compiles are the caller's). */
typedef enum kw_cache_counter {
    KW_CACHE_COMPILES, /* a compile whose result is not put here; one that
                          is put counts through kw_cache_item.compiled */
    KW_CACHE_COMPILE_FAILURES,
} kw_cache_counter;

/* Adds n to a counter, in memory: the next put or flush of c writes it
 * (a crash before then loses it).  Thread-safe. */
void kw_cache_count(kw_cache *c, kw_cache_counter which, uint64_t n);

/* Writes recorded hits, misses and counters in one transaction, then
 * removes the corrupt entries that gets of a defer_writes handle queued
 * (each checked again first, so a good copy stored meanwhile stays).
 * 0 or KW_ECACHE (they are then kept for the next flush); a read-only
 * cache returns 0 and keeps its counts in memory. */
int kw_cache_flush(kw_cache *c);

/* Current statistics (persisted counters plus those not yet flushed).
 * Waits for a flush in progress, so nothing is counted twice or missed.
 * pinned_entries and pinned_bytes walk the metadata of every entry (0.5
 * to 1 µs each on the 2-core machine: 10 to 20 ms for 20,000): call it on
 * a timer or a request, not per hit, and not on a thread that must never
 * wait for a write transaction (the flush it may wait for is one).  0 or KW_ECACHE. */
int kw_cache_stats_get(kw_cache *c, kw_cache_stats *out);

/* Calls fn for every entry, in digest order, inside one read transaction
 * (fn must not call back into c, except kw_cache_pin_names()).  digest and info are valid during the
 * call only.  An entry whose metadata fails its check is skipped (a get
 * reports and removes it).  Stops when fn returns non-zero and returns that
 * value; else 0, or KW_ECACHE.  While fn runs, LMDB cannot reuse pages that
 * writers free, so keep it short: a long one can make puts fail with
 * KW_ECACHE (MDB_MAP_FULL) until it returns. */
typedef int (*kw_cache_each_fn)(const uint8_t digest[KW_CACHE_DIGEST_LEN],
                                const kw_cache_info *info, void *arg);
int kw_cache_foreach(kw_cache *c, kw_cache_each_fn fn, void *arg);

/* The same from the first entry whose digest is >= from (NULL: the
 * first), so that a long walk can be taken in pages, each its own short
 * read transaction. */
int kw_cache_foreach_from(kw_cache *c, const uint8_t *from,
                          kw_cache_each_fn fn, void *arg);

/* The text of the last failure on c in the calling thread, naming the
 * LMDB call ("mdb_put(blob): MDB_MAP_FULL: Environment mapsize limit
 * reached"), or "" when there was none.  Kept per thread, so a failure on
 * another thread never rewrites it; valid until the calling thread's next
 * failing call on a cache. */
const char *kw_cache_last_error(const kw_cache *c);

#endif /* KW_CACHE_H */
