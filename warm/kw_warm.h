/* kw_warm.h: the warm pipeline (prefix kw_warm_).
 *
 * The one path from compile keys to cached cubins, used by kwarmd and by
 * `kwarm prewarm` alike.  For each key of a job:
 *
 *   1. local lookup in the LMDB cache (cache/): a hit is reported at once;
 *   2. a miss joins the key's flight if one is under way (single-flight,
 *      found through a hash table keyed by digest, constant time per key),
 *      or starts one;
 *   3. a flight first asks the fleet tier (cache/kw_remote.h) when one is
 *      configured: an entry there is backfilled locally ("remote hit");
 *   4. otherwise it is compiled by a worker process (warm/pool.h: the
 *      kwarm-compile helper, with a time and a memory limit), written back
 *      to the fleet tier and stored: the store stage commits every result
 *      ready at that moment in one transaction (group commit, up to
 *      store_batch), each entry whole (blob, metadata, checksum);
 *   5. every key gets exactly one result: hit, remote hit, compiled, failed
 *      (with the code and the NVRTC log or the worker's reason) or
 *      cancelled (the pipeline or the job was stopped first).
 *
 * Results are delivered by calling the job's callback on one of warm's own
 * threads.  Callbacks of one job never run concurrently and the one with
 * `last` set is the job's final call, so a job's owner needs no lock for
 * the job's own state.  A callback must be short and must not call into
 * the same kw_warm except kw_warm_stats().
 *
 * Counters (kw_warm_stats) have one meaning each; README.md lists them.
 *
 * Threads: kw_warm_open() starts one intake thread (lookups) and `jobs`
 * compile threads, each driving one worker process at a time.  The intake
 * takes the jobs in turn, KW_WARM_CHUNK keys of one at a time, so a small
 * job (a get's one key) never waits behind all of a million-key warmup's
 * lookups.  Every function is thread-safe unless noted.
 */
#ifndef KW_WARM_H
#define KW_WARM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "kw_cache.h"
#include "kw_keys.h"
#include "kw_remote.h"

#define KW_WARM_LOG_MAX (64u * 1024u) /* NVRTC log bytes kept per failure */
#define KW_WARM_CHUNK 256u /* keys one job is looked up at a time */

typedef struct kw_warm kw_warm;
typedef struct kw_warm_job kw_warm_job;

typedef struct kw_warm_opts {
    kw_cache *cache;     /* borrowed; must outlive the kw_warm */
    kw_remote *remote;   /* borrowed fleet tier, or NULL */
    unsigned jobs;       /* compile worker processes; 0: the cores */
    unsigned compile_timeout_ms; /* per compile; 0: 120 s */
    uint64_t mem_limit;  /* bytes per worker; 0: 4 GiB */
    const char *helper;  /* kwarm-compile; NULL: found beside the program */
    unsigned store_batch; /* compiled keys stored by one transaction at
                             most (group commit); 0: 64; 1: one commit
                             per key */
    bool read_only;      /* the cache is read-only: a miss is never
                            compiled, it fails with KW_EROFS ("not cached
                            (read-only cache)") */
    bool verify_hits;    /* a hit is checked in place and counted (a
                            corrupt entry is removed and compiled again);
                            else a hit is the entry's existence */
} kw_warm_opts;

typedef enum kw_warm_status {
    KW_WARM_HIT,        /* in the local cache */
    KW_WARM_REMOTE_HIT, /* fetched from the fleet tier, now local */
    KW_WARM_COMPILED,   /* compiled and stored */
    KW_WARM_FAILED,     /* rc and log say why */
    KW_WARM_CANCELLED,  /* not attempted: the pipeline or job stopped */
} kw_warm_status;

/* "hit", "remote_hit", "compiled", "failed", "cancelled". */
const char *kw_warm_status_name(kw_warm_status s);

/* One key's result, borrowed for the callback's duration. */
typedef struct kw_warm_result {
    kw_warm_job *job;      /* the job (kw_warm_job_cancel() may be
                              called on it from the callback) */
    size_t index;          /* the key's index in the job */
    const kw_keys_key *key; /* borrowed for the callback only (unpacked) */
    kw_warm_status status;
    int rc;                /* KW_WARM_FAILED: the code; else 0 */
    const char *log;       /* KW_WARM_FAILED: the NVRTC log (at most
                              KW_WARM_LOG_MAX bytes) or the reason; or NULL */
    bool last;             /* the job's final result */
    bool more;             /* another result of this job follows at once
                              from the same thread: a streaming caller can
                              batch until it sees more == false */
} kw_warm_result;

typedef void (*kw_warm_result_fn)(const kw_warm_result *r, void *arg);

/* True for a key that compiled but could not be stored for lack of room:
 * the cache's disk (KW_EDISKFULL) or its limit (KW_ENOSPC).  Every such
 * key of a run has one cause, so callers say it once per run. */
bool kw_warm_result_unstored(const kw_warm_result *r);

/* Job flags. */
#define KW_WARM_PURGE 1u   /* the caller saw a corrupt entry: purge pending
                              removals (kw_cache_flush) before storing */
#define KW_WARM_PROTECT 2u /* no put of any job evicts this job's entries
                              while it runs (kw_cache_protect) */

/* The compile-time histogram: KW_WARM_COMPILE_BUCKETS upper bounds in
 * seconds (kw_warm_compile_bounds()), then +Inf. */
#define KW_WARM_COMPILE_BUCKETS 13

/* The bounds, ascending (a static array). */
const double *kw_warm_compile_bounds(void);

/* Counters since kw_warm_open(), and gauges of what runs now. */
typedef struct kw_warm_stats {
    uint64_t keys;            /* keys submitted */
    uint64_t hits;            /* found in the local cache */
    uint64_t misses;          /* not found locally (= joined + flights) */
    uint64_t joined;          /* misses that joined a flight under way */
    uint64_t remote_hits;     /* flights the fleet tier resolved */
    uint64_t compiles;        /* flights compiled and stored */
    uint64_t compile_failures;/* flights whose compile failed */
    uint64_t store_failures;  /* compiled, but the put failed */
    uint64_t writebacks_dropped; /* compiled, not written back to the
                                    fleet: the write-back queue was full */
    uint64_t cancelled;       /* keys reported cancelled */
    uint64_t queued;          /* gauge: flights waiting for a worker */
    uint64_t compiling;       /* gauge: flights on a worker now */
    uint64_t jobs_active;     /* gauge: jobs with results still to come */
    uint64_t writebacks_queued; /* gauge: fleet write-backs and lease
                                   releases not yet done */
    /* Per family (kw_k_family): flights compiled and stored, compile
     * failures, fleet hits; each sums to compiles, compile_failures,
     * remote_hits. */
    uint64_t family_compiles[KW_K_NFAMILIES];
    uint64_t family_failures[KW_K_NFAMILIES];
    uint64_t family_remote_hits[KW_K_NFAMILIES];
    /* Seconds of every worker compile that ran to an end (compiled or
     * failed; not cancelled): per bucket (not cumulative; the last is
     * past the last bound), and their sum. */
    uint64_t compile_buckets[KW_WARM_COMPILE_BUCKETS + 1];
    double compile_seconds;
} kw_warm_stats;

/* Starts the pipeline: the worker processes (a missing or unusable helper
 * fails here with the reason in err, never later) and warm's threads.
 * Returns 0 and *out, or a negative code; *out untouched on error. */
int kw_warm_open(kw_warm **out, const kw_warm_opts *o, char *err,
                 size_t errlen);

/* Submits keys[0..n) (copied, packed: about 3 bytes a key; n >= 1).
 * fn(result, arg) is called once per key on warm's threads, never inside
 * this call.  *job (may be NULL) gets a handle for kw_warm_job_cancel(),
 * which the caller must give back with kw_warm_job_release() (before or
 * after the last callback).  Returns 0,
 * KW_EINVAL (n is 0), KW_ENOMEM, or -ECANCELED once stopping. */
int kw_warm_submit(kw_warm *w, const kw_keys_key *keys, size_t n,
                   unsigned flags, kw_warm_result_fn fn, void *arg,
                   kw_warm_job **job);

/* The same for a packed set (kw_keys_derive_packed), without a copy:
 * takes what *keys holds (leaving it empty) when it returns 0; on any
 * error *keys is still the caller's.  The job keeps its keys packed and
 * unpacks KW_WARM_CHUNK at a time as it looks them up, and its guard
 * (KW_WARM_PROTECT) holds 8 bytes a key: a warmup of 480,348 keys holds
 * about 12 MB while it runs. */
int kw_warm_submit_packed(kw_warm *w, kw_keys_packed *keys, unsigned flags,
                          kw_warm_result_fn fn, void *arg, kw_warm_job **job);

/* kw_warm_pin() of job's keys, into the cache job's pipeline works on;
 * valid until the handle is released. */
int kw_warm_job_pin(const kw_warm_job *job, const char *name, char *err,
                    size_t errlen);

/* Cancels what of job is not yet compiling: its remaining keys are
 * reported cancelled (a flight others wait for still runs for them), a
 * paused job included; those not yet looked up come without a digest
 * (zeros: the owner asked for no more of them).  Harmless after the
 * job's last callback. */
void kw_warm_job_cancel(kw_warm_job *job);

/* Pauses job's lookups (a caller whose reader is slow): the intake
 * leaves the job after its current chunk until kw_warm_job_resume().
 * Results of flights already under way still arrive.  May be called from
 * the job's callback. */
void kw_warm_job_pause(kw_warm_job *job);

/* Resumes a paused job (harmless when it is not). */
void kw_warm_job_resume(kw_warm_job *job);

/* Gives back the handle kw_warm_submit() returned.  NULL is a no-op. */
void kw_warm_job_release(kw_warm_job *job);

/* Begins stopping, without waiting: new submits fail, running worker
 * processes are killed, every key not yet settled is reported cancelled,
 * promptly (well under a second for 100,000 queued keys).  Callbacks keep
 * coming until every job got its last; kw_warm_close() waits for that. */
void kw_warm_cancel(kw_warm *w);

/* Counters and gauges now. */
void kw_warm_stats_get(kw_warm *w, kw_warm_stats *out);

/* Cancels (as kw_warm_cancel), waits for every job's final callback, joins
 * the threads, reaps the workers and frees w.  NULL is a no-op. */
void kw_warm_close(kw_warm *w);

/* Checks, before anything is written, that the keys can fit in the
 * cache beside what is pinned: fails when the bytes of the keys already
 * cached, plus an estimate for the missing ones (the cache's average entry
 * each), plus the pinned (and protected) bytes of other entries exceed the
 * limit.  Returns 0, or KW_ENOSPC with a message in err naming the bytes
 * needed and how to raise the limit; KW_ENOMEM; KW_ECACHE. */
int kw_warm_plan_check(kw_cache *c, const kw_keys_key *keys, size_t n,
                       char *err, size_t errlen);

/* The same for a packed set. */
int kw_warm_plan_check_packed(kw_cache *c, const kw_keys_packed *keys,
                              char *err, size_t errlen);

/* Records the digests of keys as the pin set name (kw_cache_pin_set).
 * Returns 0 or the cache's code, with a message in err. */
int kw_warm_pin(kw_cache *c, const char *name, const kw_keys_key *keys,
                size_t n, char *err, size_t errlen);

/* ---- cache administration: the documents of kwarm ls, evict, pins,
 * unpin and resize, shared by the CLI (--cache) and kwarmd (--socket).
 * Each builds a new cJSON document, the caller's to cJSON_Delete(). */

/* Which entries ls and evict take; every given criterion must hold. */
typedef struct kw_warm_filter {
    const char *family;    /* NULL: any */
    const char *pin_name;  /* NULL: any; else held by this pin set */
    const uint8_t *digest; /* NULL: any */
    bool unpinned;         /* only entries no pin holds */
    uint64_t before;       /* 0: any; else last used at or before (Unix s) */
} kw_warm_filter;

/* {"entries": [...], "count", "bytes"} of c's entries that pass f.
 * 0, KW_ENOMEM or the cache's code. */
int kw_warm_ls(kw_cache *c, const kw_warm_filter *f, cJSON **out);

/* One page of kw_warm_ls(): *entries gets a new array of at most max
 * entries that pass f, from the first digest >= from (32 bytes; zeros:
 * the start), *bytes their sizes; *more says whether entries are left,
 * and from is then where the next page starts.  Each page is its own
 * read transaction: a long listing holds no snapshot between pages, and
 * shows entries added or removed meanwhile or not, never twice.  0,
 * KW_ENOMEM or the cache's code. */
int kw_warm_ls_page(kw_cache *c, const kw_warm_filter *f, uint8_t *from,
                    size_t max, cJSON **entries, uint64_t *bytes, bool *more);

/* Removes every entry of doc's "entries" (a kw_warm_ls() document) and
 * adds "removed" (the same array).  KW_EPINNED, with nothing removed and
 * the reason in err, when one is pinned and !force; else 0 or the cache's
 * code with the entry at fault in err. */
int kw_warm_evict(kw_cache *c, cJSON *doc, bool force, char *err, size_t errlen);

/* Resolves hex, a digest of 64 hex digits or a unique prefix of at least
 * 8 of a cached one (as git takes them), into out: 0; KW_EINVAL (not hex,
 * or too short), KW_ENOTFOUND (no cached digest starts so) or
 * KW_EAMBIGUOUS (the candidates follow, on one line), each with a
 * one-line reason naming hex in err. */
int kw_warm_digest(kw_cache *c, const char *hex,
                   uint8_t out[KW_KEYS_DIGEST_LEN], char *err, size_t errlen);

/* Removes the entry of digest (evict by digest): 0, KW_ENOTFOUND, or the
 * cache's code with its reason in err. */
int kw_warm_remove(kw_cache *c, const uint8_t digest[KW_KEYS_DIGEST_LEN],
                   char *err, size_t errlen);

/* The stats of the cache w works on (kw_cache_stats_get), for a caller
 * that holds the pipeline.  Any thread. */
int kw_warm_cache_stats(kw_warm *w, kw_cache_stats *out);

/* {"pins": [{"name", "digests", "entries", "bytes", "created"}]}. */
int kw_warm_pins(kw_cache *c, cJSON **out);

/* Deletes the pin set name; *doc gets {"name", "digests", "entries",
 * "bytes"} as it was.  KW_ENOTFOUND when there is none. */
int kw_warm_unpin(kw_cache *c, const char *name, cJSON **doc);

/* Stores a new size limit and trims to it; *doc gets {"max_size",
 * "previous", "evicted", "entries", "bytes"}. */
int kw_warm_resize(kw_cache *c, uint64_t size, cJSON **doc);

/* The fleet tier of a URL and key file, as kwarmd's and prewarm's
 * --remote / --remote-key-file take them.  The password comes from the
 * key file, else $KWARM_REMOTE_PASSWORD.  url NULL or "": *out = NULL and
 * 0.  Returns 0 or a code with a one-line reason naming the flag in err. */
int kw_warm_remote_open(kw_remote **out, const char *url, const char *key_file,
                        unsigned timeout_ms, unsigned lease_ms, char *err,
                        size_t errlen);

#endif /* KW_WARM_H */
