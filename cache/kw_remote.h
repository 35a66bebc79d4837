/* kw_remote.h: the fleet tier, a shared compile cache in Redis (prefix
 * kw_remote_).
 *
 * Many nodes keep their own LMDB (kw_cache.h) and share compiled entries
 * through one Redis: read-through on a local miss (the entry is copied into
 * the local cache), write-back after a local compile, and a fleet-wide
 * single-flight lease so that N nodes missing one key compile it once.
 *
 * Keys in Redis:
 *   "kwarm:v1:<64 hex digest>"    an entry (kw_remote_encode's format)
 *   "kwarm:lease:<64 hex digest>" a compile lease, SET NX PX, value a
 *                                 random token of its holder
 *
 * Entries are signed: HMAC-SHA512-256 (libsodium crypto_auth) under the
 * fleet key over the whole value, which also carries the digest it belongs
 * to and the XXH3-128 of the cubin.  A value whose HMAC, digest or checksum
 * does not verify (tampered with, signed with another key, written without
 * one) is refused and counted, never served; the caller compiles instead.
 *
 * Failure model: every Redis call has a timeout (kw_remote_opts.timeout_ms,
 * connect included).  When a call fails at the connection level, the tier
 * is marked down: calls fail at once with KW_EREMOTE (no network I/O) until
 * a reconnection is due; the delay doubles from 100 ms to 5 s while
 * reconnections fail and resets after one succeeds.  Callers treat
 * KW_EREMOTE as "no fleet": they compile and serve from the local cache.
 *
 * Thread-safety: one kw_remote may be used from any number of threads at
 * once.  hiredis contexts are not thread-safe, so each call takes a
 * connection from a mutex-protected pool (or opens one) and returns it
 * after; at most one connection per concurrent caller exists.
 * Byte order of the value format: little-endian, written explicitly.
 */
#ifndef KW_REMOTE_H
#define KW_REMOTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kw_cache.h"

#define KW_REMOTE_KEY_LEN 32       /* fleet key bytes (crypto_auth key) */
#define KW_REMOTE_MAX_PASSWORD 256 /* AUTH password bytes */
#define KW_REMOTE_MAX_HOST 256
#define KW_REMOTE_DEFAULT_TIMEOUT_MS 1000
#define KW_REMOTE_DEFAULT_LEASE_MS 60000
#define KW_REMOTE_BACKOFF_MIN_MS 100
#define KW_REMOTE_BACKOFF_MAX_MS 5000
#define KW_REMOTE_POLL_MS 25 /* lease wait: GET of the entry this often */

typedef struct kw_remote kw_remote;

/* Where the tier is, parsed from "redis://HOST:PORT[/DB]". */
typedef struct kw_remote_addr {
    char host[KW_REMOTE_MAX_HOST];
    unsigned port;
    unsigned db;
} kw_remote_addr;

/* What kw_remote_open() needs: the secrets are copied, not borrowed. */
typedef struct kw_remote_opts {
    kw_remote_addr addr;
    uint8_t key[KW_REMOTE_KEY_LEN]; /* fleet HMAC key */
    char password[KW_REMOTE_MAX_PASSWORD]; /* "" : no AUTH */
    unsigned timeout_ms; /* per call; 0: KW_REMOTE_DEFAULT_TIMEOUT_MS */
    unsigned lease_ms;   /* lease TTL and the longest wait on a holder;
                            0: KW_REMOTE_DEFAULT_LEASE_MS */
} kw_remote_opts;

typedef struct kw_remote_stats {
    uint64_t hits;    /* entries fetched, verified and handed out */
    uint64_t misses;  /* no entry in Redis */
    uint64_t errors;  /* calls that failed (timeout, refused, down) */
    uint64_t refused; /* entries that failed HMAC, digest or checksum */
    uint64_t puts;    /* entries written back */
} kw_remote_stats;

/* Parses "redis://HOST:PORT[/DB]" (PORT 1..65535, DB 0..15; no user or
 * password in the URL: secrets never go on a command line).  0 or
 * KW_EINVAL. */
int kw_remote_parse_url(const char *url, kw_remote_addr *out);

/* Reads the fleet key file at path: its first 32 bytes are the key; what
 * follows (after one optional newline, up to the next newline) is the
 * Redis password, if any.  Refuses (KW_EINVAL, reason naming the file in
 * err) a file that is missing, shorter than 32 bytes, not a regular file,
 * or readable by group or others.  On success the key goes to o->key and
 * the password, when the file has one, to o->password. */
int kw_remote_load_key(const char *path, kw_remote_opts *o, char *err,
                       size_t errlen);

/* Makes a handle for the tier at o->addr.  Connects once to check the
 * address and password, but a Redis that is down is not an error (the
 * tier starts marked down and reconnects later); a refused AUTH or SELECT
 * is (KW_EREMOTE, reason in err).  KW_ENOMEM; KW_EINVAL (bad opts).
 * *out untouched on error. */
int kw_remote_open(kw_remote **out, const kw_remote_opts *o, char *err,
                   size_t errlen);

/* True while the tier is marked down (the last connection-level call
 * failed or timed out; calls fail at once until a reconnection succeeds).
 * A tier that has never connected starts down.  Thread-safe; for a caller
 * that logs when the fleet goes and comes back (cache/ never logs). */
bool kw_remote_is_down(kw_remote *r);

/* Closes every pooled connection and frees r.  No call may be running.
 * NULL is a no-op. */
void kw_remote_close(kw_remote *r);

/* Fetches and verifies the entry of digest: *blob is a new malloc'd cubin
 * (the caller frees it), *len its size, *info (may be NULL) its metadata.
 * Returns 0 (a hit, counted); KW_ENOTFOUND (a miss, counted); KW_ECORRUPT
 * (refused: bad HMAC, digest or checksum; counted); KW_EREMOTE (timeout,
 * connection, tier down; counted as an error); KW_ENOMEM.  *blob is NULL
 * on error. */
int kw_remote_get(kw_remote *r, const uint8_t digest[KW_CACHE_DIGEST_LEN],
                  void **blob, size_t *len, kw_cache_info *info);

/* Writes the signed entry of digest (overwriting any there).  0;
 * KW_EINVAL (empty or oversized blob, bad info); KW_EREMOTE; KW_ENOMEM. */
int kw_remote_put(kw_remote *r, const uint8_t digest[KW_CACHE_DIGEST_LEN],
                  const kw_cache_info *info, const void *blob, size_t len);

/* Encodes a signed value under key (what kw_remote_put stores; exposed
 * for tools and tests).  *out is new malloc'd memory of *outlen bytes.
 * 0, KW_EINVAL, KW_ENOMEM. */
int kw_remote_encode(const uint8_t key[KW_REMOTE_KEY_LEN],
                     const uint8_t digest[KW_CACHE_DIGEST_LEN],
                     const kw_cache_info *info, const void *blob, size_t len,
                     uint8_t **out, size_t *outlen);

/* Verifies and decodes a value: *blob points into val (borrowed, valid
 * while val is), *info gets the metadata.  0 or KW_ECORRUPT. */
int kw_remote_decode(const uint8_t key[KW_REMOTE_KEY_LEN],
                     const uint8_t digest[KW_CACHE_DIGEST_LEN],
                     const uint8_t *val, size_t vlen, const void **blob,
                     size_t *len, kw_cache_info *info);

/* ---- fleet-wide single-flight ------------------------------------------ */

/* A compile lease; caller-allocated, filled by kw_remote_begin(). */
typedef struct kw_remote_lease {
    uint8_t digest[KW_CACHE_DIGEST_LEN];
    char token[33]; /* hex of 16 random bytes: whose lease it is */
    bool held;      /* we hold it: kw_remote_end() releases it */
} kw_remote_lease;

/* Asks whether to stop waiting (the daemon stopping); may be NULL. */
typedef bool (*kw_remote_stop_fn)(void *arg);

/* Resolves a local miss of digest through the fleet, on a worker thread
 * (it blocks: up to o->lease_ms while another node holds the lease).
 * Fetches the entry; when there is none, takes the lease, or waits while
 * another node holds it, polling for the entry every KW_REMOTE_POLL_MS,
 * until the entry appears, the lease goes (the holder failed or died: the
 * lease is taken over) or o->lease_ms passes.  A verified entry is stored
 * in cache (backfill).
 * Returns 0: the entry is now in cache, nothing to compile; KW_ENOTFOUND:
 * compile it, then call kw_remote_end() with lease (lease->held says
 * whether this node holds the fleet's lease).  Never returns another code:
 * every remote failure means "compile locally". */
int kw_remote_begin(kw_remote *r, kw_cache *cache,
                    const uint8_t digest[KW_CACHE_DIGEST_LEN],
                    kw_remote_stop_fn stop, void *arg, kw_remote_lease *lease);

/* After the compile that kw_remote_begin() asked for: writes the entry
 * back when blob is not NULL (a successful compile), then releases the
 * lease if held (only if it is still ours).  Failures are counted, never
 * reported: the local cache already has the entry. */
void kw_remote_end(kw_remote *r, kw_remote_lease *lease,
                   const kw_cache_info *info, const void *blob, size_t len);

/* Counters since open.  Thread-safe. */
void kw_remote_stats_get(const kw_remote *r, kw_remote_stats *out);

#endif /* KW_REMOTE_H */
